//! The store ports' shared contract suite (`quiver-store-testkit`), run against PostgreSQL:
//! a server per case; another handle is another pool on the same database (another
//! replica).

quiver_store_testkit::contract_suite!(crate::support::Pg::new());
