//! The mcp-adapter client against real MCP servers (see `.ci/setup-peers`) and a fault
//! fixture (`tests/fixtures/fault_server.py`).

mod config;
mod direct_path;
mod everything;
mod faults;
mod features;
mod python_servers;
mod relay;
mod session;
mod users;

use std::{
    future::Future,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use quiver_contract::{CallContext, Envelope};
use quiver_mcp_adapter::{ClientOptions, McpClient, ResolvedServer, ServerConfig, validate_all};
use quiver_registry::Catalog;
use serde_json::Value;

/// Where `.ci/setup-peers` installed the peers; panics (the test fails) when they are missing.
pub(crate) fn peers() -> PathBuf {
    let dir = std::env::var_os("QUIVER_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers"));
    let everything =
        dir.join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let python = dir.join("venv/bin/python");
    assert!(
        everything.exists() && python.exists(),
        "MCP test peers are missing in {}: run .ci/setup-peers",
        dir.display()
    );
    dir
}

pub(crate) fn python() -> String {
    peers().join("venv/bin/python").display().to_string()
}

pub(crate) fn everything_js() -> String {
    peers()
        .join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string()
}

pub(crate) fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fault_server.py")
        .display()
        .to_string()
}

/// A fixture server config in `mode`.
pub(crate) fn fixture_server(name: &str, mode: &str) -> ServerConfig {
    ServerConfig::stdio(name, python(), vec![fixture(), mode.to_owned()])
}

pub(crate) fn resolve(servers: &[ServerConfig]) -> Vec<ResolvedServer> {
    validate_all(servers, &|_| None).expect("valid config")
}

/// Short timeouts so fault tests end quickly; backoff starts at 200 ms.
pub(crate) fn fast_options() -> ClientOptions {
    ClientOptions::default()
        .with_connect_timeout(Duration::from_secs(10))
        .with_backoff(Duration::from_millis(200), Duration::from_secs(2))
}

pub(crate) fn start(servers: &[ServerConfig], opts: ClientOptions) -> (Arc<Catalog>, McpClient) {
    // `RUST_LOG=quiver_mcp_adapter=debug` shows the adapter's operator log.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let catalog = Arc::new(Catalog::new());
    let client = McpClient::start(catalog.clone(), resolve(servers), opts);
    (catalog, client)
}

/// Polls `cond` until it holds or `timeout` passes (the condition is the signal; the poll
/// interval is not a synchronisation point).
pub(crate) async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Calls a catalog tool directly (as the dispatcher would after validation).
pub(crate) async fn call(catalog: &Catalog, name: &str, input: Value) -> Envelope {
    let entry = catalog
        .lookup(name)
        .unwrap_or_else(|| panic!("{name} is not in the catalog: {:?}", catalog.names()));
    match entry.tool.call(input, &CallContext::default()).await {
        Ok(env) => env,
        Err(e) => Envelope::from(e),
    }
}

/// Runs `fut` with a hard limit so no test can hang.
pub(crate) async fn within<T>(limit: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .expect("the operation did not finish in time")
}

/// Asserts that none of `pids` is still alive or a zombie (i.e. every child was reaped).
pub(crate) fn assert_reaped(pids: &[u32]) {
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        if let Ok(stat) = stat {
            // Fields after the `(comm)`: state is the first, ppid the second.
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
            let mut fields = rest.split_whitespace();
            let state = fields.next().unwrap_or("?");
            let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            assert!(
                ppid != std::process::id(),
                "child {pid} of this test process survives (state {state})"
            );
        }
    }
}

/// Closes the client and checks every child it spawned was reaped.
/// Waits (at most 30 s) until the client's required servers are ready.
pub(crate) async fn ready(client: &McpClient) {
    within(
        Duration::from_secs(30),
        client.wait_ready(Duration::from_secs(30)),
    )
    .await
    .unwrap();
}

pub(crate) async fn close_and_check(client: &McpClient) {
    let child_pids = || -> Vec<u32> {
        client
            .status()
            .iter()
            .flat_map(|s| s.child_pids.clone())
            .collect()
    };
    // The children not reaped yet; each is taken off the list once it is.
    let pids = child_pids();
    within(Duration::from_secs(20), client.close()).await;
    assert_eq!(child_pids(), Vec::<u32>::new(), "children left after close");
    // Children killed before close (crashes, drops) are reaped by their watchers.
    wait_for("children reaped", Duration::from_secs(10), || {
        pids.iter().all(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    let rest = s
                        .rsplit_once(')')
                        .map(|(_, r)| r.to_owned())
                        .unwrap_or_default();
                    rest.split_whitespace()
                        .nth(1)
                        .and_then(|p| p.parse::<u32>().ok())
                        != Some(std::process::id())
                })
                .unwrap_or(true)
        })
    })
    .await;
    assert_reaped(&pids);
}

pub(crate) fn text_of(env: &Envelope) -> String {
    match env.data() {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => env.message().unwrap_or_default().to_owned(),
    }
}
