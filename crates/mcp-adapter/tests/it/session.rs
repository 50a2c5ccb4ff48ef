//! Per-session servers (`scope = "session"`) of the MCP client, driven as the server side
//! drives them (`SessionServers::open`, a session's end token), against the real
//! server-filesystem started with no directory: each session's process serves that
//! session's roots; its tools stand in the shared catalog's client-MCP family; a session's
//! end, a reload that removes the server, and the cap each do what they say.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use quiver_contract::{
    CallContext, ChannelError, ClientChannel, ClientFeatures, Envelope, LogLevel, McpSession,
};
use quiver_mcp_adapter::{McpClient, ServerConfig, SessionServers};
use quiver_registry::Catalog;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{assert_reaped, fast_options, peers, start, text_of, wait_for, within};

/// A downstream client that declared roots: one directory.
struct Rooted(PathBuf);

#[async_trait]
impl ClientChannel for Rooted {
    fn features(&self) -> ClientFeatures {
        ClientFeatures::new(false, false, true)
    }
    async fn create_message(&self, _: Value) -> Result<Value, ChannelError> {
        Err(ChannelError::Unsupported("no sampling here".into()))
    }
    async fn elicit(&self, _: Value) -> Result<Value, ChannelError> {
        Err(ChannelError::Unsupported("no elicitation here".into()))
    }
    async fn list_roots(&self) -> Result<Value, ChannelError> {
        Ok(json!({"roots": [{"uri": format!("file://{}", self.0.display()), "name": "root"}]}))
    }
    async fn log(&self, _: LogLevel, _: Option<&str>, _: Value) {}
    async fn progress(&self, _: f64, _: Option<f64>, _: Option<String>) {}
}

fn filesystem() -> ServerConfig {
    let bin = peers().join("npm/node_modules/.bin/mcp-server-filesystem");
    assert!(
        bin.exists(),
        "{} is missing: run .ci/setup-peers",
        bin.display()
    );
    ServerConfig::stdio("fs", bin.display().to_string(), vec![]).per_session()
}

/// One client session: its id, end, and roots (a directory holding `<name>.txt`).
struct Session {
    session: McpSession,
    client: Arc<dyn ClientChannel>,
    root: PathBuf,
}

impl Session {
    fn new(name: &str) -> Session {
        let root = std::env::temp_dir().join(format!(
            "quiver-session-servers-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&root).expect("a root");
        std::fs::write(root.join(format!("{name}.txt")), name).expect("a file");
        Session {
            session: McpSession::new(name, CancellationToken::new()),
            client: Arc::new(Rooted(root.clone())),
            root,
        }
    }

    fn ctx(&self, principal: &str) -> CallContext {
        CallContext::for_session(format!("mcp:{}", self.session.id))
            .with_principal(principal)
            .with_client(self.client.clone())
            .with_mcp_session(self.session.clone())
    }

    async fn open(&self, client: &McpClient, principal: &str) {
        within(
            Duration::from_secs(60),
            client.open(&self.session, Some(principal), Some(self.client.clone())),
        )
        .await;
    }
}

async fn list(catalog: &Catalog, ctx: &CallContext, dir: &Path) -> Envelope {
    let entry = catalog
        .lookup("mcp__fs__list_directory")
        .unwrap_or_else(|| panic!("not in the catalog: {:?}", catalog.names()));
    let call = entry
        .tool
        .call(json!({"path": dir.display().to_string()}), ctx);
    within(Duration::from_secs(30), call)
        .await
        .unwrap_or_else(Envelope::from)
}

/// Lists `dir` until the process has its roots (it asks for them as it starts).
async fn listing(catalog: &Catalog, ctx: &CallContext, dir: &Path) -> String {
    for _ in 0..100 {
        let env = list(catalog, ctx, dir).await;
        if !env.is_err() {
            return text_of(&env);
        }
        assert!(
            text_of(&env).contains("outside allowed directories"),
            "{env:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{} was never listed", dir.display());
}

fn pids_of(client: &McpClient, session: &str) -> Vec<u32> {
    client
        .session_servers()
        .into_iter()
        .filter(|s| s.session == session)
        .flat_map(|s| s.child_pids)
        .collect()
}

#[tokio::test]
async fn each_session_has_its_own_process_until_it_ends_or_the_server_is_removed() {
    let (catalog, client) = start(&[filesystem()], fast_options());
    assert!(client.any(), "a per-session server is configured");
    assert!(
        catalog.lookup("mcp__fs__list_directory").is_none(),
        "no tool before a session runs the server"
    );
    let (a, b) = (Session::new("a"), Session::new("b"));
    a.open(&client, "alice").await;
    let entry = catalog
        .lookup("mcp__fs__list_directory")
        .expect("listed once a session runs it");
    assert_eq!(&*entry.family, "client MCP");
    let text = listing(&catalog, &a.ctx("alice"), &a.root).await;
    assert!(text.contains("a.txt"), "{text}");

    b.open(&client, "bob").await;
    let text = listing(&catalog, &b.ctx("bob"), &b.root).await;
    assert!(text.contains("b.txt") && !text.contains("a.txt"), "{text}");
    let env = list(&catalog, &b.ctx("bob"), &a.root).await;
    assert!(
        env.is_err() && text_of(&env).contains("outside allowed directories"),
        "B is refused A's root: {env:?}"
    );
    let (pa, pb) = (pids_of(&client, "a"), pids_of(&client, "b"));
    assert_eq!((pa.len(), pb.len()), (1, 1), "one process each");
    assert_ne!(pa, pb);

    // A call with no session is refused in words, and starts nothing.
    let env = list(&catalog, &CallContext::for_session("anonymous"), &a.root).await;
    assert!(
        text_of(&env).contains("the call came with no MCP session"),
        "{env:?}"
    );
    assert_eq!(client.session_servers().len(), 2);

    // A's session ends: its process is stopped and reaped, B's serves on.
    a.session.ended.cancel();
    wait_for("A's process stopped", Duration::from_secs(20), || {
        pids_of(&client, "a").is_empty()
    })
    .await;
    wait_for("A's child reaped", Duration::from_secs(20), || {
        pa.iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists())
    })
    .await;
    let text = listing(&catalog, &b.ctx("bob"), &b.root).await;
    assert!(text.contains("b.txt"), "{text}");
    let env = list(&catalog, &a.ctx("alice"), &a.root).await;
    assert!(
        text_of(&env).contains("its MCP session has ended"),
        "an ended session starts nothing: {env:?}"
    );

    // A reload without the server: B's process stops, the tools leave the catalog.
    within(Duration::from_secs(30), client.reconcile(Vec::new()))
        .await
        .expect("reconciled");
    assert!(client.session_servers().is_empty());
    assert!(catalog.lookup("mcp__fs__list_directory").is_none());
    wait_for("B's child reaped", Duration::from_secs(20), || {
        pb.iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists())
    })
    .await;
    within(Duration::from_secs(20), client.close()).await;
    assert_reaped(&pa);
    assert_reaped(&pb);
}

#[tokio::test]
async fn a_principal_gets_at_most_its_cap_and_closing_stops_everything() {
    let mut fs = filesystem();
    fs.max_per_principal = Some(1);
    let (catalog, client) = start(&[fs], fast_options());
    let (a, b, c) = (Session::new("ca"), Session::new("cb"), Session::new("cc"));
    a.open(&client, "alice").await;
    b.open(&client, "alice").await;
    c.open(&client, "carol").await;
    let running: Vec<(String, String)> = client
        .session_servers()
        .into_iter()
        .map(|s| (s.session, s.principal))
        .collect();
    assert_eq!(
        running,
        vec![
            ("ca".to_owned(), "alice".to_owned()),
            ("cc".to_owned(), "carol".to_owned())
        ],
        "alice's second session is over the cap; carol has her own"
    );
    let env = list(&catalog, &b.ctx("alice"), &b.root).await;
    assert!(
        text_of(&env)
            .contains("principal `alice` already runs 1 of its processes, its `max_per_principal`"),
        "{env:?}"
    );
    let text = listing(&catalog, &c.ctx("carol"), &c.root).await;
    assert!(text.contains("cc.txt"), "{text}");
    let pids: Vec<u32> = client
        .session_servers()
        .into_iter()
        .flat_map(|s| s.child_pids)
        .collect();
    assert_eq!(pids.len(), 2);
    within(Duration::from_secs(20), client.close()).await;
    assert!(client.session_servers().is_empty());
    for p in &pids {
        assert!(
            !Path::new(&format!("/proc/{p}")).exists(),
            "child {p} left after close"
        );
    }
}

/// A tool registered by hand under a family of the shared catalog.
struct Held(quiver_contract::ToolSpec);

#[async_trait]
impl quiver_contract::Tool for Held {
    fn spec(&self) -> &quiver_contract::ToolSpec {
        &self.0
    }
    async fn call(&self, _: Value, _: &CallContext) -> quiver_contract::ToolResult {
        Ok(Envelope::text("held"))
    }
}

/// The per-session servers' tools take the client-MCP place of the family order: a
/// server-global MCP tool of the same name keeps it (the per-session one is skipped), and a
/// custom tool's name goes to the per-session one.
#[tokio::test]
async fn the_tools_rank_as_client_mcp_in_the_family_order() {
    use quiver_registry::{Family, FamilyOrder};
    let (catalog, client) = start(&[filesystem()], fast_options());
    catalog.set_family_order(FamilyOrder::new([
        Family::Core,
        Family::ServerMcp,
        Family::ClientMcp,
        Family::Custom,
        Family::Skills,
    ]));
    let held = |name: &str| {
        Arc::new(Held(quiver_contract::ToolSpec::new(name, "Held by hand.")))
            as Arc<dyn quiver_contract::Tool>
    };
    catalog
        .register_in("mcp:other", held("mcp__fs__list_allowed_directories"))
        .expect("registered");
    catalog
        .register_in(Family::Custom.name(), held("mcp__fs__read_text_file"))
        .expect("registered");
    let a = Session::new("fa");
    a.open(&client, "alice").await;
    let family = |name: &str| catalog.lookup(name).map(|e| e.family.to_string());
    assert_eq!(
        family("mcp__fs__list_allowed_directories").as_deref(),
        Some("mcp:other"),
        "a server-global MCP tool keeps its name"
    );
    assert_eq!(
        family("mcp__fs__read_text_file").as_deref(),
        Some("client MCP"),
        "a custom tool's name goes to the client-MCP family"
    );
    assert_eq!(
        family("mcp__fs__list_directory").as_deref(),
        Some("client MCP")
    );
    within(Duration::from_secs(20), client.close()).await;
}

/// A tool a session's process lists later (after its `tools/list_changed`) joins the shared
/// catalog, in the client-MCP family.
#[tokio::test]
async fn a_tool_listed_later_joins_the_catalog() {
    let (catalog, client) = start(
        &[crate::fixture_server("fx", "normal").per_session()],
        fast_options(),
    );
    let a = Session::new("ga");
    a.open(&client, "alice").await;
    assert!(catalog.lookup("mcp__fx__extra").is_none());
    let grow = catalog.lookup("mcp__fx__grow").expect("listed");
    let env = within(
        Duration::from_secs(30),
        grow.tool.call(json!({}), &a.ctx("alice")),
    )
    .await
    .unwrap_or_else(Envelope::from);
    assert!(text_of(&env).contains("grown"), "{env:?}");
    wait_for("extra in the catalog", Duration::from_secs(20), || {
        catalog.lookup("mcp__fx__extra").is_some()
    })
    .await;
    assert_eq!(
        &*catalog.lookup("mcp__fx__extra").expect("there").family,
        "client MCP"
    );
    within(Duration::from_secs(20), client.close()).await;
}
