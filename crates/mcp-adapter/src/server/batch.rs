//! JSON-RPC batches on 2025-03-26 sessions. That version's streamable HTTP lets a POST
//! carry an array of requests and notifications (or of responses), and a server must accept
//! one; 2025-06-18 removed batching, so later sessions still get `-32600` for an array.
//!
//! Each message of the batch goes through the endpoint alone (the direct path or rmcp, as a
//! single message would), all at once. On a live session whose client accepts SSE (as the
//! transport says every client must), the answer is one SSE stream carrying every message
//! each call sends on its own stream (log messages, progress) and each request's answer, as
//! they come, as the specification allows ("these responses MAY be batched"; one event per
//! message here). Otherwise the answers come back as one JSON array, in the order they
//! finished, each carrying its request's `id`, and only answers are kept. A batch of
//! notifications and responses only is answered `202 Accepted`.

use std::{future::Future, pin::Pin, sync::Arc};

use axum::{
    body::{Body, Bytes},
    extract::State,
    http::{HeaderValue, Request, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use futures::{StreamExt, future::join_all};
use rmcp::transport::streamable_http_server::session::SessionManager;
use serde_json::Value;

use super::{
    direct::{Direct, endpoint, json_rpc_error, sse_event},
    invalid::Refusal,
    scope::Connection,
};

/// The most bytes of one message's answer read into the batch's answer.
const MAX_ANSWER: usize = 16 << 20;

/// The most messages one batch may hold (every message runs at once; a 4 MiB body could
/// otherwise start a hundred thousand).
pub(super) const MAX_BATCH: usize = 100;

/// The refusal of a batch of `n` messages, more than [`MAX_BATCH`].
pub(super) fn too_long(n: usize) -> String {
    format!(
        "Invalid Request: a batch of {n} messages; this server takes at most {MAX_BATCH} in one batch, so send it in parts"
    )
}

/// Whether `bytes` is a JSON array (its first byte after white space is `[`).
pub(super) fn is_array(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'[')
}

/// Answers the batch `bytes` (a JSON array) sent with the request head `parts`.
pub(super) async fn serve(direct: &Arc<Direct>, parts: Parts, bytes: &Bytes) -> Response {
    let items = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Array(items)) => items,
        // Not JSON after all: -32700 in the single-message path's words (it was taken
        // for a batch inside a batch).
        Err(e) => {
            let refusal = super::invalid::unreadable(bytes, &e.to_string(), "the body");
            // A batch nested too deeply is read with its deep parts cut: each `tools/call`
            // in it has its row.
            super::direct::record_refused(direct, &parts, bytes, &refusal).await;
            return json_rpc_error(
                StatusCode::BAD_REQUEST,
                refusal.id,
                refusal.code,
                &refusal.message,
            );
        }
        Ok(_) => return one(direct, &parts, bytes.clone()).await,
    };
    if items.is_empty() {
        return json_rpc_error(
            StatusCode::BAD_REQUEST,
            Value::Null,
            super::invalid::INVALID_REQUEST,
            "Invalid Request: an empty batch (a batch holds at least one message)",
        );
    }
    if items.len() > MAX_BATCH {
        let refusal = super::invalid::Refusal {
            code: super::invalid::INVALID_REQUEST,
            limit: None,
            message: too_long(items.len()),
            id: Value::Null,
        };
        super::direct::record_refused(direct, &parts, bytes, &refusal).await;
        return json_rpc_error(
            StatusCode::BAD_REQUEST,
            refusal.id,
            refusal.code,
            &refusal.message,
        );
    }
    let requests = items
        .iter()
        .any(|item| item.get("id").is_some() && item.get("method").is_some());
    // The session's connection, to tell a request its client cancelled (no answer due)
    // from one whose answer went missing.
    let conn = super::direct::candidate(direct, &parts.method, &parts.headers, Some(0))
        .and_then(|sid| direct.shared.direct.get(&sid))
        .map(|entry| entry.conn.clone());
    let refused = refusals(&items);
    // A batch refused element by element asks nothing of the session; one sent on an ended
    // session gets that session's 404, as it would if an element had run (a ping asks, only
    // once the session is known to be gone, so nothing runs on a live one).
    if refused.iter().all(Option::is_some) && !session_live(direct, &parts).await {
        let probe = one(direct, &parts, Bytes::from_static(PROBE)).await;
        if answers_as_a_whole(&probe) {
            return probe;
        }
    }
    if requests && streams_to(direct, &parts).await {
        return streamed(direct, &parts, items, refused, conn);
    }
    let answers = join_all(
        items
            .iter()
            .zip(refused)
            .map(|(item, refused)| element(direct, &parts, item, refused)),
    )
    .await;
    // Not an answer to one message (an ended session's 404, a refused Host): the whole
    // batch gets it, as a single message would.
    if let Some(at) = answers.iter().position(answers_as_a_whole) {
        return answers.into_iter().nth(at).expect("found above");
    }
    // The same relay as the stream's; only the answers are kept (a JSON answer has no
    // place for the rest).
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
    let relays = join_all(
        items
            .iter()
            .zip(answers)
            .map(|(item, answer)| relay(answer, item, conn.clone(), tx.clone())),
    );
    drop(tx);
    let gather = async {
        let mut out = Vec::new();
        while let Some(message) = rx.recv().await {
            if let Ok(v) = serde_json::from_str::<Value>(&message)
                && is_answer(&v)
            {
                out.push(v);
            }
        }
        out
    };
    let ((), out) = futures::join!(
        async {
            relays.await;
        },
        gather
    );
    if out.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Value::Array(out).to_string(),
    )
        .into_response()
}

/// What asks the session's state for a batch whose every element was refused (an id of
/// its own, so that it meets no id a client holds).
const PROBE: &[u8] = br#"{"jsonrpc":"2.0","id":"quiver-batch-probe","method":"ping"}"#;

/// Whether `answer` answers the whole request rather than one message of it (an ended
/// session's 404, a refused `Host`): neither `202 Accepted` nor a JSON or SSE body.
fn answers_as_a_whole(answer: &Response) -> bool {
    answer.status() != StatusCode::ACCEPTED
        && !matches!(
            content_type(answer).as_str(),
            "application/json" | "text/event-stream"
        )
}

/// Whether the request's `Mcp-Session-Id` names a live session.
async fn session_live(direct: &Direct, parts: &Parts) -> bool {
    let Some(sid) = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    direct
        .sessions
        .has_session(&Arc::from(sid))
        .await
        .unwrap_or(false)
}

/// Whether the batch is answered on an SSE stream: its head is one the direct path would
/// take (JSON that accepts SSE, an allowed `Host` and `Origin`, one session id) and names a
/// live session. A head refused as a whole (an ended session's 404, a foreign
/// `Host`) is answered as a whole, not inside a stream.
async fn streams_to(direct: &Direct, parts: &Parts) -> bool {
    let Some(sid) = super::direct::candidate(direct, &parts.method, &parts.headers, Some(0)) else {
        return false;
    };
    direct.sessions.has_session(&sid).await.unwrap_or(false)
}

/// The batch answered on one SSE stream: every message each of its messages' answers
/// carries, as it comes; the stream ends when they all have.
fn streamed(
    direct: &Arc<Direct>,
    parts: &Parts,
    items: Vec<Value>,
    refused: Vec<Option<Refusal>>,
    conn: Option<Arc<Connection>>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(64);
    for (item, refused) in items.into_iter().zip(refused) {
        let answer = element(direct, parts, &item, refused);
        let tx = tx.clone();
        let conn = conn.clone();
        tokio::spawn(async move { relay(answer.await, &item, conn, tx).await });
    }
    drop(tx);
    let events = futures::stream::unfold(rx, |mut rx| async move {
        let data = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(sse_event(&data)), rx))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(events),
    )
        .into_response()
}

/// Sends what the answer `answer` to the batch's message `item` carries to `tx`: its JSON
/// answer, or every message on its stream; an error answer when a request's is missing or
/// cannot be read, unless the session's client (`conn`) cancelled it. Stops when the
/// batch's stream is gone (its client left; the calls go on, as for a single message).
async fn relay(
    answer: Response,
    item: &Value,
    conn: Option<Arc<Connection>>,
    tx: tokio::sync::mpsc::Sender<String>,
) {
    let request = item.get("id").is_some() && item.get("method").is_some();
    let failed = |why: &str| {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": item.get("id").cloned().unwrap_or(Value::Null),
            "error": {"code": -32603, "message": format!("Internal error: {why}")},
        })
        .to_string()
    };
    let status = answer.status();
    if status == StatusCode::ACCEPTED {
        return;
    }
    match content_type(&answer).as_str() {
        "application/json" => {
            let body = axum::body::to_bytes(answer.into_body(), MAX_ANSWER).await;
            let message = match body
                .ok()
                .filter(|b| serde_json::from_slice::<Value>(b).is_ok())
            {
                Some(b) => String::from_utf8_lossy(&b).into_owned(),
                None => failed("the answer to this request could not be read"),
            };
            let _ = tx.send(message).await;
        }
        "text/event-stream" => {
            let stream = answer
                .into_body()
                .into_data_stream()
                .map(|chunk| chunk.map_err(std::io::Error::other));
            let mut events = crate::sse::events(stream);
            let mut answered = false;
            while let Some(Ok(event)) = events.next().await {
                let Ok(message) = serde_json::from_str::<Value>(&event.data) else {
                    continue;
                };
                answered = is_answer(&message);
                if tx.send(event.data).await.is_err() || answered {
                    // The answer is the last message of its request's stream (the server
                    // may keep the stream open a while after it): done.
                    return;
                }
            }
            // A cancelled request is not answered (MCP cancellation): its stream ends
            // without an answer, and none is made up for it.
            let cancelled = conn.as_ref().is_some_and(|conn| {
                item.get("id")
                    .and_then(|id| serde_json::from_value(id.clone()).ok())
                    .is_some_and(|id| conn.was_cancelled(&id))
            });
            if request && !answered && !cancelled {
                let _ = tx
                    .send(failed(
                        "the stream of this request ended without its answer",
                    ))
                    .await;
            }
        }
        _ if request => {
            let _ = tx
                .send(failed(&format!(
                    "this request was answered with HTTP {status}"
                )))
                .await;
        }
        _ => {}
    }
}

/// The essence of a response's `Content-Type`, lower-cased.
fn content_type(answer: &Response) -> String {
    answer
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// What refuses each element of a batch before it runs, as on stdio: an element that is
/// not an object (the single-message path would name it "the body"), an `initialize`, the
/// requests that share an id (the endpoint's own check sees only the requests still in
/// flight, so two quick ones both ran).
fn refusals(items: &[Value]) -> Vec<Option<Refusal>> {
    let shared = super::invalid::shared_ids(items);
    items
        .iter()
        .map(|item| {
            if !item.is_object() && !item.is_array() {
                return Some(super::invalid::diagnose(item, "the batch element"));
            }
            // The endpoint checks the ids in flight itself.
            super::invalid::refused_in_batch(item, &shared, |_| false)
        })
        .collect()
}

/// One element of the batch: its refusal, or the message through the endpoint ([`one`]).
fn element(
    direct: &Arc<Direct>,
    parts: &Parts,
    item: &Value,
    refused: Option<Refusal>,
) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
    match refused {
        // A `tools/call` refused here has its row, as one refused alone.
        Some(r) => {
            let call = super::invalid::refused_call(item);
            let (direct, parts) = (direct.clone(), parts.clone());
            Box::pin(async move {
                if let Some(call) = call {
                    super::refusals::record_transport_refusal(
                        &direct.shared,
                        Some(&parts),
                        None,
                        call,
                        &r,
                    )
                    .await;
                }
                json_rpc_error(StatusCode::BAD_REQUEST, r.id, r.code, &r.message)
            })
        }
        None => one(direct, parts, Bytes::from(item.to_string())),
    }
}

/// One message of the batch through the endpoint, with the batch's head. An element that is
/// itself an array is refused, not taken as a batch in its turn (a batch of batches would
/// get past [`MAX_BATCH`]).
fn one(
    direct: &Arc<Direct>,
    parts: &Parts,
    body: Bytes,
) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
    if is_array(&body) {
        let refusal = super::invalid::diagnose(&Value::Array(Vec::new()), "the batch element");
        return Box::pin(std::future::ready(json_rpc_error(
            StatusCode::BAD_REQUEST,
            Value::Null,
            refusal.code,
            &refusal.message,
        )));
    }
    let mut request = Request::new(Body::from(body.clone()));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    *request.extensions_mut() = parts.extensions.clone();
    request
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    Box::pin(endpoint(State(direct.clone()), request))
}

/// Whether `message` is an answer: an `id` with a `result` or an `error`.
fn is_answer(message: &Value) -> bool {
    message.get("id").is_some()
        && (message.get("result").is_some() || message.get("error").is_some())
}
