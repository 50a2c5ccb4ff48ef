use quiver_contract::ToolSpec;
use serde_json::{Value, json};

/// How `quiver tools` prints a tool list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolFormat {
    /// A human table.
    Table,
    /// Quiver's own spec JSON.
    Json,
    /// The `tools` array of the OpenAI Chat Completions API.
    Openai,
    /// The `tools` array of the Anthropic Messages API.
    Anthropic,
}

/// Renders specs in a format. The provider formats leave out the tools the provider would
/// refuse ([`provider_name_warnings`] says which and why).
pub fn format_tools(specs: &[ToolSpec], format: ToolFormat) -> String {
    match format {
        ToolFormat::Table => table(specs),
        ToolFormat::Json => serde_json::to_string_pretty(specs).unwrap_or_default() + "\n",
        ToolFormat::Openai => pretty(
            specs
                .iter()
                .filter(|s| provider_refusal(s).is_none())
                .map(|s| {
                    json!({"type": "function", "function": {
                        "name": s.name, "description": s.description, "parameters": provider_schema(&s.input_schema)
                    }})
                })
                .collect(),
        ),
        ToolFormat::Anthropic => pretty(
            specs
                .iter()
                .filter(|s| provider_refusal(s).is_none())
                .map(|s| json!({"name": s.name, "description": s.description, "input_schema": provider_schema(&s.input_schema)}))
                .collect(),
        ),
    }
}

/// A tool's input schema as the provider APIs take it: both require `"type": "object"` at
/// the root, and MCP allows a schema without it (`{"properties": {...}}`), so it is added
/// when the root names no type.
fn provider_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(root) = schema.as_object_mut()
        && !root.contains_key("type")
    {
        root.insert("type".into(), json!("object"));
    }
    schema
}

/// The keys at the root of an input schema that the OpenAI and Anthropic APIs refuse.
const ROOT_COMBINATORS: [&str; 3] = ["anyOf", "oneOf", "allOf"];

/// Why a provider API would refuse this tool: a name OpenAI's and Anthropic's tool APIs do
/// not take (`^[a-zA-Z0-9_-]{1,64}$`; MCP names may hold dots and run longer), or an input
/// schema with `anyOf` / `oneOf` / `allOf` at the root. Either refuses the whole request.
fn provider_refusal(spec: &ToolSpec) -> Option<String> {
    if let Some(why) = quiver_contract::provider_name_problem(&spec.name) {
        return Some(format!(
            "its name is refused: {why} (names must match ^[a-zA-Z0-9_-]{{1,64}}$); {}",
            quiver_contract::provider_name_fix(&spec.name)
        ));
    }
    let key = ROOT_COMBINATORS
        .iter()
        .find(|k| spec.input_schema.get(**k).is_some())?;
    Some(format!(
        "its input schema has `{key}` at the root, which the OpenAI and Anthropic APIs do not accept; the tool's author should put the alternatives under a property"
    ))
}

/// The tools a provider format leaves out, one line each, because the provider would
/// refuse them (and with them the whole request; see `provider_refusal`). Empty for the
/// table and JSON formats (Quiver's own).
pub fn provider_name_warnings(specs: &[ToolSpec], format: ToolFormat) -> Vec<String> {
    if !matches!(format, ToolFormat::Openai | ToolFormat::Anthropic) {
        return Vec::new();
    }
    specs
        .iter()
        .filter_map(|s| {
            let why = provider_refusal(s)?;
            Some(format!(
                "warning: tool `{}` is left out of the list: {why}",
                s.name
            ))
        })
        .collect()
}

fn pretty(items: Vec<Value>) -> String {
    serde_json::to_string_pretty(&Value::Array(items)).unwrap_or_default() + "\n"
}

fn first_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() > max {
        let cut: String = line.chars().take(max - 1).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

/// One tool of [`format_catalog`]: its spec, its family (`core`, `mcp:<server>`, `custom
/// tools`, ...), and whether an operator disabled it (`quiver custom disable`).
pub type CatalogRow = (ToolSpec, String, bool);

/// The whole catalog in `format`: each tool with its family, then the tools an operator
/// disabled (never shown to a model), marked `disabled`. The table and JSON formats show the
/// family (and the server of an MCP tool) and the mark (the table's family column reads
/// `mcp:time (disabled)`, a JSON entry has `"disabled": true`); the provider formats are the
/// served tools' specs, as a provider takes them, so the caller names the disabled ones
/// apart ([`disabled_note`]).
pub fn format_catalog(entries: &[CatalogRow], format: ToolFormat) -> String {
    let family_of = |family: &str, disabled: bool| {
        if disabled {
            format!("{family} (disabled)")
        } else {
            family.to_owned()
        }
    };
    match format {
        ToolFormat::Table => {
            let width = entries
                .iter()
                .map(|(s, _, _)| s.name.len())
                .max()
                .unwrap_or(4)
                .max(4);
            let fwidth = entries
                .iter()
                .map(|(_, f, d)| family_of(f, *d).len())
                .max()
                .unwrap_or(6)
                .max(6);
            let mut out = format!(
                "{:<width$}  {:<fwidth$}  {:<4}  {}\n",
                "NAME", "FAMILY", "MODE", "DESCRIPTION"
            );
            for (s, family, disabled) in entries {
                let mode = if s.is_read_only() { "ro" } else { "rw" };
                out.push_str(&format!(
                    "{:<width$}  {:<fwidth$}  {:<4}  {}\n",
                    s.name,
                    family_of(family, *disabled),
                    mode,
                    quiver_contract::printable(&first_line(&s.description, 80))
                ));
            }
            let off = entries.iter().filter(|(_, _, d)| *d).count();
            out.push_str(&format!("{} tool(s) in the catalog\n", entries.len() - off));
            if off > 0 {
                out.push_str(&format!(
                    "{off} disabled by an operator (not offered to models): `quiver custom enable NAME` serves one again\n"
                ));
            }
            out
        }
        ToolFormat::Json => pretty(
            entries
                .iter()
                .map(|(s, family, disabled)| {
                    let mut v = serde_json::to_value(s).unwrap_or_default();
                    if let Some(o) = v.as_object_mut() {
                        o.insert("family".into(), json!(family));
                        if let Some(server) = family.strip_prefix("mcp:") {
                            o.insert("server".into(), json!(server));
                        }
                        if *disabled {
                            o.insert("disabled".into(), json!(true));
                        }
                    }
                    v
                })
                .collect(),
        ),
        ToolFormat::Openai | ToolFormat::Anthropic => {
            let specs: Vec<ToolSpec> = entries
                .iter()
                .filter(|(_, _, d)| !d)
                .map(|(s, _, _)| s.clone())
                .collect();
            format_tools(&specs, format)
        }
    }
}

/// The line that names the disabled tools a provider format leaves out (for stderr, so the
/// output stays what a provider takes); `None` in the other formats, which show them, or
/// when none is disabled.
pub fn disabled_note(entries: &[CatalogRow], format: ToolFormat) -> Option<String> {
    if !matches!(format, ToolFormat::Openai | ToolFormat::Anthropic) {
        return None;
    }
    let names: Vec<String> = entries
        .iter()
        .filter(|(_, _, d)| *d)
        .map(|(s, _, _)| format!("`{}`", quiver_contract::printable(&s.name)))
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "disabled by an operator, so left out (not offered to models): {}; `quiver custom enable NAME` serves one again",
            names.join(", ")
        )
    })
}

fn table(specs: &[ToolSpec]) -> String {
    let width = specs.iter().map(|s| s.name.len()).max().unwrap_or(4).max(4);
    let mut out = format!("{:<width$}  {:<4}  {}\n", "NAME", "MODE", "DESCRIPTION");
    for s in specs {
        let mode = if s.is_read_only() { "ro" } else { "rw" };
        out.push_str(&format!(
            "{:<width$}  {:<4}  {}\n",
            s.name,
            mode,
            quiver_contract::printable(&first_line(&s.description, 90))
        ));
    }
    out.push_str(&format!("{} tool(s)\n", specs.len()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_provider_refuses_are_warned_about() {
        let specs = vec![
            ToolSpec::new("mcp__gh__files.read", "Reads."),
            ToolSpec::new(
                format!("mcp__github_enterprise__{}", "x".repeat(58)),
                "Long.",
            ),
            ToolSpec::new("read_file", "Fine."),
        ];
        let w = provider_name_warnings(&specs, ToolFormat::Openai);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("mcp__gh__files.read") && w[0].contains("'.'"),
            "{w:?}"
        );
        assert!(w[1].contains("82 characters long"), "{w:?}");
        assert!(
            w.iter().all(|w| w.contains("left out of the list")),
            "{w:?}"
        );
        assert!(provider_name_warnings(&specs, ToolFormat::Json).is_empty());
        // The array holds only what the API takes: one refused name fails a whole request.
        for format in [ToolFormat::Openai, ToolFormat::Anthropic] {
            let v: Value = serde_json::from_str(&format_tools(&specs, format)).unwrap();
            let names: Vec<&str> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    t["name"]
                        .as_str()
                        .or(t["function"]["name"].as_str())
                        .unwrap()
                })
                .collect();
            assert_eq!(names, ["read_file"], "{format:?}");
        }
        let all: Value = serde_json::from_str(&format_tools(&specs, ToolFormat::Json)).unwrap();
        assert_eq!(all.as_array().unwrap().len(), 3);
    }

    /// The provider APIs take only an object root: a schema without `"type"` gets
    /// `"type": "object"`, and a tool with a root `anyOf` / `oneOf` / `allOf` is left out
    /// with a warning.
    #[test]
    fn provider_formats_take_an_object_root() {
        let specs = vec![
            ToolSpec::new("untyped", "No type.")
                .with_schema(json!({"properties": {"q": {"type": "string"}}, "required": ["q"]})),
            ToolSpec::new("either", "Either.").with_schema(json!({
                "type": "object",
                "oneOf": [{"required": ["a"]}, {"required": ["b"]}]
            })),
        ];
        for (format, key) in [
            (ToolFormat::Openai, "/0/function/parameters"),
            (ToolFormat::Anthropic, "/0/input_schema"),
        ] {
            let text = format_tools(&specs, format);
            assert!(text.ends_with("]\n"), "{text:?}");
            let v: Value = serde_json::from_str(&text).unwrap();
            let schema = v.pointer(key).unwrap();
            assert_eq!(schema["type"], "object", "{format:?}");
            assert_eq!(schema["required"], json!(["q"]), "{format:?}");
            assert_eq!(
                v.as_array().unwrap().len(),
                1,
                "`either` is left out: {text}"
            );
            let w = provider_name_warnings(&specs, format);
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(
                w[0].contains("tool `either`") && w[0].contains("`oneOf` at the root"),
                "{w:?}"
            );
        }
        assert!(format_tools(&specs, ToolFormat::Json).ends_with("]\n"));
    }
}
