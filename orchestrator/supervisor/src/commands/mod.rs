//! The commands of the `nightshift` binary that are more than one
//! [`Command`](crate::api::Command) through [`Api`](crate::api::Api): a run
//! in the foreground ([`run`]), the dead man's switch ([`watchdog`]), the
//! run queue's dispatcher of `tasks run` ([`dispatch`]), `serve`'s own
//! preparation and its run queue in process ([`serve`]), the act executor
//! of `execute` ([`execute`]), a worker without pages ([`worker`]) and
//! the harness hook's bounded check ([`policy`]). The demo is `crate::demo`'s.
//!
//! Invariants:
//! - The binary parses, builds the ports and renders: it hands these
//!   functions plain data (not its argument structs) and gets back a
//!   typed result, a value or an [`ApiError`](crate::api::ApiError) whose
//!   kind alone decides the exit code (`error.rs`). Nothing here prints a
//!   result, chooses an exit code or ends the process.
//! - What a command says along the way that is not its result (a warning:
//!   the watchdog could not be started, a reconciliation failed) goes to the
//!   [`Warn`] it is handed, as a sentence the front end prefixes.
//! - Where the binary always said "the state" (exit 7) for a store that
//!   could not be connected to, so do these (`Api::open_state`), whatever
//!   the store's own error.

pub mod audit_export;
pub mod dispatch;
pub mod execute;
pub mod hosted;
pub mod image;
pub mod policy;
pub mod run;
pub mod serve;
pub mod watchdog;
pub mod worker;

/// Where a command's warnings go: one sentence each (`warning: starting the
/// watchdog: ...`), without the program's name.
pub type Warn<'a> = &'a (dyn Fn(&str) + Send + Sync);
