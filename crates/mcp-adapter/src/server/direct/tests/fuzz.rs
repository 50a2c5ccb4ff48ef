//! Any body POSTed to `/mcp`, outside a session and inside one: never a panic or a 5xx; a
//! refusal is a 4xx whose JSON body is a JSON-RPC error, and the session still serves a
//! ping after it. A property test; `PROPTEST_CASES` sets how many.

use super::*;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(128)
    ))]

    #[test]
    fn any_body_is_answered_without_a_server_error(
        bodies in proptest::collection::vec(crate::server::fuzz::any_line(), 1..4)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let server = server();
            let router = server.router("127.0.0.1:7345".parse().unwrap());
            let sid = open(&server, &router, json!({})).await;
            for body in &bodies {
                for session in [None, Some(sid.as_str())] {
                    let reply = send_text(&router, Method::POST, session, body.clone()).await;
                    assert!(
                        !reply.status.is_server_error(),
                        "{body:.80}: {} {}",
                        reply.status,
                        reply.body
                    );
                    if reply.status.is_client_error()
                        && reply.content_type.starts_with("application/json")
                    {
                        let answer: Value = serde_json::from_str(&reply.body)
                            .unwrap_or_else(|e| panic!("{body:.80}: {e}: {}", reply.body));
                        assert!(answer.get("error").is_some(), "{body:.80}: {answer}");
                    }
                }
                let ping = send(
                    &router,
                    Method::POST,
                    Some(&sid),
                    json!({"jsonrpc": "2.0", "id": "after", "method": "ping"}),
                )
                .await;
                assert_eq!(ping.status, StatusCode::OK, "after {body:.80}: {}", ping.body);
            }
        });
    }
}
