//! Reading a request's body: whole, within a byte limit and the server's body timeout; a
//! body over the limit is refused with a JSON-RPC error, and a `tools/call` in what was
//! read has its row.

use axum::{
    body::{Body, Bytes},
    http::{StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use serde_json::Value;

use super::{Direct, answer::json_rpc_error, forward::record_refused};
use crate::server::invalid::{INVALID_REQUEST, Refusal};

/// A request's whole body, at most `limit` bytes, within the server's body timeout (a
/// client that stops sending holds nothing for long). The timer starts only if the body is
/// not already in (`tokio::time::timeout` polls the read first): a small request costs none.
pub(super) async fn read_body(
    direct: &Direct,
    parts: &Parts,
    body: Body,
    limit: usize,
) -> Result<Bytes, Response> {
    let wait = direct.shared.options.body_timeout;
    match tokio::time::timeout(wait, collect_body(body, limit)).await {
        Ok(Ok(Ok(bytes))) => Ok(bytes),
        // Over the limit: a `tools/call` in the head read has its row, as an oversized
        // stdio line's does (every call has one).
        Ok(Ok(Err(head))) => {
            let refusal = Refusal {
                code: INVALID_REQUEST,
                limit: Some(crate::server::invalid::Limit::Size),
                message: format!(
                    "Invalid Request: the body is over {limit} bytes, the most this server reads as one request; send less (a large input belongs in a file the tool reads)"
                ),
                id: crate::lines::find_id(&head, &[]).unwrap_or(Value::Null),
            };
            record_refused(direct, parts, &head, &refusal).await;
            let mut refused = json_rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                refusal.id,
                refusal.code,
                &refusal.message,
            );
            // The rest of the body is not read, so the connection cannot carry another
            // request: the client is told to open a new one.
            refused.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            Err(refused)
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
pub(super) async fn collect_body(
    mut body: Body,
    limit: usize,
) -> Result<Result<Bytes, Bytes>, axum::Error> {
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
