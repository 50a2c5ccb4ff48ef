//! The execution log's hash chain in PostgreSQL, changed behind Quiver's back with SQL:
//! each change is found by `quiver_registry::chain::verify` and named.

use quiver_registry::{
    ToolCallRecorder,
    chain::{Tamper, verify},
};
use quiver_store_testkit::contract::call;

use crate::support::Pg;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_changed_removed_or_inserted_with_sql_are_each_found() {
    let pg = Pg::new();
    let store = pg.store().await;
    for i in 1..=6 {
        store.record(call("t", &format!("c{i}"), "ok")).await;
    }
    store.flush().await;
    let problems = async || verify(&store, None).await.expect("verify").problems;
    assert_eq!(problems().await, []);

    // Changed: one character of the arguments.
    pg.server.psql(
        "quiver",
        r#"UPDATE execution_log SET input_data = '{"id":"cX"}' WHERE chain_seq = 2"#,
    );
    let found = problems().await;
    assert!(
        matches!(found.as_slice(), [Tamper::Changed { seq: 2, call_id, .. }] if call_id == "c2"),
        "{found:?}"
    );
    // Changed back: the link is over the content, so the chain is whole again.
    pg.server.psql(
        "quiver",
        r#"UPDATE execution_log SET input_data = '{"id":"c2"}' WHERE chain_seq = 2"#,
    );
    assert_eq!(problems().await, []);

    // Inserted: a copy of a row, without a link.
    pg.server.psql(
        "quiver",
        "INSERT INTO execution_log (tool_name, call_id, input_data, args_hash, kind, success,
             output_summary, queued_us, took_us, created_at)
         SELECT tool_name, 'forged', input_data, args_hash, kind, success, output_summary,
             queued_us, took_us, created_at FROM execution_log WHERE chain_seq = 1",
    );
    let found = problems().await;
    assert!(
        matches!(found.as_slice(), [Tamper::Inserted { .. }]),
        "{found:?}"
    );
    pg.server.psql(
        "quiver",
        "DELETE FROM execution_log WHERE call_id = 'forged'",
    );

    // Removed: one from the middle, then the last.
    pg.server
        .psql("quiver", "DELETE FROM execution_log WHERE chain_seq = 4");
    assert_eq!(problems().await, [Tamper::Removed { from: 4, to: 4 }]);
    pg.server
        .psql("quiver", "DELETE FROM execution_log WHERE chain_seq = 6");
    assert_eq!(
        problems().await,
        [
            Tamper::Removed { from: 4, to: 4 },
            Tamper::TailRemoved { last: 5, head: 6 }
        ]
    );
    store.close().await.expect("close");
}

/// A row appended after the stored head with SQL is found, even one whose link is right
/// (made by someone who runs the chain's algorithm): the head does not cover it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_appended_past_the_head_with_sql_is_found() {
    use quiver_registry::{chain::hex, store::CallLog};
    let pg = Pg::new();
    let store = pg.store().await;
    for i in 1..=4 {
        store.record(call("t", &format!("c{i}"), "ok")).await;
    }
    store.flush().await;
    let last = store.chain_rows(3, None, 1).await.expect("row 4").remove(0);
    let mut forged = last.entry.clone();
    forged.call_id = "forged".into();
    let link = forged.link(5, &last.point.link);
    const COLUMNS: &str = "tool_name, tenant, session, principal, parent_call_id, input_data,
        reasoning, args_hash, kind, hint_kind, err_kind, success, error, output_summary, output,
        queued_us, took_us, created_at, trace_id";
    pg.server.psql(
        "quiver",
        &format!(
            "INSERT INTO execution_log (call_id, chain_seq, chain_link, {COLUMNS})
             SELECT 'forged', 5, '\\x{}'::bytea, {COLUMNS} FROM execution_log WHERE chain_seq = 4",
            hex(&link)
        ),
    );
    let report = verify(&store, None).await.expect("verify");
    assert_eq!(report.problems, [Tamper::PastHead { head: 4, last: 5 }]);
    store.close().await.expect("close");
}

/// Rows copied in (`quiver store migrate`) join the chain after the rows already there,
/// oldest first, once each (a second copy adds nothing); a row that came without its output
/// reads back with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copied_rows_join_the_chain_once() {
    use quiver_registry::store::{CallFilter, CallLog, LoggedCall};
    let pg = Pg::new();
    let store = pg.store().await;
    store.record(call("t", "live", "ok")).await;
    store.flush().await;
    let t0 = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let mut data = quiver_store_postgres::Import::default();
    for (i, kind) in ["ok", "err", "hint"].iter().enumerate() {
        let mut c = LoggedCall::from_record(
            &call("old", &format!("m{i}"), kind)
                .with_at(t0 + std::time::Duration::from_secs(10 - i as u64)),
        );
        if i == 1 {
            c.output = None;
        }
        data.calls.push(c);
    }
    assert_eq!(store.import(&data).await.expect("import").calls, 3);
    assert_eq!(store.import(&data).await.expect("again").calls, 0);
    let report = verify(&store, None).await.expect("verify");
    assert!(report.intact(), "{:?}", report.problems);
    assert_eq!(report.span, Some((1, 4)));
    // Oldest first after the live row.
    let rows = store.chain_rows(1, None, 10).await.expect("rows");
    assert_eq!(
        rows.iter()
            .map(|r| r.entry.call_id.to_string())
            .collect::<Vec<_>>(),
        ["m2", "m1", "m0"]
    );
    let read = store
        .recent_calls(CallFilter::recent(10).with_output())
        .await
        .expect("read with outputs");
    let m1 = read.iter().find(|c| c.call_id == "m1").expect("m1");
    assert_eq!(m1.output, None);
    store.close().await.expect("close");
}

/// Two copies of the same rows at once (two `quiver store migrate` runs) add them once: the
/// second waits for the first and then finds them there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_at_once_add_the_rows_once() {
    use quiver_registry::store::LoggedCall;
    let pg = Pg::new();
    let (one, two) = (pg.store().await, pg.store().await);
    let t0 = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let mut data = quiver_store_postgres::Import::default();
    for i in 0..3 {
        data.calls.push(LoggedCall::from_record(
            &call("old", &format!("m{i}"), "ok").with_at(t0 + std::time::Duration::from_secs(i)),
        ));
    }
    // A writer holding the chain's head makes both copies wait at the same point, so
    // neither is done before the other starts.
    let (mut holder, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let tx = holder.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM log_chain WHERE id = 1 FOR UPDATE", &[])
        .await
        .expect("hold the head");
    let copies = tokio::spawn(async move {
        let (a, b) = tokio::join!(one.import(&data), two.import(&data));
        (a.expect("first copy").calls, b.expect("second copy").calls)
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting = pg.server.psql(
            "quiver",
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
        );
        if waiting.trim() == "2" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "both copies wait for the head ({waiting} do)"
        );
        tokio::task::yield_now().await;
    }
    tx.commit().await.expect("release the head");
    let (a, b) = copies.await.expect("copies");
    assert_eq!(a + b, 3, "first copy {a}, second {b}");
    assert_eq!(
        pg.server
            .psql("quiver", "SELECT count(*) FROM execution_log")
            .trim(),
        "3"
    );
}
