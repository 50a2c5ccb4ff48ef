//! The embedding port of the search index: a deployment that has a text-embedding model
//! implements [`Embedder`] and hands it to [`SearchIndex::with_embedder`] (or
//! `Surface::set_vector_retriever`); the index then keeps one vector per tool beside its
//! postings, computed outside the index ([`SearchIndex::pending_vectors`],
//! [`SearchIndex::set_vector`]) or in place ([`SearchIndex::embed_pending`]), and fuses a
//! vector ranking into the lexical one (see [`HybridConfig`]). A tool without its vector
//! yet is ranked lexically.
//!
//! [`SearchIndex::with_embedder`]: super::SearchIndex::with_embedder
//! [`SearchIndex::pending_vectors`]: super::SearchIndex::pending_vectors
//! [`SearchIndex::set_vector`]: super::SearchIndex::set_vector
//! [`SearchIndex::embed_pending`]: super::SearchIndex::embed_pending
//! [`HybridConfig`]: super::HybridConfig

use std::fmt;

use thiserror::Error;

/// Why an embedder could not embed a batch. The index logs it and falls back to the lexical
/// ranking for that query (or keeps the tool findable lexically only), never fails a search.
#[derive(Debug, Clone, Error, PartialEq)]
#[error("embedding failed: {0}")]
pub struct EmbedError(pub String);

/// Text -> vector, in batches. Synchronous: a search runs on the caller's thread under the
/// index's read lock, so the embedder should be in-process (a local model), not a network
/// round trip.
pub trait Embedder: Send + Sync + fmt::Debug {
    /// One vector per text, in order, all of the same length. Vectors need not be
    /// normalised (the index normalises them).
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// The model's identity (name and a hash of its files): a stored vector is reused only
    /// for the same identity and the same tool text.
    fn model_id(&self) -> &str;
}

/// A deterministic embedder that needs no model: the character trigrams of each lower-cased
/// word (padded with a boundary mark) are hashed into `dims` signed buckets. Similar
/// spellings get similar vectors ("geocoding"/"geocoder", a typo), meanings do not. Useful
/// as a fuzzy-spelling retriever and to exercise the port; a real deployment plugs in a
/// semantic model.
#[derive(Debug, Clone)]
pub struct HashedNgrams {
    dims: usize,
    id: String,
}

impl HashedNgrams {
    /// An embedder into `dims` dimensions (at least 1).
    pub fn new(dims: usize) -> Self {
        let dims = dims.max(1);
        HashedNgrams {
            dims,
            id: format!("hashed-ngrams-{dims}"),
        }
    }
}

impl Default for HashedNgrams {
    /// 256 dimensions.
    fn default() -> Self {
        HashedNgrams::new(256)
    }
}

/// FNV-1a over the chars of a trigram.
fn fnv(chars: &[char]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for c in chars {
        for b in (*c as u32).to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl HashedNgrams {
    fn one(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0.0f32; self.dims];
        let lower = text.to_lowercase();
        for word in lower.split(|c: char| !c.is_alphanumeric()) {
            if word.is_empty() {
                continue;
            }
            let mut chars: Vec<char> = Vec::with_capacity(word.len() + 2);
            chars.push('\u{2}');
            chars.extend(word.chars());
            chars.push('\u{3}');
            for g in chars.windows(3) {
                let h = fnv(g);
                let bucket = (h % self.dims as u64) as usize;
                let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
                v[bucket] += sign;
            }
        }
        v
    }
}

impl Embedder for HashedNgrams {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| self.one(t)).collect())
    }

    fn model_id(&self) -> &str {
        &self.id
    }
}

/// `v` scaled to unit length; `None` for a zero, empty or non-finite vector.
pub(crate) fn normalised(v: &[f32]) -> Option<Box<[f32]>> {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if v.is_empty() || !norm.is_finite() || norm == 0.0 {
        return None;
    }
    Some(v.iter().map(|x| (f64::from(*x) / norm) as f32).collect())
}

/// The dot product of two unit vectors (0 when the lengths differ).
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return 0.0;
    }
    // Summed in f32 over eight lanes, which the compiler vectorises.
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    f64::from(lanes.iter().sum::<f32>() + tail)
}

/// The embedder and the tools' vectors, by document id.
#[derive(Debug)]
pub(crate) struct Vectors {
    pub(crate) embedder: std::sync::Arc<dyn Embedder>,
    pub(crate) config: super::HybridConfig,
    /// Document id -> its unit vector, once computed.
    pub(crate) by_doc: Vec<Option<Box<[f32]>>>,
    /// Document id -> the key of the text its vector is (to be) computed from.
    pub(crate) keys: Vec<u64>,
    /// Document id -> the text of a tool that has no vector yet.
    pub(crate) pending: std::collections::BTreeMap<u32, String>,
    /// The length of the vectors held (0 before the first).
    pub(crate) dims: usize,
}

impl Vectors {
    pub(crate) fn new(embedder: std::sync::Arc<dyn Embedder>, config: super::HybridConfig) -> Self {
        Vectors {
            embedder,
            config,
            by_doc: Vec::new(),
            keys: Vec::new(),
            pending: std::collections::BTreeMap::new(),
            dims: 0,
        }
    }

    /// Records a tool's text: its vector is kept when the text is the one it was computed
    /// from, else dropped and the tool waits for a new one.
    pub(crate) fn track(&mut self, doc: u32, text: String) {
        let at = doc as usize;
        if self.by_doc.len() <= at {
            self.by_doc.resize(at + 1, None);
            self.keys.resize(at + 1, 0);
        }
        let key = text_key(self.embedder.model_id(), &text);
        if self.keys[at] != key || self.by_doc[at].is_none() {
            self.keys[at] = key;
            self.by_doc[at] = None;
            self.pending.insert(doc, text);
        }
    }

    /// Forgets a removed tool's vector.
    pub(crate) fn forget(&mut self, doc: u32) {
        let at = doc as usize;
        if at < self.by_doc.len() {
            self.by_doc[at] = None;
            self.keys[at] = 0;
        }
        self.pending.remove(&doc);
    }

    /// Stores the vector of a tool's text of `key`; false (nothing stored) when the tool's
    /// text has changed since, or the vector is empty, not finite, zero, or of another
    /// length than the vectors held.
    pub(crate) fn set(&mut self, doc: u32, key: u64, v: &[f32]) -> bool {
        let at = doc as usize;
        if self.keys.get(at) != Some(&key) || (self.dims != 0 && v.len() != self.dims) {
            return false;
        }
        let Some(unit) = normalised(v) else {
            return false;
        };
        self.dims = unit.len();
        self.by_doc[at] = Some(unit);
        self.pending.remove(&doc);
        true
    }
}

/// [`Embedder::embed`], one result per text; a failed batch is logged and gives `None` for
/// every text.
pub(crate) fn embed_logged(embedder: &dyn Embedder, texts: &[&str]) -> Vec<Option<Vec<f32>>> {
    match embedder.embed(texts) {
        Ok(vs) if vs.len() == texts.len() => vs.into_iter().map(Some).collect(),
        Ok(vs) => {
            tracing::warn!(
                asked = texts.len(),
                got = vs.len(),
                "embedder returned the wrong number of vectors; using lexical search only"
            );
            vec![None; texts.len()]
        }
        Err(e) => {
            tracing::warn!(error = %e, "embedder failed; using lexical search only");
            vec![None; texts.len()]
        }
    }
}

/// The key of a stored vector: FNV-1a (64 bits) over the model's identity and the text, so
/// a vector is reused only for the same model and the same text.
pub(crate) fn text_key(model: &str, text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in model.bytes().chain([0u8]).chain(text.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
