//! Opening: migrations, and each kind of bad input gets a clear error naming the server with
//! its password masked.

use quiver_registry::store::{DefinitionStore, StoreError};
use quiver_store_postgres::{PgOptions, PgStore};
use quiver_store_testkit::TestPostgres;

use crate::support::Pg;

#[tokio::test]
async fn a_new_database_is_migrated_once_and_reopened_as_is() {
    let pg = Pg::new();
    let (a, b) = tokio::join!(
        PgStore::open(&pg.url, PgOptions::default()),
        PgStore::open(&pg.url, PgOptions::default())
    );
    let (a, b) = (a.expect("a"), b.expect("b"));
    let mut found = [a.open_report().found_version, b.open_report().found_version];
    found.sort();
    assert_eq!(
        found,
        [0, a.open_report().schema_version],
        "one of two openers migrates"
    );
    assert_eq!(
        pg.server.psql(
            "quiver",
            "SELECT value FROM quiver_meta WHERE key = 'schema_version'"
        ),
        a.open_report().schema_version.to_string()
    );
    a.close().await.unwrap();
    b.close().await.unwrap();
    // A read-only open of a database with no Quiver tables says what creates them, not
    // `store migrate` alone (which needs a SQLite file to copy from).
    pg.server.create_database("empty");
    let err = PgStore::open(&pg.server.url("empty"), PgOptions::default().read_only())
        .await
        .expect_err("an empty database");
    let StoreError::NotCreated { location, cause } = err else {
        panic!("expected NotCreated, got {err:?}")
    };
    assert!(!location.contains(quiver_store_testkit::PASSWORD_FOR_TESTS));
    assert!(
        cause.contains("the database has no Quiver tables yet, and this command only reads: the first `quiver serve`"),
        "{cause}"
    );
    let read = PgStore::open(&pg.url, PgOptions::default().read_only())
        .await
        .expect("read-only");
    assert!(read.is_read_only());
    let err = read
        .set_enabled("x", true)
        .await
        .expect_err("a read-only store takes no writes");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
}

fn unavailable(e: StoreError) -> String {
    match e {
        StoreError::Unavailable { location, cause } => {
            assert!(
                !location.contains(quiver_store_testkit::PASSWORD_FOR_TESTS),
                "the password is masked: {location}"
            );
            format!("{location}: {cause}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_urls_refused_passwords_and_missing_databases_say_what_to_fix() {
    let server = TestPostgres::start();
    let quick = || PgOptions::default().with_connect_timeout(std::time::Duration::from_secs(3));

    let err = PgStore::open("http://not-a-database", quick())
        .await
        .expect_err("not a URL of PostgreSQL");
    let text = unavailable(err);
    assert!(text.contains("not a PostgreSQL connection URL"), "{text}");

    // A password with an unencoded `@`: said so, not dialled at a host the mask hides.
    let at =
        server
            .url("quiver")
            .replacen(quiver_store_testkit::PASSWORD_FOR_TESTS, "pass@word", 1);
    let text = unavailable(PgStore::open(&at, quick()).await.expect_err("two @"));
    assert!(text.contains("must write it as %40"), "{text}");
    assert!(
        !text.contains("pass@word") && !text.contains("word@"),
        "{text}"
    );

    let wrong = server
        .url("quiver")
        .replace(quiver_store_testkit::PASSWORD_FOR_TESTS, "wrong-password");
    let text = unavailable(PgStore::open(&wrong, quick()).await.expect_err("refused"));
    assert!(text.contains("refused the credentials"), "{text}");
    assert!(text.contains("***"), "{text}");
    assert!(!text.contains("wrong-password"), "{text}");

    let text = unavailable(
        PgStore::open(&server.url("nosuchdb"), quick())
            .await
            .expect_err("no such database"),
    );
    assert!(text.contains("database does not exist"), "{text}");

    // Nothing listens on the port of a stopped server.
    let mut gone = TestPostgres::start();
    let url = gone.url("postgres");
    gone.stop();
    let text = unavailable(
        PgStore::open(&url, quick())
            .await
            .expect_err("nothing there"),
    );
    assert!(text.contains("cannot reach the server"), "{text}");
}

#[tokio::test]
async fn a_database_of_another_application_is_refused_untouched() {
    let server = TestPostgres::start();
    server.create_database("shop");
    server.psql(
        "shop",
        "CREATE TABLE orders (id int); CREATE TABLE customers (id int)",
    );
    let err = PgStore::open(&server.url("shop"), PgOptions::default())
        .await
        .expect_err("another application's database");
    match err {
        StoreError::Corrupt { cause, .. } => {
            assert!(cause.contains("not a Quiver store"), "{cause}");
            assert!(cause.contains("customers, orders"), "{cause}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        server.psql(
            "shop",
            "SELECT string_agg(table_name::text, ',' ORDER BY table_name) FROM information_schema.tables WHERE table_schema = 'public'"
        ),
        "customers,orders",
        "nothing was created in it"
    );
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let pg = Pg::new();
    pg.store().await.close().await.unwrap();
    pg.server.psql(
        "quiver",
        "UPDATE quiver_meta SET value = '999' WHERE key = 'schema_version'",
    );
    let err = PgStore::open(&pg.url, PgOptions::default())
        .await
        .expect_err("too new");
    assert!(
        matches!(err, StoreError::TooNew { found: 999, .. }),
        "{err}"
    );
}
