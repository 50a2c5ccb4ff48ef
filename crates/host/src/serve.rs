//! `quiver serve`: the process lifecycle around the MCP server. Binds, prints the URL,
//! serves until SIGINT or SIGTERM (SIGHUP reloads the configuration), then stops accepting,
//! cancels in-flight calls and returns so the caller can flush.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use quiver_mcp_adapter::{ContentSource, McpServer, Readiness, ServerOptions};
use quiver_registry::Dispatcher;
use quiver_surface::Surface;
use tokio::io::AsyncWriteExt;

/// The address `quiver serve` listens on by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7345";

/// How long open connections get to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(5);

/// What `serve` keeps per key across restarts: working sets, and (from the execution log)
/// which tools a key has called.
#[derive(Clone)]
pub struct Stores {
    /// Where working sets persist.
    pub sessions: Arc<dyn quiver_surface::ports::SessionStore>,
    /// The execution log.
    pub calls: Arc<dyn quiver_registry::store::CallLog>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

/// Where and how to serve.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Transport {
    /// Streamable HTTP on this address (port 0 picks a free port).
    Http(SocketAddr),
    /// MCP over stdin and stdout, for desktop clients.
    Stdio,
}

/// The adapters `serve` plugs into the MCP server, each optional.
#[derive(Clone, Default)]
pub struct Adapters {
    /// Where working sets persist and which tools a key has called.
    pub stores: Option<Stores>,
    /// Resources, prompts and completions (`quiver serve` passes its MCP client: the
    /// upstreams' ones go through).
    pub content: Option<Arc<dyn ContentSource>>,
    /// What `GET /readyz` checks (`quiver serve` passes its MCP client too: ready when the
    /// required upstreams are connected).
    pub readiness: Option<Arc<dyn Readiness>>,
    /// What reloads the configuration: on SIGHUP, and at `POST /admin/reload` when the
    /// options carry an admin token.
    pub reload: Option<Arc<crate::reload::Reloader>>,
    /// What `GET /metrics` serves, and where.
    pub metrics: Option<MetricsServing>,
    /// The admin web page at `/admin` (HTTP only, and only with an admin token in the
    /// options).
    pub admin_page: Option<quiver_admin_web::AdminPage>,
    /// The per-session MCP servers (`quiver serve` passes its MCP client).
    pub session_servers: Option<Arc<dyn quiver_mcp_adapter::SessionServers>>,
}

/// `GET /metrics`: behind the admin token on the MCP listener (with no admin token, not
/// there), and with no token on `listen` when given (`serve --metrics-listen`).
#[derive(Clone)]
pub struct MetricsServing {
    /// The metrics ([`crate::metrics::exposition`]).
    pub exposition: Arc<dyn quiver_mcp_adapter::MetricsExposition>,
    /// A listener of their own.
    pub listen: Option<SocketAddr>,
}

impl std::fmt::Debug for MetricsServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServing")
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Adapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapters")
            .field("stores", &self.stores.is_some())
            .field("content", &self.content.is_some())
            .field("readiness", &self.readiness.is_some())
            .field("reload", &self.reload.is_some())
            .field("metrics", &self.metrics)
            .field("admin_page", &self.admin_page.is_some())
            .field("session_servers", &self.session_servers.is_some())
            .finish()
    }
}

/// Serves MCP until a shutdown signal from `signals` (or, on stdio, until the client closes
/// the pipe). For HTTP, prints `http://ADDR/mcp` on stdout once the listener is bound.
/// `signals` is armed by the caller, as early as it likes: a signal that arrives before
/// serving starts (while the store opens, the upstreams connect) stops it as soon as it
/// does.
pub async fn serve(
    surface: Arc<Surface>,
    dispatcher: Dispatcher,
    transport: Transport,
    options: ServerOptions,
    adapters: Adapters,
    signals: &mut Signals,
) -> anyhow::Result<()> {
    options
        .auth
        .validate()
        .context("checking the inbound tokens")?;
    let stopping = dispatcher.clone();
    let open = options.auth.tokens.is_empty() && options.auth.oidc.is_none();
    let verifier = match (&transport, &options.auth.oidc) {
        (Transport::Http(_), Some(oidc)) => Some(crate::identity::verifier(oidc)?),
        _ => None,
    };
    let mut server = McpServer::new(surface, dispatcher, options);
    if let Some(verifier) = verifier {
        server = server.with_token_verifier(verifier);
    }
    if let Some(stores) = adapters.stores {
        server = server
            .with_session_store(stores.sessions)
            .with_call_log(stores.calls);
    }
    if let Some(content) = adapters.content {
        server = server.with_content(content);
    }
    if let Some(servers) = adapters.session_servers {
        server = server.with_session_servers(servers);
    }
    if let Some(readiness) = adapters.readiness {
        server = server.with_readiness(readiness);
    }
    let reload = adapters.reload;
    if let Some(reload) = &reload {
        server = server.with_reload(reload.clone());
        if matches!(transport, Transport::Http(_)) {
            reload.set_auth(server.auth_handle());
        }
    }
    let mut metrics_listener = None;
    if let Some(metrics) = adapters.metrics {
        server = server.with_metrics(metrics.exposition);
        if let Some(addr) = metrics.listen {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics listener {addr}"))?;
            tracing::info!("metrics at http://{}/metrics", listener.local_addr()?);
            metrics_listener = Some(listener);
        }
    }
    // Bound before the admin page is built: the page names the address it is served on.
    let http_listener = match &transport {
        Transport::Stdio => None,
        Transport::Http(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            let advice = if e.kind() == std::io::ErrorKind::AddrInUse {
                " (another `quiver serve`, or another program, listens there: stop it, or give --listen another port; port 0 picks a free one)"
            } else {
                ""
            };
            anyhow::anyhow!("binding {addr}: {e}{advice}")
        })?),
    };
    if let Some(page) = adapters.admin_page
        && let Some(listener) = &http_listener
    {
        let replica = quiver_admin_web::Replica::new(
            host_name(),
            std::process::id(),
            listener.local_addr()?.to_string(),
        );
        let page = page
            .with_replica(replica)
            .with_stop(server.shutdown_token())
            .router();
        server = server.with_admin_page(page);
    }
    let shutdown = server.shutdown_token();
    // Metrics on a listener of their own stop with the server.
    let _metrics_task = metrics_listener.map(|listener| {
        let server = server.clone();
        tokio::spawn(async move {
            if let Err(e) = server.serve_metrics(listener).await {
                tracing::warn!("the metrics listener stopped: {e}");
            }
        })
    });
    let serving = async {
        match http_listener {
            None => server.serve_stdio().await.context("serving MCP on stdio"),
            Some(listener) => {
                let bound = listener.local_addr()?;
                // The Host check stops DNS rebinding, not other machines.
                if open && !bound.ip().is_loopback() {
                    tracing::warn!(
                        "listening on {bound}, beyond this machine, with no [[auth.tokens]]: anyone who can reach this port can call every tool (the Host check stops browsers' DNS rebinding, not clients that send a Host of their choosing); configure [[auth.tokens]], or listen on 127.0.0.1"
                    );
                }
                // Bound to every interface: the URL printed is one a client on this machine
                // can use (its loopback address, which the Host check accepts); clients
                // elsewhere use this machine's name or address.
                let shown = if bound.ip().is_unspecified() {
                    let loopback: std::net::IpAddr = if bound.is_ipv4() {
                        std::net::Ipv4Addr::LOCALHOST.into()
                    } else {
                        std::net::Ipv6Addr::LOCALHOST.into()
                    };
                    tracing::info!(
                        "listening on every interface ({bound}): clients on other machines use this machine's name or address with port {}",
                        bound.port()
                    );
                    std::net::SocketAddr::new(loopback, bound.port())
                } else {
                    bound
                };
                let mut out = tokio::io::stdout();
                out.write_all(format!("http://{shown}/mcp\n").as_bytes())
                    .await?;
                out.flush().await?;
                tokio::select! {
                    r = server.serve_http(listener) => r.context("serving MCP over HTTP"),
                    () = async { shutdown.cancelled().await; tokio::time::sleep(DRAIN).await } => {
                        tracing::warn!("connections still open {DRAIN:?} after shutdown; closing them");
                        Ok(())
                    }
                }
            }
        }
    };
    tokio::pin!(serving);
    // The first signal starts a graceful stop; a second one (an operator pressing Ctrl-C
    // again) ends the wait for open connections at once, dropping them. The upstreams are
    // still stopped and the execution log still flushed by the caller, which may watch the
    // same `signals` for a signal after these.
    // SIGHUP reloads the configuration (the Unix convention for daemons) when there is a
    // reloader, even when Quiver was started with it ignored (`nohup`): a reload is what a
    // daemon's operator sends it for, and it stops nothing. SIGINT and SIGTERM stop.
    let mut hangups = match &reload {
        Some(_) => Some(hangup_stream()?),
        None => None,
    };
    loop {
        tokio::select! {
            r = &mut serving => return r,
            Some(()) = async {
                match &mut hangups {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(reload) = &reload {
                    let _ = reload.reload("SIGHUP").await;
                }
            }
            signal = signals.next() => match signal {
                // A hangup is the reload stream's when there is one.
                1 if hangups.is_some() => {}
                _ => break,
            },
        }
    }
    tracing::info!("shutdown signal: stopping the MCP server (a second signal stops at once)");
    stopping.begin_shutdown();
    shutdown.cancel();
    tokio::select! {
        r = &mut serving => r,
        _ = signals.next() => {
            tracing::warn!("second shutdown signal: closing open connections now");
            Ok(())
        }
    }
}

/// SIGHUP as a stream of reload requests.
#[cfg(unix)]
struct Hangups(tokio::signal::unix::Signal);

#[cfg(unix)]
impl Hangups {
    async fn recv(&mut self) -> Option<()> {
        self.0.recv().await
    }
}

#[cfg(unix)]
fn hangup_stream() -> anyhow::Result<Hangups> {
    use tokio::signal::unix::{SignalKind, signal};
    Ok(Hangups(
        signal(SignalKind::hangup()).context("watching SIGHUP for reloads")?,
    ))
}

#[cfg(not(unix))]
struct Hangups;

#[cfg(not(unix))]
impl Hangups {
    async fn recv(&mut self) -> Option<()> {
        std::future::pending().await
    }
}

#[cfg(not(unix))]
fn hangup_stream() -> anyhow::Result<Hangups> {
    Ok(Hangups)
}

/// SIGINT, SIGTERM and SIGHUP, watched from `watch` on: a signal that arrives after it
/// (before the URL is printed, while the store opens) is never the default handler's, and
/// `next` returns it. Before serving, SIGHUP stops the start-up like the others, unless
/// Quiver was started with it ignored (`nohup`); while serving, [`serve`] takes SIGHUP as a
/// reload, `nohup` or not.
pub struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

/// How a stdio client was seen to have left before the MCP transport started reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientLeft {
    /// Stdin's writer has gone (the pipe's other end closed, or a socket the client shut
    /// for writing) leaving nothing unread.
    ClosedStdin,
    /// Stdin is `/dev/null` or a regular file read to its end: there is nothing to read.
    EmptyStdin,
    /// Stdout's reader has gone: no answer could be delivered.
    ClosedStdout,
}

impl ClientLeft {
    /// What the log says, in an operator's words.
    pub fn describe(self) -> &'static str {
        match self {
            Self::ClosedStdin => "the MCP client closed stdin",
            Self::EmptyStdin => "stdin is empty (/dev/null or a file read to its end)",
            Self::ClosedStdout => "the MCP client closed stdout (nobody reads the answers)",
        }
    }
}

/// Returns once a stdio client has left without a request to answer, without reading from
/// stdin: stdin's writer gone with nothing unread, stdin that is `/dev/null` or a regular
/// file with nothing left in it, or stdout's reader gone. A client that wrote requests and
/// closed stdin (a piped script, or a file of requests) is waiting for their answers, so
/// for it this never returns, and what it wrote stays for the MCP transport. A terminal
/// never ends this way.
pub async fn stdio_client_left() -> ClientLeft {
    #[cfg(not(unix))]
    std::future::pending::<()>().await;
    #[cfg(unix)]
    {
        if stdin_is_empty() {
            return ClientLeft::EmptyStdin;
        }
        loop {
            if let Some(left) = stdio_state() {
                return left;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// One look at stdin and stdout: `Some` once the client has left. A stdin hung up with
/// requests unread parks for good (its writer cannot come back) unless stdout goes.
#[cfg(unix)]
fn stdio_state() -> Option<ClientLeft> {
    // A socket shut for writing only (Node's `stdin.end()` on its socketpair) reports
    // POLLRDHUP where the platform has it; elsewhere it is seen as readable with nothing
    // to read.
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "illumos"
    ))]
    const SHUT: libc::c_short = libc::POLLHUP | libc::POLLRDHUP;
    #[cfg(not(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "illumos"
    )))]
    const SHUT: libc::c_short = libc::POLLHUP;
    let mut fds = [
        libc::pollfd {
            fd: 0,
            events: SHUT | libc::POLLIN,
            revents: 0,
        },
        // A pipe whose reader closed reports POLLERR on its writing end; asking for no
        // event still returns the error and hang-up states.
        libc::pollfd {
            fd: 1,
            events: 0,
            revents: 0,
        },
    ];
    // SAFETY: poll(2) on two valid pollfds with a zero timeout only reports their state.
    #[allow(unsafe_code)]
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) };
    if n <= 0 {
        return None;
    }
    if fds[1].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
        return Some(ClientLeft::ClosedStdout);
    }
    let shut = fds[0].revents & SHUT != 0;
    let readable = fds[0].revents & libc::POLLIN != 0;
    if (shut || (readable && is_kind(0, libc::S_IFSOCK))) && unread(0) == Some(0) {
        return Some(ClientLeft::ClosedStdin);
    }
    // A hung-up stdin with bytes waiting: requests to answer. A socket with bytes waiting:
    // its writer may still be there.
    None
}

/// Whether stdin is `/dev/null` or a regular file whose read offset is at its end.
#[cfg(unix)]
fn stdin_is_empty() -> bool {
    // SAFETY: fstat(2) and stat(2) fill zeroed plain-data structs; lseek(2) with SEEK_CUR
    // and offset 0 only reports the offset.
    #[allow(unsafe_code)]
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(0, &mut st) != 0 {
            return false;
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {
                let at = libc::lseek(0, 0, libc::SEEK_CUR);
                at >= 0 && at >= st.st_size
            }
            libc::S_IFCHR => {
                let mut null: libc::stat = std::mem::zeroed();
                libc::stat(c"/dev/null".as_ptr(), &mut null) == 0 && null.st_rdev == st.st_rdev
            }
            _ => false,
        }
    }
}

/// The count of bytes waiting on `fd`, from FIONREAD.
#[cfg(unix)]
fn unread(fd: libc::c_int) -> Option<libc::c_int> {
    let mut unread: libc::c_int = 0;
    // SAFETY: FIONREAD writes the count of unread bytes into one c_int.
    #[allow(unsafe_code)]
    let asked = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut unread) };
    (asked == 0).then_some(unread)
}

/// Whether `fd` is of the file type `kind` (`S_IFSOCK`, ...).
#[cfg(unix)]
fn is_kind(fd: libc::c_int, kind: libc::mode_t) -> bool {
    // SAFETY: fstat(2) fills a zeroed plain-data struct.
    #[allow(unsafe_code)]
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == kind
    }
}

/// Whether this process was started with SIGHUP ignored (by `nohup`, or a parent that
/// ignores it).
#[cfg(unix)]
#[allow(unsafe_code)]
fn hangup_ignored() -> bool {
    // SAFETY: sigaction(2) with a null new action only reads the current one into `old`,
    // a zeroed plain-data struct it fills; no handler changes.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals").finish_non_exhaustive()
    }
}

impl Signals {
    /// Starts watching. Needs a Tokio runtime.
    pub fn watch() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                int: signal(SignalKind::interrupt()).context("watching SIGINT")?,
                term: signal(SignalKind::terminate()).context("watching SIGTERM")?,
                hup: match hangup_ignored() {
                    true => None,
                    false => Some(signal(SignalKind::hangup()).context("watching SIGHUP")?),
                },
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// The number of the next SIGHUP (1), SIGINT (2) or SIGTERM (15). Cancel-safe.
    pub async fn next(&mut self) -> u8 {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.int.recv() => 2,
                _ = self.term.recv() => 15,
                Some(_) = async {
                    match &mut self.hup {
                        Some(hup) => hup.recv().await,
                        None => std::future::pending().await,
                    }
                } => 1,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            2
        }
    }
}

/// This machine's host name, as the admin page names its replica.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "an unnamed host".to_owned())
}
