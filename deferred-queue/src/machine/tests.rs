//! One test per named transition, and the refusals around it.

use super::*;
use crate::act::{Content, Door, Routing, Target};
use crate::owner::CredentialCheck;

struct AnyToken;

impl CredentialCheck for AnyToken {
    type Credential = str;
    type Error = ();

    fn check(&self, name: &str) -> Result<String, ()> {
        Ok(name.to_string())
    }
}

fn owner() -> Owner {
    Owner::verify(&AnyToken, "alice").unwrap()
}

fn act() -> Act {
    Act {
        id: "act-1".into(),
        run: "run-1".into(),
        actor: "agent-a".into(),
        door: Door::Push,
        routing: Routing {
            destination: "origin".into(),
            target: Target::Push {
                target_ref: "refs/heads/agent/x".into(),
                expected_old: None,
            },
        },
        content: Content::Commit {
            commit: "abc123".into(),
        },
        policy_generation: "3:00ff".into(),
        deciding_rules: vec!["ask-push".into()],
        created_at: 100,
        expires_at: 1_000,
    }
}

fn policy() -> QueuePolicy {
    QueuePolicy {
        max_attempts: 3,
        backoff: Backoff {
            base_secs: 10,
            max_secs: 60,
        },
    }
}

fn approval() -> Approval {
    Approval {
        digest: act_digest(&act()),
        by: "alice".into(),
        at: 200,
        expires_at: 500,
    }
}

fn approve(now: i64) -> Event {
    Event::Approve {
        digest: act_digest(&act()),
        by: owner(),
        now,
        ttl_secs: 300,
    }
}

fn begin(now: i64) -> Event {
    Event::BeginExecution {
        recomputed_digest: act_digest(&act()),
        now,
    }
}

fn run(state: &State, event: &Event) -> Result<(State, Vec<Effect>), TransitionError> {
    apply(&act(), state, event, &policy())
}

fn executing(attempt: u32) -> State {
    State::Executing {
        approval: approval(),
        attempt,
    }
}

fn awaiting(attempts: u32, not_before: i64) -> State {
    State::AwaitingRetry {
        approval: approval(),
        attempts,
        not_before,
        last_failure: "connection refused".into(),
    }
}

/// The single audit entry of a transition, checked to come first and to
/// name the transition's ends.
fn audit_of(from: &State, to: &State, effects: &[Effect]) -> AuditEntry {
    let audits: Vec<&AuditEntry> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Audit(a) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(audits.len(), 1, "exactly one audit entry: {effects:?}");
    assert!(matches!(effects[0], Effect::Audit(_)), "audit comes first");
    let entry = audits[0].clone();
    assert_eq!(entry.fields["from"], from.name());
    assert_eq!(entry.fields["to"], to.name());
    assert_eq!(entry.fields["act"], "act-1");
    assert_eq!(entry.fields["digest"], act_digest(&act()));
    entry
}

fn executes(effects: &[Effect]) -> Vec<u32> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Execute { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect()
}

#[test]
fn approve_with_the_acts_digest_records_who_when_and_until() {
    let (next, effects) = run(&State::Pending, &approve(200)).unwrap();
    assert_eq!(
        next,
        State::Approved {
            approval: approval()
        }
    );
    let entry = audit_of(&State::Pending, &next, &effects);
    assert_eq!(entry.kind, AuditKind::ActApproved);
    assert_eq!(entry.fields["by"], "alice");
    assert_eq!(effects.len(), 1);
}

#[test]
fn approve_with_a_forged_digest_is_refused() {
    let mut other = act();
    other.content = Content::Commit {
        commit: "evil".into(),
    };
    let forged = Event::Approve {
        digest: act_digest(&other),
        by: owner(),
        now: 200,
        ttl_secs: 300,
    };
    assert!(matches!(
        run(&State::Pending, &forged),
        Err(TransitionError::DigestMismatch { .. })
    ));
}

#[test]
fn a_second_approval_is_refused() {
    let approved = State::Approved {
        approval: approval(),
    };
    assert!(matches!(
        run(&approved, &approve(250)),
        Err(TransitionError::NotAllowed {
            state: "approved",
            event: "approve",
            ..
        })
    ));
}

#[test]
fn approve_after_the_window_expires_the_act() {
    let (next, effects) = run(&State::Pending, &approve(1_000)).unwrap();
    assert!(matches!(next, State::Expired { .. }));
    assert_eq!(
        audit_of(&State::Pending, &next, &effects).kind,
        AuditKind::ActExpired
    );
    assert!(executes(&effects).is_empty());
}

#[test]
fn approve_refuses_a_non_positive_lifetime_and_a_malformed_act() {
    let zero = Event::Approve {
        digest: act_digest(&act()),
        by: owner(),
        now: 200,
        ttl_secs: 0,
    };
    assert!(matches!(
        run(&State::Pending, &zero),
        Err(TransitionError::InvalidTtl { .. })
    ));
    let mut bad = act();
    bad.content = Content::Message {
        body_digest: "b".into(),
        size: 1,
    };
    let event = Event::Approve {
        digest: act_digest(&bad),
        by: owner(),
        now: 200,
        ttl_secs: 300,
    };
    assert!(matches!(
        apply(&bad, &State::Pending, &event, &policy()),
        Err(TransitionError::InvalidAct { .. })
    ));
}

#[test]
fn reject_ends_every_waiting_state() {
    let reject = Event::Reject {
        why: "not tonight".into(),
        by: owner(),
    };
    for from in [
        State::Pending,
        State::Stale {
            why: "moved".into(),
        },
        State::Approved {
            approval: approval(),
        },
        awaiting(1, 300),
    ] {
        let (next, effects) = run(&from, &reject).unwrap();
        assert_eq!(
            next,
            State::Rejected {
                why: "not tonight".into(),
                by: "alice".into()
            }
        );
        assert_eq!(
            audit_of(&from, &next, &effects).fields["why"],
            "not tonight"
        );
    }
}

#[test]
fn reject_cannot_hide_a_running_or_unknown_attempt() {
    let reject = Event::Reject {
        why: "no".into(),
        by: owner(),
    };
    for from in [
        executing(1),
        State::OutcomeUnknown {
            approval: approval(),
            attempt: 1,
        },
    ] {
        assert!(matches!(
            run(&from, &reject),
            Err(TransitionError::NotAllowed { .. })
        ));
    }
}

#[test]
fn tick_before_any_deadline_changes_nothing_and_says_nothing() {
    for (state, now) in [
        (State::Pending, 999),
        (State::Stale { why: "x".into() }, 999),
        (
            State::Approved {
                approval: approval(),
            },
            499,
        ),
        (awaiting(1, 300), 499),
        (executing(1), 10_000),
        (
            State::OutcomeUnknown {
                approval: approval(),
                attempt: 1,
            },
            10_000,
        ),
    ] {
        assert_eq!(run(&state, &Event::Tick { now }).unwrap(), (state, vec![]));
    }
}

#[test]
fn tick_at_the_window_end_expires_a_waiting_act() {
    for from in [State::Pending, State::Stale { why: "x".into() }] {
        let (next, effects) = run(&from, &Event::Tick { now: 1_000 }).unwrap();
        assert!(matches!(next, State::Expired { .. }), "{from:?}");
        audit_of(&from, &next, &effects);
    }
}

#[test]
fn tick_at_the_approval_expiry_expires_it_and_keeps_the_last_failure() {
    let from = State::Approved {
        approval: approval(),
    };
    let (next, _) = run(&from, &Event::Tick { now: 500 }).unwrap();
    assert!(matches!(next, State::Expired { .. }));
    let (next, effects) = run(&awaiting(2, 300), &Event::Tick { now: 500 }).unwrap();
    let State::Expired { why } = &next else {
        panic!("{next:?}")
    };
    assert!(
        why.contains("connection refused") && why.contains("2 failed"),
        "{why}"
    );
    audit_of(&awaiting(2, 300), &next, &effects);
}

#[test]
fn begin_execution_with_the_approved_digest_executes_attempt_one() {
    let from = State::Approved {
        approval: approval(),
    };
    let (next, effects) = run(&from, &begin(300)).unwrap();
    assert_eq!(next, executing(1));
    assert_eq!(
        audit_of(&from, &next, &effects).kind,
        AuditKind::ActExecutionBegun
    );
    assert_eq!(
        effects[1],
        Effect::Execute {
            act: act(),
            attempt: 1,
            digest: act_digest(&act())
        }
    );
}

#[test]
fn a_second_begin_execution_on_the_same_approval_is_refused() {
    assert!(matches!(
        run(&executing(1), &begin(301)),
        Err(TransitionError::AlreadyExecuting { attempt: 1, .. })
    ));
}

#[test]
fn begin_execution_with_a_changed_digest_returns_the_act_to_the_queue() {
    let from = State::Approved {
        approval: approval(),
    };
    let moved = Event::BeginExecution {
        recomputed_digest: "0".repeat(64),
        now: 300,
    };
    let (next, effects) = run(&from, &moved).unwrap();
    assert!(matches!(next, State::Stale { .. }));
    let entry = audit_of(&from, &next, &effects);
    assert_eq!(entry.fields["recomputed_digest"], "0".repeat(64));
    assert!(matches!(effects[1], Effect::NeedsNewApproval { .. }));
    assert!(executes(&effects).is_empty());
}

#[test]
fn begin_execution_refuses_a_stored_act_changed_after_approval() {
    // The executor recomputes the *changed* act: its digest matches itself
    // but not the approval.
    let mut changed = act();
    changed.content = Content::Commit {
        commit: "other".into(),
    };
    let event = Event::BeginExecution {
        recomputed_digest: act_digest(&changed),
        now: 300,
    };
    let from = State::Approved {
        approval: approval(),
    };
    let (next, effects) = apply(&changed, &from, &event, &policy()).unwrap();
    assert!(matches!(next, State::Stale { .. }));
    assert!(executes(&effects).is_empty());
    // And an honest recomputation of the original does not help either.
    let (next, _) = apply(&changed, &from, &begin(300), &policy()).unwrap();
    assert!(matches!(next, State::Stale { .. }));
}

#[test]
fn begin_execution_after_the_approval_expired_never_proceeds() {
    let from = State::Approved {
        approval: approval(),
    };
    let (next, effects) = run(&from, &begin(500)).unwrap();
    assert!(matches!(next, State::Expired { .. }));
    assert!(executes(&effects).is_empty());
    let (next, effects) = run(&awaiting(1, 300), &begin(500)).unwrap();
    assert!(matches!(next, State::Expired { .. }));
    assert!(executes(&effects).is_empty());
}

#[test]
fn begin_execution_needs_an_approval() {
    for from in [State::Pending, State::Stale { why: "x".into() }] {
        assert!(matches!(
            run(&from, &begin(300)),
            Err(TransitionError::NotAllowed { .. })
        ));
    }
}

#[test]
fn success_of_the_running_attempt_is_done() {
    let ok = Event::Succeeded {
        attempt: 1,
        outcome: "pushed abc123".into(),
    };
    let (next, effects) = run(&executing(1), &ok).unwrap();
    assert_eq!(
        next,
        State::Done {
            outcome: "pushed abc123".into(),
            attempts: 1
        }
    );
    assert_eq!(
        audit_of(&executing(1), &next, &effects).kind,
        AuditKind::ActDone
    );
    assert!(matches!(
        run(&executing(2), &ok),
        Err(TransitionError::AttemptMismatch {
            got: 1,
            current: 2,
            ..
        })
    ));
    assert!(matches!(
        run(
            &State::Approved {
                approval: approval()
            },
            &ok
        ),
        Err(TransitionError::NotAllowed { .. })
    ));
}

#[test]
fn a_retryable_failure_reuses_the_approval_after_a_backoff() {
    let failed = Event::AttemptFailed {
        attempt: 1,
        reason: "connection refused".into(),
        retryable: true,
        now: 300,
    };
    let (next, effects) = run(&executing(1), &failed).unwrap();
    assert_eq!(next, awaiting(1, 310));
    assert_eq!(
        audit_of(&executing(1), &next, &effects).fields["not_before"],
        "310"
    );
    assert_eq!(
        effects[1],
        Effect::RetryAt {
            act: "act-1".into(),
            attempt: 2,
            not_before: 310
        }
    );
    assert!(matches!(
        run(&next, &begin(309)),
        Err(TransitionError::BackoffPending {
            not_before: 310,
            ..
        })
    ));
    let (again, effects) = run(&next, &begin(310)).unwrap();
    assert_eq!(again, executing(2));
    assert_eq!(executes(&effects), vec![2]);
}

#[test]
fn the_last_attempt_or_a_final_failure_fails_with_its_reason() {
    let failed = |attempt, retryable| Event::AttemptFailed {
        attempt,
        reason: "rejected: non-fast-forward".into(),
        retryable,
        now: 300,
    };
    let (next, effects) = run(&executing(3), &failed(3, true)).unwrap();
    assert_eq!(
        next,
        State::Failed {
            reason: "rejected: non-fast-forward".into(),
            attempts: 3
        }
    );
    assert_eq!(
        audit_of(&executing(3), &next, &effects).fields["reason"],
        "rejected: non-fast-forward"
    );
    let (next, _) = run(&executing(1), &failed(1, false)).unwrap();
    assert!(matches!(next, State::Failed { attempts: 1, .. }));
}

#[test]
fn a_retry_left_over_from_a_higher_limit_fails_instead_of_waiting_forever() {
    let lowered = QueuePolicy {
        max_attempts: 1,
        ..policy()
    };
    let (next, effects) = apply(&act(), &awaiting(1, 300), &begin(400), &lowered).unwrap();
    assert!(matches!(next, State::Failed { attempts: 1, .. }));
    assert!(executes(&effects).is_empty());
}

#[test]
fn requeue_takes_a_stale_act_back_to_pending_where_it_needs_a_new_approval() {
    let from = State::Stale {
        why: "moved".into(),
    };
    let (next, effects) = run(&from, &Event::Requeue).unwrap();
    assert_eq!(next, State::Pending);
    assert_eq!(
        audit_of(&from, &next, &effects).kind,
        AuditKind::ActRequeued
    );
    assert!(matches!(
        run(&from, &approve(200)),
        Err(TransitionError::NotAllowed { .. })
    ));
    assert!(matches!(
        run(&State::Pending, &Event::Requeue),
        Err(TransitionError::NotAllowed { .. })
    ));
}

#[test]
fn recover_never_re_executes_but_asks_for_a_check() {
    let (next, effects) = run(&executing(2), &Event::Recover).unwrap();
    assert_eq!(
        next,
        State::OutcomeUnknown {
            approval: approval(),
            attempt: 2
        }
    );
    audit_of(&executing(2), &next, &effects);
    assert_eq!(
        effects[1],
        Effect::CheckRemote {
            act: act(),
            attempt: 2
        }
    );
    assert!(executes(&effects).is_empty());
    assert!(matches!(
        run(&next, &begin(300)),
        Err(TransitionError::NotAllowed { .. })
    ));
    for other in [
        State::Pending,
        State::Approved {
            approval: approval(),
        },
        next,
    ] {
        assert!(matches!(
            run(&other, &Event::Recover),
            Err(TransitionError::NotAllowed { .. })
        ));
    }
}

#[test]
fn resolve_follows_what_the_destination_shows() {
    let unknown = |attempt| State::OutcomeUnknown {
        approval: approval(),
        attempt,
    };
    let resolve = |attempt, found| Event::Resolve {
        attempt,
        found,
        now: 300,
    };
    let applied = Found::Applied {
        outcome: "ref holds abc123".into(),
    };
    let (next, _) = run(&unknown(1), &resolve(1, applied.clone())).unwrap();
    assert!(matches!(next, State::Done { attempts: 1, .. }));
    assert!(matches!(
        run(&unknown(1), &resolve(2, applied)),
        Err(TransitionError::AttemptMismatch { .. })
    ));

    let (next, effects) = run(&unknown(1), &resolve(1, Found::NotApplied)).unwrap();
    assert!(matches!(
        next,
        State::AwaitingRetry {
            attempts: 1,
            not_before: 310,
            ..
        }
    ));
    assert_eq!(
        audit_of(&unknown(1), &next, &effects).fields["found"],
        "not_applied"
    );
    let (next, _) = run(&unknown(3), &resolve(3, Found::NotApplied)).unwrap();
    assert!(matches!(next, State::Failed { attempts: 3, .. }));

    let cannot = Found::CannotTell {
        why: "webhook keeps no record".into(),
    };
    let (next, effects) = run(&unknown(1), &resolve(1, cannot)).unwrap();
    assert!(matches!(next, State::Stale { .. }));
    assert!(matches!(effects[1], Effect::NeedsNewApproval { .. }));
}

#[test]
fn final_states_refuse_every_event() {
    let events = [
        approve(200),
        Event::Reject {
            why: "x".into(),
            by: owner(),
        },
        Event::Tick { now: 200 },
        begin(200),
        Event::Succeeded {
            attempt: 1,
            outcome: "x".into(),
        },
        Event::AttemptFailed {
            attempt: 1,
            reason: "x".into(),
            retryable: true,
            now: 200,
        },
        Event::Requeue,
        Event::Recover,
        Event::Resolve {
            attempt: 1,
            found: Found::NotApplied,
            now: 200,
        },
    ];
    let finals = [
        State::Rejected {
            why: "x".into(),
            by: "alice".into(),
        },
        State::Expired { why: "x".into() },
        State::Done {
            outcome: "x".into(),
            attempts: 1,
        },
        State::Failed {
            reason: "x".into(),
            attempts: 1,
        },
    ];
    for state in &finals {
        for event in &events {
            assert!(
                matches!(run(state, event), Err(TransitionError::Final { .. })),
                "{} accepted {}",
                state.name(),
                event.name()
            );
        }
    }
}

#[test]
fn backoff_doubles_and_stops_at_its_cap() {
    let b = policy().backoff;
    assert_eq!(
        [b.delay(1), b.delay(2), b.delay(3), b.delay(4)],
        [10, 20, 40, 60]
    );
    assert_eq!(b.delay(u32::MAX), 60);
}

#[test]
fn an_out_of_bounds_policy_refuses_every_event() {
    let zero = QueuePolicy {
        max_attempts: 0,
        ..policy()
    };
    let inverted = QueuePolicy {
        backoff: Backoff {
            base_secs: 10,
            max_secs: 5,
        },
        ..policy()
    };
    for p in [zero, inverted] {
        assert!(matches!(
            apply(&act(), &State::Pending, &approve(200), &p),
            Err(TransitionError::InvalidPolicy { .. })
        ));
    }
}

#[test]
fn owed_effects_repeat_a_pending_check_or_retry_and_nothing_else() {
    let unknown = State::OutcomeUnknown {
        approval: approval(),
        attempt: 2,
    };
    assert_eq!(
        owed_effects(&act(), &unknown),
        vec![Effect::CheckRemote {
            act: act(),
            attempt: 2
        }]
    );
    assert_eq!(
        owed_effects(&act(), &awaiting(1, 310)),
        vec![Effect::RetryAt {
            act: "act-1".into(),
            attempt: 2,
            not_before: 310
        }]
    );
    for s in [
        State::Pending,
        State::Approved {
            approval: approval(),
        },
        executing(1),
    ] {
        assert!(owed_effects(&act(), &s).is_empty());
    }
}

#[test]
fn states_round_trip_through_json() {
    for s in [
        State::Pending,
        State::Approved {
            approval: approval(),
        },
        executing(2),
        awaiting(1, 310),
        State::Done {
            outcome: "x".into(),
            attempts: 1,
        },
    ] {
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<State>(&text).unwrap(), s, "{text}");
    }
}

#[test]
fn error_messages_are_lowercase_and_name_the_act() {
    let e = run(&executing(1), &begin(300)).unwrap_err().to_string();
    assert_eq!(
        e,
        "act act-1 is already executing attempt 1: second start refused"
    );
}

#[test]
fn a_scope_approves_ahead_of_time_only_a_pending_act_and_only_its_digest() {
    let under = |digest: String, now| Event::ApproveUnderScope {
        digest,
        scope: "s1-allow".into(),
        now,
        ttl_secs: 300,
    };
    let (next, effects) = run(&State::Pending, &under(act_digest(&act()), 200)).unwrap();
    let State::Approved { approval } = &next else {
        panic!("not approved: {next:?}");
    };
    assert_eq!(approval.by, "scope s1-allow");
    let Effect::Audit(entry) = &effects[0] else {
        panic!("no audit entry first");
    };
    assert_eq!(entry.fields["by"], "scope s1-allow");
    assert_eq!(entry.fields["event"], "approve_under_scope");
    let mut other = act();
    other.content = Content::Commit {
        commit: "evil".into(),
    };
    assert!(matches!(
        run(&State::Pending, &under(act_digest(&other), 200)),
        Err(TransitionError::DigestMismatch { .. })
    ));
    assert!(matches!(
        run(&next, &under(act_digest(&act()), 250)),
        Err(TransitionError::NotAllowed { .. })
    ));
    // A late one ends the act, as a late approval does.
    let (late, _) = run(&State::Pending, &under(act_digest(&act()), 1_000)).unwrap();
    assert_eq!(late.name(), "expired");
}
