//! The outer kill switch, the dead man's switch and reconciliation: every
//! way a sandbox is stopped from outside it.
//!
//! Invariants:
//! - Sandboxes are found through the engine by their labels, never through a
//!   live supervisor, so `kill --all` works when no supervisor runs
//!   (`tests/tests/killswitch.rs::kill_all_works_with_no_supervisor_running`).
//! - The kill switch depends on nothing that may be broken: it stops the
//!   sandboxes first ([`stop_sandboxes`]: SIGKILL for a running one, forced
//!   removal for one created and not yet started, so that it can never be
//!   started) with only the engine and the state directory's tag, before
//!   any configuration, database or cgroup is touched; it records
//!   afterwards ([`record_kill`]), and when the state store cannot be opened
//!   it writes what it did to `STATE/killswitch.pending`, which the next
//!   reconciliation records ([`replay_pending`])
//!   (`tests/tests/kill_independent.rs::kill_all_works_with_a_malformed_config`,
//!   `tests/tests/kill_independent.rs::a_sandbox_created_and_not_yet_started_is_removed_by_the_kill_switch`,
//!   `tests::a_refused_kill_is_followed_by_removal_and_a_refused_removal_is_an_error`;
//!   the pending file has no test).
//! - A sandbox carries the identity (`pid:starttime`) of the supervisor that
//!   created it. A watchdog process, apart from the supervisor's process
//!   group and outside every sandbox, stops the sandboxes of a supervisor
//!   that has vanished; a later supervisor does the same at start. Nothing
//!   inside a sandbox can reach either.
//! - A run is settled exactly once. A settler claims it (a row in the store
//!   naming the claimer's `pid:starttime`); a claim whose claimer is provably
//!   gone, or that was given back after a failure, is taken over, so a
//!   settler that dies or fails never leaves a run unsettled. Under the claim
//!   the run is re-read: one that has ended, or whose supervisor is alive,
//!   is left alone; the ending is written only if the stored record is not
//!   final yet ([`nightshift_core::state_store::Store::end_run`])
//!   (`tests/tests/faults.rs::a_settle_claim_whose_claimer_died_is_taken_over`,
//!   `tests/tests/faults.rs::an_ended_run_is_never_ended_again`,
//!   `orchestrator/store-sqlite/src/store.rs::tests::a_claim_is_kept_from_the_living_and_taken_from_the_gone`).
//! - Settling an orphan removes its containers, imports what it wrote, then
//!   removes its worktree (only once the work is safe: a failed import keeps
//!   it and ends the run as `import failed: ...`, for `nightshift import`)
//!   and its door directory, the record and the audit saying what happened.
//!   A run marked imported ([`nightshift_core::state_store::Store::record_imported`], written
//!   before any worktree removal begins) is never imported again: its
//!   worktree, whole or half-removed, is only removed
//!   (`tests/tests/faults.rs::an_imported_run_is_never_imported_again`,
//!   `tests/tests/import_failures.rs::reconciliation_keeps_the_worktree_when_the_import_fails`).

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::future::join_all;

use crate::run::{identity_alive, RunError, Supervisor};
use nightshift_core::audit_log::Event;
use nightshift_core::container_engine::ContainerEngine;
use nightshift_core::sandbox::{LABEL_STATE, LABEL_SUPERVISOR};
use nightshift_core::state_store::now_rfc3339;
use nightshift_engine_docker::engine::Managed;

/// What `kill` stopped.
#[derive(Debug, Default)]
pub struct Killed {
    pub runs: Vec<String>,
    pub containers: usize,
}

fn lock(
    sup: &Supervisor,
) -> std::sync::MutexGuard<'_, Box<dyn nightshift_core::state_store::StateStore>> {
    sup.store.lock().unwrap_or_else(|p| p.into_inner())
}

/// The containers of this state, as the engine reports them.
pub async fn state_containers(sup: &Supervisor) -> Result<Vec<Managed>, RunError> {
    Ok(sup
        .engine
        .managed(None)
        .await?
        .into_iter()
        .filter(|c| c.labels.get(LABEL_STATE) == Some(&sup.state_tag))
        .collect())
}

/// What the kill switch stopped before recording anything.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Stopped {
    /// The run named, or none for every run of the state.
    pub run: Option<String>,
    /// (container id, its run) of each sandbox stopped.
    pub containers: Vec<(String, Option<String>)>,
    pub by: String,
    /// `kill --all --freeze`: the freeze still to be written.
    pub freeze: bool,
    pub at: String,
}

/// The kill switch's first step, with nothing but the engine: every
/// sandbox of the state (of one run, when named) is stopped at once, a
/// running one with SIGKILL, one not yet started by forced removal (a
/// created container would otherwise still start).
pub async fn stop_sandboxes<E: nightshift_core::container_engine::ContainerEngine>(
    engine: &E,
    state_tag: &str,
    run: Option<&str>,
    by: &str,
    freeze: bool,
) -> Result<Stopped, RunError> {
    let containers: Vec<Managed> = engine
        .managed(None)
        .await?
        .into_iter()
        .filter(|c| c.labels.get(LABEL_STATE).map(String::as_str) == Some(state_tag))
        .filter(|c| run.is_none() || c.run.as_deref() == run)
        .collect();
    let results = join_all(containers.iter().map(|c| async move {
        if c.running {
            engine.kill(&c.id).await
        } else {
            engine.remove(&c.id).await
        }
    }))
    .await;
    // A container that stopped by itself meanwhile may refuse the kill, and
    // one may be being removed already (`409`): remove those too, until the
    // engine confirms them gone, before reporting anything.
    let mut failures = Vec::new();
    for (c, r) in containers.iter().zip(results) {
        if r.is_err() {
            if let Err(e) = engine.remove_confirmed(&c.id).await {
                failures.push(e);
            }
        }
    }
    if let Some(e) = failures.into_iter().next() {
        return Err(e.into());
    }
    Ok(Stopped {
        run: run.map(str::to_string),
        containers: containers.into_iter().map(|c| (c.id, c.run)).collect(),
        by: by.to_string(),
        freeze,
        at: now_rfc3339(),
    })
}

/// The kill switch's second step: the freeze (when asked), the kill
/// requests (so that a supervisor still starting a run ends it before
/// start), the audit entries, and the settling of runs nobody else will
/// settle.
pub async fn record_kill(sup: &Supervisor, stopped: &Stopped) -> Result<Killed, RunError> {
    if stopped.freeze {
        let mut store = lock(sup);
        // Already frozen is fine for a kill switch; any other failure to
        // freeze is the caller's to report (new runs would still start).
        let frozen = nightshift_core::policy::load(&*store, None)
            .map_err(|e| RunError::Policy(e.to_string()))?
            .freeze()
            .is_some();
        if !frozen {
            nightshift_core::policy::freeze(&mut *store, None, "kill --all --freeze")
                .map_err(|e| RunError::Policy(format!("freezing: {e}")))?;
        }
    }
    let mut runs: BTreeSet<String> = stopped
        .containers
        .iter()
        .filter_map(|(_, r)| r.clone())
        .collect();
    if let Some(id) = &stopped.run {
        // Unknown run ids are an error; a known run with no container is fine.
        lock(sup).run(id)?;
        runs.insert(id.clone());
    } else {
        for r in lock(sup).runs()? {
            if !nightshift_core::state_store::is_final(&r.status) {
                runs.insert(r.id);
            }
        }
    }
    for r in &runs {
        lock(sup).request_kill(r, &stopped.by)?;
    }
    for r in &runs {
        let container = stopped
            .containers
            .iter()
            .find(|(_, run)| run.as_deref() == Some(r))
            .map(|(c, _)| c.clone());
        lock(sup).append(
            Some(r),
            &Event::KillRequested {
                by: stopped.by.clone(),
                container,
            },
            false,
        )?;
    }
    // Runs whose supervisor is gone have nobody to settle them: do it here
    // (settle_orphan re-reads each under its claim and leaves ended runs).
    for r in &runs {
        match settle_orphan(sup, r, "kill switch").await {
            Ok(_) => {}
            // A sandbox of this state whose run this store does not know
            // (its record lost with an older database): it is stopped, and
            // there is nothing to settle.
            Err(RunError::Store(nightshift_core::state_store::StoreError::NoSuchRun(_)))
                if stopped.run.as_deref() != Some(r.as_str()) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Killed {
        runs: runs.into_iter().collect(),
        containers: stopped.containers.len(),
    })
}

/// Stops one run (`Some(id)`) or every run of this state (`None`) at once,
/// with SIGKILL through the engine, and records who did it.
pub async fn kill(sup: &Supervisor, run: Option<&str>, by: &str) -> Result<Killed, RunError> {
    let stopped = stop_sandboxes(&sup.engine, &sup.state_tag, run, by, false).await?;
    record_kill(sup, &stopped).await
}

/// Where the kill switch writes what it could not record in the store.
pub fn pending_path(root: &std::path::Path) -> std::path::PathBuf {
    root.join("killswitch.pending")
}

/// Appends what the kill switch did to `STATE/killswitch.pending` (one JSON
/// line, fsynced), for when the store cannot be opened.
pub fn write_pending(root: &std::path::Path, stopped: &Stopped) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(pending_path(root))?;
    let mut line = serde_json::to_vec(stopped).map_err(std::io::Error::other)?;
    line.push(b'\n');
    file.write_all(&line)?;
    file.sync_all()
}

/// Records kills that could not be recorded when they happened. The file is
/// renamed first, so that a kill switch writing meanwhile starts a new one.
pub async fn replay_pending(sup: &Supervisor) -> Result<usize, RunError> {
    let root = lock(sup).root().to_path_buf();
    let path = pending_path(&root);
    if !path.exists() {
        return Ok(0);
    }
    let taken = root.join(format!("killswitch.pending.{}", std::process::id()));
    if std::fs::rename(&path, &taken).is_err() {
        return Ok(0);
    }
    let text = std::fs::read_to_string(&taken).unwrap_or_default();
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Stopped>(line) {
            Ok(stopped) => match record_kill(sup, &stopped).await {
                Ok(_)
                | Err(RunError::Store(nightshift_core::state_store::StoreError::NoSuchRun(_))) => {
                    n += 1
                }
                Err(e) => {
                    // Put it back for the next attempt rather than lose it.
                    let _ = write_pending(&root, &stopped);
                    return Err(e);
                }
            },
            Err(e) => {
                // Kept, never dropped: a person can read what the kill switch did.
                tracing::warn!(error = %e, "an unreadable line of killswitch.pending");
                use std::io::Write;
                let kept = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(root.join("killswitch.pending.unreadable"))
                    .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
                if let Err(e) = kept {
                    let _ = std::fs::rename(&taken, &path);
                    return Err(RunError::Git(format!(
                        "keeping an unreadable line of killswitch.pending: {e}"
                    )));
                }
            }
        }
    }
    let _ = std::fs::remove_file(&taken);
    Ok(n)
}

/// Finds the sandboxes and runs of this state whose supervisor has vanished
/// (or only those of `only`, a supervisor identity) and settles them.
pub async fn reconcile(
    sup: &Supervisor,
    only: Option<&str>,
    by: &str,
) -> Result<Vec<String>, RunError> {
    replay_pending(sup).await?;
    // Warm sandboxes of vanished processes first: they have no run to settle.
    crate::warm::sweep(sup).await;
    let mut orphans: BTreeSet<String> = BTreeSet::new();
    for c in state_containers(sup).await? {
        let owner = c.labels.get(LABEL_SUPERVISOR).cloned().unwrap_or_default();
        if owner == sup.identity || only.is_some_and(|o| o != owner) {
            continue;
        }
        if !identity_alive(&owner) {
            if let Some(run) = c.run {
                orphans.insert(run);
            }
        }
    }
    let runs = lock(sup).runs()?;
    for r in &runs {
        let unsettled = !nightshift_core::state_store::is_final(&r.status);
        let owner = r.supervisor.clone().unwrap_or_default();
        if !unsettled || only.is_some_and(|o| o != owner) {
            continue;
        }
        // A run its supervisor gave up (its sandbox not confirmed gone) is
        // settled here even while that supervisor (a `serve`) lives on.
        if given_up(r) || (owner != sup.identity && !identity_alive(&owner)) {
            orphans.insert(r.id.clone());
        }
    }
    // A container of a run that has ended is a leftover (its run's ending
    // could not remove it): removed, confirmed gone.
    if only.is_none() {
        let ended: BTreeSet<&str> = runs
            .iter()
            .filter(|r| nightshift_core::state_store::is_final(&r.status))
            .map(|r| r.id.as_str())
            .collect();
        for c in state_containers(sup).await? {
            if c.run.as_deref().is_some_and(|r| ended.contains(r)) {
                if let Err(e) = sup.engine.remove_confirmed(&c.id).await {
                    tracing::warn!(container = %c.id, error = %e, "removing a container of an ended run");
                }
            }
        }
    }
    // One run that cannot be settled now does not keep the others waiting.
    let mut settled = Vec::new();
    let mut first_error = None;
    for run in orphans {
        match settle_orphan(sup, &run, by).await {
            Ok(true) => settled.push(run),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(run = %run, error = %e, "settling");
                first_error.get_or_insert(e);
            }
        }
    }
    sweep_doors(sup)?;
    match first_error {
        Some(e) => Err(e),
        None => Ok(settled),
    }
}

/// Settles a run nobody else will: containers removed, work imported
/// (unless it already was), worktree and door removed, record and audit
/// updated. False when there was nothing to do: a live process holds the
/// claim, the run has ended, or its supervisor is still alive.
pub async fn settle_orphan(sup: &Supervisor, run: &str, by: &str) -> Result<bool, RunError> {
    settle_abandoned(sup, run, by, "lost: supervisor vanished").await
}

/// [`settle_orphan`], the run ending as `status` unless a kill request
/// says otherwise: also for a run of this very supervisor whose lifecycle
/// ended without settling it (a panic in a run in process).
pub async fn settle_abandoned(
    sup: &Supervisor,
    run: &str,
    by: &str,
    status: &str,
) -> Result<bool, RunError> {
    let gone = |claimer: &str| !identity_alive(claimer);
    if !lock(sup).claim_settle(run, by, &sup.identity, &gone)? {
        return Ok(false);
    }
    let settled = settle_claimed(sup, run, by, status).await;
    if !matches!(settled, Ok(true)) {
        // Failed or needless: give the claim back (a claimer that dies
        // before this is taken over as gone).
        let _ = lock(sup).release_settle(run, &sup.identity);
    }
    settled
}

async fn settle_claimed(
    sup: &Supervisor,
    run: &str,
    by: &str,
    lost: &str,
) -> Result<bool, RunError> {
    // Re-read under the claim: the list this run was picked from may be old.
    let mut record = lock(sup).run(run)?;
    if nightshift_core::state_store::is_final(&record.status) {
        crate::door::remove_dir(
            &nightshift_core::state_store::StatePaths::new(lock(sup).root().to_path_buf()),
            run,
        );
        return Ok(false);
    }
    let owner = record.supervisor.clone().unwrap_or_default();
    if owner != sup.identity && identity_alive(&owner) && !given_up(&record) {
        return Ok(false);
    }
    let containers: Vec<String> = sup
        .engine
        .managed(Some(run))
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    // A sandbox that had already ended by its lease (the wrapper's 125, or
    // the host-side end's kill) says so in the run's reason: its supervisor
    // is gone, so the lease went unrenewed whatever else happened.
    let mut lease_lapsed = false;
    for c in &containers {
        if let Ok(state) = sup.engine.exit_state(c).await {
            if !state.running
                && !state.oom_killed
                && nightshift_engine_docker::lease::lapsed(
                    state.exit_code,
                    Duration::MAX,
                    Duration::ZERO,
                )
            {
                lease_lapsed = true;
                record.exit_code = state.exit_code;
            }
        }
    }
    // Gone before anything of the worktree is read.
    for c in &containers {
        sup.engine.remove_confirmed(c).await?;
    }
    // What its figures needed (a Podman run's own cgroup, which its dead
    // supervisor left).
    if let Some(fleet) = &sup.fleet {
        sup.engine.release_stats(&fleet.scope(), run).await;
    }
    let killed_by = lock(sup).kill_request(run)?;
    let status = match &killed_by {
        Some(who) => format!("killed: by {who}"),
        None if given_up(&record) => "lost: the container engine was unreachable".to_string(),
        None => lost.to_string(),
    };
    lock(sup).append(
        Some(run),
        &Event::Reconciled {
            by: by.to_string(),
            containers: containers.clone(),
            status: status.clone(),
        },
        false,
    )?;
    // Keep what the run wrote, as for any run, unless that was done: a run
    // marked imported may have a half-removed worktree, which is only ever
    // removed. The worktree goes only once the work is safe.
    let paths = nightshift_core::state_store::StatePaths::new(lock(sup).root().to_path_buf());
    let worktree = paths.worktrees().join(run);
    let mut failure = None;
    if worktree.exists() {
        let imported = lock(sup).imported(run)?;
        if !imported {
            // Mounted again (read-only) if a reboot took its mount.
            let (kept, host) = (worktree.clone(), sup.host.clone());
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || host.mount_kept(&kept)).await {
                tracing::warn!(run = %run, error = %e, "mounting the kept worktree");
            }
            match crate::run::import_into(&sup.store, &mut record, &worktree).await {
                Ok(()) => lock(sup).record_imported(&record)?,
                Err(e) => failure = Some(e),
            }
        }
        if failure.is_none() {
            let (wt, host) = (worktree.clone(), sup.host.clone());
            let removed = tokio::task::spawn_blocking(move || host.remove_worktree(&wt)).await;
            if let Ok(Ok(())) = removed {
                lock(sup).append(
                    Some(run),
                    &Event::WorktreeRemoved {
                        path: worktree.display().to_string(),
                    },
                    false,
                )?;
            }
        }
    }
    crate::door::remove_dir(&paths, run);
    let (status, import_reason) =
        crate::run::status_after_import(&mut record, status, failure.as_ref(), &worktree);
    record.status = status.clone();
    let lapse = if lease_lapsed && killed_by.is_none() {
        "; its sandbox had ended itself: its lease lapsed"
    } else {
        ""
    };
    record.reason = Some(match import_reason {
        Some(why) => format!("settled by {by}{lapse}; {why}"),
        None => format!("settled by {by}{lapse}"),
    });
    record.ended_at = Some(now_rfc3339());
    let ended = lock(sup).end_run(
        &record,
        &Event::RunEnded {
            status,
            reason: record.reason.clone(),
        },
    )?;
    Ok(ended.is_some())
}

/// Did the run's own supervisor give it up, its sandbox not confirmed gone
/// (see [`crate::run::UNCONFIRMED`])?
fn given_up(record: &nightshift_core::state_store::RunRecord) -> bool {
    !nightshift_core::state_store::is_final(&record.status)
        && record
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(crate::run::UNCONFIRMED))
}

/// Removes the door directories of runs that have ended (or that the store
/// does not know), left by a supervisor that died before its ending.
fn sweep_doors(sup: &Supervisor) -> Result<(), RunError> {
    let paths = nightshift_core::state_store::StatePaths::new(lock(sup).root().to_path_buf());
    let Ok(dir) = std::fs::read_dir(paths.root.join("doors")) else {
        return Ok(());
    };
    for entry in dir.flatten() {
        let Some(run) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        // A live pool's warm sandbox has no run yet: its door is in use.
        if crate::warm::is_live_warm(&paths, &run) {
            continue;
        }
        let ended = match lock(sup).run(&run) {
            Ok(r) => nightshift_core::state_store::is_final(&r.status),
            Err(nightshift_core::state_store::StoreError::NoSuchRun(_)) => true,
            Err(e) => return Err(e.into()),
        };
        if ended {
            crate::door::remove_dir(&paths, &run);
        }
    }
    Ok(())
}

/// The dead man's switch: watches one supervisor and, once it has vanished,
/// stops and settles its sandboxes. Returns when there is nothing left to do.
pub async fn watchdog(sup: &Supervisor, watched: &str, poll: Duration) -> Result<(), RunError> {
    loop {
        if !identity_alive(watched) {
            reconcile(sup, Some(watched), "dead man's switch").await?;
            return Ok(());
        }
        tokio::time::sleep(poll).await;
    }
}

/// The kill switch's first step on the fake engine.
#[cfg(test)]
mod stop_tests {
    use std::collections::HashMap;

    use super::*;
    use nightshift_core::container_engine::fake::FakeEngine;

    fn sandbox(id: &str, state: &str, run: &str, running: bool) -> Managed {
        Managed {
            id: id.into(),
            run: Some(run.into()),
            labels: HashMap::from([
                (LABEL_STATE.to_string(), state.to_string()),
                (
                    nightshift_core::sandbox::LABEL_RUN.to_string(),
                    run.to_string(),
                ),
            ]),
            running,
        }
    }

    fn engine() -> FakeEngine {
        FakeEngine::with(vec![
            sandbox("c1", "mine", "r1", true),
            sandbox("c2", "mine", "r2", false),
            sandbox("c3", "other", "r3", true),
        ])
    }

    #[tokio::test]
    async fn every_sandbox_of_the_state_is_stopped_and_no_other() {
        let engine = engine();
        let stopped = stop_sandboxes(&engine, "mine", None, "me", true)
            .await
            .unwrap();
        // Running: SIGKILL; created and not started: removed, so it never starts.
        assert_eq!(engine.calls(), ["kill c1", "remove c2"]);
        assert_eq!(engine.ids(), ["c1", "c3"]);
        assert_eq!(stopped.containers.len(), 2);
        assert!(stopped.freeze);
    }

    #[tokio::test]
    async fn a_named_run_stops_only_its_sandbox() {
        let engine = engine();
        let stopped = stop_sandboxes(&engine, "mine", Some("r2"), "me", false)
            .await
            .unwrap();
        assert_eq!(engine.calls(), ["remove c2"]);
        assert_eq!(
            stopped.containers,
            [("c2".to_string(), Some("r2".to_string()))]
        );
    }

    #[tokio::test]
    async fn a_removal_already_in_progress_is_waited_for_until_the_container_is_gone() {
        let engine = engine();
        // The engine answers 409 twice (another removal under way), then
        // finds it gone.
        engine
            .removal_in_progress
            .lock()
            .unwrap()
            .insert("c2".into(), 2);
        let stopped = stop_sandboxes(&engine, "mine", Some("r2"), "me", false)
            .await
            .unwrap();
        assert_eq!(engine.calls(), ["remove c2", "remove c2", "remove c2"]);
        assert_eq!(engine.ids(), ["c1", "c3"]);
        assert_eq!(stopped.containers.len(), 1);
    }

    #[tokio::test]
    async fn a_refused_kill_is_followed_by_removal_and_a_refused_removal_is_an_error() {
        let mut engine = engine();
        engine.refuse_kill.insert("c1".into());
        stop_sandboxes(&engine, "mine", Some("r1"), "me", false)
            .await
            .unwrap();
        assert_eq!(engine.calls(), ["kill c1", "remove c1"]);
        let mut engine = self::engine();
        engine.refuse_kill.insert("c1".into());
        engine.refuse_remove.insert("c1".into());
        let e = stop_sandboxes(&engine, "mine", None, "me", false).await;
        assert!(e.is_err(), "a sandbox left running was reported as stopped");
    }
}
