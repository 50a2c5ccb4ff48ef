//! Turns the driver's and the pool's errors into the port's [`StoreError`], naming the
//! server (its address with the password masked) and the cause.

use deadpool_postgres::PoolError;
use quiver_registry::store::StoreError;
use tokio_postgres::error::SqlState;

/// Classifies a driver error for the database at `location`.
pub(crate) fn classify(location: &str, e: &tokio_postgres::Error) -> StoreError {
    let location = location.to_owned();
    // A value the driver could not encode into, or decode from, a column's type: a fault
    // of this adapter's statements, not of the connection.
    if let Some(wrong) = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<tokio_postgres::types::WrongType>())
    {
        return StoreError::Backend {
            location,
            cause: format!("a statement's value does not fit its column's type: {wrong} ({e})"),
        };
    }
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection itself failed (refused, reset, closed, a timeout, the
        // TLS handshake).
        let cause = if let Some(tls) = crate::tls::explain(e) {
            tls
        } else if e.is_closed() {
            format!("{LOST} ({})", chain(e))
        } else {
            format!(
                "cannot reach the server: check the host and port in [store] url and that PostgreSQL runs ({})",
                chain(e)
            )
        };
        return StoreError::Unavailable { location, cause };
    };
    let text = chain(e);
    let unavailable = |why: &str| StoreError::Unavailable {
        location: location.clone(),
        cause: format!("{why} ({text})"),
    };
    match code {
        c if *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            && text.contains("no encryption") =>
        {
            unavailable(
                "the server admits this connection only over TLS (a hostssl line of its pg_hba.conf): set sslmode=require, or verify-full with sslrootcert, in [store] url",
            )
        }
        c if *c == SqlState::INVALID_PASSWORD
            || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            unavailable(
                "the server refused the credentials: check the user and password in [store] url",
            )
        }
        c if *c == SqlState::INVALID_CATALOG_NAME => unavailable(
            "the database does not exist: create it (`createdb <name>`) or fix its name in [store] url",
        ),
        c if *c == SqlState::INSUFFICIENT_PRIVILEGE => unavailable(
            "the user may not do this: grant it the database's privileges (it creates Quiver's tables at first start)",
        ),
        c if *c == SqlState::READ_ONLY_SQL_TRANSACTION => unavailable(
            "the database takes no writes here (a standby, or the store was opened read-only)",
        ),
        c if *c == SqlState::DISK_FULL => unavailable("the server's disk is full"),
        c if *c == SqlState::TOO_MANY_CONNECTIONS => unavailable(
            "no connection is left for this role or server: each `quiver serve` holds up to 10 (a pool of 8, a listener and a leader); raise the server's `max_connections` or the role's `CONNECTION LIMIT` to 10 per replica, plus what other clients need",
        ),
        c if *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::CANNOT_CONNECT_NOW =>
        {
            unavailable("the server is shutting down or starting")
        }
        c if c.code().starts_with("08") => unavailable(LOST),
        c if *c == SqlState::DATA_CORRUPTED || *c == SqlState::INDEX_CORRUPTED => {
            StoreError::Corrupt {
                location,
                cause: format!("the database is damaged ({text})"),
            }
        }
        c if c.code().starts_with("23") => StoreError::Conflict {
            what: format!("{location}: {text}"),
        },
        _ => StoreError::Backend {
            location,
            cause: text,
        },
    }
}

/// Classifies an error of taking a connection from the pool.
pub(crate) fn classify_pool(location: &str, e: &PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => classify(location, e),
        PoolError::Timeout(_) => StoreError::Unavailable {
            location: location.to_owned(),
            cause: "no connection to the server came in time (it is slow, unreachable, or every pooled connection is busy)".into(),
        },
        other => StoreError::Unavailable {
            location: location.to_owned(),
            cause: format!("no connection to the server: {other}"),
        },
    }
}

/// The error and its sources, one text (the driver's `Display` leaves the server's message
/// to the source).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        next = s.source();
    }
    text
}

/// How the cause of a lost connection begins.
pub(crate) const LOST: &str = "the connection to the server was lost (it restarted, or the network failed); Quiver reconnects";

/// Extension to classify a driver result in place.
pub(crate) trait ResultExt<T> {
    /// Classifies the error, if any, for the database at `location`.
    fn at(self, location: &str) -> Result<T, StoreError>;
}

impl<T> ResultExt<T> for Result<T, tokio_postgres::Error> {
    fn at(self, location: &str) -> Result<T, StoreError> {
        self.map_err(|e| classify(location, &e))
    }
}

impl<T> ResultExt<T> for Result<T, PoolError> {
    fn at(self, location: &str) -> Result<T, StoreError> {
        self.map_err(|e| classify_pool(location, &e))
    }
}

/// `url` with its password masked, for logs, errors and `quiver status`: the `user:password@`
/// of a URL and a `password=` key of a URL query or of a key/value connection string.
pub fn redact(url: &str) -> String {
    let mut out = url.to_owned();
    // Where the authority starts: after `://`, or, in a URL mistyped without it
    // (`postgres//user:pass@host`, `postgres:user:pass@host`), after the last `/` before
    // the `@` (or the start): a typo must not print the password.
    let authority = out.find("://").map(|i| i + 3).or_else(|| {
        let at = out.find('@')?;
        Some(out[..at].rfind('/').map_or(0, |i| i + 1))
    });
    if let Some(rest_start) = authority {
        let authority_end = out[rest_start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                let start = rest_start + colon + 1;
                out.replace_range(start..rest_start + at, "***");
            }
        }
    }
    // `password=...` up to the next `&` or whitespace (a query, or key/value form, where a
    // quoted value runs to its closing quote).
    let lower = out.to_ascii_lowercase();
    if let Some(pos) = lower.find("password=") {
        let start = pos + "password=".len();
        let bytes = out.as_bytes();
        let end = if bytes.get(start) == Some(&b'\'') {
            out[start + 1..]
                .find('\'')
                .map_or(out.len(), |i| start + 1 + i + 1)
        } else {
            out[start..]
                .find(|c: char| c == '&' || c.is_whitespace())
                .map_or(out.len(), |i| start + i)
        };
        out.replace_range(start..end, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{classify, redact};
    use quiver_registry::store::StoreError;

    /// A value that does not fit its parameter's type is the adapter's fault, said as such,
    /// not a server out of reach.
    #[tokio::test]
    async fn a_value_of_the_wrong_type_is_not_an_unreachable_server() {
        let server = quiver_store_testkit::TestPostgres::start();
        server.create_database("quiver");
        let (client, connection) =
            tokio_postgres::connect(&server.url("quiver"), tokio_postgres::NoTls)
                .await
                .expect("connect");
        tokio::spawn(connection);
        let e = client
            .query("SELECT $1::int4", &[&1_i64])
            .await
            .expect_err("an i64 for an int4");
        match classify("postgres://quiver:***@db/quiver", &e) {
            StoreError::Backend { cause, .. } => {
                assert!(cause.contains("does not fit its column's type"), "{cause}")
            }
            other => panic!("classified as {other:?}"),
        }
    }

    #[test]
    fn passwords_are_masked_in_every_form() {
        for (url, want) in [
            (
                "postgres://quiver:s3cret@db:5432/quiver",
                "postgres://quiver:***@db:5432/quiver",
            ),
            (
                "postgresql://quiver@db/quiver?password=s3cret&sslmode=disable",
                "postgresql://quiver@db/quiver?password=***&sslmode=disable",
            ),
            (
                "host=db user=quiver password='a b' dbname=q",
                "host=db user=quiver password=*** dbname=q",
            ),
            ("postgres://db/quiver", "postgres://db/quiver"),
            (
                "postgres://u:p%40ss@db/quiver",
                "postgres://u:***@db/quiver",
            ),
            // Mistyped: still masked.
            (
                "postgres//quiver:secret@127.0.0.1:5432/quiver",
                "postgres//quiver:***@127.0.0.1:5432/quiver",
            ),
            ("quiver:secret@db/quiver", "quiver:***@db/quiver"),
            ("postgres://u:p@ss@db/quiver", "postgres://u:***@db/quiver"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }
}
