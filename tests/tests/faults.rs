//! Every run settles exactly once, whatever is killed and whenever the
//! state's disk fills: settle claims are taken over from dead settlers, an
//! imported run is never imported again, an ended run is never ended again,
//! door directories go with their runs, a full disk is named and reading
//! stays possible; and a fault-injection harness that kills supervisors,
//! watchdogs, `reconcile` and `approve` at random moments beside concurrent
//! CLI loops, and counts what went wrong (all zero).
//!
//! Two act executors killed with `kill -9` at random moments while acts are
//! approved carry every approved act out exactly once; two run queue
//! dispatchers killed the same way run every task exactly once.
//!
//! The harness runs in a short form by default (about a minute);
//! `NIGHTSHIFT_FAULTS_ITERATIONS=N` runs N iterations (the long form).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tests::morning::Morning;
use tests::{audit_kinds, git, image, make_repo, open_gate, stderr, stdout, State, WAIT_AT_GATE};

fn start_run(state: &State, repo: &Path, script: &str) -> Child {
    let img = image();
    state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.to_str().unwrap(),
            "--image",
            &img,
            "--",
            "bash",
            "-c",
            script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The ids of runs of the state whose status is `running`.
fn running(state: &State) -> Vec<String> {
    state
        .runs()
        .iter()
        .filter(|r| r["status"] == "running")
        .filter_map(|r| r["id"].as_str().map(str::to_string))
        .collect()
}

fn wait_until(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > bound {
            panic!("{what}: not after {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pids of the watchdogs of supervisor process `pid`.
fn watchdogs_of(pid: u32) -> Vec<i32> {
    let out = Command::new("pgrep")
        .args(["-f", &format!("watchdog --supervisor {pid}:")])
        .output()
        .unwrap();
    stdout(&out)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// SIGKILLs a supervisor's watchdogs, then the supervisor: nothing of
/// nightshift is left to settle its run.
fn kill_supervisor_and_watchdog(child: &mut Child) {
    for p in watchdogs_of(child.id()) {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    let _ = child.wait();
}

/// The identity (`pid:starttime`) of a process that has ended.
fn dead_identity() -> String {
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    let identity = orchestrator::run::process_identity(child.id()).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    identity
}

fn db(state: &State) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(state.path().join("state.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn
}

fn run_ended_count(state: &State, run: &str) -> usize {
    audit_kinds(state, run)
        .iter()
        .filter(|k| *k == "run_ended")
        .count()
}

fn status_of(state: &State, run: &str) -> String {
    state
        .runs()
        .into_iter()
        .find(|r| r["id"] == run)
        .and_then(|r| r["status"].as_str().map(str::to_string))
        .unwrap_or_default()
}

fn is_final(status: &str) -> bool {
    status != "running" && status != "created"
}

#[test]
fn a_settle_claim_whose_claimer_died_is_taken_over() {
    let state = State::new();
    if state.sqlite_only("a dead claimer written into state.db's settle claims") {
        return;
    }
    let repo = make_repo();
    let mut child = start_run(
        &state,
        repo.path(),
        &format!("echo kept > kept.txt; {WAIT_AT_GATE} sleep 600"),
    );
    wait_until("the run is running", Duration::from_secs(120), || {
        !running(&state).is_empty()
    });
    let run = running(&state).remove(0);
    kill_supervisor_and_watchdog(&mut child);
    // A settler claimed the run and died before settling it.
    let dead = dead_identity();
    let conn = db(&state);
    let claimed = conn.execute(
        "INSERT INTO settled(run, by, claimer) VALUES (?1, 'nightshift reconcile', ?2)",
        rusqlite::params![run, dead],
    );
    if claimed.is_err() {
        // A database without the claimer column: the claim as it was written.
        conn.execute(
            "INSERT INTO settled(run, by) VALUES (?1, 'nightshift reconcile')",
            rusqlite::params![run],
        )
        .unwrap();
    }
    drop(conn);
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let status = status_of(&state, &run);
    assert!(is_final(&status), "the run is still {status}");
    assert_eq!(run_ended_count(&state, &run), 1);
    assert!(state.containers().is_empty(), "its sandbox stayed");
    assert!(
        !state.path().join("worktrees").join(&run).exists(),
        "its worktree stayed"
    );
    assert!(
        !state.path().join("doors").join(&run).exists(),
        "its door stayed"
    );
    assert!(state.verify().status.success());
}

#[test]
fn reconcile_removes_the_door_of_an_orphan() {
    let state = State::new();
    let repo = make_repo();
    let mut child = start_run(&state, repo.path(), &format!("{WAIT_AT_GATE} sleep 600"));
    wait_until("the run is running", Duration::from_secs(120), || {
        !running(&state).is_empty()
    });
    let run = running(&state).remove(0);
    assert!(state.path().join("doors").join(&run).exists());
    kill_supervisor_and_watchdog(&mut child);
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(is_final(&status_of(&state, &run)));
    assert!(
        !state.path().join("doors").join(&run).exists(),
        "the door of a settled run stayed"
    );
    assert!(state.containers().is_empty());
}

#[test]
fn an_imported_run_is_never_imported_again() {
    let state = State::new();
    if state.sqlite_only("a dead claimer written into state.db's settle claims") {
        return;
    }
    let repo = make_repo();
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        "echo work > agent.txt",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let record = state.runs().remove(0);
    let run = record["id"].as_str().unwrap().to_string();
    let reference = format!("refs/nightshift/runs/{run}");
    let good = git(repo.path(), &["rev-parse", &reference]);
    assert!(git(repo.path(), &["ls-tree", "--name-only", &reference]).contains("agent.txt"));
    // The moment a supervisor is killed while removing the worktree after
    // its import: the run not ended yet, its supervisor gone, and a worktree
    // from which the agent's files are gone.
    let dead = dead_identity();
    db(&state)
        .execute(
            "UPDATE runs SET record = json_set(record, '$.status', 'running', '$.supervisor', ?2, '$.ended_at', NULL) WHERE id = ?1",
            rusqlite::params![run, dead],
        )
        .unwrap();
    let worktree = state.path().join("worktrees").join(&run);
    let base = record["base_commit"].as_str().unwrap().to_string();
    git(
        repo.path(),
        &[
            "worktree",
            "add",
            "-q",
            "--detach",
            worktree.to_str().unwrap(),
            &base,
        ],
    );
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        git(repo.path(), &["rev-parse", &reference]),
        good,
        "the run's result was replaced"
    );
    assert!(!worktree.exists(), "the half-removed worktree stayed");
    assert!(is_final(&status_of(&state, &run)));
}

#[test]
fn an_ended_run_is_never_ended_again() {
    let state = State::new();
    let repo = make_repo();
    let mut child = start_run(&state, repo.path(), &format!("{WAIT_AT_GATE} sleep 600"));
    wait_until("the run is running", Duration::from_secs(120), || {
        !running(&state).is_empty()
    });
    let run = running(&state).remove(0);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    child.wait().unwrap();
    let status = status_of(&state, &run);
    assert!(status.starts_with("interrupted"), "{status}");
    // Its supervisor is gone now: a kill or a reconcile must not end it again.
    let out = state.run(&["kill", &run]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        status_of(&state, &run),
        status,
        "an ended run was relabelled"
    );
    assert_eq!(run_ended_count(&state, &run), 1, "ended twice");
    assert!(state.verify().status.success());
}

/// A small filesystem of its own for a state (a tmpfs), unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn new(size: &str) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .ok()?;
        out.status.success().then_some(SmallDisk { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the disk, then frees `leave` bytes.
    fn fill(&self, leave: u64) {
        use std::io::Write;
        let fill = self.path().join("fill");
        let mut f = std::fs::File::create(&fill).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        let _ = f.flush();
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(leave)).unwrap();
    }
}

impl Drop for SmallDisk {
    /// Unmounts once the last watchdog of the state has let go of it.
    fn drop(&mut self) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let out = Command::new("umount").arg(self.dir.path()).output();
            if out.is_ok_and(|o| o.status.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// What the full-disk trials found: (signal deaths, wrong answers).
fn full_disk_trials(leaves: &[u64]) -> (usize, Vec<String>) {
    use std::os::unix::process::ExitStatusExt;
    let mut signals = 0;
    let mut wrong = Vec::new();
    let repo = make_repo();
    for &leave in leaves {
        let Some(disk) = SmallDisk::new("16m") else {
            wrong.push("cannot mount a small tmpfs (needs root)".into());
            return (signals, wrong);
        };
        let state_dir = disk.path().join("state");
        let cmd = |args: &[&str]| {
            Command::new(tests::nightshift_bin())
                .env("NIGHTSHIFT_STATE_DIR", &state_dir)
                .args(args)
                .output()
                .unwrap()
        };
        let img = image();
        let run_args = [
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &img,
            "--",
            "bash",
            "-c",
            "echo x > x.txt",
        ];
        let first = cmd(&run_args);
        if !first.status.success() {
            wrong.push(format!(
                "a run on the small disk failed: {}",
                stderr(&first)
            ));
            continue;
        }
        disk.fill(leave);
        let ran = cmd(&run_args);
        if ran.status.signal().is_some() {
            signals += 1;
        }
        if ran.status.code() != Some(7) || !stderr(&ran).contains("the state's disk is full") {
            wrong.push(format!(
                "run with {leave} bytes free: {:?} {}",
                ran.status,
                stderr(&ran)
            ));
        }
        for args in [&["runs"][..], &["audit", "verify"], &["queue"]] {
            let out = cmd(args);
            if out.status.signal().is_some() {
                signals += 1;
            }
            if !out.status.success() {
                wrong.push(format!(
                    "{args:?} with {leave} bytes free: {:?} {}",
                    out.status,
                    stderr(&out)
                ));
            }
        }
        // Whatever the full disk interrupted is settled once space is back.
        let _ = std::fs::remove_file(disk.path().join("fill"));
        let out = cmd(&["reconcile"]);
        if !out.status.success() {
            wrong.push(format!("reconcile after freeing: {}", stderr(&out)));
        }
        let runs = cmd(&["runs", "--json"]);
        let runs: Vec<serde_json::Value> = serde_json::from_slice(&runs.stdout).unwrap_or_default();
        for r in runs {
            if !is_final(r["status"].as_str().unwrap_or_default()) {
                wrong.push(format!("run {} unsettled after a full disk", r["id"]));
            }
        }
    }
    (signals, wrong)
}

#[test]
fn a_full_state_disk_is_named_and_reading_still_works() {
    let (signals, wrong) = full_disk_trials(&[0, 16 * 1024]);
    assert_eq!(signals, 0, "a command died of a signal");
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// ----- the fault-injection harness -----

/// A tiny deterministic generator (xorshift), seeded per run of the harness
/// and printed, so that a failing sequence can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

#[derive(Debug, Default)]
struct Counts {
    runs: usize,
    unsettled: usize,
    damaged: usize,
    ended_twice: usize,
    acts_lost: usize,
    double_executions: usize,
    chain_breaks: usize,
    orphans: usize,
    signal_deaths: usize,
    /// What each non-zero count was, for the report.
    notes: Vec<String>,
}

/// Background CLI loops over a state until `stop` is set.
fn cli_loops(
    path: PathBuf,
    store: Option<String>,
    stop: Arc<AtomicBool>,
    n: usize,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let (path, store, stop) = (path.clone(), store.clone(), stop.clone());
            std::thread::spawn(move || {
                let commands: [&[&str]; 4] = [
                    &["runs", "--json"],
                    &["audit", "verify"],
                    &["queue", "--json"],
                    &["runs"],
                ];
                let mut k = i;
                while !stop.load(Ordering::SeqCst) {
                    let mut cmd = Command::new(tests::nightshift_bin());
                    cmd.env("NIGHTSHIFT_STATE_DIR", &path);
                    // The same store as the state's own commands.
                    match &store {
                        Some(url) => cmd.env("NIGHTSHIFT_STORE", url),
                        None => cmd.env_remove("NIGHTSHIFT_STORE"),
                    };
                    let _ = cmd
                        .args(commands[k % commands.len()])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                    k += 1;
                }
            })
        })
        .collect()
}

const FILES: usize = 1500;

fn agent_script() -> String {
    format!(
        "mkdir -p f && for i in $(seq 1 {FILES}); do echo $i > f/$i; done; echo done > agent.txt; {WAIT_AT_GATE} true"
    )
}

/// One iteration: two runs, one of whose supervisors (and sometimes its
/// watchdog) is SIGKILLed at a random moment, a `reconcile` killed at a
/// random moment, CLI loops throughout.
fn iteration(state: &State, repo: &Path, rng: &mut Rng) {
    let mut a = start_run(state, repo, &agent_script());
    let mut b = start_run(state, repo, &agent_script());
    let before = state.runs().len();
    let _ = before;
    let seen = Instant::now();
    let mut ids: Vec<String> = Vec::new();
    // Only this iteration's two runs: a run of an earlier iteration whose
    // supervisor was killed may still read "running" until it is settled.
    let ours = [format!("{}:", a.id()), format!("{}:", b.id())];
    while ids.len() < 2 && seen.elapsed() < Duration::from_secs(120) {
        ids = state
            .runs()
            .iter()
            .filter(|r| r["status"] == "running")
            .filter(|r| {
                let supervisor = r["supervisor"].as_str().unwrap_or_default();
                ours.iter().any(|p| supervisor.starts_with(p.as_str()))
            })
            .filter_map(|r| r["id"].as_str().map(str::to_string))
            .collect();
        if a.try_wait().ok().flatten().is_some() && b.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for id in &ids {
        if state.path().join("worktrees").join(id).exists() {
            open_gate(state, id);
        }
    }
    std::thread::sleep(Duration::from_millis(rng.below(2500)));
    if rng.below(2) == 0 {
        for p in watchdogs_of(a.id()) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
    let _ = kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL);
    let _ = a.wait();
    let mut r = state
        .cmd()
        .arg("reconcile")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(rng.below(1500)));
    let _ = kill(Pid::from_raw(r.id() as i32), Signal::SIGKILL);
    let _ = r.wait();
    let _ = b.wait();
}

/// Runs `reconcile` until every run has ended (bounded).
fn settle_all(state: &State) {
    for _ in 0..20 {
        let _ = state.run(&["reconcile"]);
        if state
            .runs()
            .iter()
            .all(|r| is_final(r["status"].as_str().unwrap_or_default()))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn count_runs(state: &State, repo: &Path, counts: &mut Counts) {
    for r in state.runs() {
        counts.runs += 1;
        let id = r["id"].as_str().unwrap_or_default().to_string();
        let status = r["status"].as_str().unwrap_or_default().to_string();
        if !is_final(&status) {
            counts.unsettled += 1;
            continue;
        }
        if run_ended_count(state, &id) != 1 {
            counts.ended_twice += 1;
        }
        let reference = format!("refs/nightshift/runs/{id}");
        let listed = Command::new("git")
            .current_dir(repo)
            .args(["ls-tree", "-r", "--name-only", &reference])
            .output()
            .unwrap();
        if listed.status.success() {
            let names = stdout(&listed);
            let passed_gate = !names.lines().any(|l| l == ".nightshift-test-gate");
            let files = names.lines().filter(|l| l.starts_with("f/")).count();
            if passed_gate && (!names.lines().any(|l| l == "agent.txt") || files != FILES) {
                counts.damaged += 1;
            }
        }
        let kept = status.starts_with("import failed");
        if !kept && state.path().join("worktrees").join(&id).exists() {
            counts.orphans += 1;
        }
        if state.path().join("doors").join(&id).exists() {
            counts.orphans += 1;
        }
    }
    counts.orphans += state.containers().len();
    if !state.verify().status.success() {
        counts.chain_breaks += 1;
    }
}

/// Acts: an agent queues `n` pushes; each approval is SIGKILLed at a random
/// moment, then approved again until done; every push lands exactly once.
fn acts_under_kills(n: usize, rng: &mut Rng, counts: &mut Counts) {
    let m = Morning::new();
    let script: String = (0..n)
        .map(|i| {
            format!(
                "echo {i} > a{i}.txt && git add a{i}.txt && git commit -qm a{i} && git push -q origin HEAD:refs/heads/agent/b{i}; "
            )
        })
        .collect();
    m.run_agent(&script);
    let queue = m.queue();
    let acts: Vec<String> = queue
        .iter()
        .filter(|a| a["act"]["door"] == "push")
        .filter_map(|a| a["act"]["id"].as_str().map(str::to_string))
        .collect();
    if acts.len() < n {
        counts.acts_lost += n - acts.len();
        counts
            .notes
            .push(format!("{} pushes queued of {n}", acts.len()));
    }
    for act in &acts {
        let mut child = m
            .state
            .cmd()
            .args(["approve", act, "--owner-key-file", m.key.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.below(800)));
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
    }
    for act in &acts {
        // The owner approves again until it is carried out: a killed
        // approval may leave it approved, executing under a dead lock, or
        // awaiting a retry after its backoff (which the next `approve`
        // carries out once due).
        let mut last = String::new();
        let started = Instant::now();
        while m.act(act)["status"] != "done" && started.elapsed() < Duration::from_secs(180) {
            let out = m.as_owner(&["approve", act]);
            last = format!("{}{}", stdout(&out), stderr(&out));
            if m.act(act)["status"] != "done" {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        let status = m.act(act)["status"].clone();
        if status != "done" {
            counts.acts_lost += 1;
            counts.notes.push(format!(
                "act {act} is {status} after approving again: {last}"
            ));
        }
    }
    for i in 0..n {
        if m.remote_ref(&format!("refs/heads/agent/b{i}")).is_none() {
            counts.acts_lost += 1;
            counts
                .notes
                .push(format!("agent/b{i} never reached the remote"));
        }
    }
    // Carried out once is the remote's ref written once (as in
    // `two_executors_killed_at_random_carry_every_approved_act_out_once`): a push request
    // beyond one per act is an attempt whose lease check the remote holds
    // (an approval killed mid-push whose attempt raced the next one's), not
    // a second effect.
    for i in 0..n {
        let written = m.ref_updates(&format!("refs/heads/agent/b{i}"));
        if written > 1 {
            counts.double_executions += written - 1;
            counts
                .notes
                .push(format!("agent/b{i} was written {written} times"));
        }
    }
    if m.pushes_received() > acts.len() {
        counts.notes.push(format!(
            "{} push requests for {} acts (the extra ones refused by their lease or already done)",
            m.pushes_received(),
            acts.len()
        ));
    }
    if !m.state.verify().status.success() {
        counts.chain_breaks += 1;
    }
}

/// `nightshift ARGS` in the background on the state at `root`, with the
/// same store as the state's own commands (`State::cmd`), its output
/// dropped: for a killer thread that holds the path, not the state.
fn background(root: &Path, store: &Option<String>, args: &[&str]) -> Child {
    let mut cmd = Command::new(tests::nightshift_bin());
    cmd.env("NIGHTSHIFT_STATE_DIR", root);
    match store {
        Some(url) => cmd.env("NIGHTSHIFT_STORE", url),
        None => cmd.env_remove("NIGHTSHIFT_STORE"),
    };
    cmd.args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// One act executor in the background (`nightshift execute --watch`), with
/// short leases so that a killed one's acts are taken over soon.
fn start_executor(root: &Path, store: &Option<String>) -> Child {
    background(root, store, &["execute", "--watch", "--lease-secs", "3"])
}

/// Deciding apart from executing, under `kill -9`: an agent queues `n`
/// pushes; the owner approves them one by one (each `approve` runs its own
/// executor pass after the decision and is itself killed at random
/// moments), while two `nightshift execute --watch` executors on the same
/// state are killed with SIGKILL at random moments and started again.
/// Every approved act is carried out exactly once (each remote ref is
/// written once), none is lost, the audit chain holds.
#[test]
fn two_executors_killed_at_random_carry_every_approved_act_out_once() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let mut rng = Rng(seed);
    let n = 8;
    let m = Morning::new();
    let script: String = (0..n)
        .map(|i| {
            format!(
                "echo {i} > e{i}.txt && git add e{i}.txt && git commit -qm e{i} && git push -q origin HEAD:refs/heads/agent/e{i}; "
            )
        })
        .collect();
    m.run_agent(&script);
    let acts: Vec<String> = m
        .queue()
        .iter()
        .filter(|a| a["act"]["door"] == "push")
        .filter_map(|a| a["act"]["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(acts.len(), n, "pushes queued");

    let (root, store) = (m.state.path().to_path_buf(), m.state.store_url.clone());
    let executors = Arc::new(std::sync::Mutex::new(vec![
        start_executor(&root, &store),
        start_executor(&root, &store),
    ]));
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killer = {
        let (executors, stop, kills) = (executors.clone(), stop.clone(), kills.clone());
        let (root, store) = (root.clone(), store.clone());
        let mut rng = Rng(seed.rotate_left(17) | 1);
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100 + rng.below(1200)));
                let i = rng.below(2) as usize;
                let mut all = executors.lock().unwrap();
                let _ = kill(Pid::from_raw(all[i].id() as i32), Signal::SIGKILL);
                let _ = all[i].wait();
                kills.fetch_add(1, Ordering::SeqCst);
                all[i] = start_executor(&root, &store);
            }
        })
    };
    for act in &acts {
        let mut child = m
            .state
            .cmd()
            .args(["approve", act, "--owner-key-file", m.key.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.below(600)));
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
    }
    // Approved acts are carried out by the executors alone from here on
    // (an approval killed before its decision committed is made again).
    let started = Instant::now();
    let mut notes = Vec::new();
    for act in &acts {
        while m.act(act)["status"] == "pending" && started.elapsed() < Duration::from_secs(60) {
            let out = m.as_owner(&["approve", act]);
            if m.act(act)["status"] == "pending" {
                notes.push(format!("{}{}", stdout(&out), stderr(&out)));
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    let settled = |m: &Morning| acts.iter().all(|a| m.act(a)["status"] == "done");
    while !settled(&m) && started.elapsed() < Duration::from_secs(150) {
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    for mut e in executors.lock().unwrap().drain(..) {
        let _ = kill(Pid::from_raw(e.id() as i32), Signal::SIGKILL);
        let _ = e.wait();
    }
    let statuses: Vec<_> = acts
        .iter()
        .map(|a| (a.clone(), m.act(a)["status"].clone()))
        .collect();
    println!(
        "executors under kill -9 (seed {seed}): {} executor kills, {:?}; {statuses:?}",
        kills.load(Ordering::SeqCst),
        started.elapsed()
    );
    let lost: Vec<_> = statuses.iter().filter(|(_, s)| s != "done").collect();
    assert!(lost.is_empty(), "acts not carried out: {lost:?} {notes:?}");
    for i in 0..n {
        assert!(
            m.remote_ref(&format!("refs/heads/agent/e{i}")).is_some(),
            "agent/e{i} never reached the remote"
        );
    }
    // Carried out once is the remote's ref written once. A push request
    // beyond one per act is an attempt by an executor that stalled past
    // its lease mid-push (it cannot be stopped there): the push's expected
    // old value makes the remote refuse it, or find it already done.
    for i in 0..n {
        assert_eq!(
            m.ref_updates(&format!("refs/heads/agent/e{i}")),
            1,
            "agent/e{i} was written more than once"
        );
    }
    println!("push requests: {} for {n} acts", m.pushes_received());
    assert!(kills.load(Ordering::SeqCst) > 0, "no executor was killed");
    assert!(m.state.verify().status.success());
}

/// One run queue dispatcher in the background (`nightshift tasks run`),
/// with short leases so that a killed one's tasks are taken over soon.
fn start_dispatcher(root: &Path, store: &Option<String>) -> Child {
    background(
        root,
        store,
        &["tasks", "run", "--max-parallel", "2", "--lease-secs", "2"],
    )
}

/// Several dispatchers on one store, under `kill -9`: tasks are enqueued;
/// two `nightshift tasks run` dispatchers share the queue (one fleet
/// budget, leases in the store) and are killed with SIGKILL at random
/// moments and started again. Every task ends done, each by exactly one
/// run (a task run twice would leave a second run record), and no more
/// than `--max-parallel` runs of the queue ever ran at once.
#[test]
fn two_dispatchers_killed_at_random_run_every_task_once() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let n = 8;
    let state = State::new();
    let repo = make_repo();
    for i in 0..n {
        let out = state.run(&[
            "enqueue",
            "--repo",
            repo.path().to_str().unwrap(),
            "--ref",
            "main",
            "--image",
            &image(),
            "--task",
            &format!("task {i}"),
            "--",
            "bash",
            "-c",
            &format!("sleep 2; echo {i} > t{i}.txt"),
        ]);
        assert!(out.status.success(), "enqueue: {}", stderr(&out));
    }
    let root = state.path().to_path_buf();
    let store = state.store_url.clone();
    let dispatchers = Arc::new(std::sync::Mutex::new(vec![
        start_dispatcher(&root, &store),
        start_dispatcher(&root, &store),
    ]));
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killer = {
        let (dispatchers, stop, kills) = (dispatchers.clone(), stop.clone(), kills.clone());
        let mut rng = Rng(seed.rotate_left(29) | 1);
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(200 + rng.below(1500)));
                let i = rng.below(2) as usize;
                let mut all = dispatchers.lock().unwrap();
                // One that returned (nothing left it could start) is
                // started again too, as a worker would be.
                if all[i].try_wait().ok().flatten().is_none() {
                    let _ = kill(Pid::from_raw(all[i].id() as i32), Signal::SIGKILL);
                    let _ = all[i].wait();
                    kills.fetch_add(1, Ordering::SeqCst);
                }
                all[i] = start_dispatcher(&root, &store);
            }
        })
    };
    let started = Instant::now();
    let mut most_at_once = 0;
    let final_state = |s: &str| matches!(s, "done" | "failed" | "cancelled");
    loop {
        let now: Vec<serde_json::Value> = tests::queue::tasks(&state);
        let busy = now
            .iter()
            .filter(|t| t["state"] == "starting" || t["state"] == "running")
            .count();
        most_at_once = most_at_once.max(busy);
        if now
            .iter()
            .all(|t| final_state(t["state"].as_str().unwrap_or("")))
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(240) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    for mut d in dispatchers.lock().unwrap().drain(..) {
        let _ = kill(Pid::from_raw(d.id() as i32), Signal::SIGKILL);
        let _ = d.wait();
    }
    let tasks = tests::queue::tasks(&state);
    let runs = state.runs();
    println!(
        "dispatchers under kill -9 (seed {seed}): {} kills, {:?}, at most {most_at_once} at once",
        kills.load(Ordering::SeqCst),
        started.elapsed()
    );
    for t in &tasks {
        assert_eq!(t["state"], "done", "a task was lost or failed: {t:#?}");
    }
    assert_eq!(
        runs.len(),
        n,
        "a task ran twice or not at all: {:#?}",
        runs.iter()
            .map(|r| (&r["id"], &r["status"]))
            .collect::<Vec<_>>()
    );
    let mut by_task: Vec<String> = tasks
        .iter()
        .map(|t| t["progress"]["child"].as_str().unwrap_or("").to_string())
        .collect();
    by_task.sort();
    by_task.dedup();
    assert_eq!(by_task.len(), n, "two tasks share a run: {tasks:#?}");
    for r in &runs {
        assert_eq!(r["status"], "exited 0", "{r:#?}");
    }
    assert!(
        most_at_once <= 2,
        "{most_at_once} runs of the queue at once"
    );
    assert!(kills.load(Ordering::SeqCst) > 0, "no dispatcher was killed");
    assert!(state.containers().is_empty());
    assert!(state.verify().status.success());
}

#[test]
fn fault_injection_settles_every_run_exactly_once() {
    let iterations: usize = std::env::var("NIGHTSHIFT_FAULTS_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let mut rng = Rng(seed);
    let started = Instant::now();
    let state = State::new();
    let repo = make_repo();
    let stop = Arc::new(AtomicBool::new(false));
    let loops = cli_loops(
        state.path().to_path_buf(),
        state.store_url.clone(),
        stop.clone(),
        2,
    );
    for _ in 0..iterations {
        iteration(&state, repo.path(), &mut rng);
    }
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        let _ = l.join();
    }
    settle_all(&state);
    let mut counts = Counts::default();
    count_runs(&state, repo.path(), &mut counts);
    acts_under_kills(iterations.clamp(2, 12), &mut rng, &mut counts);
    let (signals, wrong) = full_disk_trials(&[0, 16 * 1024]);
    counts.signal_deaths += signals;
    counts.unsettled += wrong.iter().filter(|w| w.contains("unsettled")).count();
    println!(
        "fault injection (seed {seed}, {iterations} iterations, {} runs, {:?}): runs unsettled {}, results damaged {}, runs ended twice {}, acts lost {}, double executions {}, chain breaks {}, orphans {}, signal deaths {}",
        counts.runs,
        started.elapsed(),
        counts.unsettled,
        counts.damaged,
        counts.ended_twice,
        counts.acts_lost,
        counts.double_executions,
        counts.chain_breaks,
        counts.orphans,
        counts.signal_deaths
    );
    for note in &counts.notes {
        println!("  {note}");
    }
    assert!(wrong.is_empty(), "full disk: {wrong:#?}");
    assert_eq!(
        (
            counts.unsettled,
            counts.damaged,
            counts.ended_twice,
            counts.acts_lost,
            counts.double_executions,
            counts.chain_breaks,
            counts.orphans,
            counts.signal_deaths
        ),
        (0, 0, 0, 0, 0, 0, 0, 0),
        "{counts:?}"
    );
}

/// A Unix-socket proxy between nightshift and the container engine, which
/// the test cuts: every connection through it is shut down and no new one
/// is accepted.
struct EngineProxy {
    path: PathBuf,
    cut: Arc<AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<std::os::unix::net::UnixStream>>>,
    _dir: tempfile::TempDir,
}

impl EngineProxy {
    fn start() -> EngineProxy {
        use std::os::unix::net::{UnixListener, UnixStream};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.sock");
        let engine = std::env::var(tests::engine_host_var())
            .ok()
            .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
            .unwrap_or_else(|| {
                if tests::on_podman() {
                    "/run/nightshift-podman/podman.sock".into()
                } else {
                    "/var/run/docker.sock".into()
                }
            });
        let listener = UnixListener::bind(&path).unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<std::sync::Mutex<Vec<UnixStream>>> = Arc::default();
        let (cut2, conns2) = (cut.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if cut2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(upstream) = UnixStream::connect(&engine) else {
                    continue;
                };
                {
                    let mut held = conns2.lock().unwrap();
                    held.push(client.try_clone().unwrap());
                    held.push(upstream.try_clone().unwrap());
                }
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap()),
                    (upstream, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        EngineProxy {
            path,
            cut,
            conns,
            _dir: dir,
        }
    }

    /// This proxy's endpoint.
    fn endpoint(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// Cuts every connection and refuses new ones from now on.
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then drops the listener.
        let _ = std::os::unix::net::UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Whether the container `id` is still running, asked of the engine
/// directly (not through the proxy).
fn container_running(id: &str) -> bool {
    let out = Command::new(tests::engine_cli())
        .args(["inspect", "-f", "{{.State.Running}}", id])
        .output()
        .unwrap();
    stdout(&out).trim() == "true"
}

/// The engine's connection is cut mid-run (a proxy between the supervisor
/// and the engine, shut): an unreachable engine is not a sandbox that
/// stopped. The supervisor keeps the worktree (and renews the lease) while
/// the agent goes on, never imports or removes it while the sandbox may
/// write, and gives the run up unsettled; `reconcile` on a working
/// connection removes the container, then imports: every step the agent
/// wrote arrives, and nothing is left (container, worktree, mount).
#[test]
fn a_cut_engine_connection_loses_no_step_and_reconcile_removes_the_sandbox() {
    let state = State::new();
    let repo = make_repo();
    let proxy = EngineProxy::start();
    let img = image();
    let script =
        format!("{WAIT_AT_GATE}for i in $(seq 1 30); do echo $i > step$i.txt; sleep 0.2; done");
    let mut child = state
        .cmd()
        .env(tests::engine_host_var(), proxy.endpoint())
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &img,
            "--timeout",
            "20s",
            "--",
            "bash",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = tests::wait_running(&state, &mut child, 1).remove(0);
    let worktree = state.path().join("worktrees").join(&id);
    open_gate(&state, &id);
    tests::wait_for_file(&worktree.join("step5.txt"));
    proxy.cut();
    let containers = state.containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    // The agent goes on to its end, its sandbox outliving the connection.
    wait_until("the agent's end", Duration::from_secs(90), || {
        !container_running(&containers[0])
    });
    // The supervisor gives the run up (after its deadline), unsettled.
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the supervisor never gave up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", stderr(&out));
    // On a working connection, reconcile settles it: container first.
    let out = state.run(&["reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        state.containers().is_empty(),
        "the sandbox is left after reconcile"
    );
    let status = status_of(&state, &id);
    assert!(is_final(&status), "{status}");
    let reference = format!("refs/nightshift/runs/{id}");
    for i in 1..=30 {
        let file = git(repo.path(), &["show", &format!("{reference}:step{i}.txt")]);
        assert_eq!(file, format!("{i}\n"), "step {i}");
    }
    assert!(!worktree.exists(), "the worktree is left");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(state.path().to_str().unwrap()),
        "a mount is left"
    );
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    assert!(
        !stdout(&loops).contains(state.path().to_str().unwrap()),
        "a loop device is left: {}",
        stdout(&loops)
    );
    assert_eq!(run_ended_count(&state, &id), 1);
}
