//! An agent that races the host from inside its sandbox while it asks the
//! door for pushes and pull requests: it swaps directories of its `.git`
//! for symlinks to host directories, swaps a FIFO and a sparse 10 GB file in
//! for a loose object, rewrites `objects/info/alternates`, all in a loop
//! (`renameat2(RENAME_EXCHANGE)` through python's ctypes). The host never
//! reads, lists or deletes by path inside the live worktree (the objects of
//! an act come over the door as a pack), so none of it has any effect: no
//! host file is deleted, the door answers every request in time, the
//! supervisor's memory stays small, no foreign commit is taken, and no
//! reply tells anything about host files. Replies never hold a host path.
//!
//! The agent speaks the door's protocol raw (python, both the current
//! version and version 1), so that every request reaches the door whatever
//! the sandbox's own git makes of the swapped files.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tests::{git, image, make_repo, stderr, stdout, State, DOOR_PY};

/// Exchanges two paths in a loop until `/tmp/stop` exists, repairing what
/// the host may have deleted, then leaves the real one in place:
/// `python3 /tmp/swap.py MODE ...`.
const SWAP_PY: &str = r#"
import ctypes, os, shutil, sys
libc = ctypes.CDLL(None, use_errno=True)
def xchg(a, b):
    # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE), x86_64 syscall 316
    return libc.syscall(316, -100, a.encode(), -100, b.encode(), 2) == 0
mode = sys.argv[1]
n = 0
# Times a path had to be put back because something other than this script
# removed it while the agent ran: the host must never delete in a live tree.
repairs = 0
if mode == "dir":
    # A real directory and a symlink to a host directory, exchanged.
    real, link, target = sys.argv[2:5]
    def repair():
        if not os.path.lexists(real) and os.path.isdir(link) and not os.path.islink(link):
            os.rename(link, real)
        if not os.path.lexists(link):
            os.symlink(target, link)
    repair()
    while not os.path.exists("/tmp/stop"):
        if not xchg(real, link):
            repairs += 1
            repair()
        n += 1
    if os.path.islink(real):
        xchg(real, link)
    repair()
elif mode == "object":
    # A loose object and, in turn, a FIFO and a sparse 10 GB file.
    obj, fifo, big, backup = sys.argv[2:6]
    def ensure():
        # Put each kind back where it belongs, whatever the host removed.
        for p in (obj, fifo, big):
            if os.path.lexists(p):
                os.unlink(p)
        shutil.copyfile(backup, obj)
        os.mkfifo(fifo)
        with open(big, "wb") as f:
            f.truncate(10 << 30)
    ensure()
    while not os.path.exists("/tmp/stop"):
        for other in (fifo, big):
            ok = xchg(obj, other) and xchg(obj, other)
            if not ok:
                repairs += 1
                ensure()
        n += 1
        if n == 10:
            open("/tmp/swapping", "w").close()
    ensure()
elif mode == "file":
    # Rewrites a file in a loop.
    path, text = sys.argv[2:4]
    while not os.path.exists("/tmp/stop"):
        try:
            with open(path, "w") as f:
                f.write(text + "\n")
        except OSError:
            pass
        n += 1
print("swaps=%d" % n, flush=True)
print("repairs=%d" % repairs, flush=True)
"#;

struct Night {
    state: State,
    repo: tempfile::TempDir,
    _remote: tempfile::TempDir,
}

fn setup() -> Night {
    let state = State::new();
    let repo = make_repo();
    let remote = tempfile::tempdir().unwrap();
    let bare = remote.path().join("origin.git");
    git(
        remote.path(),
        &["init", "-q", "--bare", bare.to_str().unwrap()],
    );
    let token = state.path().join("forge.token");
    std::fs::write(&token, "unused").unwrap();
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"file://{}\"\nreaders = \"private\"\n\n\
             [forges.forge]\napi = \"http://127.0.0.1:9\"\nrepo = \"o/n\"\nremote = \"origin\"\ntoken_file = \"{}\"\nreaders = \"private\"\n",
            bare.display(),
            token.display()
        ),
    )
    .unwrap();
    Night {
        state,
        repo,
        _remote: remote,
    }
}

/// The agent's script with the helpers written first.
fn script(body: &str) -> String {
    format!(
        "set -u\ncat > /tmp/door.py <<'PY'\n{DOOR_PY}\nPY\ncat > /tmp/swap.py <<'PY'\n{SWAP_PY}\nPY\n{body}"
    )
}

fn start_run(n: &Night, body: &str) -> Child {
    n.state
        .cmd()
        .args([
            "run",
            "--repo",
            n.repo.path().to_str().unwrap(),
            "--image",
            &image(),
            // Room for the 10 GB sparse file (the file-size limit and the
            // worktree cap follow this cap).
            "--max-worktree",
            "16g",
            "--",
            "bash",
            "-c",
            &script(body),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting nightshift run")
}

/// Waits for the run to end (at most 10 minutes: a supervisor that never
/// exits is killed and the test fails), and returns the agent's output.
fn finish(n: &Night, mut child: Child) -> String {
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "nightshift run never ended: {}{}",
                stdout(&out),
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    let runs = n.state.runs();
    let id = runs.last().unwrap()["id"].as_str().unwrap().to_string();
    let log = n.state.output_log(&id);
    assert!(
        out.status.success(),
        "agent run failed: {}{}\n{log}",
        stdout(&out),
        stderr(&out)
    );
    assert!(n.state.containers().is_empty());
    log
}

fn run_agent(n: &Night, body: &str) -> String {
    let child = start_run(n, body);
    finish(n, child)
}

fn queue(n: &Night) -> Vec<serde_json::Value> {
    let out = n.state.run(&["queue", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The values of `key=` lines of the agent's output.
fn lines<'a>(log: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}=");
    log.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect()
}

/// No reply the agent printed holds a host path of the supervisor's.
fn assert_no_host_paths(n: &Night, log: &str) {
    for hidden in [n.state.path(), n.repo.path()] {
        let hidden = hidden.to_str().unwrap();
        assert!(
            !log.contains(hidden),
            "a reply holds the host path {hidden}: {log}"
        );
    }
}

fn door_audits(n: &Night, verdict: &str, door: &str) -> i64 {
    let db = rusqlite::Connection::open(n.state.path().join("state.db")).unwrap();
    db.query_row(
        &format!(
            "SELECT count(*) FROM audit WHERE kind = 'door_request' AND body LIKE '%\"verdict\":\"{verdict}\"%' AND body LIKE '%\"door\":\"{door}\"%'"
        ),
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// The agent's commit, packed before any swap starts, in `/tmp/pack`.
const COMMIT_AND_PACK: &str = r#"
base=${NIGHTSHIFT_BASE_COMMIT:-$(git rev-list --max-parents=0 HEAD)}
echo work > work.txt && git add work.txt && git commit -qm work
c=$(git rev-parse HEAD)
printf '%s\n^%s\n' "$c" "$base" | git pack-objects --stdout --revs -q > /tmp/pack
"#;

#[test]
fn a_fanout_directory_swapped_for_a_symlink_deletes_nothing_on_the_host() {
    let n = setup();
    let decoy = tempfile::tempdir().unwrap();
    let d = decoy.path();
    std::fs::write(d.join("keep.txt"), "keep\n").unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    std::fs::write(d.join("sub/inner.txt"), "inner\n").unwrap();
    nix::unistd::mkfifo(
        &d.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();
    // An oversized file too: a sweep deletes "too large" loose objects.
    std::fs::File::create(d.join("big"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let before = tree_of(d);

    let log = run_agent(
        &n,
        &format!(
            r#"{COMMIT_AND_PACK}
fan=.git/objects/${{c:0:2}}
python3 /tmp/swap.py dir "$fan" .git/objects/swap-link {decoy} &
python3 - <<PY
import sys; sys.path.insert(0, "/tmp")
from door import *
pack = open("/tmp/pack", "rb").read()
for i in range(40):
    print("reply=" + push("$c", "refs/heads/agent/r%d" % i, pack))
    print("reply=" + push("$c", "refs/heads/agent/v%d" % i, v=1))
    print("reply=" + push(ZERO, "refs/heads/agent/d%d" % i, delete=True))
    for j in range(8):
        print("reply=" + push(ZERO, "refs/heads/agent/z%d" % i, v=1))
PY
touch /tmp/stop; wait
nightshift-act push origin HEAD:agent/after; echo "after=$?"
"#,
            decoy = d.display()
        ),
    );
    assert_eq!(
        tree_of(d),
        before,
        "the decoy host directory changed: {log}"
    );
    let swaps: Vec<&str> = lines(&log, "swaps");
    assert!(
        swaps.first().and_then(|s| s.parse::<u64>().ok()) > Some(100),
        "the agent did not race: {log}"
    );
    let replies = lines(&log, "reply");
    assert_eq!(replies.len(), 440, "{log}");
    assert!(replies.iter().all(|r| r.contains("\"verdict\"")), "{log}");
    assert_eq!(lines(&log, "after"), ["0"], "{log}");
    assert_no_host_paths(&n, &log);
    assert!(n.state.verify().status.success());
}

/// Nothing the agent's racing script kept in its tree was removed by
/// anyone else while it ran (the host never deletes in a live worktree).
fn assert_nothing_repaired(log: &str) {
    let repairs = lines(log, "repairs");
    assert!(!repairs.is_empty(), "{log}");
    assert!(
        repairs.iter().all(|r| *r == "0"),
        "something deleted files in the live worktree: {log}"
    );
}

/// Every entry below `dir` with its kind and size, never following links.
fn tree_of(dir: &Path) -> Vec<(String, String, u64)> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            let t = meta.file_type();
            let kind = if t.is_dir() {
                stack.push(entry.path());
                "dir"
            } else if t.is_fifo() {
                "fifo"
            } else if t.is_socket() {
                "socket"
            } else if t.is_symlink() {
                "symlink"
            } else {
                "file"
            };
            let rel = entry
                .path()
                .strip_prefix(dir)
                .unwrap()
                .display()
                .to_string();
            out.push((
                rel,
                kind.to_string(),
                if t.is_file() { meta.len() } else { 0 },
            ));
        }
    }
    out.sort();
    out
}

/// The `VmHWM` (peak resident memory) of a process, in KiB.
fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[test]
fn a_fifo_or_a_sparse_10gb_file_for_a_loose_object_neither_blocks_nor_bloats_the_door() {
    let n = setup();
    let child = start_run(
        &n,
        r#"base=${NIGHTSHIFT_BASE_COMMIT:-$(git rev-list --max-parents=0 HEAD)}
for i in $(seq 1 15); do
  # A new blob each time, on the base, so that the host never holds it
  # already and no earlier attempt's trouble carries over.
  git checkout -q -B "it$i" "$base"
  head -c 100000 /dev/urandom | base64 > data.txt && git add data.txt && git commit -qm "data $i"
  c=$(git rev-parse HEAD)
  printf '%s\n^%s\n' "$c" "$base" | git pack-objects --stdout --revs -q > /tmp/pack
  blob=$(git rev-parse HEAD:data.txt)
  obj=.git/objects/${blob:0:2}/${blob:2}
  cp -f "$obj" .git/ns-backup
  rm -f /tmp/stop /tmp/swapping
  python3 /tmp/swap.py object "$obj" .git/ns-fifo .git/ns-big .git/ns-backup | grep repairs= &
  # The requests start once the swaps have.
  while [ ! -e /tmp/swapping ]; do sleep 0.01; done
  python3 - <<PY
import sys; sys.path.insert(0, "/tmp")
from door import *
pack = open("/tmp/pack", "rb").read()
for v in (2, 1, 2, 1):
    r = push("$c", "refs/heads/agent/m$i", pack, v=v)
    print("reply=" + r)
    if r in ("timeout", "noanswer"):
        open("/tmp/gave-up", "w").close()
        break
PY
  touch /tmp/stop; wait
  [ -e /tmp/gave-up ] && break
done
echo pushes-done
# Held until the test has read the supervisor's peak memory.
while [ ! -e release ]; do sleep 0.2; done
# The run's result is made from the worktree alone (the end-of-run packer):
# the last object swapped is put back whole, so the run ends whole.
rm -f "$obj" && cp .git/ns-backup "$obj"
rm -f release .git/ns-fifo .git/ns-big .git/ns-backup
"#,
    );
    let pid = child.id();
    // Wait (bounded) for the agent to finish its requests, then read the
    // supervisor's peak resident memory while it still runs.
    let started = Instant::now();
    let worktree = loop {
        let runs = n.state.runs();
        if let Some(id) = runs.last().and_then(|r| r["id"].as_str()) {
            if n.state.output_log(id).contains("pushes-done") {
                break n.state.path().join("worktrees").join(id);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the agent never finished its requests"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let peak = peak_kib(pid).expect("the supervisor's /proc status");
    std::fs::write(worktree.join("release"), "").unwrap();
    let log = finish(&n, child);
    let replies = lines(&log, "reply");
    assert!(
        !replies.iter().any(|r| *r == "timeout" || *r == "noanswer"),
        "the door did not answer in time: {log}"
    );
    assert!(
        peak < 512 * 1024,
        "the supervisor's peak resident memory was {peak} KiB: {log}"
    );
    assert_eq!(replies.len(), 60, "{log}");
    assert_nothing_repaired(&log);
    eprintln!("supervisor peak resident memory: {peak} KiB");
    assert_no_host_paths(&n, &log);
}

#[test]
fn alternates_rewritten_in_a_loop_never_let_a_foreign_commit_in() {
    let n = setup();
    let secret = make_repo();
    std::fs::write(secret.path().join("secret.txt"), "PRIVATE-HOST-CONTENT\n").unwrap();
    git(secret.path(), &["add", "-A"]);
    git(secret.path(), &["commit", "-qm", "secret"]);
    let secret_commit = git(secret.path(), &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    let objects = secret.path().join(".git/objects");
    let log = run_agent(
        &n,
        &format!(
            r#"{COMMIT_AND_PACK}
mkdir -p .git/objects/info
python3 /tmp/swap.py file .git/objects/info/alternates {objects} &
python3 - <<PY
import sys; sys.path.insert(0, "/tmp")
from door import *
pack = open("/tmp/pack", "rb").read()
for i in range(40):
    print("reply=" + push("{secret_commit}", "refs/heads/agent/s%d" % i))
    print("reply=" + push("{secret_commit}", "refs/heads/agent/p%d" % i, pack))
    print("reply=" + push("{secret_commit}", "refs/heads/agent/o%d" % i, v=1))
PY
touch /tmp/stop; wait
rm -f .git/objects/info/alternates
nightshift-act push origin agent/x --commit {secret_commit}; echo "client=$?"
"#,
            objects = objects.display()
        ),
    );
    assert!(!lines(&log, "swaps").is_empty(), "{log}");
    let replies = lines(&log, "reply");
    assert_eq!(replies.len(), 120, "{log}");
    assert!(
        replies.iter().all(|r| r.contains("\"error\"")),
        "a foreign commit was not refused: {log}"
    );
    assert!(
        replies
            .iter()
            .any(|r| r.contains(&format!("commit {secret_commit} is not connected"))),
        "{log}"
    );
    assert_ne!(lines(&log, "client"), ["0"], "{log}");
    assert!(queue(&n).is_empty(), "{:?}", queue(&n));
    let dump = Command::new("git")
        .arg("-C")
        .arg(n.repo.path())
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&dump.stdout).contains("PRIVATE-HOST-CONTENT"));
    assert_no_host_paths(&n, &log);
    assert!(n.state.verify().status.success());
}

#[test]
fn a_pull_requests_head_tells_nothing_about_host_files() {
    let n = setup();
    let base = git(n.repo.path(), &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    // A host directory whose file `present` holds a commit id the host has:
    // a lookup that followed `.git/refs/heads` there would find a branch.
    let decoy = tempfile::tempdir().unwrap();
    std::fs::write(decoy.path().join("present"), format!("{base}\n")).unwrap();
    let log = run_agent(
        &n,
        &format!(
            r#"base=${{NIGHTSHIFT_BASE_COMMIT:-$(git rev-list --max-parents=0 HEAD)}}
mkdir -p .git/refs/heads
python3 /tmp/swap.py dir .git/refs/heads .git/refs/swap-link {decoy} &
python3 - <<PY
import sys; sys.path.insert(0, "/tmp")
from door import *
for i in range(60):
    for name in ("present", "absent"):
        print("reply-%s=%s" % (name, pr("refs/heads/" + name, "$base", v=1)))
        print("reply2-%s=%s" % (name, pr("refs/heads/" + name, "$base")))
PY
touch /tmp/stop; wait
"#,
            decoy = decoy.path().display()
        ),
    );
    // Replies with the name and act id taken out: the same set either way.
    let normalized = |key: &str, name: &str| {
        let mut set: Vec<String> = lines(&log, key)
            .iter()
            .map(|r| {
                let r = r.replace(name, "NAME");
                match r.find("\"act\":\"") {
                    Some(at) => r[..at].to_string(),
                    None => r,
                }
            })
            .collect();
        set.sort();
        set.dedup();
        set
    };
    for key in ["reply", "reply2"] {
        let present = normalized(&format!("{key}-present"), "present");
        let absent = normalized(&format!("{key}-absent"), "absent");
        assert!(!present.is_empty(), "{log}");
        assert_eq!(present, absent, "the answer depends on a host file: {log}");
    }
    assert!(!lines(&log, "swaps").is_empty(), "{log}");
    assert_no_host_paths(&n, &log);
}

#[test]
fn oversized_truncated_and_unconnected_packs_are_refused_and_audited() {
    let n = setup();
    let log = run_agent(
        &n,
        r#"echo a > a.txt && git add a.txt && git commit -qm a && a=$(git rev-parse HEAD)
echo b > b.txt && git add b.txt && git commit -qm b && b=$(git rev-parse HEAD)
# Only b's own objects: a, which the host lacks, is left out.
printf '%s\n^%s\n' "$b" "$a" | git pack-objects --stdout --revs -q > /tmp/thin
printf '%s\n^%s\n' "$b" "${NIGHTSHIFT_BASE_COMMIT:-$(git rev-list --max-parents=0 HEAD)}" | git pack-objects --stdout --revs -q > /tmp/full
python3 - <<PY
import sys; sys.path.insert(0, "/tmp")
from door import *
full = open("/tmp/full", "rb").read()
req = {"door": "push", "remote": "origin", "dst_ref": "refs/heads/agent/x", "claimed_commit": "$b",
       "force": False, "delete": False}
print("oversized=" + send(dict(req, pack_bytes=600 << 20)))
print("truncated=" + send(dict(req, pack_bytes=len(full)), pack=full, cut=len(full) // 2))
print("unconnected=" + push("$b", "refs/heads/agent/x", open("/tmp/thin", "rb").read()))
print("nopack=" + push("$b", "refs/heads/agent/x"))
print("garbage=" + send(dict(req, pack_bytes=64), pack=b"PACK" + b"\0" * 60))
PY
NIGHTSHIFT_BASE_COMMIT=$a nightshift-act push origin HEAD:agent/y 2>&1; echo "client=$?"
# The objects directory gone: nothing on the host looks at it.
mv .git/objects .git/objects-away && ln -s /nonexistent .git/objects
python3 -c 'import sys; sys.path.insert(0, "/tmp"); from door import *; print("away=" + push("'$b'", "refs/heads/agent/z"))'
rm .git/objects && mv .git/objects-away .git/objects
nightshift-act push origin HEAD:agent/ok; echo "ok=$?"
"#,
    );
    let one = |key: &str| {
        lines(&log, key)
            .first()
            .copied()
            .unwrap_or("<missing>")
            .to_string()
    };
    for (key, expected) in [
        (
            "oversized",
            "a pack of 629145600 bytes is over the limit of 536870912 bytes",
        ),
        ("truncated", "the pack was cut short"),
        ("unconnected", "is not connected"),
        ("nopack", "is not connected"),
        ("garbage", "is not a valid git pack"),
        ("away", "is not connected"),
    ] {
        let reply = one(key);
        assert!(
            reply.contains("\"error\"") && reply.contains(expected),
            "{key}: {reply}\n{log}"
        );
    }
    assert!(log.contains("is not connected"), "{log}");
    assert_eq!(lines(&log, "client"), ["4"], "{log}");
    assert_eq!(lines(&log, "ok"), ["0"], "{log}");
    // Only the last, good push is queued; every refusal is audited.
    let q = queue(&n);
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(door_audits(&n, "error", "push") >= 6, "{log}");
    // The oversized one was refused from the request alone, as it decoded.
    assert!(door_audits(&n, "error", "unknown") >= 1, "{log}");
    assert_no_host_paths(&n, &log);
    assert!(n.state.verify().status.success());
}
