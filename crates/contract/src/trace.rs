//! W3C trace context across Quiver's edges: the port an OpenTelemetry adapter fills so the
//! MCP adapter can continue a client's trace and hand it on to upstreams.
//!
//! Spans themselves are `tracing` spans under the [`TARGET`] target; the subscriber decides
//! whether anything records them. Trace context, though, must cross process boundaries as
//! text (`traceparent` / `tracestate`, in HTTP headers or an MCP request's `_meta`), and only
//! the tracing backend knows the current span's ids. It is process-wide, as the `tracing`
//! subscriber is: [`install`] sets it once. With none installed, [`current`] is `None` and
//! [`child_of`] just runs its closure, so nothing is propagated and nothing costs.

use std::sync::{
    OnceLock,
    atomic::{AtomicBool, Ordering},
};

/// The `tracing` target of the spans that make up a call's trace (MCP request, dispatch,
/// queue wait, timeout, upstream call, sandbox run).
pub const TARGET: &str = "quiver::trace";

/// W3C trace context as carried on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceContext {
    /// The `traceparent` value: `00-<trace id>-<parent span id>-<flags>`.
    pub traceparent: String,
    /// The `tracestate` value, when there is one.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// A context from its two values.
    pub fn new(traceparent: impl Into<String>, tracestate: Option<String>) -> Self {
        TraceContext {
            traceparent: traceparent.into(),
            tracestate,
        }
    }

    /// The 32 hex digits of the trace id, when `traceparent` is well formed.
    pub fn trace_id(&self) -> Option<&str> {
        let mut parts = self.traceparent.split('-');
        let (_version, id) = (parts.next()?, parts.next()?);
        (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
    }
}

/// What a tracing backend does with trace context.
pub trait Propagation: Send + Sync + 'static {
    /// The current span's context, to send on; `None` when no span is being recorded.
    fn current(&self) -> Option<TraceContext>;

    /// Runs `make` with `remote` as the current context, so a span `make` creates is the
    /// remote span's child. A `remote` that does not parse leaves the context as it was.
    fn with_remote_parent(&self, remote: &TraceContext, make: &mut dyn FnMut());
}

static PROPAGATION: OnceLock<Box<dyn Propagation>> = OnceLock::new();
static RECORD_PAYLOADS: AtomicBool = AtomicBool::new(false);

/// Whether spans carry a call's arguments and result (off unless the operator turns it on:
/// they may hold what a trace's readers should not see).
pub fn record_payloads() -> bool {
    RECORD_PAYLOADS.load(Ordering::Relaxed)
}

/// Turns [`record_payloads`] on or off for the process.
pub fn set_record_payloads(on: bool) {
    RECORD_PAYLOADS.store(on, Ordering::Relaxed);
}

/// Installs the process's propagation; `false` (and nothing changes) when one is already
/// installed.
pub fn install(propagation: Box<dyn Propagation>) -> bool {
    PROPAGATION.set(propagation).is_ok()
}

/// The current span's context, to put on an outgoing request.
pub fn current() -> Option<TraceContext> {
    PROPAGATION.get().and_then(|p| p.current())
}

/// Runs `make` as the child of `remote` (a client's context), or as it is when there is
/// no remote context or no propagation installed.
pub fn child_of<T>(remote: Option<&TraceContext>, make: impl FnOnce() -> T) -> T {
    match (remote, PROPAGATION.get()) {
        (Some(remote), Some(p)) => {
            let mut make = Some(make);
            let mut out = None;
            p.with_remote_parent(remote, &mut || {
                if let Some(make) = make.take() {
                    out = Some(make());
                }
            });
            match out {
                Some(out) => out,
                // A backend that did not run the closure: run it here, without a parent.
                None => make.map(|m| m()).expect("the closure runs once"),
            }
        }
        _ => make(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_id_is_read_from_a_well_formed_traceparent_only() {
        let ok = TraceContext::new(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        );
        assert_eq!(ok.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in [
            "",
            "00",
            "00-xyz-00f067aa0ba902b7-01",
            "00-4bf92f35-00f0-01",
        ] {
            assert_eq!(TraceContext::new(bad, None).trace_id(), None, "{bad}");
        }
    }

    #[test]
    fn without_a_backend_child_of_runs_the_closure_and_current_is_none() {
        let remote = TraceContext::new(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        );
        assert_eq!(child_of(Some(&remote), || 7), 7);
        assert_eq!(current(), None);
    }
}
