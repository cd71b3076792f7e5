//! Warm sandboxes (`[pool]`, under `nightshift serve`): sandboxes made and
//! started ahead of their runs, so that a run begins by writing its
//! worktree and handing its command to a sandbox that already runs, rather
//! than waiting for the engine to create and start one (docs/pool.md).
//!
//! A warm sandbox is everything of a run's sandbox that does not depend on
//! the run: its id (the run's id to be, on its labels, its worktree and its
//! door), its worktree's empty filesystem (made, mounted `nosuid,nodev`),
//! its channels' directory and lease (renewed by this process), and its
//! container, created from the same [`SandboxSpec`] a cold run's would be
//! with no command, and started: its lease wrapper waits for the command
//! file (`SandboxSpec::warm`). When the dispatcher starts a task whose image
//! and caps match one, the task's run takes that sandbox's id
//! ([`Pool::reserve`]) and the run's lifecycle begins in it
//! (`warm_begin` in run.rs). This module is the pool's bookkeeping; `warm` makes,
//! refills, removes and sweeps the sandboxes
//! (`tests/tests/pool.rs::warm_runs_begin_in_sandboxes_made_before_them_and_none_is_used_twice`).
//!
//! Invariants:
//! - A warm sandbox serves one run at most, and is never reused: [`Pool::take`]
//!   removes it from the pool, and its run's ending removes it like any
//!   run's sandbox (`tests/tests/pool.rs::warm_runs_begin_in_sandboxes_made_before_them_and_none_is_used_twice`).
//! - Nothing of the agent's runs in a warm sandbox before its run is bound:
//!   until the command file is written the sandbox runs only the lease
//!   wrapper, and the file is written (into the read-only door, whole) only
//!   after the run's worktree was written into it and the running container
//!   passed the Tier 0 attestation, audited as the run's
//!   (`tests/tests/pool.rs::warm_runs_begin_in_sandboxes_made_before_them_and_none_is_used_twice`).
//! - A sandbox that does not fit the run (another image or image id,
//!   other caps, a model gateway configured since, a setup phase) or is no
//!   longer running is removed, whole, before the run begins cold under
//!   the same id (`tests::only_a_sandbox_of_the_same_image_and_caps_is_reserved`,
//!   `tests/tests/pool.rs::a_warm_sandbox_that_no_longer_fits_is_removed_and_the_run_begins_cold`).
//! - Every warm sandbox has a marker, `STATE/pool/<id>`, naming the process
//!   that made it, written before anything of it exists and removed after
//!   the rest: a later supervisor's reconciliation removes a dead process's
//!   warm sandboxes, worktrees and doors ([`sweep`]), and never takes a
//!   live pool's for an ended run's leftovers (`warm::sweep`,
//!   `tests/tests/pool.rs::a_killed_serves_warm_sandboxes_are_swept`).
//!   A warm sandbox whose process died also ends by itself, at its lease.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use nightshift_core::channel::Channels as _;
use nightshift_core::container_engine::{ContainerEngine, OutputStream};
use nightshift_core::sandbox::{Caps, SandboxSpec};
use nightshift_core::state_store::StatePaths;

/// One warm sandbox.
pub struct Warm {
    pub id: String,
    pub(crate) image: String,
    pub(crate) image_id: String,
    pub(crate) caps: Caps,
    pub(crate) gateway: bool,
    pub(crate) container: String,
    pub(crate) channels: Arc<crate::channels::HostDir>,
    pub(crate) lease: nightshift_engine_docker::lease::Heartbeat,
    pub(crate) worktree: PathBuf,
    pub(crate) worktree_fs: nightshift_core::hostview::Usage,
    pub(crate) spec: SandboxSpec,
    pub(crate) output: OutputStream,
}

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm")
            .field("id", &self.id)
            .field("image", &self.image)
            .field("container", &self.container)
            .finish_non_exhaustive()
    }
}

/// What the pool holds, by state.
#[derive(Debug, Default)]
struct Slots {
    ready: VecDeque<Warm>,
    reserved: Vec<(Instant, Warm)>,
}

/// The warm sandboxes of one `serve`.
#[derive(Debug)]
pub struct Pool {
    pub(crate) size: usize,
    pub(crate) images: Vec<String>,
    pub(crate) caps: Caps,
    slots: Mutex<Slots>,
    /// Woken when a sandbox was taken: the pool refills at once.
    pub(crate) taken: Notify,
}

impl Pool {
    /// The pool `[pool]` asks for (`None` when its size is 0), its
    /// sandboxes made with `caps` (the configuration's).
    pub fn new(config: &nightshift_core::config::PoolConfig, caps: Caps) -> Option<Arc<Pool>> {
        if config.size == 0 {
            return None;
        }
        let images = if config.images.is_empty() {
            vec![nightshift_engine_docker::image::default_reference()]
        } else {
            config.images.clone()
        };
        Some(Arc::new(Pool {
            size: config.size,
            images,
            caps,
            slots: Mutex::default(),
            taken: Notify::new(),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves a ready sandbox of `image` made with `caps` for a run, and
    /// gives its id: the run must take that id. `None` when none is ready.
    pub fn reserve(&self, image: &str, caps: &Caps) -> Option<String> {
        let mut slots = self.lock();
        let at = slots
            .ready
            .iter()
            .position(|w| w.image == image && w.caps == *caps)?;
        let warm = slots.ready.remove(at)?;
        let id = warm.id.clone();
        slots.reserved.push((Instant::now(), warm));
        drop(slots);
        self.taken.notify_one();
        Some(id)
    }

    /// Takes the reserved sandbox `id` out of the pool, for good.
    pub fn take(&self, id: &str) -> Option<Warm> {
        let mut slots = self.lock();
        let at = slots.reserved.iter().position(|(_, w)| w.id == id)?;
        Some(slots.reserved.swap_remove(at).1)
    }

    pub(crate) fn ready_of(&self, image: &str) -> usize {
        self.lock()
            .ready
            .iter()
            .filter(|w| w.image == image)
            .count()
    }

    pub(crate) fn put(&self, warm: Warm) {
        self.lock().ready.push_back(warm);
    }

    /// Every reservation older than `lapse`, taken out.
    pub(crate) fn lapsed(&self, lapse: Duration) -> Vec<Warm> {
        let mut slots = self.lock();
        let (old, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut slots.reserved)
            .into_iter()
            .partition(|(at, _)| at.elapsed() > lapse);
        slots.reserved = kept;
        old.into_iter().map(|(_, w)| w).collect()
    }

    /// Every sandbox, taken out (the pool stops).
    pub(crate) fn all(&self) -> Vec<Warm> {
        let mut slots = self.lock();
        let mut all: Vec<Warm> = slots.ready.drain(..).collect();
        all.extend(slots.reserved.drain(..).map(|(_, w)| w));
        all
    }

    /// The ready sandboxes' containers (looked at while the lock is not held).
    pub(crate) fn ready_containers(&self) -> Vec<(String, String)> {
        self.lock()
            .ready
            .iter()
            .map(|w| (w.id.clone(), w.container.clone()))
            .collect()
    }

    /// The ready sandbox `id`, taken out.
    pub(crate) fn take_ready(&self, id: &str) -> Option<Warm> {
        let mut slots = self.lock();
        let at = slots.ready.iter().position(|w| w.id == id)?;
        slots.ready.remove(at)
    }
}

/// `STATE/pool`: one marker per warm sandbox.
pub(crate) fn markers(paths: &StatePaths) -> PathBuf {
    paths.root.join("pool")
}

pub(crate) fn marker(paths: &StatePaths, id: &str) -> PathBuf {
    markers(paths).join(id)
}

/// What a fill made so far, undone when it fails.
#[derive(Default)]
pub(crate) struct Made {
    pub(crate) worktree: Option<PathBuf>,
    pub(crate) channels: Option<Arc<crate::channels::HostDir>>,
    pub(crate) lease: Option<nightshift_engine_docker::lease::Heartbeat>,
    pub(crate) creating: bool,
}

/// What removing a warm sandbox needs: the engine, the host, the state's
/// paths and the fleet's figures' scope.
pub(crate) struct Ports<'a, E> {
    pub(crate) engine: &'a E,
    pub(crate) host: &'a Arc<dyn nightshift_core::hostview::HostView>,
    pub(crate) paths: StatePaths,
    pub(crate) stats: Option<nightshift_core::container_engine::StatsScope>,
}

/// Removes what a fill made: the container (found by its label), the
/// lease, the door, the worktree and its filesystem, the marker last.
pub(crate) async fn undo<E: ContainerEngine>(ports: &Ports<'_, E>, id: &str, made: Made) {
    if made.creating {
        remove_containers(ports.engine, id).await;
    }
    drop(made.lease);
    if let Some(c) = made.channels {
        c.close();
    }
    if let Some(w) = made.worktree {
        remove_worktree(ports.host, w).await;
    }
    if let Some(scope) = &ports.stats {
        ports.engine.release_stats(scope, id).await;
    }
    let _ = std::fs::remove_file(marker(&ports.paths, id));
}

/// Removes every container labelled as `id`'s, confirmed gone.
pub(crate) async fn remove_containers<E: ContainerEngine>(engine: &E, id: &str) {
    match engine.managed(Some(id)).await {
        Ok(found) => {
            for c in found {
                if let Err(e) = engine.remove_confirmed(&c.id).await {
                    tracing::warn!(warm = %id, error = %e, "removing a warm sandbox");
                }
            }
        }
        Err(e) => tracing::warn!(warm = %id, error = %e, "listing a warm sandbox's containers"),
    }
}

/// Removes a warm worktree and its filesystem (unmounted first).
pub(crate) async fn remove_worktree(
    host: &Arc<dyn nightshift_core::hostview::HostView>,
    w: PathBuf,
) {
    let host = host.clone();
    let shown = w.display().to_string();
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || host.remove_worktree(&w)).await {
        tracing::warn!(worktree = %shown, error = %e, "removing a warm worktree");
    }
}

/// Removes a warm sandbox, and everything of it: before a run that did
/// not fit it begins cold under the same id, and when the pool lets it go.
pub(crate) async fn discard<E: ContainerEngine>(ports: &Ports<'_, E>, warm: Warm) {
    let Warm {
        id,
        channels,
        lease,
        worktree,
        ..
    } = warm;
    undo(
        ports,
        &id,
        Made {
            worktree: Some(worktree),
            channels: Some(channels),
            lease: Some(lease),
            creating: true,
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;
    use std::path::Path;

    /// A warm sandbox's bookkeeping without an engine behind it.
    fn warm(state: &Path, id: &str, image: &str, caps: &Caps) -> Warm {
        let paths = StatePaths::new(state.to_path_buf());
        let channels = Arc::new(crate::channels::HostDir::open(&paths, id).unwrap());
        let lease =
            nightshift_engine_docker::lease::start(|_| Ok(()), Duration::from_secs(30)).unwrap();
        Warm {
            id: id.into(),
            image: image.into(),
            image_id: "sha256:i".into(),
            caps: caps.clone(),
            gateway: false,
            container: format!("c-{id}"),
            channels,
            lease,
            worktree: state.join("worktrees").join(id),
            worktree_fs: Default::default(),
            spec: SandboxSpec::new(id, "t", image, &[], state.join(id), "", caps),
            output: futures_util::stream::empty().boxed(),
        }
    }

    fn pool() -> Pool {
        Pool {
            size: 2,
            images: vec!["a".into(), "b".into()],
            caps: Caps::default(),
            slots: Mutex::default(),
            taken: Notify::new(),
        }
    }

    #[test]
    fn only_a_sandbox_of_the_same_image_and_caps_is_reserved() {
        let state = tempfile::tempdir().unwrap();
        let pool = pool();
        let caps = Caps::default();
        let other = Caps {
            memory_bytes: caps.memory_bytes / 2,
            ..caps.clone()
        };
        assert_eq!(pool.reserve("a", &caps), None);
        pool.put(warm(state.path(), "w1", "a", &caps));
        pool.put(warm(state.path(), "w2", "b", &caps));
        assert_eq!(pool.ready_of("a"), 1);
        // Another image or other caps: nothing.
        assert_eq!(pool.reserve("c", &caps), None);
        assert_eq!(pool.reserve("a", &other), None);
        // The match, once: reserved, then taken once, then gone.
        assert_eq!(pool.reserve("a", &caps).as_deref(), Some("w1"));
        assert_eq!(pool.reserve("a", &caps), None);
        assert_eq!(pool.ready_of("a"), 0);
        assert!(pool.take("w2").is_none(), "a ready sandbox is not reserved");
        assert_eq!(pool.take("w1").map(|w| w.id).as_deref(), Some("w1"));
        assert!(pool.take("w1").is_none(), "a warm sandbox served twice");
        assert_eq!(pool.all().len(), 1);
    }

    #[test]
    fn a_reservation_no_run_takes_lapses() {
        let state = tempfile::tempdir().unwrap();
        let pool = pool();
        pool.put(warm(state.path(), "w1", "a", &Caps::default()));
        let id = pool.reserve("a", &Caps::default()).unwrap();
        assert!(pool.lapsed(Duration::from_secs(60)).is_empty());
        let lapsed = pool.lapsed(Duration::ZERO);
        assert_eq!(
            lapsed.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
            [id.as_str()]
        );
        assert!(pool.take(&id).is_none(), "a lapsed reservation was taken");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Whatever the order of fills, reservations, takes, lapses and a
        /// stop: a reservation names a ready sandbox of the image and caps
        /// asked for, a sandbox is taken at most once, a taken or lapsed
        /// one is never ready again, and every sandbox made is, at the end,
        /// either taken once or handed back once for removal.
        #[test]
        fn no_warm_sandbox_is_handed_out_twice(
            ops in proptest::collection::vec((0u8..5, 0usize..2, 0usize..2, 0usize..8), 1..40),
        ) {
            let state = tempfile::tempdir().unwrap();
            let pool = pool();
            let images = ["a", "b"];
            let caps = [Caps::default(), Caps { pids: 7, ..Caps::default() }];
            let mut made = Vec::<(String, usize, usize)>::new();
            let (mut reserved, mut taken, mut removed) =
                (Vec::<String>::new(), Vec::<String>::new(), Vec::<String>::new());
            for (op, i, c, n) in ops {
                match op {
                    0 => {
                        let id = format!("w{}", made.len());
                        pool.put(warm(state.path(), &id, images[i], &caps[c]));
                        made.push((id, i, c));
                    }
                    1 => {
                        if let Some(id) = pool.reserve(images[i], &caps[c]) {
                            proptest::prop_assert!(!reserved.contains(&id), "{} reserved twice", id);
                            // Made for that image and those caps.
                            proptest::prop_assert!(made.contains(&(id.clone(), i, c)), "{} does not fit", id);
                            reserved.push(id);
                        }
                    }
                    2 => {
                        let id = reserved.get(n % reserved.len().max(1)).cloned().unwrap_or_default();
                        if let Some(w) = pool.take(&id) {
                            proptest::prop_assert_eq!(&w.id, &id);
                            proptest::prop_assert!(!taken.contains(&id), "{} taken twice", id);
                            taken.push(id);
                        }
                    }
                    3 => removed.extend(pool.lapsed(Duration::ZERO).into_iter().map(|w| w.id)),
                    _ => {
                        // Taken or lapsed sandboxes are never ready again.
                        let ready = pool.ready_of("a") + pool.ready_of("b");
                        proptest::prop_assert_eq!(ready, made.len() - reserved.len());
                    }
                }
            }
            removed.extend(pool.all().into_iter().map(|w| w.id));
            let mut seen: Vec<String> = taken.iter().chain(removed.iter()).cloned().collect();
            seen.sort();
            let before = seen.len();
            seen.dedup();
            proptest::prop_assert_eq!(before, seen.len(), "a sandbox both taken and removed, or twice");
            let mut all: Vec<String> = made.iter().map(|(id, _, _)| id.clone()).collect();
            all.sort();
            proptest::prop_assert_eq!(seen, all, "a sandbox lost");
        }
    }

    #[test]
    fn the_pool_is_what_the_configuration_asks_for() {
        let none = nightshift_core::config::PoolConfig::default();
        assert!(Pool::new(&none, Caps::default()).is_none());
        let two = nightshift_core::config::PoolConfig {
            size: 2,
            images: vec![],
        };
        let pool = Pool::new(&two, Caps::default()).unwrap();
        assert_eq!(pool.size, 2);
        assert_eq!(
            pool.images,
            [nightshift_engine_docker::image::default_reference()]
        );
    }
}
