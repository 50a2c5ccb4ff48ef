//! The crash test. The parent re-runs this test binary in child mode (`CHILD_ENV` names the
//! database): the child records calls with ids 0, 1, 2, ... and after every `flush()` returns
//! prints `FLUSHED <n>`, meaning every id `0..=n` is durable. The parent kills the child with
//! SIGKILL mid-stream, reopens the store, and checks that the crash check ran and passed and
//! that every id reported flushed is present.

use std::{
    collections::HashSet,
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use quiver_registry::{
    ToolCallRecorder,
    store::{CallFilter, CallLog},
};
use quiver_store_sqlite::{CrashCheck, SqliteStore};

use crate::support::call;

const CHILD_ENV: &str = "QUIVER_STORE_CRASH_CHILD";
const FLUSH_EVERY: u64 = 50;
const KILL_AFTER: u64 = 5_000;
const WAIT: Duration = Duration::from_secs(60);

/// Child mode: a no-op unless the parent set `CHILD_ENV`.
#[test]
fn crash_child_writer() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let store = SqliteStore::open(&path).expect("child open");
        let mut out = std::io::stdout().lock();
        // Bounded so an orphaned child ends by itself.
        for i in 0..10_000_000u64 {
            store.record(call("crash", &i.to_string(), "ok")).await;
            if i % FLUSH_EVERY == FLUSH_EVERY - 1 {
                store.flush().await;
                writeln!(out, "FLUSHED {i}").expect("stdout");
                out.flush().expect("stdout");
            }
        }
    });
}

#[tokio::test]
async fn rows_flushed_before_a_sigkill_survive_and_the_crash_check_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crash.db");
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "crash::crash_child_writer",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<u64>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line
                .strip_prefix("FLUSHED ")
                .and_then(|n| n.trim().parse().ok())
                && tx.send(n).is_err()
            {
                break;
            }
        }
    });

    let mut flushed = None;
    while flushed.is_none_or(|n| n < KILL_AFTER) {
        match rx.recv_timeout(WAIT) {
            Ok(n) => flushed = Some(n),
            Err(e) => {
                let _ = child.kill();
                panic!("no progress from the child within {WAIT:?}: {e}");
            }
        }
    }
    child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
    child.wait().expect("reap");
    // Lines already in the pipe were printed before the kill: they count too.
    reader.join().expect("reader");
    let flushed = rx.try_iter().fold(flushed.unwrap_or(0), u64::max);

    let store = SqliteStore::open(&path).expect("reopen after crash");
    assert_eq!(store.open_report().crash_check, CrashCheck::Passed);
    let present: HashSet<u64> = store
        .recent_calls(CallFilter::recent(usize::MAX >> 1).tool("crash"))
        .await
        .expect("read")
        .into_iter()
        .map(|c| c.call_id.parse().expect("id"))
        .collect();
    let missing: Vec<u64> = (0..=flushed).filter(|i| !present.contains(i)).collect();
    assert!(
        missing.is_empty(),
        "{} flushed rows lost, first {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

const HOLDER_ENV: &str = "QUIVER_STORE_HOLDER_CHILD";

/// Child mode for the next test: opens the store, says so, and holds it until killed
/// (bounded, so an orphaned child ends by itself).
#[test]
fn holder_child() {
    let Some(path) = std::env::var_os(HOLDER_ENV) else {
        return;
    };
    let store = SqliteStore::open(&path).expect("child open");
    // On a line of its own: the test harness may have begun one ("test ... ").
    println!("\nHOLDER OPEN");
    std::io::stdout().flush().expect("stdout");
    std::thread::sleep(Duration::from_secs(120));
    drop(store);
}

/// A server killed while a CLI command has the same database open: the CLI, last out, must
/// not mark the database clean, so the next open still runs the crash check.
#[test]
fn a_holder_that_died_keeps_the_last_one_out_from_marking_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("held.db");
    drop(SqliteStore::open(&path).expect("create"));
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "crash::holder_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let opened = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.trim() == "HOLDER OPEN");
    if !opened {
        let _ = child.kill();
        panic!("the child never opened the store");
    }
    let beside = SqliteStore::open(&path).expect("open beside the child");
    assert_eq!(beside.open_report().crash_check, CrashCheck::Shared);
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    drop(beside);
    let after = SqliteStore::open(&path).expect("reopen");
    assert_eq!(
        after.open_report().crash_check,
        CrashCheck::Passed,
        "the dead holder's open must still be checked"
    );
    drop(after);
    let again = SqliteStore::open(&path).expect("open once more");
    assert_eq!(
        again.open_report().crash_check,
        CrashCheck::CleanShutdown,
        "the check cleared the dead holder's row"
    );
}
