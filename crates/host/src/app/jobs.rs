//! The custom-tool job worker of [`App::spawn_custom_sync`]: queued jobs run `[custom] jobs` at a time,
//! jobs a stopped process left running are released, and the job running here is handed
//! back when the server stops.

use quiver_registry::{custom::CustomTools, store::JobStore};

use super::{App, DEFINITIONS_POLL};
use crate::store::Store;

/// How long the job worker waits between looks for queued jobs when the store announces
/// them (PostgreSQL's `NOTIFY`): the worker wakes on the announcement, and this look is only
/// the fallback for one that never came. A store that does not announce them (SQLite) is
/// looked at every [`DEFINITIONS_POLL`].
const JOBS_FALLBACK: std::time::Duration = std::time::Duration::from_secs(10);

impl App {
    /// Hands back the custom-tool jobs this process was running when its job worker was
    /// aborted (see [`quiver_registry::custom::CustomTools::hand_back`]).
    pub async fn hand_back_jobs(&self) {
        match self.custom.hand_back().await {
            Ok(requeued) if !requeued.is_empty() => {
                tracing::info!(tools = ?requeued, "custom-tool jobs running at shutdown queued again")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "could not hand back the custom-tool jobs running at shutdown (another worker takes them after [custom] job_stale_secs): {e}"
            ),
        }
    }
}

/// The surface-state key under which each replica on a shared store writes its stale bound.
const STALE_KEY: &str = "custom/job_stale_secs";

/// A bound written longer ago than this is taken as a replica that is gone.
const STALE_SEEN: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// On a store several replicas share, says when the last replica to start used another
/// `[custom] job_stale_secs` (a replica with the shorter bound takes over the jobs of one
/// whose heartbeats are spaced for the longer), then writes this one's.
async fn check_stale_bound(custom: &CustomTools, store: &Store) {
    use quiver_surface::ports::SessionStore;
    if !store.shared() {
        return;
    }
    let ours = custom.lease().stale().as_secs();
    if let Ok(Some(before)) = store.state(STALE_KEY).await
        && let Some(theirs) = before.value.get("secs").and_then(serde_json::Value::as_u64)
        && theirs != ours
        && before
            .written_at
            .elapsed()
            .is_ok_and(|age| age < STALE_SEEN)
    {
        let who = before
            .value
            .get("replica")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("another replica");
        tracing::warn!(
            "[custom] job_stale_secs is {ours} here, and {theirs} on {who}, which shares this store: give every replica the same bound (a replica releases another's job after its own bound, so the one with the shorter bound can take over jobs that are still running)"
        );
    }
    let replica = format!("{} (pid {})", crate::serve::host_name(), std::process::id());
    let value = serde_json::json!({"secs": ours, "replica": replica});
    if let Err(e) = store.put_state(STALE_KEY, value).await {
        tracing::debug!(error = %e, "could not write this replica's job_stale_secs");
    }
}

/// The job worker of [`App::spawn_custom_sync`].
pub(super) async fn run_jobs(custom: &CustomTools, store: &Store) {
    check_stale_bound(custom, store).await;
    match custom.queue_rebuilds().await {
        Ok(queued) if !queued.is_empty() => tracing::info!(
            tools = ?queued,
            "approved custom tools last tested under another engine or other limits: rebuilding"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("could not queue the rebuilds of custom tools: {e}"),
    }
    let wait = match store.announces_jobs() {
        true => JOBS_FALLBACK,
        false => DEFINITIONS_POLL,
    };
    let mut seen = None;
    let work = async {
        loop {
            // Each of the workers takes queued jobs until none is left (the store gives a
            // job to one of them only), so a slow job holds up only its own.
            futures::future::join_all((0..custom.workers()).map(|_| run_queued(custom))).await;
            // The announcements counted before this look: one that comes after it ends the
            // wait at once.
            seen = match store.job_queued_since(seen, wait).await {
                Ok(n) => Some(n),
                Err(e) => {
                    tracing::debug!(error = %e, "could not wait for queued jobs");
                    tokio::time::sleep(DEFINITIONS_POLL).await;
                    seen
                }
            };
        }
    };
    tokio::join!(work, release_stale(custom));
}

/// Releases the jobs left running by a process that stopped (no heartbeat for the lease's
/// stale bound; they are queued again, for any worker) every third of the bound, so one is
/// released soon after it goes stale. Beside the worker, so a long job running here does
/// not hold the look up.
async fn release_stale(custom: &CustomTools) {
    let every = custom.lease().look_every();
    loop {
        match custom.requeue_interrupted().await {
            Ok(requeued) if !requeued.is_empty() => {
                tracing::info!(tools = ?requeued, "custom-tool jobs a stopped process left running queued again")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("could not look for interrupted custom-tool jobs: {e}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// Runs queued custom-tool jobs until none is left.
async fn run_queued(custom: &CustomTools) {
    loop {
        match custom.run_next().await {
            Ok(Some(report)) => tracing::info!(
                tool = %report.name,
                version = report.version,
                job = %report.job_id,
                kind = report.kind.as_str(),
                passed = report.passed,
                "custom-tool job done"
            ),
            Ok(None) => break,
            Err(e) => {
                // The claim reads the store too: an outage is not a failed job.
                tracing::warn!("custom-tool jobs: could not take or run the next queued job: {e}");
                break;
            }
        }
    }
}
