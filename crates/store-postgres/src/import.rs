//! Copying another store's rows in (`quiver store migrate`): every row is keyed, so a second
//! run adds nothing and rows the database already has (written since by a server) are kept
//! as they are; and the check afterwards, which counts how many of the rows are there.

use quiver_registry::{
    chain::LogEntry,
    store::{LoggedCall, StoreError, ToolDefinition, ToolJob},
};
use quiver_surface::ports::{FailedApproach, SurfaceState, WorkingSetEntry};
use tokio_postgres::types::ToSql;

use crate::{PgStore, convert::definition_params, error::ResultExt};

/// The rows to copy into a PostgreSQL store.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Import {
    /// Tool definitions, custom tools included (deleted ones too, as soft deletes).
    pub definitions: Vec<ToolDefinition>,
    /// Custom-tool jobs.
    pub jobs: Vec<ToolJob>,
    /// Execution-log rows, with their full outputs.
    pub calls: Vec<LoggedCall>,
    /// Working-set entries, each with its session.
    pub working: Vec<(String, WorkingSetEntry)>,
    /// Failed approaches, each with its session.
    pub failures: Vec<(String, FailedApproach)>,
    /// Surface state (the resident floor), by key.
    pub state: Vec<(String, SurfaceState)>,
}

/// Rows of each kind: how many an [`Import`] holds, or how many of them a store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImportCounts {
    /// Tool definitions.
    pub definitions: u64,
    /// Jobs.
    pub jobs: u64,
    /// Execution-log rows (distinct by call id and time).
    pub calls: u64,
    /// Working-set entries.
    pub working: u64,
    /// Failed approaches.
    pub failures: u64,
    /// Surface-state keys.
    pub state: u64,
}

impl Import {
    /// How many rows of each kind it holds (log rows distinct by call id and time, as they
    /// are keyed).
    pub fn counts(&self) -> ImportCounts {
        let calls: std::collections::BTreeSet<(&str, std::time::SystemTime)> = self
            .calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.at))
            .collect();
        ImportCounts {
            definitions: self.definitions.len() as u64,
            jobs: self.jobs.len() as u64,
            calls: calls.len() as u64,
            working: self.working.len() as u64,
            failures: self.failures.len() as u64,
            state: self.state.len() as u64,
        }
    }
}

impl PgStore {
    /// Copies `data` in, in one transaction. A row whose key the database has already (a
    /// definition's name, a job's id, a session's tool or args hash, a state key, a log
    /// row's call id and time) is left as it is: running it twice adds nothing. Returns how
    /// many rows were new.
    pub async fn import(&self, data: &Import) -> Result<ImportCounts, StoreError> {
        let loc = self.location().to_owned();
        let loc = loc.as_str();
        let mut client = self.pool_client().await?;
        let tx = client.transaction().await.at(loc)?;
        let mut new = ImportCounts::default();
        let now = std::time::SystemTime::now();
        let put_def = tx
            .prepare(&format!(
                "{} ON CONFLICT (name) DO NOTHING",
                crate::convert::INSERT_DEFINITION
            ))
            .await
            .at(loc)?;
        for def in &data.definitions {
            let params = definition_params(def, now);
            new.definitions += tx.execute(&put_def, &params.as_refs()).await.at(loc)?;
        }
        let put_job = tx
            .prepare(
                "INSERT INTO tool_jobs (id, tool_name, job_type, status, spec, result,
                    progress_pct, tenant, conversation, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 ON CONFLICT (id) DO NOTHING",
            )
            .await
            .at(loc)?;
        for j in &data.jobs {
            new.jobs += tx
                .execute(
                    &put_job,
                    &[
                        &j.id,
                        &j.tool_name,
                        &j.job_type.as_str(),
                        &j.status.as_str(),
                        &j.spec,
                        &j.result,
                        &i16::from(j.progress_pct),
                        &j.tenant,
                        &j.conversation,
                        &j.created_at,
                        &j.updated_at,
                    ],
                )
                .await
                .at(loc)?;
        }
        let put_tool = tx
            .prepare(
                "INSERT INTO session_tools (session, tool, last_used, round)
                 VALUES ($1, $2, $3, $4) ON CONFLICT (session, tool) DO NOTHING",
            )
            .await
            .at(loc)?;
        for (session, e) in &data.working {
            let round = i64::try_from(e.round).unwrap_or(i64::MAX);
            new.working += tx
                .execute(&put_tool, &[session, &e.tool, &e.last_used, &round])
                .await
                .at(loc)?;
        }
        let put_failure = tx
            .prepare(
                "INSERT INTO session_failures (session, args_hash, tool, error, count, last_at)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (session, args_hash) DO NOTHING",
            )
            .await
            .at(loc)?;
        for (session, f) in &data.failures {
            let count = i32::try_from(f.count).unwrap_or(i32::MAX);
            new.failures += tx
                .execute(
                    &put_failure,
                    &[session, &f.args_hash, &f.tool, &f.error, &count, &f.last_at],
                )
                .await
                .at(loc)?;
        }
        for (key, state) in &data.state {
            new.state += tx
                .execute(
                    "INSERT INTO surface_state (key, value, written_at) VALUES ($1, $2, $3)
                     ON CONFLICT (key) DO NOTHING",
                    &[key, &state.value, &state.written_at],
                )
                .await
                .at(loc)?;
        }
        if !data.calls.is_empty() {
            // The chain's head is locked before the rows already there are looked for, so a
            // copy running at the same time (another `quiver store migrate`) either
            // committed its rows before this look or waits for this one to commit: no row is
            // appended twice. (Each statement of this transaction sees what was committed
            // before it began, the lock's wait included.)
            tx.execute("SELECT 1 FROM log_chain WHERE id = 1 FOR UPDATE", &[])
                .await
                .at(loc)?;
            // Only the rows the database does not hold yet (by call id and time), once
            // each, appended to the chain in the order they were dispatched.
            let (ids, ats): (Vec<&str>, Vec<std::time::SystemTime>) = data
                .calls
                .iter()
                .map(|c| (c.call_id.as_str(), c.at))
                .unzip();
            let present: std::collections::HashSet<(String, std::time::SystemTime)> = tx
                .query(
                    "SELECT l.call_id, l.created_at FROM execution_log l
                     JOIN unnest($1::text[], $2::timestamptz[]) u(c, t)
                       ON l.call_id = u.c AND l.created_at = u.t",
                    &[&ids, &ats],
                )
                .await
                .at(loc)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let mut fresh: Vec<&LoggedCall> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for c in &data.calls {
                // The database keeps microseconds: compare at that precision.
                let at = std::time::UNIX_EPOCH
                    + std::time::Duration::from_micros(
                        u64::try_from(quiver_registry::chain::epoch_micros(c.at)).unwrap_or(0),
                    );
                if !present.contains(&(c.call_id.clone(), at))
                    && seen.insert((c.call_id.as_str(), at))
                {
                    fresh.push(c);
                }
            }
            fresh.sort_by(|a, b| (a.at, &a.call_id).cmp(&(b.at, &b.call_id)));
            let entries: Vec<LogEntry<'_>> = fresh.iter().map(|c| LogEntry::of_logged(c)).collect();
            crate::writer::append_chained(&tx, loc, &entries).await?;
            new.calls = entries.len() as u64;
        }
        tx.commit().await.at(loc)?;
        Ok(new)
    }

    /// How many of `data`'s rows the database holds, by their keys: after an [`import`],
    /// each count equals [`Import::counts`].
    ///
    /// [`import`]: PgStore::import
    pub async fn count_present(&self, data: &Import) -> Result<ImportCounts, StoreError> {
        let loc = self.location().to_owned();
        let loc = loc.as_str();
        let client = self.pool_client().await?;
        let count = async |sql: &str, params: &[&(dyn ToSql + Sync)]| {
            client
                .query_one(sql, params)
                .await
                .at(loc)
                .map(|r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0))
        };
        let names: Vec<&str> = data.definitions.iter().map(|d| d.name.as_str()).collect();
        let jobs: Vec<&str> = data.jobs.iter().map(|j| j.id.as_str()).collect();
        let (ws_s, ws_t): (Vec<&str>, Vec<&str>) = data
            .working
            .iter()
            .map(|(s, e)| (s.as_str(), e.tool.as_str()))
            .unzip();
        let (f_s, f_h): (Vec<&str>, Vec<&str>) = data
            .failures
            .iter()
            .map(|(s, f)| (s.as_str(), f.args_hash.as_str()))
            .unzip();
        let keys: Vec<&str> = data.state.iter().map(|(k, _)| k.as_str()).collect();
        let (c_id, c_at): (Vec<&str>, Vec<std::time::SystemTime>) = data
            .calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.at))
            .unzip();
        Ok(ImportCounts {
            definitions: count(
                "SELECT count(*) FROM tool_definitions WHERE name = ANY($1)",
                &[&names],
            )
            .await?,
            jobs: count("SELECT count(*) FROM tool_jobs WHERE id = ANY($1)", &[&jobs]).await?,
            calls: count(
                "SELECT count(*) FROM (SELECT DISTINCT c, t FROM unnest($1::text[], $2::timestamptz[]) u(c, t)
                 WHERE EXISTS (SELECT 1 FROM execution_log l WHERE l.call_id = u.c AND l.created_at = u.t)) d",
                &[&c_id, &c_at],
            )
            .await?,
            working: count(
                "SELECT count(*) FROM unnest($1::text[], $2::text[]) u(s, t)
                 WHERE EXISTS (SELECT 1 FROM session_tools w WHERE w.session = u.s AND w.tool = u.t)",
                &[&ws_s, &ws_t],
            )
            .await?,
            failures: count(
                "SELECT count(*) FROM unnest($1::text[], $2::text[]) u(s, h)
                 WHERE EXISTS (SELECT 1 FROM session_failures f WHERE f.session = u.s AND f.args_hash = u.h)",
                &[&f_s, &f_h],
            )
            .await?,
            state: count(
                "SELECT count(*) FROM surface_state WHERE key = ANY($1)",
                &[&keys],
            )
            .await?,
        })
    }
}
