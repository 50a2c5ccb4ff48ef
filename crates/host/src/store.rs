//! The store `[store]` selects: the embedded SQLite file (`path`, the default) or a shared
//! PostgreSQL database (`url`), behind one type that implements every store port by handing
//! each call to the adapter. The host only picks; what each store does is in its crate.

use std::time::{Duration, SystemTime};

use anyhow::Context;
use async_trait::async_trait;
use quiver_contract::Lifecycle;
use quiver_registry::{
    CallRecord, ToolCallRecorder,
    store::{
        CallFilter, CallLog, DefinitionStore, JobStatus, JobStore, LoggedCall, NewJob, SeedReport,
        StoreError, ToolDefinition, ToolJob,
    },
};
use quiver_store_postgres::{PgOptions, PgStore};
use quiver_store_sqlite::{SqliteStore, StoreOptions};
use quiver_surface::ports::{
    FailedApproach, SessionStore, StoredWorkingSet, SurfaceState, ToolUsage, UsageSource,
    WorkingSetEntry,
};
use serde_json::Value;

use crate::{Config, StoreAccess};

/// The store of `[store]`: SQLite or PostgreSQL.
#[derive(Debug)]
#[non_exhaustive]
pub enum Store {
    /// `[store] path`: one SQLite file.
    Sqlite(SqliteStore),
    /// `[store] url`: a PostgreSQL database several servers share.
    Postgres(PgStore),
    /// `[store] url` naming a database with no Quiver tables yet, opened by a command that
    /// only reads: it reads as empty, as a SQLite file not created yet does.
    Uncreated {
        /// The URL, its password masked.
        location: String,
        /// The empty store the reads go to.
        empty: SqliteStore,
    },
}

/// Runs the same expression on whichever adapter `$store` holds.
macro_rules! each {
    ($store:expr, $s:ident => $e:expr) => {
        match $store {
            Store::Sqlite($s) => $e,
            Store::Postgres($s) => $e,
            Store::Uncreated { empty: $s, .. } => $e,
        }
    };
}

impl Store {
    /// Opens the store `config` names, for `access`. A PostgreSQL URL's password never
    /// appears in the errors.
    pub async fn open(config: &Config, access: StoreAccess) -> anyhow::Result<Store> {
        let read_only = matches!(access, StoreAccess::ReadOnly);
        if let Some(url) = &config.store.url {
            let mut opts = PgOptions::default()
                .with_linger(Duration::from_millis(u64::from(config.store.log_linger_ms)))
                .with_durability(config.store.durability);
            if read_only {
                opts = opts.read_only();
            }
            return match PgStore::open(url, opts).await {
                Ok(store) => Ok(Store::Postgres(store)),
                Err(StoreError::NotCreated { location, .. }) if read_only => {
                    let missing = std::env::temp_dir()
                        .join(format!("quiver-uncreated-{}", std::process::id()))
                        .join("none.db");
                    let empty = tokio::task::spawn_blocking(move || {
                        SqliteStore::open_read_only(missing, StoreOptions::default())
                    })
                    .await
                    .context("opening the store")??;
                    Ok(Store::Uncreated { location, empty })
                }
                // The store's own error names it (its password masked).
                Err(e) => Err(e).context("opening the store"),
            };
        }
        let path = &config.store.path;
        if let Some(problem) = config.store.path_problem() {
            anyhow::bail!("opening the store: {problem}");
        }
        if !read_only && let Some(problem) = config.store.missing_directory() {
            anyhow::bail!("opening the store: {problem}");
        }
        let options = StoreOptions::default()
            .with_linger(Duration::from_millis(u64::from(config.store.log_linger_ms)))
            .with_durability(config.store.durability)
            .with_busy_timeout(Duration::from_millis(config.store.busy_timeout_ms));
        let path_owned = path.clone();
        let opened = tokio::task::spawn_blocking(move || match read_only {
            false => SqliteStore::open_with(path_owned, options),
            true => SqliteStore::open_read_only(path_owned, options),
        })
        .await
        .context("opening the store")?;
        Ok(Store::Sqlite(opened.with_context(|| {
            format!("opening the store {}", path.display())
        })?))
    }

    /// Where it is, as the operator reads it: the file, or the URL with its password
    /// masked.
    pub fn location(&self) -> &str {
        match self {
            Store::Uncreated { location, .. } => location,
            _ => each!(self, s => s.location()),
        }
    }

    /// Whether it was opened read-only.
    pub fn is_read_only(&self) -> bool {
        each!(self, s => s.is_read_only())
    }

    /// Whether there is a store to read (a read-only SQLite store of a missing file reads as
    /// empty; a PostgreSQL database, once opened, exists).
    pub fn exists(&self) -> bool {
        match self {
            Store::Sqlite(s) => s.exists(),
            Store::Postgres(_) => true,
            Store::Uncreated { .. } => false,
        }
    }

    /// Why the store's file is no longer the one it writes (SQLite only; see
    /// [`SqliteStore::file_lost`]).
    pub fn file_lost(&self) -> Option<&'static str> {
        match self {
            Store::Sqlite(s) => s.file_lost(),
            Store::Postgres(_) | Store::Uncreated { .. } => None,
        }
    }

    /// The execution-log writer's counts: rows written, rows that could not be written,
    /// and whether it is failing now.
    pub fn log_writer(&self) -> (u64, u64, bool) {
        each!(self, s => {
            let w = s.writer_stats();
            (w.rows_written, w.rows_failed, w.failing)
        })
    }

    /// Bytes the embedded SQLite engine holds in this process (its page caches and
    /// statements); `None` for a store on a server.
    pub fn engine_memory(&self) -> Option<u64> {
        match self {
            Store::Sqlite(_) => Some(quiver_store_sqlite::memory_used()),
            Store::Postgres(_) | Store::Uncreated { .. } => None,
        }
    }

    /// Whether the execution log is failing now (and, while it is, a probe of the store).
    pub fn log_failing(&self) -> bool {
        each!(self, s => s.log_failing())
    }

    /// Deletes the stored state of sessions idle since `cutoff`; returns how many.
    pub async fn purge_sessions_idle_since(&self, cutoff: SystemTime) -> Result<u64, StoreError> {
        each!(self, s => s.purge_sessions_idle_since(cutoff).await)
    }

    /// Writes what is queued and closes the store.
    pub async fn close(&self) -> Result<(), StoreError> {
        each!(self, s => s.close().await)
    }
}

#[async_trait]
impl DefinitionStore for Store {
    async fn seed_system_tools(
        &self,
        tools: Vec<ToolDefinition>,
        retired: Vec<String>,
    ) -> Result<SeedReport, StoreError> {
        each!(self, s => s.seed_system_tools(tools, retired).await)
    }

    async fn put_definition(&self, def: ToolDefinition) -> Result<(), StoreError> {
        each!(self, s => s.put_definition(def).await)
    }

    async fn definition(&self, name: &str) -> Result<Option<ToolDefinition>, StoreError> {
        each!(self, s => s.definition(name).await)
    }

    async fn all_definitions(&self) -> Result<Vec<ToolDefinition>, StoreError> {
        each!(self, s => s.all_definitions().await)
    }

    async fn visible_definitions(&self, tenant: &str) -> Result<Vec<ToolDefinition>, StoreError> {
        each!(self, s => s.visible_definitions(tenant).await)
    }

    async fn set_status(
        &self,
        name: &str,
        status: Lifecycle,
        rejection_reason: Option<String>,
    ) -> Result<(), StoreError> {
        each!(self, s => s.set_status(name, status, rejection_reason).await)
    }

    async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), StoreError> {
        each!(self, s => s.set_enabled(name, enabled).await)
    }

    async fn set_embedding(
        &self,
        name: &str,
        key: String,
        embedding: Vec<f32>,
    ) -> Result<(), StoreError> {
        each!(self, s => s.set_embedding(name, key, embedding).await)
    }

    async fn soft_delete(&self, name: &str) -> Result<(), StoreError> {
        each!(self, s => s.soft_delete(name).await)
    }

    async fn definitions_version(&self) -> Result<u64, StoreError> {
        each!(self, s => s.definitions_version().await)
    }

    async fn definitions_changed(
        &self,
        seen: Option<u64>,
        wait: Duration,
    ) -> Result<u64, StoreError> {
        each!(self, s => s.definitions_changed(seen, wait).await)
    }
}

#[async_trait]
impl JobStore for Store {
    async fn create_job(&self, job: NewJob) -> Result<ToolJob, StoreError> {
        each!(self, s => s.create_job(job).await)
    }

    async fn job(&self, id: &str) -> Result<Option<ToolJob>, StoreError> {
        each!(self, s => s.job(id).await)
    }

    async fn transition_job(
        &self,
        id: &str,
        to: JobStatus,
        result: Option<Value>,
    ) -> Result<ToolJob, StoreError> {
        each!(self, s => s.transition_job(id, to, result).await)
    }

    async fn set_job_progress(&self, id: &str, pct: u8) -> Result<(), StoreError> {
        each!(self, s => s.set_job_progress(id, pct).await)
    }

    async fn heartbeat_job(&self, id: &str) -> Result<bool, StoreError> {
        each!(self, s => s.heartbeat_job(id).await)
    }

    async fn release_job(
        &self,
        id: &str,
        renewed_before: Option<SystemTime>,
        why: Value,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.release_job(id, renewed_before, why).await)
    }

    async fn jobs(&self, tool_name: Option<String>) -> Result<Vec<ToolJob>, StoreError> {
        each!(self, s => s.jobs(tool_name).await)
    }

    async fn claim_job(&self, id: Option<String>) -> Result<Option<ToolJob>, StoreError> {
        each!(self, s => s.claim_job(id).await)
    }

    async fn job_queued_since(&self, seen: Option<u64>, wait: Duration) -> Result<u64, StoreError> {
        each!(self, s => s.job_queued_since(seen, wait).await)
    }

    fn announces_jobs(&self) -> bool {
        each!(self, s => s.announces_jobs())
    }
}

#[async_trait]
impl CallLog for Store {
    async fn recent_calls(&self, filter: CallFilter) -> Result<Vec<LoggedCall>, StoreError> {
        each!(self, s => s.recent_calls(filter).await)
    }

    async fn purge_calls_before(&self, cutoff: SystemTime) -> Result<u64, StoreError> {
        each!(self, s => s.purge_calls_before(cutoff).await)
    }

    async fn chain_rows(
        &self,
        after: u64,
        since: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<quiver_registry::chain::ChainedRow>, StoreError> {
        each!(self, s => s.chain_rows(after, since, limit).await)
    }

    async fn chain_state(&self) -> Result<quiver_registry::chain::ChainState, StoreError> {
        each!(self, s => s.chain_state().await)
    }
}

#[async_trait]
impl ToolCallRecorder for Store {
    async fn record(&self, record: CallRecord) {
        each!(self, s => s.record(record).await)
    }

    async fn flush(&self) {
        each!(self, s => s.flush().await)
    }
}

#[async_trait]
impl SessionStore for Store {
    async fn working_set(&self, session: &str) -> Result<Vec<WorkingSetEntry>, StoreError> {
        each!(self, s => s.working_set(session).await)
    }

    async fn versioned_working_set(&self, session: &str) -> Result<StoredWorkingSet, StoreError> {
        each!(self, s => s.versioned_working_set(session).await)
    }

    async fn replace_working_set(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
    ) -> Result<u64, StoreError> {
        each!(self, s => s.replace_working_set(session, entries).await)
    }

    async fn replace_working_set_if(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
        expected: u64,
    ) -> Result<Option<u64>, StoreError> {
        each!(self, s => s.replace_working_set_if(session, entries, expected).await)
    }

    async fn record_failed_approach(
        &self,
        session: &str,
        args_hash: &str,
        tool: &str,
        error: &str,
    ) -> Result<u32, StoreError> {
        each!(self, s => s.record_failed_approach(session, args_hash, tool, error).await)
    }

    async fn failed_approaches(&self, session: &str) -> Result<Vec<FailedApproach>, StoreError> {
        each!(self, s => s.failed_approaches(session).await)
    }

    async fn end_session(&self, session: &str) -> Result<(), StoreError> {
        each!(self, s => s.end_session(session).await)
    }

    async fn state(&self, key: &str) -> Result<Option<SurfaceState>, StoreError> {
        each!(self, s => s.state(key).await)
    }

    async fn put_state(&self, key: &str, value: Value) -> Result<(), StoreError> {
        each!(self, s => s.put_state(key, value).await)
    }

    fn shared(&self) -> bool {
        each!(self, s => s.shared())
    }

    async fn lead(&self, role: &str) -> Result<bool, StoreError> {
        each!(self, s => s.lead(role).await)
    }
}

#[async_trait]
impl UsageSource for Store {
    async fn usage(&self, now: SystemTime) -> Result<Vec<ToolUsage>, StoreError> {
        each!(self, s => s.usage(now).await)
    }
}
