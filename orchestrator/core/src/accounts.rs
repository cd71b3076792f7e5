//! The dashboard's accounts: names, roles and Argon2id password hashes, kept in
//! the state store (`users`), managed through the supervisor's command API
//! (`nightshift users add|list|remove`).
//!
//! Invariants:
//! - A password is never stored, logged or taken from the command line:
//!   only its Argon2id hash (a PHC string with its own random salt)
//!   (`tests::an_account_logs_in_with_its_password_only`,
//!   `tests/tests/dashboard_api.rs::plain_http_off_loopback_is_refused_and_passwords_come_from_stdin`).
//! - A failed login costs the same whether or not the account exists (a
//!   dummy hash is verified), so the timing does not list accounts.
//! - Changing or removing an account ends its sessions.
//! - A verification's 19 MiB of Argon2 memory comes from a pool of at most
//!   [`KEPT_BUFFERS`] buffers, reused: checks run one after another on any
//!   thread do not each leave their own 19 MiB behind in the allocator.
//!   A stored hash asking for more than [`MAX_MEMORY_KIB`] is refused.

use argon2::password_hash::{PasswordHash, PasswordHasher, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};

use crate::state_store::{Accounts, StoreError};

/// An account's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Approves, rejects, ratifies, kills, freezes, thaws.
    Owner,
    /// Reads everything, changes nothing.
    Viewer,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "owner" => Some(Role::Owner),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Viewer => "viewer",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("account name {0:?}: use 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit")]
    BadName(String),
    #[error("role {0:?}: use owner or viewer")]
    BadRole(String),
    #[error("the password must be at least 12 characters (it was {0})")]
    ShortPassword(usize),
    #[error("the password must be at most 1024 bytes")]
    LongPassword,
    #[error("hashing the password: {0}")]
    Hash(String),
    #[error("reading random bytes: {0}")]
    Random(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Random bytes from the kernel.
pub fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    use std::io::Read;
    let mut buf = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf)
}

/// The Argon2id PHC string of `password` (argon2's defaults: 19 MiB, 2 passes).
pub fn hash_password(password: &str) -> Result<String, UserError> {
    let salt = random_bytes::<16>().map_err(UserError::Random)?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| UserError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| UserError::Hash(e.to_string()))
}

/// Argon2 memory buffers kept for reuse (`serve` verifies two at once).
pub const KEPT_BUFFERS: usize = 2;
/// The most memory a stored hash may ask a verification for (64 MiB).
pub const MAX_MEMORY_KIB: u32 = 64 * 1024;

static BUFFERS: std::sync::Mutex<Vec<Vec<Block>>> = std::sync::Mutex::new(Vec::new());

fn verify_hash(phc: &str, password: &str) -> bool {
    let Ok(h) = PasswordHash::new(phc) else {
        return false;
    };
    let (Ok(algorithm), Ok(params), Some(expected), Some(salt)) = (
        Algorithm::try_from(h.algorithm),
        Params::try_from(&h),
        h.hash,
        h.salt,
    ) else {
        return false;
    };
    if params.m_cost() > MAX_MEMORY_KIB {
        return false;
    }
    let version = h
        .version
        .and_then(|v| Version::try_from(v).ok())
        .unwrap_or_default();
    let mut salt_bytes = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_bytes) else {
        return false;
    };
    let take = || BUFFERS.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let mut blocks = take().unwrap_or_default();
    blocks.resize(params.block_count(), Block::default());
    let mut out = vec![0u8; expected.len()];
    let ok = Argon2::new(algorithm, version, params)
        .hash_password_into_with_memory(password.as_bytes(), salt, &mut out, &mut blocks[..])
        .is_ok()
        && constant_time_eq(&out, expected.as_bytes());
    let mut kept = BUFFERS.lock().unwrap_or_else(|p| p.into_inner());
    if kept.len() < KEPT_BUFFERS {
        kept.push(blocks);
    }
    ok
}

/// Compares two byte strings without stopping at the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Adds (or replaces) an account.
pub fn add(
    store: &mut (impl Accounts + ?Sized),
    name: &str,
    role: &str,
    password: &str,
) -> Result<(), UserError> {
    if !valid_name(name) {
        return Err(UserError::BadName(name.to_string()));
    }
    let role = Role::parse(role).ok_or_else(|| UserError::BadRole(role.to_string()))?;
    let chars = password.chars().count();
    if chars < 12 {
        return Err(UserError::ShortPassword(chars));
    }
    if password.len() > 1024 {
        return Err(UserError::LongPassword);
    }
    store.put_user(name, role.name(), &hash_password(password)?)?;
    Ok(())
}

/// The account's role when `password` is its password.
pub fn authenticate(
    store: &(impl Accounts + ?Sized),
    name: &str,
    password: &str,
) -> Result<Option<Role>, UserError> {
    // Hashed once per process: verified in place of a missing account.
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if password.len() > 1024 {
        return Ok(None);
    }
    let found = if valid_name(name) {
        store.user(name)?
    } else {
        None
    };
    match found {
        Some((_, role, phc, _)) => Ok(verify_hash(&phc, password)
            .then(|| Role::parse(&role))
            .flatten()),
        None => {
            // Made once (others wait for it rather than each making one).
            let dummy =
                DUMMY.get_or_init(|| hash_password("not a password of anyone").unwrap_or_default());
            let _ = verify_hash(dummy, password);
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_store::fake::MemStore;

    #[test]
    fn an_account_logs_in_with_its_password_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        add(&mut store, "alice", "owner", "correct horse battery").unwrap();
        add(&mut store, "bob", "viewer", "another long password").unwrap();
        assert_eq!(
            authenticate(&store, "alice", "correct horse battery").unwrap(),
            Some(Role::Owner)
        );
        assert_eq!(
            authenticate(&store, "bob", "another long password").unwrap(),
            Some(Role::Viewer)
        );
        assert_eq!(
            authenticate(&store, "alice", "another long password").unwrap(),
            None
        );
        assert_eq!(
            authenticate(&store, "carol", "correct horse battery").unwrap(),
            None
        );
        let (_, _, phc, _) = store.user("alice").unwrap().unwrap();
        assert!(phc.starts_with("$argon2id$"), "{phc}");
        assert!(!phc.contains("correct horse"));
        assert!(matches!(
            add(&mut store, "Alice", "owner", "correct horse battery"),
            Err(UserError::BadName(_))
        ));
        assert!(matches!(
            add(&mut store, "x", "admin", "correct horse battery"),
            Err(UserError::BadRole(_))
        ));
        assert!(matches!(
            add(&mut store, "x", "owner", "short"),
            Err(UserError::ShortPassword(5))
        ));
        assert!(store.remove_user("bob").unwrap());
        assert_eq!(
            authenticate(&store, "bob", "another long password").unwrap(),
            None
        );
    }
}
