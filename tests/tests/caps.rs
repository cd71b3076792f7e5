//! Each per-run cap, hit for real by a hostile workload: the run is stopped
//! with the right reason and figure, what it wrote is kept, the supervisor
//! stays responsive meanwhile, and no sandbox is left.

use std::time::{Duration, Instant};

use tests::{
    git, image, make_repo, only_run, open_gate, stderr, wait_running, State, WAIT_AT_GATE,
};

/// Runs `script` with `caps`, checking that another command answers while it
/// runs; returns the run's record. The agent waits at a gate until the test
/// has seen its run running, so a workload that breaches its cap at once
/// (an output flood) cannot end before the test looked.
fn capped(caps: &[&str], script: &str) -> (State, tempfile::TempDir, serde_json::Value) {
    let state = State::new();
    let repo = make_repo();
    let mut args = vec!["run", "--repo", repo.path().to_str().unwrap(), "--image"];
    let img = image();
    args.push(&img);
    args.extend_from_slice(caps);
    let gated = format!("{WAIT_AT_GATE}{script}");
    args.extend_from_slice(&["--", "bash", "-c", &gated]);
    let mut child = state
        .cmd()
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The run is seen running (the agent waits), then the hog is let go.
    let id = wait_running(&state, &mut child, 1).remove(0);
    open_gate(&state, &id);
    // While the hog runs, the supervisor's state still answers.
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        let out = state.run(&["runs", "--json"]);
        assert!(
            out.status.success(),
            "runs did not answer: {}",
            stderr(&out)
        );
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "capped run never ended"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let run = only_run(&state);
    assert!(state.containers().is_empty(), "sandbox left behind");
    assert!(state.verify().status.success());
    (state, repo, run)
}

fn status(run: &serde_json::Value) -> String {
    run["status"].as_str().unwrap_or_default().to_string()
}

fn kept_file(repo: &tempfile::TempDir, run: &serde_json::Value, file: &str) -> String {
    let reference = format!("refs/nightshift/runs/{}", run["id"].as_str().unwrap());
    git(repo.path(), &["show", &format!("{reference}:{file}")])
}

#[test]
fn memory_hog_is_killed_by_the_memory_cap() {
    let (_s, repo, run) = capped(
        &["--memory", "96m"],
        "echo before > before.txt; python3 -c 'b = bytearray(400 * 1024 * 1024)'",
    );
    assert_eq!(status(&run), "killed: memory cap 96 MiB (peak 96 MiB, OOM)");
    assert_eq!(kept_file(&repo, &run, "before.txt"), "before\n");
}

#[test]
fn fork_bomb_is_killed_by_the_process_cap() {
    let (_s, repo, run) = capped(
        &["--pids", "48"],
        "echo before > before.txt; bomb() { bomb | bomb & }; bomb; sleep 60",
    );
    let s = status(&run);
    assert!(s.starts_with("killed: process cap 48 ("), "{s}");
    assert_eq!(kept_file(&repo, &run, "before.txt"), "before\n");
}

#[test]
fn cpu_spinner_is_throttled_and_stopped_by_the_timeout() {
    let (_s, _repo, run) = capped(&["--cpus", "0.5", "--timeout", "4s"], "while :; do :; done");
    let s = status(&run);
    assert!(s.starts_with("killed: timeout 4s"), "{s}");
    // Throttled to half a core: well under the wall-clock time in CPU.
    let cpu = run["cpu_ns"].as_i64().unwrap_or(0) as f64 / 1e9;
    assert!(cpu > 0.5 && cpu < 3.5, "cpu {cpu}s for 4s at 0.5 cores");
}

#[test]
fn sleeper_past_the_timeout_is_killed() {
    let (_s, repo, run) = capped(
        &["--timeout", "2s"],
        "echo before > before.txt; sleep infinity",
    );
    let s = status(&run);
    assert!(s.starts_with("killed: timeout 2s, cpu "), "{s}");
    assert_eq!(kept_file(&repo, &run, "before.txt"), "before\n");
}

#[test]
fn output_flood_is_truncated_then_killed() {
    let (state, _repo, run) = capped(&["--max-output", "64k"], "yes flood");
    let s = status(&run);
    assert!(s.starts_with("killed: output cap 64 KiB"), "{s}");
    let log = state.output_log(run["id"].as_str().unwrap());
    assert_eq!(log.len(), 64 << 10, "kept exactly the cap");
    assert!(log.starts_with("flood\n"));
}

#[test]
fn worktree_filler_is_killed_by_the_worktree_cap() {
    let (_s, repo, run) = capped(
        &["--max-worktree", "24m"],
        "echo before > before.txt; for i in $(seq 1 200); do dd if=/dev/zero of=fill$i bs=1M count=2 2>/dev/null; sleep 0.1; done",
    );
    let s = status(&run);
    assert!(
        s.starts_with("killed: worktree cap 24 MiB (observed "),
        "{s}"
    );
    assert_eq!(kept_file(&repo, &run, "before.txt"), "before\n");
}

#[test]
fn file_descriptor_hog_is_killed_by_the_open_files_cap() {
    let (_s, _repo, run) = capped(
        &["--max-files", "128"],
        "python3 -c '
import time
held = []
try:
    while True:
        held.append(open(\"/dev/null\"))
except OSError:
    pass
time.sleep(60)
'",
    );
    let s = status(&run);
    assert!(
        s.starts_with("killed: open files cap 128 (a process held 128)"),
        "{s}"
    );
}

#[test]
fn a_cap_breach_is_audited_with_its_figure() {
    let (state, _repo, run) = capped(&["--timeout", "2s"], "sleep infinity");
    let show = state.show(run["id"].as_str().unwrap());
    let breach = show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "cap_breached")
        .expect("cap_breached entry");
    assert_eq!(breach["body"]["cap"], "timeout");
    assert_eq!(breach["body"]["limit"], 2);
    assert!(show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "resources"));
}

#[test]
fn bad_cap_values_are_refused_with_a_clear_error() {
    let state = State::new();
    let repo = make_repo();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--memory",
        "lots",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("\"lots\" is not a size"),
        "{}",
        stderr(&out)
    );
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--cpus",
        "99",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("--cpus 99"), "{}", stderr(&out));
}

/// The fleet's processes are shared by every sandbox (the fleet's pids
/// cgroup; `nproc` per uid): no run may ask for more than the fleet, every
/// foreground run passes admission, and a run at its cap leaves another
/// run's forks alone.
#[test]
fn one_run_never_takes_the_fleets_processes_from_another() {
    let state = State::new();
    std::fs::write(
        state.path().join("config.toml"),
        "[fleet]\npids = 600\n\n[caps]\npids = 300\ntimeout = \"20m\"\n",
    )
    .unwrap();
    let repo = make_repo();
    let img = image();
    let run = |extra: &[&str], script: &str| -> std::process::Command {
        let mut c = state.cmd();
        c.args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &img,
        ]);
        c.args(extra).args(["--", "bash", "-c", script]);
        c
    };
    // More processes than the whole fleet: refused before anything starts.
    let out = run(&["--pids", "20000"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("[fleet] pids"), "{}", stderr(&out));
    assert!(state.runs().is_empty());

    // Run A holds nearly every process of its cap (280 threads of 300: at
    // the cap itself the process cap's breach would end it).
    let fill = format!(
        "{WAIT_AT_GATE}python3 -c '
import os, threading, time
for _ in range(280):
    threading.Thread(target=time.sleep, args=(10000,), daemon=True).start()
open(\"filled.tmp\", \"w\").write(str(threading.active_count()))
os.rename(\"filled.tmp\", \"filled.txt\")
time.sleep(10000)'"
    );
    let mut a = run(&[], &fill)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let a_id = wait_running(&state, &mut a, 1).remove(0);
    open_gate(&state, &a_id);
    let filled = state
        .path()
        .join("worktrees")
        .join(&a_id)
        .join("filled.txt");
    tests::wait_for_file(&filled);
    let threads: u64 = std::fs::read_to_string(&filled).unwrap().parse().unwrap();
    assert!(threads > 280, "run A held only {threads} threads");

    // Run B, admitted beside it (300 + 300 = the fleet's 600): its 20
    // forks, held at once, all succeed.
    let out = run(
        &[],
        "ok=0; for i in $(seq 20); do sleep 30 & pids=\"$pids $!\"; done; \
         for p in $pids; do kill $p && ok=$((ok+1)); done; echo \"forks=$ok\"",
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let b = state
        .runs()
        .into_iter()
        .find(|r| r["id"] != a_id.as_str())
        .unwrap();
    let log = state.output_log(b["id"].as_str().unwrap());
    assert!(log.contains("forks=20"), "{log}");

    // Run C would take the fleet past its processes (A still holds its
    // 300): refused, named.
    let a_run = state
        .runs()
        .into_iter()
        .find(|r| r["id"] == a_id.as_str())
        .unwrap();
    assert_eq!(a_run["status"], "running", "{a_run}");
    let out = run(&["--pids", "301"], "true").output().unwrap();
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the fleet is full"),
        "{}",
        stderr(&out)
    );
    assert_eq!(state.runs().len(), 2);

    let out = state.run(&["kill", &a_id]);
    assert!(out.status.success(), "{}", stderr(&out));
    a.wait_with_output().unwrap();
    assert!(state.containers().is_empty());
}

/// The supervisor's high-water mark of resident memory, in bytes.
fn vm_hwm(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// Guarantee 3 against the worktree cap's observation: an agent swaps ten
/// directories for symlinks to a large host directory, over and over, for
/// as long as several observations of the worktree last (a walk by path
/// counted the host's file in about 60% of its walks). The host never
/// counts what those symlinks point at (a walk by path of the live tree
/// did: the run was killed for a cap it never reached), the run ends as it
/// chose to, and its work is imported.
#[test]
fn a_directory_swapped_for_a_symlink_to_a_host_directory_is_never_counted() {
    let state = State::new();
    let repo = make_repo();
    // 100 MiB of allocated blocks on the host, past the 48 MiB cap.
    let host = tempfile::tempdir().unwrap();
    let big = host.path().join("f");
    let out = std::process::Command::new("fallocate")
        .args(["-l", "100M"])
        .arg(&big)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let target = host.path().to_str().unwrap().to_string();
    // Each x<i> is a directory holding `f` (empty) or a symlink to the host
    // directory (holding `f`, 100 MiB), alternating as fast as the agent can.
    // Twenty directories of 150 empty files make any walk slow enough for a
    // swap to land between its look at x<i> and its descent into it.
    let script = format!(
        "echo before > before.txt; \
         for j in $(seq 1 20); do mkdir y$j && (cd y$j && touch $(seq 1 150)); done; \
         for i in 0 1 2 3 4 5 6 7 8 9; do mkdir x$i && : > x$i/f && ln -s {target} s$i; done; \
         python3 -c '
import os, time
end = time.time() + 16
while time.time() < end:
    for i in range(10):
        os.rename(\"x%d\" % i, \"d%d\" % i); os.rename(\"s%d\" % i, \"x%d\" % i)
    for i in range(10):
        os.rename(\"x%d\" % i, \"s%d\" % i); os.rename(\"d%d\" % i, \"x%d\" % i)
'; echo after > after.txt"
    );
    let img = image();
    let gated = format!("{WAIT_AT_GATE}{script}");
    let mut child = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &img,
            "--max-worktree",
            "48m",
            "--",
            "bash",
            "-c",
            &gated,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let id = wait_running(&state, &mut child, 1).remove(0);
    open_gate(&state, &id);
    let mut peak = 0;
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(vm_hwm(child.id()).unwrap_or(0));
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the run never ended"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let run = only_run(&state);
    assert_eq!(status(&run), "exited 0", "{}", stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(kept_file(&repo, &run, "after.txt"), "after\n");
    // Every observation of the worktree stayed under the cap.
    let show = state.show(run["id"].as_str().unwrap());
    for e in show["audit"].as_array().unwrap() {
        if e["kind"] == "resources" {
            let bytes = e["body"]["worktree_bytes"].as_u64().unwrap_or(0);
            assert!(bytes < 48 << 20, "counted {bytes} bytes: {e}");
        }
    }
    assert!(state.containers().is_empty(), "sandbox left behind");
    // The supervisor's memory does not grow with what the agent swaps.
    eprintln!("supervisor VmHWM during the swap race: {} KiB", peak >> 10);
    assert!(peak > 0 && peak < 256 << 20, "supervisor peak {peak} bytes");
}

/// A flood written faster than the worktree is observed meets the kernel's
/// bound: the writes past it fail in the sandbox (no space left), the run is
/// killed naming the worktree cap with a figure near it, and what it wrote
/// before is kept.
#[test]
fn a_burst_past_the_worktree_cap_is_stopped_by_the_kernel() {
    let (state, repo, run) = capped(
        &["--max-worktree", "24m"],
        "echo before > before.txt; for i in $(seq 1 60); do dd if=/dev/zero of=fill$i bs=1M count=2 2>&1 | grep -o 'No space left on device'; done; sleep 60",
    );
    let s = status(&run);
    assert!(
        s.starts_with("killed: worktree cap 24 MiB (observed "),
        "{s}"
    );
    let log = state.output_log(run["id"].as_str().unwrap());
    assert!(
        log.contains("No space left on device"),
        "the burst was not stopped in the sandbox: {log}"
    );
    // The figure is near the cap, never the 120 MiB the agent tried.
    let breach = state.audit_bodies("cap_breached");
    let observed = breach[0]["observed"].as_u64().unwrap();
    assert!(
        observed > 24 << 20 && observed < 32 << 20,
        "observed {observed}"
    );
    assert_eq!(kept_file(&repo, &run, "before.txt"), "before\n");
}
