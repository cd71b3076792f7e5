//! The core of nightshift: the ports the rest is built on (the state
//! store's, split by concern, in [`state_store`]; the container engine's in
//! [`container_engine`]), the neutral types that cross them, and the
//! decisions that need nothing but data: the policy gate's loading and
//! recording ([`policy`]), the owner's credential ([`owner`]), accounts
//! ([`accounts`]), the sandbox's specification ([`sandbox`]), the token
//! caps ([`tokens`]) and the configuration ([`config`]).
//!
//! It names no adapter: no container engine's client, no database driver,
//! no HTTP framework. `scripts/check-layers.sh` (run by `scripts/test.sh`)
//! fails if this crate, or any crate but the adapters, depends on bollard,
//! rusqlite, the PostgreSQL client or axum.

pub mod accounts;
pub mod audit_log;
pub mod channel;
pub mod config;
pub mod container_engine;
pub mod front;
pub mod hosted;
pub mod hostview;
pub mod metrics;
pub mod monitor;
pub mod owner;
pub mod policy;
pub mod sandbox;
pub mod secret_file;
pub mod setup;
pub mod state_store;
pub mod terminal;
pub mod tokens;

/// Exit codes of the `nightshift` binary (documented in README.md).
pub mod exit {
    /// Success; for `run`, the agent exited 0.
    pub const OK: i32 = 0;
    /// The run ended but not well (the agent exited non-zero, was killed or
    /// timed out), or `audit verify` found the chain broken.
    pub const FAILED: i32 = 1;
    /// Command-line usage error (clap's own code).
    pub const USAGE: i32 = 2;
    /// Bad input: not a repository, unknown ref, unknown run, bad argument.
    pub const BAD_INPUT: i32 = 3;
    /// The container engine is unreachable.
    pub const ENGINE: i32 = 4;
    /// The image is not in the local engine.
    pub const IMAGE_MISSING: i32 = 5;
    /// The sandbox failed the Tier 0 attestation; the run was refused.
    pub const REFUSED: i32 = 6;
    /// The state store could not be read or written.
    pub const STATE: i32 = 7;
    /// Anything else the supervisor could not do (git, files, the image recipe).
    pub const INTERNAL: i32 = 8;
    /// Refused: the owner's credential is missing or wrong, the policy
    /// refused the change, or nightshift is frozen.
    pub const DENIED: i32 = 9;
    /// The run's work was not imported whole: the agent's commits were left
    /// out (refused at import), its working files arrived.
    pub const NOT_WHOLE: i32 = 10;
    /// The import failed: nothing arrived, the worktree is kept, and
    /// `nightshift import RUN` retries it.
    pub const IMPORT_FAILED: i32 = 11;
    /// Interrupted by SIGINT / SIGTERM (128 + signal number).
    pub const SIGINT: i32 = 130;
    pub const SIGTERM: i32 = 143;
}

/// A short tag naming one state directory, put on its containers' labels so
/// that separate states never touch each other's sandboxes.
pub fn state_tag(root: &std::path::Path) -> String {
    let canonical = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    crate::audit_log::digest(canonical.to_string_lossy().as_bytes())[..12].to_string()
}
