//! Every input a sandbox controls has a memory bound: an agent floods each
//! channel it can reach from inside its real sandbox, and the test reads
//! the supervisor's peak resident memory (`VmHWM` of the `nightshift run`
//! process) while the run still runs, against the peak of an idle run of
//! the same supervisor. ARCHITECTURE.md's channel table names these tests.
//!
//! Each hostile agent ends by showing that the channel still works (the door
//! answers an honest request after the flood), so a bound that merely
//! stopped listening would fail here too.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use tests::{image, make_repo, State};

/// What a flood may add to the supervisor's peak over an idle run's, in
/// KiB. The door holds at most four requests at once, each at most one
/// 512 KiB frame (plus its parse), and the output is streamed to the log in
/// fixed buffers: 96 MiB is several times what those bounds allow, and far
/// below what an unbounded buffer would take for the floods below.
const OVER_IDLE_KIB: u64 = 96 * 1024;

/// A raw door client for the agent's scripts, written to `/tmp/door.py`.
const DOOR_PY: &str = r#"
import json, socket, struct, threading
def frame(body):
    return struct.pack(">I", len(body)) + body
def send_raw(data, timeout=60):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    try:
        s.connect("/run/nightshift/door.sock")
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return "reset"
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            more = s.recv(65536)
            if not more:
                break
            data += more
        return data[4:].decode(errors="replace")
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return "oserror %s" % e
    finally:
        s.close()
def request(req, v=3):
    return send_raw(frame(json.dumps({"v": v, "request": req}).encode()))
def in_parallel(n, f):
    threads = [threading.Thread(target=f, args=(i,)) for i in range(n)]
    for t in threads: t.start()
    for t in threads: t.join()
"#;

/// The agent's script: helpers, the flood, then a mark the test waits for
/// and a hold until the test has read the supervisor's peak.
fn script(flood: &str) -> String {
    format!(
        "set -u\ncat > /tmp/door.py <<'PY'\n{DOOR_PY}\nPY\n{flood}\n\
         echo flooded > .flood-done\n\
         while [ ! -e .release ]; do sleep 0.1; done\nrm -f .release .flood-done\n"
    )
}

/// The last 4 KiB of a text, for a failure's message.
fn tail(s: &str) -> &str {
    let mut i = s.len().saturating_sub(4096);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

/// The `VmHWM` (peak resident memory) of a process, in KiB.
fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

struct Flooded {
    state: State,
    _repo: tempfile::TempDir,
    peak_kib: u64,
    log: String,
}

/// Starts `nightshift run`; its own output goes to files in `out` (a pipe
/// nobody reads would stall a supervisor that echoes the agent's output).
fn start(state: &State, repo: &Path, out: &Path, caps: &[&str], script: &str) -> Child {
    let mut args = vec![
        "run".to_string(),
        "--repo".into(),
        repo.to_str().unwrap().into(),
        "--image".into(),
        image(),
    ];
    args.extend(caps.iter().map(|s| s.to_string()));
    args.extend(["--".into(), "bash".into(), "-c".into(), script.into()]);
    state
        .cmd()
        .args(&args)
        .stdout(std::fs::File::create(out.join("stdout")).unwrap())
        .stderr(std::fs::File::create(out.join("stderr")).unwrap())
        .spawn()
        .expect("starting nightshift run")
}

/// Runs `flood` as the agent, reads the supervisor's peak once the agent
/// says it is done, lets the run end, and returns what was seen.
fn flood(caps: &[&str], flood: &str) -> Flooded {
    let state = State::new();
    let repo = make_repo();
    let out = tempfile::tempdir().unwrap();
    let mut child = start(&state, repo.path(), out.path(), caps, &script(flood));
    let printed = || {
        let read = |f: &str| std::fs::read_to_string(out.path().join(f)).unwrap_or_default();
        let (o, e) = (read("stdout"), read("stderr"));
        format!("{}{}", tail(&o), tail(&e))
    };
    let pid = child.id();
    let started = Instant::now();
    let worktree = loop {
        let runs = state.runs();
        if let Some(id) = runs.last().and_then(|r| r["id"].as_str()) {
            let worktree = state.path().join("worktrees").join(id);
            if worktree.join(".flood-done").exists() {
                break worktree;
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "nightshift run ended ({status}) before the flood was done: {}",
                printed()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the agent never finished its flood"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let peak_kib = peak_kib(pid).expect("the supervisor's /proc status");
    std::fs::write(worktree.join(".release"), "").unwrap();
    let status = child.wait().unwrap();
    let runs = state.runs();
    let id = runs.last().unwrap()["id"].as_str().unwrap().to_string();
    let log = state.output_log(&id);
    assert!(
        status.success(),
        "the run failed: {}\n{}",
        printed(),
        tail(&log)
    );
    assert!(state.containers().is_empty(), "a container was left");
    assert!(state.verify().status.success(), "the audit chain broke");
    Flooded {
        state,
        _repo: repo,
        peak_kib,
        log,
    }
}

/// The peak of a run whose agent does nothing, under the same caps.
fn idle(caps: &[&str]) -> u64 {
    flood(caps, "true").peak_kib
}

fn assert_bounded(what: &str, idle_kib: u64, f: &Flooded) {
    eprintln!(
        "{what}: supervisor peak {} KiB, idle {idle_kib} KiB, over idle {} KiB",
        f.peak_kib,
        f.peak_kib.saturating_sub(idle_kib)
    );
    assert!(
        f.peak_kib <= idle_kib + OVER_IDLE_KIB,
        "{what}: the supervisor's peak was {} KiB, idle {idle_kib} KiB (bound: idle + {OVER_IDLE_KIB} KiB)\n{}",
        f.peak_kib,
        tail(&f.log)
    );
}

/// The door's frames: many connections at once, each a frame at the limit
/// that never finishes, frames declaring 4 GiB, and full frames of a
/// payload built to parse expensively; then an honest question is still
/// answered.
#[test]
fn a_flood_of_door_frames_keeps_the_supervisor_small_and_the_door_open() {
    let idle_kib = idle(&[]);
    let f = flood(
        &[],
        r#"python3 - <<'PY'
import sys, json, struct; sys.path.insert(0, "/tmp")
from door import *
# A frame at the limit that stops one byte short: the door waits its deadline.
def stalled(i):
    body = b'{"v":3,"request":{"door":"ask","body":"' + b"a" * (512 * 1024 - 60)
    print("stalled=" + send_raw(frame(body)[: 4 + len(body)], timeout=30)[:80])
in_parallel(8, stalled)
# Frames that declare 4 GiB: refused from the header.
def huge(i):
    print("huge=" + send_raw(struct.pack(">I", 0xFFFFFFFF) + b"x" * 4096)[:80])
in_parallel(32, huge)
# Full frames of a policy check whose payload is 100k tiny values
# (expensive to parse into a tree), eight at a time, 64 in all.
payload = {"tool_name": "Bash", "tool_input": {"command": "true", "k": [0] * 95000}}
body = json.dumps({"v": 3, "request": {"door": "policy_check", "payload": payload}}).encode()
def heavy(i):
    for _ in range(8):
        print("heavy=" + send_raw(frame(body))[:80])
in_parallel(8, heavy)
# Deeply nested arrays: refused, never a stack overflow.
deep = b'{"v":3,"request":{"door":"policy_check","payload":{"a":' + b"[" * 200000 + b"]" * 200000 + b"}}}"
print("deep=" + send_raw(frame(deep[: 512 * 1024 - 8]))[:80])
print("honest=" + request({"door": "ask", "body": "still there?"})[:200])
PY"#,
    );
    assert!(
        f.log.contains("honest={\"") && f.log.contains("queued"),
        "the door stopped answering after the flood: {}",
        tail(&f.log)
    );
    assert!(
        !f.log.contains("honest=timeout") && !f.log.contains("honest=reset"),
        "{}",
        tail(&f.log)
    );
    assert_bounded("door frames", idle_kib, &f);
    // The malformed frames were audited, each one once at most, and the
    // chain still verifies (checked in `flood`).
    let errors = f.state.audit_bodies("door_request");
    assert!(!errors.is_empty(), "nothing audited");
}

/// The output stream: 256 MiB on stdout and stderr with no newline at all
/// (a reader that keeps lines would hold it all), under a cap that does
/// not stop it.
#[test]
fn an_output_flood_without_newlines_keeps_the_supervisor_small() {
    let caps = ["--max-output", "1g"];
    let idle_kib = idle(&caps);
    let f = flood(
        &caps,
        "head -c 134217728 /dev/zero | tr '\\0' 'x'; head -c 134217728 /dev/zero | tr '\\0' 'y' >&2; echo; echo output-done",
    );
    assert!(f.log.contains("output-done"), "the output was cut");
    assert!(
        f.log.len() >= 256 << 20,
        "output lost: {} bytes",
        f.log.len()
    );
    assert_bounded("output flood", idle_kib, &f);
}

/// Act bodies: the run's whole act budget spent on questions at the body
/// limit, four at a time.
#[test]
fn a_flood_of_acts_at_the_body_limit_keeps_the_supervisor_small() {
    let idle_kib = idle(&[]);
    let f = flood(
        &[],
        r#"python3 - <<'PY'
import sys; sys.path.insert(0, "/tmp")
from door import *
body = "q" * (200 * 1024 - 64)
counts = {}
def asker(i):
    for _ in range(60):
        r = request({"door": "ask", "body": body})
        k = "queued" if "queued" in r else ("refused" if "refused" in r else r[:60])
        counts[k] = counts.get(k, 0) + 1
in_parallel(4, asker)
print("acts=" + json.dumps(counts, sort_keys=True))
PY"#,
    );
    assert!(
        f.log.contains("\"queued\": 200"),
        "the run's 200 questions were not all queued: {}",
        tail(&f.log)
    );
    assert_bounded("act bodies", idle_kib, &f);
}
