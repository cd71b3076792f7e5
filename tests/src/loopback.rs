//! Loopback servers that stand in for the outside systems the executors
//! reach: a smart-HTTP git server (the real `git http-backend` behind HTTP
//! Basic auth), a GitHub-shaped forge, and a webhook endpoint.
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
        }
    }
}

/// The running part every server shares.
#[derive(Debug)]
struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn start(handler: Handler) -> Running {
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
                            tokio::spawn(async move {
                                let service = hyper::service::service_fn(move |req| {
                                    let handler = handler.clone();
                                    async move {
                                        Ok::<_, hyper::Error>(handler(read(req).await).await)
                                    }
                                });
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                    .await;
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
            running: Running::start(handler),
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
        format!("http://{}/{}", self.running.addr, self.name)
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

/// A GitHub-shaped forge: `POST /repos/{owner}/{repo}/pulls` with the right
/// bearer token answers 201 with a new number; a wrong or missing token
/// answers 401; anything else 404.
#[derive(Debug)]
pub struct ForgeServer {
    running: Running,
    log: Arc<Mutex<Vec<Recorded>>>,
}

impl ForgeServer {
    /// Starts a forge that accepts `token`.
    pub fn start(token: &str) -> ForgeServer {
        let expected = format!("Bearer {token}");
        let log = log();
        let seen = log.clone();
        let next = Arc::new(Mutex::new(0u64));
        let handler: Handler = Arc::new(move |req: Incoming| {
            let authorized = req.header(AUTHORIZATION).as_deref() == Some(expected.as_str());
            push_log(&seen, req.record(authorized));
            let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
            let response = match (req.method.as_str(), segments.as_slice()) {
                ("POST", ["repos", owner, repo, "pulls"]) if authorized => {
                    let number = {
                        let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                        *n += 1;
                        *n
                    };
                    let host = req.header("host").unwrap_or_default();
                    let body = serde_json::json!({
                        "number": number,
                        "html_url": format!("http://{host}/{owner}/{repo}/pull/{number}"),
                    });
                    respond(StatusCode::CREATED, "application/json", body.to_string())
                }
                ("POST", ["repos", _, _, "pulls"]) => respond(
                    StatusCode::UNAUTHORIZED,
                    "application/json",
                    r#"{"message": "Bad credentials"}"#,
                ),
                _ => respond(
                    StatusCode::NOT_FOUND,
                    "application/json",
                    r#"{"message": "Not Found"}"#,
                ),
            };
            Box::pin(async move { response })
        });
        ForgeServer {
            running: Running::start(handler),
            log,
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.running.addr.port()
    }

    /// The API base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.running.addr)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        read_log(&self.log)
    }
}

/// A webhook endpoint: records every POST and answers 204 (405 to other
/// methods).
#[derive(Debug)]
pub struct NotifyServer {
    running: Running,
    log: Arc<Mutex<Vec<Recorded>>>,
}

impl NotifyServer {
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
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.running.addr.port()
    }

    /// The endpoint's URL (`/hook`; any path is accepted).
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.running.addr)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        read_log(&self.log)
    }
}
