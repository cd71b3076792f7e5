//! The sandbox's lease, against the real engine: a sandbox whose supervisor
//! and watchdog are both gone stops by itself within the lease's bound; the
//! agent can neither renew the lease nor stop, kill, trace or write its
//! wrapper (the container's PID 1); the host-side end stops a sandbox whose
//! wrapper cannot act; a lapsed lease is named. (`sandbox_image_door::lease`
//! has the decision's own tests.)

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
    let out = Command::new(tests::engine_cli())
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

/// How long past the lease a sandbox may outlive its supervisor and
/// watchdog: the host-side end's margin (`lease::HOST_MARGIN`, 5 s) plus
/// the engine's teardown and this test's polling, generously.
const MARGIN: Duration = Duration::from_secs(30);

/// The containers of the state that are still running, polled until none
/// is or `bound` has passed; the time it took.
fn stopped_within(state: &State, bound: Duration) -> Duration {
    let started = Instant::now();
    while !running(state).is_empty() {
        assert!(
            started.elapsed() < bound,
            "the sandbox still runs {:?} after its supervisor and watchdog died (lease {LEASE})",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

/// Everything an agent of the sandbox's uid can try against its lease:
/// SIGSTOP and SIGKILL to its parent and to PID 1, ptrace (attach and
/// seize) of both, and `/proc/1/mem` opened for writing. Each outcome is
/// written to `attacks.txt`, then PID 1's state (never `T`, stopped).
const ATTACKS: &str = r#"kill -STOP $PPID; kill -STOP 1; kill -KILL $PPID; kill -KILL 1; sleep 0.5
PARENT=$PPID python3 - <<'PY' > attacks.tmp
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for name, req in [("attach", 16), ("seize", 0x4206)]:
    for pid in [int(os.environ["PARENT"]), 1]:
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(101), ctypes.c_long(req), ctypes.c_long(pid), ctypes.c_long(0), ctypes.c_long(0))
        print(f"ptrace-{name}-{pid}=" + ("ok" if r >= 0 else f"errno{ctypes.get_errno()}"))
try:
    f = open("/proc/1/mem", "r+b", buffering=0)
    f.seek(0x400000)
    f.write(b"\0")
    print("mem=written")
except OSError as e:
    print(f"mem=errno{e.errno}")
state = open("/proc/1/stat").read().rsplit(")", 1)[1].split()[0]
print(f"pid1-state={state}")
print(f"parent={os.environ['PARENT']}")
PY
mv attacks.tmp attacks.txt; echo kept > kept.tmp; mv kept.tmp kept.txt; sleep 1200"#;

#[test]
fn the_agent_cannot_stop_its_lease_and_the_sandbox_ends_without_supervisor_or_watchdog() {
    let state = State::new();
    let repo = make_repo();
    let mut c = start_run(&state, repo.path(), ATTACKS);
    tests::wait_running(&state, &mut c, 1);
    let id = the_run(&state);
    let worktree = state.path().join("worktrees").join(&id);
    tests::wait_for_file(&worktree.join("kept.txt"));
    let attacks = std::fs::read_to_string(worktree.join("attacks.txt")).unwrap();
    let seen: std::collections::BTreeMap<&str, &str> =
        attacks.lines().filter_map(|l| l.split_once('=')).collect();
    // The wrapper is the agent's parent and the container's PID 1; none of
    // it took: not stopped, not traced, its memory closed (EACCES).
    assert_eq!(seen.get("parent"), Some(&"1"), "{attacks}");
    assert_eq!(seen.get("pid1-state"), Some(&"S"), "{attacks}");
    for name in ["attach", "seize"] {
        assert_eq!(
            seen.get(format!("ptrace-{name}-1").as_str()),
            Some(&"errno1"),
            "{attacks}"
        );
    }
    assert_eq!(seen.get("mem"), Some(&"errno13"), "{attacks}");
    // Now the supervisor and the watchdog go, together.
    kill_supervisor_and_watchdog(&state, &c);
    let took = stopped_within(&state, Duration::from_secs(3) + MARGIN);
    c.wait_with_output().unwrap();
    eprintln!(
        "sandbox stopped {took:?} after kill -9 of its supervisor and watchdog (lease {LEASE})"
    );
    // The next start settles the run with the agent's work imported.
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(state.containers().is_empty());
    let run = &state.runs()[0];
    assert_eq!(run["status"], "lost: supervisor vanished", "{run}");
    // The sandbox ended itself (the wrapper's status), and the run says why.
    assert_eq!(run["exit_code"], 125, "{run}");
    assert!(
        run["reason"]
            .as_str()
            .unwrap_or("")
            .contains("its lease lapsed"),
        "{run}"
    );
    assert_eq!(
        tests::git(
            repo.path(),
            &["show", &format!("refs/nightshift/runs/{id}:kept.txt")]
        ),
        "kept\n"
    );
    assert!(state.verify().status.success());
}

/// The lease's host-side end alone: the sandbox is frozen from the host
/// (`docker pause`: its wrapper can do nothing), then the supervisor and
/// watchdog are killed; the container is still gone within the lease
/// plus the margin, killed through the engine by `nightshift lease-end`.
#[test]
fn the_host_side_end_stops_a_sandbox_whose_wrapper_cannot_act() {
    let state = State::new();
    let repo = make_repo();
    let mut c = start_run(
        &state,
        repo.path(),
        "echo kept > kept.tmp; mv kept.tmp kept.txt; sleep 1200",
    );
    tests::wait_running(&state, &mut c, 1);
    let id = the_run(&state);
    tests::wait_for_file(&state.path().join("worktrees").join(&id).join("kept.txt"));
    let container = running(&state);
    assert_eq!(container.len(), 1);
    let out = Command::new(tests::engine_cli())
        .args(["pause", &container[0]])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    kill_supervisor_and_watchdog(&state, &c);
    let took = stopped_within(&state, Duration::from_secs(3) + MARGIN);
    c.wait_with_output().unwrap();
    eprintln!("frozen sandbox stopped {took:?} after kill -9 of its supervisor and watchdog");
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(state.containers().is_empty());
    assert_eq!(
        tests::git(
            repo.path(),
            &["show", &format!("refs/nightshift/runs/{id}:kept.txt")]
        ),
        "kept\n"
    );
}

/// A supervisor stopped (SIGSTOP) for longer than the lease: the sandbox
/// ends itself, and once the supervisor runs again the run says that its
/// lease lapsed, in its status, its reason and the audit, rather than a
/// bare `exited 125`.
#[test]
fn a_lapsed_lease_is_named_in_the_status_and_the_audit() {
    let state = State::new();
    let repo = make_repo();
    let mut c = start_run(&state, repo.path(), "sleep 1200");
    tests::wait_running(&state, &mut c, 1);
    let id = the_run(&state);
    let supervisor = Pid::from_raw(c.id() as i32);
    kill(supervisor, Signal::SIGSTOP).unwrap();
    let took = stopped_within(&state, Duration::from_secs(3) + MARGIN);
    kill(supervisor, Signal::SIGCONT).unwrap();
    eprintln!("sandbox ended itself {took:?} after its supervisor was stopped");
    let out = c.wait_with_output().unwrap();
    let run = &state.runs()[0];
    assert_eq!(
        run["status"],
        "killed: lease lapsed",
        "{run} {}",
        stderr(&out)
    );
    assert!(
        run["reason"]
            .as_str()
            .unwrap_or("")
            .contains("renewed no heartbeat"),
        "{run}"
    );
    let exited = state.show(&id)["audit"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "exited")
        .cloned()
        .unwrap();
    assert_eq!(exited["body"]["ended_by"], "lease lapsed", "{exited}");
    assert_eq!(exited["body"]["exit_code"], 125, "{exited}");
    assert!(state.verify().status.success());
}
