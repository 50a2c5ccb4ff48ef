//! One upstream server: the [`Upstream`] type with its connection state (connecting, up,
//! reconnecting, down, rejected, closed), its published tools and counters, and what it tells
//! a caller when it cannot take a call. The work is in the submodules: `supervise` (the
//! background dial loop and liveness), `dial` (one connection attempt per transport),
//! `listing` (`tools/list` and publishing), `call` (a call through rmcp), `direct` (a call
//! that bypasses rmcp) and `relay` (the rmcp handler for what the server sends unasked).

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use quiver_registry::{Catalog, RegisterReport, Skipped};
use rmcp::{RoleClient, service::Peer};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::{
    ClientOptions,
    config::{Endpoint, ResolvedServer},
    delivery::{Deliveries, Written},
    roots::{Roots, SessionLink},
    route::Calls,
    to_contract::UpstreamTool,
};
use crate::sync::lock;

mod call;
mod dial;
mod direct;
mod listing;
mod relay;
mod supervise;

pub(crate) use dial::DialError;
use listing::Relisting;
pub(crate) use relay::Relays;

/// How many diagnostic lines a server keeps (the newest).
const MAX_DIAGNOSTICS: usize = 100;

/// How long, after a stdio child's pipe closed, its exit is waited for (for its status).
const EXIT_WAIT: Duration = Duration::from_millis(250);

/// Where a server's connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerState {
    /// The first connection attempt has not finished.
    Connecting,
    /// Connected; calls go through.
    Connected,
    /// A dropped connection is being re-dialled; calls wait for the outcome.
    Reconnecting,
    /// Down; retried in the background; calls fail at once.
    Down,
    /// The server refused us for good; no more retries.
    Rejected(String),
    /// Closed for good.
    Closed,
}

/// Counters of one server, for diagnostics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerCounters {
    /// Connection attempts (every spawn or HTTP handshake).
    pub dials: u64,
    /// Successful connections.
    pub connects: u64,
    /// Connections lost after being up.
    pub drops: u64,
    /// Tool calls sent upstream.
    pub calls: u64,
    /// Re-lists after `notifications/tools/list_changed`.
    pub relists: u64,
    /// Tool calls that took the direct path to a streamable-HTTP server
    /// (`client/upstream/direct.rs`).
    pub direct_calls: u64,
    /// Of those, calls the server rejected unrun and rmcp sent instead (an expired session).
    pub direct_handoffs: u64,
    /// When the last connection came up (none: never).
    pub last_connect: Option<std::time::SystemTime>,
}

/// Failed attempts in a row after which a caller of a stdio server is told an operator
/// must fix it rather than to try again.
const FAILED_FOR_AN_OPERATOR: u64 = 3;

/// The most characters of the last connection failure a call is told.
const LAST_FAILURE_CHARS: usize = 300;

#[derive(Default)]
struct Counters {
    dials: AtomicU64,
    /// `dials` when the last connection came up.
    dials_at_connect: AtomicU64,
    connects: AtomicU64,
    drops: AtomicU64,
    calls: AtomicU64,
    relists: AtomicU64,
    direct_calls: AtomicU64,
    direct_handoffs: AtomicU64,
    /// When the last connection came up, in milliseconds since the Unix epoch (0: never).
    connected_at_ms: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ServerCounters {
        ServerCounters {
            dials: self.dials.load(Ordering::Relaxed),
            connects: self.connects.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            relists: self.relists.load(Ordering::Relaxed),
            direct_calls: self.direct_calls.load(Ordering::Relaxed),
            direct_handoffs: self.direct_handoffs.load(Ordering::Relaxed),
            last_connect: match self.connected_at_ms.load(Ordering::Relaxed) {
                0 => None,
                ms => Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)),
            },
        }
    }
}

/// A live connection.
pub(crate) struct Conn {
    pub(crate) peer: Peer<RoleClient>,
    generation: u64,
    /// When the connection came up.
    since: Instant,
    cancel: CancellationToken,
    pub(crate) has_resources: bool,
    pub(crate) has_prompts: bool,
    /// The server answers `completion/complete`.
    pub(crate) has_completions: bool,
    /// The server accepts `resources/subscribe`.
    pub(crate) has_subscribe: bool,
    /// Stdio only: which requests were written to the child.
    written: Option<Written>,
    /// Stdio: the progress and log notifications read and not yet handled (a call's answer
    /// waits for them; see `delivery.rs`).
    deliveries: Deliveries,
    /// Streamable HTTP: the direct path for `tools/call` (`direct.rs`).
    direct: Option<Arc<direct::DirectPath>>,
}

#[derive(Clone)]
enum State {
    Connecting,
    Up(Arc<Conn>),
    Reconnecting,
    Down,
    Rejected(String),
    Closed,
}

#[derive(Clone)]
pub(crate) struct Snapshot {
    state: State,
    /// Bumped by every successful dial.
    generation: u64,
    /// A shared reconnect for this generation failed; later callers do not dial again.
    failed_generation: Option<u64>,
    /// The generation whose connect hook (resource tools, resubscriptions) has run.
    announced: u64,
    /// A connection lost before it was published (its watcher saw the end while the dial
    /// was still finishing): handled as lost once it is published.
    lost_early: Option<u64>,
}

pub(crate) struct Upstream {
    pub(crate) cfg: ResolvedServer,
    opts: Arc<ClientOptions>,
    catalog: Arc<Catalog>,
    dial_permits: Arc<Semaphore>,
    state: watch::Sender<Snapshot>,
    dial_lock: tokio::sync::Mutex<()>,
    closed: CancellationToken,
    counters: Counters,
    diagnostics: Mutex<VecDeque<String>>,
    /// The backoff delay reached by failed dials and short-lived connections; `None` after a
    /// connection that lived `STABLE_AFTER` (`supervise.rs`).
    backoff: Mutex<Option<Duration>>,
    /// When the background loop dials next, while it waits out a backoff delay.
    next_attempt: Mutex<Option<std::time::SystemTime>>,
    /// Why the last dial could not even start the server's command (not found, not
    /// executable), until a dial starts it: a fault only an operator can fix.
    cannot_start: Mutex<Option<String>>,
    /// Every tool name the server listed last, before `allow_tools` and `deny_tools`.
    listed_names: Mutex<Vec<String>>,
    published: Mutex<BTreeMap<String, UpstreamTool>>,
    last_report: Mutex<RegisterReport>,
    pids: Arc<Mutex<Vec<u32>>>,
    supervising: AtomicBool,
    watchers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    me: Weak<Upstream>,
    /// Called when the server's capabilities change what the client offers (resources).
    pub(crate) on_connected: Box<dyn Fn() + Send + Sync>,
    /// The calls in flight, for routing the server's own requests and notifications.
    calls: Calls,
    /// Whose roots the server was last given (`roots.rs`).
    roots: Arc<Roots>,
    /// Set for a per-session server: the session whose roots it is given.
    pub(crate) session: std::sync::OnceLock<Arc<SessionLink>>,
    /// The next id (and progress token) of a direct-path call, `quiver-N`: one sequence for
    /// all of this server's connections.
    direct_ids: AtomicU64,
    /// A `tools/list_changed` that came while the connection of this generation was still
    /// connecting: re-listed once it is up.
    relist_pending: Mutex<Option<u64>>,
    /// Dials started (the generation of the next is one more).
    dial_seq: AtomicU64,
    /// Re-lists after `tools/list_changed` run one at a time; a burst of notifications
    /// during one makes one more (a list published late never overwrites a newer one).
    relisting: Mutex<Relisting>,
    /// The tools of the published `tools/list` that were too malformed to serve (at most
    /// `list_cap`), reported with the catalog's refusals.
    malformed: Mutex<Vec<Skipped>>,
    /// Where this server's resource updates and list changes go (to `quiver serve`).
    relays: Relays,
    /// How the stdio child of a connection generation ended ("exited with code 7"), for
    /// the message of the calls it was running.
    exits: watch::Sender<Option<(u64, String)>>,
    /// A server that acts for the user: its users' connections (`client/users.rs`); this
    /// connection then only lists the tools.
    users: std::sync::OnceLock<Arc<super::users::UserConnections>>,
    /// The `instructions` the server gave at its last handshake (how to use its tools),
    /// passed on in Quiver's own.
    pub(crate) instructions: Mutex<Option<String>>,
    /// The tool-list problems already warned of ([`Upstream::warn_once`]).
    warned: Mutex<std::collections::HashSet<String>>,
}

impl Upstream {
    pub(crate) fn new(
        cfg: ResolvedServer,
        opts: Arc<ClientOptions>,
        catalog: Arc<Catalog>,
        dial_permits: Arc<Semaphore>,
        closed: CancellationToken,
        on_connected: Box<dyn Fn() + Send + Sync>,
        relays: Relays,
    ) -> Arc<Upstream> {
        let (state, _) = watch::channel(Snapshot {
            state: State::Connecting,
            generation: 0,
            failed_generation: None,
            announced: 0,
            lost_early: None,
        });
        Arc::new_cyclic(|me| Upstream {
            cfg,
            opts,
            catalog,
            dial_permits,
            state,
            dial_lock: tokio::sync::Mutex::new(()),
            closed,
            counters: Counters::default(),
            diagnostics: Mutex::new(VecDeque::new()),
            backoff: Mutex::new(None),
            next_attempt: Mutex::new(None),
            cannot_start: Mutex::new(None),
            listed_names: Mutex::new(Vec::new()),
            published: Mutex::new(BTreeMap::new()),
            last_report: Mutex::new(RegisterReport::default()),
            pids: Arc::new(Mutex::new(Vec::new())),
            supervising: AtomicBool::new(false),
            watchers: Mutex::new(Vec::new()),
            me: me.clone(),
            on_connected,
            calls: Calls::default(),
            roots: Arc::default(),
            session: std::sync::OnceLock::new(),
            direct_ids: AtomicU64::new(0),
            relist_pending: Mutex::new(None),
            dial_seq: AtomicU64::new(0),
            relisting: Mutex::new(Relisting::default()),
            malformed: Mutex::new(Vec::new()),
            relays,
            exits: watch::channel(None).0,
            users: std::sync::OnceLock::new(),
            instructions: Mutex::new(None),
            warned: Mutex::default(),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Its users' connections, for a server that acts for the user.
    pub(crate) fn users(&self) -> Option<&Arc<super::users::UserConnections>> {
        self.users.get()
    }

    /// Makes this a server that acts for the user, its calls going over `users`.
    pub(crate) fn set_users(&self, users: Arc<super::users::UserConnections>) {
        let _ = self.users.set(users);
    }

    /// How long a first connection may take to come up.
    pub(crate) fn connect_wait(&self) -> Duration {
        self.connect_timeout()
    }

    /// The server's HTTP session on connection `generation` was replaced by a new one: it
    /// forgot the old session, as a server does when it restarts. What it offers may have
    /// changed, so its tools are listed again, and what the old session held (resource
    /// subscriptions) is renewed, as after a reconnect.
    pub(super) fn session_replaced(self: &Arc<Self>, generation: u64) {
        self.diag_warn(
            "the server started a new session (it restarted, or was redeployed?): its tools are listed again and its resource subscriptions renewed",
        );
        tokio::spawn(self.clone().relist(generation));
        (self.on_connected)();
    }

    /// A diagnostic line for the operator that says something was lost or is broken: also
    /// logged as a warning (on `quiver serve`'s stderr by default).
    fn diag_warn(&self, line: impl Into<String>) {
        let line = line.into();
        tracing::warn!(server = %self.cfg.name, "{line}");
        self.push_diag(line);
    }

    /// A problem of the server's tool list: a warning the first time it is seen, and only
    /// a diagnostic line when a re-list (each `tools/list_changed`, each reconnect) finds
    /// it again, so the log says each problem once.
    fn warn_once(&self, line: String) {
        let first = lock(&self.warned).insert(line.clone());
        if first {
            self.diag_warn(line);
        } else {
            self.diag(line);
        }
    }

    fn diag(&self, line: impl Into<String>) {
        let line = line.into();
        tracing::info!(server = %self.cfg.name, "{line}");
        self.push_diag(line);
    }

    fn push_diag(&self, line: String) {
        let mut lines = lock(&self.diagnostics);
        if lines.len() >= MAX_DIAGNOSTICS {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    pub(crate) fn diagnostics(&self) -> Vec<String> {
        lock(&self.diagnostics).iter().cloned().collect()
    }

    pub(crate) fn counters(&self) -> ServerCounters {
        self.counters.snapshot()
    }

    pub(crate) fn child_pids(&self) -> Vec<u32> {
        lock(&self.pids).clone()
    }

    pub(crate) fn last_report(&self) -> RegisterReport {
        let mut report = lock(&self.last_report).clone();
        report.skipped.extend(lock(&self.malformed).iter().cloned());
        report
    }

    pub(crate) fn state(&self) -> ServerState {
        match &self.state.borrow().state {
            State::Connecting => ServerState::Connecting,
            State::Up(_) => ServerState::Connected,
            State::Reconnecting => ServerState::Reconnecting,
            State::Down => ServerState::Down,
            State::Rejected(r) => ServerState::Rejected(r.clone()),
            State::Closed => ServerState::Closed,
        }
    }

    /// When the background loop dials next, while it waits out a backoff delay (`None`
    /// while it dials, and when it is not running).
    pub(crate) fn next_attempt(&self) -> Option<std::time::SystemTime> {
        *lock(&self.next_attempt)
    }

    /// Every tool name the server listed last, before `allow_tools` and `deny_tools`.
    pub(crate) fn listed_names(&self) -> Vec<String> {
        lock(&self.listed_names).clone()
    }

    /// Why the server's command could not be started at the last dial, if it could not.
    pub(crate) fn cannot_start(&self) -> Option<String> {
        lock(&self.cannot_start).clone()
    }

    /// Connected, and the connect hook of this connection has run (so the resource tools
    /// a connection brings are in the catalog).
    pub(crate) fn settled(&self) -> bool {
        let s = self.state.borrow();
        matches!(s.state, State::Up(_)) && s.announced >= s.generation
    }

    pub(crate) fn state_changes(&self) -> watch::Receiver<Snapshot> {
        self.state.subscribe()
    }

    pub(crate) fn conn(&self) -> Option<Arc<Conn>> {
        match &self.state.borrow().state {
            State::Up(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// The names of the tools currently published.
    pub(crate) fn published_names(&self) -> BTreeSet<String> {
        lock(&self.published).keys().cloned().collect()
    }

    /// How long one connection attempt may take: the server's `connect_timeout`, else the
    /// client's.
    fn connect_timeout(&self) -> Duration {
        self.cfg
            .connect_timeout
            .unwrap_or(self.opts.connect_timeout)
    }

    /// Closes for good: later calls get "closed" without dialling; the child is killed and
    /// reaped before this returns.
    /// Closes this server alone, for good (a reload removed it or changed its settings):
    /// its supervisor stops dialling, and [`Upstream::close`] does the rest.
    pub(crate) async fn retire(&self) {
        self.closed.cancel();
        self.close().await;
    }

    pub(crate) async fn close(&self) {
        let _guard = self.dial_lock.lock().await;
        let old = self.state.send_replace(Snapshot {
            state: State::Closed,
            generation: u64::MAX,
            failed_generation: None,
            announced: 0,
            lost_early: None,
        });
        if let State::Up(conn) = old.state {
            conn.cancel.cancel();
        }
        if let Some(users) = self.users.get() {
            Box::pin(users.close_all()).await;
        }
        // Every connection's watcher kills and reaps its child; wait for all of them.
        let watchers = std::mem::take(&mut *lock(&self.watchers));
        for w in watchers {
            let _ = w.await;
        }
        let family = self.cfg.family();
        for name in self.published_names() {
            if self
                .catalog
                .lookup(&name)
                .is_some_and(|e| *e.family == *family)
            {
                self.catalog.remove(&name);
            }
        }
        lock(&self.published).clear();
    }

    /// Why the server cannot take a call now, and what the caller can do: one wording for
    /// every path that finds it not connected.
    pub(crate) fn absence(&self) -> String {
        let server = &self.cfg.name;
        match self.state() {
            ServerState::Connected | ServerState::Closed => {
                format!("MCP server \"{server}\" is not connected")
            }
            ServerState::Connecting => format!(
                "MCP server \"{server}\" is still connecting. Try again shortly, or use another tool"
            ),
            ServerState::Reconnecting | ServerState::Down if self.cannot_start().is_some() => {
                format!(
                    "MCP server \"{server}\" cannot be started (its command is missing or cannot run); an operator must install it or fix its configuration. Use another tool"
                )
            }
            ServerState::Reconnecting | ServerState::Down => {
                let was = if self.counters().connects > 0 {
                    "went down"
                } else {
                    "has not connected yet"
                };
                // A command that fails to start again and again needs its operator; a
                // network server that is down may come back by itself (a restart, a
                // deploy), so it keeps the retry advice.
                let failed = self.failed_in_a_row();
                if failed >= FAILED_FOR_AN_OPERATOR
                    && matches!(self.cfg.endpoint, Endpoint::Stdio { .. })
                {
                    return format!(
                        "MCP server \"{server}\" {was}, and the last {failed} attempts to reach it failed: retrying will not help until an operator fixes it (`quiver status` says why). Use another tool"
                    );
                }
                // Why the last attempt failed (a start-up crash says so on stderr): the
                // caller can tell a server that is coming from one that keeps failing.
                let last = self
                    .diagnostics()
                    .into_iter()
                    .rev()
                    // Not one from before the server's last connection.
                    .take_while(|l| !l.starts_with("connected ("))
                    .find_map(|l| l.strip_prefix("connect failed: ").map(str::to_owned))
                    .map_or(String::new(), |mut why| {
                        // What the server wrote on stderr is for its operator (`quiver
                        // status` shows it), not for every caller.
                        if let Some(at) = why.find("; its stderr ended with:") {
                            why.truncate(at);
                        }
                        quiver_registry::layers::result_limit::truncate_chars(
                            &mut why,
                            LAST_FAILURE_CHARS,
                        );
                        format!(" (its last attempt: {why})")
                    });
                format!(
                    "MCP server \"{server}\" {was}{last}. {}",
                    self.retry_advice()
                )
            }
            ServerState::Rejected(_) => format!(
                "MCP server \"{server}\" could not be connected and is not retried; an operator must fix it. Use another tool"
            ),
        }
    }

    /// The dials since the last connection came up that failed (the one under way, if
    /// any, not counted).
    fn failed_in_a_row(&self) -> u64 {
        let dials = self.counters.dials.load(Ordering::Relaxed);
        let at_connect = self.counters.dials_at_connect.load(Ordering::Relaxed);
        let dialing = u64::from(self.next_attempt().is_none());
        dials.saturating_sub(at_connect).saturating_sub(dialing)
    }

    /// When Quiver dials the server again, as advice.
    fn retry_advice(&self) -> String {
        let next = self
            .next_attempt()
            .and_then(|t| t.duration_since(std::time::SystemTime::now()).ok());
        match next {
            Some(d) => format!(
                "Quiver tries it again in about {} s: try again after that, or use another tool",
                d.as_secs().max(1)
            ),
            None => "Quiver is reconnecting it in the background: try again in a few seconds, or use another tool".to_owned(),
        }
    }
}
