//! Newline-delimited JSON-RPC, as both stdio transports read it (`quiver serve --stdio` and
//! the pipes of a stdio upstream): one message per line, a line never held past a limit,
//! and what a line too long to read began and ended with kept to find its `id`.

use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest line read as one message (16 MiB, as rmcp's own stdio transport).
pub(crate) const MAX_LINE: usize = 16 << 20;

/// How much of the start and the end of a line too long to read is kept.
const KEPT: usize = 512;

/// What [`LineReader::read_line`] found.
pub(crate) enum LineRead {
    /// A whole line is in [`LineReader::line`].
    Line,
    /// A line longer than the limit ended; it was not held, only its first and last bytes.
    Oversized { head: Vec<u8>, tail: Vec<u8> },
    /// The input ended (or failed).
    End,
}

/// Reads lines, never holding more than `max_line` bytes of one.
pub(crate) struct LineReader<R> {
    read: BufReader<R>,
    line: Vec<u8>,
    max_line: usize,
    /// Skipping the rest of a line already too long; its head and tail so far.
    discarding: Option<(Vec<u8>, Vec<u8>)>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(read: R, max_line: usize) -> Self {
        LineReader {
            read: BufReader::with_capacity(64 * 1024, read),
            line: Vec::new(),
            max_line,
            discarding: None,
        }
    }

    /// The reader, for a new limit (tests).
    #[cfg(test)]
    pub(crate) fn into_inner(self) -> R {
        self.read.into_inner()
    }

    /// The longest line read.
    pub(crate) fn max_line(&self) -> usize {
        self.max_line
    }

    /// The line read last, with its newline; cleared by the next [`LineReader::read_line`].
    pub(crate) fn line(&self) -> &[u8] {
        &self.line
    }

    /// Reads the next line. Cancel-safe: nothing is consumed across an await, and a partial
    /// line stays buffered for the next call.
    pub(crate) async fn read_line(&mut self) -> LineRead {
        if self.line.last() == Some(&b'\n') {
            self.line.clear();
        }
        loop {
            let available = match self.read.fill_buf().await {
                // The input ended inside a line: the line is the last one, read as if its
                // newline had come (a client that writes its last message without one, as
                // `printf` does, gets its answer instead of silence).
                Ok([]) if !self.line.is_empty() && self.line.last() != Some(&b'\n') => {
                    self.line.push(b'\n');
                    return LineRead::Line;
                }
                Ok([]) => {
                    return match self.discarding.take() {
                        Some((head, tail)) => LineRead::Oversized { head, tail },
                        None => LineRead::End,
                    };
                }
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!("reading a stdio stream: {e}");
                    return LineRead::End;
                }
            };
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let mut ended = None;
            if let Some((_, tail)) = self.discarding.as_mut() {
                keep_tail(tail, &available[..take]);
                if newline.is_some() {
                    let (head, tail) = self.discarding.take().unwrap_or_default();
                    ended = Some(LineRead::Oversized { head, tail });
                }
            } else if self.line.len() + take > self.max_line {
                let mut head = std::mem::take(&mut self.line);
                head.extend_from_slice(&available[..take.min(KEPT)]);
                head.truncate(KEPT);
                let mut tail = Vec::new();
                keep_tail(&mut tail, &available[..take]);
                if newline.is_some() {
                    ended = Some(LineRead::Oversized { head, tail });
                } else {
                    self.discarding = Some((head, tail));
                }
            } else {
                self.line.extend_from_slice(&available[..take]);
                if newline.is_some() {
                    ended = Some(LineRead::Line);
                }
            }
            self.read.consume(take);
            if let Some(ended) = ended {
                return ended;
            }
        }
    }
}

/// The writing end: whole lines, one writer at a time, until closed.
pub(crate) struct LineWriter<W> {
    write: Arc<tokio::sync::Mutex<Option<W>>>,
    /// What a write after the close says ("stdout is closed").
    closed: &'static str,
    /// Cancelled when a write fails: the reader on the other end is gone.
    broken: Option<tokio_util::sync::CancellationToken>,
    /// Set by the first failed write that says so (writes may fail side by side).
    said: Arc<std::sync::atomic::AtomicBool>,
}

impl<W> Clone for LineWriter<W> {
    fn clone(&self) -> Self {
        LineWriter {
            write: self.write.clone(),
            closed: self.closed,
            broken: self.broken.clone(),
            said: self.said.clone(),
        }
    }
}

impl<W: AsyncWrite + Send + Unpin + 'static> LineWriter<W> {
    pub(crate) fn new(write: W, closed: &'static str) -> Self {
        LineWriter {
            write: Arc::new(tokio::sync::Mutex::new(Some(write))),
            closed,
            broken: None,
            said: Arc::default(),
        }
    }

    /// Cancels `token` at the first write that fails (a closed pipe, a reset socket, or any
    /// other error: a line written in part has broken the framing anyway), so the side that
    /// reads can stop: nothing it answers can be delivered any more.
    pub(crate) fn on_broken(mut self, token: tokio_util::sync::CancellationToken) -> Self {
        self.broken = Some(token);
        self
    }

    /// Writes `message` as one line (the future a transport's `send` returns).
    pub(crate) fn send<M: serde::Serialize>(
        &self,
        message: &M,
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'static + use<W, M> {
        self.send_marked(message, || {})
    }

    /// [`Self::send`], calling `started` once this line has the writing end, just before
    /// its first byte goes out: a send still waiting behind another line's (and dropped
    /// there) has sent nothing.
    pub(crate) fn send_marked<M: serde::Serialize, S: FnOnce() + Send + 'static>(
        &self,
        message: &M,
        started: S,
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'static + use<W, M, S> {
        let bytes = serde_json::to_vec(message).map_err(std::io::Error::other);
        let this = self.clone();
        async move { this.write_line_marked(bytes?, started).await }
    }

    /// Writes `message` as one line in a task of its own, so that a `receive` dropped by
    /// rmcp's service loop cannot cut it in half.
    pub(crate) fn spawn(&self, message: &Value) {
        let bytes = message.to_string().into_bytes();
        let this = self.clone();
        tokio::spawn(async move {
            let _ = this.write_line(bytes).await;
        });
    }

    async fn write_line(&self, bytes: Vec<u8>) -> std::io::Result<()> {
        self.write_line_marked(bytes, || {}).await
    }

    async fn write_line_marked(
        &self,
        mut bytes: Vec<u8>,
        started: impl FnOnce(),
    ) -> std::io::Result<()> {
        bytes.push(b'\n');
        let mut guard = self.write.lock().await;
        started();
        let Some(w) = guard.as_mut() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                self.closed,
            ));
        };
        let written = match w.write_all(&bytes).await {
            Ok(()) => w.flush().await,
            Err(e) => Err(e),
        };
        if let (Err(e), Some(broken)) = (&written, &self.broken)
            && !self.said.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(
                "{} ({e}): the peer is gone; ending the session",
                self.closed
            );
            broken.cancel();
        }
        written
    }

    /// Flushes and closes the writing end; later writes fail.
    pub(crate) async fn close(&self) -> std::io::Result<()> {
        let taken = self.write.lock().await.take();
        if let Some(mut w) = taken {
            w.shutdown().await?;
        }
        Ok(())
    }
}

/// Appends `bytes` to `tail`, keeping only its last [`KEPT`] bytes.
fn keep_tail(tail: &mut Vec<u8>, bytes: &[u8]) {
    tail.extend_from_slice(&bytes[bytes.len().saturating_sub(KEPT)..]);
    if tail.len() > KEPT {
        tail.drain(..tail.len() - KEPT);
    }
}

/// A line's message bytes: without its newline, a carriage return, surrounding blanks and
/// a UTF-8 byte-order mark.
pub(crate) fn message_bytes(line: &[u8]) -> &[u8] {
    let line = line.trim_ascii();
    line.strip_prefix(b"\xEF\xBB\xBF")
        .unwrap_or(line)
        .trim_ascii()
}

/// What stands in a [`pruned`] message for a value nested too deeply to be read.
pub(crate) const TOO_DEEP: &str = "(nested too deeply: not read by Quiver)";

/// How many levels of arrays and objects [`pruned`] keeps: below the JSON parser's limit
/// (128), with room for the JSON-RPC envelope around a tool.
pub(crate) const KEPT_DEPTH: usize = 100;

/// `json` with each array or object nested deeper than `keep` levels replaced by the
/// string [`TOO_DEEP`], so that the rest can be read; `None` if it was not cut (nothing so
/// deep) or is not JSON the scan can follow (an unclosed string or bracket).
pub(crate) fn pruned(json: &[u8], keep: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(json.len());
    let (mut depth, mut strings, mut cut) = (0usize, Strings::default(), false);
    // While a value is being left out: the depth it began at.
    let mut cutting: Option<usize> = None;
    for &b in json {
        let mut closed = false;
        if strings.step(b) == Scan::Outside {
            match b {
                b'{' | b'[' => {
                    if depth == keep && cutting.is_none() {
                        cutting = Some(depth);
                    }
                    depth += 1;
                }
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    closed = true;
                }
                _ => {}
            }
        }
        match cutting {
            Some(at) if closed && depth == at => {
                out.push(b'"');
                out.extend_from_slice(TOO_DEEP.as_bytes());
                out.push(b'"');
                cutting = None;
                cut = true;
            }
            Some(_) => {}
            None => out.push(b),
        }
    }
    (cut && !strings.inside && depth == 0).then_some(out)
}

/// Whether `value` holds a value [`pruned`] left out.
pub(crate) fn holds_cut(value: &Value) -> bool {
    match value {
        Value::String(s) => s == TOO_DEEP,
        Value::Array(items) => items.iter().any(holds_cut),
        Value::Object(m) => m.values().any(holds_cut),
        _ => false,
    }
}

/// Where a byte of a JSON scan falls with respect to strings.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Outside any string (structure, numbers, blanks).
    Outside,
    /// The quote that opens a string.
    Opened,
    /// Inside a string.
    Inside,
    /// The quote that closes a string.
    Closed,
}

/// The string state of a scan over JSON bytes, escapes included: what [`pruned`] and
/// [`find_id`] need to tell structure from text.
#[derive(Default)]
struct Strings {
    inside: bool,
    escaped: bool,
}

impl Strings {
    /// Takes the next byte.
    fn step(&mut self, b: u8) -> Scan {
        if !self.inside {
            self.inside = b == b'"';
            return if self.inside {
                Scan::Opened
            } else {
                Scan::Outside
            };
        }
        if self.escaped {
            self.escaped = false;
        } else if b == b'\\' {
            self.escaped = true;
        } else if b == b'"' {
            self.inside = false;
            return Scan::Closed;
        }
        Scan::Inside
    }
}

/// The request id of a message that could not be read whole, from its first bytes (`id`
/// among the top-level members before anything long, as most servers write it) or its
/// last (`"id":7}` at the very end, as JavaScript's `JSON.stringify` of
/// `{result, jsonrpc, id}` writes it). Only an integer or a string counts.
pub(crate) fn find_id(head: &[u8], tail: &[u8]) -> Option<Value> {
    id_at_start(head).or_else(|| id_at_end(tail))
}

fn id_at_start(head: &[u8]) -> Option<Value> {
    first_id_value(member_at_start(head, &["id"])?)
}

/// The tool a `tools/call` that could not be read whole names (`params.name`), from its
/// first bytes, when the name comes before anything the read left out.
pub(crate) fn call_name_at_start(head: &[u8]) -> Option<String> {
    let rest = member_at_start(head, &["params", "name"])?;
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<String>();
    values.next()?.ok()
}

/// The bytes after the `:` of the member at `path` (keys from the top-level object), in
/// JSON that may be cut anywhere after it.
fn member_at_start<'a>(head: &'a [u8], path: &[&str]) -> Option<&'a [u8]> {
    let mut strings = Strings::default();
    let mut key_start = None;
    let mut last_key: Option<&[u8]> = None;
    // The key each open object or array is the value of (none for the top level and for
    // what an array holds).
    let mut within: Vec<Option<&[u8]>> = Vec::new();
    for (i, &b) in head.iter().enumerate() {
        match strings.step(b) {
            Scan::Opened => {
                // A key starts right after `{` or `,` (and is followed by `:`).
                let before = head[..i].trim_ascii_end().last();
                key_start = matches!(before, Some(b'{' | b',')).then_some(i + 1);
            }
            Scan::Closed => {
                let Some(start) = key_start.take() else {
                    continue;
                };
                let Some(rest) = head[i + 1..].trim_ascii_start().strip_prefix(b":") else {
                    continue;
                };
                let key = &head[start..i];
                last_key = Some(key);
                let (last, outer) = path.split_last()?;
                if within.len() == path.len()
                    && key == last.as_bytes()
                    && within[1..]
                        .iter()
                        .zip(outer)
                        .all(|(k, want)| *k == Some(want.as_bytes()))
                {
                    return Some(rest);
                }
            }
            Scan::Inside => {}
            Scan::Outside => match b {
                b'{' => within.push(last_key.take()),
                b'[' => {
                    last_key = None;
                    within.push(None);
                }
                b'}' | b']' => {
                    within.pop();
                }
                b',' => last_key = None,
                _ => {}
            },
        }
    }
    None
}

fn id_at_end(tail: &[u8]) -> Option<Value> {
    let body = tail.trim_ascii().strip_suffix(b"}")?.trim_ascii_end();
    let at = body.windows(4).rposition(|w| w == b"\"id\"")?;
    let after = body[at + 4..].trim_ascii_start().strip_prefix(b":")?;
    let value: Value = serde_json::from_slice(after.trim_ascii()).ok()?;
    id_value(value)
}

fn first_id_value(bytes: &[u8]) -> Option<Value> {
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    id_value(values.next()?.ok()?)
}

fn id_value(value: Value) -> Option<Value> {
    match value {
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(Value::Number(n)),
        Value::String(s) => Some(Value::String(s)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_cut_calls_tool_name_is_read_from_its_start() {
        let head = br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"mcp__up__echo","arguments":{"text":"aaaa"#;
        assert_eq!(call_name_at_start(head).as_deref(), Some("mcp__up__echo"));
        assert_eq!(find_id(head, b""), Some(json!(5)));
        // A `name` elsewhere (in the arguments, in `_meta`, at the top) is not the tool's.
        for other in [
            &br#"{"params":{"arguments":{"name":"inner"},"name":"outer"#[..],
            br#"{"name":"top","params":{"arguments":"#,
            br#"{"params":{"_meta":{"name":"m"},"arguments":[{"name":"x"}"#,
            br#"{"params":{"list":["name",":"],"arguments":"#,
        ] {
            assert_eq!(
                call_name_at_start(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        // A name the cut falls inside is not guessed.
        assert_eq!(
            call_name_at_start(br#"{"params":{"name":"mcp__up__ec"#),
            None
        );
    }

    #[test]
    fn a_value_nested_too_deeply_is_cut_and_the_rest_kept() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let text = format!(r#"{{"a": "x]{{\"", "b": {deep}, "c": [1, {{"d": 2}}]}}"#);
        assert!(serde_json::from_str::<Value>(&text).is_err());
        let cut = pruned(text.as_bytes(), 3).unwrap();
        let v: Value = serde_json::from_slice(&cut).unwrap();
        assert_eq!(v["a"], "x]{\"");
        assert_eq!(v["b"][0][0], TOO_DEEP);
        assert_eq!(v["c"], serde_json::json!([1, {"d": 2}]));
        // Nothing to cut, or not JSON the scan can follow.
        assert!(pruned(br#"{"a": [1]}"#, 3).is_none());
        assert!(pruned(b"[[[[", 2).is_none());
        assert!(pruned(br#"{"a": "open"#, 0).is_none());
    }

    /// A send waiting behind another line (here one the reader has not taken yet) has not
    /// begun: its mark comes only once it has the writing end, and never if it is dropped
    /// while it waits (the connection ended): the request is known not to have left.
    #[tokio::test]
    async fn a_send_is_marked_only_once_it_has_the_pipe() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (ours, mut theirs) = tokio::io::duplex(64);
        let writer = LineWriter::new(ours, "closed");
        let long = json!({"text": "x".repeat(1000)});
        let blocked = tokio::spawn(writer.send(&long));
        tokio::task::yield_now().await;
        let marks = Arc::new(AtomicUsize::new(0));
        let count = |marks: &Arc<AtomicUsize>| {
            let marks = marks.clone();
            move || {
                marks.fetch_add(1, Ordering::SeqCst);
            }
        };
        let mut waiting = Box::pin(writer.send_marked(&json!({"id": 1}), count(&marks)));
        let waker = futures::task::noop_waker();
        let polled = waiting
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker));
        assert!(polled.is_pending());
        assert_eq!(marks.load(Ordering::SeqCst), 0, "marked while it waited");
        drop(waiting);
        // The reader takes the long line: the next send has the pipe at once.
        let mut sink = Vec::new();
        let read = tokio::spawn(async move {
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut theirs, &mut sink).await;
        });
        blocked.await.unwrap().unwrap();
        writer
            .send_marked(&json!({"id": 2}), count(&marks))
            .await
            .unwrap();
        assert_eq!(marks.load(Ordering::SeqCst), 1);
        writer.close().await.unwrap();
        read.await.unwrap();
    }

    #[test]
    fn the_id_is_found_at_either_end() {
        let cases: [(&[u8], &[u8], Option<Value>); 7] = [
            (
                br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"te"#,
                b"",
                Some(json!(7)),
            ),
            (br#"{ "id" : "a-1" , "result": {"#, b"", Some(json!("a-1"))),
            (
                br#"{"result":{"id":5,"content":"#,
                br#"xx"}]},"jsonrpc":"2.0","id":12}"#,
                Some(json!(12)),
            ),
            (
                br#"{"result":{"content":"#,
                b"xx\"}]},\"jsonrpc\":\"2.0\",\"id\": \"k\" }\n",
                Some(json!("k")),
            ),
            // The last `"id"` is inside the result, not the message's own.
            (br#"{"result":{"content":"#, br#"xx","id":5}}"#, None),
            (br#"{"jsonrpc":"2.0","id":1.5,"#, b"", None),
            (b"not json at all", b"nor here", None),
        ];
        for (head, tail, id) in cases {
            assert_eq!(
                find_id(head, tail),
                id,
                "{} / {}",
                String::from_utf8_lossy(head),
                String::from_utf8_lossy(tail)
            );
        }
    }

    #[tokio::test]
    async fn a_long_line_is_skipped_with_its_ends_and_the_next_is_read() {
        let mut input = br#"{"jsonrpc":"2.0","id":3,"result":""#.to_vec();
        input.extend(std::iter::repeat_n(b'x', 5000));
        input.extend_from_slice(b"\"}\n{\"ok\":1}\n");
        let mut reader = LineReader::new(&input[..], 1000);
        match reader.read_line().await {
            LineRead::Oversized { head, tail } => {
                assert!(head.len() <= KEPT && tail.len() <= KEPT);
                assert_eq!(find_id(&head, &tail), Some(json!(3)));
            }
            _ => panic!("the long line is refused"),
        }
        assert!(matches!(reader.read_line().await, LineRead::Line));
        assert_eq!(reader.line(), b"{\"ok\":1}\n");
        assert!(matches!(reader.read_line().await, LineRead::End));
    }

    /// The input may end without a newline: the last line is still a line (and a long one
    /// still refused with its ends), then the end.
    #[tokio::test]
    async fn a_last_line_without_its_newline_is_read() {
        let mut reader = LineReader::new(&b"{\"a\":1}\n{\"b\":2}"[..], 1000);
        assert!(matches!(reader.read_line().await, LineRead::Line));
        assert_eq!(reader.line(), b"{\"a\":1}\n");
        assert!(matches!(reader.read_line().await, LineRead::Line));
        assert_eq!(reader.line(), b"{\"b\":2}\n");
        assert!(matches!(reader.read_line().await, LineRead::End));
        assert!(matches!(reader.read_line().await, LineRead::End));

        let mut input = br#"{"jsonrpc":"2.0","id":4,"result":""#.to_vec();
        input.extend(std::iter::repeat_n(b'x', 5000));
        let mut reader = LineReader::new(&input[..], 1000);
        match reader.read_line().await {
            LineRead::Oversized { head, tail } => {
                assert!(head.len() <= KEPT && tail.len() <= KEPT);
                assert_eq!(find_id(&head, &tail), Some(json!(4)));
            }
            _ => panic!("the long last line is refused"),
        }
        assert!(matches!(reader.read_line().await, LineRead::End));
    }
}
