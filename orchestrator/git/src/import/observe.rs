//! Turning the worktree's working files into a tree in the host repository.
//!
//! Invariants:
//! - the walk uses `read_dir` and `lstat` only, descends only into real
//!   directories, and never goes through a symlink: a symlink becomes a git
//!   symlink entry whose blob is its link text (`readlink`), never its target
//!   (`tests/hostile.rs::hostile_worktree_is_read_only_as_data`);
//! - a regular file is opened with `O_NOFOLLOW | O_NONBLOCK` and read only after
//!   `fstat` on the open descriptor says it is regular and within the limits;
//!   FIFOs, sockets and devices are never opened
//!   (`tests/hostile.rs::hostile_worktree_is_read_only_as_data`,
//!   `tests/hostile.rs::special_ref_files_neither_hang_nor_are_followed`);
//! - modes are git's: 100755 when the owner may execute, else 100644;
//!   setuid, setgid and sticky bits are dropped;
//! - `.gitignore` files are read the same way (never through a symlink) and
//!   only leave out *untracked* paths: a path the tip's tree holds is always
//!   observed, as git does (`tests/import.rs::gitignore_leaves_out_untracked_paths_only`;
//!   a FIFO as `.gitignore`: `tests/hostile.rs::hostile_worktree_is_read_only_as_data`);
//! - `.git` at the top is the repository and is skipped; a `.git` anywhere
//!   below is skipped and listed (git trees cannot hold one); so is every
//!   other name git refuses in a tree ([`crate::tree_names::check_name`]:
//!   `git~1`, `.git ` and the other NTFS/HFS+ aliases of `.git`), so the
//!   observed tree never holds a name a checkout would refuse
//!   (`tests/hostile.rs::nested_git_dirs_and_deep_trees_are_skipped_not_followed`,
//!   `tree_names::tests::ntfs_aliases_of_dotgit_are_refused`,
//!   `tree_names::tests::hfs_aliases_of_dotgit_are_refused`);
//! - a path left out (limits, special file, unreadable, too deep) that the
//!   tip's tree holds keeps the tip's entry, so that "not observed" never reads
//!   as "deleted"; an untracked one is simply absent; both are listed. A kept
//!   entry that is a tree is first checked whole (every tree under it, as
//!   [`crate::tree_names::parse_tree`] does): one git would refuse is dropped
//!   and listed, never kept
//!   (`tests/import.rs::observed_files_past_the_limits_are_skipped_and_listed`,
//!   `tests/hostile_trees.rs::observed_state_never_keeps_a_hostile_tip_tree`);
//! - a submodule (gitlink) of the tip's tree is kept as the tip has it: its
//!   directory is not read;
//! - names at the top matching `ImportSpec::leave_out` (an agent's own
//!   bookkeeping) are left out like ignored paths, and only when untracked
//!   (`tests/import.rs::an_agents_bookkeeping_stays_out_unless_tracked`).
//!
//! Nothing the worktree holds is trusted as a cache: every file is read and
//! hashed, since the index and mtimes are the agent's to forge.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use git2::{ObjectType, Odb, Oid, Repository, Tree};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;

use super::{ImportLimits, SkipList, SkipReason};
use crate::fsx::{open_nofollow, read_capped, read_open_capped, Capped};
use crate::tree_names::{self, check_name, EntryKind};
use crate::GitError;

/// Deepest directory nesting walked; deeper directories are skipped and listed.
pub(crate) const MAX_DEPTH: usize = 256;
const MAX_GITIGNORE_BYTES: u64 = 1 << 20;

const MODE_TREE: i32 = 0o040000;
const MODE_BLOB: i32 = 0o100644;
const MODE_EXEC: i32 = 0o100755;
const MODE_LINK: i32 = 0o120000;
const MODE_GITLINK: i32 = 0o160000;

/// What walking one directory gave.
enum Built {
    Tree(Oid),
    /// Nothing git would record (an empty or all-ignored directory).
    Empty,
    /// The directory could not be listed (and was listed as skipped).
    Unread,
}

pub(super) struct Observed {
    pub(super) tree: Oid,
    pub(super) ignored: u64,
}

struct Walker<'a> {
    host: &'a Repository,
    odb: Odb<'a>,
    limits: ImportLimits,
    files: u64,
    bytes: u64,
    ignored: u64,
    skipped: &'a mut SkipList,
    ignores: Vec<Gitignore>,
    /// `ImportSpec::leave_out`, rooted at the worktree's top.
    leave_out: Option<Gitignore>,
    /// Tip trees found to hold only entries git would check out.
    clean_trees: HashSet<Oid>,
}

/// Builds the tree of the worktree's working files in the host repository.
pub(super) fn observe(
    host: &Repository,
    worktree: &Path,
    tip_tree: &Tree<'_>,
    limits: &ImportLimits,
    leave_out: &[&str],
    skipped: &mut SkipList,
) -> Result<Observed, GitError> {
    let leave_out = match leave_out.is_empty() {
        true => None,
        false => {
            let mut builder = GitignoreBuilder::new(worktree);
            for glob in leave_out {
                builder.add_line(None, &format!("/{glob}")).map_err(|e| {
                    GitError::HostileWorktree {
                        path: worktree.to_owned(),
                        why: format!("left-out name {glob:?}: {e}"),
                    }
                })?;
            }
            Some(builder.build().map_err(|e| GitError::HostileWorktree {
                path: worktree.to_owned(),
                why: format!("left-out names: {e}"),
            })?)
        }
    };
    let odb = host
        .odb()
        .map_err(|e| GitError::git("opening the host object database", e))?;
    let mut walker = Walker {
        host,
        odb,
        limits: *limits,
        files: 0,
        bytes: 0,
        ignored: 0,
        skipped,
        ignores: Vec::new(),
        leave_out,
        clean_trees: HashSet::new(),
    };
    let tree = match walker.dir(worktree, "", 0, Some(tip_tree), false)? {
        Built::Tree(tree) => tree,
        Built::Unread => {
            return Err(GitError::HostileWorktree {
                path: worktree.to_owned(),
                why: "its top directory cannot be listed".to_owned(),
            })
        }
        Built::Empty => host
            .treebuilder(None)
            .and_then(|b| b.write())
            .map_err(|e| GitError::git("writing the empty observed tree", e))?,
    };
    Ok(Observed {
        tree,
        ignored: walker.ignored,
    })
}

impl Walker<'_> {
    fn skip(&mut self, rel: &str, why: SkipReason) {
        self.skipped.push(rel.to_owned(), why);
    }

    /// True when a `.gitignore` on the way leaves `path` out.
    fn is_ignored(&self, path: &Path, is_dir: bool) -> bool {
        for gi in self.ignores.iter().rev() {
            match gi.matched(path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }

    fn load_gitignore(&self, dir: &Path) -> Option<Gitignore> {
        let path = dir.join(".gitignore");
        let data = match read_capped(&path, MAX_GITIGNORE_BYTES) {
            Ok(Capped::Data(d)) => d,
            // A symlinked, special or oversized .gitignore is not read; the file
            // itself is still observed (or skipped) like any other entry.
            _ => return None,
        };
        let mut builder = GitignoreBuilder::new(dir);
        for line in String::from_utf8_lossy(&data).lines() {
            // A pattern the glob engine refuses is dropped, as git drops it.
            let _ = builder.add_line(Some(path.clone()), line);
        }
        builder.build().ok()
    }

    /// Builds the tree of directory `abs` (`rel` from the top), or `None` when
    /// it holds nothing git would record.
    fn dir(
        &mut self,
        abs: &Path,
        rel: &str,
        depth: usize,
        tracked: Option<&Tree<'_>>,
        in_ignored: bool,
    ) -> Result<Built, GitError> {
        let listed: std::io::Result<Vec<OsString>> = fs::read_dir(abs)
            .and_then(|entries| entries.map(|e| e.map(|e| e.file_name())).collect());
        let mut names = match listed {
            Ok(names) => names,
            Err(e) => {
                self.skip(
                    rel,
                    SkipReason::Unreadable {
                        error: e.to_string(),
                    },
                );
                return Ok(Built::Unread);
            }
        };
        // Sorted so that which paths the limits leave out does not depend on
        // the order the file system lists them in.
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));

        let pushed = match self.load_gitignore(abs) {
            Some(gi) => {
                self.ignores.push(gi);
                true
            }
            None => false,
        };
        let result = self.entries(abs, rel, depth, tracked, in_ignored, &names);
        if pushed {
            self.ignores.pop();
        }
        result
    }

    fn entries(
        &mut self,
        abs: &Path,
        rel: &str,
        depth: usize,
        tracked: Option<&Tree<'_>>,
        in_ignored: bool,
        names: &[OsString],
    ) -> Result<Built, GitError> {
        let mut builder = self
            .host
            .treebuilder(None)
            .map_err(|e| GitError::git("making a tree builder in the host repository", e))?;
        for name in names {
            let name_bytes = name.as_bytes();
            let path = abs.join(name);
            let child_rel = if rel.is_empty() {
                name.to_string_lossy().into_owned()
            } else {
                format!("{rel}/{}", name.to_string_lossy())
            };
            if name_bytes.eq_ignore_ascii_case(b".git") {
                if !(depth == 0 && name_bytes == b".git") {
                    self.skip(&child_rel, SkipReason::NestedGitDir);
                }
                continue;
            }
            if check_name(name_bytes).is_err() {
                self.skip(&child_rel, SkipReason::InvalidName);
                continue;
            }
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    self.skip(
                        &child_rel,
                        SkipReason::Unreadable {
                            error: e.to_string(),
                        },
                    );
                    continue;
                }
            };
            let kind = meta.file_type();
            let tracked_entry = tracked
                .and_then(|t| t.get_name_bytes(name_bytes))
                .map(|e| (e.id(), e.filemode(), e.kind()));
            let is_tracked = tracked_entry.is_some();
            // A tracked path that is skipped (limits, special file, unreadable)
            // keeps the tip's entry: "not observed" must not read as "deleted"
            // (unless that entry is a tree git would refuse, see below).
            let kept = tracked_entry.map(|(id, mode, _)| (id, mode));
            let skipped_before = self.skipped.total;
            let matches_ignore = self.is_ignored(&path, kind.is_dir())
                || (depth == 0
                    && self
                        .leave_out
                        .as_ref()
                        .is_some_and(|g| g.matched(&path, kind.is_dir()).is_ignore()));
            let ignored = !is_tracked && (in_ignored || matches_ignore);

            let entry: Option<(Oid, i32)> = if kind.is_dir() {
                if let Some((id, MODE_GITLINK, _)) = tracked_entry {
                    Some((id, MODE_GITLINK))
                } else if ignored {
                    self.ignored += 1;
                    None
                } else if depth + 1 >= MAX_DEPTH {
                    self.skip(&child_rel, SkipReason::TooDeep { limit: MAX_DEPTH });
                    kept
                } else {
                    let sub = match tracked_entry {
                        Some((id, _, Some(ObjectType::Tree))) => Some(
                            self.host
                                .find_tree(id)
                                .map_err(|e| GitError::git(format!("reading tip tree {id}"), e))?,
                        ),
                        _ => None,
                    };
                    match self.dir(
                        &path,
                        &child_rel,
                        depth + 1,
                        sub.as_ref(),
                        in_ignored || matches_ignore,
                    )? {
                        Built::Tree(id) => Some((id, MODE_TREE)),
                        Built::Empty => None,
                        Built::Unread => kept,
                    }
                }
            } else if ignored {
                self.ignored += 1;
                None
            } else if kind.is_symlink() {
                self.symlink(&path, &child_rel)?.map(|id| (id, MODE_LINK))
            } else if kind.is_file() {
                let mode = if meta.permissions().mode() & 0o100 != 0 {
                    MODE_EXEC
                } else {
                    MODE_BLOB
                };
                self.file(&path, &child_rel, meta.len())?
                    .map(|id| (id, mode))
            } else {
                let what = if kind.is_fifo() {
                    "fifo"
                } else if kind.is_socket() {
                    "socket"
                } else if kind.is_char_device() {
                    "character device"
                } else if kind.is_block_device() {
                    "block device"
                } else {
                    "unknown file type"
                };
                self.skip(&child_rel, SkipReason::SpecialFile { kind: what });
                None
            };
            let entry = match entry {
                None if !kind.is_dir() && self.skipped.total > skipped_before => kept,
                other => other,
            };
            // The tip's tree may have reached the host unchecked (it was there
            // already); an entry of it is kept only when a checkout would take it.
            let entry = match entry {
                Some((id, MODE_TREE))
                    if self.skipped.total > skipped_before
                        && entry == kept
                        && !self.tree_is_clean(id)? =>
                {
                    self.skip(&child_rel, SkipReason::InvalidName);
                    None
                }
                other => other,
            };
            if let Some((id, mode)) = entry {
                if builder.insert(name_bytes, id, mode).is_err() {
                    self.skip(&child_rel, SkipReason::InvalidName);
                }
            }
        }
        if builder.is_empty() {
            return Ok(Built::Empty);
        }
        builder
            .write()
            .map(Built::Tree)
            .map_err(|e| GitError::git(format!("writing the observed tree of {rel:?}"), e))
    }

    /// True when every tree under `id` (itself included) passes
    /// [`tree_names::parse_tree`]; trees already found clean are remembered.
    fn tree_is_clean(&mut self, id: Oid) -> Result<bool, GitError> {
        let mut stack = vec![id];
        let mut visited = Vec::new();
        while let Some(tree) = stack.pop() {
            if self.clean_trees.contains(&tree) {
                continue;
            }
            let object = self
                .odb
                .read(tree)
                .map_err(|e| GitError::git(format!("reading tip tree {tree}"), e))?;
            match tree_names::parse_tree(object.data()) {
                Ok(entries) => stack.extend(
                    entries
                        .iter()
                        .filter(|e| e.kind == EntryKind::Tree)
                        .map(|e| e.id),
                ),
                Err(_) => return Ok(false),
            }
            visited.push(tree);
        }
        self.clean_trees.extend(visited);
        Ok(true)
    }

    /// Takes one file slot, or says why not.
    fn take_slot(&mut self, rel: &str, size: u64) -> bool {
        let l = self.limits;
        if self.files >= l.max_files {
            self.skip(rel, SkipReason::TooManyFiles { limit: l.max_files });
            return false;
        }
        if size > l.max_file_bytes {
            self.skip(
                rel,
                SkipReason::TooLarge {
                    size,
                    limit: l.max_file_bytes,
                },
            );
            return false;
        }
        if self.bytes.saturating_add(size) > l.max_total_bytes {
            self.skip(
                rel,
                SkipReason::TotalBytesExceeded {
                    limit: l.max_total_bytes,
                },
            );
            return false;
        }
        true
    }

    fn symlink(&mut self, path: &Path, rel: &str) -> Result<Option<Oid>, GitError> {
        let target = match fs::read_link(path) {
            Ok(t) => t,
            Err(e) => {
                self.skip(
                    rel,
                    SkipReason::Unreadable {
                        error: e.to_string(),
                    },
                );
                return Ok(None);
            }
        };
        let data = target.as_os_str().as_bytes();
        if !self.take_slot(rel, data.len() as u64) {
            return Ok(None);
        }
        self.files += 1;
        self.bytes += data.len() as u64;
        self.blob(data).map(Some)
    }

    fn file(&mut self, path: &Path, rel: &str, size: u64) -> Result<Option<Oid>, GitError> {
        if !self.take_slot(rel, size) {
            return Ok(None);
        }
        let remaining = self.limits.max_total_bytes - self.bytes;
        let cap = self.limits.max_file_bytes.min(remaining);
        let read = open_nofollow(path).and_then(|f| read_open_capped(f, cap));
        let data = match read {
            Ok(Capped::Data(d)) => d,
            Ok(Capped::TooLarge(size)) => {
                self.skip(
                    rel,
                    SkipReason::TooLarge {
                        size,
                        limit: self.limits.max_file_bytes,
                    },
                );
                return Ok(None);
            }
            Ok(Capped::NotRegular | Capped::Missing) => {
                self.skip(
                    rel,
                    SkipReason::SpecialFile {
                        kind: "not a regular file when opened",
                    },
                );
                return Ok(None);
            }
            Err(e) => {
                self.skip(
                    rel,
                    SkipReason::Unreadable {
                        error: e.to_string(),
                    },
                );
                return Ok(None);
            }
        };
        self.files += 1;
        self.bytes += data.len() as u64;
        self.blob(&data).map(Some)
    }

    /// Stores `data` as a blob in the host unless it is there already.
    fn blob(&self, data: &[u8]) -> Result<Oid, GitError> {
        let id = Oid::hash_object(ObjectType::Blob, data)
            .map_err(|e| GitError::git("hashing an observed file", e))?;
        if self.odb.exists(id) {
            return Ok(id);
        }
        let written = self
            .odb
            .write(ObjectType::Blob, data)
            .map_err(|e| GitError::git("writing an observed file into the host repository", e))?;
        if written != id {
            return Err(GitError::ObjectIdMismatch {
                expected: id.to_string(),
                written: written.to_string(),
            });
        }
        Ok(id)
    }
}
