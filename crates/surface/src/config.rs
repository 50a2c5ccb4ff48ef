//! The surface's configuration: floor sizes, working-set caps, per-round budgets, mode lists.

use serde::{Deserialize, Serialize};

use crate::SurfaceError;

/// How the surface composes a session's tools. Every field has a default; unknown fields are
/// rejected so a typo in a config file is an error, not a silent default.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SurfaceConfig {
    /// Tools always at the head of the resident floor, in this order.
    pub anchors: Vec<String>,
    /// How many tools the derived floor aims for (anchors included).
    pub target_floor: usize,
    /// Below this many floor tools the surface warns.
    pub floor_min: usize,
    /// Above this many floor tools the surface warns.
    pub floor_max: usize,
    /// Extra always-resident tools, besides `tool_search` and `describe_tool`.
    pub system: Vec<String>,
    /// A static floor used when no valid derived floor exists (after the anchors).
    pub fallback_floor: Vec<String>,
    /// A usage ranking older than this many seconds is derived again (with a store, by the
    /// floor keeper; without one, on the next read).
    pub floor_max_age_secs: u64,
    /// With a store, the floor keeper re-reads the stored ranking this often (another
    /// process may have written a newer one); between reads the floor is served from
    /// memory.
    pub floor_cache_ttl_secs: u64,
    /// A working-set tool unused for more than this many rounds is evicted.
    pub idle_rounds: u64,
    /// Caps of a session's working set.
    pub working_set: WorkingSetConfig,
    /// Budgets of one round's advertised list.
    pub round: RoundBudget,
    /// The hard cap on the number of advertised tools; exceeding it is an error.
    pub max_surface: usize,
    /// Agentic mode lists these tools (names, or `prefix*` patterns) plus the working set.
    pub agentic_allow: Vec<String>,
    /// Tools (names or `prefix*`) listed only in agentic mode.
    pub agentic_only: Vec<String>,
    /// Tools (names or `prefix*`) never listed in delegate mode.
    pub delegate_excluded: Vec<String>,
    /// Tools (names or `*` patterns) never offered, in any mode: kept off every round and
    /// out of `tool_search` and `describe_tool`, but still callable, so that what refuses
    /// them answers a call (`quiver` sets it from the policy rules that deny a tool to
    /// every caller; not a config key).
    #[serde(skip)]
    pub unoffered: Vec<String>,
    /// How many hits `tool_search` returns when the model gives no limit.
    pub search_default_limit: usize,
    /// How many working sets stay in memory; beyond it the least recently used are
    /// dropped (a store keeps them: a returning key is restored from it).
    pub max_sessions: usize,
}

/// Caps of one session's working set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WorkingSetConfig {
    /// At most this many tools.
    pub max_tools: usize,
    /// At most this many definition bytes ([`quiver_contract::ToolSpec::definition_bytes`]).
    pub max_bytes: usize,
}

impl Default for WorkingSetConfig {
    fn default() -> Self {
        WorkingSetConfig {
            max_tools: 64,
            max_bytes: 64 * 1024,
        }
    }
}

/// Budgets of the list advertised in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RoundBudget {
    /// At most this many definitions.
    pub max_definitions: usize,
    /// At most this many definition bytes.
    pub max_bytes: usize,
}

impl Default for RoundBudget {
    fn default() -> Self {
        RoundBudget {
            max_definitions: 32,
            max_bytes: 16 * 1024,
        }
    }
}

impl Default for SurfaceConfig {
    fn default() -> Self {
        SurfaceConfig {
            anchors: Vec::new(),
            target_floor: 30,
            floor_min: 25,
            floor_max: 35,
            system: Vec::new(),
            fallback_floor: Vec::new(),
            floor_max_age_secs: 24 * 60 * 60,
            floor_cache_ttl_secs: 60,
            idle_rounds: 10,
            working_set: WorkingSetConfig::default(),
            round: RoundBudget::default(),
            max_surface: 120,
            agentic_allow: Vec::new(),
            agentic_only: Vec::new(),
            delegate_excluded: Vec::new(),
            unoffered: Vec::new(),
            search_default_limit: 8,
            max_sessions: 10_000,
        }
    }
}

impl SurfaceConfig {
    /// Checks that the numbers agree with each other.
    pub fn validate(&self) -> Result<(), SurfaceError> {
        let bad = |why: String| Err(SurfaceError::InvalidConfig(why));
        if self.floor_min > self.floor_max {
            return bad(format!(
                "floor_min ({}) is above floor_max ({})",
                self.floor_min, self.floor_max
            ));
        }
        if self.max_surface == 0 {
            return bad("max_surface must be at least 1".into());
        }
        // Every list holds the system set: below it, every `tools/list` would fail.
        let system = self.system_set();
        if self.max_surface < system.len() {
            return bad(format!(
                "max_surface ({}) is below the always-resident system set ({}: {}): no tool list could be composed; raise max_surface (the default is 120)",
                self.max_surface,
                system.len(),
                system.join(", ")
            ));
        }
        if self.max_sessions == 0 {
            return bad("max_sessions must be at least 1".into());
        }
        if self.floor_cache_ttl_secs == 0 || self.floor_max_age_secs == 0 {
            return bad(format!(
                "floor_cache_ttl_secs ({}) and floor_max_age_secs ({}) must be at least 1 (seconds between reads of the stored floor, and the age at which it is derived again)",
                self.floor_cache_ttl_secs, self.floor_max_age_secs
            ));
        }
        if self.idle_rounds == 0 {
            return bad(
                "idle_rounds must be at least 1: at 0 a tool tool_search pages in is evicted at the next round, before any tool list shows it"
                    .into(),
            );
        }
        if self.working_set.max_tools == 0 || self.working_set.max_bytes == 0 {
            return bad(format!(
                "working_set.max_tools ({}) and working_set.max_bytes ({}) must be at least 1: at 0 every tool tool_search finds is over budget and none can be paged in",
                self.working_set.max_tools, self.working_set.max_bytes
            ));
        }
        if self.search_default_limit == 0 || self.search_default_limit > MAX_SEARCH_LIMIT {
            return bad(format!(
                "search_default_limit must be in 1..={MAX_SEARCH_LIMIT}, not {}",
                self.search_default_limit
            ));
        }
        Ok(())
    }

    /// The always-resident system set: `tool_search`, `describe_tool`, then the configured
    /// `system` tools, without repeats.
    pub fn system_set(&self) -> Vec<String> {
        let mut set = vec![
            crate::TOOL_SEARCH.to_owned(),
            crate::DESCRIBE_TOOL.to_owned(),
        ];
        for s in &self.system {
            if !set.contains(s) {
                set.push(s.clone());
            }
        }
        set
    }

    /// Settings that are valid one by one but do not fit together (a full round larger
    /// than `max_surface`, which then fails every composition of a busy session; a system
    /// set the round cannot hold). Logged when a surface is built; `quiver check` reports
    /// them as findings.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let round = self.round.max_definitions;
        if self.max_surface < round {
            out.push(format!(
                "max_surface ({}) is below round.max_definitions ({round}): a full round would exceed it, and every composition of that session fails; raise max_surface or lower max_definitions",
                self.max_surface
            ));
        }
        // The anchors are resident too (those that are live): with the system set they can
        // fill max_surface, and then every list fails.
        let resident = self.system_set().len() + self.anchors.len();
        if self.max_surface < resident {
            out.push(format!(
                "max_surface ({}) is below the system set and the anchors together ({resident}): once the anchors are registered every composition fails; raise max_surface or drop anchors",
                self.max_surface
            ));
        }
        if !(self.floor_min..=self.floor_max).contains(&self.target_floor) {
            out.push(format!(
                "target_floor ({}) is outside floor_min..floor_max ({}..{}): a floor of that size is always reported out of range; set it between them",
                self.target_floor, self.floor_min, self.floor_max
            ));
        }
        let system = self.system_set();
        for (key, patterns) in [
            ("agentic_only", &self.agentic_only),
            ("delegate_excluded", &self.delegate_excluded),
        ] {
            for p in patterns {
                for s in system
                    .iter()
                    .filter(|s| quiver_contract::pattern_matches(p, s))
                {
                    out.push(format!(
                        "{key} pattern `{p}` matches the system tool `{s}`, which stays resident in every mode; narrow the pattern"
                    ));
                }
            }
        }
        if system.len() > round {
            out.push(format!(
                "the always-resident system set has {} tools, more than round.max_definitions ({round}): some of them are never listed",
                system.len()
            ));
        }
        out
    }

    /// Sets how many working sets stay in memory.
    pub fn with_max_sessions(mut self, max: usize) -> Self {
        self.max_sessions = max;
        self
    }

    /// Sets the anchors.
    pub fn with_anchors(mut self, anchors: &[&str]) -> Self {
        self.anchors = anchors.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the extra always-resident tools.
    pub fn with_system(mut self, names: &[&str]) -> Self {
        self.system = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the floor target and the warning band.
    pub fn with_floor(mut self, target: usize, min: usize, max: usize) -> Self {
        self.target_floor = target;
        self.floor_min = min;
        self.floor_max = max;
        self
    }

    /// Sets the static fallback floor.
    pub fn with_fallback(mut self, names: &[&str]) -> Self {
        self.fallback_floor = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the working-set caps.
    pub fn with_working_set(mut self, max_tools: usize, max_bytes: usize) -> Self {
        self.working_set = WorkingSetConfig {
            max_tools,
            max_bytes,
        };
        self
    }

    /// Sets the per-round budget.
    pub fn with_round_budget(mut self, max_definitions: usize, max_bytes: usize) -> Self {
        self.round = RoundBudget {
            max_definitions,
            max_bytes,
        };
        self
    }

    /// Sets the hard cap.
    pub fn with_max_surface(mut self, max: usize) -> Self {
        self.max_surface = max;
        self
    }

    /// Sets the idle eviction threshold.
    pub fn with_idle_rounds(mut self, rounds: u64) -> Self {
        self.idle_rounds = rounds;
        self
    }

    /// Sets the agentic allow-list.
    pub fn with_agentic_allow(mut self, names: &[&str]) -> Self {
        self.agentic_allow = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the agentic-only list.
    pub fn with_agentic_only(mut self, names: &[&str]) -> Self {
        self.agentic_only = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the delegate-excluded list.
    pub fn with_delegate_excluded(mut self, names: &[&str]) -> Self {
        self.delegate_excluded = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the tools never offered (see [`SurfaceConfig::unoffered`]).
    pub fn with_unoffered(mut self, patterns: &[&str]) -> Self {
        self.unoffered = patterns.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the floor cache TTL and the derived floor's maximum age, in seconds.
    pub fn with_floor_times(mut self, cache_ttl_secs: u64, max_age_secs: u64) -> Self {
        self.floor_cache_ttl_secs = cache_ttl_secs;
        self.floor_max_age_secs = max_age_secs;
        self
    }
}

/// The largest `limit` `tool_search` accepts.
pub const MAX_SEARCH_LIMIT: usize = 50;
