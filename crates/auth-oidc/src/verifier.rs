//! [`OidcVerifier`]: discovery, the key set and its refetches, JWT checks, introspection, and
//! the cache of verified tokens.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use jsonwebtoken::{Validation, errors::ErrorKind};
use quiver_registry::identity::{TokenError, TokenVerifier, VerifiedToken};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::{
    OidcConfig, OidcError,
    keys::{Key, is_hmac, parse_jwks},
};

/// An introspected token is asked about again after this long even when it expires later
/// (a revoked token is refused within it).
const INTROSPECTION_TTL: Duration = Duration::from_secs(60);
/// Each request to the issuer gives up after this long.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest discovery, JWKS or introspection answer read.
const MAX_BODY: usize = 1024 * 1024;

/// What the discovery document says.
#[derive(Debug, Clone)]
struct Discovered {
    jwks_uri: String,
    introspection_endpoint: Option<String>,
}

/// The keys in use and when they were fetched.
struct KeySet {
    keys: Vec<Key>,
    fetched: Option<Instant>,
}

/// Verifies inbound access tokens issued by one OIDC issuer for one audience.
pub struct OidcVerifier {
    config: OidcConfig,
    http: reqwest::Client,
    discovered: tokio::sync::OnceCell<Discovered>,
    keys: RwLock<Arc<KeySet>>,
    /// Held while the keys are fetched: one fetch at a time.
    fetching: tokio::sync::Mutex<()>,
    /// Verified tokens by the SHA-256 of the token (the token itself is not kept).
    cache: RwLock<HashMap<[u8; 32], Arc<VerifiedToken>>>,
    /// How many times the keys were fetched.
    fetches: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcVerifier")
            .field("issuer", &self.config.issuer)
            .field("audience", &self.config.audience)
            .finish_non_exhaustive()
    }
}

impl OidcVerifier {
    /// A verifier for `config` (checked); nothing is fetched until the first token.
    pub fn new(config: OidcConfig) -> Result<Self, OidcError> {
        config.validate()?;
        // reqwest is built without a default TLS provider; ring is the one the workspace uses.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(HTTP_TIMEOUT)
            .build()
            .map_err(|e| OidcError::Invalid(format!("the HTTP client could not be built: {e}")))?;
        Ok(OidcVerifier {
            config,
            http,
            discovered: tokio::sync::OnceCell::new(),
            keys: RwLock::new(Arc::new(KeySet {
                keys: Vec::new(),
                fetched: None,
            })),
            fetching: tokio::sync::Mutex::new(()),
            cache: RwLock::new(HashMap::new()),
            fetches: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The issuer tokens must name.
    pub fn issuer(&self) -> &str {
        &self.config.issuer
    }

    /// How many times the key set was fetched (rotation and the refetch floor show here).
    pub fn key_fetches(&self) -> u64 {
        self.fetches.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn get(&self, url: &str) -> Result<Vec<u8>, TokenError> {
        get_bounded(&self.http, url).await
    }

    /// Reads the provider's discovery document as a token check would, without a token:
    /// what `quiver check` and start-up use to find a wrong `issuer` before any user does.
    pub async fn probe(&self) -> Result<(), TokenError> {
        self.discovery().await.map(|_| ())
    }

    /// The discovery document: `/.well-known/openid-configuration` under the issuer, else
    /// the RFC 8414 `/.well-known/oauth-authorization-server` form. Its `issuer` must be the
    /// configured one, character for character.
    async fn discovery(&self) -> Result<&Discovered, TokenError> {
        self.discovered
            .get_or_try_init(|| async {
                let issuer = self.config.issuer.trim_end_matches('/');
                let oidc = format!("{issuer}/.well-known/openid-configuration");
                let body = match self.get(&oidc).await {
                    Ok(b) => b,
                    Err(first) => {
                        let url = url::Url::parse(issuer)
                            .map_err(|e| TokenError::Unavailable(e.to_string()))?;
                        let path = url.path().trim_end_matches('/');
                        let oauth = format!(
                            "{}/.well-known/oauth-authorization-server{path}",
                            url.origin().ascii_serialization()
                        );
                        self.get(&oauth).await.map_err(|_| first)?
                    }
                };
                let doc: Value = serde_json::from_slice(&body).map_err(|e| {
                    TokenError::Unavailable(format!(
                        "the issuer's discovery document is not JSON: {e}"
                    ))
                })?;
                let named = doc.get("issuer").and_then(Value::as_str);
                if named != Some(self.config.issuer.as_str()) {
                    let named = named.map_or_else(|| "none".to_owned(), |n| format!("\"{n}\""));
                    return Err(TokenError::Misconfigured(format!(
                        "the provider's discovery document names issuer {named}, not the configured \"{}\": set `[auth.oidc] issuer` to exactly what the provider says",
                        self.config.issuer
                    )));
                }
                let Some(jwks_uri) = doc.get("jwks_uri").and_then(Value::as_str) else {
                    return Err(TokenError::Unavailable(
                        "the issuer's discovery document has no `jwks_uri`".into(),
                    ));
                };
                Ok(Discovered {
                    jwks_uri: jwks_uri.to_owned(),
                    introspection_endpoint: doc
                        .get("introspection_endpoint")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                })
            })
            .await
    }

    fn current_keys(&self) -> Arc<KeySet> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Fetches the keys again unless a fetch happened after `seen` (another request did it
    /// meanwhile) or less than the floor ago. The keys in use after it.
    async fn refetch(&self, seen: Option<Instant>) -> Result<Arc<KeySet>, TokenError> {
        let _one = self.fetching.lock().await;
        let now = self.current_keys();
        if now.fetched != seen
            || now
                .fetched
                .is_some_and(|t| t.elapsed() < self.config.jwks_min_refetch)
        {
            return Ok(now);
        }
        let jwks_uri = self.discovery().await?.jwks_uri.clone();
        self.fetches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body = self.get(&jwks_uri).await?;
        let keys = parse_jwks(&body).map_err(|e| {
            TokenError::Unavailable(format!("the issuer's key set at {jwks_uri}: {e}"))
        })?;
        tracing::debug!(keys = keys.len(), "fetched the issuer's signing keys");
        let set = Arc::new(KeySet {
            keys,
            fetched: Some(Instant::now()),
        });
        *self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = set.clone();
        Ok(set)
    }

    async fn verify_jwt(&self, token: &str) -> Result<VerifiedToken, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            TokenError::Invalid(match e.kind() {
                ErrorKind::Json(j) if j.to_string().contains("`none`") => {
                    "the token is unsigned (`alg: none`), which is never accepted".to_owned()
                }
                _ => format!("the token is not a well-formed signed JWT ({e})"),
            })
        })?;
        if is_hmac(header.alg) {
            return Err(TokenError::Invalid(format!(
                "the token is signed with {:?}, a shared-secret algorithm; only the issuer's public-key signatures are accepted",
                header.alg
            )));
        }
        let mut keys = self.current_keys();
        let stale = keys
            .fetched
            .is_none_or(|t| t.elapsed() >= self.config.jwks_refresh);
        if stale {
            keys = self.refetch(keys.fetched).await?;
        }
        let find = |keys: &KeySet| -> Option<usize> {
            keys.keys.iter().position(|k| match &header.kid {
                Some(kid) => k.kid.as_deref() == Some(kid),
                None => k.algorithms.contains(&header.alg),
            })
        };
        let at = match find(&keys) {
            Some(at) => at,
            None => {
                // A key the set does not hold: the issuer may have rotated its keys.
                keys = self.refetch(keys.fetched).await?;
                find(&keys).ok_or_else(|| {
                    TokenError::Invalid(format!(
                        "the token is signed with a key the issuer does not publish (kid {:?})",
                        header.kid.as_deref().unwrap_or("none")
                    ))
                })?
            }
        };
        let key = &keys.keys[at];
        if !key.algorithms.contains(&header.alg) {
            return Err(TokenError::Invalid(format!(
                "the token's algorithm {:?} is not one its key (kid {:?}) is for",
                header.alg,
                key.kid.as_deref().unwrap_or("none")
            )));
        }
        let mut validation = Validation::new(header.alg);
        validation.algorithms = key.algorithms.clone();
        validation.set_audience(&[&self.config.audience]);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = self.config.leeway.as_secs();
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation)
            .map_err(|e| TokenError::Invalid(self.explain(&e)))?;
        let claims = data.claims;
        let subject = claims
            .get("sub")
            .and_then(Value::as_str)
            .ok_or_else(|| TokenError::Invalid("the token's `sub` is not a string".into()))?
            .to_owned();
        let exp = claims
            .get("exp")
            .and_then(Value::as_u64)
            .ok_or_else(|| TokenError::Invalid("the token's `exp` is not a number".into()))?;
        Ok(VerifiedToken::new(
            subject,
            claims,
            UNIX_EPOCH + Duration::from_secs(exp),
        ))
    }

    /// The reason a JWT failed its checks, for the `error_description` of the 401.
    fn explain(&self, e: &jsonwebtoken::errors::Error) -> String {
        match e.kind() {
            ErrorKind::ExpiredSignature => "the token has expired".into(),
            ErrorKind::ImmatureSignature => "the token is not valid yet (`nbf`)".into(),
            ErrorKind::InvalidAudience => format!(
                "the token is for another audience: its `aud` does not name this server's resource {}",
                self.config.audience
            ),
            ErrorKind::InvalidIssuer => format!(
                "the token's `iss` is not the configured issuer {}",
                self.config.issuer
            ),
            ErrorKind::InvalidSignature => {
                "the token's signature does not verify with the issuer's key".into()
            }
            ErrorKind::MissingRequiredClaim(c) => format!("the token has no `{c}` claim"),
            ErrorKind::InvalidAlgorithm => {
                "the token's algorithm does not fit the issuer's key".into()
            }
            _ => format!("the token could not be verified ({e})"),
        }
    }

    /// RFC 7662: asks the issuer whether an opaque token is active, and whose it is.
    async fn introspect(&self, token: &str) -> Result<VerifiedToken, TokenError> {
        let Some(conf) = &self.config.introspection else {
            return Err(TokenError::Invalid(
                "the token is not a JWT, and this server checks opaque tokens only when introspection is configured".into(),
            ));
        };
        let endpoint = match &conf.endpoint {
            Some(e) => e.clone(),
            None => self
                .discovery()
                .await?
                .introspection_endpoint
                .clone()
                .ok_or_else(|| {
                    TokenError::Unavailable(
                        "the issuer's discovery document names no `introspection_endpoint`; set `introspection_endpoint`".into(),
                    )
                })?,
        };
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("token", token)
            .append_pair("token_type_hint", "access_token")
            .finish();
        let unavailable = |e: String| {
            TokenError::Unavailable(format!(
                "the issuer's introspection endpoint {endpoint} could not be asked: {e}"
            ))
        };
        let response = self
            .http
            .post(&endpoint)
            .basic_auth(&conf.client_id, Some(&conf.client_secret))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if !response.status().is_success() {
            return Err(unavailable(format!("HTTP {}", response.status())));
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let claims: Map<String, Value> =
            serde_json::from_slice(&bytes).map_err(|e| unavailable(e.to_string()))?;
        if claims.get("active") != Some(&Value::Bool(true)) {
            return Err(TokenError::Invalid(
                "the issuer says the token is not active (expired, revoked or unknown)".into(),
            ));
        }
        let aud_ok = match claims.get("aud") {
            Some(Value::String(a)) => *a == self.config.audience,
            Some(Value::Array(a)) => a
                .iter()
                .any(|v| v.as_str() == Some(self.config.audience.as_str())),
            _ => false,
        };
        if !aud_ok {
            return Err(TokenError::Invalid(format!(
                "the token is for another audience: its `aud` does not name this server's resource {}",
                self.config.audience
            )));
        }
        if let Some(iss) = claims.get("iss")
            && iss.as_str() != Some(self.config.issuer.as_str())
        {
            return Err(TokenError::Invalid(format!(
                "the token's `iss` is not the configured issuer {}",
                self.config.issuer
            )));
        }
        let subject = claims
            .get("sub")
            .or_else(|| claims.get("client_id"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                TokenError::Invalid("the introspected token names no `sub` or `client_id`".into())
            })?
            .to_owned();
        let now = SystemTime::now();
        let exp = claims
            .get("exp")
            .and_then(Value::as_u64)
            .map(|s| UNIX_EPOCH + Duration::from_secs(s));
        if exp.is_some_and(|e| e <= now) {
            return Err(TokenError::Invalid("the token has expired".into()));
        }
        let until = exp.map_or(now + INTROSPECTION_TTL, |e| e.min(now + INTROSPECTION_TTL));
        Ok(VerifiedToken::new(subject, claims, until))
    }

    fn cached(&self, digest: &[u8; 32]) -> Option<Arc<VerifiedToken>> {
        let cache = self
            .cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let hit = cache.get(digest)?;
        (hit.expires_at > SystemTime::now()).then(|| hit.clone())
    }

    fn remember(&self, digest: [u8; 32], token: Arc<VerifiedToken>) {
        let mut cache = self
            .cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= self.config.cache_capacity {
            let now = SystemTime::now();
            cache.retain(|_, t| t.expires_at > now);
            if cache.len() >= self.config.cache_capacity {
                cache.clear();
            }
        }
        cache.insert(digest, token);
    }
}

/// Whether a bearer credential has the shape of a JWS compact serialization (three
/// dot-separated parts).
fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|&b| b == b'.').count() == 2
}

#[async_trait]
impl TokenVerifier for OidcVerifier {
    async fn verify(&self, token: &str) -> Result<Arc<VerifiedToken>, TokenError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cached(&digest) {
            return Ok(hit);
        }
        let verified = if looks_like_jwt(token) {
            self.verify_jwt(token).await?
        } else {
            self.introspect(token).await?
        };
        let verified = Arc::new(verified);
        self.remember(digest, verified.clone());
        Ok(verified)
    }
}

/// A JSON document from the issuer (discovery, keys), at most `MAX_BODY` bytes; any failure
/// is the issuer being unavailable, naming `url`.
pub(crate) async fn get_bounded(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, TokenError> {
    let unavailable = |e: String| {
        TokenError::Unavailable(format!(
            "the token issuer could not be reached at {url}: {e}"
        ))
    };
    let response = http
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    if !response.status().is_success() {
        return Err(unavailable(format!("HTTP {}", response.status())));
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    if body.len() > MAX_BODY {
        return Err(unavailable(format!("the answer is over {MAX_BODY} bytes")));
    }
    Ok(body.to_vec())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_issuer::{TestIssuer, TestKey};

    const AUD: &str = "https://quiver.example.com/mcp";

    fn verifier(issuer: &TestIssuer, floor: Duration) -> OidcVerifier {
        let mut config = OidcConfig::new(&issuer.url, AUD);
        config.jwks_min_refetch = floor;
        OidcVerifier::new(config).unwrap()
    }

    fn invalid(r: Result<Arc<VerifiedToken>, TokenError>) -> String {
        match r {
            Err(TokenError::Invalid(why)) => why,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_token_is_verified_once_then_answered_from_the_cache() {
        let k1 = TestKey::new("k1");
        let issuer = TestIssuer::start(&[&k1]).await;
        let v = verifier(&issuer, DEFAULT_FLOOR);
        let token = issuer.token(
            &k1,
            AUD,
            600,
            json!({"email": "a@x.org", "groups": ["ops"]}),
        );
        let first = v.verify(&token).await.unwrap();
        assert_eq!(first.subject, "user-1");
        assert_eq!(first.email.as_deref(), Some("a@x.org"));
        assert!(first.claim_has("groups", "ops"));
        let again = v.verify(&token).await.unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "the second check is the cached one"
        );
        assert_eq!(issuer.fetches(), 1);
    }

    const DEFAULT_FLOOR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn an_unknown_kid_refetches_the_keys_at_most_once_per_floor() {
        let (k1, k2) = (TestKey::new("k1"), TestKey::new("k2"));
        let issuer = TestIssuer::start(&[&k1]).await;
        let v = verifier(&issuer, DEFAULT_FLOOR);
        let unfloored = verifier(&issuer, Duration::ZERO);
        v.verify(&issuer.token(&k1, AUD, 600, json!({})))
            .await
            .unwrap();
        unfloored
            .verify(&issuer.token(&k1, AUD, 601, json!({})))
            .await
            .unwrap();
        assert_eq!(issuer.fetches(), 2);
        // The issuer rotates: k2 is new. Within the floor nothing is fetched again.
        issuer.publish(&[&k2, &k1]);
        let rotated = issuer.token(&k2, AUD, 600, json!({}));
        let why = invalid(v.verify(&rotated).await);
        assert!(
            why.contains("a key the issuer does not publish (kid \"k2\")"),
            "{why}"
        );
        for _ in 0..5 {
            let _ = v
                .verify(&issuer.token(&TestKey::new("k9"), AUD, 600, json!({})))
                .await;
        }
        assert_eq!(issuer.fetches(), 2, "the floor holds back the refetches");
        assert_eq!(v.key_fetches(), 1);
        // With no floor, the unknown kid fetches the keys again and the rotation is seen.
        unfloored.verify(&rotated).await.unwrap();
        assert_eq!(unfloored.key_fetches(), 2);
        assert_eq!(issuer.fetches(), 3);
    }

    #[tokio::test]
    async fn audience_issuer_expiry_and_algorithm_are_checked() {
        let k1 = TestKey::new("k1");
        let issuer = TestIssuer::start(&[&k1]).await;
        let v = verifier(&issuer, DEFAULT_FLOOR);
        let why = invalid(
            v.verify(&issuer.token(&k1, "https://other.example/api", 600, json!({})))
                .await,
        );
        assert!(why.contains("another audience"), "{why}");
        let why = invalid(v.verify(&issuer.token(&k1, AUD, -3600, json!({}))).await);
        assert_eq!(why, "the token has expired");
        let why = invalid(
            v.verify(&issuer.token(&k1, AUD, 600, json!({"iss": "https://evil.example"})))
                .await,
        );
        assert!(why.contains("`iss` is not the configured issuer"), "{why}");
        let why = invalid(
            v.verify(&issuer.token(&k1, AUD, 600, json!({"sub": 7})))
                .await,
        );
        assert!(why.contains("`sub`"), "{why}");
        let why = invalid(v.verify("a.b").await);
        assert!(
            why.contains("opaque tokens only when introspection is configured"),
            "{why}"
        );
        // An HS256 token whose secret is the published key's JSON.
        let secret = serde_json::to_vec(&k1.jwk).unwrap();
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("k1".into());
        let hs = jsonwebtoken::encode(
            &header,
            &json!({"iss": issuer.url, "aud": AUD, "sub": "x", "exp": 4_000_000_000u64}),
            &jsonwebtoken::EncodingKey::from_secret(&secret),
        )
        .unwrap();
        let why = invalid(v.verify(&hs).await);
        assert!(why.contains("shared-secret algorithm"), "{why}");
        // No reason names the token.
        let token = issuer.token(&k1, AUD, -3600, json!({}));
        let why = invalid(v.verify(&token).await);
        assert!(!why.contains(&token[..20]));
    }

    #[tokio::test]
    async fn an_unreachable_issuer_is_unavailable_not_invalid() {
        let config = OidcConfig::new("http://127.0.0.1:9", AUD);
        let v = OidcVerifier::new(config).unwrap();
        let k1 = TestKey::new("k1");
        let issuer = TestIssuer::start(&[&k1]).await;
        let r = v.verify(&issuer.token(&k1, AUD, 600, json!({}))).await;
        assert!(matches!(r, Err(TokenError::Unavailable(_))), "{r:?}");
    }

    /// An issuer configured with a trailing `/` the provider does not write: every check
    /// fails until the operator fixes it, which is said as such, in plain words.
    #[tokio::test]
    async fn an_issuer_that_differs_from_the_providers_is_a_misconfiguration() {
        let k1 = TestKey::new("k1");
        let issuer = TestIssuer::start(&[&k1]).await;
        let config = OidcConfig::new(format!("{}/", issuer.url), AUD);
        let v = OidcVerifier::new(config).unwrap();
        let r = v.verify(&issuer.token(&k1, AUD, 600, json!({}))).await;
        let Err(TokenError::Misconfigured(why)) = r else {
            panic!("expected Misconfigured, got {r:?}")
        };
        assert!(
            why.contains(&format!(
                "names issuer \"{}\", not the configured \"{}/\"",
                issuer.url, issuer.url
            )),
            "{why}"
        );
        assert!(!why.contains("Some("), "{why}");
        // Found without a token too.
        assert!(matches!(v.probe().await, Err(TokenError::Misconfigured(_))));
        let right = OidcVerifier::new(OidcConfig::new(&issuer.url, AUD)).unwrap();
        right.probe().await.expect("the provider's own issuer");
    }
}
