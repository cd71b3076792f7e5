//! Helpers for the end-to-end tests in `tests/tests/`: they drive the real
//! `nightshift` binary against the real container engine and real git.
//!
//! Each test gets its own state directory, so tests never see each other's
//! runs, and every test checks that no container of its state survives.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use orchestrator::state_store::AuditLog as _;

/// The `nightshift` binary built beside this test executable, or the one
/// `NIGHTSHIFT_BENCH_BIN` names (a benchmark's baseline: another build).
pub fn nightshift_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NIGHTSHIFT_BENCH_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/nightshift
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile directory");
    let bin = profile_dir.join("nightshift");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p orchestrator`; scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// One isolated nightshift state for a test.
/// The variable that runs the end-to-end tests on another store:
/// `postgres` puts each test's state in a fresh PostgreSQL database (on the
/// server `NIGHTSHIFT_TEST_PG` names, or one started for the test process).
pub const TEST_STORE_VAR: &str = "NIGHTSHIFT_TEST_STORE";

/// The variable that runs the end-to-end tests on another engine:
/// `podman` runs every sandbox on nightshift's rootful Podman service
/// (`scripts/podman.sh start`), `--engine podman` for each command.
pub const TEST_ENGINE_VAR: &str = "NIGHTSHIFT_TEST_ENGINE";

/// Whether the tests run on Podman (`NIGHTSHIFT_TEST_ENGINE=podman`).
pub fn on_podman() -> bool {
    match std::env::var(TEST_ENGINE_VAR).as_deref() {
        Ok("podman") => true,
        Ok("docker") | Ok("") | Err(_) => false,
        Ok(other) => panic!("{TEST_ENGINE_VAR}={other}: use docker or podman"),
    }
}

/// The engine's own command-line client (`docker` or `podman`), for what
/// the tests ask the engine behind nightshift's back.
pub fn engine_cli() -> &'static str {
    if on_podman() {
        "podman"
    } else {
        "docker"
    }
}

/// The variable that names the engine's endpoint to nightshift: Docker's
/// own `DOCKER_HOST`, or `NIGHTSHIFT_PODMAN_HOST` for nightshift's Podman
/// service.
pub fn engine_host_var() -> &'static str {
    if on_podman() {
        "NIGHTSHIFT_PODMAN_HOST"
    } else {
        "DOCKER_HOST"
    }
}

#[derive(Debug)]
pub struct State {
    pub dir: tempfile::TempDir,
    /// The store's URL when it is not the state directory's SQLite store.
    pub store_url: Option<String>,
}

impl State {
    pub fn new() -> Self {
        let store_url = match std::env::var(TEST_STORE_VAR).as_deref() {
            Ok("postgres") => Some(orchestrator::store_postgres::testing::fresh_database()),
            Ok("sqlite") | Ok("") | Err(_) => None,
            Ok(other) => panic!("{TEST_STORE_VAR}={other}: use postgres or sqlite"),
        };
        Self {
            dir: tempfile::Builder::new()
                .prefix("nightshift-e2e-")
                .tempdir()
                .expect("temp state dir"),
            store_url,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Whether this state's store is PostgreSQL (`NIGHTSHIFT_TEST_STORE`).
    pub fn on_postgres(&self) -> bool {
        self.store_url.is_some()
    }

    /// The store's port over this state, as the binary builds it.
    pub fn stores(&self) -> orchestrator::state_store::Stores {
        match &self.store_url {
            Some(url) => std::sync::Arc::new(orchestrator::store_postgres::PgBackend::new(
                url,
                self.path().to_path_buf(),
            )),
            None => std::sync::Arc::new(orchestrator::store::SqliteBackend::new(
                self.path().to_path_buf(),
                None,
            )),
        }
    }

    /// A `nightshift` command bound to this state, with a clean environment
    /// apart from what the engine client needs.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(nightshift_bin());
        c.env("NIGHTSHIFT_STATE_DIR", self.path());
        match &self.store_url {
            Some(url) => c.env("NIGHTSHIFT_STORE", url),
            None => c.env_remove("NIGHTSHIFT_STORE"),
        };
        if on_podman() {
            c.env("NIGHTSHIFT_ENGINE", "podman");
        } else {
            c.env_remove("NIGHTSHIFT_ENGINE");
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("running nightshift")
    }

    /// The bodies of this state's audit entries of `kind`, oldest first,
    /// read from its database.
    pub fn audit_bodies(&self, kind: &str) -> Vec<serde_json::Value> {
        self.audit_runs_and_bodies(kind)
            .into_iter()
            .map(|(_, body)| body)
            .collect()
    }

    /// The run and body of this state's audit entries of `kind`, oldest
    /// first.
    pub fn audit_runs_and_bodies(&self, kind: &str) -> Vec<(Option<String>, serde_json::Value)> {
        self.stores()
            .connect()
            .expect("the state's store")
            .entries()
            .expect("reading the audit log")
            .into_iter()
            .filter(|e| e.kind == kind)
            .map(|e| (e.run, serde_json::Value::Object(e.body)))
            .collect()
    }

    /// Every audit entry of this state, read through the store's port.
    pub fn audit_entries(&self) -> Vec<orchestrator_audit::Entry> {
        self.stores()
            .connect()
            .expect("the state's store")
            .entries()
            .expect("reading the audit log")
    }

    /// How many audit entries of `kind` hold `needle` in their body (as
    /// compact JSON, e.g. `"verdict":"error"`).
    pub fn count_audit(&self, kind: &str, needle: &str) -> usize {
        self.audit_entries()
            .into_iter()
            .filter(|e| e.kind == kind)
            .filter(|e| {
                serde_json::Value::Object(e.body.clone())
                    .to_string()
                    .contains(needle)
            })
            .count()
    }

    /// A tamper test of the SQLite file itself: on another store it says so
    /// and returns true (the test then stops; it asserts in the SQLite
    /// pass, and PostgreSQL's own tamper tests are
    /// `orchestrator/store-postgres/tests/`).
    pub fn sqlite_only(&self, what: &str) -> bool {
        if self.on_postgres() {
            eprintln!(
                "SQLite only ({what}): this test changes state.db itself; PostgreSQL's tamper tests are in orchestrator/store-postgres/tests/"
            );
        }
        self.on_postgres()
    }

    /// `nightshift runs --json`.
    pub fn runs(&self) -> Vec<serde_json::Value> {
        let out = self.run(&["runs", "--json"]);
        assert!(out.status.success(), "runs failed: {}", stderr(&out));
        serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).expect("runs json")
    }

    pub fn show(&self, id: &str) -> serde_json::Value {
        let out = self.run(&["show", id, "--json"]);
        assert!(out.status.success(), "show failed: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("show json")
    }

    /// Containers labelled with this state's tag (there must be none left).
    pub fn containers(&self) -> Vec<String> {
        let tag = orchestrator::state_tag(self.path());
        let out = Command::new(engine_cli())
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=nightshift.state={tag}"),
            ])
            .output()
            .expect("the engine's ps");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// The output the supervisor kept for a run.
    pub fn output_log(&self, run: &str) -> String {
        std::fs::read_to_string(self.path().join("runs").join(run).join("output.log"))
            .unwrap_or_default()
    }

    pub fn verify(&self) -> Output {
        self.run(&["audit", "verify"])
    }
}

impl Drop for State {
    /// Removes this state's fleet cgroups, their run cgroups first (Podman's
    /// `run-<id>`), once their sandboxes are gone: the kernel refuses to
    /// remove a cgroup that still has members, and an engine removes a
    /// container's cgroup a moment after the container, so this tries again
    /// for at most 5 s before leaving what is still in use.
    fn drop(&mut self) {
        let tag = orchestrator::state_tag(self.path());
        let fleets: Vec<PathBuf> = [
            "memory",
            "cpu,cpuacct",
            "cpu",
            "cpuacct",
            "pids",
            "unified",
            "systemd",
            "blkio",
            "devices",
            "freezer",
            "net_cls,net_prio",
            "perf_event",
            "hugetlb",
            "cpuset",
            "rdma",
            "misc",
        ]
        .iter()
        .map(|c| PathBuf::from(format!("/sys/fs/cgroup/{c}/nightshift-{tag}")))
        .chain(std::iter::once(PathBuf::from(format!(
            "/sys/fs/cgroup/nightshift-{tag}"
        ))))
        .filter(|p| p.is_dir())
        .collect();
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let left: Vec<&PathBuf> = fleets
                .iter()
                .filter(|p| !remove_cgroup_tree(p, 4))
                .collect();
            if left.is_empty() || std::time::Instant::now() >= give_up {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// Removes the cgroup `dir` and the cgroups under it (at most `depth`
/// levels), deepest first; whether it is gone. Only empty cgroups can be
/// removed (the kernel's rule), so nothing in use is touched.
fn remove_cgroup_tree(dir: &Path, depth: usize) -> bool {
    if depth > 0 {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_cgroup_tree(&e.path(), depth - 1);
                }
            }
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The default image's reference (built by scripts/test.sh before the tests).
pub fn image() -> String {
    orchestrator::image::default_reference()
}

/// Runs git in `dir`, panicking with its stderr on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .output()
        .expect("running git");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A small host repository with a couple of files and one commit.
pub fn make_repo() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("nightshift-repo-")
        .tempdir()
        .expect("temp repo");
    git(dir.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(dir.path().join("README.md"), "# test repo\n").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.txt"), "one\ntwo\n").unwrap();
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-q", "-m", "initial"]);
    dir
}

/// The id of the only run in a state.
pub fn only_run(state: &State) -> serde_json::Value {
    let runs = state.runs();
    assert_eq!(runs.len(), 1, "expected one run, got {runs:?}");
    runs.into_iter().next().unwrap()
}

/// The kinds of a run's audit entries, in order.
pub fn audit_kinds(state: &State, run: &str) -> Vec<String> {
    state.show(run)["audit"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| e["kind"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}
/// A shell prefix that makes an agent wait at a gate until the test opens
/// it ([`open_gate`]), so that a test sees the run running without racing
/// it: the run cannot end before the test has looked.
pub const WAIT_AT_GATE: &str =
    "while [ ! -e .nightshift-test-gate ]; do sleep 0.05; done; rm -f .nightshift-test-gate; ";

/// Waits until `n` runs of the state are running (their agents waiting at
/// the gate); panics with `child`'s stderr if it ended first. Returns the
/// running runs' ids.
pub fn wait_running(state: &State, child: &mut std::process::Child, n: usize) -> Vec<String> {
    let started = std::time::Instant::now();
    loop {
        let running: Vec<String> = state
            .runs()
            .iter()
            .filter(|r| r["status"] == "running")
            .filter_map(|r| r["id"].as_str().map(str::to_string))
            .collect();
        if running.len() >= n {
            return running;
        }
        if let Some(status) = child.try_wait().expect("waiting for nightshift run") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("nightshift run ended ({status}) before its run was seen running: {err}");
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "the run never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Opens the gate an agent started with [`WAIT_AT_GATE`] waits at.
pub fn open_gate(state: &State, run: &str) {
    let gate = state
        .path()
        .join("worktrees")
        .join(run)
        .join(".nightshift-test-gate");
    std::fs::write(&gate, b"").expect("opening the gate");
}

/// Waits until `path` exists (a file the agent writes), with a generous bound.
pub fn wait_for_file(path: &Path) {
    wait_until(
        &format!("{} appeared", path.display()),
        std::time::Duration::from_secs(120),
        || path.exists(),
    );
}

/// Polls `ready` every 50 ms until it holds. `give_up` only ends a wait for
/// something that will never happen (a panic naming `what`): it bounds the
/// test, it measures nothing.
pub fn wait_until(what: &str, give_up: std::time::Duration, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + give_up;
    while !ready() {
        if std::time::Instant::now() >= deadline {
            panic!("never: {what}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A raw door client for the agent's scripts, written to `/tmp/door.py`.
/// `send(request, pack, declare, cut)` sends `{"v": V, "request": ...}`,
/// then `pack` (or its first `cut` bytes), and prints nothing; it returns
/// the reply's JSON text, `"timeout"` past 30 s (the clients' default
/// bound), or `"noanswer"`.
pub const DOOR_PY: &str = r#"
import json, socket, struct
def send(req, v=3, pack=b"", cut=None, timeout=30):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    try:
        s.connect("/run/nightshift/door.sock")
        body = json.dumps({"v": v, "request": req}).encode()
        try:
            s.sendall(struct.pack(">I", len(body)) + body)
            s.sendall(pack if cut is None else pack[:cut])
        except (BrokenPipeError, ConnectionResetError):
            pass
        s.shutdown(socket.SHUT_WR)
        head = b""
        while len(head) < 4:
            more = s.recv(4 - len(head))
            if not more:
                return "noanswer"
            head += more
        n = struct.unpack(">I", head)[0]
        data = b""
        while len(data) < n:
            more = s.recv(n - len(data))
            if not more:
                return "noanswer"
            data += more
        return data.decode()
    except socket.timeout:
        return "timeout"
    finally:
        s.close()
def push(commit, ref, pack=b"", v=3, delete=False):
    if v == 1:
        return send({"door": "push", "remote": "origin", "dst_ref": ref, "claimed_commit": commit}, v=1)
    return send({"door": "push", "remote": "origin", "dst_ref": ref, "claimed_commit": commit,
                 "force": False, "delete": delete, "pack_bytes": len(pack)}, pack=pack)
def pr(head, commit, v=3):
    req = {"door": "pull_request", "remote": "forge", "base": "refs/heads/main", "head": head,
           "title": "t", "body": "b"}
    if v >= 2:
        req.update({"head_commit": commit, "pack_bytes": 0})
    return send(req, v=v)
ZERO = "0" * 40
"#;

pub mod agents;
pub mod browser;
pub mod loopback;
pub mod model;
pub mod morning;
pub mod probes;
pub mod queue;
