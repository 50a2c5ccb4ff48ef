//! The crate's error, [`McpError`]: harness faults of the MCP adapter, by kind.

use thiserror::Error;

/// Harness faults of the MCP adapter. A failing tool call is never one of these: it is an
/// Err envelope the model reads.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum McpError {
    /// The configuration breaks a rule; the message names the server and the fix.
    #[error("MCP configuration: {0}")]
    Config(String),
    /// An upstream server refused us for good (unauthorized, unsupported protocol, a malformed
    /// tool list); retrying will not help.
    #[error("MCP server \"{server}\" rejected the connection: {reason}")]
    Rejected {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// A required server was not ready in time.
    #[error("MCP server \"{server}\" is not ready: {reason}")]
    NotReady {
        /// The server.
        server: String,
        /// What it is doing instead.
        reason: String,
    },
    /// No such server.
    #[error("no MCP server named \"{0}\"")]
    UnknownServer(String),
    /// A request to an upstream failed.
    #[error("MCP server \"{server}\": {reason}")]
    Upstream {
        /// The server.
        server: String,
        /// What failed.
        reason: String,
    },
    /// The client was closed.
    #[error("the MCP client is closed")]
    Closed,
}
