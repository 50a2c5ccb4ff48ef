//! The numbered migrations and the open-time checks: the database is Quiver's (or empty),
//! its schema is not newer than this binary's, and the missing migrations are applied, one
//! server at a time.

use quiver_registry::store::StoreError;
use tokio_postgres::Client;

use crate::error::ResultExt;

/// The migrations, in order; migration `i` brings the schema to version `i + 1`. Never edit
/// one that has shipped: append a new one.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE quiver_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE tool_definitions (
    name                         TEXT PRIMARY KEY,
    description                  TEXT NOT NULL,
    input_schema                 JSON NOT NULL,
    implementation               TEXT NOT NULL,
    tool_type                    TEXT NOT NULL CHECK (tool_type IN ('system', 'custom', 'mcp')),
    status                       TEXT NOT NULL
                                 CHECK (status IN ('draft', 'testing', 'approved', 'rejected')),
    enabled                      BOOLEAN NOT NULL,
    category                     TEXT NOT NULL,
    domain                       TEXT,
    replaced_by_model_capability TEXT,
    status_message               TEXT,
    large_output                 BOOLEAN NOT NULL,
    parent_tool                  TEXT,
    dependencies                 JSON NOT NULL,
    version                      BIGINT NOT NULL,
    tenant_id                    TEXT NOT NULL,
    created_by                   TEXT,
    rejection_reason             TEXT,
    test_results                 JSON,
    deleted_at                   TIMESTAMPTZ,
    embedding                    REAL[],
    embedding_key                TEXT,
    test_cases                   JSON,
    pending                      JSON,
    created_at                   TIMESTAMPTZ NOT NULL,
    updated_at                   TIMESTAMPTZ NOT NULL
);
CREATE INDEX tool_definitions_visible ON tool_definitions (status, enabled, deleted_at, tenant_id);

-- Every change of a definition (but storing its search vector) bumps the version and
-- announces it on the channel `quiver_definitions`, so each server takes an approval made
-- through another one live at once.
CREATE TABLE definitions_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO definitions_version (id, version) VALUES (1, 0);
CREATE FUNCTION quiver_definitions_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v BIGINT;
BEGIN
    UPDATE definitions_version SET version = version + 1 WHERE id = 1 RETURNING version INTO v;
    PERFORM pg_notify('quiver_definitions', v::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER definitions_changed
    AFTER INSERT OR DELETE OR UPDATE OF name, description, input_schema, implementation,
        tool_type, status, enabled, category, domain, replaced_by_model_capability,
        status_message, large_output, parent_tool, dependencies, version, tenant_id,
        created_by, rejection_reason, test_results, deleted_at, created_at, updated_at,
        test_cases, pending
    ON tool_definitions
    FOR EACH STATEMENT EXECUTE FUNCTION quiver_definitions_changed();

CREATE TABLE execution_log (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tool_name      TEXT NOT NULL,
    tenant         TEXT,
    session        TEXT,
    principal      TEXT,
    call_id        TEXT NOT NULL,
    parent_call_id TEXT,
    input_data     JSON NOT NULL,
    reasoning      TEXT,
    args_hash      TEXT NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('ok', 'hint', 'err')),
    hint_kind      TEXT,
    err_kind       TEXT,
    success        BOOLEAN NOT NULL,
    error          TEXT,
    output_summary TEXT NOT NULL,
    output         JSON,
    queued_us      BIGINT NOT NULL,
    took_us        BIGINT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL
);
CREATE INDEX execution_log_created ON execution_log (created_at);
CREATE INDEX execution_log_tool ON execution_log (tool_name, created_at);
CREATE INDEX execution_log_session ON execution_log (session, created_at);

CREATE TABLE tool_jobs (
    id           TEXT PRIMARY KEY,
    tool_name    TEXT NOT NULL,
    job_type     TEXT NOT NULL CHECK (job_type IN ('build', 'audit', 'rebuild')),
    status       TEXT NOT NULL CHECK (status IN
                     ('queued', 'building', 'testing', 'approved', 'rejected', 'failed')),
    spec         JSON NOT NULL,
    result       JSON,
    progress_pct SMALLINT NOT NULL,
    tenant       TEXT,
    conversation TEXT,
    created_at   TIMESTAMPTZ NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX tool_jobs_tool ON tool_jobs (tool_name, created_at);
CREATE INDEX tool_jobs_queued ON tool_jobs (created_at, id) WHERE status = 'queued';

CREATE TABLE session_tools (
    session   TEXT NOT NULL,
    tool      TEXT NOT NULL,
    last_used TIMESTAMPTZ NOT NULL,
    round     BIGINT NOT NULL,
    PRIMARY KEY (session, tool)
);

CREATE TABLE session_failures (
    session   TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    tool      TEXT NOT NULL,
    error     TEXT NOT NULL,
    count     INTEGER NOT NULL,
    last_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session, args_hash)
);

CREATE TABLE surface_state (
    key        TEXT PRIMARY KEY,
    value      JSON NOT NULL,
    written_at TIMESTAMPTZ NOT NULL
);
"#,
    // 2: the admin page's call log: a call found by its id, and calls filtered by who made
    // them, newest first, without a walk of the whole log.
    r#"
CREATE INDEX execution_log_call ON execution_log (call_id);
CREATE INDEX execution_log_principal ON execution_log (principal, created_at);
"#,
    // 3: the execution log's hash chain (`quiver_registry::chain`): each row's place and
    // link; the head the writers last stored (row 0 and the zero link before the first
    // row), whose row lock makes replicas take turns appending, with the first id a chained
    // row can have (rows without a link below it are older than the chain); checkpoints.
    r#"
ALTER TABLE execution_log ADD COLUMN chain_seq BIGINT;
ALTER TABLE execution_log ADD COLUMN chain_link BYTEA;
CREATE UNIQUE INDEX execution_log_chain ON execution_log (chain_seq);
CREATE TABLE log_chain (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    seq      BIGINT NOT NULL,
    link     BYTEA NOT NULL,
    start_id BIGINT NOT NULL
);
INSERT INTO log_chain (id, seq, link, start_id)
    VALUES (1, 0, decode(repeat('00', 32), 'hex'),
            COALESCE((SELECT max(id) FROM execution_log), 0) + 1);
CREATE TABLE log_checkpoints (
    seq  BIGINT PRIMARY KEY,
    link BYTEA NOT NULL
);
"#,
    // 4: the OpenTelemetry trace a call was part of; the calls made from a call (the admin
    // page's call detail lists them).
    r#"
ALTER TABLE execution_log ADD COLUMN trace_id TEXT;
CREATE INDEX execution_log_parent ON execution_log (parent_call_id);
"#,
    // 5: each session's working-set version, moved on by every whole-set write, so a
    // replica knows when another one has written the set.
    r#"
CREATE TABLE session_versions (
    session TEXT PRIMARY KEY,
    version BIGINT NOT NULL
);
"#,
];

/// The newest schema version this binary knows.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The `quiver_meta` key holding the schema version.
const VERSION_KEY: &str = "schema_version";

/// The advisory lock every server opening the database takes while it checks and migrates
/// the schema (transaction-scoped: released at commit), so two replicas starting at once
/// never both run a migration.
const MIGRATION_LOCK: i64 = 0x5155_4956_4552_0001;

/// What opening the store found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenReport {
    /// The schema version found in the database (0 for a new one).
    pub found_version: u32,
    /// The schema version now.
    pub schema_version: u32,
}

/// The schema version stored, 0 for a database without Quiver's tables; a database holding
/// other tables but not Quiver's is refused, before anything is changed in it (views, such
/// as an extension's like `pg_stat_statements`, are not another application's data).
async fn found_version(
    client: &impl tokio_postgres::GenericClient,
    location: &str,
) -> Result<u32, StoreError> {
    let meta = client
        .query_one("SELECT to_regclass('quiver_meta') IS NOT NULL", &[])
        .await
        .at(location)?;
    if !meta.get::<_, bool>(0) {
        let rows = client
            .query(
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'
                 ORDER BY table_name LIMIT 4",
                &[],
            )
            .await
            .at(location)?;
        if rows.is_empty() {
            return Ok(0);
        }
        let tables: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        return Err(StoreError::Corrupt {
            location: location.to_owned(),
            cause: format!(
                "not a Quiver store: the database holds another application's tables ({}), and Quiver changes nothing in it; point [store] url at a database of its own (`createdb quiver`)",
                tables.join(", ")
            ),
        });
    }
    let row = client
        .query_opt(
            "SELECT value FROM quiver_meta WHERE key = $1",
            &[&VERSION_KEY],
        )
        .await
        .at(location)?;
    match row {
        None => Ok(0),
        Some(r) => {
            let v: String = r.get(0);
            v.parse().map_err(|_| StoreError::Corrupt {
                location: location.to_owned(),
                cause: format!("the stored schema version {v:?} is not a number"),
            })
        }
    }
}

fn too_new(location: &str, found: u32) -> StoreError {
    StoreError::TooNew {
        location: location.to_owned(),
        found,
        supported: SCHEMA_VERSION,
    }
}

/// Checks the schema and applies the missing migrations in one transaction, under
/// [`MIGRATION_LOCK`].
pub(crate) async fn prepare(client: &mut Client, location: &str) -> Result<OpenReport, StoreError> {
    let tx = client.transaction().await.at(location)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .at(location)?;
    let found = found_version(&tx, location).await?;
    if found > SCHEMA_VERSION {
        return Err(too_new(location, found));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(sql)
            .await
            .map_err(|e| StoreError::Backend {
                location: location.to_owned(),
                cause: format!(
                    "schema migration {} failed: {}",
                    i + 1,
                    crate::error::classify(location, &e)
                ),
            })?;
        tracing::info!(%location, migration = i + 1, "applied a schema migration");
    }
    tx.execute(
        "INSERT INTO quiver_meta (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&VERSION_KEY, &SCHEMA_VERSION.to_string()],
    )
    .await
    .at(location)?;
    tx.commit().await.at(location)?;
    Ok(OpenReport {
        found_version: found,
        schema_version: SCHEMA_VERSION,
    })
}

/// The read-only open's check: the schema must be there and current (nothing is migrated).
pub(crate) async fn check(client: &Client, location: &str) -> Result<OpenReport, StoreError> {
    let found = found_version(client, location).await?;
    if found > SCHEMA_VERSION {
        return Err(too_new(location, found));
    }
    if found == 0 {
        return Err(StoreError::NotCreated {
            location: location.to_owned(),
            cause: "the database has no Quiver tables yet, and this command only reads: the first `quiver serve` (or `call`, `search`) creates them; `quiver store migrate --from FILE` fills it from a SQLite store".to_owned(),
        });
    }
    if found < SCHEMA_VERSION {
        return Err(StoreError::Unavailable {
            location: location.to_owned(),
            cause: format!(
                "the database has schema version {found} and this binary needs {SCHEMA_VERSION}, and this command only reads: the first `quiver serve` (or `call`, `search`) of this version migrates it"
            ),
        });
    }
    Ok(OpenReport {
        found_version: found,
        schema_version: SCHEMA_VERSION,
    })
}
