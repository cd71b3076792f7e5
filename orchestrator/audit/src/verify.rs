//! Verification of a stored chain against its checkpoints.
//!
//! Invariant: `verify` returns `Ok` only if the entries are exactly a chain
//! that `seal` could have produced under this log's id, numbered 1..=n with
//! no gaps, and every checkpoint names one of them and matches it. On failure
//! it names the first position at which the chain provably stops being
//! that; the crate note lists the checks and what they cannot see
//! (`tests::untouched_chain_verifies_and_reports_its_head`,
//! `tests/chain_mutations.rs::any_single_mutation_is_reported_at_the_first_bad_entry`).

use std::borrow::Cow;

use crate::encoding::{self, Hashed};
use crate::text::{self, RawEntry};
use crate::{genesis, Checkpoint, Entry, LogId};

/// A chain that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// How many entries the chain holds.
    pub entries: u64,
    /// The hash of the last entry, or the genesis hash of an empty log.
    pub head: String,
    /// How many checkpoints were checked.
    pub checkpoints: u64,
}

/// Why a chain did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The first bad entry, by the seq it should have had.
    #[error("audit entry {seq}: {reason}")]
    Entry { seq: u64, reason: BadEntry },
    /// The checkpoint file is inconsistent in itself, before any entry is
    /// looked at. `index` counts checkpoints from 1 in the order given.
    #[error("audit checkpoint {index}: {reason}")]
    Checkpoint { index: u64, reason: BadCheckpoint },
}

impl VerifyError {
    /// The seq of the first bad entry, when an entry is to blame.
    pub fn seq(&self) -> Option<u64> {
        match self {
            VerifyError::Entry { seq, .. } => Some(*seq),
            VerifyError::Checkpoint { .. } => None,
        }
    }
}

/// What is wrong with an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEntry {
    #[error("duplicate of entry {of} (duplicated)")]
    Duplicate { of: u64 },
    #[error("holds entry {found} (entries deleted, inserted or reordered)")]
    WrongSequence { found: u64 },
    // An entry from another log with this log's seq fails here: the hash
    // binds the log id, and the id is not stored, so the two causes cannot
    // be told apart.
    #[error("hash does not match its contents (altered, or spliced from another log)")]
    Altered,
    #[error("does not link to the entry before it (inserted, or the entry before was replaced)")]
    BrokenLink,
    #[error("does not match checkpoint {index} (the log was rewritten at or before this entry)")]
    CheckpointMismatch { index: u64 },
    #[error("missing, but checkpoint {index} names entry {checkpoint} (log truncated)")]
    Truncated { index: u64, checkpoint: u64 },
    #[error("missing, but the chain's head names entry {head} (log truncated)")]
    HeadTruncated { head: u64 },
    #[error("does not match the chain's head (the log was rewritten at or before this entry)")]
    HeadMismatch,
    #[error("is not the entry verified earlier (the log was rewritten at or before this entry)")]
    StartMismatch,
}

/// What is wrong with the checkpoint file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadCheckpoint {
    #[error("names entry 0, which cannot exist")]
    ZeroSeq,
    #[error("names entry {seq} after a checkpoint of entry {previous} (checkpoints reordered)")]
    OutOfOrder { seq: u64, previous: u64 },
}

/// Checks `entries` (in stored order) and `checkpoints` (in stored order)
/// against each other and against `log`.
pub fn verify(
    log: &LogId,
    entries: &[Entry],
    checkpoints: &[Checkpoint],
) -> Result<Verified, VerifyError> {
    check_checkpoints(checkpoints)?;
    walk(log, (0, &genesis(log)), entries, checkpoints, 1)
}

/// The chain from `start` (an entry an earlier [`verify`] or `verify_after`
/// accepted: its seq, hash and time) onwards: `entries` are the stored
/// entries from `start.seq` on, the first of which must still be `start`
/// itself; each later one is checked as [`verify`] checks it, against the
/// checkpoints after `start` and the head (when it names `start` or later).
///
/// This sees every change at or after `start`, and a change before it only
/// when it moved `start` itself: an old entry rewritten (with the rest of
/// the chain left alone) needs a whole [`verify`] to be found.
pub fn verify_after(
    log: &LogId,
    start: &Checkpoint,
    entries: &[Entry],
    checkpoints: &[Checkpoint],
    head: Option<&Checkpoint>,
) -> Result<Verified, VerifyError> {
    check_checkpoints(checkpoints)?;
    let moved = VerifyError::Entry {
        seq: start.seq,
        reason: BadEntry::StartMismatch,
    };
    let Some(first) = entries.first() else {
        return Err(moved);
    };
    if start.seq == 0
        || first.seq != start.seq
        || first.hash != start.hash
        || first.time != start.time
    {
        return Err(moved);
    }
    // `start` itself is walked again (from the link it stores), so an entry
    // altered under its old hash is found too.
    let skipped = checkpoints.partition_point(|c| c.seq < start.seq);
    let mut verified = walk(
        log,
        (start.seq - 1, &first.prev),
        entries,
        &checkpoints[skipped..],
        skipped as u64 + 1,
    )?;
    // Those before `start` were checked when `start` was.
    verified.checkpoints = checkpoints.len() as u64;
    check_head(verified, head, |seq| {
        seq.checked_sub(start.seq)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| entries.get(i))
    })
}

/// Checks `entries` as the chain's entries after `after` (its seq and hash:
/// 0 and the genesis hash for the whole chain); `checkpoints` are sorted,
/// name entries after it, and the first is number `first_index` of the file.
fn walk(
    log: &LogId,
    after: (u64, &str),
    entries: &[Entry],
    checkpoints: &[Checkpoint],
    first_index: u64,
) -> Result<Verified, VerifyError> {
    let mut walker = Walker::new(
        Cow::Borrowed(log),
        after,
        Cow::Borrowed(checkpoints),
        first_index,
    );
    for entry in entries {
        walker.push(entry)?;
    }
    walker.finish()
}

/// How many of the latest entries' hash digests a walk keeps (8 bytes
/// each: 8 MiB), to name a duplicated entry as such.
const RECENT: usize = 1 << 20;

/// The chain walked one entry at a time, in memory that does not grow with
/// the chain (the checkpoints it is given, one hash, and a ring of the
/// latest [`RECENT`] entries' 64-bit digests): what [`verify`] and
/// [`StreamVerifier`] share. An entry found at a later position than its
/// seq names is a duplicate when it is exactly the entry checked at that
/// seq (its digest in the ring); otherwise, or when that entry is older
/// than the ring reaches, it is named out of sequence. Either is an error
/// at the same position.
#[derive(Debug)]
struct Walker<'a> {
    log: Cow<'a, LogId>,
    position: u64,
    prev: String,
    checkpoints: Cow<'a, [Checkpoint]>,
    next: usize,
    first_index: u64,
    /// The position walking began after.
    start: u64,
    recent: Vec<u64>,
}

/// The fields of an entry the walk compares (its seal judged apart).
#[derive(Debug, Clone, Copy)]
struct Link<'e> {
    seq: u64,
    time: &'e str,
    prev: &'e str,
    hash: &'e str,
}

fn digest64(hash: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hash.hash(&mut h);
    h.finish()
}

impl<'a> Walker<'a> {
    fn new(
        log: Cow<'a, LogId>,
        after: (u64, &str),
        checkpoints: Cow<'a, [Checkpoint]>,
        first_index: u64,
    ) -> Self {
        Walker {
            log,
            position: after.0,
            prev: after.1.to_owned(),
            checkpoints,
            next: 0,
            first_index,
            start: after.0,
            recent: Vec::new(),
        }
    }

    /// The ring's slot of the entry walked at `seq`.
    fn slot(&self, seq: u64) -> usize {
        ((seq - self.start - 1) % RECENT as u64) as usize
    }

    /// The digest of the entry walked at `seq` (before the current one),
    /// while the ring still holds it.
    fn recent_at(&self, seq: u64) -> Option<u64> {
        // Walked so far, the current entry not counted.
        let walked = self.position - 1 - self.start;
        if seq <= self.start
            || seq >= self.position
            || self.position - seq > walked.min(RECENT as u64)
        {
            return None;
        }
        self.recent.get(self.slot(seq)).copied()
    }

    fn sealed(&self, entry: &Entry) -> bool {
        let recomputed = encoding::entry_hash(
            &self.log,
            Hashed {
                seq: entry.seq,
                time: &entry.time,
                kind: &entry.kind,
                run: entry.run.as_deref(),
                body: &entry.body,
                prev: &entry.prev,
            },
        );
        // A body that cannot be encoded was never sealed: it was altered.
        recomputed.as_deref() == Ok(entry.hash.as_str())
    }

    fn push(&mut self, entry: &Entry) -> Result<(), VerifyError> {
        let sealed = self.sealed(entry);
        self.push_judged(entry, sealed)
    }

    /// [`Walker::push`] with the entry's seal already judged (`sealed`:
    /// its hash is its contents' under this log), so seals can be judged
    /// apart, on other threads.
    fn push_judged(&mut self, entry: &Entry, sealed: bool) -> Result<(), VerifyError> {
        self.push_link(
            Link {
                seq: entry.seq,
                time: &entry.time,
                prev: &entry.prev,
                hash: &entry.hash,
            },
            sealed,
        )
    }

    /// [`Walker::push_judged`] over the fields the walk compares.
    fn push_link(&mut self, entry: Link<'_>, sealed: bool) -> Result<(), VerifyError> {
        self.position += 1;
        let position = self.position;
        let bad = |reason| VerifyError::Entry {
            seq: position,
            reason,
        };
        if entry.seq != position {
            if entry.seq < position && self.recent_at(entry.seq) == Some(digest64(entry.hash)) {
                return Err(bad(BadEntry::Duplicate { of: entry.seq }));
            }
            return Err(bad(BadEntry::WrongSequence { found: entry.seq }));
        }
        if !sealed {
            return Err(bad(BadEntry::Altered));
        }
        if entry.prev != self.prev {
            return Err(bad(BadEntry::BrokenLink));
        }
        // Checkpoints are sorted by seq (checked before), so one cursor
        // suffices.
        while let Some(cp) = self
            .checkpoints
            .get(self.next)
            .filter(|cp| cp.seq == position)
        {
            let index = self.first_index + self.next as u64;
            if cp.hash != entry.hash || cp.time != entry.time {
                return Err(bad(BadEntry::CheckpointMismatch { index }));
            }
            self.next += 1;
        }
        self.prev.clear();
        self.prev.push_str(entry.hash);
        let slot = self.slot(position);
        let d = digest64(entry.hash);
        if slot < self.recent.len() {
            self.recent[slot] = d;
        } else {
            self.recent.push(d);
        }
        Ok(())
    }

    fn finish(self) -> Result<Verified, VerifyError> {
        if let Some(cp) = self.checkpoints.get(self.next) {
            return Err(VerifyError::Entry {
                seq: self.position + 1,
                reason: BadEntry::Truncated {
                    index: self.first_index + self.next as u64,
                    checkpoint: cp.seq,
                },
            });
        }
        Ok(Verified {
            entries: self.position,
            head: self.prev,
            checkpoints: self.checkpoints.len() as u64,
        })
    }
}

/// [`verify_with_head`] over entries handed over one at a time (read from
/// the store as they come, never all held): memory bounded by the
/// checkpoints and one entry, whatever the chain's length. The same fault
/// is named the same way as by [`verify_with_head`]: the entries and
/// checkpoints are judged first, a head that does not match is said only
/// once the whole chain walked.
#[derive(Debug)]
pub struct StreamVerifier {
    walker: Walker<'static>,
    head: Option<Checkpoint>,
    head_mismatch: bool,
    /// Scratch for [`StreamVerifier::push_raw`]'s encoding.
    scratch: Vec<u8>,
}

impl StreamVerifier {
    /// A verifier of the whole chain of `log` against `checkpoints` and
    /// `head`, both read before the entries are. Fails at once when the
    /// checkpoints are inconsistent in themselves.
    pub fn new(
        log: &LogId,
        checkpoints: Vec<Checkpoint>,
        head: Option<Checkpoint>,
    ) -> Result<Self, VerifyError> {
        check_checkpoints(&checkpoints)?;
        Ok(StreamVerifier {
            walker: Walker::new(
                Cow::Owned(log.clone()),
                (0, &genesis(log)),
                Cow::Owned(checkpoints),
                1,
            ),
            head,
            head_mismatch: false,
            scratch: Vec::new(),
        })
    }

    /// The next entry as stored (its body the JSON text), in stored order:
    /// the same verdict as [`StreamVerifier::push`] of the entry parsed
    /// from it, without building the body. `None` (nothing judged, nothing
    /// changed) when the body's text is not one this can hash with
    /// certainty (see `text`'s note): push the parsed entry instead.
    pub fn push_raw(&mut self, raw: &RawEntry<'_>) -> Option<Result<(), VerifyError>> {
        let digest = text::entry_hash_from_text(&self.walker.log, raw, &mut self.scratch)?;
        let mut hex = [0u8; 64];
        // 64 bytes is exactly a SHA-256's hex.
        let sealed =
            hex::encode_to_slice(digest, &mut hex).is_ok() && hex[..] == *raw.hash.as_bytes();
        let link = Link {
            seq: raw.seq,
            time: raw.time,
            prev: raw.prev,
            hash: raw.hash,
        };
        if let Err(e) = self.walker.push_link(link, sealed) {
            return Some(Err(e));
        }
        self.check_head_link(link);
        Some(Ok(()))
    }

    /// The next entry, in stored order. After an error, push no more.
    pub fn push(&mut self, entry: &Entry) -> Result<(), VerifyError> {
        self.walker.push(entry)?;
        self.check_head_at(entry);
        Ok(())
    }

    /// The next entries, in stored order: the same verdict as pushing them
    /// one by one, with their seals (the hashing, most of the cost) judged
    /// on up to `threads` threads at once.
    pub fn push_batch(&mut self, entries: &[Entry], threads: usize) -> Result<(), VerifyError> {
        let threads = threads.clamp(1, 16);
        let mut sealed = vec![false; entries.len()];
        if threads == 1 || entries.len() < 64 {
            for (s, e) in sealed.iter_mut().zip(entries) {
                *s = self.walker.sealed(e);
            }
        } else {
            let per = entries.len().div_ceil(threads);
            let walker = &self.walker;
            std::thread::scope(|scope| {
                for (out, chunk) in sealed.chunks_mut(per).zip(entries.chunks(per)) {
                    scope.spawn(move || {
                        for (s, e) in out.iter_mut().zip(chunk) {
                            *s = walker.sealed(e);
                        }
                    });
                }
            });
        }
        for (entry, ok) in entries.iter().zip(sealed) {
            self.walker.push_judged(entry, ok)?;
            self.check_head_at(entry);
        }
        Ok(())
    }

    fn check_head_at(&mut self, entry: &Entry) {
        self.check_head_link(Link {
            seq: entry.seq,
            time: &entry.time,
            prev: &entry.prev,
            hash: &entry.hash,
        });
    }

    fn check_head_link(&mut self, entry: Link<'_>) {
        if let Some(head) = &self.head {
            if head.seq == entry.seq && (entry.hash != head.hash || entry.time != head.time) {
                self.head_mismatch = true;
            }
        }
    }

    /// How many entries were pushed.
    pub fn entries(&self) -> u64 {
        self.walker.position
    }

    /// The verdict once every entry was pushed.
    pub fn finish(self) -> Result<Verified, VerifyError> {
        let head = self.head;
        let mismatch = self.head_mismatch;
        let verified = self.walker.finish()?;
        if mismatch {
            if let Some(head) = &head {
                return Err(VerifyError::Entry {
                    seq: head.seq,
                    reason: BadEntry::HeadMismatch,
                });
            }
        }
        check_head(verified, head.as_ref(), |_| None)
    }
}

/// [`verify`], and then the chain's head kept apart from the entries: the
/// entry it names must exist and match it. The head is written after every
/// committed append, so a suffix removed or rewritten at or before it is
/// found even when no checkpoint follows it. Checks of the entries and
/// checkpoints come first, so the same fault is named the same way.
pub fn verify_with_head(
    log: &LogId,
    entries: &[Entry],
    checkpoints: &[Checkpoint],
    head: Option<&Checkpoint>,
) -> Result<Verified, VerifyError> {
    let verified = verify(log, entries, checkpoints)?;
    // Seq 0 is the empty log's head; `seq - 1` indexes the named entry.
    check_head(verified, head, |seq| {
        seq.checked_sub(1)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| entries.get(i))
    })
}

/// The head against the verified chain: it may not name an entry past the
/// end, and the entry it names (when `entry_at` has it) must match it.
fn check_head<'e>(
    verified: Verified,
    head: Option<&Checkpoint>,
    entry_at: impl Fn(u64) -> Option<&'e Entry>,
) -> Result<Verified, VerifyError> {
    let Some(head) = head else {
        return Ok(verified);
    };
    if head.seq > verified.entries {
        return Err(VerifyError::Entry {
            seq: verified.entries + 1,
            reason: BadEntry::HeadTruncated { head: head.seq },
        });
    }
    if let Some(entry) = entry_at(head.seq) {
        if entry.hash != head.hash || entry.time != head.time {
            return Err(VerifyError::Entry {
                seq: head.seq,
                reason: BadEntry::HeadMismatch,
            });
        }
    }
    Ok(verified)
}

fn check_checkpoints(checkpoints: &[Checkpoint]) -> Result<(), VerifyError> {
    let mut previous = 0u64;
    for (cp, index) in checkpoints.iter().zip(1u64..) {
        if cp.seq == 0 {
            return Err(VerifyError::Checkpoint {
                index,
                reason: BadCheckpoint::ZeroSeq,
            });
        }
        // Equal seqs are allowed: a run may end and the next start with no
        // entry in between. Both are checked against the same entry.
        if cp.seq < previous {
            return Err(VerifyError::Checkpoint {
                index,
                reason: BadCheckpoint::OutOfOrder {
                    seq: cp.seq,
                    previous,
                },
            });
        }
        previous = cp.seq;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{checkpoint, seal, SealError};
    use serde_json::{json, Map, Value};

    fn log() -> LogId {
        LogId("01J9TESTLOG".into())
    }

    fn chain_in(log: &LogId, n: u64) -> Result<Vec<Entry>, SealError> {
        let mut entries: Vec<Entry> = Vec::new();
        for i in 1..=n {
            let body = match json!({"i": i, "tree": format!("sha256:{i:02}"), "bytes": i * 100}) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            let time = format!("2025-01-01T00:00:{i:02}Z");
            let entry = seal(
                log,
                entries.last(),
                &time,
                "test.event",
                Some("run-1"),
                body,
            )?;
            entries.push(entry);
        }
        Ok(entries)
    }

    fn chain(n: u64) -> Vec<Entry> {
        chain_in(&log(), n).unwrap_or_default()
    }

    fn at(entries: &[Entry], seqs: &[usize]) -> Vec<Checkpoint> {
        seqs.iter().map(|&s| checkpoint(&entries[s - 1])).collect()
    }

    fn failure(entries: &[Entry], checkpoints: &[Checkpoint]) -> Option<(u64, BadEntry)> {
        match verify(&log(), entries, checkpoints) {
            Err(VerifyError::Entry { seq, reason }) => Some((seq, reason)),
            _ => None,
        }
    }

    #[test]
    fn untouched_chain_verifies_and_reports_its_head() {
        let entries = chain(5);
        let cps = at(&entries, &[1, 3, 5]);
        assert_eq!(
            verify(&log(), &entries, &cps),
            Ok(Verified {
                entries: 5,
                head: entries[4].hash.clone(),
                checkpoints: 3,
            })
        );
    }

    #[test]
    fn empty_log_verifies_with_genesis_head() {
        assert_eq!(
            verify(&log(), &[], &[]),
            Ok(Verified {
                entries: 0,
                head: genesis(&log()),
                checkpoints: 0,
            })
        );
    }

    #[test]
    fn changed_body_value_is_named_altered() {
        let mut entries = chain(5);
        let cps = at(&entries, &[5]);
        entries[2].body.insert("bytes".into(), json!(301));
        assert_eq!(failure(&entries, &cps), Some((3, BadEntry::Altered)));
    }

    #[test]
    fn changed_prev_is_named_altered() {
        let mut entries = chain(3);
        entries[1].prev.replace_range(0..1, "X");
        assert_eq!(failure(&entries, &[]), Some((2, BadEntry::Altered)));
    }

    #[test]
    fn entry_spliced_from_another_log_is_named() {
        let mut entries = chain(4);
        let other = chain_in(&LogId("01J9OTHERLOG".into()), 4).unwrap_or_default();
        entries[2] = other[2].clone();
        assert_eq!(failure(&entries, &[]), Some((3, BadEntry::Altered)));
    }

    #[test]
    fn whole_log_from_another_state_directory_fails_at_entry_one() {
        let other = chain_in(&LogId("01J9OTHERLOG".into()), 3).unwrap_or_default();
        assert_eq!(failure(&other, &[]), Some((1, BadEntry::Altered)));
    }

    #[test]
    fn deleted_entry_is_named_by_its_position() {
        let mut entries = chain(5);
        entries.remove(1);
        assert_eq!(
            failure(&entries, &[]),
            Some((2, BadEntry::WrongSequence { found: 3 }))
        );
    }

    #[test]
    fn misplaced_forged_entry_is_named() {
        let mut entries = chain(5);
        // Validly sealed after entry 1, but inserted after entry 3.
        let forged = seal(&log(), Some(&entries[0]), "t", "forged", None, Map::new());
        entries.insert(3, forged.unwrap_or_else(|_| entries[0].clone()));
        assert_eq!(
            failure(&entries, &[]),
            Some((4, BadEntry::WrongSequence { found: 2 }))
        );
    }

    #[test]
    fn renumbered_forged_entry_is_named_broken_link() {
        let mut entries = chain(5);
        // Sealed as entry 4 but linked to entry 2: fits by number only.
        let mut fake_prev = entries[1].clone();
        fake_prev.seq = 3;
        let forged = seal(&log(), Some(&fake_prev), "t", "forged", None, Map::new());
        entries.insert(3, forged.unwrap_or_else(|_| entries[0].clone()));
        assert_eq!(failure(&entries, &[]), Some((4, BadEntry::BrokenLink)));
    }

    #[test]
    fn duplicated_entry_is_named_duplicate() {
        let mut entries = chain(5);
        entries.insert(4, entries[1].clone());
        assert_eq!(
            failure(&entries, &[]),
            Some((5, BadEntry::Duplicate { of: 2 }))
        );
    }

    #[test]
    fn swapped_entries_are_named_by_the_first_position() {
        let mut entries = chain(5);
        entries.swap(1, 3);
        assert_eq!(
            failure(&entries, &[]),
            Some((2, BadEntry::WrongSequence { found: 4 }))
        );
    }

    #[test]
    fn rewritten_tail_fails_at_the_next_checkpoint() -> Result<(), SealError> {
        let original = chain(6);
        let cps = at(&original, &[1, 5]);
        // Re-seal from entry 3 on with different contents: self-consistent,
        // so only the checkpoint of entry 5 can tell.
        let mut entries = original[..2].to_vec();
        for e in &original[2..] {
            let next = seal(
                &log(),
                entries.last(),
                &e.time,
                "rewritten",
                None,
                Map::new(),
            )?;
            entries.push(next);
        }
        assert_eq!(
            failure(&entries, &cps),
            Some((5, BadEntry::CheckpointMismatch { index: 2 }))
        );
        Ok(())
    }

    #[test]
    fn truncation_before_a_checkpoint_names_the_first_missing_entry() {
        let entries = chain(6);
        let cps = at(&entries, &[2, 5]);
        assert_eq!(
            failure(&entries[..3], &cps),
            Some((
                4,
                BadEntry::Truncated {
                    index: 2,
                    checkpoint: 5
                }
            ))
        );
        assert_eq!(
            failure(&[], &cps),
            Some((
                1,
                BadEntry::Truncated {
                    index: 1,
                    checkpoint: 2
                }
            ))
        );
    }

    #[test]
    fn truncation_after_the_last_checkpoint_is_undetectable_by_design() {
        let entries = chain(6);
        let cps = at(&entries, &[2, 4]);
        assert_eq!(
            verify(&log(), &entries[..4], &cps).map(|v| v.entries),
            Ok(4)
        );
    }

    #[test]
    fn the_head_finds_any_removed_suffix_and_a_rewrite() {
        let entries = chain(6);
        let cps = at(&entries, &[2]);
        let head = checkpoint(&entries[5]);
        let check = |e: &[Entry], h: &Checkpoint| {
            verify_with_head(&log(), e, &cps, Some(h)).map_err(|e| (e.seq(), e.to_string()))
        };
        assert_eq!(check(&entries, &head).map(|v| v.entries), Ok(6));
        for kept in 2..6 {
            assert_eq!(
                check(&entries[..kept], &head),
                Err((
                    Some(kept as u64 + 1),
                    format!("audit entry {}: missing, but the chain's head names entry 6 (log truncated)", kept + 1)
                ))
            );
        }
        // A head that lags (its writer died after the commit) is no alarm.
        assert_eq!(
            check(&entries, &checkpoint(&entries[3])).map(|v| v.entries),
            Ok(6)
        );
        // The suffix re-sealed from entry 4 on: the head's entry differs.
        let mut rewritten = entries[..3].to_vec();
        for i in 4..=6u64 {
            let e = seal(
                &log(),
                rewritten.last(),
                "2025-01-01T09:00:00Z",
                "forged",
                None,
                Map::new(),
            )
            .unwrap_or_else(|_| unreachable!());
            assert_eq!(e.seq, i);
            rewritten.push(e);
        }
        assert_eq!(verify(&log(), &rewritten, &cps).map(|v| v.entries), Ok(6));
        assert_eq!(check(&rewritten, &head).map_err(|e| e.0), Err(Some(6)));
        // Without a head, the old guarantee is unchanged.
        assert_eq!(
            verify_with_head(&log(), &entries[..4], &cps, None).map(|v| v.entries),
            Ok(4)
        );
    }

    #[test]
    fn altered_checkpoint_is_named_by_its_entry() {
        let entries = chain(4);
        let mut cps = at(&entries, &[2, 4]);
        cps[0].time.push('!');
        assert_eq!(
            failure(&entries, &cps),
            Some((2, BadEntry::CheckpointMismatch { index: 1 }))
        );
    }

    #[test]
    fn repeated_checkpoint_of_the_same_entry_is_fine() {
        let entries = chain(3);
        let cps = at(&entries, &[2, 2, 3]);
        assert_eq!(verify(&log(), &entries, &cps).map(|v| v.checkpoints), Ok(3));
    }

    #[test]
    fn reordered_checkpoints_are_rejected() {
        let entries = chain(4);
        let cps = at(&entries, &[3, 1]);
        assert_eq!(
            verify(&log(), &entries, &cps),
            Err(VerifyError::Checkpoint {
                index: 2,
                reason: BadCheckpoint::OutOfOrder {
                    seq: 1,
                    previous: 3
                }
            })
        );
    }

    #[test]
    fn checkpoint_of_entry_zero_is_rejected() {
        let entries = chain(2);
        let mut cps = at(&entries, &[1]);
        cps[0].seq = 0;
        assert_eq!(
            verify(&log(), &entries, &cps),
            Err(VerifyError::Checkpoint {
                index: 1,
                reason: BadCheckpoint::ZeroSeq
            })
        );
    }

    #[test]
    fn float_smuggled_into_a_stored_body_is_altered_not_a_panic() {
        let mut entries = chain(2);
        entries[1].body.insert("x".into(), json!(0.25));
        assert_eq!(failure(&entries, &[]), Some((2, BadEntry::Altered)));
    }

    #[test]
    fn message_names_the_entry() {
        let mut entries = chain(17);
        entries[16].kind.push('x');
        assert_eq!(
            verify(&log(), &entries, &[]).map_err(|e| e.to_string()),
            Err("audit entry 17: hash does not match its contents (altered, or spliced from another log)".to_owned())
        );
    }

    #[test]
    fn chain_survives_a_json_round_trip() -> Result<(), serde_json::Error> {
        let entries = chain(4);
        let cps = at(&entries, &[4]);
        let stored = serde_json::to_string(&entries)?;
        let loaded: Vec<Entry> = serde_json::from_str(&stored)?;
        assert_eq!(verify(&log(), &loaded, &cps).map(|v| v.entries), Ok(4));
        Ok(())
    }

    fn after(
        entries: &[Entry],
        start: u64,
        cps: &[Checkpoint],
        head: Option<&Checkpoint>,
    ) -> Result<Verified, VerifyError> {
        let i = usize::try_from(start - 1).unwrap_or(0);
        let anchor = checkpoint(&chain(start)[i]);
        verify_after(&log(), &anchor, &entries[i.min(entries.len())..], cps, head)
    }

    #[test]
    fn verify_after_agrees_with_verify_on_every_change_after_the_start() {
        let good = chain(8);
        let cps = at(&good, &[2, 5, 8]);
        let head = checkpoint(&good[7]);
        for start in 1..=8u64 {
            assert_eq!(
                after(&good, start, &cps, Some(&head)),
                verify_with_head(&log(), &good, &cps, Some(&head)),
                "untouched, from {start}"
            );
        }
        // Each entry after the start altered, removed, or the tail cut.
        for start in 1..=7u64 {
            for k in (start as usize + 1)..=8 {
                let mut altered = good.clone();
                altered[k - 1].body.insert("bytes".into(), json!(1));
                let mut removed = good.clone();
                removed.remove(k - 1);
                let cut = good[..k - 1].to_vec();
                for bad in [altered, removed, cut] {
                    assert_eq!(
                        after(&bad, start, &cps, Some(&head)).map_err(|e| e.to_string()),
                        verify_with_head(&log(), &bad, &cps, Some(&head))
                            .map_err(|e| e.to_string()),
                        "from {start}, entry {k}"
                    );
                }
            }
        }
    }

    #[test]
    fn verify_after_names_a_start_that_moved_and_misses_older_changes() {
        let good = chain(6);
        let cps = at(&good, &[3, 6]);
        let mut moved = good.clone();
        moved[3].body.insert("bytes".into(), json!(1));
        assert_eq!(
            after(&moved, 4, &cps, None),
            Err(VerifyError::Entry {
                seq: 4,
                reason: BadEntry::Altered
            })
        );
        let resealed = chain_in(&LogId("another".into()), 6).unwrap_or_default();
        moved[3] = resealed[3].clone();
        assert_eq!(
            after(&moved, 4, &cps, None),
            Err(VerifyError::Entry {
                seq: 4,
                reason: BadEntry::StartMismatch
            })
        );
        assert!(after(&good[..3], 4, &cps, None).is_err(), "start missing");
        // An older entry rewritten: only the whole walk finds it (the
        // reason a reader must still run `verify` now and then).
        let mut old = good.clone();
        old[1].body.insert("bytes".into(), json!(1));
        assert_eq!(after(&old, 4, &cps, None).map(|v| v.entries), Ok(6));
        assert_eq!(failure(&old, &cps), Some((2, BadEntry::Altered)));
    }

    fn streamed(
        entries: &[Entry],
        cps: &[Checkpoint],
        head: Option<&Checkpoint>,
    ) -> Result<Verified, VerifyError> {
        let mut v = StreamVerifier::new(&log(), cps.to_vec(), head.cloned())?;
        for e in entries {
            v.push(e)?;
        }
        v.finish()
    }

    /// The streamed verdict is `verify_with_head`'s, head faults included,
    /// and an entry's fault is named before the head's, as there.
    #[test]
    fn streaming_names_every_head_fault_as_verify_with_head_does() {
        let entries = chain(6);
        let cps = at(&entries, &[2, 6]);
        let good = checkpoint(&entries[5]);
        let mut wrong = checkpoint(&entries[2]);
        wrong.hash = entries[3].hash.clone();
        let past = Checkpoint {
            seq: 9,
            ..good.clone()
        };
        let mut altered = entries.clone();
        altered[4].kind = "other".into();
        for (es, head) in [
            (&entries, Some(&good)),
            (&entries, None),
            (&entries, Some(&wrong)),
            (&entries, Some(&past)),
            (&altered, Some(&wrong)),
        ] {
            assert_eq!(
                streamed(es, &cps, head),
                verify_with_head(&log(), es, &cps, head),
                "head {head:?}"
            );
        }
        assert!(matches!(
            streamed(&altered, &cps, Some(&wrong)),
            Err(VerifyError::Entry {
                seq: 5,
                reason: BadEntry::Altered
            })
        ));
    }

    /// A duplicate is named as such from the ring of recent digests, and a
    /// different entry sealed for the same earlier position is not.
    #[test]
    fn a_duplicate_is_told_from_a_forgery_without_keeping_the_chain() {
        let mut entries = chain(5);
        entries.insert(4, entries[1].clone());
        assert_eq!(
            streamed(&entries, &[], None),
            Err(VerifyError::Entry {
                seq: 5,
                reason: BadEntry::Duplicate { of: 2 }
            })
        );
    }

    /// Seals judged on several threads in batches give the verdict pushing
    /// one by one gives, for a fault anywhere in a batch.
    #[test]
    fn batches_judged_on_threads_name_the_same_first_fault() {
        let entries = chain(300);
        let cps = at(&entries, &[100, 300]);
        for bad in [1usize, 63, 64, 150, 299] {
            for fault in 0..3 {
                let mut es = entries.clone();
                match fault {
                    0 => es[bad].kind = "altered".into(),
                    1 => es[bad].prev = "0".repeat(64),
                    _ => {
                        es.remove(bad);
                    }
                }
                let batched = StreamVerifier::new(&log(), cps.clone(), None).and_then(|mut v| {
                    for chunk in es.chunks(97) {
                        v.push_batch(chunk, 4)?;
                    }
                    v.finish()
                });
                assert_eq!(batched, verify(&log(), &es, &cps), "fault {fault} at {bad}");
                assert!(batched.is_err());
            }
        }
        let whole = StreamVerifier::new(&log(), cps.clone(), None).and_then(|mut v| {
            v.push_batch(&entries, 2)?;
            v.finish()
        });
        assert_eq!(whole, verify(&log(), &entries, &cps));
    }
}
