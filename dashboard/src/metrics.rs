//! `GET /metrics`: the store's figures at the scrape and this process's
//! latencies, as `nightshift_core::metrics` encodes them. Served behind the
//! dashboard's authentication (a session, as every page), or without it on
//! an address of its own (`serve --metrics-addr`, loopback unless
//! `--insecure-network`) where only `/metrics` answers
//! (`tests/tests/dashboard_api.rs::metrics_are_scraped_behind_authentication_or_on_their_own_address`).
//!
//! Invariant: every label value is a fixed name (`summary::outcome`,
//! `summary::cap`, [`ACT_STATES`]); nothing a run or an agent named
//! reaches the exposition
//! (`tests/tests/dashboard_api.rs::metrics_are_scraped_behind_authentication_or_on_their_own_address`).

use nightshift_core::metrics::Snapshot;
use nightshift_core::state_store::{StateStore, StoreError};
use nightshift_supervisor::summary;

/// The act queue's states (`deferred_queue::State::name`).
pub const ACT_STATES: [&str; 10] = [
    "pending",
    "approved",
    "executing",
    "awaiting_retry",
    "outcome_unknown",
    "stale",
    "rejected",
    "expired",
    "done",
    "failed",
];

/// What the store holds now.
pub fn snapshot(store: &dyn StateStore) -> Result<Snapshot, StoreError> {
    let mut s = Snapshot::default();
    for r in store.runs()? {
        *s.runs.entry(summary::outcome(&r.status)).or_default() += 1;
        if let Some(cap) = summary::cap(&r.status) {
            *s.cap_kills.entry(cap).or_default() += 1;
        }
    }
    for state in ACT_STATES {
        let (_, n) = store.acts_in_states(&[state], 0, 0)?;
        s.acts.insert(state, n);
    }
    let calls = store.bodies_of_kind_since("model_call", "")?;
    let t = nightshift_gateway::summarize(calls.iter().map(|(_, b)| b));
    s.tokens.insert("input", t.input_tokens);
    s.tokens.insert("output", t.output_tokens);
    s.tokens.insert("cached", t.cached_tokens);
    s.tokens.insert("charged", t.charged_tokens);
    s.model_calls = t.calls;
    Ok(s)
}
