//! The PostgreSQL store's costs, against a local server the bench starts (durable settings:
//! `fsync` and `synchronous_commit` on): execution-log rows per second through the batching
//! writer (record + flush), and what the PostgreSQL recorder adds to a dispatched no-op call
//! compared with the in-memory recorder, the writer keeping up; and what `[store]
//! durability = "strict"` costs against the default, one call at a time and 64 at once.

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use quiver_contract::{CallContext, Envelope, Tool, ToolResult, ToolSpec};
use quiver_registry::{CallRecord, Catalog, Dispatcher, MemoryRecorder, ToolCallRecorder};
use quiver_store_postgres::{Durability, PgOptions, PgStore};
use quiver_store_testkit::TestPostgres;
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

const ROWS: u64 = 10_000;

type MakeRecorder<'a> = &'a dyn Fn() -> Arc<dyn ToolCallRecorder>;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pg = TestPostgres::start_with(&[]);
    pg.create_database("quiver");
    let store = rt
        .block_on(PgStore::open(&pg.url("quiver"), PgOptions::default()))
        .expect("open");

    let mut g = c.benchmark_group("execution_log_postgres");
    g.throughput(Throughput::Elements(ROWS));
    g.sample_size(20);
    g.bench_function("record_and_flush_10k_rows", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let store = store.clone();
            async move {
                let start = Instant::now();
                for it in 0..iters {
                    for i in 0..ROWS {
                        let record = CallRecord::new(
                            "read_file",
                            format!("{it}-{i}"),
                            json!({"path": "/tmp/x", "n": i}),
                            Envelope::text("file contents, a line or two of text"),
                        )
                        .with_session("bench")
                        .with_timings(Duration::from_micros(3), Duration::from_micros(40));
                        store.record(record).await;
                    }
                    store.flush().await;
                }
                start.elapsed()
            }
        })
    });
    g.finish();

    let catalog = Arc::new(Catalog::new());
    catalog.must_register(Arc::new(Noop(
        ToolSpec::new("noop", "Does nothing.")
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"]
            })),
    )));
    // Below the writer's capacity: only the calls are timed; every 1 024 calls the recorder is
    // flushed outside the timed region, so the channel never fills. This is the recorder's
    // cost on the call path when the writer keeps up.
    let mut g = c.benchmark_group("dispatch_noop_unsaturated_postgres");
    let fresh_memory = || -> Arc<dyn ToolCallRecorder> { Arc::new(MemoryRecorder::new()) };
    let same_pg = || -> Arc<dyn ToolCallRecorder> { Arc::new(store.clone()) };
    let makers: [(&str, MakeRecorder<'_>); 2] = [
        ("memory_recorder", &fresh_memory),
        ("postgres_recorder", &same_pg),
    ];
    for (name, make) in makers {
        let mut n = 0i64;
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let recorder = make();
                let d = Dispatcher::builder(catalog.clone())
                    .recorder(recorder.clone())
                    .build();
                let base = n;
                n += iters as i64;
                async move {
                    let mut timed = Duration::ZERO;
                    for i in 0..iters {
                        let input = json!({"n": base + i as i64});
                        let t = Instant::now();
                        black_box(
                            d.call("noop", input, CallContext::for_session("bench"))
                                .await,
                        );
                        timed += t.elapsed();
                        if i % 1024 == 1023 {
                            recorder.flush().await;
                        }
                    }
                    timed
                }
            })
        });
    }
    g.finish();
    let url = pg.url("quiver");
    let open = |durability: Durability| -> Arc<dyn ToolCallRecorder> {
        let opts = PgOptions::default().with_durability(durability);
        Arc::new(rt.block_on(PgStore::open(&url, opts)).expect("open"))
    };
    durability_cost(c, &rt, &catalog, "postgres", &open);
    rt.block_on(store.close()).expect("close");
}

/// Calls dispatched at once in the concurrent case, and calls each makes.
const TASKS: u64 = 64;
const PER_TASK: u64 = 50;

/// What `[store] durability` costs a no-op call: one call at a time (the answer waits for
/// its commit under strict, for nothing under batched), and 64 callers at once (strict
/// calls share commits), where the batched run's time includes the flush that commits its
/// rows, so both give rows committed per second.
fn durability_cost(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    catalog: &Arc<Catalog>,
    store: &str,
    open: &dyn Fn(Durability) -> Arc<dyn ToolCallRecorder>,
) {
    let recorders = [
        ("batched", open(Durability::Batched)),
        ("strict", open(Durability::Strict)),
    ];
    let mut g = c.benchmark_group(format!("dispatch_durability_one_at_a_time_{store}"));
    g.sample_size(20);
    for (name, recorder) in &recorders {
        let d = Dispatcher::builder(catalog.clone())
            .recorder(recorder.clone())
            .build();
        let mut n = 0i64;
        g.bench_function(*name, |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (d, recorder) = (d.clone(), recorder.clone());
                let base = n;
                n += iters as i64;
                async move {
                    let mut timed = Duration::ZERO;
                    for i in 0..iters {
                        let input = json!({"n": base + i as i64});
                        let t = Instant::now();
                        black_box(
                            d.call("noop", input, CallContext::for_session("bench"))
                                .await,
                        );
                        timed += t.elapsed();
                        if i % 1024 == 1023 {
                            recorder.flush().await;
                        }
                    }
                    recorder.flush().await;
                    timed
                }
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group(format!("dispatch_durability_64_callers_{store}"));
    g.sample_size(10);
    g.throughput(Throughput::Elements(TASKS * PER_TASK));
    for (name, recorder) in &recorders {
        let d = Dispatcher::builder(catalog.clone())
            .recorder(recorder.clone())
            .build();
        let mut n = 0i64;
        g.bench_function(*name, |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (d, recorder) = (d.clone(), recorder.clone());
                let base = n;
                n += (iters * TASKS * PER_TASK) as i64;
                async move {
                    let start = Instant::now();
                    for it in 0..iters {
                        let mut tasks = Vec::new();
                        for t in 0..TASKS {
                            let d = d.clone();
                            let first = base + ((it * TASKS + t) * PER_TASK) as i64;
                            tasks.push(tokio::spawn(async move {
                                let ctx = CallContext::for_session(format!("bench-{t}"));
                                for i in 0..PER_TASK as i64 {
                                    let input = json!({"n": first + i});
                                    black_box(d.call("noop", input, ctx.clone()).await);
                                }
                            }));
                        }
                        for t in tasks {
                            t.await.expect("a caller");
                        }
                        recorder.flush().await;
                    }
                    start.elapsed()
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
