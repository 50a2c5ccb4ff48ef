//! The resident floor: anchors, then usage; the cache TTL, re-derivation and the fallback.

use quiver_contract::Mode;
use quiver_surface::{DropReason, FloorSource, SurfaceConfig, usage_score};
use tokio::time::{Duration, advance};

use crate::support::{Fixture, line, many};

/// Builds a floor from `anchors` and `usage` over tools t00..t19 with `target`, and compares
/// its names with `expect`.
fn check(anchors: &[&str], usage: &[(&str, [u64; 3])], target: usize, expect: &str) {
    let config = SurfaceConfig::default()
        .with_anchors(anchors)
        .with_floor(target, 0, 100);
    let fx = Fixture::new(config, many(20), usage);
    let floor = fx.surface.floor();
    assert_eq!(
        line(&floor.names()),
        expect,
        "anchors {anchors:?} usage {usage:?}"
    );
}

/// The system set (`tool_search`, `describe_tool`, configured system tools) is resident
/// anyway and usually the most called: usage never spends a floor slot on it.
#[test]
fn the_floor_leaves_the_system_set_out() {
    let config = SurfaceConfig::default()
        .with_system(&["t04"])
        .with_floor(2, 0, 100);
    let fx = Fixture::new(
        config,
        many(6),
        &[
            ("tool_search", [50, 0, 0]),
            ("describe_tool", [40, 0, 0]),
            ("t04", [30, 0, 0]),
            ("t01", [2, 0, 0]),
            ("t02", [1, 0, 0]),
        ],
    );
    assert_eq!(line(&fx.surface.floor().names()), "t01 t02");
}

#[test]
fn floor_fills_from_anchors_then_usage() {
    // Anchors first, in order, even without usage.
    check(&["t05", "t01"], &[], 4, "t05 t01");
    // Usage by weighted score: recent 3.0, middle 1.0, old 0.2.
    check(
        &[],
        &[("t01", [0, 0, 5]), ("t02", [1, 0, 0]), ("t03", [0, 2, 0])],
        10,
        "t02 t03 t01",
    );
    // Anchors count towards the target; an anchor's usage does not repeat it.
    check(
        &["t09"],
        &[("t09", [9, 0, 0]), ("t01", [1, 0, 0]), ("t02", [2, 0, 0])],
        2,
        "t09 t02",
    );
    // Ties by name; unused tools never enter; unknown names are skipped, the walk goes on.
    check(
        &[],
        &[
            ("t04", [1, 0, 0]),
            ("t03", [1, 0, 0]),
            ("t07", [0, 0, 0]),
            ("gone", [50, 0, 0]),
        ],
        5,
        "t03 t04",
    );
}

#[test]
fn usage_weights() {
    assert_eq!(usage_score([1, 1, 1]), 4.2);
    assert_eq!(usage_score([0, 0, 5]), 1.0);
}

#[tokio::test(start_paused = true)]
async fn floor_is_cached_then_rederived_and_falls_back_without_usage() {
    let config = SurfaceConfig::default()
        .with_anchors(&["t00"])
        .with_fallback(&["t10", "t11"])
        .with_floor(5, 0, 100)
        .with_floor_times(60, 3600);
    let fx = Fixture::new(config, many(20), &[]);
    // No usage: the static fallback after the anchors.
    let floor = fx.surface.floor();
    assert_eq!(floor.source, FloorSource::Fallback);
    assert_eq!(line(&floor.names()), "t00 t10 t11");
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(
        composed.reason_of("t10").map(|r| r.as_str()),
        Some("fallback")
    );

    // Usage arrives; reads stay cached for the TTL, and the derived floor stands while young.
    fx.usage.set("t03", [4, 0, 0]);
    advance(Duration::from_secs(30)).await;
    assert_eq!(line(&fx.surface.floor().names()), "t00 t10 t11");
    advance(Duration::from_secs(40)).await;
    assert_eq!(line(&fx.surface.floor().names()), "t00 t10 t11");

    // Re-derived on command.
    let floor = fx.surface.rederive_floor();
    assert_eq!(floor.source, FloorSource::Derived);
    assert_eq!(line(&floor.names()), "t00 t03");
    assert_eq!(line(&fx.surface.floor().names()), "t00 t03");

    // Re-derived by age.
    fx.usage.set("t04", [9, 0, 0]);
    advance(Duration::from_secs(3601)).await;
    assert_eq!(line(&fx.surface.floor().names()), "t00 t04 t03");
}

#[test]
fn stale_floor_names_are_skipped_never_emitted() {
    let config = SurfaceConfig::default()
        .with_anchors(&["gone_anchor", "t00"])
        .with_floor(5, 0, 100);
    let fx = Fixture::new(config, many(5), &[("t01", [3, 0, 0]), ("t02", [2, 0, 0])]);
    assert_eq!(line(&fx.surface.floor().names()), "gone_anchor t00 t01 t02");
    // A floor tool removed after the floor was derived.
    fx.catalog.remove("t01");
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(line(&composed.names()), "tool_search describe_tool t00 t02");
    assert_eq!(composed.dropped_why("gone_anchor"), Some(DropReason::Stale));
    assert_eq!(composed.dropped_why("t01"), Some(DropReason::Stale));
}

/// Captures what `tracing` writes while `f` runs.
fn logs(f: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
}

#[test]
fn a_floor_outside_its_band_is_a_warning() {
    let config = SurfaceConfig::default()
        .with_anchors(&["t00"])
        .with_floor(30, 2, 3);
    let small = Fixture::new(config.clone(), many(10), &[]);
    let out = logs(|| {
        small.surface.rederive_floor();
    });
    assert!(
        out.contains("outside its configured band") && out.contains("size=1"),
        "{out}"
    );
    let usage: Vec<(String, [u64; 3])> = (1..10).map(|i| (format!("t{i:02}"), [1, 0, 0])).collect();
    let rows: Vec<(&str, [u64; 3])> = usage.iter().map(|(n, b)| (n.as_str(), *b)).collect();
    let large = Fixture::new(config.clone(), many(10), &rows);
    let out = logs(|| {
        large.surface.rederive_floor();
    });
    assert!(out.contains("size=10"), "{out}");
    let fine = Fixture::new(config.with_floor(3, 2, 3), many(10), &rows);
    assert_eq!(
        logs(|| {
            fine.surface.rederive_floor();
        }),
        ""
    );
    // A fresh install (no usage, no anchors, no fallback) is expected to have no floor:
    // no warning on every start.
    let fresh = Fixture::new(SurfaceConfig::default(), many(10), &[]);
    assert_eq!(
        logs(|| {
            fresh.surface.rederive_floor();
        }),
        ""
    );
}
