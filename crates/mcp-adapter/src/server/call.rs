//! The transport-neutral machinery of a session's calls: [`call`] runs one `tools/call` in a
//! request's scope (the rmcp handler, the direct path and stdio batches all end there),
//! [`Heartbeat`] reports a running call's progress, and [`track`] follows the working sets a
//! session used, to tell it when their lists change.

use std::sync::Arc;

use quiver_contract::Capabilities;
use rmcp::{
    RoleServer,
    model::{CallToolResult, ProgressNotificationParam, ProgressToken},
    service::Peer,
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    Shared,
    channel::ProgressState,
    content::{ListChange, ListChanged},
    from_contract,
    scope::{Connection, Scope},
    watch::Changes,
};
use crate::sync::lock;

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
    // The trace's root here, or the child of the client's span: the MCP server span of the
    // OpenTelemetry conventions for MCP.
    let span = quiver_contract::trace::child_of(scope.trace.as_ref(), || {
        tracing::info_span!(
            target: quiver_contract::trace::TARGET,
            "tools/call",
            otel.name = %format_args!("tools/call {name}"),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            mcp.method.name = "tools/call",
            mcp.session.id = scope.session.as_deref(),
            mcp.protocol.version = scope.protocol.as_deref(),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = name,
            network.transport = scope.transport,
            enduser.id = scope.principal.as_deref(),
            error.type = tracing::field::Empty,
        )
    });
    let result = run(shared, scope, name, input, client, progress, channel)
        .instrument(span.clone())
        .await;
    if result.is_error == Some(true) {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", "tool_error");
    }
    result
}

/// [`call`] inside its span.
async fn run(
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
    if let Some(session) = scope.session.as_ref().and_then(|id| shared.mcp_session(id)) {
        ctx.capabilities = shared
            .open_session_servers(
                Some(&session),
                scope.principal.as_deref(),
                ctx.client.clone(),
                &ctx.capabilities,
            )
            .await;
        ctx = ctx.with_mcp_session(session);
    }
    let progress_state = channel.map(|(_, state)| state);
    let every = shared.options.progress_interval;
    // Only a call with a progress token needs the timer.
    let mut heartbeat =
        progress.map(|(token, peer)| Heartbeat::new(token, peer.clone(), progress_state, every));
    // With a store several servers share, the conversation's next call may reach another
    // server, which takes the stored set: a call that adds or removes a tool of the set
    // answers once the set is written, so that server lists what this one answered with.
    let members = shared_members(shared, scope);
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
    if let Some(before) = members
        && shared_members(shared, scope).is_some_and(|after| after != before)
        && tokio::time::timeout(SET_WRITE_WAIT, surface.mirror_settled())
            .await
            .is_err()
    {
        tracing::warn!(tool = %name, "the working set's write took over {SET_WRITE_WAIT:?}: answered before it was stored");
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

/// How long a call that changed a shared working set waits for its write (the store's
/// own timeouts bound the write; this bounds a stalled persistence task).
const SET_WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The tools of the scope's working set, sorted, when other servers may take the next call
/// of its conversation (a store several servers share, a key not bound to this server).
/// Recency and idle rounds are left out: their writes stay off the call path.
fn shared_members(shared: &Shared, scope: &Scope) -> Option<Vec<String>> {
    if !shared.sessions.as_ref().is_some_and(|s| s.shared()) || scope.key.is_session_bound() {
        return None;
    }
    let mut members = shared.surface.working_set(scope.key.as_str());
    members.sort_unstable();
    Some(members)
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
pub(super) async fn with_heartbeat<O>(
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
pub(super) async fn recv_some<T: Clone>(
    rx: &mut Option<tokio::sync::broadcast::Receiver<T>>,
) -> Result<T, tokio::sync::broadcast::error::RecvError> {
    match rx.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
