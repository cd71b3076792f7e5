//! Taking a commit an agent asked to act on from a pack it sent over the
//! door, never from its worktree
//! (`tests/tests/door_races.rs::a_fifo_or_a_sparse_10gb_file_for_a_loose_object_neither_blocks_nor_bloats_the_door`).
//!
//! Invariants:
//! - Nothing here reads the run's worktree: the pack is a file the
//!   supervisor wrote under a scratch directory it owns, indexed into an
//!   object database of its own in that directory (libgit2's indexer, which
//!   computes every object's id from its content and refuses a pack whose
//!   trailing checksum is wrong or whose deltas name bases it does not hold:
//!   a "thin" pack is refused).
//! - Before the indexer sees a byte, the pack is scanned
//!   ([`super::pack_scan::scan_pack`]): its object count, every object's
//!   declared size, every delta's base and result sizes (read from the first
//!   inflated bytes of the delta) and their total are checked against
//!   [`ImportLimits`], and each zlib stream is inflated into a fixed buffer
//!   with a hard cap at its declared size. A pack over the limits is refused
//!   as [`GitError::PackOverLimits`] without anything of it inflated in
//!   memory: a delta that would re-create a blob a thousand times over costs
//!   the supervisor a 32 KiB buffer, not the blob.
//! - The commit is copied into the host by the same walk as an import
//!   ([`super::objects::copy_reachable`]), but what it may reference is
//!   narrower: an object is taken from the pack (checked by kind and size,
//!   written with its id compared, what it references walked in turn), or
//!   else it must be reachable from the run's base commit in the host (the
//!   objects the run's worktree was given, see [`crate::reachable`]): never
//!   "anything the host holds". Another branch's commit, a stash, an object
//!   of the host's alone is refused exactly as an id nobody has: the same
//!   [`GitError::NotConnected`], after the same walk, so the answer tells
//!   the agent nothing about what the host holds. No ref is made then
//!   (`tests::a_commit_referencing_host_only_objects_is_refused_as_an_unknown_id_is`,
//!   `tests::objects_of_the_bases_history_may_be_referenced`,
//!   `tests::a_commit_not_connected_is_refused_and_no_ref_is_made`).
//! - Bounded: the caller caps the pack's size; the scan caps objects and
//!   inflated bytes; the indexer is stopped past `max_objects` objects; the
//!   walk of the base's history visits at most `max_objects` objects (past
//!   that, what is not found is not connected).
//! - The host gains objects and one ref, `dest_ref`. The caller removes the
//!   scratch directory.

use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::path::Path;

use git2::{Indexer, ObjectType, Odb, Oid, Repository};

use super::pack_scan::{scan_pack, PackLimits};
use super::{diffstat, objects, Captured, ImportLimits};
use crate::base::{open_host, parse_full_id};
use crate::GitError;

/// What to take from a received pack.
#[derive(Debug, Clone, Copy)]
pub struct PackSpec<'a> {
    pub host_repo: &'a Path,
    /// A fresh directory the supervisor owns (never inside a worktree).
    pub scratch: &'a Path,
    /// The pack's bytes, as received; `None` when the request carried none
    /// (the commit must then be reachable from the run's base).
    pub pack: Option<&'a Path>,
    /// Full 40-hex id of the run's base commit, as recorded in the store:
    /// what the commit may reference besides the pack, and the diffstat's base.
    pub base_commit: &'a str,
    /// The commit the request names.
    pub commit: &'a str,
    /// Where the commit is kept in the host, `refs/nightshift/acts/<id>`.
    pub dest_ref: &'a str,
    pub limits: ImportLimits,
}

/// Scans and indexes the pack into a scratch object database, copies
/// `commit` and what it reaches into the host (each object from the pack or
/// reachable from the base), and points `dest_ref` at it.
pub fn receive_pack(spec: &PackSpec<'_>) -> Result<Captured, GitError> {
    git2::opts::strict_hash_verification(true);
    let base = parse_full_id(spec.base_commit)?;
    let wanted = parse_full_id(spec.commit)?;
    if wanted.is_zero() {
        return Err(GitError::InvalidCommitId {
            id: spec.commit.to_owned(),
        });
    }
    let host = open_host(spec.host_repo)?;
    let host_odb = host
        .odb()
        .map_err(|e| GitError::git("opening the host object database", e))?;

    let objects_dir = spec.scratch.join("objects");
    let pack_dir = objects_dir.join("pack");
    std::fs::create_dir_all(&pack_dir)
        .map_err(|e| GitError::io("making the scratch object store", &pack_dir, e))?;
    if let Some(pack) = spec.pack {
        index(pack, &pack_dir, &spec.limits)?;
    }
    let objects_str = objects_dir.to_str().ok_or_else(|| GitError::BadPack {
        why: "the scratch directory's path is not UTF-8".to_owned(),
    })?;
    let scratch = Odb::new().map_err(|e| GitError::git("making a scratch object database", e))?;
    scratch
        .add_disk_alternate(objects_str)
        .map_err(|e| GitError::git("opening the scratch object database", e))?;

    let mut from_base = BaseHistory::new(&host, base, spec.limits.max_objects)?;
    let copied = objects::copy_reachable(
        &host_odb,
        &scratch,
        wanted,
        &spec.limits,
        &mut |id, kind| {
            if scratch.exists(id) {
                return Ok(false);
            }
            from_base.holds(id, kind)
        },
    );
    let objects_copied = match copied {
        Err(GitError::MissingObject { id, .. }) => {
            return Err(GitError::NotConnected {
                commit: wanted.to_string(),
                missing: id,
            })
        }
        other => other?,
    };
    drop(scratch);
    let found = host
        .find_commit(wanted)
        .map_err(|e| GitError::git(format!("reading received commit {wanted}"), e))?;
    let tree = found.tree_id();
    host.reference(spec.dest_ref, wanted, true, "nightshift: act's commit")
        .map_err(|e| {
            GitError::git(
                format!("updating {} in the host repository", spec.dest_ref),
                e,
            )
        })?;
    let (files_changed, insertions, deletions) = diffstat(&host, base, tree)?;
    Ok(Captured {
        commit: wanted.to_string(),
        tree: tree.to_string(),
        objects_copied,
        files_changed,
        insertions,
        deletions,
    })
}

/// The objects reachable from the run's base commit, found lazily: commits
/// breadth-first from the base, and each commit's tree (the base's first)
/// only when a tree or blob is asked for. Everything visited is remembered,
/// so the history is walked at most once a request, and at most `budget`
/// objects of it.
struct BaseHistory<'r> {
    host: &'r Repository,
    odb: Odb<'r>,
    commits: HashSet<Oid>,
    trees: HashSet<Oid>,
    blobs: HashSet<Oid>,
    /// Commits seen whose parents are not yet queued.
    next_commits: VecDeque<Oid>,
    /// Root trees of walked commits, not yet walked, oldest commit last.
    next_roots: VecDeque<Oid>,
    /// Trees of the root being walked.
    stack: Vec<Oid>,
    budget: u64,
}

impl<'r> BaseHistory<'r> {
    fn new(host: &'r Repository, base: Oid, budget: u64) -> Result<Self, GitError> {
        let odb = host
            .odb()
            .map_err(|e| GitError::git("opening the host object database", e))?;
        let mut walk = BaseHistory {
            host,
            odb,
            commits: HashSet::new(),
            trees: HashSet::new(),
            blobs: HashSet::new(),
            next_commits: VecDeque::new(),
            next_roots: VecDeque::new(),
            stack: Vec::new(),
            budget,
        };
        // The base itself must be readable: it is the supervisor's record.
        let commit = host
            .find_commit(base)
            .map_err(|e| GitError::git(format!("reading base commit {base}"), e))?;
        walk.commits.insert(base);
        walk.next_roots.push_back(commit.tree_id());
        walk.next_commits.push_back(base);
        Ok(walk)
    }

    fn visited(&self) -> u64 {
        (self.commits.len() + self.trees.len() + self.blobs.len()) as u64
    }

    /// Whether `id`, as a `kind`, is reachable from the base.
    fn holds(&mut self, id: Oid, kind: ObjectType) -> Result<bool, GitError> {
        loop {
            let found = match kind {
                ObjectType::Commit => self.commits.contains(&id),
                ObjectType::Tree => self.trees.contains(&id),
                ObjectType::Blob => self.blobs.contains(&id),
                _ => return Ok(false),
            };
            if found {
                return Ok(true);
            }
            if self.visited() >= self.budget {
                return Ok(false);
            }
            let stepped = match kind {
                ObjectType::Commit => self.step_commit()?,
                _ => self.step_tree()? || self.step_commit()?,
            };
            if !stepped {
                return Ok(false);
            }
        }
    }

    /// Queues the parents of the next commit; `false` when the history is done.
    fn step_commit(&mut self) -> Result<bool, GitError> {
        let Some(id) = self.next_commits.pop_front() else {
            return Ok(false);
        };
        // A parent the host lacks (its shallow boundary) ends that line.
        let Ok(commit) = self.host.find_commit(id) else {
            return Ok(true);
        };
        for parent in commit.parent_ids() {
            if self.commits.contains(&parent) {
                continue;
            }
            if let Ok(p) = self.host.find_commit(parent) {
                self.commits.insert(parent);
                self.next_roots.push_back(p.tree_id());
                self.next_commits.push_back(parent);
            }
        }
        Ok(true)
    }

    /// Walks one tree of the history; `false` when every queued root is done.
    fn step_tree(&mut self) -> Result<bool, GitError> {
        let id = loop {
            if let Some(id) = self.stack.pop() {
                break id;
            }
            match self.next_roots.pop_front() {
                Some(root) if self.trees.insert(root) => break root,
                Some(_) => continue,
                None => return Ok(false),
            }
        };
        let object = self
            .odb
            .read(id)
            .map_err(|e| GitError::git(format!("reading tree {id} of the base's history"), e))?;
        if object.kind() != ObjectType::Tree {
            return Ok(true);
        }
        let entries = raw_entries(object.data());
        for (mode, child) in entries {
            match mode & 0o170000 {
                0o040000 => {
                    if self.trees.insert(child) {
                        self.stack.push(child);
                    }
                }
                0o160000 => {}
                _ => {
                    self.blobs.insert(child);
                }
            }
        }
        Ok(true)
    }
}

/// The modes and ids of a raw tree of the host's, read as `reachable.rs`
/// reads them (only modes and ids; a malformed tail is left unread).
fn raw_entries(mut data: &[u8]) -> Vec<(u32, Oid)> {
    let mut out = Vec::new();
    while let Some(nul) = data.iter().position(|&b| b == 0) {
        let (head, rest) = (&data[..nul], &data[nul + 1..]);
        let Some(id) = rest.get(..20).and_then(|b| Oid::from_bytes(b).ok()) else {
            break;
        };
        data = &rest[20..];
        let mode = head.split(|&b| b == b' ').next().unwrap_or_default();
        if let Some(mode) = std::str::from_utf8(mode)
            .ok()
            .and_then(|m| u32::from_str_radix(m, 8).ok())
        {
            out.push((mode, id));
        }
    }
    out
}

/// Scans the pack against the limits ([`scan_pack`]), then runs libgit2's
/// indexer over it: it hashes every object, resolves every delta within the
/// pack, and writes `.pack` and `.idx` to `pack_dir`.
fn index(pack: &Path, pack_dir: &Path, limits: &ImportLimits) -> Result<(), GitError> {
    let bad = |why: String| GitError::BadPack { why };
    let file = File::open(pack).map_err(|e| GitError::io("reading the received pack", pack, e))?;
    match scan_pack(file, &PackLimits::from(*limits)) {
        Ok(_) => {}
        Err(e) if e.is_over_limit() => return Err(GitError::PackOverLimits { why: e.to_string() }),
        Err(e) => return Err(bad(e.to_string())),
    }
    let mut file =
        File::open(pack).map_err(|e| GitError::io("reading the received pack", pack, e))?;
    let max_objects = limits.max_objects;
    let too_many = std::rc::Rc::new(std::cell::Cell::new(false));
    let mut indexer = Indexer::new(None, pack_dir, 0o600, false)
        .map_err(|e| GitError::git("starting the pack indexer", e))?;
    {
        let too_many = too_many.clone();
        indexer.progress(move |p| {
            let over = p.total_objects() as u64 > max_objects;
            too_many.set(over);
            !over
        });
    }
    let copied = std::io::copy(&mut file, &mut indexer);
    if too_many.get() {
        return Err(GitError::TooManyObjects { limit: max_objects });
    }
    copied.map_err(|e| bad(format!("it does not index: {}", inner_message(&e))))?;
    indexer
        .commit()
        .map_err(|e| bad(format!("it does not index: {}", e.message())))?;
    Ok(())
}

/// The libgit2 message inside an I/O error from the indexer.
fn inner_message(e: &std::io::Error) -> String {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<git2::Error>())
        .map(|g| g.message().to_owned())
        .unwrap_or_else(|| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {:?}", out);
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A host repository with one commit, and a clone in which `n` more
    /// commits were made; returns (host, clone, base, commits).
    fn repos(n: usize) -> (tempfile::TempDir, tempfile::TempDir, String, Vec<String>) {
        let host = tempfile::tempdir().unwrap();
        git(host.path(), &["init", "-q", "-b", "main"]);
        std::fs::write(host.path().join("a"), "a\n").unwrap();
        git(host.path(), &["add", "a"]);
        git(host.path(), &["commit", "-qm", "base"]);
        let base = git(host.path(), &["rev-parse", "HEAD"]);
        let clone = tempfile::tempdir().unwrap();
        git(
            clone.path(),
            &["clone", "-q", host.path().to_str().unwrap(), "."],
        );
        let mut commits = Vec::new();
        for i in 0..n {
            std::fs::write(clone.path().join(format!("f{i}")), format!("{i}\n")).unwrap();
            git(clone.path(), &["add", "-A"]);
            git(clone.path(), &["commit", "-qm", &format!("c{i}")]);
            commits.push(git(clone.path(), &["rev-parse", "HEAD"]));
        }
        (host, clone, base, commits)
    }

    fn pack(clone: &Path, revs: &str, out: &Path) {
        let mut child = Command::new("git")
            .arg("-C")
            .arg(clone)
            .args(["pack-objects", "--stdout", "--revs", "-q"])
            .stdin(std::process::Stdio::piped())
            .stdout(File::create(out).unwrap())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(revs.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
    }

    fn spec<'a>(
        host: &'a Path,
        scratch: &'a Path,
        pack: Option<&'a Path>,
        base: &'a str,
        commit: &'a str,
    ) -> PackSpec<'a> {
        PackSpec {
            host_repo: host,
            scratch,
            pack,
            base_commit: base,
            commit,
            dest_ref: "refs/nightshift/acts/a1",
            limits: ImportLimits::default(),
        }
    }

    #[test]
    fn a_pack_less_the_base_lands_under_the_act_ref() {
        let (host, clone, base, commits) = repos(2);
        let work = tempfile::tempdir().unwrap();
        let file = work.path().join("p.pack");
        pack(clone.path(), &format!("{}\n^{base}\n", commits[1]), &file);
        let scratch = work.path().join("s");
        let got = receive_pack(&spec(
            host.path(),
            &scratch,
            Some(&file),
            &base,
            &commits[1],
        ))
        .unwrap();
        assert_eq!(got.commit, commits[1]);
        assert_eq!(got.files_changed, 2);
        assert_eq!(
            git(host.path(), &["rev-parse", "refs/nightshift/acts/a1"]),
            commits[1]
        );
    }

    #[test]
    fn a_commit_not_connected_is_refused_and_no_ref_is_made() {
        let (host, clone, base, commits) = repos(2);
        let work = tempfile::tempdir().unwrap();
        let file = work.path().join("p.pack");
        // Leaves out the first new commit, which the host lacks.
        pack(
            clone.path(),
            &format!("{}\n^{}\n", commits[1], commits[0]),
            &file,
        );
        let scratch = work.path().join("s");
        let err = receive_pack(&spec(
            host.path(),
            &scratch,
            Some(&file),
            &base,
            &commits[1],
        ))
        .unwrap_err();
        assert!(matches!(err, GitError::NotConnected { .. }), "{err}");
        // No pack at all, for a commit the host lacks: the same.
        let scratch = work.path().join("s2");
        let err = receive_pack(&spec(host.path(), &scratch, None, &base, &commits[0])).unwrap_err();
        assert!(matches!(err, GitError::NotConnected { .. }), "{err}");
        let refs = git(host.path(), &["for-each-ref", "refs/nightshift"]);
        assert_eq!(refs, "");
    }

    #[test]
    fn a_truncated_or_corrupt_pack_is_refused() {
        let (host, clone, base, commits) = repos(1);
        let work = tempfile::tempdir().unwrap();
        let file = work.path().join("p.pack");
        pack(clone.path(), &format!("{}\n^{base}\n", commits[0]), &file);
        let bytes = std::fs::read(&file).unwrap();
        for (n, broken) in [
            bytes[..bytes.len() / 2].to_vec(),
            {
                let mut b = bytes.clone();
                let at = b.len() - 25;
                b[at] ^= 0xff;
                b
            },
            b"PACK\0\0\0\x02\0\0\0\x05".to_vec(),
            b"not a pack at all".to_vec(),
        ]
        .into_iter()
        .enumerate()
        {
            std::fs::write(&file, &broken).unwrap();
            let scratch = work.path().join(format!("s{n}"));
            let err = receive_pack(&spec(
                host.path(),
                &scratch,
                Some(&file),
                &base,
                &commits[0],
            ))
            .unwrap_err();
            assert!(
                matches!(
                    err,
                    GitError::BadPack { .. } | GitError::NotConnected { .. }
                ),
                "case {n}: {err}"
            );
        }
    }

    /// A pack of exactly `ids`, read from `repo`'s objects.
    fn pack_of(repo: &Path, ids: &[git2::Oid], out: &Path) {
        let repo = git2::Repository::open(repo).unwrap();
        let mut pb = repo.packbuilder().unwrap();
        for id in ids {
            pb.insert_object(*id, None).unwrap();
        }
        let mut buf = git2::Buf::new();
        pb.write_buf(&mut buf).unwrap();
        std::fs::write(out, &buf[..]).unwrap();
    }

    /// A merge of the base and `other`, written raw into `clone` (which
    /// need not hold `other`).
    fn merge_onto(clone: &Path, base: &str, other: &str) -> git2::Oid {
        let repo = git2::Repository::open(clone).unwrap();
        let tree = repo
            .find_commit(git2::Oid::from_str(base).unwrap())
            .unwrap()
            .tree_id();
        let text = format!(
            "tree {tree}\nparent {base}\nparent {other}\nauthor a <a> 1 +0000\ncommitter a <a> 1 +0000\n\nmerge\n"
        );
        let odb = repo.odb().unwrap();
        let id = odb
            .write(git2::ObjectType::Commit, text.as_bytes())
            .unwrap();
        id
    }

    /// A merge whose second parent is a commit of a branch of the host's
    /// alone is refused, with the answer an id nobody has gets; so is a
    /// tree entry naming a host-only blob. Nothing lands.
    #[test]
    fn a_commit_referencing_host_only_objects_is_refused_as_an_unknown_id_is() {
        let (host, clone, base, _) = repos(0);
        git(host.path(), &["checkout", "-q", "-b", "local-only"]);
        std::fs::write(host.path().join("creds.env"), "TOKEN=host-secret\n").unwrap();
        git(host.path(), &["add", "creds.env"]);
        git(host.path(), &["commit", "-qm", "creds"]);
        let secret = git(host.path(), &["rev-parse", "HEAD"]);
        let secret_blob = git(host.path(), &["rev-parse", "HEAD:creds.env"]);
        git(host.path(), &["checkout", "-q", "main"]);
        let random = "3b18e512dba79e4c8300dd08aeb37f8e728b8dad";
        assert!(git2::Repository::open(host.path())
            .unwrap()
            .odb()
            .unwrap()
            .read_header(git2::Oid::from_str(random).unwrap())
            .is_err());

        let work = tempfile::tempdir().unwrap();
        let mut answers = Vec::new();
        for (n, other) in [secret.as_str(), random].into_iter().enumerate() {
            let merge = merge_onto(clone.path(), &base, other);
            let file = work.path().join(format!("m{n}.pack"));
            pack_of(clone.path(), &[merge], &file);
            let scratch = work.path().join(format!("s{n}"));
            let merge = merge.to_string();
            let err =
                receive_pack(&spec(host.path(), &scratch, Some(&file), &base, &merge)).unwrap_err();
            match &err {
                GitError::NotConnected { commit, missing } => {
                    assert_eq!((commit.as_str(), missing.as_str()), (merge.as_str(), other));
                }
                other => panic!("not refused as unconnected: {other}"),
            }
            answers.push(err.to_string().replace(&merge, "M").replace(other, "X"));
        }
        assert_eq!(answers[0], answers[1]);

        // A tree naming the host-only blob, on the base.
        let repo = git2::Repository::open(clone.path()).unwrap();
        let mut raw = b"100644 creds.env\0".to_vec();
        raw.extend_from_slice(git2::Oid::from_str(&secret_blob).unwrap().as_bytes());
        let tree = repo
            .odb()
            .unwrap()
            .write(git2::ObjectType::Tree, &raw)
            .unwrap();
        let text = format!(
            "tree {tree}\nparent {base}\nauthor a <a> 1 +0000\ncommitter a <a> 1 +0000\n\nsteal\n"
        );
        let steal = repo
            .odb()
            .unwrap()
            .write(git2::ObjectType::Commit, text.as_bytes())
            .unwrap();
        let file = work.path().join("t.pack");
        pack_of(clone.path(), &[steal, tree], &file);
        let steal = steal.to_string();
        let err = receive_pack(&spec(
            host.path(),
            &work.path().join("s3"),
            Some(&file),
            &base,
            &steal,
        ))
        .unwrap_err();
        assert!(
            matches!(&err, GitError::NotConnected { missing, .. } if *missing == secret_blob),
            "{err}"
        );
        // No pack, naming the host-only commit itself: the same.
        let err = receive_pack(&spec(
            host.path(),
            &work.path().join("s4"),
            None,
            &base,
            &secret,
        ))
        .unwrap_err();
        assert!(matches!(err, GitError::NotConnected { .. }), "{err}");
        assert_eq!(git(host.path(), &["for-each-ref", "refs/nightshift"]), "");
    }

    /// A commit on the base whose unchanged files are left out of the pack
    /// (they are the base's) and whose parent is an older commit of the
    /// base's history is taken.
    #[test]
    fn objects_of_the_bases_history_may_be_referenced() {
        let (host, clone, _, _) = repos(0);
        std::fs::write(host.path().join("b"), "b\n").unwrap();
        git(host.path(), &["add", "b"]);
        git(host.path(), &["commit", "-qm", "second"]);
        let old = git(host.path(), &["rev-parse", "HEAD~1"]);
        let base = git(host.path(), &["rev-parse", "HEAD"]);
        git(clone.path(), &["pull", "-q", "origin", "main"]);
        // A merge of the base and its own parent, with a new file.
        std::fs::write(clone.path().join("c"), "c\n").unwrap();
        git(clone.path(), &["add", "c"]);
        let tree = git(clone.path(), &["write-tree"]);
        let merge = git(
            clone.path(),
            &["commit-tree", &tree, "-p", &base, "-p", &old, "-m", "m"],
        );
        let work = tempfile::tempdir().unwrap();
        let file = work.path().join("p.pack");
        pack(clone.path(), &format!("{merge}\n^{base}\n"), &file);
        let got = receive_pack(&spec(
            host.path(),
            &work.path().join("s"),
            Some(&file),
            &base,
            &merge,
        ))
        .unwrap();
        assert_eq!(got.files_changed, 1);
        // And with no pack, a commit of the base's history.
        let got = receive_pack(&spec(
            host.path(),
            &work.path().join("s2"),
            None,
            &base,
            &old,
        ))
        .unwrap();
        assert_eq!(got.objects_copied, 0);
    }

    /// The walk of the base's history stops at its budget: what lies past
    /// it is not found, a random id costs at most the budget, and within it
    /// commits, trees and blobs are found by their kind only.
    #[test]
    fn the_walk_of_the_bases_history_is_bounded() {
        let (host, _clone, first, _) = repos(0);
        for i in 0..20 {
            std::fs::write(host.path().join(format!("f{i}")), format!("{i}\n")).unwrap();
            git(host.path(), &["add", "-A"]);
            git(host.path(), &["commit", "-qm", &format!("c{i}")]);
        }
        let tip = git2::Oid::from_str(&git(host.path(), &["rev-parse", "HEAD"])).unwrap();
        let first = git2::Oid::from_str(&first).unwrap();
        let blob = git2::Oid::from_str(&git(host.path(), &["rev-parse", "HEAD~19:f0"])).unwrap();
        let random = git2::Oid::from_str("3b18e512dba79e4c8300dd08aeb37f8e728b8dad").unwrap();
        let repo = git2::Repository::open(host.path()).unwrap();

        let mut small = BaseHistory::new(&repo, tip, 5).unwrap();
        assert!(!small.holds(first, ObjectType::Commit).unwrap());
        assert!(!small.holds(random, ObjectType::Blob).unwrap());
        assert!(small.visited() <= 6, "{}", small.visited());

        let mut whole = BaseHistory::new(&repo, tip, 1_000_000).unwrap();
        assert!(whole.holds(first, ObjectType::Commit).unwrap());
        assert!(whole.holds(blob, ObjectType::Blob).unwrap());
        assert!(!whole.holds(blob, ObjectType::Tree).unwrap());
        assert!(!whole.holds(random, ObjectType::Commit).unwrap());
        assert!(!whole.holds(random, ObjectType::Blob).unwrap());
        // Everything of a 21-commit history, and nothing more.
        assert!(whole.visited() < 200, "{}", whole.visited());
    }

    /// The delta bomb (a 64 KiB zero blob and a delta re-creating it 4096
    /// times: 256 MiB from a pack of a few KiB) is refused by the scan,
    /// before the indexer inflates anything.
    #[test]
    fn a_delta_bomb_is_refused_before_indexing() {
        let (host, _clone, base, _) = repos(0);
        let work = tempfile::tempdir().unwrap();
        let file = work.path().join("bomb.pack");
        std::fs::write(&file, super::super::pack_scan::delta_bomb_for_tests(4096)).unwrap();
        let err = receive_pack(&spec(
            host.path(),
            &work.path().join("s"),
            Some(&file),
            &base,
            &base,
        ))
        .unwrap_err();
        assert!(
            matches!(&err, GitError::PackOverLimits { why } if why.contains("268435456")),
            "{err}"
        );
    }

    #[test]
    fn an_empty_pack_for_a_commit_the_host_holds_is_taken() {
        let (host, clone, base, _) = repos(0);
        let work = tempfile::tempdir().unwrap();
        let file = work.path().join("p.pack");
        pack(clone.path(), &format!("{base}\n^{base}\n"), &file);
        let scratch = work.path().join("s");
        let got = receive_pack(&spec(host.path(), &scratch, Some(&file), &base, &base)).unwrap();
        assert_eq!(got.objects_copied, 0);
    }
}
