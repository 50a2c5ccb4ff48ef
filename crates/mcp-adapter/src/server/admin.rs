//! The operator's endpoints beside the MCP endpoint over HTTP: `POST /admin/reload` asks
//! the host to reload its configuration ([`Reload`]), and `GET /metrics` serves the host's
//! metrics ([`MetricsExposition`]). On the MCP listener they exist only when the host gives
//! an admin token (`[admin] token`) and sit behind it (`Authorization: Bearer <token>`,
//! compared in constant time), with the `Host` and `Origin` checks of `/mcp`, so a web
//! page can neither reach them through DNS rebinding nor post to them from another origin.
//! The admin web page (`/admin`, [`McpServer::with_admin_page`]) is mounted here too, only
//! with an admin token, behind the same `Host` and `Origin` checks; it logs in with that
//! token itself. A listener of its own for `/metrics` ([`McpServer::serve_metrics`]) keeps those checks
//! and asks for no token: it is for a scraper on an address the operator keeps private.

use std::sync::Arc;

use async_trait::async_trait;
use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::{get, post},
};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::{McpServer, ServeError, Shared};

/// What `POST /admin/reload` asks the host: reload the configuration now. `Ok` with what
/// changed; `Err` with why nothing did (the previous state stays).
#[async_trait]
pub trait Reload: Send + Sync {
    /// Reloads; `trigger` says what asked (for the log).
    async fn reload(&self, trigger: &str) -> Result<Value, Value>;
}

/// What `GET /metrics` serves: the host's metrics as text, for example the Prometheus text
/// format.
pub trait MetricsExposition: Send + Sync {
    /// The metrics now; `sessions_open` is the server's own count of the MCP sessions open
    /// over HTTP.
    fn render(&self, sessions_open: usize) -> String;

    /// The `Content-Type` of what [`MetricsExposition::render`] returns.
    fn content_type(&self) -> &'static str;
}

/// The admin token: never printed. Clones share it, so a host that keeps one replaces the
/// token the server checks ([`AdminToken::replace`], a reload's) for the next request.
#[derive(Clone)]
pub struct AdminToken(Arc<std::sync::RwLock<String>>);

impl AdminToken {
    /// A token; at least 16 characters, as inbound tokens.
    pub fn new(token: impl Into<String>) -> Result<AdminToken, String> {
        let token = token.into();
        if token.chars().count() < 16 {
            return Err("the admin token must be at least 16 characters long".into());
        }
        Ok(AdminToken(Arc::new(std::sync::RwLock::new(token))))
    }

    /// Checks the next requests against `with`'s token instead.
    pub fn replace(&self, with: &AdminToken) {
        let new = with.current();
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = new;
    }

    /// Whether `other` holds the same token.
    pub fn same_as(&self, other: &AdminToken) -> bool {
        self.current() == other.current()
    }

    /// Whether `presented` is the token in force now (compared in constant time).
    pub fn matches(&self, presented: &str) -> bool {
        super::auth::constant_time_eq(presented.as_bytes(), self.current().as_bytes())
    }

    /// Whether `fingerprint` ([`quiver_contract::secret_fingerprint`]) is the token in
    /// force now: a login that kept only the fingerprint is checked so.
    pub fn fingerprint_matches(&self, fingerprint: &str) -> bool {
        super::auth::constant_time_eq(
            fingerprint.as_bytes(),
            quiver_contract::secret_fingerprint(&self.current()).as_bytes(),
        )
    }

    fn current(&self) -> String {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// The reload path.
pub(crate) const RELOAD_PATH: &str = "/admin/reload";
/// The metrics path.
pub(crate) const METRICS_PATH: &str = "/metrics";

struct Admin {
    /// None: the endpoints ask for no token (the metrics listener).
    token: Option<AdminToken>,
    shared: Arc<Shared>,
    /// Accepted `Host` authorities, lower-case (a name with no port takes any port).
    hosts: Vec<String>,
}

/// The admin routes of the MCP listener, or none without a token; each route only when the
/// host gives what it serves.
pub(crate) fn router(shared: &Arc<Shared>, hosts: &[String]) -> Router {
    let Some(token) = shared.options.admin_token.clone() else {
        return without_token();
    };
    let mut router = Router::new();
    if shared.reload.is_some() {
        router = router.route(RELOAD_PATH, post(reload_now));
    }
    if shared.metrics.is_some() {
        router = router.route(METRICS_PATH, get(metrics_now));
    }
    let mut router = router.with_state(Arc::new(Admin {
        token: Some(token),
        shared: shared.clone(),
        hosts: lower(hosts),
    }));
    if let Some(page) = crate::sync::lock(&shared.admin_page).clone() {
        let hosts: Arc<[String]> = lower(hosts).into();
        router = router.merge(page.layer(axum::middleware::from_fn_with_state(hosts, guard_page)));
    }
    router
}

/// What `/metrics` answers on the MCP listener without an admin token.
const NO_METRICS: &str = "/metrics is served here only with `[admin] token` set in quiver.toml (read at start; send it as `Authorization: Bearer <token>`), or without a token on a listener of its own: `quiver serve --metrics-listen ADDR`";

/// What `/admin` and its paths answer without an admin token.
const NO_ADMIN: &str = "/admin needs `[admin] token` in quiver.toml (read at start: set it and restart `quiver serve`); without it there is no admin page and no `POST /admin/reload`";

/// The admin paths without an admin token: 404 saying what would open them, whatever the
/// caller sends (no inbound token's 401, which would ask for a token that cannot open them).
fn without_token() -> Router {
    let missing = |text: &'static str| {
        axum::routing::any(move || async move {
            answer(StatusCode::NOT_FOUND, json!({ "error": text }))
        })
    };
    Router::new()
        .route(METRICS_PATH, missing(NO_METRICS))
        .route("/admin", missing(NO_ADMIN))
        .route("/admin/{*rest}", missing(NO_ADMIN))
}

/// The admin page's guard: the `Host` and `Origin` checks of `/mcp` (the page does its
/// own login), so that neither DNS rebinding nor a form on another origin reaches it.
async fn guard_page(
    State(hosts): State<Arc<[String]>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(refused) = host_origin_refusal(&hosts, request.headers()) {
        return refused;
    }
    next.run(request).await
}

fn lower(hosts: &[String]) -> Vec<String> {
    hosts.iter().map(|h| h.to_ascii_lowercase()).collect()
}

impl McpServer {
    /// Serves `GET /metrics` alone on `listener`, with no token (bind it where only the
    /// scraper reaches), until the shutdown token is cancelled. The `Host` and `Origin`
    /// checks are those of the MCP endpoint, for this listener's address.
    pub async fn serve_metrics(&self, listener: TcpListener) -> Result<(), ServeError> {
        let addr = listener.local_addr()?;
        let mut hosts = super::allowed_authorities(addr);
        hosts.extend(self.shared.options.extra_allowed_hosts.iter().cloned());
        let router = Router::new()
            .route(METRICS_PATH, get(metrics_now))
            .with_state(Arc::new(Admin {
                token: None,
                shared: self.shared.clone(),
                hosts: lower(&hosts),
            }));
        let shutdown = self.shared.shutdown.clone();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await?;
        Ok(())
    }
}

/// Whether `authority` (a `Host`, or an origin's host and port) is one of `hosts`.
pub(crate) fn host_allowed(hosts: &[String], authority: &str) -> bool {
    let authority = authority.to_ascii_lowercase();
    let name = match authority.rsplit_once(':') {
        Some((name, port)) if !port.contains(']') => name,
        _ => authority.as_str(),
    };
    hosts.iter().any(|h| {
        let h = h.to_ascii_lowercase();
        h == authority
            || h.strip_suffix(":*") == Some(name)
            || (!super::http::has_port(&h) && h == name)
    })
}

fn answer(status: StatusCode, body: Value) -> axum::response::Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The refusal of a request that fails the `Host` or `Origin` check, if it does.
fn host_origin_refusal(hosts: &[String], headers: &HeaderMap) -> Option<axum::response::Response> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if !text(header::HOST).is_some_and(|h| host_allowed(hosts, h)) {
        return Some(answer(
            StatusCode::FORBIDDEN,
            json!({"error": super::http::host_refusal(text(header::HOST))}),
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let authority = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest.trim_end_matches('/'));
        if !authority.is_some_and(|a| host_allowed(hosts, a)) {
            return Some(answer(
                StatusCode::FORBIDDEN,
                json!({"error": "a request from another origin cannot use the admin endpoints"}),
            ));
        }
    }
    None
}

/// The refusal of a request that fails the `Host`, `Origin` or token check, if it does.
fn refusal(admin: &Admin, headers: &HeaderMap) -> Option<axum::response::Response> {
    if let Some(refused) = host_origin_refusal(&admin.hosts, headers) {
        return Some(refused);
    }
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let token = admin.token.as_ref()?;
    let presented = text(header::AUTHORIZATION)
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if super::auth::constant_time_eq(presented.as_bytes(), token.current().as_bytes()) {
        return None;
    }
    let mut response = answer(
        StatusCode::UNAUTHORIZED,
        json!({"error": "send the admin token ([admin] token) as `Authorization: Bearer <token>`"}),
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"quiver-admin\""),
    );
    Some(response)
}

async fn reload_now(State(admin): State<Arc<Admin>>, headers: HeaderMap) -> impl IntoResponse {
    if let Some(refused) = refusal(&admin, &headers) {
        return refused;
    }
    let Some(reload) = &admin.shared.reload else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match reload.reload("POST /admin/reload").await {
        Ok(done) => answer(StatusCode::OK, done),
        Err(why) => answer(StatusCode::UNPROCESSABLE_ENTITY, why),
    }
}

async fn metrics_now(State(admin): State<Arc<Admin>>, headers: HeaderMap) -> impl IntoResponse {
    if let Some(refused) = refusal(&admin, &headers) {
        return refused;
    }
    let Some(metrics) = &admin.shared.metrics else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let sessions_open = admin.shared.http_sessions_open().await;
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, metrics.content_type())],
        metrics.render(sessions_open),
    )
        .into_response()
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
