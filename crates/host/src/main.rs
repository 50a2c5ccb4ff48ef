//! `quiver`: the tool runtime's command line.

use std::{process::ExitCode, sync::Arc};

use anyhow::Context;
use clap::{Parser, Subcommand};
use quiver_contract::{CallContext, Mode, RenderOptions, render};
use quiver_host::{Families, ToolFormat, assemble_catalog, format_tools};
use quiver_registry::{AdvertiseOptions, Catalog, Dispatcher};

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
    /// List the tools a session would see (the built-in catalog for now).
    ///
    /// Example: `quiver tools --format openai` prints the `tools` array for the OpenAI API.
    Tools {
        /// The session mode: chat, agentic, delegate or plan.
        #[arg(long, default_value = "chat", value_parser = parse_mode)]
        mode: Mode,
        /// Output format.
        #[arg(long, value_enum, default_value = "table")]
        format: ToolFormat,
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
    catalog: Arc<Catalog>,
    dispatcher: Dispatcher,
}

fn build() -> anyhow::Result<App> {
    let catalog = Arc::new(Catalog::new());
    let families = Families::default();
    assemble_catalog(&catalog, families).context("assembling the catalog")?;
    let dispatcher = Dispatcher::new(catalog.clone());
    Ok(App {
        catalog,
        dispatcher,
    })
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let app = build()?;
    match cli.command {
        Command::Tools { mode, format } => {
            let specs = app
                .catalog
                .advertised_specs(mode, &AdvertiseOptions::default());
            print!("{}", format_tools(&specs, format));
            Ok(ExitCode::SUCCESS)
        }
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
