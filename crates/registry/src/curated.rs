//! Tools an operator defines in files rather than code (the host's catalog directory):
//! an alias that re-describes another tool, and a skill served as a tool of its own with
//! its own schema. Both re-enter the dispatcher for what they do, so nothing about the
//! target (its policies, limits, the loop guard, the log) is bypassed.

use std::sync::Arc;

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, ErrKind, Tool, ToolResult, ToolSpec};
use serde_json::Value;

use crate::skill::SkillSource;

/// A tool that is another tool under a name and description of the operator's: its call
/// is a call of `target` nested under it, with the same arguments.
pub fn alias_tool(spec: ToolSpec, target: impl Into<String>) -> Arc<dyn Tool> {
    Arc::new(Alias {
        spec,
        target: target.into(),
    })
}

struct Alias {
    spec: ToolSpec,
    target: String,
}

#[async_trait]
impl Tool for Alias {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, ctx: &CallContext) -> ToolResult {
        match &ctx.invoker {
            Some(invoker) => {
                // The alias is the operator's grant of its target: a caller allowed the
                // alias may run what it stands for, though its `allowed_tools` never name
                // the hidden target. A policy that denies the target still does.
                let granted;
                let ctx = if ctx.capabilities.allows(&self.target) {
                    ctx
                } else {
                    let mut caps = (*ctx.capabilities).clone();
                    if let Some(allowed) = &mut caps.allowed_tools {
                        allowed.push(self.target.clone());
                    }
                    let mut widened = ctx.clone();
                    widened.capabilities = std::sync::Arc::new(caps);
                    granted = widened;
                    &granted
                };
                let answer = invoker.invoke(&self.target, input, ctx).await;
                // The arguments fit the alias's own schema (the dispatcher checked them):
                // if the target refuses them, the operator's definition does not match it.
                // The model is told the tool cannot be used, not handed a hint about a tool
                // it was never shown.
                if let Envelope::Hint {
                    hint_kind: quiver_contract::HintKind::Schema,
                    message,
                    ..
                } = &answer
                {
                    tracing::warn!(
                        tool = %self.spec.name,
                        target = %self.target,
                        "the catalog alias's arguments do not fit the tool it stands for; fix its input_schema: {message}"
                    );
                    return Ok(Envelope::err(
                        ErrKind::NotAvailable,
                        format!(
                            "`{}` cannot be used now: its definition does not match the tool it runs, which the operator must fix. Use another tool, or tell the user.",
                            self.spec.name
                        ),
                    ));
                }
                // A target the catalog does not hold (a misspelt `ref`, or a tool its
                // server no longer has): the same, and no suggestion of the hidden name.
                if let Envelope::Err {
                    err_kind: ErrKind::UndefinedTool,
                    ..
                } = &answer
                {
                    tracing::warn!(
                        tool = %self.spec.name,
                        target = %self.target,
                        "the catalog alias stands for a tool the catalog does not have; fix its `ref`"
                    );
                    return Ok(Envelope::err(
                        ErrKind::NotAvailable,
                        format!(
                            "`{}` cannot be used now: the tool it runs does not exist, which the operator must fix. Use another tool, or tell the user.",
                            self.spec.name
                        ),
                    ));
                }
                Ok(answer)
            }
            None => Ok(Envelope::err(
                ErrKind::NotAvailable,
                format!(
                    "`{}` stands for `{}`, which can only be reached through a dispatcher",
                    self.spec.name, self.target
                ),
            )),
        }
    }
}

/// A skill served as a tool of its own: its call returns the skill's instructions with
/// `$ARGUMENTS` replaced by the arguments as JSON and `$1`, `$2`... by the values of the
/// schema's properties in the order they are declared.
pub fn skill_as_tool(
    spec: ToolSpec,
    skill: impl Into<String>,
    source: Arc<dyn SkillSource>,
) -> Arc<dyn Tool> {
    Arc::new(SkillTool {
        spec,
        skill: skill.into(),
        source,
    })
}

struct SkillTool {
    spec: ToolSpec,
    skill: String,
    source: Arc<dyn SkillSource>,
}

#[async_trait]
impl Tool for SkillTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, input: Value, _ctx: &CallContext) -> ToolResult {
        let body = match self.source.skill_body(&self.skill).await {
            Ok(body) => body,
            Err(e) => {
                return Ok(Envelope::err(
                    ErrKind::NotAvailable,
                    format!(
                        "the skill `{}` behind `{}` cannot be read: {e}",
                        self.skill, self.spec.name
                    ),
                ));
            }
        };
        let ordered: Vec<String> = self
            .spec
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| {
                props
                    .keys()
                    .map(|k| match input.get(k) {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Null) | None => String::new(),
                        Some(other) => other.to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let text = fill(&body, &input.to_string(), &ordered);
        Ok(Envelope::text(text))
    }
}

/// `body` with `$ARGUMENTS` replaced by `whole` and `$1`, `$2`... by `values` (empty past
/// the last), in one pass: a value's own `$1` is never replaced again.
fn fill(body: &str, whole: &str, values: &[String]) -> String {
    let mut out = String::with_capacity(body.len() + whole.len());
    let mut rest = body;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix("ARGUMENTS") {
            out.push_str(whole);
            rest = tail;
            continue;
        }
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        match after[..digits].parse::<usize>() {
            Ok(n) if n >= 1 => {
                out.push_str(values.get(n - 1).map_or("", String::as_str));
                rest = &after[digits..];
            }
            _ => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skill::MemorySkills;
    use serde_json::json;

    #[tokio::test]
    async fn a_skill_tool_substitutes_its_arguments_in_declaration_order() {
        let source: Arc<dyn SkillSource> = Arc::new(MemorySkills::new().with_skill(
            crate::skill::SkillTier::Explicit,
            "release",
            "Ships a release.",
            "Ship $1 to $2. All: $ARGUMENTS\n",
        ));
        let spec = ToolSpec::new(
            "ship_release",
            "Ships a release. Use it when asked to ship.",
        )
        .with_schema(json!({
            "type": "object",
            "properties": {"version": {"type": "string"}, "target": {"type": "string"}},
        }));
        let tool = skill_as_tool(spec, "release", source);
        let out = tool
            .call(
                json!({"target": "the staging cluster", "version": "1.2"}),
                &CallContext::for_session("s"),
            )
            .await
            .unwrap();
        let text = quiver_contract::render(&out, &quiver_contract::RenderOptions::default());
        assert!(text.contains("Ship 1.2 to the staging cluster."), "{text}");
        assert!(
            text.contains(r#"All: {"target":"the staging cluster","version":"1.2"}"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_alias_outside_a_dispatcher_says_what_it_stands_for() {
        let tool = alias_tool(ToolSpec::new("say", "Says."), "mcp__everything__echo");
        let out = tool
            .call(json!({}), &CallContext::for_session("s"))
            .await
            .unwrap();
        assert!(
            format!("{out:?}").contains("mcp__everything__echo"),
            "{out:?}"
        );
    }
}
