//! The issuer's signing keys, read from its JWKS: asymmetric keys only, each with the
//! algorithms it may verify.

use std::str::FromStr;

use jsonwebtoken::{Algorithm, DecodingKey, jwk::Jwk};
use serde_json::Value;

/// One usable key of the set.
pub(crate) struct Key {
    pub(crate) kid: Option<String>,
    pub(crate) decoding: DecodingKey,
    /// The algorithms this key verifies: the JWK's `alg` when it names one, else every
    /// algorithm of its key type. Never an HMAC one.
    pub(crate) algorithms: Vec<Algorithm>,
}

const RSA: [Algorithm; 6] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// Whether `alg` is an HMAC algorithm (a shared secret, which a resource server reading a
/// public JWKS never holds: a token signed so with the public key as the secret is forged).
pub(crate) fn is_hmac(alg: Algorithm) -> bool {
    matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

/// The usable keys of a JWKS document; a key of another type (`oct`), for encryption
/// (`use: enc`), or that does not parse is left out, and said so at debug level.
pub(crate) fn parse_jwks(body: &[u8]) -> Result<Vec<Key>, String> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| format!("the JWKS is not JSON ({e})"))?;
    let Some(keys) = doc.get("keys").and_then(Value::as_array) else {
        return Err("the JWKS has no `keys` array".into());
    };
    let mut out = Vec::new();
    for raw in keys {
        let kid = raw.get("kid").and_then(Value::as_str).map(str::to_owned);
        if raw.get("use").and_then(Value::as_str) == Some("enc") {
            continue;
        }
        let kty = raw.get("kty").and_then(Value::as_str).unwrap_or_default();
        let by_type: Vec<Algorithm> = match kty {
            "RSA" => RSA.to_vec(),
            "EC" => match raw.get("crv").and_then(Value::as_str) {
                Some("P-256") => vec![Algorithm::ES256],
                Some("P-384") => vec![Algorithm::ES384],
                _ => continue,
            },
            "OKP" if raw.get("crv").and_then(Value::as_str) == Some("Ed25519") => {
                vec![Algorithm::EdDSA]
            }
            // `oct` (a shared secret) and anything else: never a verification key here.
            _ => continue,
        };
        let algorithms = match raw.get("alg").and_then(Value::as_str) {
            Some(alg) => match Algorithm::from_str(alg) {
                Ok(a) if by_type.contains(&a) => vec![a],
                _ => {
                    tracing::debug!(kid = ?kid, alg, "JWKS key skipped: its alg does not fit its key type");
                    continue;
                }
            },
            None => by_type,
        };
        let jwk: Jwk = match serde_json::from_value(raw.clone()) {
            Ok(j) => j,
            Err(e) => {
                tracing::debug!(kid = ?kid, error = %e, "JWKS key skipped: not a JWK this verifier reads");
                continue;
            }
        };
        let decoding = match DecodingKey::from_jwk(&jwk) {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(kid = ?kid, error = %e, "JWKS key skipped: unusable");
                continue;
            }
        };
        out.push(Key {
            kid,
            decoding,
            algorithms,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symmetric_and_encryption_keys_are_left_out() {
        let jwks = br#"{"keys":[
            {"kty":"oct","kid":"h","k":"c2VjcmV0"},
            {"kty":"RSA","kid":"e","use":"enc","n":"sXch","e":"AQAB"},
            {"kty":"RSA","kid":"r","alg":"HS256","n":"sXch","e":"AQAB"},
            {"kty":"OKP","kid":"o","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
        ]}"#;
        let keys = parse_jwks(jwks).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref().unwrap()).collect();
        assert_eq!(kids, ["o"]);
        assert_eq!(keys[0].algorithms, [Algorithm::EdDSA]);
        assert!(parse_jwks(b"{}").err().unwrap().contains("no `keys` array"));
        assert!(parse_jwks(b"nope").err().unwrap().contains("not JSON"));
    }
}
