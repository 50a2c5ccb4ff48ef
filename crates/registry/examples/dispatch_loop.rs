//! A fixed number of no-op calls through the full dispatch pipeline (with a bounded
//! recorder, like the criterion bench). Wall time per call is printed; for a figure that does
//! not move with the machine's load, count instructions with callgrind at two call counts and
//! take the difference:
//! `valgrind --tool=callgrind target/release/examples/dispatch_loop 20000` (and 40000).

use std::sync::Arc;

use quiver_registry::{Catalog, Dispatcher};

#[path = "../benches/common/mod.rs"]
mod common;
use common::{Bounded, Noop, call_loop, noop_spec};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let catalog = Arc::new(Catalog::new());
    catalog.must_register(Arc::new(Noop(noop_spec())));
    let d = Dispatcher::builder(catalog)
        .recorder(Arc::new(Bounded::default()))
        .build();
    call_loop(&d, n, "");
}
