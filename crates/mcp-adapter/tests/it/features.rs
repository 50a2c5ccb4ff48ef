//! list_changed, resources, prompts, hints, cancellation, first-wins registration, and the
//! cross-origin redirect rule.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use quiver_contract::{CallContext, ErrKind, HintKind, Tool, ToolResult, ToolSpec};
use quiver_mcp_adapter::{McpClient, ServerConfig, ServerState};
use quiver_registry::Catalog;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tokio_util::sync::CancellationToken;

use crate::{
    call, close_and_check,
    everything::{HttpFixture, free_port},
    fast_options, fixture_server, ready, resolve, start, text_of, wait_for, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_updates_the_catalog() {
    let (catalog, client) = start(&[fixture_server("fx", "normal").required()], fast_options());
    ready(&client).await;
    assert!(catalog.contains("mcp__fx__hinted"));
    assert!(!catalog.contains("mcp__fx__extra"));

    let hint = call(&catalog, "mcp__fx__hinted", json!({})).await;
    assert_eq!(hint.hint_kind(), Some(HintKind::Schema), "{hint:?}");

    let env = call(&catalog, "mcp__fx__grow", json!({})).await;
    assert!(env.is_ok(), "{env:?}");
    wait_for(
        "the catalog to follow list_changed",
        Duration::from_secs(20),
        || catalog.contains("mcp__fx__extra") && !catalog.contains("mcp__fx__hinted"),
    )
    .await;
    let env = call(&catalog, "mcp__fx__extra", json!({"x": 7})).await;
    assert!(text_of(&env).contains("extra 7"), "{env:?}");
    assert!(client.server_status("fx").unwrap().counters.relists >= 1);
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_and_prompts() {
    let (catalog, client) = start(&[fixture_server("fx", "normal").required()], fast_options());
    ready(&client).await;
    wait_for("meta-tools", Duration::from_secs(10), || {
        catalog.contains("list_mcp_resources") && catalog.contains("read_mcp_resource")
    })
    .await;
    let list = catalog.lookup("list_mcp_resources").unwrap();
    assert!(list.tool.read_only());
    let env = call(&catalog, "list_mcp_resources", json!({})).await;
    let items = env
        .data()
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert!(
        items
            .iter()
            .any(|r| r["uri"] == "fixture://hello" && r["server"] == "fx"),
        "{env:?}"
    );
    let env = call(
        &catalog,
        "read_mcp_resource",
        json!({"uri": "fixture://hello"}),
    )
    .await;
    assert_eq!(text_of(&env), "hello from the fixture");
    // A result Quiver keeps is not asked of an upstream: the model is sent to read_result.
    let env = call(
        &catalog,
        "read_mcp_resource",
        json!({"uri": "quiver://results/c7"}),
    )
    .await;
    assert_eq!(env.hint_kind(), Some(HintKind::Schema), "{env:?}");
    assert!(
        format!("{env:?}").contains(r#"call read_result {\"id\":\"c7\",\"page\":1}"#),
        "{env:?}"
    );
    // A server that is not one is a hint naming those there are, with the look-alike.
    let env = call(&catalog, "list_mcp_resources", json!({"server": "fxx"})).await;
    assert_eq!(env.hint_kind(), Some(HintKind::Schema), "{env:?}");
    let said = format!("{env:?}");
    assert!(
        said.contains(
            r#"no MCP server named \"fxx\"; the servers whose resources you may read: \"fx\""#
        ) && said.contains("label: \"fx\""),
        "{said}"
    );

    let anyone = CallContext::default();
    let text = client
        .expand_prompt("/mcp__fx__greet name=\"Ada Lovelace\"", &anyone)
        .await
        .unwrap();
    assert_eq!(text.as_deref(), Some("Please greet Ada Lovelace warmly."));
    assert_eq!(
        client.expand_prompt("/not_mcp x=1", &anyone).await.unwrap(),
        None
    );
    assert!(
        client
            .expand_prompt("/mcp__fx__nosuch", &anyone)
            .await
            .is_err()
    );
    // A caller limited to other servers' prompts: fx's is as unknown as no server's.
    let elsewhere = CallContext::default().with_capabilities(
        quiver_contract::Capabilities::all().with_allowed_servers(vec!["other".into()]),
    );
    assert_eq!(
        client
            .expand_prompt("/mcp__fx__greet name=Ada", &elsewhere)
            .await
            .unwrap(),
        None
    );
    // Its cancellation ends the rendering.
    let cancelled = CallContext::default();
    cancelled.cancel.cancel();
    let err = client
        .expand_prompt("/mcp__fx__greet name=Ada", &cancelled)
        .await
        .expect_err("a cancelled expansion is not rendered");
    assert!(err.to_string().contains("cancelled"), "{err}");
    close_and_check(&client).await;
}

/// The fault fixture over stdio, or over streamable HTTP (then with its process guard).
async fn fixture_over(http: bool) -> (ServerConfig, Option<HttpFixture>) {
    if !http {
        return (fixture_server("fx", "normal"), None);
    }
    let (server, config) = HttpFixture::serve("fx", free_port()).await;
    (config, Some(server))
}

async fn timeout_also_cancels_upstream(http: bool) {
    let (server, _guard) = fixture_over(http).await;
    // Long enough for the upstream's handler to start under load: the Python SDK drops a
    // cancellation that arrives before the handler runs, and then leaves no mark.
    let (catalog, client) = start(
        &[server.with_call_timeout(Duration::from_secs(5)).required()],
        fast_options(),
    );
    ready(&client).await;
    let marker =
        std::env::temp_dir().join(format!("quiver-mcp-timeout-{}-{http}", std::process::id()));
    let started = marker.with_extension("started");
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&started);
    let entry = catalog.lookup("mcp__fx__sleep").unwrap();
    let input = json!({"seconds": 30, "marker": marker.display().to_string()});
    let task = tokio::spawn(async move { entry.tool.call(input, &CallContext::default()).await });
    wait_for(
        "the upstream to run the call",
        Duration::from_secs(5),
        || started.exists(),
    )
    .await;
    let env = within(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap_or_else(quiver_contract::Envelope::from);
    assert_eq!(env.err_kind(), Some(&ErrKind::Timeout), "{env:?}");
    wait_for(
        "the upstream to see the cancellation",
        Duration::from_secs(10),
        || marker.exists(),
    )
    .await;
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&started);
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_also_cancels_upstream_stdio() {
    timeout_also_cancels_upstream(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_also_cancels_upstream_http() {
    timeout_also_cancels_upstream(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_ping_notices_a_frozen_server() {
    let (catalog, client) = start(
        &[fixture_server("fx", "normal")
            .with_liveness(quiver_mcp_adapter::Liveness::Every(Duration::from_millis(
                300,
            )))
            .required()],
        fast_options(),
    );
    ready(&client).await;
    let pid = text_of(&call(&catalog, "mcp__fx__pid", json!({})).await);
    let pid = pid.trim_matches(|c: char| !c.is_ascii_digit()).to_owned();
    // Freeze it: the pipe stays open, only the ping can tell.
    let st = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(st.success());
    wait_for(
        "the ping to fail and the server to come back",
        Duration::from_secs(30),
        || {
            let s = client.server_status("fx").unwrap();
            s.counters.connects == 2 && s.state == ServerState::Connected
        },
    )
    .await;
    let st = client.server_status("fx").unwrap();
    assert!(
        st.diagnostics.iter().any(|l| l.starts_with("did not answer a liveness ping within")
            && l.ends_with("the connection is taken as lost and made again (its process is stopped and started again)")),
        "{st:?}"
    );
    let env = call(&catalog, "mcp__fx__echo", json!({"text": "thawed"})).await;
    assert!(text_of(&env).contains("thawed"));
    close_and_check(&client).await;
}

async fn cancellation_answers_and_keeps_the_connection(http: bool) {
    let (server, _guard) = fixture_over(http).await;
    let (catalog, client) = start(&[server.required()], fast_options());
    ready(&client).await;
    let entry = catalog.lookup("mcp__fx__sleep").unwrap();
    let cancel = CancellationToken::new();
    let ctx = CallContext::default().with_cancel(cancel.clone());
    let base = client.server_status("fx").unwrap().counters.calls;
    let marker =
        std::env::temp_dir().join(format!("quiver-mcp-cancel-{}-{http}", std::process::id()));
    let started = marker.with_extension("started");
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&started);
    let input = json!({"seconds": 30, "marker": marker.display().to_string()});
    let task = tokio::spawn(async move { entry.tool.call(input, &ctx).await });
    wait_for("the call in flight", Duration::from_secs(10), || {
        client.server_status("fx").unwrap().counters.calls == base + 1
    })
    .await;
    // The upstream's handler runs (the Python SDK ignores a cancellation that arrives before
    // the handler has started).
    wait_for(
        "the upstream to run the call",
        Duration::from_secs(10),
        || started.exists(),
    )
    .await;
    let _ = std::fs::remove_file(&started);
    cancel.cancel();
    let env = within(Duration::from_secs(5), task).await.unwrap().unwrap();
    assert_eq!(env.err_kind(), Some(&ErrKind::Cancelled), "{env:?}");
    // The upstream got notifications/cancelled and stopped the work.
    wait_for(
        "the upstream to see the cancellation",
        Duration::from_secs(10),
        || marker.exists(),
    )
    .await;
    let _ = std::fs::remove_file(&marker);
    let env = call(&catalog, "mcp__fx__echo", json!({"text": "still here"})).await;
    assert!(text_of(&env).contains("still here"));
    assert_eq!(client.server_status("fx").unwrap().counters.drops, 0);
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_answers_and_keeps_the_connection_stdio() {
    cancellation_answers_and_keeps_the_connection(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_answers_and_keeps_the_connection_http() {
    cancellation_answers_and_keeps_the_connection(true).await;
}

/// A caller that stops waiting before the call timeout (the dispatcher's 30 s against the
/// client's 120 s) drops the call's future: the upstream is told all the same, for a tool
/// call and for a prompt being rendered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stdio_request_is_cancelled_upstream() {
    let (catalog, client) = start(&[fixture_server("fx", "normal").required()], fast_options());
    ready(&client).await;
    let entry = catalog.lookup("mcp__fx__sleep").unwrap();
    let marker = |what: &str| {
        let m = std::env::temp_dir().join(format!("quiver-mcp-drop-{what}-{}", std::process::id()));
        let _ = std::fs::remove_file(&m);
        m
    };
    let tool_marker = marker("tool");
    let input = json!({"seconds": 30, "marker": tool_marker.display().to_string()});
    let ctx = CallContext::default();
    let mut running = Box::pin(entry.tool.call(input, &ctx));
    // Polled until the upstream runs it, then dropped unanswered.
    let tool_started = tool_marker.with_extension("started");
    tokio::select! {
        _ = &mut running => panic!("the sleep answered"),
        _ = wait_for("the call to run", Duration::from_secs(10), || tool_started.exists()) => {}
    }
    drop(running);
    wait_for(
        "the upstream to see the tool call cancelled",
        Duration::from_secs(20),
        || tool_marker.exists(),
    )
    .await;

    let prompt_marker = marker("prompt");
    let command = format!(
        "/mcp__fx__slow_greet seconds=30 marker={}",
        prompt_marker.display()
    );
    let started = prompt_marker.with_extension("started");
    let _ = std::fs::remove_file(&started);
    let anyone = CallContext::default();
    let mut expansion = Box::pin(client.expand_prompt(&command, &anyone));
    // Polled until the upstream is rendering the prompt, then dropped unanswered.
    tokio::select! {
        r = &mut expansion => panic!("the prompt answered: {r:?}"),
        _ = wait_for("the prompt being rendered", Duration::from_secs(10), || started.exists()) => {}
    }
    drop(expansion);
    wait_for(
        "the upstream to see the prompts/get cancelled",
        Duration::from_secs(20),
        || prompt_marker.exists(),
    )
    .await;
    let _ = std::fs::remove_file(&tool_marker);
    let _ = std::fs::remove_file(&prompt_marker);
    let _ = std::fs::remove_file(&started);
    let _ = std::fs::remove_file(&tool_started);
    let env = call(&catalog, "mcp__fx__echo", json!({"text": "still here"})).await;
    assert!(text_of(&env).contains("still here"), "{env:?}");
    close_and_check(&client).await;
}

struct Native(ToolSpec);

#[async_trait]
impl Tool for Native {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
        Ok(quiver_contract::Envelope::text("native"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_is_first_wins_and_reported() {
    let catalog = Arc::new(Catalog::new());
    catalog
        .register_in(
            "core",
            Arc::new(Native(ToolSpec::new("mcp__fx__echo", "Taken."))),
        )
        .unwrap();
    let client = McpClient::start(
        catalog.clone(),
        resolve(&[fixture_server("fx", "normal").required()]),
        fast_options(),
    );
    ready(&client).await;
    let report = client.register_report();
    assert_eq!(
        report.warning_lines(),
        vec!["mcp:fx: skipped duplicate tool name(s) (1): mcp__fx__echo".to_owned()]
    );
    assert_eq!(&*catalog.lookup("mcp__fx__echo").unwrap().family, "core");
    close_and_check(&client).await;
    assert!(
        catalog.contains("mcp__fx__echo"),
        "close leaves other families alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_never_carry_headers_to_another_origin() {
    // B records whether anything reaches it; A redirects every request to B.
    let b = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b_addr = b.local_addr().unwrap();
    let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a_addr = a.local_addr().unwrap();
    let redirector = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = a.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 8192];
            let _ = s.read(&mut buf).await;
            let resp = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{b_addr}/mcp\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = s.write_all(resp.as_bytes()).await;
        }
    });
    let server = ServerConfig::http("redir", format!("http://{a_addr}/mcp"))
        .with_header("X-Api-Key", "configured-secret");
    let servers = quiver_mcp_adapter::validate_all(&[server], &|k| {
        (k == "MCP_REDIR_TOKEN").then(|| "bearer-secret".to_owned())
    })
    .unwrap();
    let catalog = Arc::new(Catalog::new());
    let client = McpClient::start(catalog, servers, fast_options());
    wait_for("a refused attempt", Duration::from_secs(20), || {
        client.server_status("redir").unwrap().counters.dials >= 2
    })
    .await;
    assert_ne!(
        client.server_status("redir").unwrap().state,
        ServerState::Connected
    );
    // Nothing ever connected to B.
    let reached_b = tokio::time::timeout(Duration::from_millis(1), b.accept()).await;
    assert!(
        reached_b.is_err(),
        "a request followed the redirect to another origin"
    );
    close_and_check(&client).await;
    redirector.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_is_a_rejection_and_the_token_is_a_bearer() {
    // A server that records the first request and answers 401.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 16384];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ = seen_tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = s
                .write_all(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"mcp\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
        }
    });
    let servers = quiver_mcp_adapter::validate_all(
        &[ServerConfig::http("locked", format!("http://{addr}/mcp"))
            .with_header("X-Team", "blue")
            .required()],
        &|k| (k == "MCP_LOCKED_TOKEN").then(|| "tok-123".to_owned()),
    )
    .unwrap();
    let client = McpClient::start(Arc::new(Catalog::new()), servers, fast_options());
    let err = within(
        Duration::from_secs(30),
        client.wait_ready(Duration::from_secs(30)),
    )
    .await
    .unwrap_err();
    // It names the variable the token came from, not a placeholder.
    assert!(
        err.to_string().contains("unauthorized")
            && err
                .to_string()
                .contains("did not accept the bearer token from `MCP_LOCKED_TOKEN`"),
        "{err}"
    );
    assert_eq!(
        client.server_status("locked").unwrap().counters.dials,
        1,
        "a rejection stops retries"
    );
    let request = within(Duration::from_secs(5), seen_rx.recv())
        .await
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        request.contains("authorization: bearer tok-123"),
        "{request}"
    );
    assert!(request.contains("x-team: blue"), "{request}");
    close_and_check(&client).await;
    server.abort();
}

/// Two servers serving a prompt of the same bare name (`bare_prompts`): the first serves it
/// to a caller that may reach both, and a caller limited to the second is served by the
/// second, before and after the first caller's listing (which keeps every owner of the
/// name, in server order); a caller limited to neither is told it is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_prompt_is_served_by_the_first_server_the_caller_reaches() {
    use quiver_contract::Capabilities;
    use quiver_mcp_adapter::{ContentError, ContentSource};

    let signed = |name: &str| {
        let mut cfg = ServerConfig::stdio(
            name,
            crate::python(),
            vec![crate::fixture(), "--greeting".into(), name.into()],
        )
        .required();
        cfg.bare_prompts = true;
        cfg
    };
    let (_catalog, client) = start(&[signed("fx"), signed("fy")], fast_options());
    ready(&client).await;
    let only = |server: &str| {
        CallContext::default()
            .with_capabilities(Capabilities::all().with_allowed_servers(vec![server.into()]))
    };
    let greet = async |ctx: &CallContext| {
        let args = json!({"name": "Ada"}).as_object().cloned();
        within(
            Duration::from_secs(30),
            client.get_prompt("greet", args, ctx),
        )
        .await
        .map(|got| {
            got["messages"][0]["content"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
    };
    let all = CallContext::default();
    let (fx, fy) = (only("fx"), only("fy"));
    let served_by = async |cases: &[(&CallContext, &str)]| {
        for (ctx, who) in cases {
            let text = greet(ctx).await.unwrap();
            assert_eq!(
                text,
                format!("Please greet Ada warmly. ({who})"),
                "{:?}",
                ctx.capabilities
            );
        }
    };
    // Before anyone listed: the caller's own first server renders it.
    served_by(&[(&fy, "fy")]).await;
    let list = async |caps: &Capabilities| {
        within(Duration::from_secs(30), client.list_prompts(caps))
            .await
            .unwrap()
    };
    let prompts = list(&Capabilities::all()).await;
    let greets = prompts.iter().filter(|p| p["name"] == "greet").count();
    assert_eq!(greets, 1, "one bare `greet`, fx's: {prompts:?}");
    served_by(&[(&all, "fx"), (&fy, "fy"), (&fx, "fx")]).await;
    // fy's caller lists (only fy's names are replaced), and fx still serves the others.
    let theirs = list(&fy.capabilities).await;
    assert!(theirs.iter().any(|p| p["name"] == "greet"), "{theirs:?}");
    served_by(&[(&all, "fx"), (&fy, "fy")]).await;
    let refused = greet(&only("nobody")).await;
    assert!(
        matches!(&refused, Err(ContentError::NotFound(m)) if m.contains("unknown prompt")),
        "{refused:?}"
    );
    close_and_check(&client).await;
}

/// What `quiver serve` passes through (the `ContentSource` side of the client) follows each
/// server's `resources` / `prompts` switches, prefixes prompts unless `bare_prompts`, and
/// routes a read or a prompt to the server that owns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_follows_the_resources_and_prompts_switches() {
    use quiver_mcp_adapter::{ContentError, ContentSource};

    let everything = |name: &str| {
        ServerConfig::stdio(name, "node", vec![crate::everything_js(), "stdio".into()]).required()
    };
    let mut docs = everything("docs");
    docs.prompts = false;
    let mut chat = everything("chat");
    chat.resources = false;
    chat.bare_prompts = true;
    let (_catalog, client) = start(&[docs, chat], fast_options());
    ready(&client).await;

    let offer = client.offer();
    assert!(offer.resources && offer.subscribe && offer.prompts && offer.completions);

    let resources = within(
        Duration::from_secs(30),
        client.list_resources(&quiver_contract::Capabilities::all()),
    )
    .await
    .unwrap();
    let uris: Vec<&str> = resources.iter().filter_map(|r| r["uri"].as_str()).collect();
    let unique: std::collections::BTreeSet<&str> = uris.iter().copied().collect();
    assert!(!uris.is_empty(), "{resources:?}");
    assert_eq!(
        uris.len(),
        unique.len(),
        "only docs lists resources: {uris:?}"
    );
    let read = within(
        Duration::from_secs(30),
        client.read_resource(uris[0], &CallContext::default()),
    )
    .await
    .unwrap();
    assert_eq!(read["contents"][0]["uri"], uris[0], "{read}");

    let prompts = within(
        Duration::from_secs(30),
        client.list_prompts(&quiver_contract::Capabilities::all()),
    )
    .await
    .unwrap();
    let names: Vec<&str> = prompts.iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(
        names.contains(&"simple-prompt"),
        "chat's prompts are bare: {names:?}"
    );
    assert!(
        !names.iter().any(|n| n.starts_with("mcp__")),
        "docs offers no prompts: {names:?}"
    );
    let got = within(
        Duration::from_secs(30),
        client.get_prompt("simple-prompt", None, &CallContext::default()),
    )
    .await
    .unwrap();
    assert!(got["messages"][0]["content"]["text"].is_string(), "{got}");
    let refused = within(
        Duration::from_secs(30),
        client.get_prompt("mcp__docs__simple-prompt", None, &CallContext::default()),
    )
    .await;
    assert!(
        matches!(&refused, Err(ContentError::NotFound(m)) if m.contains("unknown prompt")),
        "{refused:?}"
    );
    close_and_check(&client).await;

    let mut quiet = everything("quiet");
    quiet.resources = false;
    quiet.prompts = false;
    let (_catalog, client) = start(&[quiet], fast_options());
    ready(&client).await;
    assert!(!client.offer().any(), "nothing to pass through");
    let read = client
        .read_resource(
            "demo://resource/static/document/features.md",
            &CallContext::default(),
        )
        .await;
    assert!(
        matches!(&read, Err(ContentError::NotFound(m)) if m.contains("no upstream MCP server shares resources")),
        "{read:?}"
    );
    close_and_check(&client).await;
}

/// The list cap holds for each server, not for all of them together: a server with more
/// resources than the cap does not starve the next one of its listing (nor of its reads,
/// which the listing routes), and a URI past the cap of the one server whose list was cut
/// is read from that server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_resource_list_starves_no_other_server() {
    use quiver_mcp_adapter::ContentSource;

    let docs = ServerConfig::stdio("docs", "node", vec![crate::everything_js(), "stdio".into()])
        .required();
    let fx = fixture_server("fx", "normal").required();
    let mut opts = fast_options();
    opts.list_cap = 2;
    let (_catalog, client) = start(&[docs, fx], opts);
    ready(&client).await;
    let resources = within(
        Duration::from_secs(30),
        client.list_resources(&quiver_contract::Capabilities::all()),
    )
    .await
    .unwrap();
    let uris: Vec<&str> = resources.iter().filter_map(|r| r["uri"].as_str()).collect();
    let (of_docs, of_fx): (Vec<&str>, Vec<&str>) =
        uris.iter().partition(|u| u.starts_with("demo://"));
    assert_eq!(of_docs.len(), 2, "docs' list is cut at the cap: {uris:?}");
    assert!(!of_fx.is_empty(), "fx's resources are listed too: {uris:?}");
    let read = within(
        Duration::from_secs(30),
        client.read_resource(of_fx[0], &CallContext::default()),
    )
    .await
    .unwrap();
    assert_eq!(read["contents"][0]["uri"], of_fx[0], "{read}");
    // A document of docs' that its cut listing left out is still docs' to read.
    let past = [
        "features.md",
        "architecture.md",
        "extension.md",
        "how-it-works.md",
    ]
    .map(|f| format!("demo://resource/static/document/{f}"))
    .into_iter()
    .find(|u| !uris.contains(&u.as_str()))
    .expect("a document past the cap");
    let read = within(
        Duration::from_secs(30),
        client.read_resource(&past, &CallContext::default()),
    )
    .await
    .unwrap();
    assert_eq!(read["contents"][0]["uri"], past.as_str(), "{read}");
    close_and_check(&client).await;
}
