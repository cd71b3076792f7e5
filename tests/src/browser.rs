//! Helpers for the dashboard's tests: a `nightshift serve` of a test's
//! state, a raw HTTP client (so a test can send any `Host`, `Origin` or
//! cookie it likes), and a real headless Chromium driven over WebDriver
//! (`chromedriver`, Debian's `chromium-driver`) with fantoccini.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::State;

pub const OWNER: &str = "olivia";
pub const OWNER_PASSWORD: &str = "owner password of the test";
pub const VIEWER: &str = "victor";
pub const VIEWER_PASSWORD: &str = "viewer password of the test";

/// Adds the test's owner and viewer accounts to `state`.
pub fn add_accounts(state: &State) {
    for (name, role, pw) in [
        (OWNER, "owner", OWNER_PASSWORD),
        (VIEWER, "viewer", VIEWER_PASSWORD),
    ] {
        let mut child = state
            .cmd()
            .args(["users", "add", name, "--role", role])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nightshift users add");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(pw.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "users add: {}", crate::stderr(&out));
    }
}

/// A running `nightshift serve`, stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Serve {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Serve {
    pub fn start(state: &State, extra: &[&str]) -> Serve {
        let mut child = state
            .cmd()
            .args(["serve", "--bind", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nightshift serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit("://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("serve did not say where it listens: {line:?}"));
        Serve { child, addr }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP response, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The session cookie's `name=value`, if one was set.
    pub fn session_cookie(&self) -> Option<String> {
        self.header("set-cookie")
            .and_then(|c| c.split(';').next())
            .map(str::to_string)
    }
}

/// Sends one HTTP/1.1 request as written, headers verbatim (`Host` too).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response {
    let s = TcpStream::connect(addr).expect("connecting to serve");
    exchange(s, method, path, headers, body)
}

/// [`request`] from another local address (any of 127.0.0.0/8): a client
/// the server tells apart from the others by its address.
pub fn request_from(
    from: std::net::IpAddr,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response {
    let s = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::new(from, 0)).unwrap();
            let stream = socket.connect(addr).await.expect("connecting to serve");
            stream.into_std().unwrap()
        });
    s.set_nonblocking(false).unwrap();
    exchange(s, method, path, headers, body)
}

fn exchange(
    mut s: TcpStream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

/// A logged-in API client.
#[derive(Debug, Clone)]
pub struct Client {
    pub addr: SocketAddr,
    pub cookie: String,
    pub csrf: String,
}

impl Client {
    pub fn login(serve: &Serve, name: &str, password: &str) -> Client {
        let body = serde_json::json!({"name": name, "password": password}).to_string();
        let r = request(
            serve.addr,
            "POST",
            "/api/v1/login",
            &[
                ("Host", &serve.host()),
                ("Content-Type", "application/json"),
            ],
            &body,
        );
        assert_eq!(r.status, 200, "login as {name}: {}", r.body);
        Client {
            addr: serve.addr,
            cookie: r.session_cookie().expect("a session cookie"),
            csrf: r.json()["csrf"].as_str().unwrap().to_string(),
        }
    }

    pub fn get(&self, path: &str) -> Response {
        let host = self.addr.to_string();
        request(
            self.addr,
            "GET",
            path,
            &[
                ("Host", &host),
                ("Cookie", &self.cookie),
                ("Accept", "application/json"),
            ],
            "",
        )
    }

    /// A JSON POST with the session and its CSRF token.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> Response {
        let host = self.addr.to_string();
        request(
            self.addr,
            "POST",
            path,
            &[
                ("Host", &host),
                ("Cookie", &self.cookie),
                ("X-CSRF-Token", &self.csrf),
                ("Content-Type", "application/json"),
            ],
            &body.to_string(),
        )
    }
}

/// A chromedriver on a free port, killed on drop.
#[derive(Debug)]
pub struct Driver {
    child: Child,
    pub port: u16,
}

impl Driver {
    pub fn start() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        use std::os::unix::process::CommandExt;
        // Its own process group: the browsers it starts end with it, even
        // when a test panics before closing its session.
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/lib.sh installs it)");
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver { child, port }
    }

    /// A headless Chromium session; every request the browser makes to any
    /// host but the dashboard is sent to a closed port (so a fetch elsewhere fails).
    pub async fn browser(&self) -> fantoccini::Client {
        self.browser_with(&[], "127.0.0.1").await
    }

    /// [`Driver::browser`] with more Chromium flags, and `bypass` (`;`
    /// separated) the hosts reached directly rather than through the
    /// closed port.
    pub async fn browser_with(&self, extra: &[String], bypass: &str) -> fantoccini::Client {
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            "--proxy-server=127.0.0.1:9",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.push(format!("--proxy-bypass-list=<-loopback>;{bypass}"));
        args.extend(extra.iter().cloned());
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "args": args }),
        );
        fantoccini::ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a WebDriver session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where screenshots go: `target/screenshots/` beside the binary.
pub fn screenshot_dir() -> PathBuf {
    let bin = crate::nightshift_bin();
    let dir = bin
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("screenshots"))
        .unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A test CA and a server certificate for `names` signed by it.
#[derive(Debug)]
pub struct TestCert {
    pub ca: tokio_rustls::rustls::pki_types::CertificateDer<'static>,
    pub cert_pem: String,
    pub key_pem: String,
    /// base64 of the SHA-256 of the server key's SubjectPublicKeyInfo, as
    /// Chromium's `--ignore-certificate-errors-spki-list` takes it.
    pub spki_sha256: String,
}

impl TestCert {
    pub fn new(names: &[&str]) -> TestCert {
        use base64::Engine as _;
        use sha2::Digest as _;
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "dashboard test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
        TestCert {
            ca: ca_cert.der().clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            spki_sha256: base64::engine::general_purpose::STANDARD
                .encode(sha2::Sha256::digest(key.public_key_der())),
        }
    }

    pub fn server_config(&self) -> tokio_rustls::rustls::ServerConfig {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }
}

/// A TLS-terminating reverse proxy in front of `upstream`, as nginx's
/// usual one is configured: the browser's `Host` passed on, the peer
/// appended to `X-Forwarded-For`, `X-Forwarded-Proto: https`. It runs on
/// its own thread until the test process ends.
#[derive(Debug)]
pub struct TlsProxy {
    pub addr: SocketAddr,
}

impl TlsProxy {
    /// Serves on `listener`, connecting to `upstream` from address `from`.
    pub fn start(
        listener: std::net::TcpListener,
        config: tokio_rustls::rustls::ServerConfig,
        from: std::net::IpAddr,
        upstream: SocketAddr,
    ) -> TlsProxy {
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(proxy(listener, config, from, upstream));
        });
        TlsProxy { addr }
    }
}

/// One request passed on to `upstream`, as the proxy's headers say.
async fn forward(
    mut req: hyper::Request<hyper::body::Incoming>,
    peer: SocketAddr,
    from: std::net::IpAddr,
    upstream: SocketAddr,
) -> Result<hyper::Response<hyper::body::Incoming>, std::io::Error> {
    let forwarded = match req.headers().get("x-forwarded-for") {
        Some(v) => format!("{}, {}", v.to_str().unwrap_or(""), peer.ip()),
        None => peer.ip().to_string(),
    };
    let h = req.headers_mut();
    h.insert("x-forwarded-for", forwarded.parse().unwrap());
    h.insert("x-forwarded-proto", "https".parse().unwrap());
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let stream = socket.connect(upstream).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    sender
        .send_request(req)
        .await
        .map_err(std::io::Error::other)
}

async fn proxy(
    listener: std::net::TcpListener,
    config: tokio_rustls::rustls::ServerConfig,
    from: std::net::IpAddr,
    upstream: SocketAddr,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    loop {
        let Ok((tcp, peer)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| forward(req, peer, from, upstream));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
    }
}

/// One HTTPS request from local address `from` to `addr` for server name
/// `name`, trusting `ca`; the whole response as text.
pub fn https_from(
    from: std::net::IpAddr,
    ca: &tokio_rustls::rustls::pki_types::CertificateDer<'static>,
    addr: SocketAddr,
    name: &str,
    request: &str,
) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let request = request.to_string();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::new(from, 0)).unwrap();
            let tcp = socket.connect(addr).await.unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
                .connect(name, tcp)
                .await
                .expect("TLS handshake");
            tls.write_all(request.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            let _ = tls.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        })
}

/// Logs in at `origin` as a person would: `/` sends the browser to the
/// login page, the form is filled and sent, the Morning page follows, and
/// the session cookie is `__Host-`, secure and HTTP-only.
pub async fn log_in(c: &fantoccini::Client, origin: &str, name: &str, password: &str) {
    use fantoccini::Locator;
    c.goto(&format!("{origin}/")).await.unwrap();
    let url = c.current_url().await.unwrap();
    assert_eq!(url.as_str(), format!("{origin}/login"));
    for (id, text) in [("name", name), ("password", password)] {
        c.find(Locator::Id(id))
            .await
            .unwrap()
            .send_keys(text)
            .await
            .unwrap();
    }
    c.find(Locator::Id("login-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    if c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("section#runs"))
        .await
        .is_err()
    {
        let page = c.source().await.unwrap_or_default();
        panic!("no Morning page after logging in at {origin}: {page}");
    }
    let cookies = c.get_all_cookies().await.unwrap();
    let session = cookies
        .iter()
        .find(|k| k.name() == "__Host-nightshift_session")
        .unwrap_or_else(|| panic!("no __Host- session cookie: {cookies:?}"));
    assert_eq!(session.secure(), Some(true));
    assert_eq!(session.http_only(), Some(true));
}
