//! An import never loses work and never reports success when it failed,
//! through the real engine, real git and the real binary:
//! - what the worktree holds (a committed file over the size limit, `.git`
//!   a file or a symlink, a branch naming a missing commit) costs the agent
//!   its history, never its working files: the small file it also wrote is in
//!   `refs/nightshift/runs/<id>`, `nightshift run` exits 10, the status, the
//!   record and the audit say why;
//! - a host repository that cannot take the import (its ref lock held) keeps
//!   the worktree, ends the run `import failed: ...`, exits 11, and
//!   `nightshift import RUN` retries it once the lock is gone; the same when
//!   reconciliation does the import.
//!
//! Each lock is held from before the run ends, without racing it: the agent
//! waits at a gate the test opens once it holds the lock.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tests::{
    audit_kinds, git, image, make_repo, only_run, open_gate, stderr, stdout, wait_running, State,
    WAIT_AT_GATE,
};

const NOT_WHOLE: i32 = 10;
const IMPORT_FAILED: i32 = 11;

fn start(state: &State, repo: &Path, script: &str) -> Child {
    let img = image();
    state
        .cmd()
        .args(["run", "--repo", repo.to_str().unwrap(), "--image", &img])
        .args(["--", "bash", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn run_agent(state: &State, repo: &Path, script: &str) -> (Output, serde_json::Value) {
    let out = start(state, repo, script).wait_with_output().unwrap();
    (out, only_run(state))
}

fn result_ref(run: &serde_json::Value) -> String {
    format!("refs/nightshift/runs/{}", run["id"].as_str().unwrap())
}

/// The file at `path` in the run's result, if there.
fn in_result(repo: &Path, run: &serde_json::Value, path: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["show", &format!("{}:{path}", result_ref(run))])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn worktree(state: &State, run: &serde_json::Value) -> PathBuf {
    state
        .path()
        .join("worktrees")
        .join(run["id"].as_str().unwrap())
}

/// The body of the run's last audit entry of `kind`.
fn entry(state: &State, run: &serde_json::Value, kind: &str) -> serde_json::Value {
    let show = state.show(run["id"].as_str().unwrap());
    let found = show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|e| e["kind"] == kind)
        .cloned();
    found.unwrap_or_else(|| panic!("no {kind} entry"))["body"].clone()
}

/// Checks a run whose history was dropped for `kind`: exit 10, the status and
/// `show` say so, the small file and the base are in the result, the audit
/// holds the reason and no content, the worktree is gone.
fn history_dropped(
    state: &State,
    repo: &Path,
    out: &Output,
    run: &serde_json::Value,
    kind: &str,
) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(NOT_WHOLE), "{}", stderr(out));
    let status = run["status"].as_str().unwrap();
    assert!(
        status.starts_with("exited 0 (history dropped: "),
        "{status}"
    );
    assert_eq!(
        in_result(repo, run, "small.txt").as_deref(),
        Some("small\n")
    );
    // The result is the observed state on top of the base commit.
    let base = run["base_commit"].as_str().unwrap();
    assert_eq!(
        git(repo, &["rev-parse", &format!("{}^", result_ref(run))]).trim(),
        base
    );
    assert_eq!(run["observed"]["history_dropped"]["kind"], kind);
    let body = entry(state, run, "history_dropped");
    assert_eq!(body["reason"], kind);
    assert!(!audit_kinds(state, run["id"].as_str().unwrap()).contains(&"import_failed".into()));
    // `show` (text) says it too.
    let shown = stdout(&state.run(&["show", run["id"].as_str().unwrap()]));
    assert!(shown.contains("history dropped"), "{shown}");
    assert!(!worktree(state, run).exists(), "the worktree is removed");
    assert!(state.verify().status.success());
    assert!(state.containers().is_empty());
    body
}

#[test]
fn a_committed_120_mb_file_costs_the_history_not_the_small_file() {
    let state = State::new();
    let repo = make_repo();
    let (out, run) = run_agent(
        &state,
        repo.path(),
        "set -eu
head -c 120M /dev/zero > big.bin
echo small > small.txt
git add big.bin small.txt
git commit -q -m 'a dataset and a note'",
    );
    let body = history_dropped(&state, repo.path(), &out, &run, "object_too_large");
    assert_eq!(body["size"], 120 << 20);
    assert_eq!(body["limit"], 100 << 20);
    assert!(body["object"].as_str().unwrap().len() == 40, "{body}");
    let status = run["status"].as_str().unwrap();
    assert!(
        status.contains("125829120 bytes, over the 104857600-byte limit"),
        "{status}"
    );
    // The big file is skipped and listed, never read.
    assert_eq!(in_result(repo.path(), &run, "big.bin"), None);
    let skipped = run["observed"]["skipped"].as_array().unwrap();
    assert!(
        skipped
            .iter()
            .any(|s| s["path"] == "big.bin" && s["why"].as_str().unwrap().contains("TooLarge")),
        "{skipped:?}"
    );
}

#[test]
fn git_dir_replaced_by_a_file_costs_the_history_not_the_files() {
    let state = State::new();
    let repo = make_repo();
    let (out, run) = run_agent(
        &state,
        repo.path(),
        "set -eu
echo small > small.txt
git add small.txt
git commit -q -m note
rm -rf .git
echo 'gitdir: /etc' > .git",
    );
    history_dropped(&state, repo.path(), &out, &run, "hostile_git_dir");
}

#[test]
fn git_dir_as_a_symlink_costs_the_history_not_the_files() {
    let state = State::new();
    let repo = make_repo();
    let (out, run) = run_agent(
        &state,
        repo.path(),
        "set -eu
echo small > small.txt
git add small.txt
git commit -q -m note
mv .git /tmp/moved-git
ln -s /tmp/moved-git .git",
    );
    history_dropped(&state, repo.path(), &out, &run, "hostile_git_dir");
}

#[test]
fn a_branch_naming_a_missing_commit_costs_the_history_not_the_files() {
    let state = State::new();
    let repo = make_repo();
    let (out, run) = run_agent(
        &state,
        repo.path(),
        "set -eu
echo small > small.txt
git add small.txt
git commit -q -m note
echo 0123456789abcdef0123456789abcdef01234567 > .git/$(git symbolic-ref HEAD)",
    );
    history_dropped(&state, repo.path(), &out, &run, "bad_tip");
}

/// Holds the host's lock on `refs/nightshift/runs/<id>` (as a concurrent git
/// would), then lets the agent go.
fn hold_ref_lock(state: &State, repo: &Path, id: &str) -> PathBuf {
    let lock = repo.join(format!(".git/refs/nightshift/runs/{id}.lock"));
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    std::fs::write(&lock, "").unwrap();
    open_gate(state, id);
    lock
}

/// A run whose import failed: exit code, status, audit, kept worktree, no ref.
fn import_failed(state: &State, repo: &Path, run: &serde_json::Value) {
    let status = run["status"].as_str().unwrap();
    assert!(status.starts_with("import failed: "), "{status}");
    let id = run["id"].as_str().unwrap();
    let reason = run["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("nightshift import {id}")),
        "{reason}"
    );
    assert_eq!(entry(state, run, "import_failed")["reason"], "host_locked");
    let wt = worktree(state, run);
    assert_eq!(
        std::fs::read_to_string(wt.join("small.txt")).unwrap(),
        "small\n",
        "the worktree is kept with the work"
    );
    assert_eq!(in_result(repo, run, "small.txt"), None);
    assert!(state.verify().status.success());
}

/// `nightshift import RUN`: refused while the lock is held (exit 11, the
/// worktree still kept), done once it is released (exit 0, the work in the
/// result, the worktree gone, the status the run's own ending).
fn retry(state: &State, repo: &Path, id: &str, lock: &Path, ended: &str) {
    let out = state.run(&["import", id]);
    assert_eq!(out.status.code(), Some(IMPORT_FAILED), "{}", stderr(&out));
    let run = only_run(state);
    import_failed(state, repo, &run);

    std::fs::remove_file(lock).unwrap();
    let out = state.run(&["import", id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run = only_run(state);
    assert_eq!(run["status"], ended);
    assert_eq!(
        in_result(repo, &run, "small.txt").as_deref(),
        Some("small\n")
    );
    assert!(!worktree(state, &run).exists(), "the worktree is removed");
    let kinds = audit_kinds(state, id);
    assert_eq!(
        kinds[kinds.len() - 4..],
        [
            "observed_state",
            "imported",
            "worktree_removed",
            "run_ended"
        ]
    );
    // Nothing is left to retry.
    let out = state.run(&["import", id]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(state.verify().status.success());
}

#[test]
fn a_locked_host_repository_keeps_the_worktree_and_import_retries_it() {
    let state = State::new();
    let repo = make_repo();
    let script = format!("{WAIT_AT_GATE}echo small > small.txt");
    let mut child = start(&state, repo.path(), &script);
    let id = wait_running(&state, &mut child, 1).remove(0);
    let lock = hold_ref_lock(&state, repo.path(), &id);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(IMPORT_FAILED), "{}", stderr(&out));
    let run = only_run(&state);
    import_failed(&state, repo.path(), &run);
    assert_eq!(run["exit_code"], 0);
    assert!(state.containers().is_empty());
    retry(&state, repo.path(), &id, &lock, "exited 0");
}

#[test]
fn reconciliation_keeps_the_worktree_when_the_import_fails() {
    let state = State::new();
    let repo = make_repo();
    // The agent writes, then sleeps; its supervisor dies under it.
    let script = "echo small > small.tmp; mv small.tmp small.txt; sleep 600";
    let mut child = start(&state, repo.path(), script);
    let id = wait_running(&state, &mut child, 1).remove(0);
    tests::wait_for_file(&state.path().join("worktrees").join(&id).join("small.txt"));
    let lock = repo
        .path()
        .join(format!(".git/refs/nightshift/runs/{id}.lock"));
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    std::fs::write(&lock, "").unwrap();
    // Kill the watchdog, then the supervisor: only reconciliation settles the run.
    let watchdogs = std::process::Command::new("pgrep")
        .args(["-f", &format!("{} watchdog", state.path().display())])
        .output()
        .unwrap();
    for p in stdout(&watchdogs)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
    {
        kill(Pid::from_raw(p), Signal::SIGKILL).unwrap();
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait_with_output().unwrap();

    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(state.containers().is_empty());
    let run = only_run(&state);
    import_failed(&state, repo.path(), &run);
    // Nothing settles it twice; `nightshift import` brings the work.
    let out = state.run(&["reconcile"]);
    assert!(
        stdout(&out).contains("settled 0 run(s)"),
        "{}",
        stdout(&out)
    );
    retry(&state, repo.path(), &id, &lock, "lost: supervisor vanished");
}
