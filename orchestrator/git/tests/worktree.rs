//! create_worktree, resolve_base and remove_worktree against real repositories.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::{all_files, contains, git, write, Fixture};
use orchestrator_git::{create_worktree, remove_worktree, resolve_base, GitError, WorktreeSpec};

#[test]
fn worktree_is_a_clean_checkout_on_the_run_branch() {
    let fx = Fixture::new();
    let wt = fx.worktree("r1");
    assert_eq!(wt.branch, "refs/heads/nightshift/run/r1");
    assert_eq!(wt.base_commit, fx.base);
    assert_eq!(wt.base_tree, git(&fx.host, &["rev-parse", "HEAD^{tree}"]));

    let p = &wt.path;
    assert_eq!(
        git(p, &["symbolic-ref", "HEAD"]),
        "refs/heads/nightshift/run/r1"
    );
    assert_eq!(git(p, &["rev-parse", "HEAD"]), fx.base);
    assert_eq!(git(p, &["status", "--porcelain", "--ignored"]), "");
    // Without refreshing the index: the stat data git recorded is the files' own.
    assert_eq!(git(p, &["diff-files", "--name-only"]), "");
    // Full history, so `git log` works for the agent.
    assert_eq!(git(p, &["rev-list", "--count", "HEAD"]), "2");
    git(p, &["fsck", "--no-dangling"]);
    // Files as committed: exec bit, symlink, contents.
    let run = std::fs::metadata(p.join("bin/run.sh")).unwrap();
    assert_eq!(run.permissions().mode() & 0o111, 0o111);
    assert_eq!(
        std::fs::read_link(p.join("src/readme-link"))
            .unwrap()
            .to_str(),
        Some("../README.md")
    );
    assert_eq!(
        std::fs::read_to_string(p.join("src/lib.rs")).unwrap(),
        "one\ntwo\nthree\n"
    );
}

#[test]
fn worktree_has_no_remote_hook_alternate_or_pointer_to_the_host() {
    let fx = Fixture::new();
    // The host has a remote and a hook; neither may reach the worktree.
    git(
        &fx.host,
        &[
            "remote",
            "add",
            "origin",
            "https://user:token@example.invalid/repo.git",
        ],
    );
    write(
        &fx.host.join(".git/hooks/post-checkout"),
        "#!/bin/sh\nexit 1\n",
    );
    let wt = fx.worktree("r2");
    let gitdir = wt.path.join(".git");
    assert!(
        std::fs::symlink_metadata(&gitdir).unwrap().is_dir(),
        ".git must be a directory, not a gitdir file"
    );
    assert_eq!(git(&wt.path, &["remote"]), "");
    let hooks = gitdir.join("hooks");
    assert!(!hooks.exists() || std::fs::read_dir(&hooks).unwrap().next().is_none());
    assert!(!gitdir.join("objects/info/alternates").exists());
    assert!(!gitdir.join("commondir").exists() && !gitdir.join("gitdir").exists());

    let host_path = fx.host.to_str().unwrap().as_bytes().to_vec();
    let host_parent = fx.dir.path().to_str().unwrap().as_bytes().to_vec();
    for (path, bytes) in all_files(&gitdir) {
        assert!(
            !contains(&bytes, &host_path),
            "{} names the host repository",
            path.display()
        );
        assert!(
            !contains(&bytes, &host_parent),
            "{} names the host's directory",
            path.display()
        );
        assert!(
            !contains(&bytes, b"token"),
            "{} carries the host remote's credentials",
            path.display()
        );
    }
    let config = std::fs::read_to_string(gitdir.join("config")).unwrap();
    assert!(
        !config.contains("remote") && !config.contains("hooksPath"),
        "{config}"
    );
}

#[test]
fn object_files_are_copies_not_hard_links() {
    let fx = Fixture::new();
    git(&fx.host, &["gc", "-q"]);
    // One more loose object besides the pack.
    write(&fx.host.join("loose.txt"), "loose\n");
    git(&fx.host, &["add", "loose.txt"]);
    git(&fx.host, &["commit", "-q", "-m", "loose"]);
    let fx = Fixture {
        base: git(&fx.host, &["rev-parse", "HEAD"]),
        ..fx
    };
    let wt = fx.worktree("r3");
    let mut seen = 0;
    let mut stack = vec![wt.path.join(".git/objects")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                assert!(m.is_file(), "{} is not a regular file", e.path().display());
                assert_eq!(m.nlink(), 1, "{} is hard-linked", e.path().display());
                seen += 1;
            }
        }
    }
    assert!(
        seen >= 3,
        "expected a pack, its index and loose objects, saw {seen}"
    );
    assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(wt.path.join("loose.txt")).unwrap(),
        "loose\n"
    );
}

#[test]
fn owner_is_applied_to_everything_and_the_index_matches() {
    let fx = Fixture::new();
    let wt = create_worktree(&WorktreeSpec {
        host_repo: fx.host.clone(),
        base_commit: fx.base.clone(),
        run_id: "owned".into(),
        dest: fx.path("wt-owned"),
        owner: Some((1000, 1001)),
        history_cache: None,
    })
    .unwrap();
    let mut stack = vec![wt.path.clone()];
    let mut count = 0;
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (1000, 1001), "{}", p.display());
        count += 1;
        if m.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        }
    }
    assert!(count > 10);
    // chown moves ctimes: the index must have been refreshed after it, or
    // diff-files (which does not refresh) lists every file. Dating the index
    // an hour ahead keeps git from taking the entries as racily clean, which
    // would make it compare contents and hide stale stat data.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(wt.path.join(".git/index"))
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_modified(later))
        .unwrap();
    assert_eq!(git(&wt.path, &["diff-files", "--name-only"]), "");
    assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
}

#[test]
fn creation_errors_are_distinct() {
    let fx = Fixture::new();
    let spec = |dest: std::path::PathBuf, run_id: &str| WorktreeSpec {
        host_repo: fx.host.clone(),
        base_commit: fx.base.clone(),
        run_id: run_id.into(),
        dest,
        owner: None,
        history_cache: None,
    };
    // An empty directory is a mount point made for the worktree; one
    // holding anything, or a file, is taken.
    std::fs::create_dir(fx.path("taken")).unwrap();
    std::fs::write(fx.path("taken").join("f"), "x").unwrap();
    let e = create_worktree(&spec(fx.path("taken"), "a")).unwrap_err();
    assert!(matches!(e, GitError::BadDestination { .. }), "{e}");
    std::fs::write(fx.path("file"), "x").unwrap();
    let e = create_worktree(&spec(fx.path("file"), "a")).unwrap_err();
    assert!(matches!(e, GitError::BadDestination { .. }), "{e}");
    let e = create_worktree(&spec(fx.path("no/such/parent"), "a")).unwrap_err();
    assert!(matches!(e, GitError::BadDestination { .. }), "{e}");
    let e = create_worktree(&spec(fx.path("x"), "../escape")).unwrap_err();
    assert!(matches!(e, GitError::InvalidRunId { .. }), "{e}");
    let mut s = spec(fx.path("y"), "a");
    s.base_commit = "0123456789012345678901234567890123456789".into();
    let e = create_worktree(&s).unwrap_err();
    assert!(matches!(e, GitError::MissingBase { .. }), "{e}");
    assert!(
        !fx.path("y").exists(),
        "a failed creation leaves nothing behind"
    );
    s.base_commit = "HEAD".into();
    assert!(matches!(
        create_worktree(&s).unwrap_err(),
        GitError::InvalidCommitId { .. }
    ));
}

#[test]
fn resolve_base_names_what_is_wrong() {
    let fx = Fixture::new();
    let b = resolve_base(&fx.host, "main").unwrap();
    assert_eq!(b.commit, fx.base);
    assert_eq!(b.tree, git(&fx.host, &["rev-parse", "HEAD^{tree}"]));
    git(&fx.host, &["tag", "-a", "-m", "v1", "v1", "HEAD~1"]);
    assert_eq!(
        resolve_base(&fx.host, "v1").unwrap().commit,
        git(&fx.host, &["rev-parse", "HEAD~1"])
    );

    let e = resolve_base(&fx.path("nowhere"), "main").unwrap_err();
    assert!(matches!(e, GitError::NotARepository { .. }));
    assert!(e.to_string().contains("nowhere"), "{e}");

    let e = resolve_base(&fx.host, "no-such-branch").unwrap_err();
    assert!(matches!(e, GitError::UnknownRef { .. }));
    assert!(e.to_string().contains("no-such-branch"), "{e}");

    let tree = git(&fx.host, &["rev-parse", "HEAD^{tree}"]);
    let e = resolve_base(&fx.host, &tree).unwrap_err();
    assert!(
        matches!(e, GitError::NotACommit { ref kind, .. } if kind == "tree"),
        "{e}"
    );
    let blob = git(&fx.host, &["rev-parse", "HEAD:README.md"]);
    git(&fx.host, &["tag", "blobtag", &blob]);
    let e = resolve_base(&fx.host, "blobtag").unwrap_err();
    assert!(matches!(e, GitError::NotACommit { .. }), "{e}");
}

#[test]
fn remove_worktree_leaves_nothing_and_follows_no_symlink() {
    let fx = Fixture::new();
    let wt = fx.worktree("rm");
    let outside = fx.path("outside");
    write(&outside.join("keep.txt"), "keep\n");
    let p = &wt.path;
    std::os::unix::fs::symlink(&outside, p.join("dirlink")).unwrap();
    std::os::unix::fs::symlink(outside.join("keep.txt"), p.join("filelink")).unwrap();
    write(&p.join("ro/deep/file"), "x");
    write(&p.join("suid"), "#!/bin/sh\n");
    std::fs::set_permissions(p.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::set_permissions(p.join("ro/deep"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::set_permissions(p.join("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
    nix::unistd::mkfifo(
        &p.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();

    remove_worktree(p).unwrap();
    assert!(
        std::fs::symlink_metadata(p).is_err(),
        "worktree still there"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("keep.txt")).unwrap(),
        "keep\n"
    );
    // Removing what is gone is not an error; a symlink is refused, not followed.
    remove_worktree(p).unwrap();
    let link = fx.path("link-to-outside");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    assert!(remove_worktree(&link).is_err());
    assert!(outside.join("keep.txt").exists());
}

#[test]
fn index_order_and_submodules_match_git() {
    let fx = Fixture::new();
    // Tree order puts `a/` after `a.b` and `a-c`; the index orders by bytes.
    for name in ["a.b", "a/x", "a-c", "a0", "a/b/c"] {
        write(&fx.host.join(name), name);
    }
    git(&fx.host, &["add", "-A"]);
    let sub_commit = fx.base.clone();
    git(
        &fx.host,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{sub_commit},sub"),
        ],
    );
    git(
        &fx.host,
        &["commit", "-q", "-m", "ordering and a submodule"],
    );
    let fx = Fixture {
        base: git(&fx.host, &["rev-parse", "HEAD"]),
        ..fx
    };
    let wt = fx.worktree("order");
    assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
    assert_eq!(
        git(&wt.path, &["ls-files", "-s", "sub"]),
        format!("160000 {sub_commit} 0\tsub")
    );
    assert!(wt.path.join("sub").is_dir());
    assert_eq!(
        git(&wt.path, &["ls-files"]),
        git(&fx.host, &["ls-files"]),
        "same paths in the same order as git's own index"
    );
}

/// The worktree holds exactly the objects reachable from its base: a stash,
/// another branch, a commit reset away and an unreferenced blob of the host
/// are not readable in it, and what it holds passes `git fsck`.
#[test]
fn worktree_holds_only_objects_reachable_from_the_base() {
    let fx = Fixture::new();
    let h = &fx.host;
    // Packed objects and loose ones, as a real host has both.
    git(h, &["gc", "-q"]);
    write(&h.join("stashed.txt"), "STASHED-SECRET-1\n");
    git(h, &["add", "stashed.txt"]);
    git(h, &["stash", "-q"]);
    let stash = git(h, &["rev-parse", "refs/stash"]);
    let stashed_blob = git(h, &["rev-parse", "refs/stash:stashed.txt"]);
    git(h, &["checkout", "-q", "--orphan", "other"]);
    git(h, &["rm", "-rq", "--cached", "."]);
    write(&h.join("other.txt"), "OTHER-BRANCH-SECRET-2\n");
    git(h, &["add", "other.txt"]);
    git(h, &["commit", "-q", "-m", "unrelated"]);
    let other = git(h, &["rev-parse", "HEAD"]);
    git(h, &["checkout", "-q", "-f", "main"]);
    write(&h.join("gone.txt"), "RESET-AWAY-SECRET-3\n");
    git(h, &["add", "gone.txt"]);
    git(h, &["commit", "-q", "-m", "reset away"]);
    let gone = git(h, &["rev-parse", "HEAD"]);
    git(h, &["reset", "-q", "--hard", &fx.base]);

    let wt = fx.worktree("narrow");
    let p = &wt.path;
    for id in [&stash, &stashed_blob, &other, &gone] {
        let out = common::git_raw(p, &["cat-file", "-e", id]);
        assert!(!out.status.success(), "{id} is readable in the worktree");
    }
    let listed = git(
        p,
        &[
            "cat-file",
            "--batch-all-objects",
            "--batch-check=%(objectname)",
        ],
    );
    let mut held: Vec<&str> = listed.lines().collect();
    held.sort();
    let reachable = git(h, &["rev-list", "--objects", &fx.base]);
    let mut wanted: Vec<&str> = reachable
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    wanted.sort();
    assert_eq!(held, wanted);
    let dump = common::git_raw(p, &["cat-file", "--batch-all-objects", "--batch"]);
    for secret in [
        "STASHED-SECRET-1",
        "OTHER-BRANCH-SECRET-2",
        "RESET-AWAY-SECRET-3",
    ] {
        assert!(!contains(&dump.stdout, secret.as_bytes()), "{secret}");
    }
    git(p, &["fsck", "--full", "--strict", "--no-dangling"]);
    assert_eq!(git(p, &["status", "--porcelain"]), "");
}

#[test]
fn a_second_worktree_of_a_base_copies_its_history_from_the_cache() {
    let fx = Fixture::new();
    let cache = fx.path("history-cache");
    let spec = |run_id: &str| WorktreeSpec {
        host_repo: fx.host.clone(),
        base_commit: fx.base.clone(),
        run_id: run_id.into(),
        dest: fx.path(&format!("wt-{run_id}")),
        owner: None,
        history_cache: Some(cache.clone()),
    };
    let first = create_worktree(&spec("first")).unwrap();
    let entry = cache.join(&fx.base);
    let cached: Vec<_> = std::fs::read_dir(entry.join("pack"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(!cached.is_empty(), "the first worktree's history is kept");
    // A marker in the entry: the second worktree must take its history
    // from there (packing it again would not bring the marker).
    std::fs::write(entry.join("pack").join("marker"), b"from the cache").unwrap();
    let second = create_worktree(&spec("second")).unwrap();
    let pack = second.path.join(".git/objects/pack");
    assert_eq!(
        std::fs::read(pack.join("marker")).unwrap(),
        b"from the cache"
    );
    std::fs::remove_file(pack.join("marker")).unwrap();
    std::fs::remove_file(entry.join("pack").join("marker")).unwrap();
    // Copies, never links: what a sandbox writes to its own history
    // reaches neither the cache nor another run.
    for name in &cached {
        let copied = pack.join(name);
        assert_eq!(std::fs::metadata(&copied).unwrap().nlink(), 1, "{name:?}");
        assert_ne!(
            std::fs::metadata(&copied).unwrap().ino(),
            std::fs::metadata(entry.join("pack").join(name))
                .unwrap()
                .ino()
        );
    }
    let victim = pack.join(&cached[0]);
    let before = std::fs::read(entry.join("pack").join(&cached[0])).unwrap();
    let mut perms = std::fs::metadata(&victim).unwrap().permissions();
    perms.set_mode(0o644);
    std::fs::set_permissions(&victim, perms).unwrap();
    std::fs::write(&victim, b"overwritten by the sandbox").unwrap();
    assert_eq!(
        std::fs::read(entry.join("pack").join(&cached[0])).unwrap(),
        before
    );
    // The first worktree and a third are whole and clean.
    let third = create_worktree(&spec("third")).unwrap();
    for wt in [&first, &third] {
        assert_eq!(
            git(&wt.path, &["fsck", "--connectivity-only", "--no-progress"]),
            ""
        );
        assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
        assert_eq!(git(&wt.path, &["rev-parse", "HEAD"]), fx.base);
    }
}
