//! The HTTP client for streamable-HTTP upstreams: rustls with ring, and a redirect policy
//! that never leaves the configured origin, so configured headers and the bearer token are
//! sent to that origin only.
//!
//! It wraps rmcp's reqwest client for one case rmcp leaves hanging: a server that rejects a
//! request at the HTTP level with a JSON-RPC error that has no id (server-everything answers
//! an unknown session with HTTP 400 and such an error). rmcp cannot route an id-less error
//! to the request, so the call would wait for its timeout. Here such an answer to a request
//! becomes a transport error: "session expired" when a session was attached and the error
//! is about the session (rmcp then re-initializes, as for the spec's HTTP 404), otherwise a
//! failed request naming the server's message.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{StreamExt, stream::BoxStream};
use reqwest::{
    Url,
    header::{HeaderName, HeaderValue},
    redirect,
};
use rmcp::{
    model::{ClientJsonRpcMessage, JsonRpcMessage},
    transport::streamable_http_client::{
        StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};
use sse_stream::{Error as SseError, Sse};

use super::{
    pipe::{Verdict, judge, unreadable_answer},
    roots::Roots,
};
use crate::sync::lock;

/// Whether two URLs share scheme, host and port.
pub(crate) fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str().map(str::to_ascii_lowercase) == b.host_str().map(str::to_ascii_lowercase)
        && a.port_or_known_default() == b.port_or_known_default()
}

/// Follows at most 5 redirects, all within `origin`, and only 307 and 308, which keep the
/// method and the body: a 301, 302 or 303 would turn the JSON-RPC POST into a GET without
/// its message. A redirect elsewhere, or of another kind, is not followed (the 3xx is
/// returned and the request fails with its status), so nothing is sent to another origin.
pub(crate) fn redirect_policy(origin: Url) -> redirect::Policy {
    redirect::Policy::custom(move |attempt| {
        let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
        if attempt.previous().len() >= 5 || !keeps_body || !same_origin(&origin, attempt.url()) {
            attempt.stop()
        } else {
            attempt.follow()
        }
    })
}

/// How long an idle pooled connection to an upstream may be used again (see [`client`]).
const IDLE_REUSE: Duration = Duration::from_secs(4);

/// A reqwest client for one upstream; `timeout` bounds connecting (a streamable-HTTP GET
/// stream may stay open indefinitely, so there is no whole-request timeout).
pub(crate) fn client(url: &Url, timeout: Option<Duration>) -> reqwest::Result<UpstreamHttp> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Loses the race harmlessly if another thread installs one first.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    // An idle connection is not used again after 4 s: Node and uvicorn close idle
    // connections after 5 s, and a request sent on one just as the server closes it fails
    // after it may have been written (hyper cannot send it again). A `notifications/cancelled`
    // posted 5 s after the call's request (a 5 s call timeout) was lost that way, and the
    // upstream ran the call on.
    let mut b = reqwest::Client::builder()
        .redirect(redirect_policy(url.clone()))
        .pool_idle_timeout(IDLE_REUSE);
    if let Some(t) = timeout {
        b = b.connect_timeout(t);
    }
    b.build()
        .map(|c| UpstreamHttp(c, SessionSlot::default(), Arc::from(""), None))
}

/// The session id rmcp last sent to the server, for the direct path, which bypasses rmcp's
/// transport (`upstream/direct.rs`). rmcp keeps its session to itself; every request it sends names it.
///
/// A request naming another id than the last one means rmcp opened a new session: the server
/// forgot the old one (it restarted, or was redeployed) and rmcp initialized again on its
/// own. That is told through [`SessionSlot::replaced`], so the connection lists the server's
/// tools again and renews what the old session held (subscriptions).
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionSlot(Arc<Mutex<Option<Arc<str>>>>, Arc<tokio::sync::Notify>);

impl SessionSlot {
    /// The session id, if the server issued one.
    pub(crate) fn get(&self) -> Option<Arc<str>> {
        lock(&self.0).clone()
    }

    /// Wakes when the server's session was replaced by a new one.
    pub(crate) fn replaced(&self) -> Arc<tokio::sync::Notify> {
        self.1.clone()
    }

    fn saw(&self, id: Option<&Arc<str>>) {
        let Some(id) = id else { return };
        let mut slot = lock(&self.0);
        if slot.as_ref() != Some(id) {
            let renewed = slot.is_some();
            *slot = Some(id.clone());
            drop(slot);
            if renewed {
                self.1.notify_one();
            }
        }
    }
}

/// rmcp's reqwest client, with id-less JSON-RPC errors to a request turned into errors, an
/// answer event that cannot be read turned into an error answer to its request, and the
/// session id each request names kept in a [`SessionSlot`]. The third field is the
/// server's name, for messages; the fourth counts the answers to the server's requests
/// whose POST the server accepted.
#[derive(Clone)]
pub(crate) struct UpstreamHttp(reqwest::Client, SessionSlot, Arc<str>, Option<Arc<Roots>>);

impl std::fmt::Debug for UpstreamHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("UpstreamHttp").field(&self.2).finish()
    }
}

impl UpstreamHttp {
    /// Names the server in the messages it makes.
    pub(crate) fn named(mut self, server: &str) -> Self {
        self.2 = server.into();
        self
    }

    /// Counts, in `answers`, the answers to the server's requests it delivered.
    pub(crate) fn counting_answers(mut self, answers: Arc<Roots>) -> Self {
        self.3 = Some(answers);
        self
    }

    /// The underlying client (its connection pool is shared with every clone).
    pub(crate) fn reqwest(&self) -> &reqwest::Client {
        &self.0
    }

    /// Where the session id rmcp uses is kept.
    pub(crate) fn session(&self) -> &SessionSlot {
        &self.1
    }
}

type HttpError = StreamableHttpError<reqwest::Error>;

/// What an id-less error answering a request means, if it is one.
fn rejection(
    sent_request: bool,
    session_attached: bool,
    response: &StreamableHttpPostResponse,
) -> Option<HttpError> {
    let StreamableHttpPostResponse::Json(JsonRpcMessage::Error(e), _) = response else {
        return None;
    };
    if !sent_request || e.id.is_some() {
        return None;
    }
    let message = e.error.message.to_string();
    if session_attached && message.to_ascii_lowercase().contains("session") {
        return Some(StreamableHttpError::SessionExpired);
    }
    Some(StreamableHttpError::UnexpectedServerResponse(
        format!(
            "the server rejected the request without naming it: {message} (JSON-RPC error {})",
            e.error.code.0
        )
        .into(),
    ))
}

/// A request's response stream in which an answer that cannot be read (a schema nested past
/// the JSON parser's depth limit, an error without its `message`) is replaced by an error
/// answer to the request whose `id` it carries, saying so. rmcp skips an event it cannot
/// read, so the request waited for an answer that had come (a listing, until the connect
/// timeout). The same judgement as on a stdio server's pipe.
fn readable(
    events: BoxStream<'static, Result<Sse, SseError>>,
    server: Arc<str>,
) -> BoxStream<'static, Result<Sse, SseError>> {
    events
        .map(move |event| {
            event.map(|mut sse| {
                let message_event =
                    matches!(sse.event.as_deref(), None | Some("") | Some("message"));
                if message_event && let Some(data) = &sse.data {
                    match judge(data.as_bytes()) {
                        Verdict::Unreadable(id, why) => {
                            sse.data =
                                serde_json::to_string(&unreadable_answer(&server, id, &why)).ok();
                        }
                        // What rmcp can read of a listing too deep to read whole.
                        Verdict::Cut(message) => sse.data = serde_json::to_string(&message).ok(),
                        _ => {}
                    }
                }
                sse
            })
        })
        .boxed()
}

impl StreamableHttpClient for UpstreamHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let sent_request = matches!(message, JsonRpcMessage::Request(_));
        let answer = matches!(
            message,
            JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_)
        );
        let session_attached = session_id.is_some();
        self.1.saw(session_id.as_ref());
        // A call's trace context, which it carries in `_meta`, also goes as the W3C headers.
        let mut custom_headers = custom_headers;
        if let JsonRpcMessage::Request(r) = &message
            && let rmcp::model::ClientRequest::CallToolRequest(call) = &r.request
            && let Some(meta) = &call.params.meta
            && let Some(parent) = meta.0.get_traceparent()
        {
            for (name, value) in [
                ("traceparent", Some(parent)),
                ("tracestate", meta.0.get_tracestate()),
            ] {
                if let Some(Ok(v)) = value.map(HeaderValue::from_str) {
                    custom_headers.insert(HeaderName::from_static(name), v);
                }
            }
        }
        let response = self
            .0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await?;
        if answer && let Some(answers) = &self.3 {
            answers.answer_delivered();
        }
        match rejection(sent_request, session_attached, &response) {
            Some(e) => Err(e),
            None => Ok(match response {
                StreamableHttpPostResponse::Sse(events, session) if sent_request => {
                    StreamableHttpPostResponse::Sse(readable(events, self.2.clone()), session)
                }
                other => other,
            }),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        self.1.saw(session_id.as_ref());
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        self.1.saw(session_id.as_ref());
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_reply(id: Option<i64>, message: &str) -> StreamableHttpPostResponse {
        let mut v =
            serde_json::json!({"jsonrpc": "2.0", "error": {"code": -32000, "message": message}});
        if let Some(id) = id {
            v["id"] = id.into();
        }
        StreamableHttpPostResponse::Json(serde_json::from_value(v).expect("a JSON-RPC error"), None)
    }

    #[test]
    fn id_less_errors_to_requests_are_rejections() {
        let bad_session = error_reply(None, "Bad Request: No valid session ID provided");
        assert!(matches!(
            rejection(true, true, &bad_session),
            Some(StreamableHttpError::SessionExpired)
        ));
        // Without a session attached it cannot be an expired session.
        match rejection(true, false, &bad_session) {
            Some(StreamableHttpError::UnexpectedServerResponse(m)) => {
                assert!(m.contains("No valid session ID"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            rejection(true, true, &error_reply(None, "Parse error")),
            Some(StreamableHttpError::UnexpectedServerResponse(_))
        ));
        // An error with an id is the peer's answer to that request: rmcp routes it.
        assert!(rejection(true, true, &error_reply(Some(3), "no such session")).is_none());
        // A notification awaits no answer.
        assert!(rejection(false, true, &bad_session).is_none());
    }

    #[test]
    fn origins() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert!(same_origin(
            &u("https://a.example/mcp"),
            &u("https://A.example:443/x")
        ));
        assert!(!same_origin(
            &u("https://a.example/mcp"),
            &u("https://b.example/mcp")
        ));
        assert!(!same_origin(
            &u("http://a.example/mcp"),
            &u("https://a.example/mcp")
        ));
        assert!(!same_origin(
            &u("http://127.0.0.1:1/"),
            &u("http://127.0.0.1:2/")
        ));
    }
}
