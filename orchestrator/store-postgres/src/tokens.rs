//! The model gateway's token ledgers on PostgreSQL (`model_tokens`, in
//! migration 1), with the SQLite `TokenLedger`'s operations and meaning:
//! one row per run and night, tokens used (settled) and reserved (calls in
//! flight). Each reservation and settlement is one transaction under one
//! advisory lock (as SQLite's write lock serialises them), so the decision
//! ([`tokens::reserve`]) sees both ledgers as they are and concurrent calls
//! from any number of connections never reserve past a cap
//! (`tests/tokens.rs::concurrent_reservations_never_pass_the_fleet_cap`).
//! The lock is the ledgers' own, not the audit's: a reservation does not
//! queue behind an audit append.

use nightshift_core::tokens::{self, Ask, Grant, Ledger, Refusal};
use postgres::GenericClient;

use crate::{sql, PgError, PgStore};

/// Advisory lock key of the token ledgers ("tokens" in ASCII).
const TOKENS_LOCK: i64 = 0x746f_6b65_6e73;

fn ledger(c: &mut impl GenericClient, query: &str, key: &str) -> Result<Ledger, PgError> {
    let row = c
        .query_one(query, &[&key])
        .map_err(sql("reading the model token ledgers"))?;
    Ok(Ledger {
        used: row.get::<_, i64>(0).max(0) as u64,
        reserved: row.get::<_, i64>(1).max(0) as u64,
    })
}

/// The run's ledger (all nights) and the fleet's for `night`.
fn ledgers(
    c: &mut impl GenericClient,
    run: &str,
    night: &str,
) -> Result<(Ledger, Ledger), PgError> {
    Ok((
        ledger(
            c,
            "SELECT COALESCE(SUM(used), 0)::BIGINT, COALESCE(SUM(reserved), 0)::BIGINT FROM model_tokens WHERE run = $1",
            run,
        )?,
        ledger(
            c,
            "SELECT COALESCE(SUM(used), 0)::BIGINT, COALESCE(SUM(reserved), 0)::BIGINT FROM model_tokens WHERE night = $1",
            night,
        )?,
    ))
}

fn tokens_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PgStore {
    /// One reservation for a call of `run` in `night`: both ledgers read,
    /// the decision taken and the grant recorded in one transaction.
    pub fn reserve_tokens(
        &self,
        run: &str,
        night: &str,
        run_cap: u64,
        fleet_cap: u64,
        ask: Ask,
    ) -> Result<Result<Grant, Refusal>, PgError> {
        self.with(|c, _| {
            let mut tx = c
                .transaction()
                .map_err(sql("beginning a token reservation"))?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&TOKENS_LOCK])
                .map_err(sql("locking the model token ledgers"))?;
            let (of_run, of_fleet) = ledgers(&mut tx, run, night)?;
            let decision = tokens::reserve(of_run, run_cap, of_fleet, fleet_cap, ask);
            if let Ok(grant) = &decision {
                tx.execute(
                    "INSERT INTO model_tokens(run, night, used, reserved) VALUES ($1, $2, 0, $3)
                     ON CONFLICT(run, night) DO UPDATE SET reserved = model_tokens.reserved + $3",
                    &[&run, &night, &tokens_i64(grant.tokens)],
                )
                .map_err(sql("reserving model tokens"))?;
            }
            tx.commit()
                .map_err(sql("committing a model token reservation"))?;
            Ok(decision)
        })
    }

    /// Settles a call that reserved `reserved` tokens in `night` with
    /// `actual` (`None`: the reservation is charged whole); the run's and
    /// the fleet's ledgers after it.
    pub fn settle_tokens(
        &self,
        run: &str,
        night: &str,
        reserved: u64,
        actual: Option<u64>,
    ) -> Result<(Ledger, Ledger), PgError> {
        let charged = tokens_i64(actual.unwrap_or(reserved));
        let reserved = tokens_i64(reserved);
        self.with(|c, _| {
            let mut tx = c
                .transaction()
                .map_err(sql("beginning a token settlement"))?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&TOKENS_LOCK])
                .map_err(sql("locking the model token ledgers"))?;
            tx.execute(
                "INSERT INTO model_tokens(run, night, used, reserved) VALUES ($1, $2, $3, 0)
                 ON CONFLICT(run, night) DO UPDATE SET used = model_tokens.used + $3,
                     reserved = GREATEST(model_tokens.reserved - $4, 0)",
                &[&run, &night, &charged, &reserved],
            )
            .map_err(sql("settling model tokens"))?;
            let after = ledgers(&mut tx, run, night)?;
            tx.commit()
                .map_err(sql("committing a model token settlement"))?;
            Ok(after)
        })
    }

    /// A run's ledger (all nights).
    pub fn run_tokens(&self, run: &str) -> Result<Ledger, PgError> {
        self.with(|c, _| Ok(ledgers(c, run, "")?.0))
    }
}
