use serde_json::json;

use super::*;

#[test]
fn lints_follow_the_guide() {
    let bad = ToolSpec::new("post", "Posts a message.").with_schema(json!({
        "type": "object",
        "properties": {
            "channel": {"description": "Where."},
            "text": {"type": "string"},
            "priority": {"type": "string", "description": "One of low, medium, high."},
            "meta": {"type": "object", "description": "Extra.", "properties": {"k": {"type": "string", "description": "Key."}}}
        }
    }));
    let rules: Vec<_> = lint_spec(&bad)
        .iter()
        .map(|f| (f.rule, f.path.clone()))
        .collect();
    assert_eq!(
        rules,
        vec![
            ("when_to_use", "".into()),
            ("required_listed", "".into()),
            ("property_type", "/properties/channel".into()),
            ("property_description", "/properties/text".into()),
            ("closed_set_enum", "/properties/priority".into()),
            ("required_listed", "/properties/meta".into()),
        ]
    );
    let good = ToolSpec::new("post", "Posts a message. Use it when the user asks to notify a channel.").with_schema(json!({
        "type": "object",
        "properties": {"priority": {"type": "string", "enum": ["low", "high"], "description": "One of low, high."}},
        "required": []
    }));
    assert!(lint_spec(&good).is_empty(), "{:?}", lint_spec(&good));
}

/// "Says when to use" takes words that say it, not any "use " or "when " inside a word
/// or about something else.
#[test]
fn names_the_provider_apis_refuse_are_findings() {
    let rule = |name: &str| {
        lint_spec(&ToolSpec::new(name, "Reads. Use it when you need to read."))
            .into_iter()
            .find(|f| f.rule == "provider_name")
            .map(|f| f.message)
    };
    assert_eq!(rule("mcp__fs__read_file"), None);
    assert_eq!(rule("a-b_C9"), None);
    let dotted = rule("mcp__fs__files.read").expect("a finding");
    assert!(dotted.contains("'.'"), "{dotted}");
    // A character no prefix can fix: the ways to keep it off or serve it renamed.
    assert!(
        dotted.contains("leave it out with the server's `deny_tools`")
            && dotted.contains("catalog `mcp` alias")
            && !dotted.contains("shorter prefix"),
        "{dotted}"
    );
    let long = rule(&"x".repeat(65)).expect("a finding");
    assert!(long.contains("65 characters long"), "{long}");
    assert!(long.contains("give its server a shorter prefix"), "{long}");
    assert!(rule(&"x".repeat(64)).is_none());
    assert!(rule("café").is_some());
}

#[test]
fn when_to_use_needs_a_phrase_that_says_when() {
    let says = |d: &str| {
        !lint_spec(&ToolSpec::new("t", d))
            .iter()
            .any(|f| f.rule == "when_to_use")
    };
    for d in [
        "Lists the rooms of a house (floor plans).",
        "Reports when the file was last modified.",
        "Reuses the cached answer.",
        "Returns the user's profile.",
        // The review's false passes of a longer list.
        "Only returns public repositories.",
        "Lists call records. Call duration is in seconds.",
        "Fetches a page.\n\nArgs:\n    use_cache: reuse a copy",
        "Returns the port to use to connect.",
        "Lists events fired whenever the file changes.",
        "Reports when you last logged in.",
    ] {
        assert!(!says(d), "{d}");
    }
    for d in [
        "Searches the web. Use this for current events.",
        "Reads a file. Use it when you need its content.",
        "Turns a spreadsheet into a PDF. Use when asked to bill a customer.",
        "Deletes a branch. Call this after merging.",
        "Fetches prices. Useful when the user asks about costs.",
        "Looks up a word. Don't use it for names.",
        "Converts units when you need metric values.",
        // Real tools' wordings (the review found these refused by an earlier list).
        "Answers questions about the docs. Use whenever the user asks about the API.",
        "Use to answer questions about the codebase.",
        "Sends the email. Use only after confirming the recipient.",
        "Runs a query.\nWhen to use:\n- reporting",
        "Searches the docs. Prefer this over web search when the answer is in the docs.",
        "Lists open incidents. Helpful when triaging an outage.",
        "Reads a file. Use the offset and length arguments when it is large.",
        "Searches for files. Great for finding files when you don't know their exact location.",
    ] {
        assert!(says(d), "{d}");
    }
}

/// Properties of nested objects are linted wherever the object is: a property typed
/// `["object", "null"]`, an `anyOf` / `oneOf` branch, array items.
#[test]
fn nested_objects_are_linted_in_nullable_types_and_branches() {
    let spec = ToolSpec::new("t", "Does it. Use it when asked.").with_schema(json!({
        "type": "object",
        "properties": {
            "opts": {"type": ["object", "null"], "description": "Options.", "required": [],
                     "properties": {"depth": {"description": "How deep."}}},
            "target": {"description": "Where.", "anyOf": [
                {"type": "object", "required": [], "properties": {"path": {"type": "string"}}},
                {"type": "string"}
            ]},
            "level": {"type": ["string", "null"], "description": "One of low, high."}
        },
        "required": [],
        "oneOf": [{"required": [], "properties": {"x": {"type": "string"}}}]
    }));
    let got: Vec<_> = lint_spec(&spec)
        .iter()
        .map(|f| (f.rule, f.path.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("root_combinator", "".into()),
            ("property_type", "/properties/opts/properties/depth".into()),
            (
                "property_description",
                "/properties/target/anyOf/0/properties/path".into()
            ),
            ("closed_set_enum", "/properties/level".into()),
            ("property_description", "/oneOf/0/properties/x".into()),
        ]
    );
}

#[test]
fn breaking_changes_are_found() {
    let old = ToolSpec::new("t", "T.").with_schema(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "string"}},
        "required": ["a"]
    }));
    let new = ToolSpec::new("t", "T.").with_schema(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "d": {"type": "string"}, "e": {"type": "string", "default": "x"}, "f": {"type": "string"}},
        "required": ["a", "d", "e"]
    }));
    let kinds: Vec<_> = breaking_changes(&old, &new)
        .into_iter()
        .map(|c| (c.kind, c.field.unwrap_or_default()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("type_changed", "b".into()),
            ("removed_field", "c".into()),
            ("new_required_field", "d".into())
        ]
    );
    let gone = breaking_changes_between(&[old.clone(), ToolSpec::new("u", "U.")], &[new]);
    assert_eq!(gone.last().unwrap().kind, "removed_tool");
}

fn changes(old: Value, new: Value) -> Vec<(&'static str, String, String)> {
    let (old, new) = (
        ToolSpec::new("t", "T.").with_schema(old),
        ToolSpec::new("t", "T.").with_schema(new),
    );
    breaking_changes(&old, &new)
        .into_iter()
        .map(|c| (c.kind, c.field.unwrap_or_default(), c.message))
        .collect()
}

/// Types compare as sets, and a type that accepts more than before is not breaking.
#[test]
fn type_changes_are_compared_as_sets_and_widening_is_not_breaking() {
    let field = |t: Value| json!({"type": "object", "properties": {"a": {"type": t}}});
    for (old, new) in [
        (json!(["string", "null"]), json!(["null", "string"])),
        (json!("integer"), json!("number")),
        (json!("string"), json!(["string", "null"])),
        (json!(["integer", "null"]), json!(["number", "null"])),
    ] {
        assert_eq!(
            changes(field(old.clone()), field(new.clone())),
            [],
            "{old} -> {new}"
        );
    }
    assert_eq!(
        changes(field(json!("number")), field(json!("integer"))),
        [(
            "type_changed",
            "a".into(),
            "field `a` changed type from number to integer".into()
        )]
    );
    assert_eq!(
        changes(field(json!(["string", "null"])), field(json!("string"))),
        [(
            "type_changed",
            "a".into(),
            "field `a` changed type from [null, string] to string".into()
        )]
    );
    // pydantic's Optional[str] (anyOf string, null) is the same as type [string, null].
    let any_of = json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}});
    assert_eq!(
        changes(any_of.clone(), field(json!(["string", "null"]))),
        []
    );
    assert_eq!(
        changes(any_of, field(json!("integer"))),
        [(
            "type_changed",
            "a".into(),
            "field `a` changed type from [null, string] to integer".into()
        )]
    );
    // The items of an array of plain values.
    let list = |t: &str| json!({"type": "object", "properties": {"ids": {"type": "array", "items": {"type": t}}}});
    assert_eq!(
        changes(list("string"), list("integer")),
        [(
            "type_changed",
            "ids[]".into(),
            "the items of `ids` changed type from string to integer".into()
        )]
    );
    assert_eq!(changes(list("integer"), list("number")), []);
}

/// Nested objects (also under `["object", "null"]` and in array items) are compared
/// field by field.
#[test]
fn nested_object_properties_are_compared() {
    let old = json!({"type": "object", "properties": {
        "opts": {"type": ["object", "null"], "properties": {
            "depth": {"type": "integer"}, "mode": {"type": "string"}
        }, "required": []},
        "rows": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "string"}}}}
    }});
    let new = json!({"type": "object", "properties": {
        "opts": {"type": ["object", "null"], "properties": {
            "depth": {"type": "string"}, "limit": {"type": "integer"}, "page": {"type": "integer", "default": 1}
        }, "required": ["limit", "page"]},
        "rows": {"type": "array", "items": {"type": "object", "properties": {}}}
    }});
    let got: Vec<(&str, String)> = changes(old, new)
        .into_iter()
        .map(|(k, f, _)| (k, f))
        .collect();
    assert_eq!(
        got,
        [
            ("type_changed", "opts.depth".into()),
            ("removed_field", "opts.mode".into()),
            ("new_required_field", "opts.limit".into()),
            ("removed_field", "rows[].id".into()),
        ]
    );
}
