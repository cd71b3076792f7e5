//! An endpoint's API key, read from its `key_file` at each use.
//!
//! Invariants:
//! - The key lives only in its file: it is read for one call, put in that
//!   call's request header, and dropped; it is never logged, audited, kept,
//!   or put in any error message (errors name the file, never its content)
//!   (`tests::a_private_key_file_is_read_and_others_are_refused_without_showing_the_key`,
//!   `tests/tests/gateway.rs::three_shapes_stream_and_not_through_the_relay_and_the_key_stays_outside`).
//! - The file must be a regular file (not followed through a symlink) owned
//!   by the supervisor's user and readable by nobody else (no group or other
//!   permission bits), or root's with the supervisor's own group readable
//!   by that group only (a Kubernetes Secret volume's shape): a key others
//!   could read or swap is refused (`nightshift_core::secret_file`;
//!   `tests::a_private_key_file_is_read_and_others_are_refused_without_showing_the_key`,
//!   `secret_file::tests::the_rule_accepts_exactly_two_shapes`).

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The largest key file read.
const MAX_KEY_BYTES: u64 = 16 * 1024;

/// Why a key could not be used (for the owner: names the file, not the key).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading the key file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the key file {path} {problem}")]
    Unsafe { path: String, problem: String },
}

/// Reads the key in `path` (surrounding whitespace trimmed).
pub fn read(path: &Path) -> Result<String, KeyError> {
    let shown = path.display().to_string();
    let read_err = |source| KeyError::Read {
        path: shown.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    let unsafe_ = |problem: String| KeyError::Unsafe {
        path: shown.clone(),
        problem,
    };
    if let Some(p) = nightshift_core::secret_file::problem_of(&meta) {
        return Err(unsafe_(p.to_string()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_KEY_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_KEY_BYTES {
        return Err(unsafe_(format!("is over {MAX_KEY_BYTES} bytes")));
    }
    let key = String::from_utf8(bytes)
        .map_err(|_| unsafe_("does not hold text".into()))?
        .trim()
        .to_string();
    if key.is_empty() {
        return Err(unsafe_("is empty".into()));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(unsafe_(
            "holds characters a key cannot have (spaces, controls or non-ASCII)".into(),
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_key_file_is_read_and_others_are_refused_without_showing_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, "sk-secret-123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&path).unwrap(), "sk-secret-123");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("mode 0640"), "{e}");
        assert!(!e.contains("sk-secret"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read(&link).is_err(), "a symlink is not followed");
        std::fs::write(&path, "two words").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(!e.contains("words"), "{e}");
        assert!(read(&dir.path().join("missing")).is_err());
    }
}
