//! Writing the base tree into a fresh worktree, and its index.
//!
//! Invariants:
//! - every tree is checked before any of its entries is written, as git's
//!   fsck checks it ([`crate::tree_names`]): an entry named `..`, holding `/`,
//!   naming `.git` or an alias of it, or a name given twice stops the checkout
//!   with [`GitError::InvalidTreeEntry`], whoever made the tree (an older
//!   import, or an object planted in the host repository);
//! - every write is relative to a directory handle, never to a path: the
//!   worktree root is opened with `O_DIRECTORY | O_NOFOLLOW`; each directory
//!   is made with `mkdirat` and opened one component at a time with
//!   `O_NOFOLLOW`; each file is created with `O_CREAT | O_EXCL | O_NOFOLLOW`,
//!   each symlink with `symlinkat`. Nothing is opened through a symlink and
//!   nothing that already exists is reused or overwritten, so even a tree that
//!   slipped past the check cannot write outside the worktree or into its
//!   `.git` (`tests/hostile_trees.rs::hostile_trees_planted_in_the_host_are_never_checked_out`,
//!   `tests/tests/hostile.rs::hostile_trees_never_write_outside_a_worktree`);
//! - blobs are written verbatim (no filters, no attributes), as git would with
//!   no `.gitattributes` conversions, so the import reads back exactly them;
//! - files are chowned through their open descriptor before their stat data is
//!   taken, so the index records the final ctime and owner and `git status`
//!   has nothing to refresh;
//! - index entries are added in git's path order, so each add is an append.
//!
//! Trees deeper than [`MAX_DEPTH`] are refused: the walk holds one directory
//! handle per level.
//!
//! libgit2's own checkout does the same job about 1.5x slower than
//! `git worktree add` on 20,000 files (see docs/benchmarks.md); this one splits
//! the file writes over the machine's cores.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use git2::{IndexEntry, IndexTime, ObjectType, Odb, Oid, Repository};
use rustix::fs::{AtFlags, Mode, OFlags};

use crate::reachable::{open_host_objects, PackWriter};
use crate::tree_names::{self, EntryKind, TreeProblem};
use crate::GitError;

const MAX_WORKERS: usize = 4;

/// Deepest directory nesting checked out.
pub(crate) const MAX_DEPTH: usize = 256;

/// A directory of the checkout: its parent's index in the table and its name.
struct Dir {
    parent: usize,
    name: Vec<u8>,
}

/// A file, symlink or submodule to write, in directory `dir` of the table.
struct Item {
    dir: usize,
    name: Vec<u8>,
    path: Vec<u8>,
    id: Oid,
    kind: EntryKind,
}

/// The stat fields the index records.
struct Stat {
    ctime: (i64, i64),
    mtime: (i64, i64),
    dev: u64,
    ino: u64,
    uid: u32,
    gid: u32,
    size: u64,
}

impl From<&rustix::fs::Stat> for Stat {
    // The fields' widths differ between platforms; some casts are no-ops here.
    #[allow(clippy::unnecessary_cast)]
    fn from(s: &rustix::fs::Stat) -> Self {
        Stat {
            ctime: (s.st_ctime as i64, s.st_ctime_nsec as i64),
            mtime: (s.st_mtime as i64, s.st_mtime_nsec as i64),
            dev: s.st_dev as u64,
            ino: s.st_ino as u64,
            uid: s.st_uid,
            gid: s.st_gid,
            size: s.st_size as u64,
        }
    }
}

impl From<&std::fs::Metadata> for Stat {
    fn from(m: &std::fs::Metadata) -> Self {
        Stat {
            ctime: (m.ctime(), m.ctime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
            dev: m.dev(),
            ino: m.ino(),
            uid: m.uid(),
            gid: m.gid(),
            size: m.len(),
        }
    }
}

type Owner = Option<(rustix::fs::Uid, rustix::fs::Gid)>;

fn owner_ids(owner: Option<(u32, u32)>) -> Owner {
    owner.map(|(u, g)| (rustix::fs::Uid::from_raw(u), rustix::fs::Gid::from_raw(g)))
}

/// An I/O error at `rel` (a path relative to the worktree) as a `GitError`.
fn io_err(action: &'static str, root: &Path, rel: &[u8], e: rustix::io::Errno) -> GitError {
    GitError::io(
        action,
        root.join(std::ffi::OsStr::from_bytes(rel)),
        std::io::Error::from(e),
    )
}

/// Opens directory `name` of `parent` without following a symlink.
fn open_dir(parent: BorrowedFd<'_>, name: &[u8]) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Checks out `tree` into `root` (which holds only `.git`) and writes the
/// index. Blobs are read from the host's object store `host_objects` and, as
/// they are read, packed into `pack_dir` (see [`crate::reachable`]); the
/// trees are read from `trees` (the host's object database); `repo` is the
/// new worktree's repository, whose index is written.
pub(crate) fn checkout(
    repo: &Repository,
    trees: &Odb<'_>,
    root: &Path,
    tree: Oid,
    owner: Option<(u32, u32)>,
    host_objects: &Path,
    pack_dir: &Path,
) -> Result<(), GitError> {
    let root_fd = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| GitError::io("opening worktree", root, e.into()))?;
    let mut walk = Walk {
        odb: trees,
        root,
        owner: owner_ids(owner),
        dirs: vec![Dir {
            parent: 0,
            name: Vec::new(),
        }],
        items: Vec::new(),
    };
    walk.tree(root_fd.as_fd(), 0, &[], tree, 0)?;
    let Walk { dirs, items, .. } = walk;

    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_WORKERS);
    let chunk = items.len().div_ceil(workers).max(1);
    let ctx = Ctx {
        host_objects,
        pack_dir,
        root,
        root_fd: root_fd.as_fd(),
        dirs: &dirs,
        owner: owner_ids(owner),
    };
    let written: Vec<Result<Vec<IndexEntry>, GitError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .enumerate()
            .map(|(n, part)| {
                let ctx = &ctx;
                scope.spawn(move || ctx.write_items(part, n))
            })
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

/// The walk over the trees: checks each one, makes its directories, lists its files.
struct Walk<'a> {
    odb: &'a Odb<'a>,
    root: &'a Path,
    owner: Owner,
    dirs: Vec<Dir>,
    items: Vec<Item>,
}

impl Walk<'_> {
    fn tree(
        &mut self,
        dir_fd: BorrowedFd<'_>,
        dir: usize,
        prefix: &[u8],
        id: Oid,
        depth: usize,
    ) -> Result<(), GitError> {
        if depth >= MAX_DEPTH {
            return Err(GitError::BadDestination {
                path: self.root.join(std::ffi::OsStr::from_bytes(prefix)),
                why: "the tree nests deeper than a checkout goes",
            });
        }
        let object = self
            .odb
            .read(id)
            .map_err(|e| GitError::git(format!("reading tree {id} for the checkout"), e))?;
        if object.kind() != ObjectType::Tree {
            return Err(GitError::MalformedObject {
                id: id.to_string(),
                kind: "tree",
                why: "it is referenced as a tree but is another kind",
            });
        }
        let entries = tree_names::parse_tree(object.data()).map_err(|p| match p {
            TreeProblem::Malformed(why) => GitError::MalformedObject {
                id: id.to_string(),
                kind: "tree",
                why,
            },
            TreeProblem::Entry { name, why } => GitError::InvalidTreeEntry {
                tree: id.to_string(),
                name: tree_names::escape(&name),
                why,
            },
        })?;
        for entry in entries {
            let mut path = prefix.to_vec();
            path.extend_from_slice(entry.name);
            match entry.kind {
                EntryKind::Tree | EntryKind::Gitlink => {
                    rustix::fs::mkdirat(dir_fd, entry.name, Mode::from_raw_mode(0o777))
                        .map_err(|e| io_err("creating worktree directory", self.root, &path, e))?;
                    let sub = open_dir(dir_fd, entry.name)
                        .map_err(|e| io_err("opening worktree directory", self.root, &path, e))?;
                    if let Some((uid, gid)) = self.owner {
                        rustix::fs::fchown(&sub, Some(uid), Some(gid))
                            .map_err(|e| io_err("changing owner of", self.root, &path, e))?;
                    }
                    if entry.kind == EntryKind::Gitlink {
                        // A submodule is an empty directory plus its index entry, as git does.
                        self.items.push(Item {
                            dir,
                            name: entry.name.to_vec(),
                            path,
                            id: entry.id,
                            kind: entry.kind,
                        });
                        continue;
                    }
                    self.dirs.push(Dir {
                        parent: dir,
                        name: entry.name.to_vec(),
                    });
                    let sub_index = self.dirs.len() - 1;
                    path.push(b'/');
                    self.tree(sub.as_fd(), sub_index, &path, entry.id, depth + 1)?;
                }
                EntryKind::File { .. } | EntryKind::Symlink => self.items.push(Item {
                    dir,
                    name: entry.name.to_vec(),
                    path,
                    id: entry.id,
                    kind: entry.kind,
                }),
            }
        }
        Ok(())
    }
}

/// What every checkout worker shares.
struct Ctx<'a> {
    host_objects: &'a Path,
    pack_dir: &'a Path,
    root: &'a Path,
    root_fd: BorrowedFd<'a>,
    dirs: &'a [Dir],
    owner: Owner,
}

impl Ctx<'_> {
    /// Opens directory `dir` of the table from the root, one component at a
    /// time, never following a symlink.
    fn open_table_dir(&self, dir: usize) -> Result<OwnedFd, GitError> {
        let mut chain = Vec::new();
        let mut at = dir;
        while at != 0 {
            chain.push(at);
            at = self.dirs[at].parent;
        }
        let mut path = Vec::new();
        let mut fd: Option<OwnedFd> = None;
        for &d in chain.iter().rev() {
            let name = &self.dirs[d].name;
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name);
            let parent = fd.as_ref().map_or(self.root_fd, |f| f.as_fd());
            fd = Some(
                open_dir(parent, name)
                    .map_err(|e| io_err("opening worktree directory", self.root, &path, e))?,
            );
        }
        match fd {
            Some(fd) => Ok(fd),
            None => rustix::io::fcntl_dupfd_cloexec(self.root_fd, 0)
                .map_err(|e| io_err("opening worktree directory", self.root, b"", e)),
        }
    }

    fn write_items(&self, items: &[Item], n: usize) -> Result<Vec<IndexEntry>, GitError> {
        let odb = open_host_objects(self.host_objects)?;
        let blobs: HashSet<Oid> = items
            .iter()
            .filter(|i| i.kind != EntryKind::Gitlink)
            .map(|i| i.id)
            .collect();
        let mut pack = if blobs.is_empty() {
            None
        } else {
            Some(PackWriter::create(
                self.pack_dir,
                &format!("checkout-{n}"),
                blobs.len(),
            )?)
        };
        let mut packed: HashSet<Oid> = HashSet::with_capacity(blobs.len());

        let mut out = Vec::with_capacity(items.len());
        let mut current: Option<(usize, OwnedFd)> = None;
        for item in items {
            if current.as_ref().map(|(d, _)| *d) != Some(item.dir) {
                current = Some((item.dir, self.open_table_dir(item.dir)?));
            }
            let Some((_, dir_fd)) = current.as_ref() else {
                continue;
            };
            let blob = match item.kind {
                EntryKind::Gitlink | EntryKind::Tree => None,
                EntryKind::File { .. } | EntryKind::Symlink => {
                    let data = read_blob(&odb, item.id)?;
                    if let Some(pack) = pack.as_mut() {
                        if packed.insert(item.id) {
                            pack.add(item.id, ObjectType::Blob, &data)?;
                        }
                    }
                    Some(data)
                }
            };
            let stat = self.write_item(dir_fd.as_fd(), item, blob.as_deref())?;
            out.push(index_entry(item, &stat));
        }
        if let Some(pack) = pack {
            pack.finish()?;
        }
        Ok(out)
    }

    /// Writes one item; `blob` is the content of a file or symlink.
    fn write_item(
        &self,
        dir: BorrowedFd<'_>,
        item: &Item,
        blob: Option<&[u8]>,
    ) -> Result<Stat, GitError> {
        let path = &item.path;
        let stat_at = || {
            rustix::fs::statat(dir, item.name.as_slice(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|s| Stat::from(&s))
                .map_err(|e| io_err("inspecting", self.root, path, e))
        };
        match item.kind {
            EntryKind::Gitlink => stat_at(),
            EntryKind::Symlink => {
                let target = blob.unwrap_or_default();
                rustix::fs::symlinkat(target, dir, item.name.as_slice())
                    .map_err(|e| io_err("creating symlink", self.root, path, e))?;
                if let Some((uid, gid)) = self.owner {
                    rustix::fs::chownat(
                        dir,
                        item.name.as_slice(),
                        Some(uid),
                        Some(gid),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| io_err("changing owner of", self.root, path, e))?;
                }
                stat_at()
            }
            EntryKind::File { executable } => {
                let data = blob.unwrap_or_default();
                let perm = if executable { 0o777 } else { 0o666 };
                let fd = rustix::fs::openat(
                    dir,
                    item.name.as_slice(),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(perm),
                )
                .map_err(|e| io_err("creating worktree file", self.root, path, e))?;
                let mut file = File::from(fd);
                file.write_all(data).map_err(|e| {
                    GitError::io(
                        "writing worktree file",
                        self.root.join(std::ffi::OsStr::from_bytes(path)),
                        e,
                    )
                })?;
                if let Some((uid, gid)) = self.owner {
                    rustix::fs::fchown(&file, Some(uid), Some(gid))
                        .map_err(|e| io_err("changing owner of", self.root, path, e))?;
                }
                let meta = file.metadata().map_err(|e| {
                    GitError::io(
                        "inspecting",
                        self.root.join(std::ffi::OsStr::from_bytes(path)),
                        e,
                    )
                })?;
                Ok(Stat::from(&meta))
            }
            EntryKind::Tree => Err(GitError::BadDestination {
                path: self.root.to_owned(),
                why: "a tree reached the file writers",
            }),
        }
    }
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
fn index_entry(item: &Item, stat: &Stat) -> IndexEntry {
    let mode = item.kind.mode();
    IndexEntry {
        ctime: IndexTime::new(stat.ctime.0 as i32, stat.ctime.1 as u32),
        mtime: IndexTime::new(stat.mtime.0 as i32, stat.mtime.1 as u32),
        dev: stat.dev as u32,
        ino: stat.ino as u32,
        mode,
        uid: stat.uid,
        gid: stat.gid,
        file_size: if mode == 0o160000 {
            0
        } else {
            stat.size as u32
        },
        id: item.id,
        flags: item.path.len().min(0xfff) as u16,
        flags_extended: 0,
        path: item.path.clone(),
    }
}
