//! The process's allocator: what it holds, and giving its free pages back.
//!
//! glibc keeps memory freed by the program in its heaps (one per arena, and a server with
//! many calls at once uses several) to hand out again, so the resident memory stays at the
//! high-water mark of a burst. [`spawn_trimmer`] asks it every [`TRIM_EVERY`] to return
//! the whole free pages to the system (`malloc_trim`), as long-running servers on glibc do:
//! the resident memory then follows what is in use rather than the largest burst so far.
//! On other systems both are no-ops.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// How often the allocator is asked to give its free pages back.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

static TRIMS: AtomicU64 = AtomicU64::new(0);

/// The allocator's bytes in use (its heaps' allocated chunks and its mmapped ones) and the
/// bytes it keeps free in its heaps, over every arena; `None` where the allocator does not
/// say.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap() -> Option<(u64, u64)> {
    // SAFETY: mallinfo2 takes no arguments and only reads the allocator's own counters,
    // under its arenas' locks.
    #[allow(unsafe_code)]
    let info = unsafe { libc::mallinfo2() };
    Some(((info.uordblks + info.hblkhd) as u64, info.fordblks as u64))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap() -> Option<(u64, u64)> {
    None
}

/// How many times the allocator has been asked to give its free pages back.
pub fn trims() -> u64 {
    TRIMS.load(Ordering::Relaxed)
}

/// Asks the allocator to give every whole free page of its heaps back to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only walks the allocator's own free lists, under its arenas'
    // locks, and releases pages no allocation is using.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
    TRIMS.fetch_add(1, Ordering::Relaxed);
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

/// Gives the allocator's free pages back every [`TRIM_EVERY`] until the task is aborted.
/// The walk takes each arena's lock in turn, so it runs on the blocking pool, off the
/// threads that serve calls.
pub fn spawn_trimmer() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(TRIM_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let _ = tokio::task::spawn_blocking(trim).await;
        }
    })
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[test]
    fn a_trim_gives_freed_pages_back() {
        // 64 MiB in blocks under glibc's mmap threshold, so they come from a heap, then
        // all but the last freed: the freed pages stay with the allocator until a trim.
        let blocks: Vec<Vec<u8>> = (0..1024).map(|_| vec![1u8; 64 << 10]).collect();
        let resident = || -> u64 {
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap()
        };
        let mut blocks = blocks;
        let last = blocks.pop();
        drop(blocks);
        let before = resident();
        let trims_before = trims();
        trim();
        let after = resident();
        assert_eq!(trims() - trims_before, 1);
        assert!(
            after + 32 * 1024 < before,
            "a trim gives most of 64 MiB freed back: resident {before} KiB before, {after} KiB after"
        );
        drop(last);
    }
}
