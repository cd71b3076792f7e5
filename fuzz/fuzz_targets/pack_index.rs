//! The pack receiver (`orchestrator/git/src/import/pack.rs`,
//! `receive_pack`): a pack an agent sent over the door with a push or a
//! pull request, indexed by libgit2 into a scratch object store and the
//! commit it names copied into the host.
//!
//! The input is the pack's bytes. When it starts with `PACK` its last 20
//! bytes are replaced by the SHA-1 of the rest, as any sender can compute:
//! otherwise almost every mutation would stop at the trailer check and
//! never reach the object parser, the delta resolver or the copy. Each
//! input gets a fresh host repository holding one base commit (the same
//! ids every time, so the corpus's real packs apply to it) and asks for
//! the commit the seed packs carry (`fuzz/seed.sh` makes them).
//! Checked, beyond "no panic": the receiver either takes that commit and
//! makes the ref, or refuses with an error and makes no ref.
#![no_main]

use std::path::Path;

use git2::{Repository, RepositoryInitOptions, Signature, Time};
use libfuzzer_sys::fuzz_target;
use orchestrator_git::{receive_pack, ImportLimits, PackSpec};
use sha1::{Digest, Sha1};

/// The host's base commit: file `a` holding "a\n", message "base",
/// author and committer `t <t@localhost>` at 1700000000 +0000.
const BASE: &str = include_str!("../seeds/pack_index.base");
/// The commit the seed packs carry (two commits on top of the base).
const WANTED: &str = include_str!("../seeds/pack_index.wanted");

fn host(dir: &Path) -> String {
    // No template files (hook samples): only what a repository needs.
    let mut opts = RepositoryInitOptions::new();
    opts.external_template(false);
    let repo = Repository::init_opts(dir, &opts).expect("init");
    let blob = repo.blob(b"a\n").expect("blob");
    let mut tree = repo.treebuilder(None).expect("treebuilder");
    tree.insert("a", blob, 0o100644).expect("insert");
    let tree = repo.find_tree(tree.write().expect("tree")).expect("tree");
    let sig = Signature::new("t", "t@localhost", &Time::new(1_700_000_000, 0)).expect("sig");
    repo.commit(Some("refs/heads/main"), &sig, &sig, "base\n", &tree, &[])
        .expect("commit")
        .to_string()
}

fuzz_target!(|data: &[u8]| {
    let mut pack = data.to_vec();
    if pack.starts_with(b"PACK") && pack.len() >= 32 {
        let body = pack.len() - 20;
        let sum = Sha1::digest(&pack[..body]);
        pack[body..].copy_from_slice(&sum);
    }
    // In memory when the machine has /dev/shm: the receiver writes a pack,
    // its index and the host's objects for every input.
    let shm = Path::new("/dev/shm");
    let under = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let tmp = tempfile::Builder::new()
        .prefix("fuzz-pack")
        .tempdir_in(under)
        .expect("tempdir");
    let host_dir = tmp.path().join("host");
    let base = host(&host_dir);
    assert_eq!(
        base,
        BASE.trim(),
        "the host's base commit is not the seeds'"
    );
    let file = tmp.path().join("in.pack");
    std::fs::write(&file, &pack).expect("writing the pack");
    let dest_ref = "refs/nightshift/acts/fuzz";
    let spec = PackSpec {
        host_repo: &host_dir,
        scratch: &tmp.path().join("scratch"),
        pack: Some(&file),
        base_commit: &base,
        commit: WANTED.trim(),
        dest_ref,
        limits: ImportLimits {
            max_file_bytes: 1 << 20,
            max_total_bytes: 4 << 20,
            max_files: 1000,
            max_objects: 1000,
        },
    };
    let got = receive_pack(&spec);
    let repo = Repository::open(&host_dir).expect("reopen");
    match got {
        Ok(captured) => {
            assert_eq!(captured.commit, WANTED.trim());
            let r = repo.refname_to_id(dest_ref).expect("the ref is made");
            assert_eq!(r.to_string(), captured.commit);
        }
        Err(e) => {
            let _ = e.to_string();
            assert!(
                repo.find_reference(dest_ref).is_err(),
                "a refused pack made the ref: {e}"
            );
        }
    }
});
