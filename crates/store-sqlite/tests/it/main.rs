//! Integration tests of the SQLite store, on real database files in temp dirs.

mod crash;
mod definitions;
mod jobs;
mod log;
mod open;
mod session;
mod support;
