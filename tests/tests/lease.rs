//! The sandbox's lease, against the real engine: a sandbox whose supervisor
//! and watchdog are both gone stops by itself within the lease's bound, and
//! the agent can neither renew the lease nor escape it by killing its
//! wrapper. (`sandbox_image_door::lease` has the decision's own tests.)

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tests::{image, make_repo, stderr, stdout, State};

/// The bound the tests configure: short, so that they end soon.
const LEASE: &str = "3s";

fn start_run(state: &State, repo: &std::path::Path, script: &str) -> Child {
    std::fs::write(
        state.path().join("config.toml"),
        format!("[caps]\nlease = \"{LEASE}\"\ntimeout = \"20m\"\n"),
    )
    .unwrap();
    let img = image();
    state
        .cmd()
        .args(["run", "--repo", repo.to_str().unwrap(), "--image", &img])
        .args(["--", "bash", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Our containers that are still running (an exited one is kept for the
/// next supervisor to settle).
fn running(state: &State) -> Vec<String> {
    let tag = orchestrator::state_tag(state.path());
    let out = Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=nightshift.state={tag}"),
        ])
        .output()
        .expect("docker ps");
    stdout(&out)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Polls until nothing of ours runs; the bound is generous (the sandbox's
/// timeout is 20 minutes, so a sandbox without a lease never gets there).
fn wait_stopped(state: &State) -> Duration {
    let started = Instant::now();
    while !running(state).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the sandbox still runs {:?} after its supervisor and watchdog died",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

/// SIGKILLs every watchdog of the state and the supervisor, at once.
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
    for p in pids.into_iter().chain([supervisor.id() as i32]) {
        kill(Pid::from_raw(p), Signal::SIGKILL).unwrap();
    }
}

fn the_run(state: &State) -> String {
    let run = state.runs();
    assert_eq!(run.len(), 1, "{run:?}");
    run[0]["id"].as_str().unwrap().to_string()
}

#[test]
fn supervisor_and_watchdog_killed_the_sandbox_stops_within_the_lease() {
    let state = State::new();
    let repo = make_repo();
    // The agent tries all night to renew its own lease (a growing counter,
    // a fresh mtime; the door is read-only), writes a file whole, and waits.
    let mut c = start_run(
        &state,
        repo.path(),
        "(n=100000000; while :; do n=$((n+1)); echo \"$n 1\" > /run/nightshift/heartbeat; \
         touch /run/nightshift/heartbeat; sleep 0.1; done) 2>/dev/null & \
         echo kept > kept.tmp; mv kept.tmp kept.txt; sleep 1200",
    );
    tests::wait_running(&state, &mut c, 1);
    let id = the_run(&state);
    tests::wait_for_file(&state.path().join("worktrees").join(&id).join("kept.txt"));
    kill_supervisor_and_watchdog(&state, &c);
    let killed = Instant::now();
    c.wait_with_output().unwrap();
    let _ = wait_stopped(&state);
    eprintln!(
        "sandbox stopped {:?} after kill -9 of its supervisor and watchdog (lease {LEASE})",
        killed.elapsed()
    );
    // The next supervisor settles the run and keeps what the agent wrote.
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(state.containers().is_empty());
    let run = &state.runs()[0];
    assert_eq!(run["status"], "lost: supervisor vanished", "{run}");
    assert_eq!(
        tests::git(
            repo.path(),
            &["show", &format!("refs/nightshift/runs/{id}:kept.txt")]
        ),
        "kept\n"
    );
    assert!(state.verify().status.success());
}

#[test]
fn killing_the_lease_wrapper_ends_the_sandbox() {
    let state = State::new();
    let repo = make_repo();
    // The agent's parent is the wrapper: killing it must not set it free.
    let mut c = start_run(
        &state,
        repo.path(),
        &format!("{}kill -KILL $PPID; sleep 1200", tests::WAIT_AT_GATE),
    );
    tests::wait_running(&state, &mut c, 1);
    let id = the_run(&state);
    tests::open_gate(&state, &id);
    let started = Instant::now();
    while c.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the agent outlived its wrapper"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(state.containers().is_empty());
    let run = &state.runs()[0];
    assert_eq!(run["exit_code"], 137, "{run}");
}

#[test]
fn a_stopped_wrapper_still_ends_by_the_kill_switch() {
    let state = State::new();
    let repo = make_repo();
    // SIGSTOP is the one signal the wrapper cannot refuse from its own uid:
    // the lease then enforces nothing, and the stops outside the sandbox do.
    let mut c = start_run(
        &state,
        repo.path(),
        &format!(
            "{}if head -c1 /proc/$PPID/environ >/dev/null 2>&1; then r=readable; else r=closed; fi; \
             kill -STOP $PPID; echo $r > s.tmp; mv s.tmp stopped.txt; sleep 1200",
            tests::WAIT_AT_GATE
        ),
    );
    tests::wait_running(&state, &mut c, 1);
    let id = the_run(&state);
    tests::open_gate(&state, &id);
    let stopped = state.path().join("worktrees").join(&id).join("stopped.txt");
    tests::wait_for_file(&stopped);
    // The wrapper is not dumpable: its memory and /proc files are closed to
    // the agent, although both run as the same uid.
    assert_eq!(std::fs::read_to_string(&stopped).unwrap(), "closed\n");
    let out = state.run(&["kill", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = c.wait_with_output().unwrap();
    assert!(state.containers().is_empty(), "{}", stderr(&out));
    let run = &state.runs()[0];
    assert!(
        run["status"].as_str().unwrap().starts_with("killed: by "),
        "{run}"
    );
}
