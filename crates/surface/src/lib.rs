//! The surface composes the per-session tool surface: which tools a session's model sees (the
//! resident floor, the session's working set, its mode and budgets) and how they are found.
//! Its [`search`] module is the lexical search index behind `tool_search`; [`ports`] holds
//! the ports it consumes ([`ports::SessionStore`], [`ports::UsageSource`]), in its own
//! vocabulary, with in-memory implementations.

pub mod ports;
pub mod search;
