//! The demo (`nightshift demo`): a small repository made under the state
//! directory and a scripted agent that edits, commits, and leaves an
//! uncommitted change, so a newcomer sees one whole Tier 0 run on this
//! machine with nothing configured.
//!
//! It goes in three steps, between which the command line says what is
//! happening: [`prepare`] (the repository, its destination, the owner's
//! key, the default image), [`run`] (one foreground run, as `nightshift
//! run` does it), and [`pending`] (the run's acts waiting in the queue).
//! Each is idempotent: a second demo on the same state reuses what the
//! first made.

use std::path::{Path, PathBuf};
use std::process::Command;

use nightshift_core::config::Config;
use nightshift_core::state_store::RunRecord;

use crate::api::{Api, ApiError, Caller, Command as ApiCommand, ErrorKind, Reply};
use crate::commands::Warn;
use crate::run::RunRequest;

/// The scripted agent: what a real coding agent would do, in a few lines of shell.
pub const AGENT_SCRIPT: &str = r#"set -eu
echo "agent: task is: $NIGHTSHIFT_TASK"
echo "agent: uid $(id -u), in $(pwd)"
printf 'def greet(name):\n    return f"good morning, {name}"\n' > greet.py
python3 -c 'import greet; print("agent: " + greet.greet("nightshift"))'
rm -rf __pycache__
git add greet.py
git commit -q -m "add greet()"
echo "agent: asking to push the branch (a person decides in the morning)"
git push origin HEAD:refs/heads/agent/greet
echo "- greet() added overnight" >> NOTES.md
echo "agent: done (one commit pushed through the door, one uncommitted change)"
"#;

pub const TASK: &str = "Add a greet() function and note it in NOTES.md.";

/// Makes (once) the demo's destination: a local bare repository configured
/// as the alias `origin` in `STATE/destinations.toml`. Returns its path.
pub fn ensure_destination(root: &Path) -> Result<PathBuf, String> {
    let bare = root.join("demo").join("origin.git");
    if !bare.join("HEAD").exists() {
        let out = Command::new("git")
            .args(["init", "-q", "--bare"])
            .arg(&bare)
            .output()
            .map_err(|e| format!("running git: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "git init --bare: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    let config = root.join("destinations.toml");
    if !config.exists() {
        std::fs::write(
            &config,
            format!(
                "# Written by `nightshift demo`: the demo's one destination.\n[remotes.origin]\nurl = \"file://{}\"\nreaders = \"private\"\n",
                bare.display()
            ),
        )
        .map_err(|e| format!("writing {}: {e}", config.display()))?;
    }
    Ok(bare)
}

/// Makes (once) the demo repository under `root` and returns its path.
pub fn ensure_repo(root: &Path) -> Result<PathBuf, String> {
    let repo = root.join("demo").join("repo");
    if repo.join(".git").exists() {
        return Ok(repo);
    }
    std::fs::create_dir_all(&repo).map_err(|e| format!("creating {}: {e}", repo.display()))?;
    std::fs::write(
        repo.join("README.md"),
        "# demo\n\nA small repository for the nightshift demo.\n",
    )
    .map_err(|e| format!("writing the demo repository: {e}"))?;
    std::fs::write(repo.join("NOTES.md"), "# notes\n")
        .map_err(|e| format!("writing the demo repository: {e}"))?;
    let git = |args: &[&str]| -> Result<(), String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.name=demo", "-c", "user.email=demo@localhost"])
            .args(args)
            .output()
            .map_err(|e| format!("running git: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    git(&["init", "-q", "-b", "main"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "initial commit"])?;
    Ok(repo)
}

/// What the demo runs on: the configuration, the repository, its
/// destination (a local bare repository, alias `origin`) and the image.
#[derive(Debug, Clone)]
pub struct Setup {
    pub config: Config,
    pub repo: PathBuf,
    pub destination: PathBuf,
    pub image: String,
}

/// Makes (once) the state, the demo's repository and destination and the
/// owner's key, and builds (when not up to date) the default image, saying
/// what the build does to `progress`.
pub async fn prepare(
    api: &Api,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Setup, ApiError> {
    let config = api.load_config()?;
    crate::acts::use_queue_ttls(config.queue_ttls());
    crate::acts::use_queue_bounds(config.queue_bounds());
    let root = api.root();
    std::fs::create_dir_all(root).map_err(|e| {
        ApiError::caused(ErrorKind::State, e).doing(format!("creating {}", root.display()))
    })?;
    let repo = ensure_repo(root).map_err(|e| {
        ApiError::new(
            ErrorKind::Internal,
            format!("making the demo repository: {e}"),
        )
    })?;
    let destination = ensure_destination(root).map_err(|e| {
        ApiError::new(
            ErrorKind::Internal,
            format!("making the demo destination: {e}"),
        )
    })?;
    {
        let mut store = api.open_state()?;
        nightshift_core::owner::init(&mut *store)
            .map_err(|e| ApiError::caused(ErrorKind::State, e))?;
    }
    let build = ApiCommand::ImageBuild {
        mirror: nightshift_engine_docker::image::DEFAULT_MIRROR.into(),
        agent: None,
        with: Vec::new(),
    };
    let image = match api
        .execute_streaming(build, &Caller::Local, progress)
        .await?
    {
        Reply::ImageRef { reference } => reference,
        other => {
            return Err(ApiError::new(
                ErrorKind::Internal,
                format!("building the image answered {other:?}"),
            ))
        }
    };
    Ok(Setup {
        config,
        repo,
        destination,
        image,
    })
}

/// The scripted agent's run on the demo repository, in the foreground
/// (its output echoed).
pub async fn run(api: &Api, setup: &Setup, warn: Warn<'_>) -> Result<RunRecord, ApiError> {
    let req = RunRequest {
        repo: setup.repo.clone(),
        base_ref: "HEAD".into(),
        image: setup.image.clone(),
        task: TASK.into(),
        command: vec!["bash".into(), "-c".into(), AGENT_SCRIPT.into()],
        caps: setup.config.caps(),
        echo: true,
        repo_confidentiality: setup.config.repository_confidentiality(&setup.repo),
        dry_run: false,
        setup: None,
        continues: None,
    };
    crate::commands::run::perform(api, &setup.config, req, true, warn).await
}

/// The acts of `run` in the queue, for the owner to decide in the morning.
pub fn pending(api: &Api, run: &RunRecord) -> Result<Vec<crate::acts::Row>, ApiError> {
    let store = api.open_state()?;
    Ok(crate::acts::rows(&*store, None)?
        .into_iter()
        .filter(|r| r.act.run == run.id)
        .collect())
}
