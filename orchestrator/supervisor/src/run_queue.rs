//! The run queue: tasks enqueued for the supervisor to run later, in order,
//! at most `max_parallel` at once, honouring the freeze and the fleet caps.
//!
//! A task becomes a run in one of two ways ([`Runner`]):
//! - In process (`nightshift serve`): a tokio task calls the same run
//!   lifecycle as `nightshift run` ([`crate::run::execute_as`]) with the
//!   process's one supervisor (its store, engine, fleet cgroup and identity,
//!   which every sandbox carries), so serve's one watchdog covers every
//!   sandbox it runs. The run's record (or its error) goes to the task's
//!   files under `STATE/tasks/<id>`. The run's id is chosen, and written in
//!   the task, before the run begins.
//! - As a child process (`nightshift tasks run`, the foreground
//!   dispatcher): `nightshift run` in its own process group, its output to
//!   the task's files; every run keeps the per-run supervisor, watchdog,
//!   lease and signal handling of a foreground `nightshift run`, and a crash
//!   of the dispatcher takes no run with it.
//!
//! Invariants:
//! - A task moves `queued -> starting -> running -> done | failed`, or
//!   `queued -> cancelled`; every move is one compare-and-set in the store
//!   (`Store::move_task`), so a cancel and a start never both win, and no
//!   move happens twice (`tests::a_queued_task_is_cancelled_once_and_a_started_one_never`,
//!   `orchestrator/store-postgres/tests/contract.rs::tasks_move_by_compare_and_set`).
//! - Several dispatchers may share one store (several `serve` workers,
//!   `tasks run` beside them, on one machine or several): a dispatcher
//!   starts tasks under a lease in the store ([`TaskQueue::start_tasks`]:
//!   the admission below decided over every task, inside the transaction
//!   that moves them, so two dispatchers never start past one budget; the
//!   contract suite's `dispatchers_starting_at_once_share_one_budget`),
//!   renews its leases every third of their length, and takes over only
//!   the tasks whose lease lapsed ([`TaskQueue::claim_lapsed_tasks`]: their
//!   dispatcher died or stalled past it), never a live dispatcher's. There
//!   is no lock file. `faults.rs::two_dispatchers_killed_at_random_run_every_task_once`
//!   kills two dispatchers at random and finds every task run once.
//!   A dispatcher that runs tasks in process returns only once each of its
//!   runs has ended (asked to stop, they end as `interrupted`), so its
//!   leases outlive them; an error in its loop (the store busy) is logged
//!   and tried again rather than leaving its runs unwatched.
//! - Fencing: every move of a task a dispatcher holds carries the claim it
//!   got (holder and generation, [`TaskFence`]), and the store refuses the
//!   move once that claim was taken over, even if the same dispatcher took
//!   the task back since
//!   (`orchestrator/store-postgres/tests/contract.rs::a_lost_claim_moves_nothing_even_after_it_is_taken_back`).
//!   A dispatcher that could not renew for half a lease (cut off from the
//!   store) stops its runs in process before its claims lapse; a task whose
//!   run lived on another host (its supervisor's identity names another
//!   host, `run::identity_elsewhere`) is settled, in the store only, once
//!   that run's sandbox has surely ended by its own lease, and queued again
//!   only if its spec's `retries` allows
//!   (`tests/tests/workers.rs::a_worker_cut_off_from_the_store_is_fenced_and_another_settles_its_tasks_once`).
//! - A run in process that panics or fails ends its task `failed` (a
//!   panic) or settled from its run's record, with the reason, and nothing
//!   else: the panic is caught at its tokio task's `JoinHandle`, the run is
//!   then settled as an orphan (sandbox removed, work imported, worktree
//!   removed, record ended), and the other runs and the dispatcher go on.
//! - `kill -9` of the dispatcher loses nothing: queued tasks stay queued.
//!   In process, its runs die with it: their sandboxes carry its identity,
//!   so its watchdog, or the next supervisor's reconciliation, stops them
//!   and imports their worktrees; once its leases lapse, the dispatcher
//!   that takes its tasks over (an in-process one reconciles first) settles
//!   each task caught `starting` or `running` from its run (waiting for the run's settlement), and sends
//!   one whose run never got a record back to the queue (nothing ran). A
//!   child-process task caught `starting` goes back to `queued` only when
//!   no child was spawned for it (no result file, no process carrying its
//!   `NIGHTSHIFT_TASK`), else it is adopted or settled; a `running` task
//!   whose child still lives is adopted (watched until it ends), one whose
//!   child is gone is settled from its result file (the run's record) or,
//!   failing that, from the run whose supervisor was that child
//!   (`tests/tests/run_queue.rs::tasks_start_in_order_and_a_killed_dispatcher_loses_nothing`,
//!   `tests/tests/serve_queue.rs::a_killed_serve_loses_no_task_and_leaves_no_orphan_sandbox`,
//!   `tests::a_task_caught_starting_before_its_spawn_goes_back_to_the_queue`,
//!   `tests::a_living_child_is_adopted_and_names_its_new_dispatcher`,
//!   `tests::a_task_whose_child_ended_unseen_is_settled_from_its_result_once`).
//! - Which tasks start is decided by a pure function ([`admit`]): strictly
//!   in order (the head waits rather than being overtaken), never more than
//!   `max_parallel` of the queue's tasks running, and never more than the
//!   fleet's memory, CPUs and processes in caps summed over the running
//!   tasks (every dispatcher's: one budget), except that a task
//!   that alone exceeds the fleet may start when nothing else runs (the fleet
//!   cgroup still bounds it), so the queue never stalls forever. No new task
//!   can be such a task: one whose caps exceed the fleet's is refused when
//!   enqueued ([`within_fleet`]), as `nightshift run` refuses one
//!   (`tests::admission_keeps_order_parallelism_and_the_fleet`,
//!   `tests::the_head_waits_rather_than_being_overtaken`,
//!   `tests::every_dispatchers_tasks_count_against_the_fleet`,
//!   `tests::no_run_asks_for_more_than_the_fleet`).
//! - A run started outside the queue (`nightshift run`, each child of
//!   `tasks run`) passes admission too ([`admit_pids`]): its pids cap and
//!   those of the state's running sandboxes (as the engine reports them,
//!   [`running_pids`]) stay within the fleet's, whose pids cgroup they all
//!   share; otherwise it is refused, naming the figures. Two runs admitted
//!   at the same instant can still both start (no lock spans the check and
//!   the container's creation); the fleet's cgroup still bounds them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::api::{Api, ApiError, ErrorKind};
use nightshift_core::state_store::RunRecord;
use nightshift_core::state_store::StateStore;
use nightshift_core::state_store::TaskFence;

pub use crate::tasks::*;
#[allow(unused_imports)]
use crate::tasks::{bad, head, progress_json, row};

/// What a run in process ends with: its record, or the exit code
/// `nightshift run` would have given and the error's words.
pub type RunOutcome = Result<RunRecord, (i32, String)>;

/// Runs tasks in the dispatcher's process (see the module's note); the
/// real one is [`crate::task_runner::InProcess`].
pub trait TaskRunner: Send + Sync {
    /// Runs `task` as run `run` (its record takes that id) until it ends or
    /// `stop` says.
    fn run(
        &self,
        task: TaskRow,
        run: String,
        stop: tokio::sync::watch::Receiver<Option<crate::run::Stop>>,
    ) -> BoxFuture<'static, RunOutcome>;
    /// Settles run `run`, left unsettled by a lifecycle that panicked or by
    /// a supervisor that vanished: sandbox stopped, work imported, record
    /// ended with `status` unless a kill says otherwise. False when there
    /// was nothing to do (ended, or another settler holds it).
    fn settle(
        &self,
        run: String,
        by: String,
        status: String,
    ) -> BoxFuture<'static, Result<bool, String>>;
    /// Settles the runs of every supervisor of this state that vanished.
    fn reconcile(&self) -> BoxFuture<'static, Result<(), String>>;

    /// The id a run of `task` takes when a warm sandbox fits it (reserved
    /// for that run: `crate::pool`); `None` for a new id.
    fn warm_run_id(&self, _task: &TaskRow) -> Option<String> {
        None
    }

    /// Whether the engine confirms that no container of `run` exists (an
    /// engine it cannot reach confirms nothing): a kept worktree is read
    /// only once its sandbox can no longer write to it.
    fn sandbox_gone(&self, _run: String) -> BoxFuture<'static, bool> {
        Box::pin(async { true })
    }
}

/// How the dispatcher turns a task into a run.
#[derive(Clone)]
pub enum Runner {
    /// `nightshift run` as a child process, from this binary.
    Child { exe: PathBuf },
    /// In this process.
    InProcess(Arc<dyn TaskRunner>),
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Runner::Child { exe } => f.debug_struct("Child").field("exe", exe).finish(),
            Runner::InProcess(_) => f.write_str("InProcess"),
        }
    }
}

/// How the dispatcher runs.
#[derive(Debug, Clone)]
pub struct DispatchOptions {
    /// At most this many tasks running at once.
    pub max_parallel: usize,
    /// How each task becomes a run.
    pub runner: Runner,
    /// How often the queue and the children are looked at.
    pub poll: Duration,
    /// Return once nothing is queued and nothing runs, under any lease (or
    /// only frozen tasks wait); otherwise run until `stop`.
    pub until_empty: bool,
    /// The length of this dispatcher's leases on its tasks, seconds: how
    /// long a task of a dispatcher that died waits before another takes it
    /// over. Renewed every third of it.
    pub lease_secs: i64,
}

/// The lease of `tasks run`'s and `serve`'s dispatchers on their tasks.
pub const TASK_LEASE_SECS: i64 = 15;

/// The file in the state folder a dispatcher touches on every turn of its
/// loop (at most once a second), whether or not the store answers: a
/// process whose loop is stuck stops touching it. A hosted worker's liveness
/// probe reads its age (`deploy/kubernetes/worker.yaml`).
pub const ALIVE_FILE: &str = "dispatcher.alive";

/// Touches [`ALIVE_FILE`]; a failure is logged once and otherwise ignored
/// (the probe then restarts a worker that cannot write its own state).
fn touch_alive(root: &std::path::Path, last: &mut Option<std::time::Instant>, failed: &mut bool) {
    if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
        return;
    }
    *last = Some(std::time::Instant::now());
    let path = root.join(ALIVE_FILE);
    let touched = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    match touched {
        Ok(()) => *failed = false,
        Err(e) if !*failed => {
            *failed = true;
            tracing::warn!(path = %path.display(), error = %e, "the dispatcher cannot touch its alive file");
        }
        Err(_) => {}
    }
}

/// Unix seconds now.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A dispatcher's name on its leases: unique, so two dispatchers (in any
/// processes, on any machines) never share one.
fn new_holder(me: &str) -> String {
    format!(
        "dispatcher {me} {}",
        ulid::Ulid::new().to_string().to_lowercase()
    )
}

/// What one dispatcher did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DispatchSummary {
    /// Tasks it started.
    pub started: Vec<String>,
    /// Tasks found running from an earlier dispatcher, and watched.
    pub adopted: Vec<String>,
    /// Tasks it settled (ended), with their final state.
    pub settled: Vec<(String, TaskState)>,
    /// Tasks still queued when it returned.
    pub left_queued: usize,
    /// The freeze that kept tasks queued, when one did.
    pub frozen: Option<String>,
    /// It returned because it was asked to stop; children keep running and
    /// the next dispatcher adopts them.
    pub stopped: bool,
}

fn task_dir(root: &Path, id: &str) -> PathBuf {
    root.join("tasks").join(id)
}

/// Is the process `pid:starttime` alive (a zombie is not)?
fn alive(identity: &str) -> bool {
    if crate::run::identity_elsewhere(identity) {
        return true;
    }
    if !crate::run::identity_alive(identity) {
        return false;
    }
    let pid = identity.split(':').next().unwrap_or_default();
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 2..];
            rest.chars().next()
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// The process started for task `id`, found by the `NIGHTSHIFT_TASK` in
/// its environment (for a dispatcher killed between spawn and record).
fn find_child(id: &str) -> Option<String> {
    let marker = format!("NIGHTSHIFT_TASK={id}");
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        // The run's own watchdog inherits the marker too: it is not the run.
        let is_watchdog = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.split(|b| *b == 0).any(|a| a == b"watchdog"))
            .unwrap_or(true);
        if !is_watchdog && env.split(|b| *b == 0).any(|v| v == marker.as_bytes()) {
            if let Some(identity) = crate::run::process_identity(pid) {
                if alive(&identity) {
                    return Some(identity);
                }
            }
        }
    }
    None
}

/// The last non-empty line of a child's stderr, for a failure's reason.
fn last_line(path: &Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let tail = &text[text.len().saturating_sub(4096)..];
    String::from_utf8_lossy(tail)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.chars().take(500).collect())
}

/// Ends a task whose run has ended: from its result file (the run's
/// record, as `run --json` prints it), else from its run (named in the
/// task, or the one whose supervisor was its child), else as failed with the
/// run's last words. `failure` (a panic) fails it whatever its run says.
fn settle<S: StateStore + ?Sized>(
    store: &mut S,
    root: &Path,
    task: &TaskRow,
    exit: Option<i32>,
    failure: Option<String>,
    fence: Option<&TaskFence>,
) -> Result<Option<TaskState>, ApiError> {
    let dir = task_dir(root, &task.id);
    let mut p = task.progress.clone();
    p.ended_at = Some(nightshift_core::state_store::now_rfc3339());
    let from = [TaskState::Starting.name(), TaskState::Running.name()];
    let record: Option<RunRecord> = std::fs::read(dir.join("result.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let record = record.or_else(|| {
        let runs = store.runs().ok()?;
        match (&p.run, &p.child) {
            (Some(run), _) => runs.into_iter().find(|r| &r.id == run),
            (None, Some(child)) => runs
                .into_iter()
                .find(|r| r.supervisor.as_deref() == Some(child.as_str())),
            (None, None) => None,
        }
    });
    let finished = record
        .as_ref()
        .filter(|r| nightshift_core::state_store::is_final(&r.status));
    p.exit_code = exit.or_else(|| finished.map(crate::api::run_exit_code));
    let state = match &record {
        _ if failure.is_some() => {
            if let Some(r) = &record {
                p.run = Some(r.id.clone());
                p.status = Some(r.status.clone());
            }
            p.reason = failure;
            TaskState::Failed
        }
        Some(r) if nightshift_core::state_store::is_final(&r.status) => {
            p.run = Some(r.id.clone());
            p.status = Some(r.status.clone());
            TaskState::Done
        }
        Some(r) => {
            // The run's supervisor died with the run unsettled: the next
            // reconciliation settles the run; the task says where it is.
            p.run = Some(r.id.clone());
            p.status = Some(r.status.clone());
            p.reason = Some(
                "its run process ended without a result; `nightshift reconcile` settles the run"
                    .into(),
            );
            TaskState::Failed
        }
        // A start refused by a freeze that came after the dispatcher looked:
        // nothing ran, so the task waits again.
        None if exit == Some(nightshift_core::exit::DENIED) => {
            let mut q = task.progress.clone();
            // A run in process gets a new id when it starts again.
            q.run = None;
            q.reason = last_line(&dir.join("stderr.log"));
            return Ok(store
                .move_task(
                    &task.id,
                    &from,
                    TaskState::Queued.name(),
                    &progress_json(&q),
                    fence,
                )?
                .then_some(TaskState::Queued));
        }
        None => {
            p.reason = Some(
                last_line(&dir.join("stderr.log"))
                    .unwrap_or_else(|| "its run process ended without a result".into()),
            );
            TaskState::Failed
        }
    };
    Ok(store
        .move_task(&task.id, &from, state.name(), &progress_json(&p), fence)?
        .then_some(state))
}

/// The arguments of `nightshift run` for one task.
fn run_args(
    root: &Path,
    config: Option<&Path>,
    task: &TaskRow,
    task_file: Option<&Path>,
) -> Vec<std::ffi::OsString> {
    let s = &task.spec;
    let mut a: Vec<std::ffi::OsString> = vec!["--state-dir".into(), root.into()];
    if let Some(c) = config {
        a.push("--config".into());
        a.push(c.into());
    }
    a.extend([
        "run".into(),
        "--repo".into(),
        s.repo.clone().into_os_string(),
    ]);
    a.push("--ref".into());
    a.push(s.base_ref.clone().into());
    if let Some(i) = &s.image {
        a.push("--image".into());
        a.push(i.into());
    }
    if let Some(f) = task_file {
        a.push("--task-file".into());
        a.push(f.into());
    }
    let mut flag = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            a.push(format!("--{name}").into());
            a.push(v.into());
        }
    };
    flag("memory", s.memory.clone());
    flag("cpus", s.cpus.map(|c| c.to_string()));
    flag("pids", s.pids.map(|c| c.to_string()));
    flag("timeout", s.timeout.clone());
    flag("max-output", s.max_output.clone());
    flag("max-worktree", s.max_worktree.clone());
    flag("max-files", s.max_files.map(|c| c.to_string()));
    flag("max-tokens", s.max_tokens.map(|c| c.to_string()));
    flag("agent", s.agent.clone());
    flag("model", s.model.clone());
    flag("continues", s.continues.clone());
    if s.dry_run {
        a.push("--dry-run".into());
    }
    a.push("--json".into());
    if !s.command.is_empty() {
        a.push("--".into());
        a.extend(s.command.iter().map(Into::into));
    }
    a
}

/// Starts one task's child (the task was moved to `starting`, with `p`,
/// under this dispatcher's lease). The task is `starting` before anything is
/// spawned and the result file exists before the spawn, so a dispatcher
/// killed at any point leaves what its successor needs to tell "never
/// spawned" from "spawned".
fn start_child<S: StateStore + ?Sized>(
    store: &mut S,
    api: &Api,
    exe: &Path,
    task: &TaskRow,
    mut p: Progress,
    fence: &TaskFence,
) -> Result<Option<Own>, ApiError> {
    let root = api.root();
    let dir = task_dir(root, &task.id);
    let state_err = |m: String| ApiError::new(ErrorKind::State, m);
    nightshift_core::state_store::create_private_dir(&root.join("tasks"))?;
    nightshift_core::state_store::create_private_dir(&dir)?;
    let task_file = match &task.spec.task {
        Some(text) => {
            let f = dir.join("task.txt");
            std::fs::write(&f, text)
                .map_err(|e| state_err(format!("writing {}: {e}", f.display())))?;
            Some(f)
        }
        None => None,
    };
    let (stdout, stderr) = (create(&dir, "result.json")?, create(&dir, "stderr.log")?);
    let mut command = tokio::process::Command::new(exe);
    command
        .args(run_args(
            root,
            api.config_path(),
            task,
            task_file.as_deref(),
        ))
        .env("NIGHTSHIFT_TASK", &task.id)
        .env_remove("NIGHTSHIFT_STATE_DIR")
        .env_remove("NIGHTSHIFT_CONFIG")
        // A run never needs the owner's key.
        .env_remove("NIGHTSHIFT_OWNER_KEY_FILE")
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        // Its own process group: a signal to the dispatcher's group (Ctrl-C)
        // is not a signal to the runs, which the next dispatcher adopts.
        .process_group(0)
        .kill_on_drop(false);
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            p.reason = Some(format!("starting {}: {e}", exe.display()));
            p.ended_at = Some(nightshift_core::state_store::now_rfc3339());
            store.move_task(
                &task.id,
                &["starting"],
                "failed",
                &progress_json(&p),
                Some(fence),
            )?;
            return Ok(None);
        }
    };
    p.child = child.id().and_then(crate::run::process_identity);
    store.move_task(
        &task.id,
        &["starting"],
        "running",
        &progress_json(&p),
        Some(fence),
    )?;
    Ok(Some(Own::Child(child)))
}

fn create(dir: &Path, name: &str) -> Result<std::fs::File, ApiError> {
    let f = dir.join(name);
    std::fs::File::create(&f)
        .map_err(|e| ApiError::new(ErrorKind::State, format!("creating {}: {e}", f.display())))
}

/// The id of a warm sandbox reserved for `task`'s run, when the runner
/// keeps warm sandboxes and one fits.
fn warm_run_id(runner: &Runner, task: &TaskRow) -> Option<String> {
    match runner {
        Runner::InProcess(r) => r.warm_run_id(task),
        Runner::Child { .. } => None,
    }
}

/// Starts one task's run in this process (the task was moved to
/// `starting`, with `p` naming its run, under this dispatcher's lease): its
/// run's id is in the task (`starting`) before the run begins, so a dispatcher killed at any point
/// leaves its successor the run to settle the task from (or no record of
/// it: nothing ran).
fn start_in_process<S: StateStore + ?Sized>(
    store: &mut S,
    root: &Path,
    runner: &Arc<dyn TaskRunner>,
    task: &TaskRow,
    p: Progress,
    fence: &TaskFence,
) -> Result<Option<Own>, ApiError> {
    let Some(run) = p.run.clone() else {
        return Err(ApiError::new(
            ErrorKind::Internal,
            format!("task {}: started in process without a run id", task.id),
        ));
    };
    let dir = task_dir(root, &task.id);
    nightshift_core::state_store::create_private_dir(&root.join("tasks"))?;
    nightshift_core::state_store::create_private_dir(&dir)?;
    create(&dir, "result.json")?;
    create(&dir, "stderr.log")?;
    if !store.move_task(
        &task.id,
        &["starting"],
        "running",
        &progress_json(&p),
        Some(fence),
    )? {
        // Taken over between its start and now: not this dispatcher's.
        return Ok(None);
    }
    let (stop, stopped) = tokio::sync::watch::channel(None);
    let running = runner.run(task.clone(), run.clone(), stopped);
    let handle = tokio::spawn(async move {
        let outcome = running.await;
        // Its dispatcher settles it, and may start the next, at once.
        crate::wake::wake_dispatchers();
        outcome
    });
    let stop = Arc::new(stop);
    Ok(Some(Own::InProcess { run, handle, stop }))
}

/// A task this dispatcher started.
enum Own {
    Child(tokio::process::Child),
    InProcess {
        run: String,
        handle: tokio::task::JoinHandle<RunOutcome>,
        stop: StopSender,
    },
}

/// A run in process's stop, shared with the fence's timer.
type StopSender = Arc<tokio::sync::watch::Sender<Option<crate::run::Stop>>>;

/// What an earlier dispatcher left: tasks adopted by the identity of their
/// child, tasks in process waiting for their run's settlement (by run),
/// tasks whose run lived on another host (settled once its sandbox has
/// surely ended by its own lease), the claims they are held under, and the
/// tasks settled.
#[derive(Default)]
struct Recovered {
    children: HashMap<String, String>,
    runs: HashMap<String, String>,
    elsewhere: HashMap<String, Elsewhere>,
    fences: HashMap<String, TaskFence>,
    settled: Vec<(String, TaskState)>,
}

/// A task taken over whose run lived on another host (its dispatcher, a
/// worker, stopped renewing its lease: dead, or cut off from the store).
/// Its sandbox there ends by itself: its worker stops it before its lease
/// lapses when it cannot renew, or, dead, stops renewing the sandbox's own
/// lease, which then ends it. So its run is settled here only `after` that
/// bound, and in the store only: nothing of it is on this host.
#[derive(Debug, Clone)]
struct Elsewhere {
    run: Option<String>,
    child: Option<String>,
    after: std::time::Instant,
}

/// How long after taking a task over whose run lived on another host its
/// sandbox may still live there: the sandbox's own lease (`caps.lease`)
/// and the host-side end's margin, with room for clocks.
fn elsewhere_bound(config: &nightshift_core::config::Config) -> Duration {
    config.caps().lease + Duration::from_secs(10)
}

/// Takes over what a dispatcher that died left: the `starting` and
/// `running` tasks whose lease lapsed (or that have none), claimed under
/// `holder`'s lease until `until` (see the module's note).
fn recover<S: StateStore + ?Sized>(
    store: &mut S,
    root: &Path,
    me: &str,
    holder: &str,
    until: i64,
    bound: Duration,
) -> Result<Recovered, ApiError> {
    // An adopted task names its new dispatcher.
    fn adopt<S: StateStore + ?Sized>(
        store: &mut S,
        me: &str,
        task: &TaskRow,
        child: Option<&str>,
        from: &str,
        fence: &TaskFence,
    ) -> Result<bool, ApiError> {
        let mut p = task.progress.clone();
        if let Some(child) = child {
            p.child = Some(child.to_string());
        }
        p.dispatcher = Some(me.to_string());
        Ok(store.move_task(
            &task.id,
            &[from],
            "running",
            &progress_json(&p),
            Some(fence),
        )?)
    }
    let mut found = Recovered::default();
    let lapsed = store.claim_lapsed_tasks(holder, unix_now(), until)?;
    if lapsed.is_empty() {
        return Ok(found);
    }
    let runs = store.runs()?;
    let after = std::time::Instant::now() + bound;
    for stored in lapsed {
        let fence = TaskFence {
            holder: holder.to_string(),
            generation: stored.generation,
        };
        let task = row(stored)?;
        let fence = &fence;
        let from = match task.state {
            TaskState::Starting | TaskState::Running => task.state.name(),
            _ => continue,
        };
        found.fences.insert(task.id.clone(), fence.clone());
        if task.progress.in_process {
            // Its dispatcher, whose lease lapsed, is gone, and its run
            // with it.
            match task
                .progress
                .run
                .as_ref()
                .and_then(|id| runs.iter().find(|r| &r.id == id))
            {
                None => {
                    let p = Progress::default();
                    store.move_task(
                        &task.id,
                        &[from],
                        "queued",
                        &progress_json(&p),
                        Some(fence),
                    )?;
                }
                Some(r) if nightshift_core::state_store::is_final(&r.status) => {
                    if let Some(s) = settle(store, root, &task, None, None, Some(fence))? {
                        found.settled.push((task.id.clone(), s));
                    }
                }
                Some(r)
                    if r.supervisor
                        .as_deref()
                        .is_some_and(crate::run::identity_elsewhere) =>
                {
                    if adopt(store, me, &task, None, from, fence)? {
                        found.elsewhere.insert(
                            task.id.clone(),
                            Elsewhere {
                                run: Some(r.id.clone()),
                                child: None,
                                after,
                            },
                        );
                    }
                }
                Some(r) => {
                    if adopt(store, me, &task, None, from, fence)? {
                        found.runs.insert(task.id.clone(), r.id.clone());
                    }
                }
            }
            continue;
        }
        if let Some(child) = task
            .progress
            .child
            .clone()
            .filter(|c| crate::run::identity_elsewhere(c))
        {
            // A child of a dispatcher on another host: not this host's to
            // look for, adopt or judge.
            if adopt(store, me, &task, Some(&child), from, fence)? {
                found.elsewhere.insert(
                    task.id.clone(),
                    Elsewhere {
                        run: None,
                        child: Some(child),
                        after,
                    },
                );
            }
            continue;
        }
        match task.state {
            TaskState::Starting => {
                if let Some(child) = find_child(&task.id) {
                    if adopt(store, me, &task, Some(&child), "starting", fence)? {
                        found.children.insert(task.id.clone(), child);
                    }
                } else if task_dir(root, &task.id).join("result.json").exists() {
                    if let Some(s) = settle(store, root, &task, None, None, Some(fence))? {
                        found.settled.push((task.id.clone(), s));
                    }
                } else {
                    let p = Progress::default();
                    store.move_task(
                        &task.id,
                        &["starting"],
                        "queued",
                        &progress_json(&p),
                        Some(fence),
                    )?;
                }
            }
            _ => match task.progress.child.clone() {
                Some(child) if alive(&child) => {
                    if adopt(store, me, &task, Some(&child), "running", fence)? {
                        found.children.insert(task.id.clone(), child);
                    }
                }
                _ => {
                    if let Some(s) = settle(store, root, &task, None, None, Some(fence))? {
                        found.settled.push((task.id.clone(), s));
                    }
                }
            },
        }
    }
    Ok(found)
}

/// Ends a task whose run lived on another host once its sandbox there has
/// surely ended (see [`Elsewhere`]): the run, if it has a record that is
/// not final, ended in the store as lost (nothing of it is here: no
/// container to remove, no worktree to import; its worker, if it comes
/// back, imports the worktree it kept); then the task queued again if its
/// spec allows another attempt, else failed, naming its lost worker.
fn settle_elsewhere<S: StateStore + ?Sized>(
    store: &mut S,
    task: &TaskRow,
    lost: &Elsewhere,
    fence: &TaskFence,
) -> Result<Option<TaskState>, ApiError> {
    let runs = store.runs()?;
    let record = match (&lost.run, &lost.child) {
        (Some(run), _) => runs.into_iter().find(|r| &r.id == run),
        (None, Some(child)) => runs
            .into_iter()
            .find(|r| r.supervisor.as_deref() == Some(child.as_str())),
        (None, None) => None,
    };
    let worker = record
        .as_ref()
        .and_then(|r| r.supervisor.clone())
        .or_else(|| lost.child.clone())
        .unwrap_or_else(|| "its dispatcher".into());
    let words = format!(
        "its worker ({worker}) stopped renewing its claim; its sandbox ended by its own lease"
    );
    let mut ended = None;
    if let Some(mut r) = record {
        if !nightshift_core::state_store::is_final(&r.status) {
            r.status = crate::run::LOST_BY_WORKER.into();
            r.reason = Some(words.clone());
            r.ended_at = Some(nightshift_core::state_store::now_rfc3339());
            store.end_run(
                &r,
                &nightshift_core::audit_log::Event::RunEnded {
                    status: r.status.clone(),
                    reason: r.reason.clone(),
                },
            )?;
            ended = store.runs()?.into_iter().find(|x| x.id == r.id);
        } else {
            ended = Some(r);
        }
    }
    let mut p = task.progress.clone();
    p.ended_at = Some(nightshift_core::state_store::now_rfc3339());
    if let Some(r) = &ended {
        p.run = Some(r.id.clone());
        p.status = Some(r.status.clone());
    }
    let lost_by_worker = ended
        .as_ref()
        .is_none_or(|r| r.status.starts_with(crate::run::LOST_BY_WORKER));
    let from = [TaskState::Starting.name(), TaskState::Running.name()];
    if lost_by_worker && task.progress.attempt < task.spec.retries {
        let q = Progress {
            attempt: task.progress.attempt + 1,
            reason: Some(format!(
                "attempt {} lost: {words}",
                task.progress.attempt + 1
            )),
            ..Default::default()
        };
        return Ok(store
            .move_task(
                &task.id,
                &from,
                TaskState::Queued.name(),
                &progress_json(&q),
                Some(fence),
            )?
            .then_some(TaskState::Queued));
    }
    let state = match &ended {
        Some(r) if !lost_by_worker => {
            // It ended there after all (its worker settled it before its
            // claim lapsed): done, as any task whose run ended.
            p.exit_code = Some(crate::api::run_exit_code(r));
            TaskState::Done
        }
        _ => {
            p.reason = Some(words);
            TaskState::Failed
        }
    };
    Ok(store
        .move_task(
            &task.id,
            &from,
            state.name(),
            &progress_json(&p),
            Some(fence),
        )?
        .then_some(state))
}

/// The freeze's reason, when nightshift is frozen; an unreadable policy is
/// an error (nothing starts on a policy nobody can read).
fn frozen<S: StateStore + ?Sized>(store: &S) -> Result<Option<String>, ApiError> {
    let set = nightshift_core::policy::load(store, None)?;
    Ok(set.freeze().map(|f| f.reason.clone()))
}

/// What the dispatcher watches.
#[derive(Default)]
struct Watched {
    /// Tasks it started.
    own: HashMap<String, Own>,
    /// Tasks adopted from an earlier dispatcher, by their child's identity.
    children: HashMap<String, String>,
    /// Tasks in process left by an earlier dispatcher, by their run.
    runs: HashMap<String, String>,
    /// Tasks taken over whose run lived on another host.
    elsewhere: HashMap<String, Elsewhere>,
    /// The claim each watched task is held under: every move of it is made
    /// with this fence, never with what the store says now.
    fences: HashMap<String, TaskFence>,
    /// The stops of the runs in process it started, shared with the
    /// fence's timer ([`fence_timer`]); a finished run's stays until the
    /// next start replaces the list's stale entries (its receiver is gone).
    stops: Arc<std::sync::Mutex<Vec<(String, StopSender)>>>,
}

impl Watched {
    fn idle(&self) -> bool {
        self.own.is_empty()
            && self.children.is_empty()
            && self.runs.is_empty()
            && self.elsewhere.is_empty()
    }

    fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .own
            .keys()
            .chain(self.children.keys())
            .chain(self.runs.keys())
            .chain(self.elsewhere.keys())
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// Adds what a recovery found to watch.
    fn take(&mut self, found: &mut Recovered, summary: &mut DispatchSummary) {
        let mut adopted: Vec<String> = found
            .children
            .keys()
            .chain(found.runs.keys())
            .chain(found.elsewhere.keys())
            .cloned()
            .collect();
        adopted.sort();
        summary.adopted.extend(adopted);
        summary.settled.append(&mut found.settled);
        self.children.extend(found.children.drain());
        self.runs.extend(found.runs.drain());
        self.elsewhere.extend(found.elsewhere.drain());
        self.fences.extend(found.fences.drain());
    }

    /// Forgets a task: settled, or its claim lost.
    fn forget(&mut self, id: &str) {
        self.own.remove(id);
        self.children.remove(id);
        self.runs.remove(id);
        self.elsewhere.remove(id);
        self.fences.remove(id);
    }
}

/// One look at the queue: settle ended children, then start what [`admit`]
/// allows. Synchronous: no store handle lives across an await.
fn step(
    api: &Api,
    config: &nightshift_core::config::Config,
    opts: &DispatchOptions,
    me: &str,
    holder: &str,
    watched: &mut Watched,
    summary: &mut DispatchSummary,
) -> Result<bool, ApiError> {
    let mut store = api.open_store()?;
    let root = api.root();
    let by_id = |store: &dyn StateStore, id: &str| -> Result<Option<TaskRow>, ApiError> {
        Ok(list(store)?.into_iter().find(|t| t.id == id))
    };
    let mut ended = Vec::new();
    for (id, own) in watched.own.iter_mut() {
        if let Own::Child(child) = own {
            if let Ok(Some(status)) = child.try_wait() {
                ended.push((id.clone(), status.code().or(Some(128 + signal_of(&status)))));
            }
        }
    }
    for (id, code) in ended {
        watched.own.remove(&id);
        let fence = watched.fences.remove(&id);
        if let Some(task) = by_id(&*store, &id)? {
            if let Some(s) = settle(&mut store, root, &task, code, None, fence.as_ref())? {
                summary.settled.push((id, s));
            }
        }
    }
    let gone: Vec<String> = watched
        .children
        .iter()
        .filter(|(_, child)| !alive(child))
        .map(|(id, _)| id.clone())
        .collect();
    for id in gone {
        watched.children.remove(&id);
        let fence = watched.fences.remove(&id);
        if let Some(task) = by_id(&*store, &id)? {
            if let Some(s) = settle(&mut store, root, &task, None, None, fence.as_ref())? {
                summary.settled.push((id, s));
            }
        }
    }
    // Tasks whose run lived on another host, once its sandbox there has
    // surely ended.
    let due_elsewhere: Vec<(String, Elsewhere)> = watched
        .elsewhere
        .iter()
        .filter(|(_, e)| e.after <= std::time::Instant::now())
        .map(|(id, e)| (id.clone(), e.clone()))
        .collect();
    for (id, lost) in due_elsewhere {
        let fence = watched.fences.get(&id).cloned();
        watched.forget(&id);
        let (Some(task), Some(fence)) = (by_id(&*store, &id)?, fence) else {
            continue;
        };
        if let Some(s) = settle_elsewhere(&mut store, &task, &lost, &fence)? {
            summary.settled.push((id, s));
        }
    }
    // A freeze is read before the start's transaction (a freeze that
    // lands after it is refused by the run's own check, and the task waits
    // again: see `settle`).
    let looked = list(&*store)?;
    let any_queued = looked.iter().any(|t| t.state == TaskState::Queued);
    // Tasks that start or run under another's lease (another dispatcher,
    // a foreground run, or one that died and whose lease has yet to
    // lapse): the queue is not empty while they are there.
    let mine = watched.ids();
    let busy_elsewhere = looked.iter().any(|t| {
        matches!(t.state, TaskState::Starting | TaskState::Running) && !mine.contains(&t.id)
    });
    let freeze = if any_queued { frozen(&*store)? } else { None };
    let in_process = matches!(opts.runner, Runner::InProcess(_));
    let mut decided: Option<Due> = None;
    let mut unreadable: Option<ApiError> = None;
    let mut progress: HashMap<String, Progress> = HashMap::new();
    let until = unix_now().saturating_add(opts.lease_secs.max(1));
    if !any_queued {
        // Nothing to start: no start's transaction (a write lock on the
        // store, every poll of every dispatcher, for nothing).
        summary.frozen = None;
        summary.left_queued = 0;
        return Ok(watched.idle() && !busy_elsewhere);
    }
    let started = store.start_tasks(holder, until, &mut |all| {
        let rows = match all.iter().cloned().map(row).collect::<Result<Vec<_>, _>>() {
            Ok(rows) => rows,
            Err(e) => {
                unreadable = Some(e);
                return Vec::new();
            }
        };
        let d = due(&rows, config, opts.max_parallel, freeze.clone());
        let chosen = d
            .start
            .iter()
            .map(|t| {
                let p = Progress {
                    dispatcher: Some(me.to_string()),
                    run: in_process.then(|| {
                        warm_run_id(&opts.runner, t)
                            .unwrap_or_else(|| ulid::Ulid::new().to_string().to_lowercase())
                    }),
                    in_process,
                    // A task run again after its worker was lost counts on.
                    attempt: t.progress.attempt,
                    started_at: Some(nightshift_core::state_store::now_rfc3339()),
                    ..Default::default()
                };
                let json = progress_json(&p);
                progress.insert(t.id.clone(), p);
                (t.id.clone(), json)
            })
            .collect();
        decided = Some(d);
        chosen
    })?;
    if let Some(e) = unreadable {
        return Err(e);
    }
    let Some(due) = decided else {
        return Err(ApiError::new(
            ErrorKind::Internal,
            "the run queue's admission was not asked",
        ));
    };
    summary.frozen = due.frozen.clone();
    let mut left = due.queued;
    for task in &due.start {
        left -= 1;
        // Cancelled (or started elsewhere) between the look and the start.
        let Some(generation) = started
            .iter()
            .find(|(id, _)| *id == task.id)
            .map(|(_, g)| *g)
        else {
            continue;
        };
        let Some(p) = progress.remove(&task.id) else {
            continue;
        };
        let fence = TaskFence {
            holder: holder.to_string(),
            generation,
        };
        let own = match &opts.runner {
            Runner::Child { exe } => start_child(&mut store, api, exe, task, p, &fence)?,
            Runner::InProcess(runner) => {
                start_in_process(&mut store, root, runner, task, p, &fence)?
            }
        };
        if let Some(own) = own {
            if let Own::InProcess { stop, .. } = &own {
                let mut stops = watched.stops.lock().unwrap_or_else(|p| p.into_inner());
                stops.retain(|(_, s)| !s.is_closed());
                stops.push((task.id.clone(), stop.clone()));
            }
            watched.own.insert(task.id.clone(), own);
            watched.fences.insert(task.id.clone(), fence);
            summary.started.push(task.id.clone());
        }
    }
    summary.left_queued = left;
    Ok(watched.idle() && !busy_elsewhere && (left == 0 || due.frozen.is_some()))
}

/// What one look at the queue may start.
#[derive(Debug)]
struct Due {
    /// The queued tasks to start now, in the queue's order.
    start: Vec<TaskRow>,
    /// How many tasks are queued, started now or not.
    queued: usize,
    /// The freeze's reason, when one keeps every queued task waiting.
    frozen: Option<String>,
}

/// The queued tasks [`admit`] lets start, given every task of the store
/// (`all`, in the queue's order). The fleet's budget and `max_parallel`
/// count every dispatcher's `starting` and `running` tasks (a task of a
/// dispatcher that died among them, until it is settled): the queue's
/// runs, wherever they run. Nothing starts while `frozen`. Pure: the store
/// calls it inside the start's transaction ([`TaskQueue::start_tasks`]).
fn due(
    all: &[TaskRow],
    config: &nightshift_core::config::Config,
    max_parallel: usize,
    frozen: Option<String>,
) -> Due {
    let busy: Vec<&TaskRow> = all
        .iter()
        .filter(|t| matches!(t.state, TaskState::Starting | TaskState::Running))
        .collect();
    let running: Vec<Need> = busy.iter().map(|t| need(&t.spec, config)).collect();
    let queued: Vec<TaskRow> = all
        .iter()
        .filter(|t| t.state == TaskState::Queued)
        .cloned()
        .collect();
    let count = queued.len();
    if frozen.is_some() || queued.is_empty() {
        return Due {
            start: Vec::new(),
            queued: count,
            frozen: frozen.filter(|_| count > 0),
        };
    }
    let needs: Vec<Need> = queued.iter().map(|t| need(&t.spec, config)).collect();
    let n = admit(&needs, &running, fleet_need(config), max_parallel);
    Due {
        start: queued.into_iter().take(n).collect(),
        queued: count,
        frozen: None,
    }
}

fn signal_of(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.signal().unwrap_or(0)
}

/// The words of a run's panic (or of its task's cancellation).
fn panic_words(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return "its run was cancelled".into();
    }
    let payload = e.into_panic();
    let words = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    format!(
        "its run panicked: {}",
        words.chars().take(500).collect::<String>()
    )
}

/// The run `id`'s record, when the store has one.
fn run_record(api: &Api, id: &str) -> Result<Option<RunRecord>, ApiError> {
    Ok(api.open_store()?.runs()?.into_iter().find(|r| r.id == id))
}

/// Ends the task of a run in process that has ended (or panicked): its
/// record or error into the task's files, the run settled as an orphan if
/// its lifecycle did not end it, then the task settled.
async fn reap(
    api: &Api,
    runner: &Arc<dyn TaskRunner>,
    id: &str,
    run: &str,
    ended: Result<RunOutcome, tokio::task::JoinError>,
    summary: &mut DispatchSummary,
    fence: Option<TaskFence>,
) -> Result<(), ApiError> {
    let dir = task_dir(api.root(), id);
    let write = |name: &str, bytes: &[u8]| {
        let f = dir.join(name);
        std::fs::write(&f, bytes)
            .map_err(|e| ApiError::new(ErrorKind::State, format!("writing {}: {e}", f.display())))
    };
    let (exit, failure) = match ended {
        Ok(Ok(record)) => {
            let json = serde_json::to_vec_pretty(&record)
                .map_err(|e| ApiError::caused(ErrorKind::Internal, e))?;
            write("result.json", &json)?;
            (None, None)
        }
        Ok(Err((code, words))) => {
            write("stderr.log", format!("nightshift: {words}\n").as_bytes())?;
            (Some(code), None)
        }
        Err(e) => {
            let words = panic_words(e);
            tracing::error!(task = %id, run = %run, "{words}");
            write("stderr.log", format!("nightshift: {words}\n").as_bytes())?;
            (Some(nightshift_core::exit::INTERNAL), Some(words))
        }
    };
    // A lifecycle that did not reach its ending (a panic) leaves its
    // sandbox, worktree and record: settled here, as an orphan's are.
    if let Some(r) = run_record(api, run)? {
        if !nightshift_core::state_store::is_final(&r.status) {
            let status = match &failure {
                Some(words) => format!("error: {words}"),
                None => "error: its run ended without settling".into(),
            };
            if let Err(e) = runner.settle(run.to_string(), "serve".into(), status).await {
                tracing::warn!(run = %run, error = %e, "settling a run that ended without settling");
            }
        }
    }
    let mut store = api.open_store()?;
    if let Some(task) = list(&store)?.into_iter().find(|t| t.id == id) {
        if let Some(s) = settle(&mut store, api.root(), &task, exit, failure, fence.as_ref())? {
            summary.settled.push((id.to_string(), s));
        }
    }
    Ok(())
}

/// Runs in process that have ended are reaped; tasks whose run an earlier
/// dispatcher left are settled once their run is (settling it if nobody
/// else is).
async fn look_after_runs(
    api: &Api,
    opts: &DispatchOptions,
    watched: &mut Watched,
    summary: &mut DispatchSummary,
) -> Result<(), ApiError> {
    let Runner::InProcess(runner) = &opts.runner else {
        // Without a runner in process, a left run is settled by its
        // watchdog or by `nightshift reconcile`; its task says so now.
        for (id, _) in std::mem::take(&mut watched.runs) {
            let fence = watched.fences.remove(&id);
            let mut store = api.open_store()?;
            if let Some(task) = list(&store)?.into_iter().find(|t| t.id == id) {
                if let Some(s) = settle(&mut store, api.root(), &task, None, None, fence.as_ref())?
                {
                    summary.settled.push((id, s));
                }
            }
        }
        return Ok(());
    };
    let finished: Vec<String> = watched
        .own
        .iter()
        .filter(|(_, o)| matches!(o, Own::InProcess { handle, .. } if handle.is_finished()))
        .map(|(id, _)| id.clone())
        .collect();
    for id in finished {
        if let Some(Own::InProcess { run, handle, .. }) = watched.own.remove(&id) {
            let ended = handle.await;
            let fence = watched.fences.remove(&id);
            reap(api, runner, &id, &run, ended, summary, fence).await?;
        }
    }
    let left: Vec<(String, String)> = watched
        .runs
        .iter()
        .map(|(t, r)| (t.clone(), r.clone()))
        .collect();
    for (id, run) in left {
        let settled = run_record(api, &run)?
            .is_none_or(|r| nightshift_core::state_store::is_final(&r.status));
        if !settled {
            // Its watchdog may be at it; a claim decides who settles.
            let by = "supervisor start".to_string();
            let status = "lost: supervisor vanished".to_string();
            if let Err(e) = runner.settle(run.clone(), by, status).await {
                tracing::warn!(run = %run, error = %e, "settling a run left by a dispatcher");
            }
            continue;
        }
        watched.runs.remove(&id);
        let fence = watched.fences.remove(&id);
        let mut store = api.open_store()?;
        if let Some(task) = list(&store)?.into_iter().find(|t| t.id == id) {
            if let Some(s) = settle(&mut store, api.root(), &task, None, None, fence.as_ref())? {
                summary.settled.push((id, s));
            }
        }
    }
    Ok(())
}

/// The dispatcher: starts queued tasks in order, at most
/// `opts.max_parallel` at once, while not frozen and within the fleet's
/// caps; watches them and records how each ended. Returns when `stop` turns
/// true (children keep going and the next dispatcher adopts them; runs in
/// process are stopped and waited for) or, with `until_empty`, once nothing
/// is queued or running (or only a freeze keeps tasks queued).
pub async fn dispatch_loop(
    api: &Api,
    opts: &DispatchOptions,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<DispatchSummary, ApiError> {
    let config = api.load_config()?;
    if opts.max_parallel == 0 {
        return Err(bad("max_parallel must be at least 1"));
    }
    let me = crate::api::process_identity();
    let holder = new_holder(&me);
    let lease_secs = opts.lease_secs.max(1);
    let until = || unix_now().saturating_add(lease_secs);
    let mut summary = DispatchSummary::default();
    if let Runner::InProcess(runner) = &opts.runner {
        // Runs of a supervisor that vanished (an earlier serve's among
        // them) are settled before their tasks are looked at.
        if let Err(e) = runner.reconcile().await {
            tracing::warn!(error = %e, "reconciling at the dispatcher's start");
        }
    }
    let bound = elsewhere_bound(&config);
    let mut watched = Watched::default();
    {
        let mut store = api.open_store()?;
        let mut found = recover(&mut store, api.root(), &me, &holder, until(), bound)?;
        watched.take(&mut found, &mut summary);
    }
    let mut last_error: Option<String> = None;
    let every = Duration::from_millis((lease_secs as u64 * 1000 / 3).max(100));
    // Past half a lease without a renewal (one missed, the next not yet
    // due), this dispatcher's claims may lapse before it renews again: it
    // stops its runs first, with half a lease left for their sandboxes to
    // go (see `fence_timer`).
    let fence_at = Duration::from_millis(lease_secs as u64 * 1000 / 2);
    let mut renewed = std::time::Instant::now();
    // The fence does not wait for this loop: a turn can spend seconds in
    // store calls that fail one after another on a dead network, so a timer
    // of its own stops the runs once no renewal has succeeded for half a
    // lease (`fence_timer`).
    let renewed_at = Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
    let _fencer = matches!(opts.runner, Runner::InProcess(_)).then(|| {
        AbortOnDrop(tokio::spawn(fence_timer(
            renewed_at.clone(),
            watched.stops.clone(),
            fence_at,
            holder.clone(),
        )))
    });
    let (mut touched_at, mut touch_failed) = (None, false);
    let mut changes = crate::wake::subscribe();
    loop {
        touch_alive(api.root(), &mut touched_at, &mut touch_failed);
        if *stop.borrow() {
            summary.stopped = true;
            stop_runs(api, opts, &mut watched, &mut summary).await?;
            return Ok(summary);
        }
        let mut reached = false;
        let looked = match look_after_runs(api, opts, &mut watched, &mut summary).await {
            Ok(()) if renewed.elapsed() >= every => {
                renewed = std::time::Instant::now();
                let at = std::time::Instant::now();
                heartbeat(
                    api,
                    &me,
                    &holder,
                    until(),
                    bound,
                    &mut watched,
                    &mut summary,
                )
                .and_then(|()| {
                    *renewed_at.lock().unwrap_or_else(|p| p.into_inner()) = at;
                    reached = true;
                    step(api, &config, opts, &me, &holder, &mut watched, &mut summary)
                })
            }
            Ok(()) => step(api, &config, opts, &me, &holder, &mut watched, &mut summary),
            Err(e) => Err(e),
        };
        if let (true, Runner::InProcess(runner)) = (reached, &opts.runner) {
            import_kept(api, runner, &watched).await;
        }
        match looked {
            Ok(true) if opts.until_empty => return Ok(summary),
            Ok(_) => last_error = None,
            // Runs in process live in this loop: an error (the store busy
            // or unreadable for a while) is said once and tried again,
            // never a reason to leave them unwatched.
            Err(e) if matches!(opts.runner, Runner::InProcess(_)) => {
                let words = e.to_string();
                if last_error.as_deref() != Some(words.as_str()) {
                    tracing::error!(error = %words, "the run queue's dispatcher, trying again");
                    last_error = Some(words);
                }
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            _ = tokio::time::sleep(opts.poll) => {}
            _ = stop.changed() => {}
            _ = changes.changed() => {}
        }
    }
}

/// Every third of a lease: this dispatcher's leases renewed, and the tasks
/// of a dispatcher that died meanwhile taken over. A task whose lease was
/// taken over (this dispatcher stalled past it) is not watched any more: a
/// child is its new dispatcher's; a run in process is stopped (it may not
/// run on while another dispatcher holds its task) and still ends here,
/// but its task's moves keep the lost claim's fence, so the store refuses
/// them and the new claimant's decision stands.
#[allow(clippy::too_many_arguments)]
fn heartbeat(
    api: &Api,
    me: &str,
    holder: &str,
    until: i64,
    bound: Duration,
    watched: &mut Watched,
    summary: &mut DispatchSummary,
) -> Result<(), ApiError> {
    let mut store = api.open_store()?;
    let ids = watched.ids();
    if !ids.is_empty() {
        let held = store.renew_tasks(holder, &ids, until)?;
        for id in ids.iter().filter(|id| !held.contains(id)) {
            tracing::error!(task = %id, holder = %holder, "a task's lease was taken over: this dispatcher stalled past it");
            watched.children.remove(id);
            watched.runs.remove(id);
            watched.elsewhere.remove(id);
            if let Some(Own::InProcess { stop, .. }) = watched.own.get(id) {
                let _ = stop.send(Some(crate::run::Stop::Fenced));
            }
        }
    }
    let mut found = recover(&mut store, api.root(), me, holder, until, bound)?;
    watched.take(&mut found, summary);
    Ok(())
}

/// Aborts its task when dropped (the fence's timer ends with its loop).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The fence, on a timer of its own: this dispatcher could not renew its
/// claims for half their length (the store unreachable, or too slow), so
/// before they lapse and another dispatcher takes its tasks over, every run
/// in process it started that still runs is told to stop (`Stop::Fenced`:
/// each ends as `interrupted: fenced`, its sandbox removed; work the store
/// cannot take now stays in the kept worktree), whatever the dispatcher's
/// loop is waiting on; checked every quarter second. Children of `tasks
/// run` are `nightshift run` processes with watchdogs of their own and
/// stay: that dispatcher serves one host
/// (`tests/tests/workers.rs::three_workers_in_their_own_networks_lose_nothing_to_a_kill_and_a_partition`:
/// the partitioned worker's sandboxes are gone before its claims lapse).
async fn fence_timer(
    renewed_at: Arc<std::sync::Mutex<std::time::Instant>>,
    stops: Arc<std::sync::Mutex<Vec<(String, StopSender)>>>,
    fence_at: Duration,
    holder: String,
) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let late = renewed_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            >= fence_at;
        if !late {
            continue;
        }
        let stops = stops.lock().unwrap_or_else(|p| p.into_inner());
        for (task, stop) in stops.iter() {
            if !stop.is_closed() && stop.borrow().is_none() {
                tracing::error!(task = %task, holder = %holder, "this dispatcher could not renew its claim in time: stopping the task's run before the claim lapses");
                let _ = stop.send(Some(crate::run::Stop::Fenced));
            }
        }
    }
}

/// The worktrees this state keeps of runs another worker settled as lost
/// ([`crate::run::LOST_BY_WORKER`]: this worker was cut off from the store,
/// stopped its runs, and could not write their ends) are imported once the
/// store answers again, each through `nightshift import`'s path (one at a
/// time, under the state's import lock, and only once the engine confirms
/// no container of the run is left): the run keeps the settler's
/// decision and gains its result. Runs this dispatcher still watches, runs
/// not yet settled and runs ended otherwise are left alone; a failed import
/// makes the run `import failed` (the owner's `nightshift import` then)
/// and is not retried here
/// (`tests/tests/workers.rs::three_workers_in_their_own_networks_lose_nothing_to_a_kill_and_a_partition`).
async fn import_kept(api: &Api, runner: &Arc<dyn TaskRunner>, watched: &Watched) {
    let Ok(entries) = std::fs::read_dir(api.root().join("worktrees")) else {
        return;
    };
    let running: std::collections::HashSet<&str> = watched
        .own
        .values()
        .filter_map(|o| match o {
            Own::InProcess { run, .. } => Some(run.as_str()),
            Own::Child(_) => None,
        })
        .chain(watched.runs.values().map(String::as_str))
        .collect();
    for entry in entries.flatten() {
        let Some(run) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if running.contains(run.as_str()) || !entry.path().is_dir() {
            continue;
        }
        let Ok(store) = api.open_store() else {
            return;
        };
        let lost = store.run(&run).is_ok_and(|r| {
            r.status.starts_with(crate::run::LOST_BY_WORKER) && r.result_ref.is_none()
        });
        if !lost || !runner.sandbox_gone(run.clone()).await {
            continue;
        }
        let store = std::sync::Mutex::new(store);
        match crate::run::retry_import(&store, &run).await {
            Ok(r) => {
                tracing::info!(run = %run, result = ?r.result_ref, "imported the worktree this worker kept of a run settled as lost")
            }
            Err(e) => {
                tracing::warn!(run = %run, error = %e, "importing the worktree this worker kept of a run settled as lost")
            }
        }
    }
}

/// A stopping dispatcher's runs in process: asked to stop, and waited for
/// (each ends as `interrupted` through its own ending, its work imported).
async fn stop_runs(
    api: &Api,
    opts: &DispatchOptions,
    watched: &mut Watched,
    summary: &mut DispatchSummary,
) -> Result<(), ApiError> {
    let Runner::InProcess(runner) = &opts.runner else {
        return Ok(());
    };
    for own in watched.own.values() {
        if let Own::InProcess { stop, .. } = own {
            let _ = stop.send(Some(crate::run::Stop::Terminate));
        }
    }
    let ids: Vec<String> = watched.own.keys().cloned().collect();
    for id in ids {
        if let Some(Own::InProcess { run, handle, .. }) = watched.own.remove(&id) {
            let ended = handle.await;
            let fence = watched.fences.remove(&id);
            reap(api, runner, &id, &run, ended, summary, fence).await?;
        }
    }
    Ok(())
}

/// A run started in the foreground (`nightshift run`) as a task of the
/// queue: added already `starting` under this process's own lease
/// ([`TaskQueue::insert_started_task`]), so no dispatcher starts or takes
/// it while the run lives; the lease renewed every third of its length on
/// a thread of its own; the task settled from the run's record (or error)
/// when the run ends, as a dispatcher settles one of its runs in process.
/// A `nightshift run` killed with `kill -9` leaves the task whose lease
/// then lapses: the next dispatcher takes it over and settles it from its
/// run, as it does the tasks of a dispatcher that died.
#[derive(Debug)]
pub struct ForegroundTask {
    /// The task's id.
    pub id: String,
    fence: TaskFence,
    stop: Option<std::sync::mpsc::Sender<()>>,
    beat: Option<std::thread::JoinHandle<()>>,
}

/// The task a foreground run `run` is, made from what it was asked
/// (`req`), under a lease of `lease_secs`.
pub fn begin_foreground(
    api: &Api,
    req: &crate::run::RunRequest,
    run: &str,
    lease_secs: i64,
) -> Result<ForegroundTask, ApiError> {
    let caps = &req.caps;
    let spec = TaskSpec {
        repo: req.repo.clone(),
        base_ref: req.base_ref.clone(),
        image: Some(req.image.clone()),
        task: (!req.task.is_empty()).then(|| req.task.clone()),
        task_file: None,
        memory: Some(caps.memory_bytes.max(0).to_string()),
        cpus: Some(caps.nano_cpus as f64 / 1e9),
        pids: Some(caps.pids.max(0) as u64),
        timeout: Some(format!("{}s", caps.timeout.as_secs().max(1))),
        max_output: Some(caps.max_output_bytes.to_string()),
        max_worktree: Some(caps.max_worktree_bytes.to_string()),
        max_files: Some(caps.open_files.max(0) as u64),
        max_tokens: Some(caps.max_tokens),
        agent: None,
        model: None,
        dry_run: req.dry_run,
        retries: 0,
        command: req.command.clone(),
        continues: req.continues.clone(),
    };
    let spec =
        serde_json::to_string(&spec).map_err(|e| ApiError::caused(ErrorKind::Internal, e))?;
    let me = crate::api::process_identity();
    let holder = format!("run {me} {run}");
    let id = format!("task-{}", ulid::Ulid::new().to_string().to_lowercase());
    let p = Progress {
        dispatcher: Some(me),
        run: Some(run.to_string()),
        in_process: true,
        started_at: Some(nightshift_core::state_store::now_rfc3339()),
        ..Default::default()
    };
    let root = api.root();
    let dir = task_dir(root, &id);
    nightshift_core::state_store::create_private_dir(&root.join("tasks"))?;
    nightshift_core::state_store::create_private_dir(&dir)?;
    create(&dir, "result.json")?;
    create(&dir, "stderr.log")?;
    let lease_secs = lease_secs.max(1);
    let until = move || unix_now().saturating_add(lease_secs);
    // Every foreground run is admitted here: its own checks (the fleet's
    // processes, `admit_pids`) were made before, as they always were.
    let mut store = api.open_store()?;
    store.insert_started_task(
        &id,
        &spec,
        &progress_json(&p),
        &holder,
        until(),
        &mut |_| true,
    )?;
    // Nothing is spawned for it: it runs as soon as it is there.
    let fence = TaskFence {
        holder: holder.clone(),
        generation: 1,
    };
    store.move_task(
        &id,
        &["starting"],
        "running",
        &progress_json(&p),
        Some(&fence),
    )?;
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let every = Duration::from_millis((lease_secs as u64 * 1000 / 3).max(100));
    let (beat_holder, beat_id) = (holder.clone(), id.clone());
    let beat = std::thread::Builder::new()
        .name("task lease".into())
        .spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                let held = store.renew_tasks(&beat_holder, std::slice::from_ref(&beat_id), until());
                if !matches!(held.as_deref(), Ok([_])) {
                    tracing::warn!(task = %beat_id, "a foreground run's task lease could not be renewed");
                }
            }
        })
        .map_err(|e| ApiError::caused(ErrorKind::Internal, e))?;
    Ok(ForegroundTask {
        id,
        fence,
        stop: Some(stop),
        beat: Some(beat),
    })
}

impl ForegroundTask {
    /// Ends the task from how its run ended: the run's record, or the exit
    /// code and words of its error.
    pub fn end(
        mut self,
        api: &Api,
        ended: Result<&RunRecord, (i32, String)>,
    ) -> Result<(), ApiError> {
        self.stop_beat();
        let dir = task_dir(api.root(), &self.id);
        let write = |name: &str, bytes: &[u8]| {
            let f = dir.join(name);
            std::fs::write(&f, bytes).map_err(|e| {
                ApiError::new(ErrorKind::State, format!("writing {}: {e}", f.display()))
            })
        };
        let exit = match ended {
            Ok(record) => {
                let json = serde_json::to_vec_pretty(record)
                    .map_err(|e| ApiError::caused(ErrorKind::Internal, e))?;
                write("result.json", &json)?;
                None
            }
            Err((code, words)) => {
                write("stderr.log", format!("nightshift: {words}\n").as_bytes())?;
                Some(code)
            }
        };
        let mut store = api.open_store()?;
        if let Some(task) = list(&store)?.into_iter().find(|t| t.id == self.id) {
            settle(&mut store, api.root(), &task, exit, None, Some(&self.fence))?;
        }
        Ok(())
    }

    fn stop_beat(&mut self) {
        drop(self.stop.take());
        if let Some(beat) = self.beat.take() {
            let _ = beat.join();
        }
    }
}

impl Drop for ForegroundTask {
    fn drop(&mut self) {
        self.stop_beat();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_core::state_store::fake::MemStore;
    use nightshift_core::state_store::TaskQueue;
    use proptest::prelude::*;

    /// A fake state holding one task, moved to `state` with `progress`.
    fn one_task(dir: &Path, state: &str, progress: &Progress) -> (MemStore, String) {
        let mut store = MemStore::new(dir);
        let config = nightshift_core::config::Config::default();
        let id = enqueue(&mut store, &config, &[spec(dir)])
            .unwrap()
            .remove(0);
        assert!(store
            .move_task(&id, &["queued"], state, &progress_json(progress), None)
            .unwrap());
        (store, id)
    }

    fn the_task(store: &MemStore) -> TaskRow {
        list(store).unwrap().remove(0)
    }

    /// A process identity that is certainly not alive.
    const GONE: &str = "4194304:1";

    fn record(id: &str, status: &str, supervisor: &str) -> RunRecord {
        RunRecord {
            id: id.into(),
            status: status.into(),
            exit_code: Some(0),
            supervisor: Some(supervisor.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_task_caught_starting_before_its_spawn_goes_back_to_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = one_task(dir.path(), "starting", &Progress::default());
        let Recovered {
            children: adopted,
            settled,
            ..
        } = recover(&mut store, dir.path(), "me", "me", 0, Duration::ZERO).unwrap();
        assert!(adopted.is_empty() && settled.is_empty());
        assert_eq!(the_task(&store).state, TaskState::Queued);
    }

    #[test]
    fn a_task_whose_child_ended_unseen_is_settled_from_its_result_once() {
        let dir = tempfile::tempdir().unwrap();
        let progress = Progress {
            child: Some(GONE.into()),
            ..Default::default()
        };
        let (mut store, id) = one_task(dir.path(), "running", &progress);
        let tdir = task_dir(dir.path(), &id);
        std::fs::create_dir_all(&tdir).unwrap();
        std::fs::write(
            tdir.join("result.json"),
            serde_json::to_vec(&record("r1", "exited 0", GONE)).unwrap(),
        )
        .unwrap();
        let Recovered {
            children: adopted,
            settled,
            ..
        } = recover(&mut store, dir.path(), "me", "me", 0, Duration::ZERO).unwrap();
        assert!(adopted.is_empty());
        assert_eq!(settled, [(id.clone(), TaskState::Done)]);
        let t = the_task(&store);
        assert_eq!(t.state, TaskState::Done);
        assert_eq!(t.progress.run.as_deref(), Some("r1"));
        assert_eq!(t.progress.exit_code, Some(0));
        // A second dispatcher finds nothing left to do.
        let Recovered {
            children: adopted,
            settled,
            ..
        } = recover(&mut store, dir.path(), "other", "other", 0, Duration::ZERO).unwrap();
        assert!(adopted.is_empty() && settled.is_empty());
    }

    #[test]
    fn a_run_left_unsettled_fails_its_task_naming_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let progress = Progress {
            child: Some(GONE.into()),
            ..Default::default()
        };
        let (mut store, _) = one_task(dir.path(), "running", &progress);
        store.runs.push(record("r2", "running", GONE));
        recover(&mut store, dir.path(), "me", "me", 0, Duration::ZERO).unwrap();
        let t = the_task(&store);
        assert_eq!(t.state, TaskState::Failed);
        assert_eq!(t.progress.run.as_deref(), Some("r2"));
        assert!(t.progress.reason.unwrap().contains("reconcile"));
    }

    #[test]
    fn a_start_refused_by_a_late_freeze_waits_again() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = one_task(dir.path(), "running", &Progress::default());
        let task = the_task(&store);
        let moved = settle(
            &mut store,
            dir.path(),
            &task,
            Some(nightshift_core::exit::DENIED),
            None,
            None,
        )
        .unwrap();
        assert_eq!(moved, Some(TaskState::Queued));
        // Any other ending without a run fails the task.
        let (mut store, _) = one_task(dir.path(), "running", &Progress::default());
        let task = the_task(&store);
        let moved = settle(
            &mut store,
            dir.path(),
            &task,
            Some(nightshift_core::exit::BAD_INPUT),
            None,
            None,
        )
        .unwrap();
        assert_eq!(moved, Some(TaskState::Failed));
    }

    #[test]
    fn a_living_child_is_adopted_and_names_its_new_dispatcher() {
        let dir = tempfile::tempdir().unwrap();
        let me = crate::api::process_identity();
        let progress = Progress {
            child: Some(me.clone()),
            dispatcher: Some(GONE.into()),
            ..Default::default()
        };
        let (mut store, id) = one_task(dir.path(), "running", &progress);
        let Recovered {
            children: adopted,
            settled,
            ..
        } = recover(&mut store, dir.path(), "new", "new", 0, Duration::ZERO).unwrap();
        assert!(settled.is_empty());
        assert_eq!(adopted.get(&id), Some(&me));
        let t = the_task(&store);
        assert_eq!(t.state, TaskState::Running);
        assert_eq!(t.progress.dispatcher.as_deref(), Some("new"));
    }

    #[test]
    fn tasks_of_a_vanished_dispatcher_in_process_are_settled_from_their_runs() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        let config = nightshift_core::config::Config::default();
        let specs = [spec(dir.path()), spec(dir.path()), spec(dir.path())];
        let ids = enqueue(&mut store, &config, &specs).unwrap();
        for (id, run) in ids.iter().zip(["ended", "never", "going"]) {
            let p = Progress {
                dispatcher: Some(GONE.into()),
                run: Some(run.into()),
                in_process: true,
                ..Default::default()
            };
            assert!(store
                .move_task(id, &["queued"], "running", &progress_json(&p), None)
                .unwrap());
        }
        store
            .runs
            .push(record("ended", "lost: supervisor vanished", GONE));
        store.runs.push(record("going", "running", GONE));
        let found = recover(&mut store, dir.path(), "me", "me", 0, Duration::ZERO).unwrap();
        // Ended: settled from its run. Never recorded: nothing ran, queued
        // again. Not settled yet: watched until its run is.
        assert_eq!(found.settled, [(ids[0].clone(), TaskState::Done)]);
        assert_eq!(found.runs.get(&ids[2]).map(String::as_str), Some("going"));
        assert!(found.children.is_empty());
        let tasks = list(&store).unwrap();
        assert_eq!(
            tasks[0].progress.status.as_deref(),
            Some("lost: supervisor vanished")
        );
        assert_eq!(tasks[1].state, TaskState::Queued);
        assert_eq!(tasks[1].progress, Progress::default());
        assert_eq!(tasks[2].state, TaskState::Running);
        assert_eq!(tasks[2].progress.dispatcher.as_deref(), Some("me"));
    }

    /// Runs tasks by their text: `panic` panics with its run recorded
    /// `running`, `fail` fails before any run, anything else exits 0.
    struct Scripted {
        root: PathBuf,
        settled: std::sync::Mutex<Vec<(String, String)>>,
    }

    impl TaskRunner for Scripted {
        fn run(
            &self,
            task: TaskRow,
            run: String,
            _stop: tokio::sync::watch::Receiver<Option<crate::run::Stop>>,
        ) -> BoxFuture<'static, RunOutcome> {
            let root = self.root.clone();
            Box::pin(async move {
                let mut r = record(&run, "running", "me");
                match task.spec.task.as_deref() {
                    Some("panic") => {
                        let paths = nightshift_core::state_store::StatePaths::new(root);
                        nightshift_store_sqlite::store::Store::open(paths)
                            .unwrap()
                            .put_run(&r)
                            .unwrap();
                        panic!("boom in {run}");
                    }
                    Some("fail") => {
                        Err((nightshift_core::exit::IMAGE_MISSING, "no such image".into()))
                    }
                    _ => {
                        r.status = "exited 0".into();
                        Ok(r)
                    }
                }
            })
        }

        fn settle(
            &self,
            run: String,
            by: String,
            status: String,
        ) -> BoxFuture<'static, Result<bool, String>> {
            self.settled
                .lock()
                .unwrap()
                .push((run.clone(), status.clone()));
            let paths = nightshift_core::state_store::StatePaths::new(self.root.clone());
            Box::pin(async move {
                let store = nightshift_store_sqlite::store::Store::open(paths)
                    .map_err(|e| e.to_string())?;
                let mut r = record(&run, &status, "me");
                r.reason = Some(format!("settled by {by}"));
                store.put_run(&r).map_err(|e| e.to_string())?;
                Ok(true)
            })
        }

        fn reconcile(&self) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// A dispatcher whose poll is an hour starts a task enqueued through
    /// the API while it waits, and settles a run in process as it ends:
    /// only the wake-ups can move it (without them this test times out).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_enqueue_wakes_a_dispatcher_before_its_poll() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let api = Arc::new(Api::new(
            Arc::new(nightshift_store_sqlite::store::SqliteBackend::new(
                root.clone(),
                None,
            )),
            None,
        ));
        let store = api.open_store().unwrap();
        let runner = Arc::new(Scripted {
            root: root.clone(),
            settled: Default::default(),
        });
        let opts = DispatchOptions {
            max_parallel: 2,
            runner: Runner::InProcess(runner),
            poll: Duration::from_secs(3600),
            until_empty: false,
            lease_secs: 30,
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let api2 = api.clone();
        let dispatcher = tokio::spawn(async move { dispatch_loop(&api2, &opts, stopped).await });
        let states =
            || -> Vec<TaskState> { list(&store).unwrap().iter().map(|t| t.state).collect() };
        let until = |want: Vec<TaskState>| {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while states() != want {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the queue is {:?}, not {want:?}: the dispatcher was not woken",
                    states()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        for n in 1..=3 {
            // The dispatcher is waiting in its poll by now (its first turn,
            // or the last task's settling, is long over).
            tokio::time::sleep(Duration::from_millis(300)).await;
            api.execute(crate::api::Command::Enqueue {
                tasks: vec![spec(dir.path())],
            })
            .await
            .unwrap();
            let want = vec![TaskState::Done; n];
            tokio::task::block_in_place(|| until(want));
        }
        stop.send(true).unwrap();
        let summary = dispatcher.await.unwrap().unwrap();
        assert_eq!(summary.started.len(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_or_failure_in_one_run_in_process_ends_only_its_task() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let api = Api::new(
            Arc::new(nightshift_store_sqlite::store::SqliteBackend::new(
                root.clone(),
                None,
            )),
            None,
        );
        let mut store = api.open_store().unwrap();
        let config = nightshift_core::config::Config::default();
        let with = |text: &str| TaskSpec {
            task: Some(text.into()),
            ..spec(dir.path())
        };
        let ids = enqueue(
            &mut store,
            &config,
            &[with("panic"), with("fine"), with("fail"), with("fine")],
        )
        .unwrap();
        let runner = Arc::new(Scripted {
            root: root.clone(),
            settled: Default::default(),
        });
        let opts = DispatchOptions {
            max_parallel: 4,
            runner: Runner::InProcess(runner.clone()),
            poll: Duration::from_millis(10),
            until_empty: true,
            lease_secs: 30,
        };
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let summary = dispatch_loop(&api, &opts, stopped).await.unwrap();
        assert_eq!(summary.started, ids);
        let tasks = list(&store).unwrap();
        let states: Vec<TaskState> = tasks.iter().map(|t| t.state).collect();
        use TaskState::{Done, Failed};
        assert_eq!(states, [Failed, Done, Failed, Done]);
        // The panic: its task failed with the panic's words, its run
        // settled as an orphan's would be, and named.
        let panicked = &tasks[0].progress;
        let run = panicked.run.clone().unwrap();
        assert!(
            panicked
                .reason
                .as_deref()
                .unwrap()
                .contains("panicked: boom in"),
            "{panicked:?}"
        );
        assert_eq!(
            panicked.status.as_deref(),
            Some("error: its run panicked: boom in ".to_string() + &run).as_deref()
        );
        assert_eq!(
            *runner.settled.lock().unwrap(),
            [(
                run.clone(),
                format!("error: its run panicked: boom in {run}")
            )]
        );
        // The failure: its exit code and words, as `nightshift run` gives them.
        assert_eq!(
            tasks[2].progress.exit_code,
            Some(nightshift_core::exit::IMAGE_MISSING)
        );
        assert_eq!(
            tasks[2].progress.reason.as_deref(),
            Some("nightshift: no such image")
        );
        // The others ran to their end, their records in their result files.
        for t in [&tasks[1], &tasks[3]] {
            assert_eq!(t.progress.status.as_deref(), Some("exited 0"), "{t:?}");
            let result = std::fs::read(task_dir(&root, &t.id).join("result.json")).unwrap();
            let r: RunRecord = serde_json::from_slice(&result).unwrap();
            assert_eq!(Some(r.id), t.progress.run);
        }
    }

    /// Hands the test each ERROR event as it is emitted (its fields, as
    /// `name=value` words): the dispatcher's own report that its loop erred.
    struct Errors(tokio::sync::mpsc::UnboundedSender<String>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Errors {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Words(String);
            impl tracing::field::Visit for Words {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    self.0 += &format!("{}={value:?} ", field.name());
                }
            }
            if *event.metadata().level() == tracing::Level::ERROR {
                let mut words = Words(String::new());
                event.record(&mut words);
                let _ = self.0.send(words.0);
            }
        }
    }

    /// The dispatcher meets an error in its loop (a policy nobody can read),
    /// says so and goes on: once the policy is readable again, the same
    /// dispatcher runs the task. The test moves on the dispatcher's own
    /// report of the error, never on a sleep: on one thread, the report
    /// reaches the test while the dispatcher waits to look again.
    #[tokio::test(flavor = "current_thread")]
    async fn a_dispatcher_in_process_outlasts_an_error_in_its_loop() {
        use tracing_subscriber::layer::SubscriberExt;
        let (said, mut errors) = tokio::sync::mpsc::unbounded_channel();
        let _log =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(Errors(said)));
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let api = Api::new(
            Arc::new(nightshift_store_sqlite::store::SqliteBackend::new(
                root.clone(),
                None,
            )),
            None,
        );
        let mut store = api.open_store().unwrap();
        let config = nightshift_core::config::Config::default();
        enqueue(&mut store, &config, &[spec(dir.path())]).unwrap();
        // A policy nobody can read: nothing may start, and the loop errs.
        std::fs::create_dir_all(root.join("rules")).unwrap();
        std::fs::write(root.join("rules/broken.toml"), "[[rule]\n").unwrap();
        let runner = Arc::new(Scripted {
            root: root.clone(),
            settled: Default::default(),
        });
        let opts = DispatchOptions {
            max_parallel: 1,
            runner: Runner::InProcess(runner),
            poll: Duration::from_millis(10),
            until_empty: true,
            lease_secs: 30,
        };
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let api2 = api.clone();
        let mut dispatcher =
            tokio::spawn(async move { dispatch_loop(&api2, &opts, stopped).await });
        let said = tokio::select! {
            said = errors.recv() => said.unwrap(),
            ended = &mut dispatcher => panic!("the dispatcher ended before saying it erred: {ended:?}"),
        };
        assert!(
            said.contains("trying again") && said.contains("broken.toml"),
            "{said}"
        );
        assert!(
            !dispatcher.is_finished(),
            "the dispatcher ended at its error"
        );
        assert_eq!(list(&store).unwrap()[0].state, TaskState::Queued);
        // Readable again: the same dispatcher goes on and runs the task.
        std::fs::remove_dir_all(root.join("rules")).unwrap();
        let summary = dispatcher.await.unwrap().unwrap();
        assert_eq!(summary.started.len(), 1);
        assert_eq!(list(&store).unwrap()[0].state, TaskState::Done);
    }

    fn n(m: u64, c: u64, p: u64) -> Need {
        Need {
            memory_bytes: m,
            milli_cpus: c,
            pids: p,
        }
    }

    fn sum(v: &[Need]) -> Need {
        v.iter().fold(n(0, 0, 0), |a, b| a.plus(*b))
    }

    #[test]
    fn the_head_waits_rather_than_being_overtaken() {
        let fleet = n(10, 10, 10);
        // The second does not fit beside the first; the small third waits too.
        assert_eq!(
            admit(&[n(6, 1, 1), n(6, 1, 1), n(1, 1, 1)], &[], fleet, 4),
            1
        );
        assert_eq!(admit(&[n(1, 1, 1); 5], &[n(1, 1, 1)], fleet, 3), 2);
        // Alone and too big: it starts when nothing runs, never beside another.
        assert_eq!(admit(&[n(20, 1, 1)], &[], fleet, 2), 1);
        assert_eq!(admit(&[n(20, 1, 1)], &[n(1, 1, 1)], fleet, 2), 0);
    }

    #[test]
    fn no_run_asks_for_more_than_the_fleet() {
        let fleet = n(10, 10, 10);
        assert!(within_fleet(n(10, 10, 10), fleet).is_ok());
        let e = within_fleet(n(1, 1, 11), fleet).unwrap_err();
        assert!(e.contains("pids 11") && e.contains("[fleet] pids"), "{e}");
        assert!(within_fleet(n(11, 1, 1), fleet).is_err());
        assert!(within_fleet(n(1, 11, 1), fleet).is_err());
    }

    #[test]
    fn a_run_outside_the_queue_is_admitted_only_within_the_fleets_processes() {
        assert!(admit_pids(300, &[300], 600).is_ok());
        let e = admit_pids(301, &[300], 600).unwrap_err();
        assert!(
            e.contains("300 of its 600") && e.contains("asks for 301"),
            "{e}"
        );
        assert!(admit_pids(600, &[], 600).is_ok());
        assert!(admit_pids(1, &[u64::MAX, 1], 600).is_err());
    }

    proptest! {
        /// However runs arrive, those admitted never hold more than the
        /// fleet's processes together.
        #[test]
        fn admitted_runs_never_hold_more_than_the_fleet(
            asks in proptest::collection::vec(1u64..400, 1..30),
        ) {
            let fleet = 600;
            let mut running: Vec<u64> = Vec::new();
            for ask in asks {
                if admit_pids(ask, &running, fleet).is_ok() {
                    running.push(ask);
                }
                prop_assert!(running.iter().sum::<u64>() <= fleet);
            }
        }
    }

    fn need_strategy() -> impl Strategy<Value = Need> {
        (1u64..8, 1u64..8, 1u64..8).prop_map(|(m, c, p)| n(m, c, p))
    }

    proptest! {
        #[test]
        fn admission_keeps_order_parallelism_and_the_fleet(
            queued in proptest::collection::vec(need_strategy(), 0..12),
            running in proptest::collection::vec(need_strategy(), 0..5),
            fleet in (1u64..30, 1u64..30, 1u64..30).prop_map(|(m, c, p)| n(m, c, p)),
            max_parallel in 1usize..6,
        ) {
            let k = admit(&queued, &running, fleet, max_parallel);
            prop_assert!(k <= queued.len());
            if k > 0 {
                prop_assert!(running.len() + k <= max_parallel);
                let all: Vec<Need> = running.iter().chain(&queued[..k]).copied().collect();
                // Within the fleet, or a single task alone.
                prop_assert!(sum(&all).within(fleet) || (running.is_empty() && k == 1));
            }
            // Maximal: the next one in order would break a rule.
            if k < queued.len() && running.len() + k < max_parallel {
                let mut all: Vec<Need> = running.iter().chain(&queued[..=k]).copied().collect();
                prop_assert!(!sum(&all).within(fleet) && !all.is_empty());
                all.clear();
            }
        }
    }

    fn spec(repo: &Path) -> TaskSpec {
        TaskSpec {
            repo: repo.to_path_buf(),
            base_ref: "HEAD".into(),
            image: None,
            task: None,
            task_file: None,
            memory: None,
            cpus: None,
            pids: None,
            timeout: None,
            max_output: None,
            max_worktree: None,
            max_files: None,
            max_tokens: None,
            agent: None,
            model: None,
            dry_run: false,
            retries: 0,
            command: vec!["true".into()],
            continues: None,
        }
    }

    #[test]
    fn a_queued_task_is_cancelled_once_and_a_started_one_never() {
        let dir = tempfile::tempdir().unwrap();
        // The real store: its compare-and-set is what makes this hold.
        let mut store = nightshift_store_sqlite::store::Store::open(
            nightshift_core::state_store::StatePaths::new(dir.path().join("s")),
        )
        .unwrap();
        let config = nightshift_core::config::Config::default();
        let ids = enqueue(&mut store, &config, &[spec(dir.path()), spec(dir.path())]).unwrap();
        cancel(&mut store, &ids[0]).unwrap();
        let again = cancel(&mut store, &ids[0]).unwrap_err();
        assert_eq!(again.kind, ErrorKind::Failed, "{again}");
        // Taken by a dispatcher first: the cancel loses, the start stands.
        assert!(store
            .move_task(&ids[1], &["queued"], "starting", "{}", None)
            .unwrap());
        assert_eq!(
            cancel(&mut store, &ids[1]).unwrap_err().kind,
            ErrorKind::Failed
        );
        assert_eq!(
            cancel(&mut store, "task-nope").unwrap_err().kind,
            ErrorKind::NotFound
        );
        let states: Vec<TaskState> = list(&store).unwrap().iter().map(|t| t.state).collect();
        assert_eq!(states, [TaskState::Cancelled, TaskState::Starting]);
    }

    #[test]
    fn enqueue_is_all_or_none_and_names_the_bad_task() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        let config = nightshift_core::config::Config::default();
        let mut broken = spec(dir.path());
        broken.memory = Some("lots".into());
        let e = enqueue(&mut store, &config, &[spec(dir.path()), broken]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadInput);
        assert!(e.message.starts_with("task 2: memory:"), "{e}");
        assert!(list(&store).unwrap().is_empty());
    }

    #[test]
    fn a_tasks_file_names_the_line_and_refuses_unknown_fields() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tasks.toml");
        std::fs::write(&f, "[[task]]\nrepo = \".\"\ncommand = [\"true\"]\n\n[[task]]\nrepo = \".\"\nmemroy = \"1g\"\ncommand = [\"true\"]\n").unwrap();
        let e = read_task_file(&f).unwrap_err();
        assert!(e.message.contains("line 7"), "{e}");
        assert!(e.message.contains("memroy"), "{e}");
        std::fs::write(
            &f,
            "[[task]]\nrepo = \"sub\"\ntask_file = \"t.txt\"\ncommand = [\"true\"]\n",
        )
        .unwrap();
        let t = read_task_file(&f).unwrap();
        assert_eq!(t[0].repo, dir.path().join("sub"));
        assert_eq!(
            t[0].task_file.as_deref(),
            Some(dir.path().join("t.txt").as_path())
        );
    }

    #[test]
    fn the_example_tasks_file_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/tasks.example.toml");
        let tasks = read_task_file(&path).unwrap();
        assert!(!tasks.is_empty());
    }

    /// A fake state with `n` queued tasks, in order.
    fn queued(dir: &Path, n: usize) -> (MemStore, Vec<String>) {
        let mut store = MemStore::new(dir);
        let config = nightshift_core::config::Config::default();
        let specs: Vec<TaskSpec> = (0..n).map(|_| spec(dir)).collect();
        let ids = enqueue(&mut store, &config, &specs).unwrap();
        (store, ids)
    }

    fn ids(due: &Due) -> Vec<&str> {
        due.start.iter().map(|t| t.id.as_str()).collect()
    }

    #[test]
    fn the_queue_starts_in_order_counting_what_already_runs() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, ids_) = queued(dir.path(), 4);
        let config = nightshift_core::config::Config::default();
        // The first is running under this dispatcher: one more may start.
        assert!(store
            .move_task(&ids_[0], &["queued"], "running", "{}", None)
            .unwrap());
        let all = list(&store).unwrap();
        let due = due(&all, &config, 2, None);
        assert_eq!(ids(&due), [ids_[1].as_str()]);
        assert_eq!((due.queued, due.frozen), (3, None));
    }

    /// The fleet's budget is shared: every dispatcher's running tasks count
    /// against it (whichever dispatcher looks decides the same).
    #[test]
    fn every_dispatchers_tasks_count_against_the_fleet() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, ids_) = queued(dir.path(), 3);
        let config = nightshift_core::config::Config::default();
        let fleet = fleet_need(&config);
        let one = need(&list(&store).unwrap()[0].spec, &config);
        // How many of these tasks the fleet takes at once.
        let fits = [
            fleet.memory_bytes / one.memory_bytes.max(1),
            fleet.milli_cpus / one.milli_cpus.max(1),
            fleet.pids / one.pids.max(1),
        ]
        .into_iter()
        .min()
        .unwrap() as usize;
        assert!(fits >= 1);
        assert!(store
            .move_task(&ids_[0], &["queued"], "running", "{}", None)
            .unwrap());
        let all = list(&store).unwrap();
        let due = due(&all, &config, 100, None);
        assert_eq!(due.start.len(), (fits - 1).min(2));
    }

    #[test]
    fn a_frozen_queue_starts_nothing_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = queued(dir.path(), 2);
        let config = nightshift_core::config::Config::default();
        let all = list(&store).unwrap();
        let due = due(&all, &config, 4, Some("night off".into()));
        assert!(due.start.is_empty(), "{due:?}");
        assert_eq!(due.queued, 2);
        assert_eq!(due.frozen.as_deref(), Some("night off"));
    }

    #[test]
    fn an_unreadable_policy_starts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = queued(dir.path(), 1);
        store.policy_rows = vec![serde_json::json!({"not": "a row"})];
        assert!(frozen(&store).is_err());
    }
}
