//! `[auth.oidc]` wired to the OIDC adapter: the verifier `quiver serve` checks access tokens
//! with.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use quiver_auth_oidc::{Introspection, OidcConfig, OidcVerifier};
use quiver_mcp_adapter::OidcAuth;
use quiver_registry::identity::TokenVerifier;

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
