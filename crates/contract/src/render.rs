//! The model-facing renders. The text produced here IS the contract the model reads; it is
//! locked by snapshot tests.

use std::fmt::Write;

use serde_json::Value;

use crate::{Alternative, ColumnSpec, Envelope, ErrKind, HintKind};

/// Bounds of the Ok render. By default there are none: the render is the text the model
/// reads, and many clients show a model only that text (a 2025-era client takes no list as
/// `structuredContent` at all), so it carries the whole of the data the
/// dispatcher's result limit let through (which bounds it in tokens and pages what is over,
/// naming the call that reads the rest). A view for people (a preview in a UI) may set
/// bounds; what they leave out is said, never dropped silently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RenderOptions {
    /// Rows shown of a table or list before the rest is elided.
    pub preview_rows: usize,
    /// Lines of pretty-printed JSON data shown before the rest is elided; text is never
    /// cut here.
    pub preview_lines: usize,
    /// Characters shown of one table cell.
    pub max_cell_chars: usize,
    /// Whether text parts are written into the render (true), or left out because the edge
    /// sends each part as its own block (MCP).
    pub inline_text_parts: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            preview_rows: usize::MAX,
            preview_lines: usize::MAX,
            max_cell_chars: usize::MAX,
            inline_text_parts: true,
        }
    }
}

impl RenderOptions {
    /// A preview for people: 20 rows, 200 lines of JSON, 80 characters a cell.
    pub fn preview() -> Self {
        RenderOptions {
            preview_rows: 20,
            preview_lines: 200,
            max_cell_chars: 80,
            inline_text_parts: true,
        }
    }
}

const OK_PREFIX: &str = "✓ ok.";

/// Renders an envelope to the text the model reads.
pub fn render(envelope: &Envelope, opts: &RenderOptions) -> String {
    let mut out = String::new();
    match envelope {
        Envelope::Ok {
            rows,
            schema,
            data,
            warnings,
            parts,
            ..
        } => {
            render_ok(&mut out, *rows, schema, data, opts);
            for w in warnings {
                let _ = write!(out, "\n⚠ {}: {}", w.kind, w.message);
            }
            for p in parts {
                if opts.inline_text_parts || !matches!(p, crate::Part::Text { .. }) {
                    let _ = write!(out, "\n{}", p.describe());
                }
            }
        }
        Envelope::Hint {
            hint_kind,
            message,
            alternatives,
        } => {
            render_hint(&mut out, *hint_kind, message, alternatives);
        }
        // A legacy error (an MCP server's or custom tool's own `isError` text) has no class
        // a model can act on: it is said to come from the tool (the log keeps `legacy`).
        Envelope::Err {
            message,
            err_kind: ErrKind::Legacy,
        } => {
            let _ = write!(out, "✗ error (reported by the tool): {message}");
        }
        Envelope::Err { message, err_kind } => {
            let _ = write!(out, "✗ error ({}): {message}", err_kind.as_str());
        }
    }
    out
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "row" } else { "rows" }
}

fn render_ok(
    out: &mut String,
    rows: u64,
    schema: &[ColumnSpec],
    data: &Value,
    opts: &RenderOptions,
) {
    match data {
        // Text is shown whole: it is all there is of it (a tool's output, a file's
        // contents), with no structured copy to go back to. The dispatcher's result limit
        // bounds it, and says so when it cuts.
        Value::String(text) => {
            out.push_str(OK_PREFIX);
            if !text.is_empty() {
                out.push('\n');
                out.push_str(text);
            }
        }
        Value::Null => {
            // The answer is null: said as such ("0 rows" read as an empty query result).
            let _ = write!(out, "{OK_PREFIX}\nnull");
        }
        Value::Array(items) if !schema.is_empty() && table_fits(schema, items) => {
            let _ = write!(out, "{OK_PREFIX} {rows} {}.", plural(rows));
            push_schema_line(out, schema);
            push_table(out, schema, items, rows, opts);
        }
        // A number or a boolean is the whole answer.
        Value::Number(_) | Value::Bool(_) => {
            let _ = write!(out, "{OK_PREFIX}\n{data}");
        }
        // An object whose only field is text (`{"content": "..."}`, as many servers wrap a
        // file or a message) is that text under its name, as written, not JSON-escaped.
        Value::Object(map) if map.len() == 1 && map.values().all(Value::is_string) => {
            if let Some((name, Value::String(text))) = map.iter().next() {
                let _ = write!(out, "{OK_PREFIX} {name}:\n{text}");
            }
        }
        // One object is one result, not a table of one row.
        Value::Object(_) => {
            let _ = write!(out, "{OK_PREFIX} 1 object.");
            push_schema_line(out, schema);
            out.push('\n');
            let pretty = serde_json::to_string_pretty(data).unwrap_or_default();
            push_bounded_lines(out, &pretty, opts.preview_lines);
        }
        // A list without columns, or whose rows a table would not show as they are: one
        // compact item per line, bounded, with the number of elided items stated.
        Value::Array(items) => {
            let _ = write!(out, "{OK_PREFIX} {rows} {}.", plural(rows));
            if !items.is_empty() {
                out.push('\n');
            }
            let shown = items.len().min(opts.preview_rows);
            for (i, item) in items[..shown].iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                let _ = write!(out, "- {item}");
            }
            let elided = rows.saturating_sub(shown as u64);
            if elided > 0 {
                let _ = write!(out, "\n... ({elided} more {}) ...", plural(elided));
            }
        }
    }
}

fn push_schema_line(out: &mut String, schema: &[ColumnSpec]) {
    if schema.is_empty() {
        return;
    }
    out.push_str("\nschema: ");
    for (i, col) in schema.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{} {}", col.name, col.dtype);
        match col.null_count {
            Some(n) if n > 0 => {
                let _ = write!(out, " ({n} null)");
            }
            _ => {}
        }
    }
}

fn cell(v: Option<&Value>, max: usize) -> String {
    let s = match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let s = s.replace(['\n', '\r'], " ").replace('|', "\\|");
    if s.chars().count() > max {
        let cut: String = s.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        s
    }
}

/// Whether `items` read as a table without loss and without much more text than one JSON
/// object a line: every item an object, no cell a table cannot show as it is (a newline, a
/// `|`, an empty string, which would read as null), and not so sparse that empty cells
/// outweigh the data (rows whose keys seldom repeat). Otherwise they are a list of JSON
/// objects, which the result limit's measure of the data also bounds.
fn table_fits(schema: &[ColumnSpec], items: &[Value]) -> bool {
    let mut table = 0usize;
    let mut lines = 0usize;
    for item in items {
        let Value::Object(row) = item else {
            return false;
        };
        for value in row.values() {
            if let Value::String(s) = value
                && (s.is_empty() || s.contains(['\n', '\r', '|']))
            {
                return false;
            }
        }
        // `| a | b |`: three characters a cell besides its text, one a row.
        table += 1 + schema.len() * 3;
        for col in schema {
            table += match row.get(&col.name) {
                None | Some(Value::Null) => 0,
                Some(Value::String(s)) => s.len(),
                Some(other) => other.to_string().len(),
            };
        }
        lines += 3 + serde_json::to_string(item).map_or(0, |j| j.len());
    }
    table <= lines + lines / 2
}

fn push_table(
    out: &mut String,
    schema: &[ColumnSpec],
    items: &[Value],
    rows: u64,
    opts: &RenderOptions,
) {
    out.push_str("\n|");
    for col in schema {
        let _ = write!(out, " {} |", col.name);
    }
    out.push_str("\n|");
    for _ in schema {
        out.push_str("---|");
    }
    let shown = items.len().min(opts.preview_rows);
    for row in &items[..shown] {
        out.push_str("\n|");
        for col in schema {
            let _ = write!(out, " {} |", cell(row.get(&col.name), opts.max_cell_chars));
        }
    }
    let elided = rows.saturating_sub(shown as u64);
    if elided > 0 {
        let _ = write!(out, "\n... ({elided} more {}) ...", plural(elided));
    }
}

fn push_bounded_lines(out: &mut String, text: &str, max_lines: usize) {
    let total = text.lines().count();
    if total <= max_lines {
        out.push_str(text);
        return;
    }
    for (i, line) in text.lines().take(max_lines).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(line);
    }
    let _ = write!(out, "\n... ({} more lines) ...", total - max_lines);
}

fn score(a: &Alternative) -> String {
    format!("{:.2}", a.score)
}

fn render_hint(out: &mut String, kind: HintKind, message: &str, alternatives: &[Alternative]) {
    match kind {
        HintKind::Schema => {
            let _ = write!(out, "⚠ schema hint: {message}");
            if !alternatives.is_empty() {
                out.push_str("\ndid you mean: ");
                for (i, a) in alternatives.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let _ = write!(out, "`{}` ({})", a.label, score(a));
                    if let Some(d) = &a.detail {
                        let _ = write!(out, " {d}");
                    }
                }
                out.push('?');
            }
        }
        HintKind::Fetch => {
            let _ = write!(out, "⚠ fetch hint: {message}");
            for action in ["add", "narrow"] {
                let items: Vec<String> = alternatives
                    .iter()
                    .filter(|a| a.action.as_deref().unwrap_or("add") == action)
                    .map(|a| match &a.detail {
                        Some(d) => format!("{} ({d})", a.label),
                        None => a.label.clone(),
                    })
                    .collect();
                if !items.is_empty() {
                    let _ = write!(out, "\n{action}: {}", items.join(", "));
                }
            }
        }
        HintKind::Ambiguous => {
            let _ = write!(out, "⚠ ambiguous: {message}");
            if !alternatives.is_empty() {
                out.push_str("\npick one:");
                for (i, a) in alternatives.iter().enumerate() {
                    let _ = write!(out, "\n  {}. {} ({})", i + 1, a.label, score(a));
                    if let Some(d) = &a.detail {
                        let _ = write!(out, " {d}");
                    }
                }
            }
        }
    }
}

/// Strips the leading `✓ ok.` status line when a tool reads another tool's output as data.
/// Hint and error texts are returned unchanged, so a failure can never pass for content.
pub fn strip_status_line(rendered: &str) -> &str {
    if !rendered.starts_with(OK_PREFIX) {
        return rendered;
    }
    match rendered.split_once('\n') {
        Some((_, rest)) => rest,
        None => "",
    }
}

/// A duration as a message to a model or an operator writes it: `30 s`, `1.5 s`, `250 ms`
/// (never `0.9999333 s`; what remains of a 1 s deadline reads `1 s`).
pub fn duration_text(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    let tenths = (ms + 50) / 100;
    if tenths < 10 {
        format!("{ms} ms")
    } else if tenths.is_multiple_of(10) || tenths >= 100 {
        format!("{} s", (ms + 500) / 1000)
    } else {
        format!("{}.{} s", tenths / 10, tenths % 10)
    }
}

#[cfg(test)]
mod duration_tests {
    use super::duration_text;
    use std::time::Duration;

    #[test]
    fn durations_read_as_people_write_them() {
        let ms = Duration::from_millis;
        assert_eq!(duration_text(ms(250)), "250 ms");
        assert_eq!(duration_text(ms(999)), "1 s");
        assert_eq!(duration_text(Duration::from_nanos(999_933_300)), "1 s");
        assert_eq!(duration_text(ms(1500)), "1.5 s");
        assert_eq!(duration_text(ms(30_000)), "30 s");
        assert_eq!(duration_text(ms(120_400)), "120 s");
    }
}
