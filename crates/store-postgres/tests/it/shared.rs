//! What several servers sharing one database rely on: change notifications, one leader per
//! role, the batched log, and a server that goes away and comes back.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quiver_registry::{
    ToolCallRecorder,
    store::{CallFilter, CallLog, DefinitionStore, JobStore, JobType, NewJob, ToolDefinition},
};
use quiver_store_testkit::contract::call;
use quiver_surface::ports::{FLOOR_ROLE, SessionStore, WorkingSetEntry};

use crate::support::Pg;

/// Waits up to `limit` for `check` to hold, polling every 50 ms.
async fn eventually(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A change through one replica wakes the other's wait by notification: the wait would
/// otherwise run its full minute and return the version it was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_replica_is_announced_to_the_other() {
    let pg = Pg::new();
    let (a, b) = (pg.store().await, pg.store().await);
    let seen = b.definitions_version().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.definitions_changed(Some(seen), Duration::from_secs(60))
                .await
        }
    });
    a.put_definition(ToolDefinition::system(&quiver_contract::ToolSpec::new(
        "t", "d",
    )))
    .await
    .unwrap();
    let now = waiting.await.unwrap().unwrap();
    assert_ne!(now, seen);
    assert_eq!(now, a.definitions_version().await.unwrap());
}

/// A job queued through one replica wakes the other's job worker by notification: its wait
/// would otherwise run its full minute and return the count it was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_queued_through_one_replica_wakes_the_others_worker() {
    let pg = Pg::new();
    let (a, b) = (pg.store().await, pg.store().await);
    assert!(b.announces_jobs());
    // The count now (a first wait returns at once).
    let seen = b.job_queued_since(None, Duration::ZERO).await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.job_queued_since(Some(seen), Duration::from_secs(60))
                .await
        }
    });
    a.create_job(NewJob::new(
        "j1",
        "tool",
        JobType::Build,
        serde_json::json!({}),
    ))
    .await
    .unwrap();
    let now = waiting.await.unwrap().unwrap();
    assert_ne!(
        now, seen,
        "woken by the announcement, not the end of the wait"
    );
    // The woken worker finds the job.
    let claimed = b.claim_job(None).await.unwrap().expect("the queued job");
    assert_eq!(claimed.id, "j1");
    // A job id taken already is refused, and announced to nobody.
    assert!(
        a.create_job(NewJob::new(
            "j1",
            "tool",
            JobType::Build,
            serde_json::json!({})
        ))
        .await
        .is_err()
    );
}

/// Of two replicas, one leads a role (the floor's derivation); when it goes away, the other
/// takes the role over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_a_role_and_hands_it_over_when_it_goes() {
    let pg = Pg::new();
    let (a, b) = (pg.store().await, pg.store().await);
    assert!(a.lead(FLOOR_ROLE).await.unwrap());
    assert!(a.lead(FLOOR_ROLE).await.unwrap(), "kept while it lives");
    assert!(!b.lead(FLOOR_ROLE).await.unwrap());
    assert!(b.lead("another role").await.unwrap());
    a.close().await.unwrap();
    drop(a);
    assert!(
        eventually(Duration::from_secs(10), async || b
            .lead(FLOOR_ROLE)
            .await
            .unwrap())
        .await,
        "the role passes on"
    );
}

/// Eight tasks recording ten thousand calls each: every row is written, none lost, and the
/// other replica reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_tasks_times_ten_thousand_records_give_eighty_thousand_rows() {
    let pg = Pg::new();
    let store = pg.store().await;
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
    assert!(stats.batches_written < 80_000, "rows share batches");
    let other = pg.store().await;
    let rows = other
        .recent_calls(CallFilter::recent(100_000))
        .await
        .expect("read");
    assert_eq!(rows.len(), 80_000);
    // One chain through every batch, with its checkpoints.
    let report = quiver_registry::chain::verify(&other, None)
        .await
        .expect("verify");
    assert!(report.intact(), "{:?}", report.problems);
    assert_eq!((report.rows, report.checkpoints_checked), (80_000, 8));
}

/// The server goes away: reads fail with a clear error, call records are held, readiness
/// says the log is failing; it comes back: the held rows are written, reads work again and
/// the change listener reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_away_and_comes_back_loses_nothing() {
    let mut pg = Pg::new();
    let store = pg.store().await;
    store.record(call("t", "before", "ok")).await;
    store.flush().await;
    pg.server.stop();

    let err = store
        .all_definitions()
        .await
        .expect_err("the server is gone");
    let text = err.to_string();
    assert!(text.contains("unavailable"), "{text}");
    assert!(
        !text.contains(quiver_store_testkit::PASSWORD_FOR_TESTS),
        "{text}"
    );
    for i in 0..5 {
        store.record(call("t", &format!("down{i}"), "ok")).await;
    }
    assert!(
        eventually(Duration::from_secs(20), async || store.log_failing()).await,
        "the log reports that it cannot write"
    );

    pg.server.start_again();
    assert!(
        eventually(Duration::from_secs(30), async || !store.log_failing()).await,
        "the log takes writes again"
    );
    store.flush().await;
    let mut ids: Vec<String> = store
        .recent_calls(CallFilter::recent(10))
        .await
        .expect("reads work again")
        .into_iter()
        .map(|c| c.call_id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["before", "down0", "down1", "down2", "down3", "down4"]);

    // The listener is back: another replica's change wakes a wait.
    let seen = store.definitions_version().await.unwrap();
    let other = pg.store().await;
    other
        .put_definition(ToolDefinition::system(&quiver_contract::ToolSpec::new(
            "t", "d",
        )))
        .await
        .unwrap();
    let mut now = seen;
    assert!(
        eventually(Duration::from_secs(30), async || {
            now = store
                .definitions_changed(Some(seen), Duration::from_millis(200))
                .await
                .unwrap();
            now != seen
        })
        .await,
        "the change listener reconnected"
    );
}

/// Retention applies to session state: sessions idle past the cutoff lose their stored
/// working set and failure counts; a session used since (either) keeps both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_idle_past_the_cutoff_are_purged() {
    let pg = Pg::new();
    let store = pg.store().await;
    let old = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let ws = |t| {
        vec![
            WorkingSetEntry::new("a", old, 1),
            WorkingSetEntry::new("b", t, 2),
        ]
    };
    store.replace_working_set("idle", ws(old)).await.unwrap();
    store
        .replace_working_set("busy", ws(SystemTime::now()))
        .await
        .unwrap();
    store.replace_working_set("failing", ws(old)).await.unwrap();
    store
        .record_failed_approach("failing", "h", "a", "e")
        .await
        .unwrap();
    let cutoff = old + Duration::from_secs(3600);
    assert_eq!(store.purge_sessions_idle_since(cutoff).await.unwrap(), 1);
    assert!(store.working_set("idle").await.unwrap().is_empty());
    assert_eq!(store.working_set("busy").await.unwrap().len(), 2);
    assert_eq!(store.working_set("failing").await.unwrap().len(), 2);
}
