//! Composition per mode, capability filtering, budgets, the hard cap, advertising.

use quiver_contract::{Capabilities, Mode, ToolSpec};
use quiver_registry::AdvertiseOptions;
use quiver_surface::{DropReason, Reason, SurfaceConfig, SurfaceError};
use serde_json::json;

use crate::support::{Fixture, line, many, ro, rw};

fn modes_fixture() -> Fixture {
    let config = SurfaceConfig::default()
        .with_anchors(&["read_file"])
        .with_floor(10, 0, 100)
        .with_agentic_allow(&["read_file", "run_*"])
        .with_agentic_only(&["run_shell"])
        .with_delegate_excluded(&["send_mail"]);
    let specs = vec![
        ro("read_file", "Reads a file."),
        rw("write_file", "Writes a file."),
        rw("run_shell", "Runs a shell command."),
        rw("run_tests", "Runs the tests."),
        rw("send_mail", "Sends an email."),
        ro("grep", "Searches text."),
        ro("plan", "Writes the plan.").plan_only(),
        ro("paged", "A tool the model pages in."),
    ];
    let usage = [
        ("write_file", [5, 0, 0]),
        ("run_shell", [4, 0, 0]),
        ("send_mail", [3, 0, 0]),
        ("grep", [2, 0, 0]),
        ("plan", [1, 0, 0]),
    ];
    Fixture::new(config, specs, &usage)
}

/// Composes `mode` for a session that paged in `paged`, and compares the names.
fn check(mode: Mode, expect: &str) {
    let fx = modes_fixture();
    fx.surface.page_in("s", &["paged"]);
    let got = fx.names("s", mode);
    assert_eq!(line(&got), expect, "mode {}", mode.as_str());
}

/// The agentic allow-list takes `*` anywhere in a pattern, not only at the end.
#[test]
fn the_agentic_allow_list_takes_a_star_anywhere() {
    let config = SurfaceConfig::default().with_agentic_allow(&["*_file", "s*l"]);
    let specs = vec![
        ro("read_file", "Reads a file."),
        rw("write_file", "Writes a file."),
        rw("send_mail", "Sends an email."),
        ro("grep", "Searches text."),
    ];
    let fx = Fixture::new(config, specs, &[]);
    assert_eq!(
        line(&fx.names("s", Mode::Agentic)),
        "tool_search describe_tool read_file write_file send_mail"
    );
    // The expanded list follows the catalog.
    fx.catalog
        .register_in(
            "test",
            crate::support::stub(ro("copy_file", "Copies a file.")),
        )
        .unwrap();
    assert_eq!(
        line(&fx.names("s", Mode::Agentic)),
        "tool_search describe_tool copy_file read_file write_file send_mail"
    );
}

#[test]
fn each_mode_composes_its_own_list() {
    // chat: floor ∪ working set, minus agentic-only (and plan-only is never listed outside plan).
    check(
        Mode::Chat,
        "tool_search describe_tool read_file paged write_file send_mail grep",
    );
    // agentic: allow-list ∪ working set, not intersected with the floor.
    check(
        Mode::Agentic,
        "tool_search describe_tool read_file run_shell run_tests paged",
    );
    // delegate: chat minus delegate-excluded.
    check(
        Mode::Delegate,
        "tool_search describe_tool read_file paged write_file grep",
    );
    // plan: read-only (and plan-only) tools only.
    check(
        Mode::Plan,
        "tool_search describe_tool read_file paged grep plan",
    );
}

/// What a mode leaves off, a caller of that mode may not use either: `visible` is the
/// gate `quiver serve` puts in front of `tools/call`.
#[test]
fn a_mode_excluded_tool_is_not_visible_in_that_mode() {
    let fx = modes_fixture();
    let all = quiver_contract::Capabilities::all();
    let visible = |name: &str, mode: Mode| fx.surface.visible(name, mode, &all);
    assert!(!visible("run_shell", Mode::Chat), "agentic-only in chat");
    assert!(
        !visible("run_shell", Mode::Delegate),
        "agentic-only in delegate"
    );
    assert!(visible("run_shell", Mode::Agentic));
    assert!(!visible("send_mail", Mode::Delegate), "delegate-excluded");
    assert!(visible("send_mail", Mode::Chat));
    assert!(!visible("write_file", Mode::Plan), "mutating, in plan mode");
    assert!(visible("grep", Mode::Delegate));
}

/// The system set is resident in every mode: a mode-list pattern that happens to match a
/// system tool does not take it off (and the configuration warns).
#[test]
fn mode_lists_never_take_a_system_tool_off() {
    let config = SurfaceConfig::default()
        .with_agentic_only(&["describe_*"])
        .with_delegate_excluded(&["*_search"]);
    let warnings = config.warnings();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("agentic_only pattern `describe_*`")
                && w.contains("`describe_tool`")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("delegate_excluded pattern `*_search`")
                && w.contains("`tool_search`")),
        "{warnings:?}"
    );
    let fx = Fixture::new(config, vec![ro("grep", "Searches text.")], &[]);
    for mode in [Mode::Chat, Mode::Delegate, Mode::Agentic, Mode::Plan] {
        assert_eq!(
            line(&fx.names("s", mode)),
            "tool_search describe_tool",
            "mode {}",
            mode.as_str()
        );
    }
    let all = quiver_contract::Capabilities::all();
    assert!(fx.surface.visible("tool_search", Mode::Delegate, &all));
}

#[test]
fn reasons_and_drops_are_reported() {
    let fx = modes_fixture();
    fx.surface.page_in("s", &["paged"]);
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(composed.reason_of("tool_search"), Some(Reason::System));
    assert_eq!(composed.reason_of("read_file"), Some(Reason::Anchor));
    assert_eq!(composed.reason_of("grep"), Some(Reason::Floor));
    assert_eq!(composed.reason_of("paged"), Some(Reason::WorkingSet));
    // The agentic-only run_shell, the second most used, takes no floor slot.
    assert_eq!(composed.dropped_why("run_shell"), None);
    assert_eq!(composed.dropped_why("plan"), Some(DropReason::NotListed));
    insta::assert_snapshot!("composed_chat", composed.summary());
    // Paged in (in an agentic round), it is left off a chat round.
    fx.surface.page_in("s", &["run_shell"]);
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(
        composed.dropped_why("run_shell"),
        Some(DropReason::ModeExcluded)
    );
}

#[test]
fn disallowed_tools_are_dropped() {
    let fx = modes_fixture();
    let caps = Capabilities::all().with_allowed_tools(vec!["tool_search".into(), "read_*".into()]);
    let composed = fx.surface.assemble_tools("s", Mode::Chat, &caps).unwrap();
    assert_eq!(line(&composed.names()), "tool_search read_file");
    assert_eq!(composed.dropped_why("grep"), Some(DropReason::NotAllowed));
}

#[test]
fn a_caller_that_cannot_search_is_listed_the_tools_it_names() {
    let fx = modes_fixture();
    // `paged` is in no floor: a caller with tool_search finds it; one without could not,
    // so the tool its allow-list names one by one is listed for it (a pattern is not).
    let narrow = Capabilities::all().with_allowed_tools(vec!["paged".into(), "read_*".into()]);
    let composed = fx.surface.assemble_tools("n", Mode::Chat, &narrow).unwrap();
    assert_eq!(line(&composed.names()), "paged read_file");
    assert_eq!(composed.reason_of("paged"), Some(Reason::Allowed));
    let searching = Capabilities::all().with_allowed_tools(vec![
        "tool_search".into(),
        "paged".into(),
        "read_*".into(),
    ]);
    let composed = fx
        .surface
        .assemble_tools("s", Mode::Chat, &searching)
        .unwrap();
    assert_eq!(line(&composed.names()), "tool_search read_file");
}

fn caps(model: &[&str], provider: &[&str]) -> Capabilities {
    let mut c = Capabilities::all();
    c.model = model.iter().map(|s| (*s).to_owned()).collect();
    c.provider = provider.iter().map(|s| (*s).to_owned()).collect();
    c
}

#[test]
fn capability_double_guard() {
    let config = SurfaceConfig::default()
        .with_anchors(&["web_search", "other"])
        .with_floor(5, 0, 100);
    let specs = vec![
        ro("web_search", "Searches the web.").replaced_by("web_search"),
        ro("other", "Something else."),
    ];
    let fx = Fixture::new(config, specs, &[]);
    let check = |session: &str, c: Capabilities, kept: bool| {
        let composed = fx.surface.assemble_tools(session, Mode::Chat, &c).unwrap();
        assert_eq!(composed.names().contains(&"web_search"), kept, "{c:?}");
        if !kept {
            assert_eq!(
                composed.dropped_why("web_search"),
                Some(DropReason::ReplacedByModel)
            );
        }
    };
    // On for the model but not deliverable: kept.
    check("a", caps(&["web_search"], &[]), true);
    // Deliverable but not on: kept.
    check("a", caps(&[], &["web_search"]), true);
    // Both: a resident tool is dropped.
    check("a", caps(&["web_search"], &["web_search"]), false);
    // Paged in by the model itself: kept.
    fx.surface.page_in("b", &["web_search"]);
    check("b", caps(&["web_search"], &["web_search"]), true);
}

#[test]
fn count_budget_keeps_rank_then_recency() {
    let config = SurfaceConfig::default()
        .with_anchors(&["t00"])
        .with_floor(3, 0, 100)
        .with_round_budget(6, 1 << 20);
    let fx = Fixture::new(config, many(10), &[("t01", [2, 0, 0]), ("t02", [1, 0, 0])]);
    fx.surface.page_in("s", &["t07"]);
    fx.surface.page_in("s", &["t05"]);
    fx.surface.page_in("s", &["t06"]);
    let composed = fx.assemble("s", Mode::Chat);
    // system, anchor, the working set most recent first, then the floor by score: the
    // tools the model asked for outrank the ones usage guessed.
    assert_eq!(
        line(&composed.names()),
        "tool_search describe_tool t00 t06 t05 t07"
    );
    assert_eq!(composed.dropped_why("t01"), Some(DropReason::OverCount));
    assert_eq!(composed.dropped_why("t02"), Some(DropReason::OverCount));
}

#[test]
fn oversized_entry_is_skipped_without_stopping_the_walk() {
    let big = ro("big", &"A very long description. ".repeat(120));
    let mut specs = many(4);
    specs.push(big);
    let config = SurfaceConfig::default()
        .with_anchors(&["t00", "big", "t01"])
        .with_floor(5, 0, 100)
        .with_round_budget(32, 2500);
    let fx = Fixture::new(config, specs, &[]);
    fx.surface.page_in("s", &["t02"]);
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(
        line(&composed.names()),
        "tool_search describe_tool t00 t01 t02"
    );
    assert_eq!(composed.dropped_why("big"), Some(DropReason::OverBytes));
    assert!(composed.bytes <= 2500, "{}", composed.bytes);
}

#[test]
fn tool_search_always_survives_the_budgets() {
    let config = SurfaceConfig::default()
        .with_anchors(&["t00"])
        .with_round_budget(0, 0);
    let fx = Fixture::new(config, many(3), &[]);
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(line(&composed.names()), "tool_search");
    assert_eq!(
        composed.dropped_why("describe_tool"),
        Some(DropReason::OverCount)
    );
}

#[test]
fn exceeding_max_surface_is_an_error() {
    let config = SurfaceConfig::default()
        .with_anchors(&["t00", "t01", "t02"])
        .with_round_budget(100, 1 << 20)
        .with_max_surface(4);
    let fx = Fixture::new(config, many(3), &[]);
    let err = fx
        .surface
        .assemble_tools("s", Mode::Chat, &Capabilities::all())
        .unwrap_err();
    assert!(
        matches!(
            err,
            SurfaceError::TooLarge {
                count: 5,
                max: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn advertised_specs_match_the_registry() {
    let config = SurfaceConfig::default().with_anchors(&["echo", "slow"]);
    let echo = ro("echo", "Echoes.").with_schema(json!({
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"]
    }));
    let slow = ro("slow", "Slow tool. Takes long.").progressive();
    let fx = Fixture::new(config, vec![echo, slow], &[]);
    let composed = fx.assemble("s", Mode::Chat);
    let registry: Vec<ToolSpec> = fx
        .catalog
        .advertised_specs(Mode::Chat, &AdvertiseOptions::default());
    for tool in &composed.tools {
        let want = registry.iter().find(|s| s.name == tool.spec.name).unwrap();
        assert_eq!(&tool.spec, want);
    }
    let slow = composed
        .tools
        .iter()
        .find(|t| t.spec.name == "slow")
        .unwrap();
    assert!(
        slow.spec.description.contains("Summary only"),
        "{}",
        slow.spec.description
    );
}

#[test]
fn config_deserializes_with_defaults_and_rejects_unknown_fields() {
    let config: SurfaceConfig = serde_json::from_value(json!({
        "anchors": ["a"],
        "working_set": {"max_tools": 5}
    }))
    .unwrap();
    assert_eq!(config.working_set.max_tools, 5);
    assert_eq!(config.working_set.max_bytes, 64 * 1024);
    assert_eq!(config.target_floor, 30);
    assert_eq!(config.round.max_definitions, 32);
    assert_eq!(config.max_surface, 120);
    let err = serde_json::from_value::<SurfaceConfig>(json!({"anchor": ["a"]})).unwrap_err();
    assert!(err.to_string().contains("unknown field"), "{err}");
}

/// Settings that cannot work are refused when the surface is built, with the reason.
#[test]
fn unworkable_settings_are_refused() {
    let refused = |config: SurfaceConfig, why: &str| {
        let built = quiver_surface::Surface::new(
            std::sync::Arc::new(quiver_registry::Catalog::new()),
            config,
            std::sync::Arc::new(quiver_surface::MemoryUsage::default()),
        );
        let err = built.expect_err(why).to_string();
        assert!(err.contains(why), "{err}");
    };
    refused(
        SurfaceConfig::default().with_floor(30, 40, 35),
        "floor_min (40) is above floor_max (35)",
    );
    refused(
        SurfaceConfig::default().with_max_surface(0),
        "max_surface must be at least 1",
    );
    // Below the system set no list can be composed: refused at configuration.
    refused(
        SurfaceConfig::default().with_max_surface(1),
        "max_surface (1) is below the always-resident system set (2: tool_search, describe_tool): no tool list could be composed",
    );
    SurfaceConfig::default()
        .with_max_surface(2)
        .validate()
        .expect("the system set alone fits");
    // A target floor outside its own bounds is a warning.
    let off = SurfaceConfig::default().with_floor(100, 25, 35).warnings();
    assert!(
        off.iter()
            .any(|w| w.contains("target_floor (100) is outside floor_min..floor_max (25..35)")),
        "{off:?}"
    );
    assert!(SurfaceConfig::default().warnings().is_empty());
    // The anchors are resident beside the system set.
    let crowded = SurfaceConfig::default()
        .with_anchors(&["a", "b"])
        .with_max_surface(3)
        .warnings();
    assert!(
        crowded
            .iter()
            .any(|w| w
                .contains("max_surface (3) is below the system set and the anchors together (4)")),
        "{crowded:?}"
    );
    refused(
        SurfaceConfig::default().with_max_sessions(0),
        "max_sessions must be at least 1",
    );
    refused(
        SurfaceConfig::default().with_idle_rounds(0),
        "idle_rounds must be at least 1",
    );
    refused(
        SurfaceConfig::default().with_working_set(64, 0),
        "working_set.max_tools (64) and working_set.max_bytes (0) must be at least 1",
    );
    refused(
        SurfaceConfig::default().with_floor_times(0, 60),
        "floor_cache_ttl_secs (0) and floor_max_age_secs (60) must be at least 1",
    );
    refused(
        SurfaceConfig::default().with_floor_times(60, 0),
        "floor_max_age_secs (0) must be at least 1",
    );
    SurfaceConfig::default()
        .with_idle_rounds(1)
        .validate()
        .expect("one idle round is fine");
}

/// An agentic allow-list that fills the round leaves no room for tools `tool_search` pages
/// in: `quiver check` names it (`agentic_crowding`).
#[test]
fn an_agentic_allow_list_that_fills_the_round_is_reported() {
    let crowded = Fixture::new(
        SurfaceConfig::default()
            .with_agentic_allow(&["t*"])
            .with_round_budget(6, 1 << 20),
        many(8),
        &[],
    );
    assert_eq!(crowded.surface.agentic_crowding(), Some((8, 2, 6)));
    let roomy = Fixture::new(
        SurfaceConfig::default()
            .with_agentic_allow(&["t0*"])
            .with_round_budget(32, 1 << 20),
        many(8),
        &[],
    );
    assert_eq!(roomy.surface.agentic_crowding(), None);
    let none = Fixture::new(SurfaceConfig::default(), many(8), &[]);
    assert_eq!(none.surface.agentic_crowding(), None);
}

/// A reconfigured surface composes the next list under its new settings and tells every
/// open session its list may have changed; settings it refuses change nothing.
#[tokio::test]
async fn a_reconfigured_surface_applies_to_the_next_list() {
    let config = SurfaceConfig::default()
        .with_anchors(&["t00"])
        .with_floor(1, 0, 100);
    let fx = Fixture::new(config.clone(), many(6), &[]);
    assert_eq!(
        line(&fx.names("s", Mode::Chat)),
        "tool_search describe_tool t00"
    );
    let mut changes = fx.surface.subscribe_changes();
    fx.surface
        .reconfigure(
            config
                .clone()
                .with_anchors(&["t00", "t04"])
                .with_floor(2, 0, 100),
        )
        .expect("valid settings");
    assert_eq!(&*changes.try_recv().expect("the open session is told"), "s");
    assert_eq!(
        line(&fx.names("s", Mode::Chat)),
        "tool_search describe_tool t00 t04"
    );
    let refused = fx.surface.reconfigure(config.with_floor(1, 5, 2));
    assert!(
        matches!(refused, Err(SurfaceError::InvalidConfig(ref why)) if why.contains("floor_min")),
        "{refused:?}"
    );
    assert_eq!(
        line(&fx.names("s", Mode::Chat)),
        "tool_search describe_tool t00 t04",
        "refused settings change nothing"
    );
}
