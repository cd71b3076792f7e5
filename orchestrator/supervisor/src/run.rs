//! The run lifecycle: worktree, sandbox, attestation, start, observe, import,
//! remove — each step audited from what the supervisor itself observed.
//!
//! The lifecycle is generic over the core's two traits, the container engine
//! ([`ContainerEngine`]) and the state store ([`StateStore`]), through
//! [`Supervisor<E, S>`]: production runs it on the bollard [`Engine`] and the
//! SQLite [`Store`] (the defaults), the unit tests on the fakes. There is
//! one code path. The host's side (the worktree's filesystem and mount,
//! what the attestation reads of the host) is the supervisor's
//! [`nightshift_core::hostview::HostView`]; git, the door and the cgroup figures stay
//! real adapters called from here.
//!
//! Invariants:
//! - The agent never starts unless the inspected container passed the Tier 0
//!   attestation, and the attestation is an audit entry either way (an
//!   inspect document that cannot be read fails every property); in a warm
//!   sandbox (`warm_begin`) the running container is attested before its
//!   waiting wrapper is handed the agent's command
//!   (`tests/tests/pool.rs::warm_runs_begin_in_sandboxes_made_before_them_and_none_is_used_twice`,
//!   `tests::a_capability_is_refused_before_the_start`,
//!   `tests::an_unreadable_inspect_is_refused_before_the_start`,
//!   `tests/tests/attestation.rs::a_container_that_breaks_tier0_never_starts`).
//! - Whatever the ending (exit, error, refusal, SIGINT/SIGTERM), the container
//!   is removed, the worktree is imported if it existed (nothing the run wrote
//!   is lost) and then removed once the import succeeded, its door directory
//!   is removed, and a `run_ended` entry says how it ended (written with the
//!   final record in one transaction, and only if the run has not ended)
//!   (`tests::a_whole_import_keeps_the_ending`,
//!   `tests/tests/interrupt.rs::sigterm_mid_run_leaves_nothing_behind`,
//!   `tests/tests/run.rs::committed_and_uncommitted_work_arrive_in_the_host_repository`,
//!   `tests/tests/faults.rs::an_ended_run_is_never_ended_again`).
//! - The run is marked imported (with its result) in the store before its
//!   worktree's removal begins, so a supervisor killed half-way through the
//!   removal leaves a worktree that reconciliation only removes
//!   (`tests/tests/faults.rs::an_imported_run_is_never_imported_again`).
//! - An import that
//!   cannot complete (the host's side: its repository locked or gone, a write
//!   refused) keeps the worktree, ends the run as `import failed: ...`
//!   (audited `import_failed`), and `nightshift import RUN` retries it
//!   ([`retry_import`]). An import whose history was dropped (the worktree's
//!   objects or refs refused) brings the working files and says so in the
//!   status, the record and the audit (`history_dropped`): see
//!   [`import_state`].
//! - The worktree is read only after the engine confirmed the container
//!   removed ([`ContainerEngine::remove_confirmed`]), so nothing changes
//!   under the import. An engine that cannot be reached is not a sandbox
//!   that stopped: while the run waits, a lost connection is retried on
//!   fresh requests ([`wait_through`]); at the ending, a container not
//!   confirmed gone leaves the run unsettled (`running`, its reason
//!   [`UNCONFIRMED`]) with its worktree whole, and reconciliation settles it
//!   once the engine answers (container removed first, then the import)
//!   (`tests::a_removal_in_progress_at_the_ending_is_waited_for_then_the_work_imported`,
//!   `tests::an_engine_lost_mid_run_keeps_the_worktree_and_leaves_the_run_for_reconciliation`,
//!   `tests/tests/faults.rs::a_cut_engine_connection_loses_no_step_and_reconcile_removes_the_sandbox`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use nightshift_core::audit_log::{digest, Event};
use nightshift_core::channel::Channels as _;
use nightshift_core::container_engine::ContainerEngine;
use nightshift_core::monitor::{self, Breach, Observed};
use nightshift_core::sandbox::{Caps, SandboxSpec, SandboxUser, MAX_TASK_BYTES};
use nightshift_core::state_store::{now_rfc3339, RunRecord, StateStore, StoreError, Stores};
use nightshift_engine_docker::engine::{Engine, EngineError, Output, Sample};

use crate::landing::{Dropped, Landed};

mod packer;

/// Why a run was asked to stop from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Interrupt,
    Terminate,
    /// Its dispatcher could not renew its claim on the run's task in time
    /// (cut off from the store): the run stops before the claim lapses,
    /// so it never runs on while another worker takes the task over.
    Fenced,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::Interrupt => "SIGINT",
            Stop::Terminate => "SIGTERM",
            Stop::Fenced => "fenced",
        }
    }

    /// Why the run stopped, in its record's words.
    pub fn reason(self) -> String {
        match self {
            Stop::Fenced => "its worker could not renew its claim on the task before the claim lapsed (cut off from the store), so it stopped the run".into(),
            s => format!("its supervisor received {}", s.name()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunRequest {
    pub repo: PathBuf,
    pub base_ref: String,
    pub image: String,
    pub task: String,
    pub command: Vec<String>,
    pub caps: Caps,
    /// Echo the agent's output (sanitised) to this process's stdout/stderr.
    pub echo: bool,
    /// The repository's confidentiality, from the owner's configuration
    /// (private unless the owner said otherwise).
    pub repo_confidentiality: policies::Confidentiality,
    /// A dry run: every act is answered as it would have been and recorded
    /// with its would-be verdict; none is queued or carried out.
    pub dry_run: bool,
    /// The trusted setup phase before the agent (`[[setup]]`, `--setup`;
    /// docs/setup.md), or none.
    pub setup: Option<nightshift_core::setup::SetupPlan>,
    /// The capped run this run continues (`nightshift continue`): its
    /// creation audits the link on both runs.
    pub continues: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    BadInput(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("run {run} refused: the sandbox failed the Tier 0 attestation: {failures}")]
    Refused { run: String, failures: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Git(String),
    #[error("refused: nightshift is frozen ({0}); `nightshift thaw` ends the freeze")]
    Frozen(String),
    #[error("reading the policy: {0}")]
    Policy(String),
    #[error("run {run} interrupted by {}", signal.name())]
    Interrupted { run: String, signal: Stop },
}

/// Shared handles a run needs: the container engine and the state store,
/// each behind the core's trait (the bollard engine and the SQLite store in
/// production; [`nightshift_core::container_engine::fake::FakeEngine`] and
/// [`nightshift_core::state_store::fake::MemStore`] in unit tests), so the lifecycle
/// is one generic code path for both.
#[derive(Debug)]
pub struct Supervisor<E = Engine, S = Box<dyn StateStore>> {
    pub engine: E,
    /// The store's port, handed to the door and the gateway of each run.
    pub stores: Stores,
    /// The supervisor's own connection.
    pub store: Arc<Mutex<S>>,
    pub state_tag: String,
    /// `pid:starttime` of this supervisor process, put on every sandbox it
    /// creates so that a watchdog or a later supervisor can tell its orphans.
    pub identity: String,
    /// The fleet's parent cgroup, when managed.
    pub fleet: Option<FleetHandle>,
    /// Who sandboxes run as (config `[sandbox]`).
    pub sandbox_user: SandboxUser,
    /// The host's side of a run: the worktree's filesystem and mount, and
    /// what the attestation reads ([`nightshift_core::hostview::RealHost`] in
    /// production).
    pub host: Arc<dyn nightshift_core::hostview::HostView>,
    /// Warm sandboxes made ahead of their runs (`[pool]`; `serve` only):
    /// a run whose id is a reserved warm sandbox's begins in it.
    pub pool: Option<Arc<crate::pool::Pool>>,
    /// How a run's result comes back at its ordinary ending.
    pub results: ResultsBy,
}

/// How a run's result comes back when its own supervisor ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultsBy {
    /// Made by the end-of-run packer in a sandbox of its own and taken as a
    /// pack (`packer`): every supervisor that creates sandboxes.
    Packer,
    /// Read from the worktree by path (`import_into`): the unit tests'
    /// supervisors, whose fake engine runs nothing, and those that only
    /// stop and settle (reconciliation reads by path in any case).
    HostPath,
}

/// The fleet cgroup every sandbox of this state is created under.
#[derive(Debug, Clone)]
pub struct FleetHandle {
    pub layout: orchestrator_cgroups::Layout,
    pub name: String,
    pub memory_bytes: u64,
    pub cpus: f64,
}

impl FleetHandle {
    /// Creates (or updates) the fleet's cgroup with its limits.
    pub fn ensure(state_tag: &str, fleet: &nightshift_core::config::Fleet) -> Result<Self, String> {
        let fs = orchestrator_cgroups::RealFs;
        let layout = orchestrator_cgroups::detect(&fs).map_err(|e| e.to_string())?;
        let name = format!("nightshift-{state_tag}");
        orchestrator_cgroups::ensure_fleet(
            &fs,
            &layout,
            &name,
            orchestrator_cgroups::FleetLimits {
                memory_bytes: Some(fleet.memory_bytes),
                cpus: Some(fleet.cpus),
                pids: Some(fleet.pids),
            },
        )
        .map_err(|e| format!("setting up the fleet cgroup {name}: {e}"))?;
        Ok(Self {
            layout,
            name,
            memory_bytes: fleet.memory_bytes,
            cpus: fleet.cpus,
        })
    }

    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.name)
    }

    /// Where the engine reads its sandboxes' cap figures.
    pub fn scope(&self) -> nightshift_core::container_engine::StatsScope {
        nightshift_core::container_engine::StatsScope {
            layout: self.layout.clone(),
            fleet: self.name.clone(),
        }
    }
}

/// The host a supervisor's identity names: `NIGHTSHIFT_HOST_ID` when set
/// (a deployment whose hosts share a name says which is which, a Pod its
/// name), else the host's name and its boot's id, so two machines (or two
/// containers with their own process namespaces) never share one.
pub fn host_id() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let clean = |s: &str| -> String {
            s.trim()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
                .take(64)
                .collect()
        };
        if let Ok(given) = std::env::var("NIGHTSHIFT_HOST_ID") {
            let given = clean(&given);
            if !given.is_empty() {
                return given;
            }
        }
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        format!(
            "{}-{}",
            clean(&name),
            clean(&boot).chars().take(8).collect::<String>()
        )
    })
}

/// This process's identity as a supervisor: its pid and kernel start time,
/// so a reused pid is never mistaken for it, and the host it runs on
/// (`pid:starttime@host`, [`host_id`]).
pub fn process_identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid}:{start}@{}", host_id()))
}

/// Whether `identity` names a process of another host: its liveness is
/// not this host's to judge (a local pid says nothing of it); the run
/// queue's leases in the store decide when its tasks are lost.
pub fn identity_elsewhere(identity: &str) -> bool {
    identity
        .split_once('@')
        .is_some_and(|(_, host)| host != host_id())
}

/// Is the supervisor named by `identity` (`pid:starttime@host`) still
/// running? A process of another host counts as running: nothing here may
/// settle what it holds on the word of this host's process table
/// (`tests::another_hosts_process_is_never_judged_by_a_local_pid`). An
/// identity without a host (made before hosts were named) is this host's.
pub fn identity_alive(identity: &str) -> bool {
    if identity_elsewhere(identity) {
        return true;
    }
    let local = identity.split_once('@').map_or(identity, |(l, _)| l);
    let Some(pid) = local.split(':').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    process_identity(pid)
        .as_deref()
        .and_then(|i| i.split_once('@'))
        .is_some_and(|(l, _)| l == local)
}

impl<E: Clone, S> Clone for Supervisor<E, S> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            stores: self.stores.clone(),
            store: Arc::clone(&self.store),
            state_tag: self.state_tag.clone(),
            identity: self.identity.clone(),
            fleet: self.fleet.clone(),
            sandbox_user: self.sandbox_user,
            host: Arc::clone(&self.host),
            pool: self.pool.clone(),
            results: self.results,
        }
    }
}

impl<E: ContainerEngine, S: StateStore> Supervisor<E, S> {
    pub(crate) fn audit(
        &self,
        run: &str,
        event: Event,
        checkpoint: bool,
    ) -> Result<(), StoreError> {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        store.append(Some(run), &event, checkpoint)?;
        Ok(())
    }

    fn save(&self, record: &RunRecord) -> Result<(), StoreError> {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        store.put_run(record)
    }

    pub(crate) fn paths(&self) -> nightshift_core::state_store::StatePaths {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        nightshift_core::state_store::StatePaths::new(store.root().to_path_buf())
    }

    /// A run's sandbox as this supervisor makes it, cold or warm: the Tier 0
    /// spec with this supervisor's user, identity, runtime and fleet cgroup,
    /// reaching its channels.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sandbox_spec(
        &self,
        channels: &impl nightshift_core::channel::Channels,
        id: &str,
        image: &str,
        command: &[String],
        dest: PathBuf,
        task: &str,
        caps: &Caps,
    ) -> SandboxSpec {
        channels
            .attach(
                SandboxSpec::new(id, &self.state_tag, image, command, dest, task, caps)
                    .with_user(self.sandbox_user)
                    .with_supervisor(&self.identity),
            )
            .with_runtime(self.engine.runtime())
            .with_cgroup_parent(
                self.fleet
                    .as_ref()
                    .map(|f| self.engine.sandbox_cgroup_parent(&f.cgroup_parent(), id)),
            )
    }

    /// What removing a warm sandbox needs of this supervisor.
    pub(crate) fn pool_ports(&self) -> crate::pool::Ports<'_, E> {
        crate::pool::Ports {
            engine: &self.engine,
            host: &self.host,
            paths: self.paths(),
            stats: self.fleet.as_ref().map(FleetHandle::scope),
        }
    }
}

/// Writes the run's worktree at `dest` (its filesystem already there) from
/// its base, owned by the sandbox's user, and audits it.
async fn write_worktree<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    req: &RunRequest,
    held: &Held,
    id: &str,
    dest: &Path,
) -> Result<(), RunError> {
    let spec = orchestrator_git::WorktreeSpec {
        host_repo: req.repo.clone(),
        base_commit: held.base_commit.clone().unwrap_or_default(),
        run_id: id.to_string(),
        dest: dest.to_path_buf(),
        owner: Some((sup.sandbox_user.uid, sup.sandbox_user.gid)),
        // A night of runs on one base packs its history once.
        history_cache: Some(sup.paths().root.join("cache").join("history")),
    };
    let wt = tokio::task::spawn_blocking(move || orchestrator_git::create_worktree(&spec))
        .await
        .map_err(|e| RunError::Git(e.to_string()))?
        .map_err(|e| RunError::Git(e.to_string()))?;
    sup.audit(
        id,
        Event::WorktreeCreated {
            path: wt.path.display().to_string(),
            branch: wt.branch.clone(),
            base_commit: wt.base_commit.clone(),
            base_tree: wt.base_tree.clone(),
        },
        false,
    )?;
    Ok(())
}

/// What the steps created, so that the ending can undo it whatever happened.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// The run's channels (`channels`), closed once the sandbox is gone.
    pub(crate) channels: Option<std::sync::Arc<crate::channels::HostDir>>,
    pub(crate) door: Option<crate::door::DoorHandle>,
    /// The run's model gateway, when the state has a `models.toml`.
    pub(crate) gateway: Option<nightshift_gateway::GatewayHandle>,
    /// Renews the sandbox's lease until the run is over.
    pub(crate) lease: Option<nightshift_engine_docker::lease::Heartbeat>,
    pub(crate) container: Option<String>,
    /// A container was asked for (it may exist even if `create` failed).
    pub(crate) creating: bool,
    pub(crate) started: bool,
    pub(crate) worktree: Option<PathBuf>,
    /// The worktree's filesystem's figures when it was empty.
    pub(crate) worktree_fs: Option<nightshift_core::hostview::Usage>,
    pub(crate) base_commit: Option<String>,
    /// The engine's id of the run's image.
    pub(crate) image_id: String,
    /// The setup cache the sandbox mounts, once the setup phase gave one.
    pub(crate) setup: Option<crate::setup::Ready>,
    /// The image's own environment (what the attestation allows).
    pub(crate) image_env: Vec<String>,
    /// The run's caps (the end-of-run packer's come from them).
    pub(crate) caps: Caps,
}

/// Performs one run in the foreground. `stop` turns to `Some` when the run
/// must end early (a signal to `nightshift run`).
pub async fn execute<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    req: RunRequest,
    stop: watch::Receiver<Option<Stop>>,
) -> Result<RunRecord, RunError> {
    let id = ulid::Ulid::new().to_string().to_lowercase();
    execute_as(sup, id, req, stop).await
}

/// [`execute`] as run `id` (a new ULID, lowercase, that no run has), chosen
/// by the caller so that it can name the run before it begins (the run
/// queue's runs in process).
pub async fn execute_as<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    id: String,
    req: RunRequest,
    stop: watch::Receiver<Option<Stop>>,
) -> Result<RunRecord, RunError> {
    use tracing::Instrument as _;
    // Every event of the run's lifecycle is in this span (its door's are in
    // a span of their own naming the run). The lifecycle's events are info:
    // the command line says a run's error itself, so at the default level
    // (warnings) its stderr is as it was.
    let span = tracing::info_span!("run", run = %id);
    let result = lifecycle(sup, id, req, stop).instrument(span.clone()).await;
    if let Err(e) = &result {
        span.in_scope(|| tracing::info!(error = %e, "run failed"));
    }
    result
}

async fn lifecycle<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    id: String,
    req: RunRequest,
    stop: watch::Receiver<Option<Stop>>,
) -> Result<RunRecord, RunError> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(RunError::BadInput(format!("{id:?} is not a run id")));
    }
    if req.command.is_empty() {
        return Err(RunError::BadInput(
            "no agent command given (after `--`)".into(),
        ));
    }
    if req.task.len() > MAX_TASK_BYTES {
        return Err(RunError::BadInput(format!(
            "the task text is {} bytes; the limit is {MAX_TASK_BYTES}",
            req.task.len()
        )));
    }
    {
        let store = sup.store.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(from) = &req.continues {
            if store.run(from).is_err() {
                return Err(RunError::BadInput(format!(
                    "{from:?} is no run to continue"
                )));
            }
        }
        let set = nightshift_core::policy::load(&*store, None)
            .map_err(|e| RunError::Policy(e.to_string()))?;
        if let Some(freeze) = set.freeze() {
            return Err(RunError::Frozen(freeze.reason.clone()));
        }
    }
    // The sandbox's ids must be nobody's on this host: an escape, or a file
    // the agent leaves, would otherwise be that person's.
    let user = sup.sandbox_user;
    let accounts = sup.host.read_accounts().map_err(RunError::BadInput)?;
    let clashes = accounts.clashes(user.uid, user.gid);
    if !clashes.is_empty() {
        let named: Vec<String> = clashes.iter().map(ToString::to_string).collect();
        return Err(RunError::BadInput(format!(
            "refusing to run sandboxes as {}:{}: {}; set [sandbox] uid and gid in the config to ids no host account uses",
            user.uid,
            user.gid,
            named.join("; ")
        )));
    }
    let repo = req.repo.clone();
    let base_ref = req.base_ref.clone();
    let base =
        tokio::task::spawn_blocking(move || orchestrator_git::resolve_base(&repo, &base_ref))
            .await
            .map_err(|e| RunError::Git(e.to_string()))?
            .map_err(|e| RunError::BadInput(e.to_string()))?;
    let image = sup.engine.require_image(&req.image).await?;

    let mut record = RunRecord {
        id: id.clone(),
        created_at: now_rfc3339(),
        repo: req.repo.display().to_string(),
        base_ref: req.base_ref.clone(),
        base_commit: Some(base.commit.clone()),
        image: req.image.clone(),
        command: req.command.clone(),
        status: "created".into(),
        supervisor_pid: Some(std::process::id() as i64),
        supervisor: Some(sup.identity.clone()),
        dry_run: req.dry_run,
        task: (!req.task.is_empty()).then(|| req.task.clone()),
        ..Default::default()
    };
    sup.save(&record)?;
    sup.audit(
        &id,
        Event::RunCreated {
            repo: record.repo.clone(),
            base_ref: req.base_ref.clone(),
            base_commit: base.commit.clone(),
            image: req.image.clone(),
            image_id: image.id.clone(),
            command_digest: digest(req.command.join("\0").as_bytes()),
            task_digest: digest(req.task.as_bytes()),
            task_bytes: req.task.len(),
            caps: serde_json::to_value(&req.caps).unwrap_or_default(),
        },
        true,
    )?;
    tracing::info!(repo = %record.repo, base_ref = %req.base_ref, image = %req.image, dry_run = req.dry_run, "run created");
    if let Some(from) = &req.continues {
        // The link both ways: an entry on each run naming the other.
        sup.audit(&id, Event::Continues { run: from.clone() }, false)?;
        sup.audit(from, Event::ContinuedAs { run: id.clone() }, false)?;
    }

    let mut held = Held {
        base_commit: Some(base.commit.clone()),
        image_id: image.id.clone(),
        image_env: image.env.clone(),
        caps: req.caps.clone(),
        ..Default::default()
    };
    let outcome = steps(sup, &req, &image.env, &mut record, &mut held, stop).await;
    let ended = finish(sup, &mut record, &mut held, outcome).await;
    // The morning summary, when this was the night's last run (see
    // summary.rs); it never changes how the run ended.
    let stores = sup.stores.clone();
    let _ = tokio::task::spawn_blocking(move || crate::summary::after_run(&stores)).await;
    ended
}

/// How the agent phase ended, before the common ending.
#[derive(Debug)]
pub(crate) enum Ended {
    Exited,
    Stopped(Stop),
    Breach(Breach),
    KilledBy(String),
    /// The lease lapsed: the supervisor renewed nothing for this long, and
    /// the sandbox ended itself (or its host-side end killed it).
    LeaseLapsed {
        silence: Duration,
        bound: Duration,
    },
    /// The setup phase failed or was refused: the agent never started.
    SetupFailed(String),
}

async fn steps<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    req: &RunRequest,
    image_env: &[String],
    record: &mut RunRecord,
    held: &mut Held,
    mut stop: watch::Receiver<Option<Stop>>,
) -> Result<Ended, RunError> {
    let id = record.id.clone();
    let paths = sup.paths();
    nightshift_core::state_store::create_private_dir(&paths.worktrees())?;
    let run_dir = paths.run_dir(&id);
    nightshift_core::state_store::create_private_dir(&run_dir)?;
    let stopped = |stop: &watch::Receiver<Option<Stop>>| *stop.borrow();

    // The setup phase, before anything of the agent's exists.
    if let Some(plan) = &req.setup {
        let base = held.base_commit.clone().unwrap_or_default();
        let audit = |event: Event| sup.audit(&id, event, false);
        let asked = stop.clone();
        let asked = move || asked.borrow().is_some();
        let ctx = crate::setup::Ctx {
            stopped: &asked,
            engine: &sup.engine,
            paths: paths.clone(),
            audit: &audit,
            sandbox_user: sup.sandbox_user,
            state_tag: &sup.state_tag,
            identity: &sup.identity,
            cgroup_parent: sup.fleet.as_ref().map(FleetHandle::cgroup_parent),
        };
        let order = crate::setup::Order {
            repo: &req.repo,
            base_ref: &req.base_ref,
            image: &req.image,
            caps: &req.caps,
        };
        let prepared = crate::setup::prepare(&ctx, &id, &order, plan, &base, &held.image_id)
            .await
            .map_err(|e| match e {
                crate::setup::SetupError::BadInput(m) => RunError::BadInput(m),
                crate::setup::SetupError::Host(m) => RunError::Git(m),
                crate::setup::SetupError::Engine(e) => RunError::Engine(e),
                crate::setup::SetupError::Store(e) => RunError::Store(e),
            })?;
        match prepared {
            crate::setup::Setup::Failed(why) => return Ok(Ended::SetupFailed(why)),
            crate::setup::Setup::Stopped => {
                return Ok(match stopped(&stop) {
                    Some(s) => Ended::Stopped(s),
                    None => Ended::SetupFailed("setup was stopped".into()),
                })
            }
            crate::setup::Setup::Ready(ready) => {
                tracing::info!(outcome = ready.outcome, key = %ready.entry.key, "setup cache ready");
                held.setup = Some(*ready);
            }
        }
        if let Some(s) = stopped(&stop) {
            return Ok(Ended::Stopped(s));
        }
    }

    let warm = sup.pool.as_ref().and_then(|pool| pool.take(&id));
    let begun = match warm {
        Some(warm) => warm_begin(sup, req, image_env, record, held, warm, &stop).await?,
        None => cold_begin(sup, req, image_env, record, held, &stop).await?,
    };
    let Begun {
        container,
        output,
        dest,
        fleet_memory,
    } = match begun {
        Ok(begun) => begun,
        Err(ended) => return Ok(ended),
    };
    let started = Instant::now();
    record.status = "running".into();
    record.started_at = Some(now_rfc3339());
    sup.save(record)?;
    sup.audit(
        &id,
        Event::Started {
            container: container.clone(),
        },
        false,
    )?;
    tracing::info!(container = %container, "run started");

    let log_path = run_dir.join("output.log");
    let log = tokio::fs::File::create(&log_path)
        .await
        .map_err(|e| RunError::Git(format!("creating {}: {e}", log_path.display())))?;
    // The output is drained by its own task, always: a sandbox blocked on a
    // full pipe must never stall the supervisor (or the engine's kill).
    let (over_tx, mut over_rx) = tokio::sync::watch::channel(false);
    let drain = tokio::spawn(drain_output(
        output,
        log,
        req.caps.max_output_bytes,
        req.caps.output_ceiling(),
        req.echo,
        over_tx,
    ));
    let mut peak = Sample::default();
    let mut last = Observed::default();
    let wait = wait_through(&sup.engine, &container);
    tokio::pin!(wait);
    // The output's task ends with the output (or its connection).
    let mut drained = false;
    let deadline = tokio::time::sleep(req.caps.timeout);
    tokio::pin!(deadline);
    let mut sample_tick = tokio::time::interval(monitor::SAMPLE_EVERY);
    let mut worktree_tick = tokio::time::interval(monitor::WORKTREE_EVERY);
    let mut audit_every = 0u32;
    // A spent model token budget: the run ends after a short grace (its
    // agent reads the refusal first), and ends for that cap however it ends.
    let mut tokens_spent = held.gateway.as_ref().map(|g| g.cap_reached.clone());
    let mut token_breach: Option<Breach> = None;
    let grace = tokio::time::sleep(Duration::from_secs(86400 * 365));
    tokio::pin!(grace);
    let ended = loop {
        tokio::select! {
            code = &mut wait => {
                let _ = code?;
                match token_breach.take() {
                    Some(b) => break Ended::Breach(b),
                    None => break Ended::Exited,
                }
            }
            Some(reached) = token_cap(&mut tokens_spent), if token_breach.is_none() => {
                token_breach = Some(Breach {
                    cap: reached.kind,
                    limit: reached.cap,
                    observed: reached.used,
                    detail: reached.detail,
                });
                grace.as_mut().reset(tokio::time::Instant::now() + nightshift_gateway::CAP_GRACE);
            }
            _ = &mut grace, if token_breach.is_some() => {
                sup.engine.kill(&container).await?;
                if let Some(b) = token_breach.take() {
                    break Ended::Breach(b);
                }
            }
            changed = over_rx.changed(), if !drained => {
                if changed.is_err() {
                    drained = true;
                    continue;
                }
                if *over_rx.borrow() {
                    sup.engine.kill(&container).await?;
                    break Ended::Breach(Breach {
                        cap: "output",
                        limit: req.caps.max_output_bytes,
                        observed: req.caps.output_ceiling(),
                        detail: format!(
                            "output cap {} (more than {} written)",
                            monitor::mib(req.caps.max_output_bytes),
                            monitor::mib(req.caps.output_ceiling()),
                        ),
                    });
                }
            }
            _ = sample_tick.tick() => {
                if let Some(fleet) = &sup.fleet {
                    let observed = sup.engine.stats(&fleet.scope(), &id, &container).await;
                    last = Observed { worktree_bytes: last.worktree_bytes, ..observed };
                    peak.peak_memory_bytes = max_opt(peak.peak_memory_bytes, max_opt(observed.memory_peak_bytes, observed.memory_bytes));
                    peak.cpu_ns = max_opt(peak.cpu_ns, observed.cpu_ns);
                    audit_every += 1;
                    if audit_every.is_multiple_of(10) {
                        sup.audit(&id_of(record), resources_event(&last), false)?;
                    }
                    if let Some(b) = monitor::breach(&req.caps, &last) {
                        sup.engine.kill(&container).await?;
                        break Ended::Breach(b);
                    }
                }
            }
            _ = worktree_tick.tick() => {
                let used = worktree_used(&sup.host, &dest, held.worktree_fs).await;
                last.worktree_bytes = used.map(|u| u.bytes);
                last.worktree_files = used.map(|u| (u.files, u.files_total));
                if let Some(b) = monitor::breach(&req.caps, &last) {
                    sup.engine.kill(&container).await?;
                    break Ended::Breach(b);
                }
            }
            _ = &mut deadline => {
                sup.engine.kill(&container).await?;
                let cpu = peak.cpu_ns.map(|c| format!(", cpu {:.1}s", c as f64 / 1e9)).unwrap_or_default();
                break Ended::Breach(Breach {
                    cap: "timeout",
                    limit: req.caps.timeout.as_secs(),
                    observed: req.caps.timeout.as_secs(),
                    detail: format!("timeout {}s{cpu}", req.caps.timeout.as_secs()),
                });
            }
            _ = stop.changed() => {
                if let Some(s) = stopped(&stop) {
                    sup.engine.kill(&container).await?;
                    break Ended::Stopped(s);
                }
            }
        }
    };
    // The sandbox has stopped: its output ends; wait (bounded) for the rest.
    let (seen_out, kept) = match tokio::time::timeout(Duration::from_secs(10), drain).await {
        Ok(Ok(counts)) => counts,
        _ => (0, 0),
    };
    let duration = started.elapsed();
    let state = sup.engine.exit_state(&container).await?;
    // A last look at the figures before the container (and its cgroup)
    // goes, with what tells a kill by the memory cap where the engine does
    // not say it (Podman: `nightshift_engine_docker::stats`).
    if let Some(fleet) = &sup.fleet {
        let observed = sup
            .engine
            .final_stats(
                &fleet.scope(),
                &id,
                &container,
                &state,
                req.caps.memory_bytes as u64,
            )
            .await;
        peak.peak_memory_bytes = max_opt(
            peak.peak_memory_bytes,
            max_opt(observed.memory_peak_bytes, observed.memory_bytes),
        );
        peak.cpu_ns = max_opt(peak.cpu_ns, observed.cpu_ns);
        if observed.oom_kills.is_some() {
            last.oom_kills = observed.oom_kills;
        }
    }
    record.exit_code = state.exit_code;
    record.duration_ms = Some(duration.as_millis() as i64);
    record.peak_memory_bytes = peak.peak_memory_bytes.map(|v| v as i64);
    record.cpu_ns = peak.cpu_ns.map(|v| v as i64);
    // How it ended, as observed: a kill switch request, or the kernel's OOM kill.
    let read_kill = || -> Result<Option<String>, RunError> {
        let store = sup.store.lock().unwrap_or_else(|p| p.into_inner());
        Ok(store.kill_request(&record.id)?)
    };
    let mut killed_by = read_kill()?;
    // Read once: reading takes the notification.
    let fleet_oom = fleet_memory.oom_notified();
    if killed_by.is_none()
        && matches!(ended, Ended::Exited)
        && state.exit_code == Some(137)
        && !state.oom_killed
        && last.oom_kills.unwrap_or(0) == 0
        && !fleet_oom
    {
        // A SIGKILL from outside: the kill switch stops sandboxes first and
        // records the request right after, so give the record a moment to
        // land before calling this an ordinary exit.
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            killed_by = read_kill()?;
            if killed_by.is_some() {
                break;
            }
        }
    }
    let ended = match ended {
        Ended::Exited if killed_by.is_some() => Ended::KilledBy(killed_by.unwrap_or_default()),
        Ended::Exited
            if state.exit_code == Some(137)
                && (state.oom_killed || last.oom_kills.unwrap_or(0) > 0 || fleet_oom) =>
        {
            let fleet_limit = sup
                .fleet
                .as_ref()
                .map(|f| f.memory_bytes)
                .unwrap_or(u64::MAX);
            let fleet_hits_after = sup
                .fleet
                .as_ref()
                .and_then(|f| monitor::fleet_memory_hits(&f.layout, &f.name));
            let fleet_peak = sup
                .fleet
                .as_ref()
                .and_then(|f| monitor::take_fleet_memory_peak(&f.layout, &f.name));
            let fleet_reached = fleet_oom
                || monitor::fleet_reached(
                    fleet_memory.hits_before(),
                    fleet_hits_after,
                    fleet_peak,
                    fleet_limit,
                );
            Ended::Breach(monitor::memory_breach(
                &req.caps,
                fleet_limit,
                peak.peak_memory_bytes,
                fleet_reached,
            ))
        }
        other => other,
    };
    // The wrapper's 125 (or the host-side end's kill) after a whole lease
    // without a renewal: the lease lapsed (see `nightshift_engine_docker::lease::lapsed`).
    let ended = match ended {
        Ended::Exited => {
            let silence = held
                .lease
                .as_ref()
                .map(nightshift_engine_docker::lease::Heartbeat::longest_silence)
                .unwrap_or_default();
            if nightshift_engine_docker::lease::lapsed(state.exit_code, silence, req.caps.lease) {
                Ended::LeaseLapsed {
                    silence,
                    bound: req.caps.lease,
                }
            } else {
                Ended::Exited
            }
        }
        other => other,
    };
    // A run that wrote past the worktree cap between two looks and exited
    // still went past it.
    let ended = match ended {
        Ended::Exited => {
            let used = worktree_used(&sup.host, &dest, held.worktree_fs).await;
            let seen = Observed {
                worktree_bytes: used.map(|u| u.bytes),
                worktree_files: used.map(|u| (u.files, u.files_total)),
                ..Default::default()
            };
            match monitor::breach(&req.caps, &seen) {
                Some(b) => Ended::Breach(Breach {
                    detail: format!("{} at exit", b.detail),
                    ..b
                }),
                None => Ended::Exited,
            }
        }
        other => other,
    };
    let ended_by = match &ended {
        Ended::Exited => "exit".to_string(),
        Ended::Breach(b) => format!("cap {}", b.cap),
        Ended::KilledBy(who) => format!("kill switch ({who})"),
        Ended::Stopped(s) => s.name().to_string(),
        Ended::LeaseLapsed { .. } => "lease lapsed".to_string(),
        Ended::SetupFailed(_) => "setup failed".to_string(),
    };
    if let Ended::Breach(b) = &ended {
        sup.audit(
            &record.id,
            Event::CapBreached {
                cap: b.cap.to_string(),
                limit: b.limit,
                observed: b.observed,
            },
            false,
        )?;
    }
    sup.audit(
        &record.id,
        resources_event(&Observed {
            memory_peak_bytes: peak.peak_memory_bytes,
            cpu_ns: peak.cpu_ns,
            ..last
        }),
        false,
    )?;
    sup.audit(
        &id,
        Event::Exited {
            exit_code: state.exit_code,
            oom_killed: state.oom_killed,
            ended_by,
            duration_ms: duration.as_millis() as i64,
            peak_memory_bytes: record.peak_memory_bytes,
            cpu_ns: record.cpu_ns,
            output_bytes: seen_out,
            output_kept_bytes: kept,
        },
        false,
    )?;
    Ok(ended)
}

/// The run's beginning in its warm sandbox: the sandbox and its channels
/// become the run's (`held`), the worktree is written into its filesystem,
/// the door and the gateway are served, the running container is attested
/// (audited as the run's), and only then is the agent's command handed to
/// the waiting wrapper. A sandbox that does not fit is removed and the run
/// begins cold.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn warm_begin<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    req: &RunRequest,
    image_env: &[String],
    record: &mut RunRecord,
    held: &mut Held,
    warm: crate::pool::Warm,
    stop: &watch::Receiver<Option<Stop>>,
) -> Result<Result<Begun, Ended>, RunError> {
    let paths = sup.paths();
    let models =
        nightshift_gateway::load(&paths.root).map_err(|e| RunError::BadInput(e.to_string()))?;
    let running = sup
        .engine
        .exit_state(&warm.container)
        .await
        .is_ok_and(|s| s.running);
    let fits = running
        && warm.image == req.image
        && warm.image_id == held.image_id
        && warm.caps == req.caps
        && warm.gateway == models.is_some()
        && req.setup.is_none()
        && warm.id == record.id;
    if !fits {
        tracing::info!(warm = %warm.id, running, "the warm sandbox does not fit the run: it begins cold");
        // Gone whole before the cold beginning reuses its id.
        crate::pool::discard(&sup.pool_ports(), warm).await;
        return cold_begin(sup, req, image_env, record, held, stop).await;
    }
    let crate::pool::Warm {
        id,
        container,
        channels,
        lease,
        worktree: dest,
        worktree_fs,
        spec,
        output,
        ..
    } = warm;
    // The run's from here: its ending undoes all of it.
    held.worktree = Some(dest.clone());
    held.worktree_fs = Some(worktree_fs);
    held.channels = Some(channels.clone());
    held.lease = Some(lease);
    held.creating = true;
    held.container = Some(container.clone());
    record.container_id = Some(container.clone());
    // The run's record holds it now: no longer a warm sandbox.
    let _ = std::fs::remove_file(crate::pool::marker(&paths, &id));

    write_worktree(sup, req, held, &id, &dest).await?;
    crate::door::configure_worktree(&dest)
        .map_err(|e| RunError::Git(format!("pointing the worktree's origin at the door: {e}")))?;
    serve_channels(sup, req, held, &channels, &id, models)?;
    if let Some(s) = *stop.borrow() {
        return Ok(Err(Ended::Stopped(s)));
    }
    // The container as it runs now, judged as a cold run's is before its
    // start: its wrapper alone runs in it.
    attest_sandbox(sup, &id, &container, &dest, &spec, image_env, record, held).await?;
    if let Some(s) = *stop.borrow() {
        return Ok(Err(Ended::Stopped(s)));
    }
    let fleet_memory = fleet_memory_watch(sup);
    if let Some(by) = kill_or_freeze(sup, &id)? {
        return Ok(Err(Ended::KilledBy(by)));
    }
    held.started = true;
    let late = std::collections::BTreeMap::from([
        ("NIGHTSHIFT_TASK".to_string(), req.task.clone()),
        (
            "NIGHTSHIFT_BASE_COMMIT".to_string(),
            held.base_commit.clone().unwrap_or_default(),
        ),
    ]);
    channels
        .hand_command(&req.command, &late)
        .map_err(|e| RunError::Git(format!("handing the warm sandbox its command: {e}")))?;
    Ok(Ok(Begun {
        container,
        output,
        dest,
        fleet_memory,
    }))
}

/// A run's sandbox, started.
pub(crate) struct Begun {
    pub(crate) container: String,
    pub(crate) output: nightshift_core::container_engine::OutputStream,
    pub(crate) dest: PathBuf,
    pub(crate) fleet_memory: monitor::FleetMemoryWatch,
}

/// The fleet's memory counter and OOM notification, taken just before the
/// agent starts (see [`monitor::FleetMemoryWatch`]).
fn fleet_memory_watch<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
) -> monitor::FleetMemoryWatch {
    sup.fleet
        .as_ref()
        .map(|f| monitor::FleetMemoryWatch::begin(&f.layout, &f.name))
        .unwrap_or_default()
}

/// The cold beginning: the worktree's filesystem, the worktree, the
/// channels, the sandbox created, attested and started. `Err(ended)` when
/// the run ended before its agent started.
pub(crate) async fn cold_begin<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    req: &RunRequest,
    image_env: &[String],
    record: &mut RunRecord,
    held: &mut Held,
    stop: &watch::Receiver<Option<Stop>>,
) -> Result<Result<Begun, Ended>, RunError> {
    let id = record.id.clone();
    let paths = sup.paths();
    let stopped = |stop: &watch::Receiver<Option<Stop>>| *stop.borrow();
    // Worktree.
    let dest = paths.worktrees().join(&id);
    held.worktree = Some(dest.clone());
    // Its own filesystem first: the kernel bounds it to the cap.
    let (fs_at, cap, host) = (dest.clone(), req.caps.max_worktree_bytes, sup.host.clone());
    let empty = tokio::task::spawn_blocking(move || host.make_worktree_fs(&fs_at, cap))
        .await
        .map_err(|e| RunError::Git(e.to_string()))?
        .map_err(|e| RunError::Git(format!("making the worktree's filesystem: {e}")))?;
    held.worktree_fs = Some(empty);
    write_worktree(sup, req, held, &id, &dest).await?;
    let (protect, host) = (dest.clone(), sup.host.clone());
    tokio::task::spawn_blocking(move || host.protect_worktree(&protect))
        .await
        .map_err(|e| RunError::Git(e.to_string()))?
        .map_err(RunError::Git)?;
    if let Some(s) = stopped(stop) {
        return Ok(Err(Ended::Stopped(s)));
    }
    if let Some(by) = kill_or_freeze(sup, &id)? {
        return Ok(Err(Ended::KilledBy(by)));
    }

    // The door: the only way anything leaves the sandbox.
    crate::door::configure_worktree(&dest)
        .map_err(|e| RunError::Git(format!("pointing the worktree's origin at the door: {e}")))?;
    // The run's channels (door, model socket, heartbeat): on this host, a
    // directory mounted read-only into the sandbox (`channels`).
    // The lease: renewed from now on by this process only (see `lease`).
    let (channels, lease) = crate::channels::HostDir::open_leased(&paths, &id, req.caps.lease)
        .map_err(|e| RunError::Git(format!("opening the run's channels: {e}")))?;
    held.channels = Some(channels.clone());
    held.lease = Some(lease);
    // The model gateway, when the owner configured model endpoints.
    let models =
        nightshift_gateway::load(&paths.root).map_err(|e| RunError::BadInput(e.to_string()))?;
    let gateway_port = serve_channels(sup, req, held, &channels, &id, models)?;

    // Sandbox: create, inspect, attest.
    let spec = sup
        .sandbox_spec(
            channels.as_ref(),
            &id,
            &req.image,
            &req.command,
            dest.clone(),
            &req.task,
            &req.caps,
        )
        .with_base_commit(held.base_commit.as_deref().unwrap_or_default());
    let spec = match gateway_port {
        Some(port) => spec.with_model_gateway(port),
        None => spec,
    };
    let spec = match &held.setup {
        Some(s) => spec.with_setup_cache(s.path.clone(), &s.entry.env),
        None => spec,
    };
    // Remember the name before the call: if creation half-succeeds, the
    // ending still finds and removes it by its label.
    held.creating = true;
    let container = sup.engine.create(&spec).await?;
    held.container = Some(container.clone());
    record.container_id = Some(container.clone());
    attest_sandbox(sup, &id, &container, &dest, &spec, image_env, record, held).await?;
    if let Some(s) = stopped(stop) {
        return Ok(Err(Ended::Stopped(s)));
    }

    // Start, with output attached first so nothing is missed.
    let output = sup.engine.attach(&container).await?;
    let fleet_memory = fleet_memory_watch(sup);
    // Last look before the agent runs.
    if let Some(by) = kill_or_freeze(sup, &id)? {
        return Ok(Err(Ended::KilledBy(by)));
    }
    held.started = true;
    if let Err(e) = sup.engine.start(&container).await {
        // The kill switch removes a created container: that is its kill.
        if let Some(by) = kill_or_freeze(sup, &id)? {
            return Ok(Err(Ended::KilledBy(by)));
        }
        return Err(e.into());
    }
    Ok(Ok(Begun {
        container,
        output,
        dest,
        fleet_memory,
    }))
}

/// Serves the run's door and, when the owner configured model endpoints
/// (`models`), its model gateway on `channels`; the relay's port then.
pub(crate) fn serve_channels<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    req: &RunRequest,
    held: &mut Held,
    channels: &crate::channels::HostDir,
    id: &str,
    models: Option<nightshift_gateway::models::Models>,
) -> Result<Option<u16>, RunError> {
    let door_channel = channels
        .door()
        .map_err(|e| RunError::Git(format!("opening the run's door: {e}")))?;
    held.door = Some(crate::door::open(
        &sup.stores,
        crate::acts::RunDoor {
            run: id.to_string(),
            repo: req.repo.clone(),
            base_commit: held.base_commit.clone().unwrap_or_default(),
            content: crate::acts::run_content_label(req.repo_confidentiality),
            dry_run: req.dry_run,
            result: None,
        },
        door_channel,
    ));
    Ok(match models {
        Some(models) => {
            let model_channel = channels
                .model()
                .map_err(|e| RunError::Git(format!("opening the run's model gateway: {e}")))?;
            held.gateway = Some(nightshift_gateway::open(
                &sup.stores,
                model_channel,
                id,
                crate::acts::run_content_label(req.repo_confidentiality),
                models,
                req.caps.max_tokens,
                req.caps.fleet_max_tokens_per_night,
            ));
            Some(nightshift_core::sandbox::RELAY_PORT)
        }
        None => None,
    })
}

/// Inspects a sandbox and judges it against `spec` (Tier 0): the
/// attestation (every property failed when the engine's document cannot be
/// read, with why), and the document.
pub(crate) async fn judge<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    container: &str,
    dest: &Path,
    spec: &SandboxSpec,
    image_env: &[String],
) -> Result<
    (
        orchestrator_attest::Attestation,
        Option<String>,
        serde_json::Value,
    ),
    RunError,
> {
    let inspected = sup.engine.inspect_json(container).await?;
    let host = sup.host.observe(dest).map_err(RunError::BadInput)?;
    let (attestation, unreadable) =
        match orchestrator_attest::observe(sup.engine.kind(), &inspected) {
            Ok(observed) => (
                orchestrator_attest::attest(&observed, &host, &{
                    let mut expect = spec.expectations(image_env.to_vec());
                    // Podman mounts these on a read-only root; its adapter
                    // sizes them.
                    if sup.engine.kind() == orchestrator_attest::EngineKind::Podman {
                        expect.allowed_tmpfs.extend(
                            orchestrator_attest::PODMAN_READ_ONLY_ROOT_TMPFS
                                .iter()
                                .map(|t| (*t).to_owned()),
                        );
                    }
                    expect
                }),
                None,
            ),
            // Fail closed, and audited like any other attestation: a document
            // nobody can read fails every property.
            Err(e) => (
                orchestrator_attest::Attestation {
                    engine: Some(sup.engine.kind()),
                    runtime: None,
                    properties: orchestrator_attest::PROPERTY_NAMES
                        .iter()
                        .map(|name| orchestrator_attest::Property {
                            name,
                            ok: false,
                            observed: "an unreadable inspect document".into(),
                            expected: "the engine's inspect document".into(),
                        })
                        .collect(),
                },
                Some(format!("the engine's inspect document is unreadable: {e}")),
            ),
        };
    Ok((attestation, unreadable, inspected))
}

/// Inspects the sandbox, judges it against `spec` (Tier 0) and audits the
/// attestation either way; `Err(Refused)` when it failed (or the engine's
/// document could not be read).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn attest_sandbox<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    id: &str,
    container: &str,
    dest: &Path,
    spec: &SandboxSpec,
    image_env: &[String],
    record: &mut RunRecord,
    held: &Held,
) -> Result<(), RunError> {
    let (id, container) = (id.to_string(), container.to_string());
    let (attestation, unreadable, inspected) =
        judge(sup, &container, dest, spec, image_env).await?;
    let passed = attestation.passed();
    let properties = serde_json::to_value(&attestation.properties).unwrap_or_default();
    record.attestation = Some(properties.clone());
    sup.audit(
        &id,
        Event::Attestation {
            passed,
            container: container.clone(),
            engine: attestation.engine.map(|e| e.name().to_owned()),
            runtime: attestation.runtime.clone(),
            properties,
            setup_cache: held.setup.as_ref().map(|s| {
                serde_json::json!({
                    "key": s.entry.key,
                    "digest": s.entry.digest,
                    "read_only": crate::setup::cache_mount_read_only(&inspected),
                })
            }),
        },
        true,
    )?;
    if passed {
        tracing::info!(container = %container, "sandbox attested");
    }
    if let Some(failures) = unreadable {
        tracing::info!(container = %container, failures = %failures, "sandbox refused: its inspect document is unreadable");
        return Err(RunError::Refused { run: id, failures });
    }
    if !passed {
        let failures = attestation
            .failures()
            .map(|p| {
                format!(
                    "{} (observed {}, expected {})",
                    p.name, p.observed, p.expected
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        tracing::info!(container = %container, failures = %failures, "sandbox refused: it failed the attestation");
        return Err(RunError::Refused { run: id, failures });
    }
    Ok(())
}

/// What the worktree holds beyond its empty filesystem, from `statvfs` of
/// its root (never a walk: see `monitor`). `None` when it cannot be read,
/// or the path is no longer that filesystem.
async fn worktree_used(
    host: &Arc<dyn nightshift_core::hostview::HostView>,
    worktree: &std::path::Path,
    empty: Option<nightshift_core::hostview::Usage>,
) -> Option<nightshift_core::hostview::Usage> {
    let empty = empty?;
    let (path, host) = (worktree.to_path_buf(), host.clone());
    let now = tokio::task::spawn_blocking(move || host.usage(&path))
        .await
        .ok()?
        .ok()?;
    now.since(&empty)
}

/// Waits for the container to stop. A connection to the engine that fails
/// or is cut is not the container stopping: the engine is asked again,
/// each time on a fresh request, every [`RECONNECT_EVERY`], until it
/// answers (the run's deadline, a cap or a signal still end the wait from
/// outside; the lease is renewed meanwhile, so the agent goes on).
async fn wait_through<E: ContainerEngine>(engine: &E, container: &str) -> Result<i64, EngineError> {
    loop {
        match engine.wait(container).await {
            Ok(code) => return Ok(code),
            Err(e) if e.is_unreachable() => {
                tracing::warn!(container = %container, error = %e, "the engine's connection was lost; asking again");
                loop {
                    tokio::time::sleep(RECONNECT_EVERY).await;
                    match engine.exit_state(container).await {
                        Ok(state) if !state.running => return Ok(state.exit_code.unwrap_or(-1)),
                        Ok(_) => break,
                        Err(e) if e.is_unreachable() => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// How often a run whose engine connection was lost asks the engine again.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// The reason a run's record holds while its sandbox could not be
/// confirmed gone: the supervisor gave it up with its worktree whole, and
/// reconciliation settles it once the engine answers (see `killswitch`).
pub const UNCONFIRMED: &str = "the sandbox could not be confirmed gone";

/// The next spent budget the gateway reports (never, without a gateway).
async fn token_cap(
    rx: &mut Option<watch::Receiver<Option<nightshift_gateway::CapReached>>>,
) -> Option<nightshift_gateway::CapReached> {
    let Some(rx) = rx.as_mut() else {
        return std::future::pending().await;
    };
    // The guard is gone before any await (a run's future is `Send`).
    let reached = rx.wait_for(Option::is_some).await.map(|v| v.clone());
    match reached {
        Ok(v) => v,
        Err(_) => std::future::pending().await,
    }
}

fn id_of(record: &RunRecord) -> String {
    record.id.clone()
}

fn resources_event(o: &Observed) -> Event {
    Event::Resources {
        memory_bytes: o.memory_bytes,
        memory_peak_bytes: o.memory_peak_bytes,
        cpu_ns: o.cpu_ns,
        pids: o.pids,
        max_open_files: o.max_open_files,
        worktree_bytes: o.worktree_bytes,
    }
}

/// Reads the sandbox's output to its end: keeps up to `cap` bytes in the
/// run's log (echoed with control characters escaped), counts the rest, and
/// raises `over` once more than `ceiling` bytes were written.
async fn drain_output(
    mut output: nightshift_engine_docker::engine::OutputStream,
    mut log: tokio::fs::File,
    cap: u64,
    ceiling: u64,
    echo: bool,
    over: watch::Sender<bool>,
) -> (u64, u64) {
    let (mut seen, mut kept) = (0u64, 0u64);
    while let Some(Ok(chunk)) = output.next().await {
        let (bytes, is_err) = match &chunk {
            Output::Stdout(b) => (b, false),
            Output::Stderr(b) => (b, true),
        };
        seen += bytes.len() as u64;
        let take = (bytes.len() as u64).min(cap.saturating_sub(kept)) as usize;
        if take > 0 {
            let _ = log.write_all(&bytes[..take]).await;
            kept += take as u64;
            if echo {
                nightshift_core::terminal::echo(&bytes[..take], is_err);
            }
        }
        if seen > ceiling && !*over.borrow() {
            let _ = over.send(true);
        }
    }
    let _ = log.flush().await;
    (seen, kept)
}

/// The kill switch and the freeze, read again just before a step that would
/// let the agent run: a kill or a freeze that came during worktree creation,
/// or between creating the container and starting it, ends the run there
/// (the kill switch cannot stop a sandbox that does not exist yet; it leaves
/// a kill request, which is read here).
pub(crate) fn kill_or_freeze<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    run: &str,
) -> Result<Option<String>, RunError> {
    let store = sup.store.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(by) = store.kill_request(run)? {
        return Ok(Some(by));
    }
    let rules = nightshift_core::policy::load(&*store, None)
        .map_err(|e| RunError::Policy(e.to_string()))?;
    Ok(rules.freeze().map(|f| format!("the freeze ({})", f.reason)))
}

/// Why an import could not complete. The worktree is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportFailure {
    /// A stable word: `host_locked`, `host_repository`, `disk_full`, `io`,
    /// `git` (see [`orchestrator_git::import_failure_kind`]), or `state`.
    pub kind: &'static str,
    /// What was being done and why it failed, with its causes.
    pub message: String,
}

/// How a run's work came back, read from its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportState {
    /// Whole (or there was nothing to import).
    Whole,
    /// The working files came back, the agent's commits did not.
    HistoryDropped,
    /// Nothing came back yet: the worktree is kept for `nightshift import`.
    Failed,
}

/// How a run's work came back (see [`ImportState`]).
pub fn import_state(record: &RunRecord) -> ImportState {
    let observed = |key: &str| {
        record
            .observed
            .as_ref()
            .and_then(|o| o.get(key))
            .is_some_and(|v| !v.is_null())
    };
    if record.status.starts_with(IMPORT_FAILED) || observed("import_failed") {
        ImportState::Failed
    } else if observed("history_dropped") {
        ImportState::HistoryDropped
    } else {
        ImportState::Whole
    }
}

const IMPORT_FAILED: &str = "import failed";

use crate::door::chain;

/// Imports what a run wrote (its commits and its observed state) into the
/// host repository as `refs/nightshift/runs/<id>` by reading its worktree
/// by path (as data, see `orchestrator_git::import`), fills the record and
/// audits it. The recovery path: a run its own supervisor ends has its
/// result made by the end-of-run packer instead (`packer`); this
/// path serves reconciliation (its supervisor died), a run the kill switch
/// ended or that ended under a freeze (no sandbox starts then), and
/// `nightshift import`. On failure the `import_failed` entry is written and
/// nothing is removed.
pub(crate) async fn import_into<S: StateStore>(
    store: &Mutex<S>,
    record: &mut RunRecord,
    worktree: &std::path::Path,
) -> Result<(), ImportFailure> {
    let Some(base) = record.base_commit.clone() else {
        return Ok(());
    };
    if !worktree.exists() {
        return Ok(());
    }
    let (repo, run_id, wt) = (
        std::path::PathBuf::from(&record.repo),
        record.id.clone(),
        worktree.to_path_buf(),
    );
    // A preset's own bookkeeping stays out of the result.
    let leave_out = leave_out_of(&record.image);
    let import = move || {
        orchestrator_git::import_run(&orchestrator_git::ImportSpec {
            host_repo: &repo,
            worktree: &wt,
            run_id: &run_id,
            base_commit: &base,
            limits: orchestrator_git::ImportLimits::default(),
            committer: ("nightshift", "nightshift@localhost"),
            leave_out,
        })
    };
    let imported = async {
        tokio::task::spawn_blocking(import)
            .await
            .map_err(|e| ImportFailure {
                kind: "internal",
                message: format!("importing the worktree: {e}"),
            })?
            .map_err(|e| ImportFailure {
                kind: orchestrator_git::import_failure_kind(&e),
                message: format!("importing the worktree: {}", chain(&e)),
            })
    }
    .await;
    land_audited(
        store,
        record,
        worktree,
        imported.map(|i| landed_from_import(&i)),
    )
    .await
}

/// The globs a preset's agent image leaves in its worktree as its own
/// bookkeeping, kept out of the result.
pub(crate) fn leave_out_of(image: &str) -> &'static [&'static str] {
    crate::agents::of_image(image)
        .map(crate::agents::bookkeeping)
        .unwrap_or_default()
}

/// What the host's import by path brought back.
fn landed_from_import(imported: &orchestrator_git::Imported) -> Landed {
    Landed {
        agent_tip: imported.agent_tip.clone(),
        observed_commit: imported.observed_commit.clone(),
        result_commit: imported.result_commit.clone(),
        tree: imported.result_tree.clone(),
        files_changed: imported.files_changed,
        insertions: imported.insertions,
        deletions: imported.deletions,
        skipped: imported
            .skipped
            .iter()
            .map(|s| serde_json::json!({"path": s.path, "why": format!("{:?}", s.why)}))
            .collect(),
        dropped: imported.history_dropped.as_ref().map(|h| {
            let (size, limit) = h.figures();
            Dropped {
                kind: h.kind().to_string(),
                object: h.object().map(str::to_string),
                size,
                limit,
                why: h.to_string(),
            }
        }),
    }
}

/// Fills the record with what came back and audits it; on failure the
/// `import_failed` entry is written (best effort: the failure is also in
/// the run's status) and nothing is removed.
pub(crate) async fn land_audited<S: StateStore>(
    store: &Mutex<S>,
    record: &mut RunRecord,
    worktree: &std::path::Path,
    landed: Result<Landed, ImportFailure>,
) -> Result<(), ImportFailure> {
    let id = record.id.clone();
    let audit = |event: Event| {
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        store
            .append(Some(&id), &event, false)
            .map(|_| ())
            .map_err(|e| ImportFailure {
                kind: "state",
                message: format!("auditing the import: {e}"),
            })
    };
    let result = match landed {
        Ok(landed) => land(record, landed, &audit),
        Err(failure) => Err(failure),
    };
    if let Err(failure) = &result {
        let _ = audit(Event::ImportFailed {
            reason: failure.kind.to_string(),
            worktree: worktree.display().to_string(),
        });
    }
    result
}

fn land(
    record: &mut RunRecord,
    landed: Landed,
    audit: &dyn Fn(Event) -> Result<(), ImportFailure>,
) -> Result<(), ImportFailure> {
    let reference = format!("refs/nightshift/runs/{}", record.id);
    record.result_ref = Some(reference.clone());
    record.result_commit = Some(landed.result_commit.clone());
    record.files_changed = Some(landed.files_changed as i64);
    record.insertions = Some(landed.insertions as i64);
    record.deletions = Some(landed.deletions as i64);
    let dropped = landed.dropped.as_ref().map(|h| {
        serde_json::json!({
            "kind": h.kind,
            "object": h.object,
            "size": h.size,
            "limit": h.limit,
            "why": h.why,
        })
    });
    record.observed = Some(serde_json::json!({
        "agent_tip": landed.agent_tip,
        "observed_commit": landed.observed_commit,
        "tree": landed.tree,
        "skipped": landed.skipped,
        "history_dropped": dropped,
    }));
    if let Some(h) = &landed.dropped {
        audit(Event::HistoryDropped {
            reason: h.kind.clone(),
            object: h.object.clone(),
            size: h.size,
            limit: h.limit,
        })?;
    }
    audit(Event::ObservedState {
        agent_tip: landed.agent_tip.clone(),
        observed_commit: landed.observed_commit.clone(),
        tree: landed.tree.clone(),
        files_changed: landed.files_changed,
        insertions: landed.insertions,
        deletions: landed.deletions,
        skipped: landed.skipped,
    })?;
    audit(Event::Imported {
        reference,
        commit: landed.result_commit,
    })?;
    Ok(())
}

/// The status a run ends with once its import was tried: `ended` as it is;
/// `ended (history dropped: why)` when only the working files came back; or
/// `import failed: why` (the ending kept in the record for a retry), with the
/// reason saying where the work is kept.
pub(crate) fn status_after_import(
    record: &mut RunRecord,
    ended: String,
    failure: Option<&ImportFailure>,
    worktree: &std::path::Path,
) -> (String, Option<String>) {
    if let Some(f) = failure {
        record.observed = Some(serde_json::json!({
            "import_failed": {
                "kind": f.kind,
                "error": f.message,
                "ended": ended,
                "worktree": worktree.display().to_string(),
            }
        }));
        let reason = format!(
            "the run ended ({ended}); its work is kept in {}; `nightshift import {}` retries the import",
            worktree.display(),
            record.id
        );
        return (format!("{IMPORT_FAILED}: {}", f.message), Some(reason));
    }
    let why = record
        .observed
        .as_ref()
        .and_then(|o| o.get("history_dropped"))
        .and_then(|h| h.get("why"))
        .and_then(|w| w.as_str())
        .map(str::to_string);
    match why {
        Some(why) => (format!("{ended} (history dropped: {why})"), None),
        None => (ended, None),
    }
}

/// Why `nightshift import RUN` did not import.
#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    #[error("importing run {run}: nothing to retry, its import did not fail (status {status:?})")]
    NothingToRetry { run: String, status: String },
    #[error("importing run {run}: its worktree {path} is gone")]
    WorktreeGone { run: String, path: PathBuf },
    #[error("importing run {run}: {}", failure.message)]
    Failed { run: String, failure: ImportFailure },
    #[error("importing run {run}: locking {path}: {message}")]
    Lock {
        run: String,
        path: PathBuf,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The status another worker gives a run whose worker stopped renewing its
/// claim (`run_queue::settle_elsewhere`); the worker may still hold the
/// run's worktree and import it when it reaches the store again.
pub const LOST_BY_WORKER: &str = "lost: its worker stopped renewing its claim";

/// `nightshift import RUN`: retries the import of a run whose import failed,
/// or imports the worktree a cut-off worker kept of a run another worker
/// settled as lost ([`LOST_BY_WORKER`]; the worker's dispatcher does this
/// itself once it reaches the store again). On success the result is
/// recorded and audited, the worktree removed, and the run's status becomes
/// its ending (with "history dropped" when so; a lost run keeps its status,
/// the decision its settler made, and its reason says the work arrived
/// later); on failure the worktree stays and the status names the new
/// failure. Runs one at a time per state (`STATE/import.lock`).
pub async fn retry_import(
    store: &Mutex<Box<dyn StateStore>>,
    run: &str,
) -> Result<RunRecord, RetryError> {
    let paths = {
        let store = store.lock().unwrap_or_else(|p| p.into_inner());
        nightshift_core::state_store::StatePaths::new(store.root().to_path_buf())
    };
    let lock_path = paths.root.join("import.lock");
    let lock_err = |message: String| RetryError::Lock {
        run: run.to_string(),
        path: lock_path.clone(),
        message,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| lock_err(e.to_string()))?;
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| lock_err(e.to_string()))?;

    let mut record = {
        let store = store.lock().unwrap_or_else(|p| p.into_inner());
        store.run(run)?
    };
    let lost = record.status.starts_with(LOST_BY_WORKER) && record.result_ref.is_none();
    if import_state(&record) != ImportState::Failed && !lost {
        return Err(RetryError::NothingToRetry {
            run: run.to_string(),
            status: record.status,
        });
    }
    let worktree = paths.worktrees().join(run);
    if !worktree.is_dir() {
        return Err(RetryError::WorktreeGone {
            run: run.to_string(),
            path: worktree,
        });
    }
    let ended = match lost {
        true => record.status.clone(),
        false => record
            .observed
            .as_ref()
            .and_then(|o| o["import_failed"]["ended"].as_str())
            .unwrap_or("ended")
            .to_string(),
    };
    let put = |record: &RunRecord, event: Event| -> Result<(), StoreError> {
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        store.put_run(record)?;
        store.append(Some(run), &event, true)?;
        Ok(())
    };
    record.observed = None;
    // Mounted again (read-only) if a reboot took its mount.
    let kept = worktree.clone();
    if let Ok(Err(e)) =
        tokio::task::spawn_blocking(move || nightshift_core::hostview::mount_kept(&kept)).await
    {
        tracing::warn!(run = %run, error = %e, "mounting the kept worktree");
    }
    if let Err(failure) = import_into(store, &mut record, &worktree).await {
        let (status, reason) = status_after_import(&mut record, ended, Some(&failure), &worktree);
        record.status = status;
        record.reason = reason;
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        store.put_run(&record)?;
        return Err(RetryError::Failed {
            run: run.to_string(),
            failure,
        });
    }
    let wt = worktree.clone();
    let removed =
        tokio::task::spawn_blocking(move || nightshift_core::hostview::remove_worktree(&wt)).await;
    let mut reason = match (lost, &record.reason) {
        (true, Some(why)) => format!(
            "{why}; its work, kept by its worker, was imported when the worker reached the store again"
        ),
        _ => "imported by nightshift import".to_string(),
    };
    match removed {
        Ok(Ok(())) => {
            let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
            store.append(
                Some(run),
                &Event::WorktreeRemoved {
                    path: worktree.display().to_string(),
                },
                false,
            )?;
        }
        Ok(Err(e)) => reason.push_str(&format!("; cleanup: {e}")),
        Err(e) => reason.push_str(&format!("; cleanup: {e}")),
    }
    let (status, _) = status_after_import(&mut record, ended, None, &worktree);
    record.status = status.clone();
    record.reason = Some(reason.clone());
    if lost {
        // Its ending was audited once, by its settler; the import itself
        // is audited (`imported`), and the record now carries the result.
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        store.put_run(&record)?;
        return Ok(record);
    }
    put(
        &record,
        Event::RunEnded {
            status,
            reason: Some(reason),
        },
    )?;
    Ok(record)
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The common ending: remove the container, import what the run wrote,
/// remove the worktree, settle the record, audit how it ended.
async fn finish<E: ContainerEngine, S: StateStore>(
    sup: &Supervisor<E, S>,
    record: &mut RunRecord,
    held: &mut Held,
    outcome: Result<Ended, RunError>,
) -> Result<RunRecord, RunError> {
    let id = record.id.clone();
    let mut cleanup_errors: Vec<String> = Vec::new();
    if let Some(lease) = held.lease.take() {
        lease.stop();
    }
    if let Some(gateway) = held.gateway.take() {
        // Every model call is audited before the run's end is; calls whose
        // entries still could not be written (a full state disk) are named
        // in the run's reason, never lost silently.
        let unaudited = gateway.close().await;
        if unaudited > 0 {
            cleanup_errors.push(format!(
                "{unaudited} model call(s) could not be audited (the audit log could not be written)"
            ));
        }
    }
    if let Some(door) = held.door.take() {
        door.close();
    }
    if let Some(channels) = held.channels.take() {
        channels.close();
    }
    // Also a door whose opening failed half-way.
    crate::door::remove_dir(&sup.paths(), &id);

    // Every container of this run, including one whose creation we did not see finish.
    let mut containers: Vec<String> = held.container.iter().cloned().collect();
    let listed = sup.engine.managed(Some(&id)).await;
    if let Ok(found) = &listed {
        for c in found {
            if !containers.contains(&c.id) {
                containers.push(c.id.clone());
            }
        }
    }
    // Gone only when the engine says so: an engine that cannot be reached
    // is not a sandbox that stopped.
    let mut unconfirmed: Option<String> = None;
    if let Err(e) = &listed {
        // A container whose creation we did not see finish may exist.
        if held.creating && held.container.is_none() {
            unconfirmed = Some(e.to_string());
        }
    }
    for c in &containers {
        match sup.engine.remove_confirmed(c).await {
            Ok(()) => sup.audit(
                &id,
                Event::ContainerRemoved {
                    container: c.clone(),
                },
                false,
            )?,
            Err(e) => unconfirmed = Some(e.to_string()),
        }
    }
    // What the run's figures needed (a Podman run's own cgroup), once its
    // container is gone.
    if let (None, Some(fleet)) = (&unconfirmed, &sup.fleet) {
        sup.engine.release_stats(&fleet.scope(), &id).await;
    }
    if let Some(why) = unconfirmed {
        // The sandbox may still be writing: its worktree is neither read nor
        // removed. The run stays unsettled, saying why, for reconciliation
        // (which removes the container first, then imports); the lease is
        // no longer renewed, so the sandbox ends by itself within its bound.
        record.reason = Some(format!(
            "{UNCONFIRMED} ({why}); its worktree is kept until it is"
        ));
        sup.save(record)?;
        tracing::warn!(run = %id, error = %why, "the sandbox could not be confirmed gone; `nightshift reconcile` settles the run once the engine answers");
        return Err(match outcome {
            Err(e) => e,
            Ok(_) => RunError::Engine(EngineError::Unreachable {
                endpoint: "the container engine".into(),
                message: format!("{UNCONFIRMED}: {why}"),
            }),
        });
    }

    // Import whatever the run wrote, once the agent had started. A failed
    // import keeps the worktree: it is the only copy of the run's work.
    // Made by the end-of-run packer, unless no new sandbox may start (a
    // kill switch, a freeze): then read by path, as reconciliation does.
    let mut import_failure = None;
    if let (Some(wt), true) = (held.worktree.clone(), held.started) {
        // A kill or freeze that cannot be read counts as one.
        let killed = matches!(outcome, Ok(Ended::KilledBy(_)))
            || !matches!(kill_or_freeze(sup, &id), Ok(None));
        let imported = match (sup.results, killed) {
            (ResultsBy::Packer, false) => packer::import(sup, record, held, &wt).await,
            _ => import_into(&sup.store, record, &wt).await,
        };
        if let Err(e) = imported {
            import_failure = Some((e, held.worktree.take().unwrap_or(wt)));
        }
    }
    // Lockfiles the agent changed: the cache stays as it was for the night;
    // the report and the morning say so (docs/setup.md).
    if let (Some(setup), Some(result), Some(base)) = (
        held.setup.as_ref(),
        record.result_commit.clone(),
        held.base_commit.clone(),
    ) {
        let (repo, patterns) = (PathBuf::from(&record.repo), setup.lockfiles.clone());
        let changed = tokio::task::spawn_blocking(move || {
            orchestrator_git::changed_lockfiles(&repo, &base, &result, &|p| {
                nightshift_core::setup::is_lockfile(&patterns, p)
            })
        })
        .await;
        match changed {
            Ok(Ok(paths)) if !paths.is_empty() => {
                sup.audit(&id, Event::DependenciesChanged { paths }, false)?
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => cleanup_errors.push(format!("comparing the lockfiles: {e}")),
            Err(e) => cleanup_errors.push(format!("comparing the lockfiles: {e}")),
        }
    }
    // The work is safe (imported, or the agent never ran): say so durably
    // before the worktree's removal begins, so that a supervisor killed
    // half-way through it leaves a worktree reconciliation only removes.
    if held.worktree.is_some() {
        let marked = {
            let mut store = sup.store.lock().unwrap_or_else(|p| p.into_inner());
            store.record_imported(record)
        };
        if let Err(e) = marked {
            // Not marked: the worktree stays whole for the next reconciliation.
            cleanup_errors.push(format!("keeping the worktree: {e}"));
            held.worktree = None;
        }
    }
    if let Some(wt) = held.worktree.take() {
        if wt.exists() {
            let (path, host) = (wt.clone(), sup.host.clone());
            match tokio::task::spawn_blocking(move || host.remove_worktree(&path)).await {
                Ok(Ok(())) => sup.audit(
                    &id,
                    Event::WorktreeRemoved {
                        path: wt.display().to_string(),
                    },
                    false,
                )?,
                Ok(Err(e)) => cleanup_errors.push(e),
                Err(e) => cleanup_errors.push(e.to_string()),
            }
        }
    }

    let (status, reason, result) = match outcome {
        Ok(Ended::Exited) => {
            let code = record.exit_code.unwrap_or(-1);
            (format!("exited {code}"), None, Ok(()))
        }
        Ok(Ended::Breach(b)) => (format!("killed: {}", b.detail), None, Ok(())),
        Ok(Ended::KilledBy(who)) => (format!("killed: by {who}"), None, Ok(())),
        Ok(Ended::SetupFailed(why)) => ("setup failed".to_string(), Some(why), Ok(())),
        Ok(Ended::LeaseLapsed { silence, bound }) => (
            "killed: lease lapsed".to_string(),
            Some(format!(
                "its supervisor renewed no heartbeat for {}s (lease {}s), so the sandbox ended itself",
                silence.as_secs(),
                bound.as_secs()
            )),
            Ok(()),
        ),
        Ok(Ended::Stopped(s)) => (
            format!("interrupted: {}", s.name()),
            Some(s.reason()),
            Err(RunError::Interrupted {
                run: id.clone(),
                signal: s,
            }),
        ),
        Err(RunError::Refused { run, failures }) => (
            "refused: attestation".to_string(),
            Some(failures.clone()),
            Err(RunError::Refused { run, failures }),
        ),
        Err(e) => ("error".to_string(), Some(e.to_string()), Err(e)),
    };
    let (status, import_reason) = match &import_failure {
        Some((failure, wt)) => status_after_import(record, status, Some(failure), wt),
        None => status_after_import(record, status, None, std::path::Path::new("")),
    };
    let reason = match (reason, import_reason) {
        (Some(r), Some(i)) => Some(format!("{r}; {i}")),
        (r, i) => r.or(i),
    };
    let reason = match (reason, cleanup_errors.is_empty()) {
        (r, true) => r,
        (r, false) => Some(format!(
            "{}cleanup: {}",
            r.map(|r| format!("{r}; ")).unwrap_or_default(),
            cleanup_errors.join("; ")
        )),
    };
    record.status = status.clone();
    record.reason = reason.clone();
    record.ended_at = Some(now_rfc3339());
    let ended = {
        let mut store = sup.store.lock().unwrap_or_else(|p| p.into_inner());
        store.end_run(record, &Event::RunEnded { status, reason })?
    };
    if ended.is_none() {
        // Settled meanwhile by someone who took this supervisor for gone.
        let store = sup.store.lock().unwrap_or_else(|p| p.into_inner());
        *record = store.run(&id)?;
    }
    tracing::info!(status = %record.status, exit_code = ?record.exit_code, reason = ?record.reason, "run ended");
    result.map(|()| record.clone())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn record() -> RunRecord {
        RunRecord {
            id: "r1".into(),
            status: "running".into(),
            ..Default::default()
        }
    }

    #[test]
    fn another_hosts_process_is_never_judged_by_a_local_pid() {
        let me = process_identity(std::process::id()).unwrap();
        assert!(me.ends_with(&format!("@{}", host_id())), "{me}");
        assert!(identity_alive(&me));
        assert!(!identity_elsewhere(&me));
        // This very pid and start time, on another host: alive there as
        // far as this host knows, whatever its process table says.
        let local = me.split_once('@').unwrap().0;
        let there = format!("{local}@another-host");
        assert!(identity_elsewhere(&there));
        assert!(identity_alive(&there));
        assert!(identity_alive("999999999:1@another-host"));
        // Here, a pid that is not running is dead; an identity made before
        // hosts were named is this host's.
        assert!(!identity_alive(&format!("999999999:1@{}", host_id())));
        assert!(identity_alive(local));
        assert!(!identity_alive("999999999:1"));
    }

    #[test]
    fn a_whole_import_keeps_the_ending() {
        let mut r = record();
        r.observed = Some(serde_json::json!({"tree": "t", "history_dropped": null}));
        let (status, reason) = status_after_import(&mut r, "exited 0".into(), None, Path::new(""));
        assert_eq!((status.as_str(), reason), ("exited 0", None));
        r.status = status;
        assert_eq!(import_state(&r), ImportState::Whole);
    }

    #[test]
    fn a_dropped_history_is_in_the_status_and_the_state() {
        let mut r = record();
        r.observed = Some(serde_json::json!({
            "history_dropped": {"kind": "bad_tip", "why": "the agent's branch names no commit"}
        }));
        let (status, _) =
            status_after_import(&mut r, "killed: timeout 2s".into(), None, Path::new(""));
        assert_eq!(
            status,
            "killed: timeout 2s (history dropped: the agent's branch names no commit)"
        );
        r.status = status;
        assert_eq!(import_state(&r), ImportState::HistoryDropped);
    }

    #[test]
    fn a_failed_import_names_the_failure_and_keeps_the_ending_for_a_retry() {
        let mut r = record();
        let failure = ImportFailure {
            kind: "host_locked",
            message: "importing the worktree: updating refs/nightshift/runs/r1".into(),
        };
        let wt = Path::new("/state/worktrees/r1");
        let (status, reason) = status_after_import(&mut r, "exited 3".into(), Some(&failure), wt);
        assert_eq!(
            status,
            "import failed: importing the worktree: updating refs/nightshift/runs/r1"
        );
        let reason = reason.unwrap();
        assert!(reason.contains("/state/worktrees/r1"), "{reason}");
        assert!(reason.contains("`nightshift import r1`"), "{reason}");
        let kept = &r.observed.as_ref().unwrap()["import_failed"];
        assert_eq!(kept["ended"], "exited 3");
        assert_eq!(kept["kind"], "host_locked");
        r.status = status;
        assert_eq!(import_state(&r), ImportState::Failed);
    }
}

/// The lifecycle on the fakes: a [`FakeEngine`] that reports a scripted
/// inspect document, a [`MemStore`] and a [`FakeHost`] that records the
/// worktree's mounts, with a real host repository, worktree and door. No
/// root needed: as another user, the sandbox is that user (the fake host
/// has no accounts it could clash with).
///
/// [`FakeEngine`]: nightshift_core::container_engine::fake::FakeEngine
/// [`MemStore`]: nightshift_core::state_store::fake::MemStore
/// [`FakeHost`]: nightshift_core::hostview::fake::FakeHost
#[cfg(test)]
mod lifecycle_tests {
    use std::process::Command;

    use super::*;
    use nightshift_core::container_engine::fake::FakeEngine;
    use nightshift_core::hostview::fake::FakeHost;
    use nightshift_core::state_store::fake::MemStore;

    /// An inspect document recorded from a real engine for a container made
    /// with every hardening flag and a door (see the attestation's fixtures).
    const RECORDED: &str = include_str!("../../attest/tests/fixtures/with-door.json");

    /// What a real engine reports for a container made from `spec` as
    /// `engine.rs` makes it: the recorded document with the spec's run,
    /// paths, environment, labels and user.
    fn hardened(spec: &SandboxSpec) -> serde_json::Value {
        let mut doc: serde_json::Value = serde_json::from_str(RECORDED).unwrap();
        let worktree = spec.worktree_host.display().to_string();
        let door = spec
            .door
            .as_ref()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        doc["Config"]["Env"] = serde_json::json!(spec.env_list());
        doc["Config"]["Labels"] = serde_json::json!(spec.labels);
        doc["Config"]["User"] = spec.user().into();
        doc["Config"]["Image"] = spec.image.clone().into();
        // As `engine.rs` asks: the lease wrapper is PID 1, without the init.
        doc["Path"] = spec.command[0].clone().into();
        doc["HostConfig"]["Init"] = (!spec.lease_is_pid1()).into();
        for path in ["/Mounts", "/HostConfig/Mounts"] {
            for m in doc.pointer_mut(path).unwrap().as_array_mut().unwrap() {
                let source = match m["Source"].as_str() {
                    Some(s) if s.contains("/worktrees/") => worktree.clone(),
                    _ => door.clone(),
                };
                m["Source"] = source.into();
            }
        }
        doc
    }

    fn networked(spec: &SandboxSpec) -> serde_json::Value {
        let mut doc = hardened(spec);
        doc["HostConfig"]["NetworkMode"] = "bridge".into();
        doc["Config"]
            .as_object_mut()
            .unwrap()
            .remove("NetworkDisabled");
        doc
    }

    fn privileged(spec: &SandboxSpec) -> serde_json::Value {
        let mut doc = hardened(spec);
        doc["HostConfig"]["Privileged"] = true.into();
        doc
    }

    fn capable(spec: &SandboxSpec) -> serde_json::Value {
        let mut doc = hardened(spec);
        doc["HostConfig"]["CapAdd"] = serde_json::json!(["NET_ADMIN"]);
        doc
    }

    fn host_socket(spec: &SandboxSpec) -> serde_json::Value {
        let mut doc = hardened(spec);
        doc["HostConfig"]["Binds"] =
            serde_json::json!(["/var/run/docker.sock:/var/run/docker.sock"]);
        doc["Mounts"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "Type": "bind",
                "Source": "/var/run/docker.sock",
                "Destination": "/var/run/docker.sock",
                "Mode": "",
                "RW": true,
                "Propagation": "rprivate"
            }));
        doc
    }

    struct Night {
        _dir: tempfile::TempDir,
        repo: PathBuf,
        sup: Supervisor<FakeEngine, MemStore>,
        host: Arc<FakeHost>,
    }

    fn git(repo: &std::path::Path, args: &[&str]) {
        let out = Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", repo)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }

    /// A host repository with one commit, a state, and a supervisor on the
    /// fakes whose engine reports `report` for the container it creates.
    fn night(report: fn(&SandboxSpec) -> serde_json::Value) -> Night {
        night_on(report, FakeHost::default())
    }

    /// Who the sandbox runs as: the default, or this user where only root
    /// may give the worktree to another.
    fn sandbox_user() -> SandboxUser {
        if nix::unistd::Uid::effective().is_root() {
            SandboxUser::default()
        } else {
            SandboxUser {
                uid: nix::unistd::Uid::effective().as_raw(),
                gid: nix::unistd::Gid::effective().as_raw(),
            }
        }
    }

    /// [`night`] on a host of the test's making.
    fn night_on(report: fn(&SandboxSpec) -> serde_json::Value, host: FakeHost) -> Night {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("README"), "hello\n").unwrap();
        git(&repo, &["add", "README"]);
        git(
            &repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "-m",
                "base",
            ],
        );
        let root = dir.path().join("state");
        nightshift_core::state_store::create_private_dir(&root).unwrap();
        let host = Arc::new(host);
        let sup = Supervisor {
            engine: FakeEngine::reporting(report),
            // The door and the gateway keep their state in the state
            // directory's own store, as before the fake.
            stores: Arc::new(nightshift_store_sqlite::store::SqliteBackend::new(
                root.clone(),
                None,
            )),
            store: Arc::new(Mutex::new(MemStore::new(&root))),
            state_tag: "unit".into(),
            identity: process_identity(std::process::id()).unwrap(),
            fleet: None,
            sandbox_user: sandbox_user(),
            host: host.clone(),
            pool: None,
            results: ResultsBy::HostPath,
        };
        Night {
            _dir: dir,
            repo,
            sup,
            host,
        }
    }

    /// The worktree's filesystem was made and protected before the
    /// container was created, and `ending` ("remove", or none) is all that
    /// happened to it after.
    fn host_saw(night: &Night, run: &str, ending: &[&str]) {
        let worktree = night.sup.paths().worktrees().join(run);
        let mut expected = vec![
            format!("mkfs {}", worktree.display()),
            format!("protect {}", worktree.display()),
        ];
        expected.extend(ending.iter().map(|e| format!("{e} {}", worktree.display())));
        assert_eq!(night.host.calls(), expected);
    }

    fn request(repo: &std::path::Path) -> RunRequest {
        RunRequest {
            repo: repo.to_path_buf(),
            base_ref: "main".into(),
            image: "nightshift-unit:1".into(),
            task: "do nothing".into(),
            command: vec!["true".into()],
            caps: Caps::default(),
            echo: false,
            repo_confidentiality: policies::Confidentiality::Private,
            dry_run: false,
            setup: None,
            continues: None,
        }
    }

    async fn run(night: &Night) -> (Result<RunRecord, RunError>, MemStore) {
        let (_tx, stop) = watch::channel(None);
        let result = execute(&night.sup, request(&night.repo), stop).await;
        let root = night.sup.paths().root;
        let store = std::mem::replace(&mut *night.sup.store.lock().unwrap(), MemStore::new(&root));
        (result, store)
    }

    /// Refused by the attestation, naming exactly `properties`: never started, the
    /// attestation audited as failed, the run ended refused, the container
    /// and the worktree removed.
    async fn refused(report: fn(&SandboxSpec) -> serde_json::Value, properties: &[&str]) {
        let night = night(report);
        let (result, store) = run(&night).await;
        let engine = &night.sup.engine;
        assert!(
            matches!(&result, Err(RunError::Refused { failures, .. }) if failures.contains(properties[0])),
            "{result:?}"
        );
        assert!(!engine.called("start"), "started: {:?}", engine.calls());
        let attestation: Vec<_> = store
            .audit
            .iter()
            .filter(|e| e.kind == "attestation")
            .collect();
        assert_eq!(attestation.len(), 1, "{:?}", store.kinds());
        assert_eq!(attestation[0].body["passed"], false);
        let failed: Vec<&str> = attestation[0].body["properties"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["ok"] == false)
            .filter_map(|p| p["name"].as_str())
            .collect();
        assert_eq!(failed, properties, "only the tampered properties fail");
        let record = &store.runs[0];
        assert_eq!(record.status, "refused: attestation");
        assert!(engine.ids().is_empty(), "{:?}", engine.calls());
        assert!(engine.calls().contains(&"remove fake-1".to_string()));
        let kinds = store.kinds();
        assert_eq!(kinds.last(), Some(&"run_ended"), "{kinds:?}");
        assert!(kinds.contains(&"container_removed"), "{kinds:?}");
        assert!(!kinds.contains(&"started"), "{kinds:?}");
        orchestrator_audit::verify(&store.log, &store.audit, &[]).unwrap();
        let worktree = night.sup.paths().worktrees().join(&record.id);
        assert!(
            !worktree.exists(),
            "worktree left at {}",
            worktree.display()
        );
        host_saw(&night, &record.id, &["remove"]);
        assert!(night.host.mounted().is_empty(), "a mount left");
    }

    /// The run's sandbox as `hardened`; the end-of-run packer's with a network.
    fn packer_networked(spec: &SandboxSpec) -> serde_json::Value {
        if spec
            .command
            .iter()
            .any(|a| a.ends_with(crate::door::PACKER))
        {
            networked(spec)
        } else {
            hardened(spec)
        }
    }

    #[tokio::test]
    async fn a_packer_that_fails_its_attestation_is_never_started() {
        let mut night = night(packer_networked);
        night.sup.results = ResultsBy::Packer;
        let (result, store) = run(&night).await;
        let record = match result {
            Ok(record) => record,
            Err(e) => panic!("{e}"),
        };
        assert!(
            record.status.starts_with("import failed") && record.status.contains("attestation"),
            "{}",
            record.status
        );
        let created = night.sup.engine.created.lock().unwrap().clone();
        assert_eq!(created.len(), 2, "the run's sandbox and the packer's");
        assert!(created[1]
            .1
            .command
            .iter()
            .any(|a| a.ends_with(crate::door::PACKER)));
        let calls = night.sup.engine.calls();
        assert!(
            calls.contains(&format!("start {}", created[0].0)),
            "{calls:?}"
        );
        assert!(
            !calls.contains(&format!("start {}", created[1].0)),
            "{calls:?}"
        );
        assert!(
            night.sup.engine.ids().is_empty(),
            "the packer's sandbox was left"
        );
        assert!(store.kinds().contains(&"import_failed"));
        // The work is kept for `nightshift import`.
        host_saw(&night, &record.id, &[]);
    }

    #[tokio::test]
    async fn a_container_that_passes_is_started_and_ends() {
        let night = night(hardened);
        let (result, store) = run(&night).await;
        let record = result.unwrap();
        assert_eq!(record.status, "exited 0");
        assert!(night.sup.engine.called("start"));
        let kinds = store.kinds();
        assert!(kinds.contains(&"started"), "{kinds:?}");
        assert!(night.sup.engine.ids().is_empty());
        host_saw(&night, &record.id, &["remove"]);
        assert!(night.host.mounted().is_empty(), "a mount left");
    }

    #[tokio::test]
    async fn a_worktree_mounted_without_nosuid_nodev_is_refused_before_the_start() {
        let host = FakeHost {
            ignores_nosuid: true,
            ..FakeHost::default()
        };
        let night = night_on(hardened, host);
        let (result, store) = run(&night).await;
        assert!(
            matches!(&result, Err(RunError::Refused { failures, .. }) if failures.contains("workspace-nosuid-nodev")),
            "{result:?}"
        );
        assert!(!night.sup.engine.called("start"));
        assert_eq!(store.runs[0].status, "refused: attestation");
        host_saw(&night, &store.runs[0].id, &["remove"]);
        assert!(night.host.mounted().is_empty(), "a mount left");
    }

    /// The sandbox's ids are checked against the host's accounts before
    /// anything is made.
    #[tokio::test]
    async fn a_sandbox_user_that_is_a_host_account_is_refused_before_anything_is_made() {
        let user = sandbox_user();
        let host = FakeHost {
            accounts: orchestrator_attest::HostAccounts::parse(
                &format!(
                    "someone:x:{}:{}::/home/someone:/bin/sh\n",
                    user.uid, user.gid
                ),
                "",
                "",
                "",
            ),
            ..FakeHost::default()
        };
        let night = night_on(hardened, host);
        let (result, store) = run(&night).await;
        assert!(
            matches!(&result, Err(RunError::BadInput(words)) if words.contains("someone")),
            "{result:?}"
        );
        assert!(store.runs.is_empty());
        assert!(night.host.calls().is_empty());
        assert!(night.sup.engine.calls().is_empty());
    }

    #[tokio::test]
    async fn a_removal_in_progress_at_the_ending_is_waited_for_then_the_work_imported() {
        let night = night(hardened);
        night
            .sup
            .engine
            .removal_in_progress
            .lock()
            .unwrap()
            .insert("fake-1".into(), 1);
        let (result, store) = run(&night).await;
        let record = result.unwrap();
        assert_eq!(record.status, "exited 0");
        assert_eq!(record.reason, None, "a cleanup error: {:?}", record.reason);
        let kinds = store.kinds();
        let removed = kinds.iter().position(|k| *k == "container_removed");
        let imported = kinds.iter().position(|k| *k == "imported");
        assert!(
            removed.is_some() && removed < imported,
            "removal confirmed before the import: {kinds:?}"
        );
        assert!(night.sup.engine.ids().is_empty());
        assert_eq!(
            night
                .sup
                .engine
                .calls()
                .iter()
                .filter(|c| *c == "remove fake-1")
                .count(),
            2
        );
    }

    #[tokio::test]
    async fn an_engine_lost_mid_run_keeps_the_worktree_and_leaves_the_run_for_reconciliation() {
        let mut night = night(hardened);
        night.sup.engine.lose_after_start = true;
        let (_tx, stop) = watch::channel(None);
        let mut req = request(&night.repo);
        req.caps.timeout = Duration::from_secs(2);
        let result = execute(&night.sup, req, stop).await;
        assert!(result.is_err(), "{result:?}");
        let worktrees = night.sup.paths().worktrees();
        let store = night.sup.store.lock().unwrap();
        let record = &store.runs[0];
        // Not ended, not imported: the sandbox may still be writing.
        assert_eq!(record.status, "running");
        assert!(
            record
                .reason
                .as_deref()
                .unwrap_or("")
                .starts_with(UNCONFIRMED),
            "{:?}",
            record.reason
        );
        let kinds = store.kinds();
        for kind in [
            "imported",
            "observed_state",
            "worktree_removed",
            "run_ended",
        ] {
            assert!(!kinds.contains(&kind), "{kind}: {kinds:?}");
        }
        let worktree = worktrees.join(&record.id);
        assert!(worktree.join("README").exists(), "the worktree is kept");
        // Kept mounted, for reconciliation to import from.
        let run = record.id.clone();
        drop(store);
        host_saw(&night, &run, &[]);
        assert_eq!(night.host.mounted(), [worktree]);
    }

    #[tokio::test]
    async fn a_network_is_refused_before_the_start() {
        refused(networked, &["network-none"]).await;
    }

    #[tokio::test]
    async fn privileges_are_refused_before_the_start() {
        // The attestation reads a privileged container as unmasked and
        // unconfined too (the engine drops both for it).
        refused(
            privileged,
            &["not-privileged", "proc-masked", "seccomp-profile"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_capability_is_refused_before_the_start() {
        refused(capable, &["capabilities-dropped"]).await;
    }

    #[tokio::test]
    async fn a_writable_host_mount_is_refused_before_the_start() {
        refused(host_socket, &["mounts-only-worktree"]).await;
    }

    #[tokio::test]
    async fn an_unreadable_inspect_is_refused_before_the_start() {
        let night = night(|_| serde_json::Value::Null);
        let (result, store) = run(&night).await;
        assert!(
            matches!(&result, Err(RunError::Refused { failures, .. }) if failures.contains("unreadable")),
            "{result:?}"
        );
        assert!(!night.sup.engine.called("start"));
        assert_eq!(store.runs[0].status, "refused: attestation");
        assert!(night.sup.engine.ids().is_empty());
        // Audited as an attestation that failed every property.
        let attestation: Vec<_> = store
            .audit
            .iter()
            .filter(|e| e.kind == "attestation")
            .collect();
        assert_eq!(attestation.len(), 1, "{:?}", store.kinds());
        assert_eq!(attestation[0].body["passed"], false);
        let properties = attestation[0].body["properties"].as_array().unwrap();
        assert_eq!(properties.len(), orchestrator_attest::PROPERTY_NAMES.len());
        assert!(properties.iter().all(|p| p["ok"] == false));
    }
}
