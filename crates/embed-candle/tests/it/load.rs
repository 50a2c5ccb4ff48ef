//! Model folders that cannot be used: each is a clear [`LoadError`], never a panic.

use std::path::Path;

use quiver_embed_candle::{LoadError, MiniLm};

fn copy(from: &Path, to: &Path, files: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for f in files {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

fn load_err(dir: &Path) -> LoadError {
    match MiniLm::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn a_missing_folder_names_the_file_and_how_to_install() {
    let tmp = tempfile::tempdir().unwrap();
    let e = load_err(&tmp.path().join("nowhere"));
    assert!(
        matches!(&e, LoadError::Missing(p) if p.ends_with("config.json")),
        "{e:?}"
    );
    assert!(e.to_string().contains("quiver model install"), "{e}");

    // The config alone: the weights are named.
    copy(
        &crate::model_dir(),
        tmp.path(),
        &["config.json", "tokenizer.json"],
    );
    let e = load_err(tmp.path());
    assert!(
        matches!(&e, LoadError::Missing(p) if p.ends_with("model.safetensors")),
        "{e:?}"
    );
}

#[test]
fn truncated_weights_are_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let model = crate::model_dir();
    copy(&model, tmp.path(), &["config.json", "tokenizer.json"]);
    let weights = std::fs::read(model.join("model.safetensors")).unwrap();
    std::fs::write(
        tmp.path().join("model.safetensors"),
        &weights[..weights.len() / 3],
    )
    .unwrap();
    let e = load_err(tmp.path());
    assert!(
        matches!(&e, LoadError::Corrupt { path, .. } if path.ends_with("model.safetensors")),
        "{e:?}"
    );
    std::fs::write(tmp.path().join("model.safetensors"), b"not safetensors").unwrap();
    assert!(matches!(load_err(tmp.path()), LoadError::Corrupt { .. }));
}

#[test]
fn a_broken_tokenizer_or_config_is_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    copy(&crate::model_dir(), tmp.path(), &["config.json"]);
    std::fs::write(
        tmp.path().join("tokenizer.json"),
        "{\"not\": \"a tokenizer\"}",
    )
    .unwrap();
    let e = load_err(tmp.path());
    assert!(
        matches!(&e, LoadError::Corrupt { path, .. } if path.ends_with("tokenizer.json")),
        "{e:?}"
    );
    std::fs::write(tmp.path().join("config.json"), "[1, 2").unwrap();
    let e = load_err(tmp.path());
    assert!(
        matches!(&e, LoadError::Corrupt { path, .. } if path.ends_with("config.json")),
        "{e:?}"
    );
}

#[test]
fn a_model_of_another_dimension_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = crate::model_dir();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("config.json")).unwrap()).unwrap();
    config["hidden_size"] = 768.into();
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    copy(&model, tmp.path(), &["tokenizer.json"]);
    let e = load_err(tmp.path());
    assert!(
        matches!(e, LoadError::WrongDimension { found: 768, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("768-dimensional"), "{e}");
}
