//! What the verifier is told: the issuer, Quiver's resource URI, and how often to look at
//! the issuer's keys.

use std::time::Duration;

use crate::OidcError;

/// The issuer and audience tokens are checked against.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OidcConfig {
    /// The issuer (`iss`) tokens must name; its discovery document is at
    /// `<issuer>/.well-known/openid-configuration` (or `oauth-authorization-server`).
    pub issuer: String,
    /// Quiver's resource URI (RFC 8707): an access token's `aud` must name it.
    pub audience: String,
    /// How long fetched keys are used before they are fetched again.
    pub jwks_refresh: Duration,
    /// The least time between two fetches of the keys (a token with an unknown `kid` fetches
    /// them again, but no more often than this, so bad tokens cannot hammer the issuer).
    pub jwks_min_refetch: Duration,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// Where opaque (non-JWT) tokens are checked; none: only JWTs are accepted.
    pub introspection: Option<Introspection>,
    /// The most verified tokens kept.
    pub cache_capacity: usize,
}

/// RFC 7662 token introspection: the endpoint and the client Quiver authenticates as.
#[derive(Clone)]
#[non_exhaustive]
pub struct Introspection {
    /// The endpoint; none: the one the discovery document names.
    pub endpoint: Option<String>,
    /// Quiver's client id at the issuer.
    pub client_id: String,
    /// Its secret (HTTP Basic authentication).
    pub client_secret: String,
}

impl std::fmt::Debug for Introspection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Introspection")
            .field("endpoint", &self.endpoint)
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .finish()
    }
}

impl Introspection {
    /// Introspection as `client_id`, at the discovered endpoint unless one is given.
    pub fn new(
        endpoint: Option<String>,
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
    ) -> Self {
        Introspection {
            endpoint,
            client_id: client_id.into(),
            client_secret: client_secret.into(),
        }
    }
}

/// Keys are used this long before they are fetched again.
pub const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(3600);
/// At most one fetch of the keys in this time.
pub const DEFAULT_JWKS_MIN_REFETCH: Duration = Duration::from_secs(10);
/// Clock skew allowed on `exp` and `nbf`.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);
/// Verified tokens kept.
pub const DEFAULT_CACHE_CAPACITY: usize = 10_000;

impl OidcConfig {
    /// Tokens from `issuer` for `audience`, with the default intervals.
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        OidcConfig {
            issuer: issuer.into(),
            audience: audience.into(),
            jwks_refresh: DEFAULT_JWKS_REFRESH,
            jwks_min_refetch: DEFAULT_JWKS_MIN_REFETCH,
            leeway: DEFAULT_LEEWAY,
            introspection: None,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
        }
    }

    /// Checks the issuer and audience are absolute `https` URLs (`http` only on a loopback
    /// host, for tests and local issuers).
    pub fn validate(&self) -> Result<(), OidcError> {
        for (key, value) in [("issuer", &self.issuer), ("audience", &self.audience)] {
            let url = url::Url::parse(value).map_err(|e| {
                OidcError::Invalid(format!(
                    "`{key} = {value:?}` is not an absolute URL ({e}): write it as https://host/path"
                ))
            })?;
            let loopback = matches!(url.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
            if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
                return Err(OidcError::Invalid(format!(
                    "`{key} = {value:?}` must be an https URL (plain http is accepted only for localhost)"
                )));
            }
            if url.fragment().is_some() {
                return Err(OidcError::Invalid(format!(
                    "`{key} = {value:?}` has a fragment (`#...`), which an OAuth {key} may not have; remove it"
                )));
            }
        }
        if self.jwks_min_refetch > self.jwks_refresh {
            return Err(OidcError::Invalid(format!(
                "`jwks_min_refetch` ({} s) is longer than `jwks_refresh` ({} s): the floor between fetches must not exceed the refresh interval",
                self.jwks_min_refetch.as_secs(),
                self.jwks_refresh.as_secs()
            )));
        }
        if let Some(i) = &self.introspection {
            if i.client_id.is_empty() || i.client_secret.is_empty() {
                return Err(OidcError::Invalid(
                    "`introspection_client_id` and `introspection_client_secret` must both be set for introspection".into(),
                ));
            }
            if let Some(e) = &i.endpoint {
                url::Url::parse(e).map_err(|err| {
                    OidcError::Invalid(format!(
                        "`introspection_endpoint = {e:?}` is not an absolute URL ({err})"
                    ))
                })?;
            }
        }
        Ok(())
    }
}
