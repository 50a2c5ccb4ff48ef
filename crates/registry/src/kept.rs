//! Results kept whole for the life of their session, so that a result the model was shown
//! in part can be read back by page (the `read_result` tool) or whole (the MCP resource
//! `quiver://results/<call id>`). Each session keeps at most a set number of bytes; past
//! it, its oldest kept results go first. Ending a session drops what it kept.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, Tool, ToolError, ToolResult, ToolSpec, Warning};
use serde_json::{Value, json};

use crate::{
    layers::result_limit::{READ_RESULT, read_call},
    shape::{Kept, thousands},
    sync::lock,
};

/// The URI scheme and prefix of a kept result as an MCP resource.
pub const RESULT_URI_PREFIX: &str = "quiver://results/";

/// The resource URI of call `id`'s kept result.
pub fn result_uri(id: &str) -> String {
    format!("{RESULT_URI_PREFIX}{id}")
}

#[derive(Debug, Default)]
struct SessionResults {
    order: VecDeque<Arc<str>>,
    results: HashMap<Arc<str>, (Arc<str>, Arc<Kept>)>,
    bytes: usize,
}

/// Why a result was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotKept {
    /// The call had no session (or no id) to keep it under.
    NoSession,
    /// It is larger alone than what a session keeps.
    TooLarge,
    /// The process ends with the call (`quiver call`): nothing would be left to read back.
    EndsWithCall,
}

/// The kept results of every session.
#[derive(Debug)]
pub struct KeptResults {
    per_session: AtomicUsize,
    sessions: Mutex<HashMap<Arc<str>, SessionResults>>,
    /// Set by [`KeptResults::ends_with_call`]: nothing is kept.
    one_shot: std::sync::atomic::AtomicBool,
}

impl KeptResults {
    /// A store keeping at most `per_session` bytes per session.
    pub fn new(per_session: usize) -> Self {
        KeptResults {
            per_session: AtomicUsize::new(per_session),
            sessions: Mutex::new(HashMap::new()),
            one_shot: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The bytes a session keeps at most.
    pub fn per_session(&self) -> usize {
        self.per_session.load(Ordering::Relaxed)
    }

    /// Sets the bytes a session keeps at most, from its next result on.
    pub fn set_per_session(&self, bytes: usize) {
        self.per_session.store(bytes, Ordering::Relaxed);
    }

    /// The process ends with its one call (`quiver call`): from now on nothing is kept,
    /// and a shortened result says to ask for less instead of naming pages no later
    /// process can read.
    pub fn ends_with_call(&self) {
        self.one_shot.store(true, Ordering::Relaxed);
    }

    /// Keeps `kept`, the result of call `id` to `tool`, for `session`; the session's
    /// oldest results go when it is over its bytes.
    pub fn keep(
        &self,
        session: &Arc<str>,
        id: &Arc<str>,
        tool: &str,
        kept: Kept,
    ) -> Result<(), NotKept> {
        if self.one_shot.load(Ordering::Relaxed) {
            return Err(NotKept::EndsWithCall);
        }
        let bytes = kept.bytes();
        let cap = self.per_session();
        if bytes > cap {
            return Err(NotKept::TooLarge);
        }
        let mut sessions = lock(&self.sessions);
        let s = sessions.entry(session.clone()).or_default();
        if let Some((_, old)) = s.results.remove(id) {
            s.bytes -= old.bytes();
            s.order.retain(|o| o != id);
        }
        while s.bytes + bytes > cap {
            let Some(oldest) = s.order.pop_front() else {
                break;
            };
            if let Some((_, old)) = s.results.remove(&oldest) {
                s.bytes -= old.bytes();
            }
        }
        s.bytes += bytes;
        s.order.push_back(id.clone());
        s.results
            .insert(id.clone(), (Arc::from(tool), Arc::new(kept)));
        Ok(())
    }

    /// Call `id`'s kept result in `session`, with the tool that returned it.
    pub fn get(&self, session: &str, id: &str) -> Option<(Arc<str>, Arc<Kept>)> {
        lock(&self.sessions)
            .get(session)
            .and_then(|s| s.results.get(id).cloned())
    }

    /// Drops what `session` kept.
    pub fn end_session(&self, session: &str) {
        lock(&self.sessions).remove(session);
    }

    /// The bytes `session` keeps now.
    pub fn bytes(&self, session: &str) -> usize {
        lock(&self.sessions).get(session).map_or(0, |s| s.bytes)
    }
}

/// The `read_result` tool: a page of a result kept for the caller's session.
pub fn read_result_tool(kept: Arc<KeptResults>) -> Arc<dyn Tool> {
    Arc::new(ReadResult {
        spec: ToolSpec::new(
            READ_RESULT,
            "Reads the rest of a tool result that was too long to show at once. Use it when a result says tokens were left out or that it is paged: give the call id and the page number its note names.",
        )
        .read_only()
        .with_schema(json!({
            "type": "object",
            "properties": {
                "id": {
                    "type": "string",
                    "description": "The call id the shortened result named."
                },
                "page": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "The page to read, from 1."
                }
            },
            "required": ["id", "page"],
            "additionalProperties": false
        })),
        kept,
    })
}

struct ReadResult {
    spec: ToolSpec,
    kept: Arc<KeptResults>,
}

#[derive(serde::Deserialize)]
struct ReadArgs {
    id: String,
    page: usize,
}

#[async_trait]
impl Tool for ReadResult {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// It reads Quiver's own store; it never asks the client.
    fn reaches_client(&self) -> bool {
        false
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let a: ReadArgs = serde_json::from_value(input)
            .map_err(|e| ToolError::schema_hint(format!("{READ_RESULT}: {e}"), Vec::new()))?;
        let Some(session) = ctx.session.as_deref() else {
            return Err(ToolError::fetch_hint(
                "results are kept per session, and this call has no session: nothing can be read back. Ask the tool for less instead (a filter, a page, fewer fields).",
                Vec::new(),
            ));
        };
        let Some((tool, kept)) = self.kept.get(session, &a.id) else {
            return Err(ToolError::fetch_hint(
                format!(
                    "no result of call `{}` is kept in this session: a shortened result's note names its call id; a session keeps its last {} bytes of results, and the oldest go first. Call the tool again to get it back.",
                    a.id,
                    thousands(self.kept.per_session())
                ),
                Vec::new(),
            ));
        };
        let n = kept.page_count();
        if a.page == 0 || a.page > n {
            return Err(ToolError::fetch_hint(
                format!(
                    "call `{}`'s result has pages 1 to {n}; page {} is not one of them.",
                    a.id, a.page
                ),
                Vec::new(),
            ));
        }
        let data = match &*kept {
            Kept::Text { text, pages } => Value::String(text[pages[a.page - 1].clone()].to_owned()),
            Kept::Json { value, pages } => pages.page(value, a.page - 1).unwrap_or(Value::Null),
        };
        let next = if a.page < n {
            format!("{} returns the next.", read_call(&a.id, a.page + 1))
        } else {
            "It is the last page.".to_owned()
        };
        Ok(Envelope::ok(data).with_warning(Warning::new(
            "page",
            format!(
                "page {} of {n} of the result of call `{}` to `{tool}`. {next}",
                a.page, a.id
            ),
        )))
    }
}
