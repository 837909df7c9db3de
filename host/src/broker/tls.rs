//! TLS for `amqps://` addresses: which CA to trust, an optional client
//! certificate (mutual TLS), and an optional server name to check instead
//! of the URL's host.
//!
//! Only the configured CA is trusted when `ca_file` is set (the built-in
//! Mozilla roots otherwise): a private broker's certificate should not be
//! accepted because some public CA signed something by that name. The
//! connector is built once at start, so a missing or unreadable file fails
//! the start with its path, and every reconnection reuses it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lapin::tcp::{RustlsConnector, RustlsConnectorConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::frame_guard::transport::Inner;

/// `[broker.tls]`, with paths already resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM file of the CA certificates to trust.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (then any intermediates).
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// The name the broker's certificate must carry (and the SNI sent),
    /// when it is not the URL's host (connecting by IP address, say).
    pub server_name: Option<String>,
}

/// A ready TLS client configuration.
#[derive(Clone)]
pub struct Tls {
    connector: Arc<RustlsConnector>,
    server_name: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Why a TLS configuration cannot be used; names the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

impl Tls {
    pub fn new(settings: &TlsSettings) -> Result<Self, TlsError> {
        let config = match &settings.ca_file {
            Some(path) => {
                let certs = certificates(path, "CA file")?;
                // An empty configuration trusts nothing but these.
                RustlsConnectorConfig::default().with_parsable_certificates(certs)
            }
            None => RustlsConnectorConfig::new_with_webpki_root_certs(),
        };
        let connector = match (&settings.cert_file, &settings.key_file) {
            (Some(cert), Some(key)) => {
                let chain = certificates(cert, "client certificate file")?;
                let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    TlsError(format!("cannot read the client key {}: {e}", key.display()))
                })?;
                config
                    .connector_with_single_cert(chain, key_der)
                    .map_err(|e| {
                        TlsError(format!(
                            "the client certificate {} and key {} do not fit together: {e}",
                            cert.display(),
                            key.display()
                        ))
                    })?
            }
            (None, None) => config
                .connector_with_no_client_auth()
                .map_err(|e| TlsError(format!("cannot set up TLS: {e}")))?,
            _ => {
                return Err(TlsError(
                    "a client certificate needs both cert_file and key_file".to_string(),
                ));
            }
        };
        Ok(Self {
            connector: Arc::new(connector),
            server_name: settings.server_name.clone(),
        })
    }

    /// The TLS of lapin's defaults: the built-in roots, no client
    /// certificate, the URL's host as the name.
    pub fn defaults() -> Result<Self, TlsError> {
        Self::new(&TlsSettings::default())
    }

    /// Shakes hands over a connected stream, checking the broker's
    /// certificate against the configured name or else `host`.
    pub async fn handshake(&self, stream: Inner, host: &str) -> std::io::Result<Inner> {
        let name = self.server_name.as_deref().unwrap_or(host);
        stream.into_rustls(&self.connector, name).await
    }
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError(format!("cannot read the {what} {}: {e}", path.display())))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError(format!("the {what} {} is not PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "the {what} {} holds no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ca_file_is_named() {
        let settings = TlsSettings {
            ca_file: Some(PathBuf::from("/nonexistent/ca.pem")),
            ..TlsSettings::default()
        };
        let err = Tls::new(&settings).unwrap_err().to_string();
        assert!(
            err.contains("cannot read the CA file /nonexistent/ca.pem"),
            "{err}"
        );
    }

    #[test]
    fn a_certificate_without_its_key_is_refused() {
        let settings = TlsSettings {
            cert_file: Some(PathBuf::from("client.pem")),
            ..TlsSettings::default()
        };
        let err = Tls::new(&settings).unwrap_err().to_string();
        assert_eq!(
            err,
            "a client certificate needs both cert_file and key_file"
        );
    }

    #[test]
    fn a_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let settings = TlsSettings {
            ca_file: Some(path.clone()),
            ..TlsSettings::default()
        };
        let err = Tls::new(&settings).unwrap_err().to_string();
        assert!(err.contains("holds no certificate"), "{err}");
    }
}
