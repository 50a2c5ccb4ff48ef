//! The call's response stream on the direct path: SSE read until the call's answer, resumed
//! with `Last-Event-ID` when it closes early (SEP-1699), and the server's requests and
//! notifications found on it answered from, or passed to, the call's own client.

// Sampling and logging are deprecated by SEP-2577; 2025-era servers still use them.
#![allow(deprecated)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, stream::FuturesUnordered};
use quiver_contract::{CallContext, ClientChannel};
use reqwest::{
    StatusCode,
    header::{ACCEPT, CONTENT_TYPE, HeaderValue},
};
use rmcp::{
    ErrorData,
    model::{
        CreateMessageResult, ElicitResult, LoggingMessageNotificationParam,
        ProgressNotificationParam,
    },
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    BodyStream, DirectPath, Exchange, Incoming, SESSION_HEADER, Seen, Upstream, classify,
    reqwest_body,
};
use crate::client::{
    roots::{Who, roots_of},
    upstream::relay::{ask_channel, deliver_log, nobody_to_ask, relay_error},
};
use crate::sse;

/// How many times in a row a response stream is resumed without an event in between.
const MAX_RESUMES: u32 = 5;

/// The longest `retry` a server may ask for before a stream is resumed.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// The least wait before the `n`th resumption of one call's stream (counted from 0) when
/// the server asks for less: none for the first, then 50 ms doubling up to 2 s. A server
/// that ends every stream after one event is then resumed a dozen times in 10 s, not in
/// a loop as fast as the network allows.
fn resume_floor(n: u32) -> Duration {
    match n {
        0 => Duration::ZERO,
        n => (Duration::from_millis(50) * 2u32.saturating_pow(n - 1).min(64))
            .min(Duration::from_secs(2)),
    }
}

/// The largest SSE event read (bytes between blank lines).
const MAX_SSE_EVENT: usize = 16 << 20;

/// How the error of an SSE event longer than [`MAX_SSE_EVENT`] begins.
const OVERSIZED_EVENT: &str = "an SSE event over";

/// `body`, failing once an event grows past `max` bytes (an upstream that never ends an
/// event cannot make Quiver buffer without bound).
fn limit_events(body: BodyStream, max: usize) -> BodyStream {
    // (bytes since the last blank line, the last byte ended a line, it was a CR). A line
    // ends at CR, LF or CRLF (as the SSE parser reads it), so CR CR is a blank line too.
    body.scan(
        (0usize, false, false),
        move |(run, ended, after_cr), chunk| {
            let item = chunk.and_then(|c| {
                for &b in c.iter() {
                    match b {
                        // The LF of a CRLF: the CR ended the line already.
                        b'\n' if *after_cr => *after_cr = false,
                        b'\n' | b'\r' => {
                            if *ended {
                                *run = 0;
                            }
                            *ended = true;
                            *after_cr = b == b'\r';
                        }
                        _ => {
                            *ended = false;
                            *after_cr = false;
                        }
                    }
                    *run += 1;
                }
                if *run > max {
                    Err(std::io::Error::other(format!(
                        "{OVERSIZED_EVENT} {} MiB",
                        max >> 20
                    )))
                } else {
                    Ok(c)
                }
            });
            futures::future::ready(Some(item))
        },
    )
    .boxed()
}

/// Why a response stream could not be resumed.
enum Resume {
    /// The server refused the connection: nothing listens there, it is gone.
    Gone(String),
    /// Anything else (a status, a stream that broke again).
    Failed(String),
}

/// Whether `e` is a refused connection (nothing listens there now), not a connect timeout,
/// a name that did not resolve or a TLS handshake that failed, which may pass.
fn connection_refused(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Reads a response stream to its end after the answer, so its connection goes back to the
/// pool (hyper closes a connection whose response body was dropped unread; a new connection
/// per call costs more than the call). The end is usually already here; otherwise, on an
/// in-task connection (`pooled`) the pool reads the rest at its next checkout, and on
/// reqwest's a task waits for it, for at most a few seconds.
fn finish<S>(mut events: S, pooled: bool)
where
    S: futures::Stream + Unpin + Send + 'static,
{
    use futures::FutureExt;
    loop {
        match events.next().now_or_never() {
            Some(Some(_)) => continue,
            Some(None) => return,
            None => break,
        }
    }
    if pooled {
        return;
    }
    tokio::spawn(async move {
        let drain = async { while events.next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
    });
}

/// The answer to a server request made during a call, from the call's own client.
async fn ask(
    channel: Option<&Arc<dyn ClientChannel>>,
    method: &str,
    tool: &str,
    params: Value,
) -> Result<Value, ErrorData> {
    if method == "ping" {
        return Ok(json!({}));
    }
    let Some(channel) = channel else {
        return Err(nobody_to_ask(method, tool));
    };
    let validate = match method {
        "sampling/createMessage" => valid::<CreateMessageResult>,
        "elicitation/create" => valid::<ElicitResult>,
        other => {
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("Quiver does not answer {other}"),
                None,
            ));
        }
    };
    let answer = ask_channel(channel, method, params)
        .await
        .map_err(|e| relay_error(e, method, tool))?;
    validate(method, answer)
}

/// `v` if it is a valid `T`, else the error the upstream gets.
fn valid<T: serde::de::DeserializeOwned>(method: &str, v: Value) -> Result<Value, ErrorData> {
    match T::deserialize(&v) {
        Ok(_) => Ok(v),
        Err(e) => Err(ErrorData::internal_error(
            format!("the client's answer to {method} is not a valid result: {e}"),
            None,
        )),
    }
}

impl Upstream {
    /// Reads an SSE response stream until the answer, resuming it when it closes early.
    pub(super) async fn read_stream(
        &self,
        direct: &DirectPath,
        id: &str,
        (reply, keep): (BodyStream, Option<Arc<AtomicBool>>),
        session: Option<&str>,
        ctx: &CallContext,
        tool: &str,
    ) -> Exchange {
        let mut events = sse::events(limit_events(reply, MAX_SSE_EVENT));
        let mut last_event: Option<String> = None;
        let mut retry = Duration::ZERO;
        let mut resumes = 0;
        let mut resumed = 0;
        // Whether `events` reads an in-task connection (a resumed stream is reqwest's).
        let mut pooled = direct.pool.is_some();
        let mut answering = FuturesUnordered::new();
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(sse)) => {
                        if let Some(e) = sse.id {
                            last_event = Some(e);
                        }
                        if let Some(ms) = sse.retry {
                            retry = Duration::from_millis(ms).min(MAX_RETRY);
                        }
                        let data = sse.data;
                        if data.trim().is_empty() {
                            continue;
                        }
                        resumes = 0;
                        let Ok(message) = serde_json::from_str::<Incoming>(&data) else {
                            tracing::debug!(server = %self.cfg.name, "not a JSON-RPC message on the call's stream");
                            continue;
                        };
                        match classify(message, id) {
                            Seen::Answer(a) => {
                                // Answered: the rest of the stream may be read in the pool.
                                if let Some(keep) = &keep {
                                    keep.store(true, Ordering::Release);
                                }
                                finish(events, pooled);
                                return a;
                            }
                            Seen::Request { id, method, params } => {
                                answering.push(self.answer(direct, session, id, method, params, ctx, tool));
                            }
                            Seen::Notification { method, params } => {
                                Box::pin(self.notified(direct, &method, params, ctx)).await;
                            }
                            Seen::Other => {}
                        }
                    }
                    end => {
                        if let Some(Err(e)) = end {
                            // An event longer than Quiver reads: resuming would send it again.
                            if e.to_string().starts_with(OVERSIZED_EVENT) {
                                return Exchange::PeerError(format!(
                                    "MCP server \"{}\" answered, but its answer cannot be read ({e}, more than Quiver reads); the tool may have run",
                                    self.cfg.name
                                ));
                            }
                            tracing::debug!(server = %self.cfg.name, error = %e, "call's stream broke");
                        }
                        let Some(from) = last_event.as_deref() else {
                            return Exchange::Unknown("the response stream ended without the answer".into());
                        };
                        if resumes >= MAX_RESUMES {
                            return Exchange::Unknown(format!("the response stream ended {resumes} times without the answer"));
                        }
                        resumes += 1;
                        tokio::time::sleep(retry.max(resume_floor(resumed))).await;
                        resumed += 1;
                        // Boxed, as the notification's delivery: rare, and large inline.
                        match Box::pin(self.resume(direct, session, from)).await {
                            Ok(r) => {
                                pooled = false;
                                events = sse::events(limit_events(reqwest_body(r), MAX_SSE_EVENT));
                            }
                            Err(Resume::Gone(why)) => return Exchange::Gone(why),
                            Err(Resume::Failed(why)) => return Exchange::Unknown(why),
                        }
                    }
                },
                Some(()) = answering.next(), if !answering.is_empty() => {}
            }
        }
    }

    /// Re-opens the stream after `last_event` with a GET (SEP-1699).
    async fn resume(
        &self,
        direct: &DirectPath,
        session: Option<&str>,
        last_event: &str,
    ) -> Result<reqwest::Response, Resume> {
        let mut headers = direct.headers.clone();
        headers.remove(CONTENT_TYPE);
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        let mut req = direct
            .http
            .get(direct.url.clone())
            .headers(headers)
            .header("last-event-id", last_event);
        if let Some(s) = session {
            req = req.header(SESSION_HEADER, s);
        }
        match req.send().await {
            Ok(r) if r.status() == StatusCode::OK => Ok(r),
            Ok(r) => Err(Resume::Failed(format!(
                "resuming the response stream: HTTP {}",
                r.status()
            ))),
            Err(e) if e.is_connect() && connection_refused(&e) => {
                Err(Resume::Gone(format!("resuming the response stream: {e}")))
            }
            Err(e) => Err(Resume::Failed(format!("resuming the response stream: {e}"))),
        }
    }

    /// Answers a server request that arrived on the call's stream, from the call's client.
    #[allow(clippy::too_many_arguments)]
    async fn answer(
        &self,
        direct: &DirectPath,
        session: Option<&str>,
        id: Value,
        method: String,
        params: Value,
        ctx: &CallContext,
        tool: &str,
    ) {
        if method == "roots/list" {
            // Fails closed, as on rmcp's path (`UpstreamRelay::list_roots`).
            self.roots.asked();
            let answer = roots_of(ctx.client.as_ref()).await.ok();
            let result = self.roots.answer(direct.generation, answer, Who::of(ctx));
            direct
                .send(
                    session,
                    &json!({"jsonrpc": "2.0", "id": id, "result": result}),
                )
                .await;
            return;
        }
        let message = match ask(ctx.client.as_ref(), &method, tool, params).await {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(e) => {
                tracing::info!(server = %self.cfg.name, "refused {method}: {}", e.message);
                json!({"jsonrpc": "2.0", "id": id, "error": e})
            }
        };
        direct.send(session, &message).await;
    }

    /// A notification on the call's stream: the call's progress and log messages go to its
    /// client (the stream says whose they are; no token is looked up); list changes and
    /// resource updates are the connection's.
    async fn notified(&self, direct: &DirectPath, method: &str, params: Value, ctx: &CallContext) {
        match method {
            "notifications/progress" => {
                let Ok(p) = ProgressNotificationParam::deserialize(&params) else {
                    return;
                };
                if let Some(channel) = &ctx.client {
                    channel.progress(p.progress, p.total, p.message).await;
                }
            }
            "notifications/message" => {
                if let Ok(p) = LoggingMessageNotificationParam::deserialize(&params) {
                    deliver_log(ctx.client.as_ref(), &self.cfg.name, p).await;
                }
            }
            "notifications/tools/list_changed" => {
                if let Some(up) = self.me.upgrade() {
                    tokio::spawn(up.relist(direct.generation));
                }
            }
            other => {
                self.relays.relay(other, Some(&params));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hyper::body::Bytes;

    use super::*;

    #[test]
    fn resumptions_wait_longer_each_time() {
        let waits: Vec<u128> = (0..9).map(|n| super::resume_floor(n).as_millis()).collect();
        assert_eq!(waits, [0, 50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(super::resume_floor(u32::MAX).as_millis(), 2000);
    }

    #[tokio::test]
    async fn an_endless_sse_event_is_cut_off() {
        let chunks = |v: Vec<&'static str>| -> BodyStream {
            futures::stream::iter(v.into_iter().map(|c| Ok(Bytes::from(c)))).boxed()
        };
        // Events under the limit pass, however many; the blank line may span chunks.
        let ok: Vec<_> = limit_events(
            chunks(vec!["data: 12345\n", "\n", "data: 12345\r\n\r\n"]),
            16,
        )
        .collect()
        .await;
        assert!(ok.iter().all(Result::is_ok), "{ok:?}");
        // CR alone ends a line too: CR CR ends an event, and a CRLF is one line end.
        let cr: Vec<_> = limit_events(
            chunks(vec![
                "data: 12345\r\r",
                "data: 12345\r",
                "\r",
                "data: 1\r\n\r\n",
            ]),
            16,
        )
        .collect()
        .await;
        assert!(cr.iter().all(Result::is_ok), "{cr:?}");
        let one: Vec<_> = limit_events(chunks(vec!["data: 1\r\n", "data: 1234567890\r\n"]), 16)
            .collect()
            .await;
        assert!(one[1].is_err(), "CRLF lines of one event add up: {one:?}");
        let cut: Vec<_> = limit_events(chunks(vec!["data: 1234567", "890123456789"]), 16)
            .collect()
            .await;
        assert!(cut[0].is_ok() && cut[1].is_err(), "{cut:?}");
    }

    #[tokio::test]
    async fn requests_without_a_client_are_refused_and_pings_answered() {
        assert_eq!(
            ask(None, "ping", "t", Value::Null).await.unwrap(),
            json!({})
        );
        let e = ask(None, "sampling/createMessage", "t", Value::Null)
            .await
            .unwrap_err();
        assert!(e.message.contains("nobody to ask"), "{}", e.message);
    }
}
