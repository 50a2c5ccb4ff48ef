//! One upstream server: its connection state machine (connect, drop, shared reconnect,
//! background retry with backoff, rejection, close), its published tools, and the call path.

// Sampling, roots and logging are deprecated by SEP-2577; 2025-era servers still use them.
#![allow(deprecated)]

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use quiver_contract::{CallContext, ChannelError, ClientChannel, Envelope, ErrKind, Tool};
use quiver_registry::{Catalog, RegisterReport, Skipped};

use crate::content::{ListChange, ListChanged};
use crate::protocol::Protocol;
use rmcp::{
    ClientHandler, ErrorData as McpError, RoleClient, ServiceExt,
    model::{
        CallToolRequest, CancelledNotificationParam, ClientCapabilities, ClientConfig,
        ClientRequest, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
        ElicitResult, Implementation, ListRootsResult, LoggingMessageNotificationParam,
        PaginatedRequestParams, ProgressNotificationParam, ServerResult,
    },
    service::{NotificationContext, Peer, PeerRequestOptions, RequestContext, ServiceError},
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::Value;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::{
    ClientOptions,
    child::{self, ChildGuard},
    classify::{Class, classify_init, classify_service},
    config::{Endpoint, Liveness, ResolvedServer},
    delivery::{Deliveries, Delivering, Tracked, Written, in_turn},
    h1, http,
    roots::{REFETCH_WAIT, Refetch, Roots, Who, roots_of},
    route::{Calls, Origin, Route},
    to_contract::{self, UpstreamTool},
    tool::McpTool,
};

#[path = "fast.rs"]
mod fast;

/// The most `tools/list` pages one listing asks for.
const MAX_LIST_PAGES: usize = 1000;
/// How long the ping after a broken HTTP response stream may take to show the session is
/// still there.
const STREAM_CHECK: Duration = Duration::from_secs(5);
/// A connection lost sooner than this after it came up counts as a failed dial: the
/// reconnect waits and the backoff keeps growing. One that lived longer redials at once.
const STABLE_AFTER: Duration = Duration::from_secs(30);

/// How many diagnostic lines a server keeps (the newest).
const MAX_DIAGNOSTICS: usize = 100;

/// How long, after a stdio child's pipe closed, its exit is waited for (for its status).
const EXIT_WAIT: Duration = Duration::from_millis(250);

/// How long a call's answer waits for the progress and log messages read before it to be
/// handed to the caller while none of them moves on (each is a channel send; only a client
/// that does not read stalls them this long).
const SETTLE_STALL: Duration = Duration::from_millis(200);
/// The longest a call's answer waits for them in all (a flood handed on steadily).
const SETTLE_MOST: Duration = Duration::from_secs(10);

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
    /// Tool calls that took the lean streamable-HTTP path (`client/fast.rs`).
    pub lean_calls: u64,
    /// Of those, calls the server rejected unrun and rmcp sent instead (an expired session).
    pub lean_handoffs: u64,
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
    lean_calls: AtomicU64,
    lean_handoffs: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ServerCounters {
        ServerCounters {
            dials: self.dials.load(Ordering::Relaxed),
            connects: self.connects.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            relists: self.relists.load(Ordering::Relaxed),
            lean_calls: self.lean_calls.load(Ordering::Relaxed),
            lean_handoffs: self.lean_handoffs.load(Ordering::Relaxed),
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
    /// Streamable HTTP: the lean path for `tools/call` (`fast.rs`).
    fast: Option<Arc<fast::Lane>>,
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

/// Why a dial failed.
pub(crate) enum DialError {
    /// Worth retrying (unreachable, hung, crashed).
    Transient(String),
    /// Not worth retrying (unauthorized, unsupported protocol).
    Rejected(String),
    /// The server was closed.
    Closed,
}

impl DialError {
    /// The error with how the stdio child ended, if it did on its own (its exit is waited
    /// for a moment), and its last stderr lines: why a server fails at start is usually there.
    /// With what the child `child` wrote last on stderr, and how it ended when it did so on
    /// its own (`own_exit`; a child whose handshake Quiver gave up on was closed by Quiver,
    /// and exits because its input ended).
    async fn with_stderr(self, child: &mut ChildGuard, own_exit: bool) -> DialError {
        // A rejected server was answered, and then closed by the client: its exit is not
        // news.
        let exit = match self {
            DialError::Transient(_) if own_exit => {
                let status = tokio::time::timeout(EXIT_WAIT, child.exited())
                    .await
                    .ok()
                    .flatten();
                // It exited: what it wrote last may still be on its way through the pipe.
                if status.is_some() {
                    let _ = tokio::time::timeout(EXIT_WAIT, child.stderr_read()).await;
                }
                status
                    .map(|s| format!("; the process {}", child::exit_text(s)))
                    .unwrap_or_default()
            }
            _ => String::new(),
        };
        let tail = child.stderr_tail();
        let tail = if tail.is_empty() {
            String::new()
        } else {
            format!("; its stderr ended with: {tail}")
        };
        // A server that needed a variable of Quiver's environment it no longer inherits
        // exits at start-up: say where to look.
        let tail = if exit.is_empty() {
            tail
        } else {
            format!(
                "{tail} (it runs with its `env` and only part of Quiver's environment: a variable it needs goes in `env` or `inherit_env`)"
            )
        };
        match self {
            DialError::Transient(m) => DialError::Transient(format!("{m}{exit}{tail}")),
            DialError::Rejected(m) => DialError::Rejected(format!("{m}{exit}{tail}")),
            DialError::Closed => DialError::Closed,
        }
    }
}

/// What one attempt to send a call gave.
enum Attempt {
    Done(Box<Envelope>),
    /// Never reached the upstream: safe to send again on a new connection.
    NotDelivered,
    /// May have reached the upstream: never replayed. With the HTTP status the server
    /// answered it with, when rmcp gave up on one (a 3xx or 4xx it was handed).
    Unknown(Option<u16>),
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
    /// connection that lived [`STABLE_AFTER`].
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
    /// The next id (and progress token) of a lean-path call, `quiver-N`: one sequence for
    /// all of this server's connections.
    lean_ids: AtomicU64,
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
}

/// One complete `tools/list`: the tools to publish, and those too malformed to serve
/// (reported with that publication, see `Upstream::last_report`).
#[derive(Debug, Default)]
struct Listing {
    tools: Vec<UpstreamTool>,
    malformed: Vec<Skipped>,
    /// Every name the server listed, before `allow_tools` and `deny_tools` (sorted, once).
    names: Vec<String>,
}

/// The single re-list of an upstream (see `Upstream::relist`).
#[derive(Debug, Default)]
struct Relisting {
    /// A re-list is running.
    running: bool,
    /// The newest connection generation a `tools/list_changed` came on since the running
    /// re-list began.
    wanted: Option<u64>,
}

/// Clears `Relisting::running` when a re-list ends early (its task cancelled, a panic);
/// the normal end clears it itself, under the lock it checks `wanted` with, and disarms
/// this (clearing it again later could clear the flag of a re-list begun meanwhile).
struct RelistRunning<'a> {
    up: &'a Upstream,
    armed: bool,
}

impl Drop for RelistRunning<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.up
                .relisting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .running = false;
        }
    }
}

/// The broadcast channels an upstream's content notifications go out on.
#[derive(Clone)]
pub(crate) struct Relays {
    /// `notifications/resources/updated` (the URI).
    pub(crate) updates: tokio::sync::broadcast::Sender<String>,
    /// `notifications/resources/list_changed` and `notifications/prompts/list_changed`.
    pub(crate) lists: tokio::sync::broadcast::Sender<ListChanged>,
    /// The server whose notifications these are (a session that may not reach it is not
    /// told of its list changes).
    pub(crate) server: Arc<str>,
}

impl Relays {
    /// Passes a content notification on; `false` when `method` is not one.
    pub(crate) fn relay(&self, method: &str, params: Option<&Value>) -> bool {
        // No receiver (no downstream session listening) is not an error.
        match method {
            "notifications/resources/updated" => {
                if let Some(uri) = params.and_then(|p| p.get("uri")).and_then(Value::as_str) {
                    let _ = self.updates.send(uri.to_owned());
                }
            }
            "notifications/resources/list_changed" => self.list_changed(ListChange::Resources),
            "notifications/prompts/list_changed" => self.list_changed(ListChange::Prompts),
            _ => return false,
        }
        true
    }

    /// Says that this server's `list` changed.
    pub(crate) fn list_changed(&self, list: ListChange) {
        let _ = self.lists.send(ListChanged::of(list, self.server.clone()));
    }
}

/// One page of a `tools/list` answer, each tool as the server sent it.
struct ToolsPage {
    tools: Vec<Value>,
    next_cursor: Option<String>,
}

/// Reads a `tools/list` answer. rmcp reads a page whole: one tool it cannot read (a missing
/// `inputSchema`, an annotation of the wrong type) makes the page some other result. That
/// page is read here tool by tool, so that the malformed tool costs only itself.
fn read_tools_page(answer: rmcp::model::ServerResult) -> Result<ToolsPage, String> {
    match answer {
        rmcp::model::ServerResult::ListToolsResult(page) => Ok(ToolsPage {
            tools: page
                .tools
                .iter()
                .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
                .collect(),
            next_cursor: page.next_cursor,
        }),
        rmcp::model::ServerResult::CustomResult(raw) => {
            let Value::Object(mut page) = raw.0 else {
                return Err("tools/list failed: the answer is not an object".into());
            };
            let Some(Value::Array(tools)) = page.remove("tools") else {
                return Err("tools/list failed: the answer has no `tools` array".into());
            };
            let next_cursor = match page.remove("nextCursor") {
                Some(Value::String(c)) => Some(c),
                Some(Value::Null) | None => None,
                Some(other) => {
                    return Err(format!(
                        "tools/list failed: `nextCursor` must be a string, not {other}"
                    ));
                }
            };
            Ok(ToolsPage { tools, next_cursor })
        }
        _ => Err("tools/list failed: the server answered with another kind of result".into()),
    }
}

/// The envelopes of a failed upstream call, one wording for both call paths (rmcp's and
/// the lean one).
impl Upstream {
    fn timed_out(&self, tool: &str, timeout: Duration) -> Envelope {
        self.timed_out_with(tool, timeout, None)
    }

    /// [`Self::timed_out`], saying so when the server answered, meanwhile, a request id
    /// that Quiver never sent (`stray`): it may be answering with the wrong ids.
    fn timed_out_with(
        &self,
        tool: &str,
        timeout: Duration,
        stray: Option<rmcp::model::RequestId>,
    ) -> Envelope {
        let stray = stray.map_or(String::new(), |id| {
            format!(
                " (meanwhile it answered request id {id}, which Quiver never sent: the server may be answering with the wrong ids, which its operator should look into)"
            )
        });
        Envelope::err(
            ErrKind::Timeout,
            format!(
                "MCP server \"{}\" did not answer `{tool}` within {}{stray}; the call was cancelled upstream",
                self.cfg.name,
                quiver_contract::duration_text(timeout)
            ),
        )
    }

    fn incomplete(&self) -> Envelope {
        Envelope::err(
            ErrKind::ToolFailed,
            format!(
                "mcp call failed: MCP server \"{}\" could not complete the request",
                self.cfg.name
            ),
        )
    }

    /// An HTTP answer to `tool` that arrived but cannot be used (not JSON-RPC, the wrong
    /// content type, too large): what was wrong, and that the tool may have run.
    pub(super) fn unusable(&self, tool: &str, why: &str) -> Envelope {
        Envelope::err(
            ErrKind::ToolFailed,
            format!(
                "MCP server \"{}\" answered `{tool}`, but the answer cannot be used: {why}. The tool may have run: check before calling it again if it changes anything",
                self.cfg.name
            ),
        )
    }

    /// The server answered the call with a JSON-RPC error (`message`, its words unless they
    /// are Quiver's and name it already): which server said it.
    pub(super) fn peer_failed(&self, message: &str) -> Envelope {
        let message = match message.starts_with("MCP server \"") {
            true => message.to_owned(),
            false => format!(
                "MCP server \"{}\" answered with an error: {message}",
                self.cfg.name
            ),
        };
        Envelope::err(ErrKind::ToolFailed, format!("mcp call failed: {message}"))
    }

    /// Waits for the progress and log messages read before an answer to `what` (a
    /// `tools/call` of `name`, or a request labelled `name`) to reach its caller; those that
    /// could not be handed on in time are named to the operator.
    async fn settle(&self, deliveries: &Deliveries, what: &str, name: &str) {
        if let Some(open) = deliveries.settled(SETTLE_STALL, SETTLE_MOST).await {
            tracing::warn!(
                server = %self.cfg.name,
                open,
                "{open} progress or log message(s) that the server sent before its answer to {what} `{name}` were still being handed to the client when the answer went out (none moved on for {} ms, or {} s in all); they reach the client after the answer, or not at all",
                SETTLE_STALL.as_millis(),
                SETTLE_MOST.as_secs()
            );
        }
    }

    fn call_cancelled() -> Envelope {
        Envelope::err(ErrKind::Cancelled, "the call was cancelled")
    }
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
            lean_ids: AtomicU64::new(0),
            relist_pending: Mutex::new(None),
            dial_seq: AtomicU64::new(0),
            relisting: Mutex::new(Relisting::default()),
            malformed: Mutex::new(Vec::new()),
            relays,
            exits: watch::channel(None).0,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.cfg.name
    }

    /// A diagnostic line for the operator that says something was lost or is broken: also
    /// logged as a warning (on `quiver serve`'s stderr by default).
    fn diag_warn(&self, line: impl Into<String>) {
        let line = line.into();
        tracing::warn!(server = %self.cfg.name, "{line}");
        self.push_diag(line);
    }

    fn diag(&self, line: impl Into<String>) {
        let line = line.into();
        tracing::info!(server = %self.cfg.name, "{line}");
        self.push_diag(line);
    }

    fn push_diag(&self, line: String) {
        let mut lines = self.diagnostics.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() >= MAX_DIAGNOSTICS {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    pub(crate) fn diagnostics(&self) -> Vec<String> {
        self.diagnostics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The backoff step after `delay` (the first step without one).
    fn next_backoff(&self, delay: Option<Duration>) -> Duration {
        match delay {
            None => self.opts.backoff_initial,
            Some(d) => (d * 2).min(self.opts.backoff_max),
        }
    }

    pub(crate) fn counters(&self) -> ServerCounters {
        self.counters.snapshot()
    }

    pub(crate) fn child_pids(&self) -> Vec<u32> {
        self.pids.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn last_report(&self) -> RegisterReport {
        let mut report = self
            .last_report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        report.skipped.extend(
            self.malformed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
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
        *self.next_attempt.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the server's command could not be started at the last dial, if it could not.
    /// Every tool name the server listed last, before `allow_tools` and `deny_tools`.
    pub(crate) fn listed_names(&self) -> Vec<String> {
        self.listed_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn cannot_start(&self) -> Option<String> {
        self.cannot_start
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    // ---- connection lifecycle -------------------------------------------------------------

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

    /// How long a call may wait for its answer. The caller's deadline (the dispatcher's
    /// `timeout_secs` or per-tool timeout, which the operator set) bounds it; the client's
    /// default `call_timeout` (120 s) applies only without one, so `timeout_secs = 300` is
    /// not cut to 120 s. A `call_timeout` set on the server still caps it.
    pub(crate) fn call_limit(&self, ctx: &CallContext) -> Duration {
        let left = ctx
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        match (self.cfg.call_timeout, left) {
            (Some(own), Some(left)) => own.min(left),
            (Some(own), None) => own,
            (None, Some(left)) => left,
            (None, None) => self.opts.call_timeout,
        }
    }

    /// How long one connection attempt may take: the server's `connect_timeout`, else the
    /// client's.
    fn connect_timeout(&self) -> Duration {
        self.cfg
            .connect_timeout
            .unwrap_or(self.opts.connect_timeout)
    }

    /// Dials until connected, rejected or closed. A connection lost soon after it came up
    /// left a backoff delay (see [`Upstream::lost`]): the first dial waits it, so a server
    /// that connects and dies is not respawned in a tight loop.
    async fn supervise(self: &Arc<Self>) {
        let seen = self.state.borrow().generation;
        let mut delay: Option<Duration> = *self.backoff.lock().unwrap_or_else(|p| p.into_inner());
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
                *self.next_attempt.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(std::time::SystemTime::now() + d);
                let closed = tokio::select! {
                    _ = tokio::time::sleep(d) => false,
                    _ = self.closed.cancelled() => true,
                };
                *self.next_attempt.lock().unwrap_or_else(|p| p.into_inner()) = None;
                if closed {
                    return;
                }
            }
            match self.dial_shared(seen, delay.is_some()).await {
                Ok(_) | Err(DialError::Closed) => return,
                Err(DialError::Rejected(_)) => return,
                Err(DialError::Transient(_)) => {
                    let next = self.next_backoff(delay);
                    delay = Some(next);
                    *self.backoff.lock().unwrap_or_else(|p| p.into_inner()) = Some(next);
                }
            }
        }
    }

    /// Dials once on behalf of everyone who saw generation `seen` fail: if someone already
    /// reconnected, their connection is returned; if a shared dial for `seen` already failed
    /// (and `force` is off), that failure is returned without dialling again.
    async fn dial_shared(self: &Arc<Self>, seen: u64, force: bool) -> Result<Arc<Conn>, DialError> {
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
                let pending = self
                    .relist_pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take_if(|g| *g == conn.generation);
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
                    DialError::Transient(r) => self.diag(format!("connect failed: {r}")),
                    DialError::Closed => {}
                }
                Err(e)
            }
        }
    }

    /// Marks the connection of generation `generation` as lost (once) and starts the
    /// background reconnect.
    /// Records how the stdio child of `generation` ended, for the operator and for the
    /// message of the calls it was running.
    fn child_exited(&self, generation: u64, status: std::process::ExitStatus, stderr: String) {
        let how = child::exit_text(status);
        let stderr = if stderr.is_empty() {
            String::new()
        } else {
            format!("; its stderr ended with: {stderr}")
        };
        self.diag_warn(format!("the server process {how}{stderr}"));
        self.exits.send_replace(Some((generation, how)));
    }

    fn lost(self: &Arc<Self>, generation: u64) {
        // Quiver closing the client ends every connection: not a loss (an HTTP one's warning
        // was printed at the end of every command that had one).
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
            let mut backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
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

    /// One connection attempt: spawn or open the transport, handshake, check the protocol,
    /// list and publish the tools.
    async fn dial(self: &Arc<Self>) -> Result<(Arc<Conn>, Listing), DialError> {
        let _permit = self
            .dial_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| DialError::Closed)?;
        if self.closed.is_cancelled() {
            return Err(DialError::Closed);
        }
        self.counters.dials.fetch_add(1, Ordering::Relaxed);
        // Every dial has its own generation (a failed one's too), so a late word about a
        // failed dial's connection can never be taken for the next one's.
        let generation = self.dial_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let cancel = self.closed.child_token();
        let handler = Handler {
            up: self.me.clone(),
            generation,
        };
        let mut child_guard: Option<ChildGuard> = None;
        let mut http_parts: Option<(reqwest::Client, http::SessionSlot)> = None;
        let written = Written::for_server(&self.cfg.name);
        let deliveries = Deliveries::default();
        let connect = async {
            match &self.cfg.endpoint {
                Endpoint::Stdio {
                    command,
                    args,
                    env,
                    inherit_env,
                    cwd,
                } => {
                    let spawned = child::spawn(
                        &self.cfg.name,
                        command,
                        args,
                        env,
                        inherit_env,
                        cwd.as_ref(),
                        &self.pids,
                    );
                    let (guard, stdout, stdin) = match spawned {
                        Ok(parts) => {
                            *self.cannot_start.lock().unwrap_or_else(|p| p.into_inner()) = None;
                            parts
                        }
                        Err(e) => {
                            // A missing `cwd` fails the spawn with the same "not found"
                            // as a missing command: say which it is.
                            let why = match cwd.as_ref().filter(|d| !d.is_dir()) {
                                Some(dir) => format!(
                                    "cannot start `{command}`: its working directory `{}` (`cwd`) is not a directory ({e})",
                                    dir.display()
                                ),
                                None => format!("cannot start `{command}`: {e}"),
                            };
                            // Only what an operator must fix (no such command or `cwd`, not
                            // executable); a passing shortage (EMFILE, EAGAIN) is retried.
                            let fixable = matches!(
                                e.kind(),
                                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                            ) || matches!(
                                e.raw_os_error(),
                                Some(libc::ENOEXEC | libc::ENOTDIR)
                            );
                            *self.cannot_start.lock().unwrap_or_else(|p| p.into_inner()) =
                                fixable.then(|| why.clone());
                            return Err(DialError::Transient(why));
                        }
                    };
                    child_guard = Some(guard);
                    let transport = Tracked {
                        inner: super::pipe::PipeTransport::new(&self.cfg.name, stdout, stdin)
                            .marking(written.clone()),
                        written: written.clone(),
                        marks_itself: true,
                        answers: self.roots.clone(),
                        deliveries: deliveries.clone(),
                    };
                    handler
                        .serve_with_ct(transport, cancel.clone())
                        .await
                        .map_err(|e| classify_init(&e, ""))
                }
                Endpoint::Http {
                    url,
                    headers,
                    token,
                    timeout,
                } => {
                    let client = http::client(url, *timeout)
                        .map_err(|e| DialError::Transient(format!("http client: {e}")))?
                        .named(&self.cfg.name)
                        .counting_answers(self.roots.clone());
                    http_parts = Some((client.reqwest().clone(), client.session().clone()));
                    let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                        .reinit_on_expired_session(true)
                        .custom_headers(headers.iter().cloned().collect());
                    if let Some(t) = token {
                        config = config.auth_header(t.0.clone());
                    }
                    let transport = StreamableHttpClientTransport::with_client(client, config);
                    let var = super::config::token_var(&self.cfg.name);
                    let auth = if token.is_some() {
                        format!(
                            "the server did not accept the bearer token from `{var}`; fix it, or give the server the `headers` it expects"
                        )
                    } else {
                        format!(
                            "no bearer token is set; set `{var}` in Quiver's environment, or give the server the `headers` it expects"
                        )
                    };
                    handler
                        .serve_with_ct(transport, cancel.clone())
                        .await
                        .map_err(|e| classify_init(&e, &auth))
                }
            }
        };
        let mut timed_out = false;
        let outcome = tokio::select! {
            r = tokio::time::timeout(self.connect_timeout(), connect) => match r {
                Ok(r) => r,
                Err(_) => {
                    timed_out = true;
                    Err(DialError::Transient(format!(
                        "no answer to initialize within {}", quiver_contract::duration_text(self.connect_timeout())
                    )))
                }
            },
            _ = self.closed.cancelled() => Err(DialError::Closed),
        };
        let running = match outcome {
            Ok(r) => r,
            Err(e) => {
                // A child that failed at start usually said why on stderr (read before the
                // child is told to stop, so that its exit is its own). One that did not
                // answer in time had its input closed when the wait ended: its exit is
                // Quiver's doing, not news.
                let e = match child_guard.as_mut() {
                    Some(g) => e.with_stderr(g, !timed_out).await,
                    None => e,
                };
                cancel.cancel();
                if let Some(mut g) = child_guard {
                    g.shutdown().await;
                }
                return Err(e);
            }
        };
        let peer = running.peer().clone();
        let info = peer.peer_info();
        let (protocol, has_tools_cap, has_resources, has_prompts) = match &info {
            Some(i) => (
                i.protocol_version.to_string(),
                i.capabilities.tools.is_some(),
                i.capabilities.resources.is_some(),
                i.capabilities.prompts.is_some(),
            ),
            None => (String::new(), true, false, false),
        };
        let has_completions = info
            .as_ref()
            .is_some_and(|i| i.capabilities.completions.is_some());
        let has_subscribe = info.as_ref().is_some_and(|i| {
            i.capabilities
                .resources
                .as_ref()
                .is_some_and(|r| r.subscribe == Some(true))
        });
        let fail = async |e: DialError,
                          running: rmcp::service::RunningService<RoleClient, Handler>,
                          child_guard: Option<ChildGuard>| {
            // A child that exited after the handshake (its listing failed with "Transport
            // closed") said why on stderr, and its exit code tells too: read before it is
            // told to stop.
            let mut child_guard = child_guard;
            let e = match child_guard.as_mut() {
                Some(g) => e.with_stderr(g, true).await,
                None => e,
            };
            cancel.cancel();
            let _ = running.cancel().await;
            if let Some(mut g) = child_guard {
                g.shutdown().await;
            }
            Err(e)
        };
        // The handshake offers `Protocol::OFFERED` and accepts any version that has one; a
        // server that answers with another version is rejected.
        let Some(version) = Protocol::parse(&protocol).filter(|p| p.has_session()) else {
            let supported: Vec<&str> = Protocol::ALL
                .into_iter()
                .filter(|p| p.has_session())
                .map(Protocol::as_str)
                .collect();
            return fail(
                DialError::Rejected(format!(
                    "unsupported protocol version {protocol:?} (supported: {})",
                    supported.join(", ")
                )),
                running,
                child_guard,
            )
            .await;
        };
        let tools = if has_tools_cap {
            match tokio::time::timeout(self.connect_timeout(), self.list_tools(&peer)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => return fail(e, running, child_guard).await,
                Err(_) => {
                    let http = matches!(self.cfg.endpoint, Endpoint::Http { .. });
                    return fail(
                        DialError::Transient(format!(
                            "no answer to tools/list within {}{}",
                            quiver_contract::duration_text(self.connect_timeout()),
                            if http {
                                " (over streamable HTTP, an answer that is not valid \
                                 JSON-RPC, such as one nested over 128 levels deep, is \
                                 dropped unread: `QUIVER_LOG=rmcp=debug` shows it)"
                            } else {
                                ""
                            }
                        )),
                        running,
                        child_guard,
                    )
                    .await;
                }
            }
        } else {
            Listing::default()
        };
        let fast = match (&self.cfg.endpoint, http_parts) {
            (
                Endpoint::Http {
                    url,
                    headers,
                    token,
                    ..
                },
                Some((client, session)),
            ) if self.opts.http_fast_lane => fast::Lane::new(
                client,
                url.clone(),
                headers,
                token.as_ref().map(|t| t.0.as_str()),
                version,
                session,
                generation,
                self.connect_timeout(),
            )
            .map(Arc::new),
            _ => None,
        };
        let conn = Arc::new(Conn {
            fast,
            peer,
            generation,
            since: Instant::now(),
            cancel: cancel.clone(),
            has_resources: has_resources && self.cfg.resources,
            has_prompts: has_prompts && self.cfg.prompts,
            has_completions,
            has_subscribe: has_subscribe && has_resources && self.cfg.resources,
            written: matches!(self.cfg.endpoint, Endpoint::Stdio { .. }).then_some(written),
            deliveries,
        });
        // The watcher owns the service and the child: when the connection ends for any
        // reason it reaps the child and reports the drop.
        let me = self.me.clone();
        let ended = cancel.clone();
        let closing = self.closed.clone();
        let watcher = tokio::spawn(async move {
            let waiting = running.waiting();
            tokio::pin!(waiting);
            let mut exit = None;
            if let Some(g) = child_guard.as_mut() {
                tokio::select! {
                    _ = &mut waiting => {
                        // The pipe closed: unless Quiver is closing the server, the child
                        // is exiting (or hung); its status is for the message of the calls
                        // it was running.
                        if !closing.is_cancelled() {
                            exit = tokio::time::timeout(EXIT_WAIT, g.exited()).await.ok().flatten();
                        }
                    }
                    status = g.exited() => {
                        // The child is gone while its pipes are still open: a process it
                        // started holds them. Nothing more will come on them.
                        exit = status;
                        ended.cancel();
                        let _ = waiting.await;
                    }
                }
            } else {
                let _ = waiting.await;
            }
            let tail = child_guard.as_ref().map(ChildGuard::stderr_tail);
            if let Some(mut g) = child_guard {
                // Closed by Quiver (its stdin is closed with the transport): time to exit
                // cleanly. A connection lost or replaced is ended at once.
                if closing.is_cancelled() {
                    g.stop().await;
                } else {
                    g.shutdown().await;
                }
            }
            if let Some(up) = me.upgrade() {
                if let Some(status) = exit {
                    up.child_exited(generation, status, tail.unwrap_or_default());
                }
                up.lost(generation);
            }
        });
        {
            let mut watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
            watchers.retain(|w| !w.is_finished());
            watchers.push(watcher);
        }
        self.counters.connects.fetch_add(1, Ordering::Relaxed);
        self.counters.dials_at_connect.store(
            self.counters.dials.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.diag(format!(
            "connected (protocol {protocol}, {} tool(s))",
            tools.tools.len()
        ));
        self.start_liveness(&conn);
        Ok((conn, tools))
    }

    fn start_liveness(self: &Arc<Self>, conn: &Arc<Conn>) {
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
                        Ok(Ok(_)) => break false,
                        // Refused: the connection is gone (an HTTP server that stopped
                        // listening); rmcp's HTTP worker keeps running all the same.
                        Ok(Err(e)) => {
                            break matches!(classify_service(&e), Class::Drop | Class::Refused);
                        }
                        Err(_) => {
                            let Some(up) = me.upgrade() else { return };
                            let (in_flight, ended) = up.calls.activity();
                            if in_flight == 0 && ended == before {
                                break true;
                            }
                        }
                    }
                };
                if dead {
                    if let Some(up) = me.upgrade() {
                        up.diag("liveness ping failed");
                        up.lost(generation);
                    }
                    return;
                }
            }
        });
    }

    async fn list_tools(&self, peer: &Peer<RoleClient>) -> Result<Listing, DialError> {
        let mut out = Vec::new();
        let mut malformed = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut listed: std::collections::HashMap<String, Value> = std::collections::HashMap::new();
        let mut names = std::collections::BTreeSet::new();
        let mut pages = 0usize;
        loop {
            pages += 1;
            let answer = peer
                .send_request(ClientRequest::ListToolsRequest(
                    rmcp::model::ListToolsRequest::with_param(
                        PaginatedRequestParams::default().with_cursor(cursor.take()),
                    ),
                ))
                .await
                // A JSON-RPC error too: a server still starting may refuse the list for a
                // while; only what retrying cannot change (the protocol version) rejects.
                .map_err(|e| match e {
                    rmcp::service::ServiceError::McpError(d)
                        if d.code.0 == super::pipe::UNREADABLE_ANSWER =>
                    {
                        DialError::Transient(format!("tools/list failed: {}", d.message))
                    }
                    e => DialError::Transient(format!("tools/list failed: {e}")),
                })?;
            let page = read_tools_page(answer).map_err(DialError::Transient)?;
            for wire in page.tools {
                let name = wire.get("name").and_then(Value::as_str).unwrap_or_default();
                if names.len() < self.opts.list_cap {
                    names.insert(name.to_owned());
                }
                if !self.cfg.admits(name) {
                    continue;
                }
                // The same definition again (a server that ignores the cursor repeats its
                // page): listed once. A different one under a taken name is reported.
                if listed.get(name).is_some_and(|w| *w == wire) {
                    continue;
                }
                listed.insert(name.to_owned(), wire.clone());
                if out.len() >= self.opts.list_cap {
                    self.diag_warn(format!(
                        "tools/list returned more than {} tools; the rest are ignored",
                        self.opts.list_cap
                    ));
                    return Ok(Listing {
                        tools: out,
                        malformed,
                        names: names.into_iter().collect(),
                    });
                }
                // One malformed tool costs only itself: the rest are served.
                match to_contract::tool_spec(&self.cfg.name, &self.cfg.prefix, &wire) {
                    Ok(t) => {
                        if let Some(what) = &t.hidden {
                            self.diag_warn(format!(
                                "tool {name:?}: hidden text taken out of {what}; a model would have read it, a person reviewing the tool would not have seen it"
                            ));
                        }
                        if let Some(why) = &t.dropped_output_schema {
                            self.diag_warn(format!(
                                "tool {name:?} is served without its output schema ({why}); its results are passed on unchecked"
                            ));
                        }
                        out.push(t)
                    }
                    Err(e) => {
                        let line = format!("skipped malformed tool {name:?}: {e}");
                        tracing::warn!(server = %self.cfg.name, "{line}");
                        self.diag(line);
                        if malformed.len() < self.opts.list_cap {
                            malformed.push(Skipped::new(
                                self.cfg.family(),
                                name.escape_debug().to_string(),
                                format!("malformed upstream definition: {e}"),
                            ));
                        }
                    }
                }
            }
            match page.next_cursor {
                // A server whose cursor comes round again (or never ends) would be asked
                // forever: what it listed so far is served.
                Some(c) if !c.is_empty() && (seen.contains(&c) || pages >= MAX_LIST_PAGES) => {
                    self.diag_warn(format!(
                        "tools/list paging stopped after {pages} page(s): the cursor {c:?} {}",
                        if seen.contains(&c) {
                            "came round again"
                        } else {
                            "still had more"
                        }
                    ));
                    return Ok(Listing {
                        tools: out,
                        malformed,
                        names: names.into_iter().collect(),
                    });
                }
                Some(c) if !c.is_empty() => {
                    seen.insert(c.clone());
                    cursor = Some(c);
                }
                _ => {
                    return Ok(Listing {
                        tools: out,
                        malformed,
                        names: names.into_iter().collect(),
                    });
                }
            }
        }
    }

    /// Publishes `tools` into the catalog under this server's family: new names are
    /// registered first-wins, changed ones replaced, vanished ones removed.
    fn publish(self: &Arc<Self>, listing: Listing) -> RegisterReport {
        let Listing {
            tools,
            malformed,
            names,
        } = listing;
        *self.listed_names.lock().unwrap_or_else(|p| p.into_inner()) = names;
        let family = self.cfg.family();
        let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        let wanted: BTreeSet<&str> = tools.iter().map(|t| t.spec.name.as_str()).collect();
        let gone: Vec<String> = published
            .keys()
            .filter(|n| !wanted.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if self
                .catalog
                .lookup(&name)
                .is_some_and(|e| *e.family == *family)
            {
                self.catalog.remove(&name);
            }
            published.remove(&name);
        }
        let mut fresh: Vec<Arc<dyn Tool>> = Vec::new();
        let mut fresh_specs = BTreeMap::new();
        for t in tools {
            let tool: Arc<dyn Tool> = Arc::new(McpTool::new(self.clone(), t.clone()));
            match self.catalog.lookup(&t.spec.name) {
                Some(e) if *e.family == *family => {
                    if e.spec != t.spec
                        && let Err(err) = self.catalog.upsert_in(&family, tool)
                    {
                        self.diag_warn(format!("cannot update {}: {err}", t.spec.name));
                        continue;
                    }
                    published.insert(t.spec.name.clone(), t);
                }
                _ => {
                    fresh_specs.insert(t.spec.name.clone(), t);
                    fresh.push(tool);
                }
            }
        }
        let report = self.catalog.register_all(&family, fresh);
        for name in &report.registered {
            if let Some(t) = fresh_specs.remove(name) {
                published.insert(name.clone(), t);
            }
        }
        for line in report.warning_lines() {
            tracing::warn!("{line}");
            self.diag(line);
        }
        *self.last_report.lock().unwrap_or_else(|p| p.into_inner()) = report.clone();
        *self.malformed.lock().unwrap_or_else(|p| p.into_inner()) = malformed;
        report
    }

    /// Re-lists after `notifications/tools/list_changed` on connection `generation`. One
    /// re-list runs at a time: notifications that come while it runs are coalesced into one
    /// more, for the newest generation among them.
    async fn relist(self: Arc<Self>, generation: u64) {
        {
            let mut r = self.relisting.lock().unwrap_or_else(|p| p.into_inner());
            r.wanted = r.wanted.max(Some(generation));
            if r.running {
                return;
            }
            r.running = true;
        }
        let mut running = RelistRunning {
            up: &self,
            armed: true,
        };
        loop {
            let generation = {
                let mut r = self.relisting.lock().unwrap_or_else(|p| p.into_inner());
                match r.wanted.take() {
                    Some(g) => g,
                    None => {
                        r.running = false;
                        running.armed = false;
                        return;
                    }
                }
            };
            self.relist_once(generation).await;
        }
    }

    /// One re-list on connection `generation`; if that connection is still connecting (the
    /// tools changed while it listed them), marked to run once it is up.
    async fn relist_once(self: &Arc<Self>, generation: u64) {
        let conn = {
            // Held while the state is read, so `dial_shared`, which looks here after turning
            // the state Up, either sees the mark or this sees the connection.
            let mut pending = self
                .relist_pending
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match self.conn().filter(|c| c.generation == generation) {
                Some(c) => c,
                None => {
                    if self.state.borrow().generation < generation {
                        *pending = Some(generation);
                    }
                    return;
                }
            }
        };
        self.counters.relists.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.connect_timeout(), self.list_tools(&conn.peer)).await {
            Ok(Ok(listing)) => {
                let n = listing.tools.len();
                self.publish(listing);
                self.diag(format!("tools changed upstream; {n} tool(s) published"));
            }
            // Quiver closing the server, or a connection already replaced or marked down,
            // cut the re-list off: no failure of its own (a reconnect lists afresh, and a
            // close wants none). A server that dies mid-re-list can still be reported here
            // before its watcher marks the connection down.
            Ok(Err(_)) | Err(_)
                if self.closed.is_cancelled()
                    || self.conn().is_none_or(|c| c.generation != generation) =>
            {
                tracing::debug!(server = %self.cfg.name, "a re-list was cut off by the end of its connection");
            }
            Ok(Err(DialError::Rejected(r) | DialError::Transient(r))) => {
                self.diag_warn(format!("re-list after list_changed failed: {r}"));
            }
            Ok(Err(DialError::Closed)) => {}
            Err(_) => self.diag_warn("re-list after list_changed timed out"),
        }
    }

    /// Closes for good: later calls get "closed" without dialling; the child is killed and
    /// reaped before this returns.
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
        // Every connection's watcher kills and reaps its child; wait for all of them.
        let watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(|p| p.into_inner()));
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
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    // ---- calls ------------------------------------------------------------------------------

    /// A connection to send on, waiting for a reconnect already under way (at most the
    /// connect timeout, and never past nine tenths of `limit`, the call's own time, so that
    /// a call that was never sent is not reported as timed out); `Err` is the envelope to
    /// answer with at once.
    async fn ready_conn(&self, limit: Duration) -> Result<Arc<Conn>, Envelope> {
        let mut rx = self.state.subscribe();
        let wait = self.connect_timeout().min(limit.mul_f64(0.9));
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let state = rx.borrow_and_update().state.clone();
            match state {
                State::Up(c) => return Ok(c),
                State::Closed => {
                    return Err(Envelope::err(
                        ErrKind::NotAvailable,
                        format!("MCP server \"{}\" is closed", self.cfg.name),
                    ));
                }
                State::Reconnecting => {
                    match tokio::time::timeout_at(deadline, rx.changed()).await {
                        Ok(Ok(())) => continue,
                        _ => {
                            return Err(Envelope::err(
                                ErrKind::NotAvailable,
                                format!(
                                    "MCP server \"{}\" is reconnecting and was not back within {}; the call was not sent. Try again in a few seconds.",
                                    self.cfg.name,
                                    quiver_contract::duration_text(wait)
                                ),
                            ));
                        }
                    }
                }
                State::Connecting | State::Down | State::Rejected(_) => {
                    return Err(Envelope::err(ErrKind::NotAvailable, self.absence()));
                }
            }
        }
    }

    /// Calls an upstream tool. At most one reconnect per call; a call whose delivery is
    /// unknown is never replayed; the model never sees raw transport text.
    pub(crate) async fn call(
        self: &Arc<Self>,
        tool: &str,
        input: Value,
        ctx: &CallContext,
    ) -> Envelope {
        let mut conn = match self.ready_conn(self.call_limit(ctx)).await {
            Ok(c) => c,
            Err(env) => return env,
        };
        let args = match input {
            Value::Object(m) => Some(m),
            Value::Null => None,
            _ => {
                return Envelope::err(
                    ErrKind::ToolFailed,
                    "mcp call failed: the arguments must be a JSON object",
                );
            }
        };
        let mut reconnected = false;
        loop {
            match self.attempt(&conn, tool, args.clone(), ctx).await {
                Attempt::Done(env) => return *env,
                Attempt::Unknown(status) => {
                    // Over streamable HTTP, one request's stream can break (a proxy's idle
                    // timeout) while the session is fine, and losing the connection would
                    // fail every other call in flight on it: a ping tells which. A stdio
                    // pipe that broke is the connection.
                    // Any JSON-RPC answer to the ping says so, an error too: a server that
                    // does not implement `ping` answers -32601 on a live session.
                    let http = matches!(self.cfg.endpoint, Endpoint::Http { .. });
                    let alive = http
                        && !conn.peer.is_transport_closed()
                        && matches!(
                            Box::pin(tokio::time::timeout(
                                STREAM_CHECK,
                                conn.peer
                                    .send_request(ClientRequest::PingRequest(Default::default())),
                            ))
                            .await,
                            Ok(Ok(_) | Err(rmcp::ServiceError::McpError(_)))
                        );
                    if !alive {
                        self.lost(conn.generation);
                        if !http {
                            return Box::pin(self.child_gone(conn.generation, tool)).await;
                        }
                        return Envelope::err(
                            ErrKind::NotAvailable,
                            format!(
                                "MCP server \"{}\" unavailable; request outcome is unknown",
                                self.cfg.name
                            ),
                        );
                    }
                    // The server is there and answered the request with a status: it
                    // refused it (the session is fine, the ping says so).
                    if let Some(code) = status.and_then(|c| reqwest::StatusCode::from_u16(c).ok()) {
                        return self.refused(tool, code, None);
                    }
                    // The server is there: only this answer was lost on the way.
                    return Envelope::err(
                        ErrKind::NotAvailable,
                        format!(
                            "MCP server \"{}\" did not complete its answer to `{tool}` (the response stream broke); whether it ran is unknown. The server is reachable: check before calling again if the tool changes anything.",
                            self.cfg.name
                        ),
                    );
                }
                Attempt::NotDelivered if !reconnected => {
                    reconnected = true;
                    self.lost(conn.generation);
                    match Box::pin(self.dial_shared(conn.generation, false)).await {
                        Ok(c) => conn = c,
                        Err(DialError::Closed) => {
                            return Envelope::err(
                                ErrKind::NotAvailable,
                                format!("MCP server \"{}\" is closed", self.cfg.name),
                            );
                        }
                        Err(_) => {
                            // The supervisor may have dialled for us; wait for its outcome.
                            match Box::pin(self.ready_conn(self.call_limit(ctx))).await {
                                Ok(c) if c.generation > conn.generation => conn = c,
                                _ => return self.unavailable_after_reconnect(),
                            }
                        }
                    }
                }
                Attempt::NotDelivered => return self.unavailable_after_reconnect(),
            }
        }
    }

    /// The answer to a call whose stdio connection ended under it: how the process ended
    /// when that is known (the watcher records it a moment after the pipe closes).
    async fn child_gone(&self, generation: u64, tool: &str) -> Envelope {
        let mut rx = self.exits.subscribe();
        let how = tokio::time::timeout(
            EXIT_WAIT * 4,
            rx.wait_for(|e| e.as_ref().is_some_and(|(g, _)| *g == generation)),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|e| e.as_ref().map(|(_, how)| how.clone()));
        let what = match how {
            Some(how) => format!("the server process {how}"),
            None => "its connection closed".to_owned(),
        };
        Envelope::err(
            ErrKind::NotAvailable,
            format!(
                "MCP server \"{}\" stopped while `{tool}` was running ({what}); whether the call finished is unknown. Quiver restarts the server: check before calling again if the tool changes anything.",
                self.cfg.name
            ),
        )
    }

    fn unavailable_after_reconnect(&self) -> Envelope {
        Envelope::err(
            ErrKind::NotAvailable,
            format!(
                "MCP server \"{}\" lost its connection, and Quiver's reconnect did not bring it back; the call was not sent. {}",
                self.cfg.name,
                self.retry_advice()
            ),
        )
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

    async fn attempt(
        &self,
        conn: &Conn,
        tool: &str,
        args: Option<serde_json::Map<String, Value>>,
        ctx: &CallContext,
    ) -> Attempt {
        if conn.cancel.is_cancelled() {
            return Attempt::NotDelivered;
        }
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        // The rare paths (a roots sync, rmcp's path) are boxed: inline, their states made
        // this future, which `async_trait` moves into a box for every call, many KiB.
        if self.roots_stale(conn, ctx) {
            Box::pin(self.sync_roots(conn, tool, ctx, self.call_limit(ctx))).await;
        }
        // What the roots' sync took comes out of the call's time.
        let mut timeout = self.call_limit(ctx);
        if let Some(lane) = &conn.fast {
            if let Some(a) = self
                .fast_call(lane, tool, args.as_ref(), ctx, timeout)
                .await
            {
                return a;
            }
            // Handed back unrun: what is left of the caller's deadline.
            if let Some(deadline) = ctx.deadline {
                timeout = timeout.min(deadline.saturating_duration_since(Instant::now()));
            }
        }
        Box::pin(self.rmcp_attempt(conn, tool, args, ctx, timeout)).await
    }

    /// [`Self::attempt`] through rmcp's client: a server without the lean path, or a call
    /// the lean path handed back unrun.
    async fn rmcp_attempt(
        &self,
        conn: &Conn,
        tool: &str,
        args: Option<serde_json::Map<String, Value>>,
        ctx: &CallContext,
        timeout: Duration,
    ) -> Attempt {
        let mut params = rmcp::model::CallToolRequestParams::new(tool.to_owned());
        params.arguments = args;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        // Registered before sending, so a server request the call causes finds it.
        let registration = self.calls.begin(tool, ctx);
        let sent_at = std::time::Instant::now();
        // No rmcp timeout: `wait` keeps the time, so that the cancellation goes out exactly
        // once, whoever ends the wait (see `CancelOnDrop`).
        let handle = match conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(server = %self.cfg.name, error = %e, "call not sent");
                return Attempt::NotDelivered;
            }
        };
        let id = handle.id.clone();
        registration.sent(id.clone(), handle.progress_token.clone());
        // Whether the request surely never left Quiver (stdio: its write never completed).
        let unsent =
            |id: &rmcp::model::RequestId| conn.written.as_ref().is_some_and(|w| !w.take(id));
        let result = match wait(
            &conn.peer,
            handle,
            timeout,
            &ctx.cancel,
            "cancelled by the caller",
        )
        .await
        {
            Waited::Answer(r) => *r,
            Waited::TimedOut => {
                let stray = conn.written.as_ref().and_then(|w| w.stray_since(sent_at));
                return done(self.timed_out_with(tool, timeout, stray));
            }
            Waited::Cancelled => return done(Self::call_cancelled()),
        };
        // The progress and log messages read before the answer reach the caller first.
        self.settle(&conn.deliveries, "tools/call", tool).await;
        match result {
            Ok(ServerResult::CallToolResult(r)) => {
                let wire = serde_json::to_value(&r).unwrap_or(Value::Null);
                done(to_contract::call_result(&wire))
            }
            // rmcp reads a result it cannot read whole as some other result.
            Ok(ServerResult::CustomResult(raw)) => {
                done(to_contract::raw_call_result(&self.cfg.name, &raw.0))
            }
            Ok(ServerResult::EmptyResult(_)) => done(to_contract::raw_call_result(
                &self.cfg.name,
                &Value::Object(Default::default()),
            )),
            Ok(other) => {
                tracing::warn!(server = %self.cfg.name, ?other, "unexpected reply to tools/call");
                done(Envelope::err(
                    ErrKind::ToolFailed,
                    format!(
                        "mcp call failed: MCP server \"{}\" sent an unexpected reply",
                        self.cfg.name
                    ),
                ))
            }
            // A 404 on the resend after a new session (the lean path hands a 404 to rmcp,
            // which takes it for an expired session): the server refused the call itself if
            // the new session answers the ping.
            Err(e) if super::classify::session_expired(&e) => Attempt::Unknown(Some(404)),
            Err(e) => {
                tracing::debug!(server = %self.cfg.name, error = ?e, "call failed");
                match classify_service(&e) {
                    Class::Peer => done(self.peer_failed(&match &e {
                        rmcp::service::ServiceError::McpError(d)
                            if d.code.0 == super::pipe::UNREADABLE_ANSWER =>
                        {
                            format!("{}; the tool may have run", d.message)
                        }
                        e => peer_message(e),
                    })),
                    Class::Timeout => done(self.timed_out(tool, timeout)),
                    // Whether the session survived is the ping's to tell (a re-initialize
                    // refused after an expiry is a status too).
                    Class::Status(code) => Attempt::Unknown(Some(code)),
                    Class::Refused => Attempt::NotDelivered,
                    Class::Drop if unsent(&id) => Attempt::NotDelivered,
                    Class::Drop => Attempt::Unknown(None),
                    Class::Other => done(self.incomplete()),
                }
            }
        }
    }
}

impl Upstream {
    /// A downstream client said its roots changed: if this server holds them, they are
    /// fetched again before its next call.
    pub(crate) fn roots_changed(&self, who: &Who) {
        self.roots.forget(who);
    }

    /// Whether the server holds another client's roots than this call's (or none it should).
    fn roots_stale(&self, conn: &Conn, ctx: &CallContext) -> bool {
        let has_roots = ctx.client.as_ref().is_some_and(|c| c.features().roots);
        self.roots
            .stale_for(conn.generation, &Who::of(ctx), has_roots)
    }

    /// Before a call from a client other than the one whose roots the server holds: tells
    /// the server its roots changed and waits (at most [`REFETCH_WAIT`], and never past the
    /// call's own limit) for it to fetch them again and for the answer to be delivered,
    /// registered as this call so that its `roots/list` reaches this call's client
    /// (`roots.rs`).
    async fn sync_roots(&self, conn: &Conn, label: &str, ctx: &CallContext, limit: Duration) {
        let who = Who::of(ctx);
        let has_roots = ctx.client.as_ref().is_some_and(|c| c.features().roots);
        if !self.roots.stale_for(conn.generation, &who, has_roots) {
            return;
        }
        // Registered while the server fetches, so that its `roots/list` reaches this call's
        // client; one that comes after is answered with none (`list_roots`).
        let registration = self.calls.begin_unsent(label, ctx);
        let notify = async {
            match conn.peer.notify_roots_list_changed().await {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!(server = %self.cfg.name, error = %e, "roots/list_changed not sent");
                    false
                }
            }
        };
        let limit = limit.min(REFETCH_WAIT);
        let sync = async {
            if let Refetch::Asked(mark) = self.roots.refetch(notify, limit).await {
                // The server asked and this call's client has not answered: no longer
                // registered, its request is answered with none; that answer, not the
                // previous client's roots, must reach the server before the call does.
                drop(registration);
                self.roots.settle(mark, limit).await;
            }
        };
        tokio::select! {
            () = sync => {}
            () = ctx.cancel.cancelled() => {}
        }
    }

    /// Sends `request` (a `prompts/get` or `resources/read`) on `conn` on behalf of the
    /// downstream request `ctx` describes: registered as a call in flight under `label`, so a
    /// server request it causes (an elicitation while rendering a prompt) is relayed to
    /// `ctx.client` like a tool call's; `ctx.cancel` cancels it upstream. Bounded by `limit`.
    pub(crate) async fn request_for(
        &self,
        conn: &Conn,
        label: &str,
        request: ClientRequest,
        limit: Duration,
        ctx: &CallContext,
    ) -> Result<ServerResult, ServiceError> {
        let cancelled = || ServiceError::Cancelled {
            reason: Some("cancelled by the client".into()),
        };
        if ctx.cancel.is_cancelled() {
            return Err(cancelled());
        }
        let synced = Instant::now();
        self.sync_roots(conn, label, ctx, limit).await;
        let limit = limit.saturating_sub(synced.elapsed());
        let registration = self.calls.begin(label, ctx);
        // This timeout covers the sending (a stdio child that stops reading its stdin);
        // `wait` the answer.
        let sent = conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options());
        let handle = tokio::time::timeout(limit, sent)
            .await
            .map_err(|_| ServiceError::Timeout { timeout: limit })??;
        registration.sent(handle.id.clone(), handle.progress_token.clone());
        match wait(
            &conn.peer,
            handle,
            limit,
            &ctx.cancel,
            "cancelled by the client",
        )
        .await
        {
            Waited::Answer(r) => {
                // The progress and log messages read before the answer reach the caller
                // first, as a tool call's do.
                self.settle(&conn.deliveries, "request", label).await;
                *r
            }
            Waited::TimedOut => Err(ServiceError::Timeout { timeout: limit }),
            Waited::Cancelled => Err(cancelled()),
        }
    }
}

/// How waiting for the answer to a request rmcp sent ended.
enum Waited {
    /// rmcp finished the request: an answer, an error, or a closed transport.
    Answer(Box<Result<ServerResult, ServiceError>>),
    /// No answer within the limit; the upstream was told.
    TimedOut,
    /// The caller cancelled; the upstream was told.
    Cancelled,
}

/// Waits for the answer to `handle`'s request, at most `limit`, or until `cancel`. The
/// upstream gets `notifications/cancelled` for the request exactly once if it is not
/// answered: on the timeout, on `cancel`, and when this future is dropped (the dispatcher's
/// own timeout, shorter than the call timeout, or a caller gone).
async fn wait(
    peer: &Peer<RoleClient>,
    handle: rmcp::service::RequestHandle<RoleClient>,
    limit: Duration,
    cancel: &CancellationToken,
    cancel_reason: &'static str,
) -> Waited {
    let mut guard = CancelOnDrop {
        peer: peer.clone(),
        id: Some(handle.id.clone()),
        reason: "the caller gave up",
    };
    tokio::select! {
        r = tokio::time::timeout(limit, handle.await_response()) => match r {
            Ok(answer) => {
                guard.id = None;
                Waited::Answer(Box::new(answer))
            }
            Err(_) => {
                guard.reason = "timed out";
                guard.send().await;
                Waited::TimedOut
            }
        },
        _ = cancel.cancelled() => {
            guard.reason = cancel_reason;
            guard.send().await;
            Waited::Cancelled
        }
    }
}

/// How long sending a cancellation may take before it is given up (a child that stopped
/// reading its stdin must not hold a task for ever).
const CANCEL_SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `notifications/cancelled` for a request rmcp sent and nobody waits for any more,
/// unless disarmed (`id` taken): the rmcp counterpart of the lean path's guard.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<rmcp::model::RequestId>,
    reason: &'static str,
}

impl CancelOnDrop {
    fn message(&mut self) -> Option<CancelledNotificationParam> {
        let id = self.id.take()?;
        Some(CancelledNotificationParam::new(
            Some(id),
            Some(self.reason.into()),
        ))
    }

    /// Sends it now (and disarms).
    async fn send(&mut self) {
        if let Some(p) = self.message() {
            let _ = tokio::time::timeout(CANCEL_SEND_TIMEOUT, self.peer.notify_cancelled(p)).await;
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(p) = self.message() else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        rt.spawn(async move {
            let _ = tokio::time::timeout(CANCEL_SEND_TIMEOUT, peer.notify_cancelled(p)).await;
        });
    }
}

/// The text of a JSON-RPC error from the peer (its own words, not transport text).
fn peer_message(e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(d) => d.message.to_string(),
        other => other.to_string(),
    }
}

/// Our rmcp client handler: identifies Quiver (declaring sampling, elicitation and roots,
/// which it relays to the downstream client of the call that asked), re-lists on
/// `tools/list_changed`, and forwards a call's log messages and progress.
pub(crate) struct Handler {
    up: Weak<Upstream>,
    generation: u64,
}

/// The capabilities Quiver declares to every upstream: it can relay sampling, elicitation
/// and roots requests. The connection is shared by all sessions, so the per-call check of
/// what the calling client declared happens when a request arrives; the roots a server
/// holds change with the client it serves (`listChanged`, see `roots.rs`).
fn relayed_capabilities() -> ClientCapabilities {
    serde_json::from_value(serde_json::json!({
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": true},
    }))
    .unwrap_or_default()
}

/// The JSON-RPC error an upstream gets when Quiver cannot relay its request.
fn relay_error(e: ChannelError, method: &str, tool: &str) -> McpError {
    match e {
        // The client's own error, its `data` too (a URL elicitation's -32042 carries the
        // elicitations the upstream should have asked for).
        ChannelError::Client {
            code,
            message,
            data,
        } => McpError::new(
            rmcp::model::ErrorCode(i32::try_from(code).unwrap_or(-32603)),
            message,
            data,
        ),
        ChannelError::Invalid(m) => McpError::invalid_params(m, None),
        ChannelError::Cancelled => McpError::internal_error(
            format!("{method} was abandoned: the call to `{tool}` ended or was cancelled"),
            None,
        ),
        ChannelError::Unsupported(m) | ChannelError::Transport(m) => McpError::invalid_request(
            format!("Quiver could not relay {method} for the call to `{tool}`: {m}"),
            None,
        ),
        other => McpError::internal_error(other.to_string(), None),
    }
}

/// The refusal of a server request made during a call that has no client to ask.
fn nobody_to_ask(method: &str, tool: &str) -> McpError {
    McpError::invalid_request(
        format!(
            "Quiver could not relay {method} for the call to `{tool}`: the call did not come from an MCP client, so there is nobody to ask"
        ),
        None,
    )
}

/// Asks a call's client to answer the server request `method` (MCP wire JSON in and out);
/// an accepted elicitation gets the requested schema's defaults (SEP-1034). Shared by rmcp's
/// handler and the lean path.
async fn ask_channel(
    channel: &Arc<dyn ClientChannel>,
    method: &str,
    params: Value,
) -> Result<Value, ChannelError> {
    match method {
        "sampling/createMessage" => channel.create_message(params).await,
        "elicitation/create" => {
            let asked = params.clone();
            let mut answer = channel.elicit(params).await?;
            super::elicit::apply_defaults(&asked, &mut answer);
            Ok(answer)
        }
        other => Err(ChannelError::Unsupported(format!("{other} is not relayed"))),
    }
}

impl Handler {
    /// Relays a server request to the client of the call it belongs to.
    async fn relay<F, Fut>(
        &self,
        method: &str,
        context: &RequestContext<RoleClient>,
        send: F,
    ) -> Result<Value, McpError>
    where
        F: FnOnce(Arc<dyn ClientChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<Value, ChannelError>>,
    {
        let Some(up) = self.up.upgrade() else {
            return Err(McpError::internal_error("Quiver is shutting down", None));
        };
        let entry = match up.calls.route(&Origin::of(&context.extensions)).await {
            Route::To(e) => e,
            refused => {
                let why = refused.refusal(method);
                // The operator log only: a server could send these without end.
                tracing::info!(server = %up.cfg.name, route = ?refused, "refused {method}: {why}");
                return Err(McpError::invalid_request(why, None));
            }
        };
        let Some(channel) = entry.channel.clone() else {
            return Err(nobody_to_ask(method, &entry.tool));
        };
        tokio::select! {
            r = send(channel) => r.map_err(|e| relay_error(e, method, &entry.tool)),
            _ = entry.done.cancelled() => Err(relay_error(ChannelError::Cancelled, method, &entry.tool)),
            _ = context.ct.cancelled() => Err(McpError::internal_error(format!("{method} was cancelled by the server"), None)),
        }
    }
}

/// The params of a server request rmcp parsed, with the request's `_meta` back in them
/// (rmcp moves it to the request context): what the server sent reaches the client, as on
/// the lean path, which relays the params as they came. Its `progressToken` stays behind:
/// it names the upstream's progress, not the client's.
fn with_meta(mut params: Value, meta: &rmcp::model::RequestMetaObject) -> Value {
    let Ok(Value::Object(meta)) = serde_json::to_value(meta) else {
        return params;
    };
    if let Value::Object(p) = &mut params {
        let into = p
            .entry("_meta")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(into) = into {
            for (k, v) in meta {
                if k != "progressToken" {
                    into.entry(k).or_insert(v);
                }
            }
            if into.is_empty() {
                p.remove("_meta");
            }
        }
    }
    params
}

fn parse_result<T: serde::de::DeserializeOwned>(method: &str, v: Value) -> Result<T, McpError> {
    serde_json::from_value(v).map_err(|e| {
        McpError::internal_error(
            format!("the client's answer to {method} is not a valid result: {e}"),
            None,
        )
    })
}

impl ClientHandler for Handler {
    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some(up) = self.up.upgrade() {
            // No receiver (no downstream session subscribed) is not an error.
            let _ = up.relays.updates.send(params.uri);
        }
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(up) = self.up.upgrade() {
            up.relays
                .relay("notifications/resources/list_changed", None);
        }
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(up) = self.up.upgrade() {
            up.relays.relay("notifications/prompts/list_changed", None);
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(up) = self.up.upgrade() {
            tokio::spawn(up.relist(self.generation));
        }
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, McpError> {
        let method = "sampling/createMessage";
        let mut params = with_meta(
            serde_json::to_value(&params).unwrap_or(Value::Null),
            &context.meta,
        );
        crate::floats::decimal_sampling_floats(&mut params);
        let v = self
            .relay(method, &context, |c| async move {
                ask_channel(&c, method, params).await
            })
            .await?;
        parse_result(method, v)
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let method = "elicitation/create";
        let params = with_meta(
            serde_json::to_value(&params).unwrap_or(Value::Null),
            &context.meta,
        );
        let v = self
            .relay(method, &context, |c| async move {
                ask_channel(&c, method, params).await
            })
            .await?;
        parse_result(method, v)
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, McpError> {
        // Fails closed: whatever keeps this call's client from answering (no call in flight
        // or several, no client, its error, its answer too late or unreadable) answers none,
        // so the server never keeps the roots of the client before (`roots.rs`).
        let Some(up) = self.up.upgrade() else {
            return Err(McpError::internal_error("Quiver is shutting down", None));
        };
        up.roots.asked();
        let (answer, who) = match up.calls.route(&Origin::of(&context.extensions)).await {
            Route::To(entry) => {
                let answer = tokio::select! {
                    r = roots_of(entry.channel.as_ref()) => r.ok(),
                    _ = entry.done.cancelled() => None,
                    _ = context.ct.cancelled() => None,
                };
                (answer, entry.who.clone())
            }
            refused => {
                tracing::info!(server = %up.cfg.name, route = ?refused, "roots/list answered with none: {}", refused.refusal("roots/list"));
                (None, Who::Unnamed)
            }
        };
        let answer = up.roots.answer(self.generation, answer, who);
        Ok(serde_json::from_value(answer).unwrap_or_default())
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        mut context: NotificationContext<RoleClient>,
    ) {
        let up = self.up.clone();
        // In the server's order: rmcp runs each notification's handler in a task of its own.
        let ticket = context.extensions.remove::<Delivering>();
        in_turn(ticket, async move {
            let Some(up) = up.upgrade() else { return };
            if let Some(channel) = up
                .calls
                .by_progress(&params.progress_token)
                .await
                .and_then(|e| e.channel.clone())
            {
                channel
                    .progress(params.progress, params.total, params.message)
                    .await;
            }
        })
        .await;
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        mut context: NotificationContext<RoleClient>,
    ) {
        let up = self.up.clone();
        let ticket = context.extensions.remove::<Delivering>();
        in_turn(ticket, async move {
            let Some(up) = up.upgrade() else { return };
            // A notification names no request: it goes to the single call in flight, if
            // any; otherwise only the operator log sees it.
            let entry = match up.calls.route(&Origin::Unknown).await {
                Route::To(entry) => Some(entry),
                _ => None,
            };
            deliver_log(
                entry.as_ref().and_then(|e| e.channel.as_ref()),
                &up.cfg.name,
                params,
            )
            .await;
        })
        .await;
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            relayed_capabilities(),
            Implementation::new("quiver", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(Protocol::OFFERED.rmcp())
    }
}

/// An upstream log message to the calling client, or, without one, to the operator log.
async fn deliver_log(
    channel: Option<&Arc<dyn ClientChannel>>,
    server: &str,
    params: LoggingMessageNotificationParam,
) {
    match channel {
        Some(c) => {
            c.log(
                crate::wire::from_mcp_level(params.level),
                params.logger.as_deref(),
                params.data,
            )
            .await;
        }
        None => tracing::info!(
            server = %server,
            level = ?params.level,
            logger = params.logger.as_deref().unwrap_or(""),
            "upstream log: {}",
            params.data
        ),
    }
}

fn done(envelope: Envelope) -> Attempt {
    Attempt::Done(Box::new(envelope))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's error reaches the upstream whole: code, message and `data` (a URL
    /// elicitation's -32042 lists the elicitations the upstream should make).
    #[test]
    fn a_clients_error_is_relayed_with_its_data() {
        let data = serde_json::json!({"elicitations": [{"mode": "url", "elicitationId": "e1"}]});
        let relayed = relay_error(
            ChannelError::Client {
                code: -32042,
                message: "this request requires more information".into(),
                data: Some(data.clone()),
            },
            "elicitation/create",
            "tool",
        );
        assert_eq!(relayed.code.0, -32042);
        assert_eq!(relayed.message, "this request requires more information");
        assert_eq!(relayed.data, Some(data));
    }

    /// A stdio upstream's sampling request reaches the client with its `_meta` (rmcp moved
    /// it to the request context; the lean HTTP path keeps it in the params).
    #[test]
    fn a_relayed_request_keeps_its_meta() {
        let meta: rmcp::model::RequestMetaObject =
            serde_json::from_value(serde_json::json!({"custom/key": "v1", "progressToken": 3}))
                .unwrap();
        let params = with_meta(serde_json::json!({"messages": [], "maxTokens": 5}), &meta);
        assert_eq!(
            params,
            serde_json::json!({"messages": [], "maxTokens": 5, "_meta": {"custom/key": "v1"}})
        );
        let none: rmcp::model::RequestMetaObject =
            serde_json::from_value(serde_json::json!({"progressToken": 3})).unwrap();
        assert_eq!(
            with_meta(serde_json::json!({"maxTokens": 5}), &none),
            serde_json::json!({"maxTokens": 5})
        );
    }
}
