//! The real clients (built by cargo for this test) against a tiny door: a
//! std Unix-socket server on a thread that reads with the crate's
//! [`RequestReader`] and answers canned responses; and the git remote
//! helper driven by a real `git push`.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use sandbox_image_door::{encode_response, Request, RequestReader, Response};

const ACT: &str = env!("CARGO_BIN_EXE_nightshift-act");
const HELPER: &str = env!("CARGO_BIN_EXE_git-remote-nightshift");
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// How the test door behaves on each connection.
#[derive(Clone, Copy)]
enum Mode {
    /// Read the request and answer with [`canned`].
    Canned,
    /// Accept and never answer.
    Silent,
    /// Answer with a header declaring 1 GiB.
    OversizedAnswer,
}

/// The canned policy: pushes to main are refused, `done-*` branches are
/// done, a notify to `broken` is an error, everything else is queued.
fn canned(request: &Request) -> Response {
    match request {
        Request::Push { delete: true, .. } => Response::Refused {
            rule: "nightshift:delete".into(),
            reason: "deleting is not carried out".into(),
        },
        Request::Push { dst_ref, .. } if dst_ref == "refs/heads/main" => Response::Refused {
            rule: "r-main".into(),
            reason: "pushes to main need a person".into(),
        },
        Request::Push { dst_ref, .. } if dst_ref.starts_with("refs/heads/done-") => {
            Response::Done {
                detail: String::new(),
            }
        }
        Request::Notify { destination, .. } if destination == "broken" => Response::Error {
            reason: "endpoint broken is not configured".into(),
        },
        _ => Response::Queued { act: "A1".into() },
    }
}

struct TestDoor {
    _dir: tempfile::TempDir,
    path: PathBuf,
    /// Every request decoded, or the error it was refused with.
    seen: Arc<Mutex<Vec<Result<Request, String>>>>,
    /// The pack that followed each request that declared one.
    packs: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl TestDoor {
    fn start(mode: Mode) -> TestDoor {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("door.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let packs = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, packs, stop) = (seen.clone(), packs.clone(), stop.clone());
            thread::spawn(move || {
                let mut held = Vec::new();
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let mut conn = conn.unwrap();
                    match mode {
                        Mode::Silent => held.push(conn),
                        Mode::OversizedAnswer => {
                            let _ = conn.write_all(&(1u32 << 30).to_be_bytes());
                        }
                        Mode::Canned => serve_one(&mut conn, &seen, &packs),
                    }
                }
            })
        };
        TestDoor {
            _dir: dir,
            path,
            seen,
            packs,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Result<Request, String>> {
        self.seen.lock().unwrap().clone()
    }

    fn packs(&self) -> Vec<Vec<u8>> {
        self.packs.lock().unwrap().clone()
    }
}

impl Drop for TestDoor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One connection, as the supervisor's adapter will serve it: read at most
/// what the reader wants, then exactly the pack the request declares,
/// answer once.
fn serve_one(
    conn: &mut UnixStream,
    seen: &Mutex<Vec<Result<Request, String>>>,
    packs: &Mutex<Vec<Vec<u8>>>,
) {
    let mut reader = RequestReader::new();
    let response = loop {
        let mut buf = vec![0u8; reader.wanted()];
        let n = match conn.read(&mut buf) {
            Ok(0) | Err(_) => {
                seen.lock().unwrap().push(Err(reader.closed().to_string()));
                return;
            }
            Ok(n) => n,
        };
        match reader.feed(&buf[..n]) {
            Ok(None) => continue,
            Ok(Some(request)) => {
                if request.pack_bytes() > 0 {
                    let mut pack = vec![0u8; request.pack_bytes() as usize];
                    if conn.read_exact(&mut pack).is_err() {
                        seen.lock().unwrap().push(Err("pack cut short".into()));
                        return;
                    }
                    packs.lock().unwrap().push(pack);
                }
                let response = canned(&request);
                seen.lock().unwrap().push(Ok(request));
                break response;
            }
            Err(e) => {
                seen.lock().unwrap().push(Err(e.to_string()));
                break Response::for_error(&e);
            }
        }
    };
    let _ = conn.write_all(&encode_response(&response));
}

fn act(door: &Path, args: &[&str], stdin: &str, cwd: Option<&Path>) -> Output {
    let mut command = Command::new(ACT);
    command
        .args(args)
        .env("NIGHTSHIFT_DOOR", door)
        .env_remove("NIGHTSHIFT_DOOR_TIMEOUT_SECS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let mut child = command.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The one push request the door saw, with its pack length checked
/// against the pack it received.
fn only_push(door: &TestDoor) -> (String, String, bool, bool, u64) {
    let seen = door.seen();
    let [Ok(Request::Push {
        dst_ref,
        claimed_commit,
        force,
        delete,
        pack_bytes,
        ..
    })] = seen.as_slice()
    else {
        panic!("not one push: {seen:?}");
    };
    let packs = door.packs();
    if *pack_bytes > 0 {
        assert_eq!(packs.len(), 1);
        assert_eq!(packs[0].len() as u64, *pack_bytes);
        assert_eq!(&packs[0][..4], b"PACK");
    } else {
        assert!(packs.is_empty());
    }
    (
        dst_ref.clone(),
        claimed_commit.clone(),
        *force,
        *delete,
        *pack_bytes,
    )
}

#[test]
fn a_queued_push_exits_0_and_prints_the_act() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let out = act(
        &door.path,
        &["push", "origin", "HEAD:agent/x", "--commit", &repo.head],
        "",
        Some(repo.dir.path()),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "queued as act A1 for approval\n");
    let (dst, commit, force, delete, pack_bytes) = only_push(&door);
    assert_eq!(dst, "refs/heads/agent/x");
    assert_eq!(commit, repo.head);
    assert!(!force && !delete && pack_bytes > 0);
}

#[test]
fn a_push_of_a_commit_not_here_is_refused_before_anything_is_sent() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    for (commit, expected) in [
        (COMMIT, "git pack-objects failed"),
        (
            "0000000000000000000000000000000000000000",
            "a commit id is 40 (or 64) lowercase hexadecimal digits",
        ),
    ] {
        let out = act(
            &door.path,
            &["push", "origin", "agent/x", "--commit", commit],
            "",
            Some(repo.dir.path()),
        );
        assert_eq!(out.status.code(), Some(4));
        assert!(
            text(&out.stderr).contains(expected),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(door.seen(), []);
}

#[test]
fn a_refused_push_exits_3_with_the_rule_and_reason() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let out = act(
        &door.path,
        &["push", "origin", "x:main", "--commit", &repo.head],
        "",
        Some(repo.dir.path()),
    );
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        text(&out.stderr),
        "refused by rule r-main: pushes to main need a person\n"
    );
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn a_done_push_exits_0_and_prints_done() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let out = act(
        &door.path,
        &["push", "origin", "HEAD:done-1", "--commit", &repo.head],
        "",
        Some(repo.dir.path()),
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "done\n");
}

#[test]
fn pull_request_notify_and_ask_carry_their_bodies() {
    let door = TestDoor::start(Mode::Canned);
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body.md");
    std::fs::write(&body, "Fixes the flaky test.\n").unwrap();
    let body = body.to_str().unwrap();
    let repo = Repo::new("nightshift::origin");
    repo.git(&["branch", "agent/x"]);
    let pr = act(
        &door.path,
        &[
            "pr",
            "--remote",
            "origin",
            "--base",
            "main",
            "--head",
            "agent/x",
            "--title",
            "Fix the flaky test",
            "--body-file",
            body,
        ],
        "",
        Some(repo.dir.path()),
    );
    let notify = act(
        &door.path,
        &["notify", "team-chat", "--file", body],
        "",
        None,
    );
    let ask = act(
        &door.path,
        &["ask", "--file", "-"],
        "May I bump the MSRV?\n",
        None,
    );
    for out in [&pr, &notify, &ask] {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "queued as act A1 for approval\n");
    }
    assert_eq!(
        door.seen(),
        [
            Ok(Request::PullRequest {
                remote: "origin".into(),
                base: "refs/heads/main".into(),
                head: "refs/heads/agent/x".into(),
                head_commit: repo.head.clone(),
                pack_bytes: door.packs()[0].len() as u64,
                title: "Fix the flaky test".into(),
                body: "Fixes the flaky test.\n".into(),
            }),
            Ok(Request::Notify {
                destination: "team-chat".into(),
                body: "Fixes the flaky test.\n".into(),
            }),
            Ok(Request::Ask {
                body: "May I bump the MSRV?\n".into(),
            }),
        ]
    );
}

#[test]
fn the_doors_error_reply_exits_4() {
    let door = TestDoor::start(Mode::Canned);
    let out = act(&door.path, &["notify", "broken", "--file", "-"], "hi", None);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(
        text(&out.stderr),
        "error: endpoint broken is not configured\n"
    );
}

#[test]
fn a_url_or_path_is_refused_before_anything_is_sent() {
    let door = TestDoor::start(Mode::Canned);
    for remote in [
        "https://evil.example/x.git",
        "git@host:x",
        "/srv/repo",
        "../x",
    ] {
        let out = act(
            &door.path,
            &["push", remote, "x", "--commit", COMMIT],
            "",
            None,
        );
        assert_eq!(out.status.code(), Some(4), "{remote}");
        assert!(
            text(&out.stderr).contains(
                "destinations are aliases the owner configured; a URL or path is refused"
            ),
            "{}",
            text(&out.stderr)
        );
    }
    let out = act(
        &door.path,
        &["notify", "https://hooks.example", "--file", "-"],
        "hi",
        None,
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("a URL or path is refused"));
    assert_eq!(door.seen(), []);
}

#[test]
fn bad_text_is_refused_before_anything_is_sent() {
    let door = TestDoor::start(Mode::Canned);
    let big = "x".repeat(200 * 1024 + 1);
    let cases: [(&[&str], &str, &str); 4] = [
        (&["ask", "--file", "-"], &big, "over the limit"),
        (&["ask", "--file", "-"], "\u{1b}[2J", "control character"),
        (&["ask", "--file", "-"], "", "is empty"),
        (
            &[
                "pr",
                "--remote",
                "o",
                "--base",
                "main",
                "--head",
                "x",
                "--title",
                "a\nb",
                "--body-file",
                "-",
            ],
            "body",
            "one line",
        ),
    ];
    for (args, stdin, expected) in cases {
        let out = act(&door.path, args, stdin, None);
        assert_eq!(out.status.code(), Some(4), "{args:?}");
        assert!(
            text(&out.stderr).contains(expected),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(door.seen(), []);
}

#[test]
fn an_unreachable_door_exits_4() {
    let dir = tempfile::tempdir().unwrap();
    let out = act(
        &dir.path().join("none.sock"),
        &["ask", "--file", "-"],
        "q",
        None,
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(
        text(&out.stderr).starts_with("error: door unreachable at "),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_door_that_never_answers_times_out_with_exit_4() {
    let door = TestDoor::start(Mode::Silent);
    let mut child = Command::new(ACT)
        .args(["ask", "--file", "-"])
        .env("NIGHTSHIFT_DOOR", &door.path)
        .env("NIGHTSHIFT_DOOR_TIMEOUT_SECS", "1")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"question").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(
        text(&out.stderr).contains("did not answer within 1 s"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_oversized_answer_is_refused_from_its_header() {
    let door = TestDoor::start(Mode::OversizedAnswer);
    let out = act(&door.path, &["ask", "--file", "-"], "q", None);
    assert_eq!(out.status.code(), Some(4));
    assert!(
        text(&out.stderr).contains("response: frame declares 1073741824 bytes, over the limit"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn usage_mistakes_exit_2_and_help_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let door = dir.path().join("none.sock");
    for args in [&[][..], &["push", "origin"], &["deploy"], &["ask"]] {
        let out = act(&door, args, "", None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains("usage:"));
    }
    let out = act(&door, &["--help"], "", None);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("nightshift-act push REMOTE"));
}

/// A repository with one commit, whose `origin` is the door.
struct Repo {
    dir: tempfile::TempDir,
    home: tempfile::TempDir,
    head: String,
}

impl Repo {
    fn new(origin_url: &str) -> Repo {
        let repo = Repo {
            dir: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
            head: String::new(),
        };
        repo.git(&["init", "-q", "-b", "work"]);
        std::fs::write(repo.dir.path().join("f.txt"), "hello\n").unwrap();
        repo.git(&["add", "f.txt"]);
        repo.git(&["commit", "-q", "-m", "first"]);
        repo.git(&["remote", "add", "origin", origin_url]);
        let head = text(&repo.git(&["rev-parse", "HEAD"]).stdout)
            .trim()
            .to_string();
        Repo { head, ..repo }
    }

    fn command(&self, door: &Path) -> Command {
        let helper_dir = Path::new(HELPER).parent().unwrap();
        let path = format!(
            "{}:{}",
            helper_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("git");
        command
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env("HOME", self.home.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "agent")
            .env("GIT_AUTHOR_EMAIL", "agent@sandbox")
            .env("GIT_COMMITTER_NAME", "agent")
            .env("GIT_COMMITTER_EMAIL", "agent@sandbox")
            .env("NIGHTSHIFT_DOOR", door)
            .stdin(Stdio::null());
        command
    }

    fn git(&self, args: &[&str]) -> Output {
        let out = self
            .command(Path::new("/nonexistent"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
        out
    }

    fn push(&self, door: &TestDoor, args: &[&str]) -> Output {
        self.command(&door.path)
            .arg("push")
            .args(args)
            .output()
            .unwrap()
    }
}

#[test]
fn git_push_becomes_a_queued_push_act() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let out = repo.push(&door, &["origin", "HEAD:refs/heads/agent/x"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("queued as act A1 for approval"), "{stderr}");
    assert!(stderr.contains("[new branch]"), "{stderr}");
    let (dst, commit, force, delete, pack_bytes) = only_push(&door);
    assert_eq!(dst, "refs/heads/agent/x");
    assert_eq!(commit, repo.head);
    assert!(!force && !delete && pack_bytes > 0);
}

#[test]
fn a_forced_push_says_so() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let out = repo.push(&door, &["origin", "+HEAD:refs/heads/agent/f"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (_, commit, force, delete, _) = only_push(&door);
    assert_eq!(commit, repo.head);
    assert!(force && !delete);
}

#[test]
fn the_pack_holds_the_commit_and_leaves_out_what_the_base_reaches() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let base = repo.head.clone();
    std::fs::write(repo.dir.path().join("g.txt"), "more\n").unwrap();
    repo.git(&["add", "g.txt"]);
    repo.git(&["commit", "-q", "-m", "second"]);
    let head = text(&repo.git(&["rev-parse", "HEAD"]).stdout)
        .trim()
        .to_string();
    let out = repo
        .command(&door.path)
        .env("NIGHTSHIFT_BASE_COMMIT", &base)
        .args(["push", "origin", "HEAD:refs/heads/agent/p"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (_, commit, _, _, _) = only_push(&door);
    assert_eq!(commit, head);
    // Index the pack alone in an empty repository: it is a valid,
    // self-contained pack with the new commit and without the base.
    let empty = tempfile::tempdir().unwrap();
    let git_in = |args: &[&str], input: Option<&[u8]>| {
        let mut child = Command::new("git")
            .arg("-C")
            .arg(empty.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.unwrap_or_default()).unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    };
    assert!(git_in(&["init", "-q", "--bare"], None).status.success());
    let indexed = git_in(&["index-pack", "--stdin"], Some(&door.packs()[0]));
    assert!(indexed.status.success(), "{}", text(&indexed.stderr));
    assert!(git_in(&["cat-file", "-e", &head], None).status.success());
    assert!(!git_in(&["cat-file", "-e", &base], None).status.success());
}

#[test]
fn git_prints_the_doors_refusal_beside_the_ref() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let out = repo.push(&door, &["origin", "HEAD:refs/heads/agent/y", "work:main"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "[remote rejected] work -> main (refused by rule r-main: pushes to main need a person)"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("[new branch]      HEAD -> agent/y"),
        "{stderr}"
    );
    let seen = door.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(
        |r| matches!(r, Ok(Request::Push { claimed_commit, .. }) if *claimed_commit == repo.head)
    ));
}

#[test]
fn git_push_to_a_url_or_tag_is_refused_without_asking() {
    let door = TestDoor::start(Mode::Canned);
    let hostile = Repo::new("nightshift::https://evil.example/x.git");
    let out = hostile.push(&door, &["origin", "HEAD:refs/heads/x"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("a URL or path is refused"), "{stderr}");

    let repo = Repo::new("nightshift::origin");
    let out = repo.push(&door, &["origin", "HEAD:refs/tags/v1"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("a ref must be under refs/heads/"),
        "{stderr}"
    );

    assert_eq!(door.seen(), []);
}

#[test]
fn a_deletion_is_sent_for_the_door_to_decide() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let out = repo.push(&door, &["origin", ":refs/heads/gone"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused by rule nightshift:delete"),
        "{stderr}"
    );
    let (dst, commit, _, delete, pack_bytes) = only_push(&door);
    assert_eq!(dst, "refs/heads/gone");
    assert_eq!(commit, "0000000000000000000000000000000000000000");
    assert!(delete);
    assert_eq!(pack_bytes, 0);
}

#[test]
fn git_push_with_no_door_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repo::new("nightshift::origin");
    let out = repo
        .command(&dir.path().join("none.sock"))
        .args(["push", "origin", "HEAD:refs/heads/x"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("[remote rejected]") && stderr.contains("door unreachable"),
        "{stderr}"
    );
}

#[test]
fn nightshift_act_push_resolves_the_branch_with_git() {
    let door = TestDoor::start(Mode::Canned);
    let repo = Repo::new("nightshift::origin");
    let out = act(
        &door.path,
        &["push", "origin", "work"],
        "",
        Some(repo.dir.path()),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (dst, commit, _, _, _) = only_push(&door);
    assert_eq!(dst, "refs/heads/work");
    assert_eq!(commit, repo.head);
    let out = act(
        &door.path,
        &["push", "origin", "nope:x"],
        "",
        Some(repo.dir.path()),
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(
        text(&out.stderr).contains("does not name a commit"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_door_refuses_hostile_frames_with_an_error_reply() {
    // Raw clients: not ours, anything that reaches the socket.
    let door = TestDoor::start(Mode::Canned);
    let exchange = |bytes: &[u8]| -> Response {
        let mut conn = UnixStream::connect(&door.path).unwrap();
        let _ = conn.write_all(bytes);
        let _ = conn.shutdown(std::net::Shutdown::Write);
        // The door closes without reading what it did not want; the
        // kernel then resets the connection after its answer: keep what
        // arrived before that.
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = conn.read(&mut buf) {
            answer.extend_from_slice(&buf[..n]);
        }
        sandbox_image_door::decode_response(&answer)
            .unwrap()
            .unwrap()
            .0
    };
    let oversized = exchange(&u32::MAX.to_be_bytes());
    assert!(
        oversized.line().contains("over the limit"),
        "{}",
        oversized.line()
    );
    let mut not_json = 3u32.to_be_bytes().to_vec();
    not_json.extend_from_slice(b"{{{");
    assert!(exchange(&not_json).line().contains("malformed"));
    let framed = sandbox_image_door::encode_request(&Request::Ask { body: "q".into() }).unwrap();
    let two = framed.repeat(2);
    assert!(
        exchange(&two).line().starts_with("queued"),
        "the first is answered"
    );
    assert_eq!(door.seen().len(), 3);
}
