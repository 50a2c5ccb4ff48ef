//! `@modelcontextprotocol/server-everything` over stdio and streamable HTTP.

use std::{
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::Duration,
};

use quiver_contract::{Envelope, ErrKind};
use quiver_mcp_adapter::{McpClient, ServerConfig, ServerState};
use quiver_registry::Catalog;
use serde_json::json;

use crate::{call, close_and_check, everything_js, ready, start, text_of, wait_for, within};

/// A server-everything HTTP process on a free loopback port; killed and reaped on drop.
pub(crate) struct HttpEverything {
    child: Child,
    pub(crate) url: String,
}

impl HttpEverything {
    pub(crate) fn spawn() -> HttpEverything {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        HttpEverything::spawn_on(port)
    }

    pub(crate) fn spawn_on(port: u16) -> HttpEverything {
        let child = Command::new("node")
            .arg(everything_js())
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs");
        HttpEverything {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }

    pub(crate) async fn ready(&self) {
        let addr = self
            .url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_owned();
        wait_for(
            "server-everything to listen",
            Duration::from_secs(30),
            || TcpStream::connect(&addr).is_ok(),
        )
        .await;
    }
}

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn exercise(catalog: &Catalog, client: &McpClient, server: &str) {
    within(
        Duration::from_secs(60),
        client.wait_ready(Duration::from_secs(60)),
    )
    .await
    .expect("server-everything connects");
    let echo = format!("mcp__{server}__echo");
    let sum = format!("mcp__{server}__get-sum");
    let names = catalog.names();
    assert!(names.contains(&echo), "{names:?}");
    assert!(names.contains(&sum), "{names:?}");

    let entry = catalog.lookup(&echo).unwrap();
    assert!(
        entry
            .spec
            .description
            .starts_with(&format!("[MCP: {server}] "))
    );
    assert_eq!(&*entry.family, format!("mcp:{server}"));
    assert!(entry.tool.read_only(), "echo says readOnlyHint: true");
    let toggle = catalog
        .lookup(&format!("mcp__{server}__toggle-simulated-logging"))
        .unwrap();
    assert!(
        !toggle.tool.read_only(),
        "readOnlyHint: false stays mutating"
    );

    let env = call(catalog, &echo, json!({"message": "hello"})).await;
    assert!(env.is_ok(), "{env:?}");
    assert!(text_of(&env).contains("hello"), "{env:?}");
    assert_eq!(env.cost_usd(), 0.0);

    let env = call(catalog, &sum, json!({"a": 2, "b": 40})).await;
    assert!(text_of(&env).contains("42"), "{env:?}");

    let img = call(
        catalog,
        &format!("mcp__{server}__get-tiny-image"),
        json!({}),
    )
    .await;
    assert!(
        matches!(&img, Envelope::Ok { parts, .. } if !parts.is_empty()),
        "binary content becomes parts: {img:?}"
    );

    // A JSON-RPC error from the peer is an Err, never a drop.
    let bad = call(catalog, &sum, json!({"a": "x"})).await;
    assert!(!bad.is_ok(), "{bad:?}");
    assert_eq!(client.server_status(server).unwrap().counters.drops, 0);
    assert_eq!(
        client.server_status(server).unwrap().state,
        ServerState::Connected
    );

    // Resources come through the meta-tools.
    wait_for("resource meta-tools", Duration::from_secs(10), || {
        catalog.contains("list_mcp_resources")
    })
    .await;
    let list = call(catalog, "list_mcp_resources", json!({"server": server})).await;
    assert!(
        matches!(list.data(), Some(serde_json::Value::Array(a)) if !a.is_empty()),
        "{list:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_list_call_and_annotations() {
    let (catalog, client) = start(
        &[
            ServerConfig::stdio("everything", "node", vec![everything_js(), "stdio".into()])
                .required(),
        ],
        Default::default(),
    );
    exercise(&catalog, &client, "everything").await;
    close_and_check(&client).await;
    assert!(catalog.family_names("mcp:everything").is_empty());
    assert!(!catalog.contains("list_mcp_resources"));
    assert_eq!(
        client.server_status("everything").unwrap().state,
        ServerState::Closed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_list_and_call() {
    let server = HttpEverything::spawn();
    server.ready().await;
    let (catalog, client) = start(
        &[ServerConfig::http("web", server.url.clone()).required()],
        Default::default(),
    );
    exercise(&catalog, &client, "web").await;
    // Every call took the direct HTTP path and none was handed back to rmcp.
    let st = client.server_status("web").unwrap().counters;
    assert!(st.calls > 0 && st.direct_calls == st.calls, "{st:?}");
    assert_eq!(st.direct_handoffs, 0, "{st:?}");
    // Keep a handle to a tool, close, and call it: "closed" at once, no dial.
    let echo = catalog.lookup("mcp__web__echo").unwrap();
    let dials = client.server_status("web").unwrap().counters.dials;
    close_and_check(&client).await;
    let env = echo
        .tool
        .call(json!({"message": "x"}), &Default::default())
        .await
        .unwrap();
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable));
    assert!(env.message().unwrap().contains("closed"), "{env:?}");
    assert_eq!(client.server_status("web").unwrap().counters.dials, dials);
}

/// A loopback TCP proxy to `port` that counts the connections it accepted.
async fn counting_proxy(port: u16) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (url, accepted)
}

/// Sequential calls on the direct HTTP path share one pooled connection (server-everything
/// answers each call on an event stream it then ends): no reconnect per call, which would
/// cost a handshake each and leave sockets in TIME_WAIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_direct_calls_share_one_connection() {
    use std::sync::atomic::Ordering;
    let server = HttpEverything::spawn();
    server.ready().await;
    let port: u16 = server
        .url
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    let (url, accepted) = counting_proxy(port).await;
    let (catalog, client) = start(
        &[ServerConfig::http("web", url)
            .with_liveness(quiver_mcp_adapter::Liveness::Off)
            .required()],
        Default::default(),
    );
    within(
        Duration::from_secs(60),
        client.wait_ready(Duration::from_secs(60)),
    )
    .await
    .expect("server-everything connects");
    let env = call(&catalog, "mcp__web__echo", json!({"message": "first"})).await;
    assert!(env.is_ok(), "{env:?}");
    let before = accepted.load(Ordering::SeqCst);
    for i in 0..20 {
        let env = call(
            &catalog,
            "mcp__web__echo",
            json!({"message": format!("m{i}")}),
        )
        .await;
        assert!(text_of(&env).contains(&format!("m{i}")), "{env:?}");
    }
    let st = client.server_status("web").unwrap().counters;
    assert_eq!(st.direct_calls, st.calls, "{st:?}");
    let opened = accepted.load(Ordering::SeqCst) - before;
    assert!(
        opened <= 1,
        "20 sequential calls opened {opened} new connections"
    );
    close_and_check(&client).await;
}

/// A fixture server over streamable HTTP; killed and reaped on drop.
pub(crate) struct HttpFixture(Child);

impl HttpFixture {
    /// A fixture listening on `port`, and the config of a server `name` pointing at it.
    pub(crate) async fn serve(name: &str, port: u16) -> (HttpFixture, ServerConfig) {
        let server = HttpFixture::spawn_on(port);
        listening(port).await;
        let config = ServerConfig::http(name, format!("http://127.0.0.1:{port}/mcp"));
        (server, config)
    }

    pub(crate) fn spawn_on(port: u16) -> HttpFixture {
        HttpFixture(
            Command::new(crate::python())
                .args([crate::fixture(), "--http".into(), port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("python runs"),
        )
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) async fn listening(port: u16) {
    wait_for("the server to listen", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_http_session_reinitializes_transparently() {
    // The Python SDK answers an unknown session with HTTP 404, as the spec says.
    let port = free_port();
    let (server, config) = HttpFixture::serve("pyweb", port).await;
    // No liveness ping: one falling in the restart would count a drop and a dial, or
    // re-initialize before the call this test watches.
    let (catalog, client) = start(
        &[config
            .with_liveness(quiver_mcp_adapter::Liveness::Off)
            .required()],
        Default::default(),
    );
    // The call after the restart is rejected on the direct path (404), sent by rmcp, which
    // re-initializes; the next call takes the direct path again, on the new session.
    let server = echo_across_a_restart(&catalog, &client, "pyweb", "text", async move || {
        drop(server);
        HttpFixture::serve("pyweb", port).await.0
    })
    .await;
    close_and_check(&client).await;
    drop(server);
}

/// Waits for `server`, calls its `echo` (argument `key`) once, lets `restart` replace the
/// upstream, then calls twice more: both answered, with no new dial and no drop (rmcp
/// re-initialized in place), the first of them handed from the direct path to rmcp and the
/// second back on the direct path. Returns what `restart` made.
async fn echo_across_a_restart<S>(
    catalog: &Catalog,
    client: &McpClient,
    server: &str,
    key: &str,
    restart: impl AsyncFnOnce() -> S,
) -> S {
    within(
        Duration::from_secs(60),
        client.wait_ready(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let tool = format!("mcp__{server}__echo");
    let env = call(catalog, &tool, json!({ key: "one" })).await;
    assert!(text_of(&env).contains("one"), "{env:?}");
    let restarted = restart().await;
    let env = within(
        Duration::from_secs(30),
        call(catalog, &tool, json!({ key: "two" })),
    )
    .await;
    assert!(text_of(&env).contains("two"), "{env:?}");
    let env = call(catalog, &tool, json!({ key: "three" })).await;
    assert!(text_of(&env).contains("three"), "{env:?}");
    let st = client.server_status(server).unwrap();
    assert_eq!(
        (st.counters.dials, st.counters.drops),
        (1, 0),
        "rmcp re-initialized in place: {st:?}"
    );
    assert_eq!(
        (st.counters.direct_calls, st.counters.direct_handoffs),
        (3, 1),
        "{st:?}"
    );
    restarted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_server_restart_reinitializes_transparently() {
    // server-everything answers an unknown session with HTTP 400 and an id-less JSON-RPC
    // error, which rmcp alone cannot route to the request (the call would wait for its
    // timeout). The adapter's HTTP client reads it as an expired session, so rmcp
    // re-initializes in place and the call is answered, with no liveness ping involved.
    let port = free_port();
    let server = HttpEverything::spawn_on(port);
    server.ready().await;
    let (catalog, client) = start(
        &[ServerConfig::http("web", server.url.clone())
            .with_liveness(quiver_mcp_adapter::Liveness::Off)
            .required()],
        Default::default(),
    );
    // "two" meets the old session on the direct path (HTTP 400) and goes to rmcp.
    let server = echo_across_a_restart(&catalog, &client, "web", "message", async move || {
        drop(server);
        let server = HttpEverything::spawn_on(port);
        server.ready().await;
        server
    })
    .await;
    close_and_check(&client).await;
    drop(server);
}

/// An HTTP upstream that stops listening while no call is made: the liveness ping's POST is
/// refused, which means the connection is gone (rmcp's HTTP worker keeps running, so only
/// the ping can tell). The server leaves `Connected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_liveness_ping_notices_an_http_server_that_stopped() {
    let port = free_port();
    let (server, config) = HttpFixture::serve("gone", port).await;
    let config = config
        .with_liveness(quiver_mcp_adapter::Liveness::Every(Duration::from_millis(
            300,
        )))
        .required();
    let (_catalog, client) = start(&[config], Default::default());
    ready(&client).await;
    drop(server);
    wait_for(
        "the ping to notice the server is gone",
        Duration::from_secs(20),
        || {
            let s = client.server_status("gone").unwrap();
            s.state != ServerState::Connected
                && s.diagnostics
                    .iter()
                    .any(|l| l.contains("the connection is taken as lost and made again"))
        },
    )
    .await;
    close_and_check(&client).await;
}

/// A network server that stays down through several redials is still said to be retried
/// (it may come back by itself, a restart or a deploy), not one an operator must fix as a
/// stdio command that keeps failing to start is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_down_through_many_redials_keeps_the_retry_advice() {
    let port = free_port();
    let (server, config) = HttpFixture::serve("away", port).await;
    let config = config.with_liveness(quiver_mcp_adapter::Liveness::Every(Duration::from_millis(
        300,
    )));
    let (catalog, client) = start(
        &[config.required()],
        quiver_mcp_adapter::ClientOptions::default()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(300)),
    );
    ready(&client).await;
    let tool = catalog
        .names()
        .into_iter()
        .find(|n| n.starts_with("mcp__away__"))
        .expect("a tool of the server");
    drop(server);
    wait_for("several failed redials", Duration::from_secs(30), || {
        let s = client.server_status("away").unwrap();
        s.counters.dials >= s.counters.connects + 4 && s.next_attempt.is_some()
    })
    .await;
    let env = call(&catalog, &tool, serde_json::json!({})).await;
    let message = env.message().unwrap_or_default().to_owned();
    assert!(
        message.starts_with("MCP server \"away\" went down (its last attempt: ")
            && message.contains("). Quiver tries it again in about ")
            && !message.contains("operator"),
        "{message}"
    );
    close_and_check(&client).await;
}

/// An operator's switch: a disabled server is closed (its tools gone, its child reaped) and
/// a reload that still configures it leaves it closed; enabling it connects it again, and a
/// reload that drops it forgets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_server_stays_closed_through_reloads_until_enabled() {
    let config = [
        ServerConfig::stdio("everything", "node", vec![everything_js(), "stdio".into()]).required(),
    ];
    let (catalog, client) = start(&config, Default::default());
    ready(&client).await;
    let first = client.server_status("everything").unwrap();
    assert!(first.counters.last_connect.is_some(), "{first:?}");
    let pids = first.child_pids.clone();

    assert!(client.disable_server("everything").await.unwrap());
    assert!(
        client.disable_server("everything").await.unwrap(),
        "idempotent"
    );
    assert!(!client.disable_server("nope").await.unwrap());
    assert_eq!(client.disabled_servers(), ["everything"]);
    assert!(catalog.family_names("mcp:everything").is_empty());
    assert!(client.server_status("everything").is_none());
    crate::assert_reaped(&pids);

    let done = within(
        Duration::from_secs(30),
        client.reconcile(crate::resolve(&config)),
    )
    .await
    .unwrap();
    assert_eq!(done.unchanged, ["everything"], "{done:?}");
    assert!(!done.changed(), "{done:?}");
    assert!(client.server_status("everything").is_none(), "still closed");

    assert!(client.enable_server("everything").unwrap());
    assert!(
        !client.enable_server("everything").unwrap(),
        "enabled already"
    );
    assert!(client.disabled_servers().is_empty());
    ready(&client).await;
    wait_for("its tools to return", Duration::from_secs(30), || {
        catalog.contains("mcp__everything__echo")
    })
    .await;

    assert!(client.disable_server("everything").await.unwrap());
    let done = within(Duration::from_secs(30), client.reconcile(Vec::new()))
        .await
        .unwrap();
    assert_eq!(done.removed, ["everything"], "{done:?}");
    assert!(
        client.disabled_servers().is_empty(),
        "forgotten with its config"
    );
    assert!(!client.enable_server("everything").unwrap());
    close_and_check(&client).await;
}

/// A connected server that offers no resources (server-filesystem serves tools only) is
/// left out of `list_mcp_resources` without a word; named, it is said to offer none, an
/// empty list rather than "not connected" (which would have a model stop calling its tools).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_resources_is_not_called_unavailable() {
    let dir = std::env::temp_dir().join(format!("quiver-fs-nores-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fs_bin = crate::peers().join("npm/node_modules/.bin/mcp-server-filesystem");
    let (catalog, client) = start(
        &[
            ServerConfig::stdio("everything", "node", vec![everything_js(), "stdio".into()])
                .required(),
            ServerConfig::stdio(
                "fs",
                fs_bin.display().to_string(),
                vec![dir.display().to_string()],
            )
            .required(),
        ],
        Default::default(),
    );
    ready(&client).await;
    wait_for("resource meta-tools", Duration::from_secs(10), || {
        catalog.contains("list_mcp_resources")
    })
    .await;
    let all = call(&catalog, "list_mcp_resources", json!({})).await;
    assert!(all.is_ok() && all.warnings().is_empty(), "{all:?}");
    let named = call(&catalog, "list_mcp_resources", json!({"server": "fs"})).await;
    assert_eq!(named.data(), Some(&json!([])), "{named:?}");
    let said: Vec<_> = named
        .warnings()
        .iter()
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(
        said,
        ["MCP server \"fs\" offers no resources (it serves tools only)"],
        "{named:?}"
    );
    close_and_check(&client).await;
    let _ = std::fs::remove_dir_all(&dir);
}
