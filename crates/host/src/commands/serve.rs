//! `quiver serve`: its listen arguments, and serving until a signal stops it.

use std::process::ExitCode;

use quiver_contract::Mode;
use quiver_host::{App, Config};

use super::apply_retention;

/// `serve --listen`: the address, and the host name it was given as (accepted as `Host`).
#[derive(Debug, Clone)]
pub(crate) struct Listen {
    addr: std::net::SocketAddr,
    name: Option<String>,
}

/// A `Host` to accept: `name`, `name:port` or `name:*` (any port); an IPv6 address in
/// brackets. A URL, a path or a name with other characters would never match a `Host`
/// header, so it is refused here rather than accepted and never used.
pub(crate) fn parse_allow_host(s: &str) -> Result<String, String> {
    const FORM: &str = "give the Host clients send: `name:port`, or `name` for any port (e.g. `quiver.example:7345`, `quiver.example`, `[::1]:7345`)";
    if let Some((scheme, rest)) = s.split_once("://") {
        let host = rest.split('/').next().unwrap_or("");
        return Err(format!(
            "`{s}` is a URL, not a Host: leave out `{scheme}://` (and any path), e.g. `{host}`"
        ));
    }
    let (name, port) = match s.strip_prefix('[') {
        Some(v6) => {
            let Some((addr, rest)) = v6.split_once(']') else {
                return Err(format!("`{s}` has no closing `]`: {FORM}"));
            };
            if addr.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("`[{addr}]` is not an IPv6 address: {FORM}"));
            }
            match rest {
                "" => (addr, None),
                _ => match rest.strip_prefix(':') {
                    Some(port) => (addr, Some(port)),
                    None => {
                        return Err(format!("`{s}`: after `]` comes `:port` or nothing; {FORM}"));
                    }
                },
            }
        }
        None => match s.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (s, None),
        },
    };
    if name.is_empty() {
        return Err(format!("`{s}` names no host: {FORM}"));
    }
    if !s.starts_with('[')
        && !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err(format!(
            "`{name}` is not a host name (letters, digits, `-` and `.`): {FORM}"
        ));
    }
    if let Some(port) = port
        && port != "*"
        && port.parse::<u16>().is_err()
    {
        return Err(format!(
            "`{port}` in `{s}` is not a port (0 to 65535, or `*` for any): {FORM}"
        ));
    }
    Ok(s.to_owned())
}

pub(crate) fn parse_listen(s: &str) -> Result<Listen, String> {
    if let Ok(addr) = s.parse() {
        return Ok(Listen { addr, name: None });
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!(
            "`{s}` has no port: give HOST:PORT or IP:PORT, e.g. 127.0.0.1:7345 (port 0 picks a free one)"
        ));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "`{port}` in `{s}` is not a port (0 to 65535): give HOST:PORT or IP:PORT, e.g. 127.0.0.1:7345"
        ));
    }
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(s)
        .map_err(|e| {
            format!("cannot resolve the host `{host}`: {e}; give an IP address instead, e.g. 127.0.0.1:{port}")
        })?
        .collect();
    let addr = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("the host `{host}` resolves to no address; give an IP address instead, e.g. 127.0.0.1:{port}"))?;
    Ok(Listen {
        addr,
        name: Some(host.to_owned()),
    })
}

/// `serve`'s arguments.
pub(crate) struct How {
    pub(crate) listen: Listen,
    pub(crate) stdio: bool,
    pub(crate) mode: Mode,
    pub(crate) allow_hosts: Vec<String>,
    pub(crate) metrics_listen: Option<Listen>,
}

/// Serves the app's surface and dispatcher on `stdio`, or over HTTP on `listen`, until a
/// signal (from `signals`, or watched here when none are given) stops it.
pub(crate) async fn run(
    app: &App,
    config: &Config,
    how: How,
    signals: Option<&mut quiver_host::serve::Signals>,
) -> anyhow::Result<ExitCode> {
    let How {
        listen,
        stdio,
        mode,
        allow_hosts,
        metrics_listen,
    } = how;
    // The provider is asked at start, in the background: a wrong `issuer` is then in the
    // log before the first user's request fails on it, and `/readyz` says it until the
    // provider agrees (asked again every 30 s; `[auth.oidc]` itself changes only at restart).
    let ready = quiver_host::Ready::of(app);
    if let Some(oidc) = config.auth.oidc.clone()
        && !stdio
    {
        let ready = ready.clone();
        tokio::spawn(async move {
            let mut said = None;
            loop {
                let problem =
                    quiver_host::identity::oidc_problem(&oidc, std::time::Duration::from_secs(10))
                        .await;
                match &problem {
                    Some((why, true)) => {
                        ready.set_auth_problem(Some(format!(
                            "[auth.oidc] does not match the provider, so no access token can be checked: {why}"
                        )));
                        if said.as_ref() != Some(why) {
                            tracing::error!(
                                "[auth.oidc]: no access token can be checked until this is fixed: {why}"
                            );
                        }
                    }
                    Some((why, false)) => {
                        ready.set_auth_problem(None);
                        if said.as_ref() != Some(why) {
                            tracing::warn!(
                                "[auth.oidc]: the provider cannot be read now (tokens are checked once it can): {why}"
                            );
                        }
                    }
                    None => {
                        ready.set_auth_problem(None);
                        if said.is_some() {
                            tracing::info!(
                                "[auth.oidc]: the provider is read, and access tokens are checked"
                            );
                        }
                        return;
                    }
                }
                said = problem.map(|(why, _)| why);
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            }
        });
    }
    let transport = if stdio {
        quiver_host::serve::Transport::Stdio
    } else {
        quiver_host::serve::Transport::Http(listen.addr)
    };
    apply_retention(app, config).await?;
    app.seed().await?;
    // Working sets go to the store as they change, so a restarted server (or
    // another replica) gives a returning conversation its tools back.
    let _mirror = app.surface.spawn_persistence(app.store.clone());
    // The stored resident floor (derived and stored now if due) is re-read every
    // `floor_cache_ttl_secs` and derived again once older than `floor_max_age_secs`.
    let store = &*app.store;
    app.surface.load_floor(store, store, true).await;
    let floor_keeper = app
        .surface
        .spawn_floor_keeper(app.store.clone(), app.store.clone());
    let definitions = app.spawn_definition_recorder();
    // The allocator gives back what a burst of calls freed, so the resident memory follows
    // what is in use.
    let trimmer = quiver_host::allocator::spawn_trimmer();
    // With `[search] model_dir`: the model loads and the tools' vectors are computed in the
    // background; the search is lexical until then.
    let _retriever = app.start_retriever(config);
    // Custom tools approved, edited or disabled in the store (by any process) go live here.
    let custom_sync = app.spawn_custom_sync();
    let mut options = quiver_mcp_adapter::ServerOptions::default()
        .with_default_mode(mode)
        .with_auth(config.inbound_auth())
        .with_input_wait(config.limits.input_wait()?)
        .with_max_sessions(config.limits.max_http_sessions()?);
    let admin_token = config.admin.token()?;
    if let Some(token) = &admin_token {
        options = options.with_admin_token(token.clone());
    }
    // The configuration reloads on a change of its files, on SIGHUP and at
    // `POST /admin/reload`.
    let (content, prompts) = content(app, config);
    let reloader = std::sync::Arc::new(app.reloader(config).with_prompts(prompts));
    // The admin page at `/admin`, behind the admin token (the reloader replaces the token
    // in place, so a rotated token is the page's too).
    let admin_page = admin_token
        .as_ref()
        .map(|token| quiver_host::admin_page::admin_page(app, reloader.clone(), token.clone()));
    if let Some(token) = admin_token {
        reloader.set_admin(token);
    }
    let _watching = match quiver_host::reload::watch_files(reloader.clone()) {
        Ok(watching) => Some(watching),
        Err(e) => {
            tracing::warn!(
                "configuration files not watched (SIGHUP and POST /admin/reload still reload): {e:#}"
            );
            None
        }
    };
    // A listener given by name accepts that name as `Host` too.
    let metrics_addr = metrics_listen.as_ref().map(|l| l.addr);
    let metrics_name = metrics_listen.and_then(|l| l.name);
    for host in allow_hosts
        .into_iter()
        .chain(listen.name)
        .chain(metrics_name)
    {
        options = options.with_allowed_host(host);
    }
    let mut own_signals = None;
    let signals = match signals {
        Some(signals) => signals,
        None => own_signals.insert(quiver_host::serve::Signals::watch()?),
    };
    let served = quiver_host::serve::serve(
        app.surface.clone(),
        app.dispatcher.clone(),
        transport,
        options,
        quiver_host::serve::Adapters {
            stores: Some(quiver_host::serve::Stores {
                sessions: app.store.clone(),
                calls: app.store.clone(),
            }),
            content: Some(content),
            readiness: Some(std::sync::Arc::new(ready)),
            reload: Some(reloader),
            metrics: Some(quiver_host::serve::MetricsServing {
                exposition: quiver_host::metrics::exposition(app),
                listen: metrics_addr,
            }),
            admin_page,
            session_servers: Some(std::sync::Arc::new(app.mcp.clone())),
        },
        signals,
    )
    .await;
    // Not reading the store while it closes.
    if let Some((_, task)) = &_watching {
        task.abort();
    }
    floor_keeper.abort();
    trimmer.abort();
    custom_sync.abort();
    // The job it was running, dropped unfinished: queued again now, for another replica or
    // the next start, rather than after the lease's stale bound.
    let _ = custom_sync.await;
    app.hand_back_jobs().await;
    // The definitions `check --against` compares with, all of them, before the store
    // closes (a serve that stops right after start-up lost some).
    definitions.finish(std::time::Duration::from_secs(10)).await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// What the server serves resources, prompts and completions from: the MCP client passing
/// the upstreams' through, behind the local prompts (command files and skills), which a
/// reload replaces, and the results kept whole for their sessions
/// (`quiver://results/<call id>`); and those local prompts. The prompts capability is offered when
/// `[skills]` names any directory (even while none loads) or a prompt is there when a
/// client initializes; with neither, a client that connects before a reload adds the
/// first skills directory sees prompts only when it connects again.
fn content(
    app: &App,
    config: &Config,
) -> (
    std::sync::Arc<dyn quiver_mcp_adapter::ContentSource>,
    std::sync::Arc<quiver_mcp_adapter::LocalPrompts>,
) {
    let upstreams: std::sync::Arc<dyn quiver_mcp_adapter::ContentSource> =
        std::sync::Arc::new(app.mcp.clone());
    let local = std::sync::Arc::new(
        quiver_mcp_adapter::LocalPrompts::new(app.prompts.clone(), Some(upstreams))
            .offered_while_empty(config.skills.all_dirs().next().is_some())
            .with_kept_results(app.dispatcher.kept_results().clone()),
    );
    (local.clone(), local)
}
