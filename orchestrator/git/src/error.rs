//! The one error type of the crate.
//!
//! Messages are lowercase and say what was being done; the underlying error is
//! attached as the source and never repeated in the message
//! (`tests::messages_are_lowercase_and_keep_their_source_apart`).

use std::path::PathBuf;

/// Everything that can go wrong in the git adapter.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("opening {path} as a git repository: not a git repository")]
    NotARepository {
        path: PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error("resolving base ref {reference:?}: no such ref or revision")]
    UnknownRef {
        reference: String,
        #[source]
        source: git2::Error,
    },
    #[error("resolving base ref {reference:?}: it names a {kind}, not a commit")]
    NotACommit { reference: String, kind: String },
    #[error("checking run id {run_id:?}: {why}")]
    InvalidRunId { run_id: String, why: &'static str },
    #[error("checking commit id {id:?}: not a full 40-hex commit id")]
    InvalidCommitId { id: String },
    #[error("finding base commit {id} in {repo}")]
    MissingBase {
        id: String,
        repo: PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error("creating worktree {path}: {why}")]
    BadDestination { path: PathBuf, why: &'static str },
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{action}")]
    Git {
        action: String,
        #[source]
        source: git2::Error,
    },
    #[error("reading worktree {path}: refused: {why}")]
    HostileWorktree { path: PathBuf, why: String },
    #[error("reading ref {reference} of the worktree: {why}")]
    BadRef { reference: String, why: String },
    #[error("reading object {id} from the worktree: it is missing or unreadable")]
    MissingObject {
        id: String,
        #[source]
        source: git2::Error,
    },
    #[error("reading object {id} from the worktree: malformed {kind}: {why}")]
    MalformedObject {
        id: String,
        kind: &'static str,
        why: &'static str,
    },
    #[error("reading tree {tree}: refused entry \"{name}\": {why}")]
    InvalidTreeEntry {
        /// The tree's 40-hex id.
        tree: String,
        /// The entry's name, non-printable bytes escaped.
        name: String,
        why: &'static str,
    },
    #[error("importing run objects: more than {limit} new objects (max_objects)")]
    TooManyObjects { limit: u64 },
    #[error("importing object {id}: {size} bytes, over the {limit}-byte limit (max_file_bytes)")]
    ObjectTooLarge { id: String, size: u64, limit: u64 },
    #[error("importing run objects: more than {limit} bytes of new objects (max_total_bytes)")]
    TotalBytesExceeded { limit: u64 },
    #[error("taking the pack sent with the request: {why}")]
    BadPack { why: String },
    #[error("taking the pack sent with the request: refused before indexing: {why}")]
    PackOverLimits { why: String },
    #[error("taking commit {commit}: it is not connected: object {missing} is neither in the pack nor in the repository")]
    NotConnected { commit: String, missing: String },
    #[error("writing object {expected} into the host repository: it was stored as {written}")]
    ObjectIdMismatch { expected: String, written: String },
    #[error("taking the run's packed result: {why}")]
    ResultRefused { why: String },
}

impl GitError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        GitError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn git(action: impl Into<String>, source: git2::Error) -> Self {
        GitError::Git {
            action: action.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn messages_are_lowercase_and_keep_their_source_apart() {
        let e = GitError::io("reading", "/w/x", std::io::Error::other("UNDERLYING"));
        assert_eq!(e.to_string(), "reading /w/x");
        assert!(e.source().unwrap().to_string().contains("UNDERLYING"));
        let e = GitError::git("writing a ref", git2::Error::from_str("UNDERLYING"));
        assert_eq!(e.to_string(), "writing a ref");
        assert!(e.source().is_some());
        // Every message of the enum above: lowercase, and none prints a source.
        let code = include_str!("error.rs")
            .split("#[cfg(test)]")
            .next()
            .unwrap();
        let variants: Vec<&str> = code.split("#[error(\"").skip(1).collect();
        assert!(variants.len() >= 20, "{}", variants.len());
        for variant in variants {
            let message = variant.split("\")]").next().unwrap();
            let first = message.chars().next().unwrap();
            assert!(first.is_lowercase() || first == '{', "{message}");
            assert!(!message.contains("{source"), "{message}");
            assert!(!variant.contains("#[from]"), "{message}");
        }
    }
}
