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

/// `audit export`'s lines of a state, parsed, with the exit code.
fn export(state: &State, args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["audit", "export"];
    all.extend_from_slice(args);
    let out = state.run(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_ascii(), "{}", stdout(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn export_carries_the_chains_hashes_and_since_filters() {
    let state = State::new();
    let repo = make_repo();
    for _ in 0..2 {
        let out = state.run(&[
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "true",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    // Agent-influenced text in a body, through the store's port: a
    // terminal escape, a forged line and a bidi override.
    let hostile = "\u{1b}]0;pwned\u{7}\n{\"v\":1,\"seq\":1}\u{202e}";
    let mut store = state.stores().connect().unwrap();
    store
        .append(
            None,
            &orchestrator::audit_log::Event::ImportFailed {
                reason: hostile.into(),
                worktree: "w".into(),
            },
            false,
        )
        .unwrap();
    drop(store);
    assert!(state.verify().status.success());

    let chain = state.audit_entries();
    assert!(chain.len() > 10, "{}", chain.len());
    let lines = export(&state, &[]);
    let got: Vec<(u64, &str, &str)> = lines
        .iter()
        .map(|l| {
            assert_eq!(l["v"], 1);
            (
                l["seq"].as_u64().unwrap(),
                l["hash"].as_str().unwrap(),
                l["prev"].as_str().unwrap(),
            )
        })
        .collect();
    let want: Vec<(u64, &str, &str)> = chain
        .iter()
        .map(|e| (e.seq, e.hash.as_str(), e.prev.as_str()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(lines.last().unwrap()["body"]["reason"], hostile);

    let ocsf = export(&state, &["--format", "ocsf"]);
    let uids: Vec<&str> = ocsf
        .iter()
        .map(|l| l["metadata"]["uid"].as_str().unwrap())
        .collect();
    let hashes: Vec<&str> = chain.iter().map(|e| e.hash.as_str()).collect();
    assert_eq!(uids, hashes);
    assert!(ocsf.iter().any(|l| l["class_uid"] == 1007));

    // --since a seq: from that entry on.
    let mid = chain[chain.len() / 2].seq;
    let from: Vec<u64> = export(&state, &["--since", &mid.to_string()])
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(from, (mid..=chain.last().unwrap().seq).collect::<Vec<_>>());
    // --since a time: the entries at or after it (the second run's on).
    let second = chain
        .iter()
        .filter(|e| e.kind == "run_created")
        .nth(1)
        .unwrap();
    let t = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
    };
    let since = export(&state, &["--since", &second.time]);
    let want: Vec<u64> = chain
        .iter()
        .filter(|e| t(&e.time) >= t(&second.time))
        .map(|e| e.seq)
        .collect();
    assert!(!want.is_empty() && want.len() < chain.len());
    let got: Vec<u64> = since.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(got, want);

    // A bad --since is a usage error naming it.
    let bad = state.run(&["audit", "export", "--since", "last tuesday"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("--since"), "{}", stderr(&bad));
    assert!(bad.stdout.is_empty());
}
