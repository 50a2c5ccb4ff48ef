//! The `dispatch_loop` example of `quiver-registry` with the metrics observer on or off,
//! for the A/B of what per-call metrics cost: count instructions with callgrind at two call
//! counts, each way, and take the differences:
//! `valgrind --tool=callgrind target/release/examples/dispatch_metrics 20000 on` (and
//! 40000, and both with `off`).

use std::{hint::black_box, sync::Arc, time::Instant};

use quiver_contract::CallContext;
use quiver_metrics_prometheus::Metrics;
use quiver_registry::{Catalog, Dispatcher};
use serde_json::json;

#[path = "../../registry/benches/common/mod.rs"]
mod common;
use common::{Bounded, Noop, noop_spec};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let on = match args.next().as_deref() {
        Some("on") | None => true,
        Some("off") => false,
        Some(other) => panic!("`{other}`: say `on` or `off`"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let catalog = Arc::new(Catalog::new());
    catalog.must_register(Arc::new(Noop(noop_spec())));
    let metrics = Metrics::new();
    let mut builder = Dispatcher::builder(catalog).recorder(Arc::new(Bounded::default()));
    if on {
        builder = builder.observer(metrics.observer());
    }
    let d = builder.build();
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
        "{n} calls, metrics {}, in {:.3} s: {:.0} ns per call",
        if on { "on" } else { "off" },
        took.as_secs_f64(),
        took.as_nanos() as f64 / n as f64
    );
    if on {
        assert!(
            metrics
                .render()
                .contains("quiver_tool_calls_total{tool=\"noop\"")
        );
    }
}
