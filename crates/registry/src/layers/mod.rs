//! The dispatch middleware, one module per layer, each with its config struct. The stack is
//! assembled in one visible place, [`crate::Dispatcher`]'s constructor, outermost first:
//! telemetry, recover, timeout, concurrency, result limit, output check, then the tool itself.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
    time::Instant,
};

use quiver_contract::{CallContext, Envelope};
use serde_json::Value;
use tower::Service;

use crate::Entry;

pub mod concurrency;
pub mod output_check;
pub mod recover;
pub mod result_limit;
pub mod telemetry;
pub mod timeout;

/// A call on its way through the middleware to the tool.
#[derive(Debug)]
#[non_exhaustive]
pub struct Call {
    /// The tool's catalog entry.
    pub entry: Arc<Entry>,
    /// Validated, narration-free arguments.
    pub input: Value,
    /// The call's context.
    pub ctx: CallContext,
    /// Set when the tool begins executing (after any queueing).
    pub started: Arc<OnceLock<Instant>>,
}

/// The boxed future every layer returns.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<Envelope, Infallible>> + Send>>;

/// The innermost service: runs the tool and turns a [`quiver_contract::ToolError`] into its
/// envelope.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolService;

impl Service<Call> for ToolService {
    type Response = Envelope;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> CallFuture {
        Box::pin(async move {
            let _ = call.started.set(Instant::now());
            Ok(match call.entry.tool.call(call.input, &call.ctx).await {
                Ok(envelope) => envelope,
                Err(e) => e.into(),
            })
        })
    }
}
