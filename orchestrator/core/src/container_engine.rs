//! The container engine as the core sees it: a narrow trait owned by the
//! core, implemented by the bollard adapter (`nightshift-engine-docker`) and by
//! [`fake::FakeEngine`], a hand-written fake that records what it was asked
//! and answers what a test scripted.
//!
//! It holds everything the core asks of an engine: the kill switch's first
//! step (find a state's sandboxes by their labels, kill, remove) and the
//! whole run lifecycle (`run.rs` is generic over it: the image, create from
//! a [`SandboxSpec`], the engine's own inspect document for the attestation,
//! attach, start, wait, the exit state). Nothing here names an engine's
//! client (`scripts/check-layers.py` fails if the core depends on one), but
//! `inspect_json` is still the Engine API's inspect document (Docker's,
//! Podman's): an engine without one needs the engine-neutral observation
//! the engines issue brings.
//!
//! Invariants every implementation keeps:
//! - `kill` of a container that already stopped, and `remove` of one
//!   already gone, are not errors; `managed` lists every container carrying
//!   nightshift's labels (those of its [`SandboxSpec`]), running or not.
//! - `create` makes the container from the spec alone and never starts it;
//!   only `start` runs the agent
//!   (`orchestrator/supervisor/src/run.rs::tests::a_network_is_refused_before_the_start`,
//!   `tests/tests/attestation.rs::a_container_that_breaks_tier0_never_starts`).
//! - `inspect_json` is the engine's report of the created container (the
//!   Engine API's inspect document), never the spec we asked for: the
//!   attestation judges what the engine says it made
//!   (`orchestrator/supervisor/src/run.rs::tests::privileges_are_refused_before_the_start`).
//! - `attach` before `start` misses no output; `wait` ends once the
//!   container is no longer running.
//! - `remove` returns `Ok` only when the container is gone (or was);
//!   a removal already under way is [`EngineError::RemovalInProgress`], an
//!   engine that did not answer [`EngineError::is_unreachable`]: neither is
//!   the container gone. [`ContainerEngine::remove_confirmed`] waits (bounded)
//!   until the engine confirms it, each try on a fresh request
//!   (`orchestrator/supervisor/src/killswitch.rs::tests::a_removal_already_in_progress_is_waited_for_until_the_container_is_gone`,
//!   `orchestrator/supervisor/src/run.rs::tests::a_removal_in_progress_at_the_ending_is_waited_for_then_the_work_imported`).

use std::future::Future;
use std::time::Duration;

use std::collections::HashMap;
use std::pin::Pin;

use futures_util::Stream;

use crate::monitor::Observed;
use crate::sandbox::SandboxSpec;
use crate::setup::SetupSpec;

/// An engine's own error, carried as the cause of an [`EngineError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the container engine is unreachable ({endpoint}): {message}")]
    Unreachable { endpoint: String, message: String },
    #[error("image {0} is not in the local engine (build it with `nightshift image build`, or name a local image)")]
    ImageMissing(String),
    #[error("{doing}: {source}")]
    Api {
        doing: String,
        #[source]
        source: BoxError,
    },
    /// No answer from the engine: the connection failed or was cut. The
    /// engine being unreachable is not the container being gone.
    #[error("{doing}: the connection to the container engine failed: {source}")]
    Lost {
        doing: String,
        #[source]
        source: BoxError,
    },
    /// The engine is already removing the container (`409`): it is not gone
    /// yet.
    #[error("removing container {0}: a removal is already in progress")]
    RemovalInProgress(String),
    /// An engine behind the trait other than the bollard one answered with
    /// a refusal (what was asked and why).
    #[error("{0}")]
    Refused(String),
}

impl EngineError {
    /// The engine could not be reached (a fresh connection may do better).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            EngineError::Lost { .. } | EngineError::Unreachable { .. }
        )
    }
}

/// A local image as the engine reports it.
#[derive(Debug, Clone)]
pub struct ImageInfo {
    pub id: String,
    pub env: Vec<String>,
}

/// How a container ended, as the engine reports it.
#[derive(Debug, Clone, Default)]
pub struct ExitState {
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    pub running: bool,
}

/// One chunk of a sandbox's output.
#[derive(Debug)]
pub enum Output {
    Stdout(bytes::Bytes),
    Stderr(bytes::Bytes),
}

pub type OutputStream = Pin<Box<dyn Stream<Item = Result<Output, EngineError>> + Send>>;

/// Resource figures sampled while a sandbox runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub memory_bytes: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
    pub cpu_ns: Option<u64>,
    pub pids: Option<u64>,
}

/// Where the cap figures of a state's sandboxes are kept on this host: the
/// fleet's cgroup, under which each is created.
#[derive(Debug, Clone)]
pub struct StatsScope {
    pub layout: orchestrator_cgroups::Layout,
    pub fleet: String,
}

/// A container of ours, found through its labels.
#[derive(Debug, Clone)]
pub struct Managed {
    pub id: String,
    pub run: Option<String>,
    pub labels: HashMap<String, String>,
    pub running: bool,
}

pub trait ContainerEngine: Sync {
    /// Which engine this is: its inspect document is read by that engine's
    /// adapter function (`orchestrator_attest::observe`).
    fn kind(&self) -> orchestrator_attest::EngineKind {
        orchestrator_attest::EngineKind::Docker
    }
    /// The OCI runtime this engine was told to run sandboxes with
    /// (`NIGHTSHIFT_RUNTIME`: `--runtime`, `[sandbox] runtime`); `None`:
    /// the engine's default.
    fn runtime(&self) -> Option<String> {
        None
    }
    /// The cgroup parent a run's sandbox is created under, given the
    /// fleet's (Docker: the fleet's own; Podman: a cgroup of the run's own
    /// under it, which outlives the container).
    fn sandbox_cgroup_parent(&self, fleet_parent: &str, run: &str) -> String;
    /// One round of a running sandbox's cap figures as this engine observes
    /// them: memory and its peak, CPU time, processes, OOM kills, open
    /// files; `None` for what it cannot tell. The caps are judged on these
    /// (`monitor::breach`), so they are figures the kernel keeps, never
    /// anything the agent says.
    fn stats(
        &self,
        scope: &StatsScope,
        run: &str,
        container: &str,
    ) -> impl Future<Output = Observed> + Send;
    /// The last figures of a sandbox that has stopped (read before its
    /// removal), given how it `ended`: `oom_kills` is set when its memory
    /// cap (`memory_cap` bytes) killed it, whether or not the engine's exit
    /// state says so.
    fn final_stats(
        &self,
        scope: &StatsScope,
        run: &str,
        container: &str,
        ended: &ExitState,
        memory_cap: u64,
    ) -> impl Future<Output = Observed> + Send;
    /// Releases what a run's figures needed, once its sandbox is gone.
    fn release_stats(&self, scope: &StatsScope, run: &str) -> impl Future<Output = ()> + Send;
    /// A local image, or `None` when the engine does not hold it.
    fn image(
        &self,
        reference: &str,
    ) -> impl Future<Output = Result<Option<ImageInfo>, EngineError>> + Send;
    /// A local image, or [`EngineError::ImageMissing`] naming it.
    fn require_image(
        &self,
        reference: &str,
    ) -> impl Future<Output = Result<ImageInfo, EngineError>> + Send {
        async move {
            self.image(reference)
                .await?
                .ok_or_else(|| EngineError::ImageMissing(reference.to_string()))
        }
    }
    /// Creates (does not start) the run's container; returns its id.
    fn create(
        &self,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<String, EngineError>> + Send;
    /// Creates (does not start) a run's setup container (docs/setup.md):
    /// not a sandbox. It has the engine's default network, no door and no
    /// model gateway; its only host paths are those of the [`SetupSpec`].
    /// Returns its id.
    fn create_setup(
        &self,
        spec: &SetupSpec,
    ) -> impl Future<Output = Result<String, EngineError>> + Send;
    /// The engine's own inspect document of a container, as JSON.
    fn inspect_json(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<serde_json::Value, EngineError>> + Send;
    /// The container's output from now on, to its end.
    fn attach(&self, id: &str) -> impl Future<Output = Result<OutputStream, EngineError>> + Send;
    /// Starts the created container: the agent runs from here.
    fn start(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send;
    /// Waits for the container to stop; its exit code.
    fn wait(&self, id: &str) -> impl Future<Output = Result<i64, EngineError>> + Send;
    /// How the container ended (or that it still runs).
    fn exit_state(&self, id: &str) -> impl Future<Output = Result<ExitState, EngineError>> + Send;
    /// The container's state as the engine names it (`running`, `exited`,
    /// `dead`, `removing`, ...), or `None` when it is gone.
    fn status(&self, id: &str) -> impl Future<Output = Result<Option<String>, EngineError>> + Send;
    /// Containers carrying nightshift's label, optionally of one run only.
    fn managed(
        &self,
        run: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Managed>, EngineError>> + Send;
    /// SIGKILL.
    fn kill(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send;
    /// Forced removal.
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send;
    /// Forced removal, confirmed: returns `Ok` once the engine says the
    /// container is gone. A removal already in progress is waited for and
    /// an engine that does not answer is asked again, for at most
    /// [`REMOVE_TRIES`] tries [`REMOVE_RETRY`] apart; then the last error.
    fn remove_confirmed(&self, id: &str) -> impl Future<Output = Result<(), EngineError>> + Send {
        async move {
            let mut tries = 0;
            loop {
                tries += 1;
                match self.remove(id).await {
                    Ok(()) => return Ok(()),
                    Err(e)
                        if tries < REMOVE_TRIES
                            && (e.is_unreachable()
                                || matches!(e, EngineError::RemovalInProgress(_))) =>
                    {
                        tracing::warn!(container = %id, error = %e, "removal not confirmed yet");
                        tokio::time::sleep(REMOVE_RETRY).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// How many times [`ContainerEngine::remove_confirmed`] asks.
pub const REMOVE_TRIES: u32 = 20;
/// How long it waits between two tries.
pub const REMOVE_RETRY: Duration = Duration::from_millis(500);

pub mod fake {
    //! An in-memory engine: containers in a list, every call recorded, and
    //! what a test scripts: the inspect document a created container
    //! reports, the exit code it ends with, containers whose kill or
    //! removal the engine refuses, images it lacks.

    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use super::ContainerEngine;
    use super::{EngineError, ExitState, ImageInfo, Managed, OutputStream, StatsScope};
    use crate::monitor::Observed;
    use crate::sandbox::{SandboxSpec, LABEL_RUN};
    use crate::setup::SetupSpec;

    #[derive(Debug, Default)]
    pub struct FakeEngine {
        pub containers: Mutex<Vec<Managed>>,
        /// `create NAME` / `inspect ID` / `attach ID` / `start ID` /
        /// `wait ID` / `kill ID` / `remove ID`, in the order asked.
        pub calls: Mutex<Vec<String>>,
        /// Containers whose kill fails (one that stopped by itself meanwhile).
        pub refuse_kill: HashSet<String>,
        /// Containers whose removal fails.
        pub refuse_remove: HashSet<String>,
        /// Images the engine does not hold (every other reference exists).
        pub missing_images: HashSet<String>,
        /// What a created container's inspect document is, made from the
        /// spec it was created from (`null`, an unreadable document, when
        /// none was scripted).
        pub report: Option<fn(&SandboxSpec) -> serde_json::Value>,
        /// The exit code a started container ends with, at once.
        pub exit_code: i64,
        /// The containers created (id, spec), in order.
        pub created: Mutex<Vec<(String, SandboxSpec)>>,
        /// The setup containers created (id, spec), in order.
        pub created_setups: Mutex<Vec<(String, SetupSpec)>>,
        /// The exit code a started setup container ends with.
        pub setup_exit_code: i64,
        /// How many removals of a container answer "already in progress"
        /// (the engine's `409`) before one finds it gone (`404`).
        pub removal_in_progress: Mutex<HashMap<String, u32>>,
        /// While set, no call reaches the engine (a cut connection).
        pub lost: AtomicBool,
        /// Cut the connection (set `lost`) once a container has started.
        pub lose_after_start: bool,
    }

    /// The engine answered, refusing.
    fn refused(doing: &str, id: &str) -> EngineError {
        EngineError::Refused(format!("{doing} {id}: refused by the fake"))
    }

    fn lost(doing: &str, id: &str) -> EngineError {
        EngineError::Unreachable {
            endpoint: "fake".into(),
            message: format!("{doing} {id}: the connection was cut"),
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    impl FakeEngine {
        pub fn with(containers: Vec<Managed>) -> Self {
            Self {
                containers: Mutex::new(containers),
                ..Default::default()
            }
        }

        /// An engine whose created containers report what `report` makes
        /// of their spec.
        pub fn reporting(report: fn(&SandboxSpec) -> serde_json::Value) -> Self {
            Self {
                report: Some(report),
                ..Default::default()
            }
        }

        pub fn calls(&self) -> Vec<String> {
            lock(&self.calls).clone()
        }

        /// Whether any call began with `verb` (`start`, `create`, ...).
        pub fn called(&self, verb: &str) -> bool {
            self.calls()
                .iter()
                .any(|c| c.split(' ').next() == Some(verb))
        }

        pub fn ids(&self) -> Vec<String> {
            lock(&self.containers)
                .iter()
                .map(|c| c.id.clone())
                .collect()
        }

        fn record(&self, call: String) {
            lock(&self.calls).push(call);
        }

        fn known(&self, id: &str) -> Result<(), EngineError> {
            if self.lost.load(Ordering::SeqCst) {
                return Err(lost("reaching", id));
            }
            if lock(&self.containers).iter().any(|c| c.id == id) {
                Ok(())
            } else {
                Err(refused("finding container", id))
            }
        }

        fn set_running(&self, id: &str, running: bool) {
            for c in lock(&self.containers).iter_mut().filter(|c| c.id == id) {
                c.running = running;
            }
        }
    }

    impl ContainerEngine for FakeEngine {
        async fn image(&self, reference: &str) -> Result<Option<ImageInfo>, EngineError> {
            Ok(
                (!self.missing_images.contains(reference)).then(|| ImageInfo {
                    id: format!("sha256:fake-{reference}"),
                    env: Vec::new(),
                }),
            )
        }

        async fn create(&self, spec: &SandboxSpec) -> Result<String, EngineError> {
            self.record(format!("create {}", spec.name));
            let id = format!("fake-{}", lock(&self.created).len() + 1);
            lock(&self.created).push((id.clone(), spec.clone()));
            let labels: std::collections::HashMap<String, String> =
                spec.labels.clone().into_iter().collect();
            lock(&self.containers).push(Managed {
                id: id.clone(),
                run: labels.get(LABEL_RUN).cloned(),
                labels,
                running: false,
            });
            Ok(id)
        }

        async fn create_setup(&self, spec: &SetupSpec) -> Result<String, EngineError> {
            self.record(format!("create-setup {}", spec.name));
            let id = format!("fake-setup-{}", lock(&self.created_setups).len() + 1);
            lock(&self.created_setups).push((id.clone(), spec.clone()));
            let labels: std::collections::HashMap<String, String> =
                spec.labels.clone().into_iter().collect();
            lock(&self.containers).push(Managed {
                id: id.clone(),
                run: labels.get(LABEL_RUN).cloned(),
                labels,
                running: false,
            });
            Ok(id)
        }

        async fn inspect_json(&self, id: &str) -> Result<serde_json::Value, EngineError> {
            self.record(format!("inspect {id}"));
            self.known(id)?;
            let created = lock(&self.created);
            let spec = created.iter().find(|(c, _)| c == id).map(|(_, s)| s);
            Ok(match (self.report, spec) {
                (Some(report), Some(spec)) => report(spec),
                _ => serde_json::Value::Null,
            })
        }

        async fn attach(&self, id: &str) -> Result<OutputStream, EngineError> {
            self.record(format!("attach {id}"));
            self.known(id)?;
            Ok(Box::pin(futures_util::stream::empty()))
        }

        async fn start(&self, id: &str) -> Result<(), EngineError> {
            self.record(format!("start {id}"));
            self.known(id)?;
            // It runs and ends at once with the scripted code.
            self.set_running(id, false);
            if self.lose_after_start {
                self.lost.store(true, Ordering::SeqCst);
            }
            Ok(())
        }

        async fn wait(&self, id: &str) -> Result<i64, EngineError> {
            self.record(format!("wait {id}"));
            self.known(id)?;
            if id.starts_with("fake-setup-") {
                return Ok(self.setup_exit_code);
            }
            Ok(self.exit_code)
        }

        async fn exit_state(&self, id: &str) -> Result<ExitState, EngineError> {
            self.known(id)?;
            let started = self.calls().contains(&format!("start {id}"));
            Ok(ExitState {
                exit_code: started.then_some(self.exit_code),
                oom_killed: false,
                running: false,
            })
        }

        async fn status(&self, id: &str) -> Result<Option<String>, EngineError> {
            if self.lost.load(Ordering::SeqCst) {
                return Err(lost("inspecting", id));
            }
            Ok(lock(&self.containers)
                .iter()
                .find(|c| c.id == id)
                .map(|c| if c.running { "running" } else { "exited" }.to_string()))
        }

        async fn managed(&self, run: Option<&str>) -> Result<Vec<Managed>, EngineError> {
            if self.lost.load(Ordering::SeqCst) {
                return Err(lost("listing", run.unwrap_or("all")));
            }
            Ok(lock(&self.containers)
                .iter()
                .filter(|c| run.is_none() || c.run.as_deref() == run)
                .cloned()
                .collect())
        }

        async fn kill(&self, id: &str) -> Result<(), EngineError> {
            self.record(format!("kill {id}"));
            if self.lost.load(Ordering::SeqCst) {
                return Err(lost("killing", id));
            }
            if self.refuse_kill.contains(id) {
                return Err(refused("killing", id));
            }
            self.set_running(id, false);
            Ok(())
        }

        async fn remove(&self, id: &str) -> Result<(), EngineError> {
            self.record(format!("remove {id}"));
            if self.lost.load(Ordering::SeqCst) {
                return Err(lost("removing", id));
            }
            if self.refuse_remove.contains(id) {
                return Err(refused("removing", id));
            }
            if let Some(left) = lock(&self.removal_in_progress).get_mut(id) {
                if *left > 0 {
                    *left -= 1;
                    return Err(EngineError::RemovalInProgress(id.to_string()));
                }
            }
            lock(&self.containers).retain(|c| c.id != id);
            Ok(())
        }

        fn sandbox_cgroup_parent(&self, fleet_parent: &str, _run: &str) -> String {
            fleet_parent.to_owned()
        }

        /// No figures: a fake sandbox has no cgroup.
        async fn stats(&self, _scope: &StatsScope, _run: &str, container: &str) -> Observed {
            self.record(format!("stats {container}"));
            Observed::default()
        }

        async fn final_stats(
            &self,
            _scope: &StatsScope,
            _run: &str,
            container: &str,
            _ended: &ExitState,
            _memory_cap: u64,
        ) -> Observed {
            self.record(format!("final_stats {container}"));
            Observed::default()
        }

        async fn release_stats(&self, _scope: &StatsScope, _run: &str) {}
    }
}
