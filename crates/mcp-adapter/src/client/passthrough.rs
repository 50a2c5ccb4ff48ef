//! The upstreams' resources, prompts and completions, served downstream by `quiver serve`:
//! the client's side of the server's [`ContentSource`] port.
//!
//! Naming: resource URIs pass through unchanged and are routed back by an index (URI ->
//! server) built from every `resources/list`, then by the servers' URI templates, then, with
//! a single resource server, to it. Prompts are named `mcp__<prefix>__<prompt>` (the tools'
//! prefix), or under their upstream names for a server with `bare_prompts = true`.
//! Subscriptions are counted per URI: the first downstream subscriber subscribes upstream,
//! the last one to leave unsubscribes, and a reconnected server is subscribed again
//! (`watch`). URI templates are matched in `template`.

mod prompts;
mod template;
mod watch;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use async_trait::async_trait;
use quiver_contract::{CallContext, Capabilities};
use rmcp::{
    model::{
        ClientRequest, CompleteRequestParams, PaginatedRequestParams, ReadResourceRequest,
        ReadResourceRequestParams, ServerResult,
    },
    service::ServiceError,
};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

pub(super) use self::watch::resubscribe;
use self::{
    template::template_matches,
    watch::{WatchCell, move_watch, rewatch, subscribe_at, unsubscribe_at},
};
use super::{
    McpClient, Shared,
    upstream::{Conn, Upstream},
};
use crate::content::{ContentError, ContentOffer, ContentSource, ListChanged};
use crate::sync::lock;

/// Pages asked of one upstream for one list, at most (a server that keeps sending cursors).
const MAX_PAGES: usize = 1000;

pub(crate) struct State {
    /// `notifications/resources/updated` from every upstream (the URI).
    pub(crate) updates: broadcast::Sender<String>,
    /// Resource and prompt list changes of every upstream (and upstreams connecting).
    pub(crate) lists: broadcast::Sender<ListChanged>,
    /// URI -> the servers whose latest listing has it, in configuration order: a caller's
    /// read goes to the first of them it may reach.
    owners: Mutex<HashMap<String, Vec<String>>>,
    /// The servers whose last resource listing was cut at the list cap: a URI none of
    /// the listings has may be one of theirs.
    cut: Mutex<Vec<String>>,
    /// Server -> its URI templates.
    templates: Mutex<BTreeMap<String, Vec<String>>>,
    /// Bare prompt name -> the servers that list it, in server order: the first one a
    /// caller may reach serves it to that caller.
    bare_prompts: Mutex<HashMap<String, Vec<String>>>,
    /// URI -> its subscription. The map's lock is held only to find or drop an entry; each
    /// entry's own lock orders the upstream requests for that URI, so one slow upstream holds
    /// up no other URI.
    subscriptions: Mutex<HashMap<String, Arc<WatchCell>>>,
    /// The (URI, later server) pairs already reported as shadowed by an earlier server, so
    /// each is logged once, not at every listing.
    shadowed: Mutex<std::collections::HashSet<(String, String)>>,
}

impl State {
    /// Logs, once, that `later` lists `what` `uri`, which `first` (earlier in order) has.
    /// At most 10,000 pairs are remembered (each listing holds at most the list cap per
    /// server); past that, shadowed entries go unreported.
    fn report_shadowed(&self, what: &str, uri: &str, first: &str, later: &str) {
        let mut reported = lock(&self.shadowed);
        if reported.len() < 10_000 && reported.insert((uri.to_owned(), later.to_owned())) {
            tracing::warn!(
                server = later,
                "MCP server \"{later}\" lists the {what} {uri}, which \"{first}\" (configured before it) also lists: it is passed through once, from \"{first}\""
            );
        }
    }
}

impl Default for State {
    fn default() -> Self {
        State {
            updates: broadcast::channel(256).0,
            lists: broadcast::channel(64).0,
            owners: Mutex::new(HashMap::new()),
            cut: Mutex::new(Vec::new()),
            templates: Mutex::new(BTreeMap::new()),
            bare_prompts: Mutex::new(HashMap::new()),
            subscriptions: Mutex::new(HashMap::new()),
            shadowed: Mutex::new(std::collections::HashSet::new()),
        }
    }
}

/// A server's place in the configuration's order (an unknown one last), for sorting.
fn server_rank(shared: &Shared) -> impl Fn(&str) -> usize + use<> {
    let order: Vec<String> = shared
        .servers()
        .iter()
        .map(|u| u.name().to_owned())
        .collect();
    move |server: &str| order.iter().position(|o| o == server).unwrap_or(usize::MAX)
}

fn timeout(shared: &Shared, up: &Upstream) -> Duration {
    up.cfg.call_timeout.unwrap_or(shared.opts.call_timeout)
}

/// The live connection of `up`, if it offers what `has` checks.
fn connected(
    up: &Upstream,
    has: impl Fn(&Conn) -> bool,
    what: &str,
) -> Result<Arc<Conn>, ContentError> {
    match up.conn() {
        // The same wording as a tool call's: a server whose command cannot start is not
        // worth waiting for.
        None => Err(ContentError::Unavailable(up.absence())),
        Some(c) if !has(&c) => Err(ContentError::NotFound(format!(
            "MCP server \"{}\" offers no {what}",
            up.name()
        ))),
        Some(c) => Ok(c),
    }
}

/// One request upstream, bounded by the call timeout; its failure in words the client can
/// act on (an upstream JSON-RPC error keeps its code; transport text never leaks).
async fn ask<T>(
    up: &Upstream,
    limit: Duration,
    what: &str,
    request: impl Future<Output = Result<T, ServiceError>>,
) -> Result<T, ContentError> {
    let outcome = tokio::time::timeout(limit, request)
        .await
        .unwrap_or(Err(ServiceError::Timeout { timeout: limit }));
    answer(up, limit, what, outcome)
}

/// The outcome of one request upstream (`limit` its timeout, rmcp's own for a request sent by
/// [`Upstream::request_for`], which also cancels it upstream), in the words of [`ask`].
fn answer<T>(
    up: &Upstream,
    limit: Duration,
    what: &str,
    outcome: Result<T, ServiceError>,
) -> Result<T, ContentError> {
    match outcome {
        Ok(v) => Ok(v),
        Err(ServiceError::Timeout { .. }) => Err(ContentError::Unavailable(format!(
            "MCP server \"{}\" did not answer {what} within {}",
            up.name(),
            quiver_contract::duration_text(limit)
        ))),
        Err(ServiceError::Cancelled { .. }) => Err(ContentError::Unavailable(format!(
            "{what} was cancelled before MCP server \"{}\" answered",
            up.name()
        ))),
        Err(ServiceError::McpError(d)) => Err(ContentError::Upstream {
            code: d.code.0,
            message: format!("MCP server \"{}\": {}", up.name(), d.message),
        }),
        Err(ServiceError::UnexpectedResponse) => Err(ContentError::Unavailable(format!(
            "MCP server \"{}\" answered {what} with something Quiver cannot read",
            up.name()
        ))),
        Err(e) => {
            tracing::debug!(server = %up.name(), error = %e, "{what} failed");
            Err(ContentError::Unavailable(format!(
                "MCP server \"{}\" could not answer {what}; the connection is re-established in the background",
                up.name()
            )))
        }
    }
}

/// An answer of the wrong type (a server that answered `prompts/get` with something else).
fn unexpected(up: &Upstream, what: &str, got: &ServerResult) -> ContentError {
    tracing::warn!(server = %up.name(), ?got, "unexpected reply to {what}");
    ContentError::Unavailable(format!(
        "MCP server \"{}\" answered {what} with something else than its result",
        up.name()
    ))
}

/// One page of a list, each entry as the server sent it. rmcp reads a page whole, so one
/// entry it cannot read (a resource without its `uri`, a `name` that is not a string) made
/// the whole page unreadable; here only the entries that are not a `T` are left out, with
/// a warning.
pub(super) async fn raw_page<T: serde::de::DeserializeOwned>(
    peer: &rmcp::Peer<rmcp::RoleClient>,
    request: ClientRequest,
    list: &str,
) -> Result<(Vec<Value>, Option<String>), ServiceError> {
    // A page rmcp read whole needs no check of its entries; one it could not read is
    // checked entry by entry.
    let (mut answer, checked) = match peer.send_request(request).await? {
        ServerResult::CustomResult(raw) => (raw.0, false),
        typed => (wire(&typed), true),
    };
    let Some(Value::Array(items)) = answer.get_mut(list).map(Value::take) else {
        return Err(ServiceError::UnexpectedResponse);
    };
    let kept = if checked {
        items
    } else {
        items
            .into_iter()
            .filter(|item| match T::deserialize(item) {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!("left out an entry of `{list}` ({e}): {item:.200}");
                    false
                }
            })
            .collect()
    };
    let next = answer
        .get("nextCursor")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok((kept, next))
}

fn wire<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Every page of one list from one server, at most `cap` entries.
async fn pages<F, Fut>(
    up: &Upstream,
    limit: Duration,
    what: &str,
    cap: usize,
    mut fetch: F,
) -> Result<Vec<Value>, ContentError>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<Value>, Option<String>), ServiceError>>,
{
    let mut out = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let (items, next) = ask(up, limit, what, fetch(cursor.take())).await?;
        for item in items {
            if out.len() >= cap {
                tracing::warn!(
                    server = %up.name(),
                    "{what}: the server lists more than {cap} entries; only the first {cap} are passed through"
                );
                return Ok(out);
            }
            out.push(item);
        }
        match next {
            Some(c) if !c.is_empty() => cursor = Some(c),
            _ => return Ok(out),
        }
    }
    Ok(out)
}

impl McpClient {
    /// The server that serves `uri` among those `caps` allows: the one that listed it, else
    /// one with a matching template, else the only resource server; lists again once before
    /// giving up. A URI of a server `caps` does not allow is answered as an unknown one.
    async fn owner_of(
        &self,
        uri: &str,
        caps: &Capabilities,
    ) -> Result<Arc<Upstream>, ContentError> {
        let servers = self.shared.resource_servers(caps);
        if servers.is_empty() {
            return Err(ContentError::NotFound(
                "no upstream MCP server shares resources".into(),
            ));
        }
        let find = |servers: &[Arc<Upstream>]| {
            let state = &self.shared.passthrough;
            let owners = lock(&state.owners).get(uri).cloned().unwrap_or_default();
            if let Some(up) = owners
                .iter()
                .find_map(|o| servers.iter().find(|u| u.name() == o))
            {
                return Some(up.clone());
            }
            let templates = lock(&state.templates);
            servers
                .iter()
                .find(|u| {
                    templates
                        .get(u.name())
                        .is_some_and(|ts| ts.iter().any(|t| t == uri || template_matches(t, uri)))
                })
                .cloned()
        };
        if let Some(up) = find(&servers) {
            return Ok(up);
        }
        // The only resource server of all, not the only one this caller may read: a URI
        // another server lists is not sent to the one a restricted caller has left.
        if let [only] = servers.as_slice()
            && self.shared.resource_servers(&Capabilities::all()).len() == 1
        {
            return Ok(only.clone());
        }
        let _ = self.all_resources(caps).await;
        let _ = self.all_templates(caps).await;
        if let Some(up) = find(&servers) {
            return Ok(up);
        }
        // A URI past the cap of the one server whose listing was cut is that server's.
        let cut = lock(&self.shared.passthrough.cut).clone();
        match cut.as_slice() {
            [one] => {
                if let Some(up) = servers.iter().find(|u| u.name() == one) {
                    return Ok(up.clone());
                }
            }
            [] => {}
            many => {
                return Err(ContentError::NotFound(format!(
                    "no upstream MCP server lists the resource `{uri}` among the first {} entries it passes through, and the lists of {} are longer than that, so it cannot be told which serves it",
                    self.shared.opts.list_cap,
                    many.join(", ")
                )));
            }
        }
        Err(ContentError::NotFound(format!(
            "no upstream MCP server lists the resource `{uri}`; call resources/list or resources/templates/list for the URIs that can be read"
        )))
    }

    /// Runs `list` on every resource server, collecting what the reachable ones return; an
    /// error only when every one failed.
    async fn across<F, Fut>(
        &self,
        servers: Vec<Arc<Upstream>>,
        list: F,
    ) -> Result<Vec<(Arc<Upstream>, Vec<Value>)>, ContentError>
    where
        F: Fn(Arc<Upstream>, usize) -> Fut,
        Fut: Future<Output = Result<Vec<Value>, ContentError>>,
    {
        let mut out = Vec::new();
        let mut first_err = None;
        // Each server up to the cap: a server with many entries does not starve the others
        // of theirs (and of their reads, routed by this listing).
        let cap = self.shared.opts.list_cap;
        for up in servers {
            match list(up.clone(), cap).await {
                Ok(items) => out.push((up, items)),
                // A server offering none of them is simply absent from the list.
                Err(ContentError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(server = %up.name(), error = %e, "left out of the passed-through list");
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    async fn all_resources(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        let shared = &self.shared;
        let lists = self
            .across(self.shared.resource_servers(caps), |up, cap| async move {
                let conn = connected(&up, |c| c.has_resources, "resources")?;
                let limit = timeout(shared, &up);
                pages(&up, limit, "resources/list", cap, |cursor| {
                    let peer = conn.peer.clone();
                    async move {
                        let request = ClientRequest::ListResourcesRequest(
                            rmcp::model::ListResourcesRequest::with_param(
                                PaginatedRequestParams::default().with_cursor(cursor),
                            ),
                        );
                        raw_page::<rmcp::model::Resource>(&peer, request, "resources").await
                    }
                })
                .await
            })
            .await?;
        // The index is rebuilt from this listing; a server that did not answer keeps its
        // earlier entries, so the index stays bounded by the list cap per server.
        let mut owners = lock(&self.shared.passthrough.owners);
        let listed: std::collections::HashSet<String> =
            lists.iter().map(|(up, _)| up.name().to_owned()).collect();
        for servers in owners.values_mut() {
            servers.retain(|server| !listed.contains(server.as_str()));
        }
        owners.retain(|_, servers| !servers.is_empty());
        let rank = server_rank(&self.shared);
        let cap = self.shared.opts.list_cap;
        {
            let mut cut = lock(&self.shared.passthrough.cut);
            cut.retain(|server| !listed.contains(server.as_str()));
            cut.extend(
                lists
                    .iter()
                    .filter(|(_, items)| items.len() >= cap)
                    .map(|(up, _)| up.name().to_owned()),
            );
        }
        // Every server listing a URI is kept, in configuration order (a caller that may
        // reach only a later one is served by it); this listing shows it once, as the
        // first's, and reads and subscriptions go there.
        for (up, items) in &lists {
            for uri in items
                .iter()
                .filter_map(|i| i.get("uri").and_then(Value::as_str))
            {
                let servers = owners.entry(uri.to_owned()).or_default();
                if !servers.iter().any(|s| s == up.name()) {
                    servers.push(up.name().to_owned());
                    servers.sort_by_key(|s| rank(s));
                }
            }
        }
        drop(owners);
        rewatch(&self.shared);
        let mut out = Vec::new();
        let mut seen: HashMap<String, String> = HashMap::new();
        for (up, items) in lists {
            for item in items {
                if let Some(uri) = item.get("uri").and_then(Value::as_str) {
                    if let Some(first) = seen.get(uri) {
                        self.shared
                            .passthrough
                            .report_shadowed("resource", uri, first, up.name());
                        continue;
                    }
                    seen.insert(uri.to_owned(), up.name().to_owned());
                }
                out.push(item);
            }
        }
        Ok(out)
    }

    async fn all_templates(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        let shared = &self.shared;
        let lists = self
            .across(self.shared.resource_servers(caps), |up, cap| async move {
                let conn = connected(&up, |c| c.has_resources, "resources")?;
                let limit = timeout(shared, &up);
                pages(&up, limit, "resources/templates/list", cap, |cursor| {
                    let peer = conn.peer.clone();
                    async move {
                        let request = ClientRequest::ListResourceTemplatesRequest(
                            rmcp::model::ListResourceTemplatesRequest::with_param(
                                PaginatedRequestParams::default().with_cursor(cursor),
                            ),
                        );
                        raw_page::<rmcp::model::ResourceTemplate>(
                            &peer,
                            request,
                            "resourceTemplates",
                        )
                        .await
                    }
                })
                .await
            })
            .await?;
        let mut templates = lock(&self.shared.passthrough.templates);
        let mut out = Vec::new();
        // A template two servers list is listed once, as the first's (reads that match it
        // go to the first server in order that has it).
        let mut seen: HashMap<String, String> = HashMap::new();
        for (up, items) in lists {
            let uris = items
                .iter()
                .filter_map(|t| t.get("uriTemplate").and_then(Value::as_str))
                .map(str::to_owned)
                .collect();
            templates.insert(up.name().to_owned(), uris);
            for item in items {
                if let Some(t) = item.get("uriTemplate").and_then(Value::as_str) {
                    if let Some(first) = seen.get(t) {
                        self.shared.passthrough.report_shadowed(
                            "resource template",
                            t,
                            first,
                            up.name(),
                        );
                        continue;
                    }
                    seen.insert(t.to_owned(), up.name().to_owned());
                }
                out.push(item);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ContentSource for McpClient {
    fn roots_changed(&self, client: &str) {
        let who = super::roots::Who::Named(client.into());
        for up in self.shared.servers() {
            up.roots_changed(&who);
        }
    }

    fn offer(&self) -> ContentOffer {
        let servers = self.shared.servers();
        let resources = servers.iter().any(|u| u.cfg.resources);
        let prompts = servers.iter().any(|u| u.cfg.prompts);
        ContentOffer {
            resources,
            subscribe: resources,
            prompts,
            completions: resources || prompts,
            list_changed: resources || prompts,
        }
    }

    fn instructions(&self, caps: &Capabilities) -> Vec<(String, String)> {
        self.shared
            .servers()
            .iter()
            .filter(|u| caps.allows_server(&u.cfg.name))
            .filter_map(|u| {
                let text = lock(&u.instructions).clone()?;
                Some((u.cfg.name.clone(), text))
            })
            .collect()
    }

    async fn list_resources(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        self.all_resources(caps).await
    }

    async fn list_resource_templates(
        &self,
        caps: &Capabilities,
    ) -> Result<Vec<Value>, ContentError> {
        self.all_templates(caps).await
    }

    async fn read_resource(&self, uri: &str, ctx: &CallContext) -> Result<Value, ContentError> {
        let up = self.owner_of(uri, &ctx.capabilities).await?;
        let conn = connected(&up, |c| c.has_resources, "resources")?;
        let limit = timeout(&self.shared, &up);
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(
            ReadResourceRequestParams::new(uri.to_owned()),
        ));
        let label = format!("resources/read {uri}");
        let outcome = up.request_for(&conn, &label, request, limit, ctx).await;
        match answer(&up, limit, "resources/read", outcome)? {
            ServerResult::ReadResourceResult(r) => Ok(wire(&r)),
            other => Err(unexpected(&up, "resources/read", &other)),
        }
    }

    async fn subscribe(&self, uri: &str, caps: &Capabilities) -> Result<(), ContentError> {
        let up = self.owner_of(uri, caps).await?;
        let slot = self.shared.passthrough.watch(uri);
        let mut sessions = slot.cell.sessions.lock().await;
        let restricted = caps.allowed_servers.is_some();
        if *sessions > 0 {
            let watched = lock(&slot.cell.server).clone();
            if watched != up.name() {
                // Watched through a server this caller may not reach (two servers claim the
                // URI, one by a template), or for a caller who may reach only some servers:
                // its server would not send these updates. Answered as an unknown URI,
                // naming no server.
                if !caps.allows_server(&watched) || slot.cell.restricted.load(Ordering::Relaxed) {
                    return Err(ContentError::NotFound(format!(
                        "no upstream MCP server lists the resource `{uri}`; call resources/list or resources/templates/list for the URIs that can be read"
                    )));
                }
                // The URI's owner changed since the watch began (a server configured
                // earlier came up, or the watched one stopped listing it): the watch moves
                // to where reads go (it stayed, and this caller was told the URI is unknown).
                move_watch(&self.shared, uri, &slot.cell, &up).await?;
            }
            slot.cell.restricted.fetch_or(restricted, Ordering::Relaxed);
            *sessions += 1;
            return Ok(());
        }
        subscribe_at(&self.shared, &up, uri).await?;
        *sessions = 1;
        *lock(&slot.cell.server) = up.name().to_owned();
        slot.cell.restricted.store(restricted, Ordering::Relaxed);
        Ok(())
    }

    async fn unsubscribe(&self, uri: &str) -> Result<(), ContentError> {
        let Some(slot) = self.shared.passthrough.watching(uri) else {
            return Ok(());
        };
        let mut sessions = slot.cell.sessions.lock().await;
        if *sessions == 0 {
            return Ok(());
        }
        *sessions -= 1;
        if *sessions > 0 {
            return Ok(());
        }
        let server = lock(&slot.cell.server).clone();
        let Some(up) = self.shared.server(&server) else {
            return Ok(());
        };
        // Still under the URI's lock: a subscribe that comes meanwhile is sent after this.
        unsubscribe_at(&self.shared, &up, uri).await
    }

    fn resource_updates(&self) -> broadcast::Receiver<String> {
        self.shared.passthrough.updates.subscribe()
    }

    fn list_changes(&self) -> broadcast::Receiver<ListChanged> {
        self.shared.passthrough.lists.subscribe()
    }

    async fn list_prompts(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        self.all_prompts(caps).await
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        ctx: &CallContext,
    ) -> Result<Value, ContentError> {
        self.get_upstream_prompt(name, arguments, ctx).await
    }

    async fn complete(
        &self,
        mut request: Value,
        caps: &Capabilities,
    ) -> Result<Value, ContentError> {
        let reference = request.get("ref").cloned().unwrap_or(Value::Null);
        let field = |k: &str| reference.get(k).and_then(Value::as_str).map(str::to_owned);
        let up = match field("type").as_deref() {
            Some("ref/prompt") => {
                let name = field("name").ok_or_else(|| {
                    ContentError::InvalidParams("ref/prompt needs a `name`".into())
                })?;
                let (up, prompt) = self.prompt_owner(&name, caps).await?;
                request["ref"]["name"] = Value::String(prompt);
                up
            }
            Some("ref/resource") => {
                let uri = field("uri").ok_or_else(|| {
                    ContentError::InvalidParams("ref/resource needs a `uri`".into())
                })?;
                self.owner_of(&uri, caps).await?
            }
            other => {
                return Err(ContentError::InvalidParams(format!(
                    "unknown completion reference type {other:?}: use ref/prompt or ref/resource"
                )));
            }
        };
        let conn = connected(&up, |_| true, "completions")?;
        if !conn.has_completions {
            // The upstream offers no completions: there is nothing to suggest.
            return Ok(json!({"completion": {"values": [], "hasMore": false}}));
        }
        let params: CompleteRequestParams = serde_json::from_value(request)
            .map_err(|e| ContentError::InvalidParams(format!("completion request: {e}")))?;
        let limit = timeout(&self.shared, &up);
        let result = ask(
            &up,
            limit,
            "completion/complete",
            conn.peer.complete(params),
        )
        .await?;
        Ok(wire(&result))
    }
}
