//! What the HTTP transport refuses before any handler runs: a body over its limit or not
//! one JSON-RPC message, a bad key or cursor, a call rmcp refuses for its headers; each
//! told in JSON-RPC, and each `tools/call` so refused with its row.

use super::*;
use crate::server::direct::body::collect_body;

/// A body over the limit is answered 413 with a JSON-RPC error that says what to do
/// (not a bare "Payload Too Large").
#[tokio::test]
async fn a_body_over_the_limit_is_told_what_to_do() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"x":"{}"}}}}"#,
        "a".repeat(5 << 20)
    );
    let reply = send_text(&router, Method::POST, None, body).await;
    assert_eq!(
        reply.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        reply.body
    );
    let v: Value = serde_json::from_str(&reply.body).expect("a JSON-RPC error");
    assert_eq!(v["error"]["code"], json!(-32600), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the body is over 4194304 bytes"),
        "{v}"
    );
}

/// A body in several chunks is joined; past the limit, exactly its first `limit` bytes
/// come back, whichever chunk the limit falls in; one chunk is returned as it came.
#[tokio::test]
async fn a_body_is_read_whole_or_to_its_limit() {
    let chunks = || {
        Body::from_stream(futures::stream::iter(
            ["ab", "", "cde", "f"].map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
        ))
    };
    assert_eq!(
        collect_body(chunks(), 6).await.unwrap(),
        Ok(Bytes::from("abcdef"))
    );
    for (limit, head) in [(0, ""), (1, "a"), (2, "ab"), (4, "abcd"), (5, "abcde")] {
        assert_eq!(
            collect_body(chunks(), limit).await.unwrap(),
            Err(Bytes::from(head)),
            "{limit}"
        );
    }
    let one = Bytes::from_static(b"{}");
    let got = collect_body(Body::from(one.clone()), 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.as_ptr(), one.as_ptr(), "not copied");
}

/// A 2026-07-28 retry whose requestState names no held call (forged) runs nothing and
/// has its row, as has a call rmcp refuses for a `_meta` missing the protocol's fields
/// (every call has its row); a plain stateless call has one row.
#[tokio::test]
async fn a_forged_request_state_and_a_short_meta_have_their_rows() {
    let catalog = echo_catalog();
    let (server, recorder) = crate::server::test_server_recorded(catalog, ServerOptions::default());
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}});
    let headers: &[(&str, &[u8])] = &[
        ("mcp-protocol-version", b"2026-07-28"),
        ("mcp-method", b"tools/call"),
        ("mcp-name", b"echo"),
    ];
    let forged = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"x": 1}, "requestState": "forged",
        "inputResponses": {}, "_meta": meta}});
    let r = send_with(&router, Method::POST, None, forged.to_string(), headers).await;
    assert!(
        r.body.contains("requestState does not name a call waiting"),
        "{}",
        r.body
    );
    let plain = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"x": 2}, "_meta": meta}});
    let r = send_with(&router, Method::POST, None, plain.to_string(), headers).await;
    assert!(r.body.contains("result"), "{}", r.body);
    // rmcp refuses a `_meta` without the protocol's fields before any handler.
    let no_caps = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"x": 3},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}}});
    let r = send_with(&router, Method::POST, None, no_caps.to_string(), headers).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body.contains("clientCapabilities"), "{}", r.body);
    server.shared.dispatcher.drain_records().await;
    let rows: Vec<_> = recorder
        .records()
        .into_iter()
        .map(|r| {
            (
                r.tool_name,
                r.envelope.err_kind().map(|k| k.as_str().to_owned()),
                r.input,
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                "echo".to_owned(),
                Some("invalid_params".to_owned()),
                json!({"x": 1})
            ),
            ("echo".to_owned(), None, json!({"x": 2})),
            (
                "echo".to_owned(),
                Some("invalid_params".to_owned()),
                json!({"x": 3})
            ),
        ]
    );
}

/// A 2026-07-28 call of a tool the token may not use is answered as a call of a tool
/// that does not exist, whatever its `Mcp-Param-*` headers: rmcp's header check (against
/// the definition, before the handler) would answer -32020 naming the missing header,
/// telling the token the tool exists and what its parameters are. For a token that may
/// use it, the check still holds.
#[tokio::test]
async fn a_hidden_tools_headers_are_not_checked_for_a_token_that_cannot_use_it() {
    use crate::server::{InboundAuth, InboundToken};
    let catalog = Arc::new(Catalog::new());
    catalog
        .register(Arc::new(Echo(
            ToolSpec::new("geo_secret", "Looks a region up.")
                .read_only()
                .with_schema(json!({"type": "object", "properties": {"region": {
                    "type": "string", "x-mcp-header": "Region"}}})),
        )))
        .unwrap();
    let (server, recorder) = crate::server::test_server_recorded(
        catalog,
        ServerOptions::default().with_auth(InboundAuth::new(vec![
            InboundToken::new("narrow", "secret-narrow")
                .with_allowed_tools(vec!["tool_search".into(), "describe_tool".into()]),
            InboundToken::new("wide", "secret-wide"),
        ])),
    );
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let ask = |token: &'static str, name: &'static str| {
        let router = router.clone();
        async move {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": name, "arguments": {"region": "eu"},
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {}}}});
            let auth = format!("Bearer {token}");
            let headers: &[(&str, &[u8])] = &[
                ("authorization", auth.as_bytes()),
                ("mcp-protocol-version", b"2026-07-28"),
                ("mcp-method", b"tools/call"),
                ("mcp-name", name.as_bytes()),
            ];
            let r = send_with(&router, Method::POST, None, body.to_string(), headers).await;
            (r.status, r.body.replace(name, "NAME"))
        }
    };
    let hidden = ask("secret-narrow", "geo_secret").await;
    let absent = ask("secret-narrow", "geo_secrex").await;
    assert_eq!(hidden, absent);
    assert_eq!(hidden.0, StatusCode::OK, "{}", hidden.1);
    assert!(hidden.1.contains("there is no tool named"), "{}", hidden.1);
    // The token that may use it must send the header.
    let (status, body) = ask("secret-wide", "geo_secret").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("Mcp-Param-Region"), "{body}");
    // Every call has its row: the two unknown-tool answers, and the header refusal
    // rmcp gave before any handler ran.
    server.shared.dispatcher.drain_records().await;
    let rows = recorder.records();
    assert_eq!(rows.len(), 3, "{rows:?}");
    let refused = rows
        .iter()
        .find(|r| r.principal.as_deref() == Some("wide"))
        .expect("the wide token's call");
    assert_eq!(refused.tool_name, "geo_secret");
    assert_eq!(
        refused.envelope.err_kind(),
        Some(&ErrKind::Other("invalid_params".into()))
    );
    assert_eq!(refused.input, json!({"region": "eu"}));
    // So do a call whose `Mcp-Method` names another method or is missing, and one on a
    // protocol version the server does not speak.
    for (method, version, code) in [
        (&b"tools/list"[..], &b"2026-07-28"[..], -32020),
        (b"", b"2026-07-28", -32020),
        (b"tools/call", b"2099-01-01", -32022),
    ] {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "geo_secret", "arguments": {"region": "eu"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": String::from_utf8_lossy(version),
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}}});
        let mut headers: Vec<(&str, &[u8])> = vec![
            ("authorization", b"Bearer secret-wide"),
            ("mcp-protocol-version", version),
            ("mcp-name", b"geo_secret"),
            ("mcp-param-region", b"eu"),
        ];
        if !method.is_empty() {
            headers.push(("mcp-method", method));
        }
        let r = send_with(&router, Method::POST, None, body.to_string(), &headers).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        let answer: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(answer["error"]["code"], json!(code), "{}", r.body);
    }
    server.shared.dispatcher.drain_records().await;
    let rows = recorder.records();
    assert_eq!(rows.len(), 6, "{rows:?}");
    for row in &rows[3..] {
        assert_eq!(row.tool_name, "geo_secret");
        assert_eq!(
            row.envelope.err_kind(),
            Some(&ErrKind::Other("invalid_params".into()))
        );
    }
}

/// A `tools/call` the HTTP transport refuses before any handler sees it has its row in
/// the execution log, as one the handler refuses does: a body nested too
/// deeply (its deep part cut), text that is not JSON, a message that is not JSON-RPC, a
/// body over 4 MiB (under the tool name its start gives), an id in flight, and a batch's requests that share an id or are
/// nested too deeply.
#[tokio::test]
async fn a_tools_call_the_transport_refuses_has_its_row() {
    let started = Arc::new(tokio::sync::Notify::new());
    let catalog = Arc::new(Catalog::new());
    catalog.register(Arc::new(Hold::new(&started))).unwrap();
    catalog
        .register(Arc::new(Echo(
            ToolSpec::new("echo", "Echoes its arguments.")
                .read_only()
                .with_schema(json!({"type": "object"})),
        )))
        .unwrap();
    let (server, recorder) = crate::server::test_server_recorded(catalog, ServerOptions::default());
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let cases = [
        (
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"x":{deep}}}}}}}"#),
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{}}"#.to_owned(),
            -32700,
        ),
        (
            r#"{"jsonrpc":"1.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"y":3}}}"#.to_owned(),
            -32600,
        ),
    ];
    for (body, code) in &cases {
        let reply = send_text(&router, Method::POST, Some(&sid), body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        let answer: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(answer["error"]["code"], json!(code), "{}", reply.body);
    }
    // A body past what the server reads (4 MiB): 413, and still a row.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"echo","arguments":{{"x":"{}"}}}}}}"#,
        "a".repeat(5 << 20)
    );
    let reply = send_text(&router, Method::POST, Some(&sid), big).await;
    assert_eq!(
        reply.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        reply.body
    );
    assert!(reply.body.contains(r#""id":5"#), "{}", reply.body);
    // An id in flight: a held call under id 4, then another call with that id.
    let held = tokio::spawn({
        let (router, sid) = (router.clone(), sid.clone());
        async move {
            let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                "params": {"name": "hold", "arguments": {}}});
            send(&router, Method::POST, Some(&sid), call).await
        }
    });
    started.notified().await;
    let again = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"z": 4}}});
    let reply = send(&router, Method::POST, Some(&sid), again).await;
    assert!(reply.body.contains("already used"), "{}", reply.body);
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 4}});
    send(&router, Method::POST, Some(&sid), cancel).await;
    held.await.unwrap();
    server.shared.dispatcher.drain_records().await;
    let rows = recorder.records();
    // The arguments as logged; those kept to 100 levels and cut below as "cut".
    let logged = |input: &Value| match crate::lines::holds_cut(input) {
        true => json!("cut"),
        false => input.clone(),
    };
    let refused: Vec<_> = rows
        .iter()
        .filter(|r| r.tool_name != "hold")
        .map(|r| {
            (
                r.tool_name.as_str(),
                r.envelope.err_kind().map(|k| k.as_str().to_owned()),
                logged(&r.input),
                r.session.as_deref().map(str::to_owned),
            )
        })
        .collect();
    let kind = |k: &str| Some(k.to_owned());
    let session = Some(format!("mcp:{sid}"));
    assert_eq!(
        refused,
        vec![
            ("echo", kind("too_deep"), json!("cut"), session.clone()),
            ("echo", kind("parse_error"), Value::Null, session.clone()),
            (
                "echo",
                kind("invalid_request"),
                json!({"y": 3}),
                session.clone()
            ),
            (
                "echo",
                kind("input_too_large"),
                Value::Null,
                session.clone()
            ),
            (
                "echo",
                kind("invalid_request"),
                json!({"z": 4}),
                session.clone()
            ),
        ],
        "{rows:?}"
    );
    // A 2025-03-26 session's batch: two calls that share an id, and one nested too
    // deeply in a batch of its own.
    let old: &[(&str, &[u8])] = &[("mcp-protocol-version", b"")];
    let old_sid = open_2025_03_26(&router).await;
    let shared = json!([
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"a": 1}}},
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"b": 2}}},
    ]);
    let reply = send_with(
        &router,
        Method::POST,
        Some(&old_sid),
        shared.to_string(),
        old,
    )
    .await;
    assert!(reply.body.contains("carry the id 9"), "{}", reply.body);
    let deep_batch = format!(
        r#"[{{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{{"name":"echo","arguments":{{"c":{deep}}}}}}}]"#
    );
    let reply = send_with(&router, Method::POST, Some(&old_sid), deep_batch, old).await;
    assert!(reply.body.contains("levels deep"), "{}", reply.body);
    server.shared.dispatcher.drain_records().await;
    let rows = recorder.records();
    let mut batch: Vec<_> = rows
        .iter()
        .filter(|r| r.session.as_deref() == Some(&format!("mcp:{old_sid}")))
        .map(|r| {
            (
                r.envelope.err_kind().map(|k| k.as_str().to_owned()),
                logged(&r.input),
            )
        })
        .collect();
    batch.sort_by_key(|(_, input)| input.to_string());
    assert_eq!(
        batch,
        vec![
            (kind("too_deep"), json!("cut")),
            (kind("invalid_request"), json!({"a": 1})),
            (kind("invalid_request"), json!({"b": 2})),
        ],
        "{rows:?}"
    );
}

/// A JSON body that is not one JSON-RPC message is told what is wrong with it, with its
/// id when that can be read (not one message, such as "batches are not supported", for
/// every such body).
#[tokio::test]
async fn an_invalid_message_is_told_what_is_wrong() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    for (body, says, id) in [
        (
            r#"{"id":3,"method":"ping"}"#,
            "`jsonrpc` must be \"2.0\"",
            json!(3),
        ),
        (
            r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#,
            "`jsonrpc` must be",
            json!("a"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            "`id` must be a string or an integer",
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":5}"#,
            "`method` must be a string",
            json!(4),
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":"x"}"#,
            "`params` must be an object",
            json!(5),
        ),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            "a batch",
            Value::Null,
        ),
        ("42", "not a JSON object", Value::Null),
    ] {
        let r = send_text(&router, Method::POST, Some(&sid), body.into()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"]["code"], json!(-32600), "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{body}: {v}"
        );
        assert_eq!(v["id"], id, "{body}: {v}");
    }
    // Positional params: valid JSON-RPC, invalid params for MCP.
    let body = r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":["echo",{}]}"#;
    let r = send_text(&router, Method::POST, Some(&sid), body.into()).await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["error"]["code"], json!(-32602), "{v}");
    assert_eq!(v["id"], json!(6), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("an object of named parameters"),
        "{v}"
    );
}

/// A `Quiver-Conversation` header that is not UTF-8 is invalid params (taken for no
/// header, the request would run in the shared anonymous working set); a UTF-8 one that
/// is not ASCII is a key like any other. A `tools/list` cursor this server never gave
/// (it gives none: the list is one page) is invalid params too.
#[tokio::test]
async fn a_non_utf8_conversation_key_and_a_foreign_cursor_are_invalid_params() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    let list = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}).to_string();
    let r = send_with(
        &router,
        Method::POST,
        Some(&sid),
        list.clone(),
        &[("quiver-conversation", b"caf\xe9-private")],
    )
    .await;
    assert!(r.body.contains(r#""code":-32602"#), "{}", r.body);
    assert!(r.body.contains("is not UTF-8 text"), "{}", r.body);
    let r = send_with(
        &router,
        Method::POST,
        Some(&sid),
        list,
        &[("quiver-conversation", "café-private".as_bytes())],
    )
    .await;
    assert!(r.body.contains(r#""tools""#), "{}", r.body);
    for cursor in ["zzz", "1"] {
        let body = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list",
            "params": {"cursor": cursor}});
        let r = send(&router, Method::POST, Some(&sid), body).await;
        assert!(r.body.contains(r#""code":-32602"#), "{}", r.body);
        assert!(r.body.contains("invalid cursor"), "{}", r.body);
    }
}

/// A body that is not one JSON-RPC message gets a JSON-RPC error with status 400 (rmcp's
/// own answer is 415 and a line of text); ending a session that is gone is a 404.
#[tokio::test]
async fn malformed_bodies_get_json_rpc_errors_and_a_gone_session_404() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    // A known method whose params do not fit is -32602 naming the problem.
    for params in [
        json!({"name": "echo", "arguments": "{\"x\": 1}"}),
        json!({"name": 5}),
        json!({}),
    ] {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params});
        let r = send(&router, Method::POST, Some(&sid), body).await;
        assert!(r.body.contains(r#""code":-32602"#), "{params}: {}", r.body);
        assert!(
            r.body.contains("invalid params for `tools/call`: "),
            "{}",
            r.body
        );
    }
    let level = json!({"jsonrpc": "2.0", "id": 8, "method": "logging/setLevel",
        "params": {"level": "bogus"}});
    let r = send(&router, Method::POST, Some(&sid), level).await;
    assert!(r.body.contains(r#""code":-32602"#), "{}", r.body);
    let unknown = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/frobnicate"});
    let r = send(&router, Method::POST, Some(&sid), unknown).await;
    assert!(r.body.contains(r#""code":-32601"#), "{}", r.body);
    assert!(
        r.body.contains("method not found: `tools/frobnicate`"),
        "{}",
        r.body
    );
    for (session, body, code) in [
        (None, "{not json", -32700),
        (Some(sid.as_str()), "{not json", -32700),
        (
            None,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            -32600,
        ),
        (Some(sid.as_str()), r#"{"hello":1}"#, -32600),
    ] {
        let r = send_text(&router, Method::POST, session, body.into()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert_eq!(r.content_type, "application/json", "{body}");
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"]["code"], json!(code), "{body}: {v}");
        assert_eq!(v["id"], Value::Null, "{v}");
    }
    // Valid JSON nested past the parser's limit is said to be so, with its id, as on
    // stdio (not "not valid JSON" with a null id); in a batch too.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{{"name":"echo","arguments":{{"a":{}1{}}}}}}}"#,
        "[".repeat(150),
        "]".repeat(150)
    );
    for (session, body, id) in [
        (Some(sid.as_str()), deep.clone(), json!(11)),
        (None, deep.clone(), json!(11)),
        // A batch has no one id.
        (Some(sid.as_str()), format!("[{deep}]"), Value::Null),
    ] {
        let r = send_text(&router, Method::POST, session, body).await;
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"]["code"], json!(-32600), "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("the body nests arrays and objects more than 128 levels deep"),
            "{v}"
        );
        assert_eq!(v["id"], id, "{v}");
    }
    // A byte-order mark before the JSON is named (the parser alone says "expected value
    // at line 1 column 1").
    for session in [None, Some(sid.as_str())] {
        let r = send_text(
            &router,
            Method::POST,
            session,
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}".into(),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(
            r.body.contains(r#""code":-32700"#)
                && r.body
                    .contains("the body starts with a UTF-8 byte-order mark"),
            "{}",
            r.body
        );
    }
    // A wrong Content-Type is rmcp's 415, passed on as it is.
    let req = Request::builder()
        .method(Method::POST)
        .uri("/mcp")
        .header("host", "127.0.0.1:7345")
        .header("content-type", "text/plain")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &sid)
        .body(Body::from(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let r = send(&router, Method::DELETE, Some(&sid), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let again = send(&router, Method::DELETE, Some(&sid), json!({})).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.body);
    let never = send(&router, Method::DELETE, Some("nope"), json!({})).await;
    assert_eq!(never.status, StatusCode::NOT_FOUND, "{}", never.body);
}

/// A `tools/call` that never runs for how it was sent has its row (kind `invalid_request`)
/// all the same: sent without an `id` (a notification, which gets no answer), with a
/// `Content-Type` that is not JSON (415), or with an `Accept` that leaves out the event
/// stream (406).
#[tokio::test]
async fn a_tools_call_sent_wrongly_has_its_row() {
    let catalog = echo_catalog();
    let (server, recorder) = crate::server::test_server_recorded(catalog, ServerOptions::default());
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    let notification = json!({"jsonrpc": "2.0", "method": "tools/call",
        "params": {"name": "echo", "arguments": {"n": 1}}});
    let r = send(&router, Method::POST, Some(&sid), notification).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    let call = |n: u64| {
        json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"n": n}}})
        .to_string()
    };
    let mut text = request(Method::POST, Some(&sid), call(2), &[]);
    text.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("text/plain"),
    );
    let r = reply(&router, text).await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", r.body);
    let json_only: &[(&str, &[u8])] = &[("accept", b"application/json")];
    let r = send_with(&router, Method::POST, Some(&sid), call(3), json_only).await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE, "{}", r.body);
    // The notification's row is written by the session's handler, after the 202.
    let mut rows = Vec::new();
    for _ in 0..100 {
        server.shared.dispatcher.drain_records().await;
        rows = recorder.records();
        if rows.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut seen: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.tool_name.clone(),
                r.envelope.err_kind().map(|k| k.as_str().to_owned()),
                r.input.clone(),
                r.session.as_deref().map(str::to_owned),
            )
        })
        .collect();
    seen.sort_by_key(|(_, _, input, _)| input.to_string());
    let row = |n: u64| {
        (
            "echo".to_owned(),
            Some("invalid_request".to_owned()),
            json!({"n": n}),
            Some(format!("mcp:{sid}")),
        )
    };
    assert_eq!(seen, vec![row(1), row(2), row(3)], "{rows:?}");
    let said = rows
        .iter()
        .find(|r| r.input == json!({"n": 1}))
        .and_then(|r| r.envelope.message().map(str::to_owned))
        .unwrap_or_default();
    assert!(said.contains("send it with an id"), "{said}");
}

/// A request from a web page of another site is refused in Quiver's words, naming the
/// origin and the flag that would admit it; the server's own origin passes.
#[tokio::test]
async fn a_foreign_origin_is_refused_in_words_and_remembered_once() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
    .to_string();
    let evil: &[(&str, &[u8])] = &[("origin", b"http://evil.example")];
    for _ in 0..2 {
        let r = send_with(&router, Method::POST, None, init.clone(), evil).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert!(
            r.body
                .contains("a web page at http://evil.example are not accepted")
                && r.body.contains("--allow-host evil.example"),
            "{}",
            r.body
        );
    }
    let own: &[(&str, &[u8])] = &[("origin", b"http://127.0.0.1:7345")];
    let r = send_with(&router, Method::POST, None, init, own).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// A member given twice is refused by name, at the top level or in `params`, on the
/// direct path too (a `Value` keeps the last one, which would run another request than the
/// first names); the refused call has its row.
#[tokio::test]
async fn a_member_given_twice_is_refused_by_name() {
    let (server, recorder) =
        crate::server::test_server_recorded(echo_catalog(), ServerOptions::default());
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    for (body, member) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"echo","arguments":{"n":1}}}"#,
            "`method`",
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","name":"tool_search","arguments":{"n":2}}}"#,
            "`params.name`",
        ),
    ] {
        let r = send_text(&router, Method::POST, Some(&sid), body.to_owned()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(
            r.body.contains(&format!("gives the member {member} twice")),
            "{}",
            r.body
        );
    }
    server.shared.dispatcher.drain_records().await;
    let rows = recorder.records();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r.envelope.err_kind().map(|k| k.as_str()) == Some("invalid_request")),
        "{rows:?}"
    );
}

/// A body over the limit is refused with `Connection: close` (its rest is not read, so the
/// connection cannot carry another request); a path other than `/mcp` says where the
/// endpoint is.
#[tokio::test]
async fn an_oversize_body_closes_its_connection_and_a_wrong_path_names_the_endpoint() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"x":"{}"}}}}"#,
        "a".repeat(5 << 20)
    );
    let resp = router
        .clone()
        .oneshot(request(Method::POST, None, body, &[]))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(resp.headers()["connection"], "close");
    for path in ["/", "/sse", "/mcp/"] {
        let req = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header("host", "127.0.0.1:7345")
            .body(Body::empty())
            .unwrap();
        let r = reply(&router, req).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        assert!(
            r.body.contains("the MCP endpoint is /mcp"),
            "{path}: {}",
            r.body
        );
    }
}
