//! A by-hand timing check (no asserts) of `tool_search` with the semantic retriever, on the
//! livemcpbench tools copied under 19 server prefixes (10,013 tools):
//!
//! - the model's load, and the cost of embedding one query and one tool on this CPU;
//! - `Surface::tool_search` p50 with the model (query embedding included) and without;
//! - start-up over a store holding every tool's vector: the time until every tool has its
//!   vector, and how many texts were embedded meanwhile (none of the stored ones should be).
//!
//! `cargo run --release -p quiver-host --example semantic_timing -- MODEL_DIR [BENCH_DIR]`
//!
//! `BENCH_DIR` holds `livemcpbench/` and `metatool-dev/` (default: the shared benchmark
//! directory). The 10k tools share 527 texts (the server part of a name is not embedded), so
//! their vectors are computed once and handed out by text.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use quiver_contract::{CallContext, Capabilities, Envelope, Tool, ToolResult, ToolSpec};
use quiver_embed_candle::MiniLm;
use quiver_registry::{
    Catalog,
    store::{DefinitionStore, ToolDefinition, ToolType},
};
use quiver_store_sqlite::{SqliteStore, StoreOptions};
use quiver_surface::{
    MemoryUsage, Surface, SurfaceConfig, core_tools,
    search::{EmbedError, Embedder, HybridConfig, SearchIndex},
};
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

/// The model behind a memo of the tools' vectors by text, counting the texts it embeds.
#[derive(Debug)]
struct Known {
    model: Arc<MiniLm>,
    by_text: Mutex<HashMap<String, Vec<f32>>>,
    embedded: AtomicUsize,
}

impl Embedder for Known {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut known = self.by_text.lock().unwrap();
        let mut out = Vec::with_capacity(texts.len());
        for t in texts {
            match known.get(*t) {
                Some(v) => out.push(v.clone()),
                None => {
                    self.embedded.fetch_add(1, Ordering::SeqCst);
                    let v = self.model.embed(&[t])?.remove(0);
                    known.insert((*t).to_owned(), v.clone());
                    out.push(v);
                }
            }
        }
        Ok(out)
    }

    fn model_id(&self) -> &str {
        self.model.model_id()
    }
}

fn p50(times: &mut [Duration]) -> Duration {
    times.sort();
    times[(times.len() - 1) / 2]
}

fn p95(times: &mut [Duration]) -> Duration {
    times.sort();
    times[((times.len() - 1) as f64 * 0.95) as usize]
}

fn lines(path: PathBuf) -> Vec<Value> {
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn surface_over(specs: &[ToolSpec]) -> (Arc<Catalog>, Arc<Surface>) {
    let catalog = Arc::new(Catalog::new());
    let surface = Surface::new(
        catalog.clone(),
        SurfaceConfig::default(),
        Arc::new(MemoryUsage::default()),
    )
    .unwrap();
    catalog.register_all("core", core_tools(&surface));
    let tools: Vec<Arc<dyn Tool>> = specs
        .iter()
        .map(|s| Arc::new(Stub(s.clone())) as Arc<dyn Tool>)
        .collect();
    catalog.register_all("bench", tools);
    surface.resync_index();
    (catalog, surface)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model_dir = PathBuf::from(&args[0]);
    let bench = args.get(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench/toolsearch"),
        PathBuf::from,
    );
    let t = Instant::now();
    let model = Arc::new(MiniLm::load(&model_dir).expect("model loads"));
    println!("model load: {:?}", t.elapsed());

    let base: Vec<ToolSpec> = lines(bench.join("livemcpbench/tools.jsonl"))
        .into_iter()
        .map(|v| {
            ToolSpec::new(
                v["name"].as_str().unwrap_or_default(),
                v["description"].as_str().unwrap_or_default(),
            )
            .read_only()
            .with_schema(
                v.get("input_schema")
                    .cloned()
                    .unwrap_or(json!({"type": "object"})),
            )
        })
        .collect();
    let mut queries: Vec<String> = lines(bench.join("livemcpbench/queries.jsonl"))
        .into_iter()
        .filter_map(|v| v["query"].as_str().map(str::to_owned))
        .collect();
    let long = queries.len();
    queries.extend(
        lines(bench.join("metatool-dev/queries.jsonl"))
            .into_iter()
            .step_by(100)
            .filter_map(|v| v["query"].as_str().map(str::to_owned)),
    );
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

    // The tools' texts, as the index embeds them.
    let mut probe = SearchIndex::with_embedder(model.clone(), HybridConfig::default());
    for s in &base {
        probe.upsert(s);
    }
    let pending = probe.pending_vectors(usize::MAX);
    let texts: Vec<&str> = pending.iter().map(|p| p.text.as_str()).collect();
    let t = Instant::now();
    let vectors = model.embed(&texts).unwrap();
    let batch = t.elapsed();
    println!(
        "embedding {} tool texts in batches: {:?}, {:?} per tool",
        texts.len(),
        batch,
        batch / texts.len() as u32
    );
    let mut single = Vec::new();
    for text in texts.iter().take(60) {
        let t = Instant::now();
        std::hint::black_box(model.embed(&[text]).unwrap());
        single.push(t.elapsed());
    }
    println!("embedding one tool alone: p50 {:?}", p50(&mut single));
    let mut one_query = Vec::new();
    for q in &queries {
        let t = Instant::now();
        std::hint::black_box(
            quiver_surface::search::embed_query(&*model, &HybridConfig::default(), q).unwrap(),
        );
        one_query.push(t.elapsed());
    }
    let (mut long_q, mut short_q) = (one_query[..long].to_vec(), one_query[long..].to_vec());
    println!(
        "embedding one query (as tool_search does): p50 {:?}; livemcpbench tasks p50 {:?}, metatool requests p50 {:?}",
        p50(&mut one_query),
        p50(&mut long_q),
        p50(&mut short_q)
    );
    let known = Arc::new(Known {
        model: model.clone(),
        by_text: Mutex::new(texts.iter().map(|t| (*t).to_owned()).zip(vectors).collect()),
        embedded: AtomicUsize::new(0),
    });

    // tool_search over 10k tools, without and with the model.
    let (catalog, surface) = surface_over(&specs);
    let all = Capabilities::all();
    let time_search = |surface: &Surface, label: &str| {
        for q in queries.iter().take(5) {
            surface.tool_search("warm", q, None, &all);
        }
        let mut times = Vec::new();
        for (i, q) in queries.iter().enumerate() {
            let session = format!("s{i}");
            let t = Instant::now();
            std::hint::black_box(surface.tool_search(&session, q, None, &all));
            times.push(t.elapsed());
        }
        println!(
            "{label}: Surface::tool_search over {} tools: p50 {:?}, p95 {:?} ({} queries)",
            surface.index_len(),
            p50(&mut times),
            p95(&mut times),
            times.len()
        );
    };
    time_search(&surface, "lexical");
    surface.set_vector_retriever(Some((known.clone(), HybridConfig::default())));
    let t = Instant::now();
    surface.embed_pending_now();
    println!(
        "10k vectors set in {:?} ({} distinct texts embedded)",
        t.elapsed(),
        known.embedded.load(Ordering::SeqCst)
    );
    time_search(&surface, "with the model");

    // Start-up over a store holding every tool's vector.
    let dir = tempfile::tempdir().unwrap();
    let store =
        Arc::new(SqliteStore::open_with(dir.path().join("q.db"), StoreOptions::default()).unwrap());
    // The specs as the catalog holds them (it normalises schemas), so the keys are those
    // the surface's index computes.
    let held: Vec<ToolSpec> = catalog
        .tools()
        .iter()
        .map(|e| e.spec.clone())
        .filter(|s| s.name.starts_with("mcp__"))
        .collect();
    let mut keyed = SearchIndex::with_embedder(known.clone(), HybridConfig::default());
    for s in &held {
        keyed.upsert(s);
    }
    let by_name: HashMap<String, String> = keyed
        .pending_vectors(usize::MAX)
        .into_iter()
        .map(|p| (p.name, p.text))
        .collect();
    for s in &held {
        let mut def = ToolDefinition::from_spec(s, ToolType::Mcp, "mcp:x:y");
        def.embedding = Some(known.by_text.lock().unwrap()[&by_name[&s.name]].clone());
        def.embedding_key = keyed.vector_key(&s.name);
        store.put_definition(def).await.unwrap();
    }
    let before = known.embedded.load(Ordering::SeqCst);
    let t = Instant::now();
    let (_catalog, surface) = surface_over(&specs);
    let indexed = t.elapsed();
    surface.set_vector_retriever(Some((known.clone(), HybridConfig::default())));
    let _worker = surface.spawn_vector_worker(Some(store.clone()));
    let mut progress = surface.vector_progress();
    progress
        .wait_for(|p| p.total > 0 && p.ready == p.total)
        .await
        .unwrap();
    println!(
        "start-up with {} stored vectors: index built in {:?}, every tool's vector in {:?} in all; texts embedded meanwhile: {} (the built-in tools, which the store does not hold)",
        held.len(),
        indexed,
        t.elapsed(),
        known.embedded.load(Ordering::SeqCst) - before
    );
    store.close().await.unwrap();
}
