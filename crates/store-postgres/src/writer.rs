//! The execution-log writer: a task that takes call records from a bounded channel and copies
//! them into `execution_log` in batches (`COPY ... FROM STDIN BINARY`, one round trip per
//! batch), off the call path. Rows the server cannot take for now (it is down, or
//! restarting) are held, at most [`MAX_HELD`], and written once it takes writes again.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use deadpool_postgres::Pool;
use futures::pin_mut;
use quiver_registry::{
    chain::{self, ChainPoint, LogEntry},
    log_writer::QueuedRecord,
    store::StoreError,
};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::binary_copy::BinaryCopyInWriter;

use crate::{
    convert::{COPY_LOG, LOG_TYPES, LogRow},
    error::{ResultExt, classify},
};

/// What the writer task is asked to do.
#[expect(
    clippy::large_enum_variant,
    reason = "nearly every message is a Record; boxing it would add an allocation per call"
)]
pub(crate) enum Msg {
    /// Log one call (batched; its sender told of the commit when it waits for it).
    Record(QueuedRecord),
    /// Reply once everything sent before is written.
    Flush(oneshot::Sender<()>),
    /// While the log is failing: try the server with a one-row write, which clears
    /// [`Stats::failing`] when it succeeds.
    Probe,
    /// Write everything queued, reply, and stop.
    Close(oneshot::Sender<()>),
}

/// The most rows held in memory while the server cannot take writes: past it the oldest
/// are dropped, counted and logged.
const MAX_HELD: usize = 10_000;

/// How often held rows are tried again when nothing else comes.
const HELD_RETRY: Duration = Duration::from_secs(1);

/// Counters readable from the store.
pub(crate) use quiver_registry::log_writer::WriterCounters as Stats;

/// The writer's settings.
pub(crate) struct Config {
    pub(crate) location: String,
    pub(crate) batch_max: usize,
    pub(crate) linger: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) retry_backoff: Duration,
    /// Whether callers wait for their rows' commits
    /// ([`quiver_registry::log_writer::Durability::Strict`]): then rows are written as
    /// soon as the writer is free, without a linger, and those that come during a write
    /// share the next one.
    pub(crate) strict: bool,
}

struct Writer {
    pool: Pool,
    stats: Arc<Stats>,
    cfg: Config,
    /// Rows waiting for their commit.
    pending: Vec<QueuedRecord>,
}

impl Writer {
    /// Takes one message; a flush or a probe writes what is pending first. Returns the
    /// reply of a close.
    async fn handle(&mut self, msg: Msg) -> Option<oneshot::Sender<()>> {
        match msg {
            Msg::Record(r) => {
                self.pending.push(r);
                if self.pending.len() >= self.cfg.batch_max
                    && !self.stats.failing.load(Ordering::Relaxed)
                {
                    self.commit().await;
                }
            }
            Msg::Flush(reply) => {
                self.commit().await;
                let _ = reply.send(());
            }
            Msg::Probe => {
                self.stats.probe_queued.store(false, Ordering::Relaxed);
                self.commit().await;
                if self.stats.failing.load(Ordering::Relaxed) {
                    match self.probe().await {
                        Ok(()) => {
                            self.stats.failing.store(false, Ordering::Relaxed);
                            // At the level of the error it closes, so the all-clear is seen where the
                            // outage was.
                            tracing::warn!(location = %self.cfg.location, "the execution log takes writes again");
                        }
                        Err(e) => {
                            tracing::debug!(location = %self.cfg.location, error = %e, "the execution log still cannot be written");
                        }
                    }
                }
            }
            Msg::Close(reply) => return Some(reply),
        }
        None
    }

    /// A one-row write, to learn whether the server takes writes again.
    async fn probe(&self) -> Result<(), StoreError> {
        let loc = &self.cfg.location;
        let client = self.pool.get().await.at(loc)?;
        client
            .execute(
                "INSERT INTO quiver_meta (key, value) VALUES ('writer_probe', now()::text)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[],
            )
            .await
            .at(loc)?;
        Ok(())
    }

    /// Writes the pending rows, `batch_max` at a time, retrying a bounded number of times
    /// (once while the log is already failing: held rows are tried on the writer's timer).
    /// Rows the server cannot take for now stay pending, at most [`MAX_HELD`]; rows it
    /// refuses for good are counted and logged, never dropped in silence.
    async fn commit(&mut self) {
        while !self.pending.is_empty() {
            let n = self.pending.len().min(self.cfg.batch_max);
            if !self.commit_batch(n).await {
                return;
            }
        }
    }

    /// Writes the first `n` pending rows; whether they were written (or given up).
    async fn commit_batch(&mut self, n: usize) -> bool {
        let attempts = match self.stats.failing.load(Ordering::Relaxed) {
            true => 1,
            false => self.cfg.max_attempts,
        };
        let mut attempt = 1;
        loop {
            match copy_rows(&self.pool, &self.cfg.location, &self.pending[..n]).await {
                Ok(()) => {
                    let s = &self.stats;
                    s.rows_written.fetch_add(n as u64, Ordering::Relaxed);
                    s.batches_written.fetch_add(1, Ordering::Relaxed);
                    if s.failing.swap(false, Ordering::Relaxed) {
                        // At the level of the error it closes, so the all-clear is seen where the
                        // outage was.
                        tracing::warn!(location = %self.cfg.location, "the execution log takes writes again");
                    }
                    self.pending.drain(..n).for_each(QueuedRecord::done);
                    return true;
                }
                Err(err) => {
                    let loc = &self.cfg.location;
                    if attempt >= attempts && matches!(err, StoreError::Unavailable { .. }) {
                        let over = self.pending.len().saturating_sub(MAX_HELD);
                        if over > 0 {
                            self.pending.drain(..over);
                            tracing::error!(location = %loc, rows = over, error = %err, "more execution-log rows wait than are held: the oldest are lost");
                            self.stats.failed(over as u64, err.clone());
                        }
                        if attempts > 1 {
                            tracing::error!(location = %loc, rows = self.pending.len(), error = %err, "execution-log rows cannot be written now: held, and written once the server takes writes again");
                        }
                        self.stats.unavailable(err);
                        return false;
                    }
                    if attempt >= attempts {
                        tracing::error!(location = %loc, rows = n, attempts = attempt, error = %err, "execution-log rows could not be written and are lost");
                        self.stats.failed(n as u64, err);
                        self.pending.drain(..n);
                        return true;
                    }
                    tracing::warn!(location = %loc, attempt, error = %err, "execution-log write failed; retrying");
                    self.stats.write_retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(self.cfg.retry_backoff * attempt).await;
                    attempt += 1;
                }
            }
        }
    }
}

/// Copies `rows` into `execution_log` in one `COPY`, chained after the stored head, in one
/// transaction (all or none). The head row is locked for the transaction, so replicas
/// writing at once take turns and each batch follows the one committed before it.
async fn copy_rows(pool: &Pool, location: &str, rows: &[QueuedRecord]) -> Result<(), StoreError> {
    let entries: Vec<LogEntry<'_>> = rows.iter().map(|q| LogEntry::of(&q.record)).collect();
    let mut client = pool.get().await.at(location)?;
    let tx = client.transaction().await.at(location)?;
    append_chained(&tx, location, &entries).await?;
    tx.commit().await.at(location)?;
    Ok(())
}

/// Appends `entries` to the chain inside `tx`: locks and reads the head, copies the rows
/// with their links, stores checkpoints and the new head.
pub(crate) async fn append_chained(
    tx: &deadpool_postgres::Transaction<'_>,
    location: &str,
    entries: &[LogEntry<'_>],
) -> Result<(), StoreError> {
    if entries.is_empty() {
        return Ok(());
    }
    let head = tx
        .query_one(
            "SELECT seq, link FROM log_chain WHERE id = 1 FOR UPDATE",
            &[],
        )
        .await
        .at(location)?;
    let stored: Vec<u8> = head.get(1);
    let head = ChainPoint {
        seq: u64::try_from(head.get::<_, i64>(0)).unwrap_or(0),
        link: chain::link_as_stored(&stored),
    };
    let points = chain::extend(head, entries);
    let stmt = tx.prepare_cached(COPY_LOG).await.at(location)?;
    let sink = tx.copy_in(&stmt).await.at(location)?;
    let writer = BinaryCopyInWriter::new(sink, &LOG_TYPES);
    pin_mut!(writer);
    for (e, p) in entries.iter().zip(&points) {
        let row = LogRow::of(e, p);
        writer
            .as_mut()
            .write(&row.values())
            .await
            .map_err(|e| classify(location, &e))?;
    }
    writer.finish().await.at(location)?;
    for p in points
        .iter()
        .filter(|p| p.seq.is_multiple_of(chain::CHECKPOINT_EVERY))
    {
        let seq = i64::try_from(p.seq).unwrap_or(i64::MAX);
        tx.execute(
            "INSERT INTO log_checkpoints (seq, link) VALUES ($1, $2)
             ON CONFLICT (seq) DO UPDATE SET link = excluded.link",
            &[&seq, &&p.link[..]],
        )
        .await
        .at(location)?;
    }
    if let Some(last) = points.last() {
        let seq = i64::try_from(last.seq).unwrap_or(i64::MAX);
        tx.execute(
            "UPDATE log_chain SET seq = $1, link = $2 WHERE id = 1",
            &[&seq, &&last.link[..]],
        )
        .await
        .at(location)?;
    }
    Ok(())
}

/// The writer task's body: runs until the channel closes (every sender gone, or a close),
/// writing what is left before it ends.
pub(crate) async fn run(pool: Pool, mut rx: mpsc::Receiver<Msg>, stats: Arc<Stats>, cfg: Config) {
    let mut w = Writer {
        pending: Vec::with_capacity(cfg.batch_max),
        pool,
        stats,
        cfg,
    };
    let mut closing: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        let first = if w.pending.is_empty() {
            rx.recv().await
        } else {
            // Rows are held (the server did not take them): try again on a timer, and with
            // whatever comes meanwhile.
            match tokio::time::timeout(HELD_RETRY, rx.recv()).await {
                Ok(m) => m,
                Err(_) => {
                    w.commit().await;
                    continue;
                }
            }
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        while let Some(msg) = next {
            if let Some(reply) = w.handle(msg).await {
                // Refuse new messages; those already queued are still taken.
                rx.close();
                closing.push(reply);
            }
            next = rx.try_recv().ok();
        }
        // Rows are waiting: let more come for a linger, so that calls share a batch.
        if !w.pending.is_empty()
            && closing.is_empty()
            && !w.cfg.strict
            && !w.cfg.linger.is_zero()
            && !w.stats.failing.load(Ordering::Relaxed)
        {
            tokio::time::sleep(w.cfg.linger).await;
            while let Ok(msg) = rx.try_recv() {
                if let Some(reply) = w.handle(msg).await {
                    rx.close();
                    closing.push(reply);
                }
            }
        }
        w.commit().await;
    }
    w.commit().await;
    if !w.pending.is_empty() {
        let held = w.pending.len();
        tracing::error!(location = %w.cfg.location, rows = held, "the store closes with execution-log rows it could not write: they are lost");
        w.stats
            .rows_failed
            .fetch_add(held as u64, Ordering::Relaxed);
    }
    for reply in closing {
        let _ = reply.send(());
    }
}
