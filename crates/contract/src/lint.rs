//! Definition lints (the September guide's rules) and breaking-change detection between two
//! versions of a tool's schema.

use serde::Serialize;
use serde_json::Value;

use crate::ToolSpec;

/// One lint finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LintFinding {
    /// The tool.
    pub tool: String,
    /// The rule's id: `property_type`, `property_description`, `closed_set_enum`,
    /// `required_listed`, `when_to_use`, `root_combinator` (an `anyOf` / `oneOf` / `allOf`
    /// at the root of the arguments schema, which provider tool APIs refuse), `provider_name`
    /// (a name those APIs refuse).
    pub rule: &'static str,
    /// Where in the schema (JSON pointer), empty for the tool itself.
    pub path: String,
    /// What to change.
    pub message: String,
}

fn finding(tool: &str, rule: &'static str, path: &str, message: String) -> LintFinding {
    LintFinding {
        tool: tool.to_owned(),
        rule,
        path: path.to_owned(),
        message,
    }
}

/// Phrases (whole words, in order) that say when to use a tool, as the September guide's
/// "Use this when the user asks ..." does; a word that merely contains "use" ("house") or a
/// "when" about something else ("Reports when the file was last modified") is not one.
const WHEN_PHRASES: &[&[&str]] = &[
    &["use", "this"],
    &["use", "it"],
    &["use", "when"],
    &["use", "if"],
    &["use", "for"],
    &["use", "after"],
    &["use", "before"],
    &["use", "instead"],
    &["call", "this"],
    &["call", "it"],
    &["call", "when"],
    &["call", "after"],
    &["call", "before"],
    &["invoke", "this"],
    &["invoke", "it"],
    &["when", "you", "need"],
    &["when", "you", "want"],
    &["when", "the", "user"],
    &["when", "asked"],
    &["if", "you", "need"],
    &["if", "you", "want"],
    &["if", "the", "user"],
    &["useful", "when"],
    &["useful", "for"],
    &["do", "not", "use"],
    &["don't", "use"],
    &["use", "whenever"],
    &["use", "only"],
    &["when", "to", "use"],
    &["helpful", "when"],
    &["helpful", "for"],
    &["great", "for"],
    &["best", "for"],
    &["ideal", "for"],
    &["prefer", "this"],
    &["prefer", "it"],
];

/// A sentence that begins with one of these words tells the model when or how to use the
/// tool ("Use the offset argument when ...", "Prefer this over web search ...").
const WHEN_OPENERS: &[&str] = &["use", "invoke", "prefer"];

/// Whether a description says when to use the tool (one of [`WHEN_PHRASES`]).
fn says_when_to_use(description: &str) -> bool {
    let lower = description.to_lowercase().replace('’', "'");
    // `_` stays in a word: `use_cache:` in a docstring's argument list is a name.
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    if WHEN_PHRASES
        .iter()
        .any(|phrase| words.windows(phrase.len()).any(|w| w == *phrase))
    {
        return true;
    }
    lower
        .split(['.', '!', '?', '\n', ':', ';'])
        .filter_map(|sentence| {
            sentence
                .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '_'))
                .find(|w| !w.is_empty())
        })
        .any(|first| WHEN_OPENERS.contains(&first))
}

/// Lints a tool definition: every property has a type and a description; closed sets use
/// `enum`; an object schema lists its required fields; the description says when to use the
/// tool. Nested objects are linted too: under a property (also one typed
/// `["object", "null"]`), in array items and in `anyOf` / `oneOf` / `allOf` branches.
pub fn lint_spec(spec: &ToolSpec) -> Vec<LintFinding> {
    let mut out = Vec::new();
    if !says_when_to_use(&spec.description) {
        out.push(finding(
            &spec.name,
            "when_to_use",
            "",
            "the description does not say when to use the tool (add a sentence like \"Use it when ...\")".into(),
        ));
    }
    if let Some(why) = provider_name_problem(&spec.name) {
        out.push(finding(
            &spec.name,
            "provider_name",
            "",
            format!("the OpenAI and Anthropic tool APIs refuse this name: {why} (names must match ^[a-zA-Z0-9_-]{{1,64}}$; an API refuses the whole request); {}", provider_name_fix(&spec.name)),
        ));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if spec.input_schema.get(key).is_some() {
            out.push(finding(
                &spec.name,
                "root_combinator",
                "",
                format!("the arguments schema has `{key}` at the root, which the OpenAI and Anthropic tool APIs refuse; make the root a plain object and put the alternatives under a property"),
            ));
        }
    }
    lint_schema(&spec.name, &spec.input_schema, "", &mut out);
    out
}

/// What to do about a name [`provider_name_problem`] refuses: a name too long for its
/// server's prefix can be shortened there; a character the APIs refuse stays in an upstream
/// server's tool (Quiver never renames one), which is left out or served under an alias.
pub fn provider_name_fix(name: &str) -> &'static str {
    let bad_char = name
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'));
    if bad_char {
        "rename the tool; for an MCP server's tool, which Quiver never renames, leave it out with the server's `deny_tools`, or serve it under a valid name with a catalog `mcp` alias"
    } else {
        "rename the tool, or give its server a shorter prefix"
    }
}

/// Why the OpenAI and Anthropic tool APIs would refuse `name` (they take
/// `^[a-zA-Z0-9_-]{1,64}$`; MCP names may hold dots and run to 128 characters), or `None`.
pub fn provider_name_problem(name: &str) -> Option<String> {
    let bad = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'));
    match (bad, name.chars().count()) {
        (Some(c), _) => Some(format!("it contains {c:?}")),
        (None, 0) => Some("it is empty".into()),
        (None, len) if len > 64 => Some(format!("it is {len} characters long")),
        _ => None,
    }
}

/// Lints the object schemas in `schema`: itself, its array items, its branches.
fn lint_schema(tool: &str, schema: &Value, path: &str, out: &mut Vec<LintFinding>) {
    lint_object(tool, schema, path, out);
    if let Some(items) = schema.get("items") {
        lint_schema(tool, items, &format!("{path}/items"), out);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for (i, branch) in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            lint_schema(tool, branch, &format!("{path}/{key}/{i}"), out);
        }
    }
}

/// Whether a schema's `type` is `ty` or a list holding it (`["string", "null"]`).
fn is_type(schema: &Value, ty: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(s)) => s == ty,
        Some(Value::Array(a)) => a.iter().any(|t| t.as_str() == Some(ty)),
        _ => false,
    }
}

fn has_type(schema: &Value) -> bool {
    ["type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf"]
        .iter()
        .any(|k| schema.get(k).is_some())
}

fn lists_options(description: &str) -> bool {
    let d = description.to_lowercase();
    d.contains("one of")
        || d.contains("either ")
        || (d.matches('|').count() >= 2 && !d.contains("||"))
}

fn lint_object(tool: &str, schema: &Value, path: &str, out: &mut Vec<LintFinding>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    if !props.is_empty() && schema.get("required").is_none() {
        let at = if path.is_empty() {
            "the arguments"
        } else {
            path
        };
        out.push(finding(
            tool,
            "required_listed",
            path,
            format!("{at} list no `required` fields; list them (or `\"required\": []` when all are optional)"),
        ));
    }
    for (name, prop) in props {
        let p = format!("{path}/properties/{name}");
        if !has_type(prop) {
            out.push(finding(
                tool,
                "property_type",
                &p,
                format!("property `{name}` has no type"),
            ));
        }
        let description = prop
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("");
        if description.trim().is_empty() {
            out.push(finding(
                tool,
                "property_description",
                &p,
                format!("property `{name}` has no description"),
            ));
        }
        if is_type(prop, "string") && prop.get("enum").is_none() && lists_options(description) {
            out.push(finding(
                tool,
                "closed_set_enum",
                &p,
                format!("property `{name}` describes a closed set of values; use `enum` so the model picks from the list"),
            ));
        }
        lint_schema(tool, prop, &p, out);
    }
}

/// One breaking change between two versions of a tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BreakingChange {
    /// The tool.
    pub tool: String,
    /// `removed_tool`, `removed_field`, `type_changed`, `new_required_field`.
    pub kind: &'static str,
    /// The field, when the change is about one.
    pub field: Option<String>,
    /// What changed, in a sentence.
    pub message: String,
}

/// The JSON types a schema accepts, as a set (`{"type": ["string", "null"]}` is
/// `{null, string}` in any order); `None` when it names no type (anything goes).
/// The JSON types a schema accepts, `None` for any: its `type` (a name or a list), or the
/// union of its `anyOf` / `oneOf` branches' types (pydantic writes `Optional[str]` as
/// `anyOf: [{type: string}, {type: null}]`).
fn types_of(schema: &Value) -> Option<std::collections::BTreeSet<&str>> {
    match schema.get("type") {
        Some(Value::String(s)) => Some([s.as_str()].into()),
        Some(Value::Array(items)) => Some(items.iter().filter_map(Value::as_str).collect()),
        Some(_) => None,
        None => {
            let branches = ["anyOf", "oneOf"]
                .iter()
                .find_map(|k| schema.get(*k).and_then(Value::as_array))?;
            let mut all = std::collections::BTreeSet::new();
            for b in branches {
                all.extend(types_of(b)?);
            }
            (!all.is_empty()).then_some(all)
        }
    }
}

/// Whether every type `old` accepted is still accepted by `new` (`None` is any type).
fn narrowed(
    old: Option<&std::collections::BTreeSet<&str>>,
    new: Option<&std::collections::BTreeSet<&str>>,
) -> bool {
    match (old, new) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(a), Some(b)) => !a.iter().all(|t| accepts(b, t)),
    }
}

fn show_types(types: Option<&std::collections::BTreeSet<&str>>) -> String {
    match types {
        None => "any".into(),
        Some(t) if t.len() == 1 => t.iter().next().copied().unwrap_or("any").to_owned(),
        Some(t) => format!("[{}]", t.iter().copied().collect::<Vec<_>>().join(", ")),
    }
}

/// Whether a value of type `old` is still accepted by `new` (an integer is a number).
fn accepts(new: &std::collections::BTreeSet<&str>, old: &str) -> bool {
    new.contains(old) || (old == "integer" && new.contains("number"))
}

fn required(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The breaking changes from `old` to `new` (same tool): a removed field, a type change, a
/// new required field without a default, in the arguments and in every nested object
/// (named `parent.child`, `list[].child` for an array's items). Adding an optional field
/// is not breaking, and neither is a type that accepts more than before (`integer` to
/// `number`, `string` to `["string", "null"]`).
pub fn breaking_changes(old: &ToolSpec, new: &ToolSpec) -> Vec<BreakingChange> {
    let mut out = Vec::new();
    compare_object(
        &new.name,
        &old.input_schema,
        &new.input_schema,
        "",
        &mut out,
    );
    out
}

fn compare_object(
    tool: &str,
    old: &Value,
    new: &Value,
    prefix: &str,
    out: &mut Vec<BreakingChange>,
) {
    let empty = serde_json::Map::new();
    let old_props = old
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let new_props = new
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let change = |kind, field: &str, message: String| BreakingChange {
        tool: tool.to_owned(),
        kind,
        field: Some(field.to_owned()),
        message,
    };
    for (name, old_p) in old_props {
        let field = format!("{prefix}{name}");
        let Some(new_p) = new_props.get(name) else {
            out.push(change(
                "removed_field",
                &field,
                format!("field `{field}` was removed"),
            ));
            continue;
        };
        let (a, b) = (types_of(old_p), types_of(new_p));
        if narrowed(a.as_ref(), b.as_ref()) {
            out.push(change(
                "type_changed",
                &field,
                format!(
                    "field `{field}` changed type from {} to {}",
                    show_types(a.as_ref()),
                    show_types(b.as_ref())
                ),
            ));
        }
        compare_object(tool, old_p, new_p, &format!("{field}."), out);
        if let (Some(old_items), Some(new_items)) = (old_p.get("items"), new_p.get("items")) {
            let (a, b) = (types_of(old_items), types_of(new_items));
            if narrowed(a.as_ref(), b.as_ref()) {
                let items = format!("{field}[]");
                out.push(change(
                    "type_changed",
                    &items,
                    format!(
                        "the items of `{field}` changed type from {} to {}",
                        show_types(a.as_ref()),
                        show_types(b.as_ref())
                    ),
                ));
            }
            compare_object(tool, old_items, new_items, &format!("{field}[]."), out);
        }
    }
    let old_required = required(old);
    for name in required(new) {
        if old_required.contains(&name) {
            continue;
        }
        let has_default = new_props
            .get(name)
            .is_some_and(|p| p.get("default").is_some());
        if !has_default {
            let field = format!("{prefix}{name}");
            out.push(change(
                "new_required_field",
                &field,
                format!("field `{field}` is now required and has no default; existing callers do not send it"),
            ));
        }
    }
}

/// The breaking changes between a stored set of definitions and the current one: per-tool
/// changes, and every stored tool that is gone (removed or renamed).
pub fn breaking_changes_between(stored: &[ToolSpec], current: &[ToolSpec]) -> Vec<BreakingChange> {
    let mut out = Vec::new();
    for old in stored {
        match current.iter().find(|c| c.name == old.name) {
            Some(new) => out.extend(breaking_changes(old, new)),
            None => out.push(BreakingChange {
                tool: old.name.clone(),
                kind: "removed_tool",
                field: None,
                message: format!(
                    "tool `{}` is gone (removed or renamed); callers that use it will break",
                    old.name
                ),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests;
