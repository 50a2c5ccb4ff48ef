//! `quiver`: the tool runtime's command line.

mod startup;

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use quiver_contract::{CallContext, Capabilities, Envelope, Mode, RenderOptions, render};
use quiver_host::{App, Config, StoreAccess, ToolFormat, format_tools, provider_name_warnings};
use quiver_registry::CallFilter;
use quiver_surface::{FloorLoad, FloorSource};

/// `println!` that does not panic when stdout is gone (`quiver log | head -1`): what can
/// no longer be written is dropped, and the command ends as it would have.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`say!`] without the newline.
fn say_raw(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().write_all(text.as_bytes());
}

/// Quiver: one catalog, one dispatch pipeline, every tool an agent can call.
///
/// Every command goes through the same assembled catalog and dispatcher.
#[derive(Debug, Parser)]
#[command(name = "quiver", version)]
struct Cli {
    /// The configuration file (default: ./quiver.toml when it exists, else built-in defaults).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// An `mcpServers` JSON file as Claude Desktop, Cursor or VS Code use it; its servers
    /// join those of the config. Repeatable.
    #[arg(long = "mcp-config", global = true, value_name = "FILE")]
    mcp_config: Vec<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the tools a session sees: its composed surface (resident floor, system tools,
    /// working set), as the model receives it.
    ///
    /// The working set is the one stored for the session. A running `quiver serve` holds
    /// its sessions in memory and writes each change to the store, but does not read back
    /// what another process (`quiver search --session S`) stored for a session it holds:
    /// for a session `serve` is using, its own `tools/list` is the truth.
    ///
    /// Example: `quiver tools --format openai` prints the `tools` array for the OpenAI API.
    Tools {
        /// The session mode: chat, agentic, delegate or plan (default: the token's, else
        /// chat).
        #[arg(long, value_parser = parse_mode)]
        mode: Option<Mode>,
        /// The session (conversation) key.
        #[arg(long, default_value = "cli")]
        session: String,
        /// Act as this configured inbound token (its `name`): its tools, mode and tenant,
        /// as `quiver serve` gives them to a client presenting it.
        #[arg(long, value_name = "NAME")]
        token: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: ToolFormat,
    },
    /// Search the catalog the way the model does, through the `tool_search` tool.
    ///
    /// It is a real `tool_search` call: the tools found are paged into the session's
    /// working set (stored, so later `tools --session S` and `call --session S` see them)
    /// and the call is recorded in the execution log (`quiver log`).
    ///
    /// Example: `quiver search "current time in a timezone" --limit 5`.
    Search {
        /// What you need, in words.
        query: String,
        /// How many tools to return (1 to 50; default `[surface] search_default_limit`, 8
        /// unless configured, as for the model).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=50))]
        limit: Option<u32>,
        /// The session (conversation) whose working set receives the tools found.
        #[arg(long, default_value = "cli")]
        session: String,
        /// The session mode: chat, agentic, delegate or plan (default: the token's, else
        /// chat). Only tools the mode offers are found.
        #[arg(long, value_parser = parse_mode)]
        mode: Option<Mode>,
        /// Act as this configured inbound token (its `name`): only what it may call is found.
        #[arg(long, value_name = "NAME")]
        token: Option<String>,
    },
    /// Validate the configuration and lint every tool definition (September guide rules:
    /// typed and described properties, enums for closed sets, required fields listed, a
    /// description that says when to use the tool).
    ///
    /// Exits 1 when anything is found: a lint finding, a tool not registered, a breaking
    /// change, or a configured tool name that matches no tool (`[unmatched]`, also a
    /// server's `allow_tools`/`deny_tools` entry the server does not list; one under the
    /// prefix of an upstream that is not connected, and a `*` pattern that matches nothing
    /// yet, are notes), a tool whose definition is too large to be shown (`[too large]`), a
    /// skill longer than a result may be (`[too long]`),
    /// an MCP server whose command cannot be started (`[cannot start]`), or an MCP server
    /// that is not connected once start-up is over (`[not connected]`, with why). Exits 2 when the configuration itself is wrong.
    Check {
        /// Also report breaking schema changes against the definitions stored in this
        /// database: removed fields, renamed or removed tools, type changes, new required
        /// fields without a default.
        #[arg(long, value_name = "DB")]
        against: Option<std::path::PathBuf>,
    },
    /// Show the upstream MCP servers (connected, retrying, failed with the reason), their
    /// tool counts, and the store.
    ///
    /// This process connects to the servers itself: it shows what they do now, not the
    /// history of a running `quiver serve`'s connections (a crash and restart there). For a
    /// running server, its `GET /readyz` says whether its required upstreams are up, and its
    /// log has each connect, drop and restart.
    ///
    /// Exits 1 when a `required` server is not ready (the table is shown all the same).
    Status,
    /// Show the resident floor: the anchors, then the tools used most (ranked from the
    /// execution log's usage, weighted 3.0 / 1.0 / 0.2 for calls under 30 days, under 90
    /// days and older), or the static fallback when there is no usage.
    ///
    /// The ranking is stored (`tool_surface_tier0_v1`) and shared by every `quiver` on the
    /// same store; `quiver serve` re-reads it every `floor_cache_ttl_secs` and derives and
    /// stores it again once it is older than `floor_max_age_secs` (an empty one, a new
    /// install's, after ten `floor_cache_ttl_secs`). Other commands read it, and derive it
    /// in memory without storing it when it is due. Example: `quiver floor --rederive`.
    Floor {
        /// Derive the ranking from usage now and store it (running servers pick it up
        /// within `floor_cache_ttl_secs`).
        #[arg(long)]
        rederive: bool,
    },
    /// Show recent tool calls from the execution log, newest first.
    ///
    /// Example: `quiver log --outcome err --limit 20`.
    Log {
        /// Only calls to this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Only calls in this session.
        #[arg(long)]
        session: Option<String>,
        /// Only calls with this outcome.
        #[arg(long, value_parser = ["ok", "hint", "err"])]
        outcome: Option<String>,
        /// How many calls to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON object per call instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure tool-search quality on a benchmark set and print
    /// `{queries, hit@1, recall@5, recall@10, ndcg@10}` in percent.
    ///
    /// Both files are JSON Lines (one object a line; blank lines skipped). The tools are
    /// indexed as `tool_search` indexes the catalog, each query is searched, and its top 10
    /// are scored against its `gold`: a list with one inner list per tool the query needs,
    /// where any name in an inner list counts as finding that tool. hit@1: the first result
    /// is a needed tool; recall@k: the share of needed tools in the top k; ndcg@10: binary
    /// relevance, one credit per needed tool.
    ///
    /// Example query line:
    /// `{"id": "q1", "query": "make a PDF report", "gold": [["docs__create"], ["pdf__convert", "office__to_pdf"]]}`
    BenchSearch {
        /// Tools, one `{"name": ..., "description": ..., "input_schema": {...}}` a line
        /// (`description` and `input_schema` optional).
        #[arg(long)]
        tools: std::path::PathBuf,
        /// Queries, one `{"query": ..., "gold": [[name, ...], ...]}` a line (other keys,
        /// such as `id`, are ignored).
        #[arg(long)]
        queries: std::path::PathBuf,
    },
    /// Serve MCP: streamable HTTP on 127.0.0.1:7345 (the URL is printed on stdout), or
    /// stdio for desktop clients.
    ///
    /// Example: `quiver serve --listen 127.0.0.1:0` picks a free port.
    Serve {
        /// The address to listen on: IP:PORT (`127.0.0.1:7345`, `[::1]:7345`) or
        /// HOST:PORT (`localhost:7345`, resolved now; its IPv4 address first).
        #[arg(long, default_value = quiver_host::serve::DEFAULT_LISTEN, value_parser = parse_listen)]
        listen: Listen,
        /// Serve on stdin and stdout instead of HTTP.
        #[arg(long, conflicts_with = "listen")]
        stdio: bool,
        /// The session mode of clients whose token names none: chat, agentic, delegate or plan.
        #[arg(long, default_value = "chat", value_parser = parse_mode)]
        mode: Mode,
        /// Also accept this `Host` (`name:port`, or `name` for any port), e.g. the public name of a
        /// non-loopback listener. The listen address itself is always accepted.
        #[arg(long = "allow-host", value_name = "HOST", value_parser = parse_allow_host)]
        allow_hosts: Vec<String>,
    },
    /// Call one tool through the full pipeline and print the rendered result.
    ///
    /// Exits 0 for an Ok or a Hint, 1 for an Err, and 2 when the call cannot be made: the JSON does not parse, the configuration is invalid, or a `required` MCP server is not ready (one that Quiver cannot work without: the call waits for it through the start-up wait, whatever server its tool is on). Example: `quiver call tool_search '{"query": "time"}'`.
    Call {
        /// The tool name.
        name: String,
        /// The arguments, as one JSON object.
        #[arg(default_value = "{}")]
        json: String,
        /// The session (conversation) key. The call is one round of it, as a `tools/call`
        /// is in `quiver serve`: working-set tools idle too long leave it.
        #[arg(long, default_value = "cli")]
        session: String,
        /// The session mode: chat, agentic, delegate or plan (default: the token's, else
        /// chat). A tool the mode does not offer is refused, as `quiver serve` refuses it.
        #[arg(long, value_parser = parse_mode)]
        mode: Option<Mode>,
        /// Act as this configured inbound token (its `name`): its tools, mode, tenant and
        /// the deny rules for it.
        #[arg(long, value_name = "NAME")]
        token: Option<String>,
    },
}

/// `serve --listen`: the address, and the host name it was given as (accepted as `Host`).
#[derive(Debug, Clone)]
struct Listen {
    addr: std::net::SocketAddr,
    name: Option<String>,
}

/// A `Host` to accept: `name`, `name:port` or `name:*` (any port); an IPv6 address in
/// brackets. A URL, a path or a name with other characters would never match a `Host`
/// header, so it is refused here rather than accepted and never used.
fn parse_allow_host(s: &str) -> Result<String, String> {
    const FORM: &str = "give the Host clients send: `name:port`, or `name` for any port (e.g. `quiver.example:7345`, `quiver.example`, `[::1]:7345`)";
    if let Some((scheme, rest)) = s.split_once("://") {
        let host = rest.split('/').next().unwrap_or("");
        return Err(format!(
            "`{s}` is a URL, not a Host: leave out `{scheme}://` (and any path), e.g. `{host}`"
        ));
    }
    let (name, port) = match s.strip_prefix('[') {
        Some(v6) => {
            let Some((addr, rest)) = v6.split_once(']') else {
                return Err(format!("`{s}` has no closing `]`: {FORM}"));
            };
            if addr.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("`[{addr}]` is not an IPv6 address: {FORM}"));
            }
            match rest {
                "" => (addr, None),
                _ => match rest.strip_prefix(':') {
                    Some(port) => (addr, Some(port)),
                    None => {
                        return Err(format!("`{s}`: after `]` comes `:port` or nothing; {FORM}"));
                    }
                },
            }
        }
        None => match s.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (s, None),
        },
    };
    if name.is_empty() {
        return Err(format!("`{s}` names no host: {FORM}"));
    }
    if !s.starts_with('[')
        && !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err(format!(
            "`{name}` is not a host name (letters, digits, `-` and `.`): {FORM}"
        ));
    }
    if let Some(port) = port
        && port != "*"
        && port.parse::<u16>().is_err()
    {
        return Err(format!(
            "`{port}` in `{s}` is not a port (0 to 65535, or `*` for any): {FORM}"
        ));
    }
    Ok(s.to_owned())
}

fn parse_listen(s: &str) -> Result<Listen, String> {
    if let Ok(addr) = s.parse() {
        return Ok(Listen { addr, name: None });
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!(
            "`{s}` has no port: give HOST:PORT or IP:PORT, e.g. 127.0.0.1:7345 (port 0 picks a free one)"
        ));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "`{port}` in `{s}` is not a port (0 to 65535): give HOST:PORT or IP:PORT, e.g. 127.0.0.1:7345"
        ));
    }
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(s)
        .map_err(|e| {
            format!("cannot resolve the host `{host}`: {e}; give an IP address instead, e.g. 127.0.0.1:{port}")
        })?
        .collect();
    let addr = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("the host `{host}` resolves to no address; give an IP address instead, e.g. 127.0.0.1:{port}"))?;
    Ok(Listen {
        addr,
        name: Some(host.to_owned()),
    })
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::parse(s).ok_or_else(|| format!("unknown mode `{s}`: use chat, agentic, delegate or plan"))
}

/// Who a command-line command acts as: with `--token NAME`, that configured inbound token
/// (its tools, mode and tenant, and the deny rules for it, as `quiver serve` gives them to
/// a client presenting it); without, every tool less those a deny rule refuses everyone
/// (left out of suggestions, as `serve` leaves them out).
struct Caller {
    /// The working-set key: the session given, or, as a token, the key `quiver serve`
    /// gives that token's conversation of that name (`conv:TOKEN:SESSION`).
    session: String,
    mode: Mode,
    capabilities: std::sync::Arc<Capabilities>,
    principal: Option<String>,
    tenant: Option<String>,
}

impl Caller {
    fn of(
        config: &Config,
        token: Option<&str>,
        mode: Option<Mode>,
        session: &str,
    ) -> anyhow::Result<Caller> {
        let Some(name) = token else {
            let denied: Vec<String> = config
                .always_denied(None, None)
                .map(|r| r.tool.clone())
                .collect();
            return Ok(Caller {
                session: session.to_owned(),
                mode: mode.unwrap_or_default(),
                capabilities: std::sync::Arc::new(Capabilities::all().with_denied_tools(denied)),
                principal: None,
                tenant: None,
            });
        };
        let auth = config.inbound_auth();
        let Some(t) = auth.tokens.iter().find(|t| t.name == name) else {
            let names: Vec<&str> = auth.tokens.iter().map(|t| t.name.as_str()).collect();
            anyhow::bail!(
                "no inbound token is named `{name}`; {}",
                if names.is_empty() {
                    "the configuration has none ([[auth.tokens]])".to_owned()
                } else {
                    format!("the configured ones are: {}", names.join(", "))
                }
            );
        };
        // `serve` gives a token its own mode whatever the server's default: so does this.
        if let (Some(own), Some(asked)) = (t.mode, mode)
            && own != asked
        {
            anyhow::bail!(
                "the token `{name}` has mode {}, which `quiver serve` gives every request it makes: --mode {} cannot change it",
                own.as_str(),
                asked.as_str()
            );
        }
        Ok(Caller {
            session: format!("conv:{name}:{session}"),
            mode: t.mode.or(mode).unwrap_or_default(),
            capabilities: std::sync::Arc::new(t.capabilities()),
            principal: Some(t.name.clone()),
            tenant: t.tenant.clone(),
        })
    }

    /// The context of one call in the caller's session.
    fn context(&self) -> CallContext {
        let mut ctx = CallContext::for_session(self.session.as_str());
        ctx.capabilities = self.capabilities.clone();
        ctx.principal = self.principal.as_deref().map(Into::into);
        ctx.tenant = self.tenant.as_deref().map(Into::into);
        ctx
    }
}

fn exit_for(envelope: &Envelope) -> ExitCode {
    if envelope.is_err() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Applies `[store] retention_days`: deletes execution-log rows older than that many days,
/// and the stored working sets of sessions idle that long. Only the commands that write the
/// store (`serve`, `call`, `search`) do it; the reading ones (`log`, `tools`, `check`,
/// `status`) leave the store as it is. Unset keeps everything.
async fn apply_retention(app: &App, config: &Config) -> anyhow::Result<()> {
    let Some(days) = config.store.retention_days else {
        return Ok(());
    };
    let Some(cutoff) = std::time::SystemTime::now()
        .checked_sub(std::time::Duration::from_secs(u64::from(days) * 86_400))
    else {
        return Ok(());
    };
    let purged = app
        .call_log()
        .purge_calls_before(cutoff)
        .await
        .context("applying log retention")?;
    if purged > 0 {
        tracing::info!(purged, days, "deleted execution-log rows past retention");
    }
    let sessions = app
        .store
        .purge_sessions_idle_since(cutoff)
        .await
        .context("applying retention to stored sessions")?;
    if sessions > 0 {
        tracing::info!(sessions, days, "deleted session state idle past retention");
    }
    Ok(())
}

fn ms(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// Milliseconds with microsecond precision, as JSON shows them (`0.045`, not
/// `0.045000000000000005`).
fn whole_us_ms(d: std::time::Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// `quiver log`: reads the execution log without opening the store for writing, so it
/// creates nothing at a mistyped path and works on a store the operator may only read.
async fn log_command(
    config: &Config,
    tool: Option<String>,
    session: Option<String>,
    outcome: Option<String>,
    limit: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut filter = CallFilter::recent(limit);
    if let Some(t) = tool {
        filter = filter.tool(t);
    }
    if let Some(s) = session {
        filter = filter.session(s);
    }
    if let Some(o) = outcome {
        filter = filter.kind(o);
    }
    if let Some(problem) = config.store.path_problem() {
        anyhow::bail!("reading the execution log: {problem}");
    }
    let path = config.store.path.clone();
    let shown = path.display().to_string();
    let calls = tokio::task::spawn_blocking(move || quiver_store_sqlite::read_calls(&path, filter))
                .await
                .context("reading the execution log")?
                .map_err(|e| match e {
                    quiver_registry::StoreError::Unavailable { ref cause, .. } if cause == "no such database" => anyhow::anyhow!(
                        "there is no store at {shown}: no call has been logged there (`quiver serve`, `call` and `search` create it); check `[store] path` in the config"
                    ),
                    other => anyhow::Error::new(other).context("reading the execution log"),
                })?;
    if json {
        for c in &calls {
            let row = serde_json::json!({
                "call_id": c.call_id, "tool": c.tool_name, "session": c.session, "tenant": c.tenant,
                "principal": c.principal,
                "outcome": c.kind, "hint_kind": c.hint_kind, "err_kind": c.err_kind.as_ref().map(quiver_contract::ErrKind::as_str),
                "input": c.input, "reasoning": c.reasoning, "args_hash": c.args_hash,
                "summary": c.output_summary, "queued_ms": whole_us_ms(c.queued),
                "took_ms": whole_us_ms(c.took),
                "at": c.at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            });
            say!("{row}");
        }
    } else {
        // Columns as wide as their longest entry (MCP tool names and `mcp:<id>`
        // sessions are long), within a cap.
        let width = |texts: &mut dyn Iterator<Item = usize>, least: usize| {
            texts.fold(least, usize::max).min(64)
        };
        let tool_w = width(
            &mut calls
                .iter()
                .map(|c| quiver_contract::printable(&c.tool_name).chars().count()),
            4,
        );
        let session_w = width(
            &mut calls.iter().map(|c| {
                quiver_contract::printable(c.session.as_deref().unwrap_or("-"))
                    .chars()
                    .count()
            }),
            7,
        );
        say!(
            "{:<19} {:<tool_w$} {:<7} {:<session_w$} {:>9}  SUMMARY",
            "AT (UTC)",
            "TOOL",
            "OUTCOME",
            "SESSION",
            "TOOK_MS"
        );
        for c in &calls {
            let summary: String = c
                .output_summary
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(60)
                .collect();
            // Escaped: a row's texts come from clients and tools, and a newline
            // or a terminal escape in them must not forge rows or drive the
            // operator's terminal.
            let at = chrono::DateTime::<chrono::Utc>::from(c.at).format("%Y-%m-%d %H:%M:%S");
            say!(
                "{at:<19} {:<tool_w$} {:<7} {:<session_w$} {:>9}  {}",
                quiver_contract::printable(&c.tool_name),
                c.kind,
                quiver_contract::printable(c.session.as_deref().unwrap_or("-")),
                ms(c.took),
                quiver_contract::printable(&summary)
            );
        }
        say!("{} call(s)", calls.len());
    }
    Ok(ExitCode::SUCCESS)
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::BenchSearch { tools, queries } = &cli.command {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let report = quiver_surface::search::evaluate(&read(tools)?, &read(queries)?)
            .map_err(|e| anyhow::anyhow!("bench-search: {e}"))?;
        say!("{}", serde_json::to_string(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let (config, _source) = Config::load(cli.config.as_deref())?;
    if let Command::Log {
        tool,
        session,
        outcome,
        limit,
        json,
    } = cli.command
    {
        return log_command(&config, tool, session, outcome, limit, json).await;
    }
    // A token that is not configured (or a mode it does not have) is said at once, before
    // the upstreams are waited for.
    if let Command::Tools {
        token: Some(token),
        mode,
        session,
        ..
    }
    | Command::Search {
        token: Some(token),
        mode,
        session,
        ..
    }
    | Command::Call {
        token: Some(token),
        mode,
        session,
        ..
    } = &cli.command
    {
        Caller::of(&config, Some(token), *mode, session)?;
    }
    // SIGINT and SIGTERM are watched from here on, not only while serving: killed by the
    // default action, Quiver would leave the processes its upstreams' wrappers (`npx`,
    // `uvx`, `sh -c`) started, which its own death does not reach.
    let mut signals = quiver_host::serve::Signals::watch()?;
    // Commands that only show what is stored neither create the store nor change it.
    let access = match &cli.command {
        Command::Tools { .. } | Command::Status | Command::Check { .. } => StoreAccess::ReadOnly,
        Command::Floor { rederive } if !rederive => StoreAccess::ReadOnly,
        _ => StoreAccess::ReadWrite,
    };
    let app = App::build_with(&config, &cli.mcp_config, access).await?;
    let stopped = |signal: u8| {
        eprintln!("quiver: interrupted by signal {signal}: stopping the upstreams");
        Ok(ExitCode::from(128 + signal))
    };
    // A stdio client that closes stdin while the upstreams connect, having written
    // nothing, has left (MCP's way to stop a stdio server): waiting on for them (up to the
    // connect timeout) would keep its upstreams running for nobody.
    let stdio = matches!(cli.command, Command::Serve { stdio: true, .. });
    let progress = match cli.command {
        Command::Log { .. } => None,
        Command::Serve { .. } => Some(startup::Progress::Serving),
        _ => Some(startup::Progress::Once),
    };
    let wait = async {
        match progress {
            None => Ok(()),
            Some(progress) => startup::wait_for_upstreams(&app, progress).await,
        }
    };
    tokio::pin!(wait);
    let waited = tokio::select! {
        r = &mut wait => r.map(|()| None),
        signal = signals.next() => Ok(Some(signal)),
        left = quiver_host::serve::stdio_client_left(), if stdio => {
            tracing::info!("{} while the upstream servers were connecting: stopping", left.describe());
            shut_down(&app, &mut signals).await?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    // `status` and `check` are how an operator finds out why a required server is down:
    // they say so and go on (exit 1), where the other commands stop (exit 2).
    let diagnostic = matches!(cli.command, Command::Status | Command::Check { .. });
    let mut required_down = false;
    // A store that `serve` could not create: said, and the diagnosis fails (exit 1).
    if diagnostic && let Some(problem) = config.store.missing_directory() {
        eprintln!("quiver: {problem}");
        required_down = true;
    }
    let waited = match waited {
        Err(e) if diagnostic => {
            eprintln!("quiver: {e:#}");
            required_down = true;
            Ok(None)
        }
        other => other,
    };
    let code = match waited {
        Err(e) => Err(e),
        Ok(Some(signal)) => stopped(signal),
        // `serve` watches the signals itself: it drains its connections first. One that
        // came while it prepared (retention, the floor) stops it once it serves.
        Ok(None) if matches!(cli.command, Command::Serve { .. }) => {
            command(&app, &config, cli.command, Some(&mut signals)).await
        }
        Ok(None) => tokio::select! {
            code = command(&app, &config, cli.command, None) => code,
            signal = signals.next() => stopped(signal),
        },
    };
    shut_down(&app, &mut signals).await?;
    match code {
        Ok(c) if required_down && c == ExitCode::SUCCESS => Ok(ExitCode::from(1)),
        other => other,
    }
}

/// The most the shutdown after a command (stopping the upstreams, writing the working sets,
/// flushing the execution log) may take: a store locked by another process would otherwise
/// hold it for as long as its retries last (a minute), past a service manager's stop timeout.
const SHUTDOWN_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// [`App::shutdown`], bounded by [`SHUTDOWN_LIMIT`]; a signal during it (the second of a
/// `serve`, whose first began the stop) ends it at once. Either way what is left undone is
/// said on stderr, and the upstreams' process groups are ended by their watchdog.
async fn shut_down(app: &App, signals: &mut quiver_host::serve::Signals) -> anyhow::Result<()> {
    tokio::select! {
        r = tokio::time::timeout(SHUTDOWN_LIMIT, app.shutdown()) => match r {
            Ok(r) => r,
            Err(_) => anyhow::bail!(
                "stopping took over {}s (upstream servers slow to exit, or the store locked or slow): exiting without finishing; execution-log rows not written yet are lost",
                SHUTDOWN_LIMIT.as_secs()
            ),
        },
        signal = signals.next() => {
            eprintln!(
                "quiver: signal {signal} while stopping: exiting now; execution-log rows not written yet are lost"
            );
            std::process::exit(128 + i32::from(signal));
        }
    }
}

async fn command(
    app: &App,
    config: &Config,
    command: Command,
    signals: Option<&mut quiver_host::serve::Signals>,
) -> anyhow::Result<ExitCode> {
    let config_store = config.store.path.as_path();
    match command {
        Command::Status => {
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
        Command::Floor { rederive } => {
            if rederive {
                let store = &*app.store;
                match app.surface.rederive_floor_into(store, store).await {
                    FloorLoad::Unavailable(why) => {
                        anyhow::bail!("the floor could not be derived: {why}")
                    }
                    FloorLoad::DerivedNotStored(why) => anyhow::bail!(
                        "the floor was derived but not stored ({}): running servers keep theirs",
                        why.unwrap_or_default()
                    ),
                    _ => {}
                }
            }
            let floor = app.surface.floor();
            let source = match floor.source {
                FloorSource::Fallback => {
                    "the anchors and the static fallback (no used tool beyond the anchors is registered)"
                }
                _ => "derived from usage",
            };
            say!("resident floor: {} tool(s), {source}", floor.entries.len());
            for e in &floor.entries {
                let why = if e.anchor {
                    "anchor".to_owned()
                } else if floor.source == FloorSource::Fallback {
                    "fallback".to_owned()
                } else {
                    format!("score {:.1}", e.score)
                };
                let live = if app.catalog.contains(&e.name) {
                    ""
                } else {
                    "  (not registered now: left off the surface)"
                };
                say!("  {:<40} {why}{live}", e.name);
            }
            // Used tools the floor leaves out because they are not registered now (an
            // upstream down): they take their slots back when they register.
            let absent: Vec<(String, f64)> = app
                .surface
                .floor_ranking()
                .into_iter()
                .filter(|(n, _)| !app.catalog.contains(n))
                .take(10)
                .collect();
            if !absent.is_empty() {
                say!("used but not registered now (left out):");
                for (name, score) in absent {
                    say!("  {name:<40} score {score:.1}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { against } => {
            let mut findings = quiver_host::check::findings(app, config);
            for f in &findings {
                say!("{f}");
            }
            if let Some(db) = &against {
                let compared = quiver_host::check::against(app, config, db).await?;
                for f in &compared {
                    say!("{f}");
                }
                findings.extend(compared);
            }
            say!(
                "{}",
                quiver_host::check::summary(&findings, app.catalog.len(), against.is_some())
            );
            Ok(if quiver_host::check::passes(&findings) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Log { .. } => unreachable!("handled before the catalog is built"),
        Command::Tools {
            mode,
            session,
            token,
            format,
        } => {
            let caller = Caller::of(config, token.as_deref(), mode, &session)?;
            app.open_session(&caller.session).await?;
            let composed =
                app.surface
                    .compose(&caller.session, caller.mode, &caller.capabilities)?;
            let specs = composed.specs();
            for w in provider_name_warnings(&specs, format) {
                eprintln!("{w}");
            }
            say_raw(&format_tools(&specs, format));
            Ok(ExitCode::SUCCESS)
        }
        Command::Search {
            query,
            limit,
            session,
            mode,
            token,
        } => {
            let caller = Caller::of(config, token.as_deref(), mode, &session)?;
            if let Some(token) = &token
                && !app.dispatcher.offers_search(&caller.capabilities)
            {
                anyhow::bail!(
                    "the token `{token}` may not call tool_search (its `allowed_tools` leave it out), so it cannot search; `quiver tools --token {token}` shows the tools it has"
                );
            }
            apply_retention(app, config).await?;
            app.open_session(&caller.session).await?;
            let mut input = serde_json::json!({"query": query});
            if let Some(limit) = limit {
                input["limit"] = limit.into();
            }
            // A round of the session in its mode, as a `tools/call` of `tool_search` is in
            // `serve`.
            app.surface
                .begin_call(&caller.session, caller.mode, "tool_search");
            let envelope = app
                .dispatcher
                .call("tool_search", input, caller.context())
                .await;
            app.save_session(&caller.session).await?;
            say!(
                "{}",
                quiver_contract::printable_lines(&render(&envelope, &RenderOptions::default()))
            );
            Ok(exit_for(&envelope))
        }
        Command::Serve {
            listen,
            stdio,
            mode,
            allow_hosts,
        } => {
            let transport = if stdio {
                quiver_host::serve::Transport::Stdio
            } else {
                quiver_host::serve::Transport::Http(listen.addr)
            };
            apply_retention(app, config).await?;
            app.seed().await?;
            // Working sets go to the store as they change, so a restarted server (or
            // another replica) gives a returning conversation its tools back.
            let _mirror = app.surface.spawn_persistence(app.store.clone());
            // The stored resident floor (derived and stored now if due) is re-read every
            // `floor_cache_ttl_secs` and derived again once older than `floor_max_age_secs`.
            let store = &*app.store;
            app.surface.load_floor(store, store, true).await;
            let floor_keeper = app
                .surface
                .spawn_floor_keeper(app.store.clone(), app.store.clone());
            let definitions = app.spawn_definition_recorder();
            let mut options = quiver_mcp_adapter::ServerOptions::default()
                .with_default_mode(mode)
                .with_auth(config.inbound_auth())
                .with_input_wait(config.limits.input_wait()?)
                .with_max_sessions(config.limits.max_http_sessions()?);
            // A listener given by name accepts that name as `Host` too.
            for host in allow_hosts.into_iter().chain(listen.name) {
                options = options.with_allowed_host(host);
            }
            let mut own_signals = None;
            let signals = match signals {
                Some(signals) => signals,
                None => own_signals.insert(quiver_host::serve::Signals::watch()?),
            };
            let served = quiver_host::serve::serve(
                app.surface.clone(),
                app.dispatcher.clone(),
                transport,
                options,
                quiver_host::serve::Adapters {
                    stores: Some(quiver_host::serve::Stores {
                        sessions: app.store.clone(),
                        calls: app.store.clone(),
                    }),
                    content: Some(std::sync::Arc::new(app.mcp.clone())),
                    readiness: Some(std::sync::Arc::new(quiver_host::Ready::of(app))),
                },
                signals,
            )
            .await;
            // Not reading the store while it closes.
            floor_keeper.abort();
            // The definitions `check --against` compares with, all of them, before the store
            // closes (a serve that stops right after start-up lost some).
            definitions.finish(std::time::Duration::from_secs(10)).await;
            served?;
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchSearch { .. } => unreachable!("handled before the catalog is built"),
        Command::Call {
            name,
            json,
            session,
            mode,
            token,
        } => {
            let caller = Caller::of(config, token.as_deref(), mode, &session)?;
            apply_retention(app, config).await?;
            app.open_session(&caller.session).await?;
            let ctx = caller.context();
            // JSON that does not parse is the dispatcher's to explain (exit 2 below), and no
            // round of the session; a tool the mode refuses, or a name the caller cannot
            // call, is still answered as such first. Otherwise the call is admitted as
            // `quiver serve` admits it (refused and recorded, or a round of the session).
            // Parsed once: `Err` holds why the text is not JSON (empty text is `{}`).
            let parsed = if json.trim().is_empty() {
                Ok(serde_json::json!({}))
            } else {
                serde_json::from_str::<serde_json::Value>(&json)
            };
            let refusal = if parsed.is_ok() {
                app.surface
                    .admit(&app.dispatcher, &caller.session, &name, caller.mode, &ctx)
            } else {
                app.surface
                    .refusal(&app.dispatcher, &name, caller.mode, &ctx)
            };
            let envelope = match refusal {
                Some(refusal) => {
                    // Recorded as sent: the text itself when it is not JSON.
                    let input = match &parsed {
                        Ok(v) => v.clone(),
                        Err(_) => serde_json::Value::String(json.clone()),
                    };
                    app.dispatcher.refuse(&name, input, ctx, refusal).await
                }
                None => app.dispatcher.call_json(&name, &json, ctx).await,
            };
            app.save_session(&caller.session).await?;
            say!(
                "{}",
                quiver_contract::printable_lines(&render(&envelope, &RenderOptions::default()))
            );
            // JSON on the command line that does not parse is the operator's slip, not a
            // result: a usage error (2), whatever the answer above says.
            // Said here in full: the answer above may be about the name instead.
            if let Err(e) = &parsed {
                eprintln!(
                    "quiver: the JSON argument is not valid JSON ({e}); quote it whole, e.g. '{{\"key\": \"value\"}}'"
                );
                return Ok(ExitCode::from(2));
            }
            Ok(exit_for(&envelope))
        }
    }
}

/// The levels a `QUIVER_LOG` directive may be on its own (one for every target).
const LEVELS: &[&str] = &[
    "off", "error", "warn", "info", "debug", "trace", "0", "1", "2", "3", "4", "5",
];

fn main() -> ExitCode {
    let cli = Cli::parse();
    let spec = std::env::var("QUIVER_LOG").unwrap_or_default();
    let parsed = tracing_subscriber::EnvFilter::try_new(&spec);
    let bad_spec = parsed.as_ref().err().map(ToString::to_string);
    let mut filter = parsed
        .ok()
        .filter(|_| !spec.trim().is_empty())
        .unwrap_or_else(|| "warn".into());
    // A filter that sets no level for everything else (`quiver_host=debug`, or a typo like
    // `degub`, which reads as a target) keeps the warnings: they say what was skipped and
    // why, and switching them off is what `off` or `error` is for.
    if !spec
        .split(',')
        .any(|d| LEVELS.contains(&d.trim().to_ascii_lowercase().as_str()))
        && let Ok(warn) = "warn".parse()
    {
        filter = filter.add_directive(warn);
    }
    // rmcp's transport worker logs each failed upstream connection at ERROR, with Rust type
    // names; Quiver reports the same failure itself, in words (start-up lines, `status`).
    // Shown only when QUIVER_LOG names rmcp.
    // Its service loop warns of every error answer Quiver gives an upstream's request (a
    // roots/list outside a forwarded call, which Quiver refuses by design), as a Debug
    // dump: left to QUIVER_LOG too.
    // Its HTTP client logs a broken event stream and a failed session DELETE the same way,
    // where Quiver logs the connection's loss itself. Its service loop's errors are all a
    // message it could not send (a client gone: Quiver's stdio transport says so itself,
    // once, and ends the session), one line per answer still due, in Rust's words.
    if !spec.contains("rmcp") {
        for directive in [
            "rmcp::transport::worker=off",
            "rmcp::transport::common::client_side_sse=off",
            "rmcp::transport::streamable_http_client=off",
            "rmcp::service=off",
        ] {
            if let Ok(quiet) = directive.parse() {
                filter = filter.add_directive(quiet);
            }
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, not into a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(why) = bad_spec {
        eprintln!(
            "quiver: QUIVER_LOG={spec:?} is not a log filter ({why}); logging warnings. Give a level (error, warn, info, debug, trace, off) or target=level pairs, e.g. QUIVER_LOG=info,quiver_mcp_adapter=debug"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("quiver: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("quiver: {e:#}");
            ExitCode::from(2)
        }
    };
    // Everything `run` started has ended (the store flushed and closed, the upstreams
    // stopped), but `serve --stdio`'s read of stdin sits in a blocking thread that only a
    // line or the end of input ends: dropping the runtime would wait for it, so a SIGTERM
    // with stdin still open (`docker stop`, systemd) would never exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}
