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

/// Renders specs in a format.
pub fn format_tools(specs: &[ToolSpec], format: ToolFormat) -> String {
    match format {
        ToolFormat::Table => table(specs),
        ToolFormat::Json => serde_json::to_string_pretty(specs).unwrap_or_default() + "\n",
        ToolFormat::Openai => pretty(
            specs
                .iter()
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

/// The tools a provider format may refuse: OpenAI's function names must match
/// `^[a-zA-Z0-9_-]{1,64}$`, and MCP names may hold dots and run to 256 bytes; neither API
/// takes an input schema with `anyOf` / `oneOf` / `allOf` at the root. One line per such
/// tool, empty for the table and JSON formats (Quiver's own).
pub fn provider_name_warnings(specs: &[ToolSpec], format: ToolFormat) -> Vec<String> {
    if !matches!(format, ToolFormat::Openai | ToolFormat::Anthropic) {
        return Vec::new();
    }
    specs
        .iter()
        .filter_map(|s| {
            let n = &s.name;
            let bad_char = n
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'));
            let why = match (bad_char, n.len()) {
                (Some(c), _) => format!("it contains {c:?}"),
                (None, len) if len > 64 => format!("it is {len} characters long"),
                _ => return None,
            };
            Some(format!(
                "warning: the provider may refuse tool `{n}`: {why} (function names must match ^[a-zA-Z0-9_-]{{1,64}}$); rename the tool or give its server a shorter prefix"
            ))
        })
        .chain(specs.iter().filter_map(|s| {
            let key = ROOT_COMBINATORS
                .iter()
                .find(|k| s.input_schema.get(**k).is_some())?;
            Some(format!(
                "warning: the provider may refuse tool `{}`: its input schema has `{key}` at the root, which the OpenAI and Anthropic APIs do not accept; the tool's author should put the alternatives under a property",
                s.name
            ))
        }))
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

fn table(specs: &[ToolSpec]) -> String {
    let width = specs.iter().map(|s| s.name.len()).max().unwrap_or(4).max(4);
    let mut out = format!("{:<width$}  {:<4}  {}\n", "NAME", "MODE", "DESCRIPTION");
    for s in specs {
        let mode = if s.is_read_only() { "ro" } else { "rw" };
        out.push_str(&format!(
            "{:<width$}  {:<4}  {}\n",
            s.name,
            mode,
            first_line(&s.description, 90)
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
        assert!(provider_name_warnings(&specs, ToolFormat::Json).is_empty());
    }

    /// The provider APIs take only an object root: a schema without `"type"` gets
    /// `"type": "object"`, and a root `anyOf` / `oneOf` / `allOf` is warned about.
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
