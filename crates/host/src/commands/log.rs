//! `quiver log`: the execution log, newest first.

use std::process::ExitCode;

use anyhow::Context;
use quiver_host::Config;
use quiver_registry::store::CallFilter;

fn ms(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// Milliseconds with microsecond precision, as JSON shows them (`0.045`, not
/// `0.045000000000000005`).
fn whole_us_ms(d: std::time::Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// `quiver log`: reads the execution log without opening the store for writing, so it
/// creates nothing at a mistyped path and works on a store the operator may only read.
pub(crate) async fn run(
    config: &Config,
    tool: Option<String>,
    session: Option<String>,
    outcome: Option<String>,
    limit: usize,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut filter = CallFilter::recent(limit);
    if let Some(t) = tool {
        filter = filter.tool(t);
    }
    if let Some(s) = session {
        filter = filter.session(s);
    }
    if let Some(o) = outcome {
        filter = filter.kind(o);
    }
    let calls = if config.store.url.is_some() {
        // Every replica's rows, from the database they share.
        let store = quiver_host::Store::open(config, quiver_host::StoreAccess::ReadOnly).await?;
        let calls = quiver_registry::store::CallLog::recent_calls(&store, filter)
            .await
            .context("reading the execution log")?;
        store.close().await.context("closing the store")?;
        calls
    } else {
        read_file_log(config, filter).await?
    };
    if json {
        for c in &calls {
            let row = serde_json::json!({
                "call_id": c.call_id, "parent": c.parent_call_id, "tool": c.tool_name, "session": c.session, "tenant": c.tenant,
                "principal": c.principal,
                "outcome": c.kind, "hint_kind": c.hint_kind, "err_kind": c.err_kind.as_ref().map(quiver_contract::ErrKind::as_str),
                "input": c.input, "reasoning": c.reasoning, "args_hash": c.args_hash,
                "summary": c.output_summary, "queued_ms": whole_us_ms(c.queued),
                "took_ms": whole_us_ms(c.took),
                "at": c.at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
                "trace_id": c.trace_id,
            });
            say!("{row}");
        }
    } else {
        // Columns as wide as their longest entry (MCP tool names and `mcp:<id>`
        // sessions are long), within a cap.
        let width = |texts: &mut dyn Iterator<Item = usize>, least: usize| {
            texts.fold(least, usize::max).min(64)
        };
        let tool_w = width(
            &mut calls
                .iter()
                .map(|c| quiver_contract::printable(&c.tool_name).chars().count()),
            4,
        );
        let session_w = width(
            &mut calls.iter().map(|c| {
                quiver_contract::printable(c.session.as_deref().unwrap_or("-"))
                    .chars()
                    .count()
            }),
            7,
        );
        // Who called (the token's name, or the OIDC user: `sub`, with the email when the
        // token had one): a column only when some row has one.
        let user = |c: &quiver_registry::store::LoggedCall| {
            quiver_contract::printable(c.principal.as_deref().unwrap_or("-")).into_owned()
        };
        let user_w = calls
            .iter()
            .any(|c| c.principal.is_some())
            .then(|| width(&mut calls.iter().map(|c| user(c).chars().count()), 4));
        let user_col = |text: &str| match user_w {
            Some(w) => format!(" {text:<w$}"),
            None => String::new(),
        };
        say!(
            "{:<19} {:<tool_w$} {:<7} {:<session_w$}{} {:>9}  SUMMARY",
            "AT (UTC)",
            "TOOL",
            "OUTCOME",
            "SESSION",
            user_col("USER"),
            "TOOK_MS"
        );
        for c in &calls {
            let summary: String = c
                .output_summary
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(60)
                .collect();
            // Escaped: a row's texts come from clients and tools, and a newline
            // or a terminal escape in them must not forge rows or drive the
            // operator's terminal.
            let at = chrono::DateTime::<chrono::Utc>::from(c.at).format("%Y-%m-%d %H:%M:%S");
            say!(
                "{at:<19} {:<tool_w$} {:<7} {:<session_w$}{} {:>9}  {}",
                quiver_contract::printable(&c.tool_name),
                c.kind,
                quiver_contract::printable(c.session.as_deref().unwrap_or("-")),
                user_col(&user(c)),
                ms(c.took),
                quiver_contract::printable(&summary)
            );
        }
        say!("{} call(s)", calls.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// The execution log of the SQLite file `[store] path` names, read without changing it.
async fn read_file_log(
    config: &Config,
    filter: CallFilter,
) -> anyhow::Result<Vec<quiver_registry::store::LoggedCall>> {
    if let Some(problem) = config.store.path_problem() {
        anyhow::bail!("reading the execution log: {problem}");
    }
    let path = config.store.path.clone();
    let shown = path.display().to_string();
    let calls = tokio::task::spawn_blocking(move || quiver_store_sqlite::read_calls(&path, filter))
                .await
                .context("reading the execution log")?
                .map_err(|e| match e {
                    quiver_registry::store::StoreError::Unavailable { ref cause, .. } if cause == "no such database" => anyhow::anyhow!(
                        "there is no store at {shown}: no call has been logged there (`quiver serve`, `call` and `search` create it); check `[store] path` in the config"
                    ),
                    other => anyhow::Error::new(other).context("reading the execution log"),
                })?;
    Ok(calls)
}

/// Opens the store to read the log's chain: the shared database, or the SQLite file (which
/// must exist: nothing is created at a mistyped path).
async fn open_for_chain(config: &Config) -> anyhow::Result<quiver_host::Store> {
    if config.store.url.is_none() {
        if let Some(problem) = config.store.path_problem() {
            anyhow::bail!("reading the execution log: {problem}");
        }
        if !config.store.path.exists() {
            anyhow::bail!(
                "there is no store at {}: no call has been logged there (`quiver serve`, `call` and `search` create it); check `[store] path` in the config",
                config.store.path.display()
            );
        }
    }
    quiver_host::Store::open(config, quiver_host::StoreAccess::ReadOnly).await
}

/// `quiver log --verify`: walks the hash chain; exit 1 when it is broken.
pub(crate) async fn verify(config: &Config, expect_head: Option<&str>) -> anyhow::Result<ExitCode> {
    use quiver_registry::chain::ChainPoint;
    let expected = match expect_head {
        None => None,
        Some(text) => Some(ChainPoint::parse(text).ok_or_else(|| {
            anyhow::anyhow!(
                "--expect-head {text:?} is not a head: give `SEQ:HASH` as `quiver log --verify` printed it (a number, a colon, 64 hex digits)"
            )
        })?),
    };
    let store = open_for_chain(config).await?;
    let report = quiver_registry::chain::verify(&store, expected)
        .await
        .context("verifying the execution log's chain")?;
    store.close().await.context("closing the store")?;
    let span = match report.span {
        Some((a, b)) => format!("rows {a} to {b}"),
        None => "no rows".to_owned(),
    };
    if report.older_rows > 0 {
        say!(
            "{} row(s) written before the chain existed (by an older Quiver) are not covered",
            report.older_rows
        );
    }
    if report.intact() {
        say!(
            "chain intact: {} row(s) checked ({span}), {} checkpoint(s) matched",
            report.rows,
            report.checkpoints_checked
        );
        if let Some(last) = report.last {
            say!("head: {last}");
            say!(
                "record the head elsewhere; `quiver log --verify --expect-head {last}` later checks that the chain still holds it"
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let listed = match report.problems_unlisted() {
        0 => String::new(),
        _ => format!("; the first {} are listed", report.problems.len()),
    };
    say!(
        "chain BROKEN: {} problem(s) in {} row(s) checked ({span}){listed}; the first is where the tampering starts:",
        report.problems_found,
        report.rows
    );
    say_problems(&report);
    Ok(ExitCode::from(1))
}

/// Rows read per page while exporting.
const EXPORT_PAGE: usize = 1_000;

/// `quiver log --format jsonl`: every chained row after `after` (and at or after `since`),
/// oldest first, one JSON object a line, with the texts exactly as stored (the arguments
/// and the output as JSON text), so a SIEM can recompute each link.
pub(crate) async fn export(
    config: &Config,
    since: Option<&str>,
    after: u64,
) -> anyhow::Result<ExitCode> {
    use quiver_registry::chain::hex;
    use std::io::Write as _;
    let since = since.map(parse_since).transpose()?;
    let store = open_for_chain(config).await?;
    // With `--since`, rows older than it are passed over, not exported: the cursor still
    // moves past every row there was when the export began, so resuming does not read them
    // again (and an export with nothing new does not say `--after 0`).
    let head = match since {
        Some(_) => quiver_registry::store::CallLog::chain_state(&store)
            .await
            .context("reading the execution log's head")?
            .head
            .map_or(0, |h| h.seq),
        None => 0,
    };
    let mut cursor = after;
    let mut rows = 0u64;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    loop {
        let page = quiver_registry::store::CallLog::chain_rows(&store, cursor, since, EXPORT_PAGE)
            .await
            .context("reading the execution log")?;
        let Some(last) = page.last() else { break };
        cursor = last.point.seq;
        for r in &page {
            let e = &r.entry;
            let at = chrono::DateTime::<chrono::Utc>::from_timestamp_micros(e.created_at_us)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
            let line = serde_json::json!({
                "seq": r.point.seq, "link": hex(&r.point.link), "id": r.id,
                "at": at, "at_us": e.created_at_us,
                "tool": e.tool_name, "tenant": e.tenant, "session": e.session,
                "principal": e.principal, "call_id": e.call_id, "parent": e.parent_call_id,
                "input_data": e.input_data, "reasoning": e.reasoning, "args_hash": e.args_hash,
                "outcome": e.kind, "hint_kind": e.hint_kind, "err_kind": e.err_kind,
                "success": e.success, "error": e.error, "summary": e.output_summary,
                "output": e.output, "queued_us": e.queued_us, "took_us": e.took_us,
                "trace_id": e.trace_id,
            });
            if writeln!(out, "{line}").is_err() {
                // The reader went away (`| head`): what was written is the export.
                return Ok(ExitCode::SUCCESS);
            }
            rows += 1;
        }
    }
    let _ = out.flush();
    drop(out);
    cursor = cursor.max(head);
    store.close().await.context("closing the store")?;
    eprintln!("quiver: exported {rows} row(s); resume after them with `--after {cursor}`");
    Ok(ExitCode::SUCCESS)
}

/// `--since`: an RFC 3339 time, or an age (`90s`, `15m`, `24h`, `7d`) before now.
fn parse_since(text: &str) -> anyhow::Result<std::time::SystemTime> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&chrono::Utc).into());
    }
    let unit = text.chars().last().unwrap_or(' ');
    let secs: Option<u64> = text[..text.len() - unit.len_utf8().min(text.len())]
        .parse::<u64>()
        .ok()
        .and_then(|n| match unit {
            's' => Some(n),
            'm' => n.checked_mul(60),
            'h' => n.checked_mul(3600),
            'd' => n.checked_mul(86_400),
            _ => None,
        });
    match secs {
        Some(s) => Ok(std::time::SystemTime::now()
            .checked_sub(std::time::Duration::from_secs(s))
            .unwrap_or(std::time::UNIX_EPOCH)),
        None => anyhow::bail!(
            "--since {text:?} is neither a time nor an age: give RFC 3339 (`2026-12-01T00:00:00Z`) or a number with s, m, h or d (`24h`)"
        ),
    }
}

/// A broken chain's listed problems, one a line, and how many more there are.
pub(crate) fn say_problems(report: &quiver_registry::chain::VerifyReport) {
    for p in &report.problems {
        say!("  - {p}");
    }
    if report.problems_unlisted() > 0 {
        say!(
            "  ... and {} more problem(s) not listed",
            report.problems_unlisted()
        );
    }
}
