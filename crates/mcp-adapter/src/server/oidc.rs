//! `[auth.oidc]`: Quiver as an OAuth 2.1 resource server (the MCP authorization spec). The
//! issuer and Quiver's resource URI, the claim rules that turn a verified token into a
//! principal, a tenant, a mode and what it may use, and the Protected Resource Metadata
//! (RFC 9728) a client discovers the issuer from. The token itself is verified by a
//! [`TokenVerifier`] the host plugs in (the OIDC adapter).

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    response::{IntoResponse, Response},
    routing::get,
};
use quiver_contract::{Capabilities, Mode};
use quiver_registry::identity::VerifiedToken;
use serde::{Deserialize, Serialize};

use super::auth::{AuthError, InboundToken, Principal};

/// `[auth.oidc]`: access tokens from an OpenID provider, beside the `[[auth.tokens]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct OidcAuth {
    /// The issuer (`iss`); its discovery document gives the keys.
    pub issuer: String,
    /// Quiver's resource URI (RFC 8707), e.g. `https://quiver.example.com/mcp`: a token's
    /// `aud` must name it, and the Protected Resource Metadata is served for it.
    pub resource: String,
    /// Scopes a client may ask for, as advertised in the metadata (none: not advertised).
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    /// Seconds the issuer's keys are used before they are fetched again (default 3600).
    #[serde(default)]
    pub jwks_refresh_secs: Option<u64>,
    /// The least seconds between two fetches of the keys (a token signed with an unknown key
    /// fetches them again, at most this often; default 10).
    #[serde(default)]
    pub jwks_min_refetch_secs: Option<u64>,
    /// Seconds of clock skew allowed on `exp` and `nbf` (default 30).
    #[serde(default)]
    pub leeway_secs: Option<u64>,
    /// RFC 7662 introspection for opaque (non-JWT) tokens: the endpoint (default: the one
    /// the discovery document names), used only when the client id and secret are set.
    #[serde(default)]
    pub introspection_endpoint: Option<String>,
    /// Quiver's client id at the issuer, for introspection.
    #[serde(default)]
    pub introspection_client_id: Option<String>,
    /// Its secret.
    #[serde(default)]
    pub introspection_client_secret: Option<String>,
    /// Quiver's own client id at the issuer, for RFC 8693 token exchange (servers with
    /// `auth = "exchange"`).
    #[serde(default)]
    pub client_id: Option<String>,
    /// Its secret (`client_secret_basic`).
    #[serde(default)]
    pub client_secret: Option<String>,
    /// How claims map to what a caller may do, first match wins. With none, every valid
    /// token may use everything; with some, a token no rule matches is refused (403).
    #[serde(default)]
    pub rules: Vec<ClaimRule>,
}

/// `[[auth.oidc.rules]]`: a token whose claim `claim` has `value` (or, for an array claim,
/// holds it; for `scope`, names it) gets this tenant, mode and these tools and servers. A
/// rule with neither `claim` nor `value` matches every token.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ClaimRule {
    /// The claim read (`groups`, `roles`, `scope`, `client_id`, `sub`, ...).
    #[serde(default)]
    pub claim: Option<String>,
    /// The value it must have or hold.
    #[serde(default)]
    pub value: Option<String>,
    /// Tool-name patterns the caller may call and find (`*` anywhere); absent: all.
    #[serde(default)]
    pub allowed_tools: Option<Vec<String>>,
    /// Upstream servers (patterns) whose resources and prompts the caller reaches; as for a
    /// token (see `InboundToken::allowed_servers`).
    #[serde(default)]
    pub allowed_servers: Option<Vec<String>>,
    /// The session mode; the server default when absent.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// The tenant the calls run for.
    #[serde(default)]
    pub tenant: Option<String>,
    /// May propose custom tools.
    #[serde(default)]
    pub admin: bool,
    /// The capabilities of the model behind these callers, for tools that `requires` them
    /// (as a token's `model_capabilities`).
    #[serde(default)]
    pub model_capabilities: Vec<String>,
    /// Tool-name patterns a policy always refuses this rule's callers (not a config key: the
    /// host fills it from the deny rules of the rule's tenant).
    #[serde(skip)]
    pub denied_tools: Vec<String>,
}

impl ClaimRule {
    /// The rule as an unnamed inbound token: the same lists give the same capabilities.
    fn as_token(&self) -> InboundToken {
        let mut t = InboundToken::new("", "");
        t.allowed_tools = self.allowed_tools.clone();
        t.allowed_servers = self.allowed_servers.clone();
        t.mode = self.mode;
        t.tenant = self.tenant.clone();
        t.admin = self.admin;
        t.model_capabilities = self.model_capabilities.clone();
        t.denied_tools = self.denied_tools.clone();
        t
    }
}

impl OidcAuth {
    /// Checks the rules: `claim` and `value` come together, tenants are non-empty.
    pub fn validate(&self) -> Result<(), AuthError> {
        for (i, r) in self.rules.iter().enumerate() {
            match (&r.claim, &r.value) {
                (Some(c), Some(_)) if c.is_empty() => {
                    return Err(AuthError::Invalid(format!(
                        "oidc.rules[{i}] has an empty `claim`: name the claim to read, e.g. `claim = \"groups\"`"
                    )));
                }
                (Some(_), None) | (None, Some(_)) => {
                    return Err(AuthError::Invalid(format!(
                        "oidc.rules[{i}] has one of `claim` and `value` without the other: give both (`claim = \"groups\"`, `value = \"admins\"`), or neither for a rule that matches every token"
                    )));
                }
                _ => {}
            }
            if r.tenant.as_deref() == Some("") {
                return Err(AuthError::Invalid(format!(
                    "oidc.rules[{i}] has an empty `tenant`: remove the key or name the tenant"
                )));
            }
        }
        if self.client_id.is_some() != self.client_secret.is_some() {
            return Err(AuthError::Invalid(
                "oidc: token exchange needs both `client_id` and `client_secret` (Quiver's own client at the issuer); set both, or neither".into(),
            ));
        }
        if url::Url::parse(&self.resource).is_err() {
            return Err(AuthError::Invalid(format!(
                "oidc: `resource = {:?}` is not an absolute URL: give Quiver's MCP endpoint as clients reach it, e.g. https://quiver.example.com/mcp",
                self.resource
            )));
        }
        Ok(())
    }

    /// Where the Protected Resource Metadata of the resource is (RFC 9728 §3.1: the
    /// well-known path inserted between the host and the resource's path).
    pub fn metadata_url(&self) -> String {
        let Ok(url) = url::Url::parse(&self.resource) else {
            return String::new();
        };
        let path = url.path().trim_end_matches('/');
        format!(
            "{}{METADATA_PATH}{path}",
            url.origin().ascii_serialization()
        )
    }

    /// The metadata document.
    fn metadata(&self) -> serde_json::Value {
        let mut doc = serde_json::json!({
            "resource": self.resource,
            "authorization_servers": [self.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "Quiver",
        });
        if !self.scopes_supported.is_empty() {
            doc["scopes_supported"] = serde_json::json!(self.scopes_supported);
        }
        doc
    }
}

/// The well-known path of the Protected Resource Metadata.
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// One compiled rule: what it matches (none: every token) and what it gives.
struct Compiled {
    matches: Option<(String, String)>,
    capabilities: Arc<Capabilities>,
    mode: Option<Mode>,
    tenant: Option<Arc<str>>,
}

/// The compiled rules in force.
pub(crate) struct Rules {
    rules: Vec<Compiled>,
    /// Whether the config had rules (then a token no rule matches is refused).
    restricted: bool,
}

impl Rules {
    pub(crate) fn new(oidc: &OidcAuth) -> Self {
        Rules {
            rules: oidc
                .rules
                .iter()
                .map(|r| Compiled {
                    matches: r.claim.clone().zip(r.value.clone()),
                    capabilities: Arc::new(r.as_token().capabilities()),
                    mode: r.mode,
                    tenant: r.tenant.as_deref().map(Arc::from),
                })
                .collect(),
            restricted: !oidc.rules.is_empty(),
        }
    }

    /// The principal of a verified token: the first rule it matches; with no rules at all,
    /// everything. `None`: rules exist and none matches.
    pub(crate) fn principal(&self, token: &VerifiedToken) -> Option<Principal> {
        let name: Arc<str> = user_label(token).into();
        if !self.restricted {
            return Some(Principal {
                name,
                capabilities: Arc::new(Capabilities::all()),
                mode: None,
                tenant: None,
                user: None,
            });
        }
        let rule = self.rules.iter().find(|r| {
            r.matches
                .as_ref()
                .is_none_or(|(claim, value)| token.claim_has(claim, value))
        })?;
        Some(Principal {
            name,
            capabilities: rule.capabilities.clone(),
            mode: rule.mode,
            tenant: rule.tenant.clone(),
            user: None,
        })
    }
}

/// The name a verified token's calls are recorded under: its `sub`, and its email when it
/// has one (`alice@example.com (248289761001)`). A `:` (working-set keys are
/// `conv:<principal>:<key>`), a `%` and control characters are percent-escaped, so two users'
/// names never meet.
pub(crate) fn user_label(token: &VerifiedToken) -> String {
    let raw = match &token.email {
        Some(email) => format!("{email} ({})", token.subject),
        None => token.subject.clone(),
    };
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        if c == ':' || c == '%' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The Protected Resource Metadata routes: at the path-inserted URL and at the bare
/// well-known path (clients try both), with no token asked for.
pub(crate) fn router(oidc: Arc<OidcAuth>) -> Router {
    let mut router = Router::new().route(METADATA_PATH, get(metadata));
    let path = url::Url::parse(&oidc.resource)
        .map(|u| u.path().trim_end_matches('/').to_owned())
        .unwrap_or_default();
    if !path.is_empty() {
        router = router.route(&format!("{METADATA_PATH}{path}"), get(metadata));
    }
    router.with_state(oidc)
}

async fn metadata(State(oidc): State<Arc<OidcAuth>>) -> Response {
    (
        [
            (axum::http::header::CACHE_CONTROL, "max-age=3600"),
            (axum::http::header::CONTENT_TYPE, "application/json"),
        ],
        oidc.metadata().to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use serde_json::json;

    use super::*;

    fn token(claims: serde_json::Value) -> VerifiedToken {
        let map = claims.as_object().unwrap().clone();
        let sub = map["sub"].as_str().unwrap().to_owned();
        VerifiedToken::new(sub, map, SystemTime::now())
    }

    fn oidc(rules: &str) -> OidcAuth {
        toml_like(&format!(
            r#"{{"issuer":"https://idp.example.com","resource":"https://q.example.com/mcp","rules":{rules}}}"#
        ))
    }

    fn toml_like(s: &str) -> OidcAuth {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn the_first_matching_rule_gives_the_principal() {
        let o = oidc(
            r#"[{"claim":"groups","value":"ops","allowed_tools":["*"],"tenant":"acme","mode":"agentic","model_capabilities":["vision"]},
                {"claim":"scope","value":"tools:read","allowed_tools":["get_*"]}]"#,
        );
        o.validate().unwrap();
        let rules = Rules::new(&o);
        let ops = rules
            .principal(&token(
                json!({"sub":"u1","email":"a@x.org","groups":["dev","ops"]}),
            ))
            .unwrap();
        assert_eq!(&*ops.name, "a@x.org (u1)");
        assert_eq!(ops.tenant.as_deref(), Some("acme"));
        assert_eq!(ops.mode, Some(Mode::Agentic));
        assert!(ops.capabilities.satisfies(&["vision".to_owned()]));
        let reader = rules
            .principal(&token(json!({"sub":"c:2","scope":"openid tools:read"})))
            .unwrap();
        assert_eq!(&*reader.name, "c%3A2");
        assert!(reader.capabilities.allows("get_time"));
        assert!(!reader.capabilities.allows("delete_all"));
        assert!(!reader.capabilities.satisfies(&["vision".to_owned()]));
        assert!(
            rules
                .principal(&token(json!({"sub":"u3","groups":"dev"})))
                .is_none()
        );
        let open = Rules::new(&oidc("[]"));
        assert!(open.principal(&token(json!({"sub":"u3"}))).is_some());
    }

    /// A verifier by table: `ops` and `stranger` are valid (the second in no group), `down`
    /// finds the issuer out of reach, anything else is expired.
    struct Table;

    #[async_trait::async_trait]
    impl quiver_registry::identity::TokenVerifier for Table {
        async fn verify(
            &self,
            t: &str,
        ) -> Result<Arc<VerifiedToken>, quiver_registry::identity::TokenError> {
            use quiver_registry::identity::TokenError;
            match t {
                "ops" => Ok(Arc::new(token(json!({"sub": "u1", "groups": ["ops"]})))),
                "stranger" => Ok(Arc::new(token(json!({"sub": "u2"})))),
                "down" => Err(TokenError::Unavailable("the issuer is down".into())),
                _ => Err(TokenError::Invalid("the token has expired".into())),
            }
        }
    }

    #[tokio::test]
    async fn the_token_layer_answers_each_outcome_of_the_verifier() {
        use axum::{body::Body, http::StatusCode};
        use http_body_util::BodyExt;
        use tower::ServiceExt;

        let auth = crate::InboundAuth::new(vec![crate::InboundToken::new("ci", "static-secret")])
            .with_oidc(oidc(r#"[{"claim":"groups","value":"ops"}]"#));
        let options = crate::ServerOptions::default().with_auth(auth);
        let server = crate::server::test_server(Arc::new(quiver_registry::Catalog::new()), options)
            .with_token_verifier(Arc::new(Table));
        let router = server.router("127.0.0.1:7345".parse().unwrap());
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
        let send = |bearer: Option<&str>, method: &str, path: &str| {
            let mut request = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .header("host", "127.0.0.1:7345")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream");
            if let Some(b) = bearer {
                request = request.header("authorization", format!("Bearer {b}"));
            }
            let body = if method == "POST" {
                Body::from(init)
            } else {
                Body::empty()
            };
            router.clone().oneshot(request.body(body).unwrap())
        };
        let challenge = |r: &axum::response::Response| {
            r.headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let meta =
            "resource_metadata=\"https://q.example.com/.well-known/oauth-protected-resource/mcp\"";
        let r = send(None, "POST", "/mcp").await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(challenge(&r).unwrap(), format!("Bearer {meta}"));
        let r = send(Some("expired"), "POST", "/mcp").await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            challenge(&r).unwrap(),
            format!(
                "Bearer error=\"invalid_token\", error_description=\"the token has expired\", {meta}"
            )
        );
        let r = send(Some("stranger"), "POST", "/mcp").await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(
            challenge(&r)
                .unwrap()
                .contains("error=\"insufficient_scope\"")
        );
        let r = send(Some("down"), "POST", "/mcp").await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(challenge(&r), None);
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("the issuer is down"));
        for ok in ["ops", "static-secret"] {
            let r = send(Some(ok), "POST", "/mcp").await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{ok}");
        }
        for path in [METADATA_PATH, "/.well-known/oauth-protected-resource/mcp"] {
            let r = send(None, "GET", path).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            let body = r.into_body().collect().await.unwrap().to_bytes();
            let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(doc["resource"], "https://q.example.com/mcp");
        }
    }

    #[test]
    fn rules_and_the_metadata_url_are_checked() {
        let e = oidc(r#"[{"claim":"groups"}]"#).validate().unwrap_err();
        assert!(
            e.to_string()
                .contains("oidc.rules[0] has one of `claim` and `value`"),
            "{e}"
        );
        let o = oidc("[]");
        assert_eq!(
            o.metadata_url(),
            "https://q.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            o.metadata()["authorization_servers"][0],
            "https://idp.example.com"
        );
        assert!(
            serde_json::from_str::<OidcAuth>(r#"{"issuer":"a","resource":"b","audiance":"c"}"#)
                .is_err()
        );
    }
}
