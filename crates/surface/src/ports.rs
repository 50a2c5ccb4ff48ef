//! The ports the surface consumes: [`SessionStore`] (each session's working set, its failed
//! approaches, and a small key/value of surface state such as the stored resident floor) and
//! [`UsageSource`] (per-tool call counts by age), with in-memory implementations.

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use quiver_registry::store::StoreError;
use serde_json::Value;

use crate::sync::lock;

/// The surface-state key of the stored resident floor (tier 0).
pub const TIER0_KEY: &str = "tool_surface_tier0_v1";

/// One tool in a session's working set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkingSetEntry {
    /// The tool name.
    pub tool: String,
    /// When it was last used (or loaded).
    pub last_used: SystemTime,
    /// How many rounds of its session it had been idle (rounds since it was last paged in
    /// or called) when it was written; a restore gives it back that idleness.
    pub round: u64,
}

impl WorkingSetEntry {
    /// An entry.
    pub fn new(tool: impl Into<String>, last_used: SystemTime, round: u64) -> Self {
        WorkingSetEntry {
            tool: tool.into(),
            last_used,
            round,
        }
    }
}

/// A session's stored working set and its version: the version moves on with every
/// [`SessionStore::replace_working_set`], so a server that remembers the version it last
/// wrote or read knows whether another server sharing the store has written the set since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredWorkingSet {
    /// The set's version: 0 for a set never written.
    pub version: u64,
    /// The entries, by tool name.
    pub entries: Vec<WorkingSetEntry>,
}

impl StoredWorkingSet {
    /// A stored set.
    pub fn new(version: u64, entries: Vec<WorkingSetEntry>) -> Self {
        StoredWorkingSet { version, entries }
    }
}

/// A call that failed in a session, counted per args hash.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailedApproach {
    /// The call's args hash.
    pub args_hash: String,
    /// The tool called.
    pub tool: String,
    /// The last failure's message.
    pub error: String,
    /// How many times it failed.
    pub count: u32,
    /// When it last failed.
    pub last_at: SystemTime,
}

impl FailedApproach {
    /// A failed approach.
    pub fn new(
        args_hash: impl Into<String>,
        tool: impl Into<String>,
        error: impl Into<String>,
        count: u32,
        last_at: SystemTime,
    ) -> Self {
        FailedApproach {
            args_hash: args_hash.into(),
            tool: tool.into(),
            error: error.into(),
            count,
            last_at,
        }
    }
}

/// A stored surface-state value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SurfaceState {
    /// The value.
    pub value: Value,
    /// When it was written.
    pub written_at: SystemTime,
}

impl SurfaceState {
    /// A value written at `written_at`.
    pub fn new(value: Value, written_at: SystemTime) -> Self {
        SurfaceState { value, written_at }
    }
}

/// Per-session surface state that outlives a restart.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// The session's working set, by tool name.
    async fn working_set(&self, session: &str) -> Result<Vec<WorkingSetEntry>, StoreError>;

    /// The session's working set with its version, read together.
    async fn versioned_working_set(&self, session: &str) -> Result<StoredWorkingSet, StoreError>;

    /// Replaces the session's whole working set with `entries` (tools not among them
    /// leave) and moves its version on, at once; returns the new version.
    async fn replace_working_set(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
    ) -> Result<u64, StoreError>;

    /// [`SessionStore::replace_working_set`] only if the set's version is still
    /// `expected` (the version this server last wrote or read), at once: the new version,
    /// or `None` when another server wrote the set since (nothing is written then). A set
    /// never written has version 0.
    async fn replace_working_set_if(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
        expected: u64,
    ) -> Result<Option<u64>, StoreError>;

    /// Counts one failure of the call `args_hash`; returns how many there have been.
    async fn record_failed_approach(
        &self,
        session: &str,
        args_hash: &str,
        tool: &str,
        error: &str,
    ) -> Result<u32, StoreError>;

    /// The session's failed approaches, by args hash.
    async fn failed_approaches(&self, session: &str) -> Result<Vec<FailedApproach>, StoreError>;

    /// Forgets everything of the session (working set and failures).
    async fn end_session(&self, session: &str) -> Result<(), StoreError>;

    /// A surface-state value (for example [`TIER0_KEY`]).
    async fn state(&self, key: &str) -> Result<Option<SurfaceState>, StoreError>;

    /// Writes a surface-state value, stamped now.
    async fn put_state(&self, key: &str, value: Value) -> Result<(), StoreError>;

    /// Whether several servers share this store, so that a session's stored working set
    /// may have changed elsewhere since this process read it (the default: no).
    fn shared(&self) -> bool {
        false
    }

    /// Whether this process is the one that derives the shared state named `role` (the
    /// floor's usage ranking, [`FLOOR_ROLE`]) and writes it for every process to read. A
    /// store several servers share grants a role to one of them at a time, and to another
    /// when that one goes away; the default grants it always (a store one server writes).
    async fn lead(&self, role: &str) -> Result<bool, StoreError> {
        let _ = role;
        Ok(true)
    }
}

/// The role of [`SessionStore::lead`] that derives and stores the resident floor.
pub const FLOOR_ROLE: &str = "floor";

/// How often one tool was called, by age of the call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ToolUsage {
    /// The tool name.
    pub tool: String,
    /// Calls less than 30 days old.
    pub last_30_days: u64,
    /// Calls 30 to 90 days old.
    pub last_90_days: u64,
    /// Calls 90 days old or older.
    pub older: u64,
}

impl ToolUsage {
    /// Counts for one tool.
    pub fn new(tool: impl Into<String>, last_30_days: u64, last_90_days: u64, older: u64) -> Self {
        ToolUsage {
            tool: tool.into(),
            last_30_days,
            last_90_days,
            older,
        }
    }

    /// Ages at which the buckets change.
    pub const BUCKETS: [Duration; 2] = [
        Duration::from_secs(30 * 86_400),
        Duration::from_secs(90 * 86_400),
    ];

    /// Counts one call of `age` in its bucket.
    pub fn count(&mut self, age: Duration) {
        if age < Self::BUCKETS[0] {
            self.last_30_days += 1;
        } else if age < Self::BUCKETS[1] {
            self.last_90_days += 1;
        } else {
            self.older += 1;
        }
    }

    /// Every call, whatever its age.
    pub fn total(&self) -> u64 {
        self.last_30_days + self.last_90_days + self.older
    }
}

/// Where the surface learns which tools are used. The buckets are disjoint: under 30 days,
/// 30 to 90 days, 90 days and older, measured back from `now`.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait UsageSource: Send + Sync {
    /// Per-tool call counts, by tool name.
    async fn usage(&self, now: SystemTime) -> Result<Vec<ToolUsage>, StoreError>;
}

#[derive(Debug, Default)]
struct MemorySessions {
    working: BTreeMap<String, BTreeMap<String, WorkingSetEntry>>,
    versions: BTreeMap<String, u64>,
    failures: BTreeMap<String, BTreeMap<String, FailedApproach>>,
    state: BTreeMap<String, SurfaceState>,
}

/// An in-memory [`SessionStore`].
#[derive(Debug, Default)]
pub struct MemorySessionStore {
    inner: Mutex<MemorySessions>,
    shared: bool,
}

impl MemorySessionStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that says it is shared by several servers ([`SessionStore::shared`]):
    /// for testing, in one process, surfaces that stand for servers sharing one store.
    pub fn new_shared() -> Self {
        MemorySessionStore {
            shared: true,
            ..Self::default()
        }
    }
}

#[async_trait]
impl SessionStore for MemorySessionStore {
    async fn working_set(&self, session: &str) -> Result<Vec<WorkingSetEntry>, StoreError> {
        Ok(lock(&self.inner)
            .working
            .get(session)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn record_failed_approach(
        &self,
        session: &str,
        args_hash: &str,
        tool: &str,
        error: &str,
    ) -> Result<u32, StoreError> {
        let mut inner = lock(&self.inner);
        let f = inner
            .failures
            .entry(session.to_owned())
            .or_default()
            .entry(args_hash.to_owned())
            .or_insert_with(|| FailedApproach {
                args_hash: args_hash.to_owned(),
                tool: tool.to_owned(),
                error: String::new(),
                count: 0,
                last_at: SystemTime::now(),
            });
        f.count += 1;
        f.error = error.to_owned();
        f.tool = tool.to_owned();
        f.last_at = SystemTime::now();
        Ok(f.count)
    }

    async fn failed_approaches(&self, session: &str) -> Result<Vec<FailedApproach>, StoreError> {
        Ok(lock(&self.inner)
            .failures
            .get(session)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn versioned_working_set(&self, session: &str) -> Result<StoredWorkingSet, StoreError> {
        let inner = lock(&self.inner);
        Ok(StoredWorkingSet::new(
            inner.versions.get(session).copied().unwrap_or(0),
            inner
                .working
                .get(session)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default(),
        ))
    }

    async fn replace_working_set(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
    ) -> Result<u64, StoreError> {
        let mut inner = lock(&self.inner);
        inner.working.insert(
            session.to_owned(),
            entries.into_iter().map(|e| (e.tool.clone(), e)).collect(),
        );
        let version = inner.versions.entry(session.to_owned()).or_default();
        *version += 1;
        Ok(*version)
    }

    async fn replace_working_set_if(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
        expected: u64,
    ) -> Result<Option<u64>, StoreError> {
        let mut inner = lock(&self.inner);
        if inner.versions.get(session).copied().unwrap_or(0) != expected {
            return Ok(None);
        }
        inner.working.insert(
            session.to_owned(),
            entries.into_iter().map(|e| (e.tool.clone(), e)).collect(),
        );
        let version = inner.versions.entry(session.to_owned()).or_default();
        *version += 1;
        Ok(Some(*version))
    }

    async fn end_session(&self, session: &str) -> Result<(), StoreError> {
        let mut inner = lock(&self.inner);
        inner.working.remove(session);
        inner.versions.remove(session);
        inner.failures.remove(session);
        Ok(())
    }

    async fn state(&self, key: &str) -> Result<Option<SurfaceState>, StoreError> {
        Ok(lock(&self.inner).state.get(key).cloned())
    }

    async fn put_state(&self, key: &str, value: Value) -> Result<(), StoreError> {
        lock(&self.inner).state.insert(
            key.to_owned(),
            SurfaceState {
                value,
                written_at: SystemTime::now(),
            },
        );
        Ok(())
    }

    fn shared(&self) -> bool {
        self.shared
    }
}

/// An in-memory [`UsageSource`] over call times fed to it.
#[derive(Debug, Default)]
pub struct MemoryUsage {
    calls: Mutex<Vec<(String, SystemTime)>>,
}

impl MemoryUsage {
    /// No calls.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes a call of `tool` at `at`.
    pub fn add(&self, tool: impl Into<String>, at: SystemTime) {
        lock(&self.calls).push((tool.into(), at));
    }
}

#[async_trait]
impl UsageSource for MemoryUsage {
    async fn usage(&self, now: SystemTime) -> Result<Vec<ToolUsage>, StoreError> {
        let mut by_tool: BTreeMap<String, ToolUsage> = BTreeMap::new();
        for (tool, at) in lock(&self.calls).iter() {
            let age = now.duration_since(*at).unwrap_or_default();
            by_tool
                .entry(tool.clone())
                .or_insert_with(|| ToolUsage {
                    tool: tool.clone(),
                    ..Default::default()
                })
                .count(age);
        }
        Ok(by_tool.into_values().collect())
    }
}
