use serde_json::json;

use super::*;

/// Texts over their budget, each with multi-byte characters where a cut could split one.
fn texts() -> Vec<(&'static str, String)> {
    vec![
        (
            "ascii lines",
            (0..2000)
                .map(|i| format!("line {i}: all is well\n"))
                .collect(),
        ),
        ("cyrillic, no line break", "жизнь ".repeat(3000)),
        ("emoji", "🦀🚀✨ ".repeat(2500)),
        ("cjk", "東京の天気は晴れです。".repeat(800)),
        ("one long word", "x".repeat(60_000)),
    ]
}

#[test]
fn a_text_within_its_budget_is_not_cut_and_not_tokenized_when_short() {
    let budget = Budget::new(1000, 100_000);
    assert!(cut_text("short", budget).is_none());
    // Fewer bytes than the budget's tokens: within it whatever the encoding.
    assert!(budget.fits(&"é".repeat(400)));
    assert!(!Budget::new(1000, 100).fits(&"a".repeat(101)));
}

#[test]
fn a_cut_keeps_head_and_tail_within_budget_on_character_boundaries() {
    let budget = Budget::new(2000, 100_000);
    for (what, text) in texts() {
        let cut = cut_text(&text, budget).unwrap_or_else(|| panic!("{what}: over budget"));
        assert!(text.is_char_boundary(cut.head), "{what}");
        assert!(text.is_char_boundary(cut.tail), "{what}");
        assert!(cut.head < cut.tail, "{what}: something is left out");
        let shown = size_of(&text[..cut.head]).tokens + size_of(&text[cut.tail..]).tokens;
        assert!(shown <= budget.tokens, "{what}: {shown} tokens shown");
        assert!(
            shown > budget.tokens / 2,
            "{what}: only {shown} tokens shown"
        );
        assert_eq!(cut.size.tokens, count_tokens(&text), "{what}");
        assert_eq!(cut.omitted, size_of(&text[cut.head..cut.tail]), "{what}");
    }
}

#[test]
fn text_pages_cover_the_text_in_order_each_within_budget() {
    let budget = Budget::new(1500, 5_000);
    for (what, text) in texts() {
        let cut = cut_text(&text, budget).unwrap();
        assert_eq!(cut.pages[0], 0..cut.head, "{what}: page 1 is the head");
        let mut at = 0;
        for page in &cut.pages {
            assert_eq!(page.start, at, "{what}: pages are contiguous");
            assert!(page.end > page.start, "{what}: no empty page");
            assert!(text.is_char_boundary(page.end), "{what}");
            assert!(
                budget.fits(&text[page.clone()]),
                "{what}: page {page:?} over budget"
            );
            at = page.end;
        }
        assert_eq!(at, text.len(), "{what}: the pages end where the text does");
    }
}

#[test]
fn a_character_budget_cuts_too() {
    let text = "a b ".repeat(1000);
    let cut = cut_text(&text, Budget::new(100_000, 400)).expect("over 400 characters");
    assert!(text[..cut.head].chars().count() + text[cut.tail..].chars().count() <= 400);
}

/// Structured data over its budget: where its items are, and how many.
fn values() -> Vec<(&'static str, Value, Option<&'static str>, usize)> {
    let rows: Vec<Value> = (0..300)
        .map(|i| json!({"id": i, "name": format!("row {i}"), "tags": ["a", "b"]}))
        .collect();
    let entries: serde_json::Map<String, Value> = (0..300)
        .map(|i| {
            (
                format!("key{i:03}"),
                json!({"value": i, "note": "an entry of the map"}),
            )
        })
        .collect();
    vec![
        ("a top-level array", Value::Array(rows.clone()), None, 300),
        (
            "an object with a large array",
            json!({"total": 300, "next": null, "rows": rows, "small": [1, 2]}),
            Some("rows"),
            300,
        ),
        (
            "an object of entries",
            Value::Object(entries),
            Some(""),
            300,
        ),
    ]
}

#[test]
fn structured_data_is_paged_by_whole_items_each_page_within_budget() {
    let budget = Budget::new(1000, 100_000);
    for (what, value, within, items) in values() {
        let pages = page_json(&value, budget).unwrap_or_else(|| panic!("{what}: not paged"));
        assert_eq!(pages.within.as_deref(), within, "{what}");
        assert_eq!(pages.items, items, "{what}");
        assert!(pages.pages.len() > 1, "{what}");
        let mut at = 0;
        for (n, range) in pages.pages.iter().enumerate() {
            assert_eq!(range.start, at, "{what}: pages are contiguous");
            let page = pages.page(&value, n).unwrap();
            let text = serde_json::to_string_pretty(&page).unwrap();
            assert!(budget.fits(&text), "{what}: page {n} over budget");
            at = range.end;
        }
        assert_eq!(at, items, "{what}: every item is on a page");
    }
    // The other fields of an object are on every page.
    let (_, value, _, _) = &values()[1];
    let pages = page_json(value, budget).unwrap();
    let last = pages.page(value, pages.pages.len() - 1).unwrap();
    assert_eq!(last["total"], 300);
    assert!(last["small"].is_array());
}

#[test]
fn data_that_fits_or_cannot_be_paged_by_items_is_not_paged() {
    let budget = Budget::new(1000, 100_000);
    assert!(page_json(&json!([1, 2, 3]), budget).is_none(), "it fits");
    let one_big = json!([{"text": "word ".repeat(5000)}, {"text": "small"}]);
    assert!(
        page_json(&one_big, budget).is_none(),
        "one item is over the budget alone"
    );
    assert!(page_json(&json!({"text": "word ".repeat(5000)}), budget).is_none());
}

#[test]
fn thousands_are_separated() {
    for (n, s) in [
        (0, "0"),
        (999, "999"),
        (1000, "1,000"),
        (1234567, "1,234,567"),
    ] {
        assert_eq!(thousands(n), s);
    }
}
