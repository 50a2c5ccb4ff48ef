//! Start-up progress while upstream MCP servers connect: a spinner naming the servers still
//! connecting when stderr is a terminal, plain log lines (one per server state change)
//! otherwise.

use std::{collections::HashMap, io::IsTerminal, time::Duration};

use indicatif::{ProgressBar, ProgressStyle};
use quiver_host::App;
use quiver_mcp_adapter::{ServerState, ServerStatus};

/// What a down server's start-up line says it will do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// `serve`: a down server is retried in the background for as long as it runs.
    Serving,
    /// A command that runs once: it goes on without a down server.
    Once,
}

fn state_text(s: &ServerStatus, progress: Progress) -> String {
    match &s.state {
        ServerState::Connected => format!("connected, {} tool(s)", s.tools.len()),
        ServerState::Rejected(why) => format!("failed: {why}"),
        ServerState::Down => {
            let what = if progress == Progress::Serving {
                "down, retrying in the background"
            } else {
                "down"
            };
            match s.diagnostics.last() {
                Some(last) => format!("{what} ({last})"),
                None => what.to_owned(),
            }
        }
        other => format!("{other:?}").to_lowercase(),
    }
}

/// What the spinner says: how many servers are settled, and which are still connecting.
fn summary(servers: &[ServerStatus]) -> String {
    let waiting: Vec<&str> = servers
        .iter()
        .filter(|s| matches!(s.state, ServerState::Connecting))
        .map(|s| s.name.as_str())
        .collect();
    if waiting.is_empty() {
        return format!("upstream MCP servers: all {} settled", servers.len());
    }
    format!(
        "connecting upstream MCP servers: {}/{} settled; waiting for {}",
        servers.len() - waiting.len(),
        servers.len(),
        waiting.join(", ")
    )
}

/// How long a command waits for a server, with no spinner, before it says it is waiting.
const SLOW_NOTICE: Duration = Duration::from_secs(3);

/// Waits for the upstreams as [`App::wait_for_upstreams`] does, showing progress. `quiet`
/// (`--quiet`) says only what needs attention: no spinner, and no line for a server that
/// connects.
pub(crate) async fn wait_for_upstreams(
    app: &App,
    progress: Progress,
    quiet: bool,
) -> anyhow::Result<()> {
    if app.mcp.status().is_empty() {
        return app.wait_for_upstreams(app.startup_wait).await;
    }
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    });
    let mut said: HashMap<String, String> = HashMap::new();
    let started = std::time::Instant::now();
    let mut noticed: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut report = |servers: Vec<ServerStatus>| {
        // Without a spinner, a wait for a slow server says so once it is long enough to
        // notice, rather than leaving the command silent until the wait ends.
        let slow = bar.is_none() && started.elapsed() >= SLOW_NOTICE;
        for s in &servers {
            if slow
                && !quiet
                && matches!(s.state, ServerState::Connecting)
                && noticed.insert(s.name.clone())
            {
                eprintln!(
                    "upstream MCP server {}: still connecting after {} s; waiting up to {} s (its `connect_timeout` bounds one attempt)",
                    s.name,
                    SLOW_NOTICE.as_secs(),
                    app.startup_wait.as_secs()
                );
            }
            let text = state_text(s, progress);
            if quiet && matches!(s.state, ServerState::Connected | ServerState::Connecting) {
                continue;
            }
            if said.get(&s.name) != Some(&text) {
                let line = format!("upstream MCP server {}: {text}", s.name);
                match &bar {
                    Some(bar) => bar.println(line),
                    None if !matches!(s.state, ServerState::Connecting) => eprintln!("{line}"),
                    None => {}
                }
                said.insert(s.name.clone(), text);
            }
        }
        if let Some(bar) = &bar {
            bar.set_message(summary(&servers));
        }
    };
    let wait = app.wait_for_upstreams(app.startup_wait);
    tokio::pin!(wait);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let result = loop {
        tokio::select! {
            r = &mut wait => break r,
            _ = tick.tick() => report(app.mcp.status()),
        }
    };
    let servers = app.mcp.status();
    report(servers.clone());
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // A server that neither connected nor failed within the wait (an upstream that does not
    // answer, or answers with what cannot be read) would otherwise go unmentioned.
    for s in servers
        .iter()
        .filter(|s| matches!(s.state, ServerState::Connecting))
    {
        eprintln!("{}", still_connecting(s, app.startup_wait, progress));
    }
    result
}

fn still_connecting(s: &ServerStatus, waited: Duration, progress: Progress) -> String {
    let last = s
        .diagnostics
        .last()
        .map(|d| format!(" (last: {d})"))
        .unwrap_or_default();
    let then = if progress == Progress::Serving {
        " (it keeps trying in the background; `quiver status` shows its state)"
    } else {
        ""
    };
    format!(
        "upstream MCP server {}: still connecting after {} s{last}; going on without it{then}",
        s.name,
        waited.as_secs()
    )
}
