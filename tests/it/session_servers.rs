//! Per-session MCP servers (`scope = "session"`) through `quiver serve`, against the real npm
//! `@modelcontextprotocol/server-filesystem` started with no directory (so it serves its
//! client's roots) and the official Python MCP client (`session_servers.py`): each session
//! sees only its own root, and no server process outlives its session, its idle timeout or
//! Quiver.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
};

use crate::mcp_server::{
    Server, fresh_dir, peers, python, quiver_binary, repo_root, run_script, run_script_with_env,
};

/// server-filesystem as `.ci/setup-peers` installs it.
fn filesystem_bin() -> PathBuf {
    let bin = peers().join("npm/node_modules/.bin/mcp-server-filesystem");
    assert!(
        bin.exists(),
        "{} is missing: run `bash .ci/setup-peers` to install @modelcontextprotocol/server-filesystem",
        bin.display()
    );
    bin
}

/// A directory for the run with `quiver.toml` (one per-session server-filesystem, named
/// `fs`, with `extra` lines) and two client roots, `a` (holding `only-a.txt`) and `b`
/// (holding `only-b.txt`).
fn setup(extra: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = fresh_dir();
    let (a, b) = (dir.join("root-a"), dir.join("root-b"));
    std::fs::create_dir_all(&a).expect("root a");
    std::fs::create_dir_all(&b).expect("root b");
    std::fs::write(a.join("only-a.txt"), "alpha\n").expect("A's file");
    std::fs::write(b.join("only-b.txt"), "bravo\n").expect("B's file");
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[[mcp.servers]]\nname = \"fs\"\ncommand = {:?}\nscope = \"session\"\n{extra}\n",
            filesystem_bin().display().to_string()
        ),
    )
    .expect("quiver.toml");
    (dir, a, b)
}

async fn serve(dir: &Path) -> Server {
    Server::start_in(quiver_binary(), &["serve", "--listen", "127.0.0.1:0"], dir).await
}

async fn drive(extra: &str, mode: &str) {
    let (dir, a, b) = setup(extra);
    let server = serve(&dir).await;
    let pid = server.pid().to_string();
    run_script(
        "session_servers.py",
        &[
            &server.url,
            &pid,
            &a.display().to_string(),
            &b.display().to_string(),
            mode,
        ],
    )
    .await;
}

/// Two clients at once, each with its own root: each lists and reads its own files, the
/// other's root is refused by its server, and each session's child is gone when the session
/// ends (the other's still serving); a stateless client is refused in words.
#[tokio::test]
async fn each_session_gets_its_own_server_rooted_at_its_roots() {
    drive("", "--isolation").await;
}

/// `max_per_principal = 1`: a second session of the same principal is refused the server,
/// naming the cap, until the first one ends.
#[tokio::test]
async fn a_principal_over_its_cap_is_refused_until_a_session_ends() {
    drive("max_per_principal = 1", "--cap").await;
}

/// `idle_timeout`: an idle session's child is stopped while the session stays open, and its
/// next call starts a new one.
#[tokio::test]
async fn an_idle_session_server_is_stopped_and_started_again_by_the_next_call() {
    drive("idle_timeout = \"1s\"", "--idle").await;
}

/// A session whose first request is `tool_search` (answered without its client's channel
/// when no per-session server needs one): its server, started by that request, holds the
/// session's root at the next call.
#[tokio::test]
async fn a_session_that_begins_with_a_search_gives_its_server_its_roots() {
    drive("", "--search-first").await;
}

/// `quiver serve` stopped (SIGTERM) while a session runs its server: the child is stopped
/// and reaped with it, not left behind.
#[tokio::test]
async fn stopping_quiver_stops_the_session_servers() {
    let (dir, a, b) = setup("");
    let mut server = serve(&dir).await;
    let pid = server.pid().to_string();
    let script = repo_root().join("tests/fixtures/mcp_server/session_servers.py");
    let mut client = Command::new(python())
        .arg(&script)
        .args([
            server.url.as_str(),
            &pid,
            &a.display().to_string(),
            &b.display().to_string(),
            "--hold",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let mut lines = BufReader::new(client.stdout.take().expect("piped")).lines();
    let child = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("readable") {
            if let Some(pid) = line.strip_prefix("child ") {
                return pid.parse::<u32>().expect("a pid");
            }
        }
        panic!("the script ended before printing its child");
    })
    .await
    .expect("the session's server starts");
    assert!(Path::new(&format!("/proc/{child}")).exists());
    let status = server.terminate().await;
    assert!(status.success(), "quiver serve exits cleanly: {status}");
    // Quiver was its parent: a child it did not stop would now be init's, and live on.
    assert!(
        !Path::new(&format!("/proc/{child}")).exists(),
        "the session's server-filesystem (pid {child}) outlived quiver serve"
    );
    let _ = client.kill().await;
}

/// Over stdio the connection is the session: the client's roots reach its server, and when
/// the client closes Quiver's stdin, the server's child goes with Quiver.
#[tokio::test]
async fn a_stdio_session_gets_its_own_server_and_it_ends_with_the_connection() {
    let (dir, a, b) = setup("");
    let quiver_args = serde_json::json!([
        "--config",
        dir.join("quiver.toml").to_str().expect("utf-8 path"),
    ])
    .to_string();
    let bin = quiver_binary();
    run_script_with_env(
        "session_servers.py",
        &[
            bin.to_str().expect("utf-8 path"),
            "0",
            &a.display().to_string(),
            &b.display().to_string(),
            "--stdio",
        ],
        &[("QUIVER_ARGS", &quiver_args)],
    )
    .await;
}

/// A per-session server that lists tools by its session's roots
/// (`tests/fixtures/mcp_server/roots_tools.py`): each session lists, finds and calls only
/// the tools its own process lists, never those another session's process listed, even
/// where both names are anchors (always listed when offered).
#[tokio::test]
async fn a_session_sees_only_the_tools_its_own_process_lists() {
    let dir = fresh_dir();
    let (alpha, beta) = (dir.join("alpha"), dir.join("beta"));
    std::fs::create_dir_all(&alpha).unwrap();
    std::fs::create_dir_all(&beta).unwrap();
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[surface]\nanchors = [\"mcp__rt__where\", \"mcp__rt__in_alpha\", \"mcp__rt__in_beta\"]\n\n[[mcp.servers]]\nname = \"rt\"\ncommand = {:?}\nargs = [{:?}]\nscope = \"session\"\n",
            python().display().to_string(),
            repo_root()
                .join("tests/fixtures/mcp_server/roots_tools.py")
                .display()
                .to_string()
        ),
    )
    .unwrap();
    let mut server = serve(&dir).await;
    run_script(
        "session_tool_names.py",
        &[
            &server.url,
            &alpha.display().to_string(),
            &beta.display().to_string(),
        ],
    )
    .await;
    assert!(server.terminate().await.success());
}
