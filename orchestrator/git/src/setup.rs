//! What the setup phase (docs/setup.md) reads of the host repository, as
//! objects only: the lockfiles of a commit (for the cache key), whether an
//! owner's ref reaches a commit (else it is a tree only an agent wrote),
//! and which lockfiles changed between two commits (the agent changed its
//! dependencies). The host repository is trusted; nothing here checks out
//! or runs anything (`tests/tests/setup.rs::a_rust_repository_tests_offline_from_its_cache_and_the_next_run_skips_setup`).

use std::path::Path;

use git2::{ObjectType, Oid, TreeWalkMode, TreeWalkResult};

use crate::base::{open_host, parse_full_id};
use crate::GitError;

/// The blobs of `commit`'s tree whose path `is_lockfile` accepts (any
/// depth), with their content, in path order. A blob over `max_bytes` is
/// an error naming it.
pub fn lockfiles_at(
    host_repo: &Path,
    commit: &str,
    is_lockfile: &dyn Fn(&str) -> bool,
    max_bytes: u64,
) -> Result<Vec<(String, Vec<u8>)>, GitError> {
    let repo = open_host(host_repo)?;
    let id = parse_full_id(commit)?;
    let tree = repo
        .find_commit(id)
        .and_then(|c| c.tree())
        .map_err(|e| GitError::git(format!("reading the tree of {commit}"), e))?;
    let mut found: Vec<(String, Oid)> = Vec::new();
    tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(ObjectType::Blob) {
            if let Ok(name) = entry.name() {
                let path = format!("{dir}{name}");
                if is_lockfile(&path) {
                    found.push((path, entry.id()));
                }
            }
        }
        TreeWalkResult::Ok
    })
    .map_err(|e| GitError::git(format!("walking the tree of {commit}"), e))?;
    found.sort();
    let mut out = Vec::with_capacity(found.len());
    for (path, oid) in found {
        let blob = repo
            .find_blob(oid)
            .map_err(|e| GitError::git(format!("reading {path} at {commit}"), e))?;
        if blob.size() as u64 > max_bytes {
            return Err(GitError::git(
                format!("reading {path} at {commit}"),
                git2::Error::from_str(&format!(
                    "the lockfile is {} bytes, over the {max_bytes} the setup reads",
                    blob.size()
                )),
            ));
        }
        out.push((path, blob.content().to_vec()));
    }
    Ok(out)
}

/// Does a ref the owner keeps (any ref outside `refs/nightshift/`) point at
/// `commit` or at a descendant of it? When none does, only an agent's
/// result reaches the commit.
pub fn owner_reaches(host_repo: &Path, commit: &str) -> Result<bool, GitError> {
    let repo = open_host(host_repo)?;
    let id = parse_full_id(commit)?;
    let refs = repo
        .references()
        .map_err(|e| GitError::git("listing the host's refs", e))?;
    for r in refs.flatten() {
        let Ok(name) = r.name() else { continue };
        if name.starts_with("refs/nightshift/") {
            continue;
        }
        let Ok(tip) = r.peel_to_commit() else {
            continue;
        };
        if tip.id() == id
            || repo
                .graph_descendant_of(tip.id(), id)
                .map_err(|e| GitError::git(format!("walking history from {name}"), e))?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The paths `is_lockfile` accepts whose blob differs between the trees
/// of `from` and `to` (added, removed or changed), in path order.
pub fn changed_lockfiles(
    host_repo: &Path,
    from: &str,
    to: &str,
    is_lockfile: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, GitError> {
    let repo = open_host(host_repo)?;
    let tree = |c: &str| -> Result<git2::Tree<'_>, GitError> {
        let id = parse_full_id(c)?;
        repo.find_commit(id)
            .and_then(|c| c.tree())
            .map_err(|e| GitError::git(format!("reading the tree of {c}"), e))
    };
    let (a, b) = (tree(from)?, tree(to)?);
    let diff = repo
        .diff_tree_to_tree(Some(&a), Some(&b), None)
        .map_err(|e| GitError::git(format!("comparing {from} and {to}"), e))?;
    let mut out: Vec<String> = diff
        .deltas()
        .flat_map(|d| [d.old_file().path(), d.new_file().path()])
        .flatten()
        .filter_map(|p| p.to_str().map(str::to_string))
        .filter(|p| is_lockfile(p))
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}
