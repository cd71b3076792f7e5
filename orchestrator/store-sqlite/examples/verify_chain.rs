//! Verifies a state's audit chain one of two ways, for the benchmark
//! (`scripts/bench-verify.sh`, which measures each as its own process):
//! `snapshot` reads the whole chain and then verifies it (how `audit
//! verify` worked before it streamed), `stream` walks it as it is read
//! ([`nightshift_core::state_store::verify_log`], what `audit verify`
//! does). Prints the verdict and the time. Not a test.

use std::time::Instant;

use nightshift_core::state_store::{verify_log, AuditLog, StatePaths};
use nightshift_store_sqlite::store::Store;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("a state directory"));
    let how = args.next().unwrap_or_else(|| "stream".into());
    let store = Store::open(StatePaths::new(dir)).expect("the store");
    let t = Instant::now();
    let verdict = match how.as_str() {
        "snapshot" => {
            let snap = store.audit_snapshot().expect("a snapshot");
            orchestrator_audit::verify_with_head(
                store.log_id(),
                &snap.entries,
                &snap.checkpoints,
                snap.head.as_ref(),
            )
        }
        _ => verify_log(&store).expect("the store"),
    };
    let took = t.elapsed();
    match verdict {
        Ok(v) => println!(
            "{how}: {} entries intact in {:.3} s",
            v.entries,
            took.as_secs_f64()
        ),
        Err(e) => println!("{how}: broken ({e}) in {:.3} s", took.as_secs_f64()),
    }
}
