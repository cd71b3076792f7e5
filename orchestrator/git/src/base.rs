//! Resolving the base ref of a run in the (trusted) host repository.

use std::path::Path;

use git2::{ObjectType, Repository};

use crate::GitError;

/// The commit a run starts from, and its tree, as 40-hex ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    pub commit: String,
    pub tree: String,
}

/// Resolves `base_ref` (a branch, tag, full ref or commit id; anything
/// `git rev-parse` accepts) in the repository at `host_repo` to a commit.
/// Annotated tags are peeled to the commit they name.
pub fn resolve_base(host_repo: &Path, base_ref: &str) -> Result<Base, GitError> {
    let repo = open_host(host_repo)?;
    let object = repo
        .revparse_single(base_ref)
        .map_err(|source| GitError::UnknownRef {
            reference: base_ref.to_owned(),
            source,
        })?;
    let kind = object.kind();
    let commit = object
        .peel(ObjectType::Commit)
        .ok()
        .and_then(|o| o.into_commit().ok())
        .ok_or_else(|| GitError::NotACommit {
            reference: base_ref.to_owned(),
            kind: kind.map_or_else(|| "unknown object".to_owned(), |k| k.to_string()),
        })?;
    Ok(Base {
        commit: commit.id().to_string(),
        tree: commit.tree_id().to_string(),
    })
}

/// Which of `names` are entries at the root of the tree of `base_ref`'s
/// commit in the host repository (objects only: no checkout, no worktree).
pub fn root_entries(
    host_repo: &Path,
    base_ref: &str,
    names: &[&str],
) -> Result<Vec<String>, GitError> {
    let base = resolve_base(host_repo, base_ref)?;
    let repo = open_host(host_repo)?;
    let bad = |source| GitError::UnknownRef {
        reference: base_ref.to_owned(),
        source,
    };
    let tree = repo
        .find_tree(git2::Oid::from_str(&base.tree).map_err(bad)?)
        .map_err(bad)?;
    Ok(names
        .iter()
        .filter(|n| tree.get_name(n).is_some())
        .map(|n| (*n).to_owned())
        .collect())
}

/// Opens the host repository at exactly `path` (no search upwards).
pub(crate) fn open_host(path: &Path) -> Result<Repository, GitError> {
    Repository::open(path).map_err(|source| GitError::NotARepository {
        path: path.to_owned(),
        source,
    })
}

/// Parses a full commit id; abbreviations are refused so that a run is always
/// bound to exactly one commit.
pub(crate) fn parse_full_id(id: &str) -> Result<git2::Oid, GitError> {
    let bad = || GitError::InvalidCommitId { id: id.to_owned() };
    if id.len() != 40 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    git2::Oid::from_str(id).map_err(|_| bad())
}
