//! tool_search and describe_tool, called through the dispatcher.

use std::sync::Arc;
use std::time::Duration;

use quiver_contract::{CallContext, Capabilities, Envelope, ErrKind, HintKind, Lifecycle, Mode};
use quiver_surface::SurfaceConfig;
use quiver_surface::search::{HashedNgrams, HybridConfig};
use serde_json::{Value, json};

use crate::support::{Fixture, line, ro, rw, stub, text};

fn search_fixture() -> Fixture {
    let specs = vec![
        ro("read_csv", "Reads a CSV file into rows."),
        ro("write_csv", "Writes rows to a CSV file.").with_annotations(Default::default()),
        ro("csv_stats", "Computes statistics over a CSV file."),
        ro("secret_csv", "Reads an internal CSV file.").with_category("internal"),
        ro("draft_csv", "Reads a draft CSV file.").with_lifecycle(Lifecycle::Draft),
        ro("admin_csv", "Deletes CSV files as admin."),
        rw("send_mail", "Sends an email message."),
    ];
    Fixture::new(SurfaceConfig::default(), specs, &[])
}

fn data(e: &Envelope) -> &Value {
    e.data().unwrap_or_else(|| panic!("not ok: {}", text(e)))
}

/// The hit names, sorted (the ranking itself is the search index's business).
fn hit_names(e: &Envelope) -> String {
    let hits = data(e)["hits"].as_array().unwrap();
    let mut names: Vec<String> = hits
        .iter()
        .map(|h| h["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    line(&names)
}

#[tokio::test]
async fn hidden_internal_disallowed_and_plan_excluded_tools_are_never_found() {
    let fx = search_fixture();
    let e = fx.search("s", json!({"query": "csv file"})).await;
    assert_eq!(hit_names(&e), "admin_csv csv_stats read_csv write_csv");

    let caps = Capabilities::all().with_allowed_tools(vec![
        "tool_search".into(),
        "*_csv".into(),
        "read_*".into(),
    ]);
    let ctx = CallContext::for_session("caps").with_capabilities(caps.clone());
    let e = fx
        .call_with(ctx, "tool_search", json!({"query": "csv file"}))
        .await;
    let names = hit_names(&e);
    assert!(!names.contains("csv_stats"), "{names}");

    // In plan mode mutating tools are not found.
    fx.surface
        .assemble_tools("plan", Mode::Plan, &Capabilities::all())
        .unwrap();
    let e = fx.search("plan", json!({"query": "csv file"})).await;
    let names = hit_names(&e);
    assert!(!names.contains("write_csv"), "{names}");
    assert!(names.contains("read_csv"), "{names}");
}

#[tokio::test]
async fn matches_join_the_working_set_at_once() {
    let fx = search_fixture();
    let e = fx.search("s", json!({"query": "email", "limit": 3})).await;
    assert_eq!(data(&e)["exposed"], json!(["send_mail"]));
    // Nothing was pushed off the list: the key is left out.
    assert_eq!(data(&e).get("displaced"), None, "{}", text(&e));
    assert_eq!(line(&fx.surface.working_set("s")), "send_mail");
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(
        composed.reason_of("send_mail").map(|r| r.as_str()),
        Some("working_set")
    );
}

/// What `tool_search` pages in outranks the usage floor in the next round: with a floor
/// that fills the round budget, the hit is listed and the lowest floor tool makes room.
#[tokio::test]
async fn a_hit_is_listed_even_when_the_floor_fills_the_round() {
    let mut specs = crate::support::many(6);
    specs.push(rw("send_mail", "Sends an email message."));
    let usage = [
        ("t00", [4, 0, 0]),
        ("t01", [3, 0, 0]),
        ("t02", [2, 0, 0]),
        ("t03", [1, 0, 0]),
    ];
    let config = SurfaceConfig::default().with_round_budget(6, 1 << 20);
    let fx = Fixture::new(config, specs, &usage);
    assert_eq!(
        line(&fx.names("s", Mode::Chat)),
        "tool_search describe_tool t00 t01 t02 t03"
    );
    let e = fx.search("s", json!({"query": "email"})).await;
    assert_eq!(data(&e)["exposed"], json!(["send_mail"]), "{}", text(&e));
    assert_eq!(data(&e)["failed"], json!([]));
    // The floor tool that made room is named: the model's list lost it.
    assert_eq!(data(&e)["displaced"], json!(["t03"]), "{}", text(&e));
    assert_eq!(
        line(&fx.names("s", Mode::Chat)),
        "tool_search describe_tool send_mail t00 t01 t02"
    );
}

/// A newer search's hits push an older working-set tool off a full round: `tool_search`
/// names it under `displaced` (it stays in the working set, callable by name), and a hit
/// already listed is not named.
#[tokio::test]
async fn tools_a_search_pushes_off_the_round_are_named_displaced() {
    let specs = vec![
        rw("send_mail", "Sends an email message."),
        ro("read_csv", "Reads a CSV file into rows."),
        ro("csv_stats", "Computes statistics over a CSV file."),
    ];
    let config = SurfaceConfig::default().with_round_budget(4, 1 << 20);
    let fx = Fixture::new(config, specs, &[]);
    let e = fx.search("s", json!({"query": "email"})).await;
    assert_eq!(data(&e)["exposed"], json!(["send_mail"]), "{}", text(&e));
    let e = fx
        .search("s", json!({"query": "read rows", "limit": 1}))
        .await;
    assert_eq!(data(&e)["exposed"], json!(["read_csv"]), "{}", text(&e));
    assert_eq!(data(&e).get("displaced"), None, "{}", text(&e));
    let e = fx
        .search("s", json!({"query": "statistics", "limit": 1}))
        .await;
    let d = data(&e);
    assert_eq!(d["exposed"], json!(["csv_stats"]), "{d}");
    assert_eq!(d["displaced"], json!(["send_mail"]), "{d}");
    assert!(
        text(&e).contains("⚠ displaced: `send_mail` left your tool list to make room for these hits: they still work when called by name"),
        "{}",
        text(&e)
    );
    assert_eq!(
        line(&fx.names("s", Mode::Chat)),
        "tool_search describe_tool csv_stats read_csv"
    );
    assert!(
        fx.surface
            .working_set("s")
            .contains(&"send_mail".to_owned())
    );
    // Searching again for a listed tool pushes nothing off.
    let e = fx
        .search("s", json!({"query": "statistics", "limit": 1}))
        .await;
    assert_eq!(data(&e).get("displaced"), None, "{}", text(&e));
}

/// A hit the next round's budget cannot list is reported as failed (`over_budget`), not
/// exposed, and the budget keeps the best hits.
#[tokio::test]
async fn hits_the_round_cannot_list_are_reported_over_budget() {
    let specs = vec![
        ro("read_csv", "Reads a CSV file into rows."),
        ro("csv_stats", "Computes statistics over a CSV file."),
        ro("csv_head", "Shows the first rows of a CSV file."),
    ];
    let config = SurfaceConfig::default().with_round_budget(4, 1 << 20);
    let fx = Fixture::new(config, specs, &[]);
    let e = fx
        .search("s", json!({"query": "csv file", "limit": 3}))
        .await;
    let d = data(&e);
    let ranked: Vec<&str> = d["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(ranked.len(), 3, "{d}");
    assert_eq!(d["exposed"], json!([ranked[0], ranked[1]]), "{d}");
    assert_eq!(
        d["failed"],
        json!([{"name": ranked[2], "reason": "over_budget"}]),
        "{d}"
    );
    assert!(
        text(&e).contains(&format!("⚠ not_added: `{}` matched but did not fit in your tool list this round (at most 4 tools", ranked[2])),
        "{}",
        text(&e)
    );
    let listed = fx.names("s", Mode::Chat);
    assert_eq!(
        line(&listed),
        format!("tool_search describe_tool {} {}", ranked[0], ranked[1])
    );
}

/// The round budgets a tool's advertised definition, with the injected `reasoning`
/// property: `tool_search` measures its hits the same way, so a hit the round cannot list
/// for bytes is reported `over_budget`, not exposed.
#[tokio::test]
async fn hits_the_round_cannot_list_for_bytes_are_reported_over_budget() {
    let specs = vec![ro("read_csv", "Reads a CSV file into rows.")];
    let probe = Fixture::new(SurfaceConfig::default(), specs.clone(), &[]);
    let spec = |n: &str| probe.catalog.lookup(n).unwrap().spec.clone();
    let advertised = |n: &str| {
        quiver_registry::advertise(spec(n), &quiver_registry::AdvertiseOptions::default())
            .definition_bytes()
    };
    let bare = spec("read_csv").definition_bytes();
    assert!(advertised("read_csv") > bare, "reasoning is injected");
    // Room for the system tools and the hit without its `reasoning` property.
    let budget = advertised("tool_search") + advertised("describe_tool") + bare;
    let fx = Fixture::new(
        SurfaceConfig::default().with_round_budget(32, budget),
        specs,
        &[],
    );
    let e = fx
        .search("s", json!({"query": "csv file", "limit": 1}))
        .await;
    let d = data(&e);
    assert_eq!(d["exposed"], json!([]), "{d}");
    assert_eq!(
        d["failed"],
        json!([{"name": "read_csv", "reason": "over_budget"}]),
        "{d}"
    );
    assert_eq!(
        line(&fx.names("s", Mode::Chat)),
        "tool_search describe_tool"
    );
    // `describe_tool` of it warns that it was not loaded, and why (before, only `loaded:
    // false` after the definition, which a long one pushed past the result limit).
    let e = fx
        .call("s", "describe_tool", json!({"name": "read_csv"}))
        .await;
    assert_eq!(data(&e)["loaded"], json!(false), "{}", text(&e));
    assert!(
        text(&e).contains("⚠ not_loaded: `read_csv` was not added to your tool list: it does not fit in what a round lists (at most 32 tools and ")
            && text(&e).contains("its definition is ")
            && text(&e).contains("a call of it by name still runs"),
        "{}",
        text(&e)
    );
    // A tool larger than the whole round is told so: nothing took its room.
    let tiny = Fixture::new(
        SurfaceConfig::default().with_round_budget(32, bare - 1),
        vec![ro("read_csv", "Reads a CSV file into rows.")],
        &[],
    );
    let e = tiny
        .call("s", "describe_tool", json!({"name": "read_csv"}))
        .await;
    assert!(
        text(&e).contains("is larger than all a round lists")
            && text(&e).contains("so it can never be listed")
            && !text(&e).contains("ranked above it"),
        "{}",
        text(&e)
    );
}

/// With a `max_surface` below the round budget (a configuration `quiver check` warns about),
/// a round that would list the hits is too large and fails: the hits are reported failed,
/// not exposed.
#[tokio::test]
async fn hits_a_too_large_round_cannot_list_are_not_exposed() {
    let mut specs = crate::support::many(2);
    specs.push(ro("read_csv", "Reads a CSV file into rows."));
    specs.push(ro("csv_stats", "Computes statistics over a CSV file."));
    // The system set and the two hits fit; the usage floor after them does not.
    let usage = [("t00", [2, 0, 0]), ("t01", [1, 0, 0])];
    let config = SurfaceConfig::default()
        .with_round_budget(6, 1 << 20)
        .with_max_surface(4);
    let fx = Fixture::new(config, specs, &usage);
    let e = fx
        .search("s", json!({"query": "csv file", "limit": 2}))
        .await;
    let d = data(&e);
    assert_eq!(d["hits"].as_array().map(Vec::len), Some(2), "{d}");
    assert_eq!(d["exposed"], json!([]), "{d}");
    let failed: Vec<&str> = d["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["reason"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["over_budget", "over_budget"], "{d}");
    assert!(
        fx.surface
            .compose("s", Mode::Chat, &Capabilities::all())
            .is_err(),
        "the round itself is too large"
    );
}

/// `describe_tool` of an always-resident tool takes no working-set slot.
#[tokio::test]
async fn describing_a_system_tool_pages_nothing_in() {
    let fx = search_fixture();
    let mut changes = fx.surface.subscribe_changes();
    let e = fx
        .call("s", "describe_tool", json!({"name": "tool_search"}))
        .await;
    assert!(e.is_ok(), "{}", text(&e));
    assert!(fx.surface.working_set("s").is_empty());
    // It is loaded all the same (a progressive system tool's full spec is listed from now).
    assert_eq!(data(&e)["loaded"], json!(true), "{}", text(&e));
    assert!(fx.surface.is_loaded("s", "tool_search"));
    // Its listing is the same (it is not progressive): no list change to announce.
    assert!(changes.try_recv().is_err(), "a list change was announced");
}

#[tokio::test]
async fn tool_search_result_shape() {
    let config = SurfaceConfig::default()
        .with_working_set(3, 1 << 20)
        .with_agentic_only(&["write_csv"]);
    let specs = vec![
        ro("read_csv", "Reads a CSV file into rows."),
        ro("csv_stats", "Computes statistics over a CSV file."),
        ro("write_csv", "Writes rows to a CSV file."),
        ro("csv_to_json", "Converts a CSV file to JSON."),
        ro("old_tool", "Something paged in earlier."),
        ro("older_tool", "Something paged in even earlier."),
    ];
    let fx = Fixture::new(config, specs, &[]);
    fx.surface.page_in("s", &["older_tool"]);
    fx.surface.page_in("s", &["old_tool"]);
    let e = fx
        .search("s", json!({"query": "write csv rows", "limit": 10}))
        .await;
    // The limit is capped by the working set (3); write_csv is agentic-only, so a chat
    // caller never finds it (it could not call it); the oldest working-set tools are
    // evicted to make room.
    insta::assert_json_snapshot!("tool_search_data", data(&e));
    insta::assert_snapshot!("tool_search_render", text(&e));
}

/// A limit written as `2.0` is the integer 2 (JSON Schema's `integer` takes it); one above
/// what a working set holds is cut to it, with a warning that says so.
#[tokio::test]
async fn a_whole_float_limit_is_taken_and_a_capped_one_is_said() {
    let fx = Fixture::new(
        SurfaceConfig::default().with_working_set(2, 1 << 20),
        vec![
            ro("read_csv", "Reads a CSV file into rows."),
            ro("csv_stats", "Computes statistics over a CSV file."),
            ro("csv_to_json", "Converts a CSV file to JSON."),
        ],
        &[],
    );
    let e = fx
        .search("s", json!({"query": "csv file", "limit": 1.0}))
        .await;
    assert_eq!(
        data(&e)["hits"].as_array().unwrap().len(),
        1,
        "{}",
        text(&e)
    );
    assert!(!text(&e).contains("limit_capped"), "{}", text(&e));
    let e = fx
        .search("s", json!({"query": "csv file", "limit": 3}))
        .await;
    assert_eq!(
        data(&e)["hits"].as_array().unwrap().len(),
        2,
        "{}",
        text(&e)
    );
    assert!(
        text(&e).contains("limit_capped: at most 2 tools are returned per search"),
        "{}",
        text(&e)
    );
}

#[tokio::test]
async fn blank_queries_get_a_hint() {
    let fx = search_fixture();
    for q in ["", "   ", "the of and", "?!...", "--"] {
        let e = fx.search("s", json!({"query": q})).await;
        assert_eq!(e.hint_kind(), Some(HintKind::Fetch), "{q:?}: {}", text(&e));
    }
    let e = fx.search("s", json!({"query": "the"})).await;
    insta::assert_snapshot!("blank_query_hint", text(&e));
    // A word too long to be a word is not a search word either, and the hint says so.
    let e = fx.search("s", json!({"query": "q".repeat(50)})).await;
    assert_eq!(e.hint_kind(), Some(HintKind::Fetch), "{}", text(&e));
    assert!(
        text(&e).contains("words too long to be words"),
        "{}",
        text(&e)
    );
}

/// A search that finds nothing is still a result (the hits are what there is), with a
/// warning that tells the model how to search again; one that finds something has none.
#[tokio::test]
async fn a_search_that_finds_nothing_says_what_to_do() {
    let fx = search_fixture();
    let e = fx
        .search("s", json!({"query": "quantum teleportation banana"}))
        .await;
    assert!(e.is_ok(), "{}", text(&e));
    assert_eq!(data(&e)["hits"], json!([]), "{}", text(&e));
    assert!(
        text(&e).contains(&format!("no_match: {}", quiver_surface::NO_MATCH_HINT)),
        "{}",
        text(&e)
    );
    let found = fx.search("s", json!({"query": "csv"})).await;
    assert!(
        !data(&found)["hits"].as_array().unwrap().is_empty(),
        "{}",
        text(&found)
    );
    assert!(!text(&found).contains("no_match"), "{}", text(&found));
}

#[tokio::test]
async fn bad_arguments_get_a_schema_hint() {
    let fx = search_fixture();
    for args in [
        json!({}),
        json!({"query": 3}),
        json!({"query": "csv", "extra": 1}),
        json!({"query": "csv", "limit": 0}),
        json!({"query": "csv", "limit": 51}),
        json!({"query": "csv", "limit": "5"}),
        json!({"query": "csv", "limit": 2.5}),
        json!({"query": "csv", "limit": -1}),
    ] {
        let e = fx.search("s", args.clone()).await;
        assert_eq!(
            e.hint_kind(),
            Some(HintKind::Schema),
            "{args}: {}",
            text(&e)
        );
    }
}

#[tokio::test]
async fn describe_tool_loads_a_progressive_spec() {
    let config = SurfaceConfig::default().with_anchors(&["fetch_page"]);
    let specs = vec![
        ro("fetch_page", "Fetches a web page. Long details follow.")
            .with_schema(json!({
                "type": "object",
                "properties": {"url": {"type": "string", "description": "The page."}},
                "required": ["url"]
            }))
            .progressive(),
    ];
    let fx = Fixture::new(config, specs, &[]);
    let mut changes = fx.surface.subscribe_changes();
    let before = fx.assemble("s", Mode::Chat);
    let light = &before
        .tools
        .iter()
        .find(|t| t.spec.name == "fetch_page")
        .unwrap()
        .spec;
    assert!(
        light.description.contains("describe_tool"),
        "{}",
        light.description
    );
    assert!(light.input_schema["properties"].get("url").is_none());

    let e = fx
        .call("s", "describe_tool", json!({"name": "fetch_page"}))
        .await;
    assert_eq!(data(&e)["input_schema"]["required"], json!(["url"]));
    assert!(fx.surface.is_loaded("s", "fetch_page"));
    let got = tokio::time::timeout(Duration::from_secs(5), changes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*got, "s");

    let after = fx.assemble("s", Mode::Chat);
    let full = &after
        .tools
        .iter()
        .find(|t| t.spec.name == "fetch_page")
        .unwrap()
        .spec;
    assert_eq!(full.description, "Fetches a web page. Long details follow.");
    assert!(full.input_schema["properties"].get("url").is_some());
    assert!(full.input_schema["properties"].get("reasoning").is_some());
}

#[tokio::test]
async fn describe_tool_of_an_unknown_or_hidden_tool_is_an_unknown_tool() {
    let fx = search_fixture();
    let e = fx
        .call("s", "describe_tool", json!({"name": "read_cvs"}))
        .await;
    assert_eq!(e.err_kind(), Some(&ErrKind::UndefinedTool));
    insta::assert_snapshot!("describe_unknown_hint", text(&e));
    let e = fx
        .call("s", "describe_tool", json!({"name": "secret_csv"}))
        .await;
    assert_eq!(e.err_kind(), Some(&ErrKind::UndefinedTool));
    // An empty name is said to be empty, not looked up as a tool named ``.
    let e = fx.call("s", "describe_tool", json!({"name": " "})).await;
    assert_eq!(e.hint_kind(), Some(HintKind::Schema));
    assert!(text(&e).contains("`name` is empty"), "{}", text(&e));
}

#[tokio::test]
async fn the_index_follows_the_catalog() {
    let fx = search_fixture();
    let mut updates = fx.surface.index_updates();
    updates.borrow_and_update();
    fx.catalog
        .register_in("test", stub(ro("parse_yaml", "Parses a YAML document.")))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), updates.changed())
        .await
        .unwrap()
        .unwrap();
    let e = fx.search("s", json!({"query": "yaml"})).await;
    assert_eq!(hit_names(&e), "parse_yaml");

    fx.catalog.remove("parse_yaml");
    tokio::time::timeout(Duration::from_secs(5), updates.changed())
        .await
        .unwrap()
        .unwrap();
    let e = fx.search("s", json!({"query": "yaml"})).await;
    assert_eq!(hit_names(&e), "");
}

/// A search right after tools register ranks all of them, not the part the index task
/// has taken in yet: on this one-thread runtime that task has not run when the search
/// starts, so without the wait the search would find none of them.
#[tokio::test]
async fn a_search_waits_for_the_changes_made_before_it() {
    let fx = search_fixture();
    for i in 0..12 {
        fx.catalog
            .register_in(
                "test",
                stub(ro(&format!("toml_tool_{i:02}"), "Parses a TOML document.")),
            )
            .unwrap();
    }
    let e = fx
        .search("s", json!({"query": "toml document", "limit": 20}))
        .await;
    assert_eq!(
        data(&e)["hits"].as_array().unwrap().len(),
        12,
        "{}",
        text(&e)
    );
}

#[tokio::test]
async fn the_index_says_which_catalog_version_it_has() {
    // Built over a catalog that already changed: it starts at that version.
    let fx = search_fixture();
    let mut updates = fx.surface.index_updates();
    assert_eq!(*updates.borrow_and_update(), fx.catalog.version());
    // Several changes at once: waiting for the catalog's version waits for all of them,
    // not only the first one indexed.
    for i in 0..20 {
        fx.catalog
            .register_in(
                "test",
                stub(ro(&format!("yaml_tool_{i:02}"), "Parses YAML.")),
            )
            .unwrap();
    }
    fx.catalog.remove("yaml_tool_00");
    let version = fx.catalog.version();
    tokio::time::timeout(
        Duration::from_secs(5),
        updates.wait_for(|at| *at >= version),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(*updates.borrow(), version);
    let e = fx.search("s", json!({"query": "yaml", "limit": 50})).await;
    assert_eq!(data(&e)["hits"].as_array().unwrap().len(), 19, "{e:?}");
    // A resync changes nothing it can see, and never goes back.
    fx.surface.resync_index();
    assert_eq!(*fx.surface.index_updates().borrow(), version);
}

#[tokio::test]
async fn a_search_finds_allowed_tools_behind_many_disallowed_ones() {
    let mut specs: Vec<_> = (0..40)
        .map(|i| ro(&format!("csv_tool_{i:02}"), "Reads a CSV file."))
        .collect();
    specs.push(ro("only_csv", "Reads a CSV file, rarely."));
    let fx = Fixture::new(SurfaceConfig::default(), specs, &[]);
    let caps = Capabilities::all().with_allowed_tools(vec!["tool_search".into(), "only_*".into()]);
    let ctx = CallContext::for_session("s").with_capabilities(caps);
    let e = fx
        .call_with(ctx, "tool_search", json!({"query": "csv file", "limit": 2}))
        .await;
    assert_eq!(hit_names(&e), "only_csv");
}

#[tokio::test]
async fn describe_tool_respects_the_modes_lists() {
    let config = SurfaceConfig::default().with_agentic_only(&["run_shell"]);
    let fx = Fixture::new(config, vec![rw("run_shell", "Runs a shell command.")], &[]);
    let e = fx
        .call("s", "describe_tool", json!({"name": "run_shell"}))
        .await;
    // Refused as a call of it is (forbidden, the mode named), not called unknown in a
    // schema hint.
    assert_eq!(
        e.err_kind(),
        Some(&quiver_contract::ErrKind::Forbidden),
        "{}",
        text(&e)
    );
    assert!(
        text(&e).contains("`run_shell` is not available in chat mode."),
        "{}",
        text(&e)
    );
    fx.surface
        .assemble_tools("s", Mode::Agentic, &Capabilities::all())
        .unwrap();
    let e = fx
        .call("s", "describe_tool", json!({"name": "run_shell"}))
        .await;
    assert!(e.is_ok(), "{}", text(&e));
}

/// Waits until the vector task has given every indexed tool its vector.
async fn every_vector(surface: &quiver_surface::Surface) {
    let mut progress = surface.vector_progress();
    tokio::time::timeout(
        Duration::from_secs(5),
        progress.wait_for(|p| p.total > 0 && p.ready == p.total),
    )
    .await
    .expect("the vectors are computed")
    .unwrap();
}

#[tokio::test]
async fn a_vector_retriever_blends_into_tool_search_and_can_be_removed() {
    let fx = search_fixture();
    // "statistcs" (a typo) meets no indexed term, so the lexical index finds nothing.
    let q = json!({"query": "statistcs"});
    assert_eq!(hit_names(&fx.search("s", q.clone()).await), "");

    fx.surface.set_vector_retriever(Some((
        Arc::new(HashedNgrams::default()),
        HybridConfig::default(),
    )));
    // Until the tools have their vectors the ranking is lexical.
    assert_eq!(hit_names(&fx.search("s", q.clone()).await), "");
    let _worker = fx.surface.spawn_vector_worker(None);
    every_vector(&fx.surface).await;
    let e = fx.search("s", q.clone()).await;
    let hits = data(&e)["hits"].as_array().unwrap().clone();
    assert_eq!(hits[0]["name"], "csv_stats", "{hits:?}");
    // The vector ranking obeys the same visibility rules: internal, draft and system tools
    // never come back.
    for h in &hits {
        let n = h["name"].as_str().unwrap();
        assert!(
            !["secret_csv", "draft_csv", "tool_search", "describe_tool"].contains(&n),
            "{n}"
        );
    }

    // A tool added later is embedded on its own.
    let mut updates = fx.surface.index_updates();
    updates.borrow_and_update();
    fx.catalog
        .register_in("test", stub(ro("yaml_validator", "Checks a document.")))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), updates.changed())
        .await
        .unwrap()
        .unwrap();
    every_vector(&fx.surface).await;
    let e = fx.search("s", json!({"query": "validatr"})).await;
    assert_eq!(data(&e)["hits"][0]["name"], "yaml_validator");

    fx.surface.set_vector_retriever(None);
    assert_eq!(hit_names(&fx.search("s", q).await), "");
}

/// What a caller cannot see takes no part in its search: a query that only hidden tools
/// match finds nothing (hidden matches fed their words back and lent their servers' share
/// to visible tools, which came back at score 0 and were paged in, telling the caller that
/// something behind its allow-list matched), and the caller gets the names it would get
/// if the hidden tools did not exist.
#[tokio::test]
async fn tools_a_caller_cannot_see_do_not_shape_its_search() {
    let visible = vec![
        ro(
            "mcp__time__get_current_time",
            "Gets the current time in a time zone.",
        ),
        ro(
            "mcp__time__convert_time",
            "Converts a time between time zones.",
        ),
    ];
    let hidden = vec![
        ro("mcp__secret__echo", "Echoes the text back."),
        ro("mcp__secret__pid", "Returns the server's process id."),
        ro(
            "mcp__time__purge_cache",
            "Purges the cached zone data of the server.",
        ),
    ];
    let with_hidden = Fixture::new(
        SurfaceConfig::default(),
        visible.iter().chain(&hidden).cloned().collect(),
        &[],
    );
    let without = Fixture::new(SurfaceConfig::default(), visible.clone(), &[]);
    let caps = Capabilities::all().with_allowed_tools(vec![
        "tool_search".into(),
        "mcp__time__get_current_time".into(),
        "mcp__time__convert_time".into(),
    ]);
    async fn limited(fx: &Fixture, caps: &Capabilities, query: &str) -> Envelope {
        let ctx = CallContext::for_session("limited").with_capabilities(caps.clone());
        fx.call_with(ctx, "tool_search", json!({"query": query}))
            .await
    }
    for query in ["echo", "process id", "purge cache", "echo the text"] {
        // The hidden tools do match (an unrestricted caller finds them).
        let open = with_hidden.search("open", json!({"query": query})).await;
        assert!(
            hidden.iter().any(|h| hit_names(&open).contains(&h.name)),
            "{query}: {}",
            text(&open)
        );
        let e = limited(&with_hidden, &caps, query).await;
        assert_eq!(data(&e)["hits"], json!([]), "{query}: {}", text(&e));
        assert_eq!(data(&e)["exposed"], json!([]), "{query}: {}", text(&e));
        assert!(text(&e).contains("no_match"), "{query}: {}", text(&e));
    }
    for query in ["time zone", "convert time", "current time", "zone data"] {
        let a = limited(&with_hidden, &caps, query).await;
        let b = limited(&without, &caps, query).await;
        assert_eq!(hit_names(&a), hit_names(&b), "{query}");
    }
    // What the allow-list lets through is kept per index change: a tool it allows that
    // registers later is found, one it does not allow is not.
    let wide =
        Capabilities::all().with_allowed_tools(vec!["tool_search".into(), "mcp__time__*".into()]);
    let before = limited(&with_hidden, &wide, "leap seconds").await;
    assert_eq!(data(&before)["hits"], json!([]), "{}", text(&before));
    let mut updates = with_hidden.surface.index_updates();
    with_hidden.catalog.register_all(
        "test",
        vec![
            stub(ro("mcp__time__leap_seconds", "Lists the leap seconds.")),
            stub(ro("mcp__secret__leap_table", "Lists the leap seconds too.")),
        ],
    );
    let version = with_hidden.catalog.version();
    tokio::time::timeout(
        Duration::from_secs(5),
        updates.wait_for(|at| *at >= version),
    )
    .await
    .unwrap()
    .unwrap();
    let after = limited(&with_hidden, &wide, "leap seconds").await;
    let names = hit_names(&after);
    assert!(
        names.contains("mcp__time__leap_seconds") && !names.contains("leap_table"),
        "{names}"
    );
}

/// A tool never offered is off every round (dropped as `unoffered`, even as an anchor),
/// not found and not described, but still visible to the call gate, so that what refuses
/// it (a policy) answers a call.
#[tokio::test]
async fn an_unoffered_tool_is_never_offered_but_stays_callable() {
    let fx = Fixture::new(
        SurfaceConfig::default()
            .with_anchors(&["drop_table"])
            .with_unoffered(&["drop_*"]),
        vec![
            rw("drop_table", "Drops a database table."),
            ro("read_table", "Reads a database table."),
        ],
        &[],
    );
    let composed = fx
        .surface
        .compose("s", Mode::Chat, &Capabilities::all())
        .unwrap();
    assert!(
        !composed.names().contains(&"drop_table"),
        "{:?}",
        composed.names()
    );
    assert!(
        composed
            .dropped
            .iter()
            .any(|d| d.name == "drop_table" && d.why.as_str() == "unoffered"),
        "{:?}",
        composed.dropped
    );
    let e = fx.search("s", json!({"query": "database table"})).await;
    assert_eq!(hit_names(&e), "read_table", "{}", text(&e));
    let d = fx
        .call_with(
            CallContext::for_session("s"),
            "describe_tool",
            json!({"name": "drop_table"}),
        )
        .await;
    assert!(!d.is_ok(), "{}", text(&d));
    assert!(
        fx.surface
            .visible("drop_table", Mode::Chat, &Capabilities::all())
    );
}

/// The call gate answers a name its caller's allow-list hides exactly as a name no one
/// serves, in every mode: a did-you-mean names only tools both the allow-list and the
/// mode offer. (A plan-mode token once got "Did you mean `write_notes`?" for a hidden
/// look-alike and nothing for an absent one: which names exist behind its allow-list, and
/// a suggestion its mode refuses.)
#[tokio::test]
async fn the_call_gate_answers_hidden_and_absent_names_alike() {
    let fx = Fixture::new(
        SurfaceConfig::default(),
        vec![
            ro("read_notes", "Reads the notes."),
            rw("write_notes", "Writes the notes."),
            rw("write_notes_all", "Writes every note."),
        ],
        &[],
    );
    let caps = Capabilities::all().with_allowed_tools(vec![
        "read_notes".into(),
        "write_notes".into(),
        "tool_search".into(),
        "describe_tool".into(),
    ]);
    let ctx = CallContext::for_session("s").with_capabilities(caps.clone());
    let answer = |name: &str, mode: Mode| {
        let e = fx
            .surface
            .admit(&fx.dispatcher, "s", name, mode, &ctx)
            .unwrap_or_else(|| panic!("{name} in {mode:?} is refused"));
        assert_eq!(
            e.err_kind(),
            Some(&quiver_contract::ErrKind::UndefinedTool),
            "{}",
            text(&e)
        );
        text(&e).replace(name, "NAME")
    };
    for mode in [Mode::Plan, Mode::Chat] {
        let hidden = answer("write_notes_all", mode);
        let absent = answer("write_notes_alk", mode);
        assert_eq!(hidden, absent, "{mode:?}");
        // Plan mode refuses `write_notes`: not suggested there, and suggested in chat.
        assert_eq!(
            hidden.contains("Did you mean `write_notes`"),
            mode == Mode::Chat,
            "{mode:?}: {hidden}"
        );
    }
    // An allowed tool the mode offers is admitted.
    assert!(
        fx.surface
            .admit(&fx.dispatcher, "s", "read_notes", Mode::Plan, &ctx)
            .is_none()
    );
}
