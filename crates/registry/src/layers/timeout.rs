//! Timeout: every call has a deadline (default 30 s, per-tool overrides); a call that already
//! carries a shorter deadline keeps it.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use quiver_contract::{Envelope, ErrKind};
use tower::{Layer, Service};

use super::{Call, CallFuture};

/// How close to its deadline a tool's own timeout counts as that deadline's.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

/// Timeout configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimeoutConfig {
    /// Applied to every tool without an override.
    pub default: Duration,
    /// Per-tool overrides.
    pub per_tool: HashMap<String, Duration>,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        TimeoutConfig {
            default: Duration::from_secs(30),
            per_tool: HashMap::new(),
        }
    }
}

impl TimeoutConfig {
    /// Sets the default.
    pub fn with_default(mut self, d: Duration) -> Self {
        self.default = d;
        self
    }

    /// Adds an override.
    pub fn with_tool(mut self, tool: impl Into<String>, d: Duration) -> Self {
        self.per_tool.insert(tool.into(), d);
        self
    }
}

/// Applies [`TimeoutConfig`].
#[derive(Debug, Clone)]
pub struct TimeoutLayer {
    config: Arc<TimeoutConfig>,
}

impl TimeoutLayer {
    /// A layer with this configuration.
    pub fn new(config: TimeoutConfig) -> Self {
        TimeoutLayer {
            config: Arc::new(config),
        }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The timeout service.
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    config: Arc<TimeoutConfig>,
}

impl<S> Service<Call> for Timeout<S>
where
    S: Service<Call, Response = Envelope, Error = Infallible, Future = CallFuture>,
{
    type Response = Envelope;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut call: Call) -> CallFuture {
        let now = Instant::now();
        let limit = self
            .config
            .per_tool
            .get(&call.entry.spec.name)
            .copied()
            .unwrap_or(self.config.default);
        let own = now + limit;
        let (deadline, inherited) = match call.ctx.deadline {
            Some(d) if d < own => (d, true),
            _ => (own, false),
        };
        call.ctx.deadline = Some(deadline);
        let entry = call.entry.clone();
        let started = call.started.clone();
        let span = tracing::info_span!(
            target: quiver_contract::trace::TARGET,
            "timeout",
            otel.name = "quiver.timeout",
            otel.status_code = tracing::field::Empty,
            quiver.timeout.ms = i64::try_from(deadline.saturating_duration_since(now).as_millis()).unwrap_or(i64::MAX),
            quiver.timeout.inherited = inherited,
            error.type = tracing::field::Empty,
        );
        let fut =
            tracing::Instrument::instrument(span.in_scope(|| self.inner.call(call)), span.clone());
        Box::pin(async move {
            let mut fut = fut;
            // A call that finishes on its first poll never needs a timer.
            if let std::task::Poll::Ready(out) = futures::poll!(&mut fut) {
                return out;
            }
            let said = |started: Option<&Instant>| {
                let waited =
                    quiver_contract::duration_text(deadline.saturating_duration_since(now));
                let tool = &entry.spec.name;
                match started {
                    // It never ran: it waited for a slot among the calls in flight.
                    None => format!(
                        "`{tool}` waited {waited} for a free slot behind other calls in flight and never started; nothing was done. Try again when those calls have finished, or use another tool."
                    ),
                    Some(at) => {
                        // Most of the limit spent in the queue is worth saying: the tool
                        // itself had only the rest.
                        let queued = at.saturating_duration_since(now);
                        let queue = if queued * 4 >= deadline.saturating_duration_since(now) {
                            format!(
                                " ({} of it waiting for a free slot behind other calls)",
                                quiver_contract::duration_text(queued)
                            )
                        } else {
                            String::new()
                        };
                        // Abandoned is not undone: a tool that changes things may have done so
                        // (or still be at it), and repeating it would do it twice.
                        let ran = if entry.spec.annotations.read_only {
                            ""
                        } else {
                            " It may have run, or still be running: check its effect before calling it again."
                        };
                        if inherited {
                            format!(
                                "`{tool}` did not finish within the {waited} left of the caller's deadline{queue}; the call was abandoned.{ran}"
                            )
                        } else {
                            format!(
                                "`{tool}` did not finish within its {waited} limit{queue}; the call was abandoned.{ran} Try a smaller request, or another tool."
                            )
                        }
                    }
                }
            };
            match tokio::time::timeout_at(deadline.into(), fut).await {
                // A tool that timed out on the deadline this layer gave it (an MCP upstream
                // measures what was left when it sent the call) is told in this layer's
                // words: the limit as configured, not the remainder the tool saw.
                Ok(Ok(e))
                    if e.err_kind() == Some(&ErrKind::Timeout)
                        && Instant::now() + DEADLINE_SLACK >= deadline =>
                {
                    timed_out(&span);
                    Ok(Envelope::err(ErrKind::Timeout, said(started.get())))
                }
                Ok(result) => result,
                Err(_) => {
                    timed_out(&span);
                    Ok(Envelope::err(ErrKind::Timeout, said(started.get())))
                }
            }
        })
    }
}

/// Marks the timeout's span as the one that ended the call.
fn timed_out(span: &tracing::Span) {
    span.record("error.type", "timeout");
    span.record("otel.status_code", "ERROR");
}
