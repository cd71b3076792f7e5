//! The model gateway: the one channel from a sandbox to a language model.
//!
//! A run whose state has a `models.toml` gets a second socket in its door,
//! `STATE/doors/<run>/model.sock` (`/run/nightshift/model.sock` inside the
//! sandbox, read-only mount: `orchestrator/attest/tests/fixtures.rs::writable_door_fails_mounts`). The static relay `nightshift-relay` (in the
//! door's `bin/`, started by the lease wrapper before the agent) listens on
//! the sandbox's own loopback at [`RELAY_PORT`] and forwards each
//! connection to that socket, so that every usual client reaches it over
//! plain HTTP with a placeholder key ([`sandbox_env`]).
//!
//! Invariants (each held by the part named):
//! - Only the owner's endpoints are reached: a request is routed by its
//!   shape and model to an endpoint of `models.toml`, or refused with a
//!   text the agent reads (`route`). The agent never names a host or a path
//!   on it (`route::tests::a_route_always_matches_family_and_glob`,
//!   `tests/tests/gateway.rs::unconfigured_paths_methods_and_models_are_refused_readably`).
//! - Nor does the provider reach anything for it: a request carries only
//!   what a typed allowlist per shape understands (`request`): no URL or
//!   file source, MCP server, server-side tool (unless the owner enabled it
//!   and the run's content is public), stored state, or unlisted beta
//!   (`request::tests::every_way_out_is_refused_in_each_shape`,
//!   `tests/tests/gateway.rs::every_way_out_through_the_gateway_is_refused_and_nothing_reaches_the_endpoint`).
//! - The real key is read from its file at each call and put in that call's
//!   request only; whatever credential the sandbox sent is dropped, and only
//!   an allowlist of headers is forwarded (`serve`, `key`;
//!   `tests/tests/gateway.rs::three_shapes_stream_and_not_through_the_relay_and_the_key_stays_outside`).
//! - TLS with certificate verification against the system's roots (rustls,
//!   ring); plain `http://` only to a loopback endpoint (`models`,
//!   `upstream`; `models::tests::base_urls`,
//!   `tests/tests/gateway.rs::tls_to_an_endpoint_is_verified_and_its_ca_file_trusted_for_it_alone`).
//! - Tokens are reserved for the worst case (input bytes, images, output
//!   bound times the choices asked for) before forwarding, against the
//!   run's cap and the fleet's night budget at once, in one store
//!   transaction; settled from the usage the response reports (`tokens`,
//!   `sse`, `store::TokenLedger`). Past a cap, calls are refused and
//!   the run is told to end ([`GatewayHandle::cap_reached`]).
//! - Streams pass through as their events arrive; every call is bounded in
//!   request size, event length, response size, time to first byte, idle
//!   time and total time (`models::Limits`); long silences get SSE comments.
//! - Each call is one observed-state audit entry (`ModelCall`), with digests
//!   and sizes, never content
//!   (`tests/tests/gateway.rs::three_shapes_stream_and_not_through_the_relay_and_the_key_stays_outside`).

pub mod key;
pub mod models;
pub mod request;
pub mod route;
pub mod serve;
pub mod sse;
pub use nightshift_core::tokens;
pub mod upstream;

pub use serve::{open, CapReached, GatewayHandle};

/// How long a run whose token budget is spent lives on (its agent reads the
/// refusal) before it is killed.
pub const CAP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The model socket's name in the door.
pub const SOCKET: &str = "model.sock";
pub use nightshift_core::sandbox::{sandbox_env, PLACEHOLDER_KEY, RELAY, RELAY_PORT};

/// The run's models configuration, when its state has one.
pub fn load(root: &std::path::Path) -> Result<Option<models::Models>, models::ModelsError> {
    models::Models::load(&root.join(models::FILE))
}

/// A run's model calls, summed from its `model_call` audit entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CallsSummary {
    pub calls: u64,
    /// Calls refused by the gateway (never forwarded, or not answered).
    pub refused: u64,
    /// Forwarded calls whose response reported no usage (charged whole).
    pub without_usage: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    /// Tokens charged against the run's cap.
    pub charged_tokens: u64,
    /// The run's cap, as the last call saw it.
    pub token_cap: Option<u64>,
}

/// Sums the bodies of a run's `model_call` entries.
pub fn summarize<'a>(bodies: impl IntoIterator<Item = &'a serde_json::Value>) -> CallsSummary {
    let mut s = CallsSummary::default();
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    for b in bodies {
        s.calls += 1;
        let outcome = b["outcome"].as_str().unwrap_or_default();
        if outcome.starts_with("refused:") {
            s.refused += 1;
        }
        if outcome == "no_usage" {
            s.without_usage += 1;
        }
        s.input_tokens += n(&b["input_tokens"]);
        s.output_tokens += n(&b["output_tokens"]);
        s.cached_tokens += n(&b["cached_tokens"]);
        s.charged_tokens += n(&b["charged_tokens"]);
        if let Some(cap) = b["run_token_cap"].as_u64() {
            s.token_cap = Some(cap);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn summaries_add_up_calls_and_tokens() {
        let calls = [
            json!({"outcome": "ok", "input_tokens": 10, "output_tokens": 5, "cached_tokens": 2, "charged_tokens": 15, "run_token_cap": 100}),
            json!({"outcome": "no_usage", "charged_tokens": 40, "run_token_cap": 100}),
            json!({"outcome": "refused:model", "charged_tokens": 0, "run_token_cap": 100}),
        ];
        let s = super::summarize(&calls);
        assert_eq!((s.calls, s.refused, s.without_usage), (3, 1, 1));
        assert_eq!(
            (s.input_tokens, s.output_tokens, s.cached_tokens),
            (10, 5, 2)
        );
        assert_eq!((s.charged_tokens, s.token_cap), (55, Some(100)));
    }
}
