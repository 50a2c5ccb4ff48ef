//! The direct path for `tools/call` to a streamable-HTTP upstream.
//!
//! rmcp's streamable-HTTP client hands a request through about nine tasks on its way out and
//! back (the peer's service loop, a send task, the transport worker, a task per SSE response
//! stream, hyper's connection task, and back), and on a small machine each hand-over costs a
//! wake-up of another thread. Here the calling task posts the request itself, on the same
//! connection pool and session rmcp set up, and reads the answer (a JSON body, or an SSE
//! stream: `direct/stream.rs`) in place. Everything on the call's response stream belongs to
//! that call, so a server request (sampling, elicitation, roots) or a log message found there
//! goes to the call's own client channel, answered on the same session: no guessing which
//! call it was.
//!
//! rmcp still owns the session: the handshake, the standalone GET stream, liveness pings,
//! lists, resources and prompts, and every recovery. A call this path cannot complete
//! without rmcp's state machine goes to rmcp unsent (the server rejected it with a 4xx, so it
//! never ran, for example an expired session, which rmcp then re-initializes). A response
//! stream that closes before the answer is resumed with `Last-Event-ID` (SEP-1699), as rmcp
//! would.
//!
//! Used for the streamable-HTTP protocols that have a session (2025-03-26 to 2025-11-25, see
//! `Protocol`); a later protocol's per-request headers are rmcp's to build.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use hyper::body::Bytes;
use quiver_contract::{CallContext, Envelope, ErrKind, trace::TraceContext};
use reqwest::{
    StatusCode,
    header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue},
};
use rmcp::model::{NumberOrString, ProgressToken, RequestId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{
    Upstream,
    call::{Attempt, done},
};
use crate::client::{
    h1::{self, Pool},
    http::SessionSlot,
    to_contract,
};
use crate::protocol::Protocol;

mod stream;

const SESSION_HEADER: &str = "mcp-session-id";

/// How long sending a message that awaits no answer (a cancellation, the answer to a server
/// request) may take: a hung upstream must not hold a socket and a task per call for ever.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP connection's direct path: rmcp's HTTP client (and connection pool), the
/// headers rmcp sends on every request, and the session rmcp uses.
pub(crate) struct DirectPath {
    http: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
    session: SessionSlot,
    /// The connection's generation (for a re-list its `list_changed` asks for).
    generation: u64,
    /// Plain `http`: connections the calling task drives itself (`h1.rs`).
    pool: Option<Arc<Pool>>,
    /// Answers on this connection that could not be used, for a warning once per connection
    /// (and at the 10th, 100th, ...) rather than once per call.
    unusable: AtomicU64,
}

/// A response body, as bytes.
type BodyStream = futures::stream::BoxStream<'static, Result<Bytes, std::io::Error>>;

/// The largest JSON response body read.
const MAX_JSON_BODY: usize = 64 << 20;

/// A whole body; `None` when it is over [`MAX_JSON_BODY`].
async fn collect(mut body: BodyStream) -> Result<Option<Vec<u8>>, std::io::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        if out.len() + chunk.len() > MAX_JSON_BODY {
            return Ok(None);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Some(out))
}

fn reqwest_body(r: reqwest::Response) -> BodyStream {
    r.bytes_stream().map_err(std::io::Error::other).boxed()
}

/// Why a request has no response.
enum Sent {
    /// It never left (no connection).
    Not(String),
    /// It may have reached the server.
    Maybe(String),
}

impl DirectPath {
    /// The direct path of a connection that negotiated `protocol`, if it speaks that version.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site, which reads the connection's pieces out of its dial"
    )]
    pub(crate) fn new(
        http: reqwest::Client,
        url: reqwest::Url,
        configured: &[(HeaderName, HeaderValue)],
        token: Option<&str>,
        protocol: Protocol,
        session: SessionSlot,
        generation: u64,
        connect_timeout: Duration,
    ) -> Option<DirectPath> {
        // Streamable HTTP with a session: a later protocol's per-request `Mcp-*` headers are
        // rmcp's to build.
        if !(protocol.streamable_http() && protocol.has_session()) {
            return None;
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("text/event-stream, application/json"),
        );
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (k, v) in configured {
            headers.insert(k.clone(), v.clone());
        }
        if let Some(t) = token {
            let v = HeaderValue::from_str(&format!("Bearer {t}")).ok()?;
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        headers.insert(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static(protocol.as_str()),
        );
        Some(DirectPath {
            http,
            pool: Pool::for_url(&url, connect_timeout),
            url,
            headers,
            session,
            generation,
            unusable: AtomicU64::new(0),
        })
    }

    /// POSTs a request: status, content type (lower case), `Retry-After` and the body to
    /// read.
    async fn request(
        &self,
        session: Option<&str>,
        trace: Option<&TraceContext>,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Head, BodyStream), Sent> {
        let content_type = |h: &HeaderMap| Head {
            keep: None,
            content_type: h
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_ascii_lowercase(),
            retry_after: h
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.chars().take(64).collect()),
        };
        let Some(pool) = &self.pool else {
            // Boxed: reqwest's future is large, and this one is not the in-task pool's.
            return match Box::pin(self.post(session, trace, body).send()).await {
                Ok(r) => Ok((r.status(), content_type(r.headers()), reqwest_body(r))),
                // reqwest names the URL, which may carry a secret.
                Err(e) if e.is_connect() => Err(Sent::Not(crate::client::config::redact_urls(
                    &e.to_string(),
                ))),
                Err(e) => Err(Sent::Maybe(crate::client::config::redact_urls(
                    &e.to_string(),
                ))),
            };
        };
        let mut headers = self.headers.clone();
        if let Some(s) = session {
            let v = HeaderValue::from_str(s).map_err(|e| Sent::Not(e.to_string()))?;
            headers.insert(SESSION_HEADER, v);
        }
        trace_headers(&mut headers, trace);
        match pool.post(headers, body).await {
            Ok((head, reply)) => {
                let mut info = content_type(head.headers());
                info.keep = Some(reply.keeper());
                Ok((head.status(), info, reply.boxed()))
            }
            Err(e @ h1::Error::Connect(_)) => Err(Sent::Not(e.to_string())),
            Err(e) => Err(Sent::Maybe(e.to_string())),
        }
    }

    fn post(
        &self,
        session: Option<&str>,
        trace: Option<&TraceContext>,
        body: Vec<u8>,
    ) -> reqwest::RequestBuilder {
        let mut headers = self.headers.clone();
        trace_headers(&mut headers, trace);
        let mut req = self.http.post(self.url.clone()).headers(headers).body(body);
        if let Some(s) = session {
            req = req.header(SESSION_HEADER, s);
        }
        req
    }

    /// Sends one message that awaits no answer (a response, an error, a notification),
    /// giving up after [`SEND_TIMEOUT`]; whether the server accepted it.
    ///
    /// A message whose connection failed under it is posted once more:
    /// such a message (a cancellation, an answer) is harmless to receive twice, and losing a
    /// cancellation leaves the upstream running a call nobody waits for.
    async fn send(&self, session: Option<&str>, message: &Value) -> bool {
        let body = serde_json::to_vec(message).unwrap_or_default();
        let send = async {
            let mut again = true;
            loop {
                match self.post(session, None, body.clone()).send().await {
                    Err(e) if again && !e.is_timeout() => {
                        tracing::debug!(error = %e, "message to upstream not sent; posting it again");
                        again = false;
                    }
                    other => return other,
                }
            }
        };
        match tokio::time::timeout(SEND_TIMEOUT, send).await {
            Ok(Ok(r)) if r.status().is_success() => true,
            Ok(Ok(r)) => {
                tracing::debug!(status = %r.status(), "upstream refused a message");
                false
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "message to upstream not sent");
                false
            }
            Err(_) => {
                tracing::debug!(
                    "upstream did not take a message within {} s; given up",
                    SEND_TIMEOUT.as_secs()
                );
                false
            }
        }
    }
}

/// Sends `notifications/cancelled` for a call whose caller gave up (also when its future is
/// dropped, e.g. by the dispatcher's timeout), unless disarmed.
struct CancelOnDrop {
    direct: Arc<DirectPath>,
    session: Option<Arc<str>>,
    id: Arc<str>,
    reason: &'static str,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let direct = self.direct.clone();
        let session = self.session.clone();
        let message = json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": &*self.id, "reason": self.reason},
        });
        rt.spawn(async move {
            direct.send(session.as_deref(), &message).await;
        });
    }
}

/// Puts the trace context on a request as W3C headers, so an HTTP upstream (or a proxy
/// before it) continues the trace; a value that is not a header value is left out.
pub(crate) fn trace_headers(headers: &mut HeaderMap, trace: Option<&TraceContext>) {
    let Some(trace) = trace else { return };
    if let Ok(v) = HeaderValue::from_str(&trace.traceparent) {
        headers.insert(HeaderName::from_static("traceparent"), v);
    }
    if let Some(Ok(v)) = trace.tracestate.as_deref().map(HeaderValue::from_str) {
        headers.insert(HeaderName::from_static("tracestate"), v);
    }
}

#[derive(Serialize)]
struct CallRequest<'a> {
    jsonrpc: &'static str,
    id: &'a str,
    method: &'static str,
    params: CallParams<'a>,
}

#[derive(Serialize)]
struct CallParams<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a Map<String, Value>>,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<CallMeta<'a>>,
}

/// A call's `_meta`: its progress token, and the trace context (SEP-414).
#[derive(Serialize)]
struct CallMeta<'a> {
    #[serde(rename = "progressToken", skip_serializing_if = "Option::is_none")]
    progress_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<&'a str>,
}

/// Any JSON-RPC message from the server.
#[derive(Deserialize)]
struct Incoming {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Value>,
    /// Present (`null` included) or absent: JSON-RPC allows exactly one of `result` and
    /// `error`, and a `null` result is one that is there.
    #[serde(default, deserialize_with = "present")]
    result: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    error: Option<Value>,
}

/// A member that is there, whatever its value (`null` too).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    <Value as serde::Deserialize>::deserialize(d).map(Some)
}

/// The `error` member's message, however the server shaped it.
fn error_message(error: &Value) -> String {
    let message = match error.get("message") {
        Some(Value::String(m)) => m.clone(),
        Some(other) => other.to_string(),
        None => return error.to_string(),
    };
    let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
    crate::client::pipe::peer_error_text(code, &message, error.get("data"))
}

/// How the exchange ended.
enum Exchange {
    /// The `result` of our request.
    Result(Value),
    /// A JSON-RPC error answering our request: the server's words.
    PeerError(String),
    /// Rejected before it ran; rmcp should send it (and recover the session).
    Fallback,
    /// Never reached the server.
    NotDelivered,
    /// May have reached the server; the answer is lost.
    Unknown(String),
    /// As `Unknown`, and the server is gone: its stream broke and it refused the connection
    /// to resume it.
    Gone(String),
    /// The server answered with something that is not an answer.
    Failed(String),
    /// The server answered with an HTTP error and no JSON-RPC error: its status, and
    /// `Retry-After` (a 4xx refused the request before it ran).
    Refused(StatusCode, Option<String>),
}

/// What a response's head says besides its status.
struct Head {
    /// The content type, lower case.
    content_type: String,
    /// An in-task connection's flag: set once its body may be finished in the pool.
    keep: Option<Arc<AtomicBool>>,
    /// `Retry-After`, as sent (cut at 64 characters).
    retry_after: Option<String>,
}

/// What one message on our stream was.
enum Seen {
    Answer(Exchange),
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    Other,
}

fn is_ours(id: Option<&Value>, ours: &str) -> bool {
    id.and_then(Value::as_str) == Some(ours)
}

/// Whether `n` is 10, 100, 1000, ...
fn is_power_of_ten(n: u64) -> bool {
    n >= 10 && 10u64.pow(n.ilog10()) == n
}

/// What a JSON body that is not the call's answer is, for the operator and the model: no
/// bytes, bytes that are not text, text that is not JSON, JSON of another shape, or a
/// JSON-RPC message that answers something else (`error` is the parse's, if it failed).
fn unusable_json(body: &[u8], error: Option<serde_json::Error>) -> String {
    if body.iter().all(u8::is_ascii_whitespace) {
        return "an empty body".into();
    }
    if let Err(e) = std::str::from_utf8(body) {
        return format!(
            "a body that is not UTF-8 text (byte {} is not), so not JSON",
            e.valid_up_to()
        );
    }
    match error {
        None => {
            // The id it answers, when it has one: a server answering with the wrong ids is
            // told apart from one that sent something else.
            let answers = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v.get("id").filter(|id| !id.is_null()).map(Value::to_string))
                .map_or(String::new(), |id| format!(", it answers id {id}"));
            format!(
                "a JSON-RPC message that is not the answer to this call (no result or error for its id{answers})"
            )
        }
        Some(e) if e.is_data() && body.trim_ascii_start().starts_with(b"{") => {
            "JSON that is not a JSON-RPC message (a member of the wrong type)".into()
        }
        Some(e) if e.is_data() => "JSON that is not a JSON-RPC message (not an object)".into(),
        Some(e) => format!("a body that is not JSON ({e})"),
    }
}

fn classify(message: Incoming, ours: &str) -> Seen {
    match (message.method, message.id) {
        (Some(method), Some(id)) => Seen::Request {
            id,
            method,
            params: message.params.unwrap_or(Value::Null),
        },
        (Some(method), None) => Seen::Notification {
            method,
            params: message.params.unwrap_or(Value::Null),
        },
        (None, id) if is_ours(id.as_ref(), ours) => {
            // The same rule as the stdio reader's (`pipe.rs`): an answer that is not one
            // JSON-RPC response fails the call, so an error the server meant is never
            // passed on as a success.
            Seen::Answer(match (message.result, message.error) {
                (Some(_), Some(_)) => Exchange::Failed("it has both `result` and `error`".into()),
                (Some(Value::Null), None) => {
                    Exchange::Failed("the result is null, not an object".into())
                }
                (Some(r), None) => Exchange::Result(r),
                (None, Some(e)) => Exchange::PeerError(error_message(&e)),
                (None, None) => Exchange::Failed("it has neither `result` nor `error`".into()),
            })
        }
        _ => Seen::Other,
    }
}

impl Upstream {
    /// The answer to a `tools/call` the server refused over HTTP before running it.
    pub(super) fn refused(
        &self,
        tool: &str,
        status: StatusCode,
        retry_after: Option<&str>,
    ) -> Envelope {
        let server = &self.cfg.name;
        let what = status.canonical_reason().map_or_else(
            || status.as_str().to_owned(),
            |r| format!("{} {r}", status.as_str()),
        );
        let message = match status.as_u16() {
            401 | 403 => format!(
                "MCP server \"{server}\" refused `{tool}` with HTTP {what}: Quiver's credentials for it are missing or not accepted (an operator must fix the server's token or headers); the call was not run"
            ),
            429 => format!(
                "MCP server \"{server}\" is limiting its calls (HTTP {what}); `{tool}` was not run. Try again {}",
                retry_after.map_or_else(
                    || "later".to_owned(),
                    |r| match r.trim().parse::<u64>() {
                        Ok(secs) => format!("in {secs} s"),
                        Err(_) => format!("after {r}"),
                    }
                )
            ),
            // A server error may come after the call ran in part.
            _ if status.is_server_error() => format!(
                "MCP server \"{server}\" failed `{tool}` with HTTP {what}; whether the call ran is unknown, so it was not sent again{}",
                retry_after.map_or_else(String::new, |r| match r.trim().parse::<u64>() {
                    Ok(secs) => format!(". Try again in {secs} s"),
                    Err(_) => format!(". Try again after {r}"),
                })
            ),
            _ => format!(
                "MCP server \"{server}\" refused `{tool}` with HTTP {what}; the call was not run"
            ),
        };
        Envelope::err(ErrKind::NotAvailable, message)
    }

    /// Calls `tool` over the direct path; `None` when the call must go through rmcp instead
    /// (nothing was executed upstream).
    pub(super) async fn direct_call(
        &self,
        direct: &Arc<DirectPath>,
        tool: &str,
        args: Option<&Map<String, Value>>,
        ctx: &CallContext,
        timeout: Duration,
    ) -> Option<Attempt> {
        self.counters.direct_calls.fetch_add(1, Ordering::Relaxed);
        // Unique per upstream, across its connections: a call on an old connection's direct
        // path may still be in flight when a new connection's starts.
        let id: Arc<str> =
            format!("quiver-{}", self.direct_ids.fetch_add(1, Ordering::Relaxed)).into();
        let session = direct.session.get();
        // Only a caller that wants progress asks for it: a server may answer a call without
        // a progress token more cheaply (Quiver's own server does).
        let progress_token = ctx
            .client
            .as_ref()
            .is_some_and(|c| c.wants_progress())
            .then_some(&*id);
        let trace = quiver_contract::trace::current();
        let meta = (progress_token.is_some() || trace.is_some()).then(|| CallMeta {
            progress_token,
            traceparent: trace.as_ref().map(|t| t.traceparent.as_str()),
            tracestate: trace.as_ref().and_then(|t| t.tracestate.as_deref()),
        });
        let body = serde_json::to_vec(&CallRequest {
            jsonrpc: "2.0",
            id: &id,
            method: "tools/call",
            params: CallParams {
                name: tool,
                arguments: args,
                meta,
            },
        })
        .unwrap_or_default();
        // Registered before sending, so a server request on the standalone stream finds it.
        let registration = self.calls.begin(tool, ctx);
        registration.sent(
            RequestId::String(id.clone()),
            ProgressToken(NumberOrString::String(id.clone())),
        );
        let mut guard = CancelOnDrop {
            direct: direct.clone(),
            session: session.clone(),
            id: id.clone(),
            reason: "the caller gave up",
            armed: true,
        };
        let exchange = self.exchange(
            direct,
            &id,
            body,
            (session.as_deref(), trace.as_ref()),
            ctx,
            tool,
        );
        let outcome = tokio::select! {
            r = tokio::time::timeout(timeout, exchange) => match r {
                Ok(e) => e,
                Err(_) => {
                    guard.reason = "timed out";
                    return Some(done(self.timed_out(tool, timeout)));
                }
            },
            _ = ctx.cancel.cancelled() => {
                guard.reason = "cancelled by the caller";
                return Some(done(Self::call_cancelled()));
            }
        };
        guard.armed = false;
        match outcome {
            Exchange::Result(v) => Some(done(to_contract::raw_call_result(&self.cfg.name, &v))),
            Exchange::PeerError(m) => Some(done(self.peer_failed(&m))),
            Exchange::Failed(why) => {
                // Every such call fails with the reason; the operator is told once per
                // connection, and again as they mount up (a server answering every call
                // with the wrong ids would otherwise flood the log).
                let n = direct.unusable.fetch_add(1, Ordering::Relaxed) + 1;
                let server = &self.cfg.name;
                if n == 1 {
                    tracing::warn!(%server, "tools/call answered unusably: {why} (said once per connection; later ones on it are logged at debug level, and counted at the 10th, 100th, ...)");
                } else if is_power_of_ten(n) {
                    tracing::warn!(%server, "{n} tools/call answers on this connection could not be used; the latest: {why}");
                } else {
                    tracing::debug!(%server, "tools/call answered unusably: {why}");
                }
                Some(done(self.unusable(tool, &why)))
            }
            Exchange::Refused(status, retry_after) => {
                tracing::warn!(server = %self.cfg.name, %status, "tools/call refused");
                Some(done(self.refused(tool, status, retry_after.as_deref())))
            }
            Exchange::Fallback => {
                self.counters
                    .direct_handoffs
                    .fetch_add(1, Ordering::Relaxed);
                None
            }
            Exchange::NotDelivered => Some(Attempt::NotDelivered),
            // rmcp's session is independent of this call's HTTP exchange: a broken exchange
            // fails this call (never sent again) and leaves the connection to the others.
            // Its stream broke and the server refused a new connection: the connection is
            // lost (readiness and the other calls learn it now, not at the next liveness
            // ping), and Quiver reconnects.
            Exchange::Gone(why) => {
                tracing::warn!(server = %self.cfg.name, "tools/call outcome unknown: {why}");
                if let Some(me) = self.me.upgrade() {
                    me.lost(direct.generation);
                }
                Some(done(Envelope::err(
                    ErrKind::NotAvailable,
                    format!(
                        "MCP server \"{}\" went away while answering `{tool}` (it refused the connection to resume its answer); the outcome is unknown, so the call was not sent again. Quiver reconnects to it: check before calling again if the tool changes anything",
                        self.cfg.name
                    ),
                )))
            }
            Exchange::Unknown(why) => {
                tracing::info!(server = %self.cfg.name, "tools/call outcome unknown: {why}");
                Some(done(Envelope::err(
                    ErrKind::NotAvailable,
                    format!(
                        "MCP server \"{}\" did not complete its answer to `{tool}`; the outcome is unknown, so the call was not sent again",
                        self.cfg.name
                    ),
                )))
            }
        }
    }

    /// Posts the request and reads its answer.
    async fn exchange(
        &self,
        direct: &DirectPath,
        id: &str,
        body: Vec<u8>,
        (session, trace): (Option<&str>, Option<&TraceContext>),
        ctx: &CallContext,
        tool: &str,
    ) -> Exchange {
        let (status, head, reply) = match direct.request(session, trace, body).await {
            Ok(r) => r,
            Err(Sent::Not(why)) => {
                tracing::debug!(server = %self.cfg.name, "tools/call not sent: {why}");
                return Exchange::NotDelivered;
            }
            Err(Sent::Maybe(why)) => return Exchange::Unknown(why),
        };
        let content_type = head.content_type;
        if status.is_client_error() || status.is_redirection() {
            // Rejected, not run. An expired session (a 404, or server-everything's 400) and
            // a redirect rmcp follows (307, 308) go to rmcp, which sends it again and
            // recovers or reports as it would. Anything else (401, 403, 429, a 301 that
            // would turn the POST into a GET) is answered now, with the status: sending
            // it again at once would not help, and rmcp's error for it loses the reason.
            return match status.as_u16() {
                400 | 404 | 307 | 308 => {
                    tracing::debug!(server = %self.cfg.name, %status, "tools/call rejected; handing it to rmcp");
                    Exchange::Fallback
                }
                _ => Exchange::Refused(status, head.retry_after),
            };
        }
        if content_type.starts_with("text/event-stream") && status == StatusCode::OK {
            return self
                .read_stream(direct, id, (reply, head.keep), session, ctx, tool)
                .await;
        }
        let body = match collect(reply).await {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Exchange::Failed(format!(
                    "its body is over {} MiB, more than Quiver reads",
                    MAX_JSON_BODY >> 20
                ));
            }
            Err(e) => return Exchange::Unknown(e.to_string()),
        };
        let parsed = content_type
            .starts_with("application/json")
            .then(|| serde_json::from_slice::<Incoming>(&body).map(|m| classify(m, id)));
        match parsed {
            Some(Ok(Seen::Answer(a))) => a,
            // A 5xx (or another status) with no JSON-RPC error in its body: the status is
            // what the model and the operator can go on.
            _ if !status.is_success() => Exchange::Refused(status, head.retry_after),
            None => Exchange::Failed(format!(
                "HTTP {status} with {}, not a JSON-RPC answer",
                if content_type.is_empty() {
                    "no content type"
                } else {
                    content_type.as_str()
                }
            )),
            Some(seen) => Exchange::Failed(format!(
                "HTTP {status} with {content_type}, {}",
                unusable_json(&body, seen.err())
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_answers_are_counted_aloud_at_powers_of_ten() {
        let loud: Vec<u64> = (0..=100_000).filter(|&n| is_power_of_ten(n)).collect();
        assert_eq!(loud, [10, 100, 1000, 10_000, 100_000]);
        assert!(!is_power_of_ten(u64::MAX));
    }

    fn incoming(v: Value) -> Incoming {
        serde_json::from_value(v).expect("a JSON-RPC message")
    }

    #[test]
    fn only_our_answer_ends_the_exchange() {
        let ours = "quiver-7";
        let answer =
            incoming(json!({"jsonrpc": "2.0", "id": "quiver-7", "result": {"content": []}}));
        assert!(matches!(
            classify(answer, ours),
            Seen::Answer(Exchange::Result(_))
        ));
        let error = incoming(
            json!({"jsonrpc": "2.0", "id": "quiver-7", "error": {"code": -32602, "message": "bad"}}),
        );
        assert!(
            matches!(classify(error, ours), Seen::Answer(Exchange::PeerError(m)) if m == "bad")
        );
        // Another request's answer, a numeric id equal in digits, and an id-less error are not ours.
        for other in [
            json!({"jsonrpc": "2.0", "id": "quiver-8", "result": {}}),
            json!({"jsonrpc": "2.0", "id": 7, "result": {}}),
            json!({"jsonrpc": "2.0", "error": {"code": -32000, "message": "x"}}),
        ] {
            assert!(matches!(classify(incoming(other), ours), Seen::Other));
        }
        let note =
            incoming(json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}));
        assert!(
            matches!(classify(note, ours), Seen::Notification { method, .. } if method == "notifications/progress")
        );
        // A malformed error member still answers the call, in the server's words.
        let odd = incoming(
            json!({"jsonrpc": "2.0", "id": "quiver-7", "error": {"code": 1, "message": 42}}),
        );
        assert!(matches!(classify(odd, ours), Seen::Answer(Exchange::PeerError(m)) if m == "42"));
        // An answer that is not one JSON-RPC response fails the call, as over stdio: never
        // a success that drops the error the server meant.
        for (odd, why) in [
            (
                json!({"jsonrpc": "2.0", "id": "quiver-7", "result": {"content": []}, "error": {"code": 1, "message": "e"}}),
                "it has both `result` and `error`",
            ),
            (
                json!({"jsonrpc": "2.0", "id": "quiver-7", "result": null}),
                "the result is null, not an object",
            ),
            (
                json!({"jsonrpc": "2.0", "id": "quiver-7"}),
                "it has neither `result` nor `error`",
            ),
        ] {
            assert!(
                matches!(classify(incoming(odd.clone()), ours), Seen::Answer(Exchange::Failed(m)) if m == why),
                "{odd}"
            );
        }
        let request = incoming(json!({"jsonrpc": "2.0", "id": 3, "method": "roots/list"}));
        assert!(
            matches!(classify(request, ours), Seen::Request { method, .. } if method == "roots/list")
        );
    }

    #[test]
    fn the_direct_path_speaks_only_session_era_protocols() {
        let url = reqwest::Url::parse("http://127.0.0.1:1/mcp").unwrap();
        let direct = |p: &str| {
            DirectPath::new(
                crate::client::http::client(&url, None)
                    .unwrap()
                    .reqwest()
                    .clone(),
                url.clone(),
                &[],
                Some("t0k"),
                Protocol::parse(p).expect("a version this crate knows"),
                SessionSlot::default(),
                1,
                Duration::from_secs(1),
            )
        };
        assert!(direct("2024-11-05").is_none());
        assert!(direct("2026-07-28").is_none());
        let l = direct("2025-11-25").expect("a direct path");
        assert_eq!(l.headers["mcp-protocol-version"], "2025-11-25");
        assert_eq!(l.headers["authorization"], "Bearer t0k");
        assert_eq!(l.headers["accept"], "text/event-stream, application/json");
        assert!(
            l.pool.is_some(),
            "a plain-http upstream gets in-task connections"
        );
    }

    /// A message to an upstream that accepts the connection and never answers is given up
    /// (the clock is paused: the test waits no real time).
    #[tokio::test(start_paused = true)]
    async fn a_message_to_a_hung_upstream_is_given_up() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url =
            reqwest::Url::parse(&format!("http://{}/mcp", listener.local_addr().unwrap())).unwrap();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let direct = DirectPath::new(
            crate::client::http::client(&url, None)
                .unwrap()
                .reqwest()
                .clone(),
            url.clone(),
            &[],
            None,
            Protocol::V2025_11_25,
            SessionSlot::default(),
            1,
            Duration::from_secs(1),
        )
        .expect("a direct path");
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                            "params": {"requestId": "quiver-1"}});
        // The hang guard is far beyond the send's own limit.
        let sent = tokio::time::timeout(Duration::from_secs(3600), direct.send(None, &cancel))
            .await
            .expect("the send gave up on its own");
        assert!(!sent);
        hold.abort();
    }
}
