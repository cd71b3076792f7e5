//! import_run on well-behaved worktrees: commits, uncommitted writes, both,
//! nothing, branches, packed refs, diffstat and limits.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{git, write, Fixture};
use orchestrator_git::{import_failure_kind, import_run, HistoryDropped, SkipReason, TipSource};

const REF: &str = "refs/nightshift/runs/";

#[test]
fn nothing_done_points_the_result_at_the_base() {
    let fx = Fixture::new();
    let wt = fx.worktree("idle");
    let got = import_run(&fx.spec(&wt.path, "idle")).unwrap();
    assert_eq!(got.agent_tip, fx.base);
    assert_eq!(got.tip_source, TipSource::RunBranch);
    assert_eq!(got.observed_commit, None);
    assert_eq!(got.result_commit, fx.base);
    assert_eq!(got.objects_copied, 0);
    assert_eq!(
        (got.files_changed, got.insertions, got.deletions),
        (0, 0, 0)
    );
    assert_eq!(got.skipped, vec![]);
    assert_eq!(
        git(&fx.host, &["rev-parse", &format!("{REF}idle")]),
        fx.base
    );
}

#[test]
fn a_commit_made_in_the_worktree_is_imported() {
    let fx = Fixture::new();
    let wt = fx.worktree("c");
    write(&wt.path.join("src/lib.rs"), "one\nTWO\nthree\nfour\n");
    write(&wt.path.join("docs/new.md"), "# new\n");
    git(&wt.path, &["add", "-A"]);
    git(&wt.path, &["commit", "-q", "-m", "agent work"]);
    write(&wt.path.join("src/lib.rs"), "one\nTWO\nthree\nfour\nfive\n");
    git(&wt.path, &["commit", "-q", "-am", "more agent work"]);
    let tip = git(&wt.path, &["rev-parse", "HEAD"]);
    let host_head = git(&fx.host, &["rev-parse", "HEAD"]);

    let got = import_run(&fx.spec(&wt.path, "c")).unwrap();
    assert_eq!(got.agent_tip, tip);
    assert_eq!(
        got.observed_commit, None,
        "a clean tree needs no observed commit"
    );
    assert_eq!(got.result_commit, tip);
    assert!(
        got.objects_copied >= 6,
        "2 commits, trees and blobs: {}",
        got.objects_copied
    );
    assert_eq!(git(&fx.host, &["rev-parse", &format!("{REF}c")]), tip);
    assert_eq!(
        git(&fx.host, &["log", "--format=%s", &format!("{REF}c")]),
        "more agent work\nagent work\nsecond\nfirst"
    );
    git(&fx.host, &["fsck", "--no-dangling"]);
    // The host's own HEAD and branches are untouched.
    assert_eq!(git(&fx.host, &["rev-parse", "HEAD"]), host_head);
    assert_eq!(
        git(&fx.host, &["branch", "--format=%(refname)"]),
        "refs/heads/main"
    );
    // Diffstat agrees with git's.
    let shortstat = git(&fx.host, &["diff", "--shortstat", &fx.base, &tip]);
    assert_eq!(
        shortstat,
        format!(
            " {} files changed, {} insertions(+), {} deletion(-)",
            got.files_changed, got.insertions, got.deletions
        )
    );
    assert_eq!(
        (got.files_changed, got.insertions, got.deletions),
        (2, 4, 1)
    );
}

#[test]
fn uncommitted_writes_become_exactly_the_observed_commit() {
    let fx = Fixture::new();
    let wt = fx.worktree("u");
    let p = &wt.path;
    write(&p.join("src/lib.rs"), "one\ntwo\nthree\nfour\n");
    std::fs::remove_file(p.join("src/old.txt")).unwrap();
    write(&p.join("new/tool.sh"), "#!/bin/sh\n");
    std::fs::set_permissions(
        p.join("new/tool.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(p.join("bin/run.sh"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink("../src/lib.rs", p.join("new/link")).unwrap();
    std::fs::create_dir(p.join("empty-dir")).unwrap();

    let got = import_run(&fx.spec(p, "u")).unwrap();
    let observed = got
        .observed_commit
        .clone()
        .expect("dirty tree must give an observed commit");
    assert_eq!(got.result_commit, observed);
    assert_eq!(got.agent_tip, fx.base);
    assert_eq!(
        git(&fx.host, &["rev-parse", &format!("{observed}^")]),
        fx.base
    );
    assert_eq!(
        git(
            &fx.host,
            &["log", "-1", "--format=%s|%cn|%ce|%an", &observed]
        ),
        "nightshift: observed state of run u|nightshift|nightshift@example.invalid|nightshift"
    );
    let changes = git(
        &fx.host,
        &["diff", "--raw", "--no-renames", &fx.base, &observed],
    );
    let summary: Vec<String> = changes
        .lines()
        .map(|l| {
            let (meta, path) = l.split_once('\t').unwrap();
            let f: Vec<&str> = meta.split(' ').collect();
            format!("{} {} {} {path}", f[0].trim_start_matches(':'), f[1], f[4])
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            "100755 100644 M bin/run.sh",
            "000000 120000 A new/link",
            "000000 100755 A new/tool.sh",
            "100644 100644 M src/lib.rs",
            "100644 000000 D src/old.txt",
        ]
    );
    assert_eq!(
        git(
            &fx.host,
            &["cat-file", "-p", &format!("{observed}:new/link")]
        ),
        "../src/lib.rs"
    );
    assert_eq!(
        (got.files_changed, got.insertions, got.deletions),
        (5, 3, 1)
    );
    // The worktree itself is not changed by the import.
    assert_eq!(git(p, &["rev-parse", "HEAD"]), fx.base);
}

#[test]
fn commits_and_uncommitted_writes_together() {
    let fx = Fixture::new();
    let wt = fx.worktree("b");
    write(&wt.path.join("a.txt"), "committed\n");
    git(&wt.path, &["add", "a.txt"]);
    git(&wt.path, &["commit", "-q", "-m", "agent"]);
    let tip = git(&wt.path, &["rev-parse", "HEAD"]);
    write(&wt.path.join("b.txt"), "uncommitted\n");
    let got = import_run(&fx.spec(&wt.path, "b")).unwrap();
    let observed = got.observed_commit.unwrap();
    assert_eq!(got.agent_tip, tip);
    assert_eq!(git(&fx.host, &["rev-parse", &format!("{observed}^")]), tip);
    assert_eq!(
        git(&fx.host, &["diff", "--name-status", &tip, &observed]),
        "A\tb.txt"
    );
    assert_eq!(
        git(&fx.host, &["diff", "--name-status", &fx.base, &observed]),
        "A\ta.txt\nA\tb.txt"
    );
}

#[test]
fn the_branch_head_names_is_followed_and_packed_refs_are_read() {
    let fx = Fixture::new();
    let wt = fx.worktree("br");
    git(&wt.path, &["checkout", "-q", "-b", "feature"]);
    write(&wt.path.join("f.txt"), "feature\n");
    git(&wt.path, &["add", "f.txt"]);
    git(&wt.path, &["commit", "-q", "-m", "on feature"]);
    let tip = git(&wt.path, &["rev-parse", "HEAD"]);
    // Packed refs and packed objects, as after an agent's `git gc`.
    git(&wt.path, &["gc", "-q"]);
    assert!(!wt.path.join(".git/refs/heads/feature").exists());
    let got = import_run(&fx.spec(&wt.path, "br")).unwrap();
    assert_eq!(
        got.tip_source,
        TipSource::HeadBranch("refs/heads/feature".into())
    );
    assert_eq!(got.agent_tip, tip);
    assert_eq!(got.observed_commit, None);
    git(&fx.host, &["fsck", "--no-dangling"]);
}

#[test]
fn a_vanished_run_branch_falls_back_to_the_base() {
    let fx = Fixture::new();
    let wt = fx.worktree("gone");
    write(&wt.path.join("x.txt"), "x\n");
    git(&wt.path, &["checkout", "-q", "--detach"]);
    git(&wt.path, &["branch", "-q", "-D", "nightshift/run/gone"]);
    let got = import_run(&fx.spec(&wt.path, "gone")).unwrap();
    assert_eq!(got.tip_source, TipSource::Base);
    assert_eq!(got.agent_tip, fx.base);
    let observed = got.observed_commit.unwrap();
    assert_eq!(
        git(&fx.host, &["diff", "--name-only", &fx.base, &observed]),
        "x.txt"
    );
}

#[test]
fn gitignore_leaves_out_untracked_paths_only() {
    let fx = Fixture::new();
    write(&fx.host.join(".gitignore"), "target/\n*.log\n!keep.log\n");
    write(&fx.host.join("tracked.log"), "v1\n");
    git(&fx.host, &["add", ".gitignore"]);
    git(&fx.host, &["add", "-f", "tracked.log"]);
    git(&fx.host, &["commit", "-q", "-m", "ignore rules"]);
    let fx = Fixture {
        base: git(&fx.host, &["rev-parse", "HEAD"]),
        ..fx
    };
    let wt = fx.worktree("ig");
    let p = &wt.path;
    write(&p.join("target/debug/big.bin"), "build output");
    write(&p.join("sub/debug.log"), "noise");
    write(&p.join("sub/keep.log"), "kept");
    write(&p.join("tracked.log"), "v2\n");
    write(&p.join("sub/.gitignore"), "local-only\n");
    write(&p.join("sub/local-only"), "x");
    let got = import_run(&fx.spec(p, "ig")).unwrap();
    let observed = got.observed_commit.unwrap();
    let names = git(&fx.host, &["diff", "--name-only", &fx.base, &observed]);
    assert_eq!(names, "sub/.gitignore\nsub/keep.log\ntracked.log");
    assert_eq!(got.ignored, 3, "target/, sub/debug.log, sub/local-only");
    // git itself agrees on what is untracked and not ignored.
    let status = git(p, &["status", "--porcelain", "--untracked-files=all"]);
    assert_eq!(status, " M tracked.log\n?? sub/.gitignore\n?? sub/keep.log");
}

/// A preset's own bookkeeping (aider's chat and input history and tags
/// cache) stays out of the run's result: left out at the top when
/// untracked, kept when the tip tracks it, never matched below the top.
#[test]
fn an_agents_bookkeeping_stays_out_unless_tracked() {
    let fx = Fixture::new();
    write(
        &fx.host.join(".aider.input.history"),
        "tracked on purpose\n",
    );
    git(&fx.host, &["add", ".aider.input.history"]);
    git(&fx.host, &["commit", "-q", "-m", "a tracked history"]);
    let fx = Fixture {
        base: git(&fx.host, &["rev-parse", "HEAD"]),
        ..fx
    };
    let wt = fx.worktree("bk");
    let p = &wt.path;
    write(&p.join("hello.txt"), "hello\n");
    write(&p.join(".aider.chat.history.md"), "# chat\n");
    write(&p.join(".aider.input.history"), "changed\n");
    write(&p.join(".aider.tags.cache.v4/cache.db"), "x");
    write(&p.join("sub/.aider.chat.history.md"), "below the top\n");
    let mut spec = fx.spec(p, "bk");
    let globs = [
        ".aider.chat.history.md",
        ".aider.input.history",
        ".aider.tags.cache.v*",
    ];
    spec.leave_out = &globs;
    let got = import_run(&spec).unwrap();
    let observed = got.observed_commit.unwrap();
    let names = git(&fx.host, &["diff", "--name-only", &fx.base, &observed]);
    assert_eq!(
        names,
        ".aider.input.history\nhello.txt\nsub/.aider.chat.history.md"
    );
    assert_eq!(got.ignored, 2, "the chat history and the tags cache");
}

#[test]
fn too_many_new_objects_drops_the_history_not_the_files() {
    let fx = Fixture::new();
    let wt = fx.worktree("many");
    for i in 0..5 {
        write(&wt.path.join(format!("f{i}")), &format!("{i}\n"));
    }
    git(&wt.path, &["add", "-A"]);
    git(&wt.path, &["commit", "-q", "-m", "five files"]);
    let mut spec = fx.spec(&wt.path, "many");
    spec.limits.max_objects = 4;
    let got = import_run(&spec).unwrap();
    assert_eq!(
        got.history_dropped,
        Some(HistoryDropped::TooManyObjects { limit: 4 })
    );
    // The files still arrive, observed on top of the base commit.
    assert_eq!(git(&fx.host, &["show", &format!("{REF}many:f3")]), "3");
    assert_eq!(
        git(&fx.host, &["rev-parse", &format!("{REF}many^")]).trim(),
        fx.base
    );
    spec.limits.max_objects = 7; // commit + tree + 5 blobs
    assert_eq!(import_run(&spec).unwrap().history_dropped, None);
}

#[test]
fn a_committed_object_over_the_size_limit_drops_the_history_not_the_files() {
    let fx = Fixture::new();
    let wt = fx.worktree("bigobj");
    write(&wt.path.join("big.txt"), &"x".repeat(10_000));
    write(&wt.path.join("small.txt"), "small\n");
    git(&wt.path, &["add", "-A"]);
    git(&wt.path, &["commit", "-q", "-m", "big"]);
    let mut spec = fx.spec(&wt.path, "bigobj");
    spec.limits.max_file_bytes = 4096;
    let got = import_run(&spec).unwrap();
    let dropped = got.history_dropped.expect("history dropped");
    assert!(
        matches!(
            dropped,
            HistoryDropped::ObjectTooLarge {
                size: 10_000,
                limit: 4096,
                ..
            }
        ),
        "{dropped:?}"
    );
    assert_eq!(dropped.kind(), "object_too_large");
    // The small file arrives; the big one is skipped and listed, never read.
    assert_eq!(
        git(&fx.host, &["show", &format!("{REF}bigobj:small.txt")]),
        "small"
    );
    assert!(git_ok(&fx.host, &format!("{REF}bigobj:big.txt")).is_none());
    assert!(got
        .skipped
        .iter()
        .any(|s| s.path == "big.txt" && matches!(s.why, SkipReason::TooLarge { .. })));
    spec.limits.max_file_bytes = 1 << 20;
    spec.limits.max_total_bytes = 5000;
    let got = import_run(&spec).unwrap();
    assert_eq!(
        got.history_dropped,
        Some(HistoryDropped::TotalBytesExceeded { limit: 5000 })
    );
}

#[test]
fn a_locked_host_ref_fails_the_import_and_a_retry_succeeds() {
    let fx = Fixture::new();
    let wt = fx.worktree("locked");
    write(&wt.path.join("work.txt"), "work\n");
    let lock = fx.host.join(".git/refs/nightshift/runs/locked.lock");
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    write(&lock, "");
    let spec = fx.spec(&wt.path, "locked");
    let e = import_run(&spec).unwrap_err();
    assert_eq!(import_failure_kind(&e), "host_locked", "{e}");
    assert!(git_ok(&fx.host, &format!("{REF}locked")).is_none());
    std::fs::remove_file(&lock).unwrap();
    import_run(&spec).unwrap();
    assert_eq!(
        git(&fx.host, &["show", &format!("{REF}locked:work.txt")]),
        "work"
    );
}

#[test]
fn a_missing_host_repository_fails_the_import() {
    let fx = Fixture::new();
    let wt = fx.worktree("gone");
    let elsewhere = fx.path("not-a-repo");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let mut spec = fx.spec(&wt.path, "gone");
    spec.host_repo = &elsewhere;
    let e = import_run(&spec).unwrap_err();
    assert_eq!(import_failure_kind(&e), "host_repository", "{e}");
}

#[test]
fn observed_files_past_the_limits_are_skipped_and_listed() {
    let fx = Fixture::new();
    let wt = fx.worktree("lim");
    let p = &wt.path;
    write(&p.join("a-big.txt"), &"x".repeat(5000));
    write(&p.join("b1.txt"), "1");
    write(&p.join("b2.txt"), "2");
    write(&p.join("b3.txt"), "3");
    let mut spec = fx.spec(p, "lim");
    spec.limits.max_file_bytes = 1000;
    // The base has 5 files (README, bin/run.sh, src/lib.rs, src/old.txt, src/readme-link);
    // in sorted walk order README.md, a-big (too large), b1, b2 fit; the rest do not.
    spec.limits.max_files = 3;
    let got = import_run(&spec).unwrap();
    let reasons: Vec<(&str, &SkipReason)> = got
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), &s.why))
        .collect();
    assert!(
        reasons.contains(&(
            "a-big.txt",
            &SkipReason::TooLarge {
                size: 5000,
                limit: 1000
            }
        )),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("b3.txt", &SkipReason::TooManyFiles { limit: 3 })),
        "{reasons:?}"
    );
    assert_eq!(got.skipped_total as usize, got.skipped.len());
    assert!(
        reasons.contains(&("src/lib.rs", &SkipReason::TooManyFiles { limit: 3 })),
        "{reasons:?}"
    );
    // Skipped tracked files keep their base version: not observed is not deleted.
    let diff = git(
        &fx.host,
        &["diff", "--name-status", &fx.base, &got.result_commit],
    );
    assert_eq!(diff, "A\tb1.txt\nA\tb2.txt");

    let mut spec = fx.spec(p, "lim2");
    spec.limits.max_total_bytes = 10;
    let got = import_run(&spec).unwrap();
    assert!(
        got.skipped
            .iter()
            .any(|s| s.why == SkipReason::TotalBytesExceeded { limit: 10 }),
        "{:?}",
        got.skipped
    );
}

fn git_ok(dir: &std::path::Path, rev: &str) -> Option<String> {
    let out = common::git_raw(dir, &["rev-parse", "--verify", "-q", rev]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
