use std::path::PathBuf;

use quiver_contract::{Envelope, ErrKind, HintKind};
use quiver_registry::CallRecord;
use quiver_store_sqlite::SqliteStore;
use serde_json::json;
use tempfile::TempDir;

/// A store in a fresh temp dir (kept alive by the returned guard).
pub(crate) fn store() -> (TempDir, PathBuf, SqliteStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("quiver.db");
    let store = SqliteStore::open(&path).expect("open");
    (dir, path, store)
}

/// A call record of `tool` with call id `id`, ending in `kind` (`ok`, `hint` or `err`).
pub(crate) fn call(tool: &str, id: &str, kind: &str) -> CallRecord {
    let env = match kind {
        "ok" => Envelope::text(format!("result of {id}")),
        "hint" => Envelope::hint(HintKind::Schema, "did you mean `x`?", Vec::new()),
        _ => Envelope::err(ErrKind::ToolFailed, "boom"),
    };
    CallRecord::new(tool, id, json!({"id": id}), env)
}
