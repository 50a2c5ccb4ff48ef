//! [`Surface`]: composes the tools a session's model sees, per round, from the system set, the
//! resident floor and the session's working set, within budgets, and keeps the search index
//! in step with the catalog. This file holds its state and constructor; its methods are
//! split by concern: `compose` (rounds and the floor), `admit` (what a caller may see and
//! call), `index` (the search index), `discover` (`tool_search` and `describe_tool`),
//! `sessions` (working sets and their keys) and `persist` (the store behind them).

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{Arc, Mutex, RwLock},
};

use quiver_registry::Catalog;
use tokio::sync::{broadcast, watch};

use crate::{
    SurfaceConfig, SurfaceError, UsageScores,
    floor::FloorState,
    index::{Allowed, Indexed, Retriever, Visible, VisibleKey, build_index, sync_index},
    sessions::Persisted,
    sync::lock,
    working_set::Session,
};

/// What [`Surface::reconfigure`] replaces together.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) config: Arc<SurfaceConfig>,
    pub(crate) system: Arc<Vec<String>>,
}

/// The shared per-session tool surface. Build it with [`Surface::new`]; hand it to the
/// dispatcher as a [`CallObserver`](quiver_registry::CallObserver) so calls refresh the
/// working set.
pub struct Surface {
    pub(crate) catalog: Arc<Catalog>,
    /// The configuration and the system tools it names; [`Surface::reconfigure`] replaces
    /// both at once, for the next request.
    pub(crate) settings: RwLock<Arc<Settings>>,
    pub(crate) usage: Arc<dyn UsageScores>,
    pub(crate) index: RwLock<Indexed>,
    /// The agentic allow-list as last expanded, with the catalog version it was for.
    pub(crate) agentic_cache: Mutex<Option<(u64, Arc<Vec<String>>)>>,
    /// Per allow-list (a token's `allowed_tools` patterns), the catalog's tools it allows,
    /// with the catalog version they are for: a search's filter runs on thousands of
    /// tools, and this makes each one a set lookup, not a match against every pattern of
    /// the list.
    pub(crate) allowed_cache: Mutex<HashMap<Vec<String>, Allowed>>,
    /// Per allow-list, deny list and mode, the indexed tools the caller finds (see
    /// [`Visible`]).
    pub(crate) visible_cache: Mutex<HashMap<VisibleKey, Visible>>,
    /// The vector retriever blended into `tool_search`, if a deployment set one.
    pub(crate) retriever: Mutex<Option<Retriever>>,
    /// Wakes the vector task (`vectors.rs`) when the index may have tools without a vector.
    pub(crate) vector_wake: Arc<tokio::sync::Notify>,
    pub(crate) vector_progress: watch::Sender<crate::VectorProgress>,
    pub(crate) index_updates: watch::Sender<u64>,
    /// Whether a task keeps the index in step with the catalog's events (a surface built
    /// inside a tokio runtime).
    pub(crate) index_synced: std::sync::atomic::AtomicBool,
    pub(crate) sessions: Mutex<HashMap<Arc<str>, Session>>,
    /// Restored working-set names whose tools were not in the catalog yet (an upstream
    /// still connecting after a restart): paged in when they register, and kept in the
    /// persisted set meanwhile so the store does not lose them.
    pub(crate) pending: Mutex<HashMap<Arc<str>, Vec<String>>>,
    /// Keys already restored from a store (see [`Surface::restore_once`]).
    pub(crate) restored: Mutex<HashSet<Arc<str>>>,
    /// Keys a request in flight uses ([`Surface::pin`]), with how many: never dropped from
    /// memory meanwhile (see `max_sessions`).
    pub(crate) pinned: Mutex<HashMap<Arc<str>, usize>>,
    /// The clock of `Session::last_used`.
    pub(crate) clock: std::sync::atomic::AtomicU64,
    pub(crate) floor: Mutex<FloorState>,
    /// Counts the changes of the floor's tools (a new ranking read or derived): every
    /// session's list changed with it.
    pub(crate) floor_updates: watch::Sender<u64>,
    pub(crate) changes: broadcast::Sender<Arc<str>>,
    /// Ended sessions whose stored working set the persistence task deletes, in order with
    /// the writes before it (see [`Surface::forget_session`]).
    pub(crate) forgotten: Mutex<HashSet<Arc<str>>>,
    /// Whether a persistence task runs (`spawn_persistence`), and how many changes were
    /// sent to it.
    pub(crate) mirror: Mutex<Mirror>,
    /// How many changes the persistence task has handled (see [`Surface::mirror_settled`]).
    pub(crate) mirrored: watch::Sender<u64>,
    /// Whether the persistence task writes to a store several servers share: every round
    /// of a session holding tools is written then (see `Surface::round_moved`).
    pub(crate) shared_store: std::sync::atomic::AtomicBool,
}

/// The persistence task's side of the change channel: counted under one lock with the
/// sends, so the count starts exactly where the task's subscription does.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    pub(crate) running: bool,
    pub(crate) sent: u64,
    /// Per session, the changes sent and not handled by the task yet.
    pub(crate) unwritten: HashMap<Arc<str>, u32>,
    /// The persisted sets of sessions dropped from memory (see `max_sessions`) with
    /// changes not written yet: the task writes them, and a key that comes back first is
    /// restored from here, not from the older stored set.
    pub(crate) parting: HashMap<Arc<str>, Persisted>,
}

impl fmt::Debug for Surface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Surface")
            .field("catalog", &self.catalog)
            .field("config", &self.config())
            .finish_non_exhaustive()
    }
}

impl Surface {
    /// Builds the surface over `catalog`: indexes every live, listed tool, and (inside a
    /// tokio runtime) spawns the task that keeps the index in step with catalog events.
    /// Without a runtime, call [`Surface::resync_index`] after catalog changes.
    pub fn new(
        catalog: Arc<Catalog>,
        config: SurfaceConfig,
        usage: Arc<dyn UsageScores>,
    ) -> Result<Arc<Surface>, SurfaceError> {
        config.validate()?;
        for w in config.warnings() {
            tracing::warn!("surface configuration: {w}");
        }
        let (events, at) = catalog.subscribe_at();
        let system = config.system_set();
        let (changes, _) = broadcast::channel(1024);
        // The index built below has every change up to `at`.
        let (index_updates, _) = watch::channel(at);
        let (vector_progress, vector_wake) = crate::vectors::channels();
        let surface = Arc::new(Surface {
            vector_progress,
            vector_wake,
            index: RwLock::new(build_index(&catalog, None)),
            retriever: Mutex::new(None),
            agentic_cache: Mutex::new(None),
            allowed_cache: Mutex::new(HashMap::new()),
            visible_cache: Mutex::new(HashMap::new()),
            catalog,
            settings: RwLock::new(Arc::new(Settings {
                config: Arc::new(config),
                system: Arc::new(system),
            })),
            usage,
            index_updates,
            index_synced: std::sync::atomic::AtomicBool::new(false),
            sessions: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            restored: Mutex::new(HashSet::new()),
            pinned: Mutex::new(HashMap::new()),
            forgotten: Mutex::new(HashSet::new()),
            mirror: Mutex::new(Mirror::default()),
            mirrored: watch::channel(0).0,
            shared_store: std::sync::atomic::AtomicBool::new(false),
            clock: std::sync::atomic::AtomicU64::new(0),
            floor: Mutex::new(FloorState::default()),
            floor_updates: watch::channel(0).0,
            changes,
        });
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            surface
                .index_synced
                .store(true, std::sync::atomic::Ordering::Relaxed);
            handle.spawn(sync_index(Arc::downgrade(&surface), events, at));
        }
        Ok(surface)
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The settings in force.
    pub(crate) fn settings(&self) -> Arc<Settings> {
        self.settings
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<SurfaceConfig> {
        self.settings().config.clone()
    }

    /// The always-resident system tools, in order.
    pub fn system_tools(&self) -> Arc<Vec<String>> {
        self.settings().system.clone()
    }

    /// Replaces the configuration for the next request, as a reload of `quiver serve`
    /// does. `config` is checked first, and when it is refused nothing changes. The cached
    /// allow-list expansions are dropped, the resident floor is derived again under the new
    /// sizes and anchors, and every open session is told its list may have changed.
    /// Working sets keep what they hold; a smaller `working_set.max_tools` or
    /// `round` budget takes effect as sessions page tools in.
    pub fn reconfigure(&self, config: SurfaceConfig) -> Result<(), SurfaceError> {
        config.validate()?;
        for w in config.warnings() {
            tracing::warn!("surface configuration: {w}");
        }
        let system = config.system_set();
        *self
            .settings
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(Settings {
            config: Arc::new(config),
            system: Arc::new(system),
        });
        *lock(&self.agentic_cache) = None;
        lock(&self.visible_cache).clear();
        self.rederive_floor();
        let open: Vec<Arc<str>> = lock(&self.sessions).keys().cloned().collect();
        for id in open {
            let _ = self.changes.send(id);
        }
        Ok(())
    }

    /// Receives a session id whenever that session's working set (or loaded set) changes, so
    /// an MCP server can send `notifications/tools/list_changed`.
    pub fn subscribe_changes(&self) -> broadcast::Receiver<Arc<str>> {
        self.changes.subscribe()
    }
}
