//! `nightshift worker`: the run queue's runs and the act executor without
//! the pages (`serve` without its dashboard), for several workers sharing
//! one store (the hosted shape: each on its own engine, all on one
//! PostgreSQL).
//!
//! Invariants:
//! - One watchdog for the whole process, started before anything runs, as
//!   `serve`'s: every sandbox of its runs carries this process's identity.
//! - Its tasks are leased in the store (`run_queue`'s note): a worker that
//!   dies leaves its tasks to be taken over by another once their leases
//!   lapse, and the fleet's budget counts every worker's runs
//!   (`tests/tests/serve_queue.rs::two_workers_share_one_queue_and_one_takes_over_a_killed_ones_tasks`).
//! - Asked to stop, it stops its runs (each ends `interrupted`, its work
//!   imported) and waits for them before it returns.

use std::sync::Arc;

use tokio::sync::watch;

use super::serve::{QueueError, RunQueue};
use super::Warn;
use crate::api::Api;

/// Runs the queue's tasks in this process and carries out approved acts
/// until `stop` turns true.
pub async fn work(
    api: &Api,
    queue: RunQueue,
    stop: watch::Receiver<bool>,
    warn: Warn<'_>,
) -> Result<(), QueueError> {
    let config = api.load_config().map_err(QueueError::NoDispatcher)?;
    crate::acts::use_queue_ttls(config.queue_ttls());
    crate::acts::use_queue_bounds(config.queue_bounds());
    api.open_state().map_err(QueueError::NoDispatcher)?;
    let identity = crate::api::process_identity();
    super::watchdog::spawn(api.root(), api.config_path(), &identity, warn);
    // The act executor: what the owner approved, wherever they decided.
    let executor_store = api.open_store().map_err(QueueError::NoDispatcher)?;
    let executor = tokio::spawn(crate::acts::executor::run(Arc::new(crate::acts::passes(
        executor_store,
        crate::acts::executor::LEASE_SECS,
        |_| {},
    ))));
    let ran = super::serve::run_queue(api, &config, queue, stop).await;
    executor.abort();
    ran
}
