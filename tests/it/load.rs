//! Load, three times over in one `quiver serve`: many sessions over streamable HTTP, a
//! number at a time, half the calls to a core tool (`describe_tool`) and half to a stdio
//! upstream (server-everything's `echo`), each session closed with `DELETE`. Every call is
//! answered without error, the execution log has one row per call, and the process's open
//! files, threads and the allocator's bytes in use (SQLite's page caches aside) do not grow from the
//! second run to the third (a leak per session or per call would). The bytes in use are
//! `/metrics`' `quiver_process_heap_in_use_bytes` less `quiver_process_store_engine_bytes`:
//! what the allocator keeps after a free is not in them, so a leak shows there and not only
//! in the RSS. The resident memory is read after the allocator has given back what a run
//! freed (`quiver serve` trims it every 10 s), and its anonymous part may grow only with the
//! heap in use. RSS (by kind), the heap, threads and files after each run are printed.
//!
//! CI runs it small; the size comes from `QUIVER_LOAD_SESSIONS`, `QUIVER_LOAD_CALLS` and
//! `QUIVER_LOAD_CONCURRENCY`, and `QUIVER_LOAD_RUNS` (at least 3) sets how many runs there
//! are, the checks comparing the last two (`docs/RELIABILITY.md` has the full run:
//! 1,000 × 100, 64 at a time).

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::mcp_server::{Server, everything_bin, fresh_dir, quiver_binary};

fn size(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{var}={v:?} is not a number"))
        })
        .unwrap_or(default)
}

/// What `/proc` says of `pid`: resident KiB (all, anonymous, file-backed), threads, open
/// files.
fn process(pid: u32) -> ((u64, u64, u64), u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    let files = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (
        (field("VmRSS:"), field("RssAnon:"), field("RssFile:")),
        field("Threads:"),
        files,
    )
}

/// The resident KiB of `pid` in the allocator's heaps and in thread stacks, from
/// `/proc/<pid>/smaps`: a heap is the main `[heap]` or a thread arena (a read-write
/// anonymous mapping with the reserved rest of its region after it), a stack a read-write
/// anonymous mapping right above a guard page.
fn heaps_and_stacks(pid: u32) -> (u64, u64) {
    struct Map {
        lo: u64,
        hi: u64,
        perms: String,
        anonymous: bool,
        brk: bool,
        rss: u64,
    }
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut maps: Vec<Map> = Vec::new();
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let Some((lo, hi)) = fields.first().and_then(|r| r.split_once('-'))
            && let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
        {
            let name = fields.get(5).copied().unwrap_or("");
            maps.push(Map {
                lo,
                hi,
                perms: fields[1].to_owned(),
                anonymous: fields.get(4) == Some(&"0") && (name.is_empty() || name == "[heap]"),
                brk: name == "[heap]",
                rss: 0,
            });
        } else if let (Some(&"Rss:"), Some(kib), Some(map)) =
            (fields.first(), fields.get(1), maps.last_mut())
        {
            map.rss = kib.parse().unwrap_or(0);
        }
    }
    let (mut heaps, mut stacks) = (0, 0);
    for (i, m) in maps.iter().enumerate() {
        if !m.anonymous || m.perms != "rw-p" {
            continue;
        }
        let guard_below = i > 0
            && maps[i - 1].perms == "---p"
            && maps[i - 1].hi == m.lo
            && maps[i - 1].hi - maps[i - 1].lo <= 64 << 10;
        let reserve_above = maps
            .get(i + 1)
            .is_some_and(|n| n.perms == "---p" && n.lo == m.hi);
        if guard_below {
            stacks += m.rss;
        } else if reserve_above || m.brk {
            heaps += m.rss;
        }
    }
    (heaps, stacks)
}

/// The value of the series `name` in a `/metrics` text.
fn sample(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics: {metrics}"))
}

/// Rows in the execution log, once the writer has caught up with `want` (or the wait ends).
fn rows(db: &Path, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: u64 = rusqlite::Connection::open(db)
            .and_then(|c| c.query_row("SELECT count(*) FROM execution_log", [], |r| r.get(0)))
            .unwrap_or(0);
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_load_runs_answer_every_call_log_every_row_and_leak_nothing() {
    let sessions = size("QUIVER_LOAD_SESSIONS", 40);
    let calls = size("QUIVER_LOAD_CALLS", 10);
    let concurrency = size("QUIVER_LOAD_CONCURRENCY", 8);
    let runs = size("QUIVER_LOAD_RUNS", 3).max(3);
    let dir = fresh_dir();
    std::fs::write(
        dir.join("quiver.toml"),
        format!(
            "[store]\npath = \"load.db\"\n\n[surface]\nanchors = [\"mcp__everything__echo\"]\n\n[[mcp.servers]]\nname = \"everything\"\ncommand = {:?}\nrequired = true\n",
            everything_bin().display().to_string()
        ),
    )
    .unwrap();
    let metrics_port = crate::identity::free_port();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let mut server = Server::start_in(
        quiver_binary(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            &metrics_listen,
        ],
        &dir,
    )
    .await;
    let pid = server.pid();
    let mut after = Vec::new();
    // The heap in use without SQLite's page caches (which fill up to their bound as the
    // log grows) after each run.
    let mut own: Vec<u64> = Vec::new();
    // The anonymous resident memory and SQLite's share of the heap after each run.
    let mut resident: Vec<(u64, u64)> = Vec::new();
    for run in 1..=runs {
        let url = server.url.clone();
        let out = tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_quiver-serve-bench"))
                .args([
                    "load",
                    &url,
                    &sessions.to_string(),
                    &calls.to_string(),
                    &concurrency.to_string(),
                    "describe_tool",
                    "describe",
                    "mcp__everything__echo",
                    "echo",
                ])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["errors"], 0, "run {run}: {report}");
        assert_eq!(report["answered"], sessions * calls, "run {run}: {report}");
        let logged = rows(&dir.join("load.db"), run * sessions * calls);
        assert_eq!(
            logged,
            run * sessions * calls,
            "run {run}: one row per call"
        );
        // The resident memory is read after the allocator's next trim (every 10 s), which
        // gives back the pages the run freed: what stays resident is what is in use.
        let trims = sample(
            &crate::identity::scrape(metrics_port).await,
            "quiver_process_heap_trims_total",
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let metrics = loop {
            let metrics = crate::identity::scrape(metrics_port).await;
            if sample(&metrics, "quiver_process_heap_trims_total") > trims {
                break metrics;
            }
            assert!(
                Instant::now() < deadline,
                "no trim of the allocator within 30 s: {metrics}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let ((rss, anon, file), threads, files) = process(pid);
        let (heaps, stacks) = heaps_and_stacks(pid);
        let rest = anon.saturating_sub(heaps + stacks);
        let gauge = |name: &str| sample(&metrics, name);
        let heap = gauge("quiver_process_heap_in_use_bytes");
        let sqlite = gauge("quiver_process_store_engine_bytes");
        let free = gauge("quiver_process_heap_free_bytes");
        println!(
            "run {run}: {} calls in {} s ({} calls/s); RSS {rss} KiB ({file} file-backed; {anon} anonymous: {heaps} in the allocator's heaps, {stacks} in thread stacks, {rest} else: the binary's written pages, large blocks), heap in use {} KiB (SQLite {} KiB, the rest {} KiB), heap kept free {} KiB, {threads} threads, {files} open files",
            report["calls"],
            report["seconds"],
            report["calls_per_s"],
            heap / 1024,
            sqlite / 1024,
            heap.saturating_sub(sqlite) / 1024,
            free / 1024,
        );
        after.push((rss, threads, files));
        own.push(heap.saturating_sub(sqlite));
        resident.push((anon << 10, sqlite));
    }
    // A few descriptors may be in flight (a connection the kernel has not closed yet); a
    // leak per session or per call would be many more.
    let (before_last, last) = (after[after.len() - 2].2, after[after.len() - 1].2);
    assert!(
        last <= before_last + 4,
        "open files grew from {before_last} to {last} over the last run"
    );
    // Threads come and go with the runtime's blocking pool (up to one per call at once,
    // each leaving after 10 s idle); a thread kept per session would be many more.
    let (before_last, last) = (after[after.len() - 2].1, after[after.len() - 1].1);
    assert!(
        last <= before_last + concurrency + 8,
        "threads grew from {before_last} to {last} over the last run"
    );
    // A leak grows the heap in use with every call. Allowed: a byte per call of the last
    // run and 256 KiB, for maps that grow their capacity and the threads' allocator
    // caches; a leak of a few bytes per call at full size, or of a session's state per
    // session, is over it.
    let (before_last, last) = (own[own.len() - 2], own[own.len() - 1]);
    let slack = sessions * calls + (256 << 10);
    assert!(
        last <= before_last + slack,
        "the heap in use (SQLite's caches aside) grew from {before_last} to {last} bytes over the last run ({} calls)",
        sessions * calls
    );
    // After the allocator's trim, the anonymous resident memory follows the heap in use: it
    // may grow by what the heap check allows, by SQLite's caches filling (bounded), and by
    // 1 MiB of pages partly in use and the threads' stacks; what a burst freed is given
    // back, so it does not grow with the calls.
    let ((before_last, sqlite_before), (last, sqlite_last)) =
        (resident[resident.len() - 2], resident[resident.len() - 1]);
    let allowed = slack + sqlite_last.saturating_sub(sqlite_before) + (1 << 20);
    assert!(
        last <= before_last + allowed,
        "the anonymous resident memory grew from {} to {} KiB over the last run (allowed: {} KiB)",
        before_last >> 10,
        last >> 10,
        allowed >> 10
    );
    let status = server.terminate().await;
    assert!(status.success(), "quiver serve exits cleanly: {status}");
}
