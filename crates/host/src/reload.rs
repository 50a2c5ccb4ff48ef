//! Reloading a running `quiver serve` without a restart. A reload reads `quiver.toml` and
//! the `--mcp-config` files again and checks them whole; when anything is wrong nothing
//! changes, and the reason goes to the log and to the reload status file `quiver status`
//! reads. When they are good:
//! - the upstream MCP servers are reconciled ([`McpClient::reconcile`]): a new one
//!   connects, a removed one is closed and its tools leave, a changed one reconnects, and
//!   the others are untouched (no reconnect, no dropped call);
//! - the policy rules apply to the next call ([`LivePolicy`]);
//! - the sections read only at start (the store, the surface, limits, tokens, the sandbox,
//!   skills, the admin token) are compared, and a change there is reported as needing a
//!   restart rather than half applied.
//!
//! Clients see a changed tool list as `notifications/tools/list_changed`, as for any
//! catalog change. Triggers: [`watch_files`] (the files' directories, debounced), SIGHUP,
//! and `POST /admin/reload` behind the admin token. One reload runs at a time.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use quiver_mcp_adapter::McpClient;
use quiver_registry::{PolicyCheck, PolicyRequest, PolicyVerdict, RulePolicy};
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

/// Reloads the configuration of a running server.
pub struct Reloader {
    config_path: Option<PathBuf>,
    mcp_files: Vec<PathBuf>,
    mcp: McpClient,
    policy: Arc<LivePolicy>,
    /// The configuration in force; held for the whole of a reload, so one runs at a time.
    current: tokio::sync::Mutex<Config>,
    status_file: PathBuf,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("config", &self.config_path)
            .field("mcp_files", &self.mcp_files)
            .finish_non_exhaustive()
    }
}

/// The reload status file of the store at `store`: beside it, `<store>.reload.json`.
pub fn status_file(store: &Path) -> PathBuf {
    let mut name = store.file_name().unwrap_or_default().to_os_string();
    name.push(".reload.json");
    store.with_file_name(name)
}

impl Reloader {
    /// A reloader of the server `config` (read from `config_path`, `None` for
    /// `./quiver.toml` when it exists) and the `mcp_files` configured. A status file left
    /// by an earlier server is removed: the file describes this one.
    pub fn new(
        config: Config,
        config_path: Option<PathBuf>,
        mcp_files: Vec<PathBuf>,
        mcp: McpClient,
        policy: Arc<LivePolicy>,
    ) -> Self {
        let status_file = status_file(&config.store.path);
        let _ = std::fs::remove_file(&status_file);
        Reloader {
            config_path,
            mcp_files,
            mcp,
            policy,
            current: tokio::sync::Mutex::new(config),
            status_file,
        }
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
        Ok((config, servers))
    }

    /// Reloads now; `trigger` says what asked. `Ok` with what changed, `Err` with why
    /// nothing did.
    pub async fn reload(&self, trigger: &str) -> Result<Value, Value> {
        let mut current = self.current.lock().await;
        let (config, servers) = match self.read() {
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
        let same =
            |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
        let policy_changed = !same(&current.policy, &config.policy);
        if policy_changed {
            self.policy.set(&config);
        }
        let needs_restart: Vec<&str> = [
            ("store", same(&current.store, &config.store)),
            ("surface", same(&current.surface, &config.surface)),
            ("limits", same(&current.limits, &config.limits)),
            ("auth", same(&current.auth, &config.auth)),
            ("sandbox", same(&current.sandbox, &config.sandbox)),
            ("skills", same(&current.skills, &config.skills)),
            ("admin", same(&current.admin, &config.admin)),
        ]
        .into_iter()
        .filter(|(_, unchanged)| !unchanged)
        .map(|(section, _)| section)
        .collect();
        *current = config;
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
            "needs_restart": needs_restart,
        });
        if reconciled.changed() || policy_changed || !needs_restart.is_empty() {
            tracing::info!(
                trigger,
                added = ?reconciled.added,
                removed = ?reconciled.removed,
                restarted = ?reconciled.restarted,
                policy_changed,
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
        self.record(&report);
        Ok(report)
    }

    /// Writes the last reload's report for `quiver status`.
    fn record(&self, report: &Value) {
        let mut report = report.clone();
        if let Value::Object(map) = &mut report {
            map.insert("pid".into(), json!(std::process::id()));
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

/// Reloads `reloader` whenever one of its files changes, until the returned watcher is
/// dropped: the files' directories are watched (an editor replaces a file rather than
/// writing it), events for other files are ignored, and events within [`DEBOUNCE`] of each
/// other make one reload.
pub fn watch_files(
    reloader: Arc<Reloader>,
) -> anyhow::Result<(notify::RecommendedWatcher, tokio::task::JoinHandle<()>)> {
    use notify::Watcher;
    let files: Vec<PathBuf> = reloader.files().iter().map(|f| absolute(f)).collect();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let wanted = files.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if event.kind.is_access() {
            return;
        }
        if event.paths.iter().any(|p| wanted.contains(&absolute(p))) {
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

/// `path` made absolute against the working directory, without touching the file system
/// (the file may not exist yet).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
