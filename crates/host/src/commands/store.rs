//! `quiver store migrate`: copies a SQLite store into a PostgreSQL one, then checks that
//! every row is there. Keyed rows make it safe to run twice (and beside running servers):
//! what the database has already is kept.

use std::{path::Path, process::ExitCode};

use anyhow::Context;
use quiver_registry::store::{DefinitionStore, JobStore};
use quiver_store_postgres::{Import, ImportCounts, PgOptions, PgStore, redact};
use quiver_store_sqlite::{SqliteStore, StoreOptions};
use quiver_surface::ports::{SessionStore, TIER0_KEY};

/// Opens the SQLite store at `from` read-only.
async fn open_sqlite(from: &Path) -> anyhow::Result<SqliteStore> {
    if !from.is_file() {
        anyhow::bail!(
            "there is no SQLite store at {}: give the file `[store] path` names (e.g. ./quiver.db)",
            from.display()
        );
    }
    let path = from.to_path_buf();
    let store = tokio::task::spawn_blocking(move || {
        SqliteStore::open_read_only(path, StoreOptions::default())
    })
    .await?
    .with_context(|| format!("opening {}", from.display()))?;
    Ok(store)
}

/// Reads what `quiver store migrate` copies in one piece from the SQLite store at `from`:
/// everything but the execution log, which is copied page by page.
async fn read_sqlite(store: &SqliteStore, from: &Path) -> anyhow::Result<Import> {
    let mut data = Import::default();
    data.definitions = store.all_definitions().await?;
    data.jobs = store.jobs(None).await?;
    if let Some(floor) = store.state(TIER0_KEY).await? {
        data.state.push((TIER0_KEY.to_owned(), floor));
    }
    let path = from.to_path_buf();
    let sessions =
        tokio::task::spawn_blocking(move || quiver_store_sqlite::read_sessions(path)).await??;
    data.working = sessions.working;
    data.failures = sessions.failures;
    Ok(data)
}

/// One page of the execution log after row `after`, as an [`Import`] of calls only, and
/// the last row it holds (`None` at the end).
async fn log_page(
    store: &SqliteStore,
    after: u64,
    page_rows: usize,
) -> anyhow::Result<Option<(Import, u64)>> {
    let calls = store.calls_page(after, page_rows).await?;
    let Some(last) = calls.last().map(|c| c.row) else {
        return Ok(None);
    };
    let mut page = Import::default();
    page.calls = calls;
    Ok(Some((page, last)))
}

/// Walks the hash chain of the SQLite log before anything is copied: the copy chains its
/// rows anew in PostgreSQL, where rows changed behind Quiver's back would verify intact, so
/// a log that does not verify is refused unless `accept_broken` (then its problems are
/// said, for the record).
async fn check_chain(store: &SqliteStore, from: &Path, accept_broken: bool) -> anyhow::Result<()> {
    let report = quiver_registry::chain::verify(store, None)
        .await
        .with_context(|| format!("verifying the hash chain of {}", from.display()))?;
    let span = match report.span {
        Some((a, b)) => format!("rows {a} to {b}"),
        None => "no rows".to_owned(),
    };
    if report.intact() {
        match report.last {
            Some(head) => say!(
                "the hash chain of {} is intact: {} row(s) checked ({span}), head {head}",
                from.display(),
                report.rows
            ),
            None => say!("the log of {} has no chained rows", from.display()),
        }
        if report.older_rows > 0 {
            say!(
                "{} row(s) written before the chain existed (by an older Quiver) are not covered by it",
                report.older_rows
            );
        }
        return Ok(());
    }
    let broken = format!(
        "{} fails its hash-chain check: {} problem(s) in {} row(s) ({span})",
        from.display(),
        report.problems_found,
        report.rows
    );
    let first = report
        .problems
        .first()
        .map(ToString::to_string)
        .unwrap_or_default();
    if !accept_broken {
        anyhow::bail!(
            "{broken}; the first: {first}. Copied, its rows would be chained anew in PostgreSQL and verify intact there, hiding the changes, so nothing was copied. `quiver log --verify` (with `[store] path` naming this file) lists the problems; copy it from a backup taken before them, or, to copy it as it is, run again with --accept-broken-chain and keep {} as the evidence",
            from.display()
        );
    }
    say!(
        "{broken}; copying anyway (--accept-broken-chain): the copied rows are chained anew in PostgreSQL, where these changes will no longer show; keep {} as the evidence:",
        from.display()
    );
    super::log::say_problems(&report);
    Ok(())
}

fn line(label: &str, counts: &ImportCounts) -> String {
    format!(
        "{label}: {} definition(s), {} job(s), {} log row(s), {} working-set entr(ies), {} failed approach(es), {} state key(s)",
        counts.definitions,
        counts.jobs,
        counts.calls,
        counts.working,
        counts.failures,
        counts.state
    )
}

/// How many execution-log rows `quiver store migrate` holds in memory at once, by default.
pub(crate) const PAGE_ROWS: u64 = 1_000;

/// `quiver store migrate --from <sqlite file> --to <postgres url>`: the SQLite log's hash
/// chain walked first (a log that does not verify is refused unless `accept_broken_chain`),
/// then the definitions, jobs, sessions and floor in one transaction, then the execution log in pages of `page_rows`
/// rows (each its own transaction, in row order), then the check: every page read again and
/// its rows counted in PostgreSQL. Rows written to the SQLite log after the copy began are
/// left to the next run.
pub(crate) async fn migrate(
    from: &Path,
    to: &str,
    page_rows: usize,
    accept_broken_chain: bool,
) -> anyhow::Result<ExitCode> {
    let shown = redact(to);
    let page_rows = page_rows.max(1);
    let sqlite = open_sqlite(from).await?;
    check_chain(&sqlite, from, accept_broken_chain).await?;
    let data = read_sqlite(&sqlite, from).await?;
    let pg = PgStore::open(to, PgOptions::default())
        .await
        .with_context(|| format!("opening {shown}"))?;
    let mut new = pg
        .import(&data)
        .await
        .with_context(|| format!("copying into {shown}"))?;
    let mut want = data.counts();
    // The log, page by page; `last` is the last row copied.
    let (mut last, mut pages) = (0u64, 0u64);
    while let Some((page, end)) = log_page(&sqlite, last, page_rows).await? {
        let added = pg
            .import(&page)
            .await
            .with_context(|| format!("copying log rows after row {last} into {shown}"))?;
        new.calls += added.calls;
        want.calls += page.counts().calls;
        tracing::debug!(
            page = pages + 1,
            rows = page.calls.len(),
            new = added.calls,
            "copied a page of the log"
        );
        (last, pages) = (end, pages + 1);
    }
    say!(
        "{} (the log in {pages} page(s) of at most {page_rows} rows)",
        line(&format!("read from {}", from.display()), &want)
    );
    say!("{}", line("new in PostgreSQL", &new));
    let mut there = pg
        .count_present(&data)
        .await
        .with_context(|| format!("checking {shown}"))?;
    let mut checked = 0u64;
    while checked < last {
        let Some((page, end)) = log_page(&sqlite, checked, page_rows).await? else {
            break;
        };
        let mut page = page;
        page.calls.retain(|c| c.row <= last);
        there.calls += pg
            .count_present(&page)
            .await
            .with_context(|| format!("checking {shown}"))?
            .calls;
        checked = end;
    }
    pg.close().await?;
    sqlite.close().await?;
    if there != want {
        say!("{}", line("found in PostgreSQL", &there));
        anyhow::bail!(
            "the copy is incomplete: {shown} holds fewer of the rows than {} has; run the command again (it copies only what is missing)",
            from.display()
        );
    }
    say!(
        "verified: every row of {} is in {shown} (rows it had already were kept)",
        from.display()
    );
    Ok(ExitCode::SUCCESS)
}
