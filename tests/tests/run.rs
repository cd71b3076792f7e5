//! A whole run through the real engine and real git: what the agent commits
//! and what it merely writes both arrive in the host repository.

use tests::{audit_kinds, git, image, make_repo, only_run, stderr, State};

#[test]
fn committed_and_uncommitted_work_arrive_in_the_host_repository() {
    let state = State::new();
    let repo = make_repo();
    let script = r#"set -eu
mkdir -p docs
echo "committed by the agent" > docs/a.txt
git add docs/a.txt
git commit -q -m "agent: add docs/a.txt"
echo "written, never committed" > b.txt
echo three >> src/lib.txt
"#;
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--task",
        "write two files",
        "--",
        "bash",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    let run = only_run(&state);
    let id = run["id"].as_str().unwrap();
    assert_eq!(run["status"], "exited 0");
    let reference = format!("refs/nightshift/runs/{id}");

    // The observed-state commit sits on top of the agent's own commit.
    let log = git(repo.path(), &["log", "--format=%s", &reference]);
    let subjects: Vec<&str> = log.lines().collect();
    assert_eq!(
        subjects,
        [
            &format!("nightshift: observed state of run {id}")[..],
            "agent: add docs/a.txt",
            "initial"
        ]
    );
    // Exactly these files, with exactly this content.
    let files = git(repo.path(), &["ls-tree", "-r", "--name-only", &reference]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        ["README.md", "b.txt", "docs/a.txt", "src/lib.txt"]
    );
    assert_eq!(
        git(repo.path(), &["show", &format!("{reference}:b.txt")]),
        "written, never committed\n"
    );
    assert_eq!(
        git(repo.path(), &["show", &format!("{reference}~1:docs/a.txt")]),
        "committed by the agent\n"
    );
    assert_eq!(
        git(repo.path(), &["show", &format!("{reference}:src/lib.txt")]),
        "one\ntwo\nthree\n"
    );
    // The host's own branch, HEAD and working tree are untouched.
    assert_eq!(git(repo.path(), &["status", "--porcelain"]), "");
    assert_eq!(
        git(repo.path(), &["log", "--format=%s", "main"]).trim(),
        "initial"
    );
    assert_eq!(run["files_changed"], 3);

    // Every step of the run is in the audit, and the chain verifies.
    let kinds = audit_kinds(&state, id);
    for kind in [
        "run_created",
        "worktree_created",
        "attestation",
        "started",
        "exited",
        "container_removed",
        "observed_state",
        "imported",
        "worktree_removed",
        "run_ended",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "no {kind} entry in {kinds:?}"
        );
    }
    assert!(state.verify().status.success());
    assert!(state.containers().is_empty(), "a container was left behind");
    assert!(
        std::fs::read_dir(state.path().join("worktrees"))
            .unwrap()
            .next()
            .is_none(),
        "a worktree was left behind"
    );
}

#[test]
fn a_run_that_changes_nothing_points_at_its_base_and_exit_codes_pass_through() {
    let state = State::new();
    let repo = make_repo();
    let base = git(repo.path(), &["rev-parse", "HEAD"]).trim().to_string();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "sh",
        "-c",
        "echo hello from the sandbox; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let run = only_run(&state);
    assert_eq!(run["status"], "exited 3");
    assert_eq!(run["exit_code"], 3);
    assert_eq!(run["result_commit"].as_str(), Some(base.as_str()));
    assert!(state
        .output_log(run["id"].as_str().unwrap())
        .contains("hello from the sandbox"));
    assert!(state.containers().is_empty());
}

#[test]
fn the_audit_holds_no_content() {
    let state = State::new();
    let repo = make_repo();
    let secret_task = "TASK-TEXT-MUST-NOT-BE-AUDITED";
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--task",
        secret_task,
        "--",
        "bash",
        "-c",
        "echo OUTPUT-MUST-NOT-BE-AUDITED; echo FILE-CONTENT-MUST-NOT-BE-AUDITED > f.txt",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<String> = state
        .audit_entries()
        .into_iter()
        .map(|e| format!("{} {}", e.kind, serde_json::Value::Object(e.body)))
        .collect();
    assert!(rows.len() >= 8);
    for row in rows {
        assert!(
            !row.contains("MUST-NOT-BE-AUDITED"),
            "content in the audit: {row}"
        );
    }
}
