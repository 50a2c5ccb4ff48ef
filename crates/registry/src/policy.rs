//! Rule-based policy: deny or warn per tool-name pattern, optionally per tenant or
//! principal, or when a required earlier tool has not been called in the session.

use quiver_contract::{Finding, pattern_matches};
use serde::{Deserialize, Serialize};

use crate::{PolicyCheck, PolicyRequest, PolicyVerdict};

/// What a triggered rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyAction {
    /// Refuse the call; the result says why.
    Deny,
    /// Run the call; the result carries a warning, more emphatic on repeats.
    Warn,
}

/// One policy rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PolicyRule {
    /// A stable id, used to count repeats.
    pub id: String,
    /// Tool-name pattern: exact, `*`, or `prefix*`.
    pub tool: String,
    /// Deny or warn.
    pub action: PolicyAction,
    /// What the model is told.
    pub message: String,
    /// Only for this tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Only for this principal (inbound token name).
    #[serde(default)]
    pub principal: Option<String>,
    /// Triggers only when this tool has NOT been called earlier in the session (and never
    /// for this tool itself, which `tool` may also match).
    #[serde(default)]
    pub requires_prior: Option<String>,
}

impl PolicyRule {
    /// Whether the rule refuses every call of its tools by a caller of this tenant and
    /// principal, whatever the call sends and whatever came before: a deny for them (or for
    /// everyone) with no `requires_prior`. Such tools are not offered to that caller.
    pub fn always_denies(&self, tenant: Option<&str>, principal: Option<&str>) -> bool {
        self.action == PolicyAction::Deny
            && self.requires_prior.is_none()
            && self.tenant.as_deref().is_none_or(|t| tenant == Some(t))
            && self
                .principal
                .as_deref()
                .is_none_or(|p| principal == Some(p))
    }

    /// A rule for a tool pattern.
    pub fn new(
        id: impl Into<String>,
        tool: impl Into<String>,
        action: PolicyAction,
        message: impl Into<String>,
    ) -> Self {
        PolicyRule {
            id: id.into(),
            tool: tool.into(),
            action,
            message: message.into(),
            tenant: None,
            principal: None,
            requires_prior: None,
        }
    }

    /// Restricts the rule to a tenant.
    pub fn for_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Restricts the rule to a principal.
    pub fn for_principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(principal.into());
        self
    }

    /// Triggers only when `tool` has not been called earlier in the session.
    pub fn requires_prior(mut self, tool: impl Into<String>) -> Self {
        self.requires_prior = Some(tool.into());
        self
    }
}

/// The rules among `rules` that do not fit together, for `quiver check`: a rule that needs
/// an earlier call of a tool that another rule refuses every caller, so its own tools can
/// never be called (a deny) or are warned about on every call (a warn).
pub fn policy_findings(rules: &[PolicyRule]) -> Vec<Finding> {
    let mut out = Vec::new();
    // A deny of every caller's `tool_search` leaves models the resident floor only.
    if let Some(deny) = rules
        .iter()
        .filter(|d| d.action == PolicyAction::Deny && d.always_denies(None, None))
        .find(|d| pattern_matches(&d.tool, "tool_search"))
    {
        out.push(Finding::note(format!(
            "policy: [note] policy rule `{}` refuses tool_search to every caller, so models cannot find tools beyond the resident floor; narrow the rule's `tool` if that is not meant",
            deny.id
        )));
    }
    for r in rules {
        let Some(prior) = &r.requires_prior else {
            continue;
        };
        if let Some(deny) = rules
            .iter()
            .filter(|d| d.always_denies(None, None))
            .find(|d| pattern_matches(&d.tool, prior))
        {
            let so = match r.action {
                PolicyAction::Deny => "can never be called",
                PolicyAction::Warn => "is warned about on every call",
            };
            out.push(Finding::error(format!(
                "policy: [config] policy rule `{}` needs a call of `{prior}` first, which policy rule `{}` refuses every caller, so `{}` {so}; narrow one of the rules",
                r.id, deny.id, r.tool
            )));
        }
    }
    out
}

/// A [`PolicyCheck`] over a list of rules.
#[derive(Debug, Clone, Default)]
pub struct RulePolicy {
    rules: Vec<PolicyRule>,
}

impl RulePolicy {
    /// A policy of these rules.
    pub fn new(rules: Vec<PolicyRule>) -> Self {
        RulePolicy { rules }
    }
}

impl PolicyCheck for RulePolicy {
    fn check<'a>(&self, req: &PolicyRequest<'a>) -> Vec<PolicyVerdict> {
        self.rules
            .iter()
            .filter(|r| pattern_matches(&r.tool, &req.spec.name))
            .filter(|r| {
                r.tenant
                    .as_deref()
                    .is_none_or(|t| req.ctx.tenant.as_deref() == Some(t))
            })
            .filter(|r| {
                r.principal
                    .as_deref()
                    .is_none_or(|p| req.ctx.principal.as_deref() == Some(p))
            })
            .filter(|r| {
                // The tool a rule requires first is never held back by that rule: a
                // pattern that covers it too ("mcp__time__*" before which
                // "mcp__time__get_current_time" must run) would refuse the one call that
                // satisfies it.
                r.requires_prior.as_deref().is_none_or(|prior| {
                    prior != req.spec.name.as_str() && !(req.called_before)(prior)
                })
            })
            .map(|r| PolicyVerdict::new(r.id.clone(), r.action, r.message.clone()))
            .collect()
    }
}
