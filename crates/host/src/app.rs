//! The assembled runtime every command shares: store, catalog, surface, dispatcher.

use std::{sync::Arc, time::SystemTime};

use anyhow::Context;
use quiver_registry::{
    CallLog, Catalog, DefinitionStore, Dispatcher, RegisterReport, RulePolicy, ToolDefinition,
    ToolType,
};
use quiver_store_sqlite::SqliteStore;
use quiver_surface::{MemoryUsage, Surface, core_tools, ports::UsageSource};

use crate::{Config, Families, assemble_catalog};

/// Everything a command needs, built once by [`App::build`].
#[non_exhaustive]
pub struct App {
    /// The shared catalog.
    pub catalog: Arc<Catalog>,
    /// The per-session surface.
    pub surface: Arc<Surface>,
    /// The one dispatch pipeline.
    pub dispatcher: Dispatcher,
    /// The embedded store (definitions, execution log, session state).
    pub store: Arc<SqliteStore>,
    /// What catalog assembly registered and skipped.
    pub report: RegisterReport,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("tools", &self.catalog.len())
            .finish_non_exhaustive()
    }
}

impl App {
    /// Opens the store, derives usage for the resident floor, assembles the catalog in family
    /// order, and builds the dispatcher with the store as
    /// its recorder and the surface as a call observer.
    pub async fn build(config: &Config) -> anyhow::Result<App> {
        let path = &config.store.path;
        let store = Arc::new(
            SqliteStore::open(path)
                .with_context(|| format!("opening the store {}", path.display()))?,
        );
        let usage = store
            .usage(SystemTime::now())
            .await
            .context("reading tool usage from the store")?;
        let usage = MemoryUsage::new(
            usage
                .into_iter()
                .map(|u| (u.tool, [u.last_30_days, u.last_90_days, u.older])),
        );
        let catalog = Arc::new(Catalog::new());
        let surface = Surface::new(catalog.clone(), config.surface.clone(), Arc::new(usage))
            .context("building the tool surface")?;
        let families = Families {
            core: core_tools(&surface),
            ..Default::default()
        };
        let report = assemble_catalog(&catalog, families).context("assembling the catalog")?;
        surface.resync_index();
        let dispatcher = Dispatcher::builder(catalog.clone())
            .config(config.limits.dispatch_config()?)
            .policy(Arc::new(RulePolicy::new(config.policy.rules.clone())))
            .recorder(store.clone())
            .observer(surface.clone())
            .build();
        Ok(App {
            catalog,
            surface,
            dispatcher,
            store,
            report,
        })
    }

    /// Records the running code's system tools (the `core` family) in the store's
    /// definitions table, refreshing their text and schema; stored rows this build does not
    /// know are left alone and logged. `serve` does this at start-up; `check --against` reads
    /// the stored definitions before anything is seeded.
    pub async fn seed(&self) -> anyhow::Result<()> {
        let system: Vec<ToolDefinition> = self
            .catalog
            .tools()
            .iter()
            .filter(|e| &*e.family == "core")
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

    /// Brings a session's stored working set back (tools it paged in before a restart).
    pub async fn open_session(&self, session: &str) -> anyhow::Result<()> {
        self.surface
            .restore_session(session, &*self.store)
            .await
            .with_context(|| format!("restoring the working set of session {session}"))?;
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

    /// Flushes the execution log and closes the store.
    pub async fn shutdown(&self) -> anyhow::Result<()> {
        self.store
            .close()
            .await
            .context("flushing the execution log")?;
        Ok(())
    }
}
