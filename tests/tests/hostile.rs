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
