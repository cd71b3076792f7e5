//! A sandbox's cap figures on Docker and Podman, behind the core's
//! `ContainerEngine::stats` port: read from the sandbox's cgroup under the
//! fleet's (cgroupfs, through `nightshift_core::monitor`): figures the
//! kernel keeps, not what the agent says.
//!
//! Where the cgroup is differs by engine, and is decided here:
//! - Docker: the container's cgroup is named by its id, directly under the
//!   fleet's, and stays until the container is removed; the engine's exit
//!   state says when the memory cap killed it.
//! - Podman: the container is created under a cgroup of the run's own
//!   (`<fleet>/run-<id>`, [`monitor::run_cgroup_dir`]) and its cgroup is
//!   `libpod-<id>`, which Podman removes as the container exits: the last
//!   figures are the run's cgroup's (its CPU time; memory stays what was
//!   sampled while the sandbox ran), and Podman reports a kill by the memory
//!   cap as a plain 137, so that run's cgroup is the evidence (v2: its OOM
//!   kill count; v1: a high-water mark at the cap, the rule the fleet's own
//!   judgement uses) (`tests/tests/caps.rs` on Podman,
//!   `tests::podman_reads_a_kill_at_the_cap_from_the_run_cgroup`).
//!   The run's cgroup is removed once the container is gone ([`release`]).

use nightshift_core::container_engine::{ExitState, StatsScope};
use nightshift_core::monitor::{self, Observed};
use orchestrator_attest::EngineKind;

/// The cgroup parent a run's sandbox is created under, given the fleet's.
pub fn sandbox_cgroup_parent(kind: EngineKind, fleet_parent: &str, run: &str) -> String {
    match kind {
        EngineKind::Podman => format!("{fleet_parent}/{}", monitor::run_cgroup_dir(run)),
        EngineKind::Docker | EngineKind::Kubernetes => fleet_parent.to_owned(),
    }
}

/// The container's cgroup, relative to the fleet's.
pub fn container_cgroup(kind: EngineKind, run: &str, container: &str) -> String {
    match kind {
        EngineKind::Podman => format!("{}/libpod-{container}", monitor::run_cgroup_dir(run)),
        EngineKind::Docker | EngineKind::Kubernetes => container.to_owned(),
    }
}

/// One round of a running sandbox's figures.
pub async fn stats(kind: EngineKind, scope: &StatsScope, run: &str, container: &str) -> Observed {
    let cgroup = container_cgroup(kind, run, container);
    let (layout, fleet) = (scope.layout.clone(), scope.fleet.clone());
    tokio::task::spawn_blocking(move || monitor::observe(&layout, &fleet, &cgroup))
        .await
        .unwrap_or_default()
}

/// The last figures of a stopped sandbox, before its removal; `oom_kills`
/// set when the memory cap (`memory_cap` bytes) killed it.
pub async fn final_stats(
    kind: EngineKind,
    scope: &StatsScope,
    run: &str,
    container: &str,
    ended: &ExitState,
    memory_cap: u64,
) -> Observed {
    if kind != EngineKind::Podman {
        return stats(kind, scope, run, container).await;
    }
    let (layout, fleet, dir) = (
        scope.layout.clone(),
        scope.fleet.clone(),
        monitor::run_cgroup_dir(run),
    );
    let killed = ended.exit_code == Some(137) && !ended.oom_killed;
    let (mut observed, (peak, kills)) = tokio::task::spawn_blocking(move || {
        let observed = monitor::observe(&layout, &fleet, &dir);
        let memory = if killed {
            monitor::run_memory(&layout, &fleet, &dir)
        } else {
            (None, None)
        };
        (observed, memory)
    })
    .await
    .unwrap_or_default();
    // The run's cgroup is charged a little the container's is not (its
    // creation): its CPU time only.
    observed.memory_bytes = None;
    observed.memory_peak_bytes = None;
    if podman_oom(killed, peak, kills, memory_cap) {
        observed.oom_kills = Some(kills.unwrap_or(1));
    }
    observed
}

/// Whether a Podman sandbox that ended killed (`killed`: 137, the engine
/// not saying OOM) was killed by its memory cap: its run's cgroup counted
/// an OOM kill, or (cgroup v1, no count) its high-water mark reached the cap
/// within 2 MiB.
fn podman_oom(killed: bool, peak: Option<u64>, kills: Option<u64>, memory_cap: u64) -> bool {
    let at_cap = peak.is_some_and(|p| p.saturating_add(2 << 20) >= memory_cap);
    killed && (kills.unwrap_or(0) > 0 || (kills.is_none() && at_cap))
}

/// Releases what a run's figures needed once its sandbox is gone (Podman:
/// the run's cgroup; a bounded wait for Podman to empty it).
pub async fn release(kind: EngineKind, scope: &StatsScope, run: &str) {
    if kind != EngineKind::Podman {
        return;
    }
    let (layout, fleet, dir) = (
        scope.layout.clone(),
        scope.fleet.clone(),
        monitor::run_cgroup_dir(run),
    );
    let _ = tokio::task::spawn_blocking(move || monitor::remove_run_cgroup(&layout, &fleet, &dir))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_sandboxes_live_under_a_cgroup_of_their_run() {
        assert_eq!(
            sandbox_cgroup_parent(EngineKind::Podman, "nightshift-f", "r1"),
            "nightshift-f/run-r1"
        );
        assert_eq!(
            container_cgroup(EngineKind::Podman, "r1", "abc"),
            "run-r1/libpod-abc"
        );
        assert_eq!(
            sandbox_cgroup_parent(EngineKind::Docker, "nightshift-f", "r1"),
            "nightshift-f"
        );
        assert_eq!(container_cgroup(EngineKind::Docker, "r1", "abc"), "abc");
    }

    #[test]
    fn podman_reads_a_kill_at_the_cap_from_the_run_cgroup() {
        let cap = 64 << 20;
        // v2: the run's cgroup counted the kill.
        assert!(podman_oom(true, None, Some(1), cap));
        assert!(!podman_oom(true, Some(cap), Some(0), cap), "counted none");
        // v1: no count; the high-water mark at the cap tells.
        assert!(podman_oom(true, Some(cap - (1 << 20)), None, cap));
        assert!(!podman_oom(true, Some(cap / 2), None, cap));
        // Not killed (or the engine said OOM itself): nothing to read.
        assert!(!podman_oom(false, Some(cap), Some(3), cap));
    }
}
