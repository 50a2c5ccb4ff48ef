//! Behaviour tests of the QuickJS sandbox: the abuse corpus (`tests/abuse`), the happy paths
//! (`tests/cases`), and the cases a single file cannot say (concurrency, cancellation).

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::Envelope;
use quiver_registry::sandbox::{Sandbox, SandboxError, SandboxHost, SandboxLimits, SandboxRun};
use quiver_sandbox::QuickJsSandbox;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use support::{ERROR_TEXTS, NoHost, assert_alive, cases, check};

/// Every abuse case ends in its typed error (or succeeds where it must), the sandbox runs a
/// trivial script after each, and no error text carries a host path or an environment value.
#[tokio::test]
async fn abuse_corpus() {
    // One thread per depth: every root run reuses the same worker, so a leak from one run
    // into the next would show; nested cases still find the next tier's thread.
    let sandbox = Arc::new(QuickJsSandbox::new(1));
    for case in cases("abuse") {
        check(&sandbox, &case).await;
    }
    assert_no_host_secrets();
}

/// The everyday behaviour: JSON in and out, logs, call_tool resolving and rejecting, syntax
/// errors with their position.
#[tokio::test]
async fn happy_path_cases() {
    let sandbox = Arc::new(QuickJsSandbox::default());
    for case in cases("cases") {
        check(&sandbox, &case).await;
    }
}

fn assert_no_host_secrets() {
    let texts = ERROR_TEXTS.lock().unwrap();
    assert!(texts.len() > 20, "the corpus produced error texts");
    let mut secrets: Vec<String> = vec![
        std::env::current_dir().unwrap().display().to_string(),
        env!("CARGO_MANIFEST_DIR").to_owned(),
    ];
    secrets.extend(std::env::var("HOME").ok());
    secrets.extend(std::env::vars().map(|(_, v)| v).filter(|v| v.len() >= 8));
    for text in texts.iter() {
        for secret in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "an error text carries a host path or environment value: {text}"
            );
        }
    }
}

/// Eight calls at once on a pool of four, one of them a memory bomb and one an endless loop:
/// the other six finish with their results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_with_bombs_among_them() {
    let sandbox = Arc::new(QuickJsSandbox::new(4));
    let mut limits = SandboxLimits::default();
    limits.wall_time = std::time::Duration::from_secs(2);
    let runs = (0..8).map(|i| {
        let source = match i {
            3 => "async function main() { const a = []; while (true) a.push(new Array(1e5).fill(1)) }",
            5 => "async function main() { while (true) {} }",
            _ => "async function main(inputs) { let s = 0; for (let i = 0; i < 1000; i++) s += i; return { i: inputs.i, s } }",
        };
        let run = SandboxRun::new(source, json!({ "i": i }), limits.clone(), Arc::new(NoHost));
        let sandbox = sandbox.clone();
        tokio::spawn(async move { sandbox.run(run).await })
    });
    let results: Vec<_> = futures::future::join_all(runs).await;
    for (i, result) in results.into_iter().enumerate() {
        let result = result.unwrap();
        match i {
            3 => assert_eq!(result.unwrap_err(), SandboxError::Memory),
            5 => assert_eq!(result.unwrap_err(), SandboxError::Timeout),
            _ => assert_eq!(result.unwrap().result, json!({ "i": i, "s": 499500 })),
        }
    }
    assert_alive(&sandbox, "the parallel calls").await;
}

/// A host whose `cancel_me` tool cancels the run's token.
struct Canceller(CancellationToken);

#[async_trait]
impl SandboxHost for Canceller {
    async fn call_tool(&self, _: &str, _: Value) -> Envelope {
        self.0.cancel();
        Envelope::ok(Value::Null)
    }
}

/// Cancelling the token stops a script that loops forever, and one waiting on a host call.
#[tokio::test]
async fn cancellation_interrupts_the_script() {
    let sandbox = Arc::new(QuickJsSandbox::new(1));
    for source in [
        "async function main() { await call_tool('cancel_me', {}); while (true) {} }",
        "async function main() { call_tool('cancel_me', {}); await new Promise(() => {}); }",
        "async function main() { call_tool('cancel_me', {}); await call_tool('cancel_me', {}); }",
    ] {
        let token = CancellationToken::new();
        let run = SandboxRun::new(
            source,
            json!({}),
            SandboxLimits::default(),
            Arc::new(Canceller(token.clone())),
        )
        .with_cancel(token);
        assert_eq!(
            sandbox.run(run).await.unwrap_err(),
            SandboxError::Cancelled,
            "{source}"
        );
    }
    assert_alive(&sandbox, "cancellation").await;
}

/// A host whose `started` tool says the script is running.
struct Started(tokio::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>);

#[async_trait]
impl SandboxHost for Started {
    async fn call_tool(&self, _: &str, _: Value) -> Envelope {
        if let Some(tx) = self.0.lock().await.take() {
            let _ = tx.send(());
        }
        Envelope::ok(Value::Null)
    }
}

/// Dropping a run's future (the caller gave up) stops its script: the pool's one thread is
/// free again long before the script's own deadline.
#[tokio::test]
async fn a_dropped_run_frees_its_worker() {
    let sandbox = Arc::new(QuickJsSandbox::new(1));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut forever = SandboxLimits::default();
    forever.wall_time = std::time::Duration::from_secs(600);
    let run = SandboxRun::new(
        "async function main() { call_tool('started', {}); while (true) {} }",
        json!({}),
        forever,
        Arc::new(Started(tokio::sync::Mutex::new(Some(tx)))),
    );
    tokio::select! {
        result = sandbox.run(run) => panic!("the endless run ended: {result:?}"),
        started = rx => started.unwrap(),
    }
    // The run's future is dropped here; with one thread, this run can only start once the
    // endless one has stopped.
    assert_alive(&sandbox, "a dropped run").await;
}
