//! The execution log's hash chain in SQLite (`quiver_registry::chain`): retention purges
//! that keep it anchored, and its rows and state read back for verifying and exporting. The
//! writer (`writer.rs`) extends it.

use std::time::SystemTime;

use quiver_registry::{
    chain::{ChainPoint, ChainState, ChainedRow},
    store::StoreError,
};
use rusqlite::{Connection, params};

use crate::{
    convert::{self, CHAIN_COLUMNS, micros},
    error::ResultExt,
    store::{PURGE_BATCH, query},
};

/// The schema version that added the hash chain.
const CHAIN_VERSION: u32 = 6;

/// Deletes one batch of calls dispatched before `cutoff`: chained rows from the start of
/// the chain up to the first one that is not (recording the last deleted as the checkpoint
/// that anchors the rest), then rows older than the chain. Returns how many it deleted and
/// whether more may be left.
pub(crate) fn purge_batch(
    tx: &rusqlite::Transaction<'_>,
    loc: &str,
    cutoff: i64,
) -> Result<(u64, bool), StoreError> {
    let int = |r: &rusqlite::Row<'_>, i| {
        r.get::<_, i64>(i)
            .map_err(|e| StoreError::invalid_data(e.to_string()))
    };
    let head = query(
        tx,
        loc,
        "SELECT id, chain_seq, chain_link, created_at FROM execution_log
         WHERE chain_seq IS NOT NULL ORDER BY chain_seq LIMIT ?1",
        params![PURGE_BATCH],
        |r| {
            let link: Vec<u8> = r
                .get(2)
                .map_err(|e| StoreError::invalid_data(e.to_string()))?;
            Ok((int(r, 0)?, int(r, 1)?, link, int(r, 3)?))
        },
    )?;
    let fetched = head.len();
    let chained: Vec<_> = head.into_iter().take_while(|r| r.3 < cutoff).collect();
    let chained_more = chained.len() == fetched && fetched == PURGE_BATCH as usize;
    let older = query(
        tx,
        loc,
        "SELECT id FROM execution_log WHERE chain_seq IS NULL AND created_at < ?1
         ORDER BY created_at LIMIT ?2",
        params![cutoff, PURGE_BATCH],
        |r| int(r, 0),
    )?;
    let mut del_log = tx
        .prepare_cached("DELETE FROM execution_log WHERE id = ?1")
        .at(loc)?;
    let mut del_out = tx
        .prepare_cached("DELETE FROM execution_output WHERE log_id = ?1")
        .at(loc)?;
    for id in chained.iter().map(|r| r.0).chain(older.iter().copied()) {
        del_log.execute([id]).at(loc)?;
        del_out.execute([id]).at(loc)?;
    }
    if let Some((_, seq, link, _)) = chained.last() {
        tx.execute(
            "INSERT OR REPLACE INTO log_checkpoints (seq, link) VALUES (?1, ?2)",
            params![seq, link],
        )
        .at(loc)?;
        // Checkpoints below the anchor check rows that are gone.
        tx.execute("DELETE FROM log_checkpoints WHERE seq < ?1", [seq])
            .at(loc)?;
    }
    Ok((
        (chained.len() + older.len()) as u64,
        chained_more || older.len() == PURGE_BATCH as usize,
    ))
}

pub(crate) fn chain_rows_in(
    c: &Connection,
    loc: &str,
    version: u32,
    after: u64,
    since: Option<SystemTime>,
    limit: usize,
) -> Result<Vec<ChainedRow>, StoreError> {
    if version < CHAIN_VERSION {
        return Ok(Vec::new());
    }
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let since = since.map_or(i64::MIN, micros);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut sql = format!(
        "SELECT {CHAIN_COLUMNS} FROM execution_log l
         LEFT JOIN execution_output o ON o.log_id = l.id
         WHERE l.chain_seq > ?1 AND l.created_at >= ?2
         ORDER BY l.chain_seq LIMIT ?3"
    );
    // A store of schema 6 (read-only, not migrated) has no trace ids.
    if version < 7 {
        sql = sql.replacen("l.trace_id", "NULL", 1);
    }
    query(
        c,
        loc,
        &sql,
        params![after, since, limit],
        convert::chained_row,
    )
}

pub(crate) fn chain_state_in(
    c: &Connection,
    loc: &str,
    version: u32,
) -> Result<ChainState, StoreError> {
    let mut state = ChainState::default();
    let count = |sql: &str, p: &[&dyn rusqlite::ToSql]| -> Result<u64, StoreError> {
        c.query_row(sql, p, |r| r.get::<_, i64>(0))
            .at(loc)
            .map(|n| u64::try_from(n).unwrap_or(0))
    };
    if version < CHAIN_VERSION {
        state.older_rows = count("SELECT count(*) FROM execution_log", &[])?;
        return Ok(state);
    }
    let point = |r: &rusqlite::Row<'_>| -> Result<ChainPoint, StoreError> {
        let seq: i64 = r
            .get(0)
            .map_err(|e| StoreError::invalid_data(e.to_string()))?;
        let link: Vec<u8> = r
            .get(1)
            .map_err(|e| StoreError::invalid_data(e.to_string()))?;
        Ok(ChainPoint {
            seq: u64::try_from(seq).unwrap_or(0),
            link: quiver_registry::chain::link_from_bytes(&link)?,
        })
    };
    let head = query(
        c,
        loc,
        "SELECT seq, link, start_id FROM log_chain WHERE id = 1",
        [],
        |r| {
            let start: i64 = r
                .get(2)
                .map_err(|e| StoreError::invalid_data(e.to_string()))?;
            Ok((point(r)?, start))
        },
    )?;
    state.checkpoints = query(
        c,
        loc,
        "SELECT seq, link FROM log_checkpoints ORDER BY seq",
        [],
        point,
    )?;
    let Some((head, start)) = head.into_iter().next() else {
        return Err(StoreError::invalid_data(
            "the chain's head row is missing (removed behind Quiver's back)",
        ));
    };
    state.head = Some(head);
    state.older_rows = count(
        "SELECT count(*) FROM execution_log WHERE chain_seq IS NULL AND id < ?1",
        &[&start],
    )?;
    state.unchained_count = count(
        "SELECT count(*) FROM execution_log WHERE chain_seq IS NULL AND id >= ?1",
        &[&start],
    )?;
    state.unchained = query(
        c,
        loc,
        "SELECT id FROM execution_log WHERE chain_seq IS NULL AND id >= ?1
         ORDER BY id LIMIT 10",
        [start],
        |r| {
            r.get::<_, i64>(0)
                .map_err(|e| StoreError::invalid_data(e.to_string()))
        },
    )?;
    Ok(state)
}
