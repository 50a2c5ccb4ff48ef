use std::{sync::Arc, time::Duration};

use quiver_surface::{
    SurfaceConfig,
    ports::{MemorySessionStore, SessionStore},
};

use crate::support::{Fixture, ro};

/// The names `store` holds for `session`, sorted.
/// Waits until the surface's persistence task has written every change made so far.
async fn settle(fx: &Fixture) {
    tokio::time::timeout(Duration::from_secs(10), fx.surface.mirror_settled())
        .await
        .unwrap();
}

async fn stored(store: &dyn SessionStore, session: &str) -> Vec<String> {
    let mut names: Vec<String> = store
        .working_set(session)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.tool)
        .collect();
    names.sort();
    names
}

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
    assert_eq!(stored(&*store, "s").await, vec!["alpha", "beta"]);

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

    // Restored under a smaller cap: the newest is kept, and only it is reported restored.
    let fx3 = Fixture::new(
        SurfaceConfig::default().with_working_set(1, 1 << 20),
        vec![ro("alpha", "A."), ro("beta", "B."), ro("gamma", "C.")],
        &[],
    );
    let restored = fx3.surface.restore_session("s", &*store).await.unwrap();
    assert_eq!(restored, vec!["beta"]);
    assert_eq!(fx3.surface.working_set("s"), vec!["beta"]);
}

/// After a restart, clients come back before every upstream has connected: a stored name
/// whose tool is not registered yet is held (and stays in the store), then paged in when
/// the tool registers.
#[tokio::test]
async fn a_restored_name_waits_for_its_tool_to_register() {
    use crate::support::stub;
    let store = Arc::new(MemorySessionStore::default());
    let before = Fixture::new(
        SurfaceConfig::default(),
        vec![
            ro("alpha", "A."),
            ro("late", "Registers after the restart."),
        ],
        &[],
    );
    before.surface.page_in("s", &["alpha", "late"]);
    before.surface.persist_session("s", &*store).await.unwrap();

    let fx = Fixture::new(SurfaceConfig::default(), vec![ro("alpha", "A.")], &[]);
    let mut written = fx.surface.spawn_persistence(store.clone());
    let restored = fx.surface.restore_session("s", &*store).await.unwrap();
    assert_eq!(restored, vec!["alpha"]);
    assert_eq!(fx.surface.working_set("s"), vec!["alpha"]);
    // The mirror writes the session (the restore changed it) without dropping `late`.
    tokio::time::timeout(Duration::from_secs(10), written.wait_for(|n| *n >= 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored(&*store, "s").await, vec!["alpha", "late"]);

    let mut updates = fx.surface.index_updates();
    fx.catalog
        .register(stub(ro("late", "Registers after the restart.")))
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        updates.wait_for(|_| fx.surface.working_set("s").contains(&"late".to_owned())),
    )
    .await
    .expect("the held name is paged in once its tool registers")
    .unwrap();
    // Ending the session forgets what it still held.
    fx.surface.end_session("s");
    assert!(fx.surface.persisted_set("s").is_empty());
}

/// Beyond `max_sessions` the least recently used working sets leave memory (each key
/// costs memory, and keys are client-chosen); a dropped key that comes back is restored
/// from the store.
#[tokio::test]
async fn the_least_used_working_sets_leave_memory_and_come_back_from_the_store() {
    let config = SurfaceConfig::default().with_max_sessions(3);
    let fx = Fixture::new(config, vec![ro("alpha", "A."), ro("beta", "B.")], &[]);
    let store = Arc::new(MemorySessionStore::default());
    for s in ["s1", "s2", "s3"] {
        fx.surface.restore_once(s, &*store).await;
        fx.surface.page_in(s, &["alpha"]);
        fx.surface.persist_session(s, &*store).await.unwrap();
    }
    fx.surface.page_in("s1", &["beta"]); // s1 used again: s2 is now the least used
    fx.surface.persist_session("s1", &*store).await.unwrap();
    fx.surface.page_in("s4", &["beta"]);
    let mut held = fx.surface.session_keys();
    held.sort();
    assert_eq!(held, vec!["s1", "s3", "s4"]);
    assert!(fx.surface.working_set("s2").is_empty());
    fx.surface.restore_once("s2", &*store).await;
    assert_eq!(
        fx.surface.working_set("s2"),
        vec!["alpha"],
        "restored again"
    );
    assert_eq!(fx.surface.session_keys().len(), 3, "still at most three");
}

/// A session dropped from memory (beyond `max_sessions`) before the mirror got to its last
/// change is written as it was when dropped: not as empty, and not left at its older
/// stored set (which lost the change).
#[tokio::test]
async fn a_session_dropped_from_memory_keeps_its_last_change() {
    let config = SurfaceConfig::default().with_max_sessions(1);
    let fx = Fixture::new(config, vec![ro("alpha", "A."), ro("beta", "B.")], &[]);
    let store = Arc::new(MemorySessionStore::default());
    let mut written = fx.surface.spawn_persistence(store.clone());
    fx.surface.page_in("a", &["alpha"]);
    tokio::time::timeout(Duration::from_secs(10), written.wait_for(|n| *n >= 1))
        .await
        .unwrap()
        .unwrap();
    // On this (current-thread) runtime the mirror runs only at the next await: `a` changes
    // and is dropped (for `b`) before the mirror sees its change.
    fx.surface.page_in("a", &["beta"]);
    fx.surface.page_in("b", &["alpha"]);
    assert!(!fx.surface.holds("a"));
    tokio::time::timeout(Duration::from_secs(10), written.wait_for(|n| *n >= 2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored(&*store, "b").await, vec!["alpha"]);
    assert_eq!(
        stored(&*store, "a").await,
        vec!["alpha", "beta"],
        "neither wiped nor missing its last change"
    );

    // The key comes back before the mirror wrote its last change: it is restored as it was
    // dropped, and the store ends up with that too.
    fx.surface.page_in("b", &["beta"]);
    fx.surface.page_in("c", &["alpha"]); // drops `b` with `beta` unwritten
    assert!(!fx.surface.holds("b"));
    fx.surface.restore_once("b", &*store).await;
    let mut back = fx.surface.working_set("b");
    back.sort();
    assert_eq!(back, vec!["alpha", "beta"]);
    tokio::time::timeout(Duration::from_secs(10), fx.surface.mirror_settled())
        .await
        .unwrap();
    assert_eq!(stored(&*store, "b").await, vec!["alpha", "beta"]);
}

/// A store whose working-set writes take a while (a busy SQLite file).
struct SlowWrites(MemorySessionStore);

#[async_trait::async_trait]
impl SessionStore for SlowWrites {
    async fn working_set(
        &self,
        session: &str,
    ) -> Result<Vec<quiver_surface::ports::WorkingSetEntry>, quiver_registry::store::StoreError>
    {
        self.0.working_set(session).await
    }
    async fn versioned_working_set(
        &self,
        session: &str,
    ) -> Result<quiver_surface::ports::StoredWorkingSet, quiver_registry::store::StoreError> {
        self.0.versioned_working_set(session).await
    }
    async fn replace_working_set(
        &self,
        session: &str,
        entries: Vec<quiver_surface::ports::WorkingSetEntry>,
    ) -> Result<u64, quiver_registry::store::StoreError> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.0.replace_working_set(session, entries).await
    }
    async fn replace_working_set_if(
        &self,
        session: &str,
        entries: Vec<quiver_surface::ports::WorkingSetEntry>,
        expected: u64,
    ) -> Result<Option<u64>, quiver_registry::store::StoreError> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.0
            .replace_working_set_if(session, entries, expected)
            .await
    }
    async fn record_failed_approach(
        &self,
        session: &str,
        args_hash: &str,
        tool: &str,
        error: &str,
    ) -> Result<u32, quiver_registry::store::StoreError> {
        self.0
            .record_failed_approach(session, args_hash, tool, error)
            .await
    }
    async fn failed_approaches(
        &self,
        session: &str,
    ) -> Result<Vec<quiver_surface::ports::FailedApproach>, quiver_registry::store::StoreError>
    {
        self.0.failed_approaches(session).await
    }
    async fn end_session(&self, session: &str) -> Result<(), quiver_registry::store::StoreError> {
        self.0.end_session(session).await
    }
    async fn state(
        &self,
        key: &str,
    ) -> Result<Option<quiver_surface::ports::SurfaceState>, quiver_registry::store::StoreError>
    {
        self.0.state(key).await
    }
    async fn put_state(
        &self,
        key: &str,
        value: serde_json::Value,
    ) -> Result<(), quiver_registry::store::StoreError> {
        self.0.put_state(key, value).await
    }
}

/// A session forgotten while its last change is still being written: the delete comes
/// after that write, so the rows do not come back.
#[tokio::test]
async fn a_forgotten_session_stays_deleted_after_a_write_in_flight() {
    let fx = Fixture::new(
        SurfaceConfig::default(),
        vec![ro("alpha", "A."), ro("beta", "B.")],
        &[],
    );
    let store = Arc::new(SlowWrites(MemorySessionStore::default()));
    let mut written = fx.surface.spawn_persistence(store.clone());
    fx.surface.page_in("ended", &["alpha"]);
    fx.surface.page_in("kept", &["beta"]);
    // The first write is under way (it takes 200 ms) when the session ends.
    tokio::time::sleep(Duration::from_millis(50)).await;
    fx.surface.forget_session("ended");
    tokio::time::timeout(Duration::from_secs(10), written.wait_for(|n| *n >= 3))
        .await
        .unwrap()
        .unwrap();
    assert!(stored(&*store, "ended").await.is_empty());
    assert_eq!(stored(&*store, "kept").await, ["beta"]);
}

/// Shutdown waits on `mirror_settled` before it closes the store: it returns once every
/// change made so far is written, and an ended session's delete is done.
#[tokio::test]
async fn mirror_settled_waits_for_the_writes_and_deletes_under_way() {
    let fx = Fixture::new(SurfaceConfig::default(), vec![ro("alpha", "A.")], &[]);
    let store = Arc::new(SlowWrites(MemorySessionStore::default()));
    // Without a persistence task there is nothing to wait for.
    tokio::time::timeout(Duration::from_secs(10), fx.surface.mirror_settled())
        .await
        .expect("returns at once without a persistence task");
    let _written = fx.surface.spawn_persistence(store.clone());
    fx.surface.page_in("s", &["alpha"]);
    // The write takes 200 ms.
    tokio::time::timeout(Duration::from_secs(10), fx.surface.mirror_settled())
        .await
        .expect("the mirror settles");
    assert_eq!(stored(&*store, "s").await, ["alpha"]);
    fx.surface.forget_session("s");
    tokio::time::timeout(Duration::from_secs(10), fx.surface.mirror_settled())
        .await
        .expect("the mirror settles");
    assert!(stored(&*store, "s").await.is_empty());
}

/// A session dropped from memory while its last change is being written (the store is
/// slow), and whose key comes back before the write lands, is restored as it was, not from
/// the store that does not have the change yet; the store ends up with it too.
#[tokio::test]
async fn a_session_dropped_during_its_write_comes_back_whole() {
    let fx = Fixture::new(
        SurfaceConfig::default().with_max_sessions(1),
        vec![ro("alpha", "A."), ro("beta", "B.")],
        &[],
    );
    let store = Arc::new(SlowWrites(MemorySessionStore::default()));
    let _written = fx.surface.spawn_persistence(store.clone());
    fx.surface.restore_once("a", &*store).await;
    fx.surface.page_in("a", &["alpha"]);
    // The write of `a` is under way (it takes 200 ms) when `b` pushes `a` out of memory.
    tokio::time::sleep(Duration::from_millis(50)).await;
    fx.surface.page_in("b", &["beta"]);
    assert!(!fx.surface.holds("a"));
    fx.surface.restore_once("a", &*store).await;
    assert_eq!(fx.surface.working_set("a"), ["alpha"], "restored whole");
    tokio::time::timeout(Duration::from_secs(10), fx.surface.mirror_settled())
        .await
        .expect("the mirror settles");
    assert_eq!(stored(&*store, "a").await, ["alpha"]);
}

/// A session a request is using (pinned) is not dropped from memory for another key:
/// `max_sessions` is exceeded meanwhile, and the bound applies again once it is unpinned.
#[tokio::test]
async fn a_pinned_session_stays_in_memory() {
    let fx = Fixture::new(
        SurfaceConfig::default().with_max_sessions(1),
        vec![ro("alpha", "A."), ro("beta", "B.")],
        &[],
    );
    let surface = fx.surface.clone();
    let a: Arc<str> = "a".into();
    let pin = surface.pin(&a);
    surface.page_in("a", &["alpha"]);
    surface.page_in("b", &["beta"]);
    assert!(surface.holds("a") && surface.holds("b"), "a is in use");
    drop(pin);
    surface.page_in("c", &["beta"]);
    assert!(!surface.holds("a"), "unpinned, the least used goes");
}

/// A tool's idle rounds are stored with it, so a restore (a restarted server, the next
/// `quiver call` of a session) lets it leave when it would have without one; restored, a
/// tool idle for no round was also not made older.
#[tokio::test]
async fn idle_rounds_survive_a_restore() {
    let specs = vec![ro("alpha", "A."), ro("beta", "B.")];
    let config = SurfaceConfig::default().with_idle_rounds(2);
    let store = Arc::new(MemorySessionStore::default());
    let before = Fixture::new(config.clone(), specs.clone(), &[]);
    before.surface.page_in("s", &["alpha"]);
    before.surface.next_round("s");
    before.surface.next_round("s");
    // beta is new; alpha has been idle two rounds (one more and it goes).
    before.surface.page_in("s", &["beta"]);
    before.surface.persist_session("s", &*store).await.unwrap();
    let rounds: Vec<(String, u64)> = {
        let mut v: Vec<(String, u64)> = store
            .working_set("s")
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.tool, e.round))
            .collect();
        v.sort();
        v
    };
    assert_eq!(rounds, [("alpha".to_owned(), 2), ("beta".to_owned(), 0)]);

    let after = Fixture::new(config, specs, &[]);
    after.surface.restore_session("s", &*store).await.unwrap();
    assert_eq!(after.surface.working_set("s"), vec!["beta", "alpha"]);
    // alpha's third idle round, beta's first.
    assert_eq!(after.surface.next_round("s"), vec!["alpha"]);
    assert_eq!(after.surface.working_set("s"), vec!["beta"]);
    assert!(after.surface.next_round("s").is_empty(), "beta's second");
    assert_eq!(after.surface.next_round("s"), vec!["beta"], "beta's third");
}

/// Two servers sharing one store (two surfaces over one shared store), one stateless
/// conversation whose calls alternate between them: the stored set is the conversation's
/// one truth. The idle rounds counted on A travel with the set, so B evicts the idle tool
/// when its rounds across both are up; A then takes B's set without it, and neither writes
/// it back.
#[tokio::test]
async fn an_eviction_on_one_server_is_taken_by_the_other_and_never_written_back() {
    use quiver_contract::Mode;
    let specs = vec![ro("alpha", "A."), ro("beta", "B."), ro("gamma", "C.")];
    let config = SurfaceConfig::default().with_idle_rounds(2);
    let a = Fixture::new(config.clone(), specs.clone(), &[]);
    let b = Fixture::new(config, specs, &[]);
    let store = Arc::new(MemorySessionStore::new_shared());
    let _ = a.surface.spawn_persistence(store.clone());
    let _ = b.surface.spawn_persistence(store.clone());
    // A: the conversation pages in alpha, then beta.
    assert!(a.surface.restore_once("c", &*store).await);
    a.surface.page_in("c", &["alpha"]);
    a.surface.page_in("c", &["beta"]);
    settle(&a).await;
    // B takes the conversation's next call: the stored set.
    assert!(b.surface.restore_once("c", &*store).await);
    assert_eq!(b.surface.working_set("c"), vec!["beta", "alpha"]);

    // Back on A, which wrote the stored set last: it keeps its own. Two calls of beta:
    // alpha is idle two rounds, the most `idle_rounds` keeps.
    assert!(!a.surface.take_stored("c", &*store).await.unwrap());
    assert!(a.surface.begin_call("c", Mode::Chat, "beta").is_empty());
    assert!(a.surface.begin_call("c", Mode::Chat, "beta").is_empty());
    settle(&a).await;

    // B takes A's set with its idle rounds: one more round evicts alpha.
    assert!(b.surface.take_stored("c", &*store).await.unwrap());
    assert_eq!(b.surface.working_set("c"), vec!["beta", "alpha"]);
    assert_eq!(b.surface.begin_call("c", Mode::Chat, "beta"), vec!["alpha"]);
    settle(&b).await;
    assert_eq!(stored(&*store, "c").await, vec!["beta"]);

    // A, which still holds alpha, takes B's set: alpha is gone there too, and A's calls
    // from now on never write it back.
    assert_eq!(a.surface.working_set("c"), vec!["beta", "alpha"]);
    assert!(a.surface.take_stored("c", &*store).await.unwrap());
    assert_eq!(a.surface.working_set("c"), vec!["beta"]);
    a.surface.page_in("c", &["gamma"]);
    a.surface.begin_call("c", Mode::Chat, "gamma");
    settle(&a).await;
    assert_eq!(stored(&*store, "c").await, vec!["beta", "gamma"]);

    // B takes that: gamma added, alpha still gone, and B's own write keeps it so.
    assert!(b.surface.take_stored("c", &*store).await.unwrap());
    assert_eq!(b.surface.working_set("c"), vec!["gamma", "beta"]);
    b.surface.begin_call("c", Mode::Chat, "beta");
    settle(&b).await;
    assert_eq!(stored(&*store, "c").await, vec!["beta", "gamma"]);
    // Nothing newer than what B wrote: B keeps its set.
    assert!(!b.surface.take_stored("c", &*store).await.unwrap());
}

/// Two servers that each change one conversation's set without having seen the other's
/// last write (two calls of the conversation at once): the second write finds the version
/// moved on and merges instead of overwriting, so both additions stay, and a removal made
/// on one server stays removed while the other adds a tool.
#[tokio::test]
async fn changes_made_on_two_servers_at_once_are_merged_not_overwritten() {
    use quiver_contract::Mode;
    let specs = vec![ro("alpha", "A."), ro("beta", "B."), ro("gamma", "C.")];
    let config = SurfaceConfig::default().with_idle_rounds(2);
    let a = Fixture::new(config.clone(), specs.clone(), &[]);
    let b = Fixture::new(config, specs, &[]);
    let store = Arc::new(MemorySessionStore::new_shared());
    let _ = a.surface.spawn_persistence(store.clone());
    let _ = b.surface.spawn_persistence(store.clone());
    assert!(a.surface.restore_once("c", &*store).await);
    assert!(b.surface.restore_once("c", &*store).await);

    // A finds alpha and B, not having seen it, finds beta: both stay.
    a.surface.page_in("c", &["alpha"]);
    settle(&a).await;
    b.surface.page_in("c", &["beta"]);
    settle(&b).await;
    assert_eq!(stored(&*store, "c").await, vec!["alpha", "beta"]);
    let mut on_b = b.surface.working_set("c");
    on_b.sort();
    assert_eq!(on_b, vec!["alpha", "beta"], "B lists A's find too");

    // Both take the stored set; then A evicts alpha (idle three rounds) while B, not
    // having seen it, finds gamma: alpha stays out, gamma comes in.
    assert!(a.surface.take_stored("c", &*store).await.unwrap());
    assert!(!b.surface.take_stored("c", &*store).await.unwrap());
    for _ in 0..3 {
        a.surface.begin_call("c", Mode::Chat, "beta");
    }
    assert!(!a.surface.working_set("c").contains(&"alpha".to_owned()));
    settle(&a).await;
    assert_eq!(stored(&*store, "c").await, vec!["beta"]);
    b.surface.page_in("c", &["gamma"]);
    settle(&b).await;
    assert_eq!(stored(&*store, "c").await, vec!["beta", "gamma"]);
    let mut on_b = b.surface.working_set("c");
    on_b.sort();
    assert_eq!(on_b, vec!["beta", "gamma"], "B dropped what A evicted");
}
