//! What a model and its client read on the wire from `quiver serve`, locked by insta
//! snapshots: the session's `tools/list`, the JSON-RPC refusals (-32700, -32600, -32601,
//! -32602), the dispatcher's answers to calls it refuses (an unknown name, bad arguments),
//! and an upstream's answers as Quiver relays them (a result, an upstream hint). A change
//! to any of these texts shows up as a snapshot diff to review.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::mcp_server::{INITIALIZE, INITIALIZED, fresh_dir, line_of, stdio_server_before_fx};

/// Each request, by id, with the name its snapshot gets.
fn requests() -> Vec<(&'static str, String)> {
    let call = |id: i64, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}})
        .to_string()
    };
    vec![
        (
            "tools_list",
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string(),
        ),
        (
            "call_unknown_tool",
            call(3, "tool_serch", json!({"query": "x"})),
        ),
        (
            "call_bad_arguments",
            call(4, "tool_search", json!({"query": "echo", "limit": "many"})),
        ),
        (
            "call_upstream_ok",
            call(5, "mcp__fx__echo", json!({"text": "hello"})),
        ),
        ("call_upstream_hint", call(6, "mcp__fx__hinted", json!({}))),
        ("call_missing_argument", call(7, "mcp__fx__echo", json!({}))),
        (
            "params_of_the_wrong_type",
            json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                "params": {"name": "mcp__fx__echo", "arguments": "hello"}})
            .to_string(),
        ),
        (
            "unknown_method",
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/frobnicate"}).to_string(),
        ),
        (
            "wrong_jsonrpc_version",
            json!({"jsonrpc": "1.0", "id": 10, "method": "ping"}).to_string(),
        ),
        ("not_json", "this is not json".to_owned()),
    ]
}

#[tokio::test]
async fn model_facing_wire_text_is_locked() {
    let dir = fresh_dir();
    let mut child = stdio_server_before_fx(&dir, "\"normal\"", "required = true");
    let mut stdin = child.stdin.take().expect("piped");
    let mut out = BufReader::new(child.stdout.take().expect("piped")).lines();
    for line in [INITIALIZE, INITIALIZED] {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    stdin.flush().await.unwrap();
    let initialized = line_of(&mut out).await;
    assert!(initialized.contains(r#""id":1"#), "{initialized}");
    // One request at a time: each answer is read before the next request is sent, so the
    // answers cannot interleave with one another.
    for (name, request) in requests() {
        stdin
            .write_all(format!("{request}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
        let answer = loop {
            let line = line_of(&mut out).await;
            let value: Value = serde_json::from_str(&line).expect("the server writes JSON");
            // Notifications (list changes, logs) are not answers.
            if value.get("id").is_some() {
                break value;
            }
        };
        insta::assert_json_snapshot!(name, answer);
    }
    drop(stdin);
    let status = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait())
        .await
        .expect("the server exits when stdin closes")
        .unwrap();
    assert!(status.success(), "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}
