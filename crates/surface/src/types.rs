//! The public vocabulary of the surface: the built-in tool names, a composed round
//! ([`ComposedSurface`], its tools and what was left off, and why), what `tool_search` found
//! ([`SearchOutcome`]) and the tools too large to ever be shown ([`Oversized`]).

use std::fmt::Write as _;

use quiver_contract::{Mode, ToolSpec};
use serde::Serialize;

/// The name of the search tool.
pub const TOOL_SEARCH: &str = "tool_search";
/// The name of the describe tool.
pub const DESCRIBE_TOOL: &str = "describe_tool";
/// The session key used when a call carries no session.
pub const DEFAULT_SESSION: &str = "default";

/// Why a tool is on the surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// Always resident (`tool_search`, `describe_tool`, configured system tools).
    System,
    /// A configured anchor.
    Anchor,
    /// In the usage-derived floor.
    Floor,
    /// In the static fallback floor.
    Fallback,
    /// On the agentic allow-list.
    AgenticAllow,
    /// Paged in by the model.
    WorkingSet,
    /// Named one by one in the caller's `allowed_tools` when the caller cannot search
    /// (`tool_search` is not allowed to it): listed, or it could never find them.
    Allowed,
}

impl Reason {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::System => "system",
            Reason::Anchor => "anchor",
            Reason::Floor => "floor",
            Reason::Fallback => "fallback",
            Reason::AgenticAllow => "agentic_allow",
            Reason::WorkingSet => "working_set",
            Reason::Allowed => "allowed",
        }
    }

    /// Whether the surface put the tool there (rather than the model paging it in).
    pub fn is_resident(self) -> bool {
        !matches!(self, Reason::WorkingSet)
    }
}

/// Why a candidate was left off the surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DropReason {
    /// Not (or no longer) in the catalog.
    Stale,
    /// Not listed in this mode (disabled, unapproved, internal, plan rules).
    NotListed,
    /// The caller may not call it.
    NotAllowed,
    /// Excluded by the mode's lists (agentic-only, delegate-excluded).
    ModeExcluded,
    /// Never offered (`SurfaceConfig::unoffered`: denied to every caller by a policy).
    Unoffered,
    /// A resident tool the model's own capability replaces.
    ReplacedByModel,
    /// The tool needs a model capability the caller's model does not declare.
    MissingCapability,
    /// The round's definition count was spent.
    OverCount,
    /// It did not fit in the round's byte budget.
    OverBytes,
}

impl DropReason {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Stale => "stale",
            DropReason::NotListed => "not_listed",
            DropReason::NotAllowed => "not_allowed",
            DropReason::ModeExcluded => "mode_excluded",
            DropReason::Unoffered => "unoffered",
            DropReason::ReplacedByModel => "replaced_by_model",
            DropReason::MissingCapability => "missing_capability",
            DropReason::OverCount => "over_count",
            DropReason::OverBytes => "over_bytes",
        }
    }
}

/// One advertised tool.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SurfaceTool {
    /// The spec as the model sees it (lightweight when progressive and not loaded; with the
    /// injected `reasoning` property).
    pub spec: ToolSpec,
    /// Why it is there.
    pub reason: Reason,
    /// Its definition bytes, as budgeted.
    pub bytes: usize,
}

/// One candidate left off.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DroppedTool {
    /// The tool.
    pub name: String,
    /// Why it was a candidate.
    pub reason: Reason,
    /// Why it was dropped.
    pub why: DropReason,
}

/// The tools of one round, in rank order, with what was left off and why.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ComposedSurface {
    /// The session.
    pub session: String,
    /// The mode.
    pub mode: Mode,
    /// The session's round.
    pub round: u64,
    /// The advertised tools, in rank order.
    pub tools: Vec<SurfaceTool>,
    /// The candidates left off.
    pub dropped: Vec<DroppedTool>,
    /// The total definition bytes of `tools`.
    pub bytes: usize,
}

impl ComposedSurface {
    /// The advertised names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.spec.name.as_str()).collect()
    }

    /// The advertised specs, in order.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    /// The reason a tool is on the surface, if it is.
    pub fn reason_of(&self, name: &str) -> Option<Reason> {
        self.tools
            .iter()
            .find(|t| t.spec.name == name)
            .map(|t| t.reason)
    }

    /// Why a candidate was dropped, if it was.
    pub fn dropped_why(&self, name: &str) -> Option<DropReason> {
        self.dropped.iter().find(|d| d.name == name).map(|d| d.why)
    }

    /// A plain-text table: one line per tool (name, reason, bytes), then the dropped ones.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "session {} mode {} round {}: {} tools, {} bytes\n",
            self.session,
            self.mode.as_str(),
            self.round,
            self.tools.len(),
            self.bytes
        );
        for t in &self.tools {
            let _ = writeln!(out, "  {:<24} {}", t.spec.name, t.reason.as_str());
        }
        for d in &self.dropped {
            let _ = writeln!(
                out,
                "  - {:<22} {} ({})",
                d.name,
                d.why.as_str(),
                d.reason.as_str()
            );
        }
        out
    }
}

/// Why a search hit could not be paged in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailReason {
    /// The working set cannot hold it.
    OverBudget,
    /// The session's mode does not list it. Not produced by
    /// [`Surface::tool_search`](crate::Surface::tool_search), whose search already leaves
    /// out what the caller's mode keeps off; kept for callers that page in hits of their own.
    NotDiscoverable,
    /// It left the catalog before it could be loaded.
    LoadFailed,
}

/// One hit of [`Surface::tool_search`](crate::Surface::tool_search).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FoundTool {
    /// The tool.
    pub name: String,
    /// Its description, cut to a line.
    pub description: String,
    /// Relevance in 0..=1, two decimals.
    pub score: f64,
}

/// A hit that was not paged in.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FailedTool {
    /// The tool.
    pub name: String,
    /// Why.
    pub reason: FailReason,
}

/// What [`Surface::tool_search`](crate::Surface::tool_search) found and did to the working
/// set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SearchOutcome {
    /// The hits, best first.
    pub hits: Vec<FoundTool>,
    /// The hits now in the working set (callable next turn).
    pub exposed: Vec<String>,
    /// The hits that were not paged in.
    pub failed: Vec<FailedTool>,
    /// Tools evicted from the working set to make room.
    pub evicted: Vec<String>,
    /// Tools the round listed before this search and no longer lists: its budget
    /// (`max_definitions`, `max_bytes`) cut them to make room for the hits. They stay
    /// callable by name; left out when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub displaced: Vec<String>,
}

/// A tool whose definition does not fit a budget it must fit to be shown
/// ([`Surface::oversized`](crate::Surface::oversized)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Oversized {
    /// The tool.
    pub name: String,
    /// Its definition's size as that budget measures it.
    pub bytes: usize,
    /// Which budget, as the configuration names it.
    pub budget: &'static str,
    /// The budget's limit in bytes.
    pub limit: usize,
}
