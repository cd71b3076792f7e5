//! The run queue's tasks and admission: what a task is ([`TaskSpec`],
//! read from a tasks file and resolved against the configuration), its
//! states and progress, the queue's operations on the store ([`enqueue`],
//! [`list`], [`cancel`]), and admission ([`admit`], [`within_fleet`],
//! [`admit_pids`]): pure decisions over what is queued and running and the
//! fleet's caps. The dispatcher that starts admitted tasks is
//! `run_queue`.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorKind};
use nightshift_core::state_store::StateStore;
use nightshift_core::state_store::StoredTask;

/// How many tasks one `enqueue` may add.
pub const MAX_TASKS_PER_ENQUEUE: usize = 10_000;
/// The largest task text (or task file) accepted.
pub const MAX_TASK_TEXT: usize = 1 << 20;
/// The largest tasks file accepted.
pub const MAX_TASK_FILE: u64 = 16 << 20;

/// One task, as enqueued (the command line's flags, a `[[task]]` table of a
/// tasks file, or the JSON API). Caps left out take the configuration's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// The host repository.
    pub repo: PathBuf,
    /// The base ref (branch, tag or commit).
    #[serde(rename = "ref", default = "head")]
    pub base_ref: String,
    /// A local image (default: the built default image when it starts).
    #[serde(default)]
    pub image: Option<String>,
    /// The task text given to the agent.
    #[serde(default)]
    pub task: Option<String>,
    /// Read the task text from this file when enqueued (it is stored then;
    /// later changes to the file do not reach the task).
    #[serde(default)]
    pub task_file: Option<PathBuf>,
    #[serde(default)]
    pub memory: Option<String>,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub pids: Option<u64>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub max_output: Option<String>,
    #[serde(default)]
    pub max_worktree: Option<String>,
    #[serde(default)]
    pub max_files: Option<u64>,
    /// Model tokens the run may spend through the gateway.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// A real agent by its preset (`nightshift run --agent`): its image,
    /// command line and environment; then `command` stays empty.
    #[serde(default)]
    pub agent: Option<String>,
    /// The model the preset's agent asks for.
    #[serde(default)]
    pub model: Option<String>,
    /// How many times the task runs again when its run was lost with its
    /// worker (the worker stopped renewing its claim: dead, or cut off from
    /// the store), as a new run from the same base; 0 (the default): a lost
    /// run fails its task. A run that ended on its own is never retried.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
    /// A dry run (`nightshift run --dry-run`): every act answered as it
    /// would have been and recorded, none queued or carried out.
    #[serde(default)]
    pub dry_run: bool,
    /// The agent command and its arguments (none with `agent`).
    #[serde(default)]
    pub command: Vec<String>,
    /// The capped run this task continues (`nightshift continue`): set by
    /// the supervisor, which audits the link on both runs when the task's
    /// run is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<String>,
}

pub(crate) fn head() -> String {
    "HEAD".into()
}

/// A tasks file: `[[task]]` tables, started in the order written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskFile {
    task: Vec<TaskSpec>,
}

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Queued,
    Starting,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl TaskState {
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Starting => "starting",
            TaskState::Running => "running",
            TaskState::Done => "done",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            TaskState::Queued,
            TaskState::Starting,
            TaskState::Running,
            TaskState::Done,
            TaskState::Failed,
            TaskState::Cancelled,
        ]
        .into_iter()
        .find(|t| t.name() == s)
    }
}

/// What happened to a task once taken from the queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The dispatcher that took it (`pid:starttime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatcher: Option<String>,
    /// Its `nightshift run` process (`pid:starttime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// The run it became (for a run in process, chosen before it begins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Run in the dispatcher's process (see the module's note).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_process: bool,
    /// The run's status when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The exit code `nightshift run` gave (README.md's table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it failed or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The attempts lost with their worker so far (see `TaskSpec::retries`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
}

/// One task as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRow {
    pub id: String,
    pub seq: i64,
    pub state: TaskState,
    pub spec: TaskSpec,
    pub progress: Progress,
    pub created_at: String,
    pub updated_at: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub(crate) fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::BadInput, message)
}

/// Reads a tasks file: `[[task]]` tables; paths in it are relative to the
/// file's directory. Errors name the file and the line.
pub fn read_task_file(path: &Path) -> Result<Vec<TaskSpec>, ApiError> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TASK_FILE + 1).read_to_string(&mut text))
        .map_err(|e| bad(format!("reading the tasks file {}: {e}", path.display())))?;
    if text.len() as u64 > MAX_TASK_FILE {
        return Err(bad(format!(
            "reading the tasks file {}: larger than {MAX_TASK_FILE} bytes",
            path.display()
        )));
    }
    let file: TaskFile = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
            .unwrap_or(1);
        bad(format!(
            "reading the tasks file {}: line {line}: {}",
            path.display(),
            e.message()
        ))
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    Ok(file
        .task
        .into_iter()
        .map(|mut t| {
            if t.repo.is_relative() {
                t.repo = dir.join(&t.repo);
            }
            if let Some(f) = t.task_file.as_mut() {
                if f.is_relative() {
                    *f = dir.join(&*f);
                }
            }
            t
        })
        .collect())
}

/// Checks one task and makes it self-contained: the repository's path made
/// absolute, the task file read into the task text, every cap parsed.
pub fn resolve(
    spec: &TaskSpec,
    config: &nightshift_core::config::Config,
    which: usize,
) -> Result<TaskSpec, ApiError> {
    let at = |m: String| bad(format!("task {which}: {m}"));
    let mut out = spec.clone();
    match (&spec.agent, spec.command.first()) {
        (None, None) => return Err(at("no agent command (and no --agent preset)".into())),
        (None, Some(c)) if c.is_empty() => return Err(at("no agent command".into())),
        (Some(_), Some(_)) => {
            return Err(at(
                "an agent preset and a command: the preset brings its own command".into(),
            ))
        }
        (Some(name), None) => {
            if let Err(e) = nightshift_engine_docker::image::Agent::from_name(name) {
                return Err(at(e));
            }
        }
        _ => {}
    }
    out.repo = spec
        .repo
        .canonicalize()
        .map_err(|e| at(format!("the repository {}: {e}", spec.repo.display())))?;
    if !out.repo.is_dir() {
        return Err(at(format!("{} is not a directory", out.repo.display())));
    }
    if spec.base_ref.is_empty() || spec.base_ref.starts_with('-') {
        return Err(at(format!("{:?} is not a ref", spec.base_ref)));
    }
    if let Some(image) = &spec.image {
        if image.is_empty() || image.starts_with('-') {
            return Err(at(format!("{image:?} is not an image")));
        }
    }
    match (&spec.task, &spec.task_file) {
        (Some(_), Some(_)) => return Err(at("give task or task_file, not both".into())),
        (None, Some(f)) => {
            let mut text = String::new();
            std::fs::File::open(f)
                .and_then(|h| h.take(MAX_TASK_TEXT as u64 + 1).read_to_string(&mut text))
                .map_err(|e| at(format!("reading the task file {}: {e}", f.display())))?;
            out.task = Some(text);
            out.task_file = None;
        }
        _ => {}
    }
    if out.task.as_ref().is_some_and(|t| t.len() > MAX_TASK_TEXT) {
        return Err(at(format!(
            "the task text is larger than {MAX_TASK_TEXT} bytes"
        )));
    }
    for (name, value) in [
        ("memory", &spec.memory),
        ("max_output", &spec.max_output),
        ("max_worktree", &spec.max_worktree),
    ] {
        if let Some(v) = value {
            nightshift_core::config::parse_size(v).map_err(|e| at(format!("{name}: {e}")))?;
        }
    }
    if let Some(v) = &spec.timeout {
        nightshift_core::config::parse_span(v).map_err(|e| at(format!("timeout: {e}")))?;
    }
    let fleet = config.fleet();
    if let Some(cpus) = spec.cpus {
        if !(cpus > 0.0 && cpus <= fleet.cpus) {
            return Err(at(format!(
                "cpus {cpus} must be above 0 and at most the fleet's {} cpus",
                fleet.cpus
            )));
        }
    }
    within_fleet(need(spec, config), fleet_need(config)).map_err(at)?;
    for (name, value) in [("pids", spec.pids), ("max_files", spec.max_files)] {
        if value == Some(0) || value.is_some_and(|v| v > i64::MAX as u64) {
            return Err(at(format!("{name} must be a positive number")));
        }
    }
    Ok(out)
}

/// Adds tasks to the queue, all or none, in the order given; returns their ids.
pub fn enqueue<S: StateStore + ?Sized>(
    store: &mut S,
    config: &nightshift_core::config::Config,
    specs: &[TaskSpec],
) -> Result<Vec<String>, ApiError> {
    if specs.is_empty() {
        return Err(bad("no task to enqueue"));
    }
    if specs.len() > MAX_TASKS_PER_ENQUEUE {
        return Err(bad(format!(
            "{} tasks: at most {MAX_TASKS_PER_ENQUEUE} at once",
            specs.len()
        )));
    }
    let mut rows = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let resolved = resolve(spec, config, i + 1)?;
        let id = format!("task-{}", ulid::Ulid::new().to_string().to_lowercase());
        let text = serde_json::to_string(&resolved)
            .map_err(|e| ApiError::caused(ErrorKind::Internal, e))?;
        rows.push((id, text));
    }
    store.insert_tasks(&rows, TaskState::Queued.name())?;
    Ok(rows.into_iter().map(|(id, _)| id).collect())
}

pub(crate) fn row(t: StoredTask) -> Result<TaskRow, ApiError> {
    let broken = |m: String| ApiError::new(ErrorKind::State, format!("task {}: {m}", t.id));
    Ok(TaskRow {
        state: TaskState::parse(&t.state).ok_or_else(|| broken(format!("state {:?}", t.state)))?,
        spec: serde_json::from_str(&t.spec).map_err(|e| broken(format!("spec: {e}")))?,
        progress: serde_json::from_str(&t.progress)
            .map_err(|e| broken(format!("progress: {e}")))?,
        id: t.id,
        seq: t.seq,
        created_at: t.created_at,
        updated_at: t.updated_at,
    })
}

/// Every task, in the queue's order.
pub fn list<S: StateStore + ?Sized>(store: &S) -> Result<Vec<TaskRow>, ApiError> {
    store.tasks()?.into_iter().map(row).collect()
}

pub(crate) fn progress_json(p: &Progress) -> String {
    serde_json::to_string(p).unwrap_or_else(|_| "{}".into())
}

/// Cancels a queued task. A task already taken is not cancelled here: its
/// run is stopped with `nightshift kill RUN`.
pub fn cancel<S: StateStore + ?Sized>(store: &mut S, id: &str) -> Result<(), ApiError> {
    let tasks = list(store)?;
    let Some(task) = tasks.iter().find(|t| t.id == id) else {
        return Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no task with id {id}"),
        ));
    };
    let mut progress = task.progress.clone();
    progress.reason = Some("cancelled".into());
    progress.ended_at = Some(nightshift_core::state_store::now_rfc3339());
    if store.move_task(
        id,
        &["queued"],
        "cancelled",
        &progress_json(&progress),
        None,
    )? {
        return Ok(());
    }
    let now = list(store)?
        .into_iter()
        .find(|t| t.id == id)
        .map(|t| (t.state, t.progress.run))
        .unwrap_or((task.state, None));
    Err(ApiError::new(
        ErrorKind::Failed,
        match now {
            (TaskState::Starting | TaskState::Running, Some(run)) => {
                format!("task {id} is running as run {run}: stop it with `nightshift kill {run}`")
            }
            (TaskState::Starting | TaskState::Running, None) => {
                format!(
                    "task {id} is starting: stop its run with `nightshift kill` once it is listed"
                )
            }
            (state, _) => format!(
                "task {id} is {}: only a queued task can be cancelled",
                state.name()
            ),
        },
    ))
}

// ----- admission (pure) -----

/// What a task takes from the fleet while it runs: its caps after defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub memory_bytes: u64,
    pub milli_cpus: u64,
    pub pids: u64,
}

impl Need {
    pub fn plus(self, o: Need) -> Need {
        Need {
            memory_bytes: self.memory_bytes.saturating_add(o.memory_bytes),
            milli_cpus: self.milli_cpus.saturating_add(o.milli_cpus),
            pids: self.pids.saturating_add(o.pids),
        }
    }

    pub fn within(self, fleet: Need) -> bool {
        self.memory_bytes <= fleet.memory_bytes
            && self.milli_cpus <= fleet.milli_cpus
            && self.pids <= fleet.pids
    }
}

/// How many tasks from the head of `queued` to start now, given what is
/// `running` (see the module's note for the rule).
pub fn admit(queued: &[Need], running: &[Need], fleet: Need, max_parallel: usize) -> usize {
    let mut used = running.iter().fold(
        Need {
            memory_bytes: 0,
            milli_cpus: 0,
            pids: 0,
        },
        |a, b| a.plus(*b),
    );
    let mut started = 0;
    for (count, need) in (running.len()..).zip(queued) {
        if count >= max_parallel {
            break;
        }
        let after = used.plus(*need);
        if !after.within(fleet) && count > 0 {
            break;
        }
        used = after;
        started += 1;
    }
    started
}

/// Whether one run's caps fit in the fleet: none may exceed the fleet's
/// (a run asking for more processes or memory than the whole fleet could
/// take the fleet's shared limit alone). `Err` says which and by how much.
pub fn within_fleet(need: Need, fleet: Need) -> Result<(), String> {
    if need.pids > fleet.pids {
        return Err(format!(
            "pids {} is more than the fleet's {} ([fleet] pids)",
            need.pids, fleet.pids
        ));
    }
    if need.memory_bytes > fleet.memory_bytes {
        return Err(format!(
            "memory {} bytes is more than the fleet's {} ([fleet] memory)",
            need.memory_bytes, fleet.memory_bytes
        ));
    }
    if need.milli_cpus > fleet.milli_cpus {
        return Err(format!(
            "cpus {} is more than the fleet's {} ([fleet] cpus)",
            need.milli_cpus as f64 / 1000.0,
            fleet.milli_cpus as f64 / 1000.0
        ));
    }
    Ok(())
}

/// Admission of a run started outside the queue (`nightshift run`, and so
/// each child of `tasks run`): its processes, with those the state's
/// running sandboxes may hold (`running`: each one's pids cap), stay within
/// the fleet's (the fleet's pids cgroup is shared by every sandbox: a run
/// admitted past it would fail the others' forks).
pub fn admit_pids(asked: u64, running: &[u64], fleet_pids: u64) -> Result<(), String> {
    let held = running.iter().fold(0u64, |a, b| a.saturating_add(*b));
    if asked.saturating_add(held) > fleet_pids {
        return Err(format!(
            "the fleet is full: its running sandboxes may hold {held} of its {fleet_pids} processes, and this run asks for {asked} (queue it with `nightshift tasks add`, or ask for fewer with --pids)"
        ));
    }
    Ok(())
}

/// The pids caps of the state's running sandboxes, as the engine reports
/// them (a cap it does not report counts as the whole fleet).
pub async fn running_pids<E: nightshift_core::container_engine::ContainerEngine>(
    engine: &E,
    state_tag: &str,
    fleet_pids: u64,
) -> Result<Vec<u64>, nightshift_engine_docker::engine::EngineError> {
    let mut caps = Vec::new();
    for c in engine.managed(None).await? {
        let ours = c
            .labels
            .get(nightshift_core::sandbox::LABEL_STATE)
            .map(String::as_str)
            == Some(state_tag);
        if !ours || !c.running {
            continue;
        }
        let doc = engine.inspect_json(&c.id).await?;
        let cap = doc["HostConfig"]["PidsLimit"]
            .as_i64()
            .filter(|p| *p > 0)
            .map_or(fleet_pids, |p| p as u64);
        caps.push(cap);
    }
    Ok(caps)
}

/// A task's need, its caps after the configuration's defaults.
pub fn need(spec: &TaskSpec, config: &nightshift_core::config::Config) -> Need {
    let d = config.caps();
    Need {
        memory_bytes: spec
            .memory
            .as_deref()
            .and_then(|m| nightshift_core::config::parse_size(m).ok())
            .unwrap_or(d.memory_bytes.max(0) as u64),
        milli_cpus: spec
            .cpus
            .map(|c| (c * 1000.0) as u64)
            .unwrap_or((d.nano_cpus.max(0) / 1_000_000) as u64),
        pids: spec.pids.unwrap_or(d.pids.max(0) as u64),
    }
}

pub fn fleet_need(config: &nightshift_core::config::Config) -> Need {
    let f = config.fleet();
    Need {
        memory_bytes: f.memory_bytes,
        milli_cpus: (f.cpus * 1000.0) as u64,
        pids: f.pids,
    }
}

// ----- the dispatcher (adapter) -----
