//! A request whose `Origin` is not one of the server's: rmcp refuses it (403, DNS-rebinding
//! and cross-site protection); Quiver tells the client why and what would let it in, and
//! logs each refused origin once (a page that retries is not a line per request).

use std::{collections::HashSet, sync::Mutex};

use axum::{
    body::Body,
    http::{HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};

use crate::sync::lock;

/// How many distinct refused origins are remembered (and logged); past it, refusals are
/// not logged.
const REMEMBERED: usize = 64;

/// The origins refused so far.
#[derive(Default)]
pub(crate) struct Refused(Mutex<HashSet<String>>);

/// What rmcp's 403 for an origin says (it also refuses a bad `Host`, which Quiver's own
/// layer has checked by then).
const RMCP_ORIGIN: &[&str] = &[
    "Forbidden: Origin header is not allowed",
    "Forbidden: Invalid Origin header",
    "Forbidden: Invalid Origin header encoding",
];

/// `response`, rmcp's 403 to a request from `origin`, in Quiver's words when it refused the
/// origin; the origin is logged the first time.
pub(super) async fn refused(seen: &Refused, origin: &HeaderValue, response: Response) -> Response {
    let (head, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    if !RMCP_ORIGIN.iter().any(|t| text.as_ref() == t.as_bytes()) {
        return Response::from_parts(head, Body::from(text));
    }
    let shown =
        quiver_contract::printable(&String::from_utf8_lossy(origin.as_bytes())).into_owned();
    let host = shown
        .split_once("://")
        .map_or(shown.as_str(), |(_, rest)| rest)
        .to_owned();
    let first = {
        let mut seen = lock(&seen.0);
        seen.len() < REMEMBERED && seen.insert(shown.clone())
    };
    if first {
        tracing::warn!(
            origin = %shown,
            "refused requests from a web page at {shown}: not one of this server's origins \
             (a browser page of another site; if the site is yours, start with --allow-host {host}); \
             later refusals of this origin are not logged"
        );
    }
    (
        StatusCode::FORBIDDEN,
        format!(
            "Forbidden: requests from a web page at {shown} are not accepted (only pages of this \
             server's own addresses are); if that site is yours, the operator adds it with \
             --allow-host {host}"
        ),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rmcp_403() -> Response {
        (
            StatusCode::FORBIDDEN,
            "Forbidden: Origin header is not allowed",
        )
            .into_response()
    }

    /// Each refused origin is remembered (and logged) once, up to a bound; another 403 is
    /// passed on as it is.
    #[tokio::test]
    async fn each_refused_origin_is_logged_once() {
        let seen = Refused::default();
        let evil = HeaderValue::from_static("http://evil.example");
        for _ in 0..3 {
            let r = refused(&seen, &evil, rmcp_403()).await;
            assert_eq!(r.status(), StatusCode::FORBIDDEN);
        }
        assert_eq!(lock(&seen.0).len(), 1);
        for i in 0..100 {
            let other = HeaderValue::from_str(&format!("http://site{i}.example")).unwrap();
            refused(&seen, &other, rmcp_403()).await;
        }
        assert_eq!(lock(&seen.0).len(), REMEMBERED);
        let other = (StatusCode::FORBIDDEN, "Forbidden: something else").into_response();
        let r = refused(&seen, &evil, other).await;
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        assert_eq!(&body[..], b"Forbidden: something else");
    }
}
