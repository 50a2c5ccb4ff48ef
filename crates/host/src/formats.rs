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
