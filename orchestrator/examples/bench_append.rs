//! The cost of one audit append, in process: open a fresh state, append N
//! entries one transaction each (as the door and `policy check` do), and
//! print the median and p99 in microseconds, with and without a
//! checkpoint. Run it on the disk the state lives on (BENCH_DIR, default
//! the system's temporary directory):
//!
//!   cargo run --release -p orchestrator --example bench_append [N]

use std::time::Instant;

use orchestrator::audit_log::Event;
use orchestrator::store::{StatePaths, Store};

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(500);
    let base = std::env::var_os("BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base)?;
    let mut store = Store::open(StatePaths::new(dir.path().join("state")))?;
    let event = Event::PolicyDecision {
        actor: Some("bench".into()),
        door: "push".into(),
        verdict: "ask".into(),
        rule: "ask-before-push".into(),
        escalated: false,
        stood_aside: Vec::new(),
        generation: "g".into(),
        digest: "0".repeat(64),
    };
    for (label, checkpoint) in [("append", false), ("append + checkpoint", true)] {
        let mut us = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            store.append(None, &event, checkpoint)?;
            us.push(t.elapsed().as_micros());
        }
        us.sort_unstable();
        println!(
            "| {label} | {} µs | {} µs |",
            us[n / 2],
            us[(n * 99 / 100).min(n - 1)]
        );
    }
    Ok(())
}
