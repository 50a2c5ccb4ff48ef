//! Quiver's MCP adapter. The client side (this module tree under [`client`]) connects Quiver to
//! upstream MCP servers with rmcp and publishes their tools into the registry's catalog as
//! ordinary tools named `mcp__<server>__<tool>`; it owns every rmcp type it touches and turns
//! them into `quiver-contract` types at its edge (`client::to_contract`). The server side
//! ([`server`]) serves a session's composed tool surface over MCP (streamable HTTP in axum,
//! and stdio): `tools/list` is the session's surface, `tools/call` goes through the
//! registry's dispatcher, and working-set or catalog changes go out as
//! `notifications/tools/list_changed`. rmcp and axum types appear only in this crate.
//!
//! The two sides never import each other: what both need lies below them, at the crate root
//! (the content port and list changes in `content`, SSE reading in `sse`, the protocol
//! versions in `protocol`, small wire conversions in `wire`).

pub mod client;
mod content;
mod error;
mod floats;
mod lines;
mod protocol;
pub mod server;
mod session_servers;
mod sse;
mod sync;
mod wire;

pub use client::{
    ClientOptions, INHERITED_ENV, Liveness, McpClient, McpClientConfig, RESOURCE_TOOLS,
    RESOURCE_TOOLS_FAMILY, Reconciled, ResolvedServer, SESSION_IDLE_TIMEOUT,
    SESSION_MAX_PER_PRINCIPAL, ServerConfig, ServerCounters, ServerScope, ServerState,
    ServerStatus, SessionServerStatus, TransportKind, UpstreamAuth, check_delegation,
    interpolate_env, redact_urls, validate_all,
};
pub use client::{
    comparable_definitions, connection_findings, server_list_findings, session_command_findings,
    token_findings, unconnected_server_of,
};
pub use content::{ContentError, ContentOffer, ContentSource, ListChange, ListChanged};
pub use error::McpError;
pub use server::{
    AdminToken, AuthError, AuthHandle, ClaimRule, InboundAuth, InboundToken, LocalPrompts,
    McpServer, MetricsExposition, OidcAuth, PROMPT_ARGUMENT, Readiness, Reload, ServeError,
    ServerOptions, allowed_authorities,
};
pub use session_servers::SessionServers;
