//! What `quiver check` says of the surface: settings that do not fit together, an agentic
//! allow-list that fills the round, definitions too large to be shown.

use quiver_contract::{Finding, pattern_matches};
use quiver_registry::PolicyRule;

use crate::{Surface, SurfaceConfig};

impl SurfaceConfig {
    /// What `quiver check` says of this configuration: its [`SurfaceConfig::warnings`], then
    /// each system tool or anchor that a rule of `denied` (the deny rules that refuse every
    /// caller) refuses. A system tool stays on every list though every call of it is
    /// refused; an anchor is never offered, silently.
    pub fn findings<'a>(&self, denied: impl IntoIterator<Item = &'a PolicyRule>) -> Vec<Finding> {
        let mut out = self.warnings();
        for r in denied {
            for (key, name) in self
                .system
                .iter()
                .map(|n| ("system", n))
                .chain(self.anchors.iter().map(|n| ("anchors", n)))
            {
                if !pattern_matches(&r.tool, name) {
                    continue;
                }
                out.push(if key == "system" {
                    format!(
                        "system tool `{name}` is denied to every caller by policy rule `{}`: it stays on every tool list (the system set always does) and every call of it is refused; take it out of `system` or narrow the rule",
                        r.id
                    )
                } else {
                    format!(
                        "anchor `{name}` is denied to every caller by policy rule `{}`, so it is never offered; take it out of `anchors` or narrow the rule",
                        r.id
                    )
                });
            }
        }
        out.into_iter()
            .map(|w| Finding::error(format!("surface: [config] {w}")))
            .collect()
    }
}

impl Surface {
    /// What `quiver check` says of the surface over the catalog now: an agentic allow-list
    /// that fills the round ([`Surface::agentic_crowding`]), which leaves no room for what
    /// `tool_search` pages in (found, never listed), then each definition too large to be
    /// shown ([`Surface::oversized`]), a tool no model can call.
    pub fn findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        if let Some((allowed, system, max)) = self.agentic_crowding() {
            out.push(Finding::error(format!(
                "surface: [config] agentic_allow names {allowed} tools; with the {system} system tools that fills a round (round.max_definitions = {max}), so in agentic mode tools found by tool_search are never listed: narrow agentic_allow or raise max_definitions"
            )));
        }
        for o in self.oversized() {
            out.push(Finding::error(format!(
                "{}: [too large] its definition is {} bytes, more than {} ({} bytes), so it is never shown: shorten its description or schema, or raise the budget",
                o.name, o.bytes, o.budget, o.limit
            )));
        }
        out
    }
}
