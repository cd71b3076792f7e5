//! The schema, as numbered migrations. Migration 1 is the SQLite store's
//! schema of this release (`store.rs`'s `SCHEMA`, the settle claim's later
//! columns and the gateway's token ledger) in PostgreSQL's types, plus what
//! keeps the audit chain's head inside the database:
//!
//! - `audit_head`, one row: the last entry's seq, hash and time, updated in
//!   the transaction that appends the entry. Appenders lock it (`SELECT …
//!   FOR UPDATE`), which serialises every append, and seal the next entry
//!   after the entry it names, so a suffix deleted from `audit` cannot be
//!   papered over by the next append: the new entry leaves a gap that
//!   `audit verify` reports.
//! - `audit_checkpoints`, the checkpoints, written in the entry's own
//!   transaction (so, unlike the SQLite store's file, a crash between the
//!   commit and the checkpoint is not possible: they commit together).
//! - Triggers refuse `UPDATE`, `DELETE` and `TRUNCATE` of `audit` and
//!   `audit_checkpoints`, the deletion of the head row, and any update of it
//!   but the one step forward to an entry that exists and links to the
//!   head it replaces. A database owner or superuser can still drop or
//!   disable the triggers (`session_replication_role = replica` skips
//!   them); what they then delete or rewrite is reported by `audit verify`
//!   as far as the head and checkpoints were left alone, and rewriting all
//!   three consistently is out of any in-database check's reach, as
//!   rewriting `state.db` with its two files is for SQLite.

/// (version, SQL), applied in order, each in the transaction that records it.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (1, MIGRATION_1),
    (2, MIGRATION_2),
    (3, MIGRATION_3),
    (4, MIGRATION_4),
];

/// The schema version this build makes and reads.
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The generation of each task's claim, its fencing token
/// (`TaskQueue::move_task`): every start and takeover adds one.
const MIGRATION_4: &str = "
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS lease_gen BIGINT NOT NULL DEFAULT 0;
";

/// The dispatchers' leases on tasks (`TaskQueue::start_tasks`): who
/// dispatches a task and until when (unix seconds).
const MIGRATION_3: &str = "
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS lease_holder TEXT;
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS lease_until BIGINT;
";

/// The executors' leases on acts (`ActQueue::claim_act`): who holds an act
/// and until when (unix seconds).
const MIGRATION_2: &str = "
ALTER TABLE acts ADD COLUMN IF NOT EXISTS lease_holder TEXT;
ALTER TABLE acts ADD COLUMN IF NOT EXISTS lease_until BIGINT;
";

const MIGRATION_1: &str = r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX runs_created ON runs(created_at, id);
CREATE TABLE audit (
    seq BIGINT PRIMARY KEY,
    time TEXT NOT NULL,
    kind TEXT NOT NULL,
    run TEXT,
    body TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX audit_run ON audit(run);
CREATE INDEX audit_kind_time ON audit(kind, time);
CREATE TABLE audit_head (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL,
    time TEXT NOT NULL
);
INSERT INTO audit_head(one, seq, hash, time) VALUES (TRUE, 0, '', '');
CREATE TABLE audit_checkpoints (
    seq BIGINT PRIMARY KEY,
    hash TEXT NOT NULL,
    time TEXT NOT NULL
);
CREATE TABLE kill_requests (
    run TEXT PRIMARY KEY,
    by TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE settled (
    run TEXT PRIMARY KEY,
    by TEXT NOT NULL,
    claimer TEXT,
    imported_at TEXT
);
CREATE TABLE acts (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    act TEXT NOT NULL,
    state TEXT NOT NULL,
    content BYTEA,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    -- The queue state's name, for the dashboard's pages by state.
    queue_state TEXT GENERATED ALWAYS AS ((state::jsonb) ->> 'state') STORED
);
CREATE INDEX acts_run ON acts(run);
CREATE INDEX acts_created ON acts(created_at, id);
CREATE INDEX acts_queue_state ON acts(queue_state, created_at, id);
CREATE TABLE tasks (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    spec TEXT NOT NULL,
    progress TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE users (
    name TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    phc TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE sessions (
    id_sha256 TEXT PRIMARY KEY,
    "user" TEXT NOT NULL,
    csrf TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE TABLE policy_rows (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at TEXT NOT NULL,
    row TEXT NOT NULL
);
CREATE TABLE dry_acts (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX dry_acts_run ON dry_acts(run);
CREATE TABLE scope_proposals (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    proposal TEXT NOT NULL
);
CREATE TABLE scope_refusals (
    id TEXT PRIMARY KEY,
    at TEXT NOT NULL,
    why TEXT NOT NULL
);
CREATE TABLE model_tokens (
    run TEXT NOT NULL,
    night TEXT NOT NULL,
    used BIGINT NOT NULL DEFAULT 0,
    reserved BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (run, night)
);
CREATE INDEX model_tokens_night ON model_tokens(night);

CREATE FUNCTION nightshift_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % of % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION nightshift_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION nightshift_append_only();
CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION nightshift_append_only();
CREATE TRIGGER audit_checkpoints_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION nightshift_append_only();
CREATE TRIGGER audit_head_kept BEFORE DELETE ON audit_head
    FOR EACH ROW EXECUTE FUNCTION nightshift_append_only();
CREATE TRIGGER audit_head_no_truncate BEFORE TRUNCATE ON audit_head
    FOR EACH STATEMENT EXECUTE FUNCTION nightshift_append_only();

-- The head moves one entry forward at a time, to an entry that exists and
-- links to the head it replaces.
CREATE FUNCTION nightshift_head_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.seq <> OLD.seq + 1 OR NOT EXISTS (
        SELECT 1 FROM audit a
        WHERE a.seq = NEW.seq AND a.hash = NEW.hash AND a.time = NEW.time
          AND (OLD.seq = 0 OR a.prev = OLD.hash)
    ) THEN
        RAISE EXCEPTION 'the audit head moves only to the next entry: % to % refused', OLD.seq, NEW.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER audit_head_forward BEFORE UPDATE ON audit_head
    FOR EACH ROW EXECUTE FUNCTION nightshift_head_forward();
"#;
