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
    /// `required_listed`, `when_to_use`.
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

const WHEN_MARKERS: [&str; 7] = [
    "use ",
    "use it",
    "when ",
    "call this",
    "call it",
    "if you need",
    "if the user",
];

/// Lints a tool definition: every property has a type and a description; closed sets use
/// `enum`; an object schema lists its required fields; the description says when to use the
/// tool.
pub fn lint_spec(spec: &ToolSpec) -> Vec<LintFinding> {
    let mut out = Vec::new();
    let desc = spec.description.to_lowercase();
    if !WHEN_MARKERS.iter().any(|m| desc.contains(m)) {
        out.push(finding(
            &spec.name,
            "when_to_use",
            "",
            "the description does not say when to use the tool (add a sentence like \"Use it when ...\")".into(),
        ));
    }
    lint_object(&spec.name, &spec.input_schema, "", &mut out);
    out
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
        if prop.get("type").and_then(Value::as_str) == Some("string")
            && prop.get("enum").is_none()
            && lists_options(description)
        {
            out.push(finding(
                tool,
                "closed_set_enum",
                &p,
                format!("property `{name}` describes a closed set of values; use `enum` so the model picks from the list"),
            ));
        }
        if prop.get("type").and_then(Value::as_str) == Some("object") {
            lint_object(tool, prop, &p, out);
        }
        if let Some(items) = prop.get("items") {
            lint_object(tool, items, &format!("{p}/items"), out);
        }
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

fn type_of(schema: &Value) -> String {
    match schema.get("type") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "any".into(),
    }
}

fn required(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The breaking changes from `old` to `new` (same tool): a removed field, a type change, a
/// new required field without a default. Adding an optional field is not breaking.
pub fn breaking_changes(old: &ToolSpec, new: &ToolSpec) -> Vec<BreakingChange> {
    let mut out = Vec::new();
    let empty = serde_json::Map::new();
    let old_props = old
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let new_props = new
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let change = |kind, field: &str, message: String| BreakingChange {
        tool: new.name.clone(),
        kind,
        field: Some(field.to_owned()),
        message,
    };
    for (name, old_p) in old_props {
        match new_props.get(name) {
            None => out.push(change(
                "removed_field",
                name,
                format!("field `{name}` was removed"),
            )),
            Some(new_p) => {
                let (a, b) = (type_of(old_p), type_of(new_p));
                if a != b {
                    out.push(change(
                        "type_changed",
                        name,
                        format!("field `{name}` changed type from {a} to {b}"),
                    ));
                }
            }
        }
    }
    let old_required = required(&old.input_schema);
    for name in required(&new.input_schema) {
        if old_required.contains(&name) {
            continue;
        }
        let has_default = new_props
            .get(name)
            .is_some_and(|p| p.get("default").is_some());
        if !has_default {
            out.push(change(
                "new_required_field",
                name,
                format!("field `{name}` is now required and has no default; existing callers do not send it"),
            ));
        }
    }
    out
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
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn lints_follow_the_guide() {
        let bad = ToolSpec::new("post", "Posts a message.").with_schema(json!({
            "type": "object",
            "properties": {
                "channel": {"description": "Where."},
                "text": {"type": "string"},
                "priority": {"type": "string", "description": "One of low, medium, high."},
                "meta": {"type": "object", "description": "Extra.", "properties": {"k": {"type": "string", "description": "Key."}}}
            }
        }));
        let rules: Vec<_> = lint_spec(&bad)
            .iter()
            .map(|f| (f.rule, f.path.clone()))
            .collect();
        assert_eq!(
            rules,
            vec![
                ("when_to_use", "".into()),
                ("required_listed", "".into()),
                ("property_type", "/properties/channel".into()),
                ("property_description", "/properties/text".into()),
                ("closed_set_enum", "/properties/priority".into()),
                ("required_listed", "/properties/meta".into()),
            ]
        );
        let good = ToolSpec::new("post", "Posts a message. Use it when the user asks to notify a channel.").with_schema(json!({
            "type": "object",
            "properties": {"priority": {"type": "string", "enum": ["low", "high"], "description": "One of low, high."}},
            "required": []
        }));
        assert!(lint_spec(&good).is_empty(), "{:?}", lint_spec(&good));
    }

    #[test]
    fn breaking_changes_are_found() {
        let old = ToolSpec::new("t", "T.").with_schema(json!({
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "string"}},
            "required": ["a"]
        }));
        let new = ToolSpec::new("t", "T.").with_schema(json!({
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "d": {"type": "string"}, "e": {"type": "string", "default": "x"}, "f": {"type": "string"}},
            "required": ["a", "d", "e"]
        }));
        let kinds: Vec<_> = breaking_changes(&old, &new)
            .into_iter()
            .map(|c| (c.kind, c.field.unwrap_or_default()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("type_changed", "b".into()),
                ("removed_field", "c".into()),
                ("new_required_field", "d".into())
            ]
        );
        let gone = breaking_changes_between(&[old.clone(), ToolSpec::new("u", "U.")], &[new]);
        assert_eq!(gone.last().unwrap().kind, "removed_tool");
    }
}
