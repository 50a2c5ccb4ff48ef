//! What a body is, as far as the direct path is concerned: a plain `tools/call` it answers,
//! a `notifications/cancelled` for a call, a list request with a cursor that is not a
//! string, or anything else (rmcp's); and the method and id of any request.

use axum::body::Bytes;
use rmcp::model::{CallToolRequestParams, RequestId};
use serde_json::Value;

use crate::server::invalid::cursor_problem;

/// A body as the direct path reads it.
pub(super) enum Message {
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
pub(super) fn classify(bytes: &Bytes) -> Message {
    let Ok(Value::Object(mut msg)) = serde_json::from_slice::<Value>(bytes) else {
        return Message::Other;
    };
    // A member given twice is rmcp's to refuse (a `Value` keeps the last one, which
    // would run another request than the first names).
    if crate::server::invalid::repeated_member(bytes).is_some() {
        return Message::Other;
    }
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
            return cursor_problem(&msg).map_or(Message::Other, |(_, problem)| {
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

/// The method and id of a JSON-RPC request body (a response the client sends back has no
/// method; its id is the server's).
pub(super) fn request_head(bytes: &[u8]) -> Option<(String, RequestId)> {
    #[derive(serde::Deserialize)]
    struct Head {
        id: Option<RequestId>,
        method: Option<String>,
    }
    let head: Head = serde_json::from_slice(bytes).ok()?;
    Some((head.method?, head.id?))
}
