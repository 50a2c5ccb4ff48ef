//! `quiver check`'s findings, as data: each rule is computed by the crate that owns it
//! (lints by the contract, policy and configured names by the registry, the surface's
//! settings and budgets by the surface, servers and tokens by the MCP adapter); the host
//! gathers them in the order they are printed, and the binary prints them.

use std::path::Path;

use anyhow::Context;
use quiver_contract::{Finding, Severity, breaking_changes_between, lint_spec};
use quiver_registry::{policy_findings, store::DefinitionStore, unmatched_tool_refs};

use crate::{App, Config};

/// What `quiver check`'s rules read of a built app, owned: the admin page keeps one to
/// check the configuration in force whenever it is asked.
#[derive(Clone)]
pub struct CheckSources {
    mcp: quiver_mcp_adapter::McpClient,
    surface: std::sync::Arc<quiver_surface::Surface>,
    catalog: std::sync::Arc<quiver_registry::Catalog>,
    report: quiver_registry::RegisterReport,
    long_skills: Vec<(String, String, usize)>,
    catalog_dir: std::sync::Arc<crate::catalog_dir::CatalogDirTools>,
}

impl CheckSources {
    /// What `app` gives the rules.
    pub fn of(app: &App) -> Self {
        CheckSources {
            mcp: app.mcp.clone(),
            surface: app.surface.clone(),
            catalog: app.catalog.clone(),
            report: app.report.clone(),
            long_skills: app.long_skills.clone(),
            catalog_dir: app.catalog_dir.clone(),
        }
    }
}

impl std::fmt::Debug for CheckSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckSources").finish_non_exhaustive()
    }
}

/// Every finding but those of `--against`, in the order `quiver check` prints them.
pub fn findings(app: &App, config: &Config) -> Vec<Finding> {
    findings_in(&CheckSources::of(app), config)
}

/// [`findings`] over `src`.
pub fn findings_in(src: &CheckSources, config: &Config) -> Vec<Finding> {
    // One view of the servers for every rule about them.
    let statuses = src.mcp.status();
    // Settings valid one by one that do not fit together.
    let mut out = config.surface.findings(config.always_denied(None, None));
    out.extend(policy_findings(&config.policy.rules));
    out.extend(quiver_mcp_adapter::connection_findings(&statuses));
    out.extend(quiver_mcp_adapter::session_command_findings(
        &config.mcp.servers,
    ));
    out.extend(src.surface.findings());
    out.extend(long_skills(&src.long_skills, config));
    // A catalog file's tool is linted as its file has it, by its path (the log's lines).
    let (file_lints, from_files) = src.catalog_dir.lints();
    out.extend(file_lints.iter().map(|p| Finding::error(p.to_string())));
    // An upstream server's definitions are its author's to fix, not the operator's: told as
    // notes, so the check still gates what the operator's own files define.
    for entry in src.catalog.tools() {
        if from_files.contains(&entry.spec.name) {
            continue;
        }
        let upstream = entry.family.starts_with("mcp:");
        out.extend(lint_spec(&entry.spec).iter().map(|l| {
            let finding = Finding::from(l);
            if upstream {
                Finding::note(format!(
                    "{} (note: the definition is MCP server {}'s)",
                    finding.text,
                    entry.family.trim_start_matches("mcp:")
                ))
            } else {
                finding
            }
        }));
    }
    // A definition the catalog refused (a schema that does not compile, a bad name) is a
    // finding too: that tool is missing from every surface.
    let mut refused = src.report.clone();
    refused.extend(src.mcp.register_report());
    // Quiver's own `skill` tool (every skill) or a resource tool hidden by a tool of its
    // name is a fault of the operator's configuration, not a note.
    for shadowed in src.catalog.shadowed() {
        let own = crate::OWN_TOOL_NAMES
            .iter()
            .any(|(n, f)| *n == shadowed.name && *f == shadowed.family);
        if !own {
            refused.skipped.push(shadowed);
            continue;
        }
        let holder = src
            .catalog
            .lookup(&shadowed.name)
            .map_or_else(|| "another".to_owned(), |e| e.family.to_string());
        out.push(Finding::error(format!(
            "{0}: [shadowed] Quiver's own tool `{0}` (family {1}) is hidden by the `{holder}` family's tool of that name, so the model cannot reach it: rename that tool",
            shadowed.name, shadowed.family
        )));
    }
    out.extend(refused.findings());
    // An alias is checked against its target once the target's server has listed it.
    out.extend(
        src.catalog_dir
            .alias_mismatches()
            .into_iter()
            .chain(src.catalog_dir.clashes())
            .map(Finding::error),
    );
    // What the catalog files point to that no one has: a `use_instead` tool, a `requires`
    // capability no token or OIDC rule declares.
    let granted: Vec<String> = config
        .auth
        .tokens
        .iter()
        .flat_map(|t| t.model_capabilities.iter())
        .chain(
            config
                .auth
                .oidc
                .iter()
                .flat_map(|o| o.rules.iter())
                .flat_map(|r| r.model_capabilities.iter()),
        )
        .cloned()
        .collect();
    out.extend(
        src.catalog_dir
            .reference_findings(&granted)
            .into_iter()
            .map(|(text, counted)| {
                if counted {
                    Finding::error(text)
                } else {
                    Finding::note(text)
                }
            }),
    );
    let names: Vec<String> = src
        .catalog
        .tools()
        .iter()
        .map(|e| e.spec.name.clone())
        .collect();
    out.extend(unmatched_tool_refs(
        &config.tool_patterns(),
        &names,
        &quiver_mcp_adapter::unconnected_server_of(&statuses, &config.mcp.servers),
    ));
    out.extend(quiver_mcp_adapter::server_list_findings(
        &config.mcp.servers,
        &statuses,
    ));
    out.extend(quiver_mcp_adapter::token_findings(
        &config.auth.tokens,
        &statuses,
        &src.surface,
    ));
    out
}

/// A skill longer than a result may be is served cut: the model never reads its end.
fn long_skills(long: &[(String, String, usize)], config: &Config) -> Vec<Finding> {
    long.iter()
        .map(|(name, origin, chars)| {
            Finding::error(format!(
                "skill {name}: [too long] its instructions are {chars} characters, more than a result carries (limits.max_result_chars = {}), so the skill tool serves them cut: move material into files beside it ({origin}), or raise the limit",
                config.limits.max_result_chars
            ))
        })
        .collect()
}

/// `--against DB`: the breaking changes from the definitions stored in `db` to the catalog
/// now, after notes on the stored definitions that cannot be compared now. An error when
/// `db` does not exist or cannot be read.
pub async fn against(app: &App, config: &Config, db: &Path) -> anyhow::Result<Vec<Finding>> {
    let text = db.to_string_lossy();
    let is_url = ["postgres://", "postgresql://"]
        .iter()
        .any(|scheme| text.starts_with(scheme));
    if is_url && config.store.url.as_deref() == Some(&*text) {
        let defs = app
            .store
            .all_definitions()
            .await
            .context("reading definitions from the configured store")?;
        return Ok(compare(app, &defs));
    }
    if is_url || text.contains("://") {
        anyhow::bail!(
            "{}: `--against` takes a SQLite file, or this configuration's own `[store] url`; to compare with another PostgreSQL database, run `quiver check` with a configuration whose `[store] url` names it",
            quiver_store_postgres::redact(&text)
        );
    }
    if !db.exists() {
        anyhow::bail!(
            "{}: no such database (`--against` names an existing Quiver store)",
            db.display()
        );
    }
    let same = matches!(
        (db.canonicalize(), config.store.path.canonicalize()),
        (Ok(x), Ok(y)) if x == y
    );
    // Another database is only read: no migration, no marker, nothing written.
    let defs = if same {
        app.store.all_definitions().await
    } else {
        let path = db.to_path_buf();
        tokio::task::spawn_blocking(move || quiver_store_sqlite::read_definitions(path))
            .await
            .context("reading definitions")?
    }
    .with_context(|| format!("reading definitions from {}", db.display()))?;
    Ok(compare(app, &defs))
}

/// The findings of `defs` (stored definitions) against the catalog: tools not checked, and
/// breaking changes.
fn compare(app: &App, defs: &[quiver_registry::store::ToolDefinition]) -> Vec<Finding> {
    let (mut out, stored) =
        quiver_mcp_adapter::comparable_definitions(defs, &app.mcp.status(), &app.catalog);
    let current: Vec<_> = app.catalog.tools().iter().map(|e| e.spec.clone()).collect();
    out.extend(
        breaking_changes_between(&stored, &current)
            .iter()
            .map(Finding::from),
    );
    out
}

/// `quiver check`'s last line: how many definitions were linted (`linted`) and how many
/// findings of each kind failing the check there are. Without `against`, breaking changes
/// were not looked for, which it says rather than counting none.
pub fn summary(findings: &[Finding], linted: usize, against: bool) -> String {
    let count = |severity: Severity| findings.iter().filter(|f| f.severity == severity).count();
    let breaking = if against {
        format!("{} breaking change(s)", count(Severity::Breaking))
    } else {
        "breaking changes not checked (--against DB)".to_owned()
    };
    let notes = match count(Severity::Note) {
        0 => String::new(),
        n => format!(" ({n} note(s), not counted)"),
    };
    format!(
        "config ok; {linted} tool definition(s) linted, {} finding(s){notes}, {} not registered, {breaking}, {} unmatched name(s)",
        count(Severity::Error),
        count(Severity::NotRegistered),
        count(Severity::Unmatched)
    )
}

/// Whether the check passes: no finding fails it (notes do not).
pub fn passes(findings: &[Finding]) -> bool {
    !findings.iter().any(|f| f.severity.fails())
}
