//! Result limit: a result's text is cut at a character limit (never inside a character), with
//! the marker `…[result truncated]` reserved inside the limit; non-text parts have their own
//! byte budget.

use std::{
    convert::Infallible,
    io,
    sync::Arc,
    task::{Context, Poll},
};

use quiver_contract::{Envelope, Warning};
use serde_json::Value;
use tower::{Layer, Service};

use super::{Call, CallFuture};

/// The marker appended to cut text; it counts against the limit.
pub const TRUNCATION_MARKER: &str = "…[result truncated]";

/// Result limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResultLimitConfig {
    /// Characters of text (or serialized JSON) a result may carry.
    pub max_chars: usize,
    /// Bytes of parts a result may carry besides its text: images, audio and embedded
    /// resources (a text resource's text counts here, not against `max_chars`).
    pub max_part_bytes: usize,
}

impl Default for ResultLimitConfig {
    fn default() -> Self {
        ResultLimitConfig {
            max_chars: 100_000,
            max_part_bytes: 1 << 20,
        }
    }
}

impl ResultLimitConfig {
    /// Sets the character limit.
    pub fn with_max_chars(mut self, n: usize) -> Self {
        self.max_chars = n;
        self
    }

    /// Sets the part budget.
    pub fn with_max_part_bytes(mut self, n: usize) -> Self {
        self.max_part_bytes = n;
        self
    }
}

/// Applies [`ResultLimitConfig`].
#[derive(Debug, Clone)]
pub struct ResultLimitLayer {
    config: Arc<ResultLimitConfig>,
}

impl ResultLimitLayer {
    /// A layer with these limits.
    pub fn new(config: ResultLimitConfig) -> Self {
        ResultLimitLayer {
            config: Arc::new(config),
        }
    }
}

impl<S> Layer<S> for ResultLimitLayer {
    type Service = ResultLimit<S>;

    fn layer(&self, inner: S) -> ResultLimit<S> {
        ResultLimit {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The result-limit service.
#[derive(Debug, Clone)]
pub struct ResultLimit<S> {
    inner: S,
    config: Arc<ResultLimitConfig>,
}

impl<S> Service<Call> for ResultLimit<S>
where
    S: Service<Call, Response = Envelope, Error = Infallible, Future = CallFuture>,
{
    type Response = Envelope;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> CallFuture {
        let config = *self.config;
        let fut = self.inner.call(call);
        Box::pin(async move {
            let mut envelope = fut.await?;
            limit(&mut envelope, &config);
            Ok(envelope)
        })
    }
}

/// Cuts `text` to at most `max` characters including the marker. Returns the original
/// character count when it cut.
pub fn truncate_chars(text: &mut String, max: usize) -> Option<usize> {
    if text.len() <= max {
        return None;
    }
    let total = text.chars().count();
    if total <= max {
        return None;
    }
    // The marker when it fits; a limit smaller than the marker keeps that many characters.
    let keep = kept_chars(max);
    let cut = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    text.truncate(cut);
    if keep < max {
        text.push_str(TRUNCATION_MARKER);
    }
    Some(total)
}

/// How many characters of a text [`truncate_chars`] keeps when it cuts it to `max`
/// (the marker takes the rest).
fn kept_chars(max: usize) -> usize {
    let marker_len = TRUNCATION_MARKER.chars().count();
    if max >= marker_len {
        max - marker_len
    } else {
        max
    }
}

/// Counts serialized bytes, stopping early once past a limit.
struct Counter {
    n: usize,
    limit: usize,
}

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.n += buf.len();
        if self.n > self.limit {
            Err(io::Error::other("over"))
        } else {
            Ok(buf.len())
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Applies the limits to one envelope.
pub fn limit(envelope: &mut Envelope, config: &ResultLimitConfig) {
    match envelope {
        Envelope::Ok {
            data,
            warnings,
            parts,
            ..
        } => {
            let cut = match data {
                Value::String(text) => truncate_chars(text, config.max_chars),
                Value::Null | Value::Bool(_) | Value::Number(_) => None,
                // Measured as the model reads it: the text rendering shows structured data
                // as pretty-printed JSON, whose indentation can be many times the compact
                // form of deeply nested data.
                other => {
                    let mut counter = Counter {
                        n: 0,
                        limit: config.max_chars,
                    };
                    if serde_json::to_writer_pretty(&mut counter, other).is_ok() {
                        None
                    } else {
                        let mut text = serde_json::to_string_pretty(other).unwrap_or_default();
                        let total = truncate_chars(&mut text, config.max_chars);
                        if total.is_some() {
                            *other = Value::String(text);
                        }
                        total
                    }
                }
            };
            if let Some(total) = cut {
                warnings.push(Warning::new(
                    "truncated",
                    format!(
                        "the result was {total} characters; only the first {} are shown. Ask for less (a filter, a page, fewer fields).",
                        kept_chars(config.max_chars)
                    ),
                ));
            }
            let mut used = 0usize;
            let before = parts.len();
            let mut dropped_bytes = 0usize;
            parts.retain(|p| {
                let n = p.byte_len();
                if used + n <= config.max_part_bytes {
                    used += n;
                    true
                } else {
                    dropped_bytes += n;
                    false
                }
            });
            let dropped = before - parts.len();
            if dropped > 0 {
                warnings.push(Warning::new(
                    "parts_dropped",
                    format!(
                        "{dropped} non-text part(s) ({dropped_bytes} bytes) were dropped: over the {} byte budget for parts.",
                        config.max_part_bytes
                    ),
                ));
            }
        }
        Envelope::Hint { message, .. } | Envelope::Err { message, .. } => {
            truncate_chars(message, config.max_chars);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_splits_a_character_and_reserves_the_marker() {
        let mut s = "é".repeat(50);
        let total = truncate_chars(&mut s, 30);
        assert_eq!(total, Some(50));
        assert_eq!(s.chars().count(), 30);
        assert!(s.ends_with(TRUNCATION_MARKER));
        let mut short = "abc".to_owned();
        assert_eq!(truncate_chars(&mut short, 3), None);
        assert_eq!(short, "abc");
        // A limit smaller than the marker keeps that many characters (it kept none).
        let mut tiny = "abcdefghij".repeat(3);
        assert_eq!(truncate_chars(&mut tiny, 5), Some(30));
        assert_eq!(tiny, "abcde");
        assert_eq!(kept_chars(5), 5);
    }
}
