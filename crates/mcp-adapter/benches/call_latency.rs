//! Added latency of a call through the adapter (catalog tool -> McpClient -> rmcp) versus a
//! direct rmcp client call to the same upstream (server-everything `echo`), over stdio and
//! streamable HTTP. Needs the peers from `.ci/setup-peers`.

use std::{path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use quiver_contract::CallContext;
use quiver_mcp_adapter::{ClientOptions, Liveness, McpClient, ServerConfig, validate_all};
use quiver_registry::Catalog;
use rmcp::{
    ServiceExt,
    model::CallToolRequestParams,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Map, Value, json};

fn everything_js() -> String {
    let dir = std::env::var_os("QUIVER_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers"));
    let js = dir.join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        js.exists(),
        "server-everything is missing: run .ci/setup-peers"
    );
    js.display().to_string()
}

fn args() -> Map<String, Value> {
    json!({"message": "hello"}).as_object().unwrap().clone()
}

fn bench(c: &mut Criterion) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let js = everything_js();

    // HTTP upstream shared by both HTTP variants.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut http_server = std::process::Command::new("node")
        .args([js.as_str(), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }

    let (direct_stdio, direct_http, catalog, client, raw) = rt.block_on(async {
        let mut child = stdio_everything(&js);
        let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let direct_stdio = ().serve(io).await.unwrap();
        let transport = StreamableHttpClientTransport::with_client(
            reqwest::Client::new(),
            StreamableHttpClientTransportConfig::with_uri(url.as_str()),
        );
        let direct_http = ().serve(transport).await.unwrap();

        let catalog = Arc::new(Catalog::new());
        let servers = validate_all(
            &[
                ServerConfig::stdio("es", "node", vec![js.clone(), "stdio".into()]).required(),
                ServerConfig::http("eh", url.clone()).required(),
            ],
            &|_| None,
        )
        .unwrap();
        let client = McpClient::start(
            catalog.clone(),
            servers,
            ClientOptions::default().with_liveness(Liveness::Off),
        );
        client.wait_ready(Duration::from_secs(60)).await.unwrap();
        let raw = RawStdio::start(&js).await;
        ((direct_stdio, child), direct_http, catalog, client, raw)
    });

    let mut g = c.benchmark_group("echo");
    g.sample_size(300).measurement_time(Duration::from_secs(6));
    let params = || CallToolRequestParams::new("echo").with_arguments(args());
    g.bench_function("stdio/direct_rmcp", |b| {
        b.to_async(&rt)
            .iter(|| async { direct_stdio.0.call_tool(params()).await.unwrap() })
    });
    // The floor: one task writing the request line and reading the answer line itself.
    let raw = tokio::sync::Mutex::new(raw);
    g.bench_function("stdio/raw_lines", |b| {
        b.to_async(&rt)
            .iter(|| async { raw.lock().await.call().await })
    });
    let es = catalog.lookup("mcp__es__echo").unwrap();
    g.bench_function("stdio/adapter", |b| {
        b.to_async(&rt).iter(|| async {
            let env = es
                .tool
                .call(json!({"message": "hello"}), &CallContext::default())
                .await
                .unwrap();
            assert!(env.is_ok());
            env
        })
    });
    g.bench_function("http/direct_rmcp", |b| {
        b.to_async(&rt)
            .iter(|| async { direct_http.call_tool(params()).await.unwrap() })
    });
    let eh = catalog.lookup("mcp__eh__echo").unwrap();
    g.bench_function("http/adapter", |b| {
        b.to_async(&rt).iter(|| async {
            let env = eh
                .tool
                .call(json!({"message": "hello"}), &CallContext::default())
                .await
                .unwrap();
            assert!(env.is_ok());
            env
        })
    });
    g.finish();

    rt.block_on(async {
        client.close().await;
        drop(direct_http);
        drop(direct_stdio);
    });
    let _ = http_server.kill();
    let _ = http_server.wait();
}

/// server-everything on stdio pipes, killed when dropped.
fn stdio_everything(js: &str) -> tokio::process::Child {
    tokio::process::Command::new("node")
        .args([js, "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// A stdio client with no framework: the request is written and its answer line read by
/// the calling task.
struct RawStdio {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
    next: u64,
    line: String,
}

impl RawStdio {
    async fn start(js: &str) -> RawStdio {
        let mut child = stdio_everything(js);
        let mut raw = RawStdio {
            stdin: child.stdin.take().unwrap(),
            stdout: tokio::io::BufReader::new(child.stdout.take().unwrap()),
            _child: child,
            next: 0,
            line: String::new(),
        };
        raw.send(
            &json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        )
        .await;
        raw.answer().await;
        raw.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        raw
    }

    async fn send(&mut self, message: &Value) {
        use tokio::io::AsyncWriteExt;
        let mut bytes = serde_json::to_vec(message).unwrap();
        bytes.push(b'\n');
        self.stdin.write_all(&bytes).await.unwrap();
    }

    /// The next line that is an answer (a notification in between is skipped).
    async fn answer(&mut self) -> Value {
        use tokio::io::AsyncBufReadExt;
        loop {
            self.line.clear();
            assert!(self.stdout.read_line(&mut self.line).await.unwrap() > 0);
            let v: Value = serde_json::from_str(&self.line).unwrap();
            if v.get("id").is_some() {
                return v;
            }
        }
    }

    async fn call(&mut self) -> Value {
        self.next += 1;
        self.send(
            &json!({"jsonrpc": "2.0", "id": self.next, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "hello"}}}),
        )
        .await;
        let v = self.answer().await;
        assert!(v.get("result").is_some(), "{v}");
        v
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
