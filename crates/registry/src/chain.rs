//! The execution log's hash chain: what makes it tamper-evident.
//!
//! Every row the log writers store gets a sequence number (`seq`, 1, 2, 3, … with no gaps)
//! and a link: SHA-256 over a version tag, the previous row's link, its own `seq` and its
//! content in stored form ([`LogEntry`], each field length-prefixed so no two contents hash
//! alike). A row changed behind Quiver's back no longer hashes to its link; a row removed
//! leaves a gap in `seq`; a row inserted without a link, or with a made-up one, breaks the
//! chain where it sits. The store keeps the chain's head (the last `seq` and link, updated in
//! the same transaction as the rows), so rows cut off the end show too, and checkpoints: one
//! every [`CHECKPOINT_EVERY`] rows, and one for the last row each retention purge removes,
//! which anchors the rows that remain.
//!
//! What the chain cannot show is a rewrite of the whole chain from some row on, head and
//! checkpoints included, by someone who runs this algorithm (it has no secret). Against that,
//! keep heads elsewhere: `quiver log --verify` prints the head, `--expect-head SEQ:HASH`
//! checks that a head recorded earlier is still part of the chain, and the JSON Lines export
//! carries every row's link to a SIEM.
//!
//! [`verify`] walks the chain through the [`CallLog`] port, so both store adapters are
//! checked by the same code.

use std::{borrow::Cow, fmt, time::SystemTime};

use quiver_contract::{ErrKind, HintKind};
use sha2::{Digest, Sha256};

use crate::{
    CallRecord,
    store::{CallLog, LoggedCall, StoreError, output_summary},
};

/// A link: SHA-256 of the previous link and one row.
pub type Link = [u8; 32];

/// The link before the first row.
pub const GENESIS: Link = [0; 32];

/// A checkpoint is stored every this many rows.
pub const CHECKPOINT_EVERY: u64 = 10_000;

/// What each link hashes first, so that a change of the row encoding is a new version.
const VERSION_TAG: &[u8] = b"quiver-log-chain/1\0";

/// A link as lower-case hex.
pub fn hex(link: &Link) -> String {
    use std::fmt::Write;
    link.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A link read from 64 hex digits.
pub fn parse_hex(text: &str) -> Option<Link> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut link = [0u8; 32];
    for (i, byte) in link.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(link)
}

/// Stored bytes read as a link whatever their length (cut or padded with zeros): a link
/// damaged behind Quiver's back is read, so the writers go on (no row is lost) and
/// verifying shows it as not matching, rather than the read failing.
pub fn link_as_stored(bytes: &[u8]) -> Link {
    let mut link = [0u8; 32];
    let n = bytes.len().min(32);
    link[..n].copy_from_slice(&bytes[..n]);
    link
}

/// A stored link as the 32 bytes it must be.
pub fn link_from_bytes(bytes: &[u8]) -> Result<Link, StoreError> {
    bytes.try_into().map_err(|_| {
        StoreError::invalid_data(format!(
            "a chain link of {} bytes (links are 32)",
            bytes.len()
        ))
    })
}

/// One execution-log row's content exactly as the stores keep it: texts as stored (the
/// arguments and the full output as JSON text), times in microseconds. Both store adapters
/// write these values and read them back, so the link computed when the row was written is
/// computed again from what is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry<'a> {
    /// The tool name as called.
    pub tool_name: Cow<'a, str>,
    /// The tenant.
    pub tenant: Option<Cow<'a, str>>,
    /// The session key.
    pub session: Option<Cow<'a, str>>,
    /// The inbound token's name.
    pub principal: Option<Cow<'a, str>>,
    /// The call id.
    pub call_id: Cow<'a, str>,
    /// The call this one was made from.
    pub parent_call_id: Option<Cow<'a, str>>,
    /// The arguments, as JSON text.
    pub input_data: Cow<'a, str>,
    /// The narration.
    pub reasoning: Option<Cow<'a, str>>,
    /// The arguments' hash.
    pub args_hash: Cow<'a, str>,
    /// `ok`, `hint` or `err`.
    pub kind: Cow<'a, str>,
    /// A Hint's kind.
    pub hint_kind: Option<Cow<'a, str>>,
    /// An Err's kind.
    pub err_kind: Option<Cow<'a, str>>,
    /// Whether the call succeeded.
    pub success: bool,
    /// A Hint's or an Err's message.
    pub error: Option<Cow<'a, str>>,
    /// The start of the rendered output.
    pub output_summary: Cow<'a, str>,
    /// The whole envelope, as JSON text.
    pub output: Cow<'a, str>,
    /// Microseconds queued.
    pub queued_us: i64,
    /// Microseconds from dispatch to result.
    pub took_us: i64,
    /// When the call was dispatched, in microseconds since the Unix epoch.
    pub created_at_us: i64,
    /// The OpenTelemetry trace id. Hashed after every other field, and only when present, so
    /// a row without one links as rows did before the field existed.
    pub trace_id: Option<Cow<'a, str>>,
}

/// Microseconds since the Unix epoch (0 before it; saturating).
pub fn epoch_micros(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl<'a> LogEntry<'a> {
    /// The stored form of `r`.
    pub fn of(r: &'a CallRecord) -> Self {
        let env = &r.envelope;
        let output = serde_json::to_string(env)
            .unwrap_or_else(|e| serde_json::json!({ "unserializable": e.to_string() }).to_string());
        LogEntry {
            tool_name: Cow::Borrowed(&r.tool_name),
            tenant: r.tenant.as_deref().map(Cow::Borrowed),
            session: r.session.as_deref().map(Cow::Borrowed),
            principal: r.principal.as_deref().map(Cow::Borrowed),
            call_id: Cow::Borrowed(&r.call_id),
            parent_call_id: r.parent_call_id.as_deref().map(Cow::Borrowed),
            input_data: Cow::Owned(r.input.to_string()),
            reasoning: r.reasoning.as_deref().map(Cow::Borrowed),
            args_hash: Cow::Borrowed(&r.args_hash),
            kind: Cow::Borrowed(env.kind_str()),
            hint_kind: env.hint_kind().map(|k| Cow::Borrowed(HintKind::as_str(k))),
            err_kind: env.err_kind().map(|k| Cow::Borrowed(ErrKind::as_str(k))),
            success: env.is_ok(),
            error: env.message().map(Cow::Borrowed),
            output_summary: Cow::Owned(output_summary(env)),
            output: Cow::Owned(output),
            queued_us: micros(r.queued),
            took_us: micros(r.took),
            created_at_us: epoch_micros(r.at),
            trace_id: r.trace_id.as_deref().map(Cow::Borrowed),
        }
    }

    /// The stored form of a row read back from another store (what `quiver store migrate`
    /// copies): its full output as JSON text, `null` when the row has none.
    pub fn of_logged(c: &'a LoggedCall) -> Self {
        LogEntry {
            tool_name: Cow::Borrowed(&c.tool_name),
            tenant: c.tenant.as_deref().map(Cow::Borrowed),
            session: c.session.as_deref().map(Cow::Borrowed),
            principal: c.principal.as_deref().map(Cow::Borrowed),
            call_id: Cow::Borrowed(&c.call_id),
            parent_call_id: c.parent_call_id.as_deref().map(Cow::Borrowed),
            input_data: Cow::Owned(c.input.to_string()),
            reasoning: c.reasoning.as_deref().map(Cow::Borrowed),
            args_hash: Cow::Borrowed(&c.args_hash),
            kind: Cow::Borrowed(&c.kind),
            hint_kind: c.hint_kind.map(|k| Cow::Borrowed(HintKind::as_str(k))),
            err_kind: c
                .err_kind
                .as_ref()
                .map(|k| Cow::Borrowed(ErrKind::as_str(k))),
            success: c.success,
            error: c.error.as_deref().map(Cow::Borrowed),
            output_summary: Cow::Borrowed(&c.output_summary),
            output: Cow::Owned(
                c.output
                    .as_ref()
                    .and_then(|o| serde_json::to_string(o).ok())
                    .unwrap_or_else(|| "null".to_owned()),
            ),
            queued_us: micros(c.queued),
            took_us: micros(c.took),
            created_at_us: epoch_micros(c.at),
            trace_id: c.trace_id.as_deref().map(Cow::Borrowed),
        }
    }

    /// The same entry owning its texts, as a store reads one back.
    pub fn into_owned(self) -> LogEntry<'static> {
        fn o(c: Cow<'_, str>) -> Cow<'static, str> {
            Cow::Owned(c.into_owned())
        }
        fn oo(c: Option<Cow<'_, str>>) -> Option<Cow<'static, str>> {
            c.map(o)
        }
        LogEntry {
            tool_name: o(self.tool_name),
            tenant: oo(self.tenant),
            session: oo(self.session),
            principal: oo(self.principal),
            call_id: o(self.call_id),
            parent_call_id: oo(self.parent_call_id),
            input_data: o(self.input_data),
            reasoning: oo(self.reasoning),
            args_hash: o(self.args_hash),
            kind: o(self.kind),
            hint_kind: oo(self.hint_kind),
            err_kind: oo(self.err_kind),
            success: self.success,
            error: oo(self.error),
            output_summary: o(self.output_summary),
            output: o(self.output),
            queued_us: self.queued_us,
            took_us: self.took_us,
            created_at_us: self.created_at_us,
            trace_id: oo(self.trace_id),
        }
    }

    /// This row's link, as row `seq` after `prev`.
    pub fn link(&self, seq: u64, prev: &Link) -> Link {
        let mut h = Sha256::new();
        h.update(VERSION_TAG);
        h.update(prev);
        h.update(seq.to_le_bytes());
        let text = |h: &mut Sha256, s: &str| {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        };
        let opt = |h: &mut Sha256, s: &Option<Cow<'_, str>>| match s {
            None => h.update([0u8]),
            Some(s) => {
                h.update([1u8]);
                text(h, s);
            }
        };
        text(&mut h, &self.tool_name);
        opt(&mut h, &self.tenant);
        opt(&mut h, &self.session);
        opt(&mut h, &self.principal);
        text(&mut h, &self.call_id);
        opt(&mut h, &self.parent_call_id);
        text(&mut h, &self.input_data);
        opt(&mut h, &self.reasoning);
        text(&mut h, &self.args_hash);
        text(&mut h, &self.kind);
        opt(&mut h, &self.hint_kind);
        opt(&mut h, &self.err_kind);
        h.update([u8::from(self.success)]);
        opt(&mut h, &self.error);
        text(&mut h, &self.output_summary);
        text(&mut h, &self.output);
        h.update(self.queued_us.to_le_bytes());
        h.update(self.took_us.to_le_bytes());
        h.update(self.created_at_us.to_le_bytes());
        if let Some(trace) = &self.trace_id {
            h.update(b"trace");
            text(&mut h, trace);
        }
        h.finalize().into()
    }
}

/// A point of the chain: a row's `seq` and link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainPoint {
    /// The row's sequence number.
    pub seq: u64,
    /// Its link.
    pub link: Link,
}

impl ChainPoint {
    /// The point before the first row.
    pub const START: ChainPoint = ChainPoint {
        seq: 0,
        link: GENESIS,
    };

    /// `SEQ:HASH`, as `quiver log --verify` prints a head.
    pub fn parse(text: &str) -> Option<ChainPoint> {
        let (seq, link) = text.trim().split_once(':')?;
        Some(ChainPoint {
            seq: seq.parse().ok()?,
            link: parse_hex(link)?,
        })
    }
}

impl fmt::Display for ChainPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.seq, hex(&self.link))
    }
}

/// The links of `entries`, written in order after `head`; returns each row's point.
pub fn extend(head: ChainPoint, entries: &[LogEntry<'_>]) -> Vec<ChainPoint> {
    let mut prev = head;
    entries
        .iter()
        .map(|e| {
            let seq = prev.seq + 1;
            prev = ChainPoint {
                seq,
                link: e.link(seq, &prev.link),
            };
            prev
        })
        .collect()
}

/// A chained row read back: where it is stored, its point and its content.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChainedRow {
    /// The row's id in the store (what SQL behind Quiver's back would name).
    pub id: i64,
    /// Its point: `seq` and the link stored with it.
    pub point: ChainPoint,
    /// Its content as stored.
    pub entry: LogEntry<'static>,
}

impl ChainedRow {
    /// A row read back.
    pub fn new(id: i64, point: ChainPoint, entry: LogEntry<'static>) -> Self {
        ChainedRow { id, point, entry }
    }
}

/// What the store keeps about the chain besides its rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChainState {
    /// The head the writers last stored (`None`: no row was ever chained).
    pub head: Option<ChainPoint>,
    /// The checkpoints, by `seq`.
    pub checkpoints: Vec<ChainPoint>,
    /// Rows without a link stored after the first chained row (ids, at most 10): rows
    /// inserted behind Quiver's back.
    pub unchained: Vec<i64>,
    /// How many such rows there are.
    pub unchained_count: u64,
    /// Rows without a link stored before the first chained row: written by a Quiver older
    /// than the chain, which the chain does not cover.
    pub older_rows: u64,
}

/// One way the chain is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tamper {
    /// The row does not hash to its link: changed behind Quiver's back, or inserted with a
    /// link Quiver did not write.
    Changed {
        /// The row's `seq`.
        seq: u64,
        /// Its id in the store.
        id: i64,
        /// Its call id, as stored now.
        call_id: String,
    },
    /// Rows `from..=to` are missing.
    Removed {
        /// The first missing `seq`.
        from: u64,
        /// The last missing `seq`.
        to: u64,
    },
    /// A row with no link sits among the chained rows.
    Inserted {
        /// Its id in the store.
        id: i64,
    },
    /// Rows follow the stored head: added behind Quiver's back.
    PastHead {
        /// The head's `seq`.
        head: u64,
        /// The last row's `seq`.
        last: u64,
    },
    /// The stored head's link is not the last row's: the chain was rewritten.
    HeadMismatch {
        /// The head's `seq`.
        seq: u64,
    },
    /// The rows end before the stored head: the last rows were removed.
    TailRemoved {
        /// The last row's `seq` (0: none).
        last: u64,
        /// The head's `seq`.
        head: u64,
    },
    /// A checkpoint's link is not the link of the row at its `seq`.
    CheckpointMismatch {
        /// The checkpoint's `seq`.
        seq: u64,
    },
    /// The rows before the first one left were removed with no checkpoint that a
    /// retention purge would have stored.
    StartRemoved {
        /// The first `seq` left.
        first: u64,
    },
    /// A head recorded elsewhere (`--expect-head`) is not part of the chain.
    ExpectedHeadMissing {
        /// The head given.
        expected: ChainPoint,
    },
}

impl fmt::Display for Tamper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tamper::Changed { seq, id, call_id } => write!(
                f,
                "row {seq} (id {id}, call {call_id}) does not hash to its link: it was changed, or inserted with a link Quiver did not write"
            ),
            Tamper::Removed { from, to } if from == to => write!(f, "row {from} was removed"),
            Tamper::Removed { from, to } => write!(f, "rows {from} to {to} were removed"),
            Tamper::Inserted { id } => write!(
                f,
                "row id {id} was inserted: it has no link, and every row Quiver writes has one"
            ),
            Tamper::PastHead { head, last } => write!(
                f,
                "rows {} to {last} were added after the stored head (row {head}) behind Quiver's back",
                head + 1
            ),
            Tamper::HeadMismatch { seq } => write!(
                f,
                "the stored head's link is not row {seq}'s: the chain was rewritten"
            ),
            Tamper::TailRemoved { last, head } if last + 1 == *head => write!(
                f,
                "row {head} was removed from the end: the stored head is row {head}"
            ),
            Tamper::TailRemoved { last, head } => write!(
                f,
                "rows {} to {head} were removed from the end: the stored head is row {head}",
                last + 1
            ),
            Tamper::CheckpointMismatch { seq } => write!(
                f,
                "the checkpoint at row {seq} does not match the row: the chain was rewritten from there on"
            ),
            Tamper::StartRemoved { first } => write!(
                f,
                "rows 1 to {} were removed with no retention checkpoint: removed behind Quiver's back",
                first - 1
            ),
            Tamper::ExpectedHeadMissing { expected } => write!(
                f,
                "the head recorded earlier ({expected}) is not in the chain: the chain was rewritten or cut before it"
            ),
        }
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Chained rows read: every row of the chain, however many problems there are.
    pub rows: u64,
    /// The first and last `seq` read.
    pub span: Option<(u64, u64)>,
    /// The last row's point (what to record elsewhere).
    pub last: Option<ChainPoint>,
    /// Rows older than the chain.
    pub older_rows: u64,
    /// Checkpoints checked against their rows.
    pub checkpoints_checked: usize,
    /// What is broken, in chain order (the first is where the tampering starts): the first
    /// [`MAX_PROBLEMS`] of [`VerifyReport::problems_found`].
    pub problems: Vec<Tamper>,
    /// How many problems the walk found in all.
    pub problems_found: u64,
}

impl VerifyReport {
    /// Whether the chain is whole.
    pub fn intact(&self) -> bool {
        self.problems.is_empty()
    }

    /// How many problems were found but not listed in [`VerifyReport::problems`].
    pub fn problems_unlisted(&self) -> u64 {
        self.problems_found
            .saturating_sub(self.problems.len() as u64)
    }
}

/// Rows read per page while verifying.
const VERIFY_PAGE: usize = 2_000;

/// The most problems a report lists (past the first, the rest usually follow from it); the
/// walk goes on to the end and counts the others.
pub const MAX_PROBLEMS: usize = 50;

/// The problems a walk finds: the first [`MAX_PROBLEMS`] kept, all counted.
#[derive(Default)]
struct Problems {
    listed: Vec<Tamper>,
    found: u64,
}

impl Problems {
    fn push(&mut self, problem: Tamper) {
        self.found += 1;
        if self.listed.len() < MAX_PROBLEMS {
            self.listed.push(problem);
        }
    }
}

/// Walks the whole chain of `log`: every row's link recomputed from its stored content, the
/// `seq` run checked for gaps, the ends checked against the retention checkpoint and the
/// stored head, every checkpoint against its row, and (when given) `expected` found in it.
///
/// The store may be written while it walks (a server taking calls). The head is read before
/// the rows, so every row up to it is there to be read; rows past it were committed since
/// and are checked like the rest: they must chain on from the head, and a head read after
/// the walk must cover them (writers store rows and head in one transaction). Only rows
/// past that second head were added behind Quiver's back.
pub async fn verify(
    log: &dyn CallLog,
    expected: Option<ChainPoint>,
) -> Result<VerifyReport, StoreError> {
    let state = log.chain_state().await?;
    let mut report = VerifyReport {
        older_rows: state.older_rows,
        ..VerifyReport::default()
    };
    let mut problems = Problems::default();
    let mut checkpoints: std::collections::BTreeMap<u64, Link> =
        state.checkpoints.iter().map(|c| (c.seq, c.link)).collect();
    // A purge may run during the walk and anchor the rows left with a checkpoint newer than
    // the state read first: read the checkpoints again once before calling a start removed.
    let mut checkpoints_reread = false;
    let head_seq = state.head.map(|h| h.seq);
    // The link of the row at the head read first, to check the head against.
    let mut at_head: Option<Link> = None;
    let mut prev: Option<ChainPoint> = None;
    let mut expected_found = expected.is_none_or(|e| e.seq == 0 && e.link == GENESIS);
    let mut after = 0u64;
    loop {
        let page = log.chain_rows(after, None, VERIFY_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.point.seq;
        for row in &page {
            let seq = row.point.seq;
            let before = match prev {
                Some(p) => p,
                None => {
                    // The first row left: row 1, or anchored by a purge's checkpoint.
                    let anchor = |checkpoints: &std::collections::BTreeMap<u64, Link>| {
                        if seq == 1 {
                            Some(ChainPoint::START)
                        } else {
                            checkpoints
                                .get(&(seq - 1))
                                .map(|&link| ChainPoint { seq: seq - 1, link })
                        }
                    };
                    let mut found = anchor(&checkpoints);
                    if found.is_none() && !checkpoints_reread {
                        checkpoints_reread = true;
                        let now = log.chain_state().await?;
                        checkpoints.extend(now.checkpoints.iter().map(|c| (c.seq, c.link)));
                        found = anchor(&checkpoints);
                    }
                    match found {
                        Some(a) => a,
                        None => {
                            problems.push(Tamper::StartRemoved { first: seq });
                            // Go on from this row as it claims to be.
                            prev = Some(row.point);
                            if head_seq == Some(seq) {
                                at_head = Some(row.point.link);
                            }
                            report.rows += 1;
                            report.span = Some((seq, seq));
                            continue;
                        }
                    }
                }
            };
            if seq > before.seq + 1 {
                // The link this row was made with is the removed row's, which is gone: it
                // cannot be checked.
                problems.push(Tamper::Removed {
                    from: before.seq + 1,
                    to: seq - 1,
                });
            } else if row.entry.link(seq, &before.link) != row.point.link {
                problems.push(Tamper::Changed {
                    seq,
                    id: row.id,
                    call_id: row.entry.call_id.to_string(),
                });
            }
            if let Some(link) = checkpoints.get(&seq)
                && *link != row.point.link
            {
                problems.push(Tamper::CheckpointMismatch { seq });
            }
            if let Some(e) = expected
                && e.seq == seq
                && e.link == row.point.link
            {
                expected_found = true;
            }
            if head_seq == Some(seq) {
                at_head = Some(row.point.link);
            }
            report.rows += 1;
            report.span = Some((report.span.map_or(seq, |s| s.0), seq));
            // The stored link carries the chain on, so one changed row is reported once,
            // not as a break of every row after it.
            prev = Some(row.point);
        }
    }
    report.checkpoints_checked = checkpoints
        .keys()
        .filter(|&&s| report.span.is_some_and(|(a, b)| (a..=b).contains(&s)))
        .count();
    for id in &state.unchained {
        problems.push(Tamper::Inserted { id: *id });
    }
    let last_seq = prev.map_or(0, |p| p.seq);
    if let Some(head) = state.head {
        if head.seq > last_seq {
            problems.push(Tamper::TailRemoved {
                last: last_seq,
                head: head.seq,
            });
        } else {
            if at_head.is_some_and(|link| link != head.link) {
                problems.push(Tamper::HeadMismatch { seq: head.seq });
            }
            if head.seq < last_seq {
                // Rows past the head read first: committed since, if a head read now
                // covers them.
                match log.chain_state().await?.head {
                    Some(now) if now.seq >= last_seq => {
                        if now.seq == last_seq && prev.is_some_and(|p| p.link != now.link) {
                            problems.push(Tamper::HeadMismatch { seq: now.seq });
                        }
                    }
                    now => problems.push(Tamper::PastHead {
                        head: now.map_or(head.seq, |h| h.seq),
                        last: last_seq,
                    }),
                }
            }
        }
    }
    if !expected_found && let Some(e) = expected {
        problems.push(Tamper::ExpectedHeadMissing { expected: e });
    }
    report.last = prev;
    report.problems = problems.listed;
    report.problems_found = problems.found;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use quiver_contract::Envelope;
    use serde_json::json;

    use super::*;
    use crate::{ToolCallRecorder, store::MemoryCallLog};

    async fn log_of(n: u64) -> MemoryCallLog {
        let log = MemoryCallLog::new();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for i in 1..=n {
            log.record(
                CallRecord::new(
                    "t",
                    format!("c{i}"),
                    json!({ "i": i }),
                    Envelope::text("ok"),
                )
                .with_at(t0 + Duration::from_secs(i)),
            )
            .await;
        }
        log
    }

    #[test]
    fn heads_print_and_parse_back() {
        let p = ChainPoint {
            seq: 42,
            link: [0xab; 32],
        };
        assert_eq!(ChainPoint::parse(&p.to_string()), Some(p));
        for bad in [
            "",
            "42",
            "x:ab",
            "42:abc",
            &format!("42:{}", "g".repeat(64)),
        ] {
            assert_eq!(ChainPoint::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_link_covers_every_field_and_its_place() {
        let r = CallRecord::new("t", "c", json!({}), Envelope::text("ok"));
        let e = LogEntry::of(&r);
        let base = e.link(1, &GENESIS);
        assert_ne!(base, e.link(2, &GENESIS));
        assert_ne!(base, e.link(1, &[1; 32]));
        let changes: [&dyn Fn(&mut LogEntry<'_>); 6] = [
            &|e| e.tenant = Some(Cow::Borrowed("")),
            &|e| e.reasoning = Some(Cow::Borrowed("why")),
            &|e| e.success = !e.success,
            &|e| e.output.to_mut().push(' '),
            &|e| e.took_us += 1,
            // Moving text between two fields changes the link too (lengths are hashed).
            &|e| {
                e.tool_name = Cow::Borrowed("tc");
                e.call_id = Cow::Borrowed("");
            },
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut changed = e.clone();
            change(&mut changed);
            assert_ne!(changed.link(1, &GENESIS), base, "change {i}");
        }
    }

    #[tokio::test]
    async fn verify_names_a_changed_row_a_removed_start_and_a_purged_start_apart() {
        let log = log_of(5).await;
        assert!(verify(&log, None).await.unwrap().intact());
        assert!(log.tamper_with(3, |e| e.input_data = Cow::Borrowed("{}")));
        let found = verify(&log, None).await.unwrap().problems;
        assert!(
            matches!(found.as_slice(), [Tamper::Changed { seq: 3, .. }]),
            "{found:?}"
        );

        let log = log_of(5).await;
        log.remove(1);
        assert_eq!(
            verify(&log, None).await.unwrap().problems,
            [Tamper::StartRemoved { first: 2 }]
        );

        // A purge leaves its checkpoint: the rest is anchored.
        let log = log_of(5).await;
        let cutoff = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_003);
        assert_eq!(log.purge_calls_before(cutoff).await.unwrap(), 2);
        let report = verify(&log, None).await.unwrap();
        assert!(report.intact(), "{:?}", report.problems);
        assert_eq!(report.span, Some((3, 5)));
    }

    #[tokio::test]
    async fn rows_past_the_stored_head_are_found() {
        let log = log_of(5).await;
        log.rewind_head(3);
        assert_eq!(
            verify(&log, None).await.unwrap().problems,
            [Tamper::PastHead { head: 3, last: 5 }]
        );
    }

    /// A walk goes to the end of the chain however many problems it finds: it counts every
    /// row and every problem, and lists the first [`MAX_PROBLEMS`].
    #[tokio::test]
    async fn a_badly_broken_chain_is_walked_to_its_end_and_its_problems_counted() {
        let rows = VERIFY_PAGE as u64 + 100;
        let log = log_of(rows).await;
        let changed = MAX_PROBLEMS as u64 + 10;
        for seq in 1..=changed {
            assert!(log.tamper_with(seq, |e| e.input_data = Cow::Borrowed("{}")));
        }
        let report = verify(&log, None).await.unwrap();
        assert_eq!((report.rows, report.span), (rows, Some((1, rows))));
        assert_eq!(report.problems.len(), MAX_PROBLEMS);
        assert_eq!(
            (report.problems_found, report.problems_unlisted()),
            (changed, 10)
        );
    }
}
