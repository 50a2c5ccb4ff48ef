//! The direct path: a plain `tools/call` on an established session-era (2025) HTTP session
//! is answered here with one `application/json` response, without rmcp's session machinery
//! (a request-wise channel through the session worker, the service loop, an SSE stream and
//! a reply cache kept for resumption). Everything else, and any request this path is not
//! sure about, goes to rmcp's streamable-HTTP service unchanged, which answers it (or its
//! error). A JSON response is one of the two answers the 2025 transports allow
//! for a request; a call that asks for progress still gets its SSE stream from rmcp, and a
//! call that sends log messages gets an SSE stream of its own from the first one on (the
//! messages, then the answer).
//!
//! The direct path answers only when all of these hold, else rmcp does:
//! - the server is not shutting down;
//! - `POST` with `Content-Type: application/json`, an `Accept` naming both
//!   `application/json` and `text/event-stream` (no weights), a known body length of at most
//!   [`MAX_DIRECT_BODY`], a `Host` the server accepts and no `Origin` or an accepted one;
//! - an `Mcp-Session-Id` of a live session whose handler has registered it, and no
//!   `Mcp-Protocol-Version` or a 2025-era one;
//! - the session's client declared no sampling, elicitation or roots (a call's relayed
//!   server-to-client requests need rmcp's per-call stream), or the tool
//!   sends its client nothing ([`Tool::reaches_client`](quiver_contract::Tool::reaches_client):
//!   `tool_search`, `describe_tool`, skills), which then runs with nothing declared;
//! - the body is one JSON-RPC request `tools/call` with only `name`, `arguments` and
//!   `_meta` params, and `_meta` has no `progressToken` and no `io.modelcontextprotocol/`
//!   key (those select rmcp's per-request protocol handling).
//!
//! A list request on such a session whose `cursor` is not a string is refused here with
//! -32602 (rmcp's typed params drop such a cursor and would answer the first page).
//!
//! `notifications/cancelled` for a call in flight here cancels it (and still reaches rmcp).
//! A session used only through this path stays alive: every minute of use touches rmcp's
//! idle timer (a request-wise channel opened and closed at once).
//!
//! This file holds the endpoint and what it decides from a request's head; the rest is by
//! concern: [`sessions`] (the registry of sessions this path may answer, ids in use, the
//! session limit and `DELETE`), [`body`] (reading a body within its limit and time),
//! [`classify`] (what a body is, as far as this path is concerned), [`answer`] (answering a
//! call here) and [`forward`] (handing a request to rmcp, and what is kept of its refusals).

mod answer;
mod body;
mod classify;
mod forward;
mod origin;
mod replay;
mod resume;
mod sessions;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    response::Response,
};
use rmcp::transport::streamable_http_server::{
    StreamableHttpService,
    session::{SessionManager, local::LocalSessionManager},
};
use serde_json::Value;

pub(crate) use self::sessions::DirectSessions;
use self::{
    answer::serve_call,
    body::read_body,
    classify::{Message, classify, request_head},
    forward::{forward, forward_claimed, forward_parts, id_in_use},
    sessions::{Entry, IdHeld, end_session, second_initialize, too_many_sessions, touch},
};
pub(super) use self::{
    answer::{json_rpc_error, sse_event},
    forward::record_refused,
};
use crate::protocol::Protocol;
use crate::sync::lock;

use super::{Shared, handler::SessionHandler, scope};

/// Bodies larger than this always go to rmcp.
pub(crate) const MAX_DIRECT_BODY: u64 = 256 * 1024;

/// Whether `version` (a header's bytes) names a protocol with sessions, whose sessions this
/// path serves.
fn session_era(version: &[u8]) -> bool {
    std::str::from_utf8(version)
        .ok()
        .and_then(Protocol::parse)
        .is_some_and(Protocol::has_session)
}

const SESSION_HEADER: &str = "mcp-session-id";

const PROTOCOL_HEADER: &str = "mcp-protocol-version";

/// The most body read of a request the direct path does not take (rmcp's own limit).
const MAX_OPENING_BODY: usize = 4 * 1024 * 1024;

/// Whether a POST is a request of a later protocol (its `MCP-Protocol-Version` names none
/// of the session era): it has no session, and an `Mcp-Session-Id` it carries is ignored.
pub(super) fn sessionless_post(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::POST
        && headers
            .get(PROTOCOL_HEADER)
            .is_some_and(|v| !session_era(v.as_bytes()))
}

/// What the direct path needs besides the shared server state. Shared behind an `Arc` as
/// the router's state: axum clones the state for every request, and an `Arc` is the one
/// clone that costs nothing (rmcp's service would be cloned and dropped, configuration and
/// all, on every call).
pub(crate) struct Direct {
    pub(crate) shared: Arc<Shared>,
    pub(crate) rmcp: StreamableHttpService<SessionHandler, LocalSessionManager>,
    pub(crate) sessions: Arc<LocalSessionManager>,
    /// Accepted `Host` authorities, lowercase.
    pub(crate) hosts: Arc<[String]>,
    /// Accepted `Origin` values, lowercase.
    pub(crate) origins: Arc<[String]>,
    /// The origins refused so far, each logged once.
    pub(crate) refused_origins: origin::Refused,
    /// Answers of calls whose client left their stream before they came.
    pub(crate) replays: Arc<replay::Replays>,
}

/// The `/mcp` endpoint: the direct path when it applies, rmcp otherwise. rmcp refuses an
/// `Origin` that is not one of the server's (403); Quiver says so in its own words, and
/// logs each refused origin once.
pub(crate) async fn endpoint(direct: State<Arc<Direct>>, request: Request) -> Response {
    let origin = request.headers().get(header::ORIGIN).cloned();
    let response = Box::pin(serve(direct.clone(), request)).await;
    match origin {
        Some(origin) if response.status() == StatusCode::FORBIDDEN => {
            origin::refused(&direct.refused_origins, &origin, response).await
        }
        _ => response,
    }
}

async fn serve(State(direct): State<Arc<Direct>>, request: Request) -> Response {
    // Shutting down: rmcp answers as it does while it stops.
    if direct.shared.shutdown.is_cancelled() {
        return Box::pin(forward(&direct, request)).await;
    }
    if request.method() == Method::DELETE {
        return Box::pin(end_session(&direct, request)).await;
    }
    let mut request = request;
    if request.method() == Method::GET && resume::after_last_event(request.headers_mut()) {
        return Box::pin(resume::resume(&direct, request)).await;
    }
    // A batch, on a session that negotiated 2025-03-26 (whose clients send no
    // `MCP-Protocol-Version` header, or that version: some SDKs send the negotiated one
    // whatever it is): each message answered.
    let request = if request.method() == Method::POST
        && request
            .headers()
            .get(PROTOCOL_HEADER)
            .is_none_or(|v| v.as_bytes() == Protocol::V2025_03_26.as_str().as_bytes())
        && batch_era(&direct, request.headers())
    {
        let (parts, body) = request.into_parts();
        let bytes = match read_body(&direct, &parts, body, MAX_OPENING_BODY).await {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        if super::batch::is_array(&bytes) {
            return Box::pin(super::batch::serve(&direct, parts, &bytes)).await;
        }
        Request::from_parts(parts, Body::from(bytes))
    } else {
        request
    };
    // A request that may open a session: a POST naming none, as rmcp reads it (a header
    // that is not visible ASCII is none to it). An `initialize` is counted while it runs, so
    // that parallel ones at the limit cannot all get through, and refused when the server is
    // full; anything else (a 2026-07-28 request opens no session) goes on uncounted.
    if request.method() == Method::POST
        && request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_none()
    {
        let (parts, body) = request.into_parts();
        let bytes = match read_body(&direct, &parts, body, MAX_OPENING_BODY).await {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        let head = request_head(&bytes);
        let Some(id) = head
            .as_ref()
            .filter(|(method, _)| method == "initialize")
            .and_then(|(_, id)| serde_json::to_value(id).ok())
        else {
            // A 2026-07-28 list request (it opens no session): rmcp reads a `cursor` that
            // is not a string as none, so the handler is told what was sent; it refuses
            // the request after rmcp's own header and `_meta` checks.
            let mut parts = parts;
            if head.is_some_and(|(method, _)| super::invalid::is_list(&method))
                && let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(&bytes)
                && let Some((_, problem)) = super::invalid::cursor_problem(&message)
            {
                parts
                    .extensions
                    .insert(super::invalid::BadCursor(Arc::from(problem)));
            }
            return Box::pin(forward_parts(&direct, parts, bytes)).await;
        };
        // A request that names a later protocol in its header is rmcp's to answer (2026-07-28
        // removed `initialize`: 404, -32601).
        let later = parts
            .headers
            .get(PROTOCOL_HEADER)
            .is_some_and(|v| !session_era(v.as_bytes()));
        if !later
            && let Some(problem) = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|m| super::invalid::initialize_problem(&m))
        {
            return json_rpc_error(
                StatusCode::BAD_REQUEST,
                id,
                super::invalid::INVALID_PARAMS,
                &problem,
            );
        }
        // One `initialize` at a time is checked and handed to rmcp (its body is read by
        // then), so the count of open sessions is exact: rmcp's sessions alone are counted,
        // none twice, and a burst at the limit is admitted up to it exactly.
        let _admitting = direct.shared.opening.lock().await;
        if direct.sessions.sessions.read().await.len() >= direct.shared.options.max_sessions {
            return too_many_sessions(id, direct.shared.options.max_sessions);
        }
        return Box::pin(forward_parts(&direct, parts, bytes)).await;
    }
    let length = axum::body::HttpBody::size_hint(request.body()).upper();
    let Some(sid) = candidate(&direct, request.method(), request.headers(), length) else {
        return Box::pin(forward(&direct, request)).await;
    };
    let Some(entry) = direct.shared.direct.get(&sid) else {
        return Box::pin(forward(&direct, request)).await;
    };
    let (parts, body) = request.into_parts();
    let bytes = match read_body(&direct, &parts, body, MAX_DIRECT_BODY as usize).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    match classify(&bytes) {
        Message::Call { id, params } => {
            // A session that has ended (DELETE, idle timeout) is rmcp's to answer (404). So
            // is a call from a client that takes server-to-client traffic (it declared
            // sampling, elicitation or roots, or set a log level) to a tool that may send
            // some: only rmcp's per-call stream carries the call's relayed requests and log
            // messages.
            // And so is a session's first call, while its per-session servers are not
            // started, from a client that declared roots: those servers ask for them as they
            // start, and only rmcp's stream can carry the question.
            let takes_traffic = takes_client_traffic(&entry);
            if (takes_traffic && reaches_client(&direct.shared, &params.name))
                || (declares_roots(&entry) && !session_servers_opened(&direct.shared, &sid))
                || !direct.sessions.has_session(&sid).await.unwrap_or(false)
            {
                return Box::pin(forward_claimed(&direct, &entry, parts, bytes, Some(id))).await;
            }
            let meta = params.meta.clone().unwrap_or_default();
            // A malformed conversation key is rmcp's to answer (the same error, from the
            // handler).
            let Ok(scope) = scope::scope(&direct.shared, Some(&parts), &meta, None) else {
                return Box::pin(forward_claimed(&direct, &entry, parts, bytes, Some(id))).await;
            };
            touch(&direct, &sid, &entry);
            let Some(held) = IdHeld::claim(&entry, &id) else {
                return id_in_use(&direct, &parts, &bytes, id).await;
            };
            serve_call(
                &direct.shared,
                &entry,
                scope,
                id,
                *params,
                held,
                !takes_traffic,
            )
            .await
        }
        Message::Cancelled(id) => {
            entry.conn.note_cancelled(id.clone());
            if let Some(token) = lock(&entry.conn.in_flight).get(&id) {
                token.cancel();
            }
            Box::pin(forward_parts(&direct, parts, bytes)).await
        }
        message @ (Message::Other | Message::BadCursor { .. }) => {
            // A list whose cursor is not a string: marked for the list handler, which
            // refuses it after rmcp's own checks (an ended session's 404, an id in flight).
            let mut parts = parts;
            if let Message::BadCursor { problem, .. } = message {
                parts
                    .extensions
                    .insert(super::invalid::BadCursor(Arc::from(problem)));
            }
            let head = request_head(&bytes);
            if let Some(refused) = Box::pin(second_initialize(&direct, &sid, head.as_ref())).await {
                return refused;
            }
            let id = head.map(|(_, id)| id);
            Box::pin(forward_claimed(&direct, &entry, parts, bytes, id)).await
        }
    }
}

/// Whether a request without `MCP-Protocol-Version` is on a 2025-03-26 session, the one
/// version with batches: its session's negotiated version when the direct path knows the
/// session (from its first request on), else 2025-03-26, as the transport specification
/// says to assume for a request without the header.
fn batch_era(direct: &Direct, headers: &HeaderMap) -> bool {
    let Some(sid) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    direct.shared.direct.get(sid).is_none_or(|entry| {
        entry
            .peer
            .peer_info()
            .is_none_or(|info| info.protocol_version == rmcp::model::ProtocolVersion::V_2025_03_26)
    })
}

/// Whether a call to `name` may send its client anything (an unknown name may: rmcp answers
/// it).
fn reaches_client(shared: &Shared, name: &str) -> bool {
    shared
        .surface
        .catalog()
        .lookup(name)
        .is_none_or(|entry| entry.tool.reaches_client())
}

/// Whether the session's client declared roots (a client not yet known is taken to).
fn declares_roots(entry: &Entry) -> bool {
    entry
        .peer
        .peer_info()
        .is_none_or(|info| info.capabilities.roots.is_some())
}

/// Whether the session's per-session servers, if any are configured, have been started.
fn session_servers_opened(shared: &Shared, session: &str) -> bool {
    shared
        .session_servers
        .as_ref()
        .is_none_or(|s| !s.any() || s.opened(session))
}

/// Whether the session's client can be sent requests during a call (whose answers come
/// back through rmcp's session): such a client's calls to a tool that may reach it go to
/// rmcp. The direct path carries a call's log messages on its own response (at the level
/// the session set with `logging/setLevel`), but not relayed requests.
fn takes_client_traffic(entry: &Entry) -> bool {
    entry.peer.peer_info().is_none_or(|info| {
        let caps = &info.capabilities;
        caps.sampling.is_some() || caps.elicitation.is_some() || caps.roots.is_some()
    })
}

/// The session id of a request the direct path may take, from its head alone.
pub(super) fn candidate(
    direct: &Direct,
    method: &Method,
    headers: &HeaderMap,
    length: Option<u64>,
) -> Option<Arc<str>> {
    // A body of unknown length (chunked) is left to rmcp, which bounds it while reading.
    if method != Method::POST || length? > MAX_DIRECT_BODY {
        return None;
    }
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let content_type = text(header::CONTENT_TYPE.as_str())?;
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") || !accepts_both(headers) {
        return None;
    }
    if let Some(v) = headers.get(PROTOCOL_HEADER)
        && !session_era(v.as_bytes())
    {
        return None;
    }
    let host = text(header::HOST.as_str())?;
    if !direct.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
        return None;
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().ok()?;
        if !direct
            .origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin))
        {
            return None;
        }
    }
    let mut sids = headers.get_all(SESSION_HEADER).iter();
    let sid = sids.next()?.to_str().ok()?;
    if sids.next().is_some() || sid.is_empty() {
        return None;
    }
    Some(Arc::from(sid))
}

/// Whether `Accept` names both JSON and SSE, with no weight on any entry (a weighted entry
/// is rmcp's to judge).
fn accepts_both(headers: &HeaderMap) -> bool {
    let (mut json, mut sse) = (false, false);
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for entry in value.split(',') {
            if entry.contains(';') || entry.contains('"') {
                return false;
            }
            let essence = entry.trim();
            json |= essence.eq_ignore_ascii_case("application/json");
            sse |= essence.eq_ignore_ascii_case("text/event-stream");
        }
    }
    json && sse
}
