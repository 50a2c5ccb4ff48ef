use std::{
    collections::BTreeSet,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Instant,
};

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{ChannelError, ClientChannel, ClientFeatures, Envelope, ErrKind, LogLevel};

/// What a caller may do and what its model can do by itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Tool-name patterns the caller may call (`*` suffix for a prefix); `None` allows all.
    pub allowed_tools: Option<Vec<String>>,
    /// Tool-name patterns a policy refuses this caller whatever it sends (a deny rule for
    /// its token or tenant with no `requires_prior`), or that cannot serve it (a per-session
    /// MCP server's tools, to a request with no MCP session): never offered to it (listed,
    /// found, described, suggested), though a call still gets the rule's (or the tool's)
    /// own refusal.
    pub denied_tools: Vec<String>,
    /// Capabilities switched on for the model (for example `web_search`).
    pub model: BTreeSet<String>,
    /// Capabilities the provider can actually deliver.
    pub provider: BTreeSet<String>,
    /// Upstream MCP servers (name patterns, as [`pattern_matches`]) whose passed-through
    /// resources and prompts the caller may list and read; `None` allows all, an empty list
    /// none.
    pub allowed_servers: Option<Vec<String>>,
}

impl Capabilities {
    /// Everything allowed, no model capabilities.
    pub fn all() -> Self {
        Self::default()
    }

    /// Restricts the caller to these tool-name patterns.
    pub fn with_allowed_tools(mut self, patterns: Vec<String>) -> Self {
        self.allowed_tools = Some(patterns);
        self
    }

    /// Restricts the caller's resources and prompts to these servers' (name patterns).
    pub fn with_allowed_servers(mut self, patterns: Vec<String>) -> Self {
        self.allowed_servers = Some(patterns);
        self
    }

    /// Never offers the caller the tools these patterns match (see
    /// [`Capabilities::denied_tools`]).
    pub fn with_denied_tools(mut self, patterns: Vec<String>) -> Self {
        self.denied_tools = patterns;
        self
    }

    /// Whether the caller may list and read the resources and prompts of upstream `server`.
    pub fn allows_server(&self, server: &str) -> bool {
        match &self.allowed_servers {
            None => true,
            Some(patterns) => patterns.iter().any(|p| pattern_matches(p, server)),
        }
    }

    /// Whether the caller may call `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        match &self.allowed_tools {
            None => true,
            Some(patterns) => patterns.iter().any(|p| pattern_matches(p, tool)),
        }
    }

    /// Whether `tool` is offered to the caller (listed, found, described, suggested): it may
    /// call it and no policy refuses it every call.
    pub fn offers(&self, tool: &str) -> bool {
        self.allows(tool) && !self.denies(tool)
    }

    /// Whether a policy refuses the caller every call of `tool` (see
    /// [`Capabilities::denied_tools`]).
    pub fn denies(&self, tool: &str) -> bool {
        self.denied_tools.iter().any(|p| pattern_matches(p, tool))
    }

    /// Whether the caller's model declares every capability of `requires` (a tool's
    /// [`crate::ToolSpec::requires`]).
    pub fn satisfies(&self, requires: &[String]) -> bool {
        requires.iter().all(|c| self.model.contains(c))
    }

    /// Declares the caller's model capabilities.
    pub fn with_model(mut self, capabilities: impl IntoIterator<Item = String>) -> Self {
        self.model = capabilities.into_iter().collect();
        self
    }

    /// Whether a model capability is both switched on and deliverable: the double guard that
    /// lets the surface drop a resident tool the model can do without.
    pub fn replaces(&self, capability: &str) -> bool {
        self.model.contains(capability) && self.provider.contains(capability)
    }
}

/// Matches a tool-name pattern: `*` stands for any run of characters (none included)
/// anywhere in it, so `*` is every tool, `mcp__github__*` a server's tools,
/// `*export*` any name containing `export` and `mcp__*__delete_*` one tool across servers;
/// anything else matches itself exactly.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    if !p.contains(&b'*') {
        return p == n;
    }
    // Greedy with one backtrack point (the last `*`): linear in practice, never exponential.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == b'*')
}

/// A handle through which a running tool calls other tools; the call goes through the same
/// dispatch pipeline as any other.
#[async_trait]
pub trait ToolInvoker: Send + Sync {
    /// Calls `name` with `input` on behalf of `parent`.
    async fn invoke(&self, name: &str, input: Value, parent: &CallContext) -> Envelope;
}

/// The prefix of a session key that lasts one request (a stateless request that names no
/// conversation and presents no token): its working set ends with the request, and nothing
/// is kept for it past that.
pub const REQUEST_SESSION_PREFIX: &str = "request:";

/// The MCP session a call came over: a 2025-era streamable-HTTP session (its
/// `Mcp-Session-Id`) or a stdio connection. What lives per session (a per-session MCP
/// server's process) is keyed by its id and released when it ends.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct McpSession {
    /// The session's id.
    pub id: Arc<str>,
    /// Cancelled when the session ends (`DELETE`, the end of stdin, the transport closed).
    pub ended: CancellationToken,
}

impl McpSession {
    /// The session `id`, which ends when `ended` is cancelled.
    pub fn new(id: impl Into<Arc<str>>, ended: CancellationToken) -> Self {
        McpSession {
            id: id.into(),
            ended,
        }
    }
}

/// Everything a tool knows about the call it is serving.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct CallContext {
    /// The conversation (working-set key), if any.
    pub session: Option<Arc<str>>,
    /// The tenant, if any.
    pub tenant: Option<Arc<str>>,
    /// A unique id for this call.
    pub call_id: Option<Arc<str>>,
    /// The authenticated caller (an inbound token's name), if any.
    pub principal: Option<Arc<str>>,
    /// What the caller may do.
    pub capabilities: Arc<Capabilities>,
    /// Cancelled when the caller gives up; tools that run long should watch it.
    pub cancel: CancellationToken,
    /// The model's stripped narration (`reasoning` and friends), if it gave one.
    pub reasoning: Option<String>,
    /// The handle for calling other tools.
    pub invoker: Option<Arc<dyn ToolInvoker>>,
    /// The moment the call must be over by, if the caller set one.
    pub deadline: Option<Instant>,
    /// How deep in tool-calls-tool composition this call is (0 for a top-level call).
    pub depth: u32,
    /// The way back to the client that made the call (sampling, elicitation, roots, log
    /// messages, progress), if it came over MCP.
    pub client: Option<Arc<dyn ClientChannel>>,
    /// The `call_tool` calls left to the custom-tool invocation this call belongs to: set by
    /// the root custom-tool call, shared (the same `Arc`) by every call nested under it, so a
    /// tree of custom tools calling each other spends one budget. `None` outside custom tools.
    pub call_budget: Option<Arc<CallBudget>>,
    /// The id of the call this one was made from (a tool calling another through
    /// [`ToolInvoker`]); `None` for a call from outside. Logged with the call, so a nested
    /// call's row names its parent.
    pub parent_call_id: Option<Arc<str>>,
    /// The most tokens this call's result may take when less than its tool's budget: the
    /// calls of one batch share their round's budget. `None` for the tool's own budget.
    pub result_tokens: Option<usize>,
    /// The MCP session the call came over, if it came over one (a 2026-07-28 request has
    /// none: that protocol is stateless).
    pub mcp_session: Option<McpSession>,
    /// The end user the call acts for, when the caller presented a user's access token
    /// (`[auth.oidc]`); an upstream that acts for the user is reached with it. `None` for a
    /// configured token, the CLI and stdio.
    pub user: Option<Arc<UserCredential>>,
}

/// The end user a call acts for: the subject of the validated inbound access token, and
/// the token itself, which only an upstream configured to act for the user receives (as it
/// is, or exchanged for one of its own audience). Never printed: its `Debug` shows the
/// subject alone.
#[derive(Clone)]
#[non_exhaustive]
pub struct UserCredential {
    /// The token's `sub`: whose upstream connections the call uses.
    pub subject: Arc<str>,
    /// When the token stops being valid.
    pub expires_at: std::time::SystemTime,
    token: Arc<str>,
}

impl UserCredential {
    /// The user `subject`, who presented `token`, valid until `expires_at`.
    pub fn new(
        subject: impl Into<Arc<str>>,
        token: impl Into<Arc<str>>,
        expires_at: std::time::SystemTime,
    ) -> Self {
        UserCredential {
            subject: subject.into(),
            expires_at,
            token: token.into(),
        }
    }

    /// The access token the user presented: for an upstream that acts for the user only.
    pub fn bearer(&self) -> &str {
        &self.token
    }
}

impl fmt::Debug for UserCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserCredential")
            .field("subject", &self.subject)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// A shared count of the `call_tool` calls one root custom-tool invocation may still make,
/// across all its nesting. Lock-free; cloning the `Arc` shares it.
#[derive(Debug)]
pub struct CallBudget {
    limit: u32,
    left: AtomicU32,
}

impl CallBudget {
    /// A budget of `limit` calls.
    pub fn new(limit: u32) -> Self {
        CallBudget {
            limit,
            left: AtomicU32::new(limit),
        }
    }

    /// Takes one call from the budget; `false` (and nothing taken) when it is spent.
    pub fn try_take(&self) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// The calls still allowed.
    pub fn left(&self) -> u32 {
        self.left.load(Ordering::Acquire)
    }

    /// The calls taken so far.
    pub fn used(&self) -> u32 {
        self.limit - self.left()
    }

    /// The budget it started with.
    pub fn limit(&self) -> u32 {
        self.limit
    }
}

impl fmt::Debug for CallContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallContext")
            .field("session", &self.session)
            .field("tenant", &self.tenant)
            .field("call_id", &self.call_id)
            .field("principal", &self.principal)
            .field("capabilities", &self.capabilities)
            .field("cancelled", &self.cancel.is_cancelled())
            .field("reasoning", &self.reasoning)
            .field("deadline", &self.deadline)
            .field("depth", &self.depth)
            .field("client", &self.client.as_ref().map(|c| c.features()))
            .field("call_budget", &self.call_budget.as_ref().map(|b| b.left()))
            .field("mcp_session", &self.mcp_session.as_ref().map(|s| &s.id))
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl CallContext {
    /// A context for a session.
    pub fn for_session(session: impl Into<Arc<str>>) -> Self {
        CallContext {
            session: Some(session.into()),
            ..Default::default()
        }
    }

    /// Sets the tenant.
    pub fn with_tenant(mut self, tenant: impl Into<Arc<str>>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Sets the principal.
    pub fn with_principal(mut self, principal: impl Into<Arc<str>>) -> Self {
        self.principal = Some(principal.into());
        self
    }

    /// Sets the end user the call acts for.
    pub fn with_user(mut self, user: Arc<UserCredential>) -> Self {
        self.user = Some(user);
        self
    }

    /// Sets the capabilities.
    pub fn with_capabilities(mut self, caps: Capabilities) -> Self {
        self.capabilities = Arc::new(caps);
        self
    }

    /// Sets the cancellation token.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Sets the deadline.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the call id.
    pub fn with_call_id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.call_id = Some(id.into());
        self
    }

    /// Sets the shared `call_tool` budget of the custom-tool invocation this call is part of.
    pub fn with_call_budget(mut self, budget: Arc<CallBudget>) -> Self {
        self.call_budget = Some(budget);
        self
    }

    /// Sets the MCP session the call came over.
    pub fn with_mcp_session(mut self, session: McpSession) -> Self {
        self.mcp_session = Some(session);
        self
    }

    /// Sets the channel back to the calling client.
    pub fn with_client(mut self, client: Arc<dyn ClientChannel>) -> Self {
        self.client = Some(client);
        self
    }

    /// What the calling client declared; all off when no client is attached.
    pub fn client_features(&self) -> ClientFeatures {
        self.client
            .as_ref()
            .map(|c| c.features())
            .unwrap_or_default()
    }

    fn channel(&self, what: &str) -> Result<&Arc<dyn ClientChannel>, ChannelError> {
        self.client.as_ref().ok_or_else(|| {
            ChannelError::Unsupported(format!(
                "cannot send {what}: this call has no MCP client attached to ask (only calls made through `quiver serve` by an MCP client have one)"
            ))
        })
    }

    /// Asks the calling client for an LLM completion (`sampling/createMessage`).
    pub async fn create_message(&self, params: Value) -> Result<Value, ChannelError> {
        self.channel("sampling/createMessage")?
            .create_message(params)
            .await
    }

    /// Asks the calling client's user for input (`elicitation/create`).
    pub async fn elicit(&self, params: Value) -> Result<Value, ChannelError> {
        self.channel("elicitation/create")?.elicit(params).await
    }

    /// Asks the calling client for its roots (`roots/list`).
    pub async fn list_roots(&self) -> Result<Value, ChannelError> {
        self.channel("roots/list")?.list_roots().await
    }

    /// Sends `method` (`sampling/createMessage`, `elicitation/create` or `roots/list`) to
    /// the calling client under the name `key` (see [`ClientChannel::request_named`]).
    pub async fn request_named(
        &self,
        key: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, ChannelError> {
        self.channel(method)?
            .request_named(key, method, params)
            .await
    }

    /// Sends a log message to the calling client; does nothing without one.
    pub async fn log(&self, level: LogLevel, logger: Option<&str>, data: Value) {
        if let Some(c) = &self.client {
            c.log(level, logger, data).await;
        }
    }

    /// Reports progress to the calling client; does nothing without one.
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        if let Some(c) = &self.client {
            c.progress(progress, total, message).await;
        }
    }

    /// Calls another tool through the dispatcher, as part of this call: the same session,
    /// tenant and capabilities, a child cancellation token, and the same deadline.
    pub async fn call_tool(&self, name: &str, input: Value) -> Envelope {
        match &self.invoker {
            Some(invoker) => invoker.invoke(name, input, self).await,
            None => Envelope::err(
                ErrKind::Internal,
                format!("cannot call `{name}`: this context has no tool invoker"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{CallBudget, CallContext, pattern_matches};

    #[test]
    fn a_call_budget_is_shared_by_clones_and_stops_at_zero() {
        let ctx = CallContext::default().with_call_budget(Arc::new(CallBudget::new(2)));
        let child = ctx.clone();
        let budget = child.call_budget.as_ref().unwrap();
        assert!(budget.try_take());
        assert!(ctx.call_budget.as_ref().unwrap().try_take());
        assert!(!budget.try_take());
        assert_eq!((budget.left(), budget.used(), budget.limit()), (0, 2, 2));
    }

    #[test]
    fn patterns_match_with_a_star_anywhere() {
        let cases = [
            ("*", "anything", true),
            ("*", "", true),
            ("add", "add", true),
            ("add", "add2", false),
            ("mcp__github__*", "mcp__github__create_issue", true),
            ("mcp__github__*", "mcp__gitlab__create_issue", false),
            ("*export*", "mcp__up__export_data", true),
            ("*export*", "export", true),
            ("*export*", "mcp__up__import_data", false),
            ("mcp__*__export_data", "mcp__up__export_data", true),
            ("mcp__*__export_data", "mcp__a__b__export_data", true),
            ("mcp__*__export_data", "mcp__up__export_data2", false),
            ("*_delete", "files_delete", true),
            ("*_delete", "files_delete_all", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYc_", false),
            ("**", "x", true),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(pattern_matches(pattern, name), want, "{pattern} vs {name}");
        }
        // No exponential backtracking on adversarial patterns.
        let name = "a".repeat(5000);
        assert!(!pattern_matches(&format!("{}b", "*a".repeat(50)), &name));
    }
}
