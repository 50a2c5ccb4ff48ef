use std::{sync::Arc, time::Duration};

use quiver_surface::{
    SurfaceConfig,
    ports::{MemorySessionStore, SessionStore},
};

use crate::support::{Fixture, ro};

#[tokio::test]
async fn working_sets_are_mirrored_to_the_store_and_restored() {
    let specs = vec![ro("alpha", "A."), ro("beta", "B."), ro("gamma", "C.")];
    let fx = Fixture::new(SurfaceConfig::default(), specs.clone(), &[]);
    let store = Arc::new(MemorySessionStore::default());
    let mut written = fx.surface.spawn_persistence(store.clone());
    fx.surface.page_in("s", &["alpha"]);
    fx.surface.page_in("s", &["beta"]);
    // Wait until both changes are written.
    tokio::time::timeout(Duration::from_secs(10), written.wait_for(|n| *n >= 2))
        .await
        .unwrap()
        .unwrap();
    let mut stored: Vec<String> = store
        .working_set("s")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.tool)
        .collect();
    stored.sort();
    assert_eq!(stored, vec!["alpha", "beta"]);

    // A new process: a fresh surface over the same store gets the session back, recency kept.
    let fx2 = Fixture::new(SurfaceConfig::default(), specs, &[]);
    assert!(fx2.surface.working_set("s").is_empty());
    let restored = fx2.surface.restore_session("s", &*store).await.unwrap();
    assert_eq!(restored, vec!["alpha", "beta"]);
    assert_eq!(
        fx2.surface.working_set("s"),
        vec!["beta", "alpha"],
        "most recent first"
    );
    assert!(
        fx2.surface
            .restore_session("nobody", &*store)
            .await
            .unwrap()
            .is_empty()
    );
}
