//! `audit verify`'s walk over a SQLite store, entries handed over as
//! stored and their bodies hashed from their text: a tampered entry in
//! the middle is named by the streaming walk, every entry taken the text
//! way; by the incremental check (`verify_after`) when it lies after the
//! entry it starts from, and not when it lies before (which only a whole
//! walk finds, by design); and the dashboard's whole walk
//! (`verify_log_since`) names it too, and names an entry verified earlier
//! that is no longer there.

use nightshift_core::audit_log::Event;
use nightshift_core::state_store::{
    verify_log, verify_log_since, AuditLog, AuditVisitor, StatePaths,
};
use nightshift_store_sqlite::store::Store;
use orchestrator_audit::{BadEntry, Checkpoint, Entry, RawEntry, StreamVerifier, VerifyError};

fn started(i: u64) -> Event {
    Event::Exited {
        exit_code: Some(0),
        oom_killed: false,
        ended_by: format!("exit {i}"),
        duration_ms: i as i64,
        peak_memory_bytes: Some(1 << 20),
        cpu_ns: None,
        output_bytes: i,
        output_kept_bytes: i,
    }
}

/// The store's walk through a verifier that counts how each entry came:
/// (verdict, taken from text, taken parsed).
fn walk_counting(store: &Store) -> (Result<(), VerifyError>, u64, u64) {
    struct Counting {
        log: orchestrator_audit::LogId,
        v: Option<StreamVerifier>,
        err: Option<VerifyError>,
        text: u64,
        parsed: u64,
    }
    impl AuditVisitor for Counting {
        fn begin(&mut self, head: Option<Checkpoint>, cps: Vec<Checkpoint>) -> bool {
            self.v = StreamVerifier::new(&self.log, cps, head).ok();
            true
        }
        fn entry(&mut self, entry: Entry) -> bool {
            self.parsed += 1;
            match self.v.as_mut().map(|v| v.push(&entry)) {
                Some(Ok(())) => true,
                Some(Err(e)) => {
                    self.err = Some(e);
                    false
                }
                None => false,
            }
        }
        fn raw_entry(&mut self, entry: &RawEntry<'_>) -> Option<bool> {
            let judged = self.v.as_mut()?.push_raw(entry)?;
            self.text += 1;
            match judged {
                Ok(()) => Some(true),
                Err(e) => {
                    self.err = Some(e);
                    Some(false)
                }
            }
        }
    }
    let mut c = Counting {
        log: store.log_id().clone(),
        v: None,
        err: None,
        text: 0,
        parsed: 0,
    };
    store.visit_audit(0, &mut c).expect("the store");
    let verdict = match (c.err, c.v) {
        (Some(e), _) => Err(e),
        (None, Some(v)) => v.finish().map(|_| ()),
        (None, None) => panic!("not begun"),
    };
    (verdict, c.text, c.parsed)
}

#[test]
fn a_tampered_entry_in_the_middle_is_named_by_the_streaming_and_the_incremental_walks() {
    let dir = tempfile::tempdir().unwrap();
    let paths = StatePaths::new(dir.path().join("state"));
    let mut store = Store::open(paths.clone()).expect("a store");
    for i in 1..=30u64 {
        store
            .append(Some("run-1"), &started(i), i % 10 == 0)
            .expect("append");
    }
    let (ok, text, parsed) = walk_counting(&store);
    assert_eq!(ok, Ok(()));
    assert_eq!((text, parsed), (30, 0), "every entry hashed from its text");
    let all = store.entries().unwrap();
    let at = |seq: u64| orchestrator_audit::checkpoint(&all[seq as usize - 1]);
    let (v, last) = verify_log_since(&store, Some(&at(12))).unwrap().unwrap();
    assert_eq!((v.entries, last), (30, at(30)));

    // One byte of entry 15's body, as someone with the database would.
    let db = rusqlite::Connection::open(paths.db()).unwrap();
    let body: String = db
        .query_row("SELECT body FROM audit WHERE seq = 15", [], |r| r.get(0))
        .unwrap();
    let tampered = body.replacen("\"output_bytes\":15", "\"output_bytes\":16", 1);
    assert_ne!(tampered, body);
    db.execute("UPDATE audit SET body = ?1 WHERE seq = 15", [&tampered])
        .unwrap();
    drop(db);

    let altered = Err(VerifyError::Entry {
        seq: 15,
        reason: BadEntry::Altered,
    });
    let (bad, text, _) = walk_counting(&store);
    assert_eq!(bad, altered);
    assert_eq!(text, 15, "judged from its text, and the walk stopped there");
    assert_eq!(verify_log(&store).unwrap().map(|_| ()), altered);
    assert_eq!(
        verify_log_since(&store, Some(&at(12))).unwrap().map(|_| ()),
        altered
    );

    // Incremental, from an entry before it: found.
    let snap = store.audit_snapshot_from(12).unwrap();
    let after = orchestrator_audit::verify_after(
        store.log_id(),
        &at(12),
        &snap.entries,
        &snap.checkpoints,
        snap.head.as_ref(),
    );
    assert_eq!(after.map(|_| ()), altered);
    // From an entry after it: not seen (a whole walk is what finds it).
    let snap = store.audit_snapshot_from(20).unwrap();
    let after = orchestrator_audit::verify_after(
        store.log_id(),
        &at(20),
        &snap.entries,
        &snap.checkpoints,
        snap.head.as_ref(),
    );
    assert!(after.is_ok(), "{after:?}");
}

#[test]
fn the_dashboards_whole_walk_names_an_entry_verified_earlier_that_moved() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(StatePaths::new(dir.path().join("state"))).expect("a store");
    for i in 1..=5u64 {
        store.append(None, &started(i), false).expect("append");
    }
    let mut known = orchestrator_audit::checkpoint(&store.entries().unwrap()[2]);
    assert!(verify_log_since(&store, Some(&known)).unwrap().is_ok());
    known.hash = "0".repeat(64);
    assert_eq!(
        verify_log_since(&store, Some(&known)).unwrap().map(|_| ()),
        Err(VerifyError::Entry {
            seq: 3,
            reason: BadEntry::StartMismatch
        })
    );
}
