//! The commands' bodies; `main.rs` parses the arguments and picks one.

pub(crate) mod bench;
pub(crate) mod check;
pub(crate) mod client;
pub(crate) mod custom;
pub(crate) mod floor;
pub(crate) mod log;
pub(crate) mod model;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod store;

use anyhow::Context;
use quiver_host::{App, Config};

/// Waits until every indexed tool has its search vector (stored ones are read, the others
/// computed; a few seconds per thousand new tools), or the embedder failed, or a minute
/// passed; the search then ranks the tools still without one lexically.
pub(crate) async fn wait_for_vectors(app: &App) {
    let mut progress = app.surface.vector_progress();
    let done = progress.wait_for(|p| p.failed || (p.total > 0 && p.ready == p.total));
    if tokio::time::timeout(std::time::Duration::from_secs(60), done)
        .await
        .is_err()
    {
        let p = *progress.borrow();
        tracing::warn!(
            ready = p.ready,
            total = p.total,
            "searching before every tool has its vector; those without one rank lexically"
        );
    }
}

/// Applies `[store] retention_days`: deletes execution-log rows older than that many days,
/// and the stored working sets of sessions idle that long. Only the commands that write the
/// store (`serve`, `call`, `search`) do it; the reading ones (`log`, `tools`, `check`,
/// `status`) leave the store as it is. Unset keeps everything.
pub(crate) async fn apply_retention(app: &App, config: &Config) -> anyhow::Result<()> {
    let Some(days) = config.store.retention_days else {
        return Ok(());
    };
    let Some(cutoff) = std::time::SystemTime::now()
        .checked_sub(std::time::Duration::from_secs(u64::from(days) * 86_400))
    else {
        return Ok(());
    };
    let purged = app
        .call_log()
        .purge_calls_before(cutoff)
        .await
        .context("applying log retention")?;
    if purged > 0 {
        tracing::info!(purged, days, "deleted execution-log rows past retention");
    }
    let sessions = app
        .store
        .purge_sessions_idle_since(cutoff)
        .await
        .context("applying retention to stored sessions")?;
    if sessions > 0 {
        tracing::info!(sessions, days, "deleted session state idle past retention");
    }
    Ok(())
}
