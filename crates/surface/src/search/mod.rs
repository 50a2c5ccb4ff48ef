//! The lexical tool-search index behind `tool_search`.
//!
//! Ranking is BM25F over three fields of a tool: its own name (highest weight), its
//! description, and its input schema's property names and descriptions (lowest weight).
//! Text is split into terms by [`query_terms`]'s rules: snake_case, camelCase, kebab-case,
//! dotted and `__` identifiers are split (a split word is also kept whole), stop words
//! dropped, English suffixes lightly stemmed, and CJK runs indexed as character unigrams and
//! bigrams. On top of that:
//! - a query term also meets the indexed terms it is a prefix of, at a lower weight;
//! - a few generic related words (save/write, ppt/presentation, ...) and `file` for a query
//!   naming a path are added to the query at a lower weight;
//! - a tool whose name terms the query largely covers (idf-weighted) gets a bonus;
//! - the server part of an MCP name (`mcp__<server>__<tool>`, or `<server>__<tool>`) is
//!   scored with an idf over servers and reaches every tool of the server, and every tool
//!   gets a share of its server's best score.
//!
//! The index is incremental: [`SearchIndex::upsert`] and [`SearchIndex::remove`] touch only
//! the postings of one tool and keep the collection statistics (document frequencies, field
//! lengths) up to date, and a search reads only the postings of its terms (prefixes are a
//! range of the sorted term dictionary).

pub(crate) mod eval;
mod tokenize;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use quiver_contract::{ToolSpec, split_mcp_name};
use serde_json::Value;

pub use eval::{EvalReport, evaluate};
use tokenize::{TokenOpts, expand_query, is_filler, path_only_terms, tokenize};

/// One search result: a tool name and its score, normalised to `0.0..=1.0` (1.0 would be a
/// tool matching every query term as strongly as the index allows).
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    /// The tool's full name.
    pub name: String,
    /// The relevance, higher is better.
    pub score: f64,
}

/// The indexed fields of a tool. The server part of an MCP name is scored separately, over
/// servers, so that a server's name does not make its words common among tools.
const NAME: usize = 0;
const DESC: usize = 1;
const PARAMS: usize = 2;
const FIELDS: usize = 3;

/// Ranking constants. Generic values, not fitted to single queries.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    pub(crate) k1: f64,
    pub(crate) weight: [f64; FIELDS],
    pub(crate) b: [f64; FIELDS],
    /// The weight of a prefix match relative to an exact one.
    pub(crate) prefix_weight: f64,
    /// Shortest query term that is expanded to the terms it prefixes.
    pub(crate) prefix_min_len: usize,
    /// Most indexed terms one query term expands to.
    pub(crate) prefix_max_terms: usize,
    /// Bonus, in units of an average term's full score, for the idf-weighted share of a
    /// tool's name terms that the query contains.
    pub(crate) coverage: f64,
    /// The weight of related-vocabulary query expansions.
    pub(crate) related_weight: f64,
    /// The weight of a query term found in the tool's server name (idf over servers).
    pub(crate) server_name: f64,
    /// Share of the best score of a tool's server added to every tool of that server (tools
    /// needed together tend to come from one server).
    pub(crate) server_context: f64,
    /// The share of query-term coverage in the order of the head of the ranking (see
    /// `SearchIndex::diversify`; 0 keeps the score order).
    pub(crate) diversity: f64,
    /// How many of the best tools diversification reorders.
    pub(crate) diversify_depth: usize,
    /// The weight of a query term found only inside file paths.
    pub(crate) path_weight: f64,
    /// The weight of a conversational filler word ("help", "give", "want").
    pub(crate) filler_weight: f64,
    /// Pseudo-relevance feedback: the top `fb_docs` tools of the query...
    pub(crate) fb_docs: usize,
    /// ... give their `fb_terms` best terms (idf-weighted, by the tools' scores) ...
    pub(crate) fb_terms: usize,
    /// ... added to the query at this weight (for the best of them; 0 turns feedback off).
    pub(crate) fb_weight: f64,
    /// Feedback terms from the tools' names only (else from all their fields).
    pub(crate) fb_names_only: bool,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            k1: 1.2,
            weight: [5.0, 0.7, 0.7],
            b: [0.5, 0.75, 0.75],
            prefix_weight: 0.4,
            prefix_min_len: 3,
            prefix_max_terms: 32,
            coverage: 1.0,
            related_weight: 0.8,
            server_name: 1.0,
            server_context: 0.3,
            diversity: 0.3,
            diversify_depth: 20,
            path_weight: 0.4,
            filler_weight: 0.3,
            fb_docs: 3,
            fb_terms: 8,
            fb_weight: 0.3,
            fb_names_only: false,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Posting {
    doc: u32,
    tf: [u16; FIELDS],
}

#[derive(Debug)]
struct Doc {
    name: String,
    len: [u32; FIELDS],
    /// The distinct term ids of the document, to undo its postings on removal.
    terms: Vec<u32>,
    /// The distinct term ids of the tool's own name, for the coverage bonus.
    name_terms: Vec<u32>,
    /// The id of the server part of the name; `None` for native tools.
    server: Option<u32>,
}

#[derive(Debug, Default)]
struct Server {
    members: Vec<u32>,
    terms: Vec<Box<str>>,
}

/// An incremental inverted index over tool specs. See the module docs for the ranking.
#[derive(Debug, Default)]
pub struct SearchIndex {
    params: Params,
    /// Term -> term id. Sorted, so the terms a prefix completes are a range.
    dict: BTreeMap<Box<str>, u32>,
    /// Term id -> postings sorted by document id (the length is the document frequency).
    lists: Vec<Vec<Posting>>,
    /// Term id -> the term, to drop it from `dict` when its last posting goes.
    texts: Vec<Box<str>>,
    free_terms: Vec<u32>,
    /// Document id -> field lengths (beside `docs`, for a compact scoring loop).
    lens: Vec<[u32; FIELDS]>,
    /// Document id -> server id (beside `docs`).
    doc_server: Vec<Option<u32>>,
    docs: Vec<Option<Doc>>,
    free: Vec<u32>,
    by_name: HashMap<String, u32>,
    total_len: [u64; FIELDS],
    /// Server -> its tools and name terms.
    servers: Vec<Server>,
    /// Server name -> server id. Ids are kept for the index's life (an emptied server has
    /// no members and no name terms), so a re-added server reuses its id.
    server_ids: HashMap<Box<str>, u32>,
    /// Servers with at least one tool.
    live_servers: usize,
    /// Term -> the servers whose names contain it.
    server_postings: HashMap<Box<str>, Vec<u32>>,
    /// Document id -> per field, the field weight over its BM25 length normalisation.
    /// Computed by the first search after a change (it depends on the average lengths).
    norms: std::sync::OnceLock<Stats>,
}

/// Per-document values that depend on collection statistics, computed once per change.
#[derive(Debug)]
struct Stats {
    /// Per field: the field weight over its BM25 length normalisation.
    norms: Vec<[f32; FIELDS]>,
    /// The idf sum of the tool's name terms, for the coverage bonus.
    name_idf: Vec<f64>,
}

impl SearchIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index with other ranking constants. Unused by the library itself: for
    /// `examples/search_tune.rs`, which compiles this module into itself.
    #[allow(dead_code)]
    pub(crate) fn with_params(params: Params) -> Self {
        SearchIndex {
            params,
            ..Self::default()
        }
    }

    /// The number of indexed tools.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether no tool is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Adds a tool, or replaces the tool of the same name. Touches only that tool's postings
    /// (and its server's, when it is the server's first tool).
    pub fn upsert(&mut self, spec: &ToolSpec) {
        self.remove(&spec.name);
        self.norms = std::sync::OnceLock::new();
        let (server, _) = split_name(&spec.name);
        let fields = field_terms(spec);
        let mut counts: BTreeMap<&str, [u16; FIELDS]> = BTreeMap::new();
        let mut len = [0u32; FIELDS];
        for (f, terms) in fields.iter().enumerate() {
            len[f] = u32::try_from(terms.len()).unwrap_or(u32::MAX);
            for t in terms {
                let tf = counts.entry(t.as_str()).or_default();
                tf[f] = tf[f].saturating_add(1);
            }
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.docs.push(None);
                u32::try_from(self.docs.len() - 1).expect("fewer than 2^32 tools")
            }
        };
        let mut terms = Vec::with_capacity(counts.len());
        let mut name_terms = Vec::new();
        for (term, tf) in counts {
            let tid = self.term_id(term);
            let list = &mut self.lists[tid as usize];
            let at = list.partition_point(|p| p.doc < id);
            list.insert(at, Posting { doc: id, tf });
            terms.push(tid);
            if tf[NAME] > 0 {
                name_terms.push(tid);
            }
        }
        if self.lens.len() < self.docs.len() {
            self.lens.resize(self.docs.len(), [0; FIELDS]);
            self.doc_server.resize(self.docs.len(), None);
        }
        self.lens[id as usize] = len;
        for (total, l) in self.total_len.iter_mut().zip(len) {
            *total += u64::from(l);
        }
        let server_id = (!server.is_empty()).then(|| self.server_id(server));
        self.doc_server[id as usize] = server_id;
        if let Some(sid) = server_id {
            let entry = &mut self.servers[sid as usize];
            if entry.members.is_empty() {
                self.live_servers += 1;
                let mut sterms = Vec::new();
                tokenize(server, TokenOpts { joins: false }, &mut sterms);
                sterms.sort();
                sterms.dedup();
                for t in &sterms {
                    self.server_postings
                        .entry(t.as_str().into())
                        .or_default()
                        .push(sid);
                }
                entry.terms = sterms.into_iter().map(String::into_boxed_str).collect();
            }
            entry.members.push(id);
        }
        self.docs[id as usize] = Some(Doc {
            name: spec.name.clone(),
            len,
            terms,
            name_terms,
            server: server_id,
        });
        self.by_name.insert(spec.name.clone(), id);
    }

    /// The id of a server name, allocated on first use.
    fn server_id(&mut self, server: &str) -> u32 {
        if let Some(&sid) = self.server_ids.get(server) {
            return sid;
        }
        self.servers.push(Server::default());
        let sid = u32::try_from(self.servers.len() - 1).expect("fewer than 2^32 servers");
        self.server_ids.insert(server.into(), sid);
        sid
    }

    /// The id of `term`, allocated on first use.
    fn term_id(&mut self, term: &str) -> u32 {
        if let Some(&tid) = self.dict.get(term) {
            return tid;
        }
        let tid = match self.free_terms.pop() {
            Some(tid) => {
                self.texts[tid as usize] = term.into();
                tid
            }
            None => {
                self.lists.push(Vec::new());
                self.texts.push(term.into());
                u32::try_from(self.lists.len() - 1).expect("fewer than 2^32 terms")
            }
        };
        self.dict.insert(term.into(), tid);
        tid
    }

    /// Removes the tool `name`; false when it was not indexed.
    pub fn remove(&mut self, name: &str) -> bool {
        let Some(id) = self.by_name.remove(name) else {
            return false;
        };
        self.norms = std::sync::OnceLock::new();
        let doc = self.docs[id as usize]
            .take()
            .expect("by_name points at a live doc");
        for &tid in &doc.terms {
            let list = &mut self.lists[tid as usize];
            if let Ok(at) = list.binary_search_by_key(&id, |p| p.doc) {
                list.remove(at);
            }
            if list.is_empty() {
                let text = std::mem::take(&mut self.texts[tid as usize]);
                self.dict.remove(&text);
                self.free_terms.push(tid);
            }
        }
        self.lens[id as usize] = [0; FIELDS];
        self.doc_server[id as usize] = None;
        for (total, l) in self.total_len.iter_mut().zip(doc.len) {
            *total -= u64::from(l);
        }
        if let Some(sid) = doc.server {
            let entry = &mut self.servers[sid as usize];
            entry.members.retain(|&m| m != id);
            if entry.members.is_empty() {
                self.live_servers -= 1;
                for t in std::mem::take(&mut entry.terms) {
                    if let Some(list) = self.server_postings.get_mut(&t) {
                        list.retain(|&s| s != sid);
                        if list.is_empty() {
                            self.server_postings.remove(&t);
                        }
                    }
                }
            }
        }
        self.free.push(id);
        true
    }

    /// The best `limit` tools for `query` among those whose name passes `filter`, best first;
    /// equal scores are ordered by name. The filter is applied before the cut, so a filtered
    /// search still returns up to `limit` hits. An empty result for a query without
    /// meaningful terms (see [`is_meaningful_query`]).
    pub fn search(
        &self,
        query: &str,
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
    ) -> Vec<SearchHit> {
        let terms = query_terms(query);
        if terms.is_empty() || limit == 0 || self.is_empty() {
            return Vec::new();
        }
        let p = &self.params;
        let whole = self.weigh(query, &terms);
        let mut cache: HashMap<&str, TermData> = HashMap::new();
        let mut scratch = vec![0.0f64; self.docs.len()];
        for (q, _) in &whole {
            if !cache.contains_key(q.as_str()) {
                let data = self.term_data(q, true, &mut scratch);
                cache.insert(q.as_str(), data);
            }
        }
        let (mut total, mut touched, mut bound) = self.combine(&whole, &cache);
        if touched.is_empty() {
            return Vec::new();
        }
        if p.fb_weight > 0.0 && p.fb_docs > 0 && p.fb_terms > 0 {
            let feedback = self.feedback(&whole, &total, &touched);
            if !feedback.is_empty() {
                for (t, _) in &feedback {
                    if !cache.contains_key(t) {
                        // A feedback term is an indexed term: no prefix completions.
                        let data = self.term_data(t, false, &mut scratch);
                        cache.insert(t, data);
                    }
                }
                let mut expanded = whole.clone();
                expanded.extend(feedback.iter().map(|&(t, w)| (t.to_owned(), w)));
                (total, touched, bound) = self.combine(&expanded, &cache);
            }
        }
        let bound = if bound > 0.0 { bound } else { 1.0 };
        let name = |d: u32| {
            self.docs[d as usize]
                .as_ref()
                .expect("live doc")
                .name
                .as_str()
        };
        let mut best: Vec<(f64, u32)> = touched
            .iter()
            .filter(|&&d| filter(name(d)))
            .map(|&d| (total[d as usize], d))
            .collect();
        let depth = limit.max(p.diversify_depth);
        if best.len() > depth {
            // The cut by score alone (cheap), keeping every tool tied with the last one.
            let (_, last, _) = best.select_nth_unstable_by(depth - 1, |a, b| b.0.total_cmp(&a.0));
            let last = last.0;
            best.retain(|b| b.0 >= last);
        }
        let mut hits: Vec<(f64, &str, u32)> =
            best.into_iter().map(|(s, d)| (s, name(d), d)).collect();
        hits.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        hits.truncate(depth);
        if p.diversity > 0.0 && hits.len() > 2 {
            self.diversify(&mut hits, &whole, &cache, &mut scratch);
        }
        hits.truncate(limit);
        // Scores never rise down the list (diversification may move a tool up).
        let mut cap = f64::INFINITY;
        hits.into_iter()
            .map(|(s, name, _)| {
                cap = cap.min(s);
                SearchHit {
                    name: name.to_owned(),
                    score: (cap / bound).clamp(0.0, 1.0),
                }
            })
            .collect()
    }

    /// Reorders a ranking, best first, so that its head covers the query's terms: the
    /// query terms are aspects weighted by their weight and idf, a tool meets an aspect as
    /// strongly as its score for the term over the best tool's, and the next tool is the one
    /// with the best mix of its own score (share `1 - diversity`) and the aspect weight it
    /// meets that the tools above it do not yet (share `diversity`; xQuAD, Santos et al.,
    /// 2010). Equal values keep the name order. `scratch` is all zeros and is left so.
    fn diversify(
        &self,
        hits: &mut [(f64, &str, u32)],
        weighted: &[(String, f64)],
        cache: &HashMap<&str, TermData>,
        scratch: &mut [f64],
    ) {
        let p = &self.params;
        let m = hits.len();
        // Candidate position + 1 by document id, in `scratch` (as f64, to reuse it).
        for (i, h) in hits.iter().enumerate() {
            scratch[h.2 as usize] = (i + 1) as f64;
        }
        let mut aspects: Vec<(f64, Vec<f64>)> = Vec::new();
        for (q, w) in weighted {
            let Some(data) = cache.get(q.as_str()) else {
                continue;
            };
            let mut meets = vec![0.0; m];
            let mut max: f64 = 0.0;
            for &(d, s) in &data.docs {
                let at = scratch[d as usize];
                if at > 0.0 {
                    meets[at as usize - 1] = s;
                    max = max.max(s);
                }
            }
            if max > 0.0 {
                meets.iter_mut().for_each(|x| *x /= max);
                aspects.push((w * data.max, meets));
            }
        }
        for h in hits.iter() {
            scratch[h.2 as usize] = 0.0;
        }
        let weight_sum: f64 = aspects.iter().map(|a| a.0).sum();
        if aspects.len() < 2 || weight_sum <= 0.0 {
            return;
        }
        let top = hits[0].0;
        if top <= 0.0 {
            return;
        }
        // Per aspect: the probability that no tool picked so far meets it.
        let mut open = vec![1.0; aspects.len()];
        let mut index: Vec<usize> = (0..m).collect();
        for slot in 0..m {
            let value = |i: usize| {
                let novelty: f64 = aspects
                    .iter()
                    .zip(&open)
                    .map(|((w, meets), o)| w / weight_sum * meets[i] * o)
                    .sum();
                (1.0 - p.diversity) * hits[i].0 / top + p.diversity * novelty
            };
            let mut best = slot;
            let mut best_value = value(index[slot]);
            for (k, &i) in index.iter().enumerate().skip(slot + 1) {
                let v = value(i);
                // `index` stays in the original order past `slot`, so ties keep it.
                if v > best_value {
                    best = k;
                    best_value = v;
                }
            }
            let chosen = index.remove(best);
            index.insert(slot, chosen);
            for ((_, meets), o) in aspects.iter().zip(open.iter_mut()) {
                *o *= 1.0 - meets[chosen];
            }
        }
        let reordered: Vec<(f64, &str, u32)> = index.iter().map(|&i| hits[i]).collect();
        hits.copy_from_slice(&reordered);
    }

    /// The weighted terms of a query: its terms, related vocabulary, and lower weights for
    /// terms found only in file paths and for conversational filler words.
    fn weigh(&self, query: &str, terms: &[String]) -> Vec<(String, f64)> {
        let p = &self.params;
        let mut weighted = expand_query(query, terms, p.related_weight);
        let in_paths = path_only_terms(query);
        for (t, w) in &mut weighted {
            if in_paths.contains(t) {
                *w *= p.path_weight;
            }
            if is_filler(t) {
                *w *= p.filler_weight;
            }
        }
        weighted
    }

    /// Pseudo-relevance feedback terms: the best terms of the top tools of a first ranking
    /// that the query does not have, each weighted by the idf of the term times the
    /// normalised score of the tools that have it, scaled to at most `fb_weight`.
    fn feedback<'a>(
        &'a self,
        weighted: &[(String, f64)],
        total: &[f64],
        touched: &[u32],
    ) -> Vec<(&'a str, f64)> {
        let p = &self.params;
        let n = self.len() as f64;
        let mut top: Vec<(f64, u32)> = touched.iter().map(|&d| (total[d as usize], d)).collect();
        let k = p.fb_docs.min(top.len());
        let order = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if top.len() > k {
            top.select_nth_unstable_by(k - 1, order);
            top.truncate(k);
        }
        let Some(first) = top.iter().map(|t| t.0).reduce(f64::max) else {
            return Vec::new();
        };
        let mut scores: HashMap<u32, f64> = HashMap::new();
        for &(s, d) in &top {
            let doc = self.docs[d as usize].as_ref().expect("live doc");
            let terms = if p.fb_names_only {
                &doc.name_terms
            } else {
                &doc.terms
            };
            for &tid in terms {
                *scores.entry(tid).or_default() +=
                    s / first * idf(self.lists[tid as usize].len(), n);
            }
        }
        let mut best: Vec<(f64, &str)> = scores
            .into_iter()
            .map(|(tid, s)| (s, &*self.texts[tid as usize]))
            .filter(|(_, t)| !weighted.iter().any(|(q, _)| q == t))
            .collect();
        best.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        best.truncate(p.fb_terms);
        let max = best.first().map_or(1.0, |b| b.0);
        best.into_iter()
            .map(|(s, t)| (t, p.fb_weight * s / max))
            .collect()
    }

    /// Per-document values that depend on collection statistics (see [`Stats`]).
    fn stats(&self) -> &Stats {
        self.norms.get_or_init(|| {
            let p = &self.params;
            let n = self.len().max(1) as f64;
            let mut avg = [1.0; FIELDS];
            for (f, a) in avg.iter_mut().enumerate() {
                *a = (self.total_len[f] as f64 / n).max(1.0);
            }
            let norms = self
                .lens
                .iter()
                .map(|len| {
                    let mut out = [0.0f32; FIELDS];
                    for f in 0..FIELDS {
                        let norm = 1.0 - p.b[f] + p.b[f] * f64::from(len[f]) / avg[f];
                        out[f] = (p.weight[f] / norm) as f32;
                    }
                    out
                })
                .collect();
            let name_idf = self
                .docs
                .iter()
                .map(|doc| {
                    doc.as_ref().map_or(0.0, |doc| {
                        doc.name_terms
                            .iter()
                            .map(|&t| idf(self.lists[t as usize].len(), n))
                            .sum()
                    })
                })
                .collect();
            Stats { norms, name_idf }
        })
    }

    /// The scores one query term (at query weight 1) gives the tools, through its best exact
    /// or (with `prefixes`) prefix match, and the servers whose names contain it. `best` is all zeros, as long
    /// as the document table, and is left so.
    fn term_data(&self, q: &str, prefixes: bool, best: &mut [f64]) -> TermData {
        let p = &self.params;
        let n = self.len() as f64;
        let norms = &self.stats().norms;
        let mut data = TermData::default();
        // (postings, weight, exact)
        let mut expansions: Vec<(&Vec<Posting>, f64, bool)> = Vec::new();
        if let Some(&tid) = self.dict.get(q) {
            let list = &self.lists[tid as usize];
            expansions.push((list, 1.0, true));
            data.exact = Some((tid, idf(list.len(), n)));
        }
        if prefixes && q.chars().count() >= p.prefix_min_len {
            let range = self
                .dict
                .range::<str, _>((Bound::Excluded(q), Bound::Unbounded))
                .take_while(|(t, _)| t.starts_with(q))
                .take(p.prefix_max_terms);
            for (t, &tid) in range {
                let list = &self.lists[tid as usize];
                // A closer completion counts more: `webf` -> `webfetch` over `webfetcher`.
                let closeness = q.len() as f64 / t.len() as f64;
                expansions.push((list, p.prefix_weight * closeness.sqrt(), false));
            }
        }
        let mut touched: Vec<u32> = Vec::new();
        for &(list, weight, exact) in &expansions {
            let idf = idf(list.len(), n);
            data.max = data.max.max(idf * weight);
            for posting in list.iter() {
                let norm = &norms[posting.doc as usize];
                let tf: f64 = norm
                    .iter()
                    .zip(posting.tf.iter())
                    .map(|(n, t)| f64::from(*n) * f64::from(*t))
                    .sum();
                let s = weight * idf * tf * (p.k1 + 1.0) / (p.k1 + tf);
                let slot = &mut best[posting.doc as usize];
                if *slot == 0.0 {
                    touched.push(posting.doc);
                }
                if exact && posting.tf[NAME] > 0 {
                    data.name_docs.push(posting.doc);
                }
                if s > *slot {
                    *slot = s;
                }
            }
        }
        data.docs = touched
            .into_iter()
            .map(|d| (d, std::mem::take(&mut best[d as usize])))
            .collect();
        if p.server_name > 0.0
            && let Some(servers) = self.server_postings.get(q)
        {
            data.server = p.server_name * idf(servers.len(), self.live_servers as f64);
            data.servers.clone_from(servers);
        }
        data
    }

    /// The scores of the tools for one weighted term list: the terms' scores, the name
    /// coverage bonus, server-name matches and server context. Returns the score by document
    /// id, the scored documents, and the score bound for normalisation.
    fn combine(
        &self,
        weighted: &[(String, f64)],
        cache: &HashMap<&str, TermData>,
    ) -> (Vec<f64>, Vec<u32>, f64) {
        let p = &self.params;
        let mut total = vec![0.0f64; self.docs.len()];
        let mut touched: Vec<u32> = Vec::new();
        // Tools with a query term in their name: the only ones the coverage bonus reaches.
        let mut name_flag = vec![false; self.docs.len()];
        let mut name_matched: Vec<u32> = Vec::new();
        let mut bound = 0.0;
        let mut idf_sum = 0.0;
        let mut idf_count = 0usize;
        // The query's term ids with their weighted idf, for the coverage bonus.
        let mut term_idf: Vec<(u32, f64)> = Vec::new();
        let mut server_score: HashMap<u32, f64> = HashMap::new();
        let mut server_bound: f64 = 0.0;
        for (q, w) in weighted {
            let Some(data) = cache.get(q.as_str()) else {
                continue;
            };
            for &(d, s) in &data.docs {
                let slot = &mut total[d as usize];
                if *slot == 0.0 {
                    touched.push(d);
                }
                *slot += w * s;
            }
            for &d in &data.name_docs {
                if !name_flag[d as usize] {
                    name_flag[d as usize] = true;
                    name_matched.push(d);
                }
            }
            if let Some((tid, idf)) = data.exact {
                term_idf.push((tid, w * idf));
            }
            if data.max > 0.0 {
                bound += w * data.max * (p.k1 + 1.0);
                idf_sum += w * data.max;
                idf_count += 1;
            }
            if data.server > 0.0 {
                let s = w * data.server;
                for &sid in &data.servers {
                    *server_score.entry(sid).or_default() += s;
                }
                server_bound += s;
            }
        }

        // Name coverage: the idf-weighted share of the tool's own name terms in the query.
        let unit = if idf_count > 0 {
            p.coverage * idf_sum / idf_count as f64 * (p.k1 + 1.0)
        } else {
            0.0
        };
        bound += unit;
        term_idf.sort_unstable_by_key(|t| t.0);
        if unit > 0.0 {
            let name_idf = &self.stats().name_idf;
            for &d in &name_matched {
                let doc = self.docs[d as usize].as_ref().expect("live doc");
                let all = name_idf[d as usize];
                let mut covered = 0.0;
                for t in &doc.name_terms {
                    if let Ok(at) = term_idf.binary_search_by_key(t, |q| q.0) {
                        covered += term_idf[at].1;
                    }
                }
                if all > 0.0 {
                    total[d as usize] += unit * covered / all;
                }
            }
        }

        // Server name matches reach every tool of the server.
        for (&sid, s) in &server_score {
            for &m in &self.servers[sid as usize].members {
                if total[m as usize] == 0.0 {
                    touched.push(m);
                }
                total[m as usize] += s;
            }
        }
        bound += server_bound;

        // Server context: every tool of a server gets a share of its best tool's score.
        if p.server_context > 0.0 {
            let mut server_best = vec![0.0f64; self.servers.len()];
            let mut hit_servers = Vec::new();
            for &d in &touched {
                if let Some(sid) = self.doc_server[d as usize] {
                    let best = &mut server_best[sid as usize];
                    if *best == 0.0 {
                        hit_servers.push(sid);
                    }
                    *best = best.max(total[d as usize]);
                }
            }
            // Tools not scored so far join `touched` (their total is still 0 here).
            let mut add = vec![0.0f64; hit_servers.len()];
            for (i, &sid) in hit_servers.iter().enumerate() {
                add[i] = p.server_context * server_best[sid as usize];
            }
            for (&sid, &a) in hit_servers.iter().zip(&add) {
                for &m in &self.servers[sid as usize].members {
                    if total[m as usize] == 0.0 && a > 0.0 {
                        touched.push(m);
                    }
                    total[m as usize] += a;
                }
            }
            bound *= 1.0 + p.server_context;
        }
        (total, touched, bound)
    }
}

/// BM25's idf of a term in `df` of `n` documents.
fn idf(df: usize, n: f64) -> f64 {
    (1.0 + (n - df as f64 + 0.5) / (df as f64 + 0.5)).ln()
}

/// What one query term contributes, at query weight 1 (every part scales with the weight).
#[derive(Debug, Default)]
struct TermData {
    /// (document, score) for the tools the term or a completion of it meets.
    docs: Vec<(u32, f64)>,
    /// Tools with the exact term in their name (may repeat).
    name_docs: Vec<u32>,
    /// The exact term's id and idf.
    exact: Option<(u32, f64)>,
    /// The most the term can give one tool (before the `k1` factor).
    max: f64,
    /// The servers whose names contain the term, and the score they get.
    servers: Vec<u32>,
    server: f64,
}

/// The distinct search terms of a query, in order of first appearance: stop words,
/// punctuation and single letters dropped, identifiers split, English words stemmed, CJK runs
/// as unigrams and bigrams. Empty for a blank, stop-word-only or punctuation-only query.
pub fn query_terms(query: &str) -> Vec<String> {
    // Blobs pasted into a query (base64, minified data) are not search words.
    let text: Vec<&str> = query
        .split_whitespace()
        .filter(|w| w.len() <= MAX_QUERY_WORD)
        .collect();
    let mut terms = Vec::new();
    tokenize(&text.join(" "), TokenOpts { joins: false }, &mut terms);
    terms.retain(|t| t.len() <= MAX_TERM_LEN);
    let mut seen = std::collections::HashSet::new();
    terms.retain(|t| seen.insert(t.clone()));
    terms.truncate(MAX_QUERY_TERMS);
    terms
}

/// Longer whitespace-separated words of a query are skipped as data, not words.
const MAX_QUERY_WORD: usize = 200;
/// Longer query terms are skipped.
const MAX_TERM_LEN: usize = 40;
/// At most this many distinct terms of a query are used.
const MAX_QUERY_TERMS: usize = 64;

/// Whether `query` has at least one search term (see [`query_terms`]).
pub fn is_meaningful_query(query: &str) -> bool {
    !query_terms(query).is_empty()
}

/// Splits a full tool name into (server, tool): `mcp__<server>__<tool>`, or
/// `<server>__<tool>` at the last `__` (catalogs that drop the `mcp__` prefix).
fn split_name(name: &str) -> (&str, &str) {
    if let Some((server, tool)) = split_mcp_name(name) {
        return (server, tool);
    }
    match name.rfind("__") {
        Some(at) if at > 0 && at + 2 < name.len() => (&name[..at], &name[at + 2..]),
        _ => ("", name),
    }
}

/// The terms of each field of a tool.
fn field_terms(spec: &ToolSpec) -> [Vec<String>; FIELDS] {
    let (_, tool) = split_name(&spec.name);
    let mut fields: [Vec<String>; FIELDS] = Default::default();
    tokenize(tool, TokenOpts { joins: true }, &mut fields[NAME]);
    tokenize(
        &spec.description,
        TokenOpts { joins: false },
        &mut fields[DESC],
    );
    let mut text = String::new();
    schema_text(&spec.input_schema, 0, &mut text);
    tokenize(&text, TokenOpts { joins: false }, &mut fields[PARAMS]);
    fields
}

/// Collects property names and descriptions of a JSON schema, nested
/// schemas included, up to a modest depth.
fn schema_text(schema: &Value, depth: usize, out: &mut String) {
    if depth > 4 {
        return;
    }
    let Some(obj) = schema.as_object() else {
        return;
    };
    if depth > 0 {
        for key in ["title", "description"] {
            if let Some(Value::String(s)) = obj.get(key) {
                out.push_str(s);
                out.push('\n');
            }
        }
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, sub) in props {
            out.push_str(name);
            out.push('\n');
            schema_text(sub, depth + 1, out);
        }
    }
    if let Some(items) = obj.get("items") {
        schema_text(items, depth + 1, out);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(subs)) = obj.get(key) {
            for sub in subs {
                schema_text(sub, depth + 1, out);
            }
        }
    }
}
