//! The [`ClientChannel`] of one `tools/call`: server-to-client requests and notifications
//! through the session's rmcp peer, tied to the call (its request id, its progress token).

// Sampling, roots and logging are deprecated by SEP-2577; 2025-era clients still use them.
#![allow(deprecated)]

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use async_trait::async_trait;
use quiver_contract::{ChannelError, ClientChannel, ClientFeatures, ClientRequest, LogLevel};
use rmcp::{
    RoleServer,
    model::{
        CancelledNotification, CancelledNotificationParam, ClientCapabilities, ClientResult,
        CreateMessageRequestParams, CustomRequest, ElicitRequest, ElicitRequestParams,
        GetExtensions, ListRootsRequest, LoggingLevel, LoggingMessageNotificationParam,
        ProgressNotificationParam, ProgressToken, RequestId, ServerNotification, ServerRequest,
    },
    service::{OriginatingRequestId, Peer, PeerRequestOptions, ServiceError},
};
use serde_json::Value;

use super::scope::Connection;
use crate::sync::lock;
use crate::wire::to_mcp_level;

/// The declared features of a client's capabilities.
pub(crate) fn features(caps: Option<&ClientCapabilities>) -> ClientFeatures {
    match caps {
        Some(c) => {
            let features = ClientFeatures::new(c.sampling.is_some(), false, c.roots.is_some());
            match &c.elicitation {
                // `{}` is form mode only (MCP's backwards compatibility).
                Some(e) if e.form.is_none() && e.url.is_none() => {
                    features.with_elicitation_modes(true, false)
                }
                Some(e) => features.with_elicitation_modes(e.form.is_some(), e.url.is_some()),
                None => features,
            }
        }
        None => ClientFeatures::default(),
    }
}

/// Progress of one call: the heartbeat and a tool's own reports share the token, and
/// values must only grow.
#[derive(Default)]
pub(crate) struct ProgressState {
    /// Set by the first progress a tool reports; the heartbeat stops then.
    pub(crate) reported: AtomicBool,
    /// The last value sent.
    pub(crate) last: Mutex<f64>,
    /// Where the tool's own values start: the heartbeat's last value when the tool first
    /// reported (its 0.25 of 1 after two heartbeats goes out as 2.25 of 3).
    offset: Mutex<Option<f64>>,
}

impl ProgressState {
    /// Claims a tool's own `progress` (of `total`): the values to send, moved past the
    /// heartbeat's, or none if they do not grow.
    pub(crate) fn claim(&self, progress: f64, total: Option<f64>) -> Option<(f64, Option<f64>)> {
        let mut last = lock(&self.last);
        let mut offset = lock(&self.offset);
        let base = *offset.get_or_insert(*last);
        let value = base + progress;
        if value > *last {
            *last = value;
            Some((value, total.map(|t| t + base)))
        } else {
            None
        }
    }

    /// Claims `value` as the next progress value; false if it does not grow.
    pub(crate) fn advance(&self, value: f64) -> bool {
        let mut last = lock(&self.last);
        if value > *last {
            *last = value;
            true
        } else {
            false
        }
    }
}

/// The client capabilities a 2026-07-28 call asked for that the client had not declared,
/// with the refusal each request got. A call whose failure *is* such a refusal (its error
/// text carries it, as a tool that propagates the channel's error does) is answered with
/// `-32021` (Missing Required Client Capability, SEP-2575) naming the capabilities, instead
/// of a tool error; a call that failed for another reason keeps its own error.
#[derive(Default)]
pub(crate) struct Missing(Mutex<Vec<(ClientRequest, String)>>);

impl Missing {
    /// The refusal of `request` for want of its capability, noted.
    pub(crate) fn refuse(&self, request: ClientRequest) -> ChannelError {
        let refusal = request.undeclared();
        let mut m = lock(&self.0);
        if !m.iter().any(|(r, _)| *r == request) {
            m.push((request, refusal.to_string()));
        }
        refusal
    }

    /// `result` as the call's answer: a call that failed with one of the noted refusals
    /// becomes the `-32021` error (the tool's own text kept in `data.toolError`).
    pub(crate) fn answer(
        &self,
        result: rmcp::model::CallToolResult,
    ) -> Result<rmcp::model::CallToolResult, rmcp::ErrorData> {
        if result.is_error != Some(true) {
            return Ok(result);
        }
        let text: String = result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
            .collect::<Vec<_>>()
            .join("\n");
        match self.required("tool", "toolError", &text) {
            Some(error) => Err(error),
            None => Ok(result),
        }
    }

    /// `error`, the failure of a `prompts/get` or `resources/read` (`what`: "prompt",
    /// "resource"), as the request's answer: the `-32021` error when it is one of the noted
    /// refusals (the original message kept in `data.error`), else itself.
    pub(crate) fn error(&self, what: &str, error: rmcp::ErrorData) -> rmcp::ErrorData {
        self.required(what, "error", &error.message)
            .unwrap_or(error)
    }

    /// The `-32021` error for a failure whose `text` carries noted refusals, if it does.
    fn required(&self, what: &str, field: &str, text: &str) -> Option<rmcp::ErrorData> {
        let missing: Vec<ClientRequest> = lock(&self.0)
            .iter()
            .filter(|(_, refusal)| text.contains(refusal.as_str()))
            .map(|(r, _)| *r)
            .collect();
        if missing.is_empty() {
            return None;
        }
        let mut caps = ClientCapabilities::default();
        for r in &missing {
            match r {
                ClientRequest::CreateMessage => caps.sampling = Some(Default::default()),
                ClientRequest::Elicit => caps.elicitation = Some(Default::default()),
                _ => caps.roots = Some(Default::default()),
            }
        }
        let mut error = rmcp::ErrorData::missing_required_client_capability(caps);
        error.message = format!(
            "the {what} needs the client capabilities {} that the request's `_meta` did not declare; declare them (and answer its requests in InputRequiredResult rounds) to use it",
            missing
                .iter()
                .map(|r| r.capability())
                .collect::<Vec<_>>()
                .join(", ")
        )
        .into();
        if let Some(serde_json::Value::Object(data)) = error.data.as_mut() {
            data.insert(field.into(), serde_json::Value::String(text.to_owned()));
        }
        Some(error)
    }
}

/// The channel of one call.
pub(crate) struct PeerChannel {
    pub(crate) peer: Peer<RoleServer>,
    /// The request id: server requests ride its response stream (SEP-2260). None for a
    /// channel of the session itself (what a notification causes), whose requests go on
    /// the session's standalone stream.
    pub(crate) request_id: Option<RequestId>,
    pub(crate) progress_token: Option<ProgressToken>,
    pub(crate) progress: Arc<ProgressState>,
    pub(crate) features: ClientFeatures,
    /// The level this request asked for in its `_meta` (2026-07-28, SEP-2575), if any.
    pub(crate) meta_level: Option<LoggingLevel>,
    /// The connection, whose `logging/setLevel` applies when the request named no level.
    pub(crate) conn: Arc<Connection>,
    /// Whether log messages may be sent at all (a 2026-07-28 request that did not opt in
    /// with `io.modelcontextprotocol/logLevel` gets none).
    pub(crate) logs_allowed: bool,
    /// On a 2026-07-28 call: where refusals for undeclared capabilities are noted.
    pub(crate) missing: Option<Arc<Missing>>,
    /// Where the call's log messages go when the call has a stream of its own that rmcp
    /// does not keep (the direct path's): each one as the text of its JSON-RPC
    /// notification. Without it they go through the peer.
    pub(crate) outbox: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl PeerChannel {
    /// Refuses `request` when the client did not declare its capability.
    fn check(&self, request: ClientRequest) -> Result<(), ChannelError> {
        if request.declared(self.features) {
            return Ok(());
        }
        Err(match &self.missing {
            Some(m) => m.refuse(request),
            None => request.undeclared(),
        })
    }

    async fn send(&self, mut request: ServerRequest) -> Result<Value, ChannelError> {
        if let Some(origin) = &self.request_id {
            request
                .extensions_mut()
                .insert(OriginatingRequestId(origin.clone()));
        }
        // rmcp stamps a request sent from inside a request handler with that handler's
        // request id, over ours; a relayed request runs inside the *upstream's* handler, in
        // another id space. Task-locals do not cross a spawn, so ours survives there.
        let peer = self.peer.clone();
        let queued = tokio::spawn(async move {
            peer.send_request_with_option(request, PeerRequestOptions::no_options())
                .await
        })
        .await
        .map_err(|e| ChannelError::Transport(format!("the request was not queued: {e}")))?;
        let outcome = match queued {
            Ok(handle) => {
                // Abandoned (the call ended, was cancelled or timed out, and this future
                // was dropped): the client is told to stop, as MCP's cancellation says,
                // rather than left asking its user or model for an answer nobody reads.
                let mut asked = Asked {
                    peer: self.peer.clone(),
                    origin: self.request_id.clone(),
                    id: Some(handle.id.clone()),
                };
                let outcome = handle.await_response().await;
                asked.id = None;
                outcome
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(ClientResult::EmptyResult(_)) => Err(ChannelError::Transport(
                "the client answered with an empty result".into(),
            )),
            Ok(result) => serde_json::to_value(&result)
                .map_err(|e| ChannelError::Transport(format!("unreadable client result: {e}"))),
            Err(ServiceError::McpError(e)) => Err(ChannelError::Client {
                code: i64::from(e.code.0),
                message: e.message.to_string(),
                data: e.data,
            }),
            Err(ServiceError::Cancelled { .. }) => Err(ChannelError::Cancelled),
            Err(e) => Err(ChannelError::Transport(format!(
                "the request to the client failed: {e}"
            ))),
        }
    }
}

/// A request sent to the client and not answered yet: dropped unanswered, it sends the
/// client `notifications/cancelled` for it (on the call's stream, from a task of its own).
struct Asked {
    peer: Peer<RoleServer>,
    origin: Option<RequestId>,
    id: Option<RequestId>,
}

impl Drop for Asked {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        let origin = self.origin.clone();
        runtime.spawn(async move {
            let mut cancelled = ServerNotification::CancelledNotification(
                CancelledNotification::new(CancelledNotificationParam::new(
                    Some(id),
                    Some("the tool call that asked has ended".into()),
                )),
            );
            if let Some(origin) = origin {
                cancelled
                    .extensions_mut()
                    .insert(OriginatingRequestId(origin));
            }
            let _ = peer.send_notification(cancelled).await;
        });
    }
}

/// `params` as the typed params of `method`, or why not.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    method: &str,
    params: &Value,
) -> Result<T, ChannelError> {
    T::deserialize(params)
        .map_err(|e| ChannelError::Invalid(format!("invalid {method} params: {e}")))
}

#[async_trait]
impl ClientChannel for PeerChannel {
    fn features(&self) -> ClientFeatures {
        self.features
    }

    fn cancelled_because(&self) -> Option<&'static str> {
        // `DELETE` cancels the session's calls still running.
        self.conn
            .deleted
            .is_cancelled()
            .then_some("because its client ended the MCP session")
    }

    async fn create_message(&self, params: Value) -> Result<Value, ChannelError> {
        self.check(ClientRequest::CreateMessage)?;
        parse::<CreateMessageRequestParams>("sampling/createMessage", &params)?;
        // Checked against the typed params, sent as they came: rmcp's typed params hold
        // `temperature` and the model priorities as f32 (0.7 would reach the client as
        // 0.699999988079071).
        self.send(ServerRequest::CustomRequest(CustomRequest::new(
            "sampling/createMessage",
            Some(params),
        )))
        .await
    }

    async fn elicit(&self, params: Value) -> Result<Value, ChannelError> {
        self.check(ClientRequest::Elicit)?;
        if let Some(refusal) = self.features.elicitation_refusal(&params) {
            return Err(refusal);
        }
        let params: ElicitRequestParams = parse("elicitation/create", &params)?;
        self.send(ServerRequest::ElicitRequest(ElicitRequest::new(params)))
            .await
    }

    async fn list_roots(&self) -> Result<Value, ChannelError> {
        self.check(ClientRequest::ListRoots)?;
        self.send(ServerRequest::ListRootsRequest(ListRootsRequest {
            method: Default::default(),
            extensions: Default::default(),
        }))
        .await
    }

    async fn log(&self, level: LogLevel, logger: Option<&str>, data: Value) {
        if !self.logs_allowed {
            return;
        }
        let level = to_mcp_level(level);
        let min = self.meta_level.or_else(|| *lock(&self.conn.log_level));
        if let Some(min) = min
            && level_rank(level) < level_rank(min)
        {
            return;
        }
        let mut p = LoggingMessageNotificationParam::new(level, data);
        if let Some(l) = logger {
            p = p.with_logger(l);
        }
        if let Some(outbox) = &self.outbox {
            let note = serde_json::json!({
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": p,
            });
            if outbox.send(note.to_string()).is_err() {
                tracing::debug!("a log message was not delivered: its call's response is gone");
            }
            return;
        }
        if let Err(e) = self.peer.notify_logging_message(p).await {
            tracing::debug!(error = %e, "a log message was not delivered");
        }
    }

    fn wants_progress(&self) -> bool {
        self.progress_token.is_some()
    }

    async fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        let Some(token) = &self.progress_token else {
            return;
        };
        self.progress.reported.store(true, Ordering::Release);
        let Some((progress, total)) = self.progress.claim(progress, total) else {
            return;
        };
        let mut p = ProgressNotificationParam::new(token.clone(), progress);
        p.total = total;
        p.message = message;
        if let Err(e) = self.peer.notify_progress(p).await {
            tracing::debug!(error = %e, "a progress notification was not delivered");
        }
    }
}

/// Orders levels by severity (rmcp's enum is in that order, but says nothing about it).
pub(crate) fn level_rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::ProgressState;

    /// A tool's own progress after heartbeats goes on from the heartbeat's value (it was
    /// dropped for not growing, 0.25 against the heartbeat's 2).
    #[test]
    fn a_tools_progress_goes_on_from_the_heartbeat() {
        let st = ProgressState::default();
        assert!(st.advance(1.0) && st.advance(2.0));
        assert_eq!(st.claim(0.25, Some(1.0)), Some((2.25, Some(3.0))));
        assert_eq!(st.claim(0.75, Some(1.0)), Some((2.75, Some(3.0))));
        assert_eq!(st.claim(0.75, None), None, "no growth, nothing sent");
        // Without heartbeats first, the tool's values go out as they are.
        let fresh = ProgressState::default();
        assert_eq!(fresh.claim(0.5, Some(1.0)), Some((0.5, Some(1.0))));
    }

    use super::*;
    use crate::wire::from_mcp_level;

    #[test]
    fn progress_only_grows() {
        let p = ProgressState::default();
        assert!(p.advance(1.0));
        assert!(!p.advance(1.0));
        assert!(!p.advance(0.5));
        assert!(p.advance(2.5));
    }

    #[test]
    fn levels_order_by_severity() {
        assert!(level_rank(LoggingLevel::Debug) < level_rank(LoggingLevel::Info));
        assert!(level_rank(LoggingLevel::Warning) < level_rank(LoggingLevel::Emergency));
        for l in [
            LogLevel::Debug,
            LogLevel::Notice,
            LogLevel::Critical,
            LogLevel::Emergency,
        ] {
            assert_eq!(from_mcp_level(to_mcp_level(l)), l);
        }
    }

    /// The elicitation schemas of the conformance suite survive rmcp's typed params intact,
    /// so a request forwarded through Quiver reaches the client as the tool wrote it.
    #[test]
    fn elicitation_schemas_round_trip() {
        for params in [
            serde_json::json!({
                "message": "defaults",
                "requestedSchema": {"type": "object", "properties": {
                    "name": {"type": "string", "default": "John Doe"},
                    "age": {"type": "integer", "default": 30},
                    "score": {"type": "number", "default": 95.5},
                    "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
                    "verified": {"type": "boolean", "default": true}
                }}
            }),
            serde_json::json!({
                "message": "enums",
                "requestedSchema": {"type": "object", "properties": {
                    "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                    "titledSingle": {"type": "string", "oneOf": [{"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"}]},
                    "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
                    "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                    "titledMulti": {"type": "array", "items": {"anyOf": [{"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"}]}}
                }}
            }),
        ] {
            let typed: ElicitRequestParams = parse("elicitation/create", &params).unwrap();
            let back = serde_json::to_value(&typed).unwrap();
            assert_eq!(
                back["requestedSchema"]["properties"], params["requestedSchema"]["properties"],
                "{params}"
            );
        }
    }
}
