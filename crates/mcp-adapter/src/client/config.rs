//! Upstream server configuration: what the host reads from TOML, and its validation into
//! [`ResolvedServer`]s (interpolated, with tokens and the https rule checked).

mod duration;
mod redact;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
    path::PathBuf,
    time::Duration,
};

use quiver_contract::validate_server_name;
use reqwest::{
    Url,
    header::{AUTHORIZATION, HeaderName, HeaderValue},
};
use serde::{Deserialize, Serialize};

use self::duration::{de_duration, ser_duration};
pub use self::redact::redact_urls;
use self::redact::{carries_credential, redact_one};
use crate::McpError;

/// How Quiver talks to an upstream server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TransportKind {
    /// A child process speaking JSON-RPC over stdin/stdout.
    Stdio,
    /// Streamable HTTP.
    Http,
}

/// How often to ping a connected server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// Ping at this interval.
    Every(Duration),
    /// Never ping; a dead connection is noticed when it closes or a call fails.
    Off,
}

fn yes() -> bool {
    true
}

/// Who a server's process serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ServerScope {
    /// One connection for the whole process, shared by every session (the default).
    #[default]
    Shared,
    /// One process per MCP session, started at the session's first `tools/list` or
    /// `tools/call`, given that session's roots and stopped when it ends or idles out; its
    /// tools are the catalog's client-MCP family and reach only the calling session's
    /// process. Stdio servers only.
    Session,
}

/// How long a per-session server may go without a call before it is stopped, when the
/// configuration does not say (`idle_timeout`).
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// How many processes of one per-session server one principal may run at once, when the
/// configuration does not say (`max_per_principal`).
pub const SESSION_MAX_PER_PRINCIPAL: usize = 8;
/// Whose credentials a server's calls carry (`auth` of a `[[mcp.servers]]` entry).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UpstreamAuth {
    /// Quiver's own: the configured `headers` and `MCP_<NAME>_TOKEN`, one connection for
    /// every caller.
    #[default]
    Static,
    /// The caller's own access token, as it was presented to Quiver: only to a server of
    /// Quiver's audience (`audience` equal to `[auth.oidc] resource`).
    Passthrough,
    /// A token for the server's `audience`, obtained for the caller by RFC 8693 token
    /// exchange at the issuer, as Quiver's own client.
    Exchange,
}

impl UpstreamAuth {
    /// Whether the server acts for the user (a connection per user).
    pub fn per_user(self) -> bool {
        !matches!(self, UpstreamAuth::Static)
    }

    /// The value as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamAuth::Static => "static",
            UpstreamAuth::Passthrough => "passthrough",
            UpstreamAuth::Exchange => "exchange",
        }
    }
}

/// The most users with a connection of their own to one server at once, by default.
pub const DEFAULT_MAX_USER_CONNECTIONS: usize = 64;

/// How long a user's connection to a server may sit unused before it is closed, by default.
pub const DEFAULT_USER_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// One upstream MCP server as configured (for example a `[[mcp.servers]]` TOML table).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ServerConfig {
    /// `[A-Za-z0-9_]+`, no `__`, unique ignoring case; it names the tools and the token
    /// variable `MCP_<NAME>_TOKEN`.
    pub name: String,
    /// `stdio` or `http`; inferred from `url` / `command` when absent.
    #[serde(default)]
    pub transport: Option<TransportKind>,
    /// The program to run (stdio).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments (stdio).
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment for the child (stdio); values may use `${env:VAR}`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// More of Quiver's own environment for the child (stdio): variable names, `*`
    /// anywhere (`["AWS_*"]`; `["*"]` is all of it). The child always gets
    /// [`INHERITED_ENV`] and `env`; nothing else of Quiver's environment (its inbound
    /// secrets, other servers' `MCP_<NAME>_TOKEN`) unless named here.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    /// The child's working directory (stdio).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The endpoint (http).
    #[serde(default)]
    pub url: Option<String>,
    /// Extra request headers (http), sent only to the configured origin; values may use
    /// `${env:VAR}`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The HTTP request timeout (http).
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub http_timeout: Option<Duration>,
    /// The `<server>` segment of tool names, when it should differ from `name`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// The host cannot start without this server (see `McpClient::wait_ready`).
    #[serde(default)]
    pub required: bool,
    /// Ping interval, or `off`; the client default (15 s) when absent.
    #[serde(default)]
    pub liveness: Option<Liveness>,
    /// Per-call timeout; the client default (120 s) when absent.
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub call_timeout: Option<Duration>,
    /// How long one connection attempt (start-up, `initialize`, the first `tools/list`) may
    /// take; the client default (30 s) when absent. A server fetched by `npx -y` or `uvx`
    /// on its first start may need more.
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub connect_timeout: Option<Duration>,
    /// Bridge the server's resources through `list_mcp_resources` / `read_mcp_resource`.
    #[serde(default = "yes")]
    pub resources: bool,
    /// Offer the server's prompts as `/mcp__<server>__<prompt>` expansions, and serve
    /// them from `quiver serve` as `mcp__<prefix>__<prompt>`.
    #[serde(default = "yes")]
    pub prompts: bool,
    /// Serve this server's prompts from `quiver serve` under their upstream names (no
    /// `mcp__<prefix>__`); a name another bare server already lists is skipped.
    #[serde(default)]
    pub bare_prompts: bool,
    /// Upstream tool names to publish (all when absent).
    #[serde(default)]
    pub allow_tools: Option<Vec<String>>,
    /// Upstream tool names never to publish.
    #[serde(default)]
    pub deny_tools: Vec<String>,
    /// Allows a bearer token over plain http to a non-loopback host for this server.
    #[serde(default)]
    pub insecure_http: bool,
    /// Progressive disclosure for every tool of this server: each is listed with the first
    /// sentence of its description and an open schema until the session's
    /// `describe_tool` loads its full definition.
    #[serde(default)]
    pub progressive: bool,
    /// Progressive disclosure for the upstream tools these names or patterns (`*` for any
    /// run of characters) match.
    #[serde(default)]
    pub progressive_tools: Vec<String>,
    /// Model capabilities every tool of this server needs (for example `vision`): offered
    /// only to callers whose model declares them (`model_capabilities` of a token).
    #[serde(default)]
    pub requires: Vec<String>,
    /// `shared` (the default: one connection for the process) or `session` (one process
    /// per MCP session, rooted at that session's client roots; see [`ServerScope`]).
    #[serde(default)]
    pub scope: ServerScope,
    /// A per-session server is stopped after this long without a call (and started again
    /// by the session's next call); [`SESSION_IDLE_TIMEOUT`] when absent.
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub idle_timeout: Option<Duration>,
    /// How many processes of this per-session server one principal (an inbound token's
    /// name; `anonymous` without one) may run at once; [`SESSION_MAX_PER_PRINCIPAL`] when
    /// absent. A session over it is refused the server's tools, in words.
    #[serde(default)]
    pub max_per_principal: Option<usize>,
    /// Whose credentials the server's calls carry: `static` (the default: `headers` and
    /// `MCP_<NAME>_TOKEN`), `passthrough` (the caller's access token) or `exchange` (a token
    /// exchanged for the caller). The last two act for the user: each user gets a
    /// connection of their own, a call without a user is refused, and only the server's
    /// tools are served (not its resources or prompts, which would be read with Quiver's
    /// own credentials).
    #[serde(default)]
    pub auth: UpstreamAuth,
    /// The resource URI the server accepts tokens for (RFC 8707). `passthrough`: required,
    /// and must be Quiver's own `[auth.oidc] resource`. `exchange`: the audience the token
    /// is exchanged for (the server's `url` when absent).
    #[serde(default)]
    pub audience: Option<String>,
    /// `passthrough` and `exchange`: the most users with a connection of their own at once
    /// (default 64); the least recently used is closed for a new one.
    #[serde(default)]
    pub max_user_connections: Option<usize>,
    /// `passthrough` and `exchange`: how long a user's connection may sit unused before it
    /// is closed (default 5 min).
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub user_idle_timeout: Option<Duration>,
}

impl ServerConfig {
    /// A stdio server.
    pub fn stdio(name: impl Into<String>, command: impl Into<String>, args: Vec<String>) -> Self {
        ServerConfig {
            transport: Some(TransportKind::Stdio),
            command: Some(command.into()),
            args,
            ..ServerConfig::named(name)
        }
    }

    /// A streamable-HTTP server.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        ServerConfig {
            transport: Some(TransportKind::Http),
            url: Some(url.into()),
            ..ServerConfig::named(name)
        }
    }

    fn named(name: impl Into<String>) -> Self {
        ServerConfig {
            name: name.into(),
            transport: None,
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            inherit_env: Vec::new(),
            cwd: None,
            url: None,
            headers: BTreeMap::new(),
            http_timeout: None,
            prefix: None,
            required: false,
            liveness: None,
            call_timeout: None,
            connect_timeout: None,
            resources: true,
            prompts: true,
            bare_prompts: false,
            allow_tools: None,
            progressive: false,
            progressive_tools: Vec::new(),
            requires: Vec::new(),
            deny_tools: Vec::new(),
            insecure_http: false,
            scope: ServerScope::Shared,
            idle_timeout: None,
            max_per_principal: None,
            auth: UpstreamAuth::Static,
            audience: None,
            max_user_connections: None,
            user_idle_timeout: None,
        }
    }

    /// Runs one process of this server per MCP session (see [`ServerScope::Session`]).
    pub fn per_session(mut self) -> Self {
        self.scope = ServerScope::Session;
        self
    }

    /// Sets whose credentials the server's calls carry, and the audience.
    pub fn with_auth(mut self, auth: UpstreamAuth, audience: Option<String>) -> Self {
        self.auth = auth;
        self.audience = audience;
        self
    }

    /// Sets an environment variable for the child.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Lets the child have these of Quiver's environment variables too (`*` anywhere).
    pub fn with_inherit_env(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.inherit_env = names.into_iter().map(Into::into).collect();
        self
    }

    /// Sets a header.
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    /// Marks the server required.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// Sets the liveness interval.
    pub fn with_liveness(mut self, liveness: Liveness) -> Self {
        self.liveness = Some(liveness);
        self
    }

    /// Sets the per-call timeout.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// Sets the working directory.
    pub fn with_cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Opts this server into bearer tokens over plain http.
    pub fn insecure_http(mut self) -> Self {
        self.insecure_http = true;
        self
    }

    /// The token variable this server's name derives: `MCP_<NAME>_TOKEN`, uppercased.
    pub fn token_var(&self) -> String {
        token_var(&self.name)
    }
}

/// The bearer-token variable of server `name`: `MCP_<NAME>_TOKEN`, uppercased.
pub(crate) fn token_var(name: &str) -> String {
    format!("MCP_{}_TOKEN", name.to_ascii_uppercase())
}

/// The whole client configuration as a host may read it: the servers, and optionally the
/// opt-in list form of `insecure_http` (server names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct McpClientConfig {
    /// The servers.
    #[serde(default)]
    pub servers: Vec<ServerConfig>,
    /// Servers allowed a bearer token over plain http (same as their `insecure_http = true`).
    #[serde(default)]
    pub insecure_http: Vec<String>,
}

impl McpClientConfig {
    /// Applies the opt-in list (every name must be a configured server) and validates.
    pub fn finalize(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<ResolvedServer>, McpError> {
        let mut servers = self.servers.clone();
        for name in &self.insecure_http {
            let Some(s) = servers.iter_mut().find(|s| &s.name == name) else {
                return Err(McpError::Config(format!(
                    "insecure_http names {name:?}, which is not a configured MCP server"
                )));
            };
            s.insecure_http = true;
        }
        validate_all(&servers, env)
    }
}

/// A secret that never prints.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How to reach a validated server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Endpoint {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, Secret>,
        inherit_env: Vec<String>,
        cwd: Option<PathBuf>,
    },
    Http {
        url: Url,
        headers: Vec<(HeaderName, HeaderValue)>,
        token: Option<Secret>,
        timeout: Option<Duration>,
    },
}

/// A validated server, ready to connect: names checked, `${env:VAR}` interpolated, the token
/// read and the https rule enforced. Two are equal when every setting is (a reload
/// restarts a server whose settings changed and leaves an equal one alone).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ResolvedServer {
    /// The configured name.
    pub name: String,
    /// The `<server>` segment of its tool names.
    pub prefix: String,
    /// Required by the host.
    pub required: bool,
    /// Ping interval override.
    pub liveness: Option<Liveness>,
    /// Per-call timeout override.
    pub call_timeout: Option<Duration>,
    /// Connection-attempt timeout override.
    pub connect_timeout: Option<Duration>,
    /// Bridge resources.
    pub resources: bool,
    /// Offer prompts.
    pub prompts: bool,
    /// Serve prompts under their upstream names.
    pub bare_prompts: bool,
    pub(crate) allow_tools: Option<BTreeSet<String>>,
    pub(crate) deny_tools: BTreeSet<String>,
    /// Every tool progressive.
    pub(crate) progressive: bool,
    /// Upstream tool patterns made progressive.
    pub(crate) progressive_tools: Vec<String>,
    /// Model capabilities its tools need.
    pub(crate) requires: Vec<String>,
    /// Shared, or one process per session.
    pub scope: ServerScope,
    /// A per-session server's idle timeout.
    pub(crate) idle_timeout: Duration,
    /// A per-session server's processes per principal.
    pub(crate) max_per_principal: usize,
    /// Whose credentials its calls carry.
    pub auth: UpstreamAuth,
    /// The audience a user's token must have for it: `passthrough`, the configured one;
    /// `exchange`, the configured one or the server's `url`; `static`, none.
    pub audience: Option<String>,
    /// Users with a connection of their own at once (`passthrough`, `exchange`).
    pub(crate) max_user_connections: usize,
    /// How long a user's connection may sit unused.
    pub(crate) user_idle_timeout: Duration,
    /// This is one user's connection (`client/users.rs`), whose credential is the user's.
    pub(crate) for_user: bool,
    pub(crate) endpoint: Endpoint,
}

impl ResolvedServer {
    /// The catalog family of its tools: `mcp:<name>`.
    pub fn family(&self) -> String {
        format!("mcp:{}", self.name)
    }

    /// Whether an upstream tool is listed in its lightweight form until loaded.
    pub(crate) fn progressive(&self, tool: &str) -> bool {
        self.progressive
            || self
                .progressive_tools
                .iter()
                .any(|p| quiver_contract::pattern_matches(p, tool))
    }

    /// Whether the allow/deny lists let an upstream tool through.
    pub(crate) fn admits(&self, tool: &str) -> bool {
        !self.deny_tools.contains(tool)
            && self.allow_tools.as_ref().is_none_or(|a| a.contains(tool))
    }

    /// The transport kind.
    pub fn transport(&self) -> TransportKind {
        match self.endpoint {
            Endpoint::Stdio { .. } => TransportKind::Stdio,
            Endpoint::Http { .. } => TransportKind::Http,
        }
    }
}

/// What a stdio server gets of Quiver's environment without asking (`inherit_env`): the
/// official MCP SDKs' stdio clients pass `HOME`, `LOGNAME`, `PATH`, `SHELL`, `TERM` and
/// `USER`; the locale, time zone, temporary directory, XDG base directories, CA bundles
/// and proxy settings are added, which servers started by `npx` or `uvx` need to fetch and
/// run (none of them a secret of Quiver's: a proxy URL may carry the operator's proxy
/// credentials, which these tools need to reach the registry).
pub const INHERITED_ENV: &[&str] = &[
    "HOME",
    "LOGNAME",
    "PATH",
    "SHELL",
    "TERM",
    "USER",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
];

/// The part of Quiver's environment a stdio server gets: [`INHERITED_ENV`] and the names
/// `inherit_env` matches.
pub(crate) fn inherited_env(
    inherit: &[String],
) -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> + '_ {
    std::env::vars_os().filter(move |(k, _)| {
        k.to_str().is_some_and(|k| {
            INHERITED_ENV
                .iter()
                .any(|p| quiver_contract::pattern_matches(p, k))
                || inherit
                    .iter()
                    .any(|p| quiver_contract::pattern_matches(p, k))
        })
    })
}

fn cfg_err(server: &str, msg: impl fmt::Display) -> McpError {
    McpError::Config(format!("MCP server \"{server}\": {msg}"))
}

/// Replaces every `${env:VAR}` in `value` ([`interpolate_env`]); an error names the server
/// and the key.
fn interpolate(
    server: &str,
    what: &str,
    value: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, McpError> {
    interpolate_env(value, env).map_err(|e| cfg_err(server, format!("{what}: {e}")))
}

/// Replaces `${env:VAR}` in one string (the config files' strings, and a server's `env` and
/// `headers`); a missing or empty variable is an error. Any other `${...}`
/// (`${VAR}`, `${ENV:VAR}`, VS Code's `${input:...}` and `${workspaceFolder}`) is an error
/// too: taken as it is, a bearer token written `${TOKEN}` would be that guessable text.
/// `$${` is a literal `${`.
pub fn interpolate_env(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        if rest[..i].ends_with('$') {
            // `$${`: a literal `${`.
            out.push_str(&rest[..i - 1]);
            out.push_str("${");
            rest = &rest[i + 2..];
            continue;
        }
        out.push_str(&rest[..i]);
        let Some(after) = rest[i..].strip_prefix("${env:") else {
            return Err(not_interpolated(&rest[i..]));
        };
        let Some(end) = after.find('}') else {
            return Err("`${env:` is not closed with `}`".to_owned());
        };
        let var = &after[..end];
        if let Some((name, _)) = var.split_once(":-") {
            return Err(format!(
                "`${{env:{var}}}`: Quiver has no default values in `${{env:...}}`; write `${{env:{name}}}` and set {name}"
            ));
        }
        if var.is_empty()
            || var
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '=' | '$' | '{' | ':'))
        {
            return Err(format!(
                "`${{env:{var}}}` does not name an environment variable: write `${{env:NAME}}`, e.g. `${{env:HOME}}`"
            ));
        }
        let Some(val) = env(var) else {
            return Err(format!(
                "environment variable {var} is not set (referenced as `${{env:{var}}}`)"
            ));
        };
        if val.is_empty() {
            return Err(format!(
                "environment variable {var} is set but empty (referenced as `${{env:{var}}}`): give it a value, or remove the reference"
            ));
        }
        out.push_str(&val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Why a `${...}` that is not `${env:NAME}` is refused, with what to write instead.
/// `text` begins with `${`.
fn not_interpolated(text: &str) -> String {
    let inner = text[2..].split('}').next().unwrap_or_default();
    let shown = if inner.len() < text.len() - 2 && inner.chars().count() <= 60 {
        format!("${{{inner}}}")
    } else {
        format!("${{{}…", inner.chars().take(60).collect::<String>())
    };
    let name = inner.split_once(':').map_or(inner, |(_, n)| n);
    let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let head = format!(
        "`{shown}` is not something Quiver fills in: it reads environment variables only as `${{env:NAME}}`"
    );
    if let Some((name, _)) = inner.split_once(":-") {
        return format!("{head}, with no default values: write `${{env:{name}}}` and set {name}");
    }
    if let Some((kind, _)) = inner.split_once(':')
        && kind.eq_ignore_ascii_case("env")
    {
        return format!("{head} (`env` in lower case): write `${{env:{name}}}`");
    }
    const VS_CODE: [&str; 6] = [
        "input:",
        "workspaceFolder",
        "userHome",
        "pathSeparator",
        "config:",
        "command:",
    ];
    if VS_CODE.iter().any(|v| inner.starts_with(v)) {
        return format!(
            "{head}; `${{input:...}}`, `${{workspaceFolder}}` and the other VS Code variables are filled in by VS Code, not here: put the value in an environment variable and write `${{env:NAME}}`, or write the value itself"
        );
    }
    if plain && !inner.contains(':') {
        return format!("{head}: write `${{env:{name}}}` (or `$${{` for a literal `${{`)");
    }
    format!("{head} (or `$${{` for a literal `${{`)")
}

/// Whether a URL's host is loopback: `localhost`, `127.0.0.0/8` or `[::1]`.
pub(crate) fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    }
}

/// Validates the whole configuration at once (so the result never depends on order) and
/// resolves each server: names (`[A-Za-z0-9_]+`, no `__`, unique ignoring case), transport
/// fields, `${env:VAR}` interpolation, the token `MCP_<NAME>_TOKEN` from `env` (empty counts
/// as none), and the https rule: with a credential (a token or a configured `Authorization`
/// header) the URL must be https or http to loopback unless the server sets
/// `insecure_http = true`; that opt-in is itself an error on a server that does not need it.
pub fn validate_all(
    servers: &[ServerConfig],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ResolvedServer>, McpError> {
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    let mut prefixes: BTreeMap<String, &str> = BTreeMap::new();
    let mut out = Vec::with_capacity(servers.len());
    for s in servers {
        validate_server_name(&s.name).map_err(|e| {
            McpError::Config(match quiver_contract::server_name_suggestion(&s.name) {
                Some(better) => format!(
                    "{e}; Quiver never renames a server (its name is part of every tool name, mcp__<server>__<tool>): rename it, e.g. to {better:?}"
                ),
                None => e.to_string(),
            })
        })?;
        // A server's tools are the family `mcp:<name>`; the resource meta-tools have
        // `mcp:resources`, which one server's going must never take with it.
        if s.name.eq_ignore_ascii_case("resources") {
            return Err(McpError::Config(format!(
                "the MCP server name \"{}\" is reserved (the resource tools list_mcp_resources and read_mcp_resource have the family {}); name the server differently, e.g. \"{}_server\"",
                s.name,
                super::meta::RESOURCE_TOOLS_FAMILY,
                s.name
            )));
        }
        if let Some(other) = seen.insert(s.name.to_ascii_lowercase(), &s.name) {
            return Err(McpError::Config(if other == s.name {
                format!("the MCP server name \"{other}\" is configured twice; rename one")
            } else {
                format!(
                    "MCP server names \"{other}\" and \"{}\" differ only in case; names must be unique ignoring case (each derives the variable {})",
                    s.name,
                    s.token_var()
                )
            }));
        }
        let prefix = s.prefix.clone().unwrap_or_else(|| s.name.clone());
        validate_server_name(&prefix).map_err(|e| cfg_err(&s.name, format!("prefix: {e}")))?;
        if let Some(other) = prefixes.insert(prefix.to_ascii_lowercase(), &s.name) {
            return Err(cfg_err(
                &s.name,
                format!("its tool prefix {prefix:?} is also used by server \"{other}\""),
            ));
        }
        out.push(resolve(s, prefix, env)?);
    }
    Ok(out)
}

fn resolve(
    s: &ServerConfig,
    prefix: String,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ResolvedServer, McpError> {
    let kind = match (s.transport, &s.command, &s.url) {
        (Some(k), _, _) => k,
        (None, Some(_), None) => TransportKind::Stdio,
        (None, None, Some(_)) => TransportKind::Http,
        (None, Some(_), Some(_)) => {
            return Err(cfg_err(
                &s.name,
                "both `command` and `url` are set; say `transport = \"stdio\"` or `\"http\"`",
            ));
        }
        (None, None, None) => {
            return Err(cfg_err(&s.name, "set `command` (stdio) or `url` (http)"));
        }
    };
    check_scope(s, kind)?;
    let endpoint = match kind {
        TransportKind::Stdio => {
            let Some(command) = s.command.clone() else {
                return Err(cfg_err(&s.name, "a stdio server needs `command`"));
            };
            if command.trim().is_empty() {
                return Err(cfg_err(
                    &s.name,
                    "`command` is empty; give the program to run (e.g. \"npx\")",
                ));
            }
            if s.url.is_some() || !s.headers.is_empty() || s.http_timeout.is_some() {
                return Err(cfg_err(
                    &s.name,
                    "`url`, `headers` and `http_timeout` apply to http servers only",
                ));
            }
            if s.insecure_http {
                return Err(cfg_err(
                    &s.name,
                    "`insecure_http = true` applies to http servers only; remove it",
                ));
            }
            if s.auth.per_user() {
                return Err(cfg_err(
                    &s.name,
                    format!(
                        "`auth = \"{}\"` applies to http servers only: a stdio server is one process shared by every caller, which a user's token cannot be sent to per call; remove `auth` (or reach the server over http)",
                        s.auth.as_str()
                    ),
                ));
            }
            let env_vars = s
                .env
                .iter()
                .map(|(k, v)| {
                    Ok((
                        k.clone(),
                        Secret(interpolate(&s.name, &format!("env.{k}"), v, env)?),
                    ))
                })
                .collect::<Result<_, McpError>>()?;
            if let Some(bad) = s
                .inherit_env
                .iter()
                .find(|p| p.is_empty() || p.contains('=') || p.chars().any(char::is_whitespace))
            {
                return Err(cfg_err(
                    &s.name,
                    format!(
                        "inherit_env: `{bad}` is not an environment variable name (or a pattern of them, `*` anywhere)"
                    ),
                ));
            }
            Endpoint::Stdio {
                command,
                args: s.args.clone(),
                env: env_vars,
                inherit_env: s.inherit_env.clone(),
                cwd: s.cwd.clone(),
            }
        }
        TransportKind::Http => {
            let Some(raw) = &s.url else {
                return Err(cfg_err(&s.name, "an http server needs `url`"));
            };
            if s.command.is_some()
                || !s.args.is_empty()
                || !s.env.is_empty()
                || !s.inherit_env.is_empty()
                || s.cwd.is_some()
            {
                return Err(cfg_err(
                    &s.name,
                    "`command`, `args`, `env`, `inherit_env` and `cwd` apply to stdio servers only",
                ));
            }
            let url = Url::parse(raw)
                .map_err(|e| cfg_err(&s.name, format!("url {:?}: {e}", redact_one(raw))))?;
            // What messages show: no user, password or query (they may carry secrets
            // from `${env:...}`).
            let shown = redact_one(raw);
            let https = match url.scheme() {
                "https" => true,
                "http" => false,
                other => {
                    return Err(cfg_err(
                        &s.name,
                        format!("url scheme {other:?} is not http or https"),
                    ));
                }
            };
            let mut headers = Vec::with_capacity(s.headers.len());
            // The first header that carries a credential: `Authorization`, and those named
            // for one (`Proxy-Authorization`, `Cookie`, `X-API-Key`, `X-Auth-Token`, ...).
            let mut credential_header: Option<String> = None;
            for (k, raw) in &s.headers {
                let v = interpolate(&s.name, &format!("headers.{k}"), raw, env)?;
                let name = HeaderName::try_from(k.as_str())
                    .map_err(|e| cfg_err(&s.name, format!("header {k:?}: {e}")))?;
                // Say what is wrong, and where it came from (http's own "failed to parse
                // header value" says neither). The value is not shown.
                if let Some(bad) = v
                    .chars()
                    .find(|c| (c.is_control() && *c != '\t') || *c == '\u{7f}')
                {
                    let from = if raw.contains("${env:") {
                        format!(" (its value comes from `{raw}`)")
                    } else {
                        String::new()
                    };
                    return Err(cfg_err(
                        &s.name,
                        format!(
                            "header {k:?}: the value contains the control character {bad:?}{from}, which a header cannot carry (a line break would start another header); remove it"
                        ),
                    ));
                }
                let mut value = HeaderValue::try_from(v)
                    .map_err(|e| cfg_err(&s.name, format!("header {k:?}: {e}")))?;
                if credential_header.is_none() && carries_credential(&name) {
                    credential_header = Some(k.clone());
                }
                value.set_sensitive(true);
                headers.push((name, value));
            }
            let token = env(&s.token_var())
                .filter(|t| !t.trim().is_empty())
                .map(Secret);
            // As for a configured header: a line break in the token would be refused by
            // every request, and the server retried forever.
            if let Some(bad) = token
                .as_ref()
                .and_then(|t| t.0.trim().chars().find(|c| c.is_control()))
            {
                return Err(cfg_err(
                    &s.name,
                    format!(
                        "the token in {} contains the control character {bad:?}, which an `Authorization` header cannot carry (a line break read from a file?); remove it",
                        s.token_var()
                    ),
                ));
            }
            let loopback = is_loopback(&url);
            let credential = match (&token, &credential_header) {
                (_, Some(h)) if !h.eq_ignore_ascii_case(AUTHORIZATION.as_str()) => {
                    Some(format!("the credential in header `{h}`"))
                }
                (Some(_), _) | (_, Some(_)) => Some("a bearer token".to_owned()),
                (None, None) => None,
            };
            if let Some(what) = credential
                && !https
                && !loopback
                && !s.insecure_http
            {
                return Err(cfg_err(
                    &s.name,
                    format!(
                        "{what} would travel in cleartext to {shown}; use https, or http to a loopback host, or opt this server in with `insecure_http = true`"
                    ),
                ));
            }
            if s.insecure_http && (https || loopback) {
                return Err(cfg_err(
                    &s.name,
                    format!(
                        "`insecure_http = true` is set but {shown} is already {}; remove the opt-in",
                        if https { "https" } else { "a loopback address" }
                    ),
                ));
            }
            if s.auth.per_user() && !https && !loopback {
                return Err(cfg_err(
                    &s.name,
                    format!(
                        "`auth = \"{}\"` would send users' access tokens in cleartext to {shown}: use https (plain http is accepted only to a loopback host, and `insecure_http` does not apply to users' tokens)",
                        s.auth.as_str()
                    ),
                ));
            }
            Endpoint::Http {
                url,
                headers,
                token,
                timeout: s.http_timeout,
            }
        }
    };
    let audience = user_audience(s)?;
    Ok(ResolvedServer {
        name: s.name.clone(),
        prefix,
        required: s.required,
        liveness: s.liveness,
        call_timeout: s.call_timeout,
        connect_timeout: s.connect_timeout,
        // A server that acts for the user serves tools only: its resources and prompts would
        // be read over the server's own connection, with Quiver's credentials, for any user.
        resources: s.resources && !s.auth.per_user(),
        prompts: s.prompts && !s.auth.per_user(),
        bare_prompts: s.bare_prompts && !s.auth.per_user(),
        allow_tools: s.allow_tools.as_ref().map(|a| a.iter().cloned().collect()),
        progressive: s.progressive,
        progressive_tools: s.progressive_tools.clone(),
        requires: s.requires.clone(),
        deny_tools: s.deny_tools.iter().cloned().collect(),
        scope: s.scope,
        idle_timeout: s.idle_timeout.unwrap_or(SESSION_IDLE_TIMEOUT),
        max_per_principal: s.max_per_principal.unwrap_or(SESSION_MAX_PER_PRINCIPAL),
        auth: s.auth,
        audience,
        max_user_connections: s
            .max_user_connections
            .unwrap_or(DEFAULT_MAX_USER_CONNECTIONS),
        user_idle_timeout: s.user_idle_timeout.unwrap_or(DEFAULT_USER_IDLE_TIMEOUT),
        for_user: false,
        endpoint,
    })
}

/// What `scope = "session"` rules out, and what only it allows.
fn check_scope(s: &ServerConfig, kind: TransportKind) -> Result<(), McpError> {
    if s.scope == ServerScope::Shared {
        for (set, key) in [
            (s.idle_timeout.is_some(), "idle_timeout"),
            (s.max_per_principal.is_some(), "max_per_principal"),
        ] {
            if set {
                return Err(cfg_err(
                    &s.name,
                    format!(
                        "`{key}` applies to per-session servers only; add `scope = \"session\"` or remove `{key}`"
                    ),
                ));
            }
        }
        return Ok(());
    }
    let why = if kind == TransportKind::Http {
        Some(
            "it is an http server, one endpoint Quiver connects to rather than a process it starts: run it as a stdio `command`, or remove `scope` to share it",
        )
    } else if s.required {
        Some(
            "`required = true` makes start-up wait for a server, and a per-session server starts only when a session uses it: remove one of the two",
        )
    } else if s.bare_prompts {
        Some(
            "a per-session server serves tools only (no resources or prompts), so `bare_prompts = true` has nothing to serve: remove it",
        )
    } else {
        None
    };
    if let Some(why) = why {
        return Err(cfg_err(
            &s.name,
            format!("`scope = \"session\"` cannot apply: {why}"),
        ));
    }
    if s.max_per_principal == Some(0) {
        return Err(cfg_err(
            &s.name,
            "`max_per_principal = 0` would refuse every session; give at least 1, or remove the server",
        ));
    }
    if s.idle_timeout.is_some_and(|d| d.is_zero()) {
        return Err(cfg_err(
            &s.name,
            "`idle_timeout` is zero, which would stop the server between any two calls; give a duration such as \"10m\"",
        ));
    }
    Ok(())
}

/// The audience of a server that acts for the user, checked: `audience` (an absolute URL
/// without a fragment), or for `exchange` the server's `url`. The per-user keys are refused
/// on a `static` server, where they would do nothing.
fn user_audience(s: &ServerConfig) -> Result<Option<String>, McpError> {
    if !s.auth.per_user() {
        let stray = [
            ("audience", s.audience.is_some()),
            ("max_user_connections", s.max_user_connections.is_some()),
            ("user_idle_timeout", s.user_idle_timeout.is_some()),
        ];
        if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(cfg_err(
                &s.name,
                format!(
                    "`{key}` applies only to a server that acts for the user (`auth = \"passthrough\"` or `\"exchange\"`); this one has `auth = \"static\"`: remove the key, or set `auth`"
                ),
            ));
        }
        return Ok(None);
    }
    if s.max_user_connections == Some(0) {
        return Err(cfg_err(
            &s.name,
            "`max_user_connections = 0` would refuse every user: give at least 1 (or remove the key for the default, 64)",
        ));
    }
    let audience = match (&s.audience, s.auth) {
        (Some(a), _) => a.clone(),
        (None, UpstreamAuth::Exchange) => s.url.clone().unwrap_or_default(),
        (None, _) => {
            return Err(cfg_err(
                &s.name,
                "`auth = \"passthrough\"` needs `audience`: the resource URI the server accepts tokens for, which must be Quiver's own `[auth.oidc] resource` (a user's token is passed only to a server of its own audience; for a server of another audience use `auth = \"exchange\"`)",
            ));
        }
    };
    match Url::parse(&audience) {
        Ok(u) if u.fragment().is_none() => Ok(Some(audience)),
        Ok(_) => Err(cfg_err(
            &s.name,
            format!(
                "`audience = {audience:?}` has a fragment (`#...`), which a resource URI may not have; remove it"
            ),
        )),
        Err(e) => Err(cfg_err(
            &s.name,
            format!(
                "`audience = {audience:?}` is not an absolute URL ({e}): give the server's resource URI, e.g. https://tools.example.com/mcp"
            ),
        )),
    }
}

/// Refuses every server that would send a user's token where it does not belong, given
/// Quiver's inbound `[auth.oidc]`: `resource` (Quiver's audience, `None` without
/// `[auth.oidc]`) and whether Quiver's own client for token exchange is configured. A
/// `passthrough` server must have Quiver's audience; any server acting for the user needs
/// `[auth.oidc]`; an `exchange` server needs the exchange client. Errors name the server
/// and the key.
pub fn check_delegation(
    servers: &[ResolvedServer],
    resource: Option<&str>,
    exchange_client: bool,
) -> Result<(), McpError> {
    for s in servers.iter().filter(|s| s.auth.per_user()) {
        let auth = s.auth.as_str();
        let Some(resource) = resource else {
            return Err(cfg_err(
                &s.name,
                format!(
                    "`auth = \"{auth}\"` acts for the user, but there is no `[auth.oidc]`: callers present no user's token to pass on or exchange. Configure `[auth.oidc]`, or remove `auth` (static credentials)"
                ),
            ));
        };
        let audience = s.audience.as_deref().unwrap_or_default();
        match s.auth {
            UpstreamAuth::Passthrough if audience != resource => {
                return Err(cfg_err(
                    &s.name,
                    format!(
                        "`auth = \"passthrough\"` with `audience = {audience:?}`, which is not Quiver's own audience `[auth.oidc] resource = {resource:?}`: a user's token is never sent to a server of another audience. Use `auth = \"exchange\"` (a token for that audience, obtained at the issuer), or correct `audience` if the server really accepts Quiver's tokens"
                    ),
                ));
            }
            UpstreamAuth::Exchange if !exchange_client => {
                return Err(cfg_err(
                    &s.name,
                    "`auth = \"exchange\"` needs Quiver's own client at the issuer: set `client_id` and `client_secret` in `[auth.oidc]`",
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
