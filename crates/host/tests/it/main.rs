//! The `quiver` binary as a user runs it.

mod cli;
mod serve;
mod upstreams;
