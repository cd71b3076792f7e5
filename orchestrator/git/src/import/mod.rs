//! Bringing a run's result back into the host repository.
//!
//! The worktree was written by an adversary. Invariants:
//! - it is never opened as a git repository: its config, hooks, attributes,
//!   `.gitmodules` and index are never read; only its object files (through a
//!   bare object database of ours, see [`objects`]), three ref files
//!   ([`refs`]) and its working files ([`observe`]) are read, as data
//!   (`tests/hostile.rs::hostile_worktree_is_read_only_as_data`);
//! - no symlink in it is followed, no FIFO, socket or device in it is opened,
//!   and no file is read past the limits;
//! - every object copied into the host is hash-checked (libgit2's strict hash
//!   verification on read, which we switch on explicitly, and a comparison of
//!   the id the host computes on write with the expected one);
//! - the host repository gains objects and one ref, `refs/nightshift/runs/<id>`.
//!
//! Which commit is "the agent's tip": the branch `.git/HEAD` names when it is a
//! symbolic ref to a valid `refs/heads/...` branch that exists (the agent may
//! have switched branches; its working files then belong to that branch); else
//! the run branch; else, when that vanished too, the base commit. A detached
//! HEAD is not followed: its commits are not imported unless a branch named
//! above holds them, but its working files are still observed.
//!
//! What the worktree holds never sinks the import. When its objects or refs
//! cannot be taken (an object over the limits, a missing or malformed object,
//! a tree git would refuse, `.git` a file or a symlink, a tip naming no
//! commit), the history is dropped and the working files are observed on top
//! of the base commit instead: the result names why ([`HistoryDropped`]).
//! Only a failure on the host's side (its repository missing or locked, a
//! write refused) fails the import, and then nothing was promised: the caller
//! keeps the worktree and may retry
//! (`tests/import.rs::a_committed_object_over_the_size_limit_drops_the_history_not_the_files`,
//! `tests/hostile.rs::a_symlinked_git_dir_or_object_dir_is_refused`,
//! `tests/import.rs::a_locked_host_ref_fails_the_import_and_a_retry_succeeds`,
//! `tests/import.rs::a_missing_host_repository_fails_the_import`).

mod objects;
mod observe;
mod pack;
pub(crate) mod pack_scan;
mod refs;
mod result;

pub use pack::{receive_pack, PackSpec};
pub use pack_scan::{scan_pack, PackLimits, PackScanError, PackSummary};
pub use result::{
    pack_result, take_result, write_base_objects, PackedResult, ResultClaim, ResultSpec,
};

use std::path::Path;

use git2::{DiffOptions, Oid, Repository, Signature};

use crate::base::{open_host, parse_full_id};
use crate::run_id::{result_ref, validate_run_id};
use crate::GitError;

/// Bounds on what an import reads and writes.
///
/// Committed objects and observed files have separate budgets, each bounded by
/// `max_total_bytes`; `max_file_bytes` bounds each object and each file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportLimits {
    /// Largest single file (observed) or object (committed), in bytes.
    pub max_file_bytes: u64,
    /// Most bytes read from working files, and most bytes of new committed objects.
    pub max_total_bytes: u64,
    /// Most working files (regular files and symlinks) taken into the observed tree.
    pub max_files: u64,
    /// Most new committed objects copied into the host.
    pub max_objects: u64,
}

impl Default for ImportLimits {
    fn default() -> Self {
        ImportLimits {
            max_file_bytes: 100 << 20,
            max_total_bytes: 2 << 30,
            max_files: 200_000,
            max_objects: 1_000_000,
        }
    }
}

/// What to import.
#[derive(Debug, Clone, Copy)]
pub struct ImportSpec<'a> {
    pub host_repo: &'a Path,
    pub worktree: &'a Path,
    pub run_id: &'a str,
    /// Full 40-hex id of the run's base commit.
    pub base_commit: &'a str,
    pub limits: ImportLimits,
    /// `(name, email)` of the observed-state commit's author and committer.
    pub committer: (&'a str, &'a str),
    /// Globs of names at the worktree's top left out of the observed
    /// state when the tip does not track them (an agent's own bookkeeping,
    /// e.g. aider's `.aider.chat.history.md`), as `.gitignore` would.
    pub leave_out: &'a [&'a str],
}

/// Where the agent's tip was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TipSource {
    /// The branch `.git/HEAD` pointed at (full ref name).
    HeadBranch(String),
    /// The run branch, `refs/heads/nightshift/run/<id>`.
    RunBranch,
    /// Neither branch existed: the base commit.
    Base,
}

/// Why a path was left out of the observed state (or removed from the
/// worktree's object store before reading it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// Larger than `max_file_bytes`; never read.
    TooLarge { size: u64, limit: u64 },
    /// Reading it would pass `max_total_bytes`.
    TotalBytesExceeded { limit: u64 },
    /// `max_files` files were already taken.
    TooManyFiles { limit: u64 },
    /// A FIFO, socket or device: never opened.
    SpecialFile { kind: &'static str },
    /// A `.git` entry below the top: git trees cannot hold one.
    NestedGitDir,
    /// A name git refuses in a tree.
    InvalidName,
    /// Nested deeper than the walk goes.
    TooDeep { limit: usize },
    /// It could not be read (the error, as text).
    Unreadable { error: String },
    /// An entry of `.git/objects` that could make the object database read
    /// outside the worktree or block (alternates, symlinks, FIFOs, oversized
    /// loose objects); it was deleted from the worktree before reading.
    ObjectStoreEntryRemoved { why: &'static str },
}

/// One path left out, relative to the worktree (lossy UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: String,
    pub why: SkipReason,
}

/// Why the agent's committed history was left out of an import; its working
/// files still came back, observed on top of the base commit. Content-free:
/// a kind, object ids and sizes only (never names the agent chose).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryDropped {
    /// A committed object over `max_file_bytes`.
    ObjectTooLarge {
        object: String,
        size: u64,
        limit: u64,
    },
    /// More than `max_objects` new objects.
    TooManyObjects { limit: u64 },
    /// More than `max_total_bytes` of new objects.
    TotalBytesExceeded { limit: u64 },
    /// An object the tip reaches is not in the worktree's object store (or
    /// cannot be read from it).
    MissingObject { object: String },
    /// An object that does not parse, or whose content does not hash to its id.
    MalformedObject { object: String },
    /// `.git` or its object store is not a real directory (a file, a symlink)
    /// or cannot be read as one.
    HostileGitDir,
    /// The branch the tip was read from is unreadable or names no commit.
    BadTip,
    /// The worktree's object store could not be read.
    Unreadable,
    /// A tree holds an entry git refuses (`..`, `.git`, a `/`, a name given
    /// twice, ...): the commit could make a checkout write outside itself.
    InvalidTreeEntry { tree: String },
    /// Anything else about the worktree's objects that the import refused.
    Refused,
}

impl HistoryDropped {
    /// The reason as a stable word, for the audit and `--json`.
    pub fn kind(&self) -> &'static str {
        match self {
            HistoryDropped::ObjectTooLarge { .. } => "object_too_large",
            HistoryDropped::TooManyObjects { .. } => "too_many_objects",
            HistoryDropped::TotalBytesExceeded { .. } => "total_bytes_exceeded",
            HistoryDropped::MissingObject { .. } => "missing_object",
            HistoryDropped::MalformedObject { .. } => "malformed_object",
            HistoryDropped::HostileGitDir => "hostile_git_dir",
            HistoryDropped::BadTip => "bad_tip",
            HistoryDropped::Unreadable => "unreadable",
            HistoryDropped::InvalidTreeEntry { .. } => "invalid_tree_entry",
            HistoryDropped::Refused => "refused",
        }
    }

    /// The object concerned, when there is one (40 hex).
    pub fn object(&self) -> Option<&str> {
        match self {
            HistoryDropped::ObjectTooLarge { object, .. }
            | HistoryDropped::MissingObject { object }
            | HistoryDropped::MalformedObject { object }
            | HistoryDropped::InvalidTreeEntry { tree: object } => Some(object),
            _ => None,
        }
    }

    /// `(size, limit)` in bytes or objects, when the reason is a limit.
    pub fn figures(&self) -> (Option<u64>, Option<u64>) {
        match self {
            HistoryDropped::ObjectTooLarge { size, limit, .. } => (Some(*size), Some(*limit)),
            HistoryDropped::TooManyObjects { limit }
            | HistoryDropped::TotalBytesExceeded { limit } => (None, Some(*limit)),
            _ => (None, None),
        }
    }

    /// The reason the history was dropped, when `error` (from reading the
    /// worktree's objects and refs) is the worktree's doing; `None` when it is
    /// the host's (a write into the host repository refused), which must fail
    /// the import instead.
    fn from_worktree_error(error: &GitError) -> Option<Self> {
        Some(match error {
            GitError::ObjectTooLarge { id, size, limit } => HistoryDropped::ObjectTooLarge {
                object: id.clone(),
                size: *size,
                limit: *limit,
            },
            GitError::TooManyObjects { limit } => HistoryDropped::TooManyObjects { limit: *limit },
            GitError::TotalBytesExceeded { limit } => {
                HistoryDropped::TotalBytesExceeded { limit: *limit }
            }
            GitError::MissingObject { id, .. } => {
                HistoryDropped::MissingObject { object: id.clone() }
            }
            GitError::MalformedObject { id, .. } => {
                HistoryDropped::MalformedObject { object: id.clone() }
            }
            GitError::ObjectIdMismatch { expected, .. } => HistoryDropped::MalformedObject {
                object: expected.clone(),
            },
            GitError::HostileWorktree { .. } => HistoryDropped::HostileGitDir,
            GitError::InvalidTreeEntry { tree, .. } => {
                HistoryDropped::InvalidTreeEntry { tree: tree.clone() }
            }
            GitError::BadRef { .. } => HistoryDropped::BadTip,
            GitError::Io { .. } => HistoryDropped::Unreadable,
            // libgit2 failing is taken as the host's trouble (a write into
            // the host's object database): the import fails, the worktree is kept.
            GitError::Git { .. } => return None,
            _ => HistoryDropped::Refused,
        })
    }
}

impl std::fmt::Display for HistoryDropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HistoryDropped::ObjectTooLarge {
                object,
                size,
                limit,
            } => write!(
                f,
                "object {object} is {size} bytes, over the {limit}-byte limit"
            ),
            HistoryDropped::TooManyObjects { limit } => {
                write!(f, "more than {limit} new objects")
            }
            HistoryDropped::TotalBytesExceeded { limit } => {
                write!(f, "more than {limit} bytes of new objects")
            }
            HistoryDropped::MissingObject { object } => {
                write!(f, "object {object} is missing from the worktree")
            }
            HistoryDropped::MalformedObject { object } => write!(f, "object {object} is malformed"),
            HistoryDropped::HostileGitDir => {
                write!(f, "the worktree's .git is not a real directory")
            }
            HistoryDropped::BadTip => write!(f, "the agent's branch names no commit"),
            HistoryDropped::Unreadable => write!(f, "the worktree's objects could not be read"),
            HistoryDropped::InvalidTreeEntry { tree } => write!(
                f,
                "tree {tree} holds an entry name git refuses (it could write outside a checkout)"
            ),
            HistoryDropped::Refused => write!(f, "the worktree's objects were refused"),
        }
    }
}

/// What kind of host-side failure made an import fail, as a stable word for
/// the audit: `host_locked` (a lock file of the host repository is held),
/// `host_repository` (the host repository or its base commit is gone),
/// `disk_full`, `io` or `git`.
pub fn import_failure_kind(error: &GitError) -> &'static str {
    match error {
        GitError::NotARepository { .. } | GitError::MissingBase { .. } => "host_repository",
        GitError::Git { source, .. } if source.code() == git2::ErrorCode::Locked => "host_locked",
        GitError::Git { source, .. } if source.message().contains("No space left") => "disk_full",
        GitError::Io { source, .. } if source.raw_os_error() == Some(28) => "disk_full",
        GitError::Io { .. } => "io",
        GitError::ResultRefused { .. }
        | GitError::BadPack { .. }
        | GitError::PackOverLimits { .. }
        | GitError::NotConnected { .. } => "result_refused",
        _ => "git",
    }
}

/// At most this many [`Skipped`] entries are listed; `skipped_total` counts all.
pub const MAX_SKIPPED_LISTED: usize = 1000;

/// The outcome of [`import_run`]. Ids are 40-hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The agent's tip commit (see the module note), or the base (also when
    /// the history was dropped).
    pub agent_tip: String,
    pub tip_source: TipSource,
    /// Committed objects copied into the host repository.
    pub objects_copied: u64,
    /// The observed-state commit, when the working files differed from the tip's tree.
    pub observed_commit: Option<String>,
    /// What `refs/nightshift/runs/<id>` now points at.
    pub result_commit: String,
    pub result_tree: String,
    /// Diffstat from the base commit to the result (blobs, no filters).
    pub files_changed: u64,
    pub insertions: u64,
    pub deletions: u64,
    /// Untracked paths left out because a `.gitignore` matched them.
    pub ignored: u64,
    /// The first [`MAX_SKIPPED_LISTED`] paths left out, with the reason.
    pub skipped: Vec<Skipped>,
    pub skipped_total: u64,
    /// Set when the agent's commits were left out and the working files were
    /// observed on top of the base commit instead.
    pub history_dropped: Option<HistoryDropped>,
}

/// A bounded list of skipped paths.
#[derive(Debug, Default)]
pub(crate) struct SkipList {
    pub(crate) listed: Vec<Skipped>,
    pub(crate) total: u64,
}

impl SkipList {
    pub(crate) fn push(&mut self, path: String, why: SkipReason) {
        self.total += 1;
        if self.listed.len() < MAX_SKIPPED_LISTED {
            self.listed.push(Skipped { path, why });
        }
    }
}

/// Imports the run's result into the host repository; see the module note.
pub fn import_run(spec: &ImportSpec<'_>) -> Result<Imported, GitError> {
    validate_run_id(spec.run_id)?;
    let base = parse_full_id(spec.base_commit)?;
    // This is libgit2's default; set it so that no other code in the process can
    // have turned it off for us.
    git2::opts::strict_hash_verification(true);

    let host = open_host(spec.host_repo)?;
    host.find_commit(base)
        .map_err(|source| GitError::MissingBase {
            id: spec.base_commit.to_owned(),
            repo: spec.host_repo.to_owned(),
            source,
        })?;
    let host_odb = host
        .odb()
        .map_err(|e| GitError::git("opening the host object database", e))?;

    let mut skipped = SkipList::default();
    let history = copy_history(spec, &host_odb, base, &mut skipped);
    let (tip, tip_source, objects_copied, history_dropped) = match history {
        Ok((tip, source, copied)) => (tip, source, copied, None),
        Err(e) => match HistoryDropped::from_worktree_error(&e) {
            Some(why) => (base, TipSource::Base, 0, Some(why)),
            None => return Err(e),
        },
    };

    let tip_commit = host
        .find_commit(tip)
        .map_err(|e| GitError::git(format!("reading imported tip {tip}"), e))?;
    let tip_tree = tip_commit
        .tree()
        .map_err(|e| GitError::git(format!("reading the tree of imported tip {tip}"), e))?;

    let observed = observe::observe(
        &host,
        spec.worktree,
        &tip_tree,
        &spec.limits,
        spec.leave_out,
        &mut skipped,
    )?;

    let (result, result_tree, observed_commit) = if observed.tree == tip_tree.id() {
        (tip, tip_tree.id(), None)
    } else {
        let tree = host
            .find_tree(observed.tree)
            .map_err(|e| GitError::git("reading the observed tree", e))?;
        let sig = Signature::now(spec.committer.0, spec.committer.1)
            .map_err(|e| GitError::git("making the observed-state committer signature", e))?;
        let message = format!("nightshift: observed state of run {}\n", spec.run_id);
        let id = host
            .commit(None, &sig, &sig, &message, &tree, &[&tip_commit])
            .map_err(|e| GitError::git("writing the observed-state commit", e))?;
        (id, tree.id(), Some(id.to_string()))
    };

    let refname = result_ref(spec.run_id);
    host.reference(&refname, result, true, "nightshift: import run")
        .map_err(|e| GitError::git(format!("updating {refname} in the host repository"), e))?;

    let (files_changed, insertions, deletions) = diffstat(&host, base, result_tree)?;
    Ok(Imported {
        agent_tip: tip.to_string(),
        tip_source,
        objects_copied,
        observed_commit,
        result_commit: result.to_string(),
        result_tree: result_tree.to_string(),
        files_changed,
        insertions,
        deletions,
        ignored: observed.ignored,
        skipped: skipped.listed,
        skipped_total: skipped.total,
        history_dropped,
    })
}

/// Reads the agent's tip from the worktree and copies the objects it reaches
/// into the host: `(tip, where it was read, objects copied)`.
fn copy_history(
    spec: &ImportSpec<'_>,
    host_odb: &git2::Odb<'_>,
    base: Oid,
    skipped: &mut SkipList,
) -> Result<(Oid, TipSource, u64), GitError> {
    let wt_odb = objects::open_worktree_odb(spec.worktree, &spec.limits, skipped)?;
    let (tip, tip_source) = refs::resolve_tip(spec.worktree, spec.run_id, &wt_odb, host_odb, base)?;
    let objects_copied =
        objects::copy_reachable(host_odb, &wt_odb, tip, &spec.limits, &mut |id, _| {
            Ok(host_odb.exists(id))
        })?;
    Ok((tip, tip_source, objects_copied))
}

/// Files changed, insertions and deletions from `base` to `commit`, both in
/// the host repository (blobs only: no filters, no textconv).
pub fn diffstat_between(
    host_repo: &Path,
    base: &str,
    commit: &str,
) -> Result<(u64, u64, u64), GitError> {
    let host = open_host(host_repo)?;
    let base = parse_full_id(base)?;
    let commit = parse_full_id(commit)?;
    let tree = host
        .find_commit(commit)
        .map_err(|e| GitError::git(format!("reading commit {commit}"), e))?
        .tree_id();
    diffstat(&host, base, tree)
}

/// A commit an agent asked to act on, copied into the host repository from
/// the pack it sent ([`receive_pack`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    pub commit: String,
    pub tree: String,
    pub objects_copied: u64,
    /// Diffstat from the run's base commit.
    pub files_changed: u64,
    pub insertions: u64,
    pub deletions: u64,
}

/// Tree-to-tree diff in the host repository: blobs only, nothing from the
/// worktree is consulted, binary files count as changed with no lines.
fn diffstat(host: &Repository, base: Oid, result_tree: Oid) -> Result<(u64, u64, u64), GitError> {
    let ctx = "computing the diffstat of the run";
    let base_tree = host
        .find_commit(base)
        .and_then(|c| c.tree())
        .map_err(|e| GitError::git(ctx, e))?;
    let new_tree = host
        .find_tree(result_tree)
        .map_err(|e| GitError::git(ctx, e))?;
    let mut opts = DiffOptions::new();
    opts.include_typechange(true);
    let diff = host
        .diff_tree_to_tree(Some(&base_tree), Some(&new_tree), Some(&mut opts))
        .map_err(|e| GitError::git(ctx, e))?;
    let stats = diff.stats().map_err(|e| GitError::git(ctx, e))?;
    Ok((
        stats.files_changed() as u64,
        stats.insertions() as u64,
        stats.deletions() as u64,
    ))
}
