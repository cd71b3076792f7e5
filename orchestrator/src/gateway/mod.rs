//! The model gateway: the one channel from a sandbox to a language model.
//!
//! A run whose state has a `models.toml` gets a second socket in its door,
//! `STATE/doors/<run>/model.sock` (`/run/nightshift/model.sock` inside the
//! sandbox, read-only mount). The static relay `nightshift-relay` (in the
//! door's `bin/`, started by the lease wrapper before the agent) listens on
//! the sandbox's own loopback at [`RELAY_PORT`] and forwards each
//! connection to that socket, so that every usual client reaches it over
//! plain HTTP with a placeholder key ([`sandbox_env`]).
//!
//! Invariants (each held by the part named):
//! - Only the owner's endpoints are reached: a request is routed by its
//!   shape and model to an endpoint of `models.toml`, or refused with a
//!   text the agent reads (`route`). The agent never names a host or a path
//!   on it.
//! - The real key is read from its file at each call and put in that call's
//!   request only; whatever credential the sandbox sent is dropped, and only
//!   an allowlist of headers is forwarded (`serve`, `key`).
//! - TLS with certificate verification against the system's roots (rustls,
//!   ring); plain `http://` only to a loopback endpoint (`models`,
//!   `upstream`).
//! - Tokens are reserved for the worst case before forwarding, against the
//!   run's cap and the fleet's night budget at once, in one store
//!   transaction; settled from the usage the response reports (`tokens`,
//!   `sse`, `store::TokenLedger`). Past a cap, calls are refused and
//!   the run is told to end ([`GatewayHandle::cap_reached`]).
//! - Streams pass through as their events arrive; every call is bounded in
//!   request size, event length, response size, time to first byte, idle
//!   time and total time (`models::Limits`); long silences get SSE comments.
//! - Each call is one observed-state audit entry (`ModelCall`), with digests
//!   and sizes, never content.

pub mod key;
pub mod models;
pub mod request;
pub mod route;
pub mod serve;
pub mod sse;
pub mod tokens;
pub mod upstream;

pub use serve::{open, CapReached, GatewayHandle};

/// How long a run whose token budget is spent lives on (its agent reads the
/// refusal) before it is killed.
pub const CAP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The model socket's name in the door.
pub const SOCKET: &str = "model.sock";
/// The port the relay listens on inside every sandbox (on 127.0.0.1).
pub const RELAY_PORT: u16 = 7878;
/// The key every client in the sandbox is given: SDKs refuse to start
/// without one. It opens nothing; the gateway drops it.
pub const PLACEHOLDER_KEY: &str = "nightshift-model-gateway";
/// The relay's name in the door's `bin/`.
pub const RELAY: &str = "nightshift-relay";

/// The environment that points the usual clients at the relay.
pub fn sandbox_env(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1")),
        ("OPENAI_API_KEY", PLACEHOLDER_KEY.to_string()),
        ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
        ("ANTHROPIC_API_KEY", PLACEHOLDER_KEY.to_string()),
        ("ANTHROPIC_AUTH_TOKEN", PLACEHOLDER_KEY.to_string()),
        (
            "NIGHTSHIFT_MODEL_GATEWAY",
            format!("http://127.0.0.1:{port}"),
        ),
    ]
}

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
