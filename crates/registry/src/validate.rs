//! Turns schema-validation failures into a Hint(schema) the model can act on.

use jsonschema::error::ValidationErrorKind;
use quiver_contract::{Alternative, Envelope, HintKind};
use serde_json::Value;

use crate::{catalog::Entry, suggest::did_you_mean};

const MAX_REPORTED: usize = 5;
/// The most characters one problem shows: jsonschema's messages quote the offending value
/// whole, and a hint goes to the model before any result cap applies.
const MAX_PROBLEM_CHARS: usize = 300;
/// The most unknown argument names one problem lists (each with its did-you-mean).
const MAX_UNKNOWN_LISTED: usize = 10;
/// The most characters of an unknown argument's name a problem shows.
const MAX_NAME_CHARS: usize = 80;

/// `text` cut to `max` characters, with `…` when cut.
pub(crate) fn clipped(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

/// The arguments of `input` that the tool's schema does not name, when its schema leaves
/// them open (no `additionalProperties: false`, which [`check`] refuses them under): they
/// reach the tool, which may ignore them, so the model is told, with the look-alike it may
/// have meant. `None` when every argument is named, or the schema takes any name by design
/// (`additionalProperties` or `patternProperties` with a schema).
pub(crate) fn unlisted(entry: &Entry, input: &Value) -> Option<quiver_contract::Warning> {
    let root = &entry.spec.input_schema;
    let schema = resolved(root, root);
    let props = schema.get("properties").and_then(Value::as_object)?;
    if schema
        .get("additionalProperties")
        .is_some_and(|a| a.is_object() || a == &Value::Bool(false))
        || schema.get("patternProperties").is_some()
    {
        return None;
    }
    let given = input.as_object()?;
    let names: Vec<&str> = props.keys().map(String::as_str).collect();
    let unlisted: Vec<String> = given
        .keys()
        .filter(|k| !props.contains_key(*k))
        .take(MAX_UNKNOWN_LISTED)
        .map(|k| {
            let shown = clipped(k, MAX_NAME_CHARS);
            match did_you_mean(k, names.iter().copied(), 1).first() {
                Some((near, _)) => format!("`{shown}` (did you mean `{near}`?)"),
                None => format!("`{shown}`"),
            }
        })
        .collect();
    if unlisted.is_empty() {
        return None;
    }
    let (what, verb) = if unlisted.len() == 1 {
        ("argument", "is not one")
    } else {
        ("arguments", "are not")
    };
    let takes = if names.is_empty() {
        "it takes no arguments".to_owned()
    } else {
        format!("its arguments are {}", names.join(", "))
    };
    Some(quiver_contract::Warning::new(
        "unknown_arguments",
        format!(
            "the {what} {} {verb} of `{}`: passed on as given, and the tool may have ignored {}; {takes}",
            unlisted.join(", "),
            entry.spec.name,
            if unlisted.len() == 1 { "it" } else { "them" },
        ),
    ))
}

/// Validates `input` against the entry's compiled schema; `None` when it fits.
pub(crate) fn check(entry: &Entry, input: &Value) -> Option<Envelope> {
    if entry.validator.is_valid(input) {
        return None;
    }
    let mut problems = Vec::new();
    let mut alternatives = Vec::new();
    let root = &entry.spec.input_schema;
    // The nested objects the problems are in, with their schemas: their signatures follow
    // the top level's, so the model sees the fields where it went wrong.
    let mut nested: Vec<(String, &Value)> = Vec::new();
    for err in entry.validator.iter_errors(input).take(MAX_REPORTED) {
        let path = clipped(err.instance_path().as_str(), MAX_NAME_CHARS);
        let at = if path.is_empty() {
            "the arguments".to_owned()
        } else {
            format!("`{path}`")
        };
        match err.kind() {
            ValidationErrorKind::Required { property } => {
                let prop = property
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| property.to_string());
                if path.is_empty() {
                    problems.push(format!("missing required argument `{prop}`"));
                } else {
                    problems.push(format!("{at}: missing required field `{prop}`"));
                    note_nested(
                        &mut nested,
                        &path,
                        keyword_parent(root, err.schema_path().as_str()),
                    );
                }
            }
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                if unexpected.len() > MAX_UNKNOWN_LISTED {
                    problems.push(format!(
                        "{} unknown {} (the first {MAX_UNKNOWN_LISTED} follow)",
                        unexpected.len(),
                        if path.is_empty() {
                            "arguments"
                        } else {
                            "fields"
                        }
                    ));
                }
                // The names the object at the error takes: the tool's arguments at the top,
                // the nested object's fields below it (none when its schema cannot be found,
                // rather than the top level's names, which would send the model astray).
                let object = if path.is_empty() {
                    None
                } else {
                    keyword_parent(root, err.schema_path().as_str())
                };
                let fields: Vec<&str> = match object {
                    None if path.is_empty() => {
                        entry.properties.iter().map(String::as_str).collect()
                    }
                    None => Vec::new(),
                    Some(o) => o
                        .get("properties")
                        .and_then(Value::as_object)
                        .map(|p| p.keys().map(String::as_str).collect())
                        .unwrap_or_default(),
                };
                if !path.is_empty() {
                    note_nested(&mut nested, &path, object);
                }
                for name in unexpected.iter().take(MAX_UNKNOWN_LISTED) {
                    let shown = clipped(name, MAX_NAME_CHARS);
                    if path.is_empty() {
                        problems.push(format!("unknown argument `{shown}`"));
                    } else {
                        problems.push(format!("{at}: unknown field `{shown}`"));
                    }
                    for (label, score) in did_you_mean(name, fields.iter().copied(), 3) {
                        alternatives.push(
                            Alternative::new(label, score)
                                .with_detail(format!("instead of `{shown}`")),
                        );
                    }
                }
            }
            _ => problems.push(clipped(&format!("{at}: {err}"), MAX_PROBLEM_CHARS)),
        }
    }
    let mut message = format!(
        "the arguments to `{}` do not fit its schema: {}",
        entry.spec.name,
        problems.join("; ")
    );
    let signature = signature_in(root, root);
    if !signature.is_empty() {
        message.push_str(&format!(". Expected {{{signature}}}"));
    }
    for (path, schema) in nested {
        let inner = signature_in(root, schema);
        if !inner.is_empty() {
            message.push_str(&format!("; `{path}` takes {{{inner}}}"));
        }
    }
    Some(Envelope::hint(HintKind::Schema, message, alternatives))
}

/// The most nested objects whose signatures a hint adds.
const MAX_NESTED_SIGNATURES: usize = 2;

fn note_nested<'s>(nested: &mut Vec<(String, &'s Value)>, path: &str, object: Option<&'s Value>) {
    if let Some(o) = object
        && nested.len() < MAX_NESTED_SIGNATURES
        && !nested.iter().any(|(p, _)| p == path)
    {
        nested.push((path.to_owned(), o));
    }
}

/// The schema holding the keyword at `keyword_path` (a JSON pointer into `root`, `$ref`s
/// already resolved by the validator: `/properties/user/additionalProperties` gives the
/// `user` schema).
fn keyword_parent<'s>(root: &'s Value, keyword_path: &str) -> Option<&'s Value> {
    let (parent, _) = keyword_path.rsplit_once('/')?;
    root.pointer(parent).filter(|v| v.is_object())
}

/// `schema`, or what its local `$ref` (`#/$defs/P`) points to in `root`, followed a few
/// times.
fn resolved<'s>(root: &'s Value, mut schema: &'s Value) -> &'s Value {
    for _ in 0..8 {
        match schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|ptr| root.pointer(ptr))
        {
            Some(target) => schema = target,
            None => break,
        }
    }
    schema
}

/// A compact signature of the object schema `schema`, a part of `root` (against which
/// `$ref`s resolve): `a: integer (required), b: string`.
fn signature_in(root: &Value, schema: &Value) -> String {
    let schema = resolved(root, schema);
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return String::new();
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    props
        .iter()
        .map(|(name, p)| {
            let p = resolved(root, p);
            let ty = match p.get("type") {
                Some(Value::String(t)) => t.clone(),
                Some(Value::Array(ts)) => ts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("|"),
                _ if p.get("enum").is_some() => "enum".to_owned(),
                // `anyOf`/`oneOf` of typed branches (pydantic writes an optional string as
                // `anyOf: [{type: string}, {type: null}]`): their types, `string|null`.
                _ => p
                    .get("anyOf")
                    .or_else(|| p.get("oneOf"))
                    .and_then(Value::as_array)
                    .and_then(|branches| {
                        let mut types: Vec<&str> = Vec::new();
                        for b in branches {
                            let t = resolved(root, b).get("type").and_then(Value::as_str);
                            match t {
                                Some(t) if !types.contains(&t) => types.push(t),
                                Some(_) => {}
                                None => return None,
                            }
                        }
                        (!types.is_empty()).then(|| types.join("|"))
                    })
                    .unwrap_or_else(|| "any".to_owned()),
            };
            let ty = match p.get("enum").and_then(Value::as_array) {
                Some(vals) if vals.len() <= 8 => format!(
                    "{ty} one of {}",
                    vals.iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join("|")
                ),
                _ => ty,
            };
            if required.contains(&name.as_str()) {
                format!("{name}: {ty} (required)")
            } else {
                format!("{name}: {ty}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// How the dispatcher's own refusal of a tool's arguments begins, followed by the tool's
/// name in backticks.
pub const REFUSED_ARGUMENTS: &str = "the arguments to `";

/// Whether a schema hint's message is the dispatcher's own refusal of `tool`'s arguments
/// (bad arguments, JSON that does not parse, not an object: the tool did not run), as
/// [`check`] and the dispatcher word it, not a schema hint the tool returned after it ran.
pub(crate) fn refused_arguments(message: &str, tool: &str) -> bool {
    message
        .strip_prefix(REFUSED_ARGUMENTS)
        .and_then(|rest| rest.strip_prefix(tool))
        .is_some_and(|rest| rest.starts_with('`'))
}
