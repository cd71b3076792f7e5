//! The gateway's client to a configured endpoint: TCP, TLS with certificate
//! verification (rustls with the ring provider, the system's roots), HTTP/1.1
//! (hyper). One connection per call.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::models::BaseUrl;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connecting to {authority}: {source}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with {authority}: {source}")]
    Tls {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the system's root certificates: {0}")]
    Roots(String),
    #[error("HTTP with {authority}: {source}")]
    Http {
        authority: String,
        #[source]
        source: hyper::Error,
    },
}

impl UpstreamError {
    /// Whether the request may have reached the endpoint (and cost tokens).
    pub fn maybe_sent(&self) -> bool {
        matches!(self, UpstreamError::Http { .. })
    }
}

/// The TLS configuration, made once per process: the system's roots.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, UpstreamError> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(format!(
                    "none could be loaded ({} errors)",
                    found.errors.len()
                ));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
        .map_err(UpstreamError::Roots)
}

/// Sends `request` (its URI a path) to `base` and returns the response once
/// its head has arrived; the body streams from the connection.
pub async fn send(
    base: &BaseUrl,
    request: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, UpstreamError> {
    let authority = base.authority();
    let tcp = TcpStream::connect((base.host.as_str(), base.port))
        .await
        .map_err(|source| UpstreamError::Connect {
            authority: authority.clone(),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    let http = |source| UpstreamError::Http {
        authority: authority.clone(),
        source,
    };
    if base.tls {
        let config = tls_config()?;
        let name = rustls::pki_types::ServerName::try_from(base.host.clone()).map_err(|e| {
            UpstreamError::Tls {
                authority: authority.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            }
        })?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|source| UpstreamError::Tls {
                authority: authority.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(http)?;
        tokio::spawn(conn);
        sender.send_request(request).await.map_err(http)
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(http)?;
        tokio::spawn(conn);
        sender.send_request(request).await.map_err(http)
    }
}
