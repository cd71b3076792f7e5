//! Loopback servers that stand in for the outside systems the executors
//! reach: a smart-HTTP git server (the real `git http-backend` behind HTTP
//! Basic auth), forges in GitHub's, GitLab's and Gitea's shapes, and a
//! webhook endpoint. Each can serve plain HTTP or TLS with a certificate of
//! a test CA ([`TestCa`], made with rcgen; also expired ones).
//!
//! Each listens on 127.0.0.1 on a port of its own, serves from a background
//! thread, records every request it gets, and stops when dropped (its port
//! then refuses connections, which is how a test gets a server that is
//! down). Nothing here is production code: secrets in recorded requests
//! are test values.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;

/// One request as a server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string, if any.
    pub query: Option<String>,
    /// The server accepted the request's credential.
    pub authorized: bool,
    /// The `Authorization` header as sent.
    pub authorization: Option<String>,
    /// The `Content-Type` header as sent.
    pub content_type: Option<String>,
    /// The request body.
    pub body: Vec<u8>,
    /// The Standard Webhooks `webhook-id` header as sent.
    pub webhook_id: Option<String>,
}

impl Recorded {
    /// The body as JSON (panics if it is not: for assertions).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("recorded body is JSON")
    }
}

type Reply = Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>>;
type Handler = Arc<dyn Fn(Incoming) -> Reply + Send + Sync>;

/// A request with its body read, handed to a server's handler.
struct Incoming {
    method: String,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    body: Bytes,
}

impl Incoming {
    fn header(&self, name: impl hyper::header::AsHeaderName) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    fn record(&self, authorized: bool) -> Recorded {
        Recorded {
            method: self.method.clone(),
            path: self.path.clone(),
            query: self.query.clone(),
            authorized,
            authorization: self.header(AUTHORIZATION),
            content_type: self.header(CONTENT_TYPE),
            body: self.body.to_vec(),
            webhook_id: self.header("webhook-id"),
        }
    }
}

/// A certificate authority for tests, and the server certificates it signs.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TestCa")
    }
}

/// A server's TLS settings: its certificate chain and key.
#[derive(Clone)]
pub struct ServerTls(Arc<tokio_rustls::rustls::ServerConfig>);

impl ServerTls {
    /// An acceptor for a server of this crate that speaks TLS with it.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.0.clone())
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl TestCa {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa { cert, key }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA's certificate to `dir/name` and returns its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, self.pem()).expect("writing the CA file");
        p
    }

    /// A server certificate for 127.0.0.1 and localhost, valid now.
    pub fn server(&self) -> ServerTls {
        self.server_cert(false)
    }

    /// A server certificate for 127.0.0.1 and localhost that expired in 2021.
    pub fn expired_server(&self) -> ServerTls {
        self.server_cert(true)
    }

    fn server_cert(&self, expired: bool) -> ServerTls {
        use tokio_rustls::rustls;
        let key = rcgen::KeyPair::generate().expect("server key");
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server params");
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("server certificate");
        let chain = vec![cert.der().clone(), self.cert.der().clone()];
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server TLS config");
        ServerTls(Arc::new(config))
    }
}

/// The running part every server shares.
#[derive(Debug)]
struct Running {
    addr: SocketAddr,
    tls: bool,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    fn start(handler: Handler) -> Running {
        Self::start_with(handler, None)
    }

    fn start_with(handler: Handler, tls: Option<ServerTls>) -> Running {
        let with_tls = tls.is_some();
        let acceptor = tls.map(|t| tokio_rustls::TlsAcceptor::from(t.0));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("listener address");
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("loopback runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let handler = handler.clone();
                            let acceptor = acceptor.clone();
                            tokio::spawn(async move {
                                let service = hyper::service::service_fn(move |req| {
                                    let handler = handler.clone();
                                    async move {
                                        Ok::<_, hyper::Error>(handler(read(req).await).await)
                                    }
                                });
                                let http = hyper::server::conn::http1::Builder::new();
                                match acceptor {
                                    Some(acceptor) => {
                                        // A client that refuses the certificate ends here.
                                        let Ok(tls) = acceptor.accept(stream).await else { return };
                                        let _ = http
                                            .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                                            .await;
                                    }
                                    None => {
                                        let _ = http
                                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                            .await;
                                    }
                                }
                            });
                        }
                    }
                }
            });
            // Dropping the runtime cancels the connections still open.
            runtime.shutdown_background();
        });
        Running {
            addr,
            tls: with_tls,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn read(req: Request<hyper::body::Incoming>) -> Incoming {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Incoming {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    }
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

fn log() -> Arc<Mutex<Vec<Recorded>>> {
    Arc::new(Mutex::new(Vec::new()))
}

fn push_log(log: &Mutex<Vec<Recorded>>, r: Recorded) {
    log.lock().unwrap_or_else(|p| p.into_inner()).push(r);
}

fn read_log(log: &Mutex<Vec<Recorded>>) -> Vec<Recorded> {
    log.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A smart-HTTP git server for one bare repository, through the real
/// `git http-backend`, behind HTTP Basic auth (every request, reads too).
#[derive(Debug)]
pub struct GitHttpServer {
    running: Running,
    name: String,
    log: Arc<Mutex<Vec<Recorded>>>,
}

impl GitHttpServer {
    /// Serves `bare_repo` at `/<its directory name>` to `username` with
    /// `password`; anything else gets a 401 with a Basic challenge.
    pub fn start(bare_repo: &Path, username: &str, password: &str) -> GitHttpServer {
        Self::serve(bare_repo, username, password, None)
    }

    /// As [`GitHttpServer::start`], over TLS with `tls`.
    pub fn start_tls(
        bare_repo: &Path,
        username: &str,
        password: &str,
        tls: ServerTls,
    ) -> GitHttpServer {
        Self::serve(bare_repo, username, password, Some(tls))
    }

    fn serve(
        bare_repo: &Path,
        username: &str,
        password: &str,
        tls: Option<ServerTls>,
    ) -> GitHttpServer {
        let root = bare_repo
            .parent()
            .expect("bare repository has a parent directory")
            .to_path_buf();
        let name = bare_repo
            .file_name()
            .expect("bare repository has a name")
            .to_string_lossy()
            .into_owned();
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
        );
        let log = log();
        let seen = log.clone();
        let username = username.to_string();
        let handler: Handler = Arc::new(move |req: Incoming| {
            let authorized = req.header(AUTHORIZATION).as_deref() == Some(expected.as_str());
            push_log(&seen, req.record(authorized));
            let root = root.clone();
            let username = username.clone();
            Box::pin(async move {
                if !authorized {
                    let mut r = respond(StatusCode::UNAUTHORIZED, "text/plain", "unauthorized\n");
                    r.headers_mut().insert(
                        WWW_AUTHENTICATE,
                        hyper::header::HeaderValue::from_static("Basic realm=\"x\""),
                    );
                    return r;
                }
                http_backend(&root, &username, req).await
            })
        });
        GitHttpServer {
            running: Running::start_with(handler, tls),
            name,
            log,
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.running.addr.port()
    }

    /// The repository's URL, without credentials.
    pub fn url(&self) -> String {
        format!(
            "{}://{}/{}",
            self.running.scheme(),
            self.running.addr,
            self.name
        )
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        read_log(&self.log)
    }
}

/// Runs one request through `git http-backend` (CGI) and turns its output
/// into a response.
async fn http_backend(root: &PathBuf, user: &str, req: Incoming) -> Response<Full<Bytes>> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", root)
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REMOTE_USER", user)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("PATH_INFO", &req.path)
        .env("QUERY_STRING", req.query.as_deref().unwrap_or(""))
        .env("REQUEST_METHOD", &req.method)
        .env("CONTENT_LENGTH", req.body.len().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(ct) = req.header(CONTENT_TYPE) {
        cmd.env("CONTENT_TYPE", ct);
    }
    if let Some(enc) = req.header("content-encoding") {
        cmd.env("HTTP_CONTENT_ENCODING", enc);
    }
    if let Some(proto) = req.header("git-protocol") {
        cmd.env("HTTP_GIT_PROTOCOL", proto);
    }
    let failed = |why: String| respond(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", why);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("spawning git http-backend: {e}\n")),
    };
    let Some(mut stdin) = child.stdin.take() else {
        return failed("no stdin\n".into());
    };
    let body = req.body.clone();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let output = match child.wait_with_output().await {
        Ok(o) => o,
        Err(e) => return failed(format!("running git http-backend: {e}\n")),
    };
    let _ = writer.await;
    parse_cgi(&output.stdout).unwrap_or_else(|| {
        failed(format!(
            "git http-backend gave no CGI answer: {}\n",
            String::from_utf8_lossy(&output.stderr)
        ))
    })
}

/// Splits CGI output into headers (with `Status:`) and body.
fn parse_cgi(out: &[u8]) -> Option<Response<Full<Bytes>>> {
    let (head_len, sep_len) = find(out, b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| find(out, b"\n\n").map(|i| (i, 2)))?;
    let head = std::str::from_utf8(&out[..head_len]).ok()?;
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(
        &out[head_len + sep_len..],
    )));
    for line in head.lines() {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next()?.parse::<u16>().ok()?;
            *response.status_mut() = StatusCode::from_u16(code).ok()?;
        } else if let (Ok(n), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(name.trim().as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(n, v);
        }
    }
    Some(response)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A forge in GitHub's, GitLab's or Gitea's shape ([`ForgeShape`]), as
/// their API documentation describes the calls nightshift makes:
///
/// - GitHub: `POST /repos/{owner}/{repo}/pulls` `{title, head, base, body}`
///   answers 201 `{number, html_url, head: {ref, sha}}`; a second open one
///   for the same head and base is 422 "A pull request already exists";
///   `GET .../pulls?head=OWNER:BRANCH&base=BASE&state=open` lists them.
/// - GitLab: `POST /projects/{url-encoded path}/merge_requests`
///   `{source_branch, target_branch, title, description}` answers 201
///   `{id, iid, web_url, sha, ...}`; a second is 409 "Another open merge
///   request already exists for this source branch"; `GET
///   .../merge_requests?source_branch=&target_branch=&state=opened` lists.
/// - Gitea (and Forgejo): as GitHub's paths and fields, a second is 409
///   "pull request already exists for these targets", and `GET
///   .../pulls?state=open&page=N&limit=M` lists every open one.
///
/// The token must come as `Authorization: Bearer` (else 401). Backed by a
/// bare repository ([`ForgeServer::with_repo`]) the head branch must exist
/// (else 422) and its commit is recorded as the request's head. It can hold
/// its answer to a creation for a while after recording it
/// ([`ForgeServer::hold_answers`]), to stand for an answer lost in a crash.
#[derive(Debug)]
pub struct ForgeServer {
    running: Running,
    log: Arc<Mutex<Vec<Recorded>>>,
    prs: Arc<Mutex<Vec<OpenPr>>>,
    hold: Arc<Mutex<Duration>>,
    shape: ForgeShape,
}

/// Which forge's API a [`ForgeServer`] answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForgeShape {
    Github,
    Gitlab,
    Gitea,
}

/// A pull request the forge holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenPr {
    pub number: u64,
    pub head: String,
    pub base: String,
    /// The commit the head branch held when it was opened (None without a repository).
    pub sha: Option<String>,
}

impl ForgeServer {
    /// Starts a GitHub-shaped forge that accepts `token`, with no repository behind it.
    pub fn start(token: &str) -> ForgeServer {
        Self::serve(ForgeShape::Github, token, None, None)
    }

    /// Starts a GitHub-shaped forge that accepts `token`, whose repository is `bare`.
    pub fn with_repo(token: &str, bare: &Path) -> ForgeServer {
        Self::serve(ForgeShape::Github, token, Some(bare.to_path_buf()), None)
    }

    /// Starts a forge of `shape` over TLS, whose repository is `bare`.
    pub fn shaped(shape: ForgeShape, token: &str, bare: &Path, tls: ServerTls) -> ForgeServer {
        Self::serve(shape, token, Some(bare.to_path_buf()), Some(tls))
    }

    fn serve(
        shape: ForgeShape,
        token: &str,
        bare: Option<PathBuf>,
        tls: Option<ServerTls>,
    ) -> ForgeServer {
        let expected = format!("Bearer {token}");
        let log = log();
        let seen = log.clone();
        let prs: Arc<Mutex<Vec<OpenPr>>> = Arc::new(Mutex::new(Vec::new()));
        let held = prs.clone();
        let hold = Arc::new(Mutex::new(Duration::ZERO));
        let holding = hold.clone();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let handler: Handler = Arc::new(move |req: Incoming| {
            let authorized = req.header(AUTHORIZATION).as_deref() == Some(expected.as_str());
            push_log(&seen, req.record(authorized));
            let mut segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
            // GitLab's API lives under /api/v4, Gitea's under /api/v1.
            if segments.len() > 2 && segments[0] == "api" {
                segments.drain(..2);
            }
            let host = req.header("host").unwrap_or_default();
            let query = req.query.clone().unwrap_or_default();
            let param = |k: &str| {
                query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(percent_decode))
            };
            let json = |status: StatusCode, body: String| respond(status, "application/json", body);
            let mut wait = Duration::ZERO;
            let create = |head: String,
                          base: String,
                          wait: &mut Duration|
             -> Result<(OpenPr, u16), (StatusCode, String)> {
                let sha = bare.as_ref().map(|b| branch_value(b, &head));
                let mut open = held.lock().unwrap_or_else(|p| p.into_inner());
                if matches!(sha, Some(None)) {
                    return Err((StatusCode::UNPROCESSABLE_ENTITY, match shape {
                        ForgeShape::Github => r#"{"message": "Validation Failed", "errors": [{"resource": "PullRequest", "field": "head", "code": "invalid"}]}"#.to_string(),
                        ForgeShape::Gitlab => r#"{"message": ["Source branch does not exist"]}"#.to_string(),
                        ForgeShape::Gitea => r#"{"message": "The target couldn't be found.", "errors": []}"#.to_string(),
                    }));
                }
                if let Some(prior) = open.iter().find(|p| p.head == head && p.base == base) {
                    return Err(match shape {
                        ForgeShape::Github => (
                            StatusCode::UNPROCESSABLE_ENTITY,
                            format!(
                                r#"{{"message": "Validation Failed", "errors": [{{"resource": "PullRequest", "code": "custom", "message": "A pull request already exists for owner:{head}."}}]}}"#
                            ),
                        ),
                        ForgeShape::Gitlab => (
                            StatusCode::CONFLICT,
                            format!(
                                r#"{{"message": ["Another open merge request already exists for this source branch: !{}"]}}"#,
                                prior.number
                            ),
                        ),
                        ForgeShape::Gitea => (
                            StatusCode::CONFLICT,
                            format!(
                                r#"{{"message": "pull request already exists for these targets [id: {n}, issue_id: {n}, head_repo_id: 1, base_repo_id: 1, head_branch: {head}, base_branch: {base}]", "url": ""}}"#,
                                n = prior.number
                            ),
                        ),
                    });
                }
                let pr = OpenPr {
                    number: open.len() as u64 + 1,
                    head,
                    base,
                    sha: sha.flatten(),
                };
                open.push(pr.clone());
                *wait = *holding.lock().unwrap_or_else(|p| p.into_inner());
                Ok((pr, 201))
            };
            let listed = |head: Option<String>, base: Option<String>| -> Vec<OpenPr> {
                held.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter(|p| head.as_ref().is_none_or(|h| *h == p.head))
                    .filter(|p| base.as_ref().is_none_or(|b| *b == p.base))
                    .cloned()
                    .collect()
            };
            let github_pr = |owner: &str, repo: &str, p: &OpenPr| {
                serde_json::json!({
                    "id": 1000 + p.number,
                    "number": p.number,
                    "state": "open",
                    "html_url": format!("{scheme}://{host}/{owner}/{repo}/pull/{}", p.number),
                    "head": {"ref": p.head, "sha": p.sha.clone().unwrap_or_default()},
                    "base": {"ref": p.base},
                })
            };
            let gitlab_mr = |project: &str, p: &OpenPr| {
                serde_json::json!({
                    "id": 1000 + p.number,
                    "iid": p.number,
                    "state": "opened",
                    "source_branch": p.head,
                    "target_branch": p.base,
                    "sha": p.sha.clone().unwrap_or_default(),
                    "web_url": format!("{scheme}://{host}/{}/-/merge_requests/{}", percent_decode(project), p.number),
                })
            };
            let response = match (shape, req.method.as_str(), segments.as_slice()) {
                (_, _, _) if !authorized => json(
                    StatusCode::UNAUTHORIZED,
                    match shape {
                        ForgeShape::Github => r#"{"message": "Bad credentials"}"#,
                        ForgeShape::Gitlab => r#"{"message": "401 Unauthorized"}"#,
                        ForgeShape::Gitea => r#"{"message": "token is required"}"#,
                    }
                    .into(),
                ),
                (
                    ForgeShape::Github | ForgeShape::Gitea,
                    "POST",
                    ["repos", owner, repo, "pulls"],
                ) => {
                    let asked: serde_json::Value =
                        serde_json::from_slice(&req.body).unwrap_or_default();
                    let head = asked["head"].as_str().unwrap_or_default().to_string();
                    let base = asked["base"].as_str().unwrap_or_default().to_string();
                    match create(head, base, &mut wait) {
                        Ok((pr, _)) => {
                            json(StatusCode::CREATED, github_pr(owner, repo, &pr).to_string())
                        }
                        Err((status, body)) => json(status, body),
                    }
                }
                (ForgeShape::Github, "GET", ["repos", owner, repo, "pulls"]) => {
                    let head = param("head")
                        .map(|h| h.split_once(':').map(|(_, b)| b.to_string()).unwrap_or(h));
                    let list: Vec<_> = listed(head, param("base"))
                        .iter()
                        .map(|p| github_pr(owner, repo, p))
                        .collect();
                    json(StatusCode::OK, serde_json::Value::from(list).to_string())
                }
                (ForgeShape::Gitea, "GET", ["repos", owner, repo, "pulls"]) => {
                    // Every open one on page 1: Gitea has no head filter.
                    let page: u32 = param("page").and_then(|p| p.parse().ok()).unwrap_or(1);
                    let list: Vec<_> = if page == 1 {
                        listed(None, None)
                            .iter()
                            .map(|p| github_pr(owner, repo, p))
                            .collect()
                    } else {
                        Vec::new()
                    };
                    json(StatusCode::OK, serde_json::Value::from(list).to_string())
                }
                (ForgeShape::Gitlab, "POST", ["projects", project, "merge_requests"]) => {
                    let asked: serde_json::Value =
                        serde_json::from_slice(&req.body).unwrap_or_default();
                    let head = asked["source_branch"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    let base = asked["target_branch"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    match create(head, base, &mut wait) {
                        Ok((pr, _)) => {
                            json(StatusCode::CREATED, gitlab_mr(project, &pr).to_string())
                        }
                        Err((status, body)) => json(status, body),
                    }
                }
                (ForgeShape::Gitlab, "GET", ["projects", project, "merge_requests"]) => {
                    let list: Vec<_> = listed(param("source_branch"), param("target_branch"))
                        .iter()
                        .map(|p| gitlab_mr(project, p))
                        .collect();
                    json(StatusCode::OK, serde_json::Value::from(list).to_string())
                }
                _ => json(StatusCode::NOT_FOUND, r#"{"message": "Not Found"}"#.into()),
            };
            Box::pin(async move {
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                response
            })
        });
        ForgeServer {
            running: Running::start_with(handler, tls),
            log,
            prs,
            hold,
            shape,
        }
    }

    /// The shape it answers in.
    pub fn shape(&self) -> ForgeShape {
        self.shape
    }

    /// From now on, answer each creation only `wait` after recording it.
    pub fn hold_answers(&self, wait: Duration) {
        *self.hold.lock().unwrap_or_else(|p| p.into_inner()) = wait;
    }

    /// The pull requests the forge holds, in order.
    pub fn pull_requests(&self) -> Vec<OpenPr> {
        self.prs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.running.addr.port()
    }

    /// The API base URL.
    pub fn url(&self) -> String {
        format!("{}://{}", self.running.scheme(), self.running.addr)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        read_log(&self.log)
    }
}

/// What branch `name` holds in the bare repository, if it exists.
fn branch_value(bare: &Path, name: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(bare)
        .args(["rev-parse", "--verify", "-q", &format!("refs/heads/{name}")])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&v[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A webhook endpoint: records every POST and answers 204 (405 to other
/// methods).
#[derive(Debug)]
pub struct NotifyServer {
    running: Running,
    log: Arc<Mutex<Vec<Recorded>>>,
    /// A status every POST gets instead (0: none), for a receiver that is down.
    failing: Arc<std::sync::atomic::AtomicU16>,
}

impl NotifyServer {
    /// A webhook receiver as a careful one is written: it computes
    /// HMAC-SHA256 of the body with `key` and compares it (in constant time)
    /// with the `X-Nightshift-Signature: sha256=<hex>` header; a post whose
    /// signature is missing or wrong is recorded unauthorized and answered
    /// 401. It checks the Standard Webhooks headers the same way, as that
    /// spec's libraries do: `webhook-signature` must hold a `v1,<base64>`
    /// of HMAC-SHA256 over `"{webhook-id}.{webhook-timestamp}.{body}"`
    /// keyed with the base64 after `whsec_` (or `key` itself without that
    /// prefix), and the timestamp must be within 5 minutes of now. Over TLS
    /// when `tls` is given.
    pub fn webhook(key: &str, tls: Option<ServerTls>) -> NotifyServer {
        use hmac::Mac as _;
        let log = log();
        let seen = log.clone();
        let standard_key = match key.strip_prefix("whsec_") {
            Some(b64) => base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64)
                .expect("a test key after whsec_ is base64"),
            None => key.as_bytes().to_vec(),
        };
        let key = key.as_bytes().to_vec();
        let failing = Arc::new(std::sync::atomic::AtomicU16::new(0));
        let fail = failing.clone();
        let handler: Handler = Arc::new(move |req: Incoming| {
            let verified = req
                .header("x-nightshift-signature")
                .and_then(|h| h.strip_prefix("sha256=").map(str::to_string))
                .and_then(|h| hex::decode(h).ok())
                .is_some_and(|given| {
                    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key)
                        .expect("HMAC takes any key");
                    mac.update(&req.body);
                    mac.verify_slice(&given).is_ok()
                });
            let standard = (|| {
                let id = req.header("webhook-id")?;
                let timestamp = req.header("webhook-timestamp")?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()?
                    .as_secs() as i64;
                if (timestamp.parse::<i64>().ok()? - now).abs() > 300 {
                    return Some(false);
                }
                let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&standard_key)
                    .expect("HMAC takes any key");
                mac.update(format!("{id}.{timestamp}.").as_bytes());
                mac.update(&req.body);
                // Space-separated signatures; any one valid `v1` suffices
                // (compared in constant time by the hmac crate).
                Some(req.header("webhook-signature")?.split(' ').any(|s| {
                    s.strip_prefix("v1,")
                        .and_then(|b| {
                            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b)
                                .ok()
                        })
                        .is_some_and(|given| mac.clone().verify_slice(&given).is_ok())
                }))
            })()
            .unwrap_or(false);
            let verified = verified && standard;
            push_log(&seen, req.record(verified));
            let forced = fail.load(std::sync::atomic::Ordering::SeqCst);
            let status = match (req.method.as_str(), verified) {
                ("POST", _) if forced != 0 => {
                    StatusCode::from_u16(forced).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                }
                ("POST", true) => StatusCode::NO_CONTENT,
                ("POST", false) => StatusCode::UNAUTHORIZED,
                _ => StatusCode::METHOD_NOT_ALLOWED,
            };
            Box::pin(async move { respond(status, "text/plain", Bytes::new()) })
        });
        NotifyServer {
            running: Running::start_with(handler, tls),
            log,
            failing,
        }
    }

    /// Starts the endpoint.
    pub fn start() -> NotifyServer {
        let log = log();
        let seen = log.clone();
        let handler: Handler = Arc::new(move |req: Incoming| {
            push_log(&seen, req.record(true));
            let status = if req.method == "POST" {
                StatusCode::NO_CONTENT
            } else {
                StatusCode::METHOD_NOT_ALLOWED
            };
            Box::pin(async move { respond(status, "text/plain", Bytes::new()) })
        });
        NotifyServer {
            running: Running::start(handler),
            log,
            failing: Arc::new(std::sync::atomic::AtomicU16::new(0)),
        }
    }

    /// From now on every POST is answered `status` (a receiver that is
    /// down or failing); 0 restores normal answers. Webhook receivers only.
    pub fn fail_with(&self, status: u16) {
        self.failing
            .store(status, std::sync::atomic::Ordering::SeqCst);
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.running.addr.port()
    }

    /// The endpoint's URL (`/hook`; any path is accepted).
    pub fn url(&self) -> String {
        format!("{}://{}/hook", self.running.scheme(), self.running.addr)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        read_log(&self.log)
    }
}

/// A real OpenSSH server (Debian's `/usr/sbin/sshd`) on a loopback port,
/// with its own config, host key and authorized key under a temporary
/// directory, serving git over SSH to the user the tests run as. Stopped
/// (killed) when dropped.
#[derive(Debug)]
pub struct SshServer {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl SshServer {
    /// Starts sshd accepting `authorized_key` (an OpenSSH public key line).
    pub fn start(authorized_key: &str) -> SshServer {
        let dir = tempfile::tempdir().expect("sshd dir");
        let host_key = dir.path().join("host_ed25519");
        ssh_keygen(&host_key);
        std::fs::write(dir.path().join("authorized_keys"), authorized_key)
            .expect("authorized_keys");
        // sshd's privilege separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let user = login_name();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let config = dir.path().join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}/sshd.pid\n\
                     AuthorizedKeysFile {}/authorized_keys\nStrictModes no\nUsePAM no\n\
                     PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                     PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nAllowUsers {user}\n\
                     LogLevel ERROR\n",
                    host_key.display(),
                    dir.path().display(),
                    dir.path().display(),
                ),
            )
            .expect("sshd_config");
            let mut child = std::process::Command::new("/usr/sbin/sshd")
                .arg("-D")
                .arg("-e")
                .arg("-f")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting /usr/sbin/sshd (Debian's openssh-server)");
            for _ in 0..100 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return SshServer { child, port, dir };
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("sshd did not start on loopback");
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its host key, as a known_hosts line for `[127.0.0.1]:port`.
    pub fn known_hosts_line(&self) -> String {
        let public =
            std::fs::read_to_string(self.dir.path().join("host_ed25519.pub")).expect("host key");
        let mut fields = public.split_whitespace();
        let (kind, key) = (
            fields.next().unwrap_or_default(),
            fields.next().unwrap_or_default(),
        );
        format!("[127.0.0.1]:{} {kind} {key}\n", self.port)
    }

    /// The `ssh://` URL of a repository at an absolute path.
    pub fn url(&self, repo: &Path) -> String {
        let user = login_name();
        format!("ssh://{user}@127.0.0.1:{}{}", self.port, repo.display())
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The name of the user the tests run as.
pub fn login_name() -> String {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| "root".into())
}

/// Makes an ed25519 key pair at `path` and `path.pub` (no passphrase).
pub fn ssh_keygen(path: &Path) {
    let out = std::process::Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "nightshift-test",
            "-f",
        ])
        .arg(path)
        .output()
        .expect("running ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
