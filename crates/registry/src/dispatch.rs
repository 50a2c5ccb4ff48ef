//! The dispatcher: the one pipeline every call takes.
//!
//! Over 800 lines: the call's steps before the layers (normalize, admit, prepare) and after
//! them (record, observe) share the call's private state; the layers themselves live in
//! `layers/`.

use std::{
    sync::{
        Arc, OnceLock, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use async_trait::async_trait;
use futures::future::join_all;
use quiver_contract::{
    Alternative, CallContext, Capabilities, Envelope, ErrKind, HintKind, NARRATION_KEYS,
    ToolInvoker, Warning, args_hash_canonical, canonical_json,
};
use serde_json::{Map, Value};
use tower::{ServiceBuilder, ServiceExt};

use crate::{
    CallMeasure, CallObserver, CallRecord, Catalog, Entry, Metrics, NoPolicy, NullRecorder,
    Outcome, PolicyAction, PolicyCheck, PolicyRequest, PolicyVerdict, ToolCallRecorder,
    kept::KeptResults,
    layers::{
        Call, ToolService,
        concurrency::{Concurrency, ConcurrencyConfig, ConcurrencyLayer},
        output_check::{OutputCheck, OutputCheckLayer},
        recover::{Recover, RecoverLayer},
        result_limit::{ResultLimit, ResultLimitConfig, ResultLimitLayer},
        telemetry::{Telemetry, TelemetryLayer},
        timeout::{Timeout, TimeoutConfig, TimeoutLayer},
    },
    state::Sessions,
    suggest::did_you_mean,
    validate,
};

/// Dispatcher configuration. Every field has a default.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchConfig {
    /// Timeouts.
    pub timeout: TimeoutConfig,
    /// Concurrency limits.
    pub concurrency: ConcurrencyConfig,
    /// Result limits.
    pub result_limit: ResultLimitConfig,
    /// The Nth consecutive identical call in a session is refused (default 4).
    pub loop_guard_threshold: u32,
    /// After this many failures of the same call, results carry a "try a different approach"
    /// hint (default 3).
    pub repeat_failure_threshold: u32,
    /// Largest accepted arguments, in bytes of JSON (default 1 MiB).
    pub max_input_bytes: usize,
    /// Deepest tool-calls-tool nesting (default 8).
    pub max_depth: u32,
    /// Sessions whose state is kept (least recently used are forgotten first).
    pub max_sessions: usize,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            timeout: TimeoutConfig::default(),
            concurrency: ConcurrencyConfig::default(),
            result_limit: ResultLimitConfig::default(),
            loop_guard_threshold: 4,
            repeat_failure_threshold: 3,
            max_input_bytes: 1 << 20,
            max_depth: 8,
            max_sessions: 100_000,
        }
    }
}

impl DispatchConfig {
    /// Sets the timeouts.
    pub fn with_timeout(mut self, t: TimeoutConfig) -> Self {
        self.timeout = t;
        self
    }

    /// Sets the concurrency limits.
    pub fn with_concurrency(mut self, c: ConcurrencyConfig) -> Self {
        self.concurrency = c;
        self
    }

    /// Sets the result limits.
    pub fn with_result_limit(mut self, r: ResultLimitConfig) -> Self {
        self.result_limit = r;
        self
    }

    /// Sets the input size limit.
    pub fn with_max_input_bytes(mut self, n: usize) -> Self {
        self.max_input_bytes = n;
        self
    }
}

/// One call of a batch.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BatchCall {
    /// The tool name.
    pub name: String,
    /// The arguments.
    pub input: Value,
}

impl BatchCall {
    /// A batch call.
    pub fn new(name: impl Into<String>, input: Value) -> Self {
        BatchCall {
            name: name.into(),
            input,
        }
    }
}

/// The middleware stack as one concrete type: cloning it per call is a handful of reference
/// counts, where a boxed service would cost an allocation for the clone and another for the
/// future.
type Stack = Telemetry<Recover<Timeout<Concurrency<ResultLimit<OutputCheck<ToolService>>>>>>;

/// What [`Dispatcher::reconfigure`] replaces together: the configuration and the middleware
/// stack built from it.
struct Live {
    config: Arc<DispatchConfig>,
    stack: Stack,
    /// The concurrency layer, whose queues a reconfiguration keeps when the concurrency
    /// limits did not change.
    concurrency: ConcurrencyLayer,
}

struct Inner {
    catalog: Arc<Catalog>,
    /// Whole results shaped to their budget, kept for their sessions.
    kept: Arc<KeptResults>,
    live: std::sync::RwLock<Live>,
    recorder: Arc<dyn ToolCallRecorder>,
    policy: Arc<dyn PolicyCheck>,
    observers: Vec<Arc<dyn CallObserver>>,
    metrics: Arc<Metrics>,
    sessions: Sessions,
    invoker: Arc<dyn ToolInvoker>,
    next_id: AtomicU64,
    id_prefix: String,
    /// Record hand-overs running in tasks of their own (see `record` and `Unfinished`),
    /// waited for by [`Dispatcher::drain_records`].
    handovers: tokio_util::task::TaskTracker,
    /// Set by [`Dispatcher::begin_shutdown`]: a call cancelled from then on was cancelled
    /// by the shutdown, not by its caller.
    stopping: std::sync::atomic::AtomicBool,
}

impl Inner {
    fn config(&self) -> Arc<DispatchConfig> {
        self.live
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .config
            .clone()
    }

    fn stack(&self) -> Stack {
        self.live
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .stack
            .clone()
    }
}

/// The one dispatch pipeline. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("config", &self.config())
            .finish_non_exhaustive()
    }
}

struct Invoker(Weak<Inner>);

#[async_trait]
impl ToolInvoker for Invoker {
    async fn invoke(&self, name: &str, input: Value, parent: &CallContext) -> Envelope {
        let Some(inner) = self.0.upgrade() else {
            return Envelope::err(ErrKind::NotAvailable, "the dispatcher has shut down");
        };
        let mut ctx = parent.clone();
        ctx.cancel = parent.cancel.child_token();
        ctx.reasoning = None;
        ctx.parent_call_id = parent.call_id.clone();
        ctx.call_id = None;
        ctx.depth = parent.depth + 1;
        Dispatcher { inner }.call(name, input, ctx).await
    }
}

/// Builder for a [`Dispatcher`].
pub struct DispatcherBuilder {
    catalog: Arc<Catalog>,
    config: DispatchConfig,
    recorder: Arc<dyn ToolCallRecorder>,
    policy: Arc<dyn PolicyCheck>,
    observers: Vec<Arc<dyn CallObserver>>,
    metrics: Arc<Metrics>,
    kept: Option<Arc<KeptResults>>,
}

impl std::fmt::Debug for DispatcherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherBuilder").finish_non_exhaustive()
    }
}

impl DispatcherBuilder {
    /// Sets the configuration.
    pub fn config(mut self, config: DispatchConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the recorder.
    pub fn recorder(mut self, recorder: Arc<dyn ToolCallRecorder>) -> Self {
        self.recorder = recorder;
        self
    }

    /// Sets the policy check.
    pub fn policy(mut self, policy: Arc<dyn PolicyCheck>) -> Self {
        self.policy = policy;
        self
    }

    /// Adds a call observer.
    pub fn observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Shares a metrics registry.
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Keeps shaped results in `kept` (shared with a `read_result` tool made before the
    /// dispatcher); by default the dispatcher makes its own, of the configured size.
    pub fn kept_results(mut self, kept: Arc<KeptResults>) -> Self {
        self.kept = Some(kept);
        self
    }

    /// Builds the dispatcher; the middleware stack is assembled here, outermost first.
    pub fn build(self) -> Dispatcher {
        let concurrency = ConcurrencyLayer::new(self.config.concurrency.clone());
        let kept = self
            .kept
            .unwrap_or_else(|| Arc::new(KeptResults::new(self.config.result_limit.kept_bytes)));
        kept.set_per_session(self.config.result_limit.kept_bytes);
        let stack = stack(&self.config, &self.metrics, &concurrency, &kept);
        let id_prefix = format!(
            "{:x}",
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_micros())
                .unwrap_or(0)
        );
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
            catalog: self.catalog,
            kept,
            sessions: Sessions::new(self.config.max_sessions),
            live: std::sync::RwLock::new(Live {
                config: Arc::new(self.config),
                stack,
                concurrency,
            }),
            recorder: self.recorder,
            policy: self.policy,
            observers: self.observers,
            metrics: self.metrics,
            invoker: Arc::new(Invoker(weak.clone())),
            next_id: AtomicU64::new(1),
            id_prefix,
            handovers: tokio_util::task::TaskTracker::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
        Dispatcher { inner }
    }
}

/// The middleware stack of `config`, outermost first.
fn stack(
    config: &DispatchConfig,
    metrics: &Arc<Metrics>,
    concurrency: &ConcurrencyLayer,
    kept: &Arc<KeptResults>,
) -> Stack {
    ServiceBuilder::new()
        .layer(TelemetryLayer::new(metrics.clone()))
        .layer(RecoverLayer)
        .layer(TimeoutLayer::new(config.timeout.clone()))
        .layer(concurrency.clone())
        .layer(ResultLimitLayer::new(config.result_limit.clone()).keeping(kept.clone()))
        .layer(OutputCheckLayer)
        .service(ToolService)
}

/// What kind of JSON value `v` is, as a hint names it.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The name of the surface's search tool, which error texts advise calling.
const TOOL_SEARCH: &str = "tool_search";

/// The error kinds of calls refused before the tool ran: unknown, forbidden, denied,
/// looping, too large or too deep, or a `tools/call` the MCP server could not read
/// (`invalid_params`; over the transport: `invalid_request`, `parse_error`). Whatever else
/// failed had run (an upstream that was not available, a
/// tool's own error kind).
pub(crate) const REFUSED_KINDS: &[&str] = &[
    "invalid_params",
    "undefined_tool",
    "forbidden",
    "policy_denied",
    "loop_guard",
    "input_too_large",
    "too_deep",
    "invalid_request",
    "parse_error",
];

/// How the dispatcher's answer for a tool whose provider is not up begins (see
/// [`ABSENT_TEXT`]; [`refused_before_running`] matches it).
fn absent_prefix(tool: &str) -> String {
    format!("`{tool}{ABSENT_TEXT}")
}

/// What follows the tool's name in the dispatcher's answer for a tool whose provider is
/// not up (`` `mcp__git__status` is not available: MCP server "git" is ... ``).
pub(crate) const ABSENT_TEXT: &str = "` is not available: ";

/// Whether a logged call was refused before its tool ran: an error kind of a refusal (unknown
/// tool, forbidden, denied, looping, too large or too deep, unreadable), or the
/// dispatcher's own schema hint on the arguments (a schema hint the tool returned after it
/// ran does not count), for a reader of the execution log that tells the two apart. (What
/// counts as called for `requires_prior` is an Ok answer; the resident floor's usage is an
/// Ok or a hint the tool gave.)
pub fn refused_before_running(
    err_kind: Option<&ErrKind>,
    hint_kind: Option<HintKind>,
    error: Option<&str>,
    tool: &str,
) -> bool {
    match (err_kind, hint_kind) {
        // The dispatcher's own answer for a tool whose provider is not up (the tool is not
        // in the catalog): nothing ran. An upstream that failed a call it was sent is
        // `not_available` too, and counts.
        (Some(ErrKind::NotAvailable), _) => {
            error.is_some_and(|m| m.strip_prefix(&absent_prefix(tool)).is_some())
        }
        (Some(k), _) => REFUSED_KINDS.contains(&k.as_str()),
        (None, Some(HintKind::Schema)) => {
            error.is_some_and(|m| validate::refused_arguments(m, tool))
        }
        _ => false,
    }
}

/// How many of a session's newest logged calls [`Dispatcher::restore_called`] reads.
const RESTORED_CALLS: usize = 1000;
/// The most characters of narration (`reasoning` and the like) a call keeps for its log row.
const MAX_REASONING_CHARS: usize = 4000;

/// The metrics label of calls to names that are not in the catalog.
pub const UNDEFINED_TOOLS: &str = "(undefined)";

/// A running call's record, written from `Drop` when the call's future is dropped before
/// it finished (the caller went away): every call is recorded, whatever its outcome.
struct Unfinished<'a> {
    dispatcher: &'a Dispatcher,
    parts: Option<Running>,
}

/// What a running call's record needs.
struct Running {
    /// The tool (its name, without a copy per call).
    entry: Arc<Entry>,
    input: Value,
    hash: String,
    /// Whether it repeats the session's call before it (see [`Prepared::Run`]).
    repeat: bool,
    who: Who,
    t0: Instant,
    started: Arc<OnceLock<Instant>>,
}

impl Unfinished<'_> {
    fn input(&self) -> &Value {
        &self.parts.as_ref().expect("set until the end").input
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        let Some(Running {
            entry,
            input,
            hash,
            who,
            t0,
            started,
            ..
        }) = self.parts.take()
        else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(tool = %entry.spec.name, "a dropped call could not be recorded: no runtime");
            return;
        };
        let dispatcher = self.dispatcher.clone();
        let handovers = dispatcher.inner.handovers.clone();
        handovers.spawn_on(
            async move {
                let name = entry.spec.name.as_str();
                let envelope = Envelope::err(
                    ErrKind::Cancelled,
                    format!(
                        "the call to `{}` was dropped: its caller went away",
                        quiver_contract::quoted_name(name)
                    ),
                );
                let queued = started
                    .get()
                    .map_or_else(|| t0.elapsed(), |s| s.saturating_duration_since(t0));
                let counted = Counted::ran(name, &entry.family);
                dispatcher
                    .record(name, input, hash, &envelope, &who, counted, queued, t0)
                    .await;
            },
            &rt,
        );
    }
}

/// What the observers' measure of a call names: the tool as counted and its family, and
/// whether it was refused before it ran.
#[derive(Clone, Copy)]
struct Counted<'a> {
    tool: &'a str,
    family: Option<&'a str>,
    refused: bool,
}

impl<'a> Counted<'a> {
    /// A call that passed admission: its tool is the catalog's.
    fn ran(tool: &'a str, family: &'a str) -> Self {
        Counted {
            tool,
            family: Some(family),
            refused: false,
        }
    }
}

/// What post-call bookkeeping and the recorder need of a call's context (so the context
/// itself can move into the middleware without a clone).
struct Who {
    session: Option<Arc<str>>,
    tenant: Option<Arc<str>>,
    principal: Option<Arc<str>>,
    call_id: Option<Arc<str>>,
    parent_call_id: Option<Arc<str>>,
    reasoning: Option<String>,
}

impl Who {
    fn of(ctx: &CallContext) -> Who {
        Who {
            session: ctx.session.clone(),
            tenant: ctx.tenant.clone(),
            principal: ctx.principal.clone(),
            call_id: ctx.call_id.clone(),
            parent_call_id: ctx.parent_call_id.clone(),
            reasoning: ctx.reasoning.clone(),
        }
    }
}

/// Where a call ended before reaching the tool, or the prepared call.
enum Prepared {
    Done(Envelope),
    /// The tool, the warnings so far, and whether the call repeats the one before it in its
    /// session (the loop guard's streak is past one).
    Run(Arc<Entry>, Vec<Warning>, bool),
}

/// `<prefix>-<n>` as an `Arc<str>`, with one allocation and no formatting machinery.
fn call_id(prefix: &str, mut n: u64) -> Arc<str> {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let digits = &digits[at..];
    let mut buf = [0u8; 64];
    let len = prefix.len() + 1 + digits.len();
    if len <= buf.len() {
        buf[..prefix.len()].copy_from_slice(prefix.as_bytes());
        buf[prefix.len()] = b'-';
        buf[prefix.len() + 1..len].copy_from_slice(digits);
        if let Ok(id) = std::str::from_utf8(&buf[..len]) {
            return Arc::from(id);
        }
    }
    let digits = std::str::from_utf8(digits).unwrap_or("0");
    Arc::from(format!("{prefix}-{digits}"))
}

fn emphatic(count: u32, rule: &str, message: &str) -> String {
    match count {
        1 => format!("{message} (policy `{rule}`)"),
        2 => format!("Second time this session: {message} (policy `{rule}`). Please follow it."),
        n => format!("STOP. You have skipped policy `{rule}` {n} times this session: {message}"),
    }
}

impl Dispatcher {
    /// Starts building a dispatcher over `catalog`, with defaults: no policy, no recorder.
    pub fn builder(catalog: Arc<Catalog>) -> DispatcherBuilder {
        DispatcherBuilder {
            catalog,
            config: DispatchConfig::default(),
            recorder: Arc::new(NullRecorder),
            policy: Arc::new(NoPolicy),
            observers: Vec::new(),
            metrics: Arc::new(Metrics::new()),
            kept: None,
        }
    }

    /// A dispatcher with defaults over `catalog`.
    pub fn new(catalog: Arc<Catalog>) -> Dispatcher {
        Self::builder(catalog).build()
    }

    /// The catalog it dispatches into.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.inner.catalog
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<DispatchConfig> {
        self.inner.config()
    }

    /// Replaces the configuration for the calls that start from now on, as a reload of
    /// `quiver serve` does; calls already running finish under the limits they started
    /// with. When the concurrency limits are unchanged their queues are kept; when they
    /// changed, new calls queue under the new limits while the calls admitted before
    /// finish, so for that moment both may run. `max_sessions` is fixed when the
    /// dispatcher is built.
    pub fn reconfigure(&self, config: DispatchConfig) {
        let mut live = self
            .inner
            .live
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if config.concurrency != live.config.concurrency {
            live.concurrency = ConcurrencyLayer::new(config.concurrency.clone());
        }
        self.inner
            .kept
            .set_per_session(config.result_limit.kept_bytes);
        live.stack = stack(
            &config,
            &self.inner.metrics,
            &live.concurrency,
            &self.inner.kept,
        );
        live.config = Arc::new(config);
    }

    /// The recorder.
    pub fn recorder(&self) -> &Arc<dyn ToolCallRecorder> {
        &self.inner.recorder
    }

    /// Brings back which tools a session has called (what `requires_prior` policy rules
    /// check) from the execution log, for a session that continues in a new process: a
    /// restarted server, or each `quiver call --session S`. Reads the session's newest
    /// `RESTORED_CALLS` calls; as in the live process only calls that answered Ok count
    /// (not an error or a hint, nor a call refused before it ran: unknown tool, forbidden,
    /// denied by policy, loop guard, bad arguments).
    pub async fn restore_called(
        &self,
        session: &str,
        log: &dyn crate::store::CallLog,
    ) -> Result<usize, crate::store::StoreError> {
        let mut filter = crate::store::CallFilter::recent(RESTORED_CALLS);
        filter.session = Some(session.to_owned());
        let calls = log.recent_calls(filter).await?;
        let ran: Vec<&str> = calls
            .iter()
            // Ok: neither an Err nor a Hint (so never a call refused before it ran).
            .filter(|c| c.err_kind.is_none() && c.hint_kind.is_none())
            .map(|c| c.tool_name.as_str())
            .collect();
        self.inner.sessions.with(&Arc::from(session), |st| {
            for tool in &ran {
                st.mark_called(tool);
            }
        });
        Ok(ran.len())
    }

    /// Forgets a session's dispatch state (loop guard, failures, policy counts).
    pub fn end_session(&self, session: &str) {
        self.inner.sessions.end(session);
        self.inner.kept.end_session(session);
    }

    /// The whole results kept for reading back (`read_result`, `quiver://results/<id>`).
    pub fn kept_results(&self) -> &Arc<KeptResults> {
        &self.inner.kept
    }

    /// Calls a tool with arguments given as raw JSON text; malformed JSON is a schema hint.
    pub async fn call_json(&self, name: &str, raw: &str, mut ctx: CallContext) -> Envelope {
        self.assign_call_id(&mut ctx);
        let input = if raw.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            match serde_json::from_str::<Value>(raw) {
                Ok(v) => v,
                Err(e) => {
                    let shown = quiver_contract::quoted_name(name);
                    // serde_json stops at 128 levels of nesting: valid JSON, but too deep.
                    let why = if e.to_string().starts_with("recursion limit exceeded") {
                        format!(
                            "are nested too deeply ({e}: more than 128 levels of arrays and objects). Send flatter data"
                        )
                    } else {
                        format!(
                            "are not valid JSON ({e}). Send one JSON object, e.g. {{\"key\": \"value\"}}"
                        )
                    };
                    // A tool the caller cannot call is answered as such first: a hint
                    // about the arguments of a tool that does not exist misleads.
                    let callable = ctx.capabilities.allows(name)
                        && self
                            .inner
                            .catalog
                            .lookup(name)
                            .is_some_and(|e| e.spec.is_live());
                    let envelope = if callable {
                        Envelope::hint(
                            HintKind::Schema,
                            format!("the arguments to `{shown}` {why}."),
                            Vec::new(),
                        )
                    } else {
                        self.undefined(name, &ctx, &|_| true)
                    };
                    return self
                        .finish_early(
                            name,
                            Value::String(raw.to_owned()),
                            None,
                            envelope,
                            ctx,
                            Instant::now(),
                        )
                        .await;
                }
            }
        };
        self.call(name, input, ctx).await
    }

    /// Gives the call an id unless the caller gave one (every logged row has one).
    fn assign_call_id(&self, ctx: &mut CallContext) {
        if ctx.call_id.is_none() {
            let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
            ctx.call_id = Some(call_id(&self.inner.id_prefix, n));
        }
    }

    /// Answers with `envelope` a call that the layer above refused before dispatching it (a
    /// tool the session's mode does not list, a request the MCP transport could not read):
    /// counted, and recorded like a refusal of the dispatcher's own, so every call has its
    /// row in the log.
    pub async fn refuse(
        &self,
        name: &str,
        input: Value,
        mut ctx: CallContext,
        envelope: Envelope,
    ) -> Envelope {
        let t0 = Instant::now();
        self.assign_call_id(&mut ctx);
        self.finish_early(name, input, None, envelope, ctx, t0)
            .await
    }

    /// Runs one call through the whole pipeline and returns its envelope. Never panics on
    /// bad input; every call is recorded.
    pub async fn call(&self, name: &str, input: Value, mut ctx: CallContext) -> Envelope {
        let t0 = Instant::now();
        let inner = &*self.inner;
        self.assign_call_id(&mut ctx);
        let found = inner.catalog.lookup(name);
        let (input, canonical) = match self.normalize(name, found.as_ref(), input, &mut ctx) {
            Ok(v) => v,
            Err(early) => {
                let (input, mut envelope) = *early;
                // A tool that is not there, not the caller's, or refused by policy gets that
                // answer whatever the shape or size of its arguments, as with valid ones.
                if let Err(refused) = self.admit(name, found, &input, &ctx) {
                    envelope = *refused;
                }
                return self
                    .finish_early(name, input, None, envelope, ctx, t0)
                    .await;
            }
        };
        let hash = args_hash_canonical(name, &canonical);
        let (entry, mut warnings, repeat) = match self.prepare(name, found, &input, &hash, &ctx) {
            Prepared::Done(envelope) => {
                return self
                    .finish_early(name, input, Some(hash), envelope, ctx, t0)
                    .await;
            }
            Prepared::Run(entry, warnings, repeat) => (entry, warnings, repeat),
        };
        ctx.invoker = Some(inner.invoker.clone());
        // Until the record is written, a dropped call (an HTTP client that went away while
        // its request was answered in the request's own task) is still recorded.
        let started = Arc::new(OnceLock::new());
        let mut unfinished = Unfinished {
            dispatcher: self,
            parts: Some(Running {
                entry: entry.clone(),
                input,
                hash,
                repeat,
                who: Who::of(&ctx),
                t0,
                started: started.clone(),
            }),
        };
        let cancel = ctx.cancel.clone();
        let client = ctx.client.clone();
        let call = Call {
            entry: entry.clone(),
            input: unfinished.input().clone(),
            ctx,
            started: started.clone(),
        };
        let stopping = &inner.stopping;
        let cancelled = || {
            let why = if stopping.load(std::sync::atomic::Ordering::Acquire) {
                "because Quiver is shutting down; whether it finished is unknown, check \
                 before calling it again once Quiver is back"
            } else {
                client
                    .as_ref()
                    .and_then(|c| c.cancelled_because())
                    .unwrap_or("by the caller")
            };
            Envelope::err(
                ErrKind::Cancelled,
                format!(
                    "the call to `{}` was cancelled {why}",
                    quiver_contract::quoted_name(name)
                ),
            )
        };
        let mut envelope = if cancel.is_cancelled() {
            cancelled()
        } else {
            let run = inner.stack().oneshot(call);
            // The call is polled first: a tool that finishes at once never registers with the
            // cancellation token (a lock per registration); a pending one is raced against it.
            // A tool that saw the token and answered `cancelled` itself says why in the
            // dispatcher's words (the caller, or Quiver's shutdown, and what that means).
            tokio::select! {
                biased;
                out = run => match out {
                    Ok(e) if cancel.is_cancelled() && e.err_kind() == Some(&ErrKind::Cancelled) => {
                        cancelled()
                    }
                    Ok(e) => e,
                    Err(never) => match never {},
                },
                _ = cancel.cancelled() => cancelled(),
            }
        };
        let queued = started
            .get()
            .map(|s| s.saturating_duration_since(t0))
            .unwrap_or_else(|| t0.elapsed());
        if entry.spec.tabular
            && let Envelope::Ok { schema, .. } = &envelope
            && schema.is_empty()
        {
            warnings.push(Warning::new(
                "validator",
                "a tabular tool returned no columns; the result may be empty or malformed",
            ));
        }
        let Running {
            input,
            hash,
            repeat,
            who,
            ..
        } = unfinished.parts.take().expect("taken once");
        self.after(name, &hash, repeat, &mut envelope, warnings, &who);
        let counted = Counted::ran(name, &entry.family);
        self.record(name, input, hash, &envelope, &who, counted, queued, t0)
            .await;
        envelope
    }

    /// Checks the shape and size of the input and strips narration into the context.
    fn normalize(
        &self,
        name: &str,
        entry: Option<&Arc<Entry>>,
        input: Value,
        ctx: &mut CallContext,
    ) -> Result<(Value, String), Box<(Value, Envelope)>> {
        let mut map = match input {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                let kind = match &other {
                    Value::Array(_) => "an array",
                    Value::String(_) => "a string",
                    Value::Number(_) => "a number",
                    _ => "a boolean",
                };
                let envelope = Envelope::hint(
                    HintKind::Schema,
                    format!(
                        "the arguments to `{}` must be a JSON object, not {kind}",
                        quiver_contract::quoted_name(name)
                    ),
                    Vec::new(),
                );
                return Err(Box::new((other, envelope)));
            }
        };
        let declared: &[&str] = entry
            .map(|e| e.declared_narration.as_slice())
            .unwrap_or_default();
        // `reasoning` is the narration key tool lists advertise, as a string: any other
        // value is refused with a hint, so the model learns the shape it was shown. (The
        // other keys, which nothing advertises, are taken as they come.)
        if !declared.contains(&"reasoning")
            && let Some(v) = map.get("reasoning")
            && !matches!(v, Value::String(_) | Value::Null)
        {
            let envelope = Envelope::hint(
                HintKind::Schema,
                format!(
                    "{}{}`: `reasoning` must be a string (a sentence on why you make this call), not {}. Send it as text, or leave it out.",
                    validate::REFUSED_ARGUMENTS,
                    quiver_contract::quoted_name(name),
                    json_kind(v)
                ),
                Vec::new(),
            );
            return Err(Box::new((Value::Object(map), envelope)));
        }
        for key in NARRATION_KEYS {
            if declared.contains(&key) {
                continue;
            }
            // Other narration that is not a string (`{"thought": {"steps": [...]}}`) is
            // kept as its JSON text: the call goes on (it is optional and never reaches the
            // tool), and the log still has what the model said.
            if let Some(v) = map.remove(key)
                && ctx.reasoning.is_none()
                && let Some(mut s) = match v {
                    Value::String(s) => Some(s),
                    Value::Null => None,
                    other => Some(other.to_string()),
                }
                && !s.trim().is_empty()
            {
                // Narration is kept for the log, not counted as input: capped, so that it
                // cannot carry what `max_input_bytes` refuses.
                crate::layers::result_limit::truncate_chars(&mut s, MAX_REASONING_CHARS);
                ctx.reasoning = Some(s);
            }
        }
        let input = Value::Object(map);
        let canonical = canonical_json(&input);
        if canonical.len() > self.inner.config().max_input_bytes {
            let envelope = Envelope::err(
                ErrKind::Other("input_too_large".into()),
                format!(
                    "the arguments to `{}` are {} bytes; the limit is {} bytes. Send less data per call (split it, or pass a reference instead of the content).",
                    quiver_contract::quoted_name(name),
                    canonical.len(),
                    self.inner.config().max_input_bytes
                ),
            );
            return Err(Box::new((
                Value::String(format!("<{} bytes elided>", canonical.len())),
                envelope,
            )));
        }
        Ok((input, canonical))
    }

    /// The checks a call must pass whatever its arguments: its depth, that the tool exists
    /// and is the caller's, and the policy's denials (its warnings are returned, to be
    /// counted once the call passes the loop guard).
    fn admit(
        &self,
        name: &str,
        found: Option<Arc<Entry>>,
        input: &Value,
        ctx: &CallContext,
    ) -> Result<(Arc<Entry>, Vec<PolicyVerdict>), Box<Envelope>> {
        let inner = &*self.inner;
        if ctx.depth > inner.config().max_depth {
            return Err(Box::new(Envelope::err(
                ErrKind::Other("too_deep".into()),
                format!(
                    "`{}` was called {} levels deep; the limit is {}",
                    quiver_contract::quoted_name(name),
                    ctx.depth,
                    inner.config().max_depth
                ),
            )));
        }
        let entry = match found {
            Some(e) if e.spec.is_live() => e,
            _ => return Err(Box::new(self.undefined(name, ctx, &|_| true))),
        };
        // A tool the caller's credentials do not allow is, to the caller, a tool that does
        // not exist: the same answer as for a name nobody serves, so that guessing names
        // cannot tell which tools exist behind the allow-list.
        if !ctx.capabilities.allows(name) {
            return Err(Box::new(self.undefined(name, ctx, &|_| true)));
        }
        let session = &ctx.session;
        let verdicts = {
            let called = |tool: &str| match session {
                Some(s) => inner.sessions.with(s, |st| st.called(tool)),
                None => false,
            };
            inner.policy.check(&PolicyRequest {
                spec: &entry.spec,
                input,
                ctx,
                called_before: &called,
            })
        };
        // A denial ends the call here; a warning is counted (and its wording escalates)
        // only once the call passes the loop guard (in `prepare`): a refused repeat was not one more
        // skipping of the policy.
        let mut warned = Vec::new();
        for verdict in verdicts {
            match verdict.action {
                PolicyAction::Deny => {
                    inner.metrics.count_violation(name);
                    tracing::info!(tool = name, rule = %verdict.rule, action = ?verdict.action, "policy violation");
                    if let Some(s) = session {
                        inner
                            .sessions
                            .with(s, |st| st.record_violation(&verdict.rule));
                    }
                    return Err(Box::new(Envelope::err(
                        ErrKind::PolicyDenied,
                        format!(
                            "`{name}` was refused by policy `{}`: {}",
                            verdict.rule, verdict.message
                        ),
                    )));
                }
                PolicyAction::Warn => warned.push(verdict),
            }
        }
        Ok((entry, warned))
    }

    fn prepare(
        &self,
        name: &str,
        found: Option<Arc<Entry>>,
        input: &Value,
        hash: &str,
        ctx: &CallContext,
    ) -> Prepared {
        let (entry, warned) = match self.admit(name, found, input, ctx) {
            Ok(admitted) => admitted,
            Err(refused) => return Prepared::Done(*refused),
        };
        let inner = &*self.inner;
        let mut warnings = Vec::new();
        let session = ctx.session.clone();
        // After the policy: a tool it refuses gets its refusal whatever the arguments, not a
        // schema hint that shows the definition it hides and invites a retry it refuses.
        if let Some(hint) = validate::check(&entry, input) {
            return Prepared::Done(hint);
        }
        warnings.extend(validate::unlisted(&entry, input));
        let mut repeat = false;
        // The loop guard and the repeat-failure count watch the model's own calls: a call a
        // tool made (a custom tool's `call_tool`, an alias) is bounded by that tool's own
        // limits (calls, depth, time), and its repeats are not the model repeating itself.
        if let Some(s) = &session
            && ctx.depth == 0
        {
            // The call counts as called (for `requires_prior`) once it has answered Ok:
            // see `after`.
            let threshold = inner.config().loop_guard_threshold;
            let (streak, refused) = inner.sessions.with(s, |st| {
                let streak = st.bump_streak(hash);
                (streak, st.guarded(streak, threshold))
            });
            repeat = streak >= 2;
            if refused {
                return Prepared::Done(Envelope::err(
                    ErrKind::LoopGuard,
                    format!(
                        "refused: this is call {streak} in a row of `{name}` with the same arguments, and repeating it will not change the result. Change the arguments, use another tool, or tell the user what is blocking you."
                    ),
                ));
            }
        }
        for verdict in warned {
            inner.metrics.count_violation(name);
            tracing::info!(tool = name, rule = %verdict.rule, action = ?verdict.action, "policy violation");
            let count = match &session {
                Some(s) => inner
                    .sessions
                    .with(s, |st| st.record_violation(&verdict.rule)),
                None => 1,
            };
            warnings.push(Warning::new(
                "policy",
                emphatic(count, &verdict.rule, &verdict.message),
            ));
        }
        Prepared::Run(entry, warnings, repeat)
    }

    /// Whether a caller with these credentials has `tool_search` to turn to: it may call it
    /// and the catalog has it.
    pub fn offers_search(&self, capabilities: &Capabilities) -> bool {
        capabilities.offers(TOOL_SEARCH) && self.inner.catalog.lookup(TOOL_SEARCH).is_some()
    }

    /// What a caller with these credentials who did not find a tool can do next, as a
    /// sentence to append to an error: call `tool_search` when it may (and the catalog has
    /// it), else use the tools it has; advice to call a tool it would be refused sends a
    /// model round in circles.
    pub fn search_advice(&self, capabilities: &Capabilities) -> &'static str {
        if self.offers_search(capabilities) {
            " Call tool_search with a short description of what you need to load more tools."
        } else {
            " Use one of the tools in your tool list."
        }
    }

    /// The answer to a call of a tool the catalog does not have (or no longer serves): why,
    /// if its provider is configured but not up; else the look-alikes the caller could call
    /// instead, among the live tools its credentials allow and `sees` keeps (a layer above
    /// passes its own view, for example the session's mode, so a plan-mode session is not
    /// steered to a tool it would be refused).
    pub fn undefined(
        &self,
        name: &str,
        ctx: &CallContext,
        sees: &dyn Fn(&str) -> bool,
    ) -> Envelope {
        // A tool of a provider that is configured but not up (an MCP server still
        // connecting or down): say so, and do not steer the model to a look-alike of
        // another provider, which may do something else.
        if ctx.capabilities.offers(name)
            && let Some(why) = self.inner.catalog.why_absent(name)
        {
            return Envelope::err(
                ErrKind::NotAvailable,
                format!(
                    "{}{why}.",
                    absent_prefix(&quiver_contract::quoted_name(name))
                ),
            );
        }
        let names = self.inner.catalog.names();
        let visible = names.iter().filter(|n| {
            ctx.capabilities.offers(n)
                && sees(n)
                && self
                    .inner
                    .catalog
                    .lookup(n)
                    .is_some_and(|e| e.spec.is_live() && !e.spec.category.is_internal())
        });
        let alternatives: Vec<Alternative> = did_you_mean(name, visible.map(String::as_str), 3)
            .into_iter()
            .map(|(label, score)| Alternative::new(label, score))
            .collect();
        let mut message = format!(
            "there is no tool named `{}`{}.",
            quiver_contract::quoted_name(name),
            if ctx.depth == 0 {
                " in your tool list"
            } else {
                ""
            }
        );
        if !alternatives.is_empty() {
            let list: Vec<String> = alternatives
                .iter()
                .map(|a| format!("`{}`", a.label))
                .collect();
            message.push_str(&format!(" Did you mean {}?", list.join(", ")));
        }
        // Advice is for the model: a call a tool made (a custom tool's `call_tool`) is the
        // tool's author's to fix, and the model cannot load a tool for the script.
        if ctx.depth == 0 {
            message.push_str(self.search_advice(&ctx.capabilities));
        }
        Envelope::err(ErrKind::UndefinedTool, message)
    }

    /// Post-call bookkeeping: warnings, repeat-failure hint, session state, observers.
    fn after(
        &self,
        name: &str,
        hash: &str,
        repeat: bool,
        envelope: &mut Envelope,
        warnings: Vec<Warning>,
        ctx: &Who,
    ) {
        let inner = &*self.inner;
        // A call that did not reach its tool's work (its backend was down, the caller
        // cancelled it) says nothing about the call itself: it leaves the loop guard's
        // streak and the failure count as they were, so the retry its error advises is not
        // refused once the backend is back.
        let transient = matches!(
            envelope.err_kind(),
            Some(ErrKind::NotAvailable | ErrKind::Cancelled)
        );
        // What a repeat returned, before this call's warnings join it: the loop guard
        // refuses only repeats that keep returning the same (an interactive tool asks
        // again and gets another answer). A tool that answered Ok has been called, as a
        // policy's `requires_prior` means it: a preview that failed, timed out or answered
        // with a hint (its input refused, too many rows) showed nothing. One lock for both.
        let note = repeat && !transient;
        let called = envelope.is_ok();
        if (note || called)
            && let Some(s) = &ctx.session
        {
            inner.sessions.with(s, |st| {
                if note {
                    st.note_result(hash, || result_fingerprint(envelope));
                }
                if called {
                    st.mark_called(name);
                }
            });
        }
        for w in warnings {
            envelope.push_warning(w);
        }
        if let Some(s) = &ctx.session
            && transient
        {
            inner.sessions.with(s, |st| st.unbump_streak(hash));
        }
        if let Some(s) = &ctx.session
            && !envelope.is_ok()
            && !transient
            && ctx.parent_call_id.is_none()
        {
            let failures = inner.sessions.with(s, |st| st.record_failure(hash));
            if failures >= inner.config().repeat_failure_threshold {
                envelope.push_warning(Warning::new(
                    "repeat_failure",
                    format!(
                        "`{name}` has now failed {failures} times with these same arguments. Try a different approach instead of repeating it."
                    ),
                ));
            }
        }
        for o in &inner.observers {
            o.call_finished(ctx.session.as_deref(), name, envelope);
        }
    }

    async fn finish_early(
        &self,
        name: &str,
        input: Value,
        hash: Option<String>,
        mut envelope: Envelope,
        ctx: CallContext,
        t0: Instant,
    ) -> Envelope {
        let hash = hash.unwrap_or_else(|| args_hash_canonical(name, &canonical_json(&input)));
        // Names the caller made up share one counter (the execution log keeps each name):
        // one per distinct name would grow without bound in a long-running server.
        let found = self.inner.catalog.lookup(name);
        let counted = Counted {
            tool: if found.is_some() {
                name
            } else {
                UNDEFINED_TOOLS
            },
            family: found.as_ref().map(|e| &*e.family),
            refused: true,
        };
        self.inner.metrics.count(counted.tool, &envelope);
        if let Some(s) = &ctx.session
            && !envelope.is_ok()
            && envelope.err_kind() != Some(&ErrKind::LoopGuard)
            && ctx.depth == 0
        {
            let failures = self.inner.sessions.with(s, |st| st.record_failure(&hash));
            if failures >= self.inner.config().repeat_failure_threshold {
                envelope.push_warning(Warning::new(
                        "repeat_failure",
                        format!("this same call has now failed {failures} times. Try a different approach instead of repeating it."),
                    ));
            }
        }
        self.record(
            name,
            input,
            hash,
            &envelope,
            &Who::of(&ctx),
            counted,
            Duration::ZERO,
            t0,
        )
        .await;
        envelope
    }

    /// Hands the call's record to the recorder, after the observers' measure of it.
    #[allow(clippy::too_many_arguments)]
    async fn record(
        &self,
        name: &str,
        input: Value,
        args_hash: String,
        envelope: &Envelope,
        ctx: &Who,
        counted: Counted<'_>,
        queued: Duration,
        t0: Instant,
    ) {
        let took = t0.elapsed();
        if !self.inner.observers.is_empty() {
            let outcome = match envelope {
                _ if counted.refused => Outcome::Refused,
                Envelope::Ok { .. } => Outcome::Ok,
                Envelope::Hint { .. } => Outcome::Hint,
                Envelope::Err { .. } => Outcome::Err,
            };
            let measure = CallMeasure {
                tool: counted.tool,
                family: counted.family,
                outcome,
                queued,
                took,
            };
            for o in &self.inner.observers {
                o.call_measured(&measure);
            }
        }
        let at = SystemTime::now() - took;
        let recorder = self.inner.recorder.clone();
        let record = CallRecord {
            tool_name: quiver_contract::quoted_name(name).into_owned(),
            session: ctx.session.clone(),
            tenant: ctx.tenant.clone(),
            principal: ctx.principal.clone(),
            call_id: ctx.call_id.clone().unwrap_or_else(|| Arc::from("")),
            parent_call_id: ctx.parent_call_id.clone(),
            input,
            reasoning: ctx.reasoning.clone(),
            args_hash,
            envelope: envelope.clone(),
            queued,
            took,
            at,
            trace_id: quiver_contract::trace::current().and_then(|t| t.trace_id().map(Arc::from)),
        };
        let mut handing = Box::pin(async move { recorder.record(record).await });
        // A recorder that buffers hands the record over at once; one whose buffer is full,
        // or a strict one (until the row is committed), makes it wait, and the answer waits
        // with it. A caller that goes away meanwhile (its future dropped) must not take the
        // record with it: the rest of the hand-over then runs in a task of its own.
        let waiting = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(handing.as_mut().poll(cx).is_pending())
        })
        .await;
        if waiting {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    if let Err(e) = self.inner.handovers.spawn_on(handing, &rt).await {
                        tracing::error!(tool = %name, error = %e, "handing a call record over failed");
                    }
                }
                Err(_) => handing.await,
            }
        }
    }

    /// Marks the start of a shutdown: the calls cancelled from now on are told (and
    /// logged) that Quiver is shutting down, not that their caller cancelled them.
    pub fn begin_shutdown(&self) {
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Waits until every call record still on its way to the recorder in a task of its own
    /// (a call whose caller went away, a record waiting for room in a full log) has been
    /// handed over. Call it before closing the store, so that no record is cut off.
    pub async fn drain_records(&self) {
        let handovers = &self.inner.handovers;
        handovers.close();
        handovers.wait().await;
        handovers.reopen();
    }

    /// Runs a batch. Consecutive read-only calls run concurrently; a mutating call, or a call
    /// to an unknown tool, runs alone after the calls before it finish. Results come back in
    /// input order.
    pub async fn call_batch(&self, calls: Vec<BatchCall>, mut ctx: CallContext) -> Vec<Envelope> {
        // The batch is one round: its calls split the round's token budget.
        let round = self.inner.config().result_limit.round_tokens;
        let share = (round / calls.len().max(1)).max(crate::shape::MIN_TOKENS);
        ctx.result_tokens = Some(ctx.result_tokens.map_or(share, |t| t.min(share)));
        let mut out: Vec<Envelope> = Vec::with_capacity(calls.len());
        let mut group: Vec<BatchCall> = Vec::new();
        for call in calls {
            let read_only = self
                .inner
                .catalog
                .lookup(&call.name)
                .is_some_and(|e| e.spec.is_live() && e.tool.read_only());
            if read_only {
                group.push(call);
                continue;
            }
            out.extend(self.run_group(std::mem::take(&mut group), &ctx).await);
            out.push(
                self.call(&call.name, call.input, self.child_ctx(&ctx))
                    .await,
            );
        }
        out.extend(self.run_group(group, &ctx).await);
        out
    }

    fn child_ctx(&self, ctx: &CallContext) -> CallContext {
        let mut c = ctx.clone();
        c.call_id = None;
        c.reasoning = None;
        c
    }

    async fn run_group(&self, group: Vec<BatchCall>, ctx: &CallContext) -> Vec<Envelope> {
        join_all(group.into_iter().map(|c| {
            let ctx = self.child_ctx(ctx);
            async move { self.call(&c.name, c.input, ctx).await }
        }))
        .await
    }
}

/// A fingerprint of what a call returned (its data, parts, or message), for the loop guard.
fn result_fingerprint(envelope: &Envelope) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    match envelope {
        Envelope::Ok { data, parts, .. } => {
            h.write(&serde_json::to_vec(data).unwrap_or_default());
            h.write(&serde_json::to_vec(parts).unwrap_or_default());
        }
        Envelope::Hint { message, .. } | Envelope::Err { message, .. } => {
            h.write(message.as_bytes());
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::{ErrKind, call_id, refused_before_running};

    #[test]
    fn refusals_before_running_are_told_from_calls_that_ran() {
        let refused = |kind: ErrKind, message: &str| {
            refused_before_running(Some(&kind), None, Some(message), "mcp__git__status")
        };
        assert!(refused(ErrKind::PolicyDenied, "refused by policy"));
        assert!(refused(
            ErrKind::NotAvailable,
            "`mcp__git__status` is not available: MCP server \"git\" is still connecting."
        ));
        assert!(!refused(
            ErrKind::NotAvailable,
            "MCP server \"git\" unavailable; request outcome is unknown"
        ));
        assert!(!refused(ErrKind::ToolFailed, "boom"));
    }

    #[test]
    fn call_ids_are_prefix_dash_number() {
        assert_eq!(&*call_id("19a2f", 0), "19a2f-0");
        assert_eq!(&*call_id("19a2f", 42), "19a2f-42");
        assert_eq!(&*call_id("p", u64::MAX), "p-18446744073709551615");
        let long = "x".repeat(60);
        assert_eq!(&*call_id(&long, 7), format!("{long}-7"));
    }
}
