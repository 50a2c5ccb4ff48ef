//! Calls in flight: `notifications/cancelled`, an id still in use, a client that leaves,
//! and a session that ends under its calls.

use super::*;

#[tokio::test]
async fn notifications_cancelled_cancels_a_direct_call() {
    let started = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = server_with(Some(Hold {
        spec: ToolSpec::new("hold", "Holds until cancelled.")
            .read_only()
            .with_schema(json!({"type": "object"})),
        started: started.clone(),
        dropped: dropped.clone(),
        cancelled: Arc::default(),
    }));
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let sid = send(&router, Method::POST, None, init)
        .await
        .session
        .expect("a session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    send(&router, Method::POST, Some(&sid), initialized).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    send(&router, Method::POST, Some(&sid), list).await;
    assert_eq!(server.shared.direct.len(), 1, "registered");
    let held = json!({"jsonrpc": "2.0", "id": "h1", "method": "tools/call",
        "params": {"name": "hold", "arguments": {}}});
    let call = tokio::spawn({
        let (router, sid) = (router.clone(), sid.clone());
        async move { send(&router, Method::POST, Some(&sid), held).await }
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
        .await
        .expect("the call starts");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "h1", "reason": "test"}});
    let r = send(&router, Method::POST, Some(&sid), cancel).await;
    assert_eq!(
        r.status,
        StatusCode::ACCEPTED,
        "rmcp still takes the notification"
    );
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), call)
        .await
        .expect("the cancelled call ends")
        .unwrap();
    assert_eq!(
        (r.status, r.content_type.as_str(), r.body.as_str()),
        (StatusCode::OK, "text/event-stream", ""),
        "no response for a cancelled request"
    );
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the tool's call ended"
    );
}

/// A request whose id is still in use by another request of the session is refused
/// (-32600), on rmcp's path as on the direct one: rmcp routes both answers by the one id,
/// which would deliver one call's result on the other's stream and leave the first
/// hanging.
/// Once the first request has ended, its id is free again.
#[tokio::test]
async fn a_request_reusing_an_id_in_flight_is_refused() {
    let started = Arc::new(tokio::sync::Notify::new());
    let server = server_with(Some(Hold::new(&started)));
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    // "p": with a progress token, through rmcp; "d": the direct path; "w": an `Accept`
    // with weights, which the direct path leaves to rmcp before reading the body.
    let plain: &[u8] = b"application/json, text/event-stream";
    let weighted: &[u8] = b"application/json;q=0.9, text/event-stream";
    for (id, meta, accept) in [
        ("p", json!({"progressToken": 1}), plain),
        ("d", json!({}), plain),
        ("w", json!({}), weighted),
    ] {
        let held = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "hold", "arguments": {}, "_meta": meta}});
        let send = |router: Router, sid: String, body: Value| async move {
            send_with(
                &router,
                Method::POST,
                Some(&sid),
                body.to_string(),
                &[("accept", accept)],
            )
            .await
        };
        let call = tokio::spawn(send(router.clone(), sid.clone(), held.clone()));
        tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
            .await
            .expect("the call starts");
        let again = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            send(router.clone(), sid.clone(), held),
        )
        .await
        .expect("the second request is answered at once");
        assert_eq!(
            again.status,
            StatusCode::BAD_REQUEST,
            "{id}: {}",
            again.body
        );
        let v: Value = serde_json::from_str(&again.body).unwrap();
        assert_eq!(v["id"], json!(id));
        assert_eq!(v["error"]["code"], json!(-32600), "{v}");
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "test"}});
        send(router.clone(), sid.clone(), cancel).await;
        tokio::time::timeout(std::time::Duration::from_secs(10), call)
            .await
            .expect("the cancelled call ends")
            .unwrap();
        // Free again once the cancelled call's handler has finished, which may be a
        // moment after its answer's stream closed.
        let list = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let r = send(router.clone(), sid.clone(), list.clone()).await;
            if r.body.contains(r#""tools""#) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{id}: the id never came free: {}",
                r.body
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// A client that drops its request (a network blip, its own timeout) has not cancelled
/// the call: it runs on, as on rmcp's path, until it ends or the session does.
#[tokio::test]
async fn a_dropped_request_does_not_cancel_its_call() {
    let started = Arc::new(tokio::sync::Notify::new());
    let cancelled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = server_with(Some(Hold {
        spec: ToolSpec::new("hold", "Holds until cancelled.")
            .read_only()
            .with_schema(json!({"type": "object"})),
        started: started.clone(),
        dropped: dropped.clone(),
        cancelled: cancelled.clone(),
    }));
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    // A `hold` call with `id`, started, then dropped by its client.
    let start_and_drop = |id: &'static str| {
        let (router, sid, started) = (router.clone(), sid.clone(), started.clone());
        async move {
            let held = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "hold", "arguments": {}}});
            let call = tokio::spawn({
                let (router, sid) = (router.clone(), sid.clone());
                async move { send(&router, Method::POST, Some(&sid), held).await }
            });
            tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
                .await
                .expect("the call starts");
            call.abort();
            let _ = call.await;
        }
    };
    let cancelled_reaches = |n: usize, what: &'static str| {
        let cancelled = cancelled.clone();
        async move {
            tokio::time::timeout(std::time::Duration::from_secs(10), async {
                while cancelled.load(std::sync::atomic::Ordering::SeqCst) < n {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            })
            .await
            .expect(what);
        }
    };
    start_and_drop("h").await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(cancelled.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(
        !dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the call still runs"
    );
    // `notifications/cancelled` still reaches it.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "h", "reason": "test"}});
    send(&router, Method::POST, Some(&sid), cancel).await;
    cancelled_reaches(1, "the client's cancellation reaches the detached call").await;
    // A second call, dropped too: the session's end cancels it.
    start_and_drop("h2").await;
    let r = send(&router, Method::DELETE, Some(&sid), json!({})).await;
    assert!(r.status.is_success(), "{} {}", r.status, r.body);
    cancelled_reaches(2, "the session's end cancels it").await;
}

/// Ending a session (`DELETE`) cancels its calls still running, on the direct path and
/// on rmcp's (a call with a progress token), instead of letting them run for nobody.
#[tokio::test]
async fn ending_a_session_cancels_its_running_calls() {
    let started = Arc::new(tokio::sync::Notify::new());
    let cancelled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let catalog = Arc::new(Catalog::new());
    catalog
        .register(Arc::new(Hold {
            spec: ToolSpec::new("hold", "Holds until cancelled.")
                .read_only()
                .with_schema(json!({"type": "object"})),
            started: started.clone(),
            dropped: Arc::default(),
            cancelled: cancelled.clone(),
        }))
        .unwrap();
    let (server, recorder) = crate::server::test_server_recorded(catalog, ServerOptions::default());
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    let sid = open(&server, &router, json!({})).await;
    let direct = json!({"jsonrpc": "2.0", "id": "d", "method": "tools/call",
        "params": {"name": "hold", "arguments": {}}});
    let via_rmcp = json!({"jsonrpc": "2.0", "id": "r", "method": "tools/call",
        "params": {"name": "hold", "arguments": {}, "_meta": {"progressToken": 7}}});
    let mut calls = Vec::new();
    for body in [direct, via_rmcp] {
        calls.push(tokio::spawn({
            let (router, sid) = (router.clone(), sid.clone());
            async move { send(&router, Method::POST, Some(&sid), body).await }
        }));
        tokio::time::timeout(std::time::Duration::from_secs(10), started.notified())
            .await
            .expect("the call starts");
    }
    assert_eq!(cancelled.load(std::sync::atomic::Ordering::SeqCst), 0);
    let r = send(&router, Method::DELETE, Some(&sid), json!({})).await;
    assert!(r.status.is_success(), "{} {}", r.status, r.body);
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while cancelled.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("both calls see their cancellation");
    for call in calls {
        tokio::time::timeout(std::time::Duration::from_secs(10), call)
            .await
            .expect("the call ends")
            .unwrap();
    }
    // Their log rows say why: the session's end, not the caller giving up on the call.
    let rows = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let rows = recorder.records();
            if rows.len() == 2 {
                return rows;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("both calls are logged");
    for row in rows {
        let text = quiver_contract::render(&row.envelope, &Default::default());
        assert!(
            text.contains(
                "the call to `hold` was cancelled because its client ended the MCP session"
            ),
            "{text}"
        );
    }
}
