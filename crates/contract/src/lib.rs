//! The vocabulary every Quiver crate speaks: tool names and their rules, [`ToolSpec`], the
//! [`Envelope`] result contract (Ok / Hint / Err) with its model-facing renders, the call
//! context, and the [`Tool`] trait. No I/O and no engine lives here; adapters convert their
//! engines' types to and from these at their edges.
//!
//! # Example
//!
//! A built-in tool made of a typed argument struct and an async function, called directly,
//! and the text a model reads of its answer:
//!
//! ```
//! use quiver_contract::{
//!     CallContext, Envelope, RenderOptions, Tool, ToolSpec, render, typed_tool,
//! };
//! use serde_json::json;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Add {
//!     a: i64,
//!     b: i64,
//! }
//!
//! let add = typed_tool(
//!     ToolSpec::new("add", "Adds two integers.").read_only(),
//!     |args: Add, _ctx: CallContext| async move { Ok(Envelope::ok(json!({"sum": args.a + args.b}))) },
//! );
//! // The input schema is derived from `Add`.
//! assert_eq!(add.spec().input_schema["required"], json!(["a", "b"]));
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! let answer = runtime
//!     .block_on(add.call(json!({"a": 2, "b": 3}), &CallContext::for_session("s1")))
//!     .unwrap();
//! assert!(answer.is_ok());
//! assert!(render(&answer, &RenderOptions::default()).contains('5'));
//! ```

mod channel;
mod context;
mod envelope;
mod error;
mod finding;
mod hash;
mod legacy;
mod lint;
mod names;
mod render;
mod spec;
mod tool;
pub mod trace;
mod typed;

pub use channel::{ChannelError, ClientChannel, ClientFeatures, ClientRequest, LogLevel};
pub use context::{
    CallBudget, CallContext, Capabilities, McpSession, REQUEST_SESSION_PREFIX, ToolInvoker,
    UserCredential, pattern_matches,
};
pub use envelope::{
    Alternative, ColumnSpec, DtypeProvenance, Effects, Envelope, ErrKind, HintKind, Part, Warning,
};
pub use error::ContractError;
pub use finding::{Finding, Severity};
pub use hash::{args_hash, args_hash_canonical, canonical_json, secret_fingerprint};
pub use legacy::coerce_legacy;
pub use lint::{
    BreakingChange, LintFinding, breaking_changes, breaking_changes_between, lint_spec,
    provider_name_fix, provider_name_problem,
};
pub use names::{
    MAX_NAME_BYTES, NameKind, is_bidi_control, is_hidden_in_text, is_invisible, is_tag_character,
    mcp_tool_name, printable, printable_lines, quoted_name, server_name_suggestion, short_number,
    split_mcp_name, validate_server_name, validate_tool_name, without_hidden,
    without_tag_characters,
};
pub use render::{RenderOptions, duration_text, render, strip_status_line};
pub use spec::{Annotations, Category, Lifecycle, Mode, ToolSpec, output_schema_problem};
pub use tool::{Tool, ToolError, ToolResult};
pub use typed::{TypedTool, typed_tool};

/// The narration keys a model sometimes adds to tool arguments. The dispatcher strips them
/// before validation and hands the first non-empty one to the tool as `reasoning`.
pub const NARRATION_KEYS: [&str; 5] = [
    "reasoning",
    "explanation",
    "thought",
    "rationale",
    "justification",
];
