//! The resident floor: the anchors, then the tools used most. Usage counts are ranked (the
//! ranking is stored under [`crate::ports::TIER0_KEY`] when the surface has a store), and
//! each read resolves the ranking against the live catalog, cached per catalog version.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use quiver_registry::Catalog;
use serde_json::{Value, json};
use tokio::time::{Duration, Instant};

use crate::{SurfaceConfig, sync::lock};

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
        lock(&self.rows).insert(name.to_owned(), buckets);
    }

    /// Forgets every row.
    pub fn clear(&self) {
        lock(&self.rows).clear();
    }
}

impl UsageScores for MemoryUsage {
    fn usage(&self) -> Vec<(String, [u64; 3])> {
        lock(&self.rows)
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

/// The floor in use: the anchors, then the best-ranked tools of the usage ranking that are
/// live in the catalog now, up to `target_floor` (or the static fallback after the anchors
/// when none is).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Floor {
    /// The tools, anchors first, then by score.
    pub entries: Vec<FloorEntry>,
    /// How the floor was made.
    pub source: FloorSource,
    /// When the usage ranking behind it was derived (this process's clock).
    pub written_at: Instant,
}

impl Floor {
    /// The names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.name.as_str()).collect()
    }
}

/// How many ranked tools a derivation keeps: more than any floor takes, so that tools
/// missing from the catalog now (an upstream still connecting) leave their slots to the
/// next ones, and take them back when they register, without a new derivation.
const MAX_RANKED: usize = 2048;

/// The version of the stored value's shape.
const STORED_VERSION: u64 = 1;

/// The usage ranking a floor is resolved from: every tool with usage, best first (ties by
/// name), whether or not it is in the catalog now. This is what is stored under
/// [`crate::ports::TIER0_KEY`]; anchors, the system set and the target come from the
/// configuration when it is resolved.
#[derive(Debug, Clone)]
pub(crate) struct Ranking {
    ranked: Vec<(String, f64)>,
    /// When it was derived, on this process's clock.
    derived_at: Instant,
    /// When it was derived, as stored (to tell a newer stored value from the one held).
    derived_wall: SystemTime,
}

/// The same derivation: the same ranked tools, derived at the same (stored) time.
impl PartialEq for Ranking {
    fn eq(&self, other: &Self) -> bool {
        self.ranked == other.ranked && self.derived_wall == other.derived_wall
    }
}

impl Ranking {
    /// Ranks usage rows (tool, age buckets) by their weighted score.
    pub(crate) fn derive(rows: impl IntoIterator<Item = (String, [u64; 3])>) -> Ranking {
        // The log also holds calls of names no tool ever had (a model's guess, an empty
        // name): not rankable.
        let mut ranked: Vec<(String, f64)> = rows
            .into_iter()
            .filter(|(name, _)| quiver_contract::validate_tool_name(name).is_ok())
            .map(|(name, b)| (name, usage_score(b)))
            .filter(|(_, s)| *s > 0.0)
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        ranked.truncate(MAX_RANKED);
        // Whole milliseconds, as stored: the value read back is equal to this one.
        let ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        Ranking {
            ranked,
            derived_at: Instant::now(),
            derived_wall: SystemTime::UNIX_EPOCH + Duration::from_millis(ms),
        }
    }

    /// The value stored under [`crate::ports::TIER0_KEY`].
    pub(crate) fn to_stored(&self) -> Value {
        json!({
            "version": STORED_VERSION,
            "derived_at_ms": self
                .derived_wall
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or_default(),
            "ranked": self
                .ranked
                .iter()
                .map(|(name, score)| json!({"name": name, "score": score}))
                .collect::<Vec<_>>(),
        })
    }

    /// A stored value read back; `Err` says why it is not a valid one.
    pub(crate) fn from_stored(value: &Value) -> Result<Ranking, String> {
        let version = value.get("version").and_then(Value::as_u64);
        if version != Some(STORED_VERSION) {
            return Err(format!(
                "version {} (this build reads {STORED_VERSION})",
                version.map_or("missing".to_owned(), |v| v.to_string())
            ));
        }
        let derived_ms = value
            .get("derived_at_ms")
            .and_then(Value::as_u64)
            .ok_or("no derived_at_ms")?;
        let derived_wall = SystemTime::UNIX_EPOCH + Duration::from_millis(derived_ms);
        let rows = value
            .get("ranked")
            .and_then(Value::as_array)
            .ok_or("no ranked list")?;
        let mut ranked = Vec::with_capacity(rows.len().min(MAX_RANKED));
        for row in rows.iter().take(MAX_RANKED) {
            let name = row.get("name").and_then(Value::as_str);
            let score = row.get("score").and_then(Value::as_f64);
            match (name, score) {
                (Some(n), Some(s)) => {
                    // A name that is not a tool name (an older build ranked every logged
                    // name) is left out, not the whole ranking.
                    if quiver_contract::validate_tool_name(n).is_ok() && s.is_finite() {
                        ranked.push((n.to_owned(), s));
                    }
                }
                _ => return Err(format!("a ranked entry is not {{name, score}}: {row}")),
            }
        }
        // Its age on this process's clock (a value from the future counts as new).
        let age = SystemTime::now()
            .duration_since(derived_wall)
            .unwrap_or_default();
        let now = Instant::now();
        Ok(Ranking {
            ranked,
            derived_at: now.checked_sub(age).unwrap_or(now),
            derived_wall,
        })
    }

    /// Whether it ranks no tool (no usage yet).
    pub(crate) fn is_empty(&self) -> bool {
        self.ranked.is_empty()
    }

    /// The ranked names, best first, with their scores.
    pub(crate) fn ranked(&self) -> &[(String, f64)] {
        &self.ranked
    }

    /// How long ago it was derived.
    pub(crate) fn age(&self) -> Duration {
        Instant::now().saturating_duration_since(self.derived_at)
    }
}

/// The usage ranking, where it comes from, and the floor resolved from it.
#[derive(Debug, Default)]
pub(crate) struct FloorState {
    ranking: Option<Arc<Ranking>>,
    /// A store provides the ranking ([`crate::Surface::load_floor`]): reads never derive
    /// from the in-memory usage, and without a valid stored ranking the floor is the
    /// static fallback.
    stored: bool,
    /// The floor resolved from `ranking` for one catalog version.
    resolved: Option<(u64, Arc<Floor>)>,
    /// The size and source of the last floor checked against the band (warned once).
    checked: Option<(usize, FloorSource)>,
}

impl FloorState {
    /// The floor to use now: resolved from the ranking for the catalog's current version.
    /// Without a store, the ranking is derived from `usage` when missing or older than
    /// `floor_max_age_secs`.
    pub(crate) fn read(
        &mut self,
        config: &SurfaceConfig,
        catalog: &Catalog,
        usage: &dyn UsageScores,
    ) -> Arc<Floor> {
        if !self.stored {
            let max_age = Duration::from_secs(config.floor_max_age_secs);
            if self.ranking.as_ref().is_none_or(|r| r.age() >= max_age) {
                self.ranking = Some(Arc::new(Ranking::derive(usage.usage())));
                self.resolved = None;
            }
        }
        self.resolve(config, catalog)
    }

    /// The floor from the ranking held, without deriving one or warning about its size (a
    /// look that changes nothing).
    pub(crate) fn peek(&self, config: &SurfaceConfig, catalog: &Catalog) -> Arc<Floor> {
        match &self.resolved {
            Some((v, floor)) if *v == catalog.version() => floor.clone(),
            _ => Arc::new(resolve(config, catalog, self.ranking.as_deref())),
        }
    }

    /// Derives the ranking again from `usage` now (the in-memory path) and resolves it.
    pub(crate) fn rederive(
        &mut self,
        config: &SurfaceConfig,
        catalog: &Catalog,
        usage: &dyn UsageScores,
    ) -> Arc<Floor> {
        self.adopt(Arc::new(Ranking::derive(usage.usage())));
        self.checked = None;
        self.resolve(config, catalog)
    }

    /// Takes a ranking (derived or read from the store); `None` when nothing valid is
    /// stored. Marks the floor store-backed.
    pub(crate) fn set_stored(&mut self, ranking: Option<Arc<Ranking>>) {
        self.stored = true;
        match ranking {
            Some(r) => self.adopt(r),
            None => {
                self.ranking = None;
                self.resolved = None;
            }
        }
    }

    /// Marks the floor store-backed, keeping the ranking held (if any).
    pub(crate) fn keep_stored(&mut self) {
        self.stored = true;
    }

    fn adopt(&mut self, ranking: Arc<Ranking>) {
        self.ranking = Some(ranking);
        self.resolved = None;
    }

    /// The ranking held, if any.
    pub(crate) fn ranking(&self) -> Option<Arc<Ranking>> {
        self.ranking.clone()
    }

    fn resolve(&mut self, config: &SurfaceConfig, catalog: &Catalog) -> Arc<Floor> {
        let version = catalog.version();
        if let Some((v, floor)) = &self.resolved
            && *v == version
        {
            return floor.clone();
        }
        let floor = Arc::new(resolve(config, catalog, self.ranking.as_deref()));
        self.resolved = Some((version, floor.clone()));
        let key = (floor.entries.len(), floor.source);
        if self.checked != Some(key) {
            self.checked = Some(key);
            check_band(config, &floor);
        }
        floor
    }
}

/// Warns when a floor derived from usage is outside `[floor_min, floor_max]` because the
/// settings disagree, with why and what to set. A floor short only because few tools are
/// anchors or have been used yet (a young or small install, which fills it as tools are
/// used), and a fallback floor (no usage recorded yet), are what was configured: not a
/// warning on every command.
fn check_band(config: &SurfaceConfig, floor: &Floor) {
    let n = floor.entries.len();
    if n >= config.floor_min && n <= config.floor_max {
        return;
    }
    if floor.source == FloorSource::Fallback {
        tracing::debug!(
            size = n,
            "no usage recorded yet: the floor is the anchors and fallback_floor until tools are used"
        );
        return;
    }
    let anchors = floor.entries.iter().filter(|e| e.anchor).count();
    let why = if n < config.floor_min {
        if config.target_floor < config.floor_min {
            format!("target_floor ({}) is below floor_min", config.target_floor)
        } else {
            tracing::debug!(
                size = n,
                floor_min = config.floor_min,
                "the resident floor is below floor_min: only these tools are anchors or have recorded usage among the live tools; it fills as tools are used"
            );
            return;
        }
    } else if anchors > config.floor_max {
        format!("the {anchors} anchors alone are more than floor_max")
    } else {
        format!("target_floor ({}) is above floor_max", config.target_floor)
    };
    tracing::warn!(
        "the resident floor has {n} tool(s), outside [surface] floor_min..floor_max ({}..{}): {why}; set floor_min, floor_max or target_floor to agree with what this install fills",
        config.floor_min,
        config.floor_max
    );
}

/// Anchors first, then the highest-ranked live tools up to `target_floor`; the static
/// fallback (after the anchors) when the ranking names no live tool.
fn resolve(config: &SurfaceConfig, catalog: &Catalog, ranking: Option<&Ranking>) -> Floor {
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
    let mut from_usage = 0usize;
    for (name, score) in ranking.map(|r| r.ranked.as_slice()).unwrap_or_default() {
        if entries.len() >= config.target_floor {
            break;
        }
        // The system set is resident anyway (and the most called): a floor slot for it
        // would be wasted. So would one for an agentic-only tool: every mode that lists
        // the floor (chat, delegate, plan) leaves it off.
        if seen.contains(name.as_str())
            || system.contains(name)
            || config
                .agentic_only
                .iter()
                .any(|p| quiver_contract::pattern_matches(p, name))
        {
            continue;
        }
        // A tool not in the catalog now (its upstream may be connecting) leaves its slot
        // to the next one until it registers (the catalog's version changes).
        match catalog.lookup(name) {
            Some(e) if e.spec.is_live() && !e.spec.category.is_internal() => {}
            _ => continue,
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
        written_at: ranking.map_or_else(Instant::now, |r| r.derived_at),
    }
}
