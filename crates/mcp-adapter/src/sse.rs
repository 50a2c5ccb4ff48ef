//! Server-sent events read as the HTML standard says: the direct path's response streams
//! (client side) and the answers a batch collects from rmcp (server side).
//!
//! `sse-stream` fails the whole stream on lines the standard tells a reader to ignore (a
//! field it does not know, a field name without a colon, a repeated `id`, a `retry` that is
//! not a number), and the direct path would then report a call whose answer followed as
//! broken. This reader ignores them, as a browser does: a line without a colon is a field
//! with an empty value, unknown fields are skipped, a later `id` replaces an earlier one.

use std::collections::VecDeque;

use futures::{Stream, StreamExt, stream::BoxStream};
use hyper::body::Bytes;

/// One dispatched event: what a reader here needs of it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The data lines joined by line feeds (empty without any).
    pub(crate) data: String,
    /// The event's `id` (the last one when it has several).
    pub(crate) id: Option<String>,
    /// The reconnection time the event asked for, in milliseconds.
    pub(crate) retry: Option<u64>,
}

/// The line and event being read.
#[derive(Default)]
struct Parser {
    line: Vec<u8>,
    /// The last byte ended a line with a carriage return (a line feed after it is the same
    /// line end).
    after_cr: bool,
    /// A line was seen (only the first may start with a byte order mark).
    started: bool,
    data: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
    ready: VecDeque<Event>,
}

impl Parser {
    fn feed(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            if std::mem::take(&mut self.after_cr) && chunk[0] == b'\n' {
                chunk = &chunk[1..];
                continue;
            }
            match chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
                None => {
                    self.line.extend_from_slice(chunk);
                    return;
                }
                Some(end) => {
                    self.line.extend_from_slice(&chunk[..end]);
                    self.after_cr = chunk[end] == b'\r';
                    chunk = &chunk[end + 1..];
                    self.end_line();
                }
            }
        }
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        let text = String::from_utf8_lossy(&line);
        let mut text: &str = &text;
        if !std::mem::replace(&mut self.started, true) {
            text = text.strip_prefix('\u{feff}').unwrap_or(text);
        }
        if text.is_empty() {
            self.dispatch();
        } else if !text.starts_with(':') {
            let (field, value) = match text.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (text, ""),
            };
            match field {
                "data" => {
                    let data = self.data.get_or_insert_default();
                    data.push_str(value);
                    data.push('\n');
                }
                "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
                "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                    // Too many digits for a u64 is no delay a server meant: ignored.
                    if let Ok(ms) = value.parse() {
                        self.retry = Some(ms);
                    }
                }
                // `event` (the type; messages of every type are read alike) and any
                // field the standard does not define.
                _ => {}
            }
        }
        // The line's buffer is reused.
        let mut line = line;
        line.clear();
        self.line = line;
    }

    fn dispatch(&mut self) {
        let mut data = self.data.take();
        let (id, retry) = (self.id.take(), self.retry.take());
        if data.is_none() && id.is_none() && retry.is_none() {
            return;
        }
        if let Some(d) = data.as_mut()
            && d.ends_with('\n')
        {
            d.pop();
        }
        self.ready.push_back(Event {
            data: data.unwrap_or_default(),
            id,
            retry,
        });
    }
}

/// The events of an SSE body. A body error is passed on (after the events complete before
/// it) and ends the stream; an event the body ends in the middle of is dropped.
pub(crate) fn events<S>(body: S) -> BoxStream<'static, Result<Event, std::io::Error>>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + 'static,
{
    futures::stream::unfold(
        (body, Parser::default(), false),
        |(mut body, mut parser, ended)| async move {
            loop {
                if let Some(event) = parser.ready.pop_front() {
                    return Some((Ok(event), (body, parser, ended)));
                }
                if ended {
                    return None;
                }
                match body.next().await {
                    Some(Ok(chunk)) => parser.feed(&chunk),
                    Some(Err(e)) => return Some((Err(e), (body, parser, true))),
                    None => return None,
                }
            }
        },
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(chunks: &[&'static str]) -> Vec<Event> {
        let body = futures::stream::iter(
            chunks
                .iter()
                .map(|c| Ok(Bytes::from_static(c.as_bytes())))
                .collect::<Vec<_>>(),
        );
        events(body)
            .map(|e| e.expect("no body error"))
            .collect()
            .await
    }

    fn event(data: &str, id: Option<&str>, retry: Option<u64>) -> Event {
        Event {
            data: data.to_owned(),
            id: id.map(str::to_owned),
            retry,
        }
    }

    /// Lines the standard says to ignore or read leniently do not end the stream.
    #[tokio::test]
    async fn unusual_lines_are_read_as_the_standard_says() {
        let got = read(&[
            "foo: bar\ndata\nid: 1\nid: 2\nretry: soon\nevent: message\n",
            ": a comment\ndata: {\"x\": 1}\n\n",
        ])
        .await;
        // `data` without a colon is an empty data line; the later id wins.
        assert_eq!(got, [event("\n{\"x\": 1}", Some("2"), None)]);
    }

    #[tokio::test]
    async fn line_ends_and_chunk_boundaries_do_not_matter() {
        let got = read(&[
            "\u{feff}data: a\r",
            "\ndata: b\r\rid: 7\nretry: 1500\n",
            "\n",
            "data:c\r\n\r\ndata: cut off",
        ])
        .await;
        assert_eq!(
            got,
            [
                event("a\nb", None, None),
                event("", Some("7"), Some(1500)),
                event("c", None, None),
            ]
        );
    }

    #[tokio::test]
    async fn a_body_error_comes_after_the_complete_events() {
        let body = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"data: 1\n\ndata: 2")),
            Err(std::io::Error::other("reset")),
        ]);
        let got: Vec<_> = events(body).collect().await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap().data, "1");
        assert!(got[1].is_err());
    }
}
