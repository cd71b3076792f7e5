//! The fleet's parent cgroup: created once, limits (re)applied on every call.
//!
//! Invariants:
//! - [`ensure_fleet`] is idempotent: it creates only missing directories and
//!   writes a control file only when its current value differs from the
//!   wanted one (compared after the kernel's own normalisation: `-1`, `max`
//!   and v1's page-rounded "unlimited" are all "unlimited")
//!   (`tests::ensure_is_idempotent_and_reapplies_changes`,
//!   `tests::same_value_normalises_unlimited`,
//!   `tests::v2_only_enables_what_is_missing_and_needs_controllers`);
//! - a limit that is `None` is written as unlimited, so removing a limit from
//!   the config removes it from the host;
//! - memory is limited together with swap (v1 `memory.memsw.limit_in_bytes`
//!   equal to the memory limit, v2 `memory.swap.max` 0) where the host
//!   offers those files, so that the fleet cannot page out past its cap;
//! - on v1, writes to the memory files are ordered so that the kernel's rule
//!   `memory.limit_in_bytes <= memory.memsw.limit_in_bytes` holds after each
//!   write, whether the limit rises or falls;
//! - limits are validated before anything is written: a bad config is an
//!   [`CgroupError::InvalidLimit`], never a half-applied fleet
//!   (`tests::bad_limits_and_names_write_nothing`).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{validate_name, CgroupError, CgroupFs, Layout};

/// The v2 controllers the fleet needs (and enables for its children).
pub const FLEET_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];
/// The v1 hierarchies the fleet is created in.
const V1_HIERARCHIES: [&str; 4] = ["memory", "cpu", "cpuacct", "pids"];
/// Every hierarchy of a v1 (or hybrid) host the engine may create the
/// parent in, for cleanup: `unified` is the hybrid layout's cgroup2 mount.
const V1_ALL_HIERARCHIES: [&str; 18] = [
    "memory",
    "cpu",
    "cpuacct",
    "cpu,cpuacct",
    "pids",
    "blkio",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "net_cls",
    "net_prio",
    "net_cls,net_prio",
    "perf_event",
    "rdma",
    "misc",
    "systemd",
    "unified",
];
/// The CFS period written with every CPU limit.
pub const CPU_PERIOD_US: u64 = 100_000;
const PAGE: u64 = 4096;
/// The kernel's PIDS_MAX - 1: the largest value pids.max takes.
const PIDS_LIMIT_MAX: u64 = 4 * 1024 * 1024;
const CPUS_MAX: f64 = 65_536.0;

/// Aggregate limits over every sandbox of the fleet; `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct FleetLimits {
    /// Memory plus swap, in bytes; rounded down to a multiple of 4 KiB.
    pub memory_bytes: Option<u64>,
    /// CPU time as a number of CPUs (1.5 = one and a half CPUs' worth).
    pub cpus: Option<f64>,
    /// Processes and threads.
    pub pids: Option<u64>,
}

/// The fleet's cgroup, as created by [`ensure_fleet`].
#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    name: String,
    layout: Layout,
    limits: FleetLimits,
}

impl Fleet {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn limits(&self) -> FleetLimits {
        self.limits
    }

    /// The value for `HostConfig.CgroupParent` with the engine's cgroupfs
    /// driver: containers then live at `<fleet dir>/<container id>`.
    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.name)
    }

    /// The fleet's directories (one per v1 hierarchy, one on v2).
    pub fn paths(&self) -> Vec<PathBuf> {
        fleet_dirs(&self.layout, &self.name)
    }
}

fn fleet_dirs(layout: &Layout, name: &str) -> Vec<PathBuf> {
    match layout {
        Layout::V1 { root } => V1_HIERARCHIES
            .iter()
            .map(|h| root.join(h).join(name))
            .collect(),
        Layout::V2 { root } => vec![root.join(name)],
    }
}

/// The CFS quota for `cpus` CPUs over [`CPU_PERIOD_US`].
pub fn cpu_quota_us(cpus: f64) -> Result<u64, CgroupError> {
    let invalid = |reason: String| CgroupError::InvalidLimit {
        field: "cpus",
        reason,
    };
    if !cpus.is_finite() || cpus <= 0.0 {
        return Err(invalid(format!("{cpus} is not a positive number")));
    }
    if cpus > CPUS_MAX {
        return Err(invalid(format!("{cpus} is more than {CPUS_MAX}")));
    }
    let quota = (cpus * CPU_PERIOD_US as f64).round();
    // The kernel refuses quotas under 1 ms.
    if quota < 1000.0 {
        return Err(invalid(format!("{cpus} is less than 0.01")));
    }
    // In range: checked above against CPUS_MAX.
    Ok(quota as u64)
}

fn validate(limits: &FleetLimits) -> Result<(), CgroupError> {
    if let Some(m) = limits.memory_bytes {
        if m < PAGE || m > i64::MAX as u64 {
            return Err(CgroupError::InvalidLimit {
                field: "memory_bytes",
                reason: format!("{m} is not between {PAGE} and {}", i64::MAX),
            });
        }
    }
    if let Some(p) = limits.pids {
        if p == 0 || p > PIDS_LIMIT_MAX {
            return Err(CgroupError::InvalidLimit {
                field: "pids",
                reason: format!("{p} is not between 1 and {PIDS_LIMIT_MAX}"),
            });
        }
    }
    if let Some(c) = limits.cpus {
        cpu_quota_us(c)?;
    }
    Ok(())
}

/// The controllers of `wanted` that a `cgroup.subtree_control` (or
/// `cgroup.controllers`) text does not list.
pub fn missing_controllers<'a>(listed: &str, wanted: &[&'a str]) -> Vec<&'a str> {
    wanted
        .iter()
        .copied()
        .filter(|w| !listed.split_whitespace().any(|l| l == *w))
        .collect()
}

/// The ordered writes that set a v1 memory limit (`None`: unlimited).
/// `current_memsw` is `None` when the host has no swap accounting, else the
/// current `memory.memsw.limit_in_bytes` (`u64::MAX` when unlimited).
pub fn v1_memory_writes(
    desired: Option<u64>,
    current_memsw: Option<u64>,
) -> Vec<(&'static str, String)> {
    let value = desired.map_or_else(|| "-1".to_string(), |b| b.to_string());
    let mem = ("memory.limit_in_bytes", value.clone());
    let Some(current_memsw) = current_memsw else {
        return vec![mem];
    };
    let memsw = ("memory.memsw.limit_in_bytes", value);
    // memory <= memsw must hold after each write: raise memsw first, lower
    // memory first.
    if desired.unwrap_or(u64::MAX) > current_memsw {
        vec![memsw, mem]
    } else {
        vec![mem, memsw]
    }
}

/// A limit as the kernel shows it: `None` is unlimited.
fn limit_value(token: &str) -> Option<Option<u64>> {
    match token {
        "max" | "-1" => Some(None),
        // v1 shows "unlimited" as LONG_MAX rounded down to a page.
        t => t
            .parse::<u64>()
            .ok()
            .map(|n| (n < 0x7fff_ffff_ffff_0000).then_some(n)),
    }
}

/// Whether a control file's current text already says `wanted`.
fn same_value(current: &str, wanted: &str) -> bool {
    let a: Vec<_> = current.split_whitespace().map(limit_value).collect();
    let b: Vec<_> = wanted.split_whitespace().map(limit_value).collect();
    a == b && a.iter().all(Option::is_some)
}

fn read(fs: &impl CgroupFs, path: &Path) -> Result<String, CgroupError> {
    fs.read(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn write(fs: &impl CgroupFs, path: &Path, value: &str) -> Result<(), CgroupError> {
    fs.write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

fn write_if_changed(fs: &impl CgroupFs, path: &Path, value: &str) -> Result<(), CgroupError> {
    if same_value(&read(fs, path)?, value) {
        return Ok(());
    }
    write(fs, path, value)
}

fn create_if_missing(fs: &impl CgroupFs, path: &Path) -> Result<(), CgroupError> {
    if fs.exists(path) {
        return Ok(());
    }
    match fs.create_dir(path) {
        Ok(()) => Ok(()),
        // Someone (the engine) made it meanwhile: fine, it is a cgroup.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::Create {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Creates the fleet's cgroup `name` if needed and applies `limits` to it.
pub fn ensure_fleet(
    fs: &impl CgroupFs,
    layout: &Layout,
    name: &str,
    limits: FleetLimits,
) -> Result<Fleet, CgroupError> {
    validate_name(name)?;
    validate(&limits)?;
    let limits = FleetLimits {
        memory_bytes: limits.memory_bytes.map(|m| m / PAGE * PAGE),
        ..limits
    };
    match layout {
        Layout::V1 { root } => ensure_v1(fs, root, name, &limits)?,
        Layout::V2 { root } => ensure_v2(fs, root, name, &limits)?,
    }
    Ok(Fleet {
        name: name.to_string(),
        layout: layout.clone(),
        limits,
    })
}

fn ensure_v1(
    fs: &impl CgroupFs,
    root: &Path,
    name: &str,
    limits: &FleetLimits,
) -> Result<(), CgroupError> {
    for controller in V1_HIERARCHIES {
        let hierarchy = root.join(controller);
        if !fs.exists(&hierarchy) {
            return Err(CgroupError::MissingController {
                controller,
                path: hierarchy,
            });
        }
    }
    for controller in V1_HIERARCHIES {
        create_if_missing(fs, &root.join(controller).join(name))?;
    }

    let memory = root.join("memory").join(name);
    // Without hierarchy the fleet's limit would not cover its children
    // (kernels since 5.x always say 1; it can only be set while childless).
    let use_hierarchy = memory.join("memory.use_hierarchy");
    if fs.exists(&use_hierarchy) && read(fs, &use_hierarchy)?.trim() == "0" {
        write(fs, &use_hierarchy, "1")?;
    }
    let memsw_path = memory.join("memory.memsw.limit_in_bytes");
    let current_memsw = if fs.exists(&memsw_path) {
        let text = read(fs, &memsw_path)?;
        let value = limit_value(text.trim()).ok_or_else(|| CgroupError::Parse {
            path: memsw_path.clone(),
            reason: format!("not a limit: {:?}", text.trim()),
        })?;
        Some(value.unwrap_or(u64::MAX))
    } else {
        None
    };
    for (file, value) in v1_memory_writes(limits.memory_bytes, current_memsw) {
        write_if_changed(fs, &memory.join(file), &value)?;
    }

    let cpu = root.join("cpu").join(name);
    write_if_changed(
        fs,
        &cpu.join("cpu.cfs_period_us"),
        &CPU_PERIOD_US.to_string(),
    )?;
    let quota = match limits.cpus {
        Some(c) => cpu_quota_us(c)?.to_string(),
        None => "-1".to_string(),
    };
    write_if_changed(fs, &cpu.join("cpu.cfs_quota_us"), &quota)?;

    let pids = root.join("pids").join(name).join("pids.max");
    write_if_changed(fs, &pids, &pids_value(limits.pids))?;
    Ok(())
}

fn pids_value(pids: Option<u64>) -> String {
    pids.map_or_else(|| "max".to_string(), |p| p.to_string())
}

fn enable_controllers(fs: &impl CgroupFs, cgroup: &Path) -> Result<(), CgroupError> {
    let subtree = cgroup.join("cgroup.subtree_control");
    let missing = missing_controllers(&read(fs, &subtree)?, &FLEET_CONTROLLERS);
    if missing.is_empty() {
        return Ok(());
    }
    let value = missing
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    write(fs, &subtree, &value)
}

fn ensure_v2(
    fs: &impl CgroupFs,
    root: &Path,
    name: &str,
    limits: &FleetLimits,
) -> Result<(), CgroupError> {
    let available = read(fs, &root.join("cgroup.controllers"))?;
    if let Some(controller) = missing_controllers(&available, &FLEET_CONTROLLERS).first() {
        return Err(CgroupError::MissingController {
            controller,
            path: root.to_path_buf(),
        });
    }
    enable_controllers(fs, root)?;
    let fleet = root.join(name);
    create_if_missing(fs, &fleet)?;
    // The fleet holds no process itself, only the containers' cgroups, so
    // it may hand its controllers down to them.
    enable_controllers(fs, &fleet)?;

    let memory = limits
        .memory_bytes
        .map_or_else(|| "max".to_string(), |m| m.to_string());
    write_if_changed(fs, &fleet.join("memory.max"), &memory)?;
    let swap = fleet.join("memory.swap.max");
    if fs.exists(&swap) {
        let value = if limits.memory_bytes.is_some() {
            "0"
        } else {
            "max"
        };
        write_if_changed(fs, &swap, value)?;
    }
    let quota = match limits.cpus {
        Some(c) => cpu_quota_us(c)?.to_string(),
        None => "max".to_string(),
    };
    write_if_changed(
        fs,
        &fleet.join("cpu.max"),
        &format!("{quota} {CPU_PERIOD_US}"),
    )?;
    write_if_changed(fs, &fleet.join("pids.max"), &pids_value(limits.pids))?;
    Ok(())
}

/// Removes the fleet's cgroups in every hierarchy where they exist (the
/// engine creates the parent in all v1 hierarchies). Fails, naming the
/// cgroup, while a container's cgroup is still inside; tries every
/// hierarchy before returning the first error.
pub fn remove_fleet(fs: &impl CgroupFs, layout: &Layout, name: &str) -> Result<(), CgroupError> {
    validate_name(name)?;
    let dirs: Vec<PathBuf> = match layout {
        Layout::V1 { root } => V1_ALL_HIERARCHIES
            .iter()
            .map(|h| root.join(h).join(name))
            .collect(),
        Layout::V2 { root } => vec![root.join(name)],
    };
    let mut first_error = None;
    for dir in dirs {
        // Co-mounted hierarchies reach one directory by two names.
        if !fs.exists(&dir) {
            continue;
        }
        if let Err(source) = fs.remove_dir(&dir) {
            if source.kind() != std::io::ErrorKind::NotFound {
                first_error.get_or_insert(CgroupError::Remove { path: dir, source });
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{detect, FakeFs};

    const MIB: u64 = 1024 * 1024;
    const V1: &str = "/sys/fs/cgroup";

    fn limits(memory: u64, cpus: f64, pids: u64) -> FleetLimits {
        FleetLimits {
            memory_bytes: Some(memory),
            cpus: Some(cpus),
            pids: Some(pids),
        }
    }

    fn file(fs: &FakeFs, path: &str) -> String {
        fs.file(path).unwrap_or_default().trim().to_string()
    }

    #[test]
    fn v1_fleet_is_created_in_each_hierarchy_with_limits() {
        let fs = FakeFs::v1_host();
        let layout = detect(&fs).unwrap();
        let fleet = ensure_fleet(&fs, &layout, "nsf", limits(256 * MIB, 1.5, 64)).unwrap();
        assert_eq!(fleet.cgroup_parent(), "/nsf");
        for h in ["memory", "cpu", "cpuacct", "pids"] {
            assert!(fs.is_dir(format!("{V1}/{h}/nsf")), "{h}");
        }
        let m = format!("{V1}/memory/nsf");
        assert_eq!(
            file(&fs, &format!("{m}/memory.limit_in_bytes")),
            "268435456"
        );
        assert_eq!(
            file(&fs, &format!("{m}/memory.memsw.limit_in_bytes")),
            "268435456"
        );
        assert_eq!(
            file(&fs, &format!("{V1}/cpu/nsf/cpu.cfs_quota_us")),
            "150000"
        );
        assert_eq!(
            file(&fs, &format!("{V1}/cpu/nsf/cpu.cfs_period_us")),
            "100000"
        );
        assert_eq!(file(&fs, &format!("{V1}/pids/nsf/pids.max")), "64");
        // limits sit on the fleet, never on the hierarchy roots
        assert_eq!(file(&fs, &format!("{V1}/pids/pids.max")), "max");
    }

    #[test]
    fn ensure_is_idempotent_and_reapplies_changes() {
        for fs in [FakeFs::v1_host(), FakeFs::v2_host()] {
            let layout = detect(&fs).unwrap();
            ensure_fleet(&fs, &layout, "nsf", limits(256 * MIB, 2.0, 64)).unwrap();
            fs.clear_writes();
            ensure_fleet(&fs, &layout, "nsf", limits(256 * MIB, 2.0, 64)).unwrap();
            assert_eq!(fs.writes(), vec![], "{layout:?}: nothing changed");
            ensure_fleet(&fs, &layout, "nsf", limits(256 * MIB, 2.0, 128)).unwrap();
            let writes = fs.writes();
            assert_eq!(writes.len(), 1, "{layout:?}: only pids changed: {writes:?}");
            assert!(writes[0].0.ends_with("nsf/pids.max"));
            assert_eq!(writes[0].1, "128");
            fs.clear_writes();
            let unlimited = FleetLimits::default();
            ensure_fleet(&fs, &layout, "nsf", unlimited).unwrap();
            ensure_fleet(&fs, &layout, "nsf", unlimited).unwrap();
            assert!(
                fs.writes()
                    .iter()
                    .all(|(_, v)| v == "-1" || v.starts_with("max")),
                "{layout:?}: {:?}",
                fs.writes()
            );
        }
    }

    #[test]
    fn v1_memory_writes_keep_memsw_above_memory() {
        let up = v1_memory_writes(Some(512 * MIB), Some(256 * MIB));
        assert_eq!(up[0].0, "memory.memsw.limit_in_bytes");
        assert_eq!(up[1].0, "memory.limit_in_bytes");
        let down = v1_memory_writes(Some(128 * MIB), Some(256 * MIB));
        assert_eq!(down[0].0, "memory.limit_in_bytes");
        let to_unlimited = v1_memory_writes(None, Some(256 * MIB));
        assert_eq!(
            to_unlimited[0],
            ("memory.memsw.limit_in_bytes", "-1".into())
        );
        let from_unlimited = v1_memory_writes(Some(MIB), Some(u64::MAX));
        assert_eq!(from_unlimited[0].0, "memory.limit_in_bytes");
        assert_eq!(
            v1_memory_writes(Some(MIB), None).len(),
            1,
            "no swap accounting"
        );
    }

    #[test]
    fn v1_without_swap_accounting_or_hierarchy() {
        let fs = FakeFs::v1_host().with_template(
            format!("{V1}/memory"),
            &[
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.use_hierarchy", "0\n"),
            ],
        );
        let layout = detect(&fs).unwrap();
        ensure_fleet(&fs, &layout, "nsf", limits(64 * MIB, 1.0, 10)).unwrap();
        assert_eq!(
            file(&fs, &format!("{V1}/memory/nsf/memory.use_hierarchy")),
            "1"
        );
        assert_eq!(
            file(&fs, &format!("{V1}/memory/nsf/memory.limit_in_bytes")),
            "67108864"
        );
        assert!(!fs.exists(Path::new(&format!(
            "{V1}/memory/nsf/memory.memsw.limit_in_bytes"
        ))));
    }

    #[test]
    fn v1_missing_controller_is_named() {
        let fs = FakeFs::new()
            .with_file(
                "/proc/self/mountinfo",
                include_str!("../tests/fixtures/v1/mountinfo.hybrid"),
            )
            .with_dir(format!("{V1}/memory"))
            .with_dir(format!("{V1}/cpu"))
            .with_dir(format!("{V1}/cpuacct"));
        let layout = detect(&fs).unwrap();
        let err = ensure_fleet(&fs, &layout, "nsf", FleetLimits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::MissingController {
                    controller: "pids",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!fs.is_dir(format!("{V1}/memory/nsf")), "nothing created");
    }

    #[test]
    fn v2_enables_controllers_and_writes_limits() {
        let fs = FakeFs::v2_host();
        let layout = detect(&fs).unwrap();
        let fleet = ensure_fleet(&fs, &layout, "nsf", limits(256 * MIB + 100, 0.5, 64)).unwrap();
        assert_eq!(fleet.paths(), vec![PathBuf::from("/sys/fs/cgroup/nsf")]);
        assert_eq!(
            file(&fs, "/sys/fs/cgroup/cgroup.subtree_control"),
            "cpu memory pids"
        );
        assert_eq!(
            file(&fs, "/sys/fs/cgroup/nsf/cgroup.subtree_control"),
            "cpu memory pids"
        );
        assert_eq!(
            file(&fs, "/sys/fs/cgroup/nsf/memory.max"),
            "268435456",
            "page-rounded"
        );
        assert_eq!(file(&fs, "/sys/fs/cgroup/nsf/memory.swap.max"), "0");
        assert_eq!(file(&fs, "/sys/fs/cgroup/nsf/cpu.max"), "50000 100000");
        assert_eq!(file(&fs, "/sys/fs/cgroup/nsf/pids.max"), "64");
    }

    #[test]
    fn v2_only_enables_what_is_missing_and_needs_controllers() {
        let fs = FakeFs::v2_host();
        fs.set("/sys/fs/cgroup/cgroup.subtree_control", "cpu memory\n");
        let layout = detect(&fs).unwrap();
        ensure_fleet(&fs, &layout, "nsf", FleetLimits::default()).unwrap();
        let root_writes: Vec<_> = fs
            .writes()
            .into_iter()
            .filter(|(p, _)| p == Path::new("/sys/fs/cgroup/cgroup.subtree_control"))
            .collect();
        assert_eq!(
            root_writes,
            vec![(
                "/sys/fs/cgroup/cgroup.subtree_control".into(),
                "+pids".into()
            )]
        );

        let fs = FakeFs::v2_host();
        fs.set("/sys/fs/cgroup/cgroup.controllers", "cpu io memory\n");
        let err = ensure_fleet(&fs, &layout, "nsf", FleetLimits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::MissingController {
                    controller: "pids",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!fs.is_dir("/sys/fs/cgroup/nsf"), "nothing created");
    }

    #[test]
    fn bad_limits_and_names_write_nothing() {
        let fs = FakeFs::v1_host();
        let layout = detect(&fs).unwrap();
        let bad = [
            FleetLimits {
                cpus: Some(0.0),
                ..Default::default()
            },
            FleetLimits {
                cpus: Some(f64::NAN),
                ..Default::default()
            },
            FleetLimits {
                cpus: Some(0.001),
                ..Default::default()
            },
            FleetLimits {
                cpus: Some(1e9),
                ..Default::default()
            },
            FleetLimits {
                memory_bytes: Some(0),
                ..Default::default()
            },
            FleetLimits {
                memory_bytes: Some(u64::MAX),
                ..Default::default()
            },
            FleetLimits {
                pids: Some(0),
                ..Default::default()
            },
            FleetLimits {
                pids: Some(1 << 40),
                ..Default::default()
            },
        ];
        for l in bad {
            assert!(
                matches!(
                    ensure_fleet(&fs, &layout, "nsf", l),
                    Err(CgroupError::InvalidLimit { .. })
                ),
                "{l:?}"
            );
        }
        for name in ["", "..", "a/b", "../../etc"] {
            assert!(matches!(
                ensure_fleet(&fs, &layout, name, FleetLimits::default()),
                Err(CgroupError::InvalidName { .. })
            ));
        }
        assert_eq!(fs.writes(), vec![]);
        assert!(!fs.is_dir(format!("{V1}/memory/nsf")));
    }

    #[test]
    fn cpu_quota_rounds_to_microseconds() {
        assert_eq!(cpu_quota_us(1.0).unwrap(), 100_000);
        assert_eq!(cpu_quota_us(0.01).unwrap(), 1000);
        assert_eq!(cpu_quota_us(2.333_333).unwrap(), 233_333);
    }

    #[test]
    fn same_value_normalises_unlimited() {
        assert!(same_value("9223372036854771712\n", "-1"));
        assert!(same_value("max\n", "-1"));
        assert!(same_value("max 100000\n", "max 100000"));
        assert!(!same_value("max 100000\n", "50000 100000"));
        assert!(!same_value("garbage\n", "garbage"));
        assert!(!same_value("100\n", "1000"));
    }

    #[test]
    fn remove_fleet_removes_every_hierarchy_and_refuses_while_busy() {
        let fs = FakeFs::v1_host().with_dir(format!("{V1}/devices"));
        fs.create_dir(Path::new(&format!("{V1}/unified/nsf")))
            .unwrap();
        let layout = detect(&fs).unwrap();
        ensure_fleet(&fs, &layout, "nsf", FleetLimits::default()).unwrap();
        // the engine creates the parent in other hierarchies too
        fs.create_dir(Path::new(&format!("{V1}/devices/nsf")))
            .unwrap();
        fs.create_dir(Path::new(&format!("{V1}/memory/nsf/c1")))
            .unwrap();
        let err = remove_fleet(&fs, &layout, "nsf").unwrap_err();
        assert!(
            matches!(&err, CgroupError::Remove { path, .. } if path.ends_with("memory/nsf")),
            "{err}"
        );
        assert!(!fs.is_dir(format!("{V1}/pids/nsf")), "the others went on");
        fs.remove_dir(Path::new(&format!("{V1}/memory/nsf/c1")))
            .unwrap();
        remove_fleet(&fs, &layout, "nsf").unwrap();
        for h in ["memory", "cpu", "cpuacct", "pids", "devices", "unified"] {
            assert!(!fs.is_dir(format!("{V1}/{h}/nsf")), "{h}");
        }
        remove_fleet(&fs, &layout, "nsf").unwrap();
    }
}
