//! Fault cases against the fixture server. Every call is answered, nothing panics, every
//! child is reaped.

use std::time::Duration;

use quiver_contract::{CallContext, Envelope, ErrKind};
use quiver_mcp_adapter::{McpError, ServerConfig, ServerState};
use serde_json::json;

use crate::{
    call, close_and_check, fast_options, fixture, fixture_server, python, ready, start, text_of,
    wait_for, within,
};

fn reconnecting_lines(client: &quiver_mcp_adapter::McpClient, name: &str) -> usize {
    client
        .server_status(name)
        .unwrap()
        .diagnostics
        .iter()
        .filter(|l| l.as_str() == "reconnecting")
        .count()
}

fn kill9(pid: &str) {
    let st = std::process::Command::new("kill")
        .args(["-9", pid])
        .status()
        .unwrap();
    assert!(st.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_call_is_never_replayed() {
    let (catalog, client) = start(&[fixture_server("fx", "normal").required()], fast_options());
    ready(&client).await;
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__fx__die", json!({})),
    )
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable), "{env:?}");
    assert_eq!(
        env.message().unwrap(),
        "MCP server \"fx\" stopped while `mcp__fx__die` was running (the server process exited with code 1); whether the call finished is unknown. Quiver restarts the server: check before calling again if the tool changes anything."
    );
    wait_for("reconnect", Duration::from_secs(30), || {
        client.server_status("fx").unwrap().counters.connects == 2
    })
    .await;
    let env = call(&catalog, "mcp__fx__echo", json!({"text": "again"})).await;
    assert!(text_of(&env).contains("again"), "{env:?}");
    assert_eq!(reconnecting_lines(&client, "fx"), 1);
    close_and_check(&client).await;
}

/// A server that exits while a process it started still holds its stdout: the exit is
/// seen at once (nothing ever closes the pipe), the call is answered with how the server
/// ended, the process it left is killed with its group, and the next call reaches a new
/// server. Before, the call and every later one waited out their timeouts on the dead pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_leaving_its_pipes_open_is_seen_at_once() {
    let server = fixture_server("fx", "normal")
        .required()
        .with_call_timeout(Duration::from_secs(120));
    let (catalog, client) = start(&[server], fast_options());
    ready(&client).await;
    let marker = std::env::temp_dir().join(format!("quiver-leftover-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let env = within(
        Duration::from_secs(60),
        call(
            &catalog,
            "mcp__fx__die_leaving_child",
            json!({"marker": marker.to_string_lossy()}),
        ),
    )
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable), "{env:?}");
    assert!(
        env.message().unwrap().contains(
            "stopped while `mcp__fx__die_leaving_child` was running (the server process exited with code 5)"
        ),
        "{env:?}"
    );
    let leftover = std::fs::read_to_string(&marker).expect("the leftover process started");
    let _ = std::fs::remove_file(&marker);
    wait_for(
        "the leftover process killed",
        Duration::from_secs(10),
        || {
            // Gone, or a zombie waiting for the init process to reap it.
            std::fs::read_to_string(format!("/proc/{}/stat", leftover.trim())).map_or(
                true,
                |stat| {
                    stat.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                },
            )
        },
    )
    .await;
    let env = within(
        Duration::from_secs(60),
        call(&catalog, "mcp__fx__echo", json!({"text": "again"})),
    )
    .await;
    assert!(text_of(&env).contains("again"), "{env:?}");
    close_and_check(&client).await;
}

/// A call made while its server is reconnecting, and whose reconnect takes longer than the
/// call may, is answered before its own limit with "not sent". Before, it waited for the
/// connect timeout, and the dispatcher's timeout answered first, saying the call was
/// abandoned when it had never been sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_a_reconnect_is_answered_within_its_limit() {
    let flag = std::env::temp_dir().join(format!("quiver-hang-restart-{}", std::process::id()));
    let _ = std::fs::remove_file(&flag);
    let server = ServerConfig::stdio(
        "fx",
        python(),
        vec![
            fixture(),
            "normal".to_owned(),
            "--hang-if-file".to_owned(),
            flag.to_string_lossy().into_owned(),
        ],
    )
    .required()
    .with_call_timeout(Duration::from_secs(3));
    let opts = fast_options().with_connect_timeout(Duration::from_secs(120));
    let (catalog, client) = start(&[server], opts);
    ready(&client).await;
    std::fs::write(&flag, "hang").unwrap();
    let env = within(
        Duration::from_secs(60),
        call(&catalog, "mcp__fx__die", json!({})),
    )
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable), "{env:?}");
    let env = within(
        Duration::from_secs(60),
        call(&catalog, "mcp__fx__echo", json!({"text": "x"})),
    )
    .await;
    let _ = std::fs::remove_file(&flag);
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable), "{env:?}");
    assert!(
        env.message()
            .unwrap()
            .contains("is reconnecting and was not back within 2.7 s; the call was not sent"),
        "{env:?}"
    );
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_server_reconnects_once() {
    let (catalog, client) = start(&[fixture_server("fx", "normal").required()], fast_options());
    ready(&client).await;
    let pid = text_of(&call(&catalog, "mcp__fx__pid", json!({})).await);
    let pid = pid.trim_matches(|c: char| !c.is_ascii_digit()).to_owned();
    kill9(&pid);
    // The restart is observed (the child's stdout closes) before the next call is made; a
    // call racing the kill itself may have been written to the dying child and is then
    // answered "outcome is unknown" (see killed_mid_call_is_never_replayed).
    wait_for("the drop to be seen", Duration::from_secs(10), || {
        client.server_status("fx").unwrap().counters.drops == 1
    })
    .await;
    let env = within(
        Duration::from_secs(30),
        call(&catalog, "mcp__fx__echo", json!({"text": "back"})),
    )
    .await;
    // Either this call shared the reconnect, or it found the server already back.
    assert!(text_of(&env).contains("back"), "{env:?}");
    let st = client.server_status("fx").unwrap();
    assert_eq!(st.counters.dials, 2, "{st:?}");
    assert_eq!(reconnecting_lines(&client, "fx"), 1, "{:?}", st.diagnostics);
    close_and_check(&client).await;
}

/// Why a name under a server's prefix is missing: a server that never connected is named
/// (the dispatcher answers `not_available`), the longest matching prefix wins, and a server
/// that has listed its tools is not blamed for a name it never listed (a typo stays an
/// unknown tool, with look-alikes), even while it is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_names_are_explained_only_by_a_server_that_never_listed() {
    let mut git = ServerConfig::stdio("git", "/nonexistent/quiver-git", vec![]);
    git.prompts = true;
    let (catalog, client) = start(
        &[
            fixture_server("fx", "normal"),
            git,
            ServerConfig::stdio("git_", "/nonexistent/quiver-git-", vec![]),
        ],
        fast_options(),
    );
    wait_for("fx to connect", Duration::from_secs(30), || {
        client
            .server_status("fx")
            .is_some_and(|s| s.state == ServerState::Connected)
    })
    .await;
    let why = catalog
        .why_absent("mcp__git__status")
        .expect("git explains");
    assert!(why.contains("MCP server \"git\""), "{why}");
    let why = catalog
        .why_absent("mcp__git___status")
        .expect("git_ explains");
    assert!(why.contains("MCP server \"git_\""), "{why}");
    // A prompt of a server whose command cannot start gets the tool call's wording, not
    // "try again shortly".
    wait_for("git's start to fail", Duration::from_secs(10), || {
        catalog
            .why_absent("mcp__git__status")
            .is_some_and(|w| w.contains("cannot be started"))
    })
    .await;
    let prompt = quiver_mcp_adapter::ContentSource::get_prompt(
        &client,
        "mcp__git__review",
        None,
        &CallContext::default(),
    )
    .await;
    assert!(
        matches!(&prompt, Err(quiver_mcp_adapter::ContentError::Unavailable(m)) if m.contains("cannot be started") && !m.contains("try again")),
        "{prompt:?}"
    );
    assert_eq!(catalog.why_absent("mcp__fx__typo"), None);
    let pid = text_of(&call(&catalog, "mcp__fx__pid", json!({})).await);
    kill9(pid.trim_matches(|c: char| !c.is_ascii_digit()));
    wait_for("the drop to be seen", Duration::from_secs(10), || {
        client.server_status("fx").unwrap().counters.drops == 1
    })
    .await;
    assert_eq!(catalog.why_absent("mcp__fx__typo"), None);
    assert_eq!(catalog.why_absent("mcp__other__x"), None);
    close_and_check(&client).await;
}

/// Kills the child when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// tests/fixtures/status_server.py started: its MCP URL, and the process (killed when
/// dropped).
fn status_server() -> (String, Killed) {
    use std::io::BufRead;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/status_server.py"
    );
    let mut child = std::process::Command::new(python())
        .arg(script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python starts");
    let stdout = child.stdout.take().expect("piped");
    let child = Killed(child);
    let mut port = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut port)
        .expect("the port");
    (format!("http://127.0.0.1:{}/mcp", port.trim()), child)
}

/// A `tools/call` the upstream refuses over HTTP is answered once, with the status, as not
/// run: 401 and 403 say the credentials are the operator's to fix, 429 says when to try
/// again, and a 301 (which would make the POST a GET) is not followed. Each was sent a
/// second time through rmcp and then reported as a broken stream whose outcome was unknown.
/// A 5xx names its status (it said only "could not complete the request"). A 307 (which
/// keeps the method and body) is followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_refusals_are_reported_with_their_status_and_not_resent() {
    let (url, child) = status_server();
    let (catalog, client) = start(&[ServerConfig::http("st", url).required()], fast_options());
    ready(&client).await;
    for (tool, says) in [
        (
            "s401",
            "with HTTP 401 Unauthorized: Quiver's credentials for it",
        ),
        ("s403", "with HTTP 403 Forbidden"),
        (
            "s429",
            "(HTTP 429 Too Many Requests); `s429` was not run. Try again in 7 s",
        ),
        (
            "redir301",
            "with HTTP 301 Moved Permanently; the call was not run",
        ),
        (
            "s503",
            "failed `s503` with HTTP 503 Service Unavailable; whether the call ran is unknown, so it was not sent again. Try again in 3 s",
        ),
    ] {
        let env = within(
            Duration::from_secs(30),
            call(&catalog, &format!("mcp__st__{tool}"), json!({})),
        )
        .await;
        assert_eq!(
            env.err_kind(),
            Some(&ErrKind::NotAvailable),
            "{tool}: {env:?}"
        );
        assert!(env.message().unwrap().contains(says), "{tool}: {env:?}");
    }
    // A 400 or 404 the direct path hands to rmcp (a session the server may no longer know),
    // which gives up (a 404: after a new session and a resend, to a 404 again): the server
    // is there (the ping says so), so the status is reported as a refusal, not as an answer
    // lost on the way ("the response stream broke").
    for (tool, status) in [("s400", "400 Bad Request"), ("s404", "404 Not Found")] {
        let env = within(
            Duration::from_secs(30),
            call(&catalog, &format!("mcp__st__{tool}"), json!({})),
        )
        .await;
        assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable), "{env:?}");
        assert!(
            env.message().unwrap().contains(&format!(
                "refused `{tool}` with HTTP {status}; the call was not run"
            )),
            "{env:?}"
        );
    }
    // An answer that is not JSON-RPC says what it was, and that the tool may have run.
    let env = call(&catalog, "mcp__st__html200", json!({})).await;
    assert_eq!(env.err_kind(), Some(&ErrKind::ToolFailed), "{env:?}");
    assert!(
        env.message().unwrap().contains(
            "answered `html200`, but the answer cannot be used: HTTP 200 OK with text/html, not a JSON-RPC answer. The tool may have run"
        ),
        "{env:?}"
    );
    // A JSON body that is not the answer says which way it is not.
    for (tool, says) in [
        (
            "empty200",
            "HTTP 200 OK with application/json, an empty body. The tool may have run",
        ),
        (
            "badutf8",
            "HTTP 200 OK with application/json, a body that is not UTF-8 text (byte 33 is not), so not JSON. The tool may have run",
        ),
        (
            "badjson",
            "HTTP 200 OK with application/json, a body that is not JSON (EOF while parsing a value at line 1 column 25). The tool may have run",
        ),
        (
            "notrpc",
            "HTTP 200 OK with application/json, JSON that is not a JSON-RPC message (not an object). The tool may have run",
        ),
        (
            "badtype",
            "HTTP 200 OK with application/json, JSON that is not a JSON-RPC message (a member of the wrong type). The tool may have run",
        ),
        (
            "otherid",
            "HTTP 200 OK with application/json, a JSON-RPC message that is not the answer to this call (no result or error for its id, it answers id \"not-yours\"). The tool may have run",
        ),
    ] {
        let env = call(&catalog, &format!("mcp__st__{tool}"), json!({})).await;
        assert_eq!(env.err_kind(), Some(&ErrKind::ToolFailed), "{env:?}");
        let message = env.message().unwrap();
        assert!(
            message.contains(&format!(
                "answered `{tool}`, but the answer cannot be used: {says}"
            )),
            "{tool}: {message}"
        );
    }
    let env = call(&catalog, "mcp__st__redir307", json!({})).await;
    assert!(text_of(&env).contains("redir307 ran"), "{env:?}");
    let counts = text_of(&call(&catalog, "mcp__st__count", json!({})).await);
    let counts: serde_json::Value = serde_json::from_str(
        &counts[counts.find('{').expect("json")..=counts.rfind('}').expect("json")],
    )
    .unwrap();
    for tool in ["s401", "s403", "s429", "s503", "redir301"] {
        assert_eq!(
            counts[tool],
            json!(1),
            "{tool} sent more than once: {counts}"
        );
    }
    close_and_check(&client).await;
    drop(child);
}

/// A server that answers every call with another id fails each call with the reason, but
/// the operator's log says so once per connection (and again at the 10th), not once per
/// call.
#[tokio::test(flavor = "current_thread")]
async fn answers_to_other_ids_are_warned_of_once_per_connection() {
    use std::io::Write;
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let (url, child) = status_server();
    let (catalog, client) = start(&[ServerConfig::http("st", url).required()], fast_options());
    ready(&client).await;
    // The calls run in this task (the direct path drives its connection in the caller's task):
    // this thread's subscriber sees their log.
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    for _ in 0..12 {
        let env = call(&catalog, "mcp__st__otherid", json!({})).await;
        assert_eq!(env.err_kind(), Some(&ErrKind::ToolFailed), "{env:?}");
        assert!(
            env.message()
                .unwrap()
                .contains("it answers id \"not-yours\""),
            "{env:?}"
        );
    }
    drop(guard);
    let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 2, "{log}");
    assert!(
        warnings[0].contains("it answers id \"not-yours\"")
            && warnings[0].contains("said once per connection"),
        "{log}"
    );
    assert!(
        warnings[1].contains("10 tools/call answers on this connection could not be used"),
        "{log}"
    );
    close_and_check(&client).await;
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_call_times_out_clearly() {
    let (catalog, client) = start(&[fixture_server("fx", "normal").required()], fast_options());
    ready(&client).await;
    // Only the hung call has a short limit (its caller's deadline): the echo after it is
    // not raced against the cancelled call's unwinding.
    let entry = catalog.lookup("mcp__fx__sleep").unwrap();
    let ctx = CallContext::default()
        .with_deadline(std::time::Instant::now() + Duration::from_millis(500));
    let env = within(Duration::from_secs(10), async {
        match entry.tool.call(json!({"seconds": 30}), &ctx).await {
            Ok(env) => env,
            Err(e) => Envelope::from(e),
        }
    })
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::Timeout), "{env:?}");
    assert!(
        env.message().unwrap().contains("did not answer `sleep`"),
        "{env:?}"
    );
    // Abandoned is not undone: a tool that is not read-only may have run (the
    // dispatcher's own timeout says so too).
    assert!(
        env.message()
            .unwrap()
            .contains("cancelled upstream. It may have run, or still be running: check its effect before calling it again."),
        "{env:?}"
    );
    // A timeout is not a drop: the connection keeps serving.
    let env = call(&catalog, "mcp__fx__echo", json!({"text": "alive"})).await;
    assert!(text_of(&env).contains("alive"), "{env:?}");
    assert_eq!(client.server_status("fx").unwrap().counters.drops, 0);
    close_and_check(&client).await;
}

/// A server that answers with an id no request had leaves the call waiting out its limit
/// (the answer cannot be matched): the timeout says the server answered an id Quiver never
/// sent, so the operator knows where to look; a late answer to a request Quiver cancelled
/// is not such an answer. The connection goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_an_id_never_sent_is_named_in_the_timeout() {
    let (catalog, client) = start(&[raw("fx", &[])], fast_options());
    ready(&client).await;
    let timed = |name: &str, input: serde_json::Value, ms: u64| {
        let ctx = CallContext::default()
            .with_deadline(std::time::Instant::now() + Duration::from_millis(ms));
        let entry = catalog.lookup(name).unwrap();
        within(Duration::from_secs(10), async move {
            match entry.tool.call(input, &ctx).await {
                Ok(env) => env,
                Err(e) => Envelope::from(e),
            }
        })
    };
    let env = timed("mcp__fx__echo", json!({"misid": true}), 500).await;
    assert_eq!(env.err_kind(), Some(&ErrKind::Timeout), "{env:?}");
    assert!(
        env.message()
            .unwrap()
            .contains("meanwhile it answered request id 999999, which Quiver never sent"),
        "{env:?}"
    );
    // A call sent after that answer is not told of it; nor is one during which the late
    // answer to a call Quiver cancelled comes (this server runs one request at a time: the
    // second `sleep` waits behind the first, whose answer comes after its cancellation).
    let env = timed("mcp__fx__sleep", json!({"seconds": 1}), 300).await;
    assert_eq!(env.err_kind(), Some(&ErrKind::Timeout), "{env:?}");
    assert!(!env.message().unwrap().contains("never sent"), "{env:?}");
    let env = timed("mcp__fx__sleep", json!({"seconds": 1}), 1500).await;
    assert_eq!(env.err_kind(), Some(&ErrKind::Timeout), "{env:?}");
    assert!(!env.message().unwrap().contains("never sent"), "{env:?}");
    let env = call(&catalog, "mcp__fx__echo", json!({"text": "alive"})).await;
    assert!(text_of(&env).contains("alive"), "{env:?}");
    close_and_check(&client).await;
}

/// The caller's deadline (the dispatcher's `timeout_secs`, set by the operator) bounds an
/// upstream call, not the client's default `call_timeout`: a deadline longer than the
/// default is honoured (before, the call was cut at the default). A server's own
/// `call_timeout` still caps it, and a timeout names whole seconds or milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_deadline_outranks_the_default_call_timeout() {
    let (catalog, client) = start(
        &[
            fixture_server("fx", "normal").required(),
            fixture_server("capped", "normal")
                .with_call_timeout(Duration::from_millis(400))
                .required(),
        ],
        fast_options().with_call_timeout(Duration::from_millis(400)),
    );
    ready(&client).await;
    let with_deadline = |name: &'static str| {
        let entry = catalog.lookup(name).expect("listed");
        async move {
            let ctx = CallContext::default()
                .with_deadline(std::time::Instant::now() + Duration::from_secs(20));
            match entry.tool.call(json!({"seconds": 1.2}), &ctx).await {
                Ok(env) => env,
                Err(e) => Envelope::from(e),
            }
        }
    };
    let env = within(Duration::from_secs(30), with_deadline("mcp__fx__sleep")).await;
    assert_eq!(
        env.err_kind(),
        None,
        "cut at the default call_timeout: {env:?}"
    );
    let env = within(Duration::from_secs(30), with_deadline("mcp__capped__sleep")).await;
    assert_eq!(env.err_kind(), Some(&ErrKind::Timeout), "{env:?}");
    assert!(env.message().unwrap().contains("within 400 ms;"), "{env:?}");
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_servers_never_block_and_are_reaped() {
    let mut opts = fast_options();
    opts = opts.with_connect_timeout(Duration::from_secs(2));
    let (catalog, client) = start(
        &[
            fixture_server("crash", "crash"),
            fixture_server("garbage", "garbage"),
            fixture_server("noinit", "noinit"),
        ],
        opts,
    );
    // Adding returned at once; every server is retried in the background.
    wait_for("retries", Duration::from_secs(30), || {
        client.status().iter().all(|s| s.counters.dials >= 2)
    })
    .await;
    for s in client.status() {
        assert!(
            matches!(
                s.state,
                ServerState::Down | ServerState::Connecting | ServerState::Reconnecting
            ),
            "{s:?}"
        );
        assert!(s.tools.is_empty());
        assert_eq!(s.counters.connects, 0, "{s:?}");
    }
    assert!(catalog.is_empty());
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_server_rejection_stops_retries() {
    let (_catalog, client) = start(
        &[fixture_server("rej", "reject").required()],
        fast_options(),
    );
    let err = within(
        Duration::from_secs(30),
        client.wait_ready(Duration::from_secs(30)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, McpError::Rejected { server, reason } if server == "rej" && reason.contains("Unsupported protocol")),
        "{err}"
    );
    assert_eq!(client.server_status("rej").unwrap().counters.dials, 1);
    close_and_check(&client).await;

    // A required server that never answers is reported, not waited on forever. One that
    // exits when Quiver gives up on it and closes its input (`noinit-eof`) is not said to
    // have exited on its own ("the process exited with code 0" read as if it had quit).
    for mode in ["noinit", "noinit-eof"] {
        let (_catalog, client) = start(
            &[fixture_server("mute", mode).required()],
            fast_options().with_connect_timeout(Duration::from_secs(1)),
        );
        let err = within(
            Duration::from_secs(10),
            client.wait_ready(Duration::from_secs(3)),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, McpError::NotReady { .. }), "{mode}: {err}");
        let said = client.server_status("mute").unwrap().diagnostics.join("\n");
        assert!(
            said.contains("no answer to initialize within 1 s"),
            "{mode}: {said}"
        );
        assert!(!said.contains("exited"), "{mode}: {said}");
        close_and_check(&client).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_across_a_drop_share_one_dial() {
    let (catalog, client) = start(&[fixture_server("fx", "normal").required()], fast_options());
    ready(&client).await;
    let pid = text_of(&call(&catalog, "mcp__fx__pid", json!({})).await);
    let pid = pid.trim_matches(|c: char| !c.is_ascii_digit()).to_owned();
    let mut calls = Vec::new();
    let mut started = Vec::new();
    for i in 0..8 {
        let catalog = catalog.clone();
        let marker =
            std::env::temp_dir().join(format!("quiver-mcp-shared-dial-{}-{i}", std::process::id()));
        started.push(marker.with_extension("started"));
        let _ = std::fs::remove_file(started.last().unwrap());
        calls.push(tokio::spawn(async move {
            let input = json!({"seconds": 30, "marker": marker.display().to_string()});
            call(&catalog, "mcp__fx__sleep", input).await
        }));
    }
    // All 8 run upstream (counted calls may not all have been written to the pipe yet, and
    // one that was not is re-sent after the kill instead of failing).
    wait_for("8 calls running upstream", Duration::from_secs(30), || {
        started.iter().all(|p| p.exists())
    })
    .await;
    for p in &started {
        let _ = std::fs::remove_file(p);
    }
    kill9(&pid);
    for c in calls {
        let env = within(Duration::from_secs(20), c).await.unwrap();
        assert_eq!(
            env.message(),
            Some(
                "MCP server \"fx\" stopped while `mcp__fx__sleep` was running (the server process was killed by signal 9 (SIGKILL)); whether the call finished is unknown. Quiver restarts the server: check before calling again if the tool changes anything."
            ),
            "{env:?}"
        );
    }
    wait_for("reconnect", Duration::from_secs(30), || {
        client.server_status("fx").unwrap().state == ServerState::Connected
            && client.server_status("fx").unwrap().counters.connects == 2
    })
    .await;
    // 8 more at once right after a second kill: they share one dial too.
    let pid = text_of(&call(&catalog, "mcp__fx__pid", json!({})).await);
    kill9(pid.trim_matches(|c: char| !c.is_ascii_digit()));
    let mut calls = Vec::new();
    for i in 0..8 {
        let catalog = catalog.clone();
        calls.push(tokio::spawn(async move {
            call(&catalog, "mcp__fx__echo", json!({"text": format!("n{i}")})).await
        }));
    }
    for c in calls {
        let env = within(Duration::from_secs(30), c).await.unwrap();
        // Each is answered: through the shared reconnect, or at once if it arrived first.
        assert!(
            env.is_ok() || env.err_kind() == Some(&ErrKind::NotAvailable),
            "{env:?}"
        );
    }
    wait_for("second reconnect", Duration::from_secs(30), || {
        client.server_status("fx").unwrap().counters.connects == 3
    })
    .await;
    let st = client.server_status("fx").unwrap();
    assert_eq!(st.counters.dials, 3, "one dial per drop: {st:?}");
    assert_eq!(reconnecting_lines(&client, "fx"), 2, "{:?}", st.diagnostics);
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_at_start_comes_up_later() {
    let dir = std::env::temp_dir().join(format!("quiver-mcp-up-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let (catalog, client) = start(
        &[ServerConfig::stdio(
            "late",
            python(),
            vec![
                fixture(),
                "--require-file".into(),
                dir.display().to_string(),
            ],
        )],
        fast_options(),
    );
    wait_for("a failed attempt", Duration::from_secs(20), || {
        client.server_status("late").unwrap().state == ServerState::Down
    })
    .await;
    let env = call_missing(&client).await;
    assert_eq!(env, "not in catalog");
    std::fs::write(&dir, b"up").unwrap();
    wait_for("tools to appear", Duration::from_secs(30), || {
        catalog.contains("mcp__late__echo")
    })
    .await;
    let env = call(&catalog, "mcp__late__echo", json!({"text": "hi"})).await;
    assert!(text_of(&env).contains("hi"));
    let _ = std::fs::remove_file(&dir);
    close_and_check(&client).await;
}

async fn call_missing(client: &quiver_mcp_adapter::McpClient) -> &'static str {
    if client.server_status("late").unwrap().tools.is_empty() {
        "not in catalog"
    } else {
        "present"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_server_tools_stay_and_fail_at_once() {
    // Connect, then make every respawn fail: the tools stay, calls fail NotAvailable at once.
    let flag = std::env::temp_dir().join(format!("quiver-mcp-down-{}", std::process::id()));
    std::fs::write(&flag, b"up").unwrap();
    let (catalog, client) = start(
        &[ServerConfig::stdio(
            "fx",
            python(),
            vec![
                fixture(),
                "--require-file".into(),
                flag.display().to_string(),
            ],
        )
        .required()],
        fast_options(),
    );
    ready(&client).await;
    std::fs::remove_file(&flag).unwrap();
    let pid = text_of(&call(&catalog, "mcp__fx__pid", json!({})).await);
    kill9(pid.trim_matches(|c: char| !c.is_ascii_digit()));
    wait_for("down", Duration::from_secs(20), || {
        client.server_status("fx").unwrap().state == ServerState::Down
    })
    .await;
    assert!(catalog.contains("mcp__fx__echo"));
    let env = call(&catalog, "mcp__fx__echo", json!({"text": "x"})).await;
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable));
    // It says the server went down, why its last attempt failed, and when Quiver tries it
    // again.
    let message = env.message().unwrap();
    assert!(
        message.starts_with("MCP server \"fx\" went down (its last attempt: ")
            && message.contains("). Quiver tries it again in about ")
            && message.ends_with(" s: try again after that, or use another tool"),
        "{message}"
    );
    // The server's stderr is for its operator (`quiver status`), not the caller.
    assert!(!message.contains("stderr"), "{message}");
    // After three failed attempts in a row it no longer says to try again.
    wait_for("three failed attempts", Duration::from_secs(30), || {
        let s = client.server_status("fx").unwrap();
        s.counters.dials >= s.counters.connects + 3 && s.next_attempt.is_some()
    })
    .await;
    let env = call(&catalog, "mcp__fx__echo", json!({"text": "x"})).await;
    assert_eq!(env.err_kind(), Some(&ErrKind::NotAvailable));
    let message = env.message().unwrap();
    assert!(
        message.starts_with("MCP server \"fx\" went down, and the last ")
            && message.contains(
                " attempts to reach it failed: retrying will not help until an operator fixes it (`quiver status` says why). Use another tool"
            ),
        "{message}"
    );
    close_and_check(&client).await;
}

const HELPER: &str = "QUIVER_MCP_HOST_HELPER";

/// Not a test on its own: when `QUIVER_MCP_HOST_HELPER` is set it plays a Quiver host that
/// gets SIGKILLed by `children_die_with_a_killed_host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_helper() {
    if std::env::var_os(HELPER).is_none() {
        return;
    }
    // A wrapper that leaves a grandchild behind, as `npx` and `uv run` do.
    let wrapped = ServerConfig::stdio(
        "fx",
        "sh",
        vec![
            "-c".to_owned(),
            format!(
                "sleep 300 </dev/null >/dev/null 2>&1 & exec {} {} normal",
                python(),
                fixture()
            ),
        ],
    );
    let (_catalog, client) = start(&[wrapped.required()], fast_options());
    client.wait_ready(Duration::from_secs(30)).await.unwrap();
    let pid = client.server_status("fx").unwrap().child_pids[0];
    println!("CHILD {pid}");
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_die_with_a_killed_host() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    if std::env::var_os(HELPER).is_some() {
        return;
    }
    let mut host = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "faults::host_helper",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(HELPER, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(host.stdout.take().unwrap()).lines();
    let child = within(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some((_, pid)) = line.split_once("CHILD ") {
                return pid.trim().parse::<u32>().unwrap();
            }
        }
        panic!("the helper host exited without reporting its child");
    })
    .await;
    assert!(std::path::Path::new(&format!("/proc/{child}")).exists());
    let group = group_members(child);
    assert!(
        group.len() >= 2,
        "the upstream and its `sleep` share a group: {group:?}"
    );
    host.kill().await.unwrap();
    // PR_SET_PDEATHSIG: the kernel kills the upstream with its host; the watchdog kills the
    // rest of its group (the `sleep` the wrapper left). Each is then init's to reap (a
    // container's init may leave it a zombie, which runs nothing).
    wait_for(
        "the orphaned upstream and its own child to die",
        Duration::from_secs(10),
        || group.iter().all(|pid| !runs(*pid)),
    )
    .await;
}

/// The `/proc/PID/stat` fields after `(comm)`.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Whether `pid` exists and is not a zombie.
fn runs(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f[0] != "Z" && f[0] != "X")
}

/// The processes in process group `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // Fields: state, ppid, pgrp, ...
            stat_fields(*pid).is_some_and(|f| f.get(2).is_some_and(|g| g == &pgid.to_string()))
        })
        .collect()
}

fn raw(name: &str, extra: &[&str]) -> ServerConfig {
    let mut args = vec![fixture(), "raw".to_owned()];
    args.extend(extra.iter().map(|s| s.to_string()));
    ServerConfig::stdio(name, python(), args).required()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_versions() {
    // Upstreams on 2025-06-18 and 2025-11-25 work; an unknown version is a rejection.
    let (catalog, client) = start(
        &[
            raw("june", &["--protocol", "2025-06-18"]),
            raw("nov", &["--protocol", "2025-11-25"]),
        ],
        fast_options(),
    );
    ready(&client).await;
    for name in ["mcp__june__echo", "mcp__nov__echo"] {
        let env = call(&catalog, name, json!({"k": "v"})).await;
        assert!(text_of(&env).contains("\"k\""), "{name}: {env:?}");
    }
    close_and_check(&client).await;

    let (_catalog, client) = start(
        &[raw("future", &["--protocol", "2099-01-01"])],
        fast_options(),
    );
    let err = within(
        Duration::from_secs(30),
        client.wait_ready(Duration::from_secs(30)),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("unsupported protocol version"),
        "{err}"
    );
    assert_eq!(client.server_status("future").unwrap().counters.dials, 1);
    close_and_check(&client).await;

    // An initialize result without its required `capabilities` is a rejection that says
    // so; it used to be rmcp's debug print of the whole result, retried forever.
    let (_catalog, client) = start(
        &[raw(
            "bare",
            &["--protocol", "2025-11-25", "--no-capabilities"],
        )],
        fast_options(),
    );
    let err = within(
        Duration::from_secs(30),
        client.wait_ready(Duration::from_secs(30)),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("initialize result cannot be read (missing field `capabilities`)"),
        "{err}"
    );
    assert!(!err.to_string().contains("CustomResult"), "{err}");
    assert_eq!(client.server_status("bare").unwrap().counters.dials, 1);
    close_and_check(&client).await;
}

/// Starts `server` (named `fx`), waits for its first failed dial, and checks that a
/// diagnostic line has the process's exit and the last line it wrote to stderr.
async fn assert_failed_dial_shows(server: ServerConfig, exit: &str, stderr: &str) {
    let (_catalog, client) = start(&[server], fast_options());
    wait_for("a failed dial", Duration::from_secs(30), || {
        client
            .server_status("fx")
            .unwrap()
            .diagnostics
            .iter()
            .any(|l| l.contains("connect failed"))
    })
    .await;
    let diagnostics = client.server_status("fx").unwrap().diagnostics;
    assert!(
        diagnostics
            .iter()
            .any(|l| l.contains(exit) && l.contains(&format!("its stderr ended with: {stderr}"))),
        "{diagnostics:#?}"
    );
    close_and_check(&client).await;
}

/// Why a stdio server failed at start is in its status: its exit code and the last lines
/// it wrote to stderr (before, only "connection closed: initialize response").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_failing_at_start_shows_its_exit_and_stderr() {
    // The exit is the reason, not the broken pipe or closed stream it left behind.
    assert_failed_dial_shows(
        fixture_server("fx", "crash"),
        "connect failed: the process exited with code 3 before it answered `initialize`",
        "fatal: cannot open the database: permission denied",
    )
    .await;
}

/// A server that exits right after the handshake shows its exit and stderr too (before,
/// only "tools/list failed: Transport closed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_exiting_after_the_handshake_shows_its_exit_and_stderr() {
    assert_failed_dial_shows(
        raw("fx", &["--exit-after-init"]),
        "the process exited with code 4",
        "panic: lost my database connection after init",
    )
    .await;
}

/// A server whose `tools/list` cursor comes round again is not asked forever: what it listed
/// is served, and the diagnostics say why the paging stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_list_cursor_that_comes_round_again_stops_the_paging() {
    let (catalog, client) = start(&[raw("loop", &["--cursor-loop"])], fast_options());
    ready(&client).await;
    let env = call(&catalog, "mcp__loop__echo", json!({"k": "v"})).await;
    assert!(text_of(&env).contains("\"k\""), "{env:?}");
    let st = client.server_status("loop").unwrap();
    assert_eq!(st.state, ServerState::Connected);
    assert!(
        st.diagnostics
            .iter()
            .any(|l| l.contains("tools/list paging stopped after 2 page(s)")
                && l.contains("came round again")),
        "{st:?}"
    );
    close_and_check(&client).await;

    // A server that ignores the cursor repeats its page: each tool is listed once, with
    // no duplicate-name warning.
    let (catalog, client) = start(
        &[raw("rep", &["--cursor-loop", "--cursor-ignored"])],
        fast_options(),
    );
    ready(&client).await;
    assert!(catalog.contains("mcp__rep__echo"));
    let report = client.register_report();
    assert!(report.skipped.is_empty(), "{report:?}");
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_tools_are_skipped_and_the_rest_served() {
    let server = raw("bad", &["--bad-tools", "--unreadable-tools"])
        .with_call_timeout(Duration::from_secs(120));
    let (catalog, client) = start(&[server], fast_options());
    ready(&client).await;
    let env = call(&catalog, "mcp__bad__echo", json!({"k": "v"})).await;
    assert!(text_of(&env).contains("\"k\""), "{env:?}");
    let st = client.server_status("bad").unwrap();
    // A tool rmcp cannot read costs only itself too (it used to fail the whole listing:
    // "tools/list failed: Unexpected response type", the server down, retried forever).
    assert_eq!(
        st.tools,
        ["mcp__bad__echo", "mcp__bad__no_schema", "mcp__bad__sleep"],
        "{st:?}"
    );
    let skipped: Vec<&String> = st
        .diagnostics
        .iter()
        .filter(|l| l.starts_with("skipped malformed tool"))
        .collect();
    assert_eq!(skipped.len(), 4, "{st:?}");
    assert!(
        skipped[0].contains("\"bad\\u{7}tool\"") && skipped[0].contains("control character"),
        "{skipped:?}"
    );
    assert!(skipped[1].contains("\"longxxx"), "{skipped:?}");
    assert!(skipped[2].contains("\"stringly\""), "{skipped:?}");
    assert!(skipped[3].contains("no string `name`"), "{skipped:?}");
    // A result outside the MCP schema is still read for what it holds, with a warning
    // (it was "sent an unexpected reply", the tool's output lost); one without content
    // says the tool ran.
    let env = call(&catalog, "mcp__bad__echo", json!({"odd": true})).await;
    assert!(text_of(&env).contains("\"odd\""), "{env:?}");
    assert!(
        env.warnings()
            .iter()
            .any(|w| w.kind == "malformed_result"
                && w.message.contains("unknown variant `hologram`")),
        "{env:?}"
    );
    // An answer that cannot be read fails its call at once, saying the server answered
    // (rmcp dropped the line, and the call waited out its timeout).
    for (args, says) in [
        (
            json!({"nomessage": true}),
            "`error.message` must be a string",
        ),
        (json!({"huge": true}), "longer than 16777216 bytes"),
    ] {
        let env = within(
            Duration::from_secs(60),
            call(&catalog, "mcp__bad__echo", args.clone()),
        )
        .await;
        assert_eq!(
            env.err_kind(),
            Some(&ErrKind::ToolFailed),
            "{args}: {env:?}"
        );
        let message = env.message().unwrap();
        assert!(
            message.contains("MCP server \"bad\" answered, but its answer cannot be read")
                && message.contains(says),
            "{args}: {env:?}"
        );
    }
    let env = call(&catalog, "mcp__bad__echo", json!({"bare": true})).await;
    assert_eq!(env.err_kind(), Some(&ErrKind::ToolFailed), "{env:?}");
    assert!(
        env.message().unwrap().contains("sent a malformed result")
            && env.message().unwrap().contains("the tool ran"),
        "{env:?}"
    );
    // A JSON-RPC error says which server answered with it (it was the server's words
    // alone: "internal kaboom").
    let env = call(
        &catalog,
        "mcp__bad__echo",
        json!({"fail": "internal kaboom"}),
    )
    .await;
    assert_eq!(env.err_kind(), Some(&ErrKind::ToolFailed), "{env:?}");
    assert_eq!(
        env.message().unwrap(),
        "MCP server \"bad\" answered with an error: internal kaboom",
        "{env:?}"
    );
    close_and_check(&client).await;
}

/// A re-list that the client's own close cuts off is not a failure to report: no
/// "re-list after list_changed failed" line (a one-shot `quiver call` whose upstream had
/// just announced a change ended with that WARN, "Transport closed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_cut_off_by_close_is_not_reported() {
    let dir = std::env::temp_dir().join(format!("quiver-relist-close-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("methods.jsonl");
    let log_arg = log.display().to_string();
    let (catalog, client) = start(
        &[raw(
            "later",
            &["--bad-tools-later", "--hang-relist", "--log", &log_arg],
        )],
        fast_options(),
    );
    ready(&client).await;
    let env = call(&catalog, "mcp__later__grow", json!({})).await;
    assert!(env.is_ok(), "{env:?}");
    let lists = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(r#""method": "tools/list""#)
            .count()
    };
    wait_for("the re-list is sent", Duration::from_secs(30), || {
        lists() >= 2
    })
    .await;
    close_and_check(&client).await;
    let st = client.server_status("later").unwrap();
    assert!(
        !st.diagnostics
            .iter()
            .any(|l| l.contains("re-list after list_changed")),
        "{:#?}",
        st.diagnostics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_tools_on_a_relist_are_skipped() {
    let (catalog, client) = start(&[raw("later", &["--bad-tools-later"])], fast_options());
    ready(&client).await;
    let env = call(&catalog, "mcp__later__grow", json!({})).await;
    assert!(env.is_ok(), "{env:?}");
    wait_for("the re-list", Duration::from_secs(30), || {
        catalog.contains("mcp__later__extra")
    })
    .await;
    let st = client.server_status("later").unwrap();
    assert_eq!(
        st.tools,
        ["mcp__later__echo", "mcp__later__extra", "mcp__later__sleep"],
        "{st:?}"
    );
    let skipped = st
        .diagnostics
        .iter()
        .filter(|l| l.starts_with("skipped malformed tool"))
        .count();
    assert_eq!(skipped, 3, "{st:?}");
    // Reported with the catalog's refusals (what `quiver check` counts).
    let report = client.register_report();
    let refused: Vec<&str> = report.skipped.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(refused.len(), 3, "{report:?}");
    assert!(refused.contains(&"bad\\u{7}tool"), "{refused:?}");
    assert!(
        report
            .skipped
            .iter()
            .all(|s| !s.is_duplicate() && s.family == "mcp:later"),
        "{report:?}"
    );
    assert_eq!(st.state, ServerState::Connected);
    let env = call(&catalog, "mcp__later__echo", json!({"k": "v"})).await;
    assert!(text_of(&env).contains("\"k\""), "{env:?}");
    close_and_check(&client).await;
}

/// A burst of `tools/list_changed` notifications is coalesced: one re-list runs at a time,
/// and those that come while it runs make one more, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_list_changes_is_coalesced() {
    let (catalog, client) = start(&[raw("storm", &["--storm"])], fast_options());
    ready(&client).await;
    let before = client.server_status("storm").unwrap().counters.relists;
    let env = call(&catalog, "mcp__storm__storm", json!({})).await;
    assert!(env.is_ok(), "{env:?}");
    wait_for("the re-list", Duration::from_secs(30), || {
        catalog.contains("mcp__storm__calm")
    })
    .await;
    // Let any re-list still queued finish before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = client.server_status("storm").unwrap();
    let relists = st.counters.relists - before;
    assert!(
        (1..=25).contains(&relists),
        "50 notifications made {relists} re-lists"
    );
    assert_eq!(
        st.tools,
        ["mcp__storm__calm", "mcp__storm__echo", "mcp__storm__sleep"],
        "{st:?}"
    );
    close_and_check(&client).await;
}

/// `tools/list_changed` sent right after the first tools/list answer, while the client is
/// still connecting, is not lost: the tools are listed again once the connection is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_change_during_connect_is_relisted() {
    let (catalog, client) = start(&[raw("early", &["--changed-at-connect"])], fast_options());
    ready(&client).await;
    wait_for("the re-list", Duration::from_secs(30), || {
        catalog.contains("mcp__early__extra")
    })
    .await;
    let st = client.server_status("early").unwrap();
    assert_eq!(
        st.tools,
        ["mcp__early__echo", "mcp__early__extra", "mcp__early__sleep"],
        "{st:?}"
    );
    assert_eq!(st.counters.connects, 1, "{st:?}");
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_list_error_is_retried() {
    let gate = std::env::temp_dir().join(format!("quiver-mcp-list-{}", std::process::id()));
    let _ = std::fs::remove_file(&gate);
    let (catalog, client) = start(
        &[raw(
            "slow",
            &["--list-fail-unless", &gate.display().to_string()],
        )],
        fast_options(),
    );
    wait_for(
        "a retry after the refused list",
        Duration::from_secs(30),
        || client.server_status("slow").unwrap().counters.dials >= 2,
    )
    .await;
    let st = client.server_status("slow").unwrap();
    assert!(
        !matches!(st.state, ServerState::Rejected(_)) && st.counters.connects == 0,
        "{st:?}"
    );
    std::fs::write(&gate, b"up").unwrap();
    wait_for("tools to appear", Duration::from_secs(30), || {
        catalog.contains("mcp__slow__echo")
    })
    .await;
    let env = call(&catalog, "mcp__slow__echo", json!({"k": "v"})).await;
    assert!(text_of(&env).contains("\"k\""), "{env:?}");
    let _ = std::fs::remove_file(&gate);
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_server_is_not_killed_by_the_liveness_ping() {
    // The raw fixture handles one request at a time: while `sleep` runs, the ping waits
    // unanswered for longer than the ping's timeout (1 s here). The call must still finish.
    let (catalog, client) = start(
        &[
            raw("busy", &[]).with_liveness(quiver_mcp_adapter::Liveness::Every(
                Duration::from_millis(200),
            )),
        ],
        fast_options(),
    );
    ready(&client).await;
    let env = within(
        Duration::from_secs(60),
        call(&catalog, "mcp__busy__sleep", json!({"seconds": 4})),
    )
    .await;
    assert!(env.is_ok(), "{env:?}");
    assert!(text_of(&env).contains("\"seconds\""), "{env:?}");
    let st = client.server_status("busy").unwrap();
    assert_eq!(st.counters.drops, 0, "{st:?}");
    assert!(
        !st.diagnostics.iter().any(|l| l.contains("liveness ping")),
        "{st:?}"
    );
    close_and_check(&client).await;
}

/// The delays of the "reconnecting in X s" lines a server's short-lived connections left.
fn redial_delays(client: &quiver_mcp_adapter::McpClient, name: &str) -> Vec<f64> {
    client
        .server_status(name)
        .unwrap()
        .diagnostics
        .iter()
        .filter_map(|l| l.split_once("reconnecting in ")?.1.strip_suffix(" s"))
        .map(|d| d.parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_after_connecting_is_redialled_with_backoff() {
    // Each connection succeeds (initialize, tools/list) and is lost at once: the redials
    // follow the backoff schedule of failed dials instead of respawning in a loop.
    let (_catalog, client) = start(
        &[raw("flap", &["--exit-after-list"])],
        fast_options().with_backoff(Duration::from_millis(100), Duration::from_millis(800)),
    );
    wait_for("five connections", Duration::from_secs(60), || {
        client.server_status("flap").unwrap().counters.connects >= 5
    })
    .await;
    let delays = redial_delays(&client, "flap");
    assert!(delays.len() >= 4, "{delays:?}");
    assert_eq!(delays[..4], [0.1, 0.2, 0.4, 0.8], "{delays:?}");
    assert!(delays[4..].iter().all(|d| *d == 0.8), "{delays:?}");
    // Reaped children are off the list: at most the one running now is on it.
    let st = client.server_status("flap").unwrap();
    assert!(st.child_pids.len() <= 1, "{st:?}");
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_server_keeps_bounded_diagnostics_and_pids() {
    let (_catalog, client) = start(
        &[raw("flap", &["--exit-after-list"])],
        fast_options().with_backoff(Duration::from_millis(1), Duration::from_millis(1)),
    );
    // Four lines per cycle: 40 cycles would be 160 lines.
    wait_for("forty connections", Duration::from_secs(120), || {
        client.server_status("flap").unwrap().counters.connects >= 40
    })
    .await;
    let st = client.server_status("flap").unwrap();
    assert_eq!(st.diagnostics.len(), 100, "{st:?}");
    assert!(st.child_pids.len() <= 1, "{st:?}");
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_that_is_not_utf8_does_not_kill_the_server() {
    // The fixture writes invalid UTF-8 to stderr at start and on every call: its stderr
    // must stay open, or the write fails and the server dies mid-call.
    let (catalog, client) = start(&[raw("noisy", &["--stderr-noise"])], fast_options());
    ready(&client).await;
    for i in 0..5 {
        let env = within(
            Duration::from_secs(30),
            call(&catalog, "mcp__noisy__echo", json!({"n": i})),
        )
        .await;
        assert!(text_of(&env).contains(&format!("\"n\": {i}")), "{env:?}");
    }
    let st = client.server_status("noisy").unwrap();
    assert_eq!(st.counters.drops, 0, "{st:?}");
    close_and_check(&client).await;
}

/// One upstream slow to answer `resources/subscribe` holds up subscriptions to its own
/// resources only: another upstream's resource is subscribed (and unsubscribed) meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscribe_holds_up_no_other_upstream() {
    use quiver_mcp_adapter::ContentSource;

    let (marker, log) = scratch_files("sub");
    let (client, pending) = beside_a_slow_subscribe(&marker, &log).await;
    within(
        Duration::from_secs(10),
        client.subscribe("raw://quick/doc", &quiver_contract::Capabilities::all()),
    )
    .await
    .expect("subscribed beside the slow one");
    within(
        Duration::from_secs(10),
        client.unsubscribe("raw://quick/doc"),
    )
    .await
    .expect("unsubscribed beside the slow one");
    assert!(
        !pending.is_finished(),
        "the slow upstream is still answering"
    );
    pending.abort();
    close_and_check(&client).await;
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&log);
}

/// A fresh marker and log path for a raw fixture (`--slow-subscribe`, `--log`).
fn scratch_files(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let base = std::env::temp_dir().join(format!("quiver-mcp-{tag}-{}", std::process::id()));
    let (marker, log) = (base.with_extension("sub"), base.with_extension("log"));
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&log);
    (marker, log)
}

/// Two raw servers offering one resource each, `slow` (its `resources/subscribe` writes
/// `marker`, then takes 20 s) and `quick` (logging what it reads to `log`); a subscription
/// to the slow one's resource is left pending.
async fn beside_a_slow_subscribe(
    marker: &std::path::Path,
    log: &std::path::Path,
) -> (
    std::sync::Arc<quiver_mcp_adapter::McpClient>,
    tokio::task::JoinHandle<Result<(), quiver_mcp_adapter::ContentError>>,
) {
    use quiver_mcp_adapter::ContentSource;

    let (marker_arg, log_arg) = (marker.display().to_string(), log.display().to_string());
    let mut slow = raw(
        "slow",
        &["--resources", "slow", "--slow-subscribe", &marker_arg],
    );
    slow.resources = true;
    let mut quick = raw("quick", &["--resources", "quick", "--log", &log_arg]);
    quick.resources = true;
    let (_catalog, client) = start(&[slow, quick], fast_options());
    ready(&client).await;
    let listed = within(
        Duration::from_secs(30),
        client.list_resources(&quiver_contract::Capabilities::all()),
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let client = std::sync::Arc::new(client);
    let pending = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .subscribe("raw://slow/doc", &quiver_contract::Capabilities::all())
                .await
        }
    });
    wait_for(
        "the slow upstream got the subscribe",
        Duration::from_secs(30),
        || marker.exists(),
    )
    .await;
    (client, pending)
}

/// A resource list with entries rmcp cannot read keeps the rest, through `quiver serve`'s
/// passthrough and through `list_mcp_resources` (the whole list failed, "could not answer
/// resources/list; the connection is re-established in the background").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_resources_cost_only_themselves() {
    let mut server = raw("odd", &["--resources", "odd", "--bad-resources"]);
    server.resources = true;
    let (catalog, client) = start(&[server], fast_options());
    ready(&client).await;
    let uris = listed_uris(&client, &quiver_contract::Capabilities::all()).await;
    assert_eq!(uris, ["raw://odd/doc"]);
    let env = call(&catalog, "list_mcp_resources", json!({})).await;
    assert!(env.err_kind().is_none(), "{env:?}");
    assert!(text_of(&env).contains("raw://odd/doc"), "{env:?}");
    close_and_check(&client).await;
}

/// A request Quiver gives up on at its own timeout (here `resources/subscribe`, bounded by
/// the call timeout) is cancelled upstream with `notifications/cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_up_at_the_timeout_is_cancelled_upstream() {
    use quiver_mcp_adapter::{ContentError, ContentSource};

    let (marker, log) = scratch_files("abandon");
    let (marker_arg, log_arg) = (marker.display().to_string(), log.display().to_string());
    let mut slow = raw(
        "slow",
        &[
            "--resources",
            "slow",
            "--slow-subscribe",
            &marker_arg,
            "--subscribe-delay",
            "3",
            "--log",
            &log_arg,
        ],
    );
    slow.resources = true;
    slow.call_timeout = Some(Duration::from_millis(500));
    let (_catalog, client) = start(&[slow], fast_options());
    ready(&client).await;
    within(
        Duration::from_secs(30),
        client.list_resources(&quiver_contract::Capabilities::all()),
    )
    .await
    .unwrap();
    let out = within(
        Duration::from_secs(10),
        client.subscribe("raw://slow/doc", &quiver_contract::Capabilities::all()),
    )
    .await;
    assert!(
        matches!(&out, Err(ContentError::Unavailable(m)) if m.contains("did not answer")),
        "{out:?}"
    );
    // The server reads the cancellation once its blocking subscribe is over.
    wait_for("the cancellation upstream", Duration::from_secs(30), || {
        let read: Vec<serde_json::Value> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let subscribe = read
            .iter()
            .find(|m| m["method"] == "resources/subscribe")
            .map(|m| m["id"].clone());
        subscribe.is_some_and(|id| {
            read.iter()
                .any(|m| m["method"] == "notifications/cancelled" && m["params"]["requestId"] == id)
        })
    })
    .await;
    close_and_check(&client).await;
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&log);
}

/// A reconnected server is subscribed again to its URIs at once, without waiting behind
/// another server's slow `resources/subscribe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_server_resubscribes_beside_a_slow_one() {
    use quiver_mcp_adapter::ContentSource;

    let (marker, log) = scratch_files("resub");
    let (client, pending) = beside_a_slow_subscribe(&marker, &log).await;
    within(
        Duration::from_secs(10),
        client.subscribe("raw://quick/doc", &quiver_contract::Capabilities::all()),
    )
    .await
    .expect("subscribed");
    let subscribes = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"resources/subscribe\""))
            .count()
    };
    assert_eq!(subscribes(), 1);
    let pid = client.server_status("quick").unwrap().child_pids[0].to_string();
    kill9(&pid);
    wait_for(
        "the reconnected server subscribed again",
        Duration::from_secs(15),
        || subscribes() == 2,
    )
    .await;
    assert!(
        !pending.is_finished(),
        "the slow upstream is still answering"
    );
    pending.abort();
    close_and_check(&client).await;
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&log);
}

/// An upstream whose structured result breaks the output schema it declares is answered
/// `tool_failed` by the dispatcher, naming where (a client SDK would refuse the result);
/// output schemas that cannot serve are dropped, with the tool kept and the reason in the
/// server's diagnostics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_results_are_checked_against_the_upstream_output_schema() {
    let (catalog, client) = start(&[raw("typed", &["--typed"])], fast_options());
    ready(&client).await;
    let dispatcher = quiver_registry::Dispatcher::new(catalog.clone());
    let run = |input: serde_json::Value| {
        dispatcher.call("mcp__typed__forecast", input, CallContext::default())
    };
    let fine = within(Duration::from_secs(30), run(json!({}))).await;
    assert_eq!(fine.data(), Some(&json!({"high_c": 21})), "{fine:?}");
    let lie = within(Duration::from_secs(30), run(json!({"lie": true}))).await;
    assert_eq!(lie.err_kind(), Some(&ErrKind::ToolFailed), "{lie:?}");
    let msg = text_of(&lie);
    assert!(
        msg.contains("does not match the output schema it declares")
            && msg.contains("`/high_c`: \"warm\" is not of type \"number\""),
        "{msg}"
    );
    for name in ["stringly_out", "broken_out"] {
        let entry = catalog.lookup(&format!("mcp__typed__{name}")).unwrap();
        assert_eq!(entry.spec.output_schema, None, "{name}");
    }
    let diagnostics = client.server_status("typed").unwrap().diagnostics;
    for (name, why) in [
        (
            "stringly_out",
            "its output schema's top-level type is \"string\"",
        ),
        ("broken_out", "its output schema does not compile"),
    ] {
        assert!(
            diagnostics.iter().any(|l| l.contains(&format!(
                "tool \"{name}\" is served without its output schema ({why}"
            ))),
            "{diagnostics:#?}"
        );
    }
    // Unchecked, it still runs.
    let env = call(&catalog, "mcp__typed__stringly_out", json!({"lie": true})).await;
    assert!(env.err_kind().is_none(), "{env:?}");
    close_and_check(&client).await;
}

/// Two servers listing one resource URI: it is listed once and subscribed (so read) at the
/// server configured first, whatever the servers' names and whoever listed last (a caller
/// that may reach only the second); it was listed twice, and routed to whichever server
/// listed it last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_two_servers_list_is_the_first_configured_servers() {
    use quiver_mcp_adapter::ContentSource;

    let (zeta_log, alpha_log) = (scratch_files("shadow-z").1, scratch_files("shadow-a").1);
    let (z, a) = (
        zeta_log.display().to_string(),
        alpha_log.display().to_string(),
    );
    // Configured first, named last in alphabetical order.
    let mut zeta = raw("zeta", &["--resources", "shared", "--log", &z]);
    zeta.resources = true;
    let mut alpha = raw("alpha", &["--resources", "shared", "--log", &a]);
    alpha.resources = true;
    let (_catalog, client) = start(&[zeta, alpha], fast_options());
    ready(&client).await;
    for _ in 0..2 {
        let uris = listed_uris(&client, &quiver_contract::Capabilities::all()).await;
        assert_eq!(uris, ["raw://shared/doc"]);
    }
    // A caller that may reach only alpha is shown alpha's entry; that listing does not
    // make alpha the owner for callers that may reach zeta.
    let only_alpha =
        quiver_contract::Capabilities::all().with_allowed_servers(vec!["alpha".into()]);
    assert_eq!(
        listed_uris(&client, &only_alpha).await,
        ["raw://shared/doc"]
    );
    within(
        Duration::from_secs(30),
        client.subscribe("raw://shared/doc", &quiver_contract::Capabilities::all()),
    )
    .await
    .unwrap();
    let said = |log: &std::path::Path| std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        said(&zeta_log).contains("resources/subscribe"),
        "zeta: {}",
        said(&zeta_log)
    );
    assert!(
        said(&alpha_log).contains("resources/list")
            && !said(&alpha_log).contains("resources/subscribe"),
        "alpha: {}",
        said(&alpha_log)
    );
    close_and_check(&client).await;
}

/// A resource watch begun while the server configured first was down (so at the second,
/// which lists the same URI) moves to the first once it is up and listed, where reads go
/// from then on: its updates come from the server that serves it. It stayed at the second,
/// and a new subscriber who may reach both was told the URI is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_moves_to_the_first_server_once_it_is_up() {
    use quiver_mcp_adapter::ContentSource;

    let (marker, first_log) = scratch_files("rewatch-first");
    let second_log = scratch_files("rewatch-second").1;
    let mut first = ServerConfig::stdio(
        "first",
        python(),
        vec![
            fixture(),
            "raw".into(),
            "--require-file".into(),
            marker.display().to_string(),
            "--resources".into(),
            "shared".into(),
            "--log".into(),
            first_log.display().to_string(),
        ],
    );
    first.resources = true;
    let second_path = second_log.display().to_string();
    let mut second = raw("second", &["--resources", "shared", "--log", &second_path]);
    second.resources = true;
    let (_catalog, client) = start(&[first, second], fast_options());
    ready(&client).await;
    let all = quiver_contract::Capabilities::all();
    assert_eq!(listed_uris(&client, &all).await, ["raw://shared/doc"]);
    within(
        Duration::from_secs(30),
        client.subscribe("raw://shared/doc", &all),
    )
    .await
    .unwrap();
    let said = |log: &std::path::Path| std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        said(&second_log).contains("resources/subscribe"),
        "{}",
        said(&second_log)
    );

    std::fs::write(&marker, b"up").unwrap();
    wait_for("the first server up", Duration::from_secs(30), || {
        client.server_status("first").unwrap().state == ServerState::Connected
    })
    .await;
    // A listing (as a client does on the list change the connect sends) makes it the owner.
    assert_eq!(listed_uris(&client, &all).await, ["raw://shared/doc"]);
    wait_for(
        "the watch at the first server",
        Duration::from_secs(15),
        || {
            said(&first_log).contains("\"resources/subscribe\"")
                && said(&second_log).contains("\"resources/unsubscribe\"")
        },
    )
    .await;
    // Another subscriber joins the watch; the last to leave ends it at the first server.
    within(
        Duration::from_secs(30),
        client.subscribe("raw://shared/doc", &all),
    )
    .await
    .expect("a second subscriber");
    for _ in 0..2 {
        within(
            Duration::from_secs(30),
            client.unsubscribe("raw://shared/doc"),
        )
        .await
        .unwrap();
    }
    wait_for(
        "unsubscribed at the first server",
        Duration::from_secs(15),
        || said(&first_log).contains("\"resources/unsubscribe\""),
    )
    .await;
    let subscribes = said(&first_log).matches("\"resources/subscribe\"").count();
    assert_eq!(
        subscribes,
        1,
        "one upstream subscription: {}",
        said(&first_log)
    );
    // A caller who may reach only the second server keeps its watch there (the first's
    // updates may not be its), whatever a listing shows.
    let only_second =
        quiver_contract::Capabilities::all().with_allowed_servers(vec!["second".into()]);
    let count = |log: &std::path::Path, what: &str| said(log).matches(what).count();
    let unsubscribed = count(&second_log, "\"resources/unsubscribe\"");
    within(
        Duration::from_secs(30),
        client.subscribe("raw://shared/doc", &only_second),
    )
    .await
    .unwrap();
    assert_eq!(listed_uris(&client, &all).await, ["raw://shared/doc"]);
    // (A move is a task the listing starts: given time, it would have run.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count(&first_log, "\"resources/subscribe\""),
        1,
        "{}",
        said(&first_log)
    );
    assert_eq!(
        count(&second_log, "\"resources/unsubscribe\""),
        unsubscribed,
        "{}",
        said(&second_log)
    );
    close_and_check(&client).await;
    for f in [&marker, &first_log, &second_log] {
        let _ = std::fs::remove_file(f);
    }
}

/// The URIs of the passed-through resource list `caps` sees, in its order.
async fn listed_uris(
    client: &quiver_mcp_adapter::McpClient,
    caps: &quiver_contract::Capabilities,
) -> Vec<String> {
    use quiver_mcp_adapter::ContentSource;
    let listed = within(Duration::from_secs(30), client.list_resources(caps))
        .await
        .unwrap();
    listed
        .iter()
        .filter_map(|r| r["uri"].as_str().map(str::to_owned))
        .collect()
}
