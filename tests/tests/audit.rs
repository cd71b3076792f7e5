//! `nightshift audit verify` against a real store: intact after real runs
//! (also concurrent ones), a tamper in the database is found and named, a
//! removed suffix is found by the head, and verify beside appenders never
//! cries wolf.

use tests::{image, make_repo, stderr, stdout, State};

fn two_concurrent_runs(state: &State) {
    let repo = make_repo();
    let spawn = || {
        state
            .cmd()
            .args([
                "run",
                "--repo",
                repo.path().to_str().unwrap(),
                "--image",
                &image(),
                "--",
                "sh",
                "-c",
                "echo x > x",
            ])
            .output()
    };
    std::thread::scope(|s| {
        let a = s.spawn(spawn);
        let b = s.spawn(spawn);
        for h in [a, b] {
            let out = h.join().unwrap().unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
        }
    });
}

#[test]
fn concurrent_runs_keep_one_intact_chain_and_a_tamper_is_named() {
    let state = State::new();
    if state.sqlite_only("rows deleted or rewritten in state.db") {
        return;
    }
    two_concurrent_runs(&state);
    let ok = state.verify();
    assert!(ok.status.success(), "{}", stdout(&ok));
    assert!(stdout(&ok).contains("intact"));

    // Change one byte of one entry's body in the database.
    let db = rusqlite::Connection::open(state.path().join("state.db")).unwrap();
    let (seq, body): (i64, String) = db
        .query_row(
            "SELECT seq, body FROM audit WHERE kind = 'exited' ORDER BY seq LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let tampered = body.replacen("\"exit_code\":0", "\"exit_code\":1", 1);
    assert_ne!(tampered, body);
    db.execute(
        "UPDATE audit SET body = ?1 WHERE seq = ?2",
        rusqlite::params![tampered, seq],
    )
    .unwrap();
    drop(db);
    let bad = state.verify();
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stdout(&bad).contains(&format!("audit entry {seq}")),
        "{}",
        stdout(&bad)
    );
}

#[test]
fn deleting_the_tail_before_the_last_checkpoint_is_found() {
    let state = State::new();
    if state.sqlite_only("rows deleted or rewritten in state.db") {
        return;
    }
    two_concurrent_runs(&state);
    let db = rusqlite::Connection::open(state.path().join("state.db")).unwrap();
    let max: i64 = db
        .query_row("SELECT max(seq) FROM audit", [], |r| r.get(0))
        .unwrap();
    db.execute("DELETE FROM audit WHERE seq >= ?1", [max - 2])
        .unwrap();
    drop(db);
    let bad = state.verify();
    assert_eq!(bad.status.code(), Some(1), "{}", stdout(&bad));
    assert!(
        stdout(&bad).contains(&format!("audit entry {}", max - 2)),
        "{}",
        stdout(&bad)
    );
}

/// `policy check` answers refuse to a force-push to main and appends one
/// `policy_decision` entry (no checkpoint).
fn refused_check(state: &State) {
    let mut c = state.cmd();
    c.args([
        "policy",
        "check",
        "--actor",
        "agent-a",
        "--tool",
        "push",
        "--args-json",
        "-",
    ]);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"remote":"origin","ref":"refs/heads/main","force":true,"delete":false,"commit":"c"}"#)
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(2));
}

#[test]
fn deleting_the_tail_after_the_last_checkpoint_is_found_by_the_head() {
    let state = State::new();
    if state.sqlite_only("rows deleted or rewritten in state.db") {
        return;
    }
    // A policy row (with its checkpoint), then entries no checkpoint follows.
    assert!(state.run(&["freeze", "--why", "x"]).status.success());
    for _ in 0..5 {
        refused_check(&state);
    }
    assert!(state.verify().status.success());
    let db = rusqlite::Connection::open(state.path().join("state.db")).unwrap();
    let max: i64 = db
        .query_row("SELECT max(seq) FROM audit", [], |r| r.get(0))
        .unwrap();
    for removed in 1..=2 {
        db.execute("DELETE FROM audit WHERE seq = ?1", [max + 1 - removed])
            .unwrap();
        let bad = state.verify();
        assert_eq!(bad.status.code(), Some(1), "{}", stdout(&bad));
        assert!(
            stdout(&bad).contains(&format!(
                "audit entry {}: missing, but the chain's head names entry {max} (log truncated)",
                max + 1 - removed
            )),
            "{}",
            stdout(&bad)
        );
    }
}

#[test]
fn verify_beside_concurrent_appenders_never_cries_wolf() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let state = State::new();
    assert!(state.run(&["owner", "init"]).status.success());
    let key = state.path().join("owner.key");
    let stop = AtomicBool::new(false);
    let verifies = 120;
    let alarms = std::thread::scope(|s| {
        // Policy rows, each with a checkpoint written after its commit.
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let _ = state.run(&["freeze", "--why", "loop"]);
                let _ = state.run(&["thaw", "--owner-key-file", key.to_str().unwrap()]);
            }
        });
        // Entries with only the head written after them.
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    refused_check(&state);
                }
            });
        }
        let mut alarms = Vec::new();
        for _ in 0..verifies {
            let out = state.verify();
            if !out.status.success() {
                alarms.push(format!("{}{}", stdout(&out), stderr(&out)));
            }
        }
        stop.store(true, Ordering::SeqCst);
        alarms
    });
    assert!(
        alarms.is_empty(),
        "{} of {verifies} verifies cried wolf: {alarms:?}",
        alarms.len()
    );
    // The appenders did append meanwhile, and the chain is whole.
    let out = state.verify();
    assert!(out.status.success(), "{}", stdout(&out));
    let n = state.audit_entries().len();
    assert!(n > 20, "only {n} entries were appended");
}
