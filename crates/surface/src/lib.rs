//! The per-session tool surface: the crate composes which tools a session's model sees and
//! how they are found. Its [`search`] module is the lexical search index behind
//! `tool_search`.

pub mod search;
