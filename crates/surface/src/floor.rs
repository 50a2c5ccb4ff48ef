//! The resident floor: the anchors, then the tools used most, derived from usage counts.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
};

use quiver_registry::Catalog;
use tokio::time::{Duration, Instant};

use crate::SurfaceConfig;

/// Where usage counts come from. Each row is a tool name and its call counts in three age
/// buckets: younger than 30 days, 30 to 90 days, older.
pub trait UsageScores: Send + Sync {
    /// Every tool with its usage buckets.
    fn usage(&self) -> Vec<(String, [u64; 3])>;
}

/// The weights of the three usage buckets.
pub const USAGE_WEIGHTS: [f64; 3] = [3.0, 1.0, 0.2];

/// The usage score of one tool's buckets: `3.0 * recent + 1.0 * middle + 0.2 * old`.
pub fn usage_score(buckets: [u64; 3]) -> f64 {
    buckets
        .iter()
        .zip(USAGE_WEIGHTS)
        .map(|(&n, w)| n as f64 * w)
        .sum()
}

/// In-memory usage counts, for tests and embedding.
#[derive(Debug, Default)]
pub struct MemoryUsage {
    rows: Mutex<BTreeMap<String, [u64; 3]>>,
}

impl MemoryUsage {
    /// Usage with the given rows.
    pub fn new(rows: impl IntoIterator<Item = (String, [u64; 3])>) -> Self {
        MemoryUsage {
            rows: Mutex::new(rows.into_iter().collect()),
        }
    }

    /// Sets one tool's buckets.
    pub fn set(&self, name: &str, buckets: [u64; 3]) {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), buckets);
    }

    /// Forgets every row.
    pub fn clear(&self) {
        self.rows.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl UsageScores for MemoryUsage {
    fn usage(&self) -> Vec<(String, [u64; 3])> {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}

/// Why a floor entry is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FloorSource {
    /// Derived from usage (anchors first).
    Derived,
    /// The static fallback (anchors first): no usage was available.
    Fallback,
}

/// One tool of the floor.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FloorEntry {
    /// The tool.
    pub name: String,
    /// Whether it is a configured anchor.
    pub anchor: bool,
    /// Its usage score (0 for anchors and fallback entries without usage).
    pub score: f64,
}

/// A derived (or fallback) floor.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Floor {
    /// The tools, anchors first, then by score.
    pub entries: Vec<FloorEntry>,
    /// How the floor was made.
    pub source: FloorSource,
    /// When it was derived.
    pub written_at: Instant,
}

impl Floor {
    /// The names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.name.as_str()).collect()
    }
}

/// The derived floor and the read cache.
#[derive(Debug, Default)]
pub(crate) struct FloorState {
    derived: Option<Arc<Floor>>,
    cached: Option<(Instant, Arc<Floor>)>,
}

impl FloorState {
    /// The floor to use now: the cached read while fresh, else the derived floor while young
    /// enough, else a re-derivation.
    pub(crate) fn read(
        &mut self,
        config: &SurfaceConfig,
        catalog: &Catalog,
        usage: &dyn UsageScores,
    ) -> Arc<Floor> {
        let now = Instant::now();
        let ttl = Duration::from_secs(config.floor_cache_ttl_secs);
        if let Some((at, floor)) = &self.cached
            && now.saturating_duration_since(*at) < ttl
        {
            return floor.clone();
        }
        let max_age = Duration::from_secs(config.floor_max_age_secs);
        let floor = match &self.derived {
            Some(f) if now.saturating_duration_since(f.written_at) < max_age => f.clone(),
            _ => self.rederive(config, catalog, usage),
        };
        self.cached = Some((now, floor.clone()));
        floor
    }

    /// Derives the floor again and drops the cached read.
    pub(crate) fn rederive(
        &mut self,
        config: &SurfaceConfig,
        catalog: &Catalog,
        usage: &dyn UsageScores,
    ) -> Arc<Floor> {
        let floor = Arc::new(derive(config, catalog, usage));
        let n = floor.entries.len();
        // A fresh install: no usage yet, nothing configured to stand in. Expected, not a
        // warning on every start.
        let nothing_yet = n == 0
            && floor.source == FloorSource::Fallback
            && config.anchors.is_empty()
            && config.fallback_floor.is_empty();
        if nothing_yet {
            tracing::debug!(
                "no usage recorded yet and no anchors or fallback floor: the floor is empty"
            );
        } else if n < config.floor_min || n > config.floor_max {
            tracing::warn!(
                size = n,
                floor_min = config.floor_min,
                floor_max = config.floor_max,
                source = ?floor.source,
                "the resident floor is outside its configured band"
            );
        }
        self.derived = Some(floor.clone());
        self.cached = None;
        floor
    }
}

/// Anchors first, then the highest usage-scored live tools up to `target_floor`; the static
/// fallback (after the anchors) when usage names no live tool.
fn derive(config: &SurfaceConfig, catalog: &Catalog, usage: &dyn UsageScores) -> Floor {
    let system = config.system_set();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut entries: Vec<FloorEntry> = Vec::new();
    for a in &config.anchors {
        if seen.insert(a) {
            entries.push(FloorEntry {
                name: a.clone(),
                anchor: true,
                score: 0.0,
            });
        }
    }
    let mut scored: Vec<(String, f64)> = usage
        .usage()
        .into_iter()
        .map(|(name, b)| (name, usage_score(b)))
        .filter(|(_, s)| *s > 0.0)
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut from_usage = 0usize;
    for (name, score) in &scored {
        if entries.len() >= config.target_floor {
            break;
        }
        // The system set is resident anyway (and the most called): a floor slot for it
        // would be wasted.
        if seen.contains(name.as_str()) || system.contains(name) {
            continue;
        }
        match catalog.lookup(name) {
            Some(e) if e.spec.is_live() && !e.spec.category.is_internal() => {}
            _ => {
                tracing::debug!(tool = %name, "usage names a tool that is not live; not in the floor");
                continue;
            }
        }
        seen.insert(name);
        entries.push(FloorEntry {
            name: name.clone(),
            anchor: false,
            score: *score,
        });
        from_usage += 1;
    }
    let mut source = FloorSource::Derived;
    if from_usage == 0 {
        source = FloorSource::Fallback;
        for name in &config.fallback_floor {
            if entries.len() >= config.target_floor.max(config.anchors.len()) {
                break;
            }
            if seen.insert(name) {
                entries.push(FloorEntry {
                    name: name.clone(),
                    anchor: false,
                    score: 0.0,
                });
            }
        }
    }
    Floor {
        entries,
        source,
        written_at: Instant::now(),
    }
}
