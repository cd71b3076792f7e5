//! `nightshift serve`: the dashboard and the JSON API (`/api/v1`) of one
//! long-running supervisor process (axum).
//!
//! Invariants (guarantee 9):
//! - Layers, outermost first: security headers on every response (a
//!   Content-Security-Policy with no inline script and no other origin,
//!   `frame-ancestors 'none'`); the `Host` allowlist (no DNS rebinding);
//!   then [`gate`], which every route passes: a session is needed for
//!   everything but the login page, the login call and the embedded assets;
//!   every state-changing request needs the session's CSRF token and, when
//!   the browser names its origin, this origin; and only an owner's session
//!   may make one (login and logout aside). No route can forget a check:
//!   they are made here, once, before any handler runs
//!   (`tests/tests/dashboard_api.rs::every_response_carries_a_strict_content_security_policy`,
//!   `tests/tests/dashboard_api.rs::a_forged_host_is_refused`,
//!   `tests/tests/dashboard_api.rs::unauthenticated_visits_go_to_the_login_page`,
//!   `tests/tests/dashboard_api.rs::every_state_changing_endpoint_refuses_without_session_owner_or_token`).
//! - Sessions: a random 256-bit id in an `HttpOnly`, `SameSite=Strict`
//!   cookie (`Secure` and `__Host-` under TLS, ours or a trusted proxy's
//!   for the external origin), stored as its SHA-256 (`api_login` and
//!   `gate` digest the id before the store sees it; no test reads the
//!   stored rows);
//!   a login always makes a new id and ends the one presented (rotation).
//!   When a request carries the cookie more than once (a browser sends
//!   every cookie of that name it holds), the first of them that is a live
//!   session is taken ([`SESSION_CANDIDATES`] at most are looked up)
//!   (`tests/tests/dashboard_api.rs::sessions_are_strict_cookies_rotated_at_login_and_ended_at_logout`,
//!   `tests/tests/dashboard_api.rs::a_duplicated_session_cookie_takes_the_live_session`).
//! - Over TLS (ours, or the trusted proxy's) every response carries
//!   `Strict-Transport-Security`.
//! - Failed logins are limited per client address and per (account,
//!   address) (`throttle.rs`): a correct password from an address that has
//!   not failed is never refused
//!   (`tests/tests/dashboard_api.rs::a_guesser_elsewhere_never_locks_the_owner_out`).
//!   At most [`VERIFYING_AT_ONCE`] passwords are verified at once (19 MiB
//!   each); other logins wait
//!   (`tests/tests/dashboard_api.rs::a_login_flood_holds_the_memory_of_two_password_checks`).
//! - Agent-written text is data: see `pages.rs`; the JSON escapes every
//!   non-ASCII character (`terminal::json`).

pub mod backend;
pub mod chain;
pub mod guard;
pub mod metrics;
pub mod night;
pub mod pages;
pub mod risky;
pub mod socket;
pub mod throttle;
pub use nightshift_core::accounts as users;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use tower_http::set_header::SetResponseHeaderLayer;

use backend::{Backend, BackendError};
use guard::{Arrival, Front, Provenance, Role};
use nightshift_supervisor::api::{Command as ApiCommand, ErrorKind};
use nightshift_supervisor::commands::serve::{run_queue, QueueError, RunQueue};
use pages::Viewer;
use throttle::{Quota, Throttle};

use nightshift_core::state_store::{StateStore, Stores};

/// Largest request body read (forms and JSON are small).
const BODY_LIMIT: usize = 64 * 1024;
/// How long a session lives.
const SESSION_SECS: i64 = 12 * 3600;
/// Acts per Queue page.
pub const PER_PAGE: u64 = 50;
/// Most bytes one live-output stream sends.
const STREAM_CAP: u64 = 1 << 20;
/// Most session cookies of one request looked up.
const SESSION_CANDIDATES: usize = 4;
/// Most keys each login limiter holds (see `throttle.rs`).
const LOGIN_KEYS: usize = 16 * 1024;
/// Most passwords verified at once: each Argon2id verification holds
/// 19 MiB, so logins flooding in wait their turn instead of adding memory.
const VERIFYING_AT_ONCE: usize = 2;
const HSTS: &str = "max-age=31536000";

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Bind(String),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] nightshift_core::state_store::StoreError),
    #[error("serving: {0}")]
    Serve(#[source] std::io::Error),
}

/// The kind of a server's error, as every front end maps it: a bind the
/// request asked for is its own fault, the store the state's, the rest
/// this process's.
impl From<&ServeError> for ErrorKind {
    fn from(e: &ServeError) -> Self {
        match e {
            ServeError::Bind(_) => ErrorKind::BadInput,
            ServeError::Store(_) => ErrorKind::State,
            ServeError::Listen { .. } | ServeError::Serve(_) => ErrorKind::Internal,
        }
    }
}

/// How `serve` listens.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub bind: SocketAddr,
    /// More `Host` names to answer to (besides the bind address).
    pub allow_hosts: Vec<String>,
    /// Serve plain HTTP on a non-loopback address (something in front does TLS).
    pub insecure_network: bool,
    /// Serve `/metrics` alone, without authentication, on this address too.
    pub metrics_addr: Option<SocketAddr>,
    /// The owner's key file, used only for an owner's session's decisions.
    pub owner_key: PathBuf,
    /// The configuration file the API reads (default `STATE/config.toml`).
    pub config: Option<PathBuf>,
    /// How often the whole audit chain is walked in the background (a
    /// Morning load walks only the entries appended since the last check).
    pub chain_every: Duration,
    /// Serve HTTPS with this certificate chain and private key (PEM files).
    pub tls: Option<TlsFiles>,
    /// A TLS proxy in front: its external origin and addresses (`[serve]`).
    pub front: Front,
}

/// The PEM files of `serve`'s own certificate chain and private key.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Reads the certificate chain and key into a rustls server configuration
/// (HTTP/1.1 only), naming the file that is wrong. The key file must be the
/// supervisor's own and readable by no one else, as every secret is.
fn tls_config(files: &TlsFiles) -> Result<rustls::ServerConfig, String> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no certificate", files.cert.display()));
    }
    {
        let meta =
            std::fs::metadata(&files.key).map_err(|e| format!("{}: {e}", files.key.display()))?;
        if let Some(p) = nightshift_core::secret_file::problem_of(&meta) {
            return Err(format!(
                "{}: a private key must be owned by the supervisor's user and readable by no one else: it {p}",
                files.key.display(),
            ));
        }
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("{}: not a PEM private key: {e}", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    if let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        tokio::select! {
            _ = int.recv() => {},
            _ = term.recv() => {},
        }
    } else {
        std::future::pending::<()>().await;
    }
}

/// Accepts TLS connections until `shutdown`, each served on its own task:
/// a handshake that fails or stalls (10 s) ends that connection only.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    config: rustls::ServerConfig,
    router: Router,
) -> Result<(), ServeError> {
    use tower::Service as _;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                // Out of descriptors and the like: wait, then go on.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        tokio::spawn(async move {
            let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                return;
            };
            let service = hyper::service::service_fn(
                move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    router.clone().call(req)
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

#[derive(Debug, Clone)]
struct App {
    backend: Backend,
    hosts: Arc<Vec<String>>,
    tls: bool,
    front: Arc<Front>,
    logins: Arc<Mutex<Logins>>,
    verifying: Arc<tokio::sync::Semaphore>,
}

/// Failed logins, per client address and per (account, address).
#[derive(Debug)]
struct Logins {
    by_address: Throttle<IpAddr>,
    by_account: Throttle<(String, IpAddr)>,
}

impl Logins {
    fn new() -> Logins {
        Logins {
            // Ten failures at once from one address, then one every 6 s;
            // five per account from one address, then one every 12 s.
            by_address: Throttle::new(
                Quota {
                    burst: 10,
                    every: Duration::from_secs(6),
                },
                LOGIN_KEYS,
            ),
            by_account: Throttle::new(
                Quota {
                    burst: 5,
                    every: Duration::from_secs(12),
                },
                LOGIN_KEYS,
            ),
        }
    }

    /// Charges an attempt, or refuses it when the address or the account
    /// from that address has failed too often.
    fn attempt(&mut self, client: IpAddr, account: &str, now: Instant) -> bool {
        let pair = (account.to_string(), client);
        if self.by_address.refuses(&client, now) || self.by_account.refuses(&pair, now) {
            return false;
        }
        self.by_address.charge(client, now);
        self.by_account.charge(pair, now);
        true
    }

    /// The attempt did not fail (right password, or our own trouble).
    fn refund(&mut self, client: IpAddr, account: &str, now: Instant) {
        self.by_address.refund(&client, now);
        self.by_account.refund(&(account.to_string(), client), now);
    }
}

/// A resolved session, put into the request by [`gate`].
#[derive(Debug, Clone)]
struct Session {
    id_sha256: String,
    user: String,
    role: Role,
    csrf: String,
}

impl Session {
    fn viewer(&self) -> Viewer {
        Viewer {
            user: self.user.clone(),
            role: self.role,
            csrf: self.csrf.clone(),
        }
    }
}

/// A request's parameters, from a form or a JSON object (read by [`gate`]).
#[derive(Debug, Clone, Default)]
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(headers: &HeaderMap, body: &[u8]) -> Result<Params, String> {
        if body.is_empty() {
            return Ok(Params::default());
        }
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"));
        if json {
            let v: serde_json::Value =
                serde_json::from_slice(body).map_err(|e| format!("the JSON body: {e}"))?;
            let obj = v.as_object().ok_or("the JSON body must be an object")?;
            let mut out = Vec::new();
            for (k, v) in obj {
                match v {
                    serde_json::Value::Array(items) => {
                        for i in items {
                            out.push((k.clone(), scalar(i)?));
                        }
                    }
                    other => out.push((k.clone(), scalar(other)?)),
                }
            }
            Ok(Params(out))
        } else {
            serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
                .map(Params)
                .map_err(|e| format!("the form: {e}"))
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

fn scalar(v: &serde_json::Value) -> Result<String, String> {
    match v {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        // An object (a task to enqueue) is handed on as its JSON text.
        serde_json::Value::Object(_) => Ok(v.to_string()),
        _ => Err(
            "the JSON body's values must be strings, numbers, booleans, objects or lists of them"
                .into(),
        ),
    }
}

fn now_secs() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-nightshift_session"
    } else {
        "nightshift_session"
    }
}

/// The well-formed session ids the request carries, in the order sent,
/// each once, at most [`SESSION_CANDIDATES`].
fn session_cookies(headers: &HeaderMap, secure: bool) -> Vec<String> {
    let name = cookie_name(secure);
    let mut out: Vec<String> = Vec::new();
    let values = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()));
    for v in values {
        if out.len() == SESSION_CANDIDATES {
            break;
        }
        if !out.iter().any(|o| o == v) {
            out.push(v.to_string());
        }
    }
    out
}

fn set_cookie(secure: bool, value: &str, max_age: i64) -> HeaderValue {
    let flag = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{flag}",
        cookie_name(secure)
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn digest(s: &str) -> String {
    nightshift_core::audit_log::digest(s.as_bytes())
}

/// Is this request one a page script or a program makes for JSON?
fn wants_json(headers: &HeaderMap, path: &str) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    accept.contains("application/json")
        || ctype.starts_with("application/json")
        || (path.starts_with("/api/") && !accept.contains("text/html"))
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        nightshift_core::terminal::json(value, false),
    )
        .into_response()
}

fn html_response(status: StatusCode, markup: maud::Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

fn refuse(json: bool, status: StatusCode, message: &str) -> Response {
    if json {
        json_response(status, &serde_json::json!({ "error": message }))
    } else {
        html_response(status, pages::error(None, status.as_u16(), message))
    }
}

/// Requests that need no session.
fn public(method: &Method, path: &str) -> bool {
    (method == Method::GET && (path == "/login" || path.starts_with("/assets/")))
        || (method == Method::POST && path == "/api/v1/login")
}

fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The `Host` allowlist, then where the request comes from ([`Arrival`],
/// put into the request); `Strict-Transport-Security` on every answer
/// over TLS (ours, or the trusted proxy's).
async fn host_check(State(app): State<App>, req: Request, next: Next) -> Response {
    let tls = app.tls;
    let (mut resp, secure) = arrive(app, req, next).await;
    if tls || secure {
        resp.headers_mut().insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static(HSTS),
        );
    }
    resp
}

/// [`host_check`]'s checks: the answer, and whether it goes out over TLS.
async fn arrive(app: App, mut req: Request, next: Next) -> (Response, bool) {
    let json = wants_json(req.headers(), req.uri().path());
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    let external =
        app.front.external.as_ref().is_some_and(|e| {
            host.is_some_and(|h| e.hosts.iter().any(|a| a.eq_ignore_ascii_case(h)))
        });
    if !external && !guard::host_allowed(host, &app.hosts) {
        let no = refuse(
            json,
            StatusCode::MISDIRECTED_REQUEST,
            "this Host is not served here",
        );
        return (no, false);
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let forwarded: Vec<&str> = req
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let arrival = match guard::arrival(&app.front, app.tls, peer, host.unwrap_or(""), &forwarded) {
        Ok(a) => a,
        Err(why) if external => {
            return (refuse(json, StatusCode::MISDIRECTED_REQUEST, &why), false)
        }
        Err(why) => return (refuse(json, StatusCode::BAD_REQUEST, &why), false),
    };
    let secure = arrival.secure;
    req.extensions_mut().insert(arrival);
    (next.run(req).await, secure)
}

fn arrival_of(req: &Request) -> Arrival {
    req.extensions()
        .get::<Arrival>()
        .cloned()
        .unwrap_or(Arrival {
            client: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            secure: false,
            origin: String::new(),
        })
}

/// Authentication, CSRF and the owner's role, for every route (see the note).
async fn gate(State(app): State<App>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let json = wants_json(req.headers(), &path) || path == "/metrics";
    let arrival = arrival_of(&req);
    let mut session = None;
    for id in session_cookies(req.headers(), arrival.secure) {
        let id_sha256 = digest(&id);
        let b = app.backend.clone();
        let key = id_sha256.clone();
        let found =
            tokio::task::spawn_blocking(move || b.with_store(|s| s.session(&key, now_secs())))
                .await;
        session = match found {
            Ok(Ok(Some((user, role, csrf, _)))) => Role::parse(&role).map(|role| Session {
                id_sha256,
                user,
                role,
                csrf,
            }),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => return refuse(json, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            Err(e) => return refuse(json, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        if session.is_some() {
            break;
        }
    }
    if session.is_none() && !public(&method, &path) {
        return if json {
            refuse(true, StatusCode::UNAUTHORIZED, "log in first")
        } else {
            Redirect::to("/login").into_response()
        };
    }
    if !changes_state(&method) {
        let mut req = req;
        if let Some(s) = session {
            req.extensions_mut().insert(s);
        }
        return next.run(req).await;
    }
    // A state-changing request: read its parameters once, here.
    let (mut parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            return refuse(
                json,
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large",
            )
        }
    };
    let params = match Params::parse(&parts.headers, &bytes) {
        Ok(p) => p,
        Err(e) => return refuse(json, StatusCode::BAD_REQUEST, &e),
    };
    let header_text = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let provenance = Provenance {
        expected_origin: &arrival.origin,
        origin: header_text("origin"),
        sec_fetch_site: header_text("sec-fetch-site"),
    };
    let checked = match &session {
        // Logging in has no session (or one about to be replaced): the
        // browser's word on the origin (and SameSite cookies) stand in for
        // the token.
        _ if path == "/api/v1/login" => guard::same_origin(&provenance),
        None => guard::same_origin(&provenance),
        Some(s) => {
            let presented = header_text("x-csrf-token").or_else(|| params.get("csrf"));
            guard::state_change_allowed(&provenance, presented, &s.csrf)
        }
    };
    if let Err(e) = checked {
        return refuse(json, StatusCode::FORBIDDEN, &format!("refused: {e}"));
    }
    if let Some(s) = &session {
        let own_session = path == "/api/v1/logout" || path == "/api/v1/login";
        if !own_session && s.role != Role::Owner {
            return refuse(
                json,
                StatusCode::FORBIDDEN,
                "only the owner may change anything",
            );
        }
        parts.extensions.insert(s.clone());
    }
    parts.extensions.insert(params);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// `nightshift serve`: [`serve`] and, beside it on the same runtime, the
/// run queue's dispatcher with its runs in this process (`queue`, under
/// `config`; see `nightshift_supervisor::commands::serve`), which is told
/// to stop when the server stops and waited for (its runs stopped and
/// settled). `ready` is told the address bound; `queue_ended`, why the
/// dispatcher did not start or stopped while the pages went on.
pub async fn serve_with_queue(
    api: &nightshift_supervisor::api::Api,
    config: &nightshift_core::config::Config,
    opts: ServeOptions,
    queue: RunQueue,
    ready: impl FnOnce(SocketAddr, Option<SocketAddr>),
    queue_ended: impl FnOnce(QueueError),
) -> Result<(), ServeError> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let dispatcher = async {
        if let Err(e) = run_queue(api, config, queue, stopped).await {
            queue_ended(e);
        }
    };
    let server = async {
        let served = serve(api.stores().clone(), opts, ready).await;
        let _ = stop.send(true);
        served
    };
    let (served, ()) = tokio::join!(server, dispatcher);
    served
}

/// Serves until SIGINT or SIGTERM; `ready` is told the address bound (and
/// the metrics' own, when asked for).
pub async fn serve(
    stores: Stores,
    opts: ServeOptions,
    ready: impl FnOnce(SocketAddr, Option<SocketAddr>),
) -> Result<(), ServeError> {
    let tls_config = opts
        .tls
        .as_ref()
        .map(tls_config)
        .transpose()
        .map_err(ServeError::Bind)?;
    let tls = tls_config.is_some();
    guard::bind_allowed(opts.bind, tls, opts.insecure_network).map_err(ServeError::Bind)?;
    let listener = tokio::net::TcpListener::bind(opts.bind)
        .await
        .map_err(|source| ServeError::Listen {
            addr: opts.bind,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| ServeError::Listen {
        addr: opts.bind,
        source,
    })?;
    // The metrics' own address: `/metrics` alone, no session (scrapers
    // hold none), so plain HTTP off loopback only when asked for.
    let metrics_listener = match opts.metrics_addr {
        None => None,
        Some(addr) => {
            if !addr.ip().is_loopback() && !opts.insecure_network {
                return Err(ServeError::Bind(format!(
                    "refusing to serve the metrics without authentication on {addr}, which is not a loopback address: give --insecure-network if only your scraper can reach it"
                )));
            }
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Listen { addr, source })?;
            let at = l
                .local_addr()
                .map_err(|source| ServeError::Listen { addr, source })?;
            Some((l, at))
        }
    };
    let mut backend = Backend::new(stores, opts.owner_key)?.with_config(opts.config);
    backend.chain_every = opts.chain_every.max(Duration::from_secs(1));
    tokio::spawn(backend::watch_chain(backend.clone()));
    // The act executor: carries out what the owner approved (here, through
    // the owner's socket, or elsewhere), apart from the decisions.
    let executor_store = backend.api.stores().connect()?;
    tokio::spawn(nightshift_supervisor::acts::executor::run(Arc::new(
        nightshift_supervisor::acts::passes(
            executor_store,
            nightshift_supervisor::acts::executor::LEASE_SECS,
            |_| {},
        ),
    )));
    let app = App {
        backend,
        hosts: Arc::new(guard::default_hosts(bound, &opts.allow_hosts)),
        tls,
        front: Arc::new(opts.front),
        logins: Arc::new(Mutex::new(Logins::new())),
        verifying: Arc::new(tokio::sync::Semaphore::new(VERIFYING_AT_ONCE)),
    };
    // The owner's socket: the command line's way in (`socket.rs`).
    let owner_socket = match socket::bind(&app.backend.root).await {
        Ok(Ok(unix)) => {
            let router = socket::router(app.backend.api.clone());
            Some(tokio::spawn(async move {
                if let Err(e) = axum::serve(unix, router).await {
                    tracing::warn!(error = %e, "the owner's socket stopped");
                }
            }))
        }
        Ok(Err(why)) => {
            tracing::warn!("{why}");
            None
        }
        Err(e) => {
            return Err(ServeError::Bind(format!(
                "binding {}: {e}",
                socket::socket_path(&app.backend.root).display()
            )))
        }
    };
    let socket_path = socket::socket_path(&app.backend.root);
    // The run queue's dispatcher runs beside this server on the same
    // runtime ([`serve_with_queue`] joins both).
    let metrics_task = metrics_listener.as_ref().map(|(_, at)| *at);
    let metrics_server = metrics_listener.map(|(l, _)| {
        let only = Router::new()
            .route("/metrics", get(metrics_open))
            .with_state(app.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(l, only).await {
                tracing::warn!(error = %e, "the metrics' address stopped");
            }
        })
    });
    let router = router(app);
    ready(bound, metrics_task);
    let served = if let Some(config) = tls_config {
        serve_tls(listener, config, router).await
    } else {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(ServeError::Serve)
    };
    if let Some(task) = metrics_server {
        task.abort();
    }
    if let Some(task) = owner_socket {
        task.abort();
        let _ = std::fs::remove_file(&socket_path);
    }
    served
}

fn router(app: App) -> Router {
    let header = |name: &'static str, value: &'static str| {
        SetResponseHeaderLayer::overriding(
            header::HeaderName::from_static(name),
            HeaderValue::from_static(value),
        )
    };
    Router::new()
        .route("/", get(page_morning))
        .route("/metrics", get(metrics_authenticated))
        .route("/runs", get(page_runs))
        .route("/runs/{id}", get(page_run))
        .route("/queue", get(page_queue))
        .route("/policy", get(page_policy))
        .route("/stop", get(page_stop))
        .route("/login", get(page_login))
        .route("/assets/app.js", get(asset_js))
        .route("/assets/app.css", get(asset_css))
        .route("/api/v1/login", post(api_login))
        .route("/api/v1/logout", post(api_logout))
        .route("/api/v1/session", get(api_session))
        .route("/api/v1/morning", get(api_morning))
        .route("/api/v1/runs", get(api_runs))
        .route("/api/v1/runs/{id}", get(api_run))
        .route("/api/v1/runs/{id}/output", get(api_output))
        .route("/api/v1/queue", get(api_queue))
        .route("/api/v1/policy", get(api_policy))
        .route("/api/v1/acts/{id}", get(api_act))
        .route("/api/v1/acts/approve", post(api_approve))
        .route("/api/v1/acts/reject", post(api_reject))
        .route("/api/v1/acts/approve-commit", post(api_approve_commit))
        .route("/api/v1/kill", post(api_kill))
        .route("/api/v1/freeze", post(api_freeze))
        .route("/api/v1/thaw", post(api_thaw))
        .route("/api/v1/policy/ratify", post(api_ratify))
        .route("/api/v1/openapi.json", get(openapi_json))
        .route("/api/v1/tasks", post(api_enqueue))
        .route("/api/v1/tasks/cancel", post(api_cancel))
        .route("/api/v1/runs/{id}/continue", post(api_continue))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), gate))
        .layer(middleware::from_fn_with_state(app.clone(), host_check))
        .layer(header("content-security-policy", CSP))
        .layer(header("x-content-type-options", "nosniff"))
        .layer(header("x-frame-options", "DENY"))
        // `no-referrer` would make browsers send `Origin: null` on form posts.
        .layer(header("referrer-policy", "same-origin"))
        .layer(header("cache-control", "no-store"))
        .layer(header("cross-origin-opener-policy", "same-origin"))
        .layer(header("cross-origin-resource-policy", "same-origin"))
        .with_state(app)
}

// ----- reading -----

fn backend_status(e: &BackendError) -> StatusCode {
    match e {
        BackendError::NotOwner(_) => StatusCode::FORBIDDEN,
        BackendError::NotFound(_) => StatusCode::NOT_FOUND,
        BackendError::Refused(_) => StatusCode::CONFLICT,
        BackendError::BadInput(_) => StatusCode::BAD_REQUEST,
        BackendError::Store(_) | BackendError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        BackendError::Api(e) => {
            StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }
    }
}

/// Runs `f` on the blocking pool with the state.
async fn blocking<T: Send + 'static>(
    app: &App,
    f: impl FnOnce(&Backend, &mut dyn StateStore) -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    let b = app.backend.clone();
    tokio::task::spawn_blocking(move || {
        let b2 = b.clone();
        b.with_store(|s| f(&b2, s))
    })
    .await
    .map_err(|e| BackendError::Failed(e.to_string()))?
}

fn page<T>(
    who: Option<&Viewer>,
    r: Result<T, BackendError>,
    render: impl FnOnce(T) -> maud::Markup,
) -> Response {
    match r {
        Ok(v) => html_response(StatusCode::OK, render(v)),
        Err(e) => {
            let status = backend_status(&e);
            html_response(status, pages::error(who, status.as_u16(), &e.to_string()))
        }
    }
}

fn api<T: serde::Serialize>(r: Result<T, BackendError>) -> Response {
    match r {
        Ok(v) => json_response(StatusCode::OK, &serde_json::to_value(v).unwrap_or_default()),
        Err(e) => json_response(
            backend_status(&e),
            &serde_json::json!({"error": e.to_string()}),
        ),
    }
}

#[derive(Debug, serde::Deserialize)]
struct SinceQuery {
    since: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct PageQuery {
    page: Option<String>,
}

impl PageQuery {
    /// The page asked for (from 0), refused when it is no number or lies
    /// past any page the queue can hold (its offset must fit the store's
    /// 63 bits).
    fn page(&self) -> Result<u64, BackendError> {
        let Some(text) = self.page.as_deref().filter(|p| !p.is_empty()) else {
            return Ok(0);
        };
        text.parse::<u64>()
            .ok()
            .filter(|p| {
                p.checked_mul(PER_PAGE)
                    .is_some_and(|o| i64::try_from(o).is_ok())
            })
            .ok_or_else(|| {
                BackendError::BadInput(format!(
                    "page {:?}: give a page number from 0 to {}",
                    shortened(text),
                    i64::MAX as u64 / PER_PAGE
                ))
            })
    }
}

/// A query text cut short for an error message.
fn shortened(text: &str) -> String {
    text.chars().take(40).collect()
}

fn since_or_default(q: &SinceQuery) -> Result<String, BackendError> {
    match q.since.as_deref().filter(|s| !s.is_empty()) {
        None => Ok(backend::hours_ago(16)),
        Some(s) => time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .map(|_| s.to_string())
            .map_err(|e| {
                BackendError::BadInput(format!("since {s:?}: give an RFC 3339 time: {e}"))
            }),
    }
}

async fn page_morning(
    State(app): State<App>,
    s: axum::Extension<Session>,
    Query(q): Query<SinceQuery>,
) -> Response {
    let since = since_or_default(&q);
    let r = blocking(&app, move |b, st| backend::morning(b, st, &since?)).await;
    let who = s.viewer();
    page(Some(&who), r, |m| pages::morning(&who, &m))
}

async fn api_morning(State(app): State<App>, Query(q): Query<SinceQuery>) -> Response {
    let since = since_or_default(&q);
    api(blocking(&app, move |b, st| backend::morning(b, st, &since?)).await)
}

fn all_runs(
    st: &dyn StateStore,
) -> Result<Vec<(String, nightshift_core::state_store::RunRecord)>, BackendError> {
    Ok(st
        .runs()?
        .into_iter()
        .map(|r| (backend::outcome(&r).to_string(), r))
        .collect())
}

async fn page_runs(State(app): State<App>, s: axum::Extension<Session>) -> Response {
    let r = blocking(&app, |_, st| {
        Ok((all_runs(st)?, backend::freeze_state(st)?))
    })
    .await;
    let who = s.viewer();
    page(Some(&who), r, |(runs, frozen)| {
        pages::runs(&who, frozen.as_deref(), &runs)
    })
}

async fn api_runs(State(app): State<App>) -> Response {
    api(blocking(&app, |_, st| all_runs(st)).await)
}

async fn page_run(
    State(app): State<App>,
    s: axum::Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    let r = blocking(&app, move |b, st| {
        Ok((backend::run_view(b, st, &id)?, backend::freeze_state(st)?))
    })
    .await;
    let who = s.viewer();
    page(Some(&who), r, |(run, frozen)| {
        pages::run(&who, frozen.as_deref(), &run)
    })
}

async fn api_act(State(app): State<App>, Path(id): Path<String>) -> Response {
    api(blocking(&app, move |_, st| backend::act_outcome(st, &id)).await)
}

async fn api_run(State(app): State<App>, Path(id): Path<String>) -> Response {
    let r = blocking(&app, move |b, st| {
        let view = backend::run_view(b, st, &id)?;
        let mut doc = serde_json::to_value(&view).unwrap_or_default();
        doc["diff"] = serde_json::to_value(view.diff.as_deref().map(|d| {
            serde_json::json!({
                "files": d.files, "stat": d.stat, "truncated": d.truncated, "error": d.error,
                "patch": String::from_utf8_lossy(&d.patch),
            })
        }))
        .unwrap_or_default();
        doc["output"] = String::from_utf8_lossy(&view.output).into();
        Ok(doc)
    })
    .await;
    api(r)
}

async fn page_queue(
    State(app): State<App>,
    s: axum::Extension<Session>,
    Query(q): Query<PageQuery>,
) -> Response {
    let pg = q.page();
    let r = blocking(&app, move |b, st| {
        Ok((
            backend::queue(b, st, pg?, PER_PAGE)?,
            backend::freeze_state(st)?,
        ))
    })
    .await;
    let who = s.viewer();
    page(Some(&who), r, |(q, frozen)| {
        pages::queue(&who, frozen.as_deref(), &q)
    })
}

async fn api_queue(State(app): State<App>, Query(q): Query<PageQuery>) -> Response {
    let pg = q.page();
    let r = blocking(&app, move |b, st| {
        let page = backend::queue(b, st, pg?, PER_PAGE)?;
        let mut doc = serde_json::to_value(&page).unwrap_or_default();
        for (i, a) in page.acts.iter().enumerate() {
            if let Some(d) = &a.diff {
                doc["acts"][i]["files"] = serde_json::to_value(&d.files).unwrap_or_default();
                doc["acts"][i]["stat"] = serde_json::to_value(d.stat).unwrap_or_default();
            }
        }
        Ok(doc)
    })
    .await;
    api(r)
}

async fn page_policy(State(app): State<App>, s: axum::Extension<Session>) -> Response {
    let r = blocking(&app, |_, st| backend::policy_view(st)).await;
    let who = s.viewer();
    page(Some(&who), r, |p| pages::policy(&who, &p))
}

async fn api_policy(State(app): State<App>) -> Response {
    api(blocking(&app, |_, st| backend::policy_view(st)).await)
}

async fn page_stop(State(app): State<App>, s: axum::Extension<Session>) -> Response {
    let r = blocking(&app, |_, st| backend::freeze_state(st)).await;
    let who = s.viewer();
    page(Some(&who), r, |frozen| pages::stop(&who, frozen.as_deref()))
}

async fn page_login(session: Option<axum::Extension<Session>>) -> Response {
    if session.is_some() {
        return Redirect::to("/").into_response();
    }
    html_response(StatusCode::OK, pages::login(None))
}

async fn asset_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/app.js"),
    )
        .into_response()
}

async fn asset_css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/app.css"),
    )
        .into_response()
}

async fn not_found(headers: HeaderMap, uri: axum::http::Uri) -> Response {
    refuse(
        wants_json(&headers, uri.path()),
        StatusCode::NOT_FOUND,
        "no such page",
    )
}

/// The JSON API's OpenAPI description (`nightshift_supervisor::api::openapi_json`).
pub(crate) async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        nightshift_supervisor::api::openapi_json(),
    )
        .into_response()
}

async fn api_session(s: axum::Extension<Session>) -> Response {
    json_response(
        StatusCode::OK,
        &serde_json::json!({"user": s.user, "role": s.role, "csrf": s.csrf}),
    )
}

/// Live output of a running run: what its log gains from now on, escaped,
/// at most [`STREAM_CAP`] bytes; an `end` event when the run has ended.
async fn api_output(State(app): State<App>, Path(id): Path<String>) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    // Only a run the store knows, named as the supervisor names runs: the
    // id becomes a path under STATE/runs.
    let known = pages::link_id(&id) && {
        let (b, id) = (app.backend.clone(), id.clone());
        tokio::task::spawn_blocking(move || b.with_store(|s| s.run(&id).is_ok()))
            .await
            .unwrap_or(false)
    };
    if !known {
        return refuse(true, StatusCode::NOT_FOUND, "no such run");
    }
    let path = app.backend.with_store(|s| backend::output_path(s, &id));
    let start = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let state = (app, id, path, start, 0u64, false);
    let stream =
        futures_util::stream::unfold(state, |(app, id, path, offset, sent, ended)| async move {
            if ended {
                return None;
            }
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(offset);
                if len > offset && sent < STREAM_CAP {
                    let want = (len - offset).min(64 * 1024).min(STREAM_CAP - sent);
                    let mut buf = vec![0u8; want as usize];
                    let read = std::fs::File::open(&path).and_then(|f| {
                        use std::os::unix::fs::FileExt;
                        f.read_at(&mut buf, offset)
                    });
                    let n = read.unwrap_or(0) as u64;
                    buf.truncate(n as usize);
                    let text = nightshift_core::terminal::block(&buf);
                    let ev = Event::default().data(text.trim_end_matches('\n'));
                    return Some((
                        Ok::<_, std::convert::Infallible>(ev),
                        (app, id, path, offset + n, sent + n, false),
                    ));
                }
                let id2 = id.clone();
                let b = app.backend.clone();
                let done = tokio::task::spawn_blocking(move || {
                    b.with_store(|s| {
                        s.run(&id2)
                            .map(|r| nightshift_core::state_store::is_final(&r.status))
                            .unwrap_or(true)
                    })
                })
                .await
                .unwrap_or(true);
                if done || sent >= STREAM_CAP {
                    let ev = Event::default().event("end").data(if done {
                        "the run ended"
                    } else {
                        "output cap reached"
                    });
                    return Some((Ok(ev), (app, id, path, offset, sent, true)));
                }
            }
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

// ----- sessions -----

async fn api_login(
    State(app): State<App>,
    axum::Extension(arrival): axum::Extension<Arrival>,
    headers: HeaderMap,
    old: Option<axum::Extension<Session>>,
    axum::Extension(params): axum::Extension<Params>,
) -> Response {
    let json = wants_json(&headers, "/api/v1/login");
    let name = params.get("name").unwrap_or("").to_string();
    let password = params.get("password").unwrap_or("").to_string();
    let fail = |status: StatusCode, msg: &str| {
        if json {
            refuse(true, status, msg)
        } else {
            html_response(status, pages::login(Some(msg)))
        }
    };
    let client = guard::client_key(arrival.client);
    // A name that is no account's is counted as one name: the memory
    // held does not grow with the names tried.
    let account = if users::valid_name(&name) {
        name.clone()
    } else {
        String::new()
    };
    let logins = || app.logins.lock().unwrap_or_else(|p| p.into_inner());
    if !logins().attempt(client, &account, Instant::now()) {
        return fail(
            StatusCode::TOO_MANY_REQUESTS,
            "too many failed logins from this address; wait a minute",
        );
    }
    let b = app.backend.clone();
    let old_id = old.map(|s| s.id_sha256.clone());
    // Held until the verification ends (the semaphore is never closed).
    let permit = app.verifying.clone().acquire_owned().await;
    let result = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        b.with_store(|st| -> Result<Option<(String, String, Role)>, String> {
            let role = users::authenticate(st, &name, &password).map_err(|e| e.to_string())?;
            let Some(role) = role else { return Ok(None) };
            // Rotation: the session presented (if any) ends; a new id is made.
            if let Some(old) = old_id {
                st.delete_session(&old).map_err(|e| e.to_string())?;
            }
            let id = hex::encode(users::random_bytes::<32>().map_err(|e| e.to_string())?);
            let csrf = hex::encode(users::random_bytes::<32>().map_err(|e| e.to_string())?);
            let now = now_secs();
            st.put_session(&digest(&id), &name, &csrf, now, now + SESSION_SECS)
                .map_err(|e| e.to_string())?;
            Ok(Some((id, csrf, role)))
        })
    })
    .await;
    if !matches!(result, Ok(Ok(None))) {
        logins().refund(client, &account, Instant::now());
    }
    match result {
        Ok(Ok(Some((id, csrf, role)))) => {
            let cookie = set_cookie(arrival.secure, &id, SESSION_SECS);
            let mut resp = if json {
                json_response(
                    StatusCode::OK,
                    &serde_json::json!({"csrf": csrf, "role": role}),
                )
            } else {
                Redirect::to("/").into_response()
            };
            resp.headers_mut().insert(header::SET_COOKIE, cookie);
            resp
        }
        Ok(Ok(None)) => fail(StatusCode::UNAUTHORIZED, "wrong name or password"),
        Ok(Err(e)) => fail(StatusCode::INTERNAL_SERVER_ERROR, &e),
        Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn api_logout(
    State(app): State<App>,
    axum::Extension(arrival): axum::Extension<Arrival>,
    headers: HeaderMap,
    s: axum::Extension<Session>,
) -> Response {
    let b = app.backend.clone();
    let id = s.id_sha256.clone();
    let _ = tokio::task::spawn_blocking(move || b.with_store(|st| st.delete_session(&id))).await;
    let mut resp = if wants_json(&headers, "/api/v1/logout") {
        json_response(StatusCode::OK, &serde_json::json!({"logged_out": true}))
    } else {
        Redirect::to("/login").into_response()
    };
    resp.headers_mut()
        .insert(header::SET_COOKIE, set_cookie(arrival.secure, "", 0));
    resp
}

// ----- deciding (the owner; checked in `gate` and again in `backend`) -----

fn decided(
    json: bool,
    back: &'static str,
    r: Result<Vec<backend::Outcome>, BackendError>,
) -> Response {
    match r {
        Ok(outcomes) => {
            if json {
                let ok = outcomes.iter().all(|o| o.ok);
                json_response(
                    StatusCode::OK,
                    &serde_json::json!({"ok": ok, "outcomes": outcomes}),
                )
            } else {
                Redirect::to(back).into_response()
            }
        }
        Err(e) => refuse(json, backend_status(&e), &e.to_string()),
    }
}

async fn api_approve(
    State(app): State<App>,
    headers: HeaderMap,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let ids: Vec<String> = p.all("act").into_iter().map(str::to_string).collect();
    let r = if ids.is_empty() {
        Err(BackendError::BadInput("name at least one act".into()))
    } else {
        let command = backend::approve(&app.backend, ids);
        decide(&app, &s, "approve acts", command).await
    };
    decided(wants_json(&headers, "/api/"), "/queue", r)
}

/// One decision command for the session's account; each act's outcome with
/// its state after it.
async fn decide(
    app: &App,
    s: &Session,
    what: &'static str,
    command: ApiCommand,
) -> Result<Vec<backend::Outcome>, BackendError> {
    let reply = backend::execute(&app.backend, s.role, &s.user, what, command).await?;
    blocking(app, move |_, st| backend::outcomes(st, reply)).await
}

async fn api_reject(
    State(app): State<App>,
    headers: HeaderMap,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let ids: Vec<String> = p.all("act").into_iter().map(str::to_string).collect();
    let why = p.get("why").unwrap_or("");
    let r = match backend::reject(&app.backend, ids.clone(), why) {
        _ if ids.is_empty() => Err(BackendError::BadInput("name at least one act".into())),
        Err(e) => Err(e),
        Ok(command) => decide(&app, &s, "reject acts", command).await,
    };
    decided(wants_json(&headers, "/api/"), "/queue", r)
}

async fn api_approve_commit(
    State(app): State<App>,
    headers: HeaderMap,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let command = backend::approve_commit(&app.backend, p.get("commit").unwrap_or(""));
    let r = decide(&app, &s, "approve acts", command).await;
    decided(wants_json(&headers, "/api/"), "/queue", r)
}

fn done(json: bool, back: &'static str, r: Result<serde_json::Value, BackendError>) -> Response {
    match r {
        Ok(v) if json => json_response(StatusCode::OK, &v),
        Ok(_) => Redirect::to(back).into_response(),
        Err(e) => refuse(json, backend_status(&e), &e.to_string()),
    }
}

async fn api_kill(
    State(app): State<App>,
    headers: HeaderMap,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let json = wants_json(&headers, "/api/");
    if p.get("confirm") != Some("yes") {
        return refuse(
            json,
            StatusCode::BAD_REQUEST,
            "the kill switch needs confirm=yes",
        );
    }
    let why = p.get("why").unwrap_or("").trim().to_string();
    if why.is_empty() {
        return refuse(
            json,
            StatusCode::BAD_REQUEST,
            "the kill switch needs a reason",
        );
    }
    let run = p.get("run").filter(|r| !r.is_empty()).map(str::to_string);
    let freeze = p.get("freeze") == Some("true");
    let r = backend::kill(&app.backend, s.role, &s.user, run.as_deref(), freeze, &why)
        .await
        .map(|runs| serde_json::json!({"killed": runs, "frozen": freeze}));
    done(json, "/", r)
}

async fn api_freeze(
    State(app): State<App>,
    headers: HeaderMap,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let command = backend::freeze(p.get("why").unwrap_or(""));
    let r = backend::execute(&app.backend, s.role, &s.user, "freeze", command)
        .await
        .map(|_| serde_json::json!({"frozen": true}));
    done(wants_json(&headers, "/api/"), "/", r)
}

async fn api_thaw(
    State(app): State<App>,
    headers: HeaderMap,
    s: axum::Extension<Session>,
) -> Response {
    let command = backend::thaw(&app.backend);
    let r = backend::execute(&app.backend, s.role, &s.user, "thaw", command)
        .await
        .map(|_| serde_json::json!({"frozen": false}));
    done(wants_json(&headers, "/api/"), "/policy", r)
}

async fn api_ratify(
    State(app): State<App>,
    headers: HeaderMap,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let command = backend::ratify(&app.backend, p.get("proposal").unwrap_or(""));
    let r = backend::execute(&app.backend, s.role, &s.user, "ratify rules", command)
        .await
        .map(|_| serde_json::json!({"ratified": true}));
    done(wants_json(&headers, "/api/"), "/policy", r)
}

/// Adds tasks to the run queue: `task` is one task (a JSON object, as in a
/// tasks file's `[[task]]` table), repeatable or a list.
async fn api_enqueue(
    State(app): State<App>,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let tasks: Result<Vec<nightshift_supervisor::run_queue::TaskSpec>, BackendError> = p
        .all("task")
        .into_iter()
        .map(|t| {
            serde_json::from_str(t).map_err(|e| BackendError::BadInput(format!("a task: {e}")))
        })
        .collect();
    let r = match tasks {
        Ok(tasks) if tasks.is_empty() => {
            Err(BackendError::BadInput("name at least one task".into()))
        }
        Ok(tasks) => {
            backend::execute(
                &app.backend,
                s.role,
                &s.user,
                "enqueue tasks",
                ApiCommand::Enqueue { tasks },
            )
            .await
        }
        Err(e) => Err(e),
    };
    api(r)
}

/// Continues a run a cap ended (`nightshift continue`): `max_tokens` and
/// `timeout`, each optional (empty: as before). A form goes back to the
/// run's page; JSON gets the reply.
async fn api_continue(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let json = wants_json(&headers, "/api/");
    let r = match backend::continue_run(&id, p.get("max_tokens"), p.get("timeout")) {
        Ok(command) => {
            backend::execute(&app.backend, s.role, &s.user, "continue runs", command).await
        }
        Err(e) => Err(e),
    };
    match r {
        Ok(reply) if json => api(Ok(reply)),
        Ok(_) if pages::link_id(&id) => Redirect::to(&format!("/runs/{id}")).into_response(),
        Ok(_) => Redirect::to("/").into_response(),
        Err(e) => refuse(json, backend_status(&e), &e.to_string()),
    }
}

/// `/metrics` on the dashboard's address: [`gate`] let only a session in.
async fn metrics_authenticated(State(app): State<App>) -> Response {
    metrics_response(&app).await
}

/// `/metrics` on its own address (`--metrics-addr`): nothing else answers there.
async fn metrics_open(State(app): State<App>) -> Response {
    metrics_response(&app).await
}

async fn metrics_response(app: &App) -> Response {
    match blocking(app, |_, st| Ok(metrics::snapshot(st)?)).await {
        Ok(s) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, nightshift_core::metrics::CONTENT_TYPE)],
            nightshift_core::metrics::render(&s),
        )
            .into_response(),
        Err(e) => refuse(true, backend_status(&e), &e.to_string()),
    }
}

/// Cancels a queued task (`task`: its id).
async fn api_cancel(
    State(app): State<App>,
    s: axum::Extension<Session>,
    axum::Extension(p): axum::Extension<Params>,
) -> Response {
    let command = ApiCommand::CancelTask {
        task: p.get("task").unwrap_or("").to_string(),
    };
    api(backend::execute(&app.backend, s.role, &s.user, "cancel tasks", command).await)
}
