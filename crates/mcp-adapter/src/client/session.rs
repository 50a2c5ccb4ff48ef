//! Per-session MCP servers (`scope = "session"`): one process of the server for each MCP
//! session that uses it, given that session's roots and no one else's.
//!
//! - **Start**: at the session's first `tools/list` or `tools/call` ([`SessionPool::open`],
//!   which the server calls through the `SessionServers` port and which waits for the
//!   process to list its tools), or at a call of one of its tools after it idled out.
//! - **Roots**: the process is an upstream of its own whose `roots/list` is answered with
//!   its session's roots (`roots::SessionLink`), through the channel of the session's latest
//!   request; the session's `notifications/roots/list_changed` is passed on to it.
//! - **Tools**: each process lists into a catalog of its own. The shared catalog holds one
//!   [`SessionTool`] per tool name, in the client-MCP family (after the server-global MCP
//!   servers, before custom tools and skills; first registration wins, skipped names are
//!   logged), registered when a process of the server first lists it (as it connects, or
//!   after its `tools/list_changed`). A call reaches the
//!   calling session's own process, and only it; a call with no MCP session (a 2026-07-28
//!   request, `quiver call`) is refused in words.
//! - **Stop**: when the session ends ([`McpSession::ended`]), after `idle_timeout` without a
//!   call, at a reload that changes or removes the server, and at shutdown: the child is
//!   stopped and reaped as any upstream's (stdin closed, SIGTERM, SIGKILL to its group).
//! - **Cap**: at most `max_per_principal` processes of one server per principal (the
//!   inbound token's name; `anonymous` without one); a session over it gets its tools'
//!   calls refused, naming the cap.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use quiver_contract::{
    CallContext, ClientChannel, Envelope, ErrKind, McpSession, Tool, ToolResult, ToolSpec,
    duration_text, quoted_name,
};
use quiver_registry::{Catalog, Family};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{
    ClientOptions, ServerState,
    config::ResolvedServer,
    roots::SessionLink,
    upstream::{Relays, Upstream},
};
use crate::sync::lock;

/// The principal of a session whose requests carry no token.
const ANONYMOUS: &str = "anonymous";

/// The per-session servers of one MCP client, and their processes.
pub(crate) struct SessionPool {
    catalog: Arc<Catalog>,
    opts: Arc<ClientOptions>,
    dial_permits: Arc<Semaphore>,
    closed: CancellationToken,
    /// The per-session servers, in configuration order.
    servers: Mutex<Vec<ResolvedServer>>,
    state: Mutex<HashMap<Arc<str>, SessionEntry>>,
    /// The tool names each server's processes have registered in the shared catalog.
    templates: Mutex<BTreeMap<String, BTreeSet<String>>>,
    me: Weak<SessionPool>,
}

/// One session's processes.
struct SessionEntry {
    principal: Arc<str>,
    link: Arc<SessionLink>,
    /// Running processes, by server name.
    instances: BTreeMap<String, Arc<Instance>>,
    /// Servers this session's `open` already started (or tried to): after an idle-out, only
    /// a call of one of its tools starts one again.
    touched: BTreeSet<String>,
    /// The tool names this session's latest process of each server listed (kept over an
    /// idle-out, so the session still sees the tools a call starts the server again for).
    listed: BTreeMap<String, BTreeSet<String>>,
}

/// One process of a per-session server.
pub(crate) struct Instance {
    server: String,
    session: Arc<str>,
    up: Arc<Upstream>,
    /// Its own catalog, which its tools are listed into.
    tools: Arc<Catalog>,
    idle_timeout: Duration,
    connect_timeout: Duration,
    last_used: Mutex<Instant>,
    busy: AtomicUsize,
    stopped: CancellationToken,
    /// Done once a call waited for its first roots; calls meanwhile wait with it.
    rooted: tokio::sync::OnceCell<()>,
}

impl Instance {
    /// Until it has listed its tools, or why it cannot (at most its connect timeout).
    async fn ready(&self) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let mut rx = self.up.state_changes();
        loop {
            match self.up.state() {
                ServerState::Connected if self.up.settled() => {
                    // A server asks for its roots as it starts (server-filesystem at
                    // `initialized`): its first call waits (briefly) for them to arrive, so
                    // that it is not answered from no roots at all.
                    // Every request waiting meanwhile waits for the same roots.
                    self.rooted
                        .get_or_init(|| self.up.first_roots(super::roots::REFETCH_WAIT))
                        .await;
                    return Ok(());
                }
                ServerState::Connecting | ServerState::Connected => {}
                ServerState::Closed => {
                    return Err(
                        "its process was stopped (the session ended or Quiver is stopping)".into(),
                    );
                }
                ServerState::Rejected(reason) => return Err(format!("it was rejected: {reason}")),
                // A program that cannot start (not found, not executable) will not start on
                // a retry either; a failed attempt otherwise (a start slower than the
                // handshake's limit on a loaded machine, a crash at start) is retried by the
                // supervisor, and the call waits for it within its connect timeout.
                ServerState::Down | ServerState::Reconnecting => {
                    if let Some(why) = self.up.cannot_start() {
                        return Err(format!("it is down: {why}"));
                    }
                }
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                let last = self
                    .up
                    .diagnostics()
                    .pop()
                    .map(|d| format!(" (last attempt: {d})"))
                    .unwrap_or_default();
                return Err(format!(
                    "it did not list its tools within {}{last}",
                    duration_text(self.connect_timeout)
                ));
            }
        }
    }

    /// The pids of its child processes not yet reaped.
    pub(crate) fn child_pids(&self) -> Vec<u32> {
        self.up.child_pids()
    }
}

/// Marks an instance busy for the length of a call.
struct Busy<'a>(&'a Instance);

impl<'a> Busy<'a> {
    fn new(inst: &'a Instance) -> Self {
        inst.busy.fetch_add(1, Ordering::AcqRel);
        *lock(&inst.last_used) = Instant::now();
        Busy(inst)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        *lock(&self.0.last_used) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One running per-session process, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionServerStatus {
    /// The server's configured name.
    pub server: String,
    /// The MCP session it serves.
    pub session: String,
    /// The principal it counts against.
    pub principal: String,
    /// Its state.
    pub state: ServerState,
    /// Its child processes not yet reaped.
    pub child_pids: Vec<u32>,
}

impl SessionPool {
    pub(crate) fn new(
        catalog: Arc<Catalog>,
        opts: Arc<ClientOptions>,
        dial_permits: Arc<Semaphore>,
        closed: CancellationToken,
    ) -> Arc<SessionPool> {
        Arc::new_cyclic(|me| SessionPool {
            catalog,
            opts,
            dial_permits,
            closed,
            servers: Mutex::new(Vec::new()),
            state: Mutex::new(HashMap::new()),
            templates: Mutex::new(BTreeMap::new()),
            me: me.clone(),
        })
    }

    pub(crate) fn names(&self) -> Vec<String> {
        lock(&self.servers).iter().map(|s| s.name.clone()).collect()
    }

    pub(crate) fn configs(&self) -> Vec<ResolvedServer> {
        lock(&self.servers).clone()
    }

    pub(crate) fn any(&self) -> bool {
        !lock(&self.servers).is_empty()
    }

    fn config(&self, server: &str) -> Option<ResolvedServer> {
        lock(&self.servers)
            .iter()
            .find(|s| s.name == server)
            .cloned()
    }

    /// Adds a per-session server (its name checked unique by the caller).
    pub(crate) fn add(&self, server: ResolvedServer) {
        lock(&self.servers).push(server);
    }

    /// Removes the server `name`: every process of it stopped, its tools gone from the
    /// shared catalog. False when there is none.
    pub(crate) async fn remove(&self, name: &str) -> bool {
        let removed = {
            let mut servers = lock(&self.servers);
            let before = servers.len();
            servers.retain(|s| s.name != name);
            servers.len() != before
        };
        if !removed {
            return false;
        }
        self.stop_server(name, "its configuration changed").await;
        let names = lock(&self.templates).remove(name).unwrap_or_default();
        for tool in names {
            if self
                .catalog
                .lookup(&tool)
                .is_some_and(|e| e.family.as_ref() == Family::ClientMcp.name())
            {
                self.catalog.remove(&tool);
            }
        }
        true
    }

    /// Every process of `server` stopped; sessions start it again at their next list or
    /// call.
    async fn stop_server(&self, server: &str, why: &str) {
        let stopped: Vec<Arc<Instance>> = {
            let mut state = lock(&self.state);
            state
                .values_mut()
                .filter_map(|e| {
                    e.touched.remove(server);
                    e.instances.remove(server)
                })
                .collect()
        };
        futures::future::join_all(stopped.iter().map(|i| self.retire(i, why))).await;
    }

    /// Every process of every session stopped and reaped (shutdown).
    pub(crate) async fn close(&self) {
        let all: Vec<Arc<Instance>> = {
            let mut state = lock(&self.state);
            state
                .drain()
                .flat_map(|(_, e)| e.instances.into_values())
                .collect()
        };
        futures::future::join_all(all.iter().map(|i| self.retire(i, "Quiver is stopping"))).await;
    }

    async fn retire(&self, inst: &Instance, why: &str) {
        inst.stopped.cancel();
        inst.up.retire().await;
        tracing::info!(
            server = %inst.server,
            session = %inst.session,
            "stopped the session's process of per-session MCP server \"{}\": {why}",
            inst.server
        );
    }

    /// The session ended: its processes are stopped and reaped.
    /// They stay listed until they are reaped, so that a [`SessionPool::close`] meanwhile
    /// waits for them too.
    async fn end_session(&self, id: &str) {
        let instances: Vec<Arc<Instance>> = match lock(&self.state).get(id) {
            Some(entry) => entry.instances.values().cloned().collect(),
            None => return,
        };
        futures::future::join_all(
            instances
                .iter()
                .map(|i| self.retire(i, "its session ended")),
        )
        .await;
        lock(&self.state).remove(id);
    }

    /// The session's process of `cfg`, started when it has none; an error in words when it
    /// may not have one (ended, over the cap, shutting down).
    fn instance(
        &self,
        session: &McpSession,
        principal: Option<&str>,
        client: Option<Arc<dyn ClientChannel>>,
        cfg: &ResolvedServer,
    ) -> Result<Arc<Instance>, String> {
        if self.closed.is_cancelled() {
            return Err("Quiver is stopping".into());
        }
        if session.ended.is_cancelled() {
            return Err("its MCP session has ended".into());
        }
        let principal: Arc<str> = principal.unwrap_or(ANONYMOUS).into();
        let mut state = lock(&self.state);
        let new_session = !state.contains_key(&session.id);
        if new_session {
            state.insert(
                session.id.clone(),
                SessionEntry {
                    principal: principal.clone(),
                    link: Arc::new(SessionLink::new(&session.id)),
                    instances: BTreeMap::new(),
                    touched: BTreeSet::new(),
                    listed: BTreeMap::new(),
                },
            );
            self.watch_session(session);
        }
        let entry = state.get_mut(&session.id).expect("inserted above");
        entry.link.latest(client);
        if let Some(inst) = entry.instances.get(&cfg.name) {
            return Ok(inst.clone());
        }
        let principal = entry.principal.clone();
        let link = entry.link.clone();
        let running = state
            .values()
            .filter(|e| e.principal == principal && e.instances.contains_key(&cfg.name))
            .count();
        if running >= cfg.max_per_principal {
            let who = if &*principal == ANONYMOUS {
                "sessions without a token (`anonymous`) already run".to_owned()
            } else {
                format!("principal `{principal}` already runs")
            };
            return Err(format!(
                "{who} {running} of its processes, its `max_per_principal`: end one of those MCP sessions, or wait for one to idle out (after {} without a call), and call again",
                duration_text(cfg.idle_timeout)
            ));
        }
        let inst = self.spawn(cfg, link, session.id.clone());
        state
            .get_mut(&session.id)
            .expect("inserted above")
            .instances
            .insert(cfg.name.clone(), inst.clone());
        drop(state);
        self.reap_when_idle(&inst);
        Ok(inst)
    }

    fn spawn(
        &self,
        cfg: &ResolvedServer,
        link: Arc<SessionLink>,
        session: Arc<str>,
    ) -> Arc<Instance> {
        let tools = Arc::new(Catalog::new());
        let relays = Relays {
            updates: tokio::sync::broadcast::channel(1).0,
            lists: tokio::sync::broadcast::channel(1).0,
            server: cfg.name.as_str().into(),
        };
        let publish = {
            let pool = self.me.clone();
            let tools = tools.clone();
            let server = cfg.name.clone();
            move || {
                if let Some(pool) = pool.upgrade() {
                    pool.publish(&server, &tools);
                }
            }
        };
        let up = Upstream::new(
            cfg.clone(),
            self.opts.clone(),
            tools.clone(),
            self.dial_permits.clone(),
            self.closed.child_token(),
            Box::new(publish),
            relays,
        );
        let _ = up.session.set(link);
        let stopped = CancellationToken::new();
        self.publish_relists(&cfg.name, &tools, &stopped);
        up.start_supervisor();
        tracing::info!(server = %cfg.name, session = %session, "started a process of per-session MCP server \"{}\" for its session", cfg.name);
        Arc::new(Instance {
            server: cfg.name.clone(),
            session,
            up,
            tools,
            idle_timeout: cfg.idle_timeout,
            connect_timeout: cfg.connect_timeout.unwrap_or(self.opts.connect_timeout),
            last_used: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
            stopped,
            rooted: tokio::sync::OnceCell::new(),
        })
    }

    /// A tool a process lists later (after its `tools/list_changed`) joins the shared
    /// catalog too, until the process is stopped.
    fn publish_relists(&self, server: &str, tools: &Arc<Catalog>, stopped: &CancellationToken) {
        let mut events = tools.subscribe();
        let (pool, tools, stopped, server) = (
            self.me.clone(),
            tools.clone(),
            stopped.clone(),
            server.to_owned(),
        );
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    event = events.recv() => match event {
                        Ok(quiver_registry::CatalogEvent::Added(_))
                        | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Ok(_) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
                match pool.upgrade() {
                    Some(pool) => pool.publish(&server, &tools),
                    None => return,
                }
            }
        });
    }

    /// Stops the session's processes when it ends (or Quiver closes).
    fn watch_session(&self, session: &McpSession) {
        let pool = self.me.clone();
        let ended = session.ended.clone();
        let closed = self.closed.clone();
        let id = session.id.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = ended.cancelled() => {}
                _ = closed.cancelled() => {}
            }
            if let Some(pool) = pool.upgrade() {
                pool.end_session(&id).await;
            }
        });
    }

    /// Stops `inst` once it has gone its idle timeout without a call.
    fn reap_when_idle(&self, inst: &Arc<Instance>) {
        let pool = self.me.clone();
        let inst = inst.clone();
        tokio::spawn(async move {
            loop {
                let since = lock(&inst.last_used).elapsed();
                let wait = inst.idle_timeout.saturating_sub(since);
                if wait.is_zero() && inst.busy.load(Ordering::Acquire) == 0 {
                    break;
                }
                let wait = if wait.is_zero() {
                    inst.idle_timeout
                } else {
                    wait
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = inst.stopped.cancelled() => return,
                }
            }
            let Some(pool) = pool.upgrade() else { return };
            let removed = {
                let mut state = lock(&pool.state);
                state.get_mut(&inst.session).is_some_and(|e| {
                    let mine = e
                        .instances
                        .get(&inst.server)
                        .is_some_and(|i| Arc::ptr_eq(i, &inst));
                    if mine {
                        e.instances.remove(&inst.server);
                    }
                    mine
                })
            };
            if removed {
                let why = format!("idle for {}", duration_text(inst.idle_timeout));
                pool.retire(&inst, &why).await;
            }
        });
    }

    /// A process of `server` listed its tools into `tools`: the names no process of it
    /// registered before go into the shared catalog, in the client-MCP family.
    fn publish(&self, server: &str, tools: &Catalog) {
        let fresh: Vec<Arc<dyn Tool>> = {
            let mut templates = lock(&self.templates);
            let known = templates.entry(server.to_owned()).or_default();
            tools
                .tools()
                .into_iter()
                .filter(|e| known.insert(e.spec.name.clone()))
                .map(|e| {
                    Arc::new(SessionTool {
                        server: server.to_owned(),
                        spec: e.tool.spec().clone(),
                        pool: self.me.clone(),
                    }) as Arc<dyn Tool>
                })
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        let report = self.catalog.register_all(Family::ClientMcp.name(), fresh);
        for line in report.warning_lines() {
            tracing::warn!(server = %server, "{line}");
        }
    }

    /// The session's first list or call (and each one after): see
    /// `SessionServers::open`.
    pub(crate) async fn open(
        &self,
        session: &McpSession,
        principal: Option<&str>,
        client: Option<Arc<dyn ClientChannel>>,
    ) {
        let servers = self.configs();
        let mut started = Vec::new();
        if let Some(entry) = lock(&self.state).get(&session.id) {
            entry.link.latest(client.clone());
        }
        for cfg in &servers {
            let first = {
                let state = lock(&self.state);
                state
                    .get(&session.id)
                    .is_none_or(|e| !e.touched.contains(&cfg.name))
            };
            if !first {
                continue;
            }
            match self.instance(session, principal, client.clone(), cfg) {
                Ok(inst) => started.push(inst),
                Err(why) => {
                    tracing::warn!(server = %cfg.name, session = %session.id, "per-session MCP server \"{}\" not started: {why}", cfg.name)
                }
            }
            if let Some(e) = lock(&self.state).get_mut(&session.id) {
                e.touched.insert(cfg.name.clone());
            }
        }
        // A request of the session that comes while another one's start is under way (two
        // requests at once, or one right after the first was answered too early to find
        // the tools) waits for the same processes: those not ready yet.
        let starting: Vec<Arc<Instance>> = lock(&self.state)
            .get(&session.id)
            .map(|e| {
                e.instances
                    .values()
                    .filter(|i| !started.iter().any(|s| Arc::ptr_eq(s, i)) && !i.up.settled())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        // The wait is use: an idle timeout shorter than the start (a loaded machine, a slow
        // server) must not stop the process the request that started it is waiting for.
        let waits = started
            .iter()
            .map(|inst| (inst, true))
            .chain(starting.iter().map(|inst| (inst, false)))
            .map(|(inst, ours)| async move {
                let _busy = Busy::new(inst);
                match inst.ready().await {
                    Ok(()) => {}
                    // Said once, by the request that started it.
                    Err(why) if ours => {
                        tracing::warn!(server = %inst.server, session = %inst.session, "per-session MCP server \"{}\" is not ready: {why}", inst.server);
                    }
                    Err(_) => {}
                }
            });
        futures::future::join_all(waits).await;
    }

    /// See `SessionServers::opened`.
    pub(crate) fn opened(&self, session: &str) -> bool {
        let servers = self.configs();
        lock(&self.state)
            .get(session)
            .is_some_and(|e| servers.iter().all(|cfg| e.touched.contains(&cfg.name)))
    }

    /// See `SessionServers::hidden_tools`.
    pub(crate) fn hidden_tools(&self, session: &str) -> Vec<String> {
        let templates = lock(&self.templates).clone();
        let mut state = lock(&self.state);
        let Some(entry) = state.get_mut(session) else {
            return Vec::new();
        };
        for (server, inst) in &entry.instances {
            if inst.up.settled() {
                let names = inst.tools.tools().into_iter().map(|e| e.spec.name.clone());
                entry.listed.insert(server.clone(), names.collect());
            }
        }
        templates
            .iter()
            .filter_map(|(server, names)| {
                let own = entry.listed.get(server)?;
                Some(names.difference(own).cloned().collect::<Vec<_>>())
            })
            .flatten()
            .collect()
    }

    /// The session's client said its roots changed: its processes are told.
    pub(crate) fn roots_changed(&self, session: &str, client: Option<Arc<dyn ClientChannel>>) {
        let instances: Vec<Arc<Instance>> = lock(&self.state)
            .get(session)
            .map(|e| {
                e.link.latest(client);
                e.instances.values().cloned().collect()
            })
            .unwrap_or_default();
        for inst in instances {
            inst.up.tell_roots_changed();
        }
    }

    /// Every running process.
    pub(crate) fn status(&self) -> Vec<SessionServerStatus> {
        let state = lock(&self.state);
        let mut out: Vec<SessionServerStatus> = state
            .values()
            .flat_map(|e| {
                e.instances.values().map(|i| SessionServerStatus {
                    server: i.server.clone(),
                    session: i.session.to_string(),
                    principal: e.principal.to_string(),
                    state: i.up.state(),
                    child_pids: i.child_pids(),
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.server, &a.session).cmp(&(&b.server, &b.session)));
        out
    }
}

/// A tool of a per-session server, in the shared catalog: a call reaches the calling
/// session's own process of the server (started if it has none).
struct SessionTool {
    server: String,
    spec: ToolSpec,
    pool: Weak<SessionPool>,
}

impl SessionTool {
    fn refuse(&self, why: impl std::fmt::Display) -> ToolResult {
        Ok(Envelope::err(
            ErrKind::NotAvailable,
            format!(
                "`{}` is a tool of the per-session MCP server \"{}\", and this call cannot reach one: {why}",
                quoted_name(&self.spec.name),
                self.server
            ),
        ))
    }
}

#[async_trait]
impl Tool for SessionTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let Some(pool) = self.pool.upgrade() else {
            return self.refuse("Quiver is stopping");
        };
        let Some(session) = &ctx.mcp_session else {
            return self.refuse(
                "the call came with no MCP session, and a per-session server runs only for one (it is started for the session and stopped when it ends). A 2026-07-28 request is stateless: connect with a session (protocol 2025-11-25 or earlier over HTTP, or over stdio) to use this tool",
            );
        };
        let Some(cfg) = pool.config(&self.server) else {
            return self.refuse("the server is no longer configured");
        };
        let inst = match pool.instance(session, ctx.principal.as_deref(), ctx.client.clone(), &cfg)
        {
            Ok(inst) => inst,
            Err(why) => return self.refuse(why),
        };
        let _busy = Busy::new(&inst);
        if let Err(why) = inst.ready().await {
            return self.refuse(format!("this session's process of it is not ready: {why}"));
        }
        let Some(entry) = inst.tools.lookup(&self.spec.name) else {
            return Ok(Envelope::err(
                ErrKind::UndefinedTool,
                format!(
                    "this session's process of the MCP server \"{}\" does not list `{}`",
                    self.server,
                    quoted_name(&self.spec.name)
                ),
            ));
        };
        entry.tool.call(input, ctx).await
    }
}

#[async_trait]
impl crate::SessionServers for super::McpClient {
    fn any(&self) -> bool {
        self.shared.sessions.any()
    }

    fn tool_patterns(&self) -> Vec<String> {
        self.shared
            .sessions
            .configs()
            .iter()
            .map(|s| format!("mcp__{}__*", s.prefix))
            .collect()
    }

    async fn open(
        &self,
        session: &McpSession,
        principal: Option<&str>,
        client: Option<Arc<dyn ClientChannel>>,
    ) {
        self.shared.sessions.open(session, principal, client).await;
    }

    fn opened(&self, session: &str) -> bool {
        self.shared.sessions.opened(session)
    }

    fn hidden_tools(&self, session: &str) -> Vec<String> {
        self.shared.sessions.hidden_tools(session)
    }

    fn roots_changed(&self, session: &str, client: Option<Arc<dyn ClientChannel>>) {
        self.shared.sessions.roots_changed(session, client);
    }
}
