//! Reloading a running `quiver serve` without a restart. A reload reads `quiver.toml` and
//! the `--mcp-config` files again and checks them whole; when anything is wrong nothing
//! changes, and the reason goes to the log and to the reload status file `quiver status`
//! reads. When they are good:
//! - the upstream MCP servers are reconciled ([`McpClient::reconcile`]): a new one
//!   connects, a removed one is closed and its tools leave, a changed one reconnects, and
//!   the others are untouched (no reconnect, no dropped call);
//! - the policy rules, `[limits]` and `[surface]` apply to the next call ([`LivePolicy`],
//!   [`Dispatcher::reconfigure`], [`Surface::reconfigure`]; calls already running finish
//!   under the limits they started with), and the inbound tokens (`[auth]`) to the next
//!   request over HTTP;
//! - skills and command files are read again when `[skills]` or anything in their
//!   directories changed: the `skill` tool is replaced and the local prompts with it;
//! - a changed admin token is checked from the next request on;
//! - the settings read only at start (the store, the sandbox, an admin token set or
//!   removed, the HTTP server's `limits.max_http_sessions` and `limits.input_wait_secs`;
//!   the tokens when serving on stdio) are compared, and a change there is reported as needing a restart
//!   rather than half applied.
//!
//! Clients see a changed tool list as `notifications/tools/list_changed`, as for any
//! catalog change, and changed prompts as `notifications/prompts/list_changed`; a reload
//! that changes nothing sends neither and reconnects nothing. Triggers: [`watch_files`]
//! (the files' directories and the skills directories, debounced), SIGHUP, and
//! `POST /admin/reload` behind the admin token. One reload runs at a time.
//!
//! Over 800 lines: one reload compares and applies every section in one place (the
//! servers, policy, tokens, limits, surface, skills, the catalog directory, and what needs
//! a restart), so the report it writes is what it did; the file watcher and the per-process
//! report files sit beside it.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use quiver_mcp_adapter::{LocalPrompts, McpClient};
use quiver_registry::{
    Catalog, Dispatcher, Family, PolicyCheck, PolicyRequest, PolicyVerdict, RulePolicy,
};
use quiver_surface::Surface;
use serde_json::{Value, json};

use crate::Config;

/// The dispatcher's policy check, whose rules a reload replaces for the next call.
#[derive(Debug, Default)]
pub struct LivePolicy(RwLock<Arc<RulePolicy>>);

impl LivePolicy {
    /// A policy of `config`'s rules.
    pub fn of(config: &Config) -> Self {
        LivePolicy(RwLock::new(Arc::new(RulePolicy::new(
            config.policy.rules.clone(),
        ))))
    }

    fn set(&self, config: &Config) {
        let rules = Arc::new(RulePolicy::new(config.policy.rules.clone()));
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = rules;
    }
}

impl PolicyCheck for LivePolicy {
    fn check<'a>(&self, request: &PolicyRequest<'a>) -> Vec<PolicyVerdict> {
        let rules = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        rules.check(request)
    }
}

/// How long file events are gathered before one reload runs (an editor's save is several).
pub const DEBOUNCE: Duration = Duration::from_millis(300);

/// How long a reload's new servers are watched for their first state, for the log.
const RELOADED_SERVER_WAIT: Duration = Duration::from_secs(60);

/// Reloads the configuration of a running server.
pub struct Reloader {
    config_path: Option<PathBuf>,
    mcp_files: Vec<PathBuf>,
    mcp: McpClient,
    policy: Arc<LivePolicy>,
    /// The configuration in force, and the skills fingerprint it was loaded with; held for
    /// the whole of a reload, so one runs at a time.
    current: tokio::sync::Mutex<(Config, u64)>,
    /// The configuration the server started with: what the sections a reload cannot apply
    /// (`needs_restart`) are compared with, so undoing such a change schedules no restart.
    started: Config,
    status_file: PathBuf,
    catalog: Arc<Catalog>,
    /// The local prompts `serve` offers (skills and command files), replaced with them.
    prompts: Option<Arc<LocalPrompts>>,
    /// The catalog directory's tools, the skills they serve from, and the directory's
    /// fingerprint as last read.
    catalog_dir: Option<CatalogDirState>,
    /// The server's inbound tokens, once it serves over HTTP.
    auth: std::sync::OnceLock<quiver_mcp_adapter::AuthHandle>,
    /// The dispatcher and the surface whose settings (`[limits]`, `[surface]`) a reload
    /// replaces.
    pipeline: Option<(Dispatcher, Arc<Surface>)>,
    /// The admin token the HTTP server checks, once it serves with one.
    admin: std::sync::OnceLock<quiver_mcp_adapter::AdminToken>,
    /// Who may call `create_custom_tool`, replaced with the tokens; `None` when the server
    /// started without the tool.
    proposal_admins: Option<quiver_registry::custom::ProposalAdmins>,
}

struct CatalogDirState {
    tools: Arc<crate::catalog_dir::CatalogDirTools>,
    skills: std::sync::Mutex<Arc<dyn quiver_registry::skill::SkillSource>>,
    print: std::sync::Mutex<u64>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("config", &self.config_path)
            .field("mcp_files", &self.mcp_files)
            .finish_non_exhaustive()
    }
}

/// The reload report of the `quiver serve` with process id `pid` on the store at `store`:
/// beside it, `<store>.reload.<pid>.json`. One file per process, so replicas that share a
/// configuration directory each keep their own.
pub fn report_file(store: &Path, pid: u32) -> PathBuf {
    let mut name = store.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".reload.{pid}.json"));
    store.with_file_name(name)
}

/// The reload reports beside the store at `store`, of the processes that still run on this
/// host, ordered by process id. A report whose process has ended is not returned.
pub fn reports(store: &Path) -> Vec<(u32, Value)> {
    let mut found: Vec<(u32, Value)> = report_files(store)
        .into_iter()
        .filter(|(pid, _)| running(*pid))
        .filter_map(|(pid, file)| {
            let text = std::fs::read_to_string(file).ok()?;
            Some((pid, serde_json::from_str(&text).ok()?))
        })
        .collect();
    found.sort_by_key(|(pid, _)| *pid);
    found
}

/// Every `<store>.reload.<pid>.json` beside the store, with its process id.
fn report_files(store: &Path) -> Vec<(u32, PathBuf)> {
    let prefix = format!(
        "{}.reload.",
        store.file_name().unwrap_or_default().to_string_lossy()
    );
    let dir = match store.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix(&prefix)?
                .strip_suffix(".json")?
                .parse()
                .ok()?;
            Some((pid, store.with_file_name(name)))
        })
        .collect()
}

/// Whether process `pid` runs on this host. Where that cannot be told (no `/proc`), every
/// report is taken as live.
fn running(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}

/// A server that stops takes its report with it: `quiver status` shows running servers.
impl Drop for Reloader {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.status_file);
    }
}

impl Reloader {
    /// A reloader of the server `config` (read from `config_path`, `None` for
    /// `./quiver.toml` when it exists) and the `mcp_files` configured. Reports left by
    /// processes that no longer run are removed, and this process's is written: started,
    /// not reloaded yet.
    pub fn new(
        config: Config,
        config_path: Option<PathBuf>,
        mcp_files: Vec<PathBuf>,
        mcp: McpClient,
        policy: Arc<LivePolicy>,
        catalog: Arc<Catalog>,
    ) -> Self {
        let status_file = report_file(&config.store.path, std::process::id());
        for (pid, file) in report_files(&config.store.path) {
            if pid == std::process::id() || !running(pid) {
                let _ = std::fs::remove_file(file);
            }
        }
        let print = skills_fingerprint(&config);
        let reloader = Reloader {
            config_path,
            mcp_files,
            mcp,
            policy,
            started: config.clone(),
            current: tokio::sync::Mutex::new((config, print)),
            status_file,
            catalog,
            prompts: None,
            catalog_dir: None,
            auth: std::sync::OnceLock::new(),
            pipeline: None,
            admin: std::sync::OnceLock::new(),
            proposal_admins: None,
        };
        // A report from the start, so `quiver status` finds every running server, reloaded
        // or not.
        reloader.record(&json!({"ok": true, "trigger": "start"}));
        reloader
    }

    /// The admin token the server checks, which a reload replaces when `[admin] token`
    /// changes (a token set or removed where there was none, or is none, needs a restart:
    /// the admin endpoints exist only when the server starts with one).
    pub fn set_admin(&self, token: quiver_mcp_adapter::AdminToken) {
        let _ = self.admin.set(token);
    }

    /// Replaces the settings of `dispatcher` (`[limits]`) and `surface` (`[surface]`, and
    /// the tools a policy denies everyone, which it never offers) when they change.
    pub fn with_pipeline(mut self, dispatcher: Dispatcher, surface: Arc<Surface>) -> Self {
        self.pipeline = Some((dispatcher, surface));
        self
    }

    /// Who may propose custom tools, which a reload replaces with the tokens.
    pub fn with_admins(mut self, admins: Option<quiver_registry::custom::ProposalAdmins>) -> Self {
        self.proposal_admins = admins;
        self
    }

    /// The inbound tokens a reload replaces (`[auth]`, and the deny rules that keep tools
    /// off a token's lists).
    pub fn set_auth(&self, auth: quiver_mcp_adapter::AuthHandle) {
        let _ = self.auth.set(auth);
    }

    /// Keeps the catalog directory's tools in step: read again when anything under it
    /// moved, or `[catalog]` changed; `skills` serves its skill-kind tools until a reload
    /// reads the skills again.
    pub fn with_catalog_dir(
        mut self,
        tools: Arc<crate::catalog_dir::CatalogDirTools>,
        skills: Arc<dyn quiver_registry::skill::SkillSource>,
    ) -> Self {
        let print = self
            .current
            .try_lock()
            .map(|held| catalog_fingerprint(&held.0))
            .unwrap_or_default();
        self.catalog_dir = Some(CatalogDirState {
            tools,
            skills: std::sync::Mutex::new(skills),
            print: std::sync::Mutex::new(print),
        });
        self
    }

    /// Replaces `prompts` with the skills and command files a reload reads.
    pub fn with_prompts(mut self, prompts: Arc<LocalPrompts>) -> Self {
        self.prompts = Some(prompts);
        self
    }

    /// The directories watched whole: skills, command files, the catalog directory.
    fn trees(config: &Config) -> Vec<PathBuf> {
        config
            .skills
            .all_dirs()
            .chain(config.catalog.dir.iter())
            .cloned()
            .collect()
    }

    /// The configuration in force (secrets unmasked: for checks, never printed); `None`
    /// while a reload holds it.
    pub fn config_in_force(&self) -> Option<Config> {
        Some(self.current.try_lock().ok()?.0.clone())
    }

    /// The configuration in force as quiver.toml writes it, every secret masked
    /// ([`Config::as_toml`]), under comments naming the file and the `--mcp-config` files;
    /// `None` while a reload holds it.
    pub fn effective_config(&self) -> Option<String> {
        let config = self.current.try_lock().ok()?.0.clone();
        let mut out = format!(
            "# config file: {}\n",
            self.config_path.as_deref().map_or_else(
                || "./quiver.toml (if present)".to_owned(),
                |p| p.display().to_string()
            )
        );
        if !self.mcp_files.is_empty() {
            let files: Vec<String> = self
                .mcp_files
                .iter()
                .map(|f| f.display().to_string())
                .collect();
            out.push_str(&format!(
                "# servers from --mcp-config: {}\n",
                files.join(", ")
            ));
        }
        out.push('\n');
        out.push_str(&config.as_toml());
        Some(out)
    }

    /// The last reload's result as `quiver status` reads it (JSON), if one ran.
    pub fn last_result(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.status_file).ok()?;
        Some(
            serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or(text),
        )
    }

    /// The files a change of which reloads.
    pub fn files(&self) -> Vec<PathBuf> {
        let config = self
            .config_path
            .clone()
            .unwrap_or_else(|| PathBuf::from("quiver.toml"));
        std::iter::once(config)
            .chain(self.mcp_files.iter().cloned())
            .collect()
    }

    /// Reads and checks everything a reload applies, changing nothing.
    fn read(&self) -> anyhow::Result<(Config, Vec<quiver_mcp_adapter::ResolvedServer>)> {
        let (config, _) = Config::load(self.config_path.as_deref())?;
        let env = |k: &str| std::env::var(k).ok();
        let servers = crate::mcp_json::resolve_servers(&config, &self.mcp_files, &env)?;
        config.sandbox.limits()?;
        config.custom.lease()?;
        config
            .inbound_auth()
            .validate()
            .map_err(|e| anyhow::anyhow!("[auth]: {e}"))?;
        Ok((config, servers))
    }

    /// Logs how each server a reload started settles, as start-up does: connected with its
    /// tools, or down with why (a reload's report is written before they connect, so a
    /// server that cannot start would go unsaid).
    fn watch_new_servers(&self, names: Vec<String>) {
        if names.is_empty() {
            return;
        }
        let mcp = self.mcp.clone();
        tokio::spawn(async move {
            let mut waiting = names;
            let deadline = tokio::time::Instant::now() + RELOADED_SERVER_WAIT;
            while !waiting.is_empty() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                waiting.retain(|name| {
                    let Some(s) = mcp.server_status(name) else {
                        return false;
                    };
                    let last = s.diagnostics.last().cloned().unwrap_or_default();
                    match &s.state {
                        quiver_mcp_adapter::ServerState::Connecting => true,
                        quiver_mcp_adapter::ServerState::Connected => {
                            tracing::info!(
                                "upstream MCP server {name} (from a reload): connected, {} tool(s)",
                                s.tools.len()
                            );
                            false
                        }
                        quiver_mcp_adapter::ServerState::Rejected(why) => {
                            tracing::warn!("upstream MCP server {name} (from a reload): failed: {why}");
                            false
                        }
                        _ => {
                            tracing::warn!(
                                "upstream MCP server {name} (from a reload): down, retrying in the background ({last})"
                            );
                            false
                        }
                    }
                });
            }
            for name in waiting {
                tracing::warn!(
                    "upstream MCP server {name} (from a reload): still connecting after {} s; it keeps trying in the background (`quiver status` shows its state)",
                    RELOADED_SERVER_WAIT.as_secs()
                );
            }
        });
    }

    /// Reloads now; `trigger` says what asked. `Ok` with what changed, `Err` with why
    /// nothing did.
    pub async fn reload(&self, trigger: &str) -> Result<Value, Value> {
        let mut held = self.current.lock().await;
        let (current, print) = &mut *held;
        let (mut config, servers) = match self.read() {
            Ok(read) => read,
            Err(e) => {
                let why = format!("{e:#}");
                tracing::warn!(
                    trigger,
                    "reload refused, the running configuration stays: {why}"
                );
                let report = json!({"ok": false, "trigger": trigger, "error": why});
                self.record(&report);
                return Err(report);
            }
        };
        let reconciled = match self.mcp.reconcile(servers).await {
            Ok(r) => r,
            Err(e) => {
                let why = format!("the MCP servers could not be reconciled: {e}");
                tracing::warn!(trigger, "{why}");
                let report = json!({"ok": false, "trigger": trigger, "error": why});
                self.record(&report);
                return Err(report);
            }
        };
        // The trust `--trust-project` gave stays: the file never says it.
        config.skills.trusted_by_flag = current.skills.trusted_by_flag;
        config.skills.trust_project |= current.skills.trusted_by_flag;
        let same =
            |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
        let policy_changed = !same(&current.policy, &config.policy);
        if policy_changed {
            self.policy.set(&config);
        }
        // A token's lists leave out what the rules deny it: both make the tokens in force.
        // Compared by every key as written (Debug texts hide secrets and leave keys out):
        // a rotated secret, a revoked `admin`, changed model capabilities all count.
        let auth_changed =
            serde_json::to_value(&current.auth).ok() != serde_json::to_value(&config.auth).ok();
        let auth_live = match self.auth.get() {
            Some(handle) if auth_changed || policy_changed => {
                match handle.replace(&config.inbound_auth()) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!("the inbound tokens could not be replaced: {e}");
                        false
                    }
                }
            }
            Some(_) => true,
            None => false,
        };
        let (limits_changed, surface_changed) = match self.apply_pipeline(&config) {
            Ok(changed) => changed,
            Err(why) => {
                tracing::warn!(trigger, "{why}");
                let report = json!({"ok": false, "trigger": trigger, "error": why});
                self.record(&report);
                return Err(report);
            }
        };
        // Who may propose custom tools is checked by the tool itself, at each call.
        if auth_changed && let Some(admins) = &self.proposal_admins {
            admins.set(config.admin_token_names());
        }
        let server_limits =
            |l: &crate::config::LimitsConfig| (l.max_http_sessions, l.input_wait_secs);
        let oidc_settings = |a: &quiver_mcp_adapter::InboundAuth| {
            a.oidc.clone().map(|mut o| {
                o.rules.clear();
                let secrets = (
                    o.introspection_client_secret.clone(),
                    o.client_secret.clone(),
                );
                (format!("{o:?}"), secrets)
            })
        };
        // Against the configuration in force since start, not the last file read: these
        // sections were never applied.
        let started = &self.started;
        let needs_restart: Vec<&str> = [
            (
                "store",
                same(&started.store, &config.store) && started.store.url == config.store.url,
            ),
            (
                "limits.max_http_sessions, limits.input_wait_secs",
                server_limits(&started.limits) == server_limits(&config.limits),
            ),
            ("auth", !auth_changed || auth_live),
            // `create_custom_tool` is registered at start when some token is an admin.
            (
                "auth.tokens admin (create_custom_tool exists only in a server started with an admin token)",
                self.proposal_admins.is_some() || config.admin_token_names().is_empty(),
            ),
            // The verifier and the metadata routes are built at start; the claim rules
            // are live with the tokens.
            (
                "auth.oidc (issuer, resource, keys, introspection, token exchange client)",
                oidc_settings(&started.auth) == oidc_settings(&config.auth),
            ),
            ("sandbox", same(&started.sandbox, &config.sandbox)),
            ("custom", same(&started.custom, &config.custom)),
            ("telemetry", started.telemetry == config.telemetry),
            // The retriever (its model loaded, the tools' vectors) is built at start.
            ("search", started.search.model_dir == config.search.model_dir),
            ("admin", self.apply_admin(&current.admin, &config.admin)),
        ]
        .into_iter()
        .filter(|(_, unchanged)| !unchanged)
        .map(|(section, _)| section)
        .collect();
        let new_print = skills_fingerprint(&config);
        let skills_changed = new_print != *print || !same(&current.skills, &config.skills);
        let mut skill_problems = Vec::new();
        if skills_changed {
            skill_problems = self.reload_skills(&config).await;
        }
        let catalog_report = self
            .reload_catalog_dir(current, &config, skills_changed, &reconciled)
            .await;
        *current = config;
        *print = new_print;
        let catalog_changed = catalog_report.is_some();
        let report = json!({
            "ok": true,
            "trigger": trigger,
            "servers": {
                "added": reconciled.added,
                "removed": reconciled.removed,
                "restarted": reconciled.restarted,
                "unchanged": reconciled.unchanged,
            },
            "policy_changed": policy_changed,
            "limits_changed": limits_changed,
            "surface_changed": surface_changed,
            "auth_changed": auth_changed && auth_live,
            "skills_changed": skills_changed,
            "skill_problems": skill_problems,
            "catalog": catalog_report,
            "needs_restart": needs_restart,
        });
        if reconciled.changed()
            || policy_changed
            || limits_changed
            || surface_changed
            || skills_changed
            || catalog_changed
            || !needs_restart.is_empty()
        {
            tracing::info!(
                trigger,
                added = ?reconciled.added,
                removed = ?reconciled.removed,
                restarted = ?reconciled.restarted,
                policy_changed,
                limits_changed,
                surface_changed,
                skills_changed,
                "configuration reloaded"
            );
        } else {
            tracing::info!(trigger, "configuration reloaded: nothing changed");
        }
        if !needs_restart.is_empty() {
            tracing::warn!(
                sections = ?needs_restart,
                "these sections changed and apply at the next restart of quiver serve"
            );
        }
        self.watch_new_servers(
            reconciled
                .added
                .iter()
                .chain(&reconciled.restarted)
                .cloned()
                .collect(),
        );
        self.record(&report);
        Ok(report)
    }

    /// Replaces the admin token the server checks when `[admin]` changed from one token to
    /// another; whether the change is in force (unchanged counts as in force).
    fn apply_admin(
        &self,
        current: &crate::config::AdminConfig,
        next: &crate::config::AdminConfig,
    ) -> bool {
        let (Ok(old), Ok(new)) = (current.token(), next.token()) else {
            return false;
        };
        match (old, new, self.admin.get()) {
            (None, None, _) => true,
            (Some(old), Some(new), Some(serving)) => {
                if !old.same_as(&new) {
                    serving.replace(&new);
                    tracing::info!("the admin token was replaced");
                }
                true
            }
            (Some(old), Some(new), None) => old.same_as(&new),
            _ => false,
        }
    }

    /// Gives the dispatcher `config`'s limits when they changed, and the surface its
    /// settings when they or the policy changed; returns which. Both were checked when the
    /// file was read, and an error here (the surface refusing its settings) leaves
    /// everything as it was.
    fn apply_pipeline(&self, config: &Config) -> Result<(bool, bool), String> {
        let Some((dispatcher, surface)) = &self.pipeline else {
            return Ok((false, false));
        };
        let limits = match config.limits.dispatch_config() {
            Ok(limits) => limits,
            Err(e) => return Err(format!("[limits]: {e:#}")),
        };
        let limits_changed = *dispatcher.config() != limits;
        let denied: Vec<&str> = config
            .always_denied(None, None)
            .map(|r| r.tool.as_str())
            .collect();
        let offered = config.surface.clone().with_unoffered(&denied);
        let surface_changed = *surface.config() != offered;
        if surface_changed {
            surface
                .reconfigure(offered)
                .map_err(|e| format!("[surface]: {e}"))?;
        }
        if limits_changed {
            dispatcher.reconfigure(limits);
        }
        Ok((limits_changed, surface_changed))
    }

    /// Reads the skills and command files of `config` again: the `skill` tool is replaced
    /// (unless another family holds its name), removed when no skill is left, and the
    /// local prompts replaced. Returns what could not be loaded, each with its file.
    async fn reload_skills(&self, config: &Config) -> Vec<String> {
        let skills = crate::app::load_skills(config).await;
        if let Some(dir) = &self.catalog_dir {
            *dir.skills
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = skills.stack.clone();
        }
        let family = Family::Skills.name();
        let ours = |name: &str| {
            self.catalog
                .lookup(name)
                .is_none_or(|e| &*e.family == family)
        };
        match skills.tool {
            Some(tool) if ours(&tool.spec().name) => {
                if let Err(e) = self.catalog.upsert_in(family, tool) {
                    tracing::warn!("the skill tool could not be replaced: {e}");
                }
            }
            Some(_) => {}
            None => {
                let gone: Vec<String> = self
                    .catalog
                    .tools()
                    .iter()
                    .filter(|e| &*e.family == family)
                    .map(|e| e.spec.name.clone())
                    .collect();
                for name in gone {
                    self.catalog.remove(&name);
                }
            }
        }
        if let Some(prompts) = &self.prompts {
            prompts.replace(skills.prompts);
        }
        let problems: Vec<String> = skills
            .problems
            .iter()
            .map(|p| format!("{}: {}", p.origin, p.reason))
            .collect();
        for p in &problems {
            tracing::warn!("skills: {p}");
        }
        problems
    }

    /// Reads the catalog directory again when anything under it moved, `[catalog]`
    /// changed, the skills were read again or the servers changed (an alias names one);
    /// `None` when it was not read.
    async fn reload_catalog_dir(
        &self,
        current: &Config,
        config: &Config,
        skills_changed: bool,
        servers: &quiver_mcp_adapter::Reconciled,
    ) -> Option<Value> {
        let state = self.catalog_dir.as_ref()?;
        let print = catalog_fingerprint(config);
        let unchanged = print
            == *state
                .print
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
            && format!("{:?}", current.catalog) == format!("{:?}", config.catalog)
            && !skills_changed
            && !servers.changed();
        if unchanged {
            return None;
        }
        *state
            .print
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = print;
        let read = match &config.catalog.dir {
            Some(dir) => {
                let names: Vec<String> = servers
                    .added
                    .iter()
                    .chain(&servers.restarted)
                    .chain(&servers.unchanged)
                    .cloned()
                    .collect();
                crate::catalog_dir::read(dir, &names)
            }
            None => crate::catalog_dir::CatalogRead::default(),
        };
        let skills = state
            .skills
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let applied = state
            .tools
            .apply(&read, Some(skills), config.catalog.auto_approve)
            .await;
        let problems: Vec<String> = read
            .problems
            .iter()
            .map(ToString::to_string)
            .chain(applied.problems.iter().cloned())
            .collect();
        for p in &problems {
            tracing::warn!("catalog directory: {p}");
        }
        Some(json!({
            "served": applied.served,
            "removed": applied.removed,
            "drafted": applied.drafted,
            "problems": problems,
        }))
    }

    /// Writes the last reload's report for `quiver status`.
    fn record(&self, report: &Value) {
        let mut report = report.clone();
        if let Value::Object(map) = &mut report {
            map.insert("pid".into(), json!(std::process::id()));
            map.insert("host".into(), json!(crate::serve::host_name()));
            map.insert(
                "at_unix".into(),
                json!(
                    SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                ),
            );
        }
        if let Err(e) = std::fs::write(&self.status_file, report.to_string()) {
            tracing::warn!(file = %self.status_file.display(), "could not write the reload status: {e}");
        }
    }
}

#[async_trait::async_trait]
impl quiver_mcp_adapter::Reload for Reloader {
    async fn reload(&self, trigger: &str) -> Result<Value, Value> {
        Reloader::reload(self, trigger).await
    }
}

/// Reloads `reloader` whenever one of its files, or anything under a skills directory,
/// changes, until the returned watcher is dropped: the files' directories are watched (an
/// editor replaces a file rather than writing it), events for other files are ignored, and
/// events within [`DEBOUNCE`] of each other make one reload.
pub fn watch_files(
    reloader: Arc<Reloader>,
) -> anyhow::Result<(notify::RecommendedWatcher, tokio::task::JoinHandle<()>)> {
    use notify::Watcher;
    let files: Vec<PathBuf> = reloader.files().iter().map(|f| absolute(f)).collect();
    let skill_dirs: Vec<PathBuf> = reloader
        .current
        .try_lock()
        .map(|held| {
            Reloader::trees(&held.0)
                .iter()
                .map(|d| absolute(d))
                .collect()
        })
        .unwrap_or_default();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let wanted = files.clone();
    let under = skill_dirs.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if event.kind.is_access() {
            return;
        }
        let ours = |p: &PathBuf| {
            let p = absolute(p);
            wanted.contains(&p) || under.iter().any(|d| p.starts_with(d))
        };
        if event.paths.iter().any(ours) {
            let _ = tx.send(());
        }
    })?;
    let mut dirs: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in &dirs {
        watcher
            .watch(dir, notify::RecursiveMode::NonRecursive)
            .map_err(|e| anyhow::anyhow!("watching {} for changes: {e}", dir.display()))?;
    }
    // The skills directories as they were at start (one added by a reload is read by the
    // next reload, whatever triggers it). A missing one is not watched.
    for dir in skill_dirs.iter().filter(|d| d.is_dir()) {
        if let Err(e) = watcher.watch(dir, notify::RecursiveMode::Recursive) {
            tracing::warn!(dir = %dir.display(), "skills directory not watched: {e}");
        }
    }
    let task = tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Gather the rest of the burst.
            loop {
                match tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            let _ = reloader.reload("a configuration file changed").await;
        }
    });
    Ok((watcher, task))
}

/// A fingerprint of everything under the skills and command-file directories of `config`:
/// a reload reads the skills again only when it moved.
fn skills_fingerprint(config: &Config) -> u64 {
    crate::catalog_dir::tree_fingerprint(config.skills.all_dirs())
}

/// A fingerprint of the catalog directory of `config` (none: 0).
fn catalog_fingerprint(config: &Config) -> u64 {
    crate::catalog_dir::tree_fingerprint(config.catalog.dir.iter())
}

/// `path` made absolute against the working directory, without touching the file system
/// (the file may not exist yet).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
