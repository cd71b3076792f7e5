//! The state store as the core sees it: ports owned by the core, split by
//! concern ([`AuditLog`], [`ActQueue`], [`RunStore`], [`TaskQueue`],
//! [`Accounts`], [`PolicyStore`]; [`StateStore`] is all of them), with
//! neutral types and their own error ([`StoreError`], whose [`kind`] is
//! decided where the error arises). The SQLite store (`store.rs`)
//! implements them, as does [`fake::MemStore`], a hand-written in-memory
//! fake for unit tests of the code generic over them: the door's gate
//! (`acts::handle`), the act queue (`acts::approve`, `reject`, `rebind`,
//! `expire`, and the executor `acts::executor`), the run lifecycle (`run::execute`
//! through `run::Supervisor`), the owner's credential check
//! (`owner::verify`) and the run queue's adapter (`run_queue`).
//!
//! [`kind`]: StoreError::kind
//!
//! Invariants every implementation keeps (the fake too, so tests of the
//! core mean something):
//! - `append` seals each audit entry after the one before it (one chain);
//!   an error means nothing was appended.
//! - `put_act` stores the act and appends its event together or not at all;
//!   `put_act_within` does so only if the acts already stored, counted in
//!   the same transaction, pass the caller's bounds (two requests at once
//!   never both take the last place: `tests/tests/channels.rs`,
//!   `a_flood_of_acts_at_the_body_limit_keeps_the_supervisor_small`);
//!   `transition_act` moves an act only from the state it names (true when
//!   it moved), with its event, together or not at all.
//! - `move_task` is a compare-and-set: a task moves only from one of the
//!   states named, so no move happens twice
//!   (`orchestrator/store-postgres/tests/contract.rs::tasks_move_by_compare_and_set`).
//! - `end_run` saves a run's final record and appends its ending together,
//!   and writes nothing (`None`) over a record that is already final: a run
//!   is never ended twice. `record_imported` saves the record and marks its
//!   work safe together (`orchestrator/store-postgres/tests/contract.rs::a_run_ends_once`,
//!   `orchestrator/store-postgres/tests/contract.rs::settle_claims_and_import_marks`).
//! - `append_policy_row` and `refuse_scope` write their row and its audit
//!   entry together or not at all.
//! - Acts are carried out only on the caller's side, by an executor that
//!   holds the act's lease ([`ActQueue::claim_act`]): the store keeps the
//!   queue's states and the leases, never runs an executor. At most one
//!   holder has an unlapsed lease on an act at any instant
//!   (`orchestrator/store-postgres/tests/contract.rs::acts_are_claimed_by_one_holder_at_a_time`,
//!   `orchestrator/store-postgres/tests/contract.rs::claimers_at_once_never_share_an_act`).
//!
//! The fake, the SQLite store and the PostgreSQL store are held to these by
//! one store contract suite, written once against these ports and run on
//! all three (`orchestrator/store-postgres/tests/contract.rs`), and by
//! `fake_tests` below.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use orchestrator_audit::{Checkpoint, Entry, LogId};
use serde::{Deserialize, Serialize};

use crate::audit_log::Event;

/// A backend's own error, carried as the cause of a [`StoreError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong with the state, as a caller decides on it: retry,
/// report a conflict, say what was not found, say the disk is full, or
/// give up on the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// Another writer holds the lock past the wait: try again.
    Busy,
    /// The write conflicts with what is stored (a duplicate id).
    Conflict,
    /// What was asked for is not there.
    NotFound,
    /// The state's disk (or the database's) is full.
    DiskFull,
    /// What is stored cannot be read as what it should be.
    Corrupt,
    /// The backend failed otherwise (I/O, connection, SQL).
    Backend,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening the state store {location}: {source}")]
    Open {
        location: String,
        #[source]
        source: BoxError,
    },
    #[error("creating the state directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the state store is busy: {doing}: {source}")]
    Busy {
        doing: &'static str,
        #[source]
        source: BoxError,
    },
    #[error("{doing}: {source}")]
    Backend {
        doing: &'static str,
        #[source]
        source: BoxError,
    },
    #[error("{doing} {path}: {source}")]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path}: line {line}: {message}")]
    BadCheckpoint {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("audit entry {seq} in the store is unreadable: {message}")]
    BadEntry { seq: i64, message: String },
    #[error("no run with id {0}")]
    NoSuchRun(String),
    #[error("{0}")]
    Conflict(String),
    #[error("the store is at schema version {found}, made by a newer nightshift; this one knows versions up to {known}")]
    NewerSchema { found: u32, known: u32 },
    #[error("the state's disk is full: {doing}: {source}")]
    DiskFull {
        doing: &'static str,
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// The kind, decided by the variant (never by the message).
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Busy { .. } => StoreErrorKind::Busy,
            StoreError::Conflict(_) => StoreErrorKind::Conflict,
            StoreError::NoSuchRun(_) => StoreErrorKind::NotFound,
            StoreError::DiskFull { .. } => StoreErrorKind::DiskFull,
            StoreError::BadCheckpoint { .. } | StoreError::BadEntry { .. } => {
                StoreErrorKind::Corrupt
            }
            StoreError::Open { .. }
            | StoreError::NewerSchema { .. }
            | StoreError::CreateDir { .. }
            | StoreError::Backend { .. }
            | StoreError::Io { .. } => StoreErrorKind::Backend,
        }
    }

    /// Whether another writer held the lock past the wait.
    pub fn is_busy(&self) -> bool {
        self.kind() == StoreErrorKind::Busy
    }
}

/// Where everything of one state lives.
#[derive(Debug, Clone)]
pub struct StatePaths {
    pub root: PathBuf,
}

impl StatePaths {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }
    pub fn db(&self) -> PathBuf {
        self.root.join("state.db")
    }
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("audit.checkpoints")
    }
    /// The chain's head, replaced after every append.
    pub fn audit_head(&self) -> PathBuf {
        self.root.join("audit.head")
    }
    pub fn audit_head_lock(&self) -> PathBuf {
        self.root.join("audit.head.lock")
    }
    pub fn worktrees(&self) -> PathBuf {
        self.root.join("worktrees")
    }
    pub fn run_dir(&self, run: &str) -> PathBuf {
        self.root.join("runs").join(run)
    }
    pub fn image_build(&self) -> PathBuf {
        self.root.join("image-build")
    }
    /// The setup caches (docs/setup.md): `setup/<repository id>/<key>/`.
    pub fn setup(&self) -> PathBuf {
        self.root.join("setup")
    }
}

/// The record of one run, as `runs` and `show` print it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    pub id: String,
    pub created_at: String,
    pub repo: String,
    pub base_ref: String,
    pub base_commit: Option<String>,
    pub image: String,
    pub command: Vec<String>,
    pub status: String,
    pub reason: Option<String>,
    pub exit_code: Option<i64>,
    pub container_id: Option<String>,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub duration_ms: Option<i64>,
    pub peak_memory_bytes: Option<i64>,
    pub cpu_ns: Option<i64>,
    pub result_ref: Option<String>,
    pub result_commit: Option<String>,
    pub files_changed: Option<i64>,
    pub insertions: Option<i64>,
    pub deletions: Option<i64>,
    pub attestation: Option<serde_json::Value>,
    pub observed: Option<serde_json::Value>,
    pub supervisor_pid: Option<i64>,
    /// `pid:starttime` of the supervisor that ran it.
    #[serde(default)]
    pub supervisor: Option<String>,
    /// A dry run: no act was queued or carried out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The task text the run was given (`--task`), at most
    /// `sandbox::MAX_TASK_BYTES`; `None` for a run given none and for runs
    /// recorded before it was kept. The owner's words, but it may quote
    /// hostile text: shown only escaped, like agent output.
    #[serde(default)]
    pub task: Option<String>,
}

/// Is a run's status final (it ended, whatever way)? Only `created` and
/// `running` are not.
pub fn is_final(status: &str) -> bool {
    status != "created" && status != "running"
}

/// One row of the run queue (`run_queue.rs` owns what the columns mean).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTask {
    /// The queue's order: tasks start by ascending `seq`.
    pub seq: i64,
    pub id: String,
    pub state: String,
    pub spec: String,
    pub progress: String,
    pub created_at: String,
    pub updated_at: String,
    /// The dispatcher that holds the task (`starting` or `running`), and
    /// until when (unix seconds); see [`TaskQueue::start_tasks`].
    pub lease: Option<(String, i64)>,
    /// The claim's generation, the fencing token: every claim of the task
    /// (a start, a takeover) adds one, so a holder that lost its claim and
    /// took it again later still cannot write with the older claim
    /// ([`TaskFence`]). 0 for a task never claimed.
    pub generation: i64,
}

/// A dispatcher's claim on a task, as it got it: a move made with a fence
/// ([`TaskQueue::move_task`]) happens only while the task is still held by
/// `holder` under that same `generation`, so a dispatcher whose lease was
/// taken over (it stalled, or was cut off from the store) cannot overwrite
/// what the new claimant decided, even after claiming the task again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFence {
    pub holder: String,
    pub generation: i64,
}

/// What a dispatcher's admission decides over every task
/// ([`TaskQueue::start_tasks`]): the queued tasks to start, each with its
/// new progress.
pub type TaskDecision<'a> = &'a mut dyn FnMut(&[StoredTask]) -> Vec<(String, String)>;

/// What `audit verify` checks, read consistently ([`AuditLog::audit_snapshot`]).
#[derive(Debug, Clone)]
pub struct AuditSnapshot {
    pub head: Option<Checkpoint>,
    pub checkpoints: Vec<Checkpoint>,
    pub entries: Vec<Entry>,
}

/// An act as stored: the act, its queue state, its content.
pub type StoredAct = (serde_json::Value, serde_json::Value, Option<Vec<u8>>);

/// A user as stored: name, role, password hash (PHC string), created at.
pub type StoredUser = (String, String, String, String);

/// A session as stored: user, CSRF token, role, expires at (seconds).
pub type StoredSession = (String, String, String, i64);

/// The acts already requested that a new one is counted against: by its
/// run, by every run tonight, by the runs of its repository tonight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActCounts {
    pub of_run: u64,
    pub tonight: u64,
    pub of_repository: u64,
}

/// The bounds a new act must fall within: the night's start (RFC 3339),
/// the run's repository as runs record it, and the caller's pure rule,
/// which names the rule and reason of a refusal.
pub struct ActBounds<'a> {
    pub since: &'a str,
    pub repo: &'a str,
    pub refuse: &'a dyn Fn(ActCounts) -> Option<(&'static str, String)>,
}

impl std::fmt::Debug for ActBounds<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActBounds")
            .field("since", &self.since)
            .field("repo", &self.repo)
            .finish_non_exhaustive()
    }
}

/// The time now, as every stored time is written (RFC 3339, UTC).
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// Creates a directory readable only by its owner: state holds worktrees
/// written by sandboxes, which host users must not reach.
pub fn create_private_dir(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |source| StoreError::CreateDir {
        path: path.to_path_buf(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(err)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(err)?;
    Ok(())
}

/// What identifies where the log is kept, and its size: it changes when
/// the store is replaced, and its length shrinks when rows are removed (the
/// SQLite database file's device, inode and length). The dashboard walks
/// the whole chain again when it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreFingerprint {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
}

/// The audit log: one hash chain, its head and its checkpoints.
pub trait AuditLog {
    /// Where the log is kept, when the backend can say ([`StoreFingerprint`]);
    /// `None` makes every check walk the whole chain.
    fn fingerprint(&self) -> Option<StoreFingerprint> {
        None
    }
    /// The log's identity (the chain's genesis is derived from it).
    fn log_id(&self) -> &LogId;
    /// Appends one audit entry (the only write path for an entry of its
    /// own) and, when `checkpoint` is set, records a checkpoint of it.
    fn append(
        &mut self,
        run: Option<&str>,
        event: &Event,
        checkpoint: bool,
    ) -> Result<Entry, StoreError>;
    /// The chain's head, when one was written.
    fn read_head(&self) -> Result<Option<Checkpoint>, StoreError>;
    /// The head, the checkpoints and the entries, read so that every
    /// entry the head and checkpoints name is among the entries.
    fn audit_snapshot(&self) -> Result<AuditSnapshot, StoreError>;
    /// As [`AuditLog::audit_snapshot`], with only the entries from `seq` on.
    fn audit_snapshot_from(&self, seq: u64) -> Result<AuditSnapshot, StoreError>;
    /// Every entry, in order.
    fn entries(&self) -> Result<Vec<Entry>, StoreError>;
    /// The entries from `seq` on, in order.
    fn entries_from(&self, seq: u64) -> Result<Vec<Entry>, StoreError>;
    /// The refused (or undecided) door requests, of one run or of all.
    fn door_refusals(&self, run: Option<&str>) -> Result<Vec<Entry>, StoreError>;
    /// The entries of one run, in order.
    fn entries_for_run(&self, run: &str) -> Result<Vec<Entry>, StoreError>;
    /// The run and body of every entry of `kind` at or after `since`.
    fn bodies_of_kind_since(
        &self,
        kind: &str,
        since: &str,
    ) -> Result<Vec<(Option<String>, serde_json::Value)>, StoreError>;
    /// The checkpoints, by entry.
    fn checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError>;
    /// The head and the checkpoints, then every entry from `from` on, one
    /// at a time, read as [`AuditLog::audit_snapshot`] reads them (every
    /// entry the head and checkpoints name is among those handed over),
    /// but never all held at once: what `audit verify` walks, in memory
    /// that does not grow with the chain. Stops early when the visitor
    /// says so. The default reads a snapshot (the fake's way).
    fn visit_audit(&self, from: u64, visitor: &mut dyn AuditVisitor) -> Result<(), StoreError> {
        let snap = self.audit_snapshot_from(from)?;
        if !visitor.begin(snap.head, snap.checkpoints) {
            return Ok(());
        }
        for entry in snap.entries {
            if !visitor.entry(entry) {
                break;
            }
        }
        Ok(())
    }
}

/// Verifies the whole chain of `log` as `audit verify` does
/// ([`orchestrator_audit::verify_with_head`]'s verdict), streamed through
/// [`AuditLog::visit_audit`]: memory bounded by the checkpoints, one batch
/// of entries and a ring of recent digests, whatever the chain's length.
/// The outer error is the store's; the inner one the chain's.
pub fn verify_log<L: AuditLog + ?Sized>(
    log: &L,
) -> Result<Result<orchestrator_audit::Verified, orchestrator_audit::VerifyError>, StoreError> {
    Ok(walk_log(log, None)?.map(|(verified, _)| verified))
}

/// [`verify_log`], and then `known` (an entry verified earlier: its seq,
/// hash and time; ignored at seq 0, an empty log) must still be in the
/// chain as it was (else [`orchestrator_audit::BadEntry::StartMismatch`]
/// at its seq, so a chain rewritten and re-sealed from the start is not
/// taken for a good one). On success, also the last entry's checkpoint
/// (seq 0, the genesis hash and no time for an empty log): where a later
/// [`orchestrator_audit::verify_after`] can start. What the dashboard's
/// whole walk is, in the same bounded memory.
pub fn verify_log_since<L: AuditLog + ?Sized>(
    log: &L,
    known: Option<&Checkpoint>,
) -> Result<
    Result<(orchestrator_audit::Verified, Checkpoint), orchestrator_audit::VerifyError>,
    StoreError,
> {
    walk_log(log, known.filter(|k| k.seq > 0))
}

#[allow(clippy::type_complexity)]
fn walk_log<L: AuditLog + ?Sized>(
    log: &L,
    known: Option<&Checkpoint>,
) -> Result<
    Result<(orchestrator_audit::Verified, Checkpoint), orchestrator_audit::VerifyError>,
    StoreError,
> {
    /// Entries judged together (their seals on every core at once).
    const BATCH: usize = 4096;
    struct Verifying<'k> {
        log: LogId,
        state: Option<Result<orchestrator_audit::StreamVerifier, orchestrator_audit::VerifyError>>,
        batch: Vec<Entry>,
        threads: usize,
        known: Option<&'k Checkpoint>,
        known_seen: bool,
        /// The time of the last entry handed over.
        last_time: String,
    }
    impl Verifying<'_> {
        fn flush(&mut self) -> bool {
            let Some(Ok(v)) = &mut self.state else {
                self.batch.clear();
                return false;
            };
            let judged = v.push_batch(&self.batch, self.threads);
            self.batch.clear();
            match judged {
                Ok(()) => true,
                Err(e) => {
                    self.state = Some(Err(e));
                    false
                }
            }
        }
        fn arrived(&mut self, seq: u64, hash: &str, time: &str) {
            if let Some(k) = self.known {
                if k.seq == seq && k.hash == hash && k.time == time {
                    self.known_seen = true;
                }
            }
            self.last_time.clear();
            self.last_time.push_str(time);
        }
    }
    impl AuditVisitor for Verifying<'_> {
        fn begin(&mut self, head: Option<Checkpoint>, checkpoints: Vec<Checkpoint>) -> bool {
            let v = orchestrator_audit::StreamVerifier::new(&self.log, checkpoints, head);
            let go = v.is_ok();
            self.state = Some(v);
            go
        }
        fn entry(&mut self, entry: Entry) -> bool {
            self.arrived(entry.seq, &entry.hash, &entry.time);
            self.batch.push(entry);
            self.batch.len() < BATCH || self.flush()
        }
        /// Hashed from the stored text, no body built: the walk's cost.
        fn raw_entry(&mut self, entry: &orchestrator_audit::RawEntry<'_>) -> Option<bool> {
            // In order: what came parsed before this is judged first.
            if !self.batch.is_empty() && !self.flush() {
                return Some(false);
            }
            let Some(Ok(v)) = &mut self.state else {
                return Some(false);
            };
            let judged = v.push_raw(entry)?;
            self.arrived(entry.seq, entry.hash, entry.time);
            match judged {
                Ok(()) => Some(true),
                Err(e) => {
                    self.state = Some(Err(e));
                    Some(false)
                }
            }
        }
    }
    let mut visiting = Verifying {
        log: log.log_id().clone(),
        state: None,
        batch: Vec::with_capacity(BATCH),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        known,
        known_seen: false,
        last_time: String::new(),
    };
    log.visit_audit(0, &mut visiting)?;
    if !visiting.batch.is_empty() {
        visiting.flush();
    }
    let verified = match visiting.state {
        Some(Ok(v)) => v.finish(),
        Some(Err(e)) => Err(e),
        None => {
            return Err(StoreError::BadEntry {
                seq: 0,
                message: "the store handed over no head or checkpoints".into(),
            })
        }
    };
    Ok(verified.and_then(|v| {
        if let Some(k) = known {
            if !visiting.known_seen {
                return Err(orchestrator_audit::VerifyError::Entry {
                    seq: k.seq,
                    reason: orchestrator_audit::BadEntry::StartMismatch,
                });
            }
        }
        let last = Checkpoint {
            seq: v.entries,
            hash: v.head.clone(),
            time: visiting.last_time,
        };
        Ok((v, last))
    }))
}

/// What [`AuditLog::visit_audit`] hands the log to: `Send`, so a store may
/// call it on the thread that holds its connection.
pub trait AuditVisitor: Send {
    /// The head and the checkpoints, read before any entry; false stops.
    fn begin(&mut self, head: Option<Checkpoint>, checkpoints: Vec<Checkpoint>) -> bool;
    /// The next entry, in order; false stops.
    fn entry(&mut self, entry: Entry) -> bool;
    /// The next entry as stored (its body JSON text, borrowed from the
    /// row), for a store that can hand it over so: `Some(go on)` when the
    /// visitor took it, `None` when it did not (nothing taken), and the
    /// store then parses it and hands it to [`AuditVisitor::entry`]. The
    /// default takes none.
    fn raw_entry(&mut self, _entry: &orchestrator_audit::RawEntry<'_>) -> Option<bool> {
        None
    }
}

/// The queue of acts awaiting the owner, and dry runs' acts.
pub trait ActQueue {
    /// How many acts `run` has requested.
    fn count_acts(&self, run: &str) -> Result<u64, StoreError>;
    /// How many acts were requested at or after `since` (RFC 3339), by
    /// every run or by the runs of repository `repo` (as runs record it).
    fn count_acts_since(&self, since: &str, repo: Option<&str>) -> Result<u64, StoreError>;
    /// Stores a new act with its audit event.
    fn put_act(
        &mut self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        event: &Event,
    ) -> Result<(), StoreError>;
    /// Stores a new act with its audit event only if the acts already
    /// stored, counted at the same moment, pass `bounds`; `Some(refusal)`
    /// (nothing written) when they do not. The default counts, then
    /// stores, through `&mut self`: atomic for a store no one else shares;
    /// a shared store overrides it with one transaction.
    #[allow(clippy::too_many_arguments)]
    fn put_act_within(
        &mut self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        event: &Event,
        bounds: &ActBounds<'_>,
    ) -> Result<Option<(&'static str, String)>, StoreError> {
        let counts = ActCounts {
            of_run: self.count_acts(run)?,
            tonight: self.count_acts_since(bounds.since, None)?,
            of_repository: self.count_acts_since(bounds.since, Some(bounds.repo))?,
        };
        if let Some(refusal) = (bounds.refuse)(counts) {
            return Ok(Some(refusal));
        }
        self.put_act(id, run, act, state, content, event)?;
        Ok(None)
    }
    /// Acts (one, or all) oldest first.
    fn acts(&self, id: Option<&str>) -> Result<Vec<StoredAct>, StoreError>;
    /// The acts whose state's `state` field is one of `states`, oldest
    /// first, `limit` from `offset`, with how many there are in all.
    fn acts_in_states(
        &self,
        states: &[&str],
        offset: u64,
        limit: u64,
    ) -> Result<(Vec<StoredAct>, u64), StoreError>;
    /// Moves an act from `from` to `to` with its audit event.
    fn transition_act(
        &mut self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        event: &Event,
    ) -> Result<bool, StoreError>;
    /// Closes act `id` (moved from `from` to `to` with `event`, as
    /// [`ActQueue::transition_act`]) and queues its replacement `new_id`
    /// (as [`ActQueue::put_act`], with `new_event`), in one transaction:
    /// both or neither. False (nothing written) when `id` is no longer in
    /// `from`. A re-bound stale act is one decision, never half made.
    #[allow(clippy::too_many_arguments)]
    fn replace_act(
        &mut self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        event: &Event,
        new_id: &str,
        new_act: &serde_json::Value,
        new_state: &serde_json::Value,
        content: Option<&[u8]>,
        new_event: &Event,
    ) -> Result<bool, StoreError>;
    /// Claims one act an executor may work on now, for `holder`, until
    /// `lease_until` (unix seconds); `only` limits the claim to that act.
    ///
    /// Contract (every backend; the executor's safety rests on it):
    /// - Claimable is an act whose state's `state` field is `approved`,
    ///   `executing` or `outcome_unknown`, or `awaiting_retry` with its
    ///   `not_before` at or before `now`, and that has no lease or a lease
    ///   that lapsed (`lease_until < now`: a lease counted in whole
    ///   seconds is held through its last second), whoever held it. Pending,
    ///   stale and final acts are never claimed.
    /// - The oldest claimable act (`created_at`, then id) is taken.
    /// - Reading the candidate and writing the lease (`holder`,
    ///   `lease_until`) is atomic: two claimers at once, in any processes,
    ///   never both get the same act while a lease is unlapsed (SQLite:
    ///   one `BEGIN IMMEDIATE` transaction; PostgreSQL: `SELECT ... FOR
    ///   UPDATE SKIP LOCKED` then the update, in one transaction).
    /// - A claim writes no audit entry and does not change the act's
    ///   state; `None` when nothing is claimable.
    /// - Returns the act, its state and its content as stored at the claim.
    fn claim_act(
        &mut self,
        holder: &str,
        now: i64,
        lease_until: i64,
        only: Option<&str>,
    ) -> Result<Option<StoredAct>, StoreError>;
    /// Extends `holder`'s lease on act `id` to `lease_until`; false (nothing
    /// written) when `holder` does not hold it any more (it lapsed at or
    /// before `now` and was taken, or was released). Atomic like the claim.
    fn renew_act(
        &mut self,
        id: &str,
        holder: &str,
        now: i64,
        lease_until: i64,
    ) -> Result<bool, StoreError>;
    /// Gives `holder`'s lease on act `id` back (it is claimable at once);
    /// nothing happens when another holder has it.
    fn release_act(&mut self, id: &str, holder: &str) -> Result<(), StoreError>;
    /// The earliest `not_before` of the acts awaiting a retry, if any: when
    /// an executor's timer should next fire.
    fn next_retry(&self) -> Result<Option<i64>, StoreError> {
        let (rows, _) = self.acts_in_states(&["awaiting_retry"], 0, u64::MAX)?;
        Ok(rows
            .iter()
            .filter_map(|(_, state, _)| state.get("not_before").and_then(|v| v.as_i64()))
            .min())
    }
    /// Records a dry run's act with its audit event, together or not at all.
    fn put_dry_act(
        &mut self,
        id: &str,
        run: &str,
        record: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError>;
    /// Dry runs' acts (of one run, or all), oldest first.
    fn dry_acts(&self, run: Option<&str>) -> Result<Vec<serde_json::Value>, StoreError>;
    /// Act id -> the label its content carries, for every act with one.
    fn act_labels(&self) -> Result<HashMap<String, String>, StoreError>;
}

/// Runs, the kill switch's requests, and the settling of ended runs.
pub trait RunStore {
    /// Every run, oldest first.
    fn runs(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// One run's record.
    fn run(&self, id: &str) -> Result<RunRecord, StoreError>;
    /// Saves a run's record (created or updated).
    fn put_run(&mut self, record: &RunRecord) -> Result<(), StoreError>;
    /// Asks the kill switch to kill `run`, naming who asked; false when
    /// it was asked already.
    fn request_kill(&mut self, run: &str, by: &str) -> Result<bool, StoreError>;
    /// Who asked the kill switch to kill `run`, if anyone did.
    fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError>;
    /// Claims the settling of a run for `claimer`, naming `by` as the
    /// settler; a claim with no claimer, or whose claimer `gone` says is
    /// gone, is taken over. False when a live claimer holds it.
    fn claim_settle(
        &mut self,
        run: &str,
        by: &str,
        claimer: &str,
        gone: &dyn Fn(&str) -> bool,
    ) -> Result<bool, StoreError>;
    /// Gives a settle claim back.
    fn release_settle(&mut self, run: &str, claimer: &str) -> Result<(), StoreError>;
    /// Saves a run whose work is safe and marks it so, together.
    fn record_imported(&mut self, record: &RunRecord) -> Result<(), StoreError>;
    /// Whether a run's work was marked safe.
    fn imported(&self, run: &str) -> Result<bool, StoreError>;
    /// Saves a run's final record with its ending, together; `None` (nothing
    /// written) when the stored record is already final.
    fn end_run(&mut self, record: &RunRecord, event: &Event) -> Result<Option<Entry>, StoreError>;
}

/// The run queue's tasks.
pub trait TaskQueue {
    /// Adds tasks `(id, spec)` in order, all or none.
    fn insert_tasks(&mut self, tasks: &[(String, String)], state: &str) -> Result<(), StoreError>;
    /// Every task, in the queue's order.
    fn tasks(&self) -> Result<Vec<StoredTask>, StoreError>;
    /// Compare-and-set of a task's state; with a `fence`, only while the
    /// task is held under that claim ([`TaskFence`]).
    fn move_task(
        &mut self,
        id: &str,
        from: &[&str],
        to: &str,
        progress: &str,
        fence: Option<&TaskFence>,
    ) -> Result<bool, StoreError>;
    /// Starts tasks for dispatcher `holder`: in one transaction, reads
    /// every task, asks `decide` which queued tasks start (it sees every
    /// dispatcher's `starting` and `running` tasks, so several dispatchers
    /// share one fleet budget), and moves each of those still `queued` to
    /// `starting` with its progress and a lease for `holder` until `until`
    /// (unix seconds), its generation one more than before. Returns the ids
    /// moved with their claims' generations, in the order decided.
    ///
    /// Contract: two dispatchers deciding at once are serialised; neither
    /// decides on what the other's start changed (SQLite: `BEGIN
    /// IMMEDIATE`; PostgreSQL: the table locked against other writers).
    fn start_tasks(
        &mut self,
        holder: &str,
        until: i64,
        decide: TaskDecision<'_>,
    ) -> Result<Vec<(String, i64)>, StoreError>;
    /// Adds task `id` already `starting`, with `progress` and a lease for
    /// `holder` until `until` (generation 1), if `admit` (deciding over every task, as
    /// [`TaskQueue::start_tasks`]'s decision does, in the same kind of
    /// transaction) allows it: the path of a run started in the foreground
    /// (`nightshift run`), which no dispatcher may take while it lives.
    /// False, with nothing written, when `admit` refuses.
    #[allow(clippy::too_many_arguments)]
    fn insert_started_task(
        &mut self,
        id: &str,
        spec: &str,
        progress: &str,
        holder: &str,
        until: i64,
        admit: &mut dyn FnMut(&[StoredTask]) -> bool,
    ) -> Result<bool, StoreError>;
    /// Extends `holder`'s leases on the tasks `ids` to `until`: the ids it
    /// still holds (a task another dispatcher took over is not among them).
    fn renew_tasks(
        &mut self,
        holder: &str,
        ids: &[String],
        until: i64,
    ) -> Result<Vec<String>, StoreError>;
    /// Takes over every `starting` or `running` task whose lease lapsed
    /// (`lease_until < now`: its dispatcher died or stalled) or that has
    /// none (started before leases): each is `holder`'s until `until`,
    /// its generation one more, atomically, so two dispatchers never take
    /// over the same task. Returns them as claimed, in the queue's order.
    fn claim_lapsed_tasks(
        &mut self,
        holder: &str,
        now: i64,
        until: i64,
    ) -> Result<Vec<StoredTask>, StoreError>;
}

/// The dashboard's users and their sessions.
pub trait Accounts {
    /// Adds or replaces a user.
    fn put_user(&mut self, name: &str, role: &str, phc: &str) -> Result<(), StoreError>;
    /// One user.
    fn user(&self, name: &str) -> Result<Option<StoredUser>, StoreError>;
    /// Every user: name, role, created at.
    fn users(&self) -> Result<Vec<(String, String, String)>, StoreError>;
    /// Removes a user and their sessions; false when there was none.
    fn remove_user(&mut self, name: &str) -> Result<bool, StoreError>;
    /// Stores a session by its id's digest.
    fn put_session(
        &mut self,
        id_sha256: &str,
        user: &str,
        csrf: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), StoreError>;
    /// A session unexpired at `now`.
    fn session(&self, id_sha256: &str, now: i64) -> Result<Option<StoredSession>, StoreError>;
    /// Ends a session.
    fn delete_session(&mut self, id_sha256: &str) -> Result<(), StoreError>;
}

/// Rules declared at run time, scope proposals, and the store's metadata.
pub trait PolicyStore {
    /// A value of the store's own metadata (the owner key's digest).
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError>;
    /// Sets (or, with `None`, removes) a value of the metadata.
    fn set_meta(&mut self, key: &str, value: Option<&str>) -> Result<(), StoreError>;
    /// Appends a policy row and its audit entry, together.
    fn append_policy_row(
        &mut self,
        row: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError>;
    /// The stored policy rows, oldest first.
    fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError>;
    /// Stores a scope proposal (replacing one of the same id).
    fn put_scope_proposal(
        &mut self,
        id: &str,
        proposal: &serde_json::Value,
    ) -> Result<(), StoreError>;
    /// One scope proposal.
    fn scope_proposal(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError>;
    /// Records the owner's refusal of a proposal with its audit event.
    fn refuse_scope(&mut self, id: &str, why: &str, event: &Event) -> Result<(), StoreError>;
    /// The ids of the refused proposals.
    fn refused_scopes(&self) -> Result<BTreeSet<String>, StoreError>;
}

/// Everything the product does with state: one connection to one store.
pub trait StateStore:
    AuditLog + ActQueue + RunStore + TaskQueue + Accounts + PolicyStore + Send + std::fmt::Debug
{
    /// The state directory: rule files, destinations, scratch space.
    fn root(&self) -> &Path;
}

/// The model token ledger: reservations and settlements against a run's
/// and the fleet's caps, each one transaction (concurrent calls in any
/// number of processes are serialised, and the decision
/// [`crate::tokens::reserve`] sees both ledgers as they are).
pub trait TokenLedger: Send + std::fmt::Debug {
    /// Reserves `ask` against the run's ledger (all nights) and the fleet's
    /// for `night`, when [`crate::tokens::reserve`] grants it.
    fn reserve(
        &mut self,
        run: &str,
        night: &str,
        run_cap: u64,
        fleet_cap: u64,
        ask: crate::tokens::Ask,
    ) -> Result<Result<crate::tokens::Grant, crate::tokens::Refusal>, StoreError>;
    /// Settles a reservation: releases `reserved`, charges `actual` (or the
    /// whole reservation when the usage is unknown). The run's and the
    /// fleet's ledgers after it.
    fn settle(
        &mut self,
        run: &str,
        night: &str,
        reserved: u64,
        actual: Option<u64>,
    ) -> Result<(crate::tokens::Ledger, crate::tokens::Ledger), StoreError>;
    /// The run's ledger over all nights.
    fn run_tokens(&self, run: &str) -> Result<crate::tokens::Ledger, StoreError>;
}

/// Where the state is kept, built once by the binary from `--store` and
/// handed to everything that reads or writes state: each caller takes its
/// own connection ([`StoreBackend::connect`]); nothing opens a store by a
/// path of its own.
pub trait StoreBackend: Send + Sync + std::fmt::Debug {
    /// A connection to the store (made, and migrated, when absent).
    fn connect(&self) -> Result<Box<dyn StateStore>, StoreError>;
    /// A connection to a store that already exists, waiting at most `busy`
    /// for another writer; `None` when there is no store (the hook's path:
    /// it must answer within a bound and never make a state).
    fn connect_existing(
        &self,
        busy: std::time::Duration,
    ) -> Result<Option<Box<dyn StateStore>>, StoreError>;
    /// The token ledger.
    fn ledger(&self) -> Result<Box<dyn TokenLedger>, StoreError>;
    /// The state directory (rules, destinations, worktrees).
    fn root(&self) -> &Path;
    /// Where the store is, for messages (`sqlite:DIR`, `postgres://host/db`:
    /// never a password).
    fn location(&self) -> String;
    /// Brings the store's schema up to this build's version (making the
    /// store when absent): the versions it went from and to. A store made
    /// by a newer build is refused ([`StoreError::NewerSchema`]).
    fn migrate(&self) -> Result<(u32, u32), StoreError>;
}

/// The store's port as it is handed around.
pub type Stores = std::sync::Arc<dyn StoreBackend>;

/// A store's location as the owner gives it (`--store`, `NIGHTSHIFT_STORE`,
/// `[store] url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite:` (the state directory) or `sqlite:DIR`: the embedded store,
    /// its database and the files beside it in DIR.
    Sqlite(Option<PathBuf>),
    /// `postgres://…` or `postgresql://…`, as libpq reads it.
    Postgres(String),
}

impl StoreUrl {
    /// Parses a store URL, naming what was wrong.
    pub fn parse(text: &str) -> Result<StoreUrl, String> {
        if text == "sqlite" || text == "sqlite:" {
            return Ok(StoreUrl::Sqlite(None));
        }
        if let Some(dir) = text.strip_prefix("sqlite:") {
            let dir = dir.strip_prefix("//").unwrap_or(dir);
            if dir.is_empty() {
                return Ok(StoreUrl::Sqlite(None));
            }
            if dir.contains('?') || dir.contains('#') {
                return Err(format!(
                    "store {text:?}: sqlite:DIR takes a directory, no query or fragment"
                ));
            }
            return Ok(StoreUrl::Sqlite(Some(PathBuf::from(dir))));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(text.to_string()));
        }
        Err(format!(
            "store {:?}: give sqlite:DIR (or sqlite: for the state directory) or postgres://…",
            redact(text)
        ))
    }
}

/// A store URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:…{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

// A boxed connection (what [`StoreBackend::connect`] gives) is a store
// too, so code generic over the ports takes it as it comes.
macro_rules! forward_box {
    ($($name:ident(self: $recv:ty $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        $(fn $name(self: $recv $(, $arg: $ty)*) -> Result<$ret, StoreError> {
            (**self).$name($($arg),*)
        })*
    };
}

impl<T: AuditLog + ?Sized> AuditLog for Box<T> {
    fn log_id(&self) -> &LogId {
        (**self).log_id()
    }
    fn fingerprint(&self) -> Option<StoreFingerprint> {
        (**self).fingerprint()
    }
    forward_box! {
        append(self: &mut Self, run: Option<&str>, event: &Event, checkpoint: bool) -> Entry;
        read_head(self: &Self) -> Option<Checkpoint>;
        audit_snapshot(self: &Self) -> AuditSnapshot;
        audit_snapshot_from(self: &Self, seq: u64) -> AuditSnapshot;
        entries(self: &Self) -> Vec<Entry>;
        entries_from(self: &Self, seq: u64) -> Vec<Entry>;
        door_refusals(self: &Self, run: Option<&str>) -> Vec<Entry>;
        entries_for_run(self: &Self, run: &str) -> Vec<Entry>;
        bodies_of_kind_since(self: &Self, kind: &str, since: &str) -> Vec<(Option<String>, serde_json::Value)>;
        checkpoints(self: &Self) -> Vec<Checkpoint>;
        visit_audit(self: &Self, from: u64, visitor: &mut dyn AuditVisitor) -> ();
    }
}

impl<T: ActQueue + ?Sized> ActQueue for Box<T> {
    forward_box! {
        replace_act(self: &mut Self, id: &str, run: &str, from: &serde_json::Value, to: &serde_json::Value, event: &Event, new_id: &str, new_act: &serde_json::Value, new_state: &serde_json::Value, content: Option<&[u8]>, new_event: &Event) -> bool;
        claim_act(self: &mut Self, holder: &str, now: i64, lease_until: i64, only: Option<&str>) -> Option<StoredAct>;
        renew_act(self: &mut Self, id: &str, holder: &str, now: i64, lease_until: i64) -> bool;
        release_act(self: &mut Self, id: &str, holder: &str) -> ();
        next_retry(self: &Self) -> Option<i64>;
        count_acts(self: &Self, run: &str) -> u64;
        count_acts_since(self: &Self, since: &str, repo: Option<&str>) -> u64;
        put_act(self: &mut Self, id: &str, run: &str, act: &serde_json::Value, state: &serde_json::Value, content: Option<&[u8]>, event: &Event) -> ();
        put_act_within(self: &mut Self, id: &str, run: &str, act: &serde_json::Value, state: &serde_json::Value, content: Option<&[u8]>, event: &Event, bounds: &ActBounds<'_>) -> Option<(&'static str, String)>;
        acts(self: &Self, id: Option<&str>) -> Vec<StoredAct>;
        acts_in_states(self: &Self, states: &[&str], offset: u64, limit: u64) -> (Vec<StoredAct>, u64);
        transition_act(self: &mut Self, id: &str, run: &str, from: &serde_json::Value, to: &serde_json::Value, event: &Event) -> bool;
        put_dry_act(self: &mut Self, id: &str, run: &str, record: &serde_json::Value, event: &Event) -> Entry;
        dry_acts(self: &Self, run: Option<&str>) -> Vec<serde_json::Value>;
        act_labels(self: &Self) -> HashMap<String, String>;
    }
}

impl<T: RunStore + ?Sized> RunStore for Box<T> {
    forward_box! {
        runs(self: &Self) -> Vec<RunRecord>;
        run(self: &Self, id: &str) -> RunRecord;
        put_run(self: &mut Self, record: &RunRecord) -> ();
        request_kill(self: &mut Self, run: &str, by: &str) -> bool;
        kill_request(self: &Self, run: &str) -> Option<String>;
        claim_settle(self: &mut Self, run: &str, by: &str, claimer: &str, gone: &dyn Fn(&str) -> bool) -> bool;
        release_settle(self: &mut Self, run: &str, claimer: &str) -> ();
        record_imported(self: &mut Self, record: &RunRecord) -> ();
        imported(self: &Self, run: &str) -> bool;
        end_run(self: &mut Self, record: &RunRecord, event: &Event) -> Option<Entry>;
    }
}

impl<T: TaskQueue + ?Sized> TaskQueue for Box<T> {
    forward_box! {
        insert_tasks(self: &mut Self, tasks: &[(String, String)], state: &str) -> ();
        tasks(self: &Self) -> Vec<StoredTask>;
        move_task(self: &mut Self, id: &str, from: &[&str], to: &str, progress: &str, fence: Option<&TaskFence>) -> bool;
        start_tasks(self: &mut Self, holder: &str, until: i64, decide: TaskDecision<'_>) -> Vec<(String, i64)>;
        insert_started_task(self: &mut Self, id: &str, spec: &str, progress: &str, holder: &str, until: i64, admit: &mut dyn FnMut(&[StoredTask]) -> bool) -> bool;
        renew_tasks(self: &mut Self, holder: &str, ids: &[String], until: i64) -> Vec<String>;
        claim_lapsed_tasks(self: &mut Self, holder: &str, now: i64, until: i64) -> Vec<StoredTask>;
    }
}

impl<T: Accounts + ?Sized> Accounts for Box<T> {
    forward_box! {
        put_user(self: &mut Self, name: &str, role: &str, phc: &str) -> ();
        user(self: &Self, name: &str) -> Option<StoredUser>;
        users(self: &Self) -> Vec<(String, String, String)>;
        remove_user(self: &mut Self, name: &str) -> bool;
        put_session(self: &mut Self, id_sha256: &str, user: &str, csrf: &str, now: i64, expires_at: i64) -> ();
        session(self: &Self, id_sha256: &str, now: i64) -> Option<StoredSession>;
        delete_session(self: &mut Self, id_sha256: &str) -> ();
    }
}

impl<T: PolicyStore + ?Sized> PolicyStore for Box<T> {
    forward_box! {
        meta(self: &Self, key: &str) -> Option<String>;
        set_meta(self: &mut Self, key: &str, value: Option<&str>) -> ();
        append_policy_row(self: &mut Self, row: &serde_json::Value, event: &Event) -> Entry;
        policy_rows(self: &Self) -> Vec<serde_json::Value>;
        put_scope_proposal(self: &mut Self, id: &str, proposal: &serde_json::Value) -> ();
        scope_proposal(self: &Self, id: &str) -> Option<serde_json::Value>;
        refuse_scope(self: &mut Self, id: &str, why: &str, event: &Event) -> ();
        refused_scopes(self: &Self) -> BTreeSet<String>;
    }
}

impl<T: StateStore + ?Sized> StateStore for Box<T> {
    fn root(&self) -> &Path {
        (**self).root()
    }
}

pub mod fake {
    //! An in-memory [`StateStore`] for unit tests: everything in vectors,
    //! the audit chain sealed as the real store seals it, and switches that
    //! make a write fail, to test what the core does then.

    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::path::{Path, PathBuf};

    use orchestrator_audit::{Checkpoint, Entry, LogId};

    use super::*;

    /// (id, run, act, state, content)
    pub type FakeAct = (
        String,
        String,
        serde_json::Value,
        serde_json::Value,
        Option<Vec<u8>>,
    );

    #[derive(Debug)]
    pub struct MemStore {
        pub root: PathBuf,
        pub log: LogId,
        pub audit: Vec<Entry>,
        pub checkpoints: Vec<Checkpoint>,
        pub policy_rows: Vec<serde_json::Value>,
        pub acts: Vec<FakeAct>,
        pub runs: Vec<RunRecord>,
        pub tasks: Vec<StoredTask>,
        pub meta: BTreeMap<String, String>,
        /// run -> who asked the kill switch to kill it.
        pub kill_requests: BTreeMap<String, String>,
        /// run -> (settler, claimer).
        pub settle_claims: BTreeMap<String, (String, Option<String>)>,
        /// Runs whose work was marked safe, in order.
        pub imported: Vec<String>,
        /// Dry runs' acts: (id, run, record).
        pub dry_acts: Vec<(String, String, serde_json::Value)>,
        /// name -> (role, phc, created at).
        pub users: BTreeMap<String, (String, String, String)>,
        /// id digest -> (user, csrf, expires at).
        pub sessions: BTreeMap<String, (String, String, i64)>,
        pub scope_proposals: BTreeMap<String, serde_json::Value>,
        pub scope_refusals: BTreeMap<String, String>,
        /// act id -> (holder, lease until): executors' leases.
        pub act_leases: BTreeMap<String, (String, i64)>,
        /// When true, every audit append of its own fails (`append`; an
        /// act's writes with their event still succeed).
        pub fail_appends: bool,
        /// When true, counting acts fails.
        pub fail_counts: bool,
    }

    impl MemStore {
        /// An empty state whose files (rules, destinations) live in `root`.
        pub fn new(root: &Path) -> Self {
            Self {
                root: root.to_path_buf(),
                log: LogId("fake".into()),
                audit: Vec::new(),
                checkpoints: Vec::new(),
                policy_rows: Vec::new(),
                acts: Vec::new(),
                runs: Vec::new(),
                tasks: Vec::new(),
                meta: BTreeMap::new(),
                kill_requests: BTreeMap::new(),
                settle_claims: BTreeMap::new(),
                imported: Vec::new(),
                dry_acts: Vec::new(),
                users: BTreeMap::new(),
                sessions: BTreeMap::new(),
                scope_proposals: BTreeMap::new(),
                scope_refusals: BTreeMap::new(),
                act_leases: BTreeMap::new(),
                fail_appends: false,
                fail_counts: false,
            }
        }

        /// The kinds of the audit entries, in order.
        pub fn kinds(&self) -> Vec<&str> {
            self.audit.iter().map(|e| e.kind.as_str()).collect()
        }

        fn seal(&self, run: Option<&str>, event: &Event) -> Result<Entry, StoreError> {
            let (kind, body) = event.kind_and_body();
            let body = match body {
                serde_json::Value::Object(map) => map,
                other => serde_json::Map::from_iter([("value".to_string(), other)]),
            };
            orchestrator_audit::seal(
                &self.log,
                self.audit.last(),
                &now_rfc3339(),
                &kind,
                run,
                body,
            )
            .map_err(|e| StoreError::BadEntry {
                seq: self.audit.len() as i64 + 1,
                message: e.to_string(),
            })
        }

        fn push(&mut self, run: Option<&str>, event: &Event) -> Result<Entry, StoreError> {
            let entry = self.seal(run, event)?;
            self.audit.push(entry.clone());
            Ok(entry)
        }

        fn snapshot_from(&self, seq: u64) -> AuditSnapshot {
            AuditSnapshot {
                head: self.audit.last().map(orchestrator_audit::checkpoint),
                checkpoints: self.checkpoints.clone(),
                entries: self
                    .audit
                    .iter()
                    .filter(|e| e.seq >= seq)
                    .cloned()
                    .collect(),
            }
        }
    }

    fn refused_or_error(e: &Entry) -> bool {
        e.kind == "door_request"
            && matches!(
                e.body.get("verdict").and_then(|v| v.as_str()),
                Some("refused" | "error")
            )
    }

    impl AuditLog for MemStore {
        fn log_id(&self) -> &LogId {
            &self.log
        }
        fn append(
            &mut self,
            run: Option<&str>,
            event: &Event,
            checkpoint: bool,
        ) -> Result<Entry, StoreError> {
            if self.fail_appends {
                return Err(StoreError::BadEntry {
                    seq: self.audit.len() as i64 + 1,
                    message: "the fake store refuses this append".into(),
                });
            }
            let entry = self.push(run, event)?;
            if checkpoint {
                self.checkpoints
                    .push(orchestrator_audit::checkpoint(&entry));
            }
            Ok(entry)
        }
        fn read_head(&self) -> Result<Option<Checkpoint>, StoreError> {
            Ok(self.audit.last().map(orchestrator_audit::checkpoint))
        }
        fn audit_snapshot(&self) -> Result<AuditSnapshot, StoreError> {
            Ok(self.snapshot_from(0))
        }
        fn audit_snapshot_from(&self, seq: u64) -> Result<AuditSnapshot, StoreError> {
            Ok(self.snapshot_from(seq))
        }
        fn entries(&self) -> Result<Vec<Entry>, StoreError> {
            Ok(self.audit.clone())
        }
        fn entries_from(&self, seq: u64) -> Result<Vec<Entry>, StoreError> {
            Ok(self
                .audit
                .iter()
                .filter(|e| e.seq >= seq)
                .cloned()
                .collect())
        }
        fn door_refusals(&self, run: Option<&str>) -> Result<Vec<Entry>, StoreError> {
            Ok(self
                .audit
                .iter()
                .filter(|e| refused_or_error(e) && run.is_none_or(|r| e.run.as_deref() == Some(r)))
                .cloned()
                .collect())
        }
        fn entries_for_run(&self, run: &str) -> Result<Vec<Entry>, StoreError> {
            Ok(self
                .audit
                .iter()
                .filter(|e| e.run.as_deref() == Some(run))
                .cloned()
                .collect())
        }
        fn bodies_of_kind_since(
            &self,
            kind: &str,
            since: &str,
        ) -> Result<Vec<(Option<String>, serde_json::Value)>, StoreError> {
            Ok(self
                .audit
                .iter()
                .filter(|e| e.kind == kind && e.time.as_str() >= since)
                .map(|e| (e.run.clone(), serde_json::Value::Object(e.body.clone())))
                .collect())
        }
        fn checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError> {
            Ok(self.checkpoints.clone())
        }
    }

    impl ActQueue for MemStore {
        fn count_acts(&self, run: &str) -> Result<u64, StoreError> {
            if self.fail_counts {
                return Err(StoreError::BadEntry {
                    seq: 0,
                    message: "the fake store cannot count".into(),
                });
            }
            // Queued or, in a dry run, recorded: as the real stores count.
            Ok(self.acts.iter().filter(|a| a.1 == run).count() as u64
                + self.dry_acts.iter().filter(|a| a.1 == run).count() as u64)
        }
        /// The fake keeps no times: every act counts as tonight's.
        fn count_acts_since(&self, _since: &str, repo: Option<&str>) -> Result<u64, StoreError> {
            if self.fail_counts {
                return Err(StoreError::BadEntry {
                    seq: 0,
                    message: "the fake store cannot count".into(),
                });
            }
            let of_repo = |run: &str| {
                repo.is_none_or(|repo| self.runs.iter().any(|r| r.id == run && r.repo == repo))
            };
            Ok(self.acts.iter().filter(|a| of_repo(&a.1)).count() as u64
                + self.dry_acts.iter().filter(|a| of_repo(&a.1)).count() as u64)
        }
        fn put_act(
            &mut self,
            id: &str,
            run: &str,
            act: &serde_json::Value,
            state: &serde_json::Value,
            content: Option<&[u8]>,
            event: &Event,
        ) -> Result<(), StoreError> {
            if self.acts.iter().any(|a| a.0 == id) {
                return Err(StoreError::Conflict(format!("act {id} exists")));
            }
            self.push(Some(run), event)?;
            self.acts.push((
                id.into(),
                run.into(),
                act.clone(),
                state.clone(),
                content.map(<[u8]>::to_vec),
            ));
            Ok(())
        }
        fn acts(&self, id: Option<&str>) -> Result<Vec<StoredAct>, StoreError> {
            Ok(self
                .acts
                .iter()
                .filter(|a| id.is_none_or(|id| a.0 == id))
                .map(|a| (a.2.clone(), a.3.clone(), a.4.clone()))
                .collect())
        }
        fn acts_in_states(
            &self,
            states: &[&str],
            offset: u64,
            limit: u64,
        ) -> Result<(Vec<StoredAct>, u64), StoreError> {
            let matching: Vec<StoredAct> = self
                .acts
                .iter()
                .filter(|a| {
                    a.3.get("state")
                        .and_then(|s| s.as_str())
                        .is_some_and(|s| states.contains(&s))
                })
                .map(|a| (a.2.clone(), a.3.clone(), a.4.clone()))
                .collect();
            let total = matching.len() as u64;
            let page = matching
                .into_iter()
                .skip(usize::try_from(offset).unwrap_or(usize::MAX))
                .take(usize::try_from(limit).unwrap_or(usize::MAX))
                .collect();
            Ok((page, total))
        }
        fn transition_act(
            &mut self,
            id: &str,
            run: &str,
            from: &serde_json::Value,
            to: &serde_json::Value,
            event: &Event,
        ) -> Result<bool, StoreError> {
            let Some(i) = self.acts.iter().position(|a| a.0 == id && &a.3 == from) else {
                return Ok(false);
            };
            self.push(Some(run), event)?;
            self.acts[i].3 = to.clone();
            Ok(true)
        }
        fn replace_act(
            &mut self,
            id: &str,
            run: &str,
            from: &serde_json::Value,
            to: &serde_json::Value,
            event: &Event,
            new_id: &str,
            new_act: &serde_json::Value,
            new_state: &serde_json::Value,
            content: Option<&[u8]>,
            new_event: &Event,
        ) -> Result<bool, StoreError> {
            let Some(i) = self.acts.iter().position(|a| a.0 == id && &a.3 == from) else {
                return Ok(false);
            };
            if self.acts.iter().any(|a| a.0 == new_id) {
                return Err(StoreError::Conflict(format!("act {new_id} exists")));
            }
            // Both entries are sealed before either is kept: all or nothing.
            let first = self.seal(Some(run), new_event)?;
            self.audit.push(first);
            match self.seal(Some(run), event) {
                Ok(second) => self.audit.push(second),
                Err(e) => {
                    self.audit.pop();
                    return Err(e);
                }
            }
            self.acts[i].3 = to.clone();
            self.acts.push((
                new_id.into(),
                run.into(),
                new_act.clone(),
                new_state.clone(),
                content.map(<[u8]>::to_vec),
            ));
            Ok(true)
        }
        fn claim_act(
            &mut self,
            holder: &str,
            now: i64,
            lease_until: i64,
            only: Option<&str>,
        ) -> Result<Option<StoredAct>, StoreError> {
            let leases = &self.act_leases;
            let found = self.acts.iter().find(|a| {
                only.is_none_or(|o| a.0 == o)
                    && executable(&a.3, now)
                    && leases.get(&a.0).is_none_or(|(_, until)| *until < now)
            });
            let Some(a) = found else {
                return Ok(None);
            };
            let claimed = (a.2.clone(), a.3.clone(), a.4.clone());
            self.act_leases
                .insert(a.0.clone(), (holder.to_string(), lease_until));
            Ok(Some(claimed))
        }
        fn renew_act(
            &mut self,
            id: &str,
            holder: &str,
            _now: i64,
            lease_until: i64,
        ) -> Result<bool, StoreError> {
            match self.act_leases.get_mut(id) {
                Some((h, until)) if h == holder => {
                    *until = lease_until;
                    Ok(true)
                }
                _ => Ok(false),
            }
        }
        fn release_act(&mut self, id: &str, holder: &str) -> Result<(), StoreError> {
            if self.act_leases.get(id).is_some_and(|(h, _)| h == holder) {
                self.act_leases.remove(id);
            }
            Ok(())
        }
        fn put_dry_act(
            &mut self,
            id: &str,
            run: &str,
            record: &serde_json::Value,
            event: &Event,
        ) -> Result<Entry, StoreError> {
            let entry = self.push(Some(run), event)?;
            self.dry_acts.push((id.into(), run.into(), record.clone()));
            Ok(entry)
        }
        fn dry_acts(&self, run: Option<&str>) -> Result<Vec<serde_json::Value>, StoreError> {
            Ok(self
                .dry_acts
                .iter()
                .filter(|a| run.is_none_or(|r| a.1 == r))
                .map(|a| a.2.clone())
                .collect())
        }
        fn act_labels(&self) -> Result<HashMap<String, String>, StoreError> {
            let mut out = HashMap::new();
            for e in self.audit.iter().filter(|e| e.kind == "door_request") {
                if let (Some(act), Some(label)) = (
                    e.body.get("act").and_then(|v| v.as_str()),
                    e.body.get("label").and_then(|v| v.as_str()),
                ) {
                    out.insert(act.to_string(), label.to_string());
                }
            }
            Ok(out)
        }
    }

    /// Whether an act in `state` (as stored) is one an executor may claim
    /// at `now` ([`ActQueue::claim_act`]'s contract).
    pub fn executable(state: &serde_json::Value, now: i64) -> bool {
        match state.get("state").and_then(|s| s.as_str()) {
            Some("approved" | "executing" | "outcome_unknown") => true,
            Some("awaiting_retry") => state
                .get("not_before")
                .and_then(|v| v.as_i64())
                .is_some_and(|t| t <= now),
            _ => false,
        }
    }

    impl RunStore for MemStore {
        fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
            Ok(self.runs.clone())
        }
        fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
            self.runs
                .iter()
                .find(|r| r.id == id)
                .cloned()
                .ok_or_else(|| StoreError::NoSuchRun(id.to_string()))
        }
        fn put_run(&mut self, record: &RunRecord) -> Result<(), StoreError> {
            match self.runs.iter_mut().find(|r| r.id == record.id) {
                Some(r) => *r = record.clone(),
                None => self.runs.push(record.clone()),
            }
            Ok(())
        }
        fn request_kill(&mut self, run: &str, by: &str) -> Result<bool, StoreError> {
            if self.kill_requests.contains_key(run) {
                return Ok(false);
            }
            self.kill_requests.insert(run.into(), by.into());
            Ok(true)
        }
        fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError> {
            Ok(self.kill_requests.get(run).cloned())
        }
        fn claim_settle(
            &mut self,
            run: &str,
            by: &str,
            claimer: &str,
            gone: &dyn Fn(&str) -> bool,
        ) -> Result<bool, StoreError> {
            let take = match self.settle_claims.get(run) {
                None => true,
                Some((_, Some(c))) if c == claimer => true,
                Some((_, Some(c))) if !gone(c) => false,
                Some(_) => true,
            };
            if take {
                self.settle_claims
                    .insert(run.into(), (by.into(), Some(claimer.into())));
            }
            Ok(take)
        }
        fn release_settle(&mut self, run: &str, claimer: &str) -> Result<(), StoreError> {
            if let Some((_, c)) = self.settle_claims.get_mut(run) {
                if c.as_deref() == Some(claimer) {
                    *c = None;
                }
            }
            Ok(())
        }
        fn record_imported(&mut self, record: &RunRecord) -> Result<(), StoreError> {
            self.put_run(record)?;
            if !self.imported.contains(&record.id) {
                self.imported.push(record.id.clone());
            }
            Ok(())
        }
        fn imported(&self, run: &str) -> Result<bool, StoreError> {
            Ok(self.imported.iter().any(|r| r == run))
        }
        fn end_run(
            &mut self,
            record: &RunRecord,
            event: &Event,
        ) -> Result<Option<Entry>, StoreError> {
            let already = self
                .runs
                .iter()
                .any(|r| r.id == record.id && is_final(&r.status));
            if already {
                return Ok(None);
            }
            let entry = self.push(Some(&record.id), event)?;
            self.put_run(record)?;
            Ok(Some(entry))
        }
    }

    impl TaskQueue for MemStore {
        fn insert_tasks(
            &mut self,
            tasks: &[(String, String)],
            state: &str,
        ) -> Result<(), StoreError> {
            let now = now_rfc3339();
            for (id, _) in tasks {
                if self.tasks.iter().any(|t| &t.id == id) {
                    return Err(StoreError::Conflict(format!("task {id} exists")));
                }
            }
            for (id, spec) in tasks {
                let seq = self.tasks.last().map(|t| t.seq + 1).unwrap_or(1);
                self.tasks.push(StoredTask {
                    seq,
                    id: id.clone(),
                    state: state.into(),
                    spec: spec.clone(),
                    progress: "{}".into(),
                    created_at: now.clone(),
                    updated_at: now.clone(),
                    lease: None,
                    generation: 0,
                });
            }
            Ok(())
        }
        fn tasks(&self) -> Result<Vec<StoredTask>, StoreError> {
            Ok(self.tasks.clone())
        }
        fn move_task(
            &mut self,
            id: &str,
            from: &[&str],
            to: &str,
            progress: &str,
            fence: Option<&TaskFence>,
        ) -> Result<bool, StoreError> {
            let held = |t: &StoredTask| {
                fence.is_none_or(|f| {
                    t.generation == f.generation
                        && t.lease.as_ref().is_some_and(|(h, _)| *h == f.holder)
                })
            };
            let Some(t) = self
                .tasks
                .iter_mut()
                .find(|t| t.id == id && from.contains(&t.state.as_str()) && held(t))
            else {
                return Ok(false);
            };
            t.state = to.into();
            t.progress = progress.into();
            t.updated_at = now_rfc3339();
            Ok(true)
        }
        fn start_tasks(
            &mut self,
            holder: &str,
            until: i64,
            decide: TaskDecision<'_>,
        ) -> Result<Vec<(String, i64)>, StoreError> {
            let chosen = decide(&self.tasks);
            let mut started = Vec::new();
            for (id, progress) in chosen {
                if let Some(t) = self
                    .tasks
                    .iter_mut()
                    .find(|t| t.id == id && t.state == "queued")
                {
                    t.state = "starting".into();
                    t.progress = progress;
                    t.updated_at = now_rfc3339();
                    t.lease = Some((holder.into(), until));
                    t.generation += 1;
                    started.push((id, t.generation));
                }
            }
            Ok(started)
        }
        fn insert_started_task(
            &mut self,
            id: &str,
            spec: &str,
            progress: &str,
            holder: &str,
            until: i64,
            admit: &mut dyn FnMut(&[StoredTask]) -> bool,
        ) -> Result<bool, StoreError> {
            if self.tasks.iter().any(|t| t.id == id) {
                return Err(StoreError::Conflict(format!("task {id} exists")));
            }
            if !admit(&self.tasks) {
                return Ok(false);
            }
            let now = now_rfc3339();
            let seq = self.tasks.last().map(|t| t.seq + 1).unwrap_or(1);
            self.tasks.push(StoredTask {
                seq,
                id: id.into(),
                state: "starting".into(),
                spec: spec.into(),
                progress: progress.into(),
                created_at: now.clone(),
                updated_at: now,
                lease: Some((holder.into(), until)),
                generation: 1,
            });
            Ok(true)
        }
        fn renew_tasks(
            &mut self,
            holder: &str,
            ids: &[String],
            until: i64,
        ) -> Result<Vec<String>, StoreError> {
            let mut held = Vec::new();
            for t in self.tasks.iter_mut() {
                if ids.contains(&t.id) && t.lease.as_ref().is_some_and(|(h, _)| h == holder) {
                    t.lease = Some((holder.into(), until));
                    held.push(t.id.clone());
                }
            }
            Ok(held)
        }
        fn claim_lapsed_tasks(
            &mut self,
            holder: &str,
            now: i64,
            until: i64,
        ) -> Result<Vec<StoredTask>, StoreError> {
            let mut taken = Vec::new();
            for t in self.tasks.iter_mut() {
                let live = matches!(t.state.as_str(), "starting" | "running");
                if live && t.lease.as_ref().is_none_or(|(_, u)| *u < now) {
                    t.lease = Some((holder.into(), until));
                    t.generation += 1;
                    taken.push(t.clone());
                }
            }
            Ok(taken)
        }
    }

    impl Accounts for MemStore {
        fn put_user(&mut self, name: &str, role: &str, phc: &str) -> Result<(), StoreError> {
            let created = self
                .users
                .get(name)
                .map(|u| u.2.clone())
                .unwrap_or_else(now_rfc3339);
            self.users
                .insert(name.into(), (role.into(), phc.into(), created));
            self.sessions.retain(|_, s| s.0 != name);
            Ok(())
        }
        fn user(&self, name: &str) -> Result<Option<StoredUser>, StoreError> {
            Ok(self.users.get(name).map(|(role, phc, created)| {
                (name.to_string(), role.clone(), phc.clone(), created.clone())
            }))
        }
        fn users(&self) -> Result<Vec<(String, String, String)>, StoreError> {
            Ok(self
                .users
                .iter()
                .map(|(n, (role, _, created))| (n.clone(), role.clone(), created.clone()))
                .collect())
        }
        fn remove_user(&mut self, name: &str) -> Result<bool, StoreError> {
            self.sessions.retain(|_, s| s.0 != name);
            Ok(self.users.remove(name).is_some())
        }
        fn put_session(
            &mut self,
            id_sha256: &str,
            user: &str,
            csrf: &str,
            now: i64,
            expires_at: i64,
        ) -> Result<(), StoreError> {
            self.sessions.retain(|_, s| s.2 > now);
            if self.sessions.contains_key(id_sha256) {
                return Err(StoreError::Conflict("the session exists".into()));
            }
            self.sessions
                .insert(id_sha256.into(), (user.into(), csrf.into(), expires_at));
            Ok(())
        }
        fn session(&self, id_sha256: &str, now: i64) -> Result<Option<StoredSession>, StoreError> {
            Ok(self
                .sessions
                .get(id_sha256)
                .filter(|s| s.2 > now)
                .and_then(|(user, csrf, exp)| {
                    self.users
                        .get(user)
                        .map(|u| (user.clone(), u.0.clone(), csrf.clone(), *exp))
                }))
        }
        fn delete_session(&mut self, id_sha256: &str) -> Result<(), StoreError> {
            self.sessions.remove(id_sha256);
            Ok(())
        }
    }

    impl PolicyStore for MemStore {
        fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
            Ok(self.meta.get(key).cloned())
        }
        fn set_meta(&mut self, key: &str, value: Option<&str>) -> Result<(), StoreError> {
            match value {
                Some(v) => self.meta.insert(key.into(), v.into()),
                None => self.meta.remove(key),
            };
            Ok(())
        }
        fn append_policy_row(
            &mut self,
            row: &serde_json::Value,
            event: &Event,
        ) -> Result<Entry, StoreError> {
            let entry = self.push(None, event)?;
            self.checkpoints
                .push(orchestrator_audit::checkpoint(&entry));
            self.policy_rows.push(row.clone());
            Ok(entry)
        }
        fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError> {
            Ok(self.policy_rows.clone())
        }
        fn put_scope_proposal(
            &mut self,
            id: &str,
            proposal: &serde_json::Value,
        ) -> Result<(), StoreError> {
            self.scope_proposals.insert(id.into(), proposal.clone());
            Ok(())
        }
        fn scope_proposal(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
            Ok(self.scope_proposals.get(id).cloned())
        }
        fn refuse_scope(&mut self, id: &str, why: &str, event: &Event) -> Result<(), StoreError> {
            self.push(None, event)?;
            self.scope_refusals.insert(id.into(), why.into());
            Ok(())
        }
        fn refused_scopes(&self) -> Result<BTreeSet<String>, StoreError> {
            Ok(self.scope_refusals.keys().cloned().collect())
        }
    }

    impl StateStore for MemStore {
        fn root(&self) -> &Path {
            &self.root
        }
    }

    /// One [`MemStore`] held by several parties at once, as two supervisors
    /// share one database: every call takes the lock for itself alone, so
    /// calls from threads interleave as they would on a real store.
    #[derive(Debug, Clone)]
    pub struct SharedMemStore {
        root: PathBuf,
        log: LogId,
        pub inner: std::sync::Arc<std::sync::Mutex<MemStore>>,
    }

    impl SharedMemStore {
        pub fn new(store: MemStore) -> Self {
            Self {
                root: store.root.clone(),
                log: store.log.clone(),
                inner: std::sync::Arc::new(std::sync::Mutex::new(store)),
            }
        }

        pub fn lock(&self) -> std::sync::MutexGuard<'_, MemStore> {
            self.inner.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    /// Forwards each listed method of a port to the locked [`MemStore`].
    macro_rules! forward {
        ($($name:ident(self: $recv:ty $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
            $(fn $name(self: $recv $(, $arg: $ty)*) -> Result<$ret, StoreError> {
                self.lock().$name($($arg),*)
            })*
        };
    }

    impl AuditLog for SharedMemStore {
        fn log_id(&self) -> &LogId {
            &self.log
        }
        forward! {
            append(self: &mut Self, run: Option<&str>, event: &Event, checkpoint: bool) -> Entry;
            read_head(self: &Self) -> Option<Checkpoint>;
            audit_snapshot(self: &Self) -> AuditSnapshot;
            audit_snapshot_from(self: &Self, seq: u64) -> AuditSnapshot;
            entries(self: &Self) -> Vec<Entry>;
            entries_from(self: &Self, seq: u64) -> Vec<Entry>;
            door_refusals(self: &Self, run: Option<&str>) -> Vec<Entry>;
            entries_for_run(self: &Self, run: &str) -> Vec<Entry>;
            bodies_of_kind_since(self: &Self, kind: &str, since: &str) -> Vec<(Option<String>, serde_json::Value)>;
            checkpoints(self: &Self) -> Vec<Checkpoint>;
        }
    }

    impl ActQueue for SharedMemStore {
        forward! {
            count_acts(self: &Self, run: &str) -> u64;
            count_acts_since(self: &Self, since: &str, repo: Option<&str>) -> u64;
            put_act(self: &mut Self, id: &str, run: &str, act: &serde_json::Value, state: &serde_json::Value, content: Option<&[u8]>, event: &Event) -> ();
            put_act_within(self: &mut Self, id: &str, run: &str, act: &serde_json::Value, state: &serde_json::Value, content: Option<&[u8]>, event: &Event, bounds: &ActBounds<'_>) -> Option<(&'static str, String)>;
            acts(self: &Self, id: Option<&str>) -> Vec<StoredAct>;
            acts_in_states(self: &Self, states: &[&str], offset: u64, limit: u64) -> (Vec<StoredAct>, u64);
            transition_act(self: &mut Self, id: &str, run: &str, from: &serde_json::Value, to: &serde_json::Value, event: &Event) -> bool;
            replace_act(self: &mut Self, id: &str, run: &str, from: &serde_json::Value, to: &serde_json::Value, event: &Event, new_id: &str, new_act: &serde_json::Value, new_state: &serde_json::Value, content: Option<&[u8]>, new_event: &Event) -> bool;
            claim_act(self: &mut Self, holder: &str, now: i64, lease_until: i64, only: Option<&str>) -> Option<StoredAct>;
            renew_act(self: &mut Self, id: &str, holder: &str, now: i64, lease_until: i64) -> bool;
            release_act(self: &mut Self, id: &str, holder: &str) -> ();
            next_retry(self: &Self) -> Option<i64>;
            put_dry_act(self: &mut Self, id: &str, run: &str, record: &serde_json::Value, event: &Event) -> Entry;
            dry_acts(self: &Self, run: Option<&str>) -> Vec<serde_json::Value>;
            act_labels(self: &Self) -> HashMap<String, String>;
        }
    }

    impl RunStore for SharedMemStore {
        forward! {
            runs(self: &Self) -> Vec<RunRecord>;
            run(self: &Self, id: &str) -> RunRecord;
            put_run(self: &mut Self, record: &RunRecord) -> ();
            request_kill(self: &mut Self, run: &str, by: &str) -> bool;
            kill_request(self: &Self, run: &str) -> Option<String>;
            claim_settle(self: &mut Self, run: &str, by: &str, claimer: &str, gone: &dyn Fn(&str) -> bool) -> bool;
            release_settle(self: &mut Self, run: &str, claimer: &str) -> ();
            record_imported(self: &mut Self, record: &RunRecord) -> ();
            imported(self: &Self, run: &str) -> bool;
            end_run(self: &mut Self, record: &RunRecord, event: &Event) -> Option<Entry>;
        }
    }

    impl TaskQueue for SharedMemStore {
        forward! {
            insert_tasks(self: &mut Self, tasks: &[(String, String)], state: &str) -> ();
            tasks(self: &Self) -> Vec<StoredTask>;
            move_task(self: &mut Self, id: &str, from: &[&str], to: &str, progress: &str, fence: Option<&TaskFence>) -> bool;
            start_tasks(self: &mut Self, holder: &str, until: i64, decide: TaskDecision<'_>) -> Vec<(String, i64)>;
            insert_started_task(self: &mut Self, id: &str, spec: &str, progress: &str, holder: &str, until: i64, admit: &mut dyn FnMut(&[StoredTask]) -> bool) -> bool;
            renew_tasks(self: &mut Self, holder: &str, ids: &[String], until: i64) -> Vec<String>;
            claim_lapsed_tasks(self: &mut Self, holder: &str, now: i64, until: i64) -> Vec<StoredTask>;
        }
    }

    impl Accounts for SharedMemStore {
        forward! {
            put_user(self: &mut Self, name: &str, role: &str, phc: &str) -> ();
            user(self: &Self, name: &str) -> Option<StoredUser>;
            users(self: &Self) -> Vec<(String, String, String)>;
            remove_user(self: &mut Self, name: &str) -> bool;
            put_session(self: &mut Self, id_sha256: &str, user: &str, csrf: &str, now: i64, expires_at: i64) -> ();
            session(self: &Self, id_sha256: &str, now: i64) -> Option<StoredSession>;
            delete_session(self: &mut Self, id_sha256: &str) -> ();
        }
    }

    impl PolicyStore for SharedMemStore {
        forward! {
            meta(self: &Self, key: &str) -> Option<String>;
            set_meta(self: &mut Self, key: &str, value: Option<&str>) -> ();
            append_policy_row(self: &mut Self, row: &serde_json::Value, event: &Event) -> Entry;
            policy_rows(self: &Self) -> Vec<serde_json::Value>;
            put_scope_proposal(self: &mut Self, id: &str, proposal: &serde_json::Value) -> ();
            scope_proposal(self: &Self, id: &str) -> Option<serde_json::Value>;
            refuse_scope(self: &mut Self, id: &str, why: &str, event: &Event) -> ();
            refused_scopes(self: &Self) -> BTreeSet<String>;
        }
    }

    impl StateStore for SharedMemStore {
        fn root(&self) -> &Path {
            &self.root
        }
    }
}

/// The fake keeps the trait's invariants, so tests of the core on it mean
/// what they say.
#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn store_urls_parse_and_passwords_never_show() {
        assert_eq!(StoreUrl::parse("sqlite:").unwrap(), StoreUrl::Sqlite(None));
        assert_eq!(
            StoreUrl::parse("sqlite:/var/ns").unwrap(),
            StoreUrl::Sqlite(Some("/var/ns".into()))
        );
        assert!(matches!(
            StoreUrl::parse("postgres://u:pw@h/db").unwrap(),
            StoreUrl::Postgres(_)
        ));
        let e = StoreUrl::parse("mysql://root:hunter2@h/db").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        assert_eq!(redact("postgres://u:pw@h/db"), "postgres://u:…@h/db");
        assert_eq!(
            redact("postgres:///db?host=/tmp"),
            "postgres:///db?host=/tmp"
        );
        assert!(StoreUrl::parse("sqlite:/x?mode=ro").is_err());
    }
}

#[cfg(test)]
mod fake_tests {
    use super::fake::MemStore;
    use super::{ActQueue, RunStore};
    use crate::audit_log::Event;
    use crate::state_store::RunRecord;

    fn ended(status: &str) -> Event {
        Event::RunEnded {
            status: status.into(),
            reason: None,
        }
    }

    #[test]
    fn a_run_is_ended_once_and_acts_move_only_from_the_state_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MemStore::new(dir.path());
        let mut run = RunRecord {
            id: "r1".into(),
            status: "running".into(),
            ..Default::default()
        };
        store.put_run(&run).unwrap();
        run.status = "exited 0".into();
        assert!(store.end_run(&run, &ended("exited 0")).unwrap().is_some());
        run.status = "killed: by someone".into();
        assert!(store.end_run(&run, &ended("killed")).unwrap().is_none());
        assert_eq!(store.run("r1").unwrap().status, "exited 0");
        assert_eq!(store.kinds(), ["run_ended"]);

        let (pending, done) = (serde_json::json!("pending"), serde_json::json!("done"));
        let event = ended("x");
        store
            .put_act("a1", "r1", &serde_json::json!({}), &pending, None, &event)
            .unwrap();
        assert!(store
            .transition_act("a1", "r1", &pending, &done, &event)
            .unwrap());
        assert!(!store
            .transition_act("a1", "r1", &pending, &done, &event)
            .unwrap());
        assert_eq!(
            store.audit.len(),
            3,
            "a move that did not happen was audited"
        );
        orchestrator_audit::verify(&store.log, &store.audit, &[]).unwrap();
    }
}
