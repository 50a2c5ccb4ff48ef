//! `quiver serve --stdio`'s transport: one JSON-RPC message per line on stdin and stdout,
//! like rmcp's own, except that a line the server cannot take is answered instead of
//! dropped:
//!
//! - text that is not JSON gets `-32700` (rmcp ignores it, so a client that sent, say,
//!   `Content-Length` framing waited forever);
//! - JSON that is not a message gets `-32600` or `-32602` naming what is wrong, with the
//!   request's `id` when it can be read (rmcp answered "Invalid request" with no `id` at all);
//! - a line over [`MAX_LINE`] gets `-32600` naming the limit (rmcp dropped it unanswered).
//!
//! A notification the server cannot read is logged, not answered, as JSON-RPC asks.
//!
//! A client that asked for 2025-03-26 in its `initialize` (the one version with JSON-RPC
//! batches, which its servers must accept) may send a batch: an array on one line. Its
//! messages go to the service one by one, and the answers to its requests are written back
//! as one array line once all of them are in (an element that cannot be read is answered
//! in the array too).
//! Closing stdin ends the input; the calls still in flight are cancelled
//! [`STDIN_CLOSED_GRACE`] later (see `McpServer::serve_stdio`).

use std::{
    borrow::Cow,
    collections::{HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use rmcp::{
    model::{ClientJsonRpcMessage, ClientRequest, ServerJsonRpcMessage},
    service::RoleServer,
    transport::Transport,
};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::invalid::{self, Refusal};
use crate::lines::{LineRead, LineReader, LineWriter, MAX_LINE, find_id, message_bytes};
use crate::protocol::Protocol;
use crate::sync::lock;

/// How long calls in flight may still finish after a stdio client closed stdin.
pub(super) const STDIN_CLOSED_GRACE: Duration = Duration::from_secs(2);

/// The transport: `R` is stdin and `W` stdout in the binary, pipes in tests.
pub(super) struct LineTransport<R, W> {
    lines: LineReader<R>,
    write: LineWriter<W>,
    /// Cancelled [`STDIN_CLOSED_GRACE`] after the input ends.
    on_eof: Option<CancellationToken>,
    /// Whether the client asked for 2025-03-26 (`None` until its `initialize` is read).
    batching: Option<bool>,
    /// Messages of a batch not yet handed to the service.
    queued: VecDeque<ClientJsonRpcMessage>,
    /// The batches whose answers are being gathered.
    batches: Arc<Mutex<Vec<Batch>>>,
    /// Whether a request has been handed to the service: until then a notification is
    /// dropped, since rmcp's handshake ends the session on one.
    opened: bool,
    /// Whether an `initialize` has been handed to the service: a later one is refused.
    initialized: bool,
    /// The ids (as JSON text) of the client's requests not answered yet: a request that
    /// reuses one is refused (its answer and the other's could not be told apart, and one
    /// of them was lost).
    in_flight: Arc<Mutex<HashSet<String>>>,
    /// Told of each `tools/call` refused here, before the service: it records the call's
    /// row (every call has one).
    refused: Option<RefusedCalls>,
}

/// What a [`LineTransport`] tells of a `tools/call` it refused, with the refusal.
pub(crate) type RefusedCalls = Arc<dyn Fn(invalid::RefusedCall, &Refusal) + Send + Sync>;

/// A batch whose requests are not all answered yet.
struct Batch {
    /// The ids still to be answered (as JSON text).
    waiting: HashSet<String>,
    answers: Vec<Value>,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Send + Unpin + 'static> LineTransport<R, W> {
    pub(crate) fn new(read: R, write: W, on_eof: CancellationToken) -> Self {
        LineTransport {
            lines: LineReader::new(read, MAX_LINE),
            // Answers that cannot be written end the session at once, as a closed stdin
            // does after its grace: the calls in flight are cancelled, not run for nobody.
            write: LineWriter::new(write, "stdout is closed").on_broken(on_eof.clone()),
            on_eof: Some(on_eof),
            batching: None,
            queued: VecDeque::new(),
            batches: Arc::default(),
            opened: false,
            initialized: false,
            in_flight: Arc::default(),
            refused: None,
        }
    }

    /// Tells `refused` of each `tools/call` refused before the service (see
    /// [`RefusedCalls`]).
    pub(crate) fn with_refused_calls(mut self, refused: RefusedCalls) -> Self {
        self.refused = Some(refused);
        self
    }

    #[cfg(test)]
    fn with_max_line(mut self, max_line: usize) -> Self {
        self.lines = LineReader::new(self.lines.into_inner(), max_line);
        self
    }
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Send + Unpin + 'static> LineTransport<R, W> {
    /// Writes `refusal` as one line, in a task of its own so that a `receive` dropped by
    /// rmcp's service loop cannot cut it in half.
    fn answer(&self, refusal: &Refusal) {
        self.write.spawn(&refusal.to_json());
    }

    /// Tells of the `calls` refused with `refusal` (see [`RefusedCalls`]).
    fn note_refused(
        &self,
        calls: impl IntoIterator<Item = invalid::RefusedCall>,
        refusal: &Refusal,
    ) {
        if let Some(refused) = &self.refused {
            for call in calls {
                refused(call, refusal);
            }
        }
    }

    /// Takes a batch line: its messages queued for the service, its requests awaited.
    fn take_batch(&mut self, items: Vec<Value>) {
        if items.is_empty() {
            self.answer(&Refusal {
                code: invalid::INVALID_REQUEST,
                limit: None,
                message: "Invalid Request: an empty batch (a batch holds at least one message)"
                    .into(),
                id: Value::Null,
            });
            return;
        }
        let mut waiting = HashSet::new();
        // The ids more than one request carries (those refused as malformed too): none of
        // those requests runs.
        let shared = invalid::shared_ids(&items);
        let mut answers = Vec::new();
        for item in items {
            // A reused id is refused in the batch's answer, not in a line of its own beside
            // it (and an earlier request's answer is not taken for it).
            let in_flight = |id: &str| lock(&self.in_flight).contains(id);
            if let Some(refusal) = invalid::refused_in_batch(&item, &shared, in_flight) {
                self.note_refused(invalid::refused_call(&item), &refusal);
                answers.push(refusal.to_json());
                continue;
            }
            match serde_json::from_value::<ClientJsonRpcMessage>(item.clone()) {
                Ok(mut message) => {
                    if let ClientJsonRpcMessage::Request(r) = &message {
                        waiting.insert(id_text(&r.id));
                    }
                    // A list whose cursor is not a string: the handler refuses it (its
                    // answer joins the batch's).
                    if let (ClientJsonRpcMessage::Request(r), Value::Object(raw)) =
                        (&mut message, &item)
                        && let Some((_, why)) = invalid::cursor_problem(raw)
                    {
                        rmcp::model::GetExtensions::extensions_mut(&mut r.request)
                            .insert(invalid::BadCursor(why.into()));
                    }
                    self.queued.push_back(message);
                }
                Err(_) if invalid::is_notification(&item) => {}
                Err(_) => {
                    let refusal = invalid::diagnose(&item, "the batch element");
                    self.note_refused(invalid::refused_call(&item), &refusal);
                    answers.push(refusal.to_json());
                }
            }
        }
        if waiting.is_empty() {
            if !answers.is_empty() {
                self.write.spawn(&Value::Array(answers));
            }
            return;
        }
        lock(&self.batches).push(Batch { waiting, answers });
    }

    /// Looks at a message on its way to the service: a notification before the first
    /// request is dropped (`None`); a cancellation releases a batch from waiting for the
    /// cancelled request's answer, which never comes, and sends the batch's other answers
    /// once they are all in.
    fn admit(&mut self, message: ClientJsonRpcMessage) -> Option<ClientJsonRpcMessage> {
        use rmcp::model::ClientNotification;
        let n = match &message {
            ClientJsonRpcMessage::Notification(n) => n,
            ClientJsonRpcMessage::Request(r) => {
                // rmcp's handshake takes the first `initialize` (a session whose first request
                // is another ends); a later one was answered with another version than the
                // one this transport keeps (batches on or off).
                let initialize = matches!(r.request, ClientRequest::InitializeRequest(_));
                if initialize && self.initialized {
                    tracing::warn!("stdin: a second `initialize` was refused");
                    self.answer(&Refusal {
                        code: invalid::INVALID_REQUEST,
                        limit: None,
                        message: "Invalid Request: this session is already initialized (`initialize` comes once, as the first request); start a new process to negotiate again".into(),
                        id: serde_json::to_value(&r.id).unwrap_or(Value::Null),
                    });
                    return None;
                }
                // Before `initialize`, a request without the 2026-07-28 `_meta` fields is
                // refused here in words that name both ways in (rmcp's own answer names only
                // the `_meta` fields, which a 2025-era client or a piped script never sends),
                // and a `tools/call` so refused has its row.
                use rmcp::model::GetMeta;
                if !self.initialized
                    && !matches!(
                        r.request,
                        ClientRequest::InitializeRequest(_)
                            | ClientRequest::PingRequest(_)
                            | ClientRequest::DiscoverRequest(_)
                    )
                    && r.request.get_meta().protocol_version().is_none()
                {
                    let refusal = Refusal {
                        code: invalid::INVALID_REQUEST,
                        limit: None,
                        message: format!(
                            "Invalid Request: `{}` before the session is initialized: send `initialize` first (then `notifications/initialized`), or, for the 2026-07-28 protocol, give each request the `_meta` fields io.modelcontextprotocol/protocolVersion, io.modelcontextprotocol/clientCapabilities and io.modelcontextprotocol/clientInfo",
                            r.request.method()
                        ),
                        id: serde_json::to_value(&r.id).unwrap_or(Value::Null),
                    };
                    if let Ok(sent) = serde_json::to_value(&message) {
                        self.note_refused(invalid::refused_call(&sent), &refusal);
                    }
                    self.answer(&refusal);
                    return None;
                }
                self.opened = true;
                self.initialized |= initialize;
                let id = id_text(&r.id);
                if !lock(&self.in_flight).insert(id.clone()) {
                    tracing::warn!("stdin: a request reused the id {id} of one in flight");
                    let raw = serde_json::to_value(&r.id).unwrap_or(Value::Null);
                    let refusal = invalid::reused_id(raw, &id, "a request in flight");
                    if let Ok(sent) = serde_json::to_value(&message) {
                        self.note_refused(invalid::refused_call(&sent), &refusal);
                    }
                    self.answer(&refusal);
                    return None;
                }
                return Some(message);
            }
            _ => {
                self.opened = true;
                return Some(message);
            }
        };
        if !self.opened {
            tracing::warn!(
                "stdin: a notification before the first request (`initialize`) was ignored"
            );
            return None;
        }
        if let ClientNotification::CancelledNotification(c) = &n.notification
            && let Some(request_id) = &c.params.request_id
        {
            // A cancelled request is not answered: its id is free again.
            let id = id_text(request_id);
            lock(&self.in_flight).remove(&id);
            let mut batches = lock(&self.batches);
            let mut done = Vec::new();
            batches.retain_mut(|b| {
                if b.waiting.remove(&id) && b.waiting.is_empty() {
                    done.push(std::mem::take(&mut b.answers));
                    return false;
                }
                true
            });
            drop(batches);
            for answers in done.into_iter().filter(|a| !a.is_empty()) {
                self.write.spawn(&Value::Array(answers));
            }
        }
        Some(message)
    }

    fn ended(&mut self) {
        let Some(ct) = self.on_eof.take() else {
            return;
        };
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(STDIN_CLOSED_GRACE) => ct.cancel(),
                () = ct.cancelled() => {}
            }
        });
    }
}

/// A request id as JSON text (`7`, `"a"`), as batches and the ids in flight keep it.
fn id_text(id: &rmcp::model::RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

/// What to do with one line.
enum Verdict {
    Take(Box<ClientJsonRpcMessage>),
    Skip,
    Answer(Refusal),
}

fn judge(line: &[u8]) -> Verdict {
    let line = message_bytes(line);
    if line.is_empty() {
        return Verdict::Skip;
    }
    let err = match serde_json::from_slice::<ClientJsonRpcMessage>(line) {
        Ok(message) => return Verdict::Take(Box::new(message)),
        Err(e) => e,
    };
    let Ok(value) = serde_json::from_slice::<Value>(line) else {
        let mut refusal = invalid::unreadable(line, &err.to_string(), "the line");
        if refusal.code == invalid::PARSE_ERROR {
            refusal.message.push_str(
                "; `quiver serve --stdio` reads one JSON-RPC 2.0 message per line, with no \
                 `Content-Length` header",
            );
        }
        return Verdict::Answer(refusal);
    };
    if invalid::is_notification(&value) {
        // JSON-RPC answers no notification, and rmcp ignores the ones it does not know.
        tracing::debug!("stdin: a notification that cannot be read was ignored");
        return Verdict::Skip;
    }
    Verdict::Answer(invalid::diagnose_sent(line, &value, "the line"))
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn name() -> Cow<'static, str> {
        "stdio".into()
    }

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        use futures::future::Either;
        let answered = match &item {
            ServerJsonRpcMessage::Response(r) => Some(&r.id),
            ServerJsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        if let Some(id) = answered {
            lock(&self.in_flight).remove(&id_text(id));
        }
        // An answer to a batch's request joins the batch's answers; the last one sends them.
        let mut batches = lock(&self.batches);
        if !batches.is_empty()
            && let Ok(value) = serde_json::to_value(&item)
            && (value.get("result").is_some() || value.get("error").is_some())
            && let Some(id) = value.get("id").map(Value::to_string)
            && let Some(at) = batches.iter().position(|b| b.waiting.contains(&id))
        {
            let batch = &mut batches[at];
            batch.waiting.remove(&id);
            batch.answers.push(value);
            if !batch.waiting.is_empty() {
                return Either::Left(std::future::ready(Ok(())));
            }
            let done = batches.remove(at);
            return Either::Right(Either::Left(self.write.send(&Value::Array(done.answers))));
        }
        drop(batches);
        Either::Right(Either::Right(self.write.send(&item)))
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            let message = self.next_message().await?;
            if let Some(message) = self.admit(message) {
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.write.close().await
    }
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// The next message read, from a batch taken earlier or the next line.
    async fn next_message(&mut self) -> Option<ClientJsonRpcMessage> {
        if let Some(message) = self.queued.pop_front() {
            return Some(message);
        }
        loop {
            match self.lines.read_line().await {
                LineRead::Line => {}
                LineRead::Oversized { head, tail } => {
                    let max = self.lines.max_line();
                    tracing::warn!("stdin: a line over {max} bytes was refused");
                    let refusal = Refusal {
                        code: invalid::INVALID_REQUEST,
                        limit: Some(invalid::Limit::Size),
                        message: format!(
                            "Invalid Request: the line is longer than {max} bytes, the most this \
                             server reads as one message; it was not read"
                        ),
                        id: find_id(&head, &tail).unwrap_or(Value::Null),
                    };
                    self.note_refused(invalid::refused_calls_in(&head), &refusal);
                    self.answer(&refusal);
                    continue;
                }
                LineRead::End => {
                    self.ended();
                    return None;
                }
            }
            let line = message_bytes(self.lines.line());
            if self.batching.is_none()
                && let Ok(value) = serde_json::from_slice::<Value>(line)
                && value.get("method").and_then(Value::as_str) == Some("initialize")
            {
                if let Some(problem) = invalid::initialize_problem(&value) {
                    self.answer(&Refusal {
                        code: invalid::INVALID_PARAMS,
                        limit: None,
                        message: problem,
                        id: value.get("id").cloned().unwrap_or(Value::Null),
                    });
                    continue;
                }
                self.batching = Some(
                    value["params"]["protocolVersion"]
                        .as_str()
                        .and_then(Protocol::parse)
                        .is_some_and(Protocol::batches),
                );
            }
            if self.batching == Some(true)
                && line.first() == Some(&b'[')
                && let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(line)
            {
                self.take_batch(items);
                if let Some(message) = self.queued.pop_front() {
                    return Some(message);
                }
                continue;
            }
            let verdict = judge(self.lines.line());
            match verdict {
                // A well-formed list request whose cursor is not a string (rmcp's typed params
                // drop it and would answer the first page): marked for the list handler, as a
                // batch element is; an id in flight is still `admit`'s.
                Verdict::Take(mut message) => {
                    if let ClientJsonRpcMessage::Request(r) = &mut *message
                        && invalid::is_list(r.request.method())
                        && let Ok(raw) = serde_json::from_slice::<serde_json::Map<String, Value>>(
                            message_bytes(self.lines.line()),
                        )
                        && let Some((_, why)) = invalid::cursor_problem(&raw)
                    {
                        rmcp::model::GetExtensions::extensions_mut(&mut r.request)
                            .insert(invalid::BadCursor(why.into()));
                    }
                    return Some(*message);
                }
                Verdict::Skip => {}
                Verdict::Answer(refusal) => {
                    tracing::warn!("stdin: {}", refusal.message);
                    let line = message_bytes(self.lines.line());
                    self.note_refused(invalid::refused_calls_in(line), &refusal);
                    self.answer(&refusal);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
