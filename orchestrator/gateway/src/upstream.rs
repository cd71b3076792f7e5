//! The gateway's client to a configured endpoint: TCP, TLS with certificate
//! verification (rustls with the ring provider, the system's roots plus the
//! endpoint's own `ca_file`, trusted for that endpoint's host and port
//! only: `tests/tests/gateway.rs::tls_to_an_endpoint_is_verified_and_its_ca_file_trusted_for_it_alone`),
//! HTTP/1.1 (hyper, through hyper-util's pooling client).
//!
//! Connections are kept alive and reused between the calls of one gateway
//! (one run) to the same endpoint: the TCP connect, the TLS handshake and
//! HTTP's own setup are paid once per connection rather than once per call.
//! A connection is keyed by its scheme and authority, so a request only ever
//! goes out on a connection to its own endpoint, over TLS when the endpoint
//! says `https`; a connection whose response was not read to its end (a
//! stream cut for a cap, a client gone) is never reused
//! (`tests/tests/gateway.rs::calls_reuse_a_kept_alive_connection_but_never_one_cut_short`).
//! Idle connections are closed after [`IDLE`], and all of them when the
//! run's gateway closes.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::models::{BaseUrl, Endpoint};

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

/// The system's roots, loaded once per process (empty when none could be:
/// then only an endpoint's `ca_file` can make a connection).
fn system_roots() -> &'static rustls::RootCertStore {
    static ROOTS: OnceLock<rustls::RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        roots
    })
}

/// The TLS configuration for one endpoint: the system's roots and the
/// authorities in `ca_files` (that endpoint's own, read at each connection,
/// so a replaced file takes effect and a broken one is named).
fn tls_config(ca_files: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, String> {
    static SYSTEM: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    let build = |roots: rustls::RootCertStore| -> Result<Arc<rustls::ClientConfig>, String> {
        if roots.is_empty() {
            return Err(
                "no root certificate: the system's could not be loaded and the endpoint has no ca_file"
                    .into(),
            );
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    };
    if ca_files.is_empty() {
        return SYSTEM.get_or_init(|| build(system_roots().clone())).clone();
    }
    let mut roots = system_roots().clone();
    for path in ca_files {
        let fail = |why: String| format!("the endpoint's ca_file {}: {why}", path.display());
        let certs: Vec<rustls::pki_types::CertificateDer<'static>> =
            rustls::pki_types::pem::PemObject::pem_file_iter(path)
                .map_err(|e| fail(e.to_string()))?
                .collect::<Result<_, _>>()
                .map_err(|e| fail(e.to_string()))?;
        if certs.is_empty() {
            return Err(fail("it holds no PEM certificate".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| fail(e.to_string()))?;
        }
    }
    build(roots)
}

/// The key an endpoint's extra authorities are found by: host and port.
fn host_key(host: &str, port: u16) -> String {
    format!("{}:{port}", host.to_ascii_lowercase())
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
/// TLS (verifying the certificate for that host) when its scheme is https,
/// trusting the system's roots and the `ca_file`s of the endpoints at that
/// host and port (`extra`), never another endpoint's.
#[derive(Clone, Debug, Default)]
struct Connector {
    extra: Arc<HashMap<String, Vec<PathBuf>>>,
}

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<Stream>>> + Send>>;

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let extra = self.extra.clone();
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
            let ca_files = extra
                .get(&host_key(&host, port))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let config = tls_config(ca_files).map_err(std::io::Error::other)?;
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
    client: Client<Connector, Pieces>,
}

impl Upstream {
    /// A client for `endpoints` (their `ca_file`s, each for its own host
    /// and port).
    pub fn new(endpoints: &[Endpoint]) -> Self {
        let mut extra: HashMap<String, Vec<PathBuf>> = HashMap::new();
        for e in endpoints {
            if let (true, Some(ca)) = (e.base_url.tls, &e.ca_file) {
                extra
                    .entry(host_key(&e.base_url.host, e.base_url.port))
                    .or_default()
                    .push(ca.clone());
            }
        }
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(IDLE_PER_ENDPOINT)
            .build(Connector {
                extra: Arc::new(extra),
            });
        Upstream { client }
    }

    /// Sends `request` (its URI a path) to `base` and returns the response
    /// once its head has arrived; the body streams from the connection.
    pub async fn send(
        &self,
        base: &BaseUrl,
        mut request: Request<Pieces>,
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

/// A request body forwarded as pieces (slices of the body the sandbox sent,
/// and the gateway's few edits), never copied into one buffer; with its
/// exact length, so that it goes with a `content-length`. Whatever it holds
/// (the body's buffer, the permits that count it) is released when the
/// client has sent it and drops it.
pub struct Pieces {
    pieces: std::collections::VecDeque<Bytes>,
    left: u64,
    /// Released with the body.
    _held: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for Pieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pieces").field("left", &self.left).finish()
    }
}

impl Pieces {
    pub fn new(pieces: Vec<Bytes>, held: impl Send + Sync + 'static) -> Pieces {
        let left = pieces.iter().map(|p| p.len() as u64).sum();
        Pieces {
            pieces: pieces.into_iter().filter(|p| !p.is_empty()).collect(),
            left,
            _held: Box::new(held),
        }
    }
}

impl hyper::body::Body for Pieces {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.pieces.pop_front() {
            Some(p) => {
                self.left -= p.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(p))))
            }
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}
