//! The owner's socket of `nightshift serve`: `STATE/serve.sock`, the same
//! versioned JSON API (`/api/v1/...`) over a Unix socket, through which the
//! command line hands its [`Command`]s to a running `serve` (both sides of
//! it live here: the listener and [`send`]).
//!
//! Invariants:
//! - The socket is the owner's credential: it is made mode 0600 inside the
//!   state directory (0700), so only the state's owner can connect; no
//!   session, no CSRF token (no browser can reach a Unix socket). The
//!   commands it carries still need what they need locally (an approval
//!   still reads the owner's key file the command names)
//!   (`tests::a_live_serves_socket_is_kept_and_a_dead_ones_replaced`,
//!   `tests/tests/cli_serve.rs::the_command_line_goes_through_a_running_serve_and_works_alone_after_kill_9`).
//! - A command that came through it is executed for [`Caller::Socket`]:
//!   the audit names an owner's decision `owner via serve`, and every
//!   answer says `"via": "serve"`.
//! - A `serve` never takes over the socket of another `serve` that still
//!   answers; a socket nobody answers (a `serve` killed with `kill -9`) is
//!   replaced (`tests::a_live_serves_socket_is_kept_and_a_dead_ones_replaced`).
//! - [`send`] never hangs on a dead or absent `serve`: connecting gives up
//!   after [`CONNECT_TIMEOUT`] and the caller executes the command itself.
//!   Once a command was handed over, its answer is awaited (executing it
//!   again locally could decide twice), unless the caller gave a bound
//!   (the kill switch, which is idempotent, does)
//!   (`tests::send_gives_up_on_an_absent_or_dead_serve`,
//!   `tests/tests/cli_serve.rs::the_command_line_goes_through_a_running_serve_and_works_alone_after_kill_9`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use nightshift_supervisor::api::{Api, ApiError, Caller, Command, ErrorKind, Reply};

/// The socket's name in the state directory.
pub const SOCKET: &str = "serve.sock";
/// How long [`send`] waits to connect before executing locally.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Largest command read (a tasks file's worth of tasks).
const BODY_LIMIT: usize = 4 << 20;

pub fn socket_path(root: &Path) -> PathBuf {
    root.join(SOCKET)
}

pub use nightshift_supervisor::api::Answer;

/// Binds the owner's socket, or gives `None` (with the reason) when another
/// `serve` of this state answers on it.
pub async fn bind(root: &Path) -> Result<Result<tokio::net::UnixListener, String>, std::io::Error> {
    use std::os::unix::fs::PermissionsExt;
    let path = socket_path(root);
    if tokio::net::UnixStream::connect(&path).await.is_ok() {
        return Ok(Err(format!(
            "another serve answers on {}: this one takes no command-line requests",
            path.display()
        )));
    }
    // Nobody answers: a socket left by a serve that was killed.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(Ok(listener))
}

/// The socket's routes.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/api/v1/command", post(command))
        .route("/api/v1/openapi.json", get(super::openapi_json))
        .with_state(api)
}

fn answer(status: StatusCode, answer: &Answer) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(answer).unwrap_or_default(),
    )
        .into_response()
}

fn failed(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    answer(
        status,
        &Answer {
            via: "serve".into(),
            reply: None,
            error: Some(e),
        },
    )
}

async fn command(State(api): State<Api>, body: Bytes) -> Response {
    if body.len() > BODY_LIMIT {
        return failed(ApiError::new(
            ErrorKind::BadInput,
            "the command is too large",
        ));
    }
    let command: Command = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return failed(ApiError::new(
                ErrorKind::BadInput,
                format!("the command: {e}"),
            ))
        }
    };
    tracing::info!(command = ?command, "a command through the owner's socket");
    // The kill switch's futures hold a store across awaits (not `Send`):
    // each command runs on a blocking thread with its own executor.
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || {
        handle.block_on(api.execute_as(command, &Caller::Socket))
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::caused(ErrorKind::Internal, e)));
    match result {
        Ok(reply) => answer(
            StatusCode::OK,
            &Answer {
                via: "serve".into(),
                reply: Some(reply),
                error: None,
            },
        ),
        Err(e) => failed(e),
    }
}

/// Hands `command` to the `serve` of the state at `root`, if one answers
/// there. `None`: no `serve` took it (no socket, nobody answering within
/// [`CONNECT_TIMEOUT`], or no answer within `bound` when one is given);
/// the caller executes it itself.
pub async fn send(
    root: &Path,
    command: &Command,
    bound: Option<Duration>,
) -> Option<Result<Reply, ApiError>> {
    let path = socket_path(root);
    let stream =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(&path)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "no serve on {}", path.display());
                return None;
            }
            Err(_) => {
                tracing::debug!(
                    "no answer from {} within {CONNECT_TIMEOUT:?}",
                    path.display()
                );
                return None;
            }
        };
    let exchange = exchange(stream, command);
    let answered = match bound {
        Some(bound) => match tokio::time::timeout(bound, exchange).await {
            Ok(a) => a,
            Err(_) => {
                tracing::warn!("serve did not answer within {bound:?}: executing here");
                return None;
            }
        },
        None => exchange.await,
    };
    Some(match answered {
        Ok(Answer {
            reply: Some(reply), ..
        }) => Ok(reply),
        Ok(Answer {
            error: Some(e), ..
        }) => Err(e),
        Ok(_) => Err(ApiError::new(
            ErrorKind::Internal,
            "serve's answer held neither a reply nor an error",
        )),
        Err(e) => Err(ApiError::new(
            ErrorKind::Internal,
            format!(
                "the command went to serve ({}), which stopped answering: {e}; see `nightshift queue` or `tasks` for what it did",
                path.display()
            ),
        )),
    })
}

async fn exchange(stream: tokio::net::UnixStream, command: &Command) -> Result<Answer, String> {
    use http_body_util::{BodyExt, Full};
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let body = serde_json::to_vec(command).map_err(|e| e.to_string())?;
    let request = hyper::Request::post("/api/v1/command")
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    driver.abort();
    let answer: Answer = serde_json::from_slice(&bytes).map_err(|e| format!("its answer: {e}"))?;
    tracing::info!(via = %answer.via, "the command was executed by serve");
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn a_live_serves_socket_is_kept_and_a_dead_ones_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(dir.path());
        let first = bind(dir.path()).await.unwrap().unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A second serve while the first answers: it keeps out.
        let e = bind(dir.path()).await.unwrap().unwrap_err();
        assert!(e.contains("another serve answers"), "{e}");
        assert!(tokio::net::UnixStream::connect(&path).await.is_ok());
        // The first gone, its socket left behind (as after kill -9): replaced.
        drop(first);
        assert!(path.exists());
        let _third = bind(dir.path()).await.unwrap().unwrap();
        assert!(tokio::net::UnixStream::connect(&path).await.is_ok());
    }

    #[tokio::test]
    async fn send_gives_up_on_an_absent_or_dead_serve() {
        let dir = tempfile::tempdir().unwrap();
        let command = Command::Freeze { why: "x".into() };
        assert!(send(dir.path(), &command, None).await.is_none());
        // A socket nobody answers: nothing was handed over, so the caller
        // is told to decide itself.
        drop(bind(dir.path()).await.unwrap().unwrap());
        assert!(send(dir.path(), &command, None).await.is_none());
    }
}
