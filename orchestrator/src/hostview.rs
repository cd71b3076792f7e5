//! The host side of Tier 0: the worktree's own `nosuid,nodev` mount, and
//! what the supervisor reads on the host for the attestation (its accounts,
//! its mount table).
//!
//! Why a mount of our own: Docker's bind mounts take no `nosuid`/`nodev`
//! option, and the engine's `local` volume driver (`type=none,o=bind,nosuid`)
//! drops both on a bind (and copies the image's ownership onto the host
//! directory); both checked on Docker 20.10 with runc 1.1. A bind mount is a
//! copy of the mount it is made from, flags included, and runc adds no
//! option to a plain rw bind: so the worktree is bound onto itself and
//! remounted `nosuid,nodev` before the container is created, and the
//! sandbox's `/workspace` is that. Setuid bits and device files in the
//! worktree then mean nothing on the host either.
//!
//! The engine resolves the bind's source in its own mount namespace: it
//! must be the supervisor's (as with a local `dockerd`) or receive its mounts
//! (a slave of it), which is why the mount keeps its parent's propagation
//! rather than being made private. The probes in `tests/sandbox_probes.rs`
//! check the effect from inside a real sandbox.
//!
//! Invariants:
//! - [`protect_worktree`] runs before the container is created; the
//!   attestation observes the result ([`observe`]) before the agent starts.
//! - Every path that removes a worktree goes through [`remove_worktree`],
//!   which first releases the mount (lazy unmount: a sandbox still holding
//!   it never blocks it, and no symlink is followed), so no ending (the
//!   run's own, the kill switch's, reconciliation after `kill -9`) leaves a
//!   mount behind or is blocked by one. Releasing is idempotent.

use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use orchestrator_attest::{mount_of, HostAccounts, HostObserved, MountEntry};

const MOUNTINFO: &str = "/proc/self/mountinfo";

fn read_optional(path: &str) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("reading {path}: {e}")),
    }
}

/// The host's accounts, groups and delegated id ranges.
pub fn read_accounts() -> Result<HostAccounts, String> {
    Ok(HostAccounts::parse(
        &read_optional("/etc/passwd")?,
        &read_optional("/etc/group")?,
        &read_optional("/etc/subuid")?,
        &read_optional("/etc/subgid")?,
    ))
}

/// The mount the path lies on, from this process's mount table (which
/// names mount points by their real paths).
pub fn mount_at(path: &Path) -> Option<MountEntry> {
    let info = std::fs::read_to_string(MOUNTINFO).ok()?;
    mount_of(&info, real(path).to_str()?)
}

fn real(path: &Path) -> std::path::PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// What the attestation needs from the host for a run's worktree.
pub fn observe(worktree: &Path) -> Result<HostObserved, String> {
    Ok(HostObserved {
        accounts: read_accounts()?,
        worktree_mount: mount_at(worktree),
    })
}

fn is_own_mount(path: &Path) -> bool {
    mount_at(path).is_some_and(|m| Some(m.mount_point.as_str()) == real(path).to_str())
}

/// Binds the worktree onto itself and makes that mount `nosuid,nodev`.
pub fn protect_worktree(path: &Path) -> Result<(), String> {
    let doing = |what: &str, e: nix::Error| {
        format!(
            "{what} {} (the worktree's nosuid,nodev mount; the supervisor must run as root): {e}",
            path.display()
        )
    };
    if !is_own_mount(path) {
        mount(
            Some(path),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| doing("binding", e))?;
    }
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| {
        let _ = release_worktree(path);
        doing("remounting nosuid,nodev", e)
    })
}

/// Unmounts every mount at the worktree's path (lazily, never following a
/// symlink). Nothing mounted there is not an error.
pub fn release_worktree(path: &Path) -> Result<(), String> {
    // Bounded: each pass removes the top mount; more than a few means
    // something else keeps mounting there, which is reported.
    for _ in 0..16 {
        if !is_own_mount(path) {
            return Ok(());
        }
        umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW)
            .map_err(|e| format!("unmounting {}: {e}", path.display()))?;
    }
    Err(format!(
        "unmounting {}: still a mount point after 16 unmounts",
        path.display()
    ))
}

/// Releases the worktree's mount, then removes the worktree.
pub fn remove_worktree(path: &Path) -> Result<(), String> {
    release_worktree(path)?;
    orchestrator_git::remove_worktree(path).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        nix::unistd::Uid::effective().is_root()
    }

    #[test]
    fn protect_then_remove_leaves_no_mount() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path().join("wt");
        std::fs::create_dir(&wt).unwrap();
        protect_worktree(&wt).unwrap();
        protect_worktree(&wt).unwrap();
        let m = mount_at(&wt).unwrap();
        assert_eq!(Path::new(&m.mount_point), real(&wt));
        assert!(m.has("nosuid") && m.has("nodev"), "{m:?}");
        // A second bind stacked by someone else is released too.
        mount(Some(&wt), &wt, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        release_worktree(&wt).unwrap();
        assert!(!is_own_mount(&wt));
        release_worktree(&wt).unwrap();
        protect_worktree(&wt).unwrap();
        std::fs::write(wt.join("f"), "x").unwrap();
        remove_worktree(&wt).unwrap();
        assert!(!wt.exists());
        assert!(!is_own_mount(&wt));
    }
}
