//! Sessions: each key's working set, created on first use and dropped from memory
//! (least recently used first) beyond `max_sessions`, the restored names waiting for their
//! tools, the keys a request pins, and the change notices the persistence task mirrors.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::Arc,
};

use quiver_registry::{CallObserver, layers::result_limit::READ_RESULT};

use crate::{
    DEFAULT_SESSION, PageIn, Surface, compose::paged_bytes, sync::lock, working_set::Session,
};

impl Surface {
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

    pub(crate) fn notify(&self, session: &str) {
        let mut mirror = lock(&self.mirror);
        let key: Arc<str> = session.into();
        if self.changes.send(key.clone()).is_ok() {
            mirror.sent += 1;
            if mirror.running {
                *mirror.unwritten.entry(key).or_default() += 1;
            }
        }
    }

    pub(crate) fn with_session<R>(&self, session: &str, f: impl FnOnce(&mut Session) -> R) -> R {
        let mut sessions = lock(&self.sessions);
        let sess = self.entry(&mut sessions, session);
        f(sess)
    }

    /// The session's state, created if new (dropping the least recently used sessions
    /// beyond `max_sessions` first), and marked used now.
    pub(crate) fn entry<'a>(
        &self,
        sessions: &'a mut HashMap<Arc<str>, Session>,
        session: &str,
    ) -> &'a mut Session {
        let now = self
            .clock
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !sessions.contains_key(session) {
            if sessions.len() >= self.config().max_sessions {
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

    /// Says that idle tools left the session (if any did) and returns them.
    pub(crate) fn evicted(&self, session: &str, evicted: Vec<String>) -> Vec<String> {
        if !evicted.is_empty() {
            tracing::debug!(session, ?evicted, "evicted idle working-set tools");
            self.notify(session);
        }
        evicted
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

    pub(crate) fn page_in_sized(
        &self,
        session: &str,
        tools: &[(String, usize)],
        load: bool,
    ) -> PageIn {
        let caps = self.config().working_set;
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
            if restored.len() >= 2 * self.config().max_sessions {
                restored.retain(|k| sessions.contains_key(k));
            }
            restored.insert(session.into());
        }
        if let Err(e) = self.restore_session(session, store).await {
            tracing::warn!(session = %session, error = %e, "could not restore the working set");
        }
        true
    }

    /// Takes the conversation's stored working set when another server sharing the store
    /// has written it since this surface last wrote or read it (its version differs): the
    /// set here becomes the stored one, removals included, each tool as idle as stored. A
    /// set whose version this surface knows stays as it is here (it may hold changes not
    /// written yet). For a store several servers share
    /// ([`crate::ports::SessionStore::shared`]): the calls of one stateless conversation
    /// may go to any server, and the stored set is the conversation's one truth. Returns
    /// whether it took the stored set.
    pub async fn take_stored(
        &self,
        session: &str,
        store: &dyn crate::ports::SessionStore,
    ) -> Result<bool, quiver_registry::store::StoreError> {
        let stored = store.versioned_working_set(session).await?;
        let known = lock(&self.sessions)
            .get(session)
            .and_then(|s| s.stored_version);
        if known == Some(stored.version) {
            return Ok(false);
        }
        let members = stored.entries.iter().map(|e| e.tool.clone()).collect();
        self.adopt(session, stored.entries, stored.version, members);
        Ok(true)
    }

    /// The version of the session's stored set this surface knows, with the set's tools
    /// then; `None` before it wrote or read one.
    pub(crate) fn known_stored(&self, session: &str) -> Option<(u64, Vec<String>)> {
        lock(&self.sessions)
            .get(session)
            .and_then(|s| Some((s.stored_version?, s.stored_members.clone())))
    }

    /// Another server wrote the session's set since the version this surface knows
    /// (`base`: the tools then): the set here becomes the stored one with this surface's
    /// own changes since `base` on top (the tools it added kept, those it removed left
    /// out), each tool it holds as it holds it. Returns what persists of the session now,
    /// to be written over `stored`'s version.
    pub(crate) fn merge_stored(
        &self,
        session: &str,
        base: &[String],
        stored: crate::ports::StoredWorkingSet,
    ) -> Persisted {
        let stored_names: HashSet<String> = stored.entries.iter().map(|e| e.tool.clone()).collect();
        let base: HashSet<&str> = base.iter().map(String::as_str).collect();
        // This surface's tools, but those the other server removed since `base` (held there
        // then, not now); stamped now, so newest first.
        let local: Persisted = self
            .persisted_entries(session)
            .into_iter()
            .filter(|(n, _)| !base.contains(n.as_str()) || stored_names.contains(n))
            .collect();
        let local_names: HashSet<&str> = local.iter().map(|(n, _)| n.as_str()).collect();
        let mut entries = crate::persist::stamped(&local);
        let members: Vec<String> = stored.entries.iter().map(|e| e.tool.clone()).collect();
        // The stored tools not held here: kept when the other server added them since
        // `base`, left out when this one removed them.
        entries.extend(
            stored.entries.into_iter().filter(|e| {
                !local_names.contains(e.tool.as_str()) && !base.contains(e.tool.as_str())
            }),
        );
        self.adopt(session, entries, stored.version, members);
        self.persisted_entries(session)
    }

    /// Makes `entries` the session's set (removals included, each tool as idle as given),
    /// as stored at `version` with the tools `members`.
    fn adopt(
        &self,
        session: &str,
        entries: Vec<crate::ports::WorkingSetEntry>,
        version: u64,
        members: Vec<String>,
    ) {
        let mut entries = entries;
        // Newest first: a page-in gives the first the newest stamp.
        entries.sort_by(|a, b| {
            b.last_used
                .cmp(&a.last_used)
                .then_with(|| a.tool.cmp(&b.tool))
        });
        let (ready, later): (Vec<_>, Vec<_>) = entries
            .into_iter()
            .partition(|e| self.catalog.contains(&e.tool));
        let caps = self.config().working_set;
        let (before, after) = {
            let mut sessions = lock(&self.sessions);
            let loaded = sessions
                .get(session)
                .map(|s| s.loaded.clone())
                .unwrap_or_default();
            let sized: Vec<(String, usize)> = ready
                .iter()
                .filter_map(|e| {
                    let entry = self.catalog.lookup(&e.tool)?;
                    Some((
                        e.tool.clone(),
                        paged_bytes(&entry, loaded.contains(&e.tool)),
                    ))
                })
                .collect();
            let sess = self.entry(&mut sessions, session);
            let before = sess.members();
            let keep: HashSet<&str> = sized.iter().map(|(n, _)| n.as_str()).collect();
            sess.keep_only(&keep);
            let paged = sess.page_in(&sized, &caps);
            let idle: Vec<(String, u64)> = ready
                .iter()
                .filter(|e| paged.exposed.contains(&e.tool))
                .map(|e| (e.tool.clone(), e.round))
                .collect();
            sess.restore_idle(&idle);
            sess.stored_version = Some(version);
            sess.stored_members = members;
            (before, sess.members())
        };
        // The names waiting for their tools are the stored ones now.
        lock(&self.pending).remove(session);
        self.hold_pending(session, later.into_iter().map(|e| e.tool).collect());
        self.adopt_pending();
        if before != after {
            tracing::debug!(
                session,
                version,
                "took the working set another server stored"
            );
        }
    }

    /// Notes the version of the session's stored set this surface wrote or read.
    pub(crate) fn note_stored_version(&self, session: &str, version: u64, members: Vec<String>) {
        if let Some(s) = lock(&self.sessions).get_mut(session) {
            s.stored_version = Some(version);
            s.stored_members = members;
        }
    }

    /// With a store several servers share, a round of a session holding tools is written
    /// too: the stored idle rounds are what the next server to take the conversation
    /// counts on from.
    pub(crate) fn round_moved(&self, session: &str) {
        if self.shared_store.load(std::sync::atomic::Ordering::Relaxed)
            && lock(&self.sessions)
                .get(session)
                .is_some_and(|s| !s.is_empty())
        {
            self.notify(session);
        }
    }

    /// Keeps the session in memory until the guard drops: a request that restores a key
    /// and then composes or searches it holds one, so the `max_sessions` bound cannot drop
    /// the session between the two while more keys than the bound are in use.
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

/// A working set as it persists: names, most recent first, each with its idle rounds.
pub(crate) type Persisted = Vec<(String, u64)>;

/// What persists of a session: its working set (most recent first), then the restored
/// names still waiting for their tools.
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
    /// The called tool is refreshed in the session's working set; a result shortened to
    /// its budget (a `truncated` or `paged` warning) pages `read_result` in, when the
    /// catalog has it, so the model can read the rest next turn.
    fn call_finished(
        &self,
        session: Option<&str>,
        tool: &str,
        envelope: &quiver_contract::Envelope,
    ) {
        let session = session.unwrap_or(DEFAULT_SESSION);
        self.touch(session, tool);
        if let quiver_contract::Envelope::Ok { warnings, .. } = envelope
            && warnings
                .iter()
                .any(|w| w.kind == "truncated" || w.kind == "paged")
            && tool != READ_RESULT
            && self.catalog.contains(READ_RESULT)
        {
            self.page_in(session, &[READ_RESULT]);
        }
    }
}
