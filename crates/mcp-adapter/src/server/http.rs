//! Streamable HTTP: rmcp's tower service inside axum, behind the bearer check, with
//! `Host`/`Origin` validation against the listen address; beside it the operator probes
//! (`/healthz`, `/readyz`, see [`health`]).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{Router, routing::any, serve::ListenerExt};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio::net::TcpListener;

use super::{McpServer, ServeError, auth, direct, handler::Handler, health};

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

impl McpServer {
    /// The MCP endpoint (at `/mcp`) for a server listening on `addr`.
    pub fn router(&self, addr: SocketAddr) -> Router {
        let mut hosts = allowed_authorities(addr);
        hosts.extend(self.shared.options.extra_allowed_hosts.iter().cloned());
        let origins: Vec<String> = hosts
            .iter()
            .flat_map(|h| [format!("http://{h}"), format!("https://{h}")])
            .collect();
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts.clone())
            .with_allowed_origins(origins.clone())
            .enforce_origin_validation()
            .with_cancellation_token(self.shared.shutdown.child_token());
        let mut sessions = LocalSessionManager::default();
        // rmcp keeps each completed request stream's replies for a late resumption and scans
        // them on every session event; 60 s of them (its default) made a busy session slower
        // with every call and held their memory. 10 s still covers a client reconnecting
        // after the 3 s retry hint.
        sessions.session_config.completed_cache_ttl = COMPLETED_STREAM_TTL;
        let sessions = Arc::new(sessions);
        let shared = self.shared.clone();
        let service = StreamableHttpService::new(
            move || Ok(Handler::new(shared.clone(), None)),
            sessions.clone(),
            config,
        );
        let direct = direct::Direct {
            shared: self.shared.clone(),
            rmcp: service,
            sessions: sessions.clone(),
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            origins: origins.iter().map(|o| o.to_ascii_lowercase()).collect(),
        };
        let gate = Arc::new(auth::Gate::new(&self.shared.options.auth, sessions.clone()));
        Router::new()
            .route(MCP_PATH, any(direct::endpoint))
            // Unknown paths answer behind the token check too (401 before 404).
            .fallback(|| async { axum::http::StatusCode::NOT_FOUND })
            .with_state(direct)
            .layer(axum::middleware::from_fn_with_state(
                gate,
                auth::require_token,
            ))
            // The probes, after the token layer: they need none.
            .merge(health::router(self.shared.clone()))
    }

    /// Serves the MCP endpoint on `listener` until the shutdown token is cancelled, then
    /// stops accepting, lets open connections finish (their streams are closed and their
    /// calls cancelled) and returns.
    pub async fn serve_http(&self, listener: TcpListener) -> Result<(), ServeError> {
        let addr = listener.local_addr()?;
        let router = self.router(addr);
        let shutdown = self.shared.shutdown.clone();
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        });
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_listeners_accept_the_loopback_names() {
        let a = allowed_authorities("127.0.0.1:7345".parse().unwrap());
        assert_eq!(a, ["127.0.0.1:7345", "localhost:7345", "[::1]:7345"]);
        let b = allowed_authorities("10.0.0.5:80".parse().unwrap());
        assert_eq!(b, ["10.0.0.5:80"]);
    }
}
