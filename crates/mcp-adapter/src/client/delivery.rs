//! Knowing whether a request left Quiver. rmcp reports a connection that died with a
//! request pending the same way whether or not the request was ever written, so the stdio
//! transport is wrapped to record each request id whose write completed. A request that was
//! never written is safe to send again; one that was written may have run and is never
//! replayed. An id is kept only while its request is open: its answer (a result or an error)
//! or our `notifications/cancelled` for it ends it, whichever request it was (a ping, a list,
//! a call), so a long-lived connection holds no ids of requests long done.

use std::{
    borrow::Cow,
    collections::HashSet,
    sync::{Arc, Mutex},
};

use super::roots::Roots;
use crate::sync::lock;
use rmcp::{
    RoleClient,
    model::{ClientNotification, JsonRpcMessage, RequestId, ServerNotification},
    service::{RxJsonRpcMessage, TxJsonRpcMessage},
    transport::Transport,
};

/// The ids of open requests whose write completed.
#[derive(Clone, Default)]
pub(crate) struct Written(Arc<Mutex<Ids>>);

#[derive(Default)]
struct Ids {
    /// Being written (an answer may overtake the completion of its write).
    sending: HashSet<RequestId>,
    /// Written and not yet ended.
    written: HashSet<RequestId>,
    /// The last [`RECENT`] ids that ended, so that a late answer to a cancelled request or
    /// a second answer is not taken for one to a request never sent.
    recent: std::collections::VecDeque<RequestId>,
    /// The last answer whose id no request of this connection had, and when it came.
    stray: Option<(RequestId, std::time::Instant)>,
    /// The server's name, for the one warning a connection logs about such answers.
    server: String,
}

/// How many ended request ids are remembered.
const RECENT: usize = 64;

impl Ids {
    fn remember(&mut self, id: &RequestId) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(id.clone());
    }
}

impl Written {
    /// The ids of a connection to the server `server`.
    pub(crate) fn for_server(server: &str) -> Self {
        Written(Arc::new(Mutex::new(Ids {
            server: server.to_owned(),
            ..Ids::default()
        })))
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, Ids> {
        lock(&self.0)
    }

    /// An answer to `id` came: the request ended. An answer to no request this connection
    /// sent (a server answering with the wrong ids leaves its calls waiting out their
    /// limit) is noted for the calls' timeout texts, and logged once per connection.
    fn answered(&self, id: &RequestId) {
        let mut ids = self.ids();
        // rmcp takes an answer whose id is a string naming a number (`"5"`) for the answer
        // to that number's request: so does this.
        let named = match id {
            RequestId::String(s) => s.parse::<i64>().ok().map(RequestId::Number),
            RequestId::Number(_) => None,
        };
        let mut close = |id: &RequestId| {
            let open = ids.sending.remove(id) | ids.written.remove(id);
            if open {
                ids.remember(id);
            }
            open
        };
        let open = close(id) || named.as_ref().is_some_and(&mut close);
        let recent = |id: &RequestId| ids.recent.contains(id);
        if !open && !recent(id) && !named.as_ref().is_some_and(recent) {
            if ids.stray.is_none() {
                tracing::warn!(server = %ids.server, id = %id, "the MCP server answered a request id that Quiver did not send; calls waiting for their answers will time out");
            }
            ids.stray = Some((id.clone(), std::time::Instant::now()));
        }
    }

    /// The id of an answer to no request sent, if one came at or after `since`.
    pub(crate) fn stray_since(&self, since: std::time::Instant) -> Option<RequestId> {
        self.ids()
            .stray
            .as_ref()
            .filter(|(_, at)| *at >= since)
            .map(|(id, _)| id.clone())
    }

    /// A request's write began (its line has the pipe).
    pub(crate) fn sending(&self, id: RequestId) {
        self.ids().sending.insert(id);
    }

    /// The write finished; recorded if it succeeded and the request has not ended meanwhile.
    fn sent(&self, id: &RequestId, ok: bool) {
        let mut ids = self.ids();
        if ids.sending.remove(id) && ok {
            ids.written.insert(id.clone());
        }
    }

    /// The request ended (cancelled by us): forgotten.
    fn ended(&self, id: &RequestId) {
        let mut ids = self.ids();
        ids.sending.remove(id);
        ids.written.remove(id);
        ids.remember(id);
    }

    /// Whether the request may have reached the server, forgetting it: its write completed,
    /// or began and had not failed when this was asked (the server may have read it and
    /// died running it before the write's completion was seen: such a call was sent again,
    /// and ran twice). Only a request never handed to the pipe, or whose write failed, is
    /// surely unsent.
    pub(crate) fn take(&self, id: &RequestId) -> bool {
        let mut ids = self.ids();
        let sending = ids.sending.remove(id);
        ids.written.remove(id) || sending
    }

    /// How many ids are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        let ids = self.ids();
        ids.sending.len() + ids.written.len()
    }
}

/// The server's progress and log notifications on their way to the handler. rmcp hands each
/// notification to a task of its own, so a call's answer, read after them, could reach the
/// caller first (a notification handled after its call ended had no call to reach: the last
/// progress value was dropped), and a burst of them reached the caller out of order
/// (progress going backwards). Each one read holds a [`Delivering`] ticket in its extensions
/// until the handler is done with it (or rmcp drops it); the handler waits for its turn
/// ([`Delivering::turn`]: the tickets before it done), and a call waits for the open ones
/// before it ends ([`Deliveries::settled`]).
#[derive(Clone, Default)]
pub(crate) struct Deliveries(Arc<Pending>);

#[derive(Default)]
struct Pending {
    state: Mutex<Turns>,
    /// Told each time `next` moves ([`Deliveries::settled`] waits on it).
    advanced: tokio::sync::Notify,
}

#[derive(Default)]
struct Turns {
    /// The next ticket's number.
    issued: u64,
    /// Every ticket below this one is done.
    next: u64,
    /// Done tickets above `next` (done out of turn, when a wait gave up).
    done: std::collections::BTreeSet<u64>,
    /// The ticket waiting for its turn, by number: only the one whose turn comes is woken
    /// (waking every waiter at each step cost a burst of N notifications N²/2 wake-ups).
    waiting: std::collections::HashMap<u64, Arc<tokio::sync::Notify>>,
}

/// How long a notification waits for the ones read before it, and then how long its
/// handler holds the ones after it: a handler stuck on a slow client holds the others no
/// longer (its delivery goes on, out of turn).
pub(crate) const TURN_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
/// The longest a notification waits for its turn while the ones before it move on.
const TURN_MOST: std::time::Duration = std::time::Duration::from_secs(10);

/// One notification not handled yet; its copies share it, and it is done when the last
/// one is dropped.
#[derive(Clone)]
pub(crate) struct Delivering(Arc<Ticket>);

struct Ticket {
    seq: u64,
    deliveries: Deliveries,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let pending = &self.deliveries.0;
        let wake = {
            let mut turns = lock(&pending.state);
            turns.done.insert(self.seq);
            while turns.done.first() == Some(&turns.next) {
                turns.done.pop_first();
                turns.next += 1;
            }
            let next = turns.next;
            turns.waiting.remove(&next)
        };
        // A ticket waiting for its turn is not done, so `next` stops at the first of them.
        if let Some(waiter) = wake {
            waiter.notify_one();
        }
        pending.advanced.notify_waiters();
    }
}

impl Delivering {
    /// Waits until the notifications read before this one are handled, so that the caller
    /// gets them in the server's order. It gives up (and this one goes out of turn) only
    /// when none of those before it was handled for [`TURN_WAIT`], or after [`TURN_MOST`] in
    /// all: a long queue that moves on is waited for (a bound on the whole wait of
    /// [`TURN_WAIT`] put the later ones of a flood to a slow client out of order).
    pub(crate) async fn turn(&self) {
        let pending = &self.0.deliveries.0;
        let seq = self.0.seq;
        let mut seen = None;
        let end = tokio::time::Instant::now() + TURN_MOST;
        let mut deadline = tokio::time::Instant::now() + TURN_WAIT;
        loop {
            let waiter = {
                let mut turns = lock(&pending.state);
                if turns.next >= seq {
                    return;
                }
                if seen.is_some_and(|s| turns.next > s) {
                    deadline = (tokio::time::Instant::now() + TURN_WAIT).min(end);
                }
                seen = Some(turns.next);
                turns.waiting.entry(seq).or_default().clone()
            };
            // `notify_one` keeps a wake-up given before this waits.
            if tokio::time::timeout_at(deadline, waiter.notified())
                .await
                .is_err()
            {
                let mut turns = lock(&pending.state);
                if seen.is_some_and(|s| turns.next > s) && tokio::time::Instant::now() < end {
                    // The queue moved on meanwhile: wait on.
                    continue;
                }
                turns.waiting.remove(&seq);
                return;
            }
        }
    }
}

/// Runs `work` (a notification's handling) in the turn of its ticket, if it has one: after
/// the notifications read before it, and holding the ones after it no longer than
/// [`TURN_WAIT`] (a delivery to a client that does not read goes on in its own task).
pub(crate) async fn in_turn(
    ticket: Option<Delivering>,
    work: impl Future<Output = ()> + Send + 'static,
) {
    let Some(ticket) = ticket else {
        work.await;
        return;
    };
    ticket.turn().await;
    // Polled here; only a delivery still under way at the bound moves to a task of its own.
    let mut work = Box::pin(work);
    if tokio::time::timeout(TURN_WAIT, &mut work).await.is_err() {
        tokio::spawn(work);
    }
    drop(ticket);
}

impl Deliveries {
    fn start(&self) -> Delivering {
        let seq = {
            let mut turns = lock(&self.0.state);
            turns.issued += 1;
            turns.issued - 1
        };
        Delivering(Arc::new(Ticket {
            seq,
            deliveries: self.clone(),
        }))
    }

    /// Waits until every notification read so far is handled. It gives up when none of
    /// them has been handled for `stall` (a handler waiting on a client that does not read),
    /// or after `most` in all; then it returns how many of them were still open, which
    /// reach the caller after the answer or not at all. A flood that is being handed on
    /// steadily is waited for: a bound on the whole wait alone would drop the tail of a long
    /// flood of log messages, and tell nobody.
    pub(crate) async fn settled(
        &self,
        stall: std::time::Duration,
        most: std::time::Duration,
    ) -> Option<u64> {
        let pending = &self.0;
        // The tickets issued so far; those issued later are not this wait's.
        let target = {
            let turns = lock(&pending.state);
            // None read, or all handled: the usual case, one look.
            if turns.next >= turns.issued {
                return None;
            }
            turns.issued
        };
        let open = || {
            let turns = lock(&pending.state);
            let done_out_of_turn = turns.done.range(..target).count() as u64;
            target.saturating_sub(turns.next) - done_out_of_turn
        };
        let start = tokio::time::Instant::now();
        let end = start + most;
        let mut left = u64::MAX;
        let mut deadline = start;
        loop {
            let advanced = pending.advanced.notified();
            tokio::pin!(advanced);
            advanced.as_mut().enable();
            let now_open = open();
            if now_open == 0 {
                return None;
            }
            if now_open < left {
                // Handed on since the last look: the stall is counted from now.
                left = now_open;
                deadline = (tokio::time::Instant::now() + stall).min(end);
            }
            if tokio::time::timeout_at(deadline, advanced).await.is_err() && open() >= left {
                return Some(left);
            }
        }
    }

    /// How many are open.
    #[cfg(test)]
    fn open(&self) -> usize {
        let turns = lock(&self.0.state);
        (turns.issued - turns.next) as usize - turns.done.len()
    }
}

/// A transport that records completed request writes in [`Written`], counts the answers
/// to the server's requests it finished writing in `answers`, and marks the progress and log
/// notifications it reads as open in `deliveries`.
pub(crate) struct Tracked<T> {
    pub(crate) inner: T,
    pub(crate) written: Written,
    /// Whether `inner` marks a request's write as begun itself, once its line has the pipe
    /// (the stdio transport, [`PipeTransport::marking`](super::pipe::PipeTransport::marking)):
    /// a send still waiting behind another line's has sent nothing, and if the connection
    /// ends there it is safe to send again. Otherwise a request counts as begun when it is
    /// handed to `inner`.
    pub(crate) marks_itself: bool,
    pub(crate) answers: Arc<Roots>,
    pub(crate) deliveries: Deliveries,
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
            JsonRpcMessage::Notification(n) => {
                // Our cancellation ends the request: the server will not answer it.
                if let ClientNotification::CancelledNotification(c) = &n.notification
                    && let Some(cancelled) = &c.params.request_id
                {
                    self.written.ended(cancelled);
                }
                None
            }
            _ => None,
        };
        if let Some(id) = &id
            && !self.marks_itself
        {
            self.written.sending(id.clone());
        }
        let answer = matches!(item, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_));
        let (written, answers) = (self.written.clone(), self.answers.clone());
        let record = move |result: &Result<(), T::Error>| {
            if let Some(id) = &id {
                written.sent(id, result.is_ok());
            }
            if answer && result.is_ok() {
                answers.answer_delivered();
            }
        };
        // rmcp's service loop spawns a task for each send; polling the write once here, in
        // the loop's own task, puts an uncontended message on the pipe at once instead of
        // one task hand-over later (on a small machine a wake-up of the other worker).
        // Whatever does not finish now finishes in rmcp's task (a well-behaved future takes
        // the new waker on its next poll).
        // A write that finishes now is recorded now, not when rmcp's task gets to it.
        let mut sent = Box::pin(self.inner.send(item));
        let waker = futures::task::noop_waker();
        let first = match sent
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
        {
            std::task::Poll::Ready(result) => {
                record(&result);
                Some(result)
            }
            std::task::Poll::Pending => None,
        };
        async move {
            match first {
                Some(result) => result,
                None => {
                    let result = sent.await;
                    record(&result);
                    result
                }
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        let written = self.written.clone();
        let deliveries = self.deliveries.clone();
        let next = self.inner.receive();
        async move {
            let mut message = next.await;
            // An answer ends its request.
            match &mut message {
                Some(JsonRpcMessage::Response(r)) => written.answered(&r.id),
                Some(JsonRpcMessage::Error(e)) => {
                    if let Some(id) = &e.id {
                        written.answered(id);
                    }
                }
                Some(JsonRpcMessage::Notification(n))
                    if matches!(
                        n.notification,
                        ServerNotification::ProgressNotification(_)
                            | ServerNotification::LoggingMessageNotification(_)
                    ) =>
                {
                    rmcp::model::GetExtensions::extensions_mut(&mut n.notification)
                        .insert(deliveries.start());
                }
                _ => {}
            }
            message
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests;
