//! A call through rmcp: a connection to send on (waiting out a reconnect under way), at most
//! one redial for a call that never left, the wait for the answer with the upstream told of a
//! call nobody waits for exactly once, the roots sync before a call from another client, and
//! the envelopes a failed call answers with (shared with the direct path).

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use quiver_contract::{CallContext, Envelope, ErrKind};
use rmcp::{
    RoleClient,
    model::{CallToolRequest, CancelledNotificationParam, ClientRequest, ServerResult},
    service::{Peer, PeerRequestOptions, ServiceError},
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{Conn, DialError, EXIT_WAIT, State, Upstream};
use crate::client::{
    classify::{Class, classify_service},
    config::Endpoint,
    delivery::Deliveries,
    roots::{REFETCH_WAIT, Refetch, Who},
    to_contract,
};

/// How long the ping after a broken HTTP response stream may take to show the session is
/// still there.
const STREAM_CHECK: Duration = Duration::from_secs(5);

/// How long a call's answer waits for the progress and log messages read before it to be
/// handed to the caller while none of them moves on (each is a channel send; only a client
/// that does not read stalls them this long).
const SETTLE_STALL: Duration = Duration::from_millis(200);

/// The longest a call's answer waits for them in all (a flood handed on steadily).
const SETTLE_MOST: Duration = Duration::from_secs(10);

/// What one attempt to send a call gave.
pub(super) enum Attempt {
    Done(Box<Envelope>),
    /// Never reached the upstream: safe to send again on a new connection.
    NotDelivered,
    /// May have reached the upstream: never replayed. With the HTTP status the server
    /// answered it with, when rmcp gave up on one (a 3xx or 4xx it was handed).
    Unknown(Option<u16>),
}

pub(super) fn done(envelope: Envelope) -> Attempt {
    Attempt::Done(Box::new(envelope))
}

/// The envelopes of a failed upstream call, one wording for both call paths (rmcp's and
/// the direct one).
impl Upstream {
    pub(super) fn timed_out(&self, tool: &str, timeout: Duration) -> Envelope {
        self.timed_out_with(tool, timeout, None)
    }

    /// [`Self::timed_out`], saying so when the server answered, meanwhile, a request id
    /// that Quiver never sent (`stray`): it may be answering with the wrong ids.
    fn timed_out_with(
        &self,
        tool: &str,
        timeout: Duration,
        stray: Option<rmcp::model::RequestId>,
    ) -> Envelope {
        let stray = stray.map_or(String::new(), |id| {
            format!(
                " (meanwhile it answered request id {id}, which Quiver never sent: the server may be answering with the wrong ids, which its operator should look into)"
            )
        });
        Envelope::err(
            ErrKind::Timeout,
            format!(
                "MCP server \"{}\" did not answer `{tool}` within {}{stray}; the call was cancelled upstream",
                self.cfg.name,
                quiver_contract::duration_text(timeout)
            ),
        )
    }

    fn incomplete(&self) -> Envelope {
        Envelope::err(
            ErrKind::ToolFailed,
            format!(
                "MCP server \"{}\" could not complete the request",
                self.cfg.name
            ),
        )
    }

    /// An HTTP answer to `tool` that arrived but cannot be used (not JSON-RPC, the wrong
    /// content type, too large): what was wrong, and that the tool may have run.
    pub(super) fn unusable(&self, tool: &str, why: &str) -> Envelope {
        Envelope::err(
            ErrKind::ToolFailed,
            format!(
                "MCP server \"{}\" answered `{tool}`, but the answer cannot be used: {why}. The tool may have run: check before calling it again if it changes anything",
                self.cfg.name
            ),
        )
    }

    /// The server answered the call with a JSON-RPC error (`message`, its words unless they
    /// are Quiver's and name it already): which server said it.
    pub(super) fn peer_failed(&self, message: &str) -> Envelope {
        let message = match message.starts_with("MCP server \"") {
            true => message.to_owned(),
            false => format!(
                "MCP server \"{}\" answered with an error: {message}",
                self.cfg.name
            ),
        };
        Envelope::err(ErrKind::ToolFailed, message)
    }

    /// Waits for the progress and log messages read before an answer to `what` (a
    /// `tools/call` of `name`, or a request labelled `name`) to reach its caller; those that
    /// could not be handed on in time are named to the operator.
    async fn settle(&self, deliveries: &Deliveries, what: &str, name: &str) {
        if let Some(open) = deliveries.settled(SETTLE_STALL, SETTLE_MOST).await {
            tracing::warn!(
                server = %self.cfg.name,
                open,
                "{open} progress or log message(s) that the server sent before its answer to {what} `{name}` were still being handed to the client when the answer went out (none moved on for {} ms, or {} s in all); they reach the client after the answer, or not at all",
                SETTLE_STALL.as_millis(),
                SETTLE_MOST.as_secs()
            );
        }
    }

    pub(super) fn call_cancelled() -> Envelope {
        Envelope::err(ErrKind::Cancelled, "the call was cancelled")
    }
}

impl Upstream {
    /// How long a call may wait for its answer. The caller's deadline (the dispatcher's
    /// `timeout_secs` or per-tool timeout, which the operator set) bounds it; the client's
    /// default `call_timeout` (120 s) applies only without one, so `timeout_secs = 300` is
    /// not cut to 120 s. A `call_timeout` set on the server still caps it.
    pub(crate) fn call_limit(&self, ctx: &CallContext) -> Duration {
        let left = ctx
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        match (self.cfg.call_timeout, left) {
            (Some(own), Some(left)) => own.min(left),
            (Some(own), None) => own,
            (None, Some(left)) => left,
            (None, None) => self.opts.call_timeout,
        }
    }

    /// A connection to send on, waiting for a reconnect already under way (at most the
    /// connect timeout, and never past nine tenths of `limit`, the call's own time, so that
    /// a call that was never sent is not reported as timed out); `Err` is the envelope to
    /// answer with at once.
    async fn ready_conn(&self, limit: Duration) -> Result<Arc<Conn>, Envelope> {
        let mut rx = self.state.subscribe();
        let wait = self.connect_timeout().min(limit.mul_f64(0.9));
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let state = rx.borrow_and_update().state.clone();
            match state {
                State::Up(c) => return Ok(c),
                State::Closed => {
                    return Err(Envelope::err(
                        ErrKind::NotAvailable,
                        format!("MCP server \"{}\" is closed", self.cfg.name),
                    ));
                }
                State::Reconnecting => {
                    match tokio::time::timeout_at(deadline, rx.changed()).await {
                        Ok(Ok(())) => continue,
                        _ => {
                            return Err(Envelope::err(
                                ErrKind::NotAvailable,
                                format!(
                                    "MCP server \"{}\" is reconnecting and was not back within {}; the call was not sent. Try again in a few seconds.",
                                    self.cfg.name,
                                    quiver_contract::duration_text(wait)
                                ),
                            ));
                        }
                    }
                }
                State::Connecting | State::Down | State::Rejected(_) => {
                    return Err(Envelope::err(ErrKind::NotAvailable, self.absence()));
                }
            }
        }
    }

    /// Calls an upstream tool. At most one reconnect per call; a call whose delivery is
    /// unknown is never replayed; the model never sees raw transport text.
    pub(crate) async fn call(
        self: &Arc<Self>,
        tool: &str,
        input: Value,
        ctx: &CallContext,
    ) -> Envelope {
        // The MCP client span of the OpenTelemetry conventions for MCP; its context goes
        // to the server in `_meta` (and, over HTTP, the `traceparent` header).
        let http = matches!(self.cfg.endpoint, Endpoint::Http { .. });
        let span = tracing::info_span!(
            target: quiver_contract::trace::TARGET,
            "tools/call",
            otel.name = %format_args!("tools/call {tool}"),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            mcp.method.name = "tools/call",
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = tool,
            quiver.server = %self.cfg.name,
            network.transport = if http { "tcp" } else { "pipe" },
            error.type = tracing::field::Empty,
        );
        let envelope =
            tracing::Instrument::instrument(self.call_upstream(tool, input, ctx), span.clone())
                .await;
        if let Envelope::Err { err_kind, .. } = &envelope {
            span.record("error.type", err_kind.as_str());
            span.record("otel.status_code", "ERROR");
        }
        envelope
    }

    /// [`Self::call`] inside its span.
    async fn call_upstream(
        self: &Arc<Self>,
        tool: &str,
        input: Value,
        ctx: &CallContext,
    ) -> Envelope {
        let mut conn = match self.ready_conn(self.call_limit(ctx)).await {
            Ok(c) => c,
            Err(env) => return env,
        };
        let args = match input {
            Value::Object(m) => Some(m),
            Value::Null => None,
            _ => {
                return Envelope::err(ErrKind::ToolFailed, "the arguments must be a JSON object");
            }
        };
        let mut reconnected = false;
        loop {
            match self.attempt(&conn, tool, args.clone(), ctx).await {
                Attempt::Done(env) => return *env,
                Attempt::Unknown(status) => {
                    // Over streamable HTTP, one request's stream can break (a proxy's idle
                    // timeout) while the session is fine, and losing the connection would
                    // fail every other call in flight on it: a ping tells which. A stdio
                    // pipe that broke is the connection.
                    // Any JSON-RPC answer to the ping says so, an error too: a server that
                    // does not implement `ping` answers -32601 on a live session.
                    let http = matches!(self.cfg.endpoint, Endpoint::Http { .. });
                    let alive = http
                        && !conn.peer.is_transport_closed()
                        && matches!(
                            Box::pin(tokio::time::timeout(
                                STREAM_CHECK,
                                conn.peer
                                    .send_request(ClientRequest::PingRequest(Default::default())),
                            ))
                            .await,
                            Ok(Ok(_) | Err(rmcp::ServiceError::McpError(_)))
                        );
                    if !alive {
                        self.lost(conn.generation);
                        if !http {
                            return Box::pin(self.child_gone(conn.generation, tool)).await;
                        }
                        return Envelope::err(
                            ErrKind::NotAvailable,
                            format!(
                                "MCP server \"{}\" unavailable; request outcome is unknown",
                                self.cfg.name
                            ),
                        );
                    }
                    // The server is there and answered the request with a status: it
                    // refused it (the session is fine, the ping says so).
                    if let Some(code) = status.and_then(|c| reqwest::StatusCode::from_u16(c).ok()) {
                        return self.refused(tool, code, None);
                    }
                    // The server is there: only this answer was lost on the way.
                    return Envelope::err(
                        ErrKind::NotAvailable,
                        format!(
                            "MCP server \"{}\" did not complete its answer to `{tool}` (the response stream broke); whether it ran is unknown. The server is reachable: check before calling again if the tool changes anything.",
                            self.cfg.name
                        ),
                    );
                }
                Attempt::NotDelivered if !reconnected => {
                    reconnected = true;
                    self.lost(conn.generation);
                    match Box::pin(self.dial_shared(conn.generation, false)).await {
                        Ok(c) => conn = c,
                        Err(DialError::Closed) => {
                            return Envelope::err(
                                ErrKind::NotAvailable,
                                format!("MCP server \"{}\" is closed", self.cfg.name),
                            );
                        }
                        Err(_) => {
                            // The supervisor may have dialled for us; wait for its outcome.
                            match Box::pin(self.ready_conn(self.call_limit(ctx))).await {
                                Ok(c) if c.generation > conn.generation => conn = c,
                                _ => return self.unavailable_after_reconnect(),
                            }
                        }
                    }
                }
                Attempt::NotDelivered => return self.unavailable_after_reconnect(),
            }
        }
    }

    /// The answer to a call whose stdio connection ended under it: how the process ended
    /// when that is known (the watcher records it a moment after the pipe closes).
    async fn child_gone(&self, generation: u64, tool: &str) -> Envelope {
        let mut rx = self.exits.subscribe();
        let how = tokio::time::timeout(
            EXIT_WAIT * 4,
            rx.wait_for(|e| e.as_ref().is_some_and(|(g, _)| *g == generation)),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|e| e.as_ref().map(|(_, how)| how.clone()));
        let what = match how {
            Some(how) => format!("the server process {how}"),
            None => "its connection closed".to_owned(),
        };
        // The name the model called, not the server's own.
        let called = quiver_contract::mcp_tool_name(&self.cfg.prefix, tool.as_bytes())
            .unwrap_or_else(|_| tool.to_owned());
        Envelope::err(
            ErrKind::NotAvailable,
            format!(
                "MCP server \"{}\" stopped while `{called}` was running ({what}); whether the call finished is unknown. Quiver restarts the server: check before calling again if the tool changes anything.",
                self.cfg.name
            ),
        )
    }

    fn unavailable_after_reconnect(&self) -> Envelope {
        Envelope::err(
            ErrKind::NotAvailable,
            format!(
                "MCP server \"{}\" lost its connection, and Quiver's reconnect did not bring it back; the call was not sent. {}",
                self.cfg.name,
                self.retry_advice()
            ),
        )
    }

    async fn attempt(
        &self,
        conn: &Conn,
        tool: &str,
        args: Option<serde_json::Map<String, Value>>,
        ctx: &CallContext,
    ) -> Attempt {
        if conn.cancel.is_cancelled() {
            return Attempt::NotDelivered;
        }
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        // The rare paths (a roots sync, rmcp's path) are boxed: inline, their states would
        // make this future, which `async_trait` moves into a box for every call, many KiB.
        if self.roots_stale(conn, ctx) {
            Box::pin(self.sync_roots(conn, tool, ctx, self.call_limit(ctx))).await;
        }
        // What the roots' sync took comes out of the call's time.
        let mut timeout = self.call_limit(ctx);
        if let Some(direct) = &conn.direct {
            if let Some(a) = self
                .direct_call(direct, tool, args.as_ref(), ctx, timeout)
                .await
            {
                return a;
            }
            // Handed back unrun: what is left of the caller's deadline.
            if let Some(deadline) = ctx.deadline {
                timeout = timeout.min(deadline.saturating_duration_since(Instant::now()));
            }
        }
        Box::pin(self.rmcp_attempt(conn, tool, args, ctx, timeout)).await
    }

    /// [`Self::attempt`] through rmcp's client: a server without the direct path, or a call
    /// the direct path handed back unrun.
    async fn rmcp_attempt(
        &self,
        conn: &Conn,
        tool: &str,
        args: Option<serde_json::Map<String, Value>>,
        ctx: &CallContext,
        timeout: Duration,
    ) -> Attempt {
        let mut params = rmcp::model::CallToolRequestParams::new(tool.to_owned());
        params.arguments = args;
        if let Some(trace) = quiver_contract::trace::current() {
            let mut meta = rmcp::model::RequestMetaObject::new();
            meta.0.set_traceparent(&trace.traceparent);
            if let Some(state) = &trace.tracestate {
                meta.0.set_tracestate(state);
            }
            params.meta = Some(meta);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        // Registered before sending, so a server request the call causes finds it.
        let registration = self.calls.begin(tool, ctx);
        let sent_at = std::time::Instant::now();
        // No rmcp timeout: `wait` keeps the time, so that the cancellation goes out exactly
        // once, whoever ends the wait (see `CancelOnDrop`).
        let handle = match conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(server = %self.cfg.name, error = %e, "call not sent");
                return Attempt::NotDelivered;
            }
        };
        let id = handle.id.clone();
        registration.sent(id.clone(), handle.progress_token.clone());
        // Whether the request surely never left Quiver (stdio: its write never completed).
        let unsent =
            |id: &rmcp::model::RequestId| conn.written.as_ref().is_some_and(|w| !w.take(id));
        let result = match wait(
            &conn.peer,
            handle,
            timeout,
            &ctx.cancel,
            "cancelled by the caller",
        )
        .await
        {
            Waited::Answer(r) => *r,
            Waited::TimedOut => {
                let stray = conn.written.as_ref().and_then(|w| w.stray_since(sent_at));
                return done(self.timed_out_with(tool, timeout, stray));
            }
            Waited::Cancelled => return done(Self::call_cancelled()),
        };
        // The progress and log messages read before the answer reach the caller first.
        self.settle(&conn.deliveries, "tools/call", tool).await;
        match result {
            Ok(ServerResult::CallToolResult(r)) => {
                let wire = serde_json::to_value(&r).unwrap_or(Value::Null);
                done(to_contract::call_result(&wire))
            }
            // rmcp reads a result it cannot read whole as some other result.
            Ok(ServerResult::CustomResult(raw)) => {
                done(to_contract::raw_call_result(&self.cfg.name, &raw.0))
            }
            Ok(ServerResult::EmptyResult(_)) => done(to_contract::raw_call_result(
                &self.cfg.name,
                &Value::Object(Default::default()),
            )),
            Ok(other) => {
                tracing::warn!(server = %self.cfg.name, ?other, "unexpected reply to tools/call");
                done(Envelope::err(
                    ErrKind::ToolFailed,
                    format!("MCP server \"{}\" sent an unexpected reply", self.cfg.name),
                ))
            }
            // A 404 on the resend after a new session (the direct path hands a 404 to rmcp,
            // which takes it for an expired session): the server refused the call itself if
            // the new session answers the ping.
            Err(e) if crate::client::classify::session_expired(&e) => Attempt::Unknown(Some(404)),
            Err(e) => {
                tracing::debug!(server = %self.cfg.name, error = ?e, "call failed");
                match classify_service(&e) {
                    Class::Peer => done(self.peer_failed(&match &e {
                        rmcp::service::ServiceError::McpError(d)
                            if d.code.0 == crate::client::pipe::UNREADABLE_ANSWER =>
                        {
                            format!("{}; the tool may have run", d.message)
                        }
                        e => peer_message(e),
                    })),
                    Class::Timeout => done(self.timed_out(tool, timeout)),
                    // Whether the session survived is the ping's to tell (a re-initialize
                    // refused after an expiry is a status too).
                    Class::Status(code) => Attempt::Unknown(Some(code)),
                    Class::Refused => Attempt::NotDelivered,
                    Class::Drop if unsent(&id) => Attempt::NotDelivered,
                    Class::Drop => Attempt::Unknown(None),
                    Class::Other => done(self.incomplete()),
                }
            }
        }
    }
}

impl Upstream {
    /// A downstream client said its roots changed: if this server holds them, they are
    /// fetched again before its next call.
    /// Waits at most `limit` for the server's first `roots/list` to be answered.
    pub(crate) async fn first_roots(&self, limit: Duration) {
        self.roots.first_given(limit).await;
    }

    /// Tells a per-session server its session's roots changed, so it fetches them again.
    pub(crate) fn tell_roots_changed(&self) {
        let Some(conn) = self.conn() else { return };
        let server = self.cfg.name.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.peer.notify_roots_list_changed().await {
                tracing::debug!(server = %server, error = %e, "roots/list_changed not sent");
            }
        });
    }

    pub(crate) fn roots_changed(&self, who: &Who) {
        self.roots.forget(who);
    }

    /// Whether the server holds another client's roots than this call's (or none it should).
    fn roots_stale(&self, conn: &Conn, ctx: &CallContext) -> bool {
        // A per-session server holds its session's roots, and serves no other client.
        if self.session.get().is_some() {
            return false;
        }
        let has_roots = ctx.client.as_ref().is_some_and(|c| c.features().roots);
        self.roots
            .stale_for(conn.generation, &Who::of(ctx), has_roots)
    }

    /// Before a call from a client other than the one whose roots the server holds: tells
    /// the server its roots changed and waits (at most [`REFETCH_WAIT`], and never past the
    /// call's own limit) for it to fetch them again and for the answer to be delivered,
    /// registered as this call so that its `roots/list` reaches this call's client
    /// (`roots.rs`).
    async fn sync_roots(&self, conn: &Conn, label: &str, ctx: &CallContext, limit: Duration) {
        let who = Who::of(ctx);
        let has_roots = ctx.client.as_ref().is_some_and(|c| c.features().roots);
        if self.session.get().is_some() || !self.roots.stale_for(conn.generation, &who, has_roots) {
            return;
        }
        // Registered while the server fetches, so that its `roots/list` reaches this call's
        // client; one that comes after is answered with none (`list_roots`).
        let registration = self.calls.begin_unsent(label, ctx);
        let notify = async {
            match conn.peer.notify_roots_list_changed().await {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!(server = %self.cfg.name, error = %e, "roots/list_changed not sent");
                    false
                }
            }
        };
        let limit = limit.min(REFETCH_WAIT);
        let sync = async {
            if let Refetch::Asked(mark) = self.roots.refetch(notify, limit).await {
                // The server asked and this call's client has not answered: no longer
                // registered, its request is answered with none; that answer, not the
                // previous client's roots, must reach the server before the call does.
                drop(registration);
                self.roots.settle(mark, limit).await;
            }
        };
        tokio::select! {
            () = sync => {}
            () = ctx.cancel.cancelled() => {}
        }
    }

    /// Sends `request` (a `prompts/get` or `resources/read`) on `conn` on behalf of the
    /// downstream request `ctx` describes: registered as a call in flight under `label`, so a
    /// server request it causes (an elicitation while rendering a prompt) is relayed to
    /// `ctx.client` like a tool call's; `ctx.cancel` cancels it upstream. Bounded by `limit`.
    pub(crate) async fn request_for(
        &self,
        conn: &Conn,
        label: &str,
        request: ClientRequest,
        limit: Duration,
        ctx: &CallContext,
    ) -> Result<ServerResult, ServiceError> {
        let cancelled = || ServiceError::Cancelled {
            reason: Some("cancelled by the client".into()),
        };
        if ctx.cancel.is_cancelled() {
            return Err(cancelled());
        }
        let synced = Instant::now();
        self.sync_roots(conn, label, ctx, limit).await;
        let limit = limit.saturating_sub(synced.elapsed());
        let registration = self.calls.begin(label, ctx);
        // This timeout covers the sending (a stdio child that stops reading its stdin);
        // `wait` the answer.
        let sent = conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options());
        let handle = tokio::time::timeout(limit, sent)
            .await
            .map_err(|_| ServiceError::Timeout { timeout: limit })??;
        registration.sent(handle.id.clone(), handle.progress_token.clone());
        match wait(
            &conn.peer,
            handle,
            limit,
            &ctx.cancel,
            "cancelled by the client",
        )
        .await
        {
            Waited::Answer(r) => {
                // The progress and log messages read before the answer reach the caller
                // first, as a tool call's do.
                self.settle(&conn.deliveries, "request", label).await;
                *r
            }
            Waited::TimedOut => Err(ServiceError::Timeout { timeout: limit }),
            Waited::Cancelled => Err(cancelled()),
        }
    }
}

/// How waiting for the answer to a request rmcp sent ended.
enum Waited {
    /// rmcp finished the request: an answer, an error, or a closed transport.
    Answer(Box<Result<ServerResult, ServiceError>>),
    /// No answer within the limit; the upstream was told.
    TimedOut,
    /// The caller cancelled; the upstream was told.
    Cancelled,
}

/// Waits for the answer to `handle`'s request, at most `limit`, or until `cancel`. The
/// upstream gets `notifications/cancelled` for the request exactly once if it is not
/// answered: on the timeout, on `cancel`, and when this future is dropped (the dispatcher's
/// own timeout, shorter than the call timeout, or a caller gone).
async fn wait(
    peer: &Peer<RoleClient>,
    handle: rmcp::service::RequestHandle<RoleClient>,
    limit: Duration,
    cancel: &CancellationToken,
    cancel_reason: &'static str,
) -> Waited {
    let mut guard = CancelOnDrop {
        peer: peer.clone(),
        id: Some(handle.id.clone()),
        reason: "the caller gave up",
    };
    tokio::select! {
        r = tokio::time::timeout(limit, handle.await_response()) => match r {
            Ok(answer) => {
                guard.id = None;
                Waited::Answer(Box::new(answer))
            }
            Err(_) => {
                guard.reason = "timed out";
                guard.send().await;
                Waited::TimedOut
            }
        },
        _ = cancel.cancelled() => {
            guard.reason = cancel_reason;
            guard.send().await;
            Waited::Cancelled
        }
    }
}

/// How long sending a cancellation may take before it is given up (a child that stopped
/// reading its stdin must not hold a task for ever).
const CANCEL_SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `notifications/cancelled` for a request rmcp sent and nobody waits for any more,
/// unless disarmed (`id` taken): the rmcp counterpart of the direct path's guard.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<rmcp::model::RequestId>,
    reason: &'static str,
}

impl CancelOnDrop {
    fn message(&mut self) -> Option<CancelledNotificationParam> {
        let id = self.id.take()?;
        Some(CancelledNotificationParam::new(
            Some(id),
            Some(self.reason.into()),
        ))
    }

    /// Sends it now (and disarms).
    async fn send(&mut self) {
        if let Some(p) = self.message() {
            let _ = tokio::time::timeout(CANCEL_SEND_TIMEOUT, self.peer.notify_cancelled(p)).await;
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(p) = self.message() else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        rt.spawn(async move {
            let _ = tokio::time::timeout(CANCEL_SEND_TIMEOUT, peer.notify_cancelled(p)).await;
        });
    }
}

/// The text of a JSON-RPC error from the peer (its own words, not transport text).
fn peer_message(e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(d) => {
            crate::client::pipe::peer_error_text(i64::from(d.code.0), &d.message, d.data.as_ref())
        }
        other => other.to_string(),
    }
}
