//! A hostile agent plants everything that could make the host execute,
//! interpret or follow what the sandbox wrote. After the run and the import,
//! and after a person inspects the result with the real git, nothing fired.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use tests::{git, image, make_repo, only_run, stderr, State};

#[test]
fn nothing_the_sandbox_wrote_runs_or_is_followed_on_the_host() {
    let state = State::new();
    let repo = make_repo();
    let sentinel_dir = tempfile::tempdir().unwrap();
    // World-writable so that, if anything ran as the sandbox's uid on the host, it could write.
    std::fs::set_permissions(sentinel_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = sentinel_dir.path().display().to_string();
    let host_secret = state.path().join("host-secret.txt");
    std::fs::write(&host_secret, "HOST-SECRET-CONTENT-9f3e\n").unwrap();
    let hs = host_secret.display().to_string();

    let script = format!(
        r#"set -u
cd /workspace
echo ordinary > ordinary.txt
echo '* filter=evil diff=evil' > .gitattributes
printf '[submodule "x"]\n\tpath = x\n\turl = {s}/submodule-url\n' > .gitmodules
git add ordinary.txt .gitattributes .gitmodules
git commit -q -m "agent: hostile commit"
for h in pre-commit post-commit post-checkout post-merge pre-push reference-transaction fsmonitor-watchman; do
  printf '#!/bin/sh\ntouch {s}/hook-%s\n' "$h" > .git/hooks/$h; chmod +x .git/hooks/$h
done
cat >> .git/config <<'CFG'
[core]
	fsmonitor = touch {s}/fsmonitor
	hooksPath = /tmp/evil-hooks
	sshCommand = touch {s}/sshcommand
	pager = touch {s}/pager
[filter "evil"]
	clean = touch {s}/filter-clean
	smudge = touch {s}/filter-smudge
	process = touch {s}/filter-process
[alias]
	log = !touch {s}/alias
	status = !touch {s}/alias
[diff "evil"]
	textconv = touch {s}/textconv
CFG
ln -s /etc/shadow shadow-link
ln -s {hs} secret-link
ln -s / root-link
cp /bin/true suid-true && chmod 4755 suid-true
mkfifo a-pipe
truncate -s 1G huge-sparse  # within the file-size limit (the worktree cap), over the import's
echo uncommitted > uncommitted.txt
echo done
"#
    );
    let mut child = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "bash",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The FIFO must not hang the import: give the run a generous bound only
    // so a regression fails the test instead of hanging CI.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!("nightshift run hung on the hostile worktree");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = child.wait_with_output().unwrap();
    assert!(status.success(), "hostile run failed: {}", stderr(&out));
    let run = only_run(&state);
    let id = run["id"].as_str().unwrap().to_string();
    let reference = format!("refs/nightshift/runs/{id}");
    // The agent really planted everything (otherwise this test proves nothing).
    let log = state.output_log(&id);
    assert!(
        log.trim_end().ends_with("done"),
        "hostile script did not finish: {log}"
    );
    assert!(git(repo.path(), &["log", "--format=%s", &reference]).contains("agent: hostile commit"));

    // A person inspects the result with the real git on the host.
    git(repo.path(), &["log", "--stat", &reference]);
    git(repo.path(), &["show", &reference]);
    git(repo.path(), &["diff", "HEAD", &reference]);
    git(repo.path(), &["status"]);

    let fired: Vec<_> = std::fs::read_dir(sentinel_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        fired.is_empty(),
        "something the sandbox wrote ran on the host: {fired:?}"
    );

    // Symlinks came back as symlinks (their target text), never as the content behind them.
    let tree = git(repo.path(), &["ls-tree", "-r", &reference]);
    for link in ["shadow-link", "secret-link", "root-link"] {
        let line = tree
            .lines()
            .find(|l| l.ends_with(link))
            .unwrap_or_else(|| panic!("{link} missing: {tree}"));
        assert!(
            line.starts_with("120000 "),
            "{link} not a symlink entry: {line}"
        );
    }
    let all_objects = std::process::Command::new("git")
        .arg("-C")
        .arg(repo.path())
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&all_objects.stdout);
    assert!(
        !dump.contains("HOST-SECRET-CONTENT-9f3e"),
        "host secret read through a symlink"
    );
    assert!(
        !dump.contains("root:"),
        "/etc/shadow read through a symlink"
    );

    // The pipe and the huge file were skipped, not read; the run said so.
    assert!(!tree.contains("a-pipe"));
    assert!(!tree.contains("huge-sparse"));
    let skipped = run["observed"]["skipped"].to_string();
    assert!(skipped.contains("huge-sparse"), "{skipped}");
    assert!(skipped.contains("a-pipe"), "{skipped}");
    // The setuid bit did not survive (git keeps only 755/644) and nothing is left on disk.
    let suid = tree.lines().find(|l| l.ends_with("suid-true")).unwrap();
    assert!(suid.starts_with("100755 "), "{suid}");
    assert!(!Path::new(&state.path().join("worktrees").join(&id)).exists());
    assert!(state.containers().is_empty());
    assert!(state.verify().status.success());
}

/// Writes two hostile commits as raw loose objects into `.git/objects` of
/// the current directory (`git mktree` refuses such trees), on top of HEAD.
/// argv: the decoy directory and the host repository's hooks directory.
/// A: a tree `..` holding a file, `.git/hooks/post-checkout` as one name, a
/// symlink `l` to the decoy and an entry `l/x` through it. B: only files and
/// symlinks (no directory entry to stop a checkout early): `../escaped-by-name`,
/// `h` -> the hooks directory with `h/post-checkout`, and `l`, `l/x`.
const HOSTILE_OBJECTS: &str = r##"
import hashlib, os, sys, zlib
decoy, hooks = sys.argv[1], sys.argv[2]
def obj(kind, data):
    raw = b"%s %d\0" % (kind.encode(), len(data)) + data
    h = hashlib.sha1(raw).hexdigest()
    d = os.path.join(".git", "objects", h[:2])
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, h[2:])
    if not os.path.exists(p):
        with open(p, "wb") as f:
            f.write(zlib.compress(raw))
    return h
def tree(*entries):
    return obj("tree", b"".join(m + b" " + n + b"\0" + bytes.fromhex(i) for m, n, i in entries))
def commit(t, msg):
    parent = os.popen("git rev-parse HEAD").read().strip()
    return obj("commit", ("tree %s\nparent %s\nauthor a <a@example.invalid> 1 +0000\ncommitter a <a@example.invalid> 1 +0000\n\n%s\n" % (t, parent, msg)).encode())
out = obj("blob", b"written outside the worktree\n")
hook = obj("blob", ("#!/bin/sh\ntouch %s/hook-ran\n" % decoy).encode())
to_decoy = obj("blob", decoy.encode())
to_hooks = obj("blob", hooks.encode())
a = commit(tree(
    (b"40000", b"..", tree((b"100644", b"escaped-by-dotdot", out))),
    (b"100755", b".git/hooks/post-checkout", hook),
    (b"120000", b"l", to_decoy),
    (b"100644", b"l/x", out),
), "hostile A")
b = commit(tree(
    (b"100644", b"../escaped-by-name", out),
    (b"120000", b"h", to_hooks),
    (b"100755", b"h/post-checkout", hook),
    (b"120000", b"l", to_decoy),
    (b"100644", b"l/x", out),
), "hostile B")
print("HOSTILE-A", a)
print("HOSTILE-B", b)
"##;

/// Every path under `dir`, relative, sorted (symlinks not followed).
fn listing(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            out.push(entry.path().strip_prefix(dir).unwrap().to_owned());
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

fn hostile_id(text: &str, which: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("HOSTILE-{which} ")))
        .unwrap_or_else(|| panic!("no HOSTILE-{which} id in: {text}"))
        .trim()
        .to_string()
}

/// What must hold after every step: nothing was written through a hostile
/// tree, wherever it points.
fn assert_nothing_escaped(
    state: &State,
    repo: &Path,
    decoy: &Path,
    hooks_before: &[std::path::PathBuf],
    step: &str,
) {
    assert!(
        listing(decoy).is_empty(),
        "{step}: written into the decoy: {:?}",
        listing(decoy)
    );
    assert_eq!(
        listing(&repo.join(".git/hooks")),
        hooks_before,
        "{step}: the host repository's hooks changed"
    );
    for dir in [state.path(), repo] {
        let escaped: Vec<_> = listing(dir)
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("escaped-by-"))
            })
            .collect();
        assert!(
            escaped.is_empty(),
            "{step}: written outside a worktree: {escaped:?}"
        );
    }
    assert!(state.containers().is_empty(), "{step}: containers left");
}

#[test]
fn hostile_trees_never_write_outside_a_worktree() {
    let state = State::new();
    let repo = make_repo();
    let decoy_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(decoy_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let decoy = decoy_dir.path().to_owned();
    let hooks = repo.path().join(".git/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let hooks_before = listing(&hooks);

    // 1. The agent writes the hostile commits itself and points its branch at A.
    let script = format!(
        r#"set -eu
cd /workspace
ids=$(python3 - '{decoy}' '{hooks}' <<'PY'
{HOSTILE_OBJECTS}
PY
)
echo "$ids"
git update-ref HEAD "$(echo "$ids" | awk '/HOSTILE-A/ {{print $2}}')"
echo planted
"#,
        decoy = decoy.display(),
        hooks = hooks.display(),
    );
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        &script,
    ]);
    let run = only_run(&state);
    let id = run["id"].as_str().unwrap().to_string();
    let log = state.output_log(&id);
    assert!(
        log.contains("planted"),
        "the agent did not plant: {log}\n{}",
        stderr(&out)
    );
    let agent_a = hostile_id(&log, "A");
    assert_nothing_escaped(
        &state,
        repo.path(),
        &decoy,
        &hooks_before,
        "the hostile run",
    );
    // The import refused the commit: it is nowhere in the host repository.
    let found = std::process::Command::new("git")
        .arg("-C")
        .arg(repo.path())
        .args(["cat-file", "-e", &agent_a])
        .output()
        .unwrap();
    assert!(
        !found.status.success(),
        "the hostile commit was imported into the host repository"
    );

    // 2. Continuing from the run's result, whatever the import kept.
    let result_ref = format!("refs/nightshift/runs/{id}");
    let has_result = std::process::Command::new("git")
        .arg("-C")
        .arg(repo.path())
        .args(["rev-parse", "--verify", "-q", &result_ref])
        .output()
        .unwrap()
        .status
        .success();
    if has_result {
        state.run(&[
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--ref",
            &result_ref,
            "--image",
            &image(),
            "--",
            "true",
        ]);
        assert_nothing_escaped(
            &state,
            repo.path(),
            &decoy,
            &hooks_before,
            "the continued run",
        );
    }

    // 3. The same trees as if an older nightshift had imported them: planted
    // in the host repository, then a run is based on each.
    let planted = std::process::Command::new("python3")
        .current_dir(repo.path())
        .args(["-", decoy.to_str().unwrap(), hooks.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(HOSTILE_OBJECTS.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(planted.status.success());
    let planted = String::from_utf8_lossy(&planted.stdout).into_owned();
    for which in ["A", "B"] {
        let commit = hostile_id(&planted, which);
        let reference = format!("refs/nightshift/runs/older-{which}");
        git(repo.path(), &["update-ref", &reference, &commit]);
        let out = state.run(&[
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--ref",
            &reference,
            "--image",
            &image(),
            "--",
            "true",
        ]);
        assert!(
            !out.status.success(),
            "a run on hostile commit {which} started"
        );
        assert!(
            stderr(&out).contains("refused entry"),
            "run on hostile commit {which} not refused for its tree: {}",
            stderr(&out)
        );
        assert_nothing_escaped(
            &state,
            repo.path(),
            &decoy,
            &hooks_before,
            &format!("the run on planted commit {which}"),
        );
    }
    assert!(state.verify().status.success());
}

/// A stash, an unrelated branch and a commit reset away in the host
/// repository are not readable from inside the sandbox.
#[test]
fn the_sandbox_holds_only_objects_its_base_reaches() {
    let state = State::new();
    let repo = make_repo();
    let r = repo.path();
    std::fs::write(r.join("stashed.txt"), "STASH-SECRET-7c1\n").unwrap();
    git(r, &["add", "stashed.txt"]);
    git(r, &["stash", "-q"]);
    let stash = git(r, &["rev-parse", "refs/stash"]).trim().to_string();
    let stash_blob = git(r, &["rev-parse", "refs/stash:stashed.txt"])
        .trim()
        .to_string();
    git(r, &["checkout", "-q", "-b", "other"]);
    std::fs::write(r.join("other.txt"), "BRANCH-SECRET-7c2\n").unwrap();
    git(r, &["add", "other.txt"]);
    git(r, &["commit", "-q", "-m", "other branch"]);
    let other = git(r, &["rev-parse", "HEAD"]).trim().to_string();
    git(r, &["checkout", "-q", "main"]);
    std::fs::write(r.join("gone.txt"), "RESET-SECRET-7c3\n").unwrap();
    git(r, &["add", "gone.txt"]);
    git(r, &["commit", "-q", "-m", "reset away"]);
    let gone = git(r, &["rev-parse", "HEAD"]).trim().to_string();
    git(r, &["reset", "-q", "--hard", "HEAD~1"]);

    let script = format!(
        r#"set -u
cd /workspace
for id in {stash} {stash_blob} {other} {gone}; do
  if git cat-file -e "$id" 2>/dev/null; then echo "READABLE $id"; fi
done
echo "SECRETS=$(git cat-file --batch-all-objects --batch | grep -c -- -SECRET-7c)"
echo done
"#
    );
    let out = state.run(&[
        "run",
        "--repo",
        r.to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        &script,
    ]);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    let run = only_run(&state);
    let log = state.output_log(run["id"].as_str().unwrap());
    assert!(log.contains("done"), "the probe did not finish: {log}");
    assert!(
        !log.contains("READABLE"),
        "host objects readable in the sandbox: {log}"
    );
    assert!(
        log.contains("SECRETS=0"),
        "host secrets readable in the sandbox: {log}"
    );
    assert!(state.containers().is_empty());
}
