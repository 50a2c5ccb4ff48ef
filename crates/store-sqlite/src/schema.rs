//! The versioned schema, the connection setup and the open-time checks (schema version, crash
//! check).

use std::{path::Path, time::Duration};

use quiver_registry::store::StoreError;
use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::error::ResultExt;

/// The migrations, in order; migration `i` brings the schema to version `i + 1`. Never edit
/// one that has shipped: append a new one.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE quiver_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE tool_definitions (
    name                         TEXT PRIMARY KEY,
    description                  TEXT NOT NULL,
    input_schema                 TEXT NOT NULL,
    implementation               TEXT NOT NULL,
    tool_type                    TEXT NOT NULL CHECK (tool_type IN ('system', 'custom', 'mcp')),
    status                       TEXT NOT NULL
                                 CHECK (status IN ('draft', 'testing', 'approved', 'rejected')),
    enabled                      INTEGER NOT NULL,
    category                     TEXT NOT NULL,
    domain                       TEXT,
    replaced_by_model_capability TEXT,
    status_message               TEXT,
    large_output                 INTEGER NOT NULL,
    parent_tool                  TEXT,
    dependencies                 TEXT NOT NULL,
    version                      INTEGER NOT NULL,
    tenant_id                    TEXT NOT NULL,
    created_by                   TEXT,
    rejection_reason             TEXT,
    test_results                 TEXT,
    deleted_at                   INTEGER,
    embedding                    BLOB,
    created_at                   INTEGER NOT NULL,
    updated_at                   INTEGER NOT NULL
);
CREATE INDEX tool_definitions_visible ON tool_definitions (status, enabled, deleted_at, tenant_id);

CREATE TABLE execution_log (
    id             INTEGER PRIMARY KEY,
    tool_name      TEXT NOT NULL,
    tenant         TEXT,
    session        TEXT,
    call_id        TEXT NOT NULL,
    input_data     TEXT NOT NULL,
    reasoning      TEXT,
    args_hash      TEXT NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('ok', 'hint', 'err')),
    hint_kind      TEXT,
    err_kind       TEXT,
    success        INTEGER NOT NULL,
    error          TEXT,
    output_summary TEXT NOT NULL,
    queued_us      INTEGER NOT NULL,
    took_us        INTEGER NOT NULL,
    created_at     INTEGER NOT NULL
);
CREATE INDEX execution_log_created ON execution_log (created_at);
CREATE INDEX execution_log_tool ON execution_log (tool_name, created_at);
CREATE INDEX execution_log_session ON execution_log (session, created_at);

CREATE TABLE execution_output (
    log_id INTEGER PRIMARY KEY,
    output TEXT NOT NULL
);

CREATE TABLE tool_jobs (
    id           TEXT PRIMARY KEY,
    tool_name    TEXT NOT NULL,
    job_type     TEXT NOT NULL CHECK (job_type IN ('build', 'audit', 'rebuild')),
    status       TEXT NOT NULL CHECK (status IN
                     ('queued', 'building', 'testing', 'approved', 'rejected', 'failed')),
    spec         TEXT NOT NULL,
    result       TEXT,
    progress_pct INTEGER NOT NULL,
    tenant       TEXT,
    conversation TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE INDEX tool_jobs_tool ON tool_jobs (tool_name, created_at);

CREATE TABLE session_tools (
    session   TEXT NOT NULL,
    tool      TEXT NOT NULL,
    last_used INTEGER NOT NULL,
    round     INTEGER NOT NULL,
    PRIMARY KEY (session, tool)
) WITHOUT ROWID;

CREATE TABLE session_failures (
    session   TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    tool      TEXT NOT NULL,
    error     TEXT NOT NULL,
    count     INTEGER NOT NULL,
    last_at   INTEGER NOT NULL,
    PRIMARY KEY (session, args_hash)
) WITHOUT ROWID;

CREATE TABLE surface_state (
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    written_at INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    // 2: who made each call (the inbound token's name).
    r#"
ALTER TABLE execution_log ADD COLUMN principal TEXT;
"#,
    // 3: custom tools (their test cases, the next version under review), the call a nested
    // call was made from, and a counter every change of a definition bumps, which running
    // servers poll to take another process's approvals and disables live.
    r#"
ALTER TABLE tool_definitions ADD COLUMN test_cases TEXT;
ALTER TABLE tool_definitions ADD COLUMN pending TEXT;
ALTER TABLE execution_log ADD COLUMN parent_call_id TEXT;
CREATE TABLE definitions_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT INTO definitions_version (id, version) VALUES (1, 0);
CREATE TRIGGER definitions_inserted AFTER INSERT ON tool_definitions
BEGIN UPDATE definitions_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER definitions_updated AFTER UPDATE ON tool_definitions
BEGIN UPDATE definitions_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER definitions_deleted AFTER DELETE ON tool_definitions
BEGIN UPDATE definitions_version SET version = version + 1 WHERE id = 1; END;
"#,
    // 4: what a stored embedding was computed from (model and text), and storing one is no
    // longer a change of the definition (running servers need not re-read the definitions
    // for it): the update trigger names every column but the embedding's two.
    r#"
ALTER TABLE tool_definitions ADD COLUMN embedding_key TEXT;
DROP TRIGGER definitions_updated;
CREATE TRIGGER definitions_updated AFTER UPDATE OF name, description, input_schema,
    implementation, tool_type, status, enabled, category, domain,
    replaced_by_model_capability, status_message, large_output, parent_tool, dependencies,
    version, tenant_id, created_by, rejection_reason, test_results, deleted_at, created_at,
    updated_at, test_cases, pending ON tool_definitions
BEGIN UPDATE definitions_version SET version = version + 1 WHERE id = 1; END;
"#,
    // 5: the admin page's call log: a call found by its id, and calls filtered by who made
    // them, newest first, without a walk of the whole log.
    r#"
CREATE INDEX execution_log_call ON execution_log (call_id);
CREATE INDEX execution_log_principal ON execution_log (principal, created_at);
"#,
    // 6: the execution log's hash chain (`quiver_registry::chain`): each row's place and
    // link; the head the writers last stored (row 0 and the zero link before the first
    // row), with the first id a chained row can have (rows without a link below it are
    // older than the chain); checkpoints.
    r#"
ALTER TABLE execution_log ADD COLUMN chain_seq INTEGER;
ALTER TABLE execution_log ADD COLUMN chain_link BLOB;
CREATE UNIQUE INDEX execution_log_chain ON execution_log (chain_seq);
CREATE TABLE log_chain (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    seq      INTEGER NOT NULL,
    link     BLOB NOT NULL,
    start_id INTEGER NOT NULL
);
INSERT INTO log_chain (id, seq, link, start_id)
    VALUES (1, 0, zeroblob(32), COALESCE((SELECT max(id) FROM execution_log), 0) + 1);
CREATE TABLE log_checkpoints (
    seq  INTEGER PRIMARY KEY,
    link BLOB NOT NULL
);
"#,
    // 7: the OpenTelemetry trace a call was part of; the calls made from a call (the admin
    // page's call detail lists them).
    r#"
ALTER TABLE execution_log ADD COLUMN trace_id TEXT;
CREATE INDEX execution_log_parent ON execution_log (parent_call_id);
"#,
    // 8: each session's working-set version, moved on by every whole-set write, so a
    // server sharing the store knows when another one has written the set.
    r#"
CREATE TABLE session_versions (
    session TEXT PRIMARY KEY,
    version INTEGER NOT NULL
) WITHOUT ROWID;
"#,
];

/// The newest schema version this binary knows.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The `quiver_meta` key set by a clean shutdown and cleared by open.
pub(crate) const CLEAN_SHUTDOWN: &str = "clean_shutdown";

/// The key prefix of the rows in which each process that has the database open announces
/// itself (see [`Holders`]).
const HOLDER_PREFIX: &str = "holder:";

/// What the open-time crash check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CrashCheck {
    /// A new database: nothing to check.
    NewDatabase,
    /// The last shutdown was clean: no check needed.
    CleanShutdown,
    /// The last shutdown was not clean; `PRAGMA integrity_check` ran and passed.
    Passed,
    /// Another process has the database open: the check was its to run when it opened,
    /// and the clean-shutdown marker is the last process's to set.
    Shared,
    /// Opened read-only ([`crate::SqliteStore::open_read_only`]): nothing was checked or
    /// marked.
    NotRun,
}

/// What opening the store found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenReport {
    /// The schema version found on disk (0 for a new database).
    pub found_version: u32,
    /// The schema version now.
    pub schema_version: u32,
    /// The crash check.
    pub crash_check: CrashCheck,
}

/// How a connection is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// The writer: may create the file; WAL, `synchronous = NORMAL`.
    Write,
    /// A reader of a store this process writes: read-write at the file level (so the last
    /// connection to close checkpoints the WAL, as SQLite does) but `query_only`.
    Read,
    /// A reader of a store opened read-only: the file is opened read-only, so nothing can
    /// change it, not even the checkpoint SQLite runs when the last connection of a WAL
    /// database closes (a `query_only` read-write connection still checkpoints a WAL a
    /// crash left). SQLite may still create the `-wal` and `-shm` side files to read it.
    ReadOnly,
}

/// The longest busy timeout SQLite takes (`i32::MAX` ms, about 24.8 days).
const MAX_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// `t`, or SQLite's longest busy timeout when it is longer (rusqlite panics on more).
pub(crate) fn busy_limit(t: Duration) -> Duration {
    t.min(MAX_BUSY_TIMEOUT)
}

/// Opens one connection and sets it up: busy timeout, WAL, `synchronous = NORMAL`.
pub(crate) fn connect(
    path: &Path,
    location: &str,
    busy_timeout: Duration,
    access: Access,
) -> Result<Connection, StoreError> {
    let read_only = access != Access::Write;
    let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    flags |= match access {
        Access::ReadOnly => OpenFlags::SQLITE_OPEN_READ_ONLY,
        Access::Read => OpenFlags::SQLITE_OPEN_READ_WRITE,
        Access::Write => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
    };
    let conn = Connection::open_with_flags(path, flags).at(location)?;
    conn.busy_timeout(busy_limit(busy_timeout)).at(location)?;
    if read_only {
        conn.pragma_update(None, "query_only", true).at(location)?;
    } else {
        refuse_foreign(&conn, location)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .at(location)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable {
                location: location.to_owned(),
                cause: format!("cannot switch the database to WAL mode (it stays in `{mode}`)"),
            });
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .at(location)?;
    }
    Ok(conn)
}

/// An in-memory database with the whole schema and nothing in it, query-only: what a
/// read-only store whose file does not exist reads.
pub(crate) fn empty(location: &str) -> Result<Connection, StoreError> {
    let conn = Connection::open_in_memory().at(location)?;
    for sql in MIGRATIONS {
        conn.execute_batch(sql).at(location)?;
    }
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)
        .at(location)?;
    conn.pragma_update(None, "query_only", true).at(location)?;
    Ok(conn)
}

/// A database with no Quiver schema (version 0) that already holds tables is another
/// application's: refused before anything is changed in it (its journal mode, Quiver's
/// tables), so that a `store.path` pointing at the wrong file harms nothing.
fn refuse_foreign(conn: &Connection, location: &str) -> Result<(), StoreError> {
    // The tables first, the version after: another process may be creating the schema
    // meanwhile, and its migration sets the version in the same commit as the tables, so a
    // version still 0 read after the tables means the tables were not Quiver's.
    let mut stmt = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name LIMIT 4",
        )
        .at(location)?;
    let tables: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .at(location)?
        .collect::<Result<_, _>>()
        .at(location)?;
    if tables.is_empty() {
        return Ok(());
    }
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .at(location)?;
    if version != 0 {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        location: location.to_owned(),
        cause: format!(
            "not a Quiver store: it holds another application's tables ({}), and Quiver changes nothing in it; point `[store] path` at a new file or a Quiver store",
            tables.join(", ")
        ),
    })
}

/// Runs the crash check and the migrations on the writer connection, clears the clean
/// shutdown marker and announces this process as a holder. `alone`: no other process has
/// the database open (see [`Holders`]); otherwise the crash check is skipped (the first
/// process ran it).
pub(crate) fn prepare(
    conn: &mut Connection,
    location: &str,
    holders: &Holders,
    alone: bool,
) -> Result<OpenReport, StoreError> {
    // The crash check reads outside the write transaction (a long integrity check must not
    // hold other openers' writes); the version that decides the migrations is read again
    // inside it: two processes opening a new database at once would otherwise both see
    // version 0 and both run migration 1.
    let before: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .at(location)?;
    if before > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            location: location.to_owned(),
            found: before,
            supported: SCHEMA_VERSION,
        });
    }
    let crash_check = if before == 0 {
        CrashCheck::NewDatabase
    } else if !alone {
        CrashCheck::Shared
    } else {
        let clean: Option<String> = conn
            .query_row(
                "SELECT value FROM quiver_meta WHERE key = ?1",
                [CLEAN_SHUTDOWN],
                |r| r.get(0),
            )
            .optional()
            .at(location)?;
        if clean.is_some() {
            CrashCheck::CleanShutdown
        } else {
            tracing::warn!(%location, "the last shutdown was not clean: checking integrity");
            integrity_check(conn, location)?;
            CrashCheck::Passed
        }
    };
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .at(location)?;
    let found: u32 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .at(location)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            location: location.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(sql).map_err(|e| StoreError::Backend {
            location: location.to_owned(),
            cause: format!("schema migration {} failed: {e}", i + 1),
        })?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .at(location)?;
    tx.execute("DELETE FROM quiver_meta WHERE key = ?1", [CLEAN_SHUTDOWN])
        .at(location)?;
    if alone {
        // Rows of holders that died with the database open: the crash check above has
        // just dealt with what they left.
        tx.execute(
            "DELETE FROM quiver_meta WHERE substr(key, 1, ?2) = ?1",
            rusqlite::params![HOLDER_PREFIX, HOLDER_PREFIX.len()],
        )
        .at(location)?;
    }
    tx.execute(
        "INSERT OR REPLACE INTO quiver_meta (key, value) VALUES (?1, ?2)",
        rusqlite::params![holders.key, std::process::id().to_string()],
    )
    .at(location)?;
    tx.commit().at(location)?;
    Ok(OpenReport {
        found_version: found,
        schema_version: SCHEMA_VERSION,
        crash_check,
    })
}

fn integrity_check(conn: &Connection, location: &str) -> Result<(), StoreError> {
    let mut stmt = conn.prepare("PRAGMA integrity_check").at(location)?;
    let problems: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .at(location)?
        .collect::<Result<_, _>>()
        .at(location)?;
    if problems.len() == 1 && problems[0] == "ok" {
        Ok(())
    } else {
        Err(StoreError::Corrupt {
            location: location.to_owned(),
            cause: format!("integrity check failed: {}", problems.join("; ")),
        })
    }
}

/// The writer's last act: withdraws this process's holder row and, when it is the last
/// holder out, sets the clean shutdown marker, unless a holder row of another process is
/// left: that process died with the database open, so the next opener must run the crash
/// check.
pub(crate) fn leave(
    conn: &Connection,
    location: &str,
    holders: &Holders,
    now_us: i64,
) -> Result<(), StoreError> {
    conn.execute("DELETE FROM quiver_meta WHERE key = ?1", [&holders.key])
        .at(location)?;
    if !holders.last() {
        return Ok(());
    }
    let dead: i64 = conn
        .query_row(
            "SELECT count(*) FROM quiver_meta WHERE substr(key, 1, ?2) = ?1",
            rusqlite::params![HOLDER_PREFIX, HOLDER_PREFIX.len()],
            |r| r.get(0),
        )
        .at(location)?;
    if dead > 0 {
        tracing::warn!(
            %location,
            "another process died with the database open: not marking it clean, so the next open checks its integrity"
        );
        return Ok(());
    }
    mark_clean(conn, location, now_us)
}

/// Sets the clean shutdown marker.
fn mark_clean(conn: &Connection, location: &str, now_us: i64) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO quiver_meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        rusqlite::params![CLEAN_SHUTDOWN, now_us.to_string()],
    )
    .at(location)?;
    Ok(())
}

/// Which processes have the database open, through advisory locks on a file beside it
/// (`<db>-lock`): each process holds a shared lock for as long as its store is open, and
/// the kernel drops it when the process dies. The first process in (the only holder) runs
/// the crash check; the last one out (again the only holder) sets the clean-shutdown
/// marker. So a CLI command beside a running `quiver serve` neither re-checks the
/// database nor marks it clean while the server still has it open. Each holder also keeps
/// a row in `quiver_meta` while it has the database open: a row left by a process that
/// died keeps the last one out from marking the database clean (a server killed while a
/// CLI command ran beside it is still checked at the next open).
#[derive(Debug)]
pub(crate) struct Holders {
    file: Option<std::fs::File>,
    /// This process's holder row (unique per open store).
    key: String,
    /// It holds the lock exclusively (the first in, until `share`).
    exclusive: bool,
}

impl Holders {
    /// A holder with no lock file: counts itself alone (in-memory databases, or no lock).
    fn without_lock(key: String) -> (Holders, bool) {
        let holders = Holders {
            file: None,
            key,
            exclusive: false,
        };
        (holders, true)
    }

    /// Joins the holders of the database at `path`; `alone` tells whether no other process
    /// holds it. In-memory and URI databases have no holders file (always alone).
    pub(crate) fn join(path: &Path, location: &str) -> Result<(Holders, bool), StoreError> {
        let name = path.as_os_str().to_string_lossy();
        static OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let key = format!(
            "{HOLDER_PREFIX}{}:{}:{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros()),
            OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        if name.is_empty() || name == ":memory:" || name.starts_with("file:") {
            return Ok(Holders::without_lock(key));
        }
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push("-lock");
        // A lock needs only a descriptor: read-only when the file is someone else's. If it
        // cannot be had at all (no such file system support), the database still opens,
        // as the only holder, as it did before there was a lock.
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .or_else(|_| std::fs::File::open(&lock_path));
        let file = match opened {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(%location, error = %e, "no holders lock file: the crash check cannot tell other processes apart");
                return Ok(Holders::without_lock(key));
            }
        };
        // The first in keeps the lock exclusive until its crash check and its holder row
        // are committed (`share`): a process opening meanwhile waits here, so the first one
        // never deletes the row of a process that joined after it.
        let alone = file.try_lock().is_ok();
        if !alone && let Err(e) = file.lock_shared() {
            tracing::warn!(%location, error = %e, "cannot lock the holders file: the crash check cannot tell other processes apart");
            return Ok(Holders::without_lock(key));
        }
        Ok((
            Holders {
                file: Some(file),
                key,
                exclusive: alone,
            },
            alone,
        ))
    }

    /// After `prepare`: the first in turns its exclusive lock shared, letting the others in.
    pub(crate) fn share(&mut self, location: &str) {
        if !std::mem::take(&mut self.exclusive) {
            return;
        }
        if let Some(f) = &self.file
            && let Err(e) = f.lock_shared()
        {
            tracing::warn!(%location, error = %e, "cannot share the holders lock: other processes may wait for this one to close");
        }
    }

    /// Whether this process is the last holder (no other process has the database open).
    /// For leaving only: on Linux a lock conversion is not atomic, so a failed try gives up
    /// this process's shared lock.
    pub(crate) fn last(&self) -> bool {
        self.file.as_ref().is_none_or(|f| f.try_lock().is_ok())
    }
}

#[cfg(test)]
mod holder_tests {
    use super::*;

    /// The first in keeps others out until it has shared its lock (after its crash check
    /// and holder row), so it cannot delete the row of a process that joined meanwhile.
    #[test]
    fn a_second_opener_waits_until_the_first_has_shared() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("h.db");
        let (mut first, alone) = Holders::join(&path, "h.db").expect("first");
        assert!(alone);
        let (tx, rx) = std::sync::mpsc::channel();
        let second_path = path.clone();
        let second = std::thread::spawn(move || {
            let joined = Holders::join(&second_path, "h.db").expect("second");
            tx.send(joined.1).expect("send");
            joined
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "the second opener must wait for the first to share"
        );
        first.share("h.db");
        let second_alone = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the second opener gets in once the first shared");
        assert!(!second_alone);
        let (second, _) = second.join().expect("thread");
        // (`last` is for leaving only: a failed try gives up the shared lock.)
        assert!(!first.last(), "the second is still in");
        drop(first);
        assert!(second.last());
    }
}
