//! The operator's endpoints beside the MCP endpoint over HTTP: `POST /admin/reload` asks
//! the host to reload its configuration ([`Reload`]). They exist only when the host gives
//! an admin token (`[admin] token`) and sit behind it (`Authorization: Bearer <token>`,
//! compared in constant time), with the `Host` and `Origin` checks of `/mcp`, so a web
//! page can neither reach them through DNS rebinding nor post to them from another origin.

use std::sync::Arc;

use async_trait::async_trait;
use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::post,
};
use serde_json::{Value, json};

/// What `POST /admin/reload` asks the host: reload the configuration now. `Ok` with what
/// changed; `Err` with why nothing did (the previous state stays).
#[async_trait]
pub trait Reload: Send + Sync {
    /// Reloads; `trigger` says what asked (for the log).
    async fn reload(&self, trigger: &str) -> Result<Value, Value>;
}

/// The admin token: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub(crate) String);

impl AdminToken {
    /// A token; at least 16 characters, as inbound tokens.
    pub fn new(token: impl Into<String>) -> Result<AdminToken, String> {
        let token = token.into();
        if token.chars().count() < 16 {
            return Err("the admin token must be at least 16 characters long".into());
        }
        Ok(AdminToken(token))
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// The reload path.
pub(crate) const RELOAD_PATH: &str = "/admin/reload";

struct Admin {
    token: AdminToken,
    reload: Arc<dyn Reload>,
    /// Accepted `Host` authorities, lower-case (a name with no port takes any port).
    hosts: Vec<String>,
}

/// The admin routes, or none without a token and a host to act.
pub(crate) fn router(
    token: Option<AdminToken>,
    reload: Option<Arc<dyn Reload>>,
    hosts: &[String],
) -> Router {
    let (Some(token), Some(reload)) = (token, reload) else {
        return Router::new();
    };
    let admin = Arc::new(Admin {
        token,
        reload,
        hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
    });
    Router::new()
        .route(RELOAD_PATH, post(reload_now))
        .with_state(admin)
}

/// Whether `authority` (a `Host`, or an origin's host and port) is one of `hosts`.
fn host_allowed(hosts: &[String], authority: &str) -> bool {
    let authority = authority.to_ascii_lowercase();
    let name = match authority.rsplit_once(':') {
        Some((name, port)) if !port.contains(']') => name,
        _ => authority.as_str(),
    };
    hosts
        .iter()
        .any(|h| *h == authority || (!super::http::has_port(h) && h == name))
}

fn answer(status: StatusCode, body: Value) -> axum::response::Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn reload_now(State(admin): State<Arc<Admin>>, headers: HeaderMap) -> impl IntoResponse {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if !text(header::HOST).is_some_and(|h| host_allowed(&admin.hosts, h)) {
        return answer(
            StatusCode::FORBIDDEN,
            json!({"error": "the Host header is not one this server answers to"}),
        );
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let authority = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest.trim_end_matches('/'));
        if !authority.is_some_and(|a| host_allowed(&admin.hosts, a)) {
            return answer(
                StatusCode::FORBIDDEN,
                json!({"error": "a request from another origin cannot use the admin endpoints"}),
            );
        }
    }
    let presented = text(header::AUTHORIZATION)
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !super::auth::constant_time_eq(presented.as_bytes(), admin.token.0.as_bytes()) {
        let mut response = answer(
            StatusCode::UNAUTHORIZED,
            json!({"error": "send the admin token ([admin] token) as `Authorization: Bearer <token>`"}),
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"quiver-admin\""),
        );
        return response;
    }
    match admin.reload.reload("POST /admin/reload").await {
        Ok(done) => answer(StatusCode::OK, done),
        Err(why) => answer(StatusCode::UNPROCESSABLE_ENTITY, why),
    }
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn hosts_match_with_their_port_or_any_port_when_none_is_given() {
        let hosts = vec!["127.0.0.1:7345".to_owned(), "quiver.example".to_owned()];
        for (authority, ok) in [
            ("127.0.0.1:7345", true),
            ("127.0.0.1:7346", false),
            ("QUIVER.example:443", true),
            ("quiver.example", true),
            ("evil.example", false),
            ("127.0.0.1", false),
        ] {
            assert_eq!(host_allowed(&hosts, authority), ok, "{authority}");
        }
    }
}
