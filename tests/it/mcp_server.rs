//! `quiver serve` against the official Python MCP client (PyPI `mcp`, installed into
//! `.peers/venv` by `.ci/setup-peers`): both protocol eras, list_changed after tool_search,
//! progress, cancellation, bearer tokens, Host/Origin guards, and shutdown on SIGTERM.
//!
//! The real `quiver` binary is built with `cargo build -p quiver-host` (the test crate cannot
//! name another package's binary); the fixture server (`quiver-fixture-server`, this crate's
//! binary) adds a searchable tool and a slow one.

use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::OnceLock,
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the repository")
        .to_path_buf()
}

pub(crate) fn peers() -> PathBuf {
    std::env::var_os("QUIVER_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".peers"))
}

pub(crate) fn python() -> PathBuf {
    let py = peers().join("venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash .ci/setup-peers` to install the Python MCP client",
        py.display()
    );
    py
}

/// The `quiver` binary, built once per test run through cargo (same profile and target dir).
pub(crate) fn quiver_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        // The variables cargo sets for this test binary are not the caller's: a build script
        // that tracks one (ring's tracks CARGO_MANIFEST_DIR) would be rebuilt here, and again
        // by the next `cargo test`, with everything above it (ring, rustls, reqwest, rmcp...).
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .iter()
            .any(|p| key.starts_with(p))
            {
                build.env_remove(key.as_ref());
            }
        }
        let out = build
            .args([
                "build",
                "-p",
                "quiver-host",
                "--bin",
                "quiver",
                "--message-format=json-render-diagnostics",
            ])
            .current_dir(repo_root())
            .stderr(Stdio::inherit())
            .output()
            .expect("cargo runs");
        assert!(out.status.success(), "building quiver failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "quiver")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reports the quiver executable")
    })
    .clone()
}

/// A new empty directory for one server run: `quiver` keeps its store (`./quiver.db`) in
/// the working directory, and concurrent tests must not share one.
pub(crate) fn fresh_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    sweep_stale_dirs();
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("quiver-e2e-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

/// Removes, once per run, the directories earlier runs of this suite left in the
/// temporary directory (`quiver-e2e-<pid>-<n>`, `quiver-conformance-<pid>-<run>`,
/// `quiver-timed-<pid>`) whose process is gone: a run keeps its own until the next one, to
/// look into when a test fails, and the runs no longer pile up hundreds of them in /tmp.
fn sweep_stale_dirs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Whether a process is gone is read from /proc: without it, nothing is removed.
        if !Path::new("/proc/self").exists() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = ["quiver-e2e-", "quiver-conformance-", "quiver-timed-"]
                .iter()
                .find_map(|p| name.strip_prefix(p))
            else {
                continue;
            };
            let pid = rest.split('-').next().unwrap_or_default();
            if !pid.is_empty()
                && pid.chars().all(|c| c.is_ascii_digit())
                && pid != std::process::id().to_string()
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
}

fn fixture_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_quiver-fixture-server"))
}

/// A running server; killed when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
    /// The server's stdout after the URL line.
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Server {
    async fn start(program: PathBuf, args: &[&str]) -> Server {
        Server::start_in(program, args, &fresh_dir()).await
    }

    /// Starts the server in `dir` (where `quiver` keeps its `./quiver.db`).
    pub(crate) async fn start_in(program: PathBuf, args: &[&str], dir: &Path) -> Server {
        let mut child = Command::new(&program)
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(START_TIMEOUT, lines.next_line())
            .await
            .expect("the server prints its URL in time")
            .expect("stdout is readable")
            .expect("the server prints its URL");
        assert!(
            url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
            "{url}"
        );
        Server { child, url, lines }
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// The next line the server prints on stdout.
    async fn next_line(&mut self) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("the server prints a line in time")
            .expect("stdout is readable")
    }

    /// Sends SIGTERM and waits for the exit.
    pub(crate) async fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().expect("running").to_string();
        send_signal(&pid, "-TERM").await;
        tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("the server exits within 15 s of SIGTERM")
            .expect("wait works")
    }
}

/// Runs a fixture script with the venv's Python; a failing script fails the test.
/// Sends `signal` (`-TERM`, `-HUP`, ...) to process `pid`.
async fn send_signal(pid: &str, signal: &str) {
    let sent = Command::new("kill")
        .args([signal, pid])
        .status()
        .await
        .expect("kill runs");
    assert!(sent.success(), "kill {signal} {pid}");
}

/// The next line of a child's stdout, within [`START_TIMEOUT`].
pub(crate) async fn line_of(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> String {
    tokio::time::timeout(START_TIMEOUT, lines.next_line())
        .await
        .expect("a line in time")
        .expect("readable")
        .expect("a line")
}

/// The answer to request `id` from a stdio server's output, past the notifications (such as
/// `tools/list_changed` after a `tool_search`) that may come before it.
pub(crate) async fn answer_to(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    id: u64,
) -> String {
    let wanted = format!("\"id\":{id}");
    loop {
        let line = line_of(lines).await;
        if line.contains(&wanted) {
            return line;
        }
        assert!(
            line.contains("\"method\":\"notifications/"),
            "only notifications may come before the answer to {id}: {line}"
        );
    }
}

/// The store in `dir` records a clean stop (the execution log closed).
fn assert_clean_shutdown(dir: &Path) {
    let db = rusqlite::Connection::open(dir.join("quiver.db")).expect("the store exists");
    let clean: String = db
        .query_row(
            "SELECT value FROM quiver_meta WHERE key = 'clean_shutdown'",
            [],
            |r| r.get(0),
        )
        .expect("a clean_shutdown mark");
    assert!(!clean.is_empty());
}

pub(crate) async fn run_script(script: &str, args: &[&str]) {
    run_script_with_env(script, args, &[]).await;
}

pub(crate) async fn run_script_with_env(script: &str, args: &[&str], env: &[(&str, &str)]) {
    let path = repo_root().join("tests/fixtures/mcp_server").join(script);
    let child = Command::new(python())
        .arg(&path)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(fresh_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish in {SCRIPT_TIMEOUT:?}"))
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

#[tokio::test]
async fn the_python_client_drives_quiver_serve_on_the_session_era() {
    let server = Server::start(quiver_binary(), &["serve", "--listen", "127.0.0.1:0"]).await;
    run_script(
        "client_flow.py",
        &[
            &server.url,
            "--mode",
            "legacy",
            "--expect-version",
            "2025-11-25",
        ],
    )
    .await;
}

#[tokio::test]
async fn the_python_client_drives_quiver_serve_on_its_default_era() {
    let server = Server::start(quiver_binary(), &["serve", "--listen", "127.0.0.1:0"]).await;
    run_script(
        "client_flow.py",
        &[
            &server.url,
            "--mode",
            "auto",
            "--expect-version",
            "2026-07-28",
        ],
    )
    .await;
}

#[tokio::test]
async fn a_found_tool_appears_after_list_changed_on_the_session_era() {
    let server = Server::start(fixture_binary(), &["--progress-ms", "100"]).await;
    run_script(
        "client_flow.py",
        &[
            &server.url,
            "--mode",
            "legacy",
            "--expect-version",
            "2025-11-25",
            "--fixture",
        ],
    )
    .await;
}

/// Two stateless clients with neither a conversation key nor a token, at once, never share
/// a working set (`stateless_isolation.py`); a conversation key keeps one across requests.
#[tokio::test]
async fn stateless_clients_without_a_key_never_share_a_working_set() {
    let server = Server::start(fixture_binary(), &["--progress-ms", "100"]).await;
    run_script("stateless_isolation.py", &[&server.url]).await;
}

#[tokio::test]
async fn a_found_tool_appears_after_a_listen_event_on_the_stateless_era() {
    let server = Server::start(fixture_binary(), &["--progress-ms", "100"]).await;
    run_script(
        "client_flow.py",
        &[
            &server.url,
            "--mode",
            "auto",
            "--expect-version",
            "2026-07-28",
            "--fixture",
            "--conversation",
            "e2e-stateless",
        ],
    )
    .await;
}

#[tokio::test]
async fn tokens_and_host_origin_guards_hold() {
    let auth = r#"{"tokens": [{"name": "e2e", "token": "e2e-secret", "allowed_tools": ["tool_search", "describe_tool", "slow_*"]}, {"name": "planner", "token": "plan-secret", "mode": "plan"}]}"#;
    let server = Server::start(fixture_binary(), &["--auth", auth]).await;
    run_script("guards.py", &[&server.url, "e2e-secret", "plan-secret"]).await;
}

/// `quiver serve --stdio` in `dir`, its stdin and stdout piped.
pub(crate) fn stdio_server(dir: &std::path::Path, stderr: Stdio) -> Child {
    Command::new(quiver_binary())
        .args(["serve", "--stdio"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("quiver starts")
}

/// A stdio client shuts the server down by closing stdin (MCP lifecycle): a call in flight
/// then is cancelled at once and logged `cancelled`. Before, it ran on through rmcp's drain
/// (5 s, then a warning) until the host stopped its upstream under it, and was logged as the
/// upstream's failure or as cancelled, whichever came first.
#[tokio::test]
async fn closing_stdin_cancels_the_calls_in_flight() {
    let dir = fresh_dir();
    let (mut child, stdin, _out) = serving_a_sleeping_call(&dir).await;
    drop(stdin);
    let (status, err) = exit_of(&mut child, "the server exits").await;
    assert!(status.success(), "{status}: {err}");
    // Not left to rmcp's drain (5 s, then the host stops the upstream under the call).
    assert!(
        !err.contains("timed out draining in-flight responses"),
        "{err}"
    );
    assert_eq!(logged(&dir, "mcp__fx__sleep")["err_kind"], "cancelled");
}

/// `serve --stdio` in `dir` with the fault fixture as `fx`, initialized, and running a
/// call of `mcp__fx__sleep` (60 s) that has reached the upstream: the child, its stdin and
/// its stdout's lines.
async fn serving_a_sleeping_call(
    dir: &std::path::Path,
) -> (
    Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncWriteExt;
    let mut child = stdio_server_before_fx(dir, "\"normal\"", "required = true");
    let mut stdin = child.stdin.take().expect("piped");
    let mut out = BufReader::new(child.stdout.take().expect("piped")).lines();
    let marker = dir.join("sleep-marker");
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "mcp__fx__sleep",
        "arguments": {"seconds": 60, "marker": marker.to_string_lossy()}}});
    for line in [
        INITIALIZE.to_owned(),
        INITIALIZED.to_owned(),
        call.to_string(),
    ] {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    stdin.flush().await.unwrap();
    let first = line_of(&mut out).await;
    assert!(first.contains(r#""id":1"#), "{first}");
    let started = marker.with_extension("started");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (child, stdin, out)
}

/// The child's exit within 30 s (`what` if it does not come) and its stderr.
async fn exit_of(child: &mut Child, what: &str) -> (std::process::ExitStatus, String) {
    let mut stderr = child.stderr.take().expect("piped");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect(what)
        .unwrap();
    let mut err = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut err)
        .await
        .unwrap();
    (status, err)
}

/// The newest execution-log row of `tool` in the store in `dir`.
fn logged(dir: &std::path::Path, tool: &str) -> serde_json::Value {
    let log = std::process::Command::new(quiver_binary())
        .args(["log", "--json", "--limit", "5"])
        .current_dir(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&log.stdout);
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["tool"] == tool)
        .unwrap_or_else(|| panic!("no row for {tool}: {text}"))
}

/// `quiver serve --stdio` in `dir` with the fault fixture as `fx` (`args` after the
/// script), its stdin, stdout and stderr piped, logging at `info`.
pub(crate) fn stdio_server_before_fx(dir: &std::path::Path, args: &str, extra: &str) -> Child {
    write_fx_config(dir, args, extra);
    Command::new(quiver_binary())
        .args(["serve", "--stdio"])
        .current_dir(dir)
        .env("QUIVER_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("quiver starts")
}

/// `dir/quiver.toml` with the fault fixture as `fx` (`args` after the script).
fn write_fx_config(dir: &std::path::Path, args: &str, extra: &str) {
    let fault = repo_root().join("crates/mcp-adapter/tests/fixtures/fault_server.py");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"fx\"\ncommand = {py:?}\nargs = [{fault:?}, {args}]\n{extra}\n",
            py = python(),
        ),
    )
    .unwrap();
}

/// A stdio client whose end of stdout is closed is gone: the next answer that cannot be
/// written ends the session, the call in flight is cancelled (and logged so), and the
/// server exits with stdin still open. Before, it went on reading requests and running
/// them, each logged `ok` though no answer left.
#[tokio::test]
async fn a_closed_stdout_ends_the_session_and_cancels_the_calls_in_flight() {
    use tokio::io::AsyncWriteExt;
    let dir = fresh_dir();
    let (mut child, mut stdin, out) = serving_a_sleeping_call(&dir).await;
    // The client stops reading; its next request's answer cannot be written.
    drop(out);
    let quick = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"describe_tool","arguments":{"name":"tool_search"}}}"#;
    stdin
        .write_all(format!("{quick}\n").as_bytes())
        .await
        .unwrap();
    stdin.flush().await.unwrap();
    let (status, err) = exit_of(&mut child, "the server exits with stdin still open").await;
    assert!(status.success(), "{status}: {err}");
    // Said once, in Quiver's words, not as rmcp's error per answer still due.
    assert!(
        err.matches("stdout is closed").count() == 1
            && err.contains("the peer is gone; ending the session"),
        "{err}"
    );
    assert!(
        !err.contains("fail to response message") && !err.contains("ERROR"),
        "{err}"
    );
    drop(stdin);
    assert_eq!(logged(&dir, "mcp__fx__sleep")["err_kind"], "cancelled");
    assert_clean_shutdown(&dir);
}

/// A stdio client that closes stdin, having written nothing, while `serve --stdio` still
/// waits for an upstream at start-up (one that never answers `initialize`, with a 60 s
/// connect timeout) has left: the server stops at once, cleanly, instead of waiting out
/// the connect timeout. (One that wrote requests first, like a piped script, is answered
/// once the wait ends: `serve_stopping_at_once_records_every_definition` in the host's
/// tests.)
#[tokio::test]
async fn closing_stdin_during_the_startup_wait_stops_the_server() {
    let dir = fresh_dir();
    let hang = dir.join("hang");
    std::fs::write(&hang, "").unwrap();
    let mut child = stdio_server_before_fx(
        &dir,
        &format!(
            "\"normal\", \"--hang-if-file\", {:?}",
            hang.to_string_lossy()
        ),
        "connect_timeout = 60",
    );
    // Closed at once: the hang-up stays visible to the server until it looks.
    drop(child.stdin.take().expect("piped"));
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the server stops well before the 60 s connect timeout")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(
        err.contains(
            "the MCP client closed stdin while the upstream servers were connecting: stopping"
        ),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_clean_shutdown(&dir);
}

/// `serve --stdio` with stdin on `/dev/null` or an empty file, or with stdout's reader
/// gone, while an upstream never answers `initialize` (60 s connect timeout): nothing can be
/// asked or answered, so the server stops at once, cleanly. Before, it waited out the
/// connect timeout. A file of requests is still answered (checked after).
#[tokio::test]
async fn empty_stdin_or_closed_stdout_during_the_startup_wait_stops_the_server() {
    for case in ["dev-null", "empty-file", "closed-stdout"] {
        let dir = fresh_dir();
        let hang = dir.join("hang");
        std::fs::write(&hang, "").unwrap();
        write_fx_config(
            &dir,
            &format!(
                "\"normal\", \"--hang-if-file\", {:?}",
                hang.to_string_lossy()
            ),
            "connect_timeout = 60",
        );
        let empty = dir.join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        let mut cmd = Command::new(quiver_binary());
        cmd.args(["serve", "--stdio"])
            .current_dir(&dir)
            .env("QUIVER_LOG", "info")
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        match case {
            "dev-null" => cmd.stdin(Stdio::null()).stdout(Stdio::null()),
            "empty-file" => cmd
                .stdin(std::fs::File::open(&empty).unwrap())
                .stdout(Stdio::null()),
            _ => cmd.stdin(Stdio::piped()).stdout(Stdio::piped()),
        };
        let mut child = cmd.spawn().expect("quiver starts");
        let stdin = child.stdin.take();
        drop(child.stdout.take());
        let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .unwrap_or_else(|_| {
                panic!("{case}: the server stops well before the 60 s connect timeout")
            })
            .unwrap();
        drop(stdin);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{case}: {}: {err}", out.status);
        let said = if case == "closed-stdout" {
            "the MCP client closed stdout (nobody reads the answers) while the upstream servers were connecting: stopping"
        } else {
            "stdin is empty (/dev/null or a file read to its end) while the upstream servers were connecting: stopping"
        };
        assert!(err.contains(said), "{case}: {err}");
        assert_clean_shutdown(&dir);
    }
}

/// The `initialize` request (id 1, protocol 2025-11-25) the stdio tests open with.
pub(crate) const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
/// The `initialized` notification that follows its answer.
pub(crate) const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// A stdio script: `initialize`, `initialized`, then `requests`, one per line.
fn script(requests: &[&str]) -> String {
    [INITIALIZE, INITIALIZED]
        .iter()
        .chain(requests)
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The `result` of the answer to request `id` among the lines of `stdout`, if any.
fn answered(stdout: &str, id: i64) -> Option<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["id"] == id && v.get("result").is_some())
        .map(|v| v["result"].clone())
}

/// `quiver serve --stdio` in `dir` with a file of `requests` (after the handshake) as its
/// stdin, run to its exit.
async fn serve_stdio_file(dir: &Path, requests: &[&str]) -> std::process::Output {
    let file = dir.join("requests.jsonl");
    std::fs::write(&file, script(requests)).unwrap();
    let out = Command::new(quiver_binary())
        .args(["serve", "--stdio"])
        .current_dir(dir)
        .stdin(std::fs::File::open(&file).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("the server exits")
        .unwrap()
}

/// A file of requests as stdin (`quiver serve --stdio < requests.jsonl`) is not an empty
/// stdin: its requests are answered.
#[tokio::test]
async fn a_file_of_requests_as_stdin_is_answered() {
    let dir = fresh_dir();
    let out = serve_stdio_file(&dir, &[r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#]).await;
    assert!(out.status.success(), "{}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        answered(&text, 2).is_some_and(|r| r.is_object()),
        "the ping was not answered: {text}"
    );
}

/// A prompt argument that is not text is refused by Quiver, naming the argument and what to
/// send (MCP's `prompts/get` takes a map of strings), before any prompt source sees it.
#[tokio::test]
async fn a_prompt_argument_that_is_not_text_is_refused_in_words() {
    let dir = fresh_dir();
    std::fs::create_dir_all(dir.join("skills/greet")).unwrap();
    std::fs::write(
        dir.join("skills/greet/SKILL.md"),
        "---\nname: greet\ndescription: Greets someone. Use when asked to greet.\n---\nGreet $ARGUMENTS warmly.\n",
    )
    .unwrap();
    std::fs::write(dir.join("quiver.toml"), "[skills]\ndirs = [\"skills\"]\n").unwrap();
    let out = serve_stdio_file(
        &dir,
        &[
            r#"{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"greet","arguments":{"who":5}}}"#,
        ],
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    let error = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["id"] == 2)
        .and_then(|v| v.get("error").cloned())
        .unwrap_or_else(|| panic!("an error answer: {text}"));
    assert_eq!(error["code"], -32602, "{error}");
    assert_eq!(
        error["message"],
        "prompt argument `who` must be a string, not 5: prompts/get takes its arguments as text (send \"5\")",
        "{error}"
    );
}

/// A piped script (`printf '...' | quiver serve --stdio`) closes stdin right after its last
/// request: a quick call is still answered before the server exits.
#[tokio::test]
async fn a_piped_scripts_last_call_is_answered() {
    use tokio::io::AsyncWriteExt;
    let dir = fresh_dir();
    let mut child = stdio_server(&dir, Stdio::inherit());
    let mut stdin = child.stdin.take().expect("piped");
    let script = script(&[
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"describe_tool","arguments":{"name":"tool_search"}}}"#,
    ]);
    stdin.write_all(script.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the server exits")
        .unwrap();
    assert!(out.status.success(), "{}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        answered(&text, 2).is_some_and(|r| r["content"].is_array()),
        "the call was not answered: {text}"
    );
}

/// `quiver serve --stdio` answers every line it cannot take, with the request's id when it
/// can be read, and goes on reading: text that is not JSON (here `Content-Length` framing),
/// a message of the wrong shape, and a line over 16 MiB. rmcp's stdio transport, used
/// before, ignored the first, answered the second without an `id`, and dropped the third.
#[tokio::test]
async fn stdio_answers_lines_it_cannot_read() {
    use tokio::io::AsyncWriteExt;
    let dir = fresh_dir();
    let mut child = stdio_server(&dir, Stdio::null());
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let writer = tokio::spawn(async move {
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"ping","params":{{"pad":"{}"}}}}"#,
            "x".repeat(17 << 20)
        );
        for line in [
            INITIALIZE,
            INITIALIZED,
            "Content-Length: 45",
            r#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#,
            &long,
            r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
        ] {
            stdin
                .write_all(format!("{line}\n").as_bytes())
                .await
                .unwrap();
        }
        stdin
    });
    let mut lines = BufReader::new(stdout).lines();
    let mut answers = Vec::new();
    while answers.len() < 5 {
        let line = tokio::time::timeout(START_TIMEOUT, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("only these lines were answered: {answers:#?}"))
            .unwrap()
            .expect("a line");
        answers.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
    }
    drop(writer.await.unwrap());
    let errors: Vec<_> = answers
        .iter()
        .filter(|a| a.get("error").is_some())
        .map(|a| {
            assert!(a.as_object().unwrap().contains_key("id"), "{a}");
            (
                a["id"].clone(),
                a["error"]["code"].as_i64().unwrap(),
                a["error"]["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(errors.len(), 3, "{answers:#?}");
    assert!(
        errors
            .iter()
            .any(|(id, code, m)| id.is_null() && *code == -32700 && m.contains("not valid JSON")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|(id, code, m)| *id == 7 && *code == -32600 && m.contains("`jsonrpc` must be")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|(id, code, m)| *id == 9
            && *code == -32600
            && m.contains("longer than 16777216 bytes")),
        "{errors:?}"
    );
    // The ping after them all is answered.
    assert!(
        answers
            .iter()
            .any(|a| a["id"] == 2 && a["result"].is_object()),
        "{answers:#?}"
    );
}

#[tokio::test]
async fn sigterm_stops_quiver_serve_cleanly() {
    let mut server = Server::start(quiver_binary(), &["serve", "--listen", "127.0.0.1:0"]).await;
    let status = server.terminate().await;
    assert!(
        status.success(),
        "quiver serve exited with {status} on SIGTERM"
    );
}

/// Two `quiver serve` processes on one store each keep their own reload report: `quiver
/// status` names both, and when the configuration file no longer loads it says so and that
/// each keeps running what it has. A server that stops takes its report with it.
#[tokio::test]
async fn status_names_every_running_server_and_what_a_broken_file_did_to_each() {
    let dir = fresh_dir();
    let status = |dir: &Path| {
        let out = std::process::Command::new(quiver_binary())
            .arg("status")
            .current_dir(dir)
            .output()
            .expect("quiver status runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mut first =
        Server::start_in(quiver_binary(), &["serve", "--listen", "127.0.0.1:0"], &dir).await;
    let mut second =
        Server::start_in(quiver_binary(), &["serve", "--listen", "127.0.0.1:0"], &dir).await;
    let (a, b) = (first.pid(), second.pid());
    let (_, out, _) = status(&dir);
    for pid in [a, b] {
        assert!(
            out.contains(&format!("quiver serve pid {pid}: running for")),
            "status names server {pid}: {out}"
        );
    }

    std::fs::write(
        dir.join("quiver.toml"),
        "[limits]\nmax_result_chars = \"many\"\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (code, out, err) = loop {
        let (code, out, err) = status(&dir);
        if out
            .matches("failed, the running configuration stays")
            .count()
            == 2
        {
            break (code, out, err);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "both servers report the failed reload: {out}{err}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("max_result_chars"), "the file's error: {err}");
    for pid in [a, b] {
        assert!(
            out.contains(&format!(
                "quiver serve pid {pid} keeps the configuration it runs"
            )),
            "{out}"
        );
    }

    // A server's `${env:...}` that is not set fails past the file's loading: said the same.
    std::fs::write(
        dir.join("quiver.toml"),
        "[[mcp.servers]]\nname = \"git\"\ncommand = \"python3\"\nenv = { T = \"${env:QUIVER_E2E_UNSET_VAR}\" }\n",
    )
    .unwrap();
    let (code, out, err) = status(&dir);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("QUIVER_E2E_UNSET_VAR"), "the error: {err}");
    for pid in [a, b] {
        assert!(
            out.contains(&format!(
                "quiver serve pid {pid} keeps the configuration it runs"
            )),
            "{out}"
        );
    }

    std::fs::remove_file(dir.join("quiver.toml")).unwrap();
    assert!(first.terminate().await.success());
    let (_, out, _) = status(&dir);
    assert!(
        !out.contains(&format!("pid {a}")) && out.contains(&format!("pid {b}")),
        "only the running server is named: {out}"
    );
    assert!(second.terminate().await.success());
}

/// SIGHUP reloads `quiver serve`'s configuration (the Unix convention for daemons): it
/// serves on, and says so in the reload status `quiver status` reads; SIGTERM then stops it
/// cleanly, exit 0.
#[tokio::test]
async fn a_hangup_reloads_quiver_serve_and_sigterm_stops_it() {
    let dir = fresh_dir();
    let mut server =
        Server::start_in(quiver_binary(), &["serve", "--listen", "127.0.0.1:0"], &dir).await;
    let pid = server.child.id().expect("running").to_string();
    send_signal(&pid, "-HUP").await;
    let status_file = dir.join(format!("quiver.db.reload.{pid}.json"));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let report = loop {
        let report: Option<serde_json::Value> = std::fs::read_to_string(&status_file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        if let Some(r) = report.filter(|r| r["trigger"] == "SIGHUP") {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reload status after SIGHUP"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(report["ok"], true, "{report}");
    assert!(
        server.child.try_wait().expect("waitable").is_none(),
        "still serving after SIGHUP"
    );
    send_signal(&pid, "-TERM").await;
    let status = tokio::time::timeout(Duration::from_secs(30), server.child.wait())
        .await
        .expect("the server exits")
        .expect("wait works");
    assert!(
        status.success(),
        "quiver serve exited with {status} on SIGTERM"
    );
    assert_clean_shutdown(&dir);

    // Started under `nohup` (SIGHUP ignored), a SIGHUP while serving still reloads (a
    // daemon's operator sends it for that) and the server serves on.
    let dir = fresh_dir();
    let mut child = Command::new("nohup")
        .arg(quiver_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nohup runs");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
    let url = line_of(&mut stdout).await;
    let pid = child.id().expect("running").to_string();
    for signal in ["-HUP", "-TERM"] {
        if signal == "-TERM" {
            let authority = url.trim_start_matches("http://").trim_end_matches("/mcp");
            let health = tokio::net::TcpStream::connect(authority).await;
            assert!(health.is_ok(), "still serving after SIGHUP under nohup");
            assert!(
                child.try_wait().expect("waitable").is_none(),
                "still running"
            );
            let status_file = dir.join(format!("quiver.db.reload.{pid}.json"));
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !std::fs::read_to_string(&status_file).is_ok_and(|t| t.contains("SIGHUP")) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no reload after SIGHUP under nohup"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        send_signal(&pid, signal).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("SIGTERM stops it")
        .expect("wait works");
    assert!(status.success(), "{status}");
}

/// A stop that cannot finish (another process holds the store's write lock, so the execution
/// log's last rows wait out their retries, about a minute) ends at once on a further signal,
/// saying what is lost. Before, signals after the first were ignored once the server had
/// stopped serving, and the stop took 52-59 s.
#[tokio::test]
async fn a_signal_while_stopping_ends_the_stop_at_once() {
    use tokio::io::AsyncWriteExt;
    let dir = fresh_dir();
    let mut child = stdio_server(&dir, Stdio::piped());
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
    let send = |line: &str| format!("{line}\n");
    stdin
        .write_all(send(INITIALIZE).as_bytes())
        .await
        .expect("writes");
    let init = line_of(&mut stdout).await;
    assert!(init.contains("protocolVersion"), "{init}");
    // The store is up; now another process takes its write lock and keeps it.
    let lock = rusqlite::Connection::open(dir.join("quiver.db")).expect("the store exists");
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("the write lock");
    stdin
        .write_all(send(INITIALIZED).as_bytes())
        .await
        .expect("writes");
    stdin
        .write_all(send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"describe a tool"}}}"#).as_bytes())
        .await
        .expect("writes");
    let answer = answer_to(&mut stdout, 2).await;
    assert!(answer.contains("\"result\""), "{answer}");
    let pid = child.id().expect("running").to_string();
    send_signal(&pid, "-TERM").await;
    // Stopping now waits on the lock for the call's row. Signals every 2 s: one that lands
    // while the server still drains ends the drain; the next one the stop.
    let mut waiting = Box::pin(child.wait_with_output());
    let out = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            tokio::select! {
                out = &mut waiting => return out,
                () = tokio::time::sleep(Duration::from_secs(2)) => send_signal(&pid, "-TERM").await,
            }
        }
    })
    .await
    .expect("a further signal ends the stop, long before the lock's retries would")
    .expect("wait works");
    drop(lock);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains(
            "signal 15 while stopping: exiting now; execution-log rows not written yet are lost"
        ),
        "{stderr}"
    );
}

/// A client that sent half a request keeps its connection open, so after SIGTERM `quiver
/// serve` waits (up to 5 s) for it; a second signal ends that wait at once, and the stop is
/// still clean (exit 0, the execution log closed).
#[tokio::test]
async fn a_second_signal_ends_the_drain_at_once() {
    use tokio::io::AsyncWriteExt;
    let dir = fresh_dir();
    let mut child = Command::new(quiver_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("quiver starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
    let url = line_of(&mut stdout).await;
    let authority = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut held = tokio::net::TcpStream::connect(&authority)
        .await
        .expect("connects");
    // A whole request answered first: the server has accepted the connection and serves
    // it, so the half request below is read by a running connection task.
    {
        use tokio::io::AsyncReadExt;
        held.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await
            .expect("a health check");
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&answer).contains("\r\n\r\n") {
            let n = tokio::time::timeout(START_TIMEOUT, held.read(&mut buf))
                .await
                .expect("the health answer in time")
                .expect("readable");
            assert!(n > 0, "the server closed the connection");
            answer.extend_from_slice(&buf[..n]);
        }
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{"
    );
    held.write_all(head.as_bytes())
        .await
        .expect("half a request");
    // Let the server read the head, so the connection is one with a request under way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = child.id().expect("running").to_string();
    for signal in ["-TERM", "-INT"] {
        send_signal(&pid, signal).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the server exits")
        .expect("wait works");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}: {stderr}", out.status);
    assert!(
        stderr.contains("second shutdown signal: closing open connections now"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("connections still open"),
        "the server waited out the drain: {stderr}"
    );
    drop(held);
    // The stop was clean: the execution log recorded it.
    assert_clean_shutdown(&dir);
}

/// An `mcpServers` file naming server-everything (npm) over stdio as `everything`.
/// server-everything's command, installed by `.ci/setup-peers` (a test fails when it is
/// missing).
pub(crate) fn everything_bin() -> PathBuf {
    let everything = peers().join("npm/node_modules/.bin/mcp-server-everything");
    assert!(
        everything.exists(),
        "{} is missing: run `bash .ci/setup-peers`",
        everything.display()
    );
    everything
}

fn everything_mcp_json() -> PathBuf {
    let everything = everything_bin();
    let path = fresh_dir().join("mcp.json");
    std::fs::write(
        &path,
        serde_json::json!({"mcpServers": {"everything": {"command": everything}}}).to_string(),
    )
    .expect("the config is written");
    path
}

/// A conversation's working set is written to the store while `quiver serve` runs, so a
/// server restarted on the same database after a crash (SIGKILL: no shutdown save) gives
/// the same conversation key its tools back.
#[tokio::test]
async fn a_conversations_working_set_survives_a_crash() {
    let config = everything_mcp_json();
    let config = config.to_str().expect("utf-8 path");
    let dir = fresh_dir();
    let args = ["--mcp-config", config, "serve", "--listen", "127.0.0.1:0"];
    let tool = "mcp__everything__echo";
    let mut first = Server::start_in(quiver_binary(), &args, &dir).await;
    let db = dir.join("quiver.db");
    let db = db.to_str().expect("utf-8 path");
    run_script(
        "restore.py",
        &[
            &first.url,
            tool,
            "--conversation",
            "restore-e2e",
            "--search",
            "echo back a message",
            "--db",
            db,
        ],
    )
    .await;
    first.child.kill().await.expect("SIGKILL");
    let second = Server::start_in(quiver_binary(), &args, &dir).await;
    run_script(
        "restore.py",
        &[
            &second.url,
            tool,
            "--conversation",
            "restore-e2e",
            "--expect",
        ],
    )
    .await;
}

/// `relay.py MODE` against `quiver serve` with server-everything (stdio) as its upstream.
async fn relay_through_quiver(mode: &str) {
    let server = serving_mcp_config(&everything_mcp_json()).await;
    run_script("relay.py", &[&server.url, mode]).await;
}

/// `quiver --mcp-config CONFIG serve` on a free port.
async fn serving_mcp_config(config: &Path) -> Server {
    let config = config.to_str().expect("utf-8 path");
    Server::start(
        quiver_binary(),
        &["--mcp-config", config, "serve", "--listen", "127.0.0.1:0"],
    )
    .await
}

/// server-everything registers its sampling, elicitation and roots tools only for a client
/// that declares those capabilities; Quiver declares them upstream, and relays the requests
/// to the downstream client whose call caused them (HTTP session -> stdio upstream).
#[tokio::test]
async fn server_requests_reach_the_calling_client_through_quiver() {
    relay_through_quiver("--with-capabilities").await;
}

/// One upstream connection serves every client, and server-everything keeps the roots it
/// fetched: each client (two sessions, one without roots, one 2026-07-28) still sees only its
/// own roots, over a stdio upstream and over a streamable-HTTP one (the direct call path).
#[tokio::test]
async fn each_client_sees_its_own_roots_through_a_shared_upstream() {
    relay_through_quiver("--roots-per-client").await;
    let (_upstream, server) = quiver_before_everything_over_http().await;
    run_script("relay.py", &[&server.url, "--roots-per-client"]).await;
}

/// server-everything (npm) listening on streamable HTTP, and `quiver serve` with it as
/// `everything` (the direct call path); both are stopped when dropped.
async fn quiver_before_everything_over_http() -> (tokio::process::Child, Server) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port();
    let everything = peers().join("npm/node_modules/.bin/mcp-server-everything");
    let upstream = Command::new(&everything)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("server-everything starts");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "server-everything never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let config = fresh_dir().join("mcp.json");
    std::fs::write(
        &config,
        serde_json::json!({"mcpServers": {"everything": {"url": url}}}).to_string(),
    )
    .expect("the config is written");
    (upstream, serving_mcp_config(&config).await)
}

/// A tool result reaches the client as server-everything sent it, over a stdio upstream
/// and a streamable-HTTP one: text after an image or an embedded resource stays after it,
/// and content annotations and a resource link's description are kept (the official Python
/// client compares each result with the same call made directly).
#[tokio::test]
async fn results_keep_their_blocks_order_and_annotations_through_quiver() {
    let everything = peers().join("npm/node_modules/.bin/mcp-server-everything");
    let everything = everything.to_str().expect("utf-8 path");
    let server = serving_mcp_config(&everything_mcp_json()).await;
    run_script("fidelity.py", &[&server.url, everything]).await;
    let (_upstream, server) = quiver_before_everything_over_http().await;
    run_script("fidelity.py", &[&server.url, everything]).await;
}

/// A client that declared no sampling gets a clear refusal through the upstream tool's error.
#[tokio::test]
async fn sampling_is_refused_for_a_client_that_did_not_declare_it() {
    relay_through_quiver("--without-capabilities").await;
}

/// Elicitation goes out only in a mode the calling client declared: `elicitation: {}` is
/// form only, so a URL-mode request is refused in words and never sent; a client declaring
/// both gets it and its answer comes back.
#[tokio::test]
async fn elicitation_is_sent_only_in_a_declared_mode() {
    let server = Server::start(fixture_binary(), &[]).await;
    run_script("elicit_modes.py", &[&server.url]).await;
}

/// A 2026-07-28 client cannot be sent server-to-client requests: a tool's sampling and
/// elicitation reach it as InputRequiredResult rounds (SEP-2322) the official SDK drives, the
/// call waiting in Quiver between them; forged, reused and unanswered rounds fail in words.
#[tokio::test]
async fn server_requests_reach_a_stateless_client_as_input_rounds() {
    let server = Server::start(fixture_binary(), &[]).await;
    run_script("relay.py", &[&server.url, "--stateless-fixture"]).await;
}

/// An upstream's elicitation while it renders a prompt or reads a resource (the content
/// fixture behind Quiver's MCP client over streamable HTTP) reaches a 2026-07-28 client as an
/// InputRequiredResult round of `prompts/get` / `resources/read`, a 2025-11-25 session as a
/// request, and a client without the callback as -32021; cancelling a `prompts/get` cancels
/// the upstream's rendering.
#[tokio::test]
async fn an_upstreams_requests_during_prompts_get_reach_the_client() {
    let server = Server::start(fixture_binary(), &["--upstream", "http"]).await;
    run_script("relay.py", &[&server.url, "--prompt-rounds"]).await;
}

/// The same rounds carry an upstream's own requests (server-everything over stdio, through
/// `quiver serve`) to a 2026-07-28 client while the upstream's call waits for the answer.
#[tokio::test]
async fn upstream_requests_reach_a_stateless_client_through_quiver() {
    relay_through_quiver("--stateless-upstream").await;
}

/// The same over stdio: a 2026-07-28 client launches `quiver serve --stdio`, whose upstream
/// server-everything asks for sampling, elicitation and roots during its calls.
#[tokio::test]
async fn upstream_requests_reach_a_stateless_client_over_stdio() {
    let config = everything_mcp_json();
    let quiver_args =
        serde_json::json!(["--mcp-config", config.to_str().expect("utf-8 path")]).to_string();
    let bin = quiver_binary();
    run_script_with_env(
        "relay.py",
        &[bin.to_str().expect("utf-8 path"), "--stateless-stdio"],
        &[("QUIVER_ARGS", &quiver_args)],
    )
    .await;
}

/// The conformance suite's prefix (`.ci/setup-peers` installs the suite and the Node it
/// needs, npm's `node@22`, there).
fn conformance_prefix() -> PathBuf {
    let prefix = peers().join("conformance/node_modules/.bin");
    for bin in ["conformance", "node"] {
        assert!(
            prefix.join(bin).exists(),
            "{} is missing: run `bash .ci/setup-peers` to install the MCP conformance suite and Node 22",
            prefix.join(bin).display()
        );
    }
    prefix
}

/// The conformance CLI, with Node 22 first on its PATH (the suite's `#!/usr/bin/env node`
/// must not find an older system Node).
fn conformance_command() -> Command {
    conformance_command_from(&conformance_prefix())
}

/// The conformance CLI installed in the `.bin` folder `bin`, run with the Node 22 of the
/// 0.1.16 suite's prefix.
fn conformance_command_from(bin: &Path) -> Command {
    let node = conformance_prefix();
    let path = std::env::join_paths([bin.to_path_buf(), node].into_iter().chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("a valid PATH");
    let mut cmd = Command::new(bin.join("conformance"));
    cmd.env("PATH", path);
    cmd
}

/// Runs the conformance CLI with `args`, its baseline `tests/fixtures/conformance/
/// {side}-expected-failures.yml` and a fresh output folder named after `run`; at most 300 s.
pub(crate) async fn run_conformance(args: &[&str], side: &str, run: &str) -> std::process::Output {
    run_conformance_with(conformance_command(), args, side, run).await
}

async fn run_conformance_with(
    mut cli: Command,
    args: &[&str],
    side: &str,
    run: &str,
) -> std::process::Output {
    let out_dir = out_dir(run);
    let baseline = repo_root().join(format!(
        "tests/fixtures/conformance/{side}-expected-failures.yml"
    ));
    let child = cli
        .args(args)
        .arg("--expected-failures")
        .arg(&baseline)
        .arg("-o")
        .arg(&out_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the conformance CLI starts");
    tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("the conformance suite finishes in 300 s")
        .expect("the conformance CLI runs")
}

/// The 2026-07-28 server scenarios of the conformance suite's 0.2.0 pre-release (every
/// suite: stateless requests, `server/discover`, InputRequiredResult rounds, caching hints,
/// SEP-2243 headers, plus the scenarios shared with 2025) against the fixture server, its
/// resources and prompts from an upstream fixture over stdio. The baseline
/// (`server-2026-expected-failures.yml`) would name what Quiver does not serve, and why; it
/// is empty.
#[tokio::test]
async fn the_2026_conformance_scenarios_pass() {
    let bin = peers().join("conformance-next/node_modules/.bin");
    assert!(
        bin.join("conformance").exists(),
        "{} is missing: run `bash .ci/setup-peers`",
        bin.display()
    );
    let server = Server::start(
        fixture_binary(),
        &["--progress-ms", "100", "--upstream", "stdio"],
    )
    .await;
    let out = run_conformance_with(
        conformance_command_from(&bin),
        &[
            "server",
            "--url",
            &server.url,
            "--spec-version",
            "2026-07-28",
            "--suite",
            "all",
        ],
        "server-2026",
        "2026",
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout.split("=== SUMMARY ===").nth(1).unwrap_or(&stdout);
    println!("2026:{summary}");
    assert!(
        out.status.success(),
        "conformance failures outside the baseline (2026):\n{summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The scenarios this work is about ran and passed every check (at least as many as
    // they had on 2026-11-30), not just stayed out of the failures.
    for (scenario, at_least) in [
        ("server-stateless", 30),
        ("input-required-result-multi-round", 4),
        ("input-required-result-multiple-input-requests", 3),
        ("input-required-result-tampered-state", 2),
        ("input-required-result-capability-check", 2),
        ("http-custom-header-server-validation", 10),
        ("sep-2164-resource-not-found", 4),
        // prompts/get in rounds: the upstream fixture elicits while rendering the prompt.
        ("input-required-result-non-tool-request", 3),
    ] {
        let line = summary
            .lines()
            .find(|l| l.contains(&format!(" {scenario}: ")))
            .unwrap_or_else(|| panic!("{scenario} did not run:\n{summary}"));
        let passed: usize = line
            .split(": ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if scenario == "server-stateless" && line.contains(" 0 failed, ") {
            // Warnings only: accepted when each is the suite's timed SHOULD check alone.
            let timed = timed_out_list_changed_checks(&out_dir("2026"), scenario);
            assert!(
                timed > 0 && line.ends_with(&format!(" 0 failed, {timed} warnings")),
                "{scenario}: {line} (warnings other than a list_changed that missed the suite's 1.5 s window)"
            );
            assert!(passed + timed >= at_least, "{scenario}: {line}");
            println!(
                "note: {timed} list_changed notification(s) missed the suite's 1.5 s window on this loaded machine (delivery itself: tests/fixtures/mcp_server/client_flow.py)"
            );
            continue;
        }
        assert!(
            line.contains("✓") && line.ends_with(" 0 failed") && passed >= at_least,
            "{scenario}: {line} (want ✓, at least {at_least} passed, 0 failed)"
        );
    }
}

/// How many checks of `scenario`'s results under `dir` are warnings of the one kind the
/// 2026 suite times: a `list_changed` that did not reach the open `subscriptions/listen`
/// stream within 1.5 s of the trigger call (a SHOULD). Under a full parallel test run on two
/// cores the chain (a call through Quiver to the upstream fixture, its `list_changed`, the
/// re-list, the notification) has once taken longer; the delivery itself, without a clock,
/// is what `client_flow.py` asserts with the official Python client. Any other warning
/// counts as 0 here, so the caller fails.
fn timed_out_list_changed_checks(dir: &std::path::Path, scenario: &str) -> usize {
    const TIMED: [&str; 2] = [
        "sep-2575-server-sends-tools-list-changed-on-subscription",
        "sep-2575-server-sends-prompts-list-changed-on-subscription",
    ];
    let Some(checks) = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains(scenario))
        })
        .and_then(|p| std::fs::read_to_string(p.join("checks.json")).ok())
        .and_then(|t| serde_json::from_str::<Vec<serde_json::Value>>(&t).ok())
    else {
        return 0;
    };
    let warnings: Vec<&serde_json::Value> =
        checks.iter().filter(|c| c["status"] == "WARNING").collect();
    let timed = warnings
        .iter()
        .filter(|c| {
            TIMED.contains(&c["id"].as_str().unwrap_or_default())
                && c["errorMessage"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("Mutated the "))
        })
        .count();
    if timed == warnings.len() { timed } else { 0 }
}

/// The output folder [`run_conformance_with`] gives the run named `run`.
fn out_dir(run: &str) -> std::path::PathBuf {
    sweep_stale_dirs();
    std::env::temp_dir().join(format!("quiver-conformance-{}-{run}", std::process::id()))
}

/// Runs the official MCP conformance suite (0.1.16) server scenarios against `url`, checked
/// against the baseline of scenarios Quiver does not serve yet (sampling, elicitation and
/// logging from inside a tool call); returns the summary.
async fn conformance(url: &str, run: &str) -> String {
    let out = run_conformance(&["server", "--url", url], "server", run).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .split("=== SUMMARY ===")
        .nth(1)
        .unwrap_or(&stdout)
        .to_owned();
    println!("{run}:{summary}");
    assert!(
        out.status.success(),
        "conformance failures outside the baseline ({run}):\n{summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    summary
}

/// The suite against the fixture server started with `--upstream <upstream>` (and `extra`);
/// `scenario` must be among the passed ones (the run did reach the passthrough).
async fn conformance_through(upstream: &str, extra: &[&str], scenario: &str) {
    let mut args = vec!["--progress-ms", "100", "--upstream", upstream];
    args.extend_from_slice(extra);
    let server = Server::start(fixture_binary(), &args).await;
    let summary = conformance(&server.url, upstream).await;
    assert!(
        summary.contains(&format!("{scenario}: 1 passed")),
        "{summary}"
    );
}

/// The suite over streamable HTTP against the fixture server, whose resources, prompts and
/// completions come from an upstream fixture connected over stdio and pass through
/// Quiver's MCP client.
#[tokio::test]
async fn the_conformance_suite_passes_with_a_stdio_upstream() {
    conformance_through("stdio", &[], "resources-read-binary").await;
}

/// The same with the upstream fixture connected over streamable HTTP.
#[tokio::test]
async fn the_conformance_suite_passes_with_an_http_upstream() {
    conformance_through("http", &[], "prompts-get-with-image").await;
}

/// `quiver serve --stdio` in the path: the suite drives the fixture server over HTTP (it
/// takes only a URL), whose content upstream is the real `quiver serve --stdio`, whose own
/// upstream is the content fixture over stdio. Every resource, prompt, completion and
/// subscription crosses the stdio server in both directions.
#[tokio::test]
async fn the_conformance_suite_passes_through_quiver_serve_over_stdio() {
    let quiver = quiver_binary();
    let quiver = quiver.to_str().expect("utf-8 path");
    conformance_through("quiver-stdio", &["--quiver", quiver], "resources-subscribe").await;
}

/// SIGTERM with a call in flight: the call is cancelled (the tool sees it), the client's
/// call ends, and the server exits cleanly.
#[tokio::test]
async fn sigterm_cancels_in_flight_calls() {
    let mut server = Server::start(fixture_binary(), &["--progress-ms", "100"]).await;
    let script = repo_root().join("tests/fixtures/mcp_server/hold_call.py");
    let mut client = Command::new(python())
        .arg(&script)
        .arg(&server.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let mut out = BufReader::new(client.stdout.take().expect("piped")).lines();
    let first = tokio::time::timeout(SCRIPT_TIMEOUT, out.next_line())
        .await
        .expect("the call starts in time")
        .expect("readable");
    assert_eq!(first.as_deref(), Some("running"));
    let status = server.terminate().await;
    assert!(status.success(), "the server exited with {status}");
    assert_eq!(
        server.next_line().await.as_deref(),
        Some("slow_count cancelled"),
        "the in-flight call was cancelled"
    );
    let ended = tokio::time::timeout(SCRIPT_TIMEOUT, out.next_line())
        .await
        .expect("the client's call ends in time")
        .expect("readable")
        .unwrap_or_default();
    assert!(ended.starts_with("ended:"), "{ended}");
    let code = tokio::time::timeout(SCRIPT_TIMEOUT, client.wait())
        .await
        .expect("the client exits in time")
        .expect("wait works");
    assert!(
        code.success(),
        "the call ran to the end instead of being cancelled: {ended}"
    );
}

/// `quiver serve --stdio` with the Python client launching it as a subprocess.
#[tokio::test]
async fn the_python_client_drives_quiver_serve_over_stdio() {
    let bin = quiver_binary();
    run_script(
        "client_flow.py",
        &[
            bin.to_str().expect("utf-8 path"),
            "--stdio",
            "--mode",
            "legacy",
            "--expect-version",
            "2025-11-25",
        ],
    )
    .await;
}

/// A `quiver.toml` with server-everything (npm) as "everything" and a server whose command
/// does not exist as "down"; returns its path.
fn everything_config() -> PathBuf {
    everything_config_with("")
}

/// [`everything_config`] with `extra` (TOML keys) in the "everything" server's table.
fn everything_config_with(extra: &str) -> PathBuf {
    let everything = everything_bin();
    let dir = fresh_dir();
    let path = dir.join("quiver.toml");
    let toml = format!(
        "[store]\npath = {db:?}\n\n[[mcp.servers]]\nname = \"everything\"\ncommand = {everything:?}\n{extra}\n[[mcp.servers]]\nname = \"down\"\ncommand = {down:?}\n",
        db = dir.join("quiver.db").to_string_lossy(),
        everything = everything.to_string_lossy(),
        down = dir.join("no-such-server").to_string_lossy(),
    );
    std::fs::write(&path, toml).expect("the config is written");
    path
}

/// server-everything's resources, templates, prompts and completions through `quiver
/// serve` over HTTP on the session era; an unknown URI, an unknown prompt and a server
/// that is down are clear errors.
#[tokio::test]
async fn upstream_resources_and_prompts_pass_through_on_the_session_era() {
    passthrough_over_http("legacy").await;
}

/// `passthrough.py` against `quiver serve` over HTTP (server-everything and a down server
/// upstream), with the Python client in `mode`.
async fn passthrough_over_http(mode: &str) {
    passthrough_through(&everything_config(), "everything", mode).await;
}

/// `passthrough.py --kind KIND --mode MODE` against `quiver serve --config CONFIG` over HTTP.
async fn passthrough_through(config: &std::path::Path, kind: &str, mode: &str) {
    let server = Server::start(
        quiver_binary(),
        &[
            "--config",
            config.to_str().expect("utf-8 path"),
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    run_script(
        "passthrough.py",
        &[&server.url, "--kind", kind, "--mode", mode],
    )
    .await;
}

/// The same on the stateless 2026-07-28 era (results of the 2025-era upstream are marked
/// `resultType: complete`).
#[tokio::test]
async fn upstream_resources_and_prompts_pass_through_on_the_stateless_era() {
    passthrough_over_http("auto").await;
}

/// The same through `quiver serve --stdio`, launched by the Python client.
#[tokio::test]
async fn upstream_resources_and_prompts_pass_through_quiver_serve_over_stdio() {
    let config = everything_config();
    let quiver_args = serde_json::json!(["--config", config]).to_string();
    let bin = quiver_binary();
    run_script_with_env(
        "passthrough.py",
        &[
            bin.to_str().expect("utf-8 path"),
            "--stdio",
            "--kind",
            "everything",
            "--mode",
            "legacy",
        ],
        &[("QUIVER_ARGS", &quiver_args)],
    )
    .await;
}

/// A subscription made through Quiver reaches the upstream, and the upstream's
/// `notifications/resources/updated` come back to the subscribed session.
#[tokio::test]
async fn resource_updates_are_relayed_to_the_subscribed_session() {
    resource_updates_through_the_fixture("legacy").await;
}

/// `passthrough.py --kind fixture` against the fixture server with a stdio content upstream.
async fn resource_updates_through_the_fixture(mode: &str) {
    let server = Server::start(fixture_binary(), &["--upstream", "stdio"]).await;
    run_script(
        "passthrough.py",
        &[&server.url, "--kind", "fixture", "--mode", mode],
    )
    .await;
}

/// The upstream's resource and prompt list changes reach the session: `quiver serve` over
/// HTTP with the adapter's Python fault fixture (stdio) as "fx", whose `grow_content` adds a
/// resource and a prompt and says so.
#[tokio::test]
async fn upstream_list_changes_reach_the_session() {
    list_changes_through_quiver("legacy").await;
}

/// The same on the stateless 2026-07-28 era, through a `subscriptions/listen` stream.
#[tokio::test]
async fn upstream_list_changes_reach_a_listen_stream() {
    list_changes_through_quiver("auto").await;
}

/// A resource subscription made in a `subscriptions/listen` stream (2026-07-28) reaches the
/// upstream, and its `notifications/resources/updated` come back on that stream.
#[tokio::test]
async fn resource_updates_reach_a_listen_stream() {
    resource_updates_through_the_fixture("auto").await;
}

async fn list_changes_through_quiver(mode: &str) {
    let fixture = repo_root().join("crates/mcp-adapter/tests/fixtures/fault_server.py");
    let dir = fresh_dir();
    let config = dir.join("quiver.toml");
    let toml = format!(
        "[store]\npath = {db:?}\n\n[[mcp.servers]]\nname = \"fx\"\ncommand = {python:?}\nargs = [{fixture:?}]\n",
        db = dir.join("quiver.db").to_string_lossy(),
        python = python().to_string_lossy(),
        fixture = fixture.to_string_lossy(),
    );
    std::fs::write(&config, toml).expect("the config is written");
    passthrough_through(&config, "grow", mode).await;
}

/// A session hears of the list changes of the servers its token reaches, not of others':
/// `quiver serve` with the fault fixture as "fx" and "fy", a token limited to fx
/// (`allowed_servers`) and one without limits, whose client grows both servers' lists.
#[tokio::test]
async fn list_changes_reach_only_the_sessions_whose_token_reaches_the_server() {
    scoped_list_changes("legacy").await;
}

/// The same through a `subscriptions/listen` stream (2026-07-28).
#[tokio::test]
async fn list_changes_reach_only_the_listen_streams_whose_token_reaches_the_server() {
    scoped_list_changes("auto").await;
}

async fn scoped_list_changes(mode: &str) {
    let fixture = repo_root().join("crates/mcp-adapter/tests/fixtures/fault_server.py");
    let dir = fresh_dir();
    let config = dir.join("quiver.toml");
    let mut toml = format!(
        "[store]\npath = {:?}\n\n",
        dir.join("quiver.db").to_string_lossy()
    );
    for name in ["fx", "fy"] {
        toml.push_str(&format!(
            "[[mcp.servers]]\nname = \"{name}\"\ncommand = {python:?}\nargs = [{fixture:?}]\nrequired = true\n\n",
            python = python().to_string_lossy(),
            fixture = fixture.to_string_lossy(),
        ));
    }
    toml.push_str(concat!(
        "[[auth.tokens]]\nname = \"all\"\ntoken = \"all-secret-1\"\n\n",
        "[[auth.tokens]]\nname = \"fx\"\ntoken = \"fx-secret-1\"\nallowed_servers = [\"fx\"]\n",
    ));
    std::fs::write(&config, toml).expect("the config is written");
    passthrough_through(&config, "scoped", mode).await;
}

/// `GET path` on the server at `url` (its `/mcp` URL) with a raw HTTP/1.1 request: the status
/// and the body.
pub(crate) async fn probe(url: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .expect("the server accepts");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.expect("sent");
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut raw))
        .await
        .expect("the probe answers in time")
        .expect("readable");
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP status line: {raw:?}"));
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// The processes `pid` started whose command line mentions `needle` (Linux: every thread's
/// `children`; a child that is only being spawned, or failing to, does not count).
fn children_of(pid: u32, needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc is readable") {
        let path = task.expect("a task").path().join("children");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        out.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .filter(|child| {
                    std::fs::read(format!("/proc/{child}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
                }),
        );
    }
    out
}

/// Polls `/readyz` until `want(status, body)` holds; the last answer.
async fn readyz_until(url: &str, want: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = probe(url, "/readyz").await;
        if want(status, &body) || tokio::time::Instant::now() >= deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The operator probes of a real `quiver serve`: `/healthz` answers while it serves;
/// `/readyz` is ready while the required upstream (server-everything) is connected, not while
/// it is down after its process died, and ready again once Quiver has restarted it. An
/// optional server that is down never makes it unready.
#[tokio::test]
async fn readiness_follows_the_required_upstreams() {
    let config = everything_config_with("required = true\n");
    let config = config.to_str().expect("utf-8 path");
    let server = Server::start(
        quiver_binary(),
        &["--config", config, "serve", "--listen", "127.0.0.1:0"],
    )
    .await;
    assert_eq!(
        probe(&server.url, "/healthz").await,
        (200, r#"{"status":"ok"}"#.to_owned())
    );
    let ready = |status: u16, _: &str| status == 200;
    let (status, body) = readyz_until(&server.url, ready).await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ready"}"#));

    // Kill the upstream's process: not ready (naming it) until Quiver has started it again.
    let pid = server.child.id().expect("quiver runs");
    let upstream = children_of(pid, "everything");
    assert_eq!(
        upstream.len(),
        1,
        "one server-everything child: {upstream:?}"
    );
    let killed = std::process::Command::new("kill")
        .args(["-9", &upstream[0].to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let (status, body) = readyz_until(&server.url, |s, _| s == 503).await;
    assert_eq!(
        status, 503,
        "not ready while the required upstream is down: {body}"
    );
    let body: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body["status"], "not ready");
    let reasons = body["reasons"].as_array().expect("reasons");
    assert!(
        reasons.len() == 1
            && reasons[0]
                .as_str()
                .is_some_and(|r| r.contains("required MCP server \"everything\"")),
        "only the required server is named: {body}"
    );
    assert_eq!(probe(&server.url, "/healthz").await.0, 200, "still alive");
    let (status, body) = readyz_until(&server.url, ready).await;
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"status":"ready"}"#),
        "ready again after the restart"
    );
    let restarted = children_of(pid, "everything");
    assert!(
        restarted.len() == 1 && restarted != upstream,
        "a new upstream process: {restarted:?} (was {upstream:?})"
    );
}

/// The one warning the 2026 run tolerates is read from the suite's own results: a timed
/// `list_changed` check, and only when it is every warning of the scenario.
#[test]
fn only_the_timed_list_changed_warning_is_tolerated() {
    let dir = std::env::temp_dir().join(format!("quiver-timed-{}", std::process::id()));
    let at = dir.join("server-server-stateless-2026-12-02T01-00-00-000Z");
    std::fs::create_dir_all(&at).unwrap();
    let write = |checks: serde_json::Value| {
        std::fs::write(at.join("checks.json"), checks.to_string()).unwrap();
    };
    let timed = serde_json::json!({"id": "sep-2575-server-sends-tools-list-changed-on-subscription", "status": "WARNING",
        "errorMessage": "Mutated the tool list but no notifications/tools/list_changed arrived on the open subscription stream. This is a SHOULD requirement."});
    let ok =
        serde_json::json!({"id": "sep-2575-server-sends-subscription-ack", "status": "SUCCESS"});
    write(serde_json::json!([ok, timed]));
    assert_eq!(timed_out_list_changed_checks(&dir, "server-stateless"), 1);
    // The hook missing is a warning of the same check, but not a timing one.
    let untestable = serde_json::json!({"id": "sep-2575-server-sends-tools-list-changed-on-subscription", "status": "WARNING",
        "errorMessage": "server declares tools.listChanged but does not expose the diagnostic hook"});
    write(serde_json::json!([ok, untestable]));
    assert_eq!(timed_out_list_changed_checks(&dir, "server-stateless"), 0);
    let other = serde_json::json!({"id": "sep-2575-server-identifies-in-result-meta", "status": "WARNING", "errorMessage": "No serverInfo"});
    write(serde_json::json!([timed, other]));
    assert_eq!(timed_out_list_changed_checks(&dir, "server-stateless"), 0);
    assert_eq!(
        timed_out_list_changed_checks(&dir.join("none"), "server-stateless"),
        0
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A custom tool added, audited and approved by another process goes live in a running
/// `quiver serve`: the official Python client gets `list_changed`, finds it with
/// `tool_search` and calls it; the tool calls server-everything's `echo` through
/// `call_tool`, and the execution log has both rows, the upstream call naming the custom
/// tool's call as its parent. Disabling it takes it off the same way.
#[tokio::test]
async fn a_custom_tool_approved_elsewhere_goes_live_and_calls_an_upstream() {
    let config = everything_mcp_json();
    let config = config.to_str().expect("utf-8 path");
    let dir = fresh_dir();
    let args = ["--mcp-config", config, "serve", "--listen", "127.0.0.1:0"];
    let mut server = Server::start_in(quiver_binary(), &args, &dir).await;
    let binary = quiver_binary();
    run_script(
        "custom_live.py",
        &[
            &server.url,
            binary.to_str().expect("utf-8 path"),
            dir.to_str().expect("utf-8 path"),
        ],
    )
    .await;
    assert!(server.terminate().await.success());
    let log = std::process::Command::new(quiver_binary())
        .args(["log", "--json", "--limit", "50"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&log.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let ok_call = rows
        .iter()
        .find(|r| r["tool"] == "shout_back" && r["outcome"] == "ok")
        .unwrap_or_else(|| panic!("no ok row for shout_back: {rows:#?}"));
    let echo = rows
        .iter()
        .find(|r| r["tool"] == "mcp__everything__echo" && r["parent"] == ok_call["call_id"])
        .unwrap_or_else(|| {
            panic!(
                "no echo row naming {} as its parent: {rows:#?}",
                ok_call["call_id"]
            )
        });
    assert_eq!(echo["outcome"], "ok", "{echo}");
}

/// `quiver serve` runs the custom-tool jobs other processes queue: a tool proposed through
/// `create_custom_tool` (by a one-shot `quiver call` on the same store) is built by the
/// server's job worker, and an approved tool last tested under other sandbox limits is
/// rebuilt when the server starts under new ones, and stays live.
#[tokio::test]
async fn serve_builds_proposed_tools_and_rebuilds_approved_ones_under_new_limits() {
    let dir = fresh_dir();
    let quiver = |args: &[&str]| {
        let out = std::process::Command::new(quiver_binary())
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let tokens = "[[auth.tokens]]\nname = \"lead\"\ntoken = \"lead-secret-123456\"\nadmin = true\n";
    std::fs::write(dir.join("quiver.toml"), tokens).unwrap();
    std::fs::write(
        dir.join("inc.js"),
        "async function main(inputs) { return inputs.n + 1; }",
    )
    .unwrap();
    std::fs::write(
        dir.join("inc.schema.json"),
        r#"{"type": "object", "properties": {"n": {"type": "number"}}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("inc.tests.json"),
        r#"[{"inputs": {"n": 1}, "expect": 2}]"#,
    )
    .unwrap();
    let (code, out) = quiver(&[
        "custom",
        "add",
        "inc.js",
        "--name",
        "inc",
        "--description",
        "Adds one.",
        "--schema",
        "inc.schema.json",
        "--tests",
        "inc.tests.json",
    ]);
    assert_eq!(code, Some(0), "add builds and tests it: {out}");
    assert!(out.contains("build of `inc` version 1 passed"), "{out}");
    assert_eq!(quiver(&["custom", "approve", "inc"]).0, Some(0));

    // The server starts under a new heap limit: `inc` is rebuilt.
    let limits = format!("{tokens}\n[sandbox]\nheap_mib = 48\n");
    std::fs::write(dir.join("quiver.toml"), limits).unwrap();
    let args = ["serve", "--listen", "127.0.0.1:0"];
    let mut server = Server::start_in(quiver_binary(), &args, &dir).await;
    let proposal = serde_json::json!({
        "name": "double_it",
        "description": "Doubles a number.",
        "input_schema": {"type": "object", "properties": {"n": {"type": "number"}}},
        "source": "async function main(inputs) { return inputs.n * 2; }",
        "tests": [{"inputs": {"n": 2}, "expect": 4}],
    })
    .to_string();
    let (code, out) = quiver(&["call", "create_custom_tool", &proposal, "--token", "lead"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("build_job"), "{out}");

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let jobs = loop {
        let (_, jobs) = quiver(&["custom", "jobs"]);
        let done = |tool: &str, kind: &str| {
            jobs.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.get(1) == Some(&tool) && f.get(2) == Some(&kind) && f.get(3) == Some(&"passed")
            })
        };
        if done("double_it", "build") && done("inc", "rebuild") {
            break jobs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not run the jobs: {jobs}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(!jobs.contains("queued"), "{jobs}");
    let (_, list) = quiver(&["custom", "list"]);
    let status = |tool: &str| {
        list.lines()
            .find(|l| l.split_whitespace().next() == Some(tool))
            .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
    };
    assert_eq!(status("double_it").as_deref(), Some("testing"), "{list}");
    assert_eq!(status("inc").as_deref(), Some("approved"), "{list}");
    let (_, shown) = quiver(&["custom", "show", "inc"]);
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("show prints JSON");
    assert_eq!(shown["test_results"]["kind"], "rebuild", "{shown}");
    assert_eq!(
        shown["test_results"]["limits"]["heap_mib"], 48,
        "the limits as `[sandbox]` states them: {shown}"
    );
    assert!(server.terminate().await.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A running `quiver serve` reloads its configuration without a restart: an upstream added
/// to the `--mcp-config` file connects, a broken file keeps the old state and is reported
/// (`POST /admin/reload`, `quiver status`), an added skill becomes a prompt, a reload that
/// changes nothing notifies nobody, and a removed upstream's tools leave
/// (`reload_live.py` has the steps).
#[tokio::test]
async fn serve_reloads_its_configuration_without_a_restart() {
    let everything = everything_bin();
    let dir = fresh_dir();
    let token = "admin-secret-0123456789";
    std::fs::write(
        dir.join("quiver.toml"),
        format!("[admin]\ntoken = \"{token}\"\n\n[skills]\ndirs = [\"skills\"]\n"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("skills/alpha")).unwrap();
    std::fs::write(
        dir.join("skills/alpha/SKILL.md"),
        "---\nname: alpha\ndescription: Drafts an alpha plan. Use when asked for an alpha.\n---\nPlan $ARGUMENTS.\n",
    )
    .unwrap();
    std::fs::write(dir.join("mcp.json"), r#"{"mcpServers": {}}"#).unwrap();
    let args = [
        "--mcp-config",
        "mcp.json",
        "serve",
        "--listen",
        "127.0.0.1:0",
    ];
    let mut server = Server::start_in(quiver_binary(), &args, &dir).await;
    let binary = quiver_binary();
    run_script(
        "reload_live.py",
        &[
            &server.url,
            dir.to_str().expect("utf-8 path"),
            everything.to_str().expect("utf-8 path"),
            token,
            binary.to_str().expect("utf-8 path"),
        ],
    )
    .await;
    assert!(server.terminate().await.success());
    assert_clean_shutdown(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A reload under load drops no call and loses no log row: 64 clients call an upstream's
/// echo through `quiver serve` while another upstream is added to the `--mcp-config` file
/// (`reload_load.py`); every call answers, and the execution log has a row for each.
#[tokio::test]
async fn a_reload_under_load_drops_no_call_and_loses_no_log_row() {
    let everything = everything_bin();
    let dir = fresh_dir();
    let mcp_json = dir.join("mcp.json");
    std::fs::write(
        &mcp_json,
        serde_json::json!({"mcpServers": {"everything": {"command": everything}}}).to_string(),
    )
    .unwrap();
    let args = [
        "--mcp-config",
        "mcp.json",
        "serve",
        "--listen",
        "127.0.0.1:0",
    ];
    let mut server = Server::start_in(quiver_binary(), &args, &dir).await;
    let count_file = dir.join("calls.txt");
    run_script(
        "reload_load.py",
        &[
            &server.url,
            mcp_json.to_str().expect("utf-8 path"),
            everything.to_str().expect("utf-8 path"),
            count_file.to_str().expect("utf-8 path"),
        ],
    )
    .await;
    let calls: usize = std::fs::read_to_string(&count_file)
        .expect("the script counted its calls")
        .trim()
        .parse()
        .expect("a number");
    // Read while the server runs: a server that stops takes its report with it.
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("quiver.db.reload.{}.json", server.pid())))
            .expect("a reload ran"),
    )
    .unwrap();
    assert!(server.terminate().await.success());
    let log = std::process::Command::new(quiver_binary())
        .args([
            "log",
            "--json",
            "--tool",
            "mcp__everything__echo",
            "--limit",
            "1000",
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&log.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let ok = rows.iter().filter(|r| r["outcome"] == "ok").count();
    assert!(calls > 64, "calls continued past the reload: {calls}");
    assert_eq!(ok, calls, "one ok row per call: {} rows", rows.len());
    assert_eq!(
        report["servers"]["added"],
        serde_json::json!(["other"]),
        "{report}"
    );
    assert_eq!(
        report["servers"]["unchanged"],
        serde_json::json!(["everything"]),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `quiver check` compares each catalog alias with its connected target (server-everything's
/// `echo`, which requires `message`): an alias whose schema names other arguments is an
/// error naming the file, the missing argument and what to write; a matching alias passes.
#[tokio::test]
async fn check_reports_an_alias_whose_schema_cannot_meet_its_target() {
    let dir = fresh_dir();
    std::fs::write(dir.join("quiver.toml"), "[catalog]\ndir = \"catalog\"\n").unwrap();
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::json!({"mcpServers": {"everything": {"command": everything_bin()}}})
            .to_string(),
    )
    .unwrap();
    let tools = dir.join("catalog/tools");
    std::fs::create_dir_all(&tools).unwrap();
    let alias = |name: &str, properties: serde_json::Value, required: &[&str]| {
        serde_json::json!({"name": name, "description": "Repeats a message back. Use it when asked to repeat a message.",
            "input_schema": {"type": "object", "properties": properties, "required": required},
            "implementation": {"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}})
        .to_string()
    };
    std::fs::write(
        tools.join("say.json"),
        alias(
            "say",
            serde_json::json!({"message": {"type": "string", "maxLength": 500, "description": "The text."}}),
            &["message"],
        ),
    )
    .unwrap();
    let check = || {
        let out = std::process::Command::new(quiver_binary())
            .args(["check", "--mcp-config", "mcp.json"])
            .current_dir(&dir)
            .output()
            .expect("quiver check runs");
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, text) = check();
    assert!(!text.contains("[alias]"), "{text}");
    assert_eq!(code, Some(0), "{text}");

    std::fs::write(
        tools.join("shout.json"),
        alias(
            "shout",
            serde_json::json!({"text": {"type": "string", "maxLength": 500, "description": "The text."}}),
            &["text"],
        ),
    )
    .unwrap();
    let (code, text) = check();
    assert_eq!(code, Some(1), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("[alias]"))
        .unwrap_or_else(|| panic!("an alias finding: {text}"));
    assert!(
        line.contains("shout.json")
            && line.contains("`shout` stands for `mcp__everything__echo`")
            && line.contains("which requires `message`")
            && line.contains("add it to the alias's `inputSchema` properties and `required`"),
        "{line}"
    );
    assert!(!text.contains("say.json: [alias]"), "{text}");

    // A `ref.tool` the server does not have: named, with the tools it has.
    std::fs::remove_file(tools.join("shout.json")).unwrap();
    std::fs::write(
        tools.join("ekko.json"),
        serde_json::json!({"name": "ekko", "description": "Repeats a message back. Use it when asked to repeat a message.",
            "input_schema": {"type": "object", "properties": {"message": {"type": "string", "maxLength": 500, "description": "The text."}}},
            "implementation": {"kind": "mcp", "ref": {"server": "everything", "tool": "ecko"}}})
        .to_string(),
    )
    .unwrap();
    let (code, text) = check();
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("ekko.json: [alias] `ekko` stands for `mcp__everything__ecko`, which server `everything` does not have: it has no tool `ecko` (it has: ")
            && text.contains("`echo`"),
        "{text}"
    );
}

/// A streamable-HTTP upstream redeployed under `quiver serve` (stopped, and started again
/// on its port with other tools) forgets Quiver's session; rmcp opens a new one, and Quiver
/// lists the server's tools again: the new build's tool is served, the removed one is gone,
/// and the operator log says what happened (`redeploy.py` has the client's steps).
#[tokio::test]
async fn a_redeployed_http_upstream_is_listed_again() {
    let port = crate::identity::free_port();
    let upstream_script = repo_root().join("tests/fixtures/mcp_server/redeploy_upstream.py");
    let v1 = Command::new(python())
        .arg(&upstream_script)
        .args([port.to_string().as_str(), "v1"])
        .kill_on_drop(true)
        .spawn()
        .expect("the upstream starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(std::time::Instant::now() < deadline, "build v1 listens");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dir = fresh_dir();
    std::fs::write(
        dir.join("quiver.toml"),
        format!("[[mcp.servers]]\nname = \"up\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n"),
    )
    .unwrap();
    let log = dir.join("serve.log");
    let mut server = Command::new(quiver_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("quiver serve starts");
    let mut lines = BufReader::new(server.stdout.take().expect("piped")).lines();
    let url = line_of(&mut lines).await;
    let pid = v1.id().expect("running").to_string();
    run_script("redeploy.py", &[&url, &pid, &port.to_string()]).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("the server started a new session (it restarted, or was redeployed?)"),
        "{said}"
    );
    server.start_kill().expect("stop the server");
    server.wait().await.expect("the server ends");
    drop(v1);
}

/// `initialize` with a bearer `token` over raw HTTP/1.1: the instructions the server
/// answers with.
async fn instructions_for(url: &str, token: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = url.trim_start_matches("http://").trim_end_matches("/mcp");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut tcp = tokio::net::TcpStream::connect(authority)
        .await
        .expect("connects");
    tcp.write_all(request.as_bytes()).await.expect("sent");
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(20), tcp.read_to_string(&mut raw))
        .await
        .expect("an answer in time")
        .expect("readable");
    let data = raw
        .lines()
        .find_map(|l| {
            l.strip_prefix("data: ")
                .filter(|d| d.contains("\"result\""))
        })
        .unwrap_or_else(|| panic!("an initialize result: {raw}"));
    let answer: serde_json::Value = serde_json::from_str(data).expect("JSON");
    answer["result"]["instructions"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// An upstream server's `instructions` (server-everything's) reach the model in Quiver's
/// own, under the server's name, for a token that may use that server; a token restricted
/// to another server reads Quiver's alone.
#[tokio::test]
async fn upstream_instructions_reach_the_callers_that_may_use_the_server() {
    let dir = fresh_dir();
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\nrequired = true\n\n[[auth.tokens]]\nname = \"all\"\ntoken = \"all-secret-0123456789\"\n\n[[auth.tokens]]\nname = \"other\"\ntoken = \"other-secret-0123456789\"\nallowed_servers = [\"time\"]\nallowed_tools = [\"tool_search\"]\n",
            everything_bin().display().to_string()
        ),
    )
    .unwrap();
    let mut server =
        Server::start_in(quiver_binary(), &["serve", "--listen", "127.0.0.1:0"], &dir).await;
    let url = server.url.clone();
    let all = instructions_for(&url, "all-secret-0123456789").await;
    assert!(
        all.starts_with("Quiver serves a working set of tools")
            && all.contains("## everything\n")
            && all.contains("Everything Server"),
        "{all}"
    );
    let other = instructions_for(&url, "other-secret-0123456789").await;
    assert!(
        other.starts_with("Quiver serves a working set of tools") && !other.contains("everything"),
        "{other}"
    );
    assert!(server.terminate().await.success());
}

/// The catalog directory (`[catalog] dir`) through `quiver serve` and the official Python
/// client: an alias of an upstream tool, a skill as a tool and an auto-approved custom tool
/// are served; an edited and an added file reach the client with `list_changed`; a broken
/// file is reported and the rest stay (`catalog_live.py` has the steps).
#[tokio::test]
async fn the_catalog_directory_serves_each_kind_and_reloads_an_edit() {
    let everything = everything_bin();
    let dir = fresh_dir();
    std::fs::write(
        dir.join("quiver.toml"),
        "[catalog]\ndir = \"catalog\"\nauto_approve = true\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::json!({"mcpServers": {"everything": {"command": everything}}}).to_string(),
    )
    .unwrap();
    let tools = dir.join("catalog/tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::create_dir_all(dir.join("catalog/skills/release")).unwrap();
    std::fs::write(
        dir.join("catalog/skills/release/SKILL.md"),
        "---\nname: release\ndescription: Ships a release. Use when asked to ship.\n---\nShip $1 to $2.\n",
    )
    .unwrap();
    let message = serde_json::json!({"type": "object", "properties": {"message": {"type": "string", "maxLength": 500, "description": "The text."}}, "required": ["message"]});
    let defs = [
        (
            "say.json",
            serde_json::json!({"name": "say", "description": "Repeats a message back. Use it when asked to repeat a message.", "input_schema": message, "implementation": {"kind": "mcp", "ref": {"server": "everything", "tool": "echo"}}}),
        ),
        (
            "plan.json",
            serde_json::json!({"name": "plan_release", "description": "Plans a release of a version to a target. Use it when asked to plan a release.", "input_schema": {"type": "object", "properties": {"version": {"type": "string", "maxLength": 20, "description": "The version."}, "target": {"type": "string", "maxLength": 40, "description": "Where to."}}, "required": ["version", "target"]}, "implementation": {"kind": "skill", "ref": "release"}}),
        ),
        (
            "add_one.json",
            serde_json::json!({"name": "add_one", "description": "Adds one to a number. Use it when asked to add one to a number.", "input_schema": {"type": "object", "properties": {"n": {"type": "number", "description": "The number."}}, "required": ["n"]}, "implementation": {"kind": "custom", "ref": "add_one.js"}, "tests": [{"inputs": {"n": 1}, "expect": 2}]}),
        ),
    ];
    for (file, def) in defs {
        std::fs::write(tools.join(file), def.to_string()).unwrap();
    }
    std::fs::write(
        tools.join("add_one.js"),
        "async function main(inputs) { return inputs.n + 1; }",
    )
    .unwrap();
    let args = [
        "--mcp-config",
        "mcp.json",
        "serve",
        "--listen",
        "127.0.0.1:0",
    ];
    let mut server = Server::start_in(quiver_binary(), &args, &dir).await;
    run_script(
        "catalog_live.py",
        &[&server.url, dir.to_str().expect("utf-8 path")],
    )
    .await;
    assert!(server.terminate().await.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A result over its token budget through `quiver serve` (`result_budget.py`, the official
/// Python client): head and tail with a note naming its call id, `read_result` paged in and
/// reading the whole back by page, `resources/read` of `quiver://results/<id>` returning it
/// whole, and another session refused.
#[tokio::test]
async fn a_result_over_its_token_budget_is_shortened_and_read_back_whole() {
    let everything = everything_bin();
    let dir = fresh_dir();
    let config = dir.join("quiver.toml");
    std::fs::write(
        &config,
        format!(
            "[limits]\nresult_tokens = 400\n\n[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\n",
            everything.to_string_lossy()
        ),
    )
    .unwrap();
    let mut server = Server::start_in(
        quiver_binary(),
        &[
            "--config",
            "quiver.toml",
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
        &dir,
    )
    .await;
    run_script("result_budget.py", &[&server.url]).await;
    assert!(server.terminate().await.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
