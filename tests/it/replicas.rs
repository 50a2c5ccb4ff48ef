//! Two `quiver serve` replicas sharing one PostgreSQL store (a server the test starts with
//! `quiver_store_testkit::TestPostgres`), driven by the official Python MCP client: custom
//! tools approved elsewhere reach both replicas' clients, a stateless conversation keeps its
//! working set across them, `quiver log` reads both; one replica killed with SIGKILL under
//! load, the other keeps serving and logs every call it answered, and with `[store]
//! durability = "strict"` (PostgreSQL, and a SQLite file two replicas share) no call the
//! killed one answered is missing from the log either; a custom-tool job of a replica
//! killed mid-job released to the other and run there once; a database that goes away
//! and comes back under a serving replica; a database `serve` cannot use; and `quiver store
//! migrate`.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use quiver_store_testkit::TestPostgres;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

use crate::mcp_server::{fresh_dir, line_of, peers, quiver_binary, repo_root};

/// The variable the replicas' config reads the database URL from (`${env:...}`), so the
/// password is in no file.
const URL_VAR: &str = "QUIVER_TEST_PG_URL";

/// A replica; killed when dropped.
struct Replica {
    child: Child,
    url: String,
}

/// A directory whose `quiver.toml` names the test's database, through [`URL_VAR`].
fn configured_dir() -> PathBuf {
    let dir = fresh_dir();
    std::fs::write(
        dir.join("quiver.toml"),
        format!("[store]\nurl = \"${{env:{URL_VAR}}}\"\n"),
    )
    .expect("write quiver.toml");
    dir
}

async fn start_replica(dir: &Path, db_url: &str) -> Replica {
    let mut child = Command::new(quiver_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env(URL_VAR, db_url)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("quiver serve starts");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let url = line_of(&mut lines).await;
    assert!(url.ends_with("/mcp"), "{url}");
    // The rest of stdout is drained, so the replica never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Replica { child, url }
}

/// Runs a fixture script with the venv's Python and `env`; returns its stdout. A failing
/// script fails the test.
async fn script(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let py = peers().join("venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash .ci/setup-peers` to install the Python MCP client",
        py.display()
    );
    let path = repo_root().join("tests/fixtures/mcp_server").join(name);
    let child = Command::new(py)
        .arg(&path)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{name} did not finish in time"))
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn database() -> (TestPostgres, String) {
    let pg = TestPostgres::start();
    pg.create_database("quiver");
    let url = pg.url("quiver");
    (pg, url)
}

#[tokio::test]
async fn two_replicas_share_custom_tools_working_sets_and_the_log() {
    let (_pg, db) = database();
    let (dir_a, dir_b, dir_cli) = (configured_dir(), configured_dir(), configured_dir());
    let a = start_replica(&dir_a, &db).await;
    let b = start_replica(&dir_b, &db).await;
    let binary = quiver_binary();
    script(
        "replicas.py",
        &[
            &a.url,
            &b.url,
            binary.to_str().expect("utf-8 path"),
            dir_cli.to_str().expect("utf-8 path"),
        ],
        &[(URL_VAR, &db)],
    )
    .await;
    // `quiver status` names the shared store with its password masked.
    let status = std::process::Command::new(&binary)
        .arg("status")
        .env(URL_VAR, &db)
        .current_dir(&dir_cli)
        .output()
        .expect("quiver status runs");
    let text = String::from_utf8_lossy(&status.stdout).into_owned()
        + &String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "{text}");
    assert!(text.contains("PostgreSQL, shared"), "{text}");
    assert!(
        !text.contains(quiver_store_testkit::PASSWORD_FOR_TESTS),
        "the password is masked: {text}"
    );
    drop((a, b));
}

/// The admin page's logins are kept in the shared store: a login on one replica holds on
/// the other, and a logout on either ends it on both (`admin_replicas.py`, plain HTTP).
#[tokio::test]
async fn an_admin_login_on_one_replica_holds_on_the_other() {
    const TOKEN: &str = "admin-token-of-two-replicas";
    let (_pg, db) = database();
    let with_admin = || {
        let dir = configured_dir();
        let config = std::fs::read_to_string(dir.join("quiver.toml")).expect("read");
        std::fs::write(
            dir.join("quiver.toml"),
            format!("{config}\n[admin]\ntoken = \"{TOKEN}\"\n"),
        )
        .expect("write quiver.toml");
        dir
    };
    let (dir_a, dir_b) = (with_admin(), with_admin());
    let a = start_replica(&dir_a, &db).await;
    let b = start_replica(&dir_b, &db).await;
    script("admin_replicas.py", &[&a.url, &b.url, TOKEN], &[]).await;
    drop((a, b));
}

/// Two replicas on one store with different `[custom] job_stale_secs`: the second to start
/// warns, naming both bounds and the other replica.
#[tokio::test]
async fn replicas_with_different_job_stale_bounds_are_warned() {
    let (pg, db) = database();
    let dir_a = configured_dir();
    let a = start_replica(&dir_a, &db).await;
    // A's bound is written as its job worker starts.
    let written = || {
        pg.psql(
            "quiver",
            "SELECT value FROM surface_state WHERE key = 'custom/job_stale_secs'",
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !written().contains("\"secs\":30") {
        assert!(
            std::time::Instant::now() < deadline,
            "A wrote no bound: {}",
            written()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dir_b = configured_dir();
    let config = std::fs::read_to_string(dir_b.join("quiver.toml")).expect("read");
    std::fs::write(
        dir_b.join("quiver.toml"),
        format!("{config}\n[custom]\njob_stale_secs = 12\n"),
    )
    .expect("write quiver.toml");
    let mut b = Command::new(quiver_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env(URL_VAR, &db)
        .current_dir(&dir_b)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("quiver serve starts");
    let mut lines = BufReader::new(b.stderr.take().expect("piped")).lines();
    let warned = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("job_stale_secs is 12 here, and 30 on") {
                return line;
            }
        }
        String::new()
    })
    .await
    .expect("B warned within 30 s");
    assert!(
        warned.contains("give every replica the same bound"),
        "{warned}"
    );
    drop((a, b));
}

/// One stateless conversation alternating between two replicas, with a working set of
/// two tools at most: a tool one replica evicts stays evicted on the other, which neither
/// lists it nor writes it back (`replicas_evict.py`).
#[tokio::test]
async fn an_eviction_on_one_replica_holds_on_the_other() {
    let (_pg, db) = database();
    let config = format!(
        "[store]\nurl = \"${{env:{URL_VAR}}}\"\n\n[surface]\nfloor_cache_ttl_secs = 3600\n\n[surface.working_set]\nmax_tools = 2\n\n[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\nrequired = true\n",
        crate::mcp_server::everything_bin().display().to_string()
    );
    let (dir_a, dir_b) = (fresh_dir(), fresh_dir());
    for dir in [&dir_a, &dir_b] {
        std::fs::write(dir.join("quiver.toml"), &config).expect("write quiver.toml");
    }
    let a = start_replica(&dir_a, &db).await;
    let b = start_replica(&dir_b, &db).await;
    script("replicas_evict.py", &[&a.url, &b.url], &[]).await;
    drop((a, b));
}

/// A model's parallel calls of one conversation, spread over two replicas: A pages in one
/// tool and B another at once, and both replicas then list both (the second write merges
/// the first instead of overwriting it), over several conversations
/// (`replicas_parallel.py`).
#[tokio::test]
async fn parallel_calls_of_one_conversation_on_two_replicas_keep_both_finds() {
    let (_pg, db) = database();
    let config = format!(
        "[store]\nurl = \"${{env:{URL_VAR}}}\"\n\n[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\nrequired = true\n",
        crate::mcp_server::everything_bin().display().to_string()
    );
    let (dir_a, dir_b) = (fresh_dir(), fresh_dir());
    for dir in [&dir_a, &dir_b] {
        std::fs::write(dir.join("quiver.toml"), &config).expect("write quiver.toml");
    }
    let a = start_replica(&dir_a, &db).await;
    let b = start_replica(&dir_b, &db).await;
    script("replicas_parallel.py", &[&a.url, &b.url], &[]).await;
    drop((a, b));
}

/// The rows of the execution log, as `quiver log --json` prints them.
fn log_rows(dir: &Path, db: &str) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(quiver_binary())
        .args(["log", "--json", "--limit", "100000"])
        .env(URL_VAR, db)
        .current_dir(dir)
        .output()
        .expect("quiver log runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// What a [`kill_one_replica_under_load`] run saw: the queries each replica answered, and
/// those in the log once the load ended.
struct KillRun {
    answered_a: Vec<String>,
    answered_b: Vec<String>,
    /// Reads the log's queries again.
    log: Box<dyn Fn() -> BTreeSet<String>>,
}

impl KillRun {
    /// How many of `answered` are not in `logged`.
    fn missing(answered: &[String], logged: &BTreeSet<String>) -> Vec<String> {
        answered
            .iter()
            .filter(|q| !logged.contains(*q))
            .cloned()
            .collect()
    }
}

/// Two replicas whose `quiver.toml` holds `store` (a `[store]` table), `clients` clients
/// on each calling `tool_search` `calls` times; replica A is killed with SIGKILL once its
/// rows reach the log. Replica B must answer every call (the script fails otherwise).
async fn kill_one_replica_under_load(
    store: &str,
    db: &str,
    clients: usize,
    calls: usize,
) -> KillRun {
    let dirs = [fresh_dir(), fresh_dir()];
    for dir in &dirs {
        std::fs::write(dir.join("quiver.toml"), store).expect("write quiver.toml");
    }
    let mut a = start_replica(&dirs[0], db).await;
    let b = start_replica(&dirs[1], db).await;
    let (url_a, url_b) = (a.url.clone(), b.url.clone());
    let load = tokio::spawn({
        let db = db.to_owned();
        let (calls, clients) = (calls.to_string(), clients.to_string());
        async move {
            script(
                "replica_load.py",
                &[&url_a, &url_b, &calls, "--clients", &clients],
                &[(URL_VAR, &db)],
            )
            .await
        }
    });
    let dir = dirs[1].clone();
    let db_owned = db.to_owned();
    let queries = move || -> BTreeSet<String> {
        log_rows(&dir, &db_owned)
            .iter()
            .filter_map(|r| r["input"]["query"].as_str().map(str::to_owned))
            .collect()
    };
    // Kill A once it has answered calls: its rows reach the log.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while queries()
        .iter()
        .filter(|q| q.starts_with("load-a-"))
        .count()
        < 20
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica A answered no calls"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.child.start_kill().expect("SIGKILL replica A");
    a.child.wait().await.expect("A is gone");
    let out = load.await.expect("the load script");
    let answered: serde_json::Value = serde_json::from_str(
        out.lines()
            .last()
            .expect("the script prints what was answered"),
    )
    .expect("JSON");
    let list = |k: &str| -> Vec<String> {
        answered[k]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let run = KillRun {
        answered_a: list("a"),
        answered_b: list("b"),
        log: Box::new(queries),
    };
    assert_eq!(
        run.answered_b.len(),
        clients * calls,
        "replica B answered every call"
    );
    assert!(
        run.answered_a.len() < clients * calls,
        "replica A was killed before it answered everything"
    );
    drop(b);
    run
}

/// The default (batched) log: replica B's rows reach the log within milliseconds of their
/// answers; replica A's last ones may be lost with it, and are counted.
#[tokio::test]
async fn a_replica_killed_under_load_leaves_the_other_serving_and_logging() {
    let (_pg, db) = database();
    let store = format!("[store]\nurl = \"${{env:{URL_VAR}}}\"\n");
    let run = kill_one_replica_under_load(&store, &db, 1, 300).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let logged = loop {
        let logged = (run.log)();
        if KillRun::missing(&run.answered_b, &logged).is_empty()
            || tokio::time::Instant::now() >= deadline
        {
            break logged;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let lost_a = KillRun::missing(&run.answered_a, &logged).len();
    println!(
        "batched: replica A answered {} call(s) before it was killed; {lost_a} of them are missing from the log",
        run.answered_a.len()
    );
    assert_eq!(
        KillRun::missing(&run.answered_b, &logged),
        Vec::<String>::new(),
        "every call replica B answered is in the log"
    );
}

/// `[store] durability = "strict"` on PostgreSQL: an answer leaves only once its row is
/// committed, so when the load ends every call either replica answered is already in the
/// log, those of the killed replica included. The linger is the longest allowed (1 s):
/// batched rows would wait that long, and a kill would take a second of answered calls
/// with it; strict rows do not wait for it.
#[tokio::test]
async fn strict_durability_on_postgres_loses_no_answered_call_to_a_kill() {
    let (_pg, db) = database();
    let store = format!(
        "[store]\nurl = \"${{env:{URL_VAR}}}\"\ndurability = \"strict\"\nlog_linger_ms = 1000\n"
    );
    let run = kill_one_replica_under_load(&store, &db, 4, 150).await;
    check_nothing_answered_is_missing(&run);
}

/// The same with two replicas on one SQLite file; the file then passes the integrity
/// check and the log's chain verifies.
#[tokio::test]
async fn strict_durability_on_sqlite_loses_no_answered_call_to_a_kill() {
    let shared = fresh_dir().join("shared.db");
    let store = format!(
        "[store]\npath = \"{}\"\ndurability = \"strict\"\nlog_linger_ms = 1000\n",
        shared.display()
    );
    let run = kill_one_replica_under_load(&store, "unused", 4, 150).await;
    check_nothing_answered_is_missing(&run);
    let conn = rusqlite::Connection::open(&shared).expect("the file opens");
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check runs");
    assert_eq!(integrity, "ok");
}

/// Every answered call of a strict run is in the log, read once, right after the load.
fn check_nothing_answered_is_missing(run: &KillRun) {
    let logged = (run.log)();
    let lost_a = KillRun::missing(&run.answered_a, &logged);
    println!(
        "strict: replica A answered {} call(s) before it was killed; {} of them are missing from the log; replica B answered {}",
        run.answered_a.len(),
        lost_a.len(),
        run.answered_b.len()
    );
    assert_eq!(
        lost_a,
        Vec::<String>::new(),
        "every call A answered is logged"
    );
    assert_eq!(
        KillRun::missing(&run.answered_b, &logged),
        Vec::<String>::new(),
        "every call B answered is logged"
    );
}

/// The custom-tool jobs of `tool`, oldest first, as stored: id, type, status, progress,
/// result.
fn tool_jobs(pg: &TestPostgres, tool: &str) -> Vec<serde_json::Value> {
    let json = pg.psql(
        "quiver",
        &format!(
            "SELECT coalesce(json_agg(j ORDER BY j.created_at, j.id), '[]') FROM (
                 SELECT id, job_type, status, progress_pct, result, created_at
                 FROM tool_jobs WHERE tool_name = '{tool}') j"
        ),
    );
    serde_json::from_str::<Vec<serde_json::Value>>(&json).expect("JSON")
}

/// Waits (up to `limit`) for the jobs of `tool` to satisfy `ok`; returns them.
async fn jobs_become(
    pg: &TestPostgres,
    tool: &str,
    what: &str,
    limit: Duration,
    ok: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let jobs = tool_jobs(pg, tool);
        if ok(&jobs) {
            return jobs;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the jobs of `{tool}` never {what}: {jobs:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A custom tool's build job claimed by replica A, which is killed with SIGKILL in the
/// middle of its test cases (each busy for about 2 s in the sandbox): replica B, running
/// beside A all along, leaves A's job alone while A's heartbeat goes on, and once it stops
/// (`[custom] job_stale_secs = 3` here) releases it (`failed`, interrupted), claims it
/// again and runs it to its end. The job ran to completion once, and the tool has its
/// results, awaiting approval.
#[tokio::test]
async fn a_job_of_a_killed_replica_is_released_to_the_other_and_runs_once() {
    a_replica_stops_mid_job(Stop::Kill).await;
}

/// The same job, replica A stopped with SIGTERM instead: it hands the job back as it stops
/// (`failed`, "the server running it stopped"), so B runs it at once, although the stale
/// bound (`[custom] job_stale_secs = 3600` here) is far off.
#[tokio::test]
async fn a_replica_stopped_mid_job_hands_the_job_back_at_once() {
    a_replica_stops_mid_job(Stop::Term).await;
}

/// How replica A is stopped mid-job.
#[derive(Clone, Copy, PartialEq)]
enum Stop {
    Kill,
    Term,
}

async fn a_replica_stops_mid_job(stop: Stop) {
    let (pg, db) = database();
    const CASES: usize = 6;
    let stale = match stop {
        Stop::Kill => 3,
        Stop::Term => 3600,
    };
    let config = format!(
        "[store]\nurl = \"${{env:{URL_VAR}}}\"\n\n[custom]\njob_stale_secs = {stale}\n\n[sandbox]\nwall_time_ms = 30000\n\n[[auth.tokens]]\nname = \"lead\"\ntoken = \"lead-secret-123456\"\nadmin = true\n"
    );
    let dirs = [fresh_dir(), fresh_dir(), fresh_dir()];
    for dir in &dirs {
        std::fs::write(dir.join("quiver.toml"), &config).expect("write quiver.toml");
    }
    let mut a = start_replica(&dirs[0], &db).await;
    let tests: Vec<serde_json::Value> = (0..CASES)
        .map(|i| serde_json::json!({"inputs": {"a": i, "b": 1, "ms": 2000}, "expect": i + 1}))
        .collect();
    let proposal = serde_json::json!({
        "name": "slow_sum",
        "description": "Adds two numbers, slowly.",
        "input_schema": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}, "ms": {"type": "number"}}},
        "source": "async function main(inputs) {\n  const end = Date.now() + inputs.ms;\n  let spins = 0;\n  while (Date.now() < end) { spins++; }\n  return inputs.a + inputs.b;\n}",
        "tests": tests,
    })
    .to_string();
    // Proposed by a one-shot `quiver call` on the store: only A runs a job worker now.
    let out = std::process::Command::new(quiver_binary())
        .args(["call", "create_custom_tool", &proposal, "--token", "lead"])
        .env(URL_VAR, &db)
        .current_dir(&dirs[2])
        .output()
        .expect("quiver call runs");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("build_job"), "{said}");

    let minute = Duration::from_secs(60);
    let running = jobs_become(&pg, "slow_sum", "ran on A", minute, |jobs| {
        jobs.len() == 1 && jobs[0]["status"] == "testing"
    })
    .await;
    let first = running[0]["id"].as_str().expect("an id").to_owned();
    let b = start_replica(&dirs[1], &db).await;
    // B is up and looking for stale jobs; A finishes a case after that, its job still its
    // own: kill A there, mid-job.
    let pct = |job: &serde_json::Value| job["progress_pct"].as_u64().unwrap_or(0);
    let mid = jobs_become(&pg, "slow_sum", "progressed on A", minute, |jobs| {
        jobs.len() != 1 || jobs[0]["status"] != "testing" || pct(&jobs[0]) > 0
    })
    .await;
    assert_eq!(mid.len(), 1, "B took no job from the live A: {mid:#?}");
    assert_eq!(mid[0]["status"], "testing", "{mid:#?}");
    assert!(pct(&mid[0]) < 100, "A is mid-job: {mid:#?}");
    match stop {
        Stop::Kill => a.child.start_kill().expect("SIGKILL replica A"),
        Stop::Term => {
            let pid = a.child.id().expect("A runs").to_string();
            let sent = std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .expect("kill runs");
            assert!(sent.success(), "SIGTERM replica A");
        }
    }
    let status = a.child.wait().await.expect("A is gone");
    if stop == Stop::Term {
        assert!(status.success(), "A stops cleanly on SIGTERM: {status}");
    }

    let done = jobs_become(
        &pg,
        "slow_sum",
        "ran again to the end",
        Duration::from_secs(120),
        |jobs| {
            jobs.len() >= 2
                && jobs.iter().all(|j| {
                    ["approved", "rejected", "failed"].contains(&j["status"].as_str().unwrap_or(""))
                })
        },
    )
    .await;
    assert_eq!(done.len(), 2, "released once, run again once: {done:#?}");
    let (old, new) = (&done[0], &done[1]);
    assert_eq!(old["id"], first.as_str());
    assert_eq!(old["status"], "failed", "{old:#}");
    let why = old["result"]["interrupted"].as_str().unwrap_or_default();
    let expected = match stop {
        Stop::Kill => "no heartbeat",
        Stop::Term => "the server running it stopped",
    };
    assert!(why.contains(expected), "{old:#}");
    assert_eq!(
        (&new["job_type"], &new["status"], pct(new)),
        (
            &serde_json::json!("build"),
            &serde_json::json!("approved"),
            100
        ),
        "{new:#}"
    );
    let finished: Vec<_> = done.iter().filter(|j| j["status"] != "failed").collect();
    assert_eq!(
        finished.len(),
        1,
        "one finished job for version 1: {done:#?}"
    );
    assert_eq!(new["result"]["version"], 1, "{new:#}");

    let shown = std::process::Command::new(quiver_binary())
        .args(["custom", "show", "slow_sum"])
        .env(URL_VAR, &db)
        .current_dir(&dirs[2])
        .output()
        .expect("quiver custom show runs");
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("show prints JSON");
    assert_eq!(shown["status"], "testing", "awaiting approval: {shown:#}");
    let results = &shown["test_results"];
    assert_eq!(results["passed"], true, "{shown:#}");
    assert_eq!(results["job"], new["id"], "{shown:#}");
    assert_eq!(
        results["cases"].as_array().map(Vec::len),
        Some(CASES),
        "{shown:#}"
    );
    drop(b);
}

/// `quiver store migrate` copies a SQLite store (definitions and a custom tool, its jobs, the
/// log, a working set) into PostgreSQL, checks every row is there, and adds nothing when run
/// again; a replica on the database then serves the custom tool and `quiver log` shows the
/// old calls.
#[tokio::test]
async fn a_sqlite_store_moves_into_postgres_and_a_second_move_adds_nothing() {
    let (_pg, db) = database();
    let old = fresh_dir();
    let quiver = |dir: &Path, args: &[&str]| {
        let out = std::process::Command::new(quiver_binary())
            .args(args)
            .env(URL_VAR, &db)
            // `store migrate --to` from the environment: the password stays off the
            // command line.
            .env("QUIVER_STORE_URL", &db)
            .current_dir(dir)
            .output()
            .expect("quiver runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "quiver {args:?}: {text}");
        text
    };
    std::fs::write(
        old.join("up.js"),
        "async function main(inputs) { return inputs.text.toUpperCase(); }",
    )
    .unwrap();
    std::fs::write(
        old.join("up.schema.json"),
        r#"{"type": "object", "properties": {"text": {"type": "string"}}}"#,
    )
    .unwrap();
    std::fs::write(
        old.join("up.tests.json"),
        r#"[{"inputs": {"text": "a"}, "expect": "A"}]"#,
    )
    .unwrap();
    quiver(
        &old,
        &[
            "custom",
            "add",
            "up.js",
            "--name",
            "upper_case",
            "--description",
            "Turns a text into capitals.",
            "--schema",
            "up.schema.json",
            "--tests",
            "up.tests.json",
        ],
    );
    quiver(&old, &["custom", "approve", "upper_case"]);
    quiver(
        &old,
        &[
            "call",
            "--session",
            "moved",
            "tool_search",
            r#"{"query": "turn a text into capitals"}"#,
        ],
    );
    // More calls than one page of the copy holds (pages of 2 rows below).
    for query in ["read a file", "list a directory"] {
        quiver(
            &old,
            &[
                "call",
                "--session",
                "moved",
                "tool_search",
                &format!(r#"{{"query": "{query}"}}"#),
            ],
        );
    }
    let sqlite = old.join("quiver.db");
    let rows: u64 = rusqlite::Connection::open(&sqlite)
        .expect("peek")
        .query_row("SELECT count(*) FROM execution_log", [], |r| r.get(0))
        .expect("count");
    assert!(rows >= 3, "{rows} log rows");
    let sqlite = sqlite.to_str().expect("utf-8 path");
    let first = quiver(
        &old,
        &["store", "migrate", "--from", sqlite, "--page-rows", "2"],
    );
    assert!(first.contains("verified: every row"), "{first}");
    assert!(
        first.contains(&format!("{rows} log row(s),")),
        "every log row is read: {first}"
    );
    let pages = rows.div_ceil(2);
    assert!(
        first.contains(&format!("the log in {pages} page(s) of at most 2 rows")),
        "{first}"
    );
    assert!(
        !first.contains(quiver_store_testkit::PASSWORD_FOR_TESTS),
        "{first}"
    );
    let again = quiver(
        &old,
        &["store", "migrate", "--from", sqlite, "--page-rows", "2"],
    );
    assert!(
        again.contains(
            "new in PostgreSQL: 0 definition(s), 0 job(s), 0 log row(s), 0 working-set entr(ies), 0 failed approach(es), 0 state key(s)"
        ),
        "{again}"
    );
    assert!(again.contains("verified: every row"), "{again}");

    let dir = configured_dir();
    let logged = log_rows(&dir, &db);
    assert!(
        logged
            .iter()
            .any(|r| r["tool"] == "tool_search"
                && r["input"]["query"] == "turn a text into capitals"),
        "the old call is in the shared log: {logged:?}"
    );
    for query in ["read a file", "list a directory"] {
        assert!(
            logged.iter().any(|r| r["input"]["query"] == query),
            "the call of {query:?}, on a later page, is in the shared log: {logged:?}"
        );
    }
    let called = quiver(&dir, &["call", "upper_case", r#"{"text": "moved"}"#]);
    assert!(
        called.contains("MOVED"),
        "the custom tool moved too: {called}"
    );
    // The moved rows joined the database's chain, with the calls made since.
    let verified = quiver(&dir, &["log", "--verify"]);
    assert!(verified.contains("chain intact"), "{verified}");
}

/// The status line of `GET /readyz` on the server of `mcp_url` (`http://host:port/mcp`).
async fn readyz(mcp_url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = mcp_url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&host)
        .await
        .expect("the replica listens");
    stream
        .write_all(
            format!("GET /readyz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("request sent");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("reply read");
    reply.lines().next().unwrap_or_default().to_owned()
}

/// Waits up to `limit` for `/readyz` to answer `status`.
async fn ready_becomes(mcp_url: &str, status: &str, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if readyz(mcp_url).await.contains(status) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The database goes away under a serving replica: calls are still answered, `/readyz`
/// says 503 (the log cannot be written), and the rows are held; the database comes back:
/// `/readyz` is 200 again and the calls made meanwhile are in the log.
#[tokio::test]
async fn a_replica_keeps_answering_while_postgres_is_away_and_logs_once_it_is_back() {
    let (mut pg, db) = database();
    let dir = configured_dir();
    let replica = start_replica(&dir, &db).await;
    script("one_call.py", &[&replica.url, "before the outage"], &[]).await;
    assert!(readyz(&replica.url).await.contains("200"));

    pg.stop();
    script("one_call.py", &[&replica.url, "during the outage"], &[]).await;
    assert!(
        ready_becomes(&replica.url, "503", Duration::from_secs(30)).await,
        "readiness reports the failing log"
    );

    pg.start_again();
    assert!(
        ready_becomes(&replica.url, "200", Duration::from_secs(30)).await,
        "ready again once the database is back"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let queries: Vec<String> = log_rows(&dir, &db)
            .iter()
            .filter_map(|r| r["input"]["query"].as_str().map(str::to_owned))
            .collect();
        if queries.iter().any(|q| q == "during the outage") {
            assert!(
                queries.iter().any(|q| q == "before the outage"),
                "{queries:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call made during the outage reaches the log: {queries:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(replica);
}

/// `quiver serve` on a database it cannot use stops at once with what to fix, the password
/// masked: a refused password, a database of another application, a URL that is not
/// PostgreSQL's.
#[tokio::test]
async fn serve_refuses_a_database_it_cannot_use_and_says_why() {
    let (pg, db) = database();
    pg.create_database("shop");
    pg.psql("shop", "CREATE TABLE orders (id int)");
    let wrong_password = db.replace(quiver_store_testkit::PASSWORD_FOR_TESTS, "not-the-password");
    let shop = pg.url("shop");
    for (url, want) in [
        (wrong_password.as_str(), "refused the credentials"),
        (shop.as_str(), "not a Quiver store"),
        (
            "mysql://root:pw@127.0.0.1/quiver",
            "is not a PostgreSQL URL",
        ),
    ] {
        let dir = configured_dir();
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            Command::new(quiver_binary())
                .args(["serve", "--listen", "127.0.0.1:0"])
                .env(URL_VAR, url)
                .current_dir(&dir)
                .output(),
        )
        .await
        .expect("serve stops in time")
        .expect("quiver runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}: {text}");
        assert!(text.contains(want), "{want}: {text}");
        for secret in [
            quiver_store_testkit::PASSWORD_FOR_TESTS,
            "not-the-password",
            ":pw@",
        ] {
            assert!(!text.contains(secret), "the password is masked: {text}");
        }
    }
}

/// On a new, empty PostgreSQL database, the commands that only read work and say what is
/// there (nothing yet) without creating a table: `status` says no Quiver tables exist and
/// what creates them; `check`, `tools`, `log` and `log --verify` answer as on an empty store.
#[tokio::test]
async fn read_only_commands_on_an_empty_database_read_it_as_empty() {
    let (pg, db) = database();
    let dir = configured_dir();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(quiver_binary())
            .args(args)
            .env(URL_VAR, &db)
            .current_dir(&dir)
            .output()
            .expect("quiver runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "quiver {args:?}: {text}");
        assert!(
            !text.contains(quiver_store_testkit::PASSWORD_FOR_TESTS),
            "the password is masked: {text}"
        );
        text
    };
    let status = run(&["status"]);
    assert!(
        status.contains("(PostgreSQL, shared): no Quiver tables yet (`quiver serve`, `call` or `search` creates them)"),
        "{status}"
    );
    let check = run(&["check"]);
    assert!(check.contains("config ok"), "{check}");
    let tools = run(&["tools"]);
    assert!(tools.contains("tool_search"), "{tools}");
    let log = run(&["log"]);
    assert!(log.contains("0 call(s)"), "{log}");
    let verify = run(&["log", "--verify"]);
    assert!(verify.contains("chain intact: 0 row(s)"), "{verify}");
    assert_eq!(
        pg.psql(
            "quiver",
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ),
        "0",
        "nothing was created"
    );
}
