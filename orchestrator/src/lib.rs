//! The nightshift supervisor: run lifecycle, container-engine adapter, state
//! store and audit log. The decisions it relies on are pure crates beside it
//! (`orchestrator-attest`, `orchestrator-audit`, `policies`); the adapters are
//! here (`engine` names bollard, `store` names rusqlite) and in
//! `orchestrator-git` (git2).

pub mod acts;
pub mod agents;
pub mod api;
pub mod audit_log;
pub mod config;
pub mod container_engine;
pub mod demo;
pub mod door;
pub mod engine;
pub mod gateway;
pub mod hostview;
pub mod image;
pub mod killswitch;
pub mod lease;
pub mod monitor;
pub mod owner;
pub mod policy;
pub mod report;
pub mod run;
pub mod run_queue;
pub mod sandbox;
pub mod scopes;
pub mod serve;
pub mod state_store;
pub mod store;
pub mod summary;
pub mod task_runner;
pub mod terminal;

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
    audit_log::digest(canonical.to_string_lossy().as_bytes())[..12].to_string()
}
