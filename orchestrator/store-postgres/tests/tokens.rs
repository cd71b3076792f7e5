//! The token ledgers on PostgreSQL: concurrent reservations from several
//! connections never pass a cap, and settling replaces a reservation.

use nightshift_core::tokens::{Ask, Ledger};
use nightshift_store_postgres::{testing, PgStore};

fn ask() -> Ask {
    Ask {
        input_bound: 100,
        requested_output: Some(900),
        choices: 1,
    }
}

#[test]
fn concurrent_reservations_never_pass_the_fleet_cap() {
    let url = testing::fresh_database();
    let dir = std::env::temp_dir();
    let fleet_cap = 10_000;
    let barrier = std::sync::Barrier::new(4);
    let granted: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (url, dir, barrier) = (&url, &dir, &barrier);
                scope.spawn(move || {
                    let s = PgStore::connect(url, dir).unwrap();
                    barrier.wait();
                    let mut granted = 0;
                    for _ in 0..6 {
                        let d = s
                            .reserve_tokens(&format!("r{t}"), "n1", 1_000_000, fleet_cap, ask())
                            .unwrap();
                        if let Ok(g) = d {
                            assert_eq!(g.tokens, 1000);
                            granted += g.tokens;
                        }
                    }
                    granted
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(
        granted, fleet_cap,
        "reservations passed (or fell short of) the cap"
    );
    let s = PgStore::connect(&url, &dir).unwrap();
    let (run, fleet) = s.settle_tokens("r0", "n1", 1000, Some(10)).unwrap();
    assert_eq!(
        fleet,
        Ledger {
            used: 10,
            reserved: 9000
        }
    );
    assert_eq!(run.used, 10);
    assert_eq!(s.run_tokens("r0").unwrap(), run);
    // A settlement with no usage seen charges the whole reservation.
    let (_, fleet) = s.settle_tokens("r1", "n1", 1000, None).unwrap();
    assert_eq!(
        fleet,
        Ledger {
            used: 1010,
            reserved: 8000
        }
    );
}
