//! Verifies a state's audit chain one of three ways, for the benchmark
//! (`scripts/bench-verify.sh`, which measures each as its own process):
//! `snapshot` reads the whole chain and then verifies it (how `audit
//! verify` worked before it streamed), `parsed` streams it with every
//! body parsed and hashed from the parsed value, in batches on every core
//! (how it streamed before bodies were hashed from their stored text),
//! `stream` walks it as it is read
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
        "parsed" => parsed(&store),
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

/// The streaming walk as it was before `raw_entry`: every entry parsed,
/// judged in batches of 4,096 on every core.
fn parsed(store: &Store) -> Result<orchestrator_audit::Verified, orchestrator_audit::VerifyError> {
    use nightshift_core::state_store::AuditVisitor;
    use orchestrator_audit::{Checkpoint, Entry, StreamVerifier, VerifyError};
    struct V {
        log: orchestrator_audit::LogId,
        state: Option<Result<StreamVerifier, VerifyError>>,
        batch: Vec<Entry>,
    }
    impl V {
        fn flush(&mut self) -> bool {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let ok = match &mut self.state {
                Some(Ok(v)) => v.push_batch(&self.batch, threads),
                _ => return false,
            };
            self.batch.clear();
            match ok {
                Ok(()) => true,
                Err(e) => {
                    self.state = Some(Err(e));
                    false
                }
            }
        }
    }
    impl AuditVisitor for V {
        fn begin(&mut self, head: Option<Checkpoint>, checkpoints: Vec<Checkpoint>) -> bool {
            self.state = Some(StreamVerifier::new(&self.log, checkpoints, head));
            true
        }
        fn entry(&mut self, entry: Entry) -> bool {
            self.batch.push(entry);
            self.batch.len() < 4096 || self.flush()
        }
    }
    let mut v = V {
        log: store.log_id().clone(),
        state: None,
        batch: Vec::new(),
    };
    store.visit_audit(0, &mut v).expect("the store");
    v.flush();
    match v.state.expect("begun") {
        Ok(s) => s.finish(),
        Err(e) => Err(e),
    }
}
