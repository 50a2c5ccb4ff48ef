//! The lean streamable-HTTP call path against a scripted server (axum): a response stream
//! that ends without the answer fails that call alone, and the connection stays up.

use std::time::Duration;

use axum::{
    Router,
    body::Body,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use quiver_contract::ErrKind;
use quiver_mcp_adapter::{Liveness, ServerConfig};
use serde_json::{Value, json};

use crate::{call, close_and_check, fast_options, ready, start, text_of, within};

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

/// A minimal session-era MCP server: tools `ok` (answers) and `cut` (its SSE stream carries
/// a log message and ends without the answer, with no event id to resume from).
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
            ]}),
        ),
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
    let app = Router::new().route(
        "/mcp",
        post(scripted).get(|| async { StatusCode::METHOD_NOT_ALLOWED }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (catalog, client) = start(
        &[ServerConfig::http("sx", url)
            .with_liveness(Liveness::Off)
            .required()],
        fast_options(),
    );
    ready(&client).await;
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
    assert_eq!((st.dials, st.drops, st.lean_calls), (1, 0, 2), "{st:?}");
    close_and_check(&client).await;
}
