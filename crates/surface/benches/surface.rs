//! The surface over a 10k-tool catalog: one round's composition, one tool_search, one
//! tool's incremental index update, and an update followed by the first search.

use std::{hint::black_box, sync::Arc};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use quiver_contract::{CallContext, Capabilities, Envelope, Mode, Tool, ToolResult, ToolSpec};
use quiver_registry::Catalog;
use quiver_surface::{MemoryUsage, Surface, SurfaceConfig, core_tools, search::SearchIndex};
use serde_json::{Value, json};

const VERBS: [&str; 12] = [
    "get", "list", "create", "update", "delete", "search", "read", "write", "send", "parse",
    "convert", "sync",
];
const NOUNS: [&str; 16] = [
    "file",
    "issue",
    "message",
    "invoice",
    "calendar_event",
    "user",
    "repo",
    "ticket",
    "document",
    "spreadsheet",
    "email",
    "image",
    "table",
    "record",
    "order",
    "contact",
];

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

fn spec(i: usize) -> ToolSpec {
    let verb = VERBS[i % VERBS.len()];
    let noun = NOUNS[(i / VERBS.len()) % NOUNS.len()];
    let server = format!("srv{}", i % 80);
    ToolSpec::new(
        format!("mcp__{server}__{verb}_{noun}_{i}"),
        format!(
            "{verb} a {noun} in {server}. Use it when the user asks to {verb} {noun}s; returns the {noun} as JSON."
        ),
    )
    .read_only()
    .with_schema(json!({
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": format!("The {noun} id.")},
            "limit": {"type": "integer", "description": "How many to return."}
        },
        "required": ["id"]
    }))
}

fn setup(rt: &tokio::runtime::Runtime) -> (Arc<Catalog>, Arc<Surface>) {
    let _guard = rt.enter();
    let catalog = Arc::new(Catalog::new());
    let usage = Arc::new(MemoryUsage::new(
        (0..200).map(|i| (spec(i * 7).name, [i as u64 % 13, 1, 0])),
    ));
    let config = SurfaceConfig::default().with_anchors(&[&spec(1).name, &spec(2).name]);
    let surface = Surface::new(catalog.clone(), config, usage).unwrap();
    catalog.register_all("core", core_tools(&surface));
    let tools: Vec<Arc<dyn Tool>> = (0..10_000)
        .map(|i| Arc::new(Stub(spec(i))) as Arc<dyn Tool>)
        .collect();
    catalog.register_all("test", tools);
    surface.resync_index();
    // A working set of 20 paged-in tools.
    let names: Vec<String> = (0..20).map(|i| spec(5000 + i * 3).name).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    surface.page_in("bench", &refs);
    (catalog, surface)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (catalog, surface) = setup(&rt);
    let caps = Capabilities::all();

    c.bench_function("assemble_tools_10k_chat", |b| {
        b.iter(|| black_box(surface.assemble_tools("bench", Mode::Chat, &caps).unwrap()))
    });

    let queries = [
        "send email message",
        "create calendar event",
        "parse spreadsheet",
        "list github issues",
        "convert image to png",
        "delete ticket",
        "sync contacts",
        "read invoice pdf",
    ];
    let mut q = 0usize;
    c.bench_function("tool_search_10k", |b| {
        b.iter(|| {
            q = (q + 1) % queries.len();
            black_box(surface.tool_search("search", queries[q], None, &caps))
        })
    });

    let mut index = SearchIndex::new();
    for i in 0..10_000 {
        index.upsert(&spec(i));
    }
    let mut q = 0usize;
    c.bench_function("index_search_unfiltered_10k", |b| {
        b.iter(|| {
            q = (q + 1) % queries.len();
            black_box(index.search(queries[q], 8, &|_| true))
        })
    });

    let mut n = 0usize;
    c.bench_function("index_upsert_one_10k", |b| {
        b.iter(|| {
            n = (n + 1) % 10_000;
            index.upsert(black_box(&spec(n)));
        })
    });

    // An upsert invalidates nothing a search has to rebuild: the first search after it
    // costs what any search does.
    let mut n = 0usize;
    let mut q = 0usize;
    c.bench_function("index_upsert_then_first_search_10k", |b| {
        b.iter(|| {
            n = (n + 1) % 10_000;
            q = (q + 1) % queries.len();
            index.upsert(black_box(&spec(n)));
            black_box(index.search(queries[q], 8, &|_| true))
        })
    });

    let mut m = 0usize;
    c.bench_function("catalog_upsert_to_index_10k", |b| {
        b.to_async(&rt).iter(|| {
            m = (m + 1) % 10_000;
            let tool: Arc<dyn Tool> = Arc::new(Stub(spec(m)));
            let catalog = catalog.clone();
            let mut updates = surface.index_updates();
            async move {
                updates.borrow_and_update();
                catalog.upsert_in("test", tool).unwrap();
                updates.changed().await.unwrap();
            }
        })
    });
}

/// The real livemcpbench tools (527, from the shared benchmark directory) copied under 19
/// server prefixes (~10k tools), searched with the set's real task queries.
fn bench_real(c: &mut Criterion) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/bench/toolsearch/livemcpbench");
    let (Ok(tools), Ok(queries)) = (
        std::fs::read_to_string(dir.join("tools.jsonl")),
        std::fs::read_to_string(dir.join("queries.jsonl")),
    ) else {
        eprintln!("livemcpbench set not found at {}; skipped", dir.display());
        return;
    };
    let base: Vec<ToolSpec> = tools
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
    let queries: Vec<String> = queries
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["query"].as_str().map(str::to_owned))
        .collect();
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
    let mut copies: Vec<Arc<dyn Tool>> = Vec::new();
    for k in 0..19 {
        for spec in &base {
            let mut spec = spec.clone();
            let (server, tool) = spec.name.split_once("__").unwrap_or(("x", &spec.name));
            let server: String = server
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            spec.name = format!("mcp__c{k}_{server}__{tool}");
            copies.push(Arc::new(Stub(spec)));
        }
    }
    let mut raw = SearchIndex::new();
    for t in &copies {
        raw.upsert(t.spec());
    }
    let report = catalog.register_all("test", copies);
    if let Some(s) = report.skipped.first() {
        eprintln!("first skipped: {} ({})", s.name, s.reason);
    }
    surface.resync_index();
    eprintln!(
        "livemcpbench x19: {} tools indexed ({} skipped), {} queries",
        surface.index_len(),
        report.skipped.len(),
        queries.len()
    );
    let caps = Capabilities::all();
    let mut q = 0usize;
    c.bench_function("tool_search_livemcpbench_x19", |b| {
        b.iter(|| {
            q = (q + 1) % queries.len();
            black_box(surface.tool_search("search", &queries[q], None, &caps))
        })
    });
    let mut q = 0usize;
    c.bench_function("index_search_unfiltered_livemcpbench_x19", |b| {
        b.iter(|| {
            q = (q + 1) % queries.len();
            black_box(raw.search(&queries[q], 8, &|_| true))
        })
    });
    let specs: Vec<ToolSpec> = (0..raw.len())
        .step_by(37)
        .filter_map(|i| {
            let k = i / base.len();
            let spec = base.get(i % base.len())?;
            let (server, tool) = spec.name.split_once("__").unwrap_or(("x", &spec.name));
            let server: String = server
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let mut spec = spec.clone();
            spec.name = format!("mcp__c{k}_{server}__{tool}");
            Some(spec)
        })
        .collect();
    let mut n = 0usize;
    c.bench_function("index_upsert_one_livemcpbench_x19", |b| {
        b.iter(|| {
            n = (n + 1) % specs.len();
            raw.upsert(black_box(&specs[n]));
        })
    });
    let mut n = 0usize;
    let mut q = 0usize;
    c.bench_function("index_upsert_then_first_search_livemcpbench_x19", |b| {
        b.iter(|| {
            n = (n + 1) % specs.len();
            q = (q + 1) % queries.len();
            raw.upsert(black_box(&specs[n]));
            black_box(raw.search(&queries[q], 8, &|_| true))
        })
    });
}

criterion_group!(benches, bench, bench_real);
criterion_main!(benches);
