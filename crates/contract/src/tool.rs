use async_trait::async_trait;
use serde_json::Value;

use crate::{Alternative, CallContext, Envelope, ErrKind, HintKind, ToolSpec};

/// What a tool's handler returns. `Err` is the `HintException` of the design: `?` on a
/// [`ToolError`] turns a recoverable correction or a failure into the matching envelope.
pub type ToolResult = Result<Envelope, ToolError>;

/// A correction or failure signalled by a handler, turned into a Hint or Err envelope by the
/// pipeline.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// A recoverable correction.
    #[error("{kind:?} hint: {message}")]
    Hint {
        /// The hint kind.
        kind: HintKind,
        /// What to fix.
        message: String,
        /// Ranked candidates.
        alternatives: Vec<Alternative>,
    },
    /// A failure.
    #[error("{message}")]
    Failed {
        /// Its class.
        kind: ErrKind,
        /// What happened.
        message: String,
    },
}

impl ToolError {
    /// A schema hint ("did you mean").
    pub fn schema_hint(message: impl Into<String>, alternatives: Vec<Alternative>) -> Self {
        ToolError::Hint {
            kind: HintKind::Schema,
            message: message.into(),
            alternatives,
        }
    }

    /// A fetch hint ("add:" / "narrow:").
    pub fn fetch_hint(message: impl Into<String>, alternatives: Vec<Alternative>) -> Self {
        ToolError::Hint {
            kind: HintKind::Fetch,
            message: message.into(),
            alternatives,
        }
    }

    /// An ambiguity ("pick one").
    pub fn ambiguous(message: impl Into<String>, alternatives: Vec<Alternative>) -> Self {
        ToolError::Hint {
            kind: HintKind::Ambiguous,
            message: message.into(),
            alternatives,
        }
    }

    /// A failure of the tool's own work.
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError::Failed {
            kind: ErrKind::ToolFailed,
            message: message.into(),
        }
    }

    /// A failure of a given kind.
    pub fn err(kind: ErrKind, message: impl Into<String>) -> Self {
        ToolError::Failed {
            kind,
            message: message.into(),
        }
    }
}

impl From<ToolError> for Envelope {
    fn from(e: ToolError) -> Envelope {
        match e {
            ToolError::Hint {
                kind,
                message,
                alternatives,
            } => Envelope::hint(kind, message, alternatives),
            ToolError::Failed { kind, message } => Envelope::err(kind, message),
        }
    }
}

impl From<serde_json::Error> for ToolError {
    fn from(e: serde_json::Error) -> Self {
        ToolError::schema_hint(
            format!("the arguments do not fit the schema: {e}"),
            Vec::new(),
        )
    }
}

/// A tool: a spec and a handler. Every capability Quiver offers is one of these.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait Tool: Send + Sync {
    /// The tool's spec.
    fn spec(&self) -> &ToolSpec;

    /// Whether the tool only reads. Batches run read-only calls concurrently.
    fn read_only(&self) -> bool {
        self.spec().is_read_only()
    }

    /// Whether a call may send anything to the calling client through
    /// [`CallContext::client`]: a request (sampling, elicitation, roots), a log message,
    /// progress; or call other tools ([`CallContext::call_tool`]), which may. On by default.
    /// A tool that says no (a lookup in Quiver's own state, such as `tool_search`) is
    /// answered with one JSON body even for a client that declared sampling, elicitation or
    /// roots, whose other calls need a stream for what the call may send; if it asks the
    /// client anyway, the ask is refused as undeclared.
    fn reaches_client(&self) -> bool {
        true
    }

    /// Runs the tool. The input has already been validated against the spec's schema and
    /// stripped of narration keys.
    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult;

    /// Releases resources when the tool is removed from the catalog.
    fn release(&self) {}
}
