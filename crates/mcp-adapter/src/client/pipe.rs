//! The transport on a stdio upstream's pipes: one JSON-RPC message per line, as rmcp's own,
//! except that an answer Quiver cannot read fails its call at once instead of vanishing
//! (rmcp drops such a line, and the call waited out its timeout, reported as "did not
//! finish" although the server had answered):
//!
//! - a line over [`MAX_LINE`], or one that is not valid JSON-RPC (an error without its
//!   `message`, text that is not valid UTF-8), becomes an error answer to the request whose
//!   `id` it carries, saying the server answered and why its answer cannot be read;
//! - a request from the server that cannot be read is answered `-32600`;
//! - what has no `id` (a log line on stdout, a notification Quiver does not know) is
//!   skipped, as rmcp does, and logged.

use std::{borrow::Cow, sync::Arc};

use rmcp::{
    model::{ClientJsonRpcMessage, ErrorCode, ErrorData, RequestId, ServerJsonRpcMessage},
    service::RoleClient,
    transport::Transport,
};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};

use super::delivery::Written;
use crate::lines::{LineRead, LineReader, LineWriter, MAX_LINE, find_id, message_bytes};

/// The code of the error answer that stands for an answer that could not be read (in the
/// JSON-RPC range left to implementations): its message says so, with why.
pub(crate) const UNREADABLE_ANSWER: i32 = -32090;

/// The transport: `R` is the child's stdout, `W` its stdin.
pub(crate) struct PipeTransport<R, W> {
    server: Arc<str>,
    lines: LineReader<R>,
    write: LineWriter<W>,
    /// Answers seen whose id is a request's number written as a string (`"675"` for 675).
    stringified_ids: u64,
    /// Where a request's write is marked as begun, once its line has the pipe.
    written: Option<Written>,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Send + Unpin + 'static> PipeTransport<R, W> {
    pub(crate) fn new(server: &str, read: R, write: W) -> Self {
        PipeTransport {
            server: server.into(),
            lines: LineReader::new(read, MAX_LINE),
            write: LineWriter::new(write, "the server's stdin is closed"),
            stringified_ids: 0,
            written: None,
        }
    }

    /// Marks in `written` each request whose line has begun to go out (see [`Tracked`]).
    pub(crate) fn marking(mut self, written: Written) -> Self {
        self.written = Some(written);
        self
    }

    /// Warns (once per connection) of an answer whose id is a number written as a string.
    /// Quiver's requests on a pipe have numeric ids, so under JSON-RPC such an answer
    /// answers nothing; rmcp takes it as the answer to the request with that number, for
    /// servers that echo ids as text. Kept: the answer comes from this server on its own
    /// pipe, and failing it would break calls that work. The operator is told.
    fn note_stringified_id(&mut self, message: &ServerJsonRpcMessage) {
        let id = match message {
            ServerJsonRpcMessage::Response(r) => Some(&r.id),
            ServerJsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        let Some(RequestId::String(text)) = id else {
            return;
        };
        let Ok(number) = text.parse::<i64>() else {
            return;
        };
        self.stringified_ids += 1;
        if self.stringified_ids == 1 {
            tracing::warn!(server = %self.server, "{}", stringified_id_warning(number, text));
        }
    }

    #[cfg(test)]
    fn with_max_line(mut self, max_line: usize) -> Self {
        self.lines = LineReader::new(self.lines.into_inner(), max_line);
        self
    }
}

/// The operator's warning about an answer whose id is `text`, a string that reads as the
/// request number `number`.
fn stringified_id_warning(number: i64, text: &str) -> String {
    format!(
        "the server answered with the id \"{text}\", a string, where JSON-RPC asks for the id as it was sent (a number): taken as the answer to request {number} if one is waiting, as rmcp does for any string that reads as a number; the server should echo ids unchanged (said once per connection)"
    )
}

/// What to do with one line (or one SSE event's data).
pub(crate) enum Verdict {
    Take(Box<ServerJsonRpcMessage>),
    /// A `tools/list` answer read with its too-deep values cut ([`deep_tools_page`]).
    Cut(Box<ServerJsonRpcMessage>),
    Skip,
    /// The server's answer to this request cannot be read: fail the request with `why`.
    Unreadable(RequestId, String),
    /// The server's request cannot be read: answer it with an error.
    Refuse(Value, String),
}

/// The error answer that fails request `id` of `server`'s: the server answered, and its
/// answer cannot be read, because of `why`.
pub(crate) fn unreadable_answer(server: &str, id: RequestId, why: &str) -> ServerJsonRpcMessage {
    tracing::warn!(server, "an answer that cannot be read: {why}");
    ServerJsonRpcMessage::error(
        ErrorData::new(
            ErrorCode(UNREADABLE_ANSWER),
            format!("MCP server \"{server}\" answered, but its answer cannot be read ({why})"),
            None,
        ),
        Some(id),
    )
}

fn request_id(id: Value) -> Option<RequestId> {
    match id {
        Value::Number(n) => n.as_i64().map(RequestId::Number),
        Value::String(s) => Some(RequestId::String(s.into())),
        _ => None,
    }
}

pub(crate) fn judge(line: &[u8]) -> Verdict {
    let bytes = message_bytes(line);
    if bytes.is_empty() {
        return Verdict::Skip;
    }
    if let Some(message) = with_task_support(bytes) {
        return Verdict::Take(Box::new(message));
    }
    let err = match serde_json::from_slice::<ServerJsonRpcMessage>(bytes) {
        Ok(message) => return Verdict::Take(Box::new(message)),
        Err(e) => e,
    };
    if let Some(message) = deep_tools_page(bytes, &err) {
        return Verdict::Cut(Box::new(message));
    }
    let (id, is_request, why) = match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => (
            value.get("id").cloned(),
            value.get("method").is_some_and(Value::is_string),
            response_problem(&value).unwrap_or_else(|| err.to_string()),
        ),
        // Not JSON at all (a log line), or JSON with a flaw (text that is not UTF-8, a
        // lone surrogate): the id from its first bytes, if it is a message at all.
        Err(_) => (find_id(bytes, b""), false, err.to_string()),
    };
    match id {
        Some(id) if is_request => Verdict::Refuse(id, why),
        Some(id) => match request_id(id) {
            Some(id) => Verdict::Unreadable(id, why),
            None => Verdict::Skip,
        },
        None => Verdict::Skip,
    }
}

/// Where a tool's `execution.taskSupport` is kept through rmcp's reading, which has no
/// field for it: in the tool's `_meta`, under this key.
pub(crate) const TASK_SUPPORT: &str = "quiver/taskSupport";

/// A `tools/list` answer whose tools say how they run as MCP tasks
/// (`execution.taskSupport`), read with each tool's value copied into its `_meta` under
/// [`TASK_SUPPORT`], so that the listing can leave out the tools that run only as a task.
/// `None` for any other line (most never hold the word, and are not parsed twice).
fn with_task_support(bytes: &[u8]) -> Option<ServerJsonRpcMessage> {
    memchr::memmem::find(bytes, b"\"taskSupport\"")?;
    let mut value: Value = serde_json::from_slice(bytes).ok()?;
    let tools = value.get_mut("result")?.get_mut("tools")?.as_array_mut()?;
    for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
        let Some(support) = tool
            .get("execution")
            .and_then(|e| e.get("taskSupport"))
            .cloned()
        else {
            continue;
        };
        match tool
            .entry("_meta")
            .or_insert_with(|| Value::Object(Default::default()))
        {
            Value::Object(meta) => {
                meta.insert(TASK_SUPPORT.into(), support);
            }
            _ => continue,
        }
    }
    serde_json::from_value(value).ok()
}

/// A `tools/list` answer past the JSON parser's depth limit because of some tools'
/// definitions (a schema nested 62 levels): read with the too-deep values cut, so that
/// those tools are skipped as malformed and the rest served, rather than the whole server
/// failing to connect. Only a page whose every cut is inside a tool: any other answer
/// cut short would be data changed, and stays unreadable.
fn deep_tools_page(bytes: &[u8], err: &serde_json::Error) -> Option<ServerJsonRpcMessage> {
    if !err.to_string().starts_with("recursion limit exceeded") {
        return None;
    }
    let cut = crate::lines::pruned(bytes, crate::lines::KEPT_DEPTH)?;
    let mut value: Value = serde_json::from_slice(&cut).ok()?;
    let tools = value.get_mut("result")?.get_mut("tools")?.take();
    if !tools.is_array() || crate::lines::holds_cut(&value) {
        return None;
    }
    value["result"]["tools"] = tools;
    serde_json::from_value(value).ok()
}

/// MCP's "URL elicitation required" error: the user must open a URL before the request
/// can succeed (`data.elicitations`).
const URL_ELICITATION_REQUIRED: i64 = -32042;

/// The most of an upstream error's `data` passed on, as JSON text, in characters.
const ERROR_DATA_CHARS: usize = 1_000;

/// The words of an upstream's JSON-RPC error for the model: its message, then what its
/// `data` holds (where servers put the actionable part: a hint, the offending path). A
/// URL elicitation (-32042) names each URL the user must open, and says to call again
/// after; a client that handles such errors itself is not in between, since Quiver answers
/// the call as a tool error.
pub(crate) fn peer_error_text(code: i64, message: &str, data: Option<&Value>) -> String {
    let data = data.filter(|d| !d.is_null());
    if code == URL_ELICITATION_REQUIRED
        && let Some(urls) = data
            .and_then(|d| d.get("elicitations"))
            .and_then(Value::as_array)
    {
        let asks: Vec<String> = urls
            .iter()
            .filter_map(|e| {
                let url = e.get("url")?.as_str()?;
                let why = e.get("message").and_then(Value::as_str).unwrap_or_default();
                Some(if why.is_empty() {
                    format!("<{url}>")
                } else {
                    format!("<{url}> ({why})")
                })
            })
            .collect();
        if !asks.is_empty() {
            return format!(
                "{message} The user must open {} in a browser to continue; once they have, call the tool again.",
                asks.join(" and ")
            );
        }
    }
    match data {
        None => message.to_owned(),
        Some(d) => {
            let text = d.to_string();
            let text = if text.chars().count() > ERROR_DATA_CHARS {
                let cut: String = text.chars().take(ERROR_DATA_CHARS).collect();
                format!("{cut} …[cut]")
            } else {
                text
            };
            format!("{message} (details: {text})")
        }
    }
}

/// What makes a JSON answer not a JSON-RPC 2.0 response, in words (serde's own says only
/// "unrecognized JSON-RPC message").
fn response_problem(value: &Value) -> Option<String> {
    let error = value.get("error");
    let problem = if value.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        "`jsonrpc` must be \"2.0\""
    } else if error.is_some() && value.get("result").is_some() {
        "it has both `result` and `error`"
    } else if let Some(error) = error {
        if !error.is_object() {
            "`error` must be an object"
        } else if !error.get("code").is_some_and(|c| c.is_i64()) {
            "`error.code` must be an integer"
        } else if !error.get("message").is_some_and(Value::is_string) {
            "`error.message` must be a string"
        } else {
            return None;
        }
    } else if value.get("result").is_none() {
        "it has neither `result` nor `error`"
    } else {
        return None;
    };
    Some(problem.to_owned())
}

impl<R, W> PipeTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// The error answer that fails request `id`: the server answered, and its answer
    /// cannot be read.
    fn unreadable(&self, id: RequestId, why: &str) -> ServerJsonRpcMessage {
        unreadable_answer(&self.server, id, why)
    }

    /// Answers a request of the server's that cannot be read, in a task of its own (a
    /// `receive` dropped by rmcp's loop must not cut the line).
    fn refuse(&self, id: Value, why: &str) {
        tracing::warn!(server = %self.server, "a request that cannot be read: {why}");
        self.write.spawn(&serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32600, "message": format!("Invalid Request: {why}")},
        }));
    }
}

impl<R, W> Transport<RoleClient> for PipeTransport<R, W>
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
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let mark = match (&item, &self.written) {
            (rmcp::model::JsonRpcMessage::Request(r), Some(written)) => {
                Some((written.clone(), r.id.clone()))
            }
            _ => None,
        };
        self.write.send_marked(&item, move || {
            if let Some((written, id)) = mark {
                written.sending(id);
            }
        })
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            match self.lines.read_line().await {
                LineRead::Line => {}
                LineRead::Oversized { head, tail } => {
                    let why = format!(
                        "it is a line longer than {} bytes, the most Quiver reads as one message",
                        self.lines.max_line()
                    );
                    match find_id(&head, &tail).and_then(request_id) {
                        Some(id) => return Some(self.unreadable(id, &why)),
                        None => {
                            tracing::warn!(server = %self.server, "skipped a message: {why}");
                            continue;
                        }
                    }
                }
                LineRead::End => return None,
            }
            match judge(self.lines.line()) {
                Verdict::Take(message) | Verdict::Cut(message) => {
                    self.note_stringified_id(&message);
                    return Some(*message);
                }
                Verdict::Skip => {
                    tracing::debug!(
                        server = %self.server,
                        "skipped a stdout line that is not a message Quiver reads: {}",
                        String::from_utf8_lossy(&self.lines.line()[..self.lines.line().len().min(200)])
                    );
                }
                Verdict::Unreadable(id, why) => return Some(self.unreadable(id, &why)),
                Verdict::Refuse(id, why) => self.refuse(id, &why),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let _ = self.write.close().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tools_task_support_is_kept_through_rmcp_in_its_meta() {
        let line = br#"{"jsonrpc":"2.0","id":3,"result":{"tools":[
            {"name":"research","inputSchema":{"type":"object"},"execution":{"taskSupport":"required"}},
            {"name":"echo","inputSchema":{"type":"object"},"_meta":{"x":1}}]}}"#;
        let line: Vec<u8> = line.iter().copied().filter(|b| *b != b'\n').collect();
        let Verdict::Take(message) = judge(&line) else {
            panic!("a tools/list answer is taken");
        };
        let value = serde_json::to_value(&*message).unwrap();
        let tools = &value["result"]["tools"];
        assert_eq!(tools[0]["_meta"][TASK_SUPPORT], "required", "{value}");
        assert_eq!(tools[1]["_meta"], serde_json::json!({"x": 1}), "{value}");
    }

    use std::time::Duration;

    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    /// An upstream error's `data` reaches the model with its message, and a URL elicitation
    /// names the URL to open and says to call again.
    #[test]
    fn an_upstream_errors_data_and_url_elicitation_are_spelt_out() {
        let data = serde_json::json!({"path": "/x", "hint": "use an absolute path"});
        assert_eq!(
            peer_error_text(-32602, "bad path", Some(&data)),
            r#"bad path (details: {"path":"/x","hint":"use an absolute path"})"#
        );
        assert_eq!(peer_error_text(-32000, "plain", None), "plain");
        let url = serde_json::json!({"elicitations": [{"mode": "url", "elicitationId": "e1",
            "url": "https://example.com/connect", "message": "Authorize access to your files."}]});
        assert_eq!(
            peer_error_text(
                -32042,
                "This request requires more information.",
                Some(&url)
            ),
            "This request requires more information. The user must open <https://example.com/connect> (Authorize access to your files.) in a browser to continue; once they have, call the tool again."
        );
        let long = serde_json::json!({"blob": "x".repeat(5000)});
        assert!(peer_error_text(1, "m", Some(&long)).ends_with(" …[cut])"));
    }
    use serde_json::json;

    fn error_of(message: &ServerJsonRpcMessage) -> (Value, String) {
        let v = serde_json::to_value(message).unwrap();
        (
            v["id"].clone(),
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    }

    /// Each answer Quiver cannot read fails its own request at once, saying why; lines
    /// without an id are skipped; good messages still come through.
    #[tokio::test]
    async fn unreadable_answers_fail_their_request() {
        let (mut server_out, client_in) = tokio::io::duplex(1 << 20);
        let (client_out, _server_in) = tokio::io::duplex(1 << 16);
        let mut transport = PipeTransport::new("fx", client_in, client_out).with_max_line(4096);
        let long = format!(
            r#"{{"result":{{"content":[{{"type":"text","text":"{}"}}]}},"jsonrpc":"2.0","id":4}}"#,
            "x".repeat(8000)
        );
        let input = [
            "a banner on stdout",
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000}}"#,
            "{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"caf\\udce9\"}]}}",
            &long,
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
        ]
        .join("\n");
        server_out
            .write_all(format!("{input}\n").as_bytes())
            .await
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let m = tokio::time::timeout(Duration::from_secs(5), transport.receive())
                .await
                .unwrap()
                .unwrap();
            seen.push(m);
        }
        let (id, why) = error_of(&seen[0]);
        assert_eq!(id, 1);
        assert!(
            why.contains("MCP server \"fx\" answered, but its answer cannot be read"),
            "{why}"
        );
        let (id, why) = error_of(&seen[1]);
        assert_eq!(id, 2);
        assert!(why.contains("surrogate"), "{why}");
        let (id, why) = error_of(&seen[2]);
        assert_eq!(id, 4);
        assert!(why.contains("longer than 4096 bytes"), "{why}");
        let ok = serde_json::to_value(&seen[3]).unwrap();
        assert_eq!(ok["id"], 3);
        assert!(ok.get("error").is_none(), "{ok}");
    }

    /// An answer whose id is a number written as a string comes through as it is (rmcp
    /// takes it for that request's answer) and is counted, for a warning once per
    /// connection; a string id that is no number, and a numeric id, are not counted.
    #[tokio::test]
    async fn a_stringified_numeric_id_is_passed_on_and_noted() {
        let (mut server_out, client_in) = tokio::io::duplex(1 << 16);
        let (client_out, _server_in) = tokio::io::duplex(1 << 16);
        let mut transport = PipeTransport::new("fx", client_in, client_out);
        let input = [
            r#"{"jsonrpc":"2.0","id":"675","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"abc","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"676","error":{"code":-32000,"message":"no"}}"#,
            r#"{"jsonrpc":"2.0","id":"02","result":{}}"#,
        ]
        .join("\n");
        server_out
            .write_all(format!("{input}\n").as_bytes())
            .await
            .unwrap();
        let mut ids = Vec::new();
        for _ in 0..5 {
            let m = tokio::time::timeout(Duration::from_secs(5), transport.receive())
                .await
                .unwrap()
                .unwrap();
            ids.push(serde_json::to_value(&m).unwrap()["id"].clone());
        }
        assert_eq!(
            ids,
            [
                json!("675"),
                json!("abc"),
                json!(7),
                json!("676"),
                json!("02")
            ]
        );
        // "02" reads as 2 too (rmcp takes it for request 2's answer).
        assert_eq!(transport.stringified_ids, 3);
        let said = stringified_id_warning(2, "02");
        assert!(
            said.contains(r#"the id "02""#) && said.contains("request 2 if one is waiting"),
            "{said}"
        );
    }

    /// A request from the server that cannot be read is answered with an error, not
    /// dropped.
    #[tokio::test]
    async fn an_unreadable_request_is_refused() {
        let (mut server_out, client_in) = tokio::io::duplex(1 << 16);
        let (client_out, server_in) = tokio::io::duplex(1 << 16);
        let mut transport = PipeTransport::new("fx", client_in, client_out);
        server_out
            .write_all(
                concat!(
                    r#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":7}"#,
                    "\n",
                    r#"{"jsonrpc":"2.0","id":9,"result":{}}"#,
                    "\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let next = transport.receive().await.unwrap();
        assert_eq!(serde_json::to_value(&next).unwrap()["id"], 9);
        let mut lines = BufReader::new(server_in).lines();
        let answer = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["id"], "s1");
        assert_eq!(answer["error"]["code"], -32600);
    }
}
