//! Whom the executors trust over TLS: the system's certificate authorities,
//! plus a destination's own `ca_file` (a self-hosted forge's CA).
//!
//! Two TLS stacks meet here, chosen deliberately:
//! - HTTP calls (forges, webhooks) go through `ureq` over rustls with the
//!   ring provider; its roots are the system's (rustls-native-certs) plus
//!   the destination's `ca_file`.
//! - Git over HTTPS goes through libgit2, whose only TLS backend on Linux
//!   is OpenSSL (Debian's libssl, or vendored with the `vendored-openssl`
//!   feature). OpenSSL verifies against the system's roots; when it does
//!   not trust the server and the remote has a `ca_file`, libgit2 hands the
//!   server's certificate to [`verify_leaf`], which verifies it with rustls
//!   (webpki: chain to the file's authorities, the host name, the validity
//!   period). Anything else is refused; nothing is trusted on first use and
//!   no verification is ever switched off
//!   (`tests/destinations.rs::https_to_a_server_of_another_ca_or_with_an_expired_certificate_is_refused`,
//!   `tests::a_leaf_is_trusted_only_for_its_ca_and_name`).
//!
//! Invariants:
//! - A `ca_file` adds trust for its destination only, never for others
//!   (`tests::a_leaf_is_trusted_only_for_its_ca_and_name`).
//! - A `ca_file` that holds no certificate is an error naming it, not an
//!   empty (or system-only) trust
//!   (`tests::a_ca_file_without_certificates_is_an_error_naming_it`).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::client::danger::ServerCertVerifier as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// Why a trust store could not be made, or a certificate was not trusted.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the CA file {path}: {why}")]
    CaFile { path: String, why: String },
    #[error("the certificate of {host} is not trusted: {why}")]
    Untrusted { host: String, why: String },
}

/// The ring provider, the one crypto provider of this crate.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The system's certificate authorities, read once per process.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if !found.errors.is_empty() {
            tracing::warn!(
                errors = found.errors.len(),
                "some system certificate authorities could not be read"
            );
        }
        found.certs
    })
}

/// The certificates of a PEM file; none is an error.
pub(crate) fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let fail = |why: String| TlsError::CaFile {
        path: path.display().to_string(),
        why,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("it holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The TLS settings of one HTTP call: rustls (ring), the system's roots and
/// the destination's `ca_file`.
pub(crate) fn ureq_tls(ca_file: Option<&Path>) -> Result<ureq::tls::TlsConfig, TlsError> {
    let mut roots: Vec<ureq::tls::Certificate<'static>> = system_roots()
        .iter()
        .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    if let Some(path) = ca_file {
        for c in read_ca_file(path)? {
            roots.push(ureq::tls::Certificate::from_der(c.as_ref()).to_owned());
        }
    }
    Ok(ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(provider())
        .root_certs(ureq::tls::RootCerts::new_with_certs(&roots))
        .build())
}

/// Verifies a server's certificate (DER) for `host` against the
/// authorities of `ca_file` at `now`: the chain, the name, the validity.
pub(crate) fn verify_leaf(
    leaf: &[u8],
    host: &str,
    ca_file: &Path,
    now: UnixTime,
) -> Result<(), TlsError> {
    let untrusted = |why: String| TlsError::Untrusted {
        host: host.to_string(),
        why,
    };
    let cas = read_ca_file(ca_file)?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(cas.iter().cloned());
    if added == 0 {
        return Err(TlsError::CaFile {
            path: ca_file.display().to_string(),
            why: "no usable certificate authority in it".into(),
        });
    }
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| untrusted(e.to_string()))?;
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| untrusted("the host is not a valid server name".into()))?;
    verifier
        .verify_server_cert(&CertificateDer::from(leaf.to_vec()), &cas, &name, &[], now)
        .map(|_| ())
        .map_err(|e| untrusted(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        (params.self_signed(&key).unwrap(), key)
    }

    fn leaf(issuer: &(rcgen::Certificate, rcgen::KeyPair), host: &str) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![host.to_string()]).unwrap();
        params
            .signed_by(&key, &issuer.0, &issuer.1)
            .unwrap()
            .der()
            .to_vec()
    }

    #[test]
    fn a_leaf_is_trusted_only_for_its_ca_and_name() {
        let dir = tempfile::tempdir().unwrap();
        let ours = ca("ours");
        let theirs = ca("theirs");
        let file = dir.path().join("ca.pem");
        std::fs::write(&file, ours.0.pem()).unwrap();
        let now = UnixTime::now();
        assert!(verify_leaf(&leaf(&ours, "127.0.0.1"), "127.0.0.1", &file, now).is_ok());
        let err = verify_leaf(&leaf(&theirs, "127.0.0.1"), "127.0.0.1", &file, now).unwrap_err();
        assert!(matches!(err, TlsError::Untrusted { .. }), "{err}");
        let err = verify_leaf(&leaf(&ours, "other.test"), "127.0.0.1", &file, now).unwrap_err();
        assert!(matches!(err, TlsError::Untrusted { .. }), "{err}");
    }

    #[test]
    fn a_ca_file_without_certificates_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("empty.pem");
        std::fs::write(&file, "nothing here\n").unwrap();
        let err = read_ca_file(&file).unwrap_err().to_string();
        assert!(err.contains("empty.pem"), "{err}");
        assert!(ureq_tls(Some(&file)).is_err());
        assert!(ureq_tls(None).is_ok());
    }
}
