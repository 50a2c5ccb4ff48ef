//! The direct path's tests, by concern (one file each); this file holds the tools and
//! requests they share.

mod batch;
mod fuzz;
mod in_flight;
mod refusals;
mod resume;
mod routing;
mod sessions;
mod shared_store;

use std::time::Duration;

use async_trait::async_trait;
use axum::{Router, body::Bytes};
use quiver_contract::{CallContext, Envelope, ErrKind, Mode, Tool, ToolResult, ToolSpec};
use quiver_registry::{Catalog, Dispatcher};
use quiver_surface::Surface;
use serde_json::json;
use tower::ServiceExt;

use super::*;
use crate::server::{McpServer, ServerOptions};

struct Echo(ToolSpec);

#[async_trait]
impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        if input.get("tick").is_some() {
            ctx.progress(0.5, Some(1.0), Some("halfway".into())).await;
        }
        // `say`: a log message per string, `pause` ms before each and after the last;
        // `gap`: ms before the first and after the last only (a burst in between).
        let pause = Duration::from_millis(input["pause"].as_u64().unwrap_or(0));
        let gap = Duration::from_millis(input["gap"].as_u64().unwrap_or(0));
        tokio::time::sleep(gap).await;
        for said in input["say"].as_array().into_iter().flatten() {
            tokio::time::sleep(pause).await;
            ctx.log(quiver_contract::LogLevel::Info, Some("echo"), said.clone())
                .await;
        }
        tokio::time::sleep(pause.max(gap)).await;
        Ok(Envelope::ok(input))
    }
}

/// Holds until cancelled: says when it started, and whether its call was dropped.
struct Hold {
    spec: ToolSpec,
    started: Arc<tokio::sync::Notify>,
    dropped: Arc<std::sync::atomic::AtomicBool>,
    /// Calls that saw their cancellation.
    cancelled: Arc<std::sync::atomic::AtomicUsize>,
}

impl Hold {
    /// `hold`, read-only, telling `started`; its drop and cancellation not watched.
    fn new(started: &Arc<tokio::sync::Notify>) -> Hold {
        Hold {
            spec: ToolSpec::new("hold", "Holds until cancelled.")
                .read_only()
                .with_schema(json!({"type": "object"})),
            started: started.clone(),
            dropped: Arc::default(),
            cancelled: Arc::default(),
        }
    }
}

struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait]
impl Tool for Hold {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _input: Value, ctx: &CallContext) -> ToolResult {
        let _guard = SetOnDrop(self.dropped.clone());
        self.started.notify_one();
        ctx.cancel.cancelled().await;
        self.cancelled
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // As a proxied upstream call answers its cancellation.
        Ok(Envelope::err(ErrKind::Cancelled, "cancelled"))
    }
}

fn server() -> McpServer {
    server_with(None)
}

fn server_with(hold: Option<Hold>) -> McpServer {
    let catalog = echo_catalog();
    if let Some(hold) = hold {
        catalog.register(Arc::new(hold)).unwrap();
    }
    crate::server::test_server(catalog, ServerOptions::default())
}

/// A catalog of one tool, `echo`, which echoes its arguments.
fn echo_catalog() -> Arc<Catalog> {
    let catalog = Arc::new(Catalog::new());
    catalog
        .register(Arc::new(Echo(
            ToolSpec::new("echo", "Echoes its arguments.")
                .read_only()
                .with_schema(json!({"type": "object"})),
        )))
        .unwrap();
    catalog
}

struct Reply {
    status: StatusCode,
    content_type: String,
    session: Option<String>,
    body: String,
}

async fn send(router: &Router, method: Method, session: Option<&str>, body: Value) -> Reply {
    send_text(router, method, session, body.to_string()).await
}

async fn send_text(router: &Router, method: Method, session: Option<&str>, body: String) -> Reply {
    send_with(router, method, session, body, &[]).await
}

/// [`send_text`] with extra headers (raw bytes: a header need not be ASCII).
async fn send_with(
    router: &Router,
    method: Method,
    session: Option<&str>,
    body: String,
    extra: &[(&str, &[u8])],
) -> Reply {
    let req = request(method, session, body, extra);
    reply(router, req).await
}

/// The request [`send_with`] sends.
fn request(
    method: Method,
    session: Option<&str>,
    body: String,
    extra: &[(&str, &[u8])],
) -> Request {
    let mut req = Request::builder()
        .method(method)
        .uri("/mcp")
        .header("host", "127.0.0.1:7345")
        .header("content-type", "application/json")
        .header(
            "accept",
            extra
                .iter()
                .find(|(n, _)| *n == "accept")
                .map_or(&b"application/json, text/event-stream"[..], |(_, v)| *v),
        );
    // An empty `mcp-protocol-version` in `extra` sends none (a 2025-03-26 client).
    if !extra.iter().any(|(n, _)| *n == "mcp-protocol-version") {
        req = req.header("mcp-protocol-version", "2025-11-25");
    }
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    for (name, value) in extra
        .iter()
        .filter(|(n, v)| *n != "accept" && !(*n == "mcp-protocol-version" && v.is_empty()))
    {
        req = req.header(*name, axum::http::HeaderValue::from_bytes(value).unwrap());
    }
    req.body(Body::from(body)).unwrap()
}

async fn reply(router: &Router, req: Request) -> Reply {
    let resp = router.clone().oneshot(req).await.unwrap();
    let (content_type, session) = {
        let text = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (
            text("content-type").unwrap_or_default(),
            text("mcp-session-id"),
        )
    };
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    Reply {
        status,
        content_type,
        session,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// The JSON-RPC messages of an SSE body, in order.
fn sse_messages(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn call(id: u64, meta: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"x": id}, "_meta": meta}})
}

/// Opens a session that negotiated 2025-03-26 (its client sends no
/// `MCP-Protocol-Version`), initialized; returns its id.
async fn open_2025_03_26(router: &Router) -> String {
    let old: &[(&str, &[u8])] = &[("mcp-protocol-version", b"")];
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let opened = send_with(router, Method::POST, None, init.to_string(), old).await;
    assert!(opened.body.contains("\"2025-03-26\""), "{}", opened.body);
    let sid = opened.session.expect("a session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    send_with(
        router,
        Method::POST,
        Some(&sid),
        initialized.to_string(),
        old,
    )
    .await;
    sid
}

/// Opens a session whose client declares `capabilities`; returns its id once the direct
/// path knows it.
async fn open(server: &McpServer, router: &Router, capabilities: Value) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": capabilities,
        "clientInfo": {"name": "t", "version": "1"}}});
    let sid = send(router, Method::POST, None, init)
        .await
        .session
        .expect("a session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    send(router, Method::POST, Some(&sid), initialized).await;
    let list = json!({"jsonrpc": "2.0", "id": 1000, "method": "tools/list"});
    send(router, Method::POST, Some(&sid), list).await;
    assert!(server.shared.direct.get(&sid).is_some(), "registered");
    sid
}
