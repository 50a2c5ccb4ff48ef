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

/// Where a catalog family stands in [`FAMILY_ORDER`] (lower first), for
/// [`Catalog::set_family_order`]: an MCP server's own family (`mcp:<server>`) stands with
/// the server-global MCP family; a family outside the order comes after all of it.
pub fn family_rank(family: &str) -> usize {
    let class = if family.starts_with("mcp:") {
        "server-global MCP"
    } else {
        family
    };
    FAMILY_ORDER
        .iter()
        .position(|f| *f == class)
        .unwrap_or(FAMILY_ORDER.len())
}

/// [`family_rank`], with the MCP servers' own families (`mcp:<server>`) ordered among
/// themselves as `servers` lists them (the configuration's order): when two servers' tools
/// take one name, the server configured first has it, whichever connects first. Families
/// of other classes keep their place; a server not listed comes after the listed ones.
pub fn family_rank_in(servers: Vec<String>) -> impl Fn(&str) -> usize + Send + Sync + 'static {
    let slots = servers.len() + 2;
    move |family: &str| {
        let within = if family.starts_with("mcp:") {
            servers
                .iter()
                .position(|s| s == family)
                .map_or(slots - 1, |i| i + 1)
        } else {
            0
        };
        family_rank(family) * slots + within
    }
}

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
        }
    }

    #[test]
    fn the_family_order_is_pinned() {
        assert_eq!(
            FAMILY_ORDER,
            [
                "core",
                "server-global MCP",
                "client MCP",
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
