//! A 2025-03-26 session's batches: each request answered on one stream, refusals inside
//! the batch's answer, a cancelled request left unanswered.

use super::*;

/// A 2025-03-26 session may send a batch (that version's transport says a server must
/// accept one): every request in it is answered, on one SSE stream that also carries
/// what the calls send on their own streams (progress); a batch without
/// requests is accepted with 202; an empty batch is one -32600. A later session's batch
/// is still refused (2025-06-18 removed batching).
#[tokio::test]
async fn a_batch_on_a_2025_03_26_session_is_answered_on_one_stream() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let old: &[(&str, &[u8])] = &[("mcp-protocol-version", b"")];
    let sid = open_2025_03_26(&router).await;
    let batch = json!([
        call(1, json!({})),
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "no/such/method"},
        call(4, json!({})),
    ]);
    // The answers come on one stream, with what the calls send on their own streams:
    // here a call's progress.
    let mut batch = batch;
    batch
        .as_array_mut()
        .unwrap()
        .push(json!({"jsonrpc": "2.0", "id": 5,
        "method": "tools/call", "params": {"name": "echo",
        "arguments": {"x": 5, "tick": true}, "_meta": {"progressToken": "p5"}}}));
    let reply = send_with(&router, Method::POST, Some(&sid), batch.to_string(), old).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.content_type.starts_with("text/event-stream"),
        "{}",
        reply.content_type
    );
    let messages = sse_messages(&reply.body);
    let progress: Vec<&Value> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 1, "{}", reply.body);
    assert_eq!(
        progress[0]["params"]["progressToken"], "p5",
        "{}",
        reply.body
    );
    assert_eq!(
        progress[0]["params"]["message"], "halfway",
        "{}",
        reply.body
    );
    let answers: Vec<Value> = messages
        .into_iter()
        .filter(|m| m.get("id").is_some())
        .collect();
    assert_eq!(answers.len(), 5, "{}", reply.body);
    let by_id = |id: u64| {
        answers
            .iter()
            .find(|a| a["id"] == json!(id))
            .unwrap_or_else(|| panic!("no answer to {id}: {}", reply.body))
    };
    assert_eq!(by_id(5)["result"]["structuredContent"]["x"], json!(5));
    assert_eq!(by_id(1)["result"]["structuredContent"], json!({"x": 1}));
    assert_eq!(by_id(4)["result"]["structuredContent"], json!({"x": 4}));
    assert!(by_id(2)["result"]["tools"].is_array(), "{}", reply.body);
    assert_eq!(by_id(3)["error"]["code"], json!(-32601), "{}", reply.body);
    // A head the direct path does not take (here a weighted `Accept`, which rmcp
    // judges) gets the answers to the batch's requests in one JSON array.
    let weighted: &[(&str, &[u8])] = &[
        ("mcp-protocol-version", b""),
        ("accept", b"application/json, text/event-stream;q=0.9"),
    ];
    let pings = json!([
        {"jsonrpc": "2.0", "id": 21, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 97}},
        {"jsonrpc": "2.0", "id": 22, "method": "ping"},
    ]);
    let reply = send_with(
        &router,
        Method::POST,
        Some(&sid),
        pings.to_string(),
        weighted,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.content_type.starts_with("application/json"),
        "{}",
        reply.content_type
    );
    let mut ids: Vec<Value> = serde_json::from_str::<Vec<Value>>(&reply.body)
        .unwrap()
        .into_iter()
        .map(|a| a["id"].clone())
        .collect();
    ids.sort_by_key(Value::to_string);
    assert_eq!(ids, [json!(21), json!(22)], "{}", reply.body);
    // An element that is itself a batch is refused, not run (a batch of batches would
    // get past the 100-message limit); a client that sends the negotiated version's
    // header is answered the same way.
    let nested = json!([[call(6, json!({})), call(7, json!({}))], call(8, json!({}))]);
    let with_header: &[(&str, &[u8])] = &[("mcp-protocol-version", b"2025-03-26")];
    let reply = send_with(
        &router,
        Method::POST,
        Some(&sid),
        nested.to_string(),
        with_header,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let messages = sse_messages(&reply.body);
    assert_eq!(messages.len(), 2, "{}", reply.body);
    assert!(
        messages
            .iter()
            .any(|m| m["id"] == json!(8) && m["result"]["structuredContent"] == json!({"x": 8})),
        "{}",
        reply.body
    );
    assert!(
        messages.iter().any(|m| m["id"].is_null()
            && m["error"]["code"] == json!(-32600)
            && m["error"]["message"].as_str().unwrap().contains(
                "the batch element must be one JSON-RPC 2.0 message object, and it is a batch"
            )),
        "{}",
        reply.body
    );
    // Refused before they run, inside the batch's answer as on stdio: the requests that
    // share an id (as rmcp reads it: 30.0 is 30), an `initialize` (which must not be part
    // of a batch), an element that is no object (told as a batch element, not as the
    // body). The request with an id of its own runs.
    let mixed = json!([
        {"jsonrpc": "2.0", "id": 33, "method": "ping"},
        {"jsonrpc": "2.0", "id": 30, "method": "ping"},
        {"jsonrpc": "2.0", "id": 30.0, "method": "ping"},
        {"jsonrpc": "2.0", "id": 31, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}},
        1,
        {"jsonrpc": "2.0", "id": 32, "method": 123},
        {"jsonrpc": "2.0", "id": 32, "method": "ping"},
    ]);
    let reply = send_with(
        &router,
        Method::POST,
        Some(&sid),
        mixed.to_string(),
        weighted,
    )
    .await;
    // A malformed request still holds its id: the ping sharing it is refused, not run.
    let thirty_two: Vec<Value> = serde_json::from_str::<Vec<Value>>(&reply.body)
        .unwrap_or_else(|_| panic!("{}", reply.body))
        .into_iter()
        .filter(|a| a["id"] == 32)
        .collect();
    assert_eq!(thirty_two.len(), 2, "{}", reply.body);
    assert!(
        thirty_two.iter().all(|a| a["error"]["message"]
            == "Invalid Request: 2 requests of this batch carry the id 32, and none of them was run; give each request its own id"),
        "{}",
        reply.body
    );
    let mut answers: Vec<(String, Value)> = serde_json::from_str::<Vec<Value>>(&reply.body)
        .unwrap_or_else(|_| panic!("{}", reply.body))
        .into_iter()
        .filter(|a| a["id"] != 32)
        .map(|a| {
            let what = a["error"]["message"]
                .as_str()
                .map_or_else(|| a["result"].to_string(), str::to_owned);
            (a["id"].to_string(), json!(what))
        })
        .collect();
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        answers,
        [
            // Neither of the two requests with the id 30 runs: an answer to one could not
            // be told from the other's (the batch's answer would hold a result and an error
            // under the one id).
            (
                "30".to_owned(),
                json!(
                    "Invalid Request: 2 requests of this batch carry the id 30, and none of them was run; give each request its own id"
                )
            ),
            (
                "30.0".to_owned(),
                json!(
                    "Invalid Request: 2 requests of this batch carry the id 30, and none of them was run; give each request its own id"
                )
            ),
            (
                "31".to_owned(),
                json!(
                    "Invalid Request: an `initialize` must not be part of a batch; send it alone, as the session's first message"
                )
            ),
            ("33".to_owned(), json!("{}")),
            (
                "null".to_owned(),
                json!(
                    "Invalid Request: the batch element must be one JSON-RPC 2.0 message object, and it is not a JSON object"
                )
            ),
        ],
        "{}",
        reply.body
    );
    // Notifications only: accepted, nothing to answer.
    let quiet = json!([{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 98}}]);
    let reply = send_with(&router, Method::POST, Some(&sid), quiet.to_string(), old).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    // An array that is not JSON is a parse error (not a batch inside a batch).
    for text in ["[", r#"[{"jsonrpc": "2.0", "id": 2, "method": "ping"},]"#] {
        let reply = send_with(&router, Method::POST, Some(&sid), text.into(), old).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{text}");
        let v: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(v["error"]["code"], json!(-32700), "{text}: {v}");
        assert!(
            reply
                .body
                .contains("Parse error: the body is not valid JSON ("),
            "{text}: {}",
            reply.body
        );
    }
    let reply = send_with(&router, Method::POST, Some(&sid), "[]".into(), old).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(v["error"]["code"], json!(-32600), "{v}");
    assert!(reply.body.contains("an empty batch"), "{}", reply.body);
    let long = Value::Array((0..101).map(|i| call(i, json!({}))).collect());
    let reply = send_with(&router, Method::POST, Some(&sid), long.to_string(), old).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply
            .body
            .contains("a batch of 101 messages; this server takes at most 100"),
        "{}",
        reply.body
    );
    // Once the session has ended, a batch gets its 404, also one whose every element is
    // refused before it runs (not 200 with the refusals).
    let ended = send_with(&router, Method::DELETE, Some(&sid), String::new(), old).await;
    assert_eq!(ended.status, StatusCode::OK, "{}", ended.body);
    for batch in [
        json!([5, "x"]),
        json!([{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}]),
        json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]),
    ] {
        let reply = send_with(&router, Method::POST, Some(&sid), batch.to_string(), old).await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{batch}: {}",
            reply.body
        );
    }
    // A 2025-11-25 session's batch is refused (that version has no batches).
    let sid = open(&server, &router, json!({})).await;
    let reply = send(
        &router,
        Method::POST,
        Some(&sid),
        json!([call(5, json!({}))]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert!(reply.body.contains("a batch"), "{}", reply.body);
}

/// A batch's request cancelled while it runs gets no answer (MCP: none for a cancelled
/// request), not an error made up for it; the batch's other requests are answered.
#[tokio::test]
async fn a_cancelled_request_of_a_batch_is_not_answered() {
    let started = Arc::new(tokio::sync::Notify::new());
    let server = server_with(Some(Hold::new(&started)));
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let old: &[(&str, &[u8])] = &[("mcp-protocol-version", b"")];
    let sid = open_2025_03_26(&router).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    send_with(&router, Method::POST, Some(&sid), list.to_string(), old).await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": "h1", "method": "tools/call",
         "params": {"name": "hold", "arguments": {}}},
        call(2, json!({})),
    ]);
    let reply = tokio::spawn({
        let (router, sid) = (router.clone(), sid.clone());
        async move { send_with(&router, Method::POST, Some(&sid), batch.to_string(), old).await }
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
        .await
        .expect("the held call starts");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "h1", "reason": "test"}});
    send_with(&router, Method::POST, Some(&sid), cancel.to_string(), old).await;
    let reply = tokio::time::timeout(std::time::Duration::from_secs(10), reply)
        .await
        .expect("the batch ends")
        .unwrap();
    let answers: Vec<Value> = sse_messages(&reply.body)
        .into_iter()
        .filter(|m| m.get("id").is_some())
        .collect();
    assert_eq!(answers.len(), 1, "{}", reply.body);
    assert_eq!(
        answers[0]["result"]["structuredContent"],
        json!({"x": 2}),
        "{}",
        reply.body
    );
}
