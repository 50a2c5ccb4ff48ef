//! `quiver floor`: the resident floor, and the used tools it leaves out for now.

use std::process::ExitCode;

use quiver_host::App;
use quiver_surface::{FloorLoad, FloorSource};

pub(crate) async fn run(app: &App, rederive: bool) -> anyhow::Result<ExitCode> {
    if rederive {
        let store = &*app.store;
        match app.surface.rederive_floor_into(store, store).await {
            FloorLoad::Unavailable(why) => {
                anyhow::bail!("the floor could not be derived: {why}")
            }
            FloorLoad::DerivedNotStored(why) => anyhow::bail!(
                "the floor was derived but not stored ({}): running servers keep theirs",
                why.unwrap_or_default()
            ),
            _ => {}
        }
    }
    let floor = app.surface.floor();
    let source = match floor.source {
        FloorSource::Fallback => {
            "the anchors and the static fallback (no used tool beyond the anchors is registered)"
        }
        _ => "derived from usage",
    };
    say!("resident floor: {} tool(s), {source}", floor.entries.len());
    for e in &floor.entries {
        let why = if e.anchor {
            "anchor".to_owned()
        } else if floor.source == FloorSource::Fallback {
            "fallback".to_owned()
        } else {
            format!("score {:.1}", e.score)
        };
        let live = if app.catalog.contains(&e.name) {
            ""
        } else {
            "  (not registered now: left off the surface)"
        };
        say!("  {:<40} {why}{live}", e.name);
    }
    // Used tools the floor leaves out because they are not registered now (an
    // upstream down): they take their slots back when they register.
    let absent: Vec<(String, f64)> = app
        .surface
        .floor_ranking()
        .into_iter()
        .filter(|(n, _)| !app.catalog.contains(n))
        .take(10)
        .collect();
    if !absent.is_empty() {
        say!("used but not registered now (left out):");
        for (name, score) in absent {
            say!("  {name:<40} score {score:.1}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
