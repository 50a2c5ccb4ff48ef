//! A by-hand timing check (no asserts) on the real livemcpbench tools (527, from the shared
//! benchmark directory) copied under 19 server prefixes (~10k tools), searched with the
//! set's real task queries: index search, `Surface::tool_search`, one tool's upsert, and an
//! upsert followed by the first search (which pays for any state the upsert invalidated).
//!
//! `cargo run --release -p quiver-surface --example search_real_timing -- [DIR] [ROUNDS]`
//!
//! With `HYBRID=1` it also times the index with the model-free `HashedNgrams` embedder
//! blended in (the optional embedding port): a brute-force cosine scan over every tool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use quiver_contract::{CallContext, Capabilities, Envelope, Tool, ToolResult, ToolSpec};
use quiver_registry::Catalog;
use quiver_surface::search::{HashedNgrams, HybridConfig, SearchIndex};
use quiver_surface::{MemoryUsage, Surface, SurfaceConfig, core_tools};
use serde_json::{Value, json};

struct Stub(ToolSpec);

#[async_trait]
impl Tool for Stub {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
        Ok(Envelope::text("ok"))
    }
}

fn percentile(times: &mut [Duration], p: f64) -> Duration {
    times.sort();
    times[((times.len() - 1) as f64 * p) as usize]
}

fn report(label: &str, times: &mut [Duration]) {
    println!(
        "{label}: p50 {:?}, p95 {:?} ({} runs)",
        percentile(times, 0.5),
        percentile(times, 0.95),
        times.len()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args.first().filter(|d| !d.is_empty()).map_or_else(
        || {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/bench/toolsearch/livemcpbench")
        },
        std::path::PathBuf::from,
    );
    let rounds: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5);
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(f).display()))
    };
    let base: Vec<ToolSpec> = read("tools.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            let schema = v
                .get("input_schema")
                .cloned()
                .unwrap_or(json!({"type": "object"}));
            ToolSpec::new(
                v["name"].as_str().unwrap_or_default(),
                v["description"].as_str().unwrap_or_default(),
            )
            .read_only()
            .with_schema(schema)
        })
        .collect();
    let queries: Vec<String> = read("queries.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["query"].as_str().map(str::to_owned))
        .collect();
    let mut specs = Vec::new();
    for k in 0..19 {
        for spec in &base {
            let mut spec = spec.clone();
            let (server, tool) = spec.name.split_once("__").unwrap_or(("x", &spec.name));
            let server: String = server
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            spec.name = format!("mcp__c{k}_{server}__{tool}");
            specs.push(spec);
        }
    }

    let started = Instant::now();
    let mut index = SearchIndex::new();
    for s in &specs {
        index.upsert(s);
    }
    println!(
        "built {} tools in {:?}; {} queries x {rounds} rounds",
        index.len(),
        started.elapsed(),
        queries.len()
    );
    index.search("warm up", 10, &|_| true);
    let mut times = Vec::new();
    for _ in 0..rounds {
        for q in &queries {
            let t = Instant::now();
            std::hint::black_box(index.search(q, 18, &|_| true));
            times.push(t.elapsed());
        }
    }
    report("index search (limit 18)", &mut times);
    let mut times = Vec::new();
    for _ in 0..rounds {
        for q in &queries {
            let t = Instant::now();
            std::hint::black_box(index.search(q, 8, &|_| true));
            times.push(t.elapsed());
        }
    }
    report("index search (limit 8)", &mut times);

    let mut times = Vec::new();
    let mut first = Vec::new();
    for (i, q) in queries.iter().cycle().take(300).enumerate() {
        let spec = &specs[(i * 37) % specs.len()];
        let mut spec = spec.clone();
        spec.description
            .push_str(if i % 2 == 0 { " updated" } else { "" });
        let t = Instant::now();
        index.upsert(&spec);
        times.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(index.search(q, 18, &|_| true));
        first.push(t.elapsed());
    }
    report("index upsert of one tool", &mut times);
    report("first search after that upsert", &mut first);
    let mut both: Vec<Duration> = times.iter().zip(&first).map(|(a, b)| *a + *b).collect();
    report("upsert + first search", &mut both);

    if std::env::var_os("HYBRID").is_some() {
        let started = Instant::now();
        let mut hybrid =
            SearchIndex::with_embedder(Arc::new(HashedNgrams::default()), HybridConfig::default());
        let refs: Vec<&ToolSpec> = specs.iter().collect();
        hybrid.upsert_all(&refs);
        hybrid.embed_pending();
        println!(
            "hybrid: built {} tools in {:?}",
            hybrid.len(),
            started.elapsed()
        );
        let mut times = Vec::new();
        for _ in 0..rounds {
            for q in &queries {
                let t = Instant::now();
                std::hint::black_box(hybrid.search(q, 18, &|_| true));
                times.push(t.elapsed());
            }
        }
        report("hybrid index search (limit 18)", &mut times);
        let mut times = Vec::new();
        for i in 0..300 {
            let spec = specs[(i * 37) % specs.len()].clone();
            let t = Instant::now();
            hybrid.upsert(&spec);
            times.push(t.elapsed());
        }
        report("hybrid upsert of one tool", &mut times);
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let catalog = Arc::new(Catalog::new());
    let surface = Surface::new(
        catalog.clone(),
        SurfaceConfig::default(),
        Arc::new(MemoryUsage::default()),
    )
    .unwrap();
    catalog.register_all("core", core_tools(&surface));
    let tools: Vec<Arc<dyn Tool>> = specs
        .into_iter()
        .map(|s| Arc::new(Stub(s)) as Arc<dyn Tool>)
        .collect();
    catalog.register_all("test", tools);
    surface.resync_index();
    // Let the background index sync catch up with the registrations before timing.
    std::thread::sleep(Duration::from_secs(2));
    let caps = Capabilities::all();
    for q in &queries {
        surface.tool_search("search", q, None, &caps);
    }
    let mut times = Vec::new();
    for _ in 0..rounds {
        for q in &queries {
            let t = Instant::now();
            std::hint::black_box(surface.tool_search("search", q, None, &caps));
            times.push(t.elapsed());
        }
    }
    report("Surface::tool_search", &mut times);
    // Its parts, in the state it leaves (a full working set): the filtered search alone
    // (limit 8, the default) and one compose of the session's round (tool_search walks the
    // round twice, before and after paging its hits in).
    let mut times = Vec::new();
    for _ in 0..rounds {
        for q in &queries {
            let t = Instant::now();
            std::hint::black_box(surface.search(q, 8, quiver_contract::Mode::Chat, &caps));
            times.push(t.elapsed());
        }
    }
    report("  Surface::search (limit 8, filtered)", &mut times);
    let mut times = Vec::new();
    for _ in 0..rounds * queries.len() {
        let t = Instant::now();
        std::hint::black_box(
            surface
                .compose("search", quiver_contract::Mode::Chat, &caps)
                .ok(),
        );
        times.push(t.elapsed());
    }
    report("  Surface::compose of that session", &mut times);
    // A caller with an allow-list (a token's `allowed_tools`: here the tools of every
    // tenth server and `tool_search`), whose hidden tools take no part in its ranking: the
    // filter runs on every tool that would raise its server's best.
    let mut servers: Vec<String> = Vec::new();
    for name in catalog.names() {
        if let Some((server, _)) = quiver_contract::split_mcp_name(&name)
            && !servers.iter().any(|s| s == server)
        {
            servers.push(server.to_owned());
        }
    }
    let mut allowed: Vec<String> = servers
        .iter()
        .step_by(10)
        .map(|s| format!("mcp__{s}__*"))
        .collect();
    allowed.push("tool_search".into());
    let limited = Capabilities::all().with_allowed_tools(allowed.clone());
    let mut times = Vec::new();
    for _ in 0..rounds {
        for q in &queries {
            let t = Instant::now();
            std::hint::black_box(surface.search(q, 8, quiver_contract::Mode::Chat, &limited));
            times.push(t.elapsed());
        }
    }
    report(
        &format!(
            "  Surface::search (limit 8) for an allow-list of {} patterns",
            allowed.len()
        ),
        &mut times,
    );
}
