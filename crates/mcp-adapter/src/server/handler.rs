//! The rmcp adapter, [`SessionHandler`]: rmcp's `ServerHandler`, one per MCP session
//! (2025-era protocols, and stdio) or one per request (2026-07-28, stateless). Every request
//! resolves its scope (working-set key, capabilities, mode; `scope`) first; the surface, the
//! dispatcher and the content source do the rest (a `tools/call` runs through `call::call`,
//! as on the other paths).
//!
//! Over 800 lines: one `ServerHandler` method per MCP request kind, each short; the work of
//! each is in its own module (`call`, `prompts`, `rounds`, `refusals`, `scope`).

// `logging/setLevel` is deprecated by SEP-2577 but 2025-era clients still send it.
#![allow(deprecated)]

use std::sync::Arc;

use quiver_contract::CallContext;
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
        CustomRequest, CustomResult, Extensions, GetPromptRequestParams, GetPromptResponse,
        GetPromptResult, Implementation, InputResponses, ListPromptsResult,
        ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
        ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, RequestMetaObject,
        ResourceUpdatedNotificationParam, ServerCapabilities, ServerConfig, SetLevelRequestParams,
        SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
    },
    service::{NotificationContext, Peer, RequestContext, SubscriptionContext},
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{
    Shared,
    call::{Heartbeat, call, track, with_heartbeat},
    channel::{self, Missing, PeerChannel, ProgressState},
    content::{ContentOffer, ContentSource},
    content_wire::{content_error, paged, typed},
    from_contract, listen,
    refusals::{record_invalid_params, sent_name, unparsed_request},
    rounds::{self, Done, RoundResponse, Rounds, Target},
    scope::{Connection, SESSION_HEADER, Scope, scope},
};
use crate::sync::lock;

/// The most of one upstream server's `instructions` passed on, in characters.
const UPSTREAM_INSTRUCTIONS_CHARS: usize = 2_000;

const INSTRUCTIONS: &str = "Quiver serves a working set of tools that grows as you need it. When none of the listed tools fits, call `tool_search` with a few keywords: the tools it finds can be called by name, and in a session (or a conversation named by the `Quiver-Conversation` header) they join your tool list, announced with notifications/tools/list_changed. `describe_tool` returns one tool's full definition.";

/// rmcp's server handler for one MCP session, or one stateless request: it holds the
/// connection's state and answers every request rmcp reads.
pub(crate) struct SessionHandler {
    shared: Arc<Shared>,
    conn: Arc<Connection>,
    /// The session id of a connection that has no HTTP header for it (stdio).
    fixed_session: Option<Arc<str>>,
    /// Whether a `tools/call` without an id was warned of on this session (once: a client
    /// that drops its ids would fill the log otherwise; each such call has its row).
    warned_id_less: std::sync::atomic::AtomicBool,
}

impl SessionHandler {
    pub(crate) fn new(shared: Arc<Shared>, fixed_session: Option<Arc<str>>) -> Self {
        let conn = Arc::new(Connection::new());
        if let Some(sid) = &fixed_session {
            lock(&shared.session_ends).insert(sid.clone(), conn.closed.clone());
        }
        SessionHandler {
            shared,
            conn,
            fixed_session,
            warned_id_less: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A channel to the session's client for what a request other than a call causes (a
    /// per-session server's `roots/list` while the session's tools are listed).
    fn request_channel(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Arc<dyn quiver_contract::ClientChannel> {
        Arc::new(PeerChannel {
            peer: context.peer.clone(),
            request_id: Some(context.id.clone()),
            progress_token: None,
            progress: Arc::new(ProgressState::default()),
            features: channel::features(context.client_capabilities().as_ref()),
            meta_level: None,
            conn: self.conn.clone(),
            logs_allowed: false,
            missing: None,
            outbox: None,
        })
    }

    /// Records a `tools/call` whose params do not fit (`arguments` that is not an object, a
    /// `name` that is not a string, no params): its caller gets `error` (-32602), and the
    /// log gets the call's row like every other call's, under the name sent (a name that is
    /// not a string as its JSON text, none as `(no name)`).
    async fn record_unparsed_call(
        &self,
        params: Option<Value>,
        error: &ErrorData,
        context: &RequestContext<RoleServer>,
    ) {
        let (name, input) = match params {
            Some(Value::Object(mut m)) => (
                sent_name(m.remove("name")),
                m.remove("arguments").unwrap_or(Value::Null),
            ),
            other => (sent_name(None), other.unwrap_or(Value::Null)),
        };
        self.record_refused_call(&name, input, error, context).await;
    }

    /// Records a `tools/call` of `name` refused with `error` (-32602) before it could run,
    /// kind `invalid_params`: in its session when the request's scope can be read, else (a
    /// malformed conversation key) in none, under the caller's token.
    async fn record_refused_call(
        &self,
        name: &str,
        input: Value,
        error: &ErrorData,
        context: &RequestContext<RoleServer>,
    ) {
        record_invalid_params(
            &self.shared,
            context.extensions.get::<axum::http::request::Parts>(),
            &context.meta,
            self.fixed_session.as_deref(),
            (name, input),
            &error.message,
        )
        .await;
    }

    fn scope(&self, meta: &RequestMetaObject, extensions: &Extensions) -> Result<Scope, ErrorData> {
        scope(
            &self.shared,
            extensions.get::<axum::http::request::Parts>(),
            meta,
            self.fixed_session.as_deref(),
        )
    }

    /// Runs one request that may take input rounds (`tools/call`, `prompts/get`,
    /// `resources/read`; SEP-2322). On 2026-07-28 a retry naming its `requestState` resumes
    /// the waiting call, and a request whose client declared something it could be asked
    /// starts one in its own task; otherwise the request runs in place, with its own channel
    /// (a 2025-era session's requests go over the session) and cancellation. `start` makes the
    /// call's future from its client channel, cancellation and progress state. Either way a
    /// progress token gets a heartbeat, and on 2026-07-28 a failure that is the refusal of an
    /// undeclared capability becomes `-32021`.
    async fn run_request<R, F, Fut, T>(
        &self,
        target: Target,
        scope: &Scope,
        context: &RequestContext<RoleServer>,
        (responses, state): (Option<InputResponses>, Option<String>),
        start: F,
    ) -> Result<R, ErrorData>
    where
        R: RoundResponse,
        F: FnOnce(
            Arc<dyn quiver_contract::ClientChannel>,
            CancellationToken,
            Arc<ProgressState>,
        ) -> Fut,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Into<Done> + Send,
    {
        let progress_state = Arc::new(ProgressState::default());
        let meta_level = context.meta.log_level();
        let modern = context
            .protocol_version()
            .as_ref()
            .is_some_and(|v| *v >= rmcp::model::ProtocolVersion::V_2026_07_28);
        if let Some(refused) = bad_log_level(context) {
            return Err(refused);
        }
        let features = channel::features(context.client_capabilities().as_ref());
        // Only a 2026-07-28 request turns a capability refusal into -32021.
        let missing = Arc::new(Missing::default());
        let progress_token = context.meta.get_progress_token();
        let peer_channel = Arc::new(PeerChannel {
            peer: context.peer.clone(),
            request_id: Some(context.id.clone()),
            progress_token: progress_token.clone(),
            progress: progress_state.clone(),
            features,
            meta_level,
            conn: self.conn.clone(),
            // A 2026-07-28 request gets log messages only when it opts in (SEP-2575).
            logs_allowed: !modern || meta_level.is_some(),
            missing: modern.then(|| missing.clone()),
            outbox: None,
        });
        // This round's heartbeat (a call's own would go to its first request only).
        let every = self.shared.options.progress_interval;
        let heartbeat = progress_token.map(|token| {
            Heartbeat::new(
                token,
                context.peer.clone(),
                Some(progress_state.clone()),
                every,
            )
        });
        if modern {
            rounds::check_responses(responses.as_ref())?;
        }
        let rounds = &self.shared.rounds;
        let run = match state {
            Some(state) if modern => {
                rounds.resume(&state, target, &scope.owner(), responses, peer_channel)?
            }
            None if modern && (features.sampling || features.elicitation || features.roots) => {
                Rounds::start(
                    target,
                    scope.owner(),
                    features,
                    missing,
                    responses,
                    peer_channel,
                    move |channel, cancel| start(channel, cancel, progress_state),
                )
            }
            // In place: a 2025-era request (a stray requestState is ignored), or a 2026-07-28
            // one that declared nothing it could be asked.
            _ => {
                // Cancelled by the client (`notifications/cancelled`, its stream gone) or
                // when its session ends (`DELETE`).
                let cancel = self.conn.deleted.child_token();
                let done = start(peer_channel, cancel.clone(), progress_state);
                let client = context.ct.clone();
                let done = async move {
                    tokio::pin!(done);
                    tokio::select! {
                        biased;
                        out = &mut done => out,
                        _ = client.cancelled() => {
                            cancel.cancel();
                            done.await
                        }
                    }
                };
                let done = with_heartbeat(done, heartbeat, target.name()).await;
                return R::complete(done.into(), &missing);
            }
        };
        rounds.drive(run, &context.ct, heartbeat).await
    }

    /// Runs a `prompts/get` or `resources/read` (`fetch`, given the request's call context)
    /// through [`Self::run_request`]; the source's cancellation also fires at shutdown.
    async fn content<R, F, Fut, T>(
        &self,
        target: Target,
        context: &RequestContext<RoleServer>,
        input: (Option<InputResponses>, Option<String>),
        fetch: F,
    ) -> Result<R, ErrorData>
    where
        R: RoundResponse,
        F: FnOnce(CallContext) -> Fut,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Into<Done> + Send,
    {
        let scope = self.scope(&context.meta, &context.extensions)?;
        let shutdown = &self.shared.shutdown;
        let start = |channel, cancel: CancellationToken, _| {
            let token = shutdown.child_token();
            let fetched = fetch(scope.context(token.clone()).with_client(channel));
            async move {
                tokio::pin!(fetched);
                tokio::select! {
                    done = &mut fetched => done,
                    _ = cancel.cancelled() => {
                        token.cancel();
                        fetched.await
                    }
                }
            }
        };
        self.run_request(target, &scope, context, input, start)
            .await
    }

    /// Quiver's `instructions`, then those of the upstream servers this caller may use:
    /// how a server tells the model to use its tools (order, units, steps), which a gateway
    /// must not drop. Each is cut to [`UPSTREAM_INSTRUCTIONS_CHARS`] and loses its hidden
    /// characters.
    /// `caps`: whose servers; none, when the caller is not known here, gives Quiver's alone
    /// (a token must not read of servers it may not use).
    fn instructions(&self, caps: Option<&quiver_contract::Capabilities>) -> String {
        let mut text = INSTRUCTIONS.to_owned();
        let upstream = match (caps, &self.shared.content) {
            (Some(caps), Some(content)) => content.instructions(caps),
            _ => Vec::new(),
        };
        if upstream.is_empty() {
            return text;
        }
        text.push_str("\n\nWhat the upstream MCP servers say about their tools (named `mcp__<server>__<tool>`):");
        for (server, said) in upstream {
            let (said, _) = quiver_contract::without_hidden(&said);
            let mut said: String = said.trim().to_owned();
            if said.chars().count() > UPSTREAM_INSTRUCTIONS_CHARS {
                said = said.chars().take(UPSTREAM_INSTRUCTIONS_CHARS).collect();
                said.push_str(" …[cut]");
            }
            text.push_str(&format!("\n\n## {server}\n{said}"));
        }
        text
    }

    fn offer(&self) -> ContentOffer {
        self.shared
            .content
            .as_ref()
            .map(|c| c.offer())
            .unwrap_or_default()
    }

    /// The content source, if it offers what `wanted` picks.
    fn source(
        &self,
        wanted: impl Fn(&ContentOffer) -> bool,
        what: &str,
    ) -> Result<&Arc<dyn ContentSource>, ErrorData> {
        match &self.shared.content {
            Some(c) if wanted(&c.offer()) => Ok(c),
            _ => Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("this server has no {what} (no upstream MCP server offers them)"),
                None,
            )),
        }
    }

    /// Relays `notifications/resources/updated` for this session's subscriptions through
    /// `peer` (started by the first subscription, ended with the session).
    fn relay_updates(&self, source: &Arc<dyn ContentSource>, peer: &Peer<RoleServer>) {
        if self
            .conn
            .relaying
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let mut updates = source.resource_updates();
        let conn = self.conn.clone();
        let shutdown = self.shared.shutdown.clone();
        let peer = peer.clone();
        tokio::spawn(async move {
            loop {
                let uri = tokio::select! {
                    _ = conn.closed.cancelled() => return,
                    _ = shutdown.cancelled() => return,
                    u = updates.recv() => match u {
                        Ok(uri) => uri,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "resource updates dropped for a slow session");
                            continue;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                };
                if !lock(&conn.subscriptions).contains(&uri) {
                    continue;
                }
                let p = ResourceUpdatedNotificationParam::new(uri);
                if let Err(e) = peer.notify_resource_updated(p).await {
                    tracing::debug!(error = %e, "resource update not delivered; the session is gone");
                    return;
                }
            }
        });
    }

    /// Remembers the key, and on a session (not a stateless request) starts the task that
    /// sends `list_changed` through the session's peer; a session is also registered for
    /// the direct path.
    fn track(&self, scope: &Scope, peer: &Peer<RoleServer>) {
        let session = scope.session.clone();
        if self.fixed_session.is_none()
            && let Some(sid) = &session
        {
            self.register(sid, peer);
        }
        track(&self.shared, &self.conn, scope, session.is_some(), peer);
    }

    /// Makes this session reachable by the direct path (HTTP sessions only).
    fn register(&self, sid: &Arc<str>, peer: &Peer<RoleServer>) {
        if self.conn.session_id.set(sid.clone()).is_ok() {
            lock(&self.shared.session_ends).insert(sid.clone(), self.conn.closed.clone());
            self.shared
                .direct
                .insert(sid.clone(), self.conn.clone(), peer.clone());
        }
    }
}

impl Drop for SessionHandler {
    fn drop(&mut self) {
        self.conn.closed.cancel();
        let uris: Vec<String> = lock(&self.conn.subscriptions).drain().collect();
        if let (Some(source), false, Ok(rt)) = (
            self.shared.content.clone(),
            uris.is_empty(),
            tokio::runtime::Handle::try_current(),
        ) {
            rt.spawn(async move {
                for uri in uris {
                    let _ = source.unsubscribe(&uri).await;
                }
            });
        }
        if let Some(sid) = self.conn.session_id.get() {
            self.shared.direct.remove(sid);
        }
        if let Some(sid) = self.conn.session_id.get().or(self.fixed_session.as_ref()) {
            lock(&self.shared.session_ends).remove(sid);
        }
        // A session's key never comes back: what the store mirrored for it goes too.
        for key in lock(&self.conn.session_keys).drain() {
            self.shared.surface.forget_session(&key);
            self.shared.dispatcher.end_session(&key);
        }
    }
}

/// A list request whose `cursor` was not a string (the transport read the message rmcp
/// then read as having none, and marked it: on the HTTP request's extensions for a
/// 2026-07-28 request, on the message's for a stdio batch element): -32602, as the session
/// paths answer it before rmcp reads the message.
fn cursor_sent(context: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
    let marked = context.extensions.get::<super::invalid::BadCursor>();
    match marked.or_else(|| {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<super::invalid::BadCursor>())
    }) {
        Some(bad) => Err(ErrorData::invalid_params(bad.0.to_string(), None)),
        None => Ok(()),
    }
}

/// A request's `_meta` log level that is not one (-32602): rmcp reads it as none, and the
/// request got no log messages and never knew why.
fn bad_log_level(context: &RequestContext<RoleServer>) -> Option<ErrorData> {
    if context.meta.log_level().is_some() {
        return None;
    }
    let sent = context.meta.get(LOG_LEVEL_META).filter(|v| !v.is_null())?;
    Some(ErrorData::invalid_params(
        format!(
            "invalid params: `_meta.{LOG_LEVEL_META}` must be one of debug, info, notice, warning, error, critical, alert, emergency (got {sent})"
        ),
        None,
    ))
}

tokio::task_local! {
    /// The capabilities of the token whose HTTP request rmcp is reading, for `get_tool`
    /// (set by the HTTP front, `direct::forward_parts`, when the request has a token).
    pub(crate) static CALLER: Arc<quiver_contract::Capabilities>;
}

/// The `_meta` key of a 2026-07-28 request's log level (SEP-2575).
const LOG_LEVEL_META: &str = "io.modelcontextprotocol/logLevel";

impl ServerHandler for SessionHandler {
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        let modern = context
            .protocol_version()
            .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
        let params = (request.method == "tools/call").then(|| request.params.clone());
        let error = unparsed_request(&request.method, request.params, modern);
        if let Some(params) = params {
            self.record_unparsed_call(params, &error, &context).await;
        }
        Err(error)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // From here on the session's plain calls can take the direct path.
        if self.fixed_session.is_none()
            && let Some(sid) = context
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|p| p.headers.get(SESSION_HEADER))
                .and_then(|v| v.to_str().ok())
        {
            self.register(&Arc::from(sid), &context.peer);
        }
        // The session hears of list changes from now on, not only after its first
        // `tools/list` or `tools/call`: a client that only reads resources or prompts is
        // told when their lists change.
        match self.scope(&RequestMetaObject::default(), &context.extensions) {
            Ok(scope) => track(
                &self.shared,
                &self.conn,
                &scope,
                scope.session.is_some(),
                &context.peer,
            ),
            Err(e) => tracing::debug!(error = %e.message, "no change watcher for the session yet"),
        }
    }

    /// A `tools/call` sent without an `id` is a notification: JSON-RPC gives it no answer,
    /// so it is not run; it has its row (kind `invalid_request`) and a warning, so that a
    /// client that drops its ids is seen. Other notifications Quiver does not know are
    /// ignored, as JSON-RPC says.
    async fn on_custom_notification(
        &self,
        notification: rmcp::model::CustomNotification,
        context: NotificationContext<RoleServer>,
    ) {
        if notification.method != "tools/call" {
            return;
        }
        let message = serde_json::json!({"method": "tools/call", "params": notification.params});
        let Some(call) = super::invalid::refused_call(&message) else {
            return;
        };
        if !self
            .warned_id_less
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                tool = %call.name,
                "a tools/call without an id (a notification) was not run: a request needs an id to be answered (said once per session; each such call has its row in the execution log)"
            );
        }
        let refusal = super::invalid::Refusal {
            code: super::invalid::INVALID_REQUEST,
            limit: None,
            message: "Invalid Request: a tools/call without an id is a notification, which is \
                      never answered, so it was not run; send it with an id"
                .into(),
            id: Value::Null,
        };
        super::refusals::record_transport_refusal(
            &self.shared,
            context.extensions.get::<axum::http::request::Parts>(),
            self.fixed_session.as_deref(),
            call,
            &refusal,
        )
        .await;
    }

    /// The client's roots changed: an upstream holding them fetches them again before its
    /// next call (Quiver declares `roots.listChanged` upstream for this).
    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        let Ok(scope) = self.scope(&RequestMetaObject::default(), &context.extensions) else {
            return;
        };
        if let Some(content) = &self.shared.content {
            content.roots_changed(&scope.key);
        }
        if let (Some(servers), Some(sid)) = (&self.shared.session_servers, &scope.session) {
            // Their new `roots/list` is asked on the session's own stream (no request of
            // the client's is open for it).
            let client: Arc<dyn quiver_contract::ClientChannel> = Arc::new(PeerChannel {
                peer: context.peer.clone(),
                request_id: None,
                progress_token: None,
                progress: Arc::new(ProgressState::default()),
                features: channel::features(
                    context.peer.peer_info().as_ref().map(|i| &i.capabilities),
                ),
                meta_level: None,
                conn: self.conn.clone(),
                logs_allowed: false,
                missing: None,
                outbox: None,
            });
            servers.roots_changed(sid, Some(client));
        }
    }

    /// A tool's definition for rmcp's SEP-2243 checks of a 2026-07-28 `tools/call`'s
    /// headers (`Mcp-Name`, and `Mcp-Param-*` for parameters annotated `x-mcp-header`).
    /// A tool the request's caller may not use has none: it is, to that caller, a tool
    /// that does not exist, whose call is answered as such (checking its headers would say
    /// that it exists, and what its parameters are).
    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        if matches!(CALLER.try_with(|c| c.allows(name)), Ok(false)) {
            return None;
        }
        self.shared
            .surface
            .catalog()
            .lookup(name)
            .map(|entry| from_contract::tool(&entry.spec))
    }

    fn get_info(&self) -> ServerConfig {
        let offer = self.offer();
        #[allow(deprecated)]
        let mut capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        if offer.resources {
            let mut resources = rmcp::model::ResourcesCapability::default();
            resources.subscribe = offer.subscribe.then_some(true);
            resources.list_changed = offer.list_changed.then_some(true);
            capabilities.resources = Some(resources);
        }
        if offer.prompts {
            let mut prompts = rmcp::model::PromptsCapability::default();
            prompts.list_changed = offer.list_changed.then_some(true);
            capabilities.prompts = Some(prompts);
        }
        if offer.completions {
            capabilities.completions = Some(Default::default());
        }
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new("quiver", env!("CARGO_PKG_VERSION"));
        let caller = CALLER.try_with(Arc::clone).ok();
        info.instructions = Some(self.instructions(caller.as_deref()));
        info
    }

    /// rmcp's handshake, with the instructions of the upstream servers this session's
    /// caller may use (its token's, read from the request).
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        if let Ok(scope) = self.scope(&context.meta, &context.extensions) {
            result.instructions = Some(self.instructions(Some(&scope.capabilities)));
        }
        Ok(result)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        cursor_sent(&context)?;
        // The composed surface is small and always one page: no cursor is ever given out,
        // so any cursor is one this server never gave (the MCP pagination rule: -32602). An
        // empty one is taken as none.
        if let Some(c) = request.and_then(|r| r.cursor).filter(|c| !c.is_empty()) {
            return Err(ErrorData::invalid_params(
                format!(
                    "invalid cursor {c:?}: the tool list is one page, with no nextCursor; list without a cursor"
                ),
                None,
            ));
        }
        let scope = self.scope(&context.meta, &context.extensions)?;
        self.track(&scope, &context.peer);
        // A per-session server's tools are listed once the session runs it, and only
        // those its own process lists.
        let capabilities = match scope
            .session
            .as_ref()
            .and_then(|id| self.shared.mcp_session(id))
        {
            Some(session) => {
                self.shared
                    .open_session_servers(
                        Some(&session),
                        scope.principal.as_deref(),
                        Some(self.request_channel(&context)),
                        &scope.capabilities,
                    )
                    .await
            }
            None => scope.capabilities.clone(),
        };
        let _pin = self.shared.enter(&scope.key).await;
        let composed = self
            .shared
            .surface
            .compose(&scope.key, scope.mode, &capabilities)
            .map_err(|e| {
                ErrorData::internal_error(format!("composing the tool list: {e}"), None)
            })?;
        // Who was given this list, for an operator's view of the session (the admin page).
        let protocol = context.protocol_version().map(|v| {
            let era = if v >= rmcp::model::ProtocolVersion::V_2026_07_28 {
                "stateless era"
            } else {
                "session era"
            };
            format!("{v} ({era})")
        });
        self.shared.surface.note_client(
            &scope.key,
            quiver_surface::SessionClient::new(
                scope.principal.as_deref().map(str::to_owned),
                protocol,
                scope.capabilities.clone(),
            ),
        );
        let tools = composed.specs().iter().map(from_contract::tool).collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // A call refused before it runs (a malformed conversation key or log level) has
        // its row, unless it is the retry of a held call (`requestState`), whose row is
        // the held call's.
        let scope = self
            .scope(&context.meta, &context.extensions)
            .and_then(|scope| bad_log_level(&context).map_or(Ok(scope), Err));
        let scope = match scope {
            Ok(scope) => scope,
            Err(refused) => {
                if request.request_state.is_none() {
                    let input = request.arguments.map(Value::Object).unwrap_or(Value::Null);
                    self.record_refused_call(&request.name, input, &refused, &context)
                        .await;
                }
                return Err(refused);
            }
        };
        self.track(&scope, &context.peer);
        let _pin = self.shared.enter(&scope.key).await;
        let name = request.name;
        let input = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        // A retry whose requestState names no call held for it (forged, expired, another
        // caller's) runs nothing and has no held call's row: it gets its own.
        let retry_input = request.request_state.is_some().then(|| input.clone());
        let (shared, call_scope, tool) = (self.shared.clone(), scope.clone(), name.to_string());
        let start = move |channel, cancel: CancellationToken, progress_state| async move {
            // The heartbeat is the caller's (one per round).
            call(
                &shared,
                &call_scope,
                &tool,
                input,
                &cancel,
                None,
                Some((channel, progress_state)),
            )
            .await
        };
        let input = (request.input_responses, request.request_state);
        let mut answer = self
            .run_request(Target::tool(&name), &scope, &context, input, start)
            .await;
        if !context
            .protocol_version()
            .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28)
            && let Ok(CallToolResponse::Complete(result)) = &mut answer
        {
            crate::wire::no_list_copy(result);
        }
        if let (Err(refused), Some(input)) = (&answer, retry_input)
            && refused.message.starts_with(rounds::STATE_REFUSED)
        {
            self.record_refused_call(&name, input, refused, &context)
                .await;
        }
        answer
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // Gone in 2026-07-28 (SEP-2575): a request names its level in `_meta` instead. A
        // valid one must not succeed and do nothing while an invalid one is "not part of the
        // protocol".
        if context
            .protocol_version()
            .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28)
        {
            return Err(unparsed_request("logging/setLevel", None, true));
        }
        *lock(&self.conn.log_level) = Some(request.level);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // rmcp intersects this with what was requested and what get_info advertises.
        let offer = self.offer();
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = Some(true);
        if offer.list_changed {
            accepted.resources_list_changed = offer.resources.then_some(true);
            accepted.prompts_list_changed = offer.prompts.then_some(true);
        }
        if offer.subscribe {
            accepted.resource_subscriptions = requested.resource_subscriptions.clone();
        }
        Some(accepted)
    }
    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        let request = subscription.request_context();
        let scope = self.scope(&request.meta, &request.extensions)?;
        listen::listen(&self.shared, &self.conn, scope, subscription).await;
        Ok(())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        cursor_sent(&context)?;
        let source = self.source(|o| o.resources, "resources")?;
        let scope = self.scope(&context.meta, &context.extensions)?;
        let all = source
            .list_resources(&scope.capabilities)
            .await
            .map_err(|e| content_error(e, Some(None)))?;
        paged("resources", all, request)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        cursor_sent(&context)?;
        let source = self.source(|o| o.resources, "resources")?;
        let scope = self.scope(&context.meta, &context.extensions)?;
        let all = source
            .list_resource_templates(&scope.capabilities)
            .await
            .map_err(|e| content_error(e, Some(None)))?;
        paged("resourceTemplates", all, request)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let source = self.source(|o| o.resources, "resources")?.clone();
        let uri = request.uri;
        let target = Target::resource(&uri);
        let input = (request.input_responses, request.request_state);
        self.content(target, &context, input, move |ctx| async move {
            let wire = source
                .read_resource(&uri, &ctx)
                .await
                .map_err(|e| content_error(e, Some(Some(&uri))))?;
            typed::<ReadResourceResult>(wire, "resources/read")
        })
        .await
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let source = self.source(|o| o.subscribe, "resource subscriptions")?;
        let scope = self.scope(&context.meta, &context.extensions)?;
        if lock(&self.conn.subscriptions).contains(&request.uri) {
            return Ok(());
        }
        source
            .subscribe(&request.uri, &scope.capabilities)
            .await
            .map_err(|e| content_error(e, Some(Some(&request.uri))))?;
        let fresh = lock(&self.conn.subscriptions).insert(request.uri.clone());
        if !fresh {
            // A concurrent subscribe of the same URI won; give back the extra count.
            let _ = source.unsubscribe(&request.uri).await;
        }
        self.relay_updates(source, &context.peer);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let source = self.source(|o| o.subscribe, "resource subscriptions")?;
        if lock(&self.conn.subscriptions).remove(&request.uri) {
            source
                .unsubscribe(&request.uri)
                .await
                .map_err(|e| content_error(e, Some(Some(&request.uri))))?;
        }
        Ok(())
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        cursor_sent(&context)?;
        let source = self.source(|o| o.prompts, "prompts")?;
        let scope = self.scope(&context.meta, &context.extensions)?;
        let all = source
            .list_prompts(&scope.capabilities)
            .await
            .map_err(|e| content_error(e, None))?;
        paged("prompts", all, request)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let source = self.source(|o| o.prompts, "prompts")?.clone();
        // MCP's prompt arguments are text: a value of another type is the client's to fix,
        // said here in a sentence rather than passed on to the server's validation dump.
        if let Some((key, value)) = request
            .arguments
            .iter()
            .flatten()
            .find(|(_, v)| !v.is_string())
        {
            return Err(ErrorData::invalid_params(
                format!(
                    "prompt argument `{key}` must be a string, not {value}: prompts/get takes its arguments as text (send \"{}\")",
                    value.to_string().trim_matches('"')
                ),
                None,
            ));
        }
        let (name, arguments) = (request.name, request.arguments);
        let target = Target::prompt(&name);
        let input = (request.input_responses, request.request_state);
        self.content(target, &context, input, move |ctx| async move {
            let wire = source
                .get_prompt(&name, arguments, &ctx)
                .await
                .map_err(|e| content_error(e, None))?;
            typed::<GetPromptResult>(wire, "prompts/get")
        })
        .await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let source = self.source(|o| o.completions, "completions")?;
        let scope = self.scope(&context.meta, &context.extensions)?;
        let mut wire = serde_json::to_value(&request)
            .map_err(|e| ErrorData::invalid_params(format!("completion request: {e}"), None))?;
        if let Value::Object(m) = &mut wire {
            m.remove("_meta");
        }
        let wire = source
            .complete(wire, &scope.capabilities)
            .await
            .map_err(|e| content_error(e, None))?;
        typed(wire, "completion/complete")
    }
}
