//! A reload of a built app's configuration: what applies to the next call, and what a file
//! that does not check leaves alone.

use quiver_contract::CallContext;
use serde_json::json;

/// Policy rules added by a reload apply to the next call; a broken file then changes
/// nothing (the rules in force stay) and says why, naming the file; a section read only at
/// start is reported as needing a restart.
#[tokio::test]
async fn a_reload_replaces_the_policy_rules_and_a_broken_file_changes_nothing() {
    let dir = crate::Scratch::new("reload-policy");
    let file = dir.join("quiver.toml");
    std::fs::write(&file, "[store]\npath = \"q.db\"\n").unwrap();
    let (config, _) = quiver_host::Config::load(Some(&file)).unwrap();
    let app = quiver_host::App::build(&config, &[]).await.unwrap();
    let reloader = app.reloader(&config);
    let search = || {
        app.dispatcher.call(
            "tool_search",
            json!({"query": "anything"}),
            CallContext::for_session("s"),
        )
    };
    assert!(search().await.is_ok(), "no rule yet");

    std::fs::write(
        &file,
        "[store]\npath = \"q.db\"\n\n[[policy.rules]]\nid = \"no-search\"\ntool = \"tool_search\"\naction = \"deny\"\nmessage = \"searching is off today\"\n",
    )
    .unwrap();
    let report = reloader.reload("test").await.expect("a good file reloads");
    assert_eq!(report["policy_changed"], true, "{report}");
    assert_eq!(report["needs_restart"], json!([]), "{report}");
    let denied = search().await;
    assert!(denied.is_err(), "{denied:?}");
    assert!(
        format!("{denied:?}").contains("searching is off today"),
        "{denied:?}"
    );

    std::fs::write(&file, "[store]\npath = \"q.db\"\n[[policy.rules]\n").unwrap();
    let refused = reloader.reload("test").await.expect_err("a broken file");
    let why = refused["error"].as_str().unwrap_or_default();
    assert!(why.contains("quiver.toml"), "names the file: {refused}");
    assert!(search().await.is_err(), "the rules in force stay");

    std::fs::write(
        &file,
        "[store]\npath = \"q.db\"\n\n[limits]\nmax_result_chars = 5000\nmax_http_sessions = 50\n",
    )
    .unwrap();
    let report = reloader.reload("test").await.expect("a good file reloads");
    // The dispatcher's limits apply now; the HTTP server's are read at start.
    assert_eq!(report["limits_changed"], true, "{report}");
    assert_eq!(
        report["needs_restart"],
        json!(["limits.max_http_sessions, limits.input_wait_secs"]),
        "{report}"
    );
    assert!(search().await.is_ok(), "the rule is gone");
    let status = std::fs::read_to_string(quiver_host::reload::report_file(
        &config.store.path,
        std::process::id(),
    ))
    .expect("this process's report file");
    assert!(
        status.contains("\"needs_restart\":[\"limits.max_http_sessions, limits.input_wait_secs\"]"),
        "{status}"
    );

    // Trace export is set up at start, before logging: a change waits for a restart.
    std::fs::write(
        &file,
        "[store]\npath = \"q.db\"\n\n[limits]\nmax_result_chars = 5000\nmax_http_sessions = 50\n\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\n",
    )
    .unwrap();
    let report = reloader.reload("test").await.expect("a good file reloads");
    // Compared with what the server started with: the sessions cap is still to apply.
    assert_eq!(
        report["needs_restart"],
        json!([
            "limits.max_http_sessions, limits.input_wait_secs",
            "telemetry"
        ]),
        "{report}"
    );

    // The retriever is built at start: a model folder named later waits for a restart.
    std::fs::write(
        &file,
        "[store]\npath = \"q.db\"\n\n[limits]\nmax_result_chars = 5000\n\n[search]\nmodel_dir = \"models\"\n",
    )
    .unwrap();
    let report = reloader.reload("test").await.expect("a good file reloads");
    assert_eq!(report["needs_restart"], json!(["search"]), "{report}");

    // Both undone: the file is again what the server runs, and no restart is due.
    std::fs::write(
        &file,
        "[store]\npath = \"q.db\"\n\n[limits]\nmax_result_chars = 5000\n",
    )
    .unwrap();
    let report = reloader.reload("test").await.expect("a good file reloads");
    assert_eq!(report["needs_restart"], json!([]), "{report}");
    app.shutdown().await.unwrap();
}

/// A server a reload adds is logged as it settles, as at start-up: one whose command cannot
/// start is a warning naming it and why (the reload's own report is written before it
/// tries).
#[tokio::test]
async fn a_server_a_reload_adds_is_logged_as_it_settles() {
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let _logs = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .finish(),
    );
    let dir = crate::Scratch::new("reload-server");
    let file = dir.join("quiver.toml");
    std::fs::write(&file, "[store]\npath = \"q.db\"\n").unwrap();
    let (config, _) = quiver_host::Config::load(Some(&file)).unwrap();
    let app = quiver_host::App::build(&config, &[]).await.unwrap();
    let reloader = app.reloader(&config);
    std::fs::write(
        &file,
        "[store]\npath = \"q.db\"\n\n[[mcp.servers]]\nname = \"ghost\"\ncommand = \"/nonexistent/quiver-ghost\"\n",
    )
    .unwrap();
    let report = reloader.reload("test").await.expect("a good file reloads");
    assert_eq!(report["servers"]["added"], json!(["ghost"]), "{report}");
    let logged = || String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !logged().contains("upstream MCP server ghost (from a reload): down") {
        assert!(
            std::time::Instant::now() < deadline,
            "no line for ghost: {}",
            logged()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(logged().contains("quiver-ghost"), "{}", logged());
    app.shutdown().await.unwrap();
}

/// A token's `admin = true` taken away by a reload takes `create_custom_tool` away from it
/// at the next call, and the reload reports the tokens replaced; giving it to a server that
/// started with no admin token is reported as needing a restart (the tool exists only in a
/// server started with one).
#[tokio::test]
async fn a_reload_that_revokes_admin_takes_custom_tool_proposals_away() {
    let dir = crate::Scratch::new("reload-admin");
    let file = dir.join("quiver.toml");
    let tokens = |admin: bool| {
        format!(
            "[store]\npath = \"q.db\"\n\n[[auth.tokens]]\nname = \"author\"\ntoken = \"author-secret-0123456789\"\nadmin = {admin}\n"
        )
    };
    std::fs::write(&file, tokens(true)).unwrap();
    let (config, _) = quiver_host::Config::load(Some(&file)).unwrap();
    let app = quiver_host::App::build(&config, &[]).await.unwrap();
    let reloader = app.reloader(&config);
    let propose = || {
        app.dispatcher.call(
            "create_custom_tool",
            json!({"name": "double_it", "description": "Doubles a number. Use it when asked to double one.",
                "input_schema": {"type": "object", "properties": {"n": {"type": "number", "description": "The number."}}, "required": ["n"]},
                "source": "async function main(inputs) { return inputs.n * 2 }"}),
            CallContext::for_session("s").with_principal("author"),
        )
    };
    let first = propose().await;
    assert!(
        !format!("{first:?}").contains("only a session whose token is marked admin"),
        "an admin proposes: {first:?}"
    );

    std::fs::write(&file, tokens(false)).unwrap();
    let report = reloader.reload("test").await.expect("a good file reloads");
    assert_eq!(
        report["auth_changed"], false,
        "no HTTP tokens here: {report}"
    );
    let refused = format!("{:?}", propose().await);
    assert!(
        refused.contains("only a session whose token is marked admin may propose custom tools"),
        "{refused}"
    );

    // A server that started with no admin token has no `create_custom_tool` to give.
    let dir = crate::Scratch::new("reload-admin-grant");
    let file = dir.join("quiver.toml");
    std::fs::write(&file, tokens(false)).unwrap();
    let (config, _) = quiver_host::Config::load(Some(&file)).unwrap();
    let app = quiver_host::App::build(&config, &[]).await.unwrap();
    let reloader = app.reloader(&config);
    std::fs::write(&file, tokens(true)).unwrap();
    let report = reloader.reload("test").await.expect("a good file reloads");
    assert!(
        report["needs_restart"]
            .to_string()
            .contains("create_custom_tool exists only in a server started with an admin token"),
        "{report}"
    );
}
