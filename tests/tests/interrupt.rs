//! SIGTERM and SIGINT to `nightshift run` mid-run: no container left behind,
//! and an audit entry saying how the run ended.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tests::{audit_kinds, image, make_repo, State};

fn interrupted_by(signal: Signal, expected_code: i32) {
    let state = State::new();
    let repo = make_repo();
    let child = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "bash",
            "-c",
            // Written whole, then renamed: once the name exists its content does.
            "echo partial > partial.tmp; mv partial.tmp partial.txt; sleep 600",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the sandbox is running.
    let started = Instant::now();
    loop {
        let runs = state.runs();
        if runs
            .first()
            .map(|r| r["status"] == "running")
            .unwrap_or(false)
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "run never started"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Signal once the agent has written (polled, never slept on).
    let id = state.runs()[0]["id"].as_str().unwrap().to_string();
    tests::wait_for_file(&state.path().join("worktrees").join(&id).join("partial.txt"));
    kill(Pid::from_raw(child.id() as i32), signal).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(expected_code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run = &state.runs()[0];
    let id = run["id"].as_str().unwrap();
    assert_eq!(run["status"], format!("interrupted: {}", signal.as_str()));
    assert!(
        state.containers().is_empty(),
        "container left behind after {signal}"
    );
    let kinds = audit_kinds(&state, id);
    assert_eq!(kinds.last().map(String::as_str), Some("run_ended"));
    let show = state.show(id);
    let last = show["audit"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["body"]["status"],
        format!("interrupted: {}", signal.as_str())
    );
    // What the run had written is kept.
    assert!(run["result_commit"].is_string());
    assert_eq!(
        tests::git(
            repo.path(),
            &["show", &format!("refs/nightshift/runs/{id}:partial.txt")]
        ),
        "partial\n"
    );
    assert!(state.verify().status.success());
}

#[test]
fn sigterm_mid_run_leaves_nothing_behind() {
    interrupted_by(Signal::SIGTERM, 143);
}

#[test]
fn sigint_mid_run_leaves_nothing_behind() {
    interrupted_by(Signal::SIGINT, 130);
}
