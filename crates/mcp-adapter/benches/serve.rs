//! What the MCP server adds to a call: a no-op tool through `Dispatcher::call` directly, and
//! the same call as an MCP `tools/call` POST on an initialized 2025-11-25 session, through
//! the axum router, the bearer check, the direct path (JSON response) and the render; and
//! once more with a progress token, which goes through rmcp's streamable-HTTP service and
//! session (SSE response). In process: no socket, no HTTP parsing.

use std::{hint::black_box, sync::Arc};

use async_trait::async_trait;
use axum::{
    Router,
    body::{Body, to_bytes},
    http::Request,
};
use criterion::{Criterion, criterion_group, criterion_main};
use quiver_contract::{CallContext, Envelope, Tool, ToolResult, ToolSpec};
use quiver_mcp_adapter::{McpServer, ServerOptions};
use quiver_registry::{Catalog, Dispatcher};
use quiver_surface::{MemoryUsage, Surface, SurfaceConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

struct Noop(ToolSpec);

#[async_trait]
impl Tool for Noop {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
        Ok(Envelope::ok(Value::Null))
    }
}

fn post(body: &Value, session: Option<&str>) -> Request<Body> {
    let mut req = Request::post("/mcp")
        .header("host", "127.0.0.1:7345")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    req.body(Body::from(body.to_string()))
        .expect("a valid request")
}

async fn send(router: &Router, req: Request<Body>) -> (Option<String>, String) {
    let resp = router.clone().oneshot(req).await.expect("infallible");
    let session = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("the body is read");
    (session, String::from_utf8_lossy(&body).into_owned())
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (dispatcher, router, session) = rt.block_on(async {
        let catalog = Arc::new(Catalog::new());
        catalog
            .register(Arc::new(Noop(
                ToolSpec::new("noop", "Does nothing.")
                    .read_only()
                    .with_schema(json!({"type": "object", "properties": {}})),
            )))
            .expect("registered");
        let surface = Surface::new(
            catalog.clone(),
            SurfaceConfig::default(),
            Arc::new(MemoryUsage::new([])),
        )
        .expect("a surface");
        let dispatcher = Dispatcher::builder(catalog)
            .observer(surface.clone())
            .build();
        let server = McpServer::new(surface, dispatcher.clone(), ServerOptions::default());
        let router = server.router("127.0.0.1:7345".parse().expect("an address"));
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}});
        let (session, _) = send(&router, post(&init, None)).await;
        let session = session.expect("a session id");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        send(&router, post(&initialized, Some(&session))).await;
        (dispatcher, router, session)
    });
    let mut group = c.benchmark_group("serve");
    group.bench_function("dispatcher_call", |b| {
        b.to_async(&rt).iter(|| async {
            black_box(
                dispatcher
                    .call("noop", json!({}), CallContext::for_session("bench"))
                    .await,
            )
        })
    });
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "noop", "arguments": {}}});
    group.bench_function("mcp_tools_call", |b| {
        b.to_async(&rt).iter(|| async {
            let (_, body) = send(&router, post(&call, Some(&session))).await;
            assert!(body.contains("\"result\""), "{body}");
            black_box(body)
        })
    });
    // A progress token sends the call through rmcp's session (an SSE response stream)
    // instead of the direct path.
    let sse_call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "noop", "arguments": {}, "_meta": {"progressToken": "p"}}});
    group.bench_function("mcp_tools_call_sse", |b| {
        b.to_async(&rt).iter(|| async {
            let (_, body) = send(&router, post(&sse_call, Some(&session))).await;
            assert!(body.contains("\"result\""), "{body}");
            black_box(body)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
