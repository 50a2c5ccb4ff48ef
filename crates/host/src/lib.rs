//! The `quiver` binary's library half: configuration, [`assemble_catalog`] (tool families in
//! their fixed order, first registration wins, every skipped name reported), the output
//! formats of the CLI, and [`serve`] (the MCP server's process lifecycle). The host decides
//! order and wiring, never behaviour: business rules live in the core crates.

pub mod admin_page;
pub mod allocator;
mod app;
mod assemble;
pub mod catalog_dir;
pub mod check;
pub mod clients;
mod config;
mod formats;
mod fs_skills;
pub mod identity;
mod mcp_json;
pub mod metrics;
pub mod reload;
mod retriever;
pub mod serve;
mod store;

pub use app::{
    App, CORE_TOOL_NAMES, DEFINITIONS_POLL, DefinitionRecorder, OWN_TOOL_NAMES, Ready, StoreAccess,
    custom_tools, custom_tools_on,
};
pub use assemble::{FAMILY_ORDER, Families, assemble_catalog};
pub use config::{
    CatalogConfig, Config, LimitsConfig, PolicyConfig, SandboxConfig, SearchConfig, SkillsConfig,
    StoreConfig,
};
pub use formats::{
    CatalogRow, ToolFormat, disabled_note, format_catalog, format_tools, provider_name_warnings,
};
pub use fs_skills::{DirSkills, load_commands};
pub use mcp_json::{parse_mcp_servers, read_mcp_servers};
pub use quiver_registry::{ToolRef, suggestion};
pub use retriever::{SearchMode, load_model, search_mode};
pub use store::Store;
