//! The kill switch depends on nothing that may be broken, and nothing
//! escapes it by being still on its way to start: `kill` works with a
//! malformed configuration (it needs only the engine), a kill during
//! worktree creation ends the run before its agent starts, and the
//! watchdog never replaces the fleet limits of the run's own `--config`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tests::{git, image, stderr, stdout, State};

fn spawn_run(state: &State, repo: &std::path::Path, extra: &[&str], script: &str) -> Child {
    let mut c: Command = state.cmd();
    c.args(extra)
        .args(["run", "--repo", repo.to_str().unwrap(), "--image", &image()])
        .args(["--", "bash", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// Polls `nightshift runs --json` until a run has `status` (or panics).
fn wait_status(state: &State, pred: impl Fn(&str) -> bool, what: &str) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let out = state.run(&["runs", "--json"]);
        if out.status.success() {
            let runs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
            if let Some(r) = runs
                .into_iter()
                .find(|r| pred(r["status"].as_str().unwrap_or_default()))
            {
                return r;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no run became {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kill_all_works_with_a_malformed_config() {
    let state = State::new();
    let repo = tests::make_repo();
    let child = spawn_run(&state, repo.path(), &[], "sleep 300");
    let run = wait_status(&state, |s| s == "running", "running");
    // Someone breaks the configuration during the night.
    std::fs::write(state.path().join("config.toml"), "[caps\nmemory = = 3\n").unwrap();
    let out = state.run(&["kill", "--all"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("killed 1 sandbox"),
        "{}",
        stdout(&out)
    );
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let id = run["id"].as_str().unwrap();
    let shown = state.show(id);
    assert!(
        shown["run"]["status"]
            .as_str()
            .unwrap_or_default()
            .starts_with("killed: by"),
        "{shown}"
    );
    assert!(state.containers().is_empty());
}

#[test]
fn a_kill_during_worktree_creation_ends_the_run_before_its_agent_starts() {
    let state = State::new();
    // A repository large enough that its worktree takes a while to write.
    let repo = tests::make_repo();
    for d in 0..40 {
        let dir = repo.path().join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..1000 {
            std::fs::write(dir.join(format!("f{f}.txt")), format!("{d} {f}\n")).unwrap();
        }
    }
    git(repo.path(), &["add", "-A"]);
    // No background gc: it would repack (and delete) loose objects while
    // the worktree copies them.
    git(
        repo.path(),
        &["-c", "gc.auto=0", "commit", "-qm", "many files"],
    );

    let child = spawn_run(
        &state,
        repo.path(),
        &[],
        "echo started > started.txt; sleep 300",
    );
    let run = wait_status(&state, |s| s == "created", "created");
    let id = run["id"].as_str().unwrap().to_string();
    let out = state.run(&["kill", "--all"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", stdout(&out));
    let shown = state.show(&id);
    assert!(
        shown["run"]["status"]
            .as_str()
            .unwrap_or_default()
            .starts_with("killed: by"),
        "{shown}"
    );
    let kinds = tests::audit_kinds(&state, &id);
    assert!(
        !kinds.iter().any(|k| k == "started"),
        "the agent started after the kill: {kinds:?}"
    );
    assert!(state.containers().is_empty());
}

#[test]
fn the_watchdog_keeps_the_fleet_limits_of_the_runs_own_config() {
    let state = State::new();
    let repo = tests::make_repo();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("night.toml");
    std::fs::write(&config, "[fleet]\nmemory = \"300m\"\n").unwrap();
    let child = spawn_run(
        &state,
        repo.path(),
        &["--config", config.to_str().unwrap()],
        "true",
    );
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The watchdog ends once its supervisor is gone; then nothing else of
    // this run can touch the fleet's limits.
    let tag = orchestrator::state_tag(state.path());
    let started = Instant::now();
    while watchdogs(state.path()) > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the watchdog never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let limit = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/nightshift-{tag}/memory.limit_in_bytes"
    ))
    .unwrap();
    assert_eq!(limit.trim(), (300u64 << 20).to_string());
}

/// How many watchdog processes of this state are alive.
fn watchdogs(state: &std::path::Path) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let has = |s: &str| args.contains(&s.as_bytes());
        if has("watchdog") && has(state.to_str().unwrap()) {
            n += 1;
        }
    }
    n
}

#[test]
fn a_sandbox_created_and_not_yet_started_is_removed_by_the_kill_switch() {
    // A container of this state as the supervisor leaves it between create
    // and start: created, labelled, never started. The kill switch must make
    // sure it can never start (SIGKILL on a created container does nothing).
    let state = State::new();
    let tag = orchestrator::state_tag(state.path());
    let out = Command::new(tests::engine_cli())
        .args([
            "create",
            "--network",
            "none",
            "--label",
            "nightshift.managed=1",
            "--label",
            &format!("nightshift.state={tag}"),
            "--label",
            "nightshift.run=01created0000000000000000",
            &image(),
            "sleep",
            "300",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(state.containers().len(), 1);
    let out = state.run(&["kill", "--all"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let gone = Command::new(tests::engine_cli())
        .args(["inspect", &id])
        .output()
        .unwrap();
    assert!(
        !gone.status.success(),
        "the created container survived the kill switch and could still be started"
    );
    assert!(state.containers().is_empty());
}
