//! `quiver.toml`: every key has a default; unknown keys are errors that name the key and the
//! file, with a did-you-mean; `${env:VAR}` is interpolated in strings.
//!
//! Over 800 lines: one struct per `quiver.toml` table with its checks, so a key's type, default
//! and errors are read in one place.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, bail};
use quiver_registry::{
    DispatchConfig, PolicyRule, ToolRef, did_you_mean,
    layers::{
        concurrency::ConcurrencyConfig, result_limit::ResultLimitConfig, timeout::TimeoutConfig,
    },
    log_writer::Durability,
    suggestion,
};
use quiver_surface::SurfaceConfig;
use serde::{Deserialize, Serialize};

mod shown;
mod skills;
pub use skills::SkillsConfig;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Where Quiver keeps its state.
    pub store: StoreConfig,
    /// What each session sees.
    pub surface: SurfaceConfig,
    /// Dispatch limits.
    pub limits: LimitsConfig,
    /// Policy rules fed to the dispatcher's policy check.
    pub policy: PolicyConfig,
    /// Upstream MCP servers (`[[mcp.servers]]`) and the `insecure_http` opt-in list.
    pub mcp: quiver_mcp_adapter::McpClientConfig,
    /// Inbound bearer tokens for `quiver serve` (`[[auth.tokens]]`: name, token, optional
    /// allowed_tools, allowed_servers, mode, tenant). With none configured, no token is asked
    /// for. Names must be non-empty, unique and free of `:`, secrets non-empty: checked with
    /// the rest of the file, so `quiver check` fails where `serve` would.
    pub auth: quiver_mcp_adapter::InboundAuth,
    /// Skills by tier, the trust gate and command files (`[skills]`), offered through the
    /// `skill` tool and as prompts.
    pub skills: SkillsConfig,
    /// Custom tools' sandbox (`[sandbox]`): its worker threads and each run's limits.
    pub sandbox: SandboxConfig,
    /// Custom tools' jobs (`[custom]`): how long a running job keeps its lease.
    pub custom: CustomConfig,
    /// The operator's endpoints (`[admin]`).
    pub admin: AdminConfig,
    /// The catalog directory (`[catalog]`): tool definitions in files.
    pub catalog: CatalogConfig,
    /// `tool_search`'s semantic retriever (`[search] model_dir`).
    pub search: SearchConfig,
    /// OpenTelemetry traces (`[telemetry]`); off unless `otlp_endpoint` is set.
    pub telemetry: TelemetryConfig,
    /// The file it was read from, for errors found later (an MCP server's settings).
    #[serde(skip)]
    pub(crate) origin: Option<String>,
    /// The path it was loaded from ([`Config::load`]), read again by a reload.
    #[serde(skip)]
    pub(crate) source: Option<PathBuf>,
}

/// `[catalog]`: tool definitions kept as files (see the `catalog_dir` module for the
/// layout and the kinds).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CatalogConfig {
    /// The directory (`tools/`, `skills/`, `agents/` under it); relative to the config
    /// file's directory. Default: none.
    pub dir: Option<PathBuf>,
    /// Approve the custom tools the directory defines once their build passes (by override
    /// when they have no test cases), instead of leaving them as drafts for the operator.
    /// Default false.
    pub auto_approve: bool,
}

/// `[admin]`: the operator's endpoints of `quiver serve` over HTTP.
#[derive(Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AdminConfig {
    /// The token `POST /admin/reload` asks for (`Authorization: Bearer <token>`), at least
    /// 16 characters; give it as `"${env:VAR}"` to keep it out of the file. Without one the
    /// admin endpoints do not exist.
    pub token: Option<String>,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl AdminConfig {
    /// The admin token, checked.
    pub fn token(&self) -> anyhow::Result<Option<quiver_mcp_adapter::AdminToken>> {
        self.token
            .as_ref()
            .map(|t| quiver_mcp_adapter::AdminToken::new(t.clone()).map_err(anyhow::Error::msg))
            .transpose()
            .context("[admin] token")
    }
}

/// `[sandbox]`: what each run of a custom tool may use. Every key has a default (see
/// [`quiver_registry::sandbox::SandboxLimits`] for the limits' defaults).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SandboxConfig {
    /// Worker threads that run custom tools at once (default 4; nested calls of custom tools
    /// get threads of their own, so nesting never waits for a free worker).
    pub threads: Option<usize>,
    /// Wall time of one root invocation, nested calls and the tools it calls included, in
    /// milliseconds.
    pub wall_time_ms: Option<u64>,
    /// The engine's heap, in MiB.
    pub heap_mib: Option<usize>,
    /// The engine's stack, in KiB.
    pub stack_kib: Option<usize>,
    /// The largest source, in KiB.
    pub source_kib: Option<usize>,
    /// The largest `inputs`, and argument of `call_tool`, in KiB.
    pub input_kib: Option<usize>,
    /// The largest result, in KiB.
    pub output_kib: Option<usize>,
    /// The most `log(...)` text kept, in KiB.
    pub log_kib: Option<usize>,
    /// The deepest result (arrays and objects).
    pub result_depth: Option<u32>,
    /// `call_tool` calls per root invocation, shared across nesting.
    pub max_calls: Option<u32>,
    /// How deep custom tools may call custom tools.
    pub max_depth: Option<u32>,
}

impl SandboxConfig {
    /// The limits of each run.
    pub fn limits(&self) -> anyhow::Result<quiver_registry::sandbox::SandboxLimits> {
        let mut l = quiver_registry::sandbox::SandboxLimits::default();
        let positive = |key: &str, v: u64| -> anyhow::Result<u64> {
            if v == 0 {
                bail!("`{key}` must be at least 1");
            }
            Ok(v)
        };
        if let Some(v) = self.wall_time_ms {
            l.wall_time = std::time::Duration::from_millis(positive("wall_time_ms", v)?);
        }
        let kib = |key: &str, v: Option<usize>, unit: usize| -> anyhow::Result<Option<usize>> {
            v.map(|v| positive(key, v as u64).map(|_| v.saturating_mul(unit)))
                .transpose()
        };
        if let Some(v) = kib("heap_mib", self.heap_mib, 1 << 20)? {
            l.heap_bytes = v;
        }
        if let Some(v) = kib("stack_kib", self.stack_kib, 1 << 10)? {
            l.stack_bytes = v;
        }
        if let Some(v) = kib("source_kib", self.source_kib, 1 << 10)? {
            l.source_bytes = v;
        }
        if let Some(v) = kib("input_kib", self.input_kib, 1 << 10)? {
            l.input_bytes = v;
        }
        if let Some(v) = kib("output_kib", self.output_kib, 1 << 10)? {
            l.output_bytes = v;
        }
        if let Some(v) = kib("log_kib", self.log_kib, 1 << 10)? {
            l.log_bytes = v;
        }
        if let Some(v) = self.result_depth {
            l.result_depth = positive("result_depth", u64::from(v))? as u32;
        }
        if let Some(v) = self.max_calls {
            l.max_calls = v;
        }
        if let Some(v) = self.max_depth {
            l.max_depth = v;
        }
        if self.threads == Some(0) {
            bail!("`threads` must be at least 1");
        }
        Ok(l)
    }

    /// The worker threads.
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or(4)
    }
}

/// `[custom]`: custom tools' build, audit and rebuild jobs.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CustomConfig {
    /// How long, in seconds, a running job may go without its worker's heartbeat before any
    /// process on the store releases it (closes it as failed, interrupted, and queues it
    /// again): what a job whose replica died waits before another takes it. The worker's
    /// heartbeat comes every sixth of it, and each `quiver serve` looks for stale jobs every
    /// third. Default 30; from 2 to 3600. Every process on one store should use the same.
    pub job_stale_secs: Option<u64>,
    /// How many jobs one `quiver serve` runs at once (default 2, from 1 to 16): a slow
    /// build does not hold up the others. Each job runs its test cases one at a time, on
    /// the sandbox's threads.
    pub jobs: Option<usize>,
}

impl CustomConfig {
    /// The shortest and the longest stale bound accepted, in seconds.
    pub const JOB_STALE_SECS: std::ops::RangeInclusive<u64> = 2..=3600;

    /// How many jobs a process may run at once.
    pub const JOBS: std::ops::RangeInclusive<usize> = 1..=16;

    /// How many jobs one process runs at once, checked.
    pub fn jobs(&self) -> anyhow::Result<usize> {
        let jobs = self.jobs.unwrap_or(2);
        if !Self::JOBS.contains(&jobs) {
            bail!(
                "`jobs = {jobs}` is out of range: give {} to {} (default 2). It is how many custom-tool jobs (builds, audits, rebuilds) one `quiver serve` runs at once",
                Self::JOBS.start(),
                Self::JOBS.end()
            );
        }
        Ok(jobs)
    }

    /// The lease of a running job, checked.
    pub fn lease(&self) -> anyhow::Result<quiver_registry::custom::JobLease> {
        use quiver_registry::custom::JobLease;
        let Some(secs) = self.job_stale_secs else {
            return Ok(JobLease::default());
        };
        let range = Self::JOB_STALE_SECS;
        if !range.contains(&secs) {
            bail!(
                "`job_stale_secs = {secs}` is out of range: give {} to {} seconds (default {}). It is how long a running custom-tool job may go without a heartbeat before another process takes it over: too short and a busy replica loses its jobs, too long and a dead replica's job waits that long",
                range.start(),
                range.end(),
                JobLease::DEFAULT_STALE.as_secs()
            );
        }
        Ok(JobLease::new(Duration::from_secs(secs)))
    }
}

/// `[telemetry]`: one OpenTelemetry trace per `tools/call` of `quiver serve`, exported over
/// OTLP. Read at start: a change applies at the next restart.
#[derive(Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TelemetryConfig {
    /// The collector, `http://host:4318` (HTTP; `/v1/traces` is added when the URL has no
    /// path) or `http://host:4317` with `protocol = "grpc"`. Unset (the default), nothing is
    /// recorded and no exporter runs.
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (the default) or `grpc`.
    pub protocol: Option<String>,
    /// The `service.name` of the spans (default `quiver`).
    pub service_name: Option<String>,
    /// Headers (HTTP) or metadata (gRPC) sent with every export, e.g. a collector's API key
    /// as `"${env:VAR}"`; their values are masked wherever the config is shown.
    pub headers: BTreeMap<String, String>,
    /// The share of traces Quiver starts that are recorded, 0.0 to 1.0 (default 1.0). A
    /// trace a client continues (`traceparent`) keeps the client's decision.
    pub sample_ratio: Option<f64>,
    /// Also put each call's arguments and result on its span
    /// (`gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`). Off by default: they may
    /// hold what the collector's readers should not see.
    pub record_payloads: bool,
}

impl std::fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryConfig")
            .field("otlp_endpoint", &self.otlp_endpoint)
            .field("protocol", &self.protocol)
            .field("service_name", &self.service_name)
            .field(
                "headers",
                &self
                    .headers
                    .keys()
                    .map(|k| (k, "<redacted>"))
                    .collect::<Vec<_>>(),
            )
            .field("sample_ratio", &self.sample_ratio)
            .field("record_payloads", &self.record_payloads)
            .finish()
    }
}

impl TelemetryConfig {
    /// The exporter's settings, checked; `None` when tracing is off.
    pub fn export(&self) -> anyhow::Result<Option<quiver_telemetry_otel::ExportConfig>> {
        let Some(endpoint) = self.otlp_endpoint.as_deref() else {
            return Ok(None);
        };
        let protocol = match self.protocol.as_deref() {
            None | Some("http/protobuf") => quiver_telemetry_otel::Protocol::HttpProtobuf,
            Some("grpc") => quiver_telemetry_otel::Protocol::Grpc,
            Some(other) => bail!(
                "protocol = {other:?} is not an OTLP protocol Quiver exports with: write \"http/protobuf\" (port 4318 by convention) or \"grpc\" (port 4317)"
            ),
        };
        let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
        let host = endpoint.split_once("://").map_or("", |(_, rest)| rest);
        if !scheme_ok || host.is_empty() || host.starts_with('/') {
            bail!(
                "otlp_endpoint = {endpoint:?} is not an http(s) URL: write the collector's address, e.g. \"http://localhost:4318\" (or \"http://localhost:4317\" with protocol = \"grpc\")"
            );
        }
        if protocol == quiver_telemetry_otel::Protocol::Grpc && endpoint.starts_with("https://") {
            bail!(
                "otlp_endpoint = {endpoint:?} with protocol = \"grpc\": Quiver exports gRPC without TLS only; use protocol = \"http/protobuf\" for an https collector, or a local collector over http://"
            );
        }
        let ratio = self.sample_ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&ratio) {
            bail!(
                "sample_ratio = {ratio} is not a share of traces: give a number from 0.0 (none) to 1.0 (all, the default)"
            );
        }
        if let Some(name) = self.headers.keys().find(|k| {
            k.is_empty()
                || !k
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        }) {
            bail!(
                "headers: {name:?} is not a header name: use letters, digits and '-', e.g. \"x-api-key\""
            );
        }
        let mut export = quiver_telemetry_otel::ExportConfig::new(endpoint);
        export.protocol = protocol;
        if let Some(name) = &self.service_name {
            export.service_name = name.clone();
        }
        export.headers = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        export.sample_ratio = ratio;
        Ok(Some(export))
    }
}

/// `[search]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SearchConfig {
    /// A folder holding all-MiniLM-L6-v2 (`config.json`, `tokenizer.json`,
    /// `model.safetensors`; `quiver model install` puts them there). With it, `tool_search`
    /// fuses the model's ranking into the lexical one; without it (the default), or when the
    /// folder cannot be used, the search is lexical.
    pub model_dir: Option<PathBuf>,
}

/// `[store]`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreConfig {
    /// The SQLite file (default `./quiver.db`, in the working directory; a relative path
    /// the config file gives is relative to that file's directory).
    pub path: PathBuf,
    /// A PostgreSQL database instead of the SQLite file (`postgres://user:password@host:5432/db`;
    /// give the password as `${env:VAR}` to keep it out of the file): what several `quiver
    /// serve` replicas share. Its password is masked wherever the URL is shown.
    pub url: Option<String>,
    /// Execution-log rows older than this many days, and the stored working sets of
    /// sessions idle that long, are deleted when a command that writes the store starts
    /// (`serve`, `call`, `search`; in batches, without blocking writers); `log`, `tools`,
    /// `check` and `status` never delete. At least 1; unset (the default) keeps everything.
    pub retention_days: Option<u32>,
    /// How long the execution-log writer waits for more rows before a commit, in
    /// milliseconds (default 2; 0 commits every call at once). Sequential calls then share a
    /// commit; a row reaches the file at most this much later, and a clean shutdown writes
    /// everything.
    pub log_linger_ms: u32,
    /// When a call's answer may leave, relative to its execution-log row's commit:
    /// `"batched"` (the default) answers at once and commits the row within
    /// `log_linger_ms`, so a process killed outright (`kill -9`, a power cut) can lose the
    /// rows of the calls it answered in its last milliseconds; `"strict"` holds each answer
    /// until its row is committed (calls finishing together share a commit), so no answered
    /// call is missing from the log. Both stores take it.
    pub durability: Durability,
    /// How long a store connection waits for a lock held elsewhere before the write fails,
    /// in milliseconds (default 5000). A failing execution log makes `GET /readyz` answer
    /// 503 until a batch is written again.
    pub busy_timeout_ms: u64,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("path", &self.path)
            .field(
                "url",
                &self.url.as_deref().map(quiver_store_postgres::redact),
            )
            .field("retention_days", &self.retention_days)
            .field("log_linger_ms", &self.log_linger_ms)
            .field("durability", &self.durability)
            .field("busy_timeout_ms", &self.busy_timeout_ms)
            .finish()
    }
}

impl StoreConfig {
    /// The store as the operator reads it: the PostgreSQL URL with its password masked, or
    /// the SQLite file.
    pub fn shown(&self) -> String {
        match &self.url {
            Some(url) => quiver_store_postgres::redact(url),
            None => self.path.display().to_string(),
        }
    }

    /// Why `path` cannot be the store's file, found before SQLite is asked (it would say
    /// "unable to open" or "disk I/O error"): a directory.
    pub fn path_problem(&self) -> Option<String> {
        self.path.is_dir().then(|| {
            format!(
                "[store] path {} is a directory: name the database file, e.g. {}",
                self.path.display(),
                self.path.join("quiver.db").display()
            )
        })
    }

    /// Why the store's file cannot be created: it does not exist and neither does its
    /// directory. Reading commands run without a store; `serve`, `call` and `search` stop
    /// on it, and `check` and `status` say it (rather than "config ok", or that `serve`
    /// would create the file).
    pub fn missing_directory(&self) -> Option<String> {
        let parent = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        (!self.path.exists() && !parent.is_dir()).then(|| {
            format!(
                "[store] path {}: its directory {} does not exist, so the store cannot be created; create the directory (Quiver creates the database file, not its directory) or name a file in one that exists",
                self.path.display(),
                parent.display()
            )
        })
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: PathBuf::from("./quiver.db"),
            url: None,
            retention_days: None,
            log_linger_ms: 2,
            durability: Durability::Batched,
            busy_timeout_ms: 5000,
        }
    }
}

/// `[limits]`: the dispatcher's middleware limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LimitsConfig {
    /// Default per-call timeout, seconds (30).
    pub timeout_secs: f64,
    /// Per-tool timeouts, seconds.
    pub tool_timeouts: BTreeMap<String, f64>,
    /// Calls in flight across all tools (1024).
    pub max_concurrent: usize,
    /// Calls in flight per tool.
    pub tool_concurrency: BTreeMap<String, usize>,
    /// Characters a result may carry (100000).
    pub max_result_chars: usize,
    /// Tokens (OpenAI's `o200k_base`) a result may carry (25000). A result over it, or
    /// over `max_result_chars`, is shortened: a text keeps its head and tail, structured
    /// data is paged by whole items, and the whole result is kept for the session, read
    /// back with `read_result` or as the resource `quiver://results/<call id>`.
    pub result_tokens: usize,
    /// Per-tool token budgets in place of `result_tokens`.
    pub tool_result_tokens: BTreeMap<String, usize>,
    /// Tokens the results of one batch share, split evenly between its calls (100000).
    pub round_tokens: usize,
    /// Bytes of whole results a session keeps for reading back (16 MiB); past it the
    /// session's oldest go first.
    pub kept_result_bytes: usize,
    /// Bytes of parts a result may carry besides its text: images, audio and embedded
    /// resources, a text resource's text included (1 MiB).
    pub max_part_bytes: usize,
    /// Largest accepted arguments in bytes (1 MiB).
    pub max_input_bytes: usize,
    /// The Nth identical call in a row is refused (4; 0 turns the guard off).
    pub loop_guard: u32,
    /// Failures of the same call before the "different approach" hint (3; 0 turns it off).
    pub repeat_failure: u32,
    /// How long a call that asked a 2026-07-28 client for input (sampling, elicitation,
    /// roots as an `InputRequiredResult`) waits for the client's retry before it is
    /// cancelled, seconds (600). The call's timeout still applies while it waits.
    pub input_wait_secs: f64,
    /// HTTP sessions open at once in `quiver serve` (1000); an `initialize` beyond it gets
    /// 503 until sessions end (DELETE, or five minutes idle).
    pub max_http_sessions: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = DispatchConfig::default();
        LimitsConfig {
            timeout_secs: d.timeout.default.as_secs_f64(),
            tool_timeouts: BTreeMap::new(),
            max_concurrent: d.concurrency.global,
            tool_concurrency: BTreeMap::new(),
            max_result_chars: d.result_limit.max_chars,
            result_tokens: d.result_limit.max_tokens,
            tool_result_tokens: BTreeMap::new(),
            round_tokens: d.result_limit.round_tokens,
            kept_result_bytes: d.result_limit.kept_bytes,
            max_part_bytes: d.result_limit.max_part_bytes,
            max_input_bytes: d.max_input_bytes,
            loop_guard: d.loop_guard_threshold,
            repeat_failure: d.repeat_failure_threshold,
            input_wait_secs: 600.0,
            max_http_sessions: 1000,
        }
    }
}

/// `[policy]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PolicyConfig {
    /// The rules, checked in order.
    pub rules: Vec<PolicyRule>,
}

impl PolicyConfig {
    /// Checks what deserialising cannot: every rule has an id of its own (repeats of a
    /// violation are counted per id), a tool pattern and a message (what the model reads when
    /// the rule fires). Errors name the rule by place and id.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (i, r) in self.rules.iter().enumerate() {
            let at = format!("policy.rules[{i}] (id {:?})", r.id);
            if r.id.trim().is_empty() {
                bail!(
                    "policy.rules[{i}]: `id` is empty: give the rule a stable id of its own (repeat violations are counted per id)"
                );
            }
            if let Some(j) = self.rules[..i].iter().position(|o| o.id == r.id) {
                bail!(
                    "{at}: the id is already used by policy.rules[{j}]; give each rule its own id (repeat violations are counted per id)"
                );
            }
            if r.tool.trim().is_empty() {
                bail!("{at}: `tool` is empty: give a tool name or pattern (`*` matches any tool)");
            }
            if r.message.trim().is_empty() {
                bail!(
                    "{at}: `message` is empty: say what the model should do instead (it is what the model reads when the rule fires)"
                );
            }
        }
        Ok(())
    }
}

/// The longest limit in seconds: a year (a longer one overflows a call's deadline).
const MAX_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// The most calls a concurrency limit admits at once.
const MAX_CONCURRENT: usize = 1_000_000;

fn secs(s: f64, key: &str) -> anyhow::Result<Duration> {
    let shown = quiver_contract::short_number(s);
    if !(s.is_finite() && s > 0.0) {
        bail!("limits.{key} must be a positive number of seconds, not {shown}");
    }
    if s < 0.001 {
        bail!(
            "limits.{key} must be at least 0.001 seconds (1 ms; every call would time out before it starts), not {shown}"
        );
    }
    if s > MAX_SECS {
        bail!("limits.{key} must be at most {MAX_SECS} seconds (a year), not {shown}");
    }
    Ok(Duration::from_secs_f64(s))
}

/// The largest request body `quiver serve` reads over HTTP (rmcp's limit): arguments
/// larger than that never reach the input check.
const MAX_HTTP_BODY: usize = 4 * 1024 * 1024;

fn input_bytes(n: usize) -> anyhow::Result<usize> {
    let n = more_than_zero(n, "max_input_bytes", "0 refuses every call")?;
    if n > MAX_HTTP_BODY {
        bail!(
            "limits.max_input_bytes must be at most {MAX_HTTP_BODY} (4 MiB, the largest request body `quiver serve` reads over HTTP; larger arguments are refused there before this limit applies), not {n}"
        );
    }
    Ok(n)
}

fn concurrent(n: usize, key: &str) -> anyhow::Result<usize> {
    if n > MAX_CONCURRENT {
        bail!("limits.{key} must be at most {MAX_CONCURRENT}, not {n}");
    }
    if n == 0 {
        bail!("limits.{key} must be at least 1 (the calls allowed in flight at once), not 0");
    }
    Ok(n)
}

/// A count limit that 0 turns off; `min` is the smallest meaningful value otherwise.
fn count_or_off(n: u32, min: u32, key: &str, what: &str) -> anyhow::Result<u32> {
    match n {
        0 => Ok(u32::MAX),
        n if n < min => {
            bail!("limits.{key} must be 0 (off) or at least {min} ({what}), not {n}")
        }
        n => Ok(n),
    }
}

/// A token budget of `limits.{key}`: at least the smallest a shortened result's notes leave
/// room in.
fn token_budget(n: usize, key: &str) -> anyhow::Result<usize> {
    let least = quiver_registry::shape::MIN_TOKENS;
    if n < least {
        bail!(
            "limits.{key} must be at least {least} tokens (it is {n}): a shortened result's notes need room beside its content"
        );
    }
    Ok(n)
}

fn more_than_zero(n: usize, key: &str, what: &str) -> anyhow::Result<usize> {
    if n == 0 {
        bail!("limits.{key} must be more than 0 ({what})");
    }
    Ok(n)
}

impl LimitsConfig {
    /// The most HTTP sessions open at once (`max_http_sessions`).
    pub fn max_http_sessions(&self) -> anyhow::Result<usize> {
        more_than_zero(
            self.max_http_sessions,
            "max_http_sessions",
            "the HTTP sessions open at once",
        )
    }

    /// How long a call waiting for its client's input is kept (`input_wait_secs`).
    pub fn input_wait(&self) -> anyhow::Result<Duration> {
        secs(self.input_wait_secs, "input_wait_secs")
    }

    /// The dispatcher configuration these limits describe.
    pub fn dispatch_config(&self) -> anyhow::Result<DispatchConfig> {
        let mut timeout =
            TimeoutConfig::default().with_default(secs(self.timeout_secs, "timeout_secs")?);
        for (tool, s) in &self.tool_timeouts {
            timeout = timeout.with_tool(tool, secs(*s, &format!("tool_timeouts.{tool}"))?);
        }
        let mut concurrency = ConcurrencyConfig::default()
            .with_global(concurrent(self.max_concurrent, "max_concurrent")?);
        for (tool, n) in &self.tool_concurrency {
            concurrency =
                concurrency.with_tool(tool, concurrent(*n, &format!("tool_concurrency.{tool}"))?);
        }
        let mut results = ResultLimitConfig::default()
            .with_max_chars(more_than_zero(
                self.max_result_chars,
                "max_result_chars",
                "the characters a result may carry",
            )?)
            .with_max_part_bytes(self.max_part_bytes)
            .with_max_tokens(token_budget(self.result_tokens, "result_tokens")?)
            .with_round_tokens(token_budget(self.round_tokens, "round_tokens")?)
            .with_kept_bytes(self.kept_result_bytes);
        for (tool, n) in &self.tool_result_tokens {
            results = results.with_tool_tokens(
                tool,
                token_budget(*n, &format!("tool_result_tokens.{tool}"))?,
            );
        }
        let mut cfg = DispatchConfig::default()
            .with_timeout(timeout)
            .with_concurrency(concurrency)
            .with_result_limit(results)
            .with_max_input_bytes(input_bytes(self.max_input_bytes)?);
        cfg.loop_guard_threshold = count_or_off(
            self.loop_guard,
            2,
            "loop_guard",
            "the Nth identical call in a row is refused",
        )?;
        cfg.repeat_failure_threshold = count_or_off(
            self.repeat_failure,
            1,
            "repeat_failure",
            "failures of one call before the different-approach hint",
        )?;
        Ok(cfg)
    }
}

/// Adds a did-you-mean to serde's "unknown field `x`, expected one of `a`, `b`" errors, and
/// says what a count takes when it got a fraction or a negative number (quoting a huge float
/// back in exponent form, not as its hundreds of digits).
fn explain(message: &str) -> String {
    toml_terms(&explain_rust(message))
}

/// serde's words for what a setting takes, in TOML's terms: "a whole number" for the
/// integer types, "a number" for the float ones, "an array" and "a table" for a sequence
/// and a map. An operator writes TOML; `usize` or `f64` tells them nothing.
fn toml_terms(message: &str) -> String {
    data_terms(message, "table")
}

/// serde's words in JSON's terms, as [`toml_terms`] has them in TOML's: a map is "an
/// object".
pub(crate) fn json_terms(message: &str) -> String {
    data_terms(message, "object")
}

/// serde's words for what a value takes, in the terms of the format the operator writes;
/// `map` is that format's word for a map ("table", "object").
fn data_terms(message: &str, map: &str) -> String {
    const WHOLE: [&str; 10] = [
        "usize", "u64", "u32", "u16", "u8", "isize", "i64", "i32", "i16", "i8",
    ];
    let mut out = message.to_owned();
    for t in WHOLE {
        out = out.replace(&format!("expected {t}\n"), "expected a whole number\n");
        if out.ends_with(&format!("expected {t}")) {
            out.truncate(out.len() - t.len());
            out.push_str("a whole number");
        }
        out = out.replace(&format!("expected {t} "), "expected a whole number ");
    }
    for t in ["f64", "f32"] {
        out = out.replace(&format!("expected {t}\n"), "expected a number\n");
        if out.ends_with(&format!("expected {t}")) {
            out.truncate(out.len() - t.len());
            out.push_str("a number");
        }
        out = out.replace(&format!("expected {t} "), "expected a number ");
    }
    out.replace("expected a sequence", "expected an array")
        .replace("expected a map", &format!("expected {}", a(map)))
        .replace("invalid type: sequence", "invalid type: array")
        .replace("invalid type: map", &format!("invalid type: {map}"))
}

/// `word` with its indefinite article ("a table", "an object").
fn a(word: &str) -> String {
    let article = if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {word}")
}

fn explain_rust(message: &str) -> String {
    if let Some(text) = whole_number_hint(message) {
        return text;
    }
    let Some(start) = message.find("unknown field `") else {
        return message.to_owned();
    };
    let rest = &message[start + "unknown field `".len()..];
    let Some(end) = rest.find('`') else {
        return message.to_owned();
    };
    let unknown = &rest[..end];
    let expected: Vec<&str> = rest[end + 1..].split('`').skip(1).step_by(2).collect();
    match did_you_mean(unknown, expected.iter().copied(), 1).first() {
        Some((best, _)) => format!("{}\ndid you mean `{best}`?", message.trim_end()),
        None => message.to_owned(),
    }
}

/// `message` with serde's "floating point `1000...0.0`" quoted short (`1e300`; a whole one
/// as `4.0`).
pub(crate) fn shorten_float(message: &str) -> String {
    const FLOAT: &str = "floating point `";
    let Some(start) = message.find(FLOAT).map(|i| i + FLOAT.len()) else {
        return message.to_owned();
    };
    let Some(end) = message[start..].find('`').map(|e| start + e) else {
        return message.to_owned();
    };
    let shown = match message[start..end].parse::<f64>() {
        // A whole float keeps its point: `0.0`, not a `0` that reads as a whole number.
        Ok(x) if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.1}"),
        Ok(x) => quiver_contract::short_number(x),
        Err(_) => return message.to_owned(),
    };
    format!("{}{shown}{}", &message[..start], &message[end..])
}

/// serde's "invalid type: floating point `2.5`, expected usize" (or "invalid value:
/// integer `-3`, expected u64", a number too large for its type, a string where a number
/// goes) for a whole-number setting, with a float shortened and what to write. Only serde's
/// own line is read: toml's copy of the config line above it may hold any text.
fn whole_number_hint(message: &str) -> Option<String> {
    let lines: Vec<&str> = message.trim_end().lines().collect();
    let at = lines.iter().position(|l| {
        l.starts_with("invalid type: ")
            || l.starts_with("invalid value: ")
            || *l == "u64 value was too large"
    })?;
    let line = lines[at];
    let largest = [
        (", expected u16", u64::from(u16::MAX)),
        (", expected u32", u64::from(u32::MAX)),
        (", expected u64", u64::MAX),
        (", expected usize", usize::MAX as u64),
    ]
    .into_iter()
    .find(|(e, _)| line.ends_with(e))
    .map(|(_, max)| max);
    let fixed = if line == "u64 value was too large" {
        format!("{line}\na TOML integer is at most {}", i64::MAX)
    } else if line.ends_with(", expected f64") {
        if line.starts_with("invalid type: string ") {
            format!("{line}\nthis setting takes a number, written without quotes")
        } else if line.starts_with("invalid type: integer `") {
            format!("{line}\nthis number is too large for this setting")
        } else {
            return None;
        }
    } else if let Some(max) = largest {
        if line.starts_with("invalid type: floating point `") {
            format!(
                "{}\nthis setting takes a whole number: write it without a decimal point or exponent (e.g. `4`)",
                shorten_float(line)
            )
        } else if line.starts_with("invalid value: integer `-") {
            format!("{line}\nthis setting takes a whole number, not a negative one")
        } else if line.starts_with("invalid value: integer `")
            || line.starts_with("invalid type: integer `")
        {
            format!("{line}\nthis setting takes a whole number of at most {max}")
        } else if line.starts_with("invalid type: string ") {
            format!(
                "{line}\nthis setting takes a number, written without quotes (a `${{env:...}}` value is text, so a number setting cannot come from one)"
            )
        } else {
            return None;
        }
    } else {
        return None;
    };
    let mut out: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    out[at] = fixed;
    Some(out.join("\n"))
}

/// Replaces `${env:VAR}` in one string ([`quiver_mcp_adapter::interpolate_env`]); an
/// error names `path` (the key). Also used for the `--mcp-config` JSON's fields.
pub(crate) fn interpolate_str(
    s: &str,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<String> {
    quiver_mcp_adapter::interpolate_env(s, env).map_err(|e| anyhow::anyhow!("{path}: {e}"))
}

/// A key that holds `${` is an error: keys are taken as written, and `${X}` as an
/// environment variable's or a tool's name would be that literal text, where the same
/// text in a value is refused.
pub(crate) fn key_without_reference(key: &str, path: &str) -> anyhow::Result<()> {
    if key.contains("${") {
        anyhow::bail!(
            "{path}: a key cannot hold `${{...}}`: keys are taken as written, and `${{env:NAME}}` works in values only; write the name itself"
        );
    }
    Ok(())
}

/// Replaces `${env:VAR}` in every string; a missing variable is an error naming the key.
fn interpolate(
    value: &mut toml::Value,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<()> {
    match value {
        toml::Value::String(s) => *s = interpolate_str(s, path, env)?,
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                interpolate(item, &format!("{path}[{i}]"), env)?;
            }
        }
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                key_without_reference(k, &p)?;
                // An MCP server's `env` and `headers` are interpolated when the server is
                // set up (with the `--mcp-config` servers'): once, so that a value whose
                // variable holds `${env:` is taken as it is. Their keys are checked here.
                if path.starts_with("mcp.servers[") && (k == "env" || k == "headers") {
                    if let toml::Value::Table(inner) = v {
                        for name in inner.keys() {
                            key_without_reference(name, &format!("{p}.{name}"))?;
                        }
                    }
                    continue;
                }
                interpolate(v, &p, env)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The longest `[store] log_linger_ms` accepted.
const MAX_LOG_LINGER_MS: u32 = 1000;

impl Config {
    /// The deny rules that refuse every call of their tools by a caller of this tenant and
    /// principal ([`PolicyRule::always_denies`](quiver_registry::PolicyRule::always_denies));
    /// `(None, None)`: the rules that refuse everyone.
    pub fn always_denied<'a>(
        &'a self,
        tenant: Option<&'a str>,
        principal: Option<&'a str>,
    ) -> impl Iterator<Item = &'a quiver_registry::PolicyRule> + 'a {
        self.policy
            .rules
            .iter()
            .filter(move |r| r.always_denies(tenant, principal))
    }

    /// The names of the inbound tokens marked `admin = true`: who may propose custom tools.
    pub fn admin_token_names(&self) -> Vec<String> {
        self.auth
            .tokens
            .iter()
            .filter(|t| t.admin)
            .map(|t| t.name.clone())
            .collect()
    }

    /// The inbound tokens, each with the tools a deny rule always refuses it (for its
    /// principal or tenant): those are never offered to it.
    pub fn inbound_auth(&self) -> quiver_mcp_adapter::InboundAuth {
        let mut auth = self.auth.clone();
        if let Some(oidc) = &mut auth.oidc {
            for r in &mut oidc.rules {
                r.denied_tools = self
                    .always_denied(r.tenant.as_deref(), None)
                    .map(|p| p.tool.clone())
                    .collect();
                if !r.admin {
                    r.denied_tools
                        .push(quiver_registry::custom::PROPOSE_TOOL.to_owned());
                }
            }
        }
        for t in &mut auth.tokens {
            t.denied_tools = self
                .always_denied(t.tenant.as_deref(), Some(&t.name))
                .map(|r| r.tool.clone())
                .collect();
            // Proposing custom tools is for admin tokens only: off the others' lists.
            if !t.admin {
                t.denied_tools
                    .push(quiver_registry::custom::PROPOSE_TOOL.to_owned());
            }
        }
        auth
    }

    /// Every tool name or pattern the configuration refers to, with the key it is under
    /// (`limits.tool_timeouts`, `policy.rules[search-first].tool`, ...) and whether that key
    /// takes exact names only (no `*` patterns): what `quiver check` holds against the
    /// catalog, since one that matches no tool is most likely a typo (a deny rule that never
    /// fires).
    pub fn tool_patterns(&self) -> Vec<ToolRef<'_>> {
        fn add<'a>(out: &mut Vec<ToolRef<'a>>, key: String, name: &'a str, exact: bool) {
            out.push(ToolRef { key, name, exact });
        }
        let mut out: Vec<ToolRef<'_>> = Vec::new();
        for n in self.limits.tool_timeouts.keys() {
            add(&mut out, "limits.tool_timeouts".into(), n, true);
        }
        for n in self.limits.tool_concurrency.keys() {
            add(&mut out, "limits.tool_concurrency".into(), n, true);
        }
        for r in &self.policy.rules {
            add(
                &mut out,
                format!("policy.rules[{}].tool", r.id),
                &r.tool,
                false,
            );
            if let Some(p) = &r.requires_prior {
                add(
                    &mut out,
                    format!("policy.rules[{}].requires_prior", r.id),
                    p,
                    false,
                );
            }
        }
        let s = &self.surface;
        for (key, names, exact) in [
            ("surface.anchors", &s.anchors, true),
            ("surface.system", &s.system, true),
            ("surface.fallback_floor", &s.fallback_floor, true),
            ("surface.agentic_allow", &s.agentic_allow, false),
            ("surface.agentic_only", &s.agentic_only, false),
            ("surface.delegate_excluded", &s.delegate_excluded, false),
        ] {
            for n in names {
                add(&mut out, key.into(), n, exact);
            }
        }
        for t in &self.auth.tokens {
            for n in t.allowed_tools.iter().flatten() {
                add(
                    &mut out,
                    format!("auth.tokens[{}].allowed_tools", t.name),
                    n,
                    false,
                );
            }
        }
        for (i, r) in self
            .auth
            .oidc
            .iter()
            .flat_map(|o| o.rules.iter().enumerate())
        {
            for n in r.allowed_tools.iter().flatten() {
                add(
                    &mut out,
                    format!("auth.oidc.rules[{i}].allowed_tools"),
                    n,
                    false,
                );
            }
        }
        out
    }

    /// Parses TOML text; `origin` names the file in errors.
    pub fn parse(
        text: &str,
        origin: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Config> {
        // The text itself, for errors with line and column; a `${env:VAR}` where a word
        // of a closed set goes (`transport`, `action`) only fits after interpolation, so
        // this error counts only if the interpolated config fails too.
        let direct = toml::from_str::<Config>(text).err();
        let failed = |e: String| {
            let at = direct.as_ref().map_or(e, ToString::to_string);
            anyhow::anyhow!("{origin}: {}", explain(&at))
        };
        let raw: toml::Value = toml::from_str(text).map_err(|e| failed(e.to_string()))?;
        let mut value = raw.clone();
        interpolate(&mut value, "", env).with_context(|| format!("{origin}: interpolation"))?;
        let substituted = value != raw;
        // The text's own error keeps its line and column, unless it is about a placeholder
        // (then the interpolated value is what failed).
        let about_placeholder = direct
            .as_ref()
            .is_some_and(|d| d.to_string().contains("${env:"));
        let mut config: Config = value.try_into().map_err(|e: toml::de::Error| {
            if substituted && (direct.is_none() || about_placeholder) {
                // The error is in what a variable put there: name it as it now reads.
                anyhow::anyhow!(
                    "{origin} (after ${{env:...}} interpolation): {}",
                    explain(&e.to_string())
                )
            } else {
                failed(e.to_string())
            }
        })?;
        config
            .admin
            .token()
            .with_context(|| format!("{origin}: [admin]"))?;
        config
            .limits
            .dispatch_config()
            .and(config.limits.input_wait())
            .and(config.limits.max_http_sessions())
            .with_context(|| format!("{origin}: [limits]"))?;
        config
            .surface
            .validate()
            .with_context(|| format!("{origin}: [surface]"))?;
        config
            .telemetry
            .export()
            .with_context(|| format!("{origin}: [telemetry]"))?;
        config
            .sandbox
            .limits()
            .with_context(|| format!("{origin}: [sandbox]"))?;
        config
            .custom
            .lease()
            .with_context(|| format!("{origin}: [custom]"))?;
        config
            .custom
            .jobs()
            .with_context(|| format!("{origin}: [custom]"))?;
        config
            .policy
            .validate()
            .with_context(|| format!("{origin}: [[policy.rules]]"))?;
        // What `serve` would refuse is refused here already, so `quiver check` (and every
        // other command) finds it.
        if let Some(oidc) = &config.auth.oidc {
            oidc.validate()
                .with_context(|| format!("{origin}: [auth.oidc]"))?;
        }
        config
            .auth
            .validate()
            .with_context(|| format!("{origin}: [[auth.tokens]]"))?;
        if let Some(oidc) = &config.auth.oidc {
            crate::identity::oidc_config(oidc).with_context(|| origin.to_owned())?;
        }
        // A call's principal and tenant come from its token (or, with `[auth.oidc]`, the
        // user and the claim rule): a rule naming one none has would never apply.
        let oidc_rules = config.auth.oidc.as_ref().map(|o| o.rules.as_slice());
        for (i, r) in config.policy.rules.iter().enumerate() {
            let tokens = &config.auth.tokens;
            if let Some(p) = &r.principal
                && oidc_rules.is_none()
                && !tokens.iter().any(|t| &t.name == p)
            {
                bail!(
                    "{origin}: [[policy.rules]]: policy.rules[{i}] (id {:?}): `principal = {p:?}` names no [[auth.tokens]] entry, so the rule would never apply; use a token's `name`{}",
                    r.id,
                    suggestion(p, tokens.iter().map(|t| t.name.as_str()))
                );
            }
            if let Some(tenant) = &r.tenant
                && !tokens.iter().any(|t| t.tenant.as_ref() == Some(tenant))
                && !oidc_rules
                    .unwrap_or_default()
                    .iter()
                    .any(|o| o.tenant.as_ref() == Some(tenant))
            {
                bail!(
                    "{origin}: [[policy.rules]]: policy.rules[{i}] (id {:?}): `tenant = {tenant:?}` is the tenant of no [[auth.tokens]] entry, so the rule would never apply; use a token's `tenant`{}",
                    r.id,
                    suggestion(tenant, tokens.iter().filter_map(|t| t.tenant.as_deref()))
                );
            }
        }
        config.origin = Some(origin.to_owned());
        let store = raw.get("store");
        if store.and_then(|s| s.get("path")).is_some() && store.and_then(|s| s.get("url")).is_some()
        {
            bail!(
                "{origin}: [store] sets both `path` (a SQLite file) and `url` (a PostgreSQL database); keep one: `url` for a database several replicas share, `path` for the file"
            );
        }
        if config.store.path.starts_with("~") {
            bail!(
                "{origin}: [store] path {:?}: `~` is not expanded in a path; write the full path, or \"${{env:HOME}}/{}\"",
                config.store.path.display(),
                config
                    .store
                    .path
                    .strip_prefix("~")
                    .unwrap_or(&config.store.path)
                    .display()
            );
        }
        if config.store.path.as_os_str().is_empty() {
            bail!(
                "{origin}: [store] path is empty: give the SQLite file, e.g. path = \"./quiver.db\" (or leave the key out for that default)"
            );
        }
        if let Some(url) = &config.store.url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            bail!(
                "{origin}: [store] url = {:?} is not a PostgreSQL URL: write postgres://user:password@host:5432/database (or remove the key to keep the SQLite file of `path`)",
                quiver_store_postgres::redact(url)
            );
        }
        if config.store.retention_days == Some(0) {
            bail!(
                "{origin}: [store] retention_days = 0 would delete the whole execution log and every stored session each time `serve`, `call` or `search` starts; give a number of days (at least 1), or remove the key to keep everything"
            );
        }
        if config.store.busy_timeout_ms > i32::MAX as u64 {
            bail!(
                "{origin}: [store] busy_timeout_ms = {} is longer than SQLite waits on a lock (at most {} ms, about 24.8 days); a few seconds is plenty (the default is 5000)",
                config.store.busy_timeout_ms,
                i32::MAX
            );
        }
        if config.store.log_linger_ms > MAX_LOG_LINGER_MS {
            bail!(
                "{origin}: [store] log_linger_ms = {} is longer than {MAX_LOG_LINGER_MS} ms: rows would wait that long for their commit (and every command's exit with them); a few ms already share commits (the default is 2)",
                config.store.log_linger_ms
            );
        }
        Ok(config)
    }

    /// Resolves the relative paths the file at `dir` gives (`text`) against `dir`, so the
    /// file means the same from any working directory: `[store] path` when the file sets
    /// it (the default `./quiver.db` stays in the working directory), every `[skills]`
    /// directory, `[catalog] dir`, `[search] model_dir`, and each stdio server's `cwd` and a
    /// `command` that is a relative path (`./bin/server`; a bare name like `npx` is looked
    /// up on `PATH`).
    pub(crate) fn rebase(&mut self, dir: &Path, text: &str) {
        let sets_store_path = toml::from_str::<toml::Value>(text)
            .ok()
            .and_then(|v| v.get("store")?.get("path").cloned())
            .is_some();
        if sets_store_path {
            self.store.path = rebased(dir, &self.store.path);
        }
        let skills = &mut self.skills;
        for d in skills
            .dirs
            .iter_mut()
            .chain(&mut skills.project_dirs)
            .chain(&mut skills.user_dirs)
            .chain(&mut skills.driver_dirs)
            .chain(&mut skills.commands_dirs)
        {
            *d = rebased(dir, d);
        }
        for s in &mut self.mcp.servers {
            rebase_server(s, dir);
        }
        if let Some(catalog) = &mut self.catalog.dir {
            *catalog = rebased(dir, catalog);
        }
        if let Some(model) = &mut self.search.model_dir {
            *model = rebased(dir, model);
        }
    }

    /// The skills of the catalog directory (`<dir>/skills`) join the explicit tier.
    fn add_catalog_skills(&mut self) {
        if let Some(dir) = &self.catalog.dir {
            let skills = dir.join("skills");
            if skills.is_dir() && !self.skills.dirs.contains(&skills) {
                self.skills.dirs.push(skills);
            }
        }
    }

    /// Loads `path`, or `./quiver.toml` when it exists, or the defaults.
    pub fn load(path: Option<&Path>) -> anyhow::Result<(Config, Option<PathBuf>)> {
        let env = |k: &str| std::env::var(k).ok();
        let path = match path {
            Some(p) => Some(p.to_path_buf()),
            None => Some(PathBuf::from("quiver.toml")).filter(|p| p.exists()),
        };
        match path {
            None => Ok((Config::default(), None)),
            Some(p) => {
                let text = std::fs::read_to_string(&p)
                    .with_context(|| format!("cannot read config {}", p.display()))?;
                let mut config = Config::parse(&text, &p.display().to_string(), &env)?;
                config.rebase(p.parent().unwrap_or(Path::new("")), &text);
                config.source = Some(p.clone());
                config.add_catalog_skills();
                Ok((config, Some(p)))
            }
        }
    }
}

/// `path` against `dir` when it is relative.
fn rebased(dir: &Path, path: &Path) -> PathBuf {
    if path.is_relative() && !dir.as_os_str().is_empty() {
        dir.join(path)
    } else {
        path.to_path_buf()
    }
}

/// A stdio server's relative `cwd`, and a `command` that is a relative path (it has a
/// `/`), against `dir`, the directory of the file that configures it.
pub(crate) fn rebase_server(server: &mut quiver_mcp_adapter::ServerConfig, dir: &Path) {
    if let Some(cwd) = &mut server.cwd {
        *cwd = rebased(dir, cwd);
    }
    if let Some(command) = &mut server.command
        && command.contains('/')
        && Path::new(command.as_str()).is_relative()
    {
        *command = rebased(dir, Path::new(command.as_str()))
            .to_string_lossy()
            .into_owned();
    }
}

#[cfg(test)]
mod tests;
