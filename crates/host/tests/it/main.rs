//! The `quiver` binary as a user runs it.

mod admin_page;
mod catalog;
mod cli;
mod client;
mod metrics;
mod packaging;
mod reload;
mod semantic;
mod serve;
mod traces;
mod upstreams;

/// The plain-Python stdio MCP server with one tool (its docstring lists the knobs).
pub(crate) const ONE_TOOL_SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/one_tool_server.py"
);

/// A test's own directory under the system's temporary one, removed when it is dropped (the
/// runs left hundreds behind in /tmp). Derefs to its path.
pub(crate) struct Scratch(tempfile::TempDir);

impl Scratch {
    /// A new empty directory whose name begins with `quiver-<prefix>-`.
    pub(crate) fn new(prefix: &str) -> Self {
        Scratch(
            tempfile::Builder::new()
                .prefix(&format!("quiver-{prefix}-"))
                .tempdir()
                .expect("a temporary directory"),
        )
    }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        self.0.path()
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        self.0.path()
    }
}
