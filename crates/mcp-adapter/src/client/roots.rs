//! Whose roots an upstream holds.
//!
//! An upstream connection is shared by every downstream client, and a server may keep the
//! roots it fetched once (server-everything keeps them per session until it is told they
//! changed). Without care, the first client's roots would be every later client's: a
//! client that never shared its roots, or shared others, would be shown another's. So
//! Quiver declares `roots.listChanged` upstream and remembers whose roots a connection was
//! last given. A call from another client first sends `notifications/roots/list_changed`
//! and waits (briefly) for the server to fetch again, which it answers with the new
//! caller's roots, or none for a client that declared none, and for that answer to have
//! been delivered (the transports count the answers they finished sending): over
//! streamable HTTP the answer and the call are separate POSTs that could overtake each
//! other.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use quiver_contract::CallContext;
use tokio::sync::Notify;

/// How long a call waits for the server to fetch the roots again after being told they
/// changed.
pub(crate) const REFETCH_WAIT: Duration = Duration::from_millis(500);

/// Who a call's client is, for roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Who {
    /// A client known by its working-set key (an MCP session, a conversation, a token).
    Named(Arc<str>),
    /// A client with no key of its own (`anonymous`): never taken for the one before it.
    Unnamed,
}

impl Who {
    pub(crate) fn of(ctx: &CallContext) -> Who {
        match &ctx.session {
            Some(key) if &**key != crate::server::ANONYMOUS => Who::Named(key.clone()),
            _ => Who::Unnamed,
        }
    }
}

#[derive(Default)]
struct Held {
    /// The connection generation and the client whose roots it was last given.
    holder: Option<(u64, Who)>,
    /// How many answers to `roots/list` the server was given.
    given: u64,
    /// How many answers to server requests the transport finished sending.
    delivered: u64,
    /// Whether the server fetched again when told the roots changed (`None`: not tried).
    refetches: Option<bool>,
}

/// Per upstream: whose roots it holds.
#[derive(Default)]
pub(crate) struct Roots {
    held: Mutex<Held>,
    given: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Roots {
    /// The connection of `generation` was given `who`'s roots (an answer to its
    /// `roots/list`).
    pub(crate) fn given(&self, generation: u64, who: Who) {
        let mut held = lock(&self.held);
        held.holder = Some((generation, who));
        held.given += 1;
        drop(held);
        self.given.notify_waiters();
    }

    /// The transport finished sending an answer to one of the server's requests.
    pub(crate) fn answer_delivered(&self) {
        lock(&self.held).delivered += 1;
        self.given.notify_waiters();
    }

    /// Whether the connection of `generation` holds roots of a client other than `who` (or
    /// of a client that cannot be told apart from it).
    pub(crate) fn stale_for(&self, generation: u64, who: &Who) -> bool {
        match &lock(&self.held).holder {
            Some((g, held)) if *g == generation => *held != *who || *who == Who::Unnamed,
            _ => false,
        }
    }

    /// Tells the server the roots changed (`notify`, which sends the notification) and waits
    /// at most `limit` for it to fetch them again; whether it did. A server that did not
    /// fetch again the first time is not waited for after that.
    pub(crate) async fn refetch<F>(&self, notify: F, limit: Duration) -> bool
    where
        F: std::future::Future<Output = bool>,
    {
        let (before, wait) = {
            let held = lock(&self.held);
            ((held.given, held.delivered), held.refetches != Some(false))
        };
        let changed = self.given.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if !notify.await || !wait {
            return false;
        }
        let fetched = tokio::time::timeout(limit, async {
            loop {
                let done = {
                    let held = lock(&self.held);
                    held.given > before.0 && held.delivered > before.1
                };
                if done {
                    return;
                }
                changed.as_mut().await;
                changed.set(self.given.notified());
                changed.as_mut().enable();
            }
        })
        .await
        .is_ok();
        let mut held = lock(&self.held);
        if fetched {
            held.refetches = Some(true);
        } else if held.refetches.is_none() {
            held.refetches = Some(false);
        }
        fetched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(s: &str) -> Who {
        Who::Named(s.into())
    }

    #[test]
    fn roots_are_stale_only_for_another_or_an_unnamed_client_on_the_same_connection() {
        let roots = Roots::default();
        assert!(!roots.stale_for(1, &named("a")), "nobody's roots yet");
        roots.given(1, named("a"));
        assert!(!roots.stale_for(1, &named("a")));
        assert!(roots.stale_for(1, &named("b")));
        assert!(roots.stale_for(1, &Who::Unnamed));
        assert!(
            !roots.stale_for(2, &named("b")),
            "a new connection holds nobody's"
        );
        roots.given(1, Who::Unnamed);
        assert!(
            roots.stale_for(1, &Who::Unnamed),
            "two unnamed clients are not one"
        );
    }

    #[tokio::test]
    async fn a_refetch_waits_for_the_next_answer_and_gives_up_on_a_server_that_never_fetches() {
        let roots = Arc::new(Roots::default());
        roots.given(1, named("a"));
        let giver = roots.clone();
        let answered = roots.refetch(
            async move {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    giver.given(1, named("b"));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    giver.answer_delivered();
                });
                true
            },
            Duration::from_secs(600),
        );
        let fetched = tokio::time::timeout(Duration::from_secs(60), answered)
            .await
            .expect("the wait ends with the answer, not the limit");
        assert!(fetched);
        assert!(!roots.stale_for(1, &named("b")));
        assert_eq!(lock(&roots.held).refetches, Some(true));

        // A server that does not fetch again: waited for once, then not.
        let quiet = Roots::default();
        quiet.given(1, named("a"));
        assert!(
            !quiet
                .refetch(async { true }, Duration::from_millis(10))
                .await
        );
        assert_eq!(lock(&quiet.held).refetches, Some(false));
        tokio::time::timeout(
            Duration::from_secs(60),
            quiet.refetch(async { true }, Duration::from_secs(600)),
        )
        .await
        .expect("a server that did not fetch again is not waited for again");
        // A notification that could not be sent is not waited for.
        let fetched = tokio::time::timeout(
            Duration::from_secs(60),
            roots.refetch(async { false }, Duration::from_secs(600)),
        )
        .await
        .expect("nothing to wait for");
        assert!(!fetched);
    }
}
