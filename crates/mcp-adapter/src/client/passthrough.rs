//! The upstreams' resources, prompts and completions, served downstream by `quiver serve`:
//! the client's side of the server's [`ContentSource`] port.
//!
//! Naming: resource URIs pass through unchanged and are routed back by an index (URI ->
//! server) built from every `resources/list`, then by the servers' URI templates, then, with
//! a single resource server, to it. Prompts are named `mcp__<prefix>__<prompt>` (the tools'
//! prefix), or under their upstream names for a server with `bare_prompts = true`.
//! Subscriptions are counted per URI: the first downstream subscriber subscribes upstream,
//! the last one to leave unsubscribes, and a reconnected server is subscribed again.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use quiver_contract::{CallContext, Capabilities};
use rmcp::{
    model::{
        ClientRequest, CompleteRequestParams, GetPromptRequest, GetPromptRequestParams,
        PaginatedRequestParams, ReadResourceRequest, ReadResourceRequestParams, ServerResult,
        SubscribeRequestParams, UnsubscribeRequestParams,
    },
    service::ServiceError,
};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

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

/// One resource URI that downstream sessions subscribed to.
#[derive(Debug, Default)]
struct WatchCell {
    /// The server subscribed upstream; a plain lock, so a reconnected server picks its own
    /// URIs without queueing behind another server's slow request. Set under `sessions`.
    server: Mutex<String>,
    /// How many downstream sessions are subscribed (0: not subscribed upstream). Its lock
    /// orders the upstream requests of this URI.
    sessions: tokio::sync::Mutex<usize>,
    /// Whether a subscriber may reach only some servers (set under `sessions`): the watch
    /// then stays where it is, since another server's updates may not be that caller's.
    restricted: AtomicBool,
}

impl WatchCell {
    /// Nobody holds or waits for it but the map (`refs` references known) and nobody is
    /// subscribed.
    fn unused(cell: &Arc<WatchCell>, refs: usize) -> bool {
        Arc::strong_count(cell) == refs && cell.sessions.try_lock().is_ok_and(|n| *n == 0)
    }
}

/// A handle on one URI's [`WatchCell`]; dropping it removes an entry nobody is subscribed to
/// and nobody else is using.
struct WatchSlot<'a> {
    state: &'a State,
    uri: String,
    cell: Arc<WatchCell>,
}

impl State {
    /// The URI's watch, made if there is none.
    fn watch(&self, uri: &str) -> WatchSlot<'_> {
        let watch = lock(&self.subscriptions)
            .entry(uri.to_owned())
            .or_default()
            .clone();
        self.slot(uri, watch)
    }

    /// The URI's watch, if there is one.
    fn watching(&self, uri: &str) -> Option<WatchSlot<'_>> {
        let watch = lock(&self.subscriptions).get(uri)?.clone();
        Some(self.slot(uri, watch))
    }

    fn slot(&self, uri: &str, cell: Arc<WatchCell>) -> WatchSlot<'_> {
        WatchSlot {
            state: self,
            uri: uri.to_owned(),
            cell,
        }
    }

    /// Drops the entries of `uris` nobody uses any more.
    fn tidy(&self, uris: &[String]) {
        let mut subs = lock(&self.subscriptions);
        for uri in uris {
            if subs.get(uri).is_some_and(|c| WatchCell::unused(c, 1)) {
                subs.remove(uri);
            }
        }
    }
}

impl Drop for WatchSlot<'_> {
    fn drop(&mut self) {
        let mut subs = lock(&self.state.subscriptions);
        // Handles are made only under the map's lock: two references (the map's and this
        // one) mean no one else holds or waits for this watch.
        if WatchCell::unused(&self.cell, 2) {
            subs.remove(&self.uri);
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
        None => Err(ContentError::Unavailable(format!(
            "MCP server \"{}\" is not connected ({:?}); it is retried in the background, try again shortly",
            up.name(),
            up.state()
        ))),
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

/// Whether `uri` is an expansion of the RFC 6570 `template`: each `{var}` matches one or
/// more characters other than `/` (`{+var}` and `{#var}` any), `{?..}` and `{&..}` the rest.
///
/// The pieces are matched left to right over the set of URI positions the pieces so far can
/// end at, so the work is at most (pieces x URI length) however many variables stand side by
/// side (a backtracking match is exponential in them, and this runs under a lock on the
/// runtime, for a URI a client chose).
pub(crate) fn template_matches(template: &str, uri: &str) -> bool {
    enum Piece<'a> {
        Lit(&'a str),
        Var { slash: bool, rest: bool },
    }
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Lit(&rest[..open]));
        }
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        let expr = &rest[open + 1..open + close];
        let op = expr.chars().next().unwrap_or(' ');
        pieces.push(Piece::Var {
            slash: matches!(op, '+' | '#'),
            rest: matches!(op, '?' | '&'),
        });
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Lit(rest));
    }
    let bytes = uri.as_bytes();
    let n = bytes.len();
    // `at[p]`: the pieces so far can match `uri[..p]` (always at a character boundary).
    let mut at = vec![false; n + 1];
    at[0] = true;
    for (i, piece) in pieces.iter().enumerate() {
        let mut next = vec![false; n + 1];
        match piece {
            Piece::Lit(l) => {
                for p in (0..=n).filter(|&p| at[p]) {
                    if bytes[p..].starts_with(l.as_bytes()) {
                        next[p + l.len()] = true;
                    }
                }
            }
            Piece::Var { rest: true, .. } => {
                return i + 1 == pieces.len() && at.contains(&true);
            }
            Piece::Var { slash, .. } => {
                // Whether a match of the pieces so far ends before `q` with no `/` since.
                let mut open = false;
                for q in 0..=n {
                    if q > 0 && !slash && bytes[q - 1] == b'/' {
                        open = false;
                    }
                    if open && uri.is_char_boundary(q) {
                        next[q] = true;
                    }
                    if at[q] {
                        open = true;
                    }
                }
            }
        }
        if !next.contains(&true) {
            return false;
        }
        at = next;
    }
    at[n]
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
                    "no upstream MCP server lists the resource {uri} among the first {} entries it passes through, and the lists of {} are longer than that, so it cannot be told which serves it",
                    self.shared.opts.list_cap,
                    many.join(", ")
                )));
            }
        }
        Err(ContentError::NotFound(format!(
            "no upstream MCP server lists the resource {uri}; call resources/list or resources/templates/list for the URIs that can be read"
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

    async fn all_prompts(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        let shared = &self.shared;
        let lists = self
            .across(self.shared.prompt_servers(caps), |up, cap| async move {
                let conn = connected(&up, |c| c.has_prompts, "prompts")?;
                let limit = timeout(shared, &up);
                pages(&up, limit, "prompts/list", cap, |cursor| {
                    let peer = conn.peer.clone();
                    async move {
                        let request = ClientRequest::ListPromptsRequest(
                            rmcp::model::ListPromptsRequest::with_param(
                                PaginatedRequestParams::default().with_cursor(cursor),
                            ),
                        );
                        raw_page::<rmcp::model::Prompt>(&peer, request, "prompts").await
                    }
                })
                .await
            })
            .await?;
        let listed: std::collections::HashSet<String> =
            lists.iter().map(|(up, _)| up.name().to_owned()).collect();
        let mut bare = HashMap::new();
        let mut all_bare: Vec<(String, String)> = Vec::new();
        let mut out = Vec::new();
        for (up, items) in lists {
            for mut item in items {
                let Some(name) = item.get("name").and_then(Value::as_str).map(str::to_owned) else {
                    continue;
                };
                let exposed = if up.cfg.bare_prompts {
                    all_bare.push((name.clone(), up.name().to_owned()));
                    if bare.contains_key(&name) {
                        tracing::warn!(server = %up.name(), prompt = %name, "a bare prompt of that name is already served; skipped");
                        continue;
                    }
                    bare.insert(name.clone(), up.name().to_owned());
                    name
                } else {
                    format!("mcp__{}__{name}", up.cfg.prefix)
                };
                item["name"] = Value::String(exposed);
                out.push(item);
            }
        }
        // The bare names of the servers listed now are replaced; those of servers this
        // caller may not list (or that did not answer) are kept for the callers that may.
        // Every server listing a name is kept, in server order, so a caller that may reach
        // only a later one is still served by it.
        let rank = server_rank(&self.shared);
        let mut known = lock(&self.shared.passthrough.bare_prompts);
        for owners in known.values_mut() {
            owners.retain(|server| !listed.contains(server.as_str()));
        }
        for (name, server) in all_bare {
            let owners = known.entry(name).or_default();
            if !owners.contains(&server) {
                owners.push(server);
                owners.sort_by_key(|s| rank(s));
            }
        }
        known.retain(|_, owners| !owners.is_empty());
        drop(known);
        Ok(out)
    }

    /// The server and upstream name of a prompt as served downstream.
    /// A prompt of a server `caps` does not allow is answered as an unknown one.
    async fn prompt_owner(
        &self,
        name: &str,
        caps: &Capabilities,
    ) -> Result<(Arc<Upstream>, String), ContentError> {
        let servers = self.shared.prompt_servers(caps);
        if let Some((prefix, prompt)) = quiver_contract::split_mcp_name(name)
            && let Some(up) = servers
                .iter()
                .find(|u| !u.cfg.bare_prompts && u.cfg.prefix.eq_ignore_ascii_case(prefix))
        {
            return Ok((up.clone(), prompt.to_owned()));
        }
        let bare = |servers: &[Arc<Upstream>]| {
            let owners = lock(&self.shared.passthrough.bare_prompts)
                .get(name)
                .cloned()?;
            owners
                .iter()
                .find_map(|o| servers.iter().find(|u| u.name() == o && u.cfg.bare_prompts))
                .cloned()
        };
        if let Some(up) = bare(&servers) {
            return Ok((up, name.to_owned()));
        }
        if servers.iter().any(|u| u.cfg.bare_prompts) {
            let _ = self.all_prompts(caps).await;
            if let Some(up) = bare(&servers) {
                return Ok((up, name.to_owned()));
            }
        }
        Err(ContentError::NotFound(format!(
            "unknown prompt {name:?}; call prompts/list for the prompts that exist"
        )))
    }
}

/// Moves the watch of `uri` (`cell`, its sessions' lock held by the caller) to `to`:
/// subscribed there first, then unsubscribed where it was (best effort: a server that is down
/// has forgotten it with its session).
async fn move_watch(
    shared: &Arc<Shared>,
    uri: &str,
    cell: &WatchCell,
    to: &Arc<Upstream>,
) -> Result<(), ContentError> {
    subscribe_at(shared, to, uri).await?;
    let from = std::mem::replace(&mut *lock(&cell.server), to.name().to_owned());
    tracing::info!(%uri, from = %from, to = %to.name(), "the resource's watch moved to the server that serves it now");
    if let Some(old) = shared.server(&from)
        && let Err(e) = unsubscribe_at(shared, &old, uri).await
    {
        tracing::warn!(server = %old.name(), %uri, error = %e, "could not unsubscribe after the watch moved");
    }
    Ok(())
}

/// Subscribes `up` to `uri`: an error when it is not connected or takes no subscriptions.
async fn subscribe_at(shared: &Shared, up: &Upstream, uri: &str) -> Result<(), ContentError> {
    let conn = connected(up, |c| c.has_resources, "resources")?;
    if !conn.has_subscribe {
        return Err(ContentError::InvalidParams(format!(
            "MCP server \"{}\" does not support resource subscriptions; read {uri} again to see changes",
            up.name()
        )));
    }
    #[allow(deprecated)]
    let request = conn
        .peer
        .subscribe(SubscribeRequestParams::new(uri.to_owned()));
    ask(up, timeout(shared, up), "resources/subscribe", request).await
}

/// Unsubscribes `up` from `uri`; nothing to send to a server that is down (it has forgotten
/// the subscription with its session).
async fn unsubscribe_at(shared: &Shared, up: &Upstream, uri: &str) -> Result<(), ContentError> {
    let Some(conn) = up.conn().filter(|c| c.has_subscribe) else {
        return Ok(());
    };
    #[allow(deprecated)]
    let request = conn
        .peer
        .unsubscribe(UnsubscribeRequestParams::new(uri.to_owned()));
    ask(up, timeout(shared, up), "resources/unsubscribe", request).await
}

/// After a listing changed who serves the URIs: each watched URI whose first owner is now a
/// connected server other than the watched one moves there, so that its updates come from
/// where its reads go (a watch begun while that server was down stayed at the later one).
fn rewatch(shared: &Arc<Shared>) {
    let moves: Vec<(String, Arc<WatchCell>, Arc<Upstream>)> = {
        let owners = lock(&shared.passthrough.owners);
        let subs = lock(&shared.passthrough.subscriptions);
        subs.iter()
            .filter_map(|(uri, cell)| {
                // A caller who may reach only some servers keeps the watch it began.
                if cell.restricted.load(Ordering::Relaxed) {
                    return None;
                }
                let first = owners.get(uri)?.first()?;
                if *lock(&cell.server) == *first {
                    return None;
                }
                let to = shared.server(first)?;
                to.conn()
                    .is_some_and(|c| c.has_subscribe)
                    .then(|| (uri.clone(), cell.clone(), to))
            })
            .collect()
    };
    for (uri, cell, to) in moves {
        let shared = shared.clone();
        tokio::spawn(async move {
            {
                let sessions = cell.sessions.lock().await;
                let watched = lock(&cell.server).clone();
                if *sessions > 0
                    && watched != to.name()
                    && !cell.restricted.load(Ordering::Relaxed)
                    && let Err(e) = move_watch(&shared, &uri, &cell, &to).await
                {
                    tracing::warn!(server = %to.name(), %uri, error = %e, "could not move the resource's watch to the server that serves it now");
                }
            }
            drop(cell);
            // An entry whose last subscriber left while this held it.
            shared.passthrough.tidy(std::slice::from_ref(&uri));
        });
    }
}

/// Subscribes a reconnected server again to the URIs downstream sessions still watch.
pub(super) fn resubscribe(shared: &Arc<Shared>, server: &str) {
    let Some(up) = shared.server(server) else {
        return;
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        // Only this server's URIs, picked without waiting for any watch's lock.
        let mine: Vec<(String, Arc<WatchCell>)> = lock(&shared.passthrough.subscriptions)
            .iter()
            .filter(|(_, c)| *lock(&c.server) == up.name())
            .map(|(uri, c)| (uri.clone(), c.clone()))
            .collect();
        let uris: Vec<String> = mine.iter().map(|(u, _)| u.clone()).collect();
        if up.conn().is_some_and(|c| c.has_subscribe) {
            for (uri, cell) in mine {
                // Under the URI's lock, so an unsubscribe meanwhile is sent after this.
                let sessions = cell.sessions.lock().await;
                if *sessions == 0 || *lock(&cell.server) != up.name() {
                    continue;
                }
                if let Err(e) = subscribe_at(&shared, &up, &uri).await {
                    tracing::warn!(server = %up.name(), %uri, error = %e, "could not subscribe again after reconnecting");
                }
            }
        }
        // Entries whose last subscriber left while this held them.
        shared.passthrough.tidy(&uris);
    });
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
                        "no upstream MCP server lists the resource {uri}; call resources/list or resources/templates/list for the URIs that can be read"
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
        let (up, prompt) = self.prompt_owner(name, &ctx.capabilities).await?;
        let conn = connected(&up, |c| c.has_prompts, "prompts")?;
        let label = format!("prompts/get {prompt}");
        let mut params = GetPromptRequestParams::default();
        params.name = prompt;
        params.arguments = arguments;
        let limit = timeout(&self.shared, &up);
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
        let outcome = up.request_for(&conn, &label, request, limit, ctx).await;
        match answer(&up, limit, "prompts/get", outcome)? {
            ServerResult::GetPromptResult(r) => Ok(wire(&r)),
            other => Err(unexpected(&up, "prompts/get", &other)),
        }
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

#[cfg(test)]
mod tests {
    use super::template_matches;

    #[test]
    fn templates_match_their_expansions_only() {
        assert!(template_matches(
            "test://template/{id}/data",
            "test://template/123/data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://template/1/2/data"
        ));
        assert!(!template_matches(
            "test://template/{id}/data",
            "test://template//data"
        ));
        assert!(template_matches("file:///{+path}", "file:///a/b/c.txt"));
        assert!(template_matches(
            "db://{table}{?limit}",
            "db://users?limit=5"
        ));
        assert!(!template_matches("db://{table}", "other://users"));
        assert!(template_matches("x://fixed", "x://fixed"));
        assert!(template_matches("x://{a}{b}", "x://ab"));
        assert!(!template_matches("x://{a}{b}", "x://a"));
        assert!(template_matches("x://{a}/{b}", "x://é/ü"));
        assert!(!template_matches("x://{a}", "x://"));
    }

    /// Many variables side by side against a URI that almost matches: backtracking tried
    /// every split (minutes for 8 variables and 56 characters); this answers at once. The
    /// thread and its generous wait are only a hang guard.
    #[test]
    fn adjacent_variables_do_not_explode() {
        let cases = [
            ("x://{+a}{+b}{+c}{+d}{+e}{+f}{+g}{+h}#".to_owned(), 56),
            (format!("x://{}#", "{+v}".repeat(40)), 4000),
            (format!("x://{}/#", "{v}".repeat(40)), 4000),
        ];
        for (template, len) in cases {
            let (tx, rx) = std::sync::mpsc::channel();
            let t = template.clone();
            std::thread::spawn(move || {
                let uri = format!("x://{}", "a".repeat(len));
                let miss = template_matches(&t, &uri);
                let hit = template_matches(&t, &format!("{uri}/#"));
                let _ = tx.send((miss, hit));
            });
            let (miss, hit) = rx
                .recv_timeout(std::time::Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("{template} against {len} characters did not finish"));
            assert!(!miss, "{template} matched a URI without its last literal");
            assert!(hit, "{template} did not match its expansion");
        }
    }
}
