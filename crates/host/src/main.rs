//! `quiver`: the tool runtime's command line.

use std::{process::ExitCode, sync::Arc};

use anyhow::Context;
use clap::{Parser, Subcommand};
use quiver_contract::Capabilities;
use quiver_contract::{CallContext, Mode, RenderOptions, render};
use quiver_host::{Families, ToolFormat, assemble_catalog, format_tools};
use quiver_registry::{Catalog, Dispatcher};
use quiver_surface::{MemoryUsage, Surface, SurfaceConfig, core_tools};

/// Quiver: one catalog, one dispatch pipeline, every tool an agent can call.
///
/// Every command goes through the same assembled catalog and dispatcher.
#[derive(Debug, Parser)]
#[command(name = "quiver", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the tools a session sees: its composed surface (resident floor, system tools,
    /// working set), as the model receives it.
    ///
    /// Example: `quiver tools --format openai` prints the `tools` array for the OpenAI API.
    Tools {
        /// The session mode: chat, agentic, delegate or plan.
        #[arg(long, default_value = "chat", value_parser = parse_mode)]
        mode: Mode,
        /// The session (conversation) key.
        #[arg(long, default_value = "cli")]
        session: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: ToolFormat,
    },
    /// Search the catalog the way the model does, through the `tool_search` tool.
    ///
    /// Example: `quiver search "current time in a timezone" --limit 5`.
    Search {
        /// What you need, in words.
        query: String,
        /// How many tools to return.
        #[arg(long, default_value_t = 8)]
        limit: u32,
    },
    /// Measure tool-search quality on a benchmark set and print
    /// `{queries, hit@1, recall@5, recall@10, ndcg@10}` in percent.
    ///
    /// The file format is described in the benchmark set's README (one JSON object a line).
    BenchSearch {
        /// Tools, one `{"name", "description", "input_schema"}` a line.
        #[arg(long)]
        tools: std::path::PathBuf,
        /// Queries, one `{"id", "query", "gold"}` a line.
        #[arg(long)]
        queries: std::path::PathBuf,
    },
    /// Serve MCP: streamable HTTP on 127.0.0.1:7345 (the URL is printed on stdout), or
    /// stdio for desktop clients.
    ///
    /// Example: `quiver serve --listen 127.0.0.1:0` picks a free port.
    Serve {
        /// The address to listen on.
        #[arg(long, default_value = quiver_host::serve::DEFAULT_LISTEN)]
        listen: std::net::SocketAddr,
        /// Serve on stdin and stdout instead of HTTP.
        #[arg(long, conflicts_with = "listen")]
        stdio: bool,
        /// The session mode of clients whose token names none.
        #[arg(long, default_value = "chat", value_parser = parse_mode)]
        mode: Mode,
        /// Also accept this `Host` (`name` or `name:port`), e.g. the public name of a
        /// non-loopback listener. The listen address itself is always accepted.
        #[arg(long = "allow-host", value_name = "HOST")]
        allow_hosts: Vec<String>,
    },
    /// Call one tool through the full pipeline and print the rendered result.
    ///
    /// Exits 0 for an Ok or a Hint, 1 for an Err. Example: `quiver call tool_search '{"query": "time"}'`.
    Call {
        /// The tool name.
        name: String,
        /// The arguments, as one JSON object.
        #[arg(default_value = "{}")]
        json: String,
        /// The session (conversation) key.
        #[arg(long, default_value = "cli")]
        session: String,
    },
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::parse(s).ok_or_else(|| format!("unknown mode `{s}`: use chat, agentic, delegate or plan"))
}

struct App {
    surface: Arc<Surface>,
    dispatcher: Dispatcher,
}

fn build() -> anyhow::Result<App> {
    let catalog = Arc::new(Catalog::new());
    let surface = Surface::new(
        catalog.clone(),
        SurfaceConfig::default(),
        Arc::new(MemoryUsage::new([])),
    )
    .context("building the tool surface")?;
    let mut families = Families::default();
    families.core = core_tools(&surface);
    assemble_catalog(&catalog, families).context("assembling the catalog")?;
    surface.resync_index();
    let dispatcher = Dispatcher::builder(catalog)
        .observer(surface.clone())
        .build();
    Ok(App {
        surface,
        dispatcher,
    })
}

fn exit_for(envelope: &quiver_contract::Envelope) -> ExitCode {
    if envelope.is_err() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::BenchSearch { tools, queries } = &cli.command {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let report = quiver_surface::search::evaluate(&read(tools)?, &read(queries)?)
            .map_err(|e| anyhow::anyhow!("bench-search: {e}"))?;
        println!("{}", serde_json::to_string(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let app = build()?;
    match cli.command {
        Command::Tools {
            mode,
            session,
            format,
        } => {
            let composed = app.surface.compose(&session, mode, &Capabilities::all())?;
            print!("{}", format_tools(&composed.specs(), format));
            Ok(ExitCode::SUCCESS)
        }
        Command::Search { query, limit } => {
            let input = serde_json::json!({"query": query, "limit": limit});
            let envelope = app
                .dispatcher
                .call("tool_search", input, CallContext::for_session("cli"))
                .await;
            println!("{}", render(&envelope, &RenderOptions::default()));
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
                quiver_host::serve::Transport::Http(listen)
            };
            let mut options = quiver_mcp_adapter::ServerOptions::default().with_default_mode(mode);
            for host in allow_hosts {
                options = options.with_allowed_host(host);
            }
            quiver_host::serve::serve(app.surface, app.dispatcher, transport, options).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchSearch { .. } => unreachable!("handled before the catalog is built"),
        Command::Call {
            name,
            json,
            session,
        } => {
            let envelope = app
                .dispatcher
                .call_json(&name, &json, CallContext::for_session(session))
                .await;
            println!("{}", render(&envelope, &RenderOptions::default()));
            Ok(if envelope.is_err() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUIVER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
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
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("quiver: {e:#}");
            ExitCode::from(2)
        }
    }
}
