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

// Roots are deprecated by SEP-2577; 2025-era servers still use them.
#![allow(deprecated)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use quiver_contract::CallContext;
use tokio::sync::Notify;

use crate::sync::lock;

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
    /// A call's client: its working-set key when that names one client (an MCP session, a
    /// conversation); a key every client of a token shares (`token:NAME`, a 2026-07-28
    /// request without a conversation) or `anonymous` names none.
    pub(crate) fn of(ctx: &CallContext) -> Who {
        match &ctx.session {
            Some(key) if quiver_surface::SessionKey::parse(key).names_one_client() => {
                Who::Named(key.clone())
            }
            _ => Who::Unnamed,
        }
    }

    /// Whose roots a server holds after it was answered `answer`: this client's when the
    /// answer lists any; nobody's when it lists none (nothing private to keep from others).
    pub(crate) fn holding(self, answer: &serde_json::Value) -> Option<Who> {
        answer
            .get("roots")
            .and_then(serde_json::Value::as_array)
            .is_some_and(|r| !r.is_empty())
            .then_some(self)
    }
}

/// A per-session server's tie to its session: it is given that session's roots, and only
/// those, whoever's call is in flight (only that session's calls reach it).
pub(crate) struct SessionLink {
    /// The session, as its roots' holder.
    pub(crate) who: Who,
    /// The channel of the session's latest request, which answers the server's
    /// `roots/list` (a request still open carries the question on its own stream; one
    /// that ended, on the session's).
    client: Mutex<Option<Arc<dyn quiver_contract::ClientChannel>>>,
}

impl SessionLink {
    /// The link of the session `id`.
    pub(crate) fn new(id: &str) -> Self {
        SessionLink {
            who: Who::Named(id.into()),
            client: Mutex::new(None),
        }
    }

    /// The session's latest request came with `client`.
    pub(crate) fn latest(&self, client: Option<Arc<dyn quiver_contract::ClientChannel>>) {
        if client.is_some() {
            *lock(&self.client) = client;
        }
    }

    /// The channel that answers the server's `roots/list`.
    pub(crate) fn client(&self) -> Option<Arc<dyn quiver_contract::ClientChannel>> {
        lock(&self.client).clone()
    }
}

/// The answer to a `roots/list` that cannot be answered with the roots of the client whose
/// call caused it (none in flight, several, a client that failed or did not answer in
/// time): none. Never an error, which would leave the server holding the roots of the
/// client before.
pub(crate) fn no_roots() -> serde_json::Value {
    serde_json::json!({"roots": []})
}

/// The roots of a call's client: none for a client that declared no roots (or a call with no
/// client), not a refusal (see [`no_roots`]).
pub(crate) async fn roots_of(
    channel: Option<&std::sync::Arc<dyn quiver_contract::ClientChannel>>,
) -> Result<serde_json::Value, quiver_contract::ChannelError> {
    match channel {
        Some(c) if c.features().roots => c.list_roots().await,
        _ => Ok(no_roots()),
    }
}

#[derive(Default)]
struct Held {
    /// The connection generation and what it was last answered: the roots of this client
    /// (`Some`), or none (`None`); nothing while it has not asked.
    holder: Option<(u64, Option<Who>)>,
    /// How many answers to `roots/list` the server was given.
    given: u64,
    /// How many `roots/list` requests the server sent.
    asked: u64,
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

impl Roots {
    /// The server sent a `roots/list`.
    pub(crate) fn asked(&self) {
        lock(&self.held).asked += 1;
    }

    /// The connection of `generation` was answered its `roots/list`: it holds the roots of
    /// `holder` (see [`Who::holding`]), or none.
    pub(crate) fn given(&self, generation: u64, holder: Option<Who>) {
        let mut held = lock(&self.held);
        held.holder = Some((generation, holder));
        held.given += 1;
        drop(held);
        self.given.notify_waiters();
    }

    /// What the connection of `generation` is answered for its `roots/list`, from what the
    /// client `who` of the call gave (`None`: nothing, or an error): that when it reads as a
    /// roots list, else none. Recorded as [`Roots::given`]. Rmcp's path and the direct one
    /// both answer through this.
    pub(crate) fn answer(
        &self,
        generation: u64,
        answer: Option<serde_json::Value>,
        who: Who,
    ) -> serde_json::Value {
        let answer = answer
            .filter(|v| serde_json::from_value::<rmcp::model::ListRootsResult>(v.clone()).is_ok());
        let holder = answer.as_ref().and_then(|v| who.holding(v));
        self.given(generation, holder);
        answer.unwrap_or_else(no_roots)
    }

    /// `who` said its roots changed: a server holding its roots holds stale ones, to be
    /// fetched again before the next call, whoever makes it.
    pub(crate) fn forget(&self, who: &Who) {
        let mut held = lock(&self.held);
        if let Some((_, holder @ Some(_))) = &mut held.holder
            && holder.as_ref() == Some(who)
        {
            *holder = Some(Who::Unnamed);
        }
    }

    /// The transport finished sending an answer to one of the server's requests.
    pub(crate) fn answer_delivered(&self) {
        lock(&self.held).delivered += 1;
        self.given.notify_waiters();
    }

    /// Whether the connection of `generation` holds roots other than those of `who`, a
    /// client that declared roots (`has_roots`) or not: another client's (or a client's that
    /// cannot be told apart from it), or none where `who` has some. Never for a server that
    /// has not asked.
    pub(crate) fn stale_for(&self, generation: u64, who: &Who, has_roots: bool) -> bool {
        match &lock(&self.held).holder {
            Some((g, Some(held))) if *g == generation => *held != *who || *who == Who::Unnamed,
            Some((g, None)) if *g == generation => has_roots,
            _ => false,
        }
    }

    /// Tells the server the roots changed (`notify`, which sends the notification) and waits
    /// for it to fetch them again. All of it, the sending too, within `limit`. A server that
    /// did not even ask for them again the first time is not waited for after that.
    pub(crate) async fn refetch<F>(&self, notify: F, limit: Duration) -> Refetch
    where
        F: std::future::Future<Output = bool>,
    {
        let (before, asked, wait) = {
            let held = lock(&self.held);
            (
                Mark(held.given, held.delivered),
                held.asked,
                held.refetches != Some(false),
            )
        };
        let fetched = tokio::time::timeout(limit, async {
            if !notify.await || !wait {
                return false;
            }
            self.answered_since(before).await;
            true
        })
        .await;
        let mut held = lock(&self.held);
        match fetched {
            Ok(true) => {
                held.refetches = Some(true);
                Refetch::Fetched
            }
            Ok(false) => Refetch::NotFetched,
            // It asked and its client was slow: its answer is still to come.
            Err(_) if held.asked != asked => Refetch::Asked(before),
            // It never asked: a server that does not fetch again.
            Err(_) => {
                if held.refetches.is_none() {
                    held.refetches = Some(false);
                }
                Refetch::NotFetched
            }
        }
    }

    /// Waits at most `limit` for the answer to a `roots/list` asked after `mark` to be given
    /// and delivered (after [`Refetch::Asked`], once the call it was for stopped waiting, so
    /// that it is answered with none).
    pub(crate) async fn settle(&self, mark: Mark, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.answered_since(mark)).await;
    }

    /// Waits at most `limit` for the server's first `roots/list` to be answered and the
    /// answer delivered (a per-session server, before its session's first call).
    pub(crate) async fn first_given(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.answered_since(Mark(0, 0))).await;
    }

    /// Until a `roots/list` answer given after `before` was delivered.
    async fn answered_since(&self, before: Mark) {
        let changed = self.given.notified();
        tokio::pin!(changed);
        loop {
            changed.as_mut().enable();
            let done = {
                let held = lock(&self.held);
                held.given > before.0 && held.delivered > before.1
            };
            if done {
                return;
            }
            changed.as_mut().await;
            changed.set(self.given.notified());
        }
    }
}

/// The answer counters at one moment (given, delivered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark(u64, u64);

/// How a [`Roots::refetch`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refetch {
    /// The server fetched the roots again, and its answer was delivered.
    Fetched,
    /// It was not told, not waited for, or did not ask.
    NotFetched,
    /// It asked, and the answer had not been given when the wait ended.
    Asked(Mark),
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
        assert!(
            !roots.stale_for(1, &named("a"), true),
            "a server that has not asked"
        );
        roots.given(1, Some(named("a")));
        assert!(!roots.stale_for(1, &named("a"), true));
        assert!(roots.stale_for(1, &named("b"), true));
        assert!(
            roots.stale_for(1, &named("b"), false),
            "A's, for B without roots"
        );
        assert!(roots.stale_for(1, &Who::Unnamed, true));
        assert!(
            !roots.stale_for(2, &named("b"), true),
            "a new connection holds nobody's"
        );
        roots.given(1, Some(Who::Unnamed));
        assert!(
            roots.stale_for(1, &Who::Unnamed, true),
            "two unnamed clients are not one"
        );
        roots.given(1, Some(named("a")));
        roots.forget(&named("b"));
        assert!(
            !roots.stale_for(1, &named("a"), true),
            "B's change is not A's"
        );
        roots.forget(&named("a"));
        assert!(roots.stale_for(1, &named("a"), true), "A's roots changed");
        roots.given(1, None);
        assert!(
            !roots.stale_for(1, &named("b"), false),
            "none held, none to give"
        );
        assert!(
            roots.stale_for(1, &named("b"), true),
            "none held, but B has roots to give"
        );
    }

    #[test]
    fn a_server_holds_roots_only_when_it_was_given_some() {
        let some = serde_json::json!({"roots": [{"uri": "file:///a"}]});
        assert_eq!(named("a").holding(&some), Some(named("a")));
        assert_eq!(named("a").holding(&no_roots()), None);
        let tokens = CallContext::for_session("token:ci");
        assert_eq!(
            Who::of(&tokens),
            Who::Unnamed,
            "a token's clients share its key"
        );
        assert_eq!(
            Who::of(&CallContext::for_session("anonymous")),
            Who::Unnamed
        );
        assert_eq!(
            Who::of(&CallContext::for_session("mcp:s1")),
            named("mcp:s1")
        );
    }

    #[tokio::test]
    async fn a_refetch_waits_for_the_next_answer_and_gives_up_on_a_server_that_never_asks() {
        let roots = Arc::new(Roots::default());
        roots.given(1, Some(named("a")));
        let giver = roots.clone();
        let answered = roots.refetch(
            async move {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    giver.asked();
                    giver.given(1, Some(named("b")));
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
        assert_eq!(fetched, Refetch::Fetched);
        assert!(!roots.stale_for(1, &named("b"), true));
        assert_eq!(lock(&roots.held).refetches, Some(true));

        // A server that asked, but whose client was slow: still waited for next time.
        let slow = Roots::default();
        slow.given(1, Some(named("a")));
        let asked = async {
            slow.asked();
            true
        };
        let mark = match slow.refetch(asked, Duration::from_millis(10)).await {
            Refetch::Asked(mark) => mark,
            other => panic!("{other:?}"),
        };
        assert_eq!(lock(&slow.held).refetches, None);
        // Its answer, when it comes, settles it.
        slow.given(1, None);
        slow.answer_delivered();
        tokio::time::timeout(
            Duration::from_secs(60),
            slow.settle(mark, Duration::from_secs(600)),
        )
        .await
        .expect("settled by the late answer");
        assert!(!slow.stale_for(1, &named("b"), false));

        // A server that never asks again: waited for once, then not.
        let quiet = Roots::default();
        quiet.given(1, Some(named("a")));
        assert_eq!(
            quiet
                .refetch(async { true }, Duration::from_millis(10))
                .await,
            Refetch::NotFetched
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
        assert_eq!(fetched, Refetch::NotFetched);
        // The sending itself is bounded by the limit.
        let stuck = Roots::default();
        let sent = tokio::time::timeout(
            Duration::from_secs(60),
            stuck.refetch(std::future::pending(), Duration::from_millis(10)),
        )
        .await
        .expect("a notification that never goes out does not hold the call");
        assert_eq!(sent, Refetch::NotFetched);
    }
}
