//! The state store: one SQLite database per state directory, plus the audit
//! checkpoints in a separate append-only file beside it
//! (`tests/tests/audit.rs::deleting_the_tail_before_the_last_checkpoint_is_found`).
//!
//! Invariants:
//! - Every write is one transaction; the audit append takes the database's
//!   write lock (`BEGIN IMMEDIATE`) so concurrent CLI invocations chain their
//!   entries one after another and never fork the chain
//!   (`orchestrator/store-postgres/tests/contract.rs::concurrent_appends_never_fork_the_chain`,
//!   `tests/tests/audit.rs::concurrent_runs_keep_one_intact_chain_and_a_tamper_is_named`).
//! - Checkpoints live apart from the entries (`audit.checkpoints`, JSON lines)
//!   so that rewriting the database alone cannot hide a truncation; a
//!   checkpoint is appended only after its entry is committed, so a crash can
//!   lose a checkpoint but never name an entry that does not exist (the
//!   chain verifies after every `kill -9` of
//!   `tests/tests/faults.rs::fault_injection_settles_every_run_exactly_once`).
//! - The chain's head (`audit.head`: a checkpoint of the last entry) is
//!   replaced after every committed transaction that appends an entry, so
//!   removing any suffix of the log is seen by `verify`. It is written after
//!   the commit (the database is `synchronous = FULL`), so it is never ahead
//!   of the database, even after a crash or a power cut (it is not fsynced:
//!   a cut leaves it behind, or empty, which reads as absent). It is
//!   replaced atomically (a temporary file renamed over it) under
//!   `audit.head.lock`, and only by a later entry, so concurrent appenders in
//!   several processes never move it back. A writer that dies between its
//!   commit and the head leaves the head behind (a weaker check, never a
//!   false alarm); a head that cannot be written is logged, and the append
//!   still succeeds, being committed
//!   (`orchestrator/store-postgres/tests/contract.rs::concurrent_appends_never_fork_the_chain`,
//!   `tests/tests/audit.rs::deleting_the_tail_after_the_last_checkpoint_is_found_by_the_head`,
//!   `tests/tests/faults.rs::fault_injection_settles_every_run_exactly_once`).
//! - [`Store::audit_snapshot`] reads the head and the checkpoints before the
//!   entries, so everything they name was committed before the entries are
//!   read: a verify beside appenders never reports a truncation that is not
//!   (`orchestrator/store-postgres/tests/contract.rs::a_snapshot_beside_appenders_verifies`,
//!   `tests/tests/audit.rs::verify_beside_concurrent_appenders_never_cries_wolf`).
//! - This module is the only one that names rusqlite
//!   (`scripts/check-layers.py`).

use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use orchestrator_audit::{Checkpoint, Entry, LogId};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use nightshift_core::audit_log::Event;
pub use nightshift_core::state_store::{
    create_private_dir, is_final, now_rfc3339, AuditSnapshot, BoxError, RunRecord, StatePaths,
    StoreError, StoreErrorKind, StoredTask,
};

fn sql(doing: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| classify(doing, source)
}

/// The neutral error for a SQLite error: its kind decided here, from
/// SQLite's own code.
fn classify(doing: &'static str, source: rusqlite::Error) -> StoreError {
    if is_disk_full(&source) {
        StoreError::DiskFull {
            doing,
            source: Box::new(source),
        }
    } else if is_busy(&source) {
        StoreError::Busy {
            doing,
            source: Box::new(source),
        }
    } else if matches!(
        source.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ConstraintViolation)
    ) {
        StoreError::Conflict(format!("{doing}: {source}"))
    } else {
        StoreError::Backend {
            doing,
            source: Box::new(source),
        }
    }
}

/// The error for a database that could not be opened: busy when another
/// process holds it, else naming the file.
fn open_error(db: &Path) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |source| {
        if is_busy(&source) {
            StoreError::Busy {
                doing: "opening the state store",
                source: Box::new(source),
            }
        } else {
            StoreError::Open {
                location: db.display().to_string(),
                source: Box::new(source),
            }
        }
    }
}

/// The state roots this process opened, for telling a full disk from
/// another I/O error (SQLite reports both as "disk I/O error" at times).
static STATE_ROOTS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Below this many free bytes, an I/O error of the state store is taken for
/// a full disk.
const NEARLY_FULL: u64 = 256 * 1024;

/// Whether the filesystem holding `path` has (nearly) no space left.
pub fn disk_nearly_full(path: &Path) -> bool {
    nix::sys::statvfs::statvfs(path)
        .is_ok_and(|s| s.blocks_available().saturating_mul(s.fragment_size()) < NEARLY_FULL)
}

fn is_disk_full(e: &rusqlite::Error) -> bool {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => true,
        Some(rusqlite::ErrorCode::SystemIoFailure | rusqlite::ErrorCode::ReadOnly) => STATE_ROOTS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|r| disk_nearly_full(r)),
        _ => false,
    }
}

#[derive(Debug)]
pub struct Store {
    conn: Connection,
    /// Where the database and its files beside it are.
    paths: StatePaths,
    /// The state directory (rules, destinations, worktrees): the same
    /// directory unless the store was placed elsewhere (`sqlite:DIR`).
    root: PathBuf,
    log: LogId,
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    kind TEXT NOT NULL,
    run TEXT,
    body TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_run ON audit(run);
CREATE INDEX IF NOT EXISTS audit_kind_time ON audit(kind, time);
CREATE TABLE IF NOT EXISTS kill_requests (
    run TEXT PRIMARY KEY,
    by TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS settled (
    run TEXT PRIMARY KEY,
    by TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS acts (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    act TEXT NOT NULL,
    state TEXT NOT NULL,
    content BLOB,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS acts_run ON acts(run);
CREATE TABLE IF NOT EXISTS tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    spec TEXT NOT NULL,
    progress TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    phc TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id_sha256 TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    csrf TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS acts_created ON acts(created_at, id);
CREATE TABLE IF NOT EXISTS policy_rows (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    row TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dry_acts (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS dry_acts_run ON dry_acts(run);
CREATE TABLE IF NOT EXISTS scope_proposals (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    proposal TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS scope_refusals (
    id TEXT PRIMARY KEY,
    at TEXT NOT NULL,
    why TEXT NOT NULL
);
"#;

/// Whether the filesystem holding `dir` has (nearly) no room left for an
/// unprivileged writer: under 64 KiB available.
fn filesystem_full(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|s| s.blocks_available().saturating_mul(s.fragment_size()) < 64 * 1024)
}

impl Store {
    /// Opens (creating when absent) the state under `paths.root`.
    pub fn open(paths: StatePaths) -> Result<Self, StoreError> {
        create_private_dir(&paths.root)?;
        {
            let mut roots = STATE_ROOTS.lock().unwrap_or_else(|p| p.into_inner());
            if !roots.contains(&paths.root) {
                roots.push(paths.root.clone());
            }
        }
        // Two first invocations may race to create the database: switching to
        // WAL and creating the schema can answer "busy" without waiting, so
        // the whole preparation is retried for a while.
        let mut attempt = 0;
        loop {
            match Self::prepare(&paths) {
                // A full disk can answer "busy" too (the shared-memory index
                // cannot be made while another process recovers it): named
                // as the full disk it is, read as below.
                Err(e) if e.is_busy() && filesystem_full(&paths.root) => {
                    let full = StoreError::DiskFull {
                        doing: "opening the state",
                        source: Box::new(e),
                    };
                    return Self::prepare_alone(&paths).map_err(|_| full);
                }
                Err(e) if e.is_busy() && attempt < 50 => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20 * attempt));
                }
                // On a full disk the shared-memory index cannot be made:
                // reading still works through a connection that keeps the
                // index in its own memory ([`Self::prepare_alone`]); writes
                // then fail with the same "disk is full" error.
                Err(e @ StoreError::DiskFull { .. }) => {
                    return Self::prepare_alone(&paths).map_err(|_| e)
                }
                other => return other,
            }
        }
    }

    /// Opens a state that already exists, never making one, and waits at
    /// most `busy` for a lock another process holds (the harness hook must
    /// answer within a bound: `nightshift_core::policy::HOOK_BOUND`). `Ok(None)` when
    /// there is no state database under `paths.root`. The schema is taken as
    /// it is (every state is made by [`Store::open`]).
    pub fn open_existing(paths: StatePaths, busy: Duration) -> Result<Option<Self>, StoreError> {
        let db = paths.db();
        if !db.is_file() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(
            &db,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
                | rusqlite::OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(open_error(&db))?;
        conn.busy_timeout(busy)
            .map_err(sql("setting the busy timeout"))?;
        conn.pragma_update(None, "mmap_size", 0)
            .map_err(sql("turning off memory-mapped I/O"))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql("setting synchronous writes"))?;
        let id: String = conn
            .query_row("SELECT value FROM meta WHERE key = 'log_id'", [], |r| {
                r.get(0)
            })
            .map_err(sql("reading the audit log id"))?;
        {
            let mut roots = STATE_ROOTS.lock().unwrap_or_else(|p| p.into_inner());
            if !roots.contains(&paths.root) {
                roots.push(paths.root.clone());
            }
        }
        Ok(Some(Self {
            conn,
            root: paths.root.clone(),
            paths,
            log: LogId(id),
        }))
    }

    /// Whether `e` is another process holding the database's lock.
    pub fn is_busy(e: &StoreError) -> bool {
        e.is_busy()
    }

    fn prepare(paths: &StatePaths) -> Result<Self, StoreError> {
        let db = paths.db();
        let conn = Connection::open(&db).map_err(open_error(&db))?;
        conn.busy_timeout(Duration::from_secs(30))
            .map_err(sql("setting the busy timeout"))?;
        // No memory-mapped database pages: a write through a mapping on a
        // full disk is a SIGBUS, where a write(2) is an error we can name.
        conn.pragma_update(None, "mmap_size", 0)
            .map_err(sql("turning off memory-mapped I/O"))?;
        // A database already in WAL mode stays so without a write, so that
        // reading works when the state's disk is full.
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .map_err(sql("reading the journal mode"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(sql("enabling write-ahead logging"))?;
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql("setting synchronous writes"))?;
        migrate(&conn)?;
        let log = Self::read_log_id(&conn)?;
        Ok(Self {
            conn,
            paths: paths.clone(),
            root: paths.root.clone(),
            log,
        })
    }

    fn prepare_alone(paths: &StatePaths) -> Result<Self, StoreError> {
        let db = paths.db();
        let conn = Connection::open(&db).map_err(open_error(&db))?;
        conn.busy_timeout(Duration::from_secs(30))
            .map_err(sql("setting the busy timeout"))?;
        // Exclusive locking keeps the WAL index in this process's memory:
        // no shared-memory file to create or grow on the full disk.
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .map_err(sql("taking the state store alone"))?;
        conn.pragma_update(None, "mmap_size", 0)
            .map_err(sql("turning off memory-mapped I/O"))?;
        let id: String = conn
            .query_row("SELECT value FROM meta WHERE key = 'log_id'", [], |r| {
                r.get(0)
            })
            .map_err(sql("reading the audit log id"))?;
        Ok(Self {
            conn,
            paths: paths.clone(),
            root: paths.root.clone(),
            log: LogId(id),
        })
    }

    fn read_log_id(conn: &Connection) -> Result<LogId, StoreError> {
        let existing: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'log_id'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql("reading the audit log id"))?;
        if let Some(id) = existing {
            return Ok(LogId(id));
        }
        let fresh = ulid::Ulid::new().to_string().to_lowercase();
        // INSERT OR IGNORE: two first invocations racing agree on one id.
        conn.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('log_id', ?1)",
            params![fresh],
        )
        .map_err(sql("writing the audit log id"))?;
        let id: String = conn
            .query_row("SELECT value FROM meta WHERE key = 'log_id'", [], |r| {
                r.get(0)
            })
            .map_err(sql("reading the audit log id"))?;
        Ok(LogId(id))
    }

    pub fn paths(&self) -> &StatePaths {
        &self.paths
    }

    pub fn log(&self) -> &LogId {
        &self.log
    }

    pub fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", params![key], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql("reading a setting"))
    }

    pub fn set_meta(&self, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        match value {
            Some(v) => self.conn.execute(
                "INSERT INTO meta(key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, v],
            ),
            None => self
                .conn
                .execute("DELETE FROM meta WHERE key = ?1", params![key]),
        }
        .map_err(sql("writing a setting"))?;
        Ok(())
    }

    // ----- runs -----

    pub fn put_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        let record = serde_json::to_string(run).map_err(|e| StoreError::BadEntry {
            seq: 0,
            message: e.to_string(),
        })?;
        self.conn
            .execute(
                "INSERT INTO runs(id, created_at, record) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET record = excluded.record",
                params![run.id, run.created_at, record],
            )
            .map_err(sql("saving a run"))?;
        Ok(())
    }

    pub fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
        let record: Option<String> = self
            .conn
            .query_row("SELECT record FROM runs WHERE id = ?1", params![id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql("reading a run"))?;
        let record = record.ok_or_else(|| StoreError::NoSuchRun(id.to_string()))?;
        serde_json::from_str(&record).map_err(|e| StoreError::BadEntry {
            seq: 0,
            message: format!("run {id}: {e}"),
        })
    }

    pub fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, record FROM runs ORDER BY created_at, id")
            .map_err(sql("listing runs"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(sql("listing runs"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, record) = row.map_err(sql("listing runs"))?;
            out.push(
                serde_json::from_str(&record).map_err(|e| StoreError::BadEntry {
                    seq: 0,
                    message: format!("run {id}: {e}"),
                })?,
            );
        }
        Ok(out)
    }

    /// Records that a run is to be killed, by whom (the first request wins).
    pub fn request_kill(&self, run: &str, by: &str) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO kill_requests(run, by, at) VALUES (?1, ?2, ?3)",
                params![run, by, now_rfc3339()],
            )
            .map_err(sql("recording a kill request"))?;
        Ok(n == 1)
    }

    pub fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row(
                "SELECT by FROM kill_requests WHERE run = ?1",
                params![run],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("reading a kill request"))
    }

    // ----- acts -----

    /// Queues an act: its row and its audit entry in one transaction.
    pub fn put_act(
        &mut self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        event: &Event,
    ) -> Result<(), StoreError> {
        self.insert_act(id, run, act, state, content, event, None)
            .map(|_| ())
    }

    /// Queues an act only if the acts already stored, counted inside the
    /// same `BEGIN IMMEDIATE` transaction, pass `bounds` (so two requests
    /// at once, from one door or two supervisors, never both take the last
    /// place); `Some(refusal)` with nothing written when they do not.
    #[allow(clippy::too_many_arguments)]
    pub fn put_act_within(
        &mut self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        event: &Event,
        bounds: &nightshift_core::state_store::ActBounds<'_>,
    ) -> Result<Option<(&'static str, String)>, StoreError> {
        self.insert_act(id, run, act, state, content, event, Some(bounds))
    }

    /// The one write path of a new act: its row and its audit entry in one
    /// transaction, after `bounds` (if any) pass on the counts read in it.
    #[allow(clippy::too_many_arguments)]
    fn insert_act(
        &mut self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        event: &Event,
        bounds: Option<&nightshift_core::state_store::ActBounds<'_>>,
    ) -> Result<Option<(&'static str, String)>, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the act queue"))?;
        if let Some(bounds) = bounds {
            let counts = nightshift_core::state_store::ActCounts {
                of_run: count_acts_of_run(&tx, run)?,
                tonight: count_acts_since_in(&tx, bounds.since, None)?,
                of_repository: count_acts_since_in(&tx, bounds.since, Some(bounds.repo))?,
            };
            if let Some(refusal) = (bounds.refuse)(counts) {
                return Ok(Some(refusal));
            }
        }
        let now = now_rfc3339();
        tx.execute(
            "INSERT INTO acts(id, run, act, state, content, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
            params![id, run, act.to_string(), state.to_string(), content, now],
        )
        .map_err(sql("queueing an act"))?;
        let entry = append_in(&tx, &self.log, Some(run), event)?;
        tx.commit().map_err(sql("committing a queued act"))?;
        self.publish_head(&entry);
        Ok(None)
    }

    /// Moves an act from `from` to `to` with its audit entry, in one
    /// transaction, only if its state is still `from`. False when another
    /// process moved it first (nothing is written then).
    pub fn transition_act(
        &mut self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        event: &Event,
    ) -> Result<bool, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the act queue"))?;
        if !act_in_state(&tx, id, from)? {
            return Ok(false);
        }
        tx.execute(
            "UPDATE acts SET state = ?1, updated_at = ?2 WHERE id = ?3",
            params![to.to_string(), now_rfc3339(), id],
        )
        .map_err(sql("moving an act"))?;
        let entry = append_in(&tx, &self.log, Some(run), event)?;
        tx.commit().map_err(sql("committing an act's move"))?;
        self.publish_head(&entry);
        Ok(true)
    }

    /// Every act: (act, state, content), oldest first.
    #[allow(clippy::type_complexity)]
    pub fn acts(
        &self,
        id: Option<&str>,
    ) -> Result<Vec<(serde_json::Value, serde_json::Value, Option<Vec<u8>>)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT act, state, content FROM acts WHERE ?1 IS NULL OR id = ?1 ORDER BY created_at, id",
            )
            .map_err(sql("reading the act queue"))?;
        let rows = stmt
            .query_map(params![id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<Vec<u8>>>(2)?,
                ))
            })
            .map_err(sql("reading the act queue"))?;
        let mut out = Vec::new();
        for row in rows {
            let (act, state, content) = row.map_err(sql("reading the act queue"))?;
            let parse = |t: &str| {
                serde_json::from_str(t).map_err(|e| StoreError::BadEntry {
                    seq: 0,
                    message: format!("act row: {e}"),
                })
            };
            out.push((parse(&act)?, parse(&state)?, content));
        }
        Ok(out)
    }

    /// One page of the acts whose state is one of `states`, oldest first,
    /// and how many there are in all: (act, state, content) as [`Self::acts`].
    #[allow(clippy::type_complexity)]
    pub fn acts_in_states(
        &self,
        states: &[&str],
        offset: u64,
        limit: u64,
    ) -> Result<
        (
            Vec<(serde_json::Value, serde_json::Value, Option<Vec<u8>>)>,
            u64,
        ),
        StoreError,
    > {
        let wanted = serde_json::to_string(states).unwrap_or_else(|_| "[]".into());
        let total: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM acts WHERE json_extract(state, '$.state') IN (SELECT value FROM json_each(?1))",
                params![wanted],
                |r| r.get(0),
            )
            .map_err(sql("counting the act queue"))?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT act, state, content FROM acts WHERE json_extract(state, '$.state') IN (SELECT value FROM json_each(?1)) ORDER BY created_at, id LIMIT ?2 OFFSET ?3",
            )
            .map_err(sql("reading the act queue"))?;
        let rows = stmt
            .query_map(params![wanted, limit as i64, offset as i64], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<Vec<u8>>>(2)?,
                ))
            })
            .map_err(sql("reading the act queue"))?;
        let mut out = Vec::new();
        for row in rows {
            let (act, state, content) = row.map_err(sql("reading the act queue"))?;
            let parse = |t: &str| {
                serde_json::from_str(t).map_err(|e| StoreError::BadEntry {
                    seq: 0,
                    message: format!("act row: {e}"),
                })
            };
            out.push((parse(&act)?, parse(&state)?, content));
        }
        Ok((out, total as u64))
    }

    // ----- dashboard accounts and sessions -----

    /// Adds an account or replaces its role and password hash.
    pub fn put_user(&self, name: &str, role: &str, phc: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO users(name, role, phc, created_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(name) DO UPDATE SET role = excluded.role, phc = excluded.phc",
                params![name, role, phc, now_rfc3339()],
            )
            .map_err(sql("writing an account"))?;
        // A changed password or role ends the account's sessions.
        self.conn
            .execute("DELETE FROM sessions WHERE user = ?1", params![name])
            .map_err(sql("ending an account's sessions"))?;
        Ok(())
    }

    /// (name, role, PHC hash, created) of one account.
    pub fn user(&self, name: &str) -> Result<Option<(String, String, String, String)>, StoreError> {
        self.conn
            .query_row(
                "SELECT name, role, phc, created_at FROM users WHERE name = ?1",
                params![name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(sql("reading an account"))
    }

    /// (name, role, created) of every account, by name.
    pub fn users(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, role, created_at FROM users ORDER BY name")
            .map_err(sql("reading the accounts"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(sql("reading the accounts"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(sql("reading the accounts"))
    }

    /// Removes an account and ends its sessions; false when there was none.
    pub fn remove_user(&self, name: &str) -> Result<bool, StoreError> {
        self.conn
            .execute("DELETE FROM sessions WHERE user = ?1", params![name])
            .map_err(sql("ending an account's sessions"))?;
        let n = self
            .conn
            .execute("DELETE FROM users WHERE name = ?1", params![name])
            .map_err(sql("removing an account"))?;
        Ok(n > 0)
    }

    /// Stores a session by the digest of its id (the id itself is never stored).
    pub fn put_session(
        &self,
        id_sha256: &str,
        user: &str,
        csrf: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM sessions WHERE expires_at <= ?1", params![now])
            .map_err(sql("ending expired sessions"))?;
        self.conn
            .execute(
                "INSERT INTO sessions(id_sha256, user, csrf, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id_sha256, user, csrf, now, expires_at],
            )
            .map_err(sql("writing a session"))?;
        Ok(())
    }

    /// (user, role, csrf token, expires) of a live session, its account still present.
    pub fn session(
        &self,
        id_sha256: &str,
        now: i64,
    ) -> Result<Option<(String, String, String, i64)>, StoreError> {
        self.conn
            .query_row(
                "SELECT s.user, u.role, s.csrf, s.expires_at FROM sessions s JOIN users u ON u.name = s.user
                 WHERE s.id_sha256 = ?1 AND s.expires_at > ?2",
                params![id_sha256, now],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(sql("reading a session"))
    }

    pub fn delete_session(&self, id_sha256: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "DELETE FROM sessions WHERE id_sha256 = ?1",
                params![id_sha256],
            )
            .map_err(sql("ending a session"))?;
        Ok(())
    }

    /// A run's acts, queued or (in a dry run) recorded.
    pub fn count_acts(&self, run: &str) -> Result<u64, StoreError> {
        count_acts_of_run(&self.conn, run)
    }

    /// Acts (queued or, in a dry run, recorded) created at or after `since`
    /// (RFC 3339), of every run, or only of the runs of repository `repo`
    /// (a run's `repo` as recorded).
    pub fn count_acts_since(&self, since: &str, repo: Option<&str>) -> Result<u64, StoreError> {
        count_acts_since_in(&self.conn, since, repo)
    }

    // ----- dry runs and autonomy scopes -----

    /// Records a dry run's act with its audit entry, in one transaction.
    pub fn put_dry_act(
        &mut self,
        id: &str,
        run: &str,
        record: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the dry-run acts"))?;
        tx.execute(
            "INSERT INTO dry_acts(id, run, created_at, record) VALUES (?1, ?2, ?3, ?4)",
            params![id, run, now_rfc3339(), record.to_string()],
        )
        .map_err(sql("recording a dry-run act"))?;
        let entry = append_in(&tx, &self.log, Some(run), event)?;
        tx.commit().map_err(sql("committing a dry-run act"))?;
        self.publish_head(&entry);
        Ok(entry)
    }

    /// The dry-run acts of one run or of all, oldest first.
    pub fn dry_acts(&self, run: Option<&str>) -> Result<Vec<serde_json::Value>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT record FROM dry_acts WHERE ?1 IS NULL OR run = ?1 ORDER BY created_at, id",
            )
            .map_err(sql("reading the dry-run acts"))?;
        let rows = stmt
            .query_map(params![run], |r| r.get::<_, String>(0))
            .map_err(sql("reading the dry-run acts"))?;
        let mut out = Vec::new();
        for row in rows {
            let text = row.map_err(sql("reading the dry-run acts"))?;
            out.push(
                serde_json::from_str(&text).map_err(|e| StoreError::BadEntry {
                    seq: 0,
                    message: format!("dry-run act: {e}"),
                })?,
            );
        }
        Ok(out)
    }

    /// The label the door recorded for each queued act (`act id -> label`).
    pub fn act_labels(&self) -> Result<std::collections::HashMap<String, String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT json_extract(body, '$.act'), json_extract(body, '$.label') FROM audit \
                 WHERE kind = 'door_request' AND json_extract(body, '$.act') IS NOT NULL",
            )
            .map_err(sql("reading the acts' labels"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, Option<String>>(1)?,
                ))
            })
            .map_err(sql("reading the acts' labels"))?;
        let mut out = std::collections::HashMap::new();
        for row in rows {
            if let (Some(act), Some(label)) = row.map_err(sql("reading the acts' labels"))? {
                out.insert(act, label);
            }
        }
        Ok(out)
    }

    /// Keeps a proposal as it was shown, so that `scopes diff` and `scopes
    /// adopt` act on exactly that (the id is a digest of its changes).
    pub fn put_scope_proposal(
        &self,
        id: &str,
        proposal: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO scope_proposals(id, created_at, proposal) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET proposal = excluded.proposal",
                params![id, now_rfc3339(), proposal.to_string()],
            )
            .map_err(sql("keeping a scope proposal"))?;
        Ok(())
    }

    pub fn scope_proposal(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let text: Option<String> = self
            .conn
            .query_row(
                "SELECT proposal FROM scope_proposals WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("reading a scope proposal"))?;
        text.map(|t| {
            serde_json::from_str(&t).map_err(|e| StoreError::BadEntry {
                seq: 0,
                message: format!("scope proposal {id}: {e}"),
            })
        })
        .transpose()
    }

    /// Records the owner's refusal of a proposal with its audit entry.
    pub fn refuse_scope(&mut self, id: &str, why: &str, event: &Event) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the scope refusals"))?;
        tx.execute(
            "INSERT INTO scope_refusals(id, at, why) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET why = excluded.why",
            params![id, now_rfc3339(), why],
        )
        .map_err(sql("recording a scope refusal"))?;
        let entry = append_in(&tx, &self.log, None, event)?;
        tx.commit().map_err(sql("committing a scope refusal"))?;
        self.publish_head(&entry);
        Ok(())
    }

    pub fn refused_scopes(&self) -> Result<std::collections::BTreeSet<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id FROM scope_refusals")
            .map_err(sql("reading the scope refusals"))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(sql("reading the scope refusals"))?;
        let mut out = std::collections::BTreeSet::new();
        for row in rows {
            out.insert(row.map_err(sql("reading the scope refusals"))?);
        }
        Ok(out)
    }

    // ----- audit -----

    /// Appends one audit entry (the only write path for audit entries) and,
    /// when `checkpoint` is set, records a checkpoint of it afterwards.
    pub fn append(
        &mut self,
        run: Option<&str>,
        event: &Event,
        checkpoint: bool,
    ) -> Result<Entry, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the audit log"))?;
        let entry = append_in(&tx, &self.log, run, event)?;
        tx.commit().map_err(sql("committing an audit entry"))?;
        self.publish_head(&entry);
        if checkpoint {
            self.write_checkpoint(&orchestrator_audit::checkpoint(&entry))?;
        }
        Ok(entry)
    }

    /// Appends a policy row and its audit entry in one transaction: neither
    /// exists without the other.
    pub fn append_policy_row(
        &mut self,
        row: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the policy rows"))?;
        tx.execute(
            "INSERT INTO policy_rows(at, row) VALUES (?1, ?2)",
            params![now_rfc3339(), row.to_string()],
        )
        .map_err(sql("appending a policy row"))?;
        let entry = append_in(&tx, &self.log, None, event)?;
        tx.commit().map_err(sql("committing a policy row"))?;
        self.publish_head(&entry);
        self.write_checkpoint(&orchestrator_audit::checkpoint(&entry))?;
        Ok(entry)
    }

    /// The policy rows declared at run time, in the order they were written.
    pub fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT seq, row FROM policy_rows ORDER BY seq")
            .map_err(sql("reading the policy rows"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .map_err(sql("reading the policy rows"))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, text) = row.map_err(sql("reading the policy rows"))?;
            out.push(
                serde_json::from_str(&text).map_err(|e| StoreError::BadEntry {
                    seq,
                    message: format!("policy row {seq} is not JSON: {e}"),
                })?,
            );
        }
        Ok(out)
    }

    /// Replaces the head with `entry` unless it already names a later one.
    /// Called after the entry's transaction committed; a failure is logged
    /// and leaves the head behind, never ahead.
    fn publish_head(&self, entry: &Entry) {
        if let Err(e) = self.try_publish_head(entry) {
            tracing::warn!(error = %e, seq = entry.seq, "the audit head was not updated");
        }
    }

    fn try_publish_head(&self, entry: &Entry) -> Result<(), StoreError> {
        let path = self.paths.audit_head();
        let lock_path = self.paths.audit_head_lock();
        let io = |doing: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| StoreError::Io {
                doing,
                path,
                source,
            }
        };
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io("opening", &lock_path))?;
        lock.lock().map_err(io("locking", &lock_path))?;
        // An unreadable head is replaced: what it said is lost either way,
        // and `verify` reports it until then.
        let current = self.read_head().ok().flatten().map_or(0, |h| h.seq);
        if entry.seq > current {
            let tmp = self.paths.root.join("audit.head.tmp");
            let mut text =
                serde_json::to_vec(&orchestrator_audit::checkpoint(entry)).unwrap_or_default();
            text.push(b'\n');
            let mut f = fs::File::create(&tmp).map_err(io("writing", &tmp))?;
            f.write_all(&text).map_err(io("writing", &tmp))?;
            // No fsync: the entry is already durable, so a head lost to a
            // power cut lags (or is left empty, read as absent); it cannot
            // be ahead. An fsync here would double the append's cost.
            fs::rename(&tmp, &path).map_err(io("replacing", &path))?;
        }
        // The lock is released when `lock` is dropped.
        Ok(())
    }

    /// The chain's head, when one was written.
    pub fn read_head(&self) -> Result<Option<Checkpoint>, StoreError> {
        let path = self.paths.audit_head();
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StoreError::Io {
                    doing: "reading",
                    path,
                    source,
                })
            }
        };
        if text.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(text.trim())
            .map(Some)
            .map_err(|e| StoreError::BadCheckpoint {
                path,
                line: 1,
                message: e.to_string(),
            })
    }

    /// The head, the checkpoints and the entries, read in that order: the
    /// files name only committed entries, and the entries are read after
    /// them in one statement (one read snapshot), so they hold all of those.
    pub fn audit_snapshot(&self) -> Result<AuditSnapshot, StoreError> {
        let head = self.read_head()?;
        let checkpoints = self.checkpoints()?;
        let entries = self.entries()?;
        Ok(AuditSnapshot {
            head,
            checkpoints,
            entries,
        })
    }

    /// As [`Store::audit_snapshot`], with only the entries from `seq` on:
    /// what a check of the chain's new entries reads.
    pub fn audit_snapshot_from(&self, seq: u64) -> Result<AuditSnapshot, StoreError> {
        let head = self.read_head()?;
        let checkpoints = self.checkpoints()?;
        let entries = self.entries_from(seq)?;
        Ok(AuditSnapshot {
            head,
            checkpoints,
            entries,
        })
    }

    fn write_checkpoint(&self, cp: &Checkpoint) -> Result<(), StoreError> {
        let path = self.paths.checkpoints();
        let io = |source| StoreError::Io {
            doing: "appending a checkpoint to",
            path: path.clone(),
            source,
        };
        let mut line = serde_json::to_vec(cp).unwrap_or_default();
        line.push(b'\n');
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io)?;
        // One write of a short line with O_APPEND: concurrent writers never interleave.
        f.write_all(&line).map_err(io)?;
        f.sync_data().map_err(io)?;
        Ok(())
    }

    /// The head and checkpoints (read first, as [`Store::audit_snapshot`]
    /// reads them), then the entries from `from` on, one row at a time
    /// from one statement (one read snapshot of the database).
    pub fn visit_audit(
        &self,
        from: u64,
        visitor: &mut dyn nightshift_core::state_store::AuditVisitor,
    ) -> Result<(), StoreError> {
        let head = self.read_head()?;
        let checkpoints = self.checkpoints()?;
        if !visitor.begin(head, checkpoints) {
            return Ok(());
        }
        let mut stmt = self
            .conn
            .prepare(
                "SELECT seq, time, kind, run, body, prev, hash FROM audit WHERE seq >= ?1 ORDER BY seq",
            )
            .map_err(sql("reading the audit log"))?;
        let mut rows = stmt
            .query(params![i64::try_from(from).unwrap_or(i64::MAX)])
            .map_err(sql("reading the audit log"))?;
        while let Some(row) = rows.next().map_err(sql("reading the audit log"))? {
            // Borrowed from the row as it is stored, for a visitor that
            // can take it so; anything not plainly text goes the parsed way.
            if let Some(raw) = row_as_raw_entry(row) {
                match visitor.raw_entry(&raw) {
                    Some(true) => continue,
                    Some(false) => break,
                    None => {}
                }
            }
            let entry = raw_to_entry(row_to_raw(row).map_err(sql("reading the audit log"))?)?;
            if !visitor.entry(entry) {
                break;
            }
        }
        Ok(())
    }

    pub fn entries(&self) -> Result<Vec<Entry>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT seq, time, kind, run, body, prev, hash FROM audit ORDER BY seq")
            .map_err(sql("reading the audit log"))?;
        let rows = stmt
            .query_map([], row_to_raw)
            .map_err(sql("reading the audit log"))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(raw_to_entry(row.map_err(sql("reading the audit log"))?)?);
        }
        Ok(out)
    }

    /// The entries from `seq` on, in order.
    pub fn entries_from(&self, seq: u64) -> Result<Vec<Entry>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT seq, time, kind, run, body, prev, hash FROM audit WHERE seq >= ?1 ORDER BY seq",
            )
            .map_err(sql("reading the audit log"))?;
        let rows = stmt
            .query_map(params![i64::try_from(seq).unwrap_or(i64::MAX)], row_to_raw)
            .map_err(sql("reading the audit log"))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(raw_to_entry(row.map_err(sql("reading the audit log"))?)?);
        }
        Ok(out)
    }

    /// The audit's refused (or undecided) door requests, of one run or of
    /// all, oldest first.
    pub fn door_refusals(&self, run: Option<&str>) -> Result<Vec<Entry>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT seq, time, kind, run, body, prev, hash FROM audit \
                 WHERE kind = 'door_request' AND (?1 IS NULL OR run = ?1) \
                 AND json_extract(body, '$.verdict') IN ('refused', 'error') ORDER BY seq",
            )
            .map_err(sql("reading refused door requests"))?;
        let rows = stmt
            .query_map(params![run], row_to_raw)
            .map_err(sql("reading refused door requests"))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(raw_to_entry(
                row.map_err(sql("reading refused door requests"))?,
            )?);
        }
        Ok(out)
    }

    pub fn entries_for_run(&self, run: &str) -> Result<Vec<Entry>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT seq, time, kind, run, body, prev, hash FROM audit WHERE run = ?1 ORDER BY seq",
            )
            .map_err(sql("reading the audit log"))?;
        let rows = stmt
            .query_map(params![run], row_to_raw)
            .map_err(sql("reading the audit log"))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(raw_to_entry(row.map_err(sql("reading the audit log"))?)?);
        }
        Ok(out)
    }

    /// The run and body of every entry of `kind` written at or after
    /// `since` (RFC 3339, as entries are timed), oldest first.
    pub fn bodies_of_kind_since(
        &self,
        kind: &str,
        since: &str,
    ) -> Result<Vec<(Option<String>, serde_json::Value)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT run, body FROM audit WHERE kind = ?1 AND time >= ?2 ORDER BY seq")
            .map_err(sql("reading the audit log"))?;
        let rows = stmt
            .query_map(params![kind, since], |r| {
                Ok((r.get::<_, Option<String>>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(sql("reading the audit log"))?;
        let mut out = Vec::new();
        for row in rows {
            let (run, body) = row.map_err(sql("reading the audit log"))?;
            out.push((run, serde_json::from_str(&body).unwrap_or_default()));
        }
        Ok(out)
    }

    /// The checkpoints, sorted by entry (concurrent writers may append them
    /// slightly out of order).
    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError> {
        let path = self.paths.checkpoints();
        let file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(StoreError::Io {
                    doing: "reading",
                    path,
                    source,
                })
            }
        };
        let mut out = Vec::new();
        for (i, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|source| StoreError::Io {
                doing: "reading",
                path: path.clone(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let cp: Checkpoint =
                serde_json::from_str(&line).map_err(|e| StoreError::BadCheckpoint {
                    path: path.clone(),
                    line: i + 1,
                    message: e.to_string(),
                })?;
            out.push(cp);
        }
        out.sort_by_key(|c| c.seq);
        Ok(out)
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// A run's acts, queued or (in a dry run) recorded.
/// Whether act `id` is in state `from`, compared as JSON values, not text:
/// two builds may order keys differently.
fn act_in_state(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    from: &serde_json::Value,
) -> Result<bool, StoreError> {
    let current: Option<String> = tx
        .query_row("SELECT state FROM acts WHERE id = ?1", params![id], |r| {
            r.get(0)
        })
        .optional()
        .map_err(sql("reading an act's state"))?;
    Ok(current
        .as_deref()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .is_some_and(|v| &v == from))
}

fn count_acts_of_run(conn: &rusqlite::Connection, run: &str) -> Result<u64, StoreError> {
    conn.query_row(
        "SELECT (SELECT count(*) FROM acts WHERE run = ?1) + (SELECT count(*) FROM dry_acts WHERE run = ?1)",
        params![run],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as u64)
    .map_err(sql("counting a run's acts"))
}

/// Acts (queued or recorded) created at or after `since`, of every run or
/// of the runs of repository `repo`.
fn count_acts_since_in(
    conn: &rusqlite::Connection,
    since: &str,
    repo: Option<&str>,
) -> Result<u64, StoreError> {
    conn.query_row(
        "SELECT (SELECT count(*) FROM acts WHERE created_at >= ?1 AND (?2 IS NULL OR run IN
             (SELECT id FROM runs WHERE json_extract(record, '$.repo') = ?2)))
          + (SELECT count(*) FROM dry_acts WHERE created_at >= ?1 AND (?2 IS NULL OR run IN
             (SELECT id FROM runs WHERE json_extract(record, '$.repo') = ?2)))",
        params![since, repo],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as u64)
    .map_err(sql("counting the night's acts"))
}

/// The one write path of audit entries, inside a caller's transaction.
fn append_in(
    tx: &rusqlite::Transaction<'_>,
    log: &LogId,
    run: Option<&str>,
    event: &Event,
) -> Result<Entry, StoreError> {
    let (kind, body) = event.kind_and_body();
    let last = tx
        .query_row(
            "SELECT seq, time, kind, run, body, prev, hash FROM audit ORDER BY seq DESC LIMIT 1",
            [],
            row_to_raw,
        )
        .optional()
        .map_err(sql("reading the audit head"))?;
    let last = last.map(raw_to_entry).transpose()?;
    let body = match body {
        serde_json::Value::Object(map) => map,
        other => serde_json::Map::from_iter([("value".to_string(), other)]),
    };
    let entry = orchestrator_audit::seal(log, last.as_ref(), &now_rfc3339(), &kind, run, body)
        .map_err(|e| StoreError::BadEntry {
            seq: last.as_ref().map(|l| l.seq as i64 + 1).unwrap_or(1),
            message: e.to_string(),
        })?;
    tx.execute(
        "INSERT INTO audit(seq, time, kind, run, body, prev, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            entry.seq as i64,
            entry.time,
            entry.kind,
            entry.run,
            serde_json::to_string(&entry.body).unwrap_or_default(),
            entry.prev,
            entry.hash
        ],
    )
    .map_err(sql("appending an audit entry"))?;
    Ok(entry)
}

type RawRow = (i64, String, String, Option<String>, String, String, String);

fn row_to_raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
    ))
}

/// An audit row's columns borrowed as they are stored, when each is what
/// [`row_to_raw`] reads (an integer seq at least 0, text, null for no run).
fn row_as_raw_entry<'r>(r: &'r rusqlite::Row<'_>) -> Option<orchestrator_audit::RawEntry<'r>> {
    let text = |i: usize| r.get_ref(i).ok()?.as_str().ok();
    let run = match r.get_ref(3).ok()? {
        rusqlite::types::ValueRef::Null => None,
        v => Some(v.as_str().ok()?),
    };
    Some(orchestrator_audit::RawEntry {
        seq: u64::try_from(r.get_ref(0).ok()?.as_i64().ok()?).ok()?,
        time: text(1)?,
        kind: text(2)?,
        run,
        body: text(4)?,
        prev: text(5)?,
        hash: text(6)?,
    })
}

fn raw_to_entry(raw: RawRow) -> Result<Entry, StoreError> {
    let (seq, time, kind, run, body, prev, hash) = raw;
    let body = serde_json::from_str(&body).map_err(|e| StoreError::BadEntry {
        seq,
        message: format!("body is not JSON: {e}"),
    })?;
    Ok(Entry {
        seq: u64::try_from(seq).map_err(|_| StoreError::BadEntry {
            seq,
            message: "negative sequence number".into(),
        })?,
        time,
        kind,
        run,
        body,
        prev,
        hash,
    })
}

// ----- settling (claims that are taken over, the durable "imported" mark) -----

/// The settle claim's columns added after the first release: the claimer's
/// process identity and the moment the run's work was safe. Added only when
/// missing, so an existing database (or a racing first invocation) is fine.
/// The schema's versions, in order, each bringing a store made at the
/// version before it up to date. Each is idempotent: a store made before
/// versions were recorded (version 0, today's schema or older), or two
/// first opens racing, apply it harmlessly. Recorded in SQLite's
/// `user_version`, in the migration's own transaction.
type Migration = (u32, &'static str, fn(&Connection) -> Result<(), StoreError>);

const MIGRATIONS: &[Migration] = &[
    (
        1,
        "runs, audit, acts, tasks, accounts, sessions, policy rows, dry runs, scope proposals; the settle claims' claimer and import mark",
        |conn| {
            conn.execute_batch(SCHEMA)
                .map_err(sql("creating the schema"))?;
            migrate_settled(conn)
        },
    ),
    (2, "the executors' leases on acts", migrate_act_leases),
    (3, "the dispatchers' leases on tasks", migrate_task_leases),
    (4, "the generation of each task's claim (its fencing token)", migrate_task_generation),
];

/// The schema version this build makes and reads.
pub const SCHEMA_VERSION: u32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

fn schema_version(conn: &Connection) -> Result<u32, StoreError> {
    conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))
        .map_err(sql("reading the schema version"))
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
}

/// Brings the store to [`SCHEMA_VERSION`]: the versions it went through
/// (`from`, `to`). A store made by a newer nightshift is refused, never
/// written.
fn migrate(conn: &Connection) -> Result<(u32, u32), StoreError> {
    let from = schema_version(conn)?;
    if from > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found: from,
            known: SCHEMA_VERSION,
        });
    }
    for (version, _, apply) in MIGRATIONS.iter().filter(|m| m.0 > from) {
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(sql("locking the store to migrate it"))?;
        let applied = apply(conn).and_then(|()| {
            // Another opener may have migrated it meanwhile: never move back.
            if schema_version(conn)? < *version {
                conn.pragma_update(None, "user_version", i64::from(*version))
                    .map_err(sql("recording the schema version"))?;
            }
            conn.execute_batch("COMMIT")
                .map_err(sql("committing a migration"))
        });
        if let Err(e) = applied {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    Ok((from, schema_version(conn)?))
}

fn migrate_settled(conn: &Connection) -> Result<(), StoreError> {
    let mut have = Vec::new();
    {
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_table_info('settled')")
            .map_err(sql("reading the settle claims' columns"))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(sql("reading the settle claims' columns"))?;
        for row in rows {
            have.push(row.map_err(sql("reading the settle claims' columns"))?);
        }
    }
    for column in ["claimer", "imported_at"] {
        if have.iter().any(|h| h == column) {
            continue;
        }
        match conn.execute_batch(&format!("ALTER TABLE settled ADD COLUMN {column} TEXT")) {
            Err(e) if e.to_string().contains("duplicate column") => {}
            other => other.map_err(sql("adding a column to the settle claims"))?,
        }
    }
    Ok(())
}

/// The executors' lease columns of the act queue, added after the first
/// release (`lease_holder`, `lease_until` in unix seconds): added only when
/// missing, as [`migrate_settled`] does, so an existing database (or a
/// racing first invocation) is fine. An act with no lease is claimable.
fn migrate_act_leases(conn: &Connection) -> Result<(), StoreError> {
    add_lease_columns(
        conn,
        "acts",
        (
            "reading the act queue's columns",
            "adding a lease column to the act queue",
        ),
    )
}

/// The dispatchers' lease columns of the run queue, added the same way. A
/// `starting` or `running` task with no lease (started before leases) is
/// taken over by the next dispatcher.
fn migrate_task_leases(conn: &Connection) -> Result<(), StoreError> {
    add_lease_columns(
        conn,
        "tasks",
        (
            "reading the run queue's columns",
            "adding a lease column to the run queue",
        ),
    )
}

/// The generation of each task's claim (`lease_gen`, see
/// `TaskQueue::move_task`'s fence), 0 for every task claimed before.
fn migrate_task_generation(conn: &Connection) -> Result<(), StoreError> {
    let have: bool = conn
        .query_row(
            "SELECT count(*) FROM pragma_table_info('tasks') WHERE name = 'lease_gen'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(sql("reading the run queue's columns"))?
        > 0;
    if have {
        return Ok(());
    }
    match conn.execute_batch("ALTER TABLE tasks ADD COLUMN lease_gen INTEGER NOT NULL DEFAULT 0") {
        Err(e) if e.to_string().contains("duplicate column") => Ok(()),
        other => other.map_err(sql("adding the claims' generation to the run queue")),
    }
}

/// Adds `lease_holder TEXT` and `lease_until INTEGER` to `table` where
/// they are missing.
fn add_lease_columns(
    conn: &Connection,
    table: &str,
    (reading, adding): (&'static str, &'static str),
) -> Result<(), StoreError> {
    let mut have = Vec::new();
    {
        let mut stmt = conn
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .map_err(sql(reading))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(sql(reading))?;
        for row in rows {
            have.push(row.map_err(sql(reading))?);
        }
    }
    for (column, kind) in [("lease_holder", "TEXT"), ("lease_until", "INTEGER")] {
        if have.iter().any(|h| h == column) {
            continue;
        }
        match conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind}")) {
            Err(e) if e.to_string().contains("duplicate column") => {}
            other => other.map_err(sql(adding))?,
        }
    }
    Ok(())
}

/// The acts an executor may claim at `?1` (unix seconds), as
/// `ActQueue::claim_act` defines them, with no lease or a lapsed one.
const CLAIMABLE: &str =
    "(json_extract(state, '$.state') IN ('approved', 'executing', 'outcome_unknown')
       OR (json_extract(state, '$.state') = 'awaiting_retry'
           AND json_extract(state, '$.not_before') <= ?1))
     AND (lease_until IS NULL OR lease_until < ?1)";

impl Store {
    /// Claims one executable act for `holder` until `lease_until`, in one
    /// `BEGIN IMMEDIATE` transaction (see `ActQueue::claim_act`).
    pub fn claim_act(
        &mut self,
        holder: &str,
        now: i64,
        lease_until: i64,
        only: Option<&str>,
    ) -> Result<Option<nightshift_core::state_store::StoredAct>, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the act queue to claim an act"))?;
        let found: Option<(String, String, String, Option<Vec<u8>>)> = tx
            .query_row(
                &format!(
                    "SELECT id, act, state, content FROM acts WHERE {CLAIMABLE}
                     AND (?2 IS NULL OR id = ?2) ORDER BY created_at, id LIMIT 1"
                ),
                params![now, only],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(sql("finding an act to claim"))?;
        let Some((id, act, state, content)) = found else {
            return Ok(None);
        };
        tx.execute(
            "UPDATE acts SET lease_holder = ?1, lease_until = ?2 WHERE id = ?3",
            params![holder, lease_until, id],
        )
        .map_err(sql("claiming an act"))?;
        tx.commit().map_err(sql("committing an act's claim"))?;
        let parse = |t: &str| {
            serde_json::from_str(t).map_err(|e| StoreError::BadEntry {
                seq: 0,
                message: format!("act row: {e}"),
            })
        };
        Ok(Some((parse(&act)?, parse(&state)?, content)))
    }

    /// Extends `holder`'s lease on act `id`; false when it is not held by
    /// `holder` any more.
    pub fn renew_act(
        &mut self,
        id: &str,
        holder: &str,
        _now: i64,
        lease_until: i64,
    ) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                "UPDATE acts SET lease_until = ?1 WHERE id = ?2 AND lease_holder = ?3",
                params![lease_until, id, holder],
            )
            .map_err(sql("renewing an act's lease"))?;
        Ok(n == 1)
    }

    /// Gives `holder`'s lease on act `id` back.
    pub fn release_act(&mut self, id: &str, holder: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE acts SET lease_holder = NULL, lease_until = NULL WHERE id = ?1 AND lease_holder = ?2",
                params![id, holder],
            )
            .map_err(sql("releasing an act's lease"))?;
        Ok(())
    }

    /// The earliest `not_before` of the acts awaiting a retry.
    pub fn next_retry(&self) -> Result<Option<i64>, StoreError> {
        self.conn
            .query_row(
                "SELECT min(json_extract(state, '$.not_before')) FROM acts
                 WHERE json_extract(state, '$.state') = 'awaiting_retry'",
                [],
                |r| r.get(0),
            )
            .map_err(sql("reading the next retry"))
    }

    /// Closes act `id` (from `from` to `to`) and queues `new_id`, with both
    /// audit entries, in one transaction; false (nothing written) when `id`
    /// is no longer in `from`.
    #[allow(clippy::too_many_arguments)]
    pub fn replace_act(
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
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the act queue"))?;
        if !act_in_state(&tx, id, from)? {
            return Ok(false);
        }
        let now = now_rfc3339();
        tx.execute(
            "INSERT INTO acts(id, run, act, state, content, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
            params![new_id, run, new_act.to_string(), new_state.to_string(), content, now],
        )
        .map_err(sql("queueing a re-bound act"))?;
        append_in(&tx, &self.log, Some(run), new_event)?;
        tx.execute(
            "UPDATE acts SET state = ?1, updated_at = ?2 WHERE id = ?3",
            params![to.to_string(), now, id],
        )
        .map_err(sql("closing a re-bound act"))?;
        let entry = append_in(&tx, &self.log, Some(run), event)?;
        tx.commit().map_err(sql("committing a re-bound act"))?;
        self.publish_head(&entry);
        Ok(true)
    }

    /// Claims the settling of a run for `claimer` (a process identity,
    /// `pid:starttime`), naming `by` as the settler. A claim with no claimer,
    /// or whose claimer `gone` says is provably gone, is taken over; a claim
    /// already held by `claimer` is kept. False when a live process holds it.
    /// The claim is not the settling: the caller re-reads the run under it.
    pub fn claim_settle(
        &mut self,
        run: &str,
        by: &str,
        claimer: &str,
        gone: &dyn Fn(&str) -> bool,
    ) -> Result<bool, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the settle claims"))?;
        let held: Option<Option<String>> = tx
            .query_row(
                "SELECT claimer FROM settled WHERE run = ?1",
                params![run],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("reading a settle claim"))?;
        let take = match held {
            None => {
                tx.execute(
                    "INSERT INTO settled(run, by, claimer) VALUES (?1, ?2, ?3)",
                    params![run, by, claimer],
                )
                .map_err(sql("claiming a run to settle"))?;
                true
            }
            Some(Some(c)) if c == claimer => true,
            Some(Some(c)) if !gone(&c) => false,
            Some(_) => {
                tx.execute(
                    "UPDATE settled SET by = ?2, claimer = ?3 WHERE run = ?1",
                    params![run, by, claimer],
                )
                .map_err(sql("taking over a settle claim"))?;
                true
            }
        };
        tx.commit().map_err(sql("committing a settle claim"))?;
        Ok(take)
    }

    /// Gives up `claimer`'s claim on a run (after a failed or needless
    /// settling), so that the next reconciliation takes it at once.
    pub fn release_settle(&self, run: &str, claimer: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE settled SET claimer = NULL WHERE run = ?1 AND claimer = ?2",
                params![run, claimer],
            )
            .map_err(sql("releasing a settle claim"))?;
        Ok(())
    }

    /// Saves a run whose work is safe (imported, or nothing to import) and
    /// marks it so, in one transaction, before its worktree is touched: a
    /// worktree of a marked run is only ever removed, never imported again.
    pub fn record_imported(&mut self, run: &RunRecord) -> Result<(), StoreError> {
        let record = serde_json::to_string(run).map_err(|e| StoreError::BadEntry {
            seq: 0,
            message: e.to_string(),
        })?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking a run's import mark"))?;
        tx.execute(
            "INSERT INTO runs(id, created_at, record) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET record = excluded.record",
            params![run.id, run.created_at, record],
        )
        .map_err(sql("saving an imported run"))?;
        tx.execute(
            "INSERT INTO settled(run, by, imported_at) VALUES (?1, 'import', ?2)
             ON CONFLICT(run) DO UPDATE SET imported_at = excluded.imported_at",
            params![run.id, now_rfc3339()],
        )
        .map_err(sql("marking a run imported"))?;
        tx.commit().map_err(sql("committing a run's import mark"))?;
        Ok(())
    }

    /// Whether the run's work was marked safe ([`Store::record_imported`]).
    pub fn imported(&self, run: &str) -> Result<bool, StoreError> {
        let at: Option<Option<String>> = self
            .conn
            .query_row(
                "SELECT imported_at FROM settled WHERE run = ?1",
                params![run],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("reading a run's import mark"))?;
        Ok(matches!(at, Some(Some(_))))
    }

    /// Saves a run's final record and appends its ending (checkpointed) in
    /// one transaction: a run is never final without its `run_ended` entry,
    /// and never ended twice: `None` (nothing written) when the stored
    /// record is already final.
    pub fn end_run(&mut self, run: &RunRecord, event: &Event) -> Result<Option<Entry>, StoreError> {
        let record = serde_json::to_string(run).map_err(|e| StoreError::BadEntry {
            seq: 0,
            message: e.to_string(),
        })?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking a run's ending"))?;
        let stored: Option<String> = tx
            .query_row(
                "SELECT record FROM runs WHERE id = ?1",
                params![run.id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("reading a run"))?;
        let already = stored
            .and_then(|t| serde_json::from_str::<RunRecord>(&t).ok())
            .is_some_and(|r| is_final(&r.status));
        if already {
            return Ok(None);
        }
        tx.execute(
            "INSERT INTO runs(id, created_at, record) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET record = excluded.record",
            params![run.id, run.created_at, record],
        )
        .map_err(sql("saving an ended run"))?;
        let entry = append_in(&tx, &self.log, Some(&run.id), event)?;
        tx.commit().map_err(sql("committing a run's ending"))?;
        self.write_checkpoint(&orchestrator_audit::checkpoint(&entry))?;
        Ok(Some(entry))
    }
}

impl Store {
    // ----- the run queue -----

    /// Adds tasks `(id, spec)` in the given order, all or none, as `state`.
    pub fn insert_tasks(
        &mut self,
        tasks: &[(String, String)],
        state: &str,
    ) -> Result<(), StoreError> {
        let now = now_rfc3339();
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql("enqueueing tasks"))?;
        for (id, spec) in tasks {
            tx.execute(
                "INSERT INTO tasks(id, state, spec, progress, created_at, updated_at)
                 VALUES (?1, ?2, ?3, '{}', ?4, ?4)",
                params![id, state, spec, now],
            )
            .map_err(sql("enqueueing a task"))?;
        }
        tx.commit().map_err(sql("enqueueing tasks"))
    }

    /// Every task, in the queue's order.
    pub fn tasks(&self) -> Result<Vec<StoredTask>, StoreError> {
        tasks_of(&self.conn)
    }

    /// Starts the tasks `decide` chooses, in one `BEGIN IMMEDIATE`
    /// transaction (see `TaskQueue::start_tasks`).
    pub fn start_tasks(
        &mut self,
        holder: &str,
        until: i64,
        decide: nightshift_core::state_store::TaskDecision<'_>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the run queue to start tasks"))?;
        let all = tasks_of(&tx)?;
        let mut started = Vec::new();
        for (id, progress) in decide(&all) {
            let generation: Option<i64> = tx
                .query_row(
                    "UPDATE tasks SET state = 'starting', progress = ?1, updated_at = ?2,
                            lease_holder = ?3, lease_until = ?4, lease_gen = lease_gen + 1
                     WHERE id = ?5 AND state = 'queued' RETURNING lease_gen",
                    params![progress, now_rfc3339(), holder, until, id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql("starting a task"))?;
            if let Some(g) = generation {
                started.push((id, g));
            }
        }
        tx.commit().map_err(sql("committing the tasks' start"))?;
        Ok(started)
    }

    /// Adds a task already `starting` under `holder`'s lease if `admit`
    /// allows, in one `BEGIN IMMEDIATE` transaction.
    #[allow(clippy::too_many_arguments)]
    pub fn insert_started_task(
        &mut self,
        id: &str,
        spec: &str,
        progress: &str,
        holder: &str,
        until: i64,
        admit: &mut dyn FnMut(&[StoredTask]) -> bool,
    ) -> Result<bool, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the run queue to start a task"))?;
        let all = tasks_of(&tx)?;
        if all.iter().any(|t| t.id == id) {
            return Err(StoreError::Conflict(format!("task {id} exists")));
        }
        if !admit(&all) {
            return Ok(false);
        }
        let now = now_rfc3339();
        tx.execute(
            "INSERT INTO tasks(id, state, spec, progress, created_at, updated_at, lease_holder, lease_until, lease_gen)
             VALUES (?1, 'starting', ?2, ?3, ?4, ?4, ?5, ?6, 1)",
            params![id, spec, progress, now, holder, until],
        )
        .map_err(sql("adding a started task"))?;
        tx.commit().map_err(sql("committing a started task"))?;
        Ok(true)
    }

    /// Extends `holder`'s leases on `ids`: the ids it still holds.
    pub fn renew_tasks(
        &mut self,
        holder: &str,
        ids: &[String],
        until: i64,
    ) -> Result<Vec<String>, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the run queue to renew leases"))?;
        let mut held = Vec::new();
        for id in ids {
            let n = tx
                .execute(
                    "UPDATE tasks SET lease_until = ?1 WHERE id = ?2 AND lease_holder = ?3",
                    params![until, id, holder],
                )
                .map_err(sql("renewing a task's lease"))?;
            if n == 1 {
                held.push(id.clone());
            }
        }
        tx.commit().map_err(sql("committing the leases' renewal"))?;
        Ok(held)
    }

    /// Takes over the `starting` and `running` tasks whose lease lapsed (or
    /// that have none), in one `BEGIN IMMEDIATE` transaction.
    pub fn claim_lapsed_tasks(
        &mut self,
        holder: &str,
        now: i64,
        until: i64,
    ) -> Result<Vec<StoredTask>, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the run queue to take tasks over"))?;
        let lapsed: Vec<StoredTask> = tasks_of(&tx)?
            .into_iter()
            .filter(|t| matches!(t.state.as_str(), "starting" | "running"))
            .filter(|t| t.lease.as_ref().is_none_or(|(_, u)| *u < now))
            .collect();
        let mut taken = Vec::new();
        for mut t in lapsed {
            tx.execute(
                "UPDATE tasks SET lease_holder = ?1, lease_until = ?2, lease_gen = lease_gen + 1
                 WHERE id = ?3",
                params![holder, until, t.id],
            )
            .map_err(sql("taking a task over"))?;
            t.lease = Some((holder.to_string(), until));
            t.generation += 1;
            taken.push(t);
        }
        tx.commit().map_err(sql("committing the tasks' takeover"))?;
        Ok(taken)
    }

    /// Moves task `id` from one of the states `from` to `to` with its new
    /// progress, in one statement: true when it moved, false when the task
    /// was not in any of `from` (another process moved it first) or, with a
    /// `fence`, is no longer held under that claim, so each move happens at
    /// most once and never on a lost claim.
    pub fn move_task(
        &self,
        id: &str,
        from: &[&str],
        to: &str,
        progress: &str,
        fence: Option<&nightshift_core::state_store::TaskFence>,
    ) -> Result<bool, StoreError> {
        let from = serde_json::to_string(from).map_err(|e| StoreError::BadEntry {
            seq: 0,
            message: e.to_string(),
        })?;
        let n = self
            .conn
            .execute(
                "UPDATE tasks SET state = ?1, progress = ?2, updated_at = ?3
                 WHERE id = ?4 AND state IN (SELECT value FROM json_each(?5))
                   AND (?6 IS NULL OR (lease_holder = ?6 AND lease_gen = ?7))",
                params![
                    to,
                    progress,
                    now_rfc3339(),
                    id,
                    from,
                    fence.map(|f| f.holder.as_str()),
                    fence.map(|f| f.generation)
                ],
            )
            .map_err(sql("moving a task"))?;
        Ok(n == 1)
    }
}

/// Every task, in the queue's order.
fn tasks_of(conn: &Connection) -> Result<Vec<StoredTask>, StoreError> {
    let mut stmt = conn
        .prepare(
            "SELECT seq, id, state, spec, progress, created_at, updated_at,
                    lease_holder, lease_until, lease_gen
             FROM tasks ORDER BY seq",
        )
        .map_err(sql("listing tasks"))?;
    let rows = stmt
        .query_map([], |r| {
            let holder: Option<String> = r.get(7)?;
            let until: Option<i64> = r.get(8)?;
            Ok(StoredTask {
                seq: r.get(0)?,
                id: r.get(1)?,
                state: r.get(2)?,
                spec: r.get(3)?,
                progress: r.get(4)?,
                created_at: r.get(5)?,
                updated_at: r.get(6)?,
                lease: holder.zip(until),
                generation: r.get(9)?,
            })
        })
        .map_err(sql("listing tasks"))?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(sql("listing tasks"))
}

// ----- the core's ports, carried out by this store -----

use nightshift_core::state_store::{
    Accounts, ActBounds, ActQueue, AuditLog, PolicyStore, RunStore, StateStore, StoredAct,
    StoredSession, StoredUser, TaskQueue,
};

impl AuditLog for Store {
    fn log_id(&self) -> &LogId {
        &self.log
    }
    fn fingerprint(&self) -> Option<nightshift_core::state_store::StoreFingerprint> {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(self.paths.db())
            .ok()
            .map(|m| nightshift_core::state_store::StoreFingerprint {
                dev: m.dev(),
                ino: m.ino(),
                len: m.len(),
            })
    }
    fn append(
        &mut self,
        run: Option<&str>,
        event: &Event,
        checkpoint: bool,
    ) -> Result<Entry, StoreError> {
        Store::append(self, run, event, checkpoint)
    }
    fn read_head(&self) -> Result<Option<Checkpoint>, StoreError> {
        Store::read_head(self)
    }
    fn audit_snapshot(&self) -> Result<AuditSnapshot, StoreError> {
        Store::audit_snapshot(self)
    }
    fn audit_snapshot_from(&self, seq: u64) -> Result<AuditSnapshot, StoreError> {
        Store::audit_snapshot_from(self, seq)
    }
    fn entries(&self) -> Result<Vec<Entry>, StoreError> {
        Store::entries(self)
    }
    fn entries_from(&self, seq: u64) -> Result<Vec<Entry>, StoreError> {
        Store::entries_from(self, seq)
    }
    fn door_refusals(&self, run: Option<&str>) -> Result<Vec<Entry>, StoreError> {
        Store::door_refusals(self, run)
    }
    fn entries_for_run(&self, run: &str) -> Result<Vec<Entry>, StoreError> {
        Store::entries_for_run(self, run)
    }
    fn bodies_of_kind_since(
        &self,
        kind: &str,
        since: &str,
    ) -> Result<Vec<(Option<String>, serde_json::Value)>, StoreError> {
        Store::bodies_of_kind_since(self, kind, since)
    }
    fn checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError> {
        Store::checkpoints(self)
    }
    fn visit_audit(
        &self,
        from: u64,
        visitor: &mut dyn nightshift_core::state_store::AuditVisitor,
    ) -> Result<(), StoreError> {
        Store::visit_audit(self, from, visitor)
    }
}

impl ActQueue for Store {
    fn count_acts(&self, run: &str) -> Result<u64, StoreError> {
        Store::count_acts(self, run)
    }
    fn count_acts_since(&self, since: &str, repo: Option<&str>) -> Result<u64, StoreError> {
        Store::count_acts_since(self, since, repo)
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
        Store::put_act(self, id, run, act, state, content, event)
    }
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
        Store::put_act_within(self, id, run, act, state, content, event, bounds)
    }
    fn acts(&self, id: Option<&str>) -> Result<Vec<StoredAct>, StoreError> {
        Store::acts(self, id)
    }
    fn acts_in_states(
        &self,
        states: &[&str],
        offset: u64,
        limit: u64,
    ) -> Result<(Vec<StoredAct>, u64), StoreError> {
        Store::acts_in_states(self, states, offset, limit)
    }
    fn transition_act(
        &mut self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        event: &Event,
    ) -> Result<bool, StoreError> {
        Store::transition_act(self, id, run, from, to, event)
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
        Store::replace_act(
            self, id, run, from, to, event, new_id, new_act, new_state, content, new_event,
        )
    }
    fn claim_act(
        &mut self,
        holder: &str,
        now: i64,
        lease_until: i64,
        only: Option<&str>,
    ) -> Result<Option<StoredAct>, StoreError> {
        Store::claim_act(self, holder, now, lease_until, only)
    }
    fn renew_act(
        &mut self,
        id: &str,
        holder: &str,
        now: i64,
        lease_until: i64,
    ) -> Result<bool, StoreError> {
        Store::renew_act(self, id, holder, now, lease_until)
    }
    fn release_act(&mut self, id: &str, holder: &str) -> Result<(), StoreError> {
        Store::release_act(self, id, holder)
    }
    fn next_retry(&self) -> Result<Option<i64>, StoreError> {
        Store::next_retry(self)
    }
    fn put_dry_act(
        &mut self,
        id: &str,
        run: &str,
        record: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError> {
        Store::put_dry_act(self, id, run, record, event)
    }
    fn dry_acts(&self, run: Option<&str>) -> Result<Vec<serde_json::Value>, StoreError> {
        Store::dry_acts(self, run)
    }
    fn act_labels(&self) -> Result<std::collections::HashMap<String, String>, StoreError> {
        Store::act_labels(self)
    }
}

impl RunStore for Store {
    fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        Store::runs(self)
    }
    fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
        Store::run(self, id)
    }
    fn put_run(&mut self, record: &RunRecord) -> Result<(), StoreError> {
        Store::put_run(self, record)
    }
    fn request_kill(&mut self, run: &str, by: &str) -> Result<bool, StoreError> {
        Store::request_kill(self, run, by)
    }
    fn kill_request(&self, run: &str) -> Result<Option<String>, StoreError> {
        Store::kill_request(self, run)
    }
    fn claim_settle(
        &mut self,
        run: &str,
        by: &str,
        claimer: &str,
        gone: &dyn Fn(&str) -> bool,
    ) -> Result<bool, StoreError> {
        Store::claim_settle(self, run, by, claimer, gone)
    }
    fn release_settle(&mut self, run: &str, claimer: &str) -> Result<(), StoreError> {
        Store::release_settle(self, run, claimer)
    }
    fn record_imported(&mut self, record: &RunRecord) -> Result<(), StoreError> {
        Store::record_imported(self, record)
    }
    fn imported(&self, run: &str) -> Result<bool, StoreError> {
        Store::imported(self, run)
    }
    fn end_run(&mut self, record: &RunRecord, event: &Event) -> Result<Option<Entry>, StoreError> {
        Store::end_run(self, record, event)
    }
}

impl TaskQueue for Store {
    fn insert_tasks(&mut self, tasks: &[(String, String)], state: &str) -> Result<(), StoreError> {
        Store::insert_tasks(self, tasks, state)
    }
    fn tasks(&self) -> Result<Vec<StoredTask>, StoreError> {
        Store::tasks(self)
    }
    fn move_task(
        &mut self,
        id: &str,
        from: &[&str],
        to: &str,
        progress: &str,
        fence: Option<&nightshift_core::state_store::TaskFence>,
    ) -> Result<bool, StoreError> {
        Store::move_task(self, id, from, to, progress, fence)
    }
    fn start_tasks(
        &mut self,
        holder: &str,
        until: i64,
        decide: nightshift_core::state_store::TaskDecision<'_>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        Store::start_tasks(self, holder, until, decide)
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
        Store::insert_started_task(self, id, spec, progress, holder, until, admit)
    }
    fn renew_tasks(
        &mut self,
        holder: &str,
        ids: &[String],
        until: i64,
    ) -> Result<Vec<String>, StoreError> {
        Store::renew_tasks(self, holder, ids, until)
    }
    fn claim_lapsed_tasks(
        &mut self,
        holder: &str,
        now: i64,
        until: i64,
    ) -> Result<Vec<StoredTask>, StoreError> {
        Store::claim_lapsed_tasks(self, holder, now, until)
    }
}

impl Accounts for Store {
    fn put_user(&mut self, name: &str, role: &str, phc: &str) -> Result<(), StoreError> {
        Store::put_user(self, name, role, phc)
    }
    fn user(&self, name: &str) -> Result<Option<StoredUser>, StoreError> {
        Store::user(self, name)
    }
    fn users(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        Store::users(self)
    }
    fn remove_user(&mut self, name: &str) -> Result<bool, StoreError> {
        Store::remove_user(self, name)
    }
    fn put_session(
        &mut self,
        id_sha256: &str,
        user: &str,
        csrf: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        Store::put_session(self, id_sha256, user, csrf, now, expires_at)
    }
    fn session(&self, id_sha256: &str, now: i64) -> Result<Option<StoredSession>, StoreError> {
        Store::session(self, id_sha256, now)
    }
    fn delete_session(&mut self, id_sha256: &str) -> Result<(), StoreError> {
        Store::delete_session(self, id_sha256)
    }
}

impl PolicyStore for Store {
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Store::get_meta(self, key)
    }
    fn set_meta(&mut self, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        Store::set_meta(self, key, value)
    }
    fn append_policy_row(
        &mut self,
        row: &serde_json::Value,
        event: &Event,
    ) -> Result<Entry, StoreError> {
        Store::append_policy_row(self, row, event)
    }
    fn policy_rows(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        Store::policy_rows(self)
    }
    fn put_scope_proposal(
        &mut self,
        id: &str,
        proposal: &serde_json::Value,
    ) -> Result<(), StoreError> {
        Store::put_scope_proposal(self, id, proposal)
    }
    fn scope_proposal(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        Store::scope_proposal(self, id)
    }
    fn refuse_scope(&mut self, id: &str, why: &str, event: &Event) -> Result<(), StoreError> {
        Store::refuse_scope(self, id, why, event)
    }
    fn refused_scopes(&self) -> Result<std::collections::BTreeSet<String>, StoreError> {
        Store::refused_scopes(self)
    }
}

impl StateStore for Store {
    fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod migration_tests {
    use super::*;
    use nightshift_core::state_store::StoreBackend;

    /// A state as an earlier release made it: no schema version, and the
    /// settle claims without their claimer and import mark.
    fn old_state(dir: &Path) {
        let conn = Connection::open(dir.join("state.db")).unwrap();
        conn.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('log_id', 'old');
             CREATE TABLE runs (id TEXT PRIMARY KEY, created_at TEXT NOT NULL, record TEXT NOT NULL);
             INSERT INTO runs VALUES ('r1', '2026-11-01T00:00:00Z', '{\"id\":\"r1\",\"created_at\":\"2026-11-01T00:00:00Z\",\"repo\":\"/r\",\"base_ref\":\"main\",\"base_commit\":null,\"image\":\"i\",\"command\":[],\"status\":\"exited 0\",\"reason\":null,\"exit_code\":0,\"container_id\":null,\"started_at\":null,\"ended_at\":null,\"duration_ms\":null,\"peak_memory_bytes\":null,\"cpu_ns\":null,\"result_ref\":null,\"result_commit\":null,\"files_changed\":null,\"insertions\":null,\"deletions\":null,\"attestation\":null,\"observed\":null,\"supervisor_pid\":null}');
             CREATE TABLE settled (run TEXT PRIMARY KEY, by TEXT NOT NULL);",
        )
        .unwrap();
    }

    #[test]
    fn a_state_an_earlier_release_made_opens_migrated_and_keeps_its_runs() {
        let dir = tempfile::tempdir().unwrap();
        old_state(dir.path());
        let backend = SqliteBackend::new(dir.path().to_path_buf(), None);
        assert_eq!(backend.migrate().unwrap(), (0, SCHEMA_VERSION));
        assert_eq!(backend.migrate().unwrap(), (SCHEMA_VERSION, SCHEMA_VERSION));
        let mut store = backend.open().unwrap();
        assert_eq!(store.run("r1").unwrap().status, "exited 0");
        // The columns the migration added are there and work.
        assert!(store.claim_settle("r1", "me", "1:1", &|_| true).unwrap());
        store.record_imported(&store.run("r1").unwrap()).unwrap();
        assert!(store.imported("r1").unwrap());
    }

    #[test]
    fn a_store_made_by_a_newer_release_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let backend = SqliteBackend::new(dir.path().to_path_buf(), None);
        backend.migrate().unwrap();
        let conn = Connection::open(dir.path().join("state.db")).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let e = backend.connect().unwrap_err();
        assert!(
            matches!(e, StoreError::NewerSchema { found: 99, .. }),
            "{e}"
        );
        let conn = Connection::open(dir.path().join("state.db")).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 99);
    }
}

#[cfg(test)]
mod settle_tests {
    use super::*;

    fn open(dir: &Path) -> Store {
        Store::open(StatePaths::new(dir.to_path_buf())).unwrap()
    }

    fn run(id: &str, status: &str) -> RunRecord {
        RunRecord {
            id: id.into(),
            created_at: now_rfc3339(),
            status: status.into(),
            ..Default::default()
        }
    }

    fn ended() -> Event {
        Event::RunEnded {
            status: "lost: supervisor vanished".into(),
            reason: None,
        }
    }

    #[test]
    fn a_claim_is_kept_from_the_living_and_taken_from_the_gone() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let alive = |_: &str| false;
        let gone = |_: &str| true;
        assert!(store.claim_settle("r", "a", "1:1", &alive).unwrap());
        assert!(store.claim_settle("r", "a", "1:1", &alive).unwrap());
        assert!(!store.claim_settle("r", "b", "2:2", &alive).unwrap());
        assert!(store.claim_settle("r", "b", "2:2", &gone).unwrap());
        store.release_settle("r", "2:2").unwrap();
        assert!(store.claim_settle("r", "c", "3:3", &alive).unwrap());
    }

    #[test]
    fn an_old_claim_without_a_claimer_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join("state.db")).unwrap();
            conn.execute_batch(
                "CREATE TABLE settled (run TEXT PRIMARY KEY, by TEXT NOT NULL);
                 INSERT INTO settled(run, by) VALUES ('r', 'kill switch');",
            )
            .unwrap();
        }
        let mut store = open(dir.path());
        assert!(store.claim_settle("r", "a", "1:1", &|_| false).unwrap());
        // And a second opening does not add the columns again.
        drop(store);
        let _ = open(dir.path());
    }

    #[test]
    fn a_run_ends_once_and_its_import_mark_stays() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        store.put_run(&run("r", "running")).unwrap();
        assert!(!store.imported("r").unwrap());
        store.record_imported(&run("r", "running")).unwrap();
        assert!(store.imported("r").unwrap());
        assert!(store.claim_settle("r", "a", "1:1", &|_| false).unwrap());
        store.release_settle("r", "1:1").unwrap();
        assert!(store.imported("r").unwrap());
        assert!(store
            .end_run(&run("r", "exited 0"), &ended())
            .unwrap()
            .is_some());
        assert!(store
            .end_run(&run("r", "lost"), &ended())
            .unwrap()
            .is_none());
        assert_eq!(store.run("r").unwrap().status, "exited 0");
        let ends = store
            .entries_for_run("r")
            .unwrap()
            .iter()
            .filter(|e| e.kind == "run_ended")
            .count();
        assert_eq!(ends, 1);
    }
}

#[cfg(test)]
mod act_lease_tests {
    use super::*;
    use serde_json::json;

    fn event(act: &str) -> Event {
        Event::Act {
            act: act.into(),
            transition: "queued".into(),
            fields: json!({}),
        }
    }

    fn put(store: &mut Store, id: &str, state: serde_json::Value) {
        store
            .put_act(id, "r", &json!({"id": id}), &state, None, &event(id))
            .unwrap();
    }

    /// `ActQueue::claim_act`'s contract, on SQLite: only executable acts,
    /// one holder at a time until the lease lapses, a retry only when due.
    #[test]
    fn an_act_is_claimed_by_one_holder_until_its_lease_lapses() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(StatePaths::new(dir.path().to_path_buf())).unwrap();
        put(&mut store, "a1", json!({"state": "pending"}));
        put(
            &mut store,
            "a2",
            json!({"state": "done", "outcome": "x", "attempts": 1}),
        );
        put(
            &mut store,
            "a3",
            json!({"state": "awaiting_retry", "not_before": 1_010}),
        );
        assert!(store.claim_act("e1", 1_000, 1_030, None).unwrap().is_none());
        assert_eq!(store.next_retry().unwrap(), Some(1_010));
        let (act, _, _) = store.claim_act("e1", 1_010, 1_040, None).unwrap().unwrap();
        assert_eq!(act["id"], "a3");
        assert!(store.claim_act("e2", 1_020, 1_050, None).unwrap().is_none());
        assert!(store.renew_act("a3", "e1", 1_039, 1_070).unwrap());
        assert!(store.claim_act("e2", 1_060, 1_090, None).unwrap().is_none());
        // Held through its last second.
        assert!(store.claim_act("e2", 1_070, 1_100, None).unwrap().is_none());
        let (act, _, _) = store.claim_act("e2", 1_071, 1_100, None).unwrap().unwrap();
        assert_eq!(act["id"], "a3");
        assert!(!store.renew_act("a3", "e1", 1_071, 1_101).unwrap());
        store.release_act("a3", "e1").unwrap();
        assert!(store
            .claim_act("e3", 1_071, 1_101, Some("a3"))
            .unwrap()
            .is_none());
        store.release_act("a3", "e2").unwrap();
        assert!(store
            .claim_act("e3", 1_071, 1_101, Some("a3"))
            .unwrap()
            .is_some());
        // A claim writes no audit entry.
        assert_eq!(store.entries().unwrap().len(), 3);
    }

    /// Two processes' worth of connections claiming at once never share an
    /// act while its lease holds.
    #[test]
    fn claimers_at_once_never_share_an_act() {
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(dir.path().to_path_buf());
        let mut store = Store::open(paths.clone()).unwrap();
        for i in 0..20 {
            put(
                &mut store,
                &format!("a{i:02}"),
                json!({"state": "approved"}),
            );
        }
        let claimers: Vec<_> = (0..4)
            .map(|k| {
                let paths = paths.clone();
                std::thread::spawn(move || {
                    let mut store = Store::open(paths).unwrap();
                    // Bounded, so that a claim that ignored leases fails
                    // here instead of claiming the same act forever.
                    let mut got = Vec::new();
                    for _ in 0..40 {
                        let claimed = store
                            .claim_act(&format!("e{k}"), 1_000, 2_000, None)
                            .unwrap();
                        let Some((act, _, _)) = claimed else { break };
                        got.push(act["id"].as_str().unwrap().to_string());
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<String> = claimers
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        all.sort();
        let n = all.len();
        all.dedup();
        assert_eq!((n, all.len()), (20, 20), "an act was claimed twice");
    }

    #[test]
    fn an_old_act_queue_gains_its_lease_columns_and_a_rebind_is_one_move() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(dir.path().join("state.db")).unwrap();
            conn.execute_batch(
                "CREATE TABLE acts (id TEXT PRIMARY KEY, run TEXT NOT NULL, act TEXT NOT NULL,
                   state TEXT NOT NULL, content BLOB, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
                 INSERT INTO acts VALUES ('old', 'r', '{\"id\":\"old\"}',
                   '{\"state\":\"stale\",\"why\":\"moved\"}', NULL, '2020', '2020');",
            )
            .unwrap();
        }
        let mut store = Store::open(StatePaths::new(dir.path().to_path_buf())).unwrap();
        let stale = json!({"state": "stale", "why": "moved"});
        let closed = json!({"state": "rejected", "why": "re-bound", "by": "owner"});
        let pending = json!({"state": "pending"});
        let moved = store
            .replace_act(
                "old",
                "r",
                &stale,
                &closed,
                &event("old"),
                "new",
                &json!({"id": "new"}),
                &pending,
                None,
                &event("new"),
            )
            .unwrap();
        assert!(moved);
        // Not from `stale` any more: nothing written, no new act.
        let again = store
            .replace_act(
                "old",
                "r",
                &stale,
                &closed,
                &event("old"),
                "newer",
                &json!({"id": "newer"}),
                &pending,
                None,
                &event("newer"),
            )
            .unwrap();
        assert!(!again);
        let ids: Vec<_> = store
            .acts(None)
            .unwrap()
            .into_iter()
            .map(|a| a.0["id"].clone())
            .collect();
        assert_eq!(ids, [json!("old"), json!("new")]);
        assert_eq!(store.entries().unwrap().len(), 2);
        drop(store);
        let _ = Store::open(StatePaths::new(dir.path().to_path_buf())).unwrap();
    }
}

// ----- model tokens (the gateway's ledgers) -----

/// The model gateway's token ledgers: `STATE/tokens.db`, a database of its
/// own beside `state.db`, so that a call's reservation never waits for
/// another call's audit append (whose commit is synchronous) to reach the
/// disk. Commits here are durable against a crash of a process, not of the
/// machine (WAL, `synchronous = NORMAL`): a power cut can forget the last
/// settlements, never let two processes reserve the same tokens.
///
/// One row per run and night: tokens used (settled) and reserved (calls in
/// flight). Every reservation and settlement is one write transaction
/// (`BEGIN IMMEDIATE`), so concurrent calls in any number of processes are
/// serialised and the decision ([`nightshift_core::tokens::reserve`]) sees
/// both ledgers as they are.
#[derive(Debug)]
pub struct SqliteTokenLedger {
    conn: Connection,
}

const TOKENS_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS model_tokens (
    run TEXT NOT NULL,
    night TEXT NOT NULL,
    used INTEGER NOT NULL DEFAULT 0,
    reserved INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, night)
);
CREATE INDEX IF NOT EXISTS model_tokens_night ON model_tokens(night);
"#;

type Ledgers = (
    nightshift_core::tokens::Ledger,
    nightshift_core::tokens::Ledger,
);

impl SqliteTokenLedger {
    pub fn open(paths: &StatePaths) -> Result<Self, StoreError> {
        create_private_dir(&paths.root)?;
        let db = paths.root.join("tokens.db");
        let mut attempt = 0;
        loop {
            let opened: Result<SqliteTokenLedger, StoreError> = (|| {
                let conn = Connection::open(&db).map_err(open_error(&db))?;
                conn.busy_timeout(Duration::from_secs(30))
                    .map_err(sql("setting the busy timeout"))?;
                conn.pragma_update(None, "mmap_size", 0)
                    .map_err(sql("turning off memory-mapped I/O"))?;
                conn.pragma_update(None, "journal_mode", "WAL")
                    .map_err(sql("enabling write-ahead logging"))?;
                conn.pragma_update(None, "synchronous", "NORMAL")
                    .map_err(sql("setting normal synchronous writes"))?;
                conn.execute_batch(TOKENS_SCHEMA)
                    .map_err(sql("creating the token ledger"))?;
                Ok(SqliteTokenLedger { conn })
            })();
            match opened {
                Err(e) if e.is_busy() && attempt < 50 => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20 * attempt));
                }
                other => return other,
            }
        }
    }

    /// The run's ledger (all nights) and the fleet's for `night`.
    fn ledgers(conn: &Connection, run: &str, night: &str) -> Result<Ledgers, StoreError> {
        let read = |q: &str, key: &str| -> Result<nightshift_core::tokens::Ledger, StoreError> {
            conn.query_row(q, params![key], |r| {
                Ok(nightshift_core::tokens::Ledger {
                    used: r.get::<_, i64>(0)?.max(0) as u64,
                    reserved: r.get::<_, i64>(1)?.max(0) as u64,
                })
            })
            .map_err(sql("reading the model token ledgers"))
        };
        Ok((
            read(
                "SELECT COALESCE(SUM(used), 0), COALESCE(SUM(reserved), 0) FROM model_tokens WHERE run = ?1",
                run,
            )?,
            read(
                "SELECT COALESCE(SUM(used), 0), COALESCE(SUM(reserved), 0) FROM model_tokens WHERE night = ?1",
                night,
            )?,
        ))
    }

    /// One reservation for a call of `run` in `night`: both ledgers read,
    /// the decision taken and the grant recorded in one write transaction.
    pub fn reserve(
        &mut self,
        run: &str,
        night: &str,
        run_cap: u64,
        fleet_cap: u64,
        ask: nightshift_core::tokens::Ask,
    ) -> Result<Result<nightshift_core::tokens::Grant, nightshift_core::tokens::Refusal>, StoreError>
    {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the model token ledgers"))?;
        let (run_ledger, fleet_ledger) = Self::ledgers(&tx, run, night)?;
        let decision =
            nightshift_core::tokens::reserve(run_ledger, run_cap, fleet_ledger, fleet_cap, ask);
        if let Ok(grant) = &decision {
            tx.execute(
                "INSERT INTO model_tokens(run, night, used, reserved) VALUES (?1, ?2, 0, ?3)
                 ON CONFLICT(run, night) DO UPDATE SET reserved = reserved + ?3",
                params![run, night, grant.tokens as i64],
            )
            .map_err(sql("reserving model tokens"))?;
        }
        tx.commit()
            .map_err(sql("committing a model token reservation"))?;
        Ok(decision)
    }

    /// Settles a call that reserved `reserved` tokens in `night` with
    /// `actual` (None: the reservation is charged whole). Returns the run's
    /// and the fleet's ledgers after it.
    pub fn settle(
        &mut self,
        run: &str,
        night: &str,
        reserved: u64,
        actual: Option<u64>,
    ) -> Result<Ledgers, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("locking the model token ledgers"))?;
        let charged = actual.unwrap_or(reserved);
        tx.execute(
            "INSERT INTO model_tokens(run, night, used, reserved) VALUES (?1, ?2, ?3, 0)
             ON CONFLICT(run, night) DO UPDATE SET used = used + ?3,
                 reserved = MAX(reserved - ?4, 0)",
            params![run, night, charged as i64, reserved as i64],
        )
        .map_err(sql("settling model tokens"))?;
        let ledgers = Self::ledgers(&tx, run, night)?;
        tx.commit()
            .map_err(sql("committing a model token settlement"))?;
        Ok(ledgers)
    }

    /// A run's ledger (all nights).
    pub fn run_tokens(&self, run: &str) -> Result<nightshift_core::tokens::Ledger, StoreError> {
        Ok(Self::ledgers(&self.conn, run, "")?.0)
    }
}

impl nightshift_core::state_store::TokenLedger for SqliteTokenLedger {
    fn reserve(
        &mut self,
        run: &str,
        night: &str,
        run_cap: u64,
        fleet_cap: u64,
        ask: nightshift_core::tokens::Ask,
    ) -> Result<Result<nightshift_core::tokens::Grant, nightshift_core::tokens::Refusal>, StoreError>
    {
        SqliteTokenLedger::reserve(self, run, night, run_cap, fleet_cap, ask)
    }
    fn settle(
        &mut self,
        run: &str,
        night: &str,
        reserved: u64,
        actual: Option<u64>,
    ) -> Result<Ledgers, StoreError> {
        SqliteTokenLedger::settle(self, run, night, reserved, actual)
    }
    fn run_tokens(&self, run: &str) -> Result<nightshift_core::tokens::Ledger, StoreError> {
        SqliteTokenLedger::run_tokens(self, run)
    }
}

/// The SQLite store as the core's [`StoreBackend`]: a state directory,
/// and the directory holding the database and the files beside it (the
/// same one unless `sqlite:DIR` names another).
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    root: PathBuf,
    db: StatePaths,
}

impl SqliteBackend {
    /// The store of the state at `root`, kept in `db_dir` (or in `root`).
    pub fn new(root: PathBuf, db_dir: Option<PathBuf>) -> Self {
        let db = StatePaths::new(db_dir.unwrap_or_else(|| root.clone()));
        Self { root, db }
    }

    /// A connection as the concrete store (for this crate's own tests and
    /// benchmarks).
    pub fn open(&self) -> Result<Store, StoreError> {
        let mut store = Store::open(self.db.clone())?;
        store.root = self.root.clone();
        Ok(store)
    }
}

impl nightshift_core::state_store::StoreBackend for SqliteBackend {
    fn connect(&self) -> Result<Box<dyn StateStore>, StoreError> {
        Ok(Box::new(self.open()?))
    }
    fn connect_existing(&self, busy: Duration) -> Result<Option<Box<dyn StateStore>>, StoreError> {
        Ok(Store::open_existing(self.db.clone(), busy)?.map(|mut s| {
            s.root = self.root.clone();
            Box::new(s) as Box<dyn StateStore>
        }))
    }
    fn ledger(&self) -> Result<Box<dyn nightshift_core::state_store::TokenLedger>, StoreError> {
        Ok(Box::new(SqliteTokenLedger::open(&self.db)?))
    }
    fn root(&self) -> &Path {
        &self.root
    }
    fn location(&self) -> String {
        format!("sqlite:{}", self.db.root.display())
    }
    fn migrate(&self) -> Result<(u32, u32), StoreError> {
        create_private_dir(&self.db.root)?;
        let db = self.db.db();
        let conn = Connection::open(&db).map_err(open_error(&db))?;
        conn.busy_timeout(Duration::from_secs(30))
            .map_err(sql("setting the busy timeout"))?;
        migrate(&conn)
    }
}
