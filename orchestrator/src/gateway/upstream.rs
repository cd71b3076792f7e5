//! The gateway's client to a configured endpoint: TCP, TLS with certificate
//! verification (rustls with the ring provider, the system's roots), HTTP/1.1
//! (hyper, through hyper-util's pooling client).
//!
//! Connections are kept alive and reused between the calls of one gateway
//! (one run) to the same endpoint: the TCP connect, the TLS handshake and
//! HTTP's own setup are paid once per connection rather than once per call.
//! A connection is keyed by its scheme and authority, so a request only ever
//! goes out on a connection to its own endpoint, over TLS when the endpoint
//! says `https`; a connection whose response was not read to its end (a
//! stream cut for a cap, a client gone) is never reused. Idle connections are
//! closed after [`IDLE`], and all of them when the run's gateway closes.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::models::BaseUrl;

/// How long an idle connection to an endpoint is kept for the next call.
pub const IDLE: Duration = Duration::from_secs(30);
/// Idle connections kept per endpoint.
const IDLE_PER_ENDPOINT: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection was made (TCP, TLS or the roots): nothing was sent.
    #[error("connecting to {authority}: {source}")]
    Connect {
        authority: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("HTTP with {authority}: {source}")]
    Http {
        authority: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("the endpoint's address {0} is not a valid URI")]
    Uri(String),
}

impl UpstreamError {
    /// Whether the request may have reached the endpoint (and cost tokens).
    pub fn maybe_sent(&self) -> bool {
        matches!(self, UpstreamError::Http { .. })
    }
}

/// The TLS configuration, made once per process: the system's roots.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
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
                    "the system's root certificates: none could be loaded ({} errors)",
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
}

/// A connection to an endpoint: plain TCP (loopback only, `models` checks)
/// or TLS over TCP.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// Makes a connection for the pool: TCP to the URI's host and port, then
/// TLS (verifying the certificate for that host) when its scheme is https.
#[derive(Clone, Copy, Debug)]
struct Connector;

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<Stream>>> + Send>>;

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(async move {
            let invalid =
                |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
            let tls = match uri.scheme_str() {
                Some("https") => true,
                Some("http") => false,
                other => return Err(invalid(format!("scheme {other:?}"))),
            };
            let host = uri
                .host()
                .ok_or_else(|| invalid("no host".into()))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            if !tls {
                return Ok(TokioIo::new(Stream::Plain(tcp)));
            }
            let config = tls_config().map_err(std::io::Error::other)?;
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|e| invalid(e.to_string()))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(Stream::Tls(Box::new(stream))))
        })
    }
}

/// A gateway's client to its endpoints, with its pool of kept-alive
/// connections.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: Client<Connector, Full<Bytes>>,
}

impl Default for Upstream {
    fn default() -> Self {
        Self::new()
    }
}

impl Upstream {
    pub fn new() -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(IDLE_PER_ENDPOINT)
            .build(Connector);
        Upstream { client }
    }

    /// Sends `request` (its URI a path) to `base` and returns the response
    /// once its head has arrived; the body streams from the connection.
    pub async fn send(
        &self,
        base: &BaseUrl,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let authority = base.authority();
        let path = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let scheme = if base.tls { "https" } else { "http" };
        let absolute = format!("{scheme}://{authority}{path}");
        *request.uri_mut() = absolute
            .parse()
            .map_err(|_| UpstreamError::Uri(absolute.clone()))?;
        self.client.request(request).await.map_err(|source| {
            if source.is_connect() {
                UpstreamError::Connect { authority, source }
            } else {
                UpstreamError::Http { authority, source }
            }
        })
    }
}
