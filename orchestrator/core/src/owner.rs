//! The owner's credential: a random key made once per state, kept in a file
//! only the owner can read (`STATE/owner.key`, mode 0600), and checked by its
//! digest (`tests::the_key_is_a_0600_file_the_store_keeps_only_the_digest_of`).
//! It is never a name anyone can type, and no sandbox sees it: a sandbox's
//! mounts are its worktree and its own door directory, and the attestation
//! fails any other (`orchestrator/attest/tests/fixtures.rs::recorded_docker_socket_mount_fails_mounts_naming_it`).
//!
//! Invariant: the only way to obtain an [`Owner`] is [`verify`] with the key
//! (its field is private; `tests::the_key_is_a_0600_file_the_store_keeps_only_the_digest_of`).

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::audit_log::digest;
use crate::state_store::StateStore;
use crate::state_store::StoreError;

pub const META_KEY: &str = "owner_key_sha256";

#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("no owner credential is configured: run `nightshift owner init`")]
    NotConfigured,
    #[error("this needs the owner's credential: pass --owner-key-file (or set NIGHTSHIFT_OWNER_KEY_FILE)")]
    Missing,
    #[error("reading the owner key {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the owner key given is not the owner's credential")]
    Wrong,
    #[error("writing the owner key {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Proof that the owner's credential was presented.
#[derive(Debug, Clone)]
pub struct Owner {
    _private: (),
}

/// Makes the owner key if there is none; returns its path and whether it is new.
pub fn init(store: &mut dyn StateStore) -> Result<(PathBuf, bool), OwnerError> {
    let path = store.root().join("owner.key");
    if store.meta(META_KEY)?.is_some() {
        return Ok((path, false));
    }
    let mut raw = [0u8; 32];
    getrandom(&mut raw).map_err(|source| OwnerError::Write {
        path: path.clone(),
        source,
    })?;
    let key = hex::encode(raw);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|source| OwnerError::Write {
            path: path.clone(),
            source,
        })?;
    writeln!(f, "{key}").map_err(|source| OwnerError::Write {
        path: path.clone(),
        source,
    })?;
    store.set_meta(META_KEY, Some(&digest(key.as_bytes())))?;
    Ok((path, true))
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Checks the key in `key_file` against the stored digest.
pub fn verify<S: StateStore + ?Sized>(
    store: &S,
    key_file: Option<&Path>,
) -> Result<Owner, OwnerError> {
    let expected = store.meta(META_KEY)?.ok_or(OwnerError::NotConfigured)?;
    let path = key_file.ok_or(OwnerError::Missing)?;
    let text = fs::read_to_string(path).map_err(|source| OwnerError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let presented = digest(text.trim().as_bytes());
    // Compare digests of equal length byte by byte without early exit.
    let same = presented.len() == expected.len()
        && presented
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        Ok(Owner { _private: () })
    } else {
        Err(OwnerError::Wrong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_store::fake::MemStore;
    use crate::state_store::PolicyStore;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_key_is_a_0600_file_the_store_keeps_only_the_digest_of() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        assert!(matches!(
            verify(&store, None),
            Err(OwnerError::NotConfigured)
        ));
        let (path, new) = init(&mut store).unwrap();
        assert!(new);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let key = fs::read_to_string(&path).unwrap();
        let stored = store.meta(META_KEY).unwrap().unwrap();
        assert_ne!(stored, key.trim());
        assert_eq!(stored, digest(key.trim().as_bytes()));
        // Made once: a second init keeps the key.
        assert_eq!(init(&mut store).unwrap(), (path.clone(), false));
        assert!(verify(&store, Some(&path)).is_ok());
        assert!(matches!(verify(&store, None), Err(OwnerError::Missing)));
        let wrong = dir.path().join("wrong.key");
        fs::write(&wrong, "ab".repeat(32)).unwrap();
        assert!(matches!(
            verify(&store, Some(&wrong)),
            Err(OwnerError::Wrong)
        ));
    }
}
