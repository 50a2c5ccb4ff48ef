//! Quiver's end-to-end suite: architecture rules and, as the product grows, runs against real
//! peers.

mod admin_web;
mod architecture;
mod audit_chain;
mod conformance_client;
mod crash;
mod faults;
mod identity;
mod load;
mod mcp_server;
mod progressive;
mod replicas;
mod session_servers;
mod skills;
mod wire_text;
