//! The store ports the registry consumes: [`DefinitionStore`] (which tools exist and in what
//! state, and the seeding of system tools), [`JobStore`] (custom-tool build jobs and their
//! transition table) and [`CallLog`] (the execution log behind the recorder), with their types,
//! their one error enum [`StoreError`], and in-memory implementations. They speak only
//! `contract` types: an adapter (SQLite, Postgres, ...) converts at its edge.
//!
//! Over 800 lines: three ports, their shared types and their in-memory implementations; each
//! in-memory store sits beside the port it implements.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Mutex,
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use quiver_contract::{
    Category, Envelope, ErrKind, HintKind, Lifecycle, RenderOptions, ToolSpec, render,
};
use serde_json::Value;
use thiserror::Error;

use crate::{CallRecord, ToolCallRecorder, sync::lock};

/// Faults of a store. Every variant classifies, so callers never look inside the text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The named thing does not exist.
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// The write clashes with what is stored (a duplicate key, contradicting input).
    #[error("conflict: {what}")]
    Conflict {
        /// What clashed.
        what: String,
    },
    /// A job status change the transition table forbids.
    #[error("job `{job}` cannot go from {} to {}", from.as_str(), to.as_str())]
    InvalidTransition {
        /// The job id.
        job: String,
        /// Its current status.
        from: JobStatus,
        /// The refused status.
        to: JobStatus,
    },
    /// A command that only reads found no store there yet: a database with no Quiver
    /// tables, which the first command that writes creates.
    #[error("store at {location} is not created yet: {cause}")]
    NotCreated {
        /// The database path or address.
        location: String,
        /// What creates it.
        cause: String,
    },
    /// The store cannot be used right now or here: locked, read-only, out of space, closed.
    #[error("store at {location} is unavailable: {cause}")]
    Unavailable {
        /// The database path or address.
        location: String,
        /// Why, for the operator.
        cause: String,
    },
    /// The stored data is damaged or is not a store at all (the cause says which: "the
    /// database file is damaged", "not a Quiver store").
    #[error("store at {location} cannot be used: {cause}")]
    Corrupt {
        /// The database path or address.
        location: String,
        /// What is wrong.
        cause: String,
    },
    /// The stored schema is newer than this binary understands.
    #[error(
        "store at {location} has schema version {found}; this binary knows up to {supported}: upgrade Quiver"
    )]
    TooNew {
        /// The database path or address.
        location: String,
        /// The stored schema version.
        found: u32,
        /// The newest version this binary knows.
        supported: u32,
    },
    /// A stored value this binary cannot read back (for example an unknown status name).
    #[error("invalid stored data: {what}")]
    InvalidData {
        /// What is wrong.
        what: String,
    },
    /// Any other fault of the engine.
    #[error("store at {location} failed: {cause}")]
    Backend {
        /// The database path or address.
        location: String,
        /// The engine's complaint.
        cause: String,
    },
}

impl StoreError {
    /// A [`StoreError::NotFound`].
    pub fn not_found(what: impl Into<String>) -> Self {
        StoreError::NotFound { what: what.into() }
    }

    /// A [`StoreError::Conflict`].
    pub fn conflict(what: impl Into<String>) -> Self {
        StoreError::Conflict { what: what.into() }
    }

    /// A [`StoreError::InvalidData`].
    pub fn invalid_data(what: impl Into<String>) -> Self {
        StoreError::InvalidData { what: what.into() }
    }
}

/// Where a tool comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ToolType {
    /// Built into Quiver (`system:<name>`).
    #[default]
    System,
    /// Written at run time and run in the sandbox.
    Custom,
    /// Proxied to an MCP upstream (`mcp:<conn>:<tool>`).
    Mcp,
}

impl ToolType {
    /// The lower-case name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolType::System => "system",
            ToolType::Custom => "custom",
            ToolType::Mcp => "mcp",
        }
    }

    /// Parses a name produced by [`ToolType::as_str`].
    pub fn parse(s: &str) -> Option<ToolType> {
        [ToolType::System, ToolType::Custom, ToolType::Mcp]
            .into_iter()
            .find(|t| t.as_str() == s)
    }
}

/// Parses a name produced by [`Lifecycle::as_str`].
pub fn parse_lifecycle(s: &str) -> Option<Lifecycle> {
    [
        Lifecycle::Draft,
        Lifecycle::Testing,
        Lifecycle::Approved,
        Lifecycle::Rejected,
    ]
    .into_iter()
    .find(|l| l.as_str() == s)
}

/// The tenant value that makes a definition visible to every tenant.
pub const ALL_TENANTS: &str = "*";

/// One stored tool definition.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolDefinition {
    /// The unique name.
    pub name: String,
    /// What the tool does.
    pub description: String,
    /// The JSON Schema of the arguments.
    pub input_schema: Value,
    /// Custom source, `system:<name>` or `mcp:<conn>:<tool>`.
    pub implementation: String,
    /// Where the tool comes from; seeding never changes it.
    pub tool_type: ToolType,
    /// Review status; seeding never changes it.
    pub status: Lifecycle,
    /// Disabled tools are neither listed nor callable.
    pub enabled: bool,
    /// The category (`internal` is callable, never listed).
    pub category: Category,
    /// A free-form domain (for example `finance`).
    pub domain: Option<String>,
    /// A model capability that makes this tool redundant.
    pub replaced_by_model_capability: Option<String>,
    /// A short line a UI may show while the tool runs.
    pub status_message: Option<String>,
    /// The tool can return large outputs.
    pub large_output: bool,
    /// The tool this one was derived from.
    pub parent_tool: Option<String>,
    /// Tools this one calls.
    pub dependencies: Vec<String>,
    /// Bumped by each rebuild.
    pub version: u32,
    /// The tenant the tool belongs to, [`ALL_TENANTS`] for everyone.
    pub tenant_id: String,
    /// Who created it.
    pub created_by: Option<String>,
    /// Why review turned it down.
    pub rejection_reason: Option<String>,
    /// The last test run's results.
    pub test_results: Option<Value>,
    /// When it was soft-deleted; deleted rows are kept but never visible.
    pub deleted_at: Option<SystemTime>,
    /// The stored embedding of the tool's search text; a changed description clears it.
    pub embedding: Option<Vec<f32>>,
    /// What `embedding` was computed from (the model and the text, as the search index keys
    /// them): a vector whose key differs from the tool's current one is not used. Cleared
    /// with the embedding.
    pub embedding_key: Option<String>,
    /// A custom tool's test cases (a JSON array, see `custom::TestCase`).
    pub test_cases: Option<Value>,
    /// A custom tool's next version while it is reviewed (see `custom::PendingVersion`):
    /// the version in the other fields stays live until this one is approved.
    pub pending: Option<Value>,
}

impl ToolDefinition {
    /// A definition taken from a spec: the spec's text, category, hints and lifecycle; tenant
    /// `*`, version 1, no lineage.
    pub fn from_spec(
        spec: &ToolSpec,
        tool_type: ToolType,
        implementation: impl Into<String>,
    ) -> Self {
        ToolDefinition {
            name: spec.name.clone(),
            description: spec.description.clone(),
            input_schema: spec.input_schema.clone(),
            implementation: implementation.into(),
            tool_type,
            status: spec.lifecycle,
            enabled: spec.enabled,
            category: spec.category.clone(),
            domain: None,
            replaced_by_model_capability: spec.replaced_by_model_capability.clone(),
            status_message: spec.status_message.clone(),
            large_output: spec.large_output,
            parent_tool: None,
            dependencies: Vec::new(),
            version: 1,
            tenant_id: ALL_TENANTS.to_owned(),
            created_by: None,
            rejection_reason: None,
            test_results: None,
            deleted_at: None,
            embedding: None,
            embedding_key: None,
            test_cases: None,
            pending: None,
        }
    }

    /// A built-in tool's definition: type system, handler `system:<name>`.
    pub fn system(spec: &ToolSpec) -> Self {
        Self::from_spec(spec, ToolType::System, format!("system:{}", spec.name))
    }

    /// Sets the tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant_id = tenant.into();
        self
    }

    /// Sets the status.
    pub fn with_status(mut self, status: Lifecycle) -> Self {
        self.status = status;
        self
    }

    /// The spec the catalog and the surface use.
    pub fn to_spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(self.name.clone(), self.description.clone())
            .with_schema(self.input_schema.clone())
            .with_category(self.category.0.clone())
            .with_lifecycle(self.status)
            .with_enabled(self.enabled)
            .with_large_output(self.large_output);
        if let Some(m) = &self.status_message {
            spec = spec.with_status_message(m.clone());
        }
        if let Some(c) = &self.replaced_by_model_capability {
            spec = spec.replaced_by(c.clone());
        }
        spec
    }

    /// Whether `tenant` may see this definition: approved, enabled, not internal, not
    /// deleted, and owned by `tenant` or by everyone.
    pub fn visible_to(&self, tenant: &str) -> bool {
        self.status == Lifecycle::Approved
            && self.enabled
            && !self.category.is_internal()
            && self.deleted_at.is_none()
            && (self.tenant_id == tenant || self.tenant_id == ALL_TENANTS)
    }
}

/// What seeding did, name by name (each list sorted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SeedReport {
    /// New rows.
    pub inserted: Vec<String>,
    /// Rows whose refreshed fields changed (or that were revived from a soft delete).
    pub updated: Vec<String>,
    /// Rows already up to date.
    pub unchanged: Vec<String>,
    /// Rows soft-deleted because their names were retired.
    pub retired: Vec<String>,
    /// Live system rows the running code does not know; left alone.
    pub unknown: Vec<String>,
}

/// The writes seeding decided on, for an adapter to apply in one transaction.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SeedPlan {
    /// Rows to insert.
    pub inserts: Vec<ToolDefinition>,
    /// Whole rows to write back over the stored ones.
    pub updates: Vec<ToolDefinition>,
    /// Names to soft-delete.
    pub retire: Vec<String>,
    /// The report to hand back.
    pub report: SeedReport,
}

/// Decides what [`DefinitionStore::seed_system_tools`] writes, given every stored row
/// (deleted ones included). Shared by every adapter so the semantics are one:
///
/// - a new name is inserted as given;
/// - a stored name gets description, input schema, category, implementation, status message
///   and large-output refreshed (and is revived if soft-deleted); its tool type and status are
///   never overwritten; a changed description clears the stored embedding;
/// - only the names in `retired` are soft-deleted;
/// - a live system row named in neither list is reported as unknown and left alone.
///
/// A name both seeded and retired is a [`StoreError::Conflict`].
pub fn plan_seed(
    stored: &[ToolDefinition],
    tools: &[ToolDefinition],
    retired: &[String],
) -> Result<SeedPlan, StoreError> {
    let stored: BTreeMap<&str, &ToolDefinition> =
        stored.iter().map(|d| (d.name.as_str(), d)).collect();
    let seeded: BTreeSet<&str> = tools.iter().map(|d| d.name.as_str()).collect();
    if seeded.len() != tools.len() {
        return Err(StoreError::conflict("a tool name is seeded twice"));
    }
    let retired_set: BTreeSet<&str> = retired.iter().map(String::as_str).collect();
    if let Some(both) = seeded.intersection(&retired_set).next() {
        return Err(StoreError::conflict(format!(
            "`{both}` is both seeded and retired"
        )));
    }
    let mut plan = SeedPlan::default();
    for tool in tools {
        match stored.get(tool.name.as_str()) {
            None => {
                plan.report.inserted.push(tool.name.clone());
                plan.inserts.push(tool.clone());
            }
            Some(old) => {
                let mut new = (*old).clone();
                if new.description != tool.description {
                    new.embedding = None;
                    new.embedding_key = None;
                }
                new.description = tool.description.clone();
                new.input_schema = tool.input_schema.clone();
                new.category = tool.category.clone();
                new.implementation = tool.implementation.clone();
                new.status_message = tool.status_message.clone();
                new.large_output = tool.large_output;
                new.deleted_at = None;
                if &new == *old {
                    plan.report.unchanged.push(tool.name.clone());
                } else {
                    plan.report.updated.push(tool.name.clone());
                    plan.updates.push(new);
                }
            }
        }
    }
    for name in &retired_set {
        if stored.get(name).is_some_and(|d| d.deleted_at.is_none()) {
            plan.retire.push((*name).to_owned());
            plan.report.retired.push((*name).to_owned());
        }
    }
    for (name, def) in &stored {
        if def.tool_type == ToolType::System
            && def.deleted_at.is_none()
            && !seeded.contains(name)
            && !retired_set.contains(name)
        {
            plan.report.unknown.push((*name).to_owned());
        }
    }
    let r = &mut plan.report;
    for list in [
        &mut r.inserted,
        &mut r.updated,
        &mut r.unchanged,
        &mut r.retired,
        &mut r.unknown,
    ] {
        list.sort();
    }
    Ok(plan)
}

/// Which tools exist and in what state.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait DefinitionStore: Send + Sync {
    /// Upserts the running code's system tools and soft-deletes the `retired` names, in one
    /// transaction, with the semantics of [`plan_seed`].
    async fn seed_system_tools(
        &self,
        tools: Vec<ToolDefinition>,
        retired: Vec<String>,
    ) -> Result<SeedReport, StoreError>;

    /// Inserts a definition, or replaces the stored one of that name (reviving it if it was
    /// deleted). A changed description clears the stored embedding.
    async fn put_definition(&self, def: ToolDefinition) -> Result<(), StoreError>;

    /// One definition by name, deleted or not.
    async fn definition(&self, name: &str) -> Result<Option<ToolDefinition>, StoreError>;

    /// Every definition, deleted ones included, by name.
    async fn all_definitions(&self) -> Result<Vec<ToolDefinition>, StoreError>;

    /// What `tenant` may see: approved, enabled, not internal, not deleted, tenant in
    /// (`tenant`, `*`); by name.
    async fn visible_definitions(&self, tenant: &str) -> Result<Vec<ToolDefinition>, StoreError>;

    /// Sets the review status (and the rejection reason, cleared when `None`).
    async fn set_status(
        &self,
        name: &str,
        status: Lifecycle,
        rejection_reason: Option<String>,
    ) -> Result<(), StoreError>;

    /// Enables or disables a tool.
    async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), StoreError>;

    /// Stores the embedding of the tool's current search text, computed from what `key`
    /// names. Does not change [`DefinitionStore::definitions_version`]: a vector is not a
    /// change of the tool.
    async fn set_embedding(
        &self,
        name: &str,
        key: String,
        embedding: Vec<f32>,
    ) -> Result<(), StoreError>;

    /// Soft-deletes a tool; the row stays, never visible.
    async fn soft_delete(&self, name: &str) -> Result<(), StoreError>;

    /// A number that changes whenever any definition changes, in this process or another
    /// sharing the store: a running server polls it to take definitions written elsewhere
    /// (an approval, a disable) live without reading them all each time.
    async fn definitions_version(&self) -> Result<u64, StoreError>;

    /// Waits, at most about `wait`, for a change of the definitions since version `seen`
    /// (what [`DefinitionStore::definitions_version`] returned), and returns the version
    /// then. A store that can announce changes (a database's notifications) returns as soon
    /// as one comes; the default waits out `wait` and reads the version, so a caller loops
    /// on it either way.
    async fn definitions_changed(
        &self,
        seen: Option<u64>,
        wait: Duration,
    ) -> Result<u64, StoreError> {
        let _ = seen;
        tokio::time::sleep(wait).await;
        self.definitions_version().await
    }
}

/// What a custom-tool job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobType {
    /// Compile a new version and run its test cases.
    Build,
    /// Run the test cases of the version under review again.
    Audit,
    /// Compile an approved version and run its test cases under the current engine and
    /// limits.
    Rebuild,
}

impl JobType {
    /// The lower-case name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            JobType::Build => "build",
            JobType::Audit => "audit",
            JobType::Rebuild => "rebuild",
        }
    }

    /// Parses a name produced by [`JobType::as_str`].
    pub fn parse(s: &str) -> Option<JobType> {
        [JobType::Build, JobType::Audit, JobType::Rebuild]
            .into_iter()
            .find(|t| t.as_str() == s)
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobStatus {
    /// Waiting for a worker.
    Queued,
    /// Claimed by a worker; the code is being compiled.
    Building,
    /// Test cases are running.
    Testing,
    /// Done; every case passed (terminal). Whether the tool goes live is the operator's
    /// approval, not the job's.
    Approved,
    /// Done; the code did not compile or a case failed (terminal).
    Rejected,
    /// Done; something broke (terminal).
    Failed,
}

impl JobStatus {
    /// Every status.
    pub const ALL: [JobStatus; 6] = [
        JobStatus::Queued,
        JobStatus::Building,
        JobStatus::Testing,
        JobStatus::Approved,
        JobStatus::Rejected,
        JobStatus::Failed,
    ];

    /// The transition table: every allowed `(from, to)`. A failed test run goes back to
    /// building; the three outcomes are terminal.
    pub const TRANSITIONS: [(JobStatus, JobStatus); 9] = [
        (JobStatus::Queued, JobStatus::Building),
        (JobStatus::Queued, JobStatus::Failed),
        (JobStatus::Building, JobStatus::Testing),
        (JobStatus::Building, JobStatus::Failed),
        (JobStatus::Testing, JobStatus::Building),
        (JobStatus::Testing, JobStatus::Approved),
        (JobStatus::Testing, JobStatus::Rejected),
        (JobStatus::Testing, JobStatus::Failed),
        (JobStatus::Queued, JobStatus::Rejected),
    ];

    /// Whether the table allows going from `self` to `next`.
    pub fn can_become(self, next: JobStatus) -> bool {
        Self::TRANSITIONS.contains(&(self, next))
    }

    /// Whether no transition leaves this status.
    pub fn is_terminal(self) -> bool {
        !Self::TRANSITIONS.iter().any(|(from, _)| *from == self)
    }

    /// The lower-case name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Building => "building",
            JobStatus::Testing => "testing",
            JobStatus::Approved => "approved",
            JobStatus::Rejected => "rejected",
            JobStatus::Failed => "failed",
        }
    }

    /// Parses a name produced by [`JobStatus::as_str`].
    pub fn parse(s: &str) -> Option<JobStatus> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Checks a transition of job `job`, as every store must before writing it.
    pub fn check(self, next: JobStatus, job: &str) -> Result<(), StoreError> {
        if self.can_become(next) {
            Ok(())
        } else {
            Err(StoreError::InvalidTransition {
                job: job.to_owned(),
                from: self,
                to: next,
            })
        }
    }
}

/// A job to create; it starts `queued` at 0 %.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NewJob {
    /// The caller-chosen unique id.
    pub id: String,
    /// The tool the job is about.
    pub tool_name: String,
    /// What it does.
    pub job_type: JobType,
    /// What to build (free-form).
    pub spec: Value,
    /// The tenant.
    pub tenant: Option<String>,
    /// The conversation that asked for it.
    pub conversation: Option<String>,
}

impl NewJob {
    /// A job with no tenant or conversation.
    pub fn new(
        id: impl Into<String>,
        tool_name: impl Into<String>,
        job_type: JobType,
        spec: Value,
    ) -> Self {
        NewJob {
            id: id.into(),
            tool_name: tool_name.into(),
            job_type,
            spec,
            tenant: None,
            conversation: None,
        }
    }

    /// Sets the tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Sets the conversation.
    pub fn with_conversation(mut self, conversation: impl Into<String>) -> Self {
        self.conversation = Some(conversation.into());
        self
    }
}

/// A stored job.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolJob {
    /// The unique id.
    pub id: String,
    /// The tool the job is about.
    pub tool_name: String,
    /// What it does.
    pub job_type: JobType,
    /// Where it is.
    pub status: JobStatus,
    /// What to build.
    pub spec: Value,
    /// What came out, once there is something.
    pub result: Option<Value>,
    /// Progress, 0..=100.
    pub progress_pct: u8,
    /// The tenant.
    pub tenant: Option<String>,
    /// The conversation that asked for it.
    pub conversation: Option<String>,
    /// When it was created.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
}

impl ToolJob {
    /// The job `job` creates: `queued`, 0 %, no result, created and updated `now`.
    pub fn queued(job: NewJob, now: SystemTime) -> Self {
        ToolJob {
            id: job.id,
            tool_name: job.tool_name,
            job_type: job.job_type,
            status: JobStatus::Queued,
            spec: job.spec,
            result: None,
            progress_pct: 0,
            tenant: job.tenant,
            conversation: job.conversation,
            created_at: now,
            updated_at: now,
        }
    }
}

/// Custom-tool jobs. Status changes follow [`JobStatus::TRANSITIONS`]; an illegal jump is
/// [`StoreError::InvalidTransition`] and writes nothing.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait JobStore: Send + Sync {
    /// Creates a job (`queued`, 0 %); a taken id is a [`StoreError::Conflict`].
    async fn create_job(&self, job: NewJob) -> Result<ToolJob, StoreError>;

    /// One job by id.
    async fn job(&self, id: &str) -> Result<Option<ToolJob>, StoreError>;

    /// Moves a job to `to`, setting its result when one is given; returns the job as stored.
    async fn transition_job(
        &self,
        id: &str,
        to: JobStatus,
        result: Option<Value>,
    ) -> Result<ToolJob, StoreError>;

    /// Sets a job's progress (clamped to 100).
    async fn set_job_progress(&self, id: &str, pct: u8) -> Result<(), StoreError>;

    /// The heartbeat of the worker running job `id`: when the job is `building` or
    /// `testing`, its `updated_at` becomes now and the answer is `true`. `false` when it is
    /// neither, or gone: the job is no longer the worker's (another process released it as
    /// interrupted, or it ended), and the worker should stop. Changes nothing else.
    async fn heartbeat_job(&self, id: &str) -> Result<bool, StoreError>;

    /// Takes job `id` from the worker running it, in one step: when it is `building` or
    /// `testing` and, with `renewed_before`, its last heartbeat (`updated_at`) is older than
    /// that, it becomes `failed` with `why` as its result and the answer is `true`. A
    /// heartbeat that lands first keeps the job its worker's (`false`), as does a job that
    /// ended or is gone; of several processes releasing one job at once, one does.
    async fn release_job(
        &self,
        id: &str,
        renewed_before: Option<SystemTime>,
        why: Value,
    ) -> Result<bool, StoreError>;

    /// Jobs, newest first, optionally only those about one tool.
    async fn jobs(&self, tool_name: Option<String>) -> Result<Vec<ToolJob>, StoreError>;

    /// Claims a queued job for the caller, moving it to `building` in the same step, so that
    /// of several workers sharing the store exactly one gets it: the job `id` when given, else
    /// the oldest queued one. `None` when there is no such queued job (another worker took
    /// it, or the queue is empty).
    async fn claim_job(&self, id: Option<String>) -> Result<Option<ToolJob>, StoreError>;

    /// Waits, at most about `wait`, for a job to be queued (by any process sharing the
    /// store) since `seen` (what this returned last; `None` the first time), and returns the
    /// count of announcements then. A store that can announce queued jobs (a database's
    /// notifications; see [`JobStore::announces_jobs`]) returns as soon as one comes; the
    /// default waits out `wait`. A worker looks for queued jobs after it either way.
    async fn job_queued_since(&self, seen: Option<u64>, wait: Duration) -> Result<u64, StoreError> {
        let _ = seen;
        tokio::time::sleep(wait).await;
        Ok(0)
    }

    /// Whether [`JobStore::job_queued_since`] returns when a job is queued, so that a worker
    /// may wait long between looks (its wait is then only a fallback); `false` (the
    /// default): it only waits out its `wait`, so a worker must look often.
    fn announces_jobs(&self) -> bool {
        false
    }
}

/// Characters of the rendered envelope kept in [`LoggedCall::output_summary`].
pub(crate) const OUTPUT_SUMMARY_CHARS: usize = 500;

/// One row of the execution log.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LoggedCall {
    /// The tool name as called.
    pub tool_name: String,
    /// The tenant.
    pub tenant: Option<String>,
    /// Who called: the inbound token's name.
    pub principal: Option<String>,
    /// The session.
    pub session: Option<String>,
    /// The call id.
    pub call_id: String,
    /// The id of the call this one was made from (a custom tool's `call_tool`), if any.
    pub parent_call_id: Option<String>,
    /// The arguments.
    pub input: Value,
    /// The stripped narration.
    pub reasoning: Option<String>,
    /// The call's args hash.
    pub args_hash: String,
    /// `ok`, `hint` or `err`.
    pub kind: String,
    /// The hint kind of a Hint.
    pub hint_kind: Option<HintKind>,
    /// The error kind of an Err.
    pub err_kind: Option<ErrKind>,
    /// Whether the call ended Ok.
    pub success: bool,
    /// The message of a Hint or an Err.
    pub error: Option<String>,
    /// The first 500 characters of the default render ([`output_summary`]).
    pub output_summary: String,
    /// The full envelope, when asked for (see [`CallFilter::with_output`]).
    pub output: Option<Envelope>,
    /// Time waited before execution.
    pub queued: Duration,
    /// Time from dispatch to result.
    pub took: Duration,
    /// When the call was dispatched.
    pub at: SystemTime,
    /// The OpenTelemetry trace the call was part of, when traces were recorded.
    pub trace_id: Option<String>,
    /// The store's number of the row: rows are numbered as they are written. It orders
    /// calls dispatched in the same microsecond, so a page cursor is `(at, row)` (see
    /// [`CallFilter::before_row`]). 0 for a row not read back from a log.
    pub row: u64,
}

impl LoggedCall {
    /// The log row of a record (the full output included).
    pub fn from_record(record: &CallRecord) -> Self {
        let env = &record.envelope;
        LoggedCall {
            tool_name: record.tool_name.clone(),
            tenant: record.tenant.as_deref().map(str::to_owned),
            principal: record.principal.as_deref().map(str::to_owned),
            session: record.session.as_deref().map(str::to_owned),
            call_id: record.call_id.to_string(),
            parent_call_id: record.parent_call_id.as_deref().map(str::to_owned),
            input: record.input.clone(),
            reasoning: record.reasoning.clone(),
            args_hash: record.args_hash.clone(),
            kind: env.kind_str().to_owned(),
            hint_kind: env.hint_kind(),
            err_kind: env.err_kind().cloned(),
            success: env.is_ok(),
            error: env.message().map(str::to_owned),
            output_summary: output_summary(env),
            output: Some(env.clone()),
            queued: record.queued,
            took: record.took,
            at: record.at,
            trace_id: record.trace_id.as_deref().map(str::to_owned),
            row: 0,
        }
    }
}

/// The first 500 characters of an envelope's default render (what [`LoggedCall`] keeps).
pub fn output_summary(envelope: &Envelope) -> String {
    let mut text = render(envelope, &RenderOptions::default());
    if let Some((cut, _)) = text.char_indices().nth(OUTPUT_SUMMARY_CHARS) {
        text.truncate(cut);
    }
    text
}

/// Which log rows [`CallLog::recent_calls`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallFilter {
    /// Only calls to this tool.
    pub tool: Option<String>,
    /// Only calls in this session.
    pub session: Option<String>,
    /// Only calls of this outcome: `ok`, `hint` or `err`.
    pub kind: Option<String>,
    /// Only calls by this principal (the inbound token's name).
    pub principal: Option<String>,
    /// Only the call of this id.
    pub call_id: Option<String>,
    /// Only the calls made from the call of this id (a custom tool's `call_tool` calls).
    pub parent: Option<String>,
    /// Only calls dispatched before this time (a page's cursor: the oldest row shown).
    pub before: Option<SystemTime>,
    /// With `before`: the calls dispatched exactly at `before` whose row is below this
    /// are taken too (the rest of a page's cursor, see [`LoggedCall::row`]).
    pub before_row: Option<u64>,
    /// Only calls dispatched after this time (what a live view has not shown yet).
    pub after: Option<SystemTime>,
    /// With `after`: the calls dispatched exactly at `after` whose row is above this are
    /// taken too.
    pub after_row: Option<u64>,
    /// At most this many rows, newest first.
    pub limit: usize,
    /// Whether to load each row's full output.
    pub with_output: bool,
}

impl Default for CallFilter {
    fn default() -> Self {
        CallFilter {
            tool: None,
            session: None,
            kind: None,
            principal: None,
            call_id: None,
            parent: None,
            before: None,
            before_row: None,
            after: None,
            after_row: None,
            limit: 50,
            with_output: false,
        }
    }
}

impl CallFilter {
    /// The newest `limit` calls.
    pub fn recent(limit: usize) -> Self {
        CallFilter {
            limit,
            ..Default::default()
        }
    }

    /// Only calls to `tool`.
    pub fn tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = Some(tool.into());
        self
    }

    /// Only calls in `session`.
    pub fn session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// Only calls whose envelope kind is `kind` (`ok`, `hint`, `err`).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Only calls by `principal`.
    pub fn principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(principal.into());
        self
    }

    /// Only the call `id`.
    pub fn call_id(mut self, id: impl Into<String>) -> Self {
        self.call_id = Some(id.into());
        self
    }

    /// Only the calls made from the call `id`.
    pub fn parent(mut self, id: impl Into<String>) -> Self {
        self.parent = Some(id.into());
        self
    }

    /// Only calls dispatched strictly before `at`.
    pub fn before(mut self, at: SystemTime) -> Self {
        self.before = Some(at);
        self.before_row = None;
        self
    }

    /// Only calls dispatched strictly after `at`.
    pub fn after(mut self, at: SystemTime) -> Self {
        self.after = Some(at);
        self.after_row = None;
        self
    }

    /// Only calls after the row `(at, row)` in the log's order (time, then row): a
    /// cursor that neither skips nor repeats calls dispatched in the same microsecond.
    pub fn after_row(mut self, at: SystemTime, row: u64) -> Self {
        self.after = Some(at);
        self.after_row = Some(row);
        self
    }

    /// Only calls before the row `(at, row)` in the log's order (time, then row): the
    /// cursor of the page after the one whose oldest row that is.
    pub fn before_row(mut self, at: SystemTime, row: u64) -> Self {
        self.before = Some(at);
        self.before_row = Some(row);
        self
    }

    /// Loads the full outputs too.
    pub fn with_output(mut self) -> Self {
        self.with_output = true;
        self
    }

    /// Whether a row passes the filter (the limit aside).
    pub fn matches(&self, call: &LoggedCall) -> bool {
        self.tool.as_ref().is_none_or(|t| *t == call.tool_name)
            && self
                .session
                .as_ref()
                .is_none_or(|s| Some(s) == call.session.as_ref())
            && self.kind.as_ref().is_none_or(|k| *k == call.kind)
            && self
                .principal
                .as_ref()
                .is_none_or(|p| Some(p) == call.principal.as_ref())
            && self.call_id.as_ref().is_none_or(|c| *c == call.call_id)
            && self
                .parent
                .as_ref()
                .is_none_or(|p| Some(p) == call.parent_call_id.as_ref())
            && self.before.is_none_or(|b| {
                call.at < b || (call.at == b && self.before_row.is_some_and(|r| call.row < r))
            })
            && self.after.is_none_or(|a| {
                call.at > a || (call.at == a && self.after_row.is_some_and(|r| call.row > r))
            })
    }
}

/// The execution log read back (for `quiver log`) and trimmed.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait CallLog: Send + Sync {
    /// The newest calls passing `filter`, newest first.
    async fn recent_calls(&self, filter: CallFilter) -> Result<Vec<LoggedCall>, StoreError>;

    /// Deletes the calls dispatched before `cutoff` (in small batches, so writers are never
    /// held up long); returns how many were deleted. Chained rows go from the start of the
    /// chain, stopping at the first one dispatched at or after `cutoff`, and the last one
    /// deleted is stored as a checkpoint, which anchors the chain's remaining rows.
    async fn purge_calls_before(&self, cutoff: SystemTime) -> Result<u64, StoreError>;

    /// Up to `limit` chained rows with a `seq` above `after`, in `seq` order; with `since`,
    /// only those dispatched at or after it. For verifying the chain and exporting the log.
    async fn chain_rows(
        &self,
        after: u64,
        since: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<crate::chain::ChainedRow>, StoreError>;

    /// The chain's head, checkpoints and unchained rows.
    async fn chain_state(&self) -> Result<crate::chain::ChainState, StoreError>;
}

/// An in-memory [`DefinitionStore`].
#[derive(Debug, Default)]
pub struct MemoryDefinitionStore {
    defs: Mutex<BTreeMap<String, ToolDefinition>>,
    version: std::sync::atomic::AtomicU64,
}

impl MemoryDefinitionStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut ToolDefinition)) -> Result<(), StoreError> {
        let mut defs = lock(&self.defs);
        let def = defs
            .get_mut(name)
            .ok_or_else(|| StoreError::not_found(format!("tool `{name}`")))?;
        f(def);
        self.changed();
        Ok(())
    }

    fn changed(&self) {
        self.version
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

#[async_trait]
impl DefinitionStore for MemoryDefinitionStore {
    async fn seed_system_tools(
        &self,
        tools: Vec<ToolDefinition>,
        retired: Vec<String>,
    ) -> Result<SeedReport, StoreError> {
        let mut defs = lock(&self.defs);
        let stored: Vec<ToolDefinition> = defs.values().cloned().collect();
        let plan = plan_seed(&stored, &tools, &retired)?;
        for def in plan.inserts.into_iter().chain(plan.updates) {
            defs.insert(def.name.clone(), def);
        }
        let now = SystemTime::now();
        for name in &plan.retire {
            if let Some(def) = defs.get_mut(name) {
                def.deleted_at = Some(now);
            }
        }
        self.changed();
        Ok(plan.report)
    }

    async fn put_definition(&self, mut def: ToolDefinition) -> Result<(), StoreError> {
        let mut defs = lock(&self.defs);
        if let Some(old) = defs.get(&def.name)
            && old.description != def.description
        {
            def.embedding = None;
            def.embedding_key = None;
        }
        def.deleted_at = None;
        defs.insert(def.name.clone(), def);
        self.changed();
        Ok(())
    }

    async fn definition(&self, name: &str) -> Result<Option<ToolDefinition>, StoreError> {
        Ok(lock(&self.defs).get(name).cloned())
    }

    async fn all_definitions(&self) -> Result<Vec<ToolDefinition>, StoreError> {
        Ok(lock(&self.defs).values().cloned().collect())
    }

    async fn visible_definitions(&self, tenant: &str) -> Result<Vec<ToolDefinition>, StoreError> {
        Ok(lock(&self.defs)
            .values()
            .filter(|d| d.visible_to(tenant))
            .cloned()
            .collect())
    }

    async fn set_status(
        &self,
        name: &str,
        status: Lifecycle,
        rejection_reason: Option<String>,
    ) -> Result<(), StoreError> {
        self.update(name, |d| {
            d.status = status;
            d.rejection_reason = rejection_reason;
        })
    }

    async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), StoreError> {
        self.update(name, |d| d.enabled = enabled)
    }

    async fn set_embedding(
        &self,
        name: &str,
        key: String,
        embedding: Vec<f32>,
    ) -> Result<(), StoreError> {
        let mut defs = lock(&self.defs);
        let def = defs
            .get_mut(name)
            .ok_or_else(|| StoreError::not_found(format!("tool `{name}`")))?;
        def.embedding = Some(embedding);
        def.embedding_key = Some(key);
        Ok(())
    }

    async fn soft_delete(&self, name: &str) -> Result<(), StoreError> {
        let now = SystemTime::now();
        self.update(name, |d| {
            d.deleted_at.get_or_insert(now);
        })
    }

    async fn definitions_version(&self) -> Result<u64, StoreError> {
        Ok(self.version.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// An in-memory [`JobStore`].
#[derive(Debug, Default)]
pub struct MemoryJobStore {
    jobs: Mutex<BTreeMap<String, ToolJob>>,
}

impl MemoryJobStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl JobStore for MemoryJobStore {
    async fn create_job(&self, job: NewJob) -> Result<ToolJob, StoreError> {
        let mut jobs = lock(&self.jobs);
        if jobs.contains_key(&job.id) {
            return Err(StoreError::conflict(format!("job `{}` exists", job.id)));
        }
        let stored = ToolJob::queued(job, SystemTime::now());
        jobs.insert(stored.id.clone(), stored.clone());
        Ok(stored)
    }

    async fn job(&self, id: &str) -> Result<Option<ToolJob>, StoreError> {
        Ok(lock(&self.jobs).get(id).cloned())
    }

    async fn transition_job(
        &self,
        id: &str,
        to: JobStatus,
        result: Option<Value>,
    ) -> Result<ToolJob, StoreError> {
        let mut jobs = lock(&self.jobs);
        let job = jobs
            .get_mut(id)
            .ok_or_else(|| StoreError::not_found(format!("job `{id}`")))?;
        job.status.check(to, id)?;
        job.status = to;
        if result.is_some() {
            job.result = result;
        }
        job.updated_at = SystemTime::now();
        Ok(job.clone())
    }

    async fn set_job_progress(&self, id: &str, pct: u8) -> Result<(), StoreError> {
        let mut jobs = lock(&self.jobs);
        let job = jobs
            .get_mut(id)
            .ok_or_else(|| StoreError::not_found(format!("job `{id}`")))?;
        job.progress_pct = pct.min(100);
        job.updated_at = SystemTime::now();
        Ok(())
    }

    async fn heartbeat_job(&self, id: &str) -> Result<bool, StoreError> {
        let mut jobs = lock(&self.jobs);
        match jobs.get_mut(id) {
            Some(job) if matches!(job.status, JobStatus::Building | JobStatus::Testing) => {
                job.updated_at = SystemTime::now();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_job(
        &self,
        id: &str,
        renewed_before: Option<SystemTime>,
        why: Value,
    ) -> Result<bool, StoreError> {
        let mut jobs = lock(&self.jobs);
        match jobs.get_mut(id) {
            Some(job)
                if matches!(job.status, JobStatus::Building | JobStatus::Testing)
                    && renewed_before.is_none_or(|t| job.updated_at < t) =>
            {
                job.status = JobStatus::Failed;
                job.result = Some(why);
                job.updated_at = SystemTime::now();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn jobs(&self, tool_name: Option<String>) -> Result<Vec<ToolJob>, StoreError> {
        let mut out: Vec<ToolJob> = lock(&self.jobs)
            .values()
            .filter(|j| tool_name.as_ref().is_none_or(|t| *t == j.tool_name))
            .cloned()
            .collect();
        out.sort_by_key(|j| std::cmp::Reverse(j.created_at));
        Ok(out)
    }

    async fn claim_job(&self, id: Option<String>) -> Result<Option<ToolJob>, StoreError> {
        let mut jobs = lock(&self.jobs);
        let claimed = jobs
            .values_mut()
            .filter(|j| j.status == JobStatus::Queued)
            .filter(|j| id.as_ref().is_none_or(|id| *id == j.id))
            .min_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(claimed.map(|job| {
            job.status = JobStatus::Building;
            job.updated_at = SystemTime::now();
            job.clone()
        }))
    }
}

/// An in-memory execution log: a [`ToolCallRecorder`] whose rows a [`CallLog`] reads back,
/// chained as the stores chain theirs.
#[derive(Default)]
pub struct MemoryCallLog {
    inner: Mutex<MemoryChain>,
}

#[derive(Default)]
struct MemoryChain {
    calls: Vec<(LoggedCall, crate::chain::ChainedRow)>,
    head: Option<crate::chain::ChainPoint>,
    checkpoints: Vec<crate::chain::ChainPoint>,
}

impl fmt::Debug for MemoryCallLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryCallLog")
            .field("calls", &lock(&self.inner).calls.len())
            .finish()
    }
}

impl MemoryCallLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Changes the stored content of the row at `seq` behind the chain's back (for tests of
    /// verification); returns whether there was one.
    pub fn tamper_with(
        &self,
        seq: u64,
        change: impl FnOnce(&mut crate::chain::LogEntry<'static>),
    ) -> bool {
        let mut inner = lock(&self.inner);
        match inner.calls.iter_mut().find(|(_, r)| r.point.seq == seq) {
            Some((_, row)) => {
                change(&mut row.entry);
                true
            }
            None => false,
        }
    }

    /// Removes the row at `seq` behind the chain's back (for tests of verification).
    pub fn remove(&self, seq: u64) {
        lock(&self.inner).calls.retain(|(_, r)| r.point.seq != seq);
    }

    /// Sets the stored head back to the row at `seq`, as if the rows after it had been
    /// appended behind Quiver's back (for tests of verification).
    pub fn rewind_head(&self, seq: u64) {
        let mut inner = lock(&self.inner);
        inner.head = inner
            .calls
            .iter()
            .find(|(_, r)| r.point.seq == seq)
            .map(|(_, r)| r.point);
    }
}

#[async_trait]
impl ToolCallRecorder for MemoryCallLog {
    async fn record(&self, record: CallRecord) {
        let mut inner = lock(&self.inner);
        let entry = crate::chain::LogEntry::of(&record);
        let head = inner.head.unwrap_or(crate::chain::ChainPoint::START);
        let point = crate::chain::extend(head, std::slice::from_ref(&entry))[0];
        let id = i64::try_from(point.seq).unwrap_or(i64::MAX);
        let row = crate::chain::ChainedRow::new(id, point, entry.into_owned());
        inner.head = Some(point);
        if point.seq.is_multiple_of(crate::chain::CHECKPOINT_EVERY) {
            inner.checkpoints.push(point);
        }
        let mut call = LoggedCall::from_record(&record);
        call.row = point.seq;
        inner.calls.push((call, row));
    }
}

#[async_trait]
impl CallLog for MemoryCallLog {
    async fn recent_calls(&self, filter: CallFilter) -> Result<Vec<LoggedCall>, StoreError> {
        let inner = lock(&self.inner);
        let mut out: Vec<LoggedCall> = inner
            .calls
            .iter()
            .rev()
            .map(|(c, _)| c)
            .filter(|c| filter.matches(c))
            .take(filter.limit)
            .cloned()
            .collect();
        if !filter.with_output {
            for c in &mut out {
                c.output = None;
            }
        }
        Ok(out)
    }

    async fn purge_calls_before(&self, cutoff: SystemTime) -> Result<u64, StoreError> {
        let mut inner = lock(&self.inner);
        let keep_from = inner
            .calls
            .iter()
            .position(|(c, _)| c.at >= cutoff)
            .unwrap_or(inner.calls.len());
        if keep_from > 0 {
            let last = inner.calls[keep_from - 1].1.point;
            inner.checkpoints.push(last);
            inner.checkpoints.sort_by_key(|c| c.seq);
            inner.checkpoints.dedup_by_key(|c| c.seq);
        }
        inner.calls.drain(..keep_from);
        Ok(keep_from as u64)
    }

    async fn chain_rows(
        &self,
        after: u64,
        since: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<crate::chain::ChainedRow>, StoreError> {
        let since = since.map(crate::chain::epoch_micros);
        Ok(lock(&self.inner)
            .calls
            .iter()
            .map(|(_, r)| r)
            .filter(|r| r.point.seq > after)
            .filter(|r| since.is_none_or(|s| r.entry.created_at_us >= s))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn chain_state(&self) -> Result<crate::chain::ChainState, StoreError> {
        let inner = lock(&self.inner);
        Ok(crate::chain::ChainState {
            head: inner.head,
            checkpoints: inner.checkpoints.clone(),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(name: &str, desc: &str) -> ToolDefinition {
        ToolDefinition::system(&ToolSpec::new(name, desc))
    }

    #[test]
    fn seeding_keeps_status_and_reports_unknown() {
        let mut old = def("a", "old").with_status(Lifecycle::Rejected);
        old.embedding = Some(vec![1.0]);
        let stored = vec![old, def("b", "b"), def("gone", "g"), def("stray", "s")];
        let plan = plan_seed(
            &stored,
            &[def("a", "new"), def("b", "b"), def("c", "c")],
            &["gone".to_owned(), "never".to_owned()],
        )
        .expect("plan");
        assert_eq!(plan.report.inserted, ["c"]);
        assert_eq!(plan.report.updated, ["a"]);
        assert_eq!(plan.report.unchanged, ["b"]);
        assert_eq!(plan.report.retired, ["gone"]);
        assert_eq!(plan.report.unknown, ["stray"]);
        assert_eq!(plan.updates[0].status, Lifecycle::Rejected);
        assert_eq!(plan.updates[0].embedding, None);
        assert!(matches!(
            plan_seed(&stored, &[def("a", "x")], &["a".to_owned()]),
            Err(StoreError::Conflict { .. })
        ));
    }

    #[test]
    fn transition_table() {
        use JobStatus::*;
        assert!(Queued.can_become(Building));
        assert!(Testing.can_become(Building));
        assert!(!Queued.can_become(Approved));
        assert!(!Approved.can_become(Queued));
        for s in [Approved, Rejected, Failed] {
            assert!(s.is_terminal());
        }
        assert!(matches!(
            Building.check(Approved, "j"),
            Err(StoreError::InvalidTransition { .. })
        ));
    }

    #[test]
    fn summary_is_cut_at_500_chars() {
        let env = Envelope::text("é".repeat(2000));
        assert_eq!(output_summary(&env).chars().count(), OUTPUT_SUMMARY_CHARS);
    }
}
