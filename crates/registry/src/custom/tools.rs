//! The tools custom tools are served as: `CustomTool` (a stored source run in the sandbox
//! on each call, its `call_tool` nested under the call) and `create_custom_tool`, through
//! which a session of an admin token proposes one.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{
    CallBudget, CallContext, Envelope, Tool, ToolInvoker, ToolResult, ToolSpec, Warning,
};
use serde_json::{Value, json};

use super::{CustomDraft, CustomError, CustomTools, TestCase};
use crate::sandbox::{Sandbox, SandboxHost, SandboxLimits, SandboxRun};

/// A custom tool in the catalog: each call runs its source in the sandbox, with the
/// caller's context for the calls it makes.
pub(super) struct CustomTool {
    pub(super) spec: ToolSpec,
    pub(super) source: Arc<str>,
    pub(super) sandbox: Arc<dyn Sandbox>,
    pub(super) limits: SandboxLimits,
}

/// Where a running custom tool's `call_tool` goes: back into the dispatcher, as a call
/// nested under the custom tool's own (its policies, limits, loop guard and log apply).
struct Nested {
    invoker: Option<Arc<dyn ToolInvoker>>,
    parent: CallContext,
}

#[async_trait]
impl SandboxHost for Nested {
    async fn call_tool(&self, name: &str, inputs: Value) -> Envelope {
        match &self.invoker {
            Some(invoker) => invoker.invoke(name, inputs, &self.parent).await,
            None => Envelope::err(
                quiver_contract::ErrKind::NotAvailable,
                "this custom tool was called outside a dispatcher, so it cannot call other tools",
            ),
        }
    }
}

#[async_trait]
impl Tool for CustomTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let budget = ctx
            .call_budget
            .clone()
            .unwrap_or_else(|| Arc::new(CallBudget::new(self.limits.max_calls)));
        // The calls the script makes are nested under this one and spend its budget.
        let mut parent = ctx.clone();
        parent.call_budget = Some(budget);
        let run = SandboxRun::for_call(
            self.source.clone(),
            input,
            self.limits.clone(),
            Arc::new(Nested {
                invoker: ctx.invoker.clone(),
                parent: parent.clone(),
            }),
            &parent,
        );
        // The script's `call_tool` calls are polled inside this future, so their dispatch
        // spans are this span's children.
        let span = tracing::info_span!(
            target: quiver_contract::trace::TARGET,
            "sandbox.run",
            otel.name = "quiver.sandbox.run",
            otel.status_code = tracing::field::Empty,
            quiver.custom_tool = %self.spec.name,
            quiver.sandbox.host_calls = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let ran = tracing::Instrument::instrument(self.sandbox.run(run), span.clone()).await;
        match ran {
            Ok(out) => {
                span.record("quiver.sandbox.host_calls", i64::from(out.calls));
                let mut envelope = Envelope::ok(out.result);
                if !out.logs.is_empty() {
                    envelope = envelope.with_warning(Warning::new("log", shown_log(&out.logs)));
                }
                Ok(envelope)
            }
            Err(e) => {
                span.record("error.type", e.kind());
                span.record("otel.status_code", "ERROR");
                Ok(e.to_envelope(&self.spec.name, &self.limits))
            }
        }
    }
}

/// The most of a run's `log` lines the model reads, in characters: the log is the tool's
/// author's, for debugging, and a `log` left in a loop must not cost each call thousands of
/// tokens outside the result's budget.
const LOG_SHOWN_CHARS: usize = 2_000;

/// A run's log lines as the model reads them: whole when short, else their head and tail
/// with what was left out said between them (never splitting a character).
fn shown_log(lines: &[String]) -> String {
    let all = lines.join("\n");
    let chars = all.chars().count();
    if chars <= LOG_SHOWN_CHARS {
        return all;
    }
    let half = LOG_SHOWN_CHARS / 2;
    let head: String = all.chars().take(half).collect();
    let tail: String = all.chars().skip(chars - half).collect();
    format!(
        "{head}\n…[{} characters of the log ({} line(s) in all) left out here; the log is for the tool's author]…\n{tail}",
        chars - 2 * half,
        lines.len()
    )
}

/// The name of the tool through which a session proposes a custom tool.
pub const PROPOSE_TOOL: &str = "create_custom_tool";

/// Who may propose custom tools: the names of the admin principals, which the host
/// replaces when its configuration reloads (a revoked admin right holds from the next call).
#[derive(Debug, Clone, Default)]
pub struct ProposalAdmins(Arc<std::sync::RwLock<Vec<String>>>);

impl ProposalAdmins {
    /// These principals may propose.
    pub fn new(names: Vec<String>) -> Self {
        ProposalAdmins(Arc::new(std::sync::RwLock::new(names)))
    }

    /// Replaces the principals who may propose.
    pub fn set(&self, names: Vec<String>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = names;
    }

    /// Whether `principal` may propose.
    pub fn allows(&self, principal: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .any(|a| a == principal)
    }

    /// Whether anyone may.
    pub fn is_empty(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }
}

/// `create_custom_tool`: a session whose token is one of `admins` proposes a custom tool,
/// stored as a draft (never approved) for an operator to audit and approve. Any other
/// caller is refused; the host also keeps the tool off their lists.
pub fn proposal_tool(tools: Arc<CustomTools>, admins: ProposalAdmins) -> Arc<dyn Tool> {
    let spec = ToolSpec::new(
        PROPOSE_TOOL,
        "Proposes a new custom tool written in JavaScript (`async function main(inputs) { ... return result }`; `await call_tool(name, inputs)` calls other tools, `log(...)` adds a log line). It is stored as a draft: an operator audits it with its test cases and approves it before any session can use it. Use it when no existing tool does what is needed and a short script could.",
    )
    .with_schema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The tool's name: lower-case snake_case, e.g. `sum_invoices`."},
            "description": {"type": "string", "description": "What the tool does and when to use it, for the model that will choose it."},
            "input_schema": {"type": "object", "description": "The JSON Schema of its arguments, with `\"type\": \"object\"` at the root."},
            "source": {"type": "string", "description": "The JavaScript source defining `async function main(inputs)`."},
            "tests": {"type": "array", "items": {"type": "object"}, "maxItems": super::MAX_TEST_CASES, "description": "Test cases: `{\"inputs\": {...}, \"expect\": <JSON>}` or `{\"inputs\": {...}, \"expect_error\": \"<kind>\"}`."}
        },
        "required": ["name", "description", "input_schema", "source"],
        "additionalProperties": false
    }));
    Arc::new(Proposal {
        spec,
        tools,
        admins,
    })
}

struct Proposal {
    spec: ToolSpec,
    tools: Arc<CustomTools>,
    admins: ProposalAdmins,
}

#[async_trait]
impl Tool for Proposal {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        let Some(by) = ctx.principal.as_deref().filter(|p| self.admins.allows(p)) else {
            return Ok(Envelope::err(
                quiver_contract::ErrKind::Forbidden,
                "only a session whose token is marked admin may propose custom tools",
            ));
        };
        let text = |key: &str| {
            input
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let tests = match input.get("tests") {
            None => Vec::new(),
            Some(v) => match TestCase::parse_all(v) {
                Ok(t) => t,
                Err(why) => return Err(quiver_contract::ToolError::schema_hint(why, Vec::new())),
            },
        };
        let draft = CustomDraft::new(
            text("name"),
            text("description"),
            input.get("input_schema").cloned().unwrap_or(Value::Null),
            text("source"),
        )
        .with_tests(tests)
        .with_author(by);
        let name = draft.name.clone();
        match self.tools.add(draft).await {
            Ok(added) => Ok(Envelope::ok(json!({
                "name": name,
                "version": added.version,
                "status": "draft",
                "build_job": added.job,
                "next": "its build job compiles it and runs its test cases; then an operator approves it (`quiver custom approve`), and until then no session can call it",
            }))),
            // The arguments fit the schema; what they hold does not make a tool (a source
            // that does not compile, a test case that does not fit): said as such, not as
            // a schema hint, with what to do.
            Err(CustomError::Invalid(why)) => Ok(Envelope::err(
                quiver_contract::ErrKind::Other("invalid_proposal".into()),
                format!("{why}. Fix it and call {PROPOSE_TOOL} again."),
            )),
            Err(e @ (CustomError::NotCustom(..) | CustomError::Status(_))) => {
                Err(quiver_contract::ToolError::schema_hint(
                    format!("{e}; choose another name"),
                    Vec::new(),
                ))
            }
            Err(e) => Ok(Envelope::err(
                quiver_contract::ErrKind::NotAvailable,
                format!("the proposal could not be stored: {e}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    /// A short log is shown whole; a long one keeps its head and tail within the bound,
    /// says how much was left out, and splits no character.
    #[test]
    fn a_long_log_is_shown_by_its_head_and_tail() {
        let short = vec!["one".to_owned(), "two".to_owned()];
        assert_eq!(super::shown_log(&short), "one\ntwo");
        let long: Vec<String> = (0..1000).map(|i| format!("line {i} é")).collect();
        let shown = super::shown_log(&long);
        assert!(shown.starts_with("line 0 é\nline 1 é"), "{shown}");
        assert!(shown.ends_with("line 999 é"), "{shown}");
        assert!(
            shown.contains("characters of the log (1000 line(s) in all) left out here"),
            "{shown}"
        );
        assert!(shown.chars().count() < super::LOG_SHOWN_CHARS + 200);
    }
}
