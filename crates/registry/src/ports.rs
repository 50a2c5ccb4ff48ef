//! The ports the dispatcher consumes, with in-memory implementations.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, ToolSpec};
use serde_json::Value;

use crate::sync::lock;

/// One finished call, as the recorder receives it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CallRecord {
    /// The tool name as called (it may be unknown to the catalog).
    pub tool_name: String,
    /// The session (conversation) key.
    pub session: Option<Arc<str>>,
    /// The tenant.
    pub tenant: Option<Arc<str>>,
    /// Who called: the inbound token's name (`None` for a call without one, e.g. the CLI).
    pub principal: Option<Arc<str>>,
    /// The call's unique id.
    pub call_id: Arc<str>,
    /// The id of the call this one was made from (a custom tool's `call_tool`), if any.
    pub parent_call_id: Option<Arc<str>>,
    /// The arguments as given (narration stripped).
    pub input: Value,
    /// The stripped narration.
    pub reasoning: Option<String>,
    /// [`quiver_contract::args_hash`] of the call.
    pub args_hash: String,
    /// The outcome.
    pub envelope: Envelope,
    /// Time waited before execution began (queueing for a concurrency permit).
    pub queued: Duration,
    /// Time from dispatch to result.
    pub took: Duration,
    /// When the call was dispatched.
    pub at: SystemTime,
    /// The OpenTelemetry trace the call was part of (32 hex digits), when traces are
    /// recorded.
    pub trace_id: Option<Arc<str>>,
}

impl CallRecord {
    /// A record of a call to `tool_name` that ended in `envelope`: no session or tenant, no
    /// narration, the arguments' [`quiver_contract::args_hash`], zero timings, dispatched now.
    pub fn new(
        tool_name: impl Into<String>,
        call_id: impl Into<Arc<str>>,
        input: Value,
        envelope: Envelope,
    ) -> Self {
        let tool_name = tool_name.into();
        let args_hash = quiver_contract::args_hash(&tool_name, &input);
        CallRecord {
            tool_name,
            session: None,
            tenant: None,
            principal: None,
            call_id: call_id.into(),
            parent_call_id: None,
            input,
            reasoning: None,
            args_hash,
            envelope,
            queued: Duration::ZERO,
            took: Duration::ZERO,
            at: SystemTime::now(),
            trace_id: None,
        }
    }

    /// Sets the session.
    pub fn with_session(mut self, session: impl Into<Arc<str>>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// Sets the OpenTelemetry trace id.
    pub fn with_trace_id(mut self, trace_id: impl Into<Arc<str>>) -> Self {
        self.trace_id = Some(trace_id.into());
        self
    }

    /// Sets the call this one was made from.
    pub fn with_parent(mut self, parent_call_id: impl Into<Arc<str>>) -> Self {
        self.parent_call_id = Some(parent_call_id.into());
        self
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

    /// Sets the narration.
    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Self {
        self.reasoning = Some(reasoning.into());
        self
    }

    /// Sets the timings.
    pub fn with_timings(mut self, queued: Duration, took: Duration) -> Self {
        self.queued = queued;
        self.took = took;
        self
    }

    /// Sets when the call was dispatched.
    pub fn with_at(mut self, at: SystemTime) -> Self {
        self.at = at;
        self
    }
}

/// Receives one record per call, after the call returns. Implementations must not lose a
/// record: when they buffer, `record` waits for room rather than dropping. The dispatcher
/// answers a call only once `record` has returned, so a recorder that makes `record` wait
/// for its record's commit ([`crate::log_writer::Durability::Strict`]) holds the answer
/// until its row is durable.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait ToolCallRecorder: Send + Sync {
    /// Records one finished call: returns once the record is handed over (a buffering
    /// recorder), or once it is durable (a strict one).
    async fn record(&self, record: CallRecord);

    /// Waits until every record handed over so far is durable.
    async fn flush(&self) {}
}

/// A recorder that forgets everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullRecorder;

#[async_trait]
impl ToolCallRecorder for NullRecorder {
    async fn record(&self, _record: CallRecord) {}
}

/// A recorder that keeps every record in memory, for tests and embedding.
#[derive(Debug, Default)]
pub struct MemoryRecorder {
    records: Mutex<Vec<CallRecord>>,
}

impl MemoryRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of every record so far.
    pub fn records(&self) -> Vec<CallRecord> {
        lock(&self.records).clone()
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        lock(&self.records).len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl ToolCallRecorder for MemoryRecorder {
    async fn record(&self, record: CallRecord) {
        lock(&self.records).push(record);
    }
}

/// What a policy check sees of a call.
#[non_exhaustive]
pub struct PolicyRequest<'a> {
    /// The tool's spec.
    pub spec: &'a ToolSpec,
    /// The arguments, as sent: the policy is asked before they are checked against the
    /// tool's schema (a refused tool's call gets the refusal, whatever it sends).
    pub input: &'a Value,
    /// The call's context (session, tenant, principal).
    pub ctx: &'a CallContext,
    /// Whether a tool has been called earlier in this session.
    pub called_before: &'a (dyn Fn(&str) -> bool + Sync),
}

impl std::fmt::Debug for PolicyRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyRequest")
            .field("tool", &self.spec.name)
            .finish_non_exhaustive()
    }
}

/// A triggered policy rule.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyVerdict {
    /// The rule's id (repeat counting is per rule and session).
    pub rule: String,
    /// Deny or warn.
    pub action: crate::PolicyAction,
    /// Why, for the model.
    pub message: String,
}

impl PolicyVerdict {
    /// A verdict.
    pub fn new(
        rule: impl Into<String>,
        action: crate::PolicyAction,
        message: impl Into<String>,
    ) -> Self {
        PolicyVerdict {
            rule: rule.into(),
            action,
            message: message.into(),
        }
    }
}

/// Consulted before every execution. Returns the rules the call triggers (none to allow).
#[cfg_attr(feature = "mock", mockall::automock)]
pub trait PolicyCheck: Send + Sync {
    /// Checks one call.
    fn check<'a>(&self, request: &PolicyRequest<'a>) -> Vec<PolicyVerdict>;
}

/// A policy that allows everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPolicy;

impl PolicyCheck for NoPolicy {
    fn check<'a>(&self, _request: &PolicyRequest<'a>) -> Vec<PolicyVerdict> {
        Vec::new()
    }
}

/// Told about every finished call (for example so the surface refreshes a used tool in the
/// session's working set). Must be quick: it runs on the call path.
pub trait CallObserver: Send + Sync {
    /// A call to `tool` in `session` that ran (it passed admission) finished with
    /// `envelope`.
    fn call_finished(&self, session: Option<&str>, tool: &str, envelope: &Envelope);

    /// Every call, refused or run, as it is handed to the recorder: what a counting observer
    /// (metrics) needs. The default ignores it.
    fn call_measured(&self, measure: &CallMeasure<'_>) {
        let _ = measure;
    }
}

/// How a call ended, as counted: a refusal is told apart from an `Err` the tool's run gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The tool ran and answered Ok.
    Ok,
    /// The tool ran and answered with a hint.
    Hint,
    /// The tool ran (or was cancelled, or timed out) and answered with an error.
    Err,
    /// Refused before the tool ran: unknown, forbidden, denied by policy, looping, bad
    /// arguments, too large or too deep, or a request the transport could not read.
    Refused,
}

impl Outcome {
    /// Every outcome, in a stable order.
    pub const ALL: [Outcome; 4] = [Outcome::Ok, Outcome::Hint, Outcome::Err, Outcome::Refused];

    /// Its lower-case name (`ok`, `hint`, `err`, `refused`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Hint => "hint",
            Outcome::Err => "err",
            Outcome::Refused => "refused",
        }
    }
}

/// One finished call as [`CallObserver::call_measured`] sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CallMeasure<'a> {
    /// The tool's name in the catalog; every name the catalog does not have is counted as
    /// [`UNDEFINED_TOOLS`](crate::UNDEFINED_TOOLS), so a long-running server's counters do
    /// not grow with the names callers make up.
    pub tool: &'a str,
    /// The family the tool was registered by (`core`, `mcp:<server>`, `custom`, ...);
    /// `None` for a name the catalog does not have.
    pub family: Option<&'a str>,
    /// How it ended.
    pub outcome: Outcome,
    /// Time waited before the tool ran (for a concurrency permit); zero for a refusal.
    pub queued: Duration,
    /// Time from dispatch to result, the wait included.
    pub took: Duration,
}
