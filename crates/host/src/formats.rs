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
        ToolFormat::Json => serde_json::to_string_pretty(specs).unwrap_or_default(),
        ToolFormat::Openai => pretty(
            specs
                .iter()
                .map(|s| {
                    json!({"type": "function", "function": {
                        "name": s.name, "description": s.description, "parameters": s.input_schema
                    }})
                })
                .collect(),
        ),
        ToolFormat::Anthropic => pretty(
            specs
                .iter()
                .map(|s| json!({"name": s.name, "description": s.description, "input_schema": s.input_schema}))
                .collect(),
        ),
    }
}

/// The names a provider format may refuse: OpenAI's function names must match
/// `^[a-zA-Z0-9_-]{1,64}$`, and MCP names may hold dots and run to 256 bytes. One line per
/// such name, empty for the table and JSON formats (Quiver's own names).
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
        .collect()
}

fn pretty(items: Vec<Value>) -> String {
    serde_json::to_string_pretty(&Value::Array(items)).unwrap_or_default()
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
}
