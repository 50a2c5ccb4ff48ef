//! Quiver's admin web page: server-rendered HTML (maud) over the core's ports, served by
//! `quiver serve` at `/admin` beside the MCP endpoint. It shows the catalog (searched with
//! the `tool_search` engine, each tool's definition and lint findings), the upstream
//! servers (with reconnect and disable actions, and their call latency from the log), the
//! sessions each as its model sees it (principal, mode, protocol, the listed tools, the
//! working set and the budgets), the execution log (paged by `(time, row)` over the
//! store's indexes, new calls streamed live over SSE, each call's detail), the custom
//! tools under review (approve, or reject with a reason) and their jobs, and the effective
//! configuration (secrets masked) with the last reload's result and `quiver check`'s
//! findings. The sessions, the upstreams and the jobs update live (their region of the
//! page is fetched again every second).
//!
//! It holds no state of its own beyond login sessions: every read and every action goes
//! through the same ports as the CLI ([`CallLog`], [`UsageSource`], [`CustomTools`], the
//! [`Surface`], and the host's [`Upstreams`] and [`ConfigView`]), and each action is logged
//! (target `quiver::admin`). Nothing here sits on the MCP call path.
//!
//! Access: the router ([`AdminPage::router`]) is mounted by the MCP adapter behind its
//! `Host` and `Origin` checks, and only when an admin token is configured. A login form
//! takes the token and sets an HttpOnly, SameSite=Strict cookie naming a server-side
//! session; every form carries the session's CSRF token. A token rotated by a reload ends
//! the sessions logged in with the old one.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_registry::{custom::CustomTools, store::CallLog};
use quiver_surface::{Surface, ports::UsageSource};

mod handlers;
mod login;
#[cfg(test)]
mod tests;
mod time;
mod usage;
mod views;

/// One upstream MCP server as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamRow {
    /// The server's name.
    pub name: String,
    /// `connected`, `connecting`, `reconnecting`, `down`, `rejected` or `closed`.
    pub state: String,
    /// Why it is not connected, when known (a rejection's reason, a command that cannot
    /// start, the last diagnostic line).
    pub why: Option<String>,
    /// Its tools now in the catalog.
    pub tools: usize,
    /// Successful connections.
    pub connects: u64,
    /// Connections lost after being up.
    pub drops: u64,
    /// Tool calls sent to it.
    pub calls: u64,
    /// Whether it is enabled (an operator's switch: a disabled server is closed).
    pub enabled: bool,
    /// When its last connection came up.
    pub last_connect: Option<std::time::SystemTime>,
}

impl UpstreamRow {
    /// A row with no reason, tools or counters.
    pub fn new(name: impl Into<String>, state: impl Into<String>) -> Self {
        UpstreamRow {
            name: name.into(),
            state: state.into(),
            why: None,
            tools: 0,
            connects: 0,
            drops: 0,
            calls: 0,
            enabled: true,
            last_connect: None,
        }
    }

    /// Marks it disabled by an operator.
    pub fn disabled(mut self) -> Self {
        self.enabled = false;
        self
    }

    /// Sets when its last connection came up.
    pub fn with_last_connect(mut self, at: std::time::SystemTime) -> Self {
        self.last_connect = Some(at);
        self
    }

    /// Sets the reason it is not connected.
    pub fn with_why(mut self, why: impl Into<String>) -> Self {
        self.why = Some(why.into());
        self
    }

    /// Sets the tool count and the counters.
    pub fn with_counts(mut self, tools: usize, connects: u64, drops: u64, calls: u64) -> Self {
        self.tools = tools;
        self.connects = connects;
        self.drops = drops;
        self.calls = calls;
        self
    }
}

/// The upstream servers, as the host's MCP client knows them.
#[async_trait]
pub trait Upstreams: Send + Sync {
    /// Every server, in configuration order.
    fn upstreams(&self) -> Vec<UpstreamRow>;

    /// Closes the server `name` and dials it again with the same settings; `Ok` with what
    /// was done, `Err` with why not (no such server).
    async fn reconnect(&self, name: &str) -> Result<String, String>;

    /// Disables the server `name` (closes it and keeps it closed, its tools gone) or
    /// enables it again; `Ok` with what was done, `Err` with why not (no such server).
    async fn set_enabled(&self, name: &str, enabled: bool) -> Result<String, String>;
}

/// The configuration as the host runs it.
pub trait ConfigView: Send + Sync {
    /// The effective configuration, every secret masked.
    fn effective(&self) -> String;

    /// The last reload's result (JSON, as `quiver status` reads it), if there was one.
    fn last_reload(&self) -> Option<String>;

    /// `quiver check`'s findings on the configuration in force (without `--against`), in
    /// its order; `None` while a reload holds the configuration.
    fn findings(&self) -> Option<Vec<quiver_contract::Finding>>;
}

/// The replica serving the page, named in its header: with several replicas behind a load
/// balancer, the upstreams' actions act on this one alone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replica {
    /// The machine's host name.
    pub host: String,
    /// The `quiver serve` process.
    pub pid: u32,
    /// The address it listens on.
    pub listen: String,
}

impl Replica {
    /// A replica by its host name, process id and listen address.
    pub fn new(host: impl Into<String>, pid: u32, listen: impl Into<String>) -> Self {
        Replica {
            host: host.into(),
            pid,
            listen: listen.into(),
        }
    }
}

/// Whether a token's fingerprint ([`quiver_contract::secret_fingerprint`]) is that of the
/// admin token in force now (the host's, which a reload may rotate). A login keeps only the
/// fingerprint, so no store holds the token.
pub type TokenCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

pub use login::{LoginStore, MemoryLogins, StoredLogin};

/// What the page reads and acts through.
#[derive(Clone)]
pub struct AdminPage {
    pub(crate) surface: Arc<Surface>,
    pub(crate) calls: Arc<dyn CallLog>,
    pub(crate) usage: Arc<dyn UsageSource>,
    pub(crate) custom: Arc<CustomTools>,
    pub(crate) upstreams: Arc<dyn Upstreams>,
    pub(crate) config: Arc<dyn ConfigView>,
    pub(crate) token: TokenCheck,
    /// Where logins are kept: this process by default.
    pub(crate) logins: Arc<dyn LoginStore>,
    /// The replica serving the page, when the host names it.
    pub(crate) replica: Option<Replica>,
    /// Cancelled when the server stops: the live streams end (an open page would hold the
    /// drain of the connections otherwise).
    pub(crate) stop: tokio_util::sync::CancellationToken,
    /// The catalog's usage counts, counted at most once a minute.
    pub(crate) usage_cache: Arc<usage::UsageCache>,
}

impl std::fmt::Debug for AdminPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminPage").finish_non_exhaustive()
    }
}

impl AdminPage {
    /// The page over these ports; `token` checks a login.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        surface: Arc<Surface>,
        calls: Arc<dyn CallLog>,
        usage: Arc<dyn UsageSource>,
        custom: Arc<CustomTools>,
        upstreams: Arc<dyn Upstreams>,
        config: Arc<dyn ConfigView>,
        token: TokenCheck,
    ) -> Self {
        AdminPage {
            surface,
            calls,
            usage,
            custom,
            upstreams,
            config,
            token,
            logins: Arc::new(MemoryLogins::default()),
            replica: None,
            stop: tokio_util::sync::CancellationToken::new(),
            usage_cache: Arc::default(),
        }
    }

    /// Names the replica serving the page (in every page's header).
    pub fn with_replica(mut self, replica: Replica) -> Self {
        self.replica = Some(replica);
        self
    }

    /// Keeps logins in `logins` instead of this process: replicas that share one store
    /// share their logins, so a load balancer may send each request to any of them.
    pub fn with_logins(mut self, logins: Arc<dyn LoginStore>) -> Self {
        self.logins = logins;
        self
    }

    /// Ends the live streams when `stop` is cancelled (the server's shutdown).
    pub fn with_stop(mut self, stop: tokio_util::sync::CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    /// The page's routes, all under `/admin/` (and `/admin` itself). Mount them behind the
    /// `Host` and `Origin` checks of the MCP endpoint.
    pub fn router(self) -> axum::Router {
        handlers::router(self)
    }
}
