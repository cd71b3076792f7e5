//! The supervisor's one command API. Every front end (the command line in
//! `main.rs`, the HTTP layer of `nightshift serve`) translates what it is
//! given into a [`Command`], hands it to [`Api::execute`], and renders the
//! [`Reply`] or the [`ApiError`] it gets back, in the manner of Firecracker's
//! single action enum.
//!
//! Invariants:
//! - Requests, replies and errors are plain data with serde, so the HTTP
//!   layer can take and give them as JSON; nothing here prints.
//! - An error's kind alone decides the exit code and the HTTP status
//!   (`error.rs`); a reply that reports a partial failure (an act not carried
//!   out, a broken chain, a kill not yet recorded) says its own exit code
//!   through [`Reply::exit_code`], so the command line's codes stay those
//!   README.md documents.
//! - The state and its configuration are opened per command, as the command
//!   line always did: concurrent invocations stay safe because the store
//!   serialises its writers, never because one process holds it
//!   (`orchestrator/store-postgres/tests/contract.rs::racing_writers_each_win_once`,
//!   `tests/tests/cli_serve.rs::the_command_line_goes_through_a_running_serve_and_works_alone_after_kill_9`).

mod admin;

mod openapi;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub use crate::error::{ApiError, ErrorKind};
pub use admin::{
    absolute, policy_view, ActDetail, BodyDetail, HookAnswer, Lease, PolicyView, Secret,
    StaleDetail, UserRow,
};
pub use openapi::openapi_json;

use crate::run::{self, Supervisor};
use crate::tasks::{self, TaskRow, TaskSpec};
use nightshift_core::state_store::{RunRecord, StateStore, StoreErrorKind, Stores};

/// One request, from any front end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// Every run, oldest first.
    Runs {},
    /// One run: its record, its audit entries, its refused door requests.
    Show { run: String },
    /// Verify the audit chain against its checkpoints and head.
    AuditVerify {},
    /// Make the owner's key (once per state).
    OwnerInit {},
    /// Refuse every new run and every door until `thaw`.
    Freeze { why: String },
    /// End a freeze (the owner's credential).
    Thaw {
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// The kill switch: stop one run's sandbox, or every sandbox of the state.
    Kill {
        target: KillTarget,
        /// With [`KillTarget::All`] only: also freeze.
        #[serde(default)]
        freeze: bool,
        /// Who asked (recorded in the audit).
        by: String,
    },
    /// Settle runs and sandboxes whose supervisor vanished.
    Reconcile {},
    /// Retry the import of a run whose import failed, or import the worktree
    /// this state kept of a run another worker settled as lost.
    Import { run: String },
    /// The deferred queue: acts (pending first, grouped by run) and the
    /// door requests the gate refused. Expires what has run out of time.
    Queue {},
    /// Approve acts (the owner's credential): one transaction each; an
    /// executor re-checks and carries them out (`serve`'s, or the command
    /// line's own pass when no `serve` runs).
    Approve {
        acts: Vec<String>,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// Reject acts with a reason (the owner's credential).
    Reject {
        acts: Vec<String>,
        why: String,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// Reject every act of one run still waiting for a person, with one
    /// reason (the owner's credential): a run that flooded the queue is
    /// cleared at once. Each act is rejected and audited as `Reject` does.
    RejectRun {
        run: String,
        why: String,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// Approve every pending act that carries exactly this commit (the
    /// owner's credential): one decision per content, not per run.
    ApproveCommit {
        commit: String,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// Adopt a proposed rule (the owner's credential); the rule is locked.
    Ratify {
        proposal: String,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
        /// Rule files to use in place of the configured ones.
        #[serde(default)]
        #[schema(value_type = Option<String>)]
        rules: Option<PathBuf>,
    },
    /// Re-bind stale acts to their destination as it is now (the owner's credential).
    Rebind {
        acts: Vec<String>,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// Add tasks to the run queue, in order.
    Enqueue {
        /// As the `[[task]]` tables of a tasks file (docs/api.md).
        #[schema(value_type = Vec<Object>)]
        tasks: Vec<TaskSpec>,
    },
    /// Continue a run a cap ended (tokens, wall clock, output, worktree):
    /// a new task from its result ref, with the same task text and agent
    /// and these caps over the old ones; refused for any other run.
    Continue {
        run: String,
        #[serde(default)]
        max_tokens: Option<u64>,
        /// A span (`30m`, `2h`).
        #[serde(default)]
        timeout: Option<String>,
    },
    /// The run queue: queued, running and finished tasks.
    Tasks {},
    /// Cancel a queued task.
    CancelTask { task: String },
    /// One act in full: its diff or its content.
    QueueShow { act: String },
    /// The rules in force, pending proposals, the freeze, the generation,
    /// and which rules bind `actor`'s tool calls (the hook's).
    PolicyList {
        #[schema(value_type = Option<String>)]
        rules: Option<PathBuf>,
        actor: Option<String>,
    },
    /// The whole decision for one tool call (`input`: the hook's input).
    PolicyExplain {
        #[schema(value_type = Option<String>)]
        rules: Option<PathBuf>,
        actor: Option<String>,
        tool: String,
        input: Vec<u8>,
    },
    /// The harness hook: the decision for one tool call, audited.
    PolicyCheck {
        #[schema(value_type = Option<String>)]
        rules: Option<PathBuf>,
        actor: Option<String>,
        tool: String,
        input: Vec<u8>,
    },
    /// Declare the rules of a file: as an agent (tier 1) or as the owner.
    PolicyDeclare {
        #[schema(value_type = Option<String>)]
        rules: Option<PathBuf>,
        #[schema(value_type = String)]
        file: PathBuf,
        actor: Option<String>,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// Propose the rules of a file, or retiring a rule, to the owner.
    PolicyPropose {
        #[schema(value_type = Option<String>)]
        rules: Option<PathBuf>,
        #[schema(value_type = Option<String>)]
        file: Option<PathBuf>,
        actor: String,
        retire: Option<String>,
        why: Option<String>,
    },
    /// Unlock a rule (the owner's credential), so that it can be retired.
    PolicyUnlock {
        #[schema(value_type = Option<String>)]
        rules: Option<PathBuf>,
        rule: String,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// Retire a rule: as an agent (its own tier-1 rules) or as the owner.
    PolicyRetire {
        #[schema(value_type = Option<String>)]
        rules: Option<PathBuf>,
        rule: String,
        why: String,
        actor: Option<String>,
        #[schema(value_type = Option<String>)]
        owner_key_file: Option<PathBuf>,
    },
    /// The default image's reference, or an agent image's; with
    /// toolchains (`rust`, `python`, `node`), the image holding them.
    ImageRef {
        agent: Option<String>,
        #[serde(default)]
        with: Vec<String>,
    },
    /// Build the default image (or an agent's, with toolchains or without)
    /// in the local engine.
    ImageBuild {
        mirror: String,
        agent: Option<String>,
        #[serde(default)]
        with: Vec<String>,
    },
    /// The destinations (`STATE/destinations.toml`), checked; with `probe`,
    /// each remote and forge is also asked, without changing anything,
    /// whether it accepts the credential (a ref listing; an authenticated
    /// read of the forge's pull requests).
    Destinations {
        #[serde(default)]
        probe: bool,
    },
    /// The morning summary.
    Summary {},
    /// Send the morning summary now (or when `due`: if its time has passed).
    SummarySend { due: bool },
    /// Add a dashboard account, or replace its role and password.
    UsersAdd {
        name: String,
        role: String,
        password: Secret,
    },
    /// The dashboard's accounts.
    UsersList {},
    /// Remove a dashboard account; its sessions end.
    UsersRemove { name: String },
}

impl Command {
    /// Whether the command line hands this command to a running `serve`
    /// (`serve/socket.rs`) rather than executing it itself: the ones that
    /// change the state of the queues, the acts, the freeze and the rules.
    pub fn goes_through_serve(&self) -> bool {
        matches!(
            self,
            Command::Approve { .. }
                | Command::Reject { .. }
                | Command::RejectRun { .. }
                | Command::Rebind { .. }
                | Command::ApproveCommit { .. }
                | Command::Kill { .. }
                | Command::Freeze { .. }
                | Command::Thaw { .. }
                | Command::Ratify { .. }
                | Command::Enqueue { .. }
                | Command::Continue { .. }
                | Command::CancelTask { .. }
        )
    }

    /// Whether carrying the command out changes what the run queue's
    /// dispatchers would do next (a task to start, to cancel or to stop, the
    /// freeze lifted): they are woken once it succeeds.
    pub fn changes_the_run_queue(&self) -> bool {
        matches!(
            self,
            Command::Enqueue { .. }
                | Command::Continue { .. }
                | Command::CancelTask { .. }
                | Command::Thaw { .. }
                | Command::Kill { .. }
        )
    }

    /// The command with every path its caller named made absolute (against
    /// the caller's directory), before it leaves the caller's process.
    pub fn absolutized(mut self) -> Self {
        let fix = |p: &mut Option<PathBuf>| {
            if let Some(path) = p.as_mut() {
                *path = absolute(path);
            }
        };
        match &mut self {
            Command::Approve { owner_key_file, .. }
            | Command::Reject { owner_key_file, .. }
            | Command::RejectRun { owner_key_file, .. }
            | Command::Rebind { owner_key_file, .. }
            | Command::ApproveCommit { owner_key_file, .. }
            | Command::Thaw { owner_key_file } => fix(owner_key_file),
            Command::Ratify {
                owner_key_file,
                rules,
                ..
            } => {
                fix(owner_key_file);
                fix(rules);
            }
            Command::Enqueue { tasks } => {
                for t in tasks {
                    t.repo = absolute(&t.repo);
                    fix(&mut t.task_file);
                }
            }
            _ => {}
        }
        self
    }
}

/// Who sent a command, as the front end established it (never taken from
/// the command itself, so a request cannot name someone else): it decides
/// the name an owner's decision is recorded under in the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The command line, executing in its own process.
    Local,
    /// The command line, through `serve`'s owner socket (`STATE/serve.sock`).
    Socket,
    /// A dashboard account whose owner role the HTTP layer checked.
    Dashboard { user: String },
}

impl Caller {
    /// The name an owner's decision (approval, rejection, thaw,
    /// ratification, a freeze) is recorded under.
    pub fn owner_name(&self) -> String {
        match self {
            Caller::Local => "owner".into(),
            Caller::Socket => "owner via serve".into(),
            Caller::Dashboard { user } => format!("dashboard:{user}"),
        }
    }

    /// Who asked, for a request anyone with the state may make (`continue`).
    fn requester(&self) -> String {
        match self {
            Caller::Local => "command line".into(),
            Caller::Socket => "command line via serve".into(),
            Caller::Dashboard { user } => format!("dashboard:{user}"),
        }
    }

    /// Who pulled the brake, for a freeze's authority.
    fn freezer(&self) -> String {
        let user = || std::env::var("USER").unwrap_or_else(|_| "operator".into());
        match self {
            Caller::Local => format!("nightshift freeze by {}", user()),
            Caller::Socket => format!("nightshift freeze by {} via serve", user()),
            Caller::Dashboard { user } => format!("dashboard:{user}"),
        }
    }
}

/// Which sandboxes the kill switch stops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KillTarget {
    Run(String),
    All,
}

/// What a command answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Runs {
        #[schema(value_type = Vec<Object>)]
        runs: Vec<RunRecord>,
    },
    Run(Box<RunView>),
    Audit(AuditState),
    OwnerKey {
        #[schema(value_type = String)]
        path: PathBuf,
        created: bool,
    },
    Frozen,
    Thawed,
    Killed(KillReport),
    Reconciled {
        settled: Vec<String>,
    },
    Imported {
        #[schema(value_type = Object)]
        run: Box<RunRecord>,
    },
    Queue(Box<QueueView>),
    Decisions {
        decisions: Vec<Decision>,
    },
    /// A capped run continued: the task that will run it, and the cap
    /// that had ended it.
    Continued {
        run: String,
        task: String,
        cap: String,
    },
    Enqueued {
        tasks: Vec<String>,
    },
    Tasks {
        #[schema(value_type = Vec<Object>)]
        tasks: Vec<TaskRow>,
    },
    Cancelled {
        task: String,
    },
    Ratified {
        proposal: String,
    },
    /// One act in full (agent-written parts as they are: escape them).
    Act {
        detail: Box<ActDetail>,
        /// Expiring acts failed (the act is still given).
        expire_error: Option<String>,
    },
    Policy(Box<PolicyView>),
    /// The decision for a tool call, or why the call was refused before
    /// any rule was consulted.
    Explained {
        decision: Option<serde_json::Value>,
        refusal: String,
    },
    Hook(HookAnswer),
    Declared {
        rules: Vec<String>,
    },
    Proposed {
        proposals: Vec<String>,
    },
    Unlocked {
        rule: String,
    },
    Retired {
        rule: String,
    },
    ImageRef {
        reference: String,
    },
    /// The destinations as listed (`None` when the file does not exist), or
    /// every problem of the file (then `listed` is `None` too).
    Destinations {
        #[schema(value_type = String)]
        path: PathBuf,
        listed: Option<Vec<serde_json::Value>>,
        problems: Vec<String>,
    },
    Summary {
        summary: serde_json::Value,
        /// The summary as it is sent.
        text: String,
        /// The failed runs and acts with their reasons (shown here, never
        /// sent: see `summary::Failure`), and how many more there were.
        #[serde(default)]
        failures: Vec<crate::summary::Failure>,
        #[serde(default)]
        more_failures: usize,
    },
    SummarySent {
        runs: usize,
    },
    SummarySkipped {
        why: String,
    },
    UserSaved {
        name: String,
        role: String,
    },
    Users {
        users: Vec<UserRow>,
    },
    UserRemoved {
        name: String,
    },
}

impl Reply {
    /// The command line's exit code for this reply (README.md).
    pub fn exit_code(&self) -> i32 {
        use nightshift_core::exit;
        match self {
            Reply::Audit(AuditState::Broken { .. }) => exit::FAILED,
            Reply::Imported { run } => match run::import_state(run) {
                run::ImportState::HistoryDropped => exit::NOT_WHOLE,
                _ => exit::OK,
            },
            Reply::Killed(KillReport {
                record: KillRecord::NotRecorded(e),
                ..
            }) => e.exit_code(),
            Reply::Destinations { problems, .. } if !problems.is_empty() => exit::BAD_INPUT,
            Reply::Hook(answer) => answer.code,
            Reply::Decisions { decisions } => decisions.iter().fold(exit::OK, |code, d| {
                match &d.outcome {
                    // An approval that was not carried out is not a success.
                    Outcome::Done { carried_out, .. } => {
                        if !carried_out && code == exit::OK {
                            exit::FAILED
                        } else {
                            code
                        }
                    }
                    Outcome::Error(e) => e.exit_code(),
                }
            }),
            _ => exit::OK,
        }
    }
}

/// One run as `show` gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunView {
    #[schema(value_type = Object)]
    pub run: RunRecord,
    #[schema(value_type = Vec<Object>)]
    pub audit: Vec<orchestrator_audit::Entry>,
    #[schema(value_type = Vec<Object>)]
    pub refusals: Vec<crate::acts::Refusal>,
    /// The acts the run's door queued (or, on a dry run, none), oldest first.
    #[serde(default)]
    pub acts: Vec<RunAct>,
}

/// One act a run queued, as `show` and `run` list it (agent-made values:
/// escape before showing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunAct {
    pub id: String,
    /// The door: push, pull_request, notify, ask.
    pub door: String,
    pub destination: String,
    /// The ref a push goes to, or `head into base` for a pull request.
    pub target: Option<String>,
    /// The act's state now.
    pub status: String,
}

/// The deferred queue as `queue` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueView {
    /// Pending first, grouped by run (`deferred_queue::order_for_listing`).
    pub acts: Vec<QueueItem>,
    /// Refused door requests, oldest first.
    #[schema(value_type = Vec<Object>)]
    pub refusals: Vec<crate::acts::Refusal>,
    /// Expiring acts failed (the listing is still given).
    pub expire_error: Option<String>,
}

/// One act in the queue's listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueItem {
    #[schema(value_type = Object)]
    pub act: deferred_queue::Act,
    #[schema(value_type = Object)]
    pub state: deferred_queue::State,
    /// The state's name.
    pub status: String,
    /// A push's change against its run's base: (files, insertions, deletions).
    #[schema(value_type = Option<Vec<u64>>)]
    pub diffstat: Option<(u64, u64, u64)>,
    /// The first bytes of a message's content (agent-written: escape before showing).
    pub preview: Option<Vec<u8>>,
}

/// The audit chain's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum AuditState {
    Intact {
        entries: u64,
        checkpoints: u64,
        head: String,
    },
    Broken {
        first_bad_entry: Option<u64>,
        error: String,
    },
}

/// What the kill switch did: the sandboxes stopped first, then the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KillReport {
    pub sandboxes: usize,
    pub record: KillRecord,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum KillRecord {
    /// Recorded: these runs were ended.
    Recorded { runs: Vec<String> },
    /// The store did not answer; what was done waits in `path` for the next
    /// reconciliation.
    Pending {
        why: String,
        #[schema(value_type = String)]
        path: PathBuf,
    },
    /// The sandboxes were stopped but the kill could not be recorded.
    NotRecorded(ApiError),
}

/// One act's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Decision {
    pub act: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Outcome {
    /// Decided: `line` says what happened; `carried_out` is false for an
    /// approval that did not go through (stale, expired, failed). An
    /// approval made through `serve` returns at once, handed to serve's
    /// executor: true there means approved (the act's state says when it
    /// is carried out).
    Done {
        line: String,
        carried_out: bool,
    },
    Error(ApiError),
}

/// The supervisor's API over one store (and its state directory) and its
/// configuration.
#[derive(Debug, Clone)]
pub struct Api {
    stores: Stores,
    root: PathBuf,
    config: Option<PathBuf>,
}

impl Api {
    /// `stores`: the store's port, built once by the binary; `config`: the
    /// configuration file (default `STATE/config.toml`).
    pub fn new(stores: Stores, config: Option<PathBuf>) -> Self {
        let root = stores.root().to_path_buf();
        Self {
            stores,
            root,
            config,
        }
    }

    /// The store's port, to hand on (the door, the gateway, the queue).
    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn config_path(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    /// A connection to the store.
    pub fn open_store(&self) -> Result<Box<dyn StateStore>, ApiError> {
        Ok(self.stores.connect()?)
    }

    /// A connection to the store for a command that runs sandboxes (a
    /// foreground run, `serve`, the demo): failing to connect is the
    /// state's error ([`ErrorKind::State`]), whatever the store's own.
    pub fn open_state(&self) -> Result<Box<dyn StateStore>, ApiError> {
        self.stores
            .connect()
            .map_err(|e| ApiError::caused(ErrorKind::State, e))
    }

    /// The process's one configuration, checked: a broken file is an error,
    /// never silently defaults.
    pub fn load_config(&self) -> Result<nightshift_core::config::Config, ApiError> {
        let path = self
            .config
            .clone()
            .unwrap_or_else(|| self.root.join("config.toml"));
        nightshift_core::config::Config::load(&path)
            .map_err(|e| ApiError::caused(ErrorKind::BadInput, e))
    }

    /// Loads the configuration and gives the act queue its lifetimes from it.
    pub(crate) fn with_queue_config(&self) -> Result<(), ApiError> {
        let config = self.load_config()?;
        crate::acts::use_queue_ttls(config.queue_ttls());
        crate::acts::use_queue_bounds(config.queue_bounds());
        Ok(())
    }

    /// Carries out one command from the command line, in this process.
    pub async fn execute(&self, command: Command) -> Result<Reply, ApiError> {
        self.execute_as(command, &Caller::Local).await
    }

    /// Carries out one command for `caller`.
    pub async fn execute_as(&self, command: Command, caller: &Caller) -> Result<Reply, ApiError> {
        self.execute_streaming(command, caller, &mut |_| {}).await
    }

    /// Carries out one command for `caller`, saying what a long command
    /// (an image build) is doing to `progress`, line by line.
    pub async fn execute_streaming(
        &self,
        command: Command,
        caller: &Caller,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Reply, ApiError> {
        let wakes = command.changes_the_run_queue();
        let reply = self.carry_out(command, caller, progress).await;
        if wakes && reply.is_ok() {
            crate::wake::wake_dispatchers();
        }
        reply
    }

    async fn carry_out(
        &self,
        command: Command,
        caller: &Caller,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Reply, ApiError> {
        match command {
            Command::QueueShow { act } => self.act_detail(&act),
            Command::PolicyList { rules, actor } => self.policy_list(rules.as_deref(), actor),
            Command::PolicyExplain {
                rules,
                actor,
                tool,
                input,
            } => self.policy_explain(rules.as_deref(), actor.as_deref(), &tool, &input),
            Command::PolicyCheck {
                rules,
                actor,
                tool,
                input,
            } => self
                .policy_check(rules.as_deref(), actor.as_deref(), &tool, &input)
                .map(Reply::Hook),
            Command::PolicyDeclare {
                rules,
                file,
                actor,
                owner_key_file,
            } => self.policy_declare(rules.as_deref(), &file, actor, owner_key_file.as_deref()),
            Command::PolicyPropose {
                rules,
                file,
                actor,
                retire,
                why,
            } => self.policy_propose(
                rules.as_deref(),
                file.as_deref(),
                actor,
                retire.as_deref(),
                why.as_deref(),
            ),
            Command::PolicyUnlock {
                rules,
                rule,
                owner_key_file,
            } => self.policy_unlock(rules.as_deref(), &rule, owner_key_file.as_deref()),
            Command::PolicyRetire {
                rules,
                rule,
                why,
                actor,
                owner_key_file,
            } => self.policy_retire(
                rules.as_deref(),
                &rule,
                &why,
                actor,
                owner_key_file.as_deref(),
            ),
            Command::ImageRef { agent, with } => self.image_ref(agent.as_deref(), &with),
            Command::ImageBuild {
                mirror,
                agent,
                with,
            } => {
                self.image_build(&mirror, agent.as_deref(), &with, progress)
                    .await
            }
            Command::Destinations { probe } => {
                let api = self.clone();
                tokio::task::spawn_blocking(move || api.destinations(probe))
                    .await
                    .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?
            }
            Command::Summary {} => self.summary(),
            Command::SummarySend { due } => self.summary_send(due),
            Command::UsersAdd {
                name,
                role,
                password,
            } => self.users_add(&name, &role, &password.0),
            Command::UsersList {} => self.users_list(),
            Command::UsersRemove { name } => self.users_remove(&name),
            Command::Runs {} => Ok(Reply::Runs {
                runs: self.open_store()?.runs()?,
            }),
            Command::Show { run } => self.show(&run),
            Command::AuditVerify {} => self.verify(),
            Command::OwnerInit {} => {
                let mut store = self.open_store()?;
                let (path, created) = nightshift_core::owner::init(&mut store)?;
                Ok(Reply::OwnerKey { path, created })
            }
            Command::Freeze { why } => {
                let mut store = self.open_store()?;
                nightshift_core::policy::write_row(
                    &mut store,
                    None,
                    policies::Row::Freeze {
                        authority: caller.freezer(),
                        reason: why,
                        at: Some(nightshift_core::state_store::now_rfc3339()),
                    },
                )?;
                Ok(Reply::Frozen)
            }
            Command::Thaw { owner_key_file } => {
                let mut store = self.open_store()?;
                owner(&store, owner_key_file.as_deref())?;
                nightshift_core::policy::write_row(
                    &mut store,
                    None,
                    policies::Row::Thaw {
                        authority: caller.owner_name(),
                    },
                )?;
                Ok(Reply::Thawed)
            }
            Command::Ratify {
                proposal,
                owner_key_file,
                rules,
            } => {
                let mut store = self.open_store()?;
                owner(&store, owner_key_file.as_deref())?;
                nightshift_core::policy::write_row(
                    &mut store,
                    rules.as_deref(),
                    policies::Row::Ratify {
                        proposal: proposal.clone(),
                        authority: caller.owner_name(),
                        lock: true,
                    },
                )?;
                Ok(Reply::Ratified { proposal })
            }
            Command::Kill { target, freeze, by } => self.kill(target, freeze, &by).await,
            Command::Reconcile {} => {
                self.load_config()?;
                let sup = self.stopping_supervisor().await?;
                let settled =
                    crate::killswitch::reconcile(&sup, None, "nightshift reconcile").await?;
                Ok(Reply::Reconciled { settled })
            }
            Command::Import { run } => self.import(&run).await,
            Command::Queue {} => self.queue(),
            Command::Approve {
                acts,
                owner_key_file,
            } => self.decide(&acts, owner_key_file.as_deref(), Decide::Approve, caller),
            Command::Reject {
                acts,
                why,
                owner_key_file,
            } => self.decide(
                &acts,
                owner_key_file.as_deref(),
                Decide::Reject(&why),
                caller,
            ),
            Command::RejectRun {
                run,
                why,
                owner_key_file,
            } => {
                // The owner first: who may not reject learns nothing of the run.
                owner(&self.open_store()?, owner_key_file.as_deref())?;
                let acts = self.pending_of_run(&run)?;
                self.decide(
                    &acts,
                    owner_key_file.as_deref(),
                    Decide::Reject(&why),
                    caller,
                )
            }
            Command::ApproveCommit {
                commit,
                owner_key_file,
            } => {
                let acts = self.pending_with_commit(&commit)?;
                self.decide(&acts, owner_key_file.as_deref(), Decide::Approve, caller)
            }
            Command::Rebind {
                acts,
                owner_key_file,
            } => self.decide(&acts, owner_key_file.as_deref(), Decide::Rebind, caller),
            Command::Continue {
                run,
                max_tokens,
                timeout,
            } => self.continue_run(&run, max_tokens, timeout, caller),
            Command::Enqueue { tasks } => {
                if tasks.iter().any(|t| t.continues.is_some()) {
                    return Err(ApiError::new(
                        ErrorKind::BadInput,
                        "`continues` is set by `nightshift continue RUN` only",
                    ));
                }
                let config = self.load_config()?;
                let mut store = self.open_store()?;
                let ids = tasks::enqueue(&mut store, &config, &tasks)?;
                Ok(Reply::Enqueued { tasks: ids })
            }
            Command::Tasks {} => Ok(Reply::Tasks {
                tasks: tasks::list(&self.open_store()?)?,
            }),
            Command::CancelTask { task } => {
                tasks::cancel(&mut self.open_store()?, &task)?;
                Ok(Reply::Cancelled { task })
            }
        }
    }

    /// `nightshift continue`: the decision is `continuation`'s; the task
    /// goes in through the queue's one path, and the request is audited on
    /// the capped run (the new run's creation audits the link both ways).
    fn continue_run(
        &self,
        id: &str,
        max_tokens: Option<u64>,
        timeout: Option<String>,
        caller: &Caller,
    ) -> Result<Reply, ApiError> {
        if let Some(t) = &timeout {
            nightshift_core::config::parse_span(t)
                .map_err(|e| ApiError::new(ErrorKind::BadInput, format!("timeout: {e}")))?;
        }
        if max_tokens == Some(0) {
            return Err(ApiError::new(
                ErrorKind::BadInput,
                "max_tokens must be a positive number",
            ));
        }
        let config = self.load_config()?;
        let mut store = self.open_store()?;
        let run = store.run(id)?;
        let queued = tasks::list(&store)?;
        let caps = crate::continuation::NewCaps {
            max_tokens,
            timeout,
        };
        let (spec, cap) = crate::continuation::continuation(&run, &queued, &caps)
            .map_err(|why| ApiError::new(ErrorKind::Failed, why))?;
        let task = tasks::enqueue(&mut store, &config, &[spec])?
            .pop()
            .unwrap_or_default();
        store.append(
            Some(&run.id),
            &nightshift_core::audit_log::Event::ContinueQueued {
                task: task.clone(),
                cap: cap.to_string(),
                by: caller.requester(),
            },
            false,
        )?;
        Ok(Reply::Continued {
            run: run.id,
            task,
            cap: cap.to_string(),
        })
    }

    fn queue(&self) -> Result<Reply, ApiError> {
        self.with_queue_config()?;
        let mut store = self.open_store()?;
        // What has run out of time is shown as expired, never as waiting.
        let expire_error = crate::acts::expire(&mut store)
            .err()
            .map(|e| format!("expiring acts: {e}"));
        let rows = crate::acts::rows(&store, None)?;
        let table: Vec<deferred_queue::ActRow> = rows
            .iter()
            .map(|r| deferred_queue::ActRow {
                act: r.act.clone(),
                state: r.state.clone(),
            })
            .collect();
        let contents: std::collections::HashMap<&str, &Option<Vec<u8>>> = rows
            .iter()
            .map(|r| (r.act.id.as_str(), &r.content))
            .collect();
        let acts = deferred_queue::order_for_listing(&table)
            .into_iter()
            .map(|r| {
                let (diffstat, preview) = match (&r.act.routing.target, &r.act.content) {
                    (
                        deferred_queue::Target::Push { .. },
                        deferred_queue::Content::Commit { commit },
                    ) => (
                        store.run(&r.act.run).ok().and_then(|run| {
                            orchestrator_git::diffstat_between(
                                Path::new(&run.repo),
                                run.base_commit.as_deref()?,
                                commit,
                            )
                            .ok()
                        }),
                        None,
                    ),
                    (deferred_queue::Target::PullRequest { .. }, _) => (None, None),
                    _ => (
                        None,
                        contents
                            .get(r.act.id.as_str())
                            .and_then(|c| c.as_deref())
                            .map(|b| b[..b.len().min(60)].to_vec()),
                    ),
                };
                QueueItem {
                    act: r.act.clone(),
                    state: r.state.clone(),
                    status: r.state.name().to_string(),
                    diffstat,
                    preview,
                }
            })
            .collect();
        let refusals = crate::acts::refusals(&store, None)?;
        Ok(Reply::Queue(Box::new(QueueView {
            acts,
            refusals,
            expire_error,
        })))
    }

    fn show(&self, id: &str) -> Result<Reply, ApiError> {
        let store = self.open_store()?;
        let run = store.run(id)?;
        let audit = store.entries_for_run(id)?;
        let refusals = crate::acts::refusals(&store, Some(id))?;
        let acts = crate::acts::rows(&store, None)?
            .into_iter()
            .filter(|r| r.act.run == id)
            .map(|r| RunAct {
                id: r.act.id.clone(),
                door: r.act.door.name().to_string(),
                destination: r.act.routing.destination.clone(),
                target: match &r.act.routing.target {
                    deferred_queue::Target::Push { target_ref, .. } => Some(target_ref.clone()),
                    deferred_queue::Target::PullRequest { base_ref, head_ref } => {
                        Some(format!("{head_ref} into {base_ref}"))
                    }
                    _ => None,
                },
                status: r.state.name().to_string(),
            })
            .collect();
        Ok(Reply::Run(Box::new(RunView {
            run,
            audit,
            refusals,
            acts,
        })))
    }

    fn verify(&self) -> Result<Reply, ApiError> {
        let store = self.open_store()?;
        // Streamed: the chain is never held whole (a million entries in
        // bounded memory).
        Ok(Reply::Audit(
            match nightshift_core::state_store::verify_log(&*store)? {
                Ok(v) => AuditState::Intact {
                    entries: v.entries,
                    checkpoints: v.checkpoints,
                    head: v.head,
                },
                Err(e) => AuditState::Broken {
                    first_bad_entry: e.seq(),
                    error: e.to_string(),
                },
            },
        ))
    }

    async fn import(&self, id: &str) -> Result<Reply, ApiError> {
        let store = Mutex::new(self.open_store()?);
        match run::retry_import(&store, id).await {
            Ok(record) => Ok(Reply::Imported {
                run: Box::new(record),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// The kill switch. It depends on nothing that may be broken: the
    /// sandboxes are stopped first, with only the engine and the state's tag
    /// (no config, no database, no cgroup); then it is recorded, and when the
    /// store cannot be opened in time, what was done is written to
    /// `STATE/killswitch.pending` for the next reconciliation to record.
    async fn kill(&self, target: KillTarget, freeze: bool, by: &str) -> Result<Reply, ApiError> {
        let run = match &target {
            KillTarget::Run(run) => Some(run.as_str()),
            KillTarget::All => None,
        };
        if freeze && run.is_some() {
            return Err(ApiError::new(
                ErrorKind::BadInput,
                "freeze goes with killing every run, not one",
            ));
        }
        let engine = nightshift_engine_docker::engine::Engine::connect().await?;
        let state_tag = nightshift_core::state_tag(&self.root);
        let stopped = crate::killswitch::stop_sandboxes(&engine, &state_tag, run, by, freeze)
            .await
            .map_err(|e| ApiError::caused(ErrorKind::Engine, e))?;
        let sandboxes = stopped.containers.len();

        // Now record it, if the store answers in time.
        let stores = self.stores.clone();
        let opened = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio::task::spawn_blocking(move || stores.connect()),
        )
        .await;
        let store = match opened {
            Ok(Ok(Ok(store))) => Ok(store),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the state store did not answer within 5 s".to_string()),
        };
        let pending = crate::killswitch::pending_path(&self.root);
        let record = match store {
            Err(why) => match crate::killswitch::write_pending(&self.root, &stopped) {
                Ok(()) => KillRecord::Pending {
                    why,
                    path: pending,
                },
                Err(e) => KillRecord::NotRecorded(ApiError::new(
                    ErrorKind::State,
                    format!(
                        "the sandboxes were stopped, but the kill could not be recorded: {why}; writing {}: {e}",
                        pending.display()
                    ),
                )),
            },
            Ok(store) => {
                let sup = Supervisor {
                    engine,
                    stores: self.stores.clone(),
                    store: Arc::new(Mutex::new(store)),
                    state_tag,
                    identity: process_identity(),
                    fleet: None,
                    // Only stops and settles: it creates no sandbox.
                    sandbox_user: Default::default(),
                    host: Arc::new(nightshift_core::hostview::RealHost),
                    pool: None,
                    results: run::ResultsBy::HostPath,
                };
                match crate::killswitch::record_kill(&sup, &stopped).await {
                    Ok(k) => KillRecord::Recorded { runs: k.runs },
                    Err(e) => {
                        // What the store could not take is written down
                        // for the next reconciliation.
                        if matches!(&e, run::RunError::Store(s) if s.kind() != StoreErrorKind::NotFound)
                        {
                            let _ = crate::killswitch::write_pending(&self.root, &stopped);
                        }
                        KillRecord::NotRecorded(e.into())
                    }
                }
            }
        };
        Ok(Reply::Killed(KillReport { sandboxes, record }))
    }

    /// What commands that only stop and settle sandboxes need: the state and
    /// the engine, never the fleet cgroup (whose limits only the process that
    /// creates sandboxes writes, from its own config).
    pub async fn stopping_supervisor(&self) -> Result<Supervisor, ApiError> {
        let store = self.open_store()?;
        let engine = nightshift_engine_docker::engine::Engine::connect().await?;
        Ok(Supervisor {
            engine,
            stores: self.stores.clone(),
            store: Arc::new(Mutex::new(store)),
            state_tag: nightshift_core::state_tag(&self.root),
            identity: process_identity(),
            fleet: None,
            // Only stops and settles: it creates no sandbox.
            sandbox_user: Default::default(),
            host: Arc::new(nightshift_core::hostview::RealHost),
            pool: None,
            results: run::ResultsBy::HostPath,
        })
    }

    /// The acts of `run` waiting for a person; an unknown run is bad input.
    fn pending_of_run(&self, run: &str) -> Result<Vec<String>, ApiError> {
        let store = self.open_store()?;
        if !store.runs()?.iter().any(|r| r.id == run) {
            return Err(ApiError::new(
                ErrorKind::BadInput,
                format!("no run {}", nightshift_core::terminal::line(run)),
            ));
        }
        use deferred_queue::State;
        Ok(crate::acts::rows(&store, None)?
            .into_iter()
            .filter(|r| r.act.run == run && matches!(r.state, State::Pending))
            .map(|r| r.act.id)
            .collect())
    }

    /// The pending acts that carry exactly `commit` (a full commit id).
    fn pending_with_commit(&self, commit: &str) -> Result<Vec<String>, ApiError> {
        if !(commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit())) {
            return Err(ApiError::new(
                ErrorKind::BadInput,
                "give the commit's full 40-character id",
            ));
        }
        use deferred_queue::{Content, State};
        Ok(crate::acts::rows(&self.open_store()?, None)?
            .into_iter()
            .filter(|r| matches!(r.state, State::Pending))
            .filter(|r| match &r.act.content {
                Content::Commit { commit: c } => c.eq_ignore_ascii_case(commit),
                Content::PullRequest { head_commit, .. } => {
                    head_commit.eq_ignore_ascii_case(commit)
                }
                Content::Message { .. } => false,
            })
            .map(|r| r.act.id)
            .collect())
    }

    /// What a process that creates sandboxes needs (a foreground run,
    /// `serve`'s runs in process): the state (failing to connect is the
    /// state's error, whatever the store's own), the engine, and the fleet
    /// cgroup with the limits of `config`, this process's identity on every
    /// sandbox.
    pub async fn creating_supervisor(
        &self,
        config: &nightshift_core::config::Config,
    ) -> Result<Supervisor, ApiError> {
        let store = self.open_state()?;
        let engine = nightshift_engine_docker::engine::Engine::connect().await?;
        let state_tag = nightshift_core::state_tag(&self.root);
        let fleet = run::FleetHandle::ensure(&state_tag, &config.fleet())
            .map_err(|e| ApiError::new(ErrorKind::Internal, e))?;
        Ok(Supervisor {
            engine,
            stores: self.stores.clone(),
            store: Arc::new(Mutex::new(store)),
            state_tag,
            identity: process_identity(),
            fleet: Some(fleet),
            sandbox_user: config.sandbox_user(),
            host: Arc::new(nightshift_core::hostview::RealHost),
            pool: None,
            results: run::ResultsBy::Packer,
        })
    }

    fn decide(
        &self,
        acts: &[String],
        key: Option<&Path>,
        how: Decide<'_>,
        caller: &Caller,
    ) -> Result<Reply, ApiError> {
        self.with_queue_config()?;
        let mut store = self.open_store()?;
        let by = caller.owner_name();
        // Each decision is one transaction and carries nothing out. Through
        // `serve` (its socket, the dashboard) its executor carries the
        // approved acts out and the reply returns at once; the command
        // line alone runs an executor pass itself, after the decisions.
        let local = *caller == Caller::Local;
        let mut approved: Vec<String> = Vec::new();
        let mut decisions: Vec<Decision> = acts
            .iter()
            .map(|id| {
                // The queue answers in sentences: what bars the decision
                // (the credential, the freeze) is asked first, by type, so
                // that its kind is never read from the queue's words.
                let outcome = match barred(&*store, id, key, how) {
                    Some(e) => Outcome::Error(e),
                    None => {
                        let result = match how {
                            Decide::Approve => crate::acts::approve_as(&mut store, id, key, &by)
                                .map(|d| {
                                    approved.push(id.clone());
                                    if local {
                                        (d.line, d.carried_out)
                                    } else {
                                        (
                                            format!("{}; serve's executor carries it out", d.line),
                                            true,
                                        )
                                    }
                                }),
                            Decide::Reject(why) => {
                                crate::acts::reject_as(&mut store, id, why, key, &by)
                                    .map(|()| (format!("act {id}: rejected"), true))
                            }
                            Decide::Rebind => crate::acts::rebind(&mut store, id, key)
                                .map(|(_, line)| (line, true)),
                        };
                        match result {
                            Ok((line, carried_out)) => Outcome::Done { line, carried_out },
                            Err(e) => Outcome::Error(ApiError::new(ErrorKind::Failed, e)),
                        }
                    }
                };
                Decision {
                    act: id.clone(),
                    outcome,
                }
            })
            .collect();
        if local && !approved.is_empty() {
            let carried = crate::acts::execute_now(&mut store, &approved, true);
            for (id, done) in approved.iter().zip(carried) {
                if let Some(d) = decisions.iter_mut().find(|d| &d.act == id) {
                    d.outcome = Outcome::Done {
                        line: done.line,
                        carried_out: done.carried_out,
                    };
                }
            }
        }
        Ok(Reply::Decisions { decisions })
    }
}

/// What refuses the owner's decision on act `id` before the queue is asked:
/// a credential that is not the owner's ([`ErrorKind::Denied`]), or, for an
/// approval or a rebind, the freeze ([`ErrorKind::Frozen`]; a rejection is
/// taken while frozen). The queue checks both again under its lock; a
/// freeze that lands between the two is its "frozen" sentence, of kind
/// [`ErrorKind::Failed`].
fn barred(
    store: &dyn StateStore,
    id: &str,
    key: Option<&Path>,
    how: Decide<'_>,
) -> Option<ApiError> {
    if let Err(e) = nightshift_core::owner::verify(store, key) {
        return Some(e.into());
    }
    if matches!(how, Decide::Reject(_)) {
        return None;
    }
    let rules = match nightshift_core::policy::load(store, None) {
        Ok(rules) => rules,
        Err(e) => return Some(e.into()),
    };
    let why = rules.freeze()?.reason.clone();
    Some(ApiError::new(
        ErrorKind::Frozen,
        match how {
            Decide::Approve => format!(
                "nightshift is frozen ({why}): act {id} was neither approved nor carried out; thaw first"
            ),
            _ => format!("nightshift is frozen ({why}): thaw first"),
        },
    ))
}

#[derive(Debug, Clone, Copy)]
enum Decide<'a> {
    Approve,
    Reject(&'a str),
    Rebind,
}

pub(crate) fn owner(
    store: &dyn StateStore,
    key_file: Option<&Path>,
) -> Result<nightshift_core::owner::Owner, ApiError> {
    Ok(nightshift_core::owner::verify(store, key_file)?)
}

/// A run's exit code: an import that failed or dropped the history says so
/// before the agent's own ending does (never success when work is missing).
pub fn run_exit_code(record: &RunRecord) -> i32 {
    use nightshift_core::exit;
    match run::import_state(record) {
        run::ImportState::Failed => exit::IMPORT_FAILED,
        run::ImportState::HistoryDropped => exit::NOT_WHOLE,
        run::ImportState::Whole
            if record.exit_code == Some(0) && record.status.starts_with("exited") =>
        {
            exit::OK
        }
        run::ImportState::Whole => exit::FAILED,
    }
}

/// The exit code `nightshift run` gives for a run that ended in `error`
/// (README.md's table).
pub fn run_error_exit_code(error: &run::RunError) -> i32 {
    ErrorKind::from(error).exit_code()
}

/// This process's `pid:starttime`.
pub fn process_identity() -> String {
    run::process_identity(std::process::id()).unwrap_or_else(|| format!("{}:0", std::process::id()))
}

/// What the socket answers: the reply or the error, and who executed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Answer {
    /// `serve`: the command was executed by the running supervisor.
    pub via: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Reply>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_json_with_a_tag() {
        let c = Command::Reject {
            acts: vec!["a1".into()],
            why: "no".into(),
            owner_key_file: None,
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(
            text,
            r#"{"command":"reject","acts":["a1"],"why":"no","owner_key_file":null}"#
        );
        assert_eq!(serde_json::from_str::<Command>(&text).unwrap(), c);
        let kill: Command =
            serde_json::from_str(r#"{"command":"kill","target":"all","freeze":true,"by":"me"}"#)
                .unwrap();
        assert_eq!(
            kill,
            Command::Kill {
                target: KillTarget::All,
                freeze: true,
                by: "me".into()
            }
        );
    }

    #[test]
    fn each_front_end_records_its_own_name_for_the_owner() {
        assert_eq!(Caller::Local.owner_name(), "owner");
        assert_eq!(Caller::Socket.owner_name(), "owner via serve");
        let alice = Caller::Dashboard {
            user: "alice".into(),
        };
        assert_eq!(alice.owner_name(), "dashboard:alice");
        assert_eq!(alice.freezer(), "dashboard:alice");
    }

    #[test]
    fn only_state_changing_commands_go_to_serve_with_absolute_paths() {
        assert!(!Command::Queue {}.goes_through_serve());
        assert!(!Command::UsersList {}.goes_through_serve());
        let approve = Command::Approve {
            acts: vec!["a".into()],
            owner_key_file: Some("owner.key".into()),
        };
        assert!(approve.goes_through_serve());
        let Command::Approve {
            owner_key_file: Some(key),
            ..
        } = approve.absolutized()
        else {
            unreachable!("absolutized keeps the command")
        };
        assert!(key.is_absolute() && key.ends_with("owner.key"), "{key:?}");
        let Command::Enqueue { tasks } = (Command::Enqueue {
            tasks: vec![TaskSpec {
                repo: "repo".into(),
                ..serde_json::from_str(r#"{"repo": "x", "command": ["true"]}"#).unwrap()
            }],
        })
        .absolutized() else {
            unreachable!("absolutized keeps the command")
        };
        assert!(tasks[0].repo.is_absolute());
    }

    #[test]
    fn a_password_is_never_shown_by_debug() {
        let c = Command::UsersAdd {
            name: "alice".into(),
            role: "owner".into(),
            password: Secret("hunter2-hunter2".into()),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn an_unknown_field_or_command_is_refused() {
        assert!(serde_json::from_str::<Command>(r#"{"command":"runs","x":1}"#).is_err());
        assert!(serde_json::from_str::<Command>(r#"{"command":"format_disk"}"#).is_err());
    }

    fn done(carried_out: bool) -> Decision {
        Decision {
            act: "a".into(),
            outcome: Outcome::Done {
                line: String::new(),
                carried_out,
            },
        }
    }

    fn failed(kind: ErrorKind) -> Decision {
        Decision {
            act: "a".into(),
            outcome: Outcome::Error(ApiError::new(kind, "x")),
        }
    }

    #[test]
    fn decisions_keep_the_command_lines_exit_codes() {
        let code = |decisions| Reply::Decisions { decisions }.exit_code();
        assert_eq!(code(vec![done(true), done(true)]), 0);
        assert_eq!(code(vec![done(true), done(false)]), 1);
        assert_eq!(code(vec![failed(ErrorKind::Frozen), done(false)]), 9);
        assert_eq!(
            code(vec![failed(ErrorKind::Denied), failed(ErrorKind::Failed)]),
            1
        );
        assert_eq!(code(vec![]), 0);
    }

    fn decision_kinds(reply: Reply) -> Vec<(ErrorKind, String)> {
        let Reply::Decisions { decisions } = reply else {
            panic!("not decisions: {reply:?}")
        };
        decisions
            .into_iter()
            .map(|d| match d.outcome {
                Outcome::Error(e) => (e.kind, e.message),
                other => panic!("not an error: {other:?}"),
            })
            .collect()
    }

    /// What bars the owner's decision gets its kind from its type: a key
    /// file that cannot be read is denied (its words say nothing of a
    /// credential), the freeze is frozen for an approval and a rebind, and
    /// a rejection goes on to the queue while frozen.
    #[tokio::test]
    async fn a_decision_is_barred_by_type_not_by_the_queues_words() {
        let dir = tempfile::tempdir().unwrap();
        let api = Api::new(
            Arc::new(nightshift_store_sqlite::store::SqliteBackend::new(
                dir.path().to_path_buf(),
                None,
            )),
            None,
        );
        let Reply::OwnerKey { path: key, .. } = api.execute(Command::OwnerInit {}).await.unwrap()
        else {
            panic!("no key")
        };
        let approve = |key: PathBuf| Command::Approve {
            acts: vec!["a1".into()],
            owner_key_file: Some(key),
        };
        let unreadable = decision_kinds(
            api.execute(approve(dir.path().join("no-such.key")))
                .await
                .unwrap(),
        );
        assert_eq!(unreadable[0].0, ErrorKind::Denied, "{unreadable:?}");
        assert!(!unreadable[0].1.contains("credential"), "{unreadable:?}");

        api.execute(Command::Freeze {
            why: "maintenance".into(),
        })
        .await
        .unwrap();
        let frozen = decision_kinds(api.execute(approve(key.clone())).await.unwrap());
        assert_eq!(frozen[0].0, ErrorKind::Frozen, "{frozen:?}");
        let rebind = decision_kinds(
            api.execute(Command::Rebind {
                acts: vec!["a1".into()],
                owner_key_file: Some(key.clone()),
            })
            .await
            .unwrap(),
        );
        assert_eq!(rebind[0].0, ErrorKind::Frozen, "{rebind:?}");
        let reject = decision_kinds(
            api.execute(Command::Reject {
                acts: vec!["a1".into()],
                why: "no".into(),
                owner_key_file: Some(key),
            })
            .await
            .unwrap(),
        );
        assert_eq!(
            reject,
            [(ErrorKind::Failed, "no act with id a1".to_string())]
        );
    }

    #[test]
    fn a_broken_chain_and_an_unrecorded_kill_are_not_successes() {
        let broken = Reply::Audit(AuditState::Broken {
            first_bad_entry: Some(3),
            error: "x".into(),
        });
        assert_eq!(broken.exit_code(), 1);
        let kill = Reply::Killed(KillReport {
            sandboxes: 1,
            record: KillRecord::NotRecorded(ApiError::new(ErrorKind::State, "x")),
        });
        assert_eq!(kill.exit_code(), 7);
        let pending = Reply::Killed(KillReport {
            sandboxes: 1,
            record: KillRecord::Pending {
                why: "x".into(),
                path: "p".into(),
            },
        });
        assert_eq!(pending.exit_code(), 0);
    }
}
