//! The supervisor's side of a sandbox's lease: the heartbeat it renews.
//!
//! Every sandbox's main process is `nightshift-lease` (written into the door
//! beside the clients, see `door::CLIENTS`), which ends the sandbox when the
//! heartbeat in the run's door (`STATE/doors/<run>/heartbeat`, read-only
//! inside the sandbox at `/run/nightshift/heartbeat`: `orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`)
//! has not grown for the lease's bound (`[caps] lease`, 30 s by default).
//! The decision is `sandbox_image_door::lease`.
//!
//! Invariants:
//! - Only the run's own supervisor process renews its lease, from a thread
//!   of its own (a busy async runtime does not starve it), every
//!   [`lease::renew_every`] of the bound. When the supervisor dies (or is
//!   stopped), renewals stop and the sandbox ends within the bound, whether
//!   or not the watchdog is alive
//!   (`tests::the_heartbeat_grows_until_stopped`,
//!   `tests/tests/lease.rs::supervisor_and_watchdog_killed_the_sandbox_stops_within_the_lease`).
//! - The counter grows by one at each renewal, starting at 1 before the
//!   sandbox is created; each is published through the run's channels
//!   (`nightshift_core::channel::Channels::renew`), whole: on the host
//!   directory, written to a temporary name beside it and renamed over the
//!   last (`supervisor/src/channels.rs`), so the wrapper reads either the
//!   old counter or the new one.
//! - Nothing inside the sandbox can renew a lease: the door is mounted
//!   read-only and the wrapper counts only a counter larger than any it saw
//!   (`orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`,
//!   `sandbox-image/door/src/lease.rs::tests::the_same_or_an_older_counter_renews_nothing`,
//!   `tests/tests/lease.rs::the_agent_cannot_stop_its_lease_and_the_sandbox_ends_without_supervisor_or_watchdog`).
//! - Renewals fail closed: a heartbeat that cannot be written (the state's
//!   disk full for a bound) lets the sandbox end, as a dead supervisor would.
//! - The lease has two ends that need neither the supervisor nor the
//!   watchdog: the wrapper inside (the container's PID 1, which nothing
//!   inside can stop), and on the host a small detached process per sandbox,
//!   `nightshift lease-end` ([`end_on_lapse`]), started by the engine
//!   adapter with the container, which kills the container through the
//!   engine when the same heartbeat has not grown for
//!   [`lease::host_bound`] (the bound plus a margin, so the wrapper's own
//!   ending, which says why, comes first), and exits once the container has
//!   stopped or is gone. Nothing in the sandbox can signal it (another PID
//!   namespace) or write what it reads (the door is read-only)
//!   (`tests/tests/lease.rs::the_host_side_end_stops_a_sandbox_whose_wrapper_cannot_act`,
//!   `orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`).
//! - A run whose sandbox ended with the wrapper's status 125 (or killed,
//!   137) after its heartbeat went unrenewed for a whole bound ended because
//!   its lease lapsed ([`lapsed`]), and says so.

use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use sandbox_image_door::lease;

/// Whether a sandbox that ended with `exit_code` ended because its lease
/// lapsed: the wrapper's status for a lapse (or a kill, the host-side end's)
/// while the supervisor's renewals had stopped for at least the bound
/// (`silence`: the longest time between two renewals written, or since the
/// last one). An agent that exits 125 itself while renewals go on is not.
pub fn lapsed(exit_code: Option<i64>, silence: Duration, bound: Duration) -> bool {
    let by_lease = exit_code == Some(i64::from(lease::EXIT_EXPIRED)) || exit_code == Some(137);
    by_lease && silence >= bound
}

/// Renews one run's lease until stopped or dropped.
#[derive(Debug)]
pub struct Heartbeat {
    // Dropping the sender wakes the thread, which then stops.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// When the last renewal was written, and the longest time between two.
    written: Arc<Mutex<(Instant, Duration)>>,
}

impl Heartbeat {
    /// The longest time the lease went unrenewed so far: between two
    /// renewals written, or since the last one (a supervisor that was
    /// stopped, or could not write, shows here).
    pub fn longest_silence(&self) -> Duration {
        let (last, longest) = *self.written.lock().unwrap_or_else(|p| p.into_inner());
        longest.max(last.elapsed())
    }

    /// Stops renewing and waits until the last heartbeat is written, so that
    /// the channels can be closed without a write racing it.
    pub fn stop(mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.take();
    }
}

/// Publishes the first heartbeat through `renew` (the run's channels:
/// `nightshift_core::channel::Channels::renew`; its error is returned) and
/// renews it every [`lease::renew_every`]`(bound)` from a thread of its own
/// until the returned handle is stopped or dropped.
pub fn start(
    renew: impl Fn(u64) -> std::io::Result<()> + Send + 'static,
    bound: Duration,
) -> std::io::Result<Heartbeat> {
    renew(1)?;
    let (tx, rx) = mpsc::channel::<()>();
    let every = lease::renew_every(bound);
    let written = Arc::new(Mutex::new((Instant::now(), Duration::ZERO)));
    let shared = written.clone();
    let thread = std::thread::Builder::new()
        .name("lease-heartbeat".into())
        .spawn(move || {
            let mut counter = 1u64;
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                counter += 1;
                // A failed write is retried at the next beat; missing
                // several in a row ends the sandbox, as it should when
                // the supervisor can no longer write its state.
                if renew(counter).is_ok() {
                    let mut w = shared.lock().unwrap_or_else(|p| p.into_inner());
                    let gap = w.0.elapsed();
                    *w = (Instant::now(), w.1.max(gap));
                }
            }
        })?;
    Ok(Heartbeat {
        stop: Some(tx),
        thread: Some(thread),
        written,
    })
}

/// Reads a heartbeat file, at most [`lease::MAX_HEARTBEAT`] + 1 bytes.
fn read_counter(path: &Path) -> Option<u64> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::with_capacity(lease::MAX_HEARTBEAT + 1);
    file.take(lease::MAX_HEARTBEAT as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    lease::parse_heartbeat(&bytes)
}

/// How the host-side end of a lease finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// The container stopped (or was removed) while the lease held.
    Ended,
    /// The heartbeat did not grow for the host bound: the container was
    /// killed through the engine.
    Killed { since_renewal: Duration },
    /// The engine could not be reached for [`ENGINE_GONE_AFTER`] in a row:
    /// this end gave up (the wrapper inside still ends the sandbox at its
    /// lease).
    EngineGone { unreachable_for: Duration },
}

/// How long the host-side end goes on asking an engine it cannot reach
/// before it gives up: an engine gone for good (its socket removed, the
/// engine replaced) must not keep one process per sandbox alive for ever.
pub const ENGINE_GONE_AFTER: Duration = Duration::from_secs(600);

/// How often the host-side end reads the heartbeat, and asks the engine
/// whether the container still runs (every fourth read).
const READ_EVERY: Duration = Duration::from_millis(500);

/// The host-side end of one sandbox's lease (`nightshift lease-end`): reads
/// `heartbeat` (the door's, on the host) with the wrapper's own decision
/// over [`lease::host_bound`]`(bound)`, and kills `container` through the
/// engine when it expires. Returns once the container has stopped or is
/// gone, or was killed; engine errors are retried, and only an engine that
/// cannot be reached at all for `give_up` ([`ENGINE_GONE_AFTER`]) in a row
/// ends the watch (`tests::an_engine_gone_for_good_ends_the_watch`).
pub async fn end_on_lapse(
    engine: &impl nightshift_core::container_engine::ContainerEngine,
    container: &str,
    heartbeat: &Path,
    bound: Duration,
    give_up: Duration,
) -> LeaseEnd {
    let started = Instant::now();
    let mut held = lease::Lease::new(lease::host_bound(bound));
    let mut expired = None;
    // Since when every call to the engine failed to reach it.
    let mut unreachable_since: Option<tokio::time::Instant> = None;
    let mut reached = |e: Option<&nightshift_core::container_engine::EngineError>| match e {
        Some(e) if e.is_unreachable() => {
            let since = *unreachable_since.get_or_insert_with(tokio::time::Instant::now);
            let gone_for = since.elapsed();
            (gone_for >= give_up).then_some(gone_for)
        }
        _ => {
            unreachable_since = None;
            None
        }
    };
    for tick in 0u64.. {
        if expired.is_none() {
            let counter = read_counter(heartbeat);
            if let lease::Verdict::Expired { since_renewal } =
                held.observe(started.elapsed(), counter)
            {
                expired = Some(since_renewal);
            }
        }
        let failed = if let Some(since_renewal) = expired {
            match engine.kill(container).await {
                Ok(()) => {
                    tracing::warn!(container, ?since_renewal, "lease lapsed: sandbox killed");
                    return LeaseEnd::Killed { since_renewal };
                }
                Err(e) => {
                    tracing::warn!(container, "lease lapsed; killing: {e}");
                    Some(e)
                }
            }
        } else if tick % 4 == 0 {
            match engine.status(container).await {
                Ok(None) => return LeaseEnd::Ended,
                Ok(Some(status)) if matches!(status.as_str(), "exited" | "dead" | "removing") => {
                    return LeaseEnd::Ended
                }
                Ok(Some(_)) => None,
                Err(e) => {
                    tracing::warn!(container, "asking the engine: {e}");
                    Some(e)
                }
            }
        } else {
            // No call this tick: nothing learnt about the engine.
            tokio::time::sleep(READ_EVERY).await;
            continue;
        };
        if let Some(unreachable_for) = reached(failed.as_ref()) {
            tracing::warn!(container, ?unreachable_for, "the engine is gone: giving up");
            return LeaseEnd::EngineGone { unreachable_for };
        }
        tokio::time::sleep(READ_EVERY).await;
    }
    LeaseEnd::Ended
}

/// Starts [`end_on_lapse`] for `container` as a detached process of its own
/// (`nightshift lease-end`, in its own process group, no terminal), so that
/// it outlives the supervisor and its watchdog.
pub fn spawn_end(container: &str, door: &Path, bound: Duration) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .arg("lease-end")
        .arg("--container")
        .arg(container)
        .arg("--heartbeat")
        .arg(door.join(lease::HEARTBEAT))
        .arg("--bound-ms")
        .arg(bound.as_millis().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()?;
    // Reaped by a thread of ours while we live; by init once we are gone.
    std::thread::Builder::new()
        .name("lease-end-reaper".into())
        .spawn(move || {
            let _ = child.wait();
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_grows_until_stopped() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        let renew = move |n: u64| {
            kept.lock().unwrap().push(n);
            Ok(())
        };
        let last = || *seen.lock().unwrap().last().unwrap();
        let hb = start(renew, Duration::from_secs(1)).unwrap();
        assert_eq!(last(), 1, "the first before start returns");
        // Polled: the thread renews every 166 ms.
        while last() < 3 {
            std::thread::sleep(Duration::from_millis(20));
        }
        hb.stop();
        let stopped_at = last();
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(last(), stopped_at, "renewed after it was stopped");
        // One more each time, from 1.
        let all = seen.lock().unwrap().clone();
        assert_eq!(all, (1..=stopped_at).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_gone_for_good_ends_the_watch() {
        let engine = nightshift_core::container_engine::fake::FakeEngine::default();
        engine.lost.store(true, std::sync::atomic::Ordering::SeqCst);
        let give_up = Duration::from_secs(30);
        let ended = end_on_lapse(
            &engine,
            "c1",
            Path::new("/nonexistent/heartbeat"),
            Duration::from_secs(3600),
            give_up,
        )
        .await;
        match ended {
            LeaseEnd::EngineGone { unreachable_for } => assert!(unreachable_for >= give_up),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_that_answers_again_is_watched_on() {
        // Unreachable for less than the bound, then it answers that the
        // container has gone: the watch ends as it should, not as given up.
        let engine =
            std::sync::Arc::new(nightshift_core::container_engine::fake::FakeEngine::default());
        engine.lost.store(true, std::sync::atomic::Ordering::SeqCst);
        let back = engine.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            back.lost.store(false, std::sync::atomic::Ordering::SeqCst);
        });
        let ended = end_on_lapse(
            &*engine,
            "c1",
            Path::new("/nonexistent/heartbeat"),
            Duration::from_secs(3600),
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(ended, LeaseEnd::Ended);
    }

    #[test]
    fn a_lapse_is_the_wrappers_status_after_a_whole_bound_without_renewal() {
        let bound = Duration::from_secs(30);
        assert!(lapsed(Some(125), bound, bound));
        assert!(lapsed(Some(137), 2 * bound, bound));
        // The agent's own 125 while renewals went on.
        assert!(!lapsed(Some(125), Duration::from_secs(5), bound));
        assert!(!lapsed(Some(0), 2 * bound, bound));
        assert!(!lapsed(None, 2 * bound, bound));
    }

    #[test]
    fn a_first_heartbeat_that_cannot_be_written_is_the_error() {
        let e = start(
            |_| Err(std::io::Error::other("writing /nonexistent/door/heartbeat")),
            Duration::from_secs(30),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/door/heartbeat"), "{e}");
    }
}
