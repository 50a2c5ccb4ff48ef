//! Custom-tool jobs, kept in the [`JobStore`] so that any process on the store can see and
//! run them, and each runs once: a worker takes a queued job with [`JobStore::claim_job`].
//!
//! - **build**: queued by [`CustomTools::add`]. The version under review is compiled in the
//!   sandbox and its test cases run. Passed, the tool waits in `testing` for the operator's
//!   approval; failed (or not compiling), it is `rejected` with the reason.
//! - **audit**: queued by [`CustomTools::audit`] (`quiver custom test`). The version under
//!   review's test cases run again, with the same outcome as a build's.
//! - **rebuild**: queued for an approved tool whose last results were recorded under another
//!   engine or other limits ([`CustomTools::queue_rebuilds`], at a server's start). The live
//!   version is compiled and its cases run under the current ones. The results replace the
//!   live version's; a failure is logged and shown (`quiver custom list`) but the tool stays
//!   live, since taking an approved tool away is the operator's call (`quiver custom
//!   disable`).
//!
//! A job's status follows the store's table: `queued` → `building` (claimed, compiling) →
//! `testing` (cases running, `progress_pct` after each) → `approved` (passed) or `rejected`
//! (failed).
//!
//! A claimed job is held by a lease: while it runs, its worker renews it
//! ([`JobStore::heartbeat_job`]) every [`JobLease::heartbeat`], from a task of its own, so
//! however long one case runs. A job left `building` or `testing` with no renewal for
//! [`JobLease::stale`] (the process running it stopped, or lost the store) is closed as
//! `failed` and queued again ([`CustomTools::requeue_interrupted`]); a worker whose renewal
//! finds its job released stops running it, so each job runs to completion once.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use quiver_contract::{Envelope, Lifecycle};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{CustomError, CustomTools, Expect, Reviewed, TestCase, pending_of};
use crate::{
    sandbox::{SandboxError, SandboxHost, SandboxRun},
    store::{JobStatus, JobStore, JobType, NewJob, ToolJob},
};

/// How long a running job stays its worker's without a heartbeat. The worker renews the
/// job every [`JobLease::heartbeat`]; a job not renewed for [`JobLease::stale`] is taken to
/// have lost its worker and is released ([`CustomTools::requeue_interrupted`]). The bound
/// does not depend on how long one case may run: the heartbeat goes on during a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLease {
    stale: Duration,
    heartbeat: Duration,
}

impl JobLease {
    /// The default stale bound: 30 s (a heartbeat every 5 s, a look every 10 s).
    pub const DEFAULT_STALE: Duration = Duration::from_secs(30);

    /// A lease released after `stale` without a heartbeat. The heartbeat comes six times
    /// in that span, so a few slow or failed renewals (a busy database, a dropped
    /// connection) do not cost a live job its lease.
    pub fn new(stale: Duration) -> Self {
        JobLease {
            stale,
            heartbeat: stale / 6,
        }
    }

    /// The same lease, renewed every `every` instead.
    pub fn with_heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }

    /// How long a running job may go without a heartbeat before it is released.
    pub fn stale(&self) -> Duration {
        self.stale
    }

    /// How often the worker running a job renews it (at least a millisecond).
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat.max(Duration::from_millis(1))
    }

    /// How often a job worker looks for stale jobs: a third of the stale bound, so a job
    /// whose worker died is released within about four thirds of the bound after its last
    /// heartbeat.
    pub fn look_every(&self) -> Duration {
        (self.stale / 3).max(Duration::from_millis(1))
    }
}

impl Default for JobLease {
    fn default() -> Self {
        JobLease::new(JobLease::DEFAULT_STALE)
    }
}

/// The heartbeat of one running job: a task renewing its lease until dropped. When a
/// renewal finds the job no longer running (released by another worker), `lost` fires.
struct Heartbeat {
    lost: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeat {
    fn start(jobs: Arc<dyn JobStore>, id: String, every: Duration) -> Self {
        let lost = CancellationToken::new();
        let task = tokio::spawn({
            let lost = lost.clone();
            async move {
                let start = tokio::time::Instant::now() + every;
                let mut tick = tokio::time::interval_at(start, every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    match jobs.heartbeat_job(&id).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(
                                job = %id,
                                "a custom-tool job running here was released by another worker (its heartbeat did not reach the store in time); it stops here"
                            );
                            lost.cancel();
                            return;
                        }
                        // Kept trying: the lease holds until the stale bound.
                        Err(e) => {
                            tracing::warn!(job = %id, error = %e, "a custom-tool job's heartbeat did not reach the store")
                        }
                    }
                }
            }
        });
        Heartbeat { lost, task }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A job noted as running in this process: ended, it is no longer noted.
struct Running<'a> {
    set: &'a std::sync::Mutex<std::collections::BTreeSet<String>>,
    id: String,
}

impl<'a> Running<'a> {
    fn start(set: &'a std::sync::Mutex<std::collections::BTreeSet<String>>, id: &str) -> Self {
        set.lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned());
        Running {
            set,
            id: id.to_owned(),
        }
    }

    fn ended(self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

/// What [`CustomTools::add`] stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Added {
    /// The version stored.
    pub version: u32,
    /// The build job queued for it.
    pub job: String,
}

/// What a job found.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditReport {
    /// The tool.
    pub name: String,
    /// The version compiled and tested.
    pub version: u32,
    /// What the job was.
    pub kind: JobType,
    /// Each case: whether it passed, and what happened (a source that does not compile is
    /// one failed entry).
    pub cases: Vec<(bool, String)>,
    /// Whether every case passed (an empty set passes, and says so).
    pub passed: bool,
    /// The job that ran it.
    pub job_id: String,
}

impl AuditReport {
    /// The JSON kept as the tool's `test_results`, naming the engine and limits it ran under.
    fn to_json(&self, engine: &str, limits: Value) -> Value {
        json!({
            "version": self.version,
            "passed": self.passed,
            "job": self.job_id,
            "kind": self.kind.as_str(),
            "engine": engine,
            "limits": limits,
            "cases": self.cases.iter().map(|(ok, what)| json!({"passed": ok, "detail": what})).collect::<Vec<_>>(),
        })
    }
}

impl CustomTools {
    /// The limits as recorded beside results, with the `[sandbox]` key names
    /// ([`SandboxLimits::to_config_json`](crate::sandbox::SandboxLimits::to_config_json)): a
    /// change of them is a reason to rebuild. Results recorded under any other form (an
    /// older text) read as other limits, so such a tool is rebuilt once.
    fn limits_json(&self) -> Value {
        self.limits.to_config_json()
    }

    /// One job by id.
    pub async fn job(&self, id: &str) -> Result<Option<ToolJob>, CustomError> {
        Ok(self.jobs.job(id).await?)
    }

    /// The jobs, newest first, optionally only one tool's.
    pub async fn jobs(&self, name: Option<String>) -> Result<Vec<ToolJob>, CustomError> {
        Ok(self.jobs.jobs(name).await?)
    }

    /// Queues a job of `kind` for the custom tool `name`; returns its id. An audit of an
    /// approved tool with no edit under review is queued as a rebuild: its live version's
    /// cases run again and it stays live whatever they give, as an audit would take it off
    /// the catalog until approved again.
    pub async fn queue(&self, name: &str, kind: JobType) -> Result<String, CustomError> {
        let def = self.custom(name).await?;
        let kind = match kind {
            JobType::Audit if def.status == Lifecycle::Approved && pending_of(&def).is_none() => {
                JobType::Rebuild
            }
            kind => kind,
        };
        let version = match kind {
            JobType::Rebuild => def.version,
            _ => Self::reviewed(&def).version,
        };
        let id = format!(
            "{}-{name}-v{version}-{}",
            kind.as_str(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        self.jobs
            .create_job(NewJob::new(
                id.clone(),
                name,
                kind,
                json!({"version": version}),
            ))
            .await?;
        Ok(id)
    }

    /// Runs the queued job `id` here. `None` when it is not queued any more (another
    /// worker claimed it: follow it with [`crate::store::JobStore::job`]). `progress` is
    /// told the percentage done after each test case.
    pub async fn run_job(
        &self,
        id: &str,
        progress: &(dyn Fn(u8) + Send + Sync),
    ) -> Result<Option<AuditReport>, CustomError> {
        match self.jobs.claim_job(Some(id.to_owned())).await? {
            Some(job) => self.execute(job, progress).await.map(Some),
            None => Ok(None),
        }
    }

    /// Claims and runs the oldest queued job, if there is one: what a server's job worker
    /// calls.
    pub async fn run_next(&self) -> Result<Option<AuditReport>, CustomError> {
        match self.jobs.claim_job(None).await? {
            Some(job) => self.execute(job, &|_| {}).await.map(Some),
            None => Ok(None),
        }
    }

    /// Audits the version under review (the pending one when there is one) now: queues an
    /// audit job and runs it here.
    pub async fn audit(
        &self,
        name: &str,
        progress: &(dyn Fn(u8) + Send + Sync),
    ) -> Result<AuditReport, CustomError> {
        let id = self.queue(name, JobType::Audit).await?;
        self.run_job(&id, progress).await?.ok_or_else(|| {
            CustomError::Status(format!(
                "the audit job {id} of `{name}` was taken by another worker before it could run here"
            ))
        })
    }

    /// Queues a rebuild of every approved custom tool whose last results were recorded
    /// under another engine or other limits than this process's (or were never recorded),
    /// unless one is already queued or running. Returns the tools queued.
    pub async fn queue_rebuilds(&self) -> Result<Vec<String>, CustomError> {
        let engine = self.sandbox.engine();
        let limits = self.limits_json();
        let mut queued = Vec::new();
        for def in self.list().await? {
            if def.status != Lifecycle::Approved {
                continue;
            }
            let results = def.test_results.as_ref();
            let field = |key: &str| results.and_then(|r| r.get(key));
            if field("engine").and_then(Value::as_str) == Some(engine.as_str())
                && field("limits") == Some(&limits)
            {
                continue;
            }
            let busy = self
                .jobs
                .jobs(Some(def.name.clone()))
                .await?
                .iter()
                .any(|j| j.job_type == JobType::Rebuild && !j.status.is_terminal());
            if !busy {
                self.queue(&def.name, JobType::Rebuild).await?;
                queued.push(def.name);
            }
        }
        Ok(queued)
    }

    /// Closes as `failed` every job left `building` or `testing` with no heartbeat for the
    /// lease's stale bound ([`JobLease::stale`]: the process running it stopped, or lost the
    /// store), naming why, and queues the same job again. Returns the tools requeued. The
    /// release is one conditional step in the store ([`JobStore::release_job`]): a heartbeat
    /// that lands after the jobs were read keeps its job, and of several workers releasing
    /// one job at once, one does.
    pub async fn requeue_interrupted(&self) -> Result<Vec<String>, CustomError> {
        let stale_after = self.lease.stale();
        let Some(cutoff) = std::time::SystemTime::now().checked_sub(stale_after) else {
            return Ok(Vec::new());
        };
        let why = json!({"interrupted": format!(
            "no heartbeat from the process running it for {stale_after:?} (it stopped, or lost the store); queued again"
        )});
        let mut requeued = Vec::new();
        for job in self.jobs.jobs(None).await? {
            if !matches!(job.status, JobStatus::Building | JobStatus::Testing)
                || job.updated_at >= cutoff
            {
                continue;
            }
            if self
                .jobs
                .release_job(&job.id, Some(cutoff), why.clone())
                .await?
            {
                self.queue_again(&job, &mut requeued).await?;
            }
        }
        Ok(requeued)
    }

    /// Hands back the jobs this process was running when their work stopped unfinished (a
    /// stopping server aborts its job worker): each is closed as `failed` and queued again
    /// at once, for any worker, rather than after the stale bound. Returns the tools
    /// requeued.
    pub async fn hand_back(&self) -> Result<Vec<String>, CustomError> {
        let ids: Vec<String> =
            std::mem::take(&mut *self.running.lock().unwrap_or_else(|p| p.into_inner()))
                .into_iter()
                .collect();
        let why = json!({"interrupted": "the server running it stopped; queued again"});
        let mut requeued = Vec::new();
        for id in ids {
            let Some(job) = self.jobs.job(&id).await? else {
                continue;
            };
            if self.jobs.release_job(&id, None, why.clone()).await? {
                self.queue_again(&job, &mut requeued).await?;
            }
        }
        Ok(requeued)
    }

    /// Queues a released job's work again (unless its tool is gone).
    async fn queue_again(
        &self,
        job: &ToolJob,
        requeued: &mut Vec<String>,
    ) -> Result<(), CustomError> {
        match self.queue(&job.tool_name, job.job_type).await {
            Ok(_) => requeued.push(job.tool_name.clone()),
            // A tool deleted since has nothing to run.
            Err(CustomError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Runs a claimed job (`building`) to its end, renewing its lease meanwhile; stops,
    /// recording nothing more, when the lease turns out lost.
    async fn execute(
        &self,
        job: ToolJob,
        progress: &(dyn Fn(u8) + Send + Sync),
    ) -> Result<AuditReport, CustomError> {
        let id = job.id.clone();
        // Noted as running here until it ends; work dropped unfinished leaves it noted, for
        // [`CustomTools::hand_back`].
        let running = Running::start(&self.running, &id);
        let heartbeat = Heartbeat::start(self.jobs.clone(), id.clone(), self.lease.heartbeat());
        let done = tokio::select! {
            biased;
            () = heartbeat.lost.cancelled() => Err(CustomError::Released(id)),
            done = self.run_claimed(job, progress) => done,
        };
        running.ended();
        done
    }

    /// The work of [`CustomTools::execute`].
    async fn run_claimed(
        &self,
        job: ToolJob,
        progress: &(dyn Fn(u8) + Send + Sync),
    ) -> Result<AuditReport, CustomError> {
        let name = job.tool_name.clone();
        let def = match self.custom(&name).await {
            Ok(def) => def,
            Err(e) => {
                let why = json!({"error": e.to_string()});
                self.jobs
                    .transition_job(&job.id, JobStatus::Failed, Some(why))
                    .await?;
                return Err(e);
            }
        };
        let rebuild = job.job_type == JobType::Rebuild;
        let reviewed = if rebuild {
            Reviewed {
                version: def.version,
                source: def.implementation.clone(),
                test_cases: def.test_cases.clone().unwrap_or_else(|| json!([])),
                status: def.status,
                test_results: def.test_results.clone(),
                pending: false,
            }
        } else {
            Self::reviewed(&def)
        };
        let cases = match TestCase::parse_all(&reviewed.test_cases) {
            Ok(cases) => cases,
            Err(why) => {
                let result = json!({"error": why});
                self.jobs
                    .transition_job(&job.id, JobStatus::Failed, Some(result))
                    .await?;
                return Err(CustomError::Invalid(why));
            }
        };
        let mut report = AuditReport {
            name: name.clone(),
            version: reviewed.version,
            kind: job.job_type,
            cases: Vec::new(),
            passed: false,
            job_id: job.id.clone(),
        };
        let compiled = match job.job_type {
            JobType::Audit => Ok(()),
            _ => self.sandbox.validate(&reviewed.source, &self.limits),
        };
        if !rebuild {
            self.set_review(def, Lifecycle::Testing, None, None).await?;
        }
        self.jobs
            .transition_job(&job.id, JobStatus::Testing, None)
            .await?;
        match compiled {
            Ok(()) => {
                report.cases = self
                    .run_cases(&reviewed.source, &cases, &job.id, progress)
                    .await;
                report.passed = report.cases.iter().all(|(ok, _)| *ok);
            }
            Err(e) => {
                report.cases = vec![(false, compile_failure(&e))];
                progress(100);
            }
        }
        self.record(&report).await?;
        Ok(report)
    }

    /// Writes a finished job's results on the tool and closes the job.
    async fn record(&self, report: &AuditReport) -> Result<(), CustomError> {
        let results = report.to_json(&self.sandbox.engine(), self.limits_json());
        let first_failure = report
            .cases
            .iter()
            .find(|(ok, _)| !ok)
            .map(|(_, what)| what.clone());
        // Read again: the tool may have been edited or disabled while the cases ran.
        let mut def = self.custom(&report.name).await?;
        if report.kind == JobType::Rebuild {
            if def.version == report.version {
                // An approval by override stays on the record beside the new results.
                let mut results = results.clone();
                if let (Some(note), Value::Object(map)) = (
                    def.test_results
                        .as_ref()
                        .and_then(|r| r.get("override"))
                        .cloned(),
                    &mut results,
                ) {
                    map.insert("override".into(), note);
                }
                def.test_results = Some(results);
                self.store.put_definition(def).await?;
            }
            if let Some(why) = &first_failure {
                tracing::warn!(
                    tool = %report.name,
                    version = report.version,
                    "an approved custom tool failed its rebuild under this engine and these limits, and stays live: {why}"
                );
            }
        } else if pending_of(&def).map_or(def.version, |p| p.version) == report.version {
            match &first_failure {
                None => {
                    self.set_review(def, Lifecycle::Testing, Some(results.clone()), None)
                        .await?
                }
                Some(why) => {
                    let what = report.kind.as_str();
                    self.set_review(
                        def,
                        Lifecycle::Rejected,
                        Some(results.clone()),
                        Some(format!("{what} failed: {why}")),
                    )
                    .await?
                }
            }
        }
        let to = if first_failure.is_none() {
            JobStatus::Approved
        } else {
            JobStatus::Rejected
        };
        self.jobs
            .transition_job(&report.job_id, to, Some(results))
            .await?;
        Ok(())
    }

    async fn run_cases(
        &self,
        source: &str,
        cases: &[TestCase],
        job_id: &str,
        progress: &(dyn Fn(u8) + Send + Sync),
    ) -> Vec<(bool, String)> {
        let source: std::sync::Arc<str> = source.into();
        let mut results = Vec::with_capacity(cases.len());
        for (i, case) in cases.iter().enumerate() {
            let host: std::sync::Arc<dyn SandboxHost> = std::sync::Arc::new(NoTools);
            let run = SandboxRun::new(
                source.clone(),
                case.inputs.clone(),
                self.limits.clone(),
                host,
            );
            let outcome = self.sandbox.run(run).await;
            results.push(verdict(i + 1, &case.expect, outcome));
            let pct = u8::try_from((i + 1) * 100 / cases.len()).unwrap_or(100);
            let _ = self.jobs.set_job_progress(job_id, pct).await;
            progress(pct);
        }
        if cases.is_empty() {
            progress(100);
        }
        results
    }
}

/// A source that does not compile, as a failed case's text.
fn compile_failure(e: &SandboxError) -> String {
    match e {
        SandboxError::Syntax {
            line,
            column,
            message,
        } => format!("the source does not compile: line {line}, column {column}: {message}"),
        other => format!("the source is refused: {other}"),
    }
}

/// Case `n`'s verdict: whether `outcome` is what it expects, and what happened.
fn verdict(
    n: usize,
    expect: &Expect,
    outcome: Result<crate::sandbox::SandboxOutput, SandboxError>,
) -> (bool, String) {
    match (expect, outcome) {
        (Expect::Value(want), Ok(out)) if out.result == *want => (true, format!("case {n}: ok")),
        (Expect::Value(want), Ok(out)) => (
            false,
            format!("case {n}: expected {want}, got {}", out.result),
        ),
        (Expect::Value(want), Err(e)) => (
            false,
            format!("case {n}: expected {want}, got error {}: {e}", e.kind()),
        ),
        (Expect::Error(kind), Err(e)) if e.kind() == kind => {
            (true, format!("case {n}: ok ({kind})"))
        }
        (Expect::Error(kind), Err(e)) => (
            false,
            format!(
                "case {n}: expected error {kind}, got error {}: {e}",
                e.kind()
            ),
        ),
        (Expect::Error(kind), Ok(out)) => (
            false,
            format!("case {n}: expected error {kind}, got {}", out.result),
        ),
    }
}

/// The host of a job's runs: test cases are run alone, so `call_tool` is refused.
struct NoTools;

#[async_trait]
impl SandboxHost for NoTools {
    async fn call_tool(&self, name: &str, _inputs: Value) -> Envelope {
        Envelope::err(
            quiver_contract::ErrKind::NotAvailable,
            format!(
                "`call_tool(\"{name}\")` is not available while a custom tool's test cases run"
            ),
        )
    }
}
