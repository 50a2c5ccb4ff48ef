//! `GET /metrics` of `quiver serve`: behind the admin token on the MCP listener, open on
//! `--metrics-listen`, and scraped by a real Prometheus (Debian's `prometheus` package,
//! which `.ci/setup-peers` installs), whose HTTP API gives the series back.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    ONE_TOOL_SERVER,
    serve::{get, open, rpc, start_with, stop, try_get},
};

const ADMIN_TOKEN: &str = "metrics-admin-token-0123";

/// A configuration with the admin token and one upstream (the stdio fixture, its tool an
/// anchor so every session can call it).
fn config(dir: &std::path::Path) {
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n[surface]\nanchors = [\"mcp__one__t\"]\n\n[[mcp.servers]]\nname = \"one\"\ncommand = \"python3\"\nargs = [{ONE_TOOL_SERVER:?}]\nrequired = true\n"
        ),
    )
    .unwrap();
}

/// One call of each outcome the test counts: two Ok (an upstream's tool and tool_search),
/// one refused (a name nobody serves).
fn make_calls(addr: &str) {
    let sid = open(addr, "metrics");
    let headers = [
        ("Mcp-Session-Id", sid.as_str()),
        ("Quiver-Conversation", "metrics"),
    ];
    for (id, name, arguments) in [
        (2, "mcp__one__t", r#"{"x":"hello"}"#),
        (3, "tool_search", r#"{"query":"anything"}"#),
        (4, "no_such_tool", "{}"),
    ] {
        let answer = rpc(
            addr,
            &headers,
            &format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{arguments}}}}}"#
            ),
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{name}: {answer}");
    }
}

/// A port free now on 127.0.0.1 (for a process that takes no port 0).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The value of the sample line `series` (name and labels as rendered), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().expect("a sample value is a number"))
}

/// Without the admin token `/metrics` answers 401 (and a wrong token too); with it, the
/// calls made are counted by tool, server and outcome, with the upstream's state and the
/// sessions open. On `--metrics-listen` the same text needs no token.
#[test]
fn metrics_are_behind_the_admin_token_or_on_their_own_listener() {
    let dir = crate::Scratch::new("metrics-token");
    config(&dir);
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let (child, addr) = start_with(&dir, &[], &["--metrics-listen", &metrics_addr], &[]);
    make_calls(&addr);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let without = get(&addr, "/metrics", &[]);
    let wrong = get(
        &addr,
        "/metrics",
        &[("Authorization", "Bearer not-the-admin-token")],
    );
    let with = get(&addr, "/metrics", &[("Authorization", &bearer)]);
    let other_host = get(
        &addr,
        "/metrics",
        &[
            ("Authorization", &bearer),
            ("Origin", "http://evil.example"),
        ],
    );
    let own = get(&metrics_addr, "/metrics", &[]);
    stop(child);
    assert_eq!(without.0, 401, "{without:?}");
    assert_eq!(wrong.0, 401, "{wrong:?}");
    assert_eq!(other_host.0, 403, "{other_host:?}");
    assert_eq!(with.0, 200, "{with:?}");
    assert_eq!(own.0, 200, "{own:?}");
    let text = &with.1;
    for (series, want) in [
        (
            r#"quiver_tool_calls_total{tool="mcp__one__t",server="one",outcome="ok"}"#,
            1.0,
        ),
        (
            r#"quiver_tool_calls_total{tool="tool_search",server="(core)",outcome="ok"}"#,
            1.0,
        ),
        (
            r#"quiver_tool_calls_total{tool="(undefined)",server="(undefined)",outcome="refused"}"#,
            1.0,
        ),
        (
            r#"quiver_tool_call_seconds_count{server="one",phase="took"}"#,
            1.0,
        ),
        (
            r#"quiver_upstream_state{server="one",state="connected"}"#,
            1.0,
        ),
        (r#"quiver_upstream_dials_total{server="one"}"#, 1.0),
        ("quiver_sessions_open", 1.0),
        ("quiver_log_failing", 0.0),
    ] {
        assert_eq!(sample(text, series), Some(want), "{series} in\n{text}");
    }
    assert!(
        sample(text, "quiver_working_sets").is_some_and(|n| n >= 1.0),
        "the conversation's working set: {text}"
    );
    assert!(
        sample(
            &own.1,
            r#"quiver_tool_calls_total{tool="mcp__one__t",server="one",outcome="ok"}"#
        ) == Some(1.0),
        "{}",
        own.1
    );
}

/// Kills the Prometheus it holds when dropped (a failed assertion included).
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `s` percent-encoded for a URL's query.
fn query_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the one series PromQL `query` gives on Prometheus at `addr`, once it has
/// one (Prometheus answers an empty vector until it has scraped); panics after a minute.
fn query_value(addr: &str, query: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Refused until Prometheus listens.
        let (status, body) = try_get(
            addr,
            &format!("/api/v1/query?query={}", query_encoded(query)),
            &[],
        )
        .unwrap_or((0, String::new()));
        if status == 200 {
            let v: Value = serde_json::from_str(&body).expect("Prometheus answers JSON");
            if let Some(value) = v["data"]["result"][0]["value"][1].as_str() {
                return value.parse().expect("a sample value");
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus at {addr} has no series for {query} after a minute: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A real Prometheus scrapes `quiver serve`'s `/metrics` on the MCP listener with the admin
/// token as its bearer token, and its query API gives back the calls, the upstream's state
/// and the scrape's health.
#[test]
fn prometheus_scrapes_quiver_and_reads_the_series_back() {
    let prometheus = which("prometheus").expect(
        "the `prometheus` binary is not on PATH: install Debian's `prometheus` package (`apt-get install -y prometheus`, which .ci/setup-peers runs)",
    );
    let dir = crate::Scratch::new("metrics-prometheus");
    config(&dir);
    let (child, addr) = start_with(&dir, &[], &[], &[]);
    make_calls(&addr);
    let web = format!("127.0.0.1:{}", free_port());
    let yml = dir.join("prometheus.yml");
    std::fs::write(
        &yml,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: quiver\n    scrape_interval: 1s\n    authorization:\n      type: Bearer\n      credentials: {ADMIN_TOKEN}\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let server = Prometheus(
        Command::new(prometheus)
            .arg(format!("--config.file={}", yml.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let up = query_value(&web, r#"up{job="quiver"} == 1"#);
    let upstream_ok = query_value(
        &web,
        r#"quiver_tool_calls_total{job="quiver",tool="mcp__one__t",server="one",outcome="ok"}"#,
    );
    let refused = query_value(
        &web,
        r#"sum(quiver_tool_calls_total{job="quiver",outcome="refused"})"#,
    );
    let connected = query_value(
        &web,
        r#"quiver_upstream_state{job="quiver",server="one",state="connected"}"#,
    );
    let took = query_value(
        &web,
        r#"quiver_tool_call_seconds_count{job="quiver",server="one",phase="took"}"#,
    );
    drop(server);
    stop(child);
    assert_eq!(up, 1.0, "the scrape with the bearer token succeeds");
    assert_eq!(upstream_ok, 1.0);
    assert_eq!(refused, 1.0);
    assert_eq!(connected, 1.0);
    assert_eq!(took, 1.0);
}

/// The path of `program` on PATH, if it is there.
fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}
