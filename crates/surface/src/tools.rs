//! The built-in tools of the surface: `tool_search` and `describe_tool`.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, ErrKind, Tool, ToolError, ToolResult, ToolSpec};
use quiver_registry::did_you_mean;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    DEFAULT_SESSION, DESCRIBE_TOOL, Surface, TOOL_SEARCH, config::MAX_SEARCH_LIMIT,
    search::is_meaningful_query,
};

/// The hint for a query without search words.
pub const BLANK_QUERY_HINT: &str = "the query has no search words: it is blank, or only stop words, single letters, punctuation or words too long to be words (over 40 letters). Describe the capability you need in a few keywords, e.g. {\"query\": \"read csv file\"} or {\"query\": \"send slack message\"}.";

/// How long `tool_search` waits for the search index to take in the catalog changes made
/// before it: the index applies a change in microseconds, so this only bounds a stalled
/// index task.
const INDEX_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The warning of a search that found nothing.
pub const NO_MATCH_HINT: &str = "no tool you can use matches these words. Search again with other words for what the tool does, its action and its object (e.g. \"convert time zone\", \"query postgres database\"); tool descriptions are mostly in English. If nothing fits, no tool here does it.";

/// `tool_search` and `describe_tool`, bound to `surface`. Register them in the catalog (for
/// example in the `core` family); they hold the surface weakly.
pub fn core_tools(surface: &Arc<Surface>) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ToolSearch {
            spec: tool_search_spec(surface.config().search_default_limit),
            surface: Arc::downgrade(surface),
        }),
        Arc::new(DescribeTool {
            spec: describe_tool_spec(),
            surface: Arc::downgrade(surface),
        }),
    ]
}

fn tool_search_spec(default_limit: usize) -> ToolSpec {
    ToolSpec::new(
        TOOL_SEARCH,
        "Finds tools by what they do and loads them so you can call them by name. Use it when none of your tools fits the task; describe the capability in a few keywords.",
    )
    .read_only()
    .with_schema(json!({
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "What you need, in a few keywords (e.g. \"read csv file\")."
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_SEARCH_LIMIT,
                "description": format!("How many tools to return (default {default_limit}).")
            }
        },
        "required": ["query"],
        "additionalProperties": false
    }))
}

fn describe_tool_spec() -> ToolSpec {
    ToolSpec::new(
        DESCRIBE_TOOL,
        "Returns the full definition of a tool (description and argument schema) and loads it so you can call it. Use it for tools listed with a summary only.",
    )
    .read_only()
    .with_schema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The tool's exact name."}
        },
        "required": ["name"],
        "additionalProperties": false
    }))
}

fn session_of(ctx: &CallContext) -> &str {
    ctx.session.as_deref().unwrap_or(DEFAULT_SESSION)
}

fn upgrade(surface: &Weak<Surface>) -> Result<Arc<Surface>, ToolError> {
    surface
        .upgrade()
        .ok_or_else(|| ToolError::err(ErrKind::Internal, "the tool surface has shut down"))
}

fn args<T: for<'de> Deserialize<'de>>(tool: &str, input: Value) -> Result<T, ToolError> {
    serde_json::from_value(input).map_err(|e| {
        ToolError::schema_hint(
            format!("the arguments do not fit `{tool}`: {e}"),
            Vec::new(),
        )
    })
}

struct ToolSearch {
    spec: ToolSpec,
    surface: Weak<Surface>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    #[serde(default, deserialize_with = "whole_number")]
    limit: Option<usize>,
}

/// A count given as a JSON number: `2` and `2.0` (JSON Schema's `integer` takes both; some
/// models write one, some the other), not `2.5` or `-1`.
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(u) = n.as_u64() {
        return Ok(Some(usize::try_from(u).unwrap_or(usize::MAX)));
    }
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= u32::MAX as f64 => Ok(Some(f as usize)),
        _ => Err(serde::de::Error::custom(format!(
            "`limit` must be a whole number from 1 to {MAX_SEARCH_LIMIT}, not {n}"
        ))),
    }
}

#[async_trait]
impl Tool for ToolSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// It reads Quiver's own catalog and working set; it never asks the client.
    fn reaches_client(&self) -> bool {
        false
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let a: SearchArgs = args(TOOL_SEARCH, input)?;
        if a.limit.is_some_and(|l| l == 0 || l > MAX_SEARCH_LIMIT) {
            return Err(ToolError::schema_hint(
                format!("`limit` must be between 1 and {MAX_SEARCH_LIMIT}"),
                Vec::new(),
            ));
        }
        if !is_meaningful_query(&a.query) {
            return Err(ToolError::fetch_hint(BLANK_QUERY_HINT, Vec::new()));
        }
        let surface = upgrade(&self.surface)?;
        surface.index_current(INDEX_WAIT).await;
        let outcome = surface.tool_search(session_of(ctx), &a.query, a.limit, &ctx.capabilities);
        let data = serde_json::to_value(&outcome).map_err(|e| {
            ToolError::err(ErrKind::Internal, format!("cannot encode the result: {e}"))
        })?;
        let mut env = Envelope::ok(data);
        // Nothing matched: say what to do, or an empty list reads as "no such tool exists".
        if outcome.hits.is_empty() {
            env = env.with_warning(quiver_contract::Warning::new("no_match", NO_MATCH_HINT));
        } else if crate::SessionKey::parse(session_of(ctx)).kind() == crate::SessionKind::Request {
            // A request that names no conversation keeps its working set for itself alone:
            // the found tools are not on the client's next list. They are called by name.
            env = env.with_warning(quiver_contract::Warning::new(
                "not_listed",
                "this request names no conversation (no session, token or conversation key), so the tools found are not added to your tool list: call them by name, or send a `Quiver-Conversation` header (or `_meta[\"quiver/conversation\"]`) to keep them listed",
            ));
        }
        // `failed` and `displaced` read as broken tools without words: say what they mean.
        let names = |list: &[&str]| {
            let shown: Vec<String> = list
                .iter()
                .take(10)
                .map(|n| format!("`{}`", quiver_contract::quoted_name(n)))
                .collect();
            match list.len() {
                n if n > shown.len() => {
                    format!("{}, and {} more", shown.join(", "), n - shown.len())
                }
                _ => shown.join(", "),
            }
        };
        let over: Vec<&str> = outcome
            .failed
            .iter()
            .filter(|f| f.reason == crate::FailReason::OverBudget)
            .map(|f| f.name.as_str())
            .collect();
        if !over.is_empty() {
            let round = &surface.config().round;
            env = env.with_warning(quiver_contract::Warning::new(
                "not_added",
                format!(
                    "{} matched but did not fit in your tool list this round (at most {} tools and {} bytes of definitions): they work all the same when called by name, if your client lets you call a tool that is not listed; a narrower search lists fewer",
                    names(&over),
                    round.max_definitions,
                    round.max_bytes
                ),
            ));
        }
        let gone: Vec<&str> = outcome
            .failed
            .iter()
            .filter(|f| f.reason == crate::FailReason::LoadFailed)
            .map(|f| f.name.as_str())
            .collect();
        if !gone.is_empty() {
            env = env.with_warning(quiver_contract::Warning::new(
                "not_added",
                format!(
                    "{} left the catalog as this search ran (its server went away or was reloaded): search again in a moment",
                    names(&gone)
                ),
            ));
        }
        if !outcome.displaced.is_empty() {
            let displaced: Vec<&str> = outcome.displaced.iter().map(String::as_str).collect();
            env = env.with_warning(quiver_contract::Warning::new(
                "displaced",
                format!(
                    "{} left your tool list to make room for these hits: they still work when called by name, and a search lists them again",
                    names(&displaced)
                ),
            ));
        }
        // A limit above what a working set holds is cut to it: say so, or fewer hits than
        // asked for read as all there is.
        let holds = surface.config().working_set.max_tools;
        Ok(match a.limit {
            Some(asked) if asked > holds => env.with_warning(quiver_contract::Warning::new(
                "limit_capped",
                format!(
                    "at most {holds} tools are returned per search (a working set holds {holds}); search again with other words for more"
                ),
            )),
            _ => env,
        })
    }
}

struct DescribeTool {
    spec: ToolSpec,
    surface: Weak<Surface>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescribeArgs {
    name: String,
}

#[async_trait]
impl Tool for DescribeTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// It reads Quiver's own catalog and working set; it never asks the client.
    fn reaches_client(&self) -> bool {
        false
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let a: DescribeArgs = args(DESCRIBE_TOOL, input)?;
        if a.name.trim().is_empty() {
            return Err(ToolError::schema_hint(
                "`name` is empty: give the name of a tool, as your tool list or tool_search's results spell it",
                vec![],
            ));
        }
        let surface = upgrade(&self.surface)?;
        let session = session_of(ctx);
        match surface.describe(session, &a.name, &ctx.capabilities) {
            Some((spec, paged)) => {
                let mut data = spec_json(&spec);
                let loaded = paged.exposed.contains(&spec.name);
                data["loaded"] = json!(loaded);
                if !paged.evicted.is_empty() {
                    data["evicted"] = json!(paged.evicted);
                }
                let env = Envelope::ok(data);
                if loaded {
                    return Ok(env);
                }
                // Said in a warning, which the result limit does not cut, not only as
                // `loaded: false` after the definition, which a long one pushes past it.
                let why = if paged.over_budget.contains(&spec.name) {
                    let round = &surface.config().round;
                    let bytes = spec.definition_bytes();
                    // Alone over the budget, it never fits: nothing took its room.
                    if bytes > round.max_bytes {
                        format!(
                            "its definition ({bytes} bytes) is larger than all a round lists ({} bytes), so it can never be listed",
                            round.max_bytes
                        )
                    } else {
                        format!(
                            "it does not fit in what a round lists (at most {} tools and {} bytes, and the tools ranked above it took that room; its definition is {bytes} bytes)",
                            round.max_definitions, round.max_bytes
                        )
                    }
                } else {
                    "it could not be added this round".to_owned()
                };
                Ok(env.with_warning(quiver_contract::Warning::new(
                    "not_loaded",
                    format!(
                        "`{}` was not added to your tool list: {why}. Its definition is above: a call of it by name still runs, if your client lets you call a tool that is not listed; otherwise use another tool",
                        quiver_contract::quoted_name(&spec.name)
                    ),
                )))
            }
            None => {
                let mode = surface.session_mode(session);
                // A tool the caller may use in another mode but this mode leaves out is
                // refused as a call of it is, not called unknown in a schema hint. An
                // internal tool, listed in no mode, stays unknown.
                let can_search = ctx.capabilities.allows(crate::TOOL_SEARCH);
                let elsewhere = quiver_contract::Mode::ALL
                    .into_iter()
                    .any(|m| surface.visible(&a.name, m, &ctx.capabilities));
                if elsewhere
                    && let Some(why) =
                        surface.mode_refusal(&a.name, mode, &ctx.capabilities, can_search)
                {
                    return Err(ToolError::err(quiver_contract::ErrKind::Forbidden, why));
                }
                // Said as a call of an unknown tool is: the arguments were right, the
                // name is not one there is.
                let names = surface.visible_names(mode, &ctx.capabilities);
                let near: Vec<String> = did_you_mean(&a.name, names.iter().map(String::as_str), 3)
                    .into_iter()
                    .map(|(label, _)| format!("`{label}`"))
                    .collect();
                let mut message = format!(
                    "there is no tool named `{}` available to you.",
                    quiver_contract::quoted_name(&a.name)
                );
                if !near.is_empty() {
                    message.push_str(&format!(" Did you mean {}?", near.join(", ")));
                }
                message.push_str(if can_search {
                    " Call tool_search with a few keywords to find tools."
                } else {
                    " Use one of the tools in your tool list."
                });
                Err(ToolError::err(
                    quiver_contract::ErrKind::UndefinedTool,
                    message,
                ))
            }
        }
    }
}

/// The JSON of a spec for `describe_tool`.
fn spec_json(spec: &ToolSpec) -> Value {
    let mut v = json!({
        "name": spec.name,
        "description": spec.description,
        "input_schema": spec.input_schema,
        "read_only": spec.is_read_only(),
    });
    if let Some(out) = &spec.output_schema {
        v["output_schema"] = out.clone();
    }
    v
}
