//! The sandbox's own git, run by the clients: resolving what a push names to
//! a commit id, and packing the objects that commit reaches.
//!
//! Invariants:
//! - The commit and its pack are resolved here, in the sandbox, and sent
//!   over the door; the supervisor never reads the run's `.git` to find
//!   them. It checks the pack itself (every object's hash, the commit
//!   connected to what the host already holds), so nothing here is trusted
//!   (`tests/tests/door_races.rs::a_fifo_or_a_sparse_10gb_file_for_a_loose_object_neither_blocks_nor_bloats_the_door`,
//!   `tests/tests/door_races.rs::alternates_rewritten_in_a_loop_never_let_a_foreign_commit_in`,
//!   `orchestrator/git/src/import/pack.rs::tests::a_commit_not_connected_is_refused_and_no_ref_is_made`).
//! - Nothing that starts with `-` reaches git as an argument, so no name can
//!   turn into an option; revisions reach `git pack-objects` on its standard
//!   input, one per line, as full hex ids only
//!   (`tests::a_name_that_reads_as_an_option_never_reaches_git`).
//! - A pack is spooled to an unlinked file in the repository's git directory
//!   (its size must be declared before it is sent) and refused here when it
//!   is over [`MAX_PACK_BYTES`], as the door would refuse it.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use thiserror::Error;

use crate::validate::{check_commit, MAX_PACK_BYTES};

/// The variable naming the run's base commit: a pack leaves out what it
/// reaches (the supervisor's repository already holds it).
pub const ENV_BASE_COMMIT: &str = "NIGHTSHIFT_BASE_COMMIT";

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

/// A pack that could not be made.
#[derive(Debug, Error)]
pub enum PackError {
    /// The commit is not a full hex id.
    #[error("{commit:?} is not a full commit id")]
    BadCommit {
        /// What was given (bounded).
        commit: String,
    },
    /// Spooling or running git failed.
    #[error("packing commit {commit}: {doing}: {source}")]
    Io {
        /// The commit.
        commit: String,
        /// What was being done.
        doing: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `git pack-objects` failed (most often: the commit, or an object it
    /// reaches, is not in this repository).
    #[error("packing commit {commit}: git pack-objects failed (is every object it reaches in this repository?)")]
    Failed {
        /// The commit.
        commit: String,
    },
    /// The pack is over the limit the door takes.
    #[error("packing commit {commit}: the pack is {bytes} bytes, over the door's limit of {limit} bytes")]
    TooLarge {
        /// The commit.
        commit: String,
        /// Its size.
        bytes: u64,
        /// [`MAX_PACK_BYTES`].
        limit: u64,
    },
}

/// A pack ready to send: an unlinked file positioned at its start.
#[derive(Debug)]
pub struct Pack {
    /// The pack's bytes.
    pub file: File,
    /// How many.
    pub len: u64,
}

/// Packs every object `commit` reaches, less what `base` reaches when the
/// repository holds `base` (a pack then holds only the run's new objects).
/// The pack is self-contained (never "thin"): every delta's base is in it.
pub fn pack_objects(commit: &str, base: Option<&str>) -> Result<Pack, PackError> {
    if check_commit("commit", commit).is_err() {
        return Err(PackError::BadCommit {
            commit: commit.chars().take(80).collect(),
        });
    }
    let io = |doing| {
        let commit = commit.to_string();
        move |source| PackError::Io {
            commit,
            doing,
            source,
        }
    };
    let base = base.filter(|b| check_commit("base", b).is_ok() && resolve_commit(b).is_ok());
    let git_dir = Command::new("git")
        .args(["rev-parse", "--absolute-git-dir"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(io("finding the git directory"))?;
    if !git_dir.status.success() {
        return Err(PackError::Failed {
            commit: commit.to_string(),
        });
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&git_dir.stdout).trim());
    let spool = dir.join(format!(
        "nightshift-pack-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&spool)
        .map_err(io("making a spool file"))?;
    // Unlinked at once: the pack lives only as long as this descriptor.
    let _ = std::fs::remove_file(&spool);
    let out = file.try_clone().map_err(io("making a spool file"))?;
    let mut child = Command::new("git")
        .args(["pack-objects", "--stdout", "--revs", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::from(out))
        .stderr(Stdio::null())
        .spawn()
        .map_err(io("running git pack-objects"))?;
    let mut revs = format!("{commit}\n");
    if let Some(base) = base {
        revs.push_str(&format!("^{base}\n"));
    }
    let fed = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(revs.as_bytes()))
        .unwrap_or(Ok(()));
    let status = child.wait().map_err(io("running git pack-objects"))?;
    if fed.is_err() || !status.success() {
        return Err(PackError::Failed {
            commit: commit.to_string(),
        });
    }
    let len = file
        .seek(SeekFrom::End(0))
        .map_err(io("measuring the pack"))?;
    if len > MAX_PACK_BYTES {
        return Err(PackError::TooLarge {
            commit: commit.to_string(),
            bytes: len,
            limit: MAX_PACK_BYTES,
        });
    }
    file.seek(SeekFrom::Start(0))
        .map_err(io("rewinding the pack"))?;
    Ok(Pack { file, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refused before git runs (these never spawn it).
    #[test]
    fn a_name_that_reads_as_an_option_never_reaches_git() {
        for name in ["-", "--output=/tmp/x", "-h", "--all", ""] {
            assert!(
                matches!(resolve_commit(name), Err(ResolveError::Option { .. })),
                "{name:?}"
            );
        }
        let short = "a".repeat(39);
        for commit in ["--all", "-", "HEAD", "main", short.as_str()] {
            assert!(
                matches!(pack_objects(commit, None), Err(PackError::BadCommit { .. })),
                "{commit:?}"
            );
        }
    }
}
