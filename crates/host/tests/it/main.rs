//! The `quiver` binary as a user runs it.

mod cli;
mod serve;
mod upstreams;

/// The plain-Python stdio MCP server with one tool (its docstring lists the knobs).
pub(crate) const ONE_TOOL_SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/one_tool_server.py"
);
