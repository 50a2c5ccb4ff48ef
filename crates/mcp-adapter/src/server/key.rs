//! The working-set key of a request. In order: the client's conversation key (the
//! `_meta["quiver/conversation"]` of the request, else the `Quiver-Conversation` header),
//! the MCP session id, the authenticated token's name, then for a stateless (2026-07-28)
//! request a key of that request alone (`request:<random id>`: two clients that present
//! neither a conversation nor a token never share a working set or a loop-guard history),
//! and finally `anonymous` (a session-era request with none of these, which has no
//! transport to carry one; stdio has its session id). A
//! conversation key is scoped by the token that sent it, so two tokens never share a
//! working set by choosing the same key. The key's type and text forms are the surface's
//! [`SessionKey`].

use quiver_surface::SessionKey;
use rmcp::ErrorData;

/// The request `_meta` field that names the conversation (the working-set key).
pub const CONVERSATION_META: &str = "quiver/conversation";
/// The HTTP header that names the conversation when `_meta` does not.
pub const CONVERSATION_HEADER: &str = "quiver-conversation";

const MAX_KEY_BYTES: usize = 256;

/// What a request carries that can name its working set.
#[derive(Debug, Default)]
pub(crate) struct KeySources<'a> {
    pub(crate) meta_conversation: Option<&'a serde_json::Value>,
    pub(crate) header_conversation: Option<&'a str>,
    pub(crate) session_id: Option<&'a str>,
    pub(crate) principal: Option<&'a str>,
    /// Whether the request is stateless (2026-07-28): with nothing else, it gets a key of
    /// its own.
    pub(crate) stateless: bool,
}

/// The working-set key, or an invalid-params error for a malformed conversation key.
pub(crate) fn working_set_key(src: &KeySources<'_>) -> Result<SessionKey, ErrorData> {
    let conversation = match src.meta_conversation {
        Some(serde_json::Value::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(ErrorData::invalid_params(
                format!("`_meta[\"{CONVERSATION_META}\"]` must be a string"),
                None,
            ));
        }
        None => src.header_conversation,
    };
    if let Some(c) = conversation {
        if c.is_empty() || c.len() > MAX_KEY_BYTES || c.chars().any(char::is_control) {
            return Err(ErrorData::invalid_params(
                format!(
                    "the conversation key (`_meta[\"{CONVERSATION_META}\"]` or the `Quiver-Conversation` header) must be 1 to {MAX_KEY_BYTES} bytes without control characters"
                ),
                None,
            ));
        }
        return Ok(SessionKey::conversation(src.principal, c));
    }
    if let Some(sid) = src.session_id {
        return Ok(SessionKey::mcp_session(sid));
    }
    if let Some(p) = src.principal {
        return Ok(SessionKey::token(p));
    }
    if src.stateless {
        return Ok(SessionKey::request(
            &uuid::Uuid::new_v4().simple().to_string(),
        ));
    }
    Ok(SessionKey::anonymous())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key(src: KeySources<'_>) -> String {
        working_set_key(&src)
            .map(|k| k.to_string())
            .unwrap_or_else(|e| format!("error: {}", e.message))
    }

    #[test]
    fn the_key_falls_back_in_order() {
        let conv = json!("c1");
        let all = KeySources {
            meta_conversation: Some(&conv),
            header_conversation: Some("h1"),
            session_id: Some("s1"),
            principal: Some("alice"),
            stateless: false,
        };
        assert_eq!(key(all), "conv:alice:c1");
        let header = KeySources {
            header_conversation: Some("h1"),
            session_id: Some("s1"),
            ..Default::default()
        };
        assert_eq!(key(header), "conv:h1");
        let session = KeySources {
            session_id: Some("s1"),
            principal: Some("alice"),
            ..Default::default()
        };
        assert_eq!(key(session), "mcp:s1");
        let token = KeySources {
            principal: Some("alice"),
            ..Default::default()
        };
        assert_eq!(key(token), "token:alice");
        assert_eq!(key(KeySources::default()), "anonymous");
        // A stateless request with nothing else: a key of its own, never shared.
        let stateless = || KeySources {
            stateless: true,
            ..Default::default()
        };
        let (a, b) = (key(stateless()), key(stateless()));
        assert!(
            a.starts_with("request:") && b.starts_with("request:"),
            "{a} {b}"
        );
        assert_ne!(a, b, "two stateless requests never share a working set");
        assert_eq!(
            working_set_key(&stateless()).unwrap().kind(),
            quiver_surface::SessionKind::Request
        );
        // A token still names its own working set on a stateless request.
        assert_eq!(
            key(KeySources {
                principal: Some("alice"),
                stateless: true,
                ..Default::default()
            }),
            "token:alice"
        );
    }

    #[test]
    fn a_malformed_conversation_key_is_an_error() {
        let num = json!(3);
        assert!(
            key(KeySources {
                meta_conversation: Some(&num),
                ..Default::default()
            })
            .starts_with("error")
        );
        assert!(
            key(KeySources {
                header_conversation: Some(""),
                ..Default::default()
            })
            .starts_with("error")
        );
        let long = "x".repeat(300);
        assert!(
            key(KeySources {
                header_conversation: Some(&long),
                ..Default::default()
            })
            .starts_with("error")
        );
    }
}
