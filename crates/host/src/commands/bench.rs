//! `quiver bench-search`: tool-search quality on a benchmark set, lexical or with the model.

use std::{path::Path, process::ExitCode, sync::Arc};

use anyhow::Context;
use quiver_surface::search::HybridConfig;

pub(crate) async fn run(
    tools: &Path,
    queries: &Path,
    model: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let retriever = match model {
        Some(dir) => {
            let m = quiver_host::load_model(dir)
                .await
                .map_err(|e| anyhow::anyhow!("bench-search: --model {}: {e}", dir.display()))?;
            Some((
                Arc::new(m) as Arc<dyn quiver_surface::search::Embedder>,
                HybridConfig::default(),
            ))
        }
        None => None,
    };
    let (tools, queries) = (read(tools)?, read(queries)?);
    let report = tokio::task::spawn_blocking(move || {
        quiver_surface::search::evaluate_with(&tools, &queries, retriever)
    })
    .await?
    .map_err(|e| anyhow::anyhow!("bench-search: {e}"))?;
    say!("{}", serde_json::to_string(&report)?);
    Ok(ExitCode::SUCCESS)
}
