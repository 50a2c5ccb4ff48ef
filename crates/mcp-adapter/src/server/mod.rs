//! The MCP server: one [`McpServer`] per process, serving the surface of whichever working
//! set each request names (the `key` module says how a request picks its working-set key).

mod admin;
mod auth;
mod batch;
mod call;
mod channel;
mod content_wire;
mod direct;
pub(crate) mod from_contract;
#[cfg(test)]
mod fuzz;
mod handler;
mod health;
mod http;
mod invalid;
mod key;
mod listen;
mod model_caps;
mod oidc;
mod prompts;
mod refusals;
mod rounds;
mod scope;
mod stdio;
mod watch;

use std::{sync::Arc, time::Duration};

use quiver_contract::{Mode, RenderOptions};
use quiver_registry::Dispatcher;
use quiver_surface::Surface;
use tokio_util::sync::CancellationToken;

pub use admin::{AdminToken, MetricsExposition, Reload};
pub use auth::{AuthError, AuthHandle, InboundAuth, InboundToken};
pub use oidc::{ClaimRule, OidcAuth};
// The content port lives in the crate's floor (the client implements it); the server's
// modules name it through here, as does the public path `server::ContentSource`.
use crate::content;
pub use crate::content::{ContentError, ContentOffer, ContentSource, ListChange, ListChanged};
pub use health::Readiness;
pub use http::allowed_authorities;
pub use key::{CONVERSATION_HEADER, CONVERSATION_META};
pub use model_caps::{MODEL_CAPABILITIES_HEADER, MODEL_CAPABILITIES_META};
pub use prompts::{LocalPrompts, PROMPT_ARGUMENT};

/// How the server behaves; the host fills it from its configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerOptions {
    /// The mode of a session whose token names none.
    pub default_mode: Mode,
    /// Bounds of the rendered text content.
    pub render: RenderOptions,
    /// How often a running call reports progress to a client that sent a progress token.
    pub progress_interval: Duration,
    /// Inbound bearer tokens (HTTP only); empty means no authentication.
    pub auth: InboundAuth,
    /// Extra `Host` authorities accepted besides the listen address (for a public name).
    pub extra_allowed_hosts: Vec<String>,
    /// How long a 2026-07-28 call that asked its client for input (an `InputRequiredResult`)
    /// waits for the client's next round before it is cancelled.
    pub input_wait: Duration,
    /// The most HTTP sessions open at once: an `initialize` beyond it is refused (503) until
    /// sessions end (DELETE, or rmcp's 5-minute idle timeout).
    pub max_sessions: usize,
    /// How long a client has to send a request's head, on a new or an idle kept-alive
    /// connection, before the connection is closed (30 s).
    pub header_read_timeout: Duration,
    /// How long a client has to send a request's body once its head is in (30 s).
    pub body_timeout: Duration,
    /// The token of the admin endpoints (`POST /admin/reload`); none: they do not exist.
    pub admin_token: Option<AdminToken>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            default_mode: Mode::Chat,
            render: RenderOptions::default(),
            progress_interval: Duration::from_secs(1),
            auth: InboundAuth::default(),
            extra_allowed_hosts: Vec::new(),
            input_wait: Duration::from_secs(600),
            max_sessions: 1000,
            header_read_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            admin_token: None,
        }
    }
}

impl ServerOptions {
    /// Sets the default mode.
    pub fn with_default_mode(mut self, mode: Mode) -> Self {
        self.default_mode = mode;
        self
    }

    /// Sets the inbound tokens.
    pub fn with_auth(mut self, auth: InboundAuth) -> Self {
        self.auth = auth;
        self
    }

    /// Sets the progress interval.
    pub fn with_progress_interval(mut self, every: Duration) -> Self {
        self.progress_interval = every;
        self
    }

    /// Sets how long a call waiting for its client's input (2026-07-28 rounds) is kept.
    pub fn with_input_wait(mut self, wait: Duration) -> Self {
        self.input_wait = wait;
        self
    }

    /// Sets the time limits on a request's head (also the idle limit of a kept-alive
    /// connection) and on its body.
    pub fn with_http_timeouts(mut self, head: Duration, body: Duration) -> Self {
        self.header_read_timeout = head;
        self.body_timeout = body;
        self
    }

    /// Sets the most HTTP sessions open at once.
    pub fn with_max_sessions(mut self, max: usize) -> Self {
        self.max_sessions = max;
        self
    }

    /// Sets the token of the admin endpoints.
    pub fn with_admin_token(mut self, token: AdminToken) -> Self {
        self.admin_token = Some(token);
        self
    }

    /// Accepts another `Host` authority (`name` or `name:port`).
    pub fn with_allowed_host(mut self, authority: impl Into<String>) -> Self {
        self.extra_allowed_hosts.push(authority.into());
        self
    }
}

/// A harness fault of the server (never a tool's failure, which is a result).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The listener or the connection failed.
    #[error("the MCP transport failed: {0}")]
    Io(#[from] std::io::Error),
    /// The MCP session could not start (stdio).
    #[error("the MCP session could not start: {0}")]
    Initialize(String),
}

pub(crate) struct Shared {
    pub(crate) surface: Arc<Surface>,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) options: ServerOptions,
    pub(crate) shutdown: CancellationToken,
    /// Held while an `initialize` over HTTP is checked against the session limit and
    /// handed to rmcp.
    pub(crate) opening: tokio::sync::Mutex<()>,
    /// Where working sets persist; a key seen for the first time is restored from it.
    pub(crate) sessions: Option<Arc<dyn quiver_surface::ports::SessionStore>>,
    /// The execution log: which tools a restored key has called (`requires_prior`).
    pub(crate) calls: Option<Arc<dyn quiver_registry::store::CallLog>>,
    /// Where resources, prompts and completions come from (none: tools only).
    pub(crate) content: Option<Arc<dyn ContentSource>>,
    /// The per-session MCP servers (none: no server runs per session).
    pub(crate) session_servers: Option<Arc<dyn crate::SessionServers>>,
    /// Each open MCP session's end, by session id (`McpSession::ended`).
    pub(crate) session_ends:
        std::sync::Mutex<std::collections::HashMap<Arc<str>, CancellationToken>>,
    /// The HTTP sessions the direct path may answer.
    pub(crate) direct: direct::DirectSessions,
    /// 2026-07-28 calls waiting for their client's input.
    pub(crate) rounds: Arc<rounds::Rounds>,
    /// What `GET /readyz` checks besides shutdown (none: ready while serving).
    pub(crate) readiness: Option<Arc<dyn Readiness>>,
    /// What `POST /admin/reload` asks (none: no such endpoint).
    pub(crate) reload: Option<Arc<dyn Reload>>,
    /// The inbound tokens in force (the options' at start, replaced by a reload).
    pub(crate) tokens: auth::AuthHandle,
    /// What verifies `[auth.oidc]` access tokens (none: only the configured tokens).
    pub(crate) verifier: Option<Arc<dyn quiver_registry::identity::TokenVerifier>>,
    /// What `GET /metrics` serves (none: no such endpoint).
    pub(crate) metrics: Option<Arc<dyn MetricsExposition>>,
    /// rmcp's HTTP sessions, once a router is built (what `GET /metrics` counts).
    pub(crate) http_sessions: std::sync::Mutex<
        Option<Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>>,
    >,
    /// The admin web page's routes (none: no page), mounted with an admin token only.
    pub(crate) admin_page: std::sync::Mutex<Option<axum::Router>>,
}

impl Shared {
    /// The MCP session `id` with its end, when it is open.
    pub(crate) fn mcp_session(&self, id: &Arc<str>) -> Option<quiver_contract::McpSession> {
        let ended = crate::sync::lock(&self.session_ends).get(id).cloned()?;
        Some(quiver_contract::McpSession::new(id.clone(), ended))
    }

    /// Starts the session's per-session servers it does not run yet (see
    /// `SessionServers::open`), and returns `capabilities` less the per-session tools the
    /// session must not see (`SessionServers::hidden_tools`); nothing without any, or
    /// outside an MCP session.
    pub(crate) async fn open_session_servers(
        &self,
        session: Option<&quiver_contract::McpSession>,
        principal: Option<&str>,
        client: Option<Arc<dyn quiver_contract::ClientChannel>>,
        capabilities: &Arc<quiver_contract::Capabilities>,
    ) -> Arc<quiver_contract::Capabilities> {
        if let (Some(servers), Some(session)) = (&self.session_servers, session)
            && servers.any()
        {
            servers.open(session, principal, client).await;
            let hidden = servers.hidden_tools(&session.id);
            if !hidden.is_empty() {
                let mut caps = (**capabilities).clone();
                caps.denied_tools.extend(hidden);
                return Arc::new(caps);
            }
        }
        capabilities.clone()
    }

    /// The MCP sessions open over HTTP now (0 before a router is built, and on stdio).
    pub(crate) async fn http_sessions_open(&self) -> usize {
        let sessions = crate::sync::lock(&self.http_sessions).clone();
        match sessions {
            Some(s) => s.sessions.read().await.len(),
            None => 0,
        }
    }

    /// Keeps the key's session in memory for the request (the guard) and restores its
    /// working set if the key is seen for the first time (once per key per process, again
    /// after the surface dropped it).
    pub(crate) async fn enter(
        &self,
        key: &quiver_surface::SessionKey,
    ) -> quiver_surface::SessionPin {
        let pin = self.surface.pin(key.as_arc());
        self.restore_once(key.as_arc()).await;
        pin
    }

    /// Restores the working set of a key seen for the first time (once per key per process).
    async fn restore_once(&self, key: &Arc<str>) {
        let Some(store) = &self.sessions else { return };
        if !self.surface.restore_once(key, &**store).await {
            // Restored before; but with a store several servers share, the conversation's
            // last calls may have gone to another server: the set it stored since (its
            // evictions included) is taken. A session-era MCP session is bound to this
            // server and has nothing elsewhere.
            if store.shared()
                && !quiver_surface::SessionKey::parse(key).is_session_bound()
                && let Err(e) = self.surface.take_stored(key, &**store).await
            {
                tracing::warn!(session = %key, error = %e, "could not read the conversation's stored working set");
            }
            return;
        }
        if let Some(log) = &self.calls
            && let Err(e) = self.dispatcher.restore_called(key, &**log).await
        {
            tracing::warn!(session = %key, error = %e, "could not read the key's earlier calls");
        }
    }
}

/// A server over `catalog` with the default surface, for this module's tests.
#[cfg(test)]
pub(crate) fn test_server(
    catalog: Arc<quiver_registry::Catalog>,
    options: ServerOptions,
) -> McpServer {
    let surface = Surface::new(
        catalog.clone(),
        quiver_surface::SurfaceConfig::default(),
        Arc::new(quiver_surface::MemoryUsage::new([])),
    )
    .expect("the default surface config is valid");
    McpServer::new(surface, Dispatcher::new(catalog), options)
}

/// [`test_server`] whose dispatcher records every call in the recorder returned.
#[cfg(test)]
pub(crate) fn test_server_recorded(
    catalog: Arc<quiver_registry::Catalog>,
    options: ServerOptions,
) -> (McpServer, Arc<quiver_registry::MemoryRecorder>) {
    let recorder = Arc::new(quiver_registry::MemoryRecorder::default());
    let surface = Surface::new(
        catalog.clone(),
        quiver_surface::SurfaceConfig::default(),
        Arc::new(quiver_surface::MemoryUsage::new([])),
    )
    .expect("the default surface config is valid");
    let dispatcher = Dispatcher::builder(catalog)
        .recorder(recorder.clone())
        .build();
    (McpServer::new(surface, dispatcher, options), recorder)
}

/// The MCP server over a surface and a dispatcher. Cheap to clone.
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// A server for the sessions of `surface`, calling through `dispatcher`.
    pub fn new(surface: Arc<Surface>, dispatcher: Dispatcher, options: ServerOptions) -> Self {
        let input_wait = options.input_wait;
        let tokens = auth::AuthHandle::new(&options.auth);
        McpServer {
            shared: Arc::new(Shared {
                surface,
                dispatcher,
                options,
                shutdown: CancellationToken::new(),
                opening: tokio::sync::Mutex::new(()),
                sessions: None,
                calls: None,
                content: None,
                session_servers: None,
                session_ends: std::sync::Mutex::new(std::collections::HashMap::new()),
                direct: direct::DirectSessions::default(),
                rounds: Arc::new(rounds::Rounds::new(input_wait)),
                readiness: None,
                reload: None,
                tokens,
                verifier: None,
                metrics: None,
                http_sessions: std::sync::Mutex::new(None),
                admin_page: std::sync::Mutex::new(None),
            }),
        }
    }

    /// Restores each session's working set from `store` the first time its key is seen
    /// (the surface mirrors changes into the same store).
    pub fn with_session_store(
        mut self,
        store: Arc<dyn quiver_surface::ports::SessionStore>,
    ) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.sessions = Some(store);
        }
        self
    }

    /// Reads which tools a key has called from `log` when the key is first seen (after a
    /// restart), so `requires_prior` policy rules hold across restarts.
    pub fn with_call_log(mut self, log: Arc<dyn quiver_registry::store::CallLog>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.calls = Some(log);
        }
        self
    }

    /// Serves resources, prompts and completions from `source` (for `quiver serve`, the
    /// MCP client passing its upstreams through), advertising what it offers.
    pub fn with_content(mut self, source: Arc<dyn ContentSource>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.content = Some(source);
        }
        self
    }

    /// Starts and stops the per-session MCP servers (see [`SessionServers`](crate::SessionServers)):
    /// each session's first `tools/list` or `tools/call` opens them, its end stops them.
    pub fn with_session_servers(mut self, servers: Arc<dyn crate::SessionServers>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.session_servers = Some(servers);
        }
        self
    }

    /// What `GET /readyz` checks (see [`Readiness`]); without it the server is ready while it
    /// serves.
    pub fn with_readiness(mut self, readiness: Arc<dyn Readiness>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.readiness = Some(readiness);
        }
        self
    }

    /// Verifies the access tokens of `[auth.oidc]` with `verifier` (the OIDC adapter's).
    pub fn with_token_verifier(
        mut self,
        verifier: Arc<dyn quiver_registry::identity::TokenVerifier>,
    ) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.verifier = Some(verifier);
        }
        self
    }

    /// The inbound tokens in force, for the host to replace on a reload.
    pub fn auth_handle(&self) -> auth::AuthHandle {
        self.shared.tokens.clone()
    }

    /// Serves `POST /admin/reload` with `reload`, behind the admin token of the options
    /// (without one there is no such endpoint).
    pub fn with_reload(mut self, reload: Arc<dyn Reload>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.reload = Some(reload);
        }
        self
    }

    /// Serves `GET /metrics` with `metrics`: behind the admin token of the options on the
    /// MCP listener (without one, not there), and on a listener of its own
    /// ([`McpServer::serve_metrics`]).
    pub fn with_metrics(mut self, metrics: Arc<dyn MetricsExposition>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.metrics = Some(metrics);
        }
        self
    }

    /// Serves the admin web page's routes (`/admin`, `/admin/...`) on the HTTP listener,
    /// behind the `Host` and `Origin` checks of the MCP endpoint, when the options carry an
    /// admin token (without one, they are not mounted). The page checks its own login.
    pub fn with_admin_page(self, page: axum::Router) -> Self {
        *crate::sync::lock(&self.shared.admin_page) = Some(page);
        self
    }

    /// Cancelling this token stops the server: no new requests, in-flight calls cancelled,
    /// open streams closed; `serve_http` and `serve_stdio` then return.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    /// Serves MCP over stdin and stdout until the client closes them or shutdown.
    pub async fn serve_stdio(&self) -> Result<(), ServeError> {
        // One connection, one session: a key of its own (`mcp:stdio:<id>`), so a later
        // process neither restores this one's working set nor counts its calls for
        // `requires_prior`.
        let session: Arc<str> = format!("stdio:{}", uuid::Uuid::new_v4().simple()).into();
        let handler = handler::SessionHandler::new(self.shared.clone(), Some(session.clone()));
        // A client closes stdin to shut a stdio server down (MCP lifecycle): the calls still
        // in flight a moment later are cancelled, as on SIGTERM, rather than left running
        // through rmcp's drain while the host stops their upstreams under them. The moment
        // lets a piped script's last quick requests be answered.
        let ct = self.shared.shutdown.child_token();
        // A `tools/call` the transport refuses (not JSON, nested too deeply, an id in
        // flight) has its row in the session, as one the handler refuses.
        // Their recording is awaited before this returns: a client that sends one bad call
        // and closes stdin at once still gets its row.
        let shared = self.shared.clone();
        let fixed = session.clone();
        let recording = tokio_util::task::TaskTracker::new();
        let refused: stdio::RefusedCalls = Arc::new({
            let recording = recording.clone();
            move |call, refusal| {
                let (shared, fixed, refusal) = (shared.clone(), fixed.clone(), refusal.clone());
                recording.spawn(async move {
                    refusals::record_transport_refusal(
                        &shared,
                        None,
                        Some(&*fixed),
                        call,
                        &refusal,
                    )
                    .await;
                });
            }
        });
        let transport =
            stdio::LineTransport::new(tokio::io::stdin(), tokio::io::stdout(), ct.clone())
                .with_refused_calls(refused);
        let served = Self::run_stdio(handler, transport, ct).await;
        recording.close();
        recording.wait().await;
        served
    }

    /// Serves `handler` on the stdio `transport` until the session ends or `ct` is
    /// cancelled.
    async fn run_stdio(
        handler: handler::SessionHandler,
        transport: stdio::LineTransport<tokio::io::Stdin, tokio::io::Stdout>,
        ct: tokio_util::sync::CancellationToken,
    ) -> Result<(), ServeError> {
        use rmcp::ServiceExt;
        let running = match handler.serve_with_ct(transport, ct.clone()).await {
            Ok(running) => running,
            // Shut down before the client's handshake finished (a SIGTERM while a
            // client connects, or one that has only pinged): as clean a stop as after it.
            Err(_) if ct.is_cancelled() => return Ok(()),
            // The client closed stdin before its handshake finished (it gave up, or only
            // probed the command): the end of the session, not a fault. Desktop clients
            // show a non-zero exit as a crash.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(when)) => {
                tracing::info!("the MCP client closed stdin before the session started ({when})");
                return Ok(());
            }
            Err(e) => return Err(ServeError::Initialize(e.to_string())),
        };
        let _ = running.waiting().await;
        Ok(())
    }
}
