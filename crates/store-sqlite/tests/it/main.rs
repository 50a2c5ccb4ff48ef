//! Integration tests of the SQLite store, on real database files in temp dirs.

mod contract;
mod crash;
mod log;
mod open;
mod session;
mod support;
