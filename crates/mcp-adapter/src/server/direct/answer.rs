//! Answering on the direct path: a plain `tools/call` run as rmcp's session would run it,
//! answered with one JSON body, or with an SSE stream of its own once it sends a log
//! message; and the HTTP answers this path builds (JSON, SSE events, JSON-RPC errors).

use std::sync::Arc;

use axum::{
    body::Body,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use rmcp::model::{
    CallToolRequestParams, JsonRpcResponse, JsonRpcVersion2_0, RequestId, ServerResult,
};
use serde_json::Value;

use super::sessions::{Entry, IdHeld};
use crate::server::{
    Shared,
    call::{call, track},
    channel::{self, PeerChannel, ProgressState},
    scope::{Connection, Scope},
};
use crate::sync::lock;

/// Answers one `tools/call` as rmcp's session would, as a JSON response.
pub(super) async fn serve_call(
    shared: &Arc<Shared>,
    entry: &Entry,
    scope: Scope,
    id: RequestId,
    params: CallToolRequestParams,
    held: IdHeld,
    as_declared: bool,
) -> Response {
    track(shared, &entry.conn, &scope, true, &entry.peer);
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
        request_id: Some(id.clone()),
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
            call(
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
    mut result: rmcp::model::CallToolResult,
) -> JsonRpcResponse<ServerResult> {
    crate::wire::no_list_copy(&mut result);
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
pub(in crate::server) fn sse_event(data: &str) -> String {
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

/// An HTTP answer carrying one JSON-RPC error (the direct path's own refusals).
pub(in crate::server) fn json_rpc_error(
    status: StatusCode,
    id: Value,
    code: i64,
    message: &str,
) -> Response {
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

/// A call in flight on the direct path, by its id: `notifications/cancelled` finds it
/// until it ends.
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
