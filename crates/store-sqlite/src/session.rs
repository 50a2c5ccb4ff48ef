//! [`SqliteStore`]'s `SessionStore`: working sets (written whole, versioned, or only over
//! the version a server last saw), failure counts and surface state.

use std::time::SystemTime;

use async_trait::async_trait;
use quiver_registry::store::StoreError;
use quiver_surface::ports::{
    FailedApproach, SessionStore, StoredWorkingSet, SurfaceState, WorkingSetEntry,
};
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use crate::{
    SqliteStore,
    convert::{micros, time},
    error::ResultExt,
    store::query,
};

#[async_trait]
impl SessionStore for SqliteStore {
    async fn working_set(&self, session: &str) -> Result<Vec<WorkingSetEntry>, StoreError> {
        let session = session.to_owned();
        self.read(move |c, loc| {
            query(
                c,
                loc,
                "SELECT tool, last_used, round FROM session_tools WHERE session = ?1 ORDER BY tool",
                [session],
                working_set_entry,
            )
        })
        .await
    }

    async fn versioned_working_set(&self, session: &str) -> Result<StoredWorkingSet, StoreError> {
        let session = session.to_owned();
        self.read(move |c, loc| {
            let version = query(
                c,
                loc,
                "SELECT version FROM session_versions WHERE session = ?1",
                [&session],
                |r| match r.get::<_, rusqlite::types::Value>(0) {
                    Ok(rusqlite::types::Value::Integer(v)) => Ok(u64::try_from(v).unwrap_or(0)),
                    _ => Err(StoreError::invalid_data("a session_versions row")),
                },
            )?;
            let entries = query(
                c,
                loc,
                "SELECT tool, last_used, round FROM session_tools WHERE session = ?1 ORDER BY tool",
                [&session],
                working_set_entry,
            )?;
            Ok(StoredWorkingSet::new(
                version.first().copied().unwrap_or(0),
                entries,
            ))
        })
        .await
    }

    async fn replace_working_set(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
    ) -> Result<u64, StoreError> {
        let session = session.to_owned();
        self.write(move |tx, loc| {
            tx.execute("DELETE FROM session_tools WHERE session = ?1", [&session])
                .at(loc)?;
            upsert_session_tools(tx, loc, &session, &entries)?;
            let version: i64 = tx
                .query_row(
                    "INSERT INTO session_versions (session, version) VALUES (?1, 1)
                     ON CONFLICT (session) DO UPDATE SET version = version + 1
                     RETURNING version",
                    [&session],
                    |r| r.get(0),
                )
                .at(loc)?;
            Ok(u64::try_from(version).unwrap_or(0))
        })
        .await
    }

    /// One write transaction: the version is read and compared on the writer's
    /// connection, so no other write comes between.
    async fn replace_working_set_if(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
        expected: u64,
    ) -> Result<Option<u64>, StoreError> {
        let session = session.to_owned();
        self.write(move |tx, loc| {
            let current: i64 = tx
                .query_row(
                    "SELECT COALESCE(max(version), 0) FROM session_versions WHERE session = ?1",
                    [&session],
                    |r| r.get(0),
                )
                .at(loc)?;
            if u64::try_from(current).unwrap_or(0) != expected {
                return Ok(None);
            }
            tx.execute("DELETE FROM session_tools WHERE session = ?1", [&session])
                .at(loc)?;
            upsert_session_tools(tx, loc, &session, &entries)?;
            let version: i64 = tx
                .query_row(
                    "INSERT INTO session_versions (session, version) VALUES (?1, 1)
                     ON CONFLICT (session) DO UPDATE SET version = version + 1
                     RETURNING version",
                    [&session],
                    |r| r.get(0),
                )
                .at(loc)?;
            Ok(Some(u64::try_from(version).unwrap_or(0)))
        })
        .await
    }

    async fn record_failed_approach(
        &self,
        session: &str,
        args_hash: &str,
        tool: &str,
        error: &str,
    ) -> Result<u32, StoreError> {
        let (session, args_hash, tool, error) = (
            session.to_owned(),
            args_hash.to_owned(),
            tool.to_owned(),
            error.to_owned(),
        );
        self.write(move |tx, loc| {
            tx.query_row(
                "INSERT INTO session_failures (session, args_hash, tool, error, count, last_at)
                 VALUES (?1, ?2, ?3, ?4, 1, ?5)
                 ON CONFLICT (session, args_hash) DO UPDATE
                 SET count = count + 1, tool = excluded.tool, error = excluded.error,
                     last_at = excluded.last_at
                 RETURNING count",
                params![session, args_hash, tool, error, micros(SystemTime::now())],
                |r| r.get::<_, u32>(0),
            )
            .at(loc)
        })
        .await
    }

    async fn failed_approaches(&self, session: &str) -> Result<Vec<FailedApproach>, StoreError> {
        let session = session.to_owned();
        self.read(move |c, loc| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT args_hash, tool, error, count, last_at FROM session_failures
                     WHERE session = ?1 ORDER BY args_hash",
                )
                .at(loc)?;
            let rows = stmt
                .query_map([session], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, u32>(3)?,
                        r.get::<_, i64>(4)?,
                    ))
                })
                .at(loc)?
                .collect::<Result<Vec<_>, _>>()
                .at(loc)?;
            Ok(rows
                .into_iter()
                .map(|(args_hash, tool, error, count, last_at)| {
                    FailedApproach::new(args_hash, tool, error, count, time(last_at))
                })
                .collect())
        })
        .await
    }

    async fn end_session(&self, session: &str) -> Result<(), StoreError> {
        let session = session.to_owned();
        self.write(move |tx, loc| {
            tx.execute("DELETE FROM session_tools WHERE session = ?1", [&session])
                .at(loc)?;
            tx.execute(
                "DELETE FROM session_versions WHERE session = ?1",
                [&session],
            )
            .at(loc)?;
            tx.execute(
                "DELETE FROM session_failures WHERE session = ?1",
                [&session],
            )
            .at(loc)?;
            Ok(())
        })
        .await
    }

    async fn state(&self, key: &str) -> Result<Option<SurfaceState>, StoreError> {
        let key = key.to_owned();
        self.read(move |c, loc| {
            let row = c
                .query_row(
                    "SELECT value, written_at FROM surface_state WHERE key = ?1",
                    [key],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
                )
                .optional()
                .at(loc)?;
            row.map(|(value, at)| {
                let value = serde_json::from_str(&value).map_err(|e| {
                    StoreError::invalid_data(format!("surface state is not JSON: {e}"))
                })?;
                Ok(SurfaceState::new(value, time(at)))
            })
            .transpose()
        })
        .await
    }

    async fn put_state(&self, key: &str, value: Value) -> Result<(), StoreError> {
        let key = key.to_owned();
        self.write(move |tx, loc| {
            tx.execute(
                "INSERT INTO surface_state (key, value, written_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE
                 SET value = excluded.value, written_at = excluded.written_at",
                params![key, value.to_string(), micros(SystemTime::now())],
            )
            .at(loc)?;
            Ok(())
        })
        .await
    }
}

/// A `session_tools` row (tool, last used, round) as an entry.
fn working_set_entry(r: &rusqlite::Row<'_>) -> Result<WorkingSetEntry, StoreError> {
    let get = |i| r.get::<_, rusqlite::types::Value>(i);
    match (get(0), get(1), get(2)) {
        (
            Ok(rusqlite::types::Value::Text(tool)),
            Ok(rusqlite::types::Value::Integer(at)),
            Ok(rusqlite::types::Value::Integer(round)),
        ) => Ok(WorkingSetEntry::new(
            tool,
            time(at),
            u64::try_from(round).unwrap_or(0),
        )),
        _ => Err(StoreError::invalid_data("a session_tools row")),
    }
}

/// Writes `entries` into `session`'s working set (a tool already there takes the new use).
fn upsert_session_tools(
    tx: &rusqlite::Transaction<'_>,
    loc: &str,
    session: &str,
    entries: &[WorkingSetEntry],
) -> Result<(), StoreError> {
    let mut stmt = tx
        .prepare_cached(
            "INSERT INTO session_tools (session, tool, last_used, round)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (session, tool) DO UPDATE
             SET last_used = excluded.last_used, round = excluded.round",
        )
        .at(loc)?;
    for e in entries {
        stmt.execute(params![
            session,
            e.tool,
            micros(e.last_used),
            i64::try_from(e.round).unwrap_or(i64::MAX)
        ])
        .at(loc)?;
    }
    Ok(())
}
