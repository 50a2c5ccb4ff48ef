//! `quiver serve` with inbound tokens from `quiver.toml`.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use crate::ONE_TOOL_SERVER;

/// `quiver serve --stdio` in `dir`, logging errors only, with stdin piped and its stdout
/// and stderr as given.
fn serve_stdio_in(dir: &std::path::Path, stdout: Stdio, stderr: Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["serve", "--stdio"])
        .current_dir(dir)
        .env("QUIVER_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// One JSON-RPC POST; returns the raw HTTP response.
/// A new empty directory for one test's `quiver serve` (its store lives there).
fn fresh_dir(name: &str) -> crate::Scratch {
    crate::Scratch::new(&format!("serve-{name}"))
}

pub(crate) fn rpc(addr: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut all = vec![("Mcp-Protocol-Version", "2025-11-25")];
    all.extend_from_slice(headers);
    post_mcp(addr, &all, body)
}

/// One POST to `/mcp` with `headers` (a `Host` among them replaces `addr`) and JSON `body`;
/// returns the raw HTTP response.
fn post_mcp(addr: &str, headers: &[(&str, &str)], body: &str) -> String {
    let host = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("host"))
        .map_or(addr, |(_, v)| v);
    let extra: String = headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("host"))
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    response
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim())
        })
}

/// Starts `quiver serve` in `dir` with `args`; returns the child and `host:port`.
fn start(
    dir: &std::path::Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (std::process::Child, String) {
    start_with(dir, args, &[], envs)
}

/// [`start`], with `serve_args` after `serve`.
pub(crate) fn start_with(
    dir: &std::path::Path,
    args: &[&str],
    serve_args: &[&str],
    envs: &[(&str, &str)],
) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(args)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(serve_args)
        .current_dir(dir)
        .envs(envs.iter().copied())
        .env("QUIVER_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("quiver serve prints its URL");
    let addr = url
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    (child, addr)
}

pub(crate) fn stop(mut child: std::process::Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "quiver serve exits cleanly on SIGTERM: {status}"
    );
}

/// initialize + initialized; returns the session id.
pub(crate) fn open(addr: &str, conversation: &str) -> String {
    open_with(addr, &[("Quiver-Conversation", conversation)])
}

/// initialize + initialized with `headers` on both; returns the session id.
fn open_with(addr: &str, headers: &[(&str, &str)]) -> String {
    let init = rpc(addr, headers, INITIALIZE);
    let sid = header(&init, "mcp-session-id")
        .expect("a session id")
        .to_owned();
    let mut with_session = vec![("Mcp-Session-Id", sid.as_str())];
    with_session.extend_from_slice(headers);
    rpc(
        addr,
        &with_session,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    sid
}

#[test]
fn a_conversation_keeps_its_working_set_across_a_restart() {
    let peers = std::env::var_os("QUIVER_PEERS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers"))
        });
    let time = peers.join("venv/bin/mcp-server-time");
    assert!(time.exists(), "run .ci/setup-peers");
    let dir = fresh_dir("restore");
    let cfg = dir.join("mcp.json");
    std::fs::write(
        &cfg,
        serde_json::json!({"mcpServers": {"time": {"command": time}}}).to_string(),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap().to_owned();

    let (child, addr) = start(&dir, &["--mcp-config", &cfg], &[]);
    let sid = open(&addr, "trip-42");
    let found = rpc(
        &addr,
        &[("Mcp-Session-Id", &sid), ("Quiver-Conversation", "trip-42")],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"current time in a timezone"}}}"#,
    );
    assert!(found.contains("mcp__time__get_current_time"), "{found}");
    stop(child);

    let (child, addr) = start(&dir, &["--mcp-config", &cfg], &[]);
    let sid = open(&addr, "trip-42");
    let listed = rpc(
        &addr,
        &[("Mcp-Session-Id", &sid), ("Quiver-Conversation", "trip-42")],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
    );
    let other_sid = open(&addr, "another");
    let other = rpc(
        &addr,
        &[
            ("Mcp-Session-Id", &other_sid),
            ("Quiver-Conversation", "another"),
        ],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
    );
    stop(child);
    assert!(
        listed.contains("mcp__time__get_current_time"),
        "restored after the restart: {listed}"
    );
    assert!(
        !other.contains("mcp__time__get_current_time"),
        "another conversation has its own set: {other}"
    );
}

fn post(addr: &str, token: Option<&str>) -> String {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    rpc(addr, &headers, INITIALIZE)
}

#[test]
fn configured_tokens_guard_the_endpoint() {
    let dir = fresh_dir("auth");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"ci\"\ntoken = \"${env:QUIVER_TEST_TOKEN}\"\nmode = \"plan\"\n",
    )
    .unwrap();
    let (child, addr) = start(&dir, &[], &[("QUIVER_TEST_TOKEN", "s3cret-token-value")]);
    let without = post(&addr, None);
    let wrong = post(&addr, Some("nope"));
    let right = post(&addr, Some("s3cret-token-value"));
    stop(child);
    assert!(without.starts_with("HTTP/1.1 401"), "{without}");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    assert!(right.starts_with("HTTP/1.1 200"), "{right}");
    assert!(right.contains("\"protocolVersion\""), "{right}");
}

/// `GET path` on `addr`: the status and the body.
fn probe(addr: &str, path: &str) -> (u16, String) {
    get(addr, path, &[])
}

/// `GET path` on `addr` with `headers`, as HTTP/1.0 (so the body comes whole, not in
/// chunks): the status and the body.
pub(crate) fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    try_get(addr, path, headers).unwrap()
}

/// [`get`], or the error connecting or sending.
pub(crate) fn try_get(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{extra}\r\n");
    s.write_all(req.as_bytes())?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((status, body))
}

/// While the execution log cannot be written (another process holds the database's write
/// lock: the writer's batches fail after their retries), `/readyz` answers 503 saying so,
/// without the file's path; once the lock is gone it is ready again, with no call needed.
#[test]
fn readiness_reports_a_failing_execution_log() {
    let dir = fresh_dir("ready");
    std::fs::write(
        dir.join("quiver.toml"),
        "[store]\nbusy_timeout_ms = 50\nlog_linger_ms = 0\n",
    )
    .unwrap();
    let (child, addr) = start(&dir, &[], &[]);
    assert_eq!(
        probe(&addr, "/readyz"),
        (200, r#"{"status":"ready"}"#.to_owned())
    );
    let call = |id: u32| {
        let sid = open(&addr, "ready");
        rpc(
            &addr,
            &[("Mcp-Session-Id", &sid), ("Quiver-Conversation", "ready")],
            &format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"tool_search","arguments":{{"query":"read file"}}}}}}"#
            ),
        )
    };
    // Another process takes the write lock and keeps it until told on stdin.
    let mut blocker = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1], isolation_level=None)\nc.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\nsys.stdin.readline()\nc.execute('COMMIT')\n",
            dir.join("quiver.db").to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut locked = String::new();
    BufReader::new(blocker.stdout.take().unwrap())
        .read_line(&mut locked)
        .unwrap();
    assert_eq!(locked.trim(), "locked");
    assert!(
        call(2).contains("\"result\""),
        "the call itself goes through"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (status, body) = loop {
        let (status, body) = probe(&addr, "/readyz");
        if status == 503 || std::time::Instant::now() >= deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("the execution log cannot be written") && !body.contains("quiver.db"),
        "{body}"
    );
    // Released: ready again without any new call (a drained server gets none; the probe
    // itself makes the store try the database), and calls are logged again.
    blocker.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(blocker.wait().unwrap().success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let ready = loop {
        let answer = probe(&addr, "/readyz");
        if answer.0 == 200 || std::time::Instant::now() >= deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(call(3).contains("\"result\""));
    stop(child);
    assert_eq!(ready, (200, r#"{"status":"ready"}"#.to_owned()));
}

/// `quiver --mcp-config mcp.json check --against before.db` in `dir`: exit code, stdout.
fn check_against(dir: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args([
            "--mcp-config",
            "mcp.json",
            "check",
            "--against",
            "before.db",
        ])
        .current_dir(dir)
        .env("QUIVER_LOG", "error")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `quiver serve` records its upstreams' tool definitions, so `quiver check --against`
/// reports a breaking change in an upstream's tool (here a renamed required field).
#[test]
fn serve_records_upstream_definitions_for_check_against() {
    // (below)
    serve_stopping_at_once_records_every_definition();
    let dir = fresh_dir("defs");
    let server = ONE_TOOL_SERVER;
    let config = |field: &str| {
        serde_json::json!({"mcpServers": {"fake": {"command": "python3",
            "args": [server], "env": {"FIELD": field}}}})
        .to_string()
    };
    std::fs::write(dir.join("mcp.json"), config("city")).unwrap();
    let (mut child, _addr) = start(&dir, &["--mcp-config", "mcp.json"], &[]);
    // Wait until the running server has stored the upstream tool's definition.
    let poll = "import sqlite3, sys, time\n\
        for _ in range(600):\n\
        \x20   db = sqlite3.connect(sys.argv[1], timeout=5)\n\
        \x20   if db.execute(\"SELECT count(*) FROM tool_definitions WHERE name = 'mcp__fake__t'\").fetchone()[0]:\n\
        \x20       sys.exit(0)\n\
        \x20   db.close(); time.sleep(0.05)\n\
        sys.exit(1)\n";
    let stored = Command::new("python3")
        .args(["-c", poll, dir.join("quiver.db").to_str().unwrap()])
        .status()
        .unwrap();
    if !stored.success() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the definition of mcp__fake__t was never stored");
    }
    stop(child);

    std::fs::write(dir.join("mcp.json"), config("town")).unwrap();
    std::fs::copy(dir.join("quiver.db"), dir.join("before.db")).unwrap();
    let (code, text) = check_against(&dir);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("mcp__fake__t: [breaking: removed_field] field `city` was removed"),
        "{text}"
    );

    // The upstream cannot start now: its stored tools are not checked, not "removed".
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::json!({"mcpServers": {"fake": {"command": "python3", "args": ["-c", "raise SystemExit(3)"]}}})
            .to_string(),
    )
    .unwrap();
    let (code, text) = check_against(&dir);
    assert!(
        text.contains("fake: [note] 1 stored tool(s) not checked"),
        "{text}"
    );
    assert!(!text.contains("removed_tool"), "{text}");
    assert!(text.contains("0 breaking change(s)"), "{text}");
    // The server that does not start is itself the finding.
    assert!(
        text.contains("mcp server fake: [not connected] connect failed:")
            && text.contains("the process exited with code 3"),
        "{text}"
    );
    assert_eq!(code, Some(1), "{text}");
}

/// A `requires_prior` rule holds across a restart: the key's earlier calls come back from
/// the execution log the first time the restarted server sees it.
#[test]
fn a_required_earlier_call_counts_after_a_restart() {
    let dir = fresh_dir("prior");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[policy.rules]]\nid = \"search-first\"\ntool = \"describe_tool\"\naction = \"deny\"\nmessage = \"search first\"\nrequires_prior = \"tool_search\"\n",
    )
    .unwrap();
    let describe = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"describe_tool","arguments":{"name":"tool_search"}}}"#;
    let call = |addr: &str, key: &str, body: &str| {
        let sid = open(addr, key);
        rpc(
            addr,
            &[("Mcp-Session-Id", &sid), ("Quiver-Conversation", key)],
            body,
        )
    };
    let (child, addr) = start(&dir, &[], &[]);
    let denied = call(&addr, "k1", describe);
    assert!(denied.contains("search first"), "{denied}");
    let searched = call(
        &addr,
        "k1",
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"describe a tool"}}}"#,
    );
    assert!(!searched.contains("search first"), "{searched}");
    stop(child);

    let (child, addr) = start(&dir, &[], &[]);
    let allowed = call(&addr, "k1", describe);
    let other = call(&addr, "k2", describe);
    stop(child);
    assert!(
        !allowed.contains("search first") && allowed.contains("input_schema"),
        "the restarted server knows k1 searched: {allowed}"
    );
    assert!(other.contains("search first"), "k2 never searched: {other}");
}

/// `quiver serve --stdio` in `dir`, with its stdin and its stdout's lines.
fn stdio_serve(
    dir: &std::path::Path,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut child = serve_stdio_in(dir, Stdio::piped(), Stdio::null());
    let stdin = child.stdin.take().unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, stdin, lines)
}

/// The `initialize` request (id 1, protocol 2025-11-25) the tests open a session with.
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// [`stdio_serve`], with the session opened: `initialize` answered, then `initialized`.
fn stdio_opened(
    dir: &std::path::Path,
) -> (
    KillOnDrop,
    std::process::ChildStdin,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let (child, mut stdin, mut lines) = stdio_serve(dir);
    let child = KillOnDrop(Some(child));
    writeln!(stdin, "{INITIALIZE}").unwrap();
    let answer = lines.next().expect("an answer").unwrap();
    assert!(answer.contains(r#""id":1"#), "{answer}");
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .unwrap();
    (child, stdin, lines)
}

/// Runs one `quiver serve --stdio` conversation in `dir`: initialize, then `calls` (each a
/// `tools/call` as name and arguments); returns the text of each call's result.
fn stdio_session(dir: &std::path::Path, calls: &[(&str, &str)]) -> Vec<String> {
    let (mut child, mut stdin, mut lines) = stdio_serve(dir);
    let mut answer = |id: usize| -> serde_json::Value {
        loop {
            let line = lines.next().expect("an answer").unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    };
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#).unwrap();
    answer(0);
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .unwrap();
    let mut out = Vec::new();
    for (i, (name, args)) in calls.iter().enumerate() {
        let id = i + 1;
        writeln!(stdin, r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{args}}}}}"#).unwrap();
        out.push(
            answer(id)["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    out
}

/// Each `quiver serve --stdio` process is a session of its own: a later process (a new
/// conversation of a desktop client) does not inherit the earlier one's calls, so a
/// `requires_prior` rule is not satisfied by what another process did.
#[test]
fn a_stdio_session_does_not_inherit_an_earlier_process() {
    let dir = fresh_dir("stdio");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[policy.rules]]\nid = \"search-first\"\ntool = \"describe_tool\"\naction = \"deny\"\nmessage = \"search first\"\nrequires_prior = \"tool_search\"\n",
    )
    .unwrap();
    let describe = ("describe_tool", r#"{"name": "tool_search"}"#);
    let first = stdio_session(
        &dir,
        &[("tool_search", r#"{"query": "describe a tool"}"#), describe],
    );
    assert!(!first[1].contains("search first"), "{first:?}");
    let second = stdio_session(&dir, &[describe]);
    assert!(
        second[0].contains("search first"),
        "a new process is a new session: {second:?}"
    );
}

/// What the store mirrored for a session-bound key (`mcp:<session id>`) is deleted when the
/// session ends: that key never comes back, and the rows would pile up.
#[tokio::test]
async fn an_ended_sessions_stored_working_set_is_deleted() {
    use quiver_surface::ports::SessionStore;
    let dir = fresh_dir("ended");
    let skill = dir.join("skills/notes");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: notes\ndescription: Takes meeting notes.\n---\nWrite them down.\n",
    )
    .unwrap();
    std::fs::write(dir.join("quiver.toml"), "[skills]\ndirs = [\"skills\"]\n").unwrap();
    let (child, addr) = start(&dir, &[], &[]);
    // Killed if an assertion fails first (a server left running would hold the build's
    // lock file open).
    let mut serving = Killed(Some(child));
    // No conversation key: the working set is keyed by the session (`mcp:<id>`).
    let sid = open_with(&addr, &[]);
    let headers = [("Mcp-Session-Id", sid.as_str())];
    let found = rpc(
        &addr,
        &headers,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"meeting notes"}}}"#,
    );
    assert!(found.contains("\\\"skill\\\""), "{found}");
    let key = format!("mcp:{sid}");
    let db = dir.join("quiver.db");
    let stored = |db: std::path::PathBuf, key: String| async move {
        let store = quiver_store_sqlite::SqliteStore::open(&db).unwrap();
        let set = store.working_set(&key).await.unwrap();
        store.close().await.unwrap();
        set.len()
    };
    // The mirror writes in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while stored(db.clone(), key.clone()).await == 0 {
        assert!(std::time::Instant::now() < deadline, "never mirrored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "DELETE /mcp HTTP/1.1\r\nHost: {addr}\r\nMcp-Session-Id: {sid}\r\nMcp-Protocol-Version: 2025-11-25\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 2"), "{answer}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while stored(db.clone(), key.clone()).await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the ended session's rows are still stored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A session still open when the server stops goes too (its id never comes back: its
    // rows would pile up); a conversation's working set is kept for its return.
    let open_sid = open_with(&addr, &[]);
    let conv_sid = open(&addr, "kept-7");
    for (sid, conversation) in [(&open_sid, None), (&conv_sid, Some("kept-7"))] {
        let mut headers = vec![("Mcp-Session-Id", sid.as_str())];
        headers.extend(conversation.map(|c| ("Quiver-Conversation", c)));
        let found = rpc(
            &addr,
            &headers,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"meeting notes"}}}"#,
        );
        assert!(found.contains("\\\"skill\\\""), "{found}");
    }
    let open_key = format!("mcp:{open_sid}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while stored(db.clone(), open_key.clone()).await == 0 {
        assert!(std::time::Instant::now() < deadline, "never mirrored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop(serving.0.take().unwrap());
    assert_eq!(
        stored(db.clone(), open_key).await,
        0,
        "an open session's rows"
    );
    assert!(
        stored(db.clone(), "conv:kept-7".into()).await > 0,
        "the conversation's working set"
    );
}

/// A child killed when dropped, unless taken.
struct Killed(Option<std::process::Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `serve --stdio` stops on SIGTERM while its client keeps stdin open (a supervisor's stop:
/// `docker stop`, systemd): the pending read of stdin does not hold the process. A stop
/// before the client's `initialize` (a ping answered, the handshake not begun) is as clean
/// as one after it.
#[test]
fn stdio_serve_exits_on_sigterm_with_stdin_open() {
    for (case, first) in [
        (
            "initialized",
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        ),
        (
            "before initialize",
            r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#,
        ),
    ] {
        let dir = fresh_dir("stdio-term");
        let (mut child, mut stdin, mut lines) = stdio_serve(&dir);
        writeln!(stdin, "{first}").unwrap();
        let answer = lines.next().expect("an answer").unwrap();
        assert!(answer.contains("\"id\":0"), "{case}: {answer}");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(stdin);
        let status = status.expect("quiver serve --stdio exits on SIGTERM with stdin open");
        assert!(status.success(), "{case}: {status}");
    }
}

/// A `serve --stdio` whose client is gone at once (stdin closed) still stores the definition
/// of every upstream tool it registered before the store closes: `check --against`
/// compares with them. It lost those the recorder had not written yet.
fn serve_stopping_at_once_records_every_definition() {
    let dir = fresh_dir("defs-quick");
    let server = ONE_TOOL_SERVER;
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"many\"\ncommand = \"python3\"\nargs = [{server:?}]\nenv = {{ MORE = \"150\" }}\nrequired = true\n"
        ),
    )
    .unwrap();
    let mut child = serve_stdio_in(&dir, Stdio::null(), Stdio::null());
    // A client that initializes and leaves.
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n",
        ).as_bytes())
        .unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let count = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(\"SELECT count(*) FROM tool_definitions WHERE name LIKE 'mcp__many__%'\").fetchone()[0])",
            dir.join("quiver.db").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&count.stdout).trim(), "151");
}

/// A `serve --stdio` client that sends one call the transport refuses (before `initialize`)
/// and closes stdin at once still leaves the call's row: the server waits for its
/// recording before it stops, so the row cannot lose a race with the shutdown (seen once by
/// hand with a detached task; this test does not reproduce that race reliably).
#[test]
fn a_call_refused_just_before_stdin_closes_has_its_row() {
    let dir = fresh_dir("refused-rows");
    let mut child = serve_stdio_in(&dir, Stdio::null(), Stdio::null());
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"weather"}}}"#,
                "\n"
            )
            .as_bytes(),
        )
        .unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let rows = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys; print(sorted(r for r in sqlite3.connect(sys.argv[1]).execute('SELECT tool_name, err_kind FROM execution_log')))",
            dir.join("quiver.db").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&rows.stdout).trim(),
        "[('tool_search', 'invalid_request')]",
        "{}",
        String::from_utf8_lossy(&rows.stderr)
    );
}

/// A token's `allowed_servers` decides whose passed-through resources and prompts it
/// reaches (lists, reads, prompts, the resource meta-tools); a token with `allowed_tools`
/// and no `allowed_servers` reaches none, and what a token may not reach is answered as
/// what does not exist. Two upstreams (the adapter's Python fixture, twice, as `fx` and
/// `fy`: each offers `fixture://hello` and the prompt `greet`) behind `quiver serve`.
#[test]
fn a_tokens_servers_bound_its_resources_and_prompts() {
    let peers = std::env::var_os("QUIVER_PEERS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers"))
        });
    let python = peers.join("venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run .ci/setup-peers",
        python.display()
    );
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mcp-adapter/tests/fixtures/fault_server.py"
    );
    let dir = fresh_dir("content-scope");
    let mut toml = String::new();
    for name in ["fx", "fy"] {
        toml.push_str(&format!(
            "[[mcp.servers]]\nname = \"{name}\"\ncommand = {python:?}\nargs = [{fixture:?}]\nrequired = true\n\n"
        ));
    }
    toml.push_str(
        r#"[[auth.tokens]]
name = "all"
token = "all-secret-1"

[[auth.tokens]]
name = "fx"
token = "fx-secret-1"
allowed_tools = ["tool_search", "list_mcp_resources", "read_mcp_resource"]
allowed_servers = ["fx"]

[[auth.tokens]]
name = "tools"
token = "tools-secret-1"
allowed_tools = ["tool_search", "list_mcp_resources"]
"#,
    );
    std::fs::write(dir.join("quiver.toml"), toml).unwrap();
    let (child, addr) = start(&dir, &[], &[]);
    // A failing assertion must not leave the server (and its two upstreams) running.
    let mut child = KillOnDrop(Some(child));
    let session = |token: &str| {
        let auth = format!("Bearer {token}");
        let sid = open_with(&addr, &[("Authorization", auth.as_str())]);
        (auth, sid)
    };
    let ask = |(auth, sid): &(String, String), method: &str, params: &str| {
        rpc(
            &addr,
            &[
                ("Authorization", auth.as_str()),
                ("Mcp-Session-Id", sid.as_str()),
            ],
            &format!(r#"{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{params}}}"#),
        )
    };
    let all = session("all-secret-1");
    let prompts = ask(&all, "prompts/list", "{}");
    assert!(
        prompts.contains("mcp__fx__greet") && prompts.contains("mcp__fy__greet"),
        "{prompts}"
    );
    let greet = ask(
        &all,
        "prompts/get",
        r#"{"name":"mcp__fy__greet","arguments":{"name":"Ada"}}"#,
    );
    assert!(greet.contains("Ada"), "{greet}");

    // A resource only `fy` lists (its `grow_content` adds `fixture://later`).
    let grown = ask(
        &all,
        "tools/call",
        r#"{"name":"mcp__fy__grow_content","arguments":{}}"#,
    );
    assert!(!grown.contains("isError\":true"), "{grown}");
    let listed = ask(&all, "resources/list", "{}");
    assert!(listed.contains("fixture://later"), "{listed}");

    let fx = session("fx-secret-1");
    // Not sent to `fx`, the one server this token may read: answered as unknown.
    let later = ask(&fx, "resources/read", r#"{"uri":"fixture://later"}"#);
    assert!(
        later.contains("no upstream MCP server lists the resource `fixture://later`")
            && !later.contains("added later"),
        "{later}"
    );
    let sub = ask(&fx, "resources/subscribe", r#"{"uri":"fixture://later"}"#);
    assert!(sub.contains("\"error\""), "{sub}");
    let prompts = ask(&fx, "prompts/list", "{}");
    assert!(
        prompts.contains("mcp__fx__greet") && !prompts.contains("mcp__fy__"),
        "{prompts}"
    );
    let other = ask(
        &fx,
        "prompts/get",
        r#"{"name":"mcp__fy__greet","arguments":{"name":"Ada"}}"#,
    );
    assert!(
        other.contains("unknown prompt") && !other.contains("Ada"),
        "{other}"
    );
    let resources = ask(&fx, "resources/list", "{}");
    assert_eq!(
        resources.matches("fixture://hello").count(),
        1,
        "{resources}"
    );
    let read = ask(&fx, "resources/read", r#"{"uri":"fixture://hello"}"#);
    assert!(read.contains("\"contents\""), "{read}");
    let meta = ask(
        &fx,
        "tools/call",
        r#"{"name":"list_mcp_resources","arguments":{"server":"fy"}}"#,
    );
    assert!(meta.contains(r#"no MCP server named \"fy\""#), "{meta}");
    let meta = ask(
        &fx,
        "tools/call",
        r#"{"name":"list_mcp_resources","arguments":{}}"#,
    );
    assert!(meta.contains("fixture://hello"), "{meta}");

    let tools = session("tools-secret-1");
    let prompts = ask(&tools, "prompts/list", "{}");
    assert!(prompts.contains(r#""prompts":[]"#), "{prompts}");
    let resources = ask(&tools, "resources/list", "{}");
    assert!(resources.contains(r#""resources":[]"#), "{resources}");
    let read = ask(&tools, "resources/read", r#"{"uri":"fixture://hello"}"#);
    assert!(
        read.contains("-32002") && !read.contains("\"contents\""),
        "{read}"
    );
    let get = ask(
        &tools,
        "prompts/get",
        r#"{"name":"mcp__fx__greet","arguments":{"name":"Ada"}}"#,
    );
    assert!(
        get.contains("unknown prompt") && !get.contains("Ada"),
        "{get}"
    );
    let meta = ask(
        &tools,
        "tools/call",
        r#"{"name":"list_mcp_resources","arguments":{}}"#,
    );
    assert!(
        !meta.contains("fixture://hello") && meta.contains("✓ ok. 0 rows."),
        "{meta}"
    );
    stop(child.0.take().expect("running"));
}

/// A client that declared roots and sampling (as desktop clients do) gets `tool_search` and
/// `describe_tool` answered with one JSON body: they send the client nothing (a tool that
/// may takes rmcp's per-call stream: `direct::tests`).
#[test]
fn discovery_calls_of_a_client_that_declared_roots_get_one_json_answer() {
    let dir = fresh_dir("direct-roots");
    let (child, addr) = start(&dir, &[], &[]);
    let mut child = KillOnDrop(Some(child));
    let init = rpc(
        &addr,
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{"listChanged":true},"sampling":{}},"clientInfo":{"name":"desk","version":"1"}}}"#,
    );
    let sid = header(&init, "mcp-session-id")
        .expect("a session id")
        .to_owned();
    let session = [("Mcp-Session-Id", sid.as_str())];
    rpc(
        &addr,
        &session,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    // Answered after its handler ran: the session is known to the direct path by then.
    let listed = rpc(
        &addr,
        &session,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert!(listed.contains("tool_search"), "{listed}");
    for body in [
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"search tools"}}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"describe_tool","arguments":{"name":"tool_search"}}}"#,
    ] {
        let answer = rpc(&addr, &session, body);
        assert_eq!(
            header(&answer, "content-type"),
            Some("application/json"),
            "{answer}"
        );
        assert!(
            answer.contains(r#""result""#) && !answer.contains(r#""isError":true"#),
            "{answer}"
        );
    }
    stop(child.0.take().expect("running"));
}

/// A list request whose `cursor` is not a string (no page gives out such a cursor) is
/// -32602 naming the cursor, over HTTP and over stdio, instead of the first page; the
/// session goes on.
#[test]
fn a_cursor_that_is_not_a_string_is_invalid_params() {
    let dir = fresh_dir("cursor");
    let (child, addr) = start(&dir, &[], &[]);
    let mut child = KillOnDrop(Some(child));
    let sid = open_with(&addr, &[]);
    let session = [("Mcp-Session-Id", sid.as_str())];
    // Answered after its handler ran: the session is known to the direct path by then (a
    // request that overtakes the handling of `notifications/initialized` is rmcp's).
    let listed = rpc(
        &addr,
        &session,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert!(listed.contains("tool_search"), "{listed}");
    for (method, cursor) in [
        ("tools/list", "5"),
        ("resources/list", "true"),
        ("resources/templates/list", r#"{"page":2}"#),
        ("prompts/list", "[1]"),
    ] {
        let answer = rpc(
            &addr,
            &session,
            &format!(
                r#"{{"jsonrpc":"2.0","id":9,"method":"{method}","params":{{"cursor":{cursor}}}}}"#
            ),
        );
        assert!(
            answer.contains(r#""code":-32602"#)
                && answer.contains(&format!(
                    "invalid params for `{method}`: `cursor` must be a string"
                ))
                && answer.contains(r#""id":9"#),
            "{method}: {answer}"
        );
    }
    let listed = rpc(
        &addr,
        &session,
        r#"{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{}}"#,
    );
    assert!(listed.contains("tool_search"), "{listed}");
    // A 2026-07-28 request (no session; rmcp reads it, after its own checks): the same.
    let stateless = |method: &str, cursor: &str| {
        post_2026(
            &addr,
            method,
            None,
            &format!(r#"{{"cursor":{cursor}}}"#),
            "",
            &[],
        )
    };
    for (method, cursor) in [
        ("tools/list", "5"),
        ("resources/list", "true"),
        ("resources/templates/list", r#"{"page":2}"#),
        ("prompts/list", "[1]"),
    ] {
        let answer = stateless(method, cursor);
        assert!(
            answer.contains(r#""code":-32602"#)
                && answer.contains(&format!(
                    "invalid params for `{method}`: `cursor` must be a string"
                ))
                && answer.contains(r#""id":21"#),
            "{method}: {answer}"
        );
    }
    let listed = stateless("tools/list", "null");
    assert!(
        listed.contains("tool_search") && listed.contains(r#""id":21"#),
        "{listed}"
    );
    stop(child.0.take().expect("running"));

    let (mut child, mut stdin, mut lines) = stdio_opened(&dir);
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{{"cursor":5}}}}"#
    )
    .unwrap();
    let refused = lines.next().unwrap().unwrap();
    assert!(
        refused.contains(r#""code":-32602"#) && refused.contains(r#""id":2"#),
        "{refused}"
    );
    // Not JSON-RPC 2.0 at all: that comes first.
    writeln!(
        stdin,
        r#"{{"id":4,"method":"tools/list","params":{{"cursor":5}}}}"#
    )
    .unwrap();
    let refused = lines.next().unwrap().unwrap();
    assert!(
        refused.contains(r#""code":-32600"#) && refused.contains(r#""id":4"#),
        "{refused}"
    );
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":3,"method":"tools/list"}}"#).unwrap();
    let listed = lines.next().unwrap().unwrap();
    assert!(
        listed.contains(r#""id":3"#) && listed.contains("tool_search"),
        "{listed}"
    );
    drop(stdin);
    let mut c = child.0.take().expect("running");
    assert!(c.wait().unwrap().success());

    // The elements of a 2025-03-26 batch over stdio: the same answer, in the batch's array.
    let (child, mut stdin, mut lines) = stdio_serve(&dir);
    let mut child = KillOnDrop(Some(child));
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-03-26","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
    )
    .unwrap();
    assert!(lines.next().unwrap().unwrap().contains(r#""id":1"#));
    writeln!(
        stdin,
        r#"[{{"jsonrpc":"2.0","method":"notifications/initialized"}},{{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{{"cursor":5}}}},{{"jsonrpc":"2.0","id":3,"method":"prompts/list","params":{{"cursor":{{"page":2}}}}}},{{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{{}}}}]"#
    )
    .unwrap();
    let answers: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let answers = answers.as_array().expect("one array");
    let by_id = |id: i64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("no answer {id}: {answers:?}"))
    };
    for (id, method) in [(2, "tools/list"), (3, "prompts/list")] {
        let refused = by_id(id);
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!(
                    "invalid params for `{method}`: `cursor` must be a string"
                )),
            "{refused}"
        );
    }
    assert!(
        by_id(4)["result"]["tools"]
            .to_string()
            .contains("tool_search"),
        "{answers:?}"
    );
    drop(stdin);
    let mut c = child.0.take().expect("running");
    assert!(c.wait().unwrap().success());
}

/// The last message on stdin may come without its newline (`printf '...' | quiver serve
/// --stdio`): it is answered and logged, not dropped with the input's end; a last line
/// that is not JSON gets its -32700.
#[test]
fn a_last_message_without_its_newline_is_answered() {
    let dir = fresh_dir("stdio-eof");
    let (child, mut stdin, mut lines) = stdio_serve(&dir);
    let mut child = KillOnDrop(Some(child));
    stdin
        .write_all(
            concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
                "\n",
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                "\n",
                r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"describe_tool","arguments":{"name":"tool_search"}}}"#,
            )
            .as_bytes(),
        )
    .unwrap();
    drop(stdin);
    let answers: Vec<String> = lines.by_ref().map(Result::unwrap).collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(
        answers[1].contains(r#""id":4"#) && answers[1].contains(r#""isError":false"#),
        "{answers:?}"
    );
    let mut c = child.0.take().expect("running");
    assert!(c.wait().unwrap().success());
    let log = log_json(&dir);
    assert!(log.contains(r#""tool":"describe_tool""#), "{log}");

    let (child, mut stdin, mut lines) = stdio_serve(&dir);
    let mut child = KillOnDrop(Some(child));
    write!(stdin, "garbage").unwrap();
    drop(stdin);
    let refused = lines.next().expect("an answer").unwrap();
    assert!(
        refused.contains(r#""code":-32700"#) && refused.contains(r#""id":null"#),
        "{refused}"
    );
    let _ = child.0.take().expect("running").wait();
}

/// `--allow-host` adds the `Host` values a request may carry (`name:*` any port, `name`
/// any port too, `name:port` that one), beside the listen address; another is 403. A value
/// that could never match a `Host` (a URL, a path, an empty name, a bad port) is a usage
/// error naming the form, before anything starts.
#[test]
fn allow_host_accepts_the_named_hosts_and_refuses_malformed_values() {
    let dir = fresh_dir("allow-host");
    for (value, says) in [
        (
            "http://x.example",
            "is a URL, not a Host: leave out `http://` (and any path), e.g. `x.example`",
        ),
        ("", "names no host"),
        ("x.example/mcp", "is not a host name"),
        ("x.example:http", "is not a port"),
        ("[::1", "has no closing `]`"),
        ("[nope]:80", "is not an IPv6 address"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(["serve", "--listen", "127.0.0.1:0", "--allow-host", value])
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(err.contains(says), "{value}: {err}");
    }
    let (child, addr) = start_with(
        &dir,
        &[],
        &[
            "--allow-host",
            "quiver.example:*",
            "--allow-host",
            "other.example",
            "--allow-host",
            "pinned.example:8443",
        ],
        &[],
    );
    let mut child = KillOnDrop(Some(child));
    let init = INITIALIZE;
    let with_host = |host: &str| {
        let out = post_mcp(&addr, &[("Host", host)], init);
        out.lines().next().unwrap_or("").to_owned()
    };
    for (host, status) in [
        (addr.as_str(), "200"),
        ("quiver.example:1234", "200"),
        ("quiver.example", "200"),
        ("other.example:99", "200"),
        ("pinned.example:8443", "200"),
        ("pinned.example:8444", "403"),
        ("evil.example", "403"),
    ] {
        let line = with_host(host);
        assert!(line.contains(status), "Host {host}: {line}");
    }
    // The refusal names the Host it got and the flag that accepts it.
    let refused = post_mcp(&addr, &[("Host", "evil.example")], init);
    assert!(
        refused.contains("the Host header `evil.example` is not one this server answers to")
            && refused.contains("`--allow-host evil.example`"),
        "{refused}"
    );
    stop(child.0.take().expect("running"));
}

/// A session belongs to the token that opened it: another token's request on it is 404 on
/// the session era. A 2026-07-28 request has no session, so the `Mcp-Session-Id` it carries
/// is ignored whoever's it is (a 404 there told a token which ids are live sessions of
/// others, where a made-up id was ignored).
#[test]
fn a_session_is_its_tokens_and_a_2026_request_ignores_whose_id_it_carries() {
    let dir = fresh_dir("session-owner");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"ci\"\ntoken = \"ci-secret-1\"\n\n[[auth.tokens]]\nname = \"ops\"\ntoken = \"ops-secret-1\"\n",
    )
    .unwrap();
    let (child, addr) = start(&dir, &[], &[]);
    let mut child = KillOnDrop(Some(child));
    let sid = open_with(&addr, &[("Authorization", "Bearer ci-secret-1")]);
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let own = rpc(
        &addr,
        &[
            ("Authorization", "Bearer ci-secret-1"),
            ("Mcp-Session-Id", &sid),
        ],
        list,
    );
    assert!(
        own.starts_with("HTTP/1.1 200") && own.contains("tool_search"),
        "{own}"
    );
    let other = rpc(
        &addr,
        &[
            ("Authorization", "Bearer ops-secret-1"),
            ("Mcp-Session-Id", &sid),
        ],
        list,
    );
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    let modern = |session: &str| {
        post_2026(
            &addr,
            "tools/list",
            None,
            "{}",
            "",
            &[
                ("Authorization", "Bearer ops-secret-1"),
                ("Mcp-Session-Id", session),
            ],
        )
    };
    for session in [sid.as_str(), "made-up-session-id"] {
        let answer = modern(session);
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.contains("tool_search"),
            "{session}: {answer}"
        );
    }
    // The session is still ci's, and still works.
    let again = rpc(
        &addr,
        &[
            ("Authorization", "Bearer ci-secret-1"),
            ("Mcp-Session-Id", &sid),
        ],
        list,
    );
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    stop(child.0.take().expect("running"));
}

/// One 2026-07-28 request (no session): `method` (id 21) with `params` (an object without
/// `_meta`), the `_meta` entries `meta` (JSON members, may be empty) beside the required
/// ones, and `headers` beside the protocol's.
fn post_2026(
    addr: &str,
    method: &str,
    name: Option<&str>,
    params: &str,
    meta: &str,
    headers: &[(&str, &str)],
) -> String {
    let comma = if meta.is_empty() { "" } else { "," };
    let params = params.strip_suffix('}').expect("params is an object");
    let sep = if params.trim_end().ends_with('{') {
        ""
    } else {
        ","
    };
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":21,"method":"{method}","params":{params}{sep}"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"t","version":"1"}}{comma}{meta}}}}}}}"#
    );
    let mut all = vec![
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", method),
    ];
    if let Some(n) = name {
        all.push(("Mcp-Name", n));
    }
    all.extend_from_slice(headers);
    post_mcp(addr, &all, &body)
}

/// A 2026-07-28 request's `_meta` log level that is not a level is -32602 naming the
/// levels (it was read as none: the call ran and got no log messages, saying nothing), and
/// the refused call has its log row.
#[test]
fn a_2026_log_level_that_is_not_one_is_invalid_params() {
    let dir = fresh_dir("log-level-meta");
    let (child, addr) = start(&dir, &[], &[]);
    let mut child = KillOnDrop(Some(child));
    let params = r#"{"name":"describe_tool","arguments":{"name":"tool_search"}}"#;
    for bad in [r#""loud""#, "7", r#"{"level":"debug"}"#] {
        let answer = post_2026(
            &addr,
            "tools/call",
            Some("describe_tool"),
            params,
            &format!(r#""io.modelcontextprotocol/logLevel":{bad}"#),
            &[],
        );
        assert!(
            answer.contains(r#""code":-32602"#)
                && answer.contains(
                    "`_meta.io.modelcontextprotocol/logLevel` must be one of debug, info"
                ),
            "{bad}: {answer}"
        );
    }
    for fine in [r#""io.modelcontextprotocol/logLevel":"debug""#, ""] {
        let answer = post_2026(
            &addr,
            "tools/call",
            Some("describe_tool"),
            params,
            fine,
            &[],
        );
        assert!(
            answer.contains(r#""isError":false"#) && answer.contains(r#""id":21"#),
            "{fine}: {answer}"
        );
    }
    stop(child.0.take().expect("running"));
    // Each refused call has its row, as the two that ran do.
    let log = log_json(&dir);
    assert_eq!(
        log.lines()
            .filter(|l| l.contains(r#""err_kind":"invalid_params""#))
            .count(),
        3,
        "{log}"
    );
    assert_eq!(log.lines().count(), 5, "{log}");
}

/// `quiver log --json` in `dir`: the execution log, one JSON row per line.
fn log_json(dir: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["log", "--json"])
        .current_dir(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Kills the child when dropped still holding it (a test that panics before `stop`).
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A request refused for its token leaves its keep-alive connection usable, also when its
/// body arrives after its head (hyper closed the connection under the client then, with no
/// `Connection: close`, and the client's next request on it failed to read an answer).
#[test]
fn a_refused_request_leaves_its_connection_usable() {
    let dir = fresh_dir("refused-keepalive");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"ci\"\ntoken = \"ci-secret-1\"\n",
    )
    .unwrap();
    let (child, addr) = start(&dir, &[], &[]);
    let mut child = KillOnDrop(Some(child));
    let body = INITIALIZE;
    let head = |auth: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\n\r\n",
            body.len()
        )
    };
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The head, then the body a moment later: the 401 is decided on the head alone.
    s.write_all(head("Authorization: Bearer wrong\r\n").as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.write_all(body.as_bytes()).unwrap();
    let first = read_response(&mut s);
    assert!(first.starts_with("HTTP/1.1 401"), "{first}");
    // The same connection, now with the token.
    s.write_all(head("Authorization: Bearer ci-secret-1\r\n").as_bytes())
        .unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let second = read_response(&mut s);
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    stop(child.0.take().expect("running"));
}

/// One HTTP/1.1 response from `s` (its head and a body of `Content-Length`, or of one SSE
/// event), leaving the connection open.
fn read_response(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => {
                return format!(
                    "<connection ended after {:?}>",
                    String::from_utf8_lossy(&buf)
                );
            }
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let length = head.lines().find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
    });
    match length {
        Some(n) => {
            let mut body = vec![0u8; n];
            s.read_exact(&mut body).unwrap();
            head + &String::from_utf8_lossy(&body)
        }
        // A streamed answer: its first event is enough.
        None => {
            let mut rest = Vec::new();
            while !String::from_utf8_lossy(&rest).contains("\"result\"") {
                match s.read(&mut byte) {
                    Ok(1) => rest.push(byte[0]),
                    _ => break,
                }
            }
            head + &String::from_utf8_lossy(&rest)
        }
    }
}

/// A deny rule for one token (or its tenant) refuses every call that token makes, so that
/// token is never offered the tool: not in its tool list, its `tool_search`, its
/// `describe_tool` or a did-you-mean; a call still gets the rule's message. Another token
/// sees the tool as before.
#[test]
fn a_tool_a_token_is_always_denied_is_not_offered_to_it() {
    let dir = fresh_dir("denied-per-token");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[surface]\nanchors = [\"mcp__one__t\"]\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{ONE_TOOL_SERVER:?}]\nenv = {{ DESCRIPTION = \"Takes one field. Use it in tests.\" }}\n\n[[policy.rules]]\nid = \"not-ci\"\ntool = \"mcp__one__*\"\naction = \"deny\"\nprincipal = \"ci\"\nmessage = \"ci may not use the one server\"\n\n[[policy.rules]]\nid = \"not-acme\"\ntool = \"mcp__one__t\"\naction = \"deny\"\ntenant = \"acme\"\nmessage = \"acme may not use t\"\n\n[[auth.tokens]]\nname = \"ci\"\ntoken = \"ci-secret-1\"\n\n[[auth.tokens]]\nname = \"bot\"\ntoken = \"bot-secret-1\"\ntenant = \"acme\"\n\n[[auth.tokens]]\nname = \"ops\"\ntoken = \"ops-secret-1\"\n"
        ),
    )
    .unwrap();
    let (child, addr) = start(&dir, &[], &[]);
    let mut child = KillOnDrop(Some(child));
    let seen = |secret: &str| {
        let auth = format!("Bearer {secret}");
        let sid = open_with(&addr, &[("Authorization", &auth)]);
        let ask = |body: &str| {
            rpc(
                &addr,
                &[("Authorization", &auth), ("Mcp-Session-Id", &sid)],
                body,
            )
        };
        [
            ask(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#),
            ask(
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"tool_search","arguments":{"query":"takes one field"}}}"#,
            ),
            ask(
                r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"describe_tool","arguments":{"name":"mcp__one__t"}}}"#,
            ),
            ask(
                r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"mcp__one__tt","arguments":{}}}"#,
            ),
            ask(
                r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"mcp__one__t","arguments":{"x":"a"}}}"#,
            ),
        ]
    };
    for (secret, message) in [
        ("ci-secret-1", "ci may not use the one server"),
        ("bot-secret-1", "acme may not use t"),
    ] {
        let [listed, found, described, typo, called] = seen(secret);
        assert!(
            listed.contains("tool_search") && !listed.contains("mcp__one__t"),
            "{secret}: {listed}"
        );
        assert!(
            found.contains("\"result\"") && !found.contains("mcp__one__t"),
            "{secret}: {found}"
        );
        assert!(
            described.contains("\"result\"") && !described.contains("Takes one field"),
            "{secret}: {described}"
        );
        assert!(
            typo.contains("undefined_tool") && !typo.contains("`mcp__one__t`"),
            "{secret}: no look-alike it is refused: {typo}"
        );
        assert!(
            called.contains("policy_denied") && called.contains(message),
            "{secret}: {called}"
        );
    }
    let [listed, found, described, typo, called] = seen("ops-secret-1");
    assert!(typo.contains("Did you mean `mcp__one__t`?"), "{typo}");
    assert!(listed.contains("mcp__one__t"), "{listed}");
    assert!(found.contains("mcp__one__t"), "{found}");
    assert!(described.contains("Takes one field"), "{described}");
    assert!(!called.contains("policy_denied"), "{called}");
    stop(child.0.take().expect("running"));
}

/// An upstream tool's `title` (the name clients show people, MCP 2025-06-18) is listed with
/// the tool; it was dropped, so clients showed `mcp__one__t`.
#[test]
fn an_upstream_tools_title_is_listed() {
    let dir = fresh_dir("tool-title");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[surface]\nanchors = [\"mcp__one__t\"]\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{ONE_TOOL_SERVER:?}]\nenv = {{ TITLE = \"The One Tool\" }}\n"
        ),
    )
    .unwrap();
    let (child, addr) = start(&dir, &[], &[]);
    let mut child = KillOnDrop(Some(child));
    let sid = open_with(&addr, &[]);
    let listed = rpc(
        &addr,
        &[("Mcp-Session-Id", &sid)],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    stop(child.0.take().expect("running"));
    assert!(
        listed.contains("\"name\":\"mcp__one__t\"")
            && listed.contains("\"title\":\"The One Tool\""),
        "{listed}"
    );
}

/// A client that closes stdin before its handshake finished (it gave up, or only probed the
/// command) ends a `serve --stdio` cleanly: exit 0. It was exit 2 with "the MCP session
/// could not start", which desktop clients show as a crash.
#[test]
fn a_stdio_client_that_leaves_before_initializing_is_a_clean_end() {
    for sent in ["", r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#] {
        let dir = fresh_dir("stdio-leaves-early");
        let mut child = serve_stdio_in(&dir, Stdio::null(), Stdio::piped());
        let mut stdin = child.stdin.take().unwrap();
        if !sent.is_empty() {
            writeln!(stdin, "{sent}").unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{sent:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The store's file deleted under a running `quiver serve` (an operator cleaning up, a
/// `rm` in the wrong directory): every later row would go to a file nobody can open, so
/// `/readyz` says not ready, in words that name no path. It said ready, and the rows were
/// lost without a word.
#[test]
fn readiness_reports_a_deleted_store_file() {
    let dir = fresh_dir("ready-deleted");
    let (child, addr) = start(&dir, &[], &[]);
    assert_eq!(
        probe(&addr, "/readyz"),
        (200, r#"{"status":"ready"}"#.to_owned())
    );
    for file in ["quiver.db", "quiver.db-wal", "quiver.db-shm"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    let (status, body) = probe(&addr, "/readyz");
    stop(child);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("the store file was deleted or moved while in use")
            && !body.contains("quiver.db"),
        "{body}"
    );
}

/// A `tools/call` whose params do not fit (`arguments` that is not an object, a `name` that
/// is not a string, no `params`) is -32602 naming the problem, over HTTP and over stdio,
/// and is in the execution log like every call: one row each, kind `invalid_params`, under
/// the name sent (a name that is not a string as its JSON text, none as `(no name)`). So
/// is a call whose conversation key cannot be one.
#[test]
fn a_tools_call_whose_params_do_not_fit_is_answered_and_logged() {
    let bad = [
        (
            r#"{"name":"describe_tool","arguments":[1,2]}"#,
            "describe_tool",
        ),
        (
            r#"{"name":"describe_tool","arguments":"str"}"#,
            "describe_tool",
        ),
        (r#"{"name":5,"arguments":{}}"#, "5"),
        ("", "(no name)"),
        // A conversation key that cannot be one: refused before the call has a session.
        (
            r#"{"name":"tool_search","arguments":{},"_meta":{"quiver/conversation":""}}"#,
            "tool_search",
        ),
    ];
    let request = |id: usize, params: &str| {
        let params = if params.is_empty() {
            String::new()
        } else {
            format!(r#","params":{params}"#)
        };
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call"{params}}}"#)
    };
    let refused = |answer: &str, id: usize| {
        assert!(
            answer.contains(r#""code":-32602"#)
                && (answer.contains("invalid params for `tools/call`")
                    || answer.contains("must be 1 to 256 bytes without control characters"))
                && answer.contains(&format!(r#""id":{id}"#)),
            "{id}: {answer}"
        );
    };
    let logged = |dir: &std::path::Path| {
        let log = log_json(dir);
        let rows: Vec<serde_json::Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), bad.len(), "{log}");
        for (_, tool) in bad {
            assert!(
                rows.iter()
                    .any(|r| r["tool"] == tool && r["err_kind"] == "invalid_params"),
                "{tool}: {log}"
            );
        }
    };

    let dir = fresh_dir("bad-call-http");
    let (child, addr) = start(&dir, &[], &[]);
    let sid = open_with(&addr, &[]);
    let session = [("Mcp-Session-Id", sid.as_str())];
    for (id, (params, _)) in bad.iter().enumerate() {
        refused(&rpc(&addr, &session, &request(id + 2, params)), id + 2);
    }
    stop(child);
    logged(&dir);

    let dir = fresh_dir("bad-call-stdio");
    let (mut child, mut stdin, mut lines) = stdio_opened(&dir);
    for (id, (params, _)) in bad.iter().enumerate() {
        writeln!(stdin, "{}", request(id + 2, params)).unwrap();
        refused(&lines.next().unwrap().unwrap(), id + 2);
    }
    drop(stdin);
    let mut c = child.0.take().expect("running");
    assert!(c.wait().unwrap().success());
    logged(&dir);
}

/// Serving beyond loopback with no inbound tokens is said aloud (the Host check lets any
/// client that sends `Host: 127.0.0.1:PORT` in); with a token, or on loopback, nothing is
/// said.
#[test]
fn an_open_listener_beyond_loopback_is_a_warning() {
    let dir = fresh_dir("open-bind");
    let run = |listen: &str, config: &str| -> String {
        std::fs::write(dir.join("quiver.toml"), config).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(["serve", "--listen", listen])
            .current_dir(&dir)
            .env("QUIVER_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("http://"), "{line}");
        // Bound to every interface, the URL printed is the loopback one a client here can
        // use, not `0.0.0.0`.
        if listen.starts_with("0.0.0.0") {
            assert!(line.starts_with("http://127.0.0.1:"), "{line}");
        }
        let mut err = child.stderr.take().unwrap();
        stop(child);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut err, &mut text).unwrap();
        text
    };
    let open = run("0.0.0.0:0", "");
    assert!(
        open.contains("beyond this machine, with no [[auth.tokens]]: anyone who can reach this port can call every tool"),
        "{open}"
    );
    let token = "[[auth.tokens]]\nname = \"ci\"\ntoken = \"ci-secret-long-enough-1\"\n";
    let guarded = run("0.0.0.0:0", token);
    assert!(!guarded.contains("auth.tokens"), "{guarded}");
    let local = run("127.0.0.1:0", "");
    assert!(!local.contains("auth.tokens"), "{local}");
}

/// `quiver serve` runs `[custom] jobs` jobs at once (two by default): a proposal whose test
/// case takes seconds does not hold up one queued after it, whose build passes while the
/// first is still testing.
#[test]
fn a_slow_build_does_not_hold_up_the_next_job() {
    let dir = fresh_dir("jobs-at-once");
    std::fs::write(
        dir.join("quiver.toml"),
        "[[auth.tokens]]\nname = \"lead\"\ntoken = \"lead-secret-123456\"\nadmin = true\n",
    )
    .unwrap();
    let (child, _addr) = start(&dir, &[], &[]);
    // Killed if an assertion fails before the clean stop below.
    let mut child = Killed(Some(child));
    let propose = |name: &str, source: &str| {
        let proposal = serde_json::json!({
            "name": name,
            "description": "Returns its input. Use it when testing the job worker.",
            "input_schema": {"type": "object", "properties": {"n": {"type": "number", "description": "A number."}}, "required": ["n"]},
            "source": source,
            "tests": [{"inputs": {"n": 1}, "expect": 1}],
        })
        .to_string();
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(["call", "create_custom_tool", &proposal, "--token", "lead"])
            .current_dir(&dir)
            .env("QUIVER_LOG", "error")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    // About four seconds of work in its one case (within the default 5 s wall time).
    propose(
        "slow_one",
        "async function main(inputs) { const end = Date.now() + 4000; while (Date.now() < end) {} return inputs.n; }",
    );
    propose(
        "fast_one",
        "async function main(inputs) { return inputs.n; }",
    );
    let status = |jobs: &str, tool: &str| {
        jobs.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(tool))
            .and_then(|l| l.split_whitespace().nth(3))
            .unwrap_or("")
            .to_owned()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let jobs = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(["custom", "jobs"])
            .current_dir(&dir)
            .output()
            .unwrap();
        let jobs = String::from_utf8_lossy(&out.stdout).into_owned();
        if status(&jobs, "fast_one") == "passed" {
            break jobs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the fast build never passed:\n{jobs}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(
        status(&jobs, "slow_one"),
        "passed",
        "the slow build ran first, alone: the fast one waited for it\n{jobs}"
    );
    stop(child.0.take().expect("running"));
}
