//! Reading the agent's tip from the worktree's ref files, as data.
//!
//! Used by the import, once the sandbox is gone (the module is private to
//! `import`, and `import_run` is its one caller); an act's commit comes
//! over the door instead, see [`super::pack`].
//!
//! Invariants: only `.git/HEAD`, one loose ref file and `.git/packed-refs` are
//! read. Every path is walked one component at a time from a directory
//! handle (`openat` with `O_NOFOLLOW`, directories with `O_DIRECTORY`), so a
//! symlink is never followed in *any* component, even one swapped in after
//! an earlier check; a file is opened with `O_NONBLOCK` (a FIFO never
//! blocks), read only when `fstat` on the open descriptor says it is a
//! regular file, and never past its cap. A path that meets a symlink or a
//! non-directory on the way is refused with the same answer whatever lies
//! beyond it, so no lookup tells anything about files outside the worktree.
//! A loose ref must hold exactly 40 hex digits (symbolic loose refs are not
//! followed); a loose ref hides a packed one, as in git
//! (`tests::symlinked_ref_directories_are_refused`,
//! `tests::a_fifo_or_oversized_file_as_a_ref_is_refused_without_blocking`,
//! `tests::no_lookup_through_a_symlink_tells_whether_a_host_file_exists`,
//! `tests::loose_refs_must_be_forty_hex`,
//! `tests::loose_refs_in_real_directories_are_read_and_hide_packed_ones`).

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use git2::{ObjectType, Odb, Oid};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

use super::TipSource;
use crate::fsx::{read_open_capped, Capped};
use crate::run_id::run_branch;
use crate::GitError;

const MAX_REF_FILE: u64 = 4096;
const MAX_PACKED_REFS: u64 = 64 << 20;

/// Finds the agent's tip (see the note of [`super`]) and checks that it is a
/// commit the worktree (or the host) holds.
pub(super) fn resolve_tip(
    worktree: &Path,
    run_id: &str,
    wt: &Odb<'_>,
    host: &Odb<'_>,
    base: Oid,
) -> Result<(Oid, TipSource), GitError> {
    let gitdir = worktree.join(".git");
    let run = run_branch(run_id);
    let mut found = None;
    if let Some(head_branch) = read_head_branch(&gitdir)? {
        if head_branch != run {
            if let Some(id) = read_ref(&gitdir, &head_branch)? {
                found = Some((id, TipSource::HeadBranch(head_branch)));
            }
        }
    }
    if found.is_none() {
        if let Some(id) = read_ref(&gitdir, &run)? {
            found = Some((id, TipSource::RunBranch));
        }
    }
    let Some((id, source)) = found else {
        return Ok((base, TipSource::Base));
    };
    let name = match &source {
        TipSource::HeadBranch(b) => b.clone(),
        _ => run,
    };
    let header = wt.read_header(id).or_else(|_| host.read_header(id));
    match header {
        Ok((_, ObjectType::Commit)) => Ok((id, source)),
        Ok((_, kind)) => Err(GitError::BadRef {
            reference: name,
            why: format!("it points at {id}, a {kind}, not a commit"),
        }),
        Err(_) => Err(GitError::BadRef {
            reference: name,
            why: format!("it points at {id}, which is in no object store"),
        }),
    }
}

/// What opening one component from a directory handle found.
enum At {
    Missing,
    /// A symlink, or not the kind asked for: never followed, never read.
    NotReal,
    File(File),
}

/// Opens `name` (one component) in `dir` without following a symlink;
/// a directory when `dir_wanted`, else a file opened for reading without
/// blocking.
fn open_at(dir: impl AsFd, name: &str, dir_wanted: bool) -> std::io::Result<At> {
    let mut flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    flags |= if dir_wanted {
        OFlag::O_DIRECTORY
    } else {
        OFlag::O_NONBLOCK
    };
    match openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(At::File(File::from(fd))),
        Err(Errno::ENOENT) => Ok(At::Missing),
        Err(Errno::ELOOP | Errno::ENOTDIR) => Ok(At::NotReal),
        Err(e) => Err(std::io::Error::from(e)),
    }
}

/// Opens a directory given by path, refusing a symlink in its last
/// component (the worktree's `.git`; the components above it are the
/// supervisor's own).
fn open_gitdir(gitdir: &Path) -> std::io::Result<At> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(gitdir)
    {
        Ok(f) => Ok(At::File(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(At::Missing),
        Err(e)
            if e.raw_os_error() == Some(Errno::ELOOP as i32)
                || e.raw_os_error() == Some(Errno::ENOTDIR as i32) =>
        {
            Ok(At::NotReal)
        }
        Err(e) => Err(e),
    }
}

/// Reads the file at `rel` (components separated by `/`) below `gitdir`,
/// walking from directory handles; `Capped::NotRegular` when any component
/// on the way is a symlink or not a directory, or the file is not regular.
fn read_below(gitdir: &Path, rel: &str, cap: u64) -> std::io::Result<Capped> {
    let mut dir = match open_gitdir(gitdir)? {
        At::File(f) => f,
        At::Missing => return Ok(Capped::Missing),
        At::NotReal => return Ok(Capped::NotRegular),
    };
    let components: Vec<&str> = rel.split('/').collect();
    let Some((last, parents)) = components.split_last() else {
        return Ok(Capped::Missing);
    };
    for part in parents {
        if matches!(*part, "" | "." | "..") {
            return Ok(Capped::NotRegular);
        }
        dir = match open_at(&dir, part, true)? {
            At::File(f) => f,
            At::Missing => return Ok(Capped::Missing),
            At::NotReal => return Ok(Capped::NotRegular),
        };
    }
    if matches!(*last, "" | "." | "..") {
        return Ok(Capped::NotRegular);
    }
    match open_at(&dir, last, false)? {
        At::File(f) => {
            if f.metadata()?.file_type().is_dir() {
                // A directory where a loose ref would be: no such loose ref
                // (`refs/heads/a` when only `refs/heads/a/b` exists).
                return Ok(Capped::Missing);
            }
            read_open_capped(f, cap)
        }
        At::Missing => Ok(Capped::Missing),
        At::NotReal => Ok(Capped::NotRegular),
    }
}

/// The branch `.git/HEAD` names, when it is `ref: refs/heads/<valid name>`.
fn read_head_branch(gitdir: &Path) -> Result<Option<String>, GitError> {
    let data = match read_below(gitdir, "HEAD", MAX_REF_FILE)
        .map_err(|e| GitError::io("reading worktree HEAD", gitdir.join("HEAD"), e))?
    {
        Capped::Data(d) => d,
        _ => return Ok(None),
    };
    let Ok(text) = std::str::from_utf8(&data) else {
        return Ok(None);
    };
    let Some(target) = text.trim_end_matches(['\n', '\r']).strip_prefix("ref: ") else {
        return Ok(None);
    };
    let target = target.trim();
    if target.starts_with("refs/heads/") && git2::Reference::is_valid_name(target) {
        Ok(Some(target.to_owned()))
    } else {
        Ok(None)
    }
}

/// Reads `refname` from its loose file or from `packed-refs`; `None` when it
/// exists in neither.
pub(super) fn read_ref(gitdir: &Path, refname: &str) -> Result<Option<Oid>, GitError> {
    let bad = |why: String| GitError::BadRef {
        reference: refname.to_owned(),
        why,
    };
    if !git2::Reference::is_valid_name(refname) {
        return Err(bad("not a valid ref name".to_owned()));
    }
    match read_below(gitdir, refname, MAX_REF_FILE)
        .map_err(|e| GitError::io("reading worktree ref", gitdir.join(refname), e))?
    {
        Capped::Missing => {}
        Capped::Data(data) => {
            return parse_hex_line(&data).map(Some).ok_or_else(|| {
                bad(
                    "the loose ref does not hold a 40-hex id (symbolic refs are not followed)"
                        .to_owned(),
                )
            })
        }
        Capped::NotRegular => {
            return Err(bad(
                "a symlink or special file is on the way to the loose ref (never followed)"
                    .to_owned(),
            ))
        }
        Capped::TooLarge(size) => return Err(bad(format!("the loose ref file is {size} bytes"))),
    }

    let data = match read_below(gitdir, "packed-refs", MAX_PACKED_REFS).map_err(|e| {
        GitError::io(
            "reading worktree packed-refs",
            gitdir.join("packed-refs"),
            e,
        )
    })? {
        Capped::Missing => return Ok(None),
        Capped::Data(d) => d,
        Capped::NotRegular => return Err(bad("packed-refs is not a regular file".to_owned())),
        Capped::TooLarge(size) => return Err(bad(format!("packed-refs is {size} bytes"))),
    };
    Ok(find_packed(&data, refname))
}

fn parse_hex_line(data: &[u8]) -> Option<Oid> {
    let text = std::str::from_utf8(data)
        .ok()?
        .trim_end_matches(['\n', '\r']);
    if text.len() != 40 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Oid::from_str(text).ok()
}

/// The id of `refname` in the text of a packed-refs file; malformed lines are
/// ignored, as git ignores peeled (`^`) and comment lines.
fn find_packed(data: &[u8], refname: &str) -> Option<Oid> {
    data.split(|&b| b == b'\n').find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() < 42 || line[40] != b' ' || &line[41..] != refname.as_bytes() {
            return None;
        }
        parse_hex_line(&line[..40])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";

    #[test]
    fn packed_refs_lines_are_matched_exactly() {
        let text = format!(
            "# pack-refs with: peeled fully-peeled sorted\n{A} refs/heads/nightshift/run/x2\n^{A}\n{A} refs/heads/nightshift/run/x\n"
        );
        assert_eq!(
            find_packed(text.as_bytes(), "refs/heads/nightshift/run/x"),
            Some(Oid::from_str(A).unwrap())
        );
        assert_eq!(
            find_packed(text.as_bytes(), "refs/heads/nightshift/run/x3"),
            None
        );
        assert_eq!(find_packed(b"zzzz refs/heads/a\n", "refs/heads/a"), None);
    }

    #[test]
    fn loose_refs_must_be_forty_hex() {
        assert!(parse_hex_line(format!("{A}\n").as_bytes()).is_some());
        assert!(parse_hex_line(b"ref: refs/heads/main\n").is_none());
        assert!(parse_hex_line(&A.as_bytes()[..39]).is_none());
    }

    #[test]
    fn head_is_followed_only_to_valid_branches() {
        let dir = tempfile::tempdir().unwrap();
        let head = dir.path().join("HEAD");
        for (content, want) in [
            ("ref: refs/heads/feature\n", Some("refs/heads/feature")),
            ("ref: refs/tags/v1\n", None),
            ("ref: refs/heads/../../config\n", None),
            (A, None),
        ] {
            std::fs::write(&head, content).unwrap();
            assert_eq!(
                read_head_branch(dir.path()).unwrap().as_deref(),
                want,
                "{content}"
            );
        }
    }

    #[test]
    fn symlinked_ref_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(elsewhere.path().join("heads")).unwrap();
        std::fs::write(elsewhere.path().join("heads/main"), format!("{A}\n")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("refs")).unwrap();
        let err = read_ref(dir.path(), "refs/heads/main").unwrap_err();
        assert!(matches!(err, GitError::BadRef { .. }), "{err}");
    }

    #[test]
    fn no_lookup_through_a_symlink_tells_whether_a_host_file_exists() {
        // `refs/heads` is a symlink to a host directory: whether the named
        // file exists there, and what it holds, changes nothing in the answer.
        let dir = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("present"), format!("{A}\n")).unwrap();
        std::fs::write(host.path().join("big"), "x".repeat(10_000)).unwrap();
        std::fs::create_dir(dir.path().join("refs")).unwrap();
        std::os::unix::fs::symlink(host.path(), dir.path().join("refs/heads")).unwrap();
        let answers: Vec<String> = ["present", "big", "absent"]
            .iter()
            .map(|name| {
                read_ref(dir.path(), &format!("refs/heads/{name}"))
                    .unwrap_err()
                    .to_string()
                    .replace(name, "NAME")
            })
            .collect();
        assert_eq!(answers[0], answers[1]);
        assert_eq!(answers[0], answers[2]);
        assert!(!answers[0].contains(host.path().to_str().unwrap()));
        // `.git` itself a symlink: nothing through it is read.
        let outer = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(host.path().join("refs/heads")).unwrap();
        std::fs::write(host.path().join("refs/heads/main"), format!("{A}\n")).unwrap();
        std::fs::write(host.path().join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let link = outer.path().join(".git");
        std::os::unix::fs::symlink(host.path(), &link).unwrap();
        assert!(read_ref(&link, "refs/heads/main").is_err());
        assert_eq!(read_head_branch(&link).unwrap(), None);
    }

    #[test]
    fn a_fifo_or_oversized_file_as_a_ref_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("refs/heads")).unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("refs/heads/fifo"),
            Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        assert!(read_ref(dir.path(), "refs/heads/fifo").is_err());
        let big = std::fs::File::create(dir.path().join("refs/heads/big")).unwrap();
        big.set_len(10 << 30).unwrap();
        assert!(matches!(
            read_ref(dir.path(), "refs/heads/big"),
            Err(GitError::BadRef { why, .. }) if why.contains("bytes")
        ));
        nix::unistd::mkfifo(&dir.path().join("HEAD"), Mode::from_bits_truncate(0o644)).unwrap();
        assert_eq!(read_head_branch(dir.path()).unwrap(), None);
    }

    #[test]
    fn loose_refs_in_real_directories_are_read_and_hide_packed_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("refs/heads/agent/x")).unwrap();
        std::fs::write(dir.path().join("refs/heads/main"), format!("{A}\n")).unwrap();
        let b = "2222222222222222222222222222222222222222";
        std::fs::write(
            dir.path().join("packed-refs"),
            format!("{b} refs/heads/main\n{b} refs/heads/agent\n"),
        )
        .unwrap();
        assert_eq!(
            read_ref(dir.path(), "refs/heads/main").unwrap(),
            Some(Oid::from_str(A).unwrap())
        );
        // A directory where the loose ref would be: the packed one counts.
        assert_eq!(
            read_ref(dir.path(), "refs/heads/agent").unwrap(),
            Some(Oid::from_str(b).unwrap())
        );
        assert_eq!(read_ref(dir.path(), "refs/heads/none").unwrap(), None);
    }
}
