//! The wrapper command the MCP conformance suite's client scenarios run
//! (`conformance client --command quiver-conformance-client --scenario NAME`): the suite starts
//! a test server and appends its URL; this connects to it with Quiver's upstream MCP client
//! (the one `quiver serve` uses for its upstreams), and calls every tool the server lists
//! through Quiver's dispatcher, with arguments made from each tool's input schema.
//!
//! Nothing here depends on the scenario's name: what a scenario checks (the handshake, a tool
//! call, SSE reconnection, elicitation defaults) is what the client does for any server. The
//! calls carry a client channel standing in for a downstream MCP client whose user accepts
//! every elicitation without typing anything (so Quiver must apply the schema's defaults,
//! SEP-1034) and that offers no sampling or roots. Each call's rendered envelope goes to
//! stdout; the exit code is 1 when the server could not be reached or a call ended in an error
//! envelope.

use std::{process::ExitCode, sync::Arc, time::Duration};

use async_trait::async_trait;
use quiver_contract::{
    CallContext, ChannelError, ClientChannel, ClientFeatures, LogLevel, RenderOptions, render,
};
use quiver_mcp_adapter::{ClientOptions, Liveness, McpClient, ServerConfig, validate_all};
use quiver_registry::{Catalog, Dispatcher};
use serde_json::{Map, Value, json};

const SERVER: &str = "conformance";

/// The stand-in downstream client: accepts elicitations as they come, nothing else.
struct AcceptingClient;

#[async_trait]
impl ClientChannel for AcceptingClient {
    fn features(&self) -> ClientFeatures {
        ClientFeatures::new(false, true, false)
    }

    async fn create_message(&self, _params: Value) -> Result<Value, ChannelError> {
        Err(ChannelError::Unsupported(
            "this client offers no sampling".into(),
        ))
    }

    async fn elicit(&self, params: Value) -> Result<Value, ChannelError> {
        eprintln!("elicitation: {params}");
        Ok(json!({"action": "accept", "content": {}}))
    }

    async fn list_roots(&self) -> Result<Value, ChannelError> {
        Err(ChannelError::Unsupported(
            "this client offers no roots".into(),
        ))
    }

    async fn log(&self, level: LogLevel, logger: Option<&str>, data: Value) {
        eprintln!("log {} {}: {data}", level.as_str(), logger.unwrap_or("-"));
    }

    async fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        eprintln!("progress {progress}/{total:?} {message:?}");
    }
}

/// A value for one property of an input schema: its default, else its first enum member,
/// else a plain value of its type.
fn example(schema: &Value) -> Value {
    if let Some(d) = schema.get("default") {
        return d.clone();
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    let ty = match schema.get("type") {
        Some(Value::Array(types)) => types.iter().find_map(Value::as_str).unwrap_or("string"),
        Some(Value::String(t)) => t.as_str(),
        _ => "string",
    };
    match ty {
        "number" | "integer" => json!(2),
        "boolean" => json!(true),
        "array" => json!([]),
        "object" => arguments(schema),
        "null" => Value::Null,
        _ => json!("test"),
    }
}

/// Arguments for a tool: a value for every property its input schema declares.
fn arguments(schema: &Value) -> Value {
    let mut args = Map::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            args.insert(name.clone(), example(prop));
        }
    }
    Value::Object(args)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: quiver-conformance-client URL (the conformance suite appends it)");
        return ExitCode::from(2);
    };
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    eprintln!("scenario {scenario:?}, server {url}");
    let servers = match validate_all(
        &[ServerConfig::http(SERVER, url)
            .with_liveness(Liveness::Off)
            .required()],
        &|k| std::env::var(k).ok(),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bad server URL: {e}");
            return ExitCode::from(2);
        }
    };
    let catalog = Arc::new(Catalog::new());
    let client = McpClient::start(
        catalog.clone(),
        servers,
        ClientOptions::default().with_connect_timeout(Duration::from_secs(10)),
    );
    if let Err(e) = client.wait_ready(Duration::from_secs(15)).await {
        eprintln!("the server did not become ready: {e}");
        client.close().await;
        return ExitCode::FAILURE;
    }
    let dispatcher = Dispatcher::new(catalog.clone());
    let prefix = format!("mcp__{SERVER}__");
    let channel: Arc<dyn ClientChannel> = Arc::new(AcceptingClient);
    let mut failed = false;
    for entry in catalog.tools() {
        let name = entry.spec.name.clone();
        if !name.starts_with(&prefix) {
            continue;
        }
        let args = arguments(&entry.spec.input_schema);
        let envelope = dispatcher
            .call(
                &name,
                args.clone(),
                CallContext::for_session("conformance").with_client(channel.clone()),
            )
            .await;
        println!(
            "{name} {args}\n{}",
            render(&envelope, &RenderOptions::default())
        );
        failed |= envelope.is_err();
    }
    client.close().await;
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
