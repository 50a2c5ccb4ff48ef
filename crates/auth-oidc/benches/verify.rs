//! What a JWT access token costs a request: `OidcVerifier::verify` of a token verified
//! before (the cache: its SHA-256 and a map lookup; the per-request cost, target ≤ 20 µs)
//! and of tokens never seen (ES256 signature, claims), against an in-process issuer.

#![allow(missing_docs)]

#[path = "../src/test_issuer.rs"]
mod test_issuer;

use criterion::{Criterion, criterion_group, criterion_main};
use quiver_auth_oidc::{OidcConfig, OidcVerifier};
use quiver_registry::identity::TokenVerifier;
use serde_json::json;
use test_issuer::{TestIssuer, TestKey};

const AUD: &str = "https://quiver.example.com/mcp";

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let key = TestKey::new("k1");
    let issuer = rt.block_on(TestIssuer::start(&[&key]));
    let claims = json!({"email": "ops@example.com", "groups": ["ops", "dev"], "scope": "tools"});
    let verifier = OidcVerifier::new(OidcConfig::new(&issuer.url, AUD)).expect("config");
    let token = issuer.token(&key, AUD, 3600, claims.clone());
    rt.block_on(verifier.verify(&token)).expect("valid");
    c.bench_function("verify/cached", |b| {
        b.to_async(&rt).iter(|| async {
            verifier.verify(&token).await.expect("valid");
        });
    });
    // A cache of one and distinct tokens: every verification checks the signature.
    let mut config = OidcConfig::new(&issuer.url, AUD);
    config.cache_capacity = 1;
    let cold = OidcVerifier::new(config).expect("config");
    let tokens: Vec<String> = (0..512)
        .map(|i| issuer.token(&key, AUD, 3600 + i, claims.clone()))
        .collect();
    rt.block_on(cold.verify(&tokens[0])).expect("valid");
    let mut i = 0;
    c.bench_function("verify/uncached_es256", |b| {
        b.to_async(&rt).iter(|| {
            i = (i + 1) % tokens.len();
            let t = &tokens[i];
            let cold = &cold;
            async move {
                cold.verify(t).await.expect("valid");
            }
        });
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
