//! The git adapter: the only crate of nightshift that names `git2`.
//!
//! Three jobs, each in its own module:
//! - [`resolve_base`] turns a host repository and a ref into the base commit of a run;
//! - [`create_worktree`] makes the run's self-contained checkout, which shares no
//!   file and no pointer with the host repository;
//! - [`import_run`] brings the run's result back into the host repository as
//!   `refs/nightshift/runs/<id>`, reading the worktree only as data;
//! - [`remove_worktree`] throws the worktree away;
//! - [`receive_pack`] takes the commit of an act from the pack the agent sent
//!   over the door, into the host under `refs/nightshift/acts/<id>`, without
//!   ever reading the worktree while the sandbox can still change it; the
//!   pack is first checked against the limits from its headers alone
//!   ([`scan_pack`], pure over a `Read`), and the commit may reference only
//!   objects of the pack or reachable from the run's base.
//!
//! Invariants held across the crate:
//! - the host repository is trusted; the worktree, once a sandbox has run in it, is
//!   hostile: it is never opened as a repository, no hook, config, attribute,
//!   filter or submodule entry of it is read or run, and no symlink in it is
//!   followed;
//! - no tree git would refuse (an entry `..`, a name holding `/`, `.git` or
//!   an alias of it, a name given twice) enters the host from a worktree, and
//!   none is ever checked out: every write of a checkout goes through
//!   directory handles that never follow a symlink ([`tree_names`],
//!   [`checkout`]);
//! - a worktree holds only the objects reachable from its base commit;
//! - the host repository only ever gains objects and refs under
//!   `refs/nightshift/runs/` and `refs/nightshift/acts/`; its HEAD, branches,
//!   config and working tree are
//!   never touched.

#![forbid(unsafe_code)]

mod base;
mod checkout;
mod error;
mod fsx;
mod import;
mod reachable;
mod run_id;
mod tree_names;
mod worktree;

pub use base::{resolve_base, root_entries, Base};
pub use error::GitError;
pub use import::{
    diffstat_between, import_failure_kind, import_run, receive_pack, scan_pack, Captured,
    HistoryDropped, ImportLimits, ImportSpec, Imported, PackLimits, PackScanError, PackSpec,
    PackSummary, SkipReason, Skipped, TipSource, MAX_SKIPPED_LISTED,
};
pub use run_id::{result_ref, run_branch, validate_run_id};
pub use tree_names::{check_name as check_tree_entry_name, check_tree, CheckedEntry};
pub use worktree::{create_worktree, remove_worktree, Worktree, WorktreeSpec};
