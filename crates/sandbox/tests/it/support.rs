//! The corpus runner: each case is a `.js` file whose leading `//` lines say what to expect.
//!
//! ```text
//! // expect: ok                       the run succeeds
//! // expect: ok {"sum": 3}            ... with exactly this result
//! // expect: timeout                  the run fails with this kind
//! // expect: exception /not defined/  ... and its text contains this
//! // expect-validate: ok | <kind> [/text/] | syntax 3:9
//! // inputs: {"a": 1}                 main's inputs (default {})
//! // logs: ["a", "b"]                 exactly these log lines
//! // host-calls: 0                    the test host's `count` tool was called this often
//! // calls: 2                         the run reports this many call_tool calls
//! // stack: main.js:3                 the exception's stack contains this
//! // limits: wall_time_ms=200 log_bytes=10 (also source, heap, input, output bytes,
//! //         max_calls, max_depth)
//! ```
//!
//! Time limits are cut to one second (unless a case says otherwise) so the corpus runs
//! quickly; every other limit is the default. Tools the test host serves: `echo` (its inputs),
//! `noop`, `count` (counted), `fail` (an Err), `hint` (a Hint), `self` (the case's own source,
//! run nested), and every `tests/abuse/tools/NAME.js` as custom tool `NAME`, run nested
//! through the same sandbox with depth + 1, the same budget, deadline and cancellation.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use quiver_contract::{CallBudget, Envelope, ErrKind, HintKind, RenderOptions, render};
use quiver_registry::sandbox::{
    Sandbox, SandboxError, SandboxHost, SandboxLimits, SandboxOutput, SandboxRun,
};
use quiver_sandbox::QuickJsSandbox;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// One case file, parsed.
#[derive(Debug)]
pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) source: Arc<str>,
    expect: Option<Expect>,
    expect_validate: Option<Expect>,
    inputs: Value,
    logs: Option<Vec<String>>,
    host_calls: Option<u32>,
    calls: Option<u32>,
    stack: Option<String>,
    pub(crate) limits: SandboxLimits,
}

#[derive(Debug)]
struct Expect {
    kind: String,
    /// `ok`: the exact result; an error: a substring of its text; syntax: `line:column`.
    detail: Option<String>,
}

impl Expect {
    fn parse(text: &str) -> Expect {
        let text = text.trim();
        let (kind, detail) = match text.split_once(' ') {
            Some((kind, rest)) => (kind, Some(rest.trim())),
            None => (text, None),
        };
        let detail = detail.map(|d| {
            d.strip_prefix('/')
                .and_then(|d| d.strip_suffix('/'))
                .unwrap_or(d)
                .to_owned()
        });
        Expect {
            kind: kind.to_owned(),
            detail,
        }
    }
}

/// The limits every case starts from.
pub(crate) fn corpus_limits() -> SandboxLimits {
    let mut limits = SandboxLimits::default();
    limits.wall_time = Duration::from_secs(1);
    limits
}

impl Case {
    pub(crate) fn load(path: &Path) -> Case {
        let text = std::fs::read_to_string(path).expect("case file");
        let mut case = Case {
            name: path.file_name().unwrap().to_string_lossy().into_owned(),
            source: Arc::from(text.as_str()),
            expect: None,
            expect_validate: None,
            inputs: json!({}),
            logs: None,
            host_calls: None,
            calls: None,
            stack: None,
            limits: corpus_limits(),
        };
        for line in text.lines() {
            let Some(directive) = line.strip_prefix("// ") else {
                break;
            };
            let Some((key, value)) = directive.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match key {
                "expect" => case.expect = Some(Expect::parse(value)),
                "expect-validate" => case.expect_validate = Some(Expect::parse(value)),
                "inputs" => case.inputs = serde_json::from_str(value).expect("inputs JSON"),
                "logs" => case.logs = Some(serde_json::from_str(value).expect("logs JSON")),
                "host-calls" => case.host_calls = Some(value.parse().expect("a count")),
                "calls" => case.calls = Some(value.parse().expect("a count")),
                "stack" => case.stack = Some(value.to_owned()),
                "limits" => {
                    for setting in value.split_whitespace() {
                        let (k, v) = setting.split_once('=').expect("key=value");
                        let n: u64 = v.parse().expect("a number");
                        match k {
                            "wall_time_ms" => case.limits.wall_time = Duration::from_millis(n),
                            "source_bytes" => case.limits.source_bytes = n as usize,
                            "heap_bytes" => case.limits.heap_bytes = n as usize,
                            "input_bytes" => case.limits.input_bytes = n as usize,
                            "log_bytes" => case.limits.log_bytes = n as usize,
                            "output_bytes" => case.limits.output_bytes = n as usize,
                            "max_calls" => case.limits.max_calls = n as u32,
                            "max_depth" => case.limits.max_depth = n as u32,
                            other => panic!("{}: unknown limit {other}", case.name),
                        }
                    }
                }
                _ => {}
            }
        }
        assert!(
            case.expect.is_some() || case.expect_validate.is_some(),
            "{}: no `// expect:` line",
            case.name
        );
        case
    }
}

/// The `.js` files of a folder, sorted by name.
pub(crate) fn cases(folder: &str) -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(folder);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("case folder")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "js"))
        .collect();
    paths.sort();
    paths.iter().map(|p| Case::load(p)).collect()
}

/// The custom tools of `tests/abuse/tools`, by name.
pub(crate) fn custom_tools() -> HashMap<String, Arc<str>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abuse/tools");
    std::fs::read_dir(dir)
        .expect("tools folder")
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let source = std::fs::read_to_string(&p).unwrap();
            (name, Arc::from(source.as_str()))
        })
        .collect()
}

/// The host of the corpus's runs.
#[derive(Clone)]
pub(crate) struct TestHost {
    sandbox: Arc<QuickJsSandbox>,
    tools: Arc<HashMap<String, Arc<str>>>,
    this: Arc<str>,
    limits: SandboxLimits,
    deadline: Instant,
    budget: Arc<CallBudget>,
    depth: u32,
    cancel: CancellationToken,
    pub(crate) counted: Arc<AtomicU32>,
}

impl TestHost {
    pub(crate) fn root(sandbox: Arc<QuickJsSandbox>, case: &Case) -> TestHost {
        TestHost {
            sandbox,
            tools: Arc::new(custom_tools()),
            this: case.source.clone(),
            limits: case.limits.clone(),
            deadline: Instant::now() + case.limits.wall_time,
            budget: Arc::new(CallBudget::new(case.limits.max_calls)),
            depth: 0,
            cancel: CancellationToken::new(),
            counted: Arc::new(AtomicU32::new(0)),
        }
    }

    pub(crate) fn run(&self, source: Arc<str>, inputs: Value) -> SandboxRun {
        SandboxRun::new(source, inputs, self.limits.clone(), Arc::new(self.clone()))
            .with_deadline(self.deadline)
            .with_budget(self.budget.clone())
            .with_depth(self.depth)
            .with_cancel(self.cancel.clone())
    }
}

#[async_trait]
impl SandboxHost for TestHost {
    async fn call_tool(&self, name: &str, inputs: Value) -> Envelope {
        match name {
            "echo" => Envelope::ok(inputs),
            "noop" => Envelope::ok(Value::Null),
            "count" => {
                self.counted.fetch_add(1, Ordering::SeqCst);
                Envelope::ok(Value::Null)
            }
            "fail" => Envelope::err(
                ErrKind::ToolFailed,
                inputs["message"].as_str().unwrap_or("it failed").to_owned(),
            ),
            "hint" => Envelope::hint(HintKind::Schema, "did you mean `echo`?", Vec::new()),
            _ => {
                let source = if name == "self" {
                    Some(self.this.clone())
                } else {
                    self.tools.get(name).cloned()
                };
                let Some(source) = source else {
                    return Envelope::err(ErrKind::UndefinedTool, format!("no tool `{name}`"));
                };
                let mut nested = self.clone();
                nested.depth += 1;
                nested.this = source.clone();
                nested.cancel = self.cancel.child_token();
                let run = nested.run(source, inputs);
                match self.sandbox.run(run).await {
                    Ok(out) => Envelope::ok(out.result),
                    Err(e) => e.to_envelope(name, &self.limits),
                }
            }
        }
    }
}

/// Every text an error of the corpus produced, for the leak check.
pub(crate) static ERROR_TEXTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn remember(error: &SandboxError, tool: &str) {
    let mut texts = ERROR_TEXTS.lock().unwrap();
    texts.push(error.to_string());
    texts.push(render(
        &error.to_envelope(tool, &SandboxLimits::default()),
        &RenderOptions::default(),
    ));
    if let SandboxError::Exception { message, stack } = error {
        texts.push(message.clone());
        texts.push(stack.clone());
    }
}

/// Runs `case` on `sandbox` and asserts what it expects; then proves the sandbox still runs
/// a trivial script.
pub(crate) async fn check(sandbox: &Arc<QuickJsSandbox>, case: &Case) {
    let name = &case.name;
    if let Some(expect) = &case.expect_validate {
        let outcome = sandbox.validate(&case.source, &case.limits);
        if let Err(e) = &outcome {
            remember(e, name);
        }
        match (&outcome, expect.kind.as_str()) {
            (Ok(()), "ok") => {}
            (Err(SandboxError::Syntax { line, column, .. }), "syntax")
                if expect.detail.as_ref().is_some_and(|d| d.contains(':'))
                    && !expect.detail.as_ref().unwrap().contains(' ') =>
            {
                assert_eq!(
                    &format!("{line}:{column}"),
                    expect.detail.as_ref().unwrap(),
                    "{name}: {outcome:?}"
                );
            }
            (Err(e), kind) if e.kind() == kind => assert_detail(name, e, expect),
            _ => panic!("{name}: validate expected {expect:?}, got {outcome:?}"),
        }
    }
    if let Some(expect) = &case.expect {
        let host = TestHost::root(sandbox.clone(), case);
        let outcome = sandbox
            .run(host.run(case.source.clone(), case.inputs.clone()))
            .await;
        if let Err(e) = &outcome {
            remember(e, name);
        }
        if let Ok(out) = &outcome {
            ERROR_TEXTS.lock().unwrap().push(out.result.to_string());
        }
        match (&outcome, expect.kind.as_str()) {
            (Ok(out), "ok") => check_output(case, out, expect),
            (Err(e), kind) if e.kind() == kind => {
                assert_detail(name, e, expect);
                check_stack(case, e);
            }
            _ => panic!("{name}: expected {expect:?}, got {outcome:?}"),
        }
        if let Some(want) = case.host_calls {
            assert_eq!(
                host.counted.load(Ordering::SeqCst),
                want,
                "{name}: host calls"
            );
        }
    }
    assert_alive(sandbox, name).await;
}

fn check_output(case: &Case, out: &SandboxOutput, expect: &Expect) {
    let name = &case.name;
    if let Some(want) = &expect.detail {
        let want: Value = serde_json::from_str(want).expect("expected result JSON");
        assert_eq!(out.result, want, "{name}: result");
    }
    if let Some(logs) = &case.logs {
        assert_eq!(&out.logs, logs, "{name}: logs");
    }
    if let Some(calls) = case.calls {
        assert_eq!(out.calls, calls, "{name}: calls");
    }
}

fn assert_detail(name: &str, error: &SandboxError, expect: &Expect) {
    if let Some(detail) = &expect.detail {
        let text = format!("{error} {error:?}");
        assert!(
            text.contains(detail.as_str()),
            "{name}: `{detail}` not in {text}"
        );
    }
}

/// The sandbox still runs a trivial script.
pub(crate) async fn assert_alive(sandbox: &Arc<QuickJsSandbox>, after: &str) {
    // The worker may still be freeing the last case's heap (a script that catches its
    // out-of-memory error and allocates again keeps the collector busy past its deadline):
    // reusable means it comes back, so the check waits up to a minute.
    let mut limits = SandboxLimits::default();
    limits.wall_time = std::time::Duration::from_secs(60);
    let run = SandboxRun::new(
        "async function main(inputs) { return { echoed: inputs.n + 1 } }",
        json!({"n": 1}),
        limits,
        Arc::new(NoHost),
    );
    let out = sandbox.run(run).await.unwrap_or_else(|e| {
        panic!("after {after}: the sandbox no longer runs a trivial script: {e:?}")
    });
    assert_eq!(out.result, json!({"echoed": 2}), "after {after}");
}

/// A host with no tools.
pub(crate) struct NoHost;

#[async_trait]
impl SandboxHost for NoHost {
    async fn call_tool(&self, name: &str, _: Value) -> Envelope {
        Envelope::err(ErrKind::UndefinedTool, format!("no tool `{name}`"))
    }
}

/// Asserts the stack of an exception holds what the case says.
fn check_stack(case: &Case, error: &SandboxError) {
    if let (Some(want), SandboxError::Exception { stack, .. }) = (&case.stack, error) {
        assert!(
            stack.contains(want.as_str()),
            "{}: `{want}` not in stack {stack}",
            case.name
        );
    }
}
