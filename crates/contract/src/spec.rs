use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{ContractError, names::validate_tool_name};

/// Behaviour hints, as MCP's `ToolAnnotations` carries them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Annotations {
    /// The tool does not change its environment. Plan mode lists only these.
    pub read_only: bool,
    /// The tool may destroy data.
    pub destructive: bool,
    /// Calling it twice with the same arguments has no further effect.
    pub idempotent: bool,
    /// The tool talks to an open world (the web, third parties).
    pub open_world: bool,
}

impl Annotations {
    /// Read-only annotations (idempotent, not destructive).
    pub fn read_only() -> Self {
        Self {
            read_only: true,
            destructive: false,
            idempotent: true,
            open_world: false,
        }
    }

    /// Mutating annotations.
    pub fn mutating() -> Self {
        Self::default()
    }

    /// Sets `destructive`.
    pub fn destructive(mut self, yes: bool) -> Self {
        self.destructive = yes;
        self
    }

    /// Sets `idempotent`.
    pub fn idempotent(mut self, yes: bool) -> Self {
        self.idempotent = yes;
        self
    }

    /// Sets `open_world`.
    pub fn open_world(mut self, yes: bool) -> Self {
        self.open_world = yes;
        self
    }
}

/// A tool's category. `internal` is special: callable, never listed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Category(pub String);

impl Category {
    /// The category of tools that are callable but never listed.
    pub const INTERNAL: &'static str = "internal";

    /// Whether this is the `internal` category.
    pub fn is_internal(&self) -> bool {
        self.0 == Self::INTERNAL
    }
}

impl Default for Category {
    fn default() -> Self {
        Category("general".to_owned())
    }
}

impl From<&str> for Category {
    fn from(s: &str) -> Self {
        Category(s.to_owned())
    }
}

/// Where a tool is in its review lifecycle. Only `Approved` tools are visible.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Lifecycle {
    /// Being written.
    Draft,
    /// Under test.
    Testing,
    /// Live.
    #[default]
    Approved,
    /// Turned down.
    Rejected,
}

impl Lifecycle {
    /// The lower-case name used in storage and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Draft => "draft",
            Lifecycle::Testing => "testing",
            Lifecycle::Approved => "approved",
            Lifecycle::Rejected => "rejected",
        }
    }
}

/// The mode a session runs in; it decides which tools the model sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Mode {
    /// An interactive conversation (the default).
    #[default]
    Chat,
    /// An autonomous agent run.
    Agentic,
    /// A delegated sub-task.
    Delegate,
    /// Planning: read-only tools only.
    Plan,
}

impl Mode {
    /// Every mode, in a fixed order.
    pub const ALL: [Mode; 4] = [Mode::Chat, Mode::Agentic, Mode::Delegate, Mode::Plan];

    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Chat => "chat",
            Mode::Agentic => "agentic",
            Mode::Delegate => "delegate",
            Mode::Plan => "plan",
        }
    }

    /// Parses a lower-case mode name.
    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// Everything the catalog, the surface and the model know about one tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolSpec {
    /// The unique name (see the name rules).
    pub name: String,
    /// What the tool does and when to use it.
    pub description: String,
    /// A name for people (MCP's `title`, shown by clients in place of `name`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The JSON Schema of the arguments; always an object schema.
    pub input_schema: Value,
    /// The JSON Schema of structured output, when the tool declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// MCP-style behaviour hints.
    #[serde(default)]
    pub annotations: Annotations,
    /// The category; `internal` tools are callable but never listed.
    #[serde(default)]
    pub category: Category,
    /// A short line a UI may show while the tool runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// The tool can return large outputs (a hint for result shaping).
    #[serde(default)]
    pub large_output: bool,
    /// Review lifecycle; only approved tools are visible.
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// Disabled tools are neither listed nor callable.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Listed only in plan mode (for example `plan` itself).
    #[serde(default)]
    pub plan_only: bool,
    /// A tabular tool: an Ok with an empty schema draws a validator warning.
    #[serde(default)]
    pub tabular: bool,
    /// Opts into progressive disclosure: advertised with a lightweight spec until loaded.
    #[serde(default)]
    pub progressive: bool,
    /// A model capability that makes this tool redundant (for example `web_search`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_by_model_capability: Option<String>,
    /// Model capabilities the tool needs (for example `vision` for a tool that returns
    /// images): it is offered only to callers whose model declares every one
    /// ([`crate::Capabilities::satisfies`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
}

fn yes() -> bool {
    true
}

impl ToolSpec {
    /// A spec with the given name and description, an empty object schema, and defaults
    /// elsewhere (mutating, general, approved, enabled).
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            title: None,
            input_schema: json!({"type": "object"}),
            output_schema: None,
            annotations: Annotations::default(),
            category: Category::default(),
            status_message: None,
            large_output: false,
            lifecycle: Lifecycle::Approved,
            enabled: true,
            plan_only: false,
            tabular: false,
            progressive: false,
            replaced_by_model_capability: None,
            requires: Vec::new(),
        }
    }

    /// Sets the input schema.
    pub fn with_schema(mut self, schema: Value) -> Self {
        self.input_schema = schema;
        self
    }

    /// Sets the annotations.
    pub fn with_annotations(mut self, annotations: Annotations) -> Self {
        self.annotations = annotations;
        self
    }

    /// Marks the tool read-only (and idempotent).
    pub fn read_only(mut self) -> Self {
        self.annotations = Annotations::read_only();
        self
    }

    /// Sets the category.
    pub fn with_category(mut self, category: impl Into<String>) -> Self {
        self.category = Category(category.into());
        self
    }

    /// Sets the lifecycle.
    pub fn with_lifecycle(mut self, lifecycle: Lifecycle) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// Sets `enabled`.
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Sets `plan_only`.
    pub fn plan_only(mut self) -> Self {
        self.plan_only = true;
        self
    }

    /// Sets `tabular`.
    pub fn tabular(mut self) -> Self {
        self.tabular = true;
        self
    }

    /// Opts into progressive disclosure.
    pub fn progressive(mut self) -> Self {
        self.progressive = true;
        self
    }

    /// Sets the title (a name for people).
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Sets the status message.
    pub fn with_status_message(mut self, msg: impl Into<String>) -> Self {
        self.status_message = Some(msg.into());
        self
    }

    /// Sets `large_output`.
    pub fn with_large_output(mut self, yes: bool) -> Self {
        self.large_output = yes;
        self
    }

    /// Sets the output schema.
    pub fn with_output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Sets the model capabilities the tool needs.
    pub fn requiring(mut self, capabilities: Vec<String>) -> Self {
        self.requires = capabilities;
        self
    }

    /// Sets the model capability that replaces this tool.
    pub fn replaced_by(mut self, capability: impl Into<String>) -> Self {
        self.replaced_by_model_capability = Some(capability.into());
        self
    }

    /// Whether the tool is read-only.
    pub fn is_read_only(&self) -> bool {
        self.annotations.read_only
    }

    /// Whether the tool is callable at all: enabled and approved.
    pub fn is_live(&self) -> bool {
        self.enabled && self.lifecycle == Lifecycle::Approved
    }

    /// Whether the tool may appear in a list for `mode`: live, not internal, and passing the
    /// plan-mode rules (plan lists read-only tools only; plan-only tools only in plan).
    pub fn listed_in(&self, mode: Mode) -> bool {
        if !self.is_live() || self.category.is_internal() {
            return false;
        }
        match mode {
            Mode::Plan => self.is_read_only() || self.plan_only,
            _ => !self.plan_only,
        }
    }

    /// Checks the name rules, that the input schema is an object schema, and that an output
    /// schema (when there is one) describes an object, as MCP requires of structured results.
    pub fn validate(&self) -> Result<(), ContractError> {
        validate_tool_name(&self.name)?;
        let invalid = |reason: String| ContractError::InvalidSchema {
            name: self.name.clone(),
            reason,
        };
        let Some(obj) = self.input_schema.as_object() else {
            return Err(invalid("its input schema is not a JSON object".into()));
        };
        match obj.get("type") {
            Some(Value::String(t)) if t == "object" => {}
            None => {}
            Some(other) => {
                return Err(invalid(format!(
                    "its input schema's top-level type is {other}, not \"object\""
                )));
            }
        }
        if let Some(out) = &self.output_schema {
            output_schema_problem(out).map_or(Ok(()), |p| Err(invalid(p)))?;
        }
        Ok(())
    }

    /// The lightweight spec of progressive disclosure: the first sentence of the description,
    /// a pointer to `describe_tool`, and an open object schema.
    pub fn lightweight(&self) -> ToolSpec {
        let first = first_sentence(&self.description);
        let mut light = self.clone();
        light.description = format!(
            "{first} (Summary only: call describe_tool with name `{}` for the full schema.)",
            self.name
        );
        light.input_schema = json!({"type": "object", "additionalProperties": true});
        light.output_schema = None;
        light
    }

    /// The size of this definition as the surface budgets it: name + description + schema
    /// (compact JSON) + 32 bytes of framing.
    pub fn definition_bytes(&self) -> usize {
        self.name.len()
            + self.description.len()
            + self.title.as_ref().map_or(0, String::len)
            + serde_json::to_string(&self.input_schema)
                .map(|s| s.len())
                .unwrap_or(0)
            + 32
    }
}

fn first_sentence(text: &str) -> &str {
    let text = text.trim();
    let cut = text
        .char_indices()
        .find(|&(i, c)| {
            (c == '.' && text[i + 1..].starts_with(char::is_whitespace)) || c == '\n' || c == '。'
        })
        .map(|(i, c)| i + c.len_utf8())
        .unwrap_or(text.len());
    text[..cut].trim_end()
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What is wrong with an output schema, if anything: MCP requires one to be an object
/// schema whose top-level `type` is `"object"` (structured content is always an object).
pub fn output_schema_problem(schema: &Value) -> Option<String> {
    let Some(obj) = schema.as_object() else {
        return Some(format!(
            "its output schema is not a JSON object but {}",
            value_kind(schema)
        ));
    };
    match obj.get("type") {
        Some(Value::String(t)) if t == "object" => None,
        None => Some("its output schema has no top-level `type`; MCP requires \"object\"".into()),
        Some(other) => Some(format!(
            "its output schema's top-level type is {other}, not \"object\" (MCP structured content is an object)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_mode_lists_read_only_and_plan_only_tools() {
        let ro = ToolSpec::new("look", "Looks.").read_only();
        let rw = ToolSpec::new("write", "Writes.");
        let plan = ToolSpec::new("plan", "Plans.").plan_only();
        let internal = ToolSpec::new("secret", "Hidden.")
            .read_only()
            .with_category("internal");
        let draft = ToolSpec::new("wip", "Draft.")
            .read_only()
            .with_lifecycle(Lifecycle::Draft);
        assert!(ro.listed_in(Mode::Plan) && ro.listed_in(Mode::Chat));
        assert!(!rw.listed_in(Mode::Plan) && rw.listed_in(Mode::Chat));
        assert!(plan.listed_in(Mode::Plan) && !plan.listed_in(Mode::Chat));
        assert!(!internal.listed_in(Mode::Chat) && internal.is_live());
        assert!(!draft.listed_in(Mode::Chat) && !draft.is_live());
    }

    #[test]
    fn lightweight_keeps_the_first_sentence() {
        let spec = ToolSpec::new(
            "fetch_page",
            "Fetches a web page. Use it for URLs. Long tail.",
        );
        let light = spec.lightweight();
        assert!(
            light
                .description
                .starts_with("Fetches a web page. (Summary only")
        );
        assert_eq!(light.input_schema["type"], "object");
    }

    #[test]
    fn schema_must_be_an_object_schema() {
        let bad = ToolSpec::new("x", "X.").with_schema(json!({"type": "string"}));
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("not \"object\"")
        );
        let bad = ToolSpec::new("x", "X.").with_schema(json!(3));
        assert!(bad.validate().is_err());
        assert!(ToolSpec::new("x", "X.").validate().is_ok());
    }
}
