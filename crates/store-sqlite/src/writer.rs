//! The one writer: a dedicated thread that owns the read-write connection, takes messages from
//! a bounded channel, commits call records in batched transactions, and runs every other
//! write as its own transaction, in arrival order.

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, SystemTime},
};

use quiver_registry::chain::{self, ChainPoint, LogEntry};
use quiver_registry::{log_writer::QueuedRecord, store::StoreError};
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::{
    convert::{INSERT_LOG, INSERT_OUTPUT, insert_call, micros},
    schema::{Holders, leave},
    sync::lock,
};

/// A write to run on the writer connection.
pub(crate) type Op = Box<dyn FnOnce(&mut Connection) + Send>;

/// What the writer thread is asked to do.
#[expect(
    clippy::large_enum_variant,
    reason = "nearly every message is a Record; boxing it would add an allocation per call"
)]
pub(crate) enum Msg {
    /// Log one call (batched; its sender told of the commit when it waits for it).
    Record(QueuedRecord),
    /// Reply once everything sent before is committed.
    Flush(oneshot::Sender<()>),
    /// While the log is failing: try the database with a one-row write, which clears
    /// [`Stats::failing`] when it succeeds.
    Probe,
    /// Run one write.
    Op(Op),
    /// Commit everything queued, mark a clean shutdown, reply, and stop.
    Close(oneshot::Sender<Result<(), StoreError>>),
}

/// The most rows held in memory while the database cannot take writes (locked, read-only,
/// full): past it the oldest are dropped, counted and logged.
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
    /// ([`quiver_registry::log_writer::Durability::Strict`]): then rows are committed as
    /// soon as the writer is free, without a linger, and those that come during a commit
    /// share the next one.
    pub(crate) strict: bool,
}

/// The writer thread's state: its connection and channel, and what it holds between
/// messages.
struct Writer {
    conn: Connection,
    rx: mpsc::Receiver<Msg>,
    stats: Arc<Stats>,
    cfg: Config,
    /// Rows waiting for their commit.
    pending: Vec<QueuedRecord>,
    /// Set by `Close`: where to answer once everything queued is written.
    closing: Option<oneshot::Sender<Result<(), StoreError>>>,
}

impl Writer {
    fn commit(&mut self) {
        commit(&mut self.conn, &mut self.pending, &self.stats, &self.cfg);
    }

    /// Takes one message: a row joins the pending batch (committed at `batch_max`); a
    /// flush, an operation or a close commits what is pending first.
    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Record(r) => {
                self.pending.push(r);
                // While rows are held, the held loop tries them on its timer: a commit per
                // new row would wait out the lock (busy_timeout) for each.
                if self.pending.len() >= self.cfg.batch_max
                    && !self.stats.failing.load(Ordering::Relaxed)
                {
                    self.commit();
                }
            }
            Msg::Flush(reply) => {
                self.commit();
                let _ = reply.send(());
            }
            Msg::Probe => {
                self.stats.probe_queued.store(false, Ordering::Relaxed);
                self.commit();
                if self.stats.failing.load(Ordering::Relaxed) {
                    // A real commit (not just a lock): a full disk shows only when pages are
                    // written.
                    match mark_probe(&self.conn, micros(SystemTime::now())) {
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
            Msg::Op(op) => {
                self.commit();
                op(&mut self.conn);
            }
            Msg::Close(reply) => {
                // Refuse new messages; those already queued are still drained.
                self.rx.close();
                self.closing = Some(reply);
            }
        }
    }

    /// Handles `first` and every message queued behind it.
    fn drain(&mut self, first: Msg) {
        let mut next = Some(first);
        while let Some(msg) = next {
            self.handle(msg);
            next = self.rx.try_recv().ok();
        }
    }
}

/// The writer thread's body.
pub(crate) fn run(
    conn: Connection,
    rx: mpsc::Receiver<Msg>,
    stats: Arc<Stats>,
    cfg: Config,
    holders: Holders,
) {
    let mut w = Writer {
        pending: Vec::with_capacity(cfg.batch_max),
        conn,
        rx,
        stats,
        cfg,
        closing: None,
    };
    while let Some(first) = w.rx.blocking_recv() {
        w.drain(first);
        while !w.pending.is_empty()
            && w.closing.is_none()
            && !w.cfg.strict
            && !w.cfg.linger.is_zero()
        {
            // Rows are waiting: let more queue up for a linger without each one waking this
            // thread; those that came meanwhile join the same commit. The thread parks on the
            // channel again only when nothing is queued after a commit.
            std::thread::sleep(w.cfg.linger);
            let Ok(next) = w.rx.try_recv() else { break };
            w.drain(next);
            w.commit();
        }
        w.commit();
        // Rows the database could not take (a lock held elsewhere, a full disk) are held
        // and tried again every HELD_RETRY, and with whatever comes meanwhile, until they
        // are written: a lock held for a while must not cost the audit log its rows.
        while !w.pending.is_empty() && w.closing.is_none() {
            std::thread::sleep(HELD_RETRY);
            while let Ok(next) = w.rx.try_recv() {
                w.handle(next);
            }
            w.commit();
        }
        // After Close the channel refuses new messages; `blocking_recv` still returns every
        // one already sent (also by a sender that had reserved its slot) and then `None`.
    }
    w.commit();
    if !w.pending.is_empty() {
        let held = w.pending.len();
        tracing::error!(location = %w.cfg.location, rows = held, "the store closes with execution-log rows it could not write: they are lost");
        let err = lock(&w.stats.last_error).clone();
        w.stats
            .rows_failed
            .fetch_add(held as u64, Ordering::Relaxed);
        if let Some(err) = err {
            w.stats.failed(0, err);
        }
        w.pending.clear();
    }
    let Writer {
        conn, cfg, closing, ..
    } = w;
    // Only the last process out marks the database clean (see `Holders`).
    let result = leave(&conn, &cfg.location, &holders, micros(SystemTime::now()));
    if let Err(e) = &result {
        tracing::error!(location = %cfg.location, error = %e, "could not mark a clean shutdown");
    }
    if let Some(reply) = closing {
        let _ = reply.send(result);
    }
    if let Err((_, e)) = conn.close() {
        tracing::error!(location = %cfg.location, error = %e, "closing the writer connection");
    }
}

/// Commits the pending records in one transaction, retrying a bounded number of times (once
/// while the log is already failing: held rows are tried on the writer's timer). Rows the
/// database cannot take for now (locked, read-only, full, an I/O error) stay pending, at
/// most [`MAX_HELD`]; rows it refuses for good are counted and logged, never dropped in
/// silence.
fn commit(conn: &mut Connection, pending: &mut Vec<QueuedRecord>, stats: &Stats, cfg: &Config) {
    if pending.is_empty() {
        return;
    }
    let attempts = match stats.failing.load(Ordering::Relaxed) {
        true => 1,
        false => cfg.max_attempts,
    };
    let mut attempt = 1;
    loop {
        match insert_batch(conn, pending) {
            Ok(()) => {
                stats
                    .rows_written
                    .fetch_add(pending.len() as u64, Ordering::Relaxed);
                stats.batches_written.fetch_add(1, Ordering::Relaxed);
                stats.failing.store(false, Ordering::Relaxed);
                pending.drain(..).for_each(QueuedRecord::done);
                return;
            }
            Err(e) => {
                let err = crate::error::classify(&cfg.location, &e);
                if attempt >= attempts && matches!(err, StoreError::Unavailable { .. }) {
                    let over = pending.len().saturating_sub(MAX_HELD);
                    if over > 0 {
                        pending.drain(..over);
                        tracing::error!(location = %cfg.location, rows = over, error = %err, "more execution-log rows wait than are held: the oldest are lost");
                        stats.failed(over as u64, err.clone());
                    }
                    if attempts > 1 {
                        tracing::error!(location = %cfg.location, rows = pending.len(), error = %err, "execution-log rows cannot be written now: held, and written once the database takes writes again");
                    }
                    stats.unavailable(err);
                    return;
                }
                if attempt >= attempts {
                    tracing::error!(
                        location = %cfg.location,
                        rows = pending.len(),
                        attempts = attempt,
                        error = %err,
                        "execution-log rows could not be written and are lost"
                    );
                    stats.failed(pending.len() as u64, err);
                    pending.clear();
                    return;
                }
                tracing::warn!(location = %cfg.location, attempt, error = %err, "execution-log write failed; retrying");
                stats.write_retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(cfg.retry_backoff * attempt);
                attempt += 1;
            }
        }
    }
}

/// The writer's probe: one row of `quiver_meta` written.
fn mark_probe(conn: &Connection, now_us: i64) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO quiver_meta (key, value) VALUES ('writer_probe', ?1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        rusqlite::params![now_us.to_string()],
    )
    .map(|_| ())
}

/// One transaction for `rows`, chained after the stored head; a batch that fails part-way
/// is rolled back when `tx` drops. The transaction takes the write lock at its start
/// (`IMMEDIATE`), so the head it reads is the one its rows follow, whichever process wrote
/// last.
fn insert_batch(conn: &mut Connection, rows: &[QueuedRecord]) -> rusqlite::Result<()> {
    let entries: Vec<LogEntry<'_>> = rows.iter().map(|q| LogEntry::of(&q.record)).collect();
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let head: ChainPoint =
        tx.query_row("SELECT seq, link FROM log_chain WHERE id = 1", [], |r| {
            let seq: i64 = r.get(0)?;
            let stored: Vec<u8> = r.get(1)?;
            Ok(ChainPoint {
                seq: u64::try_from(seq).unwrap_or(0),
                link: chain::link_as_stored(&stored),
            })
        })?;
    let points = chain::extend(head, &entries);
    {
        let mut log = tx.prepare_cached(INSERT_LOG)?;
        let mut output = tx.prepare_cached(INSERT_OUTPUT)?;
        let mut checkpoint = tx
            .prepare_cached("INSERT OR REPLACE INTO log_checkpoints (seq, link) VALUES (?1, ?2)")?;
        for (e, &p) in entries.iter().zip(&points) {
            insert_call(&mut log, &mut output, &tx, e, p)?;
            if p.seq.is_multiple_of(chain::CHECKPOINT_EVERY) {
                checkpoint.execute(rusqlite::params![seq_sql(p.seq), &p.link[..]])?;
            }
        }
    }
    if let Some(last) = points.last() {
        tx.execute(
            "UPDATE log_chain SET seq = ?1, link = ?2 WHERE id = 1",
            rusqlite::params![seq_sql(last.seq), &last.link[..]],
        )?;
    }
    tx.commit()
}

/// A `seq` as SQLite's integer.
fn seq_sql(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}
