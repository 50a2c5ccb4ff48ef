//! One connection attempt: spawn the stdio child or open the streamable-HTTP session,
//! handshake, check the protocol, list the tools, and hand the running connection to a
//! watcher that reaps it and reports its end.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use rmcp::{
    RoleClient, ServiceExt,
    service::{Peer, RunningService},
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use tokio::process::{ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;

use super::{Conn, EXIT_WAIT, Upstream, direct, listing::Listing, relay::UpstreamRelay};
use crate::client::{
    child::{self, ChildGuard},
    classify::classify_init,
    config::{Endpoint, Secret},
    delivery::{Deliveries, Tracked, Written},
    http::{self, SessionSlot, UpstreamHttp},
    pipe::PipeTransport,
};
use crate::protocol::Protocol;
use crate::sync::lock;

/// A connection's rmcp service, running.
type Running = RunningService<RoleClient, UpstreamRelay>;

/// What the server said of itself in its handshake.
struct Offers {
    /// The protocol version it answered with, as it wrote it.
    protocol: String,
    tools: bool,
    resources: bool,
    prompts: bool,
    completions: bool,
    /// `resources/subscribe`.
    subscribe: bool,
}

impl Offers {
    /// What `peer`'s handshake says; a server that said nothing is taken to offer tools only.
    fn of(peer: &Peer<RoleClient>) -> Offers {
        let Some(i) = peer.peer_info() else {
            return Offers {
                protocol: String::new(),
                tools: true,
                resources: false,
                prompts: false,
                completions: false,
                subscribe: false,
            };
        };
        let caps = &i.capabilities;
        Offers {
            protocol: i.protocol_version.to_string(),
            tools: caps.tools.is_some(),
            resources: caps.resources.is_some(),
            prompts: caps.prompts.is_some(),
            completions: caps.completions.is_some(),
            subscribe: caps
                .resources
                .as_ref()
                .is_some_and(|r| r.subscribe == Some(true)),
        }
    }
}

/// Why a dial failed.
pub(crate) enum DialError {
    /// Worth retrying (unreachable, hung, crashed).
    Transient(String),
    /// The connection ended under the handshake (a broken pipe, EOF): worth retrying. A
    /// stdio child that exited is the news then, not the pipe; [`unstarted`] and
    /// [`abandon`] turn it into [`DialError::Transient`] with the one or the other.
    Hangup(String),
    /// Not worth retrying (unauthorized, unsupported protocol).
    Rejected(String),
    /// The server was closed.
    Closed,
}

impl DialError {
    /// The error of a server with no child process (HTTP): a hangup is said as it is.
    fn without_child(self) -> DialError {
        match self {
            DialError::Hangup(m) => DialError::Transient(m),
            other => other,
        }
    }

    /// The error with what the stdio child wrote last on stderr (why a server fails at start
    /// is usually there), and how it ended when it did so on its own (`own_exit`; its exit is
    /// waited for a moment). A child whose handshake Quiver gave up on was closed by Quiver,
    /// and exits because its input ended.
    async fn with_stderr(self, child: &mut ChildGuard, own_exit: bool) -> DialError {
        // A rejected server was answered, and then closed by the client: its exit is not
        // news.
        let exit = match self {
            DialError::Transient(_) | DialError::Hangup(_) if own_exit => {
                let status = tokio::time::timeout(EXIT_WAIT, child.exited())
                    .await
                    .ok()
                    .flatten();
                // It exited: what it wrote last may still be on its way through the pipe.
                if status.is_some() {
                    let _ = tokio::time::timeout(EXIT_WAIT, child.stderr_read()).await;
                }
                status.map(child::exit_text)
            }
            _ => None,
        };
        let tail = child.stderr_tail();
        let tail = if tail.is_empty() {
            String::new()
        } else {
            format!("; its stderr ended with: {tail}")
        };
        // A server that needs a variable of Quiver's environment, which it does not inherit
        // whole, exits at start-up: say where to look.
        let tail = if exit.is_none() {
            tail
        } else {
            format!(
                "{tail} (it runs with its `env` and only part of Quiver's environment: a variable it needs goes in `env` or `inherit_env`)"
            )
        };
        match (self, exit) {
            // The pipe broke because the process ended: how it ended is the whole story.
            (DialError::Hangup(_), Some(how)) => DialError::Transient(format!(
                "the process {how} before it answered `initialize`{tail}"
            )),
            (DialError::Transient(m) | DialError::Hangup(m), how) => DialError::Transient(format!(
                "{m}{}{tail}",
                how.map(|h| format!("; the process {h}"))
                    .unwrap_or_default()
            )),
            (DialError::Rejected(m), _) => DialError::Rejected(format!("{m}{tail}")),
            (DialError::Closed, _) => DialError::Closed,
        }
    }
}

impl Upstream {
    /// One connection attempt: spawn or open the transport, handshake, check the protocol,
    /// list the tools (the caller publishes them), and start watching the connection.
    pub(super) async fn dial(self: &Arc<Self>) -> Result<(Arc<Conn>, Listing), DialError> {
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
        let relay = UpstreamRelay::new(self.me.clone(), generation);
        // Kept outside the handshake, which a timeout drops: a stdio child's stderr and exit
        // explain a failure, and the HTTP client and session are the direct path's.
        let mut child_guard: Option<ChildGuard> = None;
        let mut http_parts: Option<(reqwest::Client, SessionSlot)> = None;
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
                    let (guard, stdout, stdin) =
                        self.spawn_stdio(command, args, env, inherit_env, cwd.as_ref())?;
                    child_guard = Some(guard);
                    let transport = Tracked {
                        inner: PipeTransport::new(&self.cfg.name, stdout, stdin)
                            .marking(written.clone()),
                        written: written.clone(),
                        marks_itself: true,
                        answers: self.roots.clone(),
                        deliveries: deliveries.clone(),
                    };
                    relay
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
                    let (transport, parts, auth) =
                        self.open_http(url, headers, token.as_ref(), *timeout)?;
                    http_parts = Some(parts);
                    relay
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
            Err(e) => return Err(unstarted(e, child_guard, !timed_out, &cancel).await),
        };
        let peer = running.peer().clone();
        let offers = Offers::of(&peer);
        *lock(&self.instructions) = peer
            .peer_info()
            .and_then(|i| i.instructions.clone())
            .filter(|t| !t.trim().is_empty());
        let protocol = &offers.protocol;
        let version = match accepted(protocol) {
            Ok(v) => v,
            Err(e) => return Err(abandon(e, running, child_guard, &cancel).await),
        };
        let tools = if offers.tools {
            match self.first_listing(&peer).await {
                Ok(t) => t,
                Err(e) => return Err(abandon(e, running, child_guard, &cancel).await),
            }
        } else {
            Listing::default()
        };
        if let Some((_, session)) = &http_parts {
            self.follow_sessions(session, generation, cancel.clone());
        }
        let conn = Arc::new(Conn {
            direct: self.direct_path(http_parts, version, generation),
            peer,
            generation,
            since: Instant::now(),
            cancel: cancel.clone(),
            has_resources: offers.resources && self.cfg.resources,
            has_prompts: offers.prompts && self.cfg.prompts,
            has_completions: offers.completions,
            has_subscribe: offers.subscribe && offers.resources && self.cfg.resources,
            written: matches!(self.cfg.endpoint, Endpoint::Stdio { .. }).then_some(written),
            deliveries,
        });
        self.watch(running, child_guard, cancel, generation);
        self.counters.connects.fetch_add(1, Ordering::Relaxed);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.counters
            .connected_at_ms
            .store(now_ms, Ordering::Relaxed);
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

    /// Starts a stdio server's command. A command that cannot start for a reason only an
    /// operator can fix is remembered as such (`cannot_start`).
    fn spawn_stdio(
        &self,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, Secret>,
        inherit_env: &[String],
        cwd: Option<&PathBuf>,
    ) -> Result<(ChildGuard, ChildStdout, ChildStdin), DialError> {
        match child::spawn(
            &self.cfg.name,
            command,
            args,
            env,
            inherit_env,
            cwd,
            &self.pids,
        ) {
            Ok(parts) => {
                *lock(&self.cannot_start) = None;
                Ok(parts)
            }
            Err(e) => {
                // A missing `cwd` fails the spawn with the same "not found" as a missing
                // command: say which it is.
                let why = match cwd.filter(|d| !d.is_dir()) {
                    Some(dir) => format!(
                        "cannot start `{command}`: its working directory `{}` (`cwd`) is not a directory ({e})",
                        dir.display()
                    ),
                    None => format!("cannot start `{command}`: {e}"),
                };
                // Only what an operator must fix (no such command or `cwd`, not executable);
                // a passing shortage (EMFILE, EAGAIN) is retried.
                let fixable = matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) || matches!(e.raw_os_error(), Some(libc::ENOEXEC | libc::ENOTDIR));
                *lock(&self.cannot_start) = fixable.then(|| why.clone());
                Err(DialError::Transient(why))
            }
        }
    }

    /// A streamable-HTTP server's transport, with the HTTP client and session it shares with
    /// the direct path, and what to tell the operator if the server refuses Quiver's
    /// credentials.
    #[expect(
        clippy::type_complexity,
        reason = "one caller, which takes the three apart at once"
    )]
    fn open_http(
        &self,
        url: &url::Url,
        headers: &[(reqwest::header::HeaderName, reqwest::header::HeaderValue)],
        token: Option<&Secret>,
        timeout: Option<std::time::Duration>,
    ) -> Result<
        (
            StreamableHttpClientTransport<UpstreamHttp>,
            (reqwest::Client, SessionSlot),
            String,
        ),
        DialError,
    > {
        let client = http::client(url, timeout)
            .map_err(|e| DialError::Transient(format!("http client: {e}")))?
            .named(&self.cfg.name)
            .counting_answers(self.roots.clone());
        let parts = (client.reqwest().clone(), client.session().clone());
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
            .reinit_on_expired_session(true)
            .custom_headers(headers.iter().cloned().collect());
        if let Some(t) = token {
            config = config.auth_header(t.0.clone());
        }
        let transport = StreamableHttpClientTransport::with_client(client, config);
        let var = crate::client::config::token_var(&self.cfg.name);
        let auth = if self.cfg.for_user {
            "the server did not accept the user's access token".to_owned()
        } else if token.is_some() {
            format!(
                "the server did not accept the bearer token from `{var}`; fix it, or give the server the `headers` it expects"
            )
        } else {
            format!(
                "no bearer token is set; set `{var}` in Quiver's environment, or give the server the `headers` it expects"
            )
        };
        Ok((transport, parts, auth))
    }

    /// The tools of a connection just made, within the connect timeout.
    async fn first_listing(&self, peer: &Peer<RoleClient>) -> Result<Listing, DialError> {
        match tokio::time::timeout(self.connect_timeout(), self.list_tools(peer)).await {
            Ok(listed) => listed,
            Err(_) => {
                let http = matches!(self.cfg.endpoint, Endpoint::Http { .. });
                Err(DialError::Transient(format!(
                    "no answer to tools/list within {}{}",
                    quiver_contract::duration_text(self.connect_timeout()),
                    if http {
                        " (over streamable HTTP, an answer that is not valid \
                         JSON-RPC, such as one nested over 128 levels deep, is \
                         dropped unread: `QUIVER_LOG=rmcp=debug` shows it)"
                    } else {
                        ""
                    }
                )))
            }
        }
    }

    /// The direct path of a streamable-HTTP connection (`direct.rs`), when it is on and
    /// speaks the negotiated `version`.
    fn direct_path(
        &self,
        http_parts: Option<(reqwest::Client, SessionSlot)>,
        version: Protocol,
        generation: u64,
    ) -> Option<Arc<direct::DirectPath>> {
        let Endpoint::Http {
            url,
            headers,
            token,
            ..
        } = &self.cfg.endpoint
        else {
            return None;
        };
        let (client, session) = http_parts.filter(|_| self.opts.http_direct_path)?;
        direct::DirectPath::new(
            client,
            url.clone(),
            headers,
            token.as_ref().map(|t| t.0.as_str()),
            version,
            session,
            generation,
            self.connect_timeout(),
        )
        .map(Arc::new)
    }

    /// Watches connection `generation`'s HTTP session until the connection ends: each time
    /// the server's session is replaced (rmcp initialized again after the server forgot
    /// it), the tools are listed again and what the old session held is renewed.
    fn follow_sessions(&self, session: &SessionSlot, generation: u64, ended: CancellationToken) {
        let replaced = session.replaced();
        let me = self.me.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = replaced.notified() => {}
                    () = ended.cancelled() => return,
                }
                let Some(up) = me.upgrade() else { return };
                up.session_replaced(generation);
            }
        });
    }

    /// Hands the connection's service and child to a watcher task: when the connection ends
    /// for any reason it reaps the child and reports the loss.
    fn watch(
        &self,
        running: Running,
        mut child_guard: Option<ChildGuard>,
        ended: CancellationToken,
        generation: u64,
    ) {
        let me = self.me.clone();
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
        let mut watchers = lock(&self.watchers);
        watchers.retain(|w| !w.is_finished());
        watchers.push(watcher);
    }
}

/// The version an upstream answered the handshake with, if Quiver speaks it: the handshake
/// offers `Protocol::OFFERED` and accepts any version that has one; a server that answers
/// with another version is rejected.
fn accepted(protocol: &str) -> Result<Protocol, DialError> {
    Protocol::parse(protocol)
        .filter(|p| p.has_session())
        .ok_or_else(|| {
            let supported: Vec<&str> = Protocol::ALL
                .into_iter()
                .filter(|p| p.has_session())
                .map(Protocol::as_str)
                .collect();
            DialError::Rejected(format!(
                "unsupported protocol version {protocol:?} (supported: {})",
                supported.join(", ")
            ))
        })
}

/// Gives up a connection whose handshake did not finish: the error, with what a stdio child
/// that failed at start said on stderr (read before it is told to stop, so that its exit is
/// its own, `own_exit`). One that did not answer in time had its input closed when the wait
/// ended: its exit is Quiver's doing, not news.
async fn unstarted(
    e: DialError,
    mut child_guard: Option<ChildGuard>,
    own_exit: bool,
    cancel: &CancellationToken,
) -> DialError {
    let e = match child_guard.as_mut() {
        Some(g) => e.with_stderr(g, own_exit).await,
        None => e.without_child(),
    };
    cancel.cancel();
    if let Some(mut g) = child_guard {
        g.shutdown().await;
    }
    e
}

/// Gives up a connection whose handshake went through but that cannot be used: the error,
/// with what a child that exited after the handshake said on stderr and how it ended (its
/// listing failed with "Transport closed"), read before it is told to stop.
async fn abandon(
    e: DialError,
    running: Running,
    mut child_guard: Option<ChildGuard>,
    cancel: &CancellationToken,
) -> DialError {
    let e = match child_guard.as_mut() {
        Some(g) => e.with_stderr(g, true).await,
        None => e.without_child(),
    };
    cancel.cancel();
    let _ = running.cancel().await;
    if let Some(mut g) = child_guard {
        g.shutdown().await;
    }
    e
}
