//! The per-session tool surface: the crate composes which tools a session's model sees and
//! how they are found. [`Surface`] holds the resident floor (anchors, then the tools used
//! most), each session's working set (tools the model paged in with `tool_search` or
//! `describe_tool`), and the per-round budgets; [`core_tools`] are those two built-in tools.
//! Its [`search`] module is the lexical search index behind `tool_search`, with an optional
//! embedding port ([`search::Embedder`], off by default) to blend in a vector retriever; [`ports`] holds
//! the persistence ports it consumes ([`ports::SessionStore`], [`ports::UsageSource`]), in
//! its own vocabulary, with in-memory implementations.

mod config;
mod error;
mod findings;
mod floor;
mod persist;
pub mod ports;
pub mod search;
mod surface;
mod tools;
mod working_set;

pub use config::{MAX_SEARCH_LIMIT, RoundBudget, SurfaceConfig, WorkingSetConfig};
pub use error::SurfaceError;
pub use floor::{
    Floor, FloorEntry, FloorSource, MemoryUsage, USAGE_WEIGHTS, UsageScores, usage_score,
};
pub use persist::FloorLoad;
pub use surface::{
    ComposedSurface, DEFAULT_SESSION, DESCRIBE_TOOL, DropReason, DroppedTool, FailReason,
    FailedTool, FoundTool, Oversized, Reason, SearchOutcome, SessionPin, Surface, SurfaceTool,
    TOOL_SEARCH,
};
pub use tools::{BLANK_QUERY_HINT, NO_MATCH_HINT, core_tools};
pub use working_set::PageIn;
