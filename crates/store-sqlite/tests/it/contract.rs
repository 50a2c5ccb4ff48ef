//! The store ports' shared contract suite (`quiver-store-testkit`), run against SQLite: a
//! new file per case; another handle is another opener of the same file.

use std::{path::PathBuf, time::Duration};

use async_trait::async_trait;
use quiver_store_sqlite::{Durability, SqliteStore, StoreOptions};
use quiver_store_testkit::Backend;
use tempfile::TempDir;

struct Sqlite {
    dir: TempDir,
}

impl Sqlite {
    fn new() -> Self {
        Sqlite {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("quiver.db")
    }
}

#[async_trait]
impl Backend for Sqlite {
    type Store = SqliteStore;

    async fn open(&mut self) -> SqliteStore {
        SqliteStore::open(self.path()).expect("open")
    }

    async fn open_with(&mut self, durability: Durability, linger: Duration) -> SqliteStore {
        let options = StoreOptions::default()
            .with_durability(durability)
            .with_linger(linger);
        SqliteStore::open_with(self.path(), options).expect("open")
    }

    async fn another(&mut self) -> SqliteStore {
        SqliteStore::open(self.path()).expect("another opener")
    }

    async fn close(&mut self, store: SqliteStore) {
        store.close().await.expect("close");
    }
}

quiver_store_testkit::contract_suite!(Sqlite::new());
