//! A private certificate authority for the TLS tests (the broker's in
//! tests/tls.rs, Redis's in tests/state_store.rs): a CA written as a PEM
//! file, and the server and client certificates it signs.

use std::path::{Path, PathBuf};

pub use rcgen::ExtendedKeyUsagePurpose;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A CA, its certificate written to `ca`.
pub struct Pki {
    pub ca: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    /// A new CA named `name`, written to `{dir}/{name}.pem`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let ca = dir.join(format!("{name}.pem"));
        std::fs::write(&ca, cert.pem()).unwrap();
        Self {
            ca,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (an IP address becomes an IP SAN) and its
    /// key, written as `{dir}/{file}.pem` and `{dir}/{file}.key`: (certificate
    /// file, key file).
    pub fn leaf(
        &self,
        dir: &Path,
        file: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, file);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_file, key_file) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }
}
