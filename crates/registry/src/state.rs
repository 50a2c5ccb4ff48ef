//! Per-session dispatch state: the loop guard's streak, repeat failures, policy violation
//! counts and the tools already called. Sharded so concurrent sessions rarely contend.

use std::{
    hash::BuildHasher,
    sync::{Arc, Mutex},
};

// A fast seeded hasher: session keys come from clients, so it is randomly seeded per process.
use foldhash::fast::RandomState;

use crate::sync::lock;

type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
type HashSet<K> = std::collections::HashSet<K, RandomState>;

#[derive(Debug, Default)]
pub(crate) struct SessionState {
    last_hash: Option<String>,
    streak: u32,
    /// What the streak's repeats returned (a fingerprint), from its second call on: a
    /// repeat that returns something else starts the streak again, so the guard only
    /// refuses calls that have been returning the same.
    streak_result: Option<u64>,
    /// The streak's repeats that have finished (each returning what the ones before did):
    /// the guard refuses only on that evidence, not on identical calls still running side
    /// by side (a model fanning out one call).
    settled: u32,
    failures: HashMap<String, u32>,
    violations: HashMap<String, u32>,
    called: HashSet<String>,
    touched: u64,
}

impl SessionState {
    /// Counts this call in the consecutive-identical streak and returns the streak length.
    pub(crate) fn bump_streak(&mut self, hash: &str) -> u32 {
        if self.last_hash.as_deref() == Some(hash) {
            self.streak = self.streak.saturating_add(1);
        } else {
            // Reuse the buffer: a new hash on every call is the common case.
            match &mut self.last_hash {
                Some(last) => {
                    last.clear();
                    last.push_str(hash);
                }
                None => self.last_hash = Some(hash.to_owned()),
            }
            self.streak = 1;
            self.streak_result = None;
            self.settled = 0;
        }
        self.streak
    }

    /// Whether a call that made the streak `streak` long is refused at `threshold`: the
    /// streak is that long and the repeats before it (all but the first call and this one)
    /// have come back, returning the same.
    pub(crate) fn guarded(&self, streak: u32, threshold: u32) -> bool {
        streak >= threshold && self.settled.saturating_add(2) >= threshold
    }

    /// Notes what this call (`hash`) returned, if it repeats the one before it: the same as
    /// the repeats before leaves the streak, something else restarts it at this call.
    /// `fingerprint` runs only for a repeat.
    pub(crate) fn note_result(&mut self, hash: &str, fingerprint: impl FnOnce() -> u64) {
        if self.last_hash.as_deref() != Some(hash) || self.streak < 2 {
            return;
        }
        let now = fingerprint();
        match self.streak_result {
            Some(before) if before != now => {
                self.streak = 1;
                self.settled = 0;
            }
            _ => self.settled = self.settled.saturating_add(1),
        }
        self.streak_result = Some(now);
    }

    /// Takes this call back out of the streak (it did not count), if it is still the last.
    pub(crate) fn unbump_streak(&mut self, hash: &str) {
        if self.last_hash.as_deref() == Some(hash) {
            self.streak = self.streak.saturating_sub(1);
        }
    }

    /// Records a failure of this call and returns how many times it has failed.
    pub(crate) fn record_failure(&mut self, hash: &str) -> u32 {
        let n = self.failures.entry(hash.to_owned()).or_insert(0);
        *n += 1;
        *n
    }

    /// Counts a violation of `rule` and returns how many there have been.
    pub(crate) fn record_violation(&mut self, rule: &str) -> u32 {
        let n = self.violations.entry(rule.to_owned()).or_insert(0);
        *n += 1;
        *n
    }

    /// Whether a tool matching `pattern` (see `pattern_matches`) was called.
    pub(crate) fn called(&self, pattern: &str) -> bool {
        if pattern.contains('*') {
            self.called
                .iter()
                .any(|t| quiver_contract::pattern_matches(pattern, t))
        } else {
            self.called.contains(pattern)
        }
    }

    pub(crate) fn mark_called(&mut self, tool: &str) {
        if !self.called.contains(tool) {
            self.called.insert(tool.to_owned());
        }
    }
}

const SHARDS: usize = 16;

pub(crate) struct Sessions {
    shards: Vec<Mutex<HashMap<Arc<str>, SessionState>>>,
    hasher: RandomState,
    clock: std::sync::atomic::AtomicU64,
    max_per_shard: usize,
}

impl Sessions {
    pub(crate) fn new(max_sessions: usize) -> Self {
        Sessions {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            hasher: RandomState::default(),
            clock: std::sync::atomic::AtomicU64::new(0),
            max_per_shard: (max_sessions / SHARDS).max(1),
        }
    }

    /// Runs `f` on the session's state, creating it if needed (evicting the least recently
    /// touched session of the shard when the shard is full).
    pub(crate) fn with<R>(&self, session: &Arc<str>, f: impl FnOnce(&mut SessionState) -> R) -> R {
        let idx = (self.hasher.hash_one(&**session) as usize) % SHARDS;
        let mut shard = lock(&self.shards[idx]);
        let now = self
            .clock
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !shard.contains_key(session)
            && shard.len() >= self.max_per_shard
            && let Some(oldest) = shard
                .iter()
                .min_by_key(|(_, s)| s.touched)
                .map(|(k, _)| k.clone())
        {
            shard.remove(&oldest);
        }
        let state = shard.entry(session.clone()).or_default();
        state.touched = now;
        f(state)
    }

    /// Forgets a session.
    pub(crate) fn end(&self, session: &str) {
        let idx = (self.hasher.hash_one(session) as usize) % SHARDS;
        lock(&self.shards[idx]).remove(session);
    }
}
