//! The state store on PostgreSQL: the same tables, the same audit chain and
//! the same transactions as the SQLite store, for a state shared by several
//! supervisors (or a hosted service) through one server. Its API is the
//! core's store ports (`port.rs`, the token ledger's in `tokens.rs`);
//! [`PgStore::connect`] makes one, and [`PgBackend`] is the core's
//! `StoreBackend` that the binary builds from a `postgres://` store URL.
//!
//! Invariants (the store contract suite, `tests/contract.rs`, holds each
//! on the fake, SQLite and this store; `tests/audit.rs` holds the ones of
//! this store alone):
//! - Every write is one transaction. Every transaction that appends an audit
//!   entry first locks the head row (`SELECT … FROM audit_head FOR UPDATE`),
//!   so appends from any number of connections are serialised and chain one
//!   after another, never forking the chain
//!   (`concurrent_appends_never_fork_the_chain`); the new entry is sealed
//!   after the entry the head names (not after the last row found), so a
//!   deleted suffix is never papered over
//!   (`a_suffix_deleted_behind_the_triggers_is_found`).
//! - The head and the checkpoints are written in the entry's transaction and
//!   live in tables that triggers keep append-only (see [`schema`] for what
//!   that holds against and what it does not;
//!   `the_log_refuses_deletion_and_rewriting_and_the_head_moves_only_forward`).
//!   A snapshot for `audit verify` is one repeatable-read transaction
//!   (`a_snapshot_beside_appenders_verifies`).
//! - Writes that count before they write (`put_act_within`) count under the
//!   head's lock, in the same transaction: two requests at once never both
//!   take the last place (`two_requests_never_both_take_the_last_place`).
//! - Moves are compare-and-set (`transition_act` under the head's lock,
//!   `move_task` in one `UPDATE … WHERE state = ANY(…)`); `end_run` writes
//!   nothing over a record that is already final.
//! - The schema is versioned (`schema_migrations`); [`PgStore::connect`]
//!   applies the missing migrations under an advisory lock, in one
//!   transaction, so racing first connections agree
//!   (`migrations_are_applied_once_by_racing_connections`), and refuses a
//!   schema newer than it knows.
//! - The client is the synchronous `postgres` crate, which runs
//!   tokio-postgres on a runtime of its own: it may not be called on a
//!   thread that is running a tokio runtime (it panics there, as any nested
//!   `block_on` does); from `spawn_blocking` and plain threads it is fine.
//!   [`PgStore`] therefore moves each call to a scoped thread of its own
//!   when it finds a runtime's handle on its thread
//!   (`tests/runtime.rs` holds it).
//! - This crate is the only one that names the PostgreSQL client
//!   (`scripts/check-layers.py`).

mod backend;
mod port;
pub mod schema;
pub mod testing;
pub mod tls;
pub mod tokens;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

pub use backend::PgBackend;
use nightshift_core::state_store::{StoredTask, TaskDecision};
use orchestrator_audit::{Checkpoint, Entry, LogId};
use postgres::{Client, NoTls, Transaction};

/// Advisory lock key under which migrations run ("nightshf" in ASCII).
const MIGRATION_LOCK: i64 = 0x6e69_6768_7473_6866;

/// Why a PostgreSQL store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("connecting to the state store {url}: {source}")]
    Connect {
        /// The URL without its password ([`redact`]).
        url: String,
        #[source]
        source: postgres::Error,
    },
    #[error("connecting to the state store {url}: {why}")]
    Tls {
        /// The URL without its password ([`redact`]).
        url: String,
        why: String,
    },
    #[error("{doing}: {source}")]
    Sql {
        doing: &'static str,
        #[source]
        source: postgres::Error,
    },
    #[error("{what} in the state store is unreadable: {message}")]
    Bad { what: String, message: String },
    #[error("the state store's schema is at version {found}, newer than this build's {known}")]
    TooNew { found: i32, known: i32 },
}

/// What kind of failure a [`PgError`] is, decided by its SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgErrorKind {
    /// Another transaction stood in the way (serialisation failure,
    /// deadlock, lock not available): trying again may succeed.
    Busy,
    /// A row with that key exists.
    Conflict,
    /// The server's disk is full.
    DiskFull,
    /// Anything else: the server, the connection or the data.
    Backend,
}

impl PgError {
    pub fn kind(&self) -> PgErrorKind {
        use postgres::error::SqlState;
        let code = match self {
            PgError::Sql { source, .. } | PgError::Connect { source, .. } => source.code(),
            _ => None,
        };
        match code {
            Some(c)
                if *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED
                    || *c == SqlState::LOCK_NOT_AVAILABLE =>
            {
                PgErrorKind::Busy
            }
            Some(c) if *c == SqlState::UNIQUE_VIOLATION => PgErrorKind::Conflict,
            Some(c) if *c == SqlState::DISK_FULL => PgErrorKind::DiskFull,
            _ => PgErrorKind::Backend,
        }
    }
}

fn sql(doing: &'static str) -> impl FnOnce(postgres::Error) -> PgError {
    move |source| PgError::Sql { doing, source }
}

fn bad(what: impl Into<String>, message: impl std::fmt::Display) -> PgError {
    PgError::Bad {
        what: what.into(),
        message: message.to_string(),
    }
}

/// An act as stored: the act, its queue state, its content.
pub(crate) type ActRow = (serde_json::Value, serde_json::Value, Option<Vec<u8>>);

/// What `audit verify` checks, read in one snapshot.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuditRead {
    pub head: Option<Checkpoint>,
    pub checkpoints: Vec<Checkpoint>,
    pub entries: Vec<Entry>,
}

/// The acts already requested that a new one is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub of_run: u64,
    pub tonight: u64,
    pub of_repository: u64,
}

/// How a transaction run by [`PgStore::decided`] ends.
enum Finish<T> {
    Commit(T),
    Rollback(T),
}

/// The bounds a new act must fall within: the night's start (RFC 3339),
/// the run's repository as runs record it, and the caller's rule, which
/// answers a refusal or nothing.
pub(crate) struct Bounds<'a, R> {
    pub since: &'a str,
    pub repo: &'a str,
    pub refuse: &'a dyn Fn(Counts) -> Option<R>,
}

impl<R> std::fmt::Debug for Bounds<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounds")
            .field("since", &self.since)
            .field("repo", &self.repo)
            .finish_non_exhaustive()
    }
}

/// The state in one PostgreSQL database; files (rules, worktrees) stay
/// under `root` on the machine.
pub struct PgStore {
    /// Always `Some` but in `drop`, which takes it to close it off a
    /// runtime's thread (or to give it back to its pool). A mutex because
    /// the port reads through `&self`; a call holds it for its whole
    /// transaction.
    client: Mutex<Option<(Client, Ctx)>>,
    root: PathBuf,
    log: LogId,
    migrated: Migrated,
    /// Where the connection goes back when this store is dropped.
    pool: Option<Pool>,
}

/// Connections a [`crate::PgBackend`] keeps between callers, each with its
/// prepared statements: a caller that takes one (the door's request, a
/// page) pays no connection, migration check or statement preparation.
pub(crate) type Pool = std::sync::Arc<Idle>;

/// A pool's idle connections; closed off a runtime's thread when the pool
/// goes (a client's drop blocks on its own runtime, which panics on a
/// runtime's thread).
#[derive(Default)]
pub(crate) struct Idle(Mutex<Vec<(Client, Ctx)>>);

impl Idle {
    fn take(&self) -> Option<(Client, Ctx)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        let idle = std::mem::take(self.0.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (client, _) in idle {
            close(client);
        }
    }
}

/// At most this many idle connections are kept in a pool.
const POOL_IDLE: usize = 8;

/// What every call's transaction needs beside the client: the log's id and
/// the statements of the audit append, the act queue's writes and the
/// dashboard's page of the queue, prepared
/// once per connection (a statement given as text costs a round trip to
/// prepare it each time).
pub(crate) struct Ctx {
    log: LogId,
    migrated: Migrated,
    hot: Hot,
}

struct Hot {
    lock_head: postgres::Statement,
    insert_entry: postgres::Statement,
    move_head: postgres::Statement,
    insert_checkpoint: postgres::Statement,
    insert_act: postgres::Statement,
    act_state: postgres::Statement,
    move_act: postgres::Statement,
    count_in_states: postgres::Statement,
    page_in_states: postgres::Statement,
}

impl Hot {
    fn prepare(c: &mut Client) -> Result<Self, PgError> {
        let mut p = |q: &str| {
            c.prepare(q)
                .map_err(sql("preparing the store's statements"))
        };
        Ok(Self {
            lock_head: p("SELECT seq, hash FROM audit_head FOR UPDATE")?,
            insert_entry: p(
                "INSERT INTO audit(seq, time, kind, run, body, prev, hash) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )?,
            move_head: p("UPDATE audit_head SET seq = $1, hash = $2, time = $3")?,
            insert_checkpoint: p("INSERT INTO audit_checkpoints(seq, hash, time) VALUES ($1, $2, $3)")?,
            insert_act: p(
                "INSERT INTO acts(id, run, act, state, content, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $6)",
            )?,
            act_state: p("SELECT state FROM acts WHERE id = $1 FOR UPDATE")?,
            move_act: p("UPDATE acts SET state = $1, updated_at = $2 WHERE id = $3")?,
            count_in_states: p("SELECT count(*) FROM acts WHERE queue_state = ANY($1)")?,
            page_in_states: p(
                "SELECT act, state, content FROM acts WHERE queue_state = ANY($1)
                 ORDER BY created_at, id LIMIT $2 OFFSET $3",
            )?,
        })
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("root", &self.root)
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

/// Whether this thread may be running a tokio runtime, where the client's
/// own `block_on` would panic. Tokio does not say whether a thread with a
/// runtime's handle is a worker (where it panics) or a `spawn_blocking`
/// thread (where it would not), so any thread with a handle counts: a call
/// there costs a thread's start more.
fn on_runtime_thread() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// A client connected to `url` (waiting at most `timeout` for the server,
/// when given), made off a runtime's thread.
fn client(url: &str, timeout: Option<std::time::Duration>) -> Result<Client, PgError> {
    let fail = |source| PgError::Connect {
        url: redact(url),
        source,
    };
    let connect = || {
        let tls_fail = |why| PgError::Tls {
            url: redact(url),
            why,
        };
        let split = tls::split(url).map_err(tls_fail)?;
        let mut config: postgres::Config = split.url.parse().map_err(fail)?;
        if let Some(t) = timeout {
            config.connect_timeout(t);
        }
        match split.tls {
            tls::Tls::Off => config.connect(NoTls).map_err(fail),
            tls::Tls::Verified { roots } => {
                config.ssl_mode(postgres::config::SslMode::Require);
                let connector = tls::connector(roots.as_deref()).map_err(tls_fail)?;
                config.connect(connector).map_err(fail)
            }
        }
    };
    if on_runtime_thread() {
        std::thread::scope(|s| s.spawn(connect).join())
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    } else {
        connect()
    }
}

/// A client connected to `url` with the TLS it asks for (`tls`'s rules),
/// for tools and tests that need SQL beside the store.
pub fn connect_client(url: &str) -> Result<Client, PgError> {
    client(url, None)
}

/// Runs `f` with the client, on another thread when this one runs a runtime.
fn off_runtime<T: Send>(client: &mut Client, f: impl FnOnce(&mut Client) -> T + Send) -> T {
    if on_runtime_thread() {
        std::thread::scope(|s| match s.spawn(|| f(client)).join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    } else {
        f(client)
    }
}

/// `url` without its password (`postgres://user:secret@host` names
/// `postgres://user@host`; a `password=` parameter is dropped), for messages.
pub fn redact(url: &str) -> String {
    let url = match url.split_once('?') {
        Some((base, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .filter(|p| !p.starts_with("password="))
                .collect();
            format!("{base}?{}", kept.join("&"))
        }
        None => url.to_string(),
    };
    let url = url.as_str();
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}{}", &url[..scheme_end], &rest[at..])
        }
        None => url.to_string(),
    }
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://…`, a Unix socket as
    /// `?host=/dir`), applies the migrations it lacks, and keeps files
    /// under `state_root`.
    pub fn connect(url: &str, state_root: &Path) -> Result<Self, PgError> {
        let mut client = client(url, None)?;
        let cx = off_runtime(&mut client, |c| {
            let migrated = migrate(c)?;
            Ok::<_, PgError>(Ctx {
                migrated,
                log: log_id(c)?,
                hot: Hot::prepare(c)?,
            })
        })?;
        Ok(Self::of(client, cx, state_root, None))
    }

    fn of(client: Client, cx: Ctx, state_root: &Path, pool: Option<Pool>) -> Self {
        Self {
            log: cx.log.clone(),
            migrated: cx.migrated,
            client: Mutex::new(Some((client, cx))),
            root: state_root.to_path_buf(),
            pool,
        }
    }

    /// A store on a connection of `pool` when one is idle there (its
    /// session reset by a `ROLLBACK`, so nothing a previous holder left
    /// open carries over), else on a new one; given back to `pool` when
    /// dropped.
    pub(crate) fn pooled(url: &str, state_root: &Path, pool: &Pool) -> Result<Self, PgError> {
        while let Some((mut client, cx)) = pool.take() {
            if !client.is_closed()
                && off_runtime(&mut client, |c| c.batch_execute("ROLLBACK")).is_ok()
            {
                return Ok(Self::of(client, cx, state_root, Some(pool.clone())));
            }
            close(client);
        }
        let mut store = Self::connect(url, state_root)?;
        store.pool = Some(pool.clone());
        Ok(store)
    }

    /// Connects to a store that already exists, never making or migrating
    /// one, waiting at most `busy` to connect and for each lock (the
    /// harness hook must answer within a bound); `None` when the database
    /// holds no store.
    pub fn connect_existing(
        url: &str,
        state_root: &Path,
        busy: std::time::Duration,
    ) -> Result<Option<Self>, PgError> {
        let mut client = client(url, Some(busy))?;
        let cx = off_runtime(&mut client, |c| {
            c.batch_execute(&format!("SET lock_timeout = {}", busy.as_millis().max(1)))
                .map_err(sql("setting the lock timeout"))?;
            let made: bool = c
                .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
                .map_err(sql("looking for the store's schema"))?
                .get(0);
            if !made {
                return Ok(None);
            }
            let Some(at) = c
                .query_one("SELECT MAX(version) FROM schema_migrations", &[])
                .map_err(sql("reading the schema version"))?
                .get::<_, Option<i32>>(0)
            else {
                return Ok(None);
            };
            let known = schema::MIGRATIONS.last().map_or(0, |m| m.0);
            if at > known {
                return Err(PgError::TooNew { found: at, known });
            }
            let Some(log) = c
                .query_opt("SELECT value FROM meta WHERE key = 'log_id'", &[])
                .map_err(sql("reading the audit log id"))?
                .map(|r| LogId(r.get(0)))
            else {
                return Ok(None);
            };
            Ok(Some(Ctx {
                migrated: Migrated { from: at, to: at },
                log,
                hot: Hot::prepare(c)?,
            }))
        })?;
        Ok(cx.map(|cx| Self::of(client, cx, state_root, None)))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn log(&self) -> &LogId {
        &self.log
    }

    /// Runs `f` on the client (off a runtime's thread, see the module note).
    fn with<T: Send>(
        &self,
        f: impl FnOnce(&mut Client, &Ctx) -> Result<T, PgError> + Send,
    ) -> Result<T, PgError> {
        let mut guard = self.lock();
        let (client, cx) = guard.as_mut().expect("the client is taken only by drop");
        let cx = &*cx;
        off_runtime(client, |c| f(c, cx))
    }

    /// Runs a transaction whose decision is the caller's (a callback that
    /// need not be `Send`, so it cannot go to another thread with the
    /// client): `first` begins it and reads, `decide` judges on this
    /// thread, `then` writes what was decided and says whether to commit.
    /// An error, or [`Finish::Rollback`], rolls it back.
    fn decided<R: Send, D, T: Send>(
        &self,
        first: impl FnOnce(&mut Client, &Ctx) -> Result<R, PgError> + Send,
        decide: impl FnOnce(&R) -> D,
        then: impl FnOnce(&mut Client, &Ctx, R, D) -> Result<Finish<T>, PgError> + Send,
    ) -> Result<T, PgError>
    where
        D: Send,
    {
        let mut guard = self.lock();
        let (client, cx) = guard.as_mut().expect("the client is taken only by drop");
        let cx = &*cx;
        let read = off_runtime(client, |c| {
            c.batch_execute("BEGIN")
                .map_err(sql("beginning a transaction"))?;
            first(c, cx)
        });
        let done = read.and_then(|read| {
            let decision = decide(&read);
            off_runtime(client, |c| match then(c, cx, read, decision)? {
                Finish::Commit(t) => {
                    c.batch_execute("COMMIT")
                        .map_err(sql("committing a transaction"))?;
                    Ok(Ok(t))
                }
                Finish::Rollback(t) => Ok(Err(t)),
            })
        });
        match done {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(t)) => {
                off_runtime(client, |c| c.batch_execute("ROLLBACK"))
                    .map_err(sql("rolling a transaction back"))?;
                Ok(t)
            }
            Err(e) => {
                // The error is the one to report; a failed rollback ends
                // with the connection, which the server then rolls back.
                let _ = off_runtime(client, |c| c.batch_execute("ROLLBACK"));
                Err(e)
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<(Client, Ctx)>> {
        self.client.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What opening did to the schema (for `nightshift store migrate`).
    pub fn migrated(&self) -> Migrated {
        self.migrated
    }

    /// The version the schema is at.
    pub fn schema_version(&self) -> Result<i32, PgError> {
        self.with(|c, _| {
            let row = c
                .query_one(
                    "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
                    &[],
                )
                .map_err(sql("reading the schema version"))?;
            Ok(row.get(0))
        })
    }

    // ----- meta -----

    pub(crate) fn meta(&self, key: &str) -> Result<Option<String>, PgError> {
        self.with(|c, _| {
            Ok(
                c.query_opt("SELECT value FROM meta WHERE key = $1", &[&key])
                    .map_err(sql("reading a setting"))?
                    .map(|r| r.get(0)),
            )
        })
    }

    pub(crate) fn set_meta(&self, key: &str, value: Option<&str>) -> Result<(), PgError> {
        self.with(|c, _| {
            match value {
                Some(v) => c.execute(
                    "INSERT INTO meta(key, value) VALUES ($1, $2)
                     ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    &[&key, &v],
                ),
                None => c.execute("DELETE FROM meta WHERE key = $1", &[&key]),
            }
            .map_err(sql("writing a setting"))?;
            Ok(())
        })
    }

    // ----- audit -----

    /// Appends one audit entry and, when `checkpoint` is set, its checkpoint,
    /// in one transaction.
    pub(crate) fn append(
        &self,
        run: Option<&str>,
        kind: &str,
        body: serde_json::Value,
        checkpoint: bool,
    ) -> Result<Entry, PgError> {
        self.with(|c, cx| {
            let mut tx = c.transaction().map_err(sql("beginning an audit append"))?;
            let entry = append_in(&mut tx, cx, run, kind, body, checkpoint)?;
            tx.commit().map_err(sql("committing an audit entry"))?;
            Ok(entry)
        })
    }

    /// The chain's head (`None` for an empty log).
    pub(crate) fn read_head(&self) -> Result<Option<Checkpoint>, PgError> {
        self.with(|c, _| head_in(c))
    }

    pub(crate) fn checkpoints(&self) -> Result<Vec<Checkpoint>, PgError> {
        self.with(|c, _| checkpoints_in(c))
    }

    /// Head, checkpoints and entries from `from` on, in one repeatable-read
    /// snapshot: everything the head and checkpoints name is in it.
    pub(crate) fn audit_read(&self, from: u64) -> Result<AuditRead, PgError> {
        /// Keeps everything [`PgStore::visit_audit`] hands over.
        #[derive(Default)]
        struct Keep(AuditRead);
        impl nightshift_core::state_store::AuditVisitor for Keep {
            fn begin(&mut self, head: Option<Checkpoint>, checkpoints: Vec<Checkpoint>) -> bool {
                self.0.head = head;
                self.0.checkpoints = checkpoints;
                true
            }
            fn entry(&mut self, entry: Entry) -> bool {
                self.0.entries.push(entry);
                true
            }
        }
        let mut keep = Keep::default();
        self.visit_audit(from, &mut keep)?;
        Ok(keep.0)
    }

    /// The head, the checkpoints and the entries from `from` on, one batch
    /// at a time (what [`PgStore::audit_read`] keeps whole): the head,
    /// the checkpoints and then the entries from `from` on, all in one
    /// repeatable-read transaction, the entries fetched through a portal
    /// in batches of [`VISIT_BATCH`] rows, each handed to `visitor` before
    /// the next is fetched.
    pub(crate) fn visit_audit(
        &self,
        from: u64,
        visitor: &mut dyn nightshift_core::state_store::AuditVisitor,
    ) -> Result<(), PgError> {
        self.with(|c, _| {
            let mut tx = c
                .build_transaction()
                .isolation_level(postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .map_err(sql("beginning an audit read"))?;
            let head = head_in(&mut tx)?;
            let checkpoints = checkpoints_in(&mut tx)?;
            if !visitor.begin(head, checkpoints) {
                return tx.commit().map_err(sql("ending an audit read"));
            }
            let from = from.min(i64::MAX as u64) as i64;
            let portal = tx
                .bind(
                    "SELECT seq, time, kind, run, body, prev, hash FROM audit
                     WHERE seq >= $1 ORDER BY seq",
                    &[&from],
                )
                .map_err(sql("reading the audit log"))?;
            'batches: loop {
                let rows = tx
                    .query_portal(&portal, VISIT_BATCH)
                    .map_err(sql("reading the audit log"))?;
                if rows.is_empty() {
                    break;
                }
                for r in &rows {
                    if !visitor.entry(entry_of(r)?) {
                        break 'batches;
                    }
                }
            }
            tx.commit().map_err(sql("ending an audit read"))
        })
    }

    pub(crate) fn entries_from(&self, seq: u64) -> Result<Vec<Entry>, PgError> {
        let seq = seq.min(i64::MAX as u64) as i64;
        self.with(|c, _| entries_where(c, "seq >= $1", &[&seq]))
    }

    pub(crate) fn entries_for_run(&self, run: &str) -> Result<Vec<Entry>, PgError> {
        self.with(|c, _| entries_where(c, "run = $1", &[&run]))
    }

    /// The refused (or undecided) door requests, of one run or of all.
    pub(crate) fn door_refusals(&self, run: Option<&str>) -> Result<Vec<Entry>, PgError> {
        self.with(|c, _| {
            entries_where(
                c,
                "kind = 'door_request' AND ($1::text IS NULL OR run = $1)
                 AND (body::jsonb ->> 'verdict') IN ('refused', 'error')",
                &[&run],
            )
        })
    }

    /// The run and body of every entry of `kind` at or after `since`.
    pub(crate) fn bodies_of_kind_since(
        &self,
        kind: &str,
        since: &str,
    ) -> Result<Vec<(Option<String>, serde_json::Value)>, PgError> {
        self.with(|c, _| {
            let rows = c
                .query(
                    "SELECT run, body FROM audit WHERE kind = $1 AND time >= $2 ORDER BY seq",
                    &[&kind, &since],
                )
                .map_err(sql("reading the audit log"))?;
            Ok(rows
                .iter()
                .map(|r| {
                    let body: String = r.get(1);
                    (r.get(0), serde_json::from_str(&body).unwrap_or_default())
                })
                .collect())
        })
    }

    /// The label the door recorded for each queued act.
    pub(crate) fn act_labels(&self) -> Result<std::collections::HashMap<String, String>, PgError> {
        self.with(|c, _| {
            let rows = c
                .query(
                    "SELECT body::jsonb ->> 'act', body::jsonb ->> 'label' FROM audit
                     WHERE kind = 'door_request' AND (body::jsonb ->> 'act') IS NOT NULL",
                    &[],
                )
                .map_err(sql("reading the acts' labels"))?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    Some((
                        r.get::<_, Option<String>>(0)?,
                        r.get::<_, Option<String>>(1)?,
                    ))
                })
                .collect())
        })
    }

    // ----- runs -----

    /// Saves a run's record (JSON), created or replaced.
    pub(crate) fn put_run(&self, id: &str, created_at: &str, record: &str) -> Result<(), PgError> {
        self.with(|c, _| upsert_run(c, id, created_at, record))
    }

    /// One run's record (JSON).
    pub(crate) fn run(&self, id: &str) -> Result<Option<String>, PgError> {
        self.with(|c, _| {
            Ok(c.query_opt("SELECT record FROM runs WHERE id = $1", &[&id])
                .map_err(sql("reading a run"))?
                .map(|r| r.get(0)))
        })
    }

    /// Every run's record (JSON), oldest first.
    pub(crate) fn runs(&self) -> Result<Vec<String>, PgError> {
        self.with(|c, _| {
            Ok(
                c.query("SELECT record FROM runs ORDER BY created_at, id", &[])
                    .map_err(sql("listing runs"))?
                    .iter()
                    .map(|r| r.get(0))
                    .collect(),
            )
        })
    }

    /// Records that a run is to be killed, by whom (the first request wins).
    pub(crate) fn request_kill(&self, run: &str, by: &str) -> Result<bool, PgError> {
        let now = now_rfc3339();
        self.with(|c, _| {
            let n = c
                .execute(
                    "INSERT INTO kill_requests(run, by, at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[&run, &by, &now],
                )
                .map_err(sql("recording a kill request"))?;
            Ok(n == 1)
        })
    }

    pub(crate) fn kill_request(&self, run: &str) -> Result<Option<String>, PgError> {
        self.with(|c, _| {
            Ok(
                c.query_opt("SELECT by FROM kill_requests WHERE run = $1", &[&run])
                    .map_err(sql("reading a kill request"))?
                    .map(|r| r.get(0)),
            )
        })
    }

    /// Claims the settling of a run (see the SQLite store's `claim_settle`).
    pub(crate) fn claim_settle(
        &self,
        run: &str,
        by: &str,
        claimer: &str,
        gone: &dyn Fn(&str) -> bool,
    ) -> Result<bool, PgError> {
        self.decided(
            |c, _| {
                // The row is made first (or found), then locked: two
                // claimers of a new run meet on its lock, not its key.
                c.execute(
                    "INSERT INTO settled(run, by, claimer) VALUES ($1, $2, NULL) ON CONFLICT DO NOTHING",
                    &[&run, &by],
                )
                .map_err(sql("claiming a run to settle"))?;
                let held: Option<String> = c
                    .query_one("SELECT claimer FROM settled WHERE run = $1 FOR UPDATE", &[&run])
                    .map_err(sql("reading a settle claim"))?
                    .get(0);
                Ok(held)
            },
            |held| match held {
                Some(c) if c == claimer => Some(false),
                Some(c) if !gone(c) => None,
                _ => Some(true),
            },
            |c, _, _, take| {
                if take == Some(true) {
                    c.execute(
                        "UPDATE settled SET by = $2, claimer = $3 WHERE run = $1",
                        &[&run, &by, &claimer],
                    )
                    .map_err(sql("taking over a settle claim"))?;
                }
                Ok(Finish::Commit(take.is_some()))
            },
        )
    }

    pub(crate) fn release_settle(&self, run: &str, claimer: &str) -> Result<(), PgError> {
        self.with(|c, _| {
            c.execute(
                "UPDATE settled SET claimer = NULL WHERE run = $1 AND claimer = $2",
                &[&run, &claimer],
            )
            .map_err(sql("releasing a settle claim"))?;
            Ok(())
        })
    }

    /// Saves a run whose work is safe and marks it so, in one transaction.
    pub(crate) fn record_imported(
        &self,
        id: &str,
        created_at: &str,
        record: &str,
    ) -> Result<(), PgError> {
        let now = now_rfc3339();
        self.with(|c, _| {
            let mut tx = c.transaction().map_err(sql("beginning an import mark"))?;
            upsert_run(&mut tx, id, created_at, record)?;
            tx.execute(
                "INSERT INTO settled(run, by, imported_at) VALUES ($1, 'import', $2)
                 ON CONFLICT(run) DO UPDATE SET imported_at = excluded.imported_at",
                &[&id, &now],
            )
            .map_err(sql("marking a run imported"))?;
            tx.commit().map_err(sql("committing a run's import mark"))
        })
    }

    pub(crate) fn imported(&self, run: &str) -> Result<bool, PgError> {
        self.with(|c, _| {
            let at: Option<Option<String>> = c
                .query_opt("SELECT imported_at FROM settled WHERE run = $1", &[&run])
                .map_err(sql("reading a run's import mark"))?
                .map(|r| r.get(0));
            Ok(matches!(at, Some(Some(_))))
        })
    }

    /// Saves a run's final record and appends its ending (checkpointed) in
    /// one transaction, unless the stored record's status is already final
    /// (`is_final` judges a stored record's JSON): `None` then.
    pub(crate) fn end_run(
        &self,
        id: &str,
        created_at: &str,
        record: &str,
        kind: &str,
        body: serde_json::Value,
        is_final: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Option<Entry>, PgError> {
        self.with(|c, cx| {
            let mut tx = c.transaction().map_err(sql("beginning a run's ending"))?;
            let head = lock_head(&mut tx, cx)?;
            let stored: Option<String> = tx
                .query_opt("SELECT record FROM runs WHERE id = $1 FOR UPDATE", &[&id])
                .map_err(sql("reading a run"))?
                .map(|r| r.get(0));
            if stored.as_deref().is_some_and(is_final) {
                return Ok(None);
            }
            upsert_run(&mut tx, id, created_at, record)?;
            let entry = seal_after(&mut tx, cx, head, Some(id), kind, body, true)?;
            tx.commit().map_err(sql("committing a run's ending"))?;
            Ok(Some(entry))
        })
    }

    // ----- acts -----

    /// Queues an act: its row and its audit entry in one transaction; with
    /// `bounds`, only if the counts read under the head's lock pass them
    /// (`Some(refusal)`, nothing written, when they do not).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_act<R: Send>(
        &self,
        id: &str,
        run: &str,
        act: &serde_json::Value,
        state: &serde_json::Value,
        content: Option<&[u8]>,
        kind: &str,
        body: serde_json::Value,
        bounds: Option<Bounds<'_, R>>,
    ) -> Result<Option<R>, PgError> {
        let now = now_rfc3339();
        let (act, state) = (act.to_string(), state.to_string());
        let (since, repo) = bounds.as_ref().map(|b| (b.since, b.repo)).unzip();
        self.decided(
            |c, cx| {
                let head = lock_head(c, cx)?;
                let counts = match (since, repo) {
                    (Some(since), Some(repo)) => Some(Counts {
                        of_run: count_of_run(c, run)?,
                        tonight: count_since(c, since, None)?,
                        of_repository: count_since(c, since, Some(repo))?,
                    }),
                    _ => None,
                };
                Ok((head, counts))
            },
            |(_, counts)| match (&bounds, counts) {
                (Some(b), Some(counts)) => (b.refuse)(*counts),
                _ => None,
            },
            |c, cx, (head, _), refusal| {
                if refusal.is_some() {
                    return Ok(Finish::Rollback(refusal));
                }
                c.execute(
                    &cx.hot.insert_act,
                    &[&id, &run, &act, &state, &content, &now],
                )
                .map_err(sql("queueing an act"))?;
                seal_after(c, cx, head, Some(run), kind, body, false)?;
                Ok(Finish::Commit(None))
            },
        )
    }

    /// Moves an act from `from` to `to` with its audit entry, only if its
    /// state is still `from` (compared as JSON values).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn transition_act(
        &self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        kind: &str,
        body: serde_json::Value,
    ) -> Result<bool, PgError> {
        let now = now_rfc3339();
        let to = to.to_string();
        self.with(|c, cx| {
            let mut tx = c.transaction().map_err(sql("beginning an act's move"))?;
            let head = lock_head(&mut tx, cx)?;
            if !act_in_state(&mut tx, cx, id, from)? {
                return Ok(false);
            }
            tx.execute(&cx.hot.move_act, &[&to, &now, &id])
                .map_err(sql("moving an act"))?;
            seal_after(&mut tx, cx, head, Some(run), kind, body, false)?;
            tx.commit().map_err(sql("committing an act's move"))?;
            Ok(true)
        })
    }

    // ----- the executors' leases on acts -----

    /// Closes act `id` (from `from` to `to`, audited) and queues `new_id`
    /// in its place (audited first, as the other stores do), in one
    /// transaction; false (nothing written) when `id` is not in `from`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn replace_act(
        &self,
        id: &str,
        run: &str,
        from: &serde_json::Value,
        to: &serde_json::Value,
        (kind, body): (&str, serde_json::Value),
        new_id: &str,
        new_act: &serde_json::Value,
        new_state: &serde_json::Value,
        content: Option<&[u8]>,
        (new_kind, new_body): (&str, serde_json::Value),
    ) -> Result<bool, PgError> {
        let now = now_rfc3339();
        let (to, new_act, new_state) = (to.to_string(), new_act.to_string(), new_state.to_string());
        self.with(|c, cx| {
            let mut tx = c
                .transaction()
                .map_err(sql("beginning an act's rebinding"))?;
            let head = lock_head(&mut tx, cx)?;
            if !act_in_state(&mut tx, cx, id, from)? {
                return Ok(false);
            }
            tx.execute(
                &cx.hot.insert_act,
                &[&new_id, &run, &new_act, &new_state, &content, &now],
            )
            .map_err(sql("queueing an act's replacement"))?;
            let first = seal_after(&mut tx, cx, head, Some(run), new_kind, new_body, false)?;
            tx.execute(&cx.hot.move_act, &[&to, &now, &id])
                .map_err(sql("closing a replaced act"))?;
            seal_after(
                &mut tx,
                cx,
                (first.seq as i64, first.hash.clone()),
                Some(run),
                kind,
                body,
                false,
            )?;
            tx.commit().map_err(sql("committing an act's rebinding"))?;
            Ok(true)
        })
    }

    /// Claims the oldest act an executor may work on now for `holder`
    /// (`FOR UPDATE SKIP LOCKED`, then the lease, in one transaction).
    pub(crate) fn claim_act(
        &self,
        holder: &str,
        now: i64,
        lease_until: i64,
        only: Option<&str>,
    ) -> Result<Option<ActRow>, PgError> {
        self.with(|c, _| {
            let mut tx = c.transaction().map_err(sql("beginning an act's claim"))?;
            let row = tx
                .query_opt(
                    "SELECT id, act, state, content FROM acts
                     WHERE ($2::text IS NULL OR id = $2)
                       AND (queue_state IN ('approved', 'executing', 'outcome_unknown')
                            OR (queue_state = 'awaiting_retry'
                                AND ((state::jsonb) ->> 'not_before') ~ '^-?[0-9]+$'
                                AND ((state::jsonb) ->> 'not_before')::bigint <= $1))
                       AND (lease_until IS NULL OR lease_until < $1)
                     ORDER BY created_at, id
                     LIMIT 1
                     FOR UPDATE SKIP LOCKED",
                    &[&now, &only],
                )
                .map_err(sql("finding an act to claim"))?;
            let Some(row) = row else {
                return Ok(None);
            };
            let id: String = row.get(0);
            tx.execute(
                "UPDATE acts SET lease_holder = $1, lease_until = $2 WHERE id = $3",
                &[&holder, &lease_until, &id],
            )
            .map_err(sql("claiming an act"))?;
            let parse = |t: &str| serde_json::from_str(t).map_err(|e| bad("an act row", e));
            let claimed = (parse(row.get(1))?, parse(row.get(2))?, row.get(3));
            tx.commit().map_err(sql("committing an act's claim"))?;
            Ok(Some(claimed))
        })
    }

    /// Extends `holder`'s lease on act `id`; false when another holds it.
    pub(crate) fn renew_act(
        &self,
        id: &str,
        holder: &str,
        lease_until: i64,
    ) -> Result<bool, PgError> {
        self.with(|c, _| {
            let n = c
                .execute(
                    "UPDATE acts SET lease_until = $1 WHERE id = $2 AND lease_holder = $3",
                    &[&lease_until, &id, &holder],
                )
                .map_err(sql("renewing an act's lease"))?;
            Ok(n == 1)
        })
    }

    /// Gives `holder`'s lease on act `id` back.
    pub(crate) fn release_act(&self, id: &str, holder: &str) -> Result<(), PgError> {
        self.with(|c, _| {
            c.execute(
                "UPDATE acts SET lease_holder = NULL, lease_until = NULL WHERE id = $1 AND lease_holder = $2",
                &[&id, &holder],
            )
            .map_err(sql("releasing an act's lease"))?;
            Ok(())
        })
    }

    /// Every act (or one), oldest first.
    pub(crate) fn acts(&self, id: Option<&str>) -> Result<Vec<ActRow>, PgError> {
        self.with(|c, _| {
            let rows = c
                .query(
                    "SELECT act, state, content FROM acts WHERE $1::text IS NULL OR id = $1
                     ORDER BY created_at, id",
                    &[&id],
                )
                .map_err(sql("reading the act queue"))?;
            rows.iter().map(act_row).collect()
        })
    }

    /// One page of the acts whose queue state is one of `states`, and how
    /// many there are in all.
    pub(crate) fn acts_in_states(
        &self,
        states: &[&str],
        offset: u64,
        limit: u64,
    ) -> Result<(Vec<ActRow>, u64), PgError> {
        let states: Vec<String> = states.iter().map(|s| s.to_string()).collect();
        let (offset, limit) = (
            offset.min(i64::MAX as u64) as i64,
            limit.min(i64::MAX as u64) as i64,
        );
        self.with(|c, cx| {
            let total: i64 = c
                .query_one(&cx.hot.count_in_states, &[&states])
                .map_err(sql("counting the act queue"))?
                .get(0);
            let rows = c
                .query(&cx.hot.page_in_states, &[&states, &limit, &offset])
                .map_err(sql("reading the act queue"))?;
            Ok((
                rows.iter().map(act_row).collect::<Result<_, _>>()?,
                total as u64,
            ))
        })
    }

    /// A run's acts, queued or (in a dry run) recorded.
    pub(crate) fn count_acts(&self, run: &str) -> Result<u64, PgError> {
        self.with(|c, _| count_of_run(c, run))
    }

    /// Acts created at or after `since`, of every run or of repository `repo`'s.
    pub(crate) fn count_acts_since(&self, since: &str, repo: Option<&str>) -> Result<u64, PgError> {
        self.with(|c, _| count_since(c, since, repo))
    }

    /// Records a dry run's act with its audit entry, in one transaction.
    pub(crate) fn put_dry_act(
        &self,
        id: &str,
        run: &str,
        record: &serde_json::Value,
        kind: &str,
        body: serde_json::Value,
    ) -> Result<Entry, PgError> {
        let now = now_rfc3339();
        let record = record.to_string();
        self.with(|c, cx| {
            let mut tx = c.transaction().map_err(sql("beginning a dry-run act"))?;
            let head = lock_head(&mut tx, cx)?;
            tx.execute(
                "INSERT INTO dry_acts(id, run, created_at, record) VALUES ($1, $2, $3, $4)",
                &[&id, &run, &now, &record],
            )
            .map_err(sql("recording a dry-run act"))?;
            let entry = seal_after(&mut tx, cx, head, Some(run), kind, body, false)?;
            tx.commit().map_err(sql("committing a dry-run act"))?;
            Ok(entry)
        })
    }

    pub(crate) fn dry_acts(&self, run: Option<&str>) -> Result<Vec<serde_json::Value>, PgError> {
        self.with(|c, _| {
            c.query(
                "SELECT record FROM dry_acts WHERE $1::text IS NULL OR run = $1 ORDER BY created_at, id",
                &[&run],
            )
            .map_err(sql("reading the dry-run acts"))?
            .iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(|e| bad("a dry-run act", e)))
            .collect()
        })
    }

    // ----- the run queue -----

    /// Adds tasks `(id, spec)` in the given order, all or none, as `state`.
    pub(crate) fn insert_tasks(
        &self,
        tasks: &[(String, String)],
        state: &str,
    ) -> Result<(), PgError> {
        let now = now_rfc3339();
        self.with(|c, _| {
            let mut tx = c.transaction().map_err(sql("beginning to enqueue tasks"))?;
            let stmt = tx
                .prepare(
                    "INSERT INTO tasks(id, state, spec, progress, created_at, updated_at)
                     VALUES ($1, $2, $3, '{}', $4, $4)",
                )
                .map_err(sql("enqueueing a task"))?;
            for (id, spec) in tasks {
                tx.execute(&stmt, &[id, &state, spec, &now])
                    .map_err(sql("enqueueing a task"))?;
            }
            tx.commit().map_err(sql("enqueueing tasks"))
        })
    }

    /// Where the log is kept and its size, as the dashboard's chain check
    /// compares them ([`nightshift_core::state_store::StoreFingerprint`]):
    /// the database's oid (another database), the audit table's file node
    /// (a rewritten or re-created table: `VACUUM FULL`, a restore) and its
    /// size on disk (which shrinks when removed rows are vacuumed away).
    pub fn fingerprint(&self) -> Result<nightshift_core::state_store::StoreFingerprint, PgError> {
        self.with(|c, _| {
            let row = c
                .query_one(
                    "SELECT d.oid::bigint, pg_relation_filenode('audit')::bigint,
                            pg_relation_size('audit')::bigint
                     FROM pg_database d WHERE d.datname = current_database()",
                    &[],
                )
                .map_err(sql("reading where the audit log is kept"))?;
            let (dev, ino, len): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
            Ok(nightshift_core::state_store::StoreFingerprint {
                dev: dev as u64,
                ino: ino as u64,
                len: len as u64,
            })
        })
    }

    pub(crate) fn tasks(&self) -> Result<Vec<StoredTask>, PgError> {
        self.with(|c, _| tasks_of(c))
    }

    /// Starts the tasks `decide` chooses, the table locked against other
    /// writers (and other starts) until the transaction ends.
    pub(crate) fn start_tasks(
        &self,
        holder: &str,
        until: i64,
        decide: TaskDecision<'_>,
    ) -> Result<Vec<(String, i64)>, PgError> {
        let holder = holder.to_string();
        let now = now_rfc3339();
        self.decided(
            |c, _| {
                c.batch_execute("LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE")
                    .map_err(sql("locking the run queue to start tasks"))?;
                tasks_of(c)
            },
            |all| decide(all),
            move |c, _, _, chosen| {
                let mut started = Vec::new();
                for (id, progress) in chosen {
                    let row = c
                        .query_opt(
                            "UPDATE tasks SET state = 'starting', progress = $1, updated_at = $2,
                                    lease_holder = $3, lease_until = $4, lease_gen = lease_gen + 1
                             WHERE id = $5 AND state = 'queued' RETURNING lease_gen",
                            &[&progress, &now, &holder, &until, &id],
                        )
                        .map_err(sql("starting a task"))?;
                    if let Some(row) = row {
                        started.push((id, row.get(0)));
                    }
                }
                Ok(Finish::Commit(started))
            },
        )
    }

    /// Adds a task already `starting` under `holder`'s lease if `admit`
    /// allows, the table locked against other writers meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert_started_task(
        &self,
        id: &str,
        spec: &str,
        progress: &str,
        holder: &str,
        until: i64,
        admit: &mut dyn FnMut(&[StoredTask]) -> bool,
    ) -> Result<bool, PgError> {
        let (id, spec, progress, holder) = (
            id.to_string(),
            spec.to_string(),
            progress.to_string(),
            holder.to_string(),
        );
        let now = now_rfc3339();
        // A task of that id already there fails the insert (its key): a
        // conflict, as `insert_tasks` reports one.
        self.decided(
            |c, _| {
                c.batch_execute("LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE")
                    .map_err(sql("locking the run queue to start a task"))?;
                tasks_of(c)
            },
            |all| admit(all),
            move |c, _, _, admitted| {
                if !admitted {
                    return Ok(Finish::Rollback(false));
                }
                c.execute(
                    "INSERT INTO tasks(id, state, spec, progress, created_at, updated_at,
                                       lease_holder, lease_until, lease_gen)
                     VALUES ($1, 'starting', $2, $3, $4, $4, $5, $6, 1)",
                    &[&id, &spec, &progress, &now, &holder, &until],
                )
                .map_err(sql("adding a started task"))?;
                Ok(Finish::Commit(true))
            },
        )
    }

    /// Extends `holder`'s leases on `ids`: the ids it still holds.
    pub(crate) fn renew_tasks(
        &self,
        holder: &str,
        ids: &[String],
        until: i64,
    ) -> Result<Vec<String>, PgError> {
        self.with(|c, _| {
            let rows = c
                .query(
                    "UPDATE tasks SET lease_until = $1
                     WHERE id = ANY($2) AND lease_holder = $3 RETURNING id",
                    &[&until, &ids, &holder],
                )
                .map_err(sql("renewing tasks' leases"))?;
            let held: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            Ok(ids.iter().filter(|i| held.contains(i)).cloned().collect())
        })
    }

    /// Takes over the `starting` and `running` tasks whose lease lapsed (or
    /// that have none): one statement, whose condition a concurrent
    /// takeover's committed lease makes false again, so no task is taken
    /// twice.
    pub(crate) fn claim_lapsed_tasks(
        &self,
        holder: &str,
        now: i64,
        until: i64,
    ) -> Result<Vec<StoredTask>, PgError> {
        self.with(|c, _| {
            let rows = c
                .query(
                    "UPDATE tasks SET lease_holder = $1, lease_until = $2, lease_gen = lease_gen + 1
                     WHERE state IN ('starting', 'running')
                       AND (lease_until IS NULL OR lease_until < $3)
                     RETURNING seq, id, state, spec, progress, created_at, updated_at,
                               lease_holder, lease_until, lease_gen",
                    &[&holder, &until, &now],
                )
                .map_err(sql("taking tasks over"))?;
            let mut taken: Vec<StoredTask> = rows.iter().map(task_of).collect();
            taken.sort_by_key(|t| t.seq);
            Ok(taken)
        })
    }

    /// Compare-and-set of a task's state, in one statement; with a fence,
    /// only while the task is held under that claim.
    pub(crate) fn move_task(
        &self,
        id: &str,
        from: &[&str],
        to: &str,
        progress: &str,
        fence: Option<&nightshift_core::state_store::TaskFence>,
    ) -> Result<bool, PgError> {
        let from: Vec<String> = from.iter().map(|s| s.to_string()).collect();
        let now = now_rfc3339();
        let holder = fence.map(|f| f.holder.clone());
        let generation = fence.map(|f| f.generation);
        self.with(|c, _| {
            let n = c
                .execute(
                    "UPDATE tasks SET state = $1, progress = $2, updated_at = $3
                     WHERE id = $4 AND state = ANY($5)
                       AND ($6::TEXT IS NULL OR (lease_holder = $6 AND lease_gen = $7))",
                    &[&to, &progress, &now, &id, &from, &holder, &generation],
                )
                .map_err(sql("moving a task"))?;
            Ok(n == 1)
        })
    }

    // ----- accounts and sessions -----

    /// Adds an account or replaces its role and hash; ends its sessions.
    pub(crate) fn put_user(&self, name: &str, role: &str, phc: &str) -> Result<(), PgError> {
        let now = now_rfc3339();
        self.with(|c, _| {
            let mut tx = c
                .transaction()
                .map_err(sql("beginning an account's write"))?;
            tx.execute(
                "INSERT INTO users(name, role, phc, created_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT(name) DO UPDATE SET role = excluded.role, phc = excluded.phc",
                &[&name, &role, &phc, &now],
            )
            .map_err(sql("writing an account"))?;
            tx.execute(r#"DELETE FROM sessions WHERE "user" = $1"#, &[&name])
                .map_err(sql("ending an account's sessions"))?;
            tx.commit().map_err(sql("committing an account"))
        })
    }

    /// (name, role, PHC hash, created) of one account.
    #[allow(clippy::type_complexity)]
    pub(crate) fn user(
        &self,
        name: &str,
    ) -> Result<Option<(String, String, String, String)>, PgError> {
        self.with(|c, _| {
            Ok(c.query_opt(
                "SELECT name, role, phc, created_at FROM users WHERE name = $1",
                &[&name],
            )
            .map_err(sql("reading an account"))?
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))))
        })
    }

    /// (name, role, created) of every account, by name.
    pub(crate) fn users(&self) -> Result<Vec<(String, String, String)>, PgError> {
        self.with(|c, _| {
            Ok(c.query(
                "SELECT name, role, created_at FROM users ORDER BY name",
                &[],
            )
            .map_err(sql("reading the accounts"))?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
        })
    }

    pub(crate) fn remove_user(&self, name: &str) -> Result<bool, PgError> {
        self.with(|c, _| {
            let mut tx = c
                .transaction()
                .map_err(sql("beginning an account's removal"))?;
            tx.execute(r#"DELETE FROM sessions WHERE "user" = $1"#, &[&name])
                .map_err(sql("ending an account's sessions"))?;
            let n = tx
                .execute("DELETE FROM users WHERE name = $1", &[&name])
                .map_err(sql("removing an account"))?;
            tx.commit()
                .map_err(sql("committing an account's removal"))?;
            Ok(n > 0)
        })
    }

    pub(crate) fn put_session(
        &self,
        id_sha256: &str,
        user: &str,
        csrf: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), PgError> {
        self.with(|c, _| {
            let mut tx = c.transaction().map_err(sql("beginning a session"))?;
            tx.execute("DELETE FROM sessions WHERE expires_at <= $1", &[&now])
                .map_err(sql("ending expired sessions"))?;
            tx.execute(
                r#"INSERT INTO sessions(id_sha256, "user", csrf, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)"#,
                &[&id_sha256, &user, &csrf, &now, &expires_at],
            )
            .map_err(sql("writing a session"))?;
            tx.commit().map_err(sql("committing a session"))
        })
    }

    /// (user, role, csrf token, expires) of a live session.
    #[allow(clippy::type_complexity)]
    pub(crate) fn session(
        &self,
        id_sha256: &str,
        now: i64,
    ) -> Result<Option<(String, String, String, i64)>, PgError> {
        self.with(|c, _| {
            Ok(c.query_opt(
                r#"SELECT s."user", u.role, s.csrf, s.expires_at FROM sessions s JOIN users u ON u.name = s."user"
                   WHERE s.id_sha256 = $1 AND s.expires_at > $2"#,
                &[&id_sha256, &now],
            )
            .map_err(sql("reading a session"))?
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))))
        })
    }

    pub(crate) fn delete_session(&self, id_sha256: &str) -> Result<(), PgError> {
        self.with(|c, _| {
            c.execute("DELETE FROM sessions WHERE id_sha256 = $1", &[&id_sha256])
                .map_err(sql("ending a session"))?;
            Ok(())
        })
    }

    // ----- policy rows and scopes -----

    /// Appends a policy row with its (checkpointed) audit entry, together.
    pub(crate) fn append_policy_row(
        &self,
        row: &serde_json::Value,
        kind: &str,
        body: serde_json::Value,
    ) -> Result<Entry, PgError> {
        let now = now_rfc3339();
        let row = row.to_string();
        self.with(|c, cx| {
            let mut tx = c.transaction().map_err(sql("beginning a policy row"))?;
            let head = lock_head(&mut tx, cx)?;
            tx.execute(
                "INSERT INTO policy_rows(at, row) VALUES ($1, $2)",
                &[&now, &row],
            )
            .map_err(sql("appending a policy row"))?;
            let entry = seal_after(&mut tx, cx, head, None, kind, body, true)?;
            tx.commit().map_err(sql("committing a policy row"))?;
            Ok(entry)
        })
    }

    pub(crate) fn policy_rows(&self) -> Result<Vec<serde_json::Value>, PgError> {
        self.with(|c, _| {
            c.query("SELECT seq, row FROM policy_rows ORDER BY seq", &[])
                .map_err(sql("reading the policy rows"))?
                .iter()
                .map(|r| {
                    serde_json::from_str(r.get::<_, &str>(1))
                        .map_err(|e| bad(format!("policy row {}", r.get::<_, i64>(0)), e))
                })
                .collect()
        })
    }

    pub(crate) fn put_scope_proposal(
        &self,
        id: &str,
        proposal: &serde_json::Value,
    ) -> Result<(), PgError> {
        let now = now_rfc3339();
        let proposal = proposal.to_string();
        self.with(|c, _| {
            c.execute(
                "INSERT INTO scope_proposals(id, created_at, proposal) VALUES ($1, $2, $3)
                 ON CONFLICT(id) DO UPDATE SET proposal = excluded.proposal",
                &[&id, &now, &proposal],
            )
            .map_err(sql("keeping a scope proposal"))?;
            Ok(())
        })
    }

    pub(crate) fn scope_proposal(&self, id: &str) -> Result<Option<serde_json::Value>, PgError> {
        self.with(|c, _| {
            c.query_opt("SELECT proposal FROM scope_proposals WHERE id = $1", &[&id])
                .map_err(sql("reading a scope proposal"))?
                .map(|r| {
                    serde_json::from_str(r.get::<_, &str>(0))
                        .map_err(|e| bad(format!("scope proposal {id}"), e))
                })
                .transpose()
        })
    }

    /// Records the owner's refusal of a proposal with its audit entry.
    pub(crate) fn refuse_scope(
        &self,
        id: &str,
        why: &str,
        kind: &str,
        body: serde_json::Value,
    ) -> Result<(), PgError> {
        let now = now_rfc3339();
        self.with(|c, cx| {
            let mut tx = c.transaction().map_err(sql("beginning a scope refusal"))?;
            let head = lock_head(&mut tx, cx)?;
            tx.execute(
                "INSERT INTO scope_refusals(id, at, why) VALUES ($1, $2, $3)
                 ON CONFLICT(id) DO UPDATE SET why = excluded.why",
                &[&id, &now, &why],
            )
            .map_err(sql("recording a scope refusal"))?;
            seal_after(&mut tx, cx, head, None, kind, body, false)?;
            tx.commit().map_err(sql("committing a scope refusal"))
        })
    }

    pub(crate) fn refused_scopes(&self) -> Result<std::collections::BTreeSet<String>, PgError> {
        self.with(|c, _| {
            Ok(c.query("SELECT id FROM scope_refusals", &[])
                .map_err(sql("reading the scope refusals"))?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
    }
}

/// Closing the client blocks on its runtime too, so a store dropped on a
/// runtime's thread is closed on a thread of its own.
impl Drop for PgStore {
    fn drop(&mut self) {
        let held = self
            .client
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some((client, cx)) = held else { return };
        if let Some(pool) = &self.pool {
            let mut idle = pool.0.lock().unwrap_or_else(|p| p.into_inner());
            if !client.is_closed() && idle.len() < POOL_IDLE {
                idle.push((client, cx));
                return;
            }
        }
        drop(cx);
        close(client);
    }
}

/// Closes a connection, off a runtime's thread (its own `block_on` would
/// panic there).
fn close(client: Client) {
    if on_runtime_thread() {
        std::thread::scope(|s| {
            s.spawn(move || drop(client));
        });
    } else {
        drop(client);
    }
}

// ----- the pieces every transaction shares -----

/// Applies the migrations the database lacks, in one transaction under an
/// advisory lock (so racing first connections agree).
/// The schema's versions before and after [`PgStore::connect`] migrated it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    pub from: i32,
    pub to: i32,
}

fn migrate(c: &mut Client) -> Result<Migrated, PgError> {
    let mut tx = c.transaction().map_err(sql("beginning the migrations"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(sql("locking the migrations"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    )
    .map_err(sql("creating the migrations table"))?;
    let at: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .map_err(sql("reading the schema version"))?
        .get(0);
    let known = schema::MIGRATIONS.last().map_or(0, |m| m.0);
    if at > known {
        return Err(PgError::TooNew { found: at, known });
    }
    for (version, text) in schema::MIGRATIONS.iter().filter(|m| m.0 > at) {
        tx.batch_execute(text)
            .map_err(sql("migrating the schema"))?;
        tx.execute(
            "INSERT INTO schema_migrations(version, applied_at) VALUES ($1, $2)",
            &[version, &now_rfc3339()],
        )
        .map_err(sql("recording a migration"))?;
    }
    tx.commit().map_err(sql("committing the migrations"))?;
    Ok(Migrated {
        from: at,
        to: known,
    })
}

fn log_id(c: &mut Client) -> Result<LogId, PgError> {
    let fresh = ulid::Ulid::new().to_string().to_lowercase();
    // ON CONFLICT DO NOTHING: racing first connections agree on one id.
    c.execute(
        "INSERT INTO meta(key, value) VALUES ('log_id', $1) ON CONFLICT DO NOTHING",
        &[&fresh],
    )
    .map_err(sql("writing the audit log id"))?;
    let id: String = c
        .query_one("SELECT value FROM meta WHERE key = 'log_id'", &[])
        .map_err(sql("reading the audit log id"))?
        .get(0);
    Ok(LogId(id))
}

fn upsert_run(
    c: &mut impl postgres::GenericClient,
    id: &str,
    created_at: &str,
    record: &str,
) -> Result<(), PgError> {
    c.execute(
        "INSERT INTO runs(id, created_at, record) VALUES ($1, $2, $3)
         ON CONFLICT(id) DO UPDATE SET record = excluded.record",
        &[&id, &created_at, &record],
    )
    .map_err(sql("saving a run"))?;
    Ok(())
}

/// The head as it stands, locked until the transaction ends: the one lock
/// every appending transaction takes first.
fn lock_head(tx: &mut impl postgres::GenericClient, cx: &Ctx) -> Result<(i64, String), PgError> {
    let row = tx
        .query_one(&cx.hot.lock_head, &[])
        .map_err(sql("locking the audit head"))?;
    Ok((row.get(0), row.get(1)))
}

fn append_in(
    tx: &mut Transaction<'_>,
    cx: &Ctx,
    run: Option<&str>,
    kind: &str,
    body: serde_json::Value,
    checkpoint: bool,
) -> Result<Entry, PgError> {
    let head = lock_head(tx, cx)?;
    seal_after(tx, cx, head, run, kind, body, checkpoint)
}

/// The one write path of audit entries: seals the entry after `head` (the
/// locked head), inserts it, moves the head to it and, when asked, records
/// its checkpoint, all in the caller's transaction.
fn seal_after(
    tx: &mut impl postgres::GenericClient,
    cx: &Ctx,
    (seq, hash): (i64, String),
    run: Option<&str>,
    kind: &str,
    body: serde_json::Value,
    checkpoint: bool,
) -> Result<Entry, PgError> {
    let body = match body {
        serde_json::Value::Object(map) => map,
        other => serde_json::Map::from_iter([("value".to_string(), other)]),
    };
    // `seal` reads only the previous entry's seq and hash.
    let prev = (seq > 0).then(|| Entry {
        seq: seq as u64,
        time: String::new(),
        kind: String::new(),
        run: None,
        body: serde_json::Map::new(),
        prev: String::new(),
        hash,
    });
    let entry = orchestrator_audit::seal(&cx.log, prev.as_ref(), &now_rfc3339(), kind, run, body)
        .map_err(|e| bad(format!("audit entry {}", seq + 1), e))?;
    let body_text = serde_json::to_string(&entry.body).unwrap_or_default();
    let new_seq = entry.seq as i64;
    tx.execute(
        &cx.hot.insert_entry,
        &[
            &new_seq,
            &entry.time,
            &entry.kind,
            &entry.run,
            &body_text,
            &entry.prev,
            &entry.hash,
        ],
    )
    .map_err(sql("appending an audit entry"))?;
    tx.execute(&cx.hot.move_head, &[&new_seq, &entry.hash, &entry.time])
        .map_err(sql("moving the audit head"))?;
    if checkpoint {
        tx.execute(
            &cx.hot.insert_checkpoint,
            &[&new_seq, &entry.hash, &entry.time],
        )
        .map_err(sql("recording a checkpoint"))?;
    }
    Ok(entry)
}

fn head_in(c: &mut impl postgres::GenericClient) -> Result<Option<Checkpoint>, PgError> {
    let row = c
        .query_opt("SELECT seq, hash, time FROM audit_head", &[])
        .map_err(sql("reading the audit head"))?;
    Ok(row.and_then(|r| {
        let seq: i64 = r.get(0);
        (seq > 0).then(|| Checkpoint {
            seq: seq as u64,
            hash: r.get(1),
            time: r.get(2),
        })
    }))
}

fn checkpoints_in(c: &mut impl postgres::GenericClient) -> Result<Vec<Checkpoint>, PgError> {
    Ok(c.query(
        "SELECT seq, hash, time FROM audit_checkpoints ORDER BY seq",
        &[],
    )
    .map_err(sql("reading the checkpoints"))?
    .iter()
    .map(|r| Checkpoint {
        seq: r.get::<_, i64>(0).max(0) as u64,
        hash: r.get(1),
        time: r.get(2),
    })
    .collect())
}

fn entries_where(
    c: &mut impl postgres::GenericClient,
    filter: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<Vec<Entry>, PgError> {
    let rows = c
        .query(
            &format!("SELECT seq, time, kind, run, body, prev, hash FROM audit WHERE {filter} ORDER BY seq"),
            params,
        )
        .map_err(sql("reading the audit log"))?;
    rows.iter().map(entry_of).collect()
}

/// How many audit rows [`PgStore::visit_audit`] fetches at a time.
const VISIT_BATCH: i32 = 2_000;

/// One audit row (`seq, time, kind, run, body, prev, hash`) as an entry.
fn entry_of(r: &postgres::Row) -> Result<Entry, PgError> {
    let seq: i64 = r.get(0);
    let body: &str = r.get(4);
    Ok(Entry {
        seq: u64::try_from(seq).map_err(|_| bad(format!("audit entry {seq}"), "negative seq"))?,
        time: r.get(1),
        kind: r.get(2),
        run: r.get(3),
        body: serde_json::from_str(body).map_err(|e| {
            bad(
                format!("audit entry {seq}"),
                format!("body is not JSON: {e}"),
            )
        })?,
        prev: r.get(5),
        hash: r.get(6),
    })
}

/// Whether act `id` is in state `from` (compared as JSON values), its row
/// locked for the rest of the caller's transaction.
fn act_in_state(
    tx: &mut Transaction<'_>,
    cx: &Ctx,
    id: &str,
    from: &serde_json::Value,
) -> Result<bool, PgError> {
    let current: Option<String> = tx
        .query_opt(&cx.hot.act_state, &[&id])
        .map_err(sql("reading an act's state"))?
        .map(|r| r.get(0));
    Ok(current
        .as_deref()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .is_some_and(|v| &v == from))
}

fn act_row(r: &postgres::Row) -> Result<ActRow, PgError> {
    let parse = |t: &str| serde_json::from_str(t).map_err(|e| bad("an act row", e));
    Ok((parse(r.get(0))?, parse(r.get(1))?, r.get(2)))
}

fn count_of_run(c: &mut impl postgres::GenericClient, run: &str) -> Result<u64, PgError> {
    let n: i64 = c
        .query_one(
            "SELECT (SELECT count(*) FROM acts WHERE run = $1) + (SELECT count(*) FROM dry_acts WHERE run = $1)",
            &[&run],
        )
        .map_err(sql("counting a run's acts"))?
        .get(0);
    Ok(n as u64)
}

fn count_since(
    c: &mut impl postgres::GenericClient,
    since: &str,
    repo: Option<&str>,
) -> Result<u64, PgError> {
    let n: i64 = c
        .query_one(
            "SELECT (SELECT count(*) FROM acts WHERE created_at >= $1 AND ($2::text IS NULL OR run IN
                 (SELECT id FROM runs WHERE (record::jsonb ->> 'repo') = $2)))
              + (SELECT count(*) FROM dry_acts WHERE created_at >= $1 AND ($2::text IS NULL OR run IN
                 (SELECT id FROM runs WHERE (record::jsonb ->> 'repo') = $2)))",
            &[&since, &repo],
        )
        .map_err(sql("counting the night's acts"))?
        .get(0);
    Ok(n as u64)
}

/// Every task, in the queue's order.
fn tasks_of(c: &mut Client) -> Result<Vec<StoredTask>, PgError> {
    Ok(c.query(
        "SELECT seq, id, state, spec, progress, created_at, updated_at, lease_holder, lease_until,
                lease_gen
         FROM tasks ORDER BY seq",
        &[],
    )
    .map_err(sql("listing tasks"))?
    .iter()
    .map(task_of)
    .collect())
}

fn task_of(r: &postgres::Row) -> StoredTask {
    let holder: Option<String> = r.get(7);
    let until: Option<i64> = r.get(8);
    StoredTask {
        seq: r.get(0),
        id: r.get(1),
        state: r.get(2),
        spec: r.get(3),
        progress: r.get(4),
        created_at: r.get(5),
        updated_at: r.get(6),
        lease: holder.zip(until),
        generation: r.get(9),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_password_never_reaches_a_message() {
        assert_eq!(
            redact("postgres://ns:s3cret@db.example:5432/state?sslmode=require"),
            "postgres://ns@db.example:5432/state?sslmode=require"
        );
        assert_eq!(
            redact("postgres:///state?host=/run/pg&user=ns"),
            "postgres:///state?host=/run/pg&user=ns"
        );
        assert_eq!(redact("postgres://ns@h/db"), "postgres://ns@h/db");
        assert_eq!(
            redact("postgres:///db?user=ns&password=s3cret&host=/s"),
            "postgres:///db?user=ns&host=/s"
        );
    }
}
