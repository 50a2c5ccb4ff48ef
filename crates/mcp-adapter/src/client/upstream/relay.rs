//! What the server sends Quiver besides its answers: the rmcp client handler relays its
//! sampling, elicitation and roots requests to the client of the call they belong to, and a
//! call's progress and log messages to that call; it re-lists the tools on
//! `tools/list_changed`, and [`Relays`] passes list changes and resource updates on to
//! `quiver serve`.

// Sampling, roots and logging are deprecated by SEP-2577; 2025-era servers still use them.
#![allow(deprecated)]

use std::sync::{Arc, Weak};

use quiver_contract::{ChannelError, ClientChannel};
use rmcp::{
    ClientHandler, ErrorData, RoleClient,
    model::{
        ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
        ElicitRequestParams, ElicitResult, Implementation, ListRootsResult,
        LoggingMessageNotificationParam, ProgressNotificationParam,
    },
    service::{NotificationContext, RequestContext},
};
use serde_json::Value;

use super::Upstream;
use crate::client::{
    delivery::{Delivering, in_turn},
    roots::{Who, roots_of},
    route::{Origin, Route},
};
use crate::content::{ListChange, ListChanged};
use crate::protocol::Protocol;

/// The broadcast channels an upstream's content notifications go out on.
#[derive(Clone)]
pub(crate) struct Relays {
    /// `notifications/resources/updated` (the URI).
    pub(crate) updates: tokio::sync::broadcast::Sender<String>,
    /// `notifications/resources/list_changed` and `notifications/prompts/list_changed`.
    pub(crate) lists: tokio::sync::broadcast::Sender<ListChanged>,
    /// The server whose notifications these are (a session that may not reach it is not
    /// told of its list changes).
    pub(crate) server: Arc<str>,
}

impl Relays {
    /// Passes a content notification on; `false` when `method` is not one.
    pub(crate) fn relay(&self, method: &str, params: Option<&Value>) -> bool {
        // No receiver (no downstream session listening) is not an error.
        match method {
            "notifications/resources/updated" => {
                if let Some(uri) = params.and_then(|p| p.get("uri")).and_then(Value::as_str) {
                    let _ = self.updates.send(uri.to_owned());
                }
            }
            "notifications/resources/list_changed" => self.list_changed(ListChange::Resources),
            "notifications/prompts/list_changed" => self.list_changed(ListChange::Prompts),
            _ => return false,
        }
        true
    }

    /// Says that this server's `list` changed.
    pub(crate) fn list_changed(&self, list: ListChange) {
        let _ = self.lists.send(ListChanged::of(list, self.server.clone()));
    }
}

/// Our rmcp client handler: identifies Quiver (declaring sampling, elicitation and roots,
/// which it relays to the downstream client of the call that asked), re-lists on
/// `tools/list_changed`, and forwards a call's log messages and progress.
pub(super) struct UpstreamRelay {
    up: Weak<Upstream>,
    /// The connection it serves (a re-list it asks for lists on that one).
    generation: u64,
}

impl UpstreamRelay {
    /// The handler of `up`'s connection of `generation`.
    pub(super) fn new(up: Weak<Upstream>, generation: u64) -> UpstreamRelay {
        UpstreamRelay { up, generation }
    }
}

/// The capabilities Quiver declares to every upstream: it can relay sampling, elicitation
/// and roots requests. The connection is shared by all sessions, so the per-call check of
/// what the calling client declared happens when a request arrives; the roots a server
/// holds change with the client it serves (`listChanged`, see `roots.rs`).
fn relayed_capabilities() -> ClientCapabilities {
    serde_json::from_value(serde_json::json!({
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": true},
    }))
    .unwrap_or_default()
}

/// The JSON-RPC error an upstream gets when Quiver cannot relay its request.
pub(super) fn relay_error(e: ChannelError, method: &str, tool: &str) -> ErrorData {
    match e {
        // The client's own error, its `data` too (a URL elicitation's -32042 carries the
        // elicitations the upstream should have asked for).
        ChannelError::Client {
            code,
            message,
            data,
        } => ErrorData::new(
            rmcp::model::ErrorCode(i32::try_from(code).unwrap_or(-32603)),
            message,
            data,
        ),
        ChannelError::Invalid(m) => ErrorData::invalid_params(m, None),
        ChannelError::Cancelled => ErrorData::internal_error(
            format!("{method} was abandoned: the call to `{tool}` ended or was cancelled"),
            None,
        ),
        ChannelError::Unsupported(m) | ChannelError::Transport(m) => ErrorData::invalid_request(
            format!("Quiver could not relay {method} for the call to `{tool}`: {m}"),
            None,
        ),
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

/// The refusal of a server request made during a call that has no client to ask.
pub(super) fn nobody_to_ask(method: &str, tool: &str) -> ErrorData {
    ErrorData::invalid_request(
        format!(
            "Quiver could not relay {method} for the call to `{tool}`: the call did not come from an MCP client, so there is nobody to ask"
        ),
        None,
    )
}

/// Asks a call's client to answer the server request `method` (MCP wire JSON in and out);
/// an accepted elicitation gets the requested schema's defaults (SEP-1034). Shared by rmcp's
/// handler and the direct path.
pub(super) async fn ask_channel(
    channel: &Arc<dyn ClientChannel>,
    method: &str,
    params: Value,
) -> Result<Value, ChannelError> {
    match method {
        "sampling/createMessage" => channel.create_message(params).await,
        "elicitation/create" => {
            let asked = params.clone();
            let mut answer = channel.elicit(params).await?;
            crate::client::elicit::apply_defaults(&asked, &mut answer);
            Ok(answer)
        }
        other => Err(ChannelError::Unsupported(format!("{other} is not relayed"))),
    }
}

impl UpstreamRelay {
    /// Relays a server request to the client of the call it belongs to.
    async fn relay<F, Fut>(
        &self,
        method: &str,
        context: &RequestContext<RoleClient>,
        send: F,
    ) -> Result<Value, ErrorData>
    where
        F: FnOnce(Arc<dyn ClientChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<Value, ChannelError>>,
    {
        let Some(up) = self.up.upgrade() else {
            return Err(ErrorData::internal_error("Quiver is shutting down", None));
        };
        let entry = match up.calls.route(&Origin::of(&context.extensions)).await {
            Route::To(e) => e,
            refused => {
                let why = refused.refusal(method);
                // The operator log only: a server could send these without end.
                tracing::info!(server = %up.cfg.name, route = ?refused, "refused {method}: {why}");
                return Err(ErrorData::invalid_request(why, None));
            }
        };
        let Some(channel) = entry.channel.clone() else {
            return Err(nobody_to_ask(method, &entry.tool));
        };
        tokio::select! {
            r = send(channel) => r.map_err(|e| relay_error(e, method, &entry.tool)),
            _ = entry.done.cancelled() => Err(relay_error(ChannelError::Cancelled, method, &entry.tool)),
            _ = context.ct.cancelled() => Err(ErrorData::internal_error(format!("{method} was cancelled by the server"), None)),
        }
    }
}

/// The params of a server request rmcp parsed, with the request's `_meta` back in them
/// (rmcp moves it to the request context): what the server sent reaches the client, as on
/// the direct path, which relays the params as they came. Its `progressToken` stays behind:
/// it names the upstream's progress, not the client's.
fn with_meta(mut params: Value, meta: &rmcp::model::RequestMetaObject) -> Value {
    let Ok(Value::Object(meta)) = serde_json::to_value(meta) else {
        return params;
    };
    if let Value::Object(p) = &mut params {
        let into = p
            .entry("_meta")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(into) = into {
            for (k, v) in meta {
                if k != "progressToken" {
                    into.entry(k).or_insert(v);
                }
            }
            if into.is_empty() {
                p.remove("_meta");
            }
        }
    }
    params
}

fn parse_result<T: serde::de::DeserializeOwned>(method: &str, v: Value) -> Result<T, ErrorData> {
    serde_json::from_value(v).map_err(|e| {
        ErrorData::internal_error(
            format!("the client's answer to {method} is not a valid result: {e}"),
            None,
        )
    })
}

impl ClientHandler for UpstreamRelay {
    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some(up) = self.up.upgrade() {
            // No receiver (no downstream session subscribed) is not an error.
            let _ = up.relays.updates.send(params.uri);
        }
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(up) = self.up.upgrade() {
            up.relays
                .relay("notifications/resources/list_changed", None);
        }
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(up) = self.up.upgrade() {
            up.relays.relay("notifications/prompts/list_changed", None);
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(up) = self.up.upgrade() {
            tokio::spawn(up.relist(self.generation));
        }
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let method = "sampling/createMessage";
        let mut params = with_meta(
            serde_json::to_value(&params).unwrap_or(Value::Null),
            &context.meta,
        );
        crate::floats::decimal_sampling_floats(&mut params);
        let v = self
            .relay(method, &context, |c| async move {
                ask_channel(&c, method, params).await
            })
            .await?;
        parse_result(method, v)
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let method = "elicitation/create";
        let params = with_meta(
            serde_json::to_value(&params).unwrap_or(Value::Null),
            &context.meta,
        );
        let v = self
            .relay(method, &context, |c| async move {
                ask_channel(&c, method, params).await
            })
            .await?;
        parse_result(method, v)
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        // Fails closed: whatever keeps this call's client from answering (no call in flight
        // or several, no client, its error, its answer too late or unreadable) answers none,
        // so the server never keeps the roots of the client before (`roots.rs`).
        let Some(up) = self.up.upgrade() else {
            return Err(ErrorData::internal_error("Quiver is shutting down", None));
        };
        up.roots.asked();
        // A per-session server is given its session's roots, whatever it is doing.
        if let Some(link) = up.session.get() {
            let client = link.client();
            let answer = tokio::select! {
                r = roots_of(client.as_ref()) => r.ok(),
                _ = context.ct.cancelled() => None,
            };
            let answer = up.roots.answer(self.generation, answer, link.who.clone());
            return Ok(serde_json::from_value(answer).unwrap_or_default());
        }
        let (answer, who) = match up.calls.route(&Origin::of(&context.extensions)).await {
            Route::To(entry) => {
                let answer = tokio::select! {
                    r = roots_of(entry.channel.as_ref()) => r.ok(),
                    _ = entry.done.cancelled() => None,
                    _ = context.ct.cancelled() => None,
                };
                (answer, entry.who.clone())
            }
            refused => {
                tracing::info!(server = %up.cfg.name, route = ?refused, "roots/list answered with none: {}", refused.refusal("roots/list"));
                (None, Who::Unnamed)
            }
        };
        let answer = up.roots.answer(self.generation, answer, who);
        Ok(serde_json::from_value(answer).unwrap_or_default())
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        mut context: NotificationContext<RoleClient>,
    ) {
        let up = self.up.clone();
        // In the server's order: rmcp runs each notification's handler in a task of its own.
        let ticket = context.extensions.remove::<Delivering>();
        in_turn(ticket, async move {
            let Some(up) = up.upgrade() else { return };
            if let Some(channel) = up
                .calls
                .by_progress(&params.progress_token)
                .await
                .and_then(|e| e.channel.clone())
            {
                channel
                    .progress(params.progress, params.total, params.message)
                    .await;
            }
        })
        .await;
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        mut context: NotificationContext<RoleClient>,
    ) {
        let up = self.up.clone();
        let ticket = context.extensions.remove::<Delivering>();
        in_turn(ticket, async move {
            let Some(up) = up.upgrade() else { return };
            // A log message names no request. One that came on a call's own response
            // stream (streamable HTTP) is that call's. Otherwise it goes to the single call
            // in flight only on a connection that one principal uses (a per-session server,
            // a user's own connection, or a shared one only one principal has called so
            // far): a message the server sends for one principal's work (a background task
            // it started for them) must not reach another's client because theirs is the
            // call in flight. Such a message goes to the operator log.
            let origin = Origin::of(&context.extensions);
            let own = up.cfg.scope == crate::client::config::ServerScope::Session
                || up.cfg.for_user
                || up.calls.one_caller();
            let entry = match origin {
                Origin::Call(_) => match up.calls.route(&origin).await {
                    Route::To(entry) => Some(entry),
                    _ => None,
                },
                _ if own => match up.calls.route(&Origin::Unknown).await {
                    Route::To(entry) => Some(entry),
                    _ => None,
                },
                _ => None,
            };
            deliver_log(
                entry.as_ref().and_then(|e| e.channel.as_ref()),
                &up.cfg.name,
                params,
            )
            .await;
        })
        .await;
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            relayed_capabilities(),
            Implementation::new("quiver", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(Protocol::OFFERED.rmcp())
    }
}

/// An upstream log message to the calling client, or, without one, to the operator log.
pub(super) async fn deliver_log(
    channel: Option<&Arc<dyn ClientChannel>>,
    server: &str,
    params: LoggingMessageNotificationParam,
) {
    match channel {
        Some(c) => {
            c.log(
                crate::wire::from_mcp_level(params.level),
                params.logger.as_deref(),
                params.data,
            )
            .await;
        }
        None => tracing::info!(
            server = %server,
            level = ?params.level,
            logger = params.logger.as_deref().unwrap_or(""),
            "upstream log: {}",
            params.data
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's error reaches the upstream whole: code, message and `data` (a URL
    /// elicitation's -32042 lists the elicitations the upstream should make).
    #[test]
    fn a_clients_error_is_relayed_with_its_data() {
        let data = serde_json::json!({"elicitations": [{"mode": "url", "elicitationId": "e1"}]});
        let relayed = relay_error(
            ChannelError::Client {
                code: -32042,
                message: "this request requires more information".into(),
                data: Some(data.clone()),
            },
            "elicitation/create",
            "tool",
        );
        assert_eq!(relayed.code.0, -32042);
        assert_eq!(relayed.message, "this request requires more information");
        assert_eq!(relayed.data, Some(data));
    }

    /// A stdio upstream's sampling request reaches the client with its `_meta` (rmcp moved
    /// it to the request context; the direct HTTP path keeps it in the params).
    #[test]
    fn a_relayed_request_keeps_its_meta() {
        let meta: rmcp::model::RequestMetaObject =
            serde_json::from_value(serde_json::json!({"custom/key": "v1", "progressToken": 3}))
                .unwrap();
        let params = with_meta(serde_json::json!({"messages": [], "maxTokens": 5}), &meta);
        assert_eq!(
            params,
            serde_json::json!({"messages": [], "maxTokens": 5, "_meta": {"custom/key": "v1"}})
        );
        let none: rmcp::model::RequestMetaObject =
            serde_json::from_value(serde_json::json!({"progressToken": 3})).unwrap();
        assert_eq!(
            with_meta(serde_json::json!({"maxTokens": 5}), &none),
            serde_json::json!({"maxTokens": 5})
        );
    }
}
