//! Keeping a server connected: the background dial loop with exponential backoff, the one
//! reconnect shared by every caller that saw a connection drop, marking a connection lost,
//! and the liveness ping.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use rmcp::model::ClientRequest;

use super::{Conn, DialError, State, Upstream};
use crate::client::{
    child,
    classify::{Class, classify_service},
    config::{Endpoint, Liveness},
};
use crate::sync::lock;

/// A connection lost sooner than this after it came up counts as a failed dial: the
/// reconnect waits and the backoff keeps growing. One that lived longer redials at once.
const STABLE_AFTER: Duration = Duration::from_secs(30);

impl Upstream {
    /// Starts the background connect loop (first attempt at once, then backoff), unless one
    /// is running.
    pub(crate) fn start_supervisor(self: &Arc<Self>) {
        if self.closed.is_cancelled() || self.supervising.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            me.supervise().await;
            me.supervising.store(false, Ordering::Release);
            // A drop that raced the end of the loop restarts it.
            if matches!(me.state.borrow().state, State::Reconnecting) {
                me.start_supervisor();
            }
        });
    }

    /// Dials until connected, rejected or closed. A connection lost soon after it came up
    /// left a backoff delay (see [`Upstream::lost`]): the first dial waits it, so a server
    /// that connects and dies is not respawned in a tight loop.
    async fn supervise(self: &Arc<Self>) {
        let seen = self.state.borrow().generation;
        let mut delay: Option<Duration> = *lock(&self.backoff);
        if delay.is_some_and(|d| d >= self.connect_timeout()) {
            // Calls would wait for this redial longer than they wait for any: fail them now.
            self.state.send_if_modified(|s| {
                let waiting = matches!(s.state, State::Reconnecting);
                if waiting {
                    s.state = State::Down;
                }
                waiting
            });
        }
        loop {
            if let Some(d) = delay {
                *lock(&self.next_attempt) = Some(std::time::SystemTime::now() + d);
                let closed = tokio::select! {
                    _ = tokio::time::sleep(d) => false,
                    _ = self.closed.cancelled() => true,
                };
                *lock(&self.next_attempt) = None;
                if closed {
                    return;
                }
            }
            match self.dial_shared(seen, delay.is_some()).await {
                Ok(_) | Err(DialError::Closed) => return,
                Err(DialError::Rejected(_)) => return,
                Err(DialError::Transient(_) | DialError::Hangup(_)) => {
                    let next = self.next_backoff(delay);
                    delay = Some(next);
                    *lock(&self.backoff) = Some(next);
                }
            }
        }
    }

    /// The backoff step after `delay` (the first step without one).
    fn next_backoff(&self, delay: Option<Duration>) -> Duration {
        match delay {
            None => self.opts.backoff_initial,
            Some(d) => (d * 2).min(self.opts.backoff_max),
        }
    }

    /// Dials once on behalf of everyone who saw generation `seen` fail: if someone already
    /// reconnected, their connection is returned; if a shared dial for `seen` already failed
    /// (and `force` is off), that failure is returned without dialling again.
    pub(super) async fn dial_shared(
        self: &Arc<Self>,
        seen: u64,
        force: bool,
    ) -> Result<Arc<Conn>, DialError> {
        let _guard = self.dial_lock.lock().await;
        {
            let snap = self.state.borrow();
            match &snap.state {
                State::Closed => return Err(DialError::Closed),
                State::Rejected(r) => return Err(DialError::Rejected(r.clone())),
                State::Up(c) if snap.generation > seen || c.generation > seen => {
                    return Ok(c.clone());
                }
                State::Up(c) if !c.cancel.is_cancelled() => return Ok(c.clone()),
                _ => {}
            }
            if !force && snap.failed_generation == Some(seen) {
                return Err(DialError::Transient("the last reconnect failed".into()));
            }
        }
        let was_connected = self.state.borrow().generation > 0;
        if was_connected {
            self.diag("reconnecting");
        }
        let result = self.dial().await;
        match result {
            Ok((conn, tools)) => {
                // The tools appear and the state turns Up as one step: publishing runs
                // under the state's write lock, so whoever sees either sees both.
                let mut tools = Some(tools);
                self.state.send_modify(|s| {
                    if !matches!(s.state, State::Closed) {
                        s.generation = conn.generation;
                        s.failed_generation = None;
                        s.state = State::Up(conn.clone());
                        if let Some(tools) = tools.take() {
                            self.publish(tools);
                        }
                    }
                });
                if self.closed.is_cancelled() {
                    conn.cancel.cancel();
                    return Err(DialError::Closed);
                }
                // Its watcher saw it end before it was published: lost now.
                let lost_early = self.state.borrow().lost_early == Some(conn.generation);
                if lost_early {
                    self.lost(conn.generation);
                }
                let pending = lock(&self.relist_pending).take_if(|g| *g == conn.generation);
                if pending.is_some() {
                    tokio::spawn(self.clone().relist(conn.generation));
                }
                (self.on_connected)();
                let generation = conn.generation;
                self.state
                    .send_modify(|s| s.announced = s.announced.max(generation));
                Ok(conn)
            }
            Err(e) => {
                self.state.send_modify(|s| {
                    s.failed_generation = Some(seen);
                    match (&e, &s.state) {
                        (_, State::Closed) => {}
                        (DialError::Rejected(r), _) => s.state = State::Rejected(r.clone()),
                        _ => s.state = State::Down,
                    }
                });
                match &e {
                    DialError::Rejected(r) => self.diag(format!("rejected: {r}")),
                    DialError::Transient(r) | DialError::Hangup(r) => {
                        self.diag(format!("connect failed: {r}"))
                    }
                    DialError::Closed => {}
                }
                Err(e)
            }
        }
    }

    /// Records how the stdio child of `generation` ended, for the operator and for the
    /// message of the calls it was running.
    pub(super) fn child_exited(
        &self,
        generation: u64,
        status: std::process::ExitStatus,
        stderr: String,
    ) {
        let how = child::exit_text(status);
        let stderr = if stderr.is_empty() {
            String::new()
        } else {
            format!("; its stderr ended with: {stderr}")
        };
        self.diag_warn(format!("the server process {how}{stderr}"));
        self.exits.send_replace(Some((generation, how)));
    }

    /// Marks the connection of generation `generation` as lost (once) and starts the
    /// background reconnect.
    pub(super) fn lost(self: &Arc<Self>, generation: u64) {
        // Quiver closing the client ends every connection: not a loss (warning of it would
        // end every command that used an HTTP server).
        if self.closed.is_cancelled() {
            return;
        }
        let mut lived = None;
        self.state.send_if_modified(|s| match &s.state {
            State::Up(c) if c.generation == generation => {
                c.cancel.cancel();
                lived = Some(c.since.elapsed());
                s.state = State::Reconnecting;
                true
            }
            State::Closed => false,
            _ if generation > s.generation => {
                s.lost_early = Some(generation);
                false
            }
            _ => false,
        });
        let Some(lived) = lived else { return };
        self.counters.drops.fetch_add(1, Ordering::Relaxed);
        // A stdio child's end is logged as a warning where it is seen (with its exit and
        // stderr); an HTTP server's loss is seen only here.
        if matches!(self.cfg.endpoint, Endpoint::Http { .. }) {
            tracing::warn!(server = %self.cfg.name, "connection lost; reconnecting in the background");
            self.push_diag("connection lost".to_owned());
        } else {
            self.diag("connection lost");
        }
        {
            let mut backoff = lock(&self.backoff);
            if lived < STABLE_AFTER {
                let next = self.next_backoff(*backoff);
                *backoff = Some(next);
                drop(backoff);
                self.diag(format!(
                    "lost {:.1} s after connecting; reconnecting in {:.2} s",
                    lived.as_secs_f64(),
                    next.as_secs_f64()
                ));
            } else {
                *backoff = None;
            }
        }
        self.start_supervisor();
    }

    pub(super) fn start_liveness(self: &Arc<Self>, conn: &Arc<Conn>) {
        let interval = match self.cfg.liveness.unwrap_or(self.opts.liveness) {
            Liveness::Every(d) if !d.is_zero() => d,
            _ => return,
        };
        let me = self.me.clone();
        let peer = conn.peer.clone();
        let cancel = conn.cancel.clone();
        let generation = conn.generation;
        let wait = interval.clamp(Duration::from_secs(1), Duration::from_secs(10));
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = cancel.cancelled() => return,
                }
                // A server that handles one request at a time answers the ping only after
                // the calls before it: while calls are in flight (or ended during the wait)
                // an unanswered ping proves nothing, and the calls' own timeouts cover a
                // hung server. A closed pipe or dead process is seen by the watcher at once.
                let ping = peer.send_request(ClientRequest::PingRequest(Default::default()));
                tokio::pin!(ping);
                let dead = loop {
                    let Some(before) = me.upgrade().map(|up| up.calls.activity().1) else {
                        return;
                    };
                    let answer = tokio::select! {
                        r = tokio::time::timeout(wait, &mut ping) => r,
                        _ = cancel.cancelled() => return,
                    };
                    match answer {
                        Ok(Ok(_)) => break None,
                        // Refused: the connection is gone (an HTTP server that stopped
                        // listening); rmcp's HTTP worker keeps running all the same.
                        Ok(Err(e)) => {
                            break matches!(classify_service(&e), Class::Drop | Class::Refused)
                                .then(|| "the liveness ping found the connection gone".to_owned());
                        }
                        Err(_) => {
                            let Some(up) = me.upgrade() else { return };
                            let (in_flight, ended) = up.calls.activity();
                            if in_flight == 0 && ended == before {
                                break Some(format!(
                                    "did not answer a liveness ping within {} while idle",
                                    quiver_contract::duration_text(wait)
                                ));
                            }
                        }
                    }
                };
                if let Some(why) = dead {
                    if let Some(up) = me.upgrade() {
                        // A warning: a server that keeps hanging is the operator's to see.
                        up.diag_warn(format!(
                            "{why}: the connection is taken as lost and made again{}",
                            if matches!(
                                up.cfg.endpoint,
                                crate::client::config::Endpoint::Stdio { .. }
                            ) {
                                " (its process is stopped and started again)"
                            } else {
                                ""
                            }
                        ));
                        up.lost(generation);
                    }
                    return;
                }
            }
        });
    }
}
