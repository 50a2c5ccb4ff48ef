//! The assembled runtime every command shares: store, catalog, surface, dispatcher.

use std::sync::Arc;

mod jobs;

use jobs::run_jobs;

use anyhow::Context;
use quiver_contract::Tool;
use quiver_mcp_adapter::{ClientOptions, McpClient, ServerState};
use quiver_metrics_prometheus::Metrics;
use quiver_registry::custom::CustomTools;
use quiver_registry::{
    Catalog, Dispatcher, Family, RegisterReport, Skipped,
    skill::{PromptSet, SkillProblem, SkillSource, TieredSkills, skill_tool},
    store::{CallLog, DefinitionStore, ToolDefinition, ToolType},
};
use quiver_surface::{FloorLoad, MemoryUsage, Surface, core_tools};

use crate::{Config, DirSkills, Families, Store, assemble_catalog, load_commands};

/// How long shutdown waits for the working-set mirror to catch up before closing the store.
const MIRROR_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

async fn put(store: &Store, mut def: ToolDefinition) {
    let name = def.name.clone();
    // What an operator set (a disable, a review status) outlives the tool's re-listing.
    if let Ok(Some(old)) = store.definition(&name).await {
        def.enabled = old.enabled;
        def.status = old.status;
        def.rejection_reason = old.rejection_reason;
        // The search vector too: the store clears it when the description changed, and
        // its key tells the index whether it still matches the tool's text.
        def.embedding = old.embedding;
        def.embedding_key = old.embedding_key;
    }
    if let Err(e) = store.put_definition(def).await {
        tracing::warn!(tool = %name, error = %e, "could not record the tool definition");
    }
}

/// How long `quiver serve` waits for a change of the definitions (another process's `quiver
/// custom approve` or `disable`) before it asks the store again: a SQLite store is read this
/// often; a PostgreSQL store announces a change at once, and this bounds only the wait.
pub const DEFINITIONS_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// The names of the tools the `core` family may hold (`tool_search`, `describe_tool`,
/// `read_result`, and `create_custom_tool` when an admin token is configured): the core
/// family registers before the custom tools, so a custom tool never takes one of them.
/// [`App::build`] pushes exactly these.
pub const CORE_TOOL_NAMES: [&str; 4] = [
    quiver_surface::TOOL_SEARCH,
    quiver_surface::DESCRIBE_TOOL,
    quiver_registry::layers::result_limit::READ_RESULT,
    quiver_registry::custom::PROPOSE_TOOL,
];

/// Quiver's own tools outside the core family, with their families: the `skill` tool
/// (every skill) and the resource tools. A custom tool may not take these names either.
pub const OWN_TOOL_NAMES: [(&str, &str); 3] = [
    (quiver_registry::skill::SKILL_TOOL, "skills"),
    (
        quiver_mcp_adapter::RESOURCE_TOOLS[0],
        quiver_mcp_adapter::RESOURCE_TOOLS_FAMILY,
    ),
    (
        quiver_mcp_adapter::RESOURCE_TOOLS[1],
        quiver_mcp_adapter::RESOURCE_TOOLS_FAMILY,
    ),
];

/// Custom tools over `store`, run in a QuickJS sandbox with `[sandbox]`'s threads and limits.
pub fn custom_tools_on(config: &Config, store: Arc<Store>) -> anyhow::Result<CustomTools> {
    custom_tools_counted(config, store, None)
}

/// [`custom_tools_on`], the sandbox's runs counted in `metrics` when given.
fn custom_tools_counted(
    config: &Config,
    store: Arc<Store>,
    metrics: Option<&Metrics>,
) -> anyhow::Result<CustomTools> {
    let limits = config.sandbox.limits().context("[sandbox]")?;
    let mut sandbox: Arc<dyn quiver_registry::sandbox::Sandbox> = Arc::new(
        quiver_sandbox::QuickJsSandbox::new(config.sandbox.threads()),
    );
    if let Some(metrics) = metrics {
        sandbox = metrics.sandbox(sandbox);
    }
    let lease = config.custom.lease().context("[custom]")?;
    let workers = config.custom.jobs().context("[custom]")?;
    Ok(CustomTools::new(store.clone(), store, sandbox, limits)
        .with_lease(lease)
        .with_workers(workers)
        .with_reserved(
            CORE_TOOL_NAMES
                .map(|n| (n, Family::Core.name()))
                .into_iter()
                .chain(OWN_TOOL_NAMES),
        ))
}

/// The store of `config`, opened as `access` says, and the custom tools over it: what
/// `quiver custom` works on (no catalog, no upstreams). Close the store when done.
pub async fn custom_tools(
    config: &Config,
    access: StoreAccess,
) -> anyhow::Result<(CustomTools, Arc<Store>)> {
    let store = Arc::new(Store::open(config, access).await?);
    Ok((custom_tools_on(config, store.clone())?, store))
}

/// What `[skills]` gives: the `skill` tool, the local prompts, and what the operator is told.
pub(crate) struct Skills {
    pub(crate) tool: Option<Arc<dyn Tool>>,
    pub(crate) prompts: Arc<PromptSet>,
    /// What could not be loaded, or was shadowed, with the file it is about.
    pub(crate) problems: Vec<SkillProblem>,
    /// Served skills longer than a result may be: name, origin, characters.
    long: Vec<(String, String, usize)>,
    /// The stacked skills (for the catalog directory's skill-kind tools).
    pub(crate) stack: Arc<dyn SkillSource>,
}

/// Reads each tier's directories (the project tier's only when the workspace is trusted:
/// an untrusted one is never read), stacks them, and builds the `skill` tool and the
/// local prompts over the stack.
pub(crate) async fn load_skills(config: &Config) -> Skills {
    let trusted = config.skills.trust_project;
    let mut tiers: Vec<Arc<DirSkills>> = Vec::new();
    let mut problems = Vec::new();
    for (tier, dirs) in config.skills.tiers() {
        if dirs.is_empty() {
            continue;
        }
        if !TieredSkills::admits(tier, trusted) {
            tracing::info!(
                "[skills] project_dirs not read: the workspace is not trusted (pass --trust-project to `quiver serve`, or set [skills] trust_project = true)"
            );
            continue;
        }
        let source = DirSkills::load(tier, dirs);
        problems.extend(source.problems().iter().cloned());
        tiers.push(Arc::new(source));
    }
    let sources = tiers
        .iter()
        .map(|t| (t.tier(), t.clone() as Arc<dyn SkillSource>))
        .collect();
    let (stack, report) = TieredSkills::build(sources, trusted).await;
    let of_tier = |tier| tiers.iter().find(|t| t.tier() == tier);
    for shadowed in &report.shadowed {
        let origin = of_tier(shadowed.dropped)
            .and_then(|t| t.origin(&shadowed.name))
            .unwrap_or(shadowed.dropped.as_str());
        problems.push(SkillProblem::new(origin, shadowed.reason()));
    }
    for (tier, e) in &report.failed {
        problems.push(SkillProblem::new(tier.as_str(), e.to_string()));
    }
    let served = stack.list_skills().await.unwrap_or_default();
    let long = served
        .iter()
        .filter_map(|m| {
            let t = of_tier(m.tier)?;
            let chars = t.instructions_chars(&m.name)?;
            let origin = t.origin(&m.name)?;
            (chars > config.limits.max_result_chars)
                .then(|| (m.name.clone(), origin.to_owned(), chars))
        })
        .collect();
    let stack: Arc<dyn SkillSource> = Arc::new(stack);
    let stack_kept = stack.clone();
    let tool = skill_tool(stack.clone()).await.unwrap_or_else(|e| {
        problems.push(SkillProblem::new("skills", e.to_string()));
        None
    });
    let (commands, command_problems) = load_commands(&config.skills.commands_dirs);
    problems.extend(command_problems);
    let (prompts, prompt_problems) = PromptSet::build(commands, Some(stack)).await;
    problems.extend(prompt_problems);
    Skills {
        tool,
        prompts: Arc::new(prompts),
        problems,
        long,
        stack: stack_kept,
    }
}

/// How long a command waits for the upstreams by default.
const STARTUP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Everything a command needs, built once by [`App::build`].
#[non_exhaustive]
pub struct App {
    /// The shared catalog.
    pub catalog: Arc<Catalog>,
    /// The per-session surface.
    pub surface: Arc<Surface>,
    /// The one dispatch pipeline.
    pub dispatcher: Dispatcher,
    /// The store (definitions, execution log, jobs, session state): SQLite or PostgreSQL.
    pub store: Arc<Store>,
    /// What catalog assembly registered and skipped.
    pub report: RegisterReport,
    /// The server-global MCP client (owned here: closing a session never closes it).
    pub mcp: McpClient,
    /// How long a command waits for the upstreams to connect before going on without the
    /// slow ones: 30 s, or longer when a server's `connect_timeout` is (so raising it for a
    /// server that `npx -y` fetches on first start is not undone by the wait).
    pub startup_wait: std::time::Duration,
    /// Skills whose instructions are longer than a result may be (`max_result_chars`): the
    /// `skill` tool serves them cut, so the model never reads their end. Name, origin and
    /// length in characters, for `quiver check`.
    pub long_skills: Vec<(String, String, usize)>,
    /// Custom tools: the store's, served from the catalog's custom family.
    pub custom: Arc<CustomTools>,
    /// The dispatcher's policy check: `[policy]`'s rules, replaced by a reload.
    pub policy: Arc<crate::reload::LivePolicy>,
    /// The `--mcp-config` files it was built with (a reload reads them again).
    pub mcp_files: Vec<std::path::PathBuf>,
    /// The local prompts (command files and skills) `serve` offers ahead of the upstreams'.
    pub prompts: Arc<PromptSet>,
    /// The catalog directory's tools (`[catalog] dir`), kept in step by a reload.
    pub catalog_dir: Arc<crate::catalog_dir::CatalogDirTools>,
    /// The skills as loaded (skill-kind catalog tools serve from it).
    pub skill_stack: Arc<dyn SkillSource>,
    /// Calls, sandbox runs and log rows, counted (`quiver serve` adds the gauges and
    /// serves them at `GET /metrics`: [`crate::metrics::exposition`]).
    pub metrics: Arc<Metrics>,
    /// Who may call `create_custom_tool`; `None` when the server started with no admin
    /// token, and so without the tool.
    pub admins: Option<quiver_registry::custom::ProposalAdmins>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("tools", &self.catalog.len())
            .finish_non_exhaustive()
    }
}

/// How a command uses the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreAccess {
    /// Opened (created if missing, migrated) for writing: `serve`, `call`, `search`.
    ReadWrite,
    /// Only read: a missing SQLite store is read as empty and not created, a PostgreSQL
    /// store is not migrated, and nothing is written (`tools`, `status`, `check`, `floor`).
    ReadOnly,
}

impl App {
    /// Opens the store, derives usage for the resident floor, assembles the catalog in family
    /// order, and builds the dispatcher with the store as
    /// its recorder and the surface as a call observer.
    pub async fn build(config: &Config, mcp_files: &[std::path::PathBuf]) -> anyhow::Result<App> {
        Self::build_with(config, mcp_files, StoreAccess::ReadWrite).await
    }

    /// [`App::build`] with the store opened as `access` says.
    pub async fn build_with(
        config: &Config,
        mcp_files: &[std::path::PathBuf],
        access: StoreAccess,
    ) -> anyhow::Result<App> {
        let store = Store::open(config, access).await?;
        Self::build_on(config, mcp_files, store).await
    }

    /// [`App::build`] on a store opened already.
    pub async fn build_on(
        config: &Config,
        mcp_files: &[std::path::PathBuf],
        store: Store,
    ) -> anyhow::Result<App> {
        let store = Arc::new(store);
        let catalog = Arc::new(Catalog::new());
        // The floor is store-backed: the in-memory usage is never read.
        // A tool a policy denies to every caller is never offered (listed, found, described):
        // the model would spend turns on it. A call still gets the rule's message.
        let denied: Vec<&str> = config
            .always_denied(None, None)
            .map(|r| r.tool.as_str())
            .collect();
        let surface = Surface::new(
            catalog.clone(),
            config.surface.clone().with_unoffered(&denied),
            Arc::new(MemoryUsage::default()),
        )
        .context("building the tool surface")?;
        // The stored floor, or one derived from the execution log's usage now. Stored by
        // `serve` (and `quiver floor --rederive`) only: the other commands leave the store
        // as it is.
        if let FloorLoad::Unavailable(why) = surface.load_floor(&*store, &*store, false).await {
            tracing::warn!("resident floor: {why}; using the static fallback");
        }
        let skills = load_skills(config).await;
        let skill_stack = skills.stack.clone();
        let (skill, skill_problems, long_skills) = (skills.tool, skills.problems, skills.long);
        // Logged before the servers are resolved, whose configuration may stop the command.
        for p in &skill_problems {
            tracing::warn!(skill = %p.origin, "skills: {}", p.reason);
        }
        let env = |k: &str| std::env::var(k).ok();
        let servers = crate::mcp_json::resolve_servers(config, mcp_files, &env)?;
        // The server-global MCP servers' tools register first-wins as each server connects,
        // in the family order assembly sets.
        let metrics = Arc::new(Metrics::new());
        let custom = Arc::new(custom_tools_counted(config, store.clone(), Some(&metrics))?);
        let mut core = core_tools(&surface);
        // Results shortened to their budget are kept whole for their session, read back
        // through `read_result` (and `quiver://results/<call id>`).
        let kept = Arc::new(quiver_registry::kept::KeptResults::new(
            config.limits.kept_result_bytes,
        ));
        core.push(quiver_registry::kept::read_result_tool(kept.clone()));
        // Sessions of an admin token may propose custom tools (stored as drafts); who may is
        // replaced by a reload.
        let admins = quiver_registry::custom::ProposalAdmins::new(config.admin_token_names());
        let proposals = !admins.is_empty();
        if proposals {
            core.push(quiver_registry::custom::proposal_tool(
                custom.clone(),
                admins.clone(),
            ));
        }
        let families = Families {
            core,
            skills: skill.into_iter().collect(),
            mcp_servers: servers.iter().map(|s| s.family()).collect(),
            ..Default::default()
        };
        let mut report = assemble_catalog(&catalog, families).context("assembling the catalog")?;
        // The approved and enabled custom tools, as the store has them now; `serve` keeps
        // them in step with the store from here on (`App::spawn_custom_sync`).
        match custom.sync(&catalog).await {
            Ok((added, _)) if !added.is_empty() => {
                tracing::info!(tools = ?added, "serving custom tools");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("custom tools not loaded: {e}"),
        }
        let catalog_dir = Arc::new(crate::catalog_dir::CatalogDirTools::new(
            catalog.clone(),
            custom.clone(),
            !store.is_read_only(),
        ));
        if let Some(dir) = &config.catalog.dir {
            let names: Vec<String> = servers.iter().map(|s| s.name.clone()).collect();
            let read = crate::catalog_dir::read(dir, &names);
            let applied = catalog_dir
                .apply(
                    &read,
                    Some(skill_stack.clone()),
                    config.catalog.auto_approve,
                )
                .await;
            if !applied.served.is_empty() || !applied.drafted.is_empty() {
                tracing::info!(served = ?applied.served, drafted = ?applied.drafted, "catalog directory loaded");
            }
            // At the level a reload logs them: a lint is the file's author's to fix.
            for p in &read.problems {
                tracing::warn!("catalog directory: {p}");
            }
            report.skipped.extend(
                read.problems
                    .iter()
                    .filter(|p| p.refused)
                    .map(|p| {
                        Skipped::new(
                            "catalog",
                            p.path.display().to_string(),
                            format!("[{}] {}", p.rule, p.fix),
                        )
                    })
                    .chain(
                        applied
                            .problems
                            .iter()
                            .map(|p| Skipped::new("catalog", "catalog directory", p.clone())),
                    ),
            );
        }
        // A skill that could not be loaded is missing from the `skill` tool: reported like a
        // tool the catalog refused (`quiver check` counts it, `serve` logs it).
        report.skipped.extend(
            skill_problems
                .into_iter()
                .map(|p| Skipped::new(Family::Skills.name(), p.origin, p.reason)),
        );
        let options = ClientOptions::default();
        let startup_wait = servers
            .iter()
            .filter_map(|s| s.connect_timeout)
            .map(|t| t + std::time::Duration::from_secs(1))
            .fold(STARTUP_WAIT, std::cmp::max);
        let mcp = McpClient::start(catalog.clone(), servers, options);
        if let Some(exchanger) = config
            .auth
            .oidc
            .as_ref()
            .map(crate::identity::exchanger)
            .transpose()?
            .flatten()
        {
            mcp.set_token_exchanger(exchanger);
        }
        surface.resync_index();
        let policy = Arc::new(crate::reload::LivePolicy::of(config));
        let dispatcher = Dispatcher::builder(catalog.clone())
            .config(config.limits.dispatch_config()?)
            .policy(policy.clone())
            .recorder(metrics.recorder(store.clone()))
            .observer(surface.clone())
            .observer(metrics.observer())
            .kept_results(kept)
            .build();
        Ok(App {
            catalog,
            surface,
            dispatcher,
            store,
            report,
            mcp,
            startup_wait,
            long_skills,
            custom,
            policy,
            mcp_files: mcp_files.to_vec(),
            prompts: skills.prompts,
            catalog_dir,
            skill_stack,
            metrics,
            admins: proposals.then_some(admins),
        })
    }

    /// Keeps the catalog's custom tools in step with the store while serving, and runs
    /// their jobs. Every [`DEFINITIONS_POLL`] the store's definitions version is read, and
    /// when it moved (an approval, an edit, a disable, by this process or another on the
    /// same store) the custom family is synced; the catalog's change reaches connected
    /// clients as `notifications/tools/list_changed`. Beside it a job worker runs queued
    /// jobs, up to `[custom] jobs` at once, woken by the store's announcement of a queued job where it makes
    /// one (PostgreSQL), else every [`DEFINITIONS_POLL`] (a build queued by `create_custom_tool`, a rebuild queued here at
    /// start for tools last tested under another engine or other limits), renewing the
    /// lease of each job it runs, and a look beside it releases jobs a stopped process left
    /// running (see [`quiver_registry::custom::JobLease`]). Aborted with the handle.
    pub fn spawn_custom_sync(&self) -> tokio::task::JoinHandle<()> {
        let (custom, catalog, store) = (
            self.custom.clone(),
            self.catalog.clone(),
            self.store.clone(),
        );
        tokio::spawn(async move {
            let sync = sync_custom(&custom, &catalog, &store);
            let jobs = run_jobs(&custom, &store);
            tokio::join!(sync, jobs);
        })
    }
}

/// The definitions sync of [`App::spawn_custom_sync`].
async fn sync_custom(custom: &CustomTools, catalog: &Catalog, store: &Store) {
    let mut seen = store.definitions_version().await.ok();
    loop {
        let now = match store.definitions_changed(seen, DEFINITIONS_POLL).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the definitions version");
                tokio::time::sleep(DEFINITIONS_POLL).await;
                continue;
            }
        };
        if seen == Some(now) {
            continue;
        }
        seen = Some(now);
        match custom.sync(catalog).await {
            Ok((added, removed)) => {
                if !added.is_empty() || !removed.is_empty() {
                    tracing::info!(?added, ?removed, "custom tools changed in the store");
                }
            }
            Err(e) => tracing::warn!("custom tools not synced: {e}"),
        }
    }
}

impl App {
    /// Records the running code's system tools (the `core` family) in the store's
    /// definitions table, refreshing their text and schema; stored rows this build does not
    /// know are left alone and logged. `serve` does this at start-up; `check --against` reads
    /// the stored definitions before anything is seeded.
    pub async fn seed(&self) -> anyhow::Result<()> {
        let system: Vec<ToolDefinition> = self
            .catalog
            .tools()
            .iter()
            .filter(|e| Family::of(&e.family) == Some(Family::Core))
            .map(|e| {
                ToolDefinition::from_spec(
                    &e.spec,
                    ToolType::System,
                    format!("system:{}", e.spec.name),
                )
            })
            .collect();
        let seeded = self
            .store
            .seed_system_tools(system, Vec::new())
            .await
            .context("seeding system tool definitions")?;
        if !seeded.unknown.is_empty() {
            tracing::info!(unknown = ?seeded.unknown, "stored system tools this build does not know (left alone)");
        }
        Ok(())
    }

    /// Keeps the store's definitions of upstream MCP tools current while serving: each
    /// one as it registers (now and whenever an upstream connects or changes its list), so
    /// `quiver check --against` can report a breaking change in an upstream's tools too.
    /// A tool that goes away keeps its stored definition (that is what a later check
    /// compares with).
    pub fn spawn_definition_recorder(&self) -> DefinitionRecorder {
        let mut events = self.catalog.subscribe();
        let (catalog, store) = (self.catalog.clone(), self.store.clone());
        let record = move |name: &str| {
            let entry = catalog.lookup(name)?;
            let server = Family::mcp_server(&entry.family)?;
            // `mcp__<prefix>__<tool>`: the tool's own name may contain `__` too.
            let upstream_name = name.splitn(3, "__").nth(2).unwrap_or(name);
            Some(ToolDefinition::from_spec(
                &entry.spec,
                ToolType::Mcp,
                format!("mcp:{server}:{upstream_name}"),
            ))
        };
        let now: Vec<ToolDefinition> = self
            .catalog
            .tools()
            .iter()
            .filter_map(|e| record(&e.spec.name))
            .collect();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            for def in now {
                put(&store, def).await;
            }
            // Told to stop (or its handle dropped): what the catalog announced so far is
            // written, then the task ends.
            let mut stopping = false;
            loop {
                let event = if stopping {
                    match events.try_recv() {
                        Ok(event) => Ok(event),
                        Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => {
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(n))
                        }
                        Err(_) => return,
                    }
                } else {
                    tokio::select! {
                        biased;
                        event = events.recv() => event,
                        _ = &mut stopped => {
                            stopping = true;
                            continue;
                        }
                    }
                };
                match event {
                    Ok(quiver_registry::CatalogEvent::Added(name)) => {
                        if let Some(def) = record(&name) {
                            put(&store, def).await;
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "definition recorder fell behind the catalog");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        DefinitionRecorder { task, stop }
    }

    /// Brings a session's stored working set back (tools it paged in before a restart),
    /// and which tools it called (for `requires_prior` policy rules).
    pub async fn open_session(&self, session: &str) -> anyhow::Result<()> {
        self.surface
            .restore_session(session, &*self.store)
            .await
            .with_context(|| format!("restoring the working set of session {session}"))?;
        self.dispatcher
            .restore_called(session, &*self.store)
            .await
            .with_context(|| format!("reading the calls of session {session}"))?;
        Ok(())
    }

    /// Writes a session's working set to the store now.
    pub async fn save_session(&self, session: &str) -> anyhow::Result<()> {
        self.surface
            .persist_session(session, &*self.store)
            .await
            .with_context(|| format!("saving the working set of session {session}"))?;
        Ok(())
    }

    /// The call log.
    pub fn call_log(&self) -> &dyn CallLog {
        &*self.store
    }

    /// Waits until `required` MCP servers are ready (an error names the last rejection),
    /// and until every other server has finished its first connection attempt or `timeout`
    /// passes, so a one-shot command sees the upstream tools that can be had.
    pub async fn wait_for_upstreams(&self, timeout: std::time::Duration) -> anyhow::Result<()> {
        self.mcp
            .wait_ready(timeout)
            .await
            .context("a required MCP server is not ready")?;
        let deadline = tokio::time::Instant::now() + timeout;
        while self
            .mcp
            .status()
            .iter()
            .any(|s| matches!(s.state, ServerState::Connecting))
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Each server's skipped names were logged as it registered them (and are in
        // `status` and `check`): not again here.
        // The search index follows the catalog in a task of its own: a one-shot search
        // right after an upstream came up could run before its tools were indexed.
        let version = self.catalog.version();
        let mut indexed = self.surface.index_updates();
        let _ = tokio::time::timeout_at(deadline, indexed.wait_for(|at| *at >= version)).await;
        Ok(())
    }

    /// Closes the MCP client (terminating stdio children), writes every session's working
    /// set, flushes the execution log and closes the store.
    pub async fn shutdown(&self) -> anyhow::Result<()> {
        self.mcp.close().await;
        // Records still on their way to the log (callers gone, a full channel).
        self.dispatcher.drain_records().await;
        // The background mirror may not have written the last changes yet, nor deleted the
        // sessions that just ended (a `serve --stdio` ends with its one session).
        if tokio::time::timeout(MIRROR_SETTLE, self.surface.mirror_settled())
            .await
            .is_err()
        {
            tracing::warn!(
                "working-set persistence still busy after {MIRROR_SETTLE:?}; writing the open sessions now"
            );
        }
        // A read-only store keeps what it had: the sessions a command looked at are not
        // written back. A key bound to an MCP session never comes back once this process
        // stops: its stored working set goes now, while the store is open (the sessions'
        // own ends come after the store closed, and their rows stayed for good).
        if !self.store.is_read_only() {
            for session in self.surface.session_keys() {
                if quiver_surface::SessionKey::parse(&session).is_session_bound() {
                    self.surface.end_session(&session);
                    quiver_surface::ports::SessionStore::end_session(&*self.store, &session)
                        .await
                        .with_context(|| format!("forgetting the working set of {session}"))?;
                } else {
                    self.save_session(&session).await?;
                }
            }
        }
        self.store
            .close()
            .await
            .context("flushing the execution log")?;
        Ok(())
    }
}

/// What `GET /readyz` checks for `quiver serve`: the required upstream MCP servers are
/// connected ([`McpClient::required_not_ready`]: the host composes readiness from the
/// client's state, so the adapter's client and server need not know each other) and the
/// execution log is being written (a failing log would leave calls unaudited, so a load
/// balancer should send them elsewhere).
/// An `[auth.oidc]` that the provider contradicts is a reason too: no access token can be
/// checked, so every request of this replica would fail.
#[derive(Clone)]
pub struct Ready {
    mcp: McpClient,
    store: Arc<Store>,
    auth: Arc<std::sync::Mutex<Option<String>>>,
}

impl Ready {
    /// The checks of `app`.
    pub fn of(app: &App) -> Self {
        Ready {
            mcp: app.mcp.clone(),
            store: app.store.clone(),
            auth: Arc::default(),
        }
    }

    /// Says (`Some`) or clears (`None`) why no access token can be checked.
    pub fn set_auth_problem(&self, problem: Option<String>) {
        *self
            .auth
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = problem;
    }
}

impl quiver_mcp_adapter::Readiness for Ready {
    fn not_ready(&self) -> Vec<String> {
        let mut reasons = self.mcp.required_not_ready();
        if let Some(why) = self
            .auth
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        {
            reasons.push(why);
        }
        if let Some(why) = self.store.file_lost() {
            reasons.push(why.to_owned());
        }
        if self.store.log_failing() {
            // Words only: the error names the file; the operator's log has it.
            reasons.push(
                "the execution log cannot be written (calls would go unaudited; the server log has the error)"
                    .to_owned(),
            );
        }
        reasons
    }
}

/// The task that records upstream tool definitions while `serve` runs
/// ([`App::spawn_definition_recorder`]).
#[derive(Debug)]
pub struct DefinitionRecorder {
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl DefinitionRecorder {
    /// Writes what is still to be written (the definitions of start-up, the tools added
    /// since) and ends the task; before the store closes, or they are lost. Gives up after
    /// `wait`, with a warning.
    pub async fn finish(self, wait: std::time::Duration) {
        let _ = self.stop.send(());
        if tokio::time::timeout(wait, self.task).await.is_err() {
            tracing::warn!(
                "tool definitions still being recorded after {wait:?}; the rest are not stored"
            );
        }
    }
}

impl App {
    /// A reloader of this app's configuration (`config` as it was loaded), for `serve`.
    pub fn reloader(&self, config: &Config) -> crate::reload::Reloader {
        crate::reload::Reloader::new(
            config.clone(),
            config.source.clone(),
            self.mcp_files.clone(),
            self.mcp.clone(),
            self.policy.clone(),
            self.catalog.clone(),
        )
        .with_catalog_dir(self.catalog_dir.clone(), self.skill_stack.clone())
        .with_pipeline(self.dispatcher.clone(), self.surface.clone())
        .with_admins(self.admins.clone())
    }
}
