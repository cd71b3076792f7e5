//! Opening a pull request through a forge's GitHub-shaped REST API.
//!
//! Invariants:
//! - One `POST {api}/repos/{owner}/{name}/pulls` per call, with the token as
//!   `Authorization: Bearer`, read from its file at the moment of the call;
//!   the JSON body holds exactly `title`, `head`, `base`, `body`.
//! - The head commit is not sent (the API has no such field): the caller
//!   must have verified, under its lock, that the remote head branch holds
//!   the approved commit (the push executor's lease does that). When the
//!   forge's answer names the head commit and it is another one, the call
//!   fails (not retryable) naming the pull request, so a person can close it.
//! - A 201 is the only success; nothing is retried after the request may
//!   have left (see [`crate::ExecError::retryable`]).

use std::time::Duration;

use serde::Deserialize;

use crate::config::{ForgeConfig, DEFAULT_HTTP_TIMEOUT_SECS};
use crate::error::{excerpt, ExecError};
use crate::http::{HttpPost, HttpRequest, TransportError, UreqPost};
use crate::push::check_oid;
use crate::secret::Secret;

/// A pull request that was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrOutcome {
    /// Its number on the forge.
    pub number: u64,
    /// Its page.
    pub url: String,
}

/// Opens a pull request from `head_ref` into `base_ref` (branch names, with
/// or without `refs/heads/`), with the real HTTP client.
pub fn open_pull_request(
    forge: &ForgeConfig,
    head_ref: &str,
    base_ref: &str,
    head_commit: &str,
    title: &str,
    body: &str,
) -> Result<PrOutcome, ExecError> {
    open_pull_request_with(
        &UreqPost,
        forge,
        head_ref,
        base_ref,
        head_commit,
        title,
        body,
    )
}

/// As [`open_pull_request`], through the given HTTP client.
pub fn open_pull_request_with(
    http: &dyn HttpPost,
    forge: &ForgeConfig,
    head_ref: &str,
    base_ref: &str,
    head_commit: &str,
    title: &str,
    body: &str,
) -> Result<PrOutcome, ExecError> {
    let action = format!("opening a pull request on {}", forge.repo);
    let invalid = |why: String| ExecError::InvalidRequest {
        action: action.clone(),
        why,
    };
    let head = branch_name(head_ref).map_err(|why| invalid(format!("head {head_ref:?}: {why}")))?;
    let base = branch_name(base_ref).map_err(|why| invalid(format!("base {base_ref:?}: {why}")))?;
    check_oid(head_commit).map_err(|why| invalid(format!("head commit: {why}")))?;
    if title.trim().is_empty() {
        return Err(invalid("the title is empty".into()));
    }
    let token = Secret::read_file(&forge.token_file).map_err(|source| ExecError::Credential {
        destination: format!("forge {}", forge.repo),
        path: forge.token_file.clone(),
        source,
    })?;
    let url = format!(
        "{}/repos/{}/pulls",
        forge.api.trim_end_matches('/'),
        forge.repo
    );
    let payload = serde_json::json!({
        "title": title,
        "head": head,
        "base": base,
        "body": body,
    });
    let payload = serde_json::to_vec(&payload).map_err(|e| invalid(format!("encoding: {e}")))?;
    let secs = forge.timeout_secs.unwrap_or(DEFAULT_HTTP_TIMEOUT_SECS);
    let request = HttpRequest {
        url: &url,
        content_type: "application/json",
        accept: Some("application/vnd.github+json"),
        bearer: Some(&token),
        body: &payload,
        timeout: Duration::from_secs(secs),
    };
    let response = http
        .post(&request)
        .map_err(|e| transport_error(action.clone(), secs, e))?;
    match response.status {
        201 => {}
        401 | 403 => return Err(ExecError::Auth { action }),
        status => {
            return Err(ExecError::Status {
                action,
                status,
                excerpt: excerpt(&response.body, Some(token.expose())),
                retryable: status_retryable(status),
            })
        }
    }
    let created: Created =
        serde_json::from_slice(&response.body).map_err(|e| ExecError::Protocol {
            action: action.clone(),
            why: format!("the 201 answer is not a pull request: {e}"),
        })?;
    if let Some(sha) = created.head.and_then(|h| h.sha) {
        if !sha.eq_ignore_ascii_case(head_commit) {
            return Err(ExecError::Protocol {
                action,
                why: format!(
                    "pull request #{} ({}) was opened at head {sha}, not the approved {head_commit}",
                    created.number, created.html_url
                ),
            });
        }
    }
    Ok(PrOutcome {
        number: created.number,
        url: created.html_url,
    })
}

#[derive(Deserialize)]
struct Created {
    number: u64,
    html_url: String,
    #[serde(default)]
    head: Option<CreatedHead>,
}

#[derive(Deserialize)]
struct CreatedHead {
    #[serde(default)]
    sha: Option<String>,
}

/// The branch name the API wants: `refs/heads/x` and `x` both give `x`.
fn branch_name(r: &str) -> Result<&str, &'static str> {
    let name = r.strip_prefix("refs/heads/").unwrap_or(r);
    if name.is_empty() || name.starts_with("refs/") {
        return Err("not a branch");
    }
    if !git2::Reference::is_valid_name(&format!("refs/heads/{name}")) {
        return Err("not a valid branch name");
    }
    Ok(name)
}

/// Only statuses by which the server says it did not act: too many
/// requests, unavailable.
pub(crate) fn status_retryable(status: u16) -> bool {
    matches!(status, 429 | 503)
}

pub(crate) fn transport_error(action: String, secs: u64, e: TransportError) -> ExecError {
    match e {
        TransportError::NotSent(source) => ExecError::Unreachable {
            action,
            retryable: true,
            source,
        },
        TransportError::TimedOut => ExecError::TimedOut { action, secs },
        TransportError::Failed(source) => ExecError::Unreachable {
            action,
            retryable: false,
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::config::Readers;
    use crate::http::HttpResponse;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    /// One request the fake saw: url, bearer token, body.
    type Seen = (String, Option<String>, Vec<u8>);

    /// Records what it was asked and answers what it was told.
    struct Fake {
        answer: RefCell<Option<Result<HttpResponse, TransportError>>>,
        seen: RefCell<Vec<Seen>>,
    }

    impl Fake {
        fn answering(status: u16, body: &str) -> Fake {
            Fake {
                answer: RefCell::new(Some(Ok(HttpResponse {
                    status,
                    body: body.as_bytes().to_vec(),
                }))),
                seen: RefCell::new(Vec::new()),
            }
        }
    }

    impl HttpPost for Fake {
        fn post(&self, r: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
            self.seen.borrow_mut().push((
                r.url.to_string(),
                r.bearer.map(|s| s.expose().to_string()),
                r.body.to_vec(),
            ));
            self.answer
                .borrow_mut()
                .take()
                .unwrap_or(Err(TransportError::TimedOut))
        }
    }

    fn forge(dir: &tempfile::TempDir) -> ForgeConfig {
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "tok-SECRET\n").unwrap();
        ForgeConfig {
            api: "http://forge.test/".into(),
            repo: "own/repo".into(),
            token_file,
            readers: Readers::Public,
            timeout_secs: None,
        }
    }

    fn open(fake: &Fake, f: &ForgeConfig) -> Result<PrOutcome, ExecError> {
        open_pull_request_with(fake, f, "refs/heads/agent/x", "main", COMMIT, "T", "B")
    }

    #[test]
    fn sends_the_github_shape_and_reads_the_number() {
        let dir = tempfile::tempdir().unwrap();
        let f = forge(&dir);
        let fake = Fake::answering(
            201,
            r#"{"number": 7, "html_url": "http://forge.test/pr/7"}"#,
        );
        let out = open(&fake, &f).unwrap();
        assert_eq!(out.number, 7);
        assert_eq!(out.url, "http://forge.test/pr/7");
        let seen = fake.seen.borrow();
        assert_eq!(seen[0].0, "http://forge.test/repos/own/repo/pulls");
        assert_eq!(seen[0].1.as_deref(), Some("tok-SECRET"));
        let sent: serde_json::Value = serde_json::from_slice(&seen[0].2).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({"title": "T", "head": "agent/x", "base": "main", "body": "B"})
        );
    }

    #[test]
    fn a_head_other_than_approved_is_an_error_naming_the_pull_request() {
        let dir = tempfile::tempdir().unwrap();
        let f = forge(&dir);
        let answer = r#"{"number": 9, "html_url": "u9", "head": {"sha": "ffffffffffffffffffffffffffffffffffffffff"}}"#;
        let err = open(&Fake::answering(201, answer), &f).unwrap_err();
        assert!(matches!(err, ExecError::Protocol { .. }), "{err}");
        assert!(err.to_string().contains("#9"), "{err}");
        assert!(!err.retryable());
        let same = format!(r#"{{"number": 9, "html_url": "u9", "head": {{"sha": "{COMMIT}"}}}}"#);
        assert_eq!(open(&Fake::answering(201, &same), &f).unwrap().number, 9);
    }

    #[test]
    fn statuses_are_classified_and_never_echo_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let f = forge(&dir);
        let echo = "bad request, you sent Bearer tok-SECRET";
        let cases = [
            (401, false, "auth_refused"),
            (422, false, "http_status"),
            (500, false, "http_status"),
            (503, true, "http_status"),
        ];
        for (status, retryable, class) in cases {
            let err = open(&Fake::answering(status, echo), &f).unwrap_err();
            assert_eq!(err.class(), class, "{status}");
            assert_eq!(err.retryable(), retryable, "{status}");
            for text in [err.to_string(), format!("{err:?}"), err.audit_reason()] {
                assert!(!text.contains("tok-SECRET"), "{status}: {text}");
            }
        }
        let err = open(&Fake::answering(422, "Validation Failed"), &f).unwrap_err();
        assert!(err.to_string().contains("422") && err.to_string().contains("Validation Failed"));
    }

    #[test]
    fn transport_failures_are_retryable_only_when_nothing_was_sent() {
        let dir = tempfile::tempdir().unwrap();
        let f = forge(&dir);
        let with = |e: TransportError| Fake {
            answer: RefCell::new(Some(Err(e))),
            seen: RefCell::new(Vec::new()),
        };
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(open(&with(TransportError::NotSent(Box::new(refused))), &f)
            .unwrap_err()
            .retryable());
        assert!(!open(&with(TransportError::TimedOut), &f)
            .unwrap_err()
            .retryable());
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!open(&with(TransportError::Failed(Box::new(reset))), &f)
            .unwrap_err()
            .retryable());
    }

    #[test]
    fn bad_requests_and_missing_tokens_send_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let f = forge(&dir);
        let fake = Fake::answering(201, "{}");
        for (head, base, commit) in [
            ("", "main", COMMIT),
            ("a", "refs/tags/v1", COMMIT),
            ("a..b", "main", COMMIT),
            ("a", "main", "abc"),
        ] {
            let err = open_pull_request_with(&fake, &f, head, base, commit, "T", "B").unwrap_err();
            assert_eq!(err.class(), "invalid_request", "{head} {base} {commit}");
        }
        let mut gone = f.clone();
        gone.token_file = dir.path().join("missing");
        assert_eq!(
            open(&fake, &gone).unwrap_err().class(),
            "credential_unreadable"
        );
        assert!(fake.seen.borrow().is_empty());
    }
}
