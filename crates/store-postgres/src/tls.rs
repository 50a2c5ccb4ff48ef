//! TLS to the server, as libpq's `sslmode` and `sslrootcert` ask in `[store] url`: rustls
//! with the ring provider. The driver knows `sslmode=disable|prefer|require` but neither the
//! verifying modes nor `sslrootcert`, so both are taken out of the URL here and the driver
//! is given the rest.
//!
//! | `sslmode` | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | when the server offers it | no (against `sslrootcert` when given) |
//! | `require` | always | no (against `sslrootcert` when given, as libpq does) |
//! | `verify-ca` | always | signed by a trusted CA |
//! | `verify-full` | always | signed by a trusted CA and naming the host |
//!
//! The trusted CAs are those of the `sslrootcert` PEM file, else the system's roots.

use std::{path::PathBuf, sync::Arc};

use percent_encoding::percent_decode_str;
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::WebPkiSupportedAlgorithms,
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector every connection of the store uses.
pub(crate) type Connector = MakeRustlsConnect;

/// What `sslmode` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Option<Mode> {
        Some(match value {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            _ => return None,
        })
    }

    /// The driver's mode: whether it asks the server for TLS, and whether it must get it.
    fn driver(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

/// The TLS settings of a URL, taken out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) mode: Mode,
    pub(crate) root_cert: Option<PathBuf>,
}

/// Splits `url` into the driver's part and the TLS settings (`sslmode`, `sslrootcert`),
/// for a URL (`postgres://…?sslmode=verify-full&sslrootcert=/etc/ca.pem`) or a key/value
/// string (`host=db sslmode=require`). An unknown `sslmode` is an error naming the ones
/// there are.
pub(crate) fn split(url: &str) -> Result<(String, Settings), String> {
    let mut mode = None;
    let mut root_cert = None;
    let mut take = |key: &str, value: &str| -> Result<bool, String> {
        match key {
            "sslmode" => {
                mode = Some(Mode::parse(value).ok_or_else(|| {
                    format!("sslmode={value} is not a mode: write disable, prefer, require, verify-ca or verify-full")
                })?);
                Ok(true)
            }
            "sslrootcert" => {
                root_cert = Some(PathBuf::from(value));
                Ok(true)
            }
            _ => Ok(false),
        }
    };
    let rest = if url.contains("://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    let value = percent_decode_str(v).decode_utf8_lossy();
                    if !take(k, &value)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => url.to_owned(),
        }
    } else {
        let mut kept = Vec::new();
        for token in url.split_whitespace() {
            let (k, v) = token.split_once('=').unwrap_or((token, ""));
            if !take(k.trim(), v.trim_matches('\''))? {
                kept.push(token);
            }
        }
        kept.join(" ")
    };
    Ok((
        rest,
        Settings {
            mode: mode.unwrap_or(Mode::Prefer),
            root_cert,
        },
    ))
}

/// Applies `settings` to the driver's config and builds the connector. An unreadable
/// `sslrootcert`, or one without a certificate, is an error naming the file.
pub(crate) fn connector(
    settings: &Settings,
    cfg: &mut tokio_postgres::Config,
) -> Result<Connector, String> {
    cfg.ssl_mode(settings.mode.driver());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?;
    let roots = match (&settings.root_cert, settings.mode) {
        (Some(path), _) => Some(read_roots(path)?),
        (None, Mode::VerifyCa | Mode::VerifyFull) => Some(system_roots()?),
        (None, _) => None,
    };
    let config = match roots {
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked {
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        Some(roots) => {
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("cannot set up TLS: {e}"))?;
            if settings.mode == Mode::VerifyFull {
                builder.with_webpki_verifier(webpki).with_no_client_auth()
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(CaOnly(webpki)))
                    .with_no_client_auth()
            }
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

fn read_roots(path: &std::path::Path) -> Result<RootCertStore, String> {
    let shown = path.display();
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read sslrootcert {shown} ({e}): point it at the PEM file of the CA that signed the server's certificate"))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        let cert =
            cert.map_err(|e| format!("sslrootcert {shown} is not a PEM certificate file ({e})"))?;
        roots.add(cert).map_err(|e| {
            format!("sslrootcert {shown} holds a certificate rustls cannot use ({e})")
        })?;
    }
    if roots.is_empty() {
        return Err(format!(
            "sslrootcert {shown} holds no certificate: point it at the PEM file of the CA that signed the server's certificate"
        ));
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err("the system has no CA certificates to check the server's certificate against: set sslrootcert in [store] url to the CA's PEM file".into());
    }
    Ok(roots)
}

/// `sslmode=prefer|require` without `sslrootcert`: the connection is encrypted, the
/// certificate not checked (as libpq does); the handshake's signatures still are.
#[derive(Debug)]
struct Unchecked {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca` (and `require` with `sslrootcert`): the chain must lead to a
/// trusted CA; the name in the certificate is not compared with the host.
#[derive(Debug)]
struct CaOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for CaOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The operator's sentence for a failed TLS handshake or negotiation in `e`'s chain, if
/// that is what failed.
pub(crate) fn explain(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    while let Some(err) = next {
        let rustls_err = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(r) = rustls_err {
            return Some(match r {
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. },
                ) => format!(
                    "TLS: the server's certificate does not name the host in [store] url ({r}): connect by a name the certificate lists, or set sslmode=verify-ca to check only its CA"
                ),
                rustls::Error::InvalidCertificate(
                    rustls::CertificateError::UnknownIssuer
                    | rustls::CertificateError::BadSignature,
                ) => format!(
                    "TLS: the server's certificate is not signed by a trusted CA ({r}): set sslrootcert in [store] url to the PEM file of the CA that signed the server's certificate (without sslrootcert the system's CAs are trusted)"
                ),
                rustls::Error::InvalidCertificate(_) => format!(
                    "TLS: the server's certificate was refused ({r}): renew it, or fix sslrootcert in [store] url"
                ),
                _ => format!(
                    "TLS: the handshake with the server failed ({r}): check the server's ssl settings and sslmode in [store] url"
                ),
            });
        }
        if err.to_string().contains("server does not support TLS") {
            return Some("TLS: the server does not accept TLS connections, and sslmode in [store] url requires it: turn ssl on in the server's postgresql.conf, or lower sslmode to prefer or disable".into());
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_come_out_of_the_url() {
        for (url, rest, mode, root) in [
            (
                "postgres://u:p@db/q",
                "postgres://u:p@db/q",
                Mode::Prefer,
                None,
            ),
            (
                "postgres://u:p@db/q?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
                "postgres://u:p@db/q?application_name=x",
                Mode::VerifyFull,
                Some("/etc/ca.pem"),
            ),
            (
                "postgresql://db/q?sslmode=disable",
                "postgresql://db/q",
                Mode::Disable,
                None,
            ),
            (
                "host=db user=u sslmode=verify-ca sslrootcert=/ca.pem",
                "host=db user=u",
                Mode::VerifyCa,
                Some("/ca.pem"),
            ),
        ] {
            let (got, settings) = split(url).expect(url);
            assert_eq!(got, rest, "{url}");
            assert_eq!(settings.mode, mode, "{url}");
            assert_eq!(settings.root_cert, root.map(PathBuf::from), "{url}");
        }
    }

    #[test]
    fn an_unknown_sslmode_names_the_modes() {
        let err = split("postgres://db/q?sslmode=verify").unwrap_err();
        assert!(err.contains("sslmode=verify is not a mode"), "{err}");
        assert!(err.contains("verify-full"), "{err}");
    }

    #[test]
    fn a_missing_root_certificate_is_named() {
        let settings = Settings {
            mode: Mode::VerifyFull,
            root_cert: Some(PathBuf::from("/nonexistent/ca.pem")),
        };
        let mut cfg = tokio_postgres::Config::new();
        let err = connector(&settings, &mut cfg).err().expect("an error");
        assert!(
            err.contains("cannot read sslrootcert /nonexistent/ca.pem"),
            "{err}"
        );
    }
}
