//! Credentials, read from the owner's files at the moment they are used.
//!
//! Invariants:
//! - A [`Secret`] never prints: its `Debug` is `***`, it has no `Display`,
//!   no `Serialize`, and no error of this crate carries one
//!   (`tests::debug_hides_the_text`). The only way to the text is
//!   [`Secret::expose`] (the field is private), called where the credential
//!   is handed to the destination, and where an answer is scrubbed of it or
//!   a URL kept in a file is checked.
//! - A secret is one line of visible text: no control character can reach
//!   an HTTP header or a git credential, so a file cannot smuggle a second
//!   header. One trailing line end is dropped, as editors add it.
//! - Reading errors name the file, never its content
//!   (`tests::reading_errors_show_no_content`; the callers name the file:
//!   `tests/destinations.rs::a_world_readable_token_file_is_refused_naming_it_and_nothing_is_sent`).
//! - A credential file must be a regular file owned by the user the
//!   supervisor runs as and not readable or writable by group or others
//!   (mode `0600` or tighter); any other is refused before a byte is read.
//!   The check is made on the opened file, so a rename between check and
//!   read cannot swap it.

use std::fmt;
use std::io::Read;
use std::path::Path;

/// Largest credential file read; anything bigger is not a credential.
const MAX_SECRET_BYTES: u64 = 16 * 1024;

/// A credential in memory. See the module note for what it never does.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential held in memory (for callers that do not read it
    /// from a file). Refuses what [`Secret::read_file`] refuses.
    pub fn new(text: impl Into<String>) -> Result<Secret, SecretError> {
        let text = text.into();
        check(&text)?;
        Ok(Secret(text))
    }

    /// Reads a credential file: one line, at most 16 KiB, owned by this
    /// process's effective user, mode `0600` or tighter.
    pub fn read_file(path: &Path) -> Result<Secret, SecretError> {
        let file = std::fs::File::open(path).map_err(SecretError::Io)?;
        let meta = file.metadata().map_err(SecretError::Io)?;
        check_owner_and_mode(
            &meta,
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )?;
        let mut bytes = Vec::new();
        file.take(MAX_SECRET_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(SecretError::Io)?;
        if bytes.len() as u64 > MAX_SECRET_BYTES {
            return Err(SecretError::TooLarge {
                limit: MAX_SECRET_BYTES,
            });
        }
        let mut text = String::from_utf8(bytes).map_err(|_| SecretError::NotText)?;
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        check(&text)?;
        Ok(Secret(text))
    }

    /// Reads a private key file (several lines, at most 16 KiB), with the
    /// same owner and mode checks as [`Secret::read_file`].
    pub fn read_key_file(path: &Path) -> Result<Secret, SecretError> {
        let file = std::fs::File::open(path).map_err(SecretError::Io)?;
        let meta = file.metadata().map_err(SecretError::Io)?;
        check_owner_and_mode(
            &meta,
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )?;
        let mut bytes = Vec::new();
        file.take(MAX_SECRET_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(SecretError::Io)?;
        if bytes.len() as u64 > MAX_SECRET_BYTES {
            return Err(SecretError::TooLarge {
                limit: MAX_SECRET_BYTES,
            });
        }
        let text = String::from_utf8(bytes).map_err(|_| SecretError::NotText)?;
        if text.trim().is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Secret(text))
    }

    /// The credential's text, to hand to the destination. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Refuses a file that is not regular, not owned by `uid` (nor root with
/// this process's group: `nightshift_core::secret_file`), or open to group
/// or others.
pub(crate) fn check_owner_and_mode(
    meta: &std::fs::Metadata,
    uid: u32,
    gid: u32,
) -> Result<(), SecretError> {
    use nightshift_core::secret_file::{problem, Problem, Seen};
    use std::os::unix::fs::MetadataExt;
    match problem(Seen {
        regular: meta.is_file(),
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode(),
        euid: uid,
        egid: gid,
    }) {
        None => Ok(()),
        Some(Problem::NotAFile) => Err(SecretError::NotAFile),
        Some(Problem::WrongOwner { owner, .. }) => Err(SecretError::WrongOwner {
            owner,
            expected: uid,
        }),
        Some(Problem::TooOpen { mode }) => Err(SecretError::TooOpen { mode }),
    }
}

fn check(text: &str) -> Result<(), SecretError> {
    if text.is_empty() {
        return Err(SecretError::Empty);
    }
    if text.chars().any(char::is_control) {
        return Err(SecretError::NotOneLine);
    }
    Ok(())
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Why a credential could not be had. Never holds any of its text.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("the file cannot be read")]
    Io(#[source] std::io::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error("the file is owned by uid {owner}, not by the supervisor's user (uid {expected})")]
    WrongOwner { owner: u32, expected: u32 },
    #[error("the file's mode is {mode:04o}: group or others may read or write it; make it 0600")]
    TooOpen { mode: u32 },
    #[error("the file is over {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("the file is not UTF-8 text")]
    NotText,
    #[error("the file is empty")]
    Empty,
    #[error("the credential is not one line of visible text")]
    NotOneLine,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(content: &[u8]) -> tempfile::NamedTempFile {
        use std::os::unix::fs::PermissionsExt;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, content).unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        f
    }

    #[test]
    fn a_file_open_to_group_or_others_is_refused_naming_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        for mode in [0o644, 0o604, 0o640, 0o620, 0o666] {
            let f = file(b"tok\n");
            std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let err = Secret::read_file(f.path()).unwrap_err();
            assert!(
                matches!(err, SecretError::TooOpen { .. }),
                "{mode:o}: {err}"
            );
            assert!(err.to_string().contains(&format!("{mode:04o}")), "{err}");
        }
        for mode in [0o600, 0o400] {
            let f = file(b"tok\n");
            std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(Secret::read_file(f.path()).unwrap().expose(), "tok");
        }
    }

    #[test]
    fn a_file_of_another_user_or_not_a_file_is_refused() {
        let f = file(b"tok\n");
        let meta = std::fs::metadata(f.path()).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let group = nix::unistd::getegid().as_raw();
        assert!(check_owner_and_mode(&meta, me, group).is_ok());
        assert!(matches!(
            check_owner_and_mode(&meta, me.wrapping_add(1), group.wrapping_add(1)),
            Err(SecretError::WrongOwner { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Secret::read_file(dir.path()),
            Err(SecretError::NotAFile)
        ));
    }

    #[test]
    fn debug_hides_the_text() {
        let s = Secret::new("hunter2").unwrap();
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn one_trailing_line_end_is_dropped() {
        for content in [&b"tok\n"[..], b"tok\r\n", b"tok"] {
            let f = file(content);
            assert_eq!(Secret::read_file(f.path()).unwrap().expose(), "tok");
        }
    }

    #[test]
    fn refuses_what_is_not_one_line_of_text() {
        for content in [
            &b""[..],
            b"\n",
            b"a\nb",
            b"a\r\nX-Other: 1\n",
            b"\xff\xfe",
            b"a\tb",
        ] {
            let f = file(content);
            let err = Secret::read_file(f.path()).unwrap_err();
            assert!(!matches!(err, SecretError::Io(_)), "{content:?}: {err}");
        }
        let big = file(&vec![b'a'; 20_000]);
        assert!(matches!(
            Secret::read_file(big.path()),
            Err(SecretError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_missing_file_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Secret::read_file(&dir.path().join("nope")),
            Err(SecretError::Io(_))
        ));
    }

    #[test]
    fn reading_errors_show_no_content() {
        let long = [&b"SECRET"[..], &vec![b'a'; 20_000]].concat();
        for content in [
            &b"SECRET\nX-Other: 1\n"[..],
            b"SECRET\tx",
            b"SECRET\xff",
            &long,
        ] {
            let f = file(content);
            let err = Secret::read_file(f.path()).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("SECRET"), "{shown}");
        }
    }
}
