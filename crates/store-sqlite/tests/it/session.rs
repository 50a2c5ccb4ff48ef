use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quiver_surface::ports::{SessionStore, WorkingSetEntry};

use crate::support::store;

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
        .replace_working_set("idle", ws(old))
        .await
        .expect("idle");
    store
        .replace_working_set("busy", ws(SystemTime::now()))
        .await
        .expect("busy");
    store
        .replace_working_set("failing", ws(old))
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
