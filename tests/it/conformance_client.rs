//! The official MCP conformance suite's client scenarios against Quiver's upstream MCP client:
//! the suite starts a test server per scenario and runs `quiver-conformance-client` (see
//! `tests/bin/conformance_client.rs`) against it.

use std::{path::PathBuf, process::Stdio, time::Duration};

use crate::mcp_server::{conformance_command, repo_root};

/// The client scenarios issue 6 names.
const SCENARIOS: [&str; 4] = [
    "initialize",
    "tools_call",
    "sse-retry",
    "elicitation-sep1034-client-defaults",
];

async fn run(scenario: &str) -> (bool, String) {
    let wrapper = PathBuf::from(env!("CARGO_BIN_EXE_quiver-conformance-client"));
    let baseline = repo_root().join("tests/fixtures/conformance/client-expected-failures.yml");
    let out_dir = std::env::temp_dir().join(format!(
        "quiver-conformance-client-{}-{scenario}",
        std::process::id()
    ));
    let child = conformance_command()
        .arg("client")
        .arg("--command")
        .arg(&wrapper)
        .args(["--scenario", scenario, "--expected-failures"])
        .arg(&baseline)
        .arg("-o")
        .arg(&out_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the conformance CLI starts");
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("a client scenario finishes in 120 s")
        .expect("the conformance CLI runs");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn the_client_scenarios_pass_outside_their_baseline() {
    let mut failures = Vec::new();
    for scenario in SCENARIOS {
        let (ok, text) = run(scenario).await;
        println!("=== {scenario}\n{text}");
        if !ok {
            failures.push(format!("{scenario}:\n{text}"));
        }
    }
    assert!(
        failures.is_empty(),
        "client scenarios failing outside the baseline:\n{}",
        failures.join("\n")
    );
}
