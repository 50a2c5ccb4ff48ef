//! The HTTP client for streamable-HTTP upstreams: rustls with ring, and a redirect policy
//! that never leaves the configured origin, so configured headers and the bearer token are
//! sent to that origin only.

use std::time::Duration;

use reqwest::{Url, redirect};

/// Whether two URLs share scheme, host and port.
pub(crate) fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str().map(str::to_ascii_lowercase) == b.host_str().map(str::to_ascii_lowercase)
        && a.port_or_known_default() == b.port_or_known_default()
}

/// Follows at most 5 redirects, all within `origin`; a redirect elsewhere is not followed
/// (the 3xx is returned and the request fails), so nothing is sent to another origin.
pub(crate) fn redirect_policy(origin: Url) -> redirect::Policy {
    redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 5 || !same_origin(&origin, attempt.url()) {
            attempt.stop()
        } else {
            attempt.follow()
        }
    })
}

/// A reqwest client for one upstream; `timeout` bounds connecting (a streamable-HTTP GET
/// stream may stay open indefinitely, so there is no whole-request timeout).
pub(crate) fn client(url: &Url, timeout: Option<Duration>) -> reqwest::Result<reqwest::Client> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Loses the race harmlessly if another thread installs one first.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let mut b = reqwest::Client::builder().redirect(redirect_policy(url.clone()));
    if let Some(t) = timeout {
        b = b.connect_timeout(t);
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert!(same_origin(
            &u("https://a.example/mcp"),
            &u("https://A.example:443/x")
        ));
        assert!(!same_origin(
            &u("https://a.example/mcp"),
            &u("https://b.example/mcp")
        ));
        assert!(!same_origin(
            &u("http://a.example/mcp"),
            &u("https://a.example/mcp")
        ));
        assert!(!same_origin(
            &u("http://127.0.0.1:1/"),
            &u("http://127.0.0.1:2/")
        ));
    }
}
