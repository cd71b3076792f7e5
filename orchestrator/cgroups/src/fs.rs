//! The narrow boundary to the cgroup filesystem, with the real adapter and an
//! in-memory fake.
//!
//! Invariants of both implementations, mirroring cgroupfs:
//! - `write` never creates a file: a control file that the kernel does not
//!   offer is `NotFound` (`tests::real_fs_write_does_not_create`,
//!   `tests::fake_behaves_like_cgroupfs`);
//! - `create_dir` needs the parent to exist and the directory not to;
//! - `remove_dir` of a cgroup removes its control files with it, but fails
//!   while it has child cgroups.
//!
//! [`FakeFs`] additionally populates a new directory from the control-file
//! template of the hierarchy it was created in (as the kernel does), applies
//! `+x`/`-x` writes to `cgroup.subtree_control` as a set, and records every
//! write so tests can see exactly what was changed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// What this crate needs of the cgroup filesystem.
pub trait CgroupFs {
    fn read(&self, path: &Path) -> io::Result<String>;
    fn write(&self, path: &Path, data: &str) -> io::Result<()>;
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    fn exists(&self, path: &Path) -> bool;
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
}

/// The host's filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl CgroupFs for RealFs {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn write(&self, path: &Path, data: &str) -> io::Result<()> {
        // No `create`: cgroupfs offers its files, it never takes new ones.
        let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.write_all(data.as_bytes())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }
}

#[derive(Debug, Default)]
struct FakeState {
    dirs: BTreeSet<PathBuf>,
    files: BTreeMap<PathBuf, String>,
    /// Hierarchy directory → control files (name, initial content) that a
    /// new cgroup anywhere below it gets.
    templates: BTreeMap<PathBuf, Vec<(String, String)>>,
    writes: Vec<(PathBuf, String)>,
}

/// An in-memory cgroup filesystem for tests (this crate's and its users').
#[derive(Debug, Default)]
pub struct FakeFs {
    state: Mutex<FakeState>,
}

impl FakeFs {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        // A panic while holding the lock can only come from a test; the
        // state is still a plain map, so go on with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a directory and all its parents.
    pub fn with_dir(self, path: impl AsRef<Path>) -> Self {
        add_dirs(&mut self.state(), path.as_ref());
        self
    }

    /// Adds a file (and its parent directories) with the given content.
    pub fn with_file(self, path: impl AsRef<Path>, content: &str) -> Self {
        let path = path.as_ref();
        {
            let mut st = self.state();
            if let Some(parent) = path.parent() {
                add_dirs(&mut st, parent);
            }
            st.files.insert(path.to_path_buf(), content.to_string());
        }
        self
    }

    /// Every cgroup created below `hierarchy` gets these control files.
    pub fn with_template(self, hierarchy: impl AsRef<Path>, files: &[(&str, &str)]) -> Self {
        self.state().templates.insert(
            hierarchy.as_ref().to_path_buf(),
            files
                .iter()
                .map(|(n, c)| (n.to_string(), c.to_string()))
                .collect(),
        );
        self
    }

    /// Sets a file's content as the kernel would (not recorded as a write).
    pub fn set(&self, path: impl AsRef<Path>, content: &str) {
        self.state()
            .files
            .insert(path.as_ref().to_path_buf(), content.to_string());
    }

    pub fn file(&self, path: impl AsRef<Path>) -> Option<String> {
        self.state().files.get(path.as_ref()).cloned()
    }

    pub fn is_dir(&self, path: impl AsRef<Path>) -> bool {
        self.state().dirs.contains(path.as_ref())
    }

    /// Every successful write, in order.
    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        self.state().writes.clone()
    }

    pub fn clear_writes(&self) {
        self.state().writes.clear();
    }

    /// A cgroup v1 host laid out like this machine (`cpu` and `cpuacct`
    /// mounted apart, a cgroup2 `unified` mount without controllers), with
    /// swap accounting on.
    pub fn v1_host() -> Self {
        let root = Path::new("/sys/fs/cgroup");
        let mut fs = Self::new().with_file(
            "/proc/self/mountinfo",
            include_str!("../tests/fixtures/v1/mountinfo.hybrid"),
        );
        let unlimited = "9223372036854771712\n";
        let templates: [(&str, &[(&str, &str)]); 4] = [
            (
                "memory",
                &[
                    ("memory.limit_in_bytes", unlimited),
                    ("memory.memsw.limit_in_bytes", unlimited),
                    ("memory.usage_in_bytes", "0\n"),
                    ("memory.max_usage_in_bytes", "0\n"),
                    ("memory.use_hierarchy", "1\n"),
                    (
                        "memory.oom_control",
                        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
                    ),
                ],
            ),
            (
                "cpu",
                &[
                    ("cpu.cfs_period_us", "100000\n"),
                    ("cpu.cfs_quota_us", "-1\n"),
                ],
            ),
            ("cpuacct", &[("cpuacct.usage", "0\n")]),
            ("pids", &[("pids.max", "max\n"), ("pids.current", "0\n")]),
        ];
        for (controller, files) in templates {
            fs = fs.with_dir(root.join(controller));
            for (name, content) in files {
                fs = fs.with_file(root.join(controller).join(name), content);
            }
            fs = fs.with_template(root.join(controller), files);
        }
        fs.with_dir(root.join("unified"))
    }

    /// A pure cgroup v2 host (kernel ≥ 5.19: `memory.peak` present) whose
    /// root has not yet enabled any controller for its children.
    pub fn v2_host() -> Self {
        let root = Path::new("/sys/fs/cgroup");
        let files: &[(&str, &str)] = &[
            ("cgroup.controllers", "cpu memory pids\n"),
            ("cgroup.subtree_control", "\n"),
            ("memory.max", "max\n"),
            ("memory.swap.max", "max\n"),
            ("memory.current", "0\n"),
            ("memory.peak", "0\n"),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
            ),
            ("cpu.max", "max 100000\n"),
            (
                "cpu.stat",
                "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
            ),
            ("pids.max", "max\n"),
            ("pids.current", "0\n"),
        ];
        Self::new()
            .with_file(
                "/proc/self/mountinfo",
                include_str!("../tests/fixtures/v2/mountinfo"),
            )
            .with_file(
                root.join("cgroup.controllers"),
                include_str!("../tests/fixtures/v2/cgroup.controllers"),
            )
            .with_file(root.join("cgroup.subtree_control"), "\n")
            .with_template(root, files)
    }
}

fn add_dirs(st: &mut FakeState, path: &Path) {
    for p in path.ancestors() {
        if p.as_os_str().is_empty() {
            break;
        }
        st.dirs.insert(p.to_path_buf());
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("fake: no such file or directory: {}", path.display()),
    )
}

impl CgroupFs for FakeFs {
    fn read(&self, path: &Path) -> io::Result<String> {
        self.state()
            .files
            .get(path)
            .cloned()
            .ok_or_else(|| not_found(path))
    }

    fn write(&self, path: &Path, data: &str) -> io::Result<()> {
        let mut st = self.state();
        let Some(current) = st.files.get(path).cloned() else {
            return Err(not_found(path));
        };
        let next = if path
            .file_name()
            .is_some_and(|n| n == "cgroup.subtree_control")
        {
            let mut set: BTreeSet<String> =
                current.split_whitespace().map(str::to_string).collect();
            for token in data.split_whitespace() {
                match (token.strip_prefix('+'), token.strip_prefix('-')) {
                    (Some(c), _) => set.insert(c.to_string()),
                    (_, Some(c)) => set.remove(c),
                    _ => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("fake: subtree_control token without +/-: {token}"),
                        ))
                    }
                };
            }
            let mut joined = set.into_iter().collect::<Vec<_>>().join(" ");
            joined.push('\n');
            joined
        } else {
            data.to_string()
        };
        st.files.insert(path.to_path_buf(), next);
        st.writes.push((path.to_path_buf(), data.to_string()));
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state();
        if st.dirs.contains(path) || st.files.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("fake: already exists: {}", path.display()),
            ));
        }
        match path.parent() {
            Some(parent) if st.dirs.contains(parent) => {}
            _ => return Err(not_found(path)),
        }
        st.dirs.insert(path.to_path_buf());
        let template = st
            .templates
            .iter()
            .filter(|(h, _)| path.starts_with(h) && path != h.as_path())
            .max_by_key(|(h, _)| h.components().count())
            .map(|(_, files)| files.clone());
        for (name, content) in template.unwrap_or_default() {
            st.files.insert(path.join(name), content);
        }
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        let st = self.state();
        st.dirs.contains(path) || st.files.contains_key(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state();
        if !st.dirs.contains(path) {
            return Err(not_found(path));
        }
        if st.dirs.iter().any(|d| d.parent() == Some(path)) {
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("fake: cgroup has children: {}", path.display()),
            ));
        }
        st.dirs.remove(path);
        st.files.retain(|f, _| f.parent() != Some(path));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_behaves_like_cgroupfs() {
        let fs = FakeFs::v1_host();
        let mem = Path::new("/sys/fs/cgroup/memory");
        // writes never create files
        assert!(fs.write(&mem.join("nope"), "1").is_err());
        // parents must exist
        assert!(fs.create_dir(&mem.join("a/b")).is_err());
        fs.create_dir(&mem.join("a")).unwrap();
        assert!(fs.create_dir(&mem.join("a")).is_err());
        // the template populated the new cgroup
        assert_eq!(fs.file(mem.join("a/pids.max")), None);
        assert!(fs.file(mem.join("a/memory.limit_in_bytes")).is_some());
        fs.create_dir(&mem.join("a/b")).unwrap();
        assert!(fs.remove_dir(&mem.join("a")).is_err(), "has a child");
        fs.remove_dir(&mem.join("a/b")).unwrap();
        fs.remove_dir(&mem.join("a")).unwrap();
        assert!(!fs.exists(&mem.join("a/memory.limit_in_bytes")));
    }

    #[test]
    fn fake_subtree_control_is_a_set() {
        let fs = FakeFs::v2_host();
        let p = Path::new("/sys/fs/cgroup/cgroup.subtree_control");
        fs.write(p, "+memory +pids").unwrap();
        fs.write(p, "+memory -pids +cpu").unwrap();
        assert_eq!(fs.file(p).unwrap(), "cpu memory\n");
        assert!(fs.write(p, "memory").is_err());
    }

    #[test]
    fn real_fs_write_does_not_create() {
        let dir = std::env::temp_dir().join(format!("cgroups-realfs-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let missing = dir.join("missing");
        assert!(RealFs.write(&missing, "1").is_err());
        assert!(!missing.exists());
        std::fs::write(&missing, "0").unwrap();
        RealFs.write(&missing, "12").unwrap();
        assert_eq!(RealFs.read(&missing).unwrap(), "12");
        std::fs::remove_file(&missing).unwrap();
        RealFs.remove_dir(&dir).unwrap();
    }
}
