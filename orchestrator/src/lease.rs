//! The supervisor's side of a sandbox's lease: the heartbeat it renews.
//!
//! Every sandbox's main process is `nightshift-lease` (written into the door
//! beside the clients, see `door::CLIENTS`), which ends the sandbox when the
//! heartbeat in the run's door (`STATE/doors/<run>/heartbeat`, read-only
//! inside the sandbox at `/run/nightshift/heartbeat`) has not grown for the
//! lease's bound (`[caps] lease`, 30 s by default). The decision is
//! `sandbox_image_door::lease`.
//!
//! Invariants:
//! - Only the run's own supervisor process renews its lease, from a thread
//!   of its own (a busy async runtime does not starve it), every
//!   [`lease::renew_every`] of the bound. When the supervisor dies (or is
//!   stopped), renewals stop and the sandbox ends within the bound, whether
//!   or not the watchdog is alive.
//! - Each heartbeat is written whole to a temporary name beside the door
//!   directory (`STATE/doors/.<run>.heartbeat.tmp`) and renamed over the
//!   last, so the wrapper reads either the old counter or the new one;
//!   the counter grows by one at each renewal, starting at 1 before the
//!   sandbox is created.
//! - Nothing inside the sandbox can renew a lease: the door is mounted
//!   read-only and the wrapper counts only a counter larger than any it saw.
//! - Renewals fail closed: a heartbeat that cannot be written (the state's
//!   disk full for a bound) lets the sandbox end, as a dead supervisor would.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_image_door::lease;

/// Renews one run's lease until stopped or dropped.
#[derive(Debug)]
pub struct Heartbeat {
    // Dropping the sender wakes the thread, which then stops.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    tmp: PathBuf,
}

impl Heartbeat {
    /// Stops renewing and waits until the last heartbeat is written, so that
    /// the door directory can be removed without a write racing it.
    pub fn stop(mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // Left only by a write that failed half-way.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.take();
    }
}

/// Where a heartbeat is written before it is renamed into the door: beside
/// the door, not in it, so the sandbox never sees a half-written one.
fn tmp_path(dir: &Path) -> PathBuf {
    match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => parent.join(format!(
            ".{}.{}.tmp",
            name.to_string_lossy(),
            lease::HEARTBEAT
        )),
        _ => dir.join(format!("{}.tmp", lease::HEARTBEAT)),
    }
}

fn beat(dir: &Path, counter: u64) -> std::io::Result<()> {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let tmp = tmp_path(dir);
    std::fs::write(&tmp, lease::format_heartbeat(counter, unix_ms))?;
    std::fs::rename(&tmp, dir.join(lease::HEARTBEAT))
}

/// Writes the first heartbeat into the door directory `dir` (an error names
/// the file) and renews it every [`lease::renew_every`]`(bound)` from a
/// thread of its own until the returned handle is dropped.
pub fn start(dir: &Path, bound: Duration) -> std::io::Result<Heartbeat> {
    beat(dir, 1).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "writing the lease's heartbeat {}: {e}",
                dir.join(lease::HEARTBEAT).display()
            ),
        )
    })?;
    let (tx, rx) = mpsc::channel::<()>();
    let door: PathBuf = dir.to_path_buf();
    let every = lease::renew_every(bound);
    let thread = std::thread::Builder::new()
        .name("lease-heartbeat".into())
        .spawn(move || {
            let mut counter = 1u64;
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                counter += 1;
                // A failed write is retried at the next beat; missing
                // several in a row ends the sandbox, as it should when
                // the supervisor can no longer write its state.
                let _ = beat(&door, counter);
            }
        })?;
    Ok(Heartbeat {
        stop: Some(tx),
        thread: Some(thread),
        tmp: tmp_path(dir),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_grows_until_stopped_and_leaves_nothing_beside_it() {
        let doors = tempfile::tempdir().unwrap();
        let dir = doors.path().join("r1");
        std::fs::create_dir(&dir).unwrap();
        let read =
            || lease::parse_heartbeat(&std::fs::read(dir.join(lease::HEARTBEAT)).unwrap()).unwrap();
        let hb = start(&dir, Duration::from_secs(1)).unwrap();
        assert_eq!(read(), 1);
        // Polled: the thread renews every 166 ms.
        while read() < 3 {
            std::thread::sleep(Duration::from_millis(20));
        }
        hb.stop();
        let last = read();
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(read(), last, "renewed after it was stopped");
        // Only the heartbeat is in the door; nothing is left beside it.
        let names = |d: &Path| {
            let mut n: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(&dir), [lease::HEARTBEAT]);
        assert_eq!(names(doors.path()), ["r1"]);
    }

    #[test]
    fn an_unwritable_door_is_an_error_naming_the_file() {
        let e = start(Path::new("/nonexistent/door"), Duration::from_secs(30)).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/door/heartbeat"), "{e}");
    }
}
