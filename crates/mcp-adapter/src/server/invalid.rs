//! What is wrong with a message that is not one JSON-RPC 2.0 message this server reads, for
//! the error a client gets back over HTTP (`direct`) and over stdio (`stdio`).

use serde_json::Value;

/// JSON-RPC's code for text that is not JSON.
pub(super) const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's code for JSON that is not a valid request.
pub(super) const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC's invalid params.
pub(super) const INVALID_PARAMS: i64 = -32602;

/// Why `message`, an `initialize` request, cannot open a session (`None` when it can, or is
/// no `initialize`). rmcp reads a malformed one as some other request, and answered for that:
/// over HTTP that a session id is required, over stdio that 2026 `_meta` fields are missing.
pub(super) fn initialize_problem(message: &Value) -> Option<String> {
    if message.get("method").and_then(Value::as_str) != Some("initialize") {
        return None;
    }
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    // A 2026-07-28 request (its `_meta` names the protocol's fields) is rmcp's to answer:
    // that version removed `initialize` (404, -32601).
    if params
        .get("_meta")
        .and_then(Value::as_object)
        .is_some_and(|m| m.keys().any(|k| k.starts_with("io.modelcontextprotocol/")))
    {
        return None;
    }
    let shape = match &params {
        Value::Null => Some("`params` is missing"),
        Value::Object(_) => None,
        Value::Array(_) => Some("`params` is an array"),
        _ => Some("`params` is not an object"),
    };
    let e = serde_json::from_value::<rmcp::model::InitializeRequestParams>(params).err()?;
    // serde's words for a `params` that is no object name a Rust type; what is wrong
    // is said instead.
    let why = shape.map_or_else(|| e.to_string(), str::to_owned);
    Some(format!(
        "Invalid params: an `initialize` needs `params` with `protocolVersion` (a string such as \"2025-11-25\"), `capabilities` (an object) and `clientInfo` (with `name` and `version`): {why}"
    ))
}

/// The list requests, whose `params.cursor` is a page's `nextCursor`.
const LISTS: [&str; 4] = [
    "tools/list",
    "resources/list",
    "resources/templates/list",
    "prompts/list",
];

/// Whether `method` is a list request, whose `params.cursor` is a page's `nextCursor`.
pub(super) fn is_list(method: &str) -> bool {
    LISTS.contains(&method)
}

/// Why `message`, a request, has a cursor no page gave out: a list's `cursor` that is not a
/// string (rmcp reads such params as none, and answered the first page as if none had been
/// sent; MCP asks for -32602 for an invalid cursor). `None` for anything else. The id comes
/// with the reason.
pub(super) fn cursor_problem(message: &serde_json::Map<String, Value>) -> Option<(Value, String)> {
    let method = message
        .get("method")
        .and_then(Value::as_str)
        .filter(|m| is_list(m))?;
    let cursor = message.get("params")?.get("cursor")?;
    if cursor.is_string() || cursor.is_null() {
        return None;
    }
    // A notification is not answered, whatever it holds.
    let id = message.get("id").cloned()?;
    Some((
        id,
        format!(
            "invalid params for `{method}`: `cursor` must be a string, the `nextCursor` of an earlier page (got {cursor}); list without a cursor for the first page"
        ),
    ))
}

/// A list request's `cursor` problem ([`cursor_problem`]), put in the extensions of a
/// request rmcp reads past the transports' own check (an HTTP 2026-07-28 request, which
/// opens no session; a stdio batch element): the handler refuses the list with it.
#[derive(Debug, Clone)]
pub(super) struct BadCursor(pub(super) std::sync::Arc<str>);

/// A message the server refuses to read: the error code, the message the client reads, and
/// the request's id when it can be read (else null, as JSON-RPC 2.0, section 5, asks).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Refusal {
    pub(super) code: i64,
    /// Which of the transport's own limits the message is past, if any: what a refused
    /// call's row is logged as, set where the refusal is made.
    pub(super) limit: Option<Limit>,
    pub(super) message: String,
    pub(super) id: Value,
}

/// A limit of the transport that a refused message is past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Limit {
    /// Nested past the parser's 128 levels.
    Depth,
    /// A body or line longer than the transport reads.
    Size,
}

/// The refusal of `bytes` ("the body", "the line": `what`) that serde could not read
/// (`err`): valid JSON nested past the parser's 128 levels is said to be so (`-32600`, not
/// "not valid JSON"), anything else is not valid JSON (`-32700`). Either carries the
/// request's id when the first or last bytes hold one (not `id: null`).
pub(super) fn unreadable(bytes: &[u8], err: &str, what: &str) -> Refusal {
    let id = crate::lines::find_id(bytes, bytes).unwrap_or(Value::Null);
    if err.starts_with("recursion limit exceeded") {
        return Refusal {
            code: INVALID_REQUEST,
            limit: Some(Limit::Depth),
            message: format!(
                "Invalid Request: {what} nests arrays and objects more than 128 levels deep, more than Quiver reads; send the arguments less deeply nested"
            ),
            id,
        };
    }
    // JSON sets no range on numbers; Quiver reads them as 64-bit floats, so one past
    // about 1.8e308 is valid JSON it cannot read.
    if err.starts_with("number out of range") {
        return Refusal {
            code: INVALID_REQUEST,
            limit: None,
            message: format!(
                "Invalid Request: {what} holds a number too large for Quiver to read ({err}); numbers must be within about ±1.8e308 (send a larger value as a string)"
            ),
            id,
        };
    }
    Refusal {
        code: PARSE_ERROR,
        limit: None,
        message: format!("Parse error: {what} is not valid JSON ({err})"),
        id,
    }
}

impl Refusal {
    /// The kind a refused call's row is logged with: `parse_error` (-32700),
    /// `invalid_params` (-32602), `too_deep` (nested past the parser's limit, as the
    /// dispatcher's own refusal of deep arguments), `input_too_large` (a body or line past
    /// the transport's limit) or `invalid_request`.
    pub(super) fn kind(&self) -> &'static str {
        match (self.limit, self.code) {
            (Some(Limit::Depth), _) => "too_deep",
            // As the dispatcher's own kind for arguments past `max_input_bytes`.
            (Some(Limit::Size), _) => "input_too_large",
            (None, PARSE_ERROR) => "parse_error",
            (None, INVALID_PARAMS) => "invalid_params",
            (None, _) => "invalid_request",
        }
    }

    /// The JSON-RPC error response.
    pub(super) fn to_json(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        })
    }
}

/// A `tools/call` refused before it reached the dispatcher (by a transport's own checks),
/// for its row in the execution log: every call has one, refused or not. Its name as sent
/// ([`super::refusals::sent_name`]), its arguments (null when it had none) and its `_meta`
/// (for the conversation key).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RefusedCall {
    pub(crate) name: String,
    pub(crate) input: Value,
    pub(crate) meta: Value,
}

/// The `tools/call` that `message` is, if it is one (by its `method`).
pub(crate) fn refused_call(message: &Value) -> Option<RefusedCall> {
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return None;
    }
    let params = message.get("params");
    let field = |k: &str| params.and_then(|p| p.get(k)).cloned();
    Some(RefusedCall {
        name: super::refusals::sent_name(field("name")),
        input: field("arguments").unwrap_or(Value::Null),
        meta: field("_meta").unwrap_or(Value::Null),
    })
}

/// The `tools/call`s in `bytes`, a refused message or batch: JSON nested too deeply for
/// serde is read with the parts past [`crate::lines::KEPT_DEPTH`] cut
/// ([`crate::lines::pruned`]); text that is not JSON at all but names `tools/call` is one
/// call all the same, logged with no arguments under the tool name its first bytes give
/// (a body cut at the size limit), or `(unreadable)`.
pub(crate) fn refused_calls_in(bytes: &[u8]) -> Vec<RefusedCall> {
    let readable = serde_json::from_slice::<Value>(bytes).ok().or_else(|| {
        crate::lines::pruned(bytes, crate::lines::KEPT_DEPTH)
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
    });
    match readable {
        Some(Value::Array(items)) => items.iter().filter_map(refused_call).collect(),
        Some(message) => refused_call(&message).into_iter().collect(),
        None if bytes.windows(12).any(|w| w == b"\"tools/call\"") => vec![RefusedCall {
            name: crate::lines::call_name_at_start(bytes).unwrap_or_else(|| "(unreadable)".into()),
            input: Value::Null,
            meta: Value::Null,
        }],
        None => Vec::new(),
    }
}

/// The refusal of a request whose id `text` is already used `by` another not answered yet:
/// the two answers could not be told apart.
pub(super) fn reused_id(id: Value, text: &str, by: &str) -> Refusal {
    Refusal {
        code: INVALID_REQUEST,
        limit: None,
        message: format!(
            "Invalid Request: the id {text} is already used by {by}; give each request its own id"
        ),
        id,
    }
}

/// The refusal of an `initialize` inside a batch: 2025-03-26, the only version with
/// batches, says it MUST NOT be part of one (the session it opens is already open here).
fn initialize_in_batch(id: Value) -> Refusal {
    Refusal {
        code: INVALID_REQUEST,
        limit: None,
        message: "Invalid Request: an `initialize` must not be part of a batch; send it alone, as the session's first message".into(),
        id,
    }
}

/// A batch element's request id as rmcp reads it (`5.0` is the id `5`), as JSON text; none
/// for an element without a `method` or a usable `id`.
fn batch_id(item: &Value) -> Option<String> {
    item.get("method")?;
    let id = serde_json::from_value::<rmcp::model::RequestId>(item.get("id")?.clone()).ok()?;
    serde_json::to_string(&id).ok()
}

/// The ids that more than one request of the batch `items` carries, with how many do (the
/// malformed ones too: each holds its id).
pub(super) fn shared_ids(items: &[Value]) -> std::collections::HashMap<String, usize> {
    let mut counts = std::collections::HashMap::new();
    for id in items.iter().filter_map(batch_id) {
        *counts.entry(id).or_insert(0usize) += 1;
    }
    counts.retain(|_, n| *n > 1);
    counts
}

/// Why the batch element `item` is refused before it runs, on either transport: its id is
/// one that other requests of the batch carry too (`shared`, from [`shared_ids`]: then none
/// of them runs, as no answer could tell which one it is: running the first would put a
/// result and an error under one id in the batch's answer), or, per `in_flight`, that of a
/// request still in flight; or it is an `initialize`.
pub(super) fn refused_in_batch(
    item: &Value,
    shared: &std::collections::HashMap<String, usize>,
    in_flight: impl Fn(&str) -> bool,
) -> Option<Refusal> {
    let text = batch_id(item)?;
    let raw = item.get("id").cloned().unwrap_or(Value::Null);
    if let Some(n) = shared.get(&text) {
        tracing::warn!("{n} requests of a batch carry the id {text}: none of them was run");
        return Some(Refusal {
            code: INVALID_REQUEST,
            limit: None,
            message: format!(
                "Invalid Request: {n} requests of this batch carry the id {text}, and none of them was run; give each request its own id"
            ),
            id: raw,
        });
    }
    if in_flight(&text) {
        tracing::warn!("a batched request reused the id {text}");
        return Some(reused_id(raw, &text, "a request in flight"));
    }
    // Whatever its params (one without them is no message rmcp can read).
    (item.get("method").and_then(Value::as_str) == Some("initialize"))
        .then(|| initialize_in_batch(raw))
}

/// Whether `value` is a notification in JSON-RPC's shape (no `id`), which is not answered
/// even when the server cannot read it.
pub(super) fn is_notification(value: &Value) -> bool {
    value.get("id").is_none()
        && value.get("jsonrpc") == Some(&Value::String("2.0".into()))
        && value.get("method").is_some_and(Value::is_string)
        // Positional params too: a notification is never answered, even one no MCP method
        // takes.
        && value
            .get("params")
            .is_none_or(|p| p.is_object() || p.is_array())
}

/// The problem of `params` that are not an object.
const PARAMS_NOT_OBJECT: &str = "`params` must be an object";

/// What is wrong with `value`, JSON that rmcp could not read as one message; `what` names
/// the carrier ("the body", "the line").
/// [`diagnose`] for a message as it was `sent`: a member given twice (which a `Value` keeps
/// once, and rmcp refuses) is named first.
pub(super) fn diagnose_sent(sent: &[u8], value: &Value, what: &str) -> Refusal {
    match repeated_member(sent) {
        Some(key) => Refusal {
            code: INVALID_REQUEST,
            limit: None,
            message: format!(
                "Invalid Request: {what} gives the member `{key}` twice; give each member once"
            ),
            id: match key.as_str() {
                "id" => Value::Null,
                _ => diagnose(value, what).id,
            },
        },
        None => diagnose(value, what),
    }
}

/// The first member that the message in `sent` gives twice, at its top level or in its
/// `params` (`params.name`), if any: a `Value` keeps the last of them, so a message read
/// so would silently run another request than the one its first member names.
pub(crate) fn repeated_member(sent: &[u8]) -> Option<String> {
    serde_json::from_slice::<Repeated>(sent).ok()?.0
}

/// The first member an object gives twice (of `params` too, at the top level).
struct Repeated(Option<String>);

impl<'de> serde::Deserialize<'de> for Repeated {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Members { top: true })
    }
}

/// [`Repeated`] below the top level: the keys of `params`, nothing deeper.
struct Nested(Option<String>);

impl<'de> serde::Deserialize<'de> for Nested {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Members { top: false })
            .map(|Repeated(r)| Nested(r))
    }
}

struct Members {
    top: bool,
}

impl<'de> serde::de::Visitor<'de> for Members {
    type Value = Repeated;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Repeated, A::Error> {
        // Read to the end: serde_json refuses an object left half read.
        let (mut seen, mut first) = (std::collections::HashSet::new(), None);
        while let Some(key) = map.next_key::<String>()? {
            let inner = if self.top && key == "params" {
                map.next_value::<Nested>()?.0.map(|k| format!("params.{k}"))
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
                None
            };
            if first.is_none() {
                first = if seen.insert(key.clone()) {
                    inner
                } else {
                    Some(key)
                };
            }
        }
        Ok(Repeated(first))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Repeated, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Repeated(None))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Repeated, E> {
        Ok(Repeated(None))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Repeated, E> {
        Ok(Repeated(None))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Repeated, E> {
        Ok(Repeated(None))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Repeated, E> {
        Ok(Repeated(None))
    }

    fn visit_str<E>(self, _: &str) -> Result<Repeated, E> {
        Ok(Repeated(None))
    }

    fn visit_unit<E>(self) -> Result<Repeated, E> {
        Ok(Repeated(None))
    }
}

pub(super) fn diagnose(value: &Value, what: &str) -> Refusal {
    let Value::Object(m) = value else {
        let kind = if value.is_array() {
            "a batch (an array); send one message at a time"
        } else {
            "not a JSON object"
        };
        return Refusal {
            code: INVALID_REQUEST,
            limit: None,
            message: format!(
                "Invalid Request: {what} must be one JSON-RPC 2.0 message object, and it is {kind}"
            ),
            id: Value::Null,
        };
    };
    let id = match m.get("id") {
        Some(v @ Value::String(_)) => v.clone(),
        Some(Value::Number(n)) if n.is_i64() => Value::Number(n.clone()),
        _ => Value::Null,
    };
    let shape = if m.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        Some("`jsonrpc` must be \"2.0\"")
    } else if m.get("id").is_some_and(|v| {
        !v.is_i64()
            && (v.is_u64()
                || v.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() >= 9.2e18))
    }) {
        Some(
            "`id` must be a string or an integer from -2^63 to 2^63-1 (a larger one cannot be kept exactly; send it as a string)",
        )
    } else if m
        .get("id")
        .is_some_and(|v| id.is_null() && !v.is_null() || v.is_null())
    {
        Some("`id` must be a string or an integer")
    } else if m.get("method").is_some_and(|v| !v.is_string()) {
        Some("`method` must be a string")
    } else if m.get("params").is_some_and(|v| !v.is_object()) {
        Some(PARAMS_NOT_OBJECT)
    } else if m
        .get("params")
        .and_then(|p| p.get("_meta"))
        .is_some_and(|v| !v.is_object())
    {
        Some("`params._meta` must be an object")
    } else if !m.contains_key("method") && !m.contains_key("result") && !m.contains_key("error") {
        Some("it has no `method` (nor `result` or `error`)")
    } else {
        None
    };
    // Positional params are valid JSON-RPC, but no MCP method takes them: invalid params.
    if shape == Some(PARAMS_NOT_OBJECT) && m.get("params").is_some_and(Value::is_array) {
        return Refusal {
            code: INVALID_PARAMS,
            limit: None,
            message: "Invalid params: `params` is an array (positional parameters); MCP's methods take an object of named parameters (for tools/call: {\"name\": ..., \"arguments\": {...}})".to_owned(),
            id,
        };
    }
    if let Some(problem) = shape {
        return Refusal {
            code: INVALID_REQUEST,
            limit: None,
            message: format!(
                "Invalid Request: {what} is not a valid JSON-RPC 2.0 message: {problem}"
            ),
            id,
        };
    }
    Refusal {
        code: INVALID_REQUEST,
        limit: None,
        message: format!(
            "Invalid Request: {what} is not a request, notification or response this server reads"
        ),
        id,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Only a list request's cursor that is neither a string nor null is a problem; a
    /// notification is never answered, and another method's `cursor` is its own business.
    /// A member given twice is named (a `Value` keeps one of them and would let the
    /// message pass as another problem); an `initialize` whose `params` is no object is
    /// told so without serde's Rust type name.
    #[test]
    fn a_repeated_member_and_initialize_params_that_are_no_object_are_named() {
        let sent = br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#;
        let value: Value = serde_json::from_slice(sent).unwrap();
        let refusal = diagnose_sent(sent, &value, "the body");
        assert_eq!(refusal.code, INVALID_REQUEST);
        assert_eq!(
            refusal.message,
            "Invalid Request: the body gives the member `id` twice; give each member once"
        );
        let sent = br#"{"jsonrpc":"2.0","id":3,"method":"ping","method":"pong"}"#;
        let value: Value = serde_json::from_slice(sent).unwrap();
        let refusal = diagnose_sent(sent, &value, "the line");
        assert!(
            refusal.message.contains("`method` twice"),
            "{}",
            refusal.message
        );
        assert_eq!(refusal.id, json!(3));
        // Nested objects may use a key their parent uses.
        assert_eq!(repeated_member(br#"{"id":1,"params":{"id":2}}"#), None);
        assert_eq!(
            repeated_member(br#"{"params":{"name":"a","arguments":{"x":1,"x":2},"name":"b"}}"#)
                .as_deref(),
            Some("params.name")
        );
        assert_eq!(repeated_member(br#"{"params":[1,2],"id":3}"#), None);
        for (params, says) in [
            (Value::Null, "`params` is missing"),
            (json!([1]), "`params` is an array"),
            (json!("x"), "`params` is not an object"),
        ] {
            let problem =
                initialize_problem(&json!({"method": "initialize", "params": params})).unwrap();
            assert!(problem.ends_with(says), "{problem}");
            assert!(!problem.contains("InitializeRequestParams"), "{problem}");
        }
    }

    #[test]
    fn a_list_cursor_must_be_a_string() {
        let problem = |v: Value| cursor_problem(v.as_object().expect("an object"));
        let (id, why) = problem(
            json!({"jsonrpc": "2.0", "id": "a", "method": "resources/list",
            "params": {"cursor": 5}}),
        )
        .expect("a number cursor");
        assert_eq!(id, json!("a"));
        assert!(
            why.contains("`cursor` must be a string") && why.contains("(got 5)"),
            "{why}"
        );
        for fine in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": "p2"}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": null}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "x", "arguments": {"cursor": 5}}}),
            json!({"jsonrpc": "2.0", "method": "tools/list", "params": {"cursor": 5}}),
        ] {
            assert_eq!(problem(fine.clone()), None, "{fine}");
        }
    }

    #[test]
    fn each_problem_is_named_with_the_id_when_it_can_be_read() {
        let cases = [
            (json!([1, 2]), INVALID_REQUEST, "a batch", Value::Null),
            (
                json!("x"),
                INVALID_REQUEST,
                "not a JSON object",
                Value::Null,
            ),
            (
                json!({"jsonrpc": "1.0", "id": 4, "method": "ping"}),
                INVALID_REQUEST,
                "`jsonrpc` must be \"2.0\"",
                json!(4),
            ),
            (
                json!({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}),
                INVALID_REQUEST,
                "`id` must be a string or an integer",
                Value::Null,
            ),
            (
                serde_json::from_str(
                    r#"{"jsonrpc": "2.0", "id": 99999999999999999999, "method": "ping"}"#,
                )
                .unwrap(),
                INVALID_REQUEST,
                "`id` must be a string or an integer from -2^63 to 2^63-1",
                Value::Null,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 18446744073709551615u64, "method": "ping"}),
                INVALID_REQUEST,
                "`id` must be a string or an integer from -2^63 to 2^63-1 (a larger one cannot be kept exactly; send it as a string)",
                Value::Null,
            ),
            (
                json!({"jsonrpc": "2.0", "id": "a", "method": 3}),
                INVALID_REQUEST,
                "`method` must be a string",
                json!("a"),
            ),
            (
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": [1]}),
                INVALID_PARAMS,
                "Invalid params: `params` is an array (positional parameters)",
                json!(2),
            ),
            (
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": "x"}),
                INVALID_REQUEST,
                "`params` must be an object",
                json!(2),
            ),
            (
                json!({"jsonrpc": "2.0", "id": 3}),
                INVALID_REQUEST,
                "it has no `method`",
                json!(3),
            ),
        ];
        // A notification, whatever its params hold, is not answered.
        assert!(is_notification(
            &json!({"jsonrpc": "2.0", "method": "notifications/x", "params": [1]})
        ));
        assert!(!is_notification(
            &json!({"jsonrpc": "2.0", "method": "notifications/x", "params": 5})
        ));
        for (value, code, says, id) in cases {
            let refusal = diagnose(&value, "the line");
            assert_eq!(refusal.code, code, "{value}: {refusal:?}");
            assert!(refusal.message.contains(says), "{value}: {refusal:?}");
            assert_eq!(refusal.id, id, "{value}");
        }
    }
}
