//! Creating and removing a run's worktree.
//!
//! Invariants of a created worktree:
//! - its `.git` is a fresh repository written by us: a config of four core
//!   keys, `HEAD` on `refs/heads/nightshift/run/<id>`, no hooks, no remotes, no
//!   alternates, no `gitdir` file; nothing in it names the host repository;
//! - its objects are exactly those reachable from the base commit (the
//!   commit, its ancestors, their trees and blobs), written by us as new pack
//!   files (see [`crate::reachable`]): no other branch, tag, stash, reflog
//!   entry or unreachable object of the host is readable in the sandbox, and
//!   no file is shared with the host's object store;
//! - a later worktree of the same base (and shallow boundary) copies the
//!   history pack the first one kept (`WorktreeSpec::history_cache`, an
//!   entry written whole before any sandbox existed), never links it: what
//!   a sandbox writes to its own pack reaches neither the cache nor another
//!   run (`tests/worktree.rs::a_second_worktree_of_a_base_copies_its_history_from_the_cache`);
//! - the checkout is the base tree's blobs written verbatim (no filters), and
//!   the index matches the files' final stat data, so `git status` is clean
//!   (see [`crate::checkout`]).
//!
//! The history is packed by the host's `git pack-objects` from exactly the
//! reachable ids, reusing its compressed objects and deltas (see
//! [`crate::reachable`]), so a long history costs about its own pack size;
//! the checkout writes the base tree's blobs (docs/benchmarks.md).

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use git2::Repository;

use crate::base::{open_host, parse_full_id};
use crate::run_id::{run_branch, validate_run_id};
use crate::GitError;

/// What to create.
#[derive(Debug, Clone)]
pub struct WorktreeSpec {
    pub host_repo: PathBuf,
    /// Full 40-hex id of the base commit (see [`crate::resolve_base`]).
    pub base_commit: String,
    pub run_id: String,
    /// Must not exist (its parent must), or be an empty directory (the
    /// mount point of the run's own filesystem, which the caller made and
    /// removes).
    pub dest: PathBuf,
    /// When set, every file and directory of the worktree is given to this
    /// `uid:gid` so that the sandbox's user can write it.
    pub owner: Option<(u32, u32)>,
    /// Where the history packs of earlier worktrees are kept by base commit
    /// (the supervisor's `STATE/cache/history`): a later worktree of the
    /// same base copies its history from there instead of walking and
    /// packing it again. `None`: every worktree packs its own.
    pub history_cache: Option<PathBuf>,
}

/// How many bases' histories [`WorktreeSpec::history_cache`] keeps; the
/// least recently made go first.
pub const HISTORY_CACHE_ENTRIES: usize = 8;

/// A created worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worktree {
    pub path: PathBuf,
    /// Full ref name of the run branch, `refs/heads/nightshift/run/<id>`.
    pub branch: String,
    pub base_commit: String,
    pub base_tree: String,
}

const CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n";

/// Creates the run's worktree at `spec.dest`. On failure the partly created
/// destination is removed.
pub fn create_worktree(spec: &WorktreeSpec) -> Result<Worktree, GitError> {
    validate_run_id(&spec.run_id)?;
    let base = parse_full_id(&spec.base_commit)?;
    let host = open_host(&spec.host_repo)?;
    let base_tree = host
        .find_commit(base)
        .map_err(|source| GitError::MissingBase {
            id: spec.base_commit.clone(),
            repo: spec.host_repo.clone(),
            source,
        })?
        .tree_id();

    let dest = &spec.dest;
    // An empty directory is the mount point of the run's own filesystem,
    // made for it by the supervisor; anything else there is refused.
    let prepared = match fs::symlink_metadata(dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Ok(m) if m.file_type().is_dir() && is_empty_dir(dest)? => true,
        Ok(_) => {
            return Err(GitError::BadDestination {
                path: dest.clone(),
                why: "it already exists",
            })
        }
        Err(e) => return Err(GitError::io("checking worktree destination", dest, e)),
    };
    let parent_ok = dest
        .parent()
        .map(|p| p.as_os_str().is_empty() || p.is_dir())
        .unwrap_or(false);
    if !parent_ok {
        return Err(GitError::BadDestination {
            path: dest.clone(),
            why: "its parent directory does not exist",
        });
    }
    // create_dir (not create_dir_all) fails if something appeared meanwhile.
    if !prepared {
        fs::create_dir(dest).map_err(|e| GitError::io("creating worktree directory", dest, e))?;
    }

    let branch = run_branch(&spec.run_id);
    let result = populate(&host, spec, base, &branch);
    drop(host);
    if let Err(e) = result {
        let _ = remove_worktree(dest);
        return Err(e);
    }
    Ok(Worktree {
        path: dest.clone(),
        branch,
        base_commit: base.to_string(),
        base_tree: base_tree.to_string(),
    })
}

fn populate(
    host: &Repository,
    spec: &WorktreeSpec,
    base: git2::Oid,
    branch: &str,
) -> Result<(), GitError> {
    let dest = &spec.dest;
    let gitdir = dest.join(".git");
    let objects = gitdir.join("objects");
    for dir in [
        objects.join("pack"),
        objects.join("info"),
        gitdir.join("refs/heads"),
        gitdir.join("refs/tags"),
    ] {
        fs::create_dir_all(&dir)
            .map_err(|e| GitError::io("creating worktree git directory", &dir, e))?;
    }
    write_file(&gitdir.join("config"), CONFIG.as_bytes())?;
    write_file(&gitdir.join("HEAD"), format!("ref: {branch}\n").as_bytes())?;

    let host_common = host.commondir().to_owned();
    let shallow = read_shallow(&host_common.join("shallow"))?;
    let host_objects = host_common.join("objects");
    let pack_dir = objects.join("pack");
    let host_odb = host
        .odb()
        .map_err(|e| GitError::git("opening the host object database", e))?;
    // Commits, trees and older blobs now (from the cache when an earlier
    // worktree of this base left them there); the base tree's blobs as the
    // checkout reads them.
    let cached = spec
        .history_cache
        .as_deref()
        .map(|cache| cache.join(history_key(base, &shallow)));
    let from_cache = match &cached {
        Some(entry) => match copy_history(entry, &pack_dir, &gitdir) {
            Ok(copied) => copied,
            // An entry removed while it was copied (another process pruned
            // it): what was copied goes, and the history is packed here.
            Err(_) => {
                for (_, path) in entry_files(&pack_dir).unwrap_or_default() {
                    let _ = fs::remove_file(path);
                }
                let _ = fs::remove_file(gitdir.join("shallow"));
                false
            }
        },
        None => false,
    };
    if !from_cache {
        let reachable = crate::reachable::reachable_objects(host, base, &shallow)?;
        if !crate::reachable::write_pack_reusing(&host_common, &reachable.rest, &gitdir)? {
            crate::reachable::write_pack_of(&host_odb, &reachable.rest, &pack_dir, "history")?;
        }
        // Only the shallow commits this history holds: the file names commits.
        let held: HashSet<&git2::Oid> = if shallow.is_empty() {
            HashSet::new()
        } else {
            reachable.rest.iter().collect()
        };
        let kept: String = shallow
            .iter()
            .filter(|id| held.contains(id))
            .map(|id| format!("{id}\n"))
            .collect();
        if !kept.is_empty() {
            write_file(&gitdir.join("shallow"), kept.as_bytes())?;
        }
        if let Some(entry) = &cached {
            keep_history(entry, &pack_dir, &gitdir);
        }
    }

    let repo = Repository::open(dest)
        .map_err(|e| GitError::git(format!("opening new worktree {}", dest.display()), e))?;
    repo.reference(branch, base, true, "nightshift: run branch at base")
        .map_err(|e| GitError::git(format!("creating branch {branch} in the worktree"), e))?;
    let base_tree = repo
        .find_commit(base)
        .map_err(|e| GitError::git(format!("reading base commit {base} in the new worktree"), e))?
        .tree_id();
    crate::checkout::checkout(
        &repo,
        &host_odb,
        dest,
        base_tree,
        spec.owner,
        &host_objects,
        &pack_dir,
    )?;

    if let Some((uid, gid)) = spec.owner {
        // The checkout gave its files away as it wrote them; what is left is
        // the top directory and `.git`.
        std::os::unix::fs::lchown(dest, Some(uid), Some(gid))
            .map_err(|e| GitError::io("changing owner of", dest, e))?;
        chown_tree(&gitdir, uid, gid)?;
    }
    Ok(())
}

/// The cache entry's name for a base: its id, and the host's shallow
/// boundary when it has one (the history it reaches depends on both).
fn history_key(base: git2::Oid, shallow: &HashSet<git2::Oid>) -> String {
    if shallow.is_empty() {
        return base.to_string();
    }
    let mut ids: Vec<String> = shallow.iter().map(|id| id.to_string()).collect();
    ids.sort();
    let digest = git2::Oid::hash_object(git2::ObjectType::Blob, ids.join("\n").as_bytes())
        .map(|id| id.to_string())
        .unwrap_or_default();
    format!("{base}-shallow-{digest}")
}

/// The regular files of a cache entry's folder, by name (nothing else in
/// it is taken: the entries are ours, written before any sandbox existed).
fn entry_files(dir: &Path) -> io::Result<Vec<(std::ffi::OsString, PathBuf)>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            files.push((entry.file_name(), entry.path()));
        }
    }
    Ok(files)
}

/// Copies a cached history (its packs, and its `shallow` file if any) into
/// a new worktree: copies, never links, so that nothing a sandbox writes
/// reaches the cache or another run
/// (`tests/worktree.rs::a_second_worktree_of_a_base_copies_its_history_from_the_cache`).
/// False when the base has no entry.
fn copy_history(entry: &Path, pack_dir: &Path, gitdir: &Path) -> Result<bool, GitError> {
    let packs = entry.join("pack");
    let files = match entry_files(&packs) {
        Ok(files) if !files.is_empty() => files,
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(GitError::io("reading the history cache", &packs, e)),
    };
    for (name, from) in files {
        let to = pack_dir.join(name);
        fs::copy(&from, &to).map_err(|e| GitError::io("copying a cached history", &from, e))?;
    }
    let shallow = entry.join("shallow");
    if shallow.is_file() {
        fs::copy(&shallow, gitdir.join("shallow"))
            .map_err(|e| GitError::io("copying a cached history", &shallow, e))?;
    }
    Ok(true)
}

/// Keeps a worktree's freshly written history (its pack folder holds only
/// that yet) as the cache entry of its base: written under a temporary
/// name and renamed into place, so a reader sees a whole entry or none;
/// then the oldest entries past [`HISTORY_CACHE_ENTRIES`] are removed. A
/// cache that cannot be written costs the next worktree its own packing,
/// nothing else.
fn keep_history(entry: &Path, pack_dir: &Path, gitdir: &Path) {
    let Some(cache) = entry.parent() else { return };
    let tmp = cache.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let written = (|| -> io::Result<()> {
        fs::create_dir_all(cache)?;
        fs::set_permissions(cache, fs::Permissions::from_mode(0o700))?;
        fs::create_dir_all(tmp.join("pack"))?;
        for (name, from) in entry_files(pack_dir)? {
            fs::copy(&from, tmp.join("pack").join(name))?;
        }
        let shallow = gitdir.join("shallow");
        if shallow.is_file() {
            fs::copy(&shallow, tmp.join("shallow"))?;
        }
        fs::rename(&tmp, entry)
    })();
    if written.is_err() {
        // Another worktree of the base kept it first, or the disk said no.
        let _ = fs::remove_dir_all(&tmp);
        return;
    }
    prune_history(cache);
}

/// Removes the least recently made entries past [`HISTORY_CACHE_ENTRIES`].
fn prune_history(cache: &Path) {
    let Ok(dir) = fs::read_dir(cache) else { return };
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = dir
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if entries.len() <= HISTORY_CACHE_ENTRIES {
        return;
    }
    entries.sort();
    for (_, path) in &entries[..entries.len() - HISTORY_CACHE_ENTRIES] {
        let _ = fs::remove_dir_all(path);
    }
}

fn is_empty_dir(path: &Path) -> Result<bool, GitError> {
    let mut entries =
        fs::read_dir(path).map_err(|e| GitError::io("checking worktree destination", path, e))?;
    Ok(entries.next().is_none())
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), GitError> {
    fs::write(path, data).map_err(|e| GitError::io("writing worktree file", path, e))
}

/// The commits the host's `shallow` file names (none when it has none).
fn read_shallow(path: &Path) -> Result<HashSet<git2::Oid>, GitError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(e) => return Err(GitError::io("reading the host's shallow file", path, e)),
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            git2::Oid::from_str(l).map_err(|e| {
                GitError::git(
                    format!("reading the host's shallow file {}", path.display()),
                    e,
                )
            })
        })
        .collect()
}

/// Gives everything under `root` (which we created) to `uid:gid`, without
/// following symlinks.
fn chown_tree(root: &Path, uid: u32, gid: u32) -> Result<(), GitError> {
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))
            .map_err(|e| GitError::io("changing owner of", &dir, e))?;
        let entries = fs::read_dir(&dir).map_err(|e| GitError::io("listing", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| GitError::io("listing", &dir, e))?;
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|e| GitError::io("inspecting", &path, e))?;
            if kind.is_dir() {
                stack.push(path);
            } else {
                std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                    .map_err(|e| GitError::io("changing owner of", &path, e))?;
            }
        }
    }
    Ok(())
}

/// Removes the worktree at `path` entirely, without following any symlink in
/// it, also when the sandbox made directories read-only. A path that does not
/// exist is already removed; a path that is not a directory is refused.
pub fn remove_worktree(path: &Path) -> Result<(), GitError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(GitError::io("inspecting worktree", path, e)),
        Ok(m) if !m.file_type().is_dir() => {
            return Err(GitError::BadDestination {
                path: path.to_owned(),
                why: "not a directory (a symlink is never followed)",
            })
        }
        Ok(_) => {}
    }
    make_dirs_writable(path);
    // std's remove_dir_all works with openat/unlinkat on descriptors opened with
    // O_NOFOLLOW, so it never leaves the tree through a symlink.
    fs::remove_dir_all(path).map_err(|e| GitError::io("removing worktree", path, e))
}

/// Adds u+rwx to every real directory under `root`. Best effort: as root it is
/// not needed for the removal, and any real failure shows in the removal.
/// `set_permissions` follows symlinks, so it is only called on paths that
/// `lstat` reported as directories, in a tree no sandbox is running in.
fn make_dirs_writable(root: &Path) {
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.file_type().is_dir() {
            continue;
        }
        let mode = meta.permissions().mode();
        if mode & 0o700 != 0o700 {
            let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(mode | 0o700));
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(entry.path());
            }
        }
    }
}
