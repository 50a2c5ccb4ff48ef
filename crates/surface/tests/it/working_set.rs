//! Working sets: LRU caps, idle eviction, refresh on use, change notifications.

use std::time::Duration;

use quiver_contract::Mode;
use quiver_surface::SurfaceConfig;
use serde_json::json;

use crate::support::{Fixture, line, many};

#[test]
fn count_cap_evicts_the_least_recently_used() {
    let fx = Fixture::new(
        SurfaceConfig::default().with_working_set(3, 1 << 20),
        many(6),
        &[],
    );
    for n in ["t00", "t01", "t02"] {
        fx.surface.page_in("s", &[n]);
    }
    fx.surface.touch("s", "t00");
    let paged = fx.surface.page_in("s", &["t03"]);
    assert_eq!(paged.evicted, vec!["t01".to_owned()]);
    assert_eq!(line(&fx.surface.working_set("s")), "t03 t00 t02");
    // A batch never evicts its own members: the overflow is reported instead.
    let paged = fx.surface.page_in("s", &["t04", "t05", "t01", "t02"]);
    assert_eq!(line(&paged.exposed), "t04 t05 t02");
    assert_eq!(line(&paged.over_budget), "t01");
    // The batch's first is its newest.
    assert_eq!(line(&fx.surface.working_set("s")), "t04 t05 t02");
}

#[test]
fn byte_cap_evicts_the_least_recently_used() {
    let one = quiver_contract::ToolSpec::new("t00", "Tool number 0.")
        .read_only()
        .definition_bytes();
    let fx = Fixture::new(
        SurfaceConfig::default().with_working_set(100, 2 * one),
        many(6),
        &[],
    );
    // One batch, best first: t01 is its older member.
    fx.surface.page_in("s", &["t00", "t01"]);
    let paged = fx.surface.page_in("s", &["t02"]);
    assert_eq!(paged.evicted, vec!["t01".to_owned()]);
    assert_eq!(line(&fx.surface.working_set("s")), "t02 t00");
}

/// A progressive tool paged in lightweight and then loaded with `describe_tool` counts its
/// full size against the byte cap from then on.
#[test]
fn a_loaded_progressive_tool_counts_its_full_size() {
    let big = big_tool();
    let other = crate::support::ro("other", "Another tool.");
    let (light, full, small) = (
        big.lightweight().definition_bytes(),
        big.definition_bytes(),
        other.definition_bytes(),
    );
    let cap = full + small - 1;
    assert!(light + small <= cap, "{light} {full} {small}");
    let fx = Fixture::new(
        SurfaceConfig::default().with_working_set(10, cap),
        vec![big, other],
        &[],
    );
    fx.surface.page_in("s", &["big"]);
    let described = fx
        .surface
        .describe("s", "big", &quiver_contract::Capabilities::all());
    assert!(described.is_some());
    let paged = fx.surface.page_in("s", &["other"]);
    assert_eq!(paged.evicted, vec!["big".to_owned()], "{paged:?}");

    // Loaded past the cap itself: it cannot stay, and says so.
    let fx = Fixture::new(
        SurfaceConfig::default().with_working_set(10, full - 1),
        vec![big_tool(), crate::support::ro("other", "Another tool.")],
        &[],
    );
    fx.surface.page_in("s", &["big"]);
    let mut changes = fx.surface.subscribe_changes();
    let (_, paged) = fx
        .surface
        .describe("s", "big", &quiver_contract::Capabilities::all())
        .unwrap();
    assert_eq!(paged.over_budget, vec!["big".to_owned()], "{paged:?}");
    // It was a member: it left the set, which is a change (the client re-lists, the store
    // forgets it).
    assert_eq!(paged.evicted, vec!["big".to_owned()], "{paged:?}");
    assert_eq!(changes.try_recv().ok().as_deref(), Some("s"));
    assert!(fx.surface.working_set("s").is_empty());
}

fn big_tool() -> quiver_contract::ToolSpec {
    crate::support::ro("big", "A big tool. Many more details follow here.")
        .with_schema(json!({
            "type": "object",
            "properties": {
                "alpha": {"type": "string", "description": "x".repeat(400)},
                "beta": {"type": "string", "description": "y".repeat(400)}
            }
        }))
        .progressive()
}

/// Where no model turns are seen (`quiver serve`), each call begins a round: a tool paged
/// in and not called for more than `idle_rounds` calls leaves; a called one stays.
#[test]
fn each_call_is_a_round_where_turns_are_not_seen() {
    let fx = Fixture::new(SurfaceConfig::default().with_idle_rounds(3), many(4), &[]);
    fx.surface.page_in("s", &["t00", "t01"]);
    let mut evicted = Vec::new();
    for _ in 0..4 {
        evicted.extend(fx.surface.begin_call("s", Mode::Chat, "t01"));
        fx.surface.touch("s", "t01");
    }
    assert_eq!(evicted, vec!["t00".to_owned()]);
    assert_eq!(line(&fx.surface.working_set("s")), "t01");
    // A tool idle for long is kept by its own call: it is refreshed before the round.
    fx.surface.page_in("s", &["t02"]);
    for _ in 0..3 {
        fx.surface.begin_call("s", Mode::Chat, "t01");
    }
    assert!(fx.surface.begin_call("s", Mode::Chat, "t02").is_empty());
    assert!(fx.surface.working_set("s").contains(&"t02".to_owned()));
    // A session the surface does not hold is not made for a chat-mode call.
    assert!(
        fx.surface
            .begin_call("nobody", Mode::Chat, "t00")
            .is_empty()
    );
    assert!(!fx.surface.session_keys().contains(&"nobody".to_owned()));
}

/// A `tool_search` reports the tools its own call's round evicted as idle, with those its
/// page-in pushed out: all of them left the list.
#[test]
fn a_search_reports_the_idle_tools_its_round_evicted() {
    let fx = Fixture::new(SurfaceConfig::default().with_idle_rounds(1), many(4), &[]);
    fx.surface.page_in("s", &["t00"]);
    assert!(
        fx.surface
            .begin_call("s", Mode::Chat, "tool_search")
            .is_empty()
    );
    assert_eq!(
        fx.surface.begin_call("s", Mode::Chat, "tool_search"),
        vec!["t00".to_owned()]
    );
    let found = fx
        .surface
        .tool_search("s", "t01", Some(1), &quiver_contract::Capabilities::all());
    assert_eq!(found.evicted, vec!["t00".to_owned()], "{found:?}");
    // Reported once: the next call's round starts afresh.
    fx.surface.begin_call("s", Mode::Chat, "tool_search");
    let again = fx
        .surface
        .tool_search("s", "t02", Some(1), &quiver_contract::Capabilities::all());
    assert!(!again.evicted.contains(&"t00".to_owned()), "{again:?}");
}

#[test]
fn idle_tools_are_evicted_after_idle_rounds() {
    let fx = Fixture::new(SurfaceConfig::default().with_idle_rounds(2), many(4), &[]);
    fx.assemble("s", Mode::Chat);
    fx.surface.page_in("s", &["t00", "t01"]);
    // Two rounds idle: kept.
    fx.assemble("s", Mode::Chat);
    fx.surface.touch("s", "t01");
    assert_eq!(
        fx.assemble("s", Mode::Chat)
            .reason_of("t00")
            .map(|r| r.as_str()),
        Some("working_set")
    );
    // The third idle round evicts t00; t01 was used a round later.
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(line(&composed.names()), "tool_search describe_tool t01");
    assert_eq!(line(&fx.surface.working_set("s")), "t01");
}

#[tokio::test]
async fn calling_a_tool_refreshes_it_through_the_dispatcher() {
    let fx = Fixture::new(
        SurfaceConfig::default().with_working_set(3, 1 << 20),
        many(5),
        &[],
    );
    for n in ["t00", "t01", "t02"] {
        fx.surface.page_in("s", &[n]);
    }
    let e = fx.call("s", "t00", json!({})).await;
    assert!(e.is_ok(), "{e:?}");
    fx.surface.page_in("s", &["t03"]);
    assert_eq!(line(&fx.surface.working_set("s")), "t03 t00 t02");
}

#[tokio::test]
async fn working_set_changes_are_announced() {
    let fx = Fixture::new(SurfaceConfig::default(), many(3), &[]);
    let mut changes = fx.surface.subscribe_changes();
    fx.surface.page_in("s", &["t00"]);
    let got = tokio::time::timeout(Duration::from_secs(5), changes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&*got, "s");
    // A refresh is no change.
    fx.surface.page_in("s", &["t00"]);
    assert!(changes.try_recv().is_err());
}
