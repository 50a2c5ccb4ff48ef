use std::sync::Arc;

use quiver_contract::Tool;
use quiver_registry::{Catalog, Family, RegisterReport, RegistryError, order_families};

/// The fixed order in which tool families are registered. The first registration of a name
/// wins, so an earlier family can never be shadowed by a later one.
pub const FAMILY_ORDER: [&str; 5] = [
    "core",
    "server-global MCP",
    "client MCP",
    "custom tools",
    "skills",
];

/// The tools of each family, as the host gathered them.
#[derive(Default)]
#[non_exhaustive]
pub struct Families {
    /// Built-in tools (`tool_search`, `describe_tool`, resource meta-tools).
    pub core: Vec<Arc<dyn Tool>>,
    /// Tools of the MCP servers configured for the whole process.
    pub server_mcp: Vec<Arc<dyn Tool>>,
    /// Tools of the MCP servers a session's client brought (empty for the shared catalog).
    pub client_mcp: Vec<Arc<dyn Tool>>,
    /// Sandboxed custom tools.
    pub custom: Vec<Arc<dyn Tool>>,
    /// Skills.
    pub skills: Vec<Arc<dyn Tool>>,
}

impl std::fmt::Debug for Families {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Families")
            .field("core", &self.core.len())
            .field("server_mcp", &self.server_mcp.len())
            .field("client_mcp", &self.client_mcp.len())
            .field("custom", &self.custom.len())
            .field("skills", &self.skills.len())
            .finish()
    }
}

/// Registers every family into `catalog` in [`FAMILY_ORDER`], first-wins, and logs one
/// warning per family that skipped names. The report lists every skipped name.
pub fn assemble_catalog(
    catalog: &Catalog,
    families: Families,
) -> Result<RegisterReport, RegistryError> {
    let Families {
        core,
        server_mcp,
        client_mcp,
        custom,
        skills,
    } = families;
    let ordered = order_families(
        &FAMILY_ORDER,
        vec![
            Family::new("skills", skills),
            Family::new("custom tools", custom),
            Family::new("client MCP", client_mcp),
            Family::new("server-global MCP", server_mcp),
            Family::new("core", core),
        ],
    )?;
    let report = catalog.register_families(ordered);
    for line in report.warning_lines() {
        tracing::warn!("{line}");
    }
    Ok(report)
}
