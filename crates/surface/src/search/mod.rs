//! The lexical tool-search index behind `tool_search`.
//!
//! Over 800 lines: the index's postings, its scoring and the query expansions below work on
//! one set of private structures, updated together on every catalog change; tokenizing,
//! embeddings and evaluation are in their own modules.
//!
//! Ranking is BM25F over three fields of a tool: its own name (highest weight), its
//! description, and its input schema's property names and descriptions (lowest weight).
//! Text is split into terms by [`query_terms`]'s rules: snake_case, camelCase, kebab-case,
//! dotted and `__` identifiers are split (a split word is also kept whole), stop words
//! dropped, English suffixes lightly stemmed, and CJK runs indexed as character unigrams and
//! bigrams. On top of that:
//! - a query term also meets the indexed terms it is a prefix of, at a lower weight;
//! - a few generic related words (save/write, folder/directory, ppt/presentation, ...) and
//!   `file` for a query naming a path are added to the query at a lower weight;
//! - a tool whose name terms the query largely covers (idf-weighted) gets a bonus;
//! - the server part of an MCP name (`mcp__<server>__<tool>`, or `<server>__<tool>`) is
//!   scored with an idf over servers and reaches every tool of the server, and every tool
//!   gets a share of its server's best score;
//! - the best tools lend a share of their score to the tools of their server they are
//!   linked to by their schemas: one names in its name or description what the other
//!   requires as input and does not take itself (a geocoder names the `latitude` and
//!   `longitude` that a nearby-places search requires). A lent score lifts a tool at most to
//!   just below the head of the ranking, so it completes the list after the direct matches;
//! - a capability the request implies without naming it (a place needs a geocoder, an
//!   amount to estimate a calculator, goods to buy a shop's web pages) brings in the tools
//!   named for it at a share of the best score, at most to just below the best tool.
//!
//! The index is incremental: [`SearchIndex::upsert`] and [`SearchIndex::remove`] touch only
//! the postings of one tool and keep the collection statistics (document frequencies, field
//! lengths) up to date, and a search reads only the postings of its terms (prefixes are a
//! range of the sorted term dictionary).
//!
//! Optionally ([`SearchIndex::with_embedder`]) the index also keeps a vector per tool from a
//! deployment's [`Embedder`] and fuses the vector ranking with the lexical one (the `fuse`
//! module: score fusion weighted by the query's length, [`HybridConfig`]). Without an
//! embedder the ranking is the lexical one.

mod embed;
pub(crate) mod eval;
mod fuse;
mod tokenize;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use quiver_contract::{ToolSpec, split_mcp_name};
use serde_json::Value;

use embed::Vectors;
pub use embed::{EmbedError, Embedder, HashedNgrams};
pub use eval::{EvalReport, evaluate, evaluate_with};
pub use fuse::{HybridConfig, QueryVectors, embed_query, query_texts};
use tokenize::{
    TokenOpts, expand_query, implied_terms, is_cjk, is_filler, is_unspaced, path_only_terms,
    tokenize,
};

/// A tool waiting for its vector (see [`SearchIndex::pending_vectors`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PendingVector {
    /// The tool's name.
    pub name: String,
    /// The key of the text (model and text): what the vector is stored under.
    pub key: String,
    /// The text to embed.
    pub text: String,
}

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

/// The least share of the best hit's score a hit must have to be returned.
const MIN_SHARE_OF_BEST: f64 = 0.1;

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
    /// The share of the best score that a tool of a capability the request implies gets
    /// (see `SearchIndex::complete_implied`; 0 turns them off).
    pub(crate) implied_weight: f64,
    /// An implied capability's tool is lifted at most to just below the tool at this rank.
    pub(crate) implied_head: usize,
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
    /// The share of its score that one of the best tools lends to each tool of its server
    /// linked to it by their schemas (times the link's strength; 0 turns links off).
    pub(crate) link_share: f64,
    /// How many of the best tools lend a share to their linked tools.
    pub(crate) link_lenders: usize,
    /// A lent share lifts a tool at most to just below the tool at this rank.
    pub(crate) link_head: usize,
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
            implied_weight: 0.5,
            implied_head: 1,
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
            link_share: 0.2,
            link_lenders: 3,
            link_head: 5,
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
    /// The distinct term ids of the names of the tool's required parameters (those in its
    /// own parameters field, so that its postings keep the ids alive), sorted.
    needs: Vec<u32>,
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
    /// Document id -> its name terms inline when they are few (beside `docs`, so the
    /// coverage bonus of many tools does not chase a pointer per tool).
    name_ids: Vec<NameIds>,
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
    /// The optional vector retriever (see the `embed` module): `None` by default.
    vectors: Option<Vectors>,
}

/// Per-search working arrays, kept per thread so that a search allocates nothing in
/// proportion to the catalog. Every array is all zeros (or `false`) between searches;
/// `dirty` marks one that a search left midway (a panicking filter), cleared in full on
/// next use.
#[derive(Debug, Default)]
struct Scratch {
    dirty: bool,
    /// Document id -> one term's best score (`term_data`), or a lent share
    /// (`lend_to_linked`).
    best: Vec<f64>,
    /// Document id -> the combined score (`combine`).
    total: Vec<f64>,
    /// Document id -> whether a query term is in its name (`combine`).
    flag: Vec<bool>,
    /// Term id -> its idf, once computed in this search (0 = not yet).
    idf: Vec<f64>,
    /// The term ids set in `idf`.
    idf_set: Vec<u32>,
    /// Server id -> its server-name score, then its best tool's score (`combine`).
    server: Vec<f64>,
}

impl Scratch {
    /// Readies the arrays for an index of these sizes.
    fn prepare(&mut self, docs: usize, terms: usize, servers: usize) {
        if self.dirty {
            self.best.fill(0.0);
            self.total.fill(0.0);
            self.flag.fill(false);
            self.idf.fill(0.0);
            self.idf_set.clear();
            self.server.fill(0.0);
        }
        if self.best.len() < docs {
            self.best.resize(docs, 0.0);
            self.total.resize(docs, 0.0);
            self.flag.resize(docs, false);
        }
        if self.idf.len() < terms {
            self.idf.resize(terms, 0.0);
        }
        if self.server.len() < servers {
            self.server.resize(servers, 0.0);
        }
        self.dirty = true;
    }

    /// Marks the arrays clean again (the caller has reset what it set).
    fn finish(&mut self) {
        for t in self.idf_set.drain(..) {
            self.idf[t as usize] = 0.0;
        }
        self.dirty = false;
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Per field, the two halves of BM25's length normalisation, `1 - b` and `b / avg`, and the
/// field weight: a tool's field of length `len` scores `weight / (1 - b + b * len / avg)`
/// per occurrence. Computed per search from the running totals, so a change to the index
/// invalidates nothing.
#[derive(Debug, Clone, Copy)]
struct FieldNorm {
    /// Per field, `b / avg`.
    slope: [f64; FIELDS],
    /// Per field, `1 - b`.
    base: [f64; FIELDS],
    weight: [f64; FIELDS],
}

impl FieldNorm {
    /// The weighted, length-normalised term frequency of one posting.
    #[inline]
    fn tf(&self, len: &[u32; FIELDS], tf: &[u16; FIELDS]) -> f64 {
        let mut sum = 0.0;
        for f in 0..FIELDS {
            if tf[f] > 0 {
                let norm = self.base[f] + self.slope[f] * f64::from(len[f]);
                // Rounded through f32 as the per-document table this replaced was.
                sum += f64::from((self.weight[f] / norm) as f32) * f64::from(tf[f]);
            }
        }
        sum
    }
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

    /// An empty index that also keeps a vector per tool from `embedder` and fuses a vector
    /// ranking into the lexical one as `config` says (see [`HybridConfig`]). Tools get their
    /// vectors through [`SearchIndex::set_vector`] or [`SearchIndex::embed_pending`]; until
    /// then they are ranked lexically. A failing embedder degrades to the lexical ranking,
    /// with a warning.
    pub fn with_embedder(embedder: Arc<dyn Embedder>, config: HybridConfig) -> Self {
        SearchIndex {
            vectors: Some(Vectors::new(embedder, config.sanitised())),
            ..Self::default()
        }
    }

    /// Whether a vector retriever is fused in.
    pub fn has_embedder(&self) -> bool {
        self.vectors.is_some()
    }

    /// Adds or replaces many tools.
    pub fn upsert_all(&mut self, specs: &[&ToolSpec]) {
        for spec in specs {
            self.upsert(spec);
        }
    }

    /// The tools that wait for their vector, at most `max`: name, text key (for
    /// [`SearchIndex::set_vector`] and the store) and the text to embed. Empty without an
    /// embedder.
    pub fn pending_vectors(&self, max: usize) -> Vec<PendingVector> {
        let Some(v) = &self.vectors else {
            return Vec::new();
        };
        v.pending
            .iter()
            .take(max)
            .map(|(&d, text)| PendingVector {
                name: self.name_of(d).to_owned(),
                key: format!("{:016x}", v.keys[d as usize]),
                text: text.clone(),
            })
            .collect()
    }

    /// The text key a tool's vector must have now (see [`SearchIndex::pending_vectors`]);
    /// `None` without an embedder or for a tool not indexed.
    pub fn vector_key(&self, name: &str) -> Option<String> {
        let v = self.vectors.as_ref()?;
        let &d = self.by_name.get(name)?;
        Some(format!("{:016x}", v.keys[d as usize]))
    }

    /// Gives the tool `name` its vector, computed from the text of `key` (from
    /// [`SearchIndex::pending_vectors`] or a store). False, and nothing changes, when the tool
    /// is gone or its text changed since, or the vector is unusable (empty, zero, not finite,
    /// or of another length than the others).
    pub fn set_vector(&mut self, name: &str, key: &str, vector: &[f32]) -> bool {
        let (Some(v), Some(&d), Ok(key)) = (
            self.vectors.as_mut(),
            self.by_name.get(name),
            u64::from_str_radix(key, 16),
        ) else {
            return false;
        };
        v.set(d, key, vector)
    }

    /// Embeds every tool waiting for its vector, in batches, on this thread. For a small
    /// catalog or a benchmark; a server computes vectors off the index and sets them.
    pub fn embed_pending(&mut self) {
        const BATCH: usize = 64;
        loop {
            let pending = self.pending_vectors(BATCH);
            if pending.is_empty() {
                return;
            }
            let Some(v) = &self.vectors else { return };
            let texts: Vec<&str> = pending.iter().map(|p| p.text.as_str()).collect();
            let vectors = embed::embed_logged(&*v.embedder, &texts);
            let mut any = false;
            for (p, vec) in pending.iter().zip(vectors) {
                if let Some(vec) = vec {
                    any |= self.set_vector(&p.name, &p.key, &vec);
                }
            }
            if !any {
                // The embedder fails: the tools stay lexical.
                return;
            }
        }
    }

    /// Whether any tool has its vector (fusion is off until one has).
    pub fn has_vectors(&self) -> bool {
        self.vectors.as_ref().is_some_and(|v| v.dims > 0)
    }

    /// Takes from `old` the vectors of the tools whose text (and model) is the same here: a
    /// rebuilt index computes only what changed.
    pub fn adopt_vectors(&mut self, old: &SearchIndex) {
        let (Some(mine), Some(theirs)) = (self.vectors.as_mut(), old.vectors.as_ref()) else {
            return;
        };
        if mine.embedder.model_id() != theirs.embedder.model_id() {
            return;
        }
        let waiting: Vec<u32> = mine.pending.keys().copied().collect();
        for d in waiting {
            let Some(name) = self.docs[d as usize].as_ref().map(|doc| doc.name.as_str()) else {
                continue;
            };
            if let Some(&od) = old.by_name.get(name)
                && let Some(v) = theirs.by_doc.get(od as usize).and_then(|v| v.as_deref())
                && theirs.keys[od as usize] == mine.keys[d as usize]
            {
                mine.set(d, mine.keys[d as usize], v);
            }
        }
    }

    /// How many indexed tools have their vector (0 without an embedder).
    pub fn vectors_ready(&self) -> usize {
        self.vectors
            .as_ref()
            .map_or(0, |v| v.by_doc.iter().filter(|x| x.is_some()).count())
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
        let id = self.upsert_lexical(spec);
        if let Some(v) = &mut self.vectors {
            v.track(id, embed_text(spec));
        }
    }

    /// [`SearchIndex::upsert`] without the vector; returns the tool's document id.
    fn upsert_lexical(&mut self, spec: &ToolSpec) -> u32 {
        self.remove_lexical(&spec.name);
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
        let required = required_terms(&spec.input_schema);
        let mut terms = Vec::with_capacity(counts.len());
        let mut name_terms = Vec::new();
        let mut needs = Vec::new();
        for (term, tf) in counts {
            let tid = self.term_id(term);
            let list = &mut self.lists[tid as usize];
            let at = list.partition_point(|p| p.doc < id);
            list.insert(at, Posting { doc: id, tf });
            terms.push(tid);
            if tf[NAME] > 0 {
                name_terms.push(tid);
            }
            if tf[PARAMS] > 0 && required.iter().any(|r| r == term) {
                needs.push(tid);
            }
        }
        needs.sort_unstable();
        if self.lens.len() < self.docs.len() {
            self.lens.resize(self.docs.len(), [0; FIELDS]);
            self.doc_server.resize(self.docs.len(), None);
            self.name_ids.resize(self.docs.len(), NameIds::default());
        }
        self.lens[id as usize] = len;
        for (total, l) in self.total_len.iter_mut().zip(len) {
            *total += u64::from(l);
        }
        let server_id = (!server.is_empty()).then(|| self.server_id(server));
        self.doc_server[id as usize] = server_id;
        self.name_ids[id as usize] = NameIds::new(&name_terms);
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
            needs,
        });
        self.by_name.insert(spec.name.clone(), id);
        id
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
        let Some(&id) = self.by_name.get(name) else {
            return false;
        };
        if let Some(v) = &mut self.vectors {
            v.forget(id);
        }
        self.remove_lexical(name)
    }

    /// [`SearchIndex::remove`] of the postings only: a re-indexed tool whose text is the
    /// same keeps its vector.
    fn remove_lexical(&mut self, name: &str) -> bool {
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
        self.name_ids[id as usize] = NameIds::default();
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
    ///
    /// A tool the filter hides takes no part in the ranking: its words do not feed back and
    /// it lends no share to its server's tools, so what a caller gets does not tell whether
    /// tools it cannot see match (the corpus statistics, idf and field lengths, are the
    /// whole index's). [`SearchIndex::search_public`] is the faster variant for a filter
    /// that hides the same tools from every caller.
    pub fn search(
        &self,
        query: &str,
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
    ) -> Vec<SearchHit> {
        self.search_as(query, None, limit, filter, true)
    }

    /// [`SearchIndex::search`] for a filter that hides the same tools from every caller (a
    /// mode's, the system tools): hidden tools still feed back and lend their server's
    /// share (only the hits are filtered), which spares a filter call per scored tool.
    /// Never for a filter that differs per caller (an allow-list): the hits would tell it
    /// whether tools it cannot see match.
    pub fn search_public(
        &self,
        query: &str,
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
    ) -> Vec<SearchHit> {
        self.search_as(query, None, limit, filter, false)
    }

    /// [`SearchIndex::search`] (`private`) or [`SearchIndex::search_public`] with the query's
    /// vectors computed beforehand ([`embed_query`]), so that the embedding does not run
    /// under a lock on the index. `None`: embedded here, when the index has an embedder.
    pub fn search_embedded(
        &self,
        query: &str,
        vectors: Option<&QueryVectors>,
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
        private: bool,
    ) -> Vec<SearchHit> {
        self.search_as(query, vectors, limit, filter, private)
    }

    fn search_as(
        &self,
        query: &str,
        vectors: Option<&QueryVectors>,
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
        private: bool,
    ) -> Vec<SearchHit> {
        let query = clip_query(query);
        let terms = query_terms(query);
        if terms.is_empty() || limit == 0 || self.is_empty() {
            return Vec::new();
        }
        if let Some(v) = &self.vectors
            && v.config.is_on()
            && v.dims > 0
        {
            let own;
            let qv = match vectors {
                Some(q) => Some(q),
                None => {
                    own = embed_query(&*v.embedder, &v.config, query);
                    own.as_ref()
                }
            };
            // Without a query vector (the embedder failed) the ranking is the lexical one.
            if let Some(qv) = qv {
                return self.search_fused(query, &terms, qv, limit, filter, v, private);
            }
        }
        self.search_lexical(query, &terms, limit, filter, private)
    }

    fn search_lexical(
        &self,
        query: &str,
        terms: &[String],
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
        private: bool,
    ) -> Vec<SearchHit> {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => self.search_in(query, terms, limit, filter, private, &mut s),
            // A search from inside a filter: its own arrays.
            Err(_) => self.search_in(
                query,
                terms,
                limit,
                filter,
                private,
                &mut Scratch::default(),
            ),
        })
    }

    fn search_in(
        &self,
        query: &str,
        terms: &[String],
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
        private: bool,
        s: &mut Scratch,
    ) -> Vec<SearchHit> {
        s.prepare(self.docs.len(), self.lists.len(), self.servers.len());
        let hits = self.rank(query, terms, limit, filter, private, s);
        s.finish();
        hits
    }

    fn rank(
        &self,
        query: &str,
        terms: &[String],
        limit: usize,
        filter: &dyn Fn(&str) -> bool,
        private: bool,
        s: &mut Scratch,
    ) -> Vec<SearchHit> {
        // What may shape the ranking besides the hits themselves: the filter, or (a public
        // filter) every tool.
        let everything = |_: &str| true;
        let shaping: &dyn Fn(&str) -> bool = if private { filter } else { &everything };
        let p = &self.params;
        let norm = self.field_norm();
        let whole = self.weigh(query, terms);
        let mut cache: HashMap<&str, TermData> = HashMap::with_capacity(whole.len() + p.fb_terms);
        for (q, _) in &whole {
            if !cache.contains_key(q.as_str()) {
                let data = self.term_data(q, true, &norm, &mut s.best);
                cache.insert(q.as_str(), data);
            }
        }
        let mut acc = Acc::default();
        self.accumulate(&whole, &cache, s, &mut acc);
        let feedback_on = p.fb_weight > 0.0 && p.fb_docs > 0 && p.fb_terms > 0;
        // The term sums before the non-linear parts, for the feedback pass to go on from.
        let linear: Vec<f64> = if feedback_on {
            acc.touched.iter().map(|&d| s.total[d as usize]).collect()
        } else {
            Vec::new()
        };
        let (mut touched, mut bound) = self.finish(&acc, s, shaping);
        if touched.is_empty() {
            return Vec::new();
        }
        if feedback_on {
            // Only tools that match a query term feed back (not those lifted by their
            // server's name or context alone).
            let matched: Vec<u32> = acc
                .touched
                .iter()
                .zip(&linear)
                .filter(|(_, v)| **v > 0.0)
                .map(|(&d, _)| d)
                .collect();
            let feedback = self.feedback(&whole, &s.total, &matched, shaping);
            if !feedback.is_empty() {
                let mut more: Vec<(String, f64)> = Vec::with_capacity(feedback.len());
                for &(t, w) in &feedback {
                    if !cache.contains_key(t) {
                        // A feedback term is an indexed term: no prefix completions.
                        let data = self.term_data(t, false, &norm, &mut s.best);
                        cache.insert(t, data);
                    }
                    more.push((t.to_owned(), w));
                }
                // The query's terms followed by the feedback terms, as one term list: the
                // feedback terms' sums go on from the query's.
                for &d in &touched {
                    s.total[d as usize] = 0.0;
                }
                for (&d, &v) in acc.touched.iter().zip(&linear) {
                    s.total[d as usize] = v;
                }
                self.accumulate(&more, &cache, s, &mut acc);
                (touched, bound) = self.finish(&acc, s, shaping);
            }
        }
        let bound = if bound > 0.0 { bound } else { 1.0 };
        let mut cands: Vec<(f64, u32)> =
            touched.iter().map(|&d| (s.total[d as usize], d)).collect();
        for &d in &touched {
            s.total[d as usize] = 0.0;
        }
        if p.link_share > 0.0 && p.link_lenders > 0 {
            self.lend_to_linked(&mut cands, filter, s);
        }
        let implied = if p.implied_weight > 0.0 {
            implied_terms(query)
        } else {
            Vec::new()
        };
        if !implied.is_empty() {
            self.complete_implied(&implied, &norm, &mut cands, filter, s);
        }
        let depth = limit.max(p.diversify_depth);
        let mut hits = self.best_filtered(&mut cands, depth, filter);
        if p.diversity > 0.0 && hits.len() > 2 {
            self.diversify(&mut hits, &whole, &cache, &mut s.best);
        }
        hits.truncate(limit);
        // Scores never rise down the list (diversification may move a tool up), and tools
        // of equal score are in name order.
        let mut cap = f64::INFINITY;
        let mut out: Vec<SearchHit> = hits
            .into_iter()
            .map(|(s, name, _)| {
                cap = cap.min(s);
                SearchHit {
                    name: name.to_owned(),
                    score: (cap / bound).clamp(0.0, 1.0),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.name.cmp(&b.name))
        });
        // A hit far below the best shares next to nothing with the query (it came in on a
        // prefix or its server's context): paged in, it would only push out tools that
        // matter. On livemcpbench no needed tool in a top 10 scores under this share.
        if let Some(best) = out.first().map(|h| h.score) {
            out.retain(|h| h.score >= best * MIN_SHARE_OF_BEST && h.score > 0.0);
        }
        out
    }

    /// Orders (score, document) best first, ties by name, not by document id: ids are
    /// reused as tools come and go, and the ranking must not depend on the order tools were
    /// indexed in.
    fn best_first(&self, a: &(f64, u32), b: &(f64, u32)) -> std::cmp::Ordering {
        let name = |d: u32| {
            self.docs[d as usize]
                .as_ref()
                .map_or("", |doc| doc.name.as_str())
        };
        b.0.total_cmp(&a.0).then_with(|| name(a.1).cmp(name(b.1)))
    }

    /// Schema links: each of the best `link_lenders` of the scored tools `cands` (score,
    /// document) lends `link_share` of its score, times the strength of the link, to every
    /// tool of its server it is linked to (see [`SearchIndex::feeds`], either way round; a
    /// tool lent by several keeps the largest share). A lent share lifts a tool at most to
    /// just below the tool at rank `link_head` and never moves a tool at or above it. A tool
    /// not scored so far joins `cands`. The lenders and the head are tools that pass
    /// `filter`: a tool the caller cannot see neither lends nor sets the ceiling. `s.best`
    /// is all zeros and is left so.
    fn lend_to_linked(
        &self,
        cands: &mut Vec<(f64, u32)>,
        filter: &dyn Fn(&str) -> bool,
        s: &mut Scratch,
    ) {
        let p = &self.params;
        let best = self.head(cands, p.link_lenders.max(p.link_head), filter);
        let Some(ceiling) = ceiling(&best, p.link_head) else {
            return;
        };
        let n = self.len() as f64;
        // The tools lent to; their largest share is in `s.best`.
        let mut lent: Vec<u32> = Vec::new();
        for &(score, d) in best.iter().take(p.link_lenders) {
            let (Some(sid), Some(doc)) =
                (self.doc_server[d as usize], self.docs[d as usize].as_ref())
            else {
                continue;
            };
            for &m in &self.servers[sid as usize].members {
                let Some(other) = self.docs[m as usize].as_ref().filter(|_| m != d) else {
                    continue;
                };
                let link = self.feeds(d, other, n, s).max(self.feeds(m, doc, n, s));
                let share = p.link_share * score * link;
                let slot = &mut s.best[m as usize];
                if share > *slot {
                    if *slot == 0.0 {
                        lent.push(m);
                    }
                    *slot = share;
                }
            }
        }
        if lent.is_empty() {
            return;
        }
        add_below(cands, &lent, ceiling, &mut s.best);
    }

    /// The best `keep` of `cands` that pass `filter`, best first, in one pass without
    /// sorting them all. The filter runs only on a tool that would enter the head.
    fn head(
        &self,
        cands: &[(f64, u32)],
        keep: usize,
        filter: &dyn Fn(&str) -> bool,
    ) -> Vec<(f64, u32)> {
        let order = |a: &(f64, u32), b: &(f64, u32)| self.best_first(a, b);
        let mut best: Vec<(f64, u32)> = Vec::with_capacity(keep + 1);
        if keep == 0 {
            return best;
        }
        for c in cands {
            // Most tools score below the last of a full `best`: one comparison each.
            if best.len() == keep && (c.0 < best[keep - 1].0 || order(c, &best[keep - 1]).is_ge()) {
                continue;
            }
            let visible = self.docs[c.1 as usize]
                .as_ref()
                .is_some_and(|doc| filter(&doc.name));
            if !visible {
                continue;
            }
            let at = best.partition_point(|b| order(b, c).is_lt());
            best.insert(at, *c);
            best.truncate(keep);
        }
        best
    }

    /// Completes the ranking with the tools of the capabilities the request implies
    /// without naming them (`tokenize::implied_needs`: a geocoder for a place, a calculator
    /// for "estimate its value"). Only a tool named for a capability (one of its terms,
    /// exactly, in its name) provides it: a geocoder is named `geocode`, a tool that takes
    /// an `address` is not one. Such a tool gets `implied_weight` times the best score times
    /// how well it matches the capability's terms (1 for the best match among the tools so
    /// named), lifting it at most to just below the tool at rank `implied_head`, so that
    /// what the request names stays first. A tool not scored so far joins `cands`.
    /// `s.best` is all zeros and is left so.
    fn complete_implied(
        &self,
        needs: &[Vec<String>],
        norm: &FieldNorm,
        cands: &mut Vec<(f64, u32)>,
        filter: &dyn Fn(&str) -> bool,
        s: &mut Scratch,
    ) {
        let p = &self.params;
        let best = self.head(cands, p.implied_head.max(1), filter);
        let (Some(ceiling), Some(top)) = (ceiling(&best, p.implied_head), best.first()) else {
            return;
        };
        let unit = p.implied_weight * top.0;
        let n = self.len() as f64;
        let mut lifted: Vec<u32> = Vec::new();
        for terms in needs {
            // Each term's postings with its idf, computed once.
            let lists: Vec<(&Vec<Posting>, f64)> = terms
                .iter()
                .filter_map(|t| self.dict.get(t.as_str()))
                .map(|&tid| {
                    let list = &self.lists[tid as usize];
                    (list, idf(list.len(), n))
                })
                .collect();
            let mut named: Vec<u32> = lists
                .iter()
                .flat_map(|(list, _)| list.iter().filter(|p| p.tf[NAME] > 0).map(|p| p.doc))
                .collect();
            named.sort_unstable();
            named.dedup();
            // Each named tool's BM25F score for the capability's terms, in all its fields.
            let sums: Vec<(u32, f64)> = named
                .into_iter()
                .map(|d| {
                    let sum = lists
                        .iter()
                        .filter_map(|&(list, idf)| {
                            let at = list.binary_search_by_key(&d, |p| p.doc).ok()?;
                            let tf = norm.tf(&self.lens[d as usize], &list[at].tf);
                            Some(idf * tf * (p.k1 + 1.0) / (p.k1 + tf))
                        })
                        .sum();
                    (d, sum)
                })
                .collect();
            let Some(max) = sums.iter().map(|x| x.1).reduce(f64::max) else {
                continue;
            };
            for (d, sum) in sums {
                let lift = unit * sum / max;
                let slot = &mut s.best[d as usize];
                if *slot == 0.0 {
                    lifted.push(d);
                }
                *slot = slot.max(lift);
            }
        }
        add_below(cands, &lifted, ceiling, &mut s.best);
    }

    /// How much of what `needer` requires the tool `giver` names in its name or description
    /// without taking it as a parameter itself: the idf-weighted share of `needer`'s
    /// required parameter terms, `0.0..=1.0`.
    fn feeds(&self, giver: u32, needer: &Doc, n: f64, s: &mut Scratch) -> f64 {
        let (mut all, mut named) = (0.0, 0.0);
        for &t in &needer.needs {
            let w = self.term_idf(t, n, s);
            all += w;
            let list = &self.lists[t as usize];
            if let Ok(at) = list.binary_search_by_key(&giver, |p| p.doc) {
                let tf = list[at].tf;
                if (tf[NAME] > 0 || tf[DESC] > 0) && tf[PARAMS] == 0 {
                    named += w;
                }
            }
        }
        if all > 0.0 { named / all } else { 0.0 }
    }

    /// The name of a live document.
    fn name_of(&self, d: u32) -> &str {
        self.docs[d as usize]
            .as_ref()
            .expect("live doc")
            .name
            .as_str()
    }

    /// The best `depth` of the scored tools `cands` that pass `filter`, by score and then
    /// name. The filter runs on the best-scored tools only, in growing windows, until the
    /// window holds `depth` passing tools scored above its edge (every tool outside it
    /// scores at most the edge, so none of them can be among the best).
    fn best_filtered(
        &self,
        cands: &mut [(f64, u32)],
        depth: usize,
        filter: &dyn Fn(&str) -> bool,
    ) -> Vec<(f64, &str, u32)> {
        let order =
            |a: &(f64, &str, u32), b: &(f64, &str, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(b.1));
        let mut window = depth.saturating_mul(2).max(32);
        while window < cands.len() {
            cands.select_nth_unstable_by(window - 1, |a, b| b.0.total_cmp(&a.0));
            let edge = cands[window - 1].0;
            let mut hits: Vec<(f64, &str, u32)> = cands[..window]
                .iter()
                .filter(|c| c.0 > edge)
                .map(|&(s, d)| (s, self.name_of(d), d))
                .filter(|h| filter(h.1))
                .collect();
            if hits.len() >= depth {
                hits.sort_unstable_by(order);
                hits.truncate(depth);
                return hits;
            }
            window = window.saturating_mul(4);
        }
        let mut hits: Vec<(f64, &str, u32)> = cands
            .iter()
            .map(|&(s, d)| (s, self.name_of(d), d))
            .filter(|h| filter(h.1))
            .collect();
        hits.sort_unstable_by(order);
        hits.truncate(depth);
        hits
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
        filter: &dyn Fn(&str) -> bool,
    ) -> Vec<(&'a str, f64)> {
        let p = &self.params;
        let n = self.len() as f64;
        let scored: Vec<(f64, u32)> = touched.iter().map(|&d| (total[d as usize], d)).collect();
        // Only tools the caller can see feed back: a hidden tool's words would lift the
        // visible ones, so the answer would tell whether hidden tools match.
        let top = self.head(&scored, p.fb_docs, filter);
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

    /// The BM25F length normalisation for the index as it is now (see [`FieldNorm`]).
    fn field_norm(&self) -> FieldNorm {
        let p = &self.params;
        let n = self.len().max(1) as f64;
        let mut avg = [1.0; FIELDS];
        for (f, a) in avg.iter_mut().enumerate() {
            *a = (self.total_len[f] as f64 / n).max(1.0);
        }
        // One division per posting field.
        let mut c0 = [0.0; FIELDS];
        let mut c1 = [0.0; FIELDS];
        for f in 0..FIELDS {
            c0[f] = 1.0 - p.b[f];
            c1[f] = p.b[f] / avg[f];
        }
        FieldNorm {
            slope: c1,
            base: c0,
            weight: p.weight,
        }
    }

    /// The idf of an indexed term, memoised for the rest of the search in `s.idf`.
    fn term_idf(&self, tid: u32, n: f64, s: &mut Scratch) -> f64 {
        let slot = &mut s.idf[tid as usize];
        if *slot == 0.0 {
            *slot = idf(self.lists[tid as usize].len(), n);
            s.idf_set.push(tid);
        }
        *slot
    }

    /// The scores one query term (at query weight 1) gives the tools, through its best exact
    /// or (with `prefixes`) prefix match, and the servers whose names contain it. `best` is
    /// all zeros, at least as long as the document table, and is left so.
    fn term_data(&self, q: &str, prefixes: bool, norm: &FieldNorm, best: &mut [f64]) -> TermData {
        let p = &self.params;
        let n = self.len() as f64;
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
            // A word typed past its stem: the index holds `creat` for "create", "creating",
            // so `creati` and `creatin` complete nothing. An indexed term it starts with,
            // at most three letters shorter, is the word it was going to be; and a stem
            // ending in `y` is typed with `i` ("repositori" of "repositories").
            if data.exact.is_none() && q.is_ascii() && q.len() >= 5 {
                // What was typed past the stem must be the start of a suffix the stemmer
                // takes off ("creature" is not "create").
                const SUFFIXES: [&str; 8] = ["ing", "ion", "ation", "ed", "es", "er", "al", "ly"];
                let stem_of = (1..=3)
                    .filter(|&cut| {
                        let tail = &q[q.len() - cut..];
                        SUFFIXES.iter().any(|s| s.starts_with(tail))
                    })
                    .map(|cut| &q[..q.len() - cut])
                    .filter(|t| t.len() >= 4)
                    .find_map(|t| self.dict.get(t).map(|&tid| (t.len(), tid)));
                let y_for_i = q
                    .strip_suffix('i')
                    .and_then(|base| self.dict.get(format!("{base}y").as_str()))
                    .map(|&tid| (q.len(), tid));
                for (len, tid) in stem_of.into_iter().chain(y_for_i) {
                    let list = &self.lists[tid as usize];
                    let closeness = len as f64 / q.len() as f64;
                    expansions.push((list, p.prefix_weight * closeness.sqrt(), false));
                }
            }
        }
        let mut touched: Vec<u32> = Vec::new();
        let k1 = p.k1;
        for &(list, weight, exact) in &expansions {
            let idf = idf(list.len(), n);
            data.max = data.max.max(idf * weight);
            for posting in list.iter() {
                let tf = norm.tf(&self.lens[posting.doc as usize], &posting.tf);
                let s = weight * idf * tf * (k1 + 1.0) / (k1 + tf);
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

    /// Adds the scores of a weighted term list to `s.total` and `acc` (the part of the
    /// scoring that is a sum over terms, so a term list can be scored in parts).
    fn accumulate(
        &self,
        weighted: &[(String, f64)],
        cache: &HashMap<&str, TermData>,
        s: &mut Scratch,
        acc: &mut Acc,
    ) {
        let p = &self.params;
        for &d in &acc.name_matched {
            s.flag[d as usize] = true;
        }
        for (q, w) in weighted {
            let Some(data) = cache.get(q.as_str()) else {
                continue;
            };
            let total = &mut s.total;
            for &(d, sc) in &data.docs {
                let slot = &mut total[d as usize];
                if *slot == 0.0 {
                    acc.touched.push(d);
                }
                *slot += w * sc;
            }
            for &d in &data.name_docs {
                if !s.flag[d as usize] {
                    s.flag[d as usize] = true;
                    acc.name_matched.push(d);
                }
            }
            if let Some((tid, idf)) = data.exact {
                acc.term_idf.push((tid, w * idf));
            }
            if data.max > 0.0 {
                acc.bound += w * data.max * (p.k1 + 1.0);
                acc.idf_sum += w * data.max;
                acc.idf_count += 1;
            }
            if data.server > 0.0 {
                let sc = w * data.server;
                for &sid in &data.servers {
                    acc.servers.push((sid, sc));
                }
                acc.server_bound += sc;
            }
        }
        for &d in &acc.name_matched {
            s.flag[d as usize] = false;
        }
    }

    /// The scores of the tools from the term sums in `s.total` and `acc`: adds the name
    /// coverage bonus, server-name matches and server context to `s.total` (the caller
    /// zeroes it again for the returned documents), and returns the scored documents and the
    /// score bound for normalisation.
    fn finish(&self, acc: &Acc, s: &mut Scratch, filter: &dyn Fn(&str) -> bool) -> (Vec<u32>, f64) {
        let p = &self.params;
        let mut touched = acc.touched.clone();
        let name_matched = &acc.name_matched;
        let mut bound = acc.bound;
        let (idf_sum, idf_count) = (acc.idf_sum, acc.idf_count);
        let mut term_idf = acc.term_idf.clone();
        let server_bound = acc.server_bound;
        let mut hit_servers: Vec<u32> = Vec::new();
        for &(sid, sc) in &acc.servers {
            let slot = &mut s.server[sid as usize];
            if *slot == 0.0 {
                hit_servers.push(sid);
            }
            *slot += sc;
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
            let n = self.len() as f64;
            for &d in name_matched {
                let inline = &self.name_ids[d as usize];
                let terms = match inline.get() {
                    Some(terms) => terms,
                    None => &self.docs[d as usize].as_ref().expect("live doc").name_terms,
                };
                let mut all = 0.0;
                let mut covered = 0.0;
                for &t in terms {
                    all += self.term_idf(t, n, s);
                    if let Ok(at) = term_idf.binary_search_by_key(&t, |q| q.0) {
                        covered += term_idf[at].1;
                    }
                }
                if all > 0.0 {
                    s.total[d as usize] += unit * covered / all;
                }
            }
        }

        // Server name matches reach every tool of the server.
        let total = &mut s.total;
        for &sid in &hit_servers {
            let sc = std::mem::take(&mut s.server[sid as usize]);
            for &m in &self.servers[sid as usize].members {
                if total[m as usize] == 0.0 {
                    touched.push(m);
                }
                total[m as usize] += sc;
            }
        }
        bound += server_bound;

        // Server context: every tool of a server gets a share of its best tool's score,
        // the best the caller can see (a hidden tool would lift its visible siblings, and
        // so tell that it matches). The filter runs only on a tool that would raise its
        // server's best.
        if p.server_context > 0.0 {
            let server_best = &mut s.server;
            let mut hit_servers = Vec::new();
            for &d in &touched {
                if let Some(sid) = self.doc_server[d as usize] {
                    let best = &mut server_best[sid as usize];
                    let score = total[d as usize];
                    if score > *best
                        && self.docs[d as usize]
                            .as_ref()
                            .is_some_and(|doc| filter(&doc.name))
                    {
                        if *best == 0.0 {
                            hit_servers.push(sid);
                        }
                        *best = score;
                    }
                }
            }
            // Tools not scored so far join `touched` (their total is still 0 here).
            for &sid in &hit_servers {
                let a = p.server_context * std::mem::take(&mut server_best[sid as usize]);
                for &m in &self.servers[sid as usize].members {
                    if total[m as usize] == 0.0 && a > 0.0 {
                        touched.push(m);
                    }
                    total[m as usize] += a;
                }
            }
            bound *= 1.0 + p.server_context;
        }
        (touched, bound)
    }
}

/// Just below the score of the tool at rank `head` of `best` (all of them when there are
/// fewer), so that the name order of equal scores cannot put a lifted tool into the head;
/// unbounded for head 0, `None` when nothing is scored.
fn ceiling(best: &[(f64, u32)], head: usize) -> Option<f64> {
    match (head, best.len()) {
        (_, 0) => None,
        (0, _) => Some(f64::INFINITY),
        (h, len) => Some(best[h.min(len) - 1].0 * (1.0 - 1e-9)),
    }
}

/// Adds each tool's `extra` share (set for the tools in `lifted`) to its score in `cands`,
/// up to `ceiling` and never moving a tool already at or above it; a tool not in `cands`
/// joins it. Zeroes `extra` again.
fn add_below(cands: &mut Vec<(f64, u32)>, lifted: &[u32], ceiling: f64, extra: &mut [f64]) {
    if lifted.is_empty() {
        return;
    }
    for c in cands.iter_mut() {
        let share = extra[c.1 as usize];
        if share > 0.0 {
            extra[c.1 as usize] = 0.0;
            if c.0 < ceiling {
                c.0 = (c.0 + share).min(ceiling);
            }
        }
    }
    // Those not scored before (their share is still set).
    for &m in lifted {
        let share = std::mem::take(&mut extra[m as usize]).min(ceiling);
        if share > 0.0 {
            cands.push((share, m));
        }
    }
}

/// BM25's idf of a term in `df` of `n` documents.
fn idf(df: usize, n: f64) -> f64 {
    (1.0 + (n - df as f64 + 0.5) / (df as f64 + 0.5)).ln()
}

/// A tool's name term ids, inline when there are at most `NameIds::CAP` of them.
#[derive(Debug, Clone, Copy, Default)]
struct NameIds {
    /// How many; more than `CAP` means "see `Doc::name_terms`".
    n: u32,
    ids: [u32; NameIds::CAP],
}

impl NameIds {
    const CAP: usize = 7;

    fn new(terms: &[u32]) -> Self {
        let mut out = NameIds {
            n: u32::try_from(terms.len()).unwrap_or(u32::MAX),
            ids: [0; Self::CAP],
        };
        if terms.len() <= Self::CAP {
            out.ids[..terms.len()].copy_from_slice(terms);
        }
        out
    }

    fn get(&self) -> Option<&[u32]> {
        let n = self.n as usize;
        (n <= Self::CAP).then(|| &self.ids[..n])
    }
}

/// The sums over the terms of a query (see `SearchIndex::accumulate`).
#[derive(Debug, Default)]
struct Acc {
    /// The documents with a score in `Scratch::total`.
    touched: Vec<u32>,
    /// Tools with a query term in their name: the only ones the coverage bonus reaches.
    name_matched: Vec<u32>,
    bound: f64,
    idf_sum: f64,
    idf_count: usize,
    /// The query's term ids with their weighted idf, for the coverage bonus.
    term_idf: Vec<(u32, f64)>,
    /// (server, score) for the query terms in server names.
    servers: Vec<(u32, f64)>,
    server_bound: f64,
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
/// as unigrams and bigrams, Thai, Lao, Khmer and Myanmar runs as cluster bigrams. Empty for a blank, stop-word-only or punctuation-only query.
pub fn query_terms(query: &str) -> Vec<String> {
    // Blobs pasted into a query (base64, minified data) are not search words; a long run of
    // CJK, Thai, Lao, Khmer or Myanmar text is a sentence (those scripts put no spaces
    // between words).
    let text: Vec<&str> = clip_query(query)
        .split_whitespace()
        .filter(|w| w.len() <= MAX_QUERY_WORD || w.chars().any(|c| is_cjk(c) || is_unspaced(c)))
        .collect();
    let mut terms = Vec::new();
    tokenize(&text.join(" "), TokenOpts { joins: false }, &mut terms);
    // Characters, not bytes: a long Cyrillic or Devanagari word is a word.
    terms.retain(|t| t.chars().count() <= MAX_TERM_LEN);
    let mut seen = std::collections::HashSet::new();
    terms.retain(|t| seen.insert(t.clone()));
    terms.truncate(MAX_QUERY_TERMS);
    terms
}

/// Longer whitespace-separated words of a query are skipped as data, not words.
const MAX_QUERY_WORD: usize = 200;
/// Only this much of a query is read (a request, not a document; the rest cannot change
/// which 64 terms are used much, and every step after this is then bounded).
const MAX_QUERY_BYTES: usize = 8 * 1024;

/// The first `MAX_QUERY_BYTES` of a query, cut at a character boundary.
fn clip_query(query: &str) -> &str {
    clip(query, MAX_QUERY_BYTES)
}
/// Query terms longer than this many characters are skipped.
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

/// The text a tool is embedded from: its name (the tool part, as words: separators as
/// spaces, camelCase split), a colon, its description, then its schema's property names and
/// descriptions.
fn embed_text(spec: &ToolSpec) -> String {
    let (_, tool) = split_name(&spec.name);
    let mut text = String::with_capacity(tool.len() + spec.description.len() + 64);
    let mut prev: Option<char> = None;
    for c in tool.chars() {
        if !c.is_alphanumeric() {
            text.push(' ');
        } else {
            if c.is_uppercase() && prev.is_some_and(char::is_lowercase) {
                text.push(' ');
            }
            text.push(c);
        }
        prev = Some(c);
    }
    text.push_str(": ");
    text.push_str(clip(&spec.description, MAX_FIELD_TEXT));
    text.push('\n');
    schema_text(&spec.input_schema, 0, &mut text);
    text
}

/// The terms of each field of a tool.
fn field_terms(spec: &ToolSpec) -> [Vec<String>; FIELDS] {
    let (_, tool) = split_name(&spec.name);
    let mut fields: [Vec<String>; FIELDS] = Default::default();
    tokenize(tool, TokenOpts { joins: true }, &mut fields[NAME]);
    tokenize(
        clip(&spec.description, MAX_FIELD_TEXT),
        TokenOpts { joins: false },
        &mut fields[DESC],
    );
    let mut text = String::new();
    schema_text(&spec.input_schema, 0, &mut text);
    tokenize(
        clip(&text, MAX_FIELD_TEXT),
        TokenOpts { joins: false },
        &mut fields[PARAMS],
    );
    fields
}

/// At most this much of a tool's description, and of its schema's text, is indexed: one
/// upstream's 100k-property schema would otherwise make every search it takes part in
/// (pseudo-relevance feedback walks the best tools' terms) take a second.
const MAX_FIELD_TEXT: usize = 32 * 1024;

/// At most this many required parameters of a tool are read for schema links.
const MAX_REQUIRED: usize = 64;

/// The first `max` bytes of `text`, cut at a character boundary.
fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The terms of the names of a schema's required top-level parameters.
fn required_terms(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(Value::Array(required)) = schema.get("required") {
        for name in required.iter().take(MAX_REQUIRED).filter_map(Value::as_str) {
            tokenize(clip(name, 256), TokenOpts { joins: false }, &mut out);
        }
    }
    out
}

/// Collects property names and descriptions of a JSON schema, nested
/// schemas included, up to a modest depth.
fn schema_text(schema: &Value, depth: usize, out: &mut String) {
    let mut budget = MAX_SCHEMA_NODES;
    schema_text_in(schema, schema, depth, out, &mut budget);
}

/// At most this many schema nodes are read per tool: `$ref`s and `anyOf` branches append
/// nothing themselves, so without a count a small schema of many branches that refer back
/// to the root fans out to millions of visits.
const MAX_SCHEMA_NODES: usize = 4096;

/// [`schema_text`] of `schema`, a part of `root`: a local `$ref` (`#/$defs/X`,
/// `#/definitions/X`, as pydantic and FastMCP write nested models) is followed into
/// `root`, within the same depth limit (so a cycle ends).
fn schema_text_in(
    root: &Value,
    schema: &Value,
    depth: usize,
    out: &mut String,
    budget: &mut usize,
) {
    // Every visit counts, the ones that read nothing too; past the indexed length, the
    // depth or the node count, nothing more is read.
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    if depth > 4 || out.len() > MAX_FIELD_TEXT {
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
    if let Some(Value::String(target)) = obj.get("$ref")
        && let Some(path) = target.strip_prefix('#')
        && let Some(found) = root.pointer(path)
    {
        schema_text_in(root, found, depth + 1, out, budget);
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, sub) in props {
            if out.len() > MAX_FIELD_TEXT || *budget == 0 {
                break;
            }
            out.push_str(name);
            out.push('\n');
            schema_text_in(root, sub, depth + 1, out, budget);
        }
    }
    if let Some(items) = obj.get("items") {
        schema_text_in(root, items, depth + 1, out, budget);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(subs)) = obj.get(key) {
            for sub in subs {
                if *budget == 0 {
                    break;
                }
                schema_text_in(root, sub, depth + 1, out, budget);
            }
        }
    }
}
