//! The worker threads, in tiers by nesting depth: tier `d` runs only the runs of depth `d`,
//! with `threads` threads of its own, started the first time a run of that depth comes. A run
//! waiting for a host call holds its thread, and the nested run that call may start has a
//! greater depth, so it queues on another tier: the wait-for graph follows strictly
//! increasing depth and cannot loop, so no pool size deadlocks. At most
//! `threads × (max_depth + 1)` threads ever exist; a run deeper than the limit is refused
//! before it reaches a tier.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{Arc, Mutex, PoisonError, mpsc},
    thread,
};

use quiver_registry::sandbox::{SandboxError, SandboxOutput};
use tokio::sync::oneshot;

use crate::engine::{self, Job};

/// Each worker thread's stack: QuickJS's own stack limit (1 MiB by default) sits well inside.
pub(crate) const WORKER_STACK: usize = 8 << 20;

/// A job and where its result goes.
pub(crate) struct Task {
    pub(crate) job: Job,
    pub(crate) done: oneshot::Sender<Result<SandboxOutput, SandboxError>>,
}

pub(crate) struct Pool {
    threads: usize,
    tiers: Mutex<Vec<Option<mpsc::Sender<Task>>>>,
}

impl Pool {
    pub(crate) fn new(threads: usize) -> Self {
        Pool {
            threads: threads.max(1),
            tiers: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Queues `task` on the tier of `depth`, starting the tier if it is new.
    pub(crate) fn submit(&self, depth: u32, task: Task) -> Result<(), SandboxError> {
        let depth = depth as usize;
        let mut tiers = self.tiers.lock().unwrap_or_else(PoisonError::into_inner);
        if tiers.len() <= depth {
            tiers.resize_with(depth + 1, || None);
        }
        if tiers[depth].is_none() {
            tiers[depth] = Some(self.start_tier(depth)?);
        }
        let Some(tier) = &tiers[depth] else {
            return Err(gone());
        };
        tier.send(task).map_err(|_| gone())
    }

    fn start_tier(&self, depth: usize) -> Result<mpsc::Sender<Task>, SandboxError> {
        let (tx, rx) = mpsc::channel::<Task>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..self.threads {
            let rx = rx.clone();
            let spawned = thread::Builder::new()
                .name(format!("quiver-js-{depth}-{i}"))
                .stack_size(WORKER_STACK)
                .spawn(move || work(&rx));
            if spawned.is_ok() {
                started += 1;
            }
        }
        if started == 0 {
            return Err(SandboxError::Unavailable(
                "no sandbox worker thread could be started".into(),
            ));
        }
        Ok(tx)
    }
}

fn gone() -> SandboxError {
    SandboxError::Unavailable("the sandbox's worker pool has shut down".into())
}

/// A worker: takes tasks until the pool is dropped.
fn work(rx: &Mutex<mpsc::Receiver<Task>>) {
    loop {
        let task = {
            let rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
            rx.recv()
        };
        let Ok(Task { job, done }) = task else {
            return;
        };
        let result = catch_unwind(AssertUnwindSafe(|| engine::execute(job))).unwrap_or_else(|_| {
            Err(SandboxError::Unavailable(
                "the sandbox worker failed while running the script".into(),
            ))
        });
        let _ = done.send(result);
    }
}
