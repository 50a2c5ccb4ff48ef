//! The official MCP conformance suite's client scenarios against Quiver's upstream MCP client:
//! the suite starts a test server per scenario and runs `quiver-conformance-client` (see
//! `tests/bin/conformance_client.rs`) against it.

use std::path::PathBuf;

use crate::mcp_server::run_conformance;

/// The client scenarios issue 6 names.
const SCENARIOS: [&str; 4] = [
    "initialize",
    "tools_call",
    "sse-retry",
    "elicitation-sep1034-client-defaults",
];

async fn run(scenario: &str) -> (bool, String) {
    let wrapper = PathBuf::from(env!("CARGO_BIN_EXE_quiver-conformance-client"));
    let wrapper = wrapper.to_str().expect("a UTF-8 path");
    let out = run_conformance(
        &["client", "--command", wrapper, "--scenario", scenario],
        "client",
        scenario,
    )
    .await;
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
