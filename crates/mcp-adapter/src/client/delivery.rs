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
        let sent = self.inner.send(item);
        let written = self.written.clone();
        async move {
            let result = sent.await;
            if let (Ok(()), Some(id)) = (&result, id) {
                written.insert(id);
            }
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
