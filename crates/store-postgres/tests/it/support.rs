use std::time::Duration;

use async_trait::async_trait;
use quiver_store_postgres::{Durability, PgOptions, PgStore};
use quiver_store_testkit::{Backend, TestPostgres};

/// A server of the test's own, with one database for Quiver.
pub(crate) struct Pg {
    pub(crate) server: TestPostgres,
    pub(crate) url: String,
}

impl Pg {
    pub(crate) fn new() -> Self {
        let server = TestPostgres::start();
        server.create_database("quiver");
        let url = server.url("quiver");
        Pg { server, url }
    }

    /// A store on the test's database.
    pub(crate) async fn store(&self) -> PgStore {
        PgStore::open(&self.url, PgOptions::default())
            .await
            .expect("open the PostgreSQL store")
    }
}

#[async_trait]
impl Backend for Pg {
    type Store = PgStore;

    async fn open(&mut self) -> PgStore {
        self.store().await
    }

    async fn open_with(&mut self, durability: Durability, linger: Duration) -> PgStore {
        let options = PgOptions::default()
            .with_durability(durability)
            .with_linger(linger);
        PgStore::open(&self.url, options)
            .await
            .expect("open the PostgreSQL store")
    }

    async fn another(&mut self) -> PgStore {
        self.store().await
    }

    async fn close(&mut self, store: PgStore) {
        store.close().await.expect("close");
    }
}
