//! `serve`'s Prometheus metrics: what the store holds (runs by outcome,
//! cap kills by cap, acts by state, model tokens), taken afresh at each
//! scrape ([`Snapshot`]), and the latencies this process measured at its
//! adapters since it started (the door's answers, the model gateway's
//! calls), encoded by `prometheus-client` in the text exposition
//! (OpenMetrics 1.0).
//!
//! Invariants:
//! - Every label value is a `&'static str` from a closed set the code
//!   names (an outcome, a cap, an act state, a door, a call's class): no
//!   value an agent or a request chose can become a label, so a hostile
//!   name can neither forge a series nor grow the scrape without bound
//!   ([`door_label`] and [`call_label`] map anything else to `other`;
//!   `tests::labels_come_from_closed_sets`).
//! - Measuring is an atomic update of a histogram this process holds: no
//!   lock is taken and no I/O is done where the door or the gateway answers.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The doors a latency is recorded for (`malformed`: a request that never
/// became one).
pub const DOORS: [&str; 7] = [
    "push",
    "pull_request",
    "notify",
    "ask",
    "policy_check",
    "malformed",
    "other",
];

/// The classes of a model call's outcome.
pub const CALLS: [&str; 4] = ["ok", "refused", "error", "other"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DoorLabels {
    door: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapLabels {
    cap: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

type Latencies<L> = Family<L, Histogram, fn() -> Histogram>;

fn door_histogram() -> Histogram {
    // 1 ms to about 65 s: a policy check answers in milliseconds, a push
    // with a large pack in seconds.
    Histogram::new(exponential_buckets(0.001, 4.0, 9))
}

fn call_histogram() -> Histogram {
    // 10 ms to about 20 min: model calls stream for minutes.
    Histogram::new(exponential_buckets(0.01, 3.0, 12))
}

struct Process {
    door: Latencies<DoorLabels>,
    gateway: Latencies<CallLabels>,
}

fn process() -> &'static Process {
    static P: OnceLock<Process> = OnceLock::new();
    P.get_or_init(|| {
        let p = Process {
            door: Family::new_with_constructor(door_histogram),
            gateway: Family::new_with_constructor(call_histogram),
        };
        // Every series from the start (the label sets are closed), so a
        // scraper sees them at zero before the first request.
        for door in DOORS {
            let _ = p.door.get_or_create(&DoorLabels { door });
        }
        for outcome in CALLS {
            let _ = p.gateway.get_or_create(&CallLabels { outcome });
        }
        p
    })
}

/// The door's name as a label: one of [`DOORS`].
pub fn door_label(door: &str) -> &'static str {
    DOORS
        .iter()
        .find(|d| **d == door)
        .copied()
        .unwrap_or("other")
}

/// A model call's outcome (`ok`, `refused:<kind>`, `no_usage`, ...) as a
/// label: one of [`CALLS`].
pub fn call_label(outcome: &str) -> &'static str {
    if outcome == "ok" {
        "ok"
    } else if outcome.starts_with("refused") {
        "refused"
    } else if outcome.is_empty() {
        "other"
    } else {
        "error"
    }
}

/// The door answered a request of `door` (a name, mapped by
/// [`door_label`]) after `seconds` from its connection.
pub fn observe_door(door: &str, seconds: f64) {
    process()
        .door
        .get_or_create(&DoorLabels {
            door: door_label(door),
        })
        .observe(seconds);
}

/// The model gateway ended a call with `outcome` after `seconds`.
pub fn observe_model_call(outcome: &str, seconds: f64) {
    process()
        .gateway
        .get_or_create(&CallLabels {
            outcome: call_label(outcome),
        })
        .observe(seconds);
}

/// What the store holds at a scrape, every key a fixed name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Runs by outcome (`summary::outcome`'s names; `running` included).
    pub runs: BTreeMap<&'static str, u64>,
    /// Runs a cap killed, by cap (`summary::cap`'s names).
    pub cap_kills: BTreeMap<&'static str, u64>,
    /// Acts by queue state.
    pub acts: BTreeMap<&'static str, u64>,
    /// Model tokens over every call: `input`, `output`, `cached`, `charged`.
    pub tokens: BTreeMap<&'static str, u64>,
    /// Model calls recorded in the audit.
    pub model_calls: u64,
}

/// The exposition of `snapshot` and of this process's latencies.
pub fn render(snapshot: &Snapshot) -> String {
    let mut registry = Registry::with_prefix("nightshift");
    let runs = Family::<OutcomeLabels, Gauge>::default();
    for (outcome, n) in &snapshot.runs {
        runs.get_or_create(&OutcomeLabels { outcome })
            .set(*n as i64);
    }
    registry.register("runs", "Runs in the state, by outcome", runs);
    let caps = Family::<CapLabels, Gauge>::default();
    for (cap, n) in &snapshot.cap_kills {
        caps.get_or_create(&CapLabels { cap }).set(*n as i64);
    }
    registry.register("cap_kills", "Runs a cap killed, by cap", caps);
    let acts = Family::<StateLabels, Gauge>::default();
    for (state, n) in &snapshot.acts {
        acts.get_or_create(&StateLabels { state }).set(*n as i64);
    }
    registry.register("acts", "Acts in the queue, by state", acts);
    let tokens = Family::<KindLabels, Counter>::default();
    for (kind, n) in &snapshot.tokens {
        tokens.get_or_create(&KindLabels { kind }).inc_by(*n);
    }
    registry.register(
        "model_tokens",
        "Model tokens of every call through the gateway, by kind",
        tokens,
    );
    let calls = Counter::<u64>::default();
    calls.inc_by(snapshot.model_calls);
    registry.register("model_calls", "Model calls through the gateway", calls);
    let p = process();
    registry.register(
        "door_request_duration_seconds",
        "Time from a door connection to its answer, by door (this process's doors, since it started)",
        p.door.clone(),
    );
    registry.register(
        "model_call_duration_seconds",
        "Time of a model call through the gateway, by outcome (this process's gateways, since it started)",
        p.gateway.clone(),
    );
    let mut out = String::new();
    // Writing into a String cannot fail; an encoding error would be ours.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::error!(error = %e, "encoding the metrics");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_come_from_closed_sets() {
        for hostile in ["push\"} 1\nnightshift_fake 2", "", "PUSH", "../x"] {
            assert!(DOORS.contains(&door_label(hostile)));
            assert!(CALLS.contains(&call_label(hostile)));
        }
        assert_eq!(door_label("push"), "push");
        assert_eq!(call_label("refused:model"), "refused");
        assert_eq!(call_label("idle_timeout"), "error");
    }

    #[test]
    fn the_exposition_holds_each_family_once_and_ends() {
        observe_door("push", 0.002);
        observe_door("hostile\n# EOF", 0.5);
        observe_model_call("ok", 1.5);
        let mut s = Snapshot::default();
        s.runs.insert("succeeded", 3);
        s.cap_kills.insert("wall-clock", 1);
        s.acts.insert("pending", 2);
        s.tokens.insert("charged", 66);
        s.model_calls = 2;
        let text = render(&s);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        for line in [
            "nightshift_runs{outcome=\"succeeded\"} 3",
            "nightshift_cap_kills{cap=\"wall-clock\"} 1",
            "nightshift_acts{state=\"pending\"} 2",
            "nightshift_model_tokens_total{kind=\"charged\"} 66",
            "nightshift_model_calls_total 2",
            "nightshift_door_request_duration_seconds_count{door=\"push\"} 1",
            "nightshift_door_request_duration_seconds_count{door=\"other\"} 1",
            "nightshift_model_call_duration_seconds_count{outcome=\"ok\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(!text.contains("hostile"));
    }
}
