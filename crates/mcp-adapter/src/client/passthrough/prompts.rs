//! The upstreams' prompts as served downstream: their listing (under `mcp__<prefix>__`, or
//! bare for a `bare_prompts` server), which server serves a name, and `prompts/get`.

use std::{collections::HashMap, sync::Arc};

use quiver_contract::{CallContext, Capabilities};
use rmcp::model::{
    ClientRequest, GetPromptRequest, GetPromptRequestParams, PaginatedRequestParams, ServerResult,
};
use serde_json::{Map, Value};

use super::{answer, connected, pages, raw_page, server_rank, timeout, unexpected, wire};
use crate::{
    client::{McpClient, upstream::Upstream},
    content::ContentError,
    sync::lock,
};

impl McpClient {
    /// Every prompt `caps` may list, under the name it is served by, gathered from the
    /// servers at once; the index of bare names is brought up to date on the way.
    pub(super) async fn all_prompts(
        &self,
        caps: &Capabilities,
    ) -> Result<Vec<Value>, ContentError> {
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
    pub(super) async fn prompt_owner(
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

    /// `prompts/get` of an upstream's prompt.
    pub(super) async fn get_upstream_prompt(
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
        match answer(&up, limit, "prompts/get", outcome) {
            Ok(ServerResult::GetPromptResult(r)) => Ok(wire(&r)),
            Ok(other) => Err(unexpected(&up, "prompts/get", &other)),
            // A name the server does not list (a near miss of one it does) is answered as
            // Quiver answers an unknown prompt, with the look-alike, rather than with the
            // server's words about its own name for it.
            Err(ContentError::Upstream {
                code: -32602,
                message,
            }) => {
                let listed: Vec<String> = self
                    .all_prompts(&ctx.capabilities)
                    .await
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|p| p.get("name").and_then(Value::as_str).map(str::to_owned))
                    .collect();
                if listed.is_empty() || listed.iter().any(|n| n == name) {
                    return Err(ContentError::Upstream {
                        code: -32602,
                        message,
                    });
                }
                Err(ContentError::NotFound(format!(
                    "unknown prompt {name:?}{}; call prompts/list for the prompts that exist",
                    quiver_registry::suggestion(name, listed.iter().map(String::as_str))
                )))
            }
            Err(e) => Err(e),
        }
    }
}
