//! Pushing an approved commit to a configured remote over HTTPS, plain HTTP
//! (loopback), SSH or `file://`, with libgit2.
//!
//! Invariants:
//! - The lease is enforced by the push itself, as `--force-with-lease`
//!   does: libgit2's push negotiation hands over the update it is about to
//!   send, and it is sent only if its old value (the remote's ref as
//!   advertised on this connection) is `expected_old` (`None`: the ref must
//!   not exist); otherwise the push stops before any object is sent
//!   ([`ExecError::Stale`]). The update names that old value, and the
//!   remote's receive-pack applies it only if the ref still holds it under
//!   its lock; so a remote that moved at any moment refuses the update
//!   rather than losing a commit
//!   (`tests/loopback.rs::a_remote_that_moved_is_stale_and_stays_as_it_was`,
//!   `tests/loopback.rs::a_remote_that_moves_between_listing_and_update_refuses_the_update`).
//! - TLS: OpenSSL verifies the server against the system's roots; a remote
//!   with a `ca_file` also accepts a certificate that verifies against it
//!   ([`crate::tls::verify_leaf`]). Nothing else is accepted.
//! - SSH: the server's host key must be listed for it in the remote's
//!   `known_hosts` ([`crate::known_hosts`]); unknown, changed or revoked
//!   keys end the push before authenticating, naming the host and key. The
//!   key file is read at use (owner and mode checked) or the supervisor's
//!   ssh-agent is asked; `~/.ssh` plays no part.
//! - A remote that already holds `commit` at `dst_ref` is success
//!   (`already_there`): that makes repeating an attempt harmless, which is
//!   why transport failures of a push may be retried.
//! - Never a forced update: the refspec has no `+`, and libgit2 refuses a
//!   non-fast-forward before sending anything
//!   (`tests/loopback.rs::a_non_fast_forward_is_refused`).
//! - The push sees only the host repository's objects: the repository is
//!   reopened as a bare object database with none of the host's config
//!   (no `insteadOf`, no proxy, no pushurl), so the URL used is the URL the
//!   owner configured (`tests/loopback.rs::the_host_repositorys_config_cannot_redirect_a_push`,
//!   `tests/loopback.rs::a_commit_missing_from_the_host_is_refused_before_connecting`).
//! - The credential is read from its file just before connecting, handed to
//!   libgit2 only when the remote asks for one, and offered at most once per
//!   request phase: a second ask means it was refused, which ends the push
//!   as [`ExecError::Auth`] instead of looping
//!   (`tests/loopback.rs::a_wrong_password_is_a_final_auth_error_that_does_not_show_it`).
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

use crate::config::{
    check_remote_url as check_url, warn_if_clear, Location, RemoteConfig, DEFAULT_PUSH_TIMEOUT_SECS,
};
use crate::error::ExecError;
use crate::known_hosts::{self, HostKeyVerdict};
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
        access: Access::of(remote)?,
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
    let access = Access::of(remote)?;
    let url = remote.url.clone();
    let dst_ref = dst_ref.to_string();
    let secs = remote.timeout_secs.unwrap_or(DEFAULT_PUSH_TIMEOUT_SECS);
    let inner_action = action.clone();
    with_deadline(action, secs, move || {
        let auth = Auth::new(&access);
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

/// Every ref the remote advertises now and the id it holds (for showing
/// what an act would publish that the remote does not hold yet).
pub fn remote_heads(remote: &RemoteConfig) -> Result<Vec<(String, String)>, ExecError> {
    let action = format!("listing the refs of {}", remote.url);
    check_url(&remote.url).map_err(|why| ExecError::InvalidRequest {
        action: action.clone(),
        why: format!("url: {why}"),
    })?;
    let access = Access::of(remote)?;
    let url = remote.url.clone();
    let secs = remote.timeout_secs.unwrap_or(DEFAULT_PUSH_TIMEOUT_SECS);
    let inner_action = action.clone();
    with_deadline(action, secs, move || {
        let auth = Auth::new(&access);
        let mut detached = Remote::create_detached(url.as_str())
            .map_err(|e| git_error(&inner_action, &auth, e))?;
        let conn = detached
            .connect_auth(Direction::Fetch, Some(auth.callbacks()), None)
            .map_err(|e| git_error(&inner_action, &auth, e))?;
        let heads = conn
            .list()
            .map_err(|e| git_error(&inner_action, &auth, e))?;
        Ok(heads
            .iter()
            .filter(|h| !h.oid().is_zero())
            .map(|h| (h.name().to_string(), h.oid().to_string()))
            .collect())
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

/// Everything a connection to a remote needs besides its URL: the
/// credential (read now, from its file), and whom to trust.
struct Access {
    /// HTTP Basic username and password or token.
    http: Option<(String, Secret)>,
    /// Extra certificate authorities of an https remote.
    ca_file: Option<PathBuf>,
    /// SSH: the login, and the key (None: the agent), and the known hosts.
    ssh: Option<SshAccess>,
    /// The TLS refusal of the remote's `ca_file`, kept to name it.
    tls_refusal: RefCell<Option<String>>,
    /// The host key refusal, kept to name it.
    host_key_refusal: RefCell<Option<String>>,
}

struct SshAccess {
    user: String,
    key: Option<Secret>,
    host: String,
    port: u16,
    known_hosts: PathBuf,
    known_hosts_text: String,
}

impl Access {
    fn of(remote: &RemoteConfig) -> Result<Access, ExecError> {
        let destination = format!("remote {}", remote.url);
        let location = remote.location().map_err(|why| ExecError::InvalidRequest {
            action: format!("reaching {}", remote.url),
            why: format!("url: {why}"),
        })?;
        let http = remote
            .credential()
            .map(|c| {
                Secret::read_file(c.secret_file)
                    .map(|s| (c.username.to_string(), s))
                    .map_err(|source| ExecError::Credential {
                        destination: destination.clone(),
                        path: c.secret_file.to_path_buf(),
                        source,
                    })
            })
            .transpose()?;
        if http.is_some() && remote.insecure {
            warn_if_clear(&remote.url, "remote");
        }
        let ssh = match location {
            Location::Ssh { user, host, port } => {
                let known_hosts =
                    remote
                        .known_hosts
                        .clone()
                        .ok_or_else(|| ExecError::InvalidRequest {
                            action: format!("reaching {}", remote.url),
                            why: "an ssh remote needs known_hosts".into(),
                        })?;
                let known_hosts_text =
                    std::fs::read_to_string(&known_hosts).map_err(|e| ExecError::HostKey {
                        action: format!("reaching {}", remote.url),
                        why: format!("reading known_hosts {}: {e}", known_hosts.display()),
                    })?;
                let key = remote
                    .ssh_key_file
                    .as_ref()
                    .map(|path| {
                        Secret::read_key_file(path).map_err(|source| ExecError::Credential {
                            destination: destination.clone(),
                            path: path.clone(),
                            source,
                        })
                    })
                    .transpose()?;
                Some(SshAccess {
                    user: remote
                        .username
                        .clone()
                        .or(user)
                        .unwrap_or_else(|| "git".into()),
                    key,
                    host,
                    port,
                    known_hosts,
                    known_hosts_text,
                })
            }
            _ => None,
        };
        Ok(Access {
            http,
            ca_file: remote.ca_file.clone(),
            ssh,
            tls_refusal: RefCell::new(None),
            host_key_refusal: RefCell::new(None),
        })
    }
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
    access: Access,
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
        let listing = Auth::new(&self.access);
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
        // No comparison with the lease here: the push's own negotiation
        // below holds it (see the module note), on the values it sends.

        let pushing = Auth::new(&self.access);
        let status: RefCell<Option<Option<String>>> = RefCell::new(None);
        let stale: RefCell<Option<Option<String>>> = RefCell::new(None);
        // The remote's own words (its hooks' output), at most REMOTE_SAID
        // bytes kept: the first lines, where a hook says why.
        let said: RefCell<Vec<u8>> = RefCell::new(Vec::new());
        let mut callbacks = pushing.callbacks();
        callbacks.sideband_progress(|data| {
            let mut said = said.borrow_mut();
            let room = REMOTE_SAID.saturating_sub(said.len());
            said.extend_from_slice(&data[..data.len().min(room)]);
            true
        });
        callbacks.push_negotiation(|updates| {
            let expected = self.expected_old.as_deref();
            for update in updates {
                if update.dst_refname().ok() != Some(self.dst_ref.as_str()) {
                    continue;
                }
                let old = update.src();
                let old = (!old.is_zero()).then(|| old.to_string());
                if old.as_deref() != expected {
                    *stale.borrow_mut() = Some(old);
                    return Err(git2::Error::from_str(
                        "the remote ref is not at the approved lease",
                    ));
                }
            }
            Ok(())
        });
        callbacks.push_update_reference(|name, refused| {
            if name == self.dst_ref {
                *status.borrow_mut() = Some(refused.map(str::to_string));
            }
            Ok(())
        });
        let mut options = PushOptions::new();
        options.remote_callbacks(callbacks);
        let spec = format!("{}:{}", self.commit, self.dst_ref);
        let pushed = conn.remote().push(&[spec.as_str()], Some(&mut options));
        drop(options);
        if let Some(found) = stale.into_inner() {
            return Err(ExecError::Stale {
                action: action.to_string(),
                expected: self.expected_old,
                found,
            });
        }
        pushed.map_err(|e| git_error(action, &pushing, e))?;
        match status.into_inner() {
            Some(None) => Ok(PushOutcome {
                new: self.commit,
                already_there: false,
            }),
            Some(Some(reason)) => Err(ExecError::Rejected {
                action: action.to_string(),
                reason,
                remote: crate::error::answer_text(&String::from_utf8_lossy(&said.into_inner())),
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

/// The credential offered to libgit2 during one request phase, and the
/// checks of the server's identity.
struct Auth<'a> {
    access: &'a Access,
    asked: Cell<u32>,
    refused: Cell<bool>,
}

impl<'a> Auth<'a> {
    fn new(access: &'a Access) -> Self {
        Auth {
            access,
            asked: Cell::new(0),
            refused: Cell::new(false),
        }
    }

    fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut callbacks = RemoteCallbacks::new();
        callbacks.credentials(move |_url, _user, allowed| {
            if let Some(ssh) = &self.access.ssh {
                if allowed.contains(CredentialType::USERNAME) {
                    return git2::Cred::username(&ssh.user);
                }
            }
            let asked = self.asked.get() + 1;
            self.asked.set(asked);
            let offer = match (&self.access.http, &self.access.ssh) {
                (Some((user, secret)), _)
                    if asked == 1 && allowed.contains(CredentialType::USER_PASS_PLAINTEXT) =>
                {
                    Some(git2::Cred::userpass_plaintext(user, secret.expose()))
                }
                (_, Some(ssh)) if asked == 1 && allowed.contains(CredentialType::SSH_KEY) => {
                    Some(match &ssh.key {
                        Some(key) => {
                            git2::Cred::ssh_key_from_memory(&ssh.user, None, key.expose(), None)
                        }
                        None => git2::Cred::ssh_key_from_agent(&ssh.user),
                    })
                }
                _ => None,
            };
            offer.unwrap_or_else(|| {
                self.refused.set(true);
                Err(git2::Error::from_str("no credential left to offer"))
            })
        });
        callbacks.certificate_check(move |cert, host| self.check_server(cert, host));
        callbacks
    }

    /// Accepts the server only as the module note says.
    fn check_server(
        &self,
        cert: &git2::cert::Cert<'_>,
        host: &str,
    ) -> Result<git2::CertificateCheckStatus, git2::Error> {
        use git2::CertificateCheckStatus::{CertificateOk, CertificatePassthrough};
        if let Some(hostkey) = cert.as_hostkey() {
            let Some(ssh) = &self.access.ssh else {
                return Err(refuse_host_key(
                    self.access,
                    "an ssh host key from a remote that is not ssh".into(),
                ));
            };
            let Some(blob) = hostkey.hostkey() else {
                return Err(refuse_host_key(
                    self.access,
                    format!("{} presented no raw host key to check", ssh.host),
                ));
            };
            let shown = format!(
                "{} key {}",
                known_hosts::key_type(blob),
                known_hosts::fingerprint(blob)
            );
            let at = known_hosts::host_pattern(&ssh.host, ssh.port);
            let file = ssh.known_hosts.display();
            let why = match known_hosts::check(&ssh.known_hosts_text, &ssh.host, ssh.port, blob) {
                HostKeyVerdict::Known => return Ok(CertificateOk),
                HostKeyVerdict::Unknown => {
                    format!("unknown host key: {at} presented {shown}, and known_hosts {file} lists no key for {at}")
                }
                HostKeyVerdict::Changed => format!(
                    "host key CHANGED: {at} presented {shown}, which is not the key known_hosts {file} lists for it"
                ),
                HostKeyVerdict::OtherType { listed } => format!(
                    "{at} presented {shown}; known_hosts {file} lists only {} for it",
                    listed.join(", ")
                ),
                HostKeyVerdict::Revoked => {
                    format!("{at} presented {shown}, which known_hosts {file} marks revoked")
                }
            };
            return Err(refuse_host_key(self.access, why));
        }
        if let Some(x509) = cert.as_x509() {
            if let Some(ca_file) = &self.access.ca_file {
                return match crate::tls::verify_leaf(
                    x509.data(),
                    host,
                    ca_file,
                    rustls_pki_types::UnixTime::now(),
                ) {
                    Ok(()) => Ok(CertificateOk),
                    Err(e) => {
                        // The system's roots may still trust it.
                        *self.access.tls_refusal.borrow_mut() = Some(e.to_string());
                        Ok(CertificatePassthrough)
                    }
                };
            }
        }
        Ok(CertificatePassthrough)
    }
}

fn refuse_host_key(access: &Access, why: String) -> git2::Error {
    *access.host_key_refusal.borrow_mut() = Some(why.clone());
    git2::Error::new(ErrorCode::Certificate, ErrorClass::Ssh, why)
}

/// Most bytes of the remote's own words kept from one push.
const REMOTE_SAID: usize = 4096;

/// Classifies a libgit2 failure. Transport failures are retryable: the
/// lease check of the next attempt makes a repeat harmless.
fn git_error(action: &str, auth: &Auth<'_>, e: git2::Error) -> ExecError {
    let action = action.to_string();
    if let Some(why) = auth.access.host_key_refusal.borrow().clone() {
        return ExecError::HostKey { action, why };
    }
    if e.code() == ErrorCode::Certificate || e.class() == ErrorClass::Ssl {
        let why = match auth.access.tls_refusal.borrow().clone() {
            Some(why) => format!("{why} (nor by the system's roots)"),
            None => format!("the server's certificate is not trusted: {}", e.message()),
        };
        return ExecError::Tls { action, why };
    }
    if auth.refused.get() || e.code() == ErrorCode::Auth {
        return ExecError::Auth { action };
    }
    if e.code() == ErrorCode::NotFastForward {
        return ExecError::Rejected {
            action,
            reason: "not a fast-forward of the remote ref".into(),
            remote: String::new(),
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
