//! The result contract: every tool call ends in exactly one [`Envelope`].

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::hash::canonical_json;

/// The one shape every tool result takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Envelope {
    /// Success, with data measured rather than declared.
    Ok {
        /// Row count (1 for a single object or a text, 0 for null).
        rows: u64,
        /// Columns measured from the data.
        schema: Vec<ColumnSpec>,
        /// The payload itself.
        data: Value,
        /// In-band advisories that do not block the result.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<Warning>,
        /// Side channels the orchestrator (not the model) consumes.
        #[serde(default)]
        effects: Effects,
        /// Non-text parts (images, audio, resources), budgeted in bytes.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        parts: Vec<Part>,
    },
    /// A recoverable correction: the model can re-call and succeed.
    Hint {
        /// What kind of correction.
        hint_kind: HintKind,
        /// What went wrong, for the model.
        message: String,
        /// Ranked candidates.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        alternatives: Vec<Alternative>,
    },
    /// A failure the model cannot fix by re-calling with other arguments.
    Err {
        /// What went wrong, for the model.
        message: String,
        /// The class of failure.
        err_kind: ErrKind,
    },
}

/// The kinds of [`Envelope::Hint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HintKind {
    /// An unknown name, field or entity: "did you mean".
    Schema,
    /// A filter, cap or pagination issue: "add:" / "narrow:".
    Fetch,
    /// Two or more candidates within tolerance: "pick one".
    Ambiguous,
}

impl HintKind {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            HintKind::Schema => "schema",
            HintKind::Fetch => "fetch",
            HintKind::Ambiguous => "ambiguous",
        }
    }
}

/// The class of an [`Envelope::Err`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrKind {
    /// A plain error string translated from a legacy result.
    Legacy,
    /// The tool name is not in the catalog.
    UndefinedTool,
    /// The tool ran past its deadline.
    Timeout,
    /// The caller cancelled the call.
    Cancelled,
    /// The tool panicked.
    Panic,
    /// A policy rule denied the call.
    PolicyDenied,
    /// The same call was repeated too many times in a row.
    LoopGuard,
    /// The tool's backend is not available (for example an MCP server that is down).
    NotAvailable,
    /// The caller may not use this tool.
    Forbidden,
    /// The tool failed in its own code.
    ToolFailed,
    /// A fault in Quiver itself.
    Internal,
    /// Any other class, named by the tool.
    Other(String),
}

impl ErrKind {
    /// The lower-case name.
    pub fn as_str(&self) -> &str {
        match self {
            ErrKind::Legacy => "legacy",
            ErrKind::UndefinedTool => "undefined_tool",
            ErrKind::Timeout => "timeout",
            ErrKind::Cancelled => "cancelled",
            ErrKind::Panic => "panic",
            ErrKind::PolicyDenied => "policy_denied",
            ErrKind::LoopGuard => "loop_guard",
            ErrKind::NotAvailable => "not_available",
            ErrKind::Forbidden => "forbidden",
            ErrKind::ToolFailed => "tool_failed",
            ErrKind::Internal => "internal",
            ErrKind::Other(s) => s,
        }
    }

    /// Parses a name produced by [`ErrKind::as_str`].
    pub fn parse(s: &str) -> ErrKind {
        match s {
            "legacy" => ErrKind::Legacy,
            "undefined_tool" => ErrKind::UndefinedTool,
            "timeout" => ErrKind::Timeout,
            "cancelled" => ErrKind::Cancelled,
            "panic" => ErrKind::Panic,
            "policy_denied" => ErrKind::PolicyDenied,
            "loop_guard" => ErrKind::LoopGuard,
            "not_available" => ErrKind::NotAvailable,
            "forbidden" => ErrKind::Forbidden,
            "tool_failed" => ErrKind::ToolFailed,
            "internal" => ErrKind::Internal,
            other => ErrKind::Other(other.to_owned()),
        }
    }
}

/// A ranked candidate in a hint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Alternative {
    /// What the model could use instead.
    pub label: String,
    /// How good a match it is, 0..=1.
    pub score: f64,
    /// For fetch hints: `add` or `narrow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// A short note shown beside the label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Alternative {
    /// A candidate with a score.
    pub fn new(label: impl Into<String>, score: f64) -> Self {
        Alternative {
            label: label.into(),
            score,
            action: None,
            detail: None,
        }
    }

    /// Sets the fetch action (`add` or `narrow`).
    pub fn with_action(mut self, action: impl Into<String>) -> Self {
        self.action = Some(action.into());
        self
    }

    /// Sets the detail.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// An in-band advisory on an Ok result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Warning {
    /// A short class, e.g. `policy`, `truncated`, `no_match`, `repeat_failure`.
    pub kind: String,
    /// The advisory, for the model.
    pub message: String,
}

impl Warning {
    /// A warning of a kind.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Warning {
            kind: kind.into(),
            message: message.into(),
        }
    }
}

/// Side channels of an Ok result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Effects {
    /// UI cards.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cards: Vec<Value>,
    /// Named datasets produced by the call.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub datasets: BTreeMap<String, Value>,
    /// Files exported by the call, keyed by file name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exports: BTreeMap<String, Value>,
    /// USD spent inside the call (for example on LLM calls).
    #[serde(default)]
    pub cost_usd: f64,
}

/// A part of a result besides its leading text, in the order the tool gave them: images,
/// audio, embedded resources, resource links, and text that came after one of those or
/// carries annotations of its own.
///
/// `annotations` is the MCP content annotations object (`audience`, `priority`,
/// `lastModified`) as the tool gave it; Quiver keeps it and does not act on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Part {
    /// Text in its own block: after a non-text part, or with annotations. It counts against
    /// the result's character limit, not the part budget.
    Text {
        /// The text.
        text: String,
        /// The block's annotations.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        annotations: Option<Value>,
    },
    /// An image, base64.
    Image {
        /// MIME type.
        mime_type: String,
        /// Base64 data.
        data: String,
        /// The block's annotations.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        annotations: Option<Value>,
    },
    /// Audio, base64.
    Audio {
        /// MIME type.
        mime_type: String,
        /// Base64 data.
        data: String,
        /// The block's annotations.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        annotations: Option<Value>,
    },
    /// An embedded resource (text or base64 blob).
    Resource {
        /// Its URI.
        uri: String,
        /// MIME type, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
        /// Text content.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// Base64 content.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        blob: Option<String>,
        /// The block's annotations.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        annotations: Option<Value>,
    },
    /// A link to a resource the client can read.
    ResourceLink {
        /// Its URI.
        uri: String,
        /// Its name.
        name: String,
        /// MIME type, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
        /// Its display title, if given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        /// What it is, if said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        /// Its size in bytes, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
        /// The block's annotations.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        annotations: Option<Value>,
    },
}

impl Part {
    /// An image part without annotations.
    pub fn image(mime_type: impl Into<String>, data: impl Into<String>) -> Part {
        Part::Image {
            mime_type: mime_type.into(),
            data: data.into(),
            annotations: None,
        }
    }

    /// An audio part without annotations.
    pub fn audio(mime_type: impl Into<String>, data: impl Into<String>) -> Part {
        Part::Audio {
            mime_type: mime_type.into(),
            data: data.into(),
            annotations: None,
        }
    }

    /// An embedded text resource without annotations.
    pub fn resource_text(
        uri: impl Into<String>,
        mime_type: Option<String>,
        text: impl Into<String>,
    ) -> Part {
        Part::Resource {
            uri: uri.into(),
            mime_type,
            text: Some(text.into()),
            blob: None,
            annotations: None,
        }
    }

    /// An embedded binary resource (base64) without annotations.
    pub fn resource_blob(
        uri: impl Into<String>,
        mime_type: Option<String>,
        blob: impl Into<String>,
    ) -> Part {
        Part::Resource {
            uri: uri.into(),
            mime_type,
            text: None,
            blob: Some(blob.into()),
            annotations: None,
        }
    }

    /// A resource link with only a URI, a name and perhaps a MIME type.
    pub fn link(
        uri: impl Into<String>,
        name: impl Into<String>,
        mime_type: Option<String>,
    ) -> Part {
        Part::ResourceLink {
            uri: uri.into(),
            name: name.into(),
            mime_type,
            title: None,
            description: None,
            size: None,
            annotations: None,
        }
    }

    /// The block's annotations, if any.
    pub fn annotations(&self) -> Option<&Value> {
        match self {
            Part::Text { annotations, .. }
            | Part::Image { annotations, .. }
            | Part::Audio { annotations, .. }
            | Part::Resource { annotations, .. }
            | Part::ResourceLink { annotations, .. } => annotations.as_ref(),
        }
    }

    /// The bytes this part costs against the part budget (0 for text, which the character
    /// limit bounds).
    pub fn byte_len(&self) -> usize {
        let own = match self {
            Part::Text { .. } => return 0,
            Part::Image { data, .. } | Part::Audio { data, .. } => data.len(),
            Part::Resource {
                text, blob, uri, ..
            } => {
                uri.len()
                    + text.as_ref().map_or(0, String::len)
                    + blob.as_ref().map_or(0, String::len)
            }
            Part::ResourceLink {
                uri,
                name,
                title,
                description,
                ..
            } => {
                uri.len()
                    + name.len()
                    + title.as_ref().map_or(0, String::len)
                    + description.as_ref().map_or(0, String::len)
            }
        };
        own + self
            .annotations()
            .map_or(0, |a| serde_json::to_string(a).map_or(0, |s| s.len()))
    }

    /// A one-line description for renders (a text part's text itself).
    pub fn describe(&self) -> String {
        match self {
            Part::Text { text, .. } => text.clone(),
            Part::Image {
                mime_type, data, ..
            } => {
                format!("[image {mime_type}, {} bytes base64]", data.len())
            }
            Part::Audio {
                mime_type, data, ..
            } => {
                format!("[audio {mime_type}, {} bytes base64]", data.len())
            }
            Part::Resource {
                uri,
                mime_type,
                text,
                blob,
                ..
            } => {
                let size =
                    text.as_ref().map_or(0, String::len) + blob.as_ref().map_or(0, String::len);
                format!(
                    "[resource {}{}, {size} bytes]",
                    described(uri),
                    mime_type
                        .as_ref()
                        .map(|m| format!(" {}", described(m)))
                        .unwrap_or_default()
                )
            }
            Part::ResourceLink {
                uri,
                name,
                description,
                ..
            } => match description {
                Some(d) => format!(
                    "[resource link {}: {} ({})]",
                    described(name),
                    described(uri),
                    described(d)
                ),
                None => format!("[resource link {}: {}]", described(name), described(uri)),
            },
        }
    }
}

/// The most characters of a name, URI or MIME type a part's description shows.
const MAX_DESCRIBED_CHARS: usize = 300;

/// `s` for a part's description: at most [`MAX_DESCRIBED_CHARS`] characters, so that a
/// tool's megabyte-long link name cannot get past the result limit through the text that
/// describes its parts.
fn described(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(MAX_DESCRIBED_CHARS) {
        None => std::borrow::Cow::Borrowed(s),
        Some((at, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} characters)", &s[..at], s.chars().count()))
        }
    }
}

/// Where a column's dtype came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DtypeProvenance {
    /// Measured over every row.
    Measured,
    /// Inferred from a single value (a one-row object).
    Inferred,
}

/// One column of a result, measured from the data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ColumnSpec {
    /// Column name.
    pub name: String,
    /// `string`, `integer`, `number`, `boolean`, `object`, `array`, `null` or `mixed`.
    pub dtype: String,
    /// Nulls (and missing keys) in the column; `None` when inferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub null_count: Option<u64>,
    /// Distinct non-null values; `None` when inferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct_count: Option<u64>,
    /// Measured or inferred.
    pub provenance: DtypeProvenance,
}

fn dtype_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl ColumnSpec {
    /// Measures the columns of `data`: every key of an array of objects (measured), or every
    /// key of a single object (inferred). Other shapes have no columns.
    pub fn measure(data: &Value) -> Vec<ColumnSpec> {
        match data {
            Value::Array(rows) if !rows.is_empty() && rows.iter().all(Value::is_object) => {
                let mut order: Vec<&str> = Vec::new();
                let mut seen: HashSet<&str> = HashSet::new();
                for row in rows {
                    for key in row.as_object().into_iter().flat_map(|o| o.keys()) {
                        if seen.insert(key) {
                            order.push(key);
                        }
                    }
                }
                order
                    .into_iter()
                    .map(|key| {
                        let mut dtype: Option<&'static str> = None;
                        let mut nulls = 0u64;
                        let mut distinct: HashSet<String> = HashSet::new();
                        for row in rows {
                            match row.get(key) {
                                None | Some(Value::Null) => nulls += 1,
                                Some(v) => {
                                    let d = dtype_of(v);
                                    dtype = Some(match dtype {
                                        None => d,
                                        Some(prev) if prev == d => prev,
                                        Some("integer") if d == "number" => "number",
                                        Some("number") if d == "integer" => "number",
                                        Some(_) => "mixed",
                                    });
                                    distinct.insert(canonical_json(v));
                                }
                            }
                        }
                        ColumnSpec {
                            name: key.to_owned(),
                            dtype: dtype.unwrap_or("null").to_owned(),
                            null_count: Some(nulls),
                            distinct_count: Some(distinct.len() as u64),
                            provenance: DtypeProvenance::Measured,
                        }
                    })
                    .collect()
            }
            Value::Object(map) => map
                .iter()
                .map(|(k, v)| ColumnSpec {
                    name: k.clone(),
                    dtype: dtype_of(v).to_owned(),
                    null_count: None,
                    distinct_count: None,
                    provenance: DtypeProvenance::Inferred,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Envelope {
    /// An Ok with rows and schema measured from `data`.
    pub fn ok(data: Value) -> Envelope {
        let rows = match &data {
            Value::Null => 0,
            Value::Array(items) => items.len() as u64,
            _ => 1,
        };
        let schema = ColumnSpec::measure(&data);
        Envelope::Ok {
            rows,
            schema,
            data,
            warnings: Vec::new(),
            effects: Effects::default(),
            parts: Vec::new(),
        }
    }

    /// An Ok carrying text.
    pub fn text(text: impl Into<String>) -> Envelope {
        Envelope::ok(Value::String(text.into()))
    }

    /// A hint.
    pub fn hint(
        kind: HintKind,
        message: impl Into<String>,
        alternatives: Vec<Alternative>,
    ) -> Envelope {
        Envelope::Hint {
            hint_kind: kind,
            message: message.into(),
            alternatives,
        }
    }

    /// An error.
    pub fn err(kind: ErrKind, message: impl Into<String>) -> Envelope {
        Envelope::Err {
            message: message.into(),
            err_kind: kind,
        }
    }

    /// Adds a warning to an Ok (no effect on Hint or Err, whose text carries its own message).
    pub fn with_warning(mut self, warning: Warning) -> Envelope {
        self.push_warning(warning);
        self
    }

    /// Adds a warning in place. On a Hint or an Err the warning's text is appended to the
    /// message so the model still reads it.
    pub fn push_warning(&mut self, warning: Warning) {
        match self {
            Envelope::Ok { warnings, .. } => warnings.push(warning),
            Envelope::Hint { message, .. } | Envelope::Err { message, .. } => {
                message.push_str(&format!("\n⚠ {}: {}", warning.kind, warning.message));
            }
        }
    }

    /// Adds a non-text part to an Ok.
    pub fn with_part(mut self, part: Part) -> Envelope {
        if let Envelope::Ok { parts, .. } = &mut self {
            parts.push(part);
        }
        self
    }

    /// Sets the effects of an Ok.
    pub fn with_effects(mut self, new: Effects) -> Envelope {
        if let Envelope::Ok { effects, .. } = &mut self {
            *effects = new;
        }
        self
    }

    /// `ok`, `hint` or `err`.
    pub fn kind_str(&self) -> &'static str {
        match self {
            Envelope::Ok { .. } => "ok",
            Envelope::Hint { .. } => "hint",
            Envelope::Err { .. } => "err",
        }
    }

    /// Whether this is an Ok.
    pub fn is_ok(&self) -> bool {
        matches!(self, Envelope::Ok { .. })
    }

    /// Whether this is an Err.
    pub fn is_err(&self) -> bool {
        matches!(self, Envelope::Err { .. })
    }

    /// The hint kind, for a Hint.
    pub fn hint_kind(&self) -> Option<HintKind> {
        match self {
            Envelope::Hint { hint_kind, .. } => Some(*hint_kind),
            _ => None,
        }
    }

    /// The error kind, for an Err.
    pub fn err_kind(&self) -> Option<&ErrKind> {
        match self {
            Envelope::Err { err_kind, .. } => Some(err_kind),
            _ => None,
        }
    }

    /// The message of a Hint or an Err.
    pub fn message(&self) -> Option<&str> {
        match self {
            Envelope::Hint { message, .. } | Envelope::Err { message, .. } => Some(message),
            Envelope::Ok { .. } => None,
        }
    }

    /// The warnings of an Ok.
    pub fn warnings(&self) -> &[Warning] {
        match self {
            Envelope::Ok { warnings, .. } => warnings,
            _ => &[],
        }
    }

    /// The data of an Ok.
    pub fn data(&self) -> Option<&Value> {
        match self {
            Envelope::Ok { data, .. } => Some(data),
            _ => None,
        }
    }

    /// The USD cost recorded in an Ok's effects.
    pub fn cost_usd(&self) -> f64 {
        match self {
            Envelope::Ok { effects, .. } => effects.cost_usd,
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns_are_measured_from_rows() {
        let data = json!([
            {"id": 1, "name": "a", "score": 1},
            {"id": 2, "name": null, "score": 2.5},
            {"id": 3, "name": "a", "tag": true}
        ]);
        let cols = ColumnSpec::measure(&data);
        let summary: Vec<_> = cols
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.dtype.as_str(),
                    c.null_count,
                    c.distinct_count,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("id", "integer", Some(0), Some(3)),
                ("name", "string", Some(1), Some(1)),
                ("score", "number", Some(1), Some(2)),
                ("tag", "boolean", Some(2), Some(1)),
            ]
        );
        let one = ColumnSpec::measure(&json!({"x": 1}));
        assert_eq!(one[0].provenance, DtypeProvenance::Inferred);
        assert!(ColumnSpec::measure(&json!("text")).is_empty());
    }

    #[test]
    fn ok_counts_rows() {
        assert!(matches!(
            Envelope::ok(json!([1, 2, 3])),
            Envelope::Ok { rows: 3, .. }
        ));
        assert!(matches!(
            Envelope::ok(json!(null)),
            Envelope::Ok { rows: 0, .. }
        ));
        assert!(matches!(Envelope::text("hi"), Envelope::Ok { rows: 1, .. }));
    }

    #[test]
    fn serde_roundtrip() {
        let e = Envelope::err(ErrKind::Other("custom".into()), "boom");
        let back: Envelope = serde_json::from_value(serde_json::to_value(&e).unwrap()).unwrap();
        assert_eq!(e, back);
        let h = Envelope::hint(HintKind::Schema, "no", vec![Alternative::new("a", 0.5)]);
        let back: Envelope = serde_json::from_value(serde_json::to_value(&h).unwrap()).unwrap();
        assert_eq!(h, back);
    }
}
