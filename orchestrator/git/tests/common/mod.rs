//! Fixtures for the adapter's tests: real repositories made with the real `git`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use orchestrator_git::{create_worktree, ImportLimits, ImportSpec, Worktree, WorktreeSpec};

/// Runs `git -C dir args` with no user or system config, and returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_raw(dir, args);
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

pub fn git_raw(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .arg("-c")
        .arg("safe.directory=*")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "agent")
        .env("GIT_AUTHOR_EMAIL", "agent@example.invalid")
        .env("GIT_COMMITTER_NAME", "agent")
        .env("GIT_COMMITTER_EMAIL", "agent@example.invalid")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .output()
        .expect("running git")
}

pub fn write(path: &Path, content: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, content).unwrap();
}

/// A temp dir holding a host repository `host/` with two commits on `main`.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub host: PathBuf,
    pub base: String,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        std::fs::create_dir(&host).unwrap();
        git(&host, &["init", "-q", "-b", "main"]);
        write(&host.join("README.md"), "hello\n");
        git(&host, &["add", "-A"]);
        git(&host, &["commit", "-q", "-m", "first"]);
        write(&host.join("src/lib.rs"), "one\ntwo\nthree\n");
        write(&host.join("src/old.txt"), "old\n");
        write(&host.join("bin/run.sh"), "#!/bin/sh\necho hi\n");
        std::fs::set_permissions(
            host.join("bin/run.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("../README.md", host.join("src/readme-link")).unwrap();
        git(&host, &["add", "-A"]);
        git(&host, &["commit", "-q", "-m", "second"]);
        let base = git(&host, &["rev-parse", "HEAD"]);
        Fixture { dir, host, base }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn worktree(&self, run_id: &str) -> Worktree {
        create_worktree(&WorktreeSpec {
            host_repo: self.host.clone(),
            base_commit: self.base.clone(),
            run_id: run_id.to_owned(),
            dest: self.path(&format!("wt-{run_id}")),
            owner: None,
            history_cache: None,
        })
        .expect("create_worktree")
    }

    pub fn spec<'a>(&'a self, wt: &'a Path, run_id: &'a str) -> ImportSpec<'a> {
        ImportSpec {
            host_repo: &self.host,
            worktree: wt,
            run_id,
            base_commit: &self.base,
            limits: ImportLimits::default(),
            committer: ("nightshift", "nightshift@example.invalid"),
            leave_out: &[],
        }
    }
}

/// Every file under `dir` (not following symlinks), as (relative path, bytes).
pub fn all_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push((
                    e.path().strip_prefix(dir).unwrap().to_owned(),
                    std::fs::read(e.path()).unwrap(),
                ));
            } else if t.is_symlink() {
                let target = std::fs::read_link(e.path()).unwrap();
                out.push((
                    e.path().strip_prefix(dir).unwrap().to_owned(),
                    target.as_os_str().as_encoded_bytes().to_vec(),
                ));
            }
        }
    }
    out
}

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
