//! Reading the agent's tip from the worktree's ref files, as data.
//!
//! Invariants: only `.git/HEAD`, one loose ref file and `.git/packed-refs` are
//! read, each with [`crate::fsx::read_capped`] (no symlink followed, no FIFO
//! opened, size-capped); every directory on the way to a loose ref must be a
//! real directory; a loose ref must hold exactly 40 hex digits (symbolic loose
//! refs are not followed); a loose ref hides a packed one, as in git.

use std::path::Path;

use git2::{ObjectType, Odb, Oid};

use super::TipSource;
use crate::fsx::{is_real_dir, read_capped, Capped};
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

/// The branch `.git/HEAD` names, when it is `ref: refs/heads/<valid name>`.
fn read_head_branch(gitdir: &Path) -> Result<Option<String>, GitError> {
    let path = gitdir.join("HEAD");
    let data = match read_capped(&path, MAX_REF_FILE)
        .map_err(|e| GitError::io("reading worktree HEAD", &path, e))?
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
    // Every directory on the way must be real, or the loose ref is not there.
    let components: Vec<&str> = refname.split('/').collect();
    let mut dir = gitdir.to_owned();
    let mut loose_possible = true;
    for part in &components[..components.len() - 1] {
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => return Err(bad(format!("{} is not a real directory", dir.display()))),
            Err(_) => {
                loose_possible = false;
                break;
            }
        }
    }
    if loose_possible {
        let path = gitdir.join(refname);
        match read_capped(&path, MAX_REF_FILE)
            .map_err(|e| GitError::io("reading worktree ref", &path, e))?
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
                if !is_real_dir(&path).unwrap_or(false) {
                    return Err(bad("the loose ref is not a regular file".to_owned()));
                }
            }
            Capped::TooLarge(size) => {
                return Err(bad(format!("the loose ref file is {size} bytes")))
            }
        }
    }

    let packed = gitdir.join("packed-refs");
    let data = match read_capped(&packed, MAX_PACKED_REFS)
        .map_err(|e| GitError::io("reading worktree packed-refs", &packed, e))?
    {
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
}
