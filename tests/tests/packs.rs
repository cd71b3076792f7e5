//! Packs an agent sends over the door, attacked from inside a real sandbox:
//! delta bombs cost the supervisor nothing (refused from the pack's headers
//! before anything is inflated; the run goes on), a pushed commit builds
//! only on what the run was given (a merge naming a commit of the host's
//! alone is refused exactly as an id nobody has), and `queue show` lists
//! every commit an act would publish that the destination lacks.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use tests::browser::{add_accounts, Client, Serve, OWNER, OWNER_PASSWORD};
use tests::{git, image, make_repo, stderr, stdout, State, DOOR_PY};

/// `/tmp/bomb.py`: `bomb(copies)` is a valid, self-contained pack of a
/// 64 KiB zero blob and a delta on it that copies it `copies` times (each
/// copy instruction is one byte: offset 0, size 0x10000).
const BOMB_PY: &str = r#"
import hashlib, struct, zlib
def hdr(kind, size):
    out = bytearray()
    c = (kind << 4) | (size & 15)
    size >>= 4
    while size:
        out.append(c | 0x80)
        c = size & 0x7f
        size >>= 7
    out.append(c)
    return bytes(out)
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
def bomb(copies):
    base = b"\0" * 65536
    bid = hashlib.sha1(b"blob 65536\0" + base).digest()
    delta = varint(65536) + varint(copies << 16) + b"\x80" * copies
    body = (b"PACK" + struct.pack(">II", 2, 2)
            + hdr(3, len(base)) + zlib.compress(base, 9)
            + hdr(7, len(delta)) + bid + zlib.compress(delta, 9))
    return body + hashlib.sha1(body).digest()
"#;

struct Night {
    state: State,
    repo: tempfile::TempDir,
    _remote: tempfile::TempDir,
    bare: std::path::PathBuf,
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
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"file://{}\"\nreaders = \"private\"\n",
            bare.display(),
        ),
    )
    .unwrap();
    Night {
        state,
        repo,
        _remote: remote,
        bare,
    }
}

fn script(body: &str) -> String {
    format!(
        "set -u\ncat > /tmp/door.py <<'PY'\n{DOOR_PY}\nPY\ncat > /tmp/bomb.py <<'PY'\n{BOMB_PY}\nPY\n{body}"
    )
}

fn start_run(n: &Night, base_ref: &str, body: &str) -> Child {
    n.state
        .cmd()
        .args([
            "run",
            "--repo",
            n.repo.path().to_str().unwrap(),
            "--ref",
            base_ref,
            "--image",
            &image(),
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

/// Waits (at most 10 minutes) for the run to end; returns the agent's output.
fn finish(n: &Night, mut child: Child) -> String {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
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
    let log = n.state.output_log(&run_id(n));
    assert!(
        out.status.success(),
        "the run failed: {}{}\n{log}",
        stdout(&out),
        stderr(&out)
    );
    assert!(n.state.containers().is_empty());
    log
}

fn run_id(n: &Night) -> String {
    n.state.runs().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Waits (bounded) until the agent printed `mark`; returns the worktree.
fn wait_for(n: &Night, mark: &str) -> std::path::PathBuf {
    let started = Instant::now();
    loop {
        if let Some(id) = n.state.runs().last().and_then(|r| r["id"].as_str()) {
            if n.state.output_log(id).lines().any(|l| l == mark) {
                return n.state.path().join("worktrees").join(id);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the agent never printed {mark}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn queue(n: &Night) -> Vec<serde_json::Value> {
    let out = n.state.run(&["queue", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The value of the first `key=` line of the agent's output.
fn value(log: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    log.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or("<missing>")
        .to_string()
}

/// The `VmHWM` (peak resident memory) of a process, in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// The door requests of `door` audited with `verdict`.
fn door_audits(n: &Night, verdict: &str, door: &str) -> usize {
    n.state
        .audit_bodies("door_request")
        .iter()
        .filter(|b| b["verdict"] == verdict && b["door"] == door)
        .count()
}

/// How much the supervisor's peak resident memory may grow over its figure
/// before the hostile packs.
const PEAK_BOUND_KIB: u64 = 100 * 1024;

/// The 256 MiB and 1 GiB delta bombs (a 64 KiB zero blob and a delta of a
/// few KiB re-creating it 4096 and 16384 times, valid packs of under
/// 64 KiB) are refused from their headers: the supervisor's peak resident
/// memory grows by less than 100 MiB over its figure before them, each
/// refusal is audited, and the run goes on (a push after them is queued).
#[test]
fn delta_bombs_are_refused_before_inflating_and_the_run_goes_on() {
    let n = setup();
    let child = start_run(
        &n,
        "HEAD",
        r#"base=${NIGHTSHIFT_BASE_COMMIT:-$(git rev-list --max-parents=0 HEAD)}
echo ready
while [ ! -e go ]; do sleep 0.2; done
python3 - <<PY
import sys; sys.path.insert(0, "/tmp")
from door import push
from bomb import bomb
for name, copies in (("256m", 4096), ("1g", 16384)):
    p = bomb(copies)
    print("size_%s=%d" % (name, len(p)))
    print("bomb_%s=%s" % (name, push("$base", "refs/heads/agent/bomb-" + name, p)))
PY
echo after > after.txt && git add after.txt && git commit -qm after
nightshift-act push origin HEAD:agent/after; echo "after=$?"
echo bombs-done
while [ ! -e release ]; do sleep 0.2; done
rm -f go release
"#,
    );
    let pid = child.id();
    let worktree = wait_for(&n, "ready");
    let idle = peak_kib(pid);
    std::fs::write(worktree.join("go"), "").unwrap();
    wait_for(&n, "bombs-done");
    let peak = peak_kib(pid);
    std::fs::write(worktree.join("release"), "").unwrap();
    let log = finish(&n, child);
    eprintln!(
        "supervisor VmHWM: {idle} KiB before the bombs, {peak} KiB after (+{} KiB)",
        peak - idle
    );
    for (name, size) in [("256m", "268435456"), ("1g", "1073741824")] {
        let pack: u64 = value(&log, &format!("size_{name}")).parse().unwrap();
        assert!(pack < 64 << 10, "the {name} bomb is {pack} bytes");
        let reply = value(&log, &format!("bomb_{name}"));
        assert!(
            reply.contains("\"error\"")
                && reply.contains("refused before it was indexed")
                && reply.contains(&format!("would make an object of {size} bytes")),
            "{name}: {reply}\n{log}"
        );
    }
    assert!(
        peak - idle < PEAK_BOUND_KIB,
        "the supervisor's peak grew by {} KiB (from {idle} to {peak}) over the bombs",
        peak - idle
    );
    assert_eq!(value(&log, "after"), "0", "{log}");
    let q = queue(&n);
    assert_eq!(q.len(), 1, "only the push after the bombs is queued: {q:?}");
    assert!(q[0].to_string().contains("refs/heads/agent/after"), "{q:?}");
    assert!(door_audits(&n, "error", "push") >= 2, "{log}");
    assert!(n.state.verify().status.success());
}

/// A local-only branch of the host holds `creds.env`; one of its commits
/// was cherry-picked onto main with `-x`, so the run's history names it.
/// The agent reads that id and pushes a merge whose second parent is it:
/// refused, nothing queued, nothing of the branch leaves. The same merge
/// on an id nobody has gets the same reply, word for word but the ids.
#[test]
fn a_merge_onto_a_host_only_commit_is_refused_as_an_unknown_id_is() {
    let n = setup();
    let repo = n.repo.path();
    git(repo, &["checkout", "-q", "-b", "local-only"]);
    std::fs::write(repo.join("creds.env"), "TOKEN=host-only-secret\n").unwrap();
    git(repo, &["add", "creds.env"]);
    git(repo, &["commit", "-qm", "creds"]);
    std::fs::write(repo.join("note.txt"), "a note\n").unwrap();
    git(repo, &["add", "note.txt"]);
    git(repo, &["commit", "-qm", "note"]);
    let secret = git(repo, &["rev-parse", "HEAD"]).trim().to_string();
    git(repo, &["checkout", "-q", "main"]);
    git(repo, &["cherry-pick", "-x", &secret]);
    let log = finish(
        &n,
        start_run(
            &n,
            "main",
            r#"sec=$(git log --format=%B | sed -n 's/.*cherry picked from commit \([0-9a-f]\{40\}\).*/\1/p' | head -1)
echo "sec=$sec"
for p in $sec 3b18e512dba79e4c8300dd08aeb37f8e728b8dad; do
  m=$(printf 'tree %s\nparent %s\nparent %s\nauthor a <a@b> 1 +0000\ncommitter a <a@b> 1 +0000\n\nmerge\n' \
      "$(git rev-parse 'HEAD^{tree}')" "$(git rev-parse HEAD)" "$p" | git hash-object -t commit -w --stdin --literally)
  echo "merge_$p=$m"
  echo "$m" | git pack-objects --stdout -q > /tmp/m.pack
  python3 -c 'import sys; sys.path.insert(0, "/tmp"); from door import push; print("reply_'"$p"'=" + push("'"$m"'", "refs/heads/main", open("/tmp/m.pack", "rb").read()))'
done
"#,
        ),
    );
    assert_eq!(value(&log, "sec"), secret, "{log}");
    let random = "3b18e512dba79e4c8300dd08aeb37f8e728b8dad";
    let mut replies = Vec::new();
    for parent in [secret.as_str(), random] {
        let merge = value(&log, &format!("merge_{parent}"));
        let reply = value(&log, &format!("reply_{parent}"));
        assert!(
            reply.contains("\"error\"") && reply.contains("is not connected"),
            "the merge onto {parent} was not refused: {reply}\n{log}"
        );
        replies.push(reply.replace(&merge, "MERGE").replace(parent, "PARENT"));
    }
    assert_eq!(
        replies[0], replies[1],
        "the replies tell a host-only commit from an unknown id"
    );
    assert!(queue(&n).is_empty());
    let acts = git(repo, &["for-each-ref", "refs/nightshift/acts"]);
    assert_eq!(acts.trim(), "", "an act's ref was made");
    let dump = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&n.bare)
        .args(["cat-file", "--batch-all-objects", "--batch-check"])
        .output()
        .unwrap();
    assert!(dump.stdout.is_empty(), "the destination gained objects");
    assert_eq!(door_audits(&n, "error", "push"), 2);
    assert!(n.state.verify().status.success());
}

/// The run is based on a local branch two commits ahead of what origin
/// holds; the agent pushes one commit on top to origin's main. `queue
/// show` lists all three commits the push would publish (not only the
/// agent's, after the run's base), and not the one origin already holds.
#[test]
fn queue_show_lists_every_commit_an_act_would_publish() {
    let n = setup();
    let repo = n.repo.path();
    git(
        repo,
        &[
            "push",
            "-q",
            &format!("file://{}", n.bare.display()),
            "main",
        ],
    );
    git(repo, &["checkout", "-q", "-b", "feature"]);
    for i in 1..=2 {
        std::fs::write(repo.join(format!("local{i}.txt")), "local\n").unwrap();
        git(repo, &["add", "-A"]);
        git(
            repo,
            &["commit", "-qm", &format!("local: never published {i}")],
        );
    }
    git(repo, &["checkout", "-q", "main"]);
    let log = finish(
        &n,
        start_run(
            &n,
            "feature",
            r#"echo work > work.txt && git add work.txt && git commit -qm "agent: work"
nightshift-act push origin HEAD:main; echo "push=$?"
"#,
        ),
    );
    assert_eq!(value(&log, "push"), "0", "{log}");
    let q = queue(&n);
    assert_eq!(q.len(), 1, "{q:?}");
    let act = q[0]["act"]["id"].as_str().unwrap();
    let out = n.state.run(&["queue", "show", act]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout(&out);
    assert!(shown.contains("commits it would publish (3, "), "{shown}");
    for subject in [
        "agent: work",
        "local: never published 1",
        "local: never published 2",
    ] {
        assert!(
            shown.contains(&format!("    {subject}\n")),
            "{subject} not listed: {shown}"
        );
    }
    assert!(
        !shown.contains("    initial\n"),
        "a commit origin holds is listed: {shown}"
    );
    // The dashboard's Queue page lists the same commits.
    assert!(n.state.run(&["owner", "init"]).status.success());
    add_accounts(&n.state);
    let serve = Serve::start(&n.state, &[]);
    let page = Client::login(&serve, OWNER, OWNER_PASSWORD).get("/queue");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("commits it would publish (3, "),
        "{}",
        page.body
    );
    for subject in [
        "agent: work",
        "local: never published 1",
        "local: never published 2",
    ] {
        assert!(page.body.contains(subject), "{subject}: {}", page.body);
    }
    assert!(!page.body.contains("    initial\n"), "{}", page.body);
}

/// `/tmp/plant.py`: writes into the worktree's `.git/objects/pack` a pack
/// and its index holding a 64 KiB zero blob, a delta re-creating it 16384
/// times (1 GiB) and a 10-byte offset delta on that 1 GiB result; prints
/// the 10-byte blob's id.
const PLANT_PY: &str = r#"
import hashlib, struct, zlib, sys
sys.path.insert(0, "/tmp")
from bomb import hdr, varint
def sha_of(kind, size, chunks):
    h = hashlib.sha1(b"%s %d\0" % (kind, size))
    for c in chunks:
        h.update(c)
    return h.digest()
base = b"\0" * 65536
copies = 16384
base_id = hashlib.sha1(b"blob 65536\0" + base).digest()
big = copies << 16
big_id = sha_of(b"blob", big, (base for _ in range(copies)))
small_id = hashlib.sha1(b"blob 10\0" + b"\0" * 10).digest()
objs = []
o1 = hdr(3, len(base)) + zlib.compress(base, 9)
d2 = varint(65536) + varint(big) + b"\x80" * copies
o2 = hdr(7, len(d2)) + base_id + zlib.compress(d2, 9)
off1 = 12
off2 = off1 + len(o1)
off3 = off2 + len(o2)
d3 = varint(big) + varint(10) + b"\x90\x0a"
back = off3 - off2
enc = [back & 0x7f]
back >>= 7
while back:
    back -= 1
    enc.append(0x80 | (back & 0x7f))
    back >>= 7
o3 = hdr(6, len(d3)) + bytes(reversed(enc)) + zlib.compress(d3, 9)
body = b"PACK" + struct.pack(">II", 2, 3) + o1 + o2 + o3
pack = body + hashlib.sha1(body).digest()
entries = sorted([(base_id, off1, zlib.crc32(o1)), (big_id, off2, zlib.crc32(o2)), (small_id, off3, zlib.crc32(o3))])
idx = b"\xfftOc" + struct.pack(">I", 2)
for i in range(256):
    idx += struct.pack(">I", sum(1 for e in entries if e[0][0] <= i))
for e in entries:
    idx += e[0]
for e in entries:
    idx += struct.pack(">I", e[2] & 0xffffffff)
for e in entries:
    idx += struct.pack(">I", e[1])
idx += pack[-20:]
idx += hashlib.sha1(idx).digest()
name = pack[-20:].hex()
open(".git/objects/pack/pack-%s.pack" % name, "wb").write(pack)
open(".git/objects/pack/pack-%s.idx" % name, "wb").write(idx)
print(small_id.hex())
"#;

/// The agent plants a delta bomb in its own `.git/objects/pack` (a pack
/// with its index: a 10-byte blob that is a delta on a 1 GiB delta result)
/// and commits a tree naming the 10-byte blob. At import the pack is found
/// over the limits and removed before anything reads it: the history is
/// dropped (the working files still come back), and the supervisor's peak
/// resident memory over the whole run stays under its bound.
#[test]
fn a_delta_bomb_planted_in_the_worktree_is_removed_before_the_import_reads_it() {
    let n = setup();
    let time_out = n.state.path().join("maxrss");
    let out = std::process::Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&time_out)
        .arg(tests::nightshift_bin())
        .env("NIGHTSHIFT_STATE_DIR", n.state.path())
        .args([
            "run",
            "--repo",
            n.repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "bash",
            "-c",
            &script(&format!(
                r#"cat > /tmp/plant.py <<'PY'
{PLANT_PY}
PY
small=$(python3 /tmp/plant.py)
echo "small=$small"
git update-index --add --cacheinfo "100644,$small,small.bin"
t=$(git write-tree)
c=$(git commit-tree "$t" -p HEAD -m bomb)
git update-ref HEAD "$c"
echo "committed=$c"
echo kept > kept.txt
"#
            )),
        ])
        .output()
        .unwrap();
    let log = n.state.output_log(&run_id(&n));
    // GNU time writes "Command exited with non-zero status 10" first.
    let maxrss: u64 = std::fs::read_to_string(&time_out)
        .unwrap()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("the peak resident memory from /usr/bin/time");
    eprintln!("supervisor peak resident memory over the run: {maxrss} KiB");
    // Exit 10: the run's history was dropped, its files imported.
    assert_eq!(
        out.status.code(),
        Some(10),
        "{}{}\n{log}",
        stdout(&out),
        stderr(&out)
    );
    assert!(value(&log, "committed").len() == 40, "{log}");
    let run = n.state.runs().last().unwrap().clone();
    let imported = n
        .state
        .audit_bodies("observed_state")
        .last()
        .cloned()
        .unwrap();
    let text = imported.to_string();
    assert!(
        text.contains("a pack over the import limits"),
        "the planted pack was not removed and listed: {text}"
    );
    eprintln!("{text}");
    assert!(
        maxrss < IMPORT_PEAK_BOUND_KIB,
        "the supervisor's peak resident memory was {maxrss} KiB"
    );
    // The working files still came back.
    let result = run["result_ref"].as_str().unwrap_or("").to_string();
    let shown = git(n.repo.path(), &["show", &format!("{result}:kept.txt")]);
    assert_eq!(shown.trim(), "kept");
}

/// The supervisor's peak over a whole run: its idle figure (about 50 MiB
/// here) and 100 MiB.
const IMPORT_PEAK_BOUND_KIB: u64 = 150 * 1024;
