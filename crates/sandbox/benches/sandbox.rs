//! The QuickJS sandbox's cost: a cold call of a trivial custom tool (a fresh runtime and
//! context, the prelude, the module, JSON in and out); a tool making 10 `call_tool` calls to
//! a no-op host; and 8 concurrent callers on the default pool (throughput).
//! Targets from issue 38: ≤ 1 ms, ≤ 2 ms median; ≥ 2,000 calls/s.

use std::{hint::black_box, sync::Arc};

use async_trait::async_trait;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use quiver_contract::Envelope;
use quiver_registry::sandbox::{Sandbox, SandboxHost, SandboxLimits, SandboxRun};
use quiver_sandbox::QuickJsSandbox;
use serde_json::{Value, json};

const TRIVIAL: &str =
    "async function main(inputs) { return { sum: inputs.a + inputs.b, tag: inputs.tag } }";
const TEN_CALLS: &str = "async function main(inputs) {
  let n = 0;
  for (let i = 0; i < 10; i++) { await call_tool('noop', { i }); n++; }
  return { n };
}";

struct Noop;

#[async_trait]
impl SandboxHost for Noop {
    async fn call_tool(&self, _: &str, _: Value) -> Envelope {
        Envelope::ok(Value::Null)
    }
}

fn run(source: &'static str) -> SandboxRun {
    SandboxRun::new(
        source,
        json!({"a": 1, "b": 2, "tag": "bench"}),
        SandboxLimits::default(),
        Arc::new(Noop),
    )
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sandbox = Arc::new(QuickJsSandbox::default());
    c.bench_function("custom_tool_cold_trivial", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(sandbox.run(run(TRIVIAL)).await.unwrap()) })
    });
    c.bench_function("custom_tool_10_call_tool_calls", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(sandbox.run(run(TEN_CALLS)).await.unwrap()) })
    });
    let mut g = c.benchmark_group("throughput");
    const TASKS: u64 = 8;
    const PER_TASK: u64 = 50;
    g.throughput(Throughput::Elements(TASKS * PER_TASK));
    g.sample_size(20);
    g.bench_function("trivial_8_concurrent_x_50_calls", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let sandbox = sandbox.clone();
            async move {
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    let handles: Vec<_> = (0..TASKS)
                        .map(|_| {
                            let sandbox = sandbox.clone();
                            tokio::spawn(async move {
                                for _ in 0..PER_TASK {
                                    black_box(sandbox.run(run(TRIVIAL)).await.unwrap());
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
