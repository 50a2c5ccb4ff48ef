//! The port through which a running tool reaches the client that called it: sampling,
//! elicitation, roots, log messages and progress (MCP's server-to-client traffic). The MCP
//! server adapter implements it for each `tools/call`; a call that did not come over MCP has
//! none, and [`CallContext`](crate::CallContext)'s helpers then refuse with a clear error.
//!
//! Requests and results are JSON in MCP's wire shape (`sampling/createMessage` params, an
//! `elicitation/create` params object, ...), so an adapter can forward them verbatim.

use async_trait::async_trait;
use serde_json::Value;

/// What the calling client declared it can answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientFeatures {
    /// `sampling/createMessage`.
    pub sampling: bool,
    /// `elicitation/create`, in at least one mode.
    pub elicitation: bool,
    /// `roots/list`.
    pub roots: bool,
    /// Elicitation in form mode (a capability declared as `{}` means form only).
    pub elicitation_form: bool,
    /// Elicitation in URL mode (declared as `{"url": {}}`).
    pub elicitation_url: bool,
}

impl ClientFeatures {
    /// Features with each of the three switched on or off; elicitation, when on, in form
    /// mode only (what MCP makes of an `elicitation: {}` capability).
    pub fn new(sampling: bool, elicitation: bool, roots: bool) -> Self {
        ClientFeatures {
            sampling,
            elicitation,
            roots,
            elicitation_form: elicitation,
            elicitation_url: false,
        }
    }

    /// The elicitation modes the client declared; `elicitation` is on when either is.
    pub fn with_elicitation_modes(mut self, form: bool, url: bool) -> Self {
        self.elicitation = form || url;
        self.elicitation_form = form;
        self.elicitation_url = url;
        self
    }

    /// The refusal of an `elicitation/create` with `params` in a mode the client did not
    /// declare (MCP: servers MUST NOT send those), if it is one. Params without a `mode` are
    /// form mode. A client without the capability at all is refused by
    /// [`ClientRequest::undeclared`] instead.
    pub fn elicitation_refusal(&self, params: &Value) -> Option<ChannelError> {
        if !self.elicitation {
            return None;
        }
        let mode = match params.get("mode") {
            None | Some(Value::Null) => "form",
            Some(Value::String(m)) => m.as_str(),
            // Not a mode at all: the params' own check says so.
            Some(_) => return None,
        };
        let declared = match mode {
            "form" => self.elicitation_form,
            "url" => self.elicitation_url,
            _ => return None,
        };
        if declared {
            return None;
        }
        let other = if mode == "form" { "url" } else { "form" };
        Some(ChannelError::Unsupported(format!(
            "cannot send elicitation/create in {mode} mode: the MCP client declared elicitation in {other} mode only (its `elicitation` capability has no `{mode}`)"
        )))
    }
}

/// A log message's severity (RFC 5424, as MCP uses it), least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum LogLevel {
    /// Debugging detail.
    Debug,
    /// Informational.
    Info,
    /// Normal but significant.
    Notice,
    /// A warning.
    Warning,
    /// An error.
    Error,
    /// A critical condition.
    Critical,
    /// Action must be taken at once.
    Alert,
    /// The system is unusable.
    Emergency,
}

impl LogLevel {
    /// The MCP wire name (`debug`, `info`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Notice => "notice",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
            LogLevel::Alert => "alert",
            LogLevel::Emergency => "emergency",
        }
    }

    /// Parses an MCP wire name.
    pub fn parse(s: &str) -> Option<LogLevel> {
        Some(match s {
            "debug" => LogLevel::Debug,
            "info" => LogLevel::Info,
            "notice" => LogLevel::Notice,
            "warning" => LogLevel::Warning,
            "error" => LogLevel::Error,
            "critical" => LogLevel::Critical,
            "alert" => LogLevel::Alert,
            "emergency" => LogLevel::Emergency,
            _ => return None,
        })
    }
}

/// Why a request to the client did not give a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The client cannot be asked (no client attached, the capability was not declared, or
    /// the protocol forbids it); the text says which and what to do.
    #[error("{0}")]
    Unsupported(String),
    /// The request was malformed (its params do not fit the MCP schema).
    #[error("{0}")]
    Invalid(String),
    /// The client answered with a JSON-RPC error.
    #[error("the client refused the request: {message}")]
    Client {
        /// The JSON-RPC error code.
        code: i64,
        /// The client's message.
        message: String,
        /// The error's `data`, as the client sent it (a relay passes it on).
        data: Option<Value>,
    },
    /// The connection to the client failed or closed before it answered.
    #[error("{0}")]
    Transport(String),
    /// The call was cancelled while waiting for the client.
    #[error("cancelled while waiting for the client")]
    Cancelled,
}

/// The three requests a server may send its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClientRequest {
    /// `sampling/createMessage`.
    CreateMessage,
    /// `elicitation/create`.
    Elicit,
    /// `roots/list`.
    ListRoots,
}

impl ClientRequest {
    /// The request named by its MCP method; any other method is refused in words.
    pub fn parse(method: &str) -> Result<Self, ChannelError> {
        match method {
            "sampling/createMessage" => Ok(ClientRequest::CreateMessage),
            "elicitation/create" => Ok(ClientRequest::Elicit),
            "roots/list" => Ok(ClientRequest::ListRoots),
            other => Err(ChannelError::Invalid(format!(
                "`{other}` is not a request a server may send its client: use sampling/createMessage, elicitation/create or roots/list"
            ))),
        }
    }

    /// The MCP method.
    pub fn method(self) -> &'static str {
        match self {
            ClientRequest::CreateMessage => "sampling/createMessage",
            ClientRequest::Elicit => "elicitation/create",
            ClientRequest::ListRoots => "roots/list",
        }
    }

    /// The client capability it needs (`sampling`, `elicitation`, `roots`).
    pub fn capability(self) -> &'static str {
        match self {
            ClientRequest::CreateMessage => "sampling",
            ClientRequest::Elicit => "elicitation",
            ClientRequest::ListRoots => "roots",
        }
    }

    /// Whether `features` declare that capability.
    pub fn declared(self, features: ClientFeatures) -> bool {
        match self {
            ClientRequest::CreateMessage => features.sampling,
            ClientRequest::Elicit => features.elicitation,
            ClientRequest::ListRoots => features.roots,
        }
    }

    /// The refusal for a client that did not declare the capability.
    pub fn undeclared(self) -> ChannelError {
        ChannelError::Unsupported(format!(
            "cannot send {}: the MCP client did not declare the `{}` capability",
            self.method(),
            self.capability()
        ))
    }
}

/// A tool's way back to the client that called it. Implemented by the MCP server adapter per
/// `tools/call`; carried untouched through composition (`CallContext::call_tool`).
#[async_trait]
pub trait ClientChannel: Send + Sync {
    /// What the client declared.
    fn features(&self) -> ClientFeatures;

    /// `sampling/createMessage`: `params` and the result in MCP's wire shape.
    async fn create_message(&self, params: Value) -> Result<Value, ChannelError>;

    /// `elicitation/create`: `params` and the result in MCP's wire shape.
    async fn elicit(&self, params: Value) -> Result<Value, ChannelError>;

    /// `roots/list`: the result (`{"roots": [...]}`).
    async fn list_roots(&self) -> Result<Value, ChannelError>;

    /// One of the three requests above by its MCP method, named `key`. Where the protocol
    /// carries requests to the client in a keyed map (2026-07-28: the `inputRequests` of an
    /// `InputRequiredResult`), the request goes under that key, so a client (or a test) can
    /// rely on the name; elsewhere the key is unused. Two requests of one round with the
    /// same key: the second gets a generated name.
    async fn request_named(
        &self,
        key: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, ChannelError> {
        let _ = key;
        match ClientRequest::parse(method)? {
            ClientRequest::CreateMessage => self.create_message(params).await,
            ClientRequest::Elicit => self.elicit(params).await,
            ClientRequest::ListRoots => self.list_roots().await,
        }
    }

    /// Sends a log message (`notifications/message`) if the client's level admits it.
    /// Best effort: a message the client cannot take is dropped.
    async fn log(&self, level: LogLevel, logger: Option<&str>, data: Value);

    /// Reports the call's progress (`notifications/progress`) if the client asked for it.
    /// Values must increase; best effort.
    async fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>);

    /// Whether the client asked for this call's progress; a tool that forwards the call
    /// elsewhere asks for progress only then. Defaults to yes.
    fn wants_progress(&self) -> bool {
        true
    }

    /// Why a call that was cancelled was, when it was not the client giving up on the call
    /// itself: words that follow "cancelled" (such as "because its client ended the MCP
    /// session"), for the call's answer and its log row. Defaults to none ("by the caller").
    fn cancelled_because(&self) -> Option<&'static str> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn elicitation_is_sent_only_in_a_declared_mode() {
        let form_only = ClientFeatures::new(false, true, false);
        let url_only = ClientFeatures::default().with_elicitation_modes(false, true);
        let both = ClientFeatures::default().with_elicitation_modes(true, true);
        let form = json!({"message": "m", "requestedSchema": {"type": "object"}});
        let url = json!({"mode": "url", "message": "m", "url": "https://x", "elicitationId": "e"});
        assert_eq!(form_only.elicitation_refusal(&form), None);
        assert_eq!(both.elicitation_refusal(&url), None);
        assert_eq!(both.elicitation_refusal(&form), None);
        let refused = form_only.elicitation_refusal(&url).expect("url refused");
        assert!(
            refused.to_string().contains("in url mode")
                && refused.to_string().contains("form mode only"),
            "{refused}"
        );
        let refused = url_only.elicitation_refusal(&form).expect("form refused");
        assert!(refused.to_string().contains("in form mode"), "{refused}");
        // No capability at all is the capability check's refusal, not this one's.
        assert_eq!(ClientFeatures::default().elicitation_refusal(&url), None);
    }
}
