//! Resource figures of the fleet or of one container, read from cgroupfs.
//!
//! Invariants:
//! - the parsers ([`parse_u64`], [`keyed_value`], [`parse_limit`]) are pure
//!   over the files' text; [`sample`] only reads and names the file that did
//!   not parse (`tests::gone_container_is_not_found_and_bad_files_are_named`);
//! - a figure the host does not offer is `None`, never a made-up 0:
//!   `memory.peak` before Linux 5.19, `oom_kill` before 4.13 (v1) / in old
//!   `memory.events`, and on v1 the fleet's own `oom_kills`, because v1
//!   counts a kill only in the killed process's own cgroup, never in its
//!   parents (the fleet would read 0 while its containers were killed)
//!   (`tests/recorded.rs::v2_before_memory_peak`,
//!   `tests/recorded.rs::v1_old_kernel_has_no_oom_kill_count`);
//! - `cpu_ns` is nanoseconds on both layouts (v2's microseconds × 1000);
//! - samples are taken no more often than [`MIN_SAMPLE_INTERVAL`] and no less
//!   often than [`MAX_SAMPLE_INTERVAL`] ([`sample_interval`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::{validate_name, CgroupError, CgroupFs, Layout};

pub const MIN_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_SAMPLE_INTERVAL: Duration = Duration::from_secs(60);

/// The interval to sample at, for a configured one: kept within
/// [`MIN_SAMPLE_INTERVAL`]..=[`MAX_SAMPLE_INTERVAL`].
pub fn sample_interval(requested: Duration) -> Duration {
    requested.clamp(MIN_SAMPLE_INTERVAL, MAX_SAMPLE_INTERVAL)
}

/// One reading of a cgroup's figures, fit for an observed-state audit entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Sample {
    /// Memory charged now (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub memory_bytes: u64,
    /// The high-water mark since the cgroup was made.
    pub memory_peak_bytes: Option<u64>,
    /// CPU time used, in nanoseconds.
    pub cpu_ns: u64,
    /// Processes and threads now.
    pub pids: u64,
    /// Processes killed by the out-of-memory killer.
    pub oom_kills: Option<u64>,
}

/// A file holding one unsigned number.
pub fn parse_u64(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse::<u64>()
        .map_err(|_| format!("expected an unsigned number, found {:?}", short(t)))
}

/// A limit file: `max` (v2, v1 pids) or `-1` is unlimited (`None`).
pub fn parse_limit(text: &str) -> Result<Option<u64>, String> {
    match text.trim() {
        "max" | "-1" => Ok(None),
        t => parse_u64(t).map(Some),
    }
}

/// The value of `key` in a flat-keyed file (`key value` lines, as
/// `memory.oom_control`, `memory.events`, `cpu.stat`); `None` when the key
/// is absent.
pub fn keyed_value(text: &str, key: &str) -> Result<Option<u64>, String> {
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if parts.next() != Some(key) {
            continue;
        }
        let value = parts.next().unwrap_or("");
        if parts.next().is_some() {
            return Err(format!("line {:?} has more than two fields", short(line)));
        }
        return value.parse::<u64>().map(Some).map_err(|_| {
            format!(
                "{key}: expected an unsigned number, found {:?}",
                short(value)
            )
        });
    }
    Ok(None)
}

fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

fn read(fs: &impl CgroupFs, path: &Path) -> Result<String, CgroupError> {
    fs.read(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parsed<T>(path: &Path, r: Result<T, String>) -> Result<T, CgroupError> {
    r.map_err(|reason| CgroupError::Parse {
        path: path.to_path_buf(),
        reason,
    })
}

fn read_u64(fs: &impl CgroupFs, path: &Path) -> Result<u64, CgroupError> {
    parsed(path, parse_u64(&read(fs, path)?))
}

fn read_u64_if_present(fs: &impl CgroupFs, path: &Path) -> Result<Option<u64>, CgroupError> {
    if !fs.exists(path) {
        return Ok(None);
    }
    read_u64(fs, path).map(Some)
}

fn read_keyed(fs: &impl CgroupFs, path: &Path, key: &str) -> Result<Option<u64>, CgroupError> {
    parsed(path, keyed_value(&read(fs, path)?, key))
}

fn cgroup_dir(base: PathBuf, fleet: &str, container: Option<&str>) -> PathBuf {
    let dir = base.join(fleet);
    match container {
        Some(id) => dir.join(id),
        None => dir,
    }
}

/// Reads the figures of `container_id`'s cgroup under the fleet, or of the
/// whole fleet when `None`. A container (or fleet) without a cgroup is
/// [`CgroupError::NotFound`]: it has ended or was never under this fleet.
/// `container_id` is the engine's full id (the cgroupfs driver's name).
pub fn sample(
    fs: &impl CgroupFs,
    layout: &Layout,
    fleet_name: &str,
    container_id: Option<&str>,
) -> Result<Sample, CgroupError> {
    validate_name(fleet_name)?;
    // A container's cgroup may sit one level down, in its run's own
    // (`run-<id>/libpod-<id>` on Podman): each segment is a name.
    if let Some(id) = container_id {
        let segments: Vec<&str> = id.split('/').collect();
        if segments.len() > 2 {
            validate_name(id)?;
        }
        for segment in segments {
            validate_name(segment)?;
        }
    }
    match layout {
        Layout::V1 { root } => {
            let dir = |h: &str| cgroup_dir(root.join(h), fleet_name, container_id);
            let memory = dir("memory");
            if !fs.exists(&memory) {
                return Err(CgroupError::NotFound { path: memory });
            }
            let oom_kills = match container_id {
                Some(_) => read_keyed(fs, &memory.join("memory.oom_control"), "oom_kill")?,
                None => None,
            };
            Ok(Sample {
                memory_bytes: read_u64(fs, &memory.join("memory.usage_in_bytes"))?,
                memory_peak_bytes: read_u64_if_present(
                    fs,
                    &memory.join("memory.max_usage_in_bytes"),
                )?,
                cpu_ns: read_u64(fs, &dir("cpuacct").join("cpuacct.usage"))?,
                pids: read_u64(fs, &dir("pids").join("pids.current"))?,
                oom_kills,
            })
        }
        Layout::V2 { root } => {
            let dir = cgroup_dir(root.clone(), fleet_name, container_id);
            if !fs.exists(&dir) {
                return Err(CgroupError::NotFound { path: dir });
            }
            let cpu_stat = dir.join("cpu.stat");
            let usage_usec =
                read_keyed(fs, &cpu_stat, "usage_usec")?.ok_or_else(|| CgroupError::Parse {
                    path: cpu_stat.clone(),
                    reason: "no usage_usec line".into(),
                })?;
            Ok(Sample {
                memory_bytes: read_u64(fs, &dir.join("memory.current"))?,
                memory_peak_bytes: read_u64_if_present(fs, &dir.join("memory.peak"))?,
                cpu_ns: usage_usec.saturating_mul(1000),
                pids: read_u64(fs, &dir.join("pids.current"))?,
                oom_kills: read_keyed(fs, &dir.join("memory.events"), "oom_kill")?,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeFs;

    #[test]
    fn numbers_and_limits() {
        assert_eq!(parse_u64("42\n"), Ok(42));
        assert!(parse_u64("").is_err());
        assert!(parse_u64("-1").is_err());
        assert!(parse_u64("18446744073709551616").is_err(), "overflow");
        assert_eq!(parse_limit("max\n"), Ok(None));
        assert_eq!(parse_limit("-1\n"), Ok(None));
        assert_eq!(parse_limit("64\n"), Ok(Some(64)));
        assert!(parse_limit("lots").is_err());
    }

    #[test]
    fn keyed_values() {
        let text = "oom_kill_disable 0\nunder_oom 1\noom_kill 3\n";
        assert_eq!(keyed_value(text, "oom_kill"), Ok(Some(3)));
        assert_eq!(keyed_value(text, "under_oom"), Ok(Some(1)));
        assert_eq!(keyed_value(text, "oom"), Ok(None), "whole keys only");
        assert!(keyed_value("oom_kill x\n", "oom_kill").is_err());
        assert!(keyed_value("oom_kill 1 2\n", "oom_kill").is_err());
        assert!(keyed_value("oom_kill\n", "oom_kill").is_err());
    }

    #[test]
    fn interval_is_bounded() {
        assert_eq!(sample_interval(Duration::ZERO), MIN_SAMPLE_INTERVAL);
        assert_eq!(
            sample_interval(Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(
            sample_interval(Duration::from_secs(3600)),
            MAX_SAMPLE_INTERVAL
        );
    }

    #[test]
    fn gone_container_is_not_found_and_bad_files_are_named() {
        let fs = FakeFs::v1_host();
        let layout = crate::detect(&fs).unwrap();
        crate::ensure_fleet(&fs, &layout, "nsf", Default::default()).unwrap();
        let err = sample(&fs, &layout, "nsf", Some("abc")).unwrap_err();
        assert!(matches!(err, CgroupError::NotFound { .. }), "{err}");
        fs.set("/sys/fs/cgroup/pids/nsf/pids.current", "lots\n");
        let err = sample(&fs, &layout, "nsf", None).unwrap_err();
        assert!(
            err.to_string()
                .contains("/sys/fs/cgroup/pids/nsf/pids.current"),
            "{err}"
        );
        assert!(matches!(
            sample(&fs, &layout, "nsf", Some("../..")),
            Err(CgroupError::InvalidName { .. })
        ));
        // One level down (a Podman run's own cgroup) is a path of names;
        // deeper, or a segment that is no name, is refused.
        assert!(matches!(
            sample(&fs, &layout, "nsf", Some("run-1/libpod-abc")),
            Err(CgroupError::NotFound { .. })
        ));
        for bad in ["a/b/c", "run-1/..", "/abs", "run-1/"] {
            assert!(
                matches!(
                    sample(&fs, &layout, "nsf", Some(bad)),
                    Err(CgroupError::InvalidName { .. })
                ),
                "{bad}"
            );
        }
    }
}
