//! The git adapter: the worktree and the host repository, through `git2`
//! (which the executors also use, to push).
//!
//! Three jobs, each in its own module:
//! - [`resolve_base`] turns a host repository and a ref into the base commit of a run;
//! - [`create_worktree`] makes the run's self-contained checkout, which shares no
//!   file and no pointer with the host repository;
//! - [`import_run`] brings the run's result back into the host repository as
//!   `refs/nightshift/runs/<id>`, reading the worktree only as data
//!   (`tests/hostile.rs::hostile_worktree_is_read_only_as_data`);
//! - [`pack_result`] makes that same import inside a sandbox of its own
//!   after the agent exited, and packs it; [`take_result`] takes the pack
//!   into the host through [`receive_pack`]'s checks, so the supervisor's
//!   ordinary ending never reads the worktree by path
//!   (`import::result::tests::a_packed_result_lands_as_the_host_import_would`);
//! - [`remove_worktree`] throws the worktree away;
//! - [`receive_pack`] takes the commit of an act from the pack the agent sent
//!   over the door, into the host under `refs/nightshift/acts/<id>`, without
//!   ever reading the worktree while the sandbox can still change it; the
//!   pack is first checked against the limits from its headers alone
//!   ([`scan_pack`], pure over a `Read`), and the commit may reference only
//!   objects of the pack or reachable from the run's base
//!   (`import::pack::tests::a_commit_referencing_host_only_objects_is_refused_as_an_unknown_id_is`,
//!   `tests/tests/door_races.rs::a_fifo_or_a_sparse_10gb_file_for_a_loose_object_neither_blocks_nor_bloats_the_door`).
//!
//! Invariants held across the crate:
//! - the host repository is trusted; the worktree, once a sandbox has run in it, is
//!   hostile: it is never opened as a repository, no hook, config, attribute,
//!   filter or submodule entry of it is read or run, and no symlink in it is
//!   followed (`tests/hostile.rs::hostile_worktree_is_read_only_as_data`,
//!   `tests/tests/hostile.rs::nothing_the_sandbox_wrote_runs_or_is_followed_on_the_host`);
//! - no tree git would refuse (an entry `..`, a name holding `/`, `.git` or
//!   an alias of it, a name given twice) enters the host from a worktree, and
//!   none is ever checked out: every write of a checkout goes through
//!   directory handles that never follow a symlink ([`tree_names`],
//!   [`checkout`]; `tests/hostile_trees.rs::hostile_trees_are_never_imported`,
//!   `tests/hostile_trees.rs::hostile_trees_planted_in_the_host_are_never_checked_out`);
//! - a worktree holds only the objects reachable from its base commit
//!   (`tests/worktree.rs::worktree_holds_only_objects_reachable_from_the_base`);
//! - the host repository only ever gains objects and refs under
//!   `refs/nightshift/runs/` and `refs/nightshift/acts/`; its HEAD, branches,
//!   config and working tree are never touched
//!   (`tests/hostile.rs::hostile_worktree_is_read_only_as_data`,
//!   `import::pack::tests::a_pack_less_the_base_lands_under_the_act_ref`).

#![forbid(unsafe_code)]

mod base;
mod checkout;
mod error;
mod fsx;
mod import;
mod reachable;
mod run_id;
mod setup;
mod tree_names;
mod worktree;

pub use base::{resolve_base, root_entries, Base};
pub use error::GitError;
pub use import::{
    diffstat_between, import_failure_kind, import_run, pack_result, receive_pack, scan_pack,
    take_result, write_base_objects, Captured, HistoryDropped, ImportLimits, ImportSpec, Imported,
    PackLimits, PackScanError, PackSpec, PackSummary, PackedResult, ResultClaim, ResultSpec,
    SkipReason, Skipped, TipSource, MAX_SKIPPED_LISTED,
};
pub use run_id::{result_ref, run_branch, validate_run_id};
pub use setup::{changed_lockfiles, lockfiles_at, owner_reaches};
pub use tree_names::{check_name as check_tree_entry_name, check_tree, CheckedEntry};
pub use worktree::{create_worktree, remove_worktree, Worktree, WorktreeSpec};
