//! Fusing the vector ranking into the lexical one.
//!
//! Both rankings are read to `depth`; each tool in either gets a lexical score `l` (its
//! lexical score over the best one's; 0 when it is not in the lexical top) and a vector
//! score `v` (its cosine rescaled so that the best tool of the vector top is 1 and the last
//! is 0). The fused score is `(1 - a) * l + a * v`, where the vector share `a` depends on the
//! query's length in terms: `short_weight` up to `short_terms`, `long_weight` from
//! `long_terms` on, in a straight line between. A tool whose vector is not computed yet
//! takes its lexical score for `v`, so it is ranked as lexical search ranks it. A tool whose
//! whole name the query spells (`read_file`, `get_current_time`) is put above every tool
//! that the query does not name.
//!
//! A query of several sentences (a multi-step task) is also embedded sentence by sentence,
//! and a tool's cosine is `(1 - clause_weight) * whole + clause_weight * best sentence`: one
//! sentence of a task usually asks for one tool, which the whole task's vector blurs.
//!
//! Why this, with figures (percent, hit@1 / recall@5 / recall@10 / nDCG@10, all-MiniLM-L6-v2,
//! `fusion_tune` example of `quiver-embed-candle`, 2026-12-06). On the two tuning sets
//! together, the model alone ranks short requests much better than the lexical engine and
//! long tasks much worse:
//!
//! | ranking | metatool-dev (10,556 short requests) | livemcpbench (94 long tasks) |
//! |---|---|---|
//! | lexical | 41.8 / 64.5 / 70.6 / 56.1 | 46.8 / 53.4 / 60.6 / 52.4 |
//! | model alone | 54.5 / 76.8 / 83.6 / 68.8 | 35.1 / 34.6 / 44.8 / 36.2 |
//! | this fusion ([`HybridConfig::default`]) | 51.5 / 78.3 / 83.9 / 68.0 | 43.6 / 53.6 / 64.6 / 52.8 |
//! | share 0.8 up to 8 terms, 0.2 from 30, no lexical floor | 56.3 / 78.8 / 84.8 / 70.6 | 42.6 / 46.3 / 56.7 / 47.0 |
//! | share 0.6 up to 8 terms, 0.2 from 30, lexical floor 0.4 | 57.0 / 79.0 / 84.9 / 71.0 | 40.4 / 45.2 / 57.2 / 46.8 |
//! | share 0.5 up to 8 terms, 0.1 from 25, lexical floor 0.2 | 50.7 / 78.6 / 84.6 / 68.0 | 43.6 / 52.9 / 64.4 / 52.4 |
//!
//! Query length separates the two kinds only roughly (median 18 words on metatool-dev, 19 on
//! livemcpbench), so every setting trades one set against the other: the more the model
//! weighs on short requests, the more livemcpbench loses at its head. Also tried and not
//! kept: cosines over the best one's instead of over the vector top's range (metatool-dev
//! hit@1 -2), a fixed cosine gap as the scale (both sets lower), the vector share set by the
//! best cosine instead of the length (metatool-dev hit@1 -3 to -6), and the lexical top kept
//! in place for long queries, and a lower vector share (0 or 0.1) for a query naming a
//! concrete thing (a path, a file name, a URL, a number: 63 % of livemcpbench's tasks, 9 % of
//! metatool-dev's requests): livemcpbench lost hit@1 rather than gaining it (43.6 to 42.6 at
//! 0.1, recall@10 64.6 to 62.0 at 0), so the vector helps those tasks too. The default keeps livemcpbench's recall and nDCG at or above
//! the lexical engine's (recall@10 64.6) and gives up 3.2 points of its hit@1 (three tasks)
//! for +9.7 hit@1 and +13.8 recall@5 on short requests; the goals of metatool-dev hit@1 58
//! and recall@5 80 are not reached by any setting tried.

use std::collections::HashMap;

use super::embed::{Embedder, Vectors, cosine, embed_logged, normalised};
use super::{MIN_SHARE_OF_BEST, SearchHit, SearchIndex, split_name};

/// How the vector ranking is fused with the lexical one (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// The vector share of the score for a query of at most `short_terms` terms (0..=1).
    pub short_weight: f64,
    /// The vector share for a query of at least `long_terms` terms (0..=1).
    pub long_weight: f64,
    /// Queries of at most this many terms are short.
    pub short_terms: usize,
    /// Queries of at least this many terms are long.
    pub long_terms: usize,
    /// How deep each ranking is read before fusion.
    pub depth: usize,
    /// The share of a tool's best per-sentence cosine in its vector score, for a query of
    /// several sentences (0 embeds the query whole only).
    pub clause_weight: f64,
    /// A tool whose whole name the query spells goes above the tools it does not name.
    pub exact_names: bool,
    /// Lexical scores are divided by the best one's, or by this when the best is lower (in
    /// the index's 0..=1 scores): a weak best lexical match does not count as a full one.
    pub lexical_floor: f64,
}

impl Default for HybridConfig {
    /// Tuned on metatool-dev and livemcpbench together with all-MiniLM-L6-v2: see the module
    /// docs for the figures and the settings it was chosen among.
    fn default() -> Self {
        HybridConfig {
            short_weight: 0.6,
            long_weight: 0.1,
            short_terms: 6,
            long_terms: 20,
            depth: 50,
            clause_weight: 0.5,
            exact_names: true,
            lexical_floor: 0.2,
        }
    }
}

impl HybridConfig {
    /// Shares that are not finite are 0 and shares are clamped to 0..=1; a zero depth is 1;
    /// `long_terms` is at least `short_terms`. Fusion then never divides by zero or inverts
    /// a ranking.
    pub(crate) fn sanitised(self) -> Self {
        let share = |x: f64| {
            if x.is_finite() {
                x.clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        HybridConfig {
            short_weight: share(self.short_weight),
            long_weight: share(self.long_weight),
            short_terms: self.short_terms,
            long_terms: self.long_terms.max(self.short_terms),
            depth: self.depth.max(1),
            clause_weight: share(self.clause_weight),
            exact_names: self.exact_names,
            lexical_floor: share(self.lexical_floor),
        }
    }

    /// Whether the vector ranking takes any part.
    pub(crate) fn is_on(&self) -> bool {
        self.short_weight > 0.0 || self.long_weight > 0.0
    }

    /// The vector share for a query of `terms` terms.
    fn vector_share(&self, terms: usize) -> f64 {
        if terms <= self.short_terms {
            return self.short_weight;
        }
        if terms >= self.long_terms {
            return self.long_weight;
        }
        let t = (terms - self.short_terms) as f64 / (self.long_terms - self.short_terms) as f64;
        self.short_weight + t * (self.long_weight - self.short_weight)
    }
}

/// A query's vectors: the whole query's and, for a query of several sentences, each
/// sentence's. Computed before the index is locked ([`embed_query`]).
#[derive(Debug, Clone)]
pub struct QueryVectors {
    whole: Box<[f32]>,
    clauses: Vec<Box<[f32]>>,
}

/// At most this many sentences of a query are embedded apart.
const MAX_CLAUSES: usize = 8;

/// The sentences of a query worth embedding apart (at least three words each); empty for a
/// query of one sentence.
fn clauses(query: &str) -> Vec<&str> {
    let parts: Vec<&str> = query
        .split(['.', '!', '?', ';', '\n', '。', '；'])
        .map(str::trim)
        .filter(|p| p.split_whitespace().count() >= 3)
        .take(MAX_CLAUSES)
        .collect();
    if parts.len() < 2 { Vec::new() } else { parts }
}

/// The texts [`embed_query`] embeds for `query`: the query (clipped), then its sentences
/// when `config` asks and it has several.
pub fn query_texts<'q>(config: &HybridConfig, query: &'q str) -> Vec<&'q str> {
    let query = super::clip_query(query);
    let mut texts = vec![query];
    if config.clause_weight > 0.0 {
        texts.extend(clauses(query));
    }
    texts
}

/// Embeds `query` (and its sentences, when `config` asks and it has several) with
/// `embedder`; `None` when embedding fails (the search is then lexical). The sentences are
/// one batch apart from the whole query, so they are not padded to its length.
pub fn embed_query(
    embedder: &dyn Embedder,
    config: &HybridConfig,
    query: &str,
) -> Option<QueryVectors> {
    let texts = query_texts(config, query);
    let (whole, parts) = texts.split_first()?;
    let whole = normalised(&embed_logged(embedder, &[whole]).pop()??)?;
    let clauses = if parts.is_empty() {
        Vec::new()
    } else {
        embed_logged(embedder, parts)
            .into_iter()
            .filter_map(|v| normalised(&v?))
            .collect()
    };
    Some(QueryVectors { whole, clauses })
}

/// Whether `query` spells `name`'s tool part as a whole word (case-insensitive; a word may
/// hold `_`, `-` and `.`). Only identifiers count (a name with `_`, `-` or `.`, or in
/// camelCase): a name that is a plain word (`search`, `fetch`) is a word of many requests.
pub(crate) fn names_tool(query_lower: &str, name: &str) -> bool {
    let (_, tool) = split_name(name);
    let camel = tool
        .chars()
        .zip(tool.chars().skip(1))
        .any(|(a, b)| a.is_lowercase() && b.is_uppercase());
    if tool.chars().count() < 4 || !(camel || tool.contains(['_', '-', '.'])) {
        return false;
    }
    let tool = tool.to_lowercase();
    query_lower
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
        .any(|w| w.trim_matches('.') == tool)
}

impl SearchIndex {
    /// The fused ranking (see the module docs) for a query whose vectors are `qv`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search_fused(
        &self,
        query: &str,
        terms: &[String],
        qv: &QueryVectors,
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
        v: &Vectors,
        private: bool,
    ) -> Vec<SearchHit> {
        let c = &v.config;
        let depth = c.depth.max(limit);
        let lexical = self.search_lexical(query, terms, depth, filter, private);
        let sim = |vec: &[f32]| {
            let whole = cosine(&qv.whole, vec);
            if qv.clauses.is_empty() {
                return whole;
            }
            let best = qv
                .clauses
                .iter()
                .map(|q| cosine(q, vec))
                .fold(f64::NEG_INFINITY, f64::max);
            (1.0 - c.clause_weight) * whole + c.clause_weight * best
        };
        let mut sims: Vec<(f64, u32)> = v
            .by_doc
            .iter()
            .enumerate()
            .filter_map(|(d, vec)| Some((sim(vec.as_deref()?), d as u32)))
            .collect();
        let top = self.best_filtered(&mut sims, depth, filter);
        // Cosines rescaled over the vector top: its best is 1, its last 0.
        let (hi, lo) = match (top.first(), top.last()) {
            (Some(f), Some(l)) => (f.0, l.0),
            _ => (0.0, 0.0),
        };
        let rescale = |s: f64| {
            if hi - lo > 1e-9 {
                ((s - lo) / (hi - lo)).clamp(0.0, 1.0)
            } else {
                f64::from(u8::from(s >= hi))
            }
        };
        let best_lexical = lexical.first().map_or(0.0, |h| h.score);
        // Name -> (lexical score, vector score or None when the tool has no vector).
        let mut scores: HashMap<&str, (f64, Option<f64>)> = HashMap::new();
        for h in &lexical {
            let l = if best_lexical > 0.0 {
                h.score / best_lexical.max(c.lexical_floor)
            } else {
                0.0
            };
            let vs = self
                .by_name
                .get(&h.name)
                .and_then(|&d| v.by_doc.get(d as usize)?.as_deref())
                .map(|vec| rescale(sim(vec)));
            scores.insert(h.name.as_str(), (l, vs));
        }
        for &(s, name, _) in &top {
            scores.entry(name).or_insert((0.0, Some(rescale(s))));
        }
        let share = c.vector_share(terms.len());
        let lower = query.to_lowercase();
        let mut fused: Vec<(f64, &str)> = scores
            .into_iter()
            .map(|(name, (l, vs))| {
                let vs = vs.unwrap_or(l);
                let mut f = (1.0 - share) * l + share * vs;
                if c.exact_names && names_tool(&lower, name) {
                    f += 1.0;
                }
                (f, name)
            })
            .collect();
        fused.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        fused.truncate(limit);
        let best = fused.first().map_or(0.0, |f| f.0);
        fused
            .into_iter()
            .filter(|(f, _)| *f > 0.0 && *f >= best * MIN_SHARE_OF_BEST)
            .map(|(f, name)| SearchHit {
                name: name.to_owned(),
                score: f.clamp(0.0, 1.0),
            })
            .collect()
    }
}
