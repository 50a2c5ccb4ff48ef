//! Small tools for the tests.

use std::{future::Future, pin::Pin, sync::Arc};

use async_trait::async_trait;
use quiver_contract::{CallContext, Tool, ToolResult, ToolSpec};
use quiver_registry::{Catalog, Dispatcher};
use serde_json::{Value, json};

type Handler =
    dyn Fn(Value, CallContext) -> Pin<Box<dyn Future<Output = ToolResult> + Send>> + Send + Sync;

/// A tool made of a spec and a closure.
pub(crate) struct FnTool {
    spec: ToolSpec,
    handler: Box<Handler>,
}

#[async_trait]
impl Tool for FnTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        (self.handler)(input, ctx.clone()).await
    }
}

pub(crate) fn tool<F, Fut>(spec: ToolSpec, f: F) -> Arc<dyn Tool>
where
    F: Fn(Value, CallContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ToolResult> + Send + 'static,
{
    Arc::new(FnTool {
        spec,
        handler: Box::new(move |v, c| Box::pin(f(v, c))),
    })
}

/// `echo`: read-only, returns its `text` argument.
pub(crate) fn echo() -> Arc<dyn Tool> {
    tool(
        ToolSpec::new("echo", "Echoes text back. Use it to test the pipeline.")
            .read_only()
            .with_schema(json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "What to echo."}},
                "required": ["text"],
                "additionalProperties": false
            })),
        |input, _| async move {
            Ok(quiver_contract::Envelope::text(
                input["text"].as_str().unwrap_or_default(),
            ))
        },
    )
}

/// `add`: mutating (for batch tests), adds two integers.
pub(crate) fn add() -> Arc<dyn Tool> {
    tool(
        ToolSpec::new("add", "Adds two integers.").with_schema(json!({
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "First."},
                "b": {"type": "integer", "description": "Second."}
            },
            "required": ["a", "b"]
        })),
        |input, _| async move {
            Ok(quiver_contract::Envelope::ok(
                json!({"sum": input["a"].as_i64().unwrap_or(0) + input["b"].as_i64().unwrap_or(0)}),
            ))
        },
    )
}

pub(crate) fn catalog_with(tools: Vec<Arc<dyn Tool>>) -> Arc<Catalog> {
    let catalog = Arc::new(Catalog::new());
    for t in tools {
        catalog.must_register(t);
    }
    catalog
}

pub(crate) fn dispatcher(tools: Vec<Arc<dyn Tool>>) -> Dispatcher {
    Dispatcher::new(catalog_with(tools))
}

pub(crate) fn ctx() -> CallContext {
    CallContext::for_session("s1")
}
