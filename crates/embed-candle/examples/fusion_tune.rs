//! Tunes the fusion of the vector ranking into the lexical one (`search::HybridConfig`) on
//! the two tuning sets together, with the real model.
//!
//! ```text
//! cargo run --release -p quiver-embed-candle --example fusion_tune -- MODEL_DIR BENCH_DIR [grid|default]
//! ```
//!
//! `BENCH_DIR` holds `livemcpbench/` and `metatool-dev/`. Every text's vector is kept in
//! `$TMPDIR/quiver-fusion-cache-<model id>.bin` (the first run embeds about 12k texts), so a
//! sweep only ranks. Prints one JSON line per setting: both sets' metrics, and `vector` (the
//! model alone) and `lexical` first.

use std::{
    collections::HashMap,
    io::{Read, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use quiver_embed_candle::MiniLm;
use quiver_surface::search::{EmbedError, Embedder, HybridConfig, evaluate_with, query_texts};

/// The model behind a cache of every text it embedded.
#[derive(Debug)]
struct Memo {
    inner: MiniLm,
    cache: Mutex<HashMap<String, Vec<f32>>>,
}

impl Embedder for Memo {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let missing: Vec<&str> = {
            let cache = self.cache.lock().unwrap();
            let mut m: Vec<&str> = texts
                .iter()
                .copied()
                .filter(|t| !cache.contains_key(*t))
                .collect();
            m.sort_unstable();
            m.dedup();
            m
        };
        if !missing.is_empty() {
            let vs = self.inner.embed(&missing)?;
            let mut cache = self.cache.lock().unwrap();
            for (t, v) in missing.into_iter().zip(vs) {
                cache.insert(t.to_owned(), v);
            }
        }
        let cache = self.cache.lock().unwrap();
        Ok(texts.iter().map(|t| cache[*t].clone()).collect())
    }

    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
}

fn cache_path(id: &str) -> PathBuf {
    std::env::temp_dir().join(format!("quiver-fusion-cache-{}.bin", id.replace('@', "-")))
}

fn load_cache(path: &Path) -> HashMap<String, Vec<f32>> {
    let mut out = HashMap::new();
    let Ok(mut f) = std::fs::File::open(path) else {
        return out;
    };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap();
    let mut at = 0;
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize;
    while at < buf.len() {
        let tl = u32_at(&buf, at);
        let text = String::from_utf8(buf[at + 4..at + 4 + tl].to_vec()).unwrap();
        at += 4 + tl;
        let n = u32_at(&buf, at);
        at += 4;
        let v = buf[at..at + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        at += 4 * n;
        out.insert(text, v);
    }
    out
}

fn save_cache(path: &Path, cache: &HashMap<String, Vec<f32>>) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for (t, v) in cache {
        f.write_all(&(t.len() as u32).to_le_bytes()).unwrap();
        f.write_all(t.as_bytes()).unwrap();
        f.write_all(&(v.len() as u32).to_le_bytes()).unwrap();
        for x in v {
            f.write_all(&x.to_le_bytes()).unwrap();
        }
    }
}

struct Set {
    name: &'static str,
    tools: String,
    queries: String,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = MiniLm::load(Path::new(&args[1])).expect("model loads");
    let bench = PathBuf::from(&args[2]);
    let mode = args.get(3).map_or("grid", String::as_str);
    let path = cache_path(model.model_id());
    let memo = Arc::new(Memo {
        cache: Mutex::new(load_cache(&path)),
        inner: model,
    });
    let sets: Vec<Set> = ["metatool-dev", "livemcpbench"]
        .into_iter()
        .map(|name| Set {
            name,
            tools: std::fs::read_to_string(bench.join(name).join("tools.jsonl")).unwrap(),
            queries: std::fs::read_to_string(bench.join(name).join("queries.jsonl")).unwrap(),
        })
        .collect();
    // Warm the cache with every query text in batches (a search embeds one at a time).
    let warm = HybridConfig {
        clause_weight: 1.0,
        ..HybridConfig::default()
    };
    let before = memo.cache.lock().unwrap().len();
    for set in &sets {
        let texts: Vec<String> = set
            .queries
            .lines()
            .filter(|l| !l.trim().is_empty())
            .flat_map(|l| {
                let q: serde_json::Value = serde_json::from_str(l).unwrap();
                let q = q["query"].as_str().unwrap().to_owned();
                query_texts(&warm, &q)
                    .into_iter()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        for chunk in texts.chunks(256) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            memo.embed(&refs).unwrap();
        }
    }
    let report =
        |config: Option<HybridConfig>| -> Vec<serde_json::Value> {
            sets.iter()
            .map(|s| {
                let r = evaluate_with(
                    &s.tools,
                    &s.queries,
                    config.clone().map(|c| (memo.clone() as Arc<dyn Embedder>, c)),
                )
                .unwrap();
                serde_json::json!({"set": s.name, "hit@1": r.hit_at_1, "recall@5": r.recall_at_5,
                    "recall@10": r.recall_at_10, "ndcg@10": r.ndcg_at_10})
            })
            .collect()
        };
    let print = |label: &str, config: Option<HybridConfig>| {
        let r = report(config);
        println!("{}", serde_json::json!({"setting": label, "results": r}));
    };
    print("lexical", None);
    if memo.cache.lock().unwrap().len() != before {
        save_cache(&path, &memo.cache.lock().unwrap());
    }
    print(
        "vector",
        Some(HybridConfig {
            short_weight: 1.0,
            long_weight: 1.0,
            clause_weight: 0.0,
            exact_names: false,
            ..HybridConfig::default()
        }),
    );
    print("default", Some(HybridConfig::default()));
    if mode == "default" {
        save_cache(&path, &memo.cache.lock().unwrap());
        return;
    }
    let grid: Vec<(f64, f64, usize, usize, f64)> = std::env::var("GRID")
        .ok()
        .map(|g| serde_json::from_str(&g).unwrap())
        .unwrap_or_default();
    for (short, long, st, lt, cw) in grid {
        let c = HybridConfig {
            short_weight: short,
            long_weight: long,
            short_terms: st,
            long_terms: lt,
            clause_weight: cw,
            ..HybridConfig::default()
        };
        print(&format!("{short} {long} {st} {lt} {cw}"), Some(c));
    }
    save_cache(&path, &memo.cache.lock().unwrap());
}
