//! Server-to-client requests on the stateless 2026-07-28 protocol: multi round-trip
//! requests (SEP-2322).
//!
//! That protocol forbids a server to send requests to the client. A `tools/call` whose tool
//! (or the upstream behind it) needs sampling, elicitation or roots instead answers with an
//! `InputRequiredResult`: the requests the client must fulfil and an opaque `requestState`.
//! The client runs them through its own callbacks and sends the same `tools/call` again with
//! `inputResponses` and the `requestState`; that answer is the call's result, or another
//! round. `prompts/get` and `resources/read` work the same way (an upstream server that
//! elicits while it renders a prompt): each is a call here, its [`Target`] the method and
//! the prompt's name or the resource's URI.
//!
//! Quiver keeps the call running between the rounds instead of re-running it (a tool, or an
//! upstream server waiting for its elicitation answer, cannot be replayed): the call runs in
//! its own task, each request it sends to the client is parked, and `requestState` is only
//! the handle of the waiting call (a random id, never data the server trusts). A retry must
//! name the same target for the same [`Owner`] (working-set key, principal and tenant); its
//! `arguments` are ignored, the call already has them. The client's answers are checked
//! against the result type of each request before the tool sees them. A parked call the
//! client never comes back for is cancelled after
//! [`ServerOptions::input_wait`](super::ServerOptions); the call's own timeout keeps running
//! while it waits, so the shorter of the two ends it. At most [`MAX_PARKED`] calls wait at
//! once, [`MAX_PARKED_PER_OWNER`] per owner and [`MAX_PARKED_PER_TOKEN`] per token over all
//! its working-set keys; beyond that a tool's request is refused in
//! words. Log and progress notifications of such a call go to the request of the current
//! round, which also carries its own progress heartbeat.
//!
//! A round collects every request the call sends within [`SETTLE`] of its first (a tool that
//! asks for several things at once gets them in one round), each under the name the tool gave
//! it (`ClientChannel::request_named`) or a generated one. Answers the client sends before they
//! are asked for (a first call carrying `inputResponses`, the ephemeral style, or extra keys on
//! a retry) serve the requests named with their keys without a round; `inputResponses` values
//! that are not objects are refused as invalid params. A call whose failure is the refusal
//! of a capability the client did not declare is answered with `-32021` (Missing Required
//! Client Capability, SEP-2575) naming it, instead of the tool error.

// Sampling and roots are deprecated by SEP-2577; 2026-era clients may still offer them.
#![allow(deprecated)]

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use async_trait::async_trait;
use quiver_contract::{ChannelError, ClientChannel, ClientFeatures, ClientRequest, LogLevel};
use rmcp::{
    ErrorData,
    model::{
        CallToolResponse, CallToolResult, CreateMessageRequestParams, CreateMessageResult,
        ElicitRequestParams, ElicitResult, GetPromptResponse, GetPromptResult, InputRequest,
        InputRequests, InputRequiredResult, InputResponses, ListRootsResult, ReadResourceResponse,
        ReadResourceResult,
    },
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::call::Heartbeat;
use super::channel::{Missing, parse};
use crate::sync::lock;

/// How the refusal of a retry begins whose `requestState` names no call held for its
/// caller (none, or another caller's): nothing ran, and no held call's row covers it.
pub(crate) const STATE_REFUSED: &str = "requestState";

/// Most calls that may wait for client input at once.
pub(crate) const MAX_PARKED: usize = 1024;

/// Most calls of one [`Owner`] that may wait for client input at once.
pub(crate) const MAX_PARKED_PER_OWNER: usize = 32;

/// Most calls of one token (over all its working-set keys) that may wait at once.
pub(crate) const MAX_PARKED_PER_TOKEN: usize = 256;

/// Whose call it is: a retry must come from the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The working-set key.
    pub(crate) key: Arc<str>,
    /// The authenticated token's name, if any.
    pub(crate) principal: Option<Arc<str>>,
    /// The token's tenant, if any.
    pub(crate) tenant: Option<Arc<str>>,
}

/// What a call in rounds answers: a retry must name the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    method: &'static str,
    /// The tool's or prompt's name, or the resource's URI.
    name: String,
}

impl Target {
    pub(crate) fn tool(name: &str) -> Self {
        Target {
            method: "tools/call",
            name: name.to_owned(),
        }
    }

    pub(crate) fn prompt(name: &str) -> Self {
        Target {
            method: "prompts/get",
            name: name.to_owned(),
        }
    }

    pub(crate) fn resource(uri: &str) -> Self {
        Target {
            method: "resources/read",
            name: uri.to_owned(),
        }
    }

    /// The tool's or prompt's name, or the resource's URI.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// What the client should do to start over.
    fn again(&self) -> String {
        match self.method {
            "tools/call" => format!("Call `{}` again", self.name),
            m => format!("Send {m} for `{}` again", self.name),
        }
    }
}

/// A tool call.
impl From<&str> for Target {
    fn from(tool: &str) -> Self {
        Target::tool(tool)
    }
}

/// How a call in rounds ended.
pub(crate) enum Done {
    Tool(CallToolResult),
    Prompt(Result<GetPromptResult, ErrorData>),
    Resource(Result<ReadResourceResult, ErrorData>),
}

impl From<CallToolResult> for Done {
    fn from(r: CallToolResult) -> Self {
        Done::Tool(r)
    }
}

impl From<Result<GetPromptResult, ErrorData>> for Done {
    fn from(r: Result<GetPromptResult, ErrorData>) -> Self {
        Done::Prompt(r)
    }
}

impl From<Result<ReadResourceResult, ErrorData>> for Done {
    fn from(r: Result<ReadResourceResult, ErrorData>) -> Self {
        Done::Resource(r)
    }
}

/// The answer of a request that may take rounds: its complete result, or the next round.
pub(crate) trait RoundResponse: From<InputRequiredResult> + Sized {
    /// The request's answer once its call has ended; a failure that is the refusal of an
    /// undeclared capability becomes `-32021`.
    fn complete(done: Done, missing: &Missing) -> Result<Self, ErrorData>;
}

/// A round's end that is not its request's kind; [`Rounds::resume`] checks the target, so
/// this is a bug, reported rather than panicking.
fn mismatch(method: &str) -> ErrorData {
    ErrorData::internal_error(
        format!("a {method} call ended with another request's result"),
        None,
    )
}

impl RoundResponse for CallToolResponse {
    fn complete(done: Done, missing: &Missing) -> Result<Self, ErrorData> {
        match done {
            Done::Tool(r) => Ok(missing.answer(r)?.into()),
            _ => Err(mismatch("tools/call")),
        }
    }
}

impl RoundResponse for GetPromptResponse {
    fn complete(done: Done, missing: &Missing) -> Result<Self, ErrorData> {
        match done {
            Done::Prompt(r) => Ok(r.map_err(|e| missing.error("prompt", e))?.into()),
            _ => Err(mismatch("prompts/get")),
        }
    }
}

impl RoundResponse for ReadResourceResponse {
    fn complete(done: Done, missing: &Missing) -> Result<Self, ErrorData> {
        match done {
            Done::Resource(r) => Ok(r.map_err(|e| missing.error("resource", e))?.into()),
            _ => Err(mismatch("resources/read")),
        }
    }
}

type Reply = oneshot::Sender<Result<Value, ChannelError>>;

/// One request of a running call to its client.
struct Ask {
    method: &'static str,
    /// The name the tool gave it (`ClientChannel::request_named`).
    key: Option<String>,
    params: Option<Value>,
    reply: Reply,
}

/// How long a round waits, after a call's first request, for more requests the call sends
/// at once (a tool that asks for several things concurrently gets them in one round).
const SETTLE: Duration = Duration::from_millis(5);

/// The calls waiting for their client's next round.
pub(crate) struct Rounds {
    parked: Mutex<HashMap<String, Parked>>,
    wait: Duration,
}

struct Parked {
    run: Running,
    /// Cancels the call when the client does not come back in time.
    expiry: tokio::task::JoinHandle<()>,
    since: tokio::time::Instant,
}

/// How long a parked call that has ended anyway (its own timeout, say) keeps its result for a
/// late retry once the table is under pressure.
const ENDED_GRACE: Duration = Duration::from_secs(60);

/// A call in its own task, with the requests it sent to the client.
pub(crate) struct Running {
    task: tokio::task::JoinHandle<Done>,
    asks: mpsc::UnboundedReceiver<Ask>,
    /// Requests sent to the client in the last round: their `inputRequests` key and method.
    waiting: Vec<(String, &'static str, Reply)>,
    /// The call's own cancellation (the client's `notifications/cancelled` of any round).
    cancel: CancellationToken,
    target: Target,
    owner: Owner,
    /// Where log and progress notifications go: the request of the current round.
    current: Arc<Mutex<Arc<dyn ClientChannel>>>,
    /// Capabilities the call asked for that the client had not declared.
    missing: Arc<Missing>,
    /// Answers the client sent before they were asked for (a first call with
    /// `inputResponses`, the ephemeral style of SEP-2322, or extra keys of a retry): a
    /// request named with one of these keys takes it instead of a round.
    preset: InputResponses,
    asked: u64,
}

impl Drop for Running {
    /// A call nobody drives or keeps any more (its request went away while it ran) ends.
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Rounds {
    pub(crate) fn new(wait: Duration) -> Self {
        Rounds {
            parked: Mutex::new(HashMap::new()),
            wait,
        }
    }

    /// How many calls wait for their client.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.parked).len()
    }

    /// Starts `call` in its own task, handing it a [`RoundChannel`] as its client channel and
    /// its cancellation token. `notify` (the request's own channel) takes the call's log and
    /// progress notifications until the next round.
    pub(crate) fn start<F, Fut, T>(
        target: impl Into<Target>,
        owner: Owner,
        features: ClientFeatures,
        missing: Arc<Missing>,
        preset: Option<InputResponses>,
        notify: Arc<dyn ClientChannel>,
        call: F,
    ) -> Running
    where
        F: FnOnce(Arc<dyn ClientChannel>, CancellationToken) -> Fut,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Into<Done>,
    {
        let (tx, asks) = mpsc::unbounded_channel();
        let current = Arc::new(Mutex::new(notify));
        let channel: Arc<dyn ClientChannel> = Arc::new(RoundChannel {
            asks: tx,
            current: current.clone(),
            features,
            missing: missing.clone(),
        });
        let cancel = CancellationToken::new();
        let call = call(channel, cancel.clone());
        let task = tokio::spawn(async move { call.await.into() });
        Running {
            task,
            asks,
            waiting: Vec::new(),
            cancel,
            target: target.into(),
            owner,
            current,
            missing,
            preset: preset.unwrap_or_default(),
            asked: 0,
        }
    }

    /// Takes the call `state` names back for its next round, points its notifications at
    /// this round's request and hands it the client's answers.
    pub(crate) fn resume(
        &self,
        state: &str,
        target: impl Into<Target>,
        owner: &Owner,
        responses: Option<InputResponses>,
        notify: Arc<dyn ClientChannel>,
    ) -> Result<Running, ErrorData> {
        let target = target.into();
        let mut parked = lock(&self.parked);
        let Some(p) = parked.get(state) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "{STATE_REFUSED} does not name a call waiting on this server: it finished and its result was already returned, it waited longer than {}s for input and was cancelled, it was never issued here, or the server restarted. {} without requestState and inputResponses.",
                    self.wait.as_secs_f64(),
                    target.again()
                ),
                None,
            ));
        };
        if p.run.target != target || p.run.owner != *owner {
            return Err(ErrorData::invalid_params(
                format!(
                    "{STATE_REFUSED} belongs to another call: retry {} `{}` with the same conversation key, session and token as the request that returned it, and the requestState unchanged",
                    p.run.target.method, p.run.target.name
                ),
                None,
            ));
        }
        let Parked {
            mut run, expiry, ..
        } = parked.remove(state).expect("present");
        drop(parked);
        expiry.abort();
        *lock(&run.current) = notify;
        let mut responses = responses.unwrap_or_default();
        for (k, method, reply) in run.waiting.drain(..) {
            let answer = match responses.remove(&k) {
                Some(v) => checked_answer(&k, method, v),
                None => Err(ChannelError::Client {
                    code: i64::from(rmcp::model::ErrorCode::INVALID_PARAMS.0),
                    message: format!("the client sent no response for input request `{k}`"),
                    data: None,
                }),
            };
            let _ = reply.send(answer);
        }
        // Answers to requests not made yet are kept for when they are.
        run.preset.extend(responses);
        Ok(run)
    }

    /// Waits for the call to finish (its result) or to ask its client something (an
    /// `InputRequiredResult`, the call parked). `ct` is this round's request cancellation;
    /// `heartbeat` this round's progress heartbeat, if it asked for progress.
    pub(crate) async fn drive<R: RoundResponse>(
        self: &Arc<Self>,
        mut run: Running,
        ct: &CancellationToken,
        mut heartbeat: Option<Heartbeat>,
    ) -> Result<R, ErrorData> {
        let mut cancelled = false;
        // Requests of the round being gathered, and when the gathering ends.
        let mut pending: Vec<Ask> = Vec::new();
        let mut until: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = ct.cancelled(), if !cancelled => {
                    // notifications/cancelled for this round: the call ends as cancelled,
                    // and what it asked or asks from now on is refused.
                    cancelled = true;
                    run.cancel.cancel();
                    for ask in pending.drain(..) {
                        let _ = ask.reply.send(Err(ChannelError::Cancelled));
                    }
                    until = None;
                }
                done = &mut run.task => {
                    // Requests still gathered are moot: their replies are dropped.
                    let result = done.map_err(|e| {
                        ErrorData::internal_error(format!("the call's task failed: {e}"), None)
                    })?;
                    return R::complete(result, &run.missing);
                }
                Some(ask) = run.asks.recv() => {
                    if cancelled {
                        let _ = ask.reply.send(Err(ChannelError::Cancelled));
                        continue;
                    }
                    // An answer the client sent ahead serves the request at once.
                    if let Some(ask) = run.serve_preset(ask) {
                        pending.push(ask);
                        until.get_or_insert_with(|| tokio::time::Instant::now() + SETTLE);
                    }
                }
                _ = async { tokio::time::sleep_until(until.expect("guarded")).await }, if until.is_some() => {
                    until = None;
                    // A request whose caller gave up (a tool that stopped waiting) is dropped.
                    pending.retain(|a| !a.reply.is_closed());
                    let requests = run.take_asks(std::mem::take(&mut pending));
                    if requests.is_empty() {
                        continue;
                    }
                    match self.park(run) {
                        Ok(state) => {
                            return Ok(InputRequiredResult::new(Some(requests), Some(state)).into());
                        }
                        Err(back) => run = *back,
                    }
                }
                _ = async { heartbeat.as_mut().expect("guarded").beat(&run.target.name).await }, if heartbeat.is_some() => {}
            }
        }
    }

    /// Parks `run` and returns its handle, or gives it back with its requests refused when
    /// too many calls wait already.
    fn park(self: &Arc<Self>, mut run: Running) -> Result<String, Box<Running>> {
        let mut parked = lock(&self.parked);
        // Per key, and per token across its keys (keys are client-chosen: one token must not
        // fill the table by varying them).
        let same_token = |p: &Parked| {
            run.owner.principal.is_some() && p.run.owner.principal == run.owner.principal
        };
        let owner_full = |parked: &HashMap<String, Parked>| {
            parked.values().filter(|p| p.run.owner == run.owner).count() >= MAX_PARKED_PER_OWNER
                || parked.values().filter(|p| same_token(p)).count() >= MAX_PARKED_PER_TOKEN
        };
        if parked.len() >= MAX_PARKED || owner_full(&parked) {
            // Calls that ended while their client stayed away (their own timeout, say) make
            // room once they have kept their result for a while.
            let now = tokio::time::Instant::now();
            parked.retain(|_, p| {
                let keep = !p.run.task.is_finished() || now - p.since < ENDED_GRACE;
                if !keep {
                    p.expiry.abort();
                }
                keep
            });
        }
        let mine = parked.values().filter(|p| p.run.owner == run.owner).count();
        let token = parked.values().filter(|p| same_token(p)).count();
        let full = if parked.len() >= MAX_PARKED {
            Some(format!(
                "{MAX_PARKED} calls already wait for their clients' input"
            ))
        } else if token >= MAX_PARKED_PER_TOKEN {
            Some(format!(
                "{MAX_PARKED_PER_TOKEN} calls of this token already wait for input; answer or cancel those first"
            ))
        } else if mine >= MAX_PARKED_PER_OWNER {
            Some(format!(
                "{MAX_PARKED_PER_OWNER} of this client's calls already wait for its input; answer or cancel those first"
            ))
        } else {
            None
        };
        if let Some(why) = full {
            drop(parked);
            for (_, _, reply) in run.waiting.drain(..) {
                let _ = reply.send(Err(ChannelError::Unsupported(format!(
                    "cannot ask the client now: {why}"
                ))));
            }
            return Err(Box::new(run));
        }
        let state = uuid::Uuid::new_v4().simple().to_string();
        let weak: Weak<Rounds> = Arc::downgrade(self);
        let (wait, named) = (self.wait, state.clone());
        // Spawned under the lock, so it cannot look for the entry before it is there.
        let expiry = tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(rounds) = weak.upgrade() else { return };
            let Some(p) = lock(&rounds.parked).remove(&named) else {
                return;
            };
            tracing::info!(
                method = p.run.target.method,
                target = %p.run.target.name,
                waited_s = wait.as_secs_f64(),
                "the client did not answer the call's input requests in time: cancelling the call"
            );
            // Dropping the call cancels it; its waiting requests see `Cancelled`.
        });
        parked.insert(
            state.clone(),
            Parked {
                run,
                expiry,
                since: tokio::time::Instant::now(),
            },
        );
        Ok(state)
    }
}

impl Running {
    /// Answers `ask` from the answers the client sent ahead, if one has its name; else gives
    /// it back.
    fn serve_preset(&mut self, ask: Ask) -> Option<Ask> {
        match ask.key.as_ref().and_then(|k| self.preset.remove(k)) {
            Some(answer) => {
                let key = ask.key.as_deref().unwrap_or_default();
                let _ = ask.reply.send(checked_answer(key, ask.method, answer));
                None
            }
            None => Some(ask),
        }
    }

    /// `asks` as the next round's input requests, under the names their tools gave them or
    /// fresh ones, never two under one key (a request whose params do not fit the MCP schema
    /// is refused on the spot).
    fn take_asks(&mut self, asks: Vec<Ask>) -> InputRequests {
        let mut requests = InputRequests::new();
        let named: std::collections::HashSet<String> =
            asks.iter().filter_map(|a| a.key.clone()).collect();
        for ask in asks {
            self.asked += 1;
            let key = match ask.key {
                Some(k) if !k.is_empty() && !requests.contains_key(&k) => k,
                _ => loop {
                    let k = format!("{}-{}", ask.method.replace('/', "-"), self.asked);
                    if !requests.contains_key(&k) && !named.contains(&k) {
                        break k;
                    }
                    self.asked += 1;
                },
            };
            let wire = match ask.params {
                Some(p) => json!({"method": ask.method, "params": p}),
                None => json!({"method": ask.method, "params": {}}),
            };
            match serde_json::from_value::<InputRequest>(wire) {
                Ok(request) => {
                    requests.insert(key.clone(), request);
                    self.waiting.push((key, ask.method, ask.reply));
                }
                Err(e) => {
                    let _ = ask.reply.send(Err(ChannelError::Invalid(format!(
                        "invalid {} params: {e}",
                        ask.method
                    ))));
                }
            }
        }
        requests
    }
}

/// Refuses `inputResponses` whose values are not objects (each is the client's result for
/// one input request): a protocol error, before any call sees them (SEP-2322).
pub(crate) fn check_responses(responses: Option<&InputResponses>) -> Result<(), ErrorData> {
    for (key, value) in responses.into_iter().flatten() {
        if !value.is_object() {
            return Err(ErrorData::invalid_params(
                format!(
                    "inputResponses.{key} must be an object: the client's result for the input request `{key}` (an ElicitResult, CreateMessageResult or ListRootsResult), not {value}"
                ),
                None,
            ));
        }
    }
    Ok(())
}

/// The client's answer to input request `key` if it is a result of `method`'s type.
fn checked_answer(key: &str, method: &str, answer: Value) -> Result<Value, ChannelError> {
    let fits = match method {
        "sampling/createMessage" => CreateMessageResult::deserialize(&answer).err(),
        "elicitation/create" => ElicitResult::deserialize(&answer).err(),
        _ => ListRootsResult::deserialize(&answer).err(),
    };
    match fits {
        None => Ok(answer),
        Some(e) => Err(ChannelError::Invalid(format!(
            "the client's response to input request `{key}` is not a {method} result: {e}"
        ))),
    }
}

/// The client channel of a 2026-07-28 call whose client declared some of sampling,
/// elicitation and roots: requests become the next `InputRequiredResult`'s input requests.
struct RoundChannel {
    asks: mpsc::UnboundedSender<Ask>,
    current: Arc<Mutex<Arc<dyn ClientChannel>>>,
    features: ClientFeatures,
    missing: Arc<Missing>,
}

impl RoundChannel {
    async fn ask(
        &self,
        method: &'static str,
        key: Option<&str>,
        params: Option<Value>,
    ) -> Result<Value, ChannelError> {
        let (reply, answer) = oneshot::channel();
        self.asks
            .send(Ask {
                method,
                key: key.map(str::to_owned),
                params,
                reply,
            })
            .map_err(|_| ChannelError::Cancelled)?;
        // A dropped reply: the call was cancelled or its client never came back.
        answer.await.unwrap_or(Err(ChannelError::Cancelled))
    }

    /// Checks the capability and the params, then asks.
    async fn send(
        &self,
        key: Option<&str>,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, ChannelError> {
        let request = ClientRequest::parse(method)?;
        if !request.declared(self.features) {
            return Err(self.missing.refuse(request));
        }
        let params = match (request, params) {
            (ClientRequest::CreateMessage, Some(p)) => {
                parse::<CreateMessageRequestParams>(request.method(), &p)?;
                Some(p)
            }
            (ClientRequest::Elicit, Some(p)) => {
                if let Some(refusal) = self.features.elicitation_refusal(&p) {
                    return Err(refusal);
                }
                parse::<ElicitRequestParams>(request.method(), &p)?;
                Some(p)
            }
            // roots/list takes no params.
            (ClientRequest::ListRoots, _) => None,
            (_, p) => p,
        };
        self.ask(request.method(), key, params).await
    }

    fn current(&self) -> Arc<dyn ClientChannel> {
        lock(&self.current).clone()
    }
}

#[async_trait]
impl ClientChannel for RoundChannel {
    fn features(&self) -> ClientFeatures {
        self.features
    }

    async fn create_message(&self, params: Value) -> Result<Value, ChannelError> {
        self.send(None, "sampling/createMessage", Some(params))
            .await
    }

    async fn elicit(&self, params: Value) -> Result<Value, ChannelError> {
        self.send(None, "elicitation/create", Some(params)).await
    }

    async fn list_roots(&self) -> Result<Value, ChannelError> {
        self.send(None, "roots/list", None).await
    }

    async fn request_named(
        &self,
        key: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, ChannelError> {
        self.send(Some(key), method, Some(params)).await
    }

    async fn log(&self, level: LogLevel, logger: Option<&str>, data: Value) {
        self.current().log(level, logger, data).await;
    }

    fn wants_progress(&self) -> bool {
        self.current().wants_progress()
    }

    async fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        self.current().progress(progress, total, message).await;
    }
}

#[cfg(test)]
mod tests;
