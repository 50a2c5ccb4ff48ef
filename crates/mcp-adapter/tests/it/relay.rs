//! Server-to-client traffic of an upstream (the Python fixture's `talkback`: a log message,
//! a sampling request, progress) relayed to the calling client's channel, over stdio (no
//! association on the wire: the single call in flight) and streamable HTTP (the request
//! rides the call's SSE stream).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use quiver_contract::{
    CallContext, ChannelError, ClientChannel, ClientFeatures, Envelope, LogLevel,
};
use quiver_registry::Catalog;
use serde_json::{Value, json};

use crate::{
    close_and_check,
    everything::{HttpFixture, free_port},
    fixture_server, ready, start, text_of, within,
};

/// The downstream client as the upstream sees it through Quiver: answers sampling when it
/// declared it, and records what reached it.
pub(crate) struct Recorder {
    sampling: bool,
    seen: Mutex<Vec<String>>,
    /// How long each log message or progress takes to be taken (a client that reads slowly).
    pace: Duration,
}

impl Recorder {
    pub(crate) fn new(sampling: bool) -> Arc<Recorder> {
        Arc::new(Recorder {
            sampling,
            seen: Mutex::new(Vec::new()),
            pace: Duration::ZERO,
        })
    }

    /// A recorder that takes `pace` (blocking) to take each log message or progress.
    pub(crate) fn paced(pace: Duration) -> Arc<Recorder> {
        Arc::new(Recorder {
            sampling: false,
            seen: Mutex::new(Vec::new()),
            pace,
        })
    }

    fn take(&self, note: String) {
        if !self.pace.is_zero() {
            std::thread::sleep(self.pace);
        }
        self.seen.lock().unwrap().push(note);
    }

    pub(crate) fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

#[async_trait]
impl ClientChannel for Recorder {
    fn features(&self) -> ClientFeatures {
        ClientFeatures::new(self.sampling, false, false)
    }
    async fn create_message(&self, params: Value) -> Result<Value, ChannelError> {
        if !self.sampling {
            return Err(ChannelError::Unsupported(
                "the MCP client did not declare the `sampling` capability".into(),
            ));
        }
        let question = params["messages"][0]["content"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        self.seen
            .lock()
            .unwrap()
            .push(format!("sampling: {question}"));
        Ok(json!({
            "role": "assistant",
            "content": {"type": "text", "text": format!("42, about {question}")},
            "model": "recorder"
        }))
    }
    async fn elicit(&self, _params: Value) -> Result<Value, ChannelError> {
        Err(ChannelError::Unsupported("no elicitation here".into()))
    }
    async fn list_roots(&self) -> Result<Value, ChannelError> {
        Err(ChannelError::Unsupported("no roots here".into()))
    }
    async fn log(&self, level: LogLevel, _logger: Option<&str>, data: Value) {
        self.take(format!("log {}: {}", level.as_str(), data));
    }
    async fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        self.take(format!(
            "progress {progress}/{total:?}: {}",
            message.unwrap_or_default()
        ));
    }
}

async fn talkback(catalog: &Catalog, name: &str, client: Arc<Recorder>) -> Envelope {
    let entry = catalog
        .lookup(name)
        .unwrap_or_else(|| panic!("{name} is not in the catalog: {:?}", catalog.names()));
    let ctx = CallContext::for_session("relay-test").with_client(client);
    let call = entry.tool.call(json!({"question": "life"}), &ctx);
    match within(Duration::from_secs(30), call).await {
        Ok(env) => env,
        Err(e) => Envelope::from(e),
    }
}

async fn relays_to_the_calling_client(catalog: &Catalog, name: &str) {
    let client = Recorder::new(true);
    let env = talkback(catalog, name, client.clone()).await;
    assert!(
        text_of(&env).contains("the client said: 42, about life"),
        "{env:?}"
    );
    let seen = client.seen();
    assert!(seen.contains(&"sampling: life".to_owned()), "{seen:?}");
    assert!(
        seen.iter().any(|s| s.starts_with("progress 1/Some(2.0)")),
        "{seen:?}"
    );
    // The log message went out before the sampling request, on the same connection; it
    // reached this call's client (the only call in flight), not the operator log.
    assert!(
        seen.contains(&"log info: \"asking: life\"".to_owned()),
        "{seen:?}"
    );

    let refusing = Recorder::new(false);
    let env = talkback(catalog, name, refusing.clone()).await;
    assert!(
        env.is_err() && text_of(&env).contains("did not declare the `sampling` capability"),
        "{env:?}"
    );
}

/// The progress and log message an upstream sends just before its result reach the call's
/// client before the call ends, every time: rmcp hands each notification to a task of its
/// own, which the call's answer could overtake (the call ended first, and the notification
/// found no call to reach: the last progress value was dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_notifications_before_a_stdio_result_reach_the_call() {
    let (catalog, client) = start(
        &[fixture_server("fx", "raw").required()],
        Default::default(),
    );
    ready(&client).await;
    let entry = catalog
        .lookup("mcp__fx__echo")
        .expect("the raw fixture's `echo`");
    let mut missed = Vec::new();
    for round in 0..40 {
        let recorder = Recorder::new(false);
        let ctx = CallContext::for_session("relay-test").with_client(recorder.clone());
        let env = within(
            Duration::from_secs(30),
            entry.tool.call(json!({"report": true}), &ctx),
        )
        .await
        .unwrap_or_else(Envelope::from);
        assert!(text_of(&env).contains("report"), "{env:?}");
        // Read at once: what the call's client has when the call has ended.
        let seen = recorder.seen();
        if !(seen.iter().any(|s| s == "progress 2/Some(2.0): done")
            && seen.iter().any(|s| s == "log info: \"reported\""))
        {
            missed.push((round, seen));
        }
    }
    // A burst reaches the client in the server's order (rmcp runs each notification's
    // handler in a task of its own: progress went backwards, log lines swapped).
    let mut disordered = Vec::new();
    for round in 0..20 {
        let recorder = Recorder::new(false);
        let ctx = CallContext::for_session("relay-test").with_client(recorder.clone());
        let env = within(
            Duration::from_secs(30),
            entry.tool.call(json!({"burst": 8}), &ctx),
        )
        .await
        .unwrap_or_else(Envelope::from);
        assert!(text_of(&env).contains("burst"), "{env:?}");
        let seen = recorder.seen();
        let want: Vec<String> = (0..8)
            .flat_map(|i| {
                [
                    format!("progress {}/Some(8.0): ", i + 1),
                    format!("log info: \"log {i}\""),
                ]
            })
            .collect();
        if seen != want {
            disordered.push((round, seen));
        }
    }
    assert!(
        disordered.is_empty(),
        "bursts not in the server's order: {disordered:?}"
    );
    assert!(
        missed.is_empty(),
        "calls that ended before their last notifications: {missed:?}"
    );
    // A flood (10,000 notifications written with the result) reaches a client that takes
    // 60 µs for each whole and in order before the call ends: the answer waits while they
    // move on, not for a fixed time (which would drop the tail of the flood and tell
    // nobody).
    let recorder = Recorder::paced(Duration::from_micros(60));
    let ctx = CallContext::for_session("relay-test").with_client(recorder.clone());
    let env = within(
        Duration::from_secs(60),
        entry.tool.call(json!({"burst": 5000}), &ctx),
    )
    .await
    .unwrap_or_else(Envelope::from);
    assert!(text_of(&env).contains("burst"), "{env:?}");
    let seen = recorder.seen();
    assert_eq!(seen.len(), 10_000, "the flood's last: {:?}", seen.last());
    assert!(
        seen.iter().enumerate().all(|(n, s)| match n % 2 {
            0 => s.starts_with(&format!("progress {}/Some(5000.0)", n / 2 + 1)),
            _ => *s == format!("log info: \"log {}\"", n / 2),
        }),
        "the flood out of the server's order"
    );
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_upstream_requests_reach_the_calling_client() {
    let (catalog, client) = start(
        &[fixture_server("fx", "normal").required()],
        Default::default(),
    );
    ready(&client).await;
    relays_to_the_calling_client(&catalog, "mcp__fx__talkback").await;
    close_and_check(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_upstream_requests_reach_the_calling_client() {
    let (server, config) = HttpFixture::serve("pyweb", free_port()).await;
    let (catalog, client) = start(&[config.required()], Default::default());
    ready(&client).await;
    relays_to_the_calling_client(&catalog, "mcp__pyweb__talkback").await;
    close_and_check(&client).await;
    drop(server);
}

/// A log message that names no request (stdio) goes to the one call in flight only while a
/// single principal has called through the shared connection: once a second one has, such
/// a message could be the first one's (a task the server runs for them), so it goes to the
/// operator log, never to the other principal's client. Server requests, which the call
/// in flight did cause, still reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_stdio_servers_unrouted_log_reaches_no_other_principal() {
    let (catalog, client) = start(
        &[fixture_server("fx", "normal").required()],
        Default::default(),
    );
    ready(&client).await;
    let entry = catalog.lookup("mcp__fx__talkback").expect("talkback");
    let call_as = |who: &'static str| {
        talkback_in(
            &entry,
            CallContext::for_session(format!("s-{who}")).with_principal(who),
        )
    };
    let (env, seen) = call_as("alice").await;
    assert!(text_of(&env).contains("the client said: 42"), "{env:?}");
    assert!(
        seen.contains(&"log info: \"asking: life\"".to_owned()),
        "one principal so far: {seen:?}"
    );
    let (env, seen) = call_as("bob").await;
    assert!(text_of(&env).contains("the client said: 42"), "{env:?}");
    assert!(seen.contains(&"sampling: life".to_owned()), "{seen:?}");
    assert!(
        !seen.iter().any(|s| s.starts_with("log ")),
        "a second principal gets no unrouted log message: {seen:?}"
    );
    close_and_check(&client).await;
}

/// The same for clients that present no identity (no token): each session is its own
/// caller, so a second anonymous session gets no log message that names no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_stdio_servers_unrouted_log_reaches_no_other_anonymous_session() {
    let (catalog, client) = start(
        &[fixture_server("fx", "normal").required()],
        Default::default(),
    );
    ready(&client).await;
    let entry = catalog.lookup("mcp__fx__talkback").expect("talkback");
    let call_in = |session: &'static str| talkback_in(&entry, CallContext::for_session(session));
    let (env, seen) = call_in("mcp:first").await;
    assert!(text_of(&env).contains("the client said: 42"), "{env:?}");
    assert!(
        seen.contains(&"log info: \"asking: life\"".to_owned()),
        "one session so far: {seen:?}"
    );
    let (env, seen) = call_in("mcp:second").await;
    assert!(text_of(&env).contains("the client said: 42"), "{env:?}");
    assert!(
        !seen.iter().any(|s| s.starts_with("log ")),
        "a second anonymous session gets no unrouted log message: {seen:?}"
    );
    close_and_check(&client).await;
}

/// Calls `talkback` in `ctx` with a client that answers sampling; the result and what
/// reached the client.
async fn talkback_in(entry: &quiver_registry::Entry, ctx: CallContext) -> (Envelope, Vec<String>) {
    let recorder = Recorder::new(true);
    let ctx = ctx.with_client(recorder.clone());
    let env = within(
        Duration::from_secs(30),
        entry.tool.call(json!({"question": "life"}), &ctx),
    )
    .await
    .unwrap_or_else(Envelope::from);
    (env, recorder.seen())
}
