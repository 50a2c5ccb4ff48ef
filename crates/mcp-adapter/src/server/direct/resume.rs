//! Resuming a call's SSE stream: a GET with `Last-Event-ID`.
//!
//! SSE's `Last-Event-ID` names the last event the client has. rmcp replays a call's stream
//! from the event it names, inclusive, so a client resuming after a server request (an
//! elicitation, say) would be asked it again; Quiver asks rmcp for the stream from the next
//! event. A call stream that then has nothing to replay and is over (its call answered or
//! cancelled, and every event read; or a stream rmcp no longer keeps) is answered 410 Gone:
//! rmcp's empty 200 would have a client resume it again and again for the session's life.
//!
//! The standalone stream's ids (no `/`) are left as they are: its priming event and its
//! first message both carry `0`, and a notification repeated is harmless where one skipped
//! is not.

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::{FutureExt, StreamExt};
use http_body_util::BodyExt;

use super::{Direct, forward::forward};

const LAST_EVENT_ID: &str = "last-event-id";

/// Rewrites a call stream's `Last-Event-ID` (`<index>/<stream>`) to name the next event;
/// says whether it did.
pub(super) fn after_last_event(headers: &mut HeaderMap) -> bool {
    let Some((index, stream)) = headers
        .get(LAST_EVENT_ID)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once('/'))
    else {
        return false;
    };
    let (Ok(index), Ok(stream)) = (index.parse::<usize>(), stream.parse::<u64>()) else {
        return false;
    };
    let Some(next) = index.checked_add(1) else {
        return false;
    };
    match header::HeaderValue::from_str(&format!("{next}/{stream}")) {
        Ok(value) => {
            headers.insert(LAST_EVENT_ID, value);
            true
        }
        Err(_) => false,
    }
}

/// rmcp's answer to a resumption, or 410 Gone when its stream ends before its first event.
pub(super) async fn resume(direct: &Direct, request: Request) -> Response {
    let response = forward(direct, request).await;
    if response.status() != StatusCode::OK {
        return response;
    }
    let (parts, mut body) = response.into_parts();
    // rmcp builds a finished stream's replay before it answers, so one that ends at once
    // is over; a live one is pending or has its first event ready.
    match body.frame().now_or_never() {
        Some(None) => (
            StatusCode::GONE,
            "Gone: this stream has ended and has nothing more to send (its request was \
             answered or cancelled); do not resume it",
        )
            .into_response(),
        Some(Some(Ok(frame))) => {
            let first = frame.into_data().unwrap_or_default();
            let rest = body.into_data_stream();
            let body = Body::from_stream(
                futures::stream::once(async move { Ok::<_, axum::Error>(first) }).chain(rest),
            );
            Response::from_parts(parts, body)
        }
        Some(Some(Err(_))) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal Server Error: the resumed stream failed; resume it again",
        )
            .into_response(),
        None => Response::from_parts(parts, body),
    }
}
