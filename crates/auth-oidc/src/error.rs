//! The adapter's configuration faults.

/// A configuration the verifier cannot work with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OidcError {
    /// A setting is not usable; the text names it and what to write instead.
    #[error("{0}")]
    Invalid(String),
}
