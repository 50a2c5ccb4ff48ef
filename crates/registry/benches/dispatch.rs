//! The dispatch pipeline's own cost: a no-op tool through validation, every layer and an
//! in-memory recorder; and a batch of 100 read-only calls that each sleep 10 ms.

use std::{hint::black_box, sync::Arc, time::Duration};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use quiver_contract::{CallContext, Envelope, Tool, ToolResult, ToolSpec};
use quiver_registry::{BatchCall, Catalog, Dispatcher, MemoryRecorder};
use serde_json::{Value, json};

mod common;
use common::{Bounded, Noop, noop_spec};

struct Nap(ToolSpec);

#[async_trait]
impl Tool for Nap {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(Envelope::ok(Value::Null))
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let catalog = Arc::new(Catalog::new());
    catalog.must_register(Arc::new(Noop(noop_spec())));
    catalog.must_register(Arc::new(Nap(
        ToolSpec::new("nap", "Sleeps 10 ms.").read_only()
    )));
    let _ = MemoryRecorder::new();
    let d = Dispatcher::builder(catalog)
        .recorder(Arc::new(Bounded::default()))
        .build();
    let mut n = 0i64;
    c.bench_function("dispatch_noop_full_pipeline", |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            // Distinct arguments every time so the loop guard never trips.
            let input = json!({"n": n});
            let d = d.clone();
            async move {
                black_box(
                    d.call("noop", input, CallContext::for_session("bench"))
                        .await,
                )
            }
        })
    });
    let mut g = c.benchmark_group("throughput");
    const TASKS: u64 = 8;
    const PER_TASK: u64 = 2_000;
    g.throughput(criterion::Throughput::Elements(TASKS * PER_TASK));
    g.sample_size(20);
    g.bench_function("noop_8_tasks_x_2000_calls", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let d = d.clone();
            async move {
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    let handles: Vec<_> = (0..TASKS)
                        .map(|t| {
                            let d = d.clone();
                            tokio::spawn(async move {
                                let session = format!("t{t}");
                                for i in 0..PER_TASK {
                                    let ctx = CallContext::for_session(session.as_str());
                                    black_box(d.call("noop", json!({"n": i}), ctx).await);
                                }
                            })
                        })
                        .collect();
                    for h in handles {
                        h.await.unwrap();
                    }
                }
                start.elapsed()
            }
        })
    });
    g.finish();
    let mut g = c.benchmark_group("batch");
    g.sample_size(20);
    g.bench_function("batch_100_reads_sleeping_10ms", |b| {
        b.to_async(&rt).iter(|| {
            let calls: Vec<_> = (0..100)
                .map(|i| BatchCall::new("nap", json!({"i": i})))
                .collect();
            let d = d.clone();
            async move { black_box(d.call_batch(calls, CallContext::for_session("batch")).await) }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
