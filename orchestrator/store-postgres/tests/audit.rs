//! The PostgreSQL store's own audit guarantees: one chain across
//! connections, the head and checkpoints kept in append-only tables, and a
//! tampered log found by `verify`.

use nightshift_core::audit_log::Event;
use nightshift_core::state_store::AuditLog;
use nightshift_store_postgres::{testing, PgStore};
use orchestrator_audit::verify_with_head;

fn note(i: usize) -> Event {
    Event::RunEnded {
        status: format!("note {i}"),
        reason: None,
    }
}

fn store(url: &str) -> PgStore {
    let dir = std::env::temp_dir();
    PgStore::connect(url, &dir).unwrap()
}

fn verify(s: &PgStore) -> Result<orchestrator_audit::Verified, orchestrator_audit::VerifyError> {
    let read = s.audit_snapshot().unwrap();
    verify_with_head(
        s.log(),
        &read.entries,
        &read.checkpoints,
        read.head.as_ref(),
    )
}

#[test]
fn appends_from_many_connections_make_one_chain() {
    let url = testing::fresh_database();
    let first = store(&url);
    let log = first.log().clone();
    drop(first);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut s = store(&url);
                for i in 0..25 {
                    s.append(None, &note(t * 100 + i), i % 10 == 0).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = store(&url);
    assert_eq!(s.log(), &log, "a second connection made a second log id");
    let v = verify(&s).unwrap();
    assert_eq!(v.entries, 100);
    assert_eq!(v.checkpoints, 12);
    assert_eq!(s.read_head().unwrap().unwrap().seq, 100);
    assert_eq!(
        s.schema_version().unwrap(),
        nightshift_store_postgres::schema::SCHEMA_VERSION
    );
}

#[test]
fn the_log_refuses_deletion_and_rewriting_and_the_head_moves_only_forward() {
    let url = testing::fresh_database();
    let mut s = store(&url);
    for i in 0..3 {
        s.append(Some("r"), &note(0), i == 1).unwrap();
    }
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    for statement in [
        "DELETE FROM audit WHERE seq = 3",
        "UPDATE audit SET kind = 'other' WHERE seq = 2",
        "TRUNCATE audit",
        "DELETE FROM audit_checkpoints",
        "TRUNCATE audit_checkpoints",
        "DELETE FROM audit_head",
        "UPDATE audit_head SET seq = 2, hash = (SELECT hash FROM audit WHERE seq = 2), time = (SELECT time FROM audit WHERE seq = 2)",
        "UPDATE audit_head SET seq = 4",
    ] {
        let e = admin.batch_execute(statement).expect_err(statement);
        assert!(
            e.to_string().contains("refused") || e.as_db_error().is_some(),
            "{statement}: {e}"
        );
    }
    verify(&s).unwrap();
}

/// What a superuser who switches the triggers off can do, and what
/// `verify` then sees.
#[test]
fn a_suffix_deleted_behind_the_triggers_is_found() {
    let url = testing::fresh_database();
    let mut s = store(&url);
    for i in 0..5 {
        s.append(None, &note(i), false).unwrap();
    }
    verify(&s).unwrap();
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .batch_execute("SET session_replication_role = replica; DELETE FROM audit WHERE seq >= 4")
        .unwrap();
    let e = verify(&s).unwrap_err();
    assert!(e.to_string().contains('5') || e.seq().is_some(), "{e}");
    // The next append chains after the head, not after the last row left,
    // so the gap stays in sight.
    s.append(None, &note(0), false).unwrap();
    let e = verify(&s).unwrap_err();
    assert_eq!(e.seq(), Some(4), "{e}");
}

#[test]
fn a_truncated_log_is_found() {
    let url = testing::fresh_database();
    let mut s = store(&url);
    for i in 0..3 {
        s.append(None, &note(0), i == 0).unwrap();
    }
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .batch_execute("SET session_replication_role = replica; DELETE FROM audit")
        .unwrap();
    assert!(verify(&s).is_err());
}

#[test]
fn a_row_deleted_in_the_middle_is_found() {
    let url = testing::fresh_database();
    let mut s = store(&url);
    for i in 0..4 {
        s.append(None, &note(i), false).unwrap();
    }
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .batch_execute("SET session_replication_role = replica; DELETE FROM audit WHERE seq = 2")
        .unwrap();
    assert_eq!(verify(&s).unwrap_err().seq(), Some(2));
}

#[test]
fn opening_says_what_it_migrated() {
    let url = testing::fresh_database();
    let first = store(&url);
    assert_eq!(
        first.migrated(),
        nightshift_store_postgres::Migrated {
            from: 0,
            to: nightshift_store_postgres::schema::SCHEMA_VERSION
        }
    );
    assert_eq!(
        store(&url).migrated(),
        nightshift_store_postgres::Migrated {
            from: nightshift_store_postgres::schema::SCHEMA_VERSION,
            to: nightshift_store_postgres::schema::SCHEMA_VERSION
        }
    );
}

#[test]
fn migrations_are_applied_once_by_racing_connections() {
    let url = testing::fresh_database();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || store(&url).log().clone())
        })
        .collect();
    let ids: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let n: i64 = admin
        .query_one("SELECT count(*) FROM schema_migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        n,
        nightshift_store_postgres::schema::MIGRATIONS.len() as i64,
        "a migration was applied twice"
    );
}

#[test]
fn a_schema_newer_than_this_build_is_refused() {
    let url = testing::fresh_database();
    drop(store(&url));
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin
        .batch_execute("INSERT INTO schema_migrations(version, applied_at) VALUES (99, 'later')")
        .unwrap();
    let e = PgStore::connect(&url, &std::env::temp_dir()).unwrap_err();
    assert!(
        matches!(
            e,
            nightshift_store_postgres::PgError::TooNew {
                found: 99,
                known: nightshift_store_postgres::schema::SCHEMA_VERSION
            }
        ),
        "{e}"
    );
}

/// The dashboard's chain check learns that the log was rewritten or moved
/// from the fingerprint: it changes when the audit table is rewritten and
/// differs between databases; appends only grow it.
#[test]
fn the_fingerprint_changes_when_the_log_is_rewritten() {
    let url = testing::fresh_database();
    let mut s = store(&url);
    let first = AuditLog::fingerprint(&s).expect("a fingerprint");
    for i in 0..50 {
        s.append(None, &note(i), false).unwrap();
    }
    let grown = AuditLog::fingerprint(&s).unwrap();
    assert_eq!((grown.dev, grown.ino), (first.dev, first.ino));
    assert!(grown.len >= first.len);
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin.batch_execute("VACUUM FULL audit").unwrap();
    let rewritten = AuditLog::fingerprint(&s).unwrap();
    assert_ne!(
        rewritten.ino, grown.ino,
        "a rewritten table kept its file node"
    );
    let other = store(&testing::fresh_database());
    assert_ne!(AuditLog::fingerprint(&other).unwrap().dev, grown.dev);
}
