//! Credentials, read from the owner's files at the moment they are used.
//!
//! Invariants:
//! - A [`Secret`] never prints: its `Debug` is `***`, it has no `Display`,
//!   no `Serialize`, and no error of this crate carries one. The only way to
//!   the text is [`Secret::expose`], called where the credential is handed
//!   to the destination and nowhere else.
//! - A secret is one line of visible text: no control character can reach
//!   an HTTP header or a git credential, so a file cannot smuggle a second
//!   header. One trailing line end is dropped, as editors add it.
//! - Reading errors name the file, never its content.

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

    /// Reads a credential file: one line, at most 16 KiB.
    pub fn read_file(path: &Path) -> Result<Secret, SecretError> {
        let file = std::fs::File::open(path).map_err(SecretError::Io)?;
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

    /// The credential's text, to hand to the destination. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
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
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, content).unwrap();
        f
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
}
