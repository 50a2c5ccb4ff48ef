//! Recover: a panicking tool becomes an Err envelope naming the tool; the process lives on.

use std::{
    any::Any,
    convert::Infallible,
    panic::AssertUnwindSafe,
    task::{Context, Poll},
};

use futures::FutureExt;
use quiver_contract::{Envelope, ErrKind};
use tower::{Layer, Service};

use super::{Call, CallFuture};

/// Configuration of the recover layer (none needed yet).
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct RecoverConfig {}

/// Catches panics from the services inside it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecoverLayer;

impl<S> Layer<S> for RecoverLayer {
    type Service = Recover<S>;

    fn layer(&self, inner: S) -> Recover<S> {
        Recover { inner }
    }
}

/// The recover service.
#[derive(Debug, Clone)]
pub struct Recover<S> {
    inner: S,
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-text panic payload".to_owned()
    }
}

pub(crate) fn panic_envelope(tool: &str, payload: &(dyn Any + Send)) -> Envelope {
    Envelope::err(
        ErrKind::Panic,
        format!(
            "tool `{tool}` crashed ({}). This is a fault in the tool, not in your arguments; retrying the same call will likely fail again.",
            panic_text(payload)
        ),
    )
}

impl<S> Service<Call> for Recover<S>
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
        let entry = call.entry.clone();
        let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(call))) {
            Ok(fut) => fut,
            Err(payload) => {
                return Box::pin(async move { Ok(panic_envelope(&entry.spec.name, &*payload)) });
            }
        };
        Box::pin(async move {
            match AssertUnwindSafe(fut).catch_unwind().await {
                Ok(result) => result,
                Err(payload) => Ok(panic_envelope(&entry.spec.name, &*payload)),
            }
        })
    }
}
