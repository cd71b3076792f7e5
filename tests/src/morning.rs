//! A state with a loopback git remote (`origin`, private readers, behind a
//! password only the supervisor holds) and the owner's key: the setting of
//! the tests in which a sandboxed agent pushes at night and the owner
//! decides in the morning.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::loopback::{ForgeServer, GitHttpServer};
use crate::{git, image, make_repo, stderr, stdout, State};

pub const PASSWORD: &str = "s3cret-morning-password-77ad";
/// The forge's API token (see [`Morning::with_forge`]).
pub const FORGE_TOKEN: &str = "forge-token-morning-31c4";

#[derive(Debug)]
pub struct Morning {
    pub state: State,
    pub repo: tempfile::TempDir,
    _remote_dir: tempfile::TempDir,
    pub bare: PathBuf,
    pub git_server: GitHttpServer,
    /// A GitHub-shaped forge whose repository is the remote (`forge`).
    pub forge: Option<ForgeServer>,
    pub key: PathBuf,
}

impl Morning {
    pub fn new() -> Morning {
        Self::setup(false)
    }

    /// As [`Morning::new`], plus a forge `forge` whose git remote is `origin`.
    pub fn with_forge() -> Morning {
        Self::setup(true)
    }

    fn setup(with_forge: bool) -> Morning {
        let state = State::new();
        let repo = make_repo();
        let remote_dir = tempfile::tempdir().unwrap();
        let bare = remote_dir.path().join("origin.git");
        git(
            remote_dir.path(),
            &["init", "-q", "--bare", bare.to_str().unwrap()],
        );
        // Every update of every ref is logged ([`Morning::ref_updates`]).
        git(&bare, &["config", "core.logAllRefUpdates", "always"]);
        let git_server = GitHttpServer::start(&bare, "nightshift", PASSWORD);
        let secrets = state.path().join("secrets");
        std::fs::create_dir(&secrets).unwrap();
        let pw = secrets.join("origin.password");
        std::fs::write(&pw, PASSWORD).unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut destinations = format!(
            "[remotes.origin]\nurl = \"{}\"\nreaders = \"private\"\nusername = \"nightshift\"\npassword_file = \"{}\"\n",
            git_server.url(),
            pw.display(),
        );
        let forge = with_forge.then(|| {
            let forge = ForgeServer::with_repo(FORGE_TOKEN, &bare);
            let token = secrets.join("forge.token");
            std::fs::write(&token, FORGE_TOKEN).unwrap();
            std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
            destinations.push_str(&format!(
                "\n[forges.forge]\napi = \"{}\"\nrepo = \"owner/name\"\nremote = \"origin\"\ntoken_file = \"{}\"\nreaders = \"private\"\n",
                forge.url(),
                token.display()
            ));
            forge
        });
        std::fs::write(state.path().join("destinations.toml"), destinations).unwrap();
        assert!(state.run(&["owner", "init"]).status.success());
        let key = state.path().join("owner.key");
        Morning {
            state,
            repo,
            _remote_dir: remote_dir,
            bare,
            git_server,
            forge,
            key,
        }
    }

    /// One run of `bash -c SCRIPT` in the default image; it must exit 0.
    /// Returns the run's id.
    pub fn run_agent(&self, script: &str) -> String {
        self.run_agent_with_task(script, None)
    }

    /// As [`Morning::run_agent`], given `task` as `--task`.
    pub fn run_agent_with_task(&self, script: &str, task: Option<&str>) -> String {
        let repo = self.repo.path().to_str().unwrap();
        let image = image();
        let mut args = vec!["run", "--repo", repo, "--image", &image];
        if let Some(task) = task {
            args.extend(["--task", task]);
        }
        args.extend(["--", "bash", "-c", script]);
        let out = self.state.run(&args);
        assert!(
            out.status.success(),
            "agent run failed: {}{}",
            stdout(&out),
            stderr(&out)
        );
        let runs = self.state.runs();
        runs.last().unwrap()["id"].as_str().unwrap().to_string()
    }

    /// `nightshift queue --json`.
    pub fn queue(&self) -> Vec<serde_json::Value> {
        let out = self.state.run(&["queue", "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The queue entry of act `id`.
    pub fn act(&self, id: &str) -> serde_json::Value {
        self.queue()
            .into_iter()
            .find(|a| a["act"]["id"] == id)
            .unwrap_or_else(|| panic!("no act {id} in the queue"))
    }

    /// A command that needs the owner's key: `approve ACT`, `rebind ACT`, `thaw`.
    pub fn as_owner(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--owner-key-file", self.key.to_str().unwrap()]);
        self.state.run(&all)
    }

    /// What `r` holds in the remote, if anything.
    pub fn remote_ref(&self, r: &str) -> Option<String> {
        remote_ref(&self.bare, r)
    }

    /// How many times the remote's `r` was written (created or moved):
    /// its reflog, which receive-pack appends to under the ref's lock.
    pub fn ref_updates(&self, r: &str) -> usize {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&self.bare)
            .args(["reflog", "show", "--format=%H", r, "--"])
            .output()
            .unwrap();
        if !out.status.success() {
            return 0;
        }
        stdout(&out)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    }

    /// How many pushes (receive-pack POSTs) reached the remote.
    pub fn pushes_received(&self) -> usize {
        self.git_server
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/git-receive-pack"))
            .count()
    }
}

impl Default for Morning {
    fn default() -> Self {
        Self::new()
    }
}

/// What `r` holds in the bare repository `bare`, if anything.
pub fn remote_ref(bare: &Path, r: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(bare)
        .args(["rev-parse", "--verify", "-q", r])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| stdout(&out).trim().to_string())
}
