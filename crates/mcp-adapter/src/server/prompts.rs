//! Local prompts in front of a content source: the registry's [`PromptSet`] (command files
//! and skills) served as MCP prompts, so clients offer them as `/name`, ahead of the
//! upstreams' prompts the source passes through.
//!
//! Precedence, first wins: a command file, then a skill (the [`PromptSet`] settles those
//! two), then an upstream prompt of the same name (one under its bare name; the prefixed
//! `mcp__<server>__<prompt>` names never meet a local one). An upstream prompt left out is
//! logged once per name. A prompt takes one optional argument, `arguments` (what follows
//! the command), which fills `$ARGUMENTS`, `$1`, `$2`...
//!
//! Local prompts are the `skill` tool's content: a caller not offered that tool (its
//! token's `allowed_tools`, or a policy that always denies it) sees none of them.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, OnceLock, RwLock},
};

use async_trait::async_trait;
use quiver_contract::{CallContext, Capabilities};
use quiver_registry::{
    kept::{KeptResults, RESULT_URI_PREFIX},
    shape::Kept,
    skill::{LocalPrompt, PromptFrom, PromptSet, SKILL_TOOL, SkillError},
};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::{
    content::{ContentError, ContentOffer, ContentSource, ListChange, ListChanged},
    sync::lock,
};

/// The one argument a local prompt takes.
pub const PROMPT_ARGUMENT: &str = "arguments";

/// A [`ContentSource`] serving local prompts ahead of `inner` (for `quiver serve`, the MCP
/// client passing its upstreams through), and, when given them, the results shortened to
/// their budget as resources `quiver://results/<call id>` of the session that made the
/// call; everything else is `inner`'s.
pub struct LocalPrompts {
    prompts: RwLock<Arc<PromptSet>>,
    inner: Option<Arc<dyn ContentSource>>,
    changes: broadcast::Sender<ListChanged>,
    /// Set once `inner`'s list changes are relayed into `changes`.
    relaying: OnceLock<()>,
    /// Upstream prompt names already logged as shadowed.
    reported: Mutex<HashSet<String>>,
    /// Whether the prompts capability is offered while there is no local prompt (and
    /// `inner` offers none).
    offered_while_empty: bool,
    /// The whole results kept for their sessions.
    kept: Option<Arc<KeptResults>>,
}

impl std::fmt::Debug for LocalPrompts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPrompts")
            .field(
                "prompts",
                &*self.prompts.read().unwrap_or_else(|p| p.into_inner()),
            )
            .field("inner", &self.inner.is_some())
            .finish_non_exhaustive()
    }
}

impl LocalPrompts {
    /// `prompts` ahead of `inner`'s.
    pub fn new(prompts: Arc<PromptSet>, inner: Option<Arc<dyn ContentSource>>) -> Self {
        LocalPrompts {
            prompts: RwLock::new(prompts),
            inner,
            changes: broadcast::channel(64).0,
            relaying: OnceLock::new(),
            reported: Mutex::new(HashSet::new()),
            offered_while_empty: true,
            kept: None,
        }
    }

    /// Serves `kept`'s results as resources `quiver://results/<call id>`, each to the
    /// session whose call it was.
    pub fn with_kept_results(mut self, kept: Arc<KeptResults>) -> Self {
        self.kept = Some(kept);
        self
    }

    /// Call `id`'s kept result, whole, as a `resources/read` answer for `ctx`'s session.
    fn read_kept(
        kept: &KeptResults,
        uri: &str,
        id: &str,
        ctx: &CallContext,
    ) -> Result<Value, ContentError> {
        let found = ctx.session.as_deref().and_then(|s| kept.get(s, id));
        let Some((_, result)) = found else {
            return Err(ContentError::NotFound(format!(
                "no kept result {uri:?} in this session: a result is kept for the session whose call it was, while the session lasts and within its bytes (the oldest go first)"
            )));
        };
        let mime = match &*result {
            Kept::Text { .. } => "text/plain",
            Kept::Json { .. } => "application/json",
        };
        Ok(json!({"contents": [{"uri": uri, "mimeType": mime, "text": result.whole_text()}]}))
    }

    /// Whether the prompts capability is offered while there is no local prompt and
    /// `inner` offers none (the default): a server whose prompts may come later says yes,
    /// so its clients ask. With no, a client that initializes while there is none is told
    /// there are no prompts, and one that initializes after [`LocalPrompts::replace`]
    /// brought some is offered them.
    pub fn offered_while_empty(mut self, offered: bool) -> Self {
        self.offered_while_empty = offered;
        self
    }

    fn current(&self) -> Arc<PromptSet> {
        self.prompts
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Serves `prompts` from now on; when the listing differs, connected clients are told
    /// (`notifications/prompts/list_changed`). Returns whether it differed.
    pub fn replace(&self, prompts: Arc<PromptSet>) -> bool {
        let changed = {
            let mut held = self.prompts.write().unwrap_or_else(|p| p.into_inner());
            let changed = held.list() != prompts.list();
            *held = prompts;
            changed
        };
        if changed {
            lock(&self.reported).clear();
            let _ = self
                .changes
                .send(ListChanged::unattributed(ListChange::Prompts));
        }
        changed
    }

    /// The local prompts `caps` is offered.
    fn offered(&self, caps: &Capabilities) -> Option<Arc<PromptSet>> {
        caps.offers(SKILL_TOOL).then(|| self.current())
    }
}

/// A local prompt as a wire `Prompt`.
fn wire_prompt(p: &LocalPrompt) -> Value {
    let hint = p.argument_hint.clone().unwrap_or_else(|| {
        "What follows the command: `$ARGUMENTS` in the text takes it whole, `$1`, `$2`... its words.".to_owned()
    });
    json!({
        "name": p.name,
        "description": p.description,
        "arguments": [{"name": PROMPT_ARGUMENT, "description": hint, "required": false}],
    })
}

/// The text after the command, from a `prompts/get`'s arguments.
fn arguments_of(name: &str, arguments: Option<Map<String, Value>>) -> Result<String, ContentError> {
    let mut text = String::new();
    for (key, value) in arguments.unwrap_or_default() {
        if key != PROMPT_ARGUMENT {
            return Err(ContentError::InvalidParams(format!(
                "prompt {name:?} takes one argument, `{PROMPT_ARGUMENT}` (what follows the command), not `{key}`"
            )));
        }
        match value {
            Value::String(s) => text = s,
            Value::Null => {}
            other => {
                return Err(ContentError::InvalidParams(format!(
                    "the argument `{PROMPT_ARGUMENT}` of prompt {name:?} is a string, not {other}"
                )));
            }
        }
    }
    Ok(text)
}

fn skill_error(name: &str, e: SkillError) -> ContentError {
    match e {
        SkillError::UnknownSkill { .. } => ContentError::NotFound(format!(
            "unknown prompt {name:?}; call prompts/list for the prompts that exist"
        )),
        e => ContentError::Unavailable(format!("prompt {name:?}: {e}")),
    }
}

#[async_trait]
impl ContentSource for LocalPrompts {
    fn offer(&self) -> ContentOffer {
        let mut offer = self.inner.as_ref().map(|i| i.offer()).unwrap_or_default();
        offer.prompts |= self.offered_while_empty || !self.current().is_empty();
        offer.resources |= self.kept.is_some();
        // `replace` changes the list.
        offer.list_changed = true;
        offer
    }

    fn instructions(&self, caps: &Capabilities) -> Vec<(String, String)> {
        self.inner
            .as_ref()
            .map(|i| i.instructions(caps))
            .unwrap_or_default()
    }

    async fn list_resources(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        match &self.inner {
            Some(inner) if inner.offer().resources => inner.list_resources(caps).await,
            _ => Ok(Vec::new()),
        }
    }

    async fn list_resource_templates(
        &self,
        caps: &Capabilities,
    ) -> Result<Vec<Value>, ContentError> {
        let mut all = match &self.inner {
            Some(inner) if inner.offer().resources => inner.list_resource_templates(caps).await?,
            _ => Vec::new(),
        };
        if self.kept.is_some() {
            all.push(json!({
                "uriTemplate": format!("{RESULT_URI_PREFIX}{{call_id}}"),
                "name": "kept_result",
                "description": "The whole of a tool result that was shortened to its budget, for the session that made the call (its note names the call id).",
            }));
        }
        Ok(all)
    }

    async fn read_resource(&self, uri: &str, ctx: &CallContext) -> Result<Value, ContentError> {
        if let (Some(kept), Some(id)) = (&self.kept, uri.strip_prefix(RESULT_URI_PREFIX)) {
            return Self::read_kept(kept, uri, id, ctx);
        }
        match &self.inner {
            Some(inner) => inner.read_resource(uri, ctx).await,
            None => Err(ContentError::NotFound(format!("no resource {uri:?}"))),
        }
    }

    async fn subscribe(&self, uri: &str, caps: &Capabilities) -> Result<(), ContentError> {
        match &self.inner {
            Some(inner) => inner.subscribe(uri, caps).await,
            None => Err(ContentError::NotFound(format!("no resource {uri:?}"))),
        }
    }

    async fn unsubscribe(&self, uri: &str) -> Result<(), ContentError> {
        match &self.inner {
            Some(inner) => inner.unsubscribe(uri).await,
            None => Ok(()),
        }
    }

    fn resource_updates(&self) -> broadcast::Receiver<String> {
        match &self.inner {
            Some(inner) => inner.resource_updates(),
            None => broadcast::channel(1).1,
        }
    }

    fn roots_changed(&self, client: &str) {
        if let Some(inner) = &self.inner {
            inner.roots_changed(client);
        }
    }

    fn list_changes(&self) -> broadcast::Receiver<ListChanged> {
        let receiver = self.changes.subscribe();
        if let Some(inner) = &self.inner {
            // Relayed from the first subscriber on (the server subscribes inside its
            // runtime); a relay that fell behind says both lists may have changed.
            self.relaying.get_or_init(|| {
                let mut from = inner.list_changes();
                let to = self.changes.clone();
                tokio::spawn(async move {
                    loop {
                        match from.recv().await {
                            Ok(change) => {
                                let _ = to.send(change);
                            }
                            Err(broadcast::error::RecvError::Lagged(_)) => {
                                for list in [ListChange::Resources, ListChange::Prompts] {
                                    let _ = to.send(ListChanged::unattributed(list));
                                }
                            }
                            Err(broadcast::error::RecvError::Closed) => break,
                        }
                    }
                });
            });
        }
        receiver
    }

    async fn list_prompts(&self, caps: &Capabilities) -> Result<Vec<Value>, ContentError> {
        let local = self.offered(caps);
        let mut all: Vec<Value> = local
            .iter()
            .flat_map(|p| p.list())
            .map(|p| wire_prompt(&p))
            .collect();
        let Some(inner) = self.inner.as_ref().filter(|i| i.offer().prompts) else {
            return Ok(all);
        };
        let upstream = inner.list_prompts(caps).await?;
        let held = self.current();
        for prompt in upstream {
            let name = prompt.get("name").and_then(Value::as_str).unwrap_or("");
            if !held.contains(name) {
                all.push(prompt);
                continue;
            }
            // Shadowed whether or not this caller is offered the local prompt: a name
            // answers one way for every caller.
            if lock(&self.reported).insert(name.to_owned()) {
                let by = held
                    .list()
                    .into_iter()
                    .find(|p| p.name == name)
                    .map(|p| match p.from {
                        PromptFrom::Command => "a local command file".to_owned(),
                        PromptFrom::Skill(tier) => format!("a skill ({tier} tier)"),
                        _ => "a local prompt".to_owned(),
                    })
                    .unwrap_or_default();
                tracing::warn!(
                    prompt = %name,
                    "an upstream prompt is shadowed by {by} of that name: prompts/get serves the local one"
                );
            }
        }
        Ok(all)
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        ctx: &CallContext,
    ) -> Result<Value, ContentError> {
        let held = self.current();
        if held.contains(name) {
            let Some(prompts) = self.offered(&ctx.capabilities) else {
                return Err(ContentError::NotFound(format!(
                    "unknown prompt {name:?}; call prompts/list for the prompts that exist"
                )));
            };
            let text = arguments_of(name, arguments)?;
            let rendered = prompts
                .render(name, &text)
                .await
                .map_err(|e| skill_error(name, e))?;
            let Some(rendered) = rendered else {
                return Err(skill_error(
                    name,
                    SkillError::UnknownSkill {
                        name: name.to_owned(),
                    },
                ));
            };
            let description = prompts
                .list()
                .into_iter()
                .find(|p| p.name == name)
                .map(|p| p.description)
                .unwrap_or_default();
            return Ok(json!({
                "description": description,
                "messages": [{"role": "user", "content": {"type": "text", "text": rendered}}],
            }));
        }
        match self.inner.as_ref().filter(|i| i.offer().prompts) {
            Some(inner) => inner.get_prompt(name, arguments, ctx).await,
            None => Err(ContentError::NotFound(format!(
                "unknown prompt {name:?}; call prompts/list for the prompts that exist"
            ))),
        }
    }

    async fn complete(&self, request: Value, caps: &Capabilities) -> Result<Value, ContentError> {
        let local_prompt = request["ref"]["type"] == "ref/prompt"
            && request["ref"]["name"]
                .as_str()
                .is_some_and(|n| self.current().contains(n));
        // The kept results' template is Quiver's own, not an upstream's: a call id is not
        // offered for completion (the ids come in the notes of cut results).
        let results_template = self.kept.is_some()
            && request["ref"]["type"] == "ref/resource"
            && request["ref"]["uri"].as_str()
                == Some(format!("{RESULT_URI_PREFIX}{{call_id}}").as_str());
        let local = local_prompt || results_template;
        match &self.inner {
            // A local prompt's argument is free text: nothing to complete.
            _ if local => Ok(json!({"completion": {"values": [], "hasMore": false}})),
            Some(inner) => inner.complete(request, caps).await,
            None => Err(ContentError::NotFound(
                "nothing to complete: no prompt or resource of that name".to_owned(),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
