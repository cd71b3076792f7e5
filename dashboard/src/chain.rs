//! The audit chain's state for the Morning page, at a cost that does not grow
//! with the chain: each load walks only the entries appended since the last
//! check, while a whole walk runs in the background every period (and on a
//! load whenever what was verified may have changed under it)
//! (`tests::the_first_check_walks_the_whole_chain_then_only_new_entries`,
//! `tests::a_replaced_or_shrunk_database_or_a_changed_checkpoint_walks_it_all`).
//!
//! Invariants:
//! - What to check next is a pure function ([`plan`]) of what was verified
//!   ([`Memo`]) and of what is seen now ([`Seen`]); a check's result changes
//!   the memo only through [`Memo::record`] (the memo's fields are private;
//!   `tests::the_verified_entry_never_moves_back` and
//!   `tests::a_break_stays_until_a_later_whole_walk_verifies` drive it through
//!   `begin` and `record` and ask [`plan`]). The I/O ([`check_on_load`],
//!   [`check_whole`]) reads the store and carries the plan out.
//! - A load's check starts at the last verified entry (its seq, hash and
//!   time) and walks it again and everything after it
//!   ([`orchestrator_audit::verify_after`]): a change at or after it is
//!   found on that load
//!   (`tests/tests/dashboard_api.rs::morning_reports_an_old_entry_rewritten_under_a_running_serve`,
//!   `orchestrator/audit/src/verify.rs::tests::verify_after_agrees_with_verify_on_every_change_after_the_start`).
//!   An empty log verified (no entry to start at) is walked whole, and never
//!   taken for a vanished entry
//!   (`tests::an_empty_log_verified_is_walked_whole_once_it_grows`).
//! - A change before it is found by the next whole walk: the background
//!   walk runs every period (`serve --chain-check-every`), and a load walks
//!   the whole chain at once when the state database was replaced or shrank
//!   or a checkpoint seen before changed or vanished. A whole walk also
//!   checks the entry verified last before it began, so a chain rewritten
//!   and re-sealed from the start is not taken for a good one.
//! - A break, once found, is shown until a whole walk that began after it
//!   was found verifies the chain again; a walk that began earlier (and may
//!   have read the chain before the change) never clears it
//!   (`tests::a_break_stays_until_a_later_whole_walk_verifies`).
//! - The page is told exactly what was verified: through which entry, when,
//!   how many entries this load walked, and when the last whole walk ran.

use orchestrator_audit::{BadEntry, Checkpoint, VerifyError};
use sha2::{Digest, Sha256};

use nightshift_core::state_store::{now_rfc3339, AuditSnapshot, StateStore};

/// The state database's identity and size (the store's fingerprint).
pub use nightshift_core::state_store::StoreFingerprint as FileId;

/// What a check sees before it reads the entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub db: Option<FileId>,
    pub checkpoints: Vec<Checkpoint>,
}

/// What the last checks established.
#[derive(Debug, Clone, Default)]
pub struct Memo {
    /// Tickets handed to checks as they begin, in order.
    next_ticket: u64,
    /// The last entry verified, and when.
    verified: Option<(Checkpoint, String)>,
    /// The last whole walk that verified: when, and through which entry.
    whole: Option<(String, u64)>,
    /// When the last whole walk (good or not) finished.
    whole_at: Option<String>,
    /// The database and checkpoints seen by the latest check that finished.
    seen: Option<(u64, Option<FileId>, usize, [u8; 32])>,
    broken: Option<Broken>,
}

/// A break found, and by which check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    pub error: String,
    pub seq: Option<u64>,
    pub found_at: String,
    pub by_whole_walk: bool,
    ticket: u64,
}

/// What a load (or the background) should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Walk the whole chain, for this reason.
    Whole(&'static str),
    /// Walk from this verified entry on.
    After(Checkpoint),
    /// A break is known: show it (the background's whole walk re-checks).
    Known,
}

/// A check that began: its ticket and the entry verified last before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begun {
    ticket: u64,
    pub known: Option<Checkpoint>,
}

/// A finished check.
#[derive(Debug, Clone)]
pub struct Checked {
    pub whole: bool,
    /// The last entry verified, or why the chain is broken (and where).
    pub result: Result<Checkpoint, (String, Option<u64>)>,
    pub at: String,
}

fn digest(checkpoints: &[Checkpoint]) -> [u8; 32] {
    let mut h = Sha256::new();
    for c in checkpoints {
        h.update(c.seq.to_be_bytes());
        h.update((c.hash.len() as u64).to_be_bytes());
        h.update(c.hash.as_bytes());
        h.update((c.time.len() as u64).to_be_bytes());
        h.update(c.time.as_bytes());
    }
    h.finalize().into()
}

/// What to check, given what was verified and what is seen now.
pub fn plan(memo: &Memo, now: &Seen) -> Plan {
    if memo.broken.is_some() {
        return Plan::Known;
    }
    let (Some((verified, _)), Some((_, db, count, sum))) = (&memo.verified, &memo.seen) else {
        return Plan::Whole("no check yet");
    };
    match (db, &now.db) {
        (Some(then), Some(now)) if then.dev != now.dev || then.ino != now.ino => {
            return Plan::Whole("the state database was replaced")
        }
        (Some(then), Some(now)) if now.len < then.len => {
            return Plan::Whole("the state database shrank")
        }
        (Some(_), None) => return Plan::Whole("the state database vanished"),
        _ => {}
    }
    if now.checkpoints.len() < *count || digest(&now.checkpoints[..*count]) != *sum {
        return Plan::Whole("a checkpoint changed or vanished");
    }
    // An empty log was verified: there is no entry to walk on from, and
    // walking the whole (new) chain costs what walking its new entries does.
    if verified.seq == 0 {
        return Plan::Whole("the log was empty");
    }
    Plan::After(verified.clone())
}

impl Memo {
    /// A check begins: its ticket, and the entry it must find unchanged.
    pub fn begin(&mut self) -> Begun {
        self.next_ticket += 1;
        Begun {
            ticket: self.next_ticket,
            known: self.verified.as_ref().map(|(c, _)| c.clone()),
        }
    }

    /// Folds a finished check in (see the module's invariants).
    pub fn record(&mut self, begun: &Begun, seen: &Seen, checked: Checked) {
        let newest = self.seen.as_ref().is_none_or(|(t, ..)| begun.ticket > *t);
        if newest {
            self.seen = Some((
                begun.ticket,
                seen.db,
                seen.checkpoints.len(),
                digest(&seen.checkpoints),
            ));
        }
        if checked.whole {
            self.whole_at = Some(checked.at.clone());
        }
        match checked.result {
            Ok(through) => {
                if checked.whole {
                    self.whole = Some((checked.at.clone(), through.seq));
                    if self
                        .broken
                        .as_ref()
                        .is_some_and(|b| b.ticket < begun.ticket)
                    {
                        self.broken = None;
                    }
                }
                let later = self
                    .verified
                    .as_ref()
                    .is_none_or(|(v, _)| through.seq >= v.seq);
                if later {
                    self.verified = Some((through, checked.at));
                }
            }
            Err((error, seq)) => {
                let keep = self
                    .broken
                    .as_ref()
                    .is_some_and(|b| b.ticket > begun.ticket);
                if !keep {
                    self.broken = Some(Broken {
                        error,
                        seq,
                        found_at: checked.at,
                        by_whole_walk: checked.whole,
                        ticket: begun.ticket,
                    });
                }
            }
        }
    }
}

/// The audit chain's state, as the Morning page shows it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ChainState {
    pub intact: bool,
    /// Verified through this entry (when intact); else the entries stored.
    pub entries: u64,
    pub head: Option<String>,
    pub last_checkpoint: Option<u64>,
    pub error: Option<String>,
    /// When the entry `entries` was verified.
    pub verified_at: Option<String>,
    /// What this load walked: "whole chain" or "new entries".
    pub walked: Option<&'static str>,
    /// Why this load walked the whole chain.
    pub why_whole: Option<&'static str>,
    /// How many entries this load walked, from which one.
    pub walked_entries: u64,
    pub walked_from: Option<u64>,
    /// The last whole walk that verified: when, and through which entry.
    pub whole_at: Option<String>,
    pub whole_through: Option<u64>,
    /// How often the background walks the whole chain, in seconds.
    pub whole_every: u64,
    /// When the break was found, and whether by a whole walk.
    pub broken_at: Option<String>,
    pub broken_by_whole_walk: bool,
}

fn error_seq(e: &VerifyError) -> (String, Option<u64>) {
    (e.to_string(), e.seq())
}

/// The whole walk, with the entry verified before it began (`known`): it
/// must still be there, unchanged.
fn walk_whole(
    store: &dyn StateStore,
    snap: &AuditSnapshot,
    known: Option<&Checkpoint>,
) -> Result<Checkpoint, (String, Option<u64>)> {
    let v = orchestrator_audit::verify_with_head(
        store.log_id(),
        &snap.entries,
        &snap.checkpoints,
        snap.head.as_ref(),
    )
    .map_err(|e| error_seq(&e))?;
    // An empty log verified before has no entry to find again.
    if let Some(k) = known.filter(|k| k.seq > 0) {
        let same = k
            .seq
            .checked_sub(1)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| snap.entries.get(i))
            .is_some_and(|e| e.hash == k.hash && e.time == k.time);
        if !same {
            let e = VerifyError::Entry {
                seq: k.seq,
                reason: BadEntry::StartMismatch,
            };
            return Err(error_seq(&e));
        }
    }
    Ok(last_of(snap, v.entries, &v.head))
}

fn last_of(snap: &AuditSnapshot, entries: u64, head: &str) -> Checkpoint {
    match snap.entries.last() {
        Some(e) => orchestrator_audit::checkpoint(e),
        // An empty log: nothing to re-check later but its emptiness.
        None => Checkpoint {
            seq: entries,
            hash: head.to_string(),
            time: String::new(),
        },
    }
}

/// The state database's identity and size, and the checkpoints.
pub fn seen(store: &dyn StateStore) -> Result<Seen, String> {
    let db = store.fingerprint();
    let checkpoints = store.checkpoints().map_err(|e| e.to_string())?;
    Ok(Seen { db, checkpoints })
}

/// A Morning load's check: what [`plan`] says, carried out on `store`.
pub fn check_on_load(
    memo: &std::sync::Mutex<Memo>,
    store: &dyn StateStore,
    whole_every: u64,
) -> ChainState {
    let lock = || memo.lock().unwrap_or_else(|p| p.into_inner());
    let seen = match seen(store) {
        Ok(s) => s,
        Err(e) => {
            return ChainState {
                error: Some(e),
                whole_every,
                ..ChainState::default()
            }
        }
    };
    let (todo, begun) = {
        let mut m = lock();
        (plan(&m, &seen), m.begin())
    };
    let mut walked = 0u64;
    let mut entries_stored = None;
    let checked = match &todo {
        Plan::Known => None,
        Plan::Whole(_) => {
            let (c, n) = whole_check(store, begun.known.as_ref());
            walked = n;
            entries_stored = Some(n);
            Some(c)
        }
        Plan::After(from) => Some(match store.audit_snapshot_from(from.seq) {
            Ok(snap) => {
                walked = snap.entries.len() as u64;
                let r = orchestrator_audit::verify_after(
                    store.log_id(),
                    from,
                    &snap.entries,
                    &snap.checkpoints,
                    snap.head.as_ref(),
                );
                Checked {
                    whole: false,
                    result: r
                        .map(|v| last_of(&snap, v.entries, &v.head))
                        .map_err(|e| error_seq(&e)),
                    at: now_rfc3339(),
                }
            }
            Err(e) => Checked {
                whole: false,
                result: Err((e.to_string(), None)),
                at: now_rfc3339(),
            },
        }),
    };
    let failed_after = matches!(
        (&todo, &checked),
        (Plan::After(_), Some(Checked { result: Err(_), .. }))
    );
    if let Some(c) = checked {
        lock().record(&begun, &seen, c);
    }
    // A break in the new entries: walk the whole chain now, so the first
    // bad entry is the one named (it may lie before the last verified).
    if failed_after {
        let begun = lock().begin();
        let c = whole_check(store, begun.known.as_ref());
        walked += c.1;
        lock().record(&begun, &seen, c.0);
    }
    let m = lock().clone();
    let walked_from = match &todo {
        Plan::Whole(_) => Some(1),
        Plan::After(from) if !failed_after => Some(from.seq),
        _ => None,
    };
    state_of(
        &m,
        &seen,
        match todo {
            Plan::Whole(why) => (Some("whole chain"), Some(why)),
            Plan::After(_) => (Some("new entries"), None),
            Plan::Known => (None, None),
        },
        (walked, walked_from),
        entries_stored,
        whole_every,
    )
}

/// The whole walk: streamed (memory bounded whatever the chain's length);
/// a chain that does not verify is read whole and walked again, so that
/// what is reported of it (the entries stored among them) is what it was.
fn whole_check(store: &dyn StateStore, known: Option<&Checkpoint>) -> (Checked, u64) {
    if let Ok(Ok((v, last))) = nightshift_core::state_store::verify_log_since(store, known) {
        return (
            Checked {
                whole: true,
                result: Ok(last),
                at: now_rfc3339(),
            },
            v.entries,
        );
    }
    match store.audit_snapshot() {
        Ok(snap) => (
            Checked {
                whole: true,
                result: walk_whole(store, &snap, known),
                at: now_rfc3339(),
            },
            snap.entries.len() as u64,
        ),
        Err(e) => (
            Checked {
                whole: true,
                result: Err((e.to_string(), None)),
                at: now_rfc3339(),
            },
            0,
        ),
    }
}

/// The background's whole walk, on its own store handle (page loads do
/// not wait for it).
pub fn check_whole(memo: &std::sync::Mutex<Memo>, store: &dyn StateStore) {
    let lock = || memo.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(seen) = seen(store) else {
        // Unreadable checkpoints: the next load reports it.
        return;
    };
    let begun = lock().begin();
    let (c, _) = whole_check(store, begun.known.as_ref());
    lock().record(&begun, &seen, c);
}

fn state_of(
    m: &Memo,
    seen: &Seen,
    (walked, why_whole): (Option<&'static str>, Option<&'static str>),
    (walked_entries, walked_from): (u64, Option<u64>),
    entries_stored: Option<u64>,
    whole_every: u64,
) -> ChainState {
    let base = ChainState {
        last_checkpoint: seen.checkpoints.last().map(|c| c.seq),
        walked,
        why_whole,
        walked_entries,
        walked_from,
        whole_at: m.whole.as_ref().map(|(at, _)| at.clone()),
        whole_through: m.whole.as_ref().map(|(_, n)| *n),
        whole_every,
        ..ChainState::default()
    };
    match (&m.broken, &m.verified) {
        (Some(b), _) => ChainState {
            intact: false,
            entries: entries_stored.unwrap_or(0),
            error: Some(b.error.clone()),
            broken_at: Some(b.found_at.clone()),
            broken_by_whole_walk: b.by_whole_walk,
            ..base
        },
        (None, Some((v, at))) => ChainState {
            intact: true,
            entries: v.seq,
            head: Some(v.hash.clone()),
            verified_at: Some(at.clone()),
            ..base
        },
        (None, None) => ChainState {
            error: Some("the chain was not checked".into()),
            ..base
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(seq: u64) -> Checkpoint {
        Checkpoint {
            seq,
            hash: format!("h{seq}"),
            time: format!("t{seq}"),
        }
    }

    fn seen(len: u64, cps: &[u64]) -> Seen {
        Seen {
            db: Some(FileId {
                dev: 1,
                ino: 2,
                len,
            }),
            checkpoints: cps.iter().map(|&s| cp(s)).collect(),
        }
    }

    fn ok(whole: bool, seq: u64) -> Checked {
        Checked {
            whole,
            result: Ok(cp(seq)),
            at: format!("2026-12-01T00:00:{seq:02}Z"),
        }
    }

    fn broken(whole: bool, seq: u64) -> Checked {
        Checked {
            whole,
            result: Err((format!("audit entry {seq}: altered"), Some(seq))),
            at: "2026-12-01T01:00:00Z".into(),
        }
    }

    fn verified(n: u64, s: &Seen) -> Memo {
        let mut m = Memo::default();
        let b = m.begin();
        m.record(&b, s, ok(true, n));
        m
    }

    #[test]
    fn the_first_check_walks_the_whole_chain_then_only_new_entries() {
        let s = seen(100, &[3, 5]);
        assert_eq!(plan(&Memo::default(), &s), Plan::Whole("no check yet"));
        let m = verified(10, &s);
        assert_eq!(plan(&m, &s), Plan::After(cp(10)));
        // Appends: the database grows, checkpoints are added after the others.
        assert_eq!(plan(&m, &seen(200, &[3, 5, 12])), Plan::After(cp(10)));
    }

    #[test]
    fn a_replaced_or_shrunk_database_or_a_changed_checkpoint_walks_it_all() {
        let s = seen(100, &[3, 5]);
        let m = verified(10, &s);
        let mut replaced = s.clone();
        replaced.db = Some(FileId {
            dev: 1,
            ino: 3,
            len: 100,
        });
        assert!(matches!(plan(&m, &replaced), Plan::Whole(_)));
        assert!(matches!(plan(&m, &seen(99, &[3, 5])), Plan::Whole(_)));
        assert!(matches!(plan(&m, &seen(100, &[3])), Plan::Whole(_)));
        assert!(matches!(plan(&m, &seen(100, &[4, 5])), Plan::Whole(_)));
        let mut gone = s.clone();
        gone.db = None;
        assert!(matches!(plan(&m, &gone), Plan::Whole(_)));
    }

    #[test]
    fn a_break_stays_until_a_later_whole_walk_verifies() {
        let s = seen(100, &[3]);
        let mut m = verified(10, &s);
        // A whole walk begins, then a load finds a break, then the walk
        // (which read the chain before the change) ends well.
        let walk = m.begin();
        let load = m.begin();
        m.record(&load, &s, broken(false, 11));
        assert_eq!(plan(&m, &s), Plan::Known);
        m.record(&walk, &s, ok(true, 12));
        assert_eq!(plan(&m, &s), Plan::Known, "an older walk cleared a break");
        // A whole walk that began after the break verifies: the break is gone.
        let later = m.begin();
        m.record(&later, &s, ok(true, 12));
        assert_eq!(plan(&m, &s), Plan::After(cp(12)));
    }

    #[test]
    fn an_empty_log_verified_is_walked_whole_once_it_grows() {
        let s = seen(100, &[]);
        let m = verified(0, &s);
        assert_eq!(plan(&m, &s), Plan::Whole("the log was empty"));
        assert_eq!(plan(&m, &seen(200, &[2])), Plan::Whole("the log was empty"));
    }

    #[test]
    fn the_verified_entry_never_moves_back() {
        let s = seen(100, &[3]);
        let mut m = verified(10, &s);
        let slow = m.begin();
        let fast = m.begin();
        m.record(&fast, &s, ok(false, 20));
        m.record(&slow, &s, ok(true, 15));
        assert_eq!(plan(&m, &s), Plan::After(cp(20)));
        assert_eq!(m.whole.as_ref().map(|w| w.1), Some(15));
    }
}
