//! Streamable HTTP: rmcp's tower service inside axum, behind the bearer check, with
//! `Host`/`Origin` validation against the listen address; beside it the operator probes
//! (`/healthz`, `/readyz`, see [`health`]).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{Router, response::IntoResponse, routing::any};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{McpServer, ServeError, auth, direct, handler::SessionHandler, health};

/// The path the MCP endpoint is served on.
pub(crate) const MCP_PATH: &str = "/mcp";

/// How long rmcp keeps a completed request stream's replies for a resumption.
const COMPLETED_STREAM_TTL: Duration = Duration::from_secs(10);

/// The `Host` authorities a server listening on `addr` accepts: the address itself and, for
/// a loopback or unspecified address, the loopback names, each with the port.
pub fn allowed_authorities(addr: SocketAddr) -> Vec<String> {
    let port = addr.port();
    let mut out = vec![match addr {
        SocketAddr::V4(a) => format!("{}:{port}", a.ip()),
        SocketAddr::V6(a) => format!("[{}]:{port}", a.ip()),
    }];
    if addr.ip().is_loopback() || addr.ip().is_unspecified() {
        for name in ["localhost", "127.0.0.1", "[::1]"] {
            let a = format!("{name}:{port}");
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

/// How long rmcp's sessions and streams outlive the shutdown: the calls in flight are
/// cancelled at once (their tokens are the shutdown's children), and their answers ("cancelled
/// because Quiver is shutting down") still need the stream they go out on.
const ANSWER_GRACE: Duration = Duration::from_millis(250);

/// rmcp's service token: cancelled [`ANSWER_GRACE`] after `shutdown`. Cancelled with it,
/// rmcp closed each call's event stream (and a 2026-07-28 request's answer) before the
/// call's answer was written: the client saw the stream end without one, or a 500.
fn answered_then_closed(shutdown: &CancellationToken) -> CancellationToken {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return shutdown.child_token();
    };
    let later = CancellationToken::new();
    let (shutdown, token) = (shutdown.clone(), later.clone());
    runtime.spawn(async move {
        shutdown.cancelled().await;
        tokio::time::sleep(ANSWER_GRACE).await;
        token.cancel();
    });
    later
}

/// Why a request's `Host` is refused, and what makes it accepted: the name a proxy passes
/// on is given to `--allow-host` (the check guards against DNS rebinding).
pub(crate) fn host_refusal(host: Option<&str>) -> String {
    match host {
        Some(host) => {
            let shown: String = host.chars().take(200).collect();
            format!(
                "the Host header `{shown}` is not one this server answers to: if clients reach it by that name (through a proxy or a load balancer), start `quiver serve` with `--allow-host {shown}`"
            )
        }
        None => "the request has no Host header: send the host and port the server is reached at"
            .to_owned(),
    }
}

impl McpServer {
    /// The MCP endpoint (at `/mcp`) for a server listening on `addr`.
    pub fn router(&self, addr: SocketAddr) -> Router {
        let mut hosts = allowed_authorities(addr);
        hosts.extend(self.shared.options.extra_allowed_hosts.iter().cloned());
        // A host given without a port matches any port (`--allow-host name`); its origins
        // say so in rmcp's own form (`:*`), which it takes without warning that a later
        // release will match only the scheme's default port.
        let origins: Vec<String> = hosts
            .iter()
            .map(|h| {
                if has_port(h) {
                    h.clone()
                } else {
                    format!("{h}:*")
                }
            })
            .flat_map(|h| [format!("http://{h}"), format!("https://{h}")])
            .collect();
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts.clone())
            .with_allowed_origins(origins.clone())
            .enforce_origin_validation()
            .with_cancellation_token(answered_then_closed(&self.shared.shutdown));
        let mut sessions = LocalSessionManager::default();
        // rmcp keeps each completed request stream's replies for a late resumption and scans
        // them on every session event; 60 s of them (its default) made a busy session slower
        // with every call and held their memory. 10 s still covers a client reconnecting
        // after the 3 s retry hint.
        sessions.session_config.completed_cache_ttl = COMPLETED_STREAM_TTL;
        let sessions = Arc::new(sessions);
        *crate::sync::lock(&self.shared.http_sessions) = Some(sessions.clone());
        let shared = self.shared.clone();
        let service = StreamableHttpService::new(
            move || Ok(SessionHandler::new(shared.clone(), None)),
            sessions.clone(),
            config,
        );
        let direct = direct::Direct {
            shared: self.shared.clone(),
            rmcp: service,
            sessions: sessions.clone(),
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            origins: origins.iter().map(|o| o.to_ascii_lowercase()).collect(),
            refused_origins: Default::default(),
            replays: Default::default(),
        };
        let gate = Arc::new(auth::Gate::new(
            self.shared.tokens.clone(),
            self.shared.verifier.clone(),
            sessions.clone(),
        ));
        let allowed: Arc<[String]> = hosts.clone().into();
        let mut router = Router::new()
            .route(MCP_PATH, any(direct::endpoint))
            .route_layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let allowed = allowed.clone();
                    async move {
                        let host = request
                            .headers()
                            .get(axum::http::header::HOST)
                            .and_then(|v| v.to_str().ok());
                        if host.is_some_and(|h| super::admin::host_allowed(&allowed, h)) {
                            return next.run(request).await;
                        }
                        (
                            axum::http::StatusCode::FORBIDDEN,
                            format!("Forbidden: {}", host_refusal(host)),
                        )
                            .into_response()
                    }
                },
            ))
            // Unknown paths answer behind the token check too (401 before 404), saying where
            // the endpoint is: a client configured without `/mcp` (or with the legacy
            // `/sse`) would show an empty 404 as a bare failure.
            .fallback(|| async {
                (
                    axum::http::StatusCode::NOT_FOUND,
                    format!(
                        "Not Found: the MCP endpoint is {MCP_PATH} (streamable HTTP; Quiver does not serve the legacy SSE transport at /sse)"
                    ),
                )
            })
            .with_state(Arc::new(direct))
            .layer(axum::middleware::from_fn_with_state(
                gate,
                auth::require_token,
            ))
            // The probes, after the token layer: they need none.
            .merge(health::router(self.shared.clone()))
            // The admin endpoints have a token of their own.
            .merge(super::admin::router(&self.shared, &hosts));
        // The Protected Resource Metadata is public: it is how a client without a token
        // finds where to get one.
        if let Some(oidc) = &self.shared.options.auth.oidc {
            router = router.merge(super::oidc::router(Arc::new(oidc.clone())));
        }
        router
    }

    /// Serves the MCP endpoint on `listener` until the shutdown token is cancelled, then
    /// stops accepting, lets open connections finish (their streams are closed and their
    /// calls cancelled) and returns. HTTP/1.1 (hyper), with `TCP_NODELAY` on every accepted
    /// socket, a time limit on each request's head (which also closes idle kept-alive
    /// connections) and on its body.
    pub async fn serve_http(&self, listener: TcpListener) -> Result<(), ServeError> {
        let addr = listener.local_addr()?;
        let router = self.router(addr);
        let shutdown = self.shared.shutdown.clone();
        let mut http = hyper::server::conn::http1::Builder::new();
        // A connection that sends nothing, or half a head, is closed after the head timeout
        // (before, it was held forever, and enough of them used up the file descriptors).
        http.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.shared.options.header_read_timeout);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        loop {
            let tcp = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(e) if is_connection_error(&e) => continue,
                    // Out of file descriptors, most likely: the open connections must end
                    // first (their head timeout sees to idle ones).
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed; trying again in 1 s");
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                            () = shutdown.cancelled() => break,
                        }
                    }
                },
                () = shutdown.cancelled() => break,
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
            let service = hyper_util::service::TowerToHyperService::new(router.clone());
            let conn = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::trace!(error = %e, "connection ended with an error");
                }
            });
        }
        drop(listener);
        graceful.shutdown().await;
        Ok(())
    }
}

/// Whether a `Host` authority names a port (`name:7345`, `name:*`, `[::1]:7345`).
pub(crate) fn has_port(host: &str) -> bool {
    host.rsplit_once(']')
        .map_or(host, |(_, rest)| rest)
        .contains(':')
}

/// An accept error that concerns one connection only (the next accept may succeed).
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads until the server closes the connection; what it sent before.
    async fn until_closed(socket: &mut tokio::net::TcpStream) -> String {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        // A hang guard, not a timing check: the limits under test are 300 ms.
        let read = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => all.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        assert!(read.is_ok(), "the connection was never closed");
        String::from_utf8_lossy(&all).into_owned()
    }

    /// A connection that sends half a head, a kept-alive one left idle, and a request whose
    /// body never comes are all closed after their time limit (each was held forever), and
    /// the server goes on serving.
    #[tokio::test]
    async fn slow_and_idle_connections_are_closed() {
        let server = super::super::test_server(
            Arc::new(quiver_registry::Catalog::new()),
            super::super::ServerOptions::default()
                .with_http_timeouts(Duration::from_millis(300), Duration::from_millis(300)),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = server.shutdown_token();
        let serving = tokio::spawn(async move { server.serve_http(listener).await });
        let host = format!("Host: {addr}\r\n");

        let mut half_head = tokio::net::TcpStream::connect(addr).await.unwrap();
        half_head
            .write_all(format!("POST /mcp HTTP/1.1\r\n{host}").as_bytes())
            .await
            .unwrap();
        until_closed(&mut half_head).await;

        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        idle.write_all(format!("GET /healthz HTTP/1.1\r\n{host}\r\n").as_bytes())
            .await
            .unwrap();
        let answered = until_closed(&mut idle).await;
        assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");

        let mut half_body = tokio::net::TcpStream::connect(addr).await.unwrap();
        half_body
            .write_all(
                format!(
                    "POST /mcp HTTP/1.1\r\n{host}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let answered = until_closed(&mut half_body).await;
        assert!(!answered.contains("HTTP/1.1 200"), "{answered}");

        let mut fresh = tokio::net::TcpStream::connect(addr).await.unwrap();
        fresh
            .write_all(
                format!("GET /healthz HTTP/1.1\r\n{host}Connection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        assert!(until_closed(&mut fresh).await.starts_with("HTTP/1.1 200"));
        shutdown.cancel();
        serving.await.unwrap().unwrap();
    }

    /// A tool that never finishes (the dispatcher answers its cancellation).
    struct Hang(quiver_contract::ToolSpec);

    #[async_trait::async_trait]
    impl quiver_contract::Tool for Hang {
        fn spec(&self) -> &quiver_contract::ToolSpec {
            &self.0
        }
        async fn call(
            &self,
            _input: serde_json::Value,
            ctx: &quiver_contract::CallContext,
        ) -> quiver_contract::ToolResult {
            let _ = ctx;
            std::future::pending::<()>().await;
            Ok(quiver_contract::Envelope::text("never"))
        }
    }

    /// A call on rmcp's path (a stateless 2026-07-28 request) when the server shuts down
    /// gets its answer, the call's cancellation, before rmcp closes: it got a 500 with
    /// rmcp's "no response message received from handler".
    #[tokio::test]
    async fn a_call_in_flight_at_shutdown_is_answered() {
        let catalog = Arc::new(quiver_registry::Catalog::new());
        catalog
            .register(Arc::new(Hang(
                quiver_contract::ToolSpec::new("hang", "Runs until cancelled.").read_only(),
            )))
            .unwrap();
        let server = super::super::test_server(catalog, super::super::ServerOptions::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = server.shutdown_token();
        let serving = tokio::spawn(async move { server.serve_http(listener).await });
        let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"hang","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"}}}}"#;
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        socket
            .write_all(
                format!(
                    "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: hang\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        // The call is running (nothing comes back until it ends).
        let mut first = [0u8; 1];
        assert!(
            tokio::time::timeout(Duration::from_millis(300), socket.read(&mut first))
                .await
                .is_err(),
            "answered before the shutdown"
        );
        shutdown.cancel();
        let answer = until_closed(&mut socket).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.contains(r#""id":7"#) && answer.contains("was cancelled"),
            "{answer}"
        );
        serving.await.unwrap().unwrap();
    }

    #[test]
    fn a_host_names_its_port_or_not() {
        assert!(has_port("quiver.example:7345"));
        assert!(has_port("quiver.example:*"));
        assert!(has_port("[::1]:7345"));
        assert!(!has_port("quiver.example"));
        assert!(!has_port("[::1]"));
    }

    #[test]
    fn loopback_listeners_accept_the_loopback_names() {
        let a = allowed_authorities("127.0.0.1:7345".parse().unwrap());
        assert_eq!(a, ["127.0.0.1:7345", "localhost:7345", "[::1]:7345"]);
        let b = allowed_authorities("10.0.0.5:80".parse().unwrap());
        assert_eq!(b, ["10.0.0.5:80"]);
    }
}
