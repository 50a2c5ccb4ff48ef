//! A fixed number of no-op calls through the full dispatch pipeline (with a bounded
//! recorder, like the criterion bench). Wall time per call is printed; for a figure that does
//! not move with the machine's load, count instructions with callgrind at two call counts and
//! take the difference:
//! `valgrind --tool=callgrind target/release/examples/dispatch_loop 20000` (and 40000).

use std::{hint::black_box, sync::Arc, time::Instant};

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, Tool, ToolResult, ToolSpec};
use quiver_registry::{Catalog, Dispatcher};
use serde_json::{Value, json};

struct Noop(ToolSpec);

#[async_trait]
impl Tool for Noop {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
        Ok(Envelope::ok(Value::Null))
    }
}

/// Keeps a bounded buffer of records, like a recorder handing rows to a writer.
#[derive(Default)]
struct Bounded(std::sync::Mutex<Vec<quiver_registry::CallRecord>>);

#[async_trait]
impl quiver_registry::ToolCallRecorder for Bounded {
    async fn record(&self, record: quiver_registry::CallRecord) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() >= 4096 {
            v.clear();
        }
        v.push(record);
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let catalog = Arc::new(Catalog::new());
    catalog.must_register(Arc::new(Noop(
        ToolSpec::new("noop", "Does nothing.")
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {"n": {"type": "integer", "description": "Any number."}},
                "required": ["n"]
            })),
    )));
    let d = Dispatcher::builder(catalog)
        .recorder(Arc::new(Bounded::default()))
        .build();
    let start = Instant::now();
    rt.block_on(async {
        for i in 0..n {
            black_box(
                d.call("noop", json!({"n": i}), CallContext::for_session("loop"))
                    .await,
            );
        }
    });
    let took = start.elapsed();
    println!(
        "{n} calls in {:.3} s: {:.0} ns per call",
        took.as_secs_f64(),
        took.as_nanos() as f64 / n as f64
    );
}
