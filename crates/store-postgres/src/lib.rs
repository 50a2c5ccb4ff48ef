//! The shared store: PostgreSQL, for several `quiver serve` replicas behind a load balancer
//! that must share one state — tool definitions and custom tools, custom-tool jobs, each
//! session's working set and the resident floor, and the execution log. [`PgStore`]
//! implements the core crates' ports (`DefinitionStore`, `JobStore`, `CallLog`,
//! `ToolCallRecorder`, `SessionStore`, `UsageSource`), as the SQLite store does; nothing of
//! PostgreSQL leaks through them. Call records are copied in batches by a writer task off the
//! call path; a listener connection (`LISTEN quiver_definitions`) takes the definitions other
//! servers change live; jobs are claimed with `FOR UPDATE SKIP LOCKED`; one server at a time
//! holds the advisory lock of deriving the floor.

mod convert;
mod error;
mod import;
mod listen;
mod schema;
mod session;
mod store;
mod sync;
mod tls;
mod writer;

pub use error::redact;
pub use import::{Import, ImportCounts};
pub use schema::OpenReport;
pub use store::{Durability, PgOptions, PgStore, WriterStats};
