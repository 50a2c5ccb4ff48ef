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
use tokenize::{TokenOpts, expand_query, tokenize};

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
        let n = self.len() as f64;
        let mut avg = [1.0; FIELDS];
        for (f, a) in avg.iter_mut().enumerate() {
            *a = (self.total_len[f] as f64 / n).max(1.0);
        }
        let idf = |df: usize, n: f64| (1.0 + (n - df as f64 + 0.5) / (df as f64 + 0.5)).ln();
        let mut total = vec![0.0f64; self.docs.len()];
        let mut best = vec![0.0f64; self.docs.len()];
        let mut touched: Vec<u32> = Vec::new();
        // Tools with a query term in their name: the only ones the coverage bonus reaches.
        let mut name_flag = vec![false; self.docs.len()];
        let mut name_matched: Vec<u32> = Vec::new();
        let mut term_touched: Vec<u32> = Vec::new();
        let mut bound = 0.0;
        let mut idf_sum = 0.0;
        let mut idf_count = 0usize;
        // The query's term ids with their weighted idf, for the coverage bonus.
        let mut term_idf: Vec<(u32, f64)> = Vec::new();
        let mut server_score: HashMap<u32, f64> = HashMap::new();
        let mut server_bound: f64 = 0.0;
        let n_servers = self.live_servers as f64;

        let weighted = expand_query(query, &terms, p.related_weight);
        for (q, q_weight) in &weighted {
            // (postings, weight, exact)
            let mut expansions: Vec<(&Vec<Posting>, f64, bool)> = Vec::new();
            if let Some(&tid) = self.dict.get(q.as_str()) {
                let list = &self.lists[tid as usize];
                expansions.push((list, 1.0, true));
                term_idf.push((tid, q_weight * idf(list.len(), n)));
            }
            if q.chars().count() >= p.prefix_min_len {
                let range = self
                    .dict
                    .range::<str, _>((Bound::Excluded(q.as_str()), Bound::Unbounded))
                    .take_while(|(t, _)| t.starts_with(q.as_str()))
                    .take(p.prefix_max_terms);
                for (t, &tid) in range {
                    let list = &self.lists[tid as usize];
                    // A closer completion counts more: `webf` -> `webfetch` over `webfetcher`.
                    let closeness = q.len() as f64 / t.len() as f64;
                    expansions.push((list, p.prefix_weight * closeness.sqrt(), false));
                }
            }
            let mut q_max_idf: f64 = 0.0;
            for &(list, weight, exact) in &expansions {
                let idf = idf(list.len(), n);
                q_max_idf = q_max_idf.max(q_weight * idf * weight);
                for posting in list.iter() {
                    let doc_len = &self.lens[posting.doc as usize];
                    let mut tf = 0.0;
                    for (f, &field_avg) in avg.iter().enumerate() {
                        if posting.tf[f] > 0 {
                            let norm = 1.0 - p.b[f] + p.b[f] * f64::from(doc_len[f]) / field_avg;
                            tf += p.weight[f] * f64::from(posting.tf[f]) / norm;
                        }
                    }
                    let s = q_weight * weight * idf * tf * (p.k1 + 1.0) / (p.k1 + tf);
                    let slot = &mut best[posting.doc as usize];
                    if *slot == 0.0 {
                        term_touched.push(posting.doc);
                    }
                    if exact && posting.tf[NAME] > 0 && !name_flag[posting.doc as usize] {
                        name_flag[posting.doc as usize] = true;
                        name_matched.push(posting.doc);
                    }
                    if s > *slot {
                        *slot = s;
                    }
                }
            }
            // One query term scores a tool once, through its best exact or prefix match.
            for &d in &term_touched {
                let slot = &mut total[d as usize];
                if *slot == 0.0 {
                    touched.push(d);
                }
                *slot += best[d as usize];
                best[d as usize] = 0.0;
            }
            term_touched.clear();
            if q_max_idf > 0.0 {
                bound += q_max_idf * (p.k1 + 1.0);
                idf_sum += q_max_idf;
                idf_count += 1;
            }
            // The term in server names, idf over servers.
            if p.server_name > 0.0
                && let Some(servers) = self.server_postings.get(q.as_str())
            {
                let s = p.server_name * q_weight * idf(servers.len(), n_servers);
                for &sid in servers {
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
            for &d in &name_matched {
                let doc = self.docs[d as usize].as_ref().expect("live doc");
                let (mut covered, mut all) = (0.0, 0.0);
                for t in &doc.name_terms {
                    all += idf(self.lists[*t as usize].len(), n);
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
            let base = total.clone();
            for sid in hit_servers {
                let best = server_best[sid as usize];
                for &m in &self.servers[sid as usize].members {
                    if base[m as usize] == 0.0 {
                        touched.push(m);
                    }
                    total[m as usize] += p.server_context * best;
                }
            }
            bound *= 1.0 + p.server_context;
        }
        if touched.is_empty() {
            return Vec::new();
        }

        let mut hits: Vec<(f64, &str)> = touched
            .iter()
            .map(|&d| {
                let doc = self.docs[d as usize].as_ref().expect("live doc");
                (total[d as usize], doc.name.as_str())
            })
            .filter(|(_, name)| filter(name))
            .collect();
        let order = |a: &(f64, &str), b: &(f64, &str)| b.0.total_cmp(&a.0).then(a.1.cmp(b.1));
        if hits.len() > limit {
            hits.select_nth_unstable_by(limit - 1, order);
            hits.truncate(limit);
        }
        hits.sort_unstable_by(order);
        let bound = if bound > 0.0 { bound } else { 1.0 };
        hits.into_iter()
            .map(|(s, name)| SearchHit {
                name: name.to_owned(),
                score: (s / bound).clamp(0.0, 1.0),
            })
            .collect()
    }
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
