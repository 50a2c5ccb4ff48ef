//! The `dispatch_loop` example of `quiver-registry` with the metrics observer on or off,
//! for the A/B of what per-call metrics cost: count instructions with callgrind at two call
//! counts, each way, and take the differences:
//! `valgrind --tool=callgrind target/release/examples/dispatch_metrics 20000 on` (and
//! 40000, and both with `off`).

use std::sync::Arc;

use quiver_metrics_prometheus::Metrics;
use quiver_registry::{Catalog, Dispatcher};

#[path = "../../registry/benches/common/mod.rs"]
mod common;
use common::{Bounded, Noop, call_loop, noop_spec};

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
    let catalog = Arc::new(Catalog::new());
    catalog.must_register(Arc::new(Noop(noop_spec())));
    let metrics = Metrics::new();
    let mut builder = Dispatcher::builder(catalog).recorder(Arc::new(Bounded::default()));
    if on {
        builder = builder.observer(metrics.observer());
    }
    call_loop(
        &builder.build(),
        n,
        if on {
            ", metrics on,"
        } else {
            ", metrics off,"
        },
    );
    if on {
        assert!(
            metrics
                .render()
                .contains("quiver_tool_calls_total{tool=\"noop\"")
        );
    }
}
