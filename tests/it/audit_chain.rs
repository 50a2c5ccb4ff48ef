//! The execution log's hash chain through the `quiver` binary on a real SQLite file: rows
//! changed, removed and inserted with SQL behind Quiver's back are each reported by `quiver
//! log --verify` (exit 1; a command that cannot run exits 2), a head recorded earlier is checked with `--expect-head`, and the
//! JSON Lines export carries the stored texts, so each link can be recomputed from it.

use std::{borrow::Cow, path::Path};

use quiver_registry::chain::{ChainPoint, LogEntry, parse_hex};
use serde_json::Value;

use crate::mcp_server::{fresh_dir, quiver_binary};

/// Runs `quiver args` in `dir`: its exit code and its stdout and stderr together.
fn quiver(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(quiver_binary())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("quiver runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn sql(dir: &Path, statement: &str) {
    let db = rusqlite::Connection::open(dir.join("quiver.db")).expect("the store exists");
    db.execute_batch(statement).expect("the statement runs");
}

/// The exported rows, each a JSON object.
fn exported(dir: &Path, extra: &[&str]) -> (Vec<Value>, String) {
    let out = std::process::Command::new(quiver_binary())
        .args([&["log", "--format", "jsonl"], extra].concat())
        .current_dir(dir)
        .output()
        .expect("quiver runs");
    assert!(out.status.success(), "{out:?}");
    let rows = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    (rows, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn text(v: &Value, key: &str) -> Cow<'static, str> {
    Cow::Owned(
        v[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key} in {v}"))
            .to_owned(),
    )
}

fn opt(v: &Value, key: &str) -> Option<Cow<'static, str>> {
    v[key].as_str().map(|s| Cow::Owned(s.to_owned()))
}

fn int(v: &Value, key: &str) -> i64 {
    v[key].as_i64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// The link of an exported row, recomputed from the line alone after `prev`.
fn recomputed(v: &Value, prev: &ChainPoint) -> [u8; 32] {
    let entry = LogEntry {
        tool_name: text(v, "tool"),
        tenant: opt(v, "tenant"),
        session: opt(v, "session"),
        principal: opt(v, "principal"),
        call_id: text(v, "call_id"),
        parent_call_id: opt(v, "parent"),
        input_data: text(v, "input_data"),
        reasoning: opt(v, "reasoning"),
        args_hash: text(v, "args_hash"),
        kind: text(v, "outcome"),
        hint_kind: opt(v, "hint_kind"),
        err_kind: opt(v, "err_kind"),
        success: v["success"].as_bool().expect("success"),
        error: opt(v, "error"),
        output_summary: text(v, "summary"),
        output: text(v, "output"),
        queued_us: int(v, "queued_us"),
        took_us: int(v, "took_us"),
        created_at_us: int(v, "at_us"),
        trace_id: opt(v, "trace_id"),
    };
    entry.link(prev.seq + 1, &prev.link)
}

#[test]
fn quiver_log_verify_finds_each_change_made_with_sql_and_the_export_carries_the_links() {
    let dir = fresh_dir();
    // Six calls from six processes: ok, and errors (an unknown tool, bad arguments).
    for args in [
        &["call", "tool_search", r#"{"query": "time"}"#][..],
        &["call", "no_such_tool", "{}"],
        &[
            "call",
            "--session",
            "s2",
            "tool_search",
            r#"{"query": "files"}"#,
        ],
        &["call", "describe_tool", r#"{"name": 5}"#],
        &["call", "tool_search", r#"{"query": "memory"}"#],
        &["call", "tool_search", r#"{"query": "git log"}"#],
    ] {
        quiver(&dir, args);
    }
    let (code, out) = quiver(&dir, &["log", "--verify"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("chain intact: 6 row(s) checked (rows 1 to 6)"),
        "{out}"
    );
    let head = out
        .lines()
        .find_map(|l| l.strip_prefix("head: "))
        .and_then(ChainPoint::parse)
        .unwrap_or_else(|| panic!("a head line: {out}"));
    assert_eq!(head.seq, 6);

    // The export: oldest first, every link recomputable from the lines alone.
    let (rows, said) = exported(&dir, &[]);
    assert_eq!(rows.len(), 6);
    assert!(said.contains("--after 6"), "{said}");
    let mut prev = ChainPoint::START;
    for row in &rows {
        let link = parse_hex(row["link"].as_str().expect("link")).expect("hex");
        assert_eq!(recomputed(row, &prev), link, "{row}");
        prev = ChainPoint {
            seq: row["seq"].as_u64().expect("seq"),
            link,
        };
    }
    assert_eq!(prev, head);
    assert!(rows.iter().any(|r| r["outcome"] == "err"), "{rows:?}");
    // Resumed from a cursor; a time filter.
    let (rest, _) = exported(&dir, &["--after", "4"]);
    assert_eq!(
        rest.iter().map(|r| r["seq"].as_u64()).collect::<Vec<_>>(),
        [Some(5), Some(6)]
    );
    let (none, said) = exported(&dir, &["--since", "2999-01-01T00:00:00Z"]);
    assert!(none.is_empty());
    // Nothing exported: the cursor is past every row there is, not back at the start.
    assert!(said.contains("--after 6"), "{said}");
    let (recent, _) = exported(&dir, &["--since", "1h"]);
    assert_eq!(recent.len(), 6);
    let (code, out) = quiver(&dir, &["log", "--format", "jsonl", "--since", "yesterday"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("neither a time nor an age"), "{out}");
    // The table's filters would leave rows out of an export that says it is whole: refused.
    for filter in [
        &["--outcome", "err"][..],
        &["--tool", "echo"],
        &["--session", "s"],
        &["--limit", "2"],
        &["--json"],
    ] {
        let (code, out) = quiver(&dir, &[&["log", "--format", "jsonl"], filter].concat());
        assert_eq!(code, 2, "{filter:?}: {out}");
        assert!(out.contains("cannot be used with"), "{filter:?}: {out}");
    }

    // Changed: the reasoning of row 2; then put back, the chain is whole again.
    sql(
        &dir,
        "UPDATE execution_log SET reasoning = 'edited' WHERE chain_seq = 2",
    );
    let (code, out) = quiver(&dir, &["log", "--verify"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("chain BROKEN"), "{out}");
    assert!(out.contains("row 2 (id 2, call "), "{out}");
    assert!(out.contains("does not hash to its link"), "{out}");
    sql(
        &dir,
        "UPDATE execution_log SET reasoning = NULL WHERE chain_seq = 2",
    );
    assert_eq!(quiver(&dir, &["log", "--verify"]).0, 0);

    // A changed output (the stored envelope), which the table view does not show.
    sql(
        &dir,
        "UPDATE execution_output SET output = output || ' '
         WHERE log_id = (SELECT id FROM execution_log WHERE chain_seq = 5)",
    );
    let (code, out) = quiver(&dir, &["log", "--verify"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("row 5 (id 5"), "{out}");
    sql(
        &dir,
        "UPDATE execution_output SET output = substr(output, 1, length(output) - 1)
         WHERE log_id = (SELECT id FROM execution_log WHERE chain_seq = 5)",
    );

    // Inserted: a copy of row 1 without a link.
    sql(
        &dir,
        "INSERT INTO execution_log (tool_name, call_id, input_data, args_hash, kind, success,
             output_summary, queued_us, took_us, created_at)
         SELECT tool_name, 'forged', input_data, args_hash, kind, success, output_summary,
             queued_us, took_us, created_at FROM execution_log WHERE chain_seq = 1",
    );
    let (code, out) = quiver(&dir, &["log", "--verify"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("row id 7 was inserted"), "{out}");
    sql(&dir, "DELETE FROM execution_log WHERE call_id = 'forged'");

    // Removed: row 3, then the last row.
    sql(&dir, "DELETE FROM execution_log WHERE chain_seq = 3");
    let (code, out) = quiver(&dir, &["log", "--verify"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("row 3 was removed"), "{out}");
    sql(&dir, "DELETE FROM execution_log WHERE chain_seq = 6");
    let (_, out) = quiver(&dir, &["log", "--verify"]);
    assert!(out.contains("row 6 was removed from the end"), "{out}");
    // The head recorded before is no longer in the chain.
    let (code, out) = quiver(
        &dir,
        &["log", "--verify", "--expect-head", &head.to_string()],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("the head recorded earlier"), "{out}");
    let (code, out) = quiver(&dir, &["log", "--verify", "--expect-head", "6:abc"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("is not a head"), "{out}");
}

#[test]
fn quiver_log_verify_without_a_store_says_so_and_creates_nothing() {
    let dir = fresh_dir();
    let (code, out) = quiver(&dir, &["log", "--verify"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("there is no store at"), "{out}");
    assert!(!dir.join("quiver.db").exists());
}
