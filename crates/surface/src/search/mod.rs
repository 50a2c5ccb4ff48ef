//! The lexical tool-search index behind `tool_search`.
//!
//! Ranking is BM25F over four fields of a tool: the tool's own name (highest weight), the
//! server part of an MCP name, the description, and the input schema's property names and
//! descriptions (lowest weight). Text is split into terms by [`query_terms`]'s rules:
//! snake_case, camelCase, kebab-case, dotted and `__` identifiers are split, stop words
//! dropped, English suffixes lightly stemmed, and CJK runs indexed as character unigrams and
//! bigrams. A query term also meets the indexed terms it is a prefix of, at a lower weight,
//! and a tool whose name is largely covered by the query gets a bonus.
//!
//! The index is incremental: [`SearchIndex::upsert`] and [`SearchIndex::remove`] touch only
//! the postings of one tool and keep the collection statistics (document frequencies, field
//! lengths) up to date, and a search reads only the postings of its terms.

mod eval;
mod tokenize;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use quiver_contract::{ToolSpec, split_mcp_name};
use serde_json::Value;

pub use eval::{EvalReport, evaluate};
use tokenize::{TokenOpts, tokenize};

/// One search result: a tool name and its score, normalised to `0.0..=1.0` (1.0 would be a
/// tool matching every query term as strongly as the index allows).
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    /// The tool's full name.
    pub name: String,
    /// The relevance, higher is better.
    pub score: f64,
}

/// The indexed fields of a tool.
const NAME: usize = 0;
const SERVER: usize = 1;
const DESC: usize = 2;
const PARAMS: usize = 3;
const FIELDS: usize = 4;

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
    /// Bonus, in units of an average term's full score, for the share of a tool's name terms
    /// that the query contains.
    pub(crate) coverage: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            k1: 1.2,
            weight: [3.0, 1.0, 1.0, 0.4],
            b: [0.5, 0.5, 0.75, 0.75],
            prefix_weight: 0.4,
            prefix_min_len: 3,
            prefix_max_terms: 32,
            coverage: 1.0,
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
    /// The distinct terms of the document, to undo its postings on removal.
    terms: Vec<Box<str>>,
    /// The distinct terms of the tool's own name, for the coverage bonus.
    name_terms: Vec<Box<str>>,
}

/// An incremental inverted index over tool specs. See the module docs for the ranking.
#[derive(Debug, Default)]
pub struct SearchIndex {
    params: Params,
    /// Term -> postings sorted by document id. Sorted by term, so prefixes are a range.
    postings: BTreeMap<Box<str>, Vec<Posting>>,
    docs: Vec<Option<Doc>>,
    free: Vec<u32>,
    by_name: HashMap<String, u32>,
    total_len: [u64; FIELDS],
}

impl SearchIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    #[cfg(test)]
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

    /// Adds a tool, or replaces the tool of the same name. Touches only that tool's postings.
    pub fn upsert(&mut self, spec: &ToolSpec) {
        self.remove(&spec.name);
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
        for (term, tf) in counts {
            let list = self.postings.entry(term.into()).or_default();
            let at = list.partition_point(|p| p.doc < id);
            list.insert(at, Posting { doc: id, tf });
            terms.push(term.into());
        }
        let mut name_terms: Vec<Box<str>> =
            fields[NAME].iter().map(|t| t.as_str().into()).collect();
        name_terms.sort();
        name_terms.dedup();
        for f in 0..FIELDS {
            self.total_len[f] += u64::from(len[f]);
        }
        self.docs[id as usize] = Some(Doc {
            name: spec.name.clone(),
            len,
            terms,
            name_terms,
        });
        self.by_name.insert(spec.name.clone(), id);
    }

    /// Removes the tool `name`; false when it was not indexed.
    pub fn remove(&mut self, name: &str) -> bool {
        let Some(id) = self.by_name.remove(name) else {
            return false;
        };
        let doc = self.docs[id as usize]
            .take()
            .expect("by_name points at a live doc");
        for term in &doc.terms {
            if let Some(list) = self.postings.get_mut(term) {
                if let Ok(at) = list.binary_search_by_key(&id, |p| p.doc) {
                    list.remove(at);
                }
                if list.is_empty() {
                    self.postings.remove(term);
                }
            }
        }
        for f in 0..FIELDS {
            self.total_len[f] -= u64::from(doc.len[f]);
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
        let mut total = vec![0.0f64; self.docs.len()];
        let mut best = vec![0.0f64; self.docs.len()];
        let mut touched: Vec<u32> = Vec::new();
        let mut term_touched: Vec<u32> = Vec::new();
        let mut bound = 0.0;
        let mut idf_sum = 0.0;
        let mut idf_count = 0usize;

        for q in &terms {
            let mut expansions: Vec<(&str, &Vec<Posting>, f64)> = Vec::new();
            if let Some((t, list)) = self.postings.get_key_value(q.as_str()) {
                expansions.push((t, list, 1.0));
            }
            if q.chars().count() >= p.prefix_min_len {
                let range = self
                    .postings
                    .range::<str, _>((Bound::Excluded(q.as_str()), Bound::Unbounded))
                    .take_while(|(t, _)| t.starts_with(q.as_str()))
                    .take(p.prefix_max_terms);
                for (t, list) in range {
                    // A closer completion counts more: `webf` -> `webfetch` over `webfetcher`.
                    let closeness = q.len() as f64 / t.len() as f64;
                    expansions.push((t, list, p.prefix_weight * closeness.sqrt()));
                }
            }
            let mut q_max_idf: f64 = 0.0;
            for (_, list, weight) in &expansions {
                let df = list.len() as f64;
                let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                q_max_idf = q_max_idf.max(idf * weight);
                for posting in list.iter() {
                    let doc = self.docs[posting.doc as usize]
                        .as_ref()
                        .expect("postings point at live docs");
                    let mut tf = 0.0;
                    for f in 0..FIELDS {
                        if posting.tf[f] > 0 {
                            let norm = 1.0 - p.b[f] + p.b[f] * f64::from(doc.len[f]) / avg[f];
                            tf += p.weight[f] * f64::from(posting.tf[f]) / norm;
                        }
                    }
                    let s = weight * idf * tf * (p.k1 + 1.0) / (p.k1 + tf);
                    let slot = &mut best[posting.doc as usize];
                    if *slot == 0.0 {
                        term_touched.push(posting.doc);
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
        }
        if touched.is_empty() {
            return Vec::new();
        }

        // Name coverage: the share of the tool's own name terms found in the query.
        let unit = if idf_count > 0 {
            p.coverage * idf_sum / idf_count as f64 * (p.k1 + 1.0)
        } else {
            0.0
        };
        bound += unit;
        if unit > 0.0 {
            let query_set: std::collections::HashSet<&str> =
                terms.iter().map(String::as_str).collect();
            for &d in &touched {
                let doc = self.docs[d as usize].as_ref().expect("live doc");
                if doc.name_terms.is_empty() {
                    continue;
                }
                let covered = doc
                    .name_terms
                    .iter()
                    .filter(|t| query_set.contains(&***t))
                    .count();
                total[d as usize] += unit * covered as f64 / doc.name_terms.len() as f64;
            }
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
    let mut terms = Vec::new();
    tokenize(query, TokenOpts { joins: false }, &mut terms);
    let mut seen = std::collections::HashSet::new();
    terms.retain(|t| seen.insert(t.clone()));
    terms
}

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
    let (server, tool) = split_name(&spec.name);
    let mut fields: [Vec<String>; FIELDS] = Default::default();
    tokenize(tool, TokenOpts { joins: true }, &mut fields[NAME]);
    tokenize(server, TokenOpts { joins: false }, &mut fields[SERVER]);
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

/// Collects property names and descriptions (and enum values) of a JSON schema, nested
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
        if let Some(Value::Array(values)) = obj.get("enum") {
            for v in values.iter().filter_map(Value::as_str) {
                out.push_str(v);
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
