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
///
/// Backed by a bare repository ([`ForgeServer::with_repo`]) it behaves as
/// GitHub does where it matters here: the head branch must exist in the
/// repository (else 422), the pull request records the commit the branch
/// holds at that moment (`head.sha`), a second open pull request for the
/// same head and base is refused with 422 "A pull request already exists",
/// and `GET .../pulls?head=OWNER:BRANCH&base=BASE&state=open` lists the open
/// ones. It can hold its answer to a creation for a while after recording
/// the pull request ([`ForgeServer::hold_answers`]), to stand for an answer
/// lost in a crash.
#[derive(Debug)]
pub struct ForgeServer {
    running: Running,
    log: Arc<Mutex<Vec<Recorded>>>,
    prs: Arc<Mutex<Vec<OpenPr>>>,
    hold: Arc<Mutex<Duration>>,
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
    /// Starts a forge that accepts `token`, with no repository behind it.
    pub fn start(token: &str) -> ForgeServer {
        Self::serve(token, None)
    }

    /// Starts a forge that accepts `token`, whose repository is `bare`.
    pub fn with_repo(token: &str, bare: &Path) -> ForgeServer {
        Self::serve(token, Some(bare.to_path_buf()))
    }

    fn serve(token: &str, bare: Option<PathBuf>) -> ForgeServer {
        let expected = format!("Bearer {token}");
        let log = log();
        let seen = log.clone();
        let prs: Arc<Mutex<Vec<OpenPr>>> = Arc::new(Mutex::new(Vec::new()));
        let held = prs.clone();
        let hold = Arc::new(Mutex::new(Duration::ZERO));
        let holding = hold.clone();
        let handler: Handler = Arc::new(move |req: Incoming| {
            let authorized = req.header(AUTHORIZATION).as_deref() == Some(expected.as_str());
            push_log(&seen, req.record(authorized));
            let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
            let host = req.header("host").unwrap_or_default();
            let mut wait = Duration::ZERO;
            let response = match (req.method.as_str(), segments.as_slice()) {
                ("POST", ["repos", owner, repo, "pulls"]) if authorized => {
                    let asked: serde_json::Value =
                        serde_json::from_slice(&req.body).unwrap_or_default();
                    let head = asked["head"].as_str().unwrap_or_default().to_string();
                    let base = asked["base"].as_str().unwrap_or_default().to_string();
                    let sha = bare.as_ref().map(|b| branch_value(b, &head));
                    let mut open = held.lock().unwrap_or_else(|p| p.into_inner());
                    if matches!(sha, Some(None)) {
                        respond(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "application/json",
                            r#"{"message": "Validation Failed", "errors": [{"resource": "PullRequest", "field": "head", "code": "invalid"}]}"#,
                        )
                    } else if open.iter().any(|p| p.head == head && p.base == base) {
                        respond(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "application/json",
                            format!(
                                r#"{{"message": "Validation Failed", "errors": [{{"message": "A pull request already exists for {owner}:{head}."}}]}}"#
                            ),
                        )
                    } else {
                        let number = open.len() as u64 + 1;
                        let sha = sha.flatten();
                        open.push(OpenPr {
                            number,
                            head: head.clone(),
                            base,
                            sha: sha.clone(),
                        });
                        wait = *holding.lock().unwrap_or_else(|p| p.into_inner());
                        let mut body = serde_json::json!({
                            "number": number,
                            "html_url": format!("http://{host}/{owner}/{repo}/pull/{number}"),
                        });
                        if let Some(sha) = sha {
                            body["head"] = serde_json::json!({"ref": head, "sha": sha});
                        }
                        respond(StatusCode::CREATED, "application/json", body.to_string())
                    }
                }
                ("GET", ["repos", owner, repo, "pulls"]) if authorized => {
                    let query = req.query.clone().unwrap_or_default();
                    let param = |k: &str| {
                        query
                            .split('&')
                            .find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(percent_decode))
                    };
                    let head = param("head")
                        .map(|h| h.split_once(':').map(|(_, b)| b.to_string()).unwrap_or(h));
                    let base = param("base");
                    let open = held.lock().unwrap_or_else(|p| p.into_inner());
                    let listed: Vec<serde_json::Value> = open
                        .iter()
                        .filter(|p| head.as_ref().is_none_or(|h| *h == p.head))
                        .filter(|p| base.as_ref().is_none_or(|b| *b == p.base))
                        .map(|p| {
                            serde_json::json!({
                                "number": p.number,
                                "html_url": format!("http://{host}/{owner}/{repo}/pull/{}", p.number),
                                "head": {"ref": p.head, "sha": p.sha.clone().unwrap_or_default()},
                                "base": {"ref": p.base},
                            })
                        })
                        .collect();
                    respond(
                        StatusCode::OK,
                        "application/json",
                        serde_json::Value::from(listed).to_string(),
                    )
                }
                ("POST" | "GET", ["repos", _, _, "pulls"]) => respond(
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
            Box::pin(async move {
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                response
            })
        });
        ForgeServer {
            running: Running::start(handler),
            log,
            prs,
            hold,
        }
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
        format!("http://{}", self.running.addr)
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
