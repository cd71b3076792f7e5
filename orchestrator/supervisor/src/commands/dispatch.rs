//! `nightshift tasks run`: the run queue's dispatcher in the foreground.
//! Each task runs as a child `nightshift run` of this binary (see
//! `run_queue`'s note), so a crash of the dispatcher takes no run with it.
//!
//! Invariant: it returns once nothing is queued or running (or only a
//! freeze keeps tasks queued), or when `stop` turns true (the caller's
//! SIGINT or SIGTERM): then the runs it started go on and the next
//! dispatcher adopts them. What it did is the returned summary
//! (`tests/tests/run_queue.rs::tasks_start_in_order_and_a_killed_dispatcher_loses_nothing`,
//! `tests/tests/run_queue.rs::a_freeze_keeps_tasks_queued_and_a_queued_task_can_be_cancelled`).

use std::time::Duration;

use tokio::sync::watch;

use crate::api::{Api, ApiError, ErrorKind};
use crate::run_queue::{self, DispatchOptions, DispatchSummary, Runner};

/// How often the queue and the children are looked at.
pub const POLL: Duration = Duration::from_millis(500);

/// Runs the dispatcher: at most `max_parallel` of the queue's runs at once
/// (every dispatcher's counted), its tasks held under leases of
/// `lease_secs`, until the queue is empty or `stop` says.
pub async fn foreground(
    api: &Api,
    max_parallel: usize,
    lease_secs: i64,
    stop: watch::Receiver<bool>,
) -> Result<DispatchSummary, ApiError> {
    let exe = std::env::current_exe().map_err(|e| {
        ApiError::caused(ErrorKind::Internal, e).doing("finding my own executable to start runs")
    })?;
    let options = DispatchOptions {
        max_parallel,
        runner: Runner::Child { exe },
        poll: POLL,
        until_empty: true,
        lease_secs,
    };
    run_queue::dispatch_loop(api, &options, stop).await
}
