//! [`PgStore`]: the handle, its pool, and the port implementations.
//!
//! Over 800 lines: one port implementation per `impl` block, each beside the SQL it runs; the
//! `SessionStore` (working sets), schema, conversions, log writer and change listener are
//! in their own modules.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use quiver_contract::Lifecycle;
use quiver_registry::{
    CallRecord, ToolCallRecorder,
    chain::{ChainPoint, ChainState, ChainedRow},
    log_writer::QueuedRecord,
    store::{
        CallFilter, CallLog, DefinitionStore, JobStatus, JobStore, LoggedCall, NewJob, SeedReport,
        StoreError, ToolDefinition, ToolJob, plan_seed,
    },
};
use quiver_surface::ports::{ToolUsage, UsageSource};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_postgres::types::ToSql;

use crate::{
    convert::{self, DEF_COLUMNS, JOB_COLUMNS, LOG_COLUMNS, definition_params},
    error::{ResultExt, redact},
    listen,
    schema::{self, OpenReport},
    sync::lock,
    tls,
    writer::{self, Msg, Stats},
};

/// How the store runs. Every field has a default.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgOptions {
    /// Pooled connections at most (default 8), besides the change listener's and the
    /// leader's own.
    pub max_connections: usize,
    /// How long connecting, or waiting for a pooled connection, may take (default 5 s).
    pub connect_timeout: Duration,
    /// Messages the log writer's channel holds before `record` waits (default 16 384).
    pub channel_capacity: usize,
    /// Most call records copied in one batch (default 4 096).
    pub batch_max: usize,
    /// How long the writer waits for more call records before writing the ones it has
    /// (default 2 ms; zero writes at once). A record is written at most this much later
    /// (plus the write); a flush and a clean shutdown write at once. A process killed
    /// outright can lose the records of its last `linger`, unless `durability` is strict.
    pub linger: Duration,
    /// Whether a call's answer waits for its record's commit (default batched; see
    /// [`Durability`]). Strict writes rows without the linger.
    pub durability: Durability,
    /// Tries of a failing log write before its rows are counted as lost (default 5).
    pub max_write_attempts: u32,
    /// Pause before the first retry, growing linearly (default 20 ms).
    pub retry_backoff: Duration,
    /// Open for reading only: nothing is migrated, no log writer runs, and every
    /// transaction is read-only (`quiver tools`, `status`, `log`).
    pub read_only: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            max_connections: 8,
            connect_timeout: Duration::from_secs(5),
            channel_capacity: 16_384,
            batch_max: 4_096,
            linger: Duration::from_millis(2),
            durability: Durability::Batched,
            max_write_attempts: 5,
            retry_backoff: Duration::from_millis(20),
            read_only: false,
        }
    }
}

impl PgOptions {
    /// Sets how long the writer waits for more records before a write (zero: no wait).
    pub fn with_linger(mut self, d: Duration) -> Self {
        self.linger = d;
        self
    }

    /// Sets when a call's answer may leave, relative to its record's commit.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the largest batch.
    pub fn with_batch_max(mut self, n: usize) -> Self {
        self.batch_max = n.max(1);
        self
    }

    /// Sets the pool's size.
    pub fn with_max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Sets the connect timeout.
    pub fn with_connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Opens for reading only.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }
}

pub use quiver_registry::log_writer::{Durability, WriterStats};

/// The connection that holds the session-level advisory locks of the roles this process
/// leads ([`SessionStore::lead`]): the server releases them when the connection ends, so a
/// server that dies hands its roles on.
#[derive(Default)]
struct Leader {
    client: Option<tokio_postgres::Client>,
    held: BTreeSet<i64>,
}

struct Inner {
    pool: Pool,
    cfg: tokio_postgres::Config,
    tls: tls::Connector,
    location: String,
    report: OpenReport,
    read_only: bool,
    tx: mpsc::Sender<Msg>,
    durability: Durability,
    stats: Arc<Stats>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    versions: watch::Receiver<u64>,
    /// Job announcements heard (see [`listen`]).
    jobs: watch::Receiver<u64>,
    listener: tokio::task::JoinHandle<()>,
    leader: tokio::sync::Mutex<Leader>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The shared store: PostgreSQL, through a connection pool, for several `quiver serve`
/// replicas. Implements [`DefinitionStore`], [`JobStore`], [`CallLog`],
/// [`ToolCallRecorder`], [`SessionStore`](quiver_surface::ports::SessionStore) and [`UsageSource`]. Call records go to a writer
/// task that copies them in batches; a listener connection takes other servers' changes of
/// the definitions as they are made. Cheap to clone; [`PgStore::close`] writes what is
/// queued.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.inner.location)
            .field("report", &self.inner.report)
            .finish_non_exhaustive()
    }
}

const PURGE_BATCH: i64 = 1_000;

/// The advisory lock seeding takes (transaction-scoped), so that two servers starting at
/// once plan their seeding one after the other.
const SEED_LOCK: i64 = 0x5155_4956_4552_0002;

/// The advisory-lock key of a role of [`SessionStore::lead`] (FNV-1a of its name, in a
/// space of Quiver's own).
fn role_key(role: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("quiver-role:{role}").bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(h.to_ne_bytes())
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/db`), checks
    /// that it is Quiver's or empty, applies the schema migrations (unless read-only), and
    /// starts the log writer and the change listener. A wrong address, refused credentials,
    /// a missing database, another application's tables or a newer schema is an error
    /// naming the server, its password masked.
    pub async fn open(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        let location = redact(url);
        let invalid = |cause: String| StoreError::Unavailable {
            location: location.clone(),
            cause,
        };
        // The driver reads the host from after the first `@`, the mask hides up to the
        // last: a password with an `@` left as it is would be dialled at a host the
        // message does not show.
        if let Some((_, rest)) = url.split_once("://")
            && rest
                .split(['/', '?'])
                .next()
                .unwrap_or("")
                .matches('@')
                .count()
                > 1
        {
            return Err(invalid(
                "[store] url has more than one `@` before its host: a user name or password holding `@` must write it as %40 (and `:` as %3A, `/` as %2F, `#` as %23)".into(),
            ));
        }
        let (driver_url, tls_settings) =
            tls::split(url).map_err(|e| invalid(format!("[store] url: {e}")))?;
        let mut cfg: tokio_postgres::Config = driver_url.parse().map_err(|e| {
            invalid(format!(
                "[store] url is not a PostgreSQL connection URL ({e}); write it as postgres://user:password@host:5432/database"
            ))
        })?;
        let tls = tls::connector(&tls_settings, &mut cfg)
            .map_err(|e| invalid(format!("[store] url: {e}")))?;
        cfg.connect_timeout(opts.connect_timeout);
        if cfg.get_application_name().is_none() {
            cfg.application_name("quiver");
        }
        if opts.read_only {
            cfg.options("-c default_transaction_read_only=on");
        }
        let (mut client, conn) = cfg.connect(tls.clone()).await.at(&location)?;
        let driver = tokio::spawn(conn);
        let prepared = if opts.read_only {
            schema::check(&client, &location).await
        } else {
            schema::prepare(&mut client, &location).await
        };
        let version = match &prepared {
            Ok(_) => client
                .query_one("SELECT version FROM definitions_version WHERE id = 1", &[])
                .await
                .at(&location)
                .map(|r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0)),
            Err(e) => Err(e.clone()),
        };
        drop(client);
        let _ = driver.await;
        let report = prepared?;
        let version = version?;

        let manager = Manager::from_config(
            cfg.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(opts.max_connections.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(opts.connect_timeout))
            .create_timeout(Some(opts.connect_timeout))
            .build()
            .map_err(|e| StoreError::Backend {
                location: location.clone(),
                cause: format!("cannot build the connection pool: {e}"),
            })?;
        let (tx, rx) = mpsc::channel(opts.channel_capacity.max(1));
        let stats = Arc::new(Stats::default());
        let writer = if opts.read_only {
            // No writer: every record fails (the channel's receiver is gone).
            None
        } else {
            Some(tokio::spawn(writer::run(
                pool.clone(),
                rx,
                stats.clone(),
                writer::Config {
                    location: location.clone(),
                    batch_max: opts.batch_max.max(1),
                    linger: opts.linger,
                    max_attempts: opts.max_write_attempts.max(1),
                    retry_backoff: opts.retry_backoff,
                    strict: opts.durability == Durability::Strict,
                },
            )))
        };
        let (versions_tx, versions) = watch::channel(version);
        let (jobs_tx, jobs) = watch::channel(0);
        let heard = listen::Heard {
            versions: versions_tx,
            jobs: jobs_tx,
        };
        let listener = tokio::spawn(listen::run(
            cfg.clone(),
            tls.clone(),
            location.clone(),
            heard,
        ));
        tracing::debug!(%location, found = report.found_version, "opened the PostgreSQL store");
        Ok(PgStore {
            inner: Arc::new(Inner {
                pool,
                cfg,
                tls,
                location,
                report,
                read_only: opts.read_only,
                tx,
                durability: opts.durability,
                stats,
                writer: Mutex::new(writer),
                versions,
                jobs,
                listener,
                leader: Default::default(),
            }),
        })
    }

    /// What opening found and did (schema versions).
    pub fn open_report(&self) -> &OpenReport {
        &self.inner.report
    }

    /// The server's address with the password masked, as errors name it.
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// Whether this store was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// The writer's counters.
    pub fn writer_stats(&self) -> WriterStats {
        self.inner.stats.snapshot()
    }

    /// Whether the execution log is failing now. While it is, this also asks the writer (one
    /// request at a time) to try the server with a one-row write, which clears it when the
    /// write succeeds: a readiness probe that polls this sees the recovery.
    pub fn log_failing(&self) -> bool {
        let s = &self.inner.stats;
        if !s.failing.load(Ordering::Relaxed) {
            return false;
        }
        if !s.probe_queued.swap(true, Ordering::Relaxed)
            && self.inner.tx.try_send(Msg::Probe).is_err()
        {
            s.probe_queued.store(false, Ordering::Relaxed);
        }
        true
    }

    /// Deletes the stored working sets and repeat-failure counts of sessions not used since
    /// `cutoff`; returns how many sessions.
    pub async fn purge_sessions_idle_since(&self, cutoff: SystemTime) -> Result<u64, StoreError> {
        let loc = self.location();
        let mut client = self.client().await?;
        let tx = client.transaction().await.at(loc)?;
        let idle = "SELECT session FROM (
                SELECT session, max(last_used) AS at FROM session_tools GROUP BY session
                UNION ALL
                SELECT session, max(last_at) AS at FROM session_failures GROUP BY session) s
             GROUP BY session HAVING max(at) < $1";
        let rows = tx.query(idle, &[&cutoff]).await.at(loc)?;
        let sessions: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        tx.execute(
            "DELETE FROM session_tools WHERE session = ANY($1)",
            &[&sessions],
        )
        .await
        .at(loc)?;
        tx.execute(
            "DELETE FROM session_failures WHERE session = ANY($1)",
            &[&sessions],
        )
        .await
        .at(loc)?;
        // The versions of sessions left with nothing stored (a set written empty long ago,
        // too).
        tx.execute(
            "DELETE FROM session_versions v WHERE NOT EXISTS
                 (SELECT 1 FROM session_tools t WHERE t.session = v.session)
             AND NOT EXISTS (SELECT 1 FROM session_failures f WHERE f.session = v.session)",
            &[],
        )
        .await
        .at(loc)?;
        tx.commit().await.at(loc)?;
        Ok(sessions.len() as u64)
    }

    /// Writes everything queued for the log and stops the writer; releases the roles this
    /// process leads. Later records are counted as failed. Closing twice is harmless.
    pub async fn close(&self) -> Result<(), StoreError> {
        let (reply, done) = oneshot::channel();
        if self.inner.tx.send(Msg::Close(reply)).await.is_ok() {
            let _ = done.await;
        }
        let handle = lock(&self.inner.writer).take();
        if let Some(h) = handle
            && h.await.is_err()
        {
            tracing::error!(location = %self.inner.location, "the store's log writer panicked");
        }
        self.inner.leader.lock().await.client = None;
        let failed = self.inner.stats.rows_failed.load(Ordering::Relaxed);
        if failed > 0 {
            tracing::warn!(location = %self.inner.location, rows = failed, "execution-log rows were lost while this process ran");
        }
        Ok(())
    }

    fn closed(&self) -> StoreError {
        StoreError::Unavailable {
            location: self.inner.location.clone(),
            cause: if self.inner.read_only {
                "the store was opened read-only (this command changes nothing in it)".into()
            } else {
                "the store is closed".into()
            },
        }
    }

    /// A pooled connection.
    pub(crate) async fn pool_client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.client().await
    }

    /// A session-level advisory lock per role, on a connection of its own: the first server
    /// to ask gets it and keeps it while its connection lives; the others get `false` until
    /// that server goes away (its connection ends, and the server releases the lock).
    pub(crate) async fn lead_role(&self, role: &str) -> Result<bool, StoreError> {
        let key = role_key(role);
        let loc = self.location();
        let mut leader = self.inner.leader.lock().await;
        if leader.client.as_ref().is_none_or(|c| c.is_closed()) {
            leader.held.clear();
            let (client, conn) = self
                .inner
                .cfg
                .connect(self.inner.tls.clone())
                .await
                .at(loc)?;
            tokio::spawn(conn);
            leader.client = Some(client);
        }
        if leader.held.contains(&key) {
            return Ok(true);
        }
        let Some(client) = &leader.client else {
            return Ok(false);
        };
        let got: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
            .await
            .at(loc)?
            .get(0);
        if got {
            leader.held.insert(key);
        }
        Ok(got)
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.pool.get().await.at(&self.inner.location)
    }

    /// Rows of `sql` with `params`, each converted by `f`.
    pub(crate) async fn query<T>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        f: impl Fn(&tokio_postgres::Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let loc = self.location();
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.at(loc)?;
        let rows = client.query(&stmt, params).await.at(loc)?;
        rows.iter().map(f).collect()
    }

    /// The number of rows `sql` changed.
    pub(crate) async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let loc = self.location();
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.at(loc)?;
        client.execute(&stmt, params).await.at(loc)
    }
}

fn require_changed(n: u64, what: impl FnOnce() -> String) -> Result<(), StoreError> {
    if n == 0 {
        Err(StoreError::not_found(what()))
    } else {
        Ok(())
    }
}

async fn definition_in(
    c: &impl GenericClient,
    loc: &str,
    name: &str,
    lock_row: bool,
) -> Result<Option<ToolDefinition>, StoreError> {
    let sql = format!(
        "SELECT {DEF_COLUMNS} FROM tool_definitions WHERE name = $1{}",
        if lock_row { " FOR UPDATE" } else { "" }
    );
    c.query_opt(&sql, &[&name])
        .await
        .at(loc)?
        .map(|r| convert::definition(&r))
        .transpose()
}

#[async_trait]
impl DefinitionStore for PgStore {
    async fn seed_system_tools(
        &self,
        tools: Vec<ToolDefinition>,
        retired: Vec<String>,
    ) -> Result<SeedReport, StoreError> {
        let loc = self.location();
        let mut client = self.client().await?;
        let tx = client.transaction().await.at(loc)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SEED_LOCK])
            .await
            .at(loc)?;
        let stored = tx
            .query(
                &format!("SELECT {DEF_COLUMNS} FROM tool_definitions ORDER BY name"),
                &[],
            )
            .await
            .at(loc)?
            .iter()
            .map(convert::definition)
            .collect::<Result<Vec<_>, _>>()?;
        let plan = plan_seed(&stored, &tools, &retired)?;
        let now = SystemTime::now();
        let write = tx.prepare(&convert::WRITE_DEFINITION).await.at(loc)?;
        for def in plan.inserts.iter().chain(&plan.updates) {
            let params = definition_params(def, now);
            tx.execute(&write, &params.as_refs()).await.at(loc)?;
        }
        if !plan.retire.is_empty() {
            tx.execute(
                "UPDATE tool_definitions SET deleted_at = $2, updated_at = $2 WHERE name = ANY($1)",
                &[&plan.retire, &now],
            )
            .await
            .at(loc)?;
        }
        tx.commit().await.at(loc)?;
        Ok(plan.report)
    }

    async fn put_definition(&self, mut def: ToolDefinition) -> Result<(), StoreError> {
        let loc = self.location();
        let mut client = self.client().await?;
        let tx = client.transaction().await.at(loc)?;
        if let Some(old) = definition_in(&tx, loc, &def.name, true).await?
            && old.description != def.description
        {
            def.embedding = None;
            def.embedding_key = None;
        }
        def.deleted_at = None;
        let params = definition_params(&def, SystemTime::now());
        tx.execute(&*convert::WRITE_DEFINITION, &params.as_refs())
            .await
            .at(loc)?;
        tx.commit().await.at(loc)
    }

    async fn definition(&self, name: &str) -> Result<Option<ToolDefinition>, StoreError> {
        let client = self.client().await?;
        definition_in(&client, self.location(), name, false).await
    }

    async fn all_definitions(&self) -> Result<Vec<ToolDefinition>, StoreError> {
        self.query(
            &format!("SELECT {DEF_COLUMNS} FROM tool_definitions ORDER BY name"),
            &[],
            convert::definition,
        )
        .await
    }

    async fn visible_definitions(&self, tenant: &str) -> Result<Vec<ToolDefinition>, StoreError> {
        self.query(
            &format!(
                "SELECT {DEF_COLUMNS} FROM tool_definitions
                 WHERE status = 'approved' AND enabled AND category <> 'internal'
                   AND deleted_at IS NULL AND tenant_id IN ($1, '*')
                 ORDER BY name"
            ),
            &[&tenant],
            convert::definition,
        )
        .await
    }

    async fn set_status(
        &self,
        name: &str,
        status: Lifecycle,
        rejection_reason: Option<String>,
    ) -> Result<(), StoreError> {
        let n = self
            .execute(
                "UPDATE tool_definitions SET status = $2, rejection_reason = $3, updated_at = $4
                 WHERE name = $1",
                &[
                    &name,
                    &status.as_str(),
                    &rejection_reason,
                    &SystemTime::now(),
                ],
            )
            .await?;
        require_changed(n, || format!("tool `{name}`"))
    }

    async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), StoreError> {
        let n = self
            .execute(
                "UPDATE tool_definitions SET enabled = $2, updated_at = $3 WHERE name = $1",
                &[&name, &enabled, &SystemTime::now()],
            )
            .await?;
        require_changed(n, || format!("tool `{name}`"))
    }

    async fn set_embedding(
        &self,
        name: &str,
        key: String,
        embedding: Vec<f32>,
    ) -> Result<(), StoreError> {
        let n = self
            .execute(
                "UPDATE tool_definitions SET embedding = $2, embedding_key = $3 WHERE name = $1",
                &[&name, &embedding, &key],
            )
            .await?;
        require_changed(n, || format!("tool `{name}`"))
    }

    async fn soft_delete(&self, name: &str) -> Result<(), StoreError> {
        let n = self
            .execute(
                "UPDATE tool_definitions SET deleted_at = COALESCE(deleted_at, $2),
                    updated_at = $2 WHERE name = $1",
                &[&name, &SystemTime::now()],
            )
            .await?;
        require_changed(n, || format!("tool `{name}`"))
    }

    async fn definitions_version(&self) -> Result<u64, StoreError> {
        let v = self
            .query(
                "SELECT version FROM definitions_version WHERE id = 1",
                &[],
                |r| convert::col::<i64>(r, 0),
            )
            .await?;
        Ok(v.first().map_or(0, |v| u64::try_from(*v).unwrap_or(0)))
    }

    /// Waits for the listener's notification of a version other than `seen` (another
    /// server's change, or this one's), or for `wait`; the version the listener holds then.
    /// No query: the listener reads the version itself whenever it (re)connects.
    async fn definitions_changed(
        &self,
        seen: Option<u64>,
        wait: Duration,
    ) -> Result<u64, StoreError> {
        let mut versions = self.inner.versions.clone();
        let _ = tokio::time::timeout(wait, versions.wait_for(|v| Some(*v) != seen)).await;
        let v = *versions.borrow();
        Ok(v)
    }
}

async fn job_in(
    c: &impl GenericClient,
    loc: &str,
    id: &str,
    lock_row: bool,
) -> Result<Option<ToolJob>, StoreError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM tool_jobs WHERE id = $1{}",
        if lock_row { " FOR UPDATE" } else { "" }
    );
    c.query_opt(&sql, &[&id])
        .await
        .at(loc)?
        .map(|r| convert::job(&r))
        .transpose()
}

#[async_trait]
impl JobStore for PgStore {
    async fn create_job(&self, new: NewJob) -> Result<ToolJob, StoreError> {
        let j = ToolJob::queued(new, SystemTime::now());
        // The insert and its announcement in one statement: workers listening on
        // `quiver_jobs` hear of the job when it commits, and only if it was inserted.
        let n = self
            .execute(
                "WITH inserted AS (
                    INSERT INTO tool_jobs (id, tool_name, job_type, status, spec, result,
                        progress_pct, tenant, conversation, created_at, updated_at)
                    VALUES ($1, $2, $3, $4, $5, NULL, 0, $6, $7, $8, $8)
                    ON CONFLICT (id) DO NOTHING
                    RETURNING id)
                 SELECT pg_notify('quiver_jobs', id) FROM inserted",
                &[
                    &j.id,
                    &j.tool_name,
                    &j.job_type.as_str(),
                    &j.status.as_str(),
                    &j.spec,
                    &j.tenant,
                    &j.conversation,
                    &j.created_at,
                ],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::conflict(format!("job `{}` exists", j.id)));
        }
        Ok(j)
    }

    async fn job(&self, id: &str) -> Result<Option<ToolJob>, StoreError> {
        let client = self.client().await?;
        job_in(&client, self.location(), id, false).await
    }

    async fn transition_job(
        &self,
        id: &str,
        to: JobStatus,
        result: Option<Value>,
    ) -> Result<ToolJob, StoreError> {
        let loc = self.location();
        let mut client = self.client().await?;
        let tx = client.transaction().await.at(loc)?;
        let current = job_in(&tx, loc, id, true)
            .await?
            .ok_or_else(|| StoreError::not_found(format!("job `{id}`")))?;
        current.status.check(to, id)?;
        let row = tx
            .query_one(
                &format!(
                    "UPDATE tool_jobs SET status = $2, result = COALESCE($3, result), updated_at = $4
                     WHERE id = $1 RETURNING {JOB_COLUMNS}"
                ),
                &[&id, &to.as_str(), &result, &SystemTime::now()],
            )
            .await
            .at(loc)?;
        let job = convert::job(&row)?;
        tx.commit().await.at(loc)?;
        Ok(job)
    }

    async fn set_job_progress(&self, id: &str, pct: u8) -> Result<(), StoreError> {
        let n = self
            .execute(
                "UPDATE tool_jobs SET progress_pct = $2, updated_at = $3 WHERE id = $1",
                &[&id, &i16::from(pct.min(100)), &SystemTime::now()],
            )
            .await?;
        require_changed(n, || format!("job `{id}`"))
    }

    async fn heartbeat_job(&self, id: &str) -> Result<bool, StoreError> {
        let n = self
            .execute(
                "UPDATE tool_jobs SET updated_at = $2
                 WHERE id = $1 AND status IN ('building', 'testing')",
                &[&id, &SystemTime::now()],
            )
            .await?;
        Ok(n == 1)
    }

    async fn release_job(
        &self,
        id: &str,
        renewed_before: Option<SystemTime>,
        why: Value,
    ) -> Result<bool, StoreError> {
        let n = self
            .execute(
                "UPDATE tool_jobs SET status = 'failed', result = $2, updated_at = $3
                 WHERE id = $1 AND status IN ('building', 'testing')
                   AND ($4::timestamptz IS NULL OR updated_at < $4)",
                &[&id, &why, &SystemTime::now(), &renewed_before],
            )
            .await?;
        Ok(n == 1)
    }

    async fn jobs(&self, tool_name: Option<String>) -> Result<Vec<ToolJob>, StoreError> {
        self.query(
            &format!(
                "SELECT {JOB_COLUMNS} FROM tool_jobs WHERE ($1::text IS NULL OR tool_name = $1)
                 ORDER BY created_at DESC, id DESC"
            ),
            &[&tool_name],
            convert::job,
        )
        .await
    }

    /// One statement: the oldest queued job (or the one named) is locked with `SKIP
    /// LOCKED`, so a job another server is claiming this moment is passed over rather than
    /// waited for, and moved to `building`.
    async fn claim_job(&self, id: Option<String>) -> Result<Option<ToolJob>, StoreError> {
        let rows = self
            .query(
                &format!(
                    "UPDATE tool_jobs SET status = 'building', updated_at = $2
                     WHERE status = 'queued' AND id = (
                         SELECT id FROM tool_jobs
                         WHERE status = 'queued' AND ($1::text IS NULL OR id = $1)
                         ORDER BY created_at, id LIMIT 1
                         FOR UPDATE SKIP LOCKED)
                     RETURNING {JOB_COLUMNS}"
                ),
                &[&id, &SystemTime::now()],
                convert::job,
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn job_queued_since(&self, seen: Option<u64>, wait: Duration) -> Result<u64, StoreError> {
        let mut jobs = self.inner.jobs.clone();
        let _ = tokio::time::timeout(wait, jobs.wait_for(|n| Some(*n) != seen)).await;
        let n = *jobs.borrow();
        Ok(n)
    }

    fn announces_jobs(&self) -> bool {
        true
    }
}

#[async_trait]
impl ToolCallRecorder for PgStore {
    async fn record(&self, record: CallRecord) {
        let (queued, committed) = QueuedRecord::new(record, self.inner.durability);
        if self.inner.tx.send(Msg::Record(queued)).await.is_err() {
            let why = self.closed();
            tracing::error!(location = %self.inner.location, error = %why, "a call record could not be queued; it is lost");
            self.inner.stats.failed(1, why);
            return;
        }
        // Strict: the answer waits for the commit (or for the row to be given up, counted
        // and logged by the writer).
        if let Some(committed) = committed {
            let _ = committed.await;
        }
    }

    async fn flush(&self) {
        let (reply, done) = oneshot::channel();
        if self.inner.tx.send(Msg::Flush(reply)).await.is_ok() {
            let _ = done.await;
        }
    }
}

/// The query of [`CallLog::recent_calls`]: the filters given (tool, session, kind), and
/// only those, so that the server walks the session's or the tool's index.
fn recent_calls_sql(filter: &CallFilter) -> String {
    let mut clauses: Vec<String> = Vec::new();
    let mut n = 0;
    for (given, column) in [
        (filter.tool.is_some(), "tool_name"),
        (filter.session.is_some(), "session"),
        (filter.kind.is_some(), "kind"),
        (filter.principal.is_some(), "principal"),
        (filter.call_id.is_some(), "call_id"),
        (filter.parent.is_some(), "parent_call_id"),
    ] {
        if given {
            n += 1;
            clauses.push(format!("{column} = ${n}"));
        }
    }
    // A cursor `(time, row)`: the time's index range, then the row within its last
    // microsecond.
    for (given, row, op) in [
        (filter.before.is_some(), filter.before_row.is_some(), "<"),
        (filter.after.is_some(), filter.after_row.is_some(), ">"),
    ] {
        if given {
            n += 1;
            if row {
                clauses.push(format!(
                    "created_at {op}= ${n} AND (created_at {op} ${n} OR id {op} ${})",
                    n + 1
                ));
                n += 1;
            } else {
                clauses.push(format!("created_at {op} ${n}"));
            }
        }
    }
    let filters = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let output = if filter.with_output {
        "output"
    } else {
        "NULL::json"
    };
    format!(
        "SELECT {LOG_COLUMNS}, id, {output} FROM execution_log {filters}
         ORDER BY created_at DESC, id DESC LIMIT ${}",
        n + 1
    )
}

#[async_trait]
impl CallLog for PgStore {
    async fn recent_calls(&self, filter: CallFilter) -> Result<Vec<LoggedCall>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
        for v in [
            &filter.tool,
            &filter.session,
            &filter.kind,
            &filter.principal,
            &filter.call_id,
            &filter.parent,
        ]
        .into_iter()
        .flatten()
        {
            params.push(v);
        }
        let before_row = filter
            .before_row
            .map(|r| i64::try_from(r).unwrap_or(i64::MAX));
        let after_row = filter
            .after_row
            .map(|r| i64::try_from(r).unwrap_or(i64::MAX));
        for (t, row) in [(&filter.before, &before_row), (&filter.after, &after_row)] {
            if let Some(t) = t {
                params.push(t);
                if let Some(row) = row {
                    params.push(row);
                }
            }
        }
        params.push(&limit);
        self.query(&recent_calls_sql(&filter), &params, convert::logged_call)
            .await
    }

    async fn purge_calls_before(&self, cutoff: SystemTime) -> Result<u64, StoreError> {
        let loc = self.location().to_owned();
        let mut total = 0u64;
        loop {
            // One small transaction per batch, so that writers are never held up long.
            let mut client = self.client().await?;
            let tx = client.transaction().await.at(&loc)?;
            // Chained rows from the start of the chain, up to the first one dispatched at or
            // after the cutoff; the last one deleted becomes the checkpoint that anchors
            // the rest.
            let chained = tx
                .query(
                    "WITH head AS (
                         SELECT id, chain_seq, chain_link, created_at FROM execution_log
                         WHERE chain_seq IS NOT NULL ORDER BY chain_seq LIMIT $2),
                     stop AS (SELECT min(chain_seq) AS seq FROM head WHERE created_at >= $1)
                     DELETE FROM execution_log WHERE id IN (
                         SELECT id FROM head, stop WHERE stop.seq IS NULL OR head.chain_seq < stop.seq)
                     RETURNING chain_seq, chain_link",
                    &[&cutoff, &PURGE_BATCH],
                )
                .await
                .at(&loc)?;
            let last = chained
                .iter()
                .map(|r| (r.get::<_, i64>(0), r.get::<_, Vec<u8>>(1)))
                .max_by_key(|(seq, _)| *seq);
            if let Some((seq, link)) = &last {
                tx.execute(
                    "INSERT INTO log_checkpoints (seq, link) VALUES ($1, $2)
                     ON CONFLICT (seq) DO UPDATE SET link = excluded.link",
                    &[seq, link],
                )
                .await
                .at(&loc)?;
                // Checkpoints below the anchor check rows that are gone.
                tx.execute("DELETE FROM log_checkpoints WHERE seq < $1", &[seq])
                    .await
                    .at(&loc)?;
            }
            // Rows older than the chain, by time.
            let older = tx
                .execute(
                    "DELETE FROM execution_log WHERE id IN (
                         SELECT id FROM execution_log WHERE chain_seq IS NULL AND created_at < $1
                         ORDER BY created_at LIMIT $2)",
                    &[&cutoff, &PURGE_BATCH],
                )
                .await
                .at(&loc)?;
            tx.commit().await.at(&loc)?;
            let n = chained.len() as u64 + older;
            total += n;
            if chained.len() < PURGE_BATCH as usize && older < PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    async fn chain_rows(
        &self,
        after: u64,
        since: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<ChainedRow>, StoreError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let since = since.unwrap_or(SystemTime::UNIX_EPOCH);
        self.query(
            &format!(
                "SELECT {} FROM execution_log
                 WHERE chain_seq > $1 AND created_at >= $2
                 ORDER BY chain_seq LIMIT $3",
                convert::CHAIN_COLUMNS
            ),
            &[&after, &since, &limit],
            convert::chained_row,
        )
        .await
    }

    async fn chain_state(&self) -> Result<ChainState, StoreError> {
        let point = |r: &tokio_postgres::Row| -> Result<ChainPoint, StoreError> {
            Ok(ChainPoint {
                seq: u64::try_from(convert::col::<i64>(r, 0)?).unwrap_or(0),
                link: quiver_registry::chain::link_from_bytes(&convert::col::<Vec<u8>>(r, 1)?)?,
            })
        };
        let head = self
            .query(
                "SELECT seq, link, start_id FROM log_chain WHERE id = 1",
                &[],
                |r| Ok((point(r)?, convert::col::<i64>(r, 2)?)),
            )
            .await?;
        let Some((head, start)) = head.into_iter().next() else {
            return Err(StoreError::invalid_data(
                "the chain's head row is missing (removed behind Quiver's back)",
            ));
        };
        let mut state = ChainState::default();
        state.head = Some(head);
        state.checkpoints = self
            .query(
                "SELECT seq, link FROM log_checkpoints ORDER BY seq",
                &[],
                point,
            )
            .await?;
        let counts = self
            .query(
                "SELECT count(*) FILTER (WHERE id < $1), count(*) FILTER (WHERE id >= $1)
                 FROM execution_log WHERE chain_seq IS NULL",
                &[&start],
                |r| Ok((convert::col::<i64>(r, 0)?, convert::col::<i64>(r, 1)?)),
            )
            .await?;
        if let Some((older, unchained)) = counts.first() {
            state.older_rows = u64::try_from(*older).unwrap_or(0);
            state.unchained_count = u64::try_from(*unchained).unwrap_or(0);
        }
        state.unchained = self
            .query(
                "SELECT id FROM execution_log WHERE chain_seq IS NULL AND id >= $1
                 ORDER BY id LIMIT 10",
                &[&start],
                |r| convert::col::<i64>(r, 0),
            )
            .await?;
        Ok(state)
    }
}

#[async_trait]
impl UsageSource for PgStore {
    async fn usage(&self, now: SystemTime) -> Result<Vec<ToolUsage>, StoreError> {
        let [b30, b90] =
            ToolUsage::BUCKETS.map(|age| now.checked_sub(age).unwrap_or(std::time::UNIX_EPOCH));
        // Calls that answered (Ok or a Hint), as the SQLite store counts them: not errors,
        // and not the dispatcher's refusal of bad arguments (a schema hint the tool never
        // saw, `quiver_registry::refused_before_running`).
        self.query(
            "SELECT tool_name,
                count(*) FILTER (WHERE created_at >= $1),
                count(*) FILTER (WHERE created_at < $1 AND created_at >= $2),
                count(*) FILTER (WHERE created_at < $2)
             FROM execution_log
             WHERE err_kind IS NULL
               AND NOT COALESCE(
                   hint_kind = 'schema'
                   AND left(error, length($3) + length(tool_name) + 1) = $3 || tool_name || '`',
                   false)
             GROUP BY tool_name ORDER BY tool_name",
            &[&b30, &b90, &quiver_registry::REFUSED_ARGUMENTS],
            |r| {
                let n = |i| convert::col::<i64>(r, i).map(|v| u64::try_from(v).unwrap_or(0));
                Ok(ToolUsage::new(
                    convert::col::<String>(r, 0)?,
                    n(1)?,
                    n(2)?,
                    n(3)?,
                ))
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_calls_filter_only_on_what_is_given() {
        let sql = recent_calls_sql(&CallFilter::recent(5).session("s").kind("ok"));
        assert!(sql.contains("WHERE session = $1 AND kind = $2"), "{sql}");
        assert!(sql.contains("LIMIT $3"), "{sql}");
        assert!(sql.contains("NULL::json"), "{sql}");
        let sql = recent_calls_sql(&CallFilter::recent(5).with_output());
        assert!(!sql.contains("WHERE"), "{sql}");
        assert!(sql.contains("LIMIT $1"), "{sql}");
    }

    #[test]
    fn role_keys_differ_by_role() {
        assert_ne!(role_key("floor"), role_key("jobs"));
        assert_eq!(role_key("floor"), role_key("floor"));
    }
}
