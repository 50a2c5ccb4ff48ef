//! The port through which the server starts and stops the MCP servers that run once per
//! session ([`SessionServers`]): the MCP client implements it (its `scope = "session"`
//! servers), the server calls it. It sits below both sides, so neither imports the other.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{ClientChannel, McpSession};

/// Per-session MCP servers, as the server side drives them. A session's servers stop when
/// its [`McpSession::ended`] fires; the implementation watches it.
#[async_trait]
pub trait SessionServers: Send + Sync {
    /// Whether any server is configured per session (when none, the server never calls
    /// [`SessionServers::open`]).
    fn any(&self) -> bool;

    /// The names of the per-session servers' tools, as patterns (`mcp__<prefix>__*`): not
    /// offered to a request with no MCP session, which could not reach them.
    fn tool_patterns(&self) -> Vec<String>;

    /// The session's first `tools/list` or `tools/call` (and each one after): starts the
    /// per-session servers it does not run yet, for its `principal` (none: `anonymous`),
    /// and waits (at most each server's connect timeout) until they have listed their tools.
    /// `client` answers the servers' `roots/list` while it is the latest request of the
    /// session. A server refused (over its cap) or failing to start is not an error here:
    /// its tools answer why when called.
    async fn open(
        &self,
        session: &McpSession,
        principal: Option<&str>,
        client: Option<Arc<dyn ClientChannel>>,
    );

    /// Whether every per-session server has been started for `session` (or refused) by an
    /// earlier [`SessionServers::open`]. Until then, a request of the session should come
    /// with its client's channel: a server asks for its roots as it starts.
    fn opened(&self, session: &str) -> bool;

    /// The per-session servers' tools that `session` must not see: the names another
    /// session's process listed that this session's own process of that server did not (a
    /// server listing tools by its roots lists other names per session). A server this
    /// session's process has not listed yet hides nothing: its tools then answer why they
    /// cannot run.
    fn hidden_tools(&self, session: &str) -> Vec<String>;

    /// The session's client said its roots changed (`notifications/roots/list_changed`):
    /// its servers are told, and fetch them again through `client` (the session's own
    /// channel) unless a later request brings another.
    fn roots_changed(&self, session: &str, client: Option<Arc<dyn ClientChannel>>);
}
