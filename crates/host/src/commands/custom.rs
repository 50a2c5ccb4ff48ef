//! `quiver custom`: custom tools' lifecycle from the command line (add, test, approve,
//! reject, enable, disable, list, show). Every action goes through the registry's
//! `CustomTools` over the store, as a running `quiver serve` reads them: an approval made
//! here is live there within a poll of the store's definitions version.

use std::{path::Path, process::ExitCode};

use anyhow::{Context, bail};
use quiver_registry::{
    custom::{CustomDraft, CustomError, CustomTools, PendingVersion, TestCase},
    store::ToolDefinition,
};
use serde_json::Value;

use crate::CustomAction;

/// Reads `path` as text, naming the file and what to do when it cannot be read.
fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading the {what} {}: give the path of an existing, readable UTF-8 file",
            path.display()
        )
    })
}

/// Reads `path` as JSON, naming the file, the line and the column of a syntax error.
fn read_json(path: &Path, what: &str) -> anyhow::Result<Value> {
    let text = read(path, what)?;
    serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{}: line {}, column {}: the {what} is not valid JSON: {e}",
            path.display(),
            e.line(),
            e.column()
        )
    })
}

/// What the operator reads of a refusal: the store's failures keep their cause chain.
fn refused(e: CustomError) -> anyhow::Error {
    match e {
        CustomError::Store(s) => anyhow::Error::new(s).context("the store failed"),
        other => anyhow::anyhow!("{other}"),
    }
}

/// Runs one `quiver custom` action.
pub(crate) async fn run(tools: &CustomTools, action: CustomAction) -> anyhow::Result<ExitCode> {
    match action {
        CustomAction::Add {
            file,
            name,
            description,
            schema,
            tests,
        } => {
            let source = read(&file, "source")?;
            let input_schema = read_json(&schema, "input schema")?;
            let cases = match &tests {
                Some(path) => {
                    let value = read_json(path, "test cases")?;
                    TestCase::parse_all(&value)
                        .map_err(|why| anyhow::anyhow!("{}: {why}", path.display()))?
                }
                None => Vec::new(),
            };
            let draft = CustomDraft::new(name.clone(), description, input_schema, source)
                .with_tests(cases)
                .with_author("operator (quiver custom add)");
            let version = tools.add(draft).await.map_err(|e| match e {
                CustomError::Invalid(why) if why.starts_with("the source") => {
                    anyhow::anyhow!("{}: {why}", file.display())
                }
                CustomError::Invalid(why) if why.starts_with("the input schema") => {
                    anyhow::anyhow!("{}: {why}", schema.display())
                }
                other => refused(other),
            })?;
            say!(
                "custom tool `{name}` version {version} stored as a draft; next: `quiver custom test {name}`, then `quiver custom approve {name}`"
            );
            Ok(ExitCode::SUCCESS)
        }
        CustomAction::Test { name } => {
            let progress = progress_bar();
            let report = tools
                .audit(&name, &|pct| progress.set_position(u64::from(pct)))
                .await
                .map_err(refused)?;
            progress.finish_and_clear();
            for (ok, what) in &report.cases {
                say!("{} {what}", if *ok { "✓" } else { "✗" });
            }
            if report.cases.is_empty() {
                say!("(no test cases: the audit passes, but approving needs --force)");
            }
            if report.passed {
                say!(
                    "audit of `{name}` version {} passed (job {}); approve it with `quiver custom approve {name}`",
                    report.version,
                    report.job_id
                );
                Ok(ExitCode::SUCCESS)
            } else {
                say!(
                    "audit of `{name}` version {} failed (job {}): the version is rejected; fix it and add it again, or approve it with --force",
                    report.version,
                    report.job_id
                );
                Ok(ExitCode::from(1))
            }
        }
        CustomAction::Approve { name, force } => {
            let note = tools.approve(&name, force).await.map_err(refused)?;
            if force {
                tracing::warn!(tool = %name, "custom tool approved by override: {note}");
            }
            say!("{note}; running servers on this store serve it within a second or two");
            Ok(ExitCode::SUCCESS)
        }
        CustomAction::Reject { name, reason } => {
            if reason.trim().is_empty() {
                bail!("give the reason the tool is turned down: --reason \"...\"");
            }
            tools.reject(&name, &reason).await.map_err(refused)?;
            say!("custom tool `{name}` rejected: {reason}");
            Ok(ExitCode::SUCCESS)
        }
        CustomAction::Enable { name } => {
            tools.set_enabled(&name, true).await.map_err(refused)?;
            say!("tool `{name}` enabled");
            Ok(ExitCode::SUCCESS)
        }
        CustomAction::Disable { name } => {
            tools.set_enabled(&name, false).await.map_err(refused)?;
            say!(
                "tool `{name}` disabled; running servers on this store take it off within a second or two"
            );
            Ok(ExitCode::SUCCESS)
        }
        CustomAction::List => {
            let all = tools.list().await.map_err(refused)?;
            if all.is_empty() {
                say!("no custom tools; add one with `quiver custom add FILE.js --name N ...`");
                return Ok(ExitCode::SUCCESS);
            }
            say!(
                "{:<32} {:>7} {:<9} {:<7} pending",
                "name",
                "version",
                "status",
                "enabled"
            );
            for def in &all {
                say!(
                    "{:<32} {:>7} {:<9} {:<7} {}",
                    quiver_contract::printable(&def.name),
                    def.version,
                    def.status.as_str(),
                    if def.enabled { "yes" } else { "no" },
                    pending(def)
                        .map(|p| format!("v{} {}", p.version, p.status))
                        .unwrap_or_default()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        CustomAction::Show { name } => {
            let def = tools.show(&name).await.map_err(refused)?;
            say!("{}", serde_json::to_string_pretty(&shown(&def))?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn pending(def: &ToolDefinition) -> Option<PendingVersion> {
    def.pending
        .as_ref()
        .and_then(|p| serde_json::from_value(p.clone()).ok())
}

/// A custom tool as `quiver custom show` prints it.
fn shown(def: &ToolDefinition) -> Value {
    serde_json::json!({
        "name": def.name,
        "version": def.version,
        "status": def.status.as_str(),
        "enabled": def.enabled,
        "description": def.description,
        "input_schema": def.input_schema,
        "source": def.implementation,
        "test_cases": def.test_cases,
        "test_results": def.test_results,
        "rejection_reason": def.rejection_reason,
        "created_by": def.created_by,
        "pending": def.pending,
    })
}

/// A progress bar on a terminal, nothing elsewhere.
fn progress_bar() -> indicatif::ProgressBar {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let bar = indicatif::ProgressBar::new(100);
        bar.set_style(
            indicatif::ProgressStyle::with_template("auditing {bar:30} {pos}%")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    }
}
