//! Result limit: a result over its budget, in tokens and characters, is shaped (see
//! [`crate::shape`]): a text keeps its head and tail, structured data is paged by whole
//! items, and the whole result is kept for its session so the model can read the rest
//! (`read_result`, or the resource `quiver://results/<call id>`). The model is always told
//! what it got, how much it did not, and how to get it. The budget bounds the content; the
//! note that says so comes on top. Text parts after the data share the character limit and
//! are cut with the marker `…[result truncated]`; non-text parts have their own byte budget;
//! a hint's or error's message keeps its head and tail within the budget, the size of what
//! was left out said between them.

use std::{
    collections::HashMap,
    convert::Infallible,
    io,
    sync::Arc,
    task::{Context, Poll},
};

use quiver_contract::{Envelope, Part, Warning};
use serde_json::Value;
use tower::{Layer, Service};

use super::{Call, CallFuture};
use crate::{
    kept::{KeptResults, NotKept, result_uri},
    shape::{Budget, Kept, TextCut, cut_text, page_json, size_of, thousands},
};

/// The tool that reads a kept result back by page.
pub const READ_RESULT: &str = "read_result";

/// The marker appended to cut text; it counts against the limit.
pub const TRUNCATION_MARKER: &str = "…[result truncated]";

/// Result limits.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResultLimitConfig {
    /// Characters of text (or serialized JSON) a result may carry.
    pub max_chars: usize,
    /// Bytes of parts a result may carry besides its text: images, audio and embedded
    /// resources (a text resource's text counts here, not against `max_chars`).
    pub max_part_bytes: usize,
    /// Tokens (`o200k_base`) a result may carry (default 25,000).
    pub max_tokens: usize,
    /// Per-tool token budgets, in place of `max_tokens`.
    pub tool_tokens: HashMap<String, usize>,
    /// Tokens the results of one round share (default 100,000): the calls of one batch
    /// split it evenly, each within its own budget too.
    pub round_tokens: usize,
    /// Bytes of whole results a session keeps for reading back (default 16 MiB).
    pub kept_bytes: usize,
}

impl Default for ResultLimitConfig {
    fn default() -> Self {
        ResultLimitConfig {
            max_chars: 100_000,
            max_part_bytes: 1 << 20,
            max_tokens: 25_000,
            tool_tokens: HashMap::new(),
            round_tokens: 100_000,
            kept_bytes: 16 << 20,
        }
    }
}

impl ResultLimitConfig {
    /// Sets the token budget of a result.
    pub fn with_max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = n;
        self
    }

    /// Sets `tool`'s own token budget.
    pub fn with_tool_tokens(mut self, tool: impl Into<String>, n: usize) -> Self {
        self.tool_tokens.insert(tool.into(), n);
        self
    }

    /// Sets the token budget of a round.
    pub fn with_round_tokens(mut self, n: usize) -> Self {
        self.round_tokens = n;
        self
    }

    /// Sets the bytes of whole results a session keeps.
    pub fn with_kept_bytes(mut self, n: usize) -> Self {
        self.kept_bytes = n;
        self
    }

    /// The token budget of `tool`'s results.
    pub fn tokens_for(&self, tool: &str) -> usize {
        self.tool_tokens
            .get(tool)
            .copied()
            .unwrap_or(self.max_tokens)
    }

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
    kept: Option<Arc<KeptResults>>,
}

impl ResultLimitLayer {
    /// A layer with these limits, which keeps no whole result.
    pub fn new(config: ResultLimitConfig) -> Self {
        ResultLimitLayer {
            config: Arc::new(config),
            kept: None,
        }
    }

    /// Keeps the whole of each shaped result in `kept`, under its call's session.
    pub fn keeping(mut self, kept: Arc<KeptResults>) -> Self {
        self.kept = Some(kept);
        self
    }
}

impl<S> Layer<S> for ResultLimitLayer {
    type Service = ResultLimit<S>;

    fn layer(&self, inner: S) -> ResultLimit<S> {
        ResultLimit {
            inner,
            config: self.config.clone(),
            kept: self.kept.clone(),
        }
    }
}

/// The result-limit service.
#[derive(Debug, Clone)]
pub struct ResultLimit<S> {
    inner: S,
    config: Arc<ResultLimitConfig>,
    kept: Option<Arc<KeptResults>>,
}

/// Where a shaped result is kept: the store, and the call's session and id.
#[derive(Debug, Clone, Copy)]
pub struct Keep<'a> {
    /// The store.
    pub store: &'a KeptResults,
    /// The call's session.
    pub session: &'a Arc<str>,
    /// The call's id.
    pub id: &'a Arc<str>,
    /// The tool called.
    pub tool: &'a str,
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
        let config = self.config.clone();
        let kept = self.kept.clone();
        let entry = call.entry.clone();
        let share = call.ctx.result_tokens;
        let (session, id) = (call.ctx.session.clone(), call.ctx.call_id.clone());
        // A custom tool's nested call gets the whole result as its data: the budget bounds
        // what the model reads, which is the custom tool's own result, shaped in its turn.
        // A shortened page would be taken for the whole by the script (with no note it can
        // read); its memory is bounded by the sandbox's heap.
        let nested = call.ctx.depth > 0;
        let fut = self.inner.call(call);
        Box::pin(async move {
            let mut envelope = fut.await?;
            if nested {
                return Ok(envelope);
            }
            let tool = entry.spec.name.as_str();
            let mut tokens = config.tokens_for(tool);
            if let Some(share) = share {
                tokens = tokens.min(share);
            }
            // A session of one request ends with it: nothing would be left to read back.
            let lasting = session
                .as_deref()
                .filter(|s| !s.starts_with(quiver_contract::REQUEST_SESSION_PREFIX));
            let keep = match (&kept, lasting.and(session.as_ref()), &id) {
                (Some(store), Some(session), Some(id)) => Some(Keep {
                    store,
                    session,
                    id,
                    tool,
                }),
                _ => None,
            };
            shape(&mut envelope, &config, tokens, keep);
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

/// Applies the limits to one envelope with the default token budget, keeping nothing.
pub fn limit(envelope: &mut Envelope, config: &ResultLimitConfig) {
    shape(envelope, config, config.max_tokens, None);
}

/// Applies the limits to one envelope: its data within `tokens` and the character limit
/// (kept whole in `keep` when it is shaped), its parts within theirs.
pub fn shape(
    envelope: &mut Envelope,
    config: &ResultLimitConfig,
    tokens: usize,
    keep: Option<Keep<'_>>,
) {
    match envelope {
        Envelope::Ok {
            data,
            warnings,
            parts,
            ..
        } => {
            let text_parts = parts.iter().any(|p| matches!(p, Part::Text { .. }));
            let budget = Budget::new(tokens, config.max_chars);
            let shaped = shape_data(data, budget, keep);
            let was_shaped = shaped.is_some();
            warnings.extend(shaped);
            // Characters of the data as the model reads it, counted when text parts share
            // the limit: the data is within it now (its note aside). Data that had to be
            // shortened took all the room, and the text parts after it go (counted in their
            // own warning).
            let shown = if was_shaped {
                config.max_chars
            } else if text_parts {
                match data {
                    Value::String(text) => text.chars().count().min(config.max_chars),
                    Value::Null | Value::Bool(_) | Value::Number(_) => 0,
                    other => {
                        let mut counter = Counter {
                            n: 0,
                            limit: config.max_chars,
                        };
                        match serde_json::to_writer_pretty(&mut counter, other) {
                            Ok(()) => counter.n,
                            Err(_) => config.max_chars,
                        }
                    }
                }
            } else {
                0
            };
            // Text parts share the character limit with the data, in order: the first one
            // past it is cut there, the rest are dropped, and the warning counts them all.
            let mut left = config.max_chars.saturating_sub(shown);
            let mut total = shown;
            let mut over = false;
            // What the model is shown of it all (the marker aside), for the warning.
            let mut kept = shown;
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
        // A long failure (a stack trace, a build log) keeps its head and its tail, where the
        // error usually is, within the same budget as a result: the model reads it whole
        // or cut with the size left out said.
        Envelope::Hint { message, .. } | Envelope::Err { message, .. } => {
            if let Some(cut) = cut_text(message, Budget::new(tokens, config.max_chars)) {
                *message = format!(
                    "{}\n…[{} tokens of this message left out here]…\n{}",
                    &message[..cut.head],
                    thousands(cut.omitted.tokens),
                    &message[cut.tail..]
                );
            }
        }
    }
}

/// Shapes the data to `budget`, keeping it whole in `keep`; the warning that tells the
/// model what it got, or `None` when the data fits.
fn shape_data(data: &mut Value, budget: Budget, keep: Option<Keep<'_>>) -> Option<Warning> {
    match data {
        Value::Null | Value::Bool(_) | Value::Number(_) => None,
        Value::String(text) => {
            let cut = cut_text(text, budget)?;
            Some(shape_text(text, cut, budget, keep))
        }
        // An object whose only field is text (`{"content": "..."}`, as many servers wrap a
        // file): that text is shaped, head and tail by lines as any text, and the model
        // reads it as written (the render shows it under its name), not JSON-escaped.
        Value::Object(map) if map.len() == 1 && map.values().all(Value::is_string) => {
            let Some(Value::String(text)) = map.values_mut().next() else {
                return None;
            };
            let cut = cut_text(text, budget)?;
            Some(shape_text(text, cut, budget, keep))
        }
        other => {
            if let Some(pages) = page_json(other, budget) {
                let whole = std::mem::take(other);
                let first = pages.page(&whole, 0).unwrap_or(Value::Null);
                let total = size_of(&serde_json::to_string_pretty(&whole).unwrap_or_default());
                let (n, what, items, shown) = (
                    pages.pages.len(),
                    pages.what(),
                    pages.items,
                    pages.pages[0].len(),
                );
                let kept = kept(
                    keep,
                    Kept::Json {
                        value: Arc::new(whole),
                        pages,
                    },
                );
                *other = first;
                return Some(paged_note(total, budget, n, &what, shown, items, kept));
            }
            // No page of whole items fits: shaped as its pretty JSON text.
            let mut text = serde_json::to_string_pretty(other).unwrap_or_default();
            let cut = cut_text(&text, budget)?;
            let warning = shape_text(&mut text, cut, budget, keep);
            *other = Value::String(text);
            Some(warning)
        }
    }
}

/// Keeps `whole` in `keep`: the call id it is read back by, or why it was not kept.
fn kept(keep: Option<Keep<'_>>, whole: Kept) -> Result<Arc<str>, NotKept> {
    let keep = keep.ok_or(NotKept::NoSession)?;
    keep.store.keep(keep.session, keep.id, keep.tool, whole)?;
    Ok(keep.id.clone())
}

/// How to read page `page` of call `id`'s result.
pub fn read_call(id: &str, page: usize) -> String {
    format!("{READ_RESULT} {{\"id\": \"{id}\", \"page\": {page}}}")
}

fn not_kept_note(why: NotKept, store: Option<usize>) -> String {
    match why {
        NotKept::NoSession => {
            "The whole result was not kept (this call has no session), so the rest cannot be read back: ask for less (a filter, a page, fewer fields).".to_owned()
        }
        NotKept::EndsWithCall => {
            "The whole result was not kept (this command ends with the call; a session of `quiver serve` keeps it), so the rest cannot be read back: ask for less (a filter, a page, fewer fields).".to_owned()
        }
        NotKept::TooLarge => format!(
            "The whole result was not kept (it is larger than the {} bytes a session keeps), so the rest cannot be read back: ask for less (a filter, a page, fewer fields).",
            thousands(store.unwrap_or(0))
        ),
    }
}

/// Replaces `text` with its head, a marker, and its tail, keeping it whole in `keep`.
fn shape_text(text: &mut String, cut: TextCut, budget: Budget, keep: Option<Keep<'_>>) -> Warning {
    let TextCut {
        head,
        tail,
        size,
        omitted,
        ..
    } = cut.clone();
    let (head_size, tail_size) = (size_of(&text[..head]), size_of(&text[tail..]));
    let pages = cut.pages.len();
    let store = keep.map(|k| k.store.per_session());
    let whole: Arc<str> = Arc::from(text.as_str());
    let kept = kept(
        keep,
        Kept::Text {
            text: whole.clone(),
            pages: cut.pages,
        },
    );
    let marker = match &kept {
        Ok(id) if pages > 2 => format!(
            "\n…[{} tokens left out here, in pages 2 to {pages}; {} returns the first of them]…\n",
            thousands(omitted.tokens),
            read_call(id, 2)
        ),
        Ok(id) => format!(
            "\n…[{} tokens left out here; {} returns them]…\n",
            thousands(omitted.tokens),
            read_call(id, 2)
        ),
        Err(_) => format!("\n…[{} tokens left out here]…\n", thousands(omitted.tokens)),
    };
    *text = format!("{}{marker}{}", &whole[..head], &whole[tail..]);
    let mut message = format!(
        "the result is {} tokens ({} characters), over its budget of {} tokens and {} characters: shown are its first {} tokens and its last {}.",
        thousands(size.tokens),
        thousands(size.chars),
        thousands(budget.tokens),
        thousands(budget.chars),
        thousands(head_size.tokens),
        thousands(tail_size.tokens),
    );
    match kept {
        Ok(id) if pages > 2 => message.push_str(&format!(
            " The whole result is kept in {pages} pages (page 1 is the part shown first): pages 2 to {pages} hold the part left out, {} returns the first of them, and each page names the next. A client reads it whole as the MCP resource {}.",
            read_call(&id, 2),
            result_uri(&id)
        )),
        Ok(id) => message.push_str(&format!(
            " The whole result is kept in {pages} pages (page 1 is the part shown first): {} returns the part left out. A client reads it whole as the MCP resource {}.",
            read_call(&id, 2),
            result_uri(&id)
        )),
        Err(why) => {
            message.push(' ');
            message.push_str(&not_kept_note(why, store));
        }
    }
    Warning::new("truncated", message)
}

fn paged_note(
    total: crate::shape::Size,
    budget: Budget,
    pages: usize,
    what: &str,
    shown: usize,
    items: usize,
    kept: Result<Arc<str>, NotKept>,
) -> Warning {
    let mut message = format!(
        "the result is {} tokens ({} characters), over its budget of {} tokens and {} characters, so it is paged: this is page 1 of {pages}, {what} 1–{shown} of {items}.",
        thousands(total.tokens),
        thousands(total.chars),
        thousands(budget.tokens),
        thousands(budget.chars),
    );
    match kept {
        Ok(id) => message.push_str(&format!(
            " {} returns the next page, and each page names the next. A client reads the whole result as the MCP resource {}.",
            read_call(&id, 2),
            result_uri(&id)
        )),
        Err(NotKept::NoSession) => message.push_str(
            " The other pages were not kept (this call has no session): ask for fewer items (a filter or a page).",
        ),
        Err(NotKept::TooLarge) => message.push_str(
            " The other pages were not kept (the result is larger than a session keeps): ask for fewer items (a filter or a page).",
        ),
        Err(NotKept::EndsWithCall) => message.push_str(
            " The other pages were not kept (this command ends with the call; a session of `quiver serve` keeps them): ask for fewer items (a filter or a page).",
        ),
    }
    Warning::new("paged", message)
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
        // Data already shortened: it says so, and every text part goes, counted.
        let mut cut = Envelope::text("a ".repeat(250)).with_part(text("b"));
        limit(&mut cut, &config);
        let (parts, warnings) = parts_and_warnings(&cut);
        assert!(parts.is_empty(), "{parts:?}");
        let kinds: Vec<_> = warnings.iter().map(|w| w.kind.as_str()).collect();
        assert_eq!(kinds, ["truncated", "truncated"]);
        assert!(
            warnings[0]
                .message
                .contains("(500 characters), over its budget"),
            "{}",
            warnings[0].message
        );
        assert!(
            warnings[1]
                .message
                .starts_with(&format!("the result was {} characters", 100 + marker + 1)),
            "{}",
            warnings[1].message
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
