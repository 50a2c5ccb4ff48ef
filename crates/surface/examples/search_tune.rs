//! By-hand diagnosis and tuning of the search index on a benchmark set (no asserts).
//!
//! `cargo run --release -p quiver-surface --example search_tune -- [eval|diagnose|tune|random|hybrid] [DIR]`
//!
//! `DIR` defaults to the shared `livemcpbench` set beside the clone. `eval` prints the
//! metrics, `diagnose` the top 10 of every query with the needed tools marked, `tune`
//! one-at-a-time sweeps of the ranking constants around the defaults, `random` a
//! cross-validated random search over all of them (`RANDOM_N` samples), `hybrid` the blend
//! with the model-free hashed embedder. The search module is
//! compiled into this binary (`#[path]`), so the sweeps reach its crate-internal constants
//! without widening the library's public API.

#[path = "../src/search/mod.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod search;

use std::path::PathBuf;

use search::eval::{evaluate_ranker, parse_tools};
use search::{EvalReport, HashedNgrams, HybridConfig, Params, SearchIndex, query_terms};

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
        "random" => random(&tools, &queries),
        "implied" => {
            for v in [0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0] {
                run(
                    &tools,
                    &queries,
                    &format!("implied {v}"),
                    Params {
                        implied_weight: v,
                        ..Params::default()
                    },
                );
            }
        }
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
    for v in [0.0, 0.1, 0.3] {
        run(
            &format!("link share {v}"),
            Params {
                link_share: v,
                ..d()
            },
        );
    }
    for v in [1, 5] {
        run(
            &format!("link lenders {v}"),
            Params {
                link_lenders: v,
                ..d()
            },
        );
    }
    for v in [0, 3, 8] {
        run(
            &format!("link head {v}"),
            Params {
                link_head: v,
                ..d()
            },
        );
    }
    if std::env::var_os("TUNE_LINK").is_some() {
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
    for v in [0.0, 0.3, 1.0] {
        run(
            &format!("implied {v}"),
            Params {
                implied_weight: v,
                ..d()
            },
        );
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

/// The lexical ranking fused with the model-free hashed character-trigram embedder, at a
/// few vector shares (see `search::HybridConfig`; the real model's sweep is the
/// `fusion_tune` example of `quiver-embed-candle`).
fn hybrid(tools: &str, queries: &str) {
    let specs = parse_tools(tools).expect("tools parse");
    let refs: Vec<&quiver_contract::ToolSpec> = specs.iter().collect();
    run(tools, queries, "lexical only", Params::default());
    for (short, long) in [
        (0.05, 0.02),
        (0.1, 0.05),
        (0.3, 0.1),
        (0.6, 0.1),
        (1.0, 1.0),
    ] {
        let config = HybridConfig {
            short_weight: short,
            long_weight: long,
            ..HybridConfig::default()
        };
        let mut ix =
            SearchIndex::with_embedder(std::sync::Arc::new(HashedNgrams::default()), config);
        ix.upsert_all(&refs);
        ix.embed_pending();
        score_index(queries, &format!("hashed 3-grams {short}/{long}"), &ix);
    }
}

/// A small xorshift generator (no dependency for a by-hand tool).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `x` scaled by a factor between 1/(1+s) and 1+s, log-uniform.
    fn jitter(&mut self, x: f64, s: f64) -> f64 {
        let l = (1.0 + s).ln();
        x * ((self.next() * 2.0 - 1.0) * l).exp()
    }
    fn pick(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() * (hi - lo + 1) as f64) as usize % (hi - lo + 1)
    }
}

/// Random search around the defaults, cross-validated: configurations are chosen on one
/// half of the queries and judged on the other (`RANDOM_N` samples, default 600).
fn random(tools: &str, queries: &str) {
    let n: usize = std::env::var("RANDOM_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let (odd, even) = (half(queries, true), half(queries, false));
    let eval = |p: &Params, qs: &str| {
        let ix = build(tools, p.clone());
        evaluate_ranker(qs, |q| {
            ix.search(q, 10, &all).into_iter().map(|h| h.name).collect()
        })
        .expect("queries parse")
    };
    let d = Params::default();
    let (d_odd, d_even) = (eval(&d, &odd), eval(&d, &even));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut rows = Vec::new();
    for _ in 0..n {
        let mut p = d.clone();
        p.k1 = rng.jitter(d.k1, 0.5);
        for f in 0..3 {
            p.weight[f] = rng.jitter(d.weight[f], 0.6);
            p.b[f] = rng.jitter(d.b[f], 0.4).min(1.0);
        }
        p.prefix_weight = rng.jitter(d.prefix_weight, 0.6);
        p.coverage = rng.jitter(d.coverage, 0.8);
        p.related_weight = rng.jitter(d.related_weight, 0.5);
        p.server_name = rng.jitter(d.server_name, 0.8);
        p.server_context = rng.jitter(d.server_context, 0.8);
        p.diversity = rng.jitter(d.diversity, 0.8).min(0.9);
        p.diversify_depth = rng.pick(10, 40);
        p.path_weight = rng.jitter(d.path_weight, 0.8);
        p.filler_weight = rng.jitter(d.filler_weight, 0.8);
        p.fb_docs = rng.pick(1, 6);
        p.fb_terms = rng.pick(3, 16);
        p.fb_weight = rng.jitter(d.fb_weight, 0.8);
        let (o, e) = (eval(&p, &odd), eval(&p, &even));
        rows.push((p, o, e));
    }
    let gain = |r: &EvalReport, base: &EvalReport| {
        (r.recall_at_5 - base.recall_at_5) + (r.ndcg_at_10 - base.ndcg_at_10)
    };
    for (train, name) in [(true, "odd"), (false, "even")] {
        let mut idx: Vec<usize> = (0..rows.len()).collect();
        let key = |i: usize| {
            let (_, o, e) = &rows[i];
            if train {
                gain(o, &d_odd)
            } else {
                gain(e, &d_even)
            }
        };
        idx.sort_by(|a, b| key(*b).total_cmp(&key(*a)));
        println!(
            "chosen on the {name} half (r@5 + ndcg gain over the default), judged on the other:"
        );
        for &i in idx.iter().take(8) {
            let (p, o, e) = &rows[i];
            let (tr, te, tb, eb) = if train {
                (o, e, &d_odd, &d_even)
            } else {
                (e, o, &d_even, &d_odd)
            };
            println!(
                "  train {} | held out {} | {p:?}",
                deltas(tr, tb),
                deltas(te, eb)
            );
        }
    }
    let mut both: Vec<usize> = (0..rows.len()).collect();
    let worst = |i: usize| gain(&rows[i].1, &d_odd).min(gain(&rows[i].2, &d_even));
    both.sort_by(|a, b| worst(*b).total_cmp(&worst(*a)));
    println!("best on both halves at once (the smaller of the two gains):");
    for &i in both.iter().take(5) {
        let (p, o, e) = &rows[i];
        println!(
            "  odd {} | even {} | {p:?}",
            deltas(o, &d_odd),
            deltas(e, &d_even)
        );
    }
}

/// `a` against `b`: hit@1, recall@5 and nDCG@10 differences.
fn deltas(a: &EvalReport, b: &EvalReport) -> String {
    format!(
        "{:+5.1} h@1 {:+5.1} r@5 {:+5.1} ndcg",
        a.hit_at_1 - b.hit_at_1,
        a.recall_at_5 - b.recall_at_5,
        a.ndcg_at_10 - b.ndcg_at_10
    )
}
