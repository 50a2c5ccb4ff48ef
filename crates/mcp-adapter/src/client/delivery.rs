//! Knowing whether a request left Quiver. rmcp reports a connection that died with a
//! request pending the same way whether or not the request was ever written, so the stdio
//! transport is wrapped to record each request id whose write completed. A request that was
//! never written is safe to send again; one that was written may have run and is never
//! replayed.

use std::{
    borrow::Cow,
    collections::HashSet,
    sync::{Arc, Mutex},
};

use rmcp::{
    RoleClient,
    model::{JsonRpcMessage, RequestId},
    service::{RxJsonRpcMessage, TxJsonRpcMessage},
    transport::Transport,
};

/// The ids of requests whose write completed.
#[derive(Clone, Default)]
pub(crate) struct Written(Arc<Mutex<HashSet<RequestId>>>);

impl Written {
    fn insert(&self, id: RequestId) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
    }

    /// Whether the request was written, forgetting it.
    pub(crate) fn take(&self, id: &RequestId) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id)
    }
}

/// A transport that records completed request writes in [`Written`].
pub(crate) struct Tracked<T> {
    pub(crate) inner: T,
    pub(crate) written: Written,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Tracked<T> {
    type Error = T::Error;

    fn name() -> Cow<'static, str> {
        T::name()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let id = match &item {
            JsonRpcMessage::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        let written = self.written.clone();
        let record = move |result: &Result<(), T::Error>| {
            if let (Ok(()), Some(id)) = (result, &id) {
                written.insert(id.clone());
            }
        };
        // rmcp's service loop spawns a task for each send; polling the write once here, in
        // the loop's own task, puts an uncontended message on the pipe at once instead of
        // one task hand-over later (on a small machine a wake-up of the other worker).
        // Whatever does not finish now finishes in rmcp's task (a well-behaved future takes
        // the new waker on its next poll).
        let mut sent = Box::pin(self.inner.send(item));
        let waker = futures::task::noop_waker();
        let first = sent
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker));
        async move {
            let result = match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => sent.await,
            };
            record(&result);
            result
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
