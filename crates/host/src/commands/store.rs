//! `quiver store migrate`: copies a SQLite store into a PostgreSQL one, then checks that
//! every row is there. Keyed rows make it safe to run twice (and beside running servers):
//! what the database has already is kept.

use std::{path::Path, process::ExitCode};

use anyhow::Context;
use quiver_registry::store::{CallFilter, CallLog, DefinitionStore, JobStore};
use quiver_store_postgres::{Import, ImportCounts, PgOptions, PgStore, redact};
use quiver_store_sqlite::{SqliteStore, StoreOptions};
use quiver_surface::ports::{SessionStore, TIER0_KEY};

/// Reads everything `quiver store migrate` copies from the SQLite store at `from`.
async fn read_sqlite(from: &Path) -> anyhow::Result<Import> {
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
    let mut data = Import::default();
    data.definitions = store.all_definitions().await?;
    data.jobs = store.jobs(None).await?;
    data.calls = store
        .recent_calls(CallFilter::recent(usize::MAX).with_output())
        .await?;
    if let Some(floor) = store.state(TIER0_KEY).await? {
        data.state.push((TIER0_KEY.to_owned(), floor));
    }
    store.close().await?;
    let path = from.to_path_buf();
    let sessions =
        tokio::task::spawn_blocking(move || quiver_store_sqlite::read_sessions(path)).await??;
    data.working = sessions.working;
    data.failures = sessions.failures;
    Ok(data)
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

/// `quiver store migrate --from <sqlite file> --to <postgres url>`.
pub(crate) async fn migrate(from: &Path, to: &str) -> anyhow::Result<ExitCode> {
    let shown = redact(to);
    let data = read_sqlite(from).await?;
    let want = data.counts();
    say!("{}", line(&format!("read from {}", from.display()), &want));
    let pg = PgStore::open(to, PgOptions::default())
        .await
        .with_context(|| format!("opening {shown}"))?;
    let new = pg
        .import(&data)
        .await
        .with_context(|| format!("copying into {shown}"))?;
    say!("{}", line("new in PostgreSQL", &new));
    let there = pg
        .count_present(&data)
        .await
        .with_context(|| format!("checking {shown}"))?;
    pg.close().await?;
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
