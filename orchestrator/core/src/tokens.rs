//! Token accounting (pure): reserve the worst case before a call, settle
//! from the usage the response reports after it.
//!
//! Invariants:
//! - A call is forwarded only with a reservation that fits what remains of
//!   BOTH the run's cap and the fleet's night budget: `used + reserved` never
//!   passes either cap through a reservation, however many calls are in
//!   flight (the store applies [`reserve`] and [`settle`] in one transaction
//!   each, so concurrent calls in any number of processes are serialised)
//!   (`tests::concurrent_reservations_never_overshoot`,
//!   `orchestrator/store-postgres/tests/tokens.rs::concurrent_reservations_never_pass_the_fleet_cap`,
//!   `tests/tests/gateway.rs::the_fleet_night_budget_holds_across_two_supervisors`).
//! - The reservation is the worst case: an upper bound of the input (the
//!   request body's size in bytes: no token is shorter than a byte of the
//!   JSON that carries it) plus the output bound, which is the request's own
//!   (`max_tokens`, `max_completion_tokens`, `max_output_tokens`) or
//!   [`DEFAULT_MAX_OUTPUT`], clamped to what remains, times the choices
//!   asked for (`n`: each choice may use the whole bound, and is billed);
//!   images add their worst case (`request::IMAGE_TOKENS`). The clamped
//!   bound is written into the request forwarded, so the endpoint itself
//!   stops there.
//! - Settling replaces the reservation by the usage reported; a response
//!   without usage keeps its whole reservation as used (never trusted to be
//!   cheaper than the worst case) (`tests::settling_without_usage_keeps_the_reservation`).
//! - A refusal says which budget and its figures. It is [`Refusal::Spent`]
//!   when even with nothing else in flight the call could not fit (the run is
//!   then killed for its cap), and [`Refusal::Held`] when only calls still in
//!   flight hold the tokens (the agent may retry once they settle)
//!   (`tests::spent_and_held_are_told_apart`).

use serde::Serialize;

/// The output bound given to a request that names none.
pub const DEFAULT_MAX_OUTPUT: u64 = 32_000;
/// The run's cap when neither `--max-tokens` nor `[caps] max_tokens` says.
pub const DEFAULT_RUN_CAP: u64 = 2_000_000;
/// The fleet's night budget when `[fleet] max_tokens_per_night` is absent.
pub const DEFAULT_FLEET_CAP: u64 = 20_000_000;

/// One budget's state: tokens settled and tokens reserved by calls in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Ledger {
    pub used: u64,
    pub reserved: u64,
}

impl Ledger {
    pub fn committed(&self) -> u64 {
        self.used.saturating_add(self.reserved)
    }

    pub fn remaining(&self, cap: u64) -> u64 {
        cap.saturating_sub(self.committed())
    }
}

/// Which budget decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Run,
    Fleet,
}

/// What one call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// An upper bound of the input tokens (the body's size).
    pub input_bound: u64,
    /// The output bound the request named, if any.
    pub requested_output: Option<u64>,
    /// Choices asked for (`n`): each may use the whole output bound.
    pub choices: u64,
}

/// A granted reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Grant {
    /// Tokens reserved (input bound + choices × output bound).
    pub tokens: u64,
    /// The output bound (per choice) to write into the forwarded request.
    pub max_output: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Refusal {
    /// The budget cannot hold this call even with nothing in flight.
    /// `needed`: the least the call reserves (its input's bound and one
    /// token out per choice), against `cap - used` left.
    Spent {
        scope: Scope,
        used: u64,
        cap: u64,
        needed: u64,
    },
    /// Calls in flight hold what this one needs.
    Held {
        scope: Scope,
        used: u64,
        reserved: u64,
        cap: u64,
        needed: u64,
    },
}

impl Refusal {
    pub fn scope(&self) -> Scope {
        match self {
            Refusal::Spent { scope, .. } | Refusal::Held { scope, .. } => *scope,
        }
    }

    /// A text for the agent.
    pub fn message(&self) -> String {
        let which = |s: &Scope| match s {
            Scope::Run => "this run's model token cap",
            Scope::Fleet => "the fleet's model token budget for the night",
        };
        match self {
            Refusal::Spent {
                scope,
                used,
                cap,
                needed,
            } => format!(
                "refused by nightshift: {} is spent (used {used} of {cap}): this call needs at least {needed} \
                 (its input's bound and its output), {} are left; the run is ending",
                which(scope),
                cap.saturating_sub(*used)
            ),
            Refusal::Held {
                scope,
                used,
                reserved,
                cap,
                needed,
            } => format!(
                "refused by nightshift: {} cannot hold this call while others are in flight (used {used}, reserved {reserved}, of {cap}; this call needs at least {needed}); retry when they finish",
                which(scope)
            ),
        }
    }
}

/// Decides one reservation against the run's and the fleet's ledgers.
pub fn reserve(
    run: Ledger,
    run_cap: u64,
    fleet: Ledger,
    fleet_cap: u64,
    ask: Ask,
) -> Result<Grant, Refusal> {
    // The smallest call: its input and one token out per choice.
    let choices = ask.choices.max(1);
    let need = ask.input_bound.saturating_add(choices);
    for (scope, ledger, cap) in [(Scope::Run, run, run_cap), (Scope::Fleet, fleet, fleet_cap)] {
        if cap.saturating_sub(ledger.used) < need {
            return Err(Refusal::Spent {
                scope,
                used: ledger.used,
                cap,
                needed: need,
            });
        }
        if ledger.remaining(cap) < need {
            return Err(Refusal::Held {
                scope,
                used: ledger.used,
                reserved: ledger.reserved,
                cap,
                needed: need,
            });
        }
    }
    let remaining = run.remaining(run_cap).min(fleet.remaining(fleet_cap));
    let room = remaining - ask.input_bound;
    let max_output = ask
        .requested_output
        .unwrap_or(DEFAULT_MAX_OUTPUT)
        .clamp(1, room / choices);
    Ok(Grant {
        tokens: ask.input_bound + choices * max_output,
        max_output,
    })
}

/// The ledger after a reservation of `grant` was taken.
pub fn take(ledger: Ledger, grant: Grant) -> Ledger {
    Ledger {
        used: ledger.used,
        reserved: ledger.reserved.saturating_add(grant.tokens),
    }
}

/// The ledger after a call holding `reserved` settled with `actual` tokens
/// (`None`: no usage seen, the reservation is kept as used).
pub fn settle(ledger: Ledger, reserved: u64, actual: Option<u64>) -> Ledger {
    Ledger {
        used: ledger.used.saturating_add(actual.unwrap_or(reserved)),
        reserved: ledger.reserved.saturating_sub(reserved),
    }
}

/// Whether a budget is spent: no call of the smallest size fits any more.
pub fn spent(ledger: Ledger, cap: u64) -> bool {
    cap.saturating_sub(ledger.used) < 2
}

/// The night a moment belongs to: nights run from noon UTC to noon UTC and
/// are named by the date they start on.
pub fn night_of(unix_seconds: i64) -> String {
    let shifted = unix_seconds - 12 * 3600;
    let t = time::OffsetDateTime::from_unix_timestamp(shifted)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let d = t.date();
    format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NONE: Ledger = Ledger {
        used: 0,
        reserved: 0,
    };

    #[test]
    fn output_is_clamped_to_what_remains() {
        let g = reserve(
            NONE,
            1000,
            NONE,
            10_000,
            Ask {
                input_bound: 400,
                requested_output: Some(4096),
                choices: 1,
            },
        )
        .unwrap();
        assert_eq!((g.tokens, g.max_output), (1000, 600));
        let g = reserve(
            NONE,
            100_000,
            Ledger {
                used: 9_000,
                reserved: 0,
            },
            10_000,
            Ask {
                input_bound: 400,
                requested_output: None,
                choices: 1,
            },
        )
        .unwrap();
        assert_eq!(g.max_output, 600, "the fleet's remainder binds too");
    }

    #[test]
    fn each_choice_is_reserved_its_whole_bound() {
        let ask = Ask {
            input_bound: 100,
            requested_output: Some(4096),
            choices: 128,
        };
        let g = reserve(NONE, 5000, NONE, 1_000_000, ask).unwrap();
        assert_eq!(g.max_output, 38, "(5000 - 100) / 128");
        assert_eq!(g.tokens, 100 + 128 * 38);
        let used = Ledger {
            used: 4_850,
            reserved: 0,
        };
        assert!(reserve(used, 5000, NONE, 1_000_000, ask).is_err());
    }

    #[test]
    fn spent_and_held_are_told_apart() {
        let ask = Ask {
            input_bound: 100,
            requested_output: Some(10),
            choices: 1,
        };
        let r = reserve(
            Ledger {
                used: 950,
                reserved: 0,
            },
            1000,
            NONE,
            10_000,
            ask,
        )
        .unwrap_err();
        assert!(matches!(
            r,
            Refusal::Spent {
                scope: Scope::Run,
                used: 950,
                cap: 1000,
                ..
            }
        ));
        let r = reserve(
            Ledger {
                used: 500,
                reserved: 450,
            },
            1000,
            NONE,
            10_000,
            ask,
        )
        .unwrap_err();
        assert!(matches!(
            r,
            Refusal::Held {
                scope: Scope::Run,
                ..
            }
        ));
        let r = reserve(
            NONE,
            1000,
            Ledger {
                used: 9_990,
                reserved: 0,
            },
            10_000,
            ask,
        )
        .unwrap_err();
        assert_eq!(r.scope(), Scope::Fleet);
        assert!(
            r.message().contains("used 9990 of 10000"),
            "{}",
            r.message()
        );
    }

    #[test]
    fn a_spent_budget_says_what_the_refused_call_needed_against_what_was_left() {
        let ask = Ask {
            input_bound: 700,
            requested_output: Some(100),
            choices: 1,
        };
        let r = reserve(
            Ledger {
                used: 310,
                reserved: 0,
            },
            1000,
            NONE,
            10_000,
            ask,
        )
        .unwrap_err();
        assert_eq!(
            r,
            Refusal::Spent {
                scope: Scope::Run,
                used: 310,
                cap: 1000,
                needed: 701
            }
        );
        let m = r.message();
        assert!(
            m.contains("used 310 of 1000")
                && m.contains("needs at least 701")
                && m.contains("690 are left"),
            "{m}"
        );
    }

    #[test]
    fn settling_without_usage_keeps_the_reservation() {
        let l = take(
            NONE,
            Grant {
                tokens: 300,
                max_output: 100,
            },
        );
        assert_eq!(
            settle(l, 300, None),
            Ledger {
                used: 300,
                reserved: 0
            }
        );
        assert_eq!(
            settle(l, 300, Some(42)),
            Ledger {
                used: 42,
                reserved: 0
            }
        );
    }

    #[test]
    fn nights_run_noon_to_noon() {
        // 2026-12-01T11:59:59Z belongs to the night of 2026-11-30.
        assert_eq!(night_of(1_796_126_399), "2026-11-30");
        assert_eq!(night_of(1_796_126_400), "2026-12-01");
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Call `run` asks for (input, output).
        Reserve(usize, u64, Option<u64>, u64),
        /// The `i`th call in flight settles with this fraction of its
        /// reservation (None: no usage).
        Settle(usize, Option<u8>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                0..3usize,
                0..400u64,
                proptest::option::of(0..2000u64),
                1..200u64
            )
                .prop_map(|(r, i, o, n)| Op::Reserve(r, i, o, n)),
            (0..16usize, proptest::option::of(0..=100u8)).prop_map(|(i, f)| Op::Settle(i, f)),
        ]
    }

    proptest! {
        /// Three runs sharing a fleet, their calls reserving and settling in
        /// any interleaving (usage never above the reservation): no run's
        /// ledger and not the fleet's ever passes its cap.
        #[test]
        fn concurrent_reservations_never_overshoot(
            run_cap in 1..5000u64,
            fleet_cap in 1..9000u64,
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut runs = [NONE; 3];
            let mut fleet = NONE;
            let mut in_flight: Vec<(usize, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Reserve(r, input_bound, requested_output, choices) => {
                        let ask = Ask { input_bound, requested_output, choices };
                        if let Ok(g) = reserve(runs[r], run_cap, fleet, fleet_cap, ask) {
                            prop_assert!(g.max_output >= 1);
                            prop_assert!(requested_output.is_none_or(|o| g.max_output <= o.max(1)));
                            prop_assert!(g.tokens >= input_bound + choices * g.max_output);
                            runs[r] = take(runs[r], g);
                            fleet = take(fleet, g);
                            in_flight.push((r, g.tokens));
                        }
                    }
                    Op::Settle(i, fraction) => {
                        if in_flight.is_empty() { continue; }
                        let (r, reserved) = in_flight.remove(i % in_flight.len());
                        let actual = fraction.map(|f| reserved * u64::from(f) / 100);
                        runs[r] = settle(runs[r], reserved, actual);
                        fleet = settle(fleet, reserved, actual);
                    }
                }
                for l in &runs {
                    prop_assert!(l.committed() <= run_cap, "{l:?} over {run_cap}");
                }
                prop_assert!(fleet.committed() <= fleet_cap, "{fleet:?} over {fleet_cap}");
            }
        }
    }
}
