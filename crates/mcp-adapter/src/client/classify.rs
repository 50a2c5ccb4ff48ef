//! Classifies rmcp failures precisely. EOF, refused or reset connections, broken pipes,
//! "session not found" (HTTP 404 on a streamable-HTTP session) and a child's exit are
//! drops; a JSON-RPC error from the peer never is.

use std::error::Error as StdError;

use rmcp::{
    service::{ClientInitializeError, ServiceError},
    transport::streamable_http_client::StreamableHttpError,
};

use super::upstream::DialError;

/// What a failed request means for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The peer answered with a JSON-RPC error: the connection is fine.
    Peer,
    /// The request timed out (`ServiceError::Timeout`: a send that did not complete in time;
    /// an unanswered call is told `notifications/cancelled` where it waits,
    /// `upstream::call::wait`).
    Timeout,
    /// The connection is gone and the request surely did not go out (refused, a write into
    /// a closed pipe): safe to send again on a new connection.
    Refused,
    /// The connection is gone; the request may or may not have been processed.
    Drop,
    /// The server answered the request with this HTTP status (a 3xx or 4xx rmcp could not
    /// recover from, a 429 or 5xx): the request was refused, and whether the session
    /// survived is not known from it (a refused re-initialize after an expiry is one too).
    Status(u16),
    /// Anything else: the request failed, the connection is not known to be gone.
    Other,
}

/// The status of rmcp's "HTTP 404 Not Found: …" error for a response it could not use.
fn status_of(message: &str) -> Option<u16> {
    let code: u16 = message.strip_prefix("HTTP ")?.get(..3)?.parse().ok()?;
    (300..600).contains(&code).then_some(code)
}

fn chain<'a>(
    e: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(e), |e: &&'a (dyn StdError + 'static)| (*e).source())
}

fn classify_transport(e: &(dyn StdError + 'static)) -> Class {
    for cause in chain(e) {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            match io.kind() {
                K::ConnectionRefused | K::BrokenPipe | K::NotConnected => return Class::Refused,
                K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof => {
                    return Class::Drop;
                }
                _ => {}
            }
        }
        if let Some(r) = cause.downcast_ref::<reqwest::Error>() {
            if r.is_connect() {
                return Class::Refused;
            }
            if r.is_request() || r.is_body() {
                return Class::Drop;
            }
        }
        match cause.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::UnexpectedServerResponse(m)) => {
                if let Some(code) = status_of(m) {
                    return Class::Status(code);
                }
            }
            Some(StreamableHttpError::HttpStatus(h)) => return Class::Status(h.status),
            _ => {}
        }
        if let Some(
            StreamableHttpError::SessionExpired
            | StreamableHttpError::TransportChannelClosed
            | StreamableHttpError::UnexpectedEndOfStream
            | StreamableHttpError::SessionRecoveryTimeout,
        ) = cause.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            return Class::Drop;
        }
        let text = cause.to_string().to_ascii_lowercase();
        if text.contains("session not found") || text.contains("session expired") {
            return Class::Drop;
        }
        if text.contains("connection refused") || text.contains("broken pipe") {
            return Class::Refused;
        }
        if text.contains("connection reset") || text.contains("end of file") {
            return Class::Drop;
        }
    }
    Class::Other
}

/// Whether a request failed with rmcp's "Session expired (HTTP 404)": the server answered
/// it 404, and rmcp's re-initialize and one resend did not get it through.
pub(crate) fn session_expired(e: &ServiceError) -> bool {
    let ServiceError::TransportSend(t) = e else {
        return false;
    };
    chain(t.error.as_ref()).any(|cause| {
        matches!(
            cause.downcast_ref::<StreamableHttpError<reqwest::Error>>(),
            Some(StreamableHttpError::SessionExpired)
        )
    })
}

/// Classifies a failed request.
pub(crate) fn classify_service(e: &ServiceError) -> Class {
    match e {
        ServiceError::McpError(_) => Class::Peer,
        ServiceError::Timeout { .. } => Class::Timeout,
        ServiceError::TransportClosed | ServiceError::Cancelled { .. } => Class::Drop,
        ServiceError::TransportSend(t) => match classify_transport(t.error.as_ref()) {
            Class::Other => Class::Drop,
            c => c,
        },
        _ => Class::Other,
    }
}

/// Classifies a failed handshake: a refusal by the peer is final, everything else is worth
/// retrying. The text is for the operator, never the model.
/// `auth` says what to fix when the server answers 401 or 403 (its token variable).
pub(crate) fn classify_init(e: &ClientInitializeError, auth: &str) -> DialError {
    match e {
        ClientInitializeError::JsonRpcError(d) => {
            DialError::Rejected(format!("initialize refused: {}", d.message))
        }
        ClientInitializeError::ExpectedInitResult(Some(
            rmcp::model::ServerResult::CustomResult(other),
        )) => {
            // rmcp read the answer as some other result: say what the initialize result lacks.
            let why = serde_json::from_value::<rmcp::model::InitializeResult>(other.0.clone())
                .err()
                .map_or_else(
                    || "it is not an initialize result".to_owned(),
                    |e| e.to_string(),
                );
            DialError::Rejected(format!(
                "the server's initialize result cannot be read ({why}); fix the server"
            ))
        }
        ClientInitializeError::NoCompatibleProtocolVersion { .. } => {
            DialError::Rejected(format!("unsupported protocol: {e}"))
        }
        e if e.is_authorization_required() => {
            DialError::Rejected(format!("unauthorized (HTTP 401/403): {auth}"))
        }
        ClientInitializeError::TransportError { error, .. } => {
            for cause in chain(error.error.as_ref()) {
                if let Some(StreamableHttpError::<reqwest::Error>::AuthRequired(_)) =
                    cause.downcast_ref::<StreamableHttpError<reqwest::Error>>()
                {
                    return DialError::Rejected(format!("unauthorized (HTTP 401): {auth}"));
                }
            }
            if chain(error.error.as_ref()).any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| {
                    matches!(
                        io.kind(),
                        std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::UnexpectedEof
                            | std::io::ErrorKind::ConnectionReset
                    )
                })
            }) {
                DialError::Hangup(plain_reason(error.error.as_ref()))
            } else {
                DialError::Transient(plain_reason(error.error.as_ref()))
            }
        }
        ClientInitializeError::ConnectionClosed(_) => DialError::Hangup(plain_reason(e)),
        _ => DialError::Transient(plain_reason(e)),
    }
}

/// Whether an error text names Rust types (`rmcp::transport::…`); an IPv6 address in
/// brackets (`http://[::1]:9/mcp`) does not count.
fn names_rust_types(text: &str) -> bool {
    let mut rest = text;
    let mut outside = String::with_capacity(text.len());
    while let Some(open) = rest.find('[') {
        outside.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find(']') {
            Some(close) if is_ipv6(&after[..close]) => {
                rest = &after[close + 1..];
            }
            _ => {
                outside.push('[');
                rest = after;
            }
        }
    }
    outside.push_str(rest);
    outside.contains("::")
}

/// An IPv6 address as a URL writes it in brackets: hex digits, `:` and `.`, then maybe
/// `%` and a zone (`fe80::1%25eth0`).
fn is_ipv6(text: &str) -> bool {
    let (address, zone) = text.split_once('%').unwrap_or((text, ""));
    address.contains(':')
        && address
            .chars()
            .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.'))
        && zone
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// An error's text for the operator, without rmcp's wrappers (their text names Rust types,
/// `Transport [rmcp::transport::worker::WorkerTransport<...>] error`): the outermost
/// message that names no type, and the root cause when it adds to it ("error sending
/// request for url (http://h/mcp): Connection refused (os error 111)").
pub(crate) fn plain_reason(e: &(dyn StdError + 'static)) -> String {
    fn next<'a>(e: &&'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
        // rmcp's `Client(reqwest::Error)` does not give its error as a source: step into it.
        match e.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::Client(inner)) => Some(inner),
            _ => (*e).source(),
        }
    }
    let causes = std::iter::successors(Some(e), next);
    let texts: Vec<String> = causes
        .map(ToString::to_string)
        .filter(|t| !names_rust_types(t) && !t.trim().is_empty())
        .collect();
    let text = match (texts.first(), texts.last()) {
        (Some(first), Some(root)) if first.contains(root.as_str()) => first.clone(),
        (Some(first), Some(root)) => format!("{first}: {root}"),
        _ => e.to_string(),
    };
    // rmcp writes `HTTP 405 Method Not Allowed: {body}`, with a colon before an empty body.
    let mut text = text.trim_end().trim_end_matches(':').to_owned();
    // A URL that is not the MCP endpoint, or a server that only speaks the old SSE
    // transport (it answers the POST with 404 or 405): say where to look.
    let status = std::iter::successors(Some(e), next).find_map(|c| {
        match c.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::UnexpectedServerResponse(m)) => status_of(m),
            _ => None,
        }
    });
    if let Some(code @ (404 | 405)) = status {
        text.push_str(&format!(
            " (the server does not take MCP POSTs at this URL ({code}): check that `url` is its streamable-HTTP endpoint, often ending in /mcp; a server with only the old SSE transport cannot be used)"
        ));
    }
    // A redirect Quiver did not follow: another origin, or a kind that drops the POST's body.
    if let Some(code @ 300..=399) = status {
        text.push_str(&format!(
            " (a redirect ({code}) that Quiver does not follow: it follows only 307 and 308 within the configured origin, so headers and tokens stay with it; if the address the server redirects to is right, set `url` to it)"
        ));
    }
    // A web page, or a login or proxy page, where the MCP endpoint should be.
    let content_type = std::iter::successors(Some(e), next).find_map(|c| match c
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        Some(StreamableHttpError::UnexpectedContentType(t)) => Some(t.clone()),
        _ => None,
    });
    if let Some(t) = content_type {
        text = format!(
            "the server answered with {}, not JSON or an event stream: `url` is probably a web page, or a login or proxy page, not the MCP endpoint",
            t.map_or_else(|| "no content type".to_owned(), |t| format!("`{t}`"))
        );
    }
    // reqwest names the URL, which may carry a secret in its query or user part.
    super::config::redact_urls(&text)
}

#[cfg(test)]
mod tests {
    use super::{Class, classify_transport, names_rust_types};
    use rmcp::transport::streamable_http_client::StreamableHttpError;

    /// A page where the endpoint should be, and a redirect not followed, say what to check
    /// in rmcp's place (`Some("text/html")`, a bare status).
    #[test]
    fn a_web_page_or_a_redirect_is_explained() {
        let e = StreamableHttpError::<reqwest::Error>::UnexpectedContentType(Some(
            "text/html; charset=utf-8".into(),
        ));
        assert_eq!(
            super::plain_reason(&e),
            "the server answered with `text/html; charset=utf-8`, not JSON or an event stream: `url` is probably a web page, or a login or proxy page, not the MCP endpoint"
        );
        let e = StreamableHttpError::<reqwest::Error>::UnexpectedServerResponse(
            "HTTP 307 Temporary Redirect: ".into(),
        );
        let reason = super::plain_reason(&e);
        assert!(
            reason.contains("a redirect (307) that Quiver does not follow")
                && reason.contains("set `url` to it"),
            "{reason}"
        );
    }

    /// rmcp's `HTTP 405 Method Not Allowed: ` (an empty body) loses its dangling colon, and
    /// a 404 or 405 says where to look.
    #[test]
    fn an_endpoint_that_takes_no_mcp_posts_is_explained() {
        for (m, code) in [
            ("HTTP 405 Method Not Allowed: ", 405),
            ("HTTP 404 Not Found: nope", 404),
        ] {
            let e = StreamableHttpError::<reqwest::Error>::UnexpectedServerResponse(m.into());
            let reason = super::plain_reason(&e);
            assert!(
                reason.starts_with(&format!("unexpected server response: HTTP {code}"))
                    && !reason.contains(": (")
                    && !reason.contains("Allowed: ")
                    && reason.contains(&format!(
                        "the server does not take MCP POSTs at this URL ({code})"
                    )),
                "{reason}"
            );
        }
        let e = StreamableHttpError::<reqwest::Error>::UnexpectedServerResponse(
            "HTTP 500 Internal Server Error: ".into(),
        );
        assert_eq!(
            super::plain_reason(&e),
            "unexpected server response: HTTP 500 Internal Server Error"
        );
    }

    /// A 3xx or 4xx rmcp could not use is the server's answer, not a broken stream: the call
    /// was not run, and the status says why.
    #[test]
    fn an_http_status_rmcp_gives_up_on_is_kept() {
        let class = |m: &'static str| {
            classify_transport(
                &StreamableHttpError::<reqwest::Error>::UnexpectedServerResponse(m.into()),
            )
        };
        assert_eq!(
            class("HTTP 404 Not Found: <html>nope</html>"),
            Class::Status(404)
        );
        assert_eq!(class("HTTP 307 Temporary Redirect: "), Class::Status(307));
        assert_eq!(class("HTTP 200 OK: garbage"), Class::Other);
        assert_eq!(class("expected a JSON-RPC message"), Class::Other);
    }

    #[test]
    fn rust_type_names_are_told_from_ipv6_addresses() {
        assert!(names_rust_types(
            "Send message error Transport [rmcp::transport::worker::WorkerTransport<X>] error"
        ));
        assert!(names_rust_types("reqwest::Error { kind: Request }"));
        assert!(!names_rust_types(
            "error sending request for url (http://[::1]:9/mcp): Connection refused"
        ));
        assert!(!names_rust_types("http://[fe80::1%25eth0]:9/mcp"));
        assert!(!names_rust_types("http://[fe80::1%25br-lan]:9/mcp"));
        assert!(!names_rust_types("Connection refused (os error 111)"));
    }
}
