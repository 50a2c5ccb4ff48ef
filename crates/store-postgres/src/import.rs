//! Copying another store's rows in (`quiver store migrate`): every row is keyed, so a second
//! run adds nothing and rows the database already has (written since by a server) are kept
//! as they are; and the check afterwards, which counts how many of the rows are there.

use futures::pin_mut;
use quiver_registry::store::{LoggedCall, StoreError, ToolDefinition, ToolJob};
use quiver_surface::ports::{FailedApproach, SurfaceState, WorkingSetEntry};
use serde_json::Value;
use tokio_postgres::{binary_copy::BinaryCopyInWriter, types::ToSql};

use crate::{
    PgStore,
    convert::{LOG_TYPES, definition_params, micros},
    error::ResultExt,
};

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

/// The temp table the log rows are copied into before the keyed insert.
const STAGE: &str = "CREATE TEMP TABLE quiver_import_log ON COMMIT DROP AS
    SELECT tool_name, tenant, session, principal, call_id, parent_call_id, input_data,
        reasoning, args_hash, kind, hint_kind, err_kind, success, error, output_summary, output,
        queued_us, took_us, created_at
    FROM execution_log WITH NO DATA";

const LOG_COLUMNS: &str = "tool_name, tenant, session, principal, call_id, parent_call_id, \
    input_data, reasoning, args_hash, kind, hint_kind, err_kind, success, error, \
    output_summary, output, queued_us, took_us, created_at";

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
            tx.batch_execute(STAGE).await.at(loc)?;
            let sink = tx
                .copy_in(&format!(
                    "COPY quiver_import_log ({LOG_COLUMNS}) FROM STDIN BINARY"
                ))
                .await
                .at(loc)?;
            let writer = BinaryCopyInWriter::new(sink, &LOG_TYPES);
            pin_mut!(writer);
            for c in &data.calls {
                let row = LoggedRow::of(c);
                writer.as_mut().write(&row.values()).await.at(loc)?;
            }
            writer.finish().await.at(loc)?;
            new.calls = tx
                .execute(
                    &format!(
                        "INSERT INTO execution_log ({LOG_COLUMNS})
                         SELECT DISTINCT ON (call_id, created_at) {LOG_COLUMNS}
                         FROM quiver_import_log i
                         WHERE NOT EXISTS (SELECT 1 FROM execution_log l
                             WHERE l.call_id = i.call_id AND l.created_at = i.created_at)
                         ORDER BY call_id, created_at"
                    ),
                    &[],
                )
                .await
                .at(loc)?;
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

/// One log row read from another store, as [`LOG_TYPES`] takes it.
struct LoggedRow<'a> {
    c: &'a LoggedCall,
    hint_kind: Option<&'static str>,
    err_kind: Option<&'a str>,
    output: Option<Value>,
    queued_us: i64,
    took_us: i64,
}

impl<'a> LoggedRow<'a> {
    fn of(c: &'a LoggedCall) -> Self {
        LoggedRow {
            c,
            hint_kind: c.hint_kind.map(quiver_contract::HintKind::as_str),
            err_kind: c.err_kind.as_ref().map(quiver_contract::ErrKind::as_str),
            output: c.output.as_ref().and_then(|o| serde_json::to_value(o).ok()),
            queued_us: micros(c.queued),
            took_us: micros(c.took),
        }
    }

    fn values(&self) -> [&(dyn ToSql + Sync); 19] {
        let c = self.c;
        [
            &c.tool_name,
            &c.tenant,
            &c.session,
            &c.principal,
            &c.call_id,
            &c.parent_call_id,
            &c.input,
            &c.reasoning,
            &c.args_hash,
            &c.kind,
            &self.hint_kind,
            &self.err_kind,
            &c.success,
            &c.error,
            &c.output_summary,
            &self.output,
            &self.queued_us,
            &self.took_us,
            &c.at,
        ]
    }
}
