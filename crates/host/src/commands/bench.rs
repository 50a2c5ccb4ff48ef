//! `quiver bench-search`: tool-search quality on a benchmark set.

use std::{path::Path, process::ExitCode};

use anyhow::Context;

pub(crate) fn run(tools: &Path, queries: &Path) -> anyhow::Result<ExitCode> {
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let report = quiver_surface::search::evaluate(&read(tools)?, &read(queries)?)
        .map_err(|e| anyhow::anyhow!("bench-search: {e}"))?;
    say!("{}", serde_json::to_string(&report)?);
    Ok(ExitCode::SUCCESS)
}
