//! Concurrency: a global limit and per-tool limits on calls in flight. Waiting for a permit
//! respects cancellation.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
};

use quiver_contract::{Envelope, ErrKind};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

use super::{Call, CallFuture};

/// The least time a queued call must have left when its slot comes to be started: with less,
/// it would be abandoned within milliseconds of being sent, so it is answered as never
/// started instead.
const MIN_TIME_TO_START: std::time::Duration = std::time::Duration::from_millis(20);

/// Concurrency limits.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyConfig {
    /// Calls in flight across all tools.
    pub global: usize,
    /// Calls in flight per tool, for tools with a limit.
    pub per_tool: HashMap<String, usize>,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        ConcurrencyConfig {
            global: 1024,
            per_tool: HashMap::new(),
        }
    }
}

impl ConcurrencyConfig {
    /// Sets the global limit.
    pub fn with_global(mut self, n: usize) -> Self {
        self.global = n;
        self
    }

    /// Sets a per-tool limit.
    pub fn with_tool(mut self, tool: impl Into<String>, n: usize) -> Self {
        self.per_tool.insert(tool.into(), n);
        self
    }
}

/// Applies [`ConcurrencyConfig`].
#[derive(Debug, Clone)]
pub struct ConcurrencyLayer {
    global: Arc<Semaphore>,
    per_tool: Arc<HashMap<String, Arc<Semaphore>>>,
}

impl ConcurrencyLayer {
    /// A layer with these limits.
    pub fn new(config: ConcurrencyConfig) -> Self {
        ConcurrencyLayer {
            global: Arc::new(Semaphore::new(config.global.max(1))),
            per_tool: Arc::new(
                config
                    .per_tool
                    .into_iter()
                    .map(|(k, n)| (k, Arc::new(Semaphore::new(n.max(1)))))
                    .collect(),
            ),
        }
    }
}

impl<S> Layer<S> for ConcurrencyLayer {
    type Service = Concurrency<S>;

    fn layer(&self, inner: S) -> Concurrency<S> {
        Concurrency {
            inner,
            global: self.global.clone(),
            per_tool: self.per_tool.clone(),
        }
    }
}

/// The concurrency service.
#[derive(Debug, Clone)]
pub struct Concurrency<S> {
    inner: S,
    global: Arc<Semaphore>,
    per_tool: Arc<HashMap<String, Arc<Semaphore>>>,
}

impl<S> Service<Call> for Concurrency<S>
where
    S: Service<Call, Response = Envelope, Error = Infallible, Future = CallFuture>
        + Clone
        + Send
        + 'static,
{
    type Response = Envelope;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> CallFuture {
        let tool_sem = self.per_tool.get(&call.entry.spec.name).cloned();
        // Fast path: permits free now, no await.
        if let Ok(global) = self.global.clone().try_acquire_owned() {
            let local = match &tool_sem {
                None => Some(None),
                Some(sem) => sem.clone().try_acquire_owned().ok().map(Some),
            };
            if let Some(local) = local {
                let fut = self.inner.call(call);
                return Box::pin(async move {
                    let out = fut.await;
                    drop((global, local));
                    out
                });
            }
        }
        let global = self.global.clone();
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let cancel = call.ctx.cancel.clone();
            let acquire = async {
                let local = match tool_sem {
                    Some(sem) => Some(sem.acquire_owned().await),
                    None => None,
                };
                let global = global.acquire_owned().await;
                (global, local)
            };
            // Only a call that waits gets the span: the fast path above never queues.
            let queued = tracing::info_span!(
                target: quiver_contract::trace::TARGET,
                "queue",
                otel.name = "quiver.queue_wait",
                gen_ai.tool.name = %call.entry.spec.name,
            );
            let acquire = tracing::Instrument::instrument(acquire, queued);
            let permits = tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    return Ok(Envelope::err(ErrKind::Cancelled, format!("`{}` was cancelled while waiting for a free slot", call.entry.spec.name)));
                }
                permits = acquire => permits,
            };
            if call
                .ctx
                .deadline
                .is_some_and(|d| tokio::time::Instant::now() + MIN_TIME_TO_START >= d.into())
            {
                // The slot came at, after or just before the call's deadline (the call
                // holding it timed out at about the same moment): the timeout layer answers
                // that it never started, so it must not start now, and the slot goes on at
                // once. Each such call used to run (an upstream got it, and it was abandoned
                // within milliseconds), and free the slot for the next overdue one.
                drop(permits);
                return std::future::pending().await;
            }
            let out = inner.call(call).await;
            drop(permits);
            out
        })
    }
}
