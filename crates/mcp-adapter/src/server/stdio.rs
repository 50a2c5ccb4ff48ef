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
                        message: "Invalid Request: this session is already initialized (`initialize` comes once, as the first request); start a new process to negotiate again".into(),
                        id: serde_json::to_value(&r.id).unwrap_or(Value::Null),
                    });
                    return None;
                }
                // Before `initialize`, a request without the 2026-07-28 `_meta` fields is
                // refused here in words that name both ways in (rmcp's own answer named only
                // the `_meta` fields, which a 2025-era client or a piped script never sends:
                // QA-14 #3), and a `tools/call` so refused has its row.
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
    Verdict::Answer(invalid::diagnose(&value, "the line"))
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
mod tests {
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    /// A client's `initialize` (id 0) asking for `version`.
    fn initialize(version: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
    }

    /// A transport on pipes: what the client writes, what it reads back, and the token the
    /// end of input cancels.
    fn pipes(
        max_line: usize,
    ) -> (
        LineTransport<tokio::io::DuplexStream, tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        tokio::io::Lines<BufReader<tokio::io::DuplexStream>>,
        CancellationToken,
    ) {
        let (client_in, server_in) = tokio::io::duplex(1 << 16);
        let (server_out, client_out) = tokio::io::duplex(1 << 16);
        let ct = CancellationToken::new();
        let transport =
            LineTransport::new(server_in, server_out, ct.clone()).with_max_line(max_line);
        (transport, client_in, BufReader::new(client_out).lines(), ct)
    }

    async fn answer(out: &mut tokio::io::Lines<BufReader<tokio::io::DuplexStream>>) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(5), out.next_line())
            .await
            .expect("an answer")
            .unwrap()
            .expect("a line");
        serde_json::from_str(&line).unwrap()
    }

    /// Each line the server cannot take is answered (with the request's id when it can be
    /// read), and the next good line is still read. rmcp's own transport ignored the text that
    /// is not JSON, answered the shape errors without an `id`, and dropped an over-long line
    /// unanswered.
    #[tokio::test]
    async fn lines_that_cannot_be_read_are_answered_and_reading_goes_on() {
        let (mut transport, mut input, mut out, _ct) = pipes(4096);
        // A new id each time: the pings are never answered, so an id stays in flight.
        let cases: Vec<(String, i64, &str, Value)> = vec![
            ("hello".into(), -32700, "not valid JSON", Value::Null),
            (
                "Content-Length: 52".into(),
                -32700,
                "no `Content-Length` header",
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#.into(),
                -32600,
                "`jsonrpc` must be \"2.0\"",
                Value::from(5),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":7}"#.into(),
                -32600,
                "`method` must be a string",
                Value::from("a"),
            ),
            (
                r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#.into(),
                -32600,
                "a batch",
                Value::Null,
            ),
            (
                "x".repeat(10_000),
                -32600,
                "longer than 4096 bytes",
                Value::Null,
            ),
            // Valid JSON too deep for the parser: said so, with its id (QA-13 C-4: "not
            // valid JSON", id null).
            (
                format!(
                    r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}1{}}}}}}}"#,
                    "[".repeat(150),
                    "]".repeat(150)
                ),
                -32600,
                "nests arrays and objects more than 128 levels deep",
                Value::from(9),
            ),
            // A lone surrogate: not JSON serde reads, but its id is there.
            (
                r#"{"jsonrpc":"2.0","id":10,"method":"ping","params":{"x":"\ud800"}}"#.into(),
                -32700,
                "not valid JSON",
                Value::from(10),
            ),
        ];
        for (n, (line, code, says, id)) in cases.into_iter().enumerate() {
            let ping = format!(r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#, 42 + n);
            input
                .write_all(format!("{line}\n{ping}\n").as_bytes())
                .await
                .unwrap();
            let taken = transport.receive().await.expect("the ping is read");
            assert_eq!(
                serde_json::to_value(&taken).unwrap()["id"],
                42 + n,
                "after {line:.40}"
            );
            let refusal = answer(&mut out).await;
            assert_eq!(refusal["error"]["code"], code, "{line:.40}: {refusal}");
            assert!(
                refusal["error"]["message"].as_str().unwrap().contains(says),
                "{line:.40}: {refusal}"
            );
            assert_eq!(refusal["id"], id, "{line:.40}: {refusal}");
            assert!(refusal.as_object().unwrap().contains_key("id"), "{refusal}");
        }
    }

    /// Each `tools/call` the transport refuses is told to the hook that records its row (none
    /// had one): a line nested too deeply (its deep part cut), text that is not JSON, a
    /// message that is not JSON-RPC, an id in flight, a batch's shared ids. A refused
    /// message that is no call is not.
    #[tokio::test]
    async fn each_tools_call_refused_here_is_told_for_its_row() {
        let (transport, mut input, mut out, _ct) = pipes(4096);
        let told = Arc::new(Mutex::new(Vec::new()));
        let mut transport = transport.with_refused_calls(Arc::new({
            let told = told.clone();
            move |call: invalid::RefusedCall, refusal: &Refusal| {
                let input = match crate::lines::holds_cut(&call.input) {
                    true => json!("cut"),
                    false => call.input,
                };
                lock(&told).push((call.name, input, refusal.kind()));
            }
        }));
        let init = initialize("2025-03-26");
        input
            .write_all(format!("{init}\n").as_bytes())
            .await
            .unwrap();
        transport.receive().await.expect("the initialize is read");
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let lines = [
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"x":{deep}}}}}}}"#
            ),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo""#.into(),
            r#"{"jsonrpc":"1.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"y":3}}}"#.into(),
            r#"{"jsonrpc":"1.0","id":4,"method":"ping"}"#.into(),
            json!([
                {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"a": 1}}},
                {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                    "params": {"name": "other", "arguments": {"b": 2}}},
            ])
            .to_string(),
            // In flight from here (never answered), then sent again.
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"slow","arguments":{}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"z":6}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#.into(),
        ];
        input
            .write_all(format!("{}\n", lines.join("\n")).as_bytes())
            .await
            .unwrap();
        for id in [6, 7] {
            let taken = transport.receive().await.expect("a request is read");
            assert_eq!(serde_json::to_value(&taken).unwrap()["id"], id);
        }
        // Five refusals written: three lines, the batch's answer, the reused id.
        for _ in 0..5 {
            answer(&mut out).await;
        }
        let told = lock(&told).clone();
        assert_eq!(
            told,
            vec![
                ("echo".to_owned(), json!("cut"), "too_deep"),
                ("(unreadable)".to_owned(), Value::Null, "parse_error"),
                ("echo".to_owned(), json!({"y": 3}), "invalid_request"),
                ("echo".to_owned(), json!({"a": 1}), "invalid_request"),
                ("other".to_owned(), json!({"b": 2}), "invalid_request"),
                ("echo".to_owned(), json!({"z": 6}), "invalid_request"),
            ]
        );
    }

    /// A request before `initialize` without the 2026-07-28 `_meta` fields is told both
    /// ways in (rmcp named only the `_meta` fields), a `tools/call` so refused is told for
    /// its row; a ping passes, and so does a 2026-07-28 request with its `_meta`.
    #[tokio::test]
    async fn a_request_before_initialize_is_told_to_initialize() {
        let (transport, mut input, mut out, _ct) = pipes(4096);
        let told = Arc::new(Mutex::new(Vec::new()));
        let mut transport = transport.with_refused_calls(Arc::new({
            let told = told.clone();
            move |call: invalid::RefusedCall, refusal: &Refusal| {
                lock(&told).push((call.name, refusal.kind()));
            }
        }));
        let lines = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "tool_search", "arguments": {"query": "weather"}}}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}),
        ];
        for line in &lines {
            input
                .write_all(format!("{line}\n").as_bytes())
                .await
                .unwrap();
        }
        for id in [2, 3] {
            let taken = transport.receive().await.expect("a request is read");
            assert_eq!(serde_json::to_value(&taken).unwrap()["id"], id);
        }
        let refusal = answer(&mut out).await;
        assert_eq!(refusal["id"], 1, "{refusal}");
        assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
        assert!(
            refusal["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("Invalid Request: `tools/call` before the session is initialized: send `initialize` first"),
            "{refusal}"
        );
        assert_eq!(
            *lock(&told),
            [("tool_search".to_owned(), "invalid_request")]
        );
    }

    /// Blank lines, a byte-order mark and CRLF get no answer: the next message is read.
    #[tokio::test]
    async fn blank_lines_a_bom_and_crlf_are_not_answered() {
        let (mut transport, mut input, mut out, _ct) = pipes(4096);
        input
            .write_all(
                concat!(
                    "\n   \r\n\u{feff}",
                    r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
                    "\r\n",
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let taken = transport.receive().await.expect("the ping is read");
        assert_eq!(serde_json::to_value(&taken).unwrap()["id"], 1);
        // Nothing was written: the next line out is the one this test sends now.
        transport
            .send(ServerJsonRpcMessage::error(
                rmcp::model::ErrorData::internal_error("marker", None),
                Some(rmcp::model::NumberOrString::Number(9)),
            ))
            .await
            .unwrap();
        assert_eq!(answer(&mut out).await["id"], 9);
    }

    /// A client that asked for 2025-03-26 may send a batch: its messages are taken one by
    /// one, and the answers to its requests go back as one array line once all are in, with
    /// the answer to an element that cannot be read. An empty batch is one -32600.
    #[tokio::test]
    async fn a_batch_of_a_2025_03_26_client_is_answered_in_one_line() {
        let (mut transport, mut input, mut out, _ct) = pipes(4096);
        let init = initialize("2025-03-26");
        let batch = json!([
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": "two", "method": "ping"},
            {"jsonrpc": "1.0", "id": 3, "method": "ping"},
            {"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}},
            {"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": [1]},
            {"jsonrpc": "2.0", "id": 12, "method": "ping"},
            {"jsonrpc": "2.0", "id": 13, "method": "initialize"},
        ]);
        input
            .write_all(format!("{init}\n[]\n{batch}\n").as_bytes())
            .await
            .unwrap();
        let mut taken = Vec::new();
        for _ in 0..4 {
            let m = transport.receive().await.expect("a message");
            taken.push(serde_json::to_value(&m).unwrap());
        }
        assert_eq!(taken[0]["method"], "initialize");
        assert_eq!(
            taken[1..]
                .iter()
                .map(|m| m["id"].clone())
                .collect::<Vec<_>>(),
            [json!(1), Value::Null, json!("two")]
        );
        // The empty batch is refused at once.
        let empty = answer(&mut out).await;
        assert_eq!(empty["error"]["code"], -32600, "{empty}");
        assert!(
            empty["error"]["message"]
                .as_str()
                .unwrap()
                .contains("an empty batch")
        );
        let reply = |id: Value| {
            serde_json::from_value::<ServerJsonRpcMessage>(
                json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            )
            .unwrap()
        };
        // One answer in: nothing written yet; the last one sends the array.
        transport.send(reply(json!("two"))).await.unwrap();
        transport.send(reply(json!(1))).await.unwrap();
        let answers = answer(&mut out).await;
        let answers = answers.as_array().expect("one array line");
        let mut ids: Vec<String> = answers.iter().map(|a| a["id"].to_string()).collect();
        ids.sort();
        assert_eq!(
            ids,
            ["\"two\"", "1", "12", "12", "13", "3", "4"],
            "{answers:?}"
        );
        // A malformed request still holds its id: neither it nor the ping sharing it runs
        // (the ping was answered too, with the same id as the refusal).
        let twelve: Vec<&str> = answers
            .iter()
            .filter(|a| a["id"] == 12)
            .map(|a| a["error"]["message"].as_str().unwrap_or("a result"))
            .collect();
        assert_eq!(
            twelve,
            ["Invalid Request: 2 requests of this batch carry the id 12, and none of them was run; give each request its own id";
                2],
            "{twelve:?}"
        );
        // An `initialize` without params is refused as one, not as malformed.
        let thirteen = answers.iter().find(|a| a["id"] == 13).unwrap();
        assert!(
            thirteen["error"]["message"]
                .as_str()
                .unwrap()
                .contains("an `initialize` must not be part of a batch"),
            "{thirteen}"
        );
        let bad = answers.iter().find(|a| a["id"] == 3).unwrap();
        assert_eq!(bad["error"]["code"], -32600, "{bad}");
        // An `initialize` must not be part of a batch (it was answered, claiming 2025-06-18
        // while batches were still taken).
        let init = answers.iter().find(|a| a["id"] == 4).unwrap();
        assert_eq!(
            init["error"]["message"],
            "Invalid Request: an `initialize` must not be part of a batch; send it alone, as the session's first message",
            "{init}"
        );
        // An answer outside any batch goes out alone, as before.
        transport.send(reply(json!(7))).await.unwrap();
        assert_eq!(answer(&mut out).await["id"], 7);
    }

    /// A cancelled request of a batch is not waited for: the batch's other answers go out
    /// once they are in (it waited for an answer a cancelled request never gets).
    #[tokio::test]
    async fn a_cancelled_request_does_not_hold_its_batch() {
        let (mut transport, mut input, mut out, _ct) = pipes(4096);
        let init = initialize("2025-03-26");
        let batch = json!([
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "slow"}},
            {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        ]);
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 1}});
        input
            .write_all(format!("{init}\n{batch}\n{cancel}\n").as_bytes())
            .await
            .unwrap();
        for _ in 0..4 {
            transport.receive().await.expect("a message");
        }
        let reply = serde_json::from_value::<ServerJsonRpcMessage>(
            json!({"jsonrpc": "2.0", "id": 2, "result": {}}),
        )
        .unwrap();
        transport.send(reply).await.unwrap();
        let answers = answer(&mut out).await;
        assert_eq!(answers, json!([{"jsonrpc": "2.0", "id": 2, "result": {}}]));
    }

    /// Batched requests that share an id are all refused inside the batch's array, none of
    /// them run (QA-13 C-9: the first ran, and the array held a result and an error under
    /// its id); one reusing the id of a request in flight from an earlier line is refused
    /// there too. The refusals were a line of their own beside the array, and the earlier
    /// request's answer could be taken into the batch.
    #[tokio::test]
    async fn a_batch_reusing_an_id_is_refused_inside_its_answer() {
        let (mut transport, mut input, mut out, _ct) = pipes(4096);
        let init = initialize("2025-03-26");
        let alone =
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "slow"}});
        let batch = json!([
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "slow"}},
            {"jsonrpc": "2.0", "id": 5, "method": "ping"},
            {"jsonrpc": "2.0", "id": 9, "method": "ping"},
            {"jsonrpc": "2.0", "id": 6, "method": "ping"},
            {"jsonrpc": "2.0", "id": 6.0, "method": "ping"},
            {"jsonrpc": "2.0", "id": 8, "method": "ping"},
        ]);
        // Every request of it refused: answered at once (the ping after it is read once it
        // has been).
        let refused = json!([{"jsonrpc": "2.0", "id": 9.0, "method": "ping"}]);
        let ping = json!({"jsonrpc": "2.0", "id": 11, "method": "ping"});
        input
            .write_all(format!("{init}\n{alone}\n{batch}\n{refused}\n{ping}\n").as_bytes())
            .await
            .unwrap();
        let mut taken = Vec::new();
        for _ in 0..4 {
            let m = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
            taken.push((m["id"].clone(), m["method"].clone()));
        }
        assert_eq!(
            taken[1..],
            [
                (json!(9), json!("tools/call")),
                (json!(8), json!("ping")),
                (json!(11), json!("ping")),
            ]
        );
        let reply = |id: u64| {
            serde_json::from_value::<ServerJsonRpcMessage>(
                json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            )
            .unwrap()
        };
        // The batch whose every request is refused is answered at once, in an array.
        let all_refused = answer(&mut out).await;
        assert_eq!(
            (
                all_refused[0]["id"].clone(),
                all_refused[0]["error"]["code"].clone(),
                all_refused.as_array().map(Vec::len)
            ),
            (json!(9.0), json!(-32600), Some(1)),
            "{all_refused}"
        );
        transport.send(reply(8)).await.unwrap();
        // Then the first batch's array: its five refusals and the one that ran.
        let answers = answer(&mut out).await;
        let answers = answers.as_array().expect("the batch's array");
        assert_eq!(answers.len(), 6, "{answers:?}");
        let refusals: Vec<(Value, &str)> = answers
            .iter()
            .filter(|a| a["error"]["code"] == -32600)
            .map(|a| (a["id"].clone(), a["error"]["message"].as_str().unwrap()))
            .collect();
        let shared = |id: u64| {
            format!(
                "Invalid Request: 2 requests of this batch carry the id {id}, and none of them was run; give each request its own id"
            )
        };
        let (five, six) = (shared(5), shared(6));
        assert_eq!(
            refusals,
            [
                (json!(5), five.as_str()),
                (json!(5), five.as_str()),
                (
                    json!(9),
                    "Invalid Request: the id 9 is already used by a request in flight; give each request its own id"
                ),
                (json!(6), six.as_str()),
                (json!(6.0), six.as_str()),
            ],
            "{answers:?}"
        );
        let results: Vec<&Value> = answers
            .iter()
            .filter(|a| a.get("result").is_some())
            .map(|a| &a["id"])
            .collect();
        assert_eq!(results, [&json!(8)], "{answers:?}");
        // The request in flight from the earlier line is answered alone, not into a batch.
        transport.send(reply(9)).await.unwrap();
        assert_eq!(
            answer(&mut out).await,
            json!({"jsonrpc": "2.0", "id": 9, "result": {}})
        );
    }

    /// A malformed `initialize` is told what an `initialize` needs (rmcp read it as a 2026
    /// request and asked for `_meta` fields), and a good one after it opens the session.
    #[tokio::test]
    async fn a_malformed_initialize_is_told_what_it_needs() {
        let (mut transport, mut input, mut out, _ct) = pipes(4096);
        let bad = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 20250618, "capabilities": {}}});
        let good = json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        input
            .write_all(format!("{bad}\n{good}\n").as_bytes())
            .await
            .unwrap();
        let taken = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        assert_eq!(taken["id"], 2, "{taken}");
        let refusal = answer(&mut out).await;
        assert_eq!(refusal["id"], 1, "{refusal}");
        assert_eq!(refusal["error"]["code"], -32602, "{refusal}");
        assert!(
            refusal["error"]["message"].as_str().unwrap().starts_with(
                "Invalid params: an `initialize` needs `params` with `protocolVersion`"
            ),
            "{refusal}"
        );
    }

    /// A request that reuses the id of one in flight is refused (one of the two answers was
    /// lost); once the first is answered, or cancelled, its id may be used again.
    #[tokio::test]
    async fn a_request_reusing_an_id_in_flight_is_refused() {
        let (mut transport, mut input, mut out, _ct) = pipes(4096);
        let init = initialize("2025-11-25");
        input
            .write_all(format!("{init}\n").as_bytes())
            .await
            .unwrap();
        transport.receive().await.expect("the initialize is read");
        let call =
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "slow"}});
        let ping = |id: u64| json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        input
            .write_all(format!("{call}\n{}\n{}\n", ping(3), ping(4)).as_bytes())
            .await
            .unwrap();
        let first = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        assert_eq!(first["method"], "tools/call");
        // The second 3 is refused; the 4 after it is taken.
        let next = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        assert_eq!(next["id"], 4, "{next}");
        let refusal = answer(&mut out).await;
        assert_eq!(refusal["id"], 3, "{refusal}");
        assert!(
            refusal["error"]["message"]
                .as_str()
                .unwrap()
                .contains("the id 3 is already used by a request in flight"),
            "{refusal}"
        );
        // Answered: the id is free again.
        let reply = serde_json::from_value::<ServerJsonRpcMessage>(
            json!({"jsonrpc": "2.0", "id": 3, "result": {}}),
        )
        .unwrap();
        transport.send(reply).await.unwrap();
        assert_eq!(answer(&mut out).await["id"], 3);
        input
            .write_all(format!("{}\n", ping(3)).as_bytes())
            .await
            .unwrap();
        let again = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        assert_eq!(
            (again["id"].clone(), again["method"].clone()),
            (json!(3), json!("ping"))
        );
    }

    /// A second `initialize` is refused: it was answered, claiming the version it asked for,
    /// while the transport kept the first one's (batches on or off).
    #[tokio::test]
    async fn a_second_initialize_is_refused() {
        let (mut transport, mut input, mut out, _ct) = pipes(4096);
        let init = |id: u64, version: &str| {
            json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}})
        };
        let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
        input
            .write_all(
                format!(
                    "{}\n{}\n{ping}\n",
                    init(1, "2025-06-18"),
                    init(2, "2025-03-26")
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let first = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        assert_eq!(first["id"], 1, "{first}");
        let next = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        assert_eq!(next["id"], 3, "{next}");
        let refusal = answer(&mut out).await;
        assert_eq!(
            (refusal["id"].clone(), refusal["error"]["code"].clone()),
            (json!(2), json!(-32600)),
            "{refusal}"
        );
        assert!(
            refusal["error"]["message"]
                .as_str()
                .unwrap()
                .contains("this session is already initialized"),
            "{refusal}"
        );
    }

    /// A notification before the first request is dropped: rmcp's handshake ends the
    /// session on one, so the `initialize` after it was never answered.
    #[tokio::test]
    async fn a_notification_before_initialize_is_dropped() {
        let (mut transport, mut input, _out, _ct) = pipes(4096);
        let early = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let init = initialize("2025-11-25");
        input
            .write_all(format!("{early}\n{init}\n{early}\n").as_bytes())
            .await
            .unwrap();
        let first = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        assert_eq!(first["method"], "initialize", "{first}");
        // After the first request, notifications pass.
        let next = serde_json::to_value(transport.receive().await.unwrap()).unwrap();
        assert_eq!(next["method"], "notifications/initialized", "{next}");
    }

    /// The end of input ends `receive` and cancels the calls still in flight after the grace.
    #[tokio::test(start_paused = true)]
    async fn the_end_of_input_cancels_after_the_grace() {
        let (mut transport, input, _out, ct) = pipes(4096);
        drop(input);
        assert!(transport.receive().await.is_none());
        assert!(!ct.is_cancelled());
        tokio::time::sleep(STDIN_CLOSED_GRACE + Duration::from_millis(10)).await;
        assert!(ct.is_cancelled());
    }
}
