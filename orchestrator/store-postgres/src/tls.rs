//! How the store reaches PostgreSQL: the URL's TLS settings, read the way
//! `libpq` names them and held to a stricter rule.
//!
//! Invariants (`tests/tls.rs` attacks each against a real server):
//! - `sslmode=require`, `verify-ca` and `verify-full` all mean TLS with the
//!   server's certificate verified: its chain to the URL's `sslrootcert`
//!   (a PEM file) or, without one, to the system's authorities, and its name
//!   against the host the URL names. (`libpq`'s `require` checks nothing and
//!   its `verify-ca` no name: a certificate that is not checked protects
//!   nothing against the attacker TLS is there for.) A server that offers no
//!   TLS is refused, never used in the clear
//!   (`tests/tls.rs::the_store_speaks_tls_only_to_the_server_its_url_trusts`,
//!   `tests/tls.rs::a_server_that_offers_no_tls_is_never_used_in_the_clear`).
//! - `disable`, `allow`, `prefer` and no `sslmode` mean no TLS: a TLS an
//!   attacker in the middle can strip (`prefer` falls back to the clear when
//!   the server declines) is not offered as if it were one. Hosted mode
//!   refuses these for a store that is not local (`nightshift_core::hosted`).
//! - `sslcert`/`sslkey` (client certificates) are refused by name rather
//!   than ignored, as is an `sslmode` this client does not know
//!   (`tests::what_it_cannot_honour_is_refused_by_name`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::CertificateDer;

/// What the URL asks of TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tls {
    /// No TLS (`disable`, `allow`, `prefer`, or no `sslmode`).
    Off,
    /// TLS, verified against `roots` (the system's when `None`).
    Verified { roots: Option<PathBuf> },
}

/// A URL split into what `postgres` parses and what this module decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The URL without `sslmode` and `sslrootcert`.
    pub url: String,
    pub tls: Tls,
}

/// Takes the TLS parameters out of a `postgres://` URL's query, or says
/// which one it cannot honour. Key-value connection strings (`host=... `)
/// pass through untouched, with no TLS unless they say `sslmode`, which is
/// then refused: give a URL.
pub fn split(url: &str) -> Result<Split, String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        if url.contains("sslmode") || url.contains("sslrootcert") {
            return Err(
                "TLS settings are read from a postgres:// URL only, not a key=value string".into(),
            );
        }
        return Ok(Split {
            url: url.to_string(),
            tls: Tls::Off,
        });
    }
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => {
            return Ok(Split {
                url: url.to_string(),
                tls: Tls::Off,
            })
        }
    };
    let mut kept = Vec::new();
    let mut mode: Option<String> = None;
    let mut roots: Option<PathBuf> = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or_else(|| format!("{k}: not percent-encoded text"))?;
        match k {
            "sslmode" => mode = Some(v),
            "sslrootcert" => roots = Some(PathBuf::from(v)),
            "sslcert" | "sslkey" | "sslpassword" | "sslcrl" | "sslcrldir" | "sslsni" => {
                return Err(format!(
                    "{k} is not supported by this client (server certificates are verified; \
                     client certificates are not sent)"
                ))
            }
            _ => kept.push(pair),
        }
    }
    let tls = match mode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => {
            if roots.is_some() {
                return Err(format!(
                    "sslrootcert is given but sslmode is {}: ask for sslmode=verify-full",
                    mode.as_deref().unwrap_or("not set")
                ));
            }
            Tls::Off
        }
        Some("require" | "verify-ca" | "verify-full") => Tls::Verified { roots },
        Some(other) => return Err(format!(
            "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
        )),
    };
    let mut url = base.to_string();
    if !kept.is_empty() {
        url.push('?');
        url.push_str(&kept.join("&"));
    }
    Ok(Split { url, tls })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The certificates of a PEM file; none is an error naming the file.
fn read_roots(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let fail = |why: String| format!("sslrootcert {}: {why}", path.display());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("it holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The rustls connector for [`Tls::Verified`]: the ring provider, TLS 1.2
/// and 1.3, the given roots (or the system's).
pub fn connector(roots: Option<&Path>) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        Some(path) => {
            for c in read_roots(path)? {
                store
                    .add(c)
                    .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
            }
        }
        None => {
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = store.add(c);
            }
            if store.is_empty() {
                return Err(
                    "no system certificate authority could be read: give sslrootcert".into(),
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(store)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_taken_out_of_the_url() {
        let s = split("postgres://u:p@db.example:5432/ns?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=5").unwrap();
        assert_eq!(s.url, "postgres://u:p@db.example:5432/ns?connect_timeout=5");
        assert_eq!(
            s.tls,
            Tls::Verified {
                roots: Some("/etc/ca.pem".into())
            }
        );
        let s = split("postgres://db.example/ns?sslmode=require").unwrap();
        assert_eq!(s.url, "postgres://db.example/ns");
        assert_eq!(s.tls, Tls::Verified { roots: None });
        for off in ["", "?sslmode=disable", "?sslmode=prefer", "?sslmode=allow"] {
            let s = split(&format!("postgres://db.example/ns{off}")).unwrap();
            assert_eq!(s.tls, Tls::Off, "{off}");
            assert!(!s.url.contains("sslmode"));
        }
        let s = split("postgres:///postgres?host=/tmp/x&user=postgres").unwrap();
        assert_eq!(s.url, "postgres:///postgres?host=/tmp/x&user=postgres");
    }

    #[test]
    fn what_it_cannot_honour_is_refused_by_name() {
        for (url, words) in [
            (
                "postgres://db/ns?sslmode=verify-everything",
                "sslmode=verify-everything",
            ),
            ("postgres://db/ns?sslmode=require&sslcert=/c.pem", "sslcert"),
            ("postgres://db/ns?sslkey=/k.pem", "sslkey"),
            (
                "postgres://db/ns?sslrootcert=/ca.pem",
                "sslrootcert is given but sslmode is not set",
            ),
            (
                "postgres://db/ns?sslmode=prefer&sslrootcert=/ca.pem",
                "sslmode is prefer",
            ),
            ("host=db sslmode=require", "key=value"),
            ("postgres://db/ns?sslmode=%zz", "percent"),
        ] {
            let e = split(url).unwrap_err();
            assert!(e.contains(words), "{url}: {e}");
        }
    }

    #[test]
    fn a_missing_or_empty_root_file_is_named() {
        let e = connector(Some(Path::new("/nonexistent/ca.pem")))
            .err()
            .unwrap();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = connector(Some(&empty)).err().unwrap();
        assert!(e.contains("no PEM certificate"), "{e}");
    }
}
