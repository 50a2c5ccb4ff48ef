//! [`PgStore`]'s `SessionStore`: working sets (written whole, versioned, or only over the
//! version a server last saw), failure counts and surface state.

use std::{collections::BTreeMap, time::SystemTime};

use async_trait::async_trait;
use quiver_registry::store::StoreError;
use quiver_surface::ports::{
    FailedApproach, SessionStore, StoredWorkingSet, SurfaceState, WorkingSetEntry,
};
use serde_json::Value;

use crate::{PgStore, convert, error::ResultExt};

#[async_trait]
impl SessionStore for PgStore {
    async fn working_set(&self, session: &str) -> Result<Vec<WorkingSetEntry>, StoreError> {
        self.query(
            "SELECT tool, last_used, round FROM session_tools WHERE session = $1 ORDER BY tool",
            &[&session],
            |r| {
                Ok(WorkingSetEntry::new(
                    convert::col::<String>(r, 0)?,
                    convert::col(r, 1)?,
                    u64::try_from(convert::col::<i64>(r, 2)?).unwrap_or(0),
                ))
            },
        )
        .await
    }

    /// One statement: the version (0 without one) joined with the set's rows.
    async fn versioned_working_set(&self, session: &str) -> Result<StoredWorkingSet, StoreError> {
        let rows = self
            .query(
                "SELECT v.version, t.tool, t.last_used, t.round
                 FROM (SELECT COALESCE(max(version), 0) AS version
                       FROM session_versions WHERE session = $1) v
                 LEFT JOIN session_tools t ON t.session = $1
                 ORDER BY t.tool",
                &[&session],
                |r| {
                    let version = u64::try_from(convert::col::<i64>(r, 0)?).unwrap_or(0);
                    let entry = match convert::col::<Option<String>>(r, 1)? {
                        Some(tool) => Some(WorkingSetEntry::new(
                            tool,
                            convert::col(r, 2)?,
                            u64::try_from(convert::col::<i64>(r, 3)?).unwrap_or(0),
                        )),
                        None => None,
                    };
                    Ok((version, entry))
                },
            )
            .await?;
        let version = rows.first().map_or(0, |(v, _)| *v);
        Ok(StoredWorkingSet::new(
            version,
            rows.into_iter().filter_map(|(_, e)| e).collect(),
        ))
    }

    /// One statement (arrays unnested): the tools not among the entries deleted, the
    /// entries written (the last entry of a tool wins), the version moved on.
    async fn replace_working_set(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
    ) -> Result<u64, StoreError> {
        let last: BTreeMap<&str, &WorkingSetEntry> =
            entries.iter().map(|e| (e.tool.as_str(), e)).collect();
        let tools: Vec<&str> = last.keys().copied().collect();
        let used: Vec<SystemTime> = last.values().map(|e| e.last_used).collect();
        let rounds: Vec<i64> = last
            .values()
            .map(|e| i64::try_from(e.round).unwrap_or(i64::MAX))
            .collect();
        let versions = self
            .query(
                "WITH gone AS (
                     DELETE FROM session_tools WHERE session = $1 AND tool <> ALL($2::text[])
                 ), kept AS (
                     INSERT INTO session_tools (session, tool, last_used, round)
                     SELECT $1, t, u, r
                     FROM unnest($2::text[], $3::timestamptz[], $4::bigint[]) AS e(t, u, r)
                     ON CONFLICT (session, tool) DO UPDATE
                     SET last_used = excluded.last_used, round = excluded.round
                 )
                 INSERT INTO session_versions (session, version) VALUES ($1, 1)
                 ON CONFLICT (session) DO UPDATE SET version = session_versions.version + 1
                 RETURNING version",
                &[&session, &tools, &used, &rounds],
                |r| convert::col::<i64>(r, 0),
            )
            .await?;
        Ok(versions
            .first()
            .map_or(0, |v| u64::try_from(*v).unwrap_or(0)))
    }

    /// One statement: the version moves on only from `expected`, and the rows are replaced
    /// only when it did. From 0 it is a first insert, which a concurrent first insert makes
    /// do nothing; from another version an update, which waits for a concurrent writer's
    /// row lock and then finds the version moved.
    async fn replace_working_set_if(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
        expected: u64,
    ) -> Result<Option<u64>, StoreError> {
        let last: BTreeMap<&str, &WorkingSetEntry> =
            entries.iter().map(|e| (e.tool.as_str(), e)).collect();
        let tools: Vec<&str> = last.keys().copied().collect();
        let used: Vec<SystemTime> = last.values().map(|e| e.last_used).collect();
        let rounds: Vec<i64> = last
            .values()
            .map(|e| i64::try_from(e.round).unwrap_or(i64::MAX))
            .collect();
        let expected = i64::try_from(expected).unwrap_or(i64::MAX - 1);
        let versions = self
            .query(
                "WITH first AS (
                     INSERT INTO session_versions (session, version)
                     SELECT $1, 1 WHERE $5::bigint = 0
                     ON CONFLICT (session) DO NOTHING
                     RETURNING version
                 ), next AS (
                     UPDATE session_versions SET version = version + 1
                     WHERE session = $1 AND version = $5::bigint AND $5::bigint <> 0
                     RETURNING version
                 ), ok AS (
                     SELECT version FROM first UNION ALL SELECT version FROM next
                 ), gone AS (
                     DELETE FROM session_tools
                     WHERE session = $1 AND tool <> ALL($2::text[]) AND EXISTS (SELECT 1 FROM ok)
                 ), kept AS (
                     INSERT INTO session_tools (session, tool, last_used, round)
                     SELECT $1, t, u, r
                     FROM unnest($2::text[], $3::timestamptz[], $4::bigint[]) AS e(t, u, r)
                     WHERE EXISTS (SELECT 1 FROM ok)
                     ON CONFLICT (session, tool) DO UPDATE
                     SET last_used = excluded.last_used, round = excluded.round
                 )
                 SELECT version FROM ok",
                &[&session, &tools, &used, &rounds, &expected],
                |r| convert::col::<i64>(r, 0),
            )
            .await?;
        Ok(versions.first().map(|v| u64::try_from(*v).unwrap_or(0)))
    }

    async fn record_failed_approach(
        &self,
        session: &str,
        args_hash: &str,
        tool: &str,
        error: &str,
    ) -> Result<u32, StoreError> {
        let counts = self
            .query(
                "INSERT INTO session_failures (session, args_hash, tool, error, count, last_at)
                 VALUES ($1, $2, $3, $4, 1, $5)
                 ON CONFLICT (session, args_hash) DO UPDATE
                 SET count = session_failures.count + 1, tool = excluded.tool,
                     error = excluded.error, last_at = excluded.last_at
                 RETURNING count",
                &[&session, &args_hash, &tool, &error, &SystemTime::now()],
                |r| convert::col::<i32>(r, 0),
            )
            .await?;
        Ok(counts.first().map_or(0, |c| u32::try_from(*c).unwrap_or(0)))
    }

    async fn failed_approaches(&self, session: &str) -> Result<Vec<FailedApproach>, StoreError> {
        self.query(
            "SELECT args_hash, tool, error, count, last_at FROM session_failures
             WHERE session = $1 ORDER BY args_hash",
            &[&session],
            |r| {
                Ok(FailedApproach::new(
                    convert::col::<String>(r, 0)?,
                    convert::col::<String>(r, 1)?,
                    convert::col::<String>(r, 2)?,
                    u32::try_from(convert::col::<i32>(r, 3)?).unwrap_or(0),
                    convert::col(r, 4)?,
                ))
            },
        )
        .await
    }

    async fn end_session(&self, session: &str) -> Result<(), StoreError> {
        let loc = self.location();
        let mut client = self.client().await?;
        let tx = client.transaction().await.at(loc)?;
        tx.execute("DELETE FROM session_tools WHERE session = $1", &[&session])
            .await
            .at(loc)?;
        tx.execute(
            "DELETE FROM session_versions WHERE session = $1",
            &[&session],
        )
        .await
        .at(loc)?;
        tx.execute(
            "DELETE FROM session_failures WHERE session = $1",
            &[&session],
        )
        .await
        .at(loc)?;
        tx.commit().await.at(loc)
    }

    async fn state(&self, key: &str) -> Result<Option<SurfaceState>, StoreError> {
        let rows = self
            .query(
                "SELECT value, written_at FROM surface_state WHERE key = $1",
                &[&key],
                |r| Ok(SurfaceState::new(convert::col(r, 0)?, convert::col(r, 1)?)),
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn put_state(&self, key: &str, value: Value) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO surface_state (key, value, written_at) VALUES ($1, $2, $3)
             ON CONFLICT (key) DO UPDATE
             SET value = excluded.value, written_at = excluded.written_at",
            &[&key, &value, &SystemTime::now()],
        )
        .await?;
        Ok(())
    }

    /// Yes: every replica on the database shares it.
    fn shared(&self) -> bool {
        true
    }

    /// A session-level advisory lock per role, on a connection of its own (see
    /// `PgStore::lead_role`).
    async fn lead(&self, role: &str) -> Result<bool, StoreError> {
        self.lead_role(role).await
    }
}
