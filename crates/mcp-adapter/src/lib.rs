//! Quiver's MCP edge. The [`server`] module serves a session's composed tool surface over
//! MCP (streamable HTTP and stdio): `tools/list` is the session's surface, `tools/call` goes
//! through the registry's dispatcher, and working-set or catalog changes go out as
//! `notifications/tools/list_changed`. rmcp and axum types appear only in this crate.

pub mod server;

pub use server::{
    AuthError, InboundAuth, InboundToken, McpServer, ServeError, ServerOptions, allowed_authorities,
};
