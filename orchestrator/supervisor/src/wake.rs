//! This process's run-queue dispatchers' wake-up: a counter that every
//! change to the queue made in this process moves ([`wake_dispatchers`]: an
//! enqueue, a continuation, a cancel, a thaw, a kill, through the API, the
//! dashboard or `serve`'s socket; and a run in process ending), so that a
//! dispatcher acts on it at once instead of at its next poll.
//!
//! Invariants:
//! - A watch, not a notify: a change made while a dispatcher is busy is seen
//!   when it next waits, by every dispatcher of the process, never lost
//!   (`run_queue::tests::an_enqueue_wakes_a_dispatcher_before_its_poll`).
//! - Dispatchers of other processes are not woken: they find the change at
//!   their next poll.
//! - Its own module, below both the API (which wakes) and the run queue
//!   (which waits), so neither imports the other for it.

use tokio::sync::watch;

fn changes() -> &'static watch::Sender<u64> {
    static CHANGES: std::sync::OnceLock<watch::Sender<u64>> = std::sync::OnceLock::new();
    CHANGES.get_or_init(|| watch::channel(0).0)
}

/// Tells this process's dispatchers that the queue changed.
pub fn wake_dispatchers() {
    changes().send_modify(|n| *n = n.wrapping_add(1));
}

/// What a dispatcher waits on (`changed()`) beside its poll.
pub fn subscribe() -> watch::Receiver<u64> {
    changes().subscribe()
}
