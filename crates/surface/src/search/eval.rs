//! Retrieval metrics over a tool-search benchmark set (`tools.jsonl` + `queries.jsonl`).

use quiver_contract::ToolSpec;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::SearchIndex;

/// Retrieval quality over a query set, in percent with one decimal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// The number of queries.
    pub queries: usize,
    /// The first hit is one of the needed tools.
    #[serde(rename = "hit@1")]
    pub hit_at_1: f64,
    /// The share of needed tools in the top 5.
    #[serde(rename = "recall@5")]
    pub recall_at_5: f64,
    /// The share of needed tools in the top 10.
    #[serde(rename = "recall@10")]
    pub recall_at_10: f64,
    /// nDCG of the top 10, binary relevance, one credit per needed tool.
    #[serde(rename = "ndcg@10")]
    pub ndcg_at_10: f64,
}

#[derive(Deserialize)]
struct ToolLine {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    input_schema: Option<Value>,
}

#[derive(Deserialize)]
struct QueryLine {
    query: String,
    /// One inner list per needed tool; any name in it counts as finding the tool.
    gold: Vec<Vec<String>>,
}

/// Parses the tools of a benchmark set, one JSON object a line; a name given twice is an
/// error (the format says names are unique; the index would keep the last).
pub(crate) fn parse_tools(tools_jsonl: &str) -> Result<Vec<ToolSpec>, String> {
    let mut specs = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (i, line) in tools_jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let t: ToolLine =
            serde_json::from_str(line).map_err(|e| format!("tools line {}: {e}", i + 1))?;
        if let Some(first) = seen.insert(t.name.clone(), i + 1) {
            return Err(format!(
                "tools line {}: the tool `{}` is given again (first on line {first}); names are unique",
                i + 1,
                t.name
            ));
        }
        let schema = t.input_schema.unwrap_or_else(|| json!({"type": "object"}));
        specs.push(ToolSpec::new(t.name, t.description).with_schema(schema));
    }
    Ok(specs)
}

fn parse_queries(queries_jsonl: &str) -> Result<Vec<QueryLine>, String> {
    let mut queries = Vec::new();
    for (i, line) in queries_jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: QueryLine =
            serde_json::from_str(line).map_err(|e| format!("queries line {}: {e}", i + 1))?;
        queries.push(q);
    }
    Ok(queries)
}

/// Builds a [`SearchIndex`] from `tools_jsonl` and scores it on `queries_jsonl` (the file
/// contents, in the benchmark's format).
pub fn evaluate(tools_jsonl: &str, queries_jsonl: &str) -> Result<EvalReport, String> {
    evaluate_with(tools_jsonl, queries_jsonl, None)
}

/// [`evaluate`] with a vector retriever fused in (every tool embedded before the queries).
pub fn evaluate_with(
    tools_jsonl: &str,
    queries_jsonl: &str,
    retriever: Option<(std::sync::Arc<dyn super::Embedder>, super::HybridConfig)>,
) -> Result<EvalReport, String> {
    let mut index = match retriever {
        Some((embedder, config)) => SearchIndex::with_embedder(embedder, config),
        None => SearchIndex::new(),
    };
    let tools = parse_tools(tools_jsonl)?;
    if tools.is_empty() {
        return Err("the tool set is empty".into());
    }
    let names: std::collections::HashSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    // A needed tool none of whose names is in the tool set can never be found: a typo in
    // the set, not a miss of the ranking.
    for (i, q) in parse_queries(queries_jsonl)?.iter().enumerate() {
        if let Some(g) = q
            .gold
            .iter()
            .find(|g| !g.iter().any(|n| names.contains(n.as_str())))
        {
            return Err(format!(
                "query {} ({:?}): no name of the needed tool {g:?} is in the tool set; fix the gold names or the tools file",
                i + 1,
                q.query.chars().take(60).collect::<String>()
            ));
        }
    }
    for spec in &tools {
        index.upsert(spec);
    }
    index.embed_pending();
    evaluate_ranker(queries_jsonl, |q| {
        index
            .search(q, 10, &|_| true)
            .into_iter()
            .map(|h| h.name)
            .collect()
    })
}

/// Scores any ranker (query -> ranked names, at least the top 10) on a query set.
pub(crate) fn evaluate_ranker(
    queries_jsonl: &str,
    rank: impl Fn(&str) -> Vec<String>,
) -> Result<EvalReport, String> {
    let queries = parse_queries(queries_jsonl)?;
    if queries.is_empty() {
        return Err("the query set is empty".into());
    }
    let mut sums = [0.0f64; 4];
    for q in &queries {
        let ranked = rank(&q.query);
        let m = metrics(&ranked, &q.gold);
        for (s, v) in sums.iter_mut().zip(m) {
            *s += v;
        }
    }
    let pct = |s: f64| (s / queries.len() as f64 * 1000.0).round() / 10.0;
    Ok(EvalReport {
        queries: queries.len(),
        hit_at_1: pct(sums[0]),
        recall_at_5: pct(sums[1]),
        recall_at_10: pct(sums[2]),
        ndcg_at_10: pct(sums[3]),
    })
}

/// hit@1, recall@5, recall@10, nDCG@10 of one ranking, as fractions.
fn metrics(ranked: &[String], gold: &[Vec<String>]) -> [f64; 4] {
    if gold.is_empty() {
        return [0.0; 4];
    }
    // Which ranks find a needed tool: each ranked tool credits one needed tool, and each
    // needed tool is credited once (two needed tools that share a name are not both found
    // by one result). A maximum matching in rank order (augmenting paths), so a result that
    // could stand for either of two needed tools leaves the other one to a later result.
    let top: Vec<&String> = ranked.iter().take(10).collect();
    let mut tool_of_rank: Vec<Option<usize>> = vec![None; top.len()];
    let mut rank_of_tool: Vec<Option<usize>> = vec![None; gold.len()];
    for r in 0..top.len() {
        let mut seen = vec![false; gold.len()];
        augment(
            r,
            &top,
            gold,
            &mut seen,
            &mut rank_of_tool,
            &mut tool_of_rank,
        );
    }
    let found: Vec<Option<usize>> = rank_of_tool;
    let hit1 = f64::from(u8::from(
        ranked
            .first()
            .is_some_and(|top| gold.iter().any(|names| names.contains(top))),
    ));
    let recall = |k: usize| {
        found.iter().filter(|f| f.is_some_and(|r| r < k)).count() as f64 / gold.len() as f64
    };
    let gain = |rank: usize| 1.0 / ((rank + 2) as f64).log2();
    let dcg: f64 = found.iter().flatten().map(|&r| gain(r)).sum();
    let ideal: f64 = (0..gold.len().min(10)).map(gain).sum();
    [hit1, recall(5), recall(10), dcg / ideal]
}

/// Tries to credit the result at rank `r` to a needed tool, moving earlier credits along
/// (Kuhn's augmenting path). The sets are tiny (10 results, a few needed tools).
fn augment(
    r: usize,
    top: &[&String],
    gold: &[Vec<String>],
    seen: &mut [bool],
    rank_of_tool: &mut [Option<usize>],
    tool_of_rank: &mut [Option<usize>],
) -> bool {
    for g in 0..gold.len() {
        if seen[g] || !gold[g].contains(top[r]) {
            continue;
        }
        seen[g] = true;
        let free = match rank_of_tool[g] {
            None => true,
            Some(other) => augment(other, top, gold, seen, rank_of_tool, tool_of_rank),
        };
        if free {
            rank_of_tool[g] = Some(r);
            tool_of_rank[r] = Some(g);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod metric_tests {
    use super::metrics;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    /// One ranked tool credits one needed tool: nDCG stays within 0..=1 when two needed
    /// tools share a name.
    #[test]
    fn a_ranked_tool_credits_one_needed_tool() {
        let gold = vec![v(&["send_mail"]), v(&["send_mail"])];
        let [hit1, r5, r10, ndcg] = metrics(&v(&["send_mail", "other"]), &gold);
        assert_eq!((hit1, r5, r10), (1.0, 0.5, 0.5));
        assert!(ndcg > 0.0 && ndcg < 1.0, "{ndcg}");
        let [_, r5, _, ndcg] = metrics(&v(&["send_mail", "other", "send_mail"]), &gold);
        assert_eq!(r5, 1.0);
        assert!(ndcg <= 1.0, "{ndcg}");
    }

    /// A result that could stand for either of two needed tools leaves the other one to a
    /// later result: `[[A, B], [A]]` ranked `A, B` finds both.
    #[test]
    fn credits_are_matched_not_taken_greedily() {
        let gold = vec![v(&["A", "B"]), v(&["A"])];
        let [hit1, r5, _, ndcg] = metrics(&v(&["A", "B"]), &gold);
        assert_eq!((hit1, r5), (1.0, 1.0));
        assert!((ndcg - 1.0).abs() < 1e-12, "{ndcg}");
    }
}

#[cfg(test)]
pub(crate) mod baseline {
    //! The README's reference ranker: plain Okapi BM25 (k1 = 1.2, b = 0.75) over name,
    //! description and schema property names and descriptions, lower-cased, camelCase and
    //! `_` split, a small stop-word list. Here only to check the metric code against the
    //! published numbers.

    use std::collections::HashMap;

    use quiver_contract::ToolSpec;
    use serde_json::Value;

    const STOP: &[&str] = &[
        "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of",
        "on", "or", "that", "the", "this", "to", "with",
    ];

    pub(crate) fn tokens(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for word in text.split(|c: char| !c.is_alphanumeric()) {
            let chars: Vec<char> = word.chars().collect();
            let mut start = 0;
            for i in 1..chars.len() {
                if chars[i].is_uppercase() && chars[i - 1].is_lowercase() {
                    out.push(chars[start..i].iter().collect::<String>().to_lowercase());
                    start = i;
                }
            }
            if start < chars.len() {
                out.push(chars[start..].iter().collect::<String>().to_lowercase());
            }
        }
        out.retain(|t| !STOP.contains(&t.as_str()));
        out
    }

    fn schema_text(v: &Value, out: &mut String) {
        if let Some(Value::Object(props)) = v.get("properties") {
            for (k, sub) in props {
                out.push_str(k);
                out.push(' ');
                if let Some(Value::String(d)) = sub.get("description") {
                    out.push_str(d);
                    out.push(' ');
                }
            }
        }
    }

    pub(crate) struct Bm25 {
        docs: Vec<(String, HashMap<String, f64>, f64)>,
        df: HashMap<String, f64>,
        avg: f64,
    }

    impl Bm25 {
        pub(crate) fn new(specs: &[ToolSpec]) -> Self {
            let mut docs = Vec::new();
            let mut df: HashMap<String, f64> = HashMap::new();
            for s in specs {
                let mut text = format!("{} {} ", s.name, s.description);
                schema_text(&s.input_schema, &mut text);
                let toks = tokens(&text);
                let mut tf: HashMap<String, f64> = HashMap::new();
                for t in &toks {
                    *tf.entry(t.clone()).or_default() += 1.0;
                }
                for t in tf.keys() {
                    *df.entry(t.clone()).or_default() += 1.0;
                }
                docs.push((s.name.clone(), tf, toks.len() as f64));
            }
            let avg = docs.iter().map(|d| d.2).sum::<f64>() / docs.len() as f64;
            Bm25 { docs, df, avg }
        }

        pub(crate) fn rank(&self, query: &str) -> Vec<String> {
            let (k1, b) = (1.2, 0.75);
            let n = self.docs.len() as f64;
            let mut q = tokens(query);
            q.sort();
            q.dedup();
            let mut scored: Vec<(f64, &str)> = self
                .docs
                .iter()
                .map(|(name, tf, len)| {
                    let mut s = 0.0;
                    for t in &q {
                        if let Some(&f) = tf.get(t) {
                            let df = self.df[t];
                            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                            s += idf * f * (k1 + 1.0) / (f + k1 * (1.0 - b + b * len / self.avg));
                        }
                    }
                    (s, name.as_str())
                })
                .filter(|(s, _)| *s > 0.0)
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
            scored
                .into_iter()
                .take(10)
                .map(|(_, n)| n.to_owned())
                .collect()
        }
    }
}
