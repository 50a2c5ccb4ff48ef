//! The rmcp `ServerHandler`: one per MCP session (2025-era protocols, and stdio) or one per
//! request (2026-07-28, stateless). Every request resolves its scope (working-set key,
//! capabilities, mode) first; the surface and the dispatcher do the rest.

// `logging/setLevel` is deprecated by SEP-2577 but 2025-era clients still send it.
#![allow(deprecated)]

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use quiver_contract::{CallContext, Capabilities, Mode};
use quiver_surface::SessionKey;
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams,
        CompleteResult, CustomRequest, CustomResult, ErrorCode, Extensions, GetPromptRequestParams,
        GetPromptResponse, GetPromptResult, Implementation, InitializeRequestParams,
        InputResponses, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
        ListToolsResult, LoggingLevel, PaginatedRequestParams, ProgressNotificationParam,
        ProgressToken, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
        RequestMetaObject, ResourceUpdatedNotificationParam, ServerCapabilities, ServerConfig,
        SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter,
        UnsubscribeRequestParams,
    },
    service::{NotificationContext, Peer, RequestContext, SubscriptionContext},
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{
    Shared,
    auth::Principal,
    channel::{self, Missing, PeerChannel, ProgressState},
    content::{ContentError, ContentOffer, ContentSource, ListChange, ListChanged},
    from_contract,
    key::{CONVERSATION_HEADER, CONVERSATION_META, KeySources, working_set_key},
    rounds::{self, Done, Owner, RoundResponse, Rounds, Target},
    watch::Changes,
};
use crate::sync::lock;

const SESSION_HEADER: &str = "mcp-session-id";

const INSTRUCTIONS: &str = "Quiver serves a working set of tools that grows as you need it. When none of the listed tools fits, call `tool_search` with a few keywords: the tools it finds are added to your tool list (the server sends notifications/tools/list_changed). `describe_tool` returns one tool's full definition.";

/// What one request may see and do.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    pub(crate) key: SessionKey,
    capabilities: Arc<Capabilities>,
    mode: Mode,
    principal: Option<Arc<str>>,
    tenant: Option<Arc<str>>,
    /// Whether the key came from the MCP session id (forgotten when the session ends).
    session_bound: bool,
    /// The MCP session the request belongs to: its `Mcp-Session-Id`, or the stdio
    /// connection's; none for a 2026-07-28 request, which has no session whatever headers
    /// it sends.
    session: Option<Arc<str>>,
}

impl Scope {
    /// Whose call it is, for the input rounds.
    fn owner(&self) -> Owner {
        Owner {
            key: self.key.as_arc().clone(),
            principal: self.principal.clone(),
            tenant: self.tenant.clone(),
        }
    }

    /// The call context of a request in this scope.
    fn context(&self, cancel: CancellationToken) -> CallContext {
        let mut ctx = CallContext::for_session(self.key.clone())
            .with_capabilities((*self.capabilities).clone())
            .with_cancel(cancel);
        if let Some(p) = &self.principal {
            ctx = ctx.with_principal(p.clone());
        }
        if let Some(t) = &self.tenant {
            ctx = ctx.with_tenant(t.clone());
        }
        ctx
    }
}

/// The state of one handler instance (a session, or a single stateless request).
pub(crate) struct Connection {
    /// The working-set keys this connection's requests used; their changes are its changes.
    keys: Mutex<HashSet<Arc<str>>>,
    /// Keys derived from the session id, ended with the session.
    session_keys: Mutex<HashSet<Arc<str>>>,
    /// Set once the change watcher runs.
    watching: std::sync::atomic::AtomicBool,
    /// Cancelled when the handler is dropped (the session ended).
    pub(crate) closed: CancellationToken,
    /// Cancelled when the client ends the session (`DELETE`): its calls still running are
    /// cancelled then. Not on rmcp's idle timeout, which can drop the handler while a long
    /// direct-path call (which rmcp does not see) still runs for a connected client.
    pub(crate) deleted: CancellationToken,
    /// The level the client set with `logging/setLevel`.
    pub(crate) log_level: Mutex<Option<LoggingLevel>>,
    /// The resource URIs this session subscribed to.
    subscriptions: Mutex<HashSet<String>>,
    /// Set once the resource-update relay runs.
    relaying: std::sync::atomic::AtomicBool,
    /// The HTTP session id once a request named it (the direct path finds the session by it).
    session_id: std::sync::OnceLock<Arc<str>>,
    /// Calls answered on the direct path, by JSON-RPC id, so `notifications/cancelled`
    /// reaches them.
    pub(crate) in_flight:
        Mutex<std::collections::HashMap<rmcp::model::RequestId, CancellationToken>>,
    /// The ids of this session's requests in flight on either path (the direct path's
    /// calls, and what was forwarded to rmcp until its answer ends): a second request with an
    /// id still in use is refused (rmcp would route both answers by the one id).
    pub(crate) ids_in_use: Mutex<HashSet<rmcp::model::RequestId>>,
    /// The ids this session's client cancelled lately (at most [`CANCELLED_KEPT`], newest
    /// last): a batch's request whose answer never came because it was cancelled gets no
    /// error in its place (MCP: no response to a cancelled request).
    pub(crate) cancelled: Mutex<std::collections::VecDeque<rmcp::model::RequestId>>,
}

/// How many cancelled ids a session remembers.
const CANCELLED_KEPT: usize = 64;

impl Connection {
    /// Notes that the client cancelled request `id`.
    pub(crate) fn note_cancelled(&self, id: rmcp::model::RequestId) {
        let mut kept = lock(&self.cancelled);
        if kept.contains(&id) {
            return;
        }
        if kept.len() == CANCELLED_KEPT {
            kept.pop_front();
        }
        kept.push_back(id);
    }

    /// Whether the client cancelled request `id` lately.
    pub(crate) fn was_cancelled(&self, id: &rmcp::model::RequestId) -> bool {
        lock(&self.cancelled).contains(id)
    }
}

/// The scope of one request from its HTTP head (absent on stdio) and its `_meta`.
pub(crate) fn scope(
    shared: &Shared,
    parts: Option<&axum::http::request::Parts>,
    meta: &RequestMetaObject,
    fixed_session: Option<&str>,
) -> Result<Scope, ErrorData> {
    let principal = parts.and_then(|p| p.extensions.get::<Principal>());
    let header = |name: &str| {
        parts
            .and_then(|p| p.headers.get(name))
            .and_then(|v| v.to_str().ok())
    };
    // A 2026-07-28 request is stateless: an `Mcp-Session-Id` it carries names no session of
    // its own (rmcp does not check it), so it must not reach another session's working set.
    let stateless = meta
        .protocol_version()
        .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
    let session_id = if stateless {
        fixed_session
    } else {
        header(SESSION_HEADER).or(fixed_session)
    };
    // The conversation header as UTF-8 text (`to_str` would take a non-ASCII key for no
    // header at all, and the request would run in the shared anonymous working set).
    let header_conversation = match parts.and_then(|p| p.headers.get(CONVERSATION_HEADER)) {
        None => None,
        Some(v) => Some(std::str::from_utf8(v.as_bytes()).map_err(|_| {
            ErrorData::invalid_params(
                format!(
                    "the `{CONVERSATION_HEADER}` header is not UTF-8 text: send the conversation key as UTF-8"
                ),
                None,
            )
        })?),
    };
    let sources = KeySources {
        meta_conversation: meta.0.0.get(CONVERSATION_META),
        header_conversation,
        session_id,
        principal: principal.map(|p| &*p.name),
    };
    let key = working_set_key(&sources)?;
    let session_bound = session_id.is_some_and(|sid| key.mcp_session_id() == Some(sid));
    Ok(Scope {
        key,
        capabilities: principal
            .map(|p| p.capabilities.clone())
            .unwrap_or_else(|| Arc::new(Capabilities::all())),
        mode: principal
            .and_then(|p| p.mode)
            .unwrap_or(shared.options.default_mode),
        principal: principal.map(|p| p.name.clone()),
        tenant: principal.and_then(|p| p.tenant.clone()),
        session_bound,
        session: session_id.map(Arc::from),
    })
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
                deleted: CancellationToken::new(),
                log_level: Mutex::new(None),
                subscriptions: Mutex::new(HashSet::new()),
                relaying: std::sync::atomic::AtomicBool::new(false),
                session_id: std::sync::OnceLock::new(),
                in_flight: Mutex::new(std::collections::HashMap::new()),
                ids_in_use: Mutex::new(HashSet::new()),
                cancelled: Mutex::new(std::collections::VecDeque::new()),
            }),
            fixed_session,
        }
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
            request_id: context.id.clone(),
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
            self.shared
                .direct
                .insert(sid.clone(), self.conn.clone(), peer.clone());
        }
    }
}

/// Remembers the key of a request of `conn`; on a session, starts its change watcher once.
pub(crate) fn track(
    shared: &Arc<Shared>,
    conn: &Arc<Connection>,
    scope: &Scope,
    has_session: bool,
    peer: &Peer<RoleServer>,
) {
    lock(&conn.keys).insert(scope.key.as_arc().clone());
    if scope.session_bound {
        lock(&conn.session_keys).insert(scope.key.as_arc().clone());
    }
    if !has_session
        || conn
            .watching
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        return;
    }
    let changes = Changes::subscribe(shared);
    let lists = shared
        .content
        .as_ref()
        .filter(|c| c.offer().list_changed)
        .map(|c| c.list_changes());
    tokio::spawn(watch_session(
        changes,
        lists,
        scope.capabilities.clone(),
        conn.clone(),
        shared.shutdown.clone(),
        peer.clone(),
    ));
}

/// Runs one `tools/call` of a request in `scope`. `client` is cancelled when the client
/// cancels the request (`notifications/cancelled`, or its stream is gone); with a progress
/// token, `notifications/progress` goes to `peer` every `progress_interval`.
pub(crate) async fn call(
    shared: &Shared,
    scope: &Scope,
    name: &str,
    input: Value,
    client: &CancellationToken,
    progress: Option<(ProgressToken, &Peer<RoleServer>)>,
    channel: Option<(Arc<dyn quiver_contract::ClientChannel>, Arc<ProgressState>)>,
) -> CallToolResult {
    // The surface decides what this session may see and records a refusal like every
    // call (`Surface::call`); capability-forbidden tools are the dispatcher's to answer.
    let surface = &shared.surface;
    let cancel = shared.shutdown.child_token();
    let mut ctx = scope.context(cancel.clone());
    if let Some((c, _)) = &channel {
        ctx = ctx.with_client(c.clone());
    }
    let progress_state = channel.map(|(_, state)| state);
    let every = shared.options.progress_interval;
    // Only a call with a progress token needs the timer.
    let mut heartbeat =
        progress.map(|(token, peer)| Heartbeat::new(token, peer.clone(), progress_state, every));
    let call = surface.call(&shared.dispatcher, &scope.key, scope.mode, name, input, ctx);
    tokio::pin!(call);
    let mut cancelled = false;
    let envelope = loop {
        tokio::select! {
            envelope = &mut call => break envelope,
            _ = client.cancelled(), if !cancelled => {
                // notifications/cancelled, or the client dropped the stream.
                cancelled = true;
                cancel.cancel();
            }
            _ = async { heartbeat.as_mut().expect("guarded").beat(name).await }, if heartbeat.is_some() => {}
        }
    };
    if cancelled {
        tracing::debug!(tool = %name, "the client cancelled the call");
    }
    // An output schema whose root is an object: a success must then carry that object
    // (looked up only for a result without one).
    let typed = || {
        surface.catalog().lookup(name).is_some_and(|e| {
            e.spec
                .output_schema
                .as_ref()
                .is_some_and(|o| o.get("type").and_then(Value::as_str) == Some("object"))
        })
    };
    from_contract::call_result(&envelope, &shared.options.render, typed)
}

/// The progress heartbeat of a call whose request carried a progress token: a
/// `notifications/progress` every interval, until the tool reports progress of its own.
pub(crate) struct Heartbeat {
    token: ProgressToken,
    peer: Peer<RoleServer>,
    state: Option<Arc<ProgressState>>,
    every: std::time::Duration,
    ticker: tokio::time::Interval,
    ticks: u32,
}

impl Heartbeat {
    pub(crate) fn new(
        token: ProgressToken,
        peer: Peer<RoleServer>,
        state: Option<Arc<ProgressState>>,
        every: std::time::Duration,
    ) -> Self {
        Heartbeat {
            token,
            peer,
            state,
            every,
            ticker: tokio::time::interval_at(tokio::time::Instant::now() + every, every),
            ticks: 0,
        }
    }

    /// Waits for the next tick and sends it (unless the tool reported progress itself).
    pub(crate) async fn beat(&mut self, name: &str) {
        self.ticker.tick().await;
        if self
            .state
            .as_ref()
            .is_some_and(|st| st.reported.load(std::sync::atomic::Ordering::Acquire))
        {
            return;
        }
        self.ticks += 1;
        let value = f64::from(self.ticks);
        if self.state.as_ref().is_none_or(|st| st.advance(value)) {
            let mut p = ProgressNotificationParam::new(self.token.clone(), value);
            p.message = Some(format!(
                "`{name}` is running ({:.1}s)",
                (self.every * self.ticks).as_secs_f64()
            ));
            let _ = self.peer.notify_progress(p).await;
        }
    }
}

/// `fut`, with `heartbeat` beating (for `name`) while it runs.
async fn with_heartbeat<O>(
    fut: impl std::future::Future<Output = O>,
    heartbeat: Option<Heartbeat>,
    name: &str,
) -> O {
    let Some(mut heartbeat) = heartbeat else {
        return fut.await;
    };
    tokio::pin!(fut);
    loop {
        tokio::select! {
            done = &mut fut => return done,
            _ = heartbeat.beat(name) => {}
        }
    }
}

/// Sends a session `list_changed` for its tools (when its surface changed) and for
/// resources and prompts (when the content source's lists changed), until it ends.
async fn watch_session(
    mut changes: Changes,
    mut lists: Option<tokio::sync::broadcast::Receiver<ListChanged>>,
    caps: Arc<Capabilities>,
    conn: Arc<Connection>,
    shutdown: CancellationToken,
    peer: Peer<RoleServer>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let relevant = |k: &str| lock(&conn.keys).contains(k);
        let sent = tokio::select! {
            _ = conn.closed.cancelled() => return,
            _ = shutdown.cancelled() => return,
            change = changes.next(relevant) => {
                if change.is_none() {
                    return;
                }
                peer.notify_tool_list_changed().await
            }
            change = recv_some(&mut lists) => match change {
                // Another server's entries: this session's lists did not change.
                Ok(c) if !c.reaches(&caps) => continue,
                Ok(c) => match c.list {
                    ListChange::Resources => peer.notify_resource_list_changed().await,
                    ListChange::Prompts => peer.notify_prompt_list_changed().await,
                },
                Err(RecvError::Lagged(_)) => {
                    // Missed some: say both lists changed.
                    match peer.notify_resource_list_changed().await {
                        Ok(()) => peer.notify_prompt_list_changed().await,
                        e => e,
                    }
                }
                Err(RecvError::Closed) => {
                    lists = None;
                    continue;
                }
            },
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "list_changed not delivered; the session is gone");
            return;
        }
    }
}

/// The next message of `rx`; never, without a receiver.
async fn recv_some<T: Clone>(
    rx: &mut Option<tokio::sync::broadcast::Receiver<T>>,
) -> Result<T, tokio::sync::broadcast::error::RecvError> {
    match rx.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Ends a `listen` stream's upstream resource subscriptions when the stream ends.
struct Unsubscribe {
    source: Arc<dyn ContentSource>,
    uris: Vec<String>,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let (source, uris) = (self.source.clone(), std::mem::take(&mut self.uris));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for uri in uris {
                    let _ = source.unsubscribe(&uri).await;
                }
            });
        }
    }
}

impl Drop for Handler {
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
        // A session's key never comes back: what the store mirrored for it goes too.
        for key in lock(&self.conn.session_keys).drain() {
            self.shared.surface.forget_session(&key);
            self.shared.dispatcher.end_session(&key);
        }
    }
}

/// The answer to a request rmcp could not parse as any request it knows: a known method
/// whose params do not fit is `-32602` naming what is wrong (rmcp's default answers `-32601`
/// with the bare method name, as if the method did not exist).
/// `modern`: a 2026-07-28 request, for which `initialize`, `logging/setLevel` and the
/// resource subscriptions no longer exist (SEP-2575: -32601, which rmcp answers with 404).
pub(crate) fn unparsed_request(method: &str, params: Option<Value>, modern: bool) -> ErrorData {
    fn why<T: serde::de::DeserializeOwned>(params: Option<Value>) -> Option<String> {
        // No params, or not an object, where the method takes an object: serde's "invalid
        // type: null, expected struct CallToolRequestParams" names a Rust type.
        if let Some(kind) = match &params {
            None | Some(Value::Null) => Some("missing"),
            Some(Value::Object(_)) => None,
            Some(Value::Array(_)) => Some("an array"),
            Some(_) => Some("not an object"),
        } && serde_json::from_value::<T>(params.clone().unwrap_or(Value::Null)).is_err()
        {
            return Some(format!(
                "`params` is {kind}: this method takes an object of parameters"
            ));
        }
        let err = serde_json::from_value::<T>(params.clone().unwrap_or(Value::Null))
            .err()?
            .to_string()
            // JSON's word for it (serde's is Rust's).
            .replace("expected a map", "expected an object");
        // serde does not say which field had the wrong type (QA-14 #11): the one whose
        // removal takes the error away, or leaves only its own absence, is named.
        if let Some(Value::Object(map)) = &params
            && !err.starts_with("missing field")
            && !err.starts_with("unknown field")
        {
            for key in map.keys() {
                let mut without = map.clone();
                without.remove(key);
                let other = serde_json::from_value::<T>(Value::Object(without))
                    .err()
                    .map(|e| e.to_string());
                if other.is_none_or(|o| o == format!("missing field `{key}`")) {
                    return Some(format!("`{key}`: {err}"));
                }
            }
        }
        Some(err)
    }
    let removed = matches!(
        method,
        "initialize" | "logging/setLevel" | "resources/subscribe" | "resources/unsubscribe"
    );
    let why = match method {
        _ if modern && removed => {
            return ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: `{method}` is not part of protocol 2026-07-28"),
                None,
            );
        }
        "tools/call" => why::<CallToolRequestParams>(params),
        "resources/read" => why::<ReadResourceRequestParams>(params),
        "prompts/get" => why::<GetPromptRequestParams>(params),
        "logging/setLevel" => why::<SetLevelRequestParams>(params),
        "completion/complete" => why::<CompleteRequestParams>(params),
        "resources/subscribe" => why::<SubscribeRequestParams>(params),
        "resources/unsubscribe" => why::<UnsubscribeRequestParams>(params),
        "initialize" => why::<InitializeRequestParams>(params),
        "subscriptions/listen" => why::<rmcp::model::SubscriptionsListenRequestParams>(params),
        "tools/list" | "resources/list" | "resources/templates/list" | "prompts/list" => {
            why::<Option<PaginatedRequestParams>>(params)
        }
        _ => {
            return ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: `{method}`"),
                None,
            );
        }
    };
    let detail = why.map_or_else(String::new, |w| format!(": {w}"));
    ErrorData::invalid_params(format!("invalid params for `{method}`{detail}"), None)
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

/// Records a `tools/call` of `call` (name, arguments) that was refused with -32602 (or
/// rmcp's -32020) before it could run, kind `invalid_params`, with `message`: in its session
/// when the request's scope can be read, else (a malformed conversation key) in none, under
/// the caller's token. The handler's refusals and the HTTP front's (rmcp's header checks)
/// both come here.
pub(crate) async fn record_invalid_params(
    shared: &Shared,
    parts: Option<&axum::http::request::Parts>,
    meta: &RequestMetaObject,
    fixed_session: Option<&str>,
    call: (&str, Value),
    message: &str,
) {
    record_refusal(
        shared,
        (parts, meta, fixed_session),
        call,
        "invalid_params",
        message,
    )
    .await;
}

/// Records `call`, a `tools/call` that a transport refused with `refusal` before any
/// handler saw it (a body nested too deeply, text that is not JSON, a message that is not
/// JSON-RPC, a batch's shared id, an id in flight): a call all the same, which has its row.
/// `parts`: the HTTP request's head; `fixed_session`: the stdio session's key.
pub(crate) async fn record_transport_refusal(
    shared: &Shared,
    parts: Option<&axum::http::request::Parts>,
    fixed_session: Option<&str>,
    call: super::invalid::RefusedCall,
    refusal: &super::invalid::Refusal,
) {
    let meta: RequestMetaObject = serde_json::from_value(call.meta).unwrap_or_default();
    record_refusal(
        shared,
        (parts, &meta, fixed_session),
        (&call.name, call.input),
        refusal.kind(),
        &refusal.message,
    )
    .await;
}

/// Records a refused call with the error `kind` and `message`, in the scope of `parts`,
/// `meta` and `fixed_session` (see [`scope`]).
async fn record_refusal(
    shared: &Shared,
    (parts, meta, fixed_session): (
        Option<&axum::http::request::Parts>,
        &RequestMetaObject,
        Option<&str>,
    ),
    (name, input): (&str, Value),
    kind: &str,
    message: &str,
) {
    let ctx = match scope(shared, parts, meta, fixed_session) {
        Ok(scope) => scope.context(shared.shutdown.child_token()),
        Err(_) => {
            let mut ctx = CallContext::default();
            if let Some(p) = parts.and_then(|p| p.extensions.get::<Principal>()) {
                ctx = ctx
                    .with_capabilities((*p.capabilities).clone())
                    .with_principal(p.name.clone());
                if let Some(tenant) = &p.tenant {
                    ctx = ctx.with_tenant(tenant.clone());
                }
            }
            ctx
        }
    };
    let envelope = quiver_contract::Envelope::err(
        quiver_contract::ErrKind::Other(kind.into()),
        message.to_owned(),
    );
    shared.dispatcher.refuse(name, input, ctx, envelope).await;
}

/// The name a refused `tools/call` is logged under: the `name` sent, a name that is not a
/// string as its JSON text, none as `(no name)`.
pub(crate) fn sent_name(name: Option<Value>) -> String {
    match name {
        Some(Value::String(n)) => n,
        Some(other) => other.to_string(),
        None => "(no name)".to_owned(),
    }
}

tokio::task_local! {
    /// The capabilities of the token whose HTTP request rmcp is reading, for `get_tool`
    /// (set by the HTTP front, `direct::forward_parts`, when the request has a token).
    pub(crate) static CALLER: Arc<quiver_contract::Capabilities>;
}

/// The `_meta` key of a 2026-07-28 request's log level (SEP-2575).
const LOG_LEVEL_META: &str = "io.modelcontextprotocol/logLevel";

impl ServerHandler for Handler {
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

    /// The client's roots changed: an upstream holding them fetches them again before its
    /// next call (Quiver declares `roots.listChanged` upstream for this).
    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        if let (Ok(scope), Some(content)) = (
            self.scope(&RequestMetaObject::default(), &context.extensions),
            &self.shared.content,
        ) {
            content.roots_changed(&scope.key);
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
        info.instructions = Some(INSTRUCTIONS.into());
        info
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
        let _pin = self.shared.enter(&scope.key).await;
        let composed = self
            .shared
            .surface
            .compose(&scope.key, scope.mode, &scope.capabilities)
            .map_err(|e| {
                ErrorData::internal_error(format!("composing the tool list: {e}"), None)
            })?;
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
        // caller's) runs nothing and has no held call's row: it gets its own (QA-14 #3).
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
        let answer = self
            .run_request(Target::tool(&name), &scope, &context, input, start)
            .await;
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
        use tokio::sync::broadcast::error::RecvError;
        let request = subscription.request_context();
        let scope = self.scope(&request.meta, &request.extensions)?;
        lock(&self.conn.keys).insert(scope.key.as_arc().clone());
        let sink = subscription.sink().clone();
        let accepted = subscription.accepted().clone();
        let wants = |f: Option<bool>| f == Some(true);
        let (tools, resources, prompts) = (
            wants(accepted.tools_list_changed),
            wants(accepted.resources_list_changed),
            wants(accepted.prompts_list_changed),
        );
        let source = self.shared.content.clone();
        let mut lists = source
            .as_ref()
            .filter(|_| resources || prompts)
            .map(|s| s.list_changes());
        // Resource subscriptions of this stream: subscribed upstream for as long as it lasts.
        let uris: std::collections::BTreeSet<String> = accepted
            .resource_subscriptions
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mut updates = source
            .as_ref()
            .filter(|_| !uris.is_empty())
            .map(|s| s.resource_updates());
        // Only what was subscribed is unsubscribed when the stream ends (the source counts
        // subscriptions across sessions).
        let mut _unsubscribe = None;
        if let Some(s) = source.as_ref().filter(|_| !uris.is_empty()) {
            let guard = _unsubscribe.insert(Unsubscribe {
                source: s.clone(),
                uris: Vec::new(),
            });
            for uri in &uris {
                match s.subscribe(uri, &scope.capabilities).await {
                    Ok(()) => guard.uris.push(uri.clone()),
                    Err(e) => {
                        tracing::info!(uri = %uri, error = %e, "listen: the upstream refused a resource subscription");
                    }
                }
            }
        }
        // Updates go out only for the URIs subscribed: a refused one (another token's
        // server's, or one no server lists) gets none.
        let uris: std::collections::BTreeSet<String> = _unsubscribe
            .as_ref()
            .map(|g| g.uris.iter().cloned().collect())
            .unwrap_or_default();
        let mut changes = Changes::subscribe(&self.shared);
        let key = scope.key.clone();
        loop {
            let sent = tokio::select! {
                _ = subscription.cancelled() => return Ok(()),
                _ = self.shared.shutdown.cancelled() => return Ok(()),
                change = changes.next(|k| *k == *key) => {
                    if change.is_none() {
                        return Ok(());
                    }
                    if !tools {
                        continue;
                    }
                    sink.notify_tool_list_changed().await
                }
                change = recv_some(&mut lists) => match change {
                    Ok(c) if !c.reaches(&scope.capabilities) => continue,
                    Ok(ListChanged { list: ListChange::Resources, .. }) if resources => {
                        sink.notify_resource_list_changed().await
                    }
                    Ok(ListChanged { list: ListChange::Prompts, .. }) if prompts => {
                        sink.notify_prompt_list_changed().await
                    }
                    Ok(_) => continue,
                    Err(RecvError::Lagged(_)) => {
                        let mut r = Ok(());
                        if resources {
                            r = sink.notify_resource_list_changed().await;
                        }
                        if prompts && r.is_ok() {
                            r = sink.notify_prompt_list_changed().await;
                        }
                        r
                    }
                    Err(RecvError::Closed) => {
                        lists = None;
                        continue;
                    }
                },
                update = recv_some(&mut updates) => match update {
                    Ok(uri) if uris.contains(&uri) => sink.notify_resource_updated(uri).await,
                    Ok(_) => continue,
                    Err(RecvError::Lagged(n)) => {
                        // Missed some: each subscribed resource may have changed.
                        tracing::warn!(missed = n, "resource updates dropped for a slow subscription");
                        let mut r = Ok(());
                        for uri in &uris {
                            r = sink.notify_resource_updated(uri.clone()).await;
                            if r.is_err() {
                                break;
                            }
                        }
                        r
                    }
                    Err(RecvError::Closed) => {
                        updates = None;
                        continue;
                    }
                },
            };
            if let Err(e) = sent {
                tracing::debug!(error = %e, "the subscription is gone");
                return Ok(());
            }
        }
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

/// Entries per page of `resources/list`, `resources/templates/list` and `prompts/list`.
const PAGE: usize = 1000;

/// One page of an aggregated list; the cursor is the offset of the next page.
fn paged<T: serde::de::DeserializeOwned>(
    field: &str,
    all: Vec<Value>,
    request: Option<PaginatedRequestParams>,
) -> Result<T, ErrorData> {
    let total = all.len();
    let start = match request.and_then(|r| r.cursor) {
        None => 0,
        // A cursor this server never gave (beyond the list, or not a number) is invalid.
        Some(c) => c
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= total)
            .ok_or_else(|| {
                ErrorData::invalid_params(
                    format!("invalid cursor {c:?}: pass the nextCursor of the previous page"),
                    None,
                )
            })?,
    };
    let page: Vec<Value> = all.into_iter().skip(start).take(PAGE).collect();
    let mut out = serde_json::Map::new();
    out.insert(field.to_owned(), Value::Array(page));
    let next = start + PAGE;
    if next < total {
        out.insert("nextCursor".into(), Value::String(next.to_string()));
    }
    typed(Value::Object(out), field)
}

/// Parses the wire JSON a source returned into rmcp's type, marked `resultType: complete`
/// when it has no type (a 2025-era upstream's answer; a 2026-07-28 client requires the
/// field, and rmcp drops it again for older clients).
fn typed<T: serde::de::DeserializeOwned>(mut wire: Value, what: &str) -> Result<T, ErrorData> {
    if let Value::Object(m) = &mut wire {
        m.entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
    }
    serde_json::from_value(wire).map_err(|e| {
        tracing::warn!(error = %e, "{what}: the content source returned a malformed result");
        ErrorData::internal_error(
            format!("{what}: the upstream answer is malformed ({e})"),
            None,
        )
    })
}

/// `e` as the JSON-RPC error; `resource` says the request was about resources, and names the
/// URI it was about, if one (SEP-2164: a resource not found carries `data.uri`).
fn content_error(e: ContentError, resource: Option<Option<&str>>) -> ErrorData {
    let mut error = content_error_of(e, resource.is_some());
    // An upstream's own "not found" gets the URI too.
    if let Some(uri) = resource.flatten()
        && error.code == rmcp::model::ErrorCode::RESOURCE_NOT_FOUND
        && error.data.is_none()
    {
        error.data = Some(serde_json::json!({"uri": uri}));
    }
    error
}

fn content_error_of(e: ContentError, resource: bool) -> ErrorData {
    match e {
        ContentError::NotFound(m) if resource => ErrorData::resource_not_found(m, None),
        ContentError::NotFound(m) | ContentError::InvalidParams(m) => {
            ErrorData::invalid_params(m, None)
        }
        ContentError::Upstream { code, message } => {
            ErrorData::new(rmcp::model::ErrorCode(code), message, None)
        }
        ContentError::Unavailable(m) => ErrorData::internal_error(m, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(cursor: Option<&str>) -> Result<Value, ErrorData> {
        let all: Vec<Value> = (0..PAGE + 5).map(|i| serde_json::json!({"n": i})).collect();
        let request =
            cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c.to_owned())));
        paged("prompts", all, request)
    }

    /// A `subscriptions/listen` whose params do not fit is invalid params naming the
    /// problem (it was "method not found", 404, as if listening did not exist); an unknown
    /// method still is.
    #[test]
    fn a_malformed_listen_is_invalid_params() {
        for params in [
            serde_json::json!({"_meta": {}}),
            serde_json::json!({"notifications": {"toolsListChanged": "yes"}}),
        ] {
            let e = unparsed_request("subscriptions/listen", Some(params.clone()), true);
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{params}: {}", e.message);
            assert!(
                e.message
                    .starts_with("invalid params for `subscriptions/listen`: "),
                "{}",
                e.message
            );
        }
        let e = unparsed_request("subscriptions/frobnicate", None, true);
        assert_eq!(e.code, ErrorCode::METHOD_NOT_FOUND);
    }

    /// Params that are missing or not an object are said to be so, not in serde's words
    /// ("invalid type: null, expected struct CallToolRequestParams").
    #[test]
    fn params_that_are_not_an_object_are_named() {
        for (method, params, says) in [
            ("tools/call", None, "`params` is missing"),
            ("resources/read", Some(Value::Null), "`params` is missing"),
            (
                "prompts/get",
                Some(serde_json::json!([1])),
                "`params` is an array",
            ),
            (
                "tools/call",
                Some(serde_json::json!("x")),
                "`params` is not an object",
            ),
        ] {
            let e = unparsed_request(method, params, false);
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{method}: {}", e.message);
            assert_eq!(
                e.message,
                format!(
                    "invalid params for `{method}`: {says}: this method takes an object of parameters"
                )
            );
        }
        let e = unparsed_request("prompts/get", Some(serde_json::json!({})), false);
        assert_eq!(
            e.message,
            "invalid params for `prompts/get`: missing field `name`"
        ); // The field with the wrong type is named (QA-14 #11), in JSON's words.
        for (params, says) in [
            (
                serde_json::json!({"name": "t", "arguments": ["weather"]}),
                "`arguments`: invalid type: sequence, expected an object",
            ),
            (
                serde_json::json!({"name": 12345, "arguments": {}}),
                "`name`: invalid type: integer `12345`, expected a string",
            ),
            (
                serde_json::json!({"name": "t", "arguments": "weather"}),
                "`arguments`: invalid type: string \"weather\", expected an object",
            ),
        ] {
            let e = unparsed_request("tools/call", Some(params), false);
            assert_eq!(
                e.message,
                format!("invalid params for `tools/call`: {says}")
            );
        }
    }

    #[test]
    fn list_pages_follow_their_cursors_and_refuse_others() {
        let first = page(None).unwrap();
        assert_eq!(first["prompts"].as_array().unwrap().len(), PAGE);
        let next = first["nextCursor"].as_str().unwrap().to_owned();
        let second = page(Some(&next)).unwrap();
        assert_eq!(second["prompts"].as_array().unwrap().len(), 5);
        assert!(second.get("nextCursor").is_none());
        for bad in ["18446744073709551615", "-1", "x", &(PAGE + 6).to_string()] {
            let e = page(Some(bad)).unwrap_err();
            assert!(e.message.contains("invalid cursor"), "{bad}: {}", e.message);
        }
    }
}
