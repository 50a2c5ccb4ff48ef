//! Working sets that survive a restart: every change to a session's working set is mirrored
//! into a [`SessionStore`], and a session's stored set can be paged back in.

use std::{sync::Arc, time::SystemTime};

use quiver_registry::store::StoreError;
use tokio::sync::{broadcast::error::RecvError, watch};

use crate::{
    Surface,
    floor::Ranking,
    ports::{SessionStore, TIER0_KEY, UsageSource, WorkingSetEntry},
    sessions::Persisted,
    sync::lock,
};

/// Deletes an ended session's stored working set.
async fn forget(store: &dyn SessionStore, session: &str) {
    match store.end_session(session).await {
        Ok(()) => {}
        // A session that ends as the server stops ends after the store has closed; the
        // shutdown forgot the stored sets of the sessions still open before it closed.
        Err(StoreError::Unavailable { cause, .. }) if cause == "the store is closed" => {
            tracing::debug!(session = %session, "an ended session's working set, after the store closed");
        }
        Err(e) => {
            tracing::warn!(session = %session, error = %e, "could not forget the ended session's stored working set");
        }
    }
}

impl Surface {
    /// Spawns the task that mirrors working-set changes into `store`. The returned counter
    /// goes up after each session is written (tests can wait on it; shutdown waits on
    /// [`Surface::mirror_settled`]). Needs a tokio runtime; spawn one per surface.
    pub fn spawn_persistence(
        self: &Arc<Self>,
        store: Arc<dyn SessionStore>,
    ) -> watch::Receiver<u64> {
        self.shared_store
            .store(store.shared(), std::sync::atomic::Ordering::Relaxed);
        let mut changes = {
            let mut mirror = lock(&self.mirror);
            mirror.running = true;
            self.mirrored.send_replace(mirror.sent);
            self.subscribe_changes()
        };
        let weak = Arc::downgrade(self);
        let (done_tx, done_rx) = watch::channel(0u64);
        tokio::spawn(async move {
            loop {
                let (session, handled) = match changes.recv().await {
                    Ok(s) => (Some(s), 1),
                    Err(RecvError::Lagged(n)) => (None, n),
                    Err(RecvError::Closed) => break,
                };
                let Some(surface) = weak.upgrade() else { break };
                let mirrored = surface.mirrored.clone();
                match session {
                    None => {
                        tracing::warn!(
                            missed = handled,
                            "working-set persistence fell behind; some changes are written with the next change of their session"
                        );
                        // Ended sessions are deleted all the same, and sessions dropped
                        // from memory are written; the per-session counts start over.
                        let ended: Vec<Arc<str>> = lock(&surface.forgotten).drain().collect();
                        let parting: Vec<(Arc<str>, Persisted)> = {
                            let mut mirror = lock(&surface.mirror);
                            mirror.unwritten.clear();
                            mirror.parting.drain().collect()
                        };
                        drop(surface);
                        for session in ended {
                            forget(&*store, &session).await;
                        }
                        for (session, set) in parting {
                            if let Err(e) = sync(&*store, &session, set).await {
                                tracing::error!(session = %session, error = %e, "could not persist the working set");
                            }
                        }
                    }
                    Some(session) => {
                        if lock(&surface.forgotten).remove(&session) {
                            drop(surface);
                            forget(&*store, &session).await;
                            done_tx.send_modify(|n| *n += 1);
                        } else {
                            // The set to write: the one the session left when it was dropped
                            // from memory, or the one it holds. A drop while this is being
                            // written leaves a newer one (this change still counts as
                            // unwritten until then): written next, before going on.
                            let mut surface = Some(surface);
                            let mut wrote = false;
                            while let Some(s) = surface.take() {
                                let parting = lock(&s.mirror).parting.remove(&session);
                                let Some(set) = parting.or_else(|| {
                                    s.holds(&session).then(|| s.persisted_entries(&session))
                                }) else {
                                    break;
                                };
                                // With a store other servers share, written over the
                                // version this surface knows, merged with theirs if they
                                // wrote since.
                                let known = s
                                    .shared_store
                                    .load(std::sync::atomic::Ordering::Relaxed)
                                    .then(|| s.known_stored(&session))
                                    .flatten();
                                drop(s);
                                let written = match known {
                                    Some((version, base)) => {
                                        sync_merging(&weak, &*store, &session, set, version, base)
                                            .await
                                    }
                                    None => {
                                        let members = names(&set);
                                        sync(&*store, &session, set).await.map(|v| (v, members))
                                    }
                                };
                                match written {
                                    Ok((version, members)) => {
                                        if let Some(s) = weak.upgrade() {
                                            s.note_stored_version(&session, version, members);
                                        }
                                    }
                                    Err(e) => {
                                        tracing::error!(session = %session, error = %e, "could not persist the working set");
                                    }
                                }
                                wrote = true;
                                surface = weak
                                    .upgrade()
                                    .filter(|s| lock(&s.mirror).parting.contains_key(&session));
                            }
                            if wrote {
                                done_tx.send_modify(|n| *n += 1);
                            }
                            // Else a session dropped from memory with every change written
                            // (or ended) keeps what the store has.
                        }
                        // Written: a drop from now on finds nothing unwritten of this change.
                        if let Some(surface) = weak.upgrade() {
                            let mut mirror = lock(&surface.mirror);
                            if let Some(n) = mirror.unwritten.get_mut(&session) {
                                *n -= 1;
                                if *n == 0 {
                                    mirror.unwritten.remove(&session);
                                }
                            }
                        }
                    }
                }
                mirrored.send_modify(|n| *n += handled);
            }
        });
        done_rx
    }

    /// Waits until the persistence task has handled every working-set change made so far:
    /// its writes and the deletes of ended sessions are in the store (shutdown waits on it
    /// before closing the store). Returns at once without a persistence task.
    pub async fn mirror_settled(&self) {
        let target = {
            let mirror = lock(&self.mirror);
            if !mirror.running {
                return;
            }
            mirror.sent
        };
        let mut handled = self.mirrored.subscribe();
        let _ = handled.wait_for(|n| *n >= target).await;
    }

    /// Writes the session's working set to `store` now (for a short-lived process that exits
    /// before the background mirror would run).
    pub async fn persist_session(
        &self,
        session: &str,
        store: &dyn SessionStore,
    ) -> Result<(), StoreError> {
        let set = self.persisted_entries(session);
        let members = names(&set);
        let version = sync(store, session, set).await?;
        self.note_stored_version(session, version, members);
        Ok(())
    }

    /// Pages the session's stored working set back in, recency kept. Returns the names
    /// restored (those the working set took), oldest first. A name not in the catalog yet (its upstream may still be
    /// connecting) is held and paged in when its tool registers; until then it stays in
    /// the persisted set, so the store keeps it.
    pub async fn restore_session(
        &self,
        session: &str,
        store: &dyn SessionStore,
    ) -> Result<Vec<String>, StoreError> {
        // A session dropped from memory before its last changes were written comes back
        // as it was, not as the store has it.
        let parting = lock(&self.mirror).parting.remove(session);
        let (mut stored, version) = match parting {
            Some(set) => (stamped(&set), None),
            None => {
                let stored = store.versioned_working_set(session).await?;
                (stored.entries, Some(stored.version))
            }
        };
        stored.sort_by(|a, b| {
            a.last_used
                .cmp(&b.last_used)
                .then_with(|| a.tool.cmp(&b.tool))
        });
        let (names, later): (Vec<&str>, Vec<&str>) = stored
            .iter()
            .map(|e| e.tool.as_str())
            .partition(|n| self.catalog().contains(n));
        self.hold_pending(session, later.into_iter().map(str::to_owned).collect());
        let mut restored: Vec<String> = Vec::new();
        if !names.is_empty() {
            // A page-in takes the newest first.
            let newest_first: Vec<&str> = names.iter().rev().copied().collect();
            let paged = self.page_in(session, &newest_first);
            // Oldest first, those the working set took (a smaller cap than before refuses
            // the oldest).
            restored = names
                .iter()
                .filter(|n| paged.exposed.iter().any(|e| e == *n))
                .map(|n| (*n).to_owned())
                .collect();
        }
        // Each restored tool as idle as it was stored.
        let idle: Vec<(String, u64)> = stored
            .iter()
            .filter(|e| restored.contains(&e.tool))
            .map(|e| (e.tool.clone(), e.round))
            .collect();
        self.restore_idle(session, &idle);
        if let Some(version) = version {
            let members: Vec<String> = stored.iter().map(|e| e.tool.clone()).collect();
            self.with_session(session, |s| {
                s.stored_version = Some(version);
                s.stored_members = members;
            });
        }
        // A tool that registered between the split and the hold.
        self.adopt_pending();
        Ok(restored)
    }
}

/// The tools of a persisted set.
fn names(set: &[(String, u64)]) -> Vec<String> {
    set.iter().map(|(n, _)| n.clone()).collect()
}

/// How many times a write over a version another server moved on is merged and tried
/// again before the set is written as it is (last writer wins).
const MERGE_TRIES: usize = 3;

/// Writes `set` over `version` (the stored set this surface knows, whose tools were
/// `base`). When another server wrote the set since, the surface takes its set with this
/// surface's own changes since `base` on top ([`Surface::merge_stored`]) and writes that
/// over the newer version. Returns the version written and the tools stored.
async fn sync_merging(
    surface: &std::sync::Weak<Surface>,
    store: &dyn SessionStore,
    session: &str,
    set: Vec<(String, u64)>,
    version: u64,
    base: Vec<String>,
) -> Result<(u64, Vec<String>), StoreError> {
    let (mut set, mut version, mut base) = (set, version, base);
    for _ in 0..MERGE_TRIES {
        let members = names(&set);
        if let Some(written) = store
            .replace_working_set_if(session, stamped(&set), version)
            .await?
        {
            return Ok((written, members));
        }
        let stored = store.versioned_working_set(session).await?;
        let newer = stored.version;
        let stored_members: Vec<String> = stored.entries.iter().map(|e| e.tool.clone()).collect();
        // A session this surface no longer holds has nothing to merge into: the other
        // server's set stands.
        let Some(s) = surface.upgrade().filter(|s| s.holds(session)) else {
            return Ok((newer, stored_members));
        };
        set = s.merge_stored(session, &base, stored);
        (version, base) = (newer, stored_members);
        tracing::debug!(
            session,
            version,
            "merged the working set another server wrote meanwhile"
        );
    }
    let members = names(&set);
    Ok((sync(store, session, set).await?, members))
}

/// Writes `current` as the session's whole stored set; returns the stored version.
async fn sync(
    store: &dyn SessionStore,
    session: &str,
    current: Vec<(String, u64)>,
) -> Result<u64, StoreError> {
    store.replace_working_set(session, stamped(&current)).await
}

/// What [`Surface::load_floor`] or [`Surface::rederive_floor_into`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FloorLoad {
    /// The stored ranking was valid and young enough: read, and held.
    Read,
    /// The ranking was derived from usage now and stored.
    Derived,
    /// The ranking was derived from usage now and is held, but not stored: the reason
    /// (the write failed), or none when the caller asked not to write.
    DerivedNotStored(Option<String>),
    /// Neither: the store or the usage could not be read (the reason). The ranking held
    /// before stays; without one the floor is the static fallback.
    Unavailable(String),
}

/// How soon an empty stored ranking (no usage yet: a new install) is derived again, in
/// reads of the floor keeper.
const EMPTY_RANKING_READS: u32 = 10;

impl Surface {
    /// Reads the resident floor's usage ranking from `store` (key
    /// [`crate::ports::TIER0_KEY`]). When nothing valid is stored, or what is stored is
    /// older than `floor_max_age_secs` (an empty ranking, a new install's: ten times
    /// `floor_cache_ttl_secs`), derives it from `usage`, and stores it when `write`. From
    /// the first call on, the floor is store-backed: it never derives from the in-memory
    /// usage the surface was built with, and without a valid ranking it is the static
    /// fallback. [`Surface::spawn_floor_keeper`] calls this every `floor_cache_ttl_secs`.
    pub async fn load_floor(
        &self,
        store: &dyn SessionStore,
        usage: &dyn UsageSource,
        write: bool,
    ) -> FloorLoad {
        let before = self.floor_names();
        let load = self.load_floor_now(store, usage, write).await;
        self.floor_settled(&before);
        load
    }

    async fn load_floor_now(
        &self,
        store: &dyn SessionStore,
        usage: &dyn UsageSource,
        write: bool,
    ) -> FloorLoad {
        let max_age = std::time::Duration::from_secs(self.config().floor_max_age_secs);
        let ttl = std::time::Duration::from_secs(self.config().floor_cache_ttl_secs.max(1));
        match store.state(TIER0_KEY).await {
            Ok(Some(stored)) => match Ranking::from_stored(&stored.value) {
                Ok(ranking) => {
                    let mut floor = lock(&self.floor);
                    // The one held already: it has aged on this process's clock.
                    let held = floor.ranking().filter(|held| **held == ranking);
                    let age = held.as_ref().map_or_else(|| ranking.age(), |h| h.age());
                    let max_age = if ranking.is_empty() {
                        max_age.min(EMPTY_RANKING_READS * ttl)
                    } else {
                        max_age
                    };
                    if age < max_age {
                        match held {
                            Some(_) => floor.keep_stored(),
                            None => floor.set_stored(Some(Arc::new(ranking))),
                        }
                        return FloorLoad::Read;
                    }
                    drop(floor);
                    tracing::debug!("the stored floor is due for a new derivation");
                }
                Err(why) => {
                    tracing::warn!(
                        "the stored floor ({TIER0_KEY}) is not valid ({why}); deriving it again"
                    );
                }
            },
            Ok(None) => {}
            // A stored value that does not parse: derived again and overwritten.
            Err(StoreError::InvalidData { what }) => {
                tracing::warn!("the stored floor ({TIER0_KEY}): {what}; deriving it again");
            }
            Err(e) => {
                let why = format!("cannot read the stored floor: {e}");
                tracing::warn!("{why}; keeping the floor held");
                lock(&self.floor).keep_stored();
                return FloorLoad::Unavailable(why);
            }
        }
        // Of several servers sharing a store, one derives and stores the ranking when it is
        // due; the others keep what they read (a derivation scans the execution log).
        if write {
            match store.lead(crate::ports::FLOOR_ROLE).await {
                Ok(true) => {}
                Ok(false) => {
                    lock(&self.floor).keep_stored();
                    return FloorLoad::Unavailable(
                        "another server sharing the store derives the floor".into(),
                    );
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot ask the store which server derives the floor");
                }
            }
        }
        self.derive_floor(store, usage, write).await
    }

    /// Derives the floor's usage ranking from `usage` now, stores it and holds it (the
    /// floor's re-derivation on command, e.g. `quiver floor --rederive`).
    pub async fn rederive_floor_into(
        &self,
        store: &dyn SessionStore,
        usage: &dyn UsageSource,
    ) -> FloorLoad {
        let before = self.floor_names();
        let load = self.derive_floor(store, usage, true).await;
        self.floor_settled(&before);
        load
    }

    /// The ranking held now, best first: every used tool, registered or not (`quiver
    /// floor` shows which ones the floor leaves out).
    pub fn floor_ranking(&self) -> Vec<(String, f64)> {
        lock(&self.floor)
            .ranking()
            .map(|r| r.ranked().to_vec())
            .unwrap_or_default()
    }

    async fn derive_floor(
        &self,
        store: &dyn SessionStore,
        usage: &dyn UsageSource,
        write: bool,
    ) -> FloorLoad {
        let rows = match usage.usage(SystemTime::now()).await {
            Ok(rows) => rows,
            Err(e) => {
                let why = format!("cannot read tool usage: {e}");
                tracing::warn!("{why}; keeping the floor held");
                lock(&self.floor).keep_stored();
                return FloorLoad::Unavailable(why);
            }
        };
        let ranking = Arc::new(Ranking::derive(
            rows.into_iter()
                .map(|u| (u.tool, [u.last_30_days, u.last_90_days, u.older])),
        ));
        // Valid whether or not it is stored: this process uses it.
        lock(&self.floor).set_stored(Some(ranking.clone()));
        if !write {
            return FloorLoad::DerivedNotStored(None);
        }
        match store.put_state(TIER0_KEY, ranking.to_stored()).await {
            Ok(()) => FloorLoad::Derived,
            Err(e) => {
                tracing::warn!(error = %e, "could not store the derived floor");
                FloorLoad::DerivedNotStored(Some(e.to_string()))
            }
        }
    }

    /// Spawns the task that keeps a store-backed floor current: every
    /// `floor_cache_ttl_secs` it re-reads the stored ranking (another replica, or `quiver
    /// floor --rederive`, may have written a newer one) and derives and stores it again
    /// once it is due (see [`Surface::load_floor`]). Stops when the surface is dropped.
    /// Needs a tokio runtime.
    pub fn spawn_floor_keeper(
        self: &Arc<Self>,
        store: Arc<dyn SessionStore>,
        usage: Arc<dyn UsageSource>,
    ) -> tokio::task::JoinHandle<()> {
        let every = std::time::Duration::from_secs(self.config().floor_cache_ttl_secs.max(1));
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(surface) = weak.upgrade() else { break };
                surface.load_floor(&*store, &*usage, true).await;
            }
        })
    }
}

/// Entries for `set` (most recent first), stamped so that its order survives a restore.
/// The entries to store for a set (most recent first): its order as `last_used` times one
/// microsecond apart, and each tool's idle rounds as `round`.
pub(crate) fn stamped(set: &[(String, u64)]) -> Vec<WorkingSetEntry> {
    let now = SystemTime::now();
    set.iter()
        .enumerate()
        .map(|(i, (tool, idle))| {
            WorkingSetEntry::new(
                tool.clone(),
                now - std::time::Duration::from_micros(i as u64),
                *idle,
            )
        })
        .collect()
}
