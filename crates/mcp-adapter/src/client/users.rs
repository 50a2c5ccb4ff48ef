//! Upstreams that act for the user (`auth = "passthrough"` or `"exchange"`): a connection
//! per user, opened with that user's credential, pooled by the user's `sub`, capped
//! (`max_user_connections`), closed when idle (`user_idle_timeout`), and never shared
//! between users. The server's own connection (static credentials) only lists its tools;
//! every call goes over the caller's connection.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant, SystemTime},
};

use quiver_contract::{CallContext, Envelope, ErrKind, UserCredential};
use quiver_registry::{
    Catalog,
    identity::{TokenError, TokenExchanger},
};
use reqwest::header::AUTHORIZATION;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{
    ClientOptions,
    config::{Endpoint, ResolvedServer, Secret, UpstreamAuth},
    upstream::{Relays, ServerState, Upstream},
};
use crate::sync::lock;

/// Where the token exchanger is found: set by the host once the client is built
/// (`McpClient::set_token_exchanger`), shared by every server's pool.
pub(crate) type ExchangerSlot = Arc<OnceLock<Arc<dyn TokenExchanger>>>;

/// One user's connection.
struct Entry {
    upstream: Arc<Upstream>,
    /// The credential it was opened with: a new one (the user's token renewed, an exchanged
    /// token replaced before it expired) opens a new connection.
    bearer: Secret,
    last_used: Instant,
    /// The calls on it now: a connection with none is idle (it may be closed).
    calls: Arc<Calls>,
}

/// The calls on one connection, and a signal when the last ends.
#[derive(Default)]
struct Calls {
    running: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

impl Calls {
    fn idle(&self) -> bool {
        self.running.load(std::sync::atomic::Ordering::Acquire) == 0
    }

    /// Until no call runs on the connection.
    async fn drained(&self) {
        loop {
            let signal = self.idle.notified();
            if self.idle() {
                return;
            }
            signal.await;
        }
    }
}

impl Entry {
    fn idle(&self) -> bool {
        self.calls.idle()
    }

    fn hold(&self) -> Held {
        self.calls
            .running
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Held(self.calls.clone())
    }
}

/// A call on a user's connection, counted while it lasts.
struct Held(Arc<Calls>);

impl Drop for Held {
    fn drop(&mut self) {
        let was = self
            .0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        if was == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The per-user connections of one server.
pub(crate) struct UserConnections {
    cfg: ResolvedServer,
    opts: Arc<ClientOptions>,
    dial_permits: Arc<Semaphore>,
    /// A child of the server's own: closing the server closes every user's connection.
    closed: CancellationToken,
    exchanger: ExchangerSlot,
    pool: Mutex<HashMap<Arc<str>, Entry>>,
    /// Connections opened so far (one per user, and one more each time a user's credential
    /// changed or an idle one was closed).
    opened: std::sync::atomic::AtomicU64,
}

impl UserConnections {
    /// The pool of `cfg` (a server that acts for the user), with its idle reaper started.
    pub(crate) fn start(
        cfg: ResolvedServer,
        opts: Arc<ClientOptions>,
        dial_permits: Arc<Semaphore>,
        closed: CancellationToken,
        exchanger: ExchangerSlot,
    ) -> Arc<Self> {
        let pool = Arc::new(UserConnections {
            cfg,
            opts,
            dial_permits,
            closed,
            exchanger,
            pool: Mutex::new(HashMap::new()),
            opened: std::sync::atomic::AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&pool);
        let closed = pool.closed.clone();
        let every =
            (pool.cfg.user_idle_timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = closed.cancelled() => break,
                }
                let Some(pool) = weak.upgrade() else { return };
                pool.close_idle().await;
            }
            if let Some(pool) = weak.upgrade() {
                pool.close_all().await;
            }
        });
        pool
    }

    /// Users with a connection now.
    pub(crate) fn len(&self) -> usize {
        lock(&self.pool).len()
    }

    /// Connections opened so far.
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Closes the connections unused for `user_idle_timeout` that no call holds.
    async fn close_idle(&self) {
        let idle = self.cfg.user_idle_timeout;
        let gone: Vec<Arc<Upstream>> = {
            let mut pool = lock(&self.pool);
            let stale: Vec<Arc<str>> = pool
                .iter()
                .filter(|(_, e)| e.last_used.elapsed() >= idle && e.idle())
                .map(|(k, _)| k.clone())
                .collect();
            stale
                .into_iter()
                .filter_map(|k| pool.remove(&k).map(|e| e.upstream))
                .collect()
        };
        for up in gone {
            tracing::debug!(server = %self.cfg.name, "a user's idle connection closed");
            up.retire().await;
        }
    }

    /// Closes every user's connection (the server is closing).
    pub(crate) async fn close_all(&self) {
        let all: Vec<Arc<Upstream>> = lock(&self.pool).drain().map(|(_, e)| e.upstream).collect();
        for up in all {
            up.retire().await;
        }
    }

    /// The credential this server gets for `user`: their own token (`passthrough`), or one
    /// exchanged for the server's audience (`exchange`).
    async fn bearer(&self, user: &UserCredential) -> Result<String, Envelope> {
        let server = &self.cfg.name;
        if user.expires_at <= SystemTime::now() {
            return Err(Envelope::err(
                ErrKind::Forbidden,
                format!(
                    "MCP server \"{server}\" acts for the signed-in user, whose access token has expired; the user must sign in again. The call was not sent"
                ),
            ));
        }
        match self.cfg.auth {
            UpstreamAuth::Exchange => {
                let Some(exchanger) = self.exchanger.get() else {
                    return Err(Envelope::err(
                        ErrKind::NotAvailable,
                        format!(
                            "MCP server \"{server}\" needs a token exchanged for the user, and this Quiver has no token exchange configured; an operator must set `client_id` and `client_secret` in [auth.oidc]. Use another tool"
                        ),
                    ));
                };
                let audience = self.cfg.audience.as_deref().unwrap_or_default();
                exchanger
                    .exchange(user.bearer(), audience)
                    .await
                    .map(|t| t.bearer().to_owned())
                    .map_err(|e| match e {
                        TokenError::Invalid(why) => Envelope::err(
                            ErrKind::Forbidden,
                            format!(
                                "MCP server \"{server}\" acts for the signed-in user, and the identity provider would not give Quiver a token for it on the user's behalf ({why}); the user may need to sign in again or be granted access. The call was not sent"
                            ),
                        ),
                        other => {
                            tracing::warn!(server = %server, error = %other, "token exchange failed");
                            Envelope::err(
                                ErrKind::NotAvailable,
                                format!(
                                    "MCP server \"{server}\" acts for the signed-in user, and the identity provider could not be asked for a token for it now; try again shortly, or use another tool. The call was not sent"
                                ),
                            )
                        }
                    })
            }
            _ => Ok(user.bearer().to_owned()),
        }
    }

    /// The connection of `subject` opened with `bearer`: the pooled one, or a new one (the
    /// user's previous connection, opened with another credential, is closed; when the pool
    /// is full, the least recently used idle connection is closed for it).
    fn connection(
        &self,
        subject: &Arc<str>,
        bearer: String,
    ) -> Result<(Arc<Upstream>, Held), Box<Envelope>> {
        let mut retired = Vec::new();
        let up = {
            let mut pool = lock(&self.pool);
            match pool.get_mut(subject) {
                Some(e) if e.bearer.0 == bearer && e.upstream.state() != ServerState::Closed => {
                    e.last_used = Instant::now();
                    return Ok((e.upstream.clone(), e.hold()));
                }
                Some(_) => {
                    if let Some(old) = pool.remove(subject) {
                        retired.push(old);
                    }
                }
                None => {}
            }
            if pool.len() >= self.cfg.max_user_connections {
                let lru = pool
                    .iter()
                    .filter(|(_, e)| e.idle())
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(k, _)| k.clone());
                match lru.and_then(|k| pool.remove(&k)) {
                    Some(e) => retired.push(e),
                    None => {
                        drop(pool);
                        self.retire_later(retired);
                        return Err(Box::new(Envelope::err(
                            ErrKind::NotAvailable,
                            format!(
                                "MCP server \"{}\" has its {} per-user connections all busy with other users' calls; try again in a few seconds, or use another tool",
                                self.cfg.name, self.cfg.max_user_connections
                            ),
                        )));
                    }
                }
            }
            let up = self.open(bearer.clone());
            let entry = Entry {
                upstream: up.clone(),
                bearer: Secret(bearer),
                last_used: Instant::now(),
                calls: Arc::default(),
            };
            let held = entry.hold();
            pool.insert(subject.clone(), entry);
            (up, held)
        };
        self.retire_later(retired);
        Ok(up)
    }

    /// Closes connections taken out of the pool once the calls still running on them end
    /// (a user's renewed credential does not cut a call made with the old one).
    fn retire_later(&self, retired: Vec<Entry>) {
        for e in retired {
            tokio::spawn(async move {
                e.calls.drained().await;
                e.upstream.retire().await;
            });
        }
    }

    /// A new connection with `bearer` as its credential, connecting in the background. Its
    /// tools go to a catalog of its own (the server's connection publishes the shared ones).
    fn open(&self, bearer: String) -> Arc<Upstream> {
        let mut cfg = self.cfg.clone();
        cfg.for_user = true;
        if let Endpoint::Http { headers, token, .. } = &mut cfg.endpoint {
            headers.retain(|(name, _)| *name != AUTHORIZATION);
            *token = Some(Secret(bearer));
        }
        let up = Upstream::new(
            cfg,
            self.opts.clone(),
            Arc::new(Catalog::new()),
            self.dial_permits.clone(),
            self.closed.child_token(),
            Box::new(|| {}),
            Relays {
                updates: tokio::sync::broadcast::channel(1).0,
                lists: tokio::sync::broadcast::channel(1).0,
                server: self.cfg.name.as_str().into(),
            },
        );
        self.opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        up.start_supervisor();
        up
    }

    /// Calls `tool` for the call's user over that user's connection; a call without a user
    /// is refused.
    pub(crate) async fn call(&self, tool: &str, input: Value, ctx: &CallContext) -> Envelope {
        let server = &self.cfg.name;
        let Some(user) = &ctx.user else {
            return Envelope::err(
                ErrKind::Forbidden,
                format!(
                    "MCP server \"{server}\" acts for the signed-in user (`auth = \"{}\"`), and this call has no user: it came with a configured token, from the command line or over stdio. Only a caller signed in through the identity provider (an [auth.oidc] access token) can use its tools; use another tool",
                    self.cfg.auth.as_str()
                ),
            );
        };
        let bearer = match self.bearer(user).await {
            Ok(b) => b,
            Err(refusal) => return refusal,
        };
        let (up, _held) = match self.connection(&user.subject, bearer) {
            Ok(up) => up,
            Err(refusal) => return *refusal,
        };
        let limit = up.call_limit(ctx);
        if let Err(refusal) = self.connected(&up, limit).await {
            return refusal;
        }
        let out = up.call(tool, input, ctx).await;
        if let Some(e) = lock(&self.pool).get_mut(&user.subject) {
            e.last_used = Instant::now();
        }
        out
    }

    /// Waits for a new connection's first dial (within the connect timeout and nine tenths
    /// of the call's time); a connection the server refused is dropped from the pool, so
    /// the user's next call tries again.
    async fn connected(&self, up: &Arc<Upstream>, limit: Duration) -> Result<(), Envelope> {
        let mut rx = up.state_changes();
        let wait = up.connect_wait().min(limit.mul_f64(0.9));
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match up.state() {
                ServerState::Connected | ServerState::Reconnecting => return Ok(()),
                ServerState::Rejected(why) => {
                    lock(&self.pool).retain(|_, e| !Arc::ptr_eq(&e.upstream, up));
                    up.retire().await;
                    return Err(Envelope::err(
                        ErrKind::Forbidden,
                        format!(
                            "MCP server \"{}\" refused the connection Quiver opened for the signed-in user ({}); the user may not have access to it. The call was not sent",
                            self.cfg.name, why
                        ),
                    ));
                }
                ServerState::Down | ServerState::Closed => {
                    return Err(Envelope::err(ErrKind::NotAvailable, up.absence()));
                }
                ServerState::Connecting => {}
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Err(Envelope::err(
                    ErrKind::NotAvailable,
                    format!(
                        "MCP server \"{}\" did not accept a connection for the signed-in user within {}; the call was not sent. Try again shortly, or use another tool",
                        self.cfg.name,
                        quiver_contract::duration_text(wait)
                    ),
                ));
            }
        }
    }
}
