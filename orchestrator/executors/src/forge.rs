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
//! - A 201 is the only success of a creation; nothing is retried after the
//!   request may have left (see [`crate::ExecError::retryable`]). A 422 that
//!   says a pull request already exists for the head is answered by looking
//!   it up: one open for the same head, base and approved commit is adopted
//!   (success), any other is an error saying so.
//! - [`find_pull_request`] finds an open pull request for a head, base and
//!   commit (one `GET .../pulls?head=OWNER:BRANCH&base=BASE&state=open`), so
//!   that after a crash an existing one is adopted instead of duplicated.

use std::time::Duration;

use serde::Deserialize;

use crate::config::{ForgeConfig, DEFAULT_HTTP_TIMEOUT_SECS};
use crate::error::{excerpt, ExecError};
use crate::http::{HttpPost, HttpRequest, TransportError, UreqPost};
use crate::push::check_oid;
use crate::secret::Secret;

/// A pull request that was opened (or found open, when `adopted`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrOutcome {
    /// Its number on the forge.
    pub number: u64,
    /// Its page.
    pub url: String,
    /// It existed already (after a crash, or opened by someone else) at the
    /// approved head commit, and was taken as this act's outcome.
    pub adopted: bool,
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
        422 if String::from_utf8_lossy(&response.body).contains("already exists") => {
            // Opened before (by an attempt whose answer was lost, or by a
            // person): adopt it only if it is exactly what was approved.
            return match find_with(http, forge, &token, head, base, head_commit)? {
                Some(found) => Ok(found),
                None => Err(ExecError::Status {
                    action,
                    status: 422,
                    excerpt: "a pull request for this head already exists, but not open at the approved commit into the approved base".into(),
                    retryable: false,
                }),
            };
        }
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
        adopted: false,
    })
}

/// The open pull request from `head_ref` into `base_ref` at `head_commit`,
/// if the forge has one, with the real HTTP client.
pub fn find_pull_request(
    forge: &ForgeConfig,
    head_ref: &str,
    base_ref: &str,
    head_commit: &str,
) -> Result<Option<PrOutcome>, ExecError> {
    find_pull_request_with(&UreqPost, forge, head_ref, base_ref, head_commit)
}

/// As [`find_pull_request`], through the given HTTP client.
pub fn find_pull_request_with(
    http: &dyn HttpPost,
    forge: &ForgeConfig,
    head_ref: &str,
    base_ref: &str,
    head_commit: &str,
) -> Result<Option<PrOutcome>, ExecError> {
    let action = format!("looking up pull requests on {}", forge.repo);
    let invalid = |why: String| ExecError::InvalidRequest {
        action: action.clone(),
        why,
    };
    let head = branch_name(head_ref).map_err(|why| invalid(format!("head {head_ref:?}: {why}")))?;
    let base = branch_name(base_ref).map_err(|why| invalid(format!("base {base_ref:?}: {why}")))?;
    check_oid(head_commit).map_err(|why| invalid(format!("head commit: {why}")))?;
    let token = Secret::read_file(&forge.token_file).map_err(|source| ExecError::Credential {
        destination: format!("forge {}", forge.repo),
        path: forge.token_file.clone(),
        source,
    })?;
    find_with(http, forge, &token, head, base, head_commit)
}

fn find_with(
    http: &dyn HttpPost,
    forge: &ForgeConfig,
    token: &Secret,
    head: &str,
    base: &str,
    head_commit: &str,
) -> Result<Option<PrOutcome>, ExecError> {
    let action = format!("looking up pull requests on {}", forge.repo);
    let owner = forge.repo.split('/').next().unwrap_or_default();
    // Branch names passed `branch_name` (valid ref names): only `/` and a
    // few punctuation marks need escaping in a query value.
    let url = format!(
        "{}/repos/{}/pulls?head={}&base={}&state=open",
        forge.api.trim_end_matches('/'),
        forge.repo,
        query_escape(&format!("{owner}:{head}")),
        query_escape(base),
    );
    let secs = forge.timeout_secs.unwrap_or(DEFAULT_HTTP_TIMEOUT_SECS);
    let request = HttpRequest {
        url: &url,
        content_type: "application/json",
        accept: Some("application/vnd.github+json"),
        bearer: Some(token),
        body: b"",
        timeout: Duration::from_secs(secs),
    };
    let response = http
        .get(&request)
        .map_err(|e| transport_error(action.clone(), secs, e))?;
    match response.status {
        200 => {}
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
    let listed: Vec<Listed> =
        serde_json::from_slice(&response.body).map_err(|e| ExecError::Protocol {
            action: action.clone(),
            why: format!("the answer is not a list of pull requests: {e}"),
        })?;
    Ok(listed
        .into_iter()
        .find(|pr| {
            pr.head.sha.eq_ignore_ascii_case(head_commit)
                && pr.head.r#ref == head
                && pr.base.as_ref().is_none_or(|b| b.r#ref == base)
        })
        .map(|pr| PrOutcome {
            number: pr.number,
            url: pr.html_url,
            adopted: true,
        }))
}

fn query_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Deserialize)]
struct Listed {
    number: u64,
    html_url: String,
    head: ListedRef,
    #[serde(default)]
    base: Option<ListedRef>,
}

#[derive(Deserialize)]
struct ListedRef {
    r#ref: String,
    #[serde(default)]
    sha: String,
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

    /// Records what it was asked and answers what it was told, in order.
    struct Fake {
        answers: RefCell<Vec<Result<HttpResponse, TransportError>>>,
        seen: RefCell<Vec<Seen>>,
    }

    impl Fake {
        fn answering(status: u16, body: &str) -> Fake {
            Fake::answers(&[(status, body)])
        }

        fn answers(list: &[(u16, &str)]) -> Fake {
            Fake {
                answers: RefCell::new(
                    list.iter()
                        .rev()
                        .map(|(status, body)| {
                            Ok(HttpResponse {
                                status: *status,
                                body: body.as_bytes().to_vec(),
                            })
                        })
                        .collect(),
                ),
                seen: RefCell::new(Vec::new()),
            }
        }

        fn answer(
            &self,
            method: &str,
            r: &HttpRequest<'_>,
        ) -> Result<HttpResponse, TransportError> {
            self.seen.borrow_mut().push((
                format!("{method} {}", r.url),
                r.bearer.map(|s| s.expose().to_string()),
                r.body.to_vec(),
            ));
            self.answers
                .borrow_mut()
                .pop()
                .unwrap_or(Err(TransportError::TimedOut))
        }
    }

    impl HttpPost for Fake {
        fn post(&self, r: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
            self.answer("POST", r)
        }
        fn get(&self, r: &HttpRequest<'_>) -> Result<HttpResponse, TransportError> {
            self.answer("GET", r)
        }
    }

    fn forge(dir: &tempfile::TempDir) -> ForgeConfig {
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "tok-SECRET\n").unwrap();
        ForgeConfig {
            api: "http://forge.test/".into(),
            repo: "own/repo".into(),
            remote: "origin".into(),
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
        assert_eq!(seen[0].0, "POST http://forge.test/repos/own/repo/pulls");
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
            answers: RefCell::new(vec![Err(e)]),
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

    #[test]
    fn already_exists_adopts_the_open_pull_request_at_the_approved_commit() {
        let dir = tempfile::tempdir().unwrap();
        let f = forge(&dir);
        let exists = r#"{"message": "Validation Failed", "errors": [{"message": "A pull request already exists for own:agent/x."}]}"#;
        let listed = format!(
            r#"[{{"number": 4, "html_url": "u4", "head": {{"ref": "agent/x", "sha": "{COMMIT}"}}, "base": {{"ref": "main", "sha": "x"}}}}]"#
        );
        let fake = Fake::answers(&[(422, exists), (200, &listed)]);
        let out = open(&fake, &f).unwrap();
        assert_eq!((out.number, out.adopted), (4, true));
        let seen = fake.seen.borrow();
        assert_eq!(
            seen[1].0,
            "GET http://forge.test/repos/own/repo/pulls?head=own%3Aagent%2Fx&base=main&state=open"
        );
        assert_eq!(seen[1].1.as_deref(), Some("tok-SECRET"));

        // One open at another commit is not adopted: the owner is told.
        let other = r#"[{"number": 5, "html_url": "u5", "head": {"ref": "agent/x", "sha": "ffffffffffffffffffffffffffffffffffffffff"}}]"#;
        let err = open(&Fake::answers(&[(422, exists), (200, other)]), &f).unwrap_err();
        assert!(err.to_string().contains("already exists"), "{err}");
        assert!(!err.retryable());
    }

    #[test]
    fn find_returns_only_a_pull_request_at_the_approved_head() {
        let dir = tempfile::tempdir().unwrap();
        let f = forge(&dir);
        let find = |body: &str| {
            find_pull_request_with(&Fake::answering(200, body), &f, "agent/x", "main", COMMIT)
        };
        assert_eq!(find("[]").unwrap(), None);
        let at = format!(
            r#"[{{"number": 2, "html_url": "u2", "head": {{"ref": "agent/x", "sha": "{COMMIT}"}}}}]"#
        );
        assert_eq!(find(&at).unwrap().map(|p| p.number), Some(2));
        let other_base = format!(
            r#"[{{"number": 2, "html_url": "u2", "head": {{"ref": "agent/x", "sha": "{COMMIT}"}}, "base": {{"ref": "dev"}}}}]"#
        );
        assert_eq!(find(&other_base).unwrap(), None);
        assert_eq!(find("not json").unwrap_err().class(), "protocol");
    }
}
