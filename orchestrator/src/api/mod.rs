//! The supervisor's one command API. Every front end (the command line in
//! `main.rs`, the HTTP layer of `nightshift serve`) only translates what it
//! is given into a [`Command`], hands it to [`Api::execute`], and renders the
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
//!   serialises its writers, never because one process holds it.

mod error;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub use error::{from_act_error, ApiError, ErrorKind};

use crate::run::{self, Supervisor};
use crate::run_queue::{self, TaskRow, TaskSpec};
use crate::store::{RunRecord, StatePaths, Store, StoreError};

/// One request, from any front end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    Thaw { owner_key_file: Option<PathBuf> },
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
    /// Retry the import of a run whose import failed.
    Import { run: String },
    /// The deferred queue: acts (pending first, grouped by run) and the
    /// door requests the gate refused. Expires what has run out of time.
    Queue {},
    /// Approve acts (the owner's credential); each is re-checked and carried out.
    Approve {
        acts: Vec<String>,
        owner_key_file: Option<PathBuf>,
    },
    /// Reject acts with a reason (the owner's credential).
    Reject {
        acts: Vec<String>,
        why: String,
        owner_key_file: Option<PathBuf>,
    },
    /// Re-bind stale acts to their destination as it is now (the owner's credential).
    Rebind {
        acts: Vec<String>,
        owner_key_file: Option<PathBuf>,
    },
    /// Add tasks to the run queue, in order.
    Enqueue { tasks: Vec<TaskSpec> },
    /// The run queue: queued, running and finished tasks.
    Tasks {},
    /// Cancel a queued task.
    CancelTask { task: String },
}

/// Which sandboxes the kill switch stops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KillTarget {
    Run(String),
    All,
}

/// What a command answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Runs { runs: Vec<RunRecord> },
    Run(Box<RunView>),
    Audit(AuditState),
    OwnerKey { path: PathBuf, created: bool },
    Frozen,
    Thawed,
    Killed(KillReport),
    Reconciled { settled: Vec<String> },
    Imported { run: Box<RunRecord> },
    Queue(Box<QueueView>),
    Decisions { decisions: Vec<Decision> },
    Enqueued { tasks: Vec<String> },
    Tasks { tasks: Vec<TaskRow> },
    Cancelled { task: String },
}

impl Reply {
    /// The command line's exit code for this reply (README.md).
    pub fn exit_code(&self) -> i32 {
        use crate::exit;
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunView {
    pub run: RunRecord,
    pub audit: Vec<orchestrator_audit::Entry>,
    pub refusals: Vec<crate::acts::Refusal>,
}

/// The deferred queue as `queue` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueView {
    /// Pending first, grouped by run (`deferred_queue::order_for_listing`).
    pub acts: Vec<QueueItem>,
    /// Refused door requests, oldest first.
    pub refusals: Vec<crate::acts::Refusal>,
    /// Expiring acts failed (the listing is still given).
    pub expire_error: Option<String>,
}

/// One act in the queue's listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueItem {
    pub act: deferred_queue::Act,
    pub state: deferred_queue::State,
    /// The state's name.
    pub status: String,
    /// A push's change against its run's base: (files, insertions, deletions).
    pub diffstat: Option<(u64, u64, u64)>,
    /// The first bytes of a message's content (agent-written: escape before showing).
    pub preview: Option<Vec<u8>>,
}

/// The audit chain's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KillReport {
    pub sandboxes: usize,
    pub record: KillRecord,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum KillRecord {
    /// Recorded: these runs were ended.
    Recorded { runs: Vec<String> },
    /// The store did not answer; what was done waits in `path` for the next
    /// reconciliation.
    Pending { why: String, path: PathBuf },
    /// The sandboxes were stopped but the kill could not be recorded.
    NotRecorded(ApiError),
}

/// One act's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub act: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Outcome {
    /// Decided: `line` says what happened; `carried_out` is false for an
    /// approval that did not go through (stale, expired, failed).
    Done {
        line: String,
        carried_out: bool,
    },
    Error(ApiError),
}

/// The supervisor's API over one state directory and its configuration.
#[derive(Debug, Clone)]
pub struct Api {
    root: PathBuf,
    config: Option<PathBuf>,
}

impl Api {
    /// `config`: the configuration file (default `STATE/config.toml`).
    pub fn new(root: PathBuf, config: Option<PathBuf>) -> Self {
        Self { root, config }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn config_path(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    pub fn open_store(&self) -> Result<Store, ApiError> {
        Ok(Store::open(StatePaths::new(self.root.clone()))?)
    }

    /// The process's one configuration, checked: a broken file is an error,
    /// never silently defaults.
    pub fn load_config(&self) -> Result<crate::config::Config, ApiError> {
        let path = self
            .config
            .clone()
            .unwrap_or_else(|| self.root.join("config.toml"));
        crate::config::Config::load(&path)
            .map_err(|e| ApiError::new(ErrorKind::BadInput, e.to_string()))
    }

    /// Loads the configuration and gives the act queue its lifetimes from it.
    fn with_queue_config(&self) -> Result<(), ApiError> {
        let config = self.load_config()?;
        crate::acts::use_queue_ttls(config.queue_ttls());
        Ok(())
    }

    /// Carries out one command.
    pub async fn execute(&self, command: Command) -> Result<Reply, ApiError> {
        match command {
            Command::Runs {} => Ok(Reply::Runs {
                runs: self.open_store()?.runs()?,
            }),
            Command::Show { run } => self.show(&run),
            Command::AuditVerify {} => self.verify(),
            Command::OwnerInit {} => {
                let store = self.open_store()?;
                let (path, created) = crate::owner::init(&store)
                    .map_err(|e| ApiError::new(ErrorKind::State, e.to_string()))?;
                Ok(Reply::OwnerKey { path, created })
            }
            Command::Freeze { why } => {
                let mut store = self.open_store()?;
                crate::policy::freeze(&mut store, None, &why)?;
                Ok(Reply::Frozen)
            }
            Command::Thaw { owner_key_file } => {
                let mut store = self.open_store()?;
                let who = owner(&store, owner_key_file.as_deref())?;
                crate::policy::thaw(&mut store, None, &who)?;
                Ok(Reply::Thawed)
            }
            Command::Kill { target, freeze, by } => self.kill(target, freeze, &by).await,
            Command::Reconcile {} => {
                self.load_config()?;
                let sup = self.stopping_supervisor().await?;
                let settled = crate::killswitch::reconcile(&sup, None, "nightshift reconcile")
                    .await
                    .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
                Ok(Reply::Reconciled { settled })
            }
            Command::Import { run } => self.import(&run).await,
            Command::Queue {} => self.queue(),
            Command::Approve {
                acts,
                owner_key_file,
            } => self.decide(&acts, owner_key_file.as_deref(), Decide::Approve),
            Command::Reject {
                acts,
                why,
                owner_key_file,
            } => self.decide(&acts, owner_key_file.as_deref(), Decide::Reject(&why)),
            Command::Rebind {
                acts,
                owner_key_file,
            } => self.decide(&acts, owner_key_file.as_deref(), Decide::Rebind),
            Command::Enqueue { tasks } => {
                let config = self.load_config()?;
                let mut store = self.open_store()?;
                let ids = run_queue::enqueue(&mut store, &config, &tasks)?;
                Ok(Reply::Enqueued { tasks: ids })
            }
            Command::Tasks {} => Ok(Reply::Tasks {
                tasks: run_queue::list(&self.open_store()?)?,
            }),
            Command::CancelTask { task } => {
                run_queue::cancel(&mut self.open_store()?, &task)?;
                Ok(Reply::Cancelled { task })
            }
        }
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
        Ok(Reply::Run(Box::new(RunView {
            run,
            audit,
            refusals,
        })))
    }

    fn verify(&self) -> Result<Reply, ApiError> {
        let store = self.open_store()?;
        let snap = store.audit_snapshot()?;
        Ok(Reply::Audit(
            match orchestrator_audit::verify_with_head(
                store.log(),
                &snap.entries,
                &snap.checkpoints,
                snap.head.as_ref(),
            ) {
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
            Err(e) => {
                let kind = match &e {
                    run::RetryError::NothingToRetry { .. } => ErrorKind::BadInput,
                    run::RetryError::Store(StoreError::NoSuchRun(_)) => ErrorKind::NotFound,
                    run::RetryError::Store(_) => ErrorKind::State,
                    run::RetryError::Failed { .. } => ErrorKind::ImportFailed,
                    run::RetryError::WorktreeGone { .. } | run::RetryError::Lock { .. } => {
                        ErrorKind::Internal
                    }
                };
                Err(ApiError::new(kind, e.to_string()))
            }
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
        let engine = crate::engine::Engine::connect().await?;
        let state_tag = crate::state_tag(&self.root);
        let stopped = crate::killswitch::stop_sandboxes(&engine, &state_tag, run, by, freeze)
            .await
            .map_err(|e| ApiError::new(ErrorKind::Engine, e.to_string()))?;
        let sandboxes = stopped.containers.len();

        // Now record it, if the store answers in time.
        let paths = StatePaths::new(self.root.clone());
        let opened = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio::task::spawn_blocking(move || Store::open(paths)),
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
                    store: Arc::new(Mutex::new(store)),
                    state_tag,
                    identity: process_identity(),
                    fleet: None,
                    // Only stops and settles: it creates no sandbox.
                    sandbox_user: Default::default(),
                };
                match crate::killswitch::record_kill(&sup, &stopped).await {
                    Ok(k) => KillRecord::Recorded { runs: k.runs },
                    Err(e) => {
                        let kind = match &e {
                            run::RunError::Store(StoreError::NoSuchRun(_)) => ErrorKind::NotFound,
                            run::RunError::Store(_) => {
                                let _ = crate::killswitch::write_pending(&self.root, &stopped);
                                ErrorKind::State
                            }
                            _ => ErrorKind::Internal,
                        };
                        KillRecord::NotRecorded(ApiError::new(kind, e.to_string()))
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
        let engine = crate::engine::Engine::connect().await?;
        Ok(Supervisor {
            engine,
            store: Arc::new(Mutex::new(store)),
            state_tag: crate::state_tag(&self.root),
            identity: process_identity(),
            fleet: None,
            // Only stops and settles: it creates no sandbox.
            sandbox_user: Default::default(),
        })
    }

    /// What a process that creates sandboxes needs (`serve`'s runs in
    /// process): the state, the engine, and the fleet cgroup with the
    /// limits of `config`, this process's identity on every sandbox.
    pub async fn creating_supervisor(
        &self,
        config: &crate::config::Config,
    ) -> Result<Supervisor, ApiError> {
        let store = self.open_store()?;
        let engine = crate::engine::Engine::connect().await?;
        let state_tag = crate::state_tag(&self.root);
        let fleet = run::FleetHandle::ensure(&state_tag, &config.fleet())
            .map_err(|e| ApiError::new(ErrorKind::Internal, e))?;
        Ok(Supervisor {
            engine,
            store: Arc::new(Mutex::new(store)),
            state_tag,
            identity: process_identity(),
            fleet: Some(fleet),
            sandbox_user: config.sandbox_user(),
        })
    }

    fn decide(
        &self,
        acts: &[String],
        key: Option<&Path>,
        how: Decide<'_>,
    ) -> Result<Reply, ApiError> {
        self.with_queue_config()?;
        let mut store = self.open_store()?;
        let decisions =
            acts.iter()
                .map(|id| {
                    let result = match how {
                        Decide::Approve => crate::acts::approve(&mut store, id, key)
                            .map(|d| (d.line, d.carried_out)),
                        Decide::Reject(why) => crate::acts::reject(&mut store, id, why, key)
                            .map(|()| (format!("act {id}: rejected"), true)),
                        Decide::Rebind => {
                            crate::acts::rebind(&mut store, id, key).map(|(_, line)| (line, true))
                        }
                    };
                    Decision {
                        act: id.clone(),
                        outcome: match result {
                            Ok((line, carried_out)) => Outcome::Done { line, carried_out },
                            Err(e) => Outcome::Error(from_act_error(e)),
                        },
                    }
                })
                .collect();
        Ok(Reply::Decisions { decisions })
    }
}

#[derive(Debug, Clone, Copy)]
enum Decide<'a> {
    Approve,
    Reject(&'a str),
    Rebind,
}

fn owner(store: &Store, key_file: Option<&Path>) -> Result<crate::owner::Owner, ApiError> {
    crate::owner::verify(store, key_file)
        .map_err(|e| ApiError::new(ErrorKind::Denied, e.to_string()))
}

/// A run's exit code: an import that failed or dropped the history says so
/// before the agent's own ending does (never success when work is missing).
pub fn run_exit_code(record: &RunRecord) -> i32 {
    use crate::exit;
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
    use crate::engine::EngineError;
    use crate::exit;
    use run::{RunError, Stop};
    match error {
        RunError::BadInput(_) => exit::BAD_INPUT,
        RunError::Engine(EngineError::ImageMissing(_)) => exit::IMAGE_MISSING,
        RunError::Engine(EngineError::Unreachable { .. }) => exit::ENGINE,
        RunError::Engine(_) => exit::INTERNAL,
        RunError::Refused { .. } => exit::REFUSED,
        RunError::Store(_) => exit::STATE,
        RunError::Git(_) => exit::INTERNAL,
        RunError::Frozen(_) => exit::DENIED,
        RunError::Policy(_) => exit::BAD_INPUT,
        RunError::Interrupted { signal, .. } => match signal {
            Stop::Interrupt => exit::SIGINT,
            Stop::Terminate => exit::SIGTERM,
        },
    }
}

/// This process's `pid:starttime`.
pub fn process_identity() -> String {
    run::process_identity(std::process::id()).unwrap_or_else(|| format!("{}:0", std::process::id()))
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
