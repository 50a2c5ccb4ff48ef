//! The resources, prompts and completions the MCP conformance suite's server scenarios ask
//! for, as a [`ContentSource`]: the fixture serves them as an upstream MCP server, and the
//! fixture in front passes them through its MCP client.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use quiver_contract::{CallContext, Capabilities};
use quiver_mcp_adapter::{ContentError, ContentOffer, ContentSource, ListChange, ListChanged};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

/// A 1x1 PNG, base64.
pub(crate) const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

const WATCHED: &str = "test://watched-resource";

/// How often a subscribed resource reports an update.
const UPDATE_EVERY: Duration = Duration::from_millis(200);

pub(crate) struct FixtureContent {
    updates: broadcast::Sender<String>,
    subscribed: Arc<Mutex<HashMap<String, usize>>>,
    lists: broadcast::Sender<ListChanged>,
    /// Prompts added at run time (`add_prompt`).
    added: AtomicUsize,
    /// [`SLOW_PROMPT`] renderings started, and those cancelled by their client.
    slow: [AtomicUsize; 2],
}

impl FixtureContent {
    /// The content, with a task that reports every subscribed URI as updated every 200 ms.
    pub(crate) fn start() -> Arc<Self> {
        let (updates, _) = broadcast::channel(64);
        let subscribed: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let me = Arc::new(FixtureContent {
            updates: updates.clone(),
            subscribed: subscribed.clone(),
            lists: broadcast::channel(16).0,
            added: AtomicUsize::new(0),
            slow: [AtomicUsize::new(0), AtomicUsize::new(0)],
        });
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPDATE_EVERY);
            loop {
                tick.tick().await;
                let uris: Vec<String> = subscribed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .keys()
                    .cloned()
                    .collect();
                for uri in uris {
                    let _ = updates.send(uri);
                }
            }
        });
        me
    }

    /// Adds a prompt (`test_added_prompt_N`) and announces the changed prompt list.
    pub(crate) fn add_prompt(&self) -> usize {
        let n = self.added.fetch_add(1, Ordering::SeqCst) + 1;
        let _ = self
            .lists
            .send(ListChanged::unattributed(ListChange::Prompts));
        n
    }
}

fn resources() -> Vec<Value> {
    vec![
        json!({"uri": "test://static-text", "name": "static-text", "description": "A static text resource.", "mimeType": "text/plain"}),
        json!({"uri": "test://static-binary", "name": "static-binary", "description": "A static binary resource (a PNG).", "mimeType": "image/png"}),
        json!({"uri": WATCHED, "name": "watched-resource", "description": "A resource that reports updates to subscribers.", "mimeType": "text/plain"}),
        json!({"uri": INPUT_RESOURCE, "name": "input-required", "description": "A resource that asks the client for its context (elicitation) before it is read.", "mimeType": "text/plain"}),
    ]
}

fn prompts() -> Vec<Value> {
    vec![
        json!({"name": "test_simple_prompt", "description": "A simple prompt without arguments."}),
        json!({"name": "test_prompt_with_arguments", "description": "A prompt with two required arguments.",
        "arguments": [
            {"name": "arg1", "description": "The first argument.", "required": true},
            {"name": "arg2", "description": "The second argument.", "required": true}
        ]}),
        json!({"name": "test_prompt_with_embedded_resource", "description": "A prompt that embeds a resource.",
               "arguments": [{"name": "resourceUri", "description": "The URI of the resource to embed.", "required": true}]}),
        json!({"name": "test_prompt_with_image", "description": "A prompt with an image."}),
        json!({"name": INPUT_PROMPT, "description": "A prompt that asks the client for its context (elicitation) before it renders."}),
        json!({"name": SLOW_PROMPT, "description": "Renders only after a minute, unless cancelled first."}),
        json!({"name": SLOW_PROMPTS, "description": "How many test_slow_prompt renderings started, and how many were cancelled (JSON)."}),
    ]
}

/// Conformance (2026-07-28): `prompts/get` of this prompt elicits its context first; through
/// Quiver that is an `InputRequiredResult` round.
const INPUT_PROMPT: &str = "test_input_required_result_prompt";

/// Like [`INPUT_PROMPT`], for `resources/read`.
const INPUT_RESOURCE: &str = "test://input-required";

/// Waits a minute unless cancelled; [`SLOW_PROMPTS`] tells how many renderings started and
/// how many saw their cancellation.
const SLOW_PROMPT: &str = "test_slow_prompt";
const SLOW_PROMPTS: &str = "test_slow_prompts";

/// The context the client gives `what` ([`INPUT_PROMPT`], [`INPUT_RESOURCE`]), asked through
/// the request's client channel.
async fn ask_context(ctx: &CallContext, what: &str, noun: &str) -> Result<String, ContentError> {
    let client = ctx
        .client
        .as_ref()
        .ok_or_else(|| ContentError::InvalidParams(format!("{what} needs a client to ask")))?;
    let params = json!({
        "message": format!("What context should the {noun} use?"),
        "requestedSchema": {
            "type": "object",
            "properties": {"context": {"type": "string"}},
            "required": ["context"]
        }
    });
    let answer = client
        .request_named("user_context", "elicitation/create", params)
        .await
        .map_err(|e| ContentError::InvalidParams(format!("{what}: {e}")))?;
    match answer["content"]["context"].as_str() {
        Some(c) if answer["action"] == "accept" => Ok(c.to_owned()),
        _ => Err(ContentError::InvalidParams(format!(
            "{what}: the client did not give a context ({answer})"
        ))),
    }
}

fn text_message(text: &str) -> Value {
    json!({"role": "user", "content": {"type": "text", "text": text}})
}

fn arg<'a>(args: &'a Option<Map<String, Value>>, name: &str) -> Result<&'a str, ContentError> {
    args.as_ref()
        .and_then(|a| a.get(name))
        .and_then(Value::as_str)
        .ok_or_else(|| ContentError::InvalidParams(format!("missing required argument `{name}`")))
}

/// The id of a `test://template/{id}/data` URI.
fn template_id(uri: &str) -> Option<&str> {
    let id = uri
        .strip_prefix("test://template/")?
        .strip_suffix("/data")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

#[async_trait]
impl ContentSource for FixtureContent {
    fn offer(&self) -> ContentOffer {
        ContentOffer::all()
    }

    async fn list_resources(&self, _caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        Ok(resources())
    }

    async fn list_resource_templates(
        &self,
        _caps: &Capabilities,
    ) -> Result<Vec<Value>, ContentError> {
        Ok(vec![json!({
            "uriTemplate": "test://template/{id}/data",
            "name": "template-data",
            "description": "Data for one id.",
            "mimeType": "application/json"
        })])
    }

    async fn read_resource(&self, uri: &str, ctx: &CallContext) -> Result<Value, ContentError> {
        let content = match uri {
            INPUT_RESOURCE => {
                let context = ask_context(ctx, INPUT_RESOURCE, "resource").await?;
                json!({"uri": uri, "mimeType": "text/plain", "text": format!("Resource with context: {context}")})
            }
            "test://static-text" => {
                json!({"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."})
            }
            "test://static-binary" => json!({"uri": uri, "mimeType": "image/png", "blob": PNG}),
            WATCHED => {
                json!({"uri": uri, "mimeType": "text/plain", "text": "Watched resource content."})
            }
            _ => match template_id(uri) {
                Some(id) => json!({
                    "uri": uri,
                    "mimeType": "application/json",
                    "text": json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")}).to_string()
                }),
                None => return Err(ContentError::NotFound(format!("Resource not found: {uri}"))),
            },
        };
        Ok(json!({"contents": [content]}))
    }

    async fn subscribe(&self, uri: &str, _caps: &Capabilities) -> Result<(), ContentError> {
        *self
            .subscribed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(uri.to_owned())
            .or_default() += 1;
        Ok(())
    }

    async fn unsubscribe(&self, uri: &str) -> Result<(), ContentError> {
        let mut subs = self.subscribed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = subs.get_mut(uri) {
            *n -= 1;
            if *n == 0 {
                subs.remove(uri);
            }
        }
        Ok(())
    }

    fn resource_updates(&self) -> broadcast::Receiver<String> {
        self.updates.subscribe()
    }

    async fn list_prompts(&self, _caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        let mut all = prompts();
        for n in 1..=self.added.load(Ordering::SeqCst) {
            all.push(json!({"name": format!("test_added_prompt_{n}"), "description": "A prompt added at run time."}));
        }
        Ok(all)
    }

    fn list_changes(&self) -> broadcast::Receiver<ListChanged> {
        self.lists.subscribe()
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        ctx: &CallContext,
    ) -> Result<Value, ContentError> {
        let messages = match name {
            INPUT_PROMPT => {
                let context = ask_context(ctx, INPUT_PROMPT, "prompt").await?;
                vec![text_message(&format!("Prompt with context: {context}"))]
            }
            SLOW_PROMPT => {
                self.slow[0].fetch_add(1, Ordering::SeqCst);
                tokio::select! {
                    _ = ctx.cancel.cancelled() => {
                        self.slow[1].fetch_add(1, Ordering::SeqCst);
                        return Err(ContentError::Unavailable("cancelled".into()));
                    }
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {
                        vec![text_message("not cancelled")]
                    }
                }
            }
            SLOW_PROMPTS => {
                let [started, cancelled] = &self.slow;
                vec![text_message(
                    &json!({
                        "started": started.load(Ordering::SeqCst),
                        "cancelled": cancelled.load(Ordering::SeqCst)
                    })
                    .to_string(),
                )]
            }
            "test_simple_prompt" => vec![text_message("This is a simple prompt for testing.")],
            "test_prompt_with_arguments" => {
                let (a1, a2) = (arg(&arguments, "arg1")?, arg(&arguments, "arg2")?);
                vec![text_message(&format!(
                    "Prompt with arguments: arg1='{a1}', arg2='{a2}'"
                ))]
            }
            "test_prompt_with_embedded_resource" => {
                let uri = arg(&arguments, "resourceUri")?;
                vec![
                    json!({"role": "user", "content": {"type": "resource", "resource": {
                        "uri": uri, "mimeType": "text/plain", "text": "Embedded resource content for testing."
                    }}}),
                    text_message("Please process the embedded resource above."),
                ]
            }
            "test_prompt_with_image" => vec![
                json!({"role": "user", "content": {"type": "image", "data": PNG, "mimeType": "image/png"}}),
                text_message("Please analyze the image above."),
            ],
            other => {
                return Err(ContentError::NotFound(format!("unknown prompt {other:?}")));
            }
        };
        Ok(json!({"messages": messages}))
    }

    async fn complete(&self, request: Value, _caps: &Capabilities) -> Result<Value, ContentError> {
        let value = request["argument"]["value"].as_str().unwrap_or_default();
        let candidates: &[&str] = match (
            request["ref"]["type"].as_str(),
            request["argument"]["name"].as_str(),
        ) {
            (Some("ref/prompt"), Some("arg1" | "arg2")) => {
                &["test", "testValue1", "testValue2", "other"]
            }
            (Some("ref/resource"), Some("id")) => &["1", "123", "42"],
            _ => &[],
        };
        let values: Vec<&str> = candidates
            .iter()
            .copied()
            .filter(|c| c.starts_with(value))
            .collect();
        Ok(json!({"completion": {"values": values, "total": values.len(), "hasMore": false}}))
    }
}
