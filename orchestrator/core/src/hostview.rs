//! The host side of Tier 0: the worktree's own filesystem and its
//! `nosuid,nodev` mount, and what the supervisor reads on the host for the
//! attestation (its accounts, its mount table).
//!
//! Why a filesystem of its own: the worktree cap is enforced by the kernel
//! and measured without reading a name the sandbox controls. Each run's
//! worktree is an ext4 filesystem in a sparse image file beside it
//! (`STATE/worktrees/<id>.img`), sized for the cap ([`fs_plan`]: the cap,
//! the filesystem's own metadata and a small slack) with a bounded number
//! of inodes, loop-mounted `nosuid,nodev` at `STATE/worktrees/<id>` before
//! the worktree is written into it. A write past it fails in the sandbox
//! (`ENOSPC`), so a burst between two samples cannot outgrow it; the
//! supervisor reads the figures with `statvfs` on the mount's root
//! ([`usage`]), which no one inside can rename or replace, and never walks
//! the tree while the sandbox can change it (an agent swapping a directory
//! for a symlink to a host directory cannot make the host count that)
//! (`tests::a_worktree_fs_is_bounded_by_the_kernel_and_leaves_nothing`,
//! `tests/tests/caps.rs::a_burst_past_the_worktree_cap_is_stopped_by_the_kernel`,
//! `tests/tests/caps.rs::a_directory_swapped_for_a_symlink_to_a_host_directory_is_never_counted`).
//! The loop device is set up with autoclear (`mount -o loop`), so the
//! unmount that [`release_worktree`] does (lazily) also frees it, whoever
//! unmounts: the run's ending, the kill switch, reconciliation after
//! `kill -9`.
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
//!   mount behind or is blocked by one. Releasing is idempotent
//!   (`tests::protect_then_remove_leaves_no_mount`,
//!   `tests/tests/sandbox_probes.rs::no_ending_leaves_the_worktree_mount_behind`).
//! - The image goes with its worktree: [`remove_worktree`] unmounts, removes
//!   the image, then the (empty) mount point, in that order, so a removal cut
//!   short leaves a directory that the next one finds rather than an image
//!   without one (no test cuts a removal short).
//! - A kept worktree (its import failed) stays mounted; one found unmounted
//!   with its image (after a reboot) is mounted again read-only for its
//!   import ([`mount_kept`];
//!   `tests::a_kept_worktree_unmounted_by_a_reboot_is_mounted_again_read_only`).
//!
//! The lifecycle reaches all of this through the [`HostView`] port, held by
//! its supervisor: [`RealHost`] in production (the functions here),
//! [`fake::FakeHost`] in the lifecycle's unit tests, which records the mounts
//! it is asked for and so runs without root.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// Releases the worktree's mount, removes its filesystem's image, then the
/// worktree's directory (an empty mount point once released).
pub fn remove_worktree(path: &Path) -> Result<(), String> {
    release_worktree(path)?;
    let image = image_of(path);
    match std::fs::remove_file(&image) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing {}: {e}", image.display())),
    }
    orchestrator_git::remove_worktree(path).map_err(|e| e.to_string())
}

/// The image file of a worktree's filesystem: `STATE/worktrees/<id>.img`.
pub fn image_of(worktree: &Path) -> PathBuf {
    let mut name = worktree.file_name().unwrap_or_default().to_os_string();
    name.push(".img");
    worktree.with_file_name(name)
}

/// The shape of a worktree's filesystem for a cap of `cap` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsPlan {
    /// The image's size: the cap, the inode tables and a slack for the rest
    /// of the metadata and for the cap to be seen passed.
    pub image_bytes: u64,
    /// Inodes asked of mkfs (it may round up to fill its groups).
    pub inodes: u64,
}

/// One inode for every 8 KiB of the cap (at least 4096, at most 4 Mi): a
/// flood of empty files meets the kernel's bound as a flood of bytes does.
pub const BYTES_PER_INODE: u64 = 8 << 10;
/// mkfs makes inodes of this size (ext4's default).
const INODE_SIZE: u64 = 256;

/// The filesystem for a cap (pure).
pub fn fs_plan(cap: u64) -> FsPlan {
    let inodes = (cap / BYTES_PER_INODE).clamp(4096, 4 << 20);
    // ext4 keeps some blocks back (for delayed allocation): the slack
    // covers them, so that what the sandbox can write passes the cap.
    let slack = inodes * INODE_SIZE + cap / 32 + (4 << 20);
    FsPlan {
        image_bytes: cap.saturating_add(slack),
        inodes,
    }
}

/// What a worktree's filesystem holds, from `statvfs` of its root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes in use (allocated blocks, metadata included).
    pub bytes: u64,
    /// Inodes in use.
    pub files: u64,
    /// Inodes the filesystem has.
    pub files_total: u64,
    /// Which filesystem: a figure of another (the worktree unmounted) is
    /// never taken for the worktree's.
    pub fsid: u64,
}

impl Usage {
    /// What the worktree added to an empty filesystem (`self` then `empty`).
    pub fn since(&self, empty: &Usage) -> Option<Usage> {
        (self.fsid == empty.fsid).then(|| Usage {
            bytes: self.bytes.saturating_sub(empty.bytes),
            files: self.files.saturating_sub(empty.files),
            files_total: self.files_total.saturating_sub(empty.files),
            fsid: self.fsid,
        })
    }
}

/// The figures of the filesystem mounted at `worktree` (its root: a name
/// the sandbox cannot change; nothing under it is read).
pub fn usage(worktree: &Path) -> Result<Usage, String> {
    let st = nix::sys::statvfs::statvfs(worktree)
        .map_err(|e| format!("statvfs {}: {e}", worktree.display()))?;
    let unit = st.fragment_size() as u64;
    let blocks = (st.blocks() as u64).saturating_sub(st.blocks_free() as u64);
    Ok(Usage {
        bytes: blocks.saturating_mul(unit),
        files: (st.files() as u64).saturating_sub(st.files_free() as u64),
        files_total: st.files() as u64,
        fsid: st.filesystem_id() as u64,
    })
}

/// A system tool by its absolute path (never found through `PATH`: the
/// supervisor runs as root).
fn system_tool(program: &str) -> Result<PathBuf, String> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!("{program} not found in /usr/sbin, /sbin, /usr/bin or /bin (install e2fsprogs and mount)")
        })
}

fn tool(program: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let out = Command::new(system_tool(program)?)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| format!("running {program} (e2fsprogs and util-linux are needed): {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(format!(
        "{program} failed ({}): {}",
        out.status,
        err.trim().chars().take(400).collect::<String>()
    ))
}

/// Makes the worktree's own filesystem for a cap of `cap` bytes and mounts
/// it `nosuid,nodev` at `worktree` (which must not exist; its parent must),
/// empty and owned by root. Returns its figures when empty. On failure
/// nothing is left.
pub fn make_worktree_fs(worktree: &Path, cap: u64) -> Result<Usage, String> {
    let plan = fs_plan(cap);
    let image = image_of(worktree);
    std::fs::create_dir(worktree).map_err(|e| format!("creating {}: {e}", worktree.display()))?;
    let made = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&image)
            .map_err(|e| format!("creating {}: {e}", image.display()))?;
        file.set_len(plan.image_bytes)
            .map_err(|e| format!("sizing {}: {e}", image.display()))?;
        drop(file);
        let inodes = plan.inodes.to_string();
        tool(
            "mkfs.ext4",
            &[
                "-q".as_ref(),
                "-F".as_ref(),
                // A throwaway filesystem: no journal, nothing reserved.
                "-O".as_ref(),
                "^has_journal".as_ref(),
                "-m".as_ref(),
                "0".as_ref(),
                "-N".as_ref(),
                inodes.as_ref(),
                "-E".as_ref(),
                "root_owner=0:0,nodiscard".as_ref(),
                image.as_os_str(),
            ],
        )?;
        tool(
            "mount",
            &[
                "-t".as_ref(),
                "ext4".as_ref(),
                "-o".as_ref(),
                // noinit_itable: the kernel would otherwise zero every
                // inode table in the background, writing the image full
                // of them (64 MiB for the default 2 GiB cap).
                "loop,nosuid,nodev,noatime,noinit_itable".as_ref(),
                image.as_os_str(),
                worktree.as_os_str(),
            ],
        )?;
        // mkfs's lost+found would otherwise be part of the run's work.
        std::fs::remove_dir(worktree.join("lost+found"))
            .map_err(|e| format!("removing lost+found in {}: {e}", worktree.display()))?;
        usage(worktree)
    })();
    if made.is_err() {
        let _ = remove_worktree(worktree);
    }
    made
}

/// Mounts a kept worktree's filesystem again (read-only) when it has an
/// image and is not mounted (after a reboot): its import reads the files.
/// A worktree without an image (made before the worktree had its own
/// filesystem) or already mounted is left as it is.
pub fn mount_kept(worktree: &Path) -> Result<(), String> {
    let image = image_of(worktree);
    if !image.exists() || is_own_mount(worktree) {
        return Ok(());
    }
    tool(
        "mount",
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            "loop,ro,nosuid,nodev,noexec".as_ref(),
            image.as_os_str(),
            worktree.as_os_str(),
        ],
    )
}

/// What a run's lifecycle does to the host and reads from it: the worktree's
/// filesystem and mount, and what the attestation observes. Blocking calls
/// (the lifecycle makes them from `spawn_blocking`).
pub trait HostView: std::fmt::Debug + Send + Sync {
    /// [`read_accounts`].
    fn read_accounts(&self) -> Result<HostAccounts, String>;
    /// [`observe`].
    fn observe(&self, worktree: &Path) -> Result<HostObserved, String>;
    /// [`make_worktree_fs`].
    fn make_worktree_fs(&self, worktree: &Path, cap: u64) -> Result<Usage, String>;
    /// [`protect_worktree`].
    fn protect_worktree(&self, worktree: &Path) -> Result<(), String>;
    /// [`usage`].
    fn usage(&self, worktree: &Path) -> Result<Usage, String>;
    /// [`mount_kept`].
    fn mount_kept(&self, worktree: &Path) -> Result<(), String>;
    /// [`remove_worktree`].
    fn remove_worktree(&self, worktree: &Path) -> Result<(), String>;
}

/// This host, through the functions of this module (root is needed to mount).
#[derive(Debug, Clone, Copy, Default)]
pub struct RealHost;

impl HostView for RealHost {
    fn read_accounts(&self) -> Result<HostAccounts, String> {
        read_accounts()
    }
    fn observe(&self, worktree: &Path) -> Result<HostObserved, String> {
        observe(worktree)
    }
    fn make_worktree_fs(&self, worktree: &Path, cap: u64) -> Result<Usage, String> {
        make_worktree_fs(worktree, cap)
    }
    fn protect_worktree(&self, worktree: &Path) -> Result<(), String> {
        protect_worktree(worktree)
    }
    fn usage(&self, worktree: &Path) -> Result<Usage, String> {
        usage(worktree)
    }
    fn mount_kept(&self, worktree: &Path) -> Result<(), String> {
        mount_kept(worktree)
    }
    fn remove_worktree(&self, worktree: &Path) -> Result<(), String> {
        remove_worktree(worktree)
    }
}

pub mod fake {
    //! A host in memory: a worktree's filesystem is a plain directory, its
    //! mounts a table here, every call recorded; the host has the accounts
    //! a test gives it. Needs no root.

    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use orchestrator_attest::{HostAccounts, HostObserved, MountEntry};

    use super::{HostView, Usage};

    /// The options of the fake's mounts, as the real ones read in mountinfo.
    const PROTECTED: [&str; 4] = ["rw", "nosuid", "nodev", "noatime"];
    /// The filesystem a worktree lies on when nothing is mounted at it.
    const PARENT: &str = "/";

    #[derive(Debug, Default)]
    pub struct FakeHost {
        /// `mkfs PATH` / `protect PATH` / `mount-kept PATH` / `remove PATH`,
        /// in the order asked.
        pub calls: Mutex<Vec<String>>,
        /// What is mounted at each worktree now, with its options.
        pub mounts: Mutex<BTreeMap<PathBuf, Vec<String>>>,
        /// The host's accounts.
        pub accounts: HostAccounts,
        /// A kernel that mounts without `nosuid,nodev` whatever is asked.
        pub ignores_nosuid: bool,
    }

    impl FakeHost {
        pub fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }

        pub fn mounted(&self) -> Vec<PathBuf> {
            self.mounts.lock().unwrap().keys().cloned().collect()
        }

        fn call(&self, what: &str, path: &Path) {
            self.calls
                .lock()
                .unwrap()
                .push(format!("{what} {}", path.display()));
        }

        fn mount(&self, path: &Path, options: &[&str]) {
            let options = options
                .iter()
                .filter(|o| !(self.ignores_nosuid && matches!(**o, "nosuid" | "nodev")))
                .map(|o| o.to_string())
                .collect();
            self.mounts
                .lock()
                .unwrap()
                .insert(path.to_path_buf(), options);
        }
    }

    impl HostView for FakeHost {
        fn read_accounts(&self) -> Result<HostAccounts, String> {
            Ok(self.accounts.clone())
        }

        fn observe(&self, worktree: &Path) -> Result<HostObserved, String> {
            let mounts = self.mounts.lock().unwrap();
            let worktree_mount = Some(match mounts.get(worktree) {
                Some(options) => MountEntry {
                    mount_point: worktree.display().to_string(),
                    options: options.clone(),
                    fs_type: "ext4".into(),
                },
                None => MountEntry {
                    mount_point: PARENT.into(),
                    options: vec!["rw".into(), "relatime".into()],
                    fs_type: "ext4".into(),
                },
            });
            Ok(HostObserved {
                accounts: self.accounts.clone(),
                worktree_mount,
            })
        }

        fn make_worktree_fs(&self, worktree: &Path, cap: u64) -> Result<Usage, String> {
            self.call("mkfs", worktree);
            std::fs::create_dir(worktree)
                .map_err(|e| format!("creating {}: {e}", worktree.display()))?;
            self.mount(worktree, &PROTECTED);
            Ok(Usage {
                files: 1,
                files_total: super::fs_plan(cap).inodes,
                ..Usage::default()
            })
        }

        fn protect_worktree(&self, worktree: &Path) -> Result<(), String> {
            self.call("protect", worktree);
            self.mount(worktree, &PROTECTED);
            Ok(())
        }

        /// The empty figure while the worktree is mounted (what it holds is
        /// not counted here), none of another filesystem otherwise.
        fn usage(&self, worktree: &Path) -> Result<Usage, String> {
            let mounted = self.mounts.lock().unwrap().contains_key(worktree);
            Ok(Usage {
                files: 1,
                fsid: u64::from(!mounted),
                ..Usage::default()
            })
        }

        fn mount_kept(&self, worktree: &Path) -> Result<(), String> {
            self.call("mount-kept", worktree);
            if worktree.is_dir() && !self.mounts.lock().unwrap().contains_key(worktree) {
                self.mount(worktree, &["ro", "nosuid", "nodev", "noexec"]);
            }
            Ok(())
        }

        fn remove_worktree(&self, worktree: &Path) -> Result<(), String> {
            self.call("remove", worktree);
            self.mounts.lock().unwrap().remove(worktree);
            orchestrator_git::remove_worktree(worktree).map_err(|e| e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These tests mount, so they need root: without it they are skipped,
    /// said on stderr, unless the host is required to run them
    /// (`NIGHTSHIFT_REQUIRE_HOST_TESTS=1`, set by `scripts/test.sh`).
    fn root(test: &str) -> bool {
        if nix::unistd::Uid::effective().is_root() {
            return true;
        }
        if std::env::var("NIGHTSHIFT_REQUIRE_HOST_TESTS").as_deref() == Ok("1") {
            panic!("{test} needs root, and NIGHTSHIFT_REQUIRE_HOST_TESTS=1 requires it to run");
        }
        // Straight to stderr: libtest's capture would hide it under a pass.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("SKIPPED {test}: it mounts, which needs root\n").as_bytes(),
        );
        false
    }

    #[test]
    fn protect_then_remove_leaves_no_mount() {
        if !root("protect_then_remove_leaves_no_mount") {
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

    /// The loop devices backed by files under `dir`.
    fn loops_under(dir: &Path) -> Vec<String> {
        let out = Command::new("losetup").arg("-a").output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(dir.to_str().unwrap()))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_kept_worktree_unmounted_by_a_reboot_is_mounted_again_read_only() {
        if !root("a_kept_worktree_unmounted_by_a_reboot_is_mounted_again_read_only") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path().join("r2");
        make_worktree_fs(&wt, 4 << 20).unwrap();
        std::fs::write(wt.join("work.txt"), "kept\n").unwrap();
        // What a reboot leaves: the image, an empty mount point.
        release_worktree(&wt).unwrap();
        assert!(!wt.join("work.txt").exists());
        mount_kept(&wt).unwrap();
        assert_eq!(
            std::fs::read_to_string(wt.join("work.txt")).unwrap(),
            "kept\n"
        );
        let m = mount_at(&wt).unwrap();
        assert!(m.has("ro") && m.has("nosuid") && m.has("nodev"), "{m:?}");
        mount_kept(&wt).unwrap();
        remove_worktree(&wt).unwrap();
        assert!(!wt.exists() && !image_of(&wt).exists());
        assert!(loops_under(dir.path()).is_empty(), "loop device left");
    }

    #[test]
    fn a_plan_holds_the_cap_and_bounds_inodes() {
        let p = fs_plan(24 << 20);
        assert_eq!(p.inodes, 4096);
        assert!(
            p.image_bytes > 24 << 20 && p.image_bytes < 30 << 20,
            "{p:?}"
        );
        let p = fs_plan(2 << 30);
        assert_eq!(p.inodes, (2 << 30) / BYTES_PER_INODE);
        assert!(p.image_bytes < (2 << 30) + (2 << 30) / 8, "{p:?}");
    }

    #[test]
    fn a_worktree_fs_is_bounded_by_the_kernel_and_leaves_nothing() {
        if !root("a_worktree_fs_is_bounded_by_the_kernel_and_leaves_nothing") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path().join("r1");
        let empty = make_worktree_fs(&wt, 4 << 20).unwrap();
        assert!(!wt.join("lost+found").exists());
        let m = mount_at(&wt).unwrap();
        assert!(m.has("nosuid") && m.has("nodev"), "{m:?}");
        protect_worktree(&wt).unwrap();
        // A write past the filesystem fails; the figure shows the cap passed.
        let mut big = std::fs::File::create(wt.join("big")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let full = (0..16)
            .map(|_| std::io::Write::write_all(&mut big, &chunk))
            .find_map(Result::err);
        drop(big);
        assert_eq!(
            full.unwrap().raw_os_error(),
            Some(nix::libc::ENOSPC),
            "the kernel stops the write"
        );
        let used = usage(&wt).unwrap().since(&empty).unwrap();
        assert!(used.bytes > 4 << 20, "{used:?}");
        assert!(used.bytes < fs_plan(4 << 20).image_bytes, "{used:?}");
        // A symlink to a large host directory counts for its own few bytes.
        std::fs::remove_file(wt.join("big")).unwrap();
        std::os::unix::fs::symlink("/usr", wt.join("usr")).unwrap();
        let used = usage(&wt).unwrap().since(&empty).unwrap();
        assert!(used.bytes < 64 << 10, "{used:?}");
        assert_eq!(loops_under(dir.path()).len(), 1);
        remove_worktree(&wt).unwrap();
        assert!(!wt.exists() && !image_of(&wt).exists());
        assert!(loops_under(dir.path()).is_empty(), "loop device left");
        // Unmounted, a figure of the parent's filesystem is never the worktree's.
        std::fs::create_dir(&wt).unwrap();
        assert_eq!(usage(&wt).unwrap().since(&empty), None);
    }
}
