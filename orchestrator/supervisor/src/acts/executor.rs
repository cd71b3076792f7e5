//! The act executor: carries out what the owner's decisions (and autonomy
//! scopes) approved, apart from the decisions themselves.
//!
//! An approval, a rejection or a re-binding is one store transaction that
//! returns at once (`acts::approve`, `reject`, `rebind`); this module does
//! the work. One [`Executor::pass`] claims every act that is executable now,
//! one at a time, with a lease in the store ([`ActQueue::claim_act`]),
//! carries out exactly the effects the queue machine returns, and returns
//! the earliest scheduled retry. `nightshift serve` runs passes in a task
//! ([`run`]), woken by a decision of its own process ([`wake`]), by the
//! timer of the next retry, or by a short poll for decisions made
//! elsewhere; the command line runs one pass after an approval when no
//! `serve` answers.
//!
//! Invariants:
//! - Only the holder of an act's unlapsed lease works on it; the lease is
//!   renewed while an effect runs (every third of its length), so a live
//!   executor keeps it, and a dead one's lapses within one length. An
//!   executor starts an attempt or an effect only after renewing its lease
//!   succeeded just before (`tests::an_executor_that_lost_its_lease_starts_nothing`);
//!   one that stalls past its lease mid-effect cannot be stopped, and the
//!   destination's own check (a push's expected old value) keeps the
//!   taken-over attempt from taking effect twice.
//! - Every move is the machine's (`deferred_queue::apply`), written with
//!   its audit entry and conditioned on the state it moves from
//!   (`transition_act`); an effect is carried out only after the move that
//!   owes it committed. So an `Execute` always follows a durable
//!   `Executing`, and a move lost to someone else (the owner rejected it,
//!   another executor took a lapsed lease) stops the work on that act
//!   (`tests::no_effect_twice_none_lost_retries_scheduled`,
//!   `tests::an_executor_that_lost_its_lease_starts_nothing`).
//! - Resuming is the machine's too: an act found `Executing` under a lapsed
//!   lease (its executor died mid-effect) is sent `Recover`, which owes a
//!   `CheckRemote` before anything else; `OutcomeUnknown` and
//!   `AwaitingRetry` owe what `deferred_queue::owed_effects` says. An
//!   effect whose outcome is unknown is never blindly carried out again
//!   (`tests::no_effect_twice_none_lost_retries_scheduled`,
//!   `tests/tests/acts.rs::kill_9_during_execution_never_sends_twice_and_ends_defined`).
//! - `RetryAt` is a time, never a sleep: the pass releases the act and
//!   reports the time; [`run`] waits on a timer, holding no lease, lock or
//!   transaction (`tests::a_retry_is_scheduled_on_the_timer_not_slept`).
//! - While frozen nothing starts: an act that would begin an attempt is
//!   released untouched (a restart check still runs: it reads, never writes
//!   the destination) (`tests::while_frozen_an_approved_act_is_released_untouched`).

use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::Duration;

use deferred_queue::{Act, Effect, Event, Found, State};
use nightshift_core::state_store::StateStore;

use super::{frozen, line_of, rows_of, step, Row};

/// How an attempt failed, as the machine wants it told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Supervisor-written (an error class), never agent content.
    pub reason: String,
    /// True only if the effect is known not to have happened.
    pub retryable: bool,
}

/// What carries the effects out at the destinations. The real one is
/// [`super::Destinations`]-backed (`acts::RealEffects`); tests use a
/// counting fake.
pub trait Effects: Sync {
    /// An attempt's work, read from the store on the executor's thread and
    /// carried out on another (no store there), while the lease is renewed.
    type Job: Send;
    /// The act's digest recomputed from the world as it is now (a string
    /// that equals no digest when it cannot be told).
    fn recompute<S: StateStore + ?Sized>(&self, store: &S, act: &Act) -> String;
    /// Reads what carrying out `row` needs.
    fn prepare<S: StateStore + ?Sized>(&self, store: &S, row: &Row) -> Self::Job;
    /// Carries one attempt out: the outcome, or how it failed.
    fn carry_out(&self, job: Self::Job) -> Result<String, Failure>;
    /// Looks at the destination: did an attempt whose outcome is unknown
    /// take effect?
    fn check(&self, act: &Act) -> Found;
}

/// One executor: who holds the leases, for how long, and its clock.
pub struct Executor<'a, E: Effects> {
    /// Unique per executor instance (a process may run several).
    pub holder: String,
    /// A lease's length, seconds (at least 1).
    pub lease_secs: i64,
    pub effects: &'a E,
    /// Unix seconds.
    pub now: &'a (dyn Fn() -> i64 + Sync),
}

impl<E: Effects> std::fmt::Debug for Executor<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("holder", &self.holder)
            .field("lease_secs", &self.lease_secs)
            .finish_non_exhaustive()
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// (act, line) for every act the pass worked on, in order.
    pub lines: Vec<(String, String)>,
    /// The earliest retry still scheduled, unix seconds.
    pub next_retry: Option<i64>,
}

/// A new holder name: unique, so two executors never share a lease.
pub fn new_holder() -> String {
    format!(
        "executor {} {}",
        std::process::id(),
        ulid::Ulid::new().to_string().to_lowercase()
    )
}

/// The lease of the command line's pass and of `serve`'s executor: how
/// long an act a killed executor held waits before another takes it over.
/// Renewed every third of it while an effect runs.
pub const LEASE_SECS: i64 = 15;

impl<E: Effects> Executor<'_, E> {
    fn lease_until(&self) -> i64 {
        (self.now)().saturating_add(self.lease_secs.max(1))
    }

    /// Claims and works every act executable now (or only `only`), then
    /// returns. Errors of one act are reported as its line; a store that
    /// cannot be claimed from ends the pass with an error.
    pub fn pass<S: StateStore + ?Sized>(
        &self,
        store: &mut S,
        only: Option<&str>,
    ) -> Result<Pass, String> {
        let mut pass = Pass::default();
        // An act this pass left (scheduled, frozen, lost) is not taken
        // again by it: a pass ends.
        let mut seen: Vec<String> = Vec::new();
        loop {
            let now = (self.now)();
            let claimed = store
                .claim_act(&self.holder, now, self.lease_until(), only)
                .map_err(|e| format!("claiming an act: {e}"))?;
            let Some(stored) = claimed else { break };
            let row = match rows_of(vec![stored]) {
                Ok(mut r) if r.len() == 1 => r.remove(0),
                Ok(_) => break,
                Err(e) => return Err(format!("reading a claimed act: {e}")),
            };
            let id = row.act.id.clone();
            if seen.contains(&id) {
                let _ = store.release_act(&id, &self.holder);
                break;
            }
            seen.push(id.clone());
            let (line, retry) = self.work(store, row);
            let _ = store.release_act(&id, &self.holder);
            if let Some(t) = retry {
                pass.next_retry = Some(pass.next_retry.map_or(t, |n: i64| n.min(t)));
            }
            tracing::info!(act = %id, holder = %self.holder, "{line}");
            pass.lines.push((id, line));
            if only.is_some() {
                break;
            }
        }
        if only.is_none() {
            if let Ok(Some(t)) = store.next_retry() {
                pass.next_retry = Some(pass.next_retry.map_or(t, |n| n.min(t)));
            }
        }
        Ok(pass)
    }

    /// Works one claimed act until it owes nothing now: returns its line
    /// and, when a retry is scheduled, its time.
    fn work<S: StateStore + ?Sized>(&self, store: &mut S, mut row: Row) -> (String, Option<i64>) {
        let mut owed: VecDeque<Effect> = match &row.state {
            // Approved: the machine is owed a start, as a retry due now.
            State::Approved { .. } => VecDeque::from([Effect::RetryAt {
                act: row.act.id.clone(),
                attempt: 1,
                not_before: i64::MIN,
            }]),
            // Claimable while executing only when its executor's lease
            // lapsed: that executor died mid-attempt.
            State::Executing { .. } => match step(store, &row, &Event::Recover) {
                Ok((state, effects)) => {
                    row.state = state;
                    effects.into()
                }
                Err(e) => return (e, None),
            },
            state => deferred_queue::owed_effects(&row.act, state).into(),
        };
        while let Some(effect) = owed.pop_front() {
            let event = match effect {
                Effect::Audit(_) => continue, // written with its move
                Effect::NeedsNewApproval { act, why } => {
                    tracing::info!(act = %act, "the act needs a new approval: {why}");
                    continue;
                }
                Effect::RetryAt { not_before, .. } if not_before > (self.now)() => {
                    return (line_of(&row), Some(not_before));
                }
                Effect::RetryAt { .. } => {
                    match frozen(store) {
                        Ok(None) => {}
                        Ok(Some(why)) => {
                            return (
                                format!(
                                    "act {}: {}, not carried out: nightshift is frozen ({why})",
                                    row.act.id,
                                    row.state.name()
                                ),
                                None,
                            )
                        }
                        Err(e) => return (format!("act {}: {e}", row.act.id), None),
                    }
                    self.renew(store, &row.act.id);
                    let recomputed_digest = self.effects.recompute(store, &row.act);
                    // The recomputation reads the destination: the lease
                    // must still be this executor's before the start it
                    // decides.
                    if !self.renew(store, &row.act.id) {
                        return (lost(&row), None);
                    }
                    Event::BeginExecution {
                        recomputed_digest,
                        now: (self.now)(),
                    }
                }
                Effect::Execute { attempt, .. } => {
                    let job = self.effects.prepare(store, &row);
                    // Fenced: an executor that stalled past its lease (and
                    // so may have been taken over) starts no effect.
                    if !self.renew(store, &row.act.id) {
                        return (lost(&row), None);
                    }
                    match self.leased(store, &row.act.id, || self.effects.carry_out(job)) {
                        Ok(outcome) => Event::Succeeded { attempt, outcome },
                        Err(f) => Event::AttemptFailed {
                            attempt,
                            reason: f.reason,
                            retryable: f.retryable,
                            now: (self.now)(),
                        },
                    }
                }
                Effect::CheckRemote { act, attempt } => {
                    let found = self.leased(store, &row.act.id, || self.effects.check(&act));
                    Event::Resolve {
                        attempt,
                        found,
                        now: (self.now)(),
                    }
                }
            };
            match step(store, &row, &event) {
                Ok((state, effects)) => {
                    row.state = state;
                    owed.extend(effects);
                }
                Err(e) => return (e, None),
            }
        }
        (line_of(&row), None)
    }

    /// Extends this executor's lease on `id`: false when it is not this
    /// executor's any more (another took it over after it lapsed) or the
    /// store could not say.
    fn renew<S: StateStore + ?Sized>(&self, store: &mut S, id: &str) -> bool {
        let now = (self.now)();
        let held = matches!(
            store.renew_act(id, &self.holder, now, self.lease_until()),
            Ok(true)
        );
        if !held {
            tracing::warn!(act = %id, holder = %self.holder, "an act's lease could not be renewed");
        }
        held
    }

    /// Runs `work` on another thread while this one renews the act's lease
    /// every third of its length.
    fn leased<S: StateStore + ?Sized, T: Send>(
        &self,
        store: &mut S,
        id: &str,
        work: impl FnOnce() -> T + Send,
    ) -> T {
        let every = Duration::from_millis((self.lease_secs.max(1) as u64 * 1000 / 3).max(100));
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            scope.spawn(move || {
                let _ = tx.send(work());
            });
            loop {
                match rx.recv_timeout(every) {
                    Ok(value) => return value,
                    // An effect under way cannot be stopped safely: a
                    // lost lease is logged, and the destination's own
                    // check (a push's expected old value, a request's
                    // idempotent lookup) keeps a second attempt harmless.
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        self.renew(store, id);
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        panic!("an act's effect panicked")
                    }
                }
            }
        })
    }
}

/// The line of an act this executor stopped working on because its lease
/// is not its own any more.
fn lost(row: &Row) -> String {
    format!(
        "act {}: {}, left to the executor that holds its lease now (this one's lapsed)",
        row.act.id,
        row.state.name()
    )
}

/// Wakes this process's running executor ([`run`]) at once: a decision
/// was committed that it should act on.
pub fn wake() {
    WAKE.notify_one();
}

static WAKE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// How often [`run`] looks for decisions made by other processes.
pub const POLL: Duration = Duration::from_secs(2);

/// `serve`'s executor: passes until the process ends, each in a blocking
/// thread; between them it waits (holding nothing) for [`wake`], the next
/// retry's time, or [`POLL`].
pub async fn run<F>(pass: std::sync::Arc<F>)
where
    F: Fn() -> Result<Pass, String> + Send + Sync + 'static,
{
    loop {
        let one = std::sync::Arc::clone(&pass);
        let next = match tokio::task::spawn_blocking(move || one()).await {
            Ok(Ok(p)) => p.next_retry,
            Ok(Err(e)) => {
                tracing::warn!("the act executor's pass failed: {e}");
                None
            }
            Err(e) => {
                tracing::warn!("the act executor's pass panicked: {e}");
                None
            }
        };
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        // A retry still due after the pass is held by another executor or
        // kept by a freeze: it is looked at again at the next poll.
        let wait = next
            .filter(|t| *t > now)
            .map_or(POLL, |t| POLL.min(Duration::from_secs((t - now) as u64)));
        tokio::select! {
            _ = WAKE.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    //! The executor over the fake store and a fake destination, under
    //! crashes at any point of an act's work: no effect twice, none lost,
    //! retries scheduled and never slept.

    use std::collections::{BTreeMap, VecDeque};
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Mutex;

    use deferred_queue::{act_digest, Approval, Content, Door, Routing, Target};
    use nightshift_core::audit_log::Event as AuditEvent;
    use nightshift_core::state_store::fake::{MemStore, SharedMemStore};
    use nightshift_core::state_store::ActQueue;
    use proptest::prelude::*;

    use super::*;
    use crate::acts::rows;

    /// What the fake destination does on its next call.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Next {
        Succeed,
        /// Refused before anything happened.
        FailRetryable,
        /// Failed in a way that may or may not have taken effect.
        FailFinal,
        /// The executor dies before the effect happens.
        CrashBefore,
        /// The executor dies after the effect happened.
        CrashAfter,
    }

    fn next_of(b: u8) -> Next {
        match b % 8 {
            0..=2 => Next::Succeed,
            3 => Next::FailRetryable,
            4 => Next::FailFinal,
            5 => Next::CrashBefore,
            _ => Next::CrashAfter,
        }
    }

    /// A destination that counts what took effect and plays a script.
    #[derive(Default)]
    struct Fake {
        script: Mutex<VecDeque<Next>>,
        /// act -> effects that took place there.
        applied: Mutex<BTreeMap<String, u32>>,
        /// act -> calls of `carry_out`.
        calls: Mutex<BTreeMap<String, u32>>,
    }

    impl Fake {
        fn next(&self) -> Next {
            self.script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Next::Succeed)
        }
        fn apply(&self, act: &str) {
            *self.applied.lock().unwrap().entry(act.into()).or_default() += 1;
        }
    }

    impl Effects for Fake {
        type Job = String;
        fn recompute<S: StateStore + ?Sized>(&self, _store: &S, act: &Act) -> String {
            act_digest(act)
        }
        fn prepare<S: StateStore + ?Sized>(&self, _store: &S, row: &Row) -> String {
            row.act.id.clone()
        }
        fn carry_out(&self, act: String) -> Result<String, Failure> {
            *self.calls.lock().unwrap().entry(act.clone()).or_default() += 1;
            match self.next() {
                Next::Succeed => {
                    self.apply(&act);
                    Ok("sent".into())
                }
                Next::FailRetryable => Err(Failure {
                    reason: "connection refused".into(),
                    retryable: true,
                }),
                Next::FailFinal => Err(Failure {
                    reason: "HTTP 500".into(),
                    retryable: false,
                }),
                Next::CrashBefore => std::panic::panic_any(Crash),
                Next::CrashAfter => {
                    self.apply(&act);
                    std::panic::panic_any(Crash)
                }
            }
        }
        fn check(&self, act: &Act) -> Found {
            if self.applied.lock().unwrap().contains_key(&act.id) {
                Found::Applied {
                    outcome: "found".into(),
                }
            } else {
                Found::NotApplied
            }
        }
    }

    /// The executor process dying (a `kill -9`): unwinds out of the pass,
    /// leaving its lease and whatever state it had committed.
    struct Crash;

    fn act(i: usize) -> Act {
        Act {
            id: format!("a{i:02}"),
            run: "r1".into(),
            actor: "run-r1".into(),
            door: Door::Notify,
            routing: Routing {
                destination: "room".into(),
                target: Target::Message {
                    endpoint: "room".into(),
                },
            },
            content: Content::Message {
                body_digest: format!("d{i}"),
                size: 1,
            },
            policy_generation: "g1".into(),
            deciding_rules: vec!["r".into()],
            created_at: 0,
            expires_at: 1_000_000_000,
        }
    }

    /// A store with `n` acts, each approved until far in the future.
    fn approved(dir: &std::path::Path, n: usize) -> MemStore {
        let mut store = MemStore::new(dir);
        for i in 0..n {
            let act = act(i);
            let state = State::Approved {
                approval: Approval {
                    digest: act_digest(&act),
                    by: "owner".into(),
                    at: 0,
                    expires_at: 1_000_000_000,
                },
            };
            store
                .put_act(
                    &act.id,
                    &act.run,
                    &serde_json::to_value(&act).unwrap(),
                    &serde_json::to_value(&state).unwrap(),
                    None,
                    &AuditEvent::Act {
                        act: act.id.clone(),
                        transition: "approved".into(),
                        fields: serde_json::json!({}),
                    },
                )
                .unwrap();
        }
        store
    }

    fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Executors that die at any point (before or after the effect),
        /// destinations that fail, and a clock that only moves when the
        /// test moves it: every act ends final, each effect took place at
        /// most once, every done act's effect took place exactly once, and
        /// every act whose effect took place is done; no pass waits.
        #[test]
        fn no_effect_twice_none_lost_retries_scheduled(
            n in 1usize..5,
            script in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut store = approved(dir.path(), n);
            let fake = Fake {
                script: Mutex::new(script.iter().map(|b| next_of(*b)).collect()),
                ..Fake::default()
            };
            let clock = AtomicI64::new(1_000);
            let now = || clock.load(Ordering::SeqCst);
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let mut generation = 0;
            for _ in 0..200 {
                generation += 1;
                let exec = Executor {
                    holder: format!("executor {generation}"),
                    lease_secs: 30,
                    effects: &fake,
                    now: &now,
                };
                // A pass attempts an act at most once: a retry it owes is
                // scheduled for a later pass, never waited for in this one.
                let before = fake.calls.lock().unwrap().clone();
                let passed = quietly(|| exec.pass(&mut store, None));
                for (id, n) in fake.calls.lock().unwrap().iter() {
                    let was = before.get(id).copied().unwrap_or(0);
                    prop_assert!(*n <= was + 1, "a pass attempted act {id} {} times", n - was);
                }
                let all_final = rows(&store, None).unwrap().iter().all(|r| r.state.is_final());
                if all_final {
                    break;
                }
                match passed {
                    // Nothing was due: time moves to the next retry.
                    Ok(Ok(p)) => {
                        let t = p.next_retry.unwrap_or(now() + 1);
                        prop_assert!(t >= now(), "a retry in the past was left: {t}");
                        clock.store(t.max(now() + 1), Ordering::SeqCst);
                    }
                    Ok(Err(e)) => prop_assert!(false, "the pass failed: {e}"),
                    // Died: its lease lapses before the next executor.
                    Err(_) => {
                        clock.fetch_add(31, Ordering::SeqCst);
                    }
                }
            }
            std::panic::set_hook(previous);
            let applied = fake.applied.lock().unwrap().clone();
            for row in rows(&store, None).unwrap() {
                let id = &row.act.id;
                let times = applied.get(id).copied().unwrap_or(0);
                prop_assert!(row.state.is_final(), "act {id} left {:?}", row.state);
                prop_assert!(times <= 1, "act {id} took effect {times} times");
                if let State::Done { .. } = row.state {
                    prop_assert_eq!(times, 1, "act {} done without its effect", id);
                }
                if times == 1 {
                    prop_assert!(
                        matches!(row.state, State::Done { .. }),
                        "act {id} took effect but is {:?}", row.state
                    );
                }
                let calls = fake.calls.lock().unwrap().get(id).copied().unwrap_or(0);
                prop_assert!(calls <= 3, "act {id} attempted {calls} times, more than the policy's 3");
            }
            orchestrator_audit::verify(&store.log, &store.audit, &[]).unwrap();
        }
    }

    #[test]
    fn while_frozen_an_approved_act_is_released_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = approved(dir.path(), 1);
        nightshift_core::policy::freeze(&mut store, None, "night off").unwrap();
        let fake = Fake::default();
        let now = || 1_000;
        let exec = Executor {
            holder: "e".into(),
            lease_secs: 30,
            effects: &fake,
            now: &now,
        };
        exec.pass(&mut store, None).unwrap();
        assert!(
            fake.calls.lock().unwrap().is_empty(),
            "carried out while frozen"
        );
        let row = rows(&store, None).unwrap().pop().unwrap();
        assert!(
            matches!(row.state, State::Approved { .. }),
            "{:?}",
            row.state
        );
        // Released: another executor may take it at once.
        assert!(store
            .claim_act("other", 1_000, 1_030, None)
            .unwrap()
            .is_some());
    }

    #[test]
    fn a_retry_is_scheduled_on_the_timer_not_slept() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = approved(dir.path(), 1);
        let fake = Fake {
            script: Mutex::new(VecDeque::from([Next::FailRetryable])),
            ..Fake::default()
        };
        let now = || 1_000;
        let exec = Executor {
            holder: "e".into(),
            lease_secs: 30,
            effects: &fake,
            now: &now,
        };
        let pass = exec.pass(&mut store, None).unwrap();
        // One attempt in the pass: the retry was not waited for and made.
        assert_eq!(fake.calls.lock().unwrap().values().sum::<u32>(), 1);
        // The backoff after one failure is 2 s: scheduled, not waited for.
        assert_eq!(pass.next_retry, Some(1_002));
        let row = rows(&store, None).unwrap().pop().unwrap();
        assert!(
            matches!(
                row.state,
                State::AwaitingRetry {
                    not_before: 1_002,
                    ..
                }
            ),
            "{:?}",
            row.state
        );
        // Not claimable before its time; then carried out by the next pass.
        assert!(store
            .claim_act("other", 1_001, 1_031, None)
            .unwrap()
            .is_none());
        let later = || 1_002;
        let exec = Executor {
            now: &later,
            ..exec
        };
        exec.pass(&mut store, None).unwrap();
        let row = rows(&store, None).unwrap().pop().unwrap();
        assert!(matches!(row.state, State::Done { .. }), "{:?}", row.state);
        assert_eq!(fake.applied.lock().unwrap().get("a00"), Some(&1));
    }

    #[test]
    fn an_unlapsed_lease_keeps_a_second_executor_off_the_act() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = approved(dir.path(), 1);
        assert!(store
            .claim_act("first", 1_000, 1_030, None)
            .unwrap()
            .is_some());
        assert!(store
            .claim_act("second", 1_029, 1_059, None)
            .unwrap()
            .is_none());
        assert!(store.renew_act("a00", "first", 1_029, 1_060).unwrap());
        assert!(store
            .claim_act("second", 1_059, 1_089, None)
            .unwrap()
            .is_none());
        // Held through its last second, then lapsed: taken over, and the
        // first holder cannot renew it any more.
        assert!(store
            .claim_act("second", 1_060, 1_090, None)
            .unwrap()
            .is_none());
        assert!(store
            .claim_act("second", 1_061, 1_090, None)
            .unwrap()
            .is_some());
        assert!(!store.renew_act("a00", "first", 1_061, 1_091).unwrap());
        store.release_act("a00", "first").unwrap();
        assert!(store
            .claim_act("third", 1_061, 1_091, None)
            .unwrap()
            .is_none());
        store.release_act("a00", "second").unwrap();
        assert!(store
            .claim_act("third", 1_061, 1_091, None)
            .unwrap()
            .is_some());
    }

    /// Takes the act's lease over (as a second executor would once the
    /// first stalled past it) at the moment named, then behaves as `Fake`.
    struct Thief<'a> {
        inner: Fake,
        store: std::sync::Arc<Mutex<MemStore>>,
        clock: &'a AtomicI64,
        in_prepare: bool,
    }

    impl Thief<'_> {
        fn steal(&self) {
            let now = self.clock.fetch_add(31, Ordering::SeqCst) + 31;
            let taken = self
                .store
                .lock()
                .unwrap()
                .claim_act("thief", now, now + 30, None)
                .unwrap();
            assert!(taken.is_some(), "the lapsed lease was not taken over");
        }
    }

    impl Effects for Thief<'_> {
        type Job = String;
        fn recompute<S: StateStore + ?Sized>(&self, store: &S, act: &Act) -> String {
            if !self.in_prepare {
                self.steal();
            }
            self.inner.recompute(store, act)
        }
        fn prepare<S: StateStore + ?Sized>(&self, store: &S, row: &Row) -> String {
            if self.in_prepare {
                self.steal();
            }
            self.inner.prepare(store, row)
        }
        fn carry_out(&self, act: String) -> Result<String, Failure> {
            self.inner.carry_out(act)
        }
        fn check(&self, act: &Act) -> Found {
            self.inner.check(act)
        }
    }

    /// An executor that stalled past its lease while deciding a start (the
    /// recomputation) or preparing an effect, and was taken over, starts
    /// nothing: the act is left to the holder of its lease.
    #[test]
    fn an_executor_that_lost_its_lease_starts_nothing() {
        for in_prepare in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut store = SharedMemStore::new(approved(dir.path(), 1));
            let clock = AtomicI64::new(1_000);
            let now = || clock.load(Ordering::SeqCst);
            let thief = Thief {
                inner: Fake::default(),
                store: store.inner.clone(),
                clock: &clock,
                in_prepare,
            };
            let exec = Executor {
                holder: "stalled".into(),
                lease_secs: 30,
                effects: &thief,
                now: &now,
            };
            let pass = exec.pass(&mut store, None).unwrap();
            assert_eq!(
                thief.inner.calls.lock().unwrap().values().sum::<u32>(),
                0,
                "an effect was started under a lost lease (stolen in {})",
                if in_prepare { "prepare" } else { "recompute" }
            );
            assert!(pass.lines[0].1.contains("left to the executor"), "{pass:?}");
            // The holder carries it out, once (an attempt the stalled
            // executor had begun is resumed by checking the destination).
            store.release_act("a00", "thief").unwrap();
            let later = || clock.load(Ordering::SeqCst);
            let fake = Fake::default();
            let holder = Executor {
                holder: "thief".into(),
                lease_secs: 30,
                effects: &fake,
                now: &later,
            };
            for _ in 0..5 {
                let pass = holder.pass(&mut store, None).unwrap();
                match pass.next_retry {
                    Some(t) => clock.store(t.max(later() + 1), Ordering::SeqCst),
                    None => break,
                }
            }
            let row = rows(&store, None).unwrap().pop().unwrap();
            assert!(matches!(row.state, State::Done { .. }), "{:?}", row.state);
            assert_eq!(fake.applied.lock().unwrap().get("a00"), Some(&1));
        }
    }
}
