//! import_run on a worktree written by an adversary: nothing in it may run or be
//! interpreted on the host, no symlink may be followed out of it, no special
//! file may hang the import, and no object from elsewhere may be smuggled in.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use common::{contains, git, git_raw, write, Fixture};
use orchestrator_git::{
    import_run, remove_worktree, GitError, HistoryDropped, Imported, SkipReason, TipSource,
};

/// Only a guard against hanging CI; the test asserts that the import returned,
/// never how fast.
const DEADLINE: Duration = Duration::from_secs(300);

fn import_with_deadline(fx: &Fixture, wt: &Path, run_id: &str) -> Result<Imported, GitError> {
    let (tx, rx) = mpsc::channel();
    let (host, wt, run_id, base) = (
        fx.host.clone(),
        wt.to_owned(),
        run_id.to_owned(),
        fx.base.clone(),
    );
    std::thread::spawn(move || {
        let spec = orchestrator_git::ImportSpec {
            host_repo: &host,
            worktree: &wt,
            run_id: &run_id,
            base_commit: &base,
            limits: orchestrator_git::ImportLimits {
                max_file_bytes: 1 << 20,
                ..Default::default()
            },
            committer: ("nightshift", "nightshift@example.invalid"),
            leave_out: &[],
        };
        let _ = tx.send(import_run(&spec));
    });
    rx.recv_timeout(DEADLINE)
        .expect("import_run did not return: it blocked on something")
}

/// Every object of the host repository, concatenated.
fn all_host_objects(host: &Path) -> Vec<u8> {
    let out = git_raw(host, &["cat-file", "--batch-all-objects", "--batch"]);
    assert!(out.status.success());
    out.stdout
}

fn sentinels(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// A second repository on the host holding a secret blob, as an agent would
/// like to reach through alternates or symlinks.
fn other_repo(fx: &Fixture, secret: &str) -> (PathBuf, String) {
    let other = fx.path("other-repo");
    std::fs::create_dir(&other).unwrap();
    git(&other, &["init", "-q"]);
    write(&other.join("secret.txt"), secret);
    git(&other, &["add", "-A"]);
    git(&other, &["commit", "-q", "-m", "private"]);
    let blob = git(&other, &["rev-parse", "HEAD:secret.txt"]);
    (other, blob)
}

#[test]
fn hostile_worktree_is_read_only_as_data() {
    let fx = Fixture::new();
    let wt = fx.worktree("evil");
    let p = wt.path.clone();
    let sent = fx.path("sentinels");
    std::fs::create_dir(&sent).unwrap();
    let state = fx.path("state");
    let secret = "NIGHTSHIFT-STATE-SECRET-5f1c2a9e";
    write(&state.join("secret.txt"), secret);
    let host_config = std::fs::read(fx.host.join(".git/config")).unwrap();
    let host_head = std::fs::read(fx.host.join(".git/HEAD")).unwrap();

    // The agent commits normally first (its hooks are not planted yet).
    write(&p.join("agent.txt"), "agent was here\n");
    write(
        &p.join(".gitmodules"),
        &format!(
            "[submodule \"s\"]\n\tpath = s\n\turl = {}\n",
            fx.host.display()
        ),
    );
    write(&p.join(".gitattributes"), "* filter=x diff=x\n");
    git(&p, &["add", "-A"]);
    git(&p, &["commit", "-q", "-m", "agent commit"]);
    let agent_tip = git(&p, &["rev-parse", "HEAD"]);

    // Then plants everything that would run on the host if interpreted.
    let touch = |name: &str| format!("touch {}/{name}", sent.display());
    for hook in [
        "post-checkout",
        "pre-commit",
        "post-commit",
        "reference-transaction",
        "pre-auto-gc",
        "post-index-change",
    ] {
        let path = p.join(".git/hooks").join(hook);
        write(
            &path,
            &format!("#!/bin/sh\n{}\n", touch(&format!("hook-{hook}"))),
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let evil_hooks = p.join(".git/evil-hooks");
    for hook in ["post-checkout", "reference-transaction"] {
        write(
            &evil_hooks.join(hook),
            &format!("#!/bin/sh\n{}\n", touch(&format!("hookspath-{hook}"))),
        );
        std::fs::set_permissions(
            evil_hooks.join(hook),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    }
    let config = format!(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = {fsm}\n\thooksPath = {hp}\n\tsshCommand = {ssh}\n\tpager = {pager}\n\
         [filter \"x\"]\n\tclean = {clean}\n\tsmudge = {smudge}\n\tprocess = {process}\n\trequired = true\n\
         [diff \"x\"]\n\ttextconv = {textconv}\n\
         [alias]\n\tlog = !{alias}\n\tshow = !{alias}\n\
         [remote \"origin\"]\n\turl = ext::sh -c {ext}\n",
        fsm = touch("fsmonitor"),
        hp = evil_hooks.display(),
        ssh = touch("ssh"),
        pager = touch("pager"),
        clean = touch("filter-clean"),
        smudge = touch("filter-smudge"),
        process = touch("filter-process"),
        textconv = touch("textconv"),
        alias = touch("alias"),
        ext = touch("ext-remote"),
    );
    write(&p.join(".git/config"), &config);

    // Symlinks out of the worktree, a setuid file, a FIFO, a huge sparse file.
    std::os::unix::fs::symlink("/etc/shadow", p.join("shadow-link")).unwrap();
    std::os::unix::fs::symlink(state.join("secret.txt"), p.join("secret-link")).unwrap();
    std::os::unix::fs::symlink(&state, p.join("state-dir-link")).unwrap();
    write(&p.join("suid-tool"), "#!/bin/sh\necho root\n");
    std::fs::set_permissions(p.join("suid-tool"), std::fs::Permissions::from_mode(0o6755)).unwrap();
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o666);
    nix::unistd::mkfifo(&p.join("pipe"), mode).unwrap();
    nix::unistd::mkfifo(&p.join("src/.gitignore"), mode).unwrap();
    let huge = std::fs::File::create(p.join("huge.bin")).unwrap();
    huge.set_len(20 << 30).unwrap();
    drop(huge);

    // The object store: alternates through a symlink, a FIFO loose object, a
    // symlinked fanout directory.
    let (other, _) = other_repo(&fx, "OTHER-REPO-SECRET-77d0\n");
    write(
        &state.join("alternates"),
        &format!("{}\n", other.join(".git/objects").display()),
    );
    std::os::unix::fs::symlink(
        state.join("alternates"),
        p.join(".git/objects/info/alternates"),
    )
    .unwrap();
    std::fs::create_dir_all(p.join(".git/objects/ab")).unwrap();
    nix::unistd::mkfifo(
        &p.join(".git/objects/ab/cdef0123456789abcdef0123456789abcdef01"),
        mode,
    )
    .unwrap();
    std::os::unix::fs::symlink(other.join(".git/objects"), p.join(".git/objects/ee")).unwrap();

    let got = import_with_deadline(&fx, &p, "evil").expect("a hostile worktree is still imported");
    assert_eq!(got.agent_tip, agent_tip);
    let result = got.result_commit.clone();
    assert!(got.observed_commit.is_some());

    // Read the result on the host with the real git, as a person would.
    git(&fx.host, &["log", "-p", "refs/nightshift/runs/evil"]);
    git(&fx.host, &["show", &result]);
    git(&fx.host, &["fsck", "--no-dangling"]);
    assert_eq!(
        sentinels(&sent),
        Vec::<PathBuf>::new(),
        "something from the worktree ran on the host"
    );

    // No secret reached the host's objects, by symlink or by alternates.
    let objects = all_host_objects(&fx.host);
    assert!(
        !contains(&objects, secret.as_bytes()),
        "the state secret was read through a symlink"
    );
    assert!(
        !contains(&objects, b"OTHER-REPO-SECRET"),
        "another repository's object was imported"
    );
    if let Ok(shadow) = std::fs::read("/etc/shadow") {
        if shadow.len() > 16 {
            assert!(
                !contains(&objects, &shadow[..16]),
                "/etc/shadow was read through a symlink"
            );
        }
    }

    // Symlinks are symlink entries holding their link text.
    let ls = |path: &str| git(&fx.host, &["ls-tree", &result, path]);
    assert!(
        ls("secret-link").starts_with("120000 blob "),
        "{}",
        ls("secret-link")
    );
    assert!(ls("state-dir-link").starts_with("120000 blob "));
    assert!(ls("shadow-link").starts_with("120000 blob "));
    assert_eq!(
        git(
            &fx.host,
            &["cat-file", "-p", &format!("{result}:secret-link")]
        ),
        state.join("secret.txt").to_str().unwrap()
    );
    assert_eq!(
        git(
            &fx.host,
            &["cat-file", "-p", &format!("{result}:shadow-link")]
        ),
        "/etc/shadow"
    );
    // setuid/setgid dropped, exec kept.
    assert!(
        ls("suid-tool").starts_with("100755 blob "),
        "{}",
        ls("suid-tool")
    );
    // FIFO, huge file: skipped and listed, never in the tree.
    assert_eq!(ls("pipe"), "");
    assert_eq!(ls("huge.bin"), "");
    let why = |path: &str| {
        got.skipped
            .iter()
            .find(|s| s.path == path)
            .map(|s| s.why.clone())
    };
    assert_eq!(why("pipe"), Some(SkipReason::SpecialFile { kind: "fifo" }));
    assert_eq!(
        why("src/.gitignore"),
        Some(SkipReason::SpecialFile { kind: "fifo" })
    );
    assert_eq!(
        why("huge.bin"),
        Some(SkipReason::TooLarge {
            size: 20 << 30,
            limit: 1 << 20
        })
    );
    for removed in [
        ".git/objects/info/alternates",
        ".git/objects/ab/cdef0123456789abcdef0123456789abcdef01",
        ".git/objects/ee",
    ] {
        assert!(
            matches!(
                why(removed),
                Some(SkipReason::ObjectStoreEntryRemoved { .. })
            ),
            "{removed}: {:?}",
            got.skipped
        );
    }
    // The committed hostile files are imported as plain data.
    assert!(ls(".gitmodules").starts_with("100644 blob "));

    // The host repository's own state is untouched.
    assert_eq!(
        std::fs::read(fx.host.join(".git/config")).unwrap(),
        host_config
    );
    assert_eq!(std::fs::read(fx.host.join(".git/HEAD")).unwrap(), host_head);
    let refs = git(&fx.host, &["for-each-ref", "--format=%(refname)"]);
    assert_eq!(refs, "refs/heads/main\nrefs/nightshift/runs/evil");

    remove_worktree(&p).unwrap();
    assert!(
        std::fs::symlink_metadata(&p).is_err(),
        "the worktree is gone"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("secret.txt")).unwrap(),
        secret
    );
    assert!(other.join(".git/objects").is_dir());
    assert_eq!(sentinels(&sent), Vec::<PathBuf>::new());
}

/// An agent commits a blob that exists only in another host repository named
/// by `alternates` (a regular file, or a symlink to one). Without the
/// alternate the commit cannot be copied: its history is dropped (the
/// working files still come back), and the secret is never fetched.
#[test]
fn alternates_cannot_smuggle_objects_from_other_repositories() {
    for symlinked in [false, true] {
        let fx = Fixture::new();
        let wt = fx.worktree("alt");
        let p = wt.path.clone();
        let (other, blob) = other_repo(&fx, "SMUGGLED-SECRET-a1b2\n");
        let line = format!("{}\n", other.join(".git/objects").display());
        let alternates = p.join(".git/objects/info/alternates");
        if symlinked {
            write(&fx.path("alt-file"), &line);
            std::os::unix::fs::symlink(fx.path("alt-file"), &alternates).unwrap();
        } else {
            write(&alternates, &line);
        }
        // With the alternate in place the agent's git can commit the blob.
        git(
            &p,
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("100644,{blob},stolen.txt"),
            ],
        );
        git(&p, &["commit", "-q", "-m", "steal"]);

        let got = import_with_deadline(&fx, &p, "alt").unwrap();
        assert_eq!(
            got.history_dropped,
            Some(HistoryDropped::MissingObject {
                object: blob.clone()
            })
        );
        assert_eq!(got.tip_source, TipSource::Base);
        assert!(
            !contains(&all_host_objects(&fx.host), b"SMUGGLED-SECRET"),
            "symlinked: {symlinked}"
        );
        assert!(
            !git_raw(
                &fx.host,
                &["cat-file", "-e", "refs/nightshift/runs/alt:stolen.txt"]
            )
            .status
            .success(),
            "the stolen blob is not in the result"
        );
    }
}

/// The same through a loose object file that is a symlink to the other
/// repository's object file.
#[test]
fn symlinked_object_files_are_not_read() {
    let fx = Fixture::new();
    let wt = fx.worktree("lnk");
    let p = wt.path.clone();
    let (other, blob) = other_repo(&fx, "LINKED-SECRET-c3d4\n");
    let rel = format!("{}/{}", &blob[..2], &blob[2..]);
    std::fs::create_dir_all(p.join(".git/objects").join(&blob[..2])).unwrap();
    std::os::unix::fs::symlink(
        other.join(".git/objects").join(&rel),
        p.join(".git/objects").join(&rel),
    )
    .unwrap();
    git(
        &p,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("100644,{blob},stolen.txt"),
        ],
    );
    git(&p, &["commit", "-q", "-m", "steal"]);

    let got = import_with_deadline(&fx, &p, "lnk").unwrap();
    assert_eq!(
        got.history_dropped,
        Some(HistoryDropped::MissingObject {
            object: blob.clone()
        })
    );
    assert!(!contains(&all_host_objects(&fx.host), b"LINKED-SECRET"));
}

#[test]
fn a_symlinked_git_dir_or_object_dir_is_refused() {
    let fx = Fixture::new();
    for (i, target) in [".git", ".git/objects", ".git/objects/pack"]
        .into_iter()
        .enumerate()
    {
        let run = format!("sym{i}");
        let wt = fx.worktree(&run);
        let path = wt.path.join(target);
        let moved = fx.path(&format!("moved{i}"));
        std::fs::rename(&path, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &path).unwrap();
        let got = import_with_deadline(&fx, &wt.path, &run).unwrap();
        assert_eq!(
            got.history_dropped,
            Some(HistoryDropped::HostileGitDir),
            "{target}"
        );
        assert_eq!(got.agent_tip, fx.base, "{target}");
    }
}

#[test]
fn special_ref_files_neither_hang_nor_are_followed() {
    let fx = Fixture::new();
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o666);

    // HEAD as a FIFO: ignored, the run branch is used.
    let wt = fx.worktree("fifohead");
    std::fs::remove_file(wt.path.join(".git/HEAD")).unwrap();
    nix::unistd::mkfifo(&wt.path.join(".git/HEAD"), mode).unwrap();
    let got = import_with_deadline(&fx, &wt.path, "fifohead").unwrap();
    assert_eq!(got.agent_tip, fx.base);

    // The run branch as a FIFO, or a symlink to a ref elsewhere: refused (the
    // history is dropped).
    for (run, make) in [("fiforef", 0), ("linkref", 1)] {
        let wt = fx.worktree(run);
        let r = wt
            .path
            .join(format!(".git/refs/heads/nightshift/run/{run}"));
        std::fs::remove_file(&r).unwrap();
        if make == 0 {
            nix::unistd::mkfifo(&r, mode).unwrap();
        } else {
            std::os::unix::fs::symlink(fx.host.join(".git/refs/heads/main"), &r).unwrap();
        }
        let got = import_with_deadline(&fx, &wt.path, run).unwrap();
        assert_eq!(got.history_dropped, Some(HistoryDropped::BadTip), "{run}");
    }

    // A ref pointing at an object nobody has.
    let wt = fx.worktree("dangling");
    write(
        &wt.path.join(".git/refs/heads/nightshift/run/dangling"),
        "0123456789abcdef0123456789abcdef01234567\n",
    );
    let got = import_with_deadline(&fx, &wt.path, "dangling").unwrap();
    assert_eq!(got.history_dropped, Some(HistoryDropped::BadTip));
    assert_eq!(got.result_commit, fx.base, "nothing else changed");
}

#[test]
fn nested_git_dirs_and_deep_trees_are_skipped_not_followed() {
    let fx = Fixture::new();
    let wt = fx.worktree("nest");
    let p = wt.path.clone();
    write(
        &p.join("vendor/lib/.git/config"),
        "[core]\n\tfsmonitor = touch /tmp/x\n",
    );
    write(&p.join("vendor/lib/code.rs"), "fn main() {}\n");
    write(&p.join("vendor/.GIT/HEAD"), "x");
    let mut deep = p.join("deep");
    for _ in 0..300 {
        deep.push("d");
    }
    write(&deep.join("bottom.txt"), "too deep");
    let got = import_with_deadline(&fx, &p, "nest").unwrap();
    assert!(
        got.skipped
            .iter()
            .any(|s| matches!(s.why, SkipReason::TooDeep { limit: 256 })),
        "{:?}",
        got.skipped
    );
    let skipped: Vec<&str> = got
        .skipped
        .iter()
        .filter(|s| s.why == SkipReason::NestedGitDir)
        .map(|s| s.path.as_str())
        .collect();
    assert_eq!(skipped, vec!["vendor/.GIT", "vendor/lib/.git"]);
    let tree = git(
        &fx.host,
        &["ls-tree", "-r", "--name-only", &got.result_commit],
    );
    assert!(
        tree.contains("vendor/lib/code.rs") && !tree.contains(".git/") && !tree.contains(".GIT"),
        "{tree}"
    );
}
