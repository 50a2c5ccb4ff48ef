//! Quiver as an OAuth 2.1 resource server against a real OpenID provider: the npm
//! `oidc-provider` package (`tests/fixtures/oidc/provider.mjs`, run with Node), `quiver
//! serve` with `[auth.oidc]`, and the official Python MCP client
//! (`tests/fixtures/oidc/identity.py`, which holds the protocol checks, and
//! `oauth_client.py`, the client's own OAuth flow from no token). Here: the set-up, that
//! `quiver log` shows each user, and that no token reached the server's log or the execution
//! log.

use std::{path::Path, process::Stdio, time::Duration};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

use crate::mcp_server::{fresh_dir, line_of, peers, quiver_binary, repo_root};

/// The provider, killed when dropped.
struct Provider {
    _child: Child,
    issuer: String,
}

async fn start_provider(resource: &str) -> Provider {
    let modules = peers().join("npm/node_modules");
    assert!(
        modules.join("oidc-provider/package.json").exists(),
        "{} has no oidc-provider: run `bash .ci/setup-peers` to install it",
        modules.display()
    );
    let mut child = Command::new("node")
        .arg(repo_root().join("tests/fixtures/oidc/provider.mjs"))
        .arg(&modules)
        .arg(resource)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts (is Node.js installed?)");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let line = line_of(&mut lines).await;
    let issuer = line
        .strip_prefix("issuer ")
        .unwrap_or_else(|| panic!("the provider printed {line:?}"))
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Provider {
        _child: child,
        issuer,
    }
}

/// A loopback port nothing listens on now (the server's resource URI names its port, so it
/// is chosen before the server starts).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn config(issuer: &str, resource: &str) -> String {
    format!(
        r#"
[auth.oidc]
issuer = "{issuer}"
resource = "{resource}"
scopes_supported = ["openid", "tools"]
jwks_min_refetch_secs = 0
introspection_client_id = "quiver"
introspection_client_secret = "quiver-secret"

[[auth.oidc.rules]]
claim = "groups"
value = "ops"

[[auth.oidc.rules]]
claim = "groups"
value = "readers"
allowed_tools = ["tool_search"]
"#
    )
}

async fn run_script(script: &Path, args: &[&str]) {
    let py = peers().join("venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash .ci/setup-peers` to install the Python MCP client",
        py.display()
    );
    let child = Command::new(py)
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .expect("the script finishes in time")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn an_openid_providers_tokens_are_verified_and_map_to_per_user_tools() {
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let provider = start_provider(&resource).await;
    let dir = fresh_dir();
    std::fs::write(dir.join("quiver.toml"), config(&provider.issuer, &resource))
        .expect("write quiver.toml");
    let server_log = dir.join("serve.log");
    let mut server = Command::new(quiver_binary())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("QUIVER_LOG", "debug")
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&server_log).expect("a log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("quiver serve starts");
    let mut lines = BufReader::new(server.stdout.take().expect("piped")).lines();
    let url = line_of(&mut lines).await;
    assert_eq!(url, resource);
    let tokens_out = dir.join("tokens.json");
    run_script(
        &repo_root().join("tests/fixtures/oidc/identity.py"),
        &[&url, &provider.issuer, tokens_out.to_str().expect("utf-8")],
    )
    .await;
    run_script(
        &repo_root().join("tests/fixtures/oidc/oauth_client.py"),
        &[&url],
    )
    .await;
    server.start_kill().expect("stop the server");
    server.wait().await.expect("the server ends");

    let log = std::process::Command::new(quiver_binary())
        .args(["log", "--json", "--limit", "1000"])
        .current_dir(&dir)
        .output()
        .expect("quiver log runs");
    assert!(
        log.status.success(),
        "{}",
        String::from_utf8_lossy(&log.stderr)
    );
    let log = String::from_utf8_lossy(&log.stdout).into_owned();
    let principals: std::collections::BTreeSet<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|r| r["principal"].as_str().map(str::to_owned))
        .collect();
    // The user: `sub`, with the email when the token has one.
    assert!(
        principals.contains("ops@example.com (ops-bot)")
            && principals.contains("reader-bot")
            && principals.contains("alice@example.com (alice)"),
        "the log names each user: {principals:?}"
    );
    let text = quiver_log_text(&dir);
    assert!(text.contains("ops@example.com (ops-bot)"), "{text}");

    let tokens: Vec<String> =
        serde_json::from_slice(&std::fs::read(&tokens_out).expect("the script wrote its tokens"))
            .expect("JSON");
    assert!(tokens.len() >= 10, "{tokens:?}");
    let served = std::fs::read_to_string(&server_log).expect("the server's log");
    assert!(
        served.contains("access token refused"),
        "the refusals are logged (without the token): {served}"
    );
    for t in &tokens {
        // A token's signature part (or the whole of a short opaque one) is nowhere.
        let tail = t.rsplit('.').find(|p| p.len() > 10).unwrap_or(t);
        assert!(!served.contains(tail), "a token reached the server's log");
        assert!(!log.contains(tail), "a token reached the execution log");
    }
}

/// `quiver log` as a person reads it.
fn quiver_log_text(dir: &Path) -> String {
    let out = std::process::Command::new(quiver_binary())
        .args(["log", "--limit", "1000"])
        .current_dir(dir)
        .output()
        .expect("quiver log runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An upstream of `upstream.py`, killed when dropped.
struct Upstream {
    _child: Child,
    url: String,
}

/// Starts `upstream.py` on a free port, accepting the provider's tokens for `audience` (its
/// own URL when `None`), and waits until it listens.
async fn start_upstream(issuer: &str, audience: Option<&str>) -> Upstream {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let child = Command::new(python())
        .arg(repo_root().join("tests/fixtures/oidc/upstream.py"))
        .args([&port.to_string(), issuer, audience.unwrap_or(&url)])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    tokio::time::timeout(Duration::from_secs(60), async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the upstream listens");
    Upstream { _child: child, url }
}

fn python() -> std::path::PathBuf {
    let py = peers().join("venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash .ci/setup-peers` to install the Python MCP SDK",
        py.display()
    );
    py
}

/// A client-credentials token of `client` for `resource`, from the provider.
async fn client_token(issuer: &str, client: &str, resource: &str) -> String {
    let out = Command::new(python())
        .arg(repo_root().join("tests/fixtures/oidc/delegation.py"))
        .args(["token", issuer, client, resource])
        .output()
        .await
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The script's checks print a line each; the token is the last.
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().unwrap_or_default().trim().to_owned()
}

#[tokio::test]
async fn users_tokens_reach_upstreams_by_passthrough_and_exchange_on_connections_of_their_own() {
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let provider = start_provider(&resource).await;
    // `pt` shares Quiver's audience; `ex` has its own.
    let pt = start_upstream(&provider.issuer, Some(&resource)).await;
    let ex = start_upstream(&provider.issuer, None).await;
    // Each server's own connection lists its tools with a static token of its audience.
    let pt_static = client_token(&provider.issuer, "lister", &resource).await;
    let ex_static = client_token(&provider.issuer, "lister", &ex.url).await;
    let dir = fresh_dir();
    let ci_token = "ci-token-0123456789";
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            r#"
[auth]
tokens = [{{ name = "ci", token = "{ci_token}" }}]

[auth.oidc]
issuer = "{issuer}"
resource = "{resource}"
client_id = "quiver"
client_secret = "quiver-secret"

[[mcp.servers]]
name = "pt"
url = "{pt}"
auth = "passthrough"
audience = "{resource}"

[[mcp.servers]]
name = "ex"
url = "{ex}"
auth = "exchange"
max_user_connections = 4
"#,
            issuer = provider.issuer,
            pt = pt.url,
            ex = ex.url,
        ),
    )
    .expect("write quiver.toml");
    let server_log = dir.join("serve.log");
    let metrics_port = free_port();
    let mut server = Command::new(quiver_binary())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .env("QUIVER_LOG", "debug")
        .env("MCP_PT_TOKEN", &pt_static)
        .env("MCP_EX_TOKEN", &ex_static)
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&server_log).expect("a log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("quiver serve starts");
    let mut lines = BufReader::new(server.stdout.take().expect("piped")).lines();
    let url = line_of(&mut lines).await;
    assert_eq!(url, resource);
    let tokens_out = dir.join("tokens.json");
    run_script(
        &repo_root().join("tests/fixtures/oidc/delegation.py"),
        &[
            "check",
            &url,
            &provider.issuer,
            &pt.url,
            &ex.url,
            ci_token,
            tokens_out.to_str().expect("utf-8"),
        ],
    )
    .await;
    // Two users have a connection of their own to `ex`, one to `pt`.
    let metrics = scrape(metrics_port).await;
    for (series, want) in [
        (r#"quiver_upstream_user_connections{server="ex"} 2"#, true),
        (r#"quiver_upstream_user_connections{server="pt"} 1"#, true),
    ] {
        assert_eq!(metrics.contains(series), want, "{series} in {metrics}");
    }
    let status = std::process::Command::new(quiver_binary())
        .args(["status"])
        .current_dir(&dir)
        .env("MCP_PT_TOKEN", &pt_static)
        .env("MCP_EX_TOKEN", &ex_static)
        .output()
        .expect("quiver status runs");
    server.start_kill().expect("stop the server");
    server.wait().await.expect("the server ends");

    let log = std::process::Command::new(quiver_binary())
        .args(["log", "--json", "--limit", "1000"])
        .current_dir(&dir)
        .output()
        .expect("quiver log runs");
    let log = String::from_utf8_lossy(&log.stdout).into_owned();
    assert!(
        log.contains("mcp__ex__whoami") && log.contains("ops@example.com (ops-bot)"),
        "the calls are in the execution log under their users: {log}"
    );
    let status = format!(
        "{}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        status.contains("acts for the user (auth = \"exchange\")")
            && status.contains("acts for the user (auth = \"passthrough\")"),
        "quiver status says which servers act for the user: {status}"
    );
    let mut tokens: Vec<String> =
        serde_json::from_slice(&std::fs::read(&tokens_out).expect("the script wrote its tokens"))
            .expect("JSON");
    tokens.extend([pt_static, ex_static]);
    let served = std::fs::read_to_string(&server_log).expect("the server's log");
    for t in &tokens {
        let tail = t.rsplit('.').find(|p| p.len() > 10).unwrap_or(t);
        assert!(!served.contains(tail), "a token reached the server's log");
        assert!(!log.contains(tail), "a token reached the execution log");
        assert!(!status.contains(tail), "a token reached quiver status");
        assert!(!metrics.contains(tail), "a token reached /metrics");
    }
}

/// `GET /metrics` on `quiver serve --metrics-listen`.
pub(crate) async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the metrics listener");
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("a request");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_string(&mut answer))
        .await
        .expect("an answer in time")
        .expect("an answer");
    answer
}

#[tokio::test]
async fn a_configuration_that_would_send_a_users_token_elsewhere_is_refused() {
    let cases = [
        (
            r#"auth = "passthrough"
audience = "https://tools.example.com/mcp""#,
            "\"other\": `auth = \"passthrough\"` with `audience = \"https://tools.example.com/mcp\"`, which is not Quiver's own audience",
        ),
        (
            r#"auth = "passthrough""#,
            "\"other\": `auth = \"passthrough\"` needs `audience`",
        ),
        (
            r#"auth = "exchange""#,
            "\"other\": `auth = \"exchange\"` needs Quiver's own client at the issuer: set `client_id` and `client_secret` in `[auth.oidc]`",
        ),
    ];
    for (keys, expected) in cases {
        let dir = fresh_dir();
        std::fs::write(
            dir.join("quiver.toml"),
            format!(
                r#"
[auth.oidc]
issuer = "https://id.example.com"
resource = "https://quiver.example.com/mcp"

[[mcp.servers]]
name = "other"
url = "https://tools.example.com/mcp"
{keys}
"#
            ),
        )
        .expect("write quiver.toml");
        let out = std::process::Command::new(quiver_binary())
            .arg("check")
            .current_dir(&dir)
            .output()
            .expect("quiver check runs");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "quiver check refuses {keys}");
        assert!(text.contains(expected), "{keys}: {text}");
    }
}

/// `/readyz` says not ready while the provider contradicts `[auth.oidc]` (here its issuer,
/// written with a trailing `/` the provider does not use): no access token can be checked,
/// so a load balancer should not send requests to this replica. With the issuer as the
/// provider says it, the same server is ready.
#[tokio::test]
async fn readyz_is_not_ready_while_the_provider_contradicts_the_configuration() {
    for (issuer_suffix, ready) in [("/", false), ("", true)] {
        let port = free_port();
        let resource = format!("http://127.0.0.1:{port}/mcp");
        let provider = start_provider(&resource).await;
        let dir = fresh_dir();
        let issuer = format!("{}{issuer_suffix}", provider.issuer);
        std::fs::write(dir.join("quiver.toml"), config(&issuer, &resource))
            .expect("write quiver.toml");
        let mut server = Command::new(quiver_binary())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .current_dir(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("quiver serve starts");
        let mut lines = BufReader::new(server.stdout.take().expect("piped")).lines();
        let url = line_of(&mut lines).await;
        // The provider is asked in the background at start: wait for its answer.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let (status, body) = loop {
            let (status, body) = crate::mcp_server::probe(&url, "/readyz").await;
            if (status == 200) == ready || std::time::Instant::now() > deadline {
                break (status, body);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if ready {
            assert_eq!(status, 200, "{body}");
        } else {
            assert_eq!(status, 503, "{body}");
            assert!(
                body.contains("[auth.oidc] does not match the provider")
                    && body.contains("set `[auth.oidc] issuer` to exactly what the provider says"),
                "{body}"
            );
        }
        server.start_kill().expect("stop the server");
        server.wait().await.expect("the server ends");
    }
}
