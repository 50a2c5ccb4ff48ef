//! What an operator reads of a session: the same list its model is given, read without
//! changing the session; and the modes that list a tool.

use std::sync::Arc;

use quiver_contract::{Capabilities, Mode, ToolSpec};
use quiver_surface::{SessionClient, SurfaceConfig};

use crate::support::{Fixture, line, many, ro, rw};

#[test]
fn a_session_is_viewed_as_its_model_is_listed_and_looking_changes_nothing() {
    let fx = Fixture::new(SurfaceConfig::default(), many(4), &[]);
    assert!(fx.surface.session_view("s").unwrap().is_none());
    assert!(
        !fx.surface.holds("s"),
        "viewing a session the surface does not hold creates none"
    );

    // A token allowed only the core tools and `t01`.
    let caps = Arc::new(Capabilities::all().with_allowed_tools(vec![
        "tool_search".into(),
        "describe_tool".into(),
        "t01".into(),
    ]));
    fx.surface.page_in("s", &["t00", "t01"]);
    let listed = fx.surface.compose("s", Mode::Plan, &caps).unwrap();
    fx.surface.note_client(
        "s",
        SessionClient::new(
            Some("ci".into()),
            Some("2025-06-18 (session era)".into()),
            caps.clone(),
        ),
    );

    let view = fx.surface.session_view("s").unwrap().expect("held");
    assert_eq!(view.mode, Mode::Plan);
    assert_eq!(view.round, listed.round);
    let client = view.client.as_ref().expect("noted");
    assert_eq!(client.principal.as_deref(), Some("ci"));
    assert_eq!(client.protocol.as_deref(), Some("2025-06-18 (session era)"));
    assert_eq!(
        view.surface.names(),
        listed.names(),
        "the view lists what the model was listed"
    );
    assert!(view.surface.names().contains(&"t01"));
    assert!(
        view.surface
            .dropped
            .iter()
            .any(|d| d.name == "t00" && d.why.as_str() == "not_allowed"),
        "{:?}",
        view.surface.dropped
    );
    let names: Vec<&str> = view.working_set.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["t00", "t01"]);
    assert!(view.working_set.iter().all(|s| s.bytes > 0));
    assert_eq!(
        view.working_set_bytes,
        view.working_set.iter().map(|s| s.bytes).sum::<usize>()
    );

    // Looking started no round and evicted nothing.
    for _ in 0..3 {
        fx.surface.session_view("s").unwrap();
    }
    let again = fx.surface.session_view("s").unwrap().expect("held");
    assert_eq!(again.round, view.round);
    assert_eq!(line(&fx.surface.working_set("s")), "t00 t01");

    // A client is noted only for a session the surface holds.
    fx.surface
        .note_client("other", SessionClient::new(None, None, caps));
    assert!(!fx.surface.holds("other"));
}

#[test]
fn the_modes_that_list_a_tool() {
    let mut plan_only = rw("plan_step", "Records a step of the plan.");
    plan_only.plan_only = true;
    let fx = Fixture::new(
        SurfaceConfig::default()
            .with_agentic_only(&["deploy"])
            .with_unoffered(&["hidden"]),
        vec![
            ro("read_notes", "Reads the notes."),
            rw("write_notes", "Writes the notes."),
            rw("deploy", "Deploys the build."),
            plan_only,
            ToolSpec::new("hidden", "Never offered."),
        ],
        &[],
    );
    let modes = |name: &str| -> Vec<&str> {
        fx.surface
            .listing_modes(name)
            .into_iter()
            .map(Mode::as_str)
            .collect()
    };
    assert_eq!(modes("read_notes"), ["chat", "agentic", "delegate", "plan"]);
    assert_eq!(modes("write_notes"), ["chat", "agentic", "delegate"]);
    assert_eq!(modes("deploy"), ["agentic"]);
    assert_eq!(modes("plan_step"), ["plan"]);
    assert!(modes("hidden").is_empty());
    assert!(modes("no_such_tool").is_empty());
}
