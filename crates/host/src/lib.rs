//! The `quiver` binary's library half: configuration, [`assemble_catalog`] (tool families in
//! their fixed order, first registration wins, every skipped name reported), the output
//! formats of the CLI, and [`serve`] (the MCP server's process lifecycle). The host decides
//! order and wiring, never behaviour: business rules live in the core crates.

mod assemble;
mod formats;
pub mod serve;

pub use assemble::{FAMILY_ORDER, Families, assemble_catalog};
pub use formats::{ToolFormat, format_tools};
