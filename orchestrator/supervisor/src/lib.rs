//! The supervisor: the command API every front end speaks ([`api`]), the
//! door's gate and the act queue ([`acts`], [`door`]), the run lifecycle
//! ([`run`], generic over the core's engine and store ports; its end-of-run
//! packer, `run::packer`; what comes back, [`landing`]), the run
//! queue ([`run_queue`], [`task_runner`]), the kill switch
//! ([`killswitch`]), reports and scope proposals ([`report`], [`scopes`],
//! [`summary`]), the agent presets ([`agents`]), the demo ([`demo`]), and
//! the logic of the binary's commands that are more than one API command
//! ([`commands`]: a foreground run, the watchdog, the dispatcher of `tasks
//! run`, `serve`'s run queue, the executor of `execute`, the hook's check),
//! so that the binary parses, builds the ports and renders.
//!
//! It builds on the core's ports and is handed the adapters; it names no
//! engine client, database driver or HTTP framework itself
//! (`scripts/check-layers.sh`). Where it still opens the SQLite store by
//! its state directory, it does so through `nightshift_store_sqlite`.

pub mod acts;
pub mod agents;
pub mod api;
pub mod channels;
pub mod commands;
pub mod continuation;
pub mod demo;
pub mod door;
pub mod error;
pub mod killswitch;
pub mod landing;
pub mod pool;
pub mod report;
pub mod run;
pub mod run_queue;
pub mod scopes;
pub mod setup;
pub mod summary;
pub mod task_runner;
pub mod tasks;
pub mod wake;
pub mod warm;
