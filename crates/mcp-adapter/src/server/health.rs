//! Probes for operators (load balancers, Kubernetes, systemd watchdogs), served beside the
//! MCP endpoint over HTTP: `GET /healthz` answers 200 while the process serves (liveness);
//! `GET /readyz` answers 200 when it can serve calls now and 503 with the reasons when not
//! (readiness: the host's [`Readiness`] checks, e.g. required upstream servers connected, and
//! not shutting down). Both are plain JSON, need no token and are not subject to the `Host`
//! check (a probe names the pod's address), and say nothing beyond server names and state
//! words (never an upstream's own error text).

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use serde_json::json;

use super::Shared;

/// What `GET /readyz` asks the host: why the process cannot serve calls now.
pub trait Readiness: Send + Sync {
    /// The reasons it is not ready, in words an operator acts on; empty when ready.
    fn not_ready(&self) -> Vec<String>;
}

/// The liveness path.
pub(crate) const HEALTH_PATH: &str = "/healthz";
/// The readiness path.
pub(crate) const READY_PATH: &str = "/readyz";

/// The probe routes.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(HEALTH_PATH, get(healthz))
        .route(READY_PATH, get(readyz))
        .with_state(shared)
}

async fn healthz() -> impl IntoResponse {
    probe(StatusCode::OK, json!({"status": "ok"}))
}

async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let mut reasons = Vec::new();
    if shared.shutdown.is_cancelled() {
        reasons.push("shutting down".to_owned());
    }
    if let Some(r) = &shared.readiness {
        reasons.extend(r.not_ready());
    }
    if reasons.is_empty() {
        probe(StatusCode::OK, json!({"status": "ready"}))
    } else {
        probe(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "not ready", "reasons": reasons}),
        )
    }
}

/// A probe answer nobody caches.
fn probe(status: StatusCode, body: serde_json::Value) -> impl IntoResponse {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::body::Body;
    use http_body_util::BodyExt;
    use quiver_registry::Catalog;
    use tower::ServiceExt;

    use super::*;
    use crate::server::{InboundAuth, InboundToken, McpServer, ServerOptions};

    /// A readiness whose answer the test sets.
    #[derive(Default)]
    struct Switch(Mutex<Vec<String>>);

    impl Readiness for Switch {
        fn not_ready(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    fn server(readiness: Arc<Switch>) -> McpServer {
        let auth = InboundAuth::new(vec![InboundToken::new("ops", "secret-token")]);
        let options = ServerOptions::default().with_auth(auth);
        crate::server::test_server(Arc::new(Catalog::new()), options).with_readiness(readiness)
    }

    async fn get(server: &McpServer, path: &str, host: &str) -> (StatusCode, String) {
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let request = axum::http::Request::get(path)
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_probes_answer_without_a_token_and_readiness_follows_the_host() {
        let readiness = Arc::new(Switch::default());
        let server = server(readiness.clone());
        // The MCP endpoint wants the token; the probes do not, whatever the Host.
        for path in [super::super::http::MCP_PATH, "/no-such-path"] {
            let (status, _) = get(&server, path, "127.0.0.1:7345").await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        }
        for host in ["127.0.0.1:7345", "10.1.2.3:7345"] {
            let (status, body) = get(&server, HEALTH_PATH, host).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::OK, r#"{"status":"ok"}"#)
            );
            let (status, body) = get(&server, READY_PATH, host).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::OK, r#"{"status":"ready"}"#)
            );
        }
        *readiness.0.lock().unwrap() = vec!["required MCP server \"git\" is down".into()];
        let (status, body) = get(&server, READY_PATH, "127.0.0.1:7345").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body,
            json!({"status": "not ready", "reasons": ["required MCP server \"git\" is down"]})
        );
        // Liveness does not depend on readiness.
        assert_eq!(
            get(&server, HEALTH_PATH, "127.0.0.1:7345").await.0,
            StatusCode::OK
        );
        // Shutting down is not ready either.
        readiness.0.lock().unwrap().clear();
        server.shutdown_token().cancel();
        let (status, body) = get(&server, READY_PATH, "127.0.0.1:7345").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("shutting down"), "{body}");
    }
}
