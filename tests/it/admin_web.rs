//! The admin page (`/admin`) of `quiver serve` in a real browser: Debian's `chromium`,
//! driven over WebDriver (`chromium-driver`) by selenium from PyPI, beside the official
//! Python MCP client; both installed by `.ci/setup-peers`. Screenshots of each page go to
//! `target/admin-screenshots/`.

use crate::mcp_server::{Server, everything_bin, fresh_dir, quiver_binary, repo_root, run_script};

const TOKEN: &str = "admin-browser-token-0123456789";

/// Logs in (a wrong token refused first), sees the upstream connected, watches a call made
/// through MCP appear in the call log without a reload, follows an MCP session's working
/// set live, watches a CLI job run, approves a draft custom tool and sees the connected MCP
/// client get `list_changed`, disables and enables the upstream, reads the config's check
/// findings, checks every control's accessible name and the keyboard path to the main
/// actions, and checks that a forged CSRF token and a post from a foreign origin are
/// refused (`admin_browser.py` says each step).
#[tokio::test]
async fn the_admin_page_in_a_real_browser() {
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} is missing: run `bash .ci/setup-peers` (it installs Debian's chromium and chromium-driver)"
        );
    }
    let dir = fresh_dir();
    std::fs::write(
        dir.join("quiver.toml"),
        format!("[admin]\ntoken = \"{TOKEN}\"\n"),
    )
    .unwrap();
    let mcp = dir.join("mcp.json");
    std::fs::write(
        &mcp,
        serde_json::json!({"mcpServers": {"everything": {"command": everything_bin()}}})
            .to_string(),
    )
    .unwrap();
    let args = [
        "--mcp-config",
        mcp.to_str().expect("utf-8 path"),
        "serve",
        "--listen",
        "127.0.0.1:0",
    ];
    let mut server = Server::start_in(quiver_binary(), &args, &dir).await;
    let shots = repo_root().join("target/admin-screenshots");
    let binary = quiver_binary();
    run_script(
        "admin_browser.py",
        &[
            &server.url,
            binary.to_str().expect("utf-8 path"),
            dir.to_str().expect("utf-8 path"),
            TOKEN,
            shots.to_str().expect("utf-8 path"),
        ],
    )
    .await;
    assert!(server.terminate().await.success());
    for page in [
        "02-catalog",
        "06-log-live",
        "08-custom-draft",
        "08-custom-job",
        "10-csrf-refused",
        "12-upstreams-disabled",
        "12-upstreams-enabled",
        "13-sessions-live",
        "13-session",
        "14-config",
    ] {
        assert!(
            shots.join(format!("{page}.png")).exists(),
            "screenshot {page}"
        );
    }
}
