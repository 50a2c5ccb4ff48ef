//! What of a configured URL or header may be shown: a URL without its user, password, query
//! or a path segment that looks like a key, and which headers carry a credential.

use reqwest::header::HeaderName;

/// Whether a configured header carries a credential: `Authorization`,
/// `Proxy-Authorization`, `Cookie`, or a name that says so (`X-API-Key`, `X-Auth-Token`,
/// `Api-Secret`, ...).
pub(super) fn carries_credential(name: &HeaderName) -> bool {
    let name = name.as_str();
    ["authorization", "proxy-authorization", "cookie"].contains(&name)
        || [
            "api-key", "apikey", "api_key", "token", "secret", "password",
        ]
        .iter()
        .any(|w| name.contains(w))
}

/// `text` with every `http://` or `https://` URL in it (any case) shown without its user,
/// password, query and fragment (`?…`): the parts that may carry a secret an
/// `${env:...}` put there. A URL runs to the next whitespace (a query may hold `,` or
/// `)`); punctuation that ends the sentence after it (`)`, `:`, `,`, `.`) is kept.
pub fn redact_urls(text: &str) -> String {
    // ASCII lower-casing keeps every byte offset.
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    while let Some(at) = ["http://", "https://"]
        .iter()
        .filter_map(|scheme| lower[from..].find(scheme).map(|i| from + i))
        .min()
    {
        out.push_str(&text[from..at]);
        let end = text[at..]
            .find(char::is_whitespace)
            .map_or(text.len(), |i| at + i);
        out.push_str(&redact_one(&text[at..end]));
        from = end;
    }
    out.push_str(&text[from..]);
    out
}

/// One URL (or URL-like value) without its user part, query and fragment.
pub(super) fn redact_one(url: &str) -> String {
    let (scheme, after) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    // The sentence's punctuation after the URL.
    let body = after.trim_end_matches([')', ':', ',', '.', ';', '"', '\'']);
    let tail = &after[body.len()..];
    let authority_len = body.find(['/', '?', '#']).unwrap_or(body.len());
    let (authority, path) = body.split_at(authority_len);
    let mut out = String::from(scheme);
    match authority.rfind('@') {
        Some(i) => {
            out.push_str("…@");
            out.push_str(&authority[i + 1..]);
        }
        None => out.push_str(authority),
    }
    let (path, query) = match path.find(['?', '#']) {
        Some(q) => (&path[..q], true),
        None => (path, false),
    };
    // A path segment that looks like a key (hosted MCP servers put theirs there: long,
    // letters and digits) is hidden too.
    let segments: Vec<&str> = path
        .split('/')
        .map(|seg| if looks_like_key(seg) { "…" } else { seg })
        .collect();
    out.push_str(&segments.join("/"));
    if query {
        out.push_str("?…");
    }
    out.push_str(tail);
    out
}

/// A URL path segment that is probably a secret: 20 characters or more of letters,
/// digits, `-` and `_`, with both letters and digits.
fn looks_like_key(segment: &str) -> bool {
    segment.len() >= 20
        && segment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        && segment.chars().any(|c| c.is_ascii_digit())
        && segment.chars().any(|c| c.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_user_password_or_query() {
        assert_eq!(
            redact_urls(
                "error sending request for url (http://me:pw@example.com:8/mcp?api_key=sekrit#x): refused"
            ),
            "error sending request for url (http://…@example.com:8/mcp?…): refused"
        );
        assert_eq!(
            redact_urls("to https://h/mcp, then http://[::1]:9/p#frag and back"),
            "to https://h/mcp, then http://[::1]:9/p?… and back"
        );
        assert_eq!(redact_urls("no url here"), "no url here");
        assert_eq!(
            redact_urls("http://é.example/ü?ß=1"),
            "http://é.example/ü?…"
        );
        // A query or password with `,` or `)`; an upper-case scheme.
        assert_eq!(
            redact_urls("url (https://h/search?fields=a,b&api_key=SEKRIT): refused"),
            "url (https://h/search?…): refused"
        );
        assert_eq!(
            redact_urls("to https://user:pa,s)s@host/mcp now"),
            "to https://…@host/mcp now"
        );
        assert_eq!(
            redact_urls("HTTP://u:pw@example.com/mcp?key=S"),
            "HTTP://…@example.com/mcp?…"
        );
        // A value without a scheme (a typo in the config).
        assert_eq!(
            redact_one("mcp.example.com/sse?key=S"),
            "mcp.example.com/sse?…"
        );
        assert_eq!(redact_urls("https://"), "https://");
        // A key in the path, as hosted servers put it.
        assert_eq!(
            redact_urls("url (https://mcp.example.com/api/s/a1b2c3d4e5f6g7h8i9j0k1/sse): refused"),
            "url (https://mcp.example.com/api/s/…/sse): refused"
        );
        assert_eq!(
            redact_urls("https://h/mcp/tools_for_everyone_here"),
            "https://h/mcp/tools_for_everyone_here"
        );
    }
}
