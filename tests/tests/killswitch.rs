//! The outer kill switch, the dead man's switch, freeze, and the fleet cap,
//! against the real engine.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tests::{image, make_repo, stderr, stdout, State};

fn start_run(state: &State, repo: &std::path::Path, extra: &[&str], script: &str) -> Child {
    let img = image();
    let mut args = vec!["run", "--repo", repo.to_str().unwrap(), "--image", &img];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "bash", "-c", script]);
    state
        .cmd()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_running(state: &State, n: usize) {
    let started = Instant::now();
    loop {
        let running = state
            .runs()
            .iter()
            .filter(|r| r["status"] == "running")
            .count();
        if running >= n && state.containers().len() >= n {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "runs never started"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGKILLs a run's watchdog and then its supervisor: nothing of nightshift
/// is left running to act on the sandbox.
fn kill_supervisor_and_watchdog(state: &State, supervisor: &Child) {
    let watchdogs = Command::new("pgrep")
        .args(["-f", &format!("{} watchdog", state.path().display())])
        .output()
        .unwrap();
    let pids: Vec<i32> = stdout(&watchdogs)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert!(!pids.is_empty(), "no watchdog running");
    for p in pids {
        kill(Pid::from_raw(p), Signal::SIGKILL).unwrap();
    }
    kill(Pid::from_raw(supervisor.id() as i32), Signal::SIGKILL).unwrap();
}

fn wait_gone(state: &State, bound: Duration) -> Duration {
    let started = Instant::now();
    while !state.containers().is_empty() {
        assert!(
            started.elapsed() < bound,
            "sandboxes still there after {bound:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

#[test]
fn kill_all_stops_every_run_and_marks_who() {
    let state = State::new();
    let repo = make_repo();
    let children: Vec<Child> = (0..3)
        .map(|_| start_run(&state, repo.path(), &[], "sleep 600"))
        .collect();
    wait_running(&state, 3);
    let out = state.run(&["kill", "--all"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_gone(&state, Duration::from_secs(20));
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(1));
    }
    for r in state.runs() {
        let s = r["status"].as_str().unwrap();
        assert!(s.starts_with("killed: by "), "{s}");
    }
    assert!(state.verify().status.success());
}

#[test]
fn kill_one_run_leaves_the_others() {
    let state = State::new();
    let repo = make_repo();
    let a = start_run(&state, repo.path(), &[], "sleep 600");
    let b = start_run(&state, repo.path(), &[], "sleep 600");
    wait_running(&state, 2);
    let target = state.runs()[0]["id"].as_str().unwrap().to_string();
    let out = state.run(&["kill", &target]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Poll until the killed run is settled by its supervisor (never sleep on it).
    let started = Instant::now();
    let runs = loop {
        let runs = state.runs();
        let target_run = runs.iter().find(|r| r["id"] == target.as_str()).unwrap();
        if target_run["status"] != "running" {
            break runs;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the killed run never settled"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let killed: Vec<_> = runs
        .iter()
        .filter(|r| r["status"].as_str().unwrap().starts_with("killed"))
        .collect();
    assert_eq!(killed.len(), 1);
    assert_eq!(killed[0]["id"], target.as_str());
    assert_eq!(state.containers().len(), 1);
    state.run(&["kill", "--all"]);
    for c in [a, b] {
        c.wait_with_output().unwrap();
    }
    wait_gone(&state, Duration::from_secs(20));
}

#[test]
fn kill_all_works_with_no_supervisor_running() {
    let state = State::new();
    let repo = make_repo();
    let c = start_run(&state, repo.path(), &[], "echo kept > kept.txt; sleep 600");
    wait_running(&state, 1);
    // Kill the supervisor and its watchdog: no nightshift process can act.
    kill_supervisor_and_watchdog(&state, &c);
    c.wait_with_output().unwrap();
    assert_eq!(
        state.containers().len(),
        1,
        "the sandbox should still be there"
    );
    let out = state.run(&["kill", "--all"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_gone(&state, Duration::from_secs(20));
    let run = &state.runs()[0];
    assert!(
        run["status"].as_str().unwrap().starts_with("killed: by "),
        "{run}"
    );
    assert!(
        run["result_commit"].is_string(),
        "what the run wrote was not imported"
    );
    assert!(state.verify().status.success());
}

#[test]
fn supervisor_killed_with_sigkill_its_sandbox_stops_by_itself() {
    let state = State::new();
    let repo = make_repo();
    // Written whole, then renamed: once the name exists its content does.
    let c = start_run(
        &state,
        repo.path(),
        &[],
        "echo kept > kept.tmp; mv kept.tmp kept.txt; sleep 600",
    );
    wait_running(&state, 1);
    // Kill once the agent has written (polled, never slept on).
    let id = state.runs()[0]["id"].as_str().unwrap().to_string();
    tests::wait_for_file(&state.path().join("worktrees").join(&id).join("kept.txt"));
    kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL).unwrap();
    c.wait_with_output().unwrap();
    let took = wait_gone(&state, Duration::from_secs(30));
    eprintln!("sandbox gone {took:?} after kill -9 of its supervisor");
    // The run is settled, what it wrote is kept, and the chain verifies.
    let started = Instant::now();
    loop {
        let run = &state.runs()[0];
        if run["status"] != "running" {
            assert_eq!(run["status"], "lost: supervisor vanished");
            let reference = format!("refs/nightshift/runs/{}", run["id"].as_str().unwrap());
            assert_eq!(
                tests::git(repo.path(), &["show", &format!("{reference}:kept.txt")]),
                "kept\n"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "run never settled"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(state.verify().status.success());
    // A later supervisor start finds nothing left to settle.
    let out = state.run(&["reconcile"]);
    assert!(
        stdout(&out).contains("settled 0 run(s)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_later_supervisor_settles_what_a_crash_left() {
    let state = State::new();
    let repo = make_repo();
    let c = start_run(&state, repo.path(), &[], "sleep 600");
    wait_running(&state, 1);
    // Kill the watchdog first, then the supervisor: nothing settles the run...
    kill_supervisor_and_watchdog(&state, &c);
    c.wait_with_output().unwrap();
    assert_eq!(state.runs()[0]["status"], "running");
    // ...until the next supervisor starts, and reconciles.
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("settled 1 run(s)"),
        "{}",
        stdout(&out)
    );
    assert!(state.containers().is_empty());
    assert_eq!(state.runs()[0]["status"], "lost: supervisor vanished");
    assert!(state.verify().status.success());
}

#[test]
fn freeze_refuses_new_runs_and_thaw_restores() {
    let state = State::new();
    let repo = make_repo();
    assert!(state.run(&["owner", "init"]).status.success());
    let out = state.run(&["freeze", "--why", "incident 42"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(9));
    assert!(
        stderr(&out).contains("frozen (incident 42)"),
        "{}",
        stderr(&out)
    );
    assert!(state.runs().is_empty());
    // Thawing loosens everything: the owner's credential only.
    let out = state.run(&["thaw"]);
    assert_eq!(out.status.code(), Some(9));
    let key = state.path().join("owner.key");
    let out = state.run(&["thaw", "--owner-key-file", key.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "true",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn kill_all_freeze_also_freezes() {
    let state = State::new();
    let repo = make_repo();
    let c = start_run(&state, repo.path(), &[], "sleep 600");
    wait_running(&state, 1);
    let out = state.run(&["kill", "--all", "--freeze"]);
    assert!(out.status.success(), "{}", stderr(&out));
    c.wait_with_output().unwrap();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
}

#[test]
fn the_fleet_memory_cap_holds_across_runs() {
    let state = State::new();
    std::fs::write(
        state.path().join("config.toml"),
        "[fleet]\nmemory = \"300m\"\n",
    )
    .unwrap();
    let repo = make_repo();
    // Each run may use 250 MiB; three together would need 600 MiB.
    let hog = "python3 -c 'import time; b = bytearray(200 * 1024 * 1024); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(8)'";
    let children: Vec<Child> = (0..3)
        .map(|_| start_run(&state, repo.path(), &["--memory", "250m"], hog))
        .collect();
    // Sample the fleet's usage while they run: never above its limit.
    let tag = orchestrator::state_tag(state.path());
    let usage = format!("/sys/fs/cgroup/memory/nightshift-{tag}/memory.max_usage_in_bytes");
    let limit = format!("/sys/fs/cgroup/memory/nightshift-{tag}/memory.limit_in_bytes");
    let mut peak = 0u64;
    for c in children {
        let out = c.wait_with_output().unwrap();
        let _ = out;
    }
    if let Ok(text) = std::fs::read_to_string(&usage) {
        peak = text.trim().parse().unwrap_or(0);
    }
    let lim: u64 = std::fs::read_to_string(&limit)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(lim, 300 << 20);
    assert!(
        peak > 0 && peak <= lim,
        "fleet peak {peak} over its limit {lim}"
    );
    let statuses: Vec<String> = state
        .runs()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_string())
        .collect();
    assert!(
        statuses
            .iter()
            .any(|s| s.starts_with("killed: fleet memory cap 300 MiB")),
        "no run was stopped by the fleet cap: {statuses:?}"
    );
    assert!(state.containers().is_empty());
}
