//! The PostgreSQL store as the binary holds it: connections made (and
//! migrated) on demand, an existing store found without making one and
//! within a bound, the token ledger, and a location without its password.

use std::time::{Duration, Instant};

use nightshift_core::audit_log::Event;
use nightshift_core::state_store::{StoreBackend, StoreErrorKind};
use nightshift_core::tokens::Ask;
use nightshift_store_postgres::{testing, PgBackend};

fn note() -> Event {
    Event::RunEnded {
        status: "note".into(),
        reason: None,
    }
}

#[test]
fn an_existing_store_is_found_and_never_made() {
    let url = testing::fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let backend = PgBackend::new(&url, dir.path().to_path_buf());
    assert!(backend
        .connect_existing(Duration::from_millis(500))
        .unwrap()
        .is_none());
    // Still none: looking made nothing.
    assert!(backend
        .connect_existing(Duration::from_millis(500))
        .unwrap()
        .is_none());
    let mut made = backend.connect().unwrap();
    made.append(None, &note(), false).unwrap();
    let found = backend
        .connect_existing(Duration::from_millis(500))
        .unwrap()
        .expect("the store made was not found");
    assert_eq!(found.log_id(), made.log_id());
    assert_eq!(found.entries().unwrap().len(), 1);
    assert_eq!(found.root(), dir.path());
}

#[test]
fn a_connection_to_an_existing_store_waits_for_a_lock_at_most_its_bound() {
    let url = testing::fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let backend = PgBackend::new(&url, dir.path().to_path_buf());
    drop(backend.connect().unwrap());
    let mut holder = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("SELECT seq FROM audit_head FOR UPDATE")
        .unwrap();
    let mut hook = backend
        .connect_existing(Duration::from_millis(200))
        .unwrap()
        .unwrap();
    // On a thread of its own, so that a wait past the bound fails the test
    // instead of hanging it.
    let (tx_done, done) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let t = Instant::now();
        let e = hook.append(None, &note(), false).unwrap_err();
        tx_done
            .send((e.kind(), e.to_string(), t.elapsed()))
            .unwrap();
        hook
    });
    let answer = done.recv_timeout(Duration::from_secs(5));
    tx.rollback().unwrap();
    let (kind, message, waited) = answer.expect("the append waited past its bound");
    assert_eq!(kind, StoreErrorKind::Busy, "{message}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    let mut hook = waiter.join().unwrap();
    hook.append(None, &note(), false).unwrap();
}

#[test]
fn the_ledger_reserves_and_settles_through_the_port() {
    let url = testing::fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let backend = PgBackend::new(&url, dir.path().to_path_buf());
    let mut ledger = backend.ledger().unwrap();
    let ask = Ask {
        input_bound: 10,
        requested_output: Some(90),
        choices: 1,
    };
    let grant = ledger.reserve("r", "n", 1000, 105, ask).unwrap().unwrap();
    assert_eq!(grant.tokens, 100);
    assert!(ledger.reserve("r", "n", 1000, 105, ask).unwrap().is_err());
    let (run, fleet) = ledger.settle("r", "n", 100, Some(40)).unwrap();
    assert_eq!((run.used, fleet.reserved), (40, 0));
    assert_eq!(ledger.run_tokens("r").unwrap().used, 40);
}

#[test]
fn the_location_never_shows_the_password() {
    let backend = PgBackend::new(
        "postgres://ns:hunter2@db.example/state",
        std::env::temp_dir(),
    );
    assert_eq!(backend.location(), "postgres://ns@db.example/state");
    assert!(!format!("{backend:?}").contains("hunter2"));
}

/// Connections are kept between callers: a hundred connects one after
/// another use one server connection (no connection, migration check or
/// statement preparation each), twenty held at once leave at most eight
/// idle afterwards, and every caller sees what the others wrote.
#[test]
fn connections_are_reused_between_callers_and_bounded_when_idle() {
    let url = testing::fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let backend = PgBackend::new(&url, dir.path().to_path_buf());
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let connections = |admin: &mut postgres::Client| -> i64 {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get(0)
    };
    for _ in 0..100 {
        let mut s = backend.connect().unwrap();
        s.append(None, &note(), false).unwrap();
    }
    assert_eq!(connections(&mut admin), 1, "each caller made a connection");
    let held: Vec<_> = (0..20).map(|_| backend.connect().unwrap()).collect();
    assert_eq!(connections(&mut admin), 20);
    for s in &held {
        assert_eq!(s.entries().unwrap().len(), 100);
    }
    drop(held);
    assert!(connections(&mut admin) <= 8, "more than eight kept idle");
}

/// A backend holding idle connections may go on a runtime's thread (the
/// binary's end, inside its runtime): they are closed off it, not with a
/// panic.
#[test]
fn idle_connections_close_when_the_backend_goes_on_a_runtime_thread() {
    let url = testing::fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = PgBackend::new(&url, dir.path().to_path_buf());
        let mut s = backend.connect().unwrap();
        s.append(None, &note(), false).unwrap();
        drop(s);
        drop(backend);
    });
}
