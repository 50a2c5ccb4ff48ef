//! `quiver serve` over the built-in tools plus fixture tools, for the e2e suite:
//! `weather_forecast` (found by `tool_search`), `slow_count` (runs until its time is up or
//! it is cancelled), `cancelled_calls` (waits until that many calls were cancelled), and the
//! conformance suite's tools, including those that log, sample and elicit through the call's
//! client channel.
//!
//! Usage: `quiver-fixture-server [--auth JSON] [--progress-ms N] [--upstream stdio|http]
//! [--upstream quiver-stdio --quiver BIN]`; prints the URL on stdout. With `--upstream`, the
//! conformance suite's resources, prompts and completions come from a second fixture
//! process, an upstream MCP server reached over that transport through Quiver's MCP client
//! (prompts configured `bare_prompts`), and pass through to this server's clients. With
//! `quiver-stdio`, that upstream is `BIN serve --stdio` (the real `quiver`), itself
//! configured with the content fixture as its upstream: the content passes through two
//! Quiver servers, one of them on stdio.
//!
//! `quiver-fixture-server --content-upstream stdio|http` is that upstream: a Quiver MCP
//! server (core tools only) serving the conformance content itself (`fixture_content.rs`).

#[path = "fixture_content.rs"]
mod content;

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use async_trait::async_trait;
use quiver_contract::{
    CallContext, ChannelError, Envelope, LogLevel, Part, Tool, ToolError, ToolResult, ToolSpec,
};
use quiver_host::{Families, assemble_catalog, serve};
use quiver_mcp_adapter::{
    ClientOptions, ContentSource, InboundAuth, McpClient, ServerConfig, ServerOptions, validate_all,
};
use quiver_registry::{Catalog, Dispatcher};
use quiver_surface::{MemoryUsage, Surface, SurfaceConfig, core_tools};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    sync::watch,
};

struct Weather(ToolSpec);

#[async_trait]
impl Tool for Weather {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, input: Value, _ctx: &CallContext) -> ToolResult {
        let city = input["city"].as_str().unwrap_or_default().to_owned();
        Ok(Envelope::ok(
            json!({"city": city, "forecast": "sunny", "high_c": 21}),
        ))
    }
}

struct SlowCount {
    spec: ToolSpec,
    cancelled: watch::Sender<u64>,
}

#[async_trait]
impl Tool for SlowCount {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let ms = input["ms"].as_u64().unwrap_or(1000);
        // Counts the call as cancelled if it does not run to the end: either it sees its
        // token fire, or the dispatcher drops it on cancellation.
        let guard = CountOnDrop(Some(self.cancelled.clone()));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {
                guard.disarm();
                Ok(Envelope::ok(json!(format!("counted for {ms} ms"))))
            }
            _ = ctx.cancel.cancelled() => Err(ToolError::failed("cancelled")),
        }
    }
}

struct CountOnDrop(Option<watch::Sender<u64>>);

impl CountOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            tx.send_modify(|n| *n += 1);
            // The e2e suite reads this line after the URL to see a call was cancelled.
            println!("slow_count cancelled");
        }
    }
}

struct CancelledCalls {
    spec: ToolSpec,
    cancelled: watch::Receiver<u64>,
}

#[async_trait]
impl Tool for CancelledCalls {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, input: Value, _ctx: &CallContext) -> ToolResult {
        let at_least = input["at_least"].as_u64().unwrap_or(0);
        let mut rx = self.cancelled.clone();
        let waited =
            tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|n| *n >= at_least)).await;
        let n = *self.cancelled.borrow();
        match waited {
            Ok(_) => Ok(Envelope::ok(json!({"cancelled": n}))),
            Err(_) => Err(ToolError::failed(format!(
                "only {n} calls were cancelled after 10 s"
            ))),
        }
    }
}

/// A tool that waits `delay` (watching cancellation), then returns `make()`: the tools the
/// MCP conformance suite's server scenarios call.
struct Fixed {
    spec: ToolSpec,
    delay: Duration,
    make: fn() -> ToolResult,
}

#[async_trait]
impl Tool for Fixed {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _input: Value, ctx: &CallContext) -> ToolResult {
        tokio::select! {
            _ = tokio::time::sleep(self.delay) => (self.make)(),
            _ = ctx.cancel.cancelled() => Err(ToolError::failed("cancelled")),
        }
    }
}

use content::PNG;

// A tiny WAV, base64.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=";

fn image() -> Part {
    Part::image("image/png", PNG)
}

fn resource() -> Part {
    Part::resource_text(
        "test://embedded-resource",
        Some("text/plain".into()),
        "This is an embedded resource content.",
    )
}

/// A read-only fixture tool whose answer is fixed, after `delay_ms`.
fn fixed_with(
    name: &str,
    description: &str,
    schema: Value,
    delay_ms: u64,
    make: fn() -> ToolResult,
) -> Arc<dyn Tool> {
    Arc::new(Fixed {
        spec: ToolSpec::new(name, description)
            .read_only()
            .with_schema(schema),
        delay: Duration::from_millis(delay_ms),
        make,
    })
}

fn conformance_tools() -> Vec<Arc<dyn Tool>> {
    let fixed = |name: &str, description: &str, delay_ms: u64, make: fn() -> ToolResult| {
        fixed_with(
            name,
            description,
            json!({"type": "object", "properties": {}}),
            delay_ms,
            make,
        )
    };
    vec![
        fixed(
            "test_simple_text",
            "Conformance: returns simple text.",
            0,
            || {
                Ok(Envelope::ok(json!(
                    "This is a simple text response for testing."
                )))
            },
        ),
        fixed(
            "test_image_content",
            "Conformance: returns an image.",
            0,
            || Ok(Envelope::ok(json!("an image")).with_part(image())),
        ),
        fixed(
            "test_audio_content",
            "Conformance: returns audio.",
            0,
            || Ok(Envelope::ok(json!("a sound")).with_part(Part::audio("audio/wav", WAV))),
        ),
        fixed(
            "test_embedded_resource",
            "Conformance: returns an embedded resource.",
            0,
            || Ok(Envelope::ok(json!("a resource")).with_part(resource())),
        ),
        fixed(
            "test_multiple_content_types",
            "Conformance: returns text, an image and a resource.",
            0,
            || {
                Ok(Envelope::ok(json!("Multiple content types test:"))
                    .with_part(image())
                    .with_part(resource()))
            },
        ),
        fixed(
            "test_error_handling",
            "Conformance: always fails.",
            0,
            || {
                Err(ToolError::failed(
                    "This tool intentionally returns an error for testing",
                ))
            },
        ),
        fixed(
            "test_tool_with_progress",
            "Conformance: runs long enough to report progress.",
            500,
            || Ok(Envelope::ok(json!("Progress test completed"))),
        ),
    ]
}

/// A conformance tool that talks back to the client through the call's channel.
struct Talkback {
    spec: ToolSpec,
    run: Talk,
}

#[derive(Clone, Copy)]
enum Talk {
    Logging,
    Sampling,
    Elicitation,
    ElicitationDefaults,
    ElicitationEnums,
    /// Asks the user to open a URL (URL-mode elicitation).
    ElicitationUrl,
    /// Asks twice in turn (an elicitation, then a sampling request naming the answer): two
    /// round trips on the stateless protocol.
    AskTwice,
}

fn channel_failed(e: ChannelError) -> ToolError {
    ToolError::failed(e.to_string())
}

fn elicitation_text(result: &Value) -> String {
    format!(
        "Elicitation completed: action={}, content={}",
        result["action"].as_str().unwrap_or("unknown"),
        result.get("content").cloned().unwrap_or(json!({}))
    )
}

#[async_trait]
impl Tool for Talkback {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        match self.run {
            Talk::Logging => {
                let steps = [
                    "Tool execution started",
                    "Tool processing data",
                    "Tool execution completed",
                ];
                for (i, step) in steps.into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    ctx.log(LogLevel::Info, Some("fixture"), json!(step)).await;
                }
                Ok(Envelope::ok(json!("Logging test completed")))
            }
            Talk::Sampling => {
                let prompt = input["prompt"].as_str().unwrap_or_default();
                let result = ctx
                    .create_message(ask_llm(prompt, 100))
                    .await
                    .map_err(channel_failed)?;
                let text = result["content"]["text"].as_str().unwrap_or_default();
                Ok(Envelope::ok(json!(format!("LLM response: {text}"))))
            }
            Talk::Elicitation => {
                let message = input["message"].as_str().unwrap_or_default();
                let result = ctx
                    .elicit(json!({
                        "message": message,
                        "requestedSchema": {
                            "type": "object",
                            "properties": {
                                "username": {"type": "string", "description": "User's response"},
                                "email": {"type": "string", "description": "User's email address"}
                            },
                            "required": ["username", "email"]
                        }
                    }))
                    .await
                    .map_err(channel_failed)?;
                Ok(Envelope::ok(json!(format!(
                    "User response: action={}, content={}",
                    result["action"].as_str().unwrap_or("unknown"),
                    result.get("content").cloned().unwrap_or(json!({}))
                ))))
            }
            Talk::ElicitationDefaults => {
                let result = ctx
                    .elicit(json!({
                        "message": "Please review and update the form fields with defaults",
                        "requestedSchema": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                                "age": {"type": "integer", "description": "User age", "default": 30},
                                "score": {"type": "number", "description": "User score", "default": 95.5},
                                "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active"},
                                "verified": {"type": "boolean", "description": "Verification status", "default": true}
                            }
                        }
                    }))
                    .await
                    .map_err(channel_failed)?;
                Ok(Envelope::ok(json!(elicitation_text(&result))))
            }
            Talk::ElicitationEnums => {
                let result = ctx
                    .elicit(json!({
                        "message": "Please select options from the enum fields",
                        "requestedSchema": {
                            "type": "object",
                            "properties": {
                                "untitledSingle": {"type": "string", "description": "Untitled single-select", "enum": ["option1", "option2", "option3"]},
                                "titledSingle": {"type": "string", "description": "Titled single-select", "oneOf": [
                                    {"const": "value1", "title": "First Option"},
                                    {"const": "value2", "title": "Second Option"},
                                    {"const": "value3", "title": "Third Option"}
                                ]},
                                "legacyEnum": {"type": "string", "description": "Legacy titled enum", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
                                "untitledMulti": {"type": "array", "description": "Untitled multi-select", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                                "titledMulti": {"type": "array", "description": "Titled multi-select", "items": {"anyOf": [
                                    {"const": "value1", "title": "First Choice"},
                                    {"const": "value2", "title": "Second Choice"},
                                    {"const": "value3", "title": "Third Choice"}
                                ]}}
                            }
                        }
                    }))
                    .await
                    .map_err(channel_failed)?;
                Ok(Envelope::ok(json!(elicitation_text(&result))))
            }
            Talk::ElicitationUrl => {
                let result = ctx
                    .elicit(json!({
                        "mode": "url",
                        "message": "Sign in to continue",
                        "url": "https://example.com/sign-in",
                        "elicitationId": "sign-in-1"
                    }))
                    .await
                    .map_err(channel_failed)?;
                Ok(Envelope::ok(json!(elicitation_text(&result))))
            }
            Talk::AskTwice => {
                let answer = ctx
                    .elicit(json!({
                        "message": "Who is asking?",
                        "requestedSchema": {"type": "object", "properties": {
                            "name": {"type": "string", "description": "Your name"}
                        }}
                    }))
                    .await
                    .map_err(channel_failed)?;
                let name = answer["content"]["name"]
                    .as_str()
                    .unwrap_or("nobody")
                    .to_owned();
                let result = ctx
                    .create_message(ask_llm(&format!("greet {name}"), 100))
                    .await
                    .map_err(channel_failed)?;
                let text = result["content"]["text"].as_str().unwrap_or_default();
                Ok(Envelope::ok(json!(format!(
                    "asked {name}, then sampled: {text}"
                ))))
            }
        }
    }
}

fn talkback_tools() -> Vec<Arc<dyn Tool>> {
    let tool = |name: &str, description: &str, schema: Value, run: Talk| {
        Arc::new(Talkback {
            spec: ToolSpec::new(name, description)
                .read_only()
                .with_schema(schema),
            run,
        }) as Arc<dyn Tool>
    };
    let none = || json!({"type": "object", "properties": {}});
    let one = |field: &str| json!({"type": "object", "properties": {field: {"type": "string"}}, "required": [field]});
    vec![
        tool(
            "test_tool_with_logging",
            "Conformance: sends three log messages while it runs.",
            none(),
            Talk::Logging,
        ),
        tool(
            "test_sampling",
            "Conformance: asks the client for an LLM completion of `prompt`.",
            one("prompt"),
            Talk::Sampling,
        ),
        tool(
            "test_elicitation",
            "Conformance: asks the client's user for a username and an email.",
            one("message"),
            Talk::Elicitation,
        ),
        tool(
            "test_elicitation_sep1034_defaults",
            "Conformance: elicitation with default values (SEP-1034).",
            none(),
            Talk::ElicitationDefaults,
        ),
        tool(
            "test_elicitation_sep1330_enums",
            "Conformance: elicitation with the five enum schema variants (SEP-1330).",
            none(),
            Talk::ElicitationEnums,
        ),
        tool(
            "sign_in_by_url",
            "Fixture: asks the client's user to open a sign-in page (URL-mode elicitation).",
            none(),
            Talk::ElicitationUrl,
        ),
        tool(
            "ask_twice",
            "Fixture: asks the client's user for a name, then the client's LLM to greet it.",
            none(),
            Talk::AskTwice,
        ),
    ]
}

/// The fixtures of the conformance suite's `input-required-result-*` scenarios (SEP-2322,
/// 2026-07-28): each asks the client through its call's channel under the names the suite
/// expects; on the stateless protocol Quiver turns the requests into `InputRequiredResult`
/// rounds and keeps the call waiting between them (it is not re-run per round).
struct InputRound {
    spec: ToolSpec,
    run: Round,
}

#[derive(Clone, Copy)]
enum Round {
    Elicitation,
    Sampling,
    ListRoots,
    RequestState,
    MultipleInputs,
    Rounds,
    TamperedState,
    Capabilities,
    /// Needs sampling and fails without it: on 2026-07-28 the call is the -32021 error.
    MissingCapability,
}

fn ask_name(message: &str, field: &str) -> Value {
    json!({
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {field: {"type": "string"}},
            "required": [field]
        }
    })
}

fn ask_llm(text: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        "maxTokens": max_tokens
    })
}

#[async_trait]
impl Tool for InputRound {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _input: Value, ctx: &CallContext) -> ToolResult {
        const ELICIT: &str = "elicitation/create";
        const SAMPLE: &str = "sampling/createMessage";
        const ROOTS: &str = "roots/list";
        let text = match self.run {
            Round::Elicitation => {
                let a = ctx
                    .request_named("user_name", ELICIT, ask_name("What is your name?", "name"))
                    .await
                    .map_err(channel_failed)?;
                format!(
                    "Hello, {}!",
                    a["content"]["name"].as_str().unwrap_or("stranger")
                )
            }
            Round::Sampling => {
                let a = ctx
                    .request_named(
                        "capital_question",
                        SAMPLE,
                        ask_llm("What is the capital of France?", 100),
                    )
                    .await
                    .map_err(channel_failed)?;
                format!(
                    "The model said: {}",
                    a["content"]["text"].as_str().unwrap_or_default()
                )
            }
            Round::ListRoots => {
                let a = ctx
                    .request_named("client_roots", ROOTS, json!({}))
                    .await
                    .map_err(channel_failed)?;
                format!("The client's roots: {}", a["roots"])
            }
            Round::RequestState | Round::TamperedState => {
                let schema = json!({
                    "message": "Please confirm",
                    "requestedSchema": {
                        "type": "object",
                        "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"]
                    }
                });
                let a = ctx
                    .request_named("confirm", ELICIT, schema)
                    .await
                    .map_err(channel_failed)?;
                // Quiver checked the echoed requestState before the answer got here.
                format!("state-ok: confirmed={}", a["content"]["ok"])
            }
            Round::MultipleInputs => {
                let (name, greeting, roots) = tokio::join!(
                    ctx.request_named("user_name", ELICIT, ask_name("What is your name?", "name")),
                    ctx.request_named("greeting", SAMPLE, ask_llm("Generate a greeting", 50)),
                    ctx.request_named("client_roots", ROOTS, json!({})),
                );
                let (name, greeting, roots) = (
                    name.map_err(channel_failed)?,
                    greeting.map_err(channel_failed)?,
                    roots.map_err(channel_failed)?,
                );
                format!(
                    "{} to {}, with {} root(s)",
                    greeting["content"]["text"].as_str().unwrap_or_default(),
                    name["content"]["name"].as_str().unwrap_or("stranger"),
                    roots["roots"].as_array().map_or(0, Vec::len)
                )
            }
            Round::Rounds => {
                let a = ctx
                    .request_named(
                        "step1",
                        ELICIT,
                        ask_name("Step 1: What is your name?", "name"),
                    )
                    .await
                    .map_err(channel_failed)?;
                let b = ctx
                    .request_named(
                        "step2",
                        ELICIT,
                        ask_name("Step 2: What is your favorite color?", "color"),
                    )
                    .await
                    .map_err(channel_failed)?;
                format!(
                    "{} likes {}",
                    a["content"]["name"].as_str().unwrap_or("stranger"),
                    b["content"]["color"].as_str().unwrap_or("no color")
                )
            }
            Round::Capabilities => {
                // Asks only for what the client declared: an undeclared request is refused
                // on the spot and never becomes an input request.
                let f = ctx.client_features();
                let mut parts = Vec::new();
                if f.elicitation {
                    let a = ctx
                        .request_named("user_name", ELICIT, ask_name("What is your name?", "name"))
                        .await
                        .map_err(channel_failed)?;
                    parts.push(format!("name {}", a["content"]["name"]));
                }
                if f.sampling {
                    let a = ctx
                        .request_named("greeting", SAMPLE, ask_llm("Generate a greeting", 50))
                        .await
                        .map_err(channel_failed)?;
                    parts.push(format!("greeting {}", a["content"]["text"]));
                }
                format!("asked for: {}", parts.join(", "))
            }
            Round::MissingCapability => {
                let a = ctx
                    .create_message(ask_llm("Say hello", 20))
                    .await
                    .map_err(channel_failed)?;
                format!("sampled: {}", a["content"]["text"])
            }
        };
        Ok(Envelope::ok(json!(text)))
    }
}

/// The conformance suite's `json_schema_2020_12_tool`: its input schema uses JSON Schema
/// 2020-12 (`$schema`, `$defs` with an `$anchor`, `$ref`, `allOf`/`anyOf`, `if`/`then`/`else`,
/// `additionalProperties: false`), which tools/list must carry unchanged.
fn json_schema_tool() -> Arc<dyn Tool> {
    fixed_with(
        "json_schema_2020_12_tool",
        "Tool with JSON Schema 2020-12 features",
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {"address": {"$anchor": "addressDef", "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
            "properties": {
                "name": {"type": "string"},
                "address": {"$ref": "#/$defs/address"},
                "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                "phone": {"type": "string"},
                "email": {"type": "string"}
            },
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
            "then": {"required": ["phone"]},
            "else": {"required": ["email"]},
            "additionalProperties": false
        }),
        0,
        || Ok(Envelope::ok(json!("ok"))),
    )
}

/// A tool with a parameter mirrored into an HTTP header (SEP-2243 `x-mcp-header`): a
/// 2026-07-28 call must send `Mcp-Param-Region` matching the argument (rmcp checks it
/// against the definition Quiver gives it).
fn header_tool() -> Arc<dyn Tool> {
    fixed_with(
        "test_custom_header",
        "Fixture: a parameter sent as a header too.",
        json!({
            "type": "object",
            "properties": {"region": {
                "type": "string",
                "description": "The region, also sent as the Mcp-Param-Region header.",
                "x-mcp-header": "Region"
            }},
            "required": ["region"]
        }),
        0,
        || Ok(Envelope::ok(json!("ok"))),
    )
}

/// Fixtures the 2026-07-28 conformance scenarios look for in tools/list (a stateless
/// client's surface is the resident floor: these are anchors).
const LISTED: [&str; 3] = [
    "json_schema_2020_12_tool",
    "test_missing_capability",
    "test_custom_header",
];

fn input_round_tools() -> Vec<Arc<dyn Tool>> {
    [
        ("test_input_required_result_elicitation", Round::Elicitation),
        ("test_input_required_result_sampling", Round::Sampling),
        ("test_input_required_result_list_roots", Round::ListRoots),
        ("test_input_required_result_request_state", Round::RequestState),
        ("test_input_required_result_multiple_inputs", Round::MultipleInputs),
        ("test_input_required_result_multi_round", Round::Rounds),
        ("test_input_required_result_tampered_state", Round::TamperedState),
        ("test_input_required_result_capabilities", Round::Capabilities),
        ("test_missing_capability", Round::MissingCapability),
    ]
    .into_iter()
    .map(|(name, run)| {
        Arc::new(InputRound {
            spec: ToolSpec::new(
                name,
                "Conformance (SEP-2322): asks the client for input through InputRequiredResult rounds.",
            )
            .read_only()
            .with_schema(json!({"type": "object", "properties": {}})),
            run,
        }) as Arc<dyn Tool>
    })
    .collect()
}

/// The content upstream's hook: adds a prompt to its list (a prompts `list_changed`).
struct ChangePrompts {
    spec: ToolSpec,
    content: Arc<content::FixtureContent>,
}

#[async_trait]
impl Tool for ChangePrompts {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _input: Value, _ctx: &CallContext) -> ToolResult {
        let n = self.content.add_prompt();
        Ok(Envelope::ok(json!(format!("added test_added_prompt_{n}"))))
    }
}

/// The conformance suite's list-change hooks (2026-07-28 `subscriptions/listen`).
struct TriggerChange {
    spec: ToolSpec,
    change: Change,
}

enum Change {
    /// `test_trigger_tool_change`: registers a new tool in the catalog.
    Tools {
        catalog: std::sync::Weak<Catalog>,
        count: std::sync::atomic::AtomicUsize,
    },
    /// `test_trigger_prompt_change`: calls the content upstream's `change_prompts` through
    /// the dispatcher; Quiver relays the upstream's prompt list change.
    Prompts,
}

#[async_trait]
impl Tool for TriggerChange {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _input: Value, ctx: &CallContext) -> ToolResult {
        match &self.change {
            Change::Prompts => Ok(ctx
                .call_tool("mcp__conformance__change_prompts", json!({}))
                .await),
            Change::Tools { catalog, count } => {
                let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                add_tool(catalog, format!("test_added_tool_{n}"))
            }
        }
    }
}

fn trigger_tools(catalog: &Arc<Catalog>) -> Vec<Arc<dyn Tool>> {
    let spec = |name: &str| {
        ToolSpec::new(name, "Conformance: changes the tool or prompt list.")
            .with_schema(json!({"type": "object", "properties": {}}))
    };
    vec![
        Arc::new(TriggerChange {
            spec: spec("test_trigger_tool_change"),
            change: Change::Tools {
                catalog: Arc::downgrade(catalog),
                count: std::sync::atomic::AtomicUsize::new(0),
            },
        }),
        Arc::new(TriggerChange {
            spec: spec("test_trigger_prompt_change"),
            change: Change::Prompts,
        }),
    ]
}

/// Registers the tool `name` in the catalog: a catalog change every session sees.
fn add_tool(catalog: &std::sync::Weak<Catalog>, name: String) -> ToolResult {
    let catalog = catalog
        .upgrade()
        .ok_or_else(|| ToolError::failed("the catalog is gone"))?;
    let description = format!("Converts an amount between two currencies ({name}).");
    let tool = Weather(ToolSpec::new(name.clone(), description).read_only());
    catalog
        .register_in("custom tools", Arc::new(tool))
        .map_err(|e| ToolError::failed(e.to_string()))?;
    Ok(Envelope::ok(json!(format!("registered {name}"))))
}

/// Registers a new tool in the catalog at run time (a catalog change every session sees).
struct RegisterTool {
    spec: ToolSpec,
    catalog: std::sync::Weak<Catalog>,
}

#[async_trait]
impl Tool for RegisterTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, input: Value, _ctx: &CallContext) -> ToolResult {
        add_tool(
            &self.catalog,
            input["name"].as_str().unwrap_or_default().to_owned(),
        )
    }
}

fn register_tool(catalog: &Arc<Catalog>) -> Arc<dyn Tool> {
    Arc::new(RegisterTool {
        spec: ToolSpec::new(
            "register_tool",
            "Adds a tool to the catalog; a test fixture.",
        )
        .with_schema(json!({
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "additionalProperties": false
        })),
        catalog: Arc::downgrade(catalog),
    })
}

fn fixture_tools() -> Vec<Arc<dyn Tool>> {
    let (tx, rx) = watch::channel(0);
    vec![
        Arc::new(Weather(
            ToolSpec::new(
                "weather_forecast",
                "Returns the weather forecast (sky, high temperature) for a city.",
            )
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
                "additionalProperties": false
            }))
            .with_output_schema(json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "forecast": {"type": "string"},
                    "high_c": {"type": "integer"}
                },
                "required": ["city", "forecast", "high_c"]
            })),
        )),
        Arc::new(SlowCount {
            spec: ToolSpec::new(
                "slow_count",
                "Counts slowly for a number of milliseconds; a test fixture.",
            )
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0}},
                "additionalProperties": false
            })),
            cancelled: tx,
        }),
        Arc::new(CancelledCalls {
            spec: ToolSpec::new(
                "cancelled_calls",
                "Waits until at least `at_least` slow_count calls were cancelled; a test fixture.",
            )
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {"at_least": {"type": "integer", "minimum": 0}},
                "additionalProperties": false
            })),
            cancelled: rx,
        }),
    ]
}

/// The conformance content served by a second fixture process, reached over `kind`
/// (`stdio` or `http`) through Quiver's MCP client; returns the client and, for http, the
/// child to keep alive.
async fn content_upstream(
    catalog: &Arc<Catalog>,
    kind: &str,
    quiver: Option<&str>,
) -> anyhow::Result<(McpClient, Option<tokio::process::Child>)> {
    let exe = std::env::current_exe().context("locating the fixture binary")?;
    let mut child = None;
    let mut config = match kind {
        "quiver-stdio" => {
            let quiver = quiver.context("--upstream quiver-stdio needs --quiver BIN")?;
            let dir = std::env::temp_dir().join(format!("quiver-fixture-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let toml = format!(
                "[store]\npath = {db:?}\n\n[[mcp.servers]]\nname = \"conformance\"\ncommand = {exe:?}\nargs = [\"--content-upstream\", \"stdio\"]\nbare_prompts = true\nrequired = true\n",
                db = dir.join("quiver.db").to_string_lossy(),
                exe = exe.to_string_lossy(),
            );
            let path = dir.join("quiver.toml");
            std::fs::write(&path, toml)?;
            ServerConfig::stdio(
                "quiver",
                quiver,
                vec![
                    "--config".into(),
                    path.to_string_lossy().into_owned(),
                    "serve".into(),
                    "--stdio".into(),
                ],
            )
            .with_cwd(dir)
        }
        "stdio" => ServerConfig::stdio(
            "conformance",
            exe.to_string_lossy(),
            vec!["--content-upstream".into(), "stdio".into()],
        ),
        "http" => {
            // Its stdin stays open while this process lives: it exits when the pipe closes,
            // even if this process is killed without running any destructor.
            let mut c = tokio::process::Command::new(&exe)
                .args(["--content-upstream", "http"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .context("starting the content upstream")?;
            let stdout = c.stdout.take().context("its stdout")?;
            let url = tokio::time::timeout(
                Duration::from_secs(30),
                BufReader::new(stdout).lines().next_line(),
            )
            .await
            .context("the content upstream did not print its URL in 30 s")??
            .context("the content upstream exited before printing its URL")?;
            child = Some(c);
            ServerConfig::http("conformance", url)
        }
        other => anyhow::bail!("--upstream takes stdio, http or quiver-stdio, not {other}"),
    };
    config.bare_prompts = true;
    // The content upstream's only tool, the hook that changes its prompt list (the real
    // `quiver` in between, with `quiver-stdio`, names it differently: nothing then).
    config.allow_tools = Some(vec!["change_prompts".into()]);
    config.required = true;
    let servers = validate_all(&[config], &|_| None)?;
    let client = McpClient::start(catalog.clone(), servers, ClientOptions::default());
    client.wait_ready(Duration::from_secs(30)).await?;
    Ok((client, child))
}

/// The catalog, and a surface whose resident floor also holds `anchors`.
fn catalog_and_surface(anchors: &[&str]) -> anyhow::Result<(Arc<Catalog>, Arc<Surface>)> {
    let catalog = Arc::new(Catalog::new());
    let mut config = SurfaceConfig::default();
    config.anchors.extend(anchors.iter().map(|a| a.to_string()));
    let surface = Surface::new(catalog.clone(), config, Arc::new(MemoryUsage::new([])))?;
    Ok((catalog, surface))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUIVER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut options = ServerOptions::default();
    let mut upstream = None;
    let mut quiver = None;
    let mut content_mode = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--auth" => {
                let auth: InboundAuth = serde_json::from_str(&value).context("parsing --auth")?;
                options = options.with_auth(auth);
            }
            "--progress-ms" => {
                options = options.with_progress_interval(Duration::from_millis(value.parse()?));
            }
            "--upstream" => upstream = Some(value),
            "--quiver" => quiver = Some(value),
            "--content-upstream" => content_mode = Some(value),
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let listen = "127.0.0.1:0".parse()?;
    if let Some(mode) = content_mode {
        // Its client lists its tools: the hook must be on the surface it serves.
        let (catalog, surface) = catalog_and_surface(&["change_prompts"])?;
        let content = content::FixtureContent::start();
        let mut families = Families::default();
        families.core = core_tools(&surface);
        families.custom.push(Arc::new(ChangePrompts {
            spec: ToolSpec::new(
                "change_prompts",
                "Fixture: adds a prompt, so the prompt list changes.",
            )
            .with_schema(json!({"type": "object", "properties": {}})),
            content: content.clone(),
        }));
        assemble_catalog(&catalog, families)?;
        surface.resync_index();
        let dispatcher = Dispatcher::builder(catalog)
            .observer(surface.clone())
            .build();
        let transport = match mode.as_str() {
            "stdio" => serve::Transport::Stdio,
            "http" => {
                // Started by a fixture server that holds our stdin: its end is our end.
                tokio::spawn(async {
                    let mut sink = tokio::io::sink();
                    let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut sink).await;
                    std::process::exit(0);
                });
                serve::Transport::Http(listen)
            }
            other => anyhow::bail!("--content-upstream takes stdio or http, not {other}"),
        };
        let content: Arc<dyn ContentSource> = content;
        return serve::serve(
            surface,
            dispatcher,
            transport,
            options,
            serve::Adapters {
                content: Some(content),
                ..Default::default()
            },
            &mut serve::Signals::watch()?,
        )
        .await;
    }
    let (catalog, surface) = catalog_and_surface(&LISTED)?;
    let mut families = Families::default();
    families.core = core_tools(&surface);
    families.custom = fixture_tools();
    families.custom.extend(conformance_tools());
    families.custom.extend(talkback_tools());
    families.custom.extend(input_round_tools());
    families.custom.push(json_schema_tool());
    families.custom.push(header_tool());
    families.custom.push(register_tool(&catalog));
    families.custom.extend(trigger_tools(&catalog));
    assemble_catalog(&catalog, families)?;
    let (client, _child) = match &upstream {
        Some(kind) => {
            let (client, child) = content_upstream(&catalog, kind, quiver.as_deref()).await?;
            (Some(client), child)
        }
        None => (None, None),
    };
    surface.resync_index();
    let dispatcher = Dispatcher::builder(catalog)
        .observer(surface.clone())
        .build();
    let content = client
        .clone()
        .map(|c| Arc::new(c) as Arc<dyn ContentSource>);
    let readiness = client
        .clone()
        .map(|c| Arc::new(UpstreamsReady(c)) as Arc<dyn quiver_mcp_adapter::Readiness>);
    let served = serve::serve(
        surface,
        dispatcher,
        serve::Transport::Http(listen),
        options,
        serve::Adapters {
            content,
            readiness,
            ..Default::default()
        },
        &mut serve::Signals::watch()?,
    )
    .await;
    if let Some(client) = client {
        client.close().await;
    }
    served
}

/// Ready while the content upstream is connected (the fixture has no store to check).
struct UpstreamsReady(McpClient);

impl quiver_mcp_adapter::Readiness for UpstreamsReady {
    fn not_ready(&self) -> Vec<String> {
        self.0.required_not_ready()
    }
}
