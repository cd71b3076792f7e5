//! What the supervisor observes of a running sandbox from outside: cgroup
//! figures, the worktree's disk use, open files: figures the kernel keeps,
//! not anything the agent says.
//!
//! Invariants:
//! - Every observation is bounded and costs the same whatever the sandbox
//!   wrote: the worktree's use is its own filesystem's `statvfs` figures
//!   (`hostview::usage`), never a walk of the tree, so no name inside it is
//!   read, listed or followed while the sandbox runs (guarantee 3); the
//!   kernel bounds that filesystem, so a burst between two samples cannot
//!   outgrow it (`tests::a_full_worktree_filesystem_is_the_worktree_cap`,
//!   `tests/tests/caps.rs::a_directory_swapped_for_a_symlink_to_a_host_directory_is_never_counted`,
//!   `tests/tests/caps.rs::a_burst_past_the_worktree_cap_is_stopped_by_the_kernel`).
//! - Nothing here follows a symlink or opens a file the sandbox wrote: open
//!   files come from counting `/proc/PID/fd`.
//! - The cap decisions are pure functions of the figures ([`breach`]).

use std::time::Duration;

use orchestrator_cgroups::{CgroupFs, Layout, RealFs};

use crate::sandbox::Caps;

/// How often the cgroup figures and open files are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often the worktree's disk use is measured (one `statvfs`).
pub const WORKTREE_EVERY: Duration = Duration::from_secs(1);

/// One round of observations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Observed {
    pub memory_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub cpu_ns: Option<u64>,
    pub pids: Option<u64>,
    pub oom_kills: Option<u64>,
    pub max_open_files: Option<u64>,
    pub worktree_bytes: Option<u64>,
    /// Inodes the worktree uses, of those its filesystem holds.
    pub worktree_files: Option<(u64, u64)>,
}

/// A cap the run went past, with the figure that shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    pub cap: &'static str,
    pub limit: u64,
    pub observed: u64,
    pub detail: String,
}

/// A size for people: KiB under one MiB, whole MiB from 10 MiB.
pub fn mib(bytes: u64) -> String {
    let m = bytes as f64 / (1u64 << 20) as f64;
    if bytes < 1 << 20 {
        format!("{:.0} KiB", bytes as f64 / 1024.0)
    } else if m >= 10.0 && bytes.is_multiple_of(1 << 20) {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB")
    }
}

/// The caps a running sandbox has gone past, judged on observed figures.
/// Memory is not here: the kernel enforces it (OOM), judged after exit.
pub fn breach(caps: &Caps, seen: &Observed) -> Option<Breach> {
    if let Some(pids) = seen.pids {
        if caps.pids > 0 && pids >= caps.pids as u64 {
            return Some(Breach {
                cap: "pids",
                limit: caps.pids as u64,
                observed: pids,
                detail: format!("process cap {} ({pids} running)", caps.pids),
            });
        }
    }
    if let Some(files) = seen.max_open_files {
        if caps.open_files > 0 && files >= caps.open_files as u64 {
            return Some(Breach {
                cap: "open-files",
                limit: caps.open_files as u64,
                observed: files,
                detail: format!(
                    "open files cap {} (a process held {files})",
                    caps.open_files
                ),
            });
        }
    }
    if let Some(bytes) = seen.worktree_bytes {
        if bytes > caps.max_worktree_bytes {
            return Some(Breach {
                cap: "worktree",
                limit: caps.max_worktree_bytes,
                observed: bytes,
                detail: format!(
                    "worktree cap {} (observed {})",
                    mib(caps.max_worktree_bytes),
                    mib(bytes)
                ),
            });
        }
    }
    if let Some((files, total)) = seen.worktree_files {
        if total > 0 && files >= total {
            return Some(Breach {
                cap: "worktree",
                limit: caps.max_worktree_bytes,
                observed: seen.worktree_bytes.unwrap_or(0),
                detail: format!(
                    "worktree cap {} (observed {files} files, all it holds)",
                    mib(caps.max_worktree_bytes)
                ),
            });
        }
    }
    None
}

/// How many times the fleet's own memory limit was reached (v1
/// `memory.failcnt`, v2 `memory.events.local` max): it tells a fleet OOM from
/// a run's own.
pub fn fleet_memory_hits(layout: &Layout, fleet: &str) -> Option<u64> {
    match layout {
        Layout::V1 { root } => RealFs
            .read(&root.join("memory").join(fleet).join("memory.failcnt"))
            .ok()
            .and_then(|t| t.trim().parse().ok()),
        Layout::V2 { root } => RealFs
            .read(&root.join(fleet).join("memory.events.local"))
            .ok()
            .and_then(|t| orchestrator_cgroups::keyed_value(&t, "max").ok().flatten()),
    }
}

/// The fleet's memory high-water mark (v1 `memory.max_usage_in_bytes`, v2
/// `memory.peak`); on v1 it is reset to the current usage after reading, so
/// each run's ending judges only what happened since the previous one.
pub fn take_fleet_memory_peak(layout: &Layout, fleet: &str) -> Option<u64> {
    let path = match layout {
        Layout::V1 { root } => root
            .join("memory")
            .join(fleet)
            .join("memory.max_usage_in_bytes"),
        Layout::V2 { root } => root.join(fleet).join("memory.peak"),
    };
    let peak = RealFs.read(&path).ok()?.trim().parse().ok();
    if matches!(layout, Layout::V1 { .. }) {
        let _ = RealFs.write(&path, "0");
    }
    peak
}

/// What tells, at a run's ending, that the fleet's memory limit was
/// reached while the run was under it: the limit's hit counter before the
/// start and, on cgroup v1, an OOM notification registered on the fleet
/// (an eventfd on its `memory.oom_control`, through `cgroup.event_control`).
/// The kernel notifies a cgroup when it, or an ancestor, runs out of memory,
/// never for a sandbox's own cap below it; on this host's v1 the fleet's hit
/// counter stayed 0 through such a kill and Podman reports it as a plain
/// exit 137, so the notification is what names the fleet there
/// (`tests/tests/killswitch.rs::the_fleet_memory_cap_stops_a_run_and_says_so`,
/// on Docker and Podman; docs/engines.md).
#[derive(Debug, Default)]
pub struct FleetMemoryWatch {
    hits_before: Option<u64>,
    oom: Option<nix::sys::eventfd::EventFd>,
}

impl FleetMemoryWatch {
    /// Reads the counter and registers the notification (v1; on v2 the
    /// counter is hierarchical and enough). A registration that fails
    /// leaves the counter alone to tell, as before.
    pub fn begin(layout: &Layout, fleet: &str) -> Self {
        let oom = match layout {
            Layout::V1 { root } => register_oom(&root.join("memory").join(fleet)).ok(),
            Layout::V2 { .. } => None,
        };
        Self {
            hits_before: fleet_memory_hits(layout, fleet),
            oom,
        }
    }

    pub fn hits_before(&self) -> Option<u64> {
        self.hits_before
    }

    /// Whether the kernel notified the fleet of an OOM since [`Self::begin`]
    /// (reading takes the notification).
    pub fn oom_notified(&self) -> bool {
        self.oom
            .as_ref()
            .is_some_and(|efd| efd.read().is_ok_and(|n| n > 0))
    }
}

/// An eventfd the kernel signals when the memory cgroup `dir` (v1) runs out
/// of memory.
fn register_oom(dir: &std::path::Path) -> std::io::Result<nix::sys::eventfd::EventFd> {
    use nix::sys::eventfd::{EfdFlags, EventFd};
    use std::os::fd::AsRawFd;
    let efd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
    let control = std::fs::File::open(dir.join("memory.oom_control"))?;
    std::fs::write(
        dir.join("cgroup.event_control"),
        format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()),
    )?;
    Ok(efd)
}

/// Did the fleet reach its memory limit? Its hit counter moved, or its
/// high-water mark is within 2 MiB of the limit.
pub fn fleet_reached(
    hits_before: Option<u64>,
    hits_after: Option<u64>,
    fleet_peak: Option<u64>,
    fleet_limit: u64,
) -> bool {
    let counted = matches!((hits_before, hits_after), (Some(a), Some(b)) if b > a);
    let touched = fleet_peak.is_some_and(|p| p.saturating_add(2 << 20) >= fleet_limit);
    counted || touched
}

/// How a memory kill reads, once the run has ended with an OOM. The kernel
/// enforced one of two limits: the fleet's (its hit counter moved) or the
/// run's own, which the run then reached by definition.
pub fn memory_breach(
    caps: &Caps,
    fleet_memory: u64,
    peak: Option<u64>,
    fleet_reached: bool,
) -> Breach {
    let own_cap = caps.memory_bytes as u64;
    if !fleet_reached {
        let peak_v = peak.unwrap_or(0).max(own_cap);
        Breach {
            cap: "memory",
            limit: own_cap,
            observed: peak_v,
            detail: format!(
                "memory cap {} (peak {}, OOM)",
                mib(caps.memory_bytes as u64),
                mib(peak_v)
            ),
        }
    } else {
        let peak_v = peak.unwrap_or(0);
        Breach {
            cap: "fleet-memory",
            limit: fleet_memory,
            observed: peak_v,
            detail: format!(
                "fleet memory cap {} (this run's peak {}, OOM)",
                mib(fleet_memory),
                mib(peak_v)
            ),
        }
    }
}

/// The most file descriptors any process of the container holds.
pub fn max_open_files(layout: &Layout, fleet: &str, container: &str) -> Option<u64> {
    let procs = match layout {
        Layout::V1 { root } => root
            .join("pids")
            .join(fleet)
            .join(container)
            .join("cgroup.procs"),
        Layout::V2 { root } => root.join(fleet).join(container).join("cgroup.procs"),
    };
    let text = RealFs.read(&procs).ok()?;
    text.lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter_map(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).ok())
        .map(|d| d.count() as u64)
        .max()
}

/// The per-run cgroup a Podman sandbox's own lives in (`<fleet>/run-<id>`,
/// given as its cgroup parent): it outlives the container, whose cgroup
/// Podman removes as it exits, so the run's memory high-water mark and, on
/// cgroup v2, its OOM kills (counted up the hierarchy there) can still be
/// read after the exit.
pub fn run_cgroup_dir(run_id: &str) -> String {
    format!("run-{run_id}")
}

/// The memory high-water mark and OOM kill count of a run's cgroup
/// ([`run_cgroup_dir`]) under the fleet; `None` for what cannot be read
/// (v1 keeps no OOM count for a parent).
pub fn run_memory(layout: &Layout, fleet: &str, run_dir: &str) -> (Option<u64>, Option<u64>) {
    match layout {
        Layout::V1 { root } => {
            let dir = root.join("memory").join(fleet).join(run_dir);
            let read = |d: &std::path::Path| -> Option<u64> {
                RealFs
                    .read(&d.join("memory.max_usage_in_bytes"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
            };
            // Only the container's cgroup is under it: the Podman adapter
            // keeps conmon out (`cgroups_mode: no-conmon`).
            let peak = read(&dir);
            (peak, None)
        }
        Layout::V2 { root } => {
            let dir = root.join(fleet).join(run_dir);
            let peak = RealFs
                .read(&dir.join("memory.peak"))
                .ok()
                .and_then(|t| t.trim().parse().ok());
            let kills = RealFs.read(&dir.join("memory.events")).ok().and_then(|t| {
                orchestrator_cgroups::keyed_value(&t, "oom_kill")
                    .ok()
                    .flatten()
            });
            (peak, kills)
        }
    }
}

/// Removes a run's cgroup ([`run_cgroup_dir`]) in every hierarchy, once its
/// container is gone; what is not there is no error.
pub fn remove_run_cgroup(layout: &Layout, fleet: &str, run_dir: &str) {
    let dirs: Vec<std::path::PathBuf> = match layout {
        Layout::V1 { root } => std::fs::read_dir(root)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path().join(fleet).join(run_dir))
                    .collect()
            })
            .unwrap_or_default(),
        Layout::V2 { root } => vec![root.join(fleet).join(run_dir)],
    };
    // Podman removes the container's own cgroup a moment after it reports
    // the container gone: a bounded wait for the run's to empty (5 s; past
    // it the empty folder stays: docs/engines.md).
    for _ in 0..100 {
        let mut left = false;
        for dir in &dirs {
            if let Ok(children) = std::fs::read_dir(dir) {
                for child in children.filter_map(Result::ok) {
                    if child.file_type().is_ok_and(|t| t.is_dir()) {
                        let _ = std::fs::remove_dir(child.path());
                    }
                }
            }
            if std::fs::remove_dir(dir).is_err() && dir.exists() {
                left = true;
            }
        }
        if !left {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// One round of cgroup figures and open files for a container.
pub fn observe(layout: &Layout, fleet: &str, container: &str) -> Observed {
    let sample = orchestrator_cgroups::sample(&RealFs, layout, fleet, Some(container)).ok();
    Observed {
        memory_bytes: sample.as_ref().map(|s| s.memory_bytes),
        memory_peak_bytes: sample.as_ref().and_then(|s| s.memory_peak_bytes),
        cpu_ns: sample.as_ref().map(|s| s.cpu_ns),
        pids: sample.as_ref().map(|s| s.pids),
        oom_kills: sample.as_ref().and_then(|s| s.oom_kills),
        max_open_files: max_open_files(layout, fleet, container),
        worktree_bytes: None,
        worktree_files: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps {
            pids: 64,
            open_files: 256,
            max_worktree_bytes: 10 << 20,
            memory_bytes: 256 << 20,
            ..Caps::default()
        }
    }

    #[test]
    fn within_caps_is_no_breach() {
        let seen = Observed {
            pids: Some(63),
            max_open_files: Some(255),
            worktree_bytes: Some(10 << 20),
            ..Default::default()
        };
        assert_eq!(breach(&caps(), &seen), None);
    }

    #[test]
    fn each_cap_names_itself_and_the_figure() {
        let b = breach(
            &caps(),
            &Observed {
                pids: Some(64),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            (b.cap, b.detail.as_str()),
            ("pids", "process cap 64 (64 running)")
        );
        let b = breach(
            &caps(),
            &Observed {
                max_open_files: Some(300),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(b.cap, "open-files");
        assert!(b.detail.contains("300"));
        let b = breach(
            &caps(),
            &Observed {
                worktree_bytes: Some(11 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(b.detail, "worktree cap 10 MiB (observed 11 MiB)");
        assert_eq!(mib(100 << 10), "100 KiB");
        assert_eq!(mib((20 << 20) + 4096), "20.0 MiB");
    }

    #[test]
    fn memory_kill_is_attributed_to_the_cap_that_was_reached() {
        let own = memory_breach(&caps(), 1 << 30, Some(3 << 20), false);
        assert_eq!(own.detail, "memory cap 256 MiB (peak 256 MiB, OOM)");
        assert!(fleet_reached(Some(0), Some(1), None, 1 << 30));
        assert!(fleet_reached(
            Some(0),
            Some(0),
            Some((1 << 30) - 4096),
            1 << 30
        ));
        assert!(!fleet_reached(Some(0), Some(0), Some(512 << 20), 1 << 30));
        let fleet = memory_breach(&caps(), 1 << 30, Some(100 << 20), true);
        assert_eq!(fleet.cap, "fleet-memory");
        assert!(fleet.detail.contains("1024 MiB"), "{}", fleet.detail);
    }

    #[test]
    fn a_full_worktree_filesystem_is_the_worktree_cap() {
        let seen = Observed {
            worktree_files: Some((4096, 4096)),
            ..Default::default()
        };
        let b = breach(&caps(), &seen).unwrap();
        assert_eq!(b.cap, "worktree");
        assert_eq!(
            b.detail,
            "worktree cap 10 MiB (observed 4096 files, all it holds)"
        );
        let seen = Observed {
            worktree_files: Some((4095, 4096)),
            worktree_bytes: Some(1 << 20),
            ..Default::default()
        };
        assert_eq!(breach(&caps(), &seen), None);
    }
}
