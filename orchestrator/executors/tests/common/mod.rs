//! Shared by the executor tests: the loopback servers of the end-to-end
//! tests, compiled in place (the `tests` crate depends on the orchestrator,
//! which depends on this crate), and small git helpers.

#![allow(dead_code)]

#[path = "../../../../tests/src/loopback.rs"]
pub mod loopback;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs git in `dir` with a clean config; panics with its stderr on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@localhost",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .expect("running git");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A host repository with commits, and a bare repository to push to.
pub struct Repos {
    pub dir: tempfile::TempDir,
    pub host: PathBuf,
    pub bare: PathBuf,
}

impl Repos {
    pub fn new() -> Repos {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = dir.path().join("host");
        let bare = dir.path().join("remote.git");
        std::fs::create_dir(&host).unwrap();
        git(&host, &["init", "-q"]);
        git(
            dir.path(),
            &["init", "-q", "--bare", bare.to_str().unwrap()],
        );
        Repos { dir, host, bare }
    }

    /// Commits a file in the host repository on its current branch and
    /// returns the commit id.
    pub fn commit(&self, file: &str, text: &str) -> String {
        std::fs::write(self.host.join(file), text).unwrap();
        git(&self.host, &["add", file]);
        git(&self.host, &["commit", "-q", "-m", file]);
        git(&self.host, &["rev-parse", "HEAD"])
    }

    /// What `reference` holds in the bare repository, if it exists.
    pub fn remote_ref(&self, reference: &str) -> Option<String> {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&self.bare)
            .args(["rev-parse", "--verify", "--quiet", reference])
            .output()
            .expect("running git");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Sets `reference` in the bare repository directly (someone else's push).
    pub fn set_remote_ref(&self, reference: &str, commit: &str) {
        git(
            &self.host,
            &[
                "push",
                "-q",
                "-f",
                self.bare.to_str().unwrap(),
                &format!("{commit}:{reference}"),
            ],
        );
    }
}

impl Repos {
    /// Installs a `pre-receive` hook with this shell body in the bare
    /// repository.
    pub fn pre_receive(&self, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let hook = self.bare.join("hooks").join("pre-receive");
        std::fs::create_dir_all(hook.parent().unwrap()).unwrap();
        std::fs::write(&hook, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Writes a secret file (mode 0600) in `dir` and returns its path.
pub fn secret_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}
