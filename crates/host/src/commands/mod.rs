//! The commands' bodies; `main.rs` parses the arguments and picks one.

pub(crate) mod bench;
pub(crate) mod check;
pub(crate) mod custom;
pub(crate) mod floor;
pub(crate) mod log;
pub(crate) mod serve;
pub(crate) mod status;

use anyhow::Context;
use quiver_host::{App, Config};

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
