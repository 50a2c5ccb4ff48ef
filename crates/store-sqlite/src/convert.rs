//! Conversions between the port's `contract`/core types and SQLite rows, all in one place.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quiver_contract::{Category, Envelope, ErrKind, HintKind};
use quiver_registry::chain::{ChainPoint, ChainedRow, LogEntry};
use quiver_registry::{
    CallRecord,
    store::{
        JobStatus, JobType, LoggedCall, NewJob, StoreError, ToolDefinition, ToolJob, ToolType,
        parse_lifecycle,
    },
};
use rusqlite::{Row, Statement, params};
use serde_json::Value;

/// Microseconds since the Unix epoch (0 before it).
pub(crate) fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The time `us` microseconds after the Unix epoch.
pub(crate) fn time(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn json(text: &str, what: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::invalid_data(format!("{what} is not JSON: {e}")))
}

/// Reads a column, turning a type mismatch into [`StoreError::InvalidData`].
fn col<T: rusqlite::types::FromSql>(row: &Row<'_>, idx: usize) -> Result<T, StoreError> {
    row.get(idx)
        .map_err(|e| StoreError::invalid_data(format!("column {idx}: {e}")))
}

/// The columns of `tool_definitions`, in the order [`definition`] reads them.
pub(crate) const DEF_COLUMNS: &str = "name, description, input_schema, implementation, tool_type, \
    status, enabled, category, domain, replaced_by_model_capability, status_message, \
    large_output, parent_tool, dependencies, version, tenant_id, created_by, rejection_reason, \
    test_results, deleted_at, embedding, test_cases, pending, embedding_key";

fn embedding_blob(e: &[f32]) -> Vec<u8> {
    e.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn embedding(blob: &[u8]) -> Vec<f32> {
    blob.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A definition row (columns as [`DEF_COLUMNS`]).
pub(crate) fn definition(row: &Row<'_>) -> Result<ToolDefinition, StoreError> {
    let name: String = col(row, 0)?;
    let tool_type: String = col(row, 4)?;
    let status: String = col(row, 5)?;
    let mut def = ToolDefinition::from_spec(
        &quiver_contract::ToolSpec::new(name.clone(), String::new()),
        ToolType::parse(&tool_type).ok_or_else(|| {
            StoreError::invalid_data(format!("`{name}`: tool type {tool_type:?}"))
        })?,
        col::<String>(row, 3)?,
    );
    def.description = col(row, 1)?;
    def.input_schema = json(&col::<String>(row, 2)?, "input_schema")?;
    def.status = parse_lifecycle(&status)
        .ok_or_else(|| StoreError::invalid_data(format!("`{name}`: status {status:?}")))?;
    def.enabled = col(row, 6)?;
    def.category = Category(col(row, 7)?);
    def.domain = col(row, 8)?;
    def.replaced_by_model_capability = col(row, 9)?;
    def.status_message = col(row, 10)?;
    def.large_output = col(row, 11)?;
    def.parent_tool = col(row, 12)?;
    def.dependencies = serde_json::from_str(&col::<String>(row, 13)?)
        .map_err(|e| StoreError::invalid_data(format!("`{name}`: dependencies: {e}")))?;
    def.version = col(row, 14)?;
    def.tenant_id = col(row, 15)?;
    def.created_by = col(row, 16)?;
    def.rejection_reason = col(row, 17)?;
    def.test_results = col::<Option<String>>(row, 18)?
        .map(|t| json(&t, "test_results"))
        .transpose()?;
    def.deleted_at = col::<Option<i64>>(row, 19)?.map(time);
    def.embedding = col::<Option<Vec<u8>>>(row, 20)?.map(|b| embedding(&b));
    def.test_cases = col::<Option<String>>(row, 21)?
        .map(|t| json(&t, "test_cases"))
        .transpose()?;
    def.pending = col::<Option<String>>(row, 22)?
        .map(|t| json(&t, "pending"))
        .transpose()?;
    def.embedding_key = col(row, 23)?;
    Ok(def)
}

/// Upserts a whole definition row (`created_at` kept on update).
pub(crate) fn write_definition(
    conn: &rusqlite::Connection,
    def: &ToolDefinition,
    now: SystemTime,
) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO tool_definitions (name, description, input_schema, implementation,
            tool_type, status, enabled, category, domain, replaced_by_model_capability,
            status_message, large_output, parent_tool, dependencies, version, tenant_id,
            created_by, rejection_reason, test_results, deleted_at, embedding, created_at,
            updated_at, test_cases, pending, embedding_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
            ?18, ?19, ?20, ?21, ?22, ?22, ?23, ?24, ?25)
         ON CONFLICT (name) DO UPDATE SET description = excluded.description,
            input_schema = excluded.input_schema, implementation = excluded.implementation,
            tool_type = excluded.tool_type, status = excluded.status,
            enabled = excluded.enabled, category = excluded.category, domain = excluded.domain,
            replaced_by_model_capability = excluded.replaced_by_model_capability,
            status_message = excluded.status_message, large_output = excluded.large_output,
            parent_tool = excluded.parent_tool, dependencies = excluded.dependencies,
            version = excluded.version, tenant_id = excluded.tenant_id,
            created_by = excluded.created_by, rejection_reason = excluded.rejection_reason,
            test_results = excluded.test_results, deleted_at = excluded.deleted_at,
            embedding = excluded.embedding, updated_at = excluded.updated_at,
            test_cases = excluded.test_cases, pending = excluded.pending,
            embedding_key = excluded.embedding_key",
    )?;
    stmt.execute(params![
        def.name,
        def.description,
        def.input_schema.to_string(),
        def.implementation,
        def.tool_type.as_str(),
        def.status.as_str(),
        def.enabled,
        def.category.0,
        def.domain,
        def.replaced_by_model_capability,
        def.status_message,
        def.large_output,
        def.parent_tool,
        serde_json::to_string(&def.dependencies).unwrap_or_else(|_| "[]".into()),
        def.version,
        def.tenant_id,
        def.created_by,
        def.rejection_reason,
        def.test_results.as_ref().map(Value::to_string),
        def.deleted_at.map(micros),
        def.embedding.as_deref().map(embedding_blob),
        micros(now),
        def.test_cases.as_ref().map(Value::to_string),
        def.pending.as_ref().map(Value::to_string),
        def.embedding_key,
    ])?;
    Ok(())
}

/// The columns of `tool_jobs`, in the order [`job`] reads them.
pub(crate) const JOB_COLUMNS: &str = "id, tool_name, job_type, status, spec, result, \
    progress_pct, tenant, conversation, created_at, updated_at";

/// A job row (columns as [`JOB_COLUMNS`]).
pub(crate) fn job(row: &Row<'_>) -> Result<ToolJob, StoreError> {
    let id: String = col(row, 0)?;
    let job_type: String = col(row, 2)?;
    let status: String = col(row, 3)?;
    let mut job = ToolJob::queued(
        NewJob::new(
            id.clone(),
            col::<String>(row, 1)?,
            JobType::parse(&job_type).ok_or_else(|| {
                StoreError::invalid_data(format!("job `{id}`: type {job_type:?}"))
            })?,
            json(&col::<String>(row, 4)?, "job spec")?,
        ),
        time(col(row, 9)?),
    );
    job.status = JobStatus::parse(&status)
        .ok_or_else(|| StoreError::invalid_data(format!("job `{id}`: status {status:?}")))?;
    job.result = col::<Option<String>>(row, 5)?
        .map(|t| json(&t, "job result"))
        .transpose()?;
    job.progress_pct = col(row, 6)?;
    job.tenant = col(row, 7)?;
    job.conversation = col(row, 8)?;
    job.updated_at = time(col(row, 10)?);
    Ok(job)
}

/// Inserts one execution-log row (its stored form `e`, at chain point `at`) and its full
/// output, with the two cached statements.
pub(crate) fn insert_call(
    log: &mut Statement<'_>,
    output: &mut Statement<'_>,
    conn: &rusqlite::Connection,
    e: &LogEntry<'_>,
    at: ChainPoint,
) -> rusqlite::Result<()> {
    log.execute(params![
        e.tool_name,
        e.tenant,
        e.session,
        e.call_id,
        e.input_data,
        e.reasoning,
        e.args_hash,
        e.kind,
        e.hint_kind,
        e.err_kind,
        e.success,
        e.error,
        e.output_summary,
        e.queued_us,
        e.took_us,
        e.created_at_us,
        e.principal,
        e.parent_call_id,
        i64::try_from(at.seq).unwrap_or(i64::MAX),
        &at.link[..],
        e.trace_id,
    ])?;
    let id = conn.last_insert_rowid();
    output.execute(params![id, e.output])?;
    Ok(())
}

/// The statement [`insert_call`] expects as `log`.
pub(crate) const INSERT_LOG: &str = "INSERT INTO execution_log (tool_name, tenant, session,
    call_id, input_data, reasoning, args_hash, kind, hint_kind, err_kind, success, error,
    output_summary, queued_us, took_us, created_at, principal, parent_call_id, chain_seq,
    chain_link, trace_id)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
    ?19, ?20, ?21)";

/// The columns of a chained row, in the order [`chained_row`] reads them (`o`: the output).
pub(crate) const CHAIN_COLUMNS: &str = "l.id, l.chain_seq, l.chain_link, l.tool_name, \
    l.tenant, l.session, l.principal, l.call_id, l.parent_call_id, l.input_data, l.reasoning, \
    l.args_hash, l.kind, l.hint_kind, l.err_kind, l.success, l.error, l.output_summary, \
    o.output, l.queued_us, l.took_us, l.created_at, l.trace_id";

/// A chained row (columns as [`CHAIN_COLUMNS`]). Values are read as they are stored, so a
/// value changed behind Quiver's back (even to another type) is read, and shows as a link
/// that no longer matches, rather than failing the read.
pub(crate) fn chained_row(row: &Row<'_>) -> Result<ChainedRow, StoreError> {
    use rusqlite::types::Value as V;
    use std::borrow::Cow;
    let raw = |i: usize| -> Result<V, StoreError> { col::<V>(row, i) };
    let text = |i: usize| -> Result<Option<Cow<'static, str>>, StoreError> {
        Ok(match raw(i)? {
            V::Null => None,
            V::Text(t) => Some(Cow::Owned(t)),
            V::Integer(n) => Some(Cow::Owned(n.to_string())),
            V::Real(f) => Some(Cow::Owned(f.to_string())),
            V::Blob(b) => Some(Cow::Owned(String::from_utf8_lossy(&b).into_owned())),
        })
    };
    let must = |i: usize| -> Result<Cow<'static, str>, StoreError> {
        Ok(text(i)?.unwrap_or(Cow::Borrowed("")))
    };
    let int = |i: usize| -> Result<i64, StoreError> {
        Ok(match raw(i)? {
            V::Integer(n) => n,
            V::Real(f) => f as i64,
            _ => i64::MIN,
        })
    };
    let link = match raw(2)? {
        V::Blob(b) => quiver_registry::chain::link_as_stored(&b),
        _ => [0; 32],
    };
    let entry = LogEntry {
        tool_name: must(3)?,
        tenant: text(4)?,
        session: text(5)?,
        principal: text(6)?,
        call_id: must(7)?,
        parent_call_id: text(8)?,
        input_data: must(9)?,
        reasoning: text(10)?,
        args_hash: must(11)?,
        kind: must(12)?,
        hint_kind: text(13)?,
        err_kind: text(14)?,
        success: int(15)? == 1,
        error: text(16)?,
        output_summary: must(17)?,
        output: must(18)?,
        queued_us: int(19)?,
        took_us: int(20)?,
        created_at_us: int(21)?,
        trace_id: text(22)?,
    };
    let seq = u64::try_from(int(1)?).unwrap_or(0);
    Ok(ChainedRow::new(int(0)?, ChainPoint { seq, link }, entry))
}

/// The statement [`insert_call`] expects as `output`.
pub(crate) const INSERT_OUTPUT: &str =
    "INSERT INTO execution_output (log_id, output) VALUES (?1, ?2)";

/// The columns of an execution-log read, in the order [`logged_call`] reads them; the last
/// is the full output (NULL unless joined).
pub(crate) const LOG_COLUMNS: &str = "l.tool_name, l.tenant, l.session, l.call_id, \
    l.input_data, l.reasoning, l.args_hash, l.kind, l.hint_kind, l.err_kind, l.success, \
    l.error, l.output_summary, l.queued_us, l.took_us, l.created_at, l.principal, \
    l.parent_call_id, l.trace_id";

/// An execution-log row (columns as [`LOG_COLUMNS`], then the row id and the output).
pub(crate) fn logged_call(row: &Row<'_>) -> Result<LoggedCall, StoreError> {
    let hint_kind = col::<Option<String>>(row, 8)?
        .map(|h| {
            serde_json::from_value::<HintKind>(Value::String(h.clone()))
                .map_err(|_| StoreError::invalid_data(format!("hint kind {h:?}")))
        })
        .transpose()?;
    let output = col::<Option<String>>(row, 20)?
        .map(|o| {
            serde_json::from_str::<Envelope>(&o)
                .map_err(|e| StoreError::invalid_data(format!("stored output: {e}")))
        })
        .transpose()?;
    let mut call = LoggedCall::from_record(&CallRecord::new(
        col::<String>(row, 0)?,
        col::<String>(row, 3)?,
        json(&col::<String>(row, 4)?, "input_data")?,
        Envelope::text(""),
    ));
    call.row = u64::try_from(col::<i64>(row, 19)?).unwrap_or(0);
    call.tenant = col(row, 1)?;
    call.principal = col(row, 16)?;
    call.parent_call_id = col(row, 17)?;
    call.trace_id = col(row, 18)?;
    call.session = col(row, 2)?;
    call.reasoning = col(row, 5)?;
    call.args_hash = col(row, 6)?;
    call.kind = col(row, 7)?;
    call.hint_kind = hint_kind;
    call.err_kind = col::<Option<String>>(row, 9)?.map(|k| ErrKind::parse(&k));
    call.success = col(row, 10)?;
    call.error = col(row, 11)?;
    call.output_summary = col(row, 12)?;
    call.output = output;
    call.queued = Duration::from_micros(u64::try_from(col::<i64>(row, 13)?).unwrap_or(0));
    call.took = Duration::from_micros(u64::try_from(col::<i64>(row, 14)?).unwrap_or(0));
    call.at = time(col(row, 15)?);
    Ok(call)
}
