//! What progressive disclosure saves on a real catalog: the 527 tools of livemcpbench
//! (`../shared/bench/toolsearch/livemcpbench/tools.jsonl`), each listed as a client receives
//! it (`name`, `description`, `inputSchema`, compact JSON) in full and in its lightweight
//! form, counted in o200k tokens. Run with `--nocapture` to see the figures
//! (docs/PERFORMANCE.md records them).

use quiver_contract::ToolSpec;
use quiver_registry::shape::count_tokens;
use serde_json::{Value, json};

fn listed(spec: &ToolSpec) -> String {
    json!({"name": spec.name, "description": spec.description, "inputSchema": spec.input_schema})
        .to_string()
}

#[test]
fn lightweight_listings_of_the_livemcpbench_catalog_take_fewer_tokens() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/bench/toolsearch/livemcpbench/tools.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (the shared bench data)", path.display()));
    let (mut full, mut light, mut tools, mut larger) = (0usize, 0usize, 0usize, 0usize);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let tool: Value = serde_json::from_str(line).expect("a JSON line");
        let spec = ToolSpec::new(
            tool["name"].as_str().expect("name"),
            tool["description"].as_str().unwrap_or_default(),
        )
        .with_schema(tool["input_schema"].clone());
        let f = count_tokens(&listed(&spec));
        let l = count_tokens(&listed(&spec.lightweight()));
        larger += usize::from(l > f);
        full += f;
        light += l;
        tools += 1;
    }
    let saved = full - light;
    println!(
        "livemcpbench: {tools} tools, {full} tokens listed in full, {light} lightweight: {saved} saved ({:.1}%), {larger} tool(s) larger when lightweight",
        saved as f64 * 100.0 / full as f64
    );
    assert_eq!(tools, 527);
    assert!(light < full, "full {full}, lightweight {light}");
}
