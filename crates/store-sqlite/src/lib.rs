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
mod session;
mod store;
mod sync;
mod writer;

pub use schema::{CrashCheck, OpenReport};

/// Bytes SQLite holds in this process now, over every connection of every store: page
/// caches, prepared statements, schemas. Part of what the allocator has handed out.
pub fn memory_used() -> u64 {
    // SAFETY: sqlite3_memory_used takes no arguments and reads SQLite's own counter (it
    // is thread-safe in the bundled build's serialized threading mode).
    #[allow(unsafe_code)]
    let used = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    u64::try_from(used).unwrap_or(0)
}
pub use store::{
    Durability, SessionRows, SqliteStore, StoreOptions, WriterStats, read_calls, read_definitions,
    read_sessions,
};
