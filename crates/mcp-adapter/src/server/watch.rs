//! Which changes concern whom: a session's working set changing (the surface names the key)
//! or the catalog changing (every session's surface may differ).

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use quiver_registry::{Catalog, CatalogEvent};
use tokio::sync::{
    broadcast::{self, error::RecvError, error::TryRecvError},
    watch,
};

use super::Shared;

pub(crate) struct Changes {
    sessions: broadcast::Receiver<Arc<str>>,
    catalog: broadcast::Receiver<CatalogEvent>,
    /// The catalog, for its version (weak: the watch ends when the catalog goes).
    source: Weak<Catalog>,
    /// The catalog version the search index has caught up with.
    index: watch::Receiver<u64>,
    /// The floor's changes (every session's list).
    floor: watch::Receiver<u64>,
    /// When the last change was returned.
    last: Option<tokio::time::Instant>,
    /// A change taken off its channel and not returned yet (`Some(true)` for a catalog
    /// change, which waits for the index): kept here, so a `next` dropped in a `select!`
    /// while it waits loses nothing.
    pending: Option<bool>,
}

/// The least time between two changes returned: the first of a burst goes out at once, the
/// rest of it (an upstream storm of `list_changed`, a flapping server) is merged into one
/// every interval, instead of one notification per catalog event to every session.
const COALESCE: Duration = Duration::from_millis(100);

/// How long a catalog change's notification waits for the search index to take the change
/// in (so a client that searches on `list_changed` finds the new tool); the index applies
/// an event in microseconds, so this only bounds a surface whose index is not synced.
const INDEX_WAIT: Duration = Duration::from_secs(1);

impl Changes {
    pub(crate) fn subscribe(shared: &Shared) -> Self {
        Changes {
            sessions: shared.surface.subscribe_changes(),
            catalog: shared.surface.catalog().subscribe(),
            source: Arc::downgrade(shared.surface.catalog()),
            index: shared.surface.index_updates(),
            floor: shared.surface.floor_updates(),
            last: None,
            pending: None,
        }
    }

    /// Waits for the next change that concerns a key `relevant` accepts (a lag counts as a
    /// change; a catalog change once the search index has it), then swallows the changes
    /// already queued so one burst makes one notification; a change within [`COALESCE`]
    /// of the last one returned waits out the interval first, so a storm makes one per
    /// interval. `None` when the surface or the catalog is gone.
    pub(crate) async fn next(&mut self, relevant: impl Fn(&str) -> bool) -> Option<()> {
        // Cancel-safe: every await below either takes nothing, or records what it took in
        // `pending` before the next await.
        while self.pending.is_none() {
            let (hit, catalog) = tokio::select! {
                r = self.sessions.recv() => match r {
                    Ok(key) => (relevant(&key), false),
                    Err(RecvError::Lagged(_)) => (true, false),
                    Err(RecvError::Closed) => return None,
                },
                r = self.catalog.recv() => match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => (true, true),
                    Err(RecvError::Closed) => return None,
                },
                r = self.floor.changed() => match r {
                    Ok(()) => (true, false),
                    Err(_) => return None,
                },
            };
            if hit {
                self.pending = Some(catalog);
            }
        }
        if let Some(last) = self.last {
            tokio::time::sleep_until(last + COALESCE).await;
        }
        // What queued meanwhile is merged into this one.
        if self.drain() {
            self.pending = Some(true);
        }
        if self.pending == Some(true) {
            // Every catalog change taken so far is at or below this version (a change is
            // counted before it is sent): wait until the index has them all.
            let version = self.catalog_version();
            let _ =
                tokio::time::timeout(INDEX_WAIT, self.index.wait_for(|at| *at >= version)).await;
        }
        self.pending = None;
        self.last = Some(tokio::time::Instant::now());
        Some(())
    }

    /// The catalog's version now (0 once it is gone: nothing left to wait for).
    fn catalog_version(&self) -> u64 {
        self.source.upgrade().map_or(0, |c| c.version())
    }

    /// Swallows the changes already queued; whether one of them was the catalog's.
    fn drain(&mut self) -> bool {
        self.floor.mark_unchanged();
        while !matches!(
            self.sessions.try_recv(),
            Err(TryRecvError::Empty | TryRecvError::Closed)
        ) {}
        let mut catalog = false;
        while !matches!(
            self.catalog.try_recv(),
            Err(TryRecvError::Empty | TryRecvError::Closed)
        ) {
            catalog = true;
        }
        catalog
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;
    use quiver_contract::{CallContext, Envelope, Tool, ToolResult, ToolSpec};
    use quiver_registry::Catalog;
    use serde_json::Value;

    use super::*;
    use crate::server::ServerOptions;

    struct Noop(ToolSpec);

    #[async_trait]
    impl Tool for Noop {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
            Ok(Envelope::ok(Value::Null))
        }
    }

    fn shared() -> Arc<Shared> {
        crate::server::test_server(Arc::new(Catalog::new()), ServerOptions::default()).shared
    }

    /// Waits until the search index has the first catalog change (registered before the
    /// subscription, so it cannot wake the watch).
    async fn indexed(shared: &Shared) {
        let mut index = shared.surface.index_updates();
        tokio::time::timeout(Duration::from_secs(5), index.wait_for(|n| *n >= 1))
            .await
            .expect("indexed in time")
            .unwrap();
    }

    async fn next_within(changes: &mut Changes, relevant: impl Fn(&str) -> bool) -> Option<()> {
        tokio::time::timeout(Duration::from_secs(5), changes.next(relevant))
            .await
            .expect("a change arrives in time")
    }

    #[tokio::test]
    async fn a_catalog_change_concerns_every_session() {
        let shared = shared();
        let mut changes = Changes::subscribe(&shared);
        shared
            .surface
            .catalog()
            .register(Arc::new(Noop(ToolSpec::new("added_tool", "Added."))))
            .unwrap();
        assert_eq!(next_within(&mut changes, |_| false).await, Some(()));
        // By then the search index has it: a client that searches on list_changed finds it.
        assert_eq!(shared.surface.index_len(), 1);
    }

    #[tokio::test]
    async fn a_working_set_change_concerns_its_key() {
        let shared = shared();
        shared
            .surface
            .catalog()
            .register(Arc::new(Noop(ToolSpec::new("paged_tool", "Paged."))))
            .unwrap();
        // The registration is indexed before the subscription, so only the working sets
        // can wake it.
        indexed(&shared).await;
        let mut changes = Changes::subscribe(&shared);
        shared.surface.page_in("other", &["paged_tool"]);
        shared.surface.page_in("mine", &["paged_tool"]);
        assert_eq!(next_within(&mut changes, |k| k == "mine").await, Some(()));
    }

    /// The floor's tools change (a new usage ranking): every session's list differs.
    #[tokio::test]
    async fn a_floor_change_concerns_every_session() {
        let catalog = Arc::new(Catalog::new());
        catalog
            .register(Arc::new(Noop(ToolSpec::new("popular", "Used a lot."))))
            .unwrap();
        let usage = Arc::new(quiver_surface::MemoryUsage::new([]));
        let surface = quiver_surface::Surface::new(
            catalog.clone(),
            quiver_surface::SurfaceConfig::default(),
            usage.clone(),
        )
        .unwrap();
        let shared = crate::server::McpServer::new(
            surface,
            quiver_registry::Dispatcher::new(catalog),
            ServerOptions::default(),
        )
        .shared;
        indexed(&shared).await;
        let mut changes = Changes::subscribe(&shared);
        // Derived again with nothing new: no change, nothing to tell.
        shared.surface.rederive_floor();
        let quiet = tokio::time::timeout(Duration::from_millis(200), changes.next(|_| false));
        assert!(quiet.await.is_err(), "an unchanged floor woke the sessions");
        usage.set("popular", [5, 0, 0]);
        assert_eq!(shared.surface.rederive_floor().names(), ["popular"]);
        assert_eq!(next_within(&mut changes, |_| false).await, Some(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_catalog_changes_is_merged() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let shared = shared();
        let mut changes = Changes::subscribe(&shared);
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        let watcher = tokio::spawn(async move {
            while changes.next(|_| false).await.is_some() {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        // 50 changes over 250 ms: the first at once, then one per 100 ms.
        for i in 0..50 {
            shared
                .surface
                .catalog()
                .register(Arc::new(Noop(ToolSpec::new(
                    format!("storm_{i}"),
                    "Storm.",
                ))))
                .unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = seen.load(Ordering::SeqCst);
        assert!((2..=5).contains(&n), "{n} notifications for 50 changes");
        watcher.abort();
    }

    /// A `next` dropped while it waits (a `select!` in which another branch won) keeps the
    /// change it took: the next call returns it.
    #[tokio::test(start_paused = true)]
    async fn a_change_taken_by_a_dropped_wait_is_not_lost() {
        let shared = shared();
        let mut changes = Changes::subscribe(&shared);
        let register = |name: &str| {
            shared
                .surface
                .catalog()
                .register(Arc::new(Noop(ToolSpec::new(name, "A tool."))))
                .unwrap()
        };
        register("first_tool");
        assert_eq!(next_within(&mut changes, |_| false).await, Some(()));
        // The second change comes within the interval: its `next` waits, and is dropped.
        register("second_tool");
        let dropped =
            tokio::time::timeout(Duration::from_millis(10), changes.next(|_| false)).await;
        assert!(dropped.is_err(), "it waits out the interval");
        assert_eq!(next_within(&mut changes, |_| false).await, Some(()));
    }
}
