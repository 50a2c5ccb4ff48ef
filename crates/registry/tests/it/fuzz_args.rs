//! Arguments of any shape through the whole pipeline: the dispatcher never panics; an
//! argument the schema refuses gets a schema Hint the model can act on (never reaching the
//! tool), and one it accepts reaches the tool. A property test (`proptest`); set
//! `PROPTEST_CASES` for a longer run.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use proptest::prelude::*;
use quiver_contract::{Envelope, HintKind, ToolSpec};
use serde_json::{Value, json};

use crate::support::{ctx, dispatcher, tool};

fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,10}".prop_map(Value::from),
        Just(Value::from("reasoning")),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("path".to_owned()),
                    Just("mode".to_owned()),
                    Just("limit".to_owned()),
                    Just("tags".to_owned()),
                    Just("reasoning".to_owned()),
                    "[a-z]{1,6}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Objects close to what the schema takes: each field valid or not.
fn near_valid() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just(json!("a.txt")), Just(json!("")), any_value()],
        proptest::option::of(prop_oneof![
            Just(json!("text")),
            Just(json!("bytes")),
            any_value()
        ]),
        proptest::option::of(prop_oneof![
            (-5i64..1500).prop_map(Value::from),
            any_value()
        ]),
        proptest::option::of(proptest::collection::vec("[a-z]{0,3}", 0..5).prop_map(|t| json!(t))),
        proptest::option::of(any_value()),
    )
        .prop_map(|(path, mode, limit, tags, reasoning)| {
            let mut o = json!({"path": path});
            for (k, v) in [
                ("mode", mode),
                ("limit", limit),
                ("tags", tags),
                ("reasoning", reasoning),
            ] {
                if let Some(v) = v {
                    o[k] = v;
                }
            }
            o
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn any_arguments_are_run_or_refused_with_a_schema_hint(args in prop_oneof![any_value(), near_valid()]) {
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = ran.clone();
        let d = dispatcher(vec![tool(
            ToolSpec::new("read", "Reads part of a file.").read_only().with_schema(json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1},
                    "mode": {"enum": ["text", "bytes"]},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
                },
                "required": ["path"],
                "additionalProperties": false
            })),
            move |_, _| {
                counter.fetch_add(1, Ordering::Relaxed);
                async { Ok(Envelope::text("done")) }
            },
        )]);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let env = rt.block_on(d.call("read", args.clone(), ctx()));
        let reached = ran.load(Ordering::Relaxed);
        if env.is_ok() {
            prop_assert_eq!(reached, 1, "{}", args);
        } else {
            prop_assert_eq!(reached, 0, "{}", args);
            prop_assert_eq!(env.hint_kind(), Some(HintKind::Schema), "{}: {:?}", args, env);
            prop_assert!(!env.message().unwrap_or_default().is_empty());
        }
    }
}
