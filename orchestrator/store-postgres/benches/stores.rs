//! SQLite and PostgreSQL side by side, through the same port: an audit
//! append, a queue of 10k acts (queueing them, reading the dashboard's
//! first page with the total, reading them all, moving some), and 1k runs
//! (saving them, listing them as the morning report does first).
//!
//! Both commit durably: SQLite with `synchronous = FULL` as the product
//! opens it, PostgreSQL on a server of this run's own with `fsync` and
//! `synchronous_commit` on (`scripts/pg.sh start --durable`), over its Unix
//! socket. Run with `cargo bench -p nightshift-store-postgres --bench
//! stores`; `NIGHTSHIFT_BENCH_ACTS` sets the queue's size (10000).

use std::time::{Duration, Instant};

use nightshift_core::audit_log::Event;
use nightshift_core::state_store::{RunRecord, StatePaths, StateStore};
use nightshift_store_postgres::{testing, PgStore};
use nightshift_store_sqlite::store::Store as SqliteStore;
use serde_json::json;

fn note(i: usize) -> Event {
    Event::RunEnded {
        status: format!("note {i}"),
        reason: None,
    }
}

fn per_op(total: Duration, n: usize) -> f64 {
    total.as_secs_f64() * 1e6 / n as f64
}

struct Figures {
    append_us: f64,
    queue_us: f64,
    page_ms: f64,
    all_ms: f64,
    move_us: f64,
    run_us: f64,
    runs_ms: f64,
}

fn measure(s: &mut dyn StateStore, acts: usize) -> Figures {
    let appends = 500;
    // Warm up (the first statements plan, the first pages are read).
    for i in 0..20 {
        s.append(None, &note(i), false).unwrap();
    }
    let t = Instant::now();
    for i in 0..appends {
        s.append(Some("bench"), &note(i), false).unwrap();
    }
    let append_us = per_op(t.elapsed(), appends);

    let pending = json!({ "state": "pending" });
    let approved = json!({ "state": "approved" });
    let t = Instant::now();
    for i in 0..acts {
        let id = format!("a{i:06}");
        s.put_act(
            &id,
            "bench",
            &json!({ "id": id, "door": "git", "destination": "origin" }),
            &pending,
            None,
            &note(i),
        )
        .unwrap();
    }
    let queue_us = per_op(t.elapsed(), acts);

    let rounds = 20;
    let t = Instant::now();
    for _ in 0..rounds {
        let (page, total) = s.acts_in_states(&["pending"], 0, 50).unwrap();
        assert_eq!((page.len(), total), (50.min(acts), acts as u64));
    }
    let page_ms = t.elapsed().as_secs_f64() * 1e3 / rounds as f64;

    let t = Instant::now();
    for _ in 0..3 {
        assert_eq!(s.acts(None).unwrap().len(), acts);
    }
    let all_ms = t.elapsed().as_secs_f64() * 1e3 / 3.0;

    let moves = 200.min(acts);
    let t = Instant::now();
    for i in 0..moves {
        let id = format!("a{i:06}");
        assert!(s
            .transition_act(&id, "bench", &pending, &approved, &note(i))
            .unwrap());
    }
    let move_us = per_op(t.elapsed(), moves);

    // What the morning report reads first: every run of the night.
    let runs = 1000;
    let t = Instant::now();
    for i in 0..runs {
        s.put_run(&RunRecord {
            id: format!("run-{i:05}"),
            created_at: format!("2026-01-01T00:{:02}:{:02}Z", i / 60 % 60, i % 60),
            repo: "/src/repo".into(),
            status: "exited 0".into(),
            command: vec!["agent".into(), "--task".into(), "fix the tests".into()],
            ..Default::default()
        })
        .unwrap();
    }
    let run_us = per_op(t.elapsed(), runs);
    let t = Instant::now();
    for _ in 0..5 {
        assert_eq!(s.runs().unwrap().len(), runs);
    }
    let runs_ms = t.elapsed().as_secs_f64() * 1e3 / 5.0;
    Figures {
        append_us,
        queue_us,
        page_ms,
        all_ms,
        move_us,
        run_us,
        runs_ms,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not run
    // the measurement (it would take minutes), only builds it.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let acts: usize = std::env::var("NIGHTSHIFT_BENCH_ACTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().unwrap();
    let mut sqlite = SqliteStore::open(StatePaths::new(dir.path().join("state"))).unwrap();
    let sq = measure(&mut sqlite, acts);
    let url = testing::fresh_database_on(&testing::durable_server_url());
    let mut pg = PgStore::connect(&url, dir.path()).unwrap();
    let pq = measure(&mut pg, acts);
    println!(
        "{:<34} {:>12} {:>12} {:>10}",
        "", "SQLite", "PostgreSQL", "PG/SQLite"
    );
    let row = |name: &str, unit: &str, a: f64, b: f64| {
        println!(
            "{:<34} {:>9.1} {unit} {:>9.1} {unit} {:>9.2}x",
            name,
            a,
            b,
            b / a
        );
    };
    row("audit append", "us", sq.append_us, pq.append_us);
    row(
        &format!("queue an act (of {acts})"),
        "us",
        sq.queue_us,
        pq.queue_us,
    );
    row("first page of 50 + total", "ms", sq.page_ms, pq.page_ms);
    row(&format!("read all {acts} acts"), "ms", sq.all_ms, pq.all_ms);
    row("move an act (approve)", "us", sq.move_us, pq.move_us);
    row("save a run (of 1000)", "us", sq.run_us, pq.run_us);
    row("list 1000 runs", "ms", sq.runs_ms, pq.runs_ms);
}
