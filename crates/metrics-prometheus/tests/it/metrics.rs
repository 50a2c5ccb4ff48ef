use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, ErrKind, Tool, ToolResult, ToolSpec};
use quiver_metrics_prometheus::{
    CONTENT_TYPE, LogWriterReading, Metrics, ProcessReading, UpstreamReading, UpstreamState,
    WorkingSetsReading,
};
use quiver_registry::{
    Catalog, Dispatcher, MemoryRecorder,
    sandbox::{Sandbox, SandboxError, SandboxHost, SandboxLimits, SandboxOutput, SandboxRun},
};
use serde_json::{Value, json};

/// Answers with what its input asks: `{"answer": "ok" | "hint" | "err"}`.
struct Answer(ToolSpec);

#[async_trait]
impl Tool for Answer {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, input: Value, _ctx: &CallContext) -> ToolResult {
        Ok(match input["answer"].as_str() {
            Some("hint") => Envelope::hint(
                quiver_contract::HintKind::Schema,
                "try again".to_owned(),
                Vec::new(),
            ),
            Some("err") => Envelope::err(ErrKind::Internal, "broken"),
            _ => Envelope::ok(json!({})),
        })
    }
}

fn answer_tool(name: &str) -> Arc<dyn Tool> {
    Arc::new(Answer(
        ToolSpec::new(name, "Answers as asked.").with_schema(json!({
            "type": "object",
            "properties": {"answer": {"type": "string", "enum": ["ok", "hint", "err"]}}
        })),
    ))
}

/// The value of the sample line `series` (name and labels as rendered), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().expect("a sample value is a number"))
}

#[tokio::test]
async fn calls_are_counted_by_tool_server_and_outcome_with_their_latency() {
    let catalog = Arc::new(Catalog::new());
    catalog.must_register(answer_tool("answer"));
    catalog
        .register_in("mcp:git", answer_tool("mcp__git__status"))
        .expect("the tool registers");
    let metrics = Metrics::new();
    let recorder = Arc::new(MemoryRecorder::new());
    let dispatcher = Dispatcher::builder(catalog)
        .recorder(metrics.recorder(recorder.clone()))
        .observer(metrics.observer())
        .build();
    let call = |tool: &'static str, input: Value| {
        let d = dispatcher.clone();
        async move { d.call(tool, input, CallContext::for_session("s")).await }
    };
    call("answer", json!({"answer": "ok"})).await;
    call("answer", json!({"answer": "ok"})).await;
    call("answer", json!({"answer": "hint"})).await;
    call("answer", json!({"answer": "err"})).await;
    // Refused before running: arguments against the schema, and a name nobody serves.
    call("answer", json!({"answer": 7})).await;
    call("no_such_tool", json!({})).await;
    call("mcp__git__status", json!({})).await;

    let text = metrics.render();
    assert!(CONTENT_TYPE.starts_with("text/plain; version=0.0.4"));
    for (series, want) in [
        (
            r#"quiver_tool_calls_total{tool="answer",server="(core)",outcome="ok"}"#,
            2.0,
        ),
        (
            r#"quiver_tool_calls_total{tool="answer",server="(core)",outcome="hint"}"#,
            1.0,
        ),
        (
            r#"quiver_tool_calls_total{tool="answer",server="(core)",outcome="err"}"#,
            1.0,
        ),
        (
            r#"quiver_tool_calls_total{tool="answer",server="(core)",outcome="refused"}"#,
            1.0,
        ),
        (
            r#"quiver_tool_calls_total{tool="(undefined)",server="(undefined)",outcome="refused"}"#,
            1.0,
        ),
        (
            r#"quiver_tool_calls_total{tool="mcp__git__status",server="git",outcome="ok"}"#,
            1.0,
        ),
        // The calls that ran: four to `answer`, one to git's tool.
        (
            r#"quiver_tool_call_seconds_count{server="(core)",phase="took"}"#,
            4.0,
        ),
        (
            r#"quiver_tool_call_seconds_count{server="(core)",phase="queued"}"#,
            4.0,
        ),
        (
            r#"quiver_tool_call_seconds_count{server="git",phase="took"}"#,
            1.0,
        ),
        (
            r#"quiver_tool_call_seconds_bucket{server="git",phase="took",le="+Inf"}"#,
            1.0,
        ),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    assert_eq!(
        recorder.len(),
        7,
        "every call was recorded through the counting recorder"
    );
}

#[tokio::test]
async fn gauges_are_read_at_each_scrape() {
    let metrics = Metrics::new();
    // Nothing read yet: none of these families is rendered.
    let before = metrics.render();
    assert!(!before.contains("quiver_upstream_state"), "{before}");
    assert!(!before.contains("quiver_sessions_open"), "{before}");

    let state = Arc::new(std::sync::Mutex::new(UpstreamState::Connecting));
    let seen = state.clone();
    metrics.read_upstreams(move || {
        vec![
            UpstreamReading::new("git", *seen.lock().unwrap(), 3, 2, 1),
            UpstreamReading::new("tickets", UpstreamState::Connected, 1, 1, 0)
                .with_user_connections(4),
        ]
    });
    metrics.read_working_sets(|| WorkingSetsReading::of_sizes([3, 5, 0]));
    metrics.read_log_writer(|| LogWriterReading::new(5, 1, true));
    metrics.read_process(|| {
        ProcessReading::new(64 << 20, 7, 31)
            .with_heap_in_use(20 << 20)
            .with_heap_free(9 << 20)
            .with_heap_trims(4)
            .with_embedded_store(6 << 20)
    });
    metrics.set_sessions_open(2);
    // Nine rows handed to the store: five written, one dropped, three waiting.
    let recorder = metrics.recorder(Arc::new(MemoryRecorder::new()));
    for i in 0..9 {
        recorder
            .record(quiver_registry::CallRecord::new(
                "t",
                format!("c{i}"),
                json!({}),
                Envelope::ok(json!({})),
            ))
            .await;
    }
    let text = metrics.render();
    for (series, want) in [
        (
            r#"quiver_upstream_state{server="git",state="connecting"}"#,
            1.0,
        ),
        (
            r#"quiver_upstream_state{server="git",state="connected"}"#,
            0.0,
        ),
        (r#"quiver_upstream_dials_total{server="git"}"#, 3.0),
        (r#"quiver_upstream_reconnects_total{server="git"}"#, 1.0),
        (r#"quiver_upstream_drops_total{server="git"}"#, 1.0),
        (r#"quiver_upstream_user_connections{server="tickets"}"#, 4.0),
        ("quiver_sessions_open", 2.0),
        ("quiver_working_sets", 3.0),
        ("quiver_working_set_tools", 8.0),
        ("quiver_working_set_tools_largest", 5.0),
        ("quiver_log_rows_handed_total", 9.0),
        ("quiver_log_rows_written_total", 5.0),
        ("quiver_log_rows_dropped_total", 1.0),
        ("quiver_log_rows_waiting", 3.0),
        ("quiver_log_failing", 1.0),
        ("quiver_process_resident_bytes", (64u64 << 20) as f64),
        ("quiver_process_heap_in_use_bytes", (20u64 << 20) as f64),
        ("quiver_process_heap_free_bytes", (9u64 << 20) as f64),
        ("quiver_process_heap_trims_total", 4.0),
        ("quiver_process_store_engine_bytes", (6u64 << 20) as f64),
        ("quiver_process_threads", 7.0),
        ("quiver_process_open_fds", 31.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    assert_eq!(
        sample(&text, r#"quiver_upstream_user_connections{server="git"}"#),
        None,
        "only a server that acts for the user has the series"
    );
    *state.lock().unwrap() = UpstreamState::Connected;
    let text = metrics.render();
    assert_eq!(
        sample(
            &text,
            r#"quiver_upstream_state{server="git",state="connected"}"#
        ),
        Some(1.0),
        "{text}"
    );
    // Disabled by an operator: a state of its own, not a series that stops.
    *state.lock().unwrap() = UpstreamState::Disabled;
    let text = metrics.render();
    for (state, want) in [("disabled", 1.0), ("connected", 0.0), ("stopped", 0.0)] {
        assert_eq!(
            sample(
                &text,
                &format!(r#"quiver_upstream_state{{server="git",state="{state}"}}"#)
            ),
            Some(want),
            "{text}"
        );
    }
}

/// A sandbox that fails each run with the error its inputs name.
struct Scripted;

#[async_trait]
impl Sandbox for Scripted {
    fn engine(&self) -> String {
        "scripted".into()
    }
    fn validate(&self, _source: &str, _limits: &SandboxLimits) -> Result<(), SandboxError> {
        Ok(())
    }
    async fn run(&self, run: SandboxRun) -> Result<SandboxOutput, SandboxError> {
        match run.inputs.as_str() {
            Some("timeout") => Err(SandboxError::Timeout),
            Some("memory") => Err(SandboxError::Memory),
            Some("throw") => Err(SandboxError::Exception {
                message: "Error: no".into(),
                stack: String::new(),
            }),
            _ => Ok(SandboxOutput::new(json!(1), Vec::new(), 0)),
        }
    }
}

struct NoHost;

#[async_trait]
impl SandboxHost for NoHost {
    async fn call_tool(&self, _name: &str, _inputs: Value) -> Envelope {
        Envelope::err(ErrKind::Internal, "no host")
    }
}

#[tokio::test]
async fn sandbox_runs_and_kills_are_counted_by_result_and_limit() {
    let metrics = Metrics::new();
    let sandbox = metrics.sandbox(Arc::new(Scripted));
    assert_eq!(sandbox.engine(), "scripted");
    for inputs in ["ok", "timeout", "timeout", "memory", "throw"] {
        let run = SandboxRun::new(
            "async function main() {}",
            json!(inputs),
            SandboxLimits::default(),
            Arc::new(NoHost),
        );
        let _ = sandbox.run(run).await;
    }
    let text = metrics.render();
    for (series, want) in [
        (r#"quiver_sandbox_runs_total{result="ok"}"#, 1.0),
        (r#"quiver_sandbox_runs_total{result="killed"}"#, 3.0),
        (r#"quiver_sandbox_runs_total{result="error"}"#, 1.0),
        (r#"quiver_sandbox_kills_total{limit="timeout"}"#, 2.0),
        (r#"quiver_sandbox_kills_total{limit="memory"}"#, 1.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
}

/// A recorder that holds each row until it is let go, as the store's writer holds a
/// strict-durability answer until its row is committed.
struct Held(tokio::sync::Semaphore);

#[async_trait]
impl quiver_registry::ToolCallRecorder for Held {
    async fn record(&self, _: quiver_registry::CallRecord) {
        let _ = self.0.acquire().await.map(|p| p.forget());
    }
}

/// A row held with its answer counts as waiting while it is held: the gauge an alert on
/// an outage reads (strict durability holds every answer's row until it is committed).
#[tokio::test]
async fn a_row_held_until_its_commit_is_waiting() {
    let metrics = Metrics::new();
    metrics.read_log_writer(|| LogWriterReading::new(0, 0, true));
    let held = Arc::new(Held(tokio::sync::Semaphore::new(0)));
    let recorder = metrics.recorder(held.clone());
    let call = tokio::spawn(async move {
        recorder
            .record(quiver_registry::CallRecord::new(
                "t",
                "c1",
                json!({}),
                Envelope::ok(json!({})),
            ))
            .await;
    });
    tokio::task::yield_now().await;
    let mut waiting = None;
    for _ in 0..100 {
        waiting = sample(&metrics.render(), "quiver_log_rows_waiting");
        if waiting == Some(1.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(waiting, Some(1.0), "{}", metrics.render());
    held.0.add_permits(1);
    call.await.unwrap();
}
