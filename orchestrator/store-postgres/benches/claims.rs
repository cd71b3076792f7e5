//! Claim latency: how long one dispatcher's `start_tasks` (the claim: the
//! admission decided over every task inside the transaction that moves
//! the chosen one to `starting` under a lease) takes, alone and with other
//! dispatchers claiming from the same queue at once, on PostgreSQL (a
//! durable server of this run's own, over its Unix socket) and SQLite.
//!
//! Each dispatcher claims one task a call, from a queue of `TASKS` (600)
//! queued tasks, until the queue is empty; every call's latency is kept
//! and p50/p99 printed per store and per number of dispatchers (1, 2, 3).
//! Run with `cargo bench -p nightshift-store-postgres --bench claims`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nightshift_core::state_store::{StatePaths, StateStore, StoredTask};
use nightshift_store_postgres::{testing, PgStore};
use nightshift_store_sqlite::store::Store as SqliteStore;

const TASKS: usize = 600;

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// One claim a call: the first queued task, while fewer than 1000 start.
fn first_queued(all: &[StoredTask]) -> Vec<(String, String)> {
    all.iter()
        .find(|t| t.state == "queued")
        .map(|t| vec![(t.id.clone(), "{}".to_string())])
        .unwrap_or_default()
}

fn run(open: &(dyn Fn() -> Box<dyn StateStore> + Sync), dispatchers: usize) -> (f64, f64, usize) {
    {
        let mut s = open();
        let tasks: Vec<(String, String)> = (0..TASKS)
            .map(|i| (format!("t{dispatchers}-{i:05}"), "{}".to_string()))
            .collect();
        s.insert_tasks(&tasks, "queued").unwrap();
    }
    let barrier = Arc::new(Barrier::new(dispatchers));
    let mut all: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..dispatchers)
            .map(|d| {
                let barrier = barrier.clone();
                scope.spawn(move || {
                    let mut s = open();
                    let mut times = Vec::new();
                    barrier.wait();
                    loop {
                        let t = Instant::now();
                        let got = s
                            .start_tasks(&format!("d{d}"), i64::MAX / 2, &mut first_queued)
                            .unwrap();
                        let took = t.elapsed();
                        if got.is_empty() {
                            // Nothing was left to take (or another won the
                            // last): done once the queue holds none queued.
                            if s.tasks().unwrap().iter().all(|t| t.state != "queued") {
                                break;
                            }
                            continue;
                        }
                        times.push(took);
                    }
                    times
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    all.sort();
    (percentile(&all, 0.5), percentile(&all, 0.99), all.len())
}

fn main() {
    // `cargo test --benches` builds it only; `cargo bench` measures.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let pg_server = testing::durable_server_url();
    println!("| store | dispatchers | claims | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    for dispatchers in [1, 2, 3] {
        let url = testing::fresh_database_on(&pg_server);
        let root = tempfile::tempdir().unwrap();
        let root_path = root.path().to_path_buf();
        let open_pg = move || -> Box<dyn StateStore> {
            Box::new(PgStore::connect(&url, &root_path).unwrap())
        };
        let (p50, p99, n) = run(&open_pg, dispatchers);
        println!("| PostgreSQL | {dispatchers} | {n} | {p50:.2} | {p99:.2} |");
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let open_sqlite = move || -> Box<dyn StateStore> {
            Box::new(SqliteStore::open(StatePaths::new(state.clone())).unwrap())
        };
        let (p50, p99, n) = run(&open_sqlite, dispatchers);
        println!("| SQLite | {dispatchers} | {n} | {p50:.2} | {p99:.2} |");
    }
}
