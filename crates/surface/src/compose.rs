//! Composing a round: the candidates in rank order (system set, allow-list, anchors, working
//! set, floor), filtered for the caller and cut to the round's budgets; the floor the rounds
//! read; and the checks of tools or lists a round can never hold.

use std::{collections::HashSet, sync::Arc};

use quiver_contract::{Capabilities, Mode, ToolSpec, pattern_matches};
use quiver_registry::{AdvertiseOptions, Entry};
use tokio::sync::watch;

use crate::{
    ComposedSurface, DropReason, DroppedTool, Floor, FloorSource, Oversized, Reason, Surface,
    SurfaceError, SurfaceTool, TOOL_SEARCH, sync::lock, working_set::Session,
};

/// What a round's walk does with the names it places.
pub(crate) enum Walk<'a> {
    /// Advertises each placed tool (a composed surface).
    Advertise,
    /// Only places names; with `until`, stops once those are placed or dropped.
    Place { until: Option<HashSet<&'a str>> },
    /// Advertises each placed tool, for an operator: a session the surface does not hold
    /// is not created, and the session is neither marked used nor given the mode.
    View,
}

/// The bytes a tool takes in a working set: its advertised form without narration.
pub(crate) fn paged_bytes(entry: &Entry, loaded: bool) -> usize {
    entry.definition_bytes(entry.spec.progressive && !loaded)
}

impl Surface {
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
        for name in self.system_tools().iter() {
            let Some(entry) = self.catalog.lookup(name) else {
                continue;
            };
            let bytes = advertised(&entry.spec);
            if name != TOOL_SEARCH
                && listed(&entry.spec)
                && placed + bytes > self.config().round.max_bytes
            {
                out.push(Oversized {
                    name: name.clone(),
                    bytes,
                    budget: "what a round's tool budget (`surface.round.max_bytes`) has left after the system tools before it",
                    limit: self.config().round.max_bytes.saturating_sub(placed),
                });
            }
            placed += bytes;
        }
        let left = self.config().round.max_bytes.saturating_sub(placed);
        let set = self.config().working_set.max_bytes;
        for entry in self.catalog.tools() {
            let spec = &entry.spec;
            if self.system_tools().iter().any(|s| s == &spec.name) || !listed(spec) {
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

    /// The floor in use: the anchors, then the usage ranking's best tools registered now
    /// (resolved once per catalog version), or the static fallback when none is. The
    /// ranking is the stored one once [`Surface::load_floor`] ran; without a store, it is
    /// derived from the surface's own usage when older than `floor_max_age_secs`.
    pub fn floor(&self) -> Arc<Floor> {
        lock(&self.floor).read(&self.config(), &self.catalog, &*self.usage)
    }

    /// Derives the floor again from the surface's own usage now (without a store; a
    /// store-backed floor is derived with [`Surface::rederive_floor_into`]).
    pub fn rederive_floor(&self) -> Arc<Floor> {
        let before = self.floor_names();
        let floor = lock(&self.floor).rederive(&self.config(), &self.catalog, &*self.usage);
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
            .peek(&self.config(), &self.catalog)
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

    /// Starts a new round for the session and evicts its idle working-set tools; returns the
    /// evicted names. [`Surface::assemble_tools`] calls this.
    pub fn next_round(&self, session: &str) -> Vec<String> {
        let idle = self.config().idle_rounds;
        let evicted = self.with_session(session, |s| s.next_round(idle));
        if evicted.is_empty() {
            self.round_moved(session);
        }
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
    pub(crate) fn walk(
        &self,
        session: &str,
        mode: Mode,
        capabilities: &Capabilities,
        walk: Walk<'_>,
    ) -> Result<(ComposedSurface, Vec<String>), SurfaceError> {
        let view = matches!(walk, Walk::View);
        let (partial, mut until) = match walk {
            Walk::Advertise | Walk::View => (false, None),
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
        let unknown = Session::default();
        let sess: &Session = if view {
            sessions.get(session).unwrap_or(&unknown)
        } else {
            let sess = self.entry(&mut sessions, session);
            sess.mode = mode;
            sess
        };

        let settings = self.settings();
        let system = &settings.system;
        let mut seen: HashSet<&str> = HashSet::new();
        let mut candidates: Vec<(&str, Reason)> = Vec::new();
        for s in system.iter() {
            if seen.insert(s) {
                candidates.push((s, Reason::System));
            }
        }
        for a in agentic.iter() {
            if seen.insert(a) {
                candidates.push((a, Reason::AgenticAllow));
            }
        }
        // A caller that cannot search never finds a tool the floor leaves out: the tools its
        // allow-list names one by one (no pattern) are listed for it.
        if !capabilities.allows(crate::TOOL_SEARCH)
            && let Some(allowed) = &capabilities.allowed_tools
        {
            for name in allowed.iter().filter(|p| !p.contains('*')) {
                if seen.insert(name) {
                    candidates.push((name, Reason::Allowed));
                }
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
        let budget = settings.config.round;
        let mut tools: Vec<SurfaceTool> = Vec::new();
        let mut dropped: Vec<DroppedTool> = Vec::new();
        let mut used = 0usize;
        // A round lists at most `max_definitions` tools and `tool_search`; only a
        // `max_surface` below that can fail it, and then a partial walk goes to the end too.
        let stop_early = settings.config.max_surface > budget.max_definitions;
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
            if !capabilities.satisfies(&spec.requires) {
                dropped.push(drop(DropReason::MissingCapability));
                continue;
            }
            if capabilities.denies(name) {
                dropped.push(drop(DropReason::Unoffered));
                continue;
            }
            if settings.mode_excluded(mode, name) {
                dropped.push(drop(DropReason::ModeExcluded));
                continue;
            }
            if settings.unoffered(name) {
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
        if count > self.config().max_surface {
            return Err(SurfaceError::TooLarge {
                session: session.to_owned(),
                count,
                max: self.config().max_surface,
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
        if self.config().agentic_allow.is_empty() {
            return None;
        }
        let allowed = self.agentic_allowed();
        let live = allowed
            .iter()
            .filter(|n| !self.system_tools().contains(n) && self.catalog.contains(n))
            .count();
        let max = self.config().round.max_definitions;
        (live > 0 && live + self.system_tools().len() >= max).then_some((
            live,
            self.system_tools().len(),
            max,
        ))
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
        for p in &self.config().agentic_allow {
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
}
