//! Custom tools: JavaScript tools that an operator writes (`quiver custom add`) or a session
//! with an admin token proposes (`create_custom_tool`). The [`DefinitionStore`] is their
//! source of truth: each has its source, test cases, a version and a status (draft → testing
//! → approved | rejected). Jobs (build, audit, rebuild: see the `jobs` module) compile a
//! version and run its own test cases in the [`Sandbox`]; approving is the operator's call. Only approved and enabled tools are served, from the
//! catalog's `custom` family, by [`CustomTools::sync`], which every running server calls
//! when the store's [`DefinitionStore::definitions_version`] moves, so an approval or a
//! disable made by another process goes live without a restart.
//!
//! An edit of an approved tool is kept beside it as its [`PendingVersion`]: the approved
//! version stays live until the new one passes its audit and is approved.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use quiver_contract::{Lifecycle, Tool, ToolSpec, validate_tool_name};
use serde_json::{Value, json};

mod draft;
mod jobs;
mod tools;

pub use draft::{CustomDraft, Expect, PendingVersion, TestCase};
pub use jobs::{Added, AuditReport, JobLease};

use tools::CustomTool;
pub use tools::{PROPOSE_TOOL, ProposalAdmins, proposal_tool};

/// The most test cases one custom tool may have: a build runs them all, one after another,
/// each up to the sandbox's time limit, and the jobs on a store run one at a time.
pub const MAX_TEST_CASES: usize = 25;

use crate::{
    Catalog,
    sandbox::{Sandbox, SandboxError, SandboxLimits},
    store::{DefinitionStore, JobStore, JobType, StoreError, ToolDefinition, ToolType},
};

/// The catalog family custom tools are served in ([`crate::Family::Custom`]'s name): the
/// family order puts it after the core tools and the MCP servers' and before the skills.
pub const CUSTOM_FAMILY: &str = "custom tools";

/// Why a custom-tool operation was refused; each says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CustomError {
    /// The draft is not acceptable (a name, a schema, a test case, a syntax error).
    #[error("{0}")]
    Invalid(String),
    /// No custom tool has that name.
    #[error(
        "there is no custom tool named `{0}` (`quiver custom list` shows them; an MCP server's tool can be disabled once `quiver serve` has listed it)"
    )]
    NotFound(String),
    /// The name belongs to a tool that is not a custom tool.
    #[error("`{0}` is not a custom tool (it is a {1} tool), so it cannot be changed here")]
    NotCustom(String, &'static str),
    /// The operation does not fit the tool's status.
    #[error("{0}")]
    Status(String),
    /// The job (by id) was released to another worker while it ran here: its heartbeat did
    /// not reach the store within the stale bound. It stopped here, recording nothing.
    #[error(
        "custom-tool job `{0}` was released while it ran here (its heartbeat did not reach the store within the stale bound) and is queued again for another worker; it stopped here"
    )]
    Released(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A version of a custom tool as it is reviewed: the live row's, or its pending one's.
#[derive(Debug, Clone)]
struct Reviewed {
    version: u32,
    source: String,
    test_cases: Value,
    status: Lifecycle,
    test_results: Option<Value>,
    pending: bool,
}

/// Custom tools over a store and a sandbox.
pub struct CustomTools {
    store: Arc<dyn DefinitionStore>,
    jobs: Arc<dyn JobStore>,
    sandbox: Arc<dyn Sandbox>,
    limits: SandboxLimits,
    /// How a running job is kept and released.
    lease: jobs::JobLease,
    /// The definitions served now, by name, as last synced.
    served: std::sync::Mutex<HashMap<String, ToolDefinition>>,
    /// The ids of the jobs running in this process ([`CustomTools::hand_back`]).
    running: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// How many jobs the host's job worker runs at once.
    workers: usize,
    /// Names a family that always registers before the custom tools holds, with that
    /// family ([`CustomTools::with_reserved`]).
    reserved: BTreeMap<String, String>,
}

impl std::fmt::Debug for CustomTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomTools")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn lifecycle_name(status: Lifecycle) -> &'static str {
    status.as_str()
}

fn parse_status(s: &str) -> Lifecycle {
    crate::store::parse_lifecycle(s).unwrap_or(Lifecycle::Draft)
}

impl CustomTools {
    /// Custom tools kept in `store`, audited through `jobs`, run in `sandbox` within `limits`.
    pub fn new(
        store: Arc<dyn DefinitionStore>,
        jobs: Arc<dyn JobStore>,
        sandbox: Arc<dyn Sandbox>,
        limits: SandboxLimits,
    ) -> Self {
        CustomTools {
            store,
            jobs,
            sandbox,
            limits,
            lease: jobs::JobLease::default(),
            served: std::sync::Mutex::new(HashMap::new()),
            running: std::sync::Mutex::new(std::collections::BTreeSet::new()),
            workers: 1,
            reserved: BTreeMap::new(),
        }
    }

    /// The same, with the names of Quiver's own tools (the host's core family, the `skill`
    /// tool, the resource tools), each with its family's name: a custom tool of such a name
    /// is never served (not even where its family comes after the custom tools, where it
    /// would hide Quiver's tool), so [`CustomTools::check`] refuses it, and
    /// [`CustomTools::taken_by`] says why one stored before is not served.
    pub fn with_reserved<N, F>(mut self, names: impl IntoIterator<Item = (N, F)>) -> Self
    where
        N: Into<String>,
        F: Into<String>,
    {
        self.reserved
            .extend(names.into_iter().map(|(n, f)| (n.into(), f.into())));
        self
    }

    /// The family that always holds `name` before the custom tools do, if one does: a custom
    /// tool of that name is not served (see [`CustomTools::with_reserved`]).
    pub fn taken_by(&self, name: &str) -> Option<&str> {
        self.reserved.get(name).map(String::as_str)
    }

    /// The same, its jobs held by `lease` (the default: [`JobLease::DEFAULT_STALE`]).
    pub fn with_lease(mut self, lease: JobLease) -> Self {
        self.lease = lease;
        self
    }

    /// The same, its job worker running up to `workers` jobs at once (at least one; the
    /// default is one).
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// How many jobs its job worker runs at once.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The limits runs get.
    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// How its jobs are kept and released.
    pub fn lease(&self) -> JobLease {
        self.lease
    }

    /// Checks a draft whole, before anything is stored: the name, the description, the
    /// schema, the source (compiled, never run), and the test cases' inputs against the
    /// schema.
    pub fn check(&self, draft: &CustomDraft) -> Result<(), CustomError> {
        let invalid = |why: String| Err(CustomError::Invalid(why));
        match validate_tool_name(&draft.name) {
            Ok(quiver_contract::NameKind::Native) => {}
            Ok(_) => {
                return invalid(format!(
                    "`{}` is an MCP tool's name (`mcp__server__tool`); a custom tool takes a native name, e.g. `sum_invoices`",
                    draft.name
                ));
            }
            Err(e) => return invalid(format!("{e}")),
        }
        if let Some(family) = self.taken_by(&draft.name) {
            return invalid(format!(
                "the name `{0}` is taken by Quiver's own tool `{0}` (the `{family}` family), so a custom tool of that name is never served: choose another name, e.g. `my_{0}`",
                draft.name
            ));
        }
        if draft.description.trim().is_empty() {
            return invalid("the description is empty: say what the tool does, for the model that will choose it".into());
        }
        // What the model reads of the tool is what an operator approves from `custom show`:
        // nothing in it may be invisible there.
        if let Some(why) = hidden_in_definition(&draft.description, &draft.input_schema, "the tool")
        {
            return invalid(why);
        }
        if draft.input_schema.get("type").and_then(Value::as_str) != Some("object") {
            return invalid("the input schema must be a JSON Schema whose root is `{\"type\": \"object\", ...}`".into());
        }
        let validator = match jsonschema::validator_for(&draft.input_schema) {
            Ok(v) => v,
            Err(e) => return invalid(format!("the input schema is not a valid JSON Schema: {e}")),
        };
        if let Err(e) = self.sandbox.validate(&draft.source, &self.limits) {
            return invalid(match e {
                SandboxError::Syntax {
                    line,
                    column,
                    message,
                } => {
                    format!("the source does not compile: line {line}, column {column}: {message}")
                }
                SandboxError::SourceTooLarge => format!(
                    "the source is refused: it is {} bytes, larger than the source limit of {} KiB ({} bytes; `[sandbox] source_kib`)",
                    draft.source.len(),
                    self.limits.source_bytes / 1024,
                    self.limits.source_bytes
                ),
                other => format!("the source is refused: {other}"),
            });
        }
        if draft.tests.len() > MAX_TEST_CASES {
            return invalid(format!(
                "{} test cases are more than the {MAX_TEST_CASES} a tool may have: a build runs every case in the sandbox, each up to its time limit ({} ms, `[sandbox] wall_time_ms`), before the next job on the store; keep the cases that tell its behaviours apart",
                draft.tests.len(),
                self.limits.wall_time.as_millis()
            ));
        }
        for (i, case) in draft.tests.iter().enumerate() {
            if let Some(e) = validator.iter_errors(&case.inputs).next() {
                return invalid(format!(
                    "test case {} (index {i}): its inputs do not fit the input schema: {e}",
                    i + 1
                ));
            }
        }
        Ok(())
    }

    /// Stores `draft` after [`CustomTools::check`] and queues its build job (the source
    /// compiled and its test cases run; [`CustomTools::run_job`] runs it, or a server's job
    /// worker does): a new tool as a draft at version 1; a new version of an existing custom
    /// tool as a draft that waits beside the approved one (or replaces a version never
    /// approved).
    pub async fn add(&self, draft: CustomDraft) -> Result<Added, CustomError> {
        self.check(&draft)?;
        let name = draft.name.clone();
        let version = self.store_draft(draft).await?;
        let job = self.queue(&name, JobType::Build).await?;
        Ok(Added { version, job })
    }

    /// Stores a checked draft; returns the version stored.
    async fn store_draft(&self, draft: CustomDraft) -> Result<u32, CustomError> {
        let test_cases = Value::Array(draft.tests.iter().map(TestCase::to_json).collect());
        match self.store.definition(&draft.name).await? {
            Some(old) if old.deleted_at.is_none() && old.tool_type != ToolType::Custom => {
                Err(CustomError::NotCustom(draft.name, old.tool_type.as_str()))
            }
            Some(mut old) if old.deleted_at.is_none() && old.status == Lifecycle::Approved => {
                // A second edit under review replaces the first, under the same number.
                let version = pending_of(&old).map_or(old.version + 1, |p| p.version);
                let pending = PendingVersion {
                    version,
                    description: draft.description,
                    input_schema: draft.input_schema,
                    source: draft.source,
                    test_cases,
                    status: lifecycle_name(Lifecycle::Draft).into(),
                    test_results: None,
                    rejection_reason: None,
                };
                old.pending = Some(serde_json::to_value(&pending).unwrap_or(Value::Null));
                self.store.put_definition(old).await?;
                Ok(version)
            }
            old => {
                let version = old
                    .as_ref()
                    .filter(|o| o.tool_type == ToolType::Custom)
                    .map_or(1, |o| o.version + 1);
                let spec = ToolSpec::new(draft.name.clone(), draft.description)
                    .with_schema(draft.input_schema)
                    .with_lifecycle(Lifecycle::Draft);
                let mut def = ToolDefinition::from_spec(&spec, ToolType::Custom, draft.source);
                def.version = version;
                def.created_by = draft.created_by;
                def.test_cases = Some(test_cases);
                self.store.put_definition(def).await?;
                Ok(version)
            }
        }
    }

    async fn custom(&self, name: &str) -> Result<ToolDefinition, CustomError> {
        match self.store.definition(name).await? {
            Some(d) if d.deleted_at.is_none() && d.tool_type == ToolType::Custom => Ok(d),
            Some(d) if d.deleted_at.is_none() => Err(CustomError::NotCustom(
                name.to_owned(),
                d.tool_type.as_str(),
            )),
            _ => Err(CustomError::NotFound(name.to_owned())),
        }
    }

    fn reviewed(def: &ToolDefinition) -> Reviewed {
        match pending_of(def) {
            Some(p) => Reviewed {
                version: p.version,
                source: p.source,
                test_cases: p.test_cases,
                status: parse_status(&p.status),
                test_results: p.test_results,
                pending: true,
            },
            None => Reviewed {
                version: def.version,
                source: def.implementation.clone(),
                test_cases: def.test_cases.clone().unwrap_or_else(|| json!([])),
                status: def.status,
                test_results: def.test_results.clone(),
                pending: false,
            },
        }
    }

    /// Writes the reviewed version's status, results and reason.
    async fn set_review(
        &self,
        mut def: ToolDefinition,
        status: Lifecycle,
        test_results: Option<Value>,
        reason: Option<String>,
    ) -> Result<(), CustomError> {
        match pending_of(&def) {
            Some(mut p) => {
                p.status = lifecycle_name(status).into();
                if test_results.is_some() {
                    p.test_results = test_results;
                }
                p.rejection_reason = reason;
                def.pending = Some(serde_json::to_value(&p).unwrap_or(Value::Null));
            }
            None => {
                def.status = status;
                if test_results.is_some() {
                    def.test_results = test_results;
                }
                def.rejection_reason = reason;
            }
        }
        self.store.put_definition(def).await?;
        Ok(())
    }

    /// Approves the version under review. It must have passed its audit with at least one
    /// test case, unless `force` (then the override is in the returned note, for the log).
    /// A pending version replaces the live one.
    pub async fn approve(&self, name: &str, force: bool) -> Result<String, CustomError> {
        let mut def = self.custom(name).await?;
        let reviewed = Self::reviewed(&def);
        if reviewed.status == Lifecycle::Approved && !reviewed.pending {
            return Err(CustomError::Status(format!(
                "`{name}` version {} is already approved",
                reviewed.version
            )));
        }
        let results = reviewed.test_results.clone();
        let audited_version = results
            .as_ref()
            .and_then(|r| r.get("version"))
            .and_then(Value::as_u64);
        let passed = results
            .as_ref()
            .and_then(|r| r.get("passed"))
            .and_then(Value::as_bool)
            == Some(true)
            && audited_version == Some(u64::from(reviewed.version));
        let cases = results
            .as_ref()
            .and_then(|r| r.get("cases"))
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let note = match (passed, cases, force) {
            (true, 1.., _) => format!("`{name}` version {} approved", reviewed.version),
            (_, _, true) => format!(
                "`{name}` version {} approved by override (--force): {}",
                reviewed.version,
                if !passed {
                    "its audit did not pass"
                } else {
                    "it has no test cases"
                }
            ),
            (true, 0, false) => {
                return Err(CustomError::Status(format!(
                    "`{name}` has no test cases, so its audit proves nothing: add cases (`quiver custom add ... --tests T.json`), or approve it with --force"
                )));
            }
            (false, _, false) => {
                return Err(CustomError::Status(format!(
                    "`{name}` version {} has not passed an audit: run `quiver custom test {name}` (or approve it with --force)",
                    reviewed.version
                )));
            }
        };
        if let Some(p) = pending_of(&def) {
            def.version = p.version;
            def.description = p.description;
            def.input_schema = p.input_schema;
            def.implementation = p.source;
            def.test_cases = Some(p.test_cases);
            def.test_results = p.test_results;
            def.pending = None;
        }
        def.status = Lifecycle::Approved;
        def.rejection_reason = None;
        if force && !(passed && cases > 0) {
            // The override stays on the record, beside the results it overrode.
            let mut results = def.test_results.take().unwrap_or_else(|| json!({}));
            if let Value::Object(map) = &mut results {
                map.insert("override".into(), json!(note));
            }
            def.test_results = Some(results);
        }
        self.store.put_definition(def).await?;
        Ok(note)
    }

    /// Turns the version under review down, with the operator's reason.
    pub async fn reject(&self, name: &str, reason: &str) -> Result<(), CustomError> {
        let def = self.custom(name).await?;
        let reviewed = Self::reviewed(&def);
        if reviewed.status == Lifecycle::Approved && !reviewed.pending {
            return Err(CustomError::Status(if def.enabled {
                format!(
                    "`{name}` version {} is approved and live, with no version under review to reject: disable it (`quiver custom disable {name}`) to take it off",
                    reviewed.version
                )
            } else {
                format!(
                    "`{name}` version {} is approved and already disabled, so it is not served; there is no version under review to reject (`quiver custom add` stores one; `quiver custom enable {name}` serves it again)",
                    reviewed.version
                )
            }));
        }
        self.set_review(def, Lifecycle::Rejected, None, Some(reason.to_owned()))
            .await
    }

    /// Enables or disables a custom tool (a disabled tool is neither listed nor callable).
    /// An MCP server's tool can be disabled too, once the store has recorded it (`quiver
    /// serve` records every tool it lists): it is held off the catalog while disabled. The
    /// built-in tools cannot be.
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), CustomError> {
        match self.store.definition(name).await? {
            Some(d) if d.deleted_at.is_none() && d.tool_type == ToolType::System => {
                return Err(CustomError::NotCustom(
                    name.to_owned(),
                    d.tool_type.as_str(),
                ));
            }
            Some(d) if d.deleted_at.is_none() => {}
            _ => return Err(CustomError::NotFound(name.to_owned())),
        }
        self.store.set_enabled(name, enabled).await?;
        Ok(())
    }

    /// Every custom tool, by name.
    pub async fn list(&self) -> Result<Vec<ToolDefinition>, CustomError> {
        let mut all: Vec<ToolDefinition> = self
            .store
            .all_definitions()
            .await?
            .into_iter()
            .filter(|d| d.tool_type == ToolType::Custom && d.deleted_at.is_none())
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// The tools an operator disabled that would be served otherwise: an MCP server's tool
    /// the store has recorded, or an approved custom tool; by name. Models never see them;
    /// an operator's listing names them so they can be found and enabled again.
    pub async fn disabled(&self) -> Result<Vec<ToolDefinition>, CustomError> {
        let mut all: Vec<ToolDefinition> = self
            .store
            .all_definitions()
            .await?
            .into_iter()
            .filter(|d| {
                d.deleted_at.is_none()
                    && !d.enabled
                    && match d.tool_type {
                        ToolType::Mcp => true,
                        ToolType::Custom => d.status == Lifecycle::Approved,
                        _ => false,
                    }
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// One custom tool.
    pub async fn show(&self, name: &str) -> Result<ToolDefinition, CustomError> {
        self.custom(name).await
    }

    /// The tool that serves `def` (approved, enabled) from the sandbox.
    pub fn tool(&self, def: &ToolDefinition) -> Arc<dyn Tool> {
        let spec = ToolSpec::new(def.name.clone(), def.description.clone())
            .with_schema(def.input_schema.clone());
        Arc::new(CustomTool {
            spec,
            source: def.implementation.clone().into(),
            sandbox: self.sandbox.clone(),
            limits: self.limits.clone(),
        })
    }

    /// Brings the catalog's `custom` family in line with the store: approved and enabled
    /// custom tools are served (a changed one replaced), the rest are taken off. Returns the
    /// names added or replaced and the names removed.
    pub async fn sync(&self, catalog: &Catalog) -> Result<(Vec<String>, Vec<String>), CustomError> {
        let all = self.store.all_definitions().await?;
        // The other tools the store disables (or has unapproved) are held off the catalog
        // until it serves them again.
        let held: std::collections::BTreeSet<String> = all
            .iter()
            .filter(|d| {
                d.tool_type != ToolType::Custom
                    && d.deleted_at.is_none()
                    && (!d.enabled || d.status != Lifecycle::Approved)
            })
            .map(|d| d.name.clone())
            .collect();
        let (held_now, released) = catalog.hold_off(held);
        if !held_now.is_empty() || !released.is_empty() {
            tracing::info!(held = ?held_now, ?released, "tools the store disables held off");
        }
        let live: BTreeMap<String, ToolDefinition> = all
            .into_iter()
            .filter(|d| {
                d.tool_type == ToolType::Custom
                    && d.deleted_at.is_none()
                    && d.enabled
                    && d.status == Lifecycle::Approved
                    && self.taken_by(&d.name).is_none()
            })
            .map(|d| (d.name.clone(), d))
            .collect();
        let mut served = crate::sync::lock(&self.served);
        let mut added = Vec::new();
        let mut removed = Vec::new();
        for (name, def) in &live {
            let same = served.get(name).is_some_and(|old| {
                old.version == def.version
                    && old.implementation == def.implementation
                    && old.description == def.description
                    && old.input_schema == def.input_schema
            });
            let ours = catalog
                .lookup(name)
                .is_some_and(|e| &*e.family == CUSTOM_FAMILY);
            if same && ours {
                continue;
            }
            // A new version replaces the one this family serves; a name another family
            // holds goes to whichever comes first in the family order, as at registration.
            let registered = if ours {
                catalog.upsert_in(CUSTOM_FAMILY, self.tool(def))
            } else {
                catalog.register_in(CUSTOM_FAMILY, self.tool(def))
            };
            match registered {
                Ok(()) => {
                    served.insert(name.clone(), def.clone());
                    added.push(name.clone());
                }
                Err(e) => tracing::warn!(
                    tool = %name,
                    "custom tool not served: {e} (a tool of a family earlier in the order has the name)"
                ),
            }
        }
        let gone: Vec<String> = served
            .keys()
            .filter(|n| !live.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            served.remove(&name);
            if catalog
                .lookup(&name)
                .is_some_and(|e| &*e.family == CUSTOM_FAMILY)
            {
                catalog.remove(&name);
            }
            removed.push(name);
        }
        Ok((added, removed))
    }
}

fn pending_of(def: &ToolDefinition) -> Option<PendingVersion> {
    def.pending
        .as_ref()
        .and_then(|p| serde_json::from_value(p.clone()).ok())
}

/// The sentence refusing a tool definition whose `description`, or any text of its input
/// `schema` (descriptions, titles, enum values, property names), hides characters a model
/// would read and a person reviewing `whose` (the tool, the file) would not see: control,
/// bidirectional and Unicode tag characters, as a SKILL.md is refused for them.
pub fn hidden_in_definition(description: &str, schema: &Value, whose: &str) -> Option<String> {
    crate::skill::hidden_text("the description holds", description, None, whose).or_else(|| {
        let (at, text) = hidden_string(schema, String::new())?;
        crate::skill::hidden_text(
            &format!("the input schema at `{at}` holds"),
            text,
            None,
            whose,
        )
    })
}

/// The first string in `value` (keys included) that holds a character
/// [`quiver_contract::is_hidden_in_text`] finds, with its JSON pointer under `at`.
fn hidden_string(value: &Value, at: String) -> Option<(String, &str)> {
    let hides = |t: &str| t.chars().any(quiver_contract::is_hidden_in_text);
    match value {
        Value::String(t) if hides(t) => Some((if at.is_empty() { "/".into() } else { at }, t)),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| hidden_string(v, format!("{at}/{i}"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            let here = format!(
                "{at}/{}",
                k.replace('~', "~0").replace('/', "~1").escape_debug()
            );
            if hides(k) {
                return Some((here, k.as_str()));
            }
            hidden_string(v, here)
        }),
        _ => None,
    }
}
