//! The OIDC adapter of the token-verifier port ([`quiver_registry::identity::TokenVerifier`]):
//! Quiver as an OAuth 2.1 resource server. [`OidcVerifier`] finds the issuer's keys through
//! its discovery document, verifies JWT access tokens with them (`jsonwebtoken` on ring:
//! asymmetric algorithms only, so neither `alg: none` nor a public key used as an HMAC secret
//! gets through), checks `iss`, `aud` (Quiver's resource URI, RFC 8707), `exp` and `nbf`,
//! and asks the issuer's introspection endpoint (RFC 7662) about a token that is not a JWT
//! when one is configured. A verified token is kept, by its SHA-256, until it expires; the
//! keys are fetched again on a `kid` they do not hold (key rotation), no more often than a
//! floor allows. [`OidcExchanger`] exchanges a user's token for one scoped to an upstream
//! (RFC 8693), as Quiver's own client, and keeps it until shortly before it expires.

mod config;
mod error;
mod exchange;
mod keys;
#[cfg(test)]
mod test_issuer;
mod verifier;

pub use config::{
    DEFAULT_CACHE_CAPACITY, DEFAULT_JWKS_MIN_REFETCH, DEFAULT_JWKS_REFRESH, DEFAULT_LEEWAY,
    Introspection, OidcConfig,
};
pub use error::OidcError;
pub use exchange::{EXCHANGE_MARGIN, ExchangeConfig, OidcExchanger};
pub use verifier::OidcVerifier;
