//! Resolving what a push names to a commit id, with the sandbox's own git.
//!
//! Invariants: the claim is only a claim. The supervisor checks the commit
//! against the worktree's objects itself; this only saves the agent from
//! naming a commit by hand. Nothing that starts with `-` reaches git as an
//! argument, so no name can turn into an option.

use std::process::{Command, Stdio};

use thiserror::Error;

use crate::validate::check_commit;

/// A name that does not resolve to a commit.
#[derive(Debug, Error)]
pub enum ResolveError {
    /// The name would read as an option.
    #[error("{name:?} is not a revision (it starts with -)")]
    Option {
        /// The name.
        name: String,
    },
    /// git could not be run.
    #[error("running git rev-parse for {name:?}: {source}")]
    Spawn {
        /// The name.
        name: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// git found no such commit.
    #[error("{name:?} does not name a commit in this repository")]
    NotFound {
        /// The name.
        name: String,
    },
}

/// The full commit id `name` resolves to in the current repository.
pub fn resolve_commit(name: &str) -> Result<String, ResolveError> {
    let name_owned = || name.chars().take(200).collect::<String>();
    if name.starts_with('-') || name.is_empty() {
        return Err(ResolveError::Option { name: name_owned() });
    }
    let output = Command::new("git")
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("{name}^{{commit}}"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|source| ResolveError::Spawn {
            name: name_owned(),
            source,
        })?;
    let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if !output.status.success() || check_commit("commit", &id).is_err() {
        return Err(ResolveError::NotFound { name: name_owned() });
    }
    Ok(id)
}
