//! The embedded default store: one SQLite file (rusqlite, bundled, no server) that remembers
//! what Quiver knows across restarts — tool definitions and their seeding, every call made
//! (the execution log), custom-tool jobs, and each session's working set and surface state.
//! [`SqliteStore`] implements the core crates' ports (`DefinitionStore`, `JobStore`,
//! `CallLog`, `ToolCallRecorder`, `SessionStore`, `UsageSource`); nothing of SQLite leaks
//! through them. It runs in WAL mode with one dedicated writer thread that commits call
//! records in batches taken from a bounded channel (a full channel makes the caller wait; no
//! row is dropped), and reads on their own connections so they never wait behind the writer.

mod chain;
mod convert;
mod error;
mod schema;
mod store;
mod sync;
mod writer;

pub use schema::{CrashCheck, OpenReport};
pub use store::{
    Durability, SessionRows, SqliteStore, StoreOptions, WriterStats, read_calls, read_definitions,
    read_sessions,
};
