//! Results shaped by a token budget: what a model is shown of a result larger than it should
//! read at once, and the pages the rest is read back in.
//!
//! Sizes are counted as the model reads them: tokens of OpenAI's `o200k_base` encoding
//! (through `tiktoken-rs`, whose data is in the crate), and characters. A text is within a
//! [`Budget`] when both counts are; its byte length bounds both (a token is at least one
//! byte, a character too), so a text no longer in bytes than the budget is never tokenized.
//!
//! - **Text** over the budget keeps its head and its tail, with a marker between them that
//!   says how much was left out and which page holds it. Cuts fall on character boundaries,
//!   on a line break when one is near.
//! - **Structured data** over the budget is paged by items: the items of a top-level array,
//!   or of the largest array in a top-level object (its other fields repeated on every
//!   page), or else the object's entries. Pages hold whole items, so no JSON value is split.
//!   When one item alone is over the budget the data is shaped as text (its pretty JSON),
//!   since no page of whole items could hold it.
//!
//! The pages cover the whole result: text page 1 is the head the model was shown, and the
//! part left out starts on page 2.

use std::{ops::Range, sync::Arc};

use serde_json::Value;
use tiktoken_rs::{CoreBPE, o200k_base_singleton};

/// Tokens and characters kept free in each page for the note that says what the page is.
const NOTE_TOKENS: usize = 80;
const NOTE_CHARS: usize = 400;

/// The smallest token budget: below it the notes would not fit beside any content.
pub const MIN_TOKENS: usize = 4 * NOTE_TOKENS;

fn bpe() -> &'static CoreBPE {
    o200k_base_singleton()
}

/// The `o200k_base` tokens of `text`.
pub fn count_tokens(text: &str) -> usize {
    bpe().count_ordinary(text)
}

/// How much of a result the model reads at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Tokens (`o200k_base`).
    pub tokens: usize,
    /// Characters.
    pub chars: usize,
}

/// A text's size as the model reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Size {
    /// Tokens (`o200k_base`).
    pub tokens: usize,
    /// Characters.
    pub chars: usize,
}

impl Budget {
    /// A budget of `tokens` tokens and `chars` characters.
    pub fn new(tokens: usize, chars: usize) -> Self {
        Budget { tokens, chars }
    }

    /// Whether `text` is within the budget; tokenizes only a text longer in bytes than the
    /// budget.
    pub fn fits(&self, text: &str) -> bool {
        if text.len() <= self.tokens.min(self.chars) {
            return true;
        }
        text.chars().count() <= self.chars && count_tokens(text) <= self.tokens
    }

    /// The room left for content once a page's note is written: the note's size, or a
    /// quarter of a small budget.
    fn content(&self) -> Budget {
        Budget {
            tokens: (self.tokens - NOTE_TOKENS.min(self.tokens / 4)).max(1),
            chars: (self.chars - NOTE_CHARS.min(self.chars / 4)).max(1),
        }
    }

    fn scaled(&self, num: usize, den: usize) -> Budget {
        Budget {
            tokens: (self.tokens * num / den).max(1),
            chars: (self.chars * num / den).max(1),
        }
    }
}

/// The size of `text` as the model reads it.
pub fn size_of(text: &str) -> Size {
    Size {
        tokens: count_tokens(text),
        chars: text.chars().count(),
    }
}

/// A text's tokens as byte ranges of it (a token may end inside a character; the ranges are
/// the encoding's, cut points are moved to character boundaries by their users).
struct Tokens {
    ends: Vec<usize>,
}

impl Tokens {
    fn of(text: &str) -> Tokens {
        let bpe = bpe();
        let mut ends = Vec::new();
        let mut at = 0usize;
        for rank in bpe.encode_ordinary(text) {
            at += bpe.decode_bytes(&[rank]).map(|b| b.len()).unwrap_or(1);
            ends.push(at.min(text.len()));
        }
        Tokens { ends }
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn start(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.ends[i - 1] }
    }
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_boundary(text: &str, mut at: usize) -> usize {
    while at < text.len() && !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

fn chars_in(bytes: &[u8]) -> usize {
    bytes.iter().filter(|b| (**b & 0xC0) != 0x80).count()
}

/// The end (a token index) of the longest run of tokens from `from` within `budget`.
fn run_end(text: &str, tokens: &Tokens, from: usize, budget: Budget) -> usize {
    let mut chars = 0usize;
    let mut i = from;
    while i < tokens.len() && i - from < budget.tokens {
        let n = chars_in(&text.as_bytes()[tokens.start(i)..tokens.ends[i]]);
        if chars + n > budget.chars {
            break;
        }
        chars += n;
        i += 1;
    }
    // Always progress: a page holds at least one token.
    i.max((from + 1).min(tokens.len()))
}

/// Moves a cut back to just after a line break within the last quarter of `range`, or
/// else after a space there, so a cut falls between lines or words where it can.
fn at_line_end(text: &str, range: Range<usize>) -> usize {
    let quarter = floor_boundary(text, range.start + (range.end - range.start) * 3 / 4);
    let last = &text[quarter..range.end];
    match last.rfind('\n').or_else(|| last.rfind(' ')) {
        Some(i) => quarter + i + 1,
        None => range.end,
    }
}

/// Moves a cut forward to just after a line break within the first quarter of `range`, or
/// else after a space there.
fn at_line_start(text: &str, range: Range<usize>) -> usize {
    let quarter = ceil_boundary(text, range.start + (range.end - range.start) / 4);
    let first = &text[range.start..quarter];
    match first.find('\n').or_else(|| first.find(' ')) {
        Some(i) => range.start + i + 1,
        None => range.start,
    }
}

/// A text over its budget as the model is shown it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextCut {
    /// The head: bytes `0..head` of the text.
    pub head: usize,
    /// The tail: bytes `tail..` of the text.
    pub tail: usize,
    /// The text's pages, as byte ranges: page 1 is the head, the part left out starts on
    /// page 2.
    pub pages: Vec<Range<usize>>,
    /// The whole text's size.
    pub size: Size,
    /// The size of the part left out.
    pub omitted: Size,
}

/// Cuts `text` to `budget`: `None` when it fits. The head takes two thirds of the room, the
/// tail the rest.
pub fn cut_text(text: &str, budget: Budget) -> Option<TextCut> {
    if budget.fits(text) {
        return None;
    }
    let tokens = Tokens::of(text);
    let room = budget.content();
    let head_budget = room.scaled(2, 3);
    let tail_budget = Budget {
        tokens: room.tokens.saturating_sub(head_budget.tokens).max(1),
        chars: room.chars.saturating_sub(head_budget.chars).max(1),
    };
    let head_end = run_end(text, &tokens, 0, head_budget);
    let head = floor_boundary(text, tokens.start(head_end));
    let head = at_line_end(text, 0..head);
    // The tail: the longest run of tokens at the end within its budget.
    let mut from = tokens.len();
    let mut chars = 0usize;
    while from > 0 && tokens.len() - from < tail_budget.tokens {
        let n = chars_in(&text.as_bytes()[tokens.start(from - 1)..tokens.ends[from - 1]]);
        if chars + n > tail_budget.chars {
            break;
        }
        chars += n;
        from -= 1;
    }
    let tail = ceil_boundary(text, tokens.start(from)).max(head);
    let tail = at_line_start(text, tail..text.len());
    let mut pages: Vec<Range<usize>> = Vec::new();
    pages.push(0..head);
    let page = budget.content();
    let mut at = head;
    while at < text.len() {
        // The token the page starts in (or after): `at` is a character boundary.
        let first = tokens.ends.partition_point(|e| *e <= at);
        let end = run_end(text, &tokens, first, page);
        let mut stop = floor_boundary(text, tokens.start(end).max(at + 1).min(text.len()));
        if stop <= at {
            stop = ceil_boundary(text, at + 1);
        }
        if stop < text.len() {
            stop = at_line_end(text, at..stop).max(ceil_boundary(text, at + 1));
        }
        pages.push(at..stop);
        at = stop;
    }
    let size = Size {
        tokens: tokens.len(),
        chars: text.chars().count(),
    };
    let omitted = size_of(&text[head..tail]);
    Some(TextCut {
        head,
        tail,
        pages,
        size,
        omitted,
    })
}

/// Structured data over its budget, split into pages of whole items.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPages {
    /// Where the items are: `None` for a top-level array, `Some(key)` for the array under
    /// that key of a top-level object (whose other fields every page repeats), and
    /// `Some("")` for the entries of a top-level object.
    pub within: Option<String>,
    /// Each page's items, as a range of item indices.
    pub pages: Vec<Range<usize>>,
    /// How many items there are.
    pub items: usize,
}

impl JsonPages {
    /// Page `n` (from 0) of `value`, which these pages were made from.
    pub fn page(&self, value: &Value, n: usize) -> Option<Value> {
        let range = self.pages.get(n)?.clone();
        Some(page_value(value, self.within.as_deref(), range))
    }

    /// What the items are called in notes: `items` or `entries`, with where they are.
    pub fn what(&self) -> String {
        match self.within.as_deref() {
            None => "items".into(),
            Some("") => "entries".into(),
            Some(key) => format!("items of `{key}`"),
        }
    }
}

fn page_value(value: &Value, within: Option<&str>, range: Range<usize>) -> Value {
    match (value, within) {
        (Value::Array(items), None) => Value::Array(items[range].to_vec()),
        (Value::Object(map), Some("")) => Value::Object(
            map.iter()
                .skip(range.start)
                .take(range.len())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        (Value::Object(map), Some(key)) => {
            let mut page = map.clone();
            if let Some(Value::Array(items)) = map.get(key) {
                page.insert(key.to_owned(), Value::Array(items[range].to_vec()));
            }
            Value::Object(page)
        }
        _ => value.clone(),
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// Pages `value` to `budget`: `None` when its pretty JSON fits, or when it has no items to
/// page by or one item is over the budget alone (then it is shaped as text).
pub fn page_json(value: &Value, budget: Budget) -> Option<JsonPages> {
    if budget.fits(&pretty(value)) {
        return None;
    }
    let room = budget.content();
    let (within, items) = match value {
        Value::Array(items) => (None, items.len()),
        Value::Object(map) => {
            let largest = map
                .iter()
                .filter_map(|(k, v)| match v {
                    Value::Array(items) if !items.is_empty() => {
                        Some((k, serde_json::to_string(v).map(|s| s.len()).unwrap_or(0)))
                    }
                    _ => None,
                })
                .max_by_key(|(_, n)| *n);
            match largest {
                Some((key, _)) => {
                    let mut rest = map.clone();
                    rest.insert(key.clone(), Value::Array(Vec::new()));
                    // The other fields go on every page: they must leave room for items.
                    if budget.scaled(1, 2).fits(&pretty(&Value::Object(rest))) {
                        (Some(key.clone()), map[key].as_array().map_or(0, Vec::len))
                    } else {
                        (Some(String::new()), map.len())
                    }
                }
                None => (Some(String::new()), map.len()),
            }
        }
        _ => return None,
    };
    if items < 2 {
        return None;
    }
    let fits =
        |range: Range<usize>| room.fits(&pretty(&page_value(value, within.as_deref(), range)));
    let mut pages = Vec::new();
    let mut at = 0usize;
    while at < items {
        if !fits(at..at + 1) {
            return None;
        }
        // The longest page from `at`: doubling, then a binary search.
        let mut good = at + 1;
        let mut step = 1usize;
        while good + step <= items && fits(at..good + step) {
            good += step;
            step *= 2;
        }
        let (mut lo, mut hi) = (good, (good + step).min(items + 1));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(at..mid) { lo = mid } else { hi = mid }
        }
        pages.push(at..lo);
        at = lo;
    }
    Some(JsonPages {
        within,
        pages,
        items,
    })
}

/// A result kept whole for the life of its session, to be read back by page.
#[derive(Debug, Clone)]
pub enum Kept {
    /// A text and its pages.
    Text {
        /// The whole text.
        text: Arc<str>,
        /// Its pages, as byte ranges.
        pages: Vec<Range<usize>>,
    },
    /// Structured data and its pages.
    Json {
        /// The whole value.
        value: Arc<Value>,
        /// Its pages.
        pages: JsonPages,
    },
}

impl Kept {
    /// How many pages it has.
    pub fn page_count(&self) -> usize {
        match self {
            Kept::Text { pages, .. } => pages.len(),
            Kept::Json { pages, .. } => pages.pages.len(),
        }
    }

    /// Roughly the memory it holds, in bytes.
    pub fn bytes(&self) -> usize {
        match self {
            Kept::Text { text, pages } => text.len() + pages.len() * 16,
            Kept::Json { value, pages } => {
                serde_json::to_string(&**value).map_or(0, |s| s.len()) + pages.pages.len() * 16
            }
        }
    }

    /// The whole result as text: the text, or the pretty JSON.
    pub fn whole_text(&self) -> String {
        match self {
            Kept::Text { text, .. } => text.to_string(),
            Kept::Json { value, .. } => pretty(value),
        }
    }
}

/// Formats a count with thousands separators, as notes show it.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests;
