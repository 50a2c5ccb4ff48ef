//! Resuming a call's SSE stream: a GET with `Last-Event-ID`.
//!
//! SSE's `Last-Event-ID` names the last event the client has. rmcp replays a call's stream
//! from the event it names, inclusive, so a client resuming after a server request (an
//! elicitation, say) would be asked it again; Quiver asks rmcp for the stream from the next
//! event, or serves the events Quiver kept of a call answered after its client left (see
//! [`super::replay`]). A call stream that then has nothing to replay and is over (its call
//! cancelled, or answered and the answer read; or a stream no longer kept) is answered 410
//! Gone: rmcp's empty 200 would have a client resume it again and again for the session's
//! life.
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

/// The answer kept for the stream a resumption names (see [`super::replay`]), else rmcp's
/// answer to it, or 410 Gone when its stream ends before its first event.
pub(super) async fn resume(direct: &Direct, request: Request) -> Response {
    if let Some(kept) = kept_for(direct, request.headers()) {
        return (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            kept,
        )
            .into_response();
    }
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
            "Gone: this stream is over and has nothing more to send (its request was \
             cancelled, or answered and the answer sent, or it ended more than a minute \
             ago); do not resume it",
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

/// The kept events of the stream the (rewritten) `Last-Event-ID` names, from the one it
/// names on.
fn kept_for(direct: &Direct, headers: &HeaderMap) -> Option<String> {
    let session = headers.get(super::SESSION_HEADER)?.to_str().ok()?;
    let (from, stream) = headers.get(LAST_EVENT_ID)?.to_str().ok()?.split_once('/')?;
    direct
        .replays
        .from(session, stream.parse().ok()?, from.parse().ok()?)
}
