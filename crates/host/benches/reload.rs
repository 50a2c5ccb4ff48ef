//! A reload of a running server's configuration with a 1,000-tool catalog directory
//! (issue 39's target: ≤ 200 ms): `Reloader::reload` after one definition file changed (the
//! whole directory read and checked again, the changed tool re-registered), and after
//! nothing changed (the fingerprints only). The definitions are skill-kind tools over one
//! skill, so no upstream server is involved.

use std::{hint::black_box, path::Path};

use criterion::{Criterion, criterion_group, criterion_main};

const TOOLS: usize = 1_000;

fn definition(i: usize, round: usize) -> String {
    serde_json::json!({
        "name": format!("plan_step_{i:04}"),
        "description": format!("Plans step {i} of a release (revision {round}). Use it when asked to plan step {i}."),
        "input_schema": {
            "type": "object",
            "properties": {
                "version": {"type": "string", "maxLength": 20, "description": "The version."},
                "target": {"type": "string", "enum": ["staging", "prod"], "description": "Where to."}
            },
            "required": ["version", "target"]
        },
        "implementation": {"kind": "skill", "ref": "release"}
    })
    .to_string()
}

fn setup(dir: &Path) {
    let tools = dir.join("catalog/tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::create_dir_all(dir.join("catalog/skills/release")).unwrap();
    std::fs::write(
        dir.join("catalog/skills/release/SKILL.md"),
        "---\nname: release\ndescription: Ships a release. Use when asked to ship.\n---\nShip $1 to $2.\n",
    )
    .unwrap();
    for i in 0..TOOLS {
        std::fs::write(tools.join(format!("step_{i:04}.json")), definition(i, 0)).unwrap();
    }
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[store]\npath = \"{}\"\n\n[catalog]\ndir = \"catalog\"\n",
            dir.join("q.db").display()
        ),
    )
    .unwrap();
}

fn reload(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let file = dir.path().join("quiver.toml");
    let (config, _) = quiver_host::Config::load(Some(&file)).unwrap();
    let app = runtime
        .block_on(quiver_host::App::build(&config, &[]))
        .unwrap();
    assert!(
        app.catalog.lookup("plan_step_0999").is_some(),
        "the catalog loaded"
    );
    let reloader = app.reloader(&config);
    let mut group = c.benchmark_group("reload");
    group.sample_size(20);
    let mut round = 0;
    group.bench_function("catalog_dir_1000_one_file_changed", |b| {
        b.iter(|| {
            round += 1;
            std::fs::write(
                dir.path().join("catalog/tools/step_0500.json"),
                definition(500, round),
            )
            .unwrap();
            let report = runtime.block_on(reloader.reload("bench")).unwrap();
            assert_eq!(report["catalog"]["served"][0], "plan_step_0500", "{report}");
            black_box(report)
        })
    });
    group.bench_function("catalog_dir_1000_nothing_changed", |b| {
        b.iter(|| {
            let report = runtime.block_on(reloader.reload("bench")).unwrap();
            assert!(report["catalog"].is_null(), "{report}");
            black_box(report)
        })
    });
    group.finish();
    runtime.block_on(app.shutdown()).unwrap();
}

criterion_group!(benches, reload);
criterion_main!(benches);
