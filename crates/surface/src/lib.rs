//! The per-session tool surface: the crate composes which tools a session's model sees and
//! how they are found. [`Surface`] holds the resident floor (anchors, then the tools used
//! most), each session's working set (tools the model paged in with `tool_search` or
//! `describe_tool`), and the per-round budgets; [`core_tools`] are those two built-in tools.
//! Its [`search`] module is the lexical search index behind `tool_search`, with an
//! embedding port ([`search::Embedder`]) to fuse in a vector retriever whose tool vectors a
//! background task computes ([`Surface::spawn_vector_worker`]); [`ports`] holds
//! the persistence ports it consumes ([`ports::SessionStore`], [`ports::UsageSource`]), in
//! its own vocabulary, with in-memory implementations.
//!
//! # Example
//!
//! Compose what a session's model sees, find a tool with `tool_search`, and call it
//! through the one call entry point, [`Surface::call`]:
//!
//! ```
//! use std::sync::Arc;
//!
//! use quiver_contract::{CallContext, Capabilities, Envelope, Mode, ToolSpec, typed_tool};
//! use quiver_registry::{Catalog, Dispatcher};
//! use quiver_surface::{MemoryUsage, SessionKey, Surface, SurfaceConfig, core_tools};
//! use serde_json::json;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct City {
//!     city: String,
//! }
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! runtime.block_on(async {
//!     let catalog = Arc::new(Catalog::new());
//!     catalog.must_register(Arc::new(typed_tool(
//!         ToolSpec::new("weather_forecast", "Forecasts tomorrow's weather for a city.")
//!             .read_only(),
//!         |args: City, _ctx: CallContext| async move {
//!             Ok(Envelope::ok(json!(format!("Sunny in {}", args.city))))
//!         },
//!     )));
//!     let usage = Arc::new(MemoryUsage::default());
//!     let surface = Surface::new(catalog.clone(), SurfaceConfig::default(), usage)?;
//!     catalog.register_all("core", core_tools(&surface));
//!     let dispatcher = Dispatcher::builder(catalog).observer(surface.clone()).build();
//!
//!     let session = SessionKey::conversation(None, "c1");
//!     let everything = Capabilities::all();
//!     // A new session is shown the resident tools (here `tool_search` and
//!     // `describe_tool`), not the weather tool.
//!     let listed = surface.compose(&session, Mode::Chat, &everything)?;
//!     assert!(!listed.names().contains(&"weather_forecast"));
//!
//!     let search = json!({"query": "weather tomorrow"});
//!     let found = surface
//!         .call(&dispatcher, &session, Mode::Chat, "tool_search", search, CallContext::default())
//!         .await;
//!     assert!(found.is_ok());
//!     // The search paged it into the session's working set: it is on the next list.
//!     let listed = surface.compose(&session, Mode::Chat, &everything)?;
//!     assert!(listed.names().contains(&"weather_forecast"));
//!
//!     let oslo = json!({"city": "Oslo"});
//!     let answer = surface
//!         .call(&dispatcher, &session, Mode::Chat, "weather_forecast", oslo, CallContext::default())
//!         .await;
//!     assert_eq!(answer.data(), Some(&json!("Sunny in Oslo")));
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod admit;
mod call;
mod compose;
mod config;
mod discover;
mod error;
mod findings;
mod floor;
mod index;
mod key;
mod persist;
pub mod ports;
pub mod search;
mod sessions;
mod surface;
mod sync;
mod tools;
mod types;
mod vectors;
mod view;
mod working_set;

pub use config::{MAX_SEARCH_LIMIT, RoundBudget, SurfaceConfig, WorkingSetConfig};
pub use error::SurfaceError;
pub use floor::{
    Floor, FloorEntry, FloorSource, MemoryUsage, USAGE_WEIGHTS, UsageScores, usage_score,
};
pub use key::{SessionKey, SessionKind};
pub use persist::FloorLoad;
pub use sessions::SessionPin;
pub use surface::Surface;
pub use tools::{BLANK_QUERY_HINT, NO_MATCH_HINT, core_tools};
pub use types::{
    ComposedSurface, DEFAULT_SESSION, DESCRIBE_TOOL, DropReason, DroppedTool, FailReason,
    FailedTool, FoundTool, Oversized, Reason, SearchOutcome, SurfaceTool, TOOL_SEARCH,
};
pub use vectors::VectorProgress;
pub use view::{SessionClient, SessionView, WorkingSetSlot};
pub use working_set::PageIn;
