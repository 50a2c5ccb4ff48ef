//! The sandbox port: how a custom tool's JavaScript is checked and run, in engine-neutral
//! terms. The QuickJS adapter (`quiver-sandbox`) implements [`Sandbox`]; whoever runs a
//! custom tool implements [`SandboxHost`] so the script's `call_tool` re-enters the
//! dispatcher. Nothing here names an engine.
//!
//! A script is `async function main(inputs) { ... return result }`: `inputs` is a JSON copy,
//! the result must be JSON. The [`SandboxLimits`] bound one run; the [`CallBudget`] and the
//! deadline bound a whole tree of custom tools calling each other.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use quiver_contract::{CallBudget, CallContext, Envelope, ErrKind, HintKind};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The hard limits of one sandboxed run. `Default` holds the defaults of the design.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SandboxLimits {
    /// Wall time of one root invocation, host calls included (default 5 s).
    pub wall_time: Duration,
    /// The engine's heap (default 64 MiB).
    pub heap_bytes: usize,
    /// The engine's stack (default 1 MiB).
    pub stack_bytes: usize,
    /// The source text (default 64 KiB).
    pub source_bytes: usize,
    /// The inputs, and each `call_tool` input, as JSON text (default 1 MiB).
    pub input_bytes: usize,
    /// The result as JSON text (default 1 MiB).
    pub output_bytes: usize,
    /// The captured `log` lines (default 64 KiB); the rest is dropped with a note.
    pub log_bytes: usize,
    /// How deeply the result may nest (default 64).
    pub result_depth: u32,
    /// `call_tool` calls per root invocation, shared across nesting (default 100).
    pub max_calls: u32,
    /// How deep custom tools may nest through `call_tool` (default 4).
    pub max_depth: u32,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            wall_time: Duration::from_secs(5),
            heap_bytes: 64 << 20,
            stack_bytes: 1 << 20,
            source_bytes: 64 << 10,
            input_bytes: 1 << 20,
            output_bytes: 1 << 20,
            log_bytes: 64 << 10,
            result_depth: 64,
            max_calls: 100,
            max_depth: 4,
        }
    }
}

impl SandboxLimits {
    /// The limits as the `[sandbox]` configuration states them: its key names, in its units
    /// (`wall_time_ms`, `heap_mib`, `stack_kib`, `source_kib`, `input_kib`, `output_kib`,
    /// `log_kib`, `result_depth`, `max_calls`, `max_depth`). A size that is not a whole
    /// number of its unit (only limits built in code, never from the configuration) is
    /// given as a fraction, so two different limits never read the same.
    pub fn to_config_json(&self) -> Value {
        let per = |bytes: usize, unit: usize| -> Value {
            if bytes.is_multiple_of(unit) {
                Value::from(bytes / unit)
            } else {
                Value::from(bytes as f64 / unit as f64)
            }
        };
        serde_json::json!({
            "wall_time_ms": u64::try_from(self.wall_time.as_millis()).unwrap_or(u64::MAX),
            "heap_mib": per(self.heap_bytes, 1 << 20),
            "stack_kib": per(self.stack_bytes, 1 << 10),
            "source_kib": per(self.source_bytes, 1 << 10),
            "input_kib": per(self.input_bytes, 1 << 10),
            "output_kib": per(self.output_bytes, 1 << 10),
            "log_kib": per(self.log_bytes, 1 << 10),
            "result_depth": self.result_depth,
            "max_calls": self.max_calls,
            "max_depth": self.max_depth,
        })
    }
}

/// The host side of a run: where the script's `call_tool(name, inputs)` goes. The time spent
/// here counts toward the run's wall time.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait SandboxHost: Send + Sync {
    /// Calls tool `name` for the script. An Ok resolves the script's promise with its data;
    /// a Hint or an Err rejects it with the envelope's rendered text.
    async fn call_tool(&self, name: &str, inputs: Value) -> Envelope;
}

/// One run of a script.
#[non_exhaustive]
pub struct SandboxRun {
    /// The script's source text (never bytecode).
    pub source: Arc<str>,
    /// The value passed to `main` (as a JSON copy).
    pub inputs: Value,
    /// The limits of this run.
    pub limits: SandboxLimits,
    /// When the run must be over: the root's deadline, inherited by nested runs. A run also
    /// stops `limits.wall_time` after it starts, whichever comes first.
    pub deadline: Instant,
    /// The `call_tool` calls left to the root invocation.
    pub budget: Arc<CallBudget>,
    /// How deep this run is in custom tools calling custom tools (0 for the root); a run
    /// deeper than `limits.max_depth` fails with [`SandboxError::DepthLimit`]. A nested run
    /// must be given a greater depth than the run that called it.
    pub depth: u32,
    /// Where `call_tool` goes.
    pub host: Arc<dyn SandboxHost>,
    /// Stops the run (with [`SandboxError::Cancelled`]) when cancelled.
    pub cancel: CancellationToken,
}

impl std::fmt::Debug for SandboxRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxRun")
            .field("source_bytes", &self.source.len())
            .field("limits", &self.limits)
            .field("deadline", &self.deadline)
            .field("budget_left", &self.budget.left())
            .field("depth", &self.depth)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl SandboxRun {
    /// A root run: the deadline `limits.wall_time` from now, a fresh budget of
    /// `limits.max_calls`, depth 0, a token of its own.
    pub fn new(
        source: impl Into<Arc<str>>,
        inputs: Value,
        limits: SandboxLimits,
        host: Arc<dyn SandboxHost>,
    ) -> Self {
        SandboxRun {
            source: source.into(),
            inputs,
            deadline: Instant::now() + limits.wall_time,
            budget: Arc::new(CallBudget::new(limits.max_calls)),
            limits,
            depth: 0,
            host,
            cancel: CancellationToken::new(),
        }
    }

    /// A run serving a tool call: the context's deadline if it is sooner than the wall
    /// time, its budget (a fresh one when it has none: the call is a root), its depth, a
    /// child of its cancellation token. A host serving this run's `call_tool` should give
    /// the nested calls' contexts the run's `budget` (see [`CallContext::with_call_budget`]).
    pub fn for_call(
        source: impl Into<Arc<str>>,
        inputs: Value,
        limits: SandboxLimits,
        host: Arc<dyn SandboxHost>,
        ctx: &CallContext,
    ) -> Self {
        let mut run = SandboxRun::new(source, inputs, limits, host);
        if let Some(deadline) = ctx.deadline {
            run.deadline = run.deadline.min(deadline);
        }
        if let Some(budget) = &ctx.call_budget {
            run.budget = budget.clone();
        }
        run.depth = ctx.depth;
        run.cancel = ctx.cancel.child_token();
        run
    }

    /// Sets the deadline.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets the shared call budget.
    pub fn with_budget(mut self, budget: Arc<CallBudget>) -> Self {
        self.budget = budget;
        self
    }

    /// Sets the nesting depth.
    pub fn with_depth(mut self, depth: u32) -> Self {
        self.depth = depth;
        self
    }

    /// Sets the cancellation token.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }
}

/// What a successful run produced.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SandboxOutput {
    /// `main`'s return value.
    pub result: Value,
    /// The `log(...)` lines, within the log limit (a last line says how much was dropped).
    pub logs: Vec<String>,
    /// The `call_tool` calls this run made (nested runs' calls not included).
    pub calls: u32,
}

impl SandboxOutput {
    /// An output.
    pub fn new(result: Value, logs: Vec<String>, calls: u32) -> Self {
        SandboxOutput {
            result,
            logs,
            calls,
        }
    }
}

/// Why a script was refused or stopped. The texts never carry a host path or an environment
/// value: they are the script's own words or ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The run went past its deadline or wall time.
    #[error("the script ran past its time limit")]
    Timeout,
    /// The script went over its heap limit.
    #[error("the script ran out of memory (heap limit)")]
    Memory,
    /// The script went over its stack limit (runaway recursion).
    #[error("the script overflowed its stack (too deep a recursion)")]
    Stack,
    /// The source is over the source limit.
    #[error("the source is larger than the source limit")]
    SourceTooLarge,
    /// The inputs are over the input limit.
    #[error("the inputs are larger than the input limit")]
    InputTooLarge,
    /// The result is over the output limit.
    #[error("the result is larger than the output limit")]
    OutputTooLarge,
    /// The result is not JSON.
    #[error("the result is not JSON: {why}")]
    InvalidResult {
        /// What is wrong, and where (`result.a[2]: a function`).
        why: String,
    },
    /// The root invocation's `call_tool` budget is spent.
    #[error("the script made more call_tool calls than its budget allows")]
    CallLimit,
    /// Custom tools nested deeper than the depth limit.
    #[error("custom tools nested deeper than the depth limit")]
    DepthLimit,
    /// The source does not compile.
    #[error("syntax error at line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line.
        line: u32,
        /// 1-based column.
        column: u32,
        /// The parser's message.
        message: String,
    },
    /// The script threw (or `main`'s promise rejected).
    #[error("the script failed: {message}")]
    Exception {
        /// What ended it: what it threw (`it threw TypeError: x is not a function`), or why
        /// it could not finish.
        message: String,
        /// The script's stack (`at main (main.js:3:7)` lines), possibly empty.
        stack: String,
    },
    /// The run was cancelled.
    #[error("the run was cancelled")]
    Cancelled,
    /// The sandbox cannot run anything (its worker pool is gone).
    #[error("the sandbox is unavailable: {0}")]
    Unavailable(String),
}

impl SandboxError {
    /// The kinds a run of a compiled source can end in, which a test case may expect
    /// (`expect_error`): every [`SandboxError::kind`] but `syntax` and `source_too_large`
    /// (a source that is refused never runs its cases), `cancelled` and `unavailable` (the
    /// harness's, not the script's).
    pub const CASE_KINDS: [&'static str; 9] = [
        "timeout",
        "memory",
        "stack",
        "input_too_large",
        "output_too_large",
        "invalid_result",
        "call_limit",
        "depth_limit",
        "exception",
    ];

    /// The snake_case kind: `timeout`, `memory`, `stack`, `source_too_large`,
    /// `input_too_large`, `output_too_large`, `invalid_result`, `call_limit`, `depth_limit`,
    /// `syntax`, `exception`, `cancelled` or `unavailable`.
    pub fn kind(&self) -> &'static str {
        match self {
            SandboxError::Timeout => "timeout",
            SandboxError::Memory => "memory",
            SandboxError::Stack => "stack",
            SandboxError::SourceTooLarge => "source_too_large",
            SandboxError::InputTooLarge => "input_too_large",
            SandboxError::OutputTooLarge => "output_too_large",
            SandboxError::InvalidResult { .. } => "invalid_result",
            SandboxError::CallLimit => "call_limit",
            SandboxError::DepthLimit => "depth_limit",
            SandboxError::Syntax { .. } => "syntax",
            SandboxError::Exception { .. } => "exception",
            SandboxError::Cancelled => "cancelled",
            SandboxError::Unavailable(_) => "unavailable",
        }
    }

    /// The envelope the model reads when custom tool `tool`, run under `limits`, ends with
    /// this error: a Hint where the model can fix its input (the inputs too large), an Err
    /// otherwise. Limit errors carry the kind as their `err_kind` (`memory`, `call_limit`,
    /// ...), so a caller can tell them apart, and name the limit with its `[sandbox]` key (a
    /// tool's author reads them too); an exception carries the script's message and stack.
    pub fn to_envelope(&self, tool: &str, limits: &SandboxLimits) -> Envelope {
        let other = |kind: &str| ErrKind::Other(kind.to_owned());
        let config = limits.to_config_json();
        let key = |k: &str| format!("`[sandbox] {k} = {}`", config[k]);
        match self {
            SandboxError::Timeout => Envelope::err(
                ErrKind::Timeout,
                format!(
                    "custom tool `{tool}` ran past its time limit of {} ({}) and was stopped (the limit counts the tools it calls too); make it do less work per call",
                    quiver_contract::duration_text(limits.wall_time),
                    key("wall_time_ms")
                ),
            ),
            SandboxError::Memory => Envelope::err(
                other(self.kind()),
                format!(
                    "custom tool `{tool}` ran out of memory (its heap limit, {}) and was stopped; it must build smaller values",
                    key("heap_mib")
                ),
            ),
            SandboxError::Stack => Envelope::err(
                other(self.kind()),
                format!(
                    "custom tool `{tool}` overflowed its stack ({}: a runaway or too deep recursion) and was stopped",
                    key("stack_kib")
                ),
            ),
            SandboxError::SourceTooLarge => Envelope::err(
                other(self.kind()),
                format!(
                    "custom tool `{tool}`: its source is larger than the source limit ({})",
                    key("source_kib")
                ),
            ),
            SandboxError::InputTooLarge => Envelope::hint(
                HintKind::Fetch,
                format!(
                    "custom tool `{tool}`: the inputs are larger than its input limit ({}); narrow: send less data in one call",
                    key("input_kib")
                ),
                Vec::new(),
            ),
            SandboxError::OutputTooLarge => Envelope::err(
                other(self.kind()),
                format!(
                    "custom tool `{tool}` returned a result larger than its output limit ({}); it must return less",
                    key("output_kib")
                ),
            ),
            SandboxError::InvalidResult { why } => Envelope::err(
                other(self.kind()),
                format!("custom tool `{tool}` returned a value that is not JSON: {why}"),
            ),
            SandboxError::CallLimit => Envelope::err(
                other(self.kind()),
                format!(
                    "custom tool `{tool}` was stopped: it (with the custom tools it called) made more than the {} call_tool calls one invocation may ({})",
                    limits.max_calls,
                    key("max_calls")
                ),
            ),
            SandboxError::DepthLimit => Envelope::err(
                other(self.kind()),
                format!(
                    "custom tool `{tool}` was stopped: custom tools calling custom tools nested deeper than {} levels ({})",
                    limits.max_depth,
                    key("max_depth")
                ),
            ),
            SandboxError::Syntax {
                line,
                column,
                message,
            } => Envelope::err(
                ErrKind::ToolFailed,
                format!(
                    "custom tool `{tool}` does not compile: line {line}, column {column}: {message}"
                ),
            ),
            SandboxError::Exception { message, stack } => {
                let mut text = format!("custom tool `{tool}` failed: {message}");
                if !stack.is_empty() {
                    text.push('\n');
                    text.push_str(stack.trim_end());
                }
                Envelope::err(ErrKind::ToolFailed, text)
            }
            SandboxError::Cancelled => Envelope::err(
                ErrKind::Cancelled,
                format!("custom tool `{tool}` was cancelled"),
            ),
            SandboxError::Unavailable(why) => Envelope::err(
                ErrKind::NotAvailable,
                format!("custom tool `{tool}` cannot run now: {why}"),
            ),
        }
    }
}

/// Checks and runs custom tools' scripts. Implemented by the QuickJS adapter.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// The engine and its version, e.g. `quickjs-ng (rquickjs 0.14)`. An audit records it
    /// beside its results, and an approved tool audited under another engine is rebuilt
    /// (its source compiled and its cases run again) when a server starts.
    fn engine(&self) -> String;

    /// Compiles `source` without running any of it: a syntax error, or a source over the
    /// limit, is refused.
    fn validate(&self, source: &str, limits: &SandboxLimits) -> Result<(), SandboxError>;

    /// Runs `main(inputs)` in a fresh engine and returns its JSON result and logs.
    async fn run(&self, run: SandboxRun) -> Result<SandboxOutput, SandboxError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_names_its_kind_and_reads_as_a_sentence_for_the_model() {
        let errors = [
            SandboxError::Timeout,
            SandboxError::Memory,
            SandboxError::Stack,
            SandboxError::SourceTooLarge,
            SandboxError::InputTooLarge,
            SandboxError::OutputTooLarge,
            SandboxError::InvalidResult {
                why: "result.f: a function".into(),
            },
            SandboxError::CallLimit,
            SandboxError::DepthLimit,
            SandboxError::Syntax {
                line: 2,
                column: 5,
                message: "unexpected token".into(),
            },
            SandboxError::Exception {
                message: "it threw TypeError: x is not a function".into(),
                stack: "    at main (main.js:3:7)\n".into(),
            },
            SandboxError::Cancelled,
            SandboxError::Unavailable("the worker pool has shut down".into()),
        ];
        let rendered: Vec<String> = errors
            .iter()
            .map(|e| {
                let env = e.to_envelope("t", &SandboxLimits::default());
                let text =
                    quiver_contract::render(&env, &quiver_contract::RenderOptions::default());
                format!("{} -> {}", e.kind(), text)
            })
            .collect();
        insta::assert_snapshot!(rendered.join("\n"));
        assert!(
            SandboxError::InputTooLarge
                .to_envelope("t", &SandboxLimits::default())
                .hint_kind()
                .is_some()
        );
        assert_eq!(
            SandboxError::CallLimit
                .to_envelope("t", &SandboxLimits::default())
                .err_kind()
                .map(|k| k.as_str().to_owned()),
            Some("call_limit".to_owned())
        );
    }

    #[test]
    fn a_run_for_a_call_takes_the_contexts_budget_depth_and_sooner_deadline() {
        struct NoHost;
        #[async_trait]
        impl SandboxHost for NoHost {
            async fn call_tool(&self, _: &str, _: Value) -> Envelope {
                Envelope::ok(Value::Null)
            }
        }
        let budget = Arc::new(CallBudget::new(7));
        let soon = Instant::now() + Duration::from_millis(10);
        let mut ctx = CallContext::default()
            .with_call_budget(budget.clone())
            .with_deadline(soon);
        ctx.depth = 2;
        let run = SandboxRun::for_call(
            "async function main() {}",
            Value::Null,
            SandboxLimits::default(),
            Arc::new(NoHost),
            &ctx,
        );
        assert!(Arc::ptr_eq(&run.budget, &budget));
        assert_eq!((run.depth, run.deadline), (2, soon));
        ctx.cancel.cancel();
        assert!(run.cancel.is_cancelled());
        let root = SandboxRun::for_call(
            "",
            Value::Null,
            SandboxLimits::default(),
            Arc::new(NoHost),
            &CallContext::default(),
        );
        assert_eq!(root.budget.left(), 100);
    }
}
