//! The store is synchronous; the product calls it from plain threads, from
//! `spawn_blocking` and from inside async tasks. The client's own runtime
//! would panic on a runtime's thread (connecting, querying, and closing on
//! drop), so the store moves such calls.

use nightshift_core::audit_log::Event;
use nightshift_core::state_store::AuditLog;
use nightshift_store_postgres::{testing, PgStore};

fn note() -> Event {
    Event::RunEnded {
        status: "note".into(),
        reason: None,
    }
}

#[test]
fn a_store_called_inside_a_runtime_answers() {
    let url = testing::fresh_database();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let dir = std::env::temp_dir();
    // Connected and used on a worker thread, inside an async task.
    let n = rt.block_on(async {
        let mut s = PgStore::connect(&url, &dir).unwrap();
        s.append(None, &note(), false).unwrap();
        // And from spawn_blocking.
        tokio::task::spawn_blocking(move || {
            s.append(None, &note(), false).unwrap();
            s.entries().unwrap().len()
        })
        .await
        .unwrap()
    });
    assert_eq!(n, 2);
    // And inside a current-thread runtime's block_on, dropped there too.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = PgStore::connect(&url, &dir).unwrap();
        assert_eq!(s.entries().unwrap().len(), 2);
    });
}
