//! What the JSON-RPC readers' property tests feed them (stdio lines, HTTP bodies).

use serde_json::{Value, json};

/// Lines of any kind: bytes that are no JSON, JSON that is no JSON-RPC, and JSON-RPC
/// requests with their fields replaced by values of other kinds.
pub(crate) fn any_line() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    let value = leaf.prop_recursive(4, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    let fields = ["jsonrpc", "id", "method", "params"];
    let request = (
        0..fields.len(),
        value.clone(),
        prop_oneof![
            Just("ping"),
            Just("tools/call"),
            Just("tools/list"),
            Just("initialize"),
            Just("notifications/cancelled"),
            Just("resources/read"),
        ],
    )
        .prop_map(move |(field, v, method)| {
            let mut r = json!({"jsonrpc": "2.0", "id": 7, "method": method,
                "params": {"name": "t", "arguments": {}}});
            r[fields[field]] = v;
            r.to_string()
        });
    let truncated = (request.clone(), any::<proptest::sample::Index>()).prop_map(|(r, at)| {
        let cut = at.index(r.len().max(1));
        r.char_indices()
            .map(|(i, _)| i)
            .take_while(|&i| i <= cut)
            .last()
            .map_or(r.clone(), |i| r[..i].to_owned())
    });
    prop_oneof![
        "[^\r\n]{1,200}",
        value.prop_map(|v| v.to_string()),
        request,
        truncated,
    ]
    // A line that is blank to the transport (whitespace, a byte-order mark) is skipped, as
    // it should be: no answer to wait for.
    .prop_filter("not blank", |l| {
        !crate::lines::message_bytes(l.as_bytes()).is_empty()
    })
}
