//! The search index behind `tool_search`: kept in step with the catalog's events, and
//! searched with each caller's view of it (its mode, allow-list and deny list).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Weak},
};

use quiver_contract::{Capabilities, Mode, ToolSpec};
use quiver_registry::{Catalog, CatalogEvent};
use tokio::sync::{broadcast, watch};

use crate::{
    Surface,
    admit::any_match,
    search::{Embedder, HybridConfig, SearchHit, SearchIndex, embed_query},
    sync::lock,
};

/// The most allow-lists whose allowed tools [`Surface`] keeps at once.
const MAX_ALLOW_LISTS: usize = 256;

fn indexable(spec: &ToolSpec) -> bool {
    spec.is_live() && !spec.category.is_internal()
}

/// An embedder and how its ranking is blended in (see [`Surface::set_vector_retriever`]).
pub(crate) type Retriever = (Arc<dyn Embedder>, HybridConfig);

/// The search index and, per indexed tool, the modes it is listed in: the search filter
/// runs for every scored tool, so it reads this map rather than the catalog.
#[derive(Debug, Default)]
pub(crate) struct Indexed {
    pub(crate) index: SearchIndex,
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
pub(crate) type Visible = (u64, Arc<VisibleSet>);
/// A caller's `allowed_tools` and `denied_tools` patterns and a mode bit.
pub(crate) type VisibleKey = (
    Option<Vec<String>>,
    Vec<String>,
    std::collections::BTreeSet<String>,
    u8,
);

/// The catalog's tools an allow-list allows, for one catalog version.
pub(crate) type Allowed = (u64, Arc<HashSet<String>>);

/// A set of tool names, with a fast hash (it is probed once per scored tool).
pub(crate) type VisibleSet = HashSet<Box<str>, foldhash::fast::RandomState>;

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

impl Surface {
    /// The catalog version ([`Catalog::version`]) the search index has caught up with:
    /// every catalog change up to it is searchable. To wait on, for example until the index
    /// has a change the catalog reported.
    pub fn index_updates(&self) -> watch::Receiver<u64> {
        self.index_updates.subscribe()
    }

    /// Waits, at most `limit`, until the search index has every catalog change made before
    /// this call: a search right after an upstream's tools register ranks all of them, not
    /// the part indexed so far (whose hits it would page in). Returns at once when the
    /// index is current, or when no task keeps it in step (see [`Surface::new`]).
    pub async fn index_current(&self, limit: std::time::Duration) {
        if !self.index_synced.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let version = self.catalog.version();
        let mut updates = self.index_updates.subscribe();
        if *updates.borrow() >= version {
            return;
        }
        let _ = tokio::time::timeout(limit, updates.wait_for(|at| *at >= version)).await;
    }

    /// The number of indexed tools.
    pub fn index_len(&self) -> usize {
        self.index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .index
            .len()
    }

    /// Fuses a vector retriever into `tool_search` (the embedding port: see [`Embedder`] and
    /// [`HybridConfig`]), or with `None` goes back to the lexical ranking alone (the
    /// default). Rebuilds the index; the tools get their vectors from the task of
    /// [`Surface::spawn_vector_worker`] (or [`Surface::embed_pending_now`]), and rank
    /// lexically until then.
    pub fn set_vector_retriever(&self, retriever: Option<(Arc<dyn Embedder>, HybridConfig)>) {
        let changed_model = {
            let old = lock(&self.retriever);
            match (&*old, &retriever) {
                (Some((a, _)), Some((b, _))) => a.model_id() != b.model_id(),
                _ => true,
            }
        };
        *lock(&self.retriever) = retriever;
        if changed_model {
            // Vectors of another model are not kept.
            let fresh = build_index(&self.catalog, lock(&self.retriever).clone());
            let version = self.catalog.version();
            *self.index.write().unwrap_or_else(|p| p.into_inner()) = fresh;
            self.index_caught_up(version);
            self.wake_vectors();
        } else {
            self.resync_index();
        }
    }

    /// Embeds every indexed tool still waiting for its vector, on this thread (for tests and
    /// small catalogs; a server runs [`Surface::spawn_vector_worker`]).
    pub fn embed_pending_now(&self) {
        self.index
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .index
            .embed_pending();
    }

    /// Rebuilds the search index from the catalog; tools whose text is unchanged keep their
    /// vectors.
    pub fn resync_index(&self) {
        // Read first: the build then sees every change up to it.
        let version = self.catalog.version();
        let retriever = lock(&self.retriever).clone();
        let mut fresh = build_index(&self.catalog, retriever);
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        fresh.index.adopt_vectors(&index.index);
        *index = fresh;
        drop(index);
        self.index_caught_up(version);
        self.wake_vectors();
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
        self.wake_vectors();
        self.adopt_pending();
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
        // The query's vectors, computed before the index is locked (a forward pass of the
        // model; the index's writers need not wait for it). None while no tool has a vector.
        let retriever = lock(&self.retriever).clone();
        let vectors = retriever.and_then(|(embedder, config)| {
            let has = self
                .index
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .index
                .has_vectors();
            has.then(|| embed_query(&*embedder, &config, query))
                .flatten()
        });
        let indexed = self.index.read().unwrap_or_else(|p| p.into_inner());
        // The system tools are always resident; finding them would waste a slot.
        let settings = self.settings();
        let filter = |n: &str| {
            indexed.listed.get(n).is_some_and(|m| m & bit != 0)
                && !settings.system.iter().any(|s| s == n)
                && !settings.mode_excluded(mode, n)
                && !settings.unoffered(n)
                // A tool that needs a model capability this caller's model lacks.
                && self
                    .catalog
                    .lookup(n)
                    .is_none_or(|e| capabilities.satisfies(&e.spec.requires))
        };
        // Filtered inside the index (it runs the filter on a window of the best only), so
        // that the head's reordering and scores are those of the tools the caller can see.
        // A caller with an allow-list gets a ranking its hidden tools take no part in (they
        // would lift the tools it sees, telling it that they match), which runs the filter
        // on every scored tool: one lookup in the set it finds. The mode's and the system
        // tools' filter hides the same tools from every caller of the mode.
        // Tools a policy always refuses this caller are hidden from it alone, the same way.
        if capabilities.allowed_tools.is_none() && capabilities.denied_tools.is_empty() {
            return indexed
                .index
                .search_embedded(query, vectors.as_ref(), limit, &filter, false);
        }
        let visible = self.visible_to(capabilities, bit, &indexed, &filter);
        indexed.index.search_embedded(
            query,
            vectors.as_ref(),
            limit,
            &|n: &str| visible.contains(n),
            true,
        )
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
            capabilities.model.clone(),
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
}

pub(crate) fn build_index(catalog: &Catalog, retriever: Option<Retriever>) -> Indexed {
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

/// Applies the catalog's events to the index; `version` is the catalog version the index
/// was built at, and each event received (or skipped by a lag) is the next one.
pub(crate) async fn sync_index(
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
                // operator would learn to ignore.
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
