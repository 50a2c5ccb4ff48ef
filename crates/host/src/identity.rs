//! `[auth.oidc]` wired to the OIDC adapter: the verifier `quiver serve` checks access tokens
//! with.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use quiver_auth_oidc::{ExchangeConfig, Introspection, OidcConfig, OidcExchanger, OidcVerifier};
use quiver_mcp_adapter::OidcAuth;
use quiver_registry::identity::{TokenExchanger, TokenVerifier};

/// The adapter's settings from `[auth.oidc]`.
pub(crate) fn oidc_config(oidc: &OidcAuth) -> anyhow::Result<OidcConfig> {
    let mut config = OidcConfig::new(&oidc.issuer, &oidc.resource);
    if let Some(s) = oidc.jwks_refresh_secs {
        config.jwks_refresh = Duration::from_secs(s);
    }
    if let Some(s) = oidc.jwks_min_refetch_secs {
        config.jwks_min_refetch = Duration::from_secs(s);
    }
    if let Some(s) = oidc.leeway_secs {
        config.leeway = Duration::from_secs(s);
    }
    config.introspection = match (
        &oidc.introspection_client_id,
        &oidc.introspection_client_secret,
    ) {
        (Some(id), Some(secret)) => Some(Introspection::new(
            oidc.introspection_endpoint.clone(),
            id,
            secret,
        )),
        (None, None) if oidc.introspection_endpoint.is_none() => None,
        _ => anyhow::bail!(
            "[auth.oidc]: introspection needs both `introspection_client_id` and `introspection_client_secret` (Quiver's client at the issuer); set both, or neither and no `introspection_endpoint`"
        ),
    };
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("[auth.oidc]: {e}"))?;
    Ok(config)
}

/// The verifier of `[auth.oidc]` (nothing is fetched until the first token).
pub(crate) fn verifier(oidc: &OidcAuth) -> anyhow::Result<Arc<dyn TokenVerifier>> {
    let verifier = OidcVerifier::new(oidc_config(oidc)?).context("[auth.oidc]")?;
    Ok(Arc::new(verifier))
}

/// What `[auth.oidc]`'s provider says of the configuration, read now (its discovery
/// document, within `limit`): `None` when tokens can be checked; else why not, and
/// whether it is the configuration's fault (`true`) or the provider is out of reach.
pub async fn oidc_problem(oidc: &OidcAuth, limit: std::time::Duration) -> Option<(String, bool)> {
    let verifier = match oidc_config(oidc).and_then(|c| Ok(OidcVerifier::new(c)?)) {
        Ok(v) => v,
        Err(e) => return Some((format!("{e:#}"), true)),
    };
    match tokio::time::timeout(limit, verifier.probe()).await {
        Ok(Ok(())) => None,
        Ok(Err(quiver_registry::identity::TokenError::Misconfigured(why))) => Some((why, true)),
        Ok(Err(e)) => Some((e.to_string(), false)),
        Err(_) => Some((
            format!(
                "the provider did not answer within {}",
                quiver_contract::duration_text(limit)
            ),
            false,
        )),
    }
}

/// The token exchange of `[auth.oidc]` (`client_id` and `client_secret`: Quiver's own client
/// at the issuer), for servers with `auth = "exchange"`; `None` when they are not set.
pub(crate) fn exchanger(oidc: &OidcAuth) -> anyhow::Result<Option<Arc<dyn TokenExchanger>>> {
    let (Some(id), Some(secret)) = (&oidc.client_id, &oidc.client_secret) else {
        return Ok(None);
    };
    let exchanger =
        OidcExchanger::new(ExchangeConfig::new(&oidc.issuer, id, secret)).context("[auth.oidc]")?;
    Ok(Some(Arc::new(exchanger)))
}
