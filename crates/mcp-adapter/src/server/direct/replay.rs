//! Answers kept for a client that lost a call's stream before it ended.
//!
//! rmcp drops a call stream's events once the call is answered, so a client whose
//! connection broke while the call ran, and that resumes after the answer came, would get
//! nothing (and a client would take the call for failed, and may make it again). Quiver
//! reads on a call stream its client left (the call goes on, and rmcp's sends would wait
//! for a reader otherwise), keeps the events of one that ends with its answer for
//! [`KEPT_FOR`], and a resumption of that stream gets the events after the one it names.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::body::{Body, Bytes};
use futures::{Stream, StreamExt};

use crate::sync::lock;

/// How long the events of a call answered after its client left are kept.
pub(super) const KEPT_FOR: Duration = Duration::from_secs(60);

/// The most bytes of one call's events kept: a larger answer is not kept (a resumption
/// then finds the stream gone).
const MOST_BYTES: usize = 4 << 20;

/// The most calls kept at once; the oldest go first.
const MOST_CALLS: usize = 256;

/// One SSE event: its index on its stream, and its text as sent (ending in a blank line).
type Event = (usize, String);

struct Kept {
    events: Vec<Event>,
    at: Instant,
}

/// The kept answers, by session and stream.
#[derive(Default)]
pub(crate) struct Replays(Mutex<HashMap<(Arc<str>, u64), Kept>>);

impl Replays {
    fn keep(&self, session: Arc<str>, stream: u64, events: Vec<Event>) {
        let mut kept = lock(&self.0);
        kept.retain(|_, k| k.at.elapsed() < KEPT_FOR);
        if kept.len() >= MOST_CALLS
            && let Some(oldest) = kept
                .iter()
                .min_by_key(|(_, k)| k.at)
                .map(|(key, _)| key.clone())
        {
            kept.remove(&oldest);
        }
        kept.insert(
            (session, stream),
            Kept {
                events,
                at: Instant::now(),
            },
        );
    }

    /// The events of `session`'s stream `stream` from index `from` on, if its answer is
    /// kept.
    pub(super) fn from(&self, session: &str, stream: u64, from: usize) -> Option<String> {
        let kept = lock(&self.0);
        let found = kept.get(&(Arc::from(session), stream))?;
        (found.at.elapsed() < KEPT_FOR).then(|| {
            found
                .events
                .iter()
                .filter(|(index, _)| *index >= from)
                .map(|(_, text)| text.as_str())
                .collect()
        })
    }
}

/// `body`, rmcp's SSE answer to a call of `session`: passed on as it is; if the client
/// leaves before it ends, read to its end and kept in `replays` when it ends with the
/// call's answer.
pub(super) fn tapped(body: Body, session: Arc<str>, replays: Arc<Replays>) -> Body {
    Body::from_stream(Tap {
        inner: Some(body.into_data_stream()),
        seen: Vec::new(),
        ended: false,
        keep: Some((session, replays)),
    })
}

struct Tap {
    inner: Option<axum::body::BodyDataStream>,
    /// What was passed on so far (up to [`MOST_BYTES`]).
    seen: Vec<u8>,
    ended: bool,
    keep: Option<(Arc<str>, Arc<Replays>)>,
}

impl Stream for Tap {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let next = inner.poll_next_unpin(cx);
        match &next {
            Poll::Ready(Some(Ok(bytes))) => {
                if self.seen.len() + bytes.len() <= MOST_BYTES {
                    self.seen.extend_from_slice(bytes);
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.ended = true,
            Poll::Pending => {}
        }
        next
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let (Some(mut inner), Some((session, replays))) = (self.inner.take(), self.keep.take())
        else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut seen = std::mem::take(&mut self.seen);
        runtime.spawn(async move {
            let mut whole = seen.len() <= MOST_BYTES;
            while let Some(Ok(bytes)) = inner.next().await {
                if seen.len() + bytes.len() <= MOST_BYTES {
                    seen.extend_from_slice(&bytes);
                } else {
                    whole = false;
                }
            }
            if !whole {
                return;
            }
            let text = String::from_utf8_lossy(&seen).replace("\r\n", "\n");
            if let Some((stream, events)) = answered(&text) {
                replays.keep(session, stream, events);
            }
        });
    }
}

/// The stream and events of an SSE text whose last message is a JSON-RPC response (the
/// call's answer), if it is one.
fn answered(text: &str) -> Option<(u64, Vec<Event>)> {
    let mut stream = None;
    let mut events = Vec::new();
    let mut last_is_answer = false;
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |name: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.strip_prefix(' ').unwrap_or(v))
        };
        let Some((index, on)) = field("id:").and_then(|id| id.split_once('/')) else {
            continue;
        };
        let (Ok(index), Ok(on)) = (index.parse::<usize>(), on.parse::<u64>()) else {
            continue;
        };
        stream = Some(on);
        last_is_answer = field("data:")
            .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .is_some_and(|m| {
                m.get("method").is_none() && (m.get("result").is_some() || m.get("error").is_some())
            });
        events.push((index, format!("{block}\n\n")));
    }
    last_is_answer.then_some((stream?, events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answered_stream_is_read_by_its_events() {
        let text = "data: \nid: 0/3\nretry: 3000\n\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\nid: 1/3\n\n: keep-alive\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}\nid: 2/3\n\n";
        let (stream, events) = answered(text).expect("answered");
        assert_eq!(stream, 3);
        assert_eq!(
            events.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert!(
            events[2]
                .1
                .starts_with("data: {\"jsonrpc\":\"2.0\",\"id\":5")
        );
        // Not answered: no response last.
        assert!(
            answered(
                "data: \nid: 0/3\n\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\nid: 1/3\n\n"
            )
            .is_none()
        );
        let replays = Replays::default();
        replays.keep(Arc::from("s"), stream, events);
        let after = replays.from("s", 3, 2).expect("kept");
        assert!(
            after.starts_with("data: {\"jsonrpc\":\"2.0\",\"id\":5") && after.ends_with("\n\n")
        );
        assert!(replays.from("s", 4, 0).is_none() && replays.from("t", 3, 0).is_none());
    }
}
