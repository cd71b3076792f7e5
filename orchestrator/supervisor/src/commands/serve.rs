//! `nightshift serve`, the supervisor's side: what the process prepares
//! before the dashboard listens ([`prepare`]) and the run queue it runs in
//! process beside the pages ([`run_queue`]). The dashboard crate joins the
//! two (`nightshift_dashboard::serve_with_queue`); the act executor is its
//! task too.
//!
//! Invariants:
//! - One watchdog for the whole process, started before anything runs:
//!   every sandbox of the queue's runs carries this process's identity, so
//!   it stops them all if the process dies.
//! - The run queue's runs are in this process (`task_runner::InProcess`),
//!   with the fleet cgroup's limits of this process's configuration; the
//!   dispatcher runs until told to stop, then stops its runs and waits for
//!   them. A queue that cannot start (the engine down) leaves the pages
//!   serving.

use std::sync::Arc;

use nightshift_core::config::Config;
use nightshift_core::front::Front;
use tokio::sync::watch;

use super::Warn;
use crate::api::{Api, ApiError, ErrorKind};
use crate::run_queue::{self, DispatchOptions, Runner};

/// What `serve` runs on: its configuration, checked, and the proxy in
/// front of it (`[serve]`).
#[derive(Debug, Clone)]
pub struct Prepared {
    pub config: Config,
    pub front: Front,
}

/// The configuration (the act queue's lifetimes and bounds from it), the
/// store reached once, and this process's watchdog started.
pub fn prepare(api: &Api, warn: Warn<'_>) -> Result<Prepared, ApiError> {
    let config = api.load_config()?;
    crate::acts::use_queue_ttls(config.queue_ttls());
    crate::acts::use_queue_bounds(config.queue_bounds());
    api.open_state()?;
    let identity = crate::api::process_identity();
    super::watchdog::spawn(api.root(), api.config_path(), &identity, warn);
    // Checked when the configuration was read; a second look costs nothing.
    let front = config
        .front()
        .map_err(|e| ApiError::new(ErrorKind::BadInput, e.to_string()))?;
    Ok(Prepared { config, front })
}

/// How `serve` runs the queue's tasks.
#[derive(Debug, Clone, Copy)]
pub struct RunQueue {
    /// At most this many at once; 0 starts none (no dispatcher).
    pub max_parallel: usize,
    /// The length of the dispatcher's leases on its tasks, seconds.
    pub lease_secs: i64,
}

/// Why `serve`'s run queue did not run, or stopped before the server.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// No supervisor could be made for the runs (the engine, the store or
    /// the fleet cgroup): the pages serve without a dispatcher.
    #[error("no dispatcher ({0})")]
    NoDispatcher(#[source] ApiError),
    /// The dispatcher's loop ended with an error.
    #[error("the run queue's dispatcher stopped: {0}")]
    Stopped(#[source] ApiError),
}

/// The run queue's dispatcher, its runs in this process, until `stop`
/// turns true; then its runs are stopped and waited for.
pub async fn run_queue(
    api: &Api,
    config: &Config,
    queue: RunQueue,
    stop: watch::Receiver<bool>,
) -> Result<(), QueueError> {
    if queue.max_parallel == 0 {
        return Ok(());
    }
    // Runs in this process, with this process's identity on every
    // sandbox: the one watchdog covers them all.
    let mut sup = api
        .creating_supervisor(config)
        .await
        .map_err(QueueError::NoDispatcher)?;
    // Warm sandboxes (`[pool]`), kept until the queue stops.
    sup.pool = crate::pool::Pool::new(&config.pool, config.caps());
    let (pool_stop, pool_stopped) = watch::channel(false);
    let filling = sup
        .pool
        .clone()
        .map(|pool| tokio::spawn(crate::warm::keep_filled(sup.clone(), pool, pool_stopped)));
    let runner = crate::task_runner::InProcess {
        sup,
        config: config.clone(),
    };
    let options = DispatchOptions {
        max_parallel: queue.max_parallel,
        runner: Runner::InProcess(Arc::new(runner)),
        poll: super::dispatch::POLL,
        until_empty: false,
        lease_secs: queue.lease_secs,
    };
    let ended = run_queue::dispatch_loop(api, &options, stop)
        .await
        .map(|_| ())
        .map_err(QueueError::Stopped);
    // The warm sandboxes go with the queue, however it ended.
    let _ = pool_stop.send(true);
    if let Some(filling) = filling {
        let _ = filling.await;
    }
    ended
}
