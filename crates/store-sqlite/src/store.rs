//! [`SqliteStore`]: the handle, its reader pool, and the port implementations.
//!
//! Over 800 lines: one port implementation per `impl` block, each beside the SQL it runs; the
//! `SessionStore` (working sets), schema, conversions and writer thread are in their own
//! modules.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, atomic::Ordering},
    thread::JoinHandle,
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use quiver_contract::Lifecycle;
use quiver_registry::{
    CallRecord, ToolCallRecorder,
    chain::{ChainState, ChainedRow},
    log_writer::QueuedRecord,
    store::{
        CallFilter, CallLog, DefinitionStore, JobStatus, JobStore, LoggedCall, NewJob, SeedReport,
        StoreError, ToolDefinition, ToolJob, plan_seed,
    },
};
use quiver_surface::ports::{FailedApproach, ToolUsage, UsageSource, WorkingSetEntry};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::{
    convert::{self, DEF_COLUMNS, JOB_COLUMNS, LOG_COLUMNS, micros, time},
    error::ResultExt,
    schema::{self, Access, OpenReport},
    sync::lock,
    writer::{self, Msg, Stats},
};

/// How the store runs. Every field has a default.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Messages the writer's channel holds before `record` waits (default 16 384).
    pub channel_capacity: usize,
    /// Most call records committed in one transaction (default 4 096).
    pub batch_max: usize,
    /// How long the writer waits for more call records before committing the ones it has
    /// (default 2 ms; zero commits at once). A transaction per call, and a wake-up of the
    /// writer thread per call, cost more CPU than a fast call itself on a small machine;
    /// with a linger, calls share a commit, and while records keep coming the writer is not
    /// woken for each (it polls every `linger`, and parks only after a quiet one). A record
    /// is committed at most this much later (plus the commit); a flush, any other write and
    /// a clean shutdown commit at once. A process killed outright can lose the records of
    /// its last `linger`, unless `durability` is strict.
    pub linger: Duration,
    /// Whether a call's answer waits for its record's commit (default batched; see
    /// [`Durability`]). Strict commits rows without the linger.
    pub durability: Durability,
    /// How long a connection waits on a lock before giving up (default 5 s; at most
    /// `i32::MAX` ms, about 24.8 days, what SQLite takes: a longer one is taken as that).
    pub busy_timeout: Duration,
    /// Tries of a failing log write before its rows are counted as lost (default 5).
    pub max_write_attempts: u32,
    /// Pause before the first retry, growing linearly (default 20 ms).
    pub retry_backoff: Duration,
    /// Idle reader connections kept (default 4).
    pub readers: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            channel_capacity: 16_384,
            batch_max: 4_096,
            linger: Duration::from_millis(2),
            durability: Durability::Batched,
            busy_timeout: Duration::from_secs(5),
            max_write_attempts: 5,
            retry_backoff: Duration::from_millis(20),
            readers: 4,
        }
    }
}

impl StoreOptions {
    /// Sets the busy timeout.
    pub fn with_busy_timeout(mut self, t: Duration) -> Self {
        self.busy_timeout = t;
        self
    }

    /// Sets the channel capacity.
    pub fn with_channel_capacity(mut self, n: usize) -> Self {
        self.channel_capacity = n.max(1);
        self
    }

    /// Sets how long the writer waits for more records before a commit (zero: no wait).
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
}

pub use quiver_registry::log_writer::{Durability, WriterStats};

struct Readers {
    /// `None`: a read-only store whose file does not exist yet, read as an empty store
    /// (each connection an in-memory database with the schema, nothing on disk).
    path: Option<PathBuf>,
    /// How each reader connection opens the file.
    access: Access,
    location: String,
    busy_timeout: Duration,
    keep: usize,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    fn with<R>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let conn = lock(&self.idle).pop();
        let conn = match conn {
            Some(c) => c,
            None => match &self.path {
                Some(path) => {
                    schema::connect(path, &self.location, self.busy_timeout, self.access)?
                }
                None => schema::empty(&self.location)?,
            },
        };
        let out = f(&conn);
        let mut idle = lock(&self.idle);
        if idle.len() < self.keep {
            idle.push(conn);
        }
        out
    }
}

struct Writer(Mutex<Option<JoinHandle<()>>>);

impl Drop for Writer {
    fn drop(&mut self) {
        let handle = lock(&self.0).take();
        if let Some(h) = handle
            && h.join().is_err()
        {
            tracing::error!("the store's writer thread panicked");
        }
    }
}

// Field order matters: dropping `tx` first ends the writer's loop, then `writer` joins it.
struct Inner {
    tx: mpsc::Sender<Msg>,
    durability: Durability,
    readers: Arc<Readers>,
    stats: Arc<Stats>,
    location: String,
    report: OpenReport,
    writer: Writer,
    /// The file the writer opened, as (path, device, inode): one deleted or replaced under
    /// a running store takes every later row with it, silently (see
    /// [`SqliteStore::file_lost`]).
    file: Option<(PathBuf, u64, u64)>,
    /// Whether [`SqliteStore::file_lost`] has warned.
    warned_lost: std::sync::atomic::AtomicBool,
}

impl Inner {
    /// Opened by [`SqliteStore::open_read_only`]: there is no writer.
    fn read_only(&self) -> bool {
        self.readers.access == Access::ReadOnly
    }
}

/// The embedded store: one SQLite file in WAL mode, one writer thread fed by a bounded
/// channel, and a small pool of reader connections. Implements [`DefinitionStore`],
/// [`JobStore`], [`CallLog`], [`ToolCallRecorder`], [`SessionStore`](quiver_surface::ports::SessionStore) and [`UsageSource`].
/// Cheap to clone; the last clone dropped (or [`SqliteStore::close`]) flushes the log, marks a
/// clean shutdown and joins the writer.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("location", &self.inner.location)
            .field("report", &self.inner.report)
            .finish_non_exhaustive()
    }
}

pub(crate) const PURGE_BATCH: i64 = 1_000;

/// Reads the tool definitions of the store at `path` without changing it: no migration,
/// no crash-check marker, no writer (what `quiver check --against` compares with). A file
/// that is missing, not a Quiver store, or of a newer schema is an error naming it.
/// Blocking.
pub fn read_definitions(path: impl AsRef<Path>) -> Result<Vec<ToolDefinition>, StoreError> {
    let (conn, location, version) = match open_for_reading(path.as_ref())? {
        Some(reading) => reading,
        None => empty_store()?,
    };
    all_definitions(&conn, &location, version)
}

/// Reads the execution log of the store at `path` as [`CallLog::recent_calls`] does, without
/// changing it or creating it (what `quiver log` shows, even from a file it may only read).
/// A file that is missing, not a Quiver store, or of a newer schema is an error naming it.
/// Blocking.
pub fn read_calls(
    path: impl AsRef<Path>,
    filter: CallFilter,
) -> Result<Vec<LoggedCall>, StoreError> {
    let (conn, location, found) = match open_for_reading(path.as_ref())? {
        Some(reading) => reading,
        None => empty_store()?,
    };
    recent_calls_in(&conn, &location, &filter, found)
}

/// Every session's stored state in the store at `path`, read without changing it (what
/// `quiver store migrate` copies): each working-set entry and each failed approach, with
/// its session, ordered by session. Blocking.
pub fn read_sessions(path: impl AsRef<Path>) -> Result<SessionRows, StoreError> {
    let Some((conn, location, _)) = open_for_reading(path.as_ref())? else {
        return Ok(SessionRows::default());
    };
    let working = query(
        &conn,
        &location,
        "SELECT session, tool, last_used, round FROM session_tools ORDER BY session, tool",
        [],
        |r| {
            let text = |i| {
                r.get::<_, String>(i)
                    .map_err(|e| StoreError::invalid_data(e.to_string()))
            };
            let int = |i| {
                r.get::<_, i64>(i)
                    .map_err(|e| StoreError::invalid_data(e.to_string()))
            };
            Ok((
                text(0)?,
                WorkingSetEntry::new(text(1)?, time(int(2)?), u64::try_from(int(3)?).unwrap_or(0)),
            ))
        },
    )?;
    let failures = query(
        &conn,
        &location,
        "SELECT session, args_hash, tool, error, count, last_at FROM session_failures
         ORDER BY session, args_hash",
        [],
        |r| {
            let text = |i| {
                r.get::<_, String>(i)
                    .map_err(|e| StoreError::invalid_data(e.to_string()))
            };
            let int = |i| {
                r.get::<_, i64>(i)
                    .map_err(|e| StoreError::invalid_data(e.to_string()))
            };
            Ok((
                text(0)?,
                FailedApproach::new(
                    text(1)?,
                    text(2)?,
                    text(3)?,
                    u32::try_from(int(4)?).unwrap_or(u32::MAX),
                    time(int(5)?),
                ),
            ))
        },
    )?;
    Ok(SessionRows { working, failures })
}

/// What [`read_sessions`] reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionRows {
    /// Working-set entries, each with its session.
    pub working: Vec<(String, WorkingSetEntry)>,
    /// Failed approaches, each with its session.
    pub failures: Vec<(String, FailedApproach)>,
}

/// How long a reader waits for the schema of a database that has nothing in it yet.
const CREATION_WAIT: Duration = Duration::from_secs(2);

/// What [`open_for_reading`] gives: a query-only connection, the location, the version.
type Reading = (rusqlite::Connection, String, u32);

/// A query-only connection to an existing Quiver store, its location and schema version;
/// `None` for a database file with nothing in it (a store another process began to create
/// and left before its schema was in, when it exited at once: it reads as empty, as a
/// missing file does, rather than as "not a Quiver store").
fn open_for_reading(path: &Path) -> Result<Option<Reading>, StoreError> {
    let location = path.display().to_string();
    if !path.exists() {
        return Err(StoreError::Unavailable {
            location,
            cause: "no such database".into(),
        });
    }
    let conn = schema::connect(path, &location, Duration::from_secs(5), Access::ReadOnly)?;
    let version = || -> Result<u32, StoreError> {
        conn.query_row("PRAGMA user_version", [], |r| r.get(0))
            .at(&location)
    };
    let mut found = version()?;
    // A database with nothing in it yet is, most likely, a store another Quiver process is
    // creating this moment (`quiver status` beside a first `quiver call`): its schema is
    // waited for, briefly, rather than the file taken for something else.
    let deadline = std::time::Instant::now() + CREATION_WAIT;
    let objects = || -> Result<i64, StoreError> {
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .at(&location)
    };
    while found == 0 && std::time::Instant::now() < deadline {
        if objects()? > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        found = version()?;
    }
    if found == 0 && objects()? == 0 {
        return Ok(None);
    }
    if found == 0 {
        return Err(StoreError::Unavailable {
            location,
            cause: "not a Quiver store (no schema)".into(),
        });
    }
    if found > schema::SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            location,
            found,
            supported: schema::SCHEMA_VERSION,
        });
    }
    Ok(Some((conn, location, found)))
}

/// [`open_for_reading`]'s empty store: the whole schema in memory, nothing in it.
fn empty_store() -> Result<Reading, StoreError> {
    let location = ":memory:".to_owned();
    let conn = schema::empty(&location)?;
    Ok((conn, location, schema::SCHEMA_VERSION))
}

/// Opens the writer connection and prepares the database. While another process sets up
/// the same new file, some steps (switching to WAL, its recovery) answer "locked" at once
/// instead of waiting in the busy handler: those are retried until `busy_timeout`.
fn open_writer(
    path: &Path,
    location: &str,
    busy_timeout: Duration,
) -> Result<(rusqlite::Connection, schema::Holders, schema::OpenReport), StoreError> {
    let deadline = std::time::Instant::now() + schema::busy_limit(busy_timeout);
    let mut pause = Duration::from_millis(5);
    loop {
        let attempt = (|| {
            let mut conn = schema::connect(path, location, busy_timeout, Access::Write)?;
            let (mut holders, alone) = schema::Holders::join(path, location)?;
            let report = schema::prepare(&mut conn, location, &holders, alone)?;
            holders.share(location);
            Ok((conn, holders, report))
        })();
        match attempt {
            Err(StoreError::Unavailable { cause, .. })
                if cause.starts_with(crate::error::LOCKED)
                    && std::time::Instant::now() + pause < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

impl SqliteStore {
    /// Opens the store at `path` for reading only, as a command that only shows what is
    /// stored needs it (`quiver tools`, `status`, `check`): nothing is created, migrated or
    /// marked, and no writer thread runs. A missing file reads as an empty store and stays
    /// missing; a file that is not a Quiver store, or of a newer schema, is an error naming
    /// it. Every write fails with [`StoreError::Unavailable`] ("opened read-only"), and a
    /// call record is counted as failed. Blocking, like [`SqliteStore::open_with`].
    pub fn open_read_only(
        path: impl AsRef<Path>,
        opts: StoreOptions,
    ) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref();
        let location = path.display().to_string();
        let opened = if path.exists() {
            open_for_reading(path)?
        } else {
            None
        };
        let (first, found, path) = match opened {
            Some((conn, _, found)) => (conn, found, Some(path.to_path_buf())),
            None => (schema::empty(&location)?, 0, None),
        };
        // No receiver: every message to the writer fails, as after `close`.
        let (tx, _) = mpsc::channel(1);
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                tx,
                durability: opts.durability,
                readers: Arc::new(Readers {
                    path,
                    access: Access::ReadOnly,
                    location: location.clone(),
                    busy_timeout: opts.busy_timeout,
                    keep: opts.readers.max(1),
                    idle: Mutex::new(vec![first]),
                }),
                stats: Arc::new(Stats::default()),
                location,
                report: OpenReport {
                    found_version: found,
                    schema_version: schema::SCHEMA_VERSION,
                    crash_check: schema::CrashCheck::NotRun,
                },
                writer: Writer(Mutex::new(None)),
                file: None,
                warned_lost: Default::default(),
            }),
        })
    }

    /// Whether this store was opened by [`SqliteStore::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only()
    }

    /// Whether the store's file exists (a read-only store of a missing file reads as empty).
    pub fn exists(&self) -> bool {
        self.inner.readers.path.is_some()
    }

    /// Opens (creating if needed) the store at `path` with default options. See
    /// [`SqliteStore::open_with`].
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        Self::open_with(path, StoreOptions::default())
    }

    /// Opens (creating if needed) the store at `path`: switches to WAL, runs the crash check
    /// if the last shutdown was not clean (`PRAGMA integrity_check`), applies the schema
    /// migrations, and starts the writer thread. A newer schema, a damaged or non-SQLite
    /// file, a read-only place, or a lock held too long is an error naming the path. Blocking:
    /// call it from `spawn_blocking` (or before the runtime) when in async code.
    pub fn open_with(
        path: impl AsRef<Path>,
        opts: StoreOptions,
    ) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let location = path.display().to_string();
        let (conn, holders, report) = open_writer(&path, &location, opts.busy_timeout)?;
        let (tx, rx) = mpsc::channel(opts.channel_capacity.max(1));
        let stats = Arc::new(Stats::default());
        let cfg = writer::Config {
            location: location.clone(),
            batch_max: opts.batch_max.max(1),
            linger: opts.linger,
            max_attempts: opts.max_write_attempts.max(1),
            retry_backoff: opts.retry_backoff,
            strict: opts.durability == Durability::Strict,
        };
        let thread_stats = stats.clone();
        let handle = std::thread::Builder::new()
            .name("quiver-store-writer".into())
            .spawn(move || writer::run(conn, rx, thread_stats, cfg, holders))
            .map_err(|e| StoreError::Unavailable {
                location: location.clone(),
                cause: format!("cannot start the writer thread: {e}"),
            })?;
        let file = file_id(&path).map(|(dev, ino)| (path.clone(), dev, ino));
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                tx,
                durability: opts.durability,
                readers: Arc::new(Readers {
                    path: Some(path),
                    access: Access::Read,
                    location: location.clone(),
                    busy_timeout: opts.busy_timeout,
                    keep: opts.readers,
                    idle: Mutex::new(Vec::new()),
                }),
                stats,
                location,
                report,
                writer: Writer(Mutex::new(Some(handle))),
                file,
                warned_lost: Default::default(),
            }),
        })
    }

    /// What opening found and did (schema versions, the crash check).
    pub fn open_report(&self) -> &OpenReport {
        &self.inner.report
    }

    /// One page of the whole execution log in row order, for copying it out in bounded
    /// memory (`quiver store migrate`): up to `limit` rows after row `after_row` (0 for the
    /// first page), with their full outputs, rows older than the hash chain included. The
    /// next page starts after the last row's [`LoggedCall::row`]; an empty page is the end.
    pub async fn calls_page(
        &self,
        after_row: u64,
        limit: usize,
    ) -> Result<Vec<LoggedCall>, StoreError> {
        let version = self.read_version();
        let after = i64::try_from(after_row).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        self.read(move |c, loc| {
            let sql = older_columns(
                &format!(
                    "SELECT {LOG_COLUMNS}, l.id, o.output
                     FROM execution_log l LEFT JOIN execution_output o ON o.log_id = l.id
                     WHERE l.id > ?1 ORDER BY l.id LIMIT ?2"
                ),
                version,
            );
            query(
                c,
                loc,
                &sql,
                rusqlite::params![after, limit],
                convert::logged_call,
            )
        })
        .await
    }

    /// Why the store's file is no longer the one it writes, if it is not: deleted (or
    /// renamed) or replaced by another file at its path since the store opened it. Its rows
    /// then go to a file nobody can open, so a readiness check should fail. The words name no
    /// path (a probe may be unauthenticated); the operator log gets a warning with it, once.
    /// Cheap: one `stat`.
    pub fn file_lost(&self) -> Option<&'static str> {
        let (path, dev, ino) = self.inner.file.as_ref()?;
        let why = match file_id(path) {
            None => {
                "the store file was deleted or moved while in use: calls are no longer audited where `quiver log` reads; restart Quiver"
            }
            Some(id) if id != (*dev, *ino) => {
                "the store file was replaced by another file while in use: calls are no longer audited there; restart Quiver"
            }
            Some(_) => return None,
        };
        if !self.inner.warned_lost.swap(true, Ordering::Relaxed) {
            tracing::warn!(store = %self.inner.location, "{why}");
        }
        Some(why)
    }

    /// The database path, as errors name it.
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// The writer's counters.
    pub fn writer_stats(&self) -> WriterStats {
        self.inner.stats.snapshot()
    }

    /// Whether the execution log is failing now ([`WriterStats::failing`]). While it is, this
    /// also asks the writer (one request at a time) to try the database with a one-row
    /// write, which clears it when the write succeeds: a readiness probe that polls this sees
    /// the recovery even when no calls come meanwhile.
    pub fn log_failing(&self) -> bool {
        let s = &self.inner.stats;
        if !s.failing.load(Ordering::Relaxed) {
            return false;
        }
        if !s.probe_queued.swap(true, Ordering::Relaxed)
            && self.inner.tx.try_send(Msg::Probe).is_err()
        {
            // Full or closed: the next call asks again.
            s.probe_queued.store(false, Ordering::Relaxed);
        }
        true
    }

    /// Deletes the stored working sets and repeat-failure counts of sessions not used since
    /// `cutoff` (log retention applies to session state too); returns how many sessions.
    pub async fn purge_sessions_idle_since(&self, cutoff: SystemTime) -> Result<u64, StoreError> {
        let cutoff = micros(cutoff);
        self.write(move |tx, loc| {
            let idle = "SELECT session FROM (
                    SELECT session, max(last_used) AS at FROM session_tools GROUP BY session
                    UNION ALL
                    SELECT session, max(last_at) AS at FROM session_failures GROUP BY session)
                 GROUP BY session HAVING max(at) < ?1";
            let n = tx
                .query_row(&format!("SELECT count(*) FROM ({idle})"), [cutoff], |r| {
                    r.get::<_, i64>(0)
                })
                .at(loc)?;
            tx.execute(
                &format!("DELETE FROM session_tools WHERE session IN ({idle})"),
                [cutoff],
            )
            .at(loc)?;
            tx.execute(
                &format!("DELETE FROM session_failures WHERE session IN ({idle})"),
                [cutoff],
            )
            .at(loc)?;
            // The versions of sessions left with nothing stored (a set written empty long
            // ago, too).
            tx.execute(
                "DELETE FROM session_versions WHERE session NOT IN (SELECT session FROM session_tools)
                 AND session NOT IN (SELECT session FROM session_failures)",
                [],
            )
            .at(loc)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    /// Commits everything queued, marks a clean shutdown and stops the writer (joining its
    /// thread). Later writes fail with [`StoreError::Unavailable`]; later records are counted
    /// as failed. Closing twice is harmless.
    pub async fn close(&self) -> Result<(), StoreError> {
        let (reply, done) = oneshot::channel();
        let result = if self.inner.tx.send(Msg::Close(reply)).await.is_ok() {
            done.await.unwrap_or(Ok(()))
        } else {
            Ok(())
        };
        let handle = lock(&self.inner.writer.0).take();
        if let Some(h) = handle {
            let joined = tokio::task::spawn_blocking(move || h.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                tracing::error!(location = %self.inner.location, "the store's writer thread panicked");
            }
        }
        result
    }

    /// The schema version reads are made against: a read-only store is not migrated, so its
    /// rows are of the version it was found at.
    fn read_version(&self) -> u32 {
        if self.inner.read_only() {
            self.inner.report.found_version
        } else {
            schema::SCHEMA_VERSION
        }
    }

    fn closed(&self) -> StoreError {
        StoreError::Unavailable {
            location: self.inner.location.clone(),
            cause: if self.inner.read_only() {
                "the store was opened read-only (this command changes nothing in it)".into()
            } else {
                "the store is closed".into()
            },
        }
    }

    /// Runs `f` on a reader connection, off the async runtime.
    pub(crate) async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &str) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let readers = self.inner.readers.clone();
        tokio::task::spawn_blocking(move || readers.with(|c| f(c, &readers.location)))
            .await
            .map_err(|e| StoreError::Backend {
                location: self.inner.location.clone(),
                cause: format!("a read task failed: {e}"),
            })?
    }

    /// Runs `f` on the writer connection, in its own immediate transaction, in order with the
    /// log writes.
    pub(crate) async fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &str) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (reply, rx) = oneshot::channel();
        let location = self.inner.location.clone();
        let op: writer::Op = Box::new(move |conn: &mut Connection| {
            let result = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .at(&location)
                .and_then(|tx| {
                    let out = f(&tx, &location)?;
                    tx.commit().at(&location)?;
                    Ok(out)
                });
            let _ = reply.send(result);
        });
        self.inner
            .tx
            .send(Msg::Op(op))
            .await
            .map_err(|_| self.closed())?;
        rx.await.map_err(|_| self.closed())?
    }
}

/// The definition columns of a store of schema version `version`: a read-only reader does
/// not migrate, and before version 3 there were no `test_cases` and `pending` columns.
fn def_columns(version: u32) -> String {
    let mut columns = DEF_COLUMNS.to_owned();
    if version < 4 {
        columns = columns.replacen("embedding_key", "NULL", 1);
    }
    if version < 3 {
        columns = columns.replacen("test_cases, pending", "NULL, NULL", 1);
    }
    columns
}

fn all_definitions(
    conn: &Connection,
    location: &str,
    version: u32,
) -> Result<Vec<ToolDefinition>, StoreError> {
    query(
        conn,
        location,
        &format!(
            "SELECT {} FROM tool_definitions ORDER BY name",
            def_columns(version)
        ),
        [],
        convert::definition,
    )
}

pub(crate) fn query<P: rusqlite::Params, T>(
    conn: &Connection,
    location: &str,
    sql: &str,
    params: P,
    f: impl Fn(&rusqlite::Row<'_>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).at(location)?;
    let mut rows = stmt.query(params).at(location)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().at(location)? {
        out.push(f(row)?);
    }
    Ok(out)
}

pub(crate) fn one<P: rusqlite::Params, T>(
    conn: &Connection,
    location: &str,
    sql: &str,
    params: P,
    f: impl Fn(&rusqlite::Row<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    Ok(query(conn, location, sql, params, f)?.into_iter().next())
}

fn definition(
    conn: &Connection,
    location: &str,
    name: &str,
    version: u32,
) -> Result<Option<ToolDefinition>, StoreError> {
    one(
        conn,
        location,
        &format!(
            "SELECT {} FROM tool_definitions WHERE name = ?1",
            def_columns(version)
        ),
        [name],
        convert::definition,
    )
}

fn require_changed(n: usize, what: impl FnOnce() -> String) -> Result<(), StoreError> {
    if n == 0 {
        Err(StoreError::not_found(what()))
    } else {
        Ok(())
    }
}

#[async_trait]
impl DefinitionStore for SqliteStore {
    async fn seed_system_tools(
        &self,
        tools: Vec<ToolDefinition>,
        retired: Vec<String>,
    ) -> Result<SeedReport, StoreError> {
        self.write(move |tx, loc| {
            let stored = all_definitions(tx, loc, schema::SCHEMA_VERSION)?;
            let plan = plan_seed(&stored, &tools, &retired)?;
            let now = SystemTime::now();
            for def in plan.inserts.iter().chain(&plan.updates) {
                convert::write_definition(tx, def, now).at(loc)?;
            }
            for name in &plan.retire {
                tx.execute(
                    "UPDATE tool_definitions SET deleted_at = ?2, updated_at = ?2 WHERE name = ?1",
                    params![name, micros(now)],
                )
                .at(loc)?;
            }
            Ok(plan.report)
        })
        .await
    }

    async fn put_definition(&self, mut def: ToolDefinition) -> Result<(), StoreError> {
        self.write(move |tx, loc| {
            if let Some(old) = definition(tx, loc, &def.name, schema::SCHEMA_VERSION)?
                && old.description != def.description
            {
                def.embedding = None;
                def.embedding_key = None;
            }
            def.deleted_at = None;
            convert::write_definition(tx, &def, SystemTime::now()).at(loc)
        })
        .await
    }

    async fn definition(&self, name: &str) -> Result<Option<ToolDefinition>, StoreError> {
        let name = name.to_owned();
        let version = self.read_version();
        self.read(move |c, loc| definition(c, loc, &name, version))
            .await
    }

    async fn all_definitions(&self) -> Result<Vec<ToolDefinition>, StoreError> {
        let version = self.read_version();
        self.read(move |c, loc| all_definitions(c, loc, version))
            .await
    }

    async fn visible_definitions(&self, tenant: &str) -> Result<Vec<ToolDefinition>, StoreError> {
        let tenant = tenant.to_owned();
        let version = self.read_version();
        self.read(move |c, loc| {
            query(
                c,
                loc,
                &format!(
                    "SELECT {} FROM tool_definitions
                     WHERE status = 'approved' AND enabled = 1 AND category <> 'internal'
                       AND deleted_at IS NULL AND tenant_id IN (?1, '*')
                     ORDER BY name",
                    def_columns(version)
                ),
                [tenant],
                convert::definition,
            )
        })
        .await
    }

    async fn set_status(
        &self,
        name: &str,
        status: Lifecycle,
        rejection_reason: Option<String>,
    ) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.write(move |tx, loc| {
            let n = tx
                .execute(
                    "UPDATE tool_definitions SET status = ?2, rejection_reason = ?3, updated_at = ?4
                     WHERE name = ?1",
                    params![name, status.as_str(), rejection_reason, micros(SystemTime::now())],
                )
                .at(loc)?;
            require_changed(n, || format!("tool `{name}`"))
        })
        .await
    }

    async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.write(move |tx, loc| {
            let n = tx
                .execute(
                    "UPDATE tool_definitions SET enabled = ?2, updated_at = ?3 WHERE name = ?1",
                    params![name, enabled, micros(SystemTime::now())],
                )
                .at(loc)?;
            require_changed(n, || format!("tool `{name}`"))
        })
        .await
    }

    async fn set_embedding(
        &self,
        name: &str,
        key: String,
        embedding: Vec<f32>,
    ) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.write(move |tx, loc| {
            let blob: Vec<u8> = embedding.iter().flat_map(|f| f.to_le_bytes()).collect();
            let n = tx
                .execute(
                    "UPDATE tool_definitions SET embedding = ?2, embedding_key = ?3 WHERE name = ?1",
                    params![name, blob, key],
                )
                .at(loc)?;
            require_changed(n, || format!("tool `{name}`"))
        })
        .await
    }

    async fn soft_delete(&self, name: &str) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.write(move |tx, loc| {
            let now = micros(SystemTime::now());
            let n = tx
                .execute(
                    "UPDATE tool_definitions SET deleted_at = COALESCE(deleted_at, ?2),
                        updated_at = ?2 WHERE name = ?1",
                    params![name, now],
                )
                .at(loc)?;
            require_changed(n, || format!("tool `{name}`"))
        })
        .await
    }

    async fn definitions_version(&self) -> Result<u64, StoreError> {
        if self.read_version() < 3 {
            return Ok(0);
        }
        self.read(|c, loc| {
            c.query_row(
                "SELECT version FROM definitions_version WHERE id = 1",
                [],
                |r| r.get::<_, i64>(0),
            )
            .at(loc)
            .map(|v| u64::try_from(v).unwrap_or(0))
        })
        .await
    }
}

fn job(conn: &Connection, location: &str, id: &str) -> Result<Option<ToolJob>, StoreError> {
    one(
        conn,
        location,
        &format!("SELECT {JOB_COLUMNS} FROM tool_jobs WHERE id = ?1"),
        [id],
        convert::job,
    )
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn create_job(&self, new: NewJob) -> Result<ToolJob, StoreError> {
        self.write(move |tx, loc| {
            if job(tx, loc, &new.id)?.is_some() {
                return Err(StoreError::conflict(format!("job `{}` exists", new.id)));
            }
            let j = ToolJob::queued(new, SystemTime::now());
            tx.execute(
                "INSERT INTO tool_jobs (id, tool_name, job_type, status, spec, result,
                    progress_pct, tenant, conversation, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULL, 0, ?6, ?7, ?8, ?8)",
                params![
                    j.id,
                    j.tool_name,
                    j.job_type.as_str(),
                    j.status.as_str(),
                    j.spec.to_string(),
                    j.tenant,
                    j.conversation,
                    micros(j.created_at)
                ],
            )
            .at(loc)?;
            Ok(j)
        })
        .await
    }

    async fn job(&self, id: &str) -> Result<Option<ToolJob>, StoreError> {
        let id = id.to_owned();
        self.read(move |c, loc| job(c, loc, &id)).await
    }

    async fn transition_job(
        &self,
        id: &str,
        to: JobStatus,
        result: Option<Value>,
    ) -> Result<ToolJob, StoreError> {
        let id = id.to_owned();
        self.write(move |tx, loc| {
            let current =
                job(tx, loc, &id)?.ok_or_else(|| StoreError::not_found(format!("job `{id}`")))?;
            current.status.check(to, &id)?;
            tx.execute(
                "UPDATE tool_jobs SET status = ?2, result = COALESCE(?3, result), updated_at = ?4
                 WHERE id = ?1",
                params![
                    id,
                    to.as_str(),
                    result.as_ref().map(Value::to_string),
                    micros(SystemTime::now())
                ],
            )
            .at(loc)?;
            job(tx, loc, &id)?.ok_or_else(|| StoreError::not_found(format!("job `{id}`")))
        })
        .await
    }

    async fn set_job_progress(&self, id: &str, pct: u8) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.write(move |tx, loc| {
            let n = tx
                .execute(
                    "UPDATE tool_jobs SET progress_pct = ?2, updated_at = ?3 WHERE id = ?1",
                    params![id, pct.min(100), micros(SystemTime::now())],
                )
                .at(loc)?;
            require_changed(n, || format!("job `{id}`"))
        })
        .await
    }

    async fn heartbeat_job(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |tx, loc| {
            let n = tx
                .execute(
                    "UPDATE tool_jobs SET updated_at = ?2
                     WHERE id = ?1 AND status IN ('building', 'testing')",
                    params![id, micros(SystemTime::now())],
                )
                .at(loc)?;
            Ok(n == 1)
        })
        .await
    }

    async fn release_job(
        &self,
        id: &str,
        renewed_before: Option<SystemTime>,
        why: Value,
    ) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |tx, loc| {
            let n = tx
                .execute(
                    "UPDATE tool_jobs SET status = 'failed', result = ?2, updated_at = ?3
                     WHERE id = ?1 AND status IN ('building', 'testing')
                       AND (?4 IS NULL OR updated_at < ?4)",
                    params![
                        id,
                        why.to_string(),
                        micros(SystemTime::now()),
                        renewed_before.map(micros)
                    ],
                )
                .at(loc)?;
            Ok(n == 1)
        })
        .await
    }

    async fn jobs(&self, tool_name: Option<String>) -> Result<Vec<ToolJob>, StoreError> {
        self.read(move |c, loc| {
            query(
                c,
                loc,
                &format!(
                    "SELECT {JOB_COLUMNS} FROM tool_jobs WHERE (?1 IS NULL OR tool_name = ?1)
                     ORDER BY created_at DESC, id DESC"
                ),
                [tool_name],
                convert::job,
            )
        })
        .await
    }

    async fn claim_job(&self, id: Option<String>) -> Result<Option<ToolJob>, StoreError> {
        // The write transaction is immediate, so two processes on one file never claim
        // the same job: the second sees it `building`.
        self.write(move |tx, loc| {
            let queued: Option<String> = tx
                .query_row(
                    "SELECT id FROM tool_jobs WHERE status = 'queued' AND (?1 IS NULL OR id = ?1)
                     ORDER BY created_at, id LIMIT 1",
                    [&id],
                    |r| r.get(0),
                )
                .optional()
                .at(loc)?;
            let Some(id) = queued else {
                return Ok(None);
            };
            tx.execute(
                "UPDATE tool_jobs SET status = 'building', updated_at = ?2 WHERE id = ?1",
                params![id, micros(SystemTime::now())],
            )
            .at(loc)?;
            job(tx, loc, &id)
        })
        .await
    }
}

#[async_trait]
impl ToolCallRecorder for SqliteStore {
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

/// The query of [`CallLog::recent_calls`]: the filters given (tool, session, kind,
/// principal, call id, before, after, in that order, then the limit), and only those, so that SQLite walks the index of the session or
/// the tool (`x = ?`) rather than the whole log by time. With `(? IS NULL OR session = ?)`
/// every new session's first call (which reads what the session called before) scanned
/// every row: 64 new sessions on a 63k-row log took 3 s.
/// The execution-log rows `filter` asks for, from a store of schema version `version` (a
/// read-only reader does not migrate: version 1 had no `principal` column).
fn recent_calls_in(
    c: &rusqlite::Connection,
    loc: &str,
    filter: &CallFilter,
    version: u32,
) -> Result<Vec<LoggedCall>, StoreError> {
    // A store older than the column (read-only, not migrated) has no nested calls.
    if version < 3 && filter.parent.is_some() {
        return Ok(Vec::new());
    }
    let output = if filter.with_output {
        "o.output FROM execution_log l LEFT JOIN execution_output o ON o.log_id = l.id"
    } else {
        "NULL FROM execution_log l"
    };
    let mut values: Vec<&dyn rusqlite::ToSql> = Vec::new();
    if let Some(tool) = &filter.tool {
        values.push(tool);
    }
    if let Some(session) = &filter.session {
        values.push(session);
    }
    if let Some(kind) = &filter.kind {
        values.push(kind);
    }
    if let Some(principal) = &filter.principal {
        values.push(principal);
    }
    if let Some(id) = &filter.call_id {
        values.push(id);
    }
    if let Some(parent) = &filter.parent {
        values.push(parent);
    }
    let before = filter.before.map(micros);
    let before_row = filter
        .before_row
        .map(|r| i64::try_from(r).unwrap_or(i64::MAX));
    if let Some(before) = &before {
        values.push(before);
        if let Some(row) = &before_row {
            values.push(before);
            values.push(row);
        }
    }
    let after = filter.after.map(micros);
    let after_row = filter
        .after_row
        .map(|r| i64::try_from(r).unwrap_or(i64::MAX));
    if let Some(after) = &after {
        values.push(after);
        if let Some(row) = &after_row {
            values.push(after);
            values.push(row);
        }
    }
    let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
    values.push(&limit);
    let sql = older_columns(&recent_calls_sql(filter, output), version);
    query(c, loc, &sql, values.as_slice(), convert::logged_call)
}

/// `sql` (selecting [`LOG_COLUMNS`]) for a store of schema `version`: the columns it does
/// not have yet read as NULL.
fn older_columns(sql: &str, version: u32) -> String {
    let mut sql = sql.to_owned();
    if version < 2 {
        sql = sql.replacen("l.principal", "NULL", 1);
    }
    if version < 3 {
        sql = sql.replacen("l.parent_call_id", "NULL", 1);
    }
    if version < 7 {
        sql = sql.replacen("l.trace_id", "NULL", 1);
    }
    sql
}

pub(crate) fn recent_calls_sql(filter: &CallFilter, output: &str) -> String {
    let mut clauses: Vec<&str> = Vec::new();
    if filter.tool.is_some() {
        clauses.push("l.tool_name = ?");
    }
    if filter.session.is_some() {
        clauses.push("l.session = ?");
    }
    if filter.kind.is_some() {
        clauses.push("l.kind = ?");
    }
    if filter.principal.is_some() {
        clauses.push("l.principal = ?");
    }
    if filter.call_id.is_some() {
        clauses.push("l.call_id = ?");
    }
    if filter.parent.is_some() {
        clauses.push("l.parent_call_id = ?");
    }
    // A cursor `(time, row)`: the time's index range, then the row within its last
    // microsecond.
    match (filter.before.is_some(), filter.before_row.is_some()) {
        (true, true) => clauses.push("l.created_at <= ? AND (l.created_at < ? OR l.id < ?)"),
        (true, false) => clauses.push("l.created_at < ?"),
        _ => {}
    }
    match (filter.after.is_some(), filter.after_row.is_some()) {
        (true, true) => clauses.push("l.created_at >= ? AND (l.created_at > ? OR l.id > ?)"),
        (true, false) => clauses.push("l.created_at > ?"),
        _ => {}
    }
    let filters = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    format!(
        "SELECT {LOG_COLUMNS}, l.id, {output}
         {filters}
         ORDER BY l.created_at DESC, l.id DESC LIMIT ?"
    )
}

#[async_trait]
impl CallLog for SqliteStore {
    async fn recent_calls(&self, filter: CallFilter) -> Result<Vec<LoggedCall>, StoreError> {
        let version = self.read_version();
        self.read(move |c, loc| recent_calls_in(c, loc, &filter, version))
            .await
    }

    async fn purge_calls_before(&self, cutoff: SystemTime) -> Result<u64, StoreError> {
        let cutoff = micros(cutoff);
        let mut total = 0u64;
        loop {
            // One small transaction per batch, queued behind (and ahead of) log writes, so
            // the writer is never held for long.
            let (n, more) = self
                .write(move |tx, loc| crate::chain::purge_batch(tx, loc, cutoff))
                .await?;
            total += n;
            if !more {
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
        let version = self.read_version();
        self.read(move |c, loc| crate::chain::chain_rows_in(c, loc, version, after, since, limit))
            .await
    }

    async fn chain_state(&self) -> Result<ChainState, StoreError> {
        let version = self.read_version();
        self.read(move |c, loc| crate::chain::chain_state_in(c, loc, version))
            .await
    }
}

#[async_trait]
impl UsageSource for SqliteStore {
    async fn usage(&self, now: SystemTime) -> Result<Vec<ToolUsage>, StoreError> {
        let [b30, b90] = ToolUsage::BUCKETS
            .map(|age| micros(now.checked_sub(age).unwrap_or(std::time::UNIX_EPOCH)));
        self.read(move |c, loc| {
            let mut stmt = c
                .prepare_cached(
                    // Calls that answered (Ok or a Hint), as `requires_prior` counts them:
                    // not errors (a tool that always times out is not one to put before
                    // every model), and not the dispatcher's refusal of bad
                    // arguments, a schema hint that the tool never saw
                    // (`quiver_registry::refused_before_running`).
                    "SELECT tool_name,
                        SUM(created_at >= ?1),
                        SUM(created_at < ?1 AND created_at >= ?2),
                        SUM(created_at < ?2)
                     FROM execution_log
                     WHERE err_kind IS NULL
                       AND NOT COALESCE(
                           hint_kind = 'schema'
                           AND substr(error, 1, length(?3) + length(tool_name) + 1)
                               = ?3 || tool_name || '`',
                           0)
                     GROUP BY tool_name ORDER BY tool_name",
                )
                .at(loc)?;
            let rows = stmt
                .query_map(params![b30, b90, quiver_registry::REFUSED_ARGUMENTS], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, u64>(1)?,
                        r.get::<_, u64>(2)?,
                        r.get::<_, u64>(3)?,
                    ))
                })
                .at(loc)?
                .collect::<Result<Vec<_>, _>>()
                .at(loc)?;
            Ok(rows
                .into_iter()
                .map(|(tool, a, b, c)| ToolUsage::new(tool, a, b, c))
                .collect())
        })
        .await
    }
}

/// The (device, inode) of the file at `path`, if there is one (Unix; elsewhere never known).
fn file_id(path: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

#[cfg(test)]
mod query_plan_tests {
    use super::*;

    /// The plan SQLite picks for `filter`'s query.
    fn plan(path: &Path, filter: &CallFilter) -> String {
        let c = Connection::open(path).unwrap();
        let sql = format!(
            "EXPLAIN QUERY PLAN {}",
            recent_calls_sql(filter, "NULL FROM execution_log l")
        );
        let n = sql.matches('?').count();
        let values: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
        let mut stmt = c.prepare(&sql).unwrap();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(values.iter()), |r| {
                r.get::<_, String>(3)
            })
            .unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    }

    /// A session's or a tool's calls are found through its index, not by walking the whole
    /// log (every new session's first call reads its earlier calls: with a full scan each
    /// one cost time proportional to the log).
    #[tokio::test]
    async fn session_and_tool_filters_use_their_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.db");
        let store = SqliteStore::open(&path).unwrap();
        let session = plan(&path, &CallFilter::recent(50).session("s"));
        assert!(
            session.contains("USING INDEX execution_log_session"),
            "{session}"
        );
        let tool = plan(&path, &CallFilter::recent(50).tool("t"));
        assert!(tool.contains("USING INDEX execution_log_tool"), "{tool}");
        let all = plan(&path, &CallFilter::recent(50));
        assert!(all.contains("USING INDEX execution_log_created"), "{all}");
        // A page's cursor (time, row) walks the time index too, without a sort.
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1);
        let page = plan(&path, &CallFilter::recent(50).before_row(at, 7));
        assert!(
            page.contains("USING INDEX execution_log_created") && !page.contains("TEMP B-TREE"),
            "{page}"
        );
        store.close().await.unwrap();
    }
}
