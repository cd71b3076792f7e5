//! The deferred queue's state machine: `apply(act, state, event) -> (state,
//! effects)`.
//!
//! | from | event | to |
//! |---|---|---|
//! | Pending | Approve or ApproveUnderScope, digest = act digest, in window | Approved |
//! | Pending | Approve, digest = act digest, window over | Expired |
//! | Pending, Stale | Tick past the act's window | Expired |
//! | Approved, AwaitingRetry | Tick past the approval's expiry | Expired |
//! | Pending, Stale, Approved, AwaitingRetry | Reject (owner) | Rejected |
//! | Approved, AwaitingRetry | BeginExecution, approval expired | Expired |
//! | Approved, AwaitingRetry | BeginExecution, recomputed ≠ approved | Stale |
//! | Approved, AwaitingRetry (backoff over) | BeginExecution, recomputed = approved | Executing |
//! | AwaitingRetry, no attempts left (policy lowered) | BeginExecution | Failed |
//! | Executing | Succeeded | Done |
//! | Executing | AttemptFailed, retryable, attempts left | AwaitingRetry |
//! | Executing | AttemptFailed, otherwise | Failed |
//! | Executing | Recover | OutcomeUnknown |
//! | OutcomeUnknown | Resolve Applied | Done |
//! | OutcomeUnknown | Resolve NotApplied | AwaitingRetry or Failed, as a retryable failure |
//! | OutcomeUnknown | Resolve CannotTell | Stale |
//! | Stale | Requeue | Pending |
//!
//! Anything else is refused with a [`TransitionError`], except a `Tick`
//! before any deadline, which changes nothing.
//!
//! Invariants:
//! - Pure: no clock, no I/O. Time arrives in events; the adapter supplies it.
//! - An act is only approved by an [`Owner`], or ahead of time under an
//!   autonomy scope the owner ratified (`ApproveUnderScope`, recorded as
//!   `scope <rule>`), and only for its own digest ([`act_digest`]); a forged
//!   or outdated approval is refused and changes nothing
//!   (`tests::approve_with_a_forged_digest_is_refused`,
//!   `tests::a_scope_approves_ahead_of_time_only_a_pending_act_and_only_its_digest`).
//! - An approval is used once. `BeginExecution` moves it out of `Approved`
//!   and nothing moves it back. It may carry a further attempt only through
//!   `AwaitingRetry`, which is entered only when the previous attempt is
//!   known not to have taken effect (`AttemptFailed { retryable: true }` or
//!   a restart check that found it not applied), and at most
//!   `max_attempts` times in all. So an approval yields at most one
//!   successful execution and at most `max_attempts` `Execute` effects
//!   (`tests::a_second_begin_execution_on_the_same_approval_is_refused`;
//!   invariants (a), (f) and (g) of
//!   `tests/model.rs::random_event_sequences_keep_the_invariants`).
//! - Nothing starts without, at that instant, an unexpired approval whose
//!   digest equals both the act's digest and the digest the executor
//!   recomputed under its lock; expiry ends the act (`Expired`), a mismatch
//!   sends it back to the queue (`Stale`) for a new approval.
//! - A crash while `Executing` never leads to a blind re-execution:
//!   `Recover` moves the act to `OutcomeUnknown` and asks the executor to
//!   look at the destination ([`Effect::CheckRemote`]) before anything else
//!   (`tests::recover_never_re_executes_but_asks_for_a_check`).
//! - `Rejected`, `Expired`, `Done` and `Failed` are final: every event on
//!   them is a [`TransitionError::Final`].
//! - Every transition that changes the state yields exactly one
//!   [`Effect::Audit`], first in the list; an event that changes nothing
//!   (a `Tick` before any deadline) yields no effect at all, and an error
//!   means nothing happened.
//!
//! The adapter's duty, which makes "no transition lost or doubled" hold
//! across `kill -9`: write the new state and its audit entry in one
//! transaction, conditioned on the old state still being current, and only
//! after that commit carry out the other effects. An `Execute` therefore
//! always follows a durable `Executing`; a crash in between leaves
//! `Executing`, which restart turns into `OutcomeUnknown` through `Recover`.
//! On restart the adapter also re-issues the effects a durable state still
//! owes ([`owed_effects`], `tests::owed_effects_repeat_a_pending_check_or_retry_and_nothing_else`).
//! The supervisor's adapter is held to it by
//! `tests/tests/acts.rs::kill_9_during_execution_never_sends_twice_and_ends_defined`
//! and `tests/tests/faults.rs::two_executors_killed_at_random_carry_every_approved_act_out_once`.
//!
//! Failure reasons, rejection reasons and outcomes go into the audit: they
//! must be written by the supervisor or the owner (an error class, a ref, a
//! pull request number), never copied from agent-written content (the
//! executors' reasons are fixed words:
//! `orchestrator/executors/src/error.rs::audit_reasons_hold_no_words_of_the_destination`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::act::{act_digest, Act, ActError};
use crate::owner::Owner;

/// How failed attempts are retried. Config: `deny_unknown_fields`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueuePolicy {
    /// Attempts one approval may carry, the first included; at least 1.
    pub max_attempts: u32,
    /// Delay before a retry.
    pub backoff: Backoff,
}

/// Exponential backoff: `base_secs * 2^(failed - 1)`, at most `max_secs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// Delay after the first failure, seconds; not negative.
    pub base_secs: i64,
    /// Longest delay, seconds; not below `base_secs`.
    pub max_secs: i64,
}

impl Backoff {
    /// Seconds to wait after `failed` attempts have failed (`failed >= 1`).
    pub fn delay(&self, failed: u32) -> i64 {
        let factor = 2i64.saturating_pow(failed.saturating_sub(1));
        self.base_secs
            .saturating_mul(factor)
            .min(self.max_secs)
            .max(0)
    }
}

impl QueuePolicy {
    /// Checks the bounds documented on the fields.
    pub fn check(&self) -> Result<(), TransitionError> {
        let why = if self.max_attempts == 0 {
            "max_attempts must be at least 1"
        } else if self.backoff.base_secs < 0 {
            "backoff.base_secs must not be negative"
        } else if self.backoff.max_secs < self.backoff.base_secs {
            "backoff.max_secs must not be below backoff.base_secs"
        } else {
            return Ok(());
        };
        Err(TransitionError::InvalidPolicy { why })
    }
}

/// A person's approval of one act, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// The act digest approved.
    pub digest: String,
    /// The owner's name.
    pub by: String,
    /// When, unix seconds.
    pub at: i64,
    /// The approval is void from this instant on, unix seconds.
    pub expires_at: i64,
}

/// Where an act is. Stored by the adapter next to the act.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum State {
    /// Waiting for a person.
    Pending,
    /// Approved and not yet used.
    Approved {
        /// The approval.
        approval: Approval,
    },
    /// An attempt is being carried out under `approval`.
    Executing {
        /// The approval in use.
        approval: Approval,
        /// Which attempt, from 1.
        attempt: u32,
    },
    /// The last attempt failed without effect; the same approval may carry
    /// the next one from `not_before` on.
    AwaitingRetry {
        /// The approval in use.
        approval: Approval,
        /// Attempts made so far.
        attempts: u32,
        /// Earliest start of the next attempt, unix seconds.
        not_before: i64,
        /// Why the last attempt failed.
        last_failure: String,
    },
    /// The supervisor restarted while an attempt was running: whether it
    /// took effect must be checked at the destination before anything else.
    OutcomeUnknown {
        /// The approval that was in use.
        approval: Approval,
        /// The attempt whose outcome is unknown.
        attempt: u32,
    },
    /// Back in the queue: what would be carried out is not what was
    /// approved, or it cannot be known what happened. Needs a new approval
    /// (after `Requeue`).
    Stale {
        /// Why.
        why: String,
    },
    /// Refused by the owner. Final.
    Rejected {
        /// Why, in the owner's words.
        why: String,
        /// The owner's name.
        by: String,
    },
    /// The approval window or the approval lapsed. Final.
    Expired {
        /// Which deadline passed.
        why: String,
    },
    /// Carried out. Final.
    Done {
        /// What the executor reports (e.g. the pushed commit, the pull
        /// request number).
        outcome: String,
        /// Attempts it took.
        attempts: u32,
    },
    /// Given up. Final.
    Failed {
        /// Why the last attempt failed.
        reason: String,
        /// Attempts made.
        attempts: u32,
    },
}

impl State {
    /// The state's stable name, as stored and audited.
    pub fn name(&self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved { .. } => "approved",
            State::Executing { .. } => "executing",
            State::AwaitingRetry { .. } => "awaiting_retry",
            State::OutcomeUnknown { .. } => "outcome_unknown",
            State::Stale { .. } => "stale",
            State::Rejected { .. } => "rejected",
            State::Expired { .. } => "expired",
            State::Done { .. } => "done",
            State::Failed { .. } => "failed",
        }
    }

    /// No event changes a final state.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            State::Rejected { .. }
                | State::Expired { .. }
                | State::Done { .. }
                | State::Failed { .. }
        )
    }

    /// The act waits for a person's decision (approve, reject, requeue).
    pub fn awaits_person(&self) -> bool {
        matches!(self, State::Pending | State::Stale { .. })
    }
}

/// What the executor found when it looked at the destination of an attempt
/// whose outcome was unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The effect is there (e.g. the remote ref holds the commit).
    Applied {
        /// As for [`State::Done`].
        outcome: String,
    },
    /// The effect is certainly not there and cannot appear later.
    NotApplied,
    /// The destination cannot tell (e.g. a webhook keeps no record).
    CannotTell {
        /// Why.
        why: String,
    },
}

/// Something that happened to an act. Not `Deserialize`: approvals and
/// rejections carry an [`Owner`], which only credential-checking code makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The owner approves the act with this digest, for `ttl_secs`.
    Approve {
        /// The digest the owner was shown.
        digest: String,
        /// The owner.
        by: Owner,
        /// Unix seconds.
        now: i64,
        /// The approval's lifetime (the per-door default from config).
        ttl_secs: i64,
    },
    /// The act is approved ahead of time by an autonomy scope: an `allow`
    /// rule the owner ratified under the owner's credential for exactly this
    /// kind of act. The adapter sends it only when the policy decided so at
    /// the door (`policies::scopes::judge`), for the act's own digest; the
    /// approval records `scope <rule>` as who approved.
    ApproveUnderScope {
        /// The act's digest.
        digest: String,
        /// The scope's rule id.
        scope: String,
        /// Unix seconds.
        now: i64,
        /// The approval's lifetime.
        ttl_secs: i64,
    },
    /// The owner refuses the act.
    Reject {
        /// In the owner's words.
        why: String,
        /// The owner.
        by: Owner,
    },
    /// The clock moved; deadlines may have passed.
    Tick {
        /// Unix seconds.
        now: i64,
    },
    /// The executor, under its lock, recomputed the act from the world as it
    /// is now (remote ref, content, rule generation and verdict) and is
    /// about to carry it out.
    BeginExecution {
        /// `act_digest` of the recomputed act.
        recomputed_digest: String,
        /// Unix seconds.
        now: i64,
    },
    /// The attempt took effect.
    Succeeded {
        /// Which attempt.
        attempt: u32,
        /// As for [`State::Done`].
        outcome: String,
    },
    /// The attempt failed.
    AttemptFailed {
        /// Which attempt.
        attempt: u32,
        /// Why.
        reason: String,
        /// True only if the effect is known not to have happened and a new
        /// attempt may succeed (e.g. connection refused before sending). When
        /// in doubt the executor says false.
        retryable: bool,
        /// Unix seconds.
        now: i64,
    },
    /// A stale act goes back to pending, to be approved anew.
    Requeue,
    /// After a restart, the act was found executing.
    Recover,
    /// The executor checked the destination of an attempt whose outcome was
    /// unknown.
    Resolve {
        /// Which attempt.
        attempt: u32,
        /// What it found.
        found: Found,
        /// Unix seconds.
        now: i64,
    },
}

impl Event {
    /// The event's stable name, for errors and the audit.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Approve { .. } => "approve",
            Event::ApproveUnderScope { .. } => "approve_under_scope",
            Event::Reject { .. } => "reject",
            Event::Tick { .. } => "tick",
            Event::BeginExecution { .. } => "begin_execution",
            Event::Succeeded { .. } => "succeeded",
            Event::AttemptFailed { .. } => "attempt_failed",
            Event::Requeue => "requeue",
            Event::Recover => "recover",
            Event::Resolve { .. } => "resolve",
        }
    }
}

/// What a transition was, for the audit; one per state it leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// To `Approved`.
    ActApproved,
    /// To `Rejected`.
    ActRejected,
    /// To `Expired`.
    ActExpired,
    /// To `Executing`.
    ActExecutionBegun,
    /// To `AwaitingRetry`.
    ActRetryScheduled,
    /// To `OutcomeUnknown`.
    ActOutcomeUnknown,
    /// To `Stale`.
    ActStale,
    /// To `Pending` (from `Stale`).
    ActRequeued,
    /// To `Done`.
    ActDone,
    /// To `Failed`.
    ActFailed,
}

impl AuditKind {
    fn of(state: &State) -> AuditKind {
        match state {
            State::Pending => AuditKind::ActRequeued,
            State::Approved { .. } => AuditKind::ActApproved,
            State::Executing { .. } => AuditKind::ActExecutionBegun,
            State::AwaitingRetry { .. } => AuditKind::ActRetryScheduled,
            State::OutcomeUnknown { .. } => AuditKind::ActOutcomeUnknown,
            State::Stale { .. } => AuditKind::ActStale,
            State::Rejected { .. } => AuditKind::ActRejected,
            State::Expired { .. } => AuditKind::ActExpired,
            State::Done { .. } => AuditKind::ActDone,
            State::Failed { .. } => AuditKind::ActFailed,
        }
    }
}

/// A content-free audit record of one transition: ids, digests, names,
/// numbers, and the supervisor's or owner's reasons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// What happened.
    pub kind: AuditKind,
    /// The fields, by name. Always: `act`, `run`, `door`, `digest` (the
    /// act's), `event`, `from`, `to`.
    pub fields: BTreeMap<&'static str, String>,
}

/// Work the adapter carries out after committing the new state and its
/// audit entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write this audit entry in the same transaction as the new state.
    Audit(AuditEntry),
    /// Carry out this attempt of the act. The executor is still under the
    /// lock it took to recompute `digest`.
    Execute {
        /// The act, as approved.
        act: Act,
        /// Which attempt, from 1.
        attempt: u32,
        /// The approved digest.
        digest: String,
    },
    /// Send `BeginExecution` for the next attempt at `not_before` or later.
    RetryAt {
        /// The act's id.
        act: String,
        /// The next attempt's number.
        attempt: u32,
        /// Unix seconds.
        not_before: i64,
    },
    /// Look at the destination to learn whether `attempt` took effect, then
    /// send `Resolve`.
    CheckRemote {
        /// The act.
        act: Act,
        /// The attempt in question.
        attempt: u32,
    },
    /// The act is back in the queue and needs a new approval: tell the owner.
    NeedsNewApproval {
        /// The act's id.
        act: String,
        /// Why.
        why: String,
    },
}

/// Why an event was refused. A refused event changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransitionError {
    /// The act is in a final state.
    #[error("act {act} is {state}, which is final: {event} refused")]
    Final {
        /// The act.
        act: String,
        /// Its state.
        state: &'static str,
        /// The refused event.
        event: &'static str,
    },
    /// The event does not apply to the act's state.
    #[error("act {act} is {state}: {event} does not apply")]
    NotAllowed {
        /// The act.
        act: String,
        /// Its state.
        state: &'static str,
        /// The refused event.
        event: &'static str,
    },
    /// A second start while an attempt runs: the approval is single-use.
    #[error("act {act} is already executing attempt {attempt}: second start refused")]
    AlreadyExecuting {
        /// The act.
        act: String,
        /// The running attempt.
        attempt: u32,
    },
    /// The approval is for another digest (forged, or the act changed).
    #[error(
        "approving act {act}: approval is for digest {approved} but the act's digest is {actual}"
    )]
    DigestMismatch {
        /// The act.
        act: String,
        /// The digest the approval named.
        approved: String,
        /// The act's digest.
        actual: String,
    },
    /// An approval must last a positive time.
    #[error("approving act {act}: approval lifetime must be positive, got {ttl_secs}s")]
    InvalidTtl {
        /// The act.
        act: String,
        /// The lifetime given.
        ttl_secs: i64,
    },
    /// A report about an attempt that is not the current one.
    #[error("act {act}: {event} names attempt {got} but the current attempt is {current}")]
    AttemptMismatch {
        /// The act.
        act: String,
        /// The event.
        event: &'static str,
        /// The attempt named.
        got: u32,
        /// The current attempt.
        current: u32,
    },
    /// A retry before its backoff elapsed.
    #[error("starting act {act}: next attempt not before {not_before}, now is {now}")]
    BackoffPending {
        /// The act.
        act: String,
        /// Earliest start.
        not_before: i64,
        /// The event's clock.
        now: i64,
    },
    /// The act's parts do not fit together.
    #[error("{event} on a malformed act")]
    InvalidAct {
        /// The event.
        event: &'static str,
        /// What is wrong.
        #[source]
        source: ActError,
    },
    /// The queue policy is out of bounds.
    #[error("queue policy: {why}")]
    InvalidPolicy {
        /// Which bound.
        why: &'static str,
    },
}

/// The next state and the non-audit effects of a transition, with the
/// fields it adds to its audit entry.
struct Step {
    next: State,
    fields: Vec<(&'static str, String)>,
    effects: Vec<Effect>,
}

impl Step {
    fn to(next: State) -> Step {
        Step {
            next,
            fields: Vec::new(),
            effects: Vec::new(),
        }
    }

    fn field(mut self, name: &'static str, value: impl ToString) -> Step {
        self.fields.push((name, value.to_string()));
        self
    }

    fn effect(mut self, effect: Effect) -> Step {
        self.effects.push(effect);
        self
    }
}

/// Applies `event` to an act in `state`. See the module note for the
/// rules; `Ok((state.clone(), vec![]))` means the event changed nothing.
pub fn apply(
    act: &Act,
    state: &State,
    event: &Event,
    policy: &QueuePolicy,
) -> Result<(State, Vec<Effect>), TransitionError> {
    policy.check()?;
    if state.is_final() {
        return Err(TransitionError::Final {
            act: act.id.clone(),
            state: state.name(),
            event: event.name(),
        });
    }
    let Some(step) = step(act, state, event, policy)? else {
        return Ok((state.clone(), Vec::new()));
    };
    let mut fields: BTreeMap<&'static str, String> = BTreeMap::new();
    fields.insert("act", act.id.clone());
    fields.insert("run", act.run.clone());
    fields.insert("door", act.door.name().to_string());
    fields.insert("digest", act_digest(act));
    fields.insert("event", event.name().to_string());
    fields.insert("from", state.name().to_string());
    fields.insert("to", step.next.name().to_string());
    fields.extend(step.fields);
    let audit = Effect::Audit(AuditEntry {
        kind: AuditKind::of(&step.next),
        fields,
    });
    let mut effects = Vec::with_capacity(1 + step.effects.len());
    effects.push(audit);
    effects.extend(step.effects);
    Ok((step.next, effects))
}

/// `Pending` to `Approved` (or `Expired` when the window is over), for the
/// act's own digest only; `by` is the owner's name or `scope <rule>`.
fn approve(
    act: &Act,
    state: &State,
    event: &Event,
    digest: &str,
    by: &str,
    now: i64,
    ttl_secs: i64,
) -> Result<Step, TransitionError> {
    if *state != State::Pending {
        return Err(TransitionError::NotAllowed {
            act: act.id.clone(),
            state: state.name(),
            event: event.name(),
        });
    }
    checked(act, event)?;
    if ttl_secs <= 0 {
        return Err(TransitionError::InvalidTtl {
            act: act.id.clone(),
            ttl_secs,
        });
    }
    let actual = act_digest(act);
    if digest != actual {
        return Err(TransitionError::DigestMismatch {
            act: act.id.clone(),
            approved: digest.to_owned(),
            actual,
        });
    }
    Ok(if now >= act.expires_at {
        // A late approval is not a reason to proceed: the window is over,
        // so the act is.
        Step::to(State::Expired {
            why: format!("approval window closed at {}", act.expires_at),
        })
        .field("by", by)
    } else {
        let approval = Approval {
            digest: digest.to_owned(),
            by: by.to_owned(),
            at: now,
            expires_at: now.saturating_add(ttl_secs),
        };
        Step::to(State::Approved { approval })
            .field("by", by)
            .field("approval_expires_at", now.saturating_add(ttl_secs))
    })
}

fn step(
    act: &Act,
    state: &State,
    event: &Event,
    policy: &QueuePolicy,
) -> Result<Option<Step>, TransitionError> {
    let not_allowed = || TransitionError::NotAllowed {
        act: act.id.clone(),
        state: state.name(),
        event: event.name(),
    };
    let step = match event {
        Event::Approve {
            digest,
            by,
            now,
            ttl_secs,
        } => approve(act, state, event, digest, by.name(), *now, *ttl_secs)?,

        Event::ApproveUnderScope {
            digest,
            scope,
            now,
            ttl_secs,
        } => approve(
            act,
            state,
            event,
            digest,
            &format!("scope {scope}"),
            *now,
            *ttl_secs,
        )?,

        Event::Reject { why, by } => match state {
            State::Pending
            | State::Stale { .. }
            | State::Approved { .. }
            | State::AwaitingRetry { .. } => Step::to(State::Rejected {
                why: why.clone(),
                by: by.name().to_string(),
            })
            .field("by", by.name())
            .field("why", why),
            _ => return Err(not_allowed()),
        },

        Event::Tick { now } => match state {
            State::Pending | State::Stale { .. } if *now >= act.expires_at => {
                Step::to(State::Expired {
                    why: format!("approval window closed at {}", act.expires_at),
                })
            }
            State::Approved { approval } if *now >= approval.expires_at => {
                Step::to(State::Expired {
                    why: format!("approval expired at {} unused", approval.expires_at),
                })
            }
            State::AwaitingRetry {
                approval,
                attempts,
                last_failure,
                ..
            } if *now >= approval.expires_at => Step::to(State::Expired {
                why: format!(
                    "approval expired at {} after {attempts} failed attempt(s), last: {last_failure}",
                    approval.expires_at
                ),
            }),
            _ => return Ok(None),
        },

        Event::BeginExecution {
            recomputed_digest,
            now,
        } => {
            let (approval, attempt) = match state {
                State::Approved { approval } => (approval, 1),
                State::AwaitingRetry {
                    approval,
                    attempts,
                    not_before,
                    last_failure,
                } => {
                    if *attempts >= policy.max_attempts {
                        // The policy was lowered since the retry was
                        // scheduled: end it loudly rather than leave it.
                        return Ok(Some(
                            Step::to(State::Failed {
                                reason: last_failure.clone(),
                                attempts: *attempts,
                            })
                            .field("attempts", attempts)
                            .field("reason", last_failure),
                        ));
                    }
                    if *now < *not_before {
                        return Err(TransitionError::BackoffPending {
                            act: act.id.clone(),
                            not_before: *not_before,
                            now: *now,
                        });
                    }
                    (approval, attempts + 1)
                }
                State::Executing { attempt, .. } => {
                    return Err(TransitionError::AlreadyExecuting {
                        act: act.id.clone(),
                        attempt: *attempt,
                    })
                }
                _ => return Err(not_allowed()),
            };
            checked(act, event)?;
            if *now >= approval.expires_at {
                Step::to(State::Expired {
                    why: format!(
                        "approval expired at {} before attempt {attempt}",
                        approval.expires_at
                    ),
                })
                .field("attempt", attempt)
            } else if *recomputed_digest != approval.digest || act_digest(act) != approval.digest {
                // The stored act is compared too, so that an act row
                // changed after approval cannot ride on the old approval.
                let why = format!(
                    "recomputed digest {recomputed_digest} differs from approved {}",
                    approval.digest
                );
                Step::to(State::Stale { why: why.clone() })
                    .field("approved_digest", &approval.digest)
                    .field("recomputed_digest", recomputed_digest)
                    .effect(Effect::NeedsNewApproval {
                        act: act.id.clone(),
                        why,
                    })
            } else {
                Step::to(State::Executing {
                    approval: approval.clone(),
                    attempt,
                })
                .field("attempt", attempt)
                .field("approved_by", &approval.by)
                .effect(Effect::Execute {
                    act: act.clone(),
                    attempt,
                    digest: approval.digest.clone(),
                })
            }
        }

        Event::Succeeded { attempt, outcome } => {
            let current = executing_attempt(act, state, event, *attempt)?;
            Step::to(State::Done {
                outcome: outcome.clone(),
                attempts: current,
            })
            .field("attempt", current)
            .field("outcome", outcome)
        }

        Event::AttemptFailed {
            attempt,
            reason,
            retryable,
            now,
        } => {
            let current = executing_attempt(act, state, event, *attempt)?;
            let State::Executing { approval, .. } = state else {
                return Err(not_allowed());
            };
            if *retryable {
                retry_or_fail(act, approval, current, reason.clone(), *now, policy)
            } else {
                fail(current, reason.clone())
            }
        }

        Event::Requeue => match state {
            State::Stale { .. } => Step::to(State::Pending),
            _ => return Err(not_allowed()),
        },

        Event::Recover => match state {
            State::Executing { approval, attempt } => Step::to(State::OutcomeUnknown {
                approval: approval.clone(),
                attempt: *attempt,
            })
            .field("attempt", attempt)
            .effect(Effect::CheckRemote {
                act: act.clone(),
                attempt: *attempt,
            }),
            _ => return Err(not_allowed()),
        },

        Event::Resolve {
            attempt,
            found,
            now,
        } => {
            let State::OutcomeUnknown {
                approval,
                attempt: current,
            } = state
            else {
                return Err(not_allowed());
            };
            if attempt != current {
                return Err(TransitionError::AttemptMismatch {
                    act: act.id.clone(),
                    event: event.name(),
                    got: *attempt,
                    current: *current,
                });
            }
            match found {
                Found::Applied { outcome } => Step::to(State::Done {
                    outcome: outcome.clone(),
                    attempts: *current,
                })
                .field("attempt", current)
                .field("found", "applied")
                .field("outcome", outcome),
                // Known not to have happened: as safe to retry as a
                // retryable failure, and counted as an attempt.
                Found::NotApplied => retry_or_fail(
                    act,
                    approval,
                    *current,
                    format!("attempt {current} interrupted by a restart, found not applied"),
                    *now,
                    policy,
                )
                .field("found", "not_applied"),
                Found::CannotTell { why } => {
                    let why = format!(
                        "outcome of attempt {current} unknown after a restart ({why}): \
                         check the destination before approving again"
                    );
                    Step::to(State::Stale { why: why.clone() })
                        .field("attempt", current)
                        .field("found", "cannot_tell")
                        .effect(Effect::NeedsNewApproval {
                            act: act.id.clone(),
                            why,
                        })
                }
            }
        }
    };
    Ok(Some(step))
}

fn checked(act: &Act, event: &Event) -> Result<(), TransitionError> {
    act.check().map_err(|source| TransitionError::InvalidAct {
        event: event.name(),
        source,
    })
}

/// The running attempt, if `state` is executing it and `got` names it.
fn executing_attempt(
    act: &Act,
    state: &State,
    event: &Event,
    got: u32,
) -> Result<u32, TransitionError> {
    match state {
        State::Executing { attempt, .. } if *attempt == got => Ok(got),
        State::Executing { attempt, .. } => Err(TransitionError::AttemptMismatch {
            act: act.id.clone(),
            event: event.name(),
            got,
            current: *attempt,
        }),
        _ => Err(TransitionError::NotAllowed {
            act: act.id.clone(),
            state: state.name(),
            event: event.name(),
        }),
    }
}

/// After attempt `failed` is known not to have taken effect.
fn retry_or_fail(
    act: &Act,
    approval: &Approval,
    failed: u32,
    reason: String,
    now: i64,
    policy: &QueuePolicy,
) -> Step {
    if failed >= policy.max_attempts {
        return fail(failed, reason);
    }
    let not_before = now.saturating_add(policy.backoff.delay(failed));
    Step::to(State::AwaitingRetry {
        approval: approval.clone(),
        attempts: failed,
        not_before,
        last_failure: reason.clone(),
    })
    .field("attempt", failed)
    .field("reason", reason)
    .field("not_before", not_before)
    .effect(Effect::RetryAt {
        act: act.id.clone(),
        attempt: failed + 1,
        not_before,
    })
}

fn fail(attempts: u32, reason: String) -> Step {
    Step::to(State::Failed {
        reason: reason.clone(),
        attempts,
    })
    .field("attempts", attempts)
    .field("reason", reason)
}

/// Effects a durable state still owes after a restart, which the adapter
/// re-issues without a transition: a pending restart check, a scheduled
/// retry. (`Executing` owes nothing here: send it `Recover`.)
pub fn owed_effects(act: &Act, state: &State) -> Vec<Effect> {
    match state {
        State::OutcomeUnknown { attempt, .. } => vec![Effect::CheckRemote {
            act: act.clone(),
            attempt: *attempt,
        }],
        State::AwaitingRetry {
            attempts,
            not_before,
            ..
        } => vec![Effect::RetryAt {
            act: act.id.clone(),
            attempt: attempts + 1,
            not_before: *not_before,
        }],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
