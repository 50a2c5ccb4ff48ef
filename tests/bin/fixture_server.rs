//! `quiver serve` over the built-in tools plus three fixture tools, for the e2e suite:
//! `weather_forecast` (found by `tool_search`), `slow_count` (runs until its time is up or
//! it is cancelled) and `cancelled_calls` (waits until that many calls were cancelled).
//!
//! Usage: `quiver-fixture-server [--auth JSON] [--progress-ms N]`; prints the URL on stdout.

use std::{
    sync::Arc,
    time::Duration,
};

use anyhow::Context;
use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, Tool, ToolError, ToolResult, ToolSpec};
use quiver_host::{Families, assemble_catalog, serve};
use quiver_mcp_adapter::{InboundAuth, ServerOptions};
use quiver_registry::{Catalog, Dispatcher};
use quiver_surface::{MemoryUsage, Surface, SurfaceConfig, core_tools};
use serde_json::{Value, json};
use tokio::sync::watch;

struct Weather(ToolSpec);

#[async_trait]
impl Tool for Weather {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, input: Value, _ctx: &CallContext) -> ToolResult {
        let city = input["city"].as_str().unwrap_or_default().to_owned();
        Ok(Envelope::ok(json!({"city": city, "forecast": "sunny", "high_c": 21})))
    }
}

struct SlowCount {
    spec: ToolSpec,
    cancelled: watch::Sender<u64>,
}

#[async_trait]
impl Tool for SlowCount {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let ms = input["ms"].as_u64().unwrap_or(1000);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(Envelope::ok(json!(format!("counted for {ms} ms")))),
            _ = ctx.cancel.cancelled() => {
                self.cancelled.send_modify(|n| *n += 1);
                Err(ToolError::failed("cancelled"))
            }
        }
    }
}

struct CancelledCalls {
    spec: ToolSpec,
    cancelled: watch::Receiver<u64>,
}

#[async_trait]
impl Tool for CancelledCalls {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, input: Value, _ctx: &CallContext) -> ToolResult {
        let at_least = input["at_least"].as_u64().unwrap_or(0);
        let mut rx = self.cancelled.clone();
        let waited = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|n| *n >= at_least)).await;
        let n = *self.cancelled.borrow();
        match waited {
            Ok(_) => Ok(Envelope::ok(json!({"cancelled": n}))),
            Err(_) => Err(ToolError::failed(format!("only {n} calls were cancelled after 10 s"))),
        }
    }
}

fn fixture_tools() -> Vec<Arc<dyn Tool>> {
    let (tx, rx) = watch::channel(0);
    vec![
        Arc::new(Weather(
            ToolSpec::new(
                "weather_forecast",
                "Returns the weather forecast (sky, high temperature) for a city.",
            )
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
                "additionalProperties": false
            })),
        )),
        Arc::new(SlowCount {
            spec: ToolSpec::new("slow_count", "Counts slowly for a number of milliseconds; a test fixture.")
                .read_only()
                .with_schema(json!({
                    "type": "object",
                    "properties": {"ms": {"type": "integer", "minimum": 0}},
                    "additionalProperties": false
                })),
            cancelled: tx,
        }),
        Arc::new(CancelledCalls {
            spec: ToolSpec::new(
                "cancelled_calls",
                "Waits until at least `at_least` slow_count calls were cancelled; a test fixture.",
            )
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {"at_least": {"type": "integer", "minimum": 0}},
                "additionalProperties": false
            })),
            cancelled: rx,
        }),
    ]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUIVER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut options = ServerOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().with_context(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--auth" => {
                let auth: InboundAuth = serde_json::from_str(&value).context("parsing --auth")?;
                options = options.with_auth(auth);
            }
            "--progress-ms" => {
                options = options.with_progress_interval(Duration::from_millis(value.parse()?));
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let catalog = Arc::new(Catalog::new());
    let surface = Surface::new(catalog.clone(), SurfaceConfig::default(), Arc::new(MemoryUsage::new([])))?;
    let mut families = Families::default();
    families.core = core_tools(&surface);
    families.custom = fixture_tools();
    assemble_catalog(&catalog, families)?;
    surface.resync_index();
    let dispatcher = Dispatcher::builder(catalog).observer(surface.clone()).build();
    let listen = "127.0.0.1:0".parse()?;
    serve::serve(surface, dispatcher, serve::Transport::Http(listen), options).await
}
