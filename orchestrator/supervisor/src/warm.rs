//! Warm sandboxes made, refilled, removed and swept (the pool's
//! bookkeeping is `pool`; a run's beginning in one is `warm_begin` in run.rs).
//!
//! Invariants:
//! - A warm sandbox's marker is written before anything of it exists and
//!   removed after the rest ([`fill_one`], [`discard`]), so a process killed
//!   at any point leaves a marker for [`sweep`]
//!   (`tests/tests/pool.rs::a_killed_serves_warm_sandboxes_are_swept`).
//! - No warm sandbox is made while the state is frozen, and the ready ones
//!   are removed then ([`keep_filled`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use nightshift_core::container_engine::ContainerEngine;
use nightshift_core::sandbox::Caps;
use nightshift_core::state_store::{StatePaths, StateStore};

use crate::pool::{marker, markers, Made, Pool, Warm};
use crate::run::{RunError, Supervisor};

/// A reserved warm sandbox whose run has not taken it within this long is
/// removed (its task was started by another dispatcher, or not at all).
pub const RESERVATION_LAPSES: Duration = Duration::from_secs(60);
/// How often the pool looks at its sandboxes and refills.
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// How long a failed fill waits before the next try.
const FAILED_FILL_BACKOFF: Duration = Duration::from_secs(10);

/// Whether `id` is a warm sandbox of a process that is alive: its door and
/// worktree are that process's, whatever the runs say.
pub fn is_live_warm(paths: &StatePaths, id: &str) -> bool {
    std::fs::read_to_string(marker(paths, id))
        .is_ok_and(|owner| crate::run::identity_alive(owner.trim()))
}

/// Makes one warm sandbox of `image` with `caps`.
pub async fn fill_one<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    image: &str,
    caps: &Caps,
) -> Result<Warm, RunError> {
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let paths = sup.paths();
    nightshift_core::state_store::create_private_dir(&markers(&paths))?;
    std::fs::write(marker(&paths, &id), &sup.identity)
        .map_err(|e| RunError::Git(format!("writing the warm sandbox's marker: {e}")))?;
    let mut made = Made::default();
    match make(sup, &paths, &id, image, caps, &mut made).await {
        Ok(warm) => Ok(warm),
        Err(e) => {
            undo(sup, &id, made).await;
            Err(e)
        }
    }
}

async fn make<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    paths: &StatePaths,
    id: &str,
    image: &str,
    caps: &Caps,
    made: &mut Made,
) -> Result<Warm, RunError> {
    let found = sup.engine.require_image(image).await?;
    nightshift_core::state_store::create_private_dir(&paths.worktrees())?;
    let dest = paths.worktrees().join(id);
    made.worktree = Some(dest.clone());
    let (at, cap, host) = (dest.clone(), caps.max_worktree_bytes, sup.host.clone());
    let worktree_fs = tokio::task::spawn_blocking(move || {
        let empty = host.make_worktree_fs(&at, cap)?;
        host.protect_worktree(&at)?;
        Ok::<_, String>(empty)
    })
    .await
    .map_err(|e| RunError::Git(e.to_string()))?
    .map_err(|e| RunError::Git(format!("making the warm worktree's filesystem: {e}")))?;
    let (channels, lease) = crate::channels::HostDir::open_leased(paths, id, caps.lease)
        .map_err(|e| RunError::Git(format!("opening the warm sandbox's channels: {e}")))?;
    made.channels = Some(channels.clone());
    made.lease = Some(lease);
    let gateway = nightshift_gateway::load(&paths.root)
        .map_err(|e| RunError::BadInput(e.to_string()))?
        .is_some();
    let spec = sup.sandbox_spec(channels.as_ref(), id, image, &[], dest.clone(), "", caps);
    let spec = if gateway {
        spec.with_model_gateway(nightshift_core::sandbox::RELAY_PORT)
    } else {
        spec
    }
    .warm();
    made.creating = true;
    let container = sup.engine.create(&spec).await?;
    let output = sup.engine.attach(&container).await?;
    sup.engine.start(&container).await?;
    let lease = made
        .lease
        .take()
        .ok_or_else(|| RunError::Git("the warm sandbox's lease".into()))?;
    Ok(Warm {
        id: id.to_string(),
        image: image.to_string(),
        image_id: found.id,
        caps: caps.clone(),
        gateway,
        container,
        channels,
        lease,
        worktree: dest,
        worktree_fs,
        spec,
        output,
    })
}

async fn undo<E: ContainerEngine, S: StateStore>(sup: &Supervisor<E, S>, id: &str, made: Made) {
    crate::pool::undo(&sup.pool_ports(), id, made).await;
}

async fn remove_containers<E: ContainerEngine, S: StateStore>(sup: &Supervisor<E, S>, id: &str) {
    crate::pool::remove_containers(&sup.engine, id).await;
}

async fn remove_worktree<E: ContainerEngine, S: StateStore>(sup: &Supervisor<E, S>, w: PathBuf) {
    crate::pool::remove_worktree(&sup.host, w).await;
}

/// Removes a warm sandbox no run took, and everything of it.
pub async fn discard<E: ContainerEngine, S: StateStore>(sup: &Supervisor<E, S>, warm: Warm) {
    crate::pool::discard(&sup.pool_ports(), warm).await;
}

/// Keeps the pool filled until `stop` turns true, then removes every warm
/// sandbox it holds. No sandbox is made while the state is frozen (and the
/// ready ones are removed).
pub async fn keep_filled<E: ContainerEngine, S: StateStore>(
    sup: Supervisor<E, S>,
    pool: Arc<Pool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff_until: Option<Instant> = None;
    let mut unreadable = false;
    loop {
        if *stop.borrow() {
            break;
        }
        for warm in pool.lapsed(RESERVATION_LAPSES) {
            tracing::info!(warm = %warm.id, "a reserved warm sandbox was not taken: removed");
            discard(&sup, warm).await;
        }
        // Gone or ended (a kill switch, its lease): removed.
        for (id, container) in pool.ready_containers() {
            let state = sup.engine.exit_state(&container).await;
            if !state.as_ref().is_ok_and(|s| s.running) {
                if let Some(warm) = pool.take_ready(&id) {
                    // Said: a warm sandbox ends only by a kill or its lease.
                    let code = state.ok().and_then(|s| s.exit_code);
                    tracing::warn!(warm = %id, exit_code = ?code, "a warm sandbox stopped: removed");
                    discard(&sup, warm).await;
                }
            }
        }
        let frozen = {
            let store = sup.store.lock().unwrap_or_else(|p| p.into_inner());
            match nightshift_core::policy::load(&*store, None) {
                Ok(set) => {
                    unreadable = false;
                    set.freeze().is_some()
                }
                // Unreadable: as if frozen (fail closed), said once.
                Err(e) => {
                    if !unreadable {
                        tracing::warn!(error = %e, "the policy cannot be read: no warm sandbox is kept until it can");
                    }
                    unreadable = true;
                    true
                }
            }
        };
        if frozen {
            for warm in pool.all() {
                discard(&sup, warm).await;
            }
        } else if backoff_until.is_none_or(|t| Instant::now() >= t) {
            backoff_until = None;
            'fill: for image in pool.images.clone() {
                while pool.ready_of(&image) < pool.size {
                    if *stop.borrow() {
                        break 'fill;
                    }
                    match fill_one(&sup, &image, &pool.caps).await {
                        Ok(warm) => pool.put(warm),
                        Err(e) => {
                            tracing::warn!(image = %image, error = %e, "making a warm sandbox");
                            backoff_until = Some(Instant::now() + FAILED_FILL_BACKOFF);
                            break 'fill;
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(LOOK_EVERY) => {}
            _ = pool.taken.notified() => {}
            _ = stop.changed() => {}
        }
    }
    for warm in pool.all() {
        discard(&sup, warm).await;
    }
}

/// Removes the warm sandboxes of processes that are gone (the marker's
/// owner dead): their containers, worktrees, doors and markers. A marker
/// whose run exists was taken by that run (its reconciliation is the
/// run's): only the marker goes.
pub async fn sweep<E: ContainerEngine, S: StateStore>(sup: &Supervisor<E, S>) {
    let paths = sup.paths();
    let Ok(dir) = std::fs::read_dir(markers(&paths)) else {
        return;
    };
    for entry in dir.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            continue;
        }
        let owner = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let owner = owner.trim();
        if owner == sup.identity || crate::run::identity_alive(owner) {
            continue;
        }
        let has_run = {
            let store = sup.store.lock().unwrap_or_else(|p| p.into_inner());
            store.run(&id).is_ok()
        };
        if has_run {
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        tracing::info!(warm = %id, owner = %owner, "removing a vanished process's warm sandbox");
        remove_containers(sup, &id).await;
        crate::door::remove_dir(&paths, &id);
        let worktree = paths.worktrees().join(&id);
        if worktree.exists() || nightshift_core::hostview::image_of(&worktree).exists() {
            remove_worktree(sup, worktree).await;
        }
        if let Some(fleet) = &sup.fleet {
            sup.engine.release_stats(&fleet.scope(), &id).await;
        }
        let _ = std::fs::remove_file(entry.path());
    }
}
