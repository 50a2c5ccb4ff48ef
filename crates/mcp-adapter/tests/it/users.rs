//! A server that acts for the user (`auth = "passthrough"`): a connection per user, pooled,
//! capped (another user refused while every connection is busy), replaced when the user's
//! credential changes (a call running on the old one finishing there), closed when idle; a
//! call without a user, or with an expired token, refused before anything is sent.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use quiver_contract::{CallContext, Envelope, ErrKind, UserCredential};
use quiver_mcp_adapter::UpstreamAuth;
use serde_json::json;

use crate::{
    close_and_check,
    everything::{HttpFixture, free_port},
    ready, start, text_of, wait_for, within,
};

fn user(sub: &str, token: &str, valid: Duration) -> CallContext {
    CallContext::default().with_user(Arc::new(UserCredential::new(
        sub,
        token,
        SystemTime::now() + valid,
    )))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_gets_a_capped_pooled_connection_of_their_own() {
    let port = free_port();
    let (_server, config) = HttpFixture::serve("acting", port).await;
    let mut config = config
        .with_auth(
            UpstreamAuth::Passthrough,
            Some("http://127.0.0.1:1/mcp".into()),
        )
        .required();
    config.max_user_connections = Some(1);
    config.user_idle_timeout = Some(Duration::from_secs(1));
    let (catalog, client) = start(&[config], crate::fast_options());
    ready(&client).await;
    let echo = catalog
        .lookup("mcp__acting__echo")
        .expect("listed")
        .tool
        .clone();
    let call = async |ctx: CallContext| -> Envelope {
        within(
            Duration::from_secs(30),
            echo.call(json!({"text": "hi"}), &ctx),
        )
        .await
        .expect("a call")
    };
    let connections = || client.user_connections("acting").expect("acts for users");

    let refused = call(CallContext::default()).await;
    assert_eq!(refused.err_kind(), Some(&ErrKind::Forbidden), "{refused:?}");
    assert!(
        text_of(&refused).contains("acts for the signed-in user")
            && text_of(&refused).contains("this call has no user"),
        "{refused:?}"
    );
    assert_eq!(
        connections(),
        (0, 0),
        "nothing opened for a call with no user"
    );

    let alice = call(user("alice", "token-a", Duration::from_secs(600))).await;
    assert_eq!(alice.data(), Some(&json!({"result": "hi"})), "{alice:?}");
    assert_eq!(connections(), (1, 1));
    call(user("alice", "token-a", Duration::from_secs(600))).await;
    assert_eq!(connections(), (1, 1), "the same user's next call is pooled");

    // The cap is one user: bob's connection replaces alice's idle one.
    let bob = call(user("bob", "token-b", Duration::from_secs(600))).await;
    assert_eq!(bob.data(), Some(&json!({"result": "hi"})), "{bob:?}");
    assert_eq!(connections(), (1, 2));
    // A renewed token is a new credential: a new connection for it.
    call(user("bob", "token-b2", Duration::from_secs(600))).await;
    assert_eq!(connections(), (1, 3));

    // A call still running on bob's connection when his token is renewed finishes there.
    let sleep = catalog
        .lookup("mcp__acting__sleep")
        .expect("listed")
        .tool
        .clone();
    let marker = std::env::temp_dir().join(format!("quiver-users-{}", std::process::id()));
    let started = marker.with_extension("started");
    let _ = std::fs::remove_file(&started);
    let running = tokio::spawn({
        let ctx = user("bob", "token-b2", Duration::from_secs(600));
        let marker = marker.to_string_lossy().into_owned();
        async move {
            sleep
                .call(json!({"seconds": 1.0, "marker": marker}), &ctx)
                .await
                .expect("a call")
        }
    });
    wait_for("the long call runs", Duration::from_secs(20), || {
        started.exists()
    })
    .await;
    call(user("bob", "token-b3", Duration::from_secs(600))).await;
    assert_eq!(connections(), (1, 4));
    let slept = within(Duration::from_secs(30), running)
        .await
        .expect("joins");
    assert_eq!(slept.data(), Some(&json!({"result": "slept"})), "{slept:?}");
    let _ = std::fs::remove_file(&started);

    // With the one connection busy, another user is refused rather than cut in.
    let running = tokio::spawn({
        let sleep = catalog
            .lookup("mcp__acting__sleep")
            .expect("listed")
            .tool
            .clone();
        let ctx = user("bob", "token-b3", Duration::from_secs(600));
        let marker = marker.to_string_lossy().into_owned();
        async move {
            sleep
                .call(json!({"seconds": 1.0, "marker": marker}), &ctx)
                .await
                .expect("a call")
        }
    });
    wait_for("the long call runs", Duration::from_secs(20), || {
        started.exists()
    })
    .await;
    let busy = call(user("carol", "token-c", Duration::from_secs(600))).await;
    assert_eq!(busy.err_kind(), Some(&ErrKind::NotAvailable), "{busy:?}");
    assert!(
        text_of(&busy).contains("per-user connections all busy"),
        "{busy:?}"
    );
    let slept = within(Duration::from_secs(30), running)
        .await
        .expect("joins");
    assert_eq!(slept.data(), Some(&json!({"result": "slept"})), "{slept:?}");
    let _ = std::fs::remove_file(&started);
    assert_eq!(connections(), (1, 4), "nothing opened for the refused user");

    let expired = call(user("bob", "token-b4", Duration::ZERO)).await;
    assert_eq!(expired.err_kind(), Some(&ErrKind::Forbidden), "{expired:?}");
    assert!(text_of(&expired).contains("has expired"), "{expired:?}");
    assert_eq!(connections(), (1, 4), "nothing opened for an expired token");

    wait_for(
        "the idle connection closed",
        Duration::from_secs(20),
        || connections().0 == 0,
    )
    .await;
    close_and_check(&client).await;
}
