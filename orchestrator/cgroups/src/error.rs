//! The crate's one error type. Each variant names the file or cgroup it was
//! about; the io error is attached as the source, never repeated in the text
//! (`tests::messages_name_their_file_and_keep_the_io_error_apart`).

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing {value:?} to {}", path.display())]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("creating cgroup {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing cgroup {}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parsing {}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("no cgroup hierarchy found in /proc/self/mountinfo nor under /sys/fs/cgroup")]
    NoCgroups,
    #[error("cgroup controller {controller} is not available at {}", path.display())]
    MissingController {
        controller: &'static str,
        path: PathBuf,
    },
    #[error("cgroup {} does not exist", path.display())]
    NotFound { path: PathBuf },
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("invalid fleet limit {field}: {reason}")]
    InvalidLimit { field: &'static str, reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn messages_name_their_file_and_keep_the_io_error_apart() {
        let e = CgroupError::Write {
            path: "/sys/fs/cgroup/f/memory.max".into(),
            value: "1".into(),
            source: io::Error::other("UNDERLYING"),
        };
        assert_eq!(
            e.to_string(),
            "writing \"1\" to /sys/fs/cgroup/f/memory.max"
        );
        assert!(e.source().unwrap().to_string().contains("UNDERLYING"));
        // Every message of the enum above: none prints its source.
        let code = include_str!("error.rs")
            .split("#[cfg(test)]")
            .next()
            .unwrap();
        let variants: Vec<&str> = code.split("#[error(\"").skip(1).collect();
        assert!(variants.len() >= 10, "{}", variants.len());
        for variant in variants {
            let message = variant.split("\"").next().unwrap();
            assert!(!message.contains("{source"), "{message}");
            assert!(!variant.contains("#[from]"), "{message}");
        }
    }
}
