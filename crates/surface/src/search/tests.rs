use std::path::PathBuf;
use std::sync::Arc;

use quiver_contract::ToolSpec;
use serde_json::json;

use super::eval::{baseline, evaluate_ranker, parse_tools};
use super::*;

fn index(specs: &[ToolSpec]) -> SearchIndex {
    let mut ix = SearchIndex::new();
    for s in specs {
        ix.upsert(s);
    }
    ix
}

fn names(hits: &[SearchHit]) -> Vec<&str> {
    hits.iter().map(|h| h.name.as_str()).collect()
}

fn all(_: &str) -> bool {
    true
}

#[test]
fn a_query_prefix_finds_the_tool() {
    let ix = index(&[
        ToolSpec::new("webfetch", "Downloads a page."),
        ToolSpec::new("websearch_x", "Queries an engine."),
        ToolSpec::new("read_file", "Reads a file."),
    ]);
    let hits = ix.search("webf", 5, &all);
    assert_eq!(names(&hits), ["webfetch"]);
    // An exact term outranks a prefix match.
    let ix = index(&[
        ToolSpec::new("get_stock", "Stock quotes."),
        ToolSpec::new("get_stockpile", "Inventory."),
    ]);
    assert_eq!(names(&ix.search("stock", 5, &all))[0], "get_stock");
}

/// A word typed past its stem still finds the tool: the index holds stems (`creat`,
/// `geocod`, `repository`), and a prefix of "creating" or "repositories" does not start
/// with them.
#[test]
fn a_prefix_typed_past_the_stem_finds_the_tool() {
    let ix = index(&[
        ToolSpec::new("create_directory", "Makes a folder."),
        ToolSpec::new("geocode", "Turns an address into coordinates."),
        ToolSpec::new("list_repositories", "Lists code hosting projects."),
        ToolSpec::new("other", "Something else."),
    ]);
    for (typed, tool) in [
        ("creat", "create_directory"),
        ("creati", "create_directory"),
        ("creatin", "create_directory"),
        ("directori", "create_directory"),
        ("geocodi", "geocode"),
        ("geocoding", "geocode"),
        ("reposito", "list_repositories"),
        ("repositori", "list_repositories"),
        ("repositorie", "list_repositories"),
    ] {
        let hits = ix.search(typed, 5, &all);
        assert_eq!(names(&hits).first(), Some(&tool), "`{typed}`: {hits:?}");
    }
    assert!(ix.search("creatures", 5, &all).is_empty());
}

/// A request in one word of the generic tool vocabulary finds the tool named with another:
/// `folder` and `directory` (and `dir`), `save` and `write`, `repo` and `repository`.
#[test]
fn related_tool_vocabulary_finds_the_tool() {
    let files = index(&[
        ToolSpec::new("list_directory", "Lists entries."),
        ToolSpec::new("write_note", "Keeps text."),
        ToolSpec::new("list_repositories", "Lists code hosting projects."),
        ToolSpec::new("list_users", "Lists accounts."),
    ]);
    let shares = index(&[
        ToolSpec::new("folder_share", "Shares with a team."),
        ToolSpec::new("share_link", "Shares a link."),
    ]);
    for (ix, query, tool) in [
        (&files, "what is in my music folder", "list_directory"),
        (&files, "the dir", "list_directory"),
        (&shares, "share a directory", "folder_share"),
        (&files, "save my text", "write_note"),
        (&files, "my repos", "list_repositories"),
    ] {
        let hits = ix.search(query, 5, &all);
        assert_eq!(names(&hits).first(), Some(&tool), "`{query}`: {hits:?}");
    }
}

#[test]
fn identifiers_are_split_and_names_outrank_descriptions() {
    let ix = index(&[
        ToolSpec::new("getStockPrice", "Quotes for a ticker."),
        ToolSpec::new("list_orders", "Lists orders, with their stock and price."),
        ToolSpec::new("mcp__files__read-file.v2", "Opens documents."),
    ]);
    assert_eq!(
        names(&ix.search("stock price", 5, &all))[0],
        "getStockPrice"
    );
    assert_eq!(
        names(&ix.search("read file", 5, &all))[0],
        "mcp__files__read-file.v2"
    );
    // The server of an MCP name counts.
    assert_eq!(
        names(&ix.search("files", 5, &all)),
        ["mcp__files__read-file.v2"]
    );
}

#[test]
fn stop_words_and_punctuation_are_not_meaningful() {
    for q in ["", "   ", "the of and to", "?!... --", "what is it?"] {
        assert!(!is_meaningful_query(q), "{q:?}");
        assert!(query_terms(q).is_empty());
    }
    assert!(is_meaningful_query("the weather"));
    assert_eq!(query_terms("Searching the searches"), ["search"]);
    let ix = index(&[ToolSpec::new("the_tool", "It is the one.")]);
    assert!(ix.search("the of", 5, &all).is_empty());
}

#[test]
fn cjk_text_is_searchable() {
    let ix = index(&[
        ToolSpec::new(
            "bing_search",
            "使用必应搜索指定的关键词，并返回搜索结果列表",
        ),
        ToolSpec::new("fetch_webpage", "根据提供的ID获取对应网页的内容"),
        ToolSpec::new("weather", "Current weather for a city."),
    ]);
    assert_eq!(names(&ix.search("搜索关键词", 5, &all))[0], "bing_search");
    assert_eq!(
        names(&ix.search("获取网页内容", 5, &all))[0],
        "fetch_webpage"
    );
}

#[test]
fn thai_text_is_searchable() {
    // Thai writes no spaces between words: a query word meets the same word inside a
    // description's longer run.
    let ix = index(&[
        ToolSpec::new("web_search", "เครื่องมือค้นหาเว็บไซต์บนอินเทอร์เน็ต"),
        ToolSpec::new("read_file", "อ่านไฟล์จากดิสก์แล้วส่งเนื้อหากลับมา"),
        ToolSpec::new("weather", "Current weather for a city."),
    ]);
    assert_eq!(names(&ix.search("ค้นหาเว็บ", 5, &all))[0], "web_search");
    assert_eq!(names(&ix.search("อ่านไฟล์", 5, &all))[0], "read_file");
    // A whole sentence without a space is text, not a pasted blob.
    let q = "ช่วยค้นหาเว็บไซต์ที่เกี่ยวกับการท่องเที่ยวในเชียงใหม่และสรุปข้อมูลที่สำคัญให้ฉันหน่อยนะครับขอบคุณมาก";
    assert!(q.len() > 200);
    assert!(is_meaningful_query(q));
    assert_eq!(names(&ix.search(q, 5, &all))[0], "web_search");
}

#[test]
fn ties_break_by_name() {
    let ix = index(&[
        ToolSpec::new("zeta", "Converts units."),
        ToolSpec::new("alpha", "Converts units."),
        ToolSpec::new("mid", "Converts units."),
    ]);
    let hits = ix.search("converts units", 5, &all);
    assert_eq!(names(&hits), ["alpha", "mid", "zeta"]);
    assert!(hits.windows(2).all(|w| w[0].score == w[1].score));
    assert!(hits.iter().all(|h| h.score > 0.0 && h.score <= 1.0));
    // Diversification may move a tool up to the score above it: tools of equal score are
    // still listed by name.
    let ix = index(&[
        ToolSpec::new("a", "alpha"),
        ToolSpec::new("b", "alpha"),
        ToolSpec::new("c", "beta"),
        ToolSpec::new("z", "beta"),
    ]);
    let hits = ix.search("alpha beta", 5, &all);
    for w in hits.windows(2) {
        assert!(
            w[0].score > w[1].score || (w[0].score == w[1].score && w[0].name < w[1].name),
            "{hits:?}"
        );
    }
}

/// Identical tools rank the same however they were indexed: in either order, and after
/// removals and re-adds that reuse document ids.
#[test]
fn the_ranking_does_not_depend_on_indexing_order() {
    // Server tools with a schema link (the lookup names what the senders require), so the
    // feedback and the links both see ties.
    let mut specs: Vec<ToolSpec> = ["q", "b", "x", "a", "m", "c"]
        .iter()
        .map(|p| {
            ToolSpec::new(
                format!("mcp__mail__{p}_send_mail"),
                "Sends an email message.",
            )
            .with_schema(json!({
                "type": "object",
                "required": ["recipient"],
                "properties": {"recipient": {"type": "string"}}
            }))
        })
        .collect();
    specs.push(ToolSpec::new(
        "mcp__mail__lookup",
        "Finds the recipient address of a person.",
    ));
    let rank = |ix: &SearchIndex| {
        ix.search("send email", 10, &all)
            .into_iter()
            .map(|h| (h.name, (h.score * 1e9).round()))
            .collect::<Vec<_>>()
    };
    let forward = index(&specs);
    let mut reversed_specs = specs.clone();
    reversed_specs.reverse();
    let reversed = index(&reversed_specs);
    let mut churned = index(&specs);
    for s in &specs[..3] {
        churned.remove(&s.name);
    }
    churned.upsert(&ToolSpec::new("zz_other", "Reads the weather."));
    for s in specs[..3].iter().rev() {
        churned.upsert(s);
    }
    churned.remove("zz_other");
    let want = rank(&forward);
    assert_eq!(want.len(), specs.len());
    assert_eq!(rank(&reversed), want);
    assert_eq!(rank(&churned), want);
    let names: Vec<&str> = want
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.ends_with("send_mail"))
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "equal tools in name order");
}

/// Composed and decomposed accents, and full-width letters, are one spelling.
#[test]
fn unicode_forms_meet() {
    let ix = index(&[
        ToolSpec::new("cv_tool", "Parses a re\u{301}sume\u{301} into fields."),
        ToolSpec::new("sheet", "Reads a CSV sheet."),
    ]);
    assert_eq!(names(&ix.search("r\u{e9}sum\u{e9}", 5, &all)), ["cv_tool"]);
    assert_eq!(names(&ix.search("ＣＳＶ", 5, &all)), ["sheet"]);
}

/// A long CJK sentence has no spaces: it is text, not a pasted blob.
#[test]
fn a_long_cjk_sentence_is_a_query() {
    let q = "请帮我查询一下北京市明天上午和下午的天气情况以及气温变化然后根据这些天气情况给我的朋友发送一封电子邮件告诉他明天出门要不要带伞谢谢你的帮助";
    assert!(q.len() > 200);
    assert!(is_meaningful_query(q));
    let ix = index(&[
        ToolSpec::new("weather", "查询城市的天气情况和气温"),
        ToolSpec::new("units", "Converts units."),
    ]);
    assert_eq!(names(&ix.search(q, 5, &all))[0], "weather");
    // Cut at the term cap, a run of more distinct characters than the cap keeps bigrams
    // too, not only single characters.
    let run: String = (0x4E00u32..0x4E00 + 80)
        .filter_map(char::from_u32)
        .collect();
    let terms = query_terms(&run);
    assert!(terms.iter().any(|t| t.chars().count() == 2), "{terms:?}");
    // A blob of the same length is still not one.
    assert!(!is_meaningful_query(&"QUJD".repeat(60)));
}

/// A huge query costs about what its first kilobytes cost: only they are read.
#[test]
fn a_huge_query_is_read_only_in_part() {
    let ix = index(&[ToolSpec::new("send_slack", "Sends a Slack message.")]);
    let mut q = String::from("slack");
    for i in 0..200_000 {
        q.push_str(if i % 2 == 0 { " /1a" } else { " 3q" });
    }
    let hits = ix.search(&q, 5, &all);
    assert_eq!(names(&hits), ["send_slack"]);
    assert_eq!(query_terms(&q), query_terms(&q[..8 * 1024]));
}

#[test]
fn the_filter_applies_before_the_limit() {
    let specs: Vec<ToolSpec> = (0..20)
        .map(|i| ToolSpec::new(format!("report_{i:02}"), "Builds a report."))
        .collect();
    let ix = index(&specs);
    let hits = ix.search("report", 3, &|n: &str| n.ends_with('7') || n.ends_with('9'));
    assert_eq!(names(&hits), ["report_07", "report_09", "report_17"]);
    assert!(ix.search("report", 3, &|_: &str| false).is_empty());
}

#[test]
fn remove_and_upsert_keep_the_index_consistent() {
    let mut ix = index(&[
        ToolSpec::new("geocode", "Turns an address into coordinates."),
        ToolSpec::new("route", "Directions between two places."),
    ]);
    assert_eq!(ix.len(), 2);
    assert!(ix.remove("geocode"));
    assert!(!ix.remove("geocode"));
    assert_eq!(ix.len(), 1);
    assert!(ix.search("address coordinates", 5, &all).is_empty());

    // Replacing a tool drops its old terms.
    ix.upsert(&ToolSpec::new("route", "Driving directions."));
    ix.upsert(&ToolSpec::new("route", "Sails a boat."));
    assert_eq!(ix.len(), 1);
    assert!(ix.search("driving", 5, &all).is_empty());
    assert_eq!(names(&ix.search("boat", 5, &all)), ["route"]);
    // Freed slots are reused and the statistics stay right.
    ix.upsert(&ToolSpec::new(
        "geocode",
        "Turns an address into coordinates.",
    ));
    assert_eq!(names(&ix.search("address", 5, &all)), ["geocode"]);
    assert!(ix.remove("route") && ix.remove("geocode"));
    assert!(ix.is_empty() && ix.dict.is_empty() && ix.total_len == [0; FIELDS]);
}

#[test]
fn schema_properties_count() {
    let ix = index(&[
        ToolSpec::new("lookup", "Looks things up.").with_schema(json!({
            "type": "object",
            "properties": {"ticker_symbol": {"type": "string", "description": "Exchange code"}}
        })),
        ToolSpec::new("other", "Something else."),
    ]);
    assert_eq!(names(&ix.search("ticker", 5, &all)), ["lookup"]);
    assert_eq!(names(&ix.search("exchange", 5, &all)), ["lookup"]);
}

/// Pseudo-relevance feedback takes its terms from tools that match a query term: tools
/// found only by their server's name feed nothing back (the first three by name lifted
/// themselves above their siblings with their own names' terms).
#[test]
fn tools_found_by_their_server_name_alone_feed_nothing_back() {
    let ix = index(&[
        ToolSpec::new("mcp__srv__alpha_list", "Lists things."),
        ToolSpec::new("mcp__srv__beta_fetch", "Fetches pages."),
        ToolSpec::new("mcp__srv__gamma_ping", "Checks a host."),
        ToolSpec::new("mcp__srv__delta_read", "Reads files."),
        ToolSpec::new("mcp__other__zeta", "Something else."),
    ]);
    let hits = ix.search("srv", 10, &all);
    assert_eq!(hits.len(), 4, "{hits:?}");
    let first = hits[0].score;
    assert!(hits.iter().all(|h| h.score == first), "{hits:?}");
}

/// A long word of a script with multi-byte letters is a search word like a Latin one of
/// the same length (the limit counts characters).
#[test]
fn a_long_non_latin_word_is_a_search_word() {
    let ix = index(&[
        ToolSpec::new("sights", "Lists достопримечательности of a city."),
        ToolSpec::new("other", "Something else."),
    ]);
    assert_eq!(
        names(&ix.search("достопримечательности", 5, &all)),
        ["sights"]
    );
}

/// Zero-width joiners and non-joiners inside a word do not split it.
#[test]
fn invisible_joiners_do_not_split_words() {
    let ix = index(&[
        ToolSpec::new(
            "persian",
            "Translates \u{0645}\u{06CC}\u{200C}\u{062E}\u{0648}\u{0627}\u{0647}\u{0645} text.",
        ),
        ToolSpec::new("other", "Something else."),
    ]);
    let joined = "\u{0645}\u{06CC}\u{062E}\u{0648}\u{0627}\u{0647}\u{0645}";
    assert_eq!(names(&ix.search(joined, 5, &all)), ["persian"]);
    let ix = index(&[ToolSpec::new("word", "A zero\u{200D}width joined word.")]);
    assert_eq!(names(&ix.search("zerowidth", 5, &all)), ["word"]);
}

/// Only the first 32 KiB of a schema's text is indexed: a property far past it is not
/// found (a 100k-property schema made every search that ranked its tool take a second).
#[test]
fn a_huge_schema_is_indexed_only_in_part() {
    let mut props = serde_json::Map::new();
    props.insert("aardvark".into(), json!({"type": "string"}));
    for i in 0..20_000 {
        props.insert(format!("filler{i:05}"), json!({"type": "string"}));
    }
    props.insert("zebra".into(), json!({"type": "string"}));
    let ix = index(&[
        ToolSpec::new("big", "A tool with a huge schema.")
            .with_schema(json!({"type": "object", "properties": props})),
        ToolSpec::new("other", "Something else."),
    ]);
    assert_eq!(names(&ix.search("aardvark", 5, &all)), ["big"]);
    assert!(ix.search("zebra", 5, &all).is_empty());
}

/// Nested models behind a local `$ref` (pydantic's `$defs`, as FastMCP servers send them)
/// are indexed like inline ones; a reference cycle ends at the depth limit.
#[test]
fn schema_refs_are_followed() {
    let ix = index(&[
        ToolSpec::new("book", "Makes a booking.").with_schema(json!({
            "type": "object",
            "properties": {"trip": {"$ref": "#/$defs/Trip"}},
            "$defs": {
                "Trip": {"type": "object", "properties": {
                    "itinerary": {"type": "string", "description": "Stops along the route"},
                    "next": {"$ref": "#/$defs/Trip"}
                }}
            }
        })),
        ToolSpec::new("other", "Something else."),
    ]);
    assert_eq!(names(&ix.search("itinerary", 5, &all)), ["book"]);
    assert_eq!(names(&ix.search("route stops", 5, &all)), ["book"]);
}

/// A small schema whose many branches all refer back to the root is read only up to a
/// node count (without one, 200 such branches made a billion-step fan-out of indexing).
#[test]
fn a_schema_fanning_out_through_refs_is_read_in_part() {
    let branches: Vec<Value> = (0..200).map(|_| json!({"$ref": "#"})).collect();
    let schema =
        json!({"type": "object", "properties": {"needle": {"type": "string"}}, "anyOf": branches});
    let mut text = String::new();
    schema_text(&schema, 0, &mut text);
    // Every visit of the root appends `needle`: bounded by the node count.
    let visits = text.matches("needle").count();
    assert!((1..=MAX_SCHEMA_NODES).contains(&visits), "{visits}");

    let ix = index(&[ToolSpec::new("fan", "Fans out.").with_schema(schema)]);
    assert_eq!(names(&ix.search("needle", 5, &all)), ["fan"]);
}

#[test]
fn schema_links_lift_the_producer_of_a_needed_input_below_the_head() {
    let lat_lon = json!({
        "type": "object",
        "properties": {"latitude": {"type": "number"}, "longitude": {"type": "number"}},
        "required": ["latitude", "longitude"]
    });
    let specs = [
        ToolSpec::new("mcp__maps__nearby_places", "Finds places near a point.")
            .with_schema(lat_lon.clone()),
        // Names what `nearby_places` requires and does not take it: linked.
        ToolSpec::new(
            "mcp__maps__geocode",
            "Turns an address into its latitude and longitude.",
        )
        .with_schema(json!({
            "type": "object",
            "properties": {"address": {"type": "string"}},
            "required": ["address"]
        })),
        // Takes the same inputs, names none: not linked.
        ToolSpec::new("mcp__maps__elevation", "Height above sea level.").with_schema(lat_lon),
    ];
    let ranked_for = |params: Params, filter: &dyn Fn(&str) -> bool| {
        let mut ix = SearchIndex::with_params(params);
        for s in &specs {
            ix.upsert(s);
        }
        names(&ix.search("places nearby", 5, filter))
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let ranked = |params: Params| ranked_for(params, &all);
    // Feedback off: the feedback terms of `nearby_places` would reach `geocode` too.
    let head_of_one = Params {
        link_head: 1,
        fb_weight: 0.0,
        ..Params::default()
    };
    // Without links the two siblings tie on the server's share and go by name.
    let unlinked = ranked(Params {
        link_share: 0.0,
        ..head_of_one.clone()
    });
    assert_eq!(
        unlinked,
        [
            "mcp__maps__nearby_places",
            "mcp__maps__elevation",
            "mcp__maps__geocode"
        ]
    );
    let linked = ranked(head_of_one.clone());
    assert_eq!(
        linked,
        [
            "mcp__maps__nearby_places",
            "mcp__maps__geocode",
            "mcp__maps__elevation"
        ]
    );
    // However large the share, a lent score does not lift a tool into the head.
    let strong = ranked(Params {
        link_share: 100.0,
        ..head_of_one.clone()
    });
    assert_eq!(strong[0], "mcp__maps__nearby_places");
    // A caller who cannot see `nearby_places` gets nothing of its score: neither its
    // server's share nor a link's reaches the siblings it sees, which match no word of the
    // query, so it finds nothing (it found them, telling it that a hidden tool matched).
    let hidden = |n: &str| n != "mcp__maps__nearby_places";
    assert_eq!(ranked_for(head_of_one, &hidden), Vec::<String>::new());
}

/// A capability the request implies without naming it completes the ranking: the tool
/// named for it comes right after what the request names, never before it, and only a tool
/// named for the capability provides it (one that merely takes an `address` does not).
#[test]
fn an_implied_capability_completes_the_ranking_below_the_head() {
    let address = json!({
        "type": "object",
        "properties": {"address": {"type": "string", "description": "Postal address."}},
        "required": ["address"]
    });
    let specs = [
        ToolSpec::new("mcp__stay__search_homestays", "Finds homestays for a stay."),
        ToolSpec::new("mcp__maps__geocode", "Turns a place name into coordinates."),
        ToolSpec::new("mcp__mail__send_letter", "Posts a letter.").with_schema(address),
        ToolSpec::new("mcp__calc__calculate", "Evaluates a math expression."),
        ToolSpec::new("mcp__web__navigate", "Opens a web page in the browser."),
    ];
    let ranked = |params: Params, query: &str| {
        let mut ix = SearchIndex::with_params(params);
        for s in &specs {
            ix.upsert(s);
        }
        names(&ix.search(query, 5, &all))
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let on = Params {
        fb_weight: 0.0,
        ..Params::default()
    };
    let off = Params {
        implied_weight: 0.0,
        ..on.clone()
    };
    let query = "Find homestays in Paris for a three night stay";
    assert_eq!(ranked(off.clone(), query), ["mcp__stay__search_homestays"]);
    assert_eq!(
        ranked(on.clone(), query),
        ["mcp__stay__search_homestays", "mcp__maps__geocode"]
    );
    // However large the share, the implied tool does not head the list.
    let strong = Params {
        implied_weight: 100.0,
        ..on.clone()
    };
    assert_eq!(ranked(strong, query)[0], "mcp__stay__search_homestays");
    // Each capability by its own cue.
    let query = "I have 9.5g of gold homestays, estimate their worth";
    assert_eq!(ranked(on.clone(), query)[1], "mcp__calc__calculate");
    let query = "homestays: which ones can I buy";
    assert_eq!(ranked(on.clone(), query)[1], "mcp__web__navigate");
    // No cue, nothing implied.
    let query = "find homestays for a stay";
    assert_eq!(ranked(on, query), ["mcp__stay__search_homestays"]);
}

#[test]
fn implied_needs_are_recognised_by_what_a_request_mentions() {
    let kinds = |q: &str| {
        tokenize::implied_needs(q)
            .iter()
            .map(|n| n.kind)
            .collect::<Vec<_>>()
    };
    for (query, expect) in [
        (
            "Plan a trip to the Forbidden City in Beijing",
            &["place"][..],
        ),
        ("trains from Beijing to Tianjin", &["place"]),
        ("Find homestays near the Louvre, please", &["place"]),
        // A format, a brand in capitals or mixed case, the first word: no place.
        ("Save it in PDF", &[]),
        ("Push the branch to GitHub", &[]),
        ("Paris hotels", &[]),
        ("Please estimate its value", &["amount to work out"]),
        ("Compute the total", &["amount to work out"]),
        ("I want to buy a monitor", &["goods to buy"]),
        (
            "Estimate what I'd pay to buy a flat in Rome",
            &["place", "amount to work out", "goods to buy"],
        ),
        ("What is the weather tomorrow", &[]),
        (
            "Save the summary to /root/markdown/notes.md",
            &["text file to write"],
        ),
        (
            "Write a quick tutorial in ./docs/intro.md.",
            &["text file to write"],
        ),
        (
            "Generate the script at ~/bin/sync.py",
            &["text file to write"],
        ),
        // A file read, not written; no verb of producing; not a text format.
        ("Get line 10 of /root/txt/Android.txt", &[]),
        (
            "Read the data in /root/csv/customers.csv and tell me the email",
            &[],
        ),
        ("Save the chart in /root/figs/sales.png", &[]),
        // The verb must be the request's, before the path, in the same sentence.
        ("What is line 3 in /root/output/result.txt", &[]),
        ("Count the rows in /root/csv/make_list.csv", &[]),
        ("Write nothing. Show line 3 in /root/notes.md", &[]),
    ] {
        assert_eq!(kinds(query), expect, "{query}");
    }
}

/// The shared benchmark directory, beside the clone. Its absence is a failure, not a skip.
fn bench_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/bench/toolsearch/livemcpbench");
    assert!(
        dir.join("tools.jsonl").is_file() && dir.join("queries.jsonl").is_file(),
        "benchmark set missing at {}",
        dir.display()
    );
    dir
}

fn bench_files() -> (String, String) {
    let dir = bench_dir();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("readable bench file");
    (read("tools.jsonl"), read("queries.jsonl"))
}

#[test]
fn plain_bm25_reproduces_the_published_baseline() {
    let (tools, queries) = bench_files();
    let bm25 = baseline::Bm25::new(&parse_tools(&tools).unwrap());
    let report = evaluate_ranker(&queries, |q| bm25.rank(q)).unwrap();
    println!("plain BM25: {}", serde_json::to_string(&report).unwrap());
    assert_eq!(report.queries, 94);
}

/// A benchmark set that cannot be scored as written is an error naming what is wrong, not
/// a score: a needed tool that is not in the tool set, a tool given twice.
#[test]
fn a_broken_benchmark_set_is_refused() {
    let tools = r#"{"name": "a__read_csv", "description": "Reads a CSV file."}"#;
    let typo = r#"{"query": "read a csv", "gold": [["a__read_cvs"]]}"#;
    let err = evaluate(tools, typo).unwrap_err();
    assert!(
        err.contains("a__read_cvs") && err.contains("is in the tool set"),
        "{err}"
    );
    let fine = r#"{"query": "read a csv", "gold": [["a__read_cvs", "a__read_csv"]]}"#;
    assert_eq!(evaluate(tools, fine).unwrap().hit_at_1, 100.0);
    let twice = format!("{tools}\n{tools}");
    let err = evaluate(&twice, fine).unwrap_err();
    assert!(
        err.contains("line 2") && err.contains("given again"),
        "{err}"
    );
}

#[test]
fn livemcpbench_quality() {
    let (tools, queries) = bench_files();
    let report = evaluate(&tools, &queries).unwrap();
    println!("index: {}", serde_json::to_string(&report).unwrap());
    assert_eq!(report.queries, 94);
    // The issue's goal: plain BM25 (35.1 / 37.6 / 36.9 on this set) beaten by at least
    // +10 hit@1, +15 recall@5 and +12 nDCG@10. The ranking is deterministic, so a change
    // that loses the goal fails here.
    assert!(report.hit_at_1 >= 35.1 + 10.0, "{report:?}");
    assert!(report.recall_at_5 >= 37.6 + 15.0, "{report:?}");
    assert!(report.recall_at_10 > 44.3, "{report:?}");
    assert!(report.ndcg_at_10 >= 36.9 + 12.0, "{report:?}");
}

fn hybrid(specs: &[ToolSpec], config: HybridConfig) -> SearchIndex {
    let mut ix = SearchIndex::with_embedder(Arc::new(HashedNgrams::default()), config);
    let refs: Vec<&ToolSpec> = specs.iter().collect();
    ix.upsert_all(&refs);
    assert_eq!(ix.vectors_ready(), 0, "tools wait for their vectors");
    ix.embed_pending();
    assert_eq!(ix.vectors_ready(), specs.len());
    ix
}

#[test]
fn hashed_ngrams_are_deterministic_and_follow_spelling() {
    let e = HashedNgrams::default();
    let v = e
        .embed(&["geocoding", "geocoding", "geocoder", "weather"])
        .unwrap();
    assert_eq!(v[0], v[1]);
    assert_eq!(v[0].len(), 256);
    let unit = |x: &[f32]| embed::normalised(x).unwrap();
    let (a, b, c) = (unit(&v[0]), unit(&v[2]), unit(&v[3]));
    assert!(embed::cosine(&a, &b) > 0.5, "{}", embed::cosine(&a, &b));
    assert!(embed::cosine(&a, &b) > embed::cosine(&a, &c) + 0.3);
    assert!(e.embed(&[""]).unwrap()[0].iter().all(|x| *x == 0.0));
}

#[test]
fn a_vector_retriever_finds_a_misspelt_tool_the_lexical_index_misses() {
    let specs = [
        ToolSpec::new("thermometer_read", "Reads the room thermometer."),
        ToolSpec::new("weather_now", "Current weather for a city."),
        ToolSpec::new("stock_quote", "Latest stock quote."),
    ];
    assert!(index(&specs).search("thermomiter", 5, &all).is_empty());
    let ix = hybrid(&specs, HybridConfig::default());
    assert!(ix.has_embedder() && !index(&specs).has_embedder());
    let hits = ix.search("thermomiter", 5, &all);
    assert_eq!(names(&hits)[0], "thermometer_read");
    assert!(hits.iter().all(|h| h.score > 0.0 && h.score <= 1.0));
    // The filter applies to the vector ranking too.
    let hits = ix.search("thermomiter", 5, &|n: &str| n != "thermometer_read");
    assert!(!names(&hits).contains(&"thermometer_read"));
    // A meaningless query is still empty (tool_search answers it with a hint).
    assert!(ix.search("the of", 5, &all).is_empty());
}

#[test]
fn the_vector_weight_moves_the_spelling_neighbour_up() {
    let specs = [
        ToolSpec::new(
            "daily_digest",
            "A long digest of news, sports, markets, culture and the weather, with an outlook \
             for the week and a forecast of events.",
        ),
        ToolSpec::new("weatherforecaster", "Predicts tomorrow's conditions."),
        ToolSpec::new("stock_quote", "Latest stock quote."),
    ];
    let q = "weather forecast";
    let lexical = names(&index(&specs).search(q, 5, &all)).join(",");
    assert!(lexical.starts_with("daily_digest,"), "{lexical}");
    // Weight 0 is the lexical ranking.
    let off = hybrid(
        &specs,
        HybridConfig {
            short_weight: 0.0,
            long_weight: 0.0,
            ..HybridConfig::default()
        },
    );
    assert_eq!(names(&off.search(q, 5, &all)).join(","), lexical);
    // A heavy vector weight puts the tool whose name spells the query first.
    let heavy = hybrid(
        &specs,
        HybridConfig {
            short_weight: 1.0,
            ..HybridConfig::default()
        },
    );
    assert_eq!(names(&heavy.search(q, 5, &all))[0], "weatherforecaster");
}

/// An embedder that always fails: the index must fall back to the lexical ranking.
#[derive(Debug)]
struct Broken;

impl Embedder for Broken {
    fn embed(&self, _: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Err(EmbedError("model not loaded".into()))
    }

    fn model_id(&self) -> &str {
        "broken"
    }
}

#[test]
fn a_failing_embedder_degrades_to_the_lexical_ranking() {
    let specs = [
        ToolSpec::new("geocode", "Turns an address into coordinates."),
        ToolSpec::new("route", "Directions between two places."),
    ];
    let mut ix = SearchIndex::with_embedder(Arc::new(Broken), HybridConfig::default());
    for s in &specs {
        ix.upsert(s);
    }
    assert_eq!(
        names(&ix.search("address coordinates", 5, &all)),
        names(&index(&specs).search("address coordinates", 5, &all))
    );
    // Removing and re-adding keeps the vectors in step with the documents.
    let mut ix = hybrid(&specs, HybridConfig::default());
    assert!(ix.remove("geocode"));
    assert!(!names(&ix.search("geocod", 5, &all)).contains(&"geocode"));
    ix.upsert(&specs[0]);
    ix.embed_pending();
    assert_eq!(names(&ix.search("geocod", 5, &all))[0], "geocode");
}

#[test]
fn nonsense_blend_settings_are_made_safe() {
    let specs = [
        ToolSpec::new("thermometer_read", "Reads the room thermometer."),
        ToolSpec::new("weather_now", "Current weather for a city."),
    ];
    let ix = hybrid(
        &specs,
        HybridConfig {
            short_weight: 7.0,
            long_weight: f64::NAN,
            short_terms: 5,
            long_terms: 1,
            depth: 0,
            clause_weight: -1.0,
            exact_names: true,
            lexical_floor: f64::INFINITY,
        },
    );
    let hits = ix.search("thermomiter", 5, &all);
    assert_eq!(names(&hits)[0], "thermometer_read");
    assert!(
        hits.iter()
            .all(|h| h.score.is_finite() && (0.0..=1.0).contains(&h.score))
    );
}

/// A hit far below the best (it shares only a prefix of a parameter name with the query)
/// is left out: paged into a working set, it would push out tools that matter.
#[test]
fn hits_far_below_the_best_are_left_out() {
    let time = |name: &str, desc: &str| {
        ToolSpec::new(name, desc).with_schema(json!({"type": "object", "properties": {
            "timezone": {"type": "string", "description": "IANA timezone name"}}}))
    };
    let mut specs = vec![
        time(
            "mcp__time__get_current_time",
            "Get current time in a specific timezone",
        ),
        time("mcp__time__convert_time", "Convert time between timezones"),
    ];
    for i in 0..40 {
        specs.push(
            ToolSpec::new(format!("mcp__git__op_{i}"), "Shows the commit logs")
                .with_schema(json!({"type": "object", "properties": {
                    "start_timestamp": {"type": "string", "description": "Start of the range"}}})),
        );
    }
    let ix = index(&specs);
    let hits = ix.search("time", 10, &all);
    let best = hits[0].score;
    assert!(
        hits.iter().all(|h| h.score >= best * MIN_SHARE_OF_BEST),
        "{hits:?}"
    );
    assert_eq!(
        names(&hits),
        ["mcp__time__convert_time", "mcp__time__get_current_time"],
        "{hits:?}"
    );
}

#[test]
fn a_tool_the_query_names_goes_first_and_a_plain_word_name_does_not_count() {
    let specs = [
        ToolSpec::new("mcp__git__git_status", "Shows the working tree status."),
        ToolSpec::new(
            "mcp__git__git_diff",
            "Shows the changes in the working tree.",
        ),
        ToolSpec::new("mcp__web__search", "Searches the working web for pages."),
    ];
    let ix = hybrid(
        &specs,
        HybridConfig {
            short_weight: 1.0,
            long_weight: 1.0,
            ..HybridConfig::default()
        },
    );
    // The vector ranking alone, named tool aside.
    let named = ix.search("working tree changes, then git_status", 3, &all);
    assert_eq!(names(&named)[0], "mcp__git__git_status", "{named:?}");
    assert!(fuse::names_tool("run git_status.", "mcp__git__git_status"));
    assert!(fuse::names_tool("call getweather now", "getWeather"));
    assert!(!fuse::names_tool(
        "search the working tree",
        "mcp__web__search"
    ));
    assert!(!fuse::names_tool("git_status_all", "mcp__git__git_status"));
}

#[test]
fn a_tool_without_its_vector_ranks_by_its_lexical_score() {
    let specs = [
        ToolSpec::new("weather_now", "Current weather for a city."),
        ToolSpec::new("stock_quote", "Latest stock quote."),
    ];
    let mut ix = hybrid(&specs, HybridConfig::default());
    // A new tool with the query's words, not embedded yet: found by its words.
    ix.upsert(&ToolSpec::new("tide_table", "Tide table for a harbour."));
    assert_eq!(ix.pending_vectors(10).len(), 1);
    assert_eq!(
        names(&ix.search("tide table harbour", 3, &all))[0],
        "tide_table"
    );
    // A vector for an older text of the tool is refused.
    let p = ix.pending_vectors(1).remove(0);
    ix.upsert(&ToolSpec::new("tide_table", "Tides of a harbour, by day."));
    assert!(!ix.set_vector(&p.name, &p.key, &[1.0; 256]));
    assert_eq!(
        ix.vector_key("tide_table").as_deref().map(str::len),
        Some(16)
    );
    // A vector of another length than the others is refused too.
    let p = ix.pending_vectors(1).remove(0);
    assert!(!ix.set_vector(&p.name, &p.key, &[1.0; 3]));
    assert!(ix.set_vector(&p.name, &p.key, &[1.0; 256]));
    assert!(ix.pending_vectors(10).is_empty());
}
