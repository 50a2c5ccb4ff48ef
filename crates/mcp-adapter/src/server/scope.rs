//! What one request may see and do ([`Scope`], which [`scope`] reads from the request's HTTP
//! head and `_meta`), and the state a handler instance keeps across its requests
//! ([`Connection`]: a session's, or a single stateless request's).

// Logging is deprecated by SEP-2577; 2025-era clients still set a session's level.
#![allow(deprecated)]

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use quiver_contract::{CallContext, Capabilities, Mode};
use quiver_surface::SessionKey;
use rmcp::{
    ErrorData,
    model::{LoggingLevel, RequestMetaObject},
};
use tokio_util::sync::CancellationToken;

use super::{
    Shared,
    auth::Principal,
    key::{CONVERSATION_HEADER, CONVERSATION_META, KeySources, working_set_key},
    rounds::Owner,
};
use crate::sync::lock;

/// The HTTP header naming a request's MCP session.
pub(crate) const SESSION_HEADER: &str = "mcp-session-id";

/// What one request may see and do.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    pub(crate) key: SessionKey,
    pub(super) capabilities: Arc<Capabilities>,
    pub(super) mode: Mode,
    pub(super) principal: Option<Arc<str>>,
    pub(super) tenant: Option<Arc<str>>,
    /// The end user of an `[auth.oidc]` access token (redacted in `Debug`).
    pub(super) user: Option<Arc<quiver_contract::UserCredential>>,
    /// Whether the key came from the MCP session id (forgotten when the session ends).
    pub(super) session_bound: bool,
    /// The MCP session the request belongs to: its `Mcp-Session-Id`, or the stdio
    /// connection's; none for a 2026-07-28 request, which has no session whatever headers
    /// it sends.
    pub(super) session: Option<Arc<str>>,
    /// The client's trace context: `_meta.traceparent` (SEP-414), else the HTTP
    /// `traceparent` header.
    pub(super) trace: Option<quiver_contract::trace::TraceContext>,
    /// The protocol version the request names in `_meta`, when it does.
    pub(super) protocol: Option<String>,
    /// `tcp` (HTTP) or `pipe` (stdio), for the trace.
    pub(super) transport: &'static str,
}

impl Scope {
    /// Whose call it is, for the input rounds. A request's own key is new with each
    /// request, so the retries of a call held for one come under the kind alone: the
    /// `requestState` the client was given (random, unguessable) is what names its call.
    pub(super) fn owner(&self) -> Owner {
        let key = if self.key.kind() == quiver_surface::SessionKind::Request {
            Arc::from(quiver_contract::REQUEST_SESSION_PREFIX)
        } else {
            self.key.as_arc().clone()
        };
        Owner {
            key,
            principal: self.principal.clone(),
            tenant: self.tenant.clone(),
        }
    }

    /// The call context of a request in this scope.
    pub(super) fn context(&self, cancel: CancellationToken) -> CallContext {
        let mut ctx = CallContext::for_session(self.key.clone())
            .with_capabilities((*self.capabilities).clone())
            .with_cancel(cancel);
        if let Some(p) = &self.principal {
            ctx = ctx.with_principal(p.clone());
        }
        if let Some(t) = &self.tenant {
            ctx = ctx.with_tenant(t.clone());
        }
        if let Some(u) = &self.user {
            ctx = ctx.with_user(u.clone());
        }
        ctx
    }
}

/// The state of one handler instance (a session, or a single stateless request).
pub(crate) struct Connection {
    /// The working-set keys this connection's requests used; their changes are its changes.
    pub(super) keys: Mutex<HashSet<Arc<str>>>,
    /// Keys derived from the session id, ended with the session.
    pub(super) session_keys: Mutex<HashSet<Arc<str>>>,
    /// Set once the change watcher runs.
    pub(super) watching: std::sync::atomic::AtomicBool,
    /// Cancelled when the handler is dropped (the session ended).
    pub(crate) closed: CancellationToken,
    /// Cancelled when the client ends the session (`DELETE`): its calls still running are
    /// cancelled then. Not on rmcp's idle timeout, which can drop the handler while a long
    /// direct-path call (which rmcp does not see) still runs for a connected client.
    pub(crate) deleted: CancellationToken,
    /// The level the client set with `logging/setLevel`.
    pub(crate) log_level: Mutex<Option<LoggingLevel>>,
    /// The resource URIs this session subscribed to.
    pub(super) subscriptions: Mutex<HashSet<String>>,
    /// Set once the resource-update relay runs.
    pub(super) relaying: std::sync::atomic::AtomicBool,
    /// The HTTP session id once a request named it (the direct path finds the session by it).
    pub(super) session_id: std::sync::OnceLock<Arc<str>>,
    /// Calls answered on the direct path, by JSON-RPC id, so `notifications/cancelled`
    /// reaches them.
    pub(crate) in_flight:
        Mutex<std::collections::HashMap<rmcp::model::RequestId, CancellationToken>>,
    /// The ids of this session's requests in flight on either path (the direct path's
    /// calls, and what was forwarded to rmcp until its answer ends): a second request with an
    /// id still in use is refused (rmcp would route both answers by the one id).
    pub(crate) ids_in_use: Mutex<HashSet<rmcp::model::RequestId>>,
    /// The ids this session's client cancelled lately (at most [`CANCELLED_KEPT`], newest
    /// last): a batch's request whose answer never came because it was cancelled gets no
    /// error in its place (MCP: no response to a cancelled request).
    pub(crate) cancelled: Mutex<std::collections::VecDeque<rmcp::model::RequestId>>,
}

/// How many cancelled ids a session remembers.
const CANCELLED_KEPT: usize = 64;

impl Connection {
    /// The state of a connection that has seen no request yet.
    pub(super) fn new() -> Self {
        Connection {
            keys: Mutex::new(HashSet::new()),
            session_keys: Mutex::new(HashSet::new()),
            watching: std::sync::atomic::AtomicBool::new(false),
            closed: CancellationToken::new(),
            deleted: CancellationToken::new(),
            log_level: Mutex::new(None),
            subscriptions: Mutex::new(HashSet::new()),
            relaying: std::sync::atomic::AtomicBool::new(false),
            session_id: std::sync::OnceLock::new(),
            in_flight: Mutex::new(std::collections::HashMap::new()),
            ids_in_use: Mutex::new(HashSet::new()),
            cancelled: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// Notes that the client cancelled request `id`.
    pub(crate) fn note_cancelled(&self, id: rmcp::model::RequestId) {
        let mut kept = lock(&self.cancelled);
        if kept.contains(&id) {
            return;
        }
        if kept.len() == CANCELLED_KEPT {
            kept.pop_front();
        }
        kept.push_back(id);
    }

    /// Whether the client cancelled request `id` lately.
    pub(crate) fn was_cancelled(&self, id: &rmcp::model::RequestId) -> bool {
        lock(&self.cancelled).contains(id)
    }
}

/// The scope of one request from its HTTP head (absent on stdio) and its `_meta`.
pub(crate) fn scope(
    shared: &Shared,
    parts: Option<&axum::http::request::Parts>,
    meta: &RequestMetaObject,
    fixed_session: Option<&str>,
) -> Result<Scope, ErrorData> {
    let principal = parts.and_then(|p| p.extensions.get::<Principal>());
    let header = |name: &str| {
        parts
            .and_then(|p| p.headers.get(name))
            .and_then(|v| v.to_str().ok())
    };
    // A 2026-07-28 request is stateless: an `Mcp-Session-Id` it carries names no session of
    // its own (rmcp does not check it), so it must not reach another session's working set.
    let stateless = meta
        .protocol_version()
        .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
    let session_id = if stateless {
        fixed_session
    } else {
        header(SESSION_HEADER).or(fixed_session)
    };
    // The conversation header as UTF-8 text (`to_str` would take a non-ASCII key for no
    // header at all, and the request would run in the shared anonymous working set).
    let header_conversation = match parts.and_then(|p| p.headers.get(CONVERSATION_HEADER)) {
        None => None,
        Some(v) => Some(std::str::from_utf8(v.as_bytes()).map_err(|_| {
            ErrorData::invalid_params(
                format!(
                    "the `{CONVERSATION_HEADER}` header is not UTF-8 text: send the conversation key as UTF-8"
                ),
                None,
            )
        })?),
    };
    let sources = KeySources {
        meta_conversation: meta.0.0.get(CONVERSATION_META),
        header_conversation,
        session_id,
        principal: principal.map(|p| &*p.name),
        stateless,
    };
    let key = working_set_key(&sources)?;
    // A request's own key ends with it, as a session's does.
    let session_bound = session_id.is_some_and(|sid| key.mcp_session_id() == Some(sid))
        || key.kind() == quiver_surface::SessionKind::Request;
    let mut capabilities = principal
        .map(|p| p.capabilities.clone())
        .unwrap_or_else(|| Arc::new(Capabilities::all()));
    let declared = super::model_caps::declared(
        meta.0.0.get(super::model_caps::MODEL_CAPABILITIES_META),
        header(super::model_caps::MODEL_CAPABILITIES_HEADER),
    )?;
    if declared.iter().any(|c| !capabilities.model.contains(c)) {
        let mut caps = (*capabilities).clone();
        caps.model.extend(declared);
        capabilities = Arc::new(caps);
    }
    // A request with no MCP session cannot reach a per-session server: its tools are not
    // offered to it (a call still gets the tool's refusal, in words).
    if session_id.is_none()
        && let Some(servers) = shared.session_servers.as_ref().filter(|s| s.any())
    {
        let mut caps = (*capabilities).clone();
        caps.denied_tools.extend(servers.tool_patterns());
        capabilities = Arc::new(caps);
    }
    Ok(Scope {
        key,
        capabilities,
        mode: principal
            .and_then(|p| p.mode)
            .unwrap_or(shared.options.default_mode),
        principal: principal.map(|p| p.name.clone()),
        tenant: principal.and_then(|p| p.tenant.clone()),
        user: principal.and_then(|p| p.user.clone()),
        session_bound,
        session: session_id.map(Arc::from),
        trace: trace_context(meta, &header),
        protocol: meta
            .protocol_version()
            .map(|v| v.to_string())
            .or_else(|| header("mcp-protocol-version").map(str::to_owned)),
        transport: if parts.is_some() { "tcp" } else { "pipe" },
    })
}

/// The client's W3C trace context: in `_meta` (SEP-414) when the request carries it there,
/// else in the HTTP headers.
fn trace_context<'a>(
    meta: &'a RequestMetaObject,
    header: &dyn Fn(&str) -> Option<&'a str>,
) -> Option<quiver_contract::trace::TraceContext> {
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    let (parent, state) = match meta.0.0.get("traceparent").and_then(text) {
        Some(parent) => (parent, meta.0.0.get("tracestate").and_then(text)),
        None => (
            header("traceparent")?.to_owned(),
            header("tracestate").map(str::to_owned),
        ),
    };
    Some(quiver_contract::trace::TraceContext::new(parent, state))
}
