//! A run's result made where the run was, after its agent exited, and
//! taken into the host as a pack.
//!
//! [`pack_result`] runs inside a throwaway sandbox of its own (the
//! supervisor's `nightshift-result`, started on the run's worktree once the
//! agent's container is gone): it imports the worktree exactly as
//! [`super::import_run`] would, into a scratch repository of its own, and
//! packs the objects that import wrote. [`take_result`] is the host's side:
//! the pack goes through [`super::receive_pack`], the checked path an act's
//! pack takes, so the host never reads the worktree by path
//! (`tests::a_packed_result_lands_as_the_host_import_would`).
//!
//! Invariants:
//! - The scratch repository stands on the base commit and its tree as the
//!   supervisor wrote them from the host ([`write_base_objects`], read-only
//!   in the packer's door, an alternate of the scratch repository): what the
//!   agent did to its own copy of the base changes nothing but its history's
//!   fate, as in the host's import
//!   (`tests::a_worktree_without_its_objects_still_gives_its_files`). The pack
//!   holds only what the import wrote beside them, so it never carries the
//!   base's tree again (`tests::a_packed_result_lands_as_the_host_import_would`).
//! - Nothing made here is trusted by the host: [`take_result`] indexes the
//!   pack with every object's id recomputed, lets the result reference only
//!   the pack and the base's history, and checks that the claimed shape
//!   holds (the result is the claimed tip, or an observed-state commit whose
//!   one parent is the claimed tip); anything else is refused and no ref is
//!   made (`tests::a_result_whose_claims_do_not_hold_is_refused_and_no_ref_is_made`).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::{import_run, Captured, ImportLimits, ImportSpec, Imported, PackSpec};
use crate::base::{open_host, parse_full_id};
use crate::run_id::{result_ref, validate_run_id};
use crate::GitError;

/// What to pack, inside the sandbox that makes the result.
#[derive(Debug, Clone, Copy)]
pub struct ResultSpec<'a> {
    pub worktree: &'a Path,
    /// An empty directory of the packer's own (its tmpfs).
    pub scratch: &'a Path,
    /// The base's objects as the supervisor wrote them ([`write_base_objects`]),
    /// read-only: an object directory.
    pub base_objects: &'a Path,
    pub run_id: &'a str,
    pub base_commit: &'a str,
    pub limits: ImportLimits,
    pub committer: (&'a str, &'a str),
    pub leave_out: &'a [&'a str],
}

/// The import made in the scratch repository, and the pack of what it wrote.
#[derive(Debug)]
pub struct PackedResult {
    pub imported: Imported,
    /// The pack file (under the scratch directory).
    pub pack: PathBuf,
    pub pack_bytes: u64,
    /// Objects in the pack.
    pub objects: u64,
}

/// Writes the base commit and every tree and blob of its tree, read from
/// the host repository, as one pack under `dest/pack` (made if missing):
/// what the packer's scratch repository stands on. The supervisor writes it
/// into the packer's read-only door; what the agent did to its own copy of
/// the base in the worktree does not matter.
pub fn write_base_objects(
    host_repo: &Path,
    base_commit: &str,
    dest: &Path,
) -> Result<(), GitError> {
    let base = parse_full_id(base_commit)?;
    let host = open_host(host_repo)?;
    let tree = host
        .find_commit(base)
        .map_err(|source| GitError::MissingBase {
            id: base_commit.to_owned(),
            repo: host_repo.to_owned(),
            source,
        })?
        .tree_id();
    let (mut trees, mut blobs) = (Vec::new(), Vec::new());
    crate::reachable::walk_trees(
        &host,
        vec![tree],
        &mut std::collections::HashSet::new(),
        &mut trees,
        &mut blobs,
    )?;
    let mut ids = vec![base];
    ids.extend(trees);
    ids.extend(blobs);
    let git_dir = dest.parent().unwrap_or(dest);
    let pack_dir = dest.join("pack");
    fs::create_dir_all(&pack_dir)
        .map_err(|e| GitError::io("making the base's object directory", &pack_dir, e))?;
    // git's own pack-objects (reusing the host's compressed objects) needs
    // a repository around the object directory.
    if dest.file_name().is_some_and(|n| n == "objects")
        && Repository::init_bare(git_dir).is_ok()
        && crate::reachable::write_pack_reusing(host.commondir(), &ids, git_dir)?
    {
        return Ok(());
    }
    let odb = host
        .odb()
        .map_err(|e| GitError::git("opening the host object database", e))?;
    crate::reachable::write_pack_of(&odb, &ids, &pack_dir, "base")
}

/// Imports `spec.worktree` into a scratch repository under `spec.scratch`
/// and packs what the import wrote (see the module note).
pub fn pack_result(spec: &ResultSpec<'_>) -> Result<PackedResult, GitError> {
    validate_run_id(spec.run_id)?;
    parse_full_id(spec.base_commit)?;
    git2::opts::strict_hash_verification(true);
    let repo_path = spec.scratch.join("result.git");
    let repo = Repository::init_bare(&repo_path)
        .map_err(|e| GitError::git("making the scratch repository", e))?;
    drop(repo);
    let base_str = spec
        .base_objects
        .to_str()
        .ok_or_else(|| GitError::BadPack {
            why: "the base's object directory is not UTF-8".to_owned(),
        })?;
    let alternates = repo_path.join("objects").join("info").join("alternates");
    fs::write(&alternates, format!("{base_str}\n")).map_err(|e| {
        GitError::io(
            "pointing the scratch repository at the base",
            &alternates,
            e,
        )
    })?;

    let imported = import_run(&ImportSpec {
        host_repo: &repo_path,
        worktree: spec.worktree,
        run_id: spec.run_id,
        base_commit: spec.base_commit,
        limits: spec.limits,
        committer: spec.committer,
        leave_out: spec.leave_out,
    })?;
    // Everything the import wrote is in the scratch repository's own store;
    // without the base's store beside it, that is all its database holds.
    fs::remove_file(&alternates).map_err(|e| {
        GitError::io(
            "parting the scratch repository from the base",
            &alternates,
            e,
        )
    })?;
    let repo = Repository::open_bare(&repo_path)
        .map_err(|e| GitError::git("opening the scratch repository", e))?;
    let own = repo
        .odb()
        .map_err(|e| GitError::git("reading the scratch repository", e))?;
    let mut ids = Vec::new();
    own.foreach(|id| {
        ids.push(*id);
        true
    })
    .map_err(|e| GitError::git("listing the scratch repository's objects", e))?;
    let mut builder = repo
        .packbuilder()
        .map_err(|e| GitError::git("packing the result", e))?;
    for id in &ids {
        builder
            .insert_object(*id, None)
            .map_err(|e| GitError::git(format!("packing object {id}"), e))?;
    }
    let pack = spec.scratch.join("result.pack");
    let mut file =
        fs::File::create(&pack).map_err(|e| GitError::io("writing the result's pack", &pack, e))?;
    let mut failed = None;
    builder
        .foreach(|chunk| match file.write_all(chunk) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        })
        .map_err(|e| GitError::git("writing the result's pack", e))?;
    if let Some(e) = failed {
        return Err(GitError::io("writing the result's pack", &pack, e));
    }
    file.sync_all()
        .map_err(|e| GitError::io("writing the result's pack", &pack, e))?;
    let pack_bytes = fs::metadata(&pack)
        .map_err(|e| GitError::io("writing the result's pack", &pack, e))?
        .len();
    Ok(PackedResult {
        imported,
        pack,
        pack_bytes,
        objects: ids.len() as u64,
    })
}

/// What a packer claims its result is.
#[derive(Debug, Clone, Copy)]
pub struct ResultClaim<'a> {
    pub result_commit: &'a str,
    pub agent_tip: &'a str,
    /// The observed-state commit, when the working files differed from the tip.
    pub observed_commit: Option<&'a str>,
}

/// Takes a packed result into the host as `refs/nightshift/runs/<run>`:
/// through [`super::receive_pack`] (the act's checked path), then the claim
/// checked against what arrived (see the module note). On a refusal no ref
/// is left.
pub fn take_result(
    host_repo: &Path,
    scratch: &Path,
    pack: Option<&Path>,
    run_id: &str,
    base_commit: &str,
    claim: &ResultClaim<'_>,
    limits: ImportLimits,
) -> Result<Captured, GitError> {
    validate_run_id(run_id)?;
    let reference = result_ref(run_id);
    let result = parse_full_id(claim.result_commit)?;
    let tip = parse_full_id(claim.agent_tip)?;
    let refused = |why: String| GitError::ResultRefused { why };
    let captured = super::receive_pack(&PackSpec {
        host_repo,
        scratch,
        pack,
        base_commit,
        commit: claim.result_commit,
        dest_ref: &reference,
        limits,
    })?;
    let checked = (|| {
        let host = open_host(host_repo)?;
        let commit = host
            .find_commit(result)
            .map_err(|e| GitError::git(format!("reading the result {result}"), e))?;
        match claim.observed_commit {
            None if result == tip => Ok(()),
            None => Err(refused(format!(
                "the result {result} is not the claimed tip {tip} and no observed-state commit was named"
            ))),
            Some(observed) if parse_full_id(observed)? != result => Err(refused(format!(
                "the observed-state commit {observed} is not the result {result}"
            ))),
            Some(_) => {
                let parents: Vec<Oid> = commit.parent_ids().collect();
                if parents == [tip] {
                    Ok(())
                } else {
                    Err(refused(format!(
                        "the observed-state commit {result} has parents {parents:?}, not the claimed tip {tip}"
                    )))
                }
            }
        }
    })();
    if let Err(e) = checked {
        if let Ok(host) = open_host(host_repo) {
            if let Ok(mut r) = host.find_reference(&reference) {
                let _ = r.delete();
            }
        }
        return Err(e);
    }
    Ok(captured)
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

    /// A host repository of two commits and a run's worktree of its tip, in
    /// which an agent committed once and left files uncommitted.
    fn night() -> (tempfile::TempDir, tempfile::TempDir, String) {
        let host = tempfile::tempdir().unwrap();
        git(host.path(), &["init", "-q", "-b", "main"]);
        for (i, text) in ["one\n", "two\n"].iter().enumerate() {
            std::fs::create_dir_all(host.path().join("src")).unwrap();
            std::fs::write(host.path().join("src").join(format!("f{i}")), text).unwrap();
            git(host.path(), &["add", "-A"]);
            git(host.path(), &["commit", "-qm", text.trim()]);
        }
        let base = git(host.path(), &["rev-parse", "HEAD"]);
        let runs = tempfile::tempdir().unwrap();
        crate::create_worktree(&crate::WorktreeSpec {
            host_repo: host.path().to_owned(),
            base_commit: base.clone(),
            run_id: "r1".into(),
            dest: runs.path().join("wt"),
            owner: None,
            history_cache: None,
        })
        .unwrap();
        let wt = runs.path().join("wt");
        std::fs::write(wt.join("src/f0"), "changed and committed\n").unwrap();
        git(&wt, &["add", "-A"]);
        git(&wt, &["commit", "-qm", "agent"]);
        std::fs::write(wt.join("new file"), "uncommitted\n").unwrap();
        std::fs::remove_file(wt.join("src/f1")).unwrap();
        (host, runs, base)
    }

    fn clone_of(host: &Path) -> tempfile::TempDir {
        let to = tempfile::tempdir().unwrap();
        git(
            to.path(),
            &["clone", "-q", "--bare", host.to_str().unwrap(), "."],
        );
        to
    }

    /// The base's objects as the supervisor writes them, under `scratch`.
    fn base_objects(host: &Path, scratch: &Path, base: &str) -> PathBuf {
        let dest = scratch.join("door-base").join("objects");
        write_base_objects(host, base, &dest).unwrap();
        dest
    }

    /// Takes `packed` into `host` under the claim `(result, tip, observed)`.
    fn take(
        host: &Path,
        packed: &PackedResult,
        base: &str,
        claim: (&str, &str, Option<&str>),
    ) -> Result<Captured, GitError> {
        let scratch = tempfile::tempdir().unwrap();
        take_result(
            host,
            scratch.path(),
            Some(&packed.pack),
            "r1",
            base,
            &ResultClaim {
                result_commit: claim.0,
                agent_tip: claim.1,
                observed_commit: claim.2,
            },
            ImportLimits::default(),
        )
    }

    /// Takes `packed` into `host` as the packer claimed it.
    fn take_as_claimed(
        host: &Path,
        packed: &PackedResult,
        base: &str,
    ) -> Result<Captured, GitError> {
        let i = &packed.imported;
        take(
            host,
            packed,
            base,
            (&i.result_commit, &i.agent_tip, i.observed_commit.as_deref()),
        )
    }

    fn spec<'a>(
        wt: &'a Path,
        scratch: &'a Path,
        base_objects: &'a Path,
        base: &'a str,
    ) -> ResultSpec<'a> {
        ResultSpec {
            worktree: wt,
            scratch,
            base_objects,
            run_id: "r1",
            base_commit: base,
            limits: ImportLimits::default(),
            committer: ("nightshift", "nightshift@localhost"),
            leave_out: &[],
        }
    }

    #[test]
    fn a_packed_result_lands_as_the_host_import_would() {
        let (host, runs, base) = night();
        let wt = runs.path().join("wt");
        let copy = runs.path().join("copy");
        assert!(Command::new("cp")
            .args(["-a"])
            .arg(&wt)
            .arg(&copy)
            .status()
            .unwrap()
            .success());
        // The host's own import of one copy.
        let by_path = clone_of(host.path());
        let direct = import_run(&ImportSpec {
            host_repo: by_path.path(),
            worktree: &copy,
            run_id: "r1",
            base_commit: &base,
            limits: ImportLimits::default(),
            committer: ("nightshift", "nightshift@localhost"),
            leave_out: &[],
        })
        .unwrap();

        // The packer's of the other, taken through the pack.
        let scratch = tempfile::tempdir().unwrap();
        let door = tempfile::tempdir().unwrap();
        let objects = base_objects(host.path(), door.path(), &base);
        let packed = pack_result(&spec(&wt, scratch.path(), &objects, &base)).unwrap();
        let by_pack = clone_of(host.path());
        let captured = take_as_claimed(by_pack.path(), &packed, &base).unwrap();
        assert_eq!(packed.imported.agent_tip, direct.agent_tip);
        assert_eq!(packed.imported.result_tree, direct.result_tree);
        assert_eq!(captured.tree, direct.result_tree);
        assert!(packed.imported.observed_commit.is_some());
        assert_eq!(
            (
                captured.files_changed,
                captured.insertions,
                captured.deletions
            ),
            (direct.files_changed, direct.insertions, direct.deletions)
        );
        let landed = git(by_pack.path(), &["rev-parse", "refs/nightshift/runs/r1"]);
        assert_eq!(landed, packed.imported.result_commit);
        assert_eq!(
            git(by_pack.path(), &["rev-parse", "refs/nightshift/runs/r1^"]),
            direct.agent_tip
        );
        // The pack carries what the run made, not the base's tree again:
        // the agent's commit, its root and `src` trees, one changed blob;
        // the observed commit, its root and `src` trees, one new blob.
        git(
            by_pack.path(),
            &["index-pack", packed.pack.to_str().unwrap()],
        );
        let listed = git(
            by_pack.path(),
            &[
                "verify-pack",
                "-v",
                packed.pack.with_extension("idx").to_str().unwrap(),
            ],
        );
        assert_eq!(packed.objects, 8, "{listed}");
        git(by_pack.path(), &["fsck", "--strict", "--no-dangling"]);
    }

    #[test]
    fn a_result_whose_claims_do_not_hold_is_refused_and_no_ref_is_made() {
        let (host, runs, base) = night();
        let wt = runs.path().join("wt");
        let scratch = tempfile::tempdir().unwrap();
        let door = tempfile::tempdir().unwrap();
        let objects = base_objects(host.path(), door.path(), &base);
        let packed = pack_result(&spec(&wt, scratch.path(), &objects, &base)).unwrap();
        let observed = packed.imported.observed_commit.clone().unwrap();
        let claims = [
            // The observed commit presented as the agent's own tip.
            (observed.as_str(), base.as_str(), None),
            // An observed commit whose parent is not the claimed tip.
            (observed.as_str(), base.as_str(), Some(observed.as_str())),
            // A result other than the named observed commit.
            (
                packed.imported.agent_tip.as_str(),
                base.as_str(),
                Some(observed.as_str()),
            ),
        ];
        for (result, tip, observed_commit) in claims {
            let to = clone_of(host.path());
            let err = take(to.path(), &packed, &base, (result, tip, observed_commit)).unwrap_err();
            assert!(
                matches!(err, GitError::ResultRefused { .. }),
                "{result} {tip} {observed_commit:?}: {err}"
            );
            let refs = git(to.path(), &["for-each-ref", "refs/nightshift/"]);
            assert_eq!(refs, "", "a refused result left a ref");
        }
        // A commit the pack does not hold and the base does not reach.
        let to = clone_of(host.path());
        let stranger = "1111111111111111111111111111111111111111";
        let err = take(to.path(), &packed, &base, (stranger, stranger, None)).unwrap_err();
        assert!(matches!(err, GitError::NotConnected { .. }), "{err}");
    }

    #[test]
    fn a_worktree_without_its_objects_still_gives_its_files() {
        let (host, runs, base) = night();
        let wt = runs.path().join("wt");
        std::fs::remove_dir_all(wt.join(".git/objects")).unwrap();
        std::fs::create_dir(wt.join(".git/objects")).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let door = tempfile::tempdir().unwrap();
        let objects = base_objects(host.path(), door.path(), &base);
        let packed = pack_result(&spec(&wt, scratch.path(), &objects, &base)).unwrap();
        assert_eq!(packed.imported.agent_tip, base, "the history is dropped");
        assert!(packed.imported.history_dropped.is_some());
        let to = clone_of(host.path());
        take_as_claimed(to.path(), &packed, &base).unwrap();
        let shown = git(to.path(), &["show", "refs/nightshift/runs/r1:src/f0"]);
        assert_eq!(shown, "changed and committed");
        let shown = git(to.path(), &["show", "refs/nightshift/runs/r1:new file"]);
        assert_eq!(shown, "uncommitted");
    }
}
