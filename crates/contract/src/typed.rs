use std::{future::Future, marker::PhantomData};

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{CallContext, Tool, ToolError, ToolResult, ToolSpec};

/// A built-in tool made of a typed argument struct and an async function. The input schema is
/// derived from `I` with schemars, and the input is deserialized into `I` before `f` runs.
pub struct TypedTool<I, F> {
    spec: ToolSpec,
    f: F,
    _input: PhantomData<fn(I)>,
}

/// Builds a [`TypedTool`]: the schema of `spec` is replaced by the one derived from `I`.
pub fn typed_tool<I, F, Fut>(mut spec: ToolSpec, f: F) -> TypedTool<I, F>
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(I, CallContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ToolResult> + Send + 'static,
{
    spec.input_schema = schema_of::<I>();
    TypedTool {
        spec,
        f,
        _input: PhantomData,
    }
}

fn schema_of<I: JsonSchema>() -> Value {
    let schema = schemars::schema_for!(I);
    let mut value =
        serde_json::to_value(&schema).unwrap_or_else(|_| serde_json::json!({"type": "object"}));
    if let Some(obj) = value.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
        obj.entry("type")
            .or_insert_with(|| Value::String("object".into()));
    }
    value
}

#[async_trait]
impl<I, F, Fut> Tool for TypedTool<I, F>
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(I, CallContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ToolResult> + Send + 'static,
{
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let args: I = serde_json::from_value(input).map_err(|e| {
            ToolError::schema_hint(
                format!("the arguments do not fit `{}`: {e}", self.spec.name),
                Vec::new(),
            )
        })?;
        (self.f)(args, ctx.clone()).await
    }
}
