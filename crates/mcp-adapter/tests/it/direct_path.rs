//! The client's direct path for streamable-HTTP calls against scripted servers (axum): a
//! response stream
//! that ends without the answer fails that call alone, and the connection stays up; progress
//! after a reconnect reaches only its own call.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use quiver_contract::{CallContext, ErrKind};
use quiver_mcp_adapter::{Liveness, ServerConfig, ServerState};
use serde_json::{Value, json};

use crate::{
    call, close_and_check, fast_options, ready, relay::Recorder, start, text_of, wait_for, within,
};

fn json_reply(id: &Value, result: Value) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::HeaderName::from_static("mcp-session-id"), "s1"),
        ],
        body,
    )
        .into_response()
}

/// A minimal session-era MCP server: tools `ok` (answers), `cut` (its SSE stream carries
/// a log message and ends without the answer, with no event id to resume from) and `odd`
/// (its SSE stream has lines the SSE standard says to ignore or read leniently, then the
/// answer).
async fn scripted(_headers: HeaderMap, body: String) -> Response {
    let msg: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    match msg["method"].as_str().unwrap_or("") {
        "initialize" => json_reply(
            &id,
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "scripted", "version": "1"},
            }),
        ),
        "tools/list" => json_reply(
            &id,
            json!({"tools": [
                {"name": "ok", "description": "Answers.", "inputSchema": {"type": "object"}},
                {"name": "cut", "description": "Never answers.", "inputSchema": {"type": "object"}},
                {"name": "odd", "description": "Answers oddly.", "inputSchema": {"type": "object"}},
                {"name": "trickle", "description": "Never answers.", "inputSchema": {"type": "object"}},
                {"name": "huge", "description": "Answers with 17 MiB.", "inputSchema": {"type": "object"}},
            ]}),
        ),
        "tools/call" if msg["params"]["name"] == "odd" => {
            let answer = json!({"jsonrpc": "2.0", "id": id,
                "result": {"content": [{"type": "text", "text": "odd but fine"}]}});
            // An unknown field, a field name without a colon, a repeated id, a retry that
            // is not a number: each ignored or read leniently by the standard.
            let body = format!(
                "foo: bar\ndata\nid: 1\nid: 2\nretry: soon\n\n: comment\nid: 3\ndata: {answer}\n\n"
            );
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from(body),
            )
                .into_response()
        }
        "tools/call" if msg["params"]["name"] == "trickle" => trickle_event(1),
        "tools/call" if msg["params"]["name"] == "huge" => {
            let answer = json!({"jsonrpc": "2.0", "id": id,
                "result": {"content": [{"type": "text", "text": "x".repeat(17 << 20)}]}});
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from(format!("id: 1\ndata: {answer}\n\n")),
            )
                .into_response()
        }
        "tools/call" if msg["params"]["name"] == "ok" => {
            json_reply(&id, json!({"content": [{"type": "text", "text": "fine"}]}))
        }
        "tools/call" => {
            let event = json!({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": "about to drop"}});
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from(format!("data: {event}\n\n")),
            )
                .into_response()
        }
        "ping" => json_reply(&id, json!({})),
        _ if id.is_null() => StatusCode::ACCEPTED.into_response(),
        _ => json_reply(&id, json!({})),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_ends_without_the_answer_fails_only_that_call() {
    let (catalog, client) = scripted_client().await;
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__sx__cut", json!({})),
    )
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable), "{env:?}");
    assert!(
        env.message()
            .unwrap_or_default()
            .contains("outcome is unknown"),
        "{env:?}"
    );
    // The connection is untouched: the next call is answered on it, nothing was redialled.
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__sx__ok", json!({})),
    )
    .await;
    assert_eq!(text_of(&env), "fine", "{env:?}");
    let st = client.server_status("sx").unwrap().counters;
    assert_eq!((st.dials, st.drops, st.direct_calls), (1, 0, 2), "{st:?}");
    close_and_check(&client).await;
}

/// A client with the scripted server as its one upstream `sx`, connected.
async fn scripted_client() -> (
    std::sync::Arc<quiver_registry::Catalog>,
    quiver_mcp_adapter::McpClient,
) {
    let url = scripted_server().await;
    let (catalog, client) = start(
        &[ServerConfig::http("sx", url)
            .with_liveness(Liveness::Off)
            .required()],
        fast_options(),
    );
    ready(&client).await;
    (catalog, client)
}

/// One SSE event (a log message) with id `n`, then the end of the stream: `trickle`'s
/// stream, and every resumption of it, ends after one event and never answers.
fn trickle_event(n: u64) -> Response {
    let event = json!({"jsonrpc": "2.0", "method": "notifications/message",
        "params": {"level": "info", "data": format!("still working ({n})")}});
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from(format!("id: {n}\ndata: {event}\n\n")),
    )
        .into_response()
}

/// Resumptions (GETs with `Last-Event-ID`) the scripted server has answered.
static RESUMPTIONS: AtomicU64 = AtomicU64::new(0);

async fn scripted_get(headers: HeaderMap) -> Response {
    match headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(n) => {
            RESUMPTIONS.fetch_add(1, Ordering::SeqCst);
            trickle_event(n + 1)
        }
        None => StatusCode::METHOD_NOT_ALLOWED.into_response(),
    }
}

async fn scripted_server() -> String {
    let app = Router::new().route("/mcp", post(scripted).get(scripted_get));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusual_sse_lines_do_not_fail_a_finished_call() {
    let (catalog, client) = scripted_client().await;
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__sx__odd", json!({})),
    )
    .await;
    assert_eq!(text_of(&env), "odd but fine", "{env:?}");
    let st = client.server_status("sx").unwrap().counters;
    assert_eq!((st.direct_calls, st.direct_handoffs), (1, 0), "{st:?}");
    close_and_check(&client).await;
}

/// A session-era server whose session the test can expire with its re-initialization
/// refused, so that Quiver's client loses the connection and dials a new one. Tools: `hold`
/// (an SSE stream that stays open without an answer), `tick` (progress for the call's token
/// on its stream, then the answer) and `ok`.
#[derive(Default)]
struct Expiring {
    /// Sessions handed out so far (`s1`, `s2`, ...).
    handed: AtomicU64,
    /// The session requests must carry (0: none is valid).
    valid: AtomicU64,
    refuse_init: AtomicBool,
    /// Set once a `hold` call is being served.
    held: AtomicBool,
}

async fn expiring(
    State(server): State<Arc<Expiring>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let msg: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let method = msg["method"].as_str().unwrap_or("");
    if method == "initialize" {
        if server.refuse_init.load(Ordering::SeqCst) {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        let n = server.handed.fetch_add(1, Ordering::SeqCst) + 1;
        server.valid.store(n, Ordering::SeqCst);
        let mut reply = json_reply(
            &id,
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "expiring", "version": "1"},
            }),
        );
        reply.headers_mut().insert(
            "mcp-session-id",
            header::HeaderValue::from_str(&format!("s{n}")).unwrap(),
        );
        return reply;
    }
    let valid = format!("s{}", server.valid.load(Ordering::SeqCst));
    if headers.get("mcp-session-id").and_then(|v| v.to_str().ok()) != Some(valid.as_str()) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let sse = |body: Body| {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/event-stream")],
            body,
        )
            .into_response()
    };
    match method {
        "tools/list" => json_reply(
            &id,
            json!({"tools": (["hold", "tick", "ok", "cut"]
                .map(|n| json!({"name": n, "inputSchema": {"type": "object"}})))}),
        ),
        "tools/call" if msg["params"]["name"] == "hold" => {
            server.held.store(true, Ordering::SeqCst);
            sse(Body::from_stream(futures::stream::pending::<
                Result<String, std::io::Error>,
            >()))
        }
        // The call's stream ends before its answer (a proxy that cut it).
        "tools/call" if msg["params"]["name"] == "cut" => sse(Body::from("")),
        "tools/call" if msg["params"]["name"] == "tick" => {
            let token = msg["params"]["_meta"]["progressToken"].clone();
            let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 1, "total": 2, "message": "tick"}});
            let answer = json!({"jsonrpc": "2.0", "id": id,
                "result": {"content": [{"type": "text", "text": "ticked"}]}});
            sse(Body::from(format!(
                "data: {progress}\n\ndata: {answer}\n\n"
            )))
        }
        "tools/call" | "ping" => {
            json_reply(&id, json!({"content": [{"type": "text", "text": "fine"}]}))
        }
        _ if id.is_null() => StatusCode::ACCEPTED.into_response(),
        _ => json_reply(&id, json!({})),
    }
}

/// An [`Expiring`] server on a free port, and its URL.
async fn serve_expiring() -> (Arc<Expiring>, String) {
    let server = Arc::new(Expiring::default());
    let app = Router::new()
        .route(
            "/mcp",
            post(expiring)
                .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                .delete(|| async { StatusCode::OK }),
        )
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (server, url)
}

/// A call on the old connection is still in flight (its stream is open) when the client has
/// reconnected: a call on the new connection gets its own request id and progress token, and
/// progress on its stream reaches its client, not the old call's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_after_a_reconnect_reaches_only_its_own_call() {
    let (server, url) = serve_expiring().await;
    let (catalog, client) = start(
        &[ServerConfig::http("ex", url)
            .with_liveness(Liveness::Off)
            .required()],
        fast_options(),
    );
    ready(&client).await;
    let call_with = |name: &'static str, channel: Arc<Recorder>| {
        let entry = catalog.lookup(name).unwrap();
        async move {
            let ctx = CallContext::for_session(format!("session-{name}")).with_client(channel);
            entry.tool.call(json!({}), &ctx).await.unwrap()
        }
    };
    let old_client = Recorder::new(false);
    let old_call = tokio::spawn(call_with("mcp__ex__hold", old_client.clone()));
    wait_for("the old call in flight", Duration::from_secs(10), || {
        server.held.load(Ordering::SeqCst)
    })
    .await;
    // The session expires and cannot be re-initialized: the next call loses the connection.
    server.refuse_init.store(true, Ordering::SeqCst);
    server.valid.store(0, Ordering::SeqCst);
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__ex__ok", json!({})),
    )
    .await;
    assert!(!env.is_ok(), "{env:?}");
    server.refuse_init.store(false, Ordering::SeqCst);
    wait_for("the reconnect", Duration::from_secs(30), || {
        let st = client.server_status("ex").unwrap();
        st.counters.connects == 2 && st.state == ServerState::Connected
    })
    .await;
    assert!(!old_call.is_finished(), "the old call still waits");
    let new_client = Recorder::new(false);
    let env = within(
        Duration::from_secs(30),
        call_with("mcp__ex__tick", new_client.clone()),
    )
    .await;
    assert_eq!(text_of(&env), "ticked", "{env:?}");
    assert_eq!(new_client.seen(), ["progress 1/Some(2.0): tick"]);
    assert_eq!(old_client.seen(), Vec::<String>::new());
    old_call.abort();
    close_and_check(&client).await;
}

/// Over streamable HTTP on rmcp's path, one call's response stream that ends before its
/// answer fails that call (outcome unknown), not the connection: a call in flight beside it
/// keeps waiting, and the next call goes out on the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_response_stream_fails_only_its_own_call() {
    let (server, url) = serve_expiring().await;
    let (catalog, client) = start(
        &[ServerConfig::http("ex", url)
            .with_liveness(Liveness::Off)
            .required()],
        fast_options().with_http_direct_path(false),
    );
    ready(&client).await;
    let held = tokio::spawn({
        let entry = catalog.lookup("mcp__ex__hold").unwrap();
        async move {
            entry
                .tool
                .call(json!({}), &CallContext::for_session("a"))
                .await
        }
    });
    wait_for("the held call in flight", Duration::from_secs(10), || {
        server.held.load(Ordering::SeqCst)
    })
    .await;
    let cut = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__ex__cut", json!({})),
    )
    .await;
    assert_eq!(cut.err_kind(), Some(&ErrKind::NotAvailable), "{cut:?}");
    assert!(
        cut.message()
            .unwrap_or_default()
            .contains("The server is reachable"),
        "{cut:?}"
    );
    let ok = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__ex__ok", json!({})),
    )
    .await;
    assert_eq!(text_of(&ok), "fine", "{ok:?}");
    assert!(!held.is_finished(), "the call beside it still waits");
    let st = client.server_status("ex").unwrap();
    assert_eq!(st.counters.connects, 1, "{st:?}");
    held.abort();
    close_and_check(&client).await;
}

/// A server that answers a call with one event (with an id and a `retry` of 300 ms), ends
/// the stream and shuts down: the resumption is refused, the call's outcome is unknown,
/// and the connection is lost at once (readiness does not say "ready" until the next
/// liveness ping), so Quiver reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumption_the_server_refuses_loses_the_connection() {
    let stop = Arc::new(tokio::sync::Notify::new());
    let app = Router::new().route(
        "/mcp",
        post({
            let stop = stop.clone();
            move |headers: HeaderMap, body: String| {
                let stop = stop.clone();
                async move {
                    let msg: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                    if msg["method"] == "tools/call" {
                        stop.notify_one();
                        let event = json!({"jsonrpc": "2.0", "method": "notifications/message",
                            "params": {"level": "info", "data": "going"}});
                        return (
                            StatusCode::OK,
                            [(header::CONTENT_TYPE, "text/event-stream")],
                            Body::from(format!("id: 1\nretry: 300\ndata: {event}\n\n")),
                        )
                            .into_response();
                    }
                    scripted(headers, body).await
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let server = tokio::spawn({
        let stop = stop.clone();
        async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.notified().await })
                .await
        }
    });
    let (catalog, client) = start(
        &[ServerConfig::http("gx", url)
            .with_liveness(Liveness::Off)
            .required()],
        fast_options(),
    );
    ready(&client).await;
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__gx__ok", json!({})),
    )
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable), "{env:?}");
    assert!(
        env.message()
            .unwrap_or_default()
            .contains("went away while answering `ok`"),
        "{env:?}"
    );
    within(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
    let st = client.server_status("gx").unwrap();
    assert_eq!(st.counters.drops, 1, "{st:?}");
    assert_ne!(st.state, ServerState::Connected, "{st:?}");
    close_and_check(&client).await;
}

/// A server that ends every stream after one event (with an id, without `retry`) is
/// resumed with growing waits until the call's time is up, not in a loop as fast as the
/// network allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ending_after_every_event_is_resumed_with_growing_waits() {
    let url = scripted_server().await;
    let (catalog, client) = start(
        &[ServerConfig::http("tx", url)
            .with_liveness(Liveness::Off)
            .with_call_timeout(Duration::from_secs(3))
            .required()],
        fast_options(),
    );
    ready(&client).await;
    let before = RESUMPTIONS.load(Ordering::SeqCst);
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__tx__trickle", json!({})),
    )
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::Timeout), "{env:?}");
    // Waits of 0, 50, 100, … 1600 ms fit 3 s about 7 times (the network adds a little).
    let resumed = RESUMPTIONS.load(Ordering::SeqCst) - before;
    assert!((3..=12).contains(&resumed), "{resumed} resumptions in 3 s");
    close_and_check(&client).await;
}

/// An answer in an SSE event over 16 MiB fails its call at once, saying why; it is not
/// resumed (the server would send the same event again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_event_over_16_mib_fails_its_call_at_once() {
    let (catalog, client) = scripted_client().await;
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__sx__huge", json!({})),
    )
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::ToolFailed), "{env:?}");
    assert_eq!(
        env.message(),
        Some(
            "MCP server \"sx\" answered, but its answer cannot be read (an SSE event over 16 MiB, more than Quiver reads); the tool may have run"
        ),
        "{env:?}"
    );
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__sx__ok", json!({})),
    )
    .await;
    assert_eq!(text_of(&env), "fine", "{env:?}");
    close_and_check(&client).await;
}

/// A server that answers `tools/list` on an SSE stream with a schema nested 150 levels
/// deep, past the JSON parser's limit of 128.
async fn deep_listing(body: String) -> Response {
    let msg: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    match msg["method"].as_str().unwrap_or("") {
        "initialize" => json_reply(
            &id,
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "deep", "version": "1"},
            }),
        ),
        "tools/list" => {
            let mut leaf = r#"{"type":"string"}"#.to_owned();
            for _ in 0..150 {
                leaf = format!(r#"{{"type":"object","properties":{{"x":{leaf}}}}}"#);
            }
            let answer = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"deep","inputSchema":{{"type":"object","properties":{{"d":{leaf}}}}}}},{{"name":"fine","inputSchema":{{"type":"object"}}}}]}}}}"#
            );
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                Body::from(format!("id: 1\ndata: {answer}\n\n")),
            )
                .into_response()
        }
        _ if id.is_null() => StatusCode::ACCEPTED.into_response(),
        _ => json_reply(&id, json!({})),
    }
}

/// A listing answered on a stream, past the JSON parser's depth limit because of one tool,
/// is read without that tool, as over stdio: the rest are served at once (the event is
/// not skipped, so the dial does not wait for its connect timeout, and one tool does not
/// fail the whole listing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_too_deep_on_a_stream_is_served_without_the_deep_tool() {
    let app = Router::new().route("/mcp", post(deep_listing));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    // A connect timeout far longer than the wait below: only an answer read as an error
    // can end the dial in time.
    let (catalog, client) = start(
        &[ServerConfig::http("deep", url).with_liveness(Liveness::Off)],
        fast_options().with_connect_timeout(Duration::from_secs(120)),
    );
    let why = "skipped malformed tool \"deep\": tool \"deep\" has a definition nested too deeply for Quiver to read";
    wait_for(
        "the listing without the deep tool",
        Duration::from_secs(30),
        || {
            let st = client.server_status("deep").unwrap();
            st.state == ServerState::Connected && st.diagnostics.iter().any(|l| l.contains(why))
        },
    )
    .await;
    assert!(catalog.lookup("mcp__deep__fine").is_some());
    assert!(catalog.lookup("mcp__deep__deep").is_none());
    close_and_check(&client).await;
}
