//! The outer kill switch, the dead man's switch and reconciliation: every
//! way a sandbox is stopped from outside it.
//!
//! Invariants:
//! - Sandboxes are found through the engine by their labels, never through a
//!   live supervisor, so `kill --all` works when no supervisor runs.
//! - A sandbox carries the identity (`pid:starttime`) of the supervisor that
//!   created it. A watchdog process, apart from the supervisor's process
//!   group and outside every sandbox, stops the sandboxes of a supervisor
//!   that has vanished; a later supervisor does the same at start. Nothing
//!   inside a sandbox can reach either.
//! - An orphaned run is settled once (a claim row in the store): its
//!   containers removed, what it wrote imported, its worktree removed, its
//!   record and the audit saying what happened.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::future::join_all;

use crate::audit_log::Event;
use crate::engine::Managed;
use crate::run::{identity_alive, RunError, Supervisor};
use crate::sandbox::{LABEL_STATE, LABEL_SUPERVISOR};
use crate::store::now_rfc3339;

/// What `kill` stopped.
#[derive(Debug, Default)]
pub struct Killed {
    pub runs: Vec<String>,
    pub containers: usize,
}

fn lock(sup: &Supervisor) -> std::sync::MutexGuard<'_, crate::store::Store> {
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

/// Stops one run (`Some(id)`) or every run of this state (`None`) at once,
/// with SIGKILL through the engine, and records who did it.
pub async fn kill(sup: &Supervisor, run: Option<&str>, by: &str) -> Result<Killed, RunError> {
    let containers: Vec<Managed> = state_containers(sup)
        .await?
        .into_iter()
        .filter(|c| run.is_none() || c.run.as_deref() == run)
        .collect();
    let mut runs: BTreeSet<String> = containers.iter().filter_map(|c| c.run.clone()).collect();
    if let Some(id) = run {
        // Unknown run ids are an error; a known run with no container is fine.
        lock(sup).run(id)?;
        runs.insert(id.to_string());
    } else {
        for r in lock(sup).runs()? {
            if r.status == "running" || r.status == "created" {
                runs.insert(r.id);
            }
        }
    }
    // Record the request first, so a supervisor that sees its sandbox die
    // knows why.
    for r in &runs {
        let store = lock(sup);
        store.request_kill(r, by)?;
    }
    let results = join_all(containers.iter().map(|c| sup.engine.kill(&c.id))).await;
    for r in results {
        r?;
    }
    for r in &runs {
        let container = containers
            .iter()
            .find(|c| c.run.as_deref() == Some(r))
            .map(|c| c.id.clone());
        lock(sup).append(
            Some(r),
            &Event::KillRequested {
                by: by.to_string(),
                container,
            },
            false,
        )?;
    }
    // Runs whose supervisor is gone have nobody to settle them: do it here.
    for r in &runs {
        let record = lock(sup).run(r)?;
        let owner = containers
            .iter()
            .find(|c| c.run.as_deref() == Some(r))
            .and_then(|c| c.labels.get(LABEL_SUPERVISOR).cloned())
            .or(record.supervisor.clone());
        let alive = owner.as_deref().map(identity_alive).unwrap_or(false);
        if !alive && !record.status.starts_with("exited") && !record.status.starts_with("killed") {
            settle_orphan(sup, r, "kill switch").await?;
        }
    }
    Ok(Killed {
        runs: runs.into_iter().collect(),
        containers: containers.len(),
    })
}

/// Finds the sandboxes and runs of this state whose supervisor has vanished
/// (or only those of `only`, a supervisor identity) and settles them.
pub async fn reconcile(
    sup: &Supervisor,
    only: Option<&str>,
    by: &str,
) -> Result<Vec<String>, RunError> {
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
    for r in lock(sup).runs()? {
        let unsettled = r.status == "running" || r.status == "created";
        let owner = r.supervisor.clone().unwrap_or_default();
        if !unsettled || owner == sup.identity || only.is_some_and(|o| o != owner) {
            continue;
        }
        if !identity_alive(&owner) {
            orphans.insert(r.id);
        }
    }
    let mut settled = Vec::new();
    for run in orphans {
        if settle_orphan(sup, &run, by).await? {
            settled.push(run);
        }
    }
    Ok(settled)
}

/// Settles a run nobody else will: containers removed, work imported,
/// worktree removed, record and audit updated. False if already claimed.
pub async fn settle_orphan(sup: &Supervisor, run: &str, by: &str) -> Result<bool, RunError> {
    if !lock(sup).claim_settle(run, by)? {
        return Ok(false);
    }
    let mut record = lock(sup).run(run)?;
    let containers: Vec<String> = sup
        .engine
        .managed(Some(run))
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    for c in &containers {
        sup.engine.remove(c).await?;
    }
    let killed_by = lock(sup).kill_request(run)?;
    let status = match &killed_by {
        Some(who) => format!("killed: by {who}"),
        None => "lost: supervisor vanished".to_string(),
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
    // Keep what the run wrote, as for any run.
    let worktree = lock(sup).paths().worktrees().join(run);
    if worktree.exists() {
        if let Err(e) = crate::run::import_into(sup, &mut record, &worktree).await {
            record.reason = Some(e);
        }
        let wt = worktree.clone();
        let _ = tokio::task::spawn_blocking(move || crate::hostview::remove_worktree(&wt)).await;
    }
    record.status = status.clone();
    record.reason = Some(match record.reason.take() {
        Some(why) => format!("settled by {by}; {why}"),
        None => format!("settled by {by}"),
    });
    record.ended_at = Some(now_rfc3339());
    lock(sup).put_run(&record)?;
    lock(sup).append(
        Some(run),
        &Event::RunEnded {
            status,
            reason: record.reason.clone(),
        },
        true,
    )?;
    Ok(true)
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
