//! How long `quiver log --verify` takes on a large log: writes `N` rows (default 1,000,000)
//! through the store's writer into a temporary SQLite file, then walks the chain as the
//! command does and prints the time. `cargo run --release -p quiver-store-sqlite --example
//! chain_verify [N]`.

use std::time::Instant;

use quiver_contract::Envelope;
use quiver_registry::{CallRecord, ToolCallRecorder, chain};
use quiver_store_sqlite::{SqliteStore, StoreOptions};

#[tokio::main]
async fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("quiver.db");
    let store = SqliteStore::open(&path).expect("open");
    let started = Instant::now();
    for i in 0..n {
        store
            .record(
                CallRecord::new(
                    "mcp__git__git_log",
                    format!("call-{i}"),
                    serde_json::json!({"repo_path": "/srv/repo", "max_count": i % 50}),
                    Envelope::text(format!("commit {i:040x}\nAuthor: someone\n\n    a change")),
                )
                .with_session("conv:ci:build")
                .with_reasoning("to see what changed"),
            )
            .await;
    }
    store.flush().await;
    let written = started.elapsed();
    store.close().await.expect("close");
    let ro = SqliteStore::open_read_only(&path, StoreOptions::default()).expect("read-only");
    let started = Instant::now();
    let report = chain::verify(&ro, None).await.expect("verify");
    let took = started.elapsed();
    assert!(report.intact(), "{:?}", report.problems);
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "{n} rows written in {:.1} s ({:.0} rows/s); verified in {:.2} s ({:.0} rows/s), {} checkpoint(s) matched; file {:.0} MB",
        written.as_secs_f64(),
        n as f64 / written.as_secs_f64(),
        took.as_secs_f64(),
        report.rows as f64 / took.as_secs_f64(),
        report.checkpoints_checked,
        size as f64 / 1e6
    );
}
