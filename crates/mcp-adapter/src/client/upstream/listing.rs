//! The server's tools: `tools/list` read page by page (one malformed tool costs only itself),
//! published into the catalog under the server's family, and listed again after
//! `notifications/tools/list_changed`, one re-list at a time.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, atomic::Ordering},
};

use quiver_contract::Tool;
use quiver_registry::{RegisterReport, Skipped};
use rmcp::{
    RoleClient,
    model::{ClientRequest, PaginatedRequestParams},
    service::Peer,
};
use serde_json::Value;

use super::{DialError, Upstream};
use crate::client::{
    to_contract::{self, UpstreamTool},
    tool::McpTool,
};
use crate::sync::lock;

/// The most `tools/list` pages one listing asks for.
const MAX_LIST_PAGES: usize = 1000;

/// One complete `tools/list`: the tools to publish, and those too malformed to serve
/// (reported with that publication, see `Upstream::last_report`).
#[derive(Debug, Default)]
pub(super) struct Listing {
    pub(super) tools: Vec<UpstreamTool>,
    malformed: Vec<Skipped>,
    /// Every name the server listed, before `allow_tools` and `deny_tools` (sorted, once).
    names: Vec<String>,
}

/// The single re-list of an upstream (see `Upstream::relist`).
#[derive(Debug, Default)]
pub(super) struct Relisting {
    /// A re-list is running.
    running: bool,
    /// The newest connection generation a `tools/list_changed` came on since the running
    /// re-list began.
    wanted: Option<u64>,
}

/// Clears `Relisting::running` when a re-list ends early (its task cancelled, a panic);
/// the normal end clears it itself, under the lock it checks `wanted` with, and disarms
/// this (clearing it again later could clear the flag of a re-list begun meanwhile).
struct RelistRunning<'a> {
    up: &'a Upstream,
    armed: bool,
}

impl Drop for RelistRunning<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.up.relisting).running = false;
        }
    }
}

/// One page of a `tools/list` answer, each tool as the server sent it.
struct ToolsPage {
    tools: Vec<Value>,
    next_cursor: Option<String>,
}

/// Reads a `tools/list` answer. rmcp reads a page whole: one tool it cannot read (a missing
/// `inputSchema`, an annotation of the wrong type) makes the page some other result. That
/// page is read here tool by tool, so that the malformed tool costs only itself.
fn read_tools_page(answer: rmcp::model::ServerResult) -> Result<ToolsPage, String> {
    match answer {
        rmcp::model::ServerResult::ListToolsResult(page) => Ok(ToolsPage {
            tools: page
                .tools
                .iter()
                .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
                .collect(),
            next_cursor: page.next_cursor,
        }),
        rmcp::model::ServerResult::CustomResult(raw) => {
            let Value::Object(mut page) = raw.0 else {
                return Err("tools/list failed: the answer is not an object".into());
            };
            let Some(Value::Array(tools)) = page.remove("tools") else {
                return Err("tools/list failed: the answer has no `tools` array".into());
            };
            let next_cursor = match page.remove("nextCursor") {
                Some(Value::String(c)) => Some(c),
                Some(Value::Null) | None => None,
                Some(other) => {
                    return Err(format!(
                        "tools/list failed: `nextCursor` must be a string, not {other}"
                    ));
                }
            };
            Ok(ToolsPage { tools, next_cursor })
        }
        _ => Err("tools/list failed: the server answered with another kind of result".into()),
    }
}

impl Upstream {
    pub(super) async fn list_tools(&self, peer: &Peer<RoleClient>) -> Result<Listing, DialError> {
        let mut out = Vec::new();
        let mut malformed = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut listed: std::collections::HashMap<String, Value> = std::collections::HashMap::new();
        let mut names = std::collections::BTreeSet::new();
        let mut pages = 0usize;
        loop {
            pages += 1;
            let answer = peer
                .send_request(ClientRequest::ListToolsRequest(
                    rmcp::model::ListToolsRequest::with_param(
                        PaginatedRequestParams::default().with_cursor(cursor.take()),
                    ),
                ))
                .await
                // A JSON-RPC error too: a server still starting may refuse the list for a
                // while; only what retrying cannot change (the protocol version) rejects.
                .map_err(|e| match e {
                    rmcp::service::ServiceError::McpError(d)
                        if d.code.0 == crate::client::pipe::UNREADABLE_ANSWER =>
                    {
                        DialError::Transient(format!("tools/list failed: {}", d.message))
                    }
                    e => DialError::Transient(format!("tools/list failed: {e}")),
                })?;
            let page = read_tools_page(answer).map_err(DialError::Transient)?;
            for wire in page.tools {
                let name = wire.get("name").and_then(Value::as_str).unwrap_or_default();
                if names.len() < self.opts.list_cap {
                    names.insert(name.to_owned());
                }
                if !self.cfg.admits(name) {
                    continue;
                }
                // The same definition again (a server that ignores the cursor repeats its
                // page): listed once. A different one under a taken name is reported.
                if listed.get(name).is_some_and(|w| *w == wire) {
                    continue;
                }
                listed.insert(name.to_owned(), wire.clone());
                if out.len() >= self.opts.list_cap {
                    self.diag_warn(format!(
                        "tools/list returned more than {} tools; the rest are ignored",
                        self.opts.list_cap
                    ));
                    return Ok(Listing {
                        tools: out,
                        malformed,
                        names: names.into_iter().collect(),
                    });
                }
                // A tool that runs only as an MCP task fails every plain call, and Quiver
                // sends no task-augmented ones: it is left out, and said.
                if wire
                    .get("_meta")
                    .and_then(|m| m.get(crate::client::pipe::TASK_SUPPORT))
                    .and_then(Value::as_str)
                    == Some("required")
                {
                    let why = "it runs only as an MCP task (`execution.taskSupport` is \"required\"), and Quiver calls tools without task augmentation, so every call would fail";
                    self.warn_once(format!("tool {name:?} not served: {why}"));
                    if malformed.len() < self.opts.list_cap {
                        malformed.push(Skipped::noted(
                            self.cfg.family(),
                            name.escape_debug().to_string(),
                            format!("not served: {why}"),
                        ));
                    }
                    continue;
                }
                // One malformed tool costs only itself: the rest are served.
                match to_contract::tool_spec(&self.cfg.name, &self.cfg.prefix, &wire) {
                    Ok(mut t) => {
                        t.spec.progressive |= self.cfg.progressive(name);
                        t.spec.requires.clone_from(&self.cfg.requires);
                        if let Some(what) = &t.hidden {
                            self.warn_once(format!(
                                "tool {name:?}: hidden text taken out of {what}; a model would have read it, a person reviewing the tool would not have seen it"
                            ));
                        }
                        if let Some(why) = &t.dropped_output_schema {
                            self.warn_once(format!(
                                "tool {name:?} is served without its output schema ({why}); its results are passed on unchecked"
                            ));
                        }
                        out.push(t)
                    }
                    Err(e) => {
                        self.warn_once(format!("skipped malformed tool {name:?}: {e}"));
                        if malformed.len() < self.opts.list_cap {
                            malformed.push(Skipped::new(
                                self.cfg.family(),
                                name.escape_debug().to_string(),
                                format!("malformed upstream definition: {e}"),
                            ));
                        }
                    }
                }
            }
            match page.next_cursor {
                // A server whose cursor comes round again (or never ends) would be asked
                // forever: what it listed so far is served.
                Some(c) if !c.is_empty() && (seen.contains(&c) || pages >= MAX_LIST_PAGES) => {
                    self.diag_warn(format!(
                        "tools/list paging stopped after {pages} page(s): the cursor {c:?} {}",
                        if seen.contains(&c) {
                            "came round again"
                        } else {
                            "still had more"
                        }
                    ));
                    return Ok(Listing {
                        tools: out,
                        malformed,
                        names: names.into_iter().collect(),
                    });
                }
                Some(c) if !c.is_empty() => {
                    seen.insert(c.clone());
                    cursor = Some(c);
                }
                _ => {
                    return Ok(Listing {
                        tools: out,
                        malformed,
                        names: names.into_iter().collect(),
                    });
                }
            }
        }
    }

    /// Publishes `tools` into the catalog under this server's family: new names are
    /// registered first-wins, changed ones replaced, vanished ones removed.
    pub(super) fn publish(self: &Arc<Self>, listing: Listing) -> RegisterReport {
        let Listing {
            tools,
            malformed,
            names,
        } = listing;
        *lock(&self.listed_names) = names;
        let family = self.cfg.family();
        let mut published = lock(&self.published);
        let wanted: BTreeSet<&str> = tools.iter().map(|t| t.spec.name.as_str()).collect();
        let gone: Vec<String> = published
            .keys()
            .filter(|n| !wanted.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if self
                .catalog
                .lookup(&name)
                .is_some_and(|e| *e.family == *family)
            {
                self.catalog.remove(&name);
            }
            published.remove(&name);
        }
        let mut fresh: Vec<Arc<dyn Tool>> = Vec::new();
        let mut fresh_specs = BTreeMap::new();
        for t in tools {
            let tool: Arc<dyn Tool> = Arc::new(McpTool::new(self.clone(), t.clone()));
            match self.catalog.lookup(&t.spec.name) {
                Some(e) if *e.family == *family => {
                    if e.spec != t.spec
                        && let Err(err) = self.catalog.upsert_in(&family, tool)
                    {
                        self.diag_warn(format!("cannot update {}: {err}", t.spec.name));
                        continue;
                    }
                    published.insert(t.spec.name.clone(), t);
                }
                _ => {
                    fresh_specs.insert(t.spec.name.clone(), t);
                    fresh.push(tool);
                }
            }
        }
        let report = self.catalog.register_all(&family, fresh);
        for name in &report.registered {
            if let Some(t) = fresh_specs.remove(name) {
                published.insert(name.clone(), t);
            }
        }
        for line in report.warning_lines() {
            tracing::warn!("{line}");
            self.diag(line);
        }
        *lock(&self.last_report) = report.clone();
        *lock(&self.malformed) = malformed;
        report
    }

    /// Re-lists after `notifications/tools/list_changed` on connection `generation`. One
    /// re-list runs at a time: notifications that come while it runs are coalesced into one
    /// more, for the newest generation among them.
    pub(super) async fn relist(self: Arc<Self>, generation: u64) {
        {
            let mut r = lock(&self.relisting);
            r.wanted = r.wanted.max(Some(generation));
            if r.running {
                return;
            }
            r.running = true;
        }
        let mut running = RelistRunning {
            up: &self,
            armed: true,
        };
        loop {
            let generation = {
                let mut r = lock(&self.relisting);
                match r.wanted.take() {
                    Some(g) => g,
                    None => {
                        r.running = false;
                        running.armed = false;
                        return;
                    }
                }
            };
            self.relist_once(generation).await;
        }
    }

    /// One re-list on connection `generation`; if that connection is still connecting (the
    /// tools changed while it listed them), marked to run once it is up.
    async fn relist_once(self: &Arc<Self>, generation: u64) {
        let conn = {
            // Held while the state is read, so `dial_shared`, which looks here after turning
            // the state Up, either sees the mark or this sees the connection.
            let mut pending = lock(&self.relist_pending);
            match self.conn().filter(|c| c.generation == generation) {
                Some(c) => c,
                None => {
                    if self.state.borrow().generation < generation {
                        *pending = Some(generation);
                    }
                    return;
                }
            }
        };
        self.counters.relists.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.connect_timeout(), self.list_tools(&conn.peer)).await {
            Ok(Ok(listing)) => {
                let n = listing.tools.len();
                self.publish(listing);
                self.diag(format!("tools changed upstream; {n} tool(s) published"));
            }
            // Quiver closing the server, or a connection already replaced or marked down,
            // cut the re-list off: no failure of its own (a reconnect lists afresh, and a
            // close wants none). A server that dies mid-re-list can still be reported here
            // before its watcher marks the connection down.
            Ok(Err(_)) | Err(_)
                if self.closed.is_cancelled()
                    || self.conn().is_none_or(|c| c.generation != generation) =>
            {
                tracing::debug!(server = %self.cfg.name, "a re-list was cut off by the end of its connection");
            }
            Ok(Err(DialError::Rejected(r) | DialError::Transient(r) | DialError::Hangup(r))) => {
                self.diag_warn(format!("re-list after list_changed failed: {r}"));
            }
            Ok(Err(DialError::Closed)) => {}
            Err(_) => self.diag_warn("re-list after list_changed timed out"),
        }
    }
}
