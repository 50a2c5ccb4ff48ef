//! For tests only. The store ports' contract suite ([`contract`]): one set of cases that
//! every store adapter's tests run against their own backend through [`contract_suite!`],
//! so that the SQLite and the PostgreSQL stores are held to the same behaviour. And
//! [`TestPostgres`]: a throwaway PostgreSQL server in a temp dir (`initdb`, `pg_ctl` on a
//! free port, as the `postgres` user when the test runs as root), stopped when dropped, even
//! by a panicking test. A test that needs it fails, never skips, when it cannot start.

pub mod contract;
mod pg;

pub use contract::Backend;
pub use pg::{PASSWORD as PASSWORD_FOR_TESTS, ServerTls, TestPostgres};
