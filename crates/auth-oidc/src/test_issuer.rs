//! An issuer for this crate's tests and bench, in process: an ES256 key pair made per run,
//! its discovery document and JWKS served over loopback HTTP (a few lines of HTTP/1.1, one
//! request per connection), the JWKS fetches counted, and tokens signed with its keys. Its
//! token endpoint answers RFC 8693 exchanges: `exchanged-N` for the Nth, valid for
//! `exchange_lifetime` seconds, or `invalid_grant` for the subject token `revoked`; each
//! request is kept (its head and form body) for the tests to read.
//! Shared with `benches/verify.rs` through `#[path]`.

#![allow(dead_code, unreachable_pub)]

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};

use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One signing key: its kid, the private half for signing, the JWK of the public half.
pub struct TestKey {
    pub kid: String,
    pub encoding: EncodingKey,
    pub jwk: Value,
}

impl TestKey {
    pub fn new(kid: &str) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("a P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("the key reads back");
        // The uncompressed point: 0x04, x, y.
        let point = pair.public_key().as_ref();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        TestKey {
            kid: kid.to_owned(),
            encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({
                "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
                "x": b64(&point[1..33]), "y": b64(&point[33..65]),
            }),
        }
    }
}

/// The issuer: its URL, the keys it publishes (changeable), how often its JWKS was fetched.
pub struct TestIssuer {
    pub url: String,
    pub published: Arc<Mutex<Vec<Value>>>,
    pub jwks_fetches: Arc<AtomicUsize>,
    /// The token endpoint's requests: (the head, the body).
    pub exchanges: Arc<Mutex<Vec<(String, String)>>>,
    /// The `expires_in` of the tokens the token endpoint gives.
    pub exchange_lifetime: Arc<AtomicUsize>,
}

impl TestIssuer {
    /// Serves on a loopback port until the runtime ends.
    pub async fn start(keys: &[&TestKey]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let published = Arc::new(Mutex::new(keys.iter().map(|k| k.jwk.clone()).collect()));
        let jwks_fetches = Arc::new(AtomicUsize::new(0));
        let exchanges: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let exchange_lifetime = Arc::new(AtomicUsize::new(600));
        let (base, keys, count) = (url.clone(), published.clone(), jwks_fetches.clone());
        let (seen, lifetime) = (exchanges.clone(), exchange_lifetime.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let (base, keys, count) = (base.clone(), keys.clone(), count.clone());
                let (seen, lifetime) = (seen.clone(), lifetime.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
                    let mut form = head.split_off(end);
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while form.len() < length {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => form.extend_from_slice(&buf[..n]),
                        }
                    }
                    let form = String::from_utf8_lossy(&form).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    let mut status = "200 OK";
                    let body = match path.as_str() {
                        "/.well-known/openid-configuration" => json!({
                            "issuer": base,
                            "jwks_uri": format!("{base}/jwks"),
                            "token_endpoint": format!("{base}/token"),
                        })
                        .to_string(),
                        "/token" => {
                            let n = {
                                let mut seen = seen.lock().unwrap();
                                seen.push((head.clone(), form.clone()));
                                seen.len()
                            };
                            if form.contains("subject_token=revoked") {
                                status = "400 Bad Request";
                                json!({"error": "invalid_grant", "error_description": "the subject token is revoked"}).to_string()
                            } else {
                                json!({
                                    "access_token": format!("exchanged-{n}"),
                                    "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                                    "token_type": "Bearer",
                                    "expires_in": lifetime.load(Ordering::SeqCst),
                                })
                                .to_string()
                            }
                        }
                        "/jwks" => {
                            count.fetch_add(1, Ordering::SeqCst);
                            json!({"keys": *keys.lock().unwrap()}).to_string()
                        }
                        _ => String::new(),
                    };
                    if body.is_empty() {
                        status = "404 Not Found";
                    }
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        TestIssuer {
            url,
            published,
            jwks_fetches,
            exchanges,
            exchange_lifetime,
        }
    }

    /// Publishes these keys from now on.
    pub fn publish(&self, keys: &[&TestKey]) {
        *self.published.lock().unwrap() = keys.iter().map(|k| k.jwk.clone()).collect();
    }

    pub fn fetches(&self) -> usize {
        self.jwks_fetches.load(Ordering::SeqCst)
    }

    /// A token signed with `key`, from this issuer, for `aud`, expiring `exp_in` seconds from
    /// now (negative: in the past), with `extra` claims.
    pub fn token(&self, key: &TestKey, aud: &str, exp_in: i64, extra: Value) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64;
        let mut claims = json!({
            "iss": self.url, "aud": aud, "sub": "user-1", "iat": now, "exp": now + exp_in,
        });
        if let (Some(c), Some(e)) = (claims.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(key.kid.clone());
        jsonwebtoken::encode(&header, &claims, &key.encoding).expect("signs")
    }
}
