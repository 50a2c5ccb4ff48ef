//! Quiver's end-to-end suite: architecture rules and, as the product grows, runs against real
//! peers.

mod architecture;
mod conformance_client;
mod identity;
mod mcp_server;
mod replicas;
mod skills;
mod wire_text;
