//! Opening a pull request (GitLab: a merge request) through a forge's REST
//! API: GitHub's, GitLab's or Gitea's (Forgejo speaks Gitea's).
//!
//! | kind   | open                                         | look up (open ones, for a head and base)                              |
//! |--------|----------------------------------------------|-----------------------------------------------------------------------|
//! | github | `POST /repos/{o}/{r}/pulls`                  | `GET /repos/{o}/{r}/pulls?head={o}:{head}&base={base}&state=open`      |
//! | gitlab | `POST /projects/{path}/merge_requests`       | `GET /projects/{path}/merge_requests?source_branch=..&target_branch=..&state=opened` |
//! | gitea  | `POST /repos/{o}/{r}/pulls`                  | `GET /repos/{o}/{r}/pulls?state=open&page=N&limit=50`, filtered here   |
//!
//! Invariants:
//! - One creation request per call, with the token as
//!   `Authorization: Bearer` (accepted by all three), read from its file at
//!   the moment of the call; the body holds exactly the title, the head and
//!   base branches and the description, in the forge's field names.
//! - The head commit is not sent (no API has such a field): the caller
//!   must have verified, under its lock, that the remote head branch holds
//!   the approved commit (the push executor's lease does that). When the
//!   forge's answer names the head commit and it is another one, the call
//!   fails (not retryable) naming the pull request, so a person can close it.
//! - A 201 is the only success of a creation; nothing is retried after the
//!   request may have left (see [`crate::ExecError::retryable`]). An answer
//!   saying one already exists for the head (GitHub 422, GitLab and Gitea
//!   409) is answered by looking it up: one open for the same head, base
//!   and approved commit is adopted (success), any other is an error saying
//!   so. Any other validation refusal (400, 409, 422) is
//!   [`ExecError::Invalid`], reported as the forge's refusal
//!   (`tests::statuses_are_classified_and_never_echo_the_token`,
//!   `tests::transport_failures_are_retryable_only_when_nothing_was_sent`,
//!   `tests::already_exists_adopts_the_open_pull_request_at_the_approved_commit`,
//!   `tests::find_returns_only_a_pull_request_at_the_approved_head`).
//! - [`find_pull_request`] finds an open pull request for a head, base and
//!   commit, so that after a crash an existing one is adopted instead of
//!   duplicated.

use std::time::Duration;

use serde::Deserialize;

use crate::config::{warn_if_clear, ForgeConfig, ForgeKind, DEFAULT_HTTP_TIMEOUT_SECS};
use crate::error::{excerpt, ExecError};
use crate::http::{HttpPost, HttpRequest, TransportError, UreqPost};
use crate::push::check_oid;
use crate::secret::Secret;

/// Pages of open pull requests read on Gitea when looking one up.
const GITEA_PAGES: u32 = 10;
const GITEA_PAGE_SIZE: usize = 50;

/// A pull request that was opened (or found open, when `adopted`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrOutcome {
    /// Its number on the forge (GitLab: the merge request's `iid`).
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

fn accept(kind: ForgeKind) -> &'static str {
    match kind {
        ForgeKind::Github => "application/vnd.github+json",
        ForgeKind::Gitlab | ForgeKind::Gitea => "application/json",
    }
}

fn api(forge: &ForgeConfig) -> &str {
    forge.api.trim_end_matches('/')
}

fn read_token(forge: &ForgeConfig) -> Result<Secret, ExecError> {
    Secret::read_file(&forge.token_file).map_err(|source| ExecError::Credential {
        destination: format!("forge {}", forge.repo),
        path: forge.token_file.clone(),
        source,
    })
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
    let noun = match forge.kind {
        ForgeKind::Gitlab => "a merge request",
        _ => "a pull request",
    };
    let action = format!("opening {noun} on {}", forge.repo);
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
    let token = read_token(forge)?;
    let (url, payload) = match forge.kind {
        ForgeKind::Github | ForgeKind::Gitea => (
            format!("{}/repos/{}/pulls", api(forge), forge.repo),
            serde_json::json!({"title": title, "head": head, "base": base, "body": body}),
        ),
        ForgeKind::Gitlab => (
            format!(
                "{}/projects/{}/merge_requests",
                api(forge),
                query_escape(&forge.repo)
            ),
            serde_json::json!({
                "source_branch": head,
                "target_branch": base,
                "title": title,
                "description": body,
            }),
        ),
    };
    let payload = serde_json::to_vec(&payload).map_err(|e| invalid(format!("encoding: {e}")))?;
    let secs = forge.timeout_secs.unwrap_or(DEFAULT_HTTP_TIMEOUT_SECS);
    let github_version = [("X-GitHub-Api-Version", "2022-11-28")];
    let request = HttpRequest {
        accept: Some(accept(forge.kind)),
        bearer: Some(&token),
        ca_file: forge.ca_file.as_deref(),
        headers: match forge.kind {
            ForgeKind::Github => &github_version,
            _ => &[],
        },
        ..HttpRequest::new(
            &url,
            "application/json",
            &payload,
            Duration::from_secs(secs),
        )
    };
    if forge.insecure {
        warn_if_clear(&url, "forge");
    }
    let response = http
        .post(&request)
        .map_err(|e| transport_error(action.clone(), secs, e))?;
    let text = String::from_utf8_lossy(&response.body);
    let exists = match (forge.kind, response.status) {
        (ForgeKind::Github, 422) => text.contains("already exists"),
        (ForgeKind::Gitlab | ForgeKind::Gitea, 409 | 422) => text.contains("already exists"),
        _ => false,
    };
    match response.status {
        201 => {}
        401 | 403 => return Err(ExecError::Auth { action }),
        _ if exists => {
            // Opened before (by an attempt whose answer was lost, or by a
            // person): adopt it only if it is exactly what was approved.
            return match find_with(http, forge, &token, head, base, head_commit)? {
                Some(found) => Ok(found),
                None => Err(ExecError::Invalid {
                    action,
                    status: response.status,
                    excerpt: format!("{noun} for this head already exists, but not open at the approved commit into the approved base"),
                }),
            };
        }
        400 | 409 | 422 => {
            return Err(ExecError::Invalid {
                action,
                status: response.status,
                excerpt: excerpt(&response.body, Some(token.expose())),
            })
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
    let created = parse_created(forge.kind, &response.body).map_err(|why| ExecError::Protocol {
        action: action.clone(),
        why: format!("the 201 answer is not {noun}: {why}"),
    })?;
    if let Some(sha) = created.sha {
        if !sha.eq_ignore_ascii_case(head_commit) {
            return Err(ExecError::Protocol {
                action,
                why: format!(
                    "{noun} #{} ({}) was opened at head {sha}, not the approved {head_commit}",
                    created.number, created.url
                ),
            });
        }
    }
    Ok(PrOutcome {
        number: created.number,
        url: created.url,
        adopted: false,
    })
}

/// What a 201 says, in every forge's shape.
struct Created {
    number: u64,
    url: String,
    sha: Option<String>,
}

fn parse_created(kind: ForgeKind, body: &[u8]) -> Result<Created, String> {
    match kind {
        ForgeKind::Github | ForgeKind::Gitea => {
            let c: GithubCreated = serde_json::from_slice(body).map_err(|e| e.to_string())?;
            Ok(Created {
                number: c.number,
                url: c.html_url,
                sha: c.head.and_then(|h| h.sha).filter(|s| !s.is_empty()),
            })
        }
        ForgeKind::Gitlab => {
            let c: GitlabMr = serde_json::from_slice(body).map_err(|e| e.to_string())?;
            Ok(Created {
                number: c.iid,
                url: c.web_url,
                sha: c.sha.filter(|s| !s.is_empty()),
            })
        }
    }
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
    let token = read_token(forge)?;
    find_with(http, forge, &token, head, base, head_commit)
}

/// One open pull request as a listing shows it, in every forge's shape.
struct Open {
    number: u64,
    url: String,
    head: String,
    base: Option<String>,
    sha: String,
}

fn find_with(
    http: &dyn HttpPost,
    forge: &ForgeConfig,
    token: &Secret,
    head: &str,
    base: &str,
    head_commit: &str,
) -> Result<Option<PrOutcome>, ExecError> {
    let pages = match forge.kind {
        ForgeKind::Gitea => GITEA_PAGES,
        _ => 1,
    };
    for page in 1..=pages {
        let (listed, full) = list_page(http, forge, token, head, base, page)?;
        let found = listed.into_iter().find(|pr| {
            pr.sha.eq_ignore_ascii_case(head_commit)
                && pr.head == head
                && pr.base.as_ref().is_none_or(|b| b == base)
        });
        if let Some(pr) = found {
            return Ok(Some(PrOutcome {
                number: pr.number,
                url: pr.url,
                adopted: true,
            }));
        }
        if !full {
            break;
        }
    }
    Ok(None)
}

/// One page of open pull requests, and whether it was full (more may follow).
fn list_page(
    http: &dyn HttpPost,
    forge: &ForgeConfig,
    token: &Secret,
    head: &str,
    base: &str,
    page: u32,
) -> Result<(Vec<Open>, bool), ExecError> {
    let action = format!("looking up pull requests on {}", forge.repo);
    let owner = forge.repo.split('/').next().unwrap_or_default();
    // Branch names passed `branch_name` (valid ref names): only `/` and a
    // few punctuation marks need escaping in a query value.
    let url = match forge.kind {
        ForgeKind::Github => format!(
            "{}/repos/{}/pulls?head={}&base={}&state=open",
            api(forge),
            forge.repo,
            query_escape(&format!("{owner}:{head}")),
            query_escape(base),
        ),
        ForgeKind::Gitlab => format!(
            "{}/projects/{}/merge_requests?source_branch={}&target_branch={}&state=opened",
            api(forge),
            query_escape(&forge.repo),
            query_escape(head),
            query_escape(base),
        ),
        ForgeKind::Gitea => format!(
            "{}/repos/{}/pulls?state=open&page={page}&limit={GITEA_PAGE_SIZE}",
            api(forge),
            forge.repo,
        ),
    };
    let secs = forge.timeout_secs.unwrap_or(DEFAULT_HTTP_TIMEOUT_SECS);
    let request = HttpRequest {
        accept: Some(accept(forge.kind)),
        bearer: Some(token),
        ca_file: forge.ca_file.as_deref(),
        ..HttpRequest::new(&url, "application/json", b"", Duration::from_secs(secs))
    };
    if forge.insecure {
        warn_if_clear(&url, "forge");
    }
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
    let protocol = |e: serde_json::Error| ExecError::Protocol {
        action: action.clone(),
        why: format!("the answer is not a list of pull requests: {e}"),
    };
    let listed: Vec<Open> = match forge.kind {
        ForgeKind::Github | ForgeKind::Gitea => {
            serde_json::from_slice::<Vec<Listed>>(&response.body)
                .map_err(protocol)?
                .into_iter()
                .map(|pr| Open {
                    number: pr.number,
                    url: pr.html_url,
                    head: pr.head.r#ref,
                    base: pr.base.map(|b| b.r#ref),
                    sha: pr.head.sha,
                })
                .collect()
        }
        ForgeKind::Gitlab => serde_json::from_slice::<Vec<GitlabMr>>(&response.body)
            .map_err(protocol)?
            .into_iter()
            .map(|mr| Open {
                number: mr.iid,
                url: mr.web_url,
                head: mr.source_branch.unwrap_or_default(),
                base: mr.target_branch,
                sha: mr.sha.unwrap_or_default(),
            })
            .collect(),
    };
    let full = listed.len() >= GITEA_PAGE_SIZE;
    Ok((listed, full))
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
struct GithubCreated {
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

/// A GitLab merge request, as created or listed.
#[derive(Deserialize)]
struct GitlabMr {
    iid: u64,
    web_url: String,
    #[serde(default)]
    sha: Option<String>,
    #[serde(default)]
    source_branch: Option<String>,
    #[serde(default)]
    target_branch: Option<String>,
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
        TransportError::Tls(why) => ExecError::Tls { action, why },
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
        std::fs::set_permissions(
            &token_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        ForgeConfig::new(
            "http://forge.test/",
            "own/repo",
            "origin",
            token_file,
            Readers::Public,
        )
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
            (422, false, "invalid_at_destination"),
            (400, false, "invalid_at_destination"),
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
