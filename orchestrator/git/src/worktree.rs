//! Creating and removing a run's worktree.
//!
//! Invariants of a created worktree:
//! - its `.git` is a fresh repository written by us: a config of four core
//!   keys, `HEAD` on `refs/heads/nightshift/run/<id>`, no hooks, no remotes, no
//!   alternates, no `gitdir` file; nothing in it names the host repository;
//! - its objects are *copies* (new inodes) of the host's pack files and loose
//!   objects, never hard links, so that writing to them after the chown cannot
//!   reach the host repository;
//! - the checkout is the base tree's blobs written verbatim (no filters), and
//!   the index matches the files' final stat data, so `git status` is clean
//!   (see [`crate::checkout`]).
//!
//! The worktree holds every object of the host repository, not only those
//! reachable from the base: copying whole pack files is what makes creation
//! cheap. Objects of other branches are present but unreferenced.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
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
    /// Must not exist; its parent must.
    pub dest: PathBuf,
    /// When set, every file and directory of the worktree is given to this
    /// `uid:gid` so that the sandbox's user can write it.
    pub owner: Option<(u32, u32)>,
}

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

/// Depth of alternates followed in the (trusted) host repository, as git does.
const MAX_ALTERNATE_DEPTH: usize = 5;

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
    match fs::symlink_metadata(dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Ok(_) => {
            return Err(GitError::BadDestination {
                path: dest.clone(),
                why: "it already exists",
            })
        }
        Err(e) => return Err(GitError::io("checking worktree destination", dest, e)),
    }
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
    fs::create_dir(dest).map_err(|e| GitError::io("creating worktree directory", dest, e))?;

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
    let mut sources = Vec::new();
    collect_object_dirs(&host_common.join("objects"), 0, &mut sources);
    for src in &sources {
        copy_objects(src, &objects)?;
    }
    let shallow = host_common.join("shallow");
    if shallow.is_file() {
        let to = gitdir.join("shallow");
        fs::copy(&shallow, &to).map_err(|e| GitError::io("copying shallow file to", &to, e))?;
    }

    let repo = Repository::open(dest)
        .map_err(|e| GitError::git(format!("opening new worktree {}", dest.display()), e))?;
    repo.reference(branch, base, true, "nightshift: run branch at base")
        .map_err(|e| GitError::git(format!("creating branch {branch} in the worktree"), e))?;
    let base_tree = repo
        .find_commit(base)
        .map_err(|e| GitError::git(format!("reading base commit {base} in the new worktree"), e))?
        .tree_id();
    crate::checkout::checkout(&repo, dest, base_tree, spec.owner)?;

    if let Some((uid, gid)) = spec.owner {
        // The checkout gave its files away as it wrote them; what is left is
        // the top directory and `.git`.
        std::os::unix::fs::lchown(dest, Some(uid), Some(gid))
            .map_err(|e| GitError::io("changing owner of", dest, e))?;
        chown_tree(&gitdir, uid, gid)?;
    }
    Ok(())
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), GitError> {
    fs::write(path, data).map_err(|e| GitError::io("writing worktree file", path, e))
}

/// The host's objects directory and, recursively, those its alternates name.
fn collect_object_dirs(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > MAX_ALTERNATE_DEPTH || out.iter().any(|d| d == dir) || !dir.is_dir() {
        return;
    }
    out.push(dir.to_owned());
    let Ok(text) = fs::read_to_string(dir.join("info/alternates")) else {
        return;
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let path = Path::new(line);
        let path = if path.is_absolute() {
            path.to_owned()
        } else {
            dir.join(path)
        };
        collect_object_dirs(&path, depth + 1, out);
    }
}

fn is_hex(name: &[u8], len: usize) -> bool {
    name.len() == len && name.iter().all(u8::is_ascii_hexdigit)
}

/// Copies pack files (with their index) and loose objects from the host's
/// object directory `src` into `dst`. `fs::copy` makes new files (on Linux via
/// `copy_file_range`, which may share extents copy-on-write but never an inode).
fn copy_objects(src: &Path, dst: &Path) -> Result<(), GitError> {
    let pack_src = src.join("pack");
    if pack_src.is_dir() {
        let entries = fs::read_dir(&pack_src)
            .map_err(|e| GitError::io("listing host packs in", &pack_src, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| GitError::io("listing host packs in", &pack_src, e))?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".pack")) else {
                continue;
            };
            let idx = pack_src.join(format!("{stem}.idx"));
            if !idx.is_file() {
                continue;
            }
            for ext in ["pack", "idx", "rev"] {
                let from = pack_src.join(format!("{stem}.{ext}"));
                let to = dst.join("pack").join(format!("{stem}.{ext}"));
                if (ext == "rev" && !from.is_file()) || to.exists() {
                    continue;
                }
                fs::copy(&from, &to)
                    .map_err(|e| GitError::io("copying host pack file", &from, e))?;
            }
        }
    }
    let entries = fs::read_dir(src).map_err(|e| GitError::io("listing host objects in", src, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| GitError::io("listing host objects in", src, e))?;
        let name = entry.file_name();
        if !is_hex(name.as_bytes(), 2) || !entry.path().is_dir() {
            continue;
        }
        let fan_src = entry.path();
        let fan_dst = dst.join(&name);
        let files = fs::read_dir(&fan_src)
            .map_err(|e| GitError::io("listing host objects in", &fan_src, e))?;
        for file in files {
            let file = file.map_err(|e| GitError::io("listing host objects in", &fan_src, e))?;
            if !is_hex(file.file_name().as_bytes(), 38) {
                continue;
            }
            if !fan_dst.exists() {
                fs::create_dir(&fan_dst)
                    .map_err(|e| GitError::io("creating object directory", &fan_dst, e))?;
            }
            let to = fan_dst.join(file.file_name());
            if !to.exists() {
                fs::copy(file.path(), &to)
                    .map_err(|e| GitError::io("copying host loose object", file.path(), e))?;
            }
        }
    }
    Ok(())
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
