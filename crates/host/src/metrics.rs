//! `quiver serve`'s `GET /metrics`: the app's [`Metrics`] with the gauges read from its
//! parts at each scrape (the MCP client's upstreams, the surface's working sets, the store's
//! log writer), served through the MCP server's [`MetricsExposition`] port.

use std::sync::Arc;

use quiver_mcp_adapter::{MetricsExposition, ServerState};
use quiver_metrics_prometheus::{
    CONTENT_TYPE, LogWriterReading, Metrics, UpstreamReading, UpstreamState, WorkingSetsReading,
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
    Arc::new(Exposition(metrics))
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
