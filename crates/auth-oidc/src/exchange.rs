//! [`OidcExchanger`]: RFC 8693 token exchange at the issuer's token endpoint, as Quiver's
//! own client, for upstreams that act for the user (`auth = "exchange"`), and the cache of
//! the tokens obtained.

use std::{
    collections::HashMap,
    sync::RwLock,
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use quiver_registry::identity::{DelegatedToken, TokenError, TokenExchanger};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::OidcError;

/// Each request to the issuer gives up after this long.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest discovery or token answer read.
const MAX_BODY: usize = 1024 * 1024;
/// An obtained token is used until this long before it expires (or half its life, when that
/// is shorter), so that a call never reaches the upstream with a token about to lapse.
pub const EXCHANGE_MARGIN: Duration = Duration::from_secs(30);
/// A token without `expires_in` is taken to last this long.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// The most obtained tokens kept.
const CACHE_CAPACITY: usize = 10_000;

/// Quiver's client at the issuer, for token exchange.
#[derive(Clone)]
#[non_exhaustive]
pub struct ExchangeConfig {
    /// The issuer; its discovery document names the token endpoint.
    pub issuer: String,
    /// The token endpoint; none: the one the discovery document names.
    pub token_endpoint: Option<String>,
    /// Quiver's client id at the issuer.
    pub client_id: String,
    /// Its secret (HTTP Basic authentication, `client_secret_basic`).
    pub client_secret: String,
}

impl std::fmt::Debug for ExchangeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangeConfig")
            .field("issuer", &self.issuer)
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .finish()
    }
}

impl ExchangeConfig {
    /// Exchange at `issuer` as client `client_id`.
    pub fn new(
        issuer: impl Into<String>,
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
    ) -> Self {
        ExchangeConfig {
            issuer: issuer.into(),
            token_endpoint: None,
            client_id: client_id.into(),
            client_secret: client_secret.into(),
        }
    }
}

/// A token kept: the token and when it stops being used.
struct Kept {
    token: DelegatedToken,
    use_until: SystemTime,
}

/// Exchanges users' access tokens for upstream-scoped ones at one issuer.
pub struct OidcExchanger {
    config: ExchangeConfig,
    http: reqwest::Client,
    token_endpoint: tokio::sync::OnceCell<String>,
    /// Obtained tokens by the SHA-256 of the user's token and the audience (neither token
    /// is a key).
    cache: RwLock<HashMap<[u8; 32], Kept>>,
    /// Exchanges made (cache misses that reached the issuer).
    exchanges: std::sync::atomic::AtomicU64,
    /// One exchange at a time per user token and audience: concurrent first calls of a user
    /// share one token (two would give the user's connection two credentials in turn).
    pending: std::sync::Mutex<HashMap<[u8; 32], std::sync::Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for OidcExchanger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcExchanger")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OidcExchanger {
    /// An exchanger for `config`; nothing is fetched until the first exchange.
    pub fn new(config: ExchangeConfig) -> Result<Self, OidcError> {
        if config.client_id.is_empty() || config.client_secret.is_empty() {
            return Err(OidcError::Invalid(
                "token exchange needs Quiver's `client_id` and `client_secret` at the issuer"
                    .into(),
            ));
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(HTTP_TIMEOUT)
            .build()
            .map_err(|e| OidcError::Invalid(format!("the HTTP client could not be built: {e}")))?;
        Ok(OidcExchanger {
            config,
            http,
            token_endpoint: tokio::sync::OnceCell::new(),
            cache: RwLock::new(HashMap::new()),
            exchanges: std::sync::atomic::AtomicU64::new(0),
            pending: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// How many exchanges reached the issuer (the cache's misses).
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn endpoint(&self) -> Result<&str, TokenError> {
        self.token_endpoint
            .get_or_try_init(|| async {
                if let Some(e) = &self.config.token_endpoint {
                    return Ok(e.clone());
                }
                let issuer = self.config.issuer.trim_end_matches('/');
                let url = format!("{issuer}/.well-known/openid-configuration");
                let body = crate::verifier::get_bounded(&self.http, &url).await?;
                let doc: Value = serde_json::from_slice(&body).map_err(|e| {
                    TokenError::Unavailable(format!(
                        "the token issuer's discovery document at {url} is not JSON: {e}"
                    ))
                })?;
                doc.get("token_endpoint")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        TokenError::Unavailable(
                            "the issuer's discovery document names no `token_endpoint`".into(),
                        )
                    })
            })
            .await
            .map(String::as_str)
    }

    fn key(subject_token: &str, audience: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(subject_token.as_bytes());
        h.update([0]);
        h.update(audience.as_bytes());
        h.finalize().into()
    }

    fn cached(&self, key: &[u8; 32]) -> Option<DelegatedToken> {
        let cache = self
            .cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let kept = cache.get(key)?;
        (kept.use_until > SystemTime::now()).then(|| kept.token.clone())
    }

    fn remember(&self, key: [u8; 32], token: DelegatedToken) {
        let now = SystemTime::now();
        let life = token.expires_at.duration_since(now).unwrap_or_default();
        let use_until = token.expires_at - EXCHANGE_MARGIN.min(life / 2);
        let mut cache = self
            .cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= CACHE_CAPACITY {
            cache.retain(|_, k| k.use_until > now);
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
        }
        cache.insert(key, Kept { token, use_until });
    }
}

#[async_trait]
impl TokenExchanger for OidcExchanger {
    async fn exchange(
        &self,
        subject_token: &str,
        audience: &str,
    ) -> Result<DelegatedToken, TokenError> {
        let key = Self::key(subject_token, audience);
        if let Some(hit) = self.cached(&key) {
            return Ok(hit);
        }
        let one = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(key)
            .or_default()
            .clone();
        let _one = one.lock().await;
        let result = self.exchange_once(key, subject_token, audience).await;
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&key);
        result
    }
}

impl OidcExchanger {
    /// [`TokenExchanger::exchange`] under the key's lock: the cache again (another call may
    /// have exchanged meanwhile), else the issuer.
    async fn exchange_once(
        &self,
        key: [u8; 32],
        subject_token: &str,
        audience: &str,
    ) -> Result<DelegatedToken, TokenError> {
        if let Some(hit) = self.cached(&key) {
            return Ok(hit);
        }
        let endpoint = self.endpoint().await?.to_owned();
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair(
                "grant_type",
                "urn:ietf:params:oauth:grant-type:token-exchange",
            )
            .append_pair("subject_token", subject_token)
            .append_pair(
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:access_token",
            )
            .append_pair(
                "requested_token_type",
                "urn:ietf:params:oauth:token-type:access_token",
            )
            .append_pair("resource", audience)
            .append_pair("audience", audience)
            .finish();
        let unavailable = |e: String| {
            TokenError::Unavailable(format!(
                "the issuer's token endpoint {endpoint} could not be asked for a token for {audience}: {e}"
            ))
        };
        self.exchanges
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let response = self
            .http
            .post(&endpoint)
            .basic_auth(&self.config.client_id, Some(&self.config.client_secret))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if bytes.len() > MAX_BODY {
            return Err(unavailable(format!("the answer is over {MAX_BODY} bytes")));
        }
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let error = answer.get("error").and_then(Value::as_str);
            let description = answer
                .get("error_description")
                .and_then(Value::as_str)
                .map_or(String::new(), |d| format!(" ({d})"));
            return Err(match (status.as_u16(), error) {
                // The user's token is not one the issuer exchanges (expired, revoked, not
                // for Quiver): the user must sign in again.
                (400, Some("invalid_grant")) => TokenError::Invalid(format!(
                    "the issuer refused to exchange the user's token for a token for {audience}: invalid_grant{description}"
                )),
                (_, Some(e)) => unavailable(format!("HTTP {status}, {e}{description}")),
                (_, None) => unavailable(format!("HTTP {status}")),
            });
        }
        let Some(token) = answer.get("access_token").and_then(Value::as_str) else {
            return Err(unavailable("the answer has no `access_token`".into()));
        };
        if token.is_empty() || token.chars().any(|c| !(' '..='~').contains(&c)) {
            return Err(unavailable(
                "the `access_token` is empty or not printable ASCII".into(),
            ));
        }
        let lifetime = answer
            .get("expires_in")
            .and_then(Value::as_u64)
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        let token = DelegatedToken::new(token, SystemTime::now() + lifetime);
        self.remember(key, token.clone());
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::test_issuer::{TestIssuer, TestKey};

    async fn exchanger() -> (TestIssuer, OidcExchanger) {
        let issuer = TestIssuer::start(&[&TestKey::new("k1")]).await;
        let exchanger =
            OidcExchanger::new(ExchangeConfig::new(&issuer.url, "quiver", "s3cret")).unwrap();
        (issuer, exchanger)
    }

    #[tokio::test]
    async fn an_exchanged_token_is_kept_per_user_token_and_audience() {
        let (issuer, x) = exchanger().await;
        let a = x
            .exchange("user-token", "https://up.example/mcp")
            .await
            .unwrap();
        assert_eq!(a.bearer(), "exchanged-1");
        let again = x
            .exchange("user-token", "https://up.example/mcp")
            .await
            .unwrap();
        assert_eq!(again.bearer(), "exchanged-1", "answered from the cache");
        let other = x
            .exchange("user-token", "https://other.example/mcp")
            .await
            .unwrap();
        assert_eq!(
            other.bearer(),
            "exchanged-2",
            "another audience, another exchange"
        );
        let user2 = x
            .exchange("user-2-token", "https://up.example/mcp")
            .await
            .unwrap();
        assert_eq!(
            user2.bearer(),
            "exchanged-3",
            "another user, another exchange"
        );
        assert_eq!(x.exchanges(), 3);

        let (head, form) = issuer.exchanges.lock().unwrap()[0].clone();
        let form: HashMap<String, String> = url::form_urlencoded::parse(form.as_bytes())
            .into_owned()
            .collect();
        assert_eq!(
            form["grant_type"],
            "urn:ietf:params:oauth:grant-type:token-exchange"
        );
        assert_eq!(form["subject_token"], "user-token");
        assert_eq!(
            form["subject_token_type"],
            "urn:ietf:params:oauth:token-type:access_token"
        );
        assert_eq!(form["resource"], "https://up.example/mcp");
        assert_eq!(form["audience"], "https://up.example/mcp");
        // client_secret_basic: base64("quiver:s3cret").
        assert!(head.contains("Basic cXVpdmVyOnMzY3JldA=="), "{head}");
        assert!(
            !format!("{x:?} {a:?}").contains("s3cret") && !format!("{a:?}").contains("exchanged")
        );
    }

    #[tokio::test]
    async fn concurrent_first_calls_of_a_user_share_one_exchange() {
        let (_issuer, x) = exchanger().await;
        let (a, b) = tokio::join!(
            x.exchange("t", "https://up.example/mcp"),
            x.exchange("t", "https://up.example/mcp")
        );
        assert_eq!(a.unwrap().bearer(), b.unwrap().bearer());
        assert_eq!(x.exchanges(), 1);
    }

    #[tokio::test]
    async fn a_token_about_to_expire_is_not_reused() {
        let (issuer, x) = exchanger().await;
        // A token that lapses at once is never answered from the cache.
        issuer.exchange_lifetime.store(0, Ordering::SeqCst);
        x.exchange("t", "https://up.example/mcp").await.unwrap();
        x.exchange("t", "https://up.example/mcp").await.unwrap();
        assert_eq!(x.exchanges(), 2);
        // One of 40 s is used until 20 s before it expires (half its life, under the margin).
        issuer.exchange_lifetime.store(40, Ordering::SeqCst);
        let kept = x.exchange("u", "https://up.example/mcp").await.unwrap();
        assert_eq!(
            x.exchange("u", "https://up.example/mcp")
                .await
                .unwrap()
                .bearer(),
            kept.bearer()
        );
        assert_eq!(x.exchanges(), 3);
    }

    #[tokio::test]
    async fn a_refused_exchange_says_why_without_the_token() {
        let (_issuer, x) = exchanger().await;
        let e = x
            .exchange("revoked-SECRET123", "https://up.example/mcp")
            .await
            .unwrap_err();
        match e {
            TokenError::Invalid(why) => {
                assert!(
                    why.contains("invalid_grant (the subject token is revoked)"),
                    "{why}"
                );
                assert!(!why.contains("SECRET123"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let unreachable =
            OidcExchanger::new(ExchangeConfig::new("http://127.0.0.1:1", "quiver", "s"))
                .unwrap()
                .exchange("t", "https://up.example/mcp")
                .await
                .unwrap_err();
        assert!(
            matches!(unreachable, TokenError::Unavailable(_)),
            "{unreachable:?}"
        );
        assert!(
            OidcExchanger::new(ExchangeConfig::new("http://127.0.0.1:1", "quiver", "")).is_err()
        );
    }
}
