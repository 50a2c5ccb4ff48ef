//! The rmcp `ServerHandler`: one per MCP session (2025-era protocols, and stdio) or one per
//! request (2026-07-28, stateless). Every request resolves its scope (working-set key,
//! capabilities, mode) first; the surface and the dispatcher do the rest.

// `logging/setLevel` is deprecated by SEP-2577 but 2025-era clients still send it.
#![allow(deprecated)]

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use quiver_contract::{CallContext, Capabilities, Envelope, ErrKind, Mode};
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, Extensions, Implementation, ListToolsResult,
        LoggingLevel, PaginatedRequestParams, ProgressNotificationParam, RequestMetaObject,
        ServerCapabilities, ServerConfig, SetLevelRequestParams, SubscriptionFilter,
    },
    service::{Peer, RequestContext, SubscriptionContext},
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{
    Shared,
    auth::Principal,
    channel::{self, PeerChannel, ProgressState},
    from_contract,
    key::{CONVERSATION_HEADER, CONVERSATION_META, KeySources, working_set_key},
    watch::Changes,
};

const SESSION_HEADER: &str = "mcp-session-id";

const INSTRUCTIONS: &str = "Quiver serves a working set of tools that grows as you need it. When none of the listed tools fits, call `tool_search` with a few keywords: the tools it finds are added to your tool list (the server sends notifications/tools/list_changed). `describe_tool` returns one tool's full definition.";

/// What one request may see and do.
#[derive(Debug, Clone)]
struct Scope {
    key: Arc<str>,
    capabilities: Arc<Capabilities>,
    mode: Mode,
    principal: Option<Arc<str>>,
    tenant: Option<Arc<str>>,
    /// Whether the key came from the MCP session id (forgotten when the session ends).
    session_bound: bool,
}

/// The state of one handler instance (a session, or a single stateless request).
struct Connection {
    /// The working-set keys this connection's requests used; their changes are its changes.
    keys: Mutex<HashSet<Arc<str>>>,
    /// Keys derived from the session id, ended with the session.
    session_keys: Mutex<HashSet<Arc<str>>>,
    /// Set once the change watcher runs.
    watching: std::sync::atomic::AtomicBool,
    /// Cancelled when the handler is dropped (the session ended).
    closed: CancellationToken,
    /// The level the client set with `logging/setLevel`.
    log_level: Mutex<Option<LoggingLevel>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) struct Handler {
    shared: Arc<Shared>,
    conn: Arc<Connection>,
    /// The session id of a connection that has no HTTP header for it (stdio).
    fixed_session: Option<Arc<str>>,
}

impl Handler {
    pub(crate) fn new(shared: Arc<Shared>, fixed_session: Option<Arc<str>>) -> Self {
        Handler {
            shared,
            conn: Arc::new(Connection {
                keys: Mutex::new(HashSet::new()),
                session_keys: Mutex::new(HashSet::new()),
                watching: std::sync::atomic::AtomicBool::new(false),
                closed: CancellationToken::new(),
                log_level: Mutex::new(None),
            }),
            fixed_session,
        }
    }

    fn scope(&self, meta: &RequestMetaObject, extensions: &Extensions) -> Result<Scope, McpError> {
        let parts = extensions.get::<axum::http::request::Parts>();
        let principal = parts.and_then(|p| p.extensions.get::<Principal>());
        let header = |name: &str| {
            parts
                .and_then(|p| p.headers.get(name))
                .and_then(|v| v.to_str().ok())
        };
        let session_id = header(SESSION_HEADER).or(self.fixed_session.as_deref());
        let sources = KeySources {
            meta_conversation: meta.0.0.get(CONVERSATION_META),
            header_conversation: header(CONVERSATION_HEADER),
            session_id,
            principal: principal.map(|p| &*p.name),
        };
        let key = working_set_key(&sources)?;
        let session_bound = session_id.is_some_and(|sid| *key == *format!("mcp:{sid}"));
        Ok(Scope {
            key,
            capabilities: principal
                .map(|p| p.capabilities.clone())
                .unwrap_or_else(|| Arc::new(Capabilities::all())),
            mode: principal
                .and_then(|p| p.mode)
                .unwrap_or(self.shared.options.default_mode),
            principal: principal.map(|p| p.name.clone()),
            tenant: principal.and_then(|p| p.tenant.clone()),
            session_bound,
        })
    }

    /// Remembers the key, and on a session (not a stateless request) starts the task that
    /// sends `list_changed` through the session's peer.
    fn track(&self, scope: &Scope, extensions: &Extensions, peer: &Peer<RoleServer>) {
        lock(&self.conn.keys).insert(scope.key.clone());
        if scope.session_bound {
            lock(&self.conn.session_keys).insert(scope.key.clone());
        }
        let has_session = self.fixed_session.is_some()
            || extensions
                .get::<axum::http::request::Parts>()
                .is_some_and(|p| p.headers.contains_key(SESSION_HEADER));
        if !has_session
            || self
                .conn
                .watching
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let changes = Changes::subscribe(&self.shared);
        let conn = self.conn.clone();
        let shutdown = self.shared.shutdown.clone();
        let peer = peer.clone();
        tokio::spawn(watch_session(changes, conn, shutdown, peer));
    }
}

async fn watch_session(
    mut changes: Changes,
    conn: Arc<Connection>,
    shutdown: CancellationToken,
    peer: Peer<RoleServer>,
) {
    loop {
        let relevant = |k: &str| lock(&conn.keys).contains(k);
        tokio::select! {
            _ = conn.closed.cancelled() => return,
            _ = shutdown.cancelled() => return,
            change = changes.next(relevant) => {
                if change.is_none() {
                    return;
                }
                if let Err(e) = peer.notify_tool_list_changed().await {
                    tracing::debug!(error = %e, "list_changed not delivered; the session is gone");
                    return;
                }
            }
        }
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        self.conn.closed.cancel();
        for key in lock(&self.conn.session_keys).drain() {
            self.shared.surface.end_session(&key);
            self.shared.dispatcher.end_session(&key);
        }
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated)]
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new("quiver", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(INSTRUCTIONS.into());
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let scope = self.scope(&context.meta, &context.extensions)?;
        self.track(&scope, &context.extensions, &context.peer);
        self.shared.restore_once(&scope.key).await;
        let composed = self
            .shared
            .surface
            .compose(&scope.key, scope.mode, &scope.capabilities)
            .map_err(|e| McpError::internal_error(format!("composing the tool list: {e}"), None))?;
        let tools = composed.specs().iter().map(from_contract::tool).collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let scope = self.scope(&context.meta, &context.extensions)?;
        self.track(&scope, &context.extensions, &context.peer);
        self.shared.restore_once(&scope.key).await;
        let cancel = self.shared.shutdown.child_token();
        let mut ctx = CallContext::for_session(scope.key.clone())
            .with_capabilities((*scope.capabilities).clone())
            .with_cancel(cancel.clone());
        if let Some(p) = &scope.principal {
            ctx = ctx.with_principal(p.clone());
        }
        if let Some(t) = &scope.tenant {
            ctx = ctx.with_tenant(t.clone());
        }
        let progress = context.meta.get_progress_token();
        let progress_state = Arc::new(ProgressState::default());
        let protocol = context.protocol_version();
        let meta_level = context.meta.log_level();
        let modern = protocol
            .as_ref()
            .is_some_and(|v| *v >= rmcp::model::ProtocolVersion::V_2026_07_28);
        let conn = self.conn.clone();
        let log_level: Arc<dyn Fn() -> Option<LoggingLevel> + Send + Sync> = match meta_level {
            Some(l) => Arc::new(move || Some(l)),
            None => Arc::new(move || *lock(&conn.log_level)),
        };
        ctx = ctx.with_client(Arc::new(PeerChannel {
            peer: context.peer.clone(),
            request_id: context.id.clone(),
            progress_token: progress.clone(),
            progress: progress_state.clone(),
            features: channel::features(context.client_capabilities().as_ref()),
            protocol,
            log_level,
            // A 2026-07-28 request gets log messages only when it opts in (SEP-2575).
            logs_allowed: !modern || meta_level.is_some(),
        }));
        let input = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let name = request.name;
        // The surface decides what this session may see: a tool its mode does not list
        // (plan mode and a mutating tool, an internal tool) is refused here. Unknown and
        // capability-forbidden tools are the dispatcher's to answer.
        let surface = &self.shared.surface;
        if surface.catalog().contains(&name)
            && scope.capabilities.allows(&name)
            && !surface.visible(&name, scope.mode, &scope.capabilities)
        {
            let envelope = Envelope::err(
                ErrKind::Forbidden,
                format!(
                    "`{name}` is not available in {} mode. Call tool_search to find a tool you can use.",
                    scope.mode.as_str()
                ),
            );
            return Ok(from_contract::call_result(&envelope, &self.shared.options.render).into());
        }
        let every = self.shared.options.progress_interval;
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut ticks = 0u32;
        let call = self.shared.dispatcher.call(&name, input, ctx);
        tokio::pin!(call);
        let mut cancelled = false;
        let envelope = loop {
            tokio::select! {
                envelope = &mut call => break envelope,
                _ = context.ct.cancelled(), if !cancelled => {
                    // notifications/cancelled, or the client dropped the stream.
                    cancelled = true;
                    cancel.cancel();
                }
                _ = ticker.tick(), if progress.is_some() => {
                    // The heartbeat stops once the tool reports its own progress.
                    if progress_state.reported.load(std::sync::atomic::Ordering::Acquire) {
                        continue;
                    }
                    ticks += 1;
                    if let Some(token) = &progress
                        && progress_state.advance(f64::from(ticks))
                    {
                        let mut p = ProgressNotificationParam::new(token.clone(), f64::from(ticks));
                        p.message = Some(format!("`{name}` is running ({:.1}s)", (every * ticks).as_secs_f64()));
                        let _ = context.peer.notify_progress(p).await;
                    }
                }
            }
        };
        if cancelled {
            tracing::debug!(tool = %name, "the client cancelled the call");
        }
        Ok(from_contract::call_result(&envelope, &self.shared.options.render).into())
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *lock(&self.conn.log_level) = Some(request.level);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = Some(true);
        Some(accepted)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        let request = subscription.request_context();
        let scope = self.scope(&request.meta, &request.extensions)?;
        lock(&self.conn.keys).insert(scope.key.clone());
        let sink = subscription.sink().clone();
        let mut changes = Changes::subscribe(&self.shared);
        let key = scope.key.clone();
        loop {
            tokio::select! {
                _ = subscription.cancelled() => return Ok(()),
                _ = self.shared.shutdown.cancelled() => return Ok(()),
                change = changes.next(|k| *k == *key) => {
                    if change.is_none() {
                        return Ok(());
                    }
                    if let Err(e) = sink.notify_tool_list_changed().await {
                        tracing::debug!(error = %e, "the subscription is gone");
                        return Ok(());
                    }
                }
            }
        }
    }
}
