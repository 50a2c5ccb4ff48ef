//! Handing a request to rmcp's streamable-HTTP service: a session's request holds its id
//! while rmcp serves it, and what rmcp refuses before any handler runs is told in JSON-RPC
//! (a body that is not one message) and has its row when it is a `tools/call`.

use std::sync::Arc;

use axum::{
    body::{Body, Bytes},
    extract::Request,
    http::{Method, StatusCode, request::Parts},
    response::Response,
};
use rmcp::model::RequestId;
use serde_json::Value;

use super::{
    Direct, MAX_OPENING_BODY, SESSION_HEADER,
    answer::json_rpc_error,
    body::read_body,
    classify::request_head,
    sessions::{Entry, IdHeld, second_initialize},
};
use crate::server::{
    auth::Principal,
    handler,
    invalid::{self, Refusal},
    refusals,
};

pub(super) async fn forward(direct: &Direct, request: Request) -> Response {
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

/// Forwards a session's message to rmcp; a request (`id`) holds its id for as long as its
/// answer is being sent, and one whose id is already in use is refused.
pub(super) async fn forward_claimed(
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

/// 400 with a JSON-RPC error: a request reused the id of one still in flight.
/// A `tools/call` in `bytes` has its row.
pub(super) async fn id_in_use(
    direct: &Direct,
    parts: &Parts,
    bytes: &[u8],
    id: RequestId,
) -> Response {
    let refusal = Refusal {
        code: invalid::INVALID_REQUEST,
        limit: None,
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
pub(in crate::server) async fn record_refused(
    direct: &Direct,
    parts: &Parts,
    bytes: &[u8],
    refusal: &Refusal,
) {
    for call in invalid::refused_calls_in(bytes) {
        refusals::record_transport_refusal(&direct.shared, Some(parts), None, call, refusal).await;
    }
}

pub(super) async fn forward_parts(direct: &Direct, parts: Parts, bytes: Bytes) -> Response {
    // A member given twice: refused by name (rmcp reads some such bodies with the last of
    // them, and refuses others without saying why); a `tools/call` so refused has its row.
    if invalid::repeated_member(&bytes).is_some() {
        let value = serde_json::from_slice::<Value>(&bytes).unwrap_or_default();
        let refusal = invalid::diagnose_sent(&bytes, &value, "the body");
        record_refused(direct, &parts, &bytes, &refusal).await;
        return json_rpc_error(
            StatusCode::BAD_REQUEST,
            refusal.id,
            refusal.code,
            &refusal.message,
        );
    }
    let caller = parts
        .extensions
        .get::<Principal>()
        .map(|p| p.capabilities.clone());
    // A 2026-07-28 call that rmcp refuses for its headers or its version never reaches
    // the handler: the parts are kept to give it its row (also when its `Mcp-Method` names
    // another method or is missing: the body says which it is).
    let call_parts = match parts.headers.get("mcp-method") {
        Some(v) if v.as_bytes() == b"tools/call" => true,
        _ => bytes.windows(10).any(|w| w == b"tools/call"),
    }
    .then(|| parts.clone());
    let session = parts
        .headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(Arc::<str>::from);
    let request = Request::from_parts(parts, Body::from(bytes.clone()));
    // rmcp checks a 2026-07-28 call's `Mcp-Param-*` headers against the tool's definition
    // before the handler runs, asking `get_tool` with the name alone: the caller goes with
    // the request, so that a tool its token may not use has no definition to check against.
    let handled = direct.rmcp.handle(request);
    let response = match caller {
        Some(caller) => handler::CALLER.scope(caller, handled).await,
        None => handled.await,
    }
    .map(Body::new);
    let response = match &call_parts {
        Some(parts) if response.status() == StatusCode::BAD_REQUEST => {
            record_header_refusal(direct, parts, &bytes, response).await
        }
        _ => response,
    };
    let status = response.status();
    if status == StatusCode::UNSUPPORTED_MEDIA_TYPE || status == StatusCode::NOT_ACCEPTABLE {
        // Not JSON, nested too deeply, not JSON-RPC; or sent with a `Content-Type` or an
        // `Accept` rmcp does not take: a `tools/call` so refused has its row.
        let (response, refusal) = match status {
            StatusCode::UNSUPPORTED_MEDIA_TYPE => unparsable(response, Some(&bytes)).await,
            _ => (response, None),
        };
        let (response, refusal) = match refusal {
            Some(refusal) => (response, refusal),
            None => refused_for_headers(response, &bytes).await,
        };
        if let Some(parts) = &call_parts {
            record_refused(direct, parts, &bytes, &refusal).await;
        }
        return response;
    }
    // A request's stream on a session: its answer is kept if its client leaves before it.
    let streamed = status == StatusCode::OK
        && response
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    match session {
        Some(session) if streamed => {
            let replays = direct.replays.clone();
            response.map(|body| super::replay::tapped(body, session, replays))
        }
        _ => response,
    }
}

/// rmcp's refusal of a request for its headers (its text passed on as it is), and the
/// refusal its row records.
async fn refused_for_headers(response: Response, sent: &[u8]) -> (Response, Refusal) {
    let (head, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let refusal = Refusal {
        code: invalid::INVALID_REQUEST,
        limit: None,
        message: text.clone(),
        id: crate::lines::find_id(sent, &[]).unwrap_or(Value::Null),
    };
    (Response::from_parts(head, Body::from(text)), refusal)
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
        // -32602: a 2026-07-28 request whose `_meta` misses the protocol's fields, refused
        // by rmcp's transport before any handler.
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
        let name = refusals::sent_name(params.remove("name"));
        let meta = params
            .get("_meta")
            .cloned()
            .and_then(|m| serde_json::from_value(m).ok())
            .unwrap_or_default();
        let message = refused["error"]["message"]
            .as_str()
            .unwrap_or("the request's headers do not match its body");
        let input = params.remove("arguments").unwrap_or(Value::Null);
        refusals::record_invalid_params(
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

/// What rmcp's 415 says when the body itself did not parse (its other 415, a wrong
/// `Content-Type`, is passed on as it is).
const UNPARSED_BODY: &str = "fail to deserialize request body ";

/// rmcp answers a body that is not one JSON-RPC message with `415` and a line of text; a
/// JSON-RPC client expects a JSON-RPC error: `-32700` for text that is not JSON, `-32600`
/// for JSON that is not one message (a batch, a stray object), with status 400; and the
/// refusal (none when the answer was another).
async fn unparsable(response: Response, sent: Option<&Bytes>) -> (Response, Option<Refusal>) {
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
            Some(Ok(value)) => {
                invalid::diagnose_sent(sent.map_or(&[][..], |b| &b[..]), &value, "the body")
            }
            _ => Refusal {
                code: invalid::INVALID_REQUEST,
                limit: None,
                message: "Invalid Request: the body must be one JSON-RPC 2.0 request, \
                          notification or response object"
                    .into(),
                id: Value::Null,
            },
        }
    } else if sent.is_some_and(|b| b.starts_with(b"\xef\xbb\xbf")) {
        Refusal {
            code: invalid::PARSE_ERROR,
            limit: None,
            message: "Parse error: the body starts with a UTF-8 byte-order mark (EF BB BF), which JSON over HTTP does not take; send the JSON without it".to_owned(),
            id: Value::Null,
        }
    } else {
        invalid::unreadable(sent.map_or(&[][..], |b| &b[..]), detail, "the body")
    };
    let response = json_rpc_error(
        StatusCode::BAD_REQUEST,
        refusal.id.clone(),
        refusal.code,
        &refusal.message,
    );
    (response, Some(refusal))
}
