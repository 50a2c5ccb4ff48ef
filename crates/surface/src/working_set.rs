//! A session's working set: the tools the model paged in with `tool_search` or
//! `describe_tool`. They stay while used; idle ones go after `idle_rounds`; the set is capped
//! by count and by definition bytes, the least recently used going first.

use std::collections::{HashMap, HashSet};

use quiver_contract::Mode;

use crate::WorkingSetConfig;

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The round the tool was last paged in or called.
    last_round: u64,
    /// A strictly increasing stamp: recency within a round.
    stamp: u64,
    /// Its definition bytes when paged in.
    bytes: usize,
}

/// What a page-in did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PageIn {
    /// Tools now in the set (new or refreshed).
    pub exposed: Vec<String>,
    /// Tools that could not fit.
    pub over_budget: Vec<String>,
    /// Tools evicted to make room.
    pub evicted: Vec<String>,
}

impl PageIn {
    /// Whether the set's membership changed.
    pub(crate) fn changed_membership(&self, before: &HashSet<String>) -> bool {
        !self.evicted.is_empty() || self.exposed.iter().any(|n| !before.contains(n))
    }
}

/// One session's state.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// The mode of its latest composition.
    pub(crate) mode: Mode,
    /// Rounds so far (one per composition).
    pub(crate) round: u64,
    slots: HashMap<String, Slot>,
    bytes: usize,
    stamp: u64,
    /// Progressive tools the session loaded with `describe_tool`.
    pub(crate) loaded: HashSet<String>,
    /// When the surface last used it (its own clock), for dropping the least recently
    /// used sessions beyond `max_sessions`.
    pub(crate) last_used: u64,
    /// The tools the current call's round evicted as idle, for a `tool_search` in that
    /// call to report with its own evictions.
    pub(crate) round_evicted: Vec<String>,
    /// Who listed its tools last (see `Surface::note_client`).
    pub(crate) client: Option<std::sync::Arc<crate::SessionClient>>,
    /// The version of the stored set this surface last wrote or read (see
    /// `Surface::take_stored`); none before either.
    pub(crate) stored_version: Option<u64>,
    /// The tools of the stored set at `stored_version`: what this surface's changes since
    /// are told from, when another server wrote the set meanwhile.
    pub(crate) stored_members: Vec<String>,
}

impl Session {
    fn next_stamp(&mut self) -> u64 {
        self.stamp += 1;
        self.stamp
    }

    /// Whether `name` is in the set.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.slots.contains_key(name)
    }

    /// The definition bytes the set holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The definition bytes `name` was paged in with.
    pub(crate) fn slot_bytes(&self, name: &str) -> Option<usize> {
        self.slots.get(name).map(|s| s.bytes)
    }

    /// The names, most recent first.
    pub(crate) fn by_recency(&self) -> Vec<&str> {
        let mut v: Vec<(&str, u64)> = self
            .slots
            .iter()
            .map(|(n, s)| (n.as_str(), s.stamp))
            .collect();
        v.sort_by_key(|&(_, stamp)| std::cmp::Reverse(stamp));
        v.into_iter().map(|(n, _)| n).collect()
    }

    /// The member names, most recent first, with the rounds each has been idle (rounds of
    /// the session since it was last paged in or called): what persists.
    pub(crate) fn by_recency_idle(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(&str, u64, u64)> = self
            .slots
            .iter()
            .map(|(n, s)| (n.as_str(), s.stamp, self.round.saturating_sub(s.last_round)))
            .collect();
        v.sort_by_key(|&(_, stamp, _)| std::cmp::Reverse(stamp));
        v.into_iter()
            .map(|(n, _, idle)| (n.to_owned(), idle))
            .collect()
    }

    /// Gives restored tools back the rounds they had been idle when they were stored (a
    /// tool idle long before a restart leaves as soon as it would have without one). The
    /// session's round moves on as far as the longest idle needs; the other tools keep
    /// theirs.
    pub(crate) fn restore_idle(&mut self, idle: &[(String, u64)]) {
        let most = idle
            .iter()
            .filter(|(n, _)| self.slots.contains_key(n))
            .map(|(_, i)| *i)
            .max()
            .unwrap_or(0);
        if most > self.round {
            let shift = most - self.round;
            self.round = most;
            for slot in self.slots.values_mut() {
                slot.last_round += shift;
            }
        }
        for (name, rounds) in idle {
            if let Some(slot) = self.slots.get_mut(name) {
                slot.last_round = self.round - rounds;
            }
        }
    }

    /// Evicts the members not in `keep`.
    pub(crate) fn keep_only(&mut self, keep: &HashSet<&str>) {
        let gone: Vec<String> = self
            .slots
            .keys()
            .filter(|n| !keep.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            self.evict(&n);
        }
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The member names.
    pub(crate) fn members(&self) -> HashSet<String> {
        self.slots.keys().cloned().collect()
    }

    /// Starts a new round and evicts the tools idle for more than `idle_rounds`.
    pub(crate) fn next_round(&mut self, idle_rounds: u64) -> Vec<String> {
        self.round += 1;
        let round = self.round;
        let mut idle: Vec<(String, u64)> = self
            .slots
            .iter()
            .filter(|(_, s)| round.saturating_sub(s.last_round) > idle_rounds)
            .map(|(n, s)| (n.clone(), s.stamp))
            .collect();
        idle.sort_by_key(|(_, stamp)| *stamp);
        for (n, _) in &idle {
            self.evict(n);
        }
        idle.into_iter().map(|(n, _)| n).collect()
    }

    fn evict(&mut self, name: &str) {
        if let Some(s) = self.slots.remove(name) {
            self.bytes -= s.bytes;
        }
    }

    /// Refreshes a tool that was used; false when it is not in the set.
    pub(crate) fn touch(&mut self, name: &str) -> bool {
        let stamp = self.next_stamp();
        self.touch_at(name, stamp)
    }

    fn touch_at(&mut self, name: &str, stamp: u64) -> bool {
        let round = self.round;
        match self.slots.get_mut(name) {
            Some(s) => {
                s.last_round = round;
                s.stamp = stamp;
                true
            }
            None => false,
        }
    }

    /// Pages tools in (name, definition bytes), best first; makes room by evicting the least
    /// recently used tools that are not part of this page-in. The batch's first tool gets
    /// the newest stamp, so where recency decides (the round budget, a later eviction) the
    /// better hit wins.
    pub(crate) fn page_in(&mut self, tools: &[(String, usize)], caps: &WorkingSetConfig) -> PageIn {
        let mut out = PageIn::default();
        let batch: HashSet<&str> = tools.iter().map(|(n, _)| n.as_str()).collect();
        let base = self.stamp;
        self.stamp += tools.len() as u64;
        for (i, (name, bytes)) in tools.iter().enumerate() {
            let stamp = base + (tools.len() - i) as u64;
            // A member that grew past the cap leaves the set: if it cannot come back in, it
            // was evicted (the set changed: the client re-lists, the store forgets it).
            let mut regrown = false;
            if let Some(old) = self.slots.get(name.as_str()).map(|s| s.bytes) {
                if *bytes <= old || self.bytes - old + bytes <= caps.max_bytes {
                    // Its size now (a progressive tool loaded since is larger than its
                    // lightweight spec was).
                    self.touch_at(name, stamp);
                    self.bytes = self.bytes - old + bytes;
                    if let Some(slot) = self.slots.get_mut(name.as_str()) {
                        slot.bytes = *bytes;
                    }
                    out.exposed.push(name.clone());
                    continue;
                }
                // Grown past the cap: it makes room, or is refused, like a newcomer.
                self.evict(name);
                regrown = true;
            }
            if *bytes > caps.max_bytes || caps.max_tools == 0 {
                out.over_budget.push(name.clone());
                if regrown {
                    out.evicted.push(name.clone());
                }
                continue;
            }
            // Evict the oldest outsiders until the newcomer fits.
            let mut victims: Vec<(&String, u64)> = self
                .slots
                .iter()
                .filter(|(n, _)| !batch.contains(n.as_str()))
                .map(|(n, s)| (n, s.stamp))
                .collect();
            victims.sort_by_key(|(_, stamp)| *stamp);
            let mut count = self.slots.len();
            let mut used = self.bytes;
            let mut take = 0;
            for (_, _) in &victims {
                if count < caps.max_tools && used + bytes <= caps.max_bytes {
                    break;
                }
                let (n, _) = victims[take];
                count -= 1;
                used -= self.slots[n].bytes;
                take += 1;
            }
            if count >= caps.max_tools || used + bytes > caps.max_bytes {
                out.over_budget.push(name.clone());
                if regrown {
                    out.evicted.push(name.clone());
                }
                continue;
            }
            let gone: Vec<String> = victims[..take].iter().map(|(n, _)| (*n).clone()).collect();
            for n in &gone {
                self.evict(n);
            }
            out.evicted.extend(gone);
            self.slots.insert(
                name.clone(),
                Slot {
                    last_round: self.round,
                    stamp,
                    bytes: *bytes,
                },
            );
            self.bytes += bytes;
            out.exposed.push(name.clone());
        }
        out
    }
}
