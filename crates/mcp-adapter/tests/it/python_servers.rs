//! mcp-server-time and mcp-server-git (PyPI) over stdio.

use std::time::Duration;

use quiver_mcp_adapter::ServerConfig;
use serde_json::json;

use crate::{call, close_and_check, python, start, text_of, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_and_git() {
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let (catalog, client) = start(
        &[
            ServerConfig::stdio(
                "time",
                python(),
                vec!["-m".into(), "mcp_server_time".into()],
            )
            .required(),
            ServerConfig::stdio(
                "git",
                python(),
                vec![
                    "-m".into(),
                    "mcp_server_git".into(),
                    "--repository".into(),
                    repo.display().to_string(),
                ],
            )
            .required(),
        ],
        Default::default(),
    );
    within(
        Duration::from_secs(90),
        client.wait_ready(Duration::from_secs(90)),
    )
    .await
    .expect("time and git connect");
    let names = catalog.names();
    assert!(
        names.contains(&"mcp__time__get_current_time".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"mcp__git__git_status".to_owned()),
        "{names:?}"
    );

    let env = call(
        &catalog,
        "mcp__time__get_current_time",
        json!({"timezone": "UTC"}),
    )
    .await;
    assert!(env.is_ok(), "{env:?}");
    assert!(text_of(&env).contains("UTC"), "{env:?}");

    let env = call(
        &catalog,
        "mcp__git__git_status",
        json!({"repo_path": repo.display().to_string()}),
    )
    .await;
    assert!(env.is_ok(), "{env:?}");
    assert!(text_of(&env).to_lowercase().contains("branch"), "{env:?}");

    // An upstream error is an Err envelope, not a drop.
    let bad = call(
        &catalog,
        "mcp__time__get_current_time",
        json!({"timezone": "Nowhere/Atlantis"}),
    )
    .await;
    assert!(!bad.is_ok(), "{bad:?}");
    assert_eq!(client.server_status("time").unwrap().counters.drops, 0);
    close_and_check(&client).await;
}
