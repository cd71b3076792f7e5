//! The store contract: what the core's store ports promise (the invariants
//! in `state_store.rs`), written once as functions generic over the port
//! and run against the in-memory fake, the SQLite store and the PostgreSQL
//! store (one test per property and backend: `mem::…`, `sqlite::…`,
//! `postgres::…`).
//!
//! A backend is a [`Place`]: one state that [`Place::open`] may open several
//! times (several connections, or for the fake several handles on one
//! shared store), so the concurrency properties race two writers on one
//! state as two supervisors would.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use nightshift_core::audit_log::Event;
use nightshift_core::state_store::fake::{MemStore, SharedMemStore};
use nightshift_core::state_store::{
    Accounts, ActBounds, ActCounts, ActQueue, AuditLog, PolicyStore, RunRecord, RunStore,
    StatePaths, StateStore, StoreErrorKind, TaskQueue,
};
use nightshift_store_postgres::{testing, PgStore};
use nightshift_store_sqlite::store::Store as SqliteStore;
use orchestrator_audit::verify_with_head;
use serde_json::json;

/// One state, opened as often as a property needs.
trait Place: Sync {
    type S: StateStore + 'static;
    fn open(&self) -> Self::S;
    /// Removes the audit entries from `seq` on behind the store's back, as
    /// an intruder with the database (not the store) would.
    fn delete_entries_from(&self, seq: u64);
    /// Removes the one audit entry `seq` behind the store's back.
    fn delete_entry(&self, seq: u64);
    /// Rewrites entry `seq`'s body behind the store's back.
    fn rewrite_entry(&self, seq: u64, body: &str);
    /// Whether the head is kept apart from the entries (not so in the fake,
    /// whose head is its last entry), so a deleted suffix can be seen.
    const HEAD_APART: bool = true;
}

struct Mem {
    store: SharedMemStore,
    _dir: tempfile::TempDir,
}

impl Mem {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            store: SharedMemStore::new(MemStore::new(dir.path())),
            _dir: dir,
        }
    }
}

impl Place for Mem {
    type S = SharedMemStore;
    const HEAD_APART: bool = false;
    fn open(&self) -> SharedMemStore {
        self.store.clone()
    }
    fn delete_entries_from(&self, seq: u64) {
        self.store.lock().audit.retain(|e| e.seq < seq);
    }
    fn delete_entry(&self, seq: u64) {
        self.store.lock().audit.retain(|e| e.seq != seq);
    }
    fn rewrite_entry(&self, seq: u64, body: &str) {
        let body = serde_json::from_str(body).unwrap();
        if let Some(e) = self.store.lock().audit.iter_mut().find(|e| e.seq == seq) {
            e.body = body;
        }
    }
}

struct Sqlite {
    dir: tempfile::TempDir,
}

impl Sqlite {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn raw(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.dir.path().join("state.db")).unwrap()
    }
}

impl Place for Sqlite {
    type S = SqliteStore;
    fn open(&self) -> SqliteStore {
        SqliteStore::open(StatePaths::new(self.dir.path().to_path_buf())).unwrap()
    }
    fn delete_entries_from(&self, seq: u64) {
        self.raw()
            .execute("DELETE FROM audit WHERE seq >= ?1", [seq as i64])
            .unwrap();
    }
    fn delete_entry(&self, seq: u64) {
        self.raw()
            .execute("DELETE FROM audit WHERE seq = ?1", [seq as i64])
            .unwrap();
    }
    fn rewrite_entry(&self, seq: u64, body: &str) {
        self.raw()
            .execute(
                "UPDATE audit SET body = ?2 WHERE seq = ?1",
                rusqlite::params![seq as i64, body],
            )
            .unwrap();
    }
}

struct Pg {
    url: String,
    dir: tempfile::TempDir,
}

impl Pg {
    fn new() -> Self {
        Self {
            url: testing::fresh_database(),
            dir: tempfile::tempdir().unwrap(),
        }
    }
    /// As a superuser who switches the append-only triggers off.
    fn raw(&self, statement: &str) {
        let mut c = ::postgres::Client::connect(&self.url, ::postgres::NoTls).unwrap();
        c.batch_execute(&format!(
            "SET session_replication_role = replica; {statement}"
        ))
        .unwrap();
    }
}

impl Place for Pg {
    type S = PgStore;
    fn open(&self) -> PgStore {
        PgStore::connect(&self.url, self.dir.path()).unwrap()
    }
    fn delete_entries_from(&self, seq: u64) {
        self.raw(&format!("DELETE FROM audit WHERE seq >= {seq}"));
    }
    fn delete_entry(&self, seq: u64) {
        self.raw(&format!("DELETE FROM audit WHERE seq = {seq}"));
    }
    fn rewrite_entry(&self, seq: u64, body: &str) {
        let body = body.replace('\'', "''");
        self.raw(&format!(
            "UPDATE audit SET body = '{body}' WHERE seq = {seq}"
        ));
    }
}

// ----- helpers -----

fn note(i: usize) -> Event {
    Event::RunEnded {
        status: format!("note {i}"),
        reason: None,
    }
}

fn door(act: Option<&str>, verdict: &str, label: Option<&str>) -> Event {
    Event::DoorRequest {
        door: "git".into(),
        destination: None,
        verdict: verdict.into(),
        rule: None,
        act: act.map(str::to_string),
        digest: "d".into(),
        bytes: 1,
        label: label.map(str::to_string),
        gate: None,
        reason: None,
    }
}

fn run(id: &str, status: &str, repo: &str) -> RunRecord {
    RunRecord {
        id: id.into(),
        created_at: nightshift_core::state_store::now_rfc3339(),
        repo: repo.into(),
        status: status.into(),
        ..Default::default()
    }
}

fn verify(
    s: &impl StateStore,
) -> Result<orchestrator_audit::Verified, orchestrator_audit::VerifyError> {
    let snap = s.audit_snapshot().unwrap();
    verify_with_head(
        s.log_id(),
        &snap.entries,
        &snap.checkpoints,
        snap.head.as_ref(),
    )
}

fn pending() -> serde_json::Value {
    json!({ "state": "pending" })
}

fn approved() -> serde_json::Value {
    json!({ "state": "approved" })
}

fn at_most(n: u64) -> impl Fn(ActCounts) -> Option<(&'static str, String)> {
    move |c: ActCounts| (c.of_run >= n).then(|| ("acts_per_run", format!("{} of {n}", c.of_run)))
}

// ----- the properties -----

/// Appends chain one after another, the head follows, checkpoints are
/// kept where asked, and the whole verifies.
fn appends_make_one_verified_chain<P: Place>(p: &P) {
    let mut s = p.open();
    assert!(s.read_head().unwrap().is_none());
    for i in 0..5 {
        let e = s.append(Some("r1"), &note(i), i == 2).unwrap();
        assert_eq!(e.seq, i as u64 + 1);
    }
    let head = s.read_head().unwrap().unwrap();
    assert_eq!(head.seq, 5);
    assert_eq!(s.checkpoints().unwrap().len(), 1);
    assert_eq!(s.checkpoints().unwrap()[0].seq, 3);
    let v = verify(&s).unwrap();
    assert_eq!(v.entries, 5);
    assert_eq!(s.entries().unwrap().len(), 5);
    assert_eq!(s.entries_from(4).unwrap().len(), 2);
    assert_eq!(s.audit_snapshot_from(4).unwrap().entries.len(), 2);
    assert_eq!(s.entries_for_run("r1").unwrap().len(), 5);
    assert!(s.entries_for_run("other").unwrap().is_empty());
    let bodies = s
        .bodies_of_kind_since("run_ended", "1970-01-01T00:00:00Z")
        .unwrap();
    assert_eq!(bodies.len(), 5);
    assert_eq!(bodies[0].0.as_deref(), Some("r1"));
    assert_eq!(bodies[0].1["status"], "note 0");
    assert!(s
        .bodies_of_kind_since("run_ended", "9999")
        .unwrap()
        .is_empty());
}

/// The door's entries: refusals (and errors) of a run or all, and the
/// label recorded for each act.
fn door_entries_are_found_by_verdict_and_act<P: Place>(p: &P) {
    let mut s = p.open();
    s.append(
        Some("r1"),
        &door(Some("a1"), "queued", Some("untrusted")),
        false,
    )
    .unwrap();
    s.append(Some("r1"), &door(None, "refused", None), false)
        .unwrap();
    s.append(Some("r2"), &door(None, "error", None), false)
        .unwrap();
    s.append(Some("r2"), &door(None, "allowed", None), false)
        .unwrap();
    assert_eq!(s.door_refusals(None).unwrap().len(), 2);
    let of_r1 = s.door_refusals(Some("r1")).unwrap();
    assert_eq!(of_r1.len(), 1);
    assert_eq!(of_r1[0].seq, 2);
    let labels = s.act_labels().unwrap();
    assert_eq!(labels.len(), 1);
    assert_eq!(labels["a1"], "untrusted");
}

/// An act and its entry are written together; it moves only from the
/// state named, and a move that does not happen is not audited.
fn acts_move_only_from_the_state_named<P: Place>(p: &P) {
    let mut s = p.open();
    s.put_act(
        "a1",
        "r1",
        &json!({"id": "a1"}),
        &pending(),
        Some(b"x"),
        &note(0),
    )
    .unwrap();
    assert_eq!(s.entries().unwrap().len(), 1);
    let acts = s.acts(Some("a1")).unwrap();
    assert_eq!(acts.len(), 1);
    assert_eq!(acts[0].0["id"], "a1");
    assert_eq!(acts[0].2.as_deref(), Some(&b"x"[..]));
    assert!(s
        .transition_act("a1", "r1", &pending(), &approved(), &note(1))
        .unwrap());
    assert!(!s
        .transition_act("a1", "r1", &pending(), &approved(), &note(2))
        .unwrap());
    assert!(!s
        .transition_act("nope", "r1", &pending(), &approved(), &note(3))
        .unwrap());
    assert_eq!(
        s.entries().unwrap().len(),
        2,
        "a move that did not happen was audited"
    );
    assert_eq!(s.acts(Some("a1")).unwrap()[0].1, approved());
    assert_eq!(s.count_acts("r1").unwrap(), 1);
    verify(&s).unwrap();
}

/// A second act with the same id is refused, and nothing of it written.
fn an_act_id_is_taken_once<P: Place>(p: &P) {
    let mut s = p.open();
    s.put_act("a1", "r1", &json!({}), &pending(), None, &note(0))
        .unwrap();
    let e = s
        .put_act("a1", "r1", &json!({}), &pending(), None, &note(1))
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Conflict, "{e}");
    assert_eq!(s.entries().unwrap().len(), 1);
    assert_eq!(s.acts(None).unwrap().len(), 1);
}

/// Pages of the queue by state, oldest first, with the total.
fn acts_are_paged_by_state<P: Place>(p: &P) {
    let mut s = p.open();
    for i in 0..7 {
        let state = if i % 2 == 0 { pending() } else { approved() };
        s.put_act(
            &format!("a{i}"),
            "r1",
            &json!({ "n": i }),
            &state,
            None,
            &note(i),
        )
        .unwrap();
    }
    let (page, total) = s.acts_in_states(&["pending"], 1, 2).unwrap();
    assert_eq!(total, 4);
    let ns: Vec<_> = page.iter().map(|a| a.0["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, [2, 4]);
    let (all, total) = s.acts_in_states(&["pending", "approved"], 0, 100).unwrap();
    assert_eq!((all.len(), total), (7, 7));
    assert_eq!(s.acts_in_states(&["done"], 0, 10).unwrap().1, 0);
}

/// Past the bounds, nothing is written and the refusal is the rule's.
fn acts_within_bounds_are_refused_with_nothing_written<P: Place>(p: &P) {
    let mut s = p.open();
    s.put_run(&run("r1", "running", "repo")).unwrap();
    let rule = at_most(2);
    let bounds = ActBounds {
        since: "1970-01-01T00:00:00Z",
        repo: "repo",
        refuse: &rule,
    };
    for i in 0..2 {
        let r = s
            .put_act_within(
                &format!("a{i}"),
                "r1",
                &json!({}),
                &pending(),
                None,
                &note(i),
                &bounds,
            )
            .unwrap();
        assert!(r.is_none());
    }
    let refused = s
        .put_act_within("a2", "r1", &json!({}), &pending(), None, &note(2), &bounds)
        .unwrap();
    assert_eq!(refused.map(|r| r.0), Some("acts_per_run"));
    assert_eq!(s.count_acts("r1").unwrap(), 2);
    assert_eq!(s.entries().unwrap().len(), 2);
    assert_eq!(s.count_acts_since("1970-01-01T00:00:00Z", None).unwrap(), 2);
    assert_eq!(
        s.count_acts_since("1970-01-01T00:00:00Z", Some("repo"))
            .unwrap(),
        2
    );
    assert_eq!(
        s.count_acts_since("1970-01-01T00:00:00Z", Some("other"))
            .unwrap(),
        0
    );
}

/// Dry runs' acts are recorded with their entry and count as acts.
fn dry_acts_are_recorded_and_counted<P: Place>(p: &P) {
    let mut s = p.open();
    let e = s
        .put_dry_act("d1", "r1", &json!({"would": "push"}), &note(0))
        .unwrap();
    assert_eq!(e.seq, 1);
    s.put_dry_act("d2", "r2", &json!({"would": "mail"}), &note(1))
        .unwrap();
    assert_eq!(s.dry_acts(Some("r1")).unwrap(), [json!({"would": "push"})]);
    assert_eq!(s.dry_acts(None).unwrap().len(), 2);
    assert_eq!(s.count_acts("r1").unwrap(), 1);
    verify(&s).unwrap();
}

/// A run ends once: a second ending writes nothing.
fn a_run_ends_once<P: Place>(p: &P) {
    let mut s = p.open();
    s.put_run(&run("r1", "running", "repo")).unwrap();
    assert!(s
        .end_run(&run("r1", "exited 0", "repo"), &note(0))
        .unwrap()
        .is_some());
    assert!(s
        .end_run(&run("r1", "lost", "repo"), &note(1))
        .unwrap()
        .is_none());
    assert_eq!(s.run("r1").unwrap().status, "exited 0");
    assert_eq!(s.entries_for_run("r1").unwrap().len(), 1);
    // A run never stored ends too.
    assert!(s
        .end_run(&run("r2", "killed", "repo"), &note(2))
        .unwrap()
        .is_some());
    assert_eq!(s.runs().unwrap().len(), 2);
    let e = s.run("nope").unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::NotFound);
}

/// Runs are saved and replaced; kill requests keep the first asker.
fn runs_and_kill_requests<P: Place>(p: &P) {
    let mut s = p.open();
    let mut r = run("r1", "created", "repo");
    s.put_run(&r).unwrap();
    r.status = "running".into();
    r.exit_code = Some(3);
    s.put_run(&r).unwrap();
    assert_eq!(s.run("r1").unwrap(), r);
    assert_eq!(s.runs().unwrap(), [r]);
    assert!(s.kill_request("r1").unwrap().is_none());
    assert!(s.request_kill("r1", "owner").unwrap());
    assert!(!s.request_kill("r1", "watchdog").unwrap());
    assert_eq!(s.kill_request("r1").unwrap().as_deref(), Some("owner"));
}

/// Settle claims are kept from the living and taken from the gone; the
/// import mark stays.
fn settle_claims_and_import_marks<P: Place>(p: &P) {
    let mut s = p.open();
    let alive = |_: &str| false;
    let gone = |_: &str| true;
    assert!(s.claim_settle("r", "a", "1:1", &alive).unwrap());
    assert!(s.claim_settle("r", "a", "1:1", &alive).unwrap());
    assert!(!s.claim_settle("r", "b", "2:2", &alive).unwrap());
    assert!(s.claim_settle("r", "b", "2:2", &gone).unwrap());
    s.release_settle("r", "2:2").unwrap();
    assert!(s.claim_settle("r", "c", "3:3", &alive).unwrap());
    assert!(!s.imported("q").unwrap());
    s.record_imported(&run("q", "running", "repo")).unwrap();
    assert!(s.imported("q").unwrap());
    assert_eq!(s.run("q").unwrap().status, "running");
}

/// Tasks go in all or none and move by compare-and-set.
fn tasks_move_by_compare_and_set<P: Place>(p: &P) {
    let mut s = p.open();
    let t = |id: &str| (id.to_string(), format!("spec of {id}"));
    s.insert_tasks(&[t("t1"), t("t2")], "queued").unwrap();
    assert!(s.insert_tasks(&[t("t3"), t("t1")], "queued").is_err());
    let tasks = s.tasks().unwrap();
    assert_eq!(
        tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["t1", "t2"]
    );
    assert!(tasks[0].seq < tasks[1].seq);
    assert_eq!(tasks[0].progress, "{}");
    assert!(s
        .move_task("t1", &["queued", "paused"], "running", "{\"n\":1}", None)
        .unwrap());
    assert!(!s
        .move_task("t1", &["queued"], "running", "{}", None)
        .unwrap());
    assert!(!s
        .move_task("nope", &["queued"], "running", "{}", None)
        .unwrap());
    let t1 = s
        .tasks()
        .unwrap()
        .into_iter()
        .find(|t| t.id == "t1")
        .unwrap();
    assert_eq!(
        (t1.state.as_str(), t1.progress.as_str()),
        ("running", "{\"n\":1}")
    );
}

/// Accounts and sessions: a changed account ends its sessions, an expired
/// session is not found, removing an account ends its sessions.
fn accounts_and_sessions<P: Place>(p: &P) {
    let mut s = p.open();
    s.put_user("ann", "owner", "phc1").unwrap();
    s.put_user("bob", "viewer", "phc2").unwrap();
    let ann = s.user("ann").unwrap().unwrap();
    assert_eq!(
        (ann.0.as_str(), ann.1.as_str(), ann.2.as_str()),
        ("ann", "owner", "phc1")
    );
    assert_eq!(
        s.users()
            .unwrap()
            .iter()
            .map(|u| u.0.as_str())
            .collect::<Vec<_>>(),
        ["ann", "bob"]
    );
    s.put_session("s1", "ann", "csrf", 100, 200).unwrap();
    let live = s.session("s1", 150).unwrap().unwrap();
    assert_eq!(live.0, "ann");
    assert_eq!(live.3, 200);
    assert!(
        s.session("s1", 200).unwrap().is_none(),
        "an expired session was found"
    );
    s.put_user("ann", "owner", "phc3").unwrap();
    assert!(
        s.session("s1", 150).unwrap().is_none(),
        "a new password kept a session"
    );
    s.put_session("s2", "bob", "csrf", 100, 300).unwrap();
    s.delete_session("s2").unwrap();
    assert!(s.session("s2", 150).unwrap().is_none());
    s.put_session("s3", "bob", "csrf", 100, 300).unwrap();
    assert!(s.remove_user("bob").unwrap());
    assert!(!s.remove_user("bob").unwrap());
    assert!(s.session("s3", 150).unwrap().is_none());
    assert!(s.user("bob").unwrap().is_none());
}

/// Policy rows and scope refusals are written with their entries; the
/// metadata is set, replaced and removed.
fn policy_rows_scopes_and_meta<P: Place>(p: &P) {
    let mut s = p.open();
    let e = s.append_policy_row(&json!({"rule": 1}), &note(0)).unwrap();
    s.append_policy_row(&json!({"rule": 2}), &note(1)).unwrap();
    assert_eq!(
        s.policy_rows().unwrap(),
        [json!({"rule": 1}), json!({"rule": 2})]
    );
    assert!(
        s.checkpoints().unwrap().iter().any(|c| c.seq == e.seq),
        "a policy row's entry was not checkpointed"
    );
    s.put_scope_proposal("p1", &json!({"v": 1})).unwrap();
    s.put_scope_proposal("p1", &json!({"v": 2})).unwrap();
    assert_eq!(s.scope_proposal("p1").unwrap(), Some(json!({"v": 2})));
    assert!(s.scope_proposal("p2").unwrap().is_none());
    s.refuse_scope("p1", "too broad", &note(2)).unwrap();
    assert_eq!(
        s.refused_scopes().unwrap(),
        BTreeSet::from(["p1".to_string()])
    );
    assert_eq!(s.entries().unwrap().len(), 3);
    assert!(s.meta("k").unwrap().is_none());
    s.set_meta("k", Some("v1")).unwrap();
    s.set_meta("k", Some("v2")).unwrap();
    assert_eq!(s.meta("k").unwrap().as_deref(), Some("v2"));
    s.set_meta("k", None).unwrap();
    assert!(s.meta("k").unwrap().is_none());
    verify(&s).unwrap();
}

/// Writers on several connections at once never fork the chain.
fn concurrent_appends_never_fork_the_chain<P: Place>(p: &P) {
    let (writers, each) = (4, 25);
    let barrier = Arc::new(Barrier::new(writers));
    std::thread::scope(|scope| {
        for w in 0..writers {
            let barrier = barrier.clone();
            let mut s = p.open();
            scope.spawn(move || {
                barrier.wait();
                for i in 0..each {
                    if i % 2 == 0 {
                        s.append(None, &note(w * 1000 + i), i % 10 == 0).unwrap();
                    } else {
                        let id = format!("a{w}-{i}");
                        s.put_act(&id, "r1", &json!({}), &pending(), None, &note(i))
                            .unwrap();
                    }
                }
            });
        }
    });
    let s = p.open();
    let v = verify(&s).unwrap();
    assert_eq!(v.entries, (writers * each) as u64);
    assert_eq!(s.read_head().unwrap().unwrap().seq, (writers * each) as u64);
}

/// Two requests at once for the last place: exactly one gets it.
fn two_requests_never_both_take_the_last_place<P: Place>(p: &P) {
    for round in 0..8 {
        let run_id = format!("r{round}");
        p.open().put_run(&run(&run_id, "running", "repo")).unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let taken: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|t| {
                    let barrier = barrier.clone();
                    let run_id = run_id.clone();
                    let mut s = p.open();
                    scope.spawn(move || {
                        let rule = at_most(1);
                        let bounds = ActBounds {
                            since: "1970-01-01T00:00:00Z",
                            repo: "repo",
                            refuse: &rule,
                        };
                        barrier.wait();
                        let id = format!("{run_id}-{t}");
                        let r = s
                            .put_act_within(
                                &id,
                                &run_id,
                                &json!({}),
                                &pending(),
                                None,
                                &note(t),
                                &bounds,
                            )
                            .unwrap();
                        usize::from(r.is_none())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            taken, 1,
            "round {round}: {taken} requests took the one place"
        );
        assert_eq!(p.open().count_acts(&run_id).unwrap(), 1);
    }
    verify(&p.open()).unwrap();
}

/// Two supervisors ending one run at once, claiming one task at once and
/// approving one act at once: each happens once.
fn racing_writers_each_win_once<P: Place>(p: &P) {
    for round in 0..6 {
        let run_id = format!("r{round}");
        let task = format!("t{round}");
        let act = format!("a{round}");
        {
            let mut s = p.open();
            s.put_run(&run(&run_id, "running", "repo")).unwrap();
            s.insert_tasks(&[(task.clone(), "{}".into())], "queued")
                .unwrap();
            s.put_act(&act, &run_id, &json!({}), &pending(), None, &note(0))
                .unwrap();
        }
        let barrier = Arc::new(Barrier::new(2));
        let wins: Vec<(bool, bool, bool)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|t| {
                    let barrier = barrier.clone();
                    let (run_id, task, act) = (&run_id, &task, &act);
                    let mut s = p.open();
                    scope.spawn(move || {
                        barrier.wait();
                        let status = if t == 0 { "exited 0" } else { "lost" };
                        let ended = s
                            .end_run(&run(run_id, status, "repo"), &note(t))
                            .unwrap()
                            .is_some();
                        let moved = s
                            .move_task(task, &["queued"], "running", "{}", None)
                            .unwrap();
                        let approved = s
                            .transition_act(act, run_id, &pending(), &approved(), &note(t))
                            .unwrap();
                        (ended, moved, approved)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let count = |f: fn(&(bool, bool, bool)) -> bool| wins.iter().filter(|w| f(w)).count();
        assert_eq!(count(|w| w.0), 1, "round {round}: the run ended {wins:?}");
        assert_eq!(count(|w| w.1), 1, "round {round}: the task moved {wins:?}");
        assert_eq!(count(|w| w.2), 1, "round {round}: the act moved {wins:?}");
        let s = p.open();
        let ends = s
            .entries_for_run(&run_id)
            .unwrap()
            .iter()
            .filter(|e| e.kind == "run_ended")
            .count();
        // The act's queueing and its one move are run_ended notes too.
        assert_eq!(ends, 3, "round {round}");
    }
    verify(&p.open()).unwrap();
}

/// An entry deleted from the middle of the log is found.
fn a_deleted_entry_is_found<P: Place>(p: &P) {
    let mut s = p.open();
    for i in 0..4 {
        s.append(None, &note(i), false).unwrap();
    }
    verify(&s).unwrap();
    p.delete_entry(2);
    assert_eq!(verify(&s).unwrap_err().seq(), Some(2));
}

/// A suffix deleted (and the whole log emptied) is found, where the head
/// is kept apart from the entries.
fn a_truncated_log_is_found<P: Place>(p: &P) {
    if !P::HEAD_APART {
        return;
    }
    let mut s = p.open();
    for i in 0..4 {
        s.append(None, &note(i), false).unwrap();
    }
    p.delete_entries_from(3);
    let e = verify(&s).unwrap_err();
    assert_eq!(e.seq(), Some(3), "{e}");
    p.delete_entries_from(1);
    assert!(verify(&s).is_err(), "an emptied log verified");
}

/// An entry's body rewritten behind the store's back is found.
fn a_rewritten_entry_is_found<P: Place>(p: &P) {
    let mut s = p.open();
    for i in 0..3 {
        s.append(None, &note(i), false).unwrap();
    }
    p.rewrite_entry(2, r#"{"status":"note 9"}"#);
    let e = verify(&s).unwrap_err();
    assert_eq!(e.seq(), Some(2), "{e}");
    assert!(e.to_string().contains("altered"), "{e}");
}

/// A snapshot read beside appenders verifies: the head and checkpoints it
/// holds name only entries it holds (no false alarm of a truncation).
fn a_snapshot_beside_appenders_verifies<P: Place>(p: &P) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for w in 0..2 {
            let mut s = p.open();
            let done = &done;
            scope.spawn(move || {
                for i in 0..60 {
                    s.append(None, &note(w * 100 + i), i % 3 == 0).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            });
        }
        let reader = p.open();
        let mut reads = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) || reads < 5 {
            let snap = reader.audit_snapshot().unwrap();
            verify_with_head(
                reader.log_id(),
                &snap.entries,
                &snap.checkpoints,
                snap.head.as_ref(),
            )
            .unwrap_or_else(|e| panic!("read {reads}: {e}"));
            reads += 1;
        }
    });
}

fn state_named(state: &str, not_before: Option<i64>) -> serde_json::Value {
    match not_before {
        Some(t) => json!({"state": state, "not_before": t}),
        None => json!({"state": state}),
    }
}

/// The executors' leases: only executable acts are claimed (approved,
/// executing, outcome unknown, a retry that is due), oldest first; an
/// unlapsed lease keeps everyone else off, a lapsed one is taken over; a
/// renewal and a release count only for the holder; a claim writes no
/// audit entry and moves nothing.
fn acts_are_claimed_by_one_holder_at_a_time<P: Place>(p: &P) {
    let mut s = p.open();
    for (id, state) in [
        ("a1", state_named("pending", None)),
        ("a2", state_named("awaiting_retry", Some(500))),
        ("a3", state_named("approved", None)),
        ("a4", state_named("done", None)),
        ("a5", state_named("outcome_unknown", None)),
    ] {
        s.put_act(id, "r1", &json!({"id": id}), &state, None, &note(0))
            .unwrap();
        // Distinct creation times: the claim takes the oldest.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    let entries = s.entries().unwrap().len();
    // At 100 the retry is not due: the approved act is the oldest claimable.
    let first = s.claim_act("x", 100, 130, None).unwrap().unwrap();
    assert_eq!(first.0["id"], "a3");
    assert_eq!(
        first.1,
        state_named("approved", None),
        "the claim moved the act"
    );
    let second = s.claim_act("y", 100, 130, None).unwrap().unwrap();
    assert_eq!(second.0["id"], "a5", "a held act was claimed again");
    assert!(s.claim_act("z", 100, 130, None).unwrap().is_none());
    assert!(
        s.claim_act("z", 130, 160, Some("a3")).unwrap().is_none(),
        "a lease was taken over in its last second"
    );
    // The retry falls due at 500; a3's lease lapses at 130.
    let due = s.claim_act("z", 500, 600, None).unwrap().unwrap();
    assert_eq!(due.0["id"], "a2", "the oldest of the due and the lapsed");
    let taken = s.claim_act("z", 500, 600, Some("a3")).unwrap().unwrap();
    assert_eq!(taken.0["id"], "a3", "a lapsed lease was not taken over");
    assert!(
        !s.renew_act("a3", "x", 500, 700).unwrap(),
        "the old holder renewed"
    );
    assert!(s.renew_act("a3", "z", 500, 700).unwrap());
    s.release_act("a3", "x").unwrap();
    assert!(s.claim_act("w", 650, 700, Some("a3")).unwrap().is_none());
    s.release_act("a3", "z").unwrap();
    assert!(s.claim_act("w", 650, 700, Some("a3")).unwrap().is_some());
    assert!(
        s.claim_act("w", 650, 700, Some("a1")).unwrap().is_none(),
        "a pending act was claimed"
    );
    assert!(
        s.claim_act("w", 650, 700, Some("a4")).unwrap().is_none(),
        "a final act was claimed"
    );
    assert_eq!(s.entries().unwrap().len(), entries, "a claim was audited");
    verify(&s).unwrap();
}

/// Claimers racing on one state never share an act while its lease holds.
fn claimers_at_once_never_share_an_act<P: Place>(p: &P) {
    {
        let mut s = p.open();
        for i in 0..12 {
            let id = format!("c{i:02}");
            s.put_act(&id, "r1", &json!({"id": id}), &approved(), None, &note(i))
                .unwrap();
        }
    }
    let barrier = Arc::new(Barrier::new(3));
    let claimed: Vec<Vec<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|t| {
                let barrier = barrier.clone();
                let mut s = p.open();
                scope.spawn(move || {
                    barrier.wait();
                    let mut mine = Vec::new();
                    while let Some((act, _, _)) =
                        s.claim_act(&format!("h{t}"), 1_000, 2_000, None).unwrap()
                    {
                        mine.push(act["id"].as_str().unwrap().to_string());
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<&String> = claimed.iter().flatten().collect();
    let distinct: BTreeSet<&String> = all.iter().copied().collect();
    assert_eq!(all.len(), 12, "{claimed:?}");
    assert_eq!(distinct.len(), 12, "an act was claimed twice: {claimed:?}");
}

/// A rebind is one move: the old act closed and the new one queued with
/// both entries, or neither when the old one is no longer where it was.
fn a_replacement_is_one_move<P: Place>(p: &P) {
    let mut s = p.open();
    let stale = state_named("stale", None);
    s.put_act("old", "r1", &json!({"id": "old"}), &stale, None, &note(0))
        .unwrap();
    let closed = state_named("rejected", None);
    let replaced = |s: &mut P::S, new: &str| {
        s.replace_act(
            "old",
            "r1",
            &stale,
            &closed,
            &note(1),
            new,
            &json!({"id": new}),
            &pending(),
            Some(b"c"),
            &note(2),
        )
        .unwrap()
    };
    assert!(replaced(&mut s, "new"));
    assert!(
        !replaced(&mut s, "newer"),
        "a second replacement of a closed act"
    );
    assert_eq!(s.acts(Some("old")).unwrap()[0].1, closed);
    assert_eq!(
        s.acts(Some("new")).unwrap()[0].2.as_deref(),
        Some(&b"c"[..])
    );
    assert!(s.acts(Some("newer")).unwrap().is_empty());
    assert_eq!(s.entries().unwrap().len(), 3);
    verify(&s).unwrap();
}

/// The `skip`-th queued task (dispatchers picking different tasks, so only
/// the store's serialisation keeps them within the budget), while fewer
/// than `budget` start or run (of any dispatcher): an admission as the run
/// queue's is, over every task.
fn first_within(
    budget: usize,
    skip: usize,
) -> impl FnMut(&[nightshift_core::state_store::StoredTask]) -> Vec<(String, String)> {
    move |all| {
        let busy = all
            .iter()
            .filter(|t| t.state == "starting" || t.state == "running")
            .count();
        all.iter()
            .filter(|t| t.state == "queued")
            .skip(skip)
            .take(budget.saturating_sub(busy).min(1))
            .map(|t| (t.id.clone(), format!("{{\"by\":\"{}\"}}", t.id)))
            .collect()
    }
}

/// Tasks start under a dispatcher's lease, which is renewed only by its
/// holder, held through its last second, then taken over once; a running
/// task with no lease (started before leases) is taken over at once.
fn tasks_start_under_a_lease_and_are_taken_over_once_lapsed<P: Place>(p: &P) {
    let mut s = p.open();
    let t = |id: &str| (id.to_string(), format!("spec of {id}"));
    s.insert_tasks(&[t("t1"), t("t2"), t("t3")], "queued")
        .unwrap();
    let mut seen = 0;
    let started = s
        .start_tasks("d1", 130, &mut |all| {
            seen = all.len();
            vec![
                ("t1".into(), "{\"n\":1}".into()),
                ("nope".into(), "{}".into()),
            ]
        })
        .unwrap();
    assert_eq!(seen, 3, "the decision did not see every task");
    assert_eq!(started, [("t1".to_string(), 1)]);
    let t1 = s.tasks().unwrap().remove(0);
    assert_eq!(
        (t1.state.as_str(), t1.progress.as_str()),
        ("starting", "{\"n\":1}")
    );
    assert_eq!(t1.lease, Some(("d1".to_string(), 130)));
    assert!(
        s.start_tasks("d2", 130, &mut |_| vec![("t1".into(), "{}".into())])
            .unwrap()
            .is_empty(),
        "a task started twice"
    );
    assert_eq!(
        s.renew_tasks("d1", &["t1".into(), "t2".into()], 160)
            .unwrap(),
        ["t1"]
    );
    assert!(s.claim_lapsed_tasks("d2", 150, 200).unwrap().is_empty());
    assert!(
        s.claim_lapsed_tasks("d2", 160, 200).unwrap().is_empty(),
        "a lease was taken over in its last second"
    );
    let taken = s.claim_lapsed_tasks("d2", 161, 200).unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(
        (taken[0].id.as_str(), taken[0].lease.clone()),
        ("t1", Some(("d2".to_string(), 200)))
    );
    assert!(
        s.renew_tasks("d1", &["t1".into()], 300).unwrap().is_empty(),
        "the old holder renewed"
    );
    assert!(
        s.claim_lapsed_tasks("d3", 161, 200).unwrap().is_empty(),
        "taken over twice"
    );
    // Started before leases: no lease, taken over by the next dispatcher.
    assert!(s
        .move_task("t3", &["queued"], "running", "{}", None)
        .unwrap());
    let legacy = s.claim_lapsed_tasks("d3", 100, 200).unwrap();
    assert_eq!(
        legacy.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["t3"]
    );
    // Queued and final tasks are never taken over.
    assert!(s
        .move_task("t1", &["starting"], "done", "{}", None)
        .unwrap());
    assert!(s
        .claim_lapsed_tasks("d4", 10_000, 10_100)
        .unwrap()
        .iter()
        .all(|t| t.id == "t3"));
}

/// The fence: a move made under a claim happens only while the task is
/// held under that very claim. A holder whose lease was taken over cannot
/// move the task, nor can it with its old claim after it took the task
/// back (the generation moved on); moves without a fence (a queued task's
/// cancel) are unchanged.
fn a_lost_claim_moves_nothing_even_after_it_is_taken_back<P: Place>(p: &P) {
    use nightshift_core::state_store::TaskFence;
    let mut s = p.open();
    s.insert_tasks(
        &[("t1".into(), "spec".into()), ("t2".into(), "spec".into())],
        "queued",
    )
    .unwrap();
    let started = s
        .start_tasks("d1", 130, &mut |_| vec![("t1".into(), "{}".into())])
        .unwrap();
    let fence = |holder: &str, generation| TaskFence {
        holder: holder.into(),
        generation,
    };
    let d1 = fence("d1", started[0].1);
    assert!(s
        .move_task("t1", &["starting"], "running", "{\"by\":\"d1\"}", Some(&d1))
        .unwrap());
    // Lapsed; d2 takes it over.
    let taken = s.claim_lapsed_tasks("d2", 131, 200).unwrap();
    assert_eq!(taken[0].generation, d1.generation + 1);
    let d2 = fence("d2", taken[0].generation);
    assert!(
        !s.move_task("t1", &["running"], "done", "{\"by\":\"d1\"}", Some(&d1))
            .unwrap(),
        "the old holder moved a task it lost"
    );
    // d2 lapses too, and d1 takes the task back: its old claim is still
    // no claim.
    let back = s.claim_lapsed_tasks("d1", 201, 300).unwrap();
    assert_eq!(back[0].lease.as_ref().map(|l| l.0.as_str()), Some("d1"));
    assert!(
        !s.move_task(
            "t1",
            &["running"],
            "failed",
            "{\"by\":\"old d1\"}",
            Some(&d1)
        )
        .unwrap(),
        "a claim from before the takeover moved the task"
    );
    assert!(
        !s.move_task("t1", &["running"], "failed", "{\"by\":\"d2\"}", Some(&d2))
            .unwrap(),
        "a holder that lost the task moved it"
    );
    let now = fence("d1", back[0].generation);
    assert!(s
        .move_task(
            "t1",
            &["running"],
            "done",
            "{\"by\":\"d1 again\"}",
            Some(&now)
        )
        .unwrap());
    let t1 = s
        .tasks()
        .unwrap()
        .into_iter()
        .find(|t| t.id == "t1")
        .unwrap();
    assert_eq!(
        (t1.state.as_str(), t1.progress.as_str()),
        ("done", "{\"by\":\"d1 again\"}")
    );
    // No fence: a queued task's cancel, as before.
    assert!(s
        .move_task("t2", &["queued"], "cancelled", "{}", None)
        .unwrap());
    // A foreground run's task starts at generation 1.
    assert!(s
        .insert_started_task("r1", "spec", "{}", "run r1", 130, &mut |_| true)
        .unwrap());
    assert!(s
        .move_task(
            "r1",
            &["starting"],
            "running",
            "{}",
            Some(&fence("run r1", 1))
        )
        .unwrap());
}

/// Dispatchers starting tasks at once share one budget: each decides on
/// what the others' starts left, so no more start than the budget allows.
fn dispatchers_starting_at_once_share_one_budget<P: Place>(p: &P) {
    {
        let mut s = p.open();
        let tasks: Vec<(String, String)> = (0..8)
            .map(|i| (format!("t{i}"), "spec".to_string()))
            .collect();
        s.insert_tasks(&tasks, "queued").unwrap();
    }
    let barrier = Arc::new(Barrier::new(3));
    let started: Vec<Vec<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|d| {
                let barrier = barrier.clone();
                let mut s = p.open();
                scope.spawn(move || {
                    barrier.wait();
                    let mut mine = Vec::new();
                    for _ in 0..4 {
                        let mut decide = first_within(3, d);
                        mine.extend(
                            s.start_tasks(&format!("d{d}"), 1_000, &mut decide)
                                .unwrap()
                                .into_iter()
                                .map(|(id, _)| id),
                        );
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<&String> = started.iter().flatten().collect();
    assert_eq!(all.len(), 3, "the budget of 3 was not shared: {started:?}");
    let s = p.open();
    let busy = s
        .tasks()
        .unwrap()
        .into_iter()
        .filter(|t| t.state == "starting")
        .count();
    assert_eq!(busy, 3);
}

/// A foreground run's task is added already started, under its lease, only
/// when the admission over every task allows it; refused, nothing is
/// written; and no dispatcher can take it while its lease lives.
fn a_started_task_is_added_only_when_admitted<P: Place>(p: &P) {
    let mut s = p.open();
    s.insert_tasks(&[("q1".to_string(), "spec".to_string())], "queued")
        .unwrap();
    let mut seen = 0;
    assert!(!s
        .insert_started_task("r1", "spec", "{}", "run r1", 130, &mut |all| {
            seen = all.len();
            false
        })
        .unwrap());
    assert_eq!(seen, 1, "the admission did not see every task");
    assert_eq!(s.tasks().unwrap().len(), 1, "a refused task was written");
    assert!(s
        .insert_started_task("r1", "spec", "{\"run\":\"r1\"}", "run r1", 130, &mut |_| {
            true
        })
        .unwrap());
    let r1 = s
        .tasks()
        .unwrap()
        .into_iter()
        .find(|t| t.id == "r1")
        .unwrap();
    assert_eq!(r1.state, "starting");
    assert_eq!(r1.lease, Some(("run r1".to_string(), 130)));
    assert!(r1.seq > 1, "not after the queued task");
    // Never started by a dispatcher, never taken over while its lease lives.
    assert!(s
        .start_tasks("d1", 130, &mut |_| vec![("r1".into(), "{}".into())])
        .unwrap()
        .is_empty());
    assert!(s.claim_lapsed_tasks("d1", 130, 160).unwrap().is_empty());
    assert_eq!(s.claim_lapsed_tasks("d1", 131, 160).unwrap().len(), 1);
    assert!(
        s.insert_started_task("r1", "spec", "{}", "run r1", 130, &mut |_| true)
            .is_err(),
        "a task id was taken twice"
    );
}

/// Visiting the log hands over what a snapshot holds, one entry at a time,
/// stops when asked, and the streamed verification agrees with the
/// snapshot's; a rewritten entry is found by both.
fn visiting_the_log_hands_what_a_snapshot_holds<P: Place>(p: &P) {
    use nightshift_core::state_store::{verify_log, AuditVisitor};
    use orchestrator_audit::{Checkpoint, Entry};
    struct Collect {
        begun: Option<(Option<Checkpoint>, Vec<Checkpoint>)>,
        entries: Vec<Entry>,
        stop_after: usize,
    }
    impl AuditVisitor for Collect {
        fn begin(&mut self, head: Option<Checkpoint>, checkpoints: Vec<Checkpoint>) -> bool {
            self.begun = Some((head, checkpoints));
            true
        }
        fn entry(&mut self, entry: Entry) -> bool {
            self.entries.push(entry);
            self.entries.len() < self.stop_after
        }
    }
    let mut s = p.open();
    for i in 0..7 {
        s.append(None, &note(i), i % 3 == 0).unwrap();
    }
    let snap = s.audit_snapshot().unwrap();
    let mut all = Collect {
        begun: None,
        entries: Vec::new(),
        stop_after: usize::MAX,
    };
    s.visit_audit(0, &mut all).unwrap();
    assert_eq!(
        all.begun,
        Some((snap.head.clone(), snap.checkpoints.clone()))
    );
    assert_eq!(all.entries, snap.entries);
    let mut some = Collect {
        begun: None,
        entries: Vec::new(),
        stop_after: 3,
    };
    s.visit_audit(2, &mut some).unwrap();
    assert_eq!(
        some.entries,
        snap.entries[1..4].to_vec(),
        "from 2, stopped after 3"
    );
    let v = verify_log(&s).unwrap().unwrap();
    assert_eq!(v, verify(&s).unwrap());
    if P::HEAD_APART {
        p.rewrite_entry(4, r#"{"status":"rewritten"}"#);
        let s = p.open();
        let streamed = verify_log(&s).unwrap().unwrap_err();
        assert_eq!(Some(streamed), verify(&s).err());
    }
}

macro_rules! contract {
    ($($property:ident),* $(,)?) => {
        mod mem {
            $(#[test] fn $property() { super::$property(&super::Mem::new()) })*
        }
        mod sqlite {
            $(#[test] fn $property() { super::$property(&super::Sqlite::new()) })*
        }
        mod postgres {
            $(#[test] fn $property() { super::$property(&super::Pg::new()) })*
        }
    };
}

contract!(
    appends_make_one_verified_chain,
    door_entries_are_found_by_verdict_and_act,
    acts_move_only_from_the_state_named,
    an_act_id_is_taken_once,
    acts_are_paged_by_state,
    acts_within_bounds_are_refused_with_nothing_written,
    dry_acts_are_recorded_and_counted,
    a_run_ends_once,
    runs_and_kill_requests,
    settle_claims_and_import_marks,
    tasks_move_by_compare_and_set,
    accounts_and_sessions,
    policy_rows_scopes_and_meta,
    concurrent_appends_never_fork_the_chain,
    two_requests_never_both_take_the_last_place,
    racing_writers_each_win_once,
    a_deleted_entry_is_found,
    a_truncated_log_is_found,
    a_rewritten_entry_is_found,
    a_snapshot_beside_appenders_verifies,
    acts_are_claimed_by_one_holder_at_a_time,
    claimers_at_once_never_share_an_act,
    a_replacement_is_one_move,
    tasks_start_under_a_lease_and_are_taken_over_once_lapsed,
    a_lost_claim_moves_nothing_even_after_it_is_taken_back,
    dispatchers_starting_at_once_share_one_budget,
    a_started_task_is_added_only_when_admitted,
    visiting_the_log_hands_what_a_snapshot_holds,
);
