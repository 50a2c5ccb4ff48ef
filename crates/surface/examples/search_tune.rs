//! By-hand diagnosis and tuning of the search index on a benchmark set (no asserts).
//!
//! `cargo run --release -p quiver-surface --example search_tune -- [eval|diagnose|tune] [DIR]`
//!
//! `DIR` defaults to the shared `livemcpbench` set beside the clone. `eval` prints the
//! metrics, `diagnose` the top 10 of every query with the needed tools marked, `tune`
//! one-at-a-time sweeps of the ranking constants around the defaults. The search module is
//! compiled into this binary (`#[path]`), so the sweeps reach its crate-internal constants
//! without widening the library's public API.

#[path = "../src/search/mod.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod search;

use std::path::PathBuf;

use search::eval::{evaluate_ranker, parse_tools};
use search::{HashedNgrams, HybridConfig, Params, SearchIndex, query_terms};

fn all(_: &str) -> bool {
    true
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("eval", String::as_str);
    let dir = args.get(1).map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/bench/toolsearch/livemcpbench")
        },
        PathBuf::from,
    );
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(f).display()))
    };
    let (tools, queries) = (read("tools.jsonl"), read("queries.jsonl"));
    match mode {
        "eval" => run(&tools, &queries, "default", Params::default()),
        "hybrid" => hybrid(&tools, &queries),
        "diagnose" => diagnose(&tools, &queries),
        "tune" => tune(&tools, &queries),
        other => panic!("unknown mode {other:?}: eval, diagnose or tune"),
    }
}

fn build(tools: &str, p: Params) -> SearchIndex {
    let mut ix = SearchIndex::with_params(p);
    for s in &parse_tools(tools).expect("tools parse") {
        ix.upsert(s);
    }
    ix
}

/// The query lines at even (0, 2, ...) or odd positions of the file: two halves, one to
/// tune on and one held out.
fn half(queries: &str, odd: bool) -> String {
    queries
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .filter(|(i, _)| (i % 2 == 1) == odd)
        .map(|(_, l)| format!("{l}\n"))
        .collect()
}

/// Prints the metrics on all queries, then on the odd half (tuned on) and the even half
/// (held out).
fn run(tools: &str, queries: &str, label: &str, p: Params) {
    score_index(queries, label, &build(tools, p));
}

/// Prints an index's metrics on all queries, the odd half and the even half.
fn score_index(queries: &str, label: &str, ix: &SearchIndex) {
    let score = |qs: &str| {
        evaluate_ranker(qs, |q| {
            ix.search(q, 10, &all).into_iter().map(|h| h.name).collect()
        })
        .expect("queries parse")
    };
    let mut line = format!("{label:28}");
    for qs in [
        queries.to_owned(),
        half(queries, true),
        half(queries, false),
    ] {
        let r = score(&qs);
        line.push_str(&format!(
            " | {:5.1} {:5.1} {:5.1} {:5.1}",
            r.hit_at_1, r.recall_at_5, r.recall_at_10, r.ndcg_at_10
        ));
    }
    println!("{line}");
}

fn diagnose(tools: &str, queries: &str) {
    let ix = build(tools, Params::default());
    for line in queries.lines().filter(|l| !l.trim().is_empty()) {
        let q: serde_json::Value = serde_json::from_str(line).expect("query line");
        let text = q["query"].as_str().unwrap_or_default();
        let gold: Vec<Vec<String>> = serde_json::from_value(q["gold"].clone()).unwrap_or_default();
        let deep = ix.search(text, 500, &all);
        let hits = &deep[..deep.len().min(10)];
        println!("Q {text}");
        println!("  terms {:?}", query_terms(text));
        for (i, h) in hits.iter().enumerate() {
            let mark = if gold.iter().any(|g| g.contains(&h.name)) {
                "*"
            } else {
                " "
            };
            println!("  {mark}{i} {:.3} {}", h.score, h.name);
        }
        for g in &gold {
            if !hits.iter().any(|h| g.contains(&h.name)) {
                match deep.iter().position(|h| g.contains(&h.name)) {
                    Some(r) => println!("  MISS {} (rank {})", g[0], r + 1),
                    None => println!("  MISS {} (not found)", g[0]),
                }
            }
        }
    }
}

fn tune(tools: &str, queries: &str) {
    let run = |label: &str, p: Params| run(tools, queries, label, p);
    let d = Params::default;
    println!(
        "{:28} | {:>23} | {:>23} | {:>23}",
        "", "all: h@1 r@5 r@10 ndcg", "odd (tuned on)", "even (held out)"
    );
    run("default", d());
    for v in [0.0, 0.1, 0.2, 0.4, 0.5, 0.7] {
        run(
            &format!("diversity {v}"),
            Params {
                diversity: v,
                ..d()
            },
        );
    }
    for v in [10, 30, 50] {
        run(
            &format!("diversify depth {v}"),
            Params {
                diversify_depth: v,
                ..d()
            },
        );
    }
    if std::env::var_os("TUNE_DIV").is_some() {
        return;
    }
    for v in [0.0, 0.2, 0.6, 1.0] {
        run(
            &format!("path w {v}"),
            Params {
                path_weight: v,
                ..d()
            },
        );
    }
    for v in [0.0, 0.6, 1.0] {
        run(
            &format!("filler w {v}"),
            Params {
                filler_weight: v,
                ..d()
            },
        );
    }
    for v in [0.0, 0.1, 0.2, 0.5, 0.8] {
        run(
            &format!("fb w {v}"),
            Params {
                fb_weight: v,
                ..d()
            },
        );
    }
    for v in [1, 2, 5, 10] {
        run(&format!("fb docs {v}"), Params { fb_docs: v, ..d() });
    }
    for v in [3, 5, 12, 20] {
        run(&format!("fb terms {v}"), Params { fb_terms: v, ..d() });
    }
    for v in [0.1, 0.2, 0.3, 0.5] {
        run(
            &format!("fb all fields w {v}"),
            Params {
                fb_names_only: false,
                fb_weight: v,
                ..d()
            },
        );
    }
    if std::env::var_os("TUNE_FB").is_some() {
        return;
    }
    if std::env::var_os("TUNE_SHORT").is_some() {
        return;
    }
    for k1 in [0.8, 1.5, 2.0] {
        run(&format!("k1 {k1}"), Params { k1, ..d() });
    }
    for (f, label) in [(0, "name"), (1, "desc"), (2, "params")] {
        for w in [0.5, 1.0, 2.0, 3.0, 5.0, 8.0] {
            let mut p = d();
            p.weight[f] = w;
            run(&format!("{label} w {w}"), p);
        }
        for b in [0.25, 0.5, 0.75, 1.0] {
            let mut p = d();
            p.b[f] = b;
            run(&format!("{label} b {b}"), p);
        }
    }
    for v in [0.0, 0.5, 2.0, 3.0] {
        run(
            &format!("server w {v}"),
            Params {
                server_name: v,
                ..d()
            },
        );
    }
    for v in [0.0, 0.2, 0.7] {
        run(
            &format!("prefix {v}"),
            Params {
                prefix_weight: v,
                ..d()
            },
        );
    }
    for v in [0.0, 0.5, 2.0, 3.0] {
        run(&format!("coverage {v}"), Params { coverage: v, ..d() });
    }
    for v in [0.0, 0.3, 0.8] {
        run(
            &format!("related {v}"),
            Params {
                related_weight: v,
                ..d()
            },
        );
    }
    for v in [0.0, 0.15, 0.5, 0.8] {
        run(
            &format!("server ctx {v}"),
            Params {
                server_context: v,
                ..d()
            },
        );
    }
}

/// The lexical ranking blended with the model-free hashed character-trigram embedder, at a
/// few vector weights (reciprocal-rank fusion, see `search::HybridConfig`).
fn hybrid(tools: &str, queries: &str) {
    let specs = parse_tools(tools).expect("tools parse");
    let refs: Vec<&quiver_contract::ToolSpec> = specs.iter().collect();
    run(tools, queries, "lexical only", Params::default());
    for (w, k) in [
        (0.02, 60.0),
        (0.05, 60.0),
        (0.1, 60.0),
        (0.25, 60.0),
        (1.0, 60.0),
        (0.1, 10.0),
        (0.25, 10.0),
        (1.0, 10.0),
    ] {
        let config = HybridConfig {
            vector_weight: w,
            rrf_k: k,
            ..HybridConfig::default()
        };
        let mut ix =
            SearchIndex::with_embedder(std::sync::Arc::new(HashedNgrams::default()), config);
        ix.upsert_all(&refs);
        score_index(queries, &format!("hashed 3-grams w {w} k {k}"), &ix);
    }
}
