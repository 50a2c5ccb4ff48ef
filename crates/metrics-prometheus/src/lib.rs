//! The Prometheus adapter of Quiver's metrics, on the Prometheus project's
//! `prometheus-client`. [`Metrics`] owns one registry (no global state) and renders it in the
//! Prometheus text format (version 0.0.4) for `GET /metrics`.
//!
//! What it counts, and how each number gets there:
//!
//! - **calls** (`quiver_tool_calls_total{tool, server, outcome}`) and their **latency**
//!   (`quiver_tool_call_seconds{server, phase}`, `phase` being `queued` or `took`): a
//!   [`CallObserver`] the dispatcher tells about every call
//!   (`calls.rs`). Its per-call work is a read lock, one hash of the tool's name, a counter
//!   and two histogram observations: the series of a tool are resolved once and kept.
//! - **sandbox runs and kills by limit**: a decorator of the registry's `Sandbox` port
//!   ([`Metrics::sandbox`], `sandbox.rs`).
//! - **execution-log rows handed to the store**: a decorator of the `ToolCallRecorder` port
//!   ([`Metrics::recorder`]); with the store's own counters ([`Metrics::read_log_writer`])
//!   that gives the rows waiting in the writer.
//! - **upstreams, sessions, working sets, the log writer**: read when Prometheus scrapes,
//!   through the functions the host gives ([`Metrics::read_upstreams`],
//!   [`Metrics::read_working_sets`], [`Metrics::read_log_writer`],
//!   [`Metrics::set_sessions_open`]), so nothing on their paths changes (`gauges.rs`).
//!
//! Like every adapter, it depends on the core crates only.

mod calls;
mod gauges;
mod recorder;
mod sandbox;

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use prometheus_client::registry::Registry;
use quiver_registry::{CallObserver, ToolCallRecorder, sandbox::Sandbox};

pub use gauges::{
    LogWriterReading, ProcessReading, UpstreamReading, UpstreamState, WorkingSetsReading,
};

/// The `Content-Type` of what [`Metrics::render`] returns: the Prometheus text format,
/// version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Every metric of one Quiver process. Build it once, give [`Metrics::observer`] to the
/// dispatcher, wrap the sandbox and recorder, and serve [`Metrics::render`].
pub struct Metrics {
    registry: Registry,
    calls: Arc<calls::CallMetrics>,
    sandbox: Arc<sandbox::SandboxCounters>,
    gauges: Arc<gauges::Gauges>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics, every family registered (a family shows once it has a series).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("quiver");
        let calls = Arc::new(calls::CallMetrics::register(&mut registry));
        let sandbox = Arc::new(sandbox::SandboxCounters::register(&mut registry));
        let gauges = Arc::new(gauges::Gauges::default());
        registry.register_collector(Box::new(gauges.clone()));
        Metrics {
            registry,
            calls,
            sandbox,
            gauges,
        }
    }

    /// The call observer to give the dispatcher
    /// ([`DispatcherBuilder::observer`](quiver_registry::DispatcherBuilder::observer)).
    pub fn observer(&self) -> Arc<dyn CallObserver> {
        self.calls.clone()
    }

    /// `inner`, counting its runs and the runs a limit stopped.
    pub fn sandbox(&self, inner: Arc<dyn Sandbox>) -> Arc<dyn Sandbox> {
        Arc::new(sandbox::CountingSandbox::new(inner, self.sandbox.clone()))
    }

    /// `inner`, counting the execution-log rows handed to it (the log writer's queue depth
    /// is those less the rows the store says it wrote or dropped).
    pub fn recorder(&self, inner: Arc<dyn ToolCallRecorder>) -> Arc<dyn ToolCallRecorder> {
        Arc::new(recorder::CountingRecorder::new(
            inner,
            self.gauges.rows_handed.clone(),
        ))
    }

    /// Reads the upstream MCP servers' state and counters at each scrape.
    pub fn read_upstreams(&self, read: impl Fn() -> Vec<UpstreamReading> + Send + Sync + 'static) {
        *gauges::lock(&self.gauges.upstreams) = Some(Box::new(read));
    }

    /// Reads the sessions' working sets at each scrape.
    pub fn read_working_sets(&self, read: impl Fn() -> WorkingSetsReading + Send + Sync + 'static) {
        *gauges::lock(&self.gauges.working_sets) = Some(Box::new(read));
    }

    /// Reads the execution-log writer's counters at each scrape.
    pub fn read_log_writer(&self, read: impl Fn() -> LogWriterReading + Send + Sync + 'static) {
        *gauges::lock(&self.gauges.log_writer) = Some(Box::new(read));
    }

    /// Reads the process (memory, threads, files) at each scrape through `read`.
    pub fn read_process(&self, read: impl Fn() -> ProcessReading + Send + Sync + 'static) {
        *gauges::lock(&self.gauges.process) = Some(Box::new(read));
    }

    /// Sets the number of MCP sessions open (the server counts them when it is scraped).
    pub fn set_sessions_open(&self, open: u64) {
        self.gauges.sessions_open.store(open, Ordering::Relaxed);
        self.gauges.sessions_known.store(1, Ordering::Relaxed);
    }

    /// Every metric, in the Prometheus text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String fails only if an encoder reports an error of its own, which
        // these never do; what was written is served either way.
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        {
            out.push_str(&format!("# encoding stopped: {e}\n"));
        }
        out
    }
}

/// A shared counter of rows (the recorder's hand-overs).
pub(crate) type Count = Arc<AtomicU64>;
