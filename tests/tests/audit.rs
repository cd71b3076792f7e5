//! `nightshift audit verify` against a real store: intact after real runs
//! (also concurrent ones), and a tamper in the database is found and named.

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
