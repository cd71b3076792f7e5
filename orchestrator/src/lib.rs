//! The `nightshift` binary's crate: the command line (`main.rs`) over the
//! crates that make the product. This library re-exports them under the
//! paths the binary, the end-to-end tests and the fuzz targets use:
//!
//! - `nightshift-core` (`orchestrator/core`): ports, neutral types, pure
//!   decisions;
//! - `nightshift-store-sqlite` (`orchestrator/store-sqlite`): the SQLite store;
//! - `nightshift-engine-docker` (`orchestrator/engine-docker`): the Docker engine;
//! - `nightshift-gateway` (`orchestrator/gateway`): the model gateway;
//! - `nightshift-supervisor` (`orchestrator/supervisor`): the command API, the
//!   gate, the queue, the lifecycle, and the logic of the binary's commands
//!   that are more than one API command (`commands`, `demo`);
//! - `nightshift-dashboard` (`dashboard/`): the pages and the HTTP API.

pub use nightshift_core::{
    accounts, audit_log, config, container_engine, exit, front, hostview, monitor, owner, policy,
    sandbox, setup, state_store, state_tag, terminal, tokens,
};
pub use nightshift_dashboard as serve;
pub use nightshift_engine_docker::{engine, image, lease};
pub use nightshift_gateway as gateway;
pub use nightshift_store_postgres as store_postgres;
pub use nightshift_store_sqlite::store;
/// The setup phase's adapter (`nightshift_supervisor::setup`); the pure
/// part is [`setup`].
pub use nightshift_supervisor::setup as setup_phase;
pub use nightshift_supervisor::{
    acts, agents, api, channels, commands, demo, door, killswitch, report, run, run_queue, scopes,
    summary, task_runner,
};
