use std::time::{Duration, SystemTime};

use quiver_contract::{Envelope, ErrKind, HintKind, RenderOptions, render};
use quiver_registry::{
    CallRecord, ToolCallRecorder,
    store::{CallFilter, CallLog},
};
use quiver_surface::ports::{ToolUsage, UsageSource};
use serde_json::json;

use crate::support::{call, store};

const DAY: Duration = Duration::from_secs(86_400);

#[tokio::test]
async fn recorded_calls_read_back_filtered_with_summary_and_full_output() {
    let (_dir, _path, store) = store();
    let long = Envelope::text("x".repeat(2_000));
    store
        .record(
            CallRecord::new("read", "c1", json!({"path": "/a"}), long.clone())
                .with_session("s1")
                .with_tenant("t")
                .with_principal("ci")
                .with_reasoning("looking")
                .with_timings(Duration::from_micros(7), Duration::from_micros(42)),
        )
        .await;
    store
        .record(call("read", "c2", "hint").with_session("s2"))
        .await;
    store
        .record(call("write", "c3", "err").with_session("s1"))
        .await;
    store.flush().await;

    let all = store
        .recent_calls(CallFilter::recent(10))
        .await
        .expect("all");
    assert_eq!(all.len(), 3);
    let c1 = all.iter().find(|c| c.call_id == "c1").expect("c1");
    assert_eq!(c1.output_summary.chars().count(), 500);
    assert!(render(&long, &RenderOptions::default()).starts_with(&c1.output_summary));
    assert_eq!(c1.output, None, "full output only when asked");
    assert_eq!(c1.input, json!({"path": "/a"}));
    assert_eq!(
        (c1.session.as_deref(), c1.tenant.as_deref()),
        (Some("s1"), Some("t"))
    );
    assert_eq!(c1.reasoning.as_deref(), Some("looking"));
    // Who called (the inbound token's name), and nobody for a call without a token.
    assert_eq!(c1.principal.as_deref(), Some("ci"));
    let c2 = all.iter().find(|c| c.call_id == "c2").expect("c2");
    assert_eq!(c2.principal, None);
    assert_eq!(
        (c1.queued, c1.took),
        (Duration::from_micros(7), Duration::from_micros(42))
    );
    assert!(c1.success);

    let ids = |f: CallFilter| {
        let store = store.clone();
        async move {
            let mut v: Vec<String> = store
                .recent_calls(f)
                .await
                .expect("query")
                .into_iter()
                .map(|c| c.call_id)
                .collect();
            v.sort();
            v
        }
    };
    assert_eq!(ids(CallFilter::recent(10).tool("read")).await, ["c1", "c2"]);
    assert_eq!(
        ids(CallFilter::recent(10).session("s1")).await,
        ["c1", "c3"]
    );
    assert_eq!(ids(CallFilter::recent(10).kind("hint")).await, ["c2"]);
    assert_eq!(ids(CallFilter::recent(1)).await.len(), 1);

    let errs = store
        .recent_calls(CallFilter::recent(10).kind("err").with_output())
        .await
        .expect("errs");
    assert_eq!(errs[0].err_kind, Some(ErrKind::ToolFailed));
    assert_eq!(errs[0].error.as_deref(), Some("boom"));
    assert!(!errs[0].success);
    assert_eq!(
        errs[0].output,
        Some(Envelope::err(ErrKind::ToolFailed, "boom"))
    );
    let hint = store
        .recent_calls(CallFilter::recent(10).kind("hint"))
        .await
        .expect("hints");
    assert_eq!(hint[0].hint_kind, Some(HintKind::Schema));
    assert_eq!(store.writer_stats().rows_written, 3);
}

/// Usage counts the calls that answered (Ok or a Hint): a call refused first (denied by
/// policy, unknown, looping, too large, a `tools/call` the server could not read, its
/// arguments refused by the schema check, its server not up) is not use of the tool, or a
/// tool the model keeps trying against a deny rule would be put on every session's list;
/// nor is a call that failed (a tool whose every call times out or crashes its server
/// must not rank first). A schema hint the tool returned after it ran counts.
#[tokio::test]
async fn usage_counts_only_calls_that_answered() {
    let (_dir, _path, store) = store();
    let now = SystemTime::now();
    let rec = |tool: &str, id: &str, env: Envelope| CallRecord::new(tool, id, json!({}), env);
    for (i, kind) in [
        ErrKind::PolicyDenied,
        ErrKind::UndefinedTool,
        ErrKind::Forbidden,
        ErrKind::LoopGuard,
        ErrKind::Other("input_too_large".into()),
        ErrKind::Other("too_deep".into()),
        ErrKind::Other("invalid_params".into()),
    ]
    .into_iter()
    .enumerate()
    {
        store
            .record(rec(
                "denied",
                &format!("d{i}"),
                Envelope::err(kind, "refused"),
            ))
            .await;
    }
    store
        .record(rec(
            "denied",
            "n0",
            Envelope::err(
                ErrKind::NotAvailable,
                "`denied` is not available: MCP server \"x\" is still connecting. Try again shortly, or use another tool.",
            ),
        ))
        .await;
    store
        .record(rec(
            "denied",
            "h0",
            Envelope::hint(
                HintKind::Schema,
                "the arguments to `denied` do not fit its schema: `/a`: wrong type",
                Vec::new(),
            ),
        ))
        .await;
    // Ran and failed: the tool's own failure, an upstream not available, a timeout.
    for (i, kind) in [ErrKind::ToolFailed, ErrKind::NotAvailable, ErrKind::Timeout]
        .into_iter()
        .enumerate()
    {
        store
            .record(rec("failed", &format!("f{i}"), Envelope::err(kind, "boom")))
            .await;
    }
    // Answered: a hint the tool returned (about its own input), the dispatcher's refusal
    // of another tool's name, and an Ok.
    store.record(rec("used", "u0", Envelope::text("ok"))).await;
    store.record(rec("used", "u1", Envelope::text("ok"))).await;
    store
        .record(rec(
            "used",
            "u2",
            Envelope::hint(HintKind::Schema, "the row id is unknown", Vec::new()),
        ))
        .await;
    store
        .record(rec(
            "used",
            "u3",
            Envelope::hint(
                HintKind::Schema,
                "the arguments to `other` do not fit its schema",
                Vec::new(),
            ),
        ))
        .await;
    store.record(rec("used", "u4", Envelope::text("ok"))).await;
    store.flush().await;
    assert_eq!(
        store.usage(now).await.expect("usage"),
        [ToolUsage::new("used", 5, 0, 0)]
    );
}

#[tokio::test]
async fn usage_is_bucketed_by_age_and_retention_purges_old_rows() {
    let (_dir, _path, store) = store();
    let now = SystemTime::now();
    let ages = [0, 1, 29, 31, 89, 91, 400];
    for (i, days) in ages.iter().enumerate() {
        store
            .record(call("a", &format!("a{i}"), "ok").with_at(now - DAY * *days))
            .await;
    }
    store
        .record(call("b", "b0", "ok").with_at(now - DAY * 100))
        .await;
    store.flush().await;
    assert_eq!(
        store.usage(now).await.expect("usage"),
        [ToolUsage::new("a", 3, 2, 2), ToolUsage::new("b", 0, 0, 1)]
    );

    // Enough old rows to take several purge batches.
    for i in 0..2_500 {
        store
            .record(call("c", &format!("old{i}"), "ok").with_at(now - DAY * 200))
            .await;
    }
    store.flush().await;
    let purged = store
        .purge_calls_before(now - DAY * 90)
        .await
        .expect("purge");
    assert_eq!(purged, 2_500 + 3);
    assert_eq!(
        store.usage(now).await.expect("usage"),
        [ToolUsage::new("a", 3, 2, 0)]
    );
    assert_eq!(
        store
            .recent_calls(CallFilter::recent(100))
            .await
            .expect("rest")
            .len(),
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_tasks_times_ten_thousand_records_give_eighty_thousand_rows() {
    let (_dir, _path, store) = store();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..10_000 {
                    store.record(call("t", &format!("{t}-{i}"), "ok")).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    store.flush().await;
    let stats = store.writer_stats();
    assert_eq!((stats.rows_written, stats.rows_failed), (80_000, 0));
    let rows = store
        .recent_calls(CallFilter::recent(100_000))
        .await
        .expect("rows");
    assert_eq!(rows.len(), 80_000);
    let distinct: std::collections::HashSet<_> = rows.iter().map(|r| &r.call_id).collect();
    assert_eq!(distinct.len(), 80_000);
}

#[tokio::test]
async fn records_after_close_are_counted_not_lost_in_silence() {
    let (_dir, _path, store) = store();
    store.record(call("a", "1", "ok")).await;
    store.close().await.expect("close");
    store.record(call("a", "2", "ok")).await;
    let stats = store.writer_stats();
    assert_eq!((stats.rows_written, stats.rows_failed), (1, 1));
    assert!(stats.last_error.is_some());
}

/// Rows committed so far, read by another connection (what a crash would leave).
fn committed_rows(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).expect("open");
    conn.query_row("SELECT count(*) FROM execution_log", [], |r| r.get(0))
        .expect("count")
}

#[tokio::test]
async fn lingering_rows_are_committed_together_and_without_a_flush() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("quiver.db");
    let store = quiver_store_sqlite::SqliteStore::open_with(
        &path,
        quiver_store_sqlite::StoreOptions::default().with_linger(Duration::from_secs(3)),
    )
    .expect("open");
    store.record(call("read", "c1", "ok")).await;
    store.record(call("read", "c2", "ok")).await;
    // The second row arrives within the first one's (long) linger: both go in one commit.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while committed_rows(&path) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "rows never committed without a flush"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        store.writer_stats().batches_written,
        1,
        "one commit for both rows"
    );
    // A flush commits at once, whatever the linger.
    store.record(call("read", "c3", "ok")).await;
    store.flush().await;
    assert_eq!(committed_rows(&path), 3);
    assert_eq!(store.writer_stats().rows_written, 3);
}

/// While another connection holds the write lock, the log's batches fail after their
/// retries and the store says it is failing (what `/readyz` reports), holding the rows;
/// once the lock is gone, asking again clears it without any new call (the writer's probe),
/// and the held row is written, not lost.
#[tokio::test]
async fn a_failing_log_says_so_until_a_batch_is_written_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("quiver.db");
    let store = quiver_store_sqlite::SqliteStore::open_with(
        &path,
        quiver_store_sqlite::StoreOptions::default()
            .with_busy_timeout(Duration::from_millis(50))
            .with_linger(Duration::ZERO),
    )
    .expect("open");
    store.record(call("read", "c1", "ok")).await;
    store.flush().await;
    assert!(!store.writer_stats().failing);

    let blocker = rusqlite::Connection::open(&path).expect("open");
    blocker
        .execute_batch("BEGIN EXCLUSIVE")
        .expect("the write lock");
    store.record(call("read", "c2", "ok")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !store.writer_stats().failing {
        assert!(
            std::time::Instant::now() < deadline,
            "the log never reported failing: {:?}",
            store.writer_stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = store.writer_stats();
    assert_eq!((stats.rows_written, stats.rows_failed), (1, 0));
    assert!(stats.last_error.is_some());

    // Still locked: asking probes, and the probe fails too.
    assert!(store.log_failing());
    store.flush().await;
    assert!(store.log_failing(), "{:?}", store.writer_stats());

    blocker.execute_batch("COMMIT").expect("released");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.log_failing() {
        assert!(
            std::time::Instant::now() < deadline,
            "the probe never cleared the failure: {:?}",
            store.writer_stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The held row, written by the probe or the writer's timer.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while committed_rows(&path) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the held row was never written: {:?}",
            store.writer_stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.record(call("read", "c3", "ok")).await;
    store.flush().await;
    let stats = store.writer_stats();
    assert!(!stats.failing, "{stats:?}");
    assert_eq!((stats.rows_written, stats.rows_failed), (3, 0));
    assert_eq!(committed_rows(&path), 3);
}

/// A batch that fails part-way leaves nothing of itself behind (no log row without its
/// output), and the writer goes on: the next batch opens its own transaction and commits.
#[tokio::test]
async fn a_batch_failing_part_way_is_rolled_back_and_the_next_one_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("quiver.db");
    let store = quiver_store_sqlite::SqliteStore::open_with(
        &path,
        quiver_store_sqlite::StoreOptions::default().with_linger(Duration::ZERO),
    )
    .expect("open");
    store.record(call("read", "c1", "ok")).await;
    store.flush().await;
    // The next log row's id already has an output: its output's insert fails.
    let other = rusqlite::Connection::open(&path).expect("open");
    other
        .execute(
            "INSERT INTO execution_output (log_id, output) VALUES (2, 'squatter')",
            [],
        )
        .expect("the squatting output");
    store.record(call("read", "c2", "ok")).await;
    store.flush().await;
    let stats = store.writer_stats();
    assert_eq!((stats.rows_written, stats.rows_failed), (1, 1), "{stats:?}");
    assert_eq!(
        committed_rows(&path),
        1,
        "the failed batch's log row is gone"
    );
    other
        .execute("DELETE FROM execution_output WHERE log_id = 2", [])
        .expect("removed");
    store.record(call("read", "c3", "ok")).await;
    store.flush().await;
    assert_eq!(committed_rows(&path), 2);
    let orphans: i64 = other
        .query_row(
            "SELECT count(*) FROM execution_log l LEFT JOIN execution_output o ON o.log_id = l.id WHERE o.log_id IS NULL",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(orphans, 0);
}
