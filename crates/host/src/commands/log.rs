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
