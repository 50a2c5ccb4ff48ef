//! Which downstream call an upstream server's own request or notification belongs to (a
//! call: a `tools/call`, or a `prompts/get` or `resources/read` passed through).
//!
//! An upstream connection is shared by every session of the process, so a server-initiated
//! request (`sampling/createMessage`, `elicitation/create`, `roots/list`) or a log message
//! must reach the client whose call caused it, and nobody else. What the transport tells us:
//!
//! - streamable HTTP: a request that arrived on a POST's SSE stream names that POST's request
//!   (rmcp's `InboundStreamOrigin::OutboundRequest`, SEP-2260): exact.
//! - stdio, and the standalone GET stream: nothing.
//! - progress notifications carry the progress token of our `tools/call`: exact.
//!
//! The rule: an exact association wins; without one, the request goes to the single call in
//! flight on this connection, and is refused when there is none or more than one. A request
//! is never guessed onto one of several calls.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};

use quiver_contract::{CallContext, ClientChannel};
use rmcp::{
    model::{ProgressToken, RequestId},
    service::InboundStreamOrigin,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::roots::Who;
use crate::sync::lock;

/// Where an inbound message says it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The response stream of our request with this id.
    Call(RequestId),
    /// A stream tied to no request of ours (the standalone GET stream).
    Standalone,
    /// The transport cannot tell (stdio; all notifications).
    Unknown,
}

impl Origin {
    pub(crate) fn of(extensions: &rmcp::model::Extensions) -> Origin {
        match extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => Origin::Call(id.clone()),
            Some(InboundStreamOrigin::Unassociated) => Origin::Standalone,
            None => Origin::Unknown,
        }
    }
}

/// One `tools/call` in flight upstream.
pub(crate) struct Entry {
    seq: u64,
    /// The upstream tool name.
    pub(crate) tool: String,
    /// Our JSON-RPC id and progress token, once the request is handed to rmcp.
    sent: Mutex<Option<(RequestId, ProgressToken)>>,
    /// Whether a request goes out for it (its token is still to come while `sent` is
    /// empty); not for the roots' refetch, which sends none.
    sends: bool,
    /// The way back to the downstream client, if the call has one.
    pub(crate) channel: Option<Arc<dyn ClientChannel>>,
    /// Who that client is (whose roots the server gets).
    pub(crate) who: Who,
    /// Cancelled when the call ends or its caller gives up.
    pub(crate) done: CancellationToken,
}

impl Entry {
    fn id(&self) -> Option<RequestId> {
        lock(&self.sent).as_ref().map(|(id, _)| id.clone())
    }

    fn token(&self) -> Option<ProgressToken> {
        lock(&self.sent).as_ref().map(|(_, t)| t.clone())
    }
}

/// Where a message goes.
#[derive(Clone)]
pub(crate) enum Route {
    To(Arc<Entry>),
    /// No call in flight.
    Idle,
    /// This many calls in flight and nothing says which.
    Ambiguous(usize),
    /// Names a request of ours that is not (or no longer) a call in flight.
    Unrelated(RequestId),
    /// Names a request not yet registered while some call is still being sent.
    Pending,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::To(e) => write!(f, "To({})", e.seq),
            Route::Idle => write!(f, "Idle"),
            Route::Ambiguous(n) => write!(f, "Ambiguous({n})"),
            Route::Unrelated(id) => write!(f, "Unrelated({id})"),
            Route::Pending => write!(f, "Pending"),
        }
    }
}

impl Route {
    /// Why a request cannot be relayed, for the upstream server's error (and its model).
    pub(crate) fn refusal(&self, method: &str) -> String {
        match self {
            Route::To(_) => String::new(),
            Route::Idle => format!(
                "Quiver relays {method} to its client only during a request it forwards (tools/call, prompts/get, resources/read); none to this server is in flight"
            ),
            Route::Ambiguous(n) => format!(
                "Quiver cannot tell which of its {n} requests in flight to this server (tools/call, prompts/get, resources/read) caused {method}, so it refuses it: other calls to this server are running (one may be waiting for its user's answer); try again once they are done. A server avoids this by sending {method} on the request's own response stream"
            ),
            Route::Unrelated(id) => format!(
                "{method} arrived on the stream of request {id}, which is not a request Quiver has in flight for a client"
            ),
            Route::Pending => format!(
                "{method} names a request Quiver has not registered as in flight for a client"
            ),
        }
    }
}

/// The routing rule over the calls in flight (oldest first).
pub(crate) fn pick(calls: &[Arc<Entry>], origin: &Origin) -> Route {
    match origin {
        Origin::Call(id) => {
            if let Some(e) = calls.iter().find(|e| e.id().as_ref() == Some(id)) {
                Route::To(e.clone())
            } else if calls.iter().any(|e| e.id().is_none()) {
                Route::Pending
            } else {
                Route::Unrelated(id.clone())
            }
        }
        Origin::Standalone | Origin::Unknown => match calls {
            [] => Route::Idle,
            [one] => Route::To(one.clone()),
            many => Route::Ambiguous(many.len()),
        },
    }
}

/// The calls in flight on one upstream connection.
#[derive(Default)]
pub(crate) struct Calls {
    entries: Mutex<Vec<Arc<Entry>>>,
    next: AtomicU64,
    /// How many calls have ended (for the liveness check: a server that finished a call
    /// was busy, not hung).
    ended: AtomicU64,
    sent: Notify,
    /// The principals (and tenants; sessions, for anonymous calls) that have called through
    /// this connection: a message naming no request is guessed onto the call in flight only
    /// while they are one.
    callers: Mutex<std::collections::BTreeSet<Caller>>,
}

/// Who made a call: its principal and tenant; a caller with no principal (no token) by
/// its session besides, since two anonymous clients are two callers.
type Caller = (Option<Arc<str>>, Option<Arc<str>>, Option<Arc<str>>);

/// Removes its entry when the call ends.
pub(crate) struct Registration<'a> {
    calls: &'a Calls,
    entry: Arc<Entry>,
}

impl Registration<'_> {
    /// Records the request's id and progress token once rmcp has taken it.
    pub(crate) fn sent(&self, id: RequestId, token: ProgressToken) {
        *lock(&self.entry.sent) = Some((id, token));
        self.calls.sent.notify_waiters();
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.entry.done.cancel();
        lock(&self.calls.entries).retain(|e| e.seq != self.entry.seq);
        self.calls.ended.fetch_add(1, Ordering::Relaxed);
        // Who waits for a call being sent need not wait for this one any more.
        self.calls.sent.notify_waiters();
    }
}

impl Calls {
    /// Registers a call about to be sent.
    pub(crate) fn begin(&self, tool: &str, ctx: &CallContext) -> Registration<'_> {
        self.register(tool, ctx, true)
    }

    /// Registers a call for which no request goes out (the roots' refetch before one): what
    /// the server asks meanwhile reaches its client, and no progress waits for its token.
    pub(crate) fn begin_unsent(&self, tool: &str, ctx: &CallContext) -> Registration<'_> {
        self.register(tool, ctx, false)
    }

    fn register(&self, tool: &str, ctx: &CallContext, sends: bool) -> Registration<'_> {
        let entry = Arc::new(Entry {
            seq: self.next.fetch_add(1, Ordering::Relaxed),
            tool: tool.to_owned(),
            sent: Mutex::new(None),
            sends,
            channel: ctx.client.clone(),
            who: Who::of(ctx),
            done: ctx.cancel.child_token(),
        });
        lock(&self.entries).push(entry.clone());
        let caller = match &ctx.principal {
            Some(principal) => (Some(principal.clone()), ctx.tenant.clone(), None),
            None => (None, ctx.tenant.clone(), ctx.session.clone()),
        };
        let mut callers = lock(&self.callers);
        if !callers.contains(&caller) {
            callers.insert(caller);
        }
        drop(callers);
        Registration { calls: self, entry }
    }

    /// Whether every call through this connection so far came from one principal (and
    /// tenant): then a message that names no request cannot be another's.
    pub(crate) fn one_caller(&self) -> bool {
        lock(&self.callers).len() <= 1
    }

    /// How many calls are in flight, and how many have ended so far: the connection was
    /// busy over a span when calls were in flight at its end or the ended count moved.
    pub(crate) fn activity(&self) -> (usize, u64) {
        let in_flight = lock(&self.entries).len();
        (in_flight, self.ended.load(Ordering::Relaxed))
    }

    fn snapshot(&self) -> Vec<Arc<Entry>> {
        lock(&self.entries).clone()
    }

    /// Routes a message; a request naming a call still being sent waits (at most a second)
    /// for it to be registered.
    pub(crate) async fn route(&self, origin: &Origin) -> Route {
        let notified = self.sent.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match pick(&self.snapshot(), origin) {
            Route::Pending => {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), notified).await;
                match pick(&self.snapshot(), origin) {
                    Route::Pending => match origin {
                        Origin::Call(id) => Route::Unrelated(id.clone()),
                        _ => Route::Pending,
                    },
                    r => r,
                }
            }
            r => r,
        }
    }

    /// The call a progress token belongs to; none when more than one call carries it (never
    /// guessed onto one of them). A token no call carries waits (at most a second) while
    /// some call is still being sent: a fast server's progress can be read before rmcp's
    /// send returns the token (it was dropped).
    pub(crate) async fn by_progress(&self, token: &ProgressToken) -> Option<Arc<Entry>> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            let notified = self.sent.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let calls = self.snapshot();
            let mut found = calls.iter().filter(|e| e.token().as_ref() == Some(token));
            match (found.next(), found.next()) {
                (Some(one), None) => return Some(one.clone()),
                (Some(_), Some(_)) => return None,
                (None, _) => {}
            }
            if !calls.iter().any(|e| e.sends && e.token().is_none())
                || tokio::time::timeout_at(deadline, notified).await.is_err()
            {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(calls: &Calls, n: i64) -> Registration<'_> {
        let r = calls.begin(&format!("tool{n}"), &CallContext::default());
        r.sent(
            RequestId::Number(n),
            ProgressToken(rmcp::model::NumberOrString::Number(100 + n)),
        );
        r
    }

    fn target(route: Route) -> Option<String> {
        match route {
            Route::To(e) => Some(e.tool.clone()),
            _ => None,
        }
    }

    #[test]
    fn an_exact_association_wins_over_the_count() {
        let calls = Calls::default();
        let _a = entry(&calls, 1);
        let _b = entry(&calls, 2);
        let all = calls.snapshot();
        assert_eq!(
            target(pick(&all, &Origin::Call(RequestId::Number(2)))).as_deref(),
            Some("tool2")
        );
        assert!(matches!(
            pick(&all, &Origin::Call(RequestId::Number(9))),
            Route::Unrelated(_)
        ));
    }

    #[test]
    fn without_association_only_a_single_call_is_a_target() {
        let calls = Calls::default();
        assert!(matches!(
            pick(&calls.snapshot(), &Origin::Unknown),
            Route::Idle
        ));
        let a = entry(&calls, 1);
        for origin in [Origin::Unknown, Origin::Standalone] {
            assert_eq!(
                target(pick(&calls.snapshot(), &origin)).as_deref(),
                Some("tool1")
            );
        }
        let b = entry(&calls, 2);
        let ambiguous = pick(&calls.snapshot(), &Origin::Unknown);
        assert!(matches!(ambiguous, Route::Ambiguous(2)));
        // The refusal reaches the model through the server's answer: it says what helps.
        assert!(
            ambiguous
                .refusal("elicitation/create")
                .contains("other calls to this server are running (one may be waiting for its user's answer); try again once they are done"),
            "{}",
            ambiguous.refusal("elicitation/create")
        );
        drop(a);
        assert_eq!(
            target(pick(&calls.snapshot(), &Origin::Standalone)).as_deref(),
            Some("tool2")
        );
        drop(b);
        assert!(matches!(
            pick(&calls.snapshot(), &Origin::Unknown),
            Route::Idle
        ));
    }

    #[test]
    fn a_call_not_yet_sent_counts_as_in_flight() {
        let calls = Calls::default();
        let _a = entry(&calls, 1);
        let _unsent = calls.begin("unsent", &CallContext::default());
        assert!(matches!(
            pick(&calls.snapshot(), &Origin::Unknown),
            Route::Ambiguous(2)
        ));
        assert!(matches!(
            pick(&calls.snapshot(), &Origin::Call(RequestId::Number(7))),
            Route::Pending
        ));
    }

    #[tokio::test]
    async fn progress_goes_by_token_and_an_ended_call_is_done() {
        let calls = Calls::default();
        let a = entry(&calls, 1);
        let _b = entry(&calls, 2);
        let token = |n| ProgressToken(rmcp::model::NumberOrString::Number(n));
        let found = calls.by_progress(&token(102)).await.expect("routed");
        assert_eq!(found.tool, "tool2");
        let first = calls.by_progress(&token(101)).await.expect("routed");
        drop(a);
        assert!(first.done.is_cancelled());
        assert!(calls.by_progress(&token(101)).await.is_none());
        // Two calls with one token (connections that each count from 0): neither gets it.
        let _c = entry(&calls, 2);
        assert!(calls.by_progress(&token(102)).await.is_none());
    }

    /// Progress read before rmcp's send returned its token waits for the call's
    /// registration (it found no call and was dropped); a token of no call and no call being
    /// sent is answered at once.
    #[tokio::test(start_paused = true)]
    async fn progress_for_a_call_being_sent_waits_for_it() {
        let calls = Arc::new(Calls::default());
        let token = ProgressToken(rmcp::model::NumberOrString::Number(9));
        let started = tokio::time::Instant::now();
        assert!(calls.by_progress(&token).await.is_none());
        // (The clock is paused: it moved only if the lookup waited.)
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);
        let reg = calls.begin("fast", &CallContext::default());
        let router = calls.clone();
        let wanted = token.clone();
        let routed =
            tokio::spawn(async move { router.by_progress(&wanted).await.map(|e| e.tool.clone()) });
        tokio::task::yield_now().await;
        reg.sent(RequestId::Number(3), token);
        assert_eq!(routed.await.unwrap().as_deref(), Some("fast"));
        drop(reg);
        // A registration that sends no request (the roots' refetch) has no token to wait for.
        let stray = ProgressToken(rmcp::model::NumberOrString::Number(77));
        let refetch = calls.begin_unsent("refetch", &CallContext::default());
        let started = tokio::time::Instant::now();
        assert!(calls.by_progress(&stray).await.is_none());
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);
        drop(refetch);
        // A call that ends unsent releases the wait at once (it waited out the second).
        let unsent = calls.begin("gone", &CallContext::default());
        let router = calls.clone();
        let waiting = tokio::spawn(async move { router.by_progress(&stray).await.is_none() });
        tokio::task::yield_now().await;
        drop(unsent);
        assert!(waiting.await.unwrap());
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);
    }

    #[tokio::test]
    async fn a_request_naming_a_call_being_sent_waits_for_it() {
        let calls = Arc::new(Calls::default());
        let reg = calls.begin("slow", &CallContext::default());
        let router = calls.clone();
        let routed =
            tokio::spawn(
                async move { target(router.route(&Origin::Call(RequestId::Number(5))).await) },
            );
        // The router is parked on the notification; registering the id releases it.
        tokio::task::yield_now().await;
        reg.sent(
            RequestId::Number(5),
            ProgressToken(rmcp::model::NumberOrString::Number(1)),
        );
        assert_eq!(routed.await.unwrap().as_deref(), Some("slow"));
    }
}
