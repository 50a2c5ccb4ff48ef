//! Text to index terms: identifier splitting, lower-casing, stop words, a light English
//! stemmer, character uni- and bigrams for CJK runs, and syllable-cluster bigrams for the
//! other scripts written without spaces between words (Thai, Lao, Khmer, Myanmar).

use unicode_normalization::{
    IsNormalized, UnicodeNormalization, char::is_combining_mark, is_nfkc_quick,
};

/// Function words that say nothing about which tool is wanted.
const STOP_WORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any",
    "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both",
    "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "else",
    "etc", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here",
    "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just",
    "let", "me", "might", "more", "most", "must", "my", "myself", "no", "nor", "not", "now", "of",
    "off", "on", "once", "only", "or", "other", "our", "ours", "out", "over", "own", "please",
    "same", "shall", "she", "should", "so", "some", "such", "than", "that", "the", "their",
    "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "to", "too",
    "under", "until", "up", "us", "very", "via", "was", "we", "were", "what", "when", "where",
    "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours",
];

pub(crate) fn is_stop_word(word: &str) -> bool {
    STOP_WORDS.binary_search(&word).is_ok()
}

/// Han, Kana, Hangul and CJK punctuation-free ideographs: scripts written without spaces.
pub(crate) fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x3100..=0x312F    // Bopomofo
        | 0x31F0..=0x31FF    // Katakana extensions
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0x1100..=0x11FF    // Hangul jamo
        | 0x3130..=0x318F    // Hangul compatibility jamo
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0xFF66..=0xFF9F    // half-width Katakana
        | 0x20000..=0x2FA1F) // supplementary ideographs
}

/// Thai, Lao, Myanmar and Khmer: written without spaces between words, with vowel signs
/// and tone marks that combine with the letter before them.
pub(crate) fn is_unspaced(c: char) -> bool {
    matches!(c as u32,
        0x0E00..=0x0E7F      // Thai
        | 0x0E80..=0x0EFF    // Lao
        | 0x1000..=0x109F    // Myanmar
        | 0xAA60..=0xAA7F    // Myanmar extended-A
        | 0x1780..=0x17FF    // Khmer
        | 0x19E0..=0x19FF) // Khmer symbols
}

/// Options for [`tokenize`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenOpts {
    /// Also emit the concatenation of adjacent word parts (`web_fetch` -> `webfetch`), so a
    /// query written as one word still meets a split identifier.
    pub(crate) joins: bool,
}

/// Appends the index terms of `text` to `out` (duplicates kept; callers count them).
pub(crate) fn tokenize(text: &str, opts: TokenOpts, out: &mut Vec<String>) {
    // One spelling per text: NFKC composes decomposed accents (`e` + U+0301 is `é`) and
    // folds compatibility forms (full-width `ＣＳＶ` is `CSV`), so a query meets a
    // description whichever form either was written in. Most text already is NFKC.
    let normalized: String;
    let text = match is_nfkc_quick(text.chars()) {
        IsNormalized::Yes => text,
        _ => {
            normalized = text.nfkc().collect();
            &normalized
        }
    };
    let mut word = String::new();
    let mut cjk = Vec::new();
    // Clusters (a letter and the marks that combine with it) of an unspaced-script run.
    let mut clusters: Vec<String> = Vec::new();
    // The lower-cased parts of the current identifier-like chunk, for joins.
    let mut parts: Vec<String> = Vec::new();
    let mut whole: Vec<String> = Vec::new();
    // Invisible format characters inside words (zero-width joiner and non-joiner, word
    // joiner, soft hyphen, byte-order mark) change how a word is drawn, not which word
    // it is: skipped, so `क्‍ष` meets `क्ष` and a Persian word with a ZWNJ stays one word.
    let mut chars = text
        .chars()
        .filter(|c| {
            !matches!(
                c,
                '\u{200C}' | '\u{200D}' | '\u{2060}' | '\u{00AD}' | '\u{FEFF}'
            )
        })
        .peekable();
    while let Some(c) = chars.next() {
        if is_unspaced(c) {
            flush_word(&mut word, &mut parts, &mut whole);
            emit_parts(&mut parts, &mut whole, opts, out);
            flush_cjk(&mut cjk, out);
            match clusters.last_mut() {
                Some(last) if is_combining_mark(c) => last.push(c),
                _ => clusters.push(c.to_string()),
            }
            continue;
        }
        flush_clusters(&mut clusters, out);
        if is_cjk(c) {
            flush_word(&mut word, &mut parts, &mut whole);
            cjk.push(c);
            continue;
        }
        flush_cjk(&mut cjk, out);
        // A combining mark left after composition (most scripts' vowel signs) belongs to
        // the word it follows.
        if c.is_alphanumeric() || (is_combining_mark(c) && !word.is_empty()) {
            word.push(c);
            continue;
        }
        flush_word(&mut word, &mut parts, &mut whole);
        // `_`, `-`, `.` and `/` join the parts of one identifier; anything else ends it.
        let joiner = matches!(c, '_' | '-' | '.' | '/' | ':')
            && chars.peek().is_some_and(|n| n.is_alphanumeric() || *n == c);
        if !joiner {
            emit_parts(&mut parts, &mut whole, opts, out);
        }
    }
    flush_word(&mut word, &mut parts, &mut whole);
    emit_parts(&mut parts, &mut whole, opts, out);
    flush_cjk(&mut cjk, out);
    flush_clusters(&mut clusters, out);
}

/// Splits one alphanumeric run on camelCase boundaries into lower-cased parts.
fn flush_word(word: &mut String, parts: &mut Vec<String>, whole: &mut Vec<String>) {
    if word.is_empty() {
        return;
    }
    let chars: Vec<char> = word.chars().collect();
    let mut start = 0;
    for i in 1..chars.len() {
        let (prev, cur) = (chars[i - 1], chars[i]);
        let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
        // fooBar | HTMLParser (split before the last capital of a run followed by lower case)
        let boundary = cur.is_uppercase()
            && (prev.is_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_uppercase() && next_lower));
        if boundary {
            parts.push(chars[start..i].iter().collect::<String>().to_lowercase());
            start = i;
        }
    }
    parts.push(chars[start..].iter().collect::<String>().to_lowercase());
    // A word that was split is also kept whole (`arXiv` -> `ar`, `xiv`, `arxiv`).
    if start > 0 {
        whole.push(word.to_lowercase());
    }
    word.clear();
}

fn emit_parts(
    parts: &mut Vec<String>,
    whole: &mut Vec<String>,
    opts: TokenOpts,
    out: &mut Vec<String>,
) {
    for part in parts.iter().chain(whole.iter()) {
        push_term(part, out);
    }
    whole.clear();
    if opts.joins && parts.len() > 1 {
        for pair in parts.windows(2) {
            let joined = format!("{}{}", pair[0], pair[1]);
            push_term(&joined, out);
        }
    }
    parts.clear();
}

fn push_term(part: &str, out: &mut Vec<String>) {
    // Single Latin letters carry nothing (`s` of "what's", `a`); single digits are kept.
    let mut chars = part.chars();
    if let (Some(c), None) = (chars.next(), chars.next())
        && c.is_ascii_alphabetic()
    {
        return;
    }
    if is_stop_word(part) {
        return;
    }
    out.push(stem(part));
}

fn flush_cjk(run: &mut Vec<char>, out: &mut Vec<String>) {
    // Each character, then the bigram it starts: a query cut at its term cap keeps both
    // kinds for the text it reaches (all unigrams first would leave a long sentence with
    // no bigram at all).
    for (i, c) in run.iter().enumerate() {
        out.push(c.to_string());
        if let Some(next) = run.get(i + 1) {
            out.push([*c, *next].iter().collect());
        }
    }
    run.clear();
}

/// An unspaced-script run, as the bigrams of its clusters: a word of these scripts is a few
/// clusters long, so a word of the query meets the same word inside a longer run of a
/// description (the run as one term would only meet the same whole run). A run of one
/// cluster is its own term.
fn flush_clusters(run: &mut Vec<String>, out: &mut Vec<String>) {
    match run.as_slice() {
        [] => {}
        [one] => out.push(one.clone()),
        _ => {
            for pair in run.windows(2) {
                out.push(format!("{}{}", pair[0], pair[1]));
            }
        }
    }
    run.clear();
}

fn has_vowel(s: &str) -> bool {
    s.bytes()
        .any(|b| matches!(b, b'a' | b'e' | b'i' | b'o' | b'u' | b'y'))
}

/// A light English suffix stemmer: plurals, `-ing`, `-ed`, `-ation`, and a final `e`, so that
/// "create", "creates", "created", "creating" and "creation" all meet. Not Porter: it only
/// has to map related forms to one key, never to produce a word.
pub(crate) fn stem(word: &str) -> String {
    if word.len() <= 3 || !word.is_ascii() || word.bytes().any(|b| b.is_ascii_digit()) {
        return word.to_owned();
    }
    if matches!(word, "news" | "series" | "species" | "always" | "during") {
        return word.to_owned();
    }
    let mut w = word.to_owned();
    // Plurals.
    if let Some(base) = w.strip_suffix("ies").filter(|b| b.len() >= 2) {
        w = format!("{base}y");
    } else if w.ends_with("sses") {
        w.truncate(w.len() - 2);
    } else if w.ends_with('s') && !w.ends_with("ss") && !w.ends_with("us") && !w.ends_with("is") {
        w.truncate(w.len() - 1);
    }
    // Verb endings.
    let mut stripped = false;
    for suffix in ["ing", "ed"] {
        if let Some(base) = w.strip_suffix(suffix)
            && base.len() >= 3
            && has_vowel(base)
            && !w.ends_with("eed")
        {
            w = base.to_owned();
            stripped = true;
            break;
        }
    }
    if stripped {
        // running -> runn -> run (but keep install, process, buzz).
        let b = w.as_bytes();
        let n = b.len();
        if n >= 3 && b[n - 1] == b[n - 2] && !matches!(b[n - 1], b'l' | b's' | b'z') {
            w.truncate(n - 1);
        }
    }
    // Nominalisations: creation -> creat(e), visualization -> visualiz(e).
    if let Some(base) = w.strip_suffix("ization").filter(|b| b.len() >= 3) {
        w = format!("{base}iz");
    } else if let Some(base) = w.strip_suffix("ation").filter(|b| b.len() >= 3) {
        w = format!("{base}at");
    }
    if w.len() > 3 && w.ends_with('e') && !w.ends_with("ee") {
        w.truncate(w.len() - 1);
    }
    w
}

/// Generic tool vocabulary: a query term on the left also looks for the terms on the right
/// (at a lower weight). Verbs tools are commonly named with, and file-format abbreviations.
const RELATED: &[(&str, &[&str])] = &[
    ("save", &["write"]),
    ("store", &["write", "save"]),
    ("write", &["save"]),
    ("find", &["search"]),
    ("search", &["find"]),
    ("lookup", &["search", "find"]),
    ("fetch", &["get", "retrieve"]),
    ("retrieve", &["get", "fetch"]),
    ("get", &["fetch"]),
    ("delete", &["remove"]),
    ("remove", &["delete"]),
    ("make", &["create"]),
    ("create", &["new"]),
    ("show", &["display", "list", "view"]),
    ("display", &["show", "view"]),
    ("run", &["execute"]),
    ("execute", &["run"]),
    ("edit", &["modify", "update"]),
    ("modify", &["edit", "update"]),
    ("update", &["edit", "modify"]),
    ("picture", &["image"]),
    ("photo", &["image"]),
    ("image", &["picture"]),
    ("img", &["image"]),
    ("folder", &["directory"]),
    ("directory", &["folder"]),
    ("dir", &["directory", "folder"]),
    ("repo", &["repository"]),
    ("repository", &["repo"]),
    ("md", &["markdown"]),
    ("ppt", &["powerpoint", "presentation"]),
    ("pptx", &["powerpoint", "presentation"]),
    ("slides", &["presentation"]),
    ("doc", &["document", "word"]),
    ("docx", &["document", "word"]),
    ("xls", &["excel", "spreadsheet"]),
    ("xlsx", &["excel", "spreadsheet"]),
    ("spreadsheet", &["excel"]),
    ("csv", &["table"]),
    ("website", &["web", "page"]),
    ("webpage", &["web", "page"]),
    ("url", &["web", "page"]),
];

fn related() -> &'static std::collections::HashMap<String, Vec<String>> {
    static MAP: std::sync::OnceLock<std::collections::HashMap<String, Vec<String>>> =
        std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        RELATED
            .iter()
            .map(|(from, to)| (stem(from), to.iter().map(|t| stem(t)).collect()))
            .collect()
    })
}

/// Extra query terms at weight `weight`: related tool vocabulary for the query's terms, and
/// `file` when the query names a file path or a file with an extension.
pub(crate) fn expand_query(query: &str, terms: &[String], weight: f64) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = terms.iter().map(|t| (t.clone(), 1.0)).collect();
    let add = |t: &str, out: &mut Vec<(String, f64)>| {
        if !out.iter().any(|(have, _)| have == t) {
            out.push((t.to_owned(), weight));
        }
    };
    for t in terms {
        if let Some(more) = related().get(t) {
            for m in more {
                add(m, &mut out);
            }
        }
    }
    if query.split_whitespace().any(looks_like_path) {
        add(&stem("file"), &mut out);
    }
    out
}

/// The stemmed terms of each capability `query` implies ([`implied_needs`]), one list a
/// capability.
pub(crate) fn implied_terms(query: &str) -> Vec<Vec<String>> {
    implied_needs(query)
        .into_iter()
        .map(|need| need.terms.iter().map(|t| stem(t)).collect())
        .collect()
}

/// A capability a request needs without naming it, recognised from the kind of thing the
/// request mentions rather than from its words for a tool: a place needs a geocoder, an
/// amount to work out a calculator, goods to buy a shop's web pages, a result sent to a text
/// file (`save it to /root/notes.md`) a file writer.
///
/// Measured and left out: a clock for a date relative to today ("tomorrow", "next
/// Wednesday", "the last 24h"). On livemcpbench it pushed needed tools out of the top 5 of
/// more requests than it brought a clock into (recall@5 −1.2 to −1.5, on both halves).
#[derive(Debug, PartialEq)]
pub(crate) struct Need {
    /// What the request mentions, for tests and diagnostics.
    pub(crate) kind: &'static str,
    /// The words tools that provide the capability are named and described with.
    pub(crate) terms: &'static [&'static str],
}

const PLACE: Need = Need {
    kind: "place",
    terms: &["geocode", "location", "address", "coordinates"],
};
const ARITHMETIC: Need = Need {
    kind: "amount to work out",
    terms: &["calculate", "expression", "math"],
};
const SHOPPING: Need = Need {
    kind: "goods to buy",
    terms: &["browser", "navigate", "page", "web"],
};

/// Verbs of working a number out.
const RECKON: &[&str] = &[
    "calculate",
    "calculating",
    "compute",
    "computing",
    "estimate",
    "estimating",
];
/// Words of buying.
const BUYING: &[&str] = &[
    "buy",
    "buying",
    "purchase",
    "purchasing",
    "shop",
    "shopping",
];

const TEXT_FILE: Need = Need {
    kind: "text file to write",
    terms: &["write", "file"],
};

/// Verbs of producing something.
const PRODUCING: &[&str] = &[
    "compose", "create", "draft", "export", "generate", "give", "make", "output", "produce", "put",
    "save", "saved", "store", "write", "writing",
];
/// Prepositions before the place a result goes.
const TO_PLACE: &[&str] = &["as", "at", "in", "into", "on", "to", "under"];
/// Extensions of files a file writer writes as text: documents, web pages, data, code.
const TEXT_FORMATS: &[&str] = &[
    "c", "cpp", "css", "csv", "go", "h", "htm", "html", "java", "js", "json", "jsx", "kt",
    "markdown", "md", "php", "py", "rb", "rs", "rst", "sh", "sql", "swift", "tex", "toml", "ts",
    "tsv", "tsx", "txt", "xml", "yaml", "yml",
];

/// The capabilities `query` implies (see [`Need`]), each once.
pub(crate) fn implied_needs(query: &str) -> Vec<&'static Need> {
    let mut out: Vec<&'static Need> = Vec::new();
    if names_a_place(query) {
        out.push(&PLACE);
    }
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let any_of = |set: &[&str]| words.iter().any(|w| set.contains(&w.as_str()));
    if any_of(RECKON) {
        out.push(&ARITHMETIC);
    }
    if any_of(BUYING) {
        out.push(&SHOPPING);
    }
    if writes_a_text_file(query) {
        out.push(&TEXT_FILE);
    }
    out
}

/// Whether `query` sends a result to a text file: a verb of producing ([`PRODUCING`]) and,
/// after it in the same sentence, a file path with a text extension ([`TEXT_FORMATS`])
/// right after a preposition of place ("save it to /root/notes.md", "write a report in
/// ./out/report.md"); not a file it reads ("line 10 of /root/log.txt", "count the rows in
/// /root/make_list.csv": the verb must be a word of the request, not of a path).
fn writes_a_text_file(query: &str) -> bool {
    let words: Vec<&str> = query.split_whitespace().collect();
    let mut producing = false;
    for (i, word) in words.iter().enumerate() {
        let is_path = looks_like_path(word);
        if is_path {
            let to_place = i > 0 && TO_PLACE.contains(&words[i - 1].to_lowercase().as_str());
            let path = word.trim_end_matches(|c: char| !c.is_alphanumeric());
            let text = path.rsplit_once('.').is_some_and(|(stem, ext)| {
                !stem.is_empty()
                    && !ext.contains('/')
                    && TEXT_FORMATS.contains(&ext.to_lowercase().as_str())
            });
            if producing && to_place && text {
                return true;
            }
        } else {
            let bare: String = word
                .chars()
                .filter(|c| c.is_alphanumeric())
                .collect::<String>()
                .to_lowercase();
            if PRODUCING.contains(&bare.as_str()) {
                producing = true;
            }
        }
        // A sentence ends at its full stop (not a path's dot, handled above).
        if !is_path && (word.ends_with('.') || word.ends_with('?') || word.ends_with('!')) {
            producing = false;
        }
    }
    false
}

/// Prepositions of place.
const AT_PLACE: &[&str] = &["around", "at", "from", "in", "near", "to"];

/// Whether `query` names a place: a capitalised word after a preposition of place ("in
/// Paris", "from Beijing to Tianjin", "near the Eiffel Tower"), not at the start of the
/// request, and not a word in capitals (`in PDF`) or of mixed case (`to GitHub`).
fn names_a_place(query: &str) -> bool {
    let words: Vec<&str> = query.split_whitespace().collect();
    (1..words.len().saturating_sub(1)).any(|i| {
        if !AT_PLACE.contains(&words[i].to_lowercase().as_str()) {
            return false;
        }
        let mut name = words[i + 1];
        if name.eq_ignore_ascii_case("the") {
            match words.get(i + 2) {
                Some(next) => name = next,
                None => return false,
            }
        }
        let name = name.trim_matches(|c: char| !c.is_alphanumeric());
        let mut chars = name.chars();
        chars.next().is_some_and(char::is_uppercase)
            && name.chars().count() > 1
            && chars.all(|c| c.is_lowercase() || c == '-')
    })
}

/// The terms of `query` that occur only inside file paths (`/root/markdown/report.md` ->
/// `root`, `markdown`, `report`, `md`): a path names where data goes or comes from, its
/// folder and file names mostly echo the request, so they weigh less than the words around
/// them. The file extension is kept at full weight (it names the format).
pub(crate) fn path_only_terms(query: &str) -> Vec<String> {
    let (mut in_paths, mut in_text) = (Vec::new(), Vec::new());
    for word in query.split_whitespace() {
        if looks_like_path(word) {
            let w = word.trim_matches(|c: char| !c.is_alphanumeric());
            let (body, ext) = match w.rsplit_once('.') {
                Some((b, e)) if !e.contains('/') => (b, Some(e)),
                _ => (w, None),
            };
            tokenize(body, TokenOpts { joins: false }, &mut in_paths);
            if let Some(e) = ext {
                tokenize(e, TokenOpts { joins: false }, &mut in_text);
            }
        } else {
            tokenize(word, TokenOpts { joins: false }, &mut in_text);
        }
    }
    let in_text: std::collections::HashSet<String> = in_text.into_iter().collect();
    in_paths.retain(|t| !in_text.contains(t));
    in_paths
}

/// Conversational words of a request that rarely name what a tool does ("help me", "give
/// me", "I want", "tell me"); a query weighs them less.
const FILLER: &[&str] = &[
    "give", "help", "kindly", "know", "like", "need", "tell", "thank", "thanks", "want",
];

pub(crate) fn is_filler(term: &str) -> bool {
    static STEMMED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    STEMMED
        .get_or_init(|| FILLER.iter().map(|f| stem(f)).collect())
        .iter()
        .any(|f| f == term)
}

/// `/root/x`, `./a/b`, `C:\dir`, `report.md`, `data.xlsx` (not `e.g.` or a version number).
fn looks_like_path(word: &str) -> bool {
    let w = word.trim_matches(|c: char| matches!(c, ',' | ';' | ')' | '(' | '"' | '\'' | '`'));
    let w = w.strip_suffix('.').unwrap_or(w);
    if w.contains("://") {
        return false;
    }
    if (w.starts_with('/') || w.starts_with("./") || w.starts_with("~/")) && w.len() > 1 {
        return true;
    }
    if w.len() > 3 && w.as_bytes()[1] == b':' && w.as_bytes()[2] == b'\\' {
        return true;
    }
    match w.rsplit_once('.') {
        Some((stem, ext)) => {
            !stem.is_empty()
                && stem.chars().any(char::is_alphanumeric)
                && (2..=5).contains(&ext.len())
                && ext.chars().all(|c| c.is_ascii_alphanumeric())
                && ext.chars().any(|c| c.is_ascii_alphabetic())
                && !stem.contains('.')
                // A decimal with its unit (`9.5g`, `1.2GB`), not a file name.
                && !(stem.chars().all(|c| c.is_ascii_digit())
                    && ext.starts_with(|c: char| c.is_ascii_digit()))
                && !matches!(
                    ext,
                    "com" | "org" | "net" | "io" | "cn" | "dev" | "ai" | "gov"
                )
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        tokenize(s, TokenOpts { joins: false }, &mut out);
        out
    }

    #[test]
    fn stop_word_list_is_sorted_for_binary_search() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn identifiers_split() {
        assert_eq!(
            toks("getCurrentStockPrice"),
            ["get", "current", "stock", "pric", "getcurrentstockpric"]
        );
        assert_eq!(toks("read_file"), ["read", "fil"]);
        assert_eq!(toks("fs.list-dir"), ["fs", "list", "dir"]);
        assert_eq!(toks("HTMLParser"), ["html", "parser", "htmlparser"]);
        assert_eq!(
            toks("mcp__git__git_status"),
            ["mcp", "git", "git", "status"]
        );
    }

    #[test]
    fn stemmer_meets_related_forms() {
        for group in [
            &["create", "creates", "created", "creating", "creation"][..],
            &["search", "searches", "searching", "searched"],
            &["company", "companies"],
            &["run", "running"],
            &["install", "installing"],
            &["visualize", "visualization"],
        ] {
            let first = stem(group[0]);
            for w in group {
                assert_eq!(stem(w), first, "{w}");
            }
        }
        assert_eq!(stem("string"), "string");
        assert_eq!(stem("status"), "status");
        assert_eq!(stem("news"), "news");
    }

    #[test]
    fn paths_are_recognised() {
        for w in [
            "/root/pdf",
            "report.md",
            "(data.xlsx)",
            "./a/b",
            "~/notes",
            "C:\\x\\y",
        ] {
            assert!(looks_like_path(w), "{w}");
        }
        for w in [
            "e.g.",
            "v1.2",
            "www.baidu.com",
            "https://x.org/a",
            "end.",
            "/",
            "9.5g",
            "1.2GB,",
        ] {
            assert!(!looks_like_path(w), "{w}");
        }
    }

    #[test]
    fn a_combining_mark_stays_in_its_word() {
        // `q` with an acute accent has no composed form: the mark must not split the word.
        assert_eq!(toks("q\u{301}uery"), ["q\u{301}uery"]);
    }

    #[test]
    fn cjk_runs_become_unigrams_and_bigrams() {
        assert_eq!(
            toks("搜索网页"),
            ["搜", "搜索", "索", "索网", "网", "网页", "页"]
        );
        assert_eq!(toks("bing搜索"), ["bing", "搜", "搜索", "索"]);
    }

    #[test]
    fn unspaced_script_runs_become_cluster_bigrams() {
        // Thai "search web": the tone mark U+0E49 stays on its letter.
        assert_eq!(toks("ค้นหาเว็บ"), ["ค้น", "นห", "หา", "าเ", "เว็", "ว็บ"]);
        assert_eq!(toks("pdfไฟล์"), ["pdf", "ไฟ", "ฟล์"]);
        assert_eq!(toks("ก"), ["ก"]);
    }
}
