//! One run on a worker thread: a fresh QuickJS runtime and context, the prelude, the tool's
//! module, `main(inputs)`, and the job loop that blocks for host answers. Everything QuickJS
//! lives and dies here; what leaves is Rust data. The conversions between the engine's values
//! and the port's types (exceptions to [`SandboxError`], envelopes to settled promises) are
//! in this module too.

use std::{
    cell::{Cell, OnceCell, RefCell},
    rc::Rc,
    sync::{Arc, mpsc},
    time::Instant,
};

use quiver_contract::{CallBudget, Envelope, RenderOptions, render};
use quiver_registry::sandbox::{SandboxError, SandboxLimits, SandboxOutput};
use rquickjs::{
    Context, Ctx, Exception, Function, Module, Object, Persistent, Runtime, Value,
    context::{
        EvalOptions,
        intrinsic::{
            Date, Eval, Json, MapSet, Promise as PromiseIntrinsic, Proxy, RegExp, RegExpCompiler,
            TypedArrays,
        },
    },
    promise::PromiseState,
};
use serde_json::Value as Json_;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

const PRELUDE: &str = include_str!("prelude.js");
/// The name the tool's code has in stacks and syntax errors.
pub(crate) const SOURCE_NAME: &str = "main.js";
const PRELUDE_NAME: &str = "prelude.js";
const MAIN_EXPORT: &str = "__quiver_main__";
const NO_MAIN: &str =
    "the code must define `async function main(inputs)` (no function named main was found)";

/// The intrinsics a context gets: the language and its data structures. Left out:
/// `performance` (a fine timer), `WeakRef`/`FinalizationRegistry` (GC-driven callbacks),
/// `DOMException`; the prelude removes `SharedArrayBuffer` and `Atomics`.
type Intrinsics = (
    Date,
    Eval,
    RegExpCompiler,
    RegExp,
    Json,
    Proxy,
    MapSet,
    TypedArrays,
    PromiseIntrinsic,
);

/// A `call_tool` the script made, for the async side to serve.
#[derive(Debug)]
pub(crate) struct HostRequest {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) inputs: Json_,
}

/// What the async side sends the worker.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The envelope answering request `id`.
    Host { id: u32, envelope: Box<Envelope> },
    /// Look at the cancellation token again.
    Wake,
}

/// Everything a worker needs for one run.
pub(crate) struct Job {
    pub(crate) source: Arc<str>,
    pub(crate) inputs: String,
    pub(crate) limits: SandboxLimits,
    pub(crate) deadline: Instant,
    pub(crate) budget: Arc<CallBudget>,
    pub(crate) cancel: CancellationToken,
    pub(crate) requests: UnboundedSender<HostRequest>,
    pub(crate) answers: mpsc::Receiver<Answer>,
}

/// Why the interrupt handler stopped the script.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Timeout,
    Cancelled,
    CallLimit,
    DepthLimit,
}

impl Stop {
    fn error(self) -> SandboxError {
        match self {
            Stop::Timeout => SandboxError::Timeout,
            Stop::Cancelled => SandboxError::Cancelled,
            Stop::CallLimit => SandboxError::CallLimit,
            Stop::DepthLimit => SandboxError::DepthLimit,
        }
    }
}

/// The log lines of a run, within the limit.
#[derive(Debug, Default)]
struct Logs {
    lines: Vec<String>,
    bytes: usize,
    limit: usize,
    cut: bool,
    dropped: u64,
}

impl Logs {
    /// Keeps `line` if there is room (cut to what is left); `false` once the limit is reached.
    fn push(&mut self, line: String) -> bool {
        if self.cut {
            self.dropped += 1;
            return false;
        }
        let room = self.limit.saturating_sub(self.bytes);
        if line.len() <= room {
            self.bytes += line.len();
            self.lines.push(line);
            return true;
        }
        let mut end = room;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes += end;
        self.lines.push(line[..end].to_owned());
        self.cut = true;
        false
    }

    fn finish(mut self) -> Vec<String> {
        if self.cut {
            self.lines.push(format!(
                "[log limit of {} bytes reached: the last line was cut and {} more line(s) dropped]",
                self.limit, self.dropped
            ));
        }
        self.lines
    }
}

/// What the interrupt handler and the host functions share.
struct State {
    deadline: Instant,
    cancel: CancellationToken,
    stop: Cell<Option<Stop>>,
    /// `main` has settled: no more `call_tool`.
    closed: Cell<bool>,
    outstanding: Cell<u32>,
    calls: Cell<u32>,
    logs: RefCell<Logs>,
}

impl State {
    fn new(deadline: Instant, cancel: CancellationToken, log_limit: usize) -> Self {
        State {
            deadline,
            cancel,
            stop: Cell::new(None),
            closed: Cell::new(false),
            outstanding: Cell::new(0),
            calls: Cell::new(0),
            logs: RefCell::new(Logs {
                limit: log_limit,
                ..Logs::default()
            }),
        }
    }

    /// Whether the script must stop now (the interrupt handler's answer).
    fn interrupted(&self) -> bool {
        self.stopped().is_some()
    }

    fn stopped(&self) -> Option<Stop> {
        if let Some(stop) = self.stop.get() {
            return Some(stop);
        }
        let stop = if self.cancel.is_cancelled() {
            Stop::Cancelled
        } else if Instant::now() >= self.deadline {
            Stop::Timeout
        } else {
            return None;
        };
        self.stop.set(Some(stop));
        Some(stop)
    }
}

/// A fresh runtime with the limits and the interrupt handler set, and a context with the
/// chosen intrinsics.
fn engine(limits: &SandboxLimits, state: &Rc<State>) -> Result<(Runtime, Context), SandboxError> {
    let rt = Runtime::new().map_err(|_| SandboxError::Memory)?;
    rt.set_memory_limit(limits.heap_bytes);
    rt.set_max_stack_size(limits.stack_bytes);
    let st = state.clone();
    rt.set_interrupt_handler(Some(Box::new(move || st.interrupted())));
    let ctx = Context::custom::<Intrinsics>(&rt).map_err(|_| SandboxError::Memory)?;
    Ok((rt, ctx))
}

/// The tool's code as the module it is compiled to: `main` exported under a name of ours.
fn module_source(source: &str) -> String {
    format!("{source}\n;export {{ main as {MAIN_EXPORT} }};\n")
}

/// Compiles `source` without running it.
pub(crate) fn compile(source: &str, limits: &SandboxLimits) -> Result<(), SandboxError> {
    let state = Rc::new(State::new(
        Instant::now() + limits.wall_time,
        CancellationToken::new(),
        0,
    ));
    let (rt, ctx) = engine(limits, &state)?;
    let outcome =
        ctx.with(
            |ctx| match Module::declare(ctx.clone(), SOURCE_NAME, module_source(source)) {
                Ok(_) => Ok(()),
                Err(e) => Err(compile_error(&ctx, e, source, &state)),
            },
        );
    drop(ctx);
    drop(rt);
    outcome
}

/// Runs a job to its end.
pub(crate) fn execute(job: Job) -> Result<SandboxOutput, SandboxError> {
    let state = Rc::new(State::new(
        job.deadline,
        job.cancel.clone(),
        job.limits.log_bytes,
    ));
    if let Some(stop) = state.stopped() {
        return Err(stop.error());
    }
    let (rt, ctx) = engine(&job.limits, &state)?;
    let run = Run {
        rt: &rt,
        ctx: &ctx,
        state: &state,
        job: &job,
        api: OnceCell::new(),
    };
    let result = match run.go() {
        Err(e) if e == undescribed() && near_heap_limit(&rt, &job.limits) => {
            Err(SandboxError::Memory)
        }
        other => other,
    };
    drop(run);
    drop(ctx);
    drop(rt);
    let result = result?;
    let logs = state.logs.take().finish();
    Ok(SandboxOutput::new(result, logs, state.calls.get()))
}

struct Run<'a> {
    rt: &'a Runtime,
    ctx: &'a Context,
    state: &'a Rc<State>,
    job: &'a Job,
    /// What the prelude hands back (its functions), once it has run.
    api: OnceCell<Persistent<Object<'static>>>,
}

impl Run<'_> {
    fn go(&self) -> Result<Json_, SandboxError> {
        // 1. The prelude, then the module: compiled, linked, its top level started.
        let booting = self.ctx.with(|ctx| self.boot(&ctx))?;
        // 2. The module's top level (it may await host calls).
        self.drive(
            &booting,
            "the module's top-level code awaits something that nothing will resolve",
        )?;
        // 3. main(inputs).
        let value = match self.ctx.with(|ctx| self.invoke(&ctx, booting))? {
            Started::Done(value) => value,
            Started::Pending(promise) => {
                self.drive(
                    &promise,
                    "main(inputs) returned a promise that never settles: it awaits something that nothing will resolve",
                )?;
                promise
            }
        };
        // 4. Its value, converted under the interrupt handler; nothing scheduled runs.
        self.state.closed.set(true);
        self.ctx.with(|ctx| self.finish(&ctx, value))
    }

    /// The prelude's functions in `ctx`.
    fn api<'js>(&self, ctx: &Ctx<'js>) -> Option<Object<'js>> {
        self.api
            .get()
            .cloned()
            .and_then(|api| api.restore(ctx).ok())
    }

    /// Calls the prelude's function `name`.
    fn call_api<'js, A, R>(&self, ctx: &Ctx<'js>, name: &str, args: A) -> Result<R, SandboxError>
    where
        A: rquickjs::function::IntoArgs<'js>,
        R: rquickjs::FromJs<'js>,
    {
        let api = self
            .api(ctx)
            .ok_or_else(|| self.failure(ctx, rquickjs::Error::Unknown))?;
        api.get::<_, Function>(name)
            .and_then(|f| f.call(args))
            .map_err(|e| self.failure(ctx, e))
    }

    fn boot(&self, ctx: &Ctx<'_>) -> Result<Persistent<Value<'static>>, SandboxError> {
        let api = self.prelude(ctx).map_err(|e| self.failure(ctx, e))?;
        let _ = self.api.set(Persistent::save(ctx, api));
        let declared = Module::declare(ctx.clone(), SOURCE_NAME, module_source(&self.job.source))
            .map_err(|e| compile_error(ctx, e, &self.job.source, self.state))?;
        let (evaluated, promise) = declared.eval().map_err(|e| self.failure(ctx, e))?;
        let namespace = evaluated.namespace().map_err(|e| self.failure(ctx, e))?;
        let booting: Value = self.call_api(ctx, "boot", (promise, namespace))?;
        Ok(Persistent::save(ctx, booting))
    }

    /// Evaluates the prelude and hands it the host functions.
    fn prelude<'js>(&self, ctx: &Ctx<'js>) -> rquickjs::Result<Object<'js>> {
        let mut options = EvalOptions::default();
        options.global = true;
        options.strict = true;
        options.filename = Some(PRELUDE_NAME.to_owned());
        let setup: Function = ctx.eval_with_options(PRELUDE, options)?;
        let state = self.state.clone();
        let budget = self.job.budget.clone();
        let requests = self.job.requests.clone();
        let next_id = Cell::new(0u32);
        let input_limit = self.job.limits.input_bytes;
        let host_call = Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, name: String, text: String| -> rquickjs::Result<u32> {
                // The prelude checked all this already; checked again here so the limits
                // hold even for a script that got hold of this function.
                if name.is_empty() || name.len() > 1024 {
                    return Err(Exception::throw_type(
                        &ctx,
                        "call_tool: the name must be a non-empty string",
                    ));
                }
                if text.len() > input_limit {
                    return Err(Exception::throw_range(
                        &ctx,
                        "call_tool: the inputs are larger than the input limit",
                    ));
                }
                if state.closed.get() {
                    return Err(Exception::throw_internal(
                        &ctx,
                        "call_tool: main has already returned",
                    ));
                }
                if state.interrupted() {
                    return Err(Exception::throw_internal(
                        &ctx,
                        "call_tool: the run is stopping",
                    ));
                }
                if !budget.try_take() {
                    state.stop.set(Some(Stop::CallLimit));
                    return Err(Exception::throw_range(
                        &ctx,
                        "call_tool: this invocation has used up its call_tool budget",
                    ));
                }
                let Ok(inputs) = serde_json::from_str::<Json_>(&text) else {
                    return Err(Exception::throw_type(
                        &ctx,
                        "call_tool: the inputs are not JSON (a lone surrogate in a string?)",
                    ));
                };
                let id = next_id.get();
                next_id.set(id.wrapping_add(1));
                if requests.send(HostRequest { id, name, inputs }).is_err() {
                    state.stop.set(Some(Stop::Cancelled));
                    return Err(Exception::throw_internal(
                        &ctx,
                        "call_tool: the run is stopping",
                    ));
                }
                state.outstanding.set(state.outstanding.get() + 1);
                state.calls.set(state.calls.get() + 1);
                Ok(id)
            },
        )?;
        let state = self.state.clone();
        let host_log = Function::new(ctx.clone(), move |line: String| -> bool {
            state.logs.borrow_mut().push(line)
        })?;
        let limits = Object::new(ctx.clone())?;
        let l = &self.job.limits;
        limits.set("input", l.input_bytes as f64)?;
        limits.set("output", l.output_bytes as f64)?;
        limits.set("log", l.log_bytes as f64)?;
        limits.set("depth", f64::from(l.result_depth))?;
        setup.call((host_call, host_log, limits))
    }

    fn invoke(
        &self,
        ctx: &Ctx<'_>,
        booting: Persistent<Value<'static>>,
    ) -> Result<Started, SandboxError> {
        let booted = booting.restore(ctx).map_err(|e| self.failure(ctx, e))?;
        let record = settled_value(&booted).map_err(|e| self.failure(ctx, e))?;
        let record = self.record(record)?;
        let main: Value = record.get("main").map_err(|e| self.failure(ctx, e))?;
        if !main.is_function() {
            return Err(SandboxError::Exception {
                message: NO_MAIN.into(),
                stack: String::new(),
            });
        }
        let record: Value = self.call_api(ctx, "invoke", (main, self.job.inputs.as_str()))?;
        let record = self.record(record)?;
        let value: Value = record.get("value").map_err(|e| self.failure(ctx, e))?;
        Ok(if value.is_promise() {
            Started::Pending(Persistent::save(ctx, value))
        } else {
            Started::Done(Persistent::save(ctx, value))
        })
    }

    fn finish(
        &self,
        ctx: &Ctx<'_>,
        value: Persistent<Value<'static>>,
    ) -> Result<Json_, SandboxError> {
        let value = value.restore(ctx).map_err(|e| self.failure(ctx, e))?;
        let value = settled_value(&value).map_err(|e| self.failure(ctx, e))?;
        let record: Value = self.call_api(ctx, "finish", (value,))?;
        if let Some(stop) = self.state.stopped() {
            return Err(stop.error());
        }
        let record = self.record(record)?;
        if !record.get::<_, bool>("ok").unwrap_or(false) {
            if record.get::<_, bool>("large").unwrap_or(false) {
                return Err(SandboxError::OutputTooLarge);
            }
            let why: String = record.get("why").unwrap_or_default();
            return Err(SandboxError::InvalidResult { why });
        }
        let text: String = record
            .get("text")
            .map_err(|_| SandboxError::InvalidResult {
                why: "the result holds text that is not valid Unicode".into(),
            })?;
        if text.len() > self.job.limits.output_bytes {
            return Err(SandboxError::OutputTooLarge);
        }
        serde_json::from_str(&text).map_err(|_| SandboxError::InvalidResult {
            why: "the result holds a string that is not valid Unicode (a lone surrogate)".into(),
        })
    }

    /// One of the prelude's records; a record describing an exception becomes its error.
    fn record<'js>(&self, value: Value<'js>) -> Result<Object<'js>, SandboxError> {
        let Some(record) = value.into_object() else {
            return Err(self.stopped_or(SandboxError::Exception {
                message: "the script ended in an unexpected state".into(),
                stack: String::new(),
            }));
        };
        if record.get::<_, bool>("exception").unwrap_or(false) {
            return Err(self.stopped_or(exception_from_record(&record)));
        }
        Ok(record)
    }

    /// The interrupt's reason if the script was stopped, else `error`.
    fn stopped_or(&self, error: SandboxError) -> SandboxError {
        self.state.stopped().map_or(error, Stop::error)
    }

    /// The error of a failed engine call: the interrupt's reason if it stopped the script,
    /// else what was thrown, described by the prelude.
    fn failure(&self, ctx: &Ctx<'_>, error: rquickjs::Error) -> SandboxError {
        let thrown = match error {
            rquickjs::Error::Exception => Some(ctx.catch()),
            rquickjs::Error::Allocation => return SandboxError::Memory,
            _ => None,
        };
        if let Some(stop) = self.state.stopped() {
            return stop.error();
        }
        if let Some(thrown) = thrown {
            if let Some(object) = thrown.as_object() {
                // Engine errors first, read before any script code could run again.
                let name: String = object.get("name").unwrap_or_default();
                let message: String = object.get("message").unwrap_or_default();
                if let Some(kind) = limit_kind(&name, &message) {
                    return kind;
                }
            }
            let described = self.api(ctx).and_then(|api| {
                api.get::<_, Function>("describe")
                    .and_then(|d| d.call::<_, Object>((thrown,)))
                    .ok()
            });
            if let Some(record) = described {
                return self.stopped_or(exception_from_record(&record));
            }
            if let Some(stop) = self.state.stopped() {
                return stop.error();
            }
        }
        // What was thrown cannot be read (QuickJS throws `null` when it cannot even allocate
        // the error): `execute` tells a full heap from the rest, outside the runtime's lock.
        undescribed()
    }

    /// Runs jobs until `promise` settles, blocking for host answers when no job is left.
    fn drive(
        &self,
        promise: &Persistent<Value<'static>>,
        stalled: &str,
    ) -> Result<(), SandboxError> {
        loop {
            let pending = self.ctx.with(|ctx| {
                promise
                    .clone()
                    .restore(&ctx)
                    .ok()
                    .and_then(|v| v.into_promise())
                    .is_some_and(|p| p.state() == PromiseState::Pending)
            });
            if !pending {
                return Ok(());
            }
            if let Some(stop) = self.state.stopped() {
                return Err(stop.error());
            }
            match self.rt.execute_pending_job() {
                Ok(true) => continue,
                Ok(false) => {}
                // A job threw past every handler: an interrupt, or an exception thrown by a
                // queueMicrotask callback (fatal, as an uncaught exception is).
                Err(job) => {
                    return Err(job
                        .0
                        .with(|ctx| self.failure(&ctx, rquickjs::Error::Exception)));
                }
            }
            if self.state.outstanding.get() == 0 {
                return Err(SandboxError::Exception {
                    message: stalled.to_owned(),
                    stack: String::new(),
                });
            }
            let now = Instant::now();
            if now >= self.state.deadline {
                return Err(SandboxError::Timeout);
            }
            match self.job.answers.recv_timeout(self.state.deadline - now) {
                Ok(Answer::Host { id, envelope }) => {
                    let left = self.state.outstanding.get().saturating_sub(1);
                    self.state.outstanding.set(left);
                    self.deliver(id, *envelope)?;
                }
                Ok(Answer::Wake) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => return Err(SandboxError::Timeout),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(SandboxError::Cancelled);
                }
            }
        }
    }

    /// Settles the promise of host call `id` with its envelope: an Ok resolves it with the
    /// data, a Hint or an Err rejects it with the rendered text and the envelope's kind.
    fn deliver(&self, id: u32, envelope: Envelope) -> Result<(), SandboxError> {
        match envelope.err_kind().map(|k| k.as_str()) {
            // A limit of the whole invocation, reached in a nested custom tool, ends it all.
            Some("call_limit") => return Err(self.stop(Stop::CallLimit)),
            Some("depth_limit") => return Err(self.stop(Stop::DepthLimit)),
            _ => {}
        }
        let (ok, text, kind) = match envelope.data() {
            Some(data) => (
                true,
                serde_json::to_string(data).unwrap_or_else(|_| "null".into()),
                "ok",
            ),
            // The script's error reads as one sentence: the kind, then what the tool said
            // (not the rendered envelope, whose status line the model would read as a
            // second result inside this one).
            None => (
                false,
                match &envelope {
                    Envelope::Err {
                        message, err_kind, ..
                    } => format!("{message} ({})", err_kind.as_str()),
                    Envelope::Hint {
                        message, hint_kind, ..
                    } => format!("{message} ({} hint)", hint_kind.as_str()),
                    other => render(other, &RenderOptions::default()),
                },
                envelope.kind_str(),
            ),
        };
        self.ctx
            .with(|ctx| self.call_api::<_, ()>(&ctx, "settle", (id, ok, text.as_str(), kind)))
    }

    fn stop(&self, stop: Stop) -> SandboxError {
        self.state.stop.set(Some(stop));
        stop.error()
    }
}

enum Started {
    Done(Persistent<Value<'static>>),
    Pending(Persistent<Value<'static>>),
}

/// The fulfilled value of a settled promise, or its rejection thrown.
fn settled_value<'js>(value: &Value<'js>) -> rquickjs::Result<Value<'js>> {
    let Some(promise) = value.clone().into_promise() else {
        return Ok(value.clone());
    };
    match promise.result::<Value>() {
        Some(result) => result,
        None => Err(rquickjs::Error::Unknown),
    }
}

/// The error of a failure nothing can be read about.
fn undescribed() -> SandboxError {
    SandboxError::Exception {
        message: "the script failed in a way that cannot be described".into(),
        stack: String::new(),
    }
}

fn near_heap_limit(rt: &Runtime, limits: &SandboxLimits) -> bool {
    let used = u128::try_from(rt.memory_usage().malloc_size).unwrap_or(0);
    used * 10 >= limits.heap_bytes as u128 * 9
}

/// `Memory` for QuickJS's out-of-memory error, `Stack` for its stack overflow.
fn limit_kind(name: &str, message: &str) -> Option<SandboxError> {
    match (name, message) {
        ("InternalError", "out of memory") => Some(SandboxError::Memory),
        ("RangeError", "Maximum call stack size exceeded") => Some(SandboxError::Stack),
        _ => None,
    }
}

fn exception_from_record(record: &Object<'_>) -> SandboxError {
    let name: String = record.get("name").unwrap_or_default();
    let message: String = record.get("message").unwrap_or_default();
    if let Some(kind) = limit_kind(&name, &message) {
        return kind;
    }
    let stack: String = record.get("stack").unwrap_or_default();
    let message = match (name.is_empty(), message.is_empty()) {
        (true, _) => format!("it threw {message}, a value that is not an Error (so no stack)"),
        (false, true) => format!("it threw {name}"),
        (false, false) => format!("it threw {name}: {message}"),
    };
    SandboxError::Exception {
        message,
        stack: script_stack(&stack),
    }
}

/// The stack's lines that point into the tool's code (the prelude's frames dropped).
fn script_stack(stack: &str) -> String {
    let mut out = String::new();
    for line in stack.lines() {
        if line.contains(PRELUDE_NAME) || line.trim().is_empty() {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A compile failure: a syntax error with its position, or a limit.
fn compile_error(
    ctx: &Ctx<'_>,
    error: rquickjs::Error,
    source: &str,
    state: &State,
) -> SandboxError {
    if let rquickjs::Error::Allocation = error {
        return SandboxError::Memory;
    }
    let thrown = ctx.catch();
    if let Some(stop) = state.stopped() {
        return stop.error();
    }
    let Some(thrown) = thrown.as_object() else {
        return SandboxError::Syntax {
            line: 1,
            column: 1,
            message: "the code does not compile".into(),
        };
    };
    let name: String = thrown.get("name").unwrap_or_default();
    let message: String = thrown.get("message").unwrap_or_default();
    let stack: String = thrown.get("stack").unwrap_or_default();
    if name == "InternalError" && message == "out of memory" {
        return SandboxError::Memory;
    }
    let (mut line, mut column) = position(&stack).unwrap_or((1, 1));
    let source_lines = u32::try_from(source.lines().count().max(1)).unwrap_or(u32::MAX);
    let message = if message.contains(MAIN_EXPORT)
        || message == "exported variable 'main' does not exist"
        || line > source_lines
    {
        (line, column) = (1, 1);
        NO_MAIN.to_owned()
    } else if message.starts_with("could not load module") {
        format!("{message}: a custom tool cannot import modules")
    } else if name == "RangeError" && message == "Maximum call stack size exceeded" {
        "the code nests too deeply to compile".to_owned()
    } else {
        message
    };
    SandboxError::Syntax {
        line,
        column,
        message,
    }
}

/// `(line, column)` of the first `main.js:L:C` in a stack.
fn position(stack: &str) -> Option<(u32, u32)> {
    let at = stack.find(SOURCE_NAME)? + SOURCE_NAME.len();
    let rest = stack[at..].strip_prefix(':')?;
    let mut parts = rest.splitn(3, |c: char| !c.is_ascii_digit());
    let line = parts.next()?.parse().ok()?;
    let column = parts.next()?.parse().ok()?;
    Some((line, column))
}
