//! The crate's one error type. Each variant names the file or cgroup it was
//! about; the io error is attached as the source, never repeated in the text.

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
