//! Writing the base tree into a fresh worktree, and its index.
//!
//! Invariants:
//! - only used on a directory we just created, from objects we just copied
//!   from the trusted host: nothing here reads the hostile side;
//! - blobs are written verbatim (no filters, no attributes), as git would with
//!   no `.gitattributes` conversions, so the import reads back exactly them;
//! - files are created with `create_new` and chowned through their open
//!   descriptor before their stat data is taken, so the index records the final
//!   ctime and owner and `git status` has nothing to refresh;
//! - index entries are added in git's path order, so each add is an append.
//!
//! libgit2's own checkout does the same job about 1.5x slower than
//! `git worktree add` on 20,000 files (see docs/benchmarks.md); this one splits
//! the file writes over the machine's cores.

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use git2::{IndexEntry, IndexTime, ObjectType, Odb, Oid, Repository, TreeWalkMode, TreeWalkResult};

use crate::GitError;

const MAX_WORKERS: usize = 4;

struct Item {
    path: Vec<u8>,
    id: Oid,
    mode: u32,
}

/// Checks out `tree` into `root` (which holds only `.git`) and writes the index.
pub(crate) fn checkout(
    repo: &Repository,
    root: &Path,
    tree: Oid,
    owner: Option<(u32, u32)>,
) -> Result<(), GitError> {
    let tree = repo
        .find_tree(tree)
        .map_err(|e| GitError::git(format!("reading base tree {tree}"), e))?;
    let mut dirs: Vec<Vec<u8>> = Vec::new();
    let mut items: Vec<Item> = Vec::new();
    tree.walk(TreeWalkMode::PreOrder, |parent, entry| {
        let mut path = parent.as_bytes().to_vec();
        path.extend_from_slice(entry.name_bytes());
        let mode = entry.filemode() as u32;
        match mode & 0o170000 {
            0o040000 => dirs.push(path),
            // A submodule is an empty directory plus its index entry, as git does.
            0o160000 => {
                dirs.push(path.clone());
                items.push(Item {
                    path,
                    id: entry.id(),
                    mode,
                });
            }
            _ => items.push(Item {
                path,
                id: entry.id(),
                mode,
            }),
        }
        TreeWalkResult::Ok
    })
    .map_err(|e| GitError::git("walking the base tree", e))?;

    for dir in &dirs {
        let path = root.join(OsStr::from_bytes(dir));
        fs::create_dir(&path).map_err(|e| GitError::io("creating worktree directory", &path, e))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                .map_err(|e| GitError::io("changing owner of", &path, e))?;
        }
    }

    let objects = root.join(".git/objects");
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_WORKERS);
    let chunk = items.len().div_ceil(workers).max(1);
    let written: Vec<Result<Vec<IndexEntry>, GitError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(|| write_items(&objects, root, part, owner)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(GitError::BadDestination {
                        path: root.to_owned(),
                        why: "a checkout worker failed",
                    })
                })
            })
            .collect()
    });

    let mut index = repo
        .index()
        .map_err(|e| GitError::git("opening the new worktree's index", e))?;
    let mut entries = Vec::with_capacity(items.len());
    for part in written {
        entries.extend(part?);
    }
    // Git orders the index by path bytes; the tree walk orders `a/` after `a.b`.
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    for entry in &entries {
        index
            .add(entry)
            .map_err(|e| GitError::git("adding to the new worktree's index", e))?;
    }
    index
        .write()
        .map_err(|e| GitError::git("writing the new worktree's index", e))
}

fn write_items(
    objects: &Path,
    root: &Path,
    items: &[Item],
    owner: Option<(u32, u32)>,
) -> Result<Vec<IndexEntry>, GitError> {
    // One object database per worker: libgit2 serialises pack access within one.
    let odb = Odb::new().map_err(|e| GitError::git("opening worktree objects", e))?;
    let objects_str = objects.to_str().ok_or_else(|| GitError::BadDestination {
        path: objects.to_owned(),
        why: "the path is not UTF-8, which libgit2 needs",
    })?;
    odb.add_disk_alternate(objects_str)
        .map_err(|e| GitError::git("opening worktree objects", e))?;

    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let path: PathBuf = root.join(OsStr::from_bytes(&item.path));
        let meta = match item.mode & 0o170000 {
            0o160000 => {
                fs::symlink_metadata(&path).map_err(|e| GitError::io("inspecting", &path, e))?
            }
            0o120000 => {
                let target = read_blob(&odb, item.id)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
                    .map_err(|e| GitError::io("creating symlink", &path, e))?;
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                        .map_err(|e| GitError::io("changing owner of", &path, e))?;
                }
                fs::symlink_metadata(&path).map_err(|e| GitError::io("inspecting", &path, e))?
            }
            _ => {
                let data = read_blob(&odb, item.id)?;
                let perm = if item.mode & 0o111 != 0 { 0o777 } else { 0o666 };
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(perm)
                    .open(&path)
                    .map_err(|e| GitError::io("creating worktree file", &path, e))?;
                file.write_all(&data)
                    .map_err(|e| GitError::io("writing worktree file", &path, e))?;
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                        .map_err(|e| GitError::io("changing owner of", &path, e))?;
                }
                file.metadata()
                    .map_err(|e| GitError::io("inspecting", &path, e))?
            }
        };
        out.push(index_entry(item, &meta));
    }
    Ok(out)
}

fn read_blob(odb: &Odb<'_>, id: Oid) -> Result<Vec<u8>, GitError> {
    let object = odb
        .read(id)
        .map_err(|e| GitError::git(format!("reading blob {id} for the checkout"), e))?;
    if object.kind() != ObjectType::Blob {
        return Err(GitError::git(
            format!("reading blob {id} for the checkout"),
            git2::Error::from_str("the tree names a non-blob as a file"),
        ));
    }
    Ok(object.data().to_vec())
}

/// The index entry git would write for this file; the index's fields are 32
/// bits wide and git truncates the same way.
fn index_entry(item: &Item, meta: &fs::Metadata) -> IndexEntry {
    let mode = match item.mode & 0o170000 {
        0o120000 => 0o120000,
        0o160000 => 0o160000,
        _ if item.mode & 0o111 != 0 => 0o100755,
        _ => 0o100644,
    };
    IndexEntry {
        ctime: IndexTime::new(meta.ctime() as i32, meta.ctime_nsec() as u32),
        mtime: IndexTime::new(meta.mtime() as i32, meta.mtime_nsec() as u32),
        dev: meta.dev() as u32,
        ino: meta.ino() as u32,
        mode,
        uid: meta.uid(),
        gid: meta.gid(),
        file_size: if mode == 0o160000 {
            0
        } else {
            meta.len() as u32
        },
        id: item.id,
        flags: item.path.len().min(0xfff) as u16,
        flags_extended: 0,
        path: item.path.clone(),
    }
}
