//! Requests refused before they run: the answer to one rmcp could not parse
//! ([`unparsed_request`]), and the log row of a `tools/call` that the handler or a transport
//! refused ([`record_invalid_params`], [`record_transport_refusal`]): a refused call is a
//! call all the same, with its row.

// `logging/setLevel` is deprecated by SEP-2577 but 2025-era clients still send it.
#![allow(deprecated)]

use quiver_contract::CallContext;
use rmcp::{
    ErrorData,
    model::{
        CallToolRequestParams, CompleteRequestParams, ErrorCode, GetPromptRequestParams,
        InitializeRequestParams, PaginatedRequestParams, ReadResourceRequestParams,
        RequestMetaObject, SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams,
    },
};
use serde_json::Value;

use super::{Shared, auth::Principal, scope::scope};

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
        // serde does not say which field had the wrong type: the one whose
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
        // MCP names its notifications so; one sent with an `id` arrives here as a request.
        _ if method.starts_with("notifications/") => {
            return ErrorData::new(
                ErrorCode::INVALID_REQUEST,
                format!(
                    "Invalid Request: `{method}` is a notification: send it without an `id` \
                     (a notification gets no answer)"
                ),
                None,
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `subscriptions/listen` whose params do not fit is invalid params naming the
    /// problem (not "method not found", 404, as if listening did not exist); an unknown
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

    /// A notification sent with an `id` is told to go without it, not "method not found".
    #[test]
    fn a_notification_sent_as_a_request_is_told_to_drop_its_id() {
        let e = unparsed_request("notifications/initialized", None, false);
        assert_eq!(e.code, ErrorCode::INVALID_REQUEST, "{}", e.message);
        assert!(
            e.message.contains("send it without an `id`"),
            "{}",
            e.message
        );
        let e = unparsed_request("tools/frobnicate", None, false);
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
        ); // The field with the wrong type is named, in JSON's words.
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
}
