//! Which cgroup layout the host has, and where it is mounted.
//!
//! Invariants:
//! - a host whose `memory` controller is on a v1 hierarchy is [`Layout::V1`],
//!   even when a cgroup2 mount exists beside it (the "hybrid" layout of
//!   systemd hosts: the unified mount there holds no resource controllers);
//! - [`Layout::V1`]'s `root` is the directory holding one directory per
//!   controller (`root/memory`, `root/cpu`, `root/cpuacct`, `root/pids`;
//!   co-mounted controllers are reached through the symlinks hosts provide);
//! - [`Layout::V2`]'s `root` is the cgroup2 mount point;
//! - [`layout_from_mountinfo`] is pure; [`detect`] reads `/proc/self/mountinfo`
//!   and only probes `/sys/fs/cgroup` when that cannot be read
//!   (`tests::detect_uses_mountinfo_then_probes`).

use std::path::{Path, PathBuf};

use crate::{CgroupError, CgroupFs};

const MOUNTINFO: &str = "/proc/self/mountinfo";
const DEFAULT_ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    V1 { root: PathBuf },
    V2 { root: PathBuf },
}

impl Layout {
    pub fn root(&self) -> &Path {
        match self {
            Layout::V1 { root } | Layout::V2 { root } => root,
        }
    }
}

/// Finds the host's cgroup layout.
pub fn detect(fs: &impl CgroupFs) -> Result<Layout, CgroupError> {
    if let Ok(text) = fs.read(Path::new(MOUNTINFO)) {
        return layout_from_mountinfo(&text).ok_or(CgroupError::NoCgroups);
    }
    let root = Path::new(DEFAULT_ROOT);
    if fs.exists(&root.join("cgroup.controllers")) {
        Ok(Layout::V2 {
            root: root.to_path_buf(),
        })
    } else if fs.exists(&root.join("memory")) {
        Ok(Layout::V1 {
            root: root.to_path_buf(),
        })
    } else {
        Err(CgroupError::NoCgroups)
    }
}

/// The layout described by a `/proc/<pid>/mountinfo` text, if any. Lines that
/// do not parse are skipped: they cannot be cgroup mounts we could use.
pub fn layout_from_mountinfo(text: &str) -> Option<Layout> {
    let mut v2: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = before.split_whitespace().nth(4) else {
            continue;
        };
        let mount_point = PathBuf::from(unescape(mount_point));
        let mut after = after.split_whitespace();
        let (Some(fstype), Some(_source), Some(options)) =
            (after.next(), after.next(), after.next())
        else {
            continue;
        };
        match fstype {
            "cgroup" if options.split(',').any(|o| o == "memory") => {
                let root = mount_point.parent()?.to_path_buf();
                return Some(Layout::V1 { root });
            }
            "cgroup2" => v2.push(mount_point),
            _ => {}
        }
    }
    let preferred = v2.iter().position(|p| p == Path::new(DEFAULT_ROOT));
    let root = match preferred {
        Some(i) => v2.swap_remove(i),
        None => v2.into_iter().next()?,
    };
    Some(Layout::V2 { root })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, etc.).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let s = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(s, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeFs;

    fn v1(root: &str) -> Option<Layout> {
        Some(Layout::V1 { root: root.into() })
    }

    #[test]
    fn hybrid_host_is_v1() {
        let text = include_str!("../tests/fixtures/v1/mountinfo.hybrid");
        assert_eq!(layout_from_mountinfo(text), v1("/sys/fs/cgroup"));
    }

    #[test]
    fn systemd_v1_host_with_comounted_cpu_is_v1() {
        let text = include_str!("../tests/fixtures/v1/mountinfo.systemd");
        assert_eq!(layout_from_mountinfo(text), v1("/sys/fs/cgroup"));
    }

    #[test]
    fn unified_host_is_v2() {
        let text = include_str!("../tests/fixtures/v2/mountinfo");
        assert_eq!(
            layout_from_mountinfo(text),
            Some(Layout::V2 {
                root: "/sys/fs/cgroup".into()
            })
        );
    }

    #[test]
    fn v2_prefers_the_standard_mount_point() {
        let text = "1 0 0:1 / /tmp/other rw - cgroup2 cgroup2 rw\n\
                    2 0 0:1 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            layout_from_mountinfo(text),
            Some(Layout::V2 {
                root: "/sys/fs/cgroup".into()
            })
        );
    }

    #[test]
    fn escaped_mount_points_and_garbage() {
        let text = "garbage\n\n1 2 3\n\
                    9 1 0:3 / /mnt/my\\040cgroups/memory rw shared:1 - cgroup cgroup rw,memory\n";
        assert_eq!(layout_from_mountinfo(text), v1("/mnt/my cgroups"));
        assert_eq!(layout_from_mountinfo("no cgroups here\n"), None);
        assert_eq!(layout_from_mountinfo(""), None);
        assert_eq!(unescape("a\\04"), "a\\04");
    }

    #[test]
    fn detect_uses_mountinfo_then_probes() {
        assert_eq!(
            detect(&FakeFs::v1_host()).unwrap(),
            v1("/sys/fs/cgroup").unwrap()
        );
        assert!(matches!(
            detect(&FakeFs::v2_host()).unwrap(),
            Layout::V2 { .. }
        ));
        let no_mountinfo = FakeFs::new().with_file("/sys/fs/cgroup/cgroup.controllers", "memory\n");
        assert!(matches!(detect(&no_mountinfo).unwrap(), Layout::V2 { .. }));
        let no_mountinfo = FakeFs::new().with_dir("/sys/fs/cgroup/memory");
        assert_eq!(
            detect(&no_mountinfo).unwrap(),
            v1("/sys/fs/cgroup").unwrap()
        );
        assert!(matches!(
            detect(&FakeFs::new()),
            Err(CgroupError::NoCgroups)
        ));
        let no_cgroup_mounts = FakeFs::new().with_file(
            "/proc/self/mountinfo",
            "1 0 0:1 / / rw - ext4 /dev/sda rw\n",
        );
        assert!(matches!(
            detect(&no_cgroup_mounts),
            Err(CgroupError::NoCgroups)
        ));
    }
}
