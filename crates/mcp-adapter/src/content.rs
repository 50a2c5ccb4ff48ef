//! The port through which the server serves resources, prompts and completions: whatever
//! implements [`ContentSource`] (the MCP client, passing its upstreams through; a fixture
//! serving its own). Everything crosses it as MCP wire JSON, so an implementation needs no
//! rmcp types; the handler turns it into rmcp's typed results (and rejects what does not
//! parse as such). It sits below both sides: the server consumes it and the client
//! implements it, so neither imports the other.
//!
//! `resources/read` and `prompts/get` take the request's [`CallContext`]: its client channel
//! carries what the source asks the client while it answers (an upstream's elicitation
//! during its `prompts/get`, say; on the 2026-07-28 protocol these become
//! `InputRequiredResult` rounds), and its cancellation token fires when the client cancels.

use async_trait::async_trait;
use quiver_contract::{CallContext, Capabilities};
use serde_json::{Map, Value};
use tokio::sync::broadcast;

/// What a source offers; the server advertises exactly this in its capabilities.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContentOffer {
    /// `resources/list`, `resources/templates/list`, `resources/read`.
    pub resources: bool,
    /// `resources/subscribe` and `notifications/resources/updated`.
    pub subscribe: bool,
    /// `prompts/list`, `prompts/get`.
    pub prompts: bool,
    /// `completion/complete`.
    pub completions: bool,
    /// `notifications/resources/list_changed` and `notifications/prompts/list_changed` (see
    /// [`ContentSource::list_changes`]).
    pub list_changed: bool,
}

/// Which list changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListChange {
    /// `resources/list` (and the templates) would answer differently now.
    Resources,
    /// `prompts/list` would answer differently now.
    Prompts,
}

/// A change of one list, and whose entries changed: a session hears of it only when its
/// capabilities reach that server ([`Capabilities::allows_server`]), since the lists it is
/// answered are bounded by them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListChanged {
    /// Which list.
    pub list: ListChange,
    /// The upstream server whose entries changed; `None` when the source cannot tell (every
    /// session hears of it).
    pub server: Option<std::sync::Arc<str>>,
}

impl ListChanged {
    /// A change of `list` of `server`'s entries.
    pub fn of(list: ListChange, server: impl Into<std::sync::Arc<str>>) -> Self {
        ListChanged {
            list,
            server: Some(server.into()),
        }
    }

    /// A change of `list` that names no server.
    pub fn unattributed(list: ListChange) -> Self {
        ListChanged { list, server: None }
    }

    /// Whether a session with `caps` is told: its lists can have changed.
    pub fn reaches(&self, caps: &Capabilities) -> bool {
        self.server
            .as_deref()
            .is_none_or(|server| caps.allows_server(server))
    }
}

impl ContentOffer {
    /// Resources (with subscriptions), prompts and completions.
    pub fn all() -> Self {
        ContentOffer {
            resources: true,
            subscribe: true,
            prompts: true,
            completions: true,
            list_changed: true,
        }
    }

    /// Whether anything is offered.
    pub fn any(&self) -> bool {
        self.resources || self.prompts || self.completions
    }
}

/// Why a content request failed; each maps to one JSON-RPC error the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContentError {
    /// No such resource (-32002) or prompt (-32602); the message says what to call instead.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed (-32602).
    #[error("{0}")]
    InvalidParams(String),
    /// The upstream that owns it answered with this JSON-RPC error; passed through with
    /// its code, the message naming the server.
    #[error("{message}")]
    Upstream {
        /// The upstream's error code.
        code: i32,
        /// The message.
        message: String,
    },
    /// The owner is down, did not answer in time, or sent something unusable (-32603).
    #[error("{0}")]
    Unavailable(String),
}

/// A source of resources, prompts and completions for the MCP server.
#[async_trait]
pub trait ContentSource: Send + Sync {
    /// What it offers (asked once per session, at `initialize`).
    fn offer(&self) -> ContentOffer;

    /// The `instructions` of the upstream servers `caps` allows
    /// ([`Capabilities::allows_server`]), by server name: what each told its clients about
    /// using its tools, for Quiver's own `instructions`. None by default.
    fn instructions(&self, caps: &Capabilities) -> Vec<(String, String)> {
        let _ = caps;
        Vec::new()
    }

    /// Every resource (wire `Resource` objects) of the servers `caps` allows
    /// ([`Capabilities::allows_server`]), at most 10,000 a server.
    async fn list_resources(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError>;

    /// Every resource template (wire `ResourceTemplate` objects) of the servers `caps`
    /// allows, at most 10,000 a server.
    async fn list_resource_templates(
        &self,
        caps: &Capabilities,
    ) -> Result<Vec<Value>, ContentError>;

    /// Reads one resource: a wire `ReadResourceResult`. `ctx` is the request's (see the
    /// module docs); a resource of a server its capabilities do not allow is not found.
    async fn read_resource(&self, uri: &str, ctx: &CallContext) -> Result<Value, ContentError>;

    /// Starts updates for `uri` (called once per URI per session; a source counts them); a
    /// resource of a server `caps` does not allow is not found.
    async fn subscribe(&self, uri: &str, caps: &Capabilities) -> Result<(), ContentError>;

    /// Ends one session's interest in `uri`.
    async fn unsubscribe(&self, uri: &str) -> Result<(), ContentError>;

    /// The URIs of updated resources, as they happen; the server relays each to the
    /// sessions subscribed to it.
    fn resource_updates(&self) -> broadcast::Receiver<String>;

    /// The client whose working-set key is `client` said its roots changed
    /// (`notifications/roots/list_changed`): a source that passed its roots on tells whoever
    /// holds them. By default nothing.
    fn roots_changed(&self, client: &str) {
        let _ = client;
    }

    /// Changes of the resource and prompt lists, as they happen; the server sends
    /// `notifications/resources/list_changed` or `notifications/prompts/list_changed` to each
    /// session the change [reaches](ListChanged::reaches) (advertised when the offer has
    /// `list_changed`). By default nothing ever changes.
    fn list_changes(&self) -> broadcast::Receiver<ListChanged> {
        broadcast::channel(1).1
    }

    /// Every prompt (wire `Prompt` objects, names as the client must send them back) of the
    /// servers `caps` allows.
    async fn list_prompts(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError>;

    /// Renders one prompt: a wire `GetPromptResult`. `ctx` is the request's (see the
    /// module docs); a prompt of a server its capabilities do not allow is not found.
    async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        ctx: &CallContext,
    ) -> Result<Value, ContentError>;

    /// Answers a `completion/complete` request (wire params in, wire `CompleteResult` out)
    /// for a prompt or resource of a server `caps` allows.
    async fn complete(&self, request: Value, caps: &Capabilities) -> Result<Value, ContentError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's list change reaches a session whose capabilities allow the server (no
    /// `allowed_servers`, or a pattern matching it), not one limited to other servers or to
    /// none; a change that names no server reaches every session.
    #[test]
    fn a_list_change_reaches_the_sessions_that_reach_its_server() {
        let fy = ListChanged::of(ListChange::Resources, "fy");
        let cases = [
            (Capabilities::all(), true),
            (
                Capabilities::all().with_allowed_servers(vec!["f*".into()]),
                true,
            ),
            (
                Capabilities::all().with_allowed_servers(vec!["fx".into()]),
                false,
            ),
            (Capabilities::all().with_allowed_servers(Vec::new()), false),
        ];
        for (caps, reached) in cases {
            assert_eq!(fy.reaches(&caps), reached, "{caps:?}");
            assert!(
                ListChanged::unattributed(ListChange::Prompts).reaches(&caps),
                "{caps:?}"
            );
        }
    }
}
