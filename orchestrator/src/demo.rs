//! The demo: a small repository made under the state directory and a
//! scripted agent that edits, commits, and leaves an uncommitted change, so a
//! newcomer sees one whole Tier 0 run on this machine with nothing configured.

use std::path::{Path, PathBuf};
use std::process::Command;

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
