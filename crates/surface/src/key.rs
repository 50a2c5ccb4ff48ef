//! [`SessionKey`]: the key of a working set, typed. Its text form (`conv:…`, `mcp:…`,
//! `token:…`, `request:…`, `anonymous`) is what the store, the execution log and `CallContext::session`
//! carry; only this module spells those prefixes.

use std::{fmt, sync::Arc};

/// What kind of client a [`SessionKey`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SessionKind {
    /// A conversation the client names (`_meta["quiver/conversation"]`, the
    /// `Quiver-Conversation` header, or the CLI's `--session` with `--token`), scoped by the
    /// token that sent it: `conv:<principal>:<id>`, or `conv:<id>` without a token.
    Conversation,
    /// One MCP session (`mcp:<session id>`; on stdio `mcp:stdio:<random id>`).
    McpSession,
    /// Every request of one token that names neither a conversation nor a session
    /// (`token:<principal>`): shared by that token's clients.
    Token,
    /// A request with no conversation, no session and no token (`anonymous`).
    Anonymous,
    /// One stateless (2026-07-28) request with no conversation and no token
    /// (`request:<random id>`): its working set lasts that request, so a tool it finds is
    /// usable within it (through `describe_tool`), and no other client ever sees it.
    Request,
    /// Any other text: a key an operator gives as it is (`quiver call --session S` without
    /// a token, the default session of a context that names none).
    Named,
}

/// The key of one working set (and of its loop-guard history and stored state).
///
/// Built from what a request carries ([`SessionKey::conversation`],
/// [`SessionKey::mcp_session`], [`SessionKey::token`], [`SessionKey::request`],
/// [`SessionKey::anonymous`]) or read
/// back from its text ([`SessionKey::parse`]). Cheap to clone: the text is shared.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    kind: SessionKind,
    text: Arc<str>,
}

const CONVERSATION: &str = "conv:";
const MCP_SESSION: &str = "mcp:";
const TOKEN: &str = "token:";
const ANONYMOUS: &str = "anonymous";
const REQUEST: &str = quiver_contract::REQUEST_SESSION_PREFIX;

impl SessionKey {
    /// The conversation `id` a client names, scoped by the token (`principal`) that sent it,
    /// so two tokens never share a working set by choosing the same id.
    pub fn conversation(principal: Option<&str>, id: &str) -> Self {
        let text = match principal {
            Some(p) => format!("{CONVERSATION}{p}:{id}"),
            None => format!("{CONVERSATION}{id}"),
        };
        SessionKey {
            kind: SessionKind::Conversation,
            text: text.into(),
        }
    }

    /// The working set of one MCP session.
    pub fn mcp_session(session_id: &str) -> Self {
        SessionKey {
            kind: SessionKind::McpSession,
            text: format!("{MCP_SESSION}{session_id}").into(),
        }
    }

    /// The working set every request of token `principal` shares when it names no
    /// conversation and no session.
    pub fn token(principal: &str) -> Self {
        SessionKey {
            kind: SessionKind::Token,
            text: format!("{TOKEN}{principal}").into(),
        }
    }

    /// The key of a request that names no conversation and has no session and no token.
    pub fn anonymous() -> Self {
        SessionKey {
            kind: SessionKind::Anonymous,
            text: ANONYMOUS.into(),
        }
    }

    /// The working set of one stateless request, under a fresh random id.
    pub fn request(id: &str) -> Self {
        SessionKey {
            kind: SessionKind::Request,
            text: format!("{REQUEST}{id}").into(),
        }
    }

    /// The key whose text form is `text` (as stored, logged, or given to the CLI as it is).
    pub fn parse(text: &str) -> Self {
        let kind = if text == ANONYMOUS {
            SessionKind::Anonymous
        } else if text.starts_with(REQUEST) {
            SessionKind::Request
        } else if text.starts_with(CONVERSATION) {
            SessionKind::Conversation
        } else if text.starts_with(MCP_SESSION) {
            SessionKind::McpSession
        } else if text.starts_with(TOKEN) {
            SessionKind::Token
        } else {
            SessionKind::Named
        };
        SessionKey {
            kind,
            text: text.into(),
        }
    }

    /// What kind of client the key names.
    pub fn kind(&self) -> SessionKind {
        self.kind
    }

    /// The text form.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The text form, shared.
    pub fn as_arc(&self) -> &Arc<str> {
        &self.text
    }

    /// The MCP session id of an [`McpSession`](SessionKind::McpSession) key.
    pub fn mcp_session_id(&self) -> Option<&str> {
        match self.kind {
            SessionKind::McpSession => self.text.strip_prefix(MCP_SESSION),
            _ => None,
        }
    }

    /// Whether the key is bound to one MCP session: it never comes back once its session
    /// has ended, or once the process that served it has stopped, so nothing of it is worth
    /// keeping in the store.
    pub fn is_session_bound(&self) -> bool {
        matches!(self.kind, SessionKind::McpSession | SessionKind::Request)
    }

    /// Whether the key names one client, so what that client told Quiver (its roots) may be
    /// used for its calls: a conversation, an MCP session or a named key. A token's key and
    /// the anonymous key are shared by every client that sends them.
    pub fn names_one_client(&self) -> bool {
        !matches!(self.kind, SessionKind::Token | SessionKind::Anonymous)
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKey({:?})", &*self.text)
    }
}

impl std::ops::Deref for SessionKey {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

impl AsRef<str> for SessionKey {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl From<SessionKey> for Arc<str> {
    fn from(key: SessionKey) -> Self {
        key.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_back_from_its_text() {
        for (key, kind) in [
            (
                SessionKey::conversation(Some("ci"), "c1"),
                SessionKind::Conversation,
            ),
            (
                SessionKey::conversation(None, "c1"),
                SessionKind::Conversation,
            ),
            (SessionKey::mcp_session("s1"), SessionKind::McpSession),
            (SessionKey::mcp_session("stdio:ab"), SessionKind::McpSession),
            (SessionKey::token("alice"), SessionKind::Token),
            (SessionKey::anonymous(), SessionKind::Anonymous),
            (SessionKey::parse("default"), SessionKind::Named),
        ] {
            assert_eq!(key.kind(), kind, "{key}");
            assert_eq!(SessionKey::parse(key.as_str()), key);
        }
    }

    #[test]
    fn texts_are_the_stored_forms() {
        assert_eq!(
            SessionKey::conversation(Some("alice"), "c1").as_str(),
            "conv:alice:c1"
        );
        assert_eq!(SessionKey::conversation(None, "h1").as_str(), "conv:h1");
        assert_eq!(SessionKey::mcp_session("s1").as_str(), "mcp:s1");
        assert_eq!(SessionKey::token("alice").as_str(), "token:alice");
        assert_eq!(SessionKey::anonymous().as_str(), "anonymous");
    }

    #[test]
    fn only_mcp_session_keys_are_bound_and_shared_keys_name_no_client() {
        assert_eq!(SessionKey::mcp_session("s1").mcp_session_id(), Some("s1"));
        assert!(SessionKey::mcp_session("s1").is_session_bound());
        assert_eq!(
            SessionKey::conversation(None, "mcp:x").mcp_session_id(),
            None
        );
        assert!(!SessionKey::token("t").names_one_client());
        assert!(!SessionKey::anonymous().names_one_client());
        assert!(SessionKey::parse("default").names_one_client());
        assert!(SessionKey::conversation(Some("t"), "c").names_one_client());
    }
}
