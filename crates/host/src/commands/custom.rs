//! `quiver custom`: custom tools' lifecycle from the command line (add, test, approve,
//! reject, enable, disable, list, show). Every action goes through the registry's
//! `CustomTools` over the store, as a running `quiver serve` reads them: an approval made
//! here is live there within a poll of the store's definitions version.

use std::{path::Path, process::ExitCode};

use anyhow::{Context, bail};
use quiver_registry::{
    custom::{CustomDraft, CustomError, CustomTools, PendingVersion, TestCase},
    store::{JobStatus, JobType, ToolDefinition, ToolJob},
};
use serde_json::Value;

use quiver_host::catalog_dir::{ClaimKind, Claimed};

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

/// Refuses `name` when a catalog file holds it: the file's tool is the one served under
/// that name (an alias, before any custom tool), or, for a custom-kind file, the file is
/// where the tool is edited. `approving` lets a custom-kind file's own draft through.
fn clear_of_catalog(claimed: &[Claimed], name: &str, approving: bool) -> anyhow::Result<()> {
    let Some(c) = claimed.iter().find(|c| c.name == name) else {
        return Ok(());
    };
    match c.kind {
        ClaimKind::Custom if approving => Ok(()),
        ClaimKind::Custom => bail!(
            "`{name}` is defined by {} ({}): edit that file, and a running server stores the edit as a new version to approve",
            c.path.display(),
            c.what()
        ),
        _ => bail!(
            "`{name}` is defined by {} ({}), which is served under that name instead of a custom tool: choose another name, or remove the file",
            c.path.display(),
            c.what()
        ),
    }
}

/// Runs one `quiver custom` action; `claimed` are the names the catalog directory's files
/// hold.
pub(crate) async fn run(
    tools: &CustomTools,
    action: CustomAction,
    claimed: &[Claimed],
) -> anyhow::Result<ExitCode> {
    match action {
        CustomAction::Add {
            file,
            name,
            description,
            schema,
            tests,
        } => {
            clear_of_catalog(claimed, &name, false)?;
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
            // The definition's lints, said now: `quiver check` (and CI) fails on them later.
            let spec = quiver_contract::ToolSpec::new(name.clone(), description.clone())
                .with_schema(input_schema.clone());
            let lints = quiver_contract::lint_spec(&spec);
            let draft = CustomDraft::new(name.clone(), description, input_schema, source)
                .with_tests(cases)
                .with_author("operator (quiver custom add)");
            let added = tools.add(draft).await.map_err(|e| match e {
                CustomError::Invalid(why) if why.starts_with("the source") => {
                    anyhow::anyhow!("{}: {why}", file.display())
                }
                CustomError::Invalid(why) if why.starts_with("the input schema") => {
                    anyhow::anyhow!("{}: {why}", schema.display())
                }
                other => refused(other),
            })?;
            say!(
                "custom tool `{name}` version {} stored as a draft; building it (job {})",
                added.version,
                added.job
            );
            for lint in &lints {
                eprintln!(
                    "quiver: lint (`quiver check` fails on it): {}",
                    quiver_contract::Finding::from(lint)
                );
            }
            finish(tools, &name, &added.job, "building").await
        }
        CustomAction::Test { name } => {
            let id = tools.queue(&name, JobType::Audit).await.map_err(refused)?;
            let job = tools.job(&id).await.map_err(refused)?;
            if job.is_some_and(|j| j.job_type == JobType::Rebuild) {
                say!(
                    "`{name}` is live with no edit under review: its cases run again on the live version, which stays live whatever they give"
                );
            }
            finish(tools, &name, &id, "auditing").await
        }
        CustomAction::Rebuild { name } => {
            let def = tools.show(&name).await.map_err(refused)?;
            if def.status != quiver_contract::Lifecycle::Approved {
                bail!(
                    "`{name}` is {} and has no live version to rebuild: `quiver custom test {name}` audits the version under review",
                    def.status.as_str()
                );
            }
            let id = tools
                .queue(&name, JobType::Rebuild)
                .await
                .map_err(refused)?;
            finish(tools, &name, &id, "rebuilding").await
        }
        CustomAction::Jobs { name } => {
            let jobs = tools.jobs(name).await.map_err(refused)?;
            if jobs.is_empty() {
                say!("no custom-tool jobs");
                return Ok(ExitCode::SUCCESS);
            }
            say!(
                "{:<48} {:<24} {:<7} {:<11} {:>4}  updated (s ago)",
                "job",
                "tool",
                "type",
                "status",
                "done"
            );
            for job in &jobs {
                say!(
                    "{:<48} {:<24} {:<7} {:<11} {:>3}%  {}",
                    quiver_contract::printable(&job.id),
                    quiver_contract::printable(&job.tool_name),
                    job.job_type.as_str(),
                    job_status(job),
                    if job.status.is_terminal() {
                        100
                    } else {
                        job.progress_pct
                    },
                    job.updated_at.elapsed().map_or(0, |d| d.as_secs())
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        CustomAction::Approve { name, force } => {
            clear_of_catalog(claimed, &name, true)?;
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
                "{:<32} {:>7} {:<9} {:<7} {:<16} pending",
                "name",
                "version",
                "status",
                "enabled",
                "last test"
            );
            for def in &all {
                say!(
                    "{:<32} {:>7} {:<9} {:<7} {:<16} {}",
                    quiver_contract::printable(&def.name),
                    def.version,
                    def.status.as_str(),
                    if def.enabled { "yes" } else { "no" },
                    last_test(def),
                    pending(def)
                        .map(|p| format!("v{} {}", p.version, p.status))
                        .unwrap_or_default()
                );
            }
            for def in &all {
                if let Some(why) = not_served(tools, def, claimed) {
                    say!("{}: {why}", quiver_contract::printable(&def.name));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        CustomAction::Show { name } => {
            let def = tools.show(&name).await.map_err(refused)?;
            let mut shown = shown(&def);
            if let Some(why) = not_served(tools, &def, claimed) {
                shown["not_served"] = Value::String(why);
            }
            say!("{}", visible_json(&serde_json::to_string_pretty(&shown)?));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The live version's last job: its kind and whether it passed (`rebuild failed` on an
/// approved tool is the one to look at).
fn last_test(def: &ToolDefinition) -> String {
    let Some(results) = &def.test_results else {
        return "-".into();
    };
    let kind = results
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("audit");
    let passed = results.get("passed").and_then(Value::as_bool) == Some(true);
    format!("{kind} {}", if passed { "passed" } else { "failed" })
}

/// Why an approved and enabled custom tool is not served, when its name is one a family
/// registered before the custom tools always holds, or a catalog file's alias.
fn not_served(tools: &CustomTools, def: &ToolDefinition, claimed: &[Claimed]) -> Option<String> {
    if def.status != quiver_contract::Lifecycle::Approved || !def.enabled {
        return None;
    }
    if let Some(c) = claimed
        .iter()
        .find(|c| c.name == def.name && c.kind == ClaimKind::Alias)
    {
        return Some(format!(
            "approved, not served: the name is taken by {} ({}, served before custom tools); rename one of them",
            c.path.display(),
            c.what()
        ));
    }
    tools.taken_by(&def.name).map(|family| {
        format!(
            "approved, not served: the name is taken by Quiver's own tool `{}` (the `{family}` family); add it again under another name",
            def.name
        )
    })
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

/// A job's progress: a bar on a terminal; elsewhere (a CI log, a pipe) a line each time it
/// passes another tenth, so a long build is seen to move.
struct Progress {
    bar: indicatif::ProgressBar,
    doing: String,
    /// The last tenth said off a terminal.
    said: std::sync::atomic::AtomicU8,
}

impl Progress {
    fn new(doing: &str) -> Self {
        let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            let bar = indicatif::ProgressBar::new(100);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!("{doing} {{bar:30}} {{pos}}%"))
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Progress {
            bar,
            doing: doing.to_owned(),
            said: std::sync::atomic::AtomicU8::new(0),
        }
    }

    fn set(&self, pct: u8) {
        self.bar.set_position(u64::from(pct));
        let tenth = pct / 10;
        if self.bar.is_hidden()
            && tenth > 0
            && tenth < 10
            && self
                .said
                .fetch_max(tenth, std::sync::atomic::Ordering::Relaxed)
                < tenth
        {
            eprintln!("{}: {}%", self.doing, tenth * 10);
        }
    }

    /// Starts over (a job queued again), off a terminal too.
    fn restart(&self) {
        self.bar.set_position(0);
        self.said.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How often a job another process runs is looked at.
const FOLLOW: std::time::Duration = std::time::Duration::from_millis(200);

/// Runs the queued job `id` here, or, when a running server's job worker took it first,
/// follows it there; then prints its cases and what to do next. A job the server's lease
/// released (its process stopped) and queued again is followed on: run here, or followed
/// where another server took it. Exit 1 when a case failed.
async fn finish(
    tools: &CustomTools,
    name: &str,
    id: &str,
    doing: &str,
) -> anyhow::Result<ExitCode> {
    let progress = Progress::new(&format!("{doing} `{name}`"));
    let mut id = id.to_owned();
    let job = loop {
        let ran = match tools.run_job(&id, &|pct| progress.set(pct)).await {
            // Released under this run (its heartbeat did not reach the store for the whole
            // stale bound) and queued again: read as ended, so the new job is taken up
            // below.
            Err(CustomError::Released(_)) => None,
            other => other.map_err(refused)?,
        };
        if ran.is_some() {
            break tools.job(&id).await.map_err(refused)?;
        }
        let job = loop {
            let job = tools.job(&id).await.map_err(refused)?;
            match &job {
                Some(j) if !j.status.is_terminal() => {
                    progress.set(j.progress_pct);
                    tokio::time::sleep(FOLLOW).await;
                }
                _ => break job,
            }
        };
        let next = match &job {
            Some(j) => requeued(tools, j).await?,
            None => None,
        };
        match next {
            Some(next) => {
                progress.bar.suspend(|| {
                    say!("job {id} was interrupted and queued again as job {next}; following it")
                });
                progress.restart();
                id = next;
            }
            None => break job,
        }
    };
    progress.bar.finish_and_clear();
    let Some(job) = job else {
        bail!("job {id} is gone from the store");
    };
    report(name, &job)
}

/// The job that took over `job`'s work when it was released as interrupted: the newest job
/// of the same tool and kind created at or after it. `None` for a job that ended otherwise.
async fn requeued(tools: &CustomTools, job: &ToolJob) -> anyhow::Result<Option<String>> {
    let interrupted = job.status == JobStatus::Failed
        && job
            .result
            .as_ref()
            .is_some_and(|r| r.get("interrupted").is_some());
    if !interrupted {
        return Ok(None);
    }
    let jobs = tools
        .jobs(Some(job.tool_name.clone()))
        .await
        .map_err(refused)?;
    Ok(jobs
        .into_iter()
        .find(|j| j.id != job.id && j.job_type == job.job_type && j.created_at >= job.created_at)
        .map(|j| j.id))
}

/// JSON text with every character a reviewer would not see (tag characters, bidirectional
/// controls; JSON already escapes the control characters) written as its `\u` escape,
/// so what is approved is what is read. Such characters occur only inside strings, where
/// the escape means the same character.
fn visible_json(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(quiver_contract::is_hidden_in_text) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c != '\n' && quiver_contract::is_hidden_in_text(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A job's status as `custom jobs` shows it: a job's cases pass or fail (approving is the
/// tool's, not the job's), a job whose worker stopped heartbeating was interrupted (and
/// queued again as a new job), and one that could not run its cases ended in an error.
fn job_status(job: &ToolJob) -> &'static str {
    match job.status {
        JobStatus::Approved => "passed",
        JobStatus::Rejected => "failed",
        JobStatus::Failed
            if job
                .result
                .as_ref()
                .is_some_and(|r| r.get("interrupted").is_some()) =>
        {
            "interrupted"
        }
        JobStatus::Failed => "error",
        other => other.as_str(),
    }
}

/// Prints a finished job's cases and verdict.
fn report(name: &str, job: &ToolJob) -> anyhow::Result<ExitCode> {
    let result = job.result.clone().unwrap_or_default();
    let cases = result
        .get("cases")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for case in &cases {
        let ok = case.get("passed").and_then(Value::as_bool) == Some(true);
        let detail = case.get("detail").and_then(Value::as_str).unwrap_or("");
        say!("{} {detail}", if ok { "✓" } else { "✗" });
    }
    let version = result.get("version").and_then(Value::as_u64).unwrap_or(0);
    let what = job.job_type.as_str();
    match job.status {
        JobStatus::Approved if job.job_type == JobType::Rebuild => {
            say!(
                "rebuild of `{name}` version {version} passed (job {}): it stays live",
                job.id
            );
            Ok(ExitCode::SUCCESS)
        }
        JobStatus::Approved => {
            if cases.is_empty() {
                say!("(no test cases: the {what} passes, but approving needs --force)");
            }
            say!(
                "{what} of `{name}` version {version} passed (job {}); approve it with `quiver custom approve {name}`",
                job.id
            );
            Ok(ExitCode::SUCCESS)
        }
        JobStatus::Rejected if job.job_type == JobType::Rebuild => {
            say!(
                "rebuild of `{name}` version {version} failed (job {}): it stays live; fix it and add it again, or disable it (`quiver custom disable {name}`)",
                job.id
            );
            Ok(ExitCode::from(1))
        }
        JobStatus::Rejected => {
            say!(
                "{what} of `{name}` version {version} failed (job {}): the version is rejected; fix it and add it again, or approve it with --force",
                job.id
            );
            Ok(ExitCode::from(1))
        }
        other => {
            let why = result
                .get("error")
                .or_else(|| result.get("interrupted"))
                .and_then(Value::as_str)
                .unwrap_or("no reason was recorded");
            bail!("job {} of `{name}` ended {}: {why}", job.id, other.as_str())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;
    use quiver_registry::{
        custom::JobLease,
        sandbox::SandboxLimits,
        store::{JobStore, MemoryDefinitionStore, MemoryJobStore, NewJob, StoreError},
    };
    use serde_json::json;

    use super::*;

    /// `custom show` writes a hidden character as its escape, and the JSON still reads back
    /// the same.
    #[test]
    fn hidden_characters_are_shown_escaped() {
        let text =
            serde_json::to_string_pretty(&json!({"description": "a\u{202e}b\u{e0041}"})).unwrap();
        let shown = visible_json(&text);
        assert!(shown.contains(r"a\u202eb\udb40\udc41"), "{shown}");
        let back: Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["description"], "a\u{202e}b\u{e0041}");
    }

    /// `custom jobs` tells a job released for want of a heartbeat (queued again) from one
    /// that failed to run its cases; both are stored as `failed`.
    #[test]
    fn an_interrupted_job_is_shown_as_interrupted() {
        let mut job = ToolJob::queued(
            quiver_registry::store::NewJob::new(
                "j1",
                "t",
                quiver_registry::store::JobType::Build,
                json!({}),
            ),
            std::time::SystemTime::now(),
        );
        job.status = JobStatus::Failed;
        job.result = Some(json!({"interrupted": "no heartbeat for 2s"}));
        assert_eq!(job_status(&job), "interrupted");
        job.result = Some(json!({"error": "the sandbox could not start"}));
        assert_eq!(job_status(&job), "error");
    }

    /// A job store whose first heartbeat finds the job released: as if this process's
    /// heartbeats had not reached the store for the whole stale bound while another
    /// process released the job and queued it again (through `others`).
    struct ReleasedUnderUs {
        inner: Arc<MemoryJobStore>,
        others: std::sync::OnceLock<Arc<CustomTools>>,
        done: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl JobStore for ReleasedUnderUs {
        async fn create_job(&self, job: NewJob) -> Result<ToolJob, StoreError> {
            self.inner.create_job(job).await
        }
        async fn job(&self, id: &str) -> Result<Option<ToolJob>, StoreError> {
            self.inner.job(id).await
        }
        async fn transition_job(
            &self,
            id: &str,
            to: JobStatus,
            result: Option<Value>,
        ) -> Result<ToolJob, StoreError> {
            self.inner.transition_job(id, to, result).await
        }
        async fn set_job_progress(&self, id: &str, pct: u8) -> Result<(), StoreError> {
            self.inner.set_job_progress(id, pct).await
        }
        async fn heartbeat_job(&self, id: &str) -> Result<bool, StoreError> {
            if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let why = json!({"interrupted": "no heartbeat (test)"});
                assert!(self.inner.release_job(id, None, why).await?);
                let others = self.others.get().expect("set");
                let job = self.inner.job(id).await?.expect("the job");
                others
                    .queue(&job.tool_name, job.job_type)
                    .await
                    .expect("queued again");
            }
            self.inner.heartbeat_job(id).await
        }
        async fn release_job(
            &self,
            id: &str,
            renewed_before: Option<std::time::SystemTime>,
            why: Value,
        ) -> Result<bool, StoreError> {
            self.inner.release_job(id, renewed_before, why).await
        }
        async fn jobs(&self, tool_name: Option<String>) -> Result<Vec<ToolJob>, StoreError> {
            self.inner.jobs(tool_name).await
        }
        async fn claim_job(&self, id: Option<String>) -> Result<Option<ToolJob>, StoreError> {
            self.inner.claim_job(id).await
        }
    }

    /// A job released while this process runs it (its worker stops: `Released`) is not
    /// the end: `finish` takes up the job queued in its place, runs it here, and reports
    /// that one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_released_under_the_cli_is_followed_to_its_new_job() {
        let defs = Arc::new(MemoryDefinitionStore::new());
        let jobs = Arc::new(MemoryJobStore::new());
        let sandbox = Arc::new(quiver_sandbox::QuickJsSandbox::new(1));
        let store = Arc::new(ReleasedUnderUs {
            inner: jobs.clone(),
            others: std::sync::OnceLock::new(),
            done: std::sync::atomic::AtomicBool::new(false),
        });
        let others = Arc::new(CustomTools::new(
            defs.clone(),
            jobs.clone(),
            sandbox.clone(),
            SandboxLimits::default(),
        ));
        let _ = store.others.set(others);
        let lease = JobLease::new(std::time::Duration::from_secs(60))
            .with_heartbeat(std::time::Duration::from_millis(10));
        let tools =
            CustomTools::new(defs, store, sandbox, SandboxLimits::default()).with_lease(lease);
        // A case that runs long enough for the first heartbeat.
        let source = "async function main() { const end = Date.now() + 300; while (Date.now() < end) {} return 1; }";
        let draft = CustomDraft::new(
            "slow_one",
            "Returns one, slowly.",
            json!({"type": "object", "properties": {}}),
            source,
        )
        .with_tests(TestCase::parse_all(&json!([{"inputs": {}, "expect": 1}])).unwrap());
        let added = tools.add(draft).await.unwrap();
        let code = finish(&tools, "slow_one", &added.job, "testing")
            .await
            .unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let all = jobs.jobs(Some("slow_one".into())).await.unwrap();
        let statuses: Vec<JobStatus> = all.iter().map(|j| j.status).collect();
        assert_eq!(
            statuses,
            vec![JobStatus::Approved, JobStatus::Failed],
            "{all:?}"
        );
        assert_eq!(all[1].id, added.job);
    }

    /// A job the lease released and queued again is followed to its new job; a job that
    /// ended otherwise is not.
    #[tokio::test]
    async fn an_interrupted_job_leads_to_the_job_queued_in_its_place() {
        let jobs = Arc::new(MemoryJobStore::new());
        let tools = CustomTools::new(
            Arc::new(MemoryDefinitionStore::new()),
            jobs.clone(),
            Arc::new(quiver_sandbox::QuickJsSandbox::new(1)),
            SandboxLimits::default(),
        );
        let schema = json!({"type": "object", "properties": {}});
        let draft = CustomDraft::new(
            "one",
            "Returns one.",
            schema,
            "async function main() { return 1; }",
        );
        let added = tools.add(draft).await.unwrap();
        jobs.claim_job(Some(added.job.clone()))
            .await
            .unwrap()
            .unwrap();
        let first = jobs.job(&added.job).await.unwrap().unwrap();
        assert_eq!(
            requeued(&tools, &first).await.unwrap(),
            None,
            "still running"
        );
        // As a stopping server hands it back.
        assert!(
            jobs.release_job(&added.job, None, json!({"interrupted": "stopped"}))
                .await
                .unwrap()
        );
        let next = tools.queue("one", JobType::Build).await.unwrap();
        let released = jobs.job(&added.job).await.unwrap().unwrap();
        assert_eq!(
            requeued(&tools, &released).await.unwrap(),
            Some(next.clone())
        );
        // The new job run to its end here: nothing follows it.
        assert!(tools.run_job(&next, &|_| {}).await.unwrap().is_some());
        let ended = jobs.job(&next).await.unwrap().unwrap();
        assert_eq!(ended.status, JobStatus::Approved);
        assert_eq!(requeued(&tools, &ended).await.unwrap(), None);
    }
    /// An approved, enabled custom tool whose name the core family holds is said to be not
    /// served (in `custom list` and `custom show`), naming the tool that has it; disabled,
    /// or under another name, it is not.
    #[tokio::test]
    async fn an_approved_tool_under_a_taken_name_is_said_not_served() {
        let defs = Arc::new(MemoryDefinitionStore::new());
        let jobs = Arc::new(MemoryJobStore::new());
        let sandbox = Arc::new(quiver_sandbox::QuickJsSandbox::new(1));
        // Stored by a process that did not reserve the name.
        let plain = CustomTools::new(
            defs.clone(),
            jobs.clone(),
            sandbox.clone(),
            SandboxLimits::default(),
        );
        let schema = json!({"type": "object", "properties": {}});
        for name in ["tool_search", "one"] {
            let draft = CustomDraft::new(
                name,
                "Returns one.",
                schema.clone(),
                "async function main() { return 1; }",
            );
            let added = plain.add(draft).await.unwrap();
            plain.run_job(&added.job, &|_| {}).await.unwrap().unwrap();
            plain.approve(name, true).await.unwrap();
        }
        let tools = CustomTools::new(defs, jobs, sandbox, SandboxLimits::default())
            .with_reserved(quiver_host::CORE_TOOL_NAMES.map(|n| (n, "core")));
        let taken = tools.show("tool_search").await.unwrap();
        assert_eq!(
            not_served(&tools, &taken, &[]).as_deref(),
            Some(
                "approved, not served: the name is taken by Quiver's own tool `tool_search` (the `core` family); add it again under another name"
            )
        );
        assert_eq!(
            not_served(&tools, &tools.show("one").await.unwrap(), &[]),
            None
        );
        tools.set_enabled("tool_search", false).await.unwrap();
        let off = tools.show("tool_search").await.unwrap();
        assert_eq!(not_served(&tools, &off, &[]), None);
    }
}
