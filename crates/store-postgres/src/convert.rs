//! Conversions between the port's `contract`/core types and PostgreSQL rows, all in one
//! place.

use std::time::{Duration, SystemTime};

use quiver_contract::{Category, Envelope, ErrKind, HintKind};
use quiver_registry::chain::{ChainPoint, ChainedRow, LogEntry, epoch_micros};
use quiver_registry::{
    CallRecord,
    store::{
        JobStatus, JobType, LoggedCall, NewJob, StoreError, ToolDefinition, ToolJob, ToolType,
        parse_lifecycle,
    },
};
use serde_json::Value;
use tokio_postgres::{
    Row,
    types::{FromSql, IsNull, ToSql, Type, to_sql_checked},
};

/// The duration of `us` microseconds (0 when negative).
pub(crate) fn duration(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// Reads a column, turning a type mismatch into [`StoreError::InvalidData`].
pub(crate) fn col<'a, T: FromSql<'a>>(row: &'a Row, idx: usize) -> Result<T, StoreError> {
    row.try_get(idx)
        .map_err(|e| StoreError::invalid_data(format!("column {idx}: {e}")))
}

/// The columns of `tool_definitions`, in the order [`definition`] reads them.
pub(crate) const DEF_COLUMNS: &str = "name, description, input_schema, implementation, tool_type, \
    status, enabled, category, domain, replaced_by_model_capability, status_message, \
    large_output, parent_tool, dependencies, version, tenant_id, created_by, rejection_reason, \
    test_results, deleted_at, embedding, test_cases, pending, embedding_key";

/// A definition row (columns as [`DEF_COLUMNS`]).
pub(crate) fn definition(row: &Row) -> Result<ToolDefinition, StoreError> {
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
    def.input_schema = col(row, 2)?;
    def.status = parse_lifecycle(&status)
        .ok_or_else(|| StoreError::invalid_data(format!("`{name}`: status {status:?}")))?;
    def.enabled = col(row, 6)?;
    def.category = Category(col(row, 7)?);
    def.domain = col(row, 8)?;
    def.replaced_by_model_capability = col(row, 9)?;
    def.status_message = col(row, 10)?;
    def.large_output = col(row, 11)?;
    def.parent_tool = col(row, 12)?;
    def.dependencies = serde_json::from_value(col::<Value>(row, 13)?)
        .map_err(|e| StoreError::invalid_data(format!("`{name}`: dependencies: {e}")))?;
    def.version = u32::try_from(col::<i64>(row, 14)?)
        .map_err(|_| StoreError::invalid_data(format!("`{name}`: version out of range")))?;
    def.tenant_id = col(row, 15)?;
    def.created_by = col(row, 16)?;
    def.rejection_reason = col(row, 17)?;
    def.test_results = col(row, 18)?;
    def.deleted_at = col(row, 19)?;
    def.embedding = col(row, 20)?;
    def.test_cases = col(row, 21)?;
    def.pending = col(row, 22)?;
    def.embedding_key = col(row, 23)?;
    Ok(def)
}

/// The upsert of a whole definition row (`created_at` kept on update), parameters as
/// [`definition_params`] gives them.
pub(crate) static WRITE_DEFINITION: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{INSERT_DEFINITION} {ON_CONFLICT_UPDATE}"));

/// [`WRITE_DEFINITION`] without its `ON CONFLICT` clause.
pub(crate) const INSERT_DEFINITION: &str = "INSERT INTO tool_definitions (name, description,
        input_schema, implementation, tool_type, status, enabled, category, domain,
        replaced_by_model_capability, status_message, large_output, parent_tool, dependencies,
        version, tenant_id, created_by, rejection_reason, test_results, deleted_at, embedding,
        created_at, updated_at, test_cases, pending, embedding_key)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
        $19, $20, $21, $22, $22, $23, $24, $25)";

/// The `ON CONFLICT` clause of [`WRITE_DEFINITION`].
const ON_CONFLICT_UPDATE: &str =
    "ON CONFLICT (name) DO UPDATE SET description = excluded.description,
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
        embedding_key = excluded.embedding_key";

/// The owned values of one definition row, in [`WRITE_DEFINITION`]'s parameter order.
pub(crate) struct DefinitionParams {
    values: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl DefinitionParams {
    /// The values as the driver takes them.
    pub(crate) fn as_refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.values
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

/// The parameters of [`WRITE_DEFINITION`] for `def`, written at `now`.
pub(crate) fn definition_params(def: &ToolDefinition, now: SystemTime) -> DefinitionParams {
    DefinitionParams {
        values: vec![
            Box::new(def.name.clone()),
            Box::new(def.description.clone()),
            Box::new(def.input_schema.clone()),
            Box::new(def.implementation.clone()),
            Box::new(def.tool_type.as_str()),
            Box::new(def.status.as_str()),
            Box::new(def.enabled),
            Box::new(def.category.0.clone()),
            Box::new(def.domain.clone()),
            Box::new(def.replaced_by_model_capability.clone()),
            Box::new(def.status_message.clone()),
            Box::new(def.large_output),
            Box::new(def.parent_tool.clone()),
            Box::new(Value::from(def.dependencies.clone())),
            Box::new(i64::from(def.version)),
            Box::new(def.tenant_id.clone()),
            Box::new(def.created_by.clone()),
            Box::new(def.rejection_reason.clone()),
            Box::new(def.test_results.clone()),
            Box::new(def.deleted_at),
            Box::new(def.embedding.clone()),
            Box::new(now),
            Box::new(def.test_cases.clone()),
            Box::new(def.pending.clone()),
            Box::new(def.embedding_key.clone()),
        ],
    }
}

/// The columns of `tool_jobs`, in the order [`job`] reads them.
pub(crate) const JOB_COLUMNS: &str = "id, tool_name, job_type, status, spec, result, \
    progress_pct, tenant, conversation, created_at, updated_at";

/// A job row (columns as [`JOB_COLUMNS`]).
pub(crate) fn job(row: &Row) -> Result<ToolJob, StoreError> {
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
            col::<Value>(row, 4)?,
        ),
        col(row, 9)?,
    );
    job.status = JobStatus::parse(&status)
        .ok_or_else(|| StoreError::invalid_data(format!("job `{id}`: status {status:?}")))?;
    job.result = col(row, 5)?;
    job.progress_pct = u8::try_from(col::<i16>(row, 6)?).unwrap_or(100).min(100);
    job.tenant = col(row, 7)?;
    job.conversation = col(row, 8)?;
    job.updated_at = col(row, 10)?;
    Ok(job)
}

/// The columns the log writer copies, in [`LOG_TYPES`]' order.
pub(crate) const COPY_LOG: &str = "COPY execution_log (tool_name, tenant, session, principal,
    call_id, parent_call_id, input_data, reasoning, args_hash, kind, hint_kind, err_kind,
    success, error, output_summary, output, queued_us, took_us, created_at, chain_seq,
    chain_link, trace_id) FROM STDIN BINARY";

/// The column types of [`COPY_LOG`].
pub(crate) const LOG_TYPES: [Type; 22] = [
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::JSON,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::BOOL,
    Type::TEXT,
    Type::TEXT,
    Type::JSON,
    Type::INT8,
    Type::INT8,
    Type::TIMESTAMPTZ,
    Type::INT8,
    Type::BYTEA,
    Type::TEXT,
];

/// JSON text sent as it is: a `json` column keeps the exact text, which the chain's link
/// was computed over.
#[derive(Debug)]
pub(crate) struct RawJson<'a>(pub(crate) &'a str);

impl ToSql for RawJson<'_> {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSON
    }

    to_sql_checked!();
}

/// One execution-log row's values, as [`COPY_LOG`] takes them.
pub(crate) struct LogRow<'a> {
    e: &'a LogEntry<'a>,
    input: RawJson<'a>,
    output: RawJson<'a>,
    at: SystemTime,
    seq: i64,
    link: &'a [u8],
}

impl<'a> LogRow<'a> {
    /// The row of entry `e` at chain point `p`.
    pub(crate) fn of(e: &'a LogEntry<'a>, p: &'a ChainPoint) -> Self {
        LogRow {
            e,
            input: RawJson(&e.input_data),
            output: RawJson(&e.output),
            at: SystemTime::UNIX_EPOCH
                + Duration::from_micros(u64::try_from(e.created_at_us).unwrap_or(0)),
            seq: i64::try_from(p.seq).unwrap_or(i64::MAX),
            link: &p.link,
        }
    }

    /// The values, in [`LOG_TYPES`]' order.
    pub(crate) fn values(&self) -> [&(dyn ToSql + Sync); 22] {
        let e = self.e;
        [
            &e.tool_name,
            &e.tenant,
            &e.session,
            &e.principal,
            &e.call_id,
            &e.parent_call_id,
            &self.input,
            &e.reasoning,
            &e.args_hash,
            &e.kind,
            &e.hint_kind,
            &e.err_kind,
            &e.success,
            &e.error,
            &e.output_summary,
            &self.output,
            &e.queued_us,
            &e.took_us,
            &self.at,
            &self.seq,
            &self.link,
            &e.trace_id,
        ]
    }
}

/// The columns of a chained row, in the order [`chained_row`] reads them.
pub(crate) const CHAIN_COLUMNS: &str = "id, chain_seq, chain_link, tool_name, tenant, session, \
    principal, call_id, parent_call_id, input_data::text, reasoning, args_hash, kind, \
    hint_kind, err_kind, success, error, output_summary, coalesce(output::text, ''), \
    queued_us, took_us, created_at, trace_id";

/// A chained row (columns as [`CHAIN_COLUMNS`]).
pub(crate) fn chained_row(row: &Row) -> Result<ChainedRow, StoreError> {
    use std::borrow::Cow;
    let text =
        |i| -> Result<Cow<'static, str>, StoreError> { Ok(Cow::Owned(col::<String>(row, i)?)) };
    let opt = |i| -> Result<Option<Cow<'static, str>>, StoreError> {
        Ok(col::<Option<String>>(row, i)?.map(Cow::Owned))
    };
    let entry = LogEntry {
        tool_name: text(3)?,
        tenant: opt(4)?,
        session: opt(5)?,
        principal: opt(6)?,
        call_id: text(7)?,
        parent_call_id: opt(8)?,
        input_data: text(9)?,
        reasoning: opt(10)?,
        args_hash: text(11)?,
        kind: text(12)?,
        hint_kind: opt(13)?,
        err_kind: opt(14)?,
        success: col(row, 15)?,
        error: opt(16)?,
        output_summary: text(17)?,
        output: text(18)?,
        queued_us: col(row, 19)?,
        took_us: col(row, 20)?,
        created_at_us: epoch_micros(col(row, 21)?),
        trace_id: opt(22)?,
    };
    let link = quiver_registry::chain::link_as_stored(&col::<Vec<u8>>(row, 2)?);
    let seq = u64::try_from(col::<i64>(row, 1)?).unwrap_or(0);
    Ok(ChainedRow::new(
        col(row, 0)?,
        ChainPoint { seq, link },
        entry,
    ))
}

/// The columns of an execution-log read, in the order [`logged_call`] reads them; the last
/// is the full output (NULL unless asked for).
pub(crate) const LOG_COLUMNS: &str = "tool_name, tenant, session, call_id, input_data, \
    reasoning, args_hash, kind, hint_kind, err_kind, success, error, output_summary, \
    queued_us, took_us, created_at, principal, parent_call_id, trace_id";

/// An execution-log row (columns as [`LOG_COLUMNS`], then the row id and the output).
pub(crate) fn logged_call(row: &Row) -> Result<LoggedCall, StoreError> {
    let hint_kind = col::<Option<String>>(row, 8)?
        .map(|h| {
            serde_json::from_value::<HintKind>(Value::String(h.clone()))
                .map_err(|_| StoreError::invalid_data(format!("hint kind {h:?}")))
        })
        .transpose()?;
    // A row copied in without its output (`quiver store migrate` from a row that had none)
    // holds JSON `null`: no output, as SQL NULL is.
    let output = col::<Option<Value>>(row, 20)?
        .filter(|o| !o.is_null())
        .map(|o| {
            serde_json::from_value::<Envelope>(o)
                .map_err(|e| StoreError::invalid_data(format!("stored output: {e}")))
        })
        .transpose()?;
    let mut call = LoggedCall::from_record(&CallRecord::new(
        col::<String>(row, 0)?,
        col::<String>(row, 3)?,
        col::<Value>(row, 4)?,
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
    call.queued = duration(col(row, 13)?);
    call.took = duration(col(row, 14)?);
    call.at = col(row, 15)?;
    Ok(call)
}
