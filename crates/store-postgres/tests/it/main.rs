//! Integration tests of the PostgreSQL store, against a real server each test starts for
//! itself (`quiver_store_testkit::TestPostgres`) and stops when it ends.

mod chain;
mod contract;
mod open;
mod shared;
mod support;
mod tls;
