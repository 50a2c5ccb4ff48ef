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
mod tests {
    use super::*;
    use rmcp::model::ContentBlock as Content;

    /// The notification target of a round: counts log messages.
    #[derive(Default)]
    struct Notes(std::sync::atomic::AtomicUsize);

    #[async_trait]
    impl ClientChannel for Notes {
        fn features(&self) -> ClientFeatures {
            ClientFeatures::default()
        }
        async fn create_message(&self, _: Value) -> Result<Value, ChannelError> {
            unreachable!("requests go through the rounds")
        }
        async fn elicit(&self, _: Value) -> Result<Value, ChannelError> {
            unreachable!("requests go through the rounds")
        }
        async fn list_roots(&self) -> Result<Value, ChannelError> {
            unreachable!("requests go through the rounds")
        }
        async fn log(&self, _: LogLevel, _: Option<&str>, _: Value) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        async fn progress(&self, _: f64, _: Option<f64>, _: Option<String>) {}
    }

    fn text(result: &CallToolResult) -> String {
        serde_json::to_string(&result.content).unwrap()
    }

    /// A call that elicits a name (and logs once before and after), or reports the
    /// channel's refusal as its text.
    fn eliciting(
        features: ClientFeatures,
        notes: Arc<Notes>,
    ) -> (Running, oneshot::Receiver<Option<ChannelError>>) {
        let (seen, seen_rx) = oneshot::channel();
        let run = Rounds::start(
            "greet",
            owner("key-a"),
            features,
            Arc::new(Missing::default()),
            None,
            notes,
            move |channel, cancel| async move {
                channel.log(LogLevel::Info, None, json!("asking")).await;
                let asked = channel.elicit(json!({
                    "message": "name?",
                    "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}
                }));
                let answer = tokio::select! {
                    a = asked => a,
                    _ = cancel.cancelled() => Err(ChannelError::Cancelled),
                };
                channel.log(LogLevel::Info, None, json!("answered")).await;
                let _ = seen.send(answer.as_ref().err().cloned());
                match answer {
                    Ok(v) => CallToolResult::success(vec![Content::text(format!(
                        "hello {}",
                        v["content"]["name"]
                    ))]),
                    Err(e) => CallToolResult::error(vec![Content::text(e.to_string())]),
                }
            },
        );
        (run, seen_rx)
    }

    fn owner(key: &str) -> Owner {
        Owner {
            key: Arc::from(key),
            principal: None,
            tenant: None,
        }
    }

    fn elicit_only() -> ClientFeatures {
        ClientFeatures::new(false, true, false)
    }

    #[tokio::test]
    async fn a_call_that_asks_is_parked_and_resumed_with_the_answer() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let (first, second) = (Arc::new(Notes::default()), Arc::new(Notes::default()));
        let (run, _) = eliciting(elicit_only(), first.clone());
        let ct = CancellationToken::new();
        let CallToolResponse::InputRequired(asked) = rounds.drive(run, &ct, None).await.unwrap()
        else {
            panic!("the call asks its client first");
        };
        let requests = asked.input_requests.expect("input requests");
        assert_eq!(
            requests.keys().collect::<Vec<_>>(),
            ["elicitation-create-1"]
        );
        let wire = serde_json::to_value(&requests["elicitation-create-1"]).unwrap();
        assert_eq!(wire["method"], "elicitation/create");
        assert_eq!(wire["params"]["message"], "name?");
        assert_eq!(rounds.len(), 1);
        let state = asked.request_state.expect("a request state");
        let answers = InputResponses::from([(
            "elicitation-create-1".to_owned(),
            json!({"action": "accept", "content": {"name": "Ada"}}),
        )]);
        let run = rounds
            .resume(
                &state,
                "greet",
                &owner("key-a"),
                Some(answers),
                second.clone(),
            )
            .unwrap();
        let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
            panic!("the answer completes the call");
        };
        assert!(text(&done).contains("hello \\\"Ada\\\""), "{}", text(&done));
        assert_eq!(rounds.len(), 0);
        // Notifications follow the rounds: the first log went to the first request, the
        // second to the retry.
        assert_eq!(first.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(second.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The handle is spent.
        let err = rounds
            .resume(&state, "greet", &owner("key-a"), None, second)
            .err()
            .expect("a spent state is refused");
        assert!(
            err.message
                .contains("does not name a call waiting on this server"),
            "{}",
            err.message
        );
    }

    #[tokio::test]
    async fn a_retry_for_another_tool_or_key_is_refused_and_the_call_kept() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let notes = Arc::new(Notes::default());
        let (run, _) = eliciting(elicit_only(), notes.clone());
        let ct = CancellationToken::new();
        let CallToolResponse::InputRequired(asked) = rounds.drive(run, &ct, None).await.unwrap()
        else {
            panic!("the call asks its client first");
        };
        let state = asked.request_state.unwrap();
        let mut tenant = owner("key-a");
        tenant.tenant = Some(Arc::from("other-tenant"));
        for (tool, who) in [
            ("other", owner("key-a")),
            ("greet", owner("key-b")),
            ("greet", tenant),
        ] {
            let err = rounds
                .resume(&state, tool, &who, None, notes.clone())
                .err()
                .expect("refused");
            assert!(err.message.contains("another call"), "{}", err.message);
        }
        assert_eq!(rounds.len(), 1, "a wrong retry does not end the call");
        // A retry without the answer: the tool's request fails in words, the call ends.
        let run = rounds
            .resume(&state, "greet", &owner("key-a"), None, notes)
            .unwrap();
        let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
            panic!("the call ends");
        };
        assert_eq!(done.is_error, Some(true));
        assert!(
            text(&done).contains("no response for input request `elicitation-create-1`"),
            "{}",
            text(&done)
        );
    }

    /// A tool that asks (without waiting for the answer) and then waits only for its
    /// cancellation: it ends only if the call is cancelled.
    fn asks_then_waits(who: Owner) -> (Running, oneshot::Receiver<&'static str>) {
        let (ended, ended_rx) = oneshot::channel();
        let run = Rounds::start(
            "wait",
            who,
            elicit_only(),
            Arc::new(Missing::default()),
            None,
            Arc::new(Notes::default()),
            move |channel, cancel| async move {
                tokio::spawn(async move {
                    let _ = channel
                        .elicit(json!({"message": "x", "requestedSchema": {"type": "object", "properties": {}}}))
                        .await;
                });
                cancel.cancelled().await;
                let _ = ended.send("cancelled");
                CallToolResult::error(vec![Content::text("cancelled")])
            },
        );
        (run, ended_rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_client_never_comes_back_is_cancelled() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(30)));
        let (run, ended) = asks_then_waits(owner("key-a"));
        let ct = CancellationToken::new();
        assert!(matches!(
            rounds.drive(run, &ct, None).await.unwrap(),
            CallToolResponse::InputRequired(_)
        ));
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert_eq!(rounds.len(), 1, "still waiting before the deadline");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(rounds.len(), 0, "the parked call is dropped");
        assert_eq!(
            ended.await,
            Ok("cancelled"),
            "the call's token was cancelled"
        );
    }

    #[tokio::test]
    async fn one_owner_cannot_park_more_than_its_share() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let ct = CancellationToken::new();
        for _ in 0..MAX_PARKED_PER_OWNER {
            let (run, _) = asks_then_waits(owner("greedy"));
            assert!(matches!(
                rounds.drive(run, &ct, None).await.unwrap(),
                CallToolResponse::InputRequired(_)
            ));
        }
        // The next call of the same owner has its request refused in words (and runs on).
        let (run, seen) = eliciting(elicit_only(), Arc::new(Notes::default()));
        let mut run = run;
        run.owner = owner("greedy");
        let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
            panic!("not parked");
        };
        assert!(
            text(&done).contains("of this client's calls already wait for its input"),
            "{}",
            text(&done)
        );
        assert!(matches!(seen.await, Ok(Some(ChannelError::Unsupported(_)))));
        // Another owner still can.
        let (run, _) = eliciting(elicit_only(), Arc::new(Notes::default()));
        assert!(matches!(
            rounds.drive(run, &ct, None).await.unwrap(),
            CallToolResponse::InputRequired(_)
        ));
        assert_eq!(rounds.len(), MAX_PARKED_PER_OWNER + 1);
    }

    /// A token that varies its working-set key (client-chosen) still has one share.
    #[tokio::test]
    async fn one_token_cannot_park_more_than_its_share_by_varying_keys() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let ct = CancellationToken::new();
        let of = |token: &str, key: String| Owner {
            key: Arc::from(key),
            principal: Some(Arc::from(token)),
            tenant: None,
        };
        for i in 0..MAX_PARKED_PER_TOKEN {
            let (run, _) = asks_then_waits(of("greedy", format!("k{i}")));
            assert!(matches!(
                rounds.drive(run, &ct, None).await.unwrap(),
                CallToolResponse::InputRequired(_)
            ));
        }
        let (mut run, seen) = eliciting(elicit_only(), Arc::new(Notes::default()));
        run.owner = of("greedy", "a-new-key".into());
        let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
            panic!("not parked");
        };
        assert!(
            text(&done).contains("calls of this token already wait for input"),
            "{}",
            text(&done)
        );
        assert!(matches!(seen.await, Ok(Some(ChannelError::Unsupported(_)))));
        // Another token still can.
        let (run, _) = asks_then_waits(of("modest", "k0".into()));
        assert!(matches!(
            rounds.drive(run, &ct, None).await.unwrap(),
            CallToolResponse::InputRequired(_)
        ));
    }

    /// Calls that ended while parked (their own timeout, say) make room for new ones once
    /// they kept their result for a minute.
    #[tokio::test(start_paused = true)]
    async fn ended_parked_calls_make_room() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(600)));
        let ct = CancellationToken::new();
        let ends_soon = || {
            Rounds::start(
                "soon",
                owner("busy"),
                elicit_only(),
                Arc::new(Missing::default()),
                None,
                Arc::new(Notes::default()),
                move |channel, _cancel| async move {
                    tokio::spawn(async move {
                        let _ = channel
                            .elicit(json!({"message": "x", "requestedSchema": {"type": "object", "properties": {}}}))
                            .await;
                    });
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    CallToolResult::error(vec![Content::text("timed out")])
                },
            )
        };
        for _ in 0..MAX_PARKED_PER_OWNER {
            assert!(matches!(
                rounds.drive(ends_soon(), &ct, None).await.unwrap(),
                CallToolResponse::InputRequired(_)
            ));
        }
        // Full, and the calls still run: the next one's request is refused.
        let CallToolResponse::Complete(_) = rounds.drive(ends_soon(), &ct, None).await.unwrap()
        else {
            panic!("refused while the others run");
        };
        tokio::time::sleep(Duration::from_secs(75)).await;
        assert_eq!(
            rounds.len(),
            MAX_PARKED_PER_OWNER,
            "nothing is dropped before it is needed"
        );
        assert!(matches!(
            rounds.drive(ends_soon(), &ct, None).await.unwrap(),
            CallToolResponse::InputRequired(_)
        ));
        assert_eq!(rounds.len(), 1, "the ended ones made room");
    }

    #[tokio::test]
    async fn an_answer_of_the_wrong_shape_is_refused_before_the_tool_sees_it() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let notes = Arc::new(Notes::default());
        let (run, seen) = eliciting(elicit_only(), notes.clone());
        let ct = CancellationToken::new();
        let CallToolResponse::InputRequired(asked) = rounds.drive(run, &ct, None).await.unwrap()
        else {
            panic!("the call asks first");
        };
        let answers = InputResponses::from([(
            "elicitation-create-1".to_owned(),
            json!({"action": "maybe"}),
        )]);
        let run = rounds
            .resume(
                &asked.request_state.unwrap(),
                "greet",
                &owner("key-a"),
                Some(answers),
                notes,
            )
            .unwrap();
        let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
            panic!("the call ends");
        };
        assert!(
            text(&done).contains("is not a elicitation/create result"),
            "{}",
            text(&done)
        );
        assert!(matches!(seen.await, Ok(Some(ChannelError::Invalid(_)))));
    }

    #[tokio::test]
    async fn an_undeclared_capability_is_refused_without_a_round() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let (run, seen) = eliciting(
            ClientFeatures::new(true, false, true),
            Arc::new(Notes::default()),
        );
        // The tool's request is refused at once; the call, failed for want of it, is the
        // -32021 error naming the capability (SEP-2575).
        let err = rounds
            .drive::<CallToolResponse>(run, &CancellationToken::new(), None)
            .await
            .expect_err("a protocol error");
        assert_eq!(
            err.code,
            rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        );
        assert!(err.message.contains("elicitation"), "{}", err.message);
        assert!(
            serde_json::to_string(&err.data)
                .unwrap()
                .contains("elicitation"),
            "{:?}",
            err.data
        );
        assert!(matches!(seen.await, Ok(Some(ChannelError::Unsupported(_)))));
        assert_eq!(rounds.len(), 0);
    }

    /// A tool refused a capability that then fails for another reason keeps its own error.
    #[tokio::test]
    async fn an_unrelated_failure_is_not_a_missing_capability() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let run = Rounds::start(
            "fallback",
            owner("key-a"),
            ClientFeatures::new(false, true, false),
            Arc::new(Missing::default()),
            None,
            Arc::new(Notes::default()),
            move |channel, _cancel| async move {
                let refused = channel
                    .create_message(json!({"messages": [], "maxTokens": 1}))
                    .await;
                assert!(matches!(refused, Err(ChannelError::Unsupported(_))));
                CallToolResult::error(vec![Content::text("the disk is full")])
            },
        );
        let CallToolResponse::Complete(done) = rounds
            .drive(run, &CancellationToken::new(), None)
            .await
            .unwrap()
        else {
            panic!("the tool's own error");
        };
        assert!(text(&done).contains("the disk is full"), "{}", text(&done));
    }

    /// A URL-mode elicitation for a client that declared form mode only is refused without
    /// a round (MCP: servers MUST NOT send an undeclared mode); the tool hears why.
    #[tokio::test]
    async fn an_undeclared_elicitation_mode_is_refused_without_a_round() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let run = Rounds::start(
            "sign-in",
            owner("key-a"),
            elicit_only(),
            Arc::new(Missing::default()),
            None,
            Arc::new(Notes::default()),
            move |channel, _cancel| async move {
                let refused = channel
                    .elicit(json!({"mode": "url", "message": "m", "url": "https://x", "elicitationId": "e"}))
                    .await
                    .expect_err("refused");
                CallToolResult::error(vec![Content::text(refused.to_string())])
            },
        );
        let CallToolResponse::Complete(done) = rounds
            .drive(run, &CancellationToken::new(), None)
            .await
            .unwrap()
        else {
            panic!("no round: the refusal is the call's result");
        };
        assert!(text(&done).contains("in url mode"), "{}", text(&done));
        assert_eq!(rounds.len(), 0);
    }

    /// Requests a tool sends at once share one round, under the names it gave them; a
    /// `roots/list` request carries empty params.
    #[tokio::test]
    async fn concurrent_named_requests_share_one_round() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let run = Rounds::start(
            "three",
            owner("key-a"),
            ClientFeatures::new(true, true, true),
            Arc::new(Missing::default()),
            None,
            Arc::new(Notes::default()),
            move |channel, _cancel| async move {
                let (a, b, c) = tokio::join!(
                    channel.request_named(
                        "user_name",
                        "elicitation/create",
                        json!({"message": "name?", "requestedSchema": {"type": "object", "properties": {}}})
                    ),
                    channel.request_named(
                        "greeting",
                        "sampling/createMessage",
                        json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5})
                    ),
                    channel.request_named("client_roots", "roots/list", json!({})),
                );
                let text = format!(
                    "{} {} {}",
                    a.unwrap()["content"]["name"],
                    b.unwrap()["content"]["text"],
                    c.unwrap()["roots"][0]["uri"]
                );
                CallToolResult::success(vec![Content::text(text)])
            },
        );
        let ct = CancellationToken::new();
        let CallToolResponse::InputRequired(asked) = rounds.drive(run, &ct, None).await.unwrap()
        else {
            panic!("one round");
        };
        let requests = asked.input_requests.unwrap();
        assert_eq!(
            requests.keys().map(String::as_str).collect::<Vec<_>>(),
            ["client_roots", "greeting", "user_name"]
        );
        let roots = serde_json::to_value(&requests["client_roots"]).unwrap();
        assert_eq!(roots["method"], "roots/list");
        let answers = InputResponses::from([
            (
                "user_name".to_owned(),
                json!({"action": "accept", "content": {"name": "Ada"}}),
            ),
            (
                "greeting".to_owned(),
                json!({"role": "assistant", "content": {"type": "text", "text": "hello"}, "model": "m"}),
            ),
            (
                "client_roots".to_owned(),
                json!({"roots": [{"uri": "file:///r"}]}),
            ),
        ]);
        let run = rounds
            .resume(
                &asked.request_state.unwrap(),
                "three",
                &owner("key-a"),
                Some(answers),
                Arc::new(Notes::default()),
            )
            .unwrap();
        let CallToolResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
            panic!("done");
        };
        assert!(
            text(&done).contains(r#"\"Ada\" \"hello\" \"file:///r\""#),
            "{}",
            text(&done)
        );
    }

    /// Answers sent with the first call (the ephemeral style) serve the requests named with
    /// their keys without a round; values that are not objects are refused up front.
    #[tokio::test]
    async fn answers_sent_up_front_need_no_round() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let preset = InputResponses::from([
            (
                "user_name".to_owned(),
                json!({"action": "accept", "content": {"name": "Ada"}}),
            ),
            ("unrelated".to_owned(), json!({"ignored": true})),
        ]);
        assert!(check_responses(Some(&preset)).is_ok());
        let bad = InputResponses::from([("user_name".to_owned(), json!(12345))]);
        let err = check_responses(Some(&bad)).expect_err("refused");
        assert!(
            err.message
                .contains("inputResponses.user_name must be an object"),
            "{}",
            err.message
        );
        let run = Rounds::start(
            "named",
            owner("key-a"),
            elicit_only(),
            Arc::new(Missing::default()),
            Some(preset),
            Arc::new(Notes::default()),
            move |channel, _cancel| async move {
                let a = channel
                    .request_named(
                        "user_name",
                        "elicitation/create",
                        json!({"message": "name?", "requestedSchema": {"type": "object", "properties": {}}}),
                    )
                    .await
                    .unwrap();
                CallToolResult::success(vec![Content::text(format!(
                    "hello {}",
                    a["content"]["name"]
                ))])
            },
        );
        let CallToolResponse::Complete(done) = rounds
            .drive(run, &CancellationToken::new(), None)
            .await
            .unwrap()
        else {
            panic!("no round needed");
        };
        assert!(text(&done).contains("hello \\\"Ada\\\""), "{}", text(&done));
        assert_eq!(rounds.len(), 0);
    }

    #[tokio::test]
    async fn cancelling_a_round_cancels_the_call() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let (started_tx, started) = oneshot::channel::<()>();
        let run = Rounds::start(
            "slow",
            owner("key-a"),
            elicit_only(),
            Arc::new(Missing::default()),
            None,
            Arc::new(Notes::default()),
            move |_channel, cancel| async move {
                let _ = started_tx.send(());
                cancel.cancelled().await;
                CallToolResult::error(vec![Content::text("cancelled")])
            },
        );
        let ct = CancellationToken::new();
        let driving = {
            let (rounds, ct) = (rounds.clone(), ct.clone());
            tokio::spawn(async move { rounds.drive(run, &ct, None).await })
        };
        started.await.unwrap();
        ct.cancel();
        let CallToolResponse::Complete(done) = driving.await.unwrap().unwrap() else {
            panic!("the call ends");
        };
        assert!(text(&done).contains("cancelled"));
    }

    /// A `prompts/get` that elicits its context, as the passthrough runs it: the source's
    /// answer, or its failure as the source reports it (the refusal text inside).
    fn eliciting_prompt(features: ClientFeatures) -> Running {
        Rounds::start(
            Target::prompt("with_context"),
            owner("key-a"),
            features,
            Arc::new(Missing::default()),
            None,
            Arc::new(Notes::default()),
            move |channel, _cancel| async move {
                let asked = channel
                    .elicit(json!({
                        "message": "context?",
                        "requestedSchema": {"type": "object", "properties": {"context": {"type": "string"}}}
                    }))
                    .await;
                match asked {
                    Ok(v) => Ok(GetPromptResult::new(vec![
                        rmcp::model::PromptMessage::new_text(
                            rmcp::model::Role::User,
                            format!("context: {}", v["content"]["context"]),
                        ),
                    ])),
                    Err(e) => Err(ErrorData::invalid_params(
                        format!("MCP server \"docs\": {e}"),
                        None,
                    )),
                }
            },
        )
    }

    #[tokio::test]
    async fn a_prompt_takes_rounds_like_a_tool_and_its_state_is_its_own() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let ct = CancellationToken::new();
        let GetPromptResponse::InputRequired(asked) = rounds
            .drive(eliciting_prompt(elicit_only()), &ct, None)
            .await
            .unwrap()
        else {
            panic!("the prompt asks its client first");
        };
        let state = asked.request_state.expect("a request state");
        let key = asked
            .input_requests
            .expect("input requests")
            .into_keys()
            .next()
            .expect("one");
        let notes: Arc<dyn ClientChannel> = Arc::new(Notes::default());
        // The handle is a prompt's: a tool call of the same name, or another prompt, is refused
        // and the prompt keeps waiting.
        for other in [Target::tool("with_context"), Target::prompt("other")] {
            let err = rounds
                .resume(&state, other, &owner("key-a"), None, notes.clone())
                .err()
                .expect("refused");
            assert!(
                err.message.contains("prompts/get `with_context`"),
                "{}",
                err.message
            );
        }
        assert_eq!(rounds.len(), 1);
        let answers = InputResponses::from([(
            key,
            json!({"action": "accept", "content": {"context": "tests"}}),
        )]);
        let run = rounds
            .resume(
                &state,
                Target::prompt("with_context"),
                &owner("key-a"),
                Some(answers),
                notes,
            )
            .unwrap();
        let GetPromptResponse::Complete(done) = rounds.drive(run, &ct, None).await.unwrap() else {
            panic!("the answer completes the prompt");
        };
        let wire = serde_json::to_value(&done).unwrap();
        assert_eq!(
            wire["messages"][0]["content"]["text"], "context: \"tests\"",
            "{wire}"
        );
        assert_eq!(rounds.len(), 0);
        // A spent handle names what to send again.
        let err = rounds
            .resume(
                &state,
                Target::prompt("with_context"),
                &owner("key-a"),
                None,
                Arc::new(Notes::default()),
            )
            .err()
            .expect("spent");
        assert!(
            err.message
                .contains("Send prompts/get for `with_context` again"),
            "{}",
            err.message
        );
    }

    #[tokio::test]
    async fn a_prompt_refused_an_undeclared_capability_is_the_missing_capability_error() {
        let rounds = Arc::new(Rounds::new(Duration::from_secs(60)));
        let err = rounds
            .drive::<GetPromptResponse>(
                eliciting_prompt(ClientFeatures::new(true, false, false)),
                &CancellationToken::new(),
                None,
            )
            .await
            .expect_err("a protocol error");
        assert_eq!(
            err.code,
            rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        );
        assert!(
            err.message.starts_with("the prompt needs"),
            "{}",
            err.message
        );
        let data = serde_json::to_string(&err.data).unwrap();
        assert!(
            data.contains("elicitation") && data.contains("MCP server \\\"docs\\\""),
            "{data}"
        );
        assert_eq!(rounds.len(), 0);
    }
}
