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

/// An agentic-only tool is never listed where the floor is (chat, delegate, plan): usage
/// does not spend a floor slot on it either, the next tool takes it.
#[test]
fn the_floor_leaves_agentic_only_tools_out() {
    let config = SurfaceConfig::default()
        .with_agentic_only(&["t0*"])
        .with_floor(2, 0, 100);
    let fx = Fixture::new(
        config,
        many(15),
        &[("t01", [9, 0, 0]), ("t11", [2, 0, 0]), ("t12", [1, 0, 0])],
    );
    assert_eq!(line(&fx.surface.floor().names()), "t11 t12");
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(line(&composed.names()), "tool_search describe_tool t11 t12");
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
async fn floor_stands_while_young_then_rederived_and_falls_back_without_usage() {
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

    // Usage arrives; without a store, the floor derived in memory stands while young.
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
    // An anchor is configured, not derived: missing from the catalog, it stays in the floor
    // and the composition skips it.
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(
        line(&composed.names()),
        "tool_search describe_tool t00 t01 t02"
    );
    assert_eq!(composed.dropped_why("gone_anchor"), Some(DropReason::Stale));
}

/// The usage ranking outlives the catalog's changes: a used tool that leaves (its upstream
/// went down, or had not connected when the floor was derived) gives its slot to the next
/// one, and takes it back when it registers again, without a new derivation.
#[test]
fn the_floor_follows_the_catalog_without_a_new_derivation() {
    let config = SurfaceConfig::default().with_floor(2, 0, 100);
    let usage = [("t01", [3, 0, 0]), ("t02", [2, 0, 0]), ("t03", [1, 0, 0])];
    let fx = Fixture::new(config, many(5), &usage);
    fx.catalog.remove("t01");
    assert_eq!(line(&fx.surface.floor().names()), "t02 t03");
    // Usage changes now would only show after a new derivation.
    fx.usage.set("t04", [9, 0, 0]);
    fx.catalog
        .register_in(
            "test",
            crate::support::stub(crate::support::ro("t01", "Tool number 1.")),
        )
        .unwrap();
    assert_eq!(line(&fx.surface.floor().names()), "t01 t02");
    let composed = fx.assemble("s", Mode::Chat);
    assert_eq!(line(&composed.names()), "tool_search describe_tool t01 t02");
    assert_eq!(line(&fx.surface.rederive_floor().names()), "t04 t01");
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
    let config = SurfaceConfig::default().with_floor(30, 2, 3);
    // Usage recorded for one tool only: a floor of one, below the band, as full as the
    // usage allows (a young install fills it as tools are used): no warning.
    let small = Fixture::new(config.clone(), many(10), &[("t01", [1, 0, 0])]);
    let out = logs(|| {
        small.surface.rederive_floor();
    });
    assert_eq!(small.surface.floor().entries.len(), 1);
    assert!(out.is_empty(), "{out}");
    // Below the band because the settings disagree: a warning naming why.
    let low = Fixture::new(
        SurfaceConfig::default().with_floor(1, 2, 3),
        many(10),
        &[("t01", [1, 0, 0]), ("t02", [1, 0, 0])],
    );
    let out = logs(|| {
        low.surface.rederive_floor();
    });
    assert!(
        out.contains("the resident floor has 1 tool(s), outside [surface] floor_min..floor_max (2..3): target_floor (1) is below floor_min")
            && out.contains("set floor_min, floor_max or target_floor"),
        "{out}"
    );
    let usage: Vec<(String, [u64; 3])> = (1..10).map(|i| (format!("t{i:02}"), [1, 0, 0])).collect();
    let rows: Vec<(&str, [u64; 3])> = usage.iter().map(|(n, b)| (n.as_str(), *b)).collect();
    let large = Fixture::new(config.clone(), many(10), &rows);
    let out = logs(|| {
        large.surface.rederive_floor();
    });
    assert!(
        out.contains("has 9 tool(s)") && out.contains("target_floor (30) is above floor_max"),
        "{out}"
    );
    let fine = Fixture::new(config.clone().with_floor(3, 2, 3), many(10), &rows);
    assert_eq!(
        logs(|| {
            fine.surface.rederive_floor();
        }),
        ""
    );
    // A fresh install (no usage yet) has the floor it configured, anchors or none: no
    // warning on every start (the README's example has one anchor).
    for fresh in [
        Fixture::new(SurfaceConfig::default(), many(10), &[]),
        Fixture::new(
            SurfaceConfig::default().with_anchors(&["t00"]),
            many(10),
            &[],
        ),
    ] {
        assert_eq!(
            logs(|| {
                fresh.surface.rederive_floor();
            }),
            ""
        );
    }
}

/// A usage source that cannot be read.
struct BrokenUsage;

#[async_trait::async_trait]
impl quiver_surface::ports::UsageSource for BrokenUsage {
    async fn usage(
        &self,
        _now: std::time::SystemTime,
    ) -> Result<Vec<quiver_surface::ports::ToolUsage>, quiver_registry::store::StoreError> {
        Err(quiver_registry::store::StoreError::Unavailable {
            location: "test".to_owned(),
            cause: "no usage here".to_owned(),
        })
    }
}

/// With a store, the derived floor is stored (key `tool_surface_tier0_v1`): the first
/// process derives it from the store's usage and writes it, another reads it back; a value
/// that is not valid is derived again; with nothing valid and no usage the floor is the
/// static fallback. The in-memory usage the surface was built with plays no part.
#[tokio::test]
async fn the_floor_is_stored_and_read_back() {
    use quiver_surface::{
        FloorLoad,
        ports::{MemorySessionStore, MemoryUsage, SessionStore, TIER0_KEY},
    };
    let store = MemorySessionStore::default();
    let usage = MemoryUsage::new();
    let now = std::time::SystemTime::now();
    // The log also has calls of names no tool can have: not ranked.
    for tool in ["t01", "t01", "t02", "tool_search", "", "bad name!"] {
        usage.add(tool, now);
    }
    let config = SurfaceConfig::default()
        .with_anchors(&["t00"])
        .with_fallback(&["t09"])
        .with_floor(5, 0, 100);
    // The surfaces' own usage would put t05 first: a store-backed floor ignores it.
    let stale = [("t05", [9, 0, 0])];
    let first = Fixture::new(config.clone(), many(10), &stale);
    assert_eq!(
        first.surface.load_floor(&store, &usage, true).await,
        FloorLoad::Derived
    );
    assert_eq!(line(&first.surface.floor().names()), "t00 t01 t02");
    let stored = store.state(TIER0_KEY).await.unwrap().expect("stored");
    let ranked: Vec<&str> = stored.value["ranked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    // The ranking is stored whole (the system set is left out when it is resolved).
    assert_eq!(ranked, ["t01", "t02", "tool_search"]);

    // Another process reads it back: its usage source is not even readable.
    let second = Fixture::new(config.clone(), many(10), &stale);
    assert_eq!(
        second.surface.load_floor(&store, &BrokenUsage, true).await,
        FloorLoad::Read
    );
    assert_eq!(line(&second.surface.floor().names()), "t00 t01 t02");

    // A stored value this build cannot read is derived again and overwritten.
    store
        .put_state(TIER0_KEY, serde_json::json!({"version": 99}))
        .await
        .unwrap();
    let third = Fixture::new(config.clone(), many(10), &stale);
    assert_eq!(
        third.surface.load_floor(&store, &usage, true).await,
        FloorLoad::Derived
    );
    assert_eq!(line(&third.surface.floor().names()), "t00 t01 t02");
    assert_eq!(
        store.state(TIER0_KEY).await.unwrap().unwrap().value["version"],
        1
    );

    // A ranking stored by a build that ranked every logged name: the bad names are left
    // out, not the ranking.
    store
        .put_state(
            TIER0_KEY,
            serde_json::json!({"version": 1, "derived_at_ms": 1_u64 << 50, "ranked": [
                {"name": "", "score": 9.0}, {"name": "t03", "score": 2.0}
            ]}),
        )
        .await
        .unwrap();
    let old = Fixture::new(config.clone(), many(10), &stale);
    assert_eq!(
        old.surface.load_floor(&store, &BrokenUsage, true).await,
        FloorLoad::Read
    );
    assert_eq!(line(&old.surface.floor().names()), "t00 t03");

    // A read-only command derives without writing.
    let empty = MemorySessionStore::default();
    let reader = Fixture::new(config.clone(), many(10), &stale);
    assert_eq!(
        reader.surface.load_floor(&empty, &usage, false).await,
        FloorLoad::DerivedNotStored(None)
    );
    assert_eq!(line(&reader.surface.floor().names()), "t00 t01 t02");
    assert!(empty.state(TIER0_KEY).await.unwrap().is_none());

    // Nothing valid stored and no usage to derive from: the static fallback.
    let empty = MemorySessionStore::default();
    let fourth = Fixture::new(config, many(10), &stale);
    assert!(matches!(
        fourth.surface.load_floor(&empty, &BrokenUsage, true).await,
        FloorLoad::Unavailable(why) if why.contains("no usage here")
    ));
    let floor = fourth.surface.floor();
    assert_eq!(floor.source, FloorSource::Fallback);
    assert_eq!(line(&floor.names()), "t00 t09");
}

/// The keeper re-reads the stored floor every `floor_cache_ttl_secs` (another replica may
/// have written a newer one) and re-derives it from usage once it is older than
/// `floor_max_age_secs`; a ranking too short to fill the floor, after ten TTLs.
#[tokio::test(start_paused = true)]
async fn the_floor_keeper_rereads_and_rederives_on_schedule() {
    use quiver_surface::ports::{MemorySessionStore, MemoryUsage};
    use std::sync::Arc;
    let store = Arc::new(MemorySessionStore::default());
    let usage = Arc::new(MemoryUsage::new());
    let now = std::time::SystemTime::now();
    let calls = |tool: &str, n: usize| {
        for _ in 0..n {
            usage.add(tool, now);
        }
    };
    calls("t01", 1);
    calls("t02", 2);
    let config = SurfaceConfig::default()
        .with_floor(2, 0, 100)
        .with_floor_times(60, 3600);
    let a = Fixture::new(config.clone(), many(10), &[]);
    a.surface.load_floor(&*store, &*usage, true).await;
    let b = Fixture::new(config, many(10), &[]);
    b.surface.load_floor(&*store, &*usage, true).await;
    let _keeper = b.surface.spawn_floor_keeper(store.clone(), usage.clone());
    settle().await;
    assert_eq!(line(&b.surface.floor().names()), "t02 t01");

    // Replica `a` re-derives on command after t01 got busy: `b` reads it within the TTL.
    calls("t01", 3);
    a.surface.rederive_floor_into(&*store, &*usage).await;
    assert_eq!(
        line(&b.surface.floor().names()),
        "t02 t01",
        "cached until the TTL"
    );
    advance(Duration::from_secs(61)).await;
    settle().await;
    assert_eq!(line(&b.surface.floor().names()), "t01 t02");

    // Nobody re-derives: once the stored floor is older than the max age, the keeper does.
    calls("t03", 9);
    advance(Duration::from_secs(1800)).await;
    settle().await;
    assert_eq!(line(&b.surface.floor().names()), "t01 t02");
    advance(Duration::from_secs(1900)).await;
    settle().await;
    assert_eq!(line(&b.surface.floor().names()), "t03 t01");

    // A new install: no usage yet, so the empty ranking is derived again after ten TTLs,
    // not after the max age.
    let store = Arc::new(MemorySessionStore::default());
    let usage = Arc::new(MemoryUsage::new());
    let young = Fixture::new(
        SurfaceConfig::default()
            .with_floor(5, 0, 100)
            .with_floor_times(60, 3600),
        many(10),
        &[],
    );
    young.surface.load_floor(&*store, &*usage, true).await;
    let _keeper = young
        .surface
        .spawn_floor_keeper(store.clone(), usage.clone());
    settle().await;
    usage.add("t06", now);
    advance(Duration::from_secs(60 * 5)).await;
    settle().await;
    assert_eq!(line(&young.surface.floor().names()), "");
    advance(Duration::from_secs(60 * 6)).await;
    settle().await;
    assert_eq!(line(&young.surface.floor().names()), "t06");
    // From then on, the max age: more usage shows after it only.
    usage.add("t07", now);
    usage.add("t07", now);
    advance(Duration::from_secs(60 * 11)).await;
    settle().await;
    assert_eq!(line(&young.surface.floor().names()), "t06");
}

/// Lets spawned tasks run what they can without the (paused) clock moving.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}
