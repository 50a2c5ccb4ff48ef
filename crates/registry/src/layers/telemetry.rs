//! Telemetry: a tracing span per call and per-tool Ok/Hint/Err counters with hint and error
//! kinds.

use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use quiver_contract::Envelope;
use tower::{Layer, Service};
use tracing::Instrument;

use super::{Call, CallFuture};
use crate::sync::lock;

/// Counters of one tool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ToolCounters {
    /// Ok results.
    pub ok: u64,
    /// Hint results.
    pub hint: u64,
    /// Err results.
    pub err: u64,
    /// Hints by kind.
    pub hint_kinds: BTreeMap<String, u64>,
    /// Errors by kind.
    pub err_kinds: BTreeMap<String, u64>,
    /// Policy violations.
    pub policy_violations: u64,
}

/// Per-tool counters, shared by the dispatcher and the telemetry layer.
#[derive(Debug, Default)]
pub struct Metrics {
    tools: Mutex<HashMap<String, ToolCounters, foldhash::fast::RandomState>>,
}

impl Metrics {
    /// Empty counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one outcome.
    pub fn count(&self, tool: &str, envelope: &Envelope) {
        let mut tools = lock(&self.tools);
        let c = match tools.get_mut(tool) {
            Some(c) => c,
            None => tools.entry(tool.to_owned()).or_default(),
        };
        match envelope {
            Envelope::Ok { .. } => c.ok += 1,
            Envelope::Hint { hint_kind, .. } => {
                c.hint += 1;
                *c.hint_kinds
                    .entry(hint_kind.as_str().to_owned())
                    .or_default() += 1;
            }
            Envelope::Err { err_kind, .. } => {
                c.err += 1;
                *c.err_kinds.entry(err_kind.as_str().to_owned()).or_default() += 1;
            }
        }
    }

    /// Counts a policy violation.
    pub fn count_violation(&self, tool: &str) {
        let mut tools = lock(&self.tools);
        tools.entry(tool.to_owned()).or_default().policy_violations += 1;
    }

    /// A copy of one tool's counters.
    pub fn tool(&self, tool: &str) -> ToolCounters {
        lock(&self.tools).get(tool).cloned().unwrap_or_default()
    }

    /// A copy of all counters, by tool name.
    pub fn snapshot(&self) -> BTreeMap<String, ToolCounters> {
        lock(&self.tools)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Adds a span and counts outcomes.
#[derive(Debug, Clone)]
pub struct TelemetryLayer {
    metrics: Arc<Metrics>,
}

impl TelemetryLayer {
    /// A layer counting into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        TelemetryLayer { metrics }
    }
}

impl<S> Layer<S> for TelemetryLayer {
    type Service = Telemetry<S>;

    fn layer(&self, inner: S) -> Telemetry<S> {
        Telemetry {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The telemetry service.
#[derive(Debug, Clone)]
pub struct Telemetry<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Service<Call> for Telemetry<S>
where
    S: Service<Call, Response = Envelope, Error = Infallible, Future = CallFuture>,
{
    type Response = Envelope;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> CallFuture {
        let span = tracing::debug_span!(
            "tool_call",
            tool = %call.entry.spec.name,
            session = call.ctx.session.as_deref().unwrap_or(""),
            outcome = tracing::field::Empty,
        );
        let metrics = self.metrics.clone();
        let entry = call.entry.clone();
        let fut = self.inner.call(call);
        let span2 = span.clone();
        Box::pin(
            async move {
                let envelope = fut.await?;
                metrics.count(&entry.spec.name, &envelope);
                span2.record("outcome", envelope.kind_str());
                Ok(envelope)
            }
            .instrument(span),
        )
    }
}
