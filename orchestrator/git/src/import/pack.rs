//! Taking a commit an agent asked to act on from a pack it sent over the
//! door, never from its worktree.
//!
//! Invariants:
//! - Nothing here reads the run's worktree: the pack is a file the
//!   supervisor wrote under a scratch directory it owns, indexed into an
//!   object database of its own in that directory (libgit2's indexer, which
//!   computes every object's id from its content and refuses a pack whose
//!   trailing checksum is wrong or whose deltas name bases it does not hold:
//!   a "thin" pack is refused).
//! - The commit is copied into the host by the same walk as an import
//!   ([`super::objects::copy_reachable`]): every object it reaches is either
//!   already in the host or in the pack, checked by kind and size, and
//!   written with its id compared; an object in neither (a commit not fully
//!   connected) refuses the whole request and leaves no ref.
//! - Bounded: the caller caps the pack's size; the indexer is stopped past
//!   `max_objects` objects; objects are bounded by [`ImportLimits`].
//! - The host gains objects and one ref, `dest_ref`. The caller removes the
//!   scratch directory.
//!
//! Residual risk, as for imports: a delta in a pack can name a result far
//! larger than the pack (a deflated run of zeros), which libgit2 inflates in
//! memory while indexing; memory is then bounded by about 1000x the pack cap.

use std::fs::File;
use std::path::Path;

use git2::{Indexer, Odb};

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
    /// (the commit must then already be in the host).
    pub pack: Option<&'a Path>,
    /// Full 40-hex id of the run's base commit (for the diffstat).
    pub base_commit: &'a str,
    /// The commit the request names.
    pub commit: &'a str,
    /// Where the commit is kept in the host, `refs/nightshift/acts/<id>`.
    pub dest_ref: &'a str,
    pub limits: ImportLimits,
}

/// Indexes the pack into a scratch object database, copies `commit` and
/// what it reaches into the host, and points `dest_ref` at it.
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

    let objects_copied = match objects::copy_reachable(&host_odb, &scratch, wanted, &spec.limits) {
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

/// Runs libgit2's indexer over the pack: it hashes every object, resolves
/// every delta within the pack, and writes `.pack` and `.idx` to `pack_dir`.
fn index(pack: &Path, pack_dir: &Path, limits: &ImportLimits) -> Result<(), GitError> {
    let bad = |why: String| GitError::BadPack { why };
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
