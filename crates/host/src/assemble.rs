use std::sync::Arc;

use quiver_contract::Tool;
use quiver_registry::{
    Catalog, Family, FamilyOrder, FamilyTools, RegisterReport, RegistryError, order_families,
};

/// The fixed order of the tool families: core tools, server-global MCP, client MCP, custom
/// tools, skills. The first registration of a name in this order wins, whenever each family
/// registers, so an earlier family can never be shadowed by a later one. The custom-tools
/// position holds two families: the catalog files' aliases, then the stored custom tools
/// (the operator wrote the file, so a stored custom tool of an alias's name is reported,
/// not served).
pub const FAMILY_ORDER: [Family; 6] = [
    Family::Core,
    Family::ServerMcp,
    Family::ClientMcp,
    Family::Catalog,
    Family::Custom,
    Family::Skills,
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
    /// The families of the server-global MCP servers (`mcp:<server>`), in configuration
    /// order. Their tools register as each server connects; when two servers' tools take
    /// one name, the server configured first has it, whichever connects first.
    pub mcp_servers: Vec<String>,
}

impl std::fmt::Debug for Families {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Families")
            .field("core", &self.core.len())
            .field("server_mcp", &self.server_mcp.len())
            .field("client_mcp", &self.client_mcp.len())
            .field("custom", &self.custom.len())
            .field("skills", &self.skills.len())
            .field("mcp_servers", &self.mcp_servers)
            .finish()
    }
}

/// Gives `catalog` the family order ([`FAMILY_ORDER`], the MCP servers among themselves as
/// `families.mcp_servers` lists them), registers every family in it, first-wins, and logs
/// one warning per family that skipped names. The report lists every skipped name.
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
        mcp_servers,
    } = families;
    let ordered = order_families(
        &FAMILY_ORDER.map(Family::name),
        vec![
            FamilyTools::new(Family::Skills.name(), skills),
            FamilyTools::new(Family::Custom.name(), custom),
            // The catalog directory's aliases register after assembly, as it is read.
            FamilyTools::new(Family::Catalog.name(), Vec::new()),
            FamilyTools::new(Family::ClientMcp.name(), client_mcp),
            FamilyTools::new(Family::ServerMcp.name(), server_mcp),
            FamilyTools::new(Family::Core.name(), core),
        ],
    )?;
    catalog.set_family_order(FamilyOrder::new(FAMILY_ORDER).with_servers(mcp_servers));
    let report = catalog.register_families(ordered);
    for line in report.warning_lines() {
        tracing::warn!("{line}");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use async_trait::async_trait;
    use quiver_contract::{CallContext, Envelope, ToolResult, ToolSpec};

    use super::*;

    struct Named(ToolSpec);

    #[async_trait]
    impl Tool for Named {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        async fn call(&self, _: serde_json::Value, _: &CallContext) -> ToolResult {
            Ok(Envelope::text(self.0.name.clone()))
        }
    }

    fn tools(names: &[&str]) -> Vec<Arc<dyn Tool>> {
        names
            .iter()
            .map(|n| Arc::new(Named(ToolSpec::new(*n, format!("{n}.")))) as Arc<dyn Tool>)
            .collect()
    }

    fn families(client: &[&str]) -> Families {
        Families {
            core: tools(&["tool_search", "describe_tool"]),
            server_mcp: tools(&["mcp__time__now", "tool_search"]),
            client_mcp: tools(client),
            custom: tools(&["custom_report", "mcp__time__now"]),
            skills: tools(&["skill"]),
            mcp_servers: Vec::new(),
        }
    }

    #[test]
    fn the_family_order_is_pinned() {
        assert_eq!(
            FAMILY_ORDER.map(Family::name),
            [
                "core",
                "server-global MCP",
                "client MCP",
                "catalog aliases",
                "custom tools",
                "skills"
            ]
        );
    }

    #[test]
    fn a_session_catalog_differs_from_the_shared_one_only_by_client_mcp() {
        let shared = Catalog::new();
        let shared_report = assemble_catalog(&shared, families(&[])).unwrap();
        let session = Catalog::new();
        assemble_catalog(&session, families(&["mcp__mine__do"])).unwrap();
        let client: BTreeSet<String> = session.family_names("client MCP");
        assert_eq!(client, BTreeSet::from(["mcp__mine__do".to_owned()]));
        let session_without_client: BTreeSet<String> = session
            .names()
            .into_iter()
            .filter(|n| !client.contains(n))
            .collect();
        let shared_names: BTreeSet<String> = shared.names().into_iter().collect();
        assert_eq!(session_without_client, shared_names);
        // Every family is present, and earlier families win.
        for family in ["core", "server-global MCP", "custom tools", "skills"] {
            assert!(!shared.family_names(family).is_empty(), "{family} missing");
        }
        assert_eq!(
            shared.lookup("tool_search").unwrap().family.as_ref(),
            "core"
        );
        assert_eq!(
            shared.lookup("mcp__time__now").unwrap().family.as_ref(),
            "server-global MCP"
        );
        let lines = shared_report.warning_lines();
        assert!(
            lines.contains(
                &"server-global MCP: skipped duplicate tool name(s) (1): tool_search".to_owned()
            ),
            "{lines:?}"
        );
        assert!(
            lines.contains(
                &"custom tools: skipped duplicate tool name(s) (1): mcp__time__now".to_owned()
            ),
            "{lines:?}"
        );
    }
}
