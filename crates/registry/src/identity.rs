//! The token-verifier port: who an inbound access token speaks for. An adapter (the OIDC
//! one verifies JWTs against an issuer's keys, or asks its introspection endpoint) turns a
//! bearer credential into a [`VerifiedToken`]; the MCP server maps its claims to a
//! principal, a tenant, a mode and what it may use.

use std::{sync::Arc, time::SystemTime};

use async_trait::async_trait;
use serde_json::{Map, Value};

/// What a verified access token says about its bearer.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct VerifiedToken {
    /// The `sub` claim: the user (or, for a client-credentials token, the client).
    pub subject: String,
    /// The `email` claim, when the token carries one.
    pub email: Option<String>,
    /// Every claim of the token (`groups`, `scope`, `client_id`, ...), for the claim rules.
    pub claims: Map<String, Value>,
    /// When the token stops being valid (its `exp`).
    pub expires_at: SystemTime,
}

impl VerifiedToken {
    /// A token for `subject` valid until `expires_at`, with these claims.
    pub fn new(
        subject: impl Into<String>,
        claims: Map<String, Value>,
        expires_at: SystemTime,
    ) -> Self {
        let email = claims
            .get("email")
            .and_then(Value::as_str)
            .map(str::to_owned);
        VerifiedToken {
            subject: subject.into(),
            email,
            claims,
            expires_at,
        }
    }

    /// Whether claim `name` is `value`, or is an array holding it, or (for `scope`, a
    /// space-separated list) names it.
    pub fn claim_has(&self, name: &str, value: &str) -> bool {
        match self.claims.get(name) {
            Some(Value::String(s)) if name == "scope" || name == "scp" => {
                s.split(' ').any(|w| w == value)
            }
            Some(Value::String(s)) => s == value,
            Some(Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(value)),
            Some(Value::Bool(b)) => value.parse::<bool>().ok() == Some(*b),
            Some(Value::Number(n)) => n.to_string() == value,
            _ => false,
        }
    }
}

/// Why a presented token was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The token is not valid for this server: malformed, badly signed, expired, not yet
    /// valid, for another audience or from another issuer. The text says which, and never
    /// holds the token.
    #[error("{0}")]
    Invalid(String),
    /// The token could not be checked now: the issuer's keys or its introspection endpoint
    /// are out of reach.
    #[error("{0}")]
    Unavailable(String),
    /// No token can be checked until the operator changes this server's settings (the
    /// provider names another issuer than the one configured): retrying will not help.
    #[error("{0}")]
    Misconfigured(String),
}

/// Turns an inbound bearer credential into what it says about its bearer.
#[async_trait]
pub trait TokenVerifier: Send + Sync {
    /// Verifies `token`. A token verified before is answered from a cache until it expires.
    async fn verify(&self, token: &str) -> Result<Arc<VerifiedToken>, TokenError>;
}

/// A token the issuer gave Quiver for one upstream, on a user's behalf (RFC 8693 token
/// exchange). Never printed: its `Debug` shows when it expires alone.
#[derive(Clone)]
#[non_exhaustive]
pub struct DelegatedToken {
    /// When the token stops being valid (its `expires_in`, or the issuer's default).
    pub expires_at: SystemTime,
    token: Arc<str>,
}

impl DelegatedToken {
    /// The access `token`, valid until `expires_at`.
    pub fn new(token: impl Into<Arc<str>>, expires_at: SystemTime) -> Self {
        DelegatedToken {
            expires_at,
            token: token.into(),
        }
    }

    /// The access token, for the upstream it was issued for only.
    pub fn bearer(&self) -> &str {
        &self.token
    }
}

impl std::fmt::Debug for DelegatedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedToken")
            .field("expires_at", &self.expires_at)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Exchanges a user's access token for one scoped to an upstream (RFC 8693), as Quiver's
/// own client at the issuer.
#[async_trait]
pub trait TokenExchanger: Send + Sync {
    /// A token for `audience` (the upstream's resource URI) acting for the user who
    /// presented `subject_token`. A token obtained before is answered from a cache until
    /// shortly before it expires.
    async fn exchange(
        &self,
        subject_token: &str,
        audience: &str,
    ) -> Result<DelegatedToken, TokenError>;
}
