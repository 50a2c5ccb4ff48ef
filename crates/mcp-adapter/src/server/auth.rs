//! Inbound bearer tokens: the config the host feeds, and the check every HTTP request passes
//! before it reaches the MCP service.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use quiver_contract::{Capabilities, Mode};
use serde::{Deserialize, Serialize};

use quiver_registry::identity::{TokenError, TokenVerifier};

use super::oidc::{OidcAuth, Rules};
use crate::sync::lock;

/// The inbound bearer tokens. Empty: every request is anonymous and allowed.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct InboundAuth {
    /// The accepted tokens.
    #[serde(default)]
    pub tokens: Vec<InboundToken>,
    /// Access tokens from an OpenID provider (`[auth.oidc]`), beside the tokens.
    #[serde(default)]
    pub oidc: Option<OidcAuth>,
}

impl InboundAuth {
    /// Accepts these tokens.
    pub fn new(tokens: Vec<InboundToken>) -> Self {
        InboundAuth { tokens, oidc: None }
    }

    /// Accepts access tokens from an OpenID provider too.
    pub fn with_oidc(mut self, oidc: OidcAuth) -> Self {
        self.oidc = Some(oidc);
        self
    }

    /// Checks the token names: non-empty and unique, and every secret non-empty. An error
    /// names the token by its place in the list (`tokens[1]`) and its name.
    pub fn validate(&self) -> Result<(), AuthError> {
        if let Some(oidc) = &self.oidc {
            oidc.validate()?;
        }
        let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut secrets: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (i, t) in self.tokens.iter().enumerate() {
            if t.name.is_empty() {
                return Err(AuthError::Invalid(format!(
                    "tokens[{i}] has an empty `name`: give each token a name (it is logged and recorded with every call)"
                )));
            }
            if t.token.is_empty() {
                return Err(AuthError::Invalid(format!(
                    "tokens[{i}] (`{}`) has an empty `token`: give it the bearer secret, e.g. `token = \"${{env:QUIVER_TOKEN}}\"`",
                    t.name.escape_debug()
                )));
            }
            // A client's bearer credential is read trimmed, and a header cannot carry a
            // control character: such a secret could never be presented.
            if t.token.trim() != t.token || t.token.chars().any(|c| !(' '..='~').contains(&c)) {
                return Err(AuthError::Invalid(format!(
                    "tokens[{i}] (`{}`) has whitespace at its start or end, or a character that is not printable ASCII, in its `token` (a newline read from a file or an environment variable?): an `Authorization` header cannot carry it, so no client could ever present it; remove it",
                    t.name.escape_debug()
                )));
            }
            // The name is part of working-set keys (`conv:<name>:<value>`): a `:` in it
            // would let two tokens' keys meet.
            if t.name.contains(':') || t.name.chars().any(char::is_control) {
                return Err(AuthError::Invalid(format!(
                    "tokens[{i}]: the name `{}` may not contain `:` or control characters (it is part of working-set keys); rename it, e.g. to `{}`",
                    t.name.escape_debug(),
                    t.name
                        .chars()
                        .map(|c| if c == ':' || c.is_control() { '-' } else { c })
                        .collect::<String>()
                )));
            }
            if let Some(first) = seen.insert(t.name.as_str(), i) {
                return Err(AuthError::Invalid(format!(
                    "tokens[{i}]: the name `{}` is already used by tokens[{first}]; every token needs its own name",
                    t.name
                )));
            }
            // The first token with a secret would win every request: the second one's
            // allow-list, mode and tenant would never apply.
            if let Some(first) = secrets.insert(t.token.as_str(), i) {
                return Err(AuthError::Invalid(format!(
                    "tokens[{i}] (`{}`) has the same secret as tokens[{first}] (`{}`): a request could only ever be the first; give each token its own secret",
                    t.name, self.tokens[first].name
                )));
            }
        }
        Ok(())
    }
}

/// One inbound token: who it is, and what it may do.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct InboundToken {
    /// The principal's name (logged, recorded, and the fallback working-set key).
    pub name: String,
    /// The bearer secret.
    pub token: String,
    /// Tool-name patterns the token may call and find (`*` anywhere); `None`: all.
    #[serde(default)]
    pub allowed_tools: Option<Vec<String>>,
    /// Upstream servers (name patterns, `*` anywhere) whose passed-through resources and
    /// prompts the token may list, read, subscribe to and complete. When absent: every
    /// server's for a token without `allowed_tools`, none for a token with it (a token
    /// restricted to some tools reads no resource until this names the servers).
    #[serde(default)]
    pub allowed_servers: Option<Vec<String>>,
    /// The session mode for this token's requests; the server default when absent.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// The tenant the token's calls run for.
    #[serde(default)]
    pub tenant: Option<String>,
    /// May propose custom tools (`create_custom_tool`, which stores them as drafts for an
    /// operator to review); `false` by default.
    #[serde(default)]
    pub admin: bool,
    /// The capabilities of the model behind this token (for example `vision`): a tool that
    /// `requires` one the token does not declare is never offered to it.
    #[serde(default)]
    pub model_capabilities: Vec<String>,
    /// Tool-name patterns a policy refuses this token every call of (not a config key: the
    /// host fills it from the deny rules): never listed, found, described or suggested to
    /// it. See `Capabilities::denied_tools`.
    #[serde(skip)]
    pub denied_tools: Vec<String>,
}

impl InboundToken {
    /// A token with no restriction.
    pub fn new(name: impl Into<String>, token: impl Into<String>) -> Self {
        InboundToken {
            name: name.into(),
            token: token.into(),
            allowed_tools: None,
            allowed_servers: None,
            mode: None,
            tenant: None,
            admin: false,
            model_capabilities: Vec::new(),
            denied_tools: Vec::new(),
        }
    }

    /// Restricts the token to these tool-name patterns.
    pub fn with_allowed_tools(mut self, patterns: Vec<String>) -> Self {
        self.allowed_tools = Some(patterns);
        self
    }

    /// Restricts the token's resources and prompts to these servers' (name patterns).
    pub fn with_allowed_servers(mut self, patterns: Vec<String>) -> Self {
        self.allowed_servers = Some(patterns);
        self
    }

    /// The servers whose resources and prompts the token reaches (see
    /// [`InboundToken::allowed_servers`]); `None`: all.
    pub fn content_servers(&self) -> Option<Vec<String>> {
        match (&self.allowed_servers, &self.allowed_tools) {
            (Some(s), _) => Some(s.clone()),
            (None, Some(_)) => Some(Vec::new()),
            (None, None) => None,
        }
    }

    /// Sets the token's mode.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// What the token's requests may use: its tools, its servers' resources and prompts,
    /// less its `denied_tools` (which the host fills from the deny rules, see
    /// `Config::inbound_auth`; empty until then).
    pub fn capabilities(&self) -> Capabilities {
        let mut caps = match &self.allowed_tools {
            Some(p) => Capabilities::all().with_allowed_tools(p.clone()),
            None => Capabilities::all(),
        };
        if let Some(servers) = self.content_servers() {
            caps = caps.with_allowed_servers(servers);
        }
        caps.with_denied_tools(self.denied_tools.clone())
            .with_model(self.model_capabilities.iter().cloned())
    }
}

impl std::fmt::Debug for InboundToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboundToken")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("allowed_tools", &self.allowed_tools)
            .field("allowed_servers", &self.allowed_servers)
            .field("mode", &self.mode)
            .field("tenant", &self.tenant)
            .finish()
    }
}

/// A configuration fault of the inbound tokens.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The token list is not usable.
    #[error("invalid inbound auth: {0}")]
    Invalid(String),
}

/// The authenticated caller of one request, put in the request's extensions.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    pub(crate) name: Arc<str>,
    pub(crate) capabilities: Arc<Capabilities>,
    pub(crate) mode: Option<Mode>,
    pub(crate) tenant: Option<Arc<str>>,
    /// The user and the access token they presented, for an `[auth.oidc]` token (an
    /// upstream that acts for the user is reached with it); `None` for a configured token.
    pub(crate) user: Option<Arc<quiver_contract::UserCredential>>,
}

pub(crate) struct Tokens {
    entries: Vec<(Vec<u8>, Principal)>,
    /// The claim rules and the metadata URL, when `[auth.oidc]` is configured.
    oidc: Option<(Rules, String)>,
}

impl Tokens {
    pub(crate) fn new(auth: &InboundAuth) -> Self {
        let entries = auth
            .tokens
            .iter()
            .map(|t| {
                (
                    t.token.as_bytes().to_vec(),
                    Principal {
                        name: t.name.as_str().into(),
                        capabilities: Arc::new(t.capabilities()),
                        mode: t.mode,
                        tenant: t.tenant.as_deref().map(Into::into),
                        user: None,
                    },
                )
            })
            .collect();
        let oidc = auth
            .oidc
            .as_ref()
            .map(|o| (Rules::new(o), o.metadata_url()));
        Tokens { entries, oidc }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.oidc.is_none()
    }

    /// The principal of a bearer secret; compares every token in constant time.
    fn find(&self, presented: &[u8]) -> Option<&Principal> {
        let mut found = None;
        for (secret, principal) in &self.entries {
            if constant_time_eq(secret, presented) {
                found = Some(principal);
            }
        }
        found
    }
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The inbound tokens in force, shared by the token layer and the host (which replaces
/// them on a reload: the next request is checked against the new ones).
#[derive(Clone)]
pub struct AuthHandle {
    tokens: Arc<std::sync::RwLock<Arc<Tokens>>>,
}

impl std::fmt::Debug for AuthHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthHandle").finish_non_exhaustive()
    }
}

impl AuthHandle {
    pub(crate) fn new(auth: &InboundAuth) -> Self {
        AuthHandle {
            tokens: Arc::new(std::sync::RwLock::new(Arc::new(Tokens::new(auth)))),
        }
    }

    /// Checks `auth` and puts it in force for the next request. Sessions stay bound to the
    /// token that opened them: a session whose token is gone is refused (401).
    pub fn replace(&self, auth: &InboundAuth) -> Result<(), AuthError> {
        auth.validate()?;
        *self
            .tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(Tokens::new(auth));
        Ok(())
    }

    fn current(&self) -> Arc<Tokens> {
        self.tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// What the token layer keeps: the tokens, and which token opened each session.
pub(crate) struct Gate {
    tokens: AuthHandle,
    /// What verifies access tokens from the OpenID provider (`[auth.oidc]`).
    verifier: Option<Arc<dyn TokenVerifier>>,
    /// The token (by name) that opened each session: a session is its token's (the MCP
    /// security guidance binds session ids to the user), so another token's request naming
    /// it is answered as for an unknown session, and cannot read or change its working set,
    /// log under it or end it.
    owners: std::sync::Mutex<std::collections::HashMap<Arc<str>, Arc<str>>>,
    /// Whether a session still exists (ended ones are pruned from `owners`).
    sessions: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
    /// `owners` is pruned when it grows past this.
    prune_at: std::sync::atomic::AtomicUsize,
}

/// `owners` is first pruned at this size, then at twice what is left.
const PRUNE_FLOOR: usize = 256;

impl Gate {
    pub(crate) fn new(
        tokens: AuthHandle,
        verifier: Option<Arc<dyn TokenVerifier>>,
        sessions: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
    ) -> Self {
        Gate {
            tokens,
            verifier,
            owners: std::sync::Mutex::new(std::collections::HashMap::new()),
            sessions,
            prune_at: std::sync::atomic::AtomicUsize::new(PRUNE_FLOOR),
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Arc<str>, Arc<str>>> {
        lock(&self.owners)
    }

    /// Drops the owners of sessions that ended (idle timeout, shutdown) once there are many.
    async fn prune(&self) {
        use std::sync::atomic::Ordering;
        let at = self.prune_at.load(Ordering::Relaxed);
        let ids: Vec<Arc<str>> = {
            let owners = self.owners();
            if owners.len() < at {
                return;
            }
            owners.keys().cloned().collect()
        };
        let mut gone = Vec::new();
        for id in ids {
            let sid: rmcp::transport::common::server_side_http::SessionId = id.clone();
            if !rmcp::transport::streamable_http_server::session::SessionManager::has_session(
                &*self.sessions,
                &sid,
            )
            .await
            .unwrap_or(true)
            {
                gone.push(id);
            }
        }
        let mut owners = self.owners();
        for id in gone {
            owners.remove(&id);
        }
        self.prune_at
            .store((owners.len() * 2).max(PRUNE_FLOOR), Ordering::Relaxed);
    }
}

/// The session id a request names, if any.
fn session_of(headers: &axum::http::HeaderMap) -> Option<Arc<str>> {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(Arc::from)
}

/// Why a request is refused before it runs.
enum Refusal<'a> {
    /// No bearer token.
    Missing,
    /// A token that is neither a configured one nor (with `[auth.oidc]`) a valid access
    /// token; the reason when the verifier gave one.
    Invalid(Option<&'a str>),
    /// A valid access token no `[[auth.oidc.rules]]` entry matches (403).
    NoRule,
    /// The issuer could not be asked (503).
    Unavailable(&'a str),
    /// No token can be checked until the operator fixes `[auth.oidc]` (503, no retry).
    Misconfigured(&'a str),
}

/// The 401 (403, 503) answer: a JSON-RPC error (MCP clients show an error body only when it
/// is one), and a challenge that says, for a token that was presented, why it is not
/// accepted (RFC 6750 §3.1; a request with no token gets the bare challenge). With
/// `[auth.oidc]` the challenge names the Protected Resource Metadata (RFC 9728 §5.1), where a
/// client finds the authorization server.
fn unauthorized(refusal: &Refusal<'_>, metadata: Option<&str>) -> Response {
    let (status, error, description, message) = match refusal {
        Refusal::Missing => (
            StatusCode::UNAUTHORIZED,
            None,
            String::new(),
            if metadata.is_some() {
                "Unauthorized: send `Authorization: Bearer <token>` with an access token from the authorization server the resource metadata names, or a configured inbound token".to_owned()
            } else {
                "Unauthorized: send `Authorization: Bearer <token>` with a configured inbound token".to_owned()
            },
        ),
        Refusal::Invalid(None) => (
            StatusCode::UNAUTHORIZED,
            Some("invalid_token"),
            "the token is not one of the configured inbound tokens".to_owned(),
            "Unauthorized: the bearer token is not one of this server's inbound tokens; send `Authorization: Bearer <token>` with a configured one".to_owned(),
        ),
        Refusal::Invalid(Some(reason)) => (
            StatusCode::UNAUTHORIZED,
            Some("invalid_token"),
            (*reason).to_owned(),
            format!("Unauthorized: {reason}; get a new access token from the authorization server"),
        ),
        Refusal::NoRule => (
            StatusCode::FORBIDDEN,
            Some("insufficient_scope"),
            "no [[auth.oidc.rules]] entry matches the token's claims".to_owned(),
            "Forbidden: the access token is valid, but no [[auth.oidc.rules]] entry of this server matches its claims; ask the operator for access".to_owned(),
        ),
        Refusal::Unavailable(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            String::new(),
            format!("Service Unavailable: the access token could not be checked now ({reason}); try again"),
        ),
        Refusal::Misconfigured(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            String::new(),
            format!("Service Unavailable: this server cannot check access tokens until its operator fixes its settings ({reason}); retrying will not help"),
        ),
    };
    let quoted = |s: &str| s.replace(['"', '\\'], "'");
    let mut params = Vec::new();
    if let Some(error) = error {
        params.push(format!("error=\"{error}\""));
        params.push(format!("error_description=\"{}\"", quoted(&description)));
    }
    if let Some(url) = metadata {
        params.push(format!("resource_metadata=\"{}\"", quoted(url)));
    }
    let challenge = if params.is_empty() {
        "Bearer".to_owned()
    } else {
        format!("Bearer {}", params.join(", "))
    };
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": UNAUTHORIZED_CODE, "message": message},
    });
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if status != StatusCode::SERVICE_UNAVAILABLE
        && let Ok(v) = axum::http::HeaderValue::from_str(&challenge)
    {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// Answers a request with `response` without running it. Its body is read first (up to
/// [`DRAIN_LIMIT`]): answered before a body that arrived after the head, hyper closed the
/// connection under a client that would send its next request on it, with no
/// `Connection: close` to say so (a client retrying with a token then failed to read its
/// answer). A body that cannot be read so is answered with `Connection: close`.
async fn refuse(request: Request, mut response: Response) -> Response {
    if axum::body::to_bytes(request.into_body(), DRAIN_LIMIT)
        .await
        .is_err()
    {
        response.headers_mut().insert(
            header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The most of a refused request's body that is read to keep its connection usable.
const DRAIN_LIMIT: usize = 256 * 1024;

/// The JSON-RPC error code of a 401 (JSON-RPC leaves -32000..-32099 to servers).
const UNAUTHORIZED_CODE: i64 = -32001;

/// The axum middleware: 401 without a valid bearer token when tokens are configured, and a
/// session answered only for the token that opened it.
pub(crate) async fn require_token(
    State(gate): State<Arc<Gate>>,
    mut request: Request,
    next: Next,
) -> Response {
    let tokens = gate.tokens.current();
    if tokens.is_empty() {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    let metadata = tokens.oidc.as_ref().map(|(_, url)| url.as_str());
    let Some(presented) = presented else {
        return refuse(request, unauthorized(&Refusal::Missing, metadata)).await;
    };
    let principal = match tokens.find(presented.as_bytes()) {
        Some(p) => p.clone(),
        None => match (&tokens.oidc, &gate.verifier) {
            (Some((rules, _)), Some(verifier)) => match verifier.verify(presented).await {
                Ok(verified) => match rules.principal(&verified) {
                    Some(mut p) => {
                        p.user = Some(Arc::new(quiver_contract::UserCredential::new(
                            verified.subject.as_str(),
                            presented,
                            verified.expires_at,
                        )));
                        p
                    }
                    None => return refuse(request, unauthorized(&Refusal::NoRule, metadata)).await,
                },
                Err(TokenError::Invalid(reason)) => {
                    tracing::debug!(reason = %reason, "access token refused");
                    let r = Refusal::Invalid(Some(&reason));
                    return refuse(request, unauthorized(&r, metadata)).await;
                }
                Err(TokenError::Misconfigured(reason)) => {
                    tracing::error!("access token not checked: {reason}");
                    let r = Refusal::Misconfigured(&reason);
                    return refuse(request, unauthorized(&r, metadata)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "access token not checked: the issuer is out of reach");
                    let reason = e.to_string();
                    let r = Refusal::Unavailable(&reason);
                    return refuse(request, unauthorized(&r, metadata)).await;
                }
            },
            _ => return refuse(request, unauthorized(&Refusal::Invalid(None), metadata)).await,
        },
    };
    // A 2026-07-28 request's `Mcp-Session-Id` is ignored (it has no session): whose the
    // session is must not matter either (a 404 told a token which ids are live sessions of
    // others).
    let sid = session_of(request.headers())
        .filter(|_| !super::direct::sessionless_post(request.method(), request.headers()));
    if let Some(sid) = &sid
        && gate
            .owners()
            .get(sid)
            .is_some_and(|owner| *owner != principal.name)
    {
        let not_found = (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        return refuse(request, not_found).await;
    }
    let deleting = request.method() == axum::http::Method::DELETE;
    let name = principal.name.clone();
    request.extensions_mut().insert(principal);
    let response = next.run(request).await;
    match sid {
        // A new session: it is this token's.
        None => {
            if let Some(new) = session_of(response.headers()) {
                gate.owners().insert(new, name);
                gate.prune().await;
            }
        }
        Some(sid) if deleting && response.status().is_success() => {
            gate.owners().remove(&sid);
        }
        Some(_) => {}
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_rejects_unknown_fields_and_parses_modes() {
        let ok: InboundAuth = serde_json::from_str(
            r#"{"tokens":[{"name":"ci","token":"s3cret","allowed_tools":["tool_*"],"mode":"agentic","tenant":"acme"}]}"#,
        )
        .unwrap();
        assert_eq!(ok.tokens[0].mode, Some(Mode::Agentic));
        assert!(ok.validate().is_ok());
        assert!(format!("{ok:?}").contains("<redacted>"));
        assert!(!format!("{ok:?}").contains("s3cret"));
        let bad = serde_json::from_str::<InboundAuth>(
            r#"{"tokens":[{"name":"ci","token":"x","scopes":[]}]}"#,
        );
        assert!(bad.is_err());
        let dup = InboundAuth::new(vec![
            InboundToken::new("a", "1"),
            InboundToken::new("a", "2"),
        ]);
        assert!(dup.validate().is_err());
        let colon = InboundAuth::new(vec![InboundToken::new("ci:x", "1")]);
        let e = colon.validate().unwrap_err().to_string();
        assert!(
            e.contains("tokens[0]: the name `ci:x` may not contain `:`") && e.contains("`ci-x`"),
            "{e}"
        );
        let e = dup.validate().unwrap_err().to_string();
        assert!(
            e.contains("tokens[1]: the name `a` is already used by tokens[0]"),
            "{e}"
        );
        let empty = InboundAuth::new(vec![InboundToken::new("ci", "")]);
        let e = empty.validate().unwrap_err().to_string();
        assert!(e.contains("tokens[0] (`ci`) has an empty `token`"), "{e}");
        let shared = InboundAuth::new(vec![
            InboundToken::new("ci", "s3cr3t-xyz"),
            InboundToken::new("ops", "s3cr3t-xyz"),
        ]);
        let e = shared.validate().unwrap_err().to_string();
        assert!(
            e.contains("tokens[1] (`ops`) has the same secret as tokens[0] (`ci`)"),
            "{e}"
        );
        assert!(!e.contains("s3cr3t"), "the secret is never shown: {e}");
        for secret in ["abc\n", " abc", "ab\u{7}c", "abcé"] {
            let padded = InboundAuth::new(vec![InboundToken::new("ci", secret)]);
            let e = padded.validate().unwrap_err().to_string();
            assert!(
                e.contains("tokens[0] (`ci`) has whitespace at its start or end"),
                "{e}"
            );
            assert!(!e.contains("abc"), "the secret is never shown: {e}");
        }
    }

    #[test]
    fn tokens_match_exactly() {
        let tokens = Tokens::new(&InboundAuth::new(vec![InboundToken::new("a", "abc")]));
        assert!(tokens.find(b"abc").is_some());
        assert!(tokens.find(b"abd").is_none());
        assert!(tokens.find(b"ab").is_none());
    }
}
