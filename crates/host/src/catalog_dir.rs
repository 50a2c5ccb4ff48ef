//! The catalog directory (`[catalog] dir`, September's layout): tool definitions in files.
//!
//! ```text
//! catalog/
//!   tools/*.json | *.toml   {name, description, input_schema, implementation: {kind, ref}}
//!   skills/<name>/SKILL.md  skills, read as the explicit tier's
//!   agents/                 reserved: anything there is reported as not supported yet
//! ```
//!
//! The kinds:
//! - `custom`: `ref` is a JavaScript file beside the definition (`tests` may hold its test
//!   cases). It goes through the custom-tool lifecycle: stored as a draft and built, and
//!   approved only by the operator, unless `[catalog] auto_approve = true`.
//! - `mcp`: `ref` is `{server, tool}`: a curated alias of that upstream tool under this
//!   name and description (its calls are the upstream's, nested). Aliases are served in
//!   their own family, before the custom tools: a stored custom tool of an alias's name is
//!   not served, and `quiver check` and `quiver custom list` say so.
//! - `skill`: `ref` is a skill's name: the skill as a tool of its own, with this schema.
//!
//! A definition may carry `deprecated = {message, use_instead}`: its description then opens
//! with the announcement, so models move off it before it is removed.
//!
//! Every file is checked on its own when read: its syntax, the name rules, a JSON Schema
//! whose root is an object, the `ref` (a readable source file, a skill that exists, a
//! configured server), and the `quiver check` lints, extended with September's
//! constraint rule (a string property without `format`, `pattern`, `enum`, `minLength`
//! or `maxLength`). A file that breaks a rule is reported with its path, the rule and the
//! fix; the rest still load. Lints are reported without stopping the tool.
//!
//! Over 800 lines: reading a file into a checked definition (the format, name, schema and
//! reference rules) and serving the checked definitions (applying a read to the catalog,
//! keeping a file's last good version, the alias checks against connected upstreams) share
//! the private `Defined`/`Kind` types; the tests are in `catalog_dir/tests.rs`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use quiver_contract::{Tool, ToolSpec, validate_tool_name};
use quiver_registry::{
    Catalog, Family,
    curated::{alias_tool, skill_as_tool},
    custom::{CUSTOM_FAMILY, CustomDraft, CustomTools, TestCase},
    skill::SkillSource,
};
use serde::Deserialize;
use serde_json::Value;

/// The most definition files read.
const MAX_FILES: usize = 10_000;
/// The largest definition or source file read.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// One definition file, as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTool {
    name: String,
    description: String,
    input_schema: Value,
    implementation: Implementation,
    #[serde(default)]
    deprecated: Option<Deprecation>,
    /// A custom tool's test cases.
    #[serde(default)]
    tests: Option<Value>,
    /// Model capabilities the tool needs (`ToolSpec::requires`).
    #[serde(default)]
    requires: Vec<String>,
    /// Listed in its lightweight form until `describe_tool` loads it.
    #[serde(default)]
    progressive: bool,
    /// It only reads (offered in plan mode, run beside other read-only calls): what the
    /// operator states of an `mcp` or `skill` tool; a custom tool's is its stored
    /// definition's.
    #[serde(default)]
    read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
enum Implementation {
    Custom {
        #[serde(rename = "ref")]
        source: String,
    },
    Mcp {
        #[serde(rename = "ref")]
        target: McpRef,
    },
    Skill {
        #[serde(rename = "ref")]
        skill: String,
    },
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpRef {
    server: String,
    tool: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Deprecation {
    message: String,
    #[serde(default)]
    use_instead: Option<String>,
}

/// A definition file that does not load, or a lint of one that does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogProblem {
    /// The file.
    pub path: PathBuf,
    /// The rule it breaks.
    pub rule: &'static str,
    /// What is wrong and how to fix it.
    pub fix: String,
    /// Whether the file was left out (a lint only warns).
    pub refused: bool,
}

impl std::fmt::Display for CatalogProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: [{}] {}{}",
            self.path.display(),
            self.rule,
            self.fix,
            if self.refused { " (not loaded)" } else { "" }
        )
    }
}

/// A checked definition, ready to serve.
#[derive(Debug, Clone, PartialEq)]
struct Defined {
    path: PathBuf,
    spec: ToolSpec,
    kind: Kind,
    /// The tool a deprecation points to.
    use_instead: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Custom {
        source: String,
        /// The source file, beside the definition.
        source_path: PathBuf,
        tests: Vec<Value>,
    },
    Alias {
        target: String,
    },
    Skill {
        skill: String,
    },
}

/// What a read of the directory found.
#[derive(Debug, Clone, Default)]
pub struct CatalogRead {
    defined: Vec<Defined>,
    /// Files left out, and lints.
    pub problems: Vec<CatalogProblem>,
}

impl CatalogRead {
    /// The names defined, in file order.
    pub fn names(&self) -> Vec<&str> {
        self.defined.iter().map(|d| d.spec.name.as_str()).collect()
    }
}

fn problem(path: &Path, rule: &'static str, fix: impl Into<String>) -> CatalogProblem {
    CatalogProblem {
        path: path.to_path_buf(),
        rule,
        fix: fix.into(),
        refused: true,
    }
}

fn read_text(path: &Path) -> Result<String, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("it is not a regular file (links are not followed)".into());
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "it is {} bytes, over the {MAX_FILE_BYTES}-byte cap",
            meta.len()
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read it as UTF-8 text: {e}"))
}

/// Reads and checks every definition under `dir/tools`, and reports `dir/agents`.
/// `servers` are the configured MCP servers' names (an alias must name one).
pub fn read(dir: &Path, servers: &[String]) -> CatalogRead {
    let mut out = CatalogRead::default();
    let agents = dir.join("agents");
    if let Ok(entries) = std::fs::read_dir(&agents) {
        for e in entries.flatten() {
            out.problems.push(problem(
                &e.path(),
                "agents_unsupported",
                "agent definitions are not supported yet: the file is not loaded (keep it out of catalog/agents until they are)",
            ));
        }
    }
    let tools = dir.join("tools");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&tools) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(_) => return out,
    };
    files.sort();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for path in files.into_iter().take(MAX_FILES) {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !matches!(ext, "json" | "toml") {
            continue;
        }
        match check_file(&path, ext, servers) {
            Ok((defined, lints)) => {
                out.problems.extend(lints);
                if let Some(first) = seen.get(&defined.spec.name) {
                    out.problems.push(problem(
                        &path,
                        "duplicate_name",
                        format!(
                            "`{}` is defined in {} already: rename one",
                            defined.spec.name,
                            first.display()
                        ),
                    ));
                    continue;
                }
                seen.insert(defined.spec.name.clone(), path.clone());
                out.defined.push(defined);
            }
            Err(p) => out.problems.push(p),
        }
    }
    out
}

fn check_file(
    path: &Path,
    ext: &str,
    servers: &[String],
) -> Result<(Defined, Vec<CatalogProblem>), CatalogProblem> {
    let text = read_text(path).map_err(|why| problem(path, "readable", why))?;
    let format = |e: String| {
        // `tests` is the definition's, beside `implementation`, not the implementation's.
        let moved = if e.contains("unknown field `tests`, expected `ref`") {
            "; move `tests` up beside `implementation`"
        } else {
            ""
        };
        problem(
            path,
            "format",
            format!(
                "{e}{moved}; a definition is {{\"name\", \"description\", \"input_schema\", \"implementation\": {{\"kind\", \"ref\"}}}}, optionally with \"tests\", \"deprecated\", \"requires\", \"progressive\", \"read_only\""
            ),
        )
    };
    let file: FileTool = if ext == "json" {
        serde_json::from_str(&text).map_err(|e| format(e.to_string()))?
    } else {
        toml::from_str(&text).map_err(|e| format(e.to_string()))?
    };
    match validate_tool_name(&file.name) {
        Ok(quiver_contract::NameKind::Native) => {}
        Ok(_) => {
            return Err(problem(
                path,
                "name",
                format!(
                    "`{}` is an MCP tool's name (`mcp__server__tool`): give the definition a native name, e.g. `send_note`",
                    file.name
                ),
            ));
        }
        Err(e) => return Err(problem(path, "name", e.to_string())),
    }
    if file.description.trim().is_empty() {
        return Err(problem(
            path,
            "description",
            "the description is empty: say what the tool does and when to use it",
        ));
    }
    // The rule `custom add` and SKILL.md files follow: nothing a model reads may be
    // invisible to the person reviewing the file.
    let deprecation = file.deprecated.as_ref().map_or("", |d| d.message.as_str());
    if let Some(why) = quiver_registry::custom::hidden_in_definition(
        &file.description,
        &file.input_schema,
        "the file",
    )
    .or_else(|| {
        quiver_registry::skill::hidden_text(
            "`deprecated.message` holds",
            deprecation,
            None,
            "the file",
        )
    }) {
        return Err(problem(path, "hidden_characters", why));
    }
    if file.input_schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(problem(
            path,
            "input_schema",
            "the input schema's root must be `{\"type\": \"object\", ...}`",
        ));
    }
    if let Some(why) = bad_type(&file.input_schema, "") {
        return Err(problem(path, "input_schema", why));
    }
    if let Err(e) = jsonschema::validator_for(&file.input_schema) {
        return Err(problem(
            path,
            "input_schema",
            format!("not a valid JSON Schema: {e}"),
        ));
    }
    let mut description = file.description.clone();
    if let Some(d) = &file.deprecated {
        let instead = d
            .use_instead
            .as_ref()
            .map(|t| format!(" Use `{t}` instead."))
            .unwrap_or_default();
        let message = d.message.trim();
        let stop = if message.ends_with(['.', '!', '?']) {
            ""
        } else {
            "."
        };
        description = format!("DEPRECATED: {message}{stop}{instead} {description}");
    }
    let mut spec = ToolSpec::new(file.name.clone(), description)
        .with_schema(file.input_schema.clone())
        .requiring(file.requires.clone());
    spec.progressive = file.progressive;
    if file.read_only {
        spec = spec.read_only();
    }
    if matches!(file.implementation, Implementation::Custom { .. })
        && (!file.requires.is_empty() || file.progressive || file.read_only)
    {
        // A custom tool's definition is stored, and the store keeps neither.
        return Err(problem(
            path,
            "custom_tool_field",
            "`requires`, `progressive` and `read_only` are taken for `mcp` and `skill` tools only; a custom tool's stored definition does not keep them: remove them from this file".to_owned(),
        ));
    }
    let kind = match &file.implementation {
        Implementation::Custom { source } => {
            let at = path.parent().unwrap_or(Path::new("")).join(source);
            let code = read_text(&at).map_err(|why| {
                problem(
                    path,
                    "ref",
                    format!("the source `{}` ({}): {why}", source, at.display()),
                )
            })?;
            let tests = match &file.tests {
                None => Vec::new(),
                Some(v) => {
                    TestCase::parse_all(v).map_err(|why| problem(path, "tests", why))?;
                    v.as_array().cloned().unwrap_or_default()
                }
            };
            Kind::Custom {
                source: code,
                source_path: at,
                tests,
            }
        }
        Implementation::Mcp { target } => {
            if !servers.iter().any(|s| s == &target.server) {
                return Err(problem(
                    path,
                    "ref",
                    format!(
                        "no MCP server named `{}` is configured (configured: {}); name one of them",
                        target.server,
                        if servers.is_empty() {
                            "none".to_owned()
                        } else {
                            servers.join(", ")
                        }
                    ),
                ));
            }
            Kind::Alias {
                target: format!("mcp__{}__{}", target.server, target.tool),
            }
        }
        Implementation::Skill { skill } => Kind::Skill {
            skill: skill.clone(),
        },
    };
    if file.tests.is_some() && !matches!(kind, Kind::Custom { .. }) {
        return Err(problem(
            path,
            "tests",
            "`tests` belongs to a custom tool's definition only: remove it",
        ));
    }
    // Linted as written: the deprecation's own sentence says nothing of when to use it.
    let as_written = ToolSpec::new(file.name.clone(), file.description.clone())
        .with_schema(file.input_schema.clone());
    let mut lints: Vec<CatalogProblem> = quiver_contract::lint_spec(&as_written)
        .into_iter()
        .map(|l| CatalogProblem {
            path: path.to_path_buf(),
            rule: l.rule,
            fix: format!(
                "{}{}",
                if l.path.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", l.path)
                },
                l.message
            ),
            refused: false,
        })
        .collect();
    lints.extend(constraint_lints(path, &file.input_schema));
    lints.extend(unknown_required(path, &file.input_schema, ""));
    Ok((
        Defined {
            path: path.to_path_buf(),
            spec,
            kind,
            use_instead: file.deprecated.as_ref().and_then(|d| d.use_instead.clone()),
        },
        lints,
    ))
}

/// The JSON Schema types.
const SCHEMA_TYPES: [&str; 7] = [
    "string", "number", "integer", "boolean", "array", "object", "null",
];

/// The subschemas of `schema`, each with its JSON pointer under `at`.
fn subschemas<'a>(schema: &'a Value, at: &str) -> Vec<(String, &'a Value)> {
    let mut out = Vec::new();
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(map) = schema.get(key).and_then(Value::as_object) {
            out.extend(map.iter().map(|(k, v)| (format!("{at}/{key}/{k}"), v)));
        }
    }
    for key in ["items", "additionalProperties", "not", "contains"] {
        match schema.get(key) {
            Some(v @ Value::Object(_)) => out.push((format!("{at}/{key}"), v)),
            Some(Value::Array(list)) => out.extend(
                list.iter()
                    .enumerate()
                    .map(|(i, v)| (format!("{at}/{key}/{i}"), v)),
            ),
            _ => {}
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(list) = schema.get(key).and_then(Value::as_array) {
            out.extend(
                list.iter()
                    .enumerate()
                    .map(|(i, v)| (format!("{at}/{key}/{i}"), v)),
            );
        }
    }
    out
}

/// The first `type` in `schema` that is no JSON Schema type: where, the types and the
/// closest one.
fn bad_type(schema: &Value, at: &str) -> Option<String> {
    let named: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if let Some(wrong) = named.iter().find(|t| !SCHEMA_TYPES.contains(t)) {
        return Some(format!(
            "{at}/type: \"{wrong}\" is not a JSON Schema type ({}){}",
            SCHEMA_TYPES.join(", "),
            quiver_registry::suggestion(wrong, SCHEMA_TYPES)
        ));
    }
    subschemas(schema, at)
        .into_iter()
        .find_map(|(p, sub)| bad_type(sub, &p))
}

/// A `required` entry that names no property: every call must pass an argument the schema
/// never describes.
fn unknown_required(path: &Path, schema: &Value, at: &str) -> Vec<CatalogProblem> {
    let mut out = Vec::new();
    if let (Some(props), Some(required)) = (
        schema.get("properties").and_then(Value::as_object),
        schema.get("required").and_then(Value::as_array),
    ) {
        for name in required.iter().filter_map(Value::as_str) {
            if !props.contains_key(name) {
                out.push(CatalogProblem {
                    path: path.to_path_buf(),
                    rule: "required_unknown",
                    fix: format!(
                        "{at}/required: `required` names `{name}`, which is not in `properties`{}",
                        quiver_registry::suggestion(name, props.keys().map(String::as_str))
                    ),
                    refused: false,
                });
            }
        }
    }
    for (p, sub) in subschemas(schema, at) {
        out.extend(unknown_required(path, sub, &p));
    }
    out
}

/// September's constraint rule: every string property says what it takes (`format`,
/// `pattern`, `enum`, `const`, `minLength` or `maxLength`).
fn constraint_lints(path: &Path, schema: &Value) -> Vec<CatalogProblem> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .filter(|(_, p)| p.get("type").and_then(Value::as_str) == Some("string"))
        .filter(|(_, p)| {
            ["format", "pattern", "enum", "const", "minLength", "maxLength"]
                .iter()
                .all(|k| p.get(k).is_none())
        })
        .map(|(name, _)| CatalogProblem {
            path: path.to_path_buf(),
            rule: "string_constraints",
            fix: format!(
                "/properties/{name}: a string with no `format`, `pattern`, `enum` or length bounds takes anything; say what it takes"
            ),
            refused: false,
        })
        .collect()
}

/// Why arguments valid for `alias` cannot be valid for `target` (both JSON Schemas of an
/// object): a required argument of the target the alias does not define, an argument the
/// alias defines that a closed target does not take, or one typed differently. `None`
/// when none of these holds.
fn schema_mismatch(alias: &Value, target: &Value) -> Option<String> {
    let props = |s: &Value| s.get("properties").and_then(Value::as_object).cloned();
    let (mine, theirs) = (props(alias).unwrap_or_default(), props(target));
    let mut why = Vec::new();
    let required = target
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect::<Vec<_>>())
        .unwrap_or_default();
    let missing: Vec<&str> = required
        .into_iter()
        .filter(|n| !mine.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        why.push(format!(
            "which requires {}: add {} to the alias's `inputSchema` properties and `required`",
            quoted(&missing),
            if missing.len() == 1 { "it" } else { "them" }
        ));
    }
    if let Some(theirs) = &theirs {
        let closed = target.get("additionalProperties") == Some(&Value::Bool(false));
        let extra: Vec<&str> = mine
            .keys()
            .map(String::as_str)
            .filter(|n| closed && !theirs.contains_key(*n))
            .collect();
        if !extra.is_empty() {
            why.push(format!(
                "which does not take {} (its arguments: {}): rename or remove {}",
                quoted(&extra),
                quoted(&theirs.keys().map(String::as_str).collect::<Vec<_>>()),
                if extra.len() == 1 { "it" } else { "them" }
            ));
        }
        for (name, schema) in &mine {
            let ty = |s: &Value| s.get("type").and_then(Value::as_str).map(str::to_owned);
            if let (Some(a), Some(b)) = (ty(schema), theirs.get(name).and_then(ty))
                && a != b
                && !(a == "integer" && b == "number")
            {
                why.push(format!(
                    "whose `{name}` is a {b}, not a {a}: type it as the target does"
                ));
            }
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The catalog directory's tools as served: aliases in the custom-tools family, skills as
/// tools in the skills family, custom tools through the store's lifecycle.
pub struct CatalogDirTools {
    catalog: Arc<Catalog>,
    custom: Arc<CustomTools>,
    /// Whether custom-kind definitions are written to the store (not by the commands that
    /// only read it).
    writes: bool,
    /// The definitions served now (aliases and skill tools), by name.
    served: Mutex<BTreeMap<String, Defined>>,
    /// When each served definition was read from its file, by name.
    read_at: Mutex<BTreeMap<String, std::time::SystemTime>>,
    /// The last read's lints, and the names its files define.
    linted: Mutex<(Vec<CatalogProblem>, Vec<Defined>)>,
}

impl std::fmt::Debug for CatalogDirTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogDirTools")
            .field("writes", &self.writes)
            .finish_non_exhaustive()
    }
}

/// What [`CatalogDirTools::apply`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Tools added or replaced in the catalog.
    pub served: Vec<String>,
    /// Tools taken off.
    pub removed: Vec<String>,
    /// Custom tools stored as a new draft (built; approved when `auto_approve`).
    pub drafted: Vec<String>,
    /// What could not be applied, with the file.
    pub problems: Vec<String>,
}

impl CatalogDirTools {
    /// Serves the catalog directory's tools into `catalog`; custom ones through `custom`,
    /// when `writes` (a command that only reads the store leaves them as stored).
    pub fn new(catalog: Arc<Catalog>, custom: Arc<CustomTools>, writes: bool) -> Self {
        CatalogDirTools {
            catalog,
            custom,
            writes,
            served: Mutex::new(BTreeMap::new()),
            read_at: Mutex::new(BTreeMap::new()),
            linted: Mutex::new(Default::default()),
        }
    }

    /// The aliases served whose input schema cannot meet their target's as the catalog has
    /// it now: each with its file and what to change. A target not in the catalog (its
    /// server not connected) is not compared; the server's own findings say why.
    pub fn alias_mismatches(&self) -> Vec<String> {
        let served: Vec<Defined> = lock(&self.served).values().cloned().collect();
        served
            .iter()
            .filter_map(|def| {
                let Kind::Alias { target } = &def.kind else {
                    return None;
                };
                let why = match self.catalog.lookup(target) {
                    Some(entry) => {
                        schema_mismatch(&def.spec.input_schema, &entry.spec.input_schema)?
                    }
                    None => self.missing_target(target)?,
                };
                Some(format!(
                    "{}: [alias] `{}` stands for `{target}`, {why}; every call of it would be refused",
                    def.path.display(),
                    def.spec.name
                ))
            })
            .collect()
    }

    /// The lints of the files last read (each with its path, as the log has them), and the
    /// names those files define: `quiver check` reports these tools by file.
    pub fn lints(&self) -> (Vec<CatalogProblem>, std::collections::BTreeSet<String>) {
        let last = lock(&self.linted);
        (
            last.0.clone(),
            last.1.iter().map(|d| d.spec.name.clone()).collect(),
        )
    }

    /// What the files last read name that is not there: a `deprecated.use_instead` that
    /// names no tool in the catalog, and a `requires` capability no token or OIDC rule
    /// declares (`granted`). Each with whether it counts: a capability only a client could
    /// declare is a note, unless it is spelt like one that is granted.
    pub fn reference_findings(&self, granted: &[String]) -> Vec<(String, bool)> {
        let defined = lock(&self.linted).1.clone();
        let names: Vec<String> = self
            .catalog
            .tools()
            .iter()
            .map(|e| e.spec.name.clone())
            .collect();
        let mut out = Vec::new();
        for def in &defined {
            if let Some(instead) = &def.use_instead
                && self.catalog.lookup(instead).is_none()
            {
                out.push((
                    format!(
                        "{}: [use_instead] `{instead}` names no tool in the catalog{}: the model is pointed at a tool it cannot find; name one that exists",
                        def.path.display(),
                        quiver_registry::suggestion(instead, names.iter().map(String::as_str))
                    ),
                    true,
                ));
            }
            for wanted in &def.spec.requires {
                if granted.contains(wanted) {
                    continue;
                }
                let known = granted
                    .iter()
                    .map(String::as_str)
                    .chain(["vision", "audio"])
                    .filter(|k| k != wanted);
                let like = quiver_registry::suggestion(wanted, known);
                out.push((
                    format!(
                        "{}: [requires] no `[[auth.tokens]]` or `[auth.oidc]` rule declares `{wanted}`, so `{}` is offered only to clients that declare it themselves{like}",
                        def.path.display(),
                        def.spec.name
                    ),
                    !like.is_empty(),
                ));
            }
        }
        out
    }

    /// The stored custom tools an alias keeps off the catalog (the alias's family comes
    /// first): each with the file and what to do.
    pub fn clashes(&self) -> Vec<String> {
        let served = lock(&self.served);
        self.catalog
            .shadowed()
            .into_iter()
            .filter(|s| s.family == CUSTOM_FAMILY)
            .filter_map(|s| {
                let def = served.get(&s.name)?;
                matches!(def.kind, Kind::Alias { .. }).then(|| {
                    format!(
                        "{}: [name] `{}` is also an approved custom tool in the store, which is not served while this file defines an alias of that name: rename one, or `quiver custom disable {}`",
                        def.path.display(),
                        s.name,
                        s.name
                    )
                })
            })
            .collect()
    }

    /// Why `target` (`mcp__<server>__<tool>`) is not in the catalog when its server has
    /// listed tools there: the tool names it has. `None` while the server has none listed
    /// (not connected yet, or down).
    fn missing_target(&self, target: &str) -> Option<String> {
        let (server, tool) = target.strip_prefix("mcp__")?.split_once("__")?;
        let prefix = format!("mcp__{server}__");
        let mut has: Vec<String> = self
            .catalog
            .tools()
            .iter()
            .filter_map(|e| e.spec.name.strip_prefix(&prefix).map(str::to_owned))
            .collect();
        if has.is_empty() {
            return None;
        }
        has.sort();
        Some(format!(
            "which server `{server}` does not have: it has no tool `{tool}` (it has: {}); fix `ref.tool`",
            has.iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// Brings the catalog in line with `read`: a definition that did not change is left
    /// alone (nothing is re-registered, no list change); `skills` serves skill-kind tools.
    pub async fn apply(
        &self,
        read: &CatalogRead,
        skills: Option<Arc<dyn SkillSource>>,
        auto_approve: bool,
    ) -> Applied {
        let mut applied = Applied::default();
        *lock(&self.linted) = (
            read.problems
                .iter()
                .filter(|p| !p.refused)
                .cloned()
                .collect(),
            read.defined.clone(),
        );
        let mut keep: BTreeMap<String, Defined> = BTreeMap::new();
        for def in &read.defined {
            match &def.kind {
                Kind::Custom {
                    source,
                    source_path,
                    tests,
                } => {
                    // Checked whole (the source compiled) also where nothing is stored, so
                    // `quiver check` reports what a reload would.
                    if let Err(why) = self.check_custom(def, source, source_path, tests) {
                        applied.problems.push(why);
                    } else if self.writes {
                        self.apply_custom(def, source, tests, auto_approve, &mut applied)
                            .await;
                    }
                }
                Kind::Alias { target } => {
                    let tool = alias_tool(def.spec.clone(), target.clone());
                    self.serve(def, tool, Family::Catalog.name(), &mut keep, &mut applied);
                }
                Kind::Skill { skill } => {
                    let Some(source) = &skills else {
                        applied.problems.push(format!(
                            "{}: [ref] no skills are configured, so skill `{skill}` cannot be served",
                            def.path.display()
                        ));
                        continue;
                    };
                    let known = source.list_skills().await.unwrap_or_default();
                    if !known.iter().any(|m| m.name == *skill) {
                        applied.problems.push(format!(
                            "{}: [ref] there is no skill `{skill}` (skills: {}); name one, or add it under catalog/skills/{skill}/SKILL.md",
                            def.path.display(),
                            known.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", ")
                        ));
                        continue;
                    }
                    let tool = skill_as_tool(def.spec.clone(), skill.clone(), source.clone());
                    self.serve(def, tool, Family::Skills.name(), &mut keep, &mut applied);
                }
            }
        }
        // A file that is still there but no longer loads (saved half-edited) leaves its tool
        // as it was last read: only deleting the file takes the tool off.
        for (name, def) in lock(&self.served).iter() {
            let broken = def.path.exists()
                && read
                    .problems
                    .iter()
                    .any(|p| p.refused && p.path == def.path);
            if broken && !keep.contains_key(name) {
                let at = lock(&self.read_at)
                    .get(name)
                    .map(|t| {
                        chrono::DateTime::<chrono::Utc>::from(*t)
                            .format("%H:%M:%S UTC")
                            .to_string()
                    })
                    .unwrap_or_else(|| "start".to_owned());
                applied.problems.push(format!(
                    "{}: does not load; `{name}` is still served as read at {at} (fix the file, or delete it to take the tool off)",
                    def.path.display()
                ));
                keep.insert(name.clone(), def.clone());
            }
        }
        let gone: Vec<String> = {
            let served = lock(&self.served);
            served
                .keys()
                .filter(|n| !keep.contains_key(*n))
                .cloned()
                .collect()
        };
        lock(&self.read_at).retain(|n, _| keep.contains_key(n));
        for name in gone {
            let family = {
                let served = lock(&self.served);
                served.get(&name).map(|d| family_of(&d.kind))
            };
            if let Some(family) = family
                && self
                    .catalog
                    .lookup(&name)
                    .is_some_and(|e| *e.family == *family)
            {
                self.catalog.remove(&name);
            }
            applied.removed.push(name);
        }
        *lock(&self.served) = keep;
        applied
    }

    fn serve(
        &self,
        def: &Defined,
        tool: Arc<dyn Tool>,
        family: &str,
        keep: &mut BTreeMap<String, Defined>,
        applied: &mut Applied,
    ) {
        let name = def.spec.name.clone();
        let same = lock(&self.served).get(&name) == Some(def);
        let ours = self.catalog.lookup(&name).map(|e| &*e.family == family);
        if same && ours == Some(true) {
            keep.insert(name, def.clone());
            return;
        }
        let registered = match ours {
            Some(true) => self.catalog.upsert_in(family, tool),
            _ => self.catalog.register_in(family, tool),
        };
        match registered {
            Ok(()) => {
                lock(&self.read_at).insert(name.clone(), std::time::SystemTime::now());
                keep.insert(name.clone(), def.clone());
                applied.served.push(name);
            }
            Err(e) => applied.problems.push(format!(
                "{}: [name] `{name}` is not served: {e}",
                def.path.display()
            )),
        }
    }

    /// What a custom-kind definition would be refused for when stored, with the file it is
    /// in: a source that does not compile at the source file's line and column.
    fn check_custom(
        &self,
        def: &Defined,
        source: &str,
        source_path: &Path,
        tests: &[Value],
    ) -> Result<(), String> {
        let cases = TestCase::parse_all(&Value::Array(tests.to_vec()))
            .map_err(|why| format!("{}: [tests] {why}", def.path.display()))?;
        let draft = CustomDraft::new(
            def.spec.name.clone(),
            def.spec.description.clone(),
            def.spec.input_schema.clone(),
            source.to_owned(),
        )
        .with_tests(cases);
        match self.custom.check(&draft) {
            Ok(()) => Ok(()),
            Err(e) => {
                let why = e.to_string();
                // "the source does not compile: line L, column C: what": the position is
                // the source file's.
                let at = why
                    .strip_prefix("the source does not compile: line ")
                    .and_then(|rest| rest.split_once(", column "))
                    .and_then(|(line, rest)| {
                        let (column, what) = rest.split_once(": ")?;
                        Some(format!(
                            "{}:{line}:{column}: [custom] the source does not compile: {what}",
                            source_path.display()
                        ))
                    });
                Err(match at {
                    Some(at) => at,
                    None if why.starts_with("the source") => {
                        format!("{}: [custom] {why}", source_path.display())
                    }
                    None => format!("{}: [custom] {why}", def.path.display()),
                })
            }
        }
    }

    async fn apply_custom(
        &self,
        def: &Defined,
        source: &str,
        tests: &[Value],
        auto_approve: bool,
        applied: &mut Applied,
    ) {
        let name = &def.spec.name;
        // The stored tool (its live version, or the one under review) is this file already.
        if let Ok(stored) = self.custom.show(name).await {
            let pending = stored.pending.as_ref().and_then(|p| {
                serde_json::from_value::<quiver_registry::custom::PendingVersion>(p.clone()).ok()
            });
            let same = |desc: &str, schema: &Value, src: &str, cases: Option<&Value>| {
                desc == def.spec.description
                    && *schema == def.spec.input_schema
                    && src == source
                    && cases
                        .and_then(Value::as_array)
                        .map(Vec::as_slice)
                        .unwrap_or(&[])
                        == tests
            };
            let live_same = same(
                &stored.description,
                &stored.input_schema,
                &stored.implementation,
                stored.test_cases.as_ref(),
            );
            let pending_same = pending.as_ref().is_some_and(|p| {
                same(
                    &p.description,
                    &p.input_schema,
                    &p.source,
                    Some(&p.test_cases),
                )
            });
            if (live_same && pending.is_none()) || pending_same {
                return;
            }
        }
        let cases = match TestCase::parse_all(&Value::Array(tests.to_vec())) {
            Ok(c) => c,
            Err(why) => {
                applied
                    .problems
                    .push(format!("{}: [tests] {why}", def.path.display()));
                return;
            }
        };
        let draft = CustomDraft::new(
            name.clone(),
            def.spec.description.clone(),
            def.spec.input_schema.clone(),
            source.to_owned(),
        )
        .with_tests(cases)
        .with_author(format!("catalog file {}", def.path.display()));
        let added = match self.custom.add(draft).await {
            Ok(added) => added,
            Err(e) => {
                applied
                    .problems
                    .push(format!("{}: [custom] {e}", def.path.display()));
                return;
            }
        };
        applied.drafted.push(name.clone());
        if !auto_approve {
            return;
        }
        // Approved here, as the operator asked: built first, and by override when it has no
        // test cases (recorded as such).
        match self.custom.run_job(&added.job, &|_| {}).await {
            Ok(Some(report)) if report.passed => {
                let force = report.cases.is_empty();
                if let Err(e) = self.custom.approve(name, force).await {
                    applied
                        .problems
                        .push(format!("{}: [auto_approve] {e}", def.path.display()));
                }
            }
            Ok(Some(report)) => applied.problems.push(format!(
                "{}: [auto_approve] the build of `{name}` failed, so it is not approved: {}",
                def.path.display(),
                report
                    .cases
                    .iter()
                    .find(|(ok, _)| !ok)
                    .map_or("", |(_, why)| why.as_str())
            )),
            Ok(None) => {}
            Err(e) => applied
                .problems
                .push(format!("{}: [auto_approve] {e}", def.path.display())),
        }
    }
}

fn family_of(kind: &Kind) -> &'static str {
    match kind {
        Kind::Skill { .. } => Family::Skills.name(),
        Kind::Alias { .. } => Family::Catalog.name(),
        Kind::Custom { .. } => CUSTOM_FAMILY,
    }
}

/// The kind a catalog file gives the tool it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// A custom tool, stored and reviewed through the store's lifecycle.
    Custom,
    /// An alias of an upstream tool.
    Alias,
    /// A skill as a tool.
    Skill,
}

/// A name a catalog file holds, read from the file alone (whether or not the rest of it
/// loads): what `quiver custom` keeps its names clear of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The tool name.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// The kind it names.
    pub kind: ClaimKind,
}

impl Claimed {
    /// What the file makes of the name, for a sentence: "a catalog alias".
    pub fn what(&self) -> &'static str {
        match self.kind {
            ClaimKind::Custom => "a custom tool defined by a catalog file",
            ClaimKind::Alias => "a catalog alias of an upstream tool",
            ClaimKind::Skill => "a skill served as a tool by a catalog file",
        }
    }
}

/// The names the definition files under `dir/tools` hold, with their kinds. A file whose
/// syntax is broken, or that names no tool, holds none.
pub fn claimed(dir: &Path) -> Vec<Claimed> {
    let Ok(entries) = std::fs::read_dir(dir.join("tools")) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    files
        .into_iter()
        .take(MAX_FILES)
        .filter_map(|path| {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            let text = read_text(&path).ok()?;
            let value: Value = match ext {
                "json" => serde_json::from_str(&text).ok()?,
                "toml" => serde_json::to_value(toml::from_str::<toml::Value>(&text).ok()?).ok()?,
                _ => return None,
            };
            let name = value.get("name")?.as_str()?.to_owned();
            let kind = match value.pointer("/implementation/kind")?.as_str()? {
                "custom" => ClaimKind::Custom,
                "mcp" => ClaimKind::Alias,
                "skill" => ClaimKind::Skill,
                _ => return None,
            };
            Some(Claimed { name, path, kind })
        })
        .collect()
}

/// A poisoned lock is taken as it is: the maps it guards are rewritten whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;

/// A fingerprint of everything under `dir` (path, size, modification time; links not
/// followed): a reload reads the directory again only when it moved.
pub fn tree_fingerprint<'a>(dirs: impl Iterator<Item = &'a PathBuf>) -> u64 {
    use std::hash::{Hash, Hasher};
    /// The most entries looked at, so a huge tree cannot stall a reload.
    const MAX_ENTRIES: usize = 20_000;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut stack: Vec<PathBuf> = dirs.cloned().collect();
    let mut seen = 0;
    while let Some(path) = stack.pop() {
        seen += 1;
        if seen > MAX_ENTRIES {
            break;
        }
        path.hash(&mut hasher);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        meta.len().hash(&mut hasher);
        meta.modified().ok().hash(&mut hasher);
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            let mut children: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            children.sort();
            stack.extend(children);
        }
    }
    hasher.finish()
}
