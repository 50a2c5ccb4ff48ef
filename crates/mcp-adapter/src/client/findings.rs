//! What `quiver check` says of the MCP servers and of the inbound tokens that reach them:
//! servers that cannot start or are not connected, `allow_tools`/`deny_tools` entries a
//! server does not list, tokens that reach nothing, and which stored definitions of
//! upstream tools can be compared now.

use quiver_contract::{Capabilities, Finding, Mode, ToolSpec, pattern_matches};
use quiver_registry::{
    Catalog,
    store::{ToolDefinition, ToolType},
    suggestion,
};
use quiver_surface::Surface;

use super::{RESOURCE_TOOLS, RESOURCE_TOOLS_FAMILY, ServerConfig, ServerState, ServerStatus};
use crate::InboundToken;

/// Inbound bearer secrets shorter than this are a note.
const MIN_SECRET_LEN: usize = 16;

/// The servers that cannot serve tools: a stdio server whose command cannot be started is a
/// configuration fault, required or not (a required one also fails the readiness check);
/// then each server that started but is not connected (it exits at start, hangs, refuses
/// Quiver), with its last diagnostic, which says why.
pub fn connection_findings(statuses: &[ServerStatus]) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in statuses {
        let Some(why) = &s.cannot_start else {
            continue;
        };
        let why = why.strip_prefix("cannot start ").unwrap_or(why);
        out.push(Finding::error(format!(
            "mcp server {}: [cannot start] {why}; install it, or fix `command` (and `cwd`) in its configuration",
            s.name
        )));
    }
    for s in statuses.iter().filter(|s| {
        s.cannot_start.is_none() && !matches!(s.state, ServerState::Connected | ServerState::Closed)
    }) {
        let why = s
            .diagnostics
            .iter()
            .rev()
            .find(|l| l.contains("failed") || l.contains("rejected"))
            .or(s.diagnostics.last())
            .cloned()
            .unwrap_or_else(|| format!("{:?}", s.state).to_lowercase());
        // A reason that already says what to fix is not told it twice.
        let fix = match why.ends_with("fix the server") {
            true => "",
            false => "; fix the server or its configuration",
        };
        out.push(Finding::error(format!(
            "mcp server {}: [not connected] {why}{fix} (`quiver status` shows its state)",
            s.name
        )));
    }
    out
}

/// Per-session servers whose command cannot be found: no session has started one yet, so
/// the command is looked for as starting it would (a path, against `cwd` when relative; a
/// bare name on `PATH`), and one not there is a configuration fault as for a shared server.
pub fn session_command_findings(configured: &[ServerConfig]) -> Vec<Finding> {
    configured
        .iter()
        .filter(|s| s.scope == super::ServerScope::Session)
        .filter_map(|s| {
            let command = s.command.as_deref()?;
            (!command_found(command, s.cwd.as_deref())).then(|| {
                Finding::error(format!(
                    "mcp server {}: [cannot start] `{command}` is not found (a per-session server starts with each session that needs it, so every session would go without its tools); install it, or fix `command` (and `cwd`) in its configuration",
                    s.name
                ))
            })
        })
        .collect()
}

/// Whether `command` names a file a process could be started from.
fn command_found(command: &str, cwd: Option<&std::path::Path>) -> bool {
    let path = std::path::Path::new(command);
    if command.contains(std::path::MAIN_SEPARATOR) || command.contains('/') {
        let path = match cwd {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_owned(),
        };
        return path.is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(command).is_file()))
}

/// For a tool name, the server it belongs to when that server is not connected now (its
/// tools are named `mcp__<prefix>__<tool>`, the prefix as `configured` sets it, else the
/// server's name): such a name cannot be checked against the catalog.
pub fn unconnected_server_of(
    statuses: &[ServerStatus],
    configured: &[ServerConfig],
) -> impl Fn(&str) -> Option<String> + use<> {
    let unconnected: Vec<(String, String)> = statuses
        .iter()
        .filter(|s| !matches!(s.state, ServerState::Connected))
        .map(|s| {
            let prefix = configured
                .iter()
                .find(|c| c.name == s.name)
                .and_then(|c| c.prefix.clone())
                .unwrap_or_else(|| s.name.clone());
            (s.name.clone(), prefix)
        })
        .collect();
    move |tool: &str| {
        unconnected
            .iter()
            .find(|(_, prefix)| tool.starts_with(&format!("mcp__{prefix}__")))
            .map(|(server, _)| server.clone())
    }
}

/// A server's `allow_tools` and `deny_tools` take the names the server itself lists: one it
/// does not list is unmatched (an allow list of nothing but typos hides every tool of the
/// server; a typo'd deny lets the tool through). A server that is not connected cannot be
/// checked: a note.
pub fn server_list_findings(
    configured: &[ServerConfig],
    statuses: &[ServerStatus],
) -> Vec<Finding> {
    let mut out = Vec::new();
    for server in configured {
        let keys = server
            .allow_tools
            .iter()
            .flatten()
            .map(|n| ("allow_tools", n))
            .chain(server.deny_tools.iter().map(|n| ("deny_tools", n)));
        let listed = statuses
            .iter()
            .find(|s| s.name == server.name)
            .filter(|s| matches!(s.state, ServerState::Connected))
            .map(|s| &s.listed);
        for (key, name) in keys {
            let at = format!("mcp.servers[{}].{key}", server.name);
            let Some(listed) = listed else {
                out.push(Finding::note(format!(
                    "{at}: [note] `{name}` not checked: server {} is not connected",
                    server.name
                )));
                continue;
            };
            if listed.contains(name) {
                continue;
            }
            let prefix = server.prefix.as_deref().unwrap_or(&server.name);
            let note = match name.strip_prefix(&format!("mcp__{prefix}__")) {
                Some(bare) => {
                    format!("; this key takes the server's own names: `{bare}`, not `{name}`")
                }
                None => suggestion(name, listed.iter().map(String::as_str)),
            };
            out.push(Finding::unmatched(format!(
                "{at}: [unmatched] `{name}` is not a tool server {} lists{note}",
                server.name
            )));
        }
    }
    out
}

/// What each inbound token reaches, in token order: a secret short enough to guess; an
/// `allowed_tools` without `tool_search` (its callers see only the round's tools that the
/// list allows, composed on `surface`, and can find nothing else); the resource meta-tools
/// allowed with no server to read; and each `allowed_servers` entry that names none of the
/// servers of `statuses` (the configuration's and the `--mcp-config` files'), which gives
/// the token nothing.
pub fn token_findings(
    tokens: &[InboundToken],
    statuses: &[ServerStatus],
    surface: &Surface,
) -> Vec<Finding> {
    let servers: Vec<&str> = statuses.iter().map(|s| s.name.as_str()).collect();
    let mut out = Vec::new();
    for t in tokens {
        let secret = t.token.chars().count();
        if secret < MIN_SECRET_LEN {
            out.push(Finding::note(format!(
                "auth.tokens[{}]: [note] its secret is {secret} character(s) long, short enough to guess; use at least {MIN_SECRET_LEN} random ones (e.g. `openssl rand -hex 32`, passed as `${{env:NAME}}`)",
                t.name
            )));
        }
        if let Some(patterns) = &t.allowed_tools
            && !patterns.iter().any(|p| pattern_matches(p, "tool_search"))
        {
            let caps = Capabilities::all().with_allowed_tools(patterns.clone());
            let shown: Vec<String> = surface
                .compose(&format!("check:{}", t.name), Mode::Chat, &caps)
                .map(|c| c.names().iter().map(|n| (*n).to_owned()).collect())
                .unwrap_or_default();
            let listed = if shown.is_empty() {
                "none now".to_owned()
            } else {
                format!("now {}", shown.join(", "))
            };
            out.push(Finding::note(format!(
                "auth.tokens[{}]: [note] allowed_tools does not allow tool_search, so its callers cannot find tools: they see only the tools it names one by one and the resident floor's tools its patterns allow ({listed}); allow tool_search, or name the tools it needs",
                t.name
            )));
        }
        let meta = t
            .allowed_tools
            .iter()
            .flatten()
            .any(|p| RESOURCE_TOOLS.iter().any(|m| pattern_matches(p, m)));
        if meta && t.content_servers().is_some_and(|s| s.is_empty()) {
            out.push(Finding::note(format!(
                "auth.tokens[{}]: [note] allowed_tools lets it call the resource meta-tools, but without allowed_servers it reaches no server's resources; name the servers in allowed_servers",
                t.name
            )));
        }
        for name in t.allowed_servers.iter().flatten() {
            if servers.iter().any(|s| pattern_matches(name, s)) {
                continue;
            }
            let at = format!("auth.tokens[{}].allowed_servers", t.name);
            if name.contains('*') {
                out.push(Finding::note(format!(
                    "{at}: [note] pattern `{name}` matches no configured MCP server"
                )));
                continue;
            }
            out.push(Finding::unmatched(format!(
                "{at}: [unmatched] `{name}` is not a configured MCP server{}",
                suggestion(name, servers.iter().copied())
            )));
        }
    }
    out
}

/// Which of the stored definitions `defs` (those not deleted) can be compared with the
/// catalog now, and notes on those that cannot: the tools of a server that is not
/// connected (left out, not reported as removed), and the resource meta-tools, Quiver's
/// own but recorded like an upstream's tools, which are listed only while a connected
/// server offers resources (one missing now is not a removed tool).
pub fn comparable_definitions(
    defs: &[ToolDefinition],
    statuses: &[ServerStatus],
    catalog: &Catalog,
) -> (Vec<Finding>, Vec<ToolSpec>) {
    let down: Vec<(&str, String)> = statuses
        .iter()
        .filter(|s| !matches!(s.state, ServerState::Connected))
        .map(|s| (s.name.as_str(), format!("{:?}", s.state).to_lowercase()))
        .collect();
    let unchecked = |d: &ToolDefinition| {
        d.tool_type == ToolType::Mcp
            && down
                .iter()
                .any(|(name, _)| d.implementation.starts_with(&format!("mcp:{name}:")))
    };
    let meta_absent = |d: &ToolDefinition| {
        RESOURCE_TOOLS.contains(&d.name.as_str())
            && d.implementation == format!("{RESOURCE_TOOLS_FAMILY}:{}", d.name)
            && catalog.lookup(&d.name).is_none()
    };
    let live = || defs.iter().filter(|d| d.deleted_at.is_none());
    let mut notes = Vec::new();
    let absent: Vec<&str> = live()
        .filter(|d| meta_absent(d))
        .map(|d| d.name.as_str())
        .collect();
    if !absent.is_empty() {
        notes.push(Finding::note(format!(
            "{}: [note] not checked: these tools are listed only while a connected MCP server offers resources",
            absent.join(", ")
        )));
    }
    for (name, state) in &down {
        let n = live()
            .filter(|d| unchecked(d) && d.implementation.starts_with(&format!("mcp:{name}:")))
            .count();
        if n > 0 {
            notes.push(Finding::note(format!(
                "{name}: [note] {n} stored tool(s) not checked: the server is {state}"
            )));
        }
    }
    // Only what was served can break a caller: a draft, a version under test or rejected,
    // and a disabled tool, never were (or are not now).
    let served = |d: &ToolDefinition| d.status == quiver_contract::Lifecycle::Approved && d.enabled;
    let comparable = live()
        .filter(|d| served(d) && !unchecked(d) && !meta_absent(d))
        .map(ToolDefinition::to_spec)
        .collect();
    (notes, comparable)
}
