//! Resuming a call's SSE stream (`Last-Event-ID`).

use http_body_util::BodyExt;

use super::*;

/// Asks its client for its roots and answers with them.
struct Asker(ToolSpec);

#[async_trait]
impl Tool for Asker {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _input: Value, ctx: &CallContext) -> ToolResult {
        let roots = ctx.list_roots().await.map_err(|e| e.to_string());
        Ok(Envelope::ok(json!({"roots": format!("{roots:?}")})))
    }
}

/// One SSE event: its id and its JSON-RPC message, when it has them.
#[derive(Debug)]
struct Event {
    id: Option<String>,
    message: Option<Value>,
}

/// Reads `body` until `done` holds for an event, or fails after 10 s; returns every event
/// read.
async fn events_until(body: &mut Body, done: impl Fn(&Event) -> bool) -> Vec<Event> {
    let mut text = String::new();
    let mut events = Vec::new();
    loop {
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim_start().to_owned())
            };
            let event = Event {
                id: field("id:"),
                message: field("data:").and_then(|d| serde_json::from_str(&d).ok()),
            };
            let stop = done(&event);
            events.push(event);
            if stop {
                return events;
            }
        }
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap_or_else(|_| panic!("no more events within 10 s after {events:?}"))
            .unwrap_or_else(|| panic!("the stream ended after {events:?}"))
            .unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data).replace("\r\n", "\n"));
        }
    }
}

/// A server with `asker`, a session whose client declared roots, and a call of `asker`
/// with the request id `id`, read up to the server's roots request: the server, its
/// router, the session, the call's stream and the request's event.
async fn asking(id: u64) -> (McpServer, Router, String, Body, Event) {
    let server = server();
    server
        .shared
        .surface
        .catalog()
        .register(Arc::new(Asker(
            ToolSpec::new("asker", "Asks for roots.")
                .read_only()
                .with_schema(json!({"type": "object"})),
        )))
        .unwrap();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({"roots": {}})).await;
    let ask = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "asker", "arguments": {}}});
    let resp = router
        .clone()
        .oneshot(request(Method::POST, Some(&sid), ask.to_string(), &[]))
        .await
        .unwrap();
    let mut stream = resp.into_body();
    let mut read = events_until(&mut stream, is_roots_request).await;
    let asked = read.pop().unwrap();
    (server, router, sid, stream, asked)
}

fn is_roots_request(e: &Event) -> bool {
    e.message
        .as_ref()
        .is_some_and(|m| m["method"] == "roots/list")
}

/// A client that lost a call's stream after reading the server's request on it, and resumes
/// it with that event's id, is not asked again: the resumed stream carries what came after
/// it, the call's answer once the request is answered.
#[tokio::test]
async fn a_resumed_call_stream_starts_after_the_last_event_read() {
    let (_server, router, sid, stream, asked) = asking(1).await;
    let last_id = asked.id.clone().expect("the request's event has an id");
    let request_id = asked.message.as_ref().unwrap()["id"].clone();
    // The connection drops; the client resumes after the last event it read.
    drop(stream);
    let resp = resume(&router, &sid, &last_id).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut resumed = resp.into_body();
    let answer = json!({"jsonrpc": "2.0", "id": request_id,
        "result": {"roots": [{"uri": "file:///resumed", "name": "r"}]}});
    let r = send(&router, Method::POST, Some(&sid), answer).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    let after = events_until(&mut resumed, |e| {
        e.message.as_ref().is_some_and(|m| m["id"] == 1)
    })
    .await;
    assert!(
        !after.iter().any(is_roots_request),
        "the resumed stream asked again: {after:?}"
    );
    let answered = after.last().unwrap();
    let result = answered.message.as_ref().unwrap().to_string();
    assert!(result.contains("file:///resumed"), "{result}");
    // Resumed after its answer, the stream has nothing more: it is gone, not an empty 200
    // that the client would resume again.
    let again = resume(&router, &sid, answered.id.as_deref().unwrap()).await;
    assert_eq!(again.status(), StatusCode::GONE);
}

/// The client's side of a dropped stream: a GET naming the last event it read.
async fn resume(router: &Router, sid: &str, last_id: &str) -> Response {
    let resume = Request::builder()
        .method(Method::GET)
        .uri("/mcp")
        .header("host", "127.0.0.1:7345")
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", sid)
        .header("last-event-id", last_id)
        .body(Body::empty())
        .unwrap();
    router.clone().oneshot(resume).await.unwrap()
}

/// A client that cancels a call while the server's request on its stream is unanswered,
/// then resumes the stream (as the official Python client does), is neither asked again
/// nor left resuming an empty stream for ever: the stream is gone.
#[tokio::test]
async fn a_cancelled_calls_stream_is_gone_when_resumed() {
    let (_server, router, sid, stream, asked) = asking(7).await;
    let last_id = asked.id.clone().unwrap();
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "the user closed the form"}});
    let r = send(&router, Method::POST, Some(&sid), cancel).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    drop(stream);
    let resp = resume(&router, &sid, &last_id).await;
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert!(body.contains("do not resume it"), "{body}");
}

/// A client whose connection broke while a call ran, and that resumes after the call was
/// answered, gets the answer (rmcp drops an answered stream's events at once; Quiver keeps
/// those of a stream its client left).
#[tokio::test]
async fn a_call_answered_while_its_client_was_away_is_replayed() {
    let (_server, router, sid, stream, asked) = asking(3).await;
    let last_id = asked.id.clone().unwrap();
    let request_id = asked.message.as_ref().unwrap()["id"].clone();
    // The connection breaks; the roots request is answered (on another connection) and
    // the call ends while the client is away.
    drop(stream);
    let answer = json!({"jsonrpc": "2.0", "id": request_id,
        "result": {"roots": [{"uri": "file:///while-away", "name": "r"}]}});
    let r = send(&router, Method::POST, Some(&sid), answer).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resp = resume(&router, &sid, &last_id).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut resumed = resp.into_body();
    let after = events_until(&mut resumed, |e| {
        e.message.as_ref().is_some_and(|m| m["id"] == 3)
    })
    .await;
    assert!(!after.iter().any(is_roots_request), "{after:?}");
    let result = after.last().unwrap().message.as_ref().unwrap().to_string();
    assert!(result.contains("file:///while-away"), "{result}");
}
