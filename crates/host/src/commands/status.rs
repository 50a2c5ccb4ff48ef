//! `quiver status`: the store, the catalog's size, and each upstream MCP server's state.

use std::process::ExitCode;

use quiver_host::{App, Config};

pub(crate) fn run(
    app: &App,
    config: &Config,
    search: &quiver_host::SearchMode,
    store_down: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let config_store = config.store.path.as_path();
    if let Some(why) = store_down {
        // What follows was read beside an empty store: the upstreams are as this process
        // connects to them, whatever the database holds.
        say!(
            "store: {} (PostgreSQL, shared): cannot be opened: {why}",
            config.store.shown()
        );
    } else if config.store.url.is_some() && !app.store.exists() {
        say!(
            "store: {} (PostgreSQL, shared): no Quiver tables yet (`quiver serve`, `call` or `search` creates them)",
            app.store.location()
        );
    } else if config.store.url.is_some() {
        // The password masked: a status is pasted into tickets.
        say!("store: {} (PostgreSQL, shared)", app.store.location());
    } else if app.store.exists() {
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
    // What `serve` would do with this config's `[telemetry]` (checked when it loaded).
    match config.telemetry.export() {
        Ok(Some(export)) => say!(
            "traces: `quiver serve` exports them over OTLP ({}) to {}{}",
            match export.protocol {
                quiver_telemetry_otel::Protocol::Grpc => "gRPC",
                _ => "HTTP",
            },
            export.traces_url(),
            if config.telemetry.record_payloads {
                ", with arguments and results"
            } else {
                ""
            }
        ),
        _ => say!("traces: off (set [telemetry] otlp_endpoint to export them)"),
    }
    for line in last_reloads(config) {
        say!("{line}");
    }
    let servers = app.mcp.status();
    let per_session = app.mcp.per_session_servers();
    if servers.is_empty() && per_session.is_empty() {
        say!("no upstream MCP servers configured");
    }
    for s in servers {
        use quiver_mcp_adapter::ServerState as S;
        let last = s.diagnostics.last().cloned().unwrap_or_default();
        // connected; down, with why the last attempt failed (this command exits right
        // after, so its own next attempt would never come: `serve` is what retries);
        // failed for good, with the reason.
        let (state, detail) = match &s.state {
            S::Connected => ("connected", last),
            S::Connecting => ("connecting", last),
            S::Reconnecting => ("reconnecting", last),
            S::Down => (
                "down",
                format!("{last}; `quiver serve` keeps retrying it in the background"),
            ),
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
        if s.auth.per_user() {
            say!(
                "{:<20} acts for the user (auth = \"{}\"): its calls go over each signed-in user's own connection in `quiver serve`; this connection only lists its tools",
                "",
                s.auth.as_str()
            );
        }
    }
    for name in per_session {
        say!(
            "{name:<20} {:<12}           one process per MCP session of `quiver serve` (scope = \"session\")",
            "per session"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `quiver status` when the configuration file does not load: the error, and what each
/// running `quiver serve` on the store the file names did with it. Exit 2, as for any
/// configuration error.
pub(crate) fn unloadable(path: Option<&std::path::Path>, error: &anyhow::Error) -> ExitCode {
    let file = path.unwrap_or(std::path::Path::new("quiver.toml"));
    eprintln!("quiver: {error:#}");
    // The store's path as far as the file still says it (a type error elsewhere leaves the
    // TOML readable), against the file's directory as a loaded configuration resolves it.
    let store = std::fs::read_to_string(file)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .and_then(|t| {
            t.get("store")?
                .get("path")?
                .as_str()
                .map(std::path::PathBuf::from)
        })
        .unwrap_or_else(|| std::path::PathBuf::from("quiver.db"));
    let store = match file.parent() {
        Some(dir) if store.is_relative() && !dir.as_os_str().is_empty() => dir.join(store),
        _ => store,
    };
    let reports = quiver_host::reload::reports(&store);
    if reports.is_empty() {
        say!(
            "no `quiver serve` runs on {}; one started now would refuse this file",
            store.display()
        );
    }
    for (pid, report) in &reports {
        say!("{}", reload_line(report));
        say!("quiver serve pid {pid} keeps the configuration it runs until the file loads again");
    }
    ExitCode::from(2)
}

/// The last reload of each running `quiver serve` on this store, as its report says.
fn last_reloads(config: &Config) -> Vec<String> {
    quiver_host::reload::reports(&config.store.path)
        .iter()
        .map(|(_, report)| reload_line(report))
        .collect()
}

/// What `quiver status` says of a reload report.
fn reload_line(report: &serde_json::Value) -> String {
    let text = |k: &str| {
        report
            .get(k)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
    };
    let ago = report
        .get("at_unix")
        .and_then(serde_json::Value::as_u64)
        .and_then(|at| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|now| now.as_secs().saturating_sub(at))
        })
        .unwrap_or(0);
    let pid = report
        .get("pid")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    if text("trigger") == "start" {
        return format!(
            "quiver serve pid {pid}: running for {ago}s, not reloaded since it started"
        );
    }
    let head = format!(
        "last reload (quiver serve pid {pid}, {ago}s ago, {}):",
        text("trigger")
    );
    if report.get("ok").and_then(serde_json::Value::as_bool) != Some(true) {
        return format!(
            "{head} failed, the running configuration stays: {}",
            text("error")
        );
    }
    let list = |path: &[&str]| {
        let mut v = report;
        for k in path {
            v = v.get(k)?;
        }
        let names: Vec<&str> = v.as_array()?.iter().filter_map(|n| n.as_str()).collect();
        (!names.is_empty()).then(|| names.join(", "))
    };
    let mut parts = Vec::new();
    for (label, path) in [
        ("servers added", &["servers", "added"][..]),
        ("removed", &["servers", "removed"][..]),
        ("restarted", &["servers", "restarted"][..]),
        ("apply at restart", &["needs_restart"][..]),
        ("skill problems", &["skill_problems"][..]),
        ("catalog tools served", &["catalog", "served"][..]),
        ("catalog tools removed", &["catalog", "removed"][..]),
        ("catalog tools drafted", &["catalog", "drafted"][..]),
        ("catalog problems", &["catalog", "problems"][..]),
    ] {
        if let Some(names) = list(path) {
            parts.push(format!("{label}: {names}"));
        }
    }
    for (key, said) in [
        ("auth_changed", "inbound tokens replaced"),
        ("policy_changed", "policy rules replaced"),
        ("limits_changed", "limits changed"),
        ("surface_changed", "surface settings changed"),
        ("skills_changed", "skills read again"),
    ] {
        if report.get(key).and_then(serde_json::Value::as_bool) == Some(true) {
            parts.push(said.into());
        }
    }
    if parts.is_empty() {
        parts.push("nothing changed".into());
    }
    format!("{head} ok; {}", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// Every change a reload reports is said; "nothing changed" only when there is none.
    #[test]
    fn a_reload_line_names_every_change() {
        let line = super::reload_line(&json!({
            "ok": true, "trigger": "SIGHUP", "pid": 7, "at_unix": 0,
            "auth_changed": true, "limits_changed": true, "surface_changed": false,
            "catalog": {"served": ["lookup"], "removed": [], "drafted": [], "problems": []},
            "needs_restart": ["store"],
        }));
        assert!(line.contains("inbound tokens replaced"), "{line}");
        assert!(line.contains("limits changed"), "{line}");
        assert!(!line.contains("surface"), "{line}");
        assert!(line.contains("catalog tools served: lookup"), "{line}");
        assert!(line.contains("apply at restart: store"), "{line}");
        assert!(!line.contains("nothing changed"), "{line}");
        let quiet = super::reload_line(&json!({"ok": true, "trigger": "SIGHUP"}));
        assert!(quiet.ends_with("ok; nothing changed"), "{quiet}");
    }
}
