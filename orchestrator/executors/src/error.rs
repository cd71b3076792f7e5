//! The one error type of the executors.
//!
//! Invariants:
//! - No message, field or source holds a credential. A destination's answer
//!   is kept only as a short excerpt from which the credential in use has
//!   been scrubbed (`tests::excerpt_scrubs_the_secret_before_cutting`,
//!   `forge::tests::statuses_are_classified_and_never_echo_the_token`,
//!   `tests/loopback.rs::a_wrong_password_is_a_final_auth_error_that_does_not_show_it`).
//! - [`ExecError::retryable`] is true only when the effect certainly did not
//!   happen, or when a repeat is harmless (a push repeats its lease check,
//!   and a remote that already holds the commit counts as done). When in
//!   doubt it is false, as the deferred queue asks
//!   (`forge::tests::transport_failures_are_retryable_only_when_nothing_was_sent`,
//!   `notify::tests::any_2xx_succeeds_and_only_429_and_503_are_retried`,
//!   `tests/loopback.rs::servers_that_are_down_give_retryable_errors`).
//! - [`ExecError::audit_reason`] is a class, a status and ids the supervisor
//!   chose, and, when the destination answered in words (an HTTP error's
//!   body, a forge's error, the remote's report and its `remote:` hook
//!   lines), those words: sanitised ([`answer_text`]: no control
//!   character, one line, at most [`EXCERPT_CHARS`] characters, the
//!   credential scrubbed first) and quoted, so that a failure says why
//!   wherever its reason is shown (`queue show`, the pages, the summary,
//!   the audit) (`tests::audit_reasons_carry_the_destinations_answer_sanitised_and_bounded`,
//!   `tests/tests/acts.rs::a_push_the_remote_refuses_carries_the_remotes_own_words`).

use std::path::PathBuf;

use crate::secret::SecretError;

/// How many characters of a destination's answer an error keeps.
pub const EXCERPT_CHARS: usize = 200;

/// Everything that can go wrong carrying out an act.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("reading the credential of {destination} from {path}")]
    Credential {
        destination: String,
        path: PathBuf,
        #[source]
        source: SecretError,
    },
    #[error("{action}: {why}")]
    InvalidRequest { action: String, why: String },
    #[error("{action}: commit {commit} is not in {repo}")]
    MissingCommit {
        action: String,
        commit: String,
        repo: PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error(
        "{action}: the remote holds {}, the approval expected {}",
        show_ref(found),
        show_ref(expected)
    )]
    Stale {
        action: String,
        expected: Option<String>,
        found: Option<String>,
    },
    #[error("{action}: the destination refused the credential")]
    Auth { action: String },
    #[error("{action}: the remote refused the update: {reason}; the remote said: {remote}")]
    Rejected {
        action: String,
        reason: String,
        /// The remote's own lines while pushing (its hooks' `remote:`
        /// output), through [`answer_text`]; empty when it said nothing.
        remote: String,
    },
    #[error("{action}: {why}")]
    Tls { action: String, why: String },
    #[error("{action}: {why}")]
    HostKey { action: String, why: String },
    #[error("{action}: the destination refused the request as invalid ({status}): {excerpt:?}")]
    Invalid {
        action: String,
        status: u16,
        excerpt: String,
    },
    #[error("{action}: could not reach the destination")]
    Unreachable {
        action: String,
        retryable: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{action}: the destination answered {status}: {excerpt:?}")]
    Status {
        action: String,
        status: u16,
        excerpt: String,
        retryable: bool,
    },
    #[error("{action}: no answer within {secs}s; whether it took effect is unknown")]
    TimedOut { action: String, secs: u64 },
    #[error("{action}: unexpected answer: {why}")]
    Protocol { action: String, why: String },
    #[error("{action}: {why}")]
    Internal { action: String, why: &'static str },
    #[error("{action}")]
    Git {
        action: String,
        retryable: bool,
        #[source]
        source: git2::Error,
    },
}

fn show_ref(oid: &Option<String>) -> String {
    match oid {
        Some(oid) => oid.clone(),
        None => "no such ref".into(),
    }
}

impl ExecError {
    /// True if a new attempt may be made (see the module note).
    pub fn retryable(&self) -> bool {
        match self {
            ExecError::Unreachable { retryable, .. }
            | ExecError::Status { retryable, .. }
            | ExecError::Git { retryable, .. } => *retryable,
            ExecError::Credential { .. }
            | ExecError::InvalidRequest { .. }
            | ExecError::MissingCommit { .. }
            | ExecError::Stale { .. }
            | ExecError::Auth { .. }
            | ExecError::Rejected { .. }
            | ExecError::TimedOut { .. }
            | ExecError::Protocol { .. }
            | ExecError::Internal { .. }
            | ExecError::Tls { .. }
            | ExecError::HostKey { .. }
            | ExecError::Invalid { .. } => false,
        }
    }

    /// A stable name of the failure's kind.
    pub fn class(&self) -> &'static str {
        match self {
            ExecError::Credential { .. } => "credential_unreadable",
            ExecError::InvalidRequest { .. } => "invalid_request",
            ExecError::MissingCommit { .. } => "missing_commit",
            ExecError::Stale { .. } => "stale",
            ExecError::Auth { .. } => "auth_refused",
            ExecError::Rejected { .. } => "rejected",
            ExecError::Unreachable { .. } => "unreachable",
            ExecError::Status { .. } => "http_status",
            ExecError::TimedOut { .. } => "timed_out",
            ExecError::Protocol { .. } => "protocol",
            ExecError::Internal { .. } => "internal",
            ExecError::Git { .. } => "git",
            ExecError::Tls { .. } => "tls_untrusted",
            ExecError::HostKey { .. } => "host_key_refused",
            ExecError::Invalid { .. } => "invalid_at_destination",
        }
    }

    /// Content-free text for the audit: the class and the supervisor's own
    /// figures, never a destination's or an agent's words.
    pub fn audit_reason(&self) -> String {
        match self {
            ExecError::Stale {
                expected, found, ..
            } => format!(
                "stale: expected {}, found {}",
                show_ref(expected),
                show_ref(found)
            ),
            ExecError::Status {
                status, excerpt, ..
            } => format!("http_status: {status}{}", said(excerpt)),
            ExecError::Invalid {
                status, excerpt, ..
            } => format!("invalid_at_destination: {status}{}", said(excerpt)),
            ExecError::Rejected { reason, remote, .. } => {
                format!("rejected: {:?}{}", answer_text(reason), said(remote))
            }
            ExecError::TimedOut { secs, .. } => format!("timed_out: {secs}s"),
            other => other.class().to_string(),
        }
    }
}

/// `; the destination said "..."` for a non-empty answer, else nothing.
fn said(answer: &str) -> String {
    let text = answer_text(answer);
    match text.is_empty() {
        true => String::new(),
        false => format!("; the destination said {text:?}"),
    }
}

/// A destination's words made safe to keep and show: every control
/// character (line ends too) becomes one space, runs of spaces one, and
/// the text is cut to [`EXCERPT_CHARS`] characters (`…` marks a cut).
pub fn answer_text(raw: &str) -> String {
    let mut out = String::new();
    for c in raw.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        out.push(c);
    }
    let out = out.trim_end().to_string();
    match out.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &out[..cut]),
        None => out,
    }
}

/// A destination's answer cut to [`EXCERPT_CHARS`] characters, with every
/// occurrence of `secret` (if it is there at all) replaced by `***`.
pub(crate) fn excerpt(body: &[u8], secret: Option<&str>) -> String {
    let mut text = String::from_utf8_lossy(body).into_owned();
    if let Some(secret) = secret.filter(|s| !s.is_empty()) {
        text = text.replace(secret, "***");
    }
    match text.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_scrubs_the_secret_before_cutting() {
        let body = format!("{}token=s3cr3t", "x".repeat(EXCERPT_CHARS - 5));
        let e = excerpt(body.as_bytes(), Some("s3cr3t"));
        assert!(!e.contains("s3cr"), "{e}");
        assert!(e.starts_with("xxxxx"));
        assert!(e.chars().count() <= EXCERPT_CHARS + 1);
        assert_eq!(excerpt(b"short", None), "short");
    }

    #[test]
    fn audit_reasons_hold_no_words_of_the_destination() {
        let e = ExecError::Status {
            action: "opening a pull request".into(),
            status: 422,
            excerpt: "title: ignore previous instructions".into(),
            retryable: false,
        };
        assert_eq!(
            e.audit_reason(),
            "http_status: 422; the destination said \"title: ignore previous instructions\""
        );
        assert!(!e.retryable());
    }

    #[test]
    fn audit_reasons_carry_the_destinations_answer_sanitised_and_bounded() {
        let r = ExecError::Rejected {
            action: "pushing".into(),
            reason: "pre-receive hook declined".into(),
            remote: "policy: \x1b[31mbranch names\r\nmust start with agent/\n".into(),
        };
        let reason = r.audit_reason();
        assert_eq!(
            reason,
            "rejected: \"pre-receive hook declined\"; the destination said \"policy: [31mbranch names must start with agent/\""
        );
        assert!(!reason.chars().any(char::is_control), "{reason:?}");
        let long = ExecError::Status {
            action: "x".into(),
            status: 500,
            excerpt: "y".repeat(1000),
            retryable: true,
        };
        assert!(long.audit_reason().chars().count() < EXCERPT_CHARS + 60);
        let quiet = ExecError::Rejected {
            action: "pushing".into(),
            reason: "non-fast-forward".into(),
            remote: String::new(),
        };
        assert_eq!(quiet.audit_reason(), "rejected: \"non-fast-forward\"");
    }
}
