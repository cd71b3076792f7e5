//! The dead man's switch: [`spawn`] starts it for a supervisor process (a
//! foreground run, `serve`), [`watch`] is the switch itself (`nightshift
//! watchdog --supervisor ID`, hidden).
//!
//! Invariants:
//! - The switch is a separate process of this binary, in its own process
//!   group, started with the supervisor's state directory and (when one was
//!   given) its configuration file, so a signal to the supervisor's group
//!   does not reach it and it settles what the supervisor left.
//! - Failing to start it is a warning, not a refusal of the run: the next
//!   supervisor's reconciliation settles what a vanished one left
//!   (`tests/tests/killswitch.rs::a_later_supervisor_settles_what_a_crash_left`).
//! - The switch stops and settles sandboxes and creates none, so it keeps
//!   the fleet's limits of the run's own configuration
//!   (`tests/tests/kill_independent.rs::the_watchdog_keeps_the_fleet_limits_of_the_runs_own_config`).

use std::path::Path;
use std::time::Duration;

use super::Warn;
use crate::api::{Api, ApiError, ErrorKind};

/// How often the switch looks whether its supervisor still lives.
pub const POLL: Duration = Duration::from_millis(500);

/// Starts the dead man's switch for the supervisor `identity` of the state
/// at `root` (configured by `config`, when given).
pub fn spawn(root: &Path, config: Option<&Path>, identity: &str, warn: Warn<'_>) {
    use std::os::unix::process::CommandExt;
    let Ok(exe) = std::env::current_exe() else {
        warn("warning: cannot find my own executable to start the watchdog");
        return;
    };
    let mut command = std::process::Command::new(exe);
    command.arg("--state-dir").arg(root);
    // One config per process, passed on: the watchdog reads the run's.
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    let spawned = command
        .args(["watchdog", "--supervisor", identity])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    if let Err(e) = spawned {
        warn(&format!("warning: starting the watchdog: {e}"));
    }
}

/// The switch: waits for the supervisor `watched` (`pid:starttime`) to end,
/// then settles its sandboxes and runs.
pub async fn watch(api: &Api, watched: &str) -> Result<(), ApiError> {
    // The supervisor's own config, checked; the watchdog creates nothing, so
    // it never touches the fleet's limits.
    api.load_config()?;
    let sup = api.stopping_supervisor().await?;
    crate::killswitch::watchdog(&sup, watched, POLL)
        .await
        .map_err(|e| ApiError::caused(ErrorKind::Internal, e).doing("watchdog"))
}
