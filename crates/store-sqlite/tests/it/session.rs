use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quiver_surface::ports::{SessionStore, TIER0_KEY, WorkingSetEntry};
use serde_json::json;

use crate::support::store;

#[tokio::test]
async fn working_sets_failures_and_surface_state_persist() {
    let (_dir, path, store) = store();
    let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    store
        .upsert_working_set(
            "s1",
            vec![
                WorkingSetEntry::new("a", t, 1),
                WorkingSetEntry::new("b", t, 1),
            ],
        )
        .await
        .expect("upsert");
    store
        .upsert_working_set("s1", vec![WorkingSetEntry::new("a", t, 3)])
        .await
        .expect("refresh");
    store
        .upsert_working_set("s2", vec![WorkingSetEntry::new("z", t, 1)])
        .await
        .expect("other session");
    store
        .remove_from_working_set("s1", vec!["b".into()])
        .await
        .expect("remove");
    assert_eq!(
        store
            .record_failed_approach("s1", "h1", "a", "e1")
            .await
            .expect("f"),
        1
    );
    assert_eq!(
        store
            .record_failed_approach("s1", "h1", "a", "e2")
            .await
            .expect("f"),
        2
    );
    let before = SystemTime::now();
    store
        .put_state(TIER0_KEY, json!(["a", "b"]))
        .await
        .expect("floor");

    store.close().await.expect("close");
    drop(store);
    let store = quiver_store_sqlite::SqliteStore::open(&path).expect("reopen");
    assert_eq!(
        store.working_set("s1").await.expect("ws"),
        [WorkingSetEntry::new("a", t, 3)]
    );
    let failures = store.failed_approaches("s1").await.expect("failures");
    assert_eq!(failures.len(), 1);
    assert_eq!((failures[0].count, failures[0].error.as_str()), (2, "e2"));
    let floor = store.state(TIER0_KEY).await.expect("state").expect("floor");
    assert_eq!(floor.value, json!(["a", "b"]));
    assert!(floor.written_at >= before - Duration::from_secs(1));

    store.end_session("s1").await.expect("end");
    assert!(store.working_set("s1").await.expect("ws").is_empty());
    assert!(store.failed_approaches("s1").await.expect("f").is_empty());
    assert_eq!(store.working_set("s2").await.expect("ws").len(), 1);
}

/// Retention applies to session state: sessions idle past the cutoff lose their stored
/// working set and failure counts; a session used since (either) keeps both.
#[tokio::test]
async fn sessions_idle_past_the_cutoff_are_purged() {
    let (_dir, _path, store) = store();
    let old = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let ws = |t| {
        vec![
            WorkingSetEntry::new("a", old, 1),
            WorkingSetEntry::new("b", t, 2),
        ]
    };
    store
        .upsert_working_set("idle", ws(old))
        .await
        .expect("idle");
    store
        .upsert_working_set("busy", ws(SystemTime::now()))
        .await
        .expect("busy");
    store
        .upsert_working_set("failing", ws(old))
        .await
        .expect("failing");
    // Recorded now: this session was used recently although its working set is old.
    store
        .record_failed_approach("failing", "h", "a", "e")
        .await
        .expect("failure");
    let cutoff = old + Duration::from_secs(3600);
    assert_eq!(
        store
            .purge_sessions_idle_since(cutoff)
            .await
            .expect("purge"),
        1
    );
    assert!(store.working_set("idle").await.expect("ws").is_empty());
    assert_eq!(store.working_set("busy").await.expect("ws").len(), 2);
    assert_eq!(store.working_set("failing").await.expect("ws").len(), 2);
    assert_eq!(
        store.failed_approaches("failing").await.expect("f").len(),
        1
    );
    // Later, everything is idle: the failure counts go with the working sets.
    let later = SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(
        store.purge_sessions_idle_since(later).await.expect("purge"),
        2
    );
    assert!(store.working_set("failing").await.expect("ws").is_empty());
    assert!(
        store
            .failed_approaches("failing")
            .await
            .expect("f")
            .is_empty()
    );
    assert!(store.working_set("busy").await.expect("ws").is_empty());
}
