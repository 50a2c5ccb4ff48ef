//! The MCP protocol versions this crate handles, oldest first, and what sets them apart: a
//! path that speaks only some of them asks a [`Protocol`] what it allows instead of keeping
//! its own list of version strings.

/// One MCP protocol version, in the order the specification published them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Protocol {
    /// 2024-11-05: sessions open with `initialize`; HTTP is the older HTTP+SSE transport.
    V2024_11_05,
    /// 2025-03-26: streamable HTTP (`Mcp-Session-Id`), and JSON-RPC batches.
    V2025_03_26,
    /// 2025-06-18: batches gone.
    V2025_06_18,
    /// 2025-11-25: the last version with an `initialize` handshake and sessions.
    V2025_11_25,
    /// 2026-07-28: no handshake and no session; each request carries the protocol's fields
    /// in its `_meta` and its `Mcp-*` headers.
    V2026_07_28,
}

impl Protocol {
    /// Every version, oldest first.
    pub(crate) const ALL: [Protocol; 5] = [
        Protocol::V2024_11_05,
        Protocol::V2025_03_26,
        Protocol::V2025_06_18,
        Protocol::V2025_11_25,
        Protocol::V2026_07_28,
    ];

    /// What the client offers an upstream in its handshake: the newest version that has one.
    pub(crate) const OFFERED: Protocol = Protocol::V2025_11_25;

    /// The version as the wire names it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Protocol::V2024_11_05 => "2024-11-05",
            Protocol::V2025_03_26 => "2025-03-26",
            Protocol::V2025_06_18 => "2025-06-18",
            Protocol::V2025_11_25 => "2025-11-25",
            Protocol::V2026_07_28 => "2026-07-28",
        }
    }

    /// The version the wire names `version`, if this crate knows it.
    pub(crate) fn parse(version: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.as_str() == version)
    }

    /// Whether it opens a session with `initialize` (every version before 2026-07-28): the
    /// versions the client accepts from an upstream.
    pub(crate) fn has_session(self) -> bool {
        self <= Protocol::V2025_11_25
    }

    /// Whether its HTTP transport is streamable HTTP (2025-03-26 on).
    pub(crate) fn streamable_http(self) -> bool {
        self >= Protocol::V2025_03_26
    }

    /// Whether a client may send JSON-RPC batches (2025-03-26 only).
    pub(crate) fn batches(self) -> bool {
        self == Protocol::V2025_03_26
    }

    /// The version as rmcp names it.
    pub(crate) fn rmcp(self) -> rmcp::model::ProtocolVersion {
        use rmcp::model::ProtocolVersion as V;
        match self {
            Protocol::V2024_11_05 => V::V_2024_11_05,
            Protocol::V2025_03_26 => V::V_2025_03_26,
            Protocol::V2025_06_18 => V::V_2025_06_18,
            Protocol::V2025_11_25 => V::V_2025_11_25,
            Protocol::V2026_07_28 => V::V_2026_07_28,
        }
    }
}
