//! `quiver status`: the store, the catalog's size, and each upstream MCP server's state.

use std::process::ExitCode;

use quiver_host::{App, Config};

pub(crate) fn run(
    app: &App,
    config: &Config,
    search: &quiver_host::SearchMode,
) -> anyhow::Result<ExitCode> {
    let config_store = config.store.path.as_path();
    if app.store.exists() {
        say!("store: {}", config_store.display());
    } else if config.store.missing_directory().is_some() {
        say!(
            "store: {} (cannot be created: its directory does not exist)",
            config_store.display()
        );
    } else {
        say!(
            "store: {} (not created yet: `quiver serve`, `call` or `search` creates it)",
            config_store.display()
        );
    }
    say!("catalog: {} tool(s)", app.catalog.len());
    say!("search: {search}");
    let servers = app.mcp.status();
    if servers.is_empty() {
        say!("no upstream MCP servers configured");
    }
    for s in servers {
        use quiver_mcp_adapter::ServerState as S;
        let last = s.diagnostics.last().cloned().unwrap_or_default();
        // connected; retrying, with the next attempt and why the last one failed;
        // failed for good, with the reason.
        let (state, detail) = match &s.state {
            S::Connected => ("connected", last),
            S::Connecting => ("connecting", last),
            S::Reconnecting => ("reconnecting", last),
            S::Down => {
                let next = match s.next_attempt {
                    Some(at) => format!(
                        "next attempt in {}s",
                        at.duration_since(std::time::SystemTime::now())
                            .unwrap_or_default()
                            .as_secs_f64()
                            .ceil()
                    ),
                    None => "attempt under way".to_owned(),
                };
                ("retrying", format!("{next}; last: {last}"))
            }
            S::Rejected(why) => ("failed", why.clone()),
            S::Closed => ("closed", last),
            _ => ("unknown", last),
        };
        say!(
            "{:<20} {:<12} {:>4} tool(s)  {detail}",
            s.name,
            state,
            s.tools.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
