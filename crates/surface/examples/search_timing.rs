//! A by-hand timing check of the search index (no asserts): builds a synthetic catalog of
//! 10,000 tools and prints the median and 95th-percentile times of `search` and `upsert`.
//!
//! `cargo run --release -p quiver-surface --example search_timing`

use std::time::{Duration, Instant};

use quiver_contract::ToolSpec;
use quiver_surface::search::SearchIndex;
use serde_json::json;

const WORDS: &[&str] = &[
    "file",
    "read",
    "write",
    "list",
    "search",
    "fetch",
    "web",
    "page",
    "stock",
    "price",
    "chart",
    "map",
    "route",
    "weather",
    "city",
    "user",
    "issue",
    "commit",
    "branch",
    "image",
    "audio",
    "video",
    "pdf",
    "document",
    "slide",
    "table",
    "sheet",
    "cell",
    "email",
    "calendar",
    "event",
    "task",
    "note",
    "memory",
    "graph",
    "node",
    "edge",
    "query",
    "database",
    "record",
    "report",
    "summary",
    "translate",
    "text",
    "token",
    "price",
    "order",
    "invoice",
    "ticket",
    "train",
    "flight",
    "hotel",
    "news",
    "trend",
    "paper",
    "article",
    "code",
    "repo",
    "package",
    "version",
    "container",
    "process",
    "server",
    "log",
    "metric",
    "alert",
    "deploy",
    "build",
    "test",
];

/// A small deterministic generator (xorshift), so runs are comparable. `tail` words come
/// from a long-tailed vocabulary (`vocab<k>`, k Zipf-like up to 5000) instead of the 70 common
/// words; 0 makes every word common, the worst case for posting-list lengths.
struct Rng(u64, &'static [String], usize);

impl Rng {
    fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 as usize
    }

    fn word(&mut self) -> &'static str {
        if self.next() % 100 < self.2 {
            let tail = self.1;
            // k = 5000^u: small ids are frequent, large ones rare.
            let u = (self.next() % 10_000) as f64 / 10_000.0;
            let k = (tail.len() as f64).powf(u) as usize - 1;
            return &tail[k.min(tail.len() - 1)];
        }
        WORDS[self.next() % WORDS.len()]
    }

    fn sentence(&mut self, n: usize) -> String {
        (0..n).map(|_| self.word()).collect::<Vec<_>>().join(" ")
    }
}

fn tool(rng: &mut Rng, i: usize) -> ToolSpec {
    let name = format!("mcp__server{}__{}_{}_{i}", i % 300, rng.word(), rng.word());
    let description = format!("{}. {}.", rng.sentence(12), rng.sentence(10));
    let schema = json!({
        "type": "object",
        "properties": {
            rng.word(): {"type": "string", "description": rng.sentence(6)},
            format!("{}_{}", rng.word(), rng.word()): {"type": "integer", "description": rng.sentence(5)},
        }
    });
    ToolSpec::new(name, description).with_schema(schema)
}

fn percentile(times: &mut [Duration], p: f64) -> Duration {
    times.sort();
    times[((times.len() - 1) as f64 * p) as usize]
}

fn main() {
    let tail: &'static [String] = Vec::leak((0..5000).map(|k| format!("vocab{k}x")).collect());
    for (label, tail_share) in [
        ("realistic: 60% long-tail words", 60),
        ("dense: 70 words only", 0),
    ] {
        println!("-- catalog {label}");
        run(Rng(0x9E37_79B9_7F4A_7C15, tail, tail_share));
    }
}

fn run(mut rng: Rng) {
    let specs: Vec<ToolSpec> = (0..10_000).map(|i| tool(&mut rng, i)).collect();

    let started = Instant::now();
    let mut index = SearchIndex::new();
    for spec in &specs {
        index.upsert(spec);
    }
    println!("built {} tools in {:?}", index.len(), started.elapsed());

    let queries: Vec<String> = (0..500)
        .map(|i| match i % 4 {
            0 => rng.sentence(3),
            1 => format!(
                "please {} the {} for my {}",
                rng.word(),
                rng.word(),
                rng.word()
            ),
            2 => format!("{} {}", &rng.word()[..3.min(rng.word().len())], rng.word()),
            _ => format!(
                "I need to {} a {} and then {} the {} into /root/out/{}.md",
                rng.word(),
                rng.word(),
                rng.word(),
                rng.word(),
                rng.word()
            ),
        })
        .collect();
    let mut times = Vec::with_capacity(queries.len());
    let mut found = 0;
    for q in &queries {
        let t = Instant::now();
        let hits = index.search(q, 10, &|_| true);
        times.push(t.elapsed());
        found += hits.len();
    }
    println!(
        "search (10k tools, {} queries, {found} hits): p50 {:?}, p95 {:?}",
        queries.len(),
        percentile(&mut times, 0.5),
        percentile(&mut times, 0.95)
    );

    let mut times = Vec::new();
    for i in 0..1_000 {
        let spec = tool(&mut rng, (i * 7) % specs.len());
        let spec = ToolSpec::new(specs[(i * 7) % specs.len()].name.clone(), spec.description)
            .with_schema(spec.input_schema);
        let t = Instant::now();
        index.upsert(&spec);
        times.push(t.elapsed());
    }
    println!(
        "upsert (replace one of 10k): p50 {:?}, p95 {:?}",
        percentile(&mut times, 0.5),
        percentile(&mut times, 0.95)
    );
}
