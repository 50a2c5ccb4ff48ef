//! `kill -9` under load, again and again on one store: after each kill the SQLite store
//! passes `PRAGMA integrity_check`, no upstream process outlives the killed server, and the
//! answered calls missing from the execution log are counted (each answer's message is
//! recorded by the client, `tests/fixtures/mcp_server/kill_load.py`, before its next call).
//! With `[store] durability = "strict"` that count must be 0; with the default (rows in
//! batches off the call path) it is reported.
//!
//! `QUIVER_CRASH_RUNS` sets the number of kills (3 in CI; `docs/RELIABILITY.md` has the run
//! of 10).

use std::{
    collections::BTreeSet,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
};

use crate::mcp_server::{everything_bin, fresh_dir, python, quiver_binary, repo_root};

/// Processes whose working directory is `dir`.
fn processes_in(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd == dir) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            out.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    out
}

/// The echo messages the execution log holds.
fn logged_messages(db: &Path) -> BTreeSet<String> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT input_data FROM execution_log WHERE tool_name = 'mcp__everything__echo'")
        .unwrap();
    stmt.query_map([], |r| r.get::<_, Option<String>>(0))
        .unwrap()
        .filter_map(|r| r.ok().flatten())
        .filter_map(|input| {
            serde_json::from_str::<serde_json::Value>(&input).ok()?["message"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_under_load_leaves_a_sound_store_and_no_upstream_behind() {
    let missing = kill_9_runs("batched").await;
    println!("kill -9 runs, batched (answered, missing from the log): {missing:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_under_load_with_strict_durability_loses_no_answered_call() {
    let missing = kill_9_runs("strict").await;
    println!("kill -9 runs, strict (answered, missing from the log): {missing:?}");
    assert!(
        missing.iter().all(|&(_, lost)| lost == 0),
        "answered calls missing from the log with strict durability: {missing:?}"
    );
}

/// Kills `quiver serve` under load `QUIVER_CRASH_RUNS` times on one store written with
/// `durability`; per kill, the calls answered and how many of them the log misses.
async fn kill_9_runs(durability: &str) -> Vec<(usize, usize)> {
    let runs: u32 = std::env::var("QUIVER_CRASH_RUNS")
        .ok()
        .map(|v| v.parse().expect("QUIVER_CRASH_RUNS is a number"))
        .unwrap_or(3);
    let dir = fresh_dir();
    let upstream_dir = dir.join("upstream");
    std::fs::create_dir_all(&upstream_dir).unwrap();
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[store]\npath = \"crash.db\"\ndurability = \"{durability}\"\n\n[surface]\nanchors = [\"mcp__everything__echo\"]\n\n\
             [[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\ncwd = {:?}\nrequired = true\n",
            everything_bin().display().to_string(),
            upstream_dir.display().to_string(),
        ),
    )
    .unwrap();
    let answered_file = dir.join("answered.txt");
    let db = dir.join("crash.db");
    let mut missing_per_run = Vec::new();
    for run in 1..=runs {
        let mut child = Command::new(quiver_binary())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .current_dir(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the URL in time")
            .unwrap()
            .expect("a URL line");
        assert!(
            !processes_in(&upstream_dir).is_empty(),
            "run {run}: the upstream runs in its directory"
        );
        let load = Command::new(python())
            .arg(repo_root().join("tests/fixtures/mcp_server/kill_load.py"))
            .args([
                url.as_str(),
                "8",
                &answered_file.display().to_string(),
                &format!("r{run}"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Long enough for hundreds of calls, and a different moment in each run.
        tokio::time::sleep(Duration::from_millis(1500 + 137 * u64::from(run))).await;
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        child.wait().await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(60), load.wait_with_output())
            .await
            .expect("the load ends once the server is gone")
            .unwrap();
        let answers: u64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("run {run}: {}", String::from_utf8_lossy(&out.stderr)));
        assert!(
            answers > 0,
            "run {run}: no call was answered before the kill"
        );

        // No upstream outlives the server.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !processes_in(&upstream_dir).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            processes_in(&upstream_dir),
            Vec::<String>::new(),
            "run {run}: upstream processes outlived the killed server"
        );

        // The store is sound, read as the next start reads it.
        let check: String = rusqlite::Connection::open(&db)
            .unwrap()
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "run {run}");

        let answered: BTreeSet<String> = std::fs::read_to_string(&answered_file)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(&format!("r{run}-")))
            .map(str::to_owned)
            .collect();
        let logged = logged_messages(&db);
        let missing = answered.difference(&logged).count();
        println!(
            "run {run}: {} calls answered, {missing} of them missing from the log",
            answered.len()
        );
        missing_per_run.push((answered.len(), missing));
    }
    // The next start after the last kill finds the store sound and serves.
    let mut child = Command::new(quiver_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("a restart after the kills serves")
        .unwrap();
    assert!(url.is_some());
    missing_per_run
}
