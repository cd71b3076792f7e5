//! Fleet caps: one parent cgroup that holds every sandbox, with aggregate
//! memory, CPU and process limits, and the resource figures sampled from it.
//!
//! The cgroup filesystem is written directly (no `cgroups-rs`): the whole job
//! is about a dozen small files, every access goes through the [`CgroupFs`]
//! trait so that the decisions are tested over [`FakeFs`] and recorded
//! layouts, and we need neither its unsafe code nor its own view of which
//! controllers a host has.
//!
//! Invariants:
//! - every path this crate touches is `root / [controller /] fleet [/ container]`,
//!   where fleet and container names are single path components checked by
//!   [`validate_name`] (no `/`, no `..`): nothing outside the fleet's own
//!   cgroups is ever written, except enabling controllers in the v2 root's
//!   `cgroup.subtree_control`;
//! - parsing and planning are pure functions over strings; only the
//!   functions taking a `&impl CgroupFs` do I/O
//!   (`tests::only_the_cgroup_fs_touches_files`);
//! - bad file contents are errors naming the file, never panics
//!   (`sample::tests::gone_container_is_not_found_and_bad_files_are_named`,
//!   `layout::tests::escaped_mount_points_and_garbage`).

#![forbid(unsafe_code)]

mod error;
mod fleet;
mod fs;
mod layout;
mod sample;

pub use error::CgroupError;
pub use fleet::{
    cpu_quota_us, ensure_fleet, missing_controllers, remove_fleet, v1_memory_writes, Fleet,
    FleetLimits, CPU_PERIOD_US, FLEET_CONTROLLERS,
};
pub use fs::{CgroupFs, FakeFs, RealFs};
pub use layout::{detect, layout_from_mountinfo, Layout};
pub use sample::{
    keyed_value, parse_limit, parse_u64, sample, sample_interval, Sample, MAX_SAMPLE_INTERVAL,
    MIN_SAMPLE_INTERVAL,
};

/// Checks that `name` is one safe path component for a cgroup: ASCII letters,
/// digits, `-`, `_` and `.`, not starting with `.`, at most 128 bytes.
pub fn validate_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name.len() > 128 {
        Some("longer than 128 bytes")
    } else if name.starts_with('.') {
        Some("starts with '.'")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        Some("only ASCII letters, digits, '-', '_' and '.' are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(CgroupError::InvalidName {
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the crate's code (before its tests): only `fs.rs`, behind the
    /// `CgroupFs` trait, names the filesystem.
    #[test]
    fn only_the_cgroup_fs_touches_files() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut checked = 0;
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            if path.ends_with("fs.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            checked += 1;
            for word in [
                "std::fs",
                "File::",
                "OpenOptions",
                "read_dir",
                "std::process",
            ] {
                assert!(!code.contains(word), "{} names {word}", path.display());
            }
        }
        assert!(checked >= 5, "only {checked} modules were read");
    }

    #[test]
    fn names_are_single_safe_components() {
        for good in ["nightshift-fleet", "a", "x_1.2", &"f".repeat(128)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "..",
            ".hidden",
            "a/b",
            "/abs",
            "a b",
            "é",
            &"f".repeat(129),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
