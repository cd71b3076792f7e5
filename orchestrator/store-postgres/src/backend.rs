//! The PostgreSQL store as the binary holds it ([`StoreBackend`]): one URL
//! and the state directory; each caller takes a connection of its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nightshift_core::state_store::{StateStore, StoreBackend, StoreError, TokenLedger};

use crate::{redact, PgStore};

/// A PostgreSQL database holding the state; files (rules, destinations,
/// worktrees) stay under `root`.
pub struct PgBackend {
    url: String,
    root: PathBuf,
    /// Idle connections kept between callers (`PgStore::pooled`).
    pool: crate::Pool,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("url", &redact(&self.url))
            .field("root", &self.root)
            .finish()
    }
}

impl PgBackend {
    /// The store at `url` (`postgres://…`, a Unix socket as `?host=/dir`),
    /// its files under `root`. Nothing is connected until asked.
    pub fn new(url: &str, root: PathBuf) -> Self {
        Self {
            url: url.to_string(),
            root,
            pool: Default::default(),
        }
    }
}

impl StoreBackend for PgBackend {
    fn connect(&self) -> Result<Box<dyn StateStore>, StoreError> {
        Ok(Box::new(PgStore::pooled(
            &self.url, &self.root, &self.pool,
        )?))
    }
    fn connect_existing(&self, busy: Duration) -> Result<Option<Box<dyn StateStore>>, StoreError> {
        Ok(PgStore::connect_existing(&self.url, &self.root, busy)?
            .map(|s| Box::new(s) as Box<dyn StateStore>))
    }
    fn ledger(&self) -> Result<Box<dyn TokenLedger>, StoreError> {
        Ok(Box::new(PgStore::pooled(
            &self.url, &self.root, &self.pool,
        )?))
    }
    fn root(&self) -> &Path {
        &self.root
    }
    fn location(&self) -> String {
        redact(&self.url)
    }
    fn migrate(&self) -> Result<(u32, u32), StoreError> {
        let m = PgStore::connect(&self.url, &self.root)?.migrated();
        let version = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok((version(m.from), version(m.to)))
    }
}
