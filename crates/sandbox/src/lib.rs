//! The QuickJS adapter of the registry's sandbox port: [`QuickJsSandbox`] implements
//! [`Sandbox`] with `rquickjs`. A custom tool is JavaScript source,
//! `async function main(inputs) { ... return result }`, compiled as an ES module. Each run
//! gets a fresh runtime and context on a dedicated worker thread (no state survives a run),
//! with hard limits on wall time (the interrupt handler checks the deadline and the
//! cancellation token), heap, stack, source, inputs, output, logs, result depth, `call_tool`
//! calls and nesting depth. The context holds the language and the prelude's `call_tool`,
//! `log` and `console.log`, nothing else: no module loader, no I/O, no timers, no
//! `SharedArrayBuffer`, no bytecode. `call_tool` sends its request to the async side of
//! [`Sandbox::run`], which awaits the [`SandboxHost`]; the worker blocks for the answer while
//! the script has nothing else to do. See `docs/SANDBOX.md` for the threat model.
//!
//! # Threads and nesting
//!
//! Runs execute on worker threads with an 8 MiB stack, in tiers by nesting depth: tier `d`
//! has `threads` threads (4 by default) and takes only runs of depth `d`. A worker waiting for
//! a host call keeps its thread; a nested custom tool that call starts has a greater depth and
//! runs on the next tier, so waits only ever point to deeper tiers and a pool of any size
//! cannot deadlock while the depth is within the limit. Tiers start on first use, so the
//! threads number at most `threads × (max_depth + 1)` (20 with the defaults). The
//! alternative, releasing the thread while waiting, would need a suspended QuickJS runtime to
//! move between threads, which `rquickjs` does not allow without its `parallel` feature.
//! Validation compiles on a short-lived thread of its own, so it never queues behind runs.
//! [`Sandbox::run`] needs a Tokio runtime with its timer enabled (it gives up on a worker
//! that has not stopped shortly after the deadline).

mod engine;
mod pool;

use std::{
    io,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use futures::stream::{FuturesUnordered, StreamExt};
use quiver_registry::sandbox::{
    Sandbox, SandboxError, SandboxHost, SandboxLimits, SandboxOutput, SandboxRun,
};
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use crate::{
    engine::{Answer, Job},
    pool::{Pool, Task, WORKER_STACK},
};

/// How long past its deadline the async side waits for a worker to notice it before giving
/// up on the run (the worker stops at its next interrupt check all the same).
/// What [`Sandbox::engine`] reports: the engine and the binding's version as `Cargo.lock`
/// pins it (a test keeps the two in step), and this crate's version, since its conversion
/// and limit code is part of what a tool's audit vouched for.
const ENGINE: &str = concat!(
    "quickjs-ng (rquickjs 0.14.0, quiver-sandbox ",
    env!("CARGO_PKG_VERSION"),
    ")"
);

const GRACE: Duration = Duration::from_millis(250);

/// The QuickJS sandbox: a pool of worker threads running custom tools' scripts.
pub struct QuickJsSandbox {
    pool: Arc<Pool>,
}

impl std::fmt::Debug for QuickJsSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuickJsSandbox")
            .field("threads", &self.pool.threads())
            .finish_non_exhaustive()
    }
}

impl Default for QuickJsSandbox {
    /// Four threads per nesting depth.
    fn default() -> Self {
        QuickJsSandbox::new(4)
    }
}

impl QuickJsSandbox {
    /// A sandbox whose runs at each nesting depth share `threads` worker threads (at least
    /// one). Threads start on first use.
    pub fn new(threads: usize) -> Self {
        QuickJsSandbox {
            pool: Arc::new(Pool::new(threads)),
        }
    }
}

#[async_trait]
impl Sandbox for QuickJsSandbox {
    fn engine(&self) -> String {
        ENGINE.to_owned()
    }

    fn validate(&self, source: &str, limits: &SandboxLimits) -> Result<(), SandboxError> {
        if source.len() > limits.source_bytes {
            return Err(SandboxError::SourceTooLarge);
        }
        let (source, limits) = (source.to_owned(), limits.clone());
        std::thread::Builder::new()
            .name("quiver-js-validate".into())
            .stack_size(WORKER_STACK)
            .spawn(move || engine::compile(&source, &limits))
            .map_err(|_| {
                SandboxError::Unavailable("no thread could be started to compile the code".into())
            })?
            .join()
            .unwrap_or_else(|_| {
                Err(SandboxError::Unavailable(
                    "the compiling thread failed".into(),
                ))
            })
    }

    async fn run(&self, run: SandboxRun) -> Result<SandboxOutput, SandboxError> {
        let SandboxRun {
            source,
            inputs,
            limits,
            deadline,
            budget,
            depth,
            host,
            cancel,
            ..
        } = run;
        if cancel.is_cancelled() {
            return Err(SandboxError::Cancelled);
        }
        if depth > limits.max_depth {
            return Err(SandboxError::DepthLimit);
        }
        if source.len() > limits.source_bytes {
            return Err(SandboxError::SourceTooLarge);
        }
        let inputs = json_within(&inputs, limits.input_bytes).ok_or(SandboxError::InputTooLarge)?;
        let now = Instant::now();
        let deadline = deadline.min(now + limits.wall_time);
        if now >= deadline {
            return Err(SandboxError::Timeout);
        }

        let (requests, mut request_rx) = tokio_mpsc::unbounded_channel();
        let (answers, answer_rx) = mpsc::channel();
        let (done, mut done_rx) = oneshot::channel();
        // Cancelled when the caller cancels, and when this future is dropped.
        let stop = cancel.child_token();
        let _stop_on_drop = stop.clone().drop_guard();
        let job = Job {
            source,
            inputs,
            limits,
            deadline,
            budget,
            cancel: stop.clone(),
            requests,
            answers: answer_rx,
        };
        self.pool.submit(depth, Task { job, done })?;

        let mut calls = FuturesUnordered::new();
        let give_up = tokio::time::sleep_until((deadline + GRACE).into());
        tokio::pin!(give_up);
        let mut woken = false;
        loop {
            tokio::select! {
                biased;
                result = &mut done_rx => {
                    return result.unwrap_or_else(|_| {
                        Err(SandboxError::Unavailable("the sandbox worker stopped".into()))
                    });
                }
                Some(request) = request_rx.recv() => {
                    let host: Arc<dyn SandboxHost> = host.clone();
                    calls.push(async move {
                        let envelope = host.call_tool(&request.name, request.inputs).await;
                        (request.id, envelope)
                    });
                }
                Some((id, envelope)) = calls.next(), if !calls.is_empty() => {
                    let _ = answers.send(Answer::Host { id, envelope: Box::new(envelope) });
                }
                () = cancel.cancelled(), if !woken => {
                    woken = true;
                    stop.cancel();
                    let _ = answers.send(Answer::Wake);
                }
                () = &mut give_up => {
                    stop.cancel();
                    return Err(SandboxError::Timeout);
                }
            }
        }
    }
}

/// `value` as JSON text, or `None` past `limit` bytes (without writing more than that).
fn json_within(value: &serde_json::Value, limit: usize) -> Option<String> {
    struct Bounded(Vec<u8>, usize);
    impl io::Write for Bounded {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.0.len() + buf.len() > self.1 {
                return Err(io::Error::other("over the limit"));
            }
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut out = Bounded(Vec::new(), limit);
    serde_json::to_writer(&mut out, value).ok()?;
    String::from_utf8(out.0).ok()
}

#[cfg(test)]
mod engine_name {
    /// The engine name carries the rquickjs version the workspace's lock file pins, so an
    /// upgrade of the engine is seen as one (and approved tools are rebuilt under it).
    #[test]
    fn the_engine_name_names_the_locked_rquickjs_version() {
        let lock =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock"))
                .expect("the workspace lock file");
        let version = lock
            .split("[[package]]")
            .find(|p| p.contains("name = \"rquickjs\"\n"))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
            .map(|v| v.trim_end_matches('"').to_owned())
            .expect("rquickjs in Cargo.lock");
        assert!(
            super::ENGINE.contains(&format!("rquickjs {version},")),
            "ENGINE ({}) must name rquickjs {version}, the version Cargo.lock pins",
            super::ENGINE
        );
    }
}
