//! The MCP client: connects to upstream servers and publishes their tools into the catalog.
//!
//! [`McpClient::start`] returns at once; each server connects in the background (at most 16
//! dials at a time, each bounded by the connect timeout), is retried with exponential backoff
//! while unreachable (at once, then 1 s doubling to 30 s), and publishes its tools the moment
//! it connects. Calls to a server that is down fail at once with `NotAvailable`; a dropped
//! connection is re-dialled once, shared by every call that saw it drop (after the next
//! backoff step when it was lost within 30 s of coming up).
//!
//! Protocol versions (`crate::protocol`): the handshake offers 2025-11-25 (`Protocol::OFFERED`)
//! and accepts an upstream on any version that has a handshake (2024-11-05 to 2025-11-25);
//! any other answer is a rejection.

mod child;
mod classify;
mod config;
mod delivery;
mod elicit;
mod findings;
mod h1;
mod http;
mod meta;
mod passthrough;
mod pipe;
mod roots;
mod route;
mod session;
mod to_contract;
mod tool;
mod upstream;
mod users;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use quiver_registry::{Catalog, RegisterReport};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use config::{
    DEFAULT_MAX_USER_CONNECTIONS, DEFAULT_USER_IDLE_TIMEOUT, INHERITED_ENV, Liveness,
    McpClientConfig, ResolvedServer, SESSION_IDLE_TIMEOUT, SESSION_MAX_PER_PRINCIPAL, ServerConfig,
    ServerScope, TransportKind, UpstreamAuth, check_delegation, interpolate_env, redact_urls,
    validate_all,
};
pub use findings::{
    comparable_definitions, connection_findings, server_list_findings, session_command_findings,
    token_findings, unconnected_server_of,
};
pub use meta::{RESOURCE_TOOLS, RESOURCE_TOOLS_FAMILY};
pub use session::SessionServerStatus;
pub use upstream::{ServerCounters, ServerState};

use crate::McpError;
use crate::sync::lock;
use upstream::Upstream;

/// Client-wide settings; the defaults are the documented ones.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Bound on one connection attempt (spawn or HTTP handshake, initialize, tools/list).
    pub connect_timeout: Duration,
    /// Default per-call timeout.
    pub call_timeout: Duration,
    /// Default liveness interval.
    pub liveness: Liveness,
    /// First retry delay after a failed attempt (the very first retry is immediate).
    pub backoff_initial: Duration,
    /// Retry delay cap.
    pub backoff_max: Duration,
    /// Dials in flight at once.
    pub max_concurrent_dials: usize,
    /// Cap on entries taken from any list (tools, resources).
    pub list_cap: usize,
    /// Streamable-HTTP upstreams: `tools/call` takes the direct path, posted by the calling
    /// task instead of through rmcp's transport worker (see `client/upstream/direct.rs`); on
    /// by default.
    pub http_direct_path: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(120),
            liveness: Liveness::Every(Duration::from_secs(15)),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            max_concurrent_dials: 16,
            list_cap: 10_000,
            http_direct_path: true,
        }
    }
}

impl ClientOptions {
    /// Sets the connect timeout.
    pub fn with_connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Sets the default call timeout.
    pub fn with_call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }

    /// Sets the default liveness.
    pub fn with_liveness(mut self, l: Liveness) -> Self {
        self.liveness = l;
        self
    }

    /// Turns the direct `tools/call` path for streamable-HTTP upstreams on or off.
    pub fn with_http_direct_path(mut self, on: bool) -> Self {
        self.http_direct_path = on;
        self
    }

    /// Sets the backoff (first delay, cap).
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max;
        self
    }
}

/// One server as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStatus {
    /// Its name.
    pub name: String,
    /// Whose credentials its calls carry.
    pub auth: UpstreamAuth,
    /// A server that acts for the user: the users with a connection of their own now, and
    /// the connections opened for users so far.
    pub users: Option<(usize, u64)>,
    /// Its state.
    pub state: ServerState,
    /// Its counters.
    pub counters: ServerCounters,
    /// Its tools now in the catalog.
    pub tools: Vec<String>,
    /// Operator-facing lines (connects, drops, "reconnecting", rejections), oldest first;
    /// the last 100.
    pub diagnostics: Vec<String>,
    /// The stdio children it has spawned and not yet reaped.
    pub child_pids: Vec<u32>,
    /// When a server that is down is dialled next (`None` while a dial is under way, and
    /// in every other state).
    pub next_attempt: Option<std::time::SystemTime>,
    /// Why its command could not be started at the last dial (not found, not executable):
    /// a stdio server only an operator can bring up. `None` once a dial starts it.
    pub cannot_start: Option<String>,
    /// Every tool name it listed last, before `allow_tools` and `deny_tools` (empty until
    /// it has listed): what those keys are checked against.
    pub listed: Vec<String>,
}

pub(crate) struct Shared {
    catalog: Arc<Catalog>,
    opts: Arc<ClientOptions>,
    dial_permits: Arc<Semaphore>,
    closed: CancellationToken,
    /// Name -> (the order it was added in, the server).
    servers: Mutex<BTreeMap<String, (usize, Arc<Upstream>)>>,
    /// The order the next server added gets.
    next_order: std::sync::atomic::AtomicUsize,
    meta_registered: Mutex<bool>,
    /// What `quiver serve` passes through: routing indexes and subscription counts.
    passthrough: passthrough::State,
    /// The per-session servers (`scope = "session"`) and their processes.
    sessions: Arc<session::SessionPool>,
    /// The token exchange of servers with `auth = "exchange"` (set by the host).
    exchanger: users::ExchangerSlot,
    /// Servers an operator disabled ([`McpClient::disable_server`]), with their settings,
    /// by name: closed, and left out of a reload until enabled again.
    disabled: Mutex<BTreeMap<String, ResolvedServer>>,
}

impl Shared {
    /// Every server, in the order they were added (the configuration's): where two
    /// servers offer one thing (a resource URI, a bare prompt name), the first has it.
    fn servers(&self) -> Vec<Arc<Upstream>> {
        let mut all: Vec<(usize, Arc<Upstream>)> = lock(&self.servers).values().cloned().collect();
        all.sort_by_key(|(order, _)| *order);
        all.into_iter().map(|(_, up)| up).collect()
    }

    fn server(&self, name: &str) -> Option<Arc<Upstream>> {
        lock(&self.servers).get(name).map(|(_, up)| up.clone())
    }

    /// The servers passing resources through that `caps` allows: the one rule for the
    /// passthrough and the resource meta-tools.
    fn resource_servers(&self, caps: &quiver_contract::Capabilities) -> Vec<Arc<Upstream>> {
        let mut servers = self.servers();
        servers.retain(|u| u.cfg.resources && caps.allows_server(u.name()));
        servers
    }

    /// The servers passing prompts through that `caps` allows: the one rule for the
    /// passthrough and `/mcp__...` expansion.
    fn prompt_servers(&self, caps: &quiver_contract::Capabilities) -> Vec<Arc<Upstream>> {
        let mut servers = self.servers();
        servers.retain(|u| u.cfg.prompts && caps.allows_server(u.name()));
        servers
    }
}

/// What [`McpClient::reconcile`] did, by server name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciled {
    /// Servers added (connecting in the background).
    pub added: Vec<String>,
    /// Servers closed, their tools gone.
    pub removed: Vec<String>,
    /// Servers whose settings changed: closed and added again.
    pub restarted: Vec<String>,
    /// Servers left alone.
    pub unchanged: Vec<String>,
}

impl Reconciled {
    /// Whether any server was added, removed or restarted.
    pub fn changed(&self) -> bool {
        !(self.added.is_empty() && self.removed.is_empty() && self.restarted.is_empty())
    }
}

/// The client side of Quiver's MCP adapter: owns every upstream connection and the tools
/// they publish. Cheap to clone.
#[derive(Clone)]
pub struct McpClient {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for McpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpClient")
            .field("servers", &self.shared.servers().len())
            .finish()
    }
}

impl McpClient {
    /// A client publishing into `catalog`, with no servers yet.
    pub fn new(catalog: Arc<Catalog>, opts: ClientOptions) -> Self {
        let permits = opts.max_concurrent_dials.max(1);
        let opts = Arc::new(opts);
        let dial_permits = Arc::new(Semaphore::new(permits));
        let closed = CancellationToken::new();
        let sessions = session::SessionPool::new(
            catalog.clone(),
            opts.clone(),
            dial_permits.clone(),
            closed.clone(),
        );
        let shared = Arc::new(Shared {
            catalog,
            opts,
            dial_permits,
            closed,
            servers: Mutex::new(BTreeMap::new()),
            next_order: std::sync::atomic::AtomicUsize::new(0),
            meta_registered: Mutex::new(false),
            passthrough: passthrough::State::default(),
            sessions,
            exchanger: Arc::default(),
            disabled: Mutex::new(BTreeMap::new()),
        });
        let weak = Arc::downgrade(&shared);
        shared
            .catalog
            .add_absent_explainer(Arc::new(move |name| why_absent(&*weak.upgrade()?, name)));
        McpClient { shared }
    }

    /// A client with `servers` added (see [`McpClient::add_server`]); returns at once.
    /// Must be called inside a tokio runtime.
    pub fn start(catalog: Arc<Catalog>, servers: Vec<ResolvedServer>, opts: ClientOptions) -> Self {
        let client = McpClient::new(catalog, opts);
        for s in servers {
            // Names were checked unique by `validate_all`.
            let _ = client.add_server(s);
        }
        client
    }

    /// Adds a server and starts connecting it in the background; returns at once. Its
    /// tools are registered first-wins under family `mcp:<name>` when it connects.
    pub fn add_server(&self, server: ResolvedServer) -> Result<(), McpError> {
        if self.shared.closed.is_cancelled() {
            return Err(McpError::Closed);
        }
        let mut servers = lock(&self.shared.servers);
        if servers
            .keys()
            .cloned()
            .chain(self.shared.sessions.names())
            .any(|n| n.eq_ignore_ascii_case(&server.name))
        {
            return Err(McpError::Config(format!(
                "an MCP server named \"{}\" (ignoring case) is already added",
                server.name
            )));
        }
        if server.scope == ServerScope::Session {
            self.shared.sessions.add(server);
            return Ok(());
        }
        let weak = Arc::downgrade(&self.shared);
        let name = server.name.clone();
        let relays = upstream::Relays {
            updates: self.shared.passthrough.updates.clone(),
            lists: self.shared.passthrough.lists.clone(),
            server: server.name.as_str().into(),
        };
        let (has_resources, has_prompts) = (server.resources, server.prompts);
        let lists = relays.clone();
        let up = Upstream::new(
            server,
            self.shared.opts.clone(),
            self.shared.catalog.clone(),
            self.shared.dial_permits.clone(),
            self.shared.closed.child_token(),
            Box::new(move || {
                if let Some(shared) = weak.upgrade() {
                    meta::ensure_registered(&shared);
                    passthrough::resubscribe(&shared, &name);
                }
                // A server coming (back) changes what the merged lists hold.
                if has_resources {
                    lists.list_changed(crate::content::ListChange::Resources);
                }
                if has_prompts {
                    lists.list_changed(crate::content::ListChange::Prompts);
                }
            }),
            relays,
        );
        if up.cfg.auth.per_user() {
            up.set_users(users::UserConnections::start(
                up.cfg.clone(),
                self.shared.opts.clone(),
                self.shared.dial_permits.clone(),
                self.shared.closed.child_token(),
                self.shared.exchanger.clone(),
            ));
        }
        let order = self
            .shared
            .next_order
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        servers.insert(up.name().to_owned(), (order, up.clone()));
        drop(servers);
        up.start_supervisor();
        Ok(())
    }

    /// Sets how servers with `auth = "exchange"` get a token for the user: RFC 8693 token
    /// exchange at the issuer (the host's OIDC adapter). Set once; later calls do nothing.
    pub fn set_token_exchanger(
        &self,
        exchanger: Arc<dyn quiver_registry::identity::TokenExchanger>,
    ) {
        let _ = self.shared.exchanger.set(exchanger);
    }

    /// The users with a connection of their own to server `name` now, and the connections
    /// opened for users so far; `None` for a server that does not act for the user.
    pub fn user_connections(&self, name: &str) -> Option<(usize, u64)> {
        let up = self.shared.server(name)?;
        let users = up.users()?;
        Some((users.len(), users.opened()))
    }

    /// Waits until every `required` server has connected and its connect hook has run (the
    /// resource tools it brings are in the catalog), or `timeout` passes. A required
    /// server's rejection (unauthorized, unsupported protocol) stops its
    /// retries and is returned as [`McpError::Rejected`].
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), McpError> {
        let deadline = tokio::time::Instant::now() + timeout;
        for up in self.shared.servers() {
            if !up.cfg.required {
                continue;
            }
            // Subscribed before each look at the state, so no change is missed.
            let mut rx = up.state_changes();
            loop {
                match up.state() {
                    ServerState::Connected if up.settled() => break,
                    ServerState::Rejected(reason) => {
                        return Err(McpError::Rejected {
                            server: up.name().to_owned(),
                            reason,
                        });
                    }
                    ServerState::Closed => return Err(McpError::Closed),
                    // Its command cannot be started (missing, not executable, a bad
                    // `cwd`): waiting out the timeout would not change that.
                    ServerState::Down | ServerState::Reconnecting
                        if let Some(why) = up.cannot_start() =>
                    {
                        return Err(McpError::NotReady {
                            server: up.name().to_owned(),
                            reason: format!("its command cannot start: {why}"),
                        });
                    }
                    other => {
                        if tokio::time::Instant::now() >= deadline {
                            let last = up.diagnostics().pop().unwrap_or_default();
                            return Err(McpError::NotReady {
                                server: up.name().to_owned(),
                                reason: format!(
                                    "{other:?} after {}; {last}",
                                    quiver_contract::duration_text(timeout)
                                ),
                            });
                        }
                        let _ = tokio::time::timeout_at(deadline, rx.changed()).await;
                    }
                }
            }
        }
        Ok(())
    }

    /// The latest registration report of every server (first-wins: names another family
    /// already holds are skipped and named), merged; its `warning_lines` are what the host
    /// logs, e.g. `mcp:github: skipped duplicate tool name(s) (2): a, b`.
    pub fn register_report(&self) -> RegisterReport {
        let mut report = RegisterReport::default();
        for up in self.shared.servers() {
            report.extend(up.last_report());
        }
        report
    }

    /// Every server's status.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.shared
            .servers()
            .iter()
            .map(|up| ServerStatus {
                name: up.name().to_owned(),
                state: up.state(),
                counters: up.counters(),
                tools: up.published_names().into_iter().collect(),
                diagnostics: up.diagnostics(),
                child_pids: up.child_pids(),
                next_attempt: up.next_attempt(),
                cannot_start: up.cannot_start(),
                listed: up.listed_names(),
                auth: up.cfg.auth,
                users: up.users().map(|u| (u.len(), u.opened())),
            })
            .collect()
    }

    /// Why the required servers cannot serve calls now: one line per required server that is
    /// not connected (the others, optional, never make the process unready).
    pub fn required_not_ready(&self) -> Vec<String> {
        self.shared
            .servers()
            .iter()
            .filter(|up| up.cfg.required)
            .filter_map(|up| {
                // Words only: a rejection's reason is the upstream's text, for the operator's
                // `quiver status` and log, not for an unauthenticated probe.
                let state = match up.state() {
                    ServerState::Connected => return None,
                    ServerState::Connecting => "connecting",
                    ServerState::Reconnecting => "reconnecting",
                    ServerState::Down => "down",
                    ServerState::Rejected(_) => "rejected (see `quiver status`)",
                    ServerState::Closed => "closed",
                };
                Some(format!("required MCP server \"{}\" is {state}", up.name()))
            })
            .collect()
    }

    /// One server's status.
    pub fn server_status(&self, name: &str) -> Option<ServerStatus> {
        self.status().into_iter().find(|s| s.name == name)
    }

    /// Expands `/mcp__<server>__<prompt> key=value ...` through the server's prompt and
    /// returns the rendered text (messages joined by blank lines). `Ok(None)` when `input`
    /// is not such a command or names no known server, or a server `ctx`'s capabilities do
    /// not reach ([`Capabilities::allows_server`](quiver_contract::Capabilities::allows_server)):
    /// the same bound as `prompts/get`. Values may be double-quoted. A request the server
    /// makes while rendering (an elicitation) goes to `ctx.client`, refused without one;
    /// `ctx.cancel` cancels the rendering upstream.
    pub async fn expand_prompt(
        &self,
        input: &str,
        ctx: &quiver_contract::CallContext,
    ) -> Result<Option<String>, McpError> {
        meta::expand_prompt(&self.shared, input, ctx).await
    }

    /// Closes and forgets the server `name` (its child stopped and reaped, its tools
    /// removed from the catalog); the others are untouched. False when there is none.
    pub async fn remove_server(&self, name: &str) -> bool {
        let removed = lock(&self.shared.servers).remove(name);
        let Some((_, up)) = removed else {
            return self.shared.sessions.remove(name).await;
        };
        up.retire().await;
        let lists = &self.shared.passthrough.lists;
        let server: Arc<str> = name.into();
        for (on, list) in [
            (up.cfg.resources, crate::content::ListChange::Resources),
            (up.cfg.prompts, crate::content::ListChange::Prompts),
        ] {
            if on {
                let _ = lists.send(crate::content::ListChanged::of(list, server.clone()));
            }
        }
        true
    }

    /// The settings of the configured server `name`, shared or per session.
    fn configured(&self, name: &str) -> Option<ResolvedServer> {
        match self.shared.server(name) {
            Some(up) => Some(up.cfg.clone()),
            None => self
                .shared
                .sessions
                .configs()
                .into_iter()
                .find(|s| s.name == name),
        }
    }

    /// Closes the server `name` and dials it again with the same settings, as a reload that
    /// changed it would (its tools leave the catalog and come back when it lists them).
    /// `Ok(false)` when there is no such server.
    pub async fn restart_server(&self, name: &str) -> Result<bool, McpError> {
        let Some(cfg) = self.configured(name) else {
            return Ok(false);
        };
        self.remove_server(name).await;
        self.add_server(cfg)?;
        Ok(true)
    }

    /// Closes the server `name` and keeps it closed (an operator's switch, the admin
    /// page's): its tools leave the catalog, and a reload leaves it out while its settings
    /// stay configured, until [`McpClient::enable_server`]; a restart of the process
    /// connects it again. `Ok(false)` when there is no such server; disabling a disabled
    /// one changes nothing.
    pub async fn disable_server(&self, name: &str) -> Result<bool, McpError> {
        if lock(&self.shared.disabled).contains_key(name) {
            return Ok(true);
        }
        let Some(cfg) = self.configured(name) else {
            return Ok(false);
        };
        self.remove_server(name).await;
        lock(&self.shared.disabled).insert(name.to_owned(), cfg);
        Ok(true)
    }

    /// Connects a server [`McpClient::disable_server`] closed again, with its settings
    /// (the latest reload's). `Ok(false)` when no server of that name is disabled.
    pub fn enable_server(&self, name: &str) -> Result<bool, McpError> {
        let Some(cfg) = lock(&self.shared.disabled).remove(name) else {
            return Ok(false);
        };
        self.add_server(cfg)?;
        Ok(true)
    }

    /// The servers an operator disabled, by name.
    pub fn disabled_servers(&self) -> Vec<String> {
        lock(&self.shared.disabled).keys().cloned().collect()
    }

    /// Brings the servers in line with `servers` (a configuration reload): a server no
    /// longer there is removed, a new one added, one whose settings changed is closed and
    /// added again; an unchanged one is left alone (no reconnect, its calls undisturbed).
    pub async fn reconcile(&self, servers: Vec<ResolvedServer>) -> Result<Reconciled, McpError> {
        let current: BTreeMap<String, ResolvedServer> = self
            .shared
            .servers()
            .into_iter()
            .map(|up| up.cfg.clone())
            .chain(self.shared.sessions.configs())
            .map(|cfg| (cfg.name.clone(), cfg))
            .collect();
        let mut done = Reconciled::default();
        let wanted: std::collections::BTreeSet<String> =
            servers.iter().map(|s| s.name.clone()).collect();
        // A disabled server stays closed with the settings reloaded, and is forgotten
        // when the configuration drops it.
        let mut servers = servers;
        {
            let mut disabled = lock(&self.shared.disabled);
            disabled.retain(|name, _| {
                let kept = wanted.contains(name);
                if !kept {
                    done.removed.push(name.clone());
                }
                kept
            });
            servers.retain(|s| match disabled.get_mut(&s.name) {
                Some(held) => {
                    *held = s.clone();
                    done.unchanged.push(s.name.clone());
                    false
                }
                None => true,
            });
        }
        for name in current.keys().filter(|n| !wanted.contains(n.as_str())) {
            self.remove_server(name).await;
            done.removed.push(name.clone());
        }
        for server in servers {
            match current.get(&server.name) {
                Some(old) if *old == server => done.unchanged.push(server.name),
                Some(_) => {
                    self.remove_server(&server.name).await;
                    let name = server.name.clone();
                    self.add_server(server)?;
                    done.restarted.push(name);
                }
                None => {
                    let name = server.name.clone();
                    self.add_server(server)?;
                    done.added.push(name);
                }
            }
        }
        Ok(done)
    }

    /// Closes every server for good, all at once: children stopped (stdin closed, then
    /// SIGTERM, then SIGKILL to the process group) and reaped, tools removed; later calls
    /// answer "closed" without dialling.
    pub async fn close(&self) {
        self.shared.closed.cancel();
        let servers = self.shared.servers();
        futures::future::join_all(servers.iter().map(|up| up.close())).await;
        self.shared.sessions.close().await;
        meta::unregister(&self.shared);
    }

    /// The per-session servers (`scope = "session"`), in configuration order.
    pub fn per_session_servers(&self) -> Vec<String> {
        self.shared.sessions.names()
    }

    /// Every running process of a per-session server (`scope = "session"`), by server and
    /// session.
    pub fn session_servers(&self) -> Vec<SessionServerStatus> {
        self.shared.sessions.status()
    }
}

/// Why `name`, under the prefix of one of this client's servers, is not in the catalog:
/// the server is not up (a tool of a connected server that does not offer it is simply
/// unknown). Words for the model: the reason of a rejection stays in the operator's log.
fn why_absent(shared: &Shared, name: &str) -> Option<String> {
    // The server whose `mcp__<prefix>__` the name starts with; the longest prefix when
    // several do (`git` and `git_` both start `mcp__git___status`).
    let (up, tool) = shared
        .servers()
        .into_iter()
        .filter(|up| !up.cfg.prefix.is_empty())
        .filter_map(|up| {
            let tool = name
                .strip_prefix("mcp__")?
                .strip_prefix(up.cfg.prefix.as_str())?
                .strip_prefix("__")?
                .to_owned();
            Some((up, tool))
        })
        .max_by_key(|(up, _)| up.cfg.prefix.len())?;
    // A server that has listed its tools keeps them in the catalog while it is down (they
    // answer `not_available` themselves): a name it never listed is unknown, with
    // look-alikes.
    if !up.cfg.admits(&tool) || up.counters().connects > 0 {
        return None;
    }
    match up.state() {
        ServerState::Connected | ServerState::Closed => None,
        _ => Some(up.absence()),
    }
}
