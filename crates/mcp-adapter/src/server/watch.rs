//! Which changes concern whom: a session's working set changing (the surface names the key)
//! or the catalog changing (every session's surface may differ).

use std::sync::Arc;

use quiver_registry::CatalogEvent;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};

use super::Shared;

pub(crate) struct Changes {
    sessions: broadcast::Receiver<Arc<str>>,
    catalog: broadcast::Receiver<CatalogEvent>,
}

impl Changes {
    pub(crate) fn subscribe(shared: &Shared) -> Self {
        Changes {
            sessions: shared.surface.subscribe_changes(),
            catalog: shared.surface.catalog().subscribe(),
        }
    }

    /// Waits for the next change that concerns a key `relevant` accepts (a lag counts as a
    /// change), then swallows the changes already queued so one burst makes one
    /// notification. `None` when the surface or the catalog is gone.
    pub(crate) async fn next(&mut self, relevant: impl Fn(&str) -> bool) -> Option<()> {
        loop {
            let hit = tokio::select! {
                r = self.sessions.recv() => match r {
                    Ok(key) => relevant(&key),
                    Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => return None,
                },
                r = self.catalog.recv() => match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => return None,
                },
            };
            if hit {
                self.drain();
                return Some(());
            }
        }
    }

    fn drain(&mut self) {
        while !matches!(
            self.sessions.try_recv(),
            Err(TryRecvError::Empty | TryRecvError::Closed)
        ) {}
        while !matches!(
            self.catalog.try_recv(),
            Err(TryRecvError::Empty | TryRecvError::Closed)
        ) {}
    }
}
