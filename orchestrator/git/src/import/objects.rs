//! Reading the worktree's objects as data, and copying the new ones into the host.
//!
//! Invariants:
//! - the worktree's object directory is read through an object database of our
//!   own (`git_odb_new` plus one disk alternate): no repository, no config;
//! - before it is opened, `.git`, `.git/objects`, `objects/pack` and
//!   `objects/info` are checked to be real directories, `objects/info/alternates`
//!   and `http-alternates` are deleted, and every entry libgit2 could open that
//!   is not a regular file (symlink, FIFO, socket, device) is deleted, as is any
//!   loose object file too large to hold an object within the limits (libgit2
//!   reads a loose file whole);
//! - an object the host already has is taken to come with everything it
//!   reaches (true for objects written by this module, which writes every
//!   object after everything it reaches, and for objects reachable from the
//!   host's refs); only objects the host lacks are read from the worktree
//!   (`tests::an_object_the_host_holds_is_not_read_from_the_worktree`);
//! - every object's size is checked from its header before it is read;
//! - every tree copied is checked entry by entry as git's fsck checks it
//!   ([`crate::tree_names`]): an entry named `..`, holding `/`, naming `.git`
//!   or an NTFS/HFS+ alias of it, a name given twice, an unknown mode. Such a
//!   tree is refused with [`GitError::InvalidTreeEntry`] (tree id, escaped
//!   name, why) before it is written, so neither it nor any tree or commit
//!   reaching it enters the host (blobs copied before it may, unreferenced).
//!   A tree the host already holds is not checked again here: the checkout
//!   checks every tree it writes ([`crate::checkout`]);
//! - every pack of the worktree is scanned before the object database is
//!   opened ([`super::pack_scan`]): one holding a delta whose base or result
//!   is over `max_file_bytes` (a delta bomb: deflate shrinks zeros about
//!   1000:1, and reading a delta inflates its base and result in memory,
//!   whatever the delta's own size), a zlib stream inflating past its
//!   declared size, or not a valid pack, is deleted with its index (and
//!   listed as skipped): what it held is then missing, and the history is
//!   dropped as for any missing object.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::Path;

use git2::{ObjectType, Odb, Oid};

use super::pack_scan::{scan_pack, PackLimits};
use super::{ImportLimits, SkipList, SkipReason};
use crate::fsx::is_real_dir;
use crate::tree_names::{self, EntryKind, TreeProblem};
use crate::GitError;

/// Slack over `max_file_bytes` for a loose object file: zlib's worst-case
/// expansion (5 bytes per 16 KiB block) plus the header.
fn loose_file_cap(limits: &ImportLimits) -> u64 {
    limits
        .max_file_bytes
        .saturating_add(limits.max_file_bytes / 1000)
        .saturating_add(64 << 10)
}

/// Checks and cleans `<worktree>/.git/objects`, then opens it as a bare object
/// database.
pub(super) fn open_worktree_odb(
    worktree: &Path,
    limits: &ImportLimits,
    skipped: &mut SkipList,
) -> Result<Odb<'static>, GitError> {
    let gitdir = worktree.join(".git");
    let objects = gitdir.join("objects");
    for (dir, required) in [
        (worktree.to_owned(), true),
        (gitdir.clone(), true),
        (objects.clone(), true),
        (objects.join("pack"), false),
        (objects.join("info"), false),
    ] {
        let meta = match fs::symlink_metadata(&dir) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !required => continue,
            Err(e) => return Err(GitError::io("inspecting worktree object store", &dir, e)),
        };
        if !meta.file_type().is_dir() {
            return Err(GitError::HostileWorktree {
                path: dir,
                why: "not a directory (a symlink is never followed)".to_owned(),
            });
        }
    }

    for name in ["alternates", "http-alternates"] {
        let path = objects.join("info").join(name);
        if fs::symlink_metadata(&path).is_ok() {
            remove(
                worktree,
                &path,
                "alternates would make the object store read elsewhere",
                skipped,
            )?;
        }
    }

    let cap = loose_file_cap(limits);
    let top = fs::read_dir(&objects)
        .map_err(|e| GitError::io("listing worktree objects", &objects, e))?;
    for entry in top {
        let entry = entry.map_err(|e| GitError::io("listing worktree objects", &objects, e))?;
        let name = entry.file_name();
        let path = entry.path();
        let name = name.to_string_lossy();
        let is_fanout = name.len() == 2 && name.bytes().all(|b| b.is_ascii_hexdigit());
        if !(is_fanout || name == "pack" || name == "info") {
            continue; // libgit2 never opens anything else here.
        }
        if !is_real_dir(&path).map_err(|e| GitError::io("inspecting worktree objects", &path, e))? {
            remove(worktree, &path, "not a real directory", skipped)?;
            continue;
        }
        sweep_dir(worktree, &path, is_fanout.then_some(cap), skipped)?;
    }

    scan_packs(worktree, &objects.join("pack"), limits, skipped)?;

    let objects_str = objects.to_str().ok_or_else(|| GitError::HostileWorktree {
        path: objects.clone(),
        why: "the path is not UTF-8, which libgit2 needs".to_owned(),
    })?;
    let odb = Odb::new().map_err(|e| GitError::git("making a scratch object database", e))?;
    odb.add_disk_alternate(objects_str)
        .map_err(|e| GitError::git(format!("opening worktree objects {objects_str}"), e))?;
    Ok(odb)
}

/// Scans every pack of the worktree ([`scan_pack`] with
/// [`PackLimits::for_worktree`]) and deletes, with its index, one whose
/// deltas name a base or a result over `max_file_bytes`, whose zlib streams
/// inflate past their declared sizes, or which is not a valid pack: reading
/// a delta inflates its base and its result whatever the delta's own size,
/// so such a pack could cost the supervisor far more than the limits.
fn scan_packs(
    worktree: &Path,
    pack_dir: &Path,
    limits: &ImportLimits,
    skipped: &mut SkipList,
) -> Result<(), GitError> {
    use std::os::unix::fs::OpenOptionsExt;
    let entries = match fs::read_dir(pack_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(GitError::io("listing worktree packs", pack_dir, e)),
    };
    let mut refused = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| GitError::io("listing worktree packs", pack_dir, e))?;
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "pack") {
            continue;
        }
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&path);
        let fine = match file {
            Ok(file) if file.metadata().is_ok_and(|m| m.is_file()) => {
                scan_pack(file, &PackLimits::for_worktree(*limits)).is_ok()
            }
            _ => false,
        };
        if !fine {
            refused.push(path);
        }
    }
    for path in refused {
        remove(
            worktree,
            &path,
            "a pack over the import limits (a delta's base or result over max_file_bytes, a zlib stream inflating past its size) or not a valid pack",
            skipped,
        )?;
        let idx = path.with_extension("idx");
        if fs::symlink_metadata(&idx).is_ok() {
            remove(worktree, &idx, "the index of a pack refused", skipped)?;
        }
    }
    Ok(())
}

/// Deletes every non-directory entry of `dir` that is not a regular file, and
/// regular files over `cap` when given.
fn sweep_dir(
    worktree: &Path,
    dir: &Path,
    cap: Option<u64>,
    skipped: &mut SkipList,
) -> Result<(), GitError> {
    let entries =
        fs::read_dir(dir).map_err(|e| GitError::io("listing worktree objects", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| GitError::io("listing worktree objects", dir, e))?;
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)
            .map_err(|e| GitError::io("inspecting worktree objects", &path, e))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            continue; // libgit2 opens only files at this level; it never descends.
        }
        if !kind.is_file() {
            remove(worktree, &path, "not a regular file", skipped)?;
        } else if cap.is_some_and(|cap| meta.len() > cap) {
            remove(
                worktree,
                &path,
                "loose object file larger than any importable object",
                skipped,
            )?;
        }
    }
    Ok(())
}

fn remove(
    worktree: &Path,
    path: &Path,
    why: &'static str,
    skipped: &mut SkipList,
) -> Result<(), GitError> {
    let meta = fs::symlink_metadata(path)
        .map_err(|e| GitError::io("inspecting worktree objects", path, e))?;
    let result = if meta.file_type().is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    result.map_err(|e| GitError::io("removing hostile object store entry", path, e))?;
    let rel = path.strip_prefix(worktree).unwrap_or(path);
    skipped.push(
        rel.to_string_lossy().into_owned(),
        SkipReason::ObjectStoreEntryRemoved { why },
    );
    Ok(())
}

enum Frame {
    Enter(Oid, ObjectType),
    Exit(Oid, ObjectType, Vec<u8>),
}

/// Copies every object reachable from `tip` that is not `known`, each after
/// everything it reaches. Returns how many were copied.
///
/// `known(id, kind)` says whether the object is taken as present in the host
/// with everything it reaches: an import passes "the host has it"; a pack
/// received over the door passes "reachable from the run's base" (see
/// [`super::pack`]). An object not known is read from `wt`, and one `wt`
/// lacks is [`GitError::MissingObject`].
pub(super) fn copy_reachable(
    host: &Odb<'_>,
    wt: &Odb<'_>,
    tip: Oid,
    limits: &ImportLimits,
    known: &mut dyn FnMut(Oid, ObjectType) -> Result<bool, GitError>,
) -> Result<u64, GitError> {
    copy_reachable_from(host, wt, tip, ObjectType::Commit, limits, known)
}

/// [`copy_reachable`] from an object of any kind (a tree: a commit's
/// files without its history).
pub(super) fn copy_reachable_from(
    host: &Odb<'_>,
    wt: &Odb<'_>,
    tip: Oid,
    tip_kind: ObjectType,
    limits: &ImportLimits,
    known: &mut dyn FnMut(Oid, ObjectType) -> Result<bool, GitError>,
) -> Result<u64, GitError> {
    let mut seen: HashSet<Oid> = HashSet::new();
    let mut total_bytes: u64 = 0;
    let mut stack = vec![Frame::Enter(tip, tip_kind)];
    while let Some(frame) = stack.pop() {
        match frame {
            Frame::Exit(id, kind, data) => write_checked(host, id, kind, &data)?,
            Frame::Enter(id, expected) => {
                if seen.contains(&id) || known(id, expected)? {
                    continue;
                }
                seen.insert(id);
                if seen.len() as u64 > limits.max_objects {
                    return Err(GitError::TooManyObjects {
                        limit: limits.max_objects,
                    });
                }
                let (size, kind) =
                    wt.read_header(id)
                        .map_err(|source| GitError::MissingObject {
                            id: id.to_string(),
                            source,
                        })?;
                if kind != expected {
                    return Err(GitError::MalformedObject {
                        id: id.to_string(),
                        kind: kind_name(expected),
                        why: "it is referenced as this kind but is another",
                    });
                }
                let size = size as u64;
                if size > limits.max_file_bytes {
                    return Err(GitError::ObjectTooLarge {
                        id: id.to_string(),
                        size,
                        limit: limits.max_file_bytes,
                    });
                }
                total_bytes = total_bytes.saturating_add(size);
                if total_bytes > limits.max_total_bytes {
                    return Err(GitError::TotalBytesExceeded {
                        limit: limits.max_total_bytes,
                    });
                }
                let object = wt.read(id).map_err(|source| GitError::MissingObject {
                    id: id.to_string(),
                    source,
                })?;
                if object.kind() != kind || object.len() as u64 != size {
                    return Err(GitError::MalformedObject {
                        id: id.to_string(),
                        kind: kind_name(kind),
                        why: "its header and its content disagree",
                    });
                }
                if kind == ObjectType::Blob {
                    // Written from the object as read: a blob is never copied.
                    write_checked(host, id, kind, object.data())?;
                    continue;
                }
                let data = object.data().to_vec();
                drop(object);
                match kind {
                    ObjectType::Tree => {
                        let children = parse_tree(id, &data)?;
                        stack.push(Frame::Exit(id, kind, data));
                        stack.extend(children.into_iter().map(|(c, k)| Frame::Enter(c, k)));
                    }
                    ObjectType::Commit => {
                        let (tree, parents) = parse_commit(id, &data)?;
                        stack.push(Frame::Exit(id, kind, data));
                        stack.push(Frame::Enter(tree, ObjectType::Tree));
                        stack.extend(
                            parents
                                .into_iter()
                                .map(|p| Frame::Enter(p, ObjectType::Commit)),
                        );
                    }
                    _ => {
                        return Err(GitError::MalformedObject {
                            id: id.to_string(),
                            kind: kind_name(kind),
                            why: "only commits, trees and blobs are imported",
                        })
                    }
                }
            }
        }
    }
    Ok(seen.len() as u64)
}

pub(super) fn write_checked(
    host: &Odb<'_>,
    id: Oid,
    kind: ObjectType,
    data: &[u8],
) -> Result<(), GitError> {
    let written = host
        .write(kind, data)
        .map_err(|e| GitError::git(format!("writing object {id} into the host repository"), e))?;
    if written != id {
        return Err(GitError::ObjectIdMismatch {
            expected: id.to_string(),
            written: written.to_string(),
        });
    }
    Ok(())
}

fn kind_name(kind: ObjectType) -> &'static str {
    match kind {
        ObjectType::Commit => "commit",
        ObjectType::Tree => "tree",
        ObjectType::Blob => "blob",
        ObjectType::Tag => "tag",
        _ => "object",
    }
}

/// The objects a raw tree refers to, after checking every entry as git's
/// fsck does (see [`crate::tree_names`]): a tree that could make a checkout
/// write outside itself is refused here, before it reaches the host.
/// Submodule entries (gitlinks) name commits of other repositories and are
/// not followed.
fn parse_tree(id: Oid, data: &[u8]) -> Result<Vec<(Oid, ObjectType)>, GitError> {
    let entries = tree_names::parse_tree(data).map_err(|problem| match problem {
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
    Ok(entries
        .into_iter()
        .filter_map(|e| match e.kind {
            EntryKind::Tree => Some((e.id, ObjectType::Tree)),
            EntryKind::File { .. } | EntryKind::Symlink => Some((e.id, ObjectType::Blob)),
            EntryKind::Gitlink => None,
        })
        .collect())
}

/// The tree and parents of a raw commit.
pub(super) fn parse_commit(id: Oid, data: &[u8]) -> Result<(Oid, Vec<Oid>), GitError> {
    let bad = |why| GitError::MalformedObject {
        id: id.to_string(),
        kind: "commit",
        why,
    };
    let hex = |value: &[u8]| -> Result<Oid, GitError> {
        if value.len() != 40 || !value.iter().all(u8::is_ascii_hexdigit) {
            return Err(bad("header id is not 40 hex"));
        }
        let text = std::str::from_utf8(value).map_err(|_| bad("header id is not 40 hex"))?;
        Oid::from_str(text).map_err(|_| bad("header id is not 40 hex"))
    };
    let mut tree = None;
    let mut parents = Vec::new();
    for (n, line) in data.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix(b"tree ") {
            if n != 0 {
                return Err(bad("tree header is not first"));
            }
            tree = Some(hex(v)?);
        } else if let Some(v) = line.strip_prefix(b"parent ") {
            parents.push(hex(v)?);
        } else if n == 0 {
            return Err(bad("no tree header"));
        }
    }
    let tree = tree.ok_or_else(|| bad("no tree header"))?;
    Ok((tree, parents))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    #[test]
    fn parses_trees_and_skips_gitlinks() {
        let mut raw = Vec::new();
        for (mode, name, n) in [
            ("100644", "a", 1u8),
            ("40000", "d", 2),
            ("120000", "l", 4),
            ("160000", "sub", 3),
        ] {
            raw.extend_from_slice(format!("{mode} {name}\0").as_bytes());
            raw.extend_from_slice(&[n; 20]);
        }
        let got = parse_tree(oid(9), &raw).unwrap();
        assert_eq!(
            got,
            vec![
                (oid(1), ObjectType::Blob),
                (oid(2), ObjectType::Tree),
                (oid(4), ObjectType::Blob)
            ]
        );
        assert!(parse_tree(oid(9), &raw[..raw.len() - 3]).is_err());
        assert!(parse_tree(oid(9), b"999999 x\0aaaaaaaaaaaaaaaaaaaa").is_err());
        let err = parse_tree(oid(9), b"40000 ..\0aaaaaaaaaaaaaaaaaaaa").unwrap_err();
        assert!(
            matches!(&err, GitError::InvalidTreeEntry { tree, name, .. }
                if *tree == oid(9).to_string() && name == ".."),
            "{err}"
        );
    }

    /// A commit reaching a tree with a `..` entry is refused with the tree's
    /// id and the entry's name, and neither the tree nor the commit is written.
    #[test]
    fn copy_refuses_a_commit_reaching_a_hostile_tree() {
        let dir = tempfile::tempdir().unwrap();
        let host_repo = git2::Repository::init_bare(dir.path().join("host")).unwrap();
        let wt_repo = git2::Repository::init_bare(dir.path().join("wt")).unwrap();
        let (host, wt) = (host_repo.odb().unwrap(), wt_repo.odb().unwrap());
        let blob = wt.write(ObjectType::Blob, b"out\n").unwrap();
        let mut inner = b"100644 escaped\0".to_vec();
        inner.extend_from_slice(blob.as_bytes());
        let inner = wt.write(ObjectType::Tree, &inner).unwrap();
        let mut top = b"40000 ..\0".to_vec();
        top.extend_from_slice(inner.as_bytes());
        let top = wt.write(ObjectType::Tree, &top).unwrap();
        let commit =
            format!("tree {top}\nauthor a <a> 1 +0000\ncommitter a <a> 1 +0000\n\nhostile\n");
        let commit = wt.write(ObjectType::Commit, commit.as_bytes()).unwrap();

        let err = copy_reachable(
            &host,
            &wt,
            commit,
            &ImportLimits::default(),
            &mut |id, _| Ok(host.exists(id)),
        )
        .unwrap_err();
        match &err {
            GitError::InvalidTreeEntry { tree, name, why } => {
                assert_eq!(*tree, top.to_string());
                assert_eq!(name, "..");
                assert_eq!(*why, "the name `..`");
            }
            other => panic!("not an invalid tree entry: {other}"),
        }
        assert!(!host.exists(top) && !host.exists(commit));
    }

    /// A pack in the worktree holding a delta whose result is over
    /// `max_file_bytes`, and a 10-byte offset delta on that result (reading
    /// it would inflate the whole result), is deleted with its index before
    /// the object database is opened, and listed as skipped.
    #[test]
    fn a_worktree_pack_with_a_delta_bomb_is_removed_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path();
        let pack_dir = wt.join(".git/objects/pack");
        fs::create_dir_all(&pack_dir).unwrap();
        // 64 copies of 64 KiB: a 4 MiB result, over a 1 MiB limit.
        let (bytes, small) = crate::import::pack_scan::hidden_delta_bomb_for_tests(64);
        let pack = pack_dir.join("pack-bomb.pack");
        let index = |pack: &Path| {
            let out = std::process::Command::new("git")
                .args(["index-pack"])
                .arg(pack)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        };
        fs::write(&pack, &bytes).unwrap();
        index(&pack);
        let small = Oid::hash_object(ObjectType::Blob, &small).unwrap();
        let limits = ImportLimits {
            max_file_bytes: 1 << 20,
            ..ImportLimits::default()
        };
        let mut skipped = SkipList::default();
        let odb = open_worktree_odb(wt, &limits, &mut skipped).unwrap();
        assert!(!pack.exists() && !pack.with_extension("idx").exists());
        let listed: Vec<String> = skipped.listed.iter().map(|s| s.path.clone()).collect();
        assert_eq!(
            listed,
            [
                ".git/objects/pack/pack-bomb.pack",
                ".git/objects/pack/pack-bomb.idx"
            ]
        );
        assert!(odb.read_header(small).is_err());

        // The same pack within the limits stays and is read.
        fs::write(&pack, &bytes).unwrap();
        index(&pack);
        let mut skipped = SkipList::default();
        let odb = open_worktree_odb(wt, &ImportLimits::default(), &mut skipped).unwrap();
        assert_eq!(odb.read(small).unwrap().data(), &[0u8; 10]);
    }

    #[test]
    fn parses_commits_and_refuses_garbage() {
        let c = format!(
            "tree {}\nparent {}\nparent {}\nauthor a <a> 1 +0000\n\nparent {}\n",
            oid(1),
            oid(2),
            oid(3),
            oid(4)
        );
        let (tree, parents) = parse_commit(oid(9), c.as_bytes()).unwrap();
        assert_eq!(tree, oid(1));
        // A "parent" line in the message is not a parent.
        assert_eq!(parents, vec![oid(2), oid(3)]);
        assert!(parse_commit(oid(9), b"author x\ntree 00\n").is_err());
        assert!(parse_commit(oid(9), b"tree zz\n").is_err());
    }

    /// The host holds a tree the worktree's commit names; the worktree holds
    /// neither it nor its blob. The copy takes the commit without reading
    /// either from the worktree.
    #[test]
    fn an_object_the_host_holds_is_not_read_from_the_worktree() {
        let dir = tempfile::tempdir().unwrap();
        let host_repo = git2::Repository::init_bare(dir.path().join("host")).unwrap();
        let wt_repo = git2::Repository::init_bare(dir.path().join("wt")).unwrap();
        let (host, wt) = (host_repo.odb().unwrap(), wt_repo.odb().unwrap());
        let blob = host.write(ObjectType::Blob, b"held\n").unwrap();
        let mut tree = b"100644 f\0".to_vec();
        tree.extend_from_slice(blob.as_bytes());
        let tree = host.write(ObjectType::Tree, &tree).unwrap();
        let commit = format!("tree {tree}\nauthor a <a> 1 +0000\ncommitter a <a> 1 +0000\n\nnew\n");
        let commit = wt.write(ObjectType::Commit, commit.as_bytes()).unwrap();
        assert!(!wt.exists(tree) && !wt.exists(blob));

        copy_reachable(
            &host,
            &wt,
            commit,
            &ImportLimits::default(),
            &mut |id, _| Ok(host.exists(id)),
        )
        .unwrap();
        assert!(host.exists(commit));
    }
}
