//! JSON-RPC batches on 2025-03-26 sessions. That version's streamable HTTP lets a POST
//! carry an array of requests and notifications (or of responses), and a server must accept
//! one; 2025-06-18 removed batching, so later sessions still get `-32600` for an array.
//!
//! Each message of the batch goes through the endpoint alone (the direct path or rmcp, as a
//! single message would), all at once; their answers come back as one JSON array, in the
//! order they finished, each carrying its request's `id`. Only answers are kept: a log
//! message or progress a call sends on its own stream has no place in a JSON answer. A batch
//! of notifications and responses only is answered `202 Accepted`.

use std::{future::Future, pin::Pin};

use axum::{
    body::{Body, Bytes},
    extract::State,
    http::{HeaderValue, Request, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use futures::{StreamExt, future::join_all};
use serde_json::Value;

use super::direct::{Direct, endpoint, json_rpc_error};

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
pub(super) async fn serve(direct: &Direct, parts: Parts, bytes: &Bytes) -> Response {
    let items = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Array(items)) => items,
        // Not JSON after all: the single-message path says why (-32700).
        _ => return one(direct, &parts, bytes.clone()).await,
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
        return json_rpc_error(
            StatusCode::BAD_REQUEST,
            Value::Null,
            super::invalid::INVALID_REQUEST,
            &too_long(items.len()),
        );
    }
    let answers = join_all(
        items
            .iter()
            .map(|item| one(direct, &parts, Bytes::from(item.to_string()))),
    )
    .await;
    let mut out = Vec::new();
    for (item, answer) in items.iter().zip(answers) {
        // An answer that cannot be read still answers its request.
        let unreadable = || {
            serde_json::json!({
                "jsonrpc": "2.0",
                "id": item.get("id").cloned().unwrap_or(Value::Null),
                "error": {"code": -32603, "message": "Internal error: the answer to this request could not be read"},
            })
        };
        let status = answer.status();
        if status == StatusCode::ACCEPTED {
            continue;
        }
        let content_type = answer
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match content_type.as_str() {
            "application/json" => {
                let body = axum::body::to_bytes(answer.into_body(), MAX_ANSWER).await;
                match body
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                {
                    Some(v) => out.push(v),
                    None => out.push(unreadable()),
                }
            }
            "text/event-stream" => match answer_on_stream(answer.into_body()).await {
                Some(v) => out.push(v),
                None if item.get("id").is_some() && item.get("method").is_some() => {
                    out.push(unreadable())
                }
                None => {}
            },
            // Not an answer to one message (an ended session's 404, a refused Host): the
            // whole batch gets it, as a single message would.
            _ => return answer,
        }
    }
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

/// One message of the batch through the endpoint, with the batch's head.
fn one(
    direct: &Direct,
    parts: &Parts,
    body: Bytes,
) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
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

/// The JSON-RPC answer (a message with an `id` and a `result` or `error`) on a message's
/// SSE stream; `None` when the stream ends without one.
async fn answer_on_stream(body: Body) -> Option<Value> {
    let stream = body
        .into_data_stream()
        .map(|chunk| chunk.map_err(std::io::Error::other));
    let mut events = crate::client::sse::events(stream);
    while let Some(Ok(event)) = events.next().await {
        let Ok(message) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        if message.get("id").is_some()
            && (message.get("result").is_some() || message.get("error").is_some())
        {
            return Some(message);
        }
    }
    None
}
