//! The audit chain: pure functions that seal content-free entries into a
//! hash chain, take checkpoints of it, and verify a stored chain against its
//! checkpoints. No I/O: the caller stores entries (one write path) and keeps
//! checkpoints apart from them, in a separate append-only file (which finds
//! what a rewrite of the entries alone hides:
//! `tests/tests/audit.rs::deleting_the_tail_before_the_last_checkpoint_is_found`).
//!
//! # Format
//!
//! A log has a [`LogId`], a random id chosen once per state directory. Entry
//! `seq` (1-based, consecutive) stores `prev`, the hash of entry `seq - 1`,
//! or for entry 1 the log's [`genesis`] hash. Its `hash` is the lowercase hex
//! SHA-256 of
//!
//! ```text
//! lp("nightshift-audit-entry-v1") lp(log id) u64(seq) lp(time) lp(kind)
//! run: 0x00 | 0x01 lp(run)
//! body: value(object)
//! lp(prev)
//! ```
//!
//! where `u64(n)` is 8 bytes big-endian, `lp(s)` is `u64(len) ++ bytes`, and
//! `value` is a tagged encoding: `n` null, `f`/`t` booleans, `i lp(decimal)`
//! integers, `s lp(utf-8)` strings, `a u64(count) value*` arrays, and
//! `o u64(count) (lp(key) value)*` objects with keys in byte order. The
//! genesis hash is the SHA-256 of `lp("nightshift-audit-genesis-v1")
//! lp(log id)`. Every item is length-prefixed or tagged, so no two different
//! entries (or the same entry in two logs) hash the same bytes. Bodies may
//! not hold floats: their JSON form does not reliably round-trip through
//! storage, so [`seal`] refuses them.
//!
//! A [`Checkpoint`] copies an entry's `seq`, `hash` and `time`. The caller
//! takes one at least at every run's start and end, and keeps the chain's
//! *head* (a checkpoint of the last entry, replaced after every committed
//! append) apart from the entries too; [`verify_with_head`] checks it.
//!
//! # What [`verify`] checks, in this order
//!
//! 1. The checkpoints themselves: each names an entry (`seq >= 1`) and their
//!    seqs never decrease (they are appended as the log grows)
//!    (`verify::tests::checkpoint_of_entry_zero_is_rejected`,
//!    `verify::tests::reordered_checkpoints_are_rejected`).
//! 2. Walking the entries, at position `p` (1-based): the entry's hash is not
//!    one already seen (duplicate); its `seq` is `p` (deletion, insertion,
//!    reordering); its hash matches its contents under this log's id
//!    (altered byte, or an entry spliced from another log); its `prev` is the
//!    hash of the entry before (a validly sealed entry put in the wrong
//!    place); every checkpoint at `p` matches it (the chain was rewritten).
//! 3. No checkpoint names an entry past the end (truncation).
//! 4. With [`verify_with_head`]: the head names an entry that exists
//!    (truncation) and matches it (rewrite).
//! 5. [`verify_after`] makes the same checks from an entry already verified
//!    (its checkpoint) onwards: that entry must be unchanged, and everything
//!    after it is walked as above. It costs only the new entries, and sees a
//!    change before that entry only when the change moved it: a reader that
//!    uses it must still run a whole [`verify`] now and then
//!    (`verify::tests::verify_after_agrees_with_verify_on_every_change_after_the_start`,
//!    `verify::tests::verify_after_names_a_start_that_moved_and_misses_older_changes`).
//!
//! The first failure is reported with the position of the entry it concerns
//! (the seq that entry should have had) and stops the walk.
//!
//! # What it cannot detect
//!
//! Hashes are unkeyed, so anyone who can write the entries can re-seal them.
//! Tampering is therefore provable only up to the last checkpoint, or the
//! head when one is given: a rewrite of entries after it, or truncation
//! after it, verifies. A head written after every append leaves only the
//! entries appended after it was last written (a writer that died between
//! its commit and the head) unprovable. A chain rewritten from entry `k` on
//! is reported at the first checkpoint (or head) at or after `k`, which is
//! the first entry at which the rewrite is provable. Checkpoints and the
//! head are only as trustworthy as the files that hold them
//! (`verify::tests::truncation_after_the_last_checkpoint_is_undetectable_by_design`,
//! `verify::tests::rewritten_tail_fails_at_the_next_checkpoint`,
//! `verify::tests::the_head_finds_any_removed_suffix_and_a_rewrite`).

#![forbid(unsafe_code)]

mod encoding;
mod text;
mod verify;

pub use text::RawEntry;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use verify::{
    verify, verify_after, verify_with_head, BadCheckpoint, BadEntry, StreamVerifier, Verified,
    VerifyError,
};

/// The id of one log. Every hash is bound to it, so an entry spliced in from
/// another log does not verify. The caller picks it at random (at least 128
/// bits) when it creates a state directory and never changes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LogId(pub String);

/// One audit entry. Holds no content: ids, digests, sizes, labels, rule ids
/// and paths only, never file contents, task text or agent output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Position in the log, from 1, with no gaps.
    pub seq: u64,
    /// RFC 3339 UTC, as given by the caller.
    pub time: String,
    /// What happened; the caller owns the vocabulary.
    pub kind: String,
    /// The run this entry concerns, if any.
    pub run: Option<String>,
    /// Content-free fields of the event. An object, never floats.
    pub body: Map<String, Value>,
    /// Lowercase hex SHA-256 of the previous entry, or the genesis hash.
    pub prev: String,
    /// Lowercase hex SHA-256 of this entry's encoding (see the crate note).
    pub hash: String,
}

/// An entry's seq, hash and time, kept apart from the entries so that a
/// rewritten or truncated log can be told from a true one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub seq: u64,
    pub hash: String,
    pub time: String,
}

/// An entry could not be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("sealing audit entry {seq} ({kind}): body field {pointer} is not an integer, string, boolean, null, array or object")]
    NotCanonical {
        seq: u64,
        kind: String,
        pointer: String,
    },
}

/// The `prev` of entry 1 in `log`.
pub fn genesis(log: &LogId) -> String {
    encoding::genesis_hash(log)
}

/// Seals the entry that follows `prev` (or starts the log when `prev` is
/// `None`): assigns its seq, links it and computes its hash.
pub fn seal(
    log: &LogId,
    prev: Option<&Entry>,
    time: &str,
    kind: &str,
    run: Option<&str>,
    body: Map<String, Value>,
) -> Result<Entry, SealError> {
    let (seq, prev) = match prev {
        // Saturating: a log of 2^64 entries cannot exist, and a stuck seq
        // would be caught by verify rather than panic here.
        Some(entry) => (entry.seq.saturating_add(1), entry.hash.clone()),
        None => (1, genesis(log)),
    };
    let hash = encoding::entry_hash(
        log,
        encoding::Hashed {
            seq,
            time,
            kind,
            run,
            body: &body,
            prev: &prev,
        },
    )
    .map_err(|e| SealError::NotCanonical {
        seq,
        kind: kind.to_owned(),
        pointer: e.pointer,
    })?;
    Ok(Entry {
        seq,
        time: time.to_owned(),
        kind: kind.to_owned(),
        run: run.map(str::to_owned),
        body,
        prev,
        hash,
    })
}

/// The checkpoint of `entry`, to be stored apart from the entries.
pub fn checkpoint(entry: &Entry) -> Checkpoint {
    Checkpoint {
        seq: entry.seq,
        hash: entry.hash.clone(),
        time: entry.time.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn golden_hash() {
        // Pinned so that a change to the encoding cannot slip in unnoticed:
        // it would make every stored log fail to verify. The values were
        // computed by an independent implementation of the format in the
        // crate note (a short Python script), not by this crate.
        let log = LogId("01J0000000000000000000000".into());
        assert_eq!(
            genesis(&log),
            "f12b18dbc5362be6ac74867c0c4cc5eb17604c8a55e80072712d1d5f474e0c78"
        );
        let entry = seal(
            &log,
            None,
            "2025-01-01T00:00:00Z",
            "run.started",
            Some("run-1"),
            body(json!({"tree": "abc", "bytes": 12, "labels": ["untrusted", "private"]})),
        );
        assert_eq!(
            entry.map(|e| e.hash),
            Ok("cd28801744af3548f98b9d0e6de58ce43da8a7f3f7dc9dfb30c9b2ac49b99c55".to_owned())
        );
    }

    #[test]
    fn seal_links_and_numbers_entries() -> Result<(), SealError> {
        let log = LogId("l".into());
        let first = seal(&log, None, "t1", "a", None, Map::new())?;
        let second = seal(&log, Some(&first), "t2", "b", Some("r"), Map::new())?;
        assert_eq!((first.seq, second.seq), (1, 2));
        assert_eq!(first.prev, genesis(&log));
        assert_eq!(second.prev, first.hash);
        assert_ne!(first.hash, second.hash);
        Ok(())
    }

    #[test]
    fn genesis_depends_on_the_log() {
        assert_ne!(genesis(&LogId("a".into())), genesis(&LogId("b".into())));
    }

    #[test]
    fn seal_refuses_floats() {
        let err = seal(
            &LogId("l".into()),
            None,
            "t",
            "cap.measured",
            None,
            body(json!({"cpu": 0.5})),
        );
        assert_eq!(
            err.map_err(|e| e.to_string()),
            Err("sealing audit entry 1 (cap.measured): body field /cpu is not an integer, string, boolean, null, array or object".to_owned())
        );
    }

    #[test]
    fn checkpoint_copies_the_entry() -> Result<(), SealError> {
        let entry = seal(&LogId("l".into()), None, "t", "k", None, Map::new())?;
        assert_eq!(
            checkpoint(&entry),
            Checkpoint {
                seq: 1,
                hash: entry.hash.clone(),
                time: "t".into()
            }
        );
        Ok(())
    }
}
