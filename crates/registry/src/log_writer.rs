//! The counters of an execution-log writer, shared by the store adapters: each writes rows
//! in batches off the call path, and the host reads the same figures from either
//! (`quiver status`, `/readyz`, the metrics).

use std::sync::{
    Mutex,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use crate::{store::StoreError, sync::lock};

/// What a writer has done, read at one moment ([`WriterCounters::snapshot`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WriterStats {
    /// Execution-log rows written.
    pub rows_written: u64,
    /// Batches of rows written (several rows share one while calls keep coming).
    pub batches_written: u64,
    /// Rows that could not be written after every retry (each also logged with
    /// `tracing::error!`).
    pub rows_failed: u64,
    /// Retried batch writes.
    pub write_retries: u64,
    /// The last write error, if any.
    pub last_error: Option<StoreError>,
    /// Whether the execution log is failing now: its last batch could not be written after
    /// every retry, and none has been written since.
    pub failing: bool,
}

/// A writer's live counters, updated by its task and read by the store.
#[derive(Debug, Default)]
pub struct WriterCounters {
    /// Rows written.
    pub rows_written: AtomicU64,
    /// Batches written.
    pub batches_written: AtomicU64,
    /// Rows that could not be written.
    pub rows_failed: AtomicU64,
    /// Retried batch writes.
    pub write_retries: AtomicU64,
    /// The last write error.
    pub last_error: Mutex<Option<StoreError>>,
    /// The last batch could not be written (cleared by the next one that is, or a probe).
    pub failing: AtomicBool,
    /// A probe write is queued (one at a time).
    pub probe_queued: AtomicBool,
}

impl WriterCounters {
    /// The database cannot take writes for now: failing, with `error`, no row lost.
    pub fn unavailable(&self, error: StoreError) {
        *lock(&self.last_error) = Some(error);
        self.failing.store(true, Ordering::Relaxed);
    }

    /// `rows` could not be written: counted, and failing with `error`.
    pub fn failed(&self, rows: u64, error: StoreError) {
        self.rows_failed.fetch_add(rows, Ordering::Relaxed);
        *lock(&self.last_error) = Some(error);
        self.failing.store(true, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> WriterStats {
        WriterStats {
            rows_written: self.rows_written.load(Ordering::Relaxed),
            batches_written: self.batches_written.load(Ordering::Relaxed),
            rows_failed: self.rows_failed.load(Ordering::Relaxed),
            write_retries: self.write_retries.load(Ordering::Relaxed),
            last_error: lock(&self.last_error).clone(),
            failing: self.failing.load(Ordering::Relaxed),
        }
    }
}
