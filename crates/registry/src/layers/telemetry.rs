//! Telemetry: the `execute_tool` span of each call (see [`quiver_contract::trace`]) and
//! per-tool Ok/Hint/Err counters with hint and error kinds.

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
        let server = crate::Family::mcp_server(&call.entry.family);
        // The GenAI `execute_tool` span of the OpenTelemetry conventions; under
        // `quiver::trace`, recorded only where a subscriber takes that target.
        let span = tracing::info_span!(
            target: quiver_contract::trace::TARGET,
            "execute_tool",
            otel.name = %format_args!("execute_tool {}", call.entry.spec.name),
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %call.entry.spec.name,
            gen_ai.tool.type = if server.is_some() { "extension" } else { "function" },
            gen_ai.tool.call.id = call.ctx.call_id.as_deref(),
            gen_ai.tool.call.arguments = tracing::field::Empty,
            gen_ai.tool.call.result = tracing::field::Empty,
            quiver.tool.family = %call.entry.family,
            quiver.server = server,
            quiver.call.depth = i64::from(call.ctx.depth),
            quiver.call.parent_id = call.ctx.parent_call_id.as_deref(),
            quiver.tenant = call.ctx.tenant.as_deref(),
            session.id = call.ctx.session.as_deref(),
            enduser.id = call.ctx.principal.as_deref(),
            quiver.outcome = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let payloads = !span.is_disabled() && quiver_contract::trace::record_payloads();
        if payloads {
            span.record(
                "gen_ai.tool.call.arguments",
                tracing::field::display(&call.input),
            );
        }
        let metrics = self.metrics.clone();
        let entry = call.entry.clone();
        // The inner layers' spans (timeout, queue) are created as this one's children.
        let fut = span.in_scope(|| self.inner.call(call));
        let span2 = span.clone();
        Box::pin(
            async move {
                let envelope = fut.await?;
                metrics.count(&entry.spec.name, &envelope);
                if !span2.is_disabled() {
                    record_outcome(&span2, &envelope, payloads);
                }
                Ok(envelope)
            }
            .instrument(span),
        )
    }
}

/// The outcome on the call's span: Ok, Hint or Err, with the hint or error kind as
/// `error.type` (a Hint is a recoverable answer, not a failed span).
fn record_outcome(span: &tracing::Span, envelope: &Envelope, payloads: bool) {
    span.record("quiver.outcome", envelope.kind_str());
    match envelope {
        Envelope::Ok { .. } => {}
        Envelope::Hint { hint_kind, .. } => {
            span.record("error.type", hint_kind.as_str());
        }
        Envelope::Err { err_kind, .. } => {
            span.record("error.type", err_kind.as_str());
            span.record("otel.status_code", "ERROR");
        }
    }
    if payloads {
        let text = quiver_contract::render(envelope, &quiver_contract::RenderOptions::default());
        span.record("gen_ai.tool.call.result", text.as_str());
    }
}
