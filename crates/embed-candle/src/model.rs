//! Loading the model and embedding with it.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use quiver_surface::search::{EmbedError, Embedder};
use sha2::{Digest, Sha256};
use thiserror::Error;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// The length of the model's vectors. A folder whose model makes vectors of another length
/// is refused: stored vectors and the index's vectors must all be of one length.
pub const DIMENSIONS: usize = 384;

/// Texts are cut to this many tokens (the model's `max_seq_length`, as sentence-transformers
/// cuts them), `[CLS]` and `[SEP]` included.
pub const MAX_TOKENS: usize = 256;

/// Texts embedded in one forward pass: long enough to amortise a pass, short enough that
/// padding to the longest text of a batch wastes little (the caller sorts by length).
const BATCH: usize = 16;

/// Why a model folder could not be loaded. The caller logs it and searches lexically.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A file the model needs is not in the folder (or the folder does not exist).
    #[error(
        "model file {} is missing: point [search] model_dir at a folder holding config.json, tokenizer.json and model.safetensors, or run `quiver model install`",
        .0.display()
    )]
    Missing(PathBuf),
    /// A file is there but cannot be read or parsed.
    #[error("model file {} is unreadable or corrupt: {reason}", .path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The model makes vectors of another length than [`DIMENSIONS`].
    #[error(
        "the model in {} makes {found}-dimensional vectors; Quiver's retriever takes {DIMENSIONS} (all-MiniLM-L6-v2)",
        .dir.display()
    )]
    WrongDimension {
        /// The folder.
        dir: PathBuf,
        /// The length it makes.
        found: usize,
    },
}

/// all-MiniLM-L6-v2 on candle's CPU backend.
pub struct MiniLm {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    id: String,
}

impl std::fmt::Debug for MiniLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiniLm").field("id", &self.id).finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LoadError::Missing(path.to_owned()),
        _ => LoadError::Corrupt {
            path: path.to_owned(),
            reason: e.to_string(),
        },
    })
}

fn corrupt(path: &Path, reason: impl std::fmt::Display) -> LoadError {
    LoadError::Corrupt {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

impl MiniLm {
    /// Loads the model in `dir` (`config.json`, `tokenizer.json`, `model.safetensors`) and
    /// checks it with one embedding: a model that loads but makes vectors of another length
    /// or non-finite ones is refused. Reads the whole weights file (about 90 MB) and takes a
    /// few hundred milliseconds; run it off the async runtime.
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let config_path = dir.join("config.json");
        let tokenizer_path = dir.join("tokenizer.json");
        let weights_path = dir.join("model.safetensors");
        let config_bytes = read(&config_path)?;
        let config: Config =
            serde_json::from_slice(&config_bytes).map_err(|e| corrupt(&config_path, e))?;
        if config.hidden_size != DIMENSIONS {
            return Err(LoadError::WrongDimension {
                dir: dir.to_owned(),
                found: config.hidden_size,
            });
        }
        let tokenizer_bytes = read(&tokenizer_path)?;
        let mut tokenizer =
            Tokenizer::from_bytes(&tokenizer_bytes).map_err(|e| corrupt(&tokenizer_path, e))?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..PaddingParams::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..TruncationParams::default()
            }))
            .map_err(|e| corrupt(&tokenizer_path, e))?;
        let weights = read(&weights_path)?;
        // The identity of stored vectors: a vector is reused only for the same model files.
        let mut hash = Sha256::new();
        for part in [&config_bytes, &tokenizer_bytes, &weights] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
        let digest = hash.finalize();
        let id = format!(
            "{}@{}",
            crate::MODEL_NAME,
            digest[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let device = Device::Cpu;
        let model = {
            let vb = VarBuilder::from_slice_safetensors(&weights, DType::F32, &device)
                .map_err(|e| corrupt(&weights_path, e))?;
            BertModel::load(vb, &config).map_err(|e| corrupt(&weights_path, e))?
        };
        let this = MiniLm {
            model,
            tokenizer,
            device,
            id,
        };
        let probe = this
            .embed(&["probe"])
            .map_err(|e| corrupt(&weights_path, e))?;
        match probe.first() {
            Some(v) if v.len() != DIMENSIONS => Err(LoadError::WrongDimension {
                dir: dir.to_owned(),
                found: v.len(),
            }),
            Some(v) if v.iter().all(|x| x.is_finite()) => Ok(this),
            _ => Err(corrupt(
                &weights_path,
                "the model computes non-finite vectors",
            )),
        }
    }

    /// One forward pass over texts of similar length.
    fn batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let fail = |e: &dyn std::fmt::Display| EmbedError(e.to_string());
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| fail(&e))?;
        let rows = encodings.len();
        let width = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut ids = Vec::with_capacity(rows * width);
        let mut mask = Vec::with_capacity(rows * width);
        for e in &encodings {
            ids.extend(e.get_ids().iter().map(|&i| i as i64));
            mask.extend(e.get_attention_mask().iter().map(|&m| m as i64));
        }
        let ids = Tensor::from_vec(ids, (rows, width), &self.device).map_err(|e| fail(&e))?;
        let mask = Tensor::from_vec(mask, (rows, width), &self.device).map_err(|e| fail(&e))?;
        let types = ids.zeros_like().map_err(|e| fail(&e))?;
        let hidden = self
            .model
            .forward(&ids, &types, Some(&mask))
            .map_err(|e| fail(&e))?;
        mean_pool_normalised(&hidden, &mask).map_err(|e| fail(&e))
    }
}

/// sentence-transformers' pooling for this model: the hidden states of the real tokens
/// averaged (`sum(h * mask) / max(sum(mask), 1e-9)`), then divided by their L2 norm
/// (`max(norm, 1e-12)`).
fn mean_pool_normalised(hidden: &Tensor, mask: &Tensor) -> candle_core::Result<Vec<Vec<f32>>> {
    let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
    let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
    let counts = mask.sum(1)?.clamp(1e-9, f64::INFINITY)?;
    let mean = summed.broadcast_div(&counts)?;
    let norm = mean
        .sqr()?
        .sum_keepdim(1)?
        .sqrt()?
        .clamp(1e-12, f64::INFINITY)?;
    mean.broadcast_div(&norm)?.to_vec2::<f32>()
}

impl Embedder for MiniLm {
    /// Texts are embedded in batches of similar length (sorted by length, so padding stays
    /// short), and returned in the order given.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(BATCH) {
            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
            for (&i, v) in chunk.iter().zip(self.batch(&batch)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    fn model_id(&self) -> &str {
        &self.id
    }
}
