//! The HTTP boundary of the forge and notify executors: one narrow trait,
//! [`HttpPost`] (a POST, and the GET a forge needs to look a pull request
//! up), with the real client ([`UreqPost`]) here and hand-written fakes in
//! the tests.
//!
//! Invariants:
//! - Every call has a time limit (the request's `timeout`), follows no
//!   redirect (a credential is never carried to a place the owner did not
//!   name) and ignores proxy variables of the environment
//!   (`tests::a_redirect_is_returned_not_followed_and_no_proxy_is_asked`).
//! - The bearer token travels as a [`Secret`] up to the moment the header is
//!   written; a request's `Debug` shows `***` for it.
//! - A transport error says whether the request certainly never left
//!   ([`TransportError::NotSent`]): only then is a new attempt safe
//!   (`tests::nothing_listening_is_not_sent`,
//!   `forge::tests::transport_failures_are_retryable_only_when_nothing_was_sent`).
//! - Responses are read up to [`MAX_RESPONSE_BYTES`]; more is an error.
//! - TLS is rustls (ring) with the system's roots plus the request's
//!   `ca_file` ([`crate::tls`]); a server that is not trusted is
//!   [`TransportError::Tls`]: the request never left
//!   (`tests/destinations.rs::https_to_a_server_of_another_ca_or_with_an_expired_certificate_is_refused`).

use std::path::Path;
use std::time::Duration;

use crate::secret::Secret;

/// Largest response body read.
pub const MAX_RESPONSE_BYTES: u64 = 1024 * 1024;

/// One request to make (a GET sends no body and no `Content-Type`).
#[derive(Debug, Clone, Copy)]
pub struct HttpRequest<'a> {
    /// Where to.
    pub url: &'a str,
    /// `Content-Type` of the body.
    pub content_type: &'a str,
    /// `Accept`, if any.
    pub accept: Option<&'a str>,
    /// Sent as `Authorization: Bearer <token>`.
    pub bearer: Option<&'a Secret>,
    /// The body, sent as is.
    pub body: &'a [u8],
    /// Time limit of the whole exchange.
    pub timeout: Duration,
    /// Certificate authorities trusted besides the system's.
    pub ca_file: Option<&'a Path>,
    /// More headers (a signature): names and values the caller made.
    pub headers: &'a [(&'a str, &'a str)],
}

impl<'a> HttpRequest<'a> {
    /// A request with no accept, token, CA file or extra header.
    pub fn new(url: &'a str, content_type: &'a str, body: &'a [u8], timeout: Duration) -> Self {
        HttpRequest {
            url,
            content_type,
            accept: None,
            bearer: None,
            body,
            timeout,
            ca_file: None,
            headers: &[],
        }
    }
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The body, at most [`MAX_RESPONSE_BYTES`].
    pub body: Vec<u8>,
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The request certainly never reached the destination (no connection).
    #[error("no connection was made")]
    NotSent(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The server's certificate was not trusted (or the trust store could
    /// not be made): nothing was sent.
    #[error("TLS: {0}")]
    Tls(String),
    /// The time limit passed; the request may have been acted on.
    #[error("timed out")]
    TimedOut,
    /// Anything else; the request may have been acted on.
    #[error("the exchange failed")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Makes one HTTP request.
pub trait HttpPost {
    /// POSTs `request` and returns the response whatever its status.
    fn post(&self, request: &HttpRequest<'_>) -> Result<HttpResponse, TransportError>;
    /// GETs `request.url` (its body and content type are not sent) and
    /// returns the response whatever its status.
    fn get(&self, request: &HttpRequest<'_>) -> Result<HttpResponse, TransportError>;
}

/// The real client: `ureq` over rustls.
#[derive(Debug, Clone, Copy, Default)]
pub struct UreqPost;

impl UreqPost {
    fn agent(request: &HttpRequest<'_>) -> Result<ureq::Agent, TransportError> {
        let tls = crate::tls::ureq_tls(request.ca_file)
            .map_err(|e| TransportError::Tls(e.to_string()))?;
        Ok(ureq::Agent::config_builder()
            .timeout_global(Some(request.timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .tls_config(tls)
            .build()
            .into())
    }
}

fn read_response(
    mut response: ureq::http::Response<ureq::Body>,
) -> Result<HttpResponse, TransportError> {
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_RESPONSE_BYTES)
        .read_to_vec()
        .map_err(classify)?;
    Ok(HttpResponse { status, body })
}

impl HttpPost for UreqPost {
    fn post(&self, request: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
        let mut builder = Self::agent(request)?
            .post(request.url)
            .header("Content-Type", request.content_type)
            .header("User-Agent", "nightshift");
        for (name, value) in request.headers {
            builder = builder.header(*name, *value);
        }
        if let Some(accept) = request.accept {
            builder = builder.header("Accept", accept);
        }
        if let Some(token) = request.bearer {
            builder = builder.header("Authorization", format!("Bearer {}", token.expose()));
        }
        read_response(builder.send(request.body).map_err(classify)?)
    }

    fn get(&self, request: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
        let mut builder = Self::agent(request)?
            .get(request.url)
            .header("User-Agent", "nightshift");
        if let Some(accept) = request.accept {
            builder = builder.header("Accept", accept);
        }
        if let Some(token) = request.bearer {
            builder = builder.header("Authorization", format!("Bearer {}", token.expose()));
        }
        read_response(builder.call().map_err(classify)?)
    }
}

/// The rustls error behind a ureq error, if the handshake failed.
fn tls_failure(e: &ureq::Error) -> Option<String> {
    match e {
        ureq::Error::Rustls(r) => Some(r.to_string()),
        ureq::Error::Tls(why) => Some(why.to_string()),
        ureq::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(|r| r.to_string()),
        _ => None,
    }
}

fn classify(e: ureq::Error) -> TransportError {
    use std::io::ErrorKind;
    use ureq::Timeout;
    if let Some(why) = tls_failure(&e) {
        return TransportError::Tls(why);
    }
    match e {
        ureq::Error::Timeout(Timeout::Resolve | Timeout::Connect) => {
            TransportError::NotSent(Box::new(e))
        }
        ureq::Error::Timeout(_) => TransportError::TimedOut,
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed | ureq::Error::BadUri(_) => {
            TransportError::NotSent(Box::new(e))
        }
        ureq::Error::Io(ref io)
            if matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::AddrNotAvailable
                    | ErrorKind::NetworkUnreachable
                    | ErrorKind::HostUnreachable
            ) =>
        {
            TransportError::NotSent(Box::new(e))
        }
        other => TransportError::Failed(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_prints_no_token() {
        let token = Secret::new("tok-abc").unwrap();
        let r = HttpRequest {
            bearer: Some(&token),
            ..HttpRequest::new("http://h/x", "text/plain", b"", Duration::from_secs(1))
        };
        let shown = format!("{r:?}");
        assert!(!shown.contains("tok-abc"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }

    #[test]
    fn nothing_listening_is_not_sent() {
        // A port that was just free: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/x");
        let r = HttpRequest::new(&url, "text/plain", b"hi", Duration::from_secs(5));
        let err = UreqPost.post(&r).unwrap_err();
        assert!(matches!(err, TransportError::NotSent(_)), "{err:?}");
    }

    #[test]
    fn a_redirect_is_returned_not_followed_and_no_proxy_is_asked() {
        use std::io::{Read, Write};
        // Where a redirect would take the request: it must see nothing.
        let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        elsewhere.set_nonblocking(true).unwrap();
        let target = format!("http://{}/stolen", elsewhere.local_addr().unwrap());
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/x", server.local_addr().unwrap());
        let answer = std::thread::spawn(move || {
            let (mut conn, _) = server.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).unwrap();
            let reply = format!(
                "HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            conn.write_all(reply.as_bytes()).unwrap();
        });
        let token = Secret::new("tok-abc").unwrap();
        let r = HttpRequest {
            bearer: Some(&token),
            ..HttpRequest::new(&url, "text/plain", b"hi", Duration::from_secs(5))
        };
        let response = UreqPost.post(&r).unwrap();
        answer.join().unwrap();
        assert_eq!(response.status, 302);
        assert!(elsewhere.accept().is_err(), "the redirect was followed");
        // The agent itself: a time limit, no redirect, no proxy from the environment.
        let agent = UreqPost::agent(&r).unwrap();
        assert_eq!(agent.config().max_redirects(), 0);
        assert!(agent.config().proxy().is_none());
        assert_eq!(agent.config().timeouts().global, Some(r.timeout));
    }
}
