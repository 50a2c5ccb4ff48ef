//! Result limit: a result's text is cut at a character limit (never inside a character), with
//! the marker `…[result truncated]` reserved inside the limit; non-text parts have their own
//! byte budget.

use std::{
    convert::Infallible,
    io,
    sync::Arc,
    task::{Context, Poll},
};

use quiver_contract::{Envelope, Part, Warning};
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

/// Counts the characters of serialized JSON, stopping early once past a limit.
struct Counter {
    n: usize,
    limit: usize,
}

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // UTF-8: every byte that is not a continuation byte starts a character (a write
        // cut inside one still counts it once).
        self.n += buf.iter().filter(|b| (**b & 0xC0) != 0x80).count();
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
            let text_parts = parts.iter().any(|p| matches!(p, Part::Text { .. }));
            // Characters of the data as the model reads it (counted only when text parts
            // share the limit), and its length before any cut.
            let (shown, mut cut) = match data {
                Value::String(text) => {
                    let total = truncate_chars(text, config.max_chars);
                    let shown = match total {
                        Some(_) => config.max_chars,
                        None if text_parts => text.chars().count(),
                        None => 0,
                    };
                    (shown, total)
                }
                Value::Null | Value::Bool(_) | Value::Number(_) => (0, None),
                // Measured as the model reads it: the text rendering shows structured data
                // as pretty-printed JSON, whose indentation can be many times the compact
                // form of deeply nested data.
                other => {
                    let mut counter = Counter {
                        n: 0,
                        limit: config.max_chars,
                    };
                    if serde_json::to_writer_pretty(&mut counter, other).is_ok() {
                        (counter.n, None)
                    } else {
                        let mut text = serde_json::to_string_pretty(other).unwrap_or_default();
                        let total = truncate_chars(&mut text, config.max_chars);
                        if total.is_some() {
                            *other = Value::String(text);
                        }
                        (config.max_chars, total)
                    }
                }
            };
            // Text parts share the character limit with the data, in order: the first one
            // past it is cut there, the rest are dropped, and the warning counts them all.
            let mut left = config.max_chars.saturating_sub(shown);
            let mut total = cut.unwrap_or(shown);
            let mut over = cut.is_some();
            // What the model is shown of it all (the marker aside), for the warning.
            let mut kept = if over {
                kept_chars(config.max_chars)
            } else {
                shown
            };
            parts.retain_mut(|p| {
                let Part::Text { text, .. } = p else {
                    return true;
                };
                let n = text.chars().count();
                total += n;
                if over {
                    return false;
                }
                if n <= left {
                    left -= n;
                    kept += n;
                    return true;
                }
                over = true;
                // Too little room for any of it next to the marker: the part goes.
                if left <= TRUNCATION_MARKER.chars().count() {
                    return false;
                }
                kept += kept_chars(left);
                truncate_chars(text, left);
                true
            });
            if over {
                cut = Some(total);
            }
            if let Some(total) = cut {
                warnings.push(Warning::new(
                    "truncated",
                    format!(
                        "the result was {total} characters; only the first {kept} are shown. Ask for less (a filter, a page, fewer fields)."
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

    /// The parts and warnings of a success.
    fn parts_and_warnings(e: &Envelope) -> (&Vec<Part>, &Vec<Warning>) {
        let Envelope::Ok {
            parts, warnings, ..
        } = e
        else {
            panic!("{e:?}")
        };
        (parts, warnings)
    }

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

    #[test]
    fn text_parts_share_the_character_limit_in_order() {
        let text = |t: &str| Part::Text {
            text: t.to_owned(),
            annotations: None,
        };
        let marker = TRUNCATION_MARKER.chars().count();
        let config = ResultLimitConfig::default()
            .with_max_chars(100 + marker)
            .with_max_part_bytes(1000);
        // Within the limit: nothing changes.
        let mut fits = Envelope::text("a".repeat(50))
            .with_part(Part::image("image/png", "AAAA"))
            .with_part(text(&"b".repeat(50)));
        let before = fits.clone();
        limit(&mut fits, &config);
        assert_eq!(fits, before);
        // Past it: the part that crosses it is cut with the marker, the next one dropped,
        // the image kept, and the warning counts every character.
        let mut over = Envelope::text("a".repeat(50))
            .with_part(text(&"b".repeat(80)))
            .with_part(Part::image("image/png", "AAAA"))
            .with_part(text(&"c".repeat(10)));
        limit(&mut over, &config);
        let (parts, warnings) = parts_and_warnings(&over);
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert_eq!(
            parts[0],
            text(&format!("{}{TRUNCATION_MARKER}", "b".repeat(50)))
        );
        assert_eq!(parts[1], Part::image("image/png", "AAAA"));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0]
                .message
                .starts_with("the result was 140 characters; only the first 100 are shown"),
            "{}",
            warnings[0].message
        );
        // Data already cut: every text part goes.
        let mut cut = Envelope::text("a".repeat(500)).with_part(text("b"));
        limit(&mut cut, &config);
        let (parts, warnings) = parts_and_warnings(&cut);
        assert!(parts.is_empty(), "{parts:?}");
        assert!(
            warnings[0]
                .message
                .starts_with("the result was 501 characters")
        );
        // A part with too little room for any of it next to the marker is dropped whole:
        // the warning says how much is shown (all the data), not the limit's worth.
        let mut dropped = Envelope::text("a".repeat(110)).with_part(text(&"b".repeat(50)));
        limit(&mut dropped, &config);
        let (parts, warnings) = parts_and_warnings(&dropped);
        assert!(parts.is_empty(), "{parts:?}");
        assert!(
            warnings[0]
                .message
                .starts_with("the result was 160 characters; only the first 110 are shown"),
            "{}",
            warnings[0].message
        );
    }

    /// Structured data counts by the characters of its pretty JSON, not its bytes: 53
    /// characters of non-ASCII text (93 bytes) leave a 50-character text part its room.
    #[test]
    fn structured_data_counts_characters_not_bytes() {
        let marker = TRUNCATION_MARKER.chars().count();
        let config = ResultLimitConfig::default().with_max_chars(100 + marker);
        let part = Part::Text {
            text: "b".repeat(50),
            annotations: None,
        };
        let mut fits =
            Envelope::ok(serde_json::json!({"k": "é".repeat(40)})).with_part(part.clone());
        let before = fits.clone();
        limit(&mut fits, &config);
        assert_eq!(fits, before);
        // Past the limit by characters, it is cut.
        let mut over = Envelope::ok(serde_json::json!({"k": "é".repeat(80)})).with_part(part);
        limit(&mut over, &config);
        let Envelope::Ok { warnings, .. } = &over else {
            panic!()
        };
        assert!(
            warnings[0]
                .message
                .starts_with("the result was 143 characters"),
            "{}",
            warnings[0].message
        );
    }
}
