//! A fixed number of no-op calls through the full dispatch pipeline (with a bounded
//! recorder, like the criterion bench). Wall time per call is printed; for a figure that does
//! not move with the machine's load, count instructions with callgrind at two call counts and
//! take the difference:
//! `valgrind --tool=callgrind target/release/examples/dispatch_loop 20000` (and 40000).

use std::{hint::black_box, sync::Arc, time::Instant};

use quiver_contract::CallContext;
use quiver_registry::{Catalog, Dispatcher};
use serde_json::json;

#[path = "../benches/common/mod.rs"]
mod common;
use common::{Bounded, Noop, noop_spec};

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
    catalog.must_register(Arc::new(Noop(noop_spec())));
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
