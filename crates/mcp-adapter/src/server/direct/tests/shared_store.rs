//! Two servers sharing one working-set store, as two replicas on one database: one
//! stateless conversation's calls alternate between them.

use quiver_registry::store::StoreError;
use quiver_surface::ports::{
    MemorySessionStore, SessionStore, StoredWorkingSet, SurfaceState, WorkingSetEntry,
};

use super::*;

/// A shared store whose working-set writes take a while (a database under load).
struct SlowWrites(MemorySessionStore);

#[async_trait]
impl SessionStore for SlowWrites {
    async fn working_set(&self, session: &str) -> Result<Vec<WorkingSetEntry>, StoreError> {
        self.0.working_set(session).await
    }
    async fn versioned_working_set(&self, session: &str) -> Result<StoredWorkingSet, StoreError> {
        self.0.versioned_working_set(session).await
    }
    async fn replace_working_set(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
    ) -> Result<u64, StoreError> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.0.replace_working_set(session, entries).await
    }
    async fn replace_working_set_if(
        &self,
        session: &str,
        entries: Vec<WorkingSetEntry>,
        expected: u64,
    ) -> Result<Option<u64>, StoreError> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.0
            .replace_working_set_if(session, entries, expected)
            .await
    }
    async fn record_failed_approach(
        &self,
        session: &str,
        args_hash: &str,
        tool: &str,
        error: &str,
    ) -> Result<u32, StoreError> {
        self.0
            .record_failed_approach(session, args_hash, tool, error)
            .await
    }
    async fn failed_approaches(
        &self,
        session: &str,
    ) -> Result<Vec<quiver_surface::ports::FailedApproach>, StoreError> {
        self.0.failed_approaches(session).await
    }
    async fn end_session(&self, session: &str) -> Result<(), StoreError> {
        self.0.end_session(session).await
    }
    async fn state(&self, key: &str) -> Result<Option<SurfaceState>, StoreError> {
        self.0.state(key).await
    }
    async fn put_state(&self, key: &str, value: Value) -> Result<(), StoreError> {
        self.0.put_state(key, value).await
    }
    fn shared(&self) -> bool {
        true
    }
}

/// A server over the store, with `echo` among tools enough that it is listed only once
/// the conversation's working set holds it.
fn replica(store: &Arc<dyn SessionStore>) -> (McpServer, Router) {
    let catalog = echo_catalog();
    let server = crate::server::test_server(catalog, ServerOptions::default())
        .with_session_store(store.clone());
    let surface = server.shared.surface.clone();
    server
        .shared
        .surface
        .catalog()
        .register_all("core", quiver_surface::core_tools(&surface));
    let _ = surface.spawn_persistence(store.clone());
    let router = server.router("127.0.0.1:7345".parse().unwrap());
    (server, router)
}

/// A 2026-07-28 request of conversation `c`.
async fn stateless(router: &Router, id: u64, method: &str, params: Value) -> Reply {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "quiver/conversation": "c",
    });
    let name = params["name"].as_str().unwrap_or_default().to_owned();
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut extra: Vec<(&str, &[u8])> = vec![
        ("mcp-protocol-version", b"2026-07-28"),
        ("mcp-method", method.as_bytes()),
    ];
    if !name.is_empty() {
        extra.push(("mcp-name", name.as_bytes()));
    }
    send_with(router, Method::POST, None, body.to_string(), &extra).await
}

fn listed(reply: &Reply) -> Vec<String> {
    let body = sse_messages(&reply.body)
        .pop()
        .unwrap_or_else(|| panic!("no answer: {}", reply.body));
    body["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {}", reply.body))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// A call that pages a tool into the conversation's working set answers once the set is
/// stored: the conversation's next request, on the other server, lists the tool, however
/// slow the store's write.
#[tokio::test]
async fn a_found_tool_is_listed_by_the_other_server_at_the_next_request() {
    let store: Arc<dyn SessionStore> = Arc::new(SlowWrites(MemorySessionStore::new_shared()));
    let (_a, a) = replica(&store);
    let (_b, b) = replica(&store);
    let before = stateless(&b, 1, "tools/list", json!({})).await;
    assert!(
        !listed(&before).contains(&"echo".to_owned()),
        "{}",
        before.body
    );

    let found = stateless(
        &a,
        2,
        "tools/call",
        json!({"name": "tool_search", "arguments": {"query": "echo arguments"}}),
    )
    .await;
    assert!(
        found.body.contains(r#""exposed":["echo"]"#),
        "{}",
        found.body
    );
    let after = stateless(&b, 3, "tools/list", json!({})).await;
    assert!(
        listed(&after).contains(&"echo".to_owned()),
        "{}",
        after.body
    );
}
