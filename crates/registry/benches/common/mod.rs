//! What the dispatch bench and the `dispatch_loop` example share: a no-op tool with a
//! one-field schema, and a recorder that keeps a bounded buffer like a real one that hands
//! rows to a writer.

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, Tool, ToolResult, ToolSpec};
use quiver_registry::{CallRecord, ToolCallRecorder};
use serde_json::{Value, json};

/// Returns an empty Ok at once.
pub(crate) struct Noop(pub(crate) ToolSpec);

#[async_trait]
impl Tool for Noop {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
        Ok(Envelope::ok(Value::Null))
    }
}

/// `noop`: read-only, one required integer `n`.
pub(crate) fn noop_spec() -> ToolSpec {
    ToolSpec::new("noop", "Does nothing.")
        .read_only()
        .with_schema(json!({
            "type": "object",
            "properties": {"n": {"type": "integer", "description": "Any number."}},
            "required": ["n"]
        }))
}

/// Keeps at most 4096 records, then starts over.
#[derive(Default)]
pub(crate) struct Bounded(std::sync::Mutex<Vec<CallRecord>>);

#[async_trait]
impl ToolCallRecorder for Bounded {
    async fn record(&self, record: CallRecord) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() >= 4096 {
            v.clear();
        }
        v.push(record);
    }
}

/// The examples' loop: `n` no-op calls through `d`, one after another, on a two-worker
/// runtime, then the wall time per call printed after `label`.
#[allow(dead_code)] // the criterion bench times its own calls
pub(crate) fn call_loop(d: &quiver_registry::Dispatcher, n: u64, label: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let start = std::time::Instant::now();
    rt.block_on(async {
        for i in 0..n {
            std::hint::black_box(
                d.call(
                    "noop",
                    json!({"n": i}),
                    quiver_contract::CallContext::for_session("loop"),
                )
                .await,
            );
        }
    });
    let took = start.elapsed();
    println!(
        "{n} calls{label} in {:.3} s: {:.0} ns per call",
        took.as_secs_f64(),
        took.as_nanos() as f64 / n as f64
    );
}
