//! Which requests the direct path answers and which it leaves to rmcp, and what its own
//! answers carry (the call's log messages, the session-era result shape, a mode's refusal).

use super::*;

#[tokio::test]
async fn a_plain_session_call_is_answered_directly_and_the_rest_by_rmcp() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let r = send(&router, Method::POST, None, init).await;
    let sid = r.session.expect("a session id");
    assert_eq!(
        server.shared.direct.len(),
        0,
        "not registered before initialized"
    );
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let r = send(&router, Method::POST, Some(&sid), initialized).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    // The notification is handled after its 202; a request's answer comes after its
    // handler ran, so after tools/list (rmcp's SSE stream) the session is registered.
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    let r = send(&router, Method::POST, Some(&sid), list.clone()).await;
    assert_eq!(r.content_type, "text/event-stream", "{}", r.body);
    assert_eq!(server.shared.direct.len(), 1, "registered");

    // A plain call: one JSON response carrying the result.
    let r = send(&router, Method::POST, Some(&sid), call(1, json!({}))).await;
    assert_eq!(
        (r.status, r.content_type.as_str()),
        (StatusCode::OK, "application/json")
    );
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["id"], json!(1), "{v}");
    assert_eq!(v["result"]["structuredContent"], json!({"x": 1}), "{v}");
    assert_ne!(v["result"]["isError"], json!(true), "{v}");
    assert!(
        v["result"].get("resultType").is_none(),
        "pre-2026 shape: {v}"
    );

    // A call asking for progress, and tools/list: rmcp's SSE streams.
    let r = send(
        &router,
        Method::POST,
        Some(&sid),
        call(2, json!({"progressToken": "p"})),
    )
    .await;
    assert_eq!(r.content_type, "text/event-stream", "{}", r.body);
    assert!(
        r.body.contains(r#""structuredContent":{"x":2}"#),
        "{}",
        r.body
    );
    let r = send(&router, Method::POST, Some(&sid), list).await;
    assert_eq!(r.content_type, "text/event-stream", "{}", r.body);

    // An unknown session, and the session once deleted: rmcp's 404.
    let r = send(
        &router,
        Method::POST,
        Some("no-such-session"),
        call(4, json!({})),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = send(&router, Method::DELETE, Some(&sid), Value::Null).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = send(&router, Method::POST, Some(&sid), call(5, json!({}))).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
}

#[tokio::test]
async fn a_client_that_takes_server_to_client_traffic_stays_on_rmcp() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    // Declared sampling: its calls may carry relayed requests on their own stream.
    let sid = open(&server, &router, json!({"sampling": {}})).await;
    let r = send(&router, Method::POST, Some(&sid), call(1, json!({}))).await;
    assert_eq!(r.content_type, "text/event-stream", "{}", r.body);
    assert!(
        r.body.contains(r#""structuredContent":{"x":1}"#),
        "{}",
        r.body
    );
    // Declared nothing: direct, also once it sets a log level, which the direct path
    // applies to the call's log messages on its own response: a message under the level
    // is not sent.
    let sid = open(&server, &router, json!({})).await;
    let r = send(&router, Method::POST, Some(&sid), call(2, json!({}))).await;
    assert_eq!(r.content_type, "application/json", "{}", r.body);
    let say = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"say": ["told"]}}})
    };
    for (level, told) in [("warning", false), ("debug", true)] {
        let set = json!({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel",
            "params": {"level": level}});
        send(&router, Method::POST, Some(&sid), set).await;
        let r = send(&router, Method::POST, Some(&sid), say(4)).await;
        let messages = match r.content_type.as_str() {
            "application/json" => vec![serde_json::from_str::<Value>(&r.body).unwrap()],
            _ => sse_messages(&r.body),
        };
        // No priming event (rmcp's path sends one): the direct path answered.
        assert!(!r.body.contains("data: \n"), "{level}: {}", r.body);
        let logs = messages
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .count();
        assert_eq!(logs, usize::from(told), "{level}: {}", r.body);
        assert_eq!(
            messages.last().unwrap()["id"],
            json!(4),
            "{level}: {}",
            r.body
        );
    }
}

/// Says it sends its client nothing, and asks it for its roots all the same.
struct Quiet(ToolSpec);

#[async_trait]
impl Tool for Quiet {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn reaches_client(&self) -> bool {
        false
    }
    async fn call(&self, _input: Value, ctx: &CallContext) -> ToolResult {
        let asked = ctx.list_roots().await;
        Ok(Envelope::ok(json!({"refused": asked.is_err()})))
    }
}

/// A client that declared sampling and roots, and set a log level, gets one JSON answer
/// from a tool that sends its client nothing (what the tool asks anyway is refused, as
/// undeclared: it has no stream to go on), and rmcp's stream from any other tool.
#[tokio::test]
async fn a_tool_that_sends_its_client_nothing_is_answered_directly_for_any_client() {
    let server = server();
    server
        .shared
        .surface
        .catalog()
        .register(Arc::new(Quiet(
            ToolSpec::new("quiet", "Asks for roots.")
                .read_only()
                .with_schema(json!({"type": "object"})),
        )))
        .unwrap();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({"sampling": {}, "roots": {}})).await;
    let quiet = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "quiet", "arguments": {}}})
    };
    let r = send(&router, Method::POST, Some(&sid), quiet(1)).await;
    assert_eq!(r.content_type, "application/json", "{}", r.body);
    assert!(r.body.contains(r#""refused":true"#), "{}", r.body);
    let r = send(&router, Method::POST, Some(&sid), call(2, json!({}))).await;
    assert_eq!(r.content_type, "text/event-stream", "{}", r.body);
    let level = json!({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel",
        "params": {"level": "info"}});
    send(&router, Method::POST, Some(&sid), level).await;
    let r = send(&router, Method::POST, Some(&sid), quiet(4)).await;
    assert_eq!(r.content_type, "application/json", "{}", r.body);
    assert!(r.body.contains(r#""id":4"#), "{}", r.body);
}

/// A 2026-07-28 request is stateless: an `Mcp-Session-Id` it carries (another client's)
/// neither takes over that session's direct-path entry nor ends its working set when
/// the request's handler goes away.
#[tokio::test]
async fn a_stateless_request_naming_a_session_does_not_touch_it() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    let before = server.shared.direct.get(&sid).expect("registered");
    let key: Arc<str> = Arc::from(format!("mcp:{sid}"));
    let stateless = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
    "name": "tool_search", "arguments": {"query": "echo"},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}
    }}});
    let req = Request::builder()
        .method(Method::POST)
        .uri("/mcp")
        .header("host", "127.0.0.1:7345")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "tool_search")
        .header("mcp-session-id", &sid)
        .body(Body::from(stateless.to_string()))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains(r#""id":9"#), "answered: {body}");
    // The stateless request's handler is gone by now (its response was read).
    tokio::task::yield_now().await;
    let after = server.shared.direct.get(&sid).expect("still registered");
    assert!(
        Arc::ptr_eq(&before, &after),
        "the session's entry is its own"
    );
    assert!(
        server.shared.surface.working_set(&key).is_empty(),
        "the stateless search did not page tools into the session's working set"
    );
    let r = send(&router, Method::POST, Some(&sid), call(10, json!({}))).await;
    assert_eq!(r.content_type, "application/json", "{}", r.body);
}

/// `logging/setLevel` is gone in 2026-07-28: a valid one is method-not-found like an
/// invalid one (not a success that does nothing).
#[tokio::test]
async fn set_level_is_not_part_of_2026_07_28() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    for level in ["debug", "verbose"] {
        let body = json!({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel",
        "params": {"level": level, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}
        }}});
        let req = Request::builder()
            .method(Method::POST)
            .uri("/mcp")
            .header("host", "127.0.0.1:7345")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "logging/setLevel")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("-32601"), "{level}: {text}");
        assert!(
            text.contains("is not part of protocol 2026-07-28"),
            "{level}: {text}"
        );
    }
}

/// A call's log messages go on its own response, before its answer, as on rmcp's
/// per-call stream (not on the session's GET stream, which the transport keeps for
/// messages unrelated to a request): an SSE stream from the first message on, whether
/// they come just before the answer or while the call runs. A call that logs nothing
/// is still one JSON body.
#[tokio::test]
async fn a_direct_calls_log_messages_come_on_its_own_stream() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    let plain = send(&router, Method::POST, Some(&sid), call(1, json!({}))).await;
    assert_eq!(plain.content_type, "application/json", "{}", plain.body);
    // Two messages at once, two while the call runs, and a burst of 200 (more than the
    // response's channel holds: none is lost for a client that reads).
    for (n, pause, gap) in [(2, 0, 0), (2, 20, 0), (200, 0, 20)] {
        let said: Vec<Value> = (0..n).map(|i| json!(format!("line {i}"))).collect();
        let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"say": said, "pause": pause, "gap": gap}}});
        let reply = send(&router, Method::POST, Some(&sid), body).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.content_type, "text/event-stream", "{}", reply.body);
        let messages = sse_messages(&reply.body);
        let logs: Vec<&Value> = messages
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .map(|m| &m["params"]["data"])
            .collect();
        assert_eq!(
            logs,
            said.iter().collect::<Vec<_>>(),
            "{pause}: {}",
            reply.body
        );
        assert_eq!(messages.len(), n + 1, "{pause}: {}", reply.body);
        assert_eq!(messages[n]["id"], json!(2), "{pause}: {}", reply.body);
        assert_eq!(
            messages[n]["result"]["isError"],
            json!(false),
            "{pause}: {}",
            reply.body
        );
    }
    // A client that starts reading only after the call has sent 300 messages gets them
    // all (they wait for it; past a bound they would be dropped, never the answer).
    let said: Vec<Value> = (0..300).map(|i| json!(i)).collect();
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"say": said, "gap": 20}}});
    let req = request(Method::POST, Some(&sid), body.to_string(), &[]);
    let resp = router.clone().oneshot(req).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let messages = sse_messages(&String::from_utf8_lossy(&bytes));
    assert_eq!(messages.len(), 301, "{messages:?}");
    assert_eq!(messages[299]["params"]["data"], json!(299));
    assert_eq!(messages[300]["id"], json!(3));
}

/// A call the session's mode does not allow (plan mode, a mutating tool) is refused,
/// and recorded like every call.
#[tokio::test]
async fn a_call_refused_by_the_mode_is_recorded() {
    let catalog = Arc::new(Catalog::new());
    catalog
        .register(Arc::new(Echo(
            ToolSpec::new("write_note", "Writes a note.").with_schema(json!({"type": "object"})),
        )))
        .unwrap();
    catalog
        .register(Arc::new(Echo(
            ToolSpec::new("read_note", "Reads a note.")
                .with_schema(json!({"type": "object"}))
                .with_annotations(quiver_contract::Annotations::read_only()),
        )))
        .unwrap();
    // Outside plan mode a mode's list (agentic_only here) keeps it off: said so.
    let chat = McpServer::new(
        Surface::new(
            catalog.clone(),
            quiver_surface::SurfaceConfig::default().with_agentic_only(&["write_note"]),
            Arc::new(quiver_surface::MemoryUsage::new([])),
        )
        .unwrap(),
        Dispatcher::builder(catalog.clone()).build(),
        ServerOptions::default(),
    );
    let chat_router = chat.router("127.0.0.1:7345".parse().unwrap());
    let chat_sid = open(&chat, &chat_router, json!({})).await;
    let call = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
        "params": {"name": "write_note", "arguments": {}}});
    let reply = send(&chat_router, Method::POST, Some(&chat_sid), call).await;
    assert!(
        reply.body.contains(
            "is not available in chat mode. This mode's lists leave it out; use another tool of your tool list, or tell the user it needs another mode."
        ),
        "{}",
        reply.body
    );
    let (server, recorder) = crate::server::test_server_recorded(
        catalog,
        ServerOptions::default().with_default_mode(Mode::Plan),
    );
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "write_note", "arguments": {"text": "hi"}}});
    let reply = send(&router, Method::POST, Some(&sid), call).await;
    assert!(
        reply
            .body
            .contains("is not available in plan mode. Plan mode offers read-only tools only")
            && !reply.body.contains("Call tool_search"),
        "{}",
        reply.body
    );
    // A misspelt name is not steered to the tool the mode refuses, but to one it lists.
    let typo = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": {"name": "write_notes", "arguments": {}}});
    let reply = send(&router, Method::POST, Some(&sid), typo).await;
    assert!(
        reply.body.contains("there is no tool named `write_notes`")
            && !reply.body.contains("`write_note`"),
        "{}",
        reply.body
    );
    let typo = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "read_notes", "arguments": {}}});
    let reply = send(&router, Method::POST, Some(&sid), typo).await;
    assert!(
        reply.body.contains("Did you mean `read_note`?"),
        "{}",
        reply.body
    );
    server.shared.dispatcher.drain_records().await;
    let rows = recorder.records();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[0].tool_name, "write_note");
    assert_eq!(rows[0].envelope.err_kind(), Some(&ErrKind::Forbidden));
    assert_eq!(rows[0].input, json!({"text": "hi"}));
    // (a mode's refusal: the tool exists, the session's mode does not list it)
    assert_eq!(rows[1].tool_name, "write_notes");
    assert_eq!(rows[1].envelope.err_kind(), Some(&ErrKind::UndefinedTool));
}

fn call_body(extra_params: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"t","arguments":{{"a":1}}{extra_params}}}}}"#
    ))
}

#[test]
fn a_plain_call_is_taken_and_anything_else_is_left_to_rmcp() {
    assert!(matches!(classify(&call_body("")), Message::Call { .. }));
    assert!(matches!(
        classify(&call_body(r#","_meta":{"quiver/conversation":"c"}"#)),
        Message::Call { .. }
    ));
    for other in [
        r#","_meta":{"progressToken":1}"#,
        r#","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#,
        r#","task":{}"#,
    ] {
        assert!(
            matches!(classify(&call_body(other)), Message::Other),
            "{other}"
        );
    }
    let list = Bytes::from(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert!(matches!(classify(&list), Message::Other));
    let bad =
        Bytes::from(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":5}}"#);
    assert!(matches!(classify(&bad), Message::BadCursor { .. }));
    let not_2_0 = Bytes::from(r#"{"id":1,"method":"tools/list","params":{"cursor":5}}"#);
    assert!(matches!(classify(&not_2_0), Message::Other));
    let batch = Bytes::from(r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call"}]"#);
    assert!(matches!(classify(&batch), Message::Other));
    let cancel = Bytes::from(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"x"}}"#,
    );
    assert!(matches!(classify(&cancel), Message::Cancelled(_)));
}

#[test]
fn weighted_or_partial_accept_headers_are_left_to_rmcp() {
    let with = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, v.parse().unwrap());
        accepts_both(&h)
    };
    assert!(with("application/json, text/event-stream"));
    assert!(!with("application/json"));
    assert!(!with("application/json, text/event-stream;q=0"));
}

/// A list result reaches a 2025-era client once, in the rendered text: no
/// `structuredContent` (that era takes objects only) and no compact JSON copy of it, on the
/// direct path and on rmcp's (a client that declared sampling).
#[tokio::test]
async fn a_list_reaches_a_2025_client_once() {
    let server = server();
    server
        .shared
        .surface
        .catalog()
        .register(Arc::new(quiver_contract::typed_tool(
            ToolSpec::new("letters", "Lists three letters.")
                .read_only()
                .with_schema(json!({"type": "object"})),
            |_: Value, _ctx: CallContext| async move { Ok(Envelope::ok(json!(["a", "b", "c"]))) },
        )))
        .unwrap();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    for capabilities in [json!({}), json!({"sampling": {}})] {
        let sid = open(&server, &router, capabilities.clone()).await;
        let ask = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "letters", "arguments": {}}});
        let r = send(&router, Method::POST, Some(&sid), ask).await;
        let answer = if r.content_type == "text/event-stream" {
            r.body
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| d.starts_with('{'))
                .map(|d| serde_json::from_str::<Value>(d).unwrap())
                .next_back()
                .unwrap()
        } else {
            serde_json::from_str(&r.body).unwrap()
        };
        let result = &answer["result"];
        assert!(
            result.get("structuredContent").is_none(),
            "{capabilities}: {answer}"
        );
        let blocks = result["content"].as_array().unwrap();
        assert_eq!(blocks.len(), 1, "{capabilities}: {answer}");
        assert!(
            blocks[0]["text"]
                .as_str()
                .unwrap()
                .starts_with("✓ ok. 3 rows."),
            "{answer}"
        );
    }
}
