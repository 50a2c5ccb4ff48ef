//! What the store adapters' execution-log writers share: the [`Durability`] a store is opened
//! with, the [`QueuedRecord`] a writer holds until its commit, and the counters the host
//! reads from either (`quiver status`, `/readyz`, the metrics). Each writer writes rows in
//! batches, in a task or thread of its own.

use std::sync::{
    Mutex,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use tokio::sync::oneshot;

use crate::{CallRecord, store::StoreError, sync::lock};

/// When a call's answer may leave, relative to its execution-log row's commit (`[store]
/// durability = "batched" | "strict"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Durability {
    /// The answer leaves at once; the row is committed in a batch within the writer's
    /// linger (milliseconds). A process killed outright (`kill -9`, a power cut) loses the
    /// rows of the calls it answered in its last moments.
    #[default]
    Batched,
    /// The answer waits for its row's commit: [`crate::ToolCallRecorder::record`] returns
    /// once the row is committed (or, when the database refuses it for good, counted as
    /// lost). The rows still go through the batching writer, without its linger: calls
    /// that finish while a batch commits share the next one (group commit), so the cost is
    /// one commit's wait per call, not a transaction per call. While the database cannot
    /// take writes, answers wait with their rows.
    Strict,
}

/// One call record in a writer's queue, with the caller waiting for its commit when the
/// store is [`Durability::Strict`].
#[derive(Debug)]
#[non_exhaustive]
pub struct QueuedRecord {
    /// The record.
    pub record: CallRecord,
    /// Told once the record is committed; dropped unsent when it is lost.
    pub committed: Option<oneshot::Sender<()>>,
}

impl QueuedRecord {
    /// `record`, and for [`Durability::Strict`] the receiver its commit is told on.
    pub fn new(
        record: CallRecord,
        durability: Durability,
    ) -> (QueuedRecord, Option<oneshot::Receiver<()>>) {
        let (committed, wait) = match durability {
            Durability::Batched => (None, None),
            Durability::Strict => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
        };
        (QueuedRecord { record, committed }, wait)
    }

    /// The record is committed: tells whoever waits for it.
    pub fn done(self) {
        if let Some(tx) = self.committed {
            let _ = tx.send(());
        }
    }
}

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
