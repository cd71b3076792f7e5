//! Posting a message to a configured endpoint, in one of three shapes
//! ([`NotifyKind`]):
//!
//! - `plain`: one `POST` of exactly the given bytes with the given content
//!   type;
//! - `webhook`: a JSON object `{"source": "nightshift", "event", "sent_at",
//!   "text", "data"}`, signed: `X-Nightshift-Signature: sha256=<hex of
//!   HMAC-SHA256(key, body)>`, the key read from `secret_file`, so that the
//!   receiver can check the post came from this supervisor (`sent_at`, in
//!   the signed body, lets it refuse replays);
//! - `slack`: a Slack-compatible incoming webhook, `{"text": ...}`.
//!
//! Invariants:
//! - Every credential (token, HMAC key, a URL kept in `url_file`) is read
//!   from its file at the moment of the call and never appears in an error:
//!   an endpoint whose URL is a secret is named by the file that holds it
//!   (`tests::a_slack_url_kept_in_a_file_is_used_and_never_shown`,
//!   `tests/destinations.rs::a_slack_compatible_hook_gets_text_and_its_url_stays_secret`).
//! - Any 2xx is success; 401 and 403 are a refused credential; anything
//!   else is an error with the status, retryable only for 429 and 503
//!   (`tests::any_2xx_succeeds_and_only_429_and_503_are_retried`).
//! - `webhook` and `slack` carry text: a body that is not UTF-8 is refused,
//!   never altered (`tests::a_webhook_is_json_signed_with_the_key_from_its_file`).

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::{
    check_url, warn_if_clear, NotifyConfig, NotifyKind, DEFAULT_HTTP_TIMEOUT_SECS,
};
use crate::error::{excerpt, ExecError};
use crate::forge::{status_retryable, transport_error};
use crate::http::{HttpPost, HttpRequest, UreqPost};
use crate::secret::Secret;

/// The header that carries a webhook's signature.
pub const SIGNATURE_HEADER: &str = "X-Nightshift-Signature";

/// A message that was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyOutcome {
    /// The endpoint's 2xx status.
    pub status: u16,
}

/// What to post: the event's name (`message`, `summary`), its text, and
/// structured data a `webhook` carries beside the text.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub event: &'a str,
    pub text: &'a str,
    pub data: Option<&'a serde_json::Value>,
}

/// `sha256=<hex>` of HMAC-SHA256 over `body` with `key`: what a receiver
/// computes to check a webhook.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| {
        <Hmac<Sha256> as Mac>::new_from_slice(&[]).expect("an empty HMAC key is accepted")
    });
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Posts an act's `body` to the endpoint, with the real HTTP client.
pub fn notify(
    endpoint: &NotifyConfig,
    body: &[u8],
    content_type: &str,
) -> Result<NotifyOutcome, ExecError> {
    notify_with(&UreqPost, endpoint, body, content_type)
}

/// As [`notify`], through the given HTTP client. A `plain` endpoint gets
/// the bytes as they are; the others get them as the text of a `message`.
pub fn notify_with(
    http: &dyn HttpPost,
    endpoint: &NotifyConfig,
    body: &[u8],
    content_type: &str,
) -> Result<NotifyOutcome, ExecError> {
    if content_type.is_empty() || content_type.chars().any(char::is_control) {
        return Err(ExecError::InvalidRequest {
            action: action(endpoint),
            why: "the content type is empty or not one line".into(),
        });
    }
    match endpoint.kind {
        NotifyKind::Plain => post(http, endpoint, body, content_type),
        NotifyKind::Webhook | NotifyKind::Slack => {
            let text = std::str::from_utf8(body).map_err(|_| ExecError::InvalidRequest {
                action: action(endpoint),
                why: "the message is not UTF-8 text".into(),
            })?;
            send_with(
                http,
                endpoint,
                &Message {
                    event: "message",
                    text,
                    data: None,
                },
            )
        }
    }
}

/// Posts a message in the endpoint's shape, with the real HTTP client.
pub fn send(endpoint: &NotifyConfig, message: &Message<'_>) -> Result<NotifyOutcome, ExecError> {
    send_with(&UreqPost, endpoint, message)
}

/// As [`send`], through the given HTTP client.
pub fn send_with(
    http: &dyn HttpPost,
    endpoint: &NotifyConfig,
    message: &Message<'_>,
) -> Result<NotifyOutcome, ExecError> {
    let body = match endpoint.kind {
        NotifyKind::Plain => {
            return post(
                http,
                endpoint,
                message.text.as_bytes(),
                "text/plain; charset=utf-8",
            )
        }
        NotifyKind::Slack => serde_json::json!({ "text": message.text }),
        NotifyKind::Webhook => {
            let sent_at = time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            let mut v = serde_json::json!({
                "source": "nightshift",
                "event": message.event,
                "sent_at": sent_at,
                "text": message.text,
            });
            if let Some(data) = message.data {
                v["data"] = data.clone();
            }
            v
        }
    };
    let body = serde_json::to_vec(&body).map_err(|e| ExecError::InvalidRequest {
        action: action(endpoint),
        why: format!("encoding: {e}"),
    })?;
    post(http, endpoint, &body, "application/json")
}

fn action(endpoint: &NotifyConfig) -> String {
    format!("posting a message to {}", endpoint.shown())
}

fn credential(endpoint: &NotifyConfig, path: &std::path::Path) -> Result<Secret, ExecError> {
    Secret::read_file(path).map_err(|source| ExecError::Credential {
        destination: format!("endpoint {}", endpoint.shown()),
        path: path.to_path_buf(),
        source,
    })
}

fn post(
    http: &dyn HttpPost,
    endpoint: &NotifyConfig,
    body: &[u8],
    content_type: &str,
) -> Result<NotifyOutcome, ExecError> {
    let action = action(endpoint);
    let url = match (&endpoint.url, &endpoint.url_file) {
        (Some(url), _) => Secret::new(url.clone()).map_err(|_| ExecError::InvalidRequest {
            action: action.clone(),
            why: "the url is not one line".into(),
        })?,
        (None, Some(file)) => {
            let url = credential(endpoint, file)?;
            check_url(url.expose()).map_err(|why| ExecError::InvalidRequest {
                action: action.clone(),
                why: format!("the url in {}: {why}", file.display()),
            })?;
            url
        }
        (None, None) => {
            return Err(ExecError::InvalidRequest {
                action,
                why: "the endpoint has no url".into(),
            })
        }
    };
    let token = match &endpoint.token_file {
        Some(path) => Some(credential(endpoint, path)?),
        None => None,
    };
    let signed = match (&endpoint.kind, &endpoint.secret_file) {
        (NotifyKind::Webhook, Some(path)) => Some(signature(
            credential(endpoint, path)?.expose().as_bytes(),
            body,
        )),
        (NotifyKind::Webhook, None) => {
            return Err(ExecError::InvalidRequest {
                action,
                why: "a webhook needs secret_file".into(),
            })
        }
        _ => None,
    };
    let headers: Vec<(&str, &str)> = signed
        .as_deref()
        .map(|s| vec![(SIGNATURE_HEADER, s)])
        .unwrap_or_default();
    if endpoint.insecure && (token.is_some() || signed.is_some()) {
        warn_if_clear(url.expose(), "notify");
    }
    let secs = endpoint.timeout_secs.unwrap_or(DEFAULT_HTTP_TIMEOUT_SECS);
    let request = HttpRequest {
        bearer: token.as_ref(),
        ca_file: endpoint.ca_file.as_deref(),
        headers: &headers,
        ..HttpRequest::new(url.expose(), content_type, body, Duration::from_secs(secs))
    };
    let response = http
        .post(&request)
        .map_err(|e| transport_error(action.clone(), secs, e))?;
    let scrub = |body: &[u8]| {
        let once = excerpt(body, token.as_ref().map(Secret::expose));
        if endpoint.url_file.is_some() {
            once.replace(url.expose(), "***")
        } else {
            once
        }
    };
    match response.status {
        200..=299 => Ok(NotifyOutcome {
            status: response.status,
        }),
        401 | 403 => Err(ExecError::Auth { action }),
        status => Err(ExecError::Status {
            action,
            status,
            excerpt: scrub(&response.body),
            retryable: status_retryable(status),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::config::Readers;
    use crate::http::{HttpResponse, TransportError};

    /// One post seen: url, headers, body, content type.
    type Seen = (String, Vec<(String, String)>, Vec<u8>, String);

    /// Records url, headers and body; answers 200.
    #[derive(Default)]
    struct Recorder {
        seen: RefCell<Vec<Seen>>,
    }

    impl HttpPost for Recorder {
        fn post(&self, r: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
            self.seen.borrow_mut().push((
                r.url.to_string(),
                r.headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
                r.body.to_vec(),
                r.content_type.to_string(),
            ));
            Ok(HttpResponse {
                status: 200,
                body: b"ok".to_vec(),
            })
        }
        fn get(&self, _: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
            unreachable!("notify never reads")
        }
    }

    fn secret(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{text}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    }

    #[test]
    fn a_webhook_is_json_signed_with_the_key_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut hook = NotifyConfig::new("https://hooks.test/x", Readers::Private);
        hook.kind = NotifyKind::Webhook;
        hook.secret_file = Some(secret(&dir, "key", "k3y"));
        let rec = Recorder::default();
        notify_with(&rec, &hook, "hello".as_bytes(), "text/plain").unwrap();
        let seen = rec.seen.borrow();
        let (url, headers, body, ct) = &seen[0];
        assert_eq!(url, "https://hooks.test/x");
        assert_eq!(ct, "application/json");
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["source"], "nightshift");
        assert_eq!(v["event"], "message");
        assert_eq!(v["text"], "hello");
        assert_eq!(
            headers,
            &vec![(SIGNATURE_HEADER.to_string(), signature(b"k3y", body))]
        );
        // A known vector (RFC 4231, test case 2).
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(notify_with(&rec, &hook, b"\xff", "text/plain").is_err());
    }

    #[test]
    fn a_slack_url_kept_in_a_file_is_used_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let url = "https://hooks.slack.test/services/T000/B000/XXSECRETXX";
        let mut chat = NotifyConfig::new("unused", Readers::Private);
        chat.kind = NotifyKind::Slack;
        chat.url = None;
        chat.url_file = Some(secret(&dir, "slack.url", url));
        let rec = Recorder::default();
        send_with(
            &rec,
            &chat,
            &Message {
                event: "summary",
                text: "3 runs",
                data: None,
            },
        )
        .unwrap();
        let seen = rec.seen.borrow();
        assert_eq!(seen[0].0, url);
        assert_eq!(seen[0].2, br#"{"text":"3 runs"}"#);
        assert!(!action(&chat).contains("XXSECRETXX"), "{}", action(&chat));
    }

    /// Answers every post with one status.
    struct Answers(u16);

    impl HttpPost for Answers {
        fn post(&self, _: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
            Ok(HttpResponse {
                status: self.0,
                body: b"no".to_vec(),
            })
        }
        fn get(&self, _: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
            unreachable!("notify never reads")
        }
    }

    #[test]
    fn any_2xx_succeeds_and_only_429_and_503_are_retried() {
        let endpoint = NotifyConfig::new("https://hooks.test/x", Readers::Private);
        let post = |status| notify_with(&Answers(status), &endpoint, b"hi", "text/plain");
        for status in [200, 201, 202, 204, 299] {
            assert_eq!(post(status).unwrap().status, status);
        }
        for status in [401, 403] {
            assert_eq!(
                post(status).unwrap_err().class(),
                "auth_refused",
                "{status}"
            );
        }
        for status in [300, 302, 400, 404, 408, 409, 422, 429, 500, 502, 503, 504] {
            let e = post(status).unwrap_err();
            assert!(matches!(e, ExecError::Status { .. }), "{status}: {e}");
            assert_eq!(e.retryable(), status == 429 || status == 503, "{status}");
        }
    }
}
