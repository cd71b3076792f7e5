//! Pushing an approved commit to a configured remote over smart HTTP, with
//! libgit2.
//!
//! Invariants:
//! - The lease is exact: on one connection the remote's refs are listed,
//!   `dst_ref` is compared with `expected_old` (`None`: must not exist), and
//!   only if they are equal is the commit pushed, on that same connection.
//!   The update libgit2 sends names the listed value as the old one, and the
//!   remote applies it only if the ref still holds it; so a remote that
//!   moved after the listing refuses the update rather than losing a commit.
//! - A remote that already holds `commit` at `dst_ref` is success
//!   (`already_there`): that makes repeating an attempt harmless, which is
//!   why transport failures of a push may be retried.
//! - Never a forced update: the refspec has no `+`, and libgit2 refuses a
//!   non-fast-forward before sending anything.
//! - The push sees only the host repository's objects: the repository is
//!   reopened as a bare object database with none of the host's config
//!   (no `insteadOf`, no proxy, no pushurl), so the URL used is the URL the
//!   owner configured.
//! - The credential is read from its file just before connecting, handed to
//!   libgit2 only when the remote asks for one, and offered at most once per
//!   request phase: a second ask means it was refused, which ends the push
//!   as [`ExecError::Auth`] instead of looping.
//! - libgit2's own timeouts are process-global settings behind `unsafe`, so
//!   each push runs on its own thread and the caller stops waiting after
//!   the remote's `timeout_secs` ([`ExecError::TimedOut`], not retryable:
//!   the abandoned thread may still complete the push; a later attempt's
//!   lease check sees it).

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use git2::{
    CredentialType, Direction, ErrorClass, ErrorCode, Oid, PushOptions, Remote, RemoteCallbacks,
    Repository, RepositoryOpenFlags,
};

use crate::config::{check_remote_url as check_url, RemoteConfig, DEFAULT_PUSH_TIMEOUT_SECS};
use crate::error::ExecError;
use crate::secret::Secret;

/// A push that took effect (or had already).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushOutcome {
    /// The commit the remote ref now holds.
    pub new: String,
    /// The remote held it before this call: nothing was sent.
    pub already_there: bool,
}

/// Pushes `commit`, taken from the objects of `source_repo` (the host
/// repository, e.g. holding `refs/nightshift/acts/<id>`), to `dst_ref` of
/// the remote, if the remote's `dst_ref` is `expected_old` (`None`: absent).
pub fn push(
    remote: &RemoteConfig,
    source_repo: &Path,
    commit: &str,
    dst_ref: &str,
    expected_old: Option<&str>,
) -> Result<PushOutcome, ExecError> {
    let action = format!("pushing {commit} to {dst_ref} of {}", remote.url);
    let invalid = |why: String| ExecError::InvalidRequest {
        action: action.clone(),
        why,
    };
    let commit = check_oid(commit).map_err(|why| invalid(format!("commit: {why}")))?;
    let expected_old = expected_old
        .map(check_oid)
        .transpose()
        .map_err(|why| invalid(format!("expected old value: {why}")))?;
    check_ref(dst_ref).map_err(|why| invalid(format!("target ref: {why}")))?;
    check_url(&remote.url).map_err(|why| invalid(format!("url: {why}")))?;
    let job = Job {
        action: action.clone(),
        url: remote.url.clone(),
        credential: read_credential(remote)?,
        source_repo: source_repo.to_path_buf(),
        commit,
        dst_ref: dst_ref.to_string(),
        expected_old,
    };
    let secs = remote.timeout_secs.unwrap_or(DEFAULT_PUSH_TIMEOUT_SECS);
    with_deadline(action, secs, move || job.run())
}

/// What `dst_ref` of the remote holds now (`None`: absent). For checking
/// the destination of an attempt whose outcome is unknown.
pub fn remote_ref(remote: &RemoteConfig, dst_ref: &str) -> Result<Option<String>, ExecError> {
    let action = format!("reading {dst_ref} of {}", remote.url);
    check_ref(dst_ref).map_err(|why| ExecError::InvalidRequest {
        action: action.clone(),
        why: format!("target ref: {why}"),
    })?;
    check_url(&remote.url).map_err(|why| ExecError::InvalidRequest {
        action: action.clone(),
        why: format!("url: {why}"),
    })?;
    let credential = read_credential(remote)?;
    let url = remote.url.clone();
    let dst_ref = dst_ref.to_string();
    let secs = remote.timeout_secs.unwrap_or(DEFAULT_PUSH_TIMEOUT_SECS);
    let inner_action = action.clone();
    with_deadline(action, secs, move || {
        let auth = Auth::new(credential.as_ref());
        let mut detached = Remote::create_detached(url.as_str())
            .map_err(|e| git_error(&inner_action, &auth, e))?;
        let conn = detached
            .connect_auth(Direction::Fetch, Some(auth.callbacks()), None)
            .map_err(|e| git_error(&inner_action, &auth, e))?;
        let heads = conn
            .list()
            .map_err(|e| git_error(&inner_action, &auth, e))?;
        Ok(find(heads, &dst_ref))
    })
}

/// Whether `commit` extends `old` in the host repository `source_repo`:
/// `old` is `commit` or one of its ancestors. False when `old` is not there
/// (then it is nothing `commit` was built on).
pub fn extends(source_repo: &Path, commit: &str, old: &str) -> Result<bool, ExecError> {
    let action = format!("checking whether {commit} extends {old}");
    let invalid = |why: String| ExecError::InvalidRequest {
        action: action.clone(),
        why,
    };
    let commit = check_oid(commit).map_err(|why| invalid(format!("commit: {why}")))?;
    let old = check_oid(old).map_err(|why| invalid(format!("old value: {why}")))?;
    if commit == old {
        return Ok(true);
    }
    let git = |source| ExecError::Git {
        action: action.clone(),
        retryable: false,
        source,
    };
    let host = Repository::open_ext(
        source_repo,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&std::ffi::OsStr>(),
    )
    .map_err(git)?;
    let (commit, old) = (
        Oid::from_str(&commit).map_err(git)?,
        Oid::from_str(&old).map_err(git)?,
    );
    if host.find_commit(old).is_err() {
        return Ok(false);
    }
    host.graph_descendant_of(commit, old).map_err(git)
}

/// Checks a full commit id and returns it in lowercase.
pub(crate) fn check_oid(id: &str) -> Result<String, String> {
    if id.len() != 40 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{id:?} is not a full 40-hex commit id"));
    }
    Ok(id.to_ascii_lowercase())
}

fn check_ref(r: &str) -> Result<(), String> {
    if !r.starts_with("refs/") || !git2::Reference::is_valid_name(r) {
        return Err(format!("{r:?} is not a full, valid ref name"));
    }
    Ok(())
}

fn read_credential(remote: &RemoteConfig) -> Result<Option<(String, Secret)>, ExecError> {
    remote
        .credential()
        .map(|c| {
            Secret::read_file(c.secret_file)
                .map(|s| (c.username.to_string(), s))
                .map_err(|source| ExecError::Credential {
                    destination: format!("remote {}", remote.url),
                    path: c.secret_file.to_path_buf(),
                    source,
                })
        })
        .transpose()
}

/// Runs `f` on its own thread and waits at most `secs` for it.
fn with_deadline<T: Send + 'static>(
    action: String,
    secs: u64,
    f: impl FnOnce() -> Result<T, ExecError> + Send + 'static,
) -> Result<T, ExecError> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("nightshift-push".into())
        .spawn(move || {
            // The receiver may have given up waiting; nothing to do then.
            let _ = tx.send(f());
        })
        .map_err(|_| ExecError::Internal {
            action: action.clone(),
            why: "could not start the push thread",
        })?;
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(ExecError::TimedOut { action, secs }),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(ExecError::Internal {
            action,
            why: "the push thread ended without an answer",
        }),
    }
}

struct Job {
    action: String,
    url: String,
    credential: Option<(String, Secret)>,
    source_repo: PathBuf,
    commit: String,
    dst_ref: String,
    expected_old: Option<String>,
}

impl Job {
    fn run(self) -> Result<PushOutcome, ExecError> {
        let action = self.action.as_str();
        let host = Repository::open_ext(
            &self.source_repo,
            RepositoryOpenFlags::NO_SEARCH,
            std::iter::empty::<&std::ffi::OsStr>(),
        )
        .map_err(|source| ExecError::Git {
            action: format!("{action}: opening {}", self.source_repo.display()),
            retryable: false,
            source,
        })?;
        let odb = host.odb().map_err(|source| ExecError::Git {
            action: format!(
                "{action}: opening the objects of {}",
                self.source_repo.display()
            ),
            retryable: false,
            source,
        })?;
        // Objects only: the host's config plays no part in the push.
        let repo = Repository::from_odb(odb).map_err(|source| ExecError::Git {
            action: format!(
                "{action}: opening the objects of {}",
                self.source_repo.display()
            ),
            retryable: false,
            source,
        })?;
        let oid = Oid::from_str(&self.commit).map_err(|source| ExecError::Git {
            action: action.to_string(),
            retryable: false,
            source,
        })?;
        repo.find_commit(oid)
            .map_err(|source| ExecError::MissingCommit {
                action: action.to_string(),
                commit: self.commit.clone(),
                repo: self.source_repo.clone(),
                source,
            })?;

        let mut remote = repo
            .remote_anonymous(&self.url)
            .map_err(|source| ExecError::Git {
                action: action.to_string(),
                retryable: false,
                source,
            })?;
        let listing = Auth::new(self.credential.as_ref());
        let mut conn = remote
            .connect_auth(Direction::Push, Some(listing.callbacks()), None)
            .map_err(|e| git_error(action, &listing, e))?;
        let heads = conn.list().map_err(|e| git_error(action, &listing, e))?;
        let found = find(heads, &self.dst_ref);
        if found.as_deref() == Some(self.commit.as_str()) {
            return Ok(PushOutcome {
                new: self.commit,
                already_there: true,
            });
        }
        if found != self.expected_old {
            return Err(ExecError::Stale {
                action: action.to_string(),
                expected: self.expected_old,
                found,
            });
        }

        let pushing = Auth::new(self.credential.as_ref());
        let status: RefCell<Option<Option<String>>> = RefCell::new(None);
        let mut callbacks = pushing.callbacks();
        callbacks.push_update_reference(|name, refused| {
            if name == self.dst_ref {
                *status.borrow_mut() = Some(refused.map(str::to_string));
            }
            Ok(())
        });
        let mut options = PushOptions::new();
        options.remote_callbacks(callbacks);
        let spec = format!("{}:{}", self.commit, self.dst_ref);
        conn.remote()
            .push(&[spec.as_str()], Some(&mut options))
            .map_err(|e| git_error(action, &pushing, e))?;
        drop(options);
        match status.into_inner() {
            Some(None) => Ok(PushOutcome {
                new: self.commit,
                already_there: false,
            }),
            Some(Some(reason)) => Err(ExecError::Rejected {
                action: action.to_string(),
                reason,
            }),
            None => Err(ExecError::Protocol {
                action: action.to_string(),
                why: format!("the remote reported nothing about {}", self.dst_ref),
            }),
        }
    }
}

/// The id `dst_ref` holds in a listing, lowercase; `None` if absent.
fn find(heads: &[git2::RemoteHead<'_>], dst_ref: &str) -> Option<String> {
    heads
        .iter()
        .find(|h| h.name() == dst_ref && !h.oid().is_zero())
        .map(|h| h.oid().to_string())
}

/// The credential offered to libgit2 during one request phase.
struct Auth<'a> {
    credential: Option<&'a (String, Secret)>,
    asked: Cell<u32>,
    refused: Cell<bool>,
}

impl<'a> Auth<'a> {
    fn new(credential: Option<&'a (String, Secret)>) -> Self {
        Auth {
            credential,
            asked: Cell::new(0),
            refused: Cell::new(false),
        }
    }

    fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut callbacks = RemoteCallbacks::new();
        callbacks.credentials(move |_url, _user, allowed| {
            let asked = self.asked.get() + 1;
            self.asked.set(asked);
            match self.credential {
                Some((user, secret))
                    if asked == 1 && allowed.contains(CredentialType::USER_PASS_PLAINTEXT) =>
                {
                    git2::Cred::userpass_plaintext(user, secret.expose())
                }
                _ => {
                    self.refused.set(true);
                    Err(git2::Error::from_str("no credential left to offer"))
                }
            }
        });
        callbacks
    }
}

/// Classifies a libgit2 failure. Transport failures are retryable: the
/// lease check of the next attempt makes a repeat harmless.
fn git_error(action: &str, auth: &Auth<'_>, e: git2::Error) -> ExecError {
    let action = action.to_string();
    if auth.refused.get() || e.code() == ErrorCode::Auth {
        return ExecError::Auth { action };
    }
    if e.code() == ErrorCode::NotFastForward {
        return ExecError::Rejected {
            action,
            reason: "not a fast-forward of the remote ref".into(),
        };
    }
    let message = e.message();
    let retryable = match e.class() {
        ErrorClass::Net | ErrorClass::Os => {
            message.starts_with("failed to connect") || message.starts_with("failed to resolve")
        }
        ErrorClass::Http => http_status(message).is_some_and(|s| s >= 500),
        _ => false,
    };
    if retryable && e.class() != ErrorClass::Http {
        return ExecError::Unreachable {
            action,
            retryable,
            source: Box::new(e),
        };
    }
    ExecError::Git {
        action,
        retryable,
        source: e,
    }
}

/// The status in libgit2's "unexpected http status code: 502".
fn http_status(message: &str) -> Option<u16> {
    message
        .strip_prefix("unexpected http status code: ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|code| code.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_refs_are_checked() {
        assert_eq!(
            check_oid("0123456789ABCDEF0123456789abcdef01234567").unwrap(),
            "0123456789abcdef0123456789abcdef01234567"
        );
        for bad in ["", "abc", "g123456789abcdef0123456789abcdef01234567"] {
            assert!(check_oid(bad).is_err(), "{bad}");
        }
        assert!(check_ref("refs/heads/agent/x").is_ok());
        for bad in [
            "main",
            "refs/heads/a..b",
            "refs/heads/x:refs/heads/y",
            "+refs/heads/x",
        ] {
            assert!(check_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn http_statuses_are_read_from_libgit2_messages() {
        assert_eq!(http_status("unexpected http status code: 502"), Some(502));
        assert_eq!(http_status("something else"), None);
    }
}
