use quiver_contract::{
    Alternative, Effects, Envelope, ErrKind, HintKind, Part, RenderOptions, Warning, coerce_legacy,
    render, strip_status_line,
};
use serde_json::{Value, json};

fn check(name: &str, envelope: &Envelope) {
    let text = render(envelope, &RenderOptions::default());
    insta::assert_snapshot!(name, text);
}

/// The model reads every row (the result limit has already bounded them); a preview for
/// people states the true count and marks the rows it leaves out.
#[test]
fn ok_table_states_the_true_row_count_and_marks_elided_rows() {
    let rows: Vec<_> = (1..=25)
        .map(|i| json!({"id": i, "city": if i % 5 == 0 { json!(null) } else { json!(format!("city {i}")) }, "score": i as f64 / 4.0}))
        .collect();
    let e = Envelope::ok(json!(rows));
    let whole = render(&e, &RenderOptions::default());
    assert!(
        whole.contains("| 24 | city 24 | 6.0 |\n| 25 |  | 6.25 |") && !whole.contains("more"),
        "{whole}"
    );
    let long = "x".repeat(300);
    let wide = render(
        &Envelope::ok(json!([{"id": 1, "note": long}])),
        &RenderOptions::default(),
    );
    assert!(wide.contains(&long), "{wide}");
    insta::assert_snapshot!("ok_table", render(&e, &RenderOptions::preview()));
}

#[test]
fn ok_single_row_table() {
    check(
        "ok_one_row",
        &Envelope::ok(json!([{"name": "quiver", "stars": 5}])),
    );
}

#[test]
fn ok_object_has_an_inferred_schema_line() {
    check(
        "ok_object",
        &Envelope::ok(json!({"temperature": 21.5, "unit": "C", "station": null})),
    );
}

#[test]
fn ok_text() {
    check(
        "ok_text",
        &Envelope::text("The current time in Tokyo is 09:14."),
    );
}

#[test]
fn ok_long_text_is_shown_whole() {
    let text: String = (1..=205).map(|i| format!("line {i}\n")).collect();
    check("ok_long_text", &Envelope::text(text.trim_end()));
}

#[test]
fn ok_empty() {
    check("ok_null", &Envelope::ok(json!(null)));
}

/// Rows a table would not show as they are, or would show mostly as empty cells, are one
/// JSON object a line: sparse rows (each with a key of its own), a string with a newline or
/// a `|`, an empty string (which a table shows as null).
#[test]
fn rows_a_table_cannot_show_are_json_lines() {
    let sparse: Vec<_> = (0..50)
        .map(|i| {
            let mut o = serde_json::Map::new();
            o.insert("id".into(), json!(i));
            o.insert(format!("field_{i}"), json!("v"));
            Value::Object(o)
        })
        .collect();
    let text = render(&Envelope::ok(json!(sparse)), &RenderOptions::default());
    assert!(
        text.starts_with("✓ ok. 50 rows.\n- {\"id\":0,\"field_0\":\"v\"}")
            && !text.contains('|')
            && !text.contains("schema:"),
        "{text}"
    );
    for odd in [json!("two\nlines"), json!("a|b"), json!("")] {
        let rows = json!([{"id": 1, "note": odd}, {"id": 2, "note": "plain"}]);
        let text = render(&Envelope::ok(rows), &RenderOptions::default());
        assert!(
            text.contains(&format!("- {}", json!({"id": 1, "note": odd}))),
            "{text}"
        );
    }
    let dense = json!([{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]);
    let text = render(&Envelope::ok(dense), &RenderOptions::default());
    assert!(text.contains("| 2 | b |"), "{text}");
}

/// A list is shown whole to the model, and bounded in a preview for people.
#[test]
fn ok_list_without_columns_is_bounded_only_in_a_preview() {
    let items: Vec<_> = (0..30).collect();
    let e = Envelope::ok(json!(items));
    let whole = render(&e, &RenderOptions::default());
    assert!(
        whole.ends_with("- 28\n- 29") && whole.starts_with("✓ ok. 30 rows."),
        "{whole}"
    );
    insta::assert_snapshot!("ok_list", render(&e, &RenderOptions::preview()));
}

#[test]
fn warnings_render_inline() {
    let e = Envelope::ok(json!([{"a": 1}, {"a": 2}]))
        .with_warning(Warning::new("no_match", "2 of 5 ids were not found"))
        .with_warning(Warning::new(
            "policy",
            "call `preview_data` before `export`",
        ));
    check("ok_warnings", &e);
}

#[test]
fn parts_are_described_not_inlined() {
    let e = Envelope::text("Here is the chart.")
        .with_part(Part::image("image/png", "iVBORw0KGgo="))
        .with_part(Part::link("file:///tmp/r.csv", "r.csv", None));
    check("ok_parts", &e);
}

/// Text that came after an image (or with annotations of its own) is rendered in its place,
/// and a resource link says what it is when the tool said so.
#[test]
fn text_parts_keep_their_place_and_links_their_description() {
    let e = Envelope::text("Here is the chart.")
        .with_part(Part::image("image/png", "iVBORw0KGgo="))
        .with_part(Part::Text {
            text: "The chart above shows May.".into(),
            annotations: Some(json!({"audience": ["user"]})),
        })
        .with_part(Part::ResourceLink {
            uri: "file:///tmp/may.csv".into(),
            name: "may.csv".into(),
            mime_type: Some("text/csv".into()),
            title: Some("May".into()),
            description: Some("The data behind the chart".into()),
            size: Some(2048),
            annotations: None,
        });
    check("ok_text_parts_and_link_description", &e);
}

/// A part's description shows at most 300 characters of a name or URI: a megabyte-long
/// link name went whole into the text, past the result limit.
#[test]
fn a_long_link_name_is_cut_in_the_description() {
    let e = Envelope::text("Here.").with_part(Part::link(
        format!("file:///{}", "u".repeat(500_000)),
        "n".repeat(500_000),
        None,
    ));
    let text = render(&e, &RenderOptions::default());
    assert!(text.len() < 2_000, "{} characters", text.len());
    assert!(
        text.contains(&format!(
            "[resource link {}… (500000 characters): file:///",
            "n".repeat(300)
        )),
        "{text}"
    );
}

#[test]
fn schema_hint_ranks_alternatives() {
    let e = Envelope::hint(
        HintKind::Schema,
        "there is no column `nmae` in table `users`",
        vec![
            Alternative::new("name", 0.93),
            Alternative::new("email", 0.41),
        ],
    );
    check("hint_schema", &e);
}

#[test]
fn fetch_hint_has_add_and_narrow_lines() {
    let e = Envelope::hint(
        HintKind::Fetch,
        "this source returns 2.3M rows without a filter",
        vec![
            Alternative::new("date >= ...", 0.9)
                .with_action("add")
                .with_detail("the table is partitioned by date"),
            Alternative::new("limit", 0.5).with_action("add"),
            Alternative::new("columns", 0.4).with_action("narrow"),
        ],
    );
    check("hint_fetch", &e);
}

#[test]
fn ambiguous_lists_candidates() {
    let e = Envelope::hint(
        HintKind::Ambiguous,
        "`Springfield` matches 2 places",
        vec![
            Alternative::new("Springfield, IL", 0.51).with_detail("pop. 114k"),
            Alternative::new("Springfield, MO", 0.49).with_detail("pop. 169k"),
        ],
    );
    check("hint_ambiguous", &e);
}

#[test]
fn error_names_its_kind() {
    check(
        "err_timeout",
        &Envelope::err(
            ErrKind::Timeout,
            "`slow_tool` did not finish within its 30 s limit",
        ),
    );
    check("err_legacy", &coerce_legacy("connection refused", true));
}

#[test]
fn strip_status_line_only_strips_ok() {
    let ok = render(&Envelope::ok(json!({"a": 1})), &RenderOptions::default());
    assert!(ok.starts_with("✓ ok. 1 object."));
    let stripped = strip_status_line(&ok);
    assert!(!stripped.contains("✓ ok"));
    assert!(stripped.contains("\"a\": 1"));
    let text = render(&Envelope::text("payload"), &RenderOptions::default());
    assert_eq!(strip_status_line(&text), "payload");
    let err = render(
        &Envelope::err(ErrKind::Legacy, "boom"),
        &RenderOptions::default(),
    );
    assert_eq!(strip_status_line(&err), err);
    let hint = render(
        &Envelope::hint(HintKind::Fetch, "narrow it", vec![]),
        &RenderOptions::default(),
    );
    assert_eq!(strip_status_line(&hint), hint);
}

#[test]
fn effects_do_not_leak_into_the_render() {
    let mut effects = Effects::default();
    effects.cost_usd = 0.02;
    effects.cards.push(json!({"type": "chart"}));
    let e = Envelope::text("done").with_effects(effects);
    assert_eq!(render(&e, &RenderOptions::default()), "✓ ok.\ndone");
    assert_eq!(e.cost_usd(), 0.02);
}

/// One object or one value is a result, not a table: no "1 row".
#[test]
fn a_single_value_is_not_counted_in_rows() {
    let opts = RenderOptions::default();
    assert_eq!(render(&Envelope::ok(json!(42)), &opts), "✓ ok.\n42");
    assert_eq!(render(&Envelope::ok(json!(true)), &opts), "✓ ok.\ntrue");
    let object = render(&Envelope::ok(json!({"a": 1})), &opts);
    assert!(object.starts_with("✓ ok. 1 object.\n"), "{object}");
    // An object that only wraps text is read as that text.
    let wrapped = render(&Envelope::ok(json!({"content": "line 1\n\"two\""})), &opts);
    assert_eq!(wrapped, "✓ ok. content:\nline 1\n\"two\"");
    let list = render(&Envelope::ok(json!([1, 2])), &opts);
    assert!(list.starts_with("✓ ok. 2 rows.\n- 1\n- 2"), "{list}");
}
