//! The optional embedding port of the search index: a deployment that has a text-embedding
//! model implements [`Embedder`] and hands it to [`SearchIndex::with_embedder`] (or
//! `Surface::set_vector_retriever`); the index then keeps one vector per tool beside its
//! postings and blends a vector ranking into the lexical one. The default build has no
//! embedder and needs no model.
//!
//! The blend is weighted reciprocal-rank fusion (Cormack et al., 2009): the lexical ranking
//! and the vector ranking (cosine similarity of the query's vector to each tool's) each give
//! a tool `weight / (k + rank)` (rank from 1), over the top `depth` of each ranking, and the
//! tools are ordered by the sum. Rank fusion needs no calibration between BM25 scores and
//! cosines, which differ from model to model.
//!
//! [`SearchIndex::with_embedder`]: super::SearchIndex::with_embedder

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
}

/// How the vector ranking is blended into the lexical one (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// The weight of the lexical ranking.
    pub lexical_weight: f64,
    /// The weight of the vector ranking (0 turns it off).
    pub vector_weight: f64,
    /// The rank offset `k` of reciprocal-rank fusion; larger flattens the head.
    pub rrf_k: f64,
    /// How deep each ranking is read before fusion.
    pub depth: usize,
}

impl Default for HybridConfig {
    /// Equal weights, the usual `k = 60`, the top 50 of each ranking.
    fn default() -> Self {
        HybridConfig {
            lexical_weight: 1.0,
            vector_weight: 1.0,
            rrf_k: 60.0,
            depth: 50,
        }
    }
}

impl HybridConfig {
    /// Weights and `k` that are not finite or are negative become 0, a zero depth 1, so
    /// fusion never divides by zero or inverts a ranking.
    pub(crate) fn sanitised(self) -> Self {
        let clean = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        HybridConfig {
            lexical_weight: clean(self.lexical_weight),
            vector_weight: clean(self.vector_weight),
            rrf_k: clean(self.rrf_k),
            depth: self.depth.max(1),
        }
    }
}

/// A deterministic embedder that needs no model: the character trigrams of each lower-cased
/// word (padded with a boundary mark) are hashed into `dims` signed buckets. Similar
/// spellings get similar vectors ("geocoding"/"geocoder", a typo), meanings do not. Useful
/// as a fuzzy-spelling retriever and to exercise the port; a real deployment plugs in a
/// semantic model.
#[derive(Debug, Clone)]
pub struct HashedNgrams {
    dims: usize,
}

impl HashedNgrams {
    /// An embedder into `dims` dimensions (at least 1).
    pub fn new(dims: usize) -> Self {
        HashedNgrams { dims: dims.max(1) }
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
    pub(crate) config: HybridConfig,
    pub(crate) by_doc: Vec<Option<Box<[f32]>>>,
}

impl Vectors {
    /// Stores a tool's vector (or none, when embedding failed).
    pub(crate) fn set(&mut self, doc: u32, v: Option<Box<[f32]>>) {
        let at = doc as usize;
        if self.by_doc.len() <= at {
            self.by_doc.resize(at + 1, None);
        }
        self.by_doc[at] = v;
    }

    /// Embeds texts, normalised, one result per text; a failed batch is logged and gives
    /// `None` for every text.
    pub(crate) fn embed(&self, texts: &[&str]) -> Vec<Option<Box<[f32]>>> {
        match self.embedder.embed(texts) {
            Ok(vs) if vs.len() == texts.len() => vs.iter().map(|v| normalised(v)).collect(),
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
}
