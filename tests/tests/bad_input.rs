//! Bad input: a one-line error naming the problem, a documented exit code,
//! and nothing left behind.

use tests::{image, make_repo, stderr, State};

fn assert_clean(state: &State) {
    assert!(state.containers().is_empty());
    let worktrees = state.path().join("worktrees");
    if worktrees.exists() {
        assert!(std::fs::read_dir(worktrees).unwrap().next().is_none());
    }
}

fn one_line(err: &str) -> &str {
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "not one line: {err:?}");
    lines[0]
}

#[test]
fn a_path_that_is_not_a_repository() {
    let state = State::new();
    let dir = tempfile::tempdir().unwrap();
    let out = state.run(&[
        "run",
        "--repo",
        dir.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let line = one_line(&stderr(&out)).to_string();
    assert!(line.contains("not a git repository"), "{line}");
    assert!(line.contains(dir.path().to_str().unwrap()), "{line}");
    assert_clean(&state);
    assert!(state.runs().is_empty());
}

#[test]
fn an_unknown_ref() {
    let state = State::new();
    let repo = make_repo();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--ref",
        "no-such-branch",
        "--image",
        &image(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let line = one_line(&stderr(&out)).to_string();
    assert!(line.contains("no-such-branch"), "{line}");
    assert_clean(&state);
}

#[test]
fn a_missing_image() {
    let state = State::new();
    let repo = make_repo();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        "nightshift-no-such-image:1",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(5));
    let line = one_line(&stderr(&out)).to_string();
    assert!(line.contains("nightshift-no-such-image:1"), "{line}");
    assert_clean(&state);
}

#[test]
fn an_unreachable_engine() {
    let state = State::new();
    let repo = make_repo();
    let out = state
        .cmd()
        .env(tests::engine_host_var(), "unix:///nonexistent/docker.sock")
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let line = one_line(&stderr(&out)).to_string();
    assert!(line.contains("unreachable"), "{line}");
    assert!(line.contains("/nonexistent/docker.sock"), "{line}");
    assert_clean(&state);
}

#[test]
fn an_unknown_run() {
    let state = State::new();
    let out = state.run(&["show", "01nosuchrun"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(one_line(&stderr(&out)).contains("01nosuchrun"));
}

#[test]
fn a_relative_state_dir_means_the_same_directory_to_every_part_of_a_run() {
    // The state given relative to the working directory: the sandbox's
    // mounts and the run's children need it absolute.
    let state = State::new();
    let repo = make_repo();
    let out = state
        .cmd()
        .env_remove("NIGHTSHIFT_STATE_DIR")
        .current_dir(state.path().parent().unwrap())
        .args([
            "--state-dir",
            state.path().file_name().unwrap().to_str().unwrap(),
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let runs = state.runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "exited 0");
    assert_clean(&state);
}
