//! The direct path: a plain `tools/call` on an established session-era (2025) HTTP session
//! is answered here with one `application/json` response, without rmcp's session machinery
//! (a request-wise channel through the session worker, the service loop, an SSE stream and
//! a reply cache kept for resumption). Everything else, and any request this path is not
//! sure about, goes to rmcp's streamable-HTTP service unchanged, which answers it (or its
//! error) as before. A JSON response is one of the two answers the 2025 transports allow
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

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use rmcp::{
    RoleServer,
    model::{CallToolRequestParams, JsonRpcResponse, JsonRpcVersion2_0, RequestId, ServerResult},
    service::Peer,
    transport::streamable_http_server::{
        StreamableHttpService,
        session::{SessionManager, local::LocalSessionManager},
    },
};
use serde_json::Value;

use super::{
    Shared,
    channel::{self, PeerChannel, ProgressState},
    handler::{self, Connection, Handler, lock},
};

/// Bodies larger than this always go to rmcp.
pub(crate) const MAX_DIRECT_BODY: u64 = 256 * 1024;

/// How often a session used on the direct path touches rmcp's idle timer.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// The 2025-era protocol versions, whose sessions this path serves.
const SESSION_ERA: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Whether a POST is a request of a later protocol (its `MCP-Protocol-Version` names none
/// of the session era): it has no session, and an `Mcp-Session-Id` it carries is ignored.
pub(super) fn sessionless_post(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::POST
        && headers
            .get(PROTOCOL_HEADER)
            .is_some_and(|v| !SESSION_ERA.iter().any(|e| v.as_bytes() == e.as_bytes()))
}

const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";

pub(super) struct Entry {
    pub(super) conn: Arc<Connection>,
    peer: Peer<RoleServer>,
    touched: Mutex<Instant>,
}

/// The HTTP sessions whose handler registered them, by session id.
#[derive(Default)]
pub(crate) struct DirectSessions {
    map: Mutex<HashMap<Arc<str>, Arc<Entry>>>,
}

impl DirectSessions {
    pub(crate) fn insert(&self, sid: Arc<str>, conn: Arc<Connection>, peer: Peer<RoleServer>) {
        let entry = Arc::new(Entry {
            conn,
            peer,
            touched: Mutex::new(Instant::now()),
        });
        lock(&self.map).insert(sid, entry);
    }

    pub(crate) fn remove(&self, sid: &str) {
        lock(&self.map).remove(sid);
    }

    pub(super) fn get(&self, sid: &str) -> Option<Arc<Entry>> {
        lock(&self.map).get(sid).cloned()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).len()
    }
}

/// What the direct path needs besides the shared server state. Shared behind an `Arc` as
/// the router's state: axum clones the state for every request, and a clone of rmcp's
/// service (its configuration's vectors) and its drop were ~17k instructions per call.
pub(crate) struct Direct {
    pub(crate) shared: Arc<Shared>,
    pub(crate) rmcp: StreamableHttpService<Handler, LocalSessionManager>,
    pub(crate) sessions: Arc<LocalSessionManager>,
    /// Accepted `Host` authorities, lowercase.
    pub(crate) hosts: Arc<[String]>,
    /// Accepted `Origin` values, lowercase.
    pub(crate) origins: Arc<[String]>,
}

/// The `/mcp` endpoint: the direct path when it applies, rmcp otherwise.
pub(crate) async fn endpoint(State(direct): State<Arc<Direct>>, request: Request) -> Response {
    // Shutting down: rmcp answers as it does while it stops.
    if direct.shared.shutdown.is_cancelled() {
        return Box::pin(forward(&direct, request)).await;
    }
    if request.method() == Method::DELETE {
        return Box::pin(end_session(&direct, request)).await;
    }
    // A batch, on a session that negotiated 2025-03-26 (whose clients send no
    // `MCP-Protocol-Version` header, or that version: some SDKs send the negotiated one
    // whatever it is): each message answered.
    let request = if request.method() == Method::POST
        && request
            .headers()
            .get(PROTOCOL_HEADER)
            .is_none_or(|v| v.as_bytes() == b"2025-03-26")
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
            .is_some_and(|v| !SESSION_ERA.iter().any(|e| v.as_bytes() == e.as_bytes()));
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
        // then), so the count of open sessions is exact: counting the ones under way as
        // well counted each twice once rmcp had made its session, and a burst of 20 at a
        // limit of 20 got 7 refused with none open before.
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
            let takes_traffic = takes_client_traffic(&entry);
            if (takes_traffic && reaches_client(&direct.shared, &params.name))
                || !direct.sessions.has_session(&sid).await.unwrap_or(false)
            {
                return Box::pin(forward_claimed(&direct, &entry, parts, bytes, Some(id))).await;
            }
            let meta = params.meta.clone().unwrap_or_default();
            // A malformed conversation key is rmcp's to answer (the same error, from the
            // handler).
            let Ok(scope) = handler::scope(&direct.shared, Some(&parts), &meta, None) else {
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

/// The method and id of a JSON-RPC request body (a response the client sends back has no
/// method; its id is the server's).
fn request_head(bytes: &[u8]) -> Option<(String, RequestId)> {
    #[derive(serde::Deserialize)]
    struct Head {
        id: Option<RequestId>,
        method: Option<String>,
    }
    let head: Head = serde_json::from_slice(bytes).ok()?;
    Some((head.method?, head.id?))
}

/// The refusal of an `initialize` (`head`: the request's method and id) on the live session
/// `sid`: rmcp answered it with the version it asked for, while the session kept the first
/// one's.
async fn second_initialize(
    direct: &Direct,
    sid: &Arc<str>,
    head: Option<&(String, RequestId)>,
) -> Option<Response> {
    let (method, id) = head?;
    if method != "initialize" || !direct.sessions.has_session(sid).await.unwrap_or(false) {
        return None;
    }
    Some(json_rpc_error(
        StatusCode::BAD_REQUEST,
        serde_json::to_value(id).unwrap_or(Value::Null),
        super::invalid::INVALID_REQUEST,
        "Invalid Request: this session is already initialized (`initialize` comes once, as its first request); to negotiate again, open a new session: POST `initialize` without `Mcp-Session-Id`",
    ))
}

/// Forwards a session's message to rmcp; a request (`id`) holds its id for as long as its
/// answer is being sent, and one whose id is already in use is refused.
async fn forward_claimed(
    direct: &Direct,
    entry: &Arc<Entry>,
    parts: Parts,
    bytes: Bytes,
    id: Option<RequestId>,
) -> Response {
    let Some(id) = id else {
        return forward_parts(direct, parts, bytes).await;
    };
    let Some(held) = IdHeld::claim(entry, &id) else {
        return id_in_use(direct, &parts, &bytes, id).await;
    };
    // Held by the request's handler (rmcp keeps the request's parts in its context until
    // the handler is done) and by the answer's body (until the stream ends or its client
    // leaves): released when both are gone, not when a client that left stops reading
    // while the call still runs.
    let held = Arc::new(held);
    let mut parts = parts;
    parts.extensions.insert(held.clone());
    let response = forward_parts(direct, parts, bytes).await;
    response.map(|body| {
        Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
            let _held = &held;
            frame
        }))
    })
}

/// A request id held in use on its session; released when dropped.
struct IdHeld {
    conn: Arc<Connection>,
    id: RequestId,
}

impl IdHeld {
    /// Holds `id`, unless a request of the session already does.
    fn claim(entry: &Entry, id: &RequestId) -> Option<IdHeld> {
        lock(&entry.conn.ids_in_use)
            .insert(id.clone())
            .then(|| IdHeld {
                conn: entry.conn.clone(),
                id: id.clone(),
            })
    }
}

impl Drop for IdHeld {
    fn drop(&mut self) {
        lock(&self.conn.ids_in_use).remove(&self.id);
    }
}

/// 400 with a JSON-RPC error: a request reused the id of one still in flight.
/// A `tools/call` in `bytes` has its row.
async fn id_in_use(direct: &Direct, parts: &Parts, bytes: &[u8], id: RequestId) -> Response {
    let refusal = super::invalid::Refusal {
        code: super::invalid::INVALID_REQUEST,
        message: "Invalid Request: this id is already used by a request of this session that is still in flight; give each request a new id".into(),
        id: serde_json::to_value(id).unwrap_or(Value::Null),
    };
    record_refused(direct, parts, bytes, &refusal).await;
    json_rpc_error(
        StatusCode::BAD_REQUEST,
        refusal.id,
        refusal.code,
        &refusal.message,
    )
}

/// Records each `tools/call` in `bytes` (a message or a batch), refused with `refusal`
/// before any handler saw it: every call has its row.
pub(super) async fn record_refused(
    direct: &Direct,
    parts: &Parts,
    bytes: &[u8],
    refusal: &super::invalid::Refusal,
) {
    for call in super::invalid::refused_calls_in(bytes) {
        handler::record_transport_refusal(&direct.shared, Some(parts), None, call, refusal).await;
    }
}

/// The answer to a list request whose cursor no page gave out: -32602, as a JSON-RPC error
/// (the request itself was well formed, so HTTP 200).
/// An HTTP answer carrying one JSON-RPC error (the direct path's own refusals).
pub(super) fn json_rpc_error(status: StatusCode, id: Value, code: i64, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The most body read to tell an `initialize` at capacity (rmcp's own limit).
const MAX_OPENING_BODY: usize = 4 * 1024 * 1024;

/// 503 with a JSON-RPC error: the server has `max` sessions open.
fn too_many_sessions(id: Value, max: usize) -> Response {
    let mut response = json_rpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        -32000,
        &format!(
            "this server has {max} sessions open, its limit (`[limits] max_http_sessions`): end sessions you no longer use (DELETE), or try again later"
        ),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("30"),
    );
    response
}

/// `DELETE`: rmcp ends the session (after its Host, Origin and session checks); once it
/// has, the session's calls still running are cancelled (upstream too), instead of running
/// on for a client that has left.
async fn end_session(direct: &Direct, request: Request) -> Response {
    let sid = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let known = match &sid {
        Some(sid) => direct
            .sessions
            .has_session(&sid.as_str().into())
            .await
            .unwrap_or(false),
        None => false,
    };
    let response = forward(direct, request).await;
    // rmcp accepts the end of a session it does not have (never had, or ended already); a
    // session id that is gone is answered 404, as for any other request.
    if response.status().is_success() && sid.is_some() && !known {
        return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    if response.status().is_success()
        && let Some(entry) = sid.and_then(|sid| direct.shared.direct.get(&sid))
    {
        entry.conn.deleted.cancel();
    }
    // Ended: 200, as the SDKs expect (rmcp says 202, which the official Python client
    // logs as "Session termination failed: 202" at every close).
    if response.status() == StatusCode::ACCEPTED {
        return StatusCode::OK.into_response();
    }
    response
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
        && !SESSION_ERA.iter().any(|e| v.as_bytes() == e.as_bytes())
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

enum Message {
    Call {
        id: RequestId,
        params: Box<CallToolRequestParams>,
    },
    Cancelled(RequestId),
    /// A list request whose `cursor` is not a string: why.
    BadCursor {
        problem: String,
    },
    Other,
}

/// What a body is, as far as the direct path is concerned.
fn classify(bytes: &Bytes) -> Message {
    let Ok(Value::Object(mut msg)) = serde_json::from_slice::<Value>(bytes) else {
        return Message::Other;
    };
    if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Message::Other;
    }
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    match (method, msg.contains_key("id")) {
        ("tools/call", true) => {}
        ("notifications/cancelled", false) => {
            let id = msg
                .get("params")
                .and_then(|p| p.get("requestId"))
                .cloned()
                .and_then(|v| serde_json::from_value(v).ok());
            return id.map_or(Message::Other, Message::Cancelled);
        }
        _ => {
            return super::invalid::cursor_problem(&msg).map_or(Message::Other, |(_, problem)| {
                Message::BadCursor { problem }
            });
        }
    }
    if msg
        .keys()
        .any(|k| !matches!(k.as_str(), "jsonrpc" | "id" | "method" | "params"))
    {
        return Message::Other;
    }
    let Some(Value::Object(params)) = msg.remove("params") else {
        return Message::Other;
    };
    if params
        .keys()
        .any(|k| !matches!(k.as_str(), "name" | "arguments" | "_meta"))
    {
        return Message::Other;
    }
    if let Some(meta) = params.get("_meta") {
        let Value::Object(meta) = meta else {
            return Message::Other;
        };
        if meta
            .keys()
            .any(|k| k == "progressToken" || k.starts_with("io.modelcontextprotocol/"))
        {
            return Message::Other;
        }
    }
    let Some(id) = msg
        .remove("id")
        .and_then(|v| serde_json::from_value::<RequestId>(v).ok())
    else {
        return Message::Other;
    };
    match serde_json::from_value::<CallToolRequestParams>(Value::Object(params)) {
        Ok(params) => Message::Call {
            id,
            params: Box::new(params),
        },
        Err(_) => Message::Other,
    }
}

/// Answers one `tools/call` as rmcp's session would, as a JSON response.
async fn serve_call(
    shared: &Arc<Shared>,
    entry: &Entry,
    scope: handler::Scope,
    id: RequestId,
    params: CallToolRequestParams,
    held: IdHeld,
    as_declared: bool,
) -> Response {
    handler::track(shared, &entry.conn, &scope, true, &entry.peer);
    // Held by the call itself, which may outlive this request (a client that left, a call
    // whose stream goes on in a task of its own): its session is not evicted under it.
    let pin = shared.enter(&scope.key).await;
    let input = params.arguments.map(Value::Object).unwrap_or(Value::Null);
    // Cancelled by the client's notifications/cancelled, or when its session ends.
    let client = entry.conn.deleted.child_token();
    lock(&entry.conn.in_flight).insert(id.clone(), client.clone());
    // Removes the id when the call ends (in the detached task below, so that a client that
    // went away can still cancel the call with `notifications/cancelled`).
    let in_flight = InFlight {
        conn: entry.conn.clone(),
        id: id.clone(),
        _held: held,
    };
    // The same channel an rmcp-served call gets; this client declared no sampling,
    // elicitation or roots (else rmcp serves it), so those are refused in the same words. A
    // tool that sends its client nothing runs here for any client (`as_declared` false), as
    // if it had declared none of them: what it asked anyway would have no stream to go on.
    // Its log messages go on the call's own response, as on rmcp's per-call stream (the
    // transport: messages on the GET stream should be unrelated to any request): the answer
    // is one JSON body when none came, else an SSE stream from the first one on.
    let progress = Arc::new(ProgressState::default());
    let info = entry.peer.peer_info();
    let features = match as_declared {
        true => channel::features(info.as_ref().map(|i| &i.capabilities)),
        false => quiver_contract::ClientFeatures::default(),
    };
    let (outbox, mut sent) = tokio::sync::mpsc::unbounded_channel();
    let channel: Arc<dyn quiver_contract::ClientChannel> = Arc::new(PeerChannel {
        peer: entry.peer.clone(),
        request_id: id.clone(),
        progress_token: None,
        progress: progress.clone(),
        features,
        meta_level: None,
        conn: entry.conn.clone(),
        logs_allowed: true,
        missing: None,
        outbox: Some(outbox),
    });
    // A client that disconnects has not cancelled (the transport spec: only
    // `notifications/cancelled` or the session's end do): the call runs to its end, and is
    // logged, in a task of its own, as on rmcp's path.
    let mut call = Detached::new({
        let (shared, client, name) = (shared.clone(), client.clone(), params.name.to_string());
        async move {
            let _in_flight = in_flight;
            let _pin = pin;
            handler::call(
                &shared,
                &scope,
                &name,
                input,
                &client,
                None,
                Some((channel, progress)),
            )
            .await
        }
    });
    let first = tokio::select! {
        biased;
        result = &mut call => Ok(result),
        Some(message) = sent.recv() => Err(message),
    };
    let result = match first {
        Ok(result) => {
            // Log messages sent just before the answer are still waiting.
            let queued: Vec<String> = std::iter::from_fn(|| sent.try_recv().ok()).collect();
            if queued.is_empty() {
                return match client.is_cancelled() {
                    // `notifications/cancelled`: no response for the cancelled request, as
                    // rmcp's session does (its stream ends without one).
                    true => sse_response(Body::empty()),
                    false => json_response(&call_answer(id, result)),
                };
            }
            let events = queued
                .iter()
                .map(|m| sse_event(m))
                .chain((!client.is_cancelled()).then(|| sse_event(&answer_text(id, result))))
                .collect::<String>();
            return sse_response(Body::from(events));
        }
        Err(message) => message,
    };
    // The call's stream: this message, the ones after it, then the answer. The call goes
    // on in this task whether or not its client reads; messages wait for the client in a
    // queue, and past [`MAX_WAITING_LOGS`] waiting (a client that does not read) the newer
    // ones are dropped, never the call or its answer.
    let (events, stream) = tokio::sync::mpsc::channel::<String>(16);
    tokio::spawn(async move {
        let mut waiting = std::collections::VecDeque::from([sse_event(&result)]);
        let mut dropped = 0usize;
        let mut queue =
            |waiting: &mut std::collections::VecDeque<String>, message: String| match waiting.len()
                < MAX_WAITING_LOGS
            {
                true => waiting.push_back(sse_event(&message)),
                false => dropped += 1,
            };
        let result = loop {
            tokio::select! {
                biased;
                result = &mut call => break result,
                Some(message) = sent.recv() => queue(&mut waiting, message),
                Ok(permit) = events.reserve(), if !waiting.is_empty() => {
                    permit.send(waiting.pop_front().expect("not empty"));
                }
            }
        };
        while let Ok(message) = sent.try_recv() {
            queue(&mut waiting, message);
        }
        if dropped > 0 {
            // The operator is told: the client lost part of the call's log.
            tracing::warn!(
                dropped,
                "{dropped} log message(s) of a call were dropped: its client did not read its response stream while more than {MAX_WAITING_LOGS} waited"
            );
        }
        for event in waiting {
            if events.send(event).await.is_err() {
                return;
            }
        }
        if !client.is_cancelled() {
            let _ = events.send(sse_event(&answer_text(id, result))).await;
        }
    });
    let stream = futures::stream::unfold(stream, |mut stream| async move {
        let event = stream.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(event), stream))
    });
    sse_response(Body::from_stream(stream))
}

/// The most log messages of one call kept waiting for a client that does not read them.
const MAX_WAITING_LOGS: usize = 1024;

/// The answer to the `tools/call` request `id`, in the session era's form.
fn call_answer(
    id: RequestId,
    result: rmcp::model::CallToolResult,
) -> JsonRpcResponse<ServerResult> {
    let mut result = ServerResult::CallToolResult(result);
    // The session era predates `resultType` and non-object structured output.
    result.strip_result_type_for_legacy_peer();
    result.strip_non_object_output_for_legacy_peer();
    JsonRpcResponse {
        jsonrpc: JsonRpcVersion2_0,
        id,
        result,
    }
}

/// [`call_answer`] as JSON text (an internal error for `id` if it cannot be encoded).
fn answer_text(id: RequestId, result: rmcp::model::CallToolResult) -> String {
    let answer = call_answer(id.clone(), result);
    serde_json::to_string(&answer).unwrap_or_else(|e| {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32603, "message": format!("Internal error: the response could not be encoded: {e}")},
        })
        .to_string()
    })
}

/// One SSE event carrying `data`, a line of its own per line of it (a JSON text has none,
/// but a field may not hold a line break).
pub(super) fn sse_event(data: &str) -> String {
    let mut event = String::with_capacity(data.len() + 8);
    for line in data.split('\n') {
        event.push_str("data: ");
        event.push_str(line);
        event.push('\n');
    }
    event.push('\n');
    event
}

fn sse_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

struct InFlight {
    conn: Arc<Connection>,
    id: RequestId,
    /// The id stays in use until the call ends, even when its client left before.
    _held: IdHeld,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.conn.in_flight).remove(&self.id);
    }
}

/// A future that, dropped before it finished, goes on in a task of its own.
struct Detached<F: std::future::Future + Send + 'static>(Option<std::pin::Pin<Box<F>>>)
where
    F::Output: Send;

impl<F: std::future::Future + Send + 'static> Detached<F>
where
    F::Output: Send,
{
    fn new(fut: F) -> Self {
        Detached(Some(Box::pin(fut)))
    }
}

impl<F: std::future::Future + Send + 'static> std::future::Future for Detached<F>
where
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let fut = self.0.as_mut().expect("polled after it finished");
        let out = fut.as_mut().poll(cx);
        if out.is_ready() {
            self.0 = None;
        }
        out
    }
}

impl<F: std::future::Future + Send + 'static> Drop for Detached<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        if let (Some(fut), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(fut);
        }
    }
}

fn json_response(message: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Server Error: the response could not be encoded: {e}"),
        )
            .into_response(),
    }
}

/// Keeps rmcp's idle timer of a session used only here from closing it.
fn touch(direct: &Direct, sid: &Arc<str>, entry: &Entry) {
    {
        let mut touched = lock(&entry.touched);
        if touched.elapsed() < TOUCH_EVERY {
            return;
        }
        *touched = Instant::now();
    }
    let sessions = direct.sessions.clone();
    let sid = sid.clone();
    tokio::spawn(async move {
        let handle = sessions.sessions.read().await.get(&*sid).cloned();
        if let Some(handle) = handle
            && let Ok(channel) = handle.establish_request_wise_channel().await
            && let Some(id) = channel.http_request_id
        {
            let _ = handle.close_request_wise_channel(id).await;
        }
    });
}

async fn forward(direct: &Direct, request: Request) -> Response {
    // A POST's body is kept (bytes are shared, not copied) so that a message rmcp refuses
    // can be told what is wrong with it.
    if request.method() == Method::POST {
        let (parts, body) = request.into_parts();
        let bytes = match read_body(direct, &parts, body, MAX_OPENING_BODY).await {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        // A session's request the direct path did not take (a chunked or large body, an
        // `Accept` with parameters) holds its id like any other.
        let sid = parts
            .headers
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(Arc::<str>::from);
        let entry = sid.as_deref().and_then(|sid| direct.shared.direct.get(sid));
        if let (Some(entry), Some(sid)) = (entry, sid) {
            let head = request_head(&bytes);
            if let Some(refused) = second_initialize(direct, &sid, head.as_ref()).await {
                return refused;
            }
            let id = head.map(|(_, id)| id);
            return forward_claimed(direct, &entry, parts, bytes, id).await;
        }
        return forward_parts(direct, parts, bytes).await;
    }
    let response = direct.rmcp.handle(request).await.map(Body::new);
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return unparsable(response, None).await.0;
    }
    response
}

/// A request's whole body, at most `limit` bytes, within the server's body timeout (a
/// client that stops sending holds nothing for long). The timer starts only if the body is
/// not already in (`tokio::time::timeout` polls the read first): a small request costs none.
async fn read_body(
    direct: &Direct,
    parts: &Parts,
    body: Body,
    limit: usize,
) -> Result<Bytes, Response> {
    let wait = direct.shared.options.body_timeout;
    match tokio::time::timeout(wait, collect_body(body, limit)).await {
        Ok(Ok(Ok(bytes))) => Ok(bytes),
        // Over the limit: a `tools/call` in the head read has its row, as an oversized
        // stdio line's does (QA-14 #2: no row).
        Ok(Ok(Err(head))) => {
            let refusal = super::invalid::Refusal {
                code: super::invalid::INVALID_REQUEST,
                message: format!(
                    "Invalid Request: the body is over {limit} bytes, the most this server reads as one request; send less (a large input belongs in a file the tool reads)"
                ),
                id: crate::lines::find_id(&head, &[]).unwrap_or(Value::Null),
            };
            record_refused(direct, parts, &head, &refusal).await;
            Err(json_rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                refusal.id,
                refusal.code,
                &refusal.message,
            ))
        }
        Ok(Err(e)) => Err((StatusCode::BAD_REQUEST, format!("Bad Request: {e}")).into_response()),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            [(header::CONNECTION, "close")],
            format!(
                "Request Timeout: the body did not arrive within {}",
                quiver_contract::duration_text(wait)
            ),
        )
            .into_response()),
    }
}

/// A body of at most `limit` bytes (one chunk as it came, several joined); past the limit,
/// its first `limit` bytes (`Err`), and the rest is not read. A body of one chunk (nearly
/// every request) is neither copied nor put in a list.
async fn collect_body(mut body: Body, limit: usize) -> Result<Result<Bytes, Bytes>, axum::Error> {
    use http_body_util::BodyExt;
    let mut first: Option<Bytes> = None;
    let mut rest: Vec<u8> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let take = data.len().min(limit - len);
        match &first {
            None if take == data.len() => first = Some(data.clone()),
            None => first = Some(data.slice(..take)),
            Some(head) => {
                if rest.is_empty() {
                    rest.extend_from_slice(head);
                }
                rest.extend_from_slice(&data[..take]);
            }
        }
        len += take;
        if take < data.len() {
            let head = match rest.is_empty() {
                true => first.unwrap_or_default(),
                false => Bytes::from(rest),
            };
            return Ok(Err(head));
        }
    }
    Ok(Ok(match rest.is_empty() {
        true => first.unwrap_or_default(),
        false => Bytes::from(rest),
    }))
}

/// What rmcp's 415 says when the body itself did not parse (its other 415, a wrong
/// `Content-Type`, is passed on as it is).
const UNPARSED_BODY: &str = "fail to deserialize request body ";

/// rmcp answers a body that is not one JSON-RPC message with `415` and a line of text; a
/// JSON-RPC client expects a JSON-RPC error: `-32700` for text that is not JSON, `-32600`
/// for JSON that is not one message (a batch, a stray object), with status 400; and the
/// refusal (none when the answer was another).
async fn unparsable(
    response: Response,
    sent: Option<&Bytes>,
) -> (Response, Option<super::invalid::Refusal>) {
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let Some(detail) = text.strip_prefix(UNPARSED_BODY) else {
        return (Response::from_parts(parts, Body::from(text)), None);
    };
    let refusal = if detail.contains("unrecognized JSON-RPC message") {
        match sent.map(|b| serde_json::from_slice::<Value>(b)) {
            Some(Ok(value)) => super::invalid::diagnose(&value, "the body"),
            _ => super::invalid::Refusal {
                code: super::invalid::INVALID_REQUEST,
                message: "Invalid Request: the body must be one JSON-RPC 2.0 request, \
                          notification or response object"
                    .into(),
                id: Value::Null,
            },
        }
    } else if sent.is_some_and(|b| b.starts_with(b"\xef\xbb\xbf")) {
        super::invalid::Refusal {
            code: super::invalid::PARSE_ERROR,
            message: "Parse error: the body starts with a UTF-8 byte-order mark (EF BB BF), which JSON over HTTP does not take; send the JSON without it".to_owned(),
            id: Value::Null,
        }
    } else {
        super::invalid::unreadable(sent.map_or(&[][..], |b| &b[..]), detail, "the body")
    };
    let response = json_rpc_error(
        StatusCode::BAD_REQUEST,
        refusal.id.clone(),
        refusal.code,
        &refusal.message,
    );
    (response, Some(refusal))
}

async fn forward_parts(direct: &Direct, parts: Parts, bytes: Bytes) -> Response {
    let caller = parts
        .extensions
        .get::<super::auth::Principal>()
        .map(|p| p.capabilities.clone());
    // A 2026-07-28 call that rmcp refuses for its headers or its version never reaches
    // the handler: the parts are kept to give it its row (also when its `Mcp-Method` names
    // another method or is missing: the body says which it is).
    let call_parts = match parts.headers.get("mcp-method") {
        Some(v) if v.as_bytes() == b"tools/call" => true,
        _ => bytes.windows(10).any(|w| w == b"tools/call"),
    }
    .then(|| parts.clone());
    let request = Request::from_parts(parts, Body::from(bytes.clone()));
    // rmcp checks a 2026-07-28 call's `Mcp-Param-*` headers against the tool's definition
    // before the handler runs, asking `get_tool` with the name alone: the caller goes with
    // the request, so that a tool its token may not use has no definition to check against.
    let handled = direct.rmcp.handle(request);
    let response = match caller {
        Some(caller) => super::handler::CALLER.scope(caller, handled).await,
        None => handled.await,
    }
    .map(Body::new);
    let response = match &call_parts {
        Some(parts) if response.status() == StatusCode::BAD_REQUEST => {
            record_header_refusal(direct, parts, &bytes, response).await
        }
        _ => response,
    };
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        let (response, refusal) = unparsable(response, Some(&bytes)).await;
        // Not JSON, nested too deeply, not JSON-RPC: a `tools/call` so refused has its row.
        if let (Some(parts), Some(refusal)) = (&call_parts, refusal) {
            record_refused(direct, parts, &bytes, &refusal).await;
        }
        return response;
    }
    response
}

/// Records a 2026-07-28 `tools/call` that rmcp refused for its headers (-32020: an
/// `Mcp-Method`, `Mcp-Name` or `Mcp-Param-*` header that is missing or does not match the
/// body), its protocol version (-32022) or its `_meta` (-32602) before
/// any handler saw it: a call all the same, which has its row (kind `invalid_params`). Any
/// other answer goes back as it is (the handler's own refusals have their rows already).
async fn record_header_refusal(
    direct: &Direct,
    parts: &Parts,
    sent: &Bytes,
    response: Response,
) -> Response {
    let (head, body) = response.into_parts();
    let Ok(answer) = axum::body::to_bytes(body, MAX_OPENING_BODY).await else {
        return Response::from_parts(head, Body::empty());
    };
    let refused = serde_json::from_slice::<Value>(&answer).ok().filter(|v| {
        // -32602: a 2026-07-28 request whose `_meta` misses the protocol's fields (QA-14 #3:
        // no row), refused by rmcp's transport before any handler.
        [
            rmcp::model::ErrorCode::HEADER_MISMATCH,
            rmcp::model::ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
            rmcp::model::ErrorCode::INVALID_PARAMS,
        ]
        .iter()
        .any(|code| v["error"]["code"] == i64::from(code.0))
    });
    if let (Some(refused), Ok(Value::Object(mut call))) =
        (refused, serde_json::from_slice::<Value>(sent))
        && call.get("method").and_then(Value::as_str) == Some("tools/call")
    {
        let mut params = match call.remove("params") {
            Some(Value::Object(p)) => p,
            _ => serde_json::Map::new(),
        };
        let name = handler::sent_name(params.remove("name"));
        let meta = params
            .get("_meta")
            .cloned()
            .and_then(|m| serde_json::from_value(m).ok())
            .unwrap_or_default();
        let message = refused["error"]["message"]
            .as_str()
            .unwrap_or("the request's headers do not match its body");
        let input = params.remove("arguments").unwrap_or(Value::Null);
        handler::record_invalid_params(
            &direct.shared,
            Some(parts),
            &meta,
            None,
            (&name, input),
            message,
        )
        .await;
    }
    Response::from_parts(head, Body::from(answer))
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use axum::Router;
    use quiver_contract::{CallContext, Envelope, ErrKind, Mode, Tool, ToolResult, ToolSpec};
    use quiver_registry::{Catalog, Dispatcher};
    use quiver_surface::Surface;
    use serde_json::json;
    use tower::ServiceExt;

    use super::*;
    use crate::server::{McpServer, ServerOptions};

    struct Echo(ToolSpec);

    #[async_trait]
    impl Tool for Echo {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
            if input.get("tick").is_some() {
                ctx.progress(0.5, Some(1.0), Some("halfway".into())).await;
            }
            // `say`: a log message per string, `pause` ms before each and after the last;
            // `gap`: ms before the first and after the last only (a burst in between).
            let pause = Duration::from_millis(input["pause"].as_u64().unwrap_or(0));
            let gap = Duration::from_millis(input["gap"].as_u64().unwrap_or(0));
            tokio::time::sleep(gap).await;
            for said in input["say"].as_array().into_iter().flatten() {
                tokio::time::sleep(pause).await;
                ctx.log(quiver_contract::LogLevel::Info, Some("echo"), said.clone())
                    .await;
            }
            tokio::time::sleep(pause.max(gap)).await;
            Ok(Envelope::ok(input))
        }
    }

    /// Holds until cancelled: says when it started, and whether its call was dropped.
    struct Hold {
        spec: ToolSpec,
        started: Arc<tokio::sync::Notify>,
        dropped: Arc<std::sync::atomic::AtomicBool>,
        /// Calls that saw their cancellation.
        cancelled: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Hold {
        /// `hold`, read-only, telling `started`; its drop and cancellation not watched.
        fn new(started: &Arc<tokio::sync::Notify>) -> Hold {
            Hold {
                spec: ToolSpec::new("hold", "Holds until cancelled.")
                    .read_only()
                    .with_schema(json!({"type": "object"})),
                started: started.clone(),
                dropped: Arc::default(),
                cancelled: Arc::default(),
            }
        }
    }

    struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[async_trait]
    impl Tool for Hold {
        fn spec(&self) -> &ToolSpec {
            &self.spec
        }
        async fn call(&self, _input: Value, ctx: &CallContext) -> ToolResult {
            let _guard = SetOnDrop(self.dropped.clone());
            self.started.notify_one();
            ctx.cancel.cancelled().await;
            self.cancelled
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // As a proxied upstream call answers its cancellation.
            Ok(Envelope::err(ErrKind::Cancelled, "cancelled"))
        }
    }

    fn server() -> McpServer {
        server_with(None)
    }

    fn server_with(hold: Option<Hold>) -> McpServer {
        let catalog = Arc::new(Catalog::new());
        if let Some(hold) = hold {
            catalog.register(Arc::new(hold)).unwrap();
        }
        catalog
            .register(Arc::new(Echo(
                ToolSpec::new("echo", "Echoes its arguments.")
                    .read_only()
                    .with_schema(json!({"type": "object"})),
            )))
            .unwrap();
        crate::server::test_server(catalog, ServerOptions::default())
    }

    struct Reply {
        status: StatusCode,
        content_type: String,
        session: Option<String>,
        body: String,
    }

    async fn send(router: &Router, method: Method, session: Option<&str>, body: Value) -> Reply {
        send_text(router, method, session, body.to_string()).await
    }

    async fn send_text(
        router: &Router,
        method: Method,
        session: Option<&str>,
        body: String,
    ) -> Reply {
        send_with(router, method, session, body, &[]).await
    }

    /// [`send_text`] with extra headers (raw bytes: a header need not be ASCII).
    async fn send_with(
        router: &Router,
        method: Method,
        session: Option<&str>,
        body: String,
        extra: &[(&str, &[u8])],
    ) -> Reply {
        let req = request(method, session, body, extra);
        reply(router, req).await
    }

    /// The request [`send_with`] sends.
    fn request(
        method: Method,
        session: Option<&str>,
        body: String,
        extra: &[(&str, &[u8])],
    ) -> Request {
        let mut req = Request::builder()
            .method(method)
            .uri("/mcp")
            .header("host", "127.0.0.1:7345")
            .header("content-type", "application/json")
            .header(
                "accept",
                extra
                    .iter()
                    .find(|(n, _)| *n == "accept")
                    .map_or(&b"application/json, text/event-stream"[..], |(_, v)| *v),
            );
        // An empty `mcp-protocol-version` in `extra` sends none (a 2025-03-26 client).
        if !extra.iter().any(|(n, _)| *n == "mcp-protocol-version") {
            req = req.header("mcp-protocol-version", "2025-11-25");
        }
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        for (name, value) in extra
            .iter()
            .filter(|(n, v)| *n != "accept" && !(*n == "mcp-protocol-version" && v.is_empty()))
        {
            req = req.header(*name, axum::http::HeaderValue::from_bytes(value).unwrap());
        }
        req.body(Body::from(body)).unwrap()
    }

    async fn reply(router: &Router, req: Request) -> Reply {
        let resp = router.clone().oneshot(req).await.unwrap();
        let (content_type, session) = {
            let text = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            (
                text("content-type").unwrap_or_default(),
                text("mcp-session-id"),
            )
        };
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        Reply {
            status,
            content_type,
            session,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// The JSON-RPC messages of an SSE body, in order.
    fn sse_messages(body: &str) -> Vec<Value> {
        body.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    fn call(id: u64, meta: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"x": id}, "_meta": meta}})
    }

    /// Opens a session that negotiated 2025-03-26 (its client sends no
    /// `MCP-Protocol-Version`), initialized; returns its id.
    async fn open_2025_03_26(router: &Router) -> String {
        let old: &[(&str, &[u8])] = &[("mcp-protocol-version", b"")];
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let opened = send_with(router, Method::POST, None, init.to_string(), old).await;
        assert!(opened.body.contains("\"2025-03-26\""), "{}", opened.body);
        let sid = opened.session.expect("a session id");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        send_with(
            router,
            Method::POST,
            Some(&sid),
            initialized.to_string(),
            old,
        )
        .await;
        sid
    }

    /// Opens a session whose client declares `capabilities`; returns its id once the direct
    /// path knows it.
    async fn open(server: &McpServer, router: &Router, capabilities: Value) -> String {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": capabilities,
            "clientInfo": {"name": "t", "version": "1"}}});
        let sid = send(router, Method::POST, None, init)
            .await
            .session
            .expect("a session id");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        send(router, Method::POST, Some(&sid), initialized).await;
        let list = json!({"jsonrpc": "2.0", "id": 1000, "method": "tools/list"});
        send(router, Method::POST, Some(&sid), list).await;
        assert!(server.shared.direct.get(&sid).is_some(), "registered");
        sid
    }

    /// A call's log messages go on its own response, before its answer, as on rmcp's
    /// per-call stream (they went to the session's GET stream, which the transport keeps for
    /// messages unrelated to a request): an SSE stream from the first message on, whether
    /// they come just before the answer or while the call runs. A call that logs nothing
    /// is still one JSON body.
    #[tokio::test]
    async fn a_direct_calls_log_messages_come_on_its_own_stream() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        let plain = send(&router, Method::POST, Some(&sid), call(1, json!({}))).await;
        assert_eq!(plain.content_type, "application/json", "{}", plain.body);
        // Two messages at once, two while the call runs, and a burst of 200 (more than the
        // response's channel holds: none is lost for a client that reads).
        for (n, pause, gap) in [(2, 0, 0), (2, 20, 0), (200, 0, 20)] {
            let said: Vec<Value> = (0..n).map(|i| json!(format!("line {i}"))).collect();
            let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"say": said, "pause": pause, "gap": gap}}});
            let reply = send(&router, Method::POST, Some(&sid), body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            assert_eq!(reply.content_type, "text/event-stream", "{}", reply.body);
            let messages = sse_messages(&reply.body);
            let logs: Vec<&Value> = messages
                .iter()
                .filter(|m| m["method"] == "notifications/message")
                .map(|m| &m["params"]["data"])
                .collect();
            assert_eq!(
                logs,
                said.iter().collect::<Vec<_>>(),
                "{pause}: {}",
                reply.body
            );
            assert_eq!(messages.len(), n + 1, "{pause}: {}", reply.body);
            assert_eq!(messages[n]["id"], json!(2), "{pause}: {}", reply.body);
            assert_eq!(
                messages[n]["result"]["isError"],
                json!(false),
                "{pause}: {}",
                reply.body
            );
        }
        // A client that starts reading only after the call has sent 300 messages gets them
        // all (they wait for it; past a bound they would be dropped, never the answer).
        let said: Vec<Value> = (0..300).map(|i| json!(i)).collect();
        let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"say": said, "gap": 20}}});
        let req = request(Method::POST, Some(&sid), body.to_string(), &[]);
        let resp = router.clone().oneshot(req).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let messages = sse_messages(&String::from_utf8_lossy(&bytes));
        assert_eq!(messages.len(), 301, "{messages:?}");
        assert_eq!(messages[299]["params"]["data"], json!(299));
        assert_eq!(messages[300]["id"], json!(3));
    }

    /// A 2025-03-26 session may send a batch (that version's transport says a server must
    /// accept one): every request in it is answered, on one SSE stream that also carries
    /// what the calls send on their own streams (progress); a batch without
    /// requests is accepted with 202; an empty batch is one -32600. A later session's batch
    /// is still refused (2025-06-18 removed batching).
    #[tokio::test]
    async fn a_batch_on_a_2025_03_26_session_is_answered_on_one_stream() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let old: &[(&str, &[u8])] = &[("mcp-protocol-version", b"")];
        let sid = open_2025_03_26(&router).await;
        let batch = json!([
            call(1, json!({})),
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 3, "method": "no/such/method"},
            call(4, json!({})),
        ]);
        // The answers come on one stream, with what the calls send on their own streams:
        // here a call's progress.
        let mut batch = batch;
        batch
            .as_array_mut()
            .unwrap()
            .push(json!({"jsonrpc": "2.0", "id": 5,
            "method": "tools/call", "params": {"name": "echo",
            "arguments": {"x": 5, "tick": true}, "_meta": {"progressToken": "p5"}}}));
        let reply = send_with(&router, Method::POST, Some(&sid), batch.to_string(), old).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert!(
            reply.content_type.starts_with("text/event-stream"),
            "{}",
            reply.content_type
        );
        let messages = sse_messages(&reply.body);
        let progress: Vec<&Value> = messages
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .collect();
        assert_eq!(progress.len(), 1, "{}", reply.body);
        assert_eq!(
            progress[0]["params"]["progressToken"], "p5",
            "{}",
            reply.body
        );
        assert_eq!(
            progress[0]["params"]["message"], "halfway",
            "{}",
            reply.body
        );
        let answers: Vec<Value> = messages
            .into_iter()
            .filter(|m| m.get("id").is_some())
            .collect();
        assert_eq!(answers.len(), 5, "{}", reply.body);
        let by_id = |id: u64| {
            answers
                .iter()
                .find(|a| a["id"] == json!(id))
                .unwrap_or_else(|| panic!("no answer to {id}: {}", reply.body))
        };
        assert_eq!(by_id(5)["result"]["structuredContent"]["x"], json!(5));
        assert_eq!(by_id(1)["result"]["structuredContent"], json!({"x": 1}));
        assert_eq!(by_id(4)["result"]["structuredContent"], json!({"x": 4}));
        assert!(by_id(2)["result"]["tools"].is_array(), "{}", reply.body);
        assert_eq!(by_id(3)["error"]["code"], json!(-32601), "{}", reply.body);
        // A head the direct path does not take (here a weighted `Accept`, which rmcp
        // judges) gets the answers to the batch's requests in one JSON array.
        let weighted: &[(&str, &[u8])] = &[
            ("mcp-protocol-version", b""),
            ("accept", b"application/json, text/event-stream;q=0.9"),
        ];
        let pings = json!([
            {"jsonrpc": "2.0", "id": 21, "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 97}},
            {"jsonrpc": "2.0", "id": 22, "method": "ping"},
        ]);
        let reply = send_with(
            &router,
            Method::POST,
            Some(&sid),
            pings.to_string(),
            weighted,
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert!(
            reply.content_type.starts_with("application/json"),
            "{}",
            reply.content_type
        );
        let mut ids: Vec<Value> = serde_json::from_str::<Vec<Value>>(&reply.body)
            .unwrap()
            .into_iter()
            .map(|a| a["id"].clone())
            .collect();
        ids.sort_by_key(Value::to_string);
        assert_eq!(ids, [json!(21), json!(22)], "{}", reply.body);
        // An element that is itself a batch is refused, not run (a batch of batches would
        // get past the 100-message limit); a client that sends the negotiated version's
        // header is answered the same way.
        let nested = json!([[call(6, json!({})), call(7, json!({}))], call(8, json!({}))]);
        let with_header: &[(&str, &[u8])] = &[("mcp-protocol-version", b"2025-03-26")];
        let reply = send_with(
            &router,
            Method::POST,
            Some(&sid),
            nested.to_string(),
            with_header,
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let messages = sse_messages(&reply.body);
        assert_eq!(messages.len(), 2, "{}", reply.body);
        assert!(
            messages.iter().any(|m| m["id"] == json!(8)
                && m["result"]["structuredContent"] == json!({"x": 8})),
            "{}",
            reply.body
        );
        assert!(
            messages.iter().any(|m| m["id"].is_null()
                && m["error"]["code"] == json!(-32600)
                && m["error"]["message"].as_str().unwrap().contains(
                    "the batch element must be one JSON-RPC 2.0 message object, and it is a batch"
                )),
            "{}",
            reply.body
        );
        // Refused before they run, inside the batch's answer as on stdio: the requests that
        // share an id (as rmcp reads it: 30.0 is 30; two quick pings both ran), an
        // `initialize` (which must not be part of a batch), an element that is no object
        // (it was told "the body"). The request with an id of its own runs.
        let mixed = json!([
            {"jsonrpc": "2.0", "id": 33, "method": "ping"},
            {"jsonrpc": "2.0", "id": 30, "method": "ping"},
            {"jsonrpc": "2.0", "id": 30.0, "method": "ping"},
            {"jsonrpc": "2.0", "id": 31, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}},
            1,
            {"jsonrpc": "2.0", "id": 32, "method": 123},
            {"jsonrpc": "2.0", "id": 32, "method": "ping"},
        ]);
        let reply = send_with(
            &router,
            Method::POST,
            Some(&sid),
            mixed.to_string(),
            weighted,
        )
        .await;
        // A malformed request still holds its id: the ping sharing it is refused, not run.
        let thirty_two: Vec<Value> = serde_json::from_str::<Vec<Value>>(&reply.body)
            .unwrap_or_else(|_| panic!("{}", reply.body))
            .into_iter()
            .filter(|a| a["id"] == 32)
            .collect();
        assert_eq!(thirty_two.len(), 2, "{}", reply.body);
        assert!(
            thirty_two.iter().all(|a| a["error"]["message"]
                == "Invalid Request: 2 requests of this batch carry the id 32, and none of them was run; give each request its own id"),
            "{}",
            reply.body
        );
        let mut answers: Vec<(String, Value)> = serde_json::from_str::<Vec<Value>>(&reply.body)
            .unwrap_or_else(|_| panic!("{}", reply.body))
            .into_iter()
            .filter(|a| a["id"] != 32)
            .map(|a| {
                let what = a["error"]["message"]
                    .as_str()
                    .map_or_else(|| a["result"].to_string(), str::to_owned);
                (a["id"].to_string(), json!(what))
            })
            .collect();
        answers.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            answers,
            [
                // Neither of the two requests with the id 30 runs: an answer to one could not
                // be told from the other's (QA-13 C-9: the first ran, and the batch's answer
                // held a result and an error under its id).
                (
                    "30".to_owned(),
                    json!(
                        "Invalid Request: 2 requests of this batch carry the id 30, and none of them was run; give each request its own id"
                    )
                ),
                (
                    "30.0".to_owned(),
                    json!(
                        "Invalid Request: 2 requests of this batch carry the id 30, and none of them was run; give each request its own id"
                    )
                ),
                (
                    "31".to_owned(),
                    json!(
                        "Invalid Request: an `initialize` must not be part of a batch; send it alone, as the session's first message"
                    )
                ),
                ("33".to_owned(), json!("{}")),
                (
                    "null".to_owned(),
                    json!(
                        "Invalid Request: the batch element must be one JSON-RPC 2.0 message object, and it is not a JSON object"
                    )
                ),
            ],
            "{}",
            reply.body
        );
        // Notifications only: accepted, nothing to answer.
        let quiet = json!([{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 98}}]);
        let reply = send_with(&router, Method::POST, Some(&sid), quiet.to_string(), old).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        // An array that is not JSON is a parse error (it was "a batch inside a batch").
        for text in ["[", r#"[{"jsonrpc": "2.0", "id": 2, "method": "ping"},]"#] {
            let reply = send_with(&router, Method::POST, Some(&sid), text.into(), old).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{text}");
            let v: Value = serde_json::from_str(&reply.body).unwrap();
            assert_eq!(v["error"]["code"], json!(-32700), "{text}: {v}");
            assert!(
                reply
                    .body
                    .contains("Parse error: the body is not valid JSON ("),
                "{text}: {}",
                reply.body
            );
        }
        let reply = send_with(&router, Method::POST, Some(&sid), "[]".into(), old).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        let v: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(v["error"]["code"], json!(-32600), "{v}");
        assert!(reply.body.contains("an empty batch"), "{}", reply.body);
        let long = Value::Array((0..101).map(|i| call(i, json!({}))).collect());
        let reply = send_with(&router, Method::POST, Some(&sid), long.to_string(), old).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        assert!(
            reply
                .body
                .contains("a batch of 101 messages; this server takes at most 100"),
            "{}",
            reply.body
        );
        // Once the session has ended, a batch gets its 404, also one whose every element is
        // refused before it runs (it was answered 200 with the refusals).
        let ended = send_with(&router, Method::DELETE, Some(&sid), String::new(), old).await;
        assert_eq!(ended.status, StatusCode::OK, "{}", ended.body);
        for batch in [
            json!([5, "x"]),
            json!([{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}]),
            json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]),
        ] {
            let reply = send_with(&router, Method::POST, Some(&sid), batch.to_string(), old).await;
            assert_eq!(
                reply.status,
                StatusCode::NOT_FOUND,
                "{batch}: {}",
                reply.body
            );
        }
        // A 2025-11-25 session's batch is refused, as before.
        let sid = open(&server, &router, json!({})).await;
        let reply = send(
            &router,
            Method::POST,
            Some(&sid),
            json!([call(5, json!({}))]),
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        assert!(reply.body.contains("a batch"), "{}", reply.body);
    }

    /// A second `initialize` on a session is refused: rmcp answered it with the version it
    /// asked for, while the session kept the first one's. The session goes on.
    #[tokio::test]
    async fn a_second_initialize_on_a_session_is_refused() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        let again = json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let reply = send(&router, Method::POST, Some(&sid), again).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        let v: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(
            (v["id"].clone(), v["error"]["code"].clone()),
            (json!(7), json!(-32600)),
            "{v}"
        );
        assert!(
            reply.body.contains("this session is already initialized"),
            "{}",
            reply.body
        );
        // A POST the direct path does not take (here a weighted `Accept`, which rmcp
        // judges) is refused the same way (rmcp answered it).
        let weighted: &[(&str, &[u8])] =
            &[("accept", b"application/json, text/event-stream;q=0.9")];
        let again = json!({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let reply = send_with(
            &router,
            Method::POST,
            Some(&sid),
            again.to_string(),
            weighted,
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        assert!(
            reply.body.contains("this session is already initialized"),
            "{}",
            reply.body
        );
        let ping = json!({"jsonrpc": "2.0", "id": 8, "method": "ping"});
        let reply = send(&router, Method::POST, Some(&sid), ping).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    }

    /// A malformed `initialize` is told what an `initialize` needs (rmcp read it as another
    /// request and answered that a session id is required).
    #[tokio::test]
    async fn a_malformed_initialize_is_told_what_it_needs() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let bad = json!({"jsonrpc": "2.0", "id": 9, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
        let reply = send(&router, Method::POST, None, bad).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        let v: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(v["id"], json!(9), "{v}");
        assert_eq!(v["error"]["code"], json!(-32602), "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("clientInfo"),
            "{v}"
        );
        // A 2026-07-28 request is not a malformed initialize: that version removed the
        // method, and rmcp answers it (the conformance suite's 2026 scenarios check the 404).
        let later = json!({"jsonrpc": "2.0", "id": 10, "method": "initialize",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        let reply = send_with(
            &router,
            Method::POST,
            None,
            later.to_string(),
            &[
                ("mcp-protocol-version", b"2026-07-28"),
                ("mcp-method", b"initialize"),
            ],
        )
        .await;
        assert!(
            !reply.body.contains("an `initialize` needs"),
            "{}",
            reply.body
        );
    }

    /// A body over the limit is answered 413 with a JSON-RPC error that says what to do
    /// (it was a bare "Payload Too Large").
    #[tokio::test]
    async fn a_body_over_the_limit_is_told_what_to_do() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"x":"{}"}}}}"#,
            "a".repeat(5 << 20)
        );
        let reply = send_text(&router, Method::POST, None, body).await;
        assert_eq!(
            reply.status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{}",
            reply.body
        );
        let v: Value = serde_json::from_str(&reply.body).expect("a JSON-RPC error");
        assert_eq!(v["error"]["code"], json!(-32600), "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("the body is over 4194304 bytes"),
            "{v}"
        );
    }

    /// A call the session's mode does not allow (plan mode, a mutating tool) is refused,
    /// and recorded like every call.
    #[tokio::test]
    async fn a_call_refused_by_the_mode_is_recorded() {
        let catalog = Arc::new(Catalog::new());
        catalog
            .register(Arc::new(Echo(
                ToolSpec::new("write_note", "Writes a note.")
                    .with_schema(json!({"type": "object"})),
            )))
            .unwrap();
        catalog
            .register(Arc::new(Echo(
                ToolSpec::new("read_note", "Reads a note.")
                    .with_schema(json!({"type": "object"}))
                    .with_annotations(quiver_contract::Annotations::read_only()),
            )))
            .unwrap();
        // Outside plan mode a mode's list (agentic_only here) keeps it off: said so.
        let chat = McpServer::new(
            Surface::new(
                catalog.clone(),
                quiver_surface::SurfaceConfig::default().with_agentic_only(&["write_note"]),
                Arc::new(quiver_surface::MemoryUsage::new([])),
            )
            .unwrap(),
            Dispatcher::builder(catalog.clone()).build(),
            ServerOptions::default(),
        );
        let chat_router = chat.router("127.0.0.1:7345".parse().unwrap());
        let chat_sid = open(&chat, &chat_router, json!({})).await;
        let call = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
            "params": {"name": "write_note", "arguments": {}}});
        let reply = send(&chat_router, Method::POST, Some(&chat_sid), call).await;
        assert!(
            reply.body.contains(
                "is not available in chat mode. This mode's lists leave it out; use another tool of your tool list, or tell the user it needs another mode."
            ),
            "{}",
            reply.body
        );
        let (server, recorder) = crate::server::test_server_recorded(
            catalog,
            ServerOptions::default().with_default_mode(Mode::Plan),
        );
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "write_note", "arguments": {"text": "hi"}}});
        let reply = send(&router, Method::POST, Some(&sid), call).await;
        assert!(
            reply
                .body
                .contains("is not available in plan mode. Plan mode offers read-only tools only")
                && !reply.body.contains("Call tool_search"),
            "{}",
            reply.body
        );
        // A misspelt name is not steered to the tool the mode refuses, but to one it lists.
        let typo = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"name": "write_notes", "arguments": {}}});
        let reply = send(&router, Method::POST, Some(&sid), typo).await;
        assert!(
            reply.body.contains("there is no tool named `write_notes`")
                && !reply.body.contains("`write_note`"),
            "{}",
            reply.body
        );
        let typo = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "read_notes", "arguments": {}}});
        let reply = send(&router, Method::POST, Some(&sid), typo).await;
        assert!(
            reply.body.contains("Did you mean `read_note`?"),
            "{}",
            reply.body
        );
        server.shared.dispatcher.drain_records().await;
        let rows = recorder.records();
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert_eq!(rows[0].tool_name, "write_note");
        assert_eq!(rows[0].envelope.err_kind(), Some(&ErrKind::Forbidden));
        assert_eq!(rows[0].input, json!({"text": "hi"}));
        // (a mode's refusal: the tool exists, the session's mode does not list it)
        assert_eq!(rows[1].tool_name, "write_notes");
        assert_eq!(rows[1].envelope.err_kind(), Some(&ErrKind::UndefinedTool));
    }

    /// At `max_sessions` open sessions an `initialize` is refused with 503 and a JSON-RPC
    /// error naming the limit (a flood of them held ~76 KB each without bound); ending one
    /// makes room again.
    #[tokio::test]
    async fn initialize_beyond_the_session_limit_is_refused_until_one_ends() {
        let catalog = Arc::new(Catalog::new());
        let server =
            crate::server::test_server(catalog, ServerOptions::default().with_max_sessions(2));
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let first = open(&server, &router, json!({})).await;
        open(&server, &router, json!({})).await;
        let init = json!({"jsonrpc": "2.0", "id": 41, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let full = send(&router, Method::POST, None, init.clone()).await;
        assert_eq!(
            full.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            full.body
        );
        // A session header rmcp cannot read is none to it: refused the same.
        let unreadable = send_with(
            &router,
            Method::POST,
            None,
            init.to_string(),
            &[("mcp-session-id", b"\xff")],
        )
        .await;
        assert_eq!(
            unreadable.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            unreadable.body
        );
        let v: Value = serde_json::from_str(&full.body).unwrap();
        assert_eq!(v["id"], json!(41));
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("max_http_sessions"),
            "{v}"
        );
        assert!(full.session.is_none());
        let ended = send_text(&router, Method::DELETE, Some(&first), String::new()).await;
        assert!(ended.status.is_success(), "{}", ended.status);
        let again = send(&router, Method::POST, None, init).await;
        assert_eq!(again.status, StatusCode::OK, "{}", again.body);
        assert!(again.session.is_some());
    }

    /// A burst of parallel `initialize`s is admitted up to the limit exactly: 25 at a limit
    /// of 20, none open before, are 20 sessions and 5 refusals (20 at once got 7 refused).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_initializes_is_admitted_up_to_the_limit_exactly() {
        let catalog = Arc::new(Catalog::new());
        let server =
            crate::server::test_server(catalog, ServerOptions::default().with_max_sessions(20));
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let calls: Vec<_> = (0..25)
            .map(|_| {
                let (router, init) = (router.clone(), init.clone());
                tokio::spawn(async move { send(&router, Method::POST, None, init).await.status })
            })
            .collect();
        let mut statuses = Vec::new();
        for c in calls {
            statuses.push(c.await.unwrap());
        }
        let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        let full = statuses
            .iter()
            .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
            .count();
        assert_eq!((ok, full), (20, 5), "{statuses:?}");
    }

    /// Only an `initialize` counts toward the session limit while it runs: a stateless
    /// 2026-07-28 call in flight (which opens no session) does not keep one from starting.
    #[tokio::test]
    async fn a_stateless_call_in_flight_does_not_count_toward_the_session_limit() {
        let started = Arc::new(tokio::sync::Notify::new());
        let catalog = Arc::new(Catalog::new());
        catalog.register(Arc::new(Hold::new(&started))).unwrap();
        let server =
            crate::server::test_server(catalog, ServerOptions::default().with_max_sessions(1));
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let stateless = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "hold", "arguments": {},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}
        }}});
        let call = tokio::spawn({
            let router = router.clone();
            async move {
                let req = Request::builder()
                    .method(Method::POST)
                    .uri("/mcp")
                    .header("host", "127.0.0.1:7345")
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", "hold")
                    .body(Body::from(stateless.to_string()))
                    .unwrap();
                router.oneshot(req).await.unwrap().status()
            }
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
            .await
            .expect("the stateless call runs");
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let r = send(&router, Method::POST, None, init).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert!(r.session.is_some());
        server.shutdown_token().cancel();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), call).await;
    }

    /// A body in several chunks is joined; past the limit, exactly its first `limit` bytes
    /// come back, whichever chunk the limit falls in; one chunk is returned as it came.
    #[tokio::test]
    async fn a_body_is_read_whole_or_to_its_limit() {
        let chunks = || {
            Body::from_stream(futures::stream::iter(
                ["ab", "", "cde", "f"].map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
            ))
        };
        assert_eq!(
            collect_body(chunks(), 6).await.unwrap(),
            Ok(Bytes::from("abcdef"))
        );
        for (limit, head) in [(0, ""), (1, "a"), (2, "ab"), (4, "abcd"), (5, "abcde")] {
            assert_eq!(
                collect_body(chunks(), limit).await.unwrap(),
                Err(Bytes::from(head)),
                "{limit}"
            );
        }
        let one = Bytes::from_static(b"{}");
        let got = collect_body(Body::from(one.clone()), 2)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.as_ptr(), one.as_ptr(), "not copied");
    }

    /// A 2026-07-28 retry whose requestState names no held call (forged) runs nothing and
    /// has its row, as has a call rmcp refuses for a `_meta` missing the protocol's fields
    /// (QA-14 #3: neither had one); a plain stateless call has one row, as before.
    #[tokio::test]
    async fn a_forged_request_state_and_a_short_meta_have_their_rows() {
        let catalog = Arc::new(Catalog::new());
        catalog
            .register(Arc::new(Echo(
                ToolSpec::new("echo", "Echoes its arguments.")
                    .read_only()
                    .with_schema(json!({"type": "object"})),
            )))
            .unwrap();
        let (server, recorder) =
            crate::server::test_server_recorded(catalog, ServerOptions::default());
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}});
        let headers: &[(&str, &[u8])] = &[
            ("mcp-protocol-version", b"2026-07-28"),
            ("mcp-method", b"tools/call"),
            ("mcp-name", b"echo"),
        ];
        let forged = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "echo", "arguments": {"x": 1}, "requestState": "forged",
            "inputResponses": {}, "_meta": meta}});
        let r = send_with(&router, Method::POST, None, forged.to_string(), headers).await;
        assert!(
            r.body.contains("requestState does not name a call waiting"),
            "{}",
            r.body
        );
        let plain = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "echo", "arguments": {"x": 2}, "_meta": meta}});
        let r = send_with(&router, Method::POST, None, plain.to_string(), headers).await;
        assert!(r.body.contains("result"), "{}", r.body);
        // rmcp refuses a `_meta` without the protocol's fields before any handler.
        let no_caps = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "echo", "arguments": {"x": 3},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}}});
        let r = send_with(&router, Method::POST, None, no_caps.to_string(), headers).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(r.body.contains("clientCapabilities"), "{}", r.body);
        server.shared.dispatcher.drain_records().await;
        let rows: Vec<_> = recorder
            .records()
            .into_iter()
            .map(|r| {
                (
                    r.tool_name,
                    r.envelope.err_kind().map(|k| k.as_str().to_owned()),
                    r.input,
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (
                    "echo".to_owned(),
                    Some("invalid_params".to_owned()),
                    json!({"x": 1})
                ),
                ("echo".to_owned(), None, json!({"x": 2})),
                (
                    "echo".to_owned(),
                    Some("invalid_params".to_owned()),
                    json!({"x": 3})
                ),
            ]
        );
    }

    /// A session is its token's: another valid token naming it is answered as for an
    /// unknown session (404), for calls, lists and DELETE alike, so it can neither use nor
    /// end it (the MCP security guidance binds session ids to the user). The owner still
    /// can, and ends it.
    #[tokio::test]
    async fn a_session_answers_only_the_token_that_opened_it() {
        use crate::server::{InboundAuth, InboundToken};
        let catalog = Arc::new(Catalog::new());
        catalog
            .register(Arc::new(Echo(
                ToolSpec::new("echo", "Echoes its arguments.")
                    .read_only()
                    .with_schema(json!({"type": "object"})),
            )))
            .unwrap();
        let server = crate::server::test_server(
            catalog,
            ServerOptions::default().with_auth(InboundAuth::new(vec![
                InboundToken::new("ci", "secret-ci"),
                InboundToken::new("ops", "secret-ops"),
            ])),
        );
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let ci: &[(&str, &[u8])] = &[("authorization", b"Bearer secret-ci")];
        let ops: &[(&str, &[u8])] = &[("authorization", b"Bearer secret-ops")];
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let sid = send_with(&router, Method::POST, None, init.to_string(), ci)
            .await
            .session
            .expect("a session id");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        send_with(
            &router,
            Method::POST,
            Some(&sid),
            initialized.to_string(),
            ci,
        )
        .await;
        for body in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            call(2, json!({})),
        ] {
            let theirs = send_with(&router, Method::POST, Some(&sid), body.to_string(), ops).await;
            assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{}", theirs.body);
            let own = send_with(&router, Method::POST, Some(&sid), body.to_string(), ci).await;
            assert_eq!(own.status, StatusCode::OK, "{}", own.body);
            assert!(!own.body.contains("error"), "{}", own.body);
        }
        let theirs = send_with(&router, Method::DELETE, Some(&sid), String::new(), ops).await;
        assert_eq!(theirs.status, StatusCode::NOT_FOUND);
        let own = send_with(&router, Method::DELETE, Some(&sid), String::new(), ci).await;
        assert!(own.status.is_success(), "{}", own.status);
    }

    /// A 2026-07-28 call of a tool the token may not use is answered as a call of a tool
    /// that does not exist, whatever its `Mcp-Param-*` headers: rmcp's header check (against
    /// the definition, before the handler) answered -32020 naming the missing header, which
    /// told the token the tool exists and what its parameters are. For a token that may use
    /// it, the check still holds.
    #[tokio::test]
    async fn a_hidden_tools_headers_are_not_checked_for_a_token_that_cannot_use_it() {
        use crate::server::{InboundAuth, InboundToken};
        let catalog = Arc::new(Catalog::new());
        catalog
            .register(Arc::new(Echo(
                ToolSpec::new("geo_secret", "Looks a region up.")
                    .read_only()
                    .with_schema(json!({"type": "object", "properties": {"region": {
                        "type": "string", "x-mcp-header": "Region"}}})),
            )))
            .unwrap();
        let (server, recorder) = crate::server::test_server_recorded(
            catalog,
            ServerOptions::default().with_auth(InboundAuth::new(vec![
                InboundToken::new("narrow", "secret-narrow")
                    .with_allowed_tools(vec!["tool_search".into(), "describe_tool".into()]),
                InboundToken::new("wide", "secret-wide"),
            ])),
        );
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let ask = |token: &'static str, name: &'static str| {
            let router = router.clone();
            async move {
                let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                    "name": name, "arguments": {"region": "eu"},
                    "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                        "io.modelcontextprotocol/clientCapabilities": {}}}});
                let auth = format!("Bearer {token}");
                let headers: &[(&str, &[u8])] = &[
                    ("authorization", auth.as_bytes()),
                    ("mcp-protocol-version", b"2026-07-28"),
                    ("mcp-method", b"tools/call"),
                    ("mcp-name", name.as_bytes()),
                ];
                let r = send_with(&router, Method::POST, None, body.to_string(), headers).await;
                (r.status, r.body.replace(name, "NAME"))
            }
        };
        let hidden = ask("secret-narrow", "geo_secret").await;
        let absent = ask("secret-narrow", "geo_secrex").await;
        assert_eq!(hidden, absent);
        assert_eq!(hidden.0, StatusCode::OK, "{}", hidden.1);
        assert!(hidden.1.contains("there is no tool named"), "{}", hidden.1);
        // The token that may use it must send the header.
        let (status, body) = ask("secret-wide", "geo_secret").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains("Mcp-Param-Region"), "{body}");
        // Every call has its row: the two unknown-tool answers, and the header refusal
        // rmcp gave before any handler ran.
        server.shared.dispatcher.drain_records().await;
        let rows = recorder.records();
        assert_eq!(rows.len(), 3, "{rows:?}");
        let refused = rows
            .iter()
            .find(|r| r.principal.as_deref() == Some("wide"))
            .expect("the wide token's call");
        assert_eq!(refused.tool_name, "geo_secret");
        assert_eq!(
            refused.envelope.err_kind(),
            Some(&ErrKind::Other("invalid_params".into()))
        );
        assert_eq!(refused.input, json!({"region": "eu"}));
        // So do a call whose `Mcp-Method` names another method or is missing, and one on a
        // protocol version the server does not speak (none had a row).
        for (method, version, code) in [
            (&b"tools/list"[..], &b"2026-07-28"[..], -32020),
            (b"", b"2026-07-28", -32020),
            (b"tools/call", b"2099-01-01", -32022),
        ] {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "geo_secret", "arguments": {"region": "eu"},
                "_meta": {"io.modelcontextprotocol/protocolVersion": String::from_utf8_lossy(version),
                    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {}}}});
            let mut headers: Vec<(&str, &[u8])> = vec![
                ("authorization", b"Bearer secret-wide"),
                ("mcp-protocol-version", version),
                ("mcp-name", b"geo_secret"),
                ("mcp-param-region", b"eu"),
            ];
            if !method.is_empty() {
                headers.push(("mcp-method", method));
            }
            let r = send_with(&router, Method::POST, None, body.to_string(), &headers).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
            let answer: Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(answer["error"]["code"], json!(code), "{}", r.body);
        }
        server.shared.dispatcher.drain_records().await;
        let rows = recorder.records();
        assert_eq!(rows.len(), 6, "{rows:?}");
        for row in &rows[3..] {
            assert_eq!(row.tool_name, "geo_secret");
            assert_eq!(
                row.envelope.err_kind(),
                Some(&ErrKind::Other("invalid_params".into()))
            );
        }
    }

    /// A `tools/call` the HTTP transport refuses before any handler sees it has its row in
    /// the execution log, as one the handler refuses (none had one): a body nested too
    /// deeply (its deep part cut), text that is not JSON, a message that is not JSON-RPC, a
    /// body over 4 MiB, an id in flight, and a batch's requests that share an id or are
    /// nested too deeply.
    #[tokio::test]
    async fn a_tools_call_the_transport_refuses_has_its_row() {
        let started = Arc::new(tokio::sync::Notify::new());
        let catalog = Arc::new(Catalog::new());
        catalog.register(Arc::new(Hold::new(&started))).unwrap();
        catalog
            .register(Arc::new(Echo(
                ToolSpec::new("echo", "Echoes its arguments.")
                    .read_only()
                    .with_schema(json!({"type": "object"})),
            )))
            .unwrap();
        let (server, recorder) =
            crate::server::test_server_recorded(catalog, ServerOptions::default());
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let cases = [
            (
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"x":{deep}}}}}}}"#),
                -32600,
            ),
            (
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{}}"#.to_owned(),
                -32700,
            ),
            (
                r#"{"jsonrpc":"1.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"y":3}}}"#.to_owned(),
                -32600,
            ),
        ];
        for (body, code) in &cases {
            let reply = send_text(&router, Method::POST, Some(&sid), body.clone()).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
            let answer: Value = serde_json::from_str(&reply.body).unwrap();
            assert_eq!(answer["error"]["code"], json!(code), "{}", reply.body);
        }
        // A body past what the server reads (4 MiB): 413, and still a row (QA-14 #2).
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"echo","arguments":{{"x":"{}"}}}}}}"#,
            "a".repeat(5 << 20)
        );
        let reply = send_text(&router, Method::POST, Some(&sid), big).await;
        assert_eq!(
            reply.status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{}",
            reply.body
        );
        assert!(reply.body.contains(r#""id":5"#), "{}", reply.body);
        // An id in flight: a held call under id 4, then another call with that id.
        let held = tokio::spawn({
            let (router, sid) = (router.clone(), sid.clone());
            async move {
                let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                    "params": {"name": "hold", "arguments": {}}});
                send(&router, Method::POST, Some(&sid), call).await
            }
        });
        started.notified().await;
        let again = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"z": 4}}});
        let reply = send(&router, Method::POST, Some(&sid), again).await;
        assert!(reply.body.contains("already used"), "{}", reply.body);
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 4}});
        send(&router, Method::POST, Some(&sid), cancel).await;
        held.await.unwrap();
        server.shared.dispatcher.drain_records().await;
        let rows = recorder.records();
        // The arguments as logged; those kept to 100 levels and cut below as "cut".
        let logged = |input: &Value| match crate::lines::holds_cut(input) {
            true => json!("cut"),
            false => input.clone(),
        };
        let refused: Vec<_> = rows
            .iter()
            .filter(|r| r.tool_name != "hold")
            .map(|r| {
                (
                    r.tool_name.as_str(),
                    r.envelope.err_kind().map(|k| k.as_str().to_owned()),
                    logged(&r.input),
                    r.session.as_deref().map(str::to_owned),
                )
            })
            .collect();
        let kind = |k: &str| Some(k.to_owned());
        let session = Some(format!("mcp:{sid}"));
        assert_eq!(
            refused,
            vec![
                ("echo", kind("too_deep"), json!("cut"), session.clone()),
                (
                    "(unreadable)",
                    kind("parse_error"),
                    Value::Null,
                    session.clone()
                ),
                (
                    "echo",
                    kind("invalid_request"),
                    json!({"y": 3}),
                    session.clone()
                ),
                (
                    "(unreadable)",
                    kind("input_too_large"),
                    Value::Null,
                    session.clone()
                ),
                (
                    "echo",
                    kind("invalid_request"),
                    json!({"z": 4}),
                    session.clone()
                ),
            ],
            "{rows:?}"
        );
        // A 2025-03-26 session's batch: two calls that share an id, and one nested too
        // deeply in a batch of its own.
        let old: &[(&str, &[u8])] = &[("mcp-protocol-version", b"")];
        let old_sid = open_2025_03_26(&router).await;
        let shared = json!([
            {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"a": 1}}},
            {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"b": 2}}},
        ]);
        let reply = send_with(
            &router,
            Method::POST,
            Some(&old_sid),
            shared.to_string(),
            old,
        )
        .await;
        assert!(reply.body.contains("carry the id 9"), "{}", reply.body);
        let deep_batch = format!(
            r#"[{{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{{"name":"echo","arguments":{{"c":{deep}}}}}}}]"#
        );
        let reply = send_with(&router, Method::POST, Some(&old_sid), deep_batch, old).await;
        assert!(reply.body.contains("levels deep"), "{}", reply.body);
        server.shared.dispatcher.drain_records().await;
        let rows = recorder.records();
        let mut batch: Vec<_> = rows
            .iter()
            .filter(|r| r.session.as_deref() == Some(&format!("mcp:{old_sid}")))
            .map(|r| {
                (
                    r.envelope.err_kind().map(|k| k.as_str().to_owned()),
                    logged(&r.input),
                )
            })
            .collect();
        batch.sort_by_key(|(_, input)| input.to_string());
        assert_eq!(
            batch,
            vec![
                (kind("too_deep"), json!("cut")),
                (kind("invalid_request"), json!({"a": 1})),
                (kind("invalid_request"), json!({"b": 2})),
            ],
            "{rows:?}"
        );
    }

    /// A JSON body that is not one JSON-RPC message is told what is wrong with it, with its
    /// id when that can be read (every such body was "batches are not supported").
    #[tokio::test]
    async fn an_invalid_message_is_told_what_is_wrong() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        for (body, says, id) in [
            (
                r#"{"id":3,"method":"ping"}"#,
                "`jsonrpc` must be \"2.0\"",
                json!(3),
            ),
            (
                r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#,
                "`jsonrpc` must be",
                json!("a"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                "`id` must be a string or an integer",
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"2.0","id":4,"method":5}"#,
                "`method` must be a string",
                json!(4),
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":"x"}"#,
                "`params` must be an object",
                json!(5),
            ),
            (
                r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
                "a batch",
                Value::Null,
            ),
            ("42", "not a JSON object", Value::Null),
        ] {
            let r = send_text(&router, Method::POST, Some(&sid), body.into()).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
            let v: Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(v["error"]["code"], json!(-32600), "{body}: {v}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains(says),
                "{body}: {v}"
            );
            assert_eq!(v["id"], id, "{body}: {v}");
        }
        // Positional params: valid JSON-RPC, invalid params for MCP.
        let body = r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":["echo",{}]}"#;
        let r = send_text(&router, Method::POST, Some(&sid), body.into()).await;
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"]["code"], json!(-32602), "{v}");
        assert_eq!(v["id"], json!(6), "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("an object of named parameters"),
            "{v}"
        );
    }

    /// A `Quiver-Conversation` header that is not UTF-8 is invalid params (it was taken for
    /// no header, and the request ran in the shared anonymous working set); a UTF-8 one that
    /// is not ASCII is a key like any other. A `tools/list` cursor this server never gave
    /// (it gives none: the list is one page) is invalid params too.
    #[tokio::test]
    async fn a_non_utf8_conversation_key_and_a_foreign_cursor_are_invalid_params() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        let list = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}).to_string();
        let r = send_with(
            &router,
            Method::POST,
            Some(&sid),
            list.clone(),
            &[("quiver-conversation", b"caf\xe9-private")],
        )
        .await;
        assert!(r.body.contains(r#""code":-32602"#), "{}", r.body);
        assert!(r.body.contains("is not UTF-8 text"), "{}", r.body);
        let r = send_with(
            &router,
            Method::POST,
            Some(&sid),
            list,
            &[("quiver-conversation", "café-private".as_bytes())],
        )
        .await;
        assert!(r.body.contains(r#""tools""#), "{}", r.body);
        for cursor in ["zzz", "1"] {
            let body = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list",
                "params": {"cursor": cursor}});
            let r = send(&router, Method::POST, Some(&sid), body).await;
            assert!(r.body.contains(r#""code":-32602"#), "{}", r.body);
            assert!(r.body.contains("invalid cursor"), "{}", r.body);
        }
    }

    /// A body that is not one JSON-RPC message gets a JSON-RPC error with status 400 (rmcp
    /// answered 415 and a line of text); ending a session that is gone is a 404.
    #[tokio::test]
    async fn malformed_bodies_get_json_rpc_errors_and_a_gone_session_404() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        // A known method whose params do not fit is -32602 naming the problem.
        for params in [
            json!({"name": "echo", "arguments": "{\"x\": 1}"}),
            json!({"name": 5}),
            json!({}),
        ] {
            let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params});
            let r = send(&router, Method::POST, Some(&sid), body).await;
            assert!(r.body.contains(r#""code":-32602"#), "{params}: {}", r.body);
            assert!(
                r.body.contains("invalid params for `tools/call`: "),
                "{}",
                r.body
            );
        }
        let level = json!({"jsonrpc": "2.0", "id": 8, "method": "logging/setLevel",
            "params": {"level": "bogus"}});
        let r = send(&router, Method::POST, Some(&sid), level).await;
        assert!(r.body.contains(r#""code":-32602"#), "{}", r.body);
        let unknown = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/frobnicate"});
        let r = send(&router, Method::POST, Some(&sid), unknown).await;
        assert!(r.body.contains(r#""code":-32601"#), "{}", r.body);
        assert!(
            r.body.contains("method not found: `tools/frobnicate`"),
            "{}",
            r.body
        );
        for (session, body, code) in [
            (None, "{not json", -32700),
            (Some(sid.as_str()), "{not json", -32700),
            (
                None,
                r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
                -32600,
            ),
            (Some(sid.as_str()), r#"{"hello":1}"#, -32600),
        ] {
            let r = send_text(&router, Method::POST, session, body.into()).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
            assert_eq!(r.content_type, "application/json", "{body}");
            let v: Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(v["error"]["code"], json!(code), "{body}: {v}");
            assert_eq!(v["id"], Value::Null, "{v}");
        }
        // Valid JSON nested past the parser's limit is said to be so, with its id, as on
        // stdio (QA-13 C-4: "not valid JSON", id null); in a batch too.
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{{"name":"echo","arguments":{{"a":{}1{}}}}}}}"#,
            "[".repeat(150),
            "]".repeat(150)
        );
        for (session, body, id) in [
            (Some(sid.as_str()), deep.clone(), json!(11)),
            (None, deep.clone(), json!(11)),
            // A batch has no one id.
            (Some(sid.as_str()), format!("[{deep}]"), Value::Null),
        ] {
            let r = send_text(&router, Method::POST, session, body).await;
            let v: Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(v["error"]["code"], json!(-32600), "{v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("the body nests arrays and objects more than 128 levels deep"),
                "{v}"
            );
            assert_eq!(v["id"], id, "{v}");
        }
        // A byte-order mark before the JSON is named (it read as "expected value at line 1
        // column 1").
        for session in [None, Some(sid.as_str())] {
            let r = send_text(
                &router,
                Method::POST,
                session,
                "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}".into(),
            )
            .await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
            assert!(
                r.body.contains(r#""code":-32700"#)
                    && r.body
                        .contains("the body starts with a UTF-8 byte-order mark"),
                "{}",
                r.body
            );
        }
        // A wrong Content-Type is rmcp's 415, as it was.
        let req = Request::builder()
            .method(Method::POST)
            .uri("/mcp")
            .header("host", "127.0.0.1:7345")
            .header("content-type", "text/plain")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &sid)
            .body(Body::from(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#))
            .unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let r = send(&router, Method::DELETE, Some(&sid), json!({})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let again = send(&router, Method::DELETE, Some(&sid), json!({})).await;
        assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.body);
        let never = send(&router, Method::DELETE, Some("nope"), json!({})).await;
        assert_eq!(never.status, StatusCode::NOT_FOUND, "{}", never.body);
    }

    /// Says it sends its client nothing, and asks it for its roots all the same.
    struct Quiet(ToolSpec);

    #[async_trait]
    impl Tool for Quiet {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn reaches_client(&self) -> bool {
            false
        }
        async fn call(&self, _input: Value, ctx: &CallContext) -> ToolResult {
            let asked = ctx.list_roots().await;
            Ok(Envelope::ok(json!({"refused": asked.is_err()})))
        }
    }

    /// A client that declared sampling and roots, and set a log level, gets one JSON answer
    /// from a tool that sends its client nothing (what the tool asks anyway is refused, as
    /// undeclared: it has no stream to go on), and rmcp's stream from any other tool.
    #[tokio::test]
    async fn a_tool_that_sends_its_client_nothing_is_answered_directly_for_any_client() {
        let server = server();
        server
            .shared
            .surface
            .catalog()
            .register(Arc::new(Quiet(
                ToolSpec::new("quiet", "Asks for roots.")
                    .read_only()
                    .with_schema(json!({"type": "object"})),
            )))
            .unwrap();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({"sampling": {}, "roots": {}})).await;
        let quiet = |id: u64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "quiet", "arguments": {}}})
        };
        let r = send(&router, Method::POST, Some(&sid), quiet(1)).await;
        assert_eq!(r.content_type, "application/json", "{}", r.body);
        assert!(r.body.contains(r#""refused":true"#), "{}", r.body);
        let r = send(&router, Method::POST, Some(&sid), call(2, json!({}))).await;
        assert_eq!(r.content_type, "text/event-stream", "{}", r.body);
        let level = json!({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel",
            "params": {"level": "info"}});
        send(&router, Method::POST, Some(&sid), level).await;
        let r = send(&router, Method::POST, Some(&sid), quiet(4)).await;
        assert_eq!(r.content_type, "application/json", "{}", r.body);
        assert!(r.body.contains(r#""id":4"#), "{}", r.body);
    }

    #[tokio::test]
    async fn a_client_that_takes_server_to_client_traffic_stays_on_rmcp() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        // Declared sampling: its calls may carry relayed requests on their own stream.
        let sid = open(&server, &router, json!({"sampling": {}})).await;
        let r = send(&router, Method::POST, Some(&sid), call(1, json!({}))).await;
        assert_eq!(r.content_type, "text/event-stream", "{}", r.body);
        assert!(
            r.body.contains(r#""structuredContent":{"x":1}"#),
            "{}",
            r.body
        );
        // Declared nothing: direct, also once it sets a log level, which the direct path
        // applies to the call's log messages on its own response (rmcp's path sent them
        // to the GET stream, QA-12 B-1): a message under the level is not sent.
        let sid = open(&server, &router, json!({})).await;
        let r = send(&router, Method::POST, Some(&sid), call(2, json!({}))).await;
        assert_eq!(r.content_type, "application/json", "{}", r.body);
        let say = |id: u64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"say": ["told"]}}})
        };
        for (level, told) in [("warning", false), ("debug", true)] {
            let set = json!({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel",
                "params": {"level": level}});
            send(&router, Method::POST, Some(&sid), set).await;
            let r = send(&router, Method::POST, Some(&sid), say(4)).await;
            let messages = match r.content_type.as_str() {
                "application/json" => vec![serde_json::from_str::<Value>(&r.body).unwrap()],
                _ => sse_messages(&r.body),
            };
            // No priming event (rmcp's path sends one): the direct path answered.
            assert!(!r.body.contains("data: \n"), "{level}: {}", r.body);
            let logs = messages
                .iter()
                .filter(|m| m["method"] == "notifications/message")
                .count();
            assert_eq!(logs, usize::from(told), "{level}: {}", r.body);
            assert_eq!(
                messages.last().unwrap()["id"],
                json!(4),
                "{level}: {}",
                r.body
            );
        }
    }

    #[tokio::test]
    async fn a_plain_session_call_is_answered_directly_and_the_rest_by_rmcp() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let r = send(&router, Method::POST, None, init).await;
        let sid = r.session.expect("a session id");
        assert_eq!(
            server.shared.direct.len(),
            0,
            "not registered before initialized"
        );
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let r = send(&router, Method::POST, Some(&sid), initialized).await;
        assert_eq!(r.status, StatusCode::ACCEPTED);
        // The notification is handled after its 202; a request's answer comes after its
        // handler ran, so after tools/list (rmcp's SSE stream) the session is registered.
        let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
        let r = send(&router, Method::POST, Some(&sid), list.clone()).await;
        assert_eq!(r.content_type, "text/event-stream", "{}", r.body);
        assert_eq!(server.shared.direct.len(), 1, "registered");

        // A plain call: one JSON response carrying the result.
        let r = send(&router, Method::POST, Some(&sid), call(1, json!({}))).await;
        assert_eq!(
            (r.status, r.content_type.as_str()),
            (StatusCode::OK, "application/json")
        );
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["id"], json!(1), "{v}");
        assert_eq!(v["result"]["structuredContent"], json!({"x": 1}), "{v}");
        assert_ne!(v["result"]["isError"], json!(true), "{v}");
        assert!(
            v["result"].get("resultType").is_none(),
            "pre-2026 shape: {v}"
        );

        // A call asking for progress, and tools/list: rmcp's SSE streams.
        let r = send(
            &router,
            Method::POST,
            Some(&sid),
            call(2, json!({"progressToken": "p"})),
        )
        .await;
        assert_eq!(r.content_type, "text/event-stream", "{}", r.body);
        assert!(
            r.body.contains(r#""structuredContent":{"x":2}"#),
            "{}",
            r.body
        );
        let r = send(&router, Method::POST, Some(&sid), list).await;
        assert_eq!(r.content_type, "text/event-stream", "{}", r.body);

        // An unknown session, and the session once deleted: rmcp's 404.
        let r = send(
            &router,
            Method::POST,
            Some("no-such-session"),
            call(4, json!({})),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
        let r = send(&router, Method::DELETE, Some(&sid), Value::Null).await;
        assert_eq!(r.status, StatusCode::OK);
        let r = send(&router, Method::POST, Some(&sid), call(5, json!({}))).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    }

    /// A 2026-07-28 request is stateless: an `Mcp-Session-Id` it carries (another client's)
    /// neither takes over that session's direct-path entry nor ends its working set when
    /// the request's handler goes away.
    #[tokio::test]
    async fn a_stateless_request_naming_a_session_does_not_touch_it() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        let before = server.shared.direct.get(&sid).expect("registered");
        let key: Arc<str> = Arc::from(format!("mcp:{sid}"));
        let stateless = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "tool_search", "arguments": {"query": "echo"},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}
        }}});
        let req = Request::builder()
            .method(Method::POST)
            .uri("/mcp")
            .header("host", "127.0.0.1:7345")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "tool_search")
            .header("mcp-session-id", &sid)
            .body(Body::from(stateless.to_string()))
            .unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains(r#""id":9"#), "answered: {body}");
        // The stateless request's handler is gone by now (its response was read).
        tokio::task::yield_now().await;
        let after = server.shared.direct.get(&sid).expect("still registered");
        assert!(
            Arc::ptr_eq(&before, &after),
            "the session's entry is its own"
        );
        assert!(
            server.shared.surface.working_set(&key).is_empty(),
            "the stateless search did not page tools into the session's working set"
        );
        let r = send(&router, Method::POST, Some(&sid), call(10, json!({}))).await;
        assert_eq!(r.content_type, "application/json", "{}", r.body);
    }

    /// `logging/setLevel` is gone in 2026-07-28: a valid one is method-not-found like an
    /// invalid one (it succeeded and did nothing).
    #[tokio::test]
    async fn set_level_is_not_part_of_2026_07_28() {
        let server = server();
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        for level in ["debug", "verbose"] {
            let body = json!({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel",
            "params": {"level": level, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}
            }}});
            let req = Request::builder()
                .method(Method::POST)
                .uri("/mcp")
                .header("host", "127.0.0.1:7345")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "logging/setLevel")
                .body(Body::from(body.to_string()))
                .unwrap();
            let resp = router.clone().oneshot(req).await.unwrap();
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(text.contains("-32601"), "{level}: {text}");
            assert!(
                text.contains("is not part of protocol 2026-07-28"),
                "{level}: {text}"
            );
        }
    }

    fn call_body(extra_params: &str) -> Bytes {
        Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"t","arguments":{{"a":1}}{extra_params}}}}}"#
        ))
    }

    #[test]
    fn a_plain_call_is_taken_and_anything_else_is_left_to_rmcp() {
        assert!(matches!(classify(&call_body("")), Message::Call { .. }));
        assert!(matches!(
            classify(&call_body(r#","_meta":{"quiver/conversation":"c"}"#)),
            Message::Call { .. }
        ));
        for other in [
            r#","_meta":{"progressToken":1}"#,
            r#","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#,
            r#","task":{}"#,
        ] {
            assert!(
                matches!(classify(&call_body(other)), Message::Other),
                "{other}"
            );
        }
        let list = Bytes::from(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert!(matches!(classify(&list), Message::Other));
        let bad =
            Bytes::from(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":5}}"#);
        assert!(matches!(classify(&bad), Message::BadCursor { .. }));
        let not_2_0 = Bytes::from(r#"{"id":1,"method":"tools/list","params":{"cursor":5}}"#);
        assert!(matches!(classify(&not_2_0), Message::Other));
        let batch = Bytes::from(r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call"}]"#);
        assert!(matches!(classify(&batch), Message::Other));
        let cancel = Bytes::from(
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"x"}}"#,
        );
        assert!(matches!(classify(&cancel), Message::Cancelled(_)));
    }

    #[test]
    fn weighted_or_partial_accept_headers_are_left_to_rmcp() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, v.parse().unwrap());
            accepts_both(&h)
        };
        assert!(with("application/json, text/event-stream"));
        assert!(!with("application/json"));
        assert!(!with("application/json, text/event-stream;q=0"));
    }

    #[tokio::test]
    async fn notifications_cancelled_cancels_a_direct_call() {
        let started = Arc::new(tokio::sync::Notify::new());
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let server = server_with(Some(Hold {
            spec: ToolSpec::new("hold", "Holds until cancelled.")
                .read_only()
                .with_schema(json!({"type": "object"})),
            started: started.clone(),
            dropped: dropped.clone(),
            cancelled: Arc::default(),
        }));
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let sid = send(&router, Method::POST, None, init)
            .await
            .session
            .expect("a session id");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        send(&router, Method::POST, Some(&sid), initialized).await;
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        send(&router, Method::POST, Some(&sid), list).await;
        assert_eq!(server.shared.direct.len(), 1, "registered");
        let held = json!({"jsonrpc": "2.0", "id": "h1", "method": "tools/call",
            "params": {"name": "hold", "arguments": {}}});
        let call = tokio::spawn({
            let (router, sid) = (router.clone(), sid.clone());
            async move { send(&router, Method::POST, Some(&sid), held).await }
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
            .await
            .expect("the call starts");
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": "h1", "reason": "test"}});
        let r = send(&router, Method::POST, Some(&sid), cancel).await;
        assert_eq!(
            r.status,
            StatusCode::ACCEPTED,
            "rmcp still takes the notification"
        );
        let r = tokio::time::timeout(std::time::Duration::from_secs(10), call)
            .await
            .expect("the cancelled call ends")
            .unwrap();
        assert_eq!(
            (r.status, r.content_type.as_str(), r.body.as_str()),
            (StatusCode::OK, "text/event-stream", ""),
            "no response for a cancelled request"
        );
        assert!(
            dropped.load(std::sync::atomic::Ordering::SeqCst),
            "the tool's call ended"
        );
    }

    /// A batch's request cancelled while it runs gets no answer (MCP: none for a cancelled
    /// request), not an error made up for it; the batch's other requests are answered.
    #[tokio::test]
    async fn a_cancelled_request_of_a_batch_is_not_answered() {
        let started = Arc::new(tokio::sync::Notify::new());
        let server = server_with(Some(Hold::new(&started)));
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let old: &[(&str, &[u8])] = &[("mcp-protocol-version", b"")];
        let sid = open_2025_03_26(&router).await;
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        send_with(&router, Method::POST, Some(&sid), list.to_string(), old).await;
        let batch = json!([
            {"jsonrpc": "2.0", "id": "h1", "method": "tools/call",
             "params": {"name": "hold", "arguments": {}}},
            call(2, json!({})),
        ]);
        let reply = tokio::spawn({
            let (router, sid) = (router.clone(), sid.clone());
            async move { send_with(&router, Method::POST, Some(&sid), batch.to_string(), old).await }
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
            .await
            .expect("the held call starts");
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": "h1", "reason": "test"}});
        send_with(&router, Method::POST, Some(&sid), cancel.to_string(), old).await;
        let reply = tokio::time::timeout(std::time::Duration::from_secs(10), reply)
            .await
            .expect("the batch ends")
            .unwrap();
        let answers: Vec<Value> = sse_messages(&reply.body)
            .into_iter()
            .filter(|m| m.get("id").is_some())
            .collect();
        assert_eq!(answers.len(), 1, "{}", reply.body);
        assert_eq!(
            answers[0]["result"]["structuredContent"],
            json!({"x": 2}),
            "{}",
            reply.body
        );
    }

    /// A request whose id is still in use by another request of the session is refused
    /// (-32600), on rmcp's path as on the direct one: rmcp routed both answers by the one id,
    /// delivering one call's result on the other's stream and leaving the first hanging.
    /// Once the first request has ended, its id is free again.
    #[tokio::test]
    async fn a_request_reusing_an_id_in_flight_is_refused() {
        let started = Arc::new(tokio::sync::Notify::new());
        let server = server_with(Some(Hold::new(&started)));
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        // "p": with a progress token, through rmcp; "d": the direct path; "w": an `Accept`
        // with weights, which the direct path leaves to rmcp before reading the body.
        let plain: &[u8] = b"application/json, text/event-stream";
        let weighted: &[u8] = b"application/json;q=0.9, text/event-stream";
        for (id, meta, accept) in [
            ("p", json!({"progressToken": 1}), plain),
            ("d", json!({}), plain),
            ("w", json!({}), weighted),
        ] {
            let held = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "hold", "arguments": {}, "_meta": meta}});
            let send = |router: Router, sid: String, body: Value| async move {
                send_with(
                    &router,
                    Method::POST,
                    Some(&sid),
                    body.to_string(),
                    &[("accept", accept)],
                )
                .await
            };
            let call = tokio::spawn(send(router.clone(), sid.clone(), held.clone()));
            tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
                .await
                .expect("the call starts");
            let again = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                send(router.clone(), sid.clone(), held),
            )
            .await
            .expect("the second request is answered at once");
            assert_eq!(
                again.status,
                StatusCode::BAD_REQUEST,
                "{id}: {}",
                again.body
            );
            let v: Value = serde_json::from_str(&again.body).unwrap();
            assert_eq!(v["id"], json!(id));
            assert_eq!(v["error"]["code"], json!(-32600), "{v}");
            let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": id, "reason": "test"}});
            send(router.clone(), sid.clone(), cancel).await;
            tokio::time::timeout(std::time::Duration::from_secs(10), call)
                .await
                .expect("the cancelled call ends")
                .unwrap();
            // Free again once the cancelled call's handler has finished, which may be a
            // moment after its answer's stream closed.
            let list = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let r = send(router.clone(), sid.clone(), list.clone()).await;
                if r.body.contains(r#""tools""#) {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{id}: the id never came free: {}",
                    r.body
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }

    /// A client that drops its request (a network blip, its own timeout) has not cancelled
    /// the call: it runs on, as on rmcp's path, until it ends or the session does.
    #[tokio::test]
    async fn a_dropped_request_does_not_cancel_its_call() {
        let started = Arc::new(tokio::sync::Notify::new());
        let cancelled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let server = server_with(Some(Hold {
            spec: ToolSpec::new("hold", "Holds until cancelled.")
                .read_only()
                .with_schema(json!({"type": "object"})),
            started: started.clone(),
            dropped: dropped.clone(),
            cancelled: cancelled.clone(),
        }));
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        // A `hold` call with `id`, started, then dropped by its client.
        let start_and_drop = |id: &'static str| {
            let (router, sid, started) = (router.clone(), sid.clone(), started.clone());
            async move {
                let held = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "hold", "arguments": {}}});
                let call = tokio::spawn({
                    let (router, sid) = (router.clone(), sid.clone());
                    async move { send(&router, Method::POST, Some(&sid), held).await }
                });
                tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
                    .await
                    .expect("the call starts");
                call.abort();
                let _ = call.await;
            }
        };
        let cancelled_reaches = |n: usize, what: &'static str| {
            let cancelled = cancelled.clone();
            async move {
                tokio::time::timeout(std::time::Duration::from_secs(10), async {
                    while cancelled.load(std::sync::atomic::Ordering::SeqCst) < n {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                })
                .await
                .expect(what);
            }
        };
        start_and_drop("h").await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(cancelled.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(
            !dropped.load(std::sync::atomic::Ordering::SeqCst),
            "the call still runs"
        );
        // `notifications/cancelled` still reaches it.
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": "h", "reason": "test"}});
        send(&router, Method::POST, Some(&sid), cancel).await;
        cancelled_reaches(1, "the client's cancellation reaches the detached call").await;
        // A second call, dropped too: the session's end cancels it.
        start_and_drop("h2").await;
        let r = send(&router, Method::DELETE, Some(&sid), json!({})).await;
        assert!(r.status.is_success(), "{} {}", r.status, r.body);
        cancelled_reaches(2, "the session's end cancels it").await;
    }

    /// Ending a session (`DELETE`) cancels its calls still running, on the direct path and
    /// on rmcp's (a call with a progress token), instead of letting them run for nobody.
    #[tokio::test]
    async fn ending_a_session_cancels_its_running_calls() {
        let started = Arc::new(tokio::sync::Notify::new());
        let cancelled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let catalog = Arc::new(Catalog::new());
        catalog
            .register(Arc::new(Hold {
                spec: ToolSpec::new("hold", "Holds until cancelled.")
                    .read_only()
                    .with_schema(json!({"type": "object"})),
                started: started.clone(),
                dropped: Arc::default(),
                cancelled: cancelled.clone(),
            }))
            .unwrap();
        let (server, recorder) =
            crate::server::test_server_recorded(catalog, ServerOptions::default());
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let sid = open(&server, &router, json!({})).await;
        let direct = json!({"jsonrpc": "2.0", "id": "d", "method": "tools/call",
            "params": {"name": "hold", "arguments": {}}});
        let via_rmcp = json!({"jsonrpc": "2.0", "id": "r", "method": "tools/call",
            "params": {"name": "hold", "arguments": {}, "_meta": {"progressToken": 7}}});
        let mut calls = Vec::new();
        for body in [direct, via_rmcp] {
            calls.push(tokio::spawn({
                let (router, sid) = (router.clone(), sid.clone());
                async move { send(&router, Method::POST, Some(&sid), body).await }
            }));
            tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
                .await
                .expect("the call starts");
        }
        assert_eq!(cancelled.load(std::sync::atomic::Ordering::SeqCst), 0);
        let r = send(&router, Method::DELETE, Some(&sid), json!({})).await;
        assert!(r.status.is_success(), "{} {}", r.status, r.body);
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while cancelled.load(std::sync::atomic::Ordering::SeqCst) < 2 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("both calls see their cancellation");
        for call in calls {
            tokio::time::timeout(std::time::Duration::from_secs(10), call)
                .await
                .expect("the call ends")
                .unwrap();
        }
        // Their log rows say why: the session's end, not the caller giving up on the call
        // (QA-12 B-8: they read "cancelled by the caller").
        let rows = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                let rows = recorder.records();
                if rows.len() == 2 {
                    return rows;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("both calls are logged");
        for row in rows {
            let text = quiver_contract::render(&row.envelope, &Default::default());
            assert!(
                text.contains(
                    "the call to `hold` was cancelled because its client ended the MCP session"
                ),
                "{text}"
            );
        }
    }
}
