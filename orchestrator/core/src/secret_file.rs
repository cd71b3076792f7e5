//! Who may own a secret file (a model key, a destination token, the
//! dashboard's TLS key, the store's URL) and how open it may be: one rule,
//! decided here over what was seen of the file, for every place that reads
//! one (the gateway's keys, the executors' tokens, the dashboard's key,
//! hosted mode's check at start).
//!
//! Two shapes are accepted, and nothing else:
//! - owned by the account reading it, with no access for group or others
//!   (`0600`/`0400`): the shape `install -m 0600` makes;
//! - owned by root, its group the reading account's own group, readable by
//!   that group and by no one else (`0440`/`0400`), read by an account that
//!   is not root: the shape of a Kubernetes Secret volume in a pod with an
//!   `fsGroup` (`deploy/kubernetes/serve.yaml`), where the kubelet owns the
//!   files. The group must be the service's own: anyone in it can read the
//!   file.
//!
//! `tests::the_rule_accepts_exactly_two_shapes` holds it.

/// What was seen of a secret file, and who is reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub regular: bool,
    pub uid: u32,
    pub gid: u32,
    /// `st_mode` (the type bits are ignored).
    pub mode: u32,
    /// The reading process's effective uid and gid.
    pub euid: u32,
    pub egid: u32,
}

/// Why a secret file may not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("is not a regular file")]
    NotAFile,
    #[error("is owned by uid {owner}, not by the account this runs as (uid {euid}) nor root with this account's group (gid {egid})")]
    WrongOwner { owner: u32, euid: u32, egid: u32 },
    #[error("has mode {mode:04o}: open to group or others; make it 0600")]
    TooOpen { mode: u32 },
}

/// The one rule (see the module's note).
pub fn problem(s: Seen) -> Option<Problem> {
    let mode = s.mode & 0o7777;
    if !s.regular {
        return Some(Problem::NotAFile);
    }
    if s.uid == s.euid {
        return (mode & 0o077 != 0).then_some(Problem::TooOpen { mode });
    }
    if s.uid == 0 && s.euid != 0 && s.gid == s.egid {
        // Group read at most; nothing for others, no write or execute.
        return (mode & 0o037 != 0).then_some(Problem::TooOpen { mode });
    }
    Some(Problem::WrongOwner {
        owner: s.uid,
        euid: s.euid,
        egid: s.egid,
    })
}

/// [`problem`] over a file's metadata, read by this process.
pub fn problem_of(meta: &std::fs::Metadata) -> Option<Problem> {
    use std::os::unix::fs::MetadataExt as _;
    problem(Seen {
        regular: meta.is_file(),
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode(),
        euid: nix::unistd::geteuid().as_raw(),
        egid: nix::unistd::getegid().as_raw(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_rule_accepts_exactly_two_shapes(
            regular: bool,
            uid in prop_oneof![Just(0u32), Just(10001u32), 0u32..20000],
            gid in prop_oneof![Just(0u32), Just(10001u32), 0u32..20000],
            mode in 0u32..0o7777,
            euid in prop_oneof![Just(0u32), Just(10001u32), 0u32..20000],
            egid in prop_oneof![Just(0u32), Just(10001u32), 0u32..20000],
        ) {
            let s = Seen { regular, uid, gid, mode, euid, egid };
            let mine = uid == euid && mode & 0o077 == 0;
            let mounted = uid == 0 && euid != 0 && gid == egid && mode & 0o037 == 0;
            prop_assert_eq!(problem(s).is_none(), regular && (mine || mounted), "{:?}", s);
            // Never accepted: anything for others, or group write.
            if mode & 0o007 != 0 || mode & 0o020 != 0 {
                prop_assert!(problem(s).is_some());
            }
        }
    }

    #[test]
    fn the_shapes_by_example() {
        let s = |uid, gid, mode, euid, egid| Seen {
            regular: true,
            uid,
            gid,
            mode,
            euid,
            egid,
        };
        assert_eq!(problem(s(10001, 10001, 0o100600, 10001, 10001)), None);
        // A Kubernetes Secret in a pod with fsGroup 10001.
        assert_eq!(problem(s(0, 10001, 0o100440, 10001, 10001)), None);
        // ...but not another group's, nor writable by the group.
        assert!(matches!(
            problem(s(0, 100, 0o100440, 10001, 10001)),
            Some(Problem::WrongOwner { .. })
        ));
        assert!(matches!(
            problem(s(0, 10001, 0o100460, 10001, 10001)),
            Some(Problem::TooOpen { .. })
        ));
        // Root reading its own file: the first shape, so group read is refused.
        assert!(matches!(
            problem(s(0, 0, 0o100440, 0, 0)),
            Some(Problem::TooOpen { .. })
        ));
        assert_eq!(problem(s(0, 0, 0o100400, 0, 0)), None);
    }
}
