//! Posting a message to a configured endpoint.
//!
//! Invariants:
//! - One `POST` of exactly the given bytes with the given content type, and
//!   the endpoint's token as `Authorization: Bearer` when one is configured
//!   (read from its file at the moment of the call).
//! - Any 2xx is success; 401 and 403 are a refused credential; anything
//!   else is an error with the status, retryable only for 429 and 503.

use std::time::Duration;

use crate::config::{NotifyConfig, DEFAULT_HTTP_TIMEOUT_SECS};
use crate::error::{excerpt, ExecError};
use crate::forge::{status_retryable, transport_error};
use crate::http::{HttpPost, HttpRequest, UreqPost};
use crate::secret::Secret;

/// A message that was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyOutcome {
    /// The endpoint's 2xx status.
    pub status: u16,
}

/// Posts `body` to the endpoint, with the real HTTP client.
pub fn notify(
    endpoint: &NotifyConfig,
    body: &[u8],
    content_type: &str,
) -> Result<NotifyOutcome, ExecError> {
    notify_with(&UreqPost, endpoint, body, content_type)
}

/// As [`notify`], through the given HTTP client.
pub fn notify_with(
    http: &dyn HttpPost,
    endpoint: &NotifyConfig,
    body: &[u8],
    content_type: &str,
) -> Result<NotifyOutcome, ExecError> {
    let action = format!("posting a message to {}", endpoint.url);
    if content_type.is_empty() || content_type.chars().any(char::is_control) {
        return Err(ExecError::InvalidRequest {
            action,
            why: "the content type is empty or not one line".into(),
        });
    }
    let token = match &endpoint.token_file {
        Some(path) => Some(
            Secret::read_file(path).map_err(|source| ExecError::Credential {
                destination: format!("endpoint {}", endpoint.url),
                path: path.clone(),
                source,
            })?,
        ),
        None => None,
    };
    let secs = endpoint.timeout_secs.unwrap_or(DEFAULT_HTTP_TIMEOUT_SECS);
    let request = HttpRequest {
        url: &endpoint.url,
        content_type,
        accept: None,
        bearer: token.as_ref(),
        body,
        timeout: Duration::from_secs(secs),
    };
    let response = http
        .post(&request)
        .map_err(|e| transport_error(action.clone(), secs, e))?;
    match response.status {
        200..=299 => Ok(NotifyOutcome {
            status: response.status,
        }),
        401 | 403 => Err(ExecError::Auth { action }),
        status => Err(ExecError::Status {
            action,
            status,
            excerpt: excerpt(&response.body, token.as_ref().map(Secret::expose)),
            retryable: status_retryable(status),
        }),
    }
}
