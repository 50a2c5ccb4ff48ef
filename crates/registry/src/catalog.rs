//! The catalog: every registered tool, its compiled validator, and change events.
//!
//! Over 800 lines: registration, the family order, change events and advertising share one lock
//! and one map, and are kept together so that invariant is read in one place.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use quiver_contract::{Finding, Mode, NARRATION_KEYS, Severity, Tool, ToolSpec};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::{RegistryError, sync::lock};

/// One registered tool.
pub struct Entry {
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// Its spec, as registered.
    pub spec: ToolSpec,
    /// The family it was registered by (`core`, `mcp:<server>`, `custom`, ...).
    pub family: Arc<str>,
    pub(crate) validator: jsonschema::Validator,
    /// The compiled output schema, when the tool declares one: a structured success is
    /// checked against it before it leaves the dispatcher.
    pub(crate) output_validator: Option<jsonschema::Validator>,
    /// Narration keys the schema itself declares; those are real arguments, not narration.
    pub(crate) declared_narration: Vec<&'static str>,
    /// Property names, for did-you-mean on unknown arguments.
    pub(crate) properties: Vec<String>,
    /// [`ToolSpec::definition_bytes`] of the spec and of its lightweight form, measured once
    /// (each measure serializes the schema; a round budgets every resident tool).
    bytes: (usize, usize),
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("name", &self.spec.name)
            .field("family", &self.family)
            .finish()
    }
}

/// Whether `schema` declares or requires a property named `key` anywhere in it.
fn names_property(schema: &Value, key: &str) -> bool {
    match schema {
        Value::Object(map) => {
            map.get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key(key))
                || map
                    .get("required")
                    .and_then(Value::as_array)
                    .is_some_and(|r| r.iter().any(|v| v.as_str() == Some(key)))
                || map.values().any(|v| names_property(v, key))
        }
        Value::Array(items) => items.iter().any(|v| names_property(v, key)),
        _ => false,
    }
}

/// A schema compile error in the operator's words: a `$ref` to a URL is one Quiver does not
/// fetch (no network while registering), where jsonschema names its build feature.
fn compile_problem(e: &jsonschema::ValidationError<'_>) -> String {
    let text = e.to_string();
    if text.contains("resolve-http") || text.contains("custom resolver") {
        return format!(
            "it has a `$ref` to a remote schema, which Quiver does not fetch; inline the referenced schema (under `$defs`) instead ({text})"
        );
    }
    text
}

impl Entry {
    fn new(family: &str, tool: Arc<dyn Tool>) -> Result<Entry, RegistryError> {
        let spec = tool.spec().clone();
        spec.validate()?;
        let validator = jsonschema::validator_for(&spec.input_schema).map_err(|e| {
            RegistryError::InvalidSchema {
                name: spec.name.clone(),
                reason: format!("its input schema does not compile: {}", compile_problem(&e)),
            }
        })?;
        let output_validator =
            match &spec.output_schema {
                None => None,
                Some(out) => Some(jsonschema::validator_for(out).map_err(|e| {
                    RegistryError::InvalidSchema {
                        name: spec.name.clone(),
                        reason: format!(
                            "its output schema does not compile: {}",
                            compile_problem(&e)
                        ),
                    }
                })?),
            };
        let props = spec
            .input_schema
            .get("properties")
            .and_then(Value::as_object);
        let properties: Vec<String> = props
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        // A narration key the schema names anywhere (top-level `properties`, or through
        // `$defs`/`$ref`, `allOf` and the like) is a real argument and is never stripped.
        let declared_narration = NARRATION_KEYS
            .into_iter()
            .filter(|k| names_property(&spec.input_schema, k))
            .collect();
        let bytes = (
            spec.definition_bytes(),
            spec.lightweight().definition_bytes(),
        );
        Ok(Entry {
            tool,
            spec,
            family: family.into(),
            validator,
            output_validator,
            declared_narration,
            properties,
            bytes,
        })
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// [`ToolSpec::definition_bytes`] of the spec, or of its lightweight form
    /// ([`ToolSpec::lightweight`]) with `lightweight`; measured at registration.
    pub fn definition_bytes(&self, lightweight: bool) -> usize {
        if lightweight {
            self.bytes.1
        } else {
            self.bytes.0
        }
    }
}

/// A change to the catalog, broadcast to subscribers (the search index, MCP servers that
/// must send `list_changed`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CatalogEvent {
    /// A tool was added (or replaced).
    Added(String),
    /// A tool was removed.
    Removed(String),
}

/// A name a registration skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skipped {
    /// The family that tried to register it.
    pub family: String,
    /// The tool name.
    pub name: String,
    /// Why it was skipped.
    pub reason: String,
    /// Left out on purpose, by a rule the operator cannot act on (an upstream tool that
    /// only runs in a way Quiver does not call): a note, not a fault.
    pub noted: bool,
}

impl Skipped {
    /// A name `family` could not register, and why (an adapter's own refusals, such as an
    /// upstream definition too malformed to become a spec, are reported beside the
    /// catalog's).
    pub fn new(
        family: impl Into<String>,
        name: impl Into<String>,
        reason: impl Into<String>,
    ) -> Skipped {
        Skipped {
            family: family.into(),
            name: name.into(),
            reason: reason.into(),
            noted: false,
        }
    }

    /// A name `family` leaves out on purpose, by a rule the operator cannot act on: told
    /// as a note by `quiver check`, not as a tool missing by fault.
    pub fn noted(
        family: impl Into<String>,
        name: impl Into<String>,
        reason: impl Into<String>,
    ) -> Skipped {
        Skipped {
            noted: true,
            ..Skipped::new(family, name, reason)
        }
    }

    /// Skipped because an earlier registration took the name (first wins), not because the
    /// definition is invalid.
    pub fn is_duplicate(&self) -> bool {
        self.reason == DUPLICATE
    }

    /// What `quiver check` says of it: a duplicate is a note (the name is served, by the
    /// family that took it first); any other is a tool missing from every surface.
    pub fn finding(&self) -> Finding {
        if self.noted {
            Finding::note(format!(
                "{}: [note] left out of family {}: {}",
                self.name, self.family, self.reason
            ))
        } else if self.is_duplicate() {
            Finding::note(format!(
                "{}: [note] skipped in family {}: {}",
                self.name, self.family, self.reason
            ))
        } else {
            Finding::new(
                Severity::NotRegistered,
                format!(
                    "{}: [not registered] {} (family {})",
                    self.name, self.reason, self.family
                ),
            )
        }
    }
}

/// What a bulk registration did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegisterReport {
    /// Names registered, in order.
    pub registered: Vec<String>,
    /// Names skipped (duplicates: first registration wins; invalid specs).
    pub skipped: Vec<Skipped>,
}

impl RegisterReport {
    /// [`Skipped::finding`] of every skipped name, in order.
    pub fn findings(&self) -> Vec<Finding> {
        self.skipped.iter().map(Skipped::finding).collect()
    }

    /// One warning line per family and reason class, e.g.
    /// `server-global MCP: skipped duplicate tool name(s) (2): a, b`.
    pub fn warning_lines(&self) -> Vec<String> {
        let mut groups: BTreeMap<(&str, bool), Vec<&Skipped>> = BTreeMap::new();
        for s in &self.skipped {
            let dup = s.reason == DUPLICATE;
            groups.entry((s.family.as_str(), !dup)).or_default().push(s);
        }
        groups
            .into_iter()
            .map(|((family, not_dup), items)| {
                let dup = !not_dup;
                if dup {
                    let names: Vec<&str> = items.iter().map(|s| s.name.as_str()).collect();
                    format!(
                        "{family}: skipped duplicate tool name(s) ({}): {}",
                        names.len(),
                        names.join(", ")
                    )
                } else {
                    let parts: Vec<String> = items
                        .iter()
                        .map(|s| format!("{} ({})", s.name, s.reason))
                        .collect();
                    format!(
                        "{family}: skipped invalid tool(s) ({}): {}",
                        parts.len(),
                        parts.join("; ")
                    )
                }
            })
            .collect()
    }

    /// Appends another report.
    pub fn extend(&mut self, other: RegisterReport) {
        self.registered.extend(other.registered);
        self.skipped.extend(other.skipped);
    }
}

const DUPLICATE: &str = "duplicate name";

/// The classes of tool families. Which comes first is the host's to say ([`FamilyOrder`]);
/// the catalog applies the order it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Family {
    /// Quiver's own tools (`tool_search`, `describe_tool`).
    Core,
    /// Tools of the MCP servers configured for the whole process. Each server registers as
    /// a family of its own, `mcp:<server>`, of this class.
    ServerMcp,
    /// Tools of the MCP servers a session's client brought.
    ClientMcp,
    /// Curated aliases of upstream tools the operator defines in catalog files (a reviewed
    /// name and description for an MCP server's tool).
    Catalog,
    /// Sandboxed custom tools.
    Custom,
    /// Skills.
    Skills,
}

/// What an MCP server's own family name begins with.
const MCP_FAMILY_PREFIX: &str = "mcp:";

impl Family {
    /// The family name its tools register under when they are assembled as one family
    /// (and in warnings).
    pub const fn name(self) -> &'static str {
        match self {
            Family::Core => "core",
            Family::ServerMcp => "server-global MCP",
            Family::ClientMcp => "client MCP",
            Family::Catalog => "catalog aliases",
            Family::Custom => "custom tools",
            Family::Skills => "skills",
        }
    }

    /// The class of the catalog family named `family`: one of the [`Family::name`]s, or an
    /// MCP server's own family (`mcp:<server>`), which is server-global MCP. `None` for any
    /// other name.
    pub fn of(family: &str) -> Option<Family> {
        if Family::mcp_server(family).is_some() {
            return Some(Family::ServerMcp);
        }
        [
            Family::Core,
            Family::ServerMcp,
            Family::ClientMcp,
            Family::Catalog,
            Family::Custom,
            Family::Skills,
        ]
        .into_iter()
        .find(|f| f.name() == family)
    }

    /// The server whose own family `family` is, when it is one (`mcp:<server>`).
    pub fn mcp_server(family: &str) -> Option<&str> {
        family.strip_prefix(MCP_FAMILY_PREFIX)
    }
}

/// The order of the catalog's families, as the host defines it: the classes, first to
/// last, and the MCP servers' own families in the order they rank among themselves. A
/// family of no listed class comes after all of them; an MCP server's family that is not
/// listed comes after the listed ones (and after a family named for the class itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyOrder {
    classes: Vec<Family>,
    servers: Vec<String>,
}

impl FamilyOrder {
    /// The classes in this order, with no MCP server listed.
    pub fn new(classes: impl IntoIterator<Item = Family>) -> Self {
        FamilyOrder {
            classes: classes.into_iter().collect(),
            servers: Vec::new(),
        }
    }

    /// Lists the MCP servers' own families (`mcp:<server>`), first to last.
    pub fn with_servers(mut self, families: Vec<String>) -> Self {
        self.servers = families;
        self
    }

    /// The classes, first to last.
    pub fn classes(&self) -> &[Family] {
        &self.classes
    }

    /// Where the family named `family` stands (lower first).
    pub fn rank(&self, family: &str) -> usize {
        let slots = self.servers.len() + 2;
        let class = Family::of(family)
            .and_then(|c| self.classes.iter().position(|f| *f == c))
            .unwrap_or(self.classes.len());
        let within = if Family::mcp_server(family).is_some() {
            self.servers
                .iter()
                .position(|s| s == family)
                .map_or(slots - 1, |i| i + 1)
        } else {
            0
        };
        class * slots + within
    }
}

/// A family's tools, for ordered assembly.
pub struct FamilyTools {
    /// The family's name, as it appears in the declared order and in warnings.
    pub name: String,
    /// Its tools, in registration order.
    pub tools: Vec<Arc<dyn Tool>>,
}

impl fmt::Debug for FamilyTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FamilyTools")
            .field("name", &self.name)
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl FamilyTools {
    /// A family's tools.
    pub fn new(name: impl Into<String>, tools: Vec<Arc<dyn Tool>>) -> Self {
        FamilyTools {
            name: name.into(),
            tools,
        }
    }
}

/// Puts `families` in the declared `order`. Fails on a name in the order that no family has,
/// on a family whose name is not in the order, and on a family given twice.
pub fn order_families(
    order: &[&str],
    families: Vec<FamilyTools>,
) -> Result<Vec<FamilyTools>, RegistryError> {
    let mut by_name: BTreeMap<String, FamilyTools> = BTreeMap::new();
    for fam in families {
        if !order.contains(&fam.name.as_str()) {
            return Err(RegistryError::Assembly(format!(
                "family `{}` is not in the declared order [{}]",
                fam.name,
                order.join(", ")
            )));
        }
        if by_name.contains_key(&fam.name) {
            return Err(RegistryError::Assembly(format!(
                "family `{}` is given twice",
                fam.name
            )));
        }
        by_name.insert(fam.name.clone(), fam);
    }
    order
        .iter()
        .map(|name| {
            by_name.remove(*name).ok_or_else(|| {
                RegistryError::Assembly(format!(
                    "family `{name}` is in the declared order but no family provides it"
                ))
            })
        })
        .collect()
}

/// How [`Catalog::advertised_specs`] shapes what the model sees.
#[non_exhaustive]
pub struct AdvertiseOptions<'a> {
    /// Inject an optional `reasoning` property into every advertised schema.
    pub inject_reasoning: bool,
    /// Tools that get no injected `reasoning` property.
    pub reasoning_exempt: &'a [String],
    /// Whether a progressive tool has been loaded by the session (then its full spec shows).
    pub loaded: &'a (dyn Fn(&str) -> bool + Sync),
}

impl fmt::Debug for AdvertiseOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdvertiseOptions")
            .field("inject_reasoning", &self.inject_reasoning)
            .field("reasoning_exempt", &self.reasoning_exempt)
            .finish_non_exhaustive()
    }
}

fn nothing_loaded(_: &str) -> bool {
    false
}

impl Default for AdvertiseOptions<'_> {
    fn default() -> Self {
        static EXEMPT: std::sync::LazyLock<Vec<String>> =
            std::sync::LazyLock::new(|| vec!["plan".to_owned()]);
        AdvertiseOptions {
            inject_reasoning: true,
            reasoning_exempt: &EXEMPT,
            loaded: &nothing_loaded,
        }
    }
}

impl<'a> AdvertiseOptions<'a> {
    /// Sets the loaded-check for progressive tools.
    pub fn with_loaded(mut self, loaded: &'a (dyn Fn(&str) -> bool + Sync)) -> Self {
        self.loaded = loaded;
        self
    }

    /// Turns reasoning injection on or off.
    pub fn with_reasoning(mut self, inject: bool) -> Self {
        self.inject_reasoning = inject;
        self
    }

    /// Sets the exempt list.
    pub fn with_exempt(mut self, exempt: &'a [String]) -> Self {
        self.reasoning_exempt = exempt;
        self
    }
}

/// The description of the injected `reasoning` property.
pub(crate) const REASONING_DESCRIPTION: &str = "Why you chose this tool and these arguments (optional; recorded for audit, never passed to the tool).";

/// Every registered tool, shared and thread-safe.
pub struct Catalog {
    tools: RwLock<BTreeMap<String, Arc<Entry>>>,
    events: broadcast::Sender<CatalogEvent>,
    version: AtomicU64,
    /// Held while a change bumps the version and sends its event, so events go out in
    /// version order and [`Catalog::subscribe_at`] reads a version that matches its
    /// subscription.
    order: Mutex<()>,
    /// The families' registration order, if set.
    rank: RwLock<Option<FamilyOrder>>,
    /// Entries whose name a family earlier in the order took after them, by name: they
    /// come back when that family's tool goes.
    shadowed: Mutex<BTreeMap<String, Arc<Entry>>>,
    /// Who can say why a name that is not here now would be (an MCP server that is
    /// configured but not connected).
    absent: RwLock<Vec<AbsentExplainer>>,
    /// Names held off: disabled (or not approved) in the store. Their entries wait in
    /// `held_entries`, out of every lookup and list, until the hold is lifted; a tool of
    /// such a name that registers meanwhile waits there too. Locked before `tools`.
    held: Mutex<BTreeSet<String>>,
    held_entries: Mutex<BTreeMap<String, Arc<Entry>>>,
}

/// Says why a tool name missing from the catalog is missing, when its provider knows
/// (`Some("MCP server \"git\" is not connected: ...")`), or `None` when the name is
/// none of its.
pub type AbsentExplainer = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog").field("len", &self.len()).finish()
    }
}

impl Default for Catalog {
    fn default() -> Self {
        Self::new()
    }
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        Catalog {
            tools: RwLock::new(BTreeMap::new()),
            events,
            version: AtomicU64::new(0),
            order: Mutex::new(()),
            rank: RwLock::new(None),
            shadowed: Mutex::new(BTreeMap::new()),
            absent: RwLock::new(Vec::new()),
            held: Mutex::new(BTreeSet::new()),
            held_entries: Mutex::new(BTreeMap::new()),
        }
    }

    /// Holds off exactly the tools named in `names` (the store disabled them, or has them
    /// unapproved): a held tool leaves every lookup and list (a `Removed` event) and comes
    /// back when a later call leaves its name out (an `Added` event); a tool that registers
    /// under a held name waits until then. Returns the names newly held off and released.
    pub fn hold_off(&self, names: BTreeSet<String>) -> (Vec<String>, Vec<String>) {
        let mut held = lock(&self.held);
        let newly: Vec<String> = names.difference(&held).cloned().collect();
        let released: Vec<String> = held.difference(&names).cloned().collect();
        *held = names;
        let mut events = Vec::new();
        {
            let mut tools = self.write();
            let mut waiting = lock(&self.held_entries);
            for name in &newly {
                if let Some(entry) = tools.remove(name) {
                    waiting.insert(name.clone(), entry);
                    events.push(CatalogEvent::Removed(name.clone()));
                }
            }
            for name in &released {
                if let Some(entry) = waiting.remove(name)
                    && !tools.contains_key(name)
                {
                    tools.insert(name.clone(), entry);
                    events.push(CatalogEvent::Added(name.clone()));
                }
            }
        }
        drop(held);
        for event in events {
            self.changed(event);
        }
        (newly, released)
    }

    /// Keeps `entry` waiting if its name is held off; gives it back otherwise.
    fn unless_held(&self, entry: Arc<Entry>) -> Option<Arc<Entry>> {
        let held = lock(&self.held);
        if held.contains(&entry.spec.name) {
            lock(&self.held_entries).insert(entry.spec.name.clone(), entry);
            return None;
        }
        Some(entry)
    }

    /// Adds a provider's explanation of names it would register but has not (yet): the
    /// dispatcher answers a call to such a name with that reason (`not_available`) rather
    /// than as an unknown tool with look-alikes from other providers.
    pub fn add_absent_explainer(&self, explain: AbsentExplainer) {
        self.absent
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(explain);
    }

    /// Why `name` is not in the catalog now, if a provider knows.
    pub fn why_absent(&self, name: &str) -> Option<String> {
        let explainers = self
            .absent
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        explainers.iter().find_map(|e| e(name))
    }

    /// Sets the families' registration order, so that the first registration *in that
    /// order* wins whenever each family registers: a family that connects late (an MCP
    /// server) takes a name from a later family (skills) that registered before it, and the
    /// later family's tool comes back if it goes. Without an order, the first registration
    /// in time wins.
    pub fn set_family_order(&self, order: FamilyOrder) {
        *self.rank.write().unwrap_or_else(|p| p.into_inner()) = Some(order);
    }

    /// Whether `family` comes before `held` in the order.
    fn outranks(&self, family: &str, held: &str) -> bool {
        self.rank
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|order| order.rank(family) < order.rank(held))
    }

    /// The tools that gave their name to a family earlier in the order (see
    /// [`Catalog::set_family_order`]) and are out of the catalog until it lets go, each as a
    /// duplicate skipped in its own family.
    pub fn shadowed(&self) -> Vec<Skipped> {
        let shadowed = lock(&self.shadowed);
        shadowed
            .iter()
            .map(|(name, e)| Skipped::new(e.family.to_string(), name.clone(), DUPLICATE))
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.tools.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.tools.write().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self, event: CatalogEvent) {
        let _order = lock(&self.order);
        self.version.fetch_add(1, Ordering::Release);
        let _ = self.events.send(event);
    }

    /// Subscribes to changes. A lagging subscriber should resync from [`Catalog::tools`].
    pub fn subscribe(&self) -> broadcast::Receiver<CatalogEvent> {
        self.events.subscribe()
    }

    /// Subscribes to changes, with the version the catalog had then: the `n`-th event the
    /// receiver gets (counting the ones a lag skips) is the change to version `at + n`, so
    /// a subscriber can say which version it has caught up with. Every change up to a
    /// version is in [`Catalog::tools`] before the version is reached.
    pub fn subscribe_at(&self) -> (broadcast::Receiver<CatalogEvent>, u64) {
        let _order = lock(&self.order);
        (self.events.subscribe(), self.version())
    }

    /// A counter bumped by every change (after the change is made, before its event is
    /// sent).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Registers a tool in the `core` family; a taken name is a [`RegistryError::Conflict`].
    pub fn register(&self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        self.register_in("core", tool)
    }

    /// Registers a tool in a family; a taken name is a [`RegistryError::Conflict`].
    pub fn register_in(&self, family: &str, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let entry = Arc::new(Entry::new(family, tool)?);
        let Some(entry) = self.unless_held(entry) else {
            return Ok(());
        };
        let name = entry.spec.name.clone();
        {
            let mut tools = self.write();
            if let Some(held) = tools.get(&name) {
                if !self.outranks(family, &held.family) {
                    return Err(RegistryError::Conflict { name });
                }
                let held = tools.insert(name.clone(), entry).expect("held above");
                tracing::warn!(
                    tool = %name,
                    "{}: skipped duplicate tool name: {family} comes first in the family order (it is back if {family} drops the name)",
                    held.family
                );
                lock(&self.shadowed).insert(name.clone(), held);
            } else {
                tools.insert(name.clone(), entry);
            }
        }
        self.changed(CatalogEvent::Added(name));
        Ok(())
    }

    /// Registers a tool at start-up; panics on any error (a programming mistake).
    pub fn must_register(&self, tool: Arc<dyn Tool>) {
        if let Err(e) = self.register(tool) {
            panic!("must_register: {e}");
        }
    }

    /// Registers many tools first-wins, skipping and continuing past duplicates and invalid
    /// specs; the report names every skipped tool.
    pub fn register_all(&self, family: &str, tools: Vec<Arc<dyn Tool>>) -> RegisterReport {
        let mut report = RegisterReport::default();
        for tool in tools {
            let name = tool.spec().name.clone();
            match self.register_in(family, tool) {
                Ok(()) => report.registered.push(name),
                Err(RegistryError::Conflict { name }) => {
                    report.skipped.push(Skipped::new(family, name, DUPLICATE))
                }
                Err(e) => report
                    .skipped
                    .push(Skipped::new(family, name, e.to_string())),
            }
        }
        report
    }

    /// Registers families in the given order (see [`order_families`]), first-wins.
    pub fn register_families(&self, families: Vec<FamilyTools>) -> RegisterReport {
        let mut report = RegisterReport::default();
        for fam in families {
            report.extend(self.register_all(&fam.name, fam.tools));
        }
        report
    }

    /// Replaces (or adds) a tool in place: for a source whose tool changed its definition.
    pub fn upsert_in(&self, family: &str, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let entry = Arc::new(Entry::new(family, tool)?);
        let Some(entry) = self.unless_held(entry) else {
            return Ok(());
        };
        let name = entry.spec.name.clone();
        let new_tool = entry.tool.clone();
        let old = self.write().insert(name.clone(), entry);
        if let Some(old) = old
            && !Arc::ptr_eq(&old.tool, &new_tool)
        {
            old.tool.release();
        }
        self.changed(CatalogEvent::Added(name));
        Ok(())
    }

    /// Removes a tool and releases its resources.
    pub fn remove(&self, name: &str) -> Option<Arc<Entry>> {
        if let Some(waiting) = lock(&self.held_entries).remove(name) {
            waiting.tool.release();
        }
        let (removed, back) = {
            let mut tools = self.write();
            let removed = tools.remove(name);
            // A tool a family earlier in the order had shadowed takes its name back.
            let back = removed
                .as_ref()
                .and_then(|_| lock(&self.shadowed).remove(name));
            if let Some(entry) = &back {
                tools.insert(name.to_owned(), entry.clone());
            }
            (removed, back.is_some())
        };
        if let Some(entry) = &removed {
            entry.tool.release();
            self.changed(if back {
                CatalogEvent::Added(name.to_owned())
            } else {
                CatalogEvent::Removed(name.to_owned())
            });
        }
        removed
    }

    /// Removes every tool of a family; returns their names.
    pub fn remove_family(&self, family: &str) -> Vec<String> {
        // Its shadowed tools go too (they would otherwise come back later).
        let gone: Vec<Arc<Entry>> = {
            let mut shadowed = lock(&self.shadowed);
            let names: Vec<String> = shadowed
                .iter()
                .filter(|(_, e)| &*e.family == family)
                .map(|(n, _)| n.clone())
                .collect();
            names.iter().filter_map(|n| shadowed.remove(n)).collect()
        };
        let waiting: Vec<Arc<Entry>> = {
            let mut waiting = lock(&self.held_entries);
            let names: Vec<String> = waiting
                .iter()
                .filter(|(_, e)| &*e.family == family)
                .map(|(n, _)| n.clone())
                .collect();
            names.iter().filter_map(|n| waiting.remove(n)).collect()
        };
        for entry in gone.into_iter().chain(waiting) {
            entry.tool.release();
        }
        let names: Vec<String> = self
            .read()
            .values()
            .filter(|e| &*e.family == family)
            .map(|e| e.spec.name.clone())
            .collect();
        for name in &names {
            self.remove(name);
        }
        names
    }

    /// Looks a tool up by exact name, whatever its visibility.
    pub fn lookup(&self, name: &str) -> Option<Arc<Entry>> {
        self.read().get(name).cloned()
    }

    /// Whether a name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Every registered tool, sorted by name.
    pub fn tools(&self) -> Vec<Arc<Entry>> {
        self.read().values().cloned().collect()
    }

    /// Every registered name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// The names of one family, sorted.
    pub fn family_names(&self, family: &str) -> BTreeSet<String> {
        self.read()
            .values()
            .filter(|e| &*e.family == family)
            .map(|e| e.spec.name.clone())
            .collect()
    }

    /// The tools listed in `mode`: live, not internal, passing plan-mode rules; by name.
    pub fn available(&self, mode: Mode) -> Vec<Arc<Entry>> {
        self.read()
            .values()
            .filter(|e| e.spec.listed_in(mode))
            .cloned()
            .collect()
    }

    /// The specs listed in `mode`, by name.
    pub fn specs(&self, mode: Mode) -> Vec<ToolSpec> {
        self.read()
            .values()
            .filter(|e| e.spec.listed_in(mode))
            .map(|e| e.spec.clone())
            .collect()
    }

    /// The specs listed in `mode` as the model should see them: lightweight specs for
    /// progressive tools not yet loaded, and the injected `reasoning` property.
    pub fn advertised_specs(&self, mode: Mode, opts: &AdvertiseOptions<'_>) -> Vec<ToolSpec> {
        self.specs(mode)
            .into_iter()
            .map(|spec| advertise(spec, opts))
            .collect()
    }
}

/// What [`advertise`] adds to the definition bytes of the spec it starts from (the
/// lightweight spec when `spec` is progressive and not loaded): the injected `reasoning`
/// property, if any. Exact, and without cloning or serializing the schema, so that a walk
/// that only measures can budget as the one that advertises.
pub fn advertised_extra_bytes(spec: &ToolSpec, loaded: bool, opts: &AdvertiseOptions<'_>) -> usize {
    if !opts.inject_reasoning || opts.reasoning_exempt.iter().any(|n| n == &spec.name) {
        return 0;
    }
    static PROPERTY: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
        let value = json!({"type": "string", "description": REASONING_DESCRIPTION});
        // `"reasoning":` and the value.
        "\"reasoning\":".len() + serde_json::to_string(&value).map_or(0, |s| s.len())
    });
    // A lightweight spec's schema is `{"type":"object","additionalProperties":true}`.
    if spec.progressive && !loaded {
        return "\"properties\":{}".len() + 1 + *PROPERTY;
    }
    let Some(obj) = spec.input_schema.as_object() else {
        return 0;
    };
    match obj.get("properties") {
        // `"properties":{...}`, after a comma unless the schema was empty.
        None => "\"properties\":{}".len() + usize::from(!obj.is_empty()) + *PROPERTY,
        Some(Value::Object(props)) if !props.contains_key("reasoning") => {
            usize::from(!props.is_empty()) + *PROPERTY
        }
        Some(_) => 0,
    }
}

/// Shapes one spec for the model, as [`Catalog::advertised_specs`] does: the lightweight spec
/// of a progressive tool not yet loaded, and the optional injected `reasoning` property.
pub fn advertise(spec: ToolSpec, opts: &AdvertiseOptions<'_>) -> ToolSpec {
    let mut spec = if spec.progressive && !(opts.loaded)(&spec.name) {
        spec.lightweight()
    } else {
        spec
    };
    if opts.inject_reasoning
        && !opts.reasoning_exempt.iter().any(|n| n == &spec.name)
        && let Some(obj) = spec.input_schema.as_object_mut()
    {
        let props = obj.entry("properties").or_insert_with(|| json!({}));
        if let Some(props) = props.as_object_mut() {
            props
                .entry("reasoning")
                .or_insert_with(|| json!({"type": "string", "description": REASONING_DESCRIPTION}));
        }
    }
    spec
}
