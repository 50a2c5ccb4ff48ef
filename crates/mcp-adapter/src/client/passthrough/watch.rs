//! Resource subscriptions passed through: each URI's watch ([`WatchCell`]) counts the
//! downstream sessions subscribed to it; the first subscribes upstream, the last one to leave
//! unsubscribes, a reconnected server is subscribed again, and a watch moves to the server
//! that serves the URI now.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use rmcp::model::{SubscribeRequestParams, UnsubscribeRequestParams};

use super::{State, ask, connected, timeout};
use crate::client::{Shared, upstream::Upstream};
use crate::content::ContentError;
use crate::sync::lock;

/// One resource URI that downstream sessions subscribed to.
#[derive(Debug, Default)]
pub(super) struct WatchCell {
    /// The server subscribed upstream; a plain lock, so a reconnected server picks its own
    /// URIs without queueing behind another server's slow request. Set under `sessions`.
    pub(super) server: Mutex<String>,
    /// How many downstream sessions are subscribed (0: not subscribed upstream). Its lock
    /// orders the upstream requests of this URI.
    pub(super) sessions: tokio::sync::Mutex<usize>,
    /// Whether a subscriber may reach only some servers (set under `sessions`): the watch
    /// then stays where it is, since another server's updates may not be that caller's.
    pub(super) restricted: AtomicBool,
}

impl WatchCell {
    /// Nobody holds or waits for it but the map (`refs` references known) and nobody is
    /// subscribed.
    pub(super) fn unused(cell: &Arc<WatchCell>, refs: usize) -> bool {
        Arc::strong_count(cell) == refs && cell.sessions.try_lock().is_ok_and(|n| *n == 0)
    }
}

/// A handle on one URI's [`WatchCell`]; dropping it removes an entry nobody is subscribed to
/// and nobody else is using.
pub(super) struct WatchSlot<'a> {
    pub(super) state: &'a State,
    pub(super) uri: String,
    pub(super) cell: Arc<WatchCell>,
}

impl State {
    /// The URI's watch, made if there is none.
    pub(super) fn watch(&self, uri: &str) -> WatchSlot<'_> {
        let watch = lock(&self.subscriptions)
            .entry(uri.to_owned())
            .or_default()
            .clone();
        self.slot(uri, watch)
    }

    /// The URI's watch, if there is one.
    pub(super) fn watching(&self, uri: &str) -> Option<WatchSlot<'_>> {
        let watch = lock(&self.subscriptions).get(uri)?.clone();
        Some(self.slot(uri, watch))
    }

    pub(super) fn slot(&self, uri: &str, cell: Arc<WatchCell>) -> WatchSlot<'_> {
        WatchSlot {
            state: self,
            uri: uri.to_owned(),
            cell,
        }
    }

    /// Drops the entries of `uris` nobody uses any more.
    pub(super) fn tidy(&self, uris: &[String]) {
        let mut subs = lock(&self.subscriptions);
        for uri in uris {
            if subs.get(uri).is_some_and(|c| WatchCell::unused(c, 1)) {
                subs.remove(uri);
            }
        }
    }
}

impl Drop for WatchSlot<'_> {
    fn drop(&mut self) {
        let mut subs = lock(&self.state.subscriptions);
        // Handles are made only under the map's lock: two references (the map's and this
        // one) mean no one else holds or waits for this watch.
        if WatchCell::unused(&self.cell, 2) {
            subs.remove(&self.uri);
        }
    }
}

/// Moves the watch of `uri` (`cell`, its sessions' lock held by the caller) to `to`:
/// subscribed there first, then unsubscribed where it was (best effort: a server that is down
/// has forgotten it with its session).
pub(super) async fn move_watch(
    shared: &Arc<Shared>,
    uri: &str,
    cell: &WatchCell,
    to: &Arc<Upstream>,
) -> Result<(), ContentError> {
    subscribe_at(shared, to, uri).await?;
    let from = std::mem::replace(&mut *lock(&cell.server), to.name().to_owned());
    tracing::info!(%uri, from = %from, to = %to.name(), "the resource's watch moved to the server that serves it now");
    if let Some(old) = shared.server(&from)
        && let Err(e) = unsubscribe_at(shared, &old, uri).await
    {
        tracing::warn!(server = %old.name(), %uri, error = %e, "could not unsubscribe after the watch moved");
    }
    Ok(())
}

/// Subscribes `up` to `uri`: an error when it is not connected or takes no subscriptions.
pub(super) async fn subscribe_at(
    shared: &Shared,
    up: &Upstream,
    uri: &str,
) -> Result<(), ContentError> {
    let conn = connected(up, |c| c.has_resources, "resources")?;
    if !conn.has_subscribe {
        return Err(ContentError::InvalidParams(format!(
            "MCP server \"{}\" does not support resource subscriptions; read {uri} again to see changes",
            up.name()
        )));
    }
    #[allow(deprecated)]
    let request = conn
        .peer
        .subscribe(SubscribeRequestParams::new(uri.to_owned()));
    ask(up, timeout(shared, up), "resources/subscribe", request).await
}

/// Unsubscribes `up` from `uri`; nothing to send to a server that is down (it has forgotten
/// the subscription with its session).
pub(super) async fn unsubscribe_at(
    shared: &Shared,
    up: &Upstream,
    uri: &str,
) -> Result<(), ContentError> {
    let Some(conn) = up.conn().filter(|c| c.has_subscribe) else {
        return Ok(());
    };
    #[allow(deprecated)]
    let request = conn
        .peer
        .unsubscribe(UnsubscribeRequestParams::new(uri.to_owned()));
    ask(up, timeout(shared, up), "resources/unsubscribe", request).await
}

/// After a listing changed who serves the URIs: each watched URI whose first owner is now a
/// connected server other than the watched one moves there, so that its updates come from
/// where its reads go (a watch begun while that server was down stayed at the later one).
pub(super) fn rewatch(shared: &Arc<Shared>) {
    let moves: Vec<(String, Arc<WatchCell>, Arc<Upstream>)> = {
        let owners = lock(&shared.passthrough.owners);
        let subs = lock(&shared.passthrough.subscriptions);
        subs.iter()
            .filter_map(|(uri, cell)| {
                // A caller who may reach only some servers keeps the watch it began.
                if cell.restricted.load(Ordering::Relaxed) {
                    return None;
                }
                let first = owners.get(uri)?.first()?;
                if *lock(&cell.server) == *first {
                    return None;
                }
                let to = shared.server(first)?;
                to.conn()
                    .is_some_and(|c| c.has_subscribe)
                    .then(|| (uri.clone(), cell.clone(), to))
            })
            .collect()
    };
    for (uri, cell, to) in moves {
        let shared = shared.clone();
        tokio::spawn(async move {
            {
                let sessions = cell.sessions.lock().await;
                let watched = lock(&cell.server).clone();
                if *sessions > 0
                    && watched != to.name()
                    && !cell.restricted.load(Ordering::Relaxed)
                    && let Err(e) = move_watch(&shared, &uri, &cell, &to).await
                {
                    tracing::warn!(server = %to.name(), %uri, error = %e, "could not move the resource's watch to the server that serves it now");
                }
            }
            drop(cell);
            // An entry whose last subscriber left while this held it.
            shared.passthrough.tidy(std::slice::from_ref(&uri));
        });
    }
}

/// Subscribes a reconnected server again to the URIs downstream sessions still watch.
pub(crate) fn resubscribe(shared: &Arc<Shared>, server: &str) {
    let Some(up) = shared.server(server) else {
        return;
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        // Only this server's URIs, picked without waiting for any watch's lock.
        let mine: Vec<(String, Arc<WatchCell>)> = lock(&shared.passthrough.subscriptions)
            .iter()
            .filter(|(_, c)| *lock(&c.server) == up.name())
            .map(|(uri, c)| (uri.clone(), c.clone()))
            .collect();
        let uris: Vec<String> = mine.iter().map(|(u, _)| u.clone()).collect();
        if up.conn().is_some_and(|c| c.has_subscribe) {
            for (uri, cell) in mine {
                // Under the URI's lock, so an unsubscribe meanwhile is sent after this.
                let sessions = cell.sessions.lock().await;
                if *sessions == 0 || *lock(&cell.server) != up.name() {
                    continue;
                }
                if let Err(e) = subscribe_at(&shared, &up, &uri).await {
                    tracing::warn!(server = %up.name(), %uri, error = %e, "could not subscribe again after reconnecting");
                }
            }
        }
        // Entries whose last subscriber left while this held them.
        shared.passthrough.tidy(&uris);
    });
}
