use async_trait::async_trait;
use quiver_store_postgres::{PgOptions, PgStore};
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

    async fn another(&mut self) -> PgStore {
        self.store().await
    }

    async fn close(&mut self, store: PgStore) {
        store.close().await.expect("close");
    }
}
