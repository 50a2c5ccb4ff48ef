//! Quiver's MCP adapter. The client side (this module tree under [`client`]) connects Quiver to
//! upstream MCP servers with rmcp and publishes their tools into the registry's catalog as
//! ordinary tools named `mcp__<server>__<tool>`; it owns every rmcp type it touches and turns
//! them into `quiver-contract` types at its edge (`client::to_contract`). The server side (the
//! MCP endpoint that serves a session's surface) will live beside it.

pub mod client;
mod error;

pub use client::{
    ClientOptions, Liveness, McpClient, McpClientConfig, ResolvedServer, ServerConfig,
    ServerCounters, ServerState, ServerStatus, TransportKind, validate_all,
};
pub use error::McpError;
