//! Turns the engine's errors into the port's [`StoreError`], naming the database and the
//! cause.

use quiver_registry::store::StoreError;
use rusqlite::ErrorCode;

/// Classifies a rusqlite error for the database at `location`.
pub(crate) fn classify(location: &str, e: &rusqlite::Error) -> StoreError {
    let location = location.to_owned();
    let Some(code) = e.sqlite_error_code() else {
        return StoreError::Backend {
            location,
            cause: e.to_string(),
        };
    };
    match code {
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreError::Unavailable {
            location,
            cause: format!("{LOCKED} ({e})"),
        },
        ErrorCode::ReadOnly => StoreError::Unavailable {
            location,
            cause: format!("the database or its directory is read-only ({e})"),
        },
        ErrorCode::CannotOpen | ErrorCode::PermissionDenied => StoreError::Unavailable {
            location,
            cause: format!(
                "cannot open the file: check that its directory exists and is writable ({e})"
            ),
        },
        ErrorCode::DiskFull => StoreError::Unavailable {
            location,
            cause: format!("the disk is full ({e})"),
        },
        ErrorCode::SystemIoFailure => StoreError::Unavailable {
            location,
            cause: format!("an I/O error ({e})"),
        },
        ErrorCode::NotADatabase => StoreError::Corrupt {
            location,
            cause: format!("the file is not a SQLite database ({e})"),
        },
        ErrorCode::DatabaseCorrupt => StoreError::Corrupt {
            location,
            cause: format!("the database file is damaged ({e})"),
        },
        ErrorCode::ConstraintViolation => StoreError::Conflict {
            what: format!("{location}: {e}"),
        },
        _ => StoreError::Backend {
            location,
            cause: e.to_string(),
        },
    }
}

/// Extension to classify a rusqlite result in place.
pub(crate) trait ResultExt<T> {
    /// Classifies the error, if any, for the database at `location`.
    fn at(self, location: &str) -> Result<T, StoreError>;
}

impl<T> ResultExt<T> for Result<T, rusqlite::Error> {
    fn at(self, location: &str) -> Result<T, StoreError> {
        self.map_err(|e| classify(location, &e))
    }
}

/// How the cause of a busy or locked database begins.
pub(crate) const LOCKED: &str = "the database is locked by another connection or process";
