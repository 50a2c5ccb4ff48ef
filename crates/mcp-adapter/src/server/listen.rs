//! A `subscriptions/listen` stream (2026-07-28): the list changes of the request's working
//! set and of the content source, and updates of the resources it subscribed (upstream, for
//! as long as the stream lasts).

use std::sync::Arc;

use rmcp::service::SubscriptionContext;

use super::{
    Shared,
    call::recv_some,
    content::{ContentSource, ListChange, ListChanged},
    scope::{Connection, Scope},
    watch::Changes,
};
use crate::sync::lock;

/// Serves `subscription`, a request in `scope` of `conn`, until the client ends it, the
/// server shuts down, or a notification cannot be delivered.
pub(super) async fn listen(
    shared: &Shared,
    conn: &Connection,
    scope: Scope,
    subscription: SubscriptionContext,
) {
    use tokio::sync::broadcast::error::RecvError;
    lock(&conn.keys).insert(scope.key.as_arc().clone());
    let sink = subscription.sink().clone();
    let accepted = subscription.accepted().clone();
    let wants = |f: Option<bool>| f == Some(true);
    let (tools, resources, prompts) = (
        wants(accepted.tools_list_changed),
        wants(accepted.resources_list_changed),
        wants(accepted.prompts_list_changed),
    );
    let source = shared.content.clone();
    let mut lists = source
        .as_ref()
        .filter(|_| resources || prompts)
        .map(|s| s.list_changes());
    // Resource subscriptions of this stream: subscribed upstream for as long as it lasts.
    let uris: std::collections::BTreeSet<String> = accepted
        .resource_subscriptions
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut updates = source
        .as_ref()
        .filter(|_| !uris.is_empty())
        .map(|s| s.resource_updates());
    // Only what was subscribed is unsubscribed when the stream ends (the source counts
    // subscriptions across sessions).
    let mut _unsubscribe = None;
    if let Some(s) = source.as_ref().filter(|_| !uris.is_empty()) {
        let guard = _unsubscribe.insert(Unsubscribe {
            source: s.clone(),
            uris: Vec::new(),
        });
        for uri in &uris {
            match s.subscribe(uri, &scope.capabilities).await {
                Ok(()) => guard.uris.push(uri.clone()),
                Err(e) => {
                    tracing::info!(uri = %uri, error = %e, "listen: the upstream refused a resource subscription");
                }
            }
        }
    }
    // Updates go out only for the URIs subscribed: a refused one (another token's
    // server's, or one no server lists) gets none.
    let uris: std::collections::BTreeSet<String> = _unsubscribe
        .as_ref()
        .map(|g| g.uris.iter().cloned().collect())
        .unwrap_or_default();
    let mut changes = Changes::subscribe(shared);
    let key = scope.key.clone();
    loop {
        let sent = tokio::select! {
            _ = subscription.cancelled() => return,
            _ = shared.shutdown.cancelled() => return,
            change = changes.next(|k| *k == *key) => {
                if change.is_none() {
                    return;
                }
                if !tools {
                    continue;
                }
                sink.notify_tool_list_changed().await
            }
            change = recv_some(&mut lists) => match change {
                Ok(c) if !c.reaches(&scope.capabilities) => continue,
                Ok(ListChanged { list: ListChange::Resources, .. }) if resources => {
                    sink.notify_resource_list_changed().await
                }
                Ok(ListChanged { list: ListChange::Prompts, .. }) if prompts => {
                    sink.notify_prompt_list_changed().await
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => {
                    let mut r = Ok(());
                    if resources {
                        r = sink.notify_resource_list_changed().await;
                    }
                    if prompts && r.is_ok() {
                        r = sink.notify_prompt_list_changed().await;
                    }
                    r
                }
                Err(RecvError::Closed) => {
                    lists = None;
                    continue;
                }
            },
            update = recv_some(&mut updates) => match update {
                Ok(uri) if uris.contains(&uri) => sink.notify_resource_updated(uri).await,
                Ok(_) => continue,
                Err(RecvError::Lagged(n)) => {
                    // Missed some: each subscribed resource may have changed.
                    tracing::warn!(missed = n, "resource updates dropped for a slow subscription");
                    let mut r = Ok(());
                    for uri in &uris {
                        r = sink.notify_resource_updated(uri.clone()).await;
                        if r.is_err() {
                            break;
                        }
                    }
                    r
                }
                Err(RecvError::Closed) => {
                    updates = None;
                    continue;
                }
            },
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "the subscription is gone");
            return;
        }
    }
}

/// Ends a `listen` stream's upstream resource subscriptions when the stream ends.
struct Unsubscribe {
    source: Arc<dyn ContentSource>,
    uris: Vec<String>,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let (source, uris) = (self.source.clone(), std::mem::take(&mut self.uris));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for uri in uris {
                    let _ = source.unsubscribe(&uri).await;
                }
            });
        }
    }
}
