use std::time::Duration;

use quiver_registry::{
    ToolCallRecorder,
    store::{CallFilter, CallLog},
};

use crate::support::{call, store};

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

/// The whole log read out page by page (as `quiver store migrate` copies it): every row
/// once, in row order, with its output, rows older than the hash chain included.
#[tokio::test]
async fn the_log_reads_out_in_pages_of_every_row_older_than_the_chain_too() {
    let (_dir, path, store) = store();
    for i in 1..=5 {
        store.record(call("t", &format!("c{i}"), "ok")).await;
    }
    store.flush().await;
    // The first two rows as a store from before the hash chain left them: unchained.
    let conn = rusqlite::Connection::open(&path).expect("open");
    let unchained = conn
        .execute(
            "UPDATE execution_log SET chain_seq = NULL, chain_link = NULL WHERE call_id IN ('c1', 'c2')",
            [],
        )
        .expect("unchain");
    assert_eq!(unchained, 2);
    drop(conn);
    let (mut after, mut pages, mut ids) = (0, Vec::new(), Vec::new());
    loop {
        let page = store.calls_page(after, 2).await.expect("a page");
        let Some(last) = page.last() else { break };
        after = last.row;
        pages.push(page.len());
        for c in &page {
            let text = format!("{:?}", c.output);
            assert!(text.contains(&format!("result of {}", c.call_id)), "{text}");
            ids.push(c.call_id.clone());
        }
    }
    assert_eq!(pages, [2, 2, 1]);
    assert_eq!(ids, ["c1", "c2", "c3", "c4", "c5"]);
}

/// A row appended after the stored head with SQL is found, even one whose link is right
/// (made by someone who runs the chain's algorithm): the head does not cover it.
#[tokio::test]
async fn a_row_appended_past_the_head_with_sql_is_found() {
    use quiver_registry::chain::{Tamper, hex, verify};
    let (_dir, path, store) = store();
    for i in 1..=4 {
        store.record(call("t", &format!("c{i}"), "ok")).await;
    }
    store.flush().await;
    let last = store.chain_rows(3, None, 1).await.expect("row 4").remove(0);
    let mut forged = last.entry.clone();
    forged.call_id = "forged".into();
    let link = forged.link(5, &last.point.link);
    let conn = rusqlite::Connection::open(&path).expect("open");
    const COLUMNS: &str = "tool_name, tenant, session, principal, parent_call_id, input_data,
        reasoning, args_hash, kind, hint_kind, err_kind, success, error, output_summary,
        queued_us, took_us, created_at, trace_id";
    conn.execute_batch(&format!(
        "INSERT INTO execution_log (call_id, chain_seq, chain_link, {COLUMNS})
             SELECT 'forged', 5, X'{}', {COLUMNS} FROM execution_log WHERE chain_seq = 4;
         INSERT INTO execution_output (log_id, output)
             SELECT (SELECT id FROM execution_log WHERE chain_seq = 5), output
             FROM execution_output
             WHERE log_id = (SELECT id FROM execution_log WHERE chain_seq = 4);",
        hex(&link)
    ))
    .expect("append behind the head");
    drop(conn);
    let report = verify(&store, None).await.expect("verify");
    assert_eq!(report.problems, [Tamper::PastHead { head: 4, last: 5 }]);
}
