//! [`Surface`]: composes the tools a session's model sees, per round, from the system set, the
//! resident floor and the session's working set, within budgets, and keeps the search index
//! in step with the catalog.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    fmt::Write as _,
    sync::{Arc, Mutex, RwLock, Weak},
};

use quiver_contract::{Capabilities, Mode, ToolSpec, pattern_matches};
use quiver_registry::{AdvertiseOptions, CallObserver, Catalog, CatalogEvent, Entry};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

use crate::{
    Floor, FloorSource, SurfaceConfig, SurfaceError, UsageScores,
    floor::FloorState,
    search::{Embedder, HybridConfig, SearchHit, SearchIndex},
    working_set::{PageIn, Session},
};

/// The name of the search tool.
pub const TOOL_SEARCH: &str = "tool_search";
/// The name of the describe tool.
pub const DESCRIBE_TOOL: &str = "describe_tool";
/// The session key used when a call carries no session.
pub const DEFAULT_SESSION: &str = "default";

/// Why a tool is on the surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// Always resident (`tool_search`, `describe_tool`, configured system tools).
    System,
    /// A configured anchor.
    Anchor,
    /// In the usage-derived floor.
    Floor,
    /// In the static fallback floor.
    Fallback,
    /// On the agentic allow-list.
    AgenticAllow,
    /// Paged in by the model.
    WorkingSet,
}

impl Reason {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::System => "system",
            Reason::Anchor => "anchor",
            Reason::Floor => "floor",
            Reason::Fallback => "fallback",
            Reason::AgenticAllow => "agentic_allow",
            Reason::WorkingSet => "working_set",
        }
    }

    /// Whether the surface put the tool there (rather than the model paging it in).
    pub fn is_resident(self) -> bool {
        !matches!(self, Reason::WorkingSet)
    }
}

/// Why a candidate was left off the surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DropReason {
    /// Not (or no longer) in the catalog.
    Stale,
    /// Not listed in this mode (disabled, unapproved, internal, plan rules).
    NotListed,
    /// The caller may not call it.
    NotAllowed,
    /// Excluded by the mode's lists (agentic-only, delegate-excluded).
    ModeExcluded,
    /// Never offered (`SurfaceConfig::unoffered`: denied to every caller by a policy).
    Unoffered,
    /// A resident tool the model's own capability replaces.
    ReplacedByModel,
    /// The round's definition count was spent.
    OverCount,
    /// It did not fit in the round's byte budget.
    OverBytes,
}

impl DropReason {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Stale => "stale",
            DropReason::NotListed => "not_listed",
            DropReason::NotAllowed => "not_allowed",
            DropReason::ModeExcluded => "mode_excluded",
            DropReason::Unoffered => "unoffered",
            DropReason::ReplacedByModel => "replaced_by_model",
            DropReason::OverCount => "over_count",
            DropReason::OverBytes => "over_bytes",
        }
    }
}

/// One advertised tool.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SurfaceTool {
    /// The spec as the model sees it (lightweight when progressive and not loaded; with the
    /// injected `reasoning` property).
    pub spec: ToolSpec,
    /// Why it is there.
    pub reason: Reason,
    /// Its definition bytes, as budgeted.
    pub bytes: usize,
}

/// One candidate left off.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DroppedTool {
    /// The tool.
    pub name: String,
    /// Why it was a candidate.
    pub reason: Reason,
    /// Why it was dropped.
    pub why: DropReason,
}

/// The tools of one round, in rank order, with what was left off and why.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ComposedSurface {
    /// The session.
    pub session: String,
    /// The mode.
    pub mode: Mode,
    /// The session's round.
    pub round: u64,
    /// The advertised tools, in rank order.
    pub tools: Vec<SurfaceTool>,
    /// The candidates left off.
    pub dropped: Vec<DroppedTool>,
    /// The total definition bytes of `tools`.
    pub bytes: usize,
}

impl ComposedSurface {
    /// The advertised names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.spec.name.as_str()).collect()
    }

    /// The advertised specs, in order.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    /// The reason a tool is on the surface, if it is.
    pub fn reason_of(&self, name: &str) -> Option<Reason> {
        self.tools
            .iter()
            .find(|t| t.spec.name == name)
            .map(|t| t.reason)
    }

    /// Why a candidate was dropped, if it was.
    pub fn dropped_why(&self, name: &str) -> Option<DropReason> {
        self.dropped.iter().find(|d| d.name == name).map(|d| d.why)
    }

    /// A plain-text table: one line per tool (name, reason, bytes), then the dropped ones.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "session {} mode {} round {}: {} tools, {} bytes\n",
            self.session,
            self.mode.as_str(),
            self.round,
            self.tools.len(),
            self.bytes
        );
        for t in &self.tools {
            let _ = writeln!(out, "  {:<24} {}", t.spec.name, t.reason.as_str());
        }
        for d in &self.dropped {
            let _ = writeln!(
                out,
                "  - {:<22} {} ({})",
                d.name,
                d.why.as_str(),
                d.reason.as_str()
            );
        }
        out
    }
}

/// Why a search hit could not be paged in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailReason {
    /// The working set cannot hold it.
    OverBudget,
    /// The session's mode does not list it. Not produced by [`Surface::tool_search`], whose
    /// search already leaves out what the caller's mode keeps off; kept for callers that
    /// page in hits of their own.
    NotDiscoverable,
    /// It left the catalog before it could be loaded.
    LoadFailed,
}

/// One hit of [`Surface::tool_search`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FoundTool {
    /// The tool.
    pub name: String,
    /// Its description, cut to a line.
    pub description: String,
    /// Relevance in 0..=1, two decimals.
    pub score: f64,
}

/// A hit that was not paged in.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FailedTool {
    /// The tool.
    pub name: String,
    /// Why.
    pub reason: FailReason,
}

/// What [`Surface::tool_search`] found and did to the working set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SearchOutcome {
    /// The hits, best first.
    pub hits: Vec<FoundTool>,
    /// The hits now in the working set (callable next turn).
    pub exposed: Vec<String>,
    /// The hits that were not paged in.
    pub failed: Vec<FailedTool>,
    /// Tools evicted from the working set to make room.
    pub evicted: Vec<String>,
    /// Tools the round listed before this search and no longer lists: its budget
    /// (`max_definitions`, `max_bytes`) cut them to make room for the hits. They stay
    /// callable by name; left out when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub displaced: Vec<String>,
}

/// The shared per-session tool surface. Build it with [`Surface::new`]; hand it to the
/// dispatcher as a [`CallObserver`] so calls refresh the working set.
pub struct Surface {
    catalog: Arc<Catalog>,
    config: SurfaceConfig,
    usage: Arc<dyn UsageScores>,
    system: Vec<String>,
    index: RwLock<Indexed>,
    /// The agentic allow-list as last expanded, with the catalog version it was for.
    agentic_cache: Mutex<Option<(u64, Arc<Vec<String>>)>>,
    /// Per allow-list (a token's `allowed_tools` patterns), the catalog's tools it allows,
    /// with the catalog version they are for: a search's filter runs on thousands of
    /// tools, and matching each against every pattern made a search of a 10k-tool catalog
    /// for a 133-pattern list take 12 ms.
    allowed_cache: Mutex<HashMap<Vec<String>, Allowed>>,
    /// Per allow-list, deny list and mode, the indexed tools the caller finds (see
    /// [`Visible`]).
    visible_cache: Mutex<HashMap<VisibleKey, Visible>>,
    /// The vector retriever blended into `tool_search`, if a deployment set one.
    retriever: Mutex<Option<Retriever>>,
    index_updates: watch::Sender<u64>,
    sessions: Mutex<HashMap<Arc<str>, Session>>,
    /// Restored working-set names whose tools were not in the catalog yet (an upstream
    /// still connecting after a restart): paged in when they register, and kept in the
    /// persisted set meanwhile so the store does not lose them.
    pending: Mutex<HashMap<Arc<str>, Vec<String>>>,
    /// Keys already restored from a store (see [`Surface::restore_once`]).
    restored: Mutex<HashSet<Arc<str>>>,
    /// Keys a request in flight uses ([`Surface::pin`]), with how many: never dropped from
    /// memory meanwhile (see `max_sessions`).
    pinned: Mutex<HashMap<Arc<str>, usize>>,
    /// The clock of `Session::last_used`.
    clock: std::sync::atomic::AtomicU64,
    pub(crate) floor: Mutex<FloorState>,
    /// Counts the changes of the floor's tools (a new ranking read or derived): every
    /// session's list changed with it.
    floor_updates: watch::Sender<u64>,
    changes: broadcast::Sender<Arc<str>>,
    /// Ended sessions whose stored working set the persistence task deletes, in order with
    /// the writes before it (see [`Surface::forget_session`]).
    pub(crate) forgotten: Mutex<HashSet<Arc<str>>>,
    /// Whether a persistence task runs (`spawn_persistence`), and how many changes were
    /// sent to it.
    pub(crate) mirror: Mutex<Mirror>,
    /// How many changes the persistence task has handled (see [`Surface::mirror_settled`]).
    pub(crate) mirrored: watch::Sender<u64>,
}

/// The most allow-lists whose allowed tools [`Surface`] keeps at once.
const MAX_ALLOW_LISTS: usize = 256;

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
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn indexable(spec: &ToolSpec) -> bool {
    spec.is_live() && !spec.category.is_internal()
}

/// An embedder and how its ranking is blended in (see [`Surface::set_vector_retriever`]).
type Retriever = (Arc<dyn Embedder>, HybridConfig);

/// The search index and, per indexed tool, the modes it is listed in: the search filter
/// runs for every scored tool, so it reads this map rather than the catalog.
#[derive(Debug, Default)]
struct Indexed {
    index: SearchIndex,
    listed: HashMap<Box<str>, u8>,
    /// Changes with every change of the index (unique across rebuilds): what a cached
    /// [`Visible`] set was computed for.
    generation: u64,
}

/// Index generations, unique for the process (a rebuilt index does not start again).
static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The indexed tools a caller with an allow-list finds in a mode, for one index
/// generation: one lookup per tool a search's filter runs on.
type Visible = (u64, Arc<VisibleSet>);
/// A caller's `allowed_tools` and `denied_tools` patterns and a mode bit.
type VisibleKey = (Option<Vec<String>>, Vec<String>, u8);

/// The catalog's tools an allow-list allows, for one catalog version.
type Allowed = (u64, Arc<HashSet<String>>);

/// A set of tool names, with a fast hash (it is probed once per scored tool).
type VisibleSet = HashSet<Box<str>, foldhash::fast::RandomState>;

fn mode_bit(mode: Mode) -> u8 {
    match mode {
        Mode::Chat => 1,
        Mode::Agentic => 2,
        Mode::Delegate => 4,
        Mode::Plan => 8,
        _ => 16,
    }
}

fn listed_mask(spec: &ToolSpec) -> u8 {
    Mode::ALL
        .into_iter()
        .filter(|m| spec.listed_in(*m))
        .fold(0, |acc, m| acc | mode_bit(m))
}

impl Indexed {
    fn upsert(&mut self, spec: &ToolSpec) {
        self.index.upsert(spec);
        self.listed
            .insert(spec.name.as_str().into(), listed_mask(spec));
        self.generation = next_generation();
    }

    fn remove(&mut self, name: &str) {
        self.index.remove(name);
        self.listed.remove(name);
        self.generation = next_generation();
    }
}

fn any_match(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| pattern_matches(p, name))
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The bytes a tool takes in a working set: its advertised form without narration.
/// What a round's walk does with the names it places.
enum Walk<'a> {
    /// Advertises each placed tool (a composed surface).
    Advertise,
    /// Only places names; with `until`, stops once those are placed or dropped.
    Place { until: Option<HashSet<&'a str>> },
}

fn paged_bytes(entry: &Entry, loaded: bool) -> usize {
    entry.definition_bytes(entry.spec.progressive && !loaded)
}

fn cut_description(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or_default();
    const MAX: usize = 160;
    if line.len() <= MAX {
        return line.to_owned();
    }
    let mut end = MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", line[..end].trim_end())
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
        let surface = Arc::new(Surface {
            index: RwLock::new(build_index(&catalog, None)),
            retriever: Mutex::new(None),
            agentic_cache: Mutex::new(None),
            allowed_cache: Mutex::new(HashMap::new()),
            visible_cache: Mutex::new(HashMap::new()),
            catalog,
            config,
            usage,
            system,
            index_updates,
            sessions: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            restored: Mutex::new(HashSet::new()),
            pinned: Mutex::new(HashMap::new()),
            forgotten: Mutex::new(HashSet::new()),
            mirror: Mutex::new(Mirror::default()),
            mirrored: watch::channel(0).0,
            clock: std::sync::atomic::AtomicU64::new(0),
            floor: Mutex::new(FloorState::default()),
            floor_updates: watch::channel(0).0,
            changes,
        });
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(sync_index(Arc::downgrade(&surface), events, at));
        }
        Ok(surface)
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The configuration.
    pub fn config(&self) -> &SurfaceConfig {
        &self.config
    }

    /// The tools no session is ever shown in full: the definition as a round advertises it
    /// (with the injected `reasoning` property) is larger than what a round has left once
    /// the system tools are placed (they come first), or its paged size is larger than the
    /// working set's budget, so `tool_search` can find it but never load it. Tools no mode
    /// lists are left out. For `quiver check`; sorted by name.
    pub fn oversized(&self) -> Vec<Oversized> {
        let opts = AdvertiseOptions::default();
        let advertised = |spec: &ToolSpec| {
            spec.definition_bytes() + quiver_registry::advertised_extra_bytes(spec, true, &opts)
        };
        let listed = |spec: &ToolSpec| spec.is_live() && !spec.category.is_internal();
        let mut out = Vec::new();
        let mut placed = 0usize;
        // The system tools, in the walk's order: `tool_search` always fits; the others
        // need what the ones before them left.
        for name in &self.system {
            let Some(entry) = self.catalog.lookup(name) else {
                continue;
            };
            let bytes = advertised(&entry.spec);
            if name != TOOL_SEARCH
                && listed(&entry.spec)
                && placed + bytes > self.config.round.max_bytes
            {
                out.push(Oversized {
                    name: name.clone(),
                    bytes,
                    budget: "what a round's tool budget (`surface.round.max_bytes`) has left after the system tools before it",
                    limit: self.config.round.max_bytes.saturating_sub(placed),
                });
            }
            placed += bytes;
        }
        let left = self.config.round.max_bytes.saturating_sub(placed);
        let set = self.config.working_set.max_bytes;
        for entry in self.catalog.tools() {
            let spec = &entry.spec;
            if self.system.iter().any(|s| s == &spec.name) || !listed(spec) {
                continue;
            }
            let bytes = advertised(spec);
            let paged = paged_bytes(&entry, false);
            if bytes > left {
                out.push(Oversized {
                    name: spec.name.clone(),
                    bytes,
                    budget: "what a round's tool budget (`surface.round.max_bytes`) has left after the system tools",
                    limit: left,
                });
            } else if paged > set {
                out.push(Oversized {
                    name: spec.name.clone(),
                    bytes: paged,
                    budget: "the working set's budget (`surface.working_set.max_bytes`)",
                    limit: set,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The always-resident system tools, in order.
    pub fn system_tools(&self) -> &[String] {
        &self.system
    }

    /// Receives a session id whenever that session's working set (or loaded set) changes, so
    /// an MCP server can send `notifications/tools/list_changed`.
    pub fn subscribe_changes(&self) -> broadcast::Receiver<Arc<str>> {
        self.changes.subscribe()
    }

    /// The catalog version ([`Catalog::version`]) the search index has caught up with:
    /// every catalog change up to it is searchable. To wait on, for example until the index
    /// has a change the catalog reported.
    pub fn index_updates(&self) -> watch::Receiver<u64> {
        self.index_updates.subscribe()
    }

    /// The number of indexed tools.
    pub fn index_len(&self) -> usize {
        self.index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .index
            .len()
    }

    /// Blends a vector retriever into `tool_search` (the optional embedding port: see
    /// [`Embedder`] and [`HybridConfig`]), or with `None` goes back to the lexical ranking
    /// alone (the default). Rebuilds the index, embedding every indexed tool in one batch;
    /// later catalog changes embed just the changed tool.
    pub fn set_vector_retriever(&self, retriever: Option<(Arc<dyn Embedder>, HybridConfig)>) {
        *lock(&self.retriever) = retriever;
        self.resync_index();
    }

    /// Rebuilds the search index from the catalog.
    pub fn resync_index(&self) {
        // Read first: the build then sees every change up to it.
        let version = self.catalog.version();
        let retriever = lock(&self.retriever).clone();
        let fresh = build_index(&self.catalog, retriever);
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        self.index_caught_up(version);
    }

    /// Records that the index has every catalog change up to `version` (never going back).
    fn index_caught_up(&self, version: u64) {
        self.index_updates.send_if_modified(|at| {
            let newer = version > *at;
            if newer {
                *at = version;
            }
            newer
        });
    }

    /// Applies one catalog event to the search index.
    fn apply(&self, event: CatalogEvent) {
        match event {
            CatalogEvent::Added(name) => {
                let entry = self.catalog.lookup(&name);
                let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
                match entry {
                    Some(e) if indexable(&e.spec) => index.upsert(&e.spec),
                    _ => index.remove(&name),
                }
            }
            CatalogEvent::Removed(name) => {
                self.index
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&name);
            }
            _ => self.resync_index(),
        }
        self.adopt_pending();
    }

    /// Pages in the restored names whose tools have registered since.
    pub(crate) fn adopt_pending(&self) {
        let ready: Vec<(Arc<str>, Vec<String>)> = {
            let mut pending = lock(&self.pending);
            if pending.is_empty() {
                return;
            }
            let mut ready = Vec::new();
            for (session, names) in pending.iter_mut() {
                let (now, later): (Vec<String>, Vec<String>) = std::mem::take(names)
                    .into_iter()
                    .partition(|n| self.catalog.contains(n));
                *names = later;
                if !now.is_empty() {
                    ready.push((session.clone(), now));
                }
            }
            pending.retain(|_, names| !names.is_empty());
            ready
        };
        for (session, names) in ready {
            // Held oldest first; a page-in takes the newest first.
            let names: Vec<&str> = names.iter().rev().map(String::as_str).collect();
            self.page_in(&session, &names);
        }
    }

    /// Holds restored names whose tools are not in the catalog yet (see `pending`).
    pub(crate) fn hold_pending(&self, session: &str, names: Vec<String>) {
        if names.is_empty() {
            return;
        }
        // The session exists from here on, so dropping it (see `max_sessions`) drops what
        // it holds too.
        self.with_session(session, |_| ());
        let mut pending = lock(&self.pending);
        let held = pending.entry(session.into()).or_default();
        for n in names {
            if !held.contains(&n) {
                held.push(n);
            }
        }
    }

    /// Whether the surface holds the session in memory (it may have dropped it, see
    /// `max_sessions`: its stored set is then left as it is).
    pub fn holds(&self, session: &str) -> bool {
        lock(&self.sessions).contains_key(session)
    }

    /// What persists for the session: its working set (most recent first), then the
    /// restored names still waiting for their tools.
    pub fn persisted_set(&self, session: &str) -> Vec<String> {
        self.persisted_entries(session)
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

    /// [`Surface::persisted_set`], each name with the rounds it has been idle (0 for a name
    /// still waiting for its tool).
    pub(crate) fn persisted_entries(&self, session: &str) -> Persisted {
        // Lock order: sessions, pending.
        let sessions = lock(&self.sessions);
        persisted(sessions.get(session), lock(&self.pending).get(session))
    }

    /// Gives the session's restored tools back the rounds they had been idle.
    pub(crate) fn restore_idle(&self, session: &str, idle: &[(String, u64)]) {
        self.with_session(session, |s| s.restore_idle(idle));
    }

    /// The floor in use: the anchors, then the usage ranking's best tools registered now
    /// (resolved once per catalog version), or the static fallback when none is. The
    /// ranking is the stored one once [`Surface::load_floor`] ran; without a store, it is
    /// derived from the surface's own usage when older than `floor_max_age_secs`.
    pub fn floor(&self) -> Arc<Floor> {
        lock(&self.floor).read(&self.config, &self.catalog, &*self.usage)
    }

    /// Derives the floor again from the surface's own usage now (without a store; a
    /// store-backed floor is derived with [`Surface::rederive_floor_into`]).
    pub fn rederive_floor(&self) -> Arc<Floor> {
        let before = self.floor_names();
        let floor = lock(&self.floor).rederive(&self.config, &self.catalog, &*self.usage);
        self.floor_settled(&before);
        floor
    }

    /// Goes up each time the floor's tools change (a new ranking read or derived; a
    /// catalog change is announced by the catalog itself): every session's tool list may
    /// differ, so a server tells its clients.
    pub fn floor_updates(&self) -> watch::Receiver<u64> {
        self.floor_updates.subscribe()
    }

    /// The floor's tool names now.
    pub(crate) fn floor_names(&self) -> Vec<String> {
        lock(&self.floor)
            .peek(&self.config, &self.catalog)
            .names()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Announces a floor change if the floor's tools differ from `before`.
    pub(crate) fn floor_settled(&self, before: &[String]) {
        if self.floor_names() != before {
            self.floor_updates.send_modify(|n| *n += 1);
        }
    }

    fn notify(&self, session: &str) {
        let mut mirror = lock(&self.mirror);
        let key: Arc<str> = session.into();
        if self.changes.send(key.clone()).is_ok() {
            mirror.sent += 1;
            if mirror.running {
                *mirror.unwritten.entry(key).or_default() += 1;
            }
        }
    }

    fn with_session<R>(&self, session: &str, f: impl FnOnce(&mut Session) -> R) -> R {
        let mut sessions = lock(&self.sessions);
        let sess = self.entry(&mut sessions, session);
        f(sess)
    }

    /// The session's state, created if new (dropping the least recently used sessions
    /// beyond `max_sessions` first), and marked used now.
    fn entry<'a>(
        &self,
        sessions: &'a mut HashMap<Arc<str>, Session>,
        session: &str,
    ) -> &'a mut Session {
        let now = self
            .clock
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !sessions.contains_key(session) {
            if sessions.len() >= self.config.max_sessions {
                self.drop_least_used(sessions);
            }
            sessions.insert(session.into(), Session::default());
        }
        let sess = sessions.get_mut(session).expect("inserted above");
        sess.last_used = now;
        sess
    }

    /// Drops the least recently used tenth of the sessions (at least one), with what the
    /// surface holds for them besides; their working sets stay in the store, so a key that
    /// comes back is restored again.
    fn drop_least_used(&self, sessions: &mut HashMap<Arc<str>, Session>) {
        // A session a request is using stays (restored, then composed or searched by the
        // same request): the cap is exceeded for as long instead.
        let pinned = lock(&self.pinned);
        let mut by_use: Vec<(u64, Arc<str>)> = sessions
            .iter()
            .filter(|(k, _)| !pinned.contains_key(*k))
            .map(|(k, s)| (s.last_used, k.clone()))
            .collect();
        drop(pinned);
        by_use.sort_unstable();
        let n = (sessions.len() / 10).max(1);
        let mut pending = lock(&self.pending);
        let mut restored = lock(&self.restored);
        let mut mirror = lock(&self.mirror);
        for (_, key) in by_use.into_iter().take(n) {
            let session = sessions.remove(&key);
            let held = pending.remove(&key);
            restored.remove(&key);
            // A change the persistence task has not written yet would be lost with the
            // session: it writes this instead (and a restore reads it first).
            if mirror.unwritten.contains_key(&key) {
                let set = persisted(session.as_ref(), held.as_ref());
                mirror.parting.insert(key, set);
            }
        }
        tracing::debug!(
            dropped = n,
            kept = sessions.len(),
            "dropped the least recently used working sets from memory"
        );
    }

    /// Starts a new round for the session and evicts its idle working-set tools; returns the
    /// evicted names. [`Surface::assemble_tools`] calls this.
    pub fn next_round(&self, session: &str) -> Vec<String> {
        let idle = self.config.idle_rounds;
        let evicted = self.with_session(session, |s| s.next_round(idle));
        self.evicted(session, evicted)
    }

    /// One round: [`Surface::next_round`], then [`Surface::compose`].
    pub fn assemble_tools(
        &self,
        session: &str,
        mode: Mode,
        capabilities: &Capabilities,
    ) -> Result<ComposedSurface, SurfaceError> {
        self.next_round(session);
        self.compose(session, mode, capabilities)
    }

    /// The session's tools for `mode` now, without starting a round (for `quiver tools`).
    pub fn compose(
        &self,
        session: &str,
        mode: Mode,
        capabilities: &Capabilities,
    ) -> Result<ComposedSurface, SurfaceError> {
        self.walk(session, mode, capabilities, Walk::Advertise)
            .map(|(composed, _)| composed)
    }

    /// The round's walk (see `compose`). [`Walk::Place`] only places names (the placed
    /// ones come back beside an empty list of tools); with `until`, it stops once every one
    /// of those names has been placed or dropped, unless `max_surface` could fail the
    /// whole round: `tool_search` asks where its hits, the working set's newest, land.
    fn walk(
        &self,
        session: &str,
        mode: Mode,
        capabilities: &Capabilities,
        walk: Walk<'_>,
    ) -> Result<(ComposedSurface, Vec<String>), SurfaceError> {
        let (partial, mut until) = match walk {
            Walk::Advertise => (false, None),
            Walk::Place { until } => (true, until),
        };
        let floor = match mode {
            Mode::Agentic => None,
            _ => Some(self.floor()),
        };
        let agentic = match mode {
            Mode::Agentic => self.agentic_allowed(),
            _ => Arc::new(Vec::new()),
        };
        let mut sessions = lock(&self.sessions);
        let sess = self.entry(&mut sessions, session);
        sess.mode = mode;
        let sess = &*sess;

        let mut seen: HashSet<&str> = HashSet::new();
        let mut candidates: Vec<(&str, Reason)> = Vec::new();
        for s in &self.system {
            if seen.insert(s) {
                candidates.push((s, Reason::System));
            }
        }
        for a in agentic.iter() {
            if seen.insert(a) {
                candidates.push((a, Reason::AgenticAllow));
            }
        }
        // The walk's rank: what is configured resident (system set, allow-list, anchors),
        // then what the model paged in (newest, and within one search best, first), then the
        // floor the surface guessed from usage. A round budget that cannot hold everything
        // cuts the guesses first, never the tools the model just asked for.
        if let Some(floor) = &floor {
            for e in floor.entries.iter().filter(|e| e.anchor) {
                if seen.insert(&e.name) {
                    candidates.push((&e.name, Reason::Anchor));
                }
            }
        }
        for n in sess.by_recency() {
            if seen.insert(n) {
                candidates.push((n, Reason::WorkingSet));
            }
        }
        if let Some(floor) = &floor {
            let reason = if floor.source == FloorSource::Fallback {
                Reason::Fallback
            } else {
                Reason::Floor
            };
            for e in floor.entries.iter().filter(|e| !e.anchor) {
                if seen.insert(&e.name) {
                    candidates.push((&e.name, reason));
                }
            }
        }

        let loaded = |n: &str| sess.loaded.contains(n);
        let opts = AdvertiseOptions::default().with_loaded(&loaded);
        let budget = self.config.round;
        let mut tools: Vec<SurfaceTool> = Vec::new();
        let mut dropped: Vec<DroppedTool> = Vec::new();
        let mut used = 0usize;
        // A round lists at most `max_definitions` tools and `tool_search`; only a
        // `max_surface` below that can fail it, and then a partial walk goes to the end too.
        let stop_early = self.config.max_surface > budget.max_definitions;
        let mut count = 0usize;
        let mut placed: Vec<String> = Vec::new();
        for (name, reason) in candidates {
            if let Some(rest) = &mut until {
                if rest.is_empty() && stop_early {
                    break;
                }
                rest.remove(name);
            }
            let drop = |why| DroppedTool {
                name: name.to_owned(),
                reason,
                why,
            };
            let Some(entry) = self.catalog.lookup(name) else {
                tracing::debug!(
                    tool = name,
                    reason = reason.as_str(),
                    "stale surface name skipped"
                );
                dropped.push(drop(DropReason::Stale));
                continue;
            };
            let spec = &entry.spec;
            if !spec.listed_in(mode) {
                dropped.push(drop(DropReason::NotListed));
                continue;
            }
            if !capabilities.allows(name) {
                dropped.push(drop(DropReason::NotAllowed));
                continue;
            }
            if capabilities.denies(name) {
                dropped.push(drop(DropReason::Unoffered));
                continue;
            }
            if self.mode_excluded(mode, name) {
                dropped.push(drop(DropReason::ModeExcluded));
                continue;
            }
            if self.unoffered(name) {
                dropped.push(drop(DropReason::Unoffered));
                continue;
            }
            if reason.is_resident()
                && !sess.contains(name)
                && spec
                    .replaced_by_model_capability
                    .as_deref()
                    .is_some_and(|c| capabilities.replaces(c))
            {
                dropped.push(drop(DropReason::ReplacedByModel));
                continue;
            }
            let essential = name == TOOL_SEARCH;
            // The count first: past `max_definitions` nothing else needs measuring.
            if !essential && count >= budget.max_definitions {
                dropped.push(drop(DropReason::OverCount));
                continue;
            }
            // The round budgets the advertised form (lightweight or full, with the injected
            // `reasoning` property), measured without advertising it
            // (`advertised_extra_bytes` is what advertising adds); only a tool that fits is
            // advertised. A partial walk only places names, and measures a working-set tool
            // by its slot (measured when it was paged in: the hits were, just now).
            let bare = match reason {
                Reason::WorkingSet if partial => sess.slot_bytes(name),
                _ => None,
            }
            .unwrap_or_else(|| paged_bytes(&entry, loaded(name)));
            let bytes = bare + quiver_registry::advertised_extra_bytes(spec, loaded(name), &opts);
            if !essential && used + bytes > budget.max_bytes {
                dropped.push(drop(DropReason::OverBytes));
                continue;
            }
            used += bytes;
            count += 1;
            if partial {
                placed.push(name.to_owned());
            } else {
                let spec = quiver_registry::advertise(spec.clone(), &opts);
                debug_assert_eq!(spec.definition_bytes(), bytes, "{name}");
                tools.push(SurfaceTool {
                    spec,
                    reason,
                    bytes,
                });
            }
        }
        if count > self.config.max_surface {
            return Err(SurfaceError::TooLarge {
                session: session.to_owned(),
                count,
                max: self.config.max_surface,
            });
        }
        let composed = ComposedSurface {
            session: session.to_owned(),
            mode,
            round: sess.round,
            tools,
            dropped,
            bytes: used,
        };
        Ok((composed, placed))
    }

    /// When the agentic allow-list, expanded over the catalog now, leaves a round no room
    /// for a tool `tool_search` pages in: the list's size, the system tools' count and the
    /// round's `max_definitions`. For `quiver check` (the allow-list ranks above the working
    /// set, so such tools are found but never listed).
    pub fn agentic_crowding(&self) -> Option<(usize, usize, usize)> {
        if self.config.agentic_allow.is_empty() {
            return None;
        }
        let allowed = self.agentic_allowed();
        let live = allowed
            .iter()
            .filter(|n| !self.system.contains(n) && self.catalog.contains(n))
            .count();
        let max = self.config.round.max_definitions;
        (live > 0 && live + self.system.len() >= max).then_some((live, self.system.len(), max))
    }

    /// The agentic allow-list, patterns expanded over the catalog, in list order; kept until
    /// the catalog changes (a pattern is matched against every name, and every agentic
    /// round and `tool_search` needs the list).
    fn agentic_allowed(&self) -> Arc<Vec<String>> {
        let version = self.catalog.version();
        if let Some((v, list)) = &*lock(&self.agentic_cache)
            && *v == version
        {
            return list.clone();
        }
        let mut out: Vec<String> = Vec::new();
        let mut names: Option<Vec<String>> = None;
        for p in &self.config.agentic_allow {
            if p.contains('*') {
                let all = names.get_or_insert_with(|| self.catalog.names());
                out.extend(all.iter().filter(|n| pattern_matches(p, n)).cloned());
            } else {
                out.push(p.clone());
            }
        }
        let list = Arc::new(out);
        *lock(&self.agentic_cache) = Some((version, list.clone()));
        list
    }

    /// Whether the mode's lists keep `name` off. Never a system tool: the system set is
    /// resident in every mode, whatever pattern of `agentic_only` or `delegate_excluded`
    /// matches it.
    /// Whether `name` is never offered (see [`SurfaceConfig::unoffered`]).
    fn unoffered(&self, name: &str) -> bool {
        !self.config.unoffered.is_empty()
            && !self.system.iter().any(|s| s == name)
            && any_match(&self.config.unoffered, name)
    }

    fn mode_excluded(&self, mode: Mode, name: &str) -> bool {
        if self.system.iter().any(|s| s == name) {
            return false;
        }
        match mode {
            Mode::Agentic => false,
            Mode::Delegate => {
                any_match(&self.config.agentic_only, name)
                    || any_match(&self.config.delegate_excluded, name)
            }
            _ => any_match(&self.config.agentic_only, name),
        }
    }

    /// A call of the session begins: in `quiver serve` (and `quiver call` / `quiver
    /// search`), where the surface sees no model turns, every call counts as one round of
    /// its session. Sets the session's mode
    /// first (`tool_search` and `describe_tool` filter by it, so a plan-mode caller that
    /// searches before it lists never finds a tool its mode hides) and starts a round,
    /// evicting the working-set tools idle for more than `idle_rounds`. The called `tool` is refreshed first, so a call
    /// never evicts its own tool. Returns the evicted names; one lock either way.
    pub fn begin_call(&self, session: &str, mode: Mode, tool: &str) -> Vec<String> {
        let evicted = {
            let mut sessions = lock(&self.sessions);
            match sessions.get_mut(session) {
                Some(s) => {
                    s.mode = mode;
                    s.touch(tool);
                    let evicted = s.next_round(self.config.idle_rounds);
                    s.round_evicted.clone_from(&evicted);
                    evicted
                }
                None => {
                    if mode != Mode::default() {
                        self.entry(&mut sessions, session).mode = mode;
                    }
                    Vec::new()
                }
            }
        };
        self.evicted(session, evicted)
    }

    /// Says that idle tools left the session (if any did) and returns them.
    fn evicted(&self, session: &str, evicted: Vec<String>) -> Vec<String> {
        if !evicted.is_empty() {
            tracing::debug!(session, ?evicted, "evicted idle working-set tools");
            self.notify(session);
        }
        evicted
    }

    /// The mode of the session's latest composition or call (chat before the first).
    pub fn session_mode(&self, session: &str) -> Mode {
        lock(&self.sessions)
            .get(session)
            .map(|s| s.mode)
            .unwrap_or_default()
    }

    /// Whether the model of `mode` with `capabilities` may use `name` at all: live, listed
    /// in the mode, allowed to the caller, and not kept off by the mode's lists (an
    /// `agentic_only` tool outside agentic mode, a `delegate_excluded` one in delegate).
    /// `quiver serve` refuses a call of a tool that is not visible.
    pub fn visible(&self, name: &str, mode: Mode, capabilities: &Capabilities) -> bool {
        self.catalog.lookup(name).is_some_and(|e| {
            e.spec.listed_in(mode) && capabilities.allows(name) && !self.mode_excluded(mode, name)
        })
    }

    /// What `quiver serve` and `quiver call` do before a call of `name` runs in `session`
    /// and `mode` for the caller of `ctx`: the refusal to record instead of running it, or
    /// `None` to run it. A tool the mode does not offer is refused ([`Surface::mode_refusal`]);
    /// otherwise the call is a round of the session ([`Surface::begin_call`]), and a tool the
    /// catalog does not serve, or the caller may not use, gets the dispatcher's answer with
    /// look-alikes this caller is [offered](Surface::offered) in this mode: hidden and absent
    /// names are answered alike.
    pub fn admit(
        &self,
        dispatcher: &quiver_registry::Dispatcher,
        session: &str,
        name: &str,
        mode: Mode,
        ctx: &quiver_contract::CallContext,
    ) -> Option<quiver_contract::Envelope> {
        if let Some(refusal) = self.refused_in_mode(dispatcher, name, mode, ctx) {
            return Some(refusal);
        }
        // `tool_search` and `describe_tool` filter by the session's mode: this call's.
        self.begin_call(session, mode, name);
        self.unserved(dispatcher, name, mode, ctx)
    }

    /// [`Surface::admit`]'s refusals for a call that is no round of its session (`quiver
    /// call` with arguments that do not parse): the mode's, then the one for a tool the
    /// caller cannot call, with look-alikes of this mode (the dispatcher's own answer knows
    /// no mode, and would steer a plan-mode caller to a tool that changes things).
    pub fn refusal(
        &self,
        dispatcher: &quiver_registry::Dispatcher,
        name: &str,
        mode: Mode,
        ctx: &quiver_contract::CallContext,
    ) -> Option<quiver_contract::Envelope> {
        self.refused_in_mode(dispatcher, name, mode, ctx)
            .or_else(|| self.unserved(dispatcher, name, mode, ctx))
    }

    /// The `forbidden` answer to a call of a tool `mode` does not offer.
    fn refused_in_mode(
        &self,
        dispatcher: &quiver_registry::Dispatcher,
        name: &str,
        mode: Mode,
        ctx: &quiver_contract::CallContext,
    ) -> Option<quiver_contract::Envelope> {
        let caps = &ctx.capabilities;
        let why = self.mode_refusal(name, mode, caps, dispatcher.offers_search(caps))?;
        Some(quiver_contract::Envelope::err(
            quiver_contract::ErrKind::Forbidden,
            why,
        ))
    }

    /// The answer to a call of `name` the catalog does not serve or the caller may not
    /// use, with look-alikes this caller is offered in `mode`; `None` for a tool it may call.
    fn unserved(
        &self,
        dispatcher: &quiver_registry::Dispatcher,
        name: &str,
        mode: Mode,
        ctx: &quiver_contract::CallContext,
    ) -> Option<quiver_contract::Envelope> {
        let caps = &ctx.capabilities;
        // A tool the caller may not use gets the same answer as one nobody serves.
        if !caps.allows(name) || !self.catalog.lookup(name).is_some_and(|e| e.spec.is_live()) {
            return Some(dispatcher.undefined(name, ctx, &|n| self.offered(n, mode, caps)));
        }
        None
    }

    /// Why a call of `name` in `mode` is refused although the tool exists and the caller
    /// may use it: its mode does not list it (plan mode and a tool that can change things,
    /// an internal tool) or keeps it off. `None` when the call may go ahead (or is the
    /// dispatcher's to answer: an unknown tool, one the caller may not use). `can_search`:
    /// whether the caller has `tool_search` to turn to. `quiver serve` and `quiver call`
    /// give this refusal (as `forbidden`).
    pub fn mode_refusal(
        &self,
        name: &str,
        mode: Mode,
        capabilities: &Capabilities,
        can_search: bool,
    ) -> Option<String> {
        if self.catalog.lookup(name).is_none()
            || !capabilities.allows(name)
            || self.visible(name, mode, capabilities)
        {
            return None;
        }
        // Searching cannot bring it into this mode: say what can.
        let why = match mode {
            Mode::Plan => " Plan mode offers read-only tools only, and this one can change things: find a read-only tool that gives what the plan needs, or leave this step for when the plan is carried out.".to_owned(),
            _ => format!(
                " This mode's lists leave it out; use another tool of your tool list, or tell the user it needs another mode.{}",
                if can_search {
                    " tool_search finds the tools this mode offers."
                } else {
                    ""
                }
            ),
        };
        Some(format!(
            "`{name}` is not available in {} mode.{why}",
            mode.as_str()
        ))
    }

    /// Whether `name` is [`visible`](Self::visible) and also offered: no policy refuses it to
    /// this caller (or to everyone) whatever it sends. What a did-you-mean may name.
    pub fn offered(&self, name: &str, mode: Mode, capabilities: &Capabilities) -> bool {
        self.visible(name, mode, capabilities) && capabilities.offers(name) && !self.unoffered(name)
    }

    /// The best `limit` visible tools for `query`, system tools aside (no working-set
    /// change).
    pub fn search(
        &self,
        query: &str,
        limit: usize,
        mode: Mode,
        capabilities: &Capabilities,
    ) -> Vec<SearchHit> {
        let bit = mode_bit(mode);
        let indexed = self.index.read().unwrap_or_else(|p| p.into_inner());
        // The system tools are always resident; finding them would waste a slot.
        let filter = |n: &str| {
            indexed.listed.get(n).is_some_and(|m| m & bit != 0)
                && !self.system.iter().any(|s| s == n)
                && !self.mode_excluded(mode, n)
                && !self.unoffered(n)
        };
        // Filtered inside the index (it runs the filter on a window of the best only), so
        // that the head's reordering and scores are those of the tools the caller can see.
        // A caller with an allow-list gets a ranking its hidden tools take no part in (they
        // would lift the tools it sees, telling it that they match), which runs the filter
        // on every scored tool: one lookup in the set it finds. The mode's and the system
        // tools' filter hides the same tools from every caller of the mode.
        // Tools a policy always refuses this caller are hidden from it alone, the same way.
        if capabilities.allowed_tools.is_none() && capabilities.denied_tools.is_empty() {
            return indexed.index.search_public(query, limit, &filter);
        }
        let visible = self.visible_to(capabilities, bit, &indexed, &filter);
        indexed
            .index
            .search(query, limit, &|n: &str| visible.contains(n))
    }

    /// The indexed tools a caller with `capabilities` finds in the mode of `bit`: those that
    /// pass `filter`, its allow-list and not its deny list, kept per pattern lists and mode for
    /// the index generation.
    fn visible_to(
        &self,
        capabilities: &Capabilities,
        bit: u8,
        indexed: &Indexed,
        filter: &dyn Fn(&str) -> bool,
    ) -> Arc<VisibleSet> {
        let key = (
            capabilities.allowed_tools.clone(),
            capabilities.denied_tools.clone(),
            bit,
        );
        if let Some((generation, set)) = lock(&self.visible_cache).get(&key)
            && *generation == indexed.generation
        {
            return set.clone();
        }
        let allowed = capabilities
            .allowed_tools
            .as_deref()
            .map(|p| self.allowed_by(p));
        let denied = &capabilities.denied_tools;
        let set: Arc<VisibleSet> = Arc::new(
            indexed
                .listed
                .keys()
                .filter(|n| {
                    allowed.as_ref().is_none_or(|a| a.contains(&***n))
                        && filter(n)
                        && !any_match(denied, n)
                })
                .cloned()
                .collect(),
        );
        let mut cache = lock(&self.visible_cache);
        if cache.len() >= MAX_ALLOW_LISTS {
            cache.clear();
        }
        cache.insert(key, (indexed.generation, set.clone()));
        set
    }

    /// The catalog's tools `patterns` allow (as [`Capabilities::allows`]), kept per pattern
    /// list until the catalog changes. At most [`MAX_ALLOW_LISTS`] lists are kept (a token
    /// names its own; more distinct lists than that empty the cache).
    fn allowed_by(&self, patterns: &[String]) -> Arc<HashSet<String>> {
        let version = self.catalog.version();
        if let Some((v, set)) = lock(&self.allowed_cache).get(patterns)
            && *v == version
        {
            return set.clone();
        }
        let set: Arc<HashSet<String>> = Arc::new(
            self.catalog
                .names()
                .into_iter()
                .filter(|n| {
                    patterns
                        .iter()
                        .any(|p| quiver_contract::pattern_matches(p, n))
                })
                .collect(),
        );
        let mut cache = lock(&self.allowed_cache);
        if cache.len() >= MAX_ALLOW_LISTS {
            cache.clear();
        }
        cache.insert(patterns.to_vec(), (version, set.clone()));
        set
    }

    /// What `tool_search` does: searches in the session's mode and pages the hits into its
    /// working set at once. `limit` defaults to `search_default_limit` and is capped by the
    /// working set's `max_tools`.
    pub fn tool_search(
        &self,
        session: &str,
        query: &str,
        limit: Option<usize>,
        capabilities: &Capabilities,
    ) -> SearchOutcome {
        let mode = self.session_mode(session);
        let limit = limit
            .unwrap_or(self.config.search_default_limit)
            .min(crate::config::MAX_SEARCH_LIMIT)
            .min(self.config.working_set.max_tools.max(1))
            .max(1);
        let hits = self.search(query, limit, mode, capabilities);
        let mut out = SearchOutcome::default();
        let mut page: Vec<(String, usize)> = Vec::new();
        let loaded: HashSet<String> = lock(&self.sessions)
            .get(session)
            .map(|s| s.loaded.clone())
            .unwrap_or_default();
        for hit in hits {
            let Some(entry) = self.catalog.lookup(&hit.name) else {
                out.failed.push(FailedTool {
                    name: hit.name.clone(),
                    reason: FailReason::LoadFailed,
                });
                continue;
            };
            out.hits.push(FoundTool {
                name: hit.name.clone(),
                description: cut_description(&entry.spec.description),
                score: (hit.score * 100.0).round() / 100.0,
            });
            let bytes = paged_bytes(&entry, loaded.contains(&hit.name));
            page.push((hit.name, bytes));
        }
        // What the round lists before the hits come in, to tell which tools they push off.
        let before: Vec<String> = if page.is_empty() {
            Vec::new()
        } else {
            self.walk(session, mode, capabilities, Walk::Place { until: None })
                .map(|(_, placed)| placed)
                .unwrap_or_default()
        };
        let paged = self.page_in_sized(session, &page, false);
        out.failed
            .extend(paged.over_budget.into_iter().map(|name| FailedTool {
                name,
                reason: FailReason::OverBudget,
            }));
        // This call's round evicted idle tools before the search ran: they left the list
        // too.
        out.evicted = lock(&self.sessions)
            .get_mut(session)
            .map(|s| std::mem::take(&mut s.round_evicted))
            .unwrap_or_default();
        for name in paged.evicted {
            if !out.evicted.contains(&name) {
                out.evicted.push(name);
            }
        }
        // Only what the next round will list counts as exposed: a hit the round's budget
        // cuts stays in the working set (listed once there is room) but is reported failed.
        out.exposed = paged.exposed;
        if !out.exposed.is_empty() {
            match self.walk(session, mode, capabilities, Walk::Place { until: None }) {
                Ok((_, placed)) => {
                    let listed: HashSet<&str> = placed.iter().map(String::as_str).collect();
                    let (fit, cut): (Vec<String>, Vec<String>) = std::mem::take(&mut out.exposed)
                        .into_iter()
                        .partition(|n| listed.contains(n.as_str()));
                    out.exposed = fit;
                    out.failed.extend(cut.into_iter().map(|name| FailedTool {
                        name,
                        reason: FailReason::OverBudget,
                    }));
                    // Listed before, not now, and not reported otherwise: the round's budget
                    // made room for the hits by cutting them (still callable by name).
                    out.displaced = before
                        .into_iter()
                        .filter(|n| {
                            !listed.contains(n.as_str())
                                && !out.evicted.contains(n)
                                && !out.failed.iter().any(|f| &f.name == n)
                        })
                        .collect();
                }
                Err(e) => {
                    // The next round fails as a whole: nothing found is listed.
                    tracing::warn!(session, error = %e, "tool_search could not compose the next round");
                    out.failed
                        .extend(std::mem::take(&mut out.exposed).into_iter().map(|name| {
                            FailedTool {
                                name,
                                reason: FailReason::OverBudget,
                            }
                        }));
                }
            }
        }
        out
    }

    /// Pages tools into the session's working set (for example when restoring a session),
    /// best or newest first: the first gets the newest stamp. Unknown names are skipped.
    pub fn page_in(&self, session: &str, names: &[&str]) -> PageIn {
        let loaded: HashSet<String> = lock(&self.sessions)
            .get(session)
            .map(|s| s.loaded.clone())
            .unwrap_or_default();
        let sized: Vec<(String, usize)> = names
            .iter()
            .filter_map(|n| {
                let e = self.catalog.lookup(n)?;
                Some(((*n).to_owned(), paged_bytes(&e, loaded.contains(*n))))
            })
            .collect();
        self.page_in_sized(session, &sized, false)
    }

    fn page_in_sized(&self, session: &str, tools: &[(String, usize)], load: bool) -> PageIn {
        let caps = self.config.working_set;
        let (paged, changed) = self.with_session(session, |s| {
            let before = s.members();
            let paged = s.page_in(tools, &caps);
            let mut changed = paged.changed_membership(&before);
            if load {
                for n in &paged.exposed {
                    changed |= s.loaded.insert(n.clone());
                }
            }
            (paged, changed)
        });
        if changed {
            self.notify(session);
        }
        paged
    }

    /// What `describe_tool` does: the full spec of a visible tool, paged into the working
    /// set and marked loaded (its full spec is advertised from now on). `None` when the
    /// tool is not visible to this caller in the session's mode (including the mode's
    /// exclusion lists).
    pub fn describe(
        &self,
        session: &str,
        name: &str,
        capabilities: &Capabilities,
    ) -> Option<(ToolSpec, PageIn)> {
        let mode = self.session_mode(session);
        let entry = self.catalog.lookup(name)?;
        if !entry.spec.listed_in(mode)
            || !capabilities.offers(name)
            || self.mode_excluded(mode, name)
            || self.unoffered(name)
        {
            return None;
        }
        if self.system.iter().any(|s| s == name) {
            // Always resident: paging it in would only take a working-set slot. Its full spec
            // is advertised from now on all the same.
            // Only a progressive tool's listing changes with it (summary to full spec).
            if self.with_session(session, |s| s.loaded.insert(name.to_owned()))
                && entry.spec.progressive
            {
                self.notify(session);
            }
            let paged = PageIn {
                exposed: vec![name.to_owned()],
                ..PageIn::default()
            };
            return Some((entry.spec.clone(), paged));
        }
        let mut paged = self.page_in_sized(
            session,
            &[(name.to_owned(), entry.spec.definition_bytes())],
            true,
        );
        // Loaded only if the next round lists it, measured as `tool_search` measures its
        // hits (the advertised form): a tool whose definition fits the working set but not
        // the round stays in the set and is reported over budget, not loaded.
        if paged.exposed.iter().any(|n| n == name) {
            let hits: HashSet<&str> = HashSet::from([name]);
            let listed = self
                .walk(
                    session,
                    mode,
                    capabilities,
                    Walk::Place { until: Some(hits) },
                )
                .is_ok_and(|(_, placed)| placed.iter().any(|p| p == name));
            if !listed {
                paged.exposed.retain(|n| n != name);
                paged.over_budget.push(name.to_owned());
            }
        }
        Some((entry.spec.clone(), paged))
    }

    /// Visible names for a did-you-mean.
    pub(crate) fn visible_names(&self, mode: Mode, capabilities: &Capabilities) -> Vec<String> {
        self.catalog
            .available(mode)
            .into_iter()
            .filter(|e| {
                capabilities.offers(e.name())
                    && !self.mode_excluded(mode, e.name())
                    && !self.unoffered(e.name())
            })
            .map(|e| e.spec.name.clone())
            .collect()
    }

    /// The session's working set, most recently used first.
    pub fn working_set(&self, session: &str) -> Vec<String> {
        lock(&self.sessions)
            .get(session)
            .map(|s| s.by_recency().into_iter().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Whether the session loaded a progressive tool's full spec.
    pub fn is_loaded(&self, session: &str, name: &str) -> bool {
        lock(&self.sessions)
            .get(session)
            .is_some_and(|s| s.loaded.contains(name))
    }

    /// The keys of every session the surface holds state for.
    pub fn session_keys(&self) -> Vec<String> {
        lock(&self.sessions).keys().map(|k| k.to_string()).collect()
    }

    /// Restores the session from `store` the first time the key is seen (again after the
    /// surface dropped it from memory, see `max_sessions`). A failure is logged; the
    /// session then starts empty.
    /// Returns whether it restored now (false: it had already).
    pub async fn restore_once(
        &self,
        session: &str,
        store: &dyn crate::ports::SessionStore,
    ) -> bool {
        {
            // Lock order everywhere: sessions, pending, restored, mirror.
            let sessions = lock(&self.sessions);
            let mut restored = lock(&self.restored);
            if restored.contains(session) {
                return false;
            }
            // Keys restored with nothing stored hold no session: bound them too.
            if restored.len() >= 2 * self.config.max_sessions {
                restored.retain(|k| sessions.contains_key(k));
            }
            restored.insert(session.into());
        }
        if let Err(e) = self.restore_session(session, store).await {
            tracing::warn!(session = %session, error = %e, "could not restore the working set");
        }
        true
    }

    /// Keeps the session in memory until the guard drops: a request that restores a key
    /// and then composes or searches it holds one, so the `max_sessions` bound does not drop
    /// the session between the two (under more keys than the bound, it did).
    pub fn pin(self: &Arc<Self>, session: &Arc<str>) -> SessionPin {
        *lock(&self.pinned).entry(session.clone()).or_default() += 1;
        SessionPin {
            surface: self.clone(),
            session: session.clone(),
        }
    }

    /// Forgets a session.
    pub fn end_session(&self, session: &str) {
        lock(&self.sessions).remove(session);
        lock(&self.pending).remove(session);
        lock(&self.restored).remove(session);
    }

    /// Forgets a session whose key never comes back (an MCP session that ended), in the
    /// store too: the persistence task deletes its stored working set after any write of
    /// it already under way, so a late write cannot bring the rows back.
    pub fn forget_session(&self, session: &str) {
        self.end_session(session);
        if lock(&self.mirror).running {
            lock(&self.forgotten).insert(session.into());
            self.notify(session);
        }
    }

    /// Refreshes a used tool in the session's working set.
    pub fn touch(&self, session: &str, tool: &str) {
        if let Some(s) = lock(&self.sessions).get_mut(session) {
            s.touch(tool);
        }
    }
}

/// What persists of a session: its working set (most recent first), then the restored
/// names still waiting for their tools.
/// A working set as it persists: names, most recent first, each with its idle rounds.
pub(crate) type Persisted = Vec<(String, u64)>;

fn persisted(session: Option<&Session>, held: Option<&Vec<String>>) -> Persisted {
    let mut out: Vec<(String, u64)> = session.map(Session::by_recency_idle).unwrap_or_default();
    for name in held.into_iter().flatten() {
        if !out.iter().any(|(n, _)| n == name) {
            out.push((name.clone(), 0));
        }
    }
    out
}

/// A session kept in memory while a request uses it ([`Surface::pin`]).
#[must_use = "the session is kept only while the guard lives"]
pub struct SessionPin {
    surface: Arc<Surface>,
    session: Arc<str>,
}

impl fmt::Debug for SessionPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionPin")
            .field("session", &self.session)
            .finish()
    }
}

impl Drop for SessionPin {
    fn drop(&mut self) {
        let mut pinned = lock(&self.surface.pinned);
        if let Some(n) = pinned.get_mut(&self.session) {
            *n -= 1;
            if *n == 0 {
                pinned.remove(&self.session);
            }
        }
    }
}

impl CallObserver for Surface {
    fn call_finished(
        &self,
        session: Option<&str>,
        tool: &str,
        _envelope: &quiver_contract::Envelope,
    ) {
        self.touch(session.unwrap_or(DEFAULT_SESSION), tool);
    }
}

fn build_index(catalog: &Catalog, retriever: Option<Retriever>) -> Indexed {
    let mut index = Indexed {
        index: match retriever {
            Some((embedder, config)) => SearchIndex::with_embedder(embedder, config),
            None => SearchIndex::new(),
        },
        listed: HashMap::new(),
        generation: next_generation(),
    };
    let tools = catalog.tools();
    let specs: Vec<&ToolSpec> = tools
        .iter()
        .map(|e| &e.spec)
        .filter(|s| indexable(s))
        .collect();
    index.index.upsert_all(&specs);
    for spec in specs {
        index
            .listed
            .insert(spec.name.as_str().into(), listed_mask(spec));
    }
    index
}

/// A tool whose definition does not fit a budget it must fit to be shown
/// ([`Surface::oversized`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Oversized {
    /// The tool.
    pub name: String,
    /// Its definition's size as that budget measures it.
    pub bytes: usize,
    /// Which budget, as the configuration names it.
    pub budget: &'static str,
    /// The budget's limit in bytes.
    pub limit: usize,
}

/// Applies the catalog's events to the index; `version` is the catalog version the index
/// was built at, and each event received (or skipped by a lag) is the next one.
async fn sync_index(
    surface: Weak<Surface>,
    mut events: broadcast::Receiver<CatalogEvent>,
    mut version: u64,
) {
    use broadcast::error::RecvError;
    loop {
        let event = events.recv().await;
        let Some(surface) = surface.upgrade() else {
            return;
        };
        match event {
            Ok(event) => {
                surface.apply(event);
                version += 1;
                surface.index_caught_up(version);
            }
            Err(RecvError::Lagged(n)) => {
                // Recovered here, at once: a burst of registrations (an upstream with
                // thousands of tools) does it on a healthy start, so not a warning an
                // operator would learn to ignore (QA-14 #14).
                tracing::debug!(
                    skipped = n,
                    "search index lagged behind the catalog; resyncing"
                );
                version += n;
                surface.resync_index();
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// The JSON of a spec for `describe_tool`.
pub(crate) fn spec_json(spec: &ToolSpec) -> Value {
    let mut v = json!({
        "name": spec.name,
        "description": spec.description,
        "input_schema": spec.input_schema,
        "read_only": spec.is_read_only(),
    });
    if let Some(out) = &spec.output_schema {
        v["output_schema"] = out.clone();
    }
    v
}
