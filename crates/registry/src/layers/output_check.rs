//! Output check: a tool that declares an output schema promises that its structured results
//! fit it (MCP: "servers MUST provide structured results that conform to this schema", and
//! clients' SDKs refuse a result that does not). A structured success that breaks the promise
//! becomes a `tool_failed` error naming where it breaks, with the start of what the tool
//! returned, instead of reaching the model (and a client SDK) as a success. Text results are
//! left alone (the MCP edge sends a typed tool's text success as an error result itself).

use std::{
    convert::Infallible,
    task::{Context, Poll},
};

use quiver_contract::{Envelope, ErrKind};
use serde_json::Value;
use tower::{Layer, Service};

use super::{Call, CallFuture};
use crate::validate::clipped;

/// The most problems one error lists.
const MAX_PROBLEMS: usize = 3;
/// The most characters one problem shows (the validator quotes the offending value whole).
const MAX_PROBLEM_CHARS: usize = 200;
/// The most characters of the returned data the error shows.
const MAX_DATA_CHARS: usize = 1_000;

/// Applies the output check.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutputCheckLayer;

impl<S> Layer<S> for OutputCheckLayer {
    type Service = OutputCheck<S>;

    fn layer(&self, inner: S) -> OutputCheck<S> {
        OutputCheck { inner }
    }
}

/// The output-check service.
#[derive(Debug, Clone)]
pub struct OutputCheck<S> {
    inner: S,
}

impl<S> Service<Call> for OutputCheck<S>
where
    S: Service<Call, Response = Envelope, Error = Infallible, Future = CallFuture>,
{
    type Response = Envelope;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> CallFuture {
        if call.entry.output_validator.is_none() {
            // Most tools declare no output schema: their call passes through unboxed.
            return self.inner.call(call);
        }
        let entry = call.entry.clone();
        let fut = self.inner.call(call);
        Box::pin(async move {
            let envelope = fut.await?;
            let Some(validator) = &entry.output_validator else {
                return Ok(envelope);
            };
            let (data, warnings) = match &envelope {
                Envelope::Ok { data, warnings, .. }
                    if matches!(data, Value::Object(_) | Value::Array(_)) =>
                {
                    (data, warnings)
                }
                _ => return Ok(envelope),
            };
            if validator.is_valid(data) {
                return Ok(envelope);
            }
            let problems: Vec<String> = validator
                .iter_errors(data)
                .take(MAX_PROBLEMS)
                .map(|e| {
                    let at = e.instance_path().as_str().to_owned();
                    let at = if at.is_empty() {
                        "the result".to_owned()
                    } else {
                        format!("`{at}`")
                    };
                    clipped(&format!("{at}: {e}"), MAX_PROBLEM_CHARS)
                })
                .collect();
            let name = entry.name();
            tracing::warn!(tool = name, family = %entry.family, problems = ?problems, "a result does not match the tool's output schema");
            let returned = clipped(&data.to_string(), MAX_DATA_CHARS);
            // An error has no warnings of its own: what the result warned about (a part
            // dropped, a malformed reply read anyway) goes into its text, not lost.
            let warned: String = warnings
                .iter()
                .take(MAX_PROBLEMS)
                .map(|w| {
                    format!(
                        " It also warned ({}): {}",
                        w.kind,
                        clipped(&w.message, MAX_PROBLEM_CHARS)
                    )
                })
                .collect();
            Ok(Envelope::err(
                ErrKind::ToolFailed,
                format!(
                    "`{name}` ran, but its result does not match the output schema it declares ({}), so it is not passed on as a result. It returned: {returned}.{warned} Calling it again with the same arguments will most likely fail the same way; use another tool, or tell the user this tool is returning malformed results.",
                    problems.join("; ")
                ),
            ))
        })
    }
}

/// What would keep `schema` from serving as an output schema (`None` when it can): MCP's
/// shape rule (an object schema of type `"object"`), then whether it compiles. An adapter
/// that imports tools (an MCP upstream's) asks before registering, to drop a bad output
/// schema and keep the tool rather than lose the tool over it.
pub fn output_schema_problem(schema: &Value) -> Option<String> {
    if let Some(problem) = quiver_contract::output_schema_problem(schema) {
        return Some(problem);
    }
    jsonschema::validator_for(schema)
        .err()
        .map(|e| format!("its output schema does not compile: {e}"))
}
