//! Tool names the configuration refers to, held against the catalog's tools.

use quiver_contract::{Finding, pattern_matches};

use crate::suggestion;

/// A tool name or pattern in the configuration, with the key it is under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRef<'a> {
    /// The key it is under.
    pub key: String,
    /// The name or pattern.
    pub name: &'a str,
    /// The key takes exact names only (a `*` there is a literal character).
    pub exact: bool,
}

impl ToolRef<'_> {
    /// Whether it refers to the tool `tool`.
    pub fn matches(&self, tool: &str) -> bool {
        if self.exact {
            self.name == tool
        } else {
            pattern_matches(self.name, tool)
        }
    }
}

/// What `quiver check` says of the configured names in `refs` that match none of `names`
/// (the catalog's tools). Such a name is most likely a typo (a deny rule that never fires):
/// unmatched, with a did-you-mean for a near name. Told, not counted: a name that
/// `unchecked` says belongs to a server that is not connected now (it returns that
/// server), and a `*` pattern, often a safety net for tools that may come
/// (`mcp__*__drop_table`, `*delete*`).
pub fn unmatched_tool_refs(
    refs: &[ToolRef<'_>],
    names: &[String],
    unchecked: &dyn Fn(&str) -> Option<String>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for r in refs {
        if names.iter().any(|n| r.matches(n)) {
            continue;
        }
        if let Some(server) = unchecked(r.name) {
            out.push(Finding::note(format!(
                "{}: [note] `{}` not checked: server {server} is not connected",
                r.key, r.name
            )));
            continue;
        }
        if !r.exact && r.name.contains('*') {
            out.push(Finding::note(format!(
                "{}: [note] pattern `{}` matches no tool in the catalog now",
                r.key, r.name
            )));
            continue;
        }
        let note = if r.exact && r.name.contains('*') {
            " (this key takes exact names: `*` is not a wildcard here)".to_owned()
        } else {
            suggestion(r.name, names.iter().map(String::as_str))
        };
        out.push(Finding::unmatched(format!(
            "{}: [unmatched] `{}` matches no tool in the catalog{note}",
            r.key, r.name
        )));
    }
    out
}
