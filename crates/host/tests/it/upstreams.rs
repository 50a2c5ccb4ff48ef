//! `quiver` with a real `mcpServers` file naming server-everything (npm) and mcp-server-time
//! (PyPI), installed by `.ci/setup-peers`.

use std::{path::PathBuf, process::Command};

fn peers() -> PathBuf {
    let root = std::env::var_os("QUIVER_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers")));
    assert!(
        root.join("npm/node_modules/.bin/mcp-server-everything")
            .exists()
            && root.join("venv/bin/mcp-server-time").exists(),
        "MCP peers missing in {}: run .ci/setup-peers",
        root.display()
    );
    root
}

/// Every process started with this marker in its environment (Quiver and the children it
/// spawns inherit it).
fn marked_processes(marker: &str) -> Vec<String> {
    let needle = format!("QUIVER_TEST_MARKER={marker}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(env) = std::fs::read(entry.path().join("environ"))
            && env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes())
        {
            let cmd = std::fs::read_to_string(entry.path().join("cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
            found.push(format!("{pid}: {cmd}"));
        }
    }
    found
}

#[test]
fn a_real_mcp_servers_file_aggregates_upstreams_behind_one_catalog() {
    let peers = peers();
    let dir = crate::Scratch::new("upstreams");
    let config = dir.join("claude_desktop_config.json");
    std::fs::write(
        &config,
        serde_json::json!({"mcpServers": {
            "everything": {"command": peers.join("npm/node_modules/.bin/mcp-server-everything"), "env": {"QUIVER_TEST_MARKER": "${env:QUIVER_TEST_MARKER}"}},
            "time": {"command": peers.join("venv/bin/mcp-server-time"), "args": ["--local-timezone", "UTC"], "env": {"QUIVER_TEST_MARKER": "${env:QUIVER_TEST_MARKER}"}}
        }})
        .to_string(),
    )
    .unwrap();
    let marker = format!("{}-{}", std::process::id(), line!());
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .arg("--mcp-config")
            .arg(&config)
            .args(args)
            .current_dir(&dir)
            .env("QUIVER_LOG", "error")
            .env("QUIVER_TEST_MARKER", &marker)
            .output()
            .expect("quiver runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    let (code, status, err) = run(&["status"]);
    assert_eq!(code, Some(0), "{err}");
    // Start-up progress, not on a terminal: one plain line per server as it settles.
    for name in ["everything", "time"] {
        assert!(
            err.lines().any(
                |l| l.starts_with(&format!("upstream MCP server {name}: connected, "))
                    && l.ends_with("tool(s)")
            ),
            "{err}"
        );
    }
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("everything") && l.contains("connected")),
        "{status}"
    );
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("time") && l.contains("connected")),
        "{status}"
    );

    // server-everything's `simulate-research-query` runs only as an MCP task
    // (`execution.taskSupport: "required"`): every plain call of it fails, so it is left out
    // of the catalog while the server's other tools are served.
    let (code, all, err) = run(&["tools", "--all"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(all.contains("mcp__everything__echo"), "{all}");
    assert!(!all.contains("simulate-research-query"), "{all}");
    // Lint findings in the upstreams' own definitions are notes the operator cannot act on:
    // the check still passes, and says they were not counted.
    let (code, checked, err) = run(&["check"]);
    assert_eq!(code, Some(0), "{checked}{err}");
    assert!(
        checked.contains("[when_to_use]")
            && checked.contains("(note: the definition is MCP server everything's)"),
        "{checked}"
    );
    assert!(
        checked.contains("simulate-research-query: [note] left out of family mcp:everything: not served: it runs only as an MCP task"),
        "{checked}"
    );
    assert!(checked.contains("note(s), not counted"), "{checked}");

    // The model's path: search, then the found tools are on the next tool list, then a call.
    let (code, found, err) = run(&["search", "current time in a timezone", "--limit", "3"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        found.contains("\"name\": \"mcp__time__get_current_time\""),
        "{found}"
    );
    let (_, tools, _) = run(&["tools"]);
    assert!(
        tools.contains("mcp__time__get_current_time"),
        "the paged-in tool survives the restart: {tools}"
    );
    let (code, now, err) = run(&[
        "call",
        "mcp__time__get_current_time",
        r#"{"timezone": "UTC"}"#,
    ]);
    assert_eq!(code, Some(0), "{now}{err}");
    assert!(
        now.starts_with("✓ ok.") && now.contains("\"timezone\": \"UTC\""),
        "{now}"
    );
    let (code, echo, _) = run(&["call", "mcp__everything__echo", r#"{"message": "hi"}"#]);
    assert_eq!(code, Some(0), "{echo}");
    assert!(echo.contains("Echo: hi"), "{echo}");
    let (code, bad, _) = run(&["call", "mcp__everything__echo", r#"{"message": 5}"#]);
    assert_eq!(code, Some(0), "a hint is not an error: {bad}");
    assert!(bad.starts_with("⚠ schema hint"), "{bad}");
    let (_, log, _) = run(&["log", "--tool", "mcp__everything__echo", "--json"]);
    assert_eq!(log.lines().count(), 2, "{log}");

    // No child outlived the quiver processes.
    let left = marked_processes(&marker);
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

/// SIGTERM while a one-shot command waits for its upstreams: Quiver stops them, including
/// what a wrapper started (`sh -c` here; `npx` and `uvx` alike), before it exits. Killed
/// by the default action, it left the grandchild running.
#[test]
fn a_signal_during_a_command_stops_the_upstreams_processes() {
    let dir = crate::Scratch::new("signal");
    let config = dir.join("mcp.json");
    // Never answers `initialize`: the command waits for it.
    std::fs::write(
        &config,
        serde_json::json!({"mcpServers": {"slow": {"command": "sh", "args": ["-c", "sleep 314; :"], "env": {"QUIVER_TEST_MARKER": "${env:QUIVER_TEST_MARKER}"}}}})
            .to_string(),
    )
    .unwrap();
    let marker = format!("{}-{}", std::process::id(), line!());
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("--mcp-config")
        .arg(&config)
        .arg("status")
        .current_dir(&dir)
        .env("QUIVER_LOG", "error")
        .env("QUIVER_TEST_MARKER", &marker)
        .env("QUIVER_TEST_SECRET", "inbound-secret")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !marked_processes(&marker)
        .iter()
        .any(|p| p.contains("sleep 314"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the upstream never started: {:?}",
            marked_processes(&marker)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The upstream has its `env` and the allowed part of Quiver's environment (PATH, ...),
    // not the rest: Quiver's secrets are not the server's.
    let upstream = marked_processes(&marker)
        .into_iter()
        .find(|p| p.contains("sleep 314"))
        .unwrap();
    let pid = upstream.split(':').next().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let names: Vec<String> = environ
        .split(|b| *b == 0)
        .filter_map(|kv| kv.split(|b| *b == b'=').next())
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "PATH"), "{names:?}");
    assert!(
        !names.iter().any(|n| n == "QUIVER_TEST_SECRET"),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n == "CARGO_MANIFEST_DIR"),
        "{names:?}"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "quiver did not stop");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(err.contains("interrupted by signal 15"), "{err}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = marked_processes(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "processes left behind: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// An upstream whose `tools/list` answer is past the JSON parser's depth limit (128) because
/// of one tool (a schema nested 150 levels deep) is served without that tool, which is
/// reported with why, rather than the whole server down and its other tools gone.
#[test]
fn a_tool_nested_too_deeply_is_skipped_and_the_rest_served() {
    let python = peers().join("venv/bin/python");
    let dir = crate::Scratch::new("deep");
    let script = dir.join("deep.py");
    std::fs::write(
        &script,
        r#"import sys, json
leaf = {"type": "string", "description": "leaf"}
for _ in range(150):
    leaf = {"type": "object", "description": "level", "properties": {"x": leaf}}
tools = [{"name": "deep", "description": "Use when deep.", "inputSchema": {"type": "object", "properties": {"d": leaf}}},
         {"name": "fine", "description": "Use when fine.", "inputSchema": {"type": "object", "properties": {"x": {"type": "string", "description": "x"}}}}]
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": {"name": "deep", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": tools}
    else:
        r = {}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[store]\npath = {db:?}\n\n[[mcp.servers]]\nname = \"deep\"\ncommand = {py:?}\nargs = [{script:?}]\n",
            db = dir.join("quiver.db"),
            py = python,
            script = script,
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("status")
        .current_dir(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("upstream MCP server deep: connected, 1 tool(s)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("skipped malformed tool \"deep\": tool \"deep\" has a definition nested too deeply for Quiver to read (the listing went past the JSON parser's 128 levels"),
        "{stdout}\n{stderr}"
    );
    // `--quiet` leaves out the progress, and keeps what needs attention.
    let quiet = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["--quiet", "status"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let quiet_err = String::from_utf8_lossy(&quiet.stderr);
    assert!(quiet.status.success(), "{quiet_err}");
    assert!(!quiet_err.contains("connected, 1 tool(s)"), "{quiet_err}");
    assert!(
        quiet_err.contains("skipped malformed tool \"deep\""),
        "{quiet_err}"
    );
    let tools = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["search", "use when deep or fine", "--limit", "5"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&tools.stdout);
    assert!(tools.status.success(), "{listed}");
    assert!(listed.contains("mcp__deep__fine"), "{listed}");
    assert!(!listed.contains("mcp__deep__deep"), "{listed}");
}

/// A command ends by closing its upstreams: an HTTP one is not "lost" then. Every command
/// with a streamable-HTTP upstream (`status`, `tools`, `check`, the end of `serve --stdio`)
/// printed "connection lost; reconnecting in the background" as it exited.
#[test]
fn closing_an_http_upstream_at_exit_is_not_a_lost_connection() {
    let python = peers().join("venv/bin/python");
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mcp-adapter/tests/fixtures/fault_server.py"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new(&python)
        .args([fixture, "--http", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the fixture never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let dir = crate::Scratch::new("http-exit");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[store]\npath = {db:?}\n\n[[mcp.servers]]\nname = \"fx\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n",
            db = dir.join("quiver.db"),
        ),
    )
    .unwrap();
    let runs: Vec<_> = [&["status"][..], &["tools"]]
        .iter()
        .map(|args| {
            Command::new(env!("CARGO_BIN_EXE_quiver"))
                .args(*args)
                .current_dir(&dir)
                .env("QUIVER_LOG", "warn")
                .output()
                .unwrap()
        })
        .collect();
    let _ = server.kill();
    let _ = server.wait();
    for (i, out) in runs.iter().enumerate() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        // `status` shows the server connected: there was a connection to lose.
        assert!(i > 0 || stdout.contains("connected"), "{stdout}");
        assert!(!stderr.contains("connection lost"), "{stderr}");
    }
}
