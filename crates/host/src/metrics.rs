//! `quiver serve`'s `GET /metrics`: the app's [`Metrics`] with the gauges read from its
//! parts at each scrape (the MCP client's upstreams, the surface's working sets, the store's
//! log writer, the process's memory, threads and files), served through the MCP server's [`MetricsExposition`] port.

use std::sync::Arc;

use quiver_mcp_adapter::{MetricsExposition, ServerState};
use quiver_metrics_prometheus::{
    CONTENT_TYPE, LogWriterReading, Metrics, ProcessReading, UpstreamReading, UpstreamState,
    WorkingSetsReading,
};

use crate::App;

/// The app's metrics as the MCP server serves them: the gauges are wired to the app's parts
/// here, once.
pub fn exposition(app: &App) -> Arc<dyn MetricsExposition> {
    let metrics = app.metrics.clone();
    let mcp = app.mcp.clone();
    metrics.read_upstreams(move || {
        mcp.status()
            .into_iter()
            .map(|s| {
                let state = match s.state {
                    ServerState::Connecting => UpstreamState::Connecting,
                    ServerState::Connected => UpstreamState::Connected,
                    ServerState::Reconnecting => UpstreamState::Reconnecting,
                    ServerState::Down => UpstreamState::Down,
                    _ => UpstreamState::Stopped,
                };
                let c = s.counters;
                let reading = UpstreamReading::new(s.name, state, c.dials, c.connects, c.drops);
                match s.users {
                    Some((users, _)) => reading.with_user_connections(users as u64),
                    None => reading,
                }
            })
            // A server an operator disabled is closed and out of the status: it shows as
            // disabled (its counters start again when it is enabled).
            .chain(
                mcp.disabled_servers()
                    .into_iter()
                    .map(|name| UpstreamReading::new(name, UpstreamState::Disabled, 0, 0, 0)),
            )
            .collect()
    });
    let surface = app.surface.clone();
    metrics.read_working_sets(move || {
        WorkingSetsReading::of_sizes(
            surface
                .session_keys()
                .iter()
                .map(|k| surface.working_set(k).len()),
        )
    });
    let store = app.store.clone();
    metrics.read_log_writer(move || {
        let (written, failed, failing) = store.log_writer();
        LogWriterReading::new(written, failed, failing)
    });
    let store = app.store.clone();
    metrics.read_process(move || match store.engine_memory() {
        Some(bytes) => process().with_embedded_store(bytes),
        None => process(),
    });
    Arc::new(Exposition(metrics))
}

/// The process now, from `/proc/self` and the allocator (zeros where `/proc` cannot be
/// read: another system).
fn process() -> ProcessReading {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let reading = ProcessReading::new(kib("VmRSS:") * 1024, kib("Threads:"), fds);
    match crate::allocator::heap() {
        Some((in_use, free)) => reading
            .with_heap_in_use(in_use)
            .with_heap_free(free)
            .with_heap_trims(crate::allocator::trims()),
        None => reading,
    }
}

struct Exposition(Arc<Metrics>);

impl MetricsExposition for Exposition {
    fn render(&self, sessions_open: usize) -> String {
        self.0.set_sessions_open(sessions_open as u64);
        self.0.render()
    }

    fn content_type(&self) -> &'static str {
        CONTENT_TYPE
    }
}
