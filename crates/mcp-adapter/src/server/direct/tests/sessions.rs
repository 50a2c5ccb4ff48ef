//! A session's start and end: a second or malformed `initialize`, the session limit, and a
//! session bound to the token that opened it.

use super::*;

/// A second `initialize` on a session is refused: rmcp would answer it with the version it
/// asks for, while the session keeps the first one's. The session goes on.
#[tokio::test]
async fn a_second_initialize_on_a_session_is_refused() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    let again = json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let reply = send(&router, Method::POST, Some(&sid), again).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    let v: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(
        (v["id"].clone(), v["error"]["code"].clone()),
        (json!(7), json!(-32600)),
        "{v}"
    );
    assert!(
        reply.body.contains("this session is already initialized"),
        "{}",
        reply.body
    );
    // A POST the direct path does not take (here a weighted `Accept`, which rmcp
    // judges) is refused the same way (rmcp would answer it).
    let weighted: &[(&str, &[u8])] = &[("accept", b"application/json, text/event-stream;q=0.9")];
    let again = json!({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let reply = send_with(
        &router,
        Method::POST,
        Some(&sid),
        again.to_string(),
        weighted,
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert!(
        reply.body.contains("this session is already initialized"),
        "{}",
        reply.body
    );
    let ping = json!({"jsonrpc": "2.0", "id": 8, "method": "ping"});
    let reply = send(&router, Method::POST, Some(&sid), ping).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// A malformed `initialize` is told what an `initialize` needs (rmcp reads it as another
/// request and answers that a session id is required).
#[tokio::test]
async fn a_malformed_initialize_is_told_what_it_needs() {
    let server = server();
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let bad = json!({"jsonrpc": "2.0", "id": 9, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
    let reply = send(&router, Method::POST, None, bad).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    let v: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(v["id"], json!(9), "{v}");
    assert_eq!(v["error"]["code"], json!(-32602), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("clientInfo"),
        "{v}"
    );
    // A 2026-07-28 request is not a malformed initialize: that version removed the
    // method, and rmcp answers it (the conformance suite's 2026 scenarios check the 404).
    let later = json!({"jsonrpc": "2.0", "id": 10, "method": "initialize",
        "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
    let reply = send_with(
        &router,
        Method::POST,
        None,
        later.to_string(),
        &[
            ("mcp-protocol-version", b"2026-07-28"),
            ("mcp-method", b"initialize"),
        ],
    )
    .await;
    assert!(
        !reply.body.contains("an `initialize` needs"),
        "{}",
        reply.body
    );
}

/// At `max_sessions` open sessions an `initialize` is refused with 503 and a JSON-RPC
/// error naming the limit (each session holds memory, so their number is bounded); ending
/// one makes room again.
#[tokio::test]
async fn initialize_beyond_the_session_limit_is_refused_until_one_ends() {
    let catalog = Arc::new(Catalog::new());
    let server = crate::server::test_server(catalog, ServerOptions::default().with_max_sessions(2));
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let first = open(&server, &router, json!({})).await;
    open(&server, &router, json!({})).await;
    let init = json!({"jsonrpc": "2.0", "id": 41, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let full = send(&router, Method::POST, None, init.clone()).await;
    assert_eq!(
        full.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        full.body
    );
    // A session header rmcp cannot read is none to it: refused the same.
    let unreadable = send_with(
        &router,
        Method::POST,
        None,
        init.to_string(),
        &[("mcp-session-id", b"\xff")],
    )
    .await;
    assert_eq!(
        unreadable.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        unreadable.body
    );
    let v: Value = serde_json::from_str(&full.body).unwrap();
    assert_eq!(v["id"], json!(41));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_http_sessions"),
        "{v}"
    );
    assert!(full.session.is_none());
    let ended = send_text(&router, Method::DELETE, Some(&first), String::new()).await;
    assert!(ended.status.is_success(), "{}", ended.status);
    let again = send(&router, Method::POST, None, init).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert!(again.session.is_some());
}

/// A burst of parallel `initialize`s is admitted up to the limit exactly: 25 at a limit
/// of 20, none open before, are 20 sessions and 5 refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_initializes_is_admitted_up_to_the_limit_exactly() {
    let catalog = Arc::new(Catalog::new());
    let server =
        crate::server::test_server(catalog, ServerOptions::default().with_max_sessions(20));
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let calls: Vec<_> = (0..25)
        .map(|_| {
            let (router, init) = (router.clone(), init.clone());
            tokio::spawn(async move { send(&router, Method::POST, None, init).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in calls {
        statuses.push(c.await.unwrap());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let full = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!((ok, full), (20, 5), "{statuses:?}");
}

/// Only an `initialize` counts toward the session limit while it runs: a stateless
/// 2026-07-28 call in flight (which opens no session) does not keep one from starting.
#[tokio::test]
async fn a_stateless_call_in_flight_does_not_count_toward_the_session_limit() {
    let started = Arc::new(tokio::sync::Notify::new());
    let catalog = Arc::new(Catalog::new());
    catalog.register(Arc::new(Hold::new(&started))).unwrap();
    let server = crate::server::test_server(catalog, ServerOptions::default().with_max_sessions(1));
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let stateless = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
    "name": "hold", "arguments": {},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}
    }}});
    let call = tokio::spawn({
        let router = router.clone();
        async move {
            let req = Request::builder()
                .method(Method::POST)
                .uri("/mcp")
                .header("host", "127.0.0.1:7345")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "hold")
                .body(Body::from(stateless.to_string()))
                .unwrap();
            router.oneshot(req).await.unwrap().status()
        }
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
        .await
        .expect("the stateless call runs");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let r = send(&router, Method::POST, None, init).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.session.is_some());
    server.shutdown_token().cancel();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), call).await;
}

/// A session is its token's: another valid token naming it is answered as for an
/// unknown session (404), for calls, lists and DELETE alike, so it can neither use nor
/// end it (the MCP security guidance binds session ids to the user). The owner still
/// can, and ends it.
#[tokio::test]
async fn a_session_answers_only_the_token_that_opened_it() {
    use crate::server::{InboundAuth, InboundToken};
    let catalog = echo_catalog();
    let server = crate::server::test_server(
        catalog,
        ServerOptions::default().with_auth(InboundAuth::new(vec![
            InboundToken::new("ci", "secret-ci"),
            InboundToken::new("ops", "secret-ops"),
        ])),
    );
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let ci: &[(&str, &[u8])] = &[("authorization", b"Bearer secret-ci")];
    let ops: &[(&str, &[u8])] = &[("authorization", b"Bearer secret-ops")];
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let sid = send_with(&router, Method::POST, None, init.to_string(), ci)
        .await
        .session
        .expect("a session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    send_with(
        &router,
        Method::POST,
        Some(&sid),
        initialized.to_string(),
        ci,
    )
    .await;
    for body in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        call(2, json!({})),
    ] {
        let theirs = send_with(&router, Method::POST, Some(&sid), body.to_string(), ops).await;
        assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{}", theirs.body);
        let own = send_with(&router, Method::POST, Some(&sid), body.to_string(), ci).await;
        assert_eq!(own.status, StatusCode::OK, "{}", own.body);
        assert!(!own.body.contains("error"), "{}", own.body);
    }
    let theirs = send_with(&router, Method::DELETE, Some(&sid), String::new(), ops).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    let own = send_with(&router, Method::DELETE, Some(&sid), String::new(), ci).await;
    assert!(own.status.is_success(), "{}", own.status);
}
