//! Served over all servers: the resource meta-tools (`list_mcp_resources`,
//! `read_mcp_resource`) and prompt expansion (`/mcp__<server>__<prompt> key=value`).

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, ErrKind, Part, Tool, ToolResult, ToolSpec};
use rmcp::model::{
    ClientRequest, GetPromptRequest, GetPromptRequestParams, PaginatedRequestParams,
    ReadResourceRequest, ReadResourceRequestParams, ServerResult,
};
use serde_json::{Map, Value, json};

use super::{Shared, upstream::Upstream};
use crate::McpError;
use crate::sync::lock;

/// The catalog family of the resource meta-tools: Quiver's own tools, registered while a
/// connected server offers resources, not an upstream server's tools.
pub const RESOURCE_TOOLS_FAMILY: &str = "mcp:resources";
/// The resource meta-tools' names.
pub const RESOURCE_TOOLS: [&str; 2] = [LIST, READ];
const FAMILY: &str = RESOURCE_TOOLS_FAMILY;
const LIST: &str = "list_mcp_resources";
const READ: &str = "read_mcp_resource";

/// Registers the two meta-tools the first time a server with resources connects.
pub(super) fn ensure_registered(shared: &Arc<Shared>) {
    let any = shared
        .servers()
        .iter()
        .any(|u| u.conn().is_some_and(|c| c.has_resources));
    if !any {
        return;
    }
    let mut done = lock(&shared.meta_registered);
    if *done {
        return;
    }
    *done = true;
    let weak = Arc::downgrade(shared);
    let list = ToolSpec::new(
        LIST,
        "List the resources (documents addressable by URI) that connected MCP servers expose. Use it when you need a document or data an MCP server offers but no tool returns; optionally filter to one server.",
    )
    .with_schema(json!({
        "type": "object",
        "properties": {"server": {"type": "string", "description": "Only this MCP server."}},
        "required": [],
        "additionalProperties": false
    }))
    .read_only();
    let read = ToolSpec::new(
        READ,
        "Read one MCP resource by its URI. Use it after list_mcp_resources, when you need the resource's content.",
    )
        .with_schema(json!({
            "type": "object",
            "properties": {
                "uri": {"type": "string", "description": "The resource URI, as listed by list_mcp_resources."},
                "server": {"type": "string", "description": "The MCP server that lists it (optional)."}
            },
            "required": ["uri"],
            "additionalProperties": false
        }))
        .read_only();
    let report = shared.catalog.register_all(
        FAMILY,
        vec![
            Arc::new(MetaTool {
                spec: list,
                shared: weak.clone(),
            }),
            Arc::new(MetaTool {
                spec: read,
                shared: weak,
            }),
        ],
    );
    for line in report.warning_lines() {
        tracing::warn!("{line}");
    }
}

pub(super) fn unregister(shared: &Shared) {
    shared.catalog.remove_family(FAMILY);
}

struct MetaTool {
    spec: ToolSpec,
    shared: std::sync::Weak<Shared>,
}

/// The servers passing resources through that the caller may read (`ctx`'s capabilities),
/// or only `only` of them.
fn resource_servers(shared: &Shared, only: Option<&str>, ctx: &CallContext) -> Vec<Arc<Upstream>> {
    let mut servers = shared.resource_servers(&ctx.capabilities);
    servers.retain(|u| only.is_none_or(|o| o == u.name()));
    servers
}

/// Why a server's resources cannot be listed.
enum Unlisted {
    /// It is connected and offers no resources (it did not declare them).
    NoneOffered(String),
    /// It is not connected, or failed to list them.
    Unavailable(String),
}

async fn list_resources(up: &Upstream, cap: usize) -> Result<Vec<Value>, Unlisted> {
    let conn = up.conn().ok_or_else(|| {
        Unlisted::Unavailable(format!("MCP server \"{}\" is not connected", up.name()))
    })?;
    if !conn.has_resources {
        return Err(Unlisted::NoneOffered(format!(
            "MCP server \"{}\" offers no resources (it serves tools only)",
            up.name()
        )));
    }
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    loop {
        let request = rmcp::model::ClientRequest::ListResourcesRequest(
            rmcp::model::ListResourcesRequest::with_param(
                PaginatedRequestParams::default().with_cursor(cursor.take()),
            ),
        );
        let (resources, next) =
            super::passthrough::raw_page::<rmcp::model::Resource>(&conn.peer, request, "resources")
                .await
                .map_err(|_| {
                    Unlisted::Unavailable(format!(
                        "MCP server \"{}\" could not list its resources",
                        up.name()
                    ))
                })?;
        for mut v in resources {
            if out.len() >= cap {
                return Ok(out);
            }
            if let Value::Object(m) = &mut v {
                m.insert("server".into(), Value::String(up.name().to_owned()));
            }
            out.push(v);
        }
        match next {
            // A cursor that comes round again would be followed forever.
            Some(c) if !c.is_empty() && seen.insert(c.clone()) => cursor = Some(c),
            _ => return Ok(out),
        }
    }
}

#[async_trait]
impl Tool for MetaTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let Some(shared) = self.shared.upgrade() else {
            return Ok(Envelope::err(
                ErrKind::NotAvailable,
                "the MCP client is closed",
            ));
        };
        let server = input.get("server").and_then(Value::as_str);
        // A server the caller may not read is named as one that does not exist.
        if let Some(s) = server
            && (shared.server(s).is_none() || !ctx.capabilities.allows_server(s))
        {
            // A wrong argument the model can mend: the servers it may read are named.
            let readable: Vec<String> = resource_servers(&shared, None, ctx)
                .iter()
                .map(|u| u.name().to_owned())
                .collect();
            let names = if readable.is_empty() {
                "none serves resources you may read".to_owned()
            } else {
                format!(
                    "the servers whose resources you may read: {}",
                    readable
                        .iter()
                        .map(|n| format!("\"{n}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            let alternatives =
                quiver_registry::did_you_mean(s, readable.iter().map(String::as_str), 3)
                    .into_iter()
                    .map(|(label, score)| quiver_contract::Alternative::new(label, score))
                    .collect();
            return Ok(Envelope::hint(
                quiver_contract::HintKind::Schema,
                format!("no MCP server named \"{s}\"; {names} (or leave out `server`)"),
                alternatives,
            ));
        }
        let cap = shared.opts.list_cap;
        if self.spec.name == LIST {
            let mut all = Vec::new();
            let mut notes = Vec::new();
            for up in resource_servers(&shared, server, ctx) {
                match list_resources(&up, cap.saturating_sub(all.len())).await {
                    Ok(items) => all.extend(items),
                    // Named, a server that offers none says so (not an error: the list
                    // is empty); unnamed, it is left out without a word.
                    Err(Unlisted::NoneOffered(e)) if server.is_some() => {
                        return Ok(Envelope::ok(Value::Array(Vec::new()))
                            .with_warning(quiver_contract::Warning::new("no_resources", e)));
                    }
                    Err(Unlisted::NoneOffered(_)) => {}
                    Err(Unlisted::Unavailable(e)) if server.is_some() => {
                        return Ok(Envelope::err(ErrKind::NotAvailable, e));
                    }
                    Err(Unlisted::Unavailable(e)) => notes.push(e),
                }
            }
            let mut env = Envelope::ok(Value::Array(all));
            for n in notes {
                env.push_warning(quiver_contract::Warning::new("unavailable", n));
            }
            return Ok(env);
        }
        let Some(uri) = input.get("uri").and_then(Value::as_str) else {
            return Ok(Envelope::hint(
                quiver_contract::HintKind::Schema,
                "`uri` is required",
                vec![],
            ));
        };
        // A result Quiver keeps for the session is read back through `read_result`, not from
        // an upstream (which would answer that it has no such resource).
        if let Some(id) = uri.strip_prefix(quiver_registry::kept::RESULT_URI_PREFIX) {
            return Ok(Envelope::hint(
                quiver_contract::HintKind::Schema,
                format!(
                    "{uri} is a result Quiver keeps for this conversation, not an MCP server's resource: call read_result {} (its \"page\" picks the part)",
                    serde_json::json!({"id": id, "page": 1})
                ),
                vec![],
            ));
        }
        // The server that lists the URI, else the only candidate.
        let mut candidates = resource_servers(&shared, server, ctx);
        if candidates.len() > 1 {
            let mut owner = None;
            for up in &candidates {
                if let Ok(items) = list_resources(up, cap).await
                    && items
                        .iter()
                        .any(|r| r.get("uri").and_then(Value::as_str) == Some(uri))
                {
                    owner = Some(up.clone());
                    break;
                }
            }
            candidates = owner.into_iter().collect();
        }
        let [up] = candidates.as_slice() else {
            return Ok(Envelope::err(
                ErrKind::ToolFailed,
                format!(
                    "no connected MCP server lists the resource `{uri}`; pass `server` or call list_mcp_resources"
                ),
            ));
        };
        let Some(conn) = up.conn() else {
            return Ok(Envelope::err(
                ErrKind::NotAvailable,
                format!("MCP server \"{}\" is not connected", up.name()),
            ));
        };
        // Like a tool call upstream: bounded by the call timeout, cancelled with the call, and
        // what the server asks the client meanwhile goes to this call's client.
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(
            ReadResourceRequestParams::new(uri.to_owned()),
        ));
        let limit = up.call_limit(ctx);
        let label = format!("{READ} {uri}");
        let result = match up.request_for(&conn, &label, request, limit, ctx).await {
            Ok(ServerResult::ReadResourceResult(r)) => r,
            Ok(_) => {
                return Ok(Envelope::err(
                    ErrKind::ToolFailed,
                    format!(
                        "MCP server \"{}\" answered resources/read with something else",
                        up.name()
                    ),
                ));
            }
            Err(rmcp::service::ServiceError::McpError(e)) => {
                return Ok(Envelope::err(
                    ErrKind::ToolFailed,
                    format!("read_mcp_resource failed: {}", e.message),
                ));
            }
            Err(rmcp::service::ServiceError::Timeout { .. }) => {
                return Ok(Envelope::err(
                    ErrKind::Timeout,
                    format!(
                        "MCP server \"{}\" did not answer resources/read within {}",
                        up.name(),
                        quiver_contract::duration_text(limit)
                    ),
                ));
            }
            Err(rmcp::service::ServiceError::Cancelled { .. }) => {
                return Ok(Envelope::err(ErrKind::Cancelled, "the call was cancelled"));
            }
            Err(_) => {
                return Ok(Envelope::err(
                    ErrKind::NotAvailable,
                    format!("MCP server \"{}\" could not read {uri}", up.name()),
                ));
            }
        };
        let wire = serde_json::to_value(&result).unwrap_or(Value::Null);
        let mut texts = Vec::new();
        let mut parts = Vec::new();
        for c in wire
            .get("contents")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let s = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
            match (s("text"), s("blob")) {
                (Some(t), _) => texts.push(t),
                (None, Some(b)) => parts.push(Part::resource_blob(
                    s("uri").unwrap_or_default(),
                    s("mimeType"),
                    b,
                )),
                _ => {}
            }
        }
        let mut env = Envelope::text(texts.join("\n"));
        for p in parts {
            env = env.with_part(p);
        }
        Ok(env)
    }
}

/// Splits `key=value key2="two words"` into a JSON object of strings.
fn parse_args(s: &str) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else {
            return Err(format!("expected key=value, found {rest:?}"));
        };
        let key = rest[..eq].trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(format!("bad argument name {key:?}"));
        }
        let after = &rest[eq + 1..];
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q
                .find('"')
                .ok_or_else(|| format!("unterminated quote for {key}"))?;
            (&q[..end], &q[end + 1..])
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        out.insert(key.to_owned(), Value::String(value.to_owned()));
        rest = next.trim_start();
    }
    Ok(out)
}

pub(super) async fn expand_prompt(
    shared: &Shared,
    input: &str,
    ctx: &CallContext,
) -> Result<Option<String>, McpError> {
    let Some(cmd) = input.trim_start().strip_prefix('/') else {
        return Ok(None);
    };
    let (head, args) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
    let Some((prefix, prompt)) = quiver_contract::split_mcp_name(head) else {
        return Ok(None);
    };
    let Some(up) = shared
        .prompt_servers(&ctx.capabilities)
        .into_iter()
        .find(|u| u.cfg.prefix == prefix)
    else {
        return Ok(None);
    };
    let upstream_err = |reason: String| McpError::Upstream {
        server: up.name().to_owned(),
        reason,
    };
    let args = parse_args(args).map_err(upstream_err)?;
    let conn = up
        .conn()
        .filter(|c| c.has_prompts)
        .ok_or_else(|| upstream_err("not connected, or it offers no prompts".into()))?;
    let mut params = GetPromptRequestParams::default();
    params.name = prompt.to_owned();
    params.arguments = (!args.is_empty()).then_some(args);
    // Registered like any request in flight (the server's own requests go to the caller's
    // client, refused without one, never routed to another caller), bounded by the call
    // timeout.
    let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
    let limit = up.cfg.call_timeout.unwrap_or(shared.opts.call_timeout);
    let label = format!("prompts/get {prompt}");
    let result = match up.request_for(&conn, &label, request, limit, ctx).await {
        Ok(ServerResult::GetPromptResult(r)) => r,
        Ok(_) => {
            return Err(upstream_err(format!(
                "prompt {prompt:?}: answered with something else than a prompt"
            )));
        }
        Err(rmcp::service::ServiceError::McpError(d)) => {
            return Err(upstream_err(format!("prompt {prompt:?}: {}", d.message)));
        }
        Err(rmcp::service::ServiceError::Timeout { .. }) => {
            return Err(upstream_err(format!(
                "prompt {prompt:?}: no answer within {}",
                quiver_contract::duration_text(limit)
            )));
        }
        Err(rmcp::service::ServiceError::Cancelled { .. }) => {
            return Err(upstream_err(format!("prompt {prompt:?}: cancelled")));
        }
        Err(_) => {
            return Err(upstream_err(format!(
                "prompt {prompt:?} could not be fetched"
            )));
        }
    };
    let wire = serde_json::to_value(&result).unwrap_or(Value::Null);
    let texts: Vec<String> = wire
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let c = m.get("content")?;
            match c.get("type").and_then(Value::as_str) {
                Some("text") => c.get("text").and_then(Value::as_str).map(str::to_owned),
                Some("resource") => c
                    .get("resource")
                    .and_then(|r| r.get("text"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                _ => None,
            }
        })
        .collect();
    Ok(Some(texts.join("\n\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_args_parse() {
        let a = parse_args(r#"number=42 title="two words" x="#).unwrap();
        assert_eq!(a["number"], "42");
        assert_eq!(a["title"], "two words");
        assert_eq!(a["x"], "");
        assert!(parse_args("novalue").is_err());
    }
}
