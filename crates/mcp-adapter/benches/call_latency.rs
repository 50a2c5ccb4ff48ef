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

    let (direct_stdio, direct_http, catalog, client) = rt.block_on(async {
        let mut child = tokio::process::Command::new("node")
            .args([js.as_str(), "stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
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
        ((direct_stdio, child), direct_http, catalog, client)
    });

    let mut g = c.benchmark_group("echo");
    g.sample_size(300).measurement_time(Duration::from_secs(6));
    let params = || CallToolRequestParams::new("echo").with_arguments(args());
    g.bench_function("stdio/direct_rmcp", |b| {
        b.to_async(&rt)
            .iter(|| async { direct_stdio.0.call_tool(params()).await.unwrap() })
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

criterion_group!(benches, bench);
criterion_main!(benches);
