//! TLS to the server: `sslmode` and `sslrootcert` in the URL, against a real server that
//! speaks TLS with a certificate of a CA the test makes, and admits TCP connections only
//! over TLS (`hostssl`), so a connection that opens is an encrypted one.

use quiver_registry::store::{DefinitionStore, StoreError};
use quiver_store_postgres::{PgOptions, PgStore};
use quiver_store_testkit::{PASSWORD_FOR_TESTS, ServerTls, TestPostgres};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A CA: its certificate (PEM) and what signs with it.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).expect("CA certificate");
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A server whose certificate, signed by `ca`, names `localhost` only; TLS required.
fn server(ca: &Ca) -> TestPostgres {
    let key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = params
        .signed_by(&key, &ca.issuer)
        .expect("server certificate");
    let server = TestPostgres::start_tls(&ServerTls {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        only: true,
    });
    server.create_database("quiver");
    server
}

fn url(server: &TestPostgres, host: &str, query: &str) -> String {
    format!(
        "postgres://quiver:{PASSWORD_FOR_TESTS}@{host}:{}/quiver?{query}",
        server.port()
    )
}

/// Opens a store and makes it use a pooled connection.
async fn open(url: &str) -> Result<PgStore, StoreError> {
    let store = PgStore::open(url, PgOptions::default()).await?;
    store.all_definitions().await?;
    Ok(store)
}

fn cause(e: StoreError) -> String {
    match e {
        StoreError::Unavailable { location, cause } => {
            assert!(
                !location.contains(PASSWORD_FOR_TESTS) && !cause.contains(PASSWORD_FOR_TESTS),
                "the password is masked: {location}: {cause}"
            );
            cause
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn each_sslmode_connects_or_says_what_failed_and_what_to_do() {
    let right = ca("Quiver test CA");
    let wrong = ca("Another CA");
    let server = server(&right);
    let certs = tempfile::tempdir().expect("temp dir");
    let right_pem = certs.path().join("right.pem");
    let wrong_pem = certs.path().join("wrong.pem");
    std::fs::write(&right_pem, &right.pem).unwrap();
    std::fs::write(&wrong_pem, &wrong.pem).unwrap();
    let right_pem = right_pem.display();
    let wrong_pem = wrong_pem.display();

    // Encrypted, certificate unchecked.
    let store = open(&url(&server, "127.0.0.1", "sslmode=require"))
        .await
        .expect("sslmode=require connects");
    let plain = server.psql(
        "quiver",
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'quiver' AND NOT s.ssl",
    );
    let encrypted = server.psql(
        "quiver",
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'quiver' AND s.ssl",
    );
    assert_eq!(plain, "0", "no plain connection of the store");
    assert_ne!(encrypted, "0", "the store's connections are encrypted");
    store.close().await.unwrap();

    // The default (prefer) takes TLS when the server offers it.
    open(&url(&server, "127.0.0.1", ""))
        .await
        .expect("the default sslmode (prefer) connects over TLS")
        .close()
        .await
        .unwrap();

    // The right CA and the host the certificate names.
    open(&url(
        &server,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={right_pem}"),
    ))
    .await
    .expect("verify-full with the right CA and host connects")
    .close()
    .await
    .unwrap();

    // verify-ca checks the CA only: an address the certificate does not name is fine.
    open(&url(
        &server,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={right_pem}"),
    ))
    .await
    .expect("verify-ca with the right CA connects by address")
    .close()
    .await
    .unwrap();

    // verify-full by an address the certificate does not name.
    let err = cause(
        open(&url(
            &server,
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={right_pem}"),
        ))
        .await
        .expect_err("the certificate does not name 127.0.0.1"),
    );
    assert!(
        err.contains("does not name the host") && err.contains("sslmode=verify-ca"),
        "{err}"
    );

    // A CA that did not sign the server's certificate.
    let err = cause(
        open(&url(
            &server,
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={wrong_pem}"),
        ))
        .await
        .expect_err("a wrong CA is refused"),
    );
    assert!(
        err.contains("not signed by a trusted CA") && err.contains("set sslrootcert"),
        "{err}"
    );

    // No TLS against a server that requires it.
    let err = cause(
        open(&url(&server, "127.0.0.1", "sslmode=disable"))
            .await
            .expect_err("the server requires TLS"),
    );
    assert!(
        err.contains("only over TLS") && err.contains("sslmode=require"),
        "{err}"
    );

    // A root certificate file that is not there.
    let err = cause(
        open(&url(
            &server,
            "localhost",
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        ))
        .await
        .expect_err("no such file"),
    );
    assert!(
        err.contains("cannot read sslrootcert /nonexistent/ca.pem"),
        "{err}"
    );
}

#[tokio::test]
async fn sslmode_require_against_a_server_without_tls_says_so() {
    let server = TestPostgres::start();
    server.create_database("quiver");
    let err = cause(
        open(&url(&server, "127.0.0.1", "sslmode=require"))
            .await
            .expect_err("the server has no TLS"),
    );
    assert!(
        err.contains("does not accept TLS") && err.contains("sslmode"),
        "{err}"
    );
}
