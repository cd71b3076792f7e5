//! Posting a message to a configured endpoint, in one of three shapes
//! ([`NotifyKind`]):
//!
//! - `plain`: one `POST` of exactly the given bytes with the given content
//!   type;
//! - `webhook`: a JSON object `{"source": "nightshift", "event", "sent_at",
//!   "text", "data"}`, signed: `X-Nightshift-Signature: sha256=<hex of
//!   HMAC-SHA256(key, body)>`, the key read from `secret_file`, so that the
//!   receiver can check the post came from this supervisor (`sent_at`, in
//!   the signed body, lets it refuse replays); and signed again per
//!   Standard Webhooks (<https://www.standardwebhooks.com>):
//!   `webhook-id` (the act's id, or for a message without one a digest of
//!   its content, so a retry carries the same id), `webhook-timestamp`
//!   (unix seconds) and `webhook-signature: v1,<base64 of
//!   HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, the key being the
//!   base64 after `whsec_` when the secret file holds such a secret, else
//!   the file's text as the first header uses it
//!   ([`standard_key`], `tests::standard_webhooks_signature_matches_the_published_vector`);
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

/// The Standard Webhooks headers: the message's id, its unix time in
/// seconds, and its `v1,` signatures.
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const WEBHOOK_SIGNATURE_HEADER: &str = "webhook-signature";

/// A message that was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyOutcome {
    /// The endpoint's 2xx status.
    pub status: u16,
}

/// What to post: the event's name (`message`, `summary`), its text, and
/// structured data a `webhook` carries beside the text. `id` names the
/// message for a receiver's de-duplication (`webhook-id`): the act's id;
/// without one, a digest of event, text and data.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub id: Option<&'a str>,
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

/// The Standard Webhooks key for a secret file's text: the bytes the
/// base64 after `whsec_` encodes when the text starts so (the form
/// Standard Webhooks libraries take), else the text's own bytes (which a
/// receiver's library takes as `whsec_` + base64 of the text). `None`: the
/// text starts with `whsec_` but the rest is not base64.
pub fn standard_key(secret: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    match secret.strip_prefix("whsec_") {
        Some(b64) => base64::engine::general_purpose::STANDARD.decode(b64).ok(),
        None => Some(secret.as_bytes().to_vec()),
    }
}

/// `v1,<base64>` of HMAC-SHA256 over `"{id}.{timestamp}.{body}"` with
/// `key`: the Standard Webhooks signature.
pub fn standard_signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    use base64::Engine as _;
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| {
        <Hmac<Sha256> as Mac>::new_from_slice(&[]).expect("an empty HMAC key is accepted")
    });
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// The id of a message that has none of its own: `msg_` and the first 32
/// hex digits of SHA-256 over event, text and data, so that sending the
/// same message again carries the same id.
fn content_id(message: &Message<'_>) -> String {
    use sha2::Digest as _;
    let mut h = Sha256::new();
    for part in [
        message.event.as_bytes(),
        message.text.as_bytes(),
        message
            .data
            .map(|d| d.to_string())
            .unwrap_or_default()
            .as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    format!("msg_{}", &hex::encode(h.finalize())[..32])
}

/// Posts an act's `body` to the endpoint, with the real HTTP client; `id`
/// (the act's) becomes a webhook's `webhook-id`.
pub fn notify(
    endpoint: &NotifyConfig,
    id: &str,
    body: &[u8],
    content_type: &str,
) -> Result<NotifyOutcome, ExecError> {
    notify_with(&UreqPost, endpoint, id, body, content_type)
}

/// As [`notify`], through the given HTTP client. A `plain` endpoint gets
/// the bytes as they are; the others get them as the text of a `message`.
pub fn notify_with(
    http: &dyn HttpPost,
    endpoint: &NotifyConfig,
    id: &str,
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
        NotifyKind::Plain => post(http, endpoint, None, body, content_type),
        NotifyKind::Webhook | NotifyKind::Slack => {
            let text = std::str::from_utf8(body).map_err(|_| ExecError::InvalidRequest {
                action: action(endpoint),
                why: "the message is not UTF-8 text".into(),
            })?;
            send_with(
                http,
                endpoint,
                &Message {
                    id: Some(id),
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
                None,
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
    let id = message
        .id
        .map(str::to_string)
        .unwrap_or_else(|| content_id(message));
    post(http, endpoint, Some(&id), &body, "application/json")
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
    id: Option<&str>,
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
        (NotifyKind::Webhook, Some(path)) => {
            let secret = credential(endpoint, path)?;
            let key = standard_key(secret.expose()).ok_or_else(|| ExecError::InvalidRequest {
                action: action.clone(),
                why: format!(
                    "{} starts with whsec_ but the rest is not base64",
                    path.display()
                ),
            })?;
            let id = id.unwrap_or_default().to_string();
            let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
            let standard = standard_signature(&key, &id, timestamp, body);
            Some([
                signature(secret.expose().as_bytes(), body),
                id,
                timestamp.to_string(),
                standard,
            ])
        }
        (NotifyKind::Webhook, None) => {
            return Err(ExecError::InvalidRequest {
                action,
                why: "a webhook needs secret_file".into(),
            })
        }
        _ => None,
    };
    let headers: Vec<(&str, &str)> = signed
        .as_ref()
        .map(|[legacy, id, timestamp, standard]| {
            vec![
                (SIGNATURE_HEADER, legacy.as_str()),
                (WEBHOOK_ID_HEADER, id.as_str()),
                (WEBHOOK_TIMESTAMP_HEADER, timestamp.as_str()),
                (WEBHOOK_SIGNATURE_HEADER, standard.as_str()),
            ]
        })
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
        notify_with(&rec, &hook, "act-7", "hello".as_bytes(), "text/plain").unwrap();
        let seen = rec.seen.borrow();
        let (url, headers, body, ct) = &seen[0];
        assert_eq!(url, "https://hooks.test/x");
        assert_eq!(ct, "application/json");
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["source"], "nightshift");
        assert_eq!(v["event"], "message");
        assert_eq!(v["text"], "hello");
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                SIGNATURE_HEADER,
                WEBHOOK_ID_HEADER,
                WEBHOOK_TIMESTAMP_HEADER,
                WEBHOOK_SIGNATURE_HEADER
            ]
        );
        assert_eq!(headers[0].1, signature(b"k3y", body));
        assert_eq!(headers[1].1, "act-7");
        let timestamp: i64 = headers[2].1.parse().unwrap();
        assert_eq!(
            headers[3].1,
            standard_signature(b"k3y", "act-7", timestamp, body)
        );
        // A known vector (RFC 4231, test case 2).
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(notify_with(&rec, &hook, "act-8", b"\xff", "text/plain").is_err());
    }

    #[test]
    fn standard_webhooks_signature_matches_the_published_vector() {
        // The Standard Webhooks libraries' own test vector (also what
        // python3's hmac module gives: base64(hmac.new(b64decode(key),
        // b"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330." + payload,
        // "sha256").digest())).
        let key = standard_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            standard_signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        // A secret without the prefix is its own bytes; a bad one is refused
        // with the file named, never its text.
        assert_eq!(standard_key("k3y").unwrap(), b"k3y");
        assert_eq!(standard_key("whsec_not base64!"), None);
        let dir = tempfile::tempdir().unwrap();
        let mut hook = NotifyConfig::new("https://hooks.test/x", Readers::Private);
        hook.kind = NotifyKind::Webhook;
        hook.secret_file = Some(secret(&dir, "key", "whsec_not base64!"));
        let e = notify_with(&Recorder::default(), &hook, "a", b"hi", "text/plain").unwrap_err();
        assert!(e.to_string().contains("not base64"), "{e}");
        assert!(!e.to_string().contains("whsec_not"), "{e}");
    }

    #[test]
    fn a_message_without_an_id_keeps_one_id_across_sends() {
        let dir = tempfile::tempdir().unwrap();
        let mut hook = NotifyConfig::new("https://hooks.test/x", Readers::Private);
        hook.kind = NotifyKind::Webhook;
        hook.secret_file = Some(secret(&dir, "key", "k3y"));
        let rec = Recorder::default();
        let message = |text| Message {
            id: None,
            event: "summary",
            text,
            data: None,
        };
        for text in ["3 runs", "3 runs", "4 runs"] {
            send_with(&rec, &hook, &message(text)).unwrap();
        }
        let ids: Vec<String> = rec.seen.borrow().iter().map(|s| s.1[1].1.clone()).collect();
        assert_eq!(ids[0], ids[1], "a retry carries the same id");
        assert_ne!(ids[0], ids[2], "another message has another id");
        assert!(ids[0].starts_with("msg_"), "{ids:?}");
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
                id: None,
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
        let post = |status| notify_with(&Answers(status), &endpoint, "a", b"hi", "text/plain");
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
