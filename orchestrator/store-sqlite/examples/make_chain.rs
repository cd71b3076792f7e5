//! Makes a state whose audit chain holds `N` sealed entries (default one
//! million) for benchmarking `nightshift audit verify`: the store made by
//! [`Store::open`] (its log id, schema and files), then the entries sealed
//! with the log's id and written in one transaction, with a checkpoint
//! every 100 entries and the head, as appends would leave them. The bodies
//! are shaped as the product's own (door requests, acts, run starts and
//! ends). Run: `cargo run --release -p nightshift-store-sqlite --example
//! make_chain -- STATE_DIR [N]` (`scripts/bench-verify.sh`). Not a test.

use std::io::Write;

use nightshift_core::state_store::{AuditLog, StatePaths};
use nightshift_store_sqlite::store::Store;
use serde_json::{json, Map, Value};

fn body(i: u64) -> (&'static str, Option<String>, Map<String, Value>) {
    let run = format!("01jrun{:020}", i / 11);
    let v = match i % 11 {
        0 => {
            json!({"repo": "/srv/repo", "base_commit": format!("{:040x}", i), "image": "nightshift-sandbox:b0547dc9f25ccb9b"})
        }
        10 => json!({"status": "exited 0", "reason": null}),
        k if k % 2 == 0 => json!({"door": "push", "verdict": "queued", "act": format!("a{i:010}"),
            "destination": "origin", "ref": format!("refs/heads/agent/{i}"), "rules": ["ask-before-push"]}),
        _ => {
            json!({"act": format!("a{i:010}"), "transition": "approved", "fields": {"by": "owner", "digest": format!("sha256:{:064x}", i)}})
        }
    };
    let kind = match i % 11 {
        0 => "run_started",
        10 => "run_ended",
        k if k % 2 == 0 => "door_request",
        _ => "act",
    };
    let Value::Object(m) = v else { unreachable!() };
    (kind, Some(run), m)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("a state directory"));
    let n: u64 = args
        .next()
        .map(|s| s.parse().expect("N"))
        .unwrap_or(1_000_000);
    let paths = StatePaths::new(dir.clone());
    let log = {
        let store = Store::open(paths.clone()).expect("the store");
        store.log_id().clone()
    };
    let mut conn = rusqlite::Connection::open(paths.db()).expect("state.db");
    let tx = conn.transaction().expect("a transaction");
    let mut checkpoints = std::io::BufWriter::new(
        std::fs::File::create(paths.checkpoints()).expect("audit.checkpoints"),
    );
    let mut last: Option<orchestrator_audit::Entry> = None;
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO audit(seq, time, kind, run, body, prev, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .expect("insert");
        for i in 1..=n {
            let (kind, run, b) = body(i);
            let time = format!(
                "2026-12-06T{:02}:{:02}:{:02}.{:06}Z",
                (i / 3_600_000) % 24,
                (i / 60_000) % 60,
                (i / 1000) % 60,
                i % 1_000_000
            );
            let e = orchestrator_audit::seal(&log, last.as_ref(), &time, kind, run.as_deref(), b)
                .expect("seal");
            insert
                .execute(rusqlite::params![
                    e.seq as i64,
                    e.time,
                    e.kind,
                    e.run,
                    serde_json::to_string(&e.body).unwrap(),
                    e.prev,
                    e.hash
                ])
                .expect("insert");
            if i % 100 == 0 {
                serde_json::to_writer(&mut checkpoints, &orchestrator_audit::checkpoint(&e))
                    .unwrap();
                checkpoints.write_all(b"\n").unwrap();
            }
            last = Some(e);
        }
    }
    tx.commit().expect("commit");
    checkpoints.flush().unwrap();
    if let Some(e) = &last {
        std::fs::write(
            paths.audit_head(),
            serde_json::to_vec(&orchestrator_audit::checkpoint(e)).unwrap(),
        )
        .unwrap();
    }
    eprintln!("{n} entries in {}", dir.display());
}
