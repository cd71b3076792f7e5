//! Model-based property test of the queue's state machine.
//!
//! Random acts receive random event sequences: forged and duplicate
//! approvals, events after final states, ticks and starts under a clock
//! that jumps back and forth, starts whose recomputed digest changed,
//! reports about the wrong attempt, duplicate deliveries, and crashes
//! (`Recover`) at any point. A model kept by the test, from the events that
//! were accepted and never from the machine's state, tracks approvals and
//! executions; every step is checked against the invariants (a) to (g)
//! listed on [`Model`].

use deferred_queue::{
    act_digest, apply, Act, Backoff, Content, CredentialCheck, Door, Effect, Event, Found, Owner,
    QueuePolicy, Routing, State, Target, TransitionError,
};
use proptest::prelude::*;

struct AnyName;

impl CredentialCheck for AnyName {
    type Credential = str;
    type Error = ();

    fn check(&self, name: &str) -> Result<String, ()> {
        Ok(name.to_string())
    }
}

fn owner() -> Owner {
    Owner::verify(&AnyName, "owner").unwrap()
}

const NAMES: [&str; 3] = ["a", "b", "agent/x"];

fn name() -> impl Strategy<Value = String> {
    prop::sample::select(&NAMES[..]).prop_map(String::from)
}

fn act() -> impl Strategy<Value = Act> {
    (
        prop::sample::select(&[Door::Push, Door::PullRequest, Door::Notify, Door::Ask][..]),
        (name(), name(), name(), prop::option::of(name())),
        (name(), name(), 0..3u64),
        prop::collection::vec(name(), 0..3),
        300..1_100i64,
    )
        .prop_map(
            |(door, (run, actor, r, old), (c1, c2, size), rules, expires_at)| {
                let (target, content) = match door {
                    Door::Push => (
                        Target::Push {
                            target_ref: r,
                            expected_old: old,
                        },
                        Content::Commit { commit: c1 },
                    ),
                    Door::PullRequest => (
                        Target::PullRequest {
                            base_ref: r,
                            head_ref: "head".into(),
                        },
                        Content::PullRequest {
                            head_commit: c1,
                            text_digest: c2,
                        },
                    ),
                    Door::Notify | Door::Ask => (
                        Target::Message { endpoint: r },
                        Content::Message {
                            body_digest: c1,
                            size,
                        },
                    ),
                };
                Act {
                    id: "act".into(),
                    run,
                    actor,
                    door,
                    routing: Routing {
                        destination: "dest".into(),
                        target,
                    },
                    content,
                    policy_generation: "1:00".into(),
                    deciding_rules: rules,
                    created_at: 100,
                    expires_at,
                }
            },
        )
}

fn policy() -> impl Strategy<Value = QueuePolicy> {
    (1..4u32, 0..30i64).prop_map(|(max_attempts, base_secs)| QueuePolicy {
        max_attempts,
        backoff: Backoff {
            base_secs,
            max_secs: base_secs * 4,
        },
    })
}

/// How an approval's digest is made.
#[derive(Debug, Clone)]
enum Digest {
    /// The act's own.
    Right,
    /// Of the act with one bound field changed.
    OfChanged(u8),
    /// Any 64 hex digits.
    Junk,
}

/// An event to be made concrete against the current state, so that
/// attempt numbers are right most of the time and wrong some of the time.
#[derive(Debug, Clone)]
enum Spec {
    Approve {
        digest: Digest,
        now: i64,
        ttl: i64,
    },
    Reject,
    Tick {
        now: i64,
    },
    Begin {
        changed: bool,
        now: i64,
    },
    Succeed {
        off: u32,
    },
    Fail {
        off: u32,
        retryable: bool,
        now: i64,
    },
    Requeue,
    Recover,
    Resolve {
        off: u32,
        found: u8,
        now: i64,
    },
    /// Deliver the previous event again.
    Repeat,
}

fn clock() -> impl Strategy<Value = i64> {
    0..1_300i64
}

/// Mostly the current attempt, sometimes a neighbour.
fn offset() -> impl Strategy<Value = u32> {
    prop_oneof![6 => Just(0u32), 1 => Just(1), 1 => Just(u32::MAX)]
}

fn spec() -> impl Strategy<Value = Spec> {
    let digest = prop_oneof![
        4 => Just(Digest::Right),
        1 => (0..6u8).prop_map(Digest::OfChanged),
        1 => Just(Digest::Junk),
    ];
    prop_oneof![
        4 => (digest, clock(), -5..600i64).prop_map(|(digest, now, ttl)| Spec::Approve { digest, now, ttl }),
        1 => Just(Spec::Reject),
        3 => clock().prop_map(|now| Spec::Tick { now }),
        5 => (prop::bool::weighted(0.2), clock()).prop_map(|(changed, now)| Spec::Begin { changed, now }),
        2 => offset().prop_map(|off| Spec::Succeed { off }),
        3 => (offset(), any::<bool>(), clock()).prop_map(|(off, retryable, now)| Spec::Fail { off, retryable, now }),
        1 => Just(Spec::Requeue),
        2 => Just(Spec::Recover),
        2 => (offset(), 0..3u8, clock()).prop_map(|(off, found, now)| Spec::Resolve { off, found, now }),
        1 => Just(Spec::Repeat),
    ]
}

fn changed(act: &Act, which: u8) -> Act {
    let mut a = act.clone();
    match which {
        0 => a.run.push('!'),
        1 => a.actor.push('!'),
        2 => a.routing.destination.push('!'),
        3 => a.policy_generation.push('!'),
        4 => a.deciding_rules.push("extra-rule".into()),
        _ => {
            a.door = if a.door == Door::Notify {
                Door::Ask
            } else {
                Door::Notify
            }
        }
    }
    a
}

fn current_attempt(state: &State) -> u32 {
    match state {
        State::Executing { attempt, .. } | State::OutcomeUnknown { attempt, .. } => *attempt,
        _ => 1,
    }
}

fn concrete(spec: &Spec, act: &Act, state: &State, previous: Option<&Event>) -> Option<Event> {
    let attempt = |off: u32| current_attempt(state).wrapping_add(off);
    Some(match spec {
        Spec::Approve { digest, now, ttl } => Event::Approve {
            digest: match digest {
                Digest::Right => act_digest(act),
                Digest::OfChanged(w) => act_digest(&changed(act, *w)),
                Digest::Junk => "ab".repeat(32),
            },
            by: owner(),
            now: *now,
            ttl_secs: *ttl,
        },
        Spec::Reject => Event::Reject {
            why: "no".into(),
            by: owner(),
        },
        Spec::Tick { now } => Event::Tick { now: *now },
        Spec::Begin { changed: c, now } => Event::BeginExecution {
            recomputed_digest: if *c {
                act_digest(&changed(act, 0))
            } else {
                act_digest(act)
            },
            now: *now,
        },
        Spec::Succeed { off } => Event::Succeeded {
            attempt: attempt(*off),
            outcome: "ok".into(),
        },
        Spec::Fail {
            off,
            retryable,
            now,
        } => Event::AttemptFailed {
            attempt: attempt(*off),
            reason: "refused".into(),
            retryable: *retryable,
            now: *now,
        },
        Spec::Requeue => Event::Requeue,
        Spec::Recover => Event::Recover,
        Spec::Resolve { off, found, now } => Event::Resolve {
            attempt: attempt(*off),
            found: match found {
                0 => Found::Applied {
                    outcome: "there".into(),
                },
                1 => Found::NotApplied,
                _ => Found::CannotTell {
                    why: "no record".into(),
                },
            },
            now: *now,
        },
        Spec::Repeat => return previous.cloned(),
    })
}

/// One approval, as the model saw it granted.
#[derive(Debug)]
struct Granted {
    digest: String,
    expires_at: i64,
    executes: u32,
    /// False after an `Execute` until the attempt is known not to have
    /// taken effect.
    may_execute: bool,
}

/// What the test knows from accepted events alone. Invariants checked:
/// (a) Done at most once, and only under an approval of the act's own
/// digest that executed with a recomputed digest equal to it;
/// (b) no `Execute` at or after the approval's expiry;
/// (c) a transition that changes the state yields exactly one audit entry,
/// first, naming its ends; one that changes nothing yields no effect;
/// (d) final states refuse every event;
/// (e) nothing executes after rejection or expiry;
/// (f) at most `max_attempts` `Execute` effects per approval;
/// (g) no second `Execute` under one approval without an intervening
/// retryable failure (or a restart check that found nothing applied).
#[derive(Debug, Default)]
struct Model {
    approval: Option<Granted>,
    done: u32,
    ended: bool,
}

fn check_step(
    model: &mut Model,
    act: &Act,
    policy: &QueuePolicy,
    state: &State,
    event: &Event,
    result: &Result<(State, Vec<Effect>), TransitionError>,
) -> Result<(), TestCaseError> {
    let digest = act_digest(act);
    if state.is_final() {
        prop_assert!(
            matches!(result, Err(TransitionError::Final { .. })),
            "(d) final {} accepted {}: {:?}",
            state.name(),
            event.name(),
            result
        );
    }
    if let Event::Approve { digest: d, .. } = event {
        if *d != digest {
            prop_assert!(result.is_err(), "forged approval accepted: {:?}", result);
        }
    }
    let Ok((next, effects)) = result else {
        return Ok(());
    };

    // (c)
    if next == state {
        prop_assert!(effects.is_empty(), "(c) no-op with effects {:?}", effects);
        return Ok(());
    }
    let audits: Vec<_> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Audit(a) => Some(a),
            _ => None,
        })
        .collect();
    prop_assert_eq!(audits.len(), 1, "(c) {:?}", effects);
    prop_assert!(matches!(effects[0], Effect::Audit(_)));
    prop_assert_eq!(&audits[0].fields["from"], state.name());
    prop_assert_eq!(&audits[0].fields["to"], next.name());
    prop_assert_eq!(&audits[0].fields["digest"], &digest);

    let executes: Vec<&Effect> = effects
        .iter()
        .filter(|e| matches!(e, Effect::Execute { .. }))
        .collect();
    prop_assert!(executes.len() <= 1);
    if let Some(Effect::Execute { digest: d, .. }) = executes.first() {
        let Event::BeginExecution {
            recomputed_digest,
            now,
        } = event
        else {
            return Err(TestCaseError::fail(format!("execute on {event:?}")));
        };
        prop_assert!(!model.ended, "(e) executed after rejection or expiry");
        let Some(granted) = model.approval.as_mut() else {
            return Err(TestCaseError::fail("executed without a live approval"));
        };
        prop_assert_eq!(&granted.digest, &digest, "(a) approval of another digest");
        prop_assert_eq!(recomputed_digest, &digest, "(a) recomputed digest differs");
        prop_assert_eq!(d, &digest);
        prop_assert!(
            *now < granted.expires_at,
            "(b) executed at {} after expiry {}",
            now,
            granted.expires_at
        );
        prop_assert!(
            granted.may_execute,
            "(g) second execute without a known-failed attempt"
        );
        granted.executes += 1;
        granted.may_execute = false;
        prop_assert!(
            granted.executes <= policy.max_attempts,
            "(f) {} executes",
            granted.executes
        );
    }

    match (&next, event) {
        (State::Approved { approval }, Event::Approve { now, ttl_secs, .. }) => {
            prop_assert_eq!(&approval.digest, &digest, "(a) approved another digest");
            model.approval = Some(Granted {
                digest: approval.digest.clone(),
                expires_at: now + ttl_secs,
                executes: 0,
                may_execute: true,
            });
        }
        (State::Approved { .. }, _) => {
            return Err(TestCaseError::fail(format!("approved by {event:?}")));
        }
        (
            State::AwaitingRetry { .. },
            Event::AttemptFailed {
                retryable: true, ..
            },
        )
        | (
            State::AwaitingRetry { .. },
            Event::Resolve {
                found: Found::NotApplied,
                ..
            },
        ) => {
            if let Some(g) = model.approval.as_mut() {
                g.may_execute = true;
            }
        }
        (State::AwaitingRetry { .. }, _) => {
            return Err(TestCaseError::fail(format!("retry allowed by {event:?}")));
        }
        (State::Done { .. }, _) => {
            model.done += 1;
            prop_assert!(model.done <= 1, "(a) done twice");
            let executed = model.approval.as_ref().is_some_and(|g| g.executes > 0);
            prop_assert!(executed, "(a) done without an execute");
        }
        (State::Stale { .. } | State::Pending, _) => {
            // Whatever was approved is void: a new approval is needed.
            model.approval = None;
        }
        (State::Rejected { .. } | State::Expired { .. }, _) => model.ended = true,
        _ => {}
    }
    Ok(())
}

fn run_sequence(act: &Act, policy: &QueuePolicy, specs: &[Spec]) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    let mut state = State::Pending;
    let mut previous: Option<Event> = None;
    for spec in specs {
        let Some(event) = concrete(spec, act, &state, previous.as_ref()) else {
            continue;
        };
        let result = apply(act, &state, &event, policy);
        // Pure: the same inputs give the same answer.
        prop_assert_eq!(&result, &apply(act, &state, &event, policy));
        check_step(&mut model, act, policy, &state, &event, &result)?;
        if let Ok((next, _)) = result {
            state = next;
        }
        previous = Some(event);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn random_event_sequences_keep_the_invariants(
        act in act(),
        policy in policy(),
        specs in prop::collection::vec(spec(), 0..40),
    ) {
        run_sequence(&act, &policy, &specs)?;
    }
}

/// The happy path and the retry path, spelled out, so that the property
/// above is known to reach execution, retries and done at all.
#[test]
fn the_generator_reaches_done_through_a_retry() {
    let act = Act {
        id: "act".into(),
        run: "r".into(),
        actor: "a".into(),
        door: Door::Push,
        routing: Routing {
            destination: "dest".into(),
            target: Target::Push {
                target_ref: "refs/heads/x".into(),
                expected_old: None,
            },
        },
        content: Content::Commit { commit: "c".into() },
        policy_generation: "1:00".into(),
        deciding_rules: vec![],
        created_at: 100,
        expires_at: 1_000,
    };
    let policy = QueuePolicy {
        max_attempts: 2,
        backoff: Backoff {
            base_secs: 5,
            max_secs: 5,
        },
    };
    let specs = [
        Spec::Approve {
            digest: Digest::Right,
            now: 200,
            ttl: 100,
        },
        Spec::Begin {
            changed: false,
            now: 210,
        },
        Spec::Fail {
            off: 0,
            retryable: true,
            now: 220,
        },
        Spec::Begin {
            changed: false,
            now: 230,
        },
        Spec::Succeed { off: 0 },
        Spec::Repeat,
    ];
    let mut state = State::Pending;
    let mut previous = None;
    let mut model = Model::default();
    for spec in &specs {
        let event = concrete(spec, &act, &state, previous.as_ref()).unwrap();
        let result = apply(&act, &state, &event, &policy);
        check_step(&mut model, &act, &policy, &state, &event, &result).unwrap();
        if let Ok((next, _)) = result {
            state = next;
        }
        previous = Some(event);
    }
    assert!(
        matches!(state, State::Done { attempts: 2, .. }),
        "{state:?}"
    );
    assert_eq!(model.done, 1);
    assert_eq!(model.approval.map(|g| g.executes), Some(2));
}
