//! Property: any single tampering with a stored chain that the format can
//! detect is detected, and the report names the first bad entry.
//!
//! Each case builds a valid chain of 1..=60 entries with random bodies and
//! checkpoints at random positions plus the last entry, checks that it
//! verifies (also after a JSON round trip, as the store would do), applies
//! one mutation and checks that `verify` fails at the seq the mutation is
//! expected to break. The expected seq is worked out here from the mutation
//! alone, not by asking the crate. Truncation after the last checkpoint is
//! never generated: it is undetectable by design (see the crate note).

use orchestrator_audit::{
    checkpoint, seal, verify, verify_after, BadEntry, Checkpoint, Entry, LogId, RawEntry,
    SealError, StreamVerifier, Verified, VerifyError,
};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Number, Value};

#[derive(Debug, Clone)]
struct Record {
    time: String,
    kind: String,
    run: Option<String>,
    body: Map<String, Value>,
}

/// A one-character edit that always yields a different string.
#[derive(Debug, Clone)]
struct CharEdit {
    at: Index,
    with: Index,
}

#[derive(Debug, Clone)]
enum Field {
    Seq { bit: u32 },
    Time(CharEdit),
    Kind(CharEdit),
    Run { edit: CharEdit, drop: bool },
    Body { op: u8, leaf: Index, edit: CharEdit },
    Prev(CharEdit),
    Hash(CharEdit),
}

#[derive(Debug, Clone)]
enum Mutation {
    Alter {
        entry: Index,
        field: Field,
    },
    Delete {
        entry: Index,
    },
    InsertForged {
        anchor: Index,
        at: Index,
        record: Record,
    },
    ReplaceForged {
        anchor: Index,
        at: Index,
        record: Record,
    },
    Duplicate {
        entry: Index,
        at: Index,
    },
    Swap {
        a: Index,
        b: Index,
    },
    Truncate {
        keep: Index,
    },
    Splice {
        entry: Index,
    },
    Rewrite {
        from: Index,
    },
    AlterCheckpoint {
        which: Index,
        time: bool,
        edit: CharEdit,
    },
}

/// What verify must report.
#[derive(Debug, Clone)]
struct Expected {
    seq: u64,
    /// Checked only where the mutation leaves a single possible reason.
    reason: Option<fn(&BadEntry) -> bool>,
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        "\\PC{0,12}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn record() -> impl Strategy<Value = Record> {
    (
        "[0-9TZ:.-]{1,25}",
        "[a-z.]{1,12}",
        proptest::option::of("[a-z0-9-]{0,8}"),
        prop::collection::btree_map("[a-z_]{1,6}", value(), 0..5),
    )
        .prop_map(|(time, kind, run, body)| Record {
            time,
            kind,
            run,
            body: body.into_iter().collect(),
        })
}

fn char_edit() -> impl Strategy<Value = CharEdit> {
    (any::<Index>(), any::<Index>()).prop_map(|(at, with)| CharEdit { at, with })
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        (0u32..64).prop_map(|bit| Field::Seq { bit }),
        char_edit().prop_map(Field::Time),
        char_edit().prop_map(Field::Kind),
        (char_edit(), any::<bool>()).prop_map(|(edit, drop)| Field::Run { edit, drop }),
        (0u8..4, any::<Index>(), char_edit()).prop_map(|(op, leaf, edit)| Field::Body {
            op,
            leaf,
            edit
        }),
        char_edit().prop_map(Field::Prev),
        char_edit().prop_map(Field::Hash),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let i = any::<Index>;
    prop_oneof![
        4 => (i(), field()).prop_map(|(entry, field)| Mutation::Alter { entry, field }),
        1 => i().prop_map(|entry| Mutation::Delete { entry }),
        1 => (i(), i(), record()).prop_map(|(anchor, at, record)| Mutation::InsertForged {
            anchor,
            at,
            record
        }),
        1 => (i(), i(), record()).prop_map(|(anchor, at, record)| Mutation::ReplaceForged {
            anchor,
            at,
            record
        }),
        1 => (i(), i()).prop_map(|(entry, at)| Mutation::Duplicate { entry, at }),
        1 => (i(), i()).prop_map(|(a, b)| Mutation::Swap { a, b }),
        1 => i().prop_map(|keep| Mutation::Truncate { keep }),
        1 => i().prop_map(|entry| Mutation::Splice { entry }),
        1 => i().prop_map(|from| Mutation::Rewrite { from }),
        1 => (i(), any::<bool>(), char_edit()).prop_map(|(which, time, edit)| {
            Mutation::AlterCheckpoint { which, time, edit }
        }),
    ]
}

const ALPHABET: [char; 8] = ['0', 'a', 'A', 'f', '~', 'é', '\0', ' '];

fn edit_string(s: &mut String, edit: &CharEdit) {
    let mut chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        chars.push('a');
    } else {
        let at = edit.at.index(chars.len());
        let mut with = edit.with.index(ALPHABET.len());
        if ALPHABET[with] == chars[at] {
            with = (with + 1) % ALPHABET.len();
        }
        chars[at] = ALPHABET[with];
    }
    *s = chars.into_iter().collect();
}

fn leaf_pointers(value: &Value, here: String, out: &mut Vec<String>) {
    match value {
        Value::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                leaf_pointers(item, format!("{here}/{i}"), out);
            }
        }
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let k = k.replace('~', "~0").replace('/', "~1");
                leaf_pointers(v, format!("{here}/{k}"), out);
            }
        }
        _ => out.push(here),
    }
}

fn fresh_key(body: &Map<String, Value>, base: &str) -> String {
    let mut key = format!("{base}~");
    while body.contains_key(&key) {
        key.push('~');
    }
    key
}

/// Changes `body` so that it is certainly different.
fn edit_body(body: &mut Map<String, Value>, op: u8, leaf: &Index, edit: &CharEdit) {
    if body.is_empty() || op == 0 {
        let key = fresh_key(body, "added");
        body.insert(key, Value::Null);
        return;
    }
    let keys: Vec<String> = body.keys().cloned().collect();
    let key = keys[leaf.index(keys.len())].clone();
    match op {
        1 => {
            body.remove(&key);
        }
        2 => {
            let value = body.remove(&key).unwrap_or(Value::Null);
            let renamed = fresh_key(body, &key);
            body.insert(renamed, value);
        }
        _ => {
            let mut whole = Value::Object(std::mem::take(body));
            let mut pointers = Vec::new();
            leaf_pointers(&whole, String::new(), &mut pointers);
            let pointer = pointers[leaf.index(pointers.len())].clone();
            if let Some(slot) = whole.pointer_mut(&pointer) {
                *slot = match std::mem::take(slot) {
                    Value::Null => Value::Number(0.into()),
                    Value::Bool(b) => Value::Bool(!b),
                    Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                        (Some(u), _) => Value::Number(u.wrapping_add(1).into()),
                        (None, Some(i)) => Value::Number(Number::from(i.wrapping_add(1))),
                        _ => Value::Null,
                    },
                    Value::String(mut s) => {
                        edit_string(&mut s, edit);
                        Value::String(s)
                    }
                    // Empty containers are leaves; null differs from both.
                    Value::Array(_) | Value::Object(_) => Value::Null,
                };
            }
            if let Value::Object(map) = whole {
                *body = map;
            }
        }
    }
}

fn seal_all(log: &LogId, records: &[Record]) -> Result<Vec<Entry>, SealError> {
    let mut entries: Vec<Entry> = Vec::with_capacity(records.len());
    for r in records {
        let e = seal(
            log,
            entries.last(),
            &r.time,
            &r.kind,
            r.run.as_deref(),
            r.body.clone(),
        )?;
        entries.push(e);
    }
    Ok(entries)
}

/// Applies `m`; returns the expected failure, or None if the mutation does
/// not apply to this chain (a swap in a one-entry chain).
fn apply(
    m: &Mutation,
    log: &LogId,
    records: &[Record],
    entries: &mut Vec<Entry>,
    cps: &mut [Checkpoint],
) -> Result<Option<Expected>, SealError> {
    let n = entries.len();
    let expect = |seq: usize| {
        Some(Expected {
            seq: seq as u64,
            reason: None,
        })
    };
    let cp_at = |seq: usize| cps.iter().any(|c| c.seq == seq as u64);
    Ok(match m {
        Mutation::Alter { entry, field } => {
            let k = entry.index(n);
            let e = &mut entries[k];
            match field {
                Field::Seq { bit } => e.seq ^= 1u64 << bit,
                Field::Time(edit) => edit_string(&mut e.time, edit),
                Field::Kind(edit) => edit_string(&mut e.kind, edit),
                Field::Run { edit, drop } => match e.run.take() {
                    None => e.run = Some(String::new()),
                    Some(_) if *drop => {}
                    Some(mut run) => {
                        edit_string(&mut run, edit);
                        e.run = Some(run);
                    }
                },
                Field::Body { op, leaf, edit } => edit_body(&mut e.body, *op, leaf, edit),
                Field::Prev(edit) => edit_string(&mut e.prev, edit),
                Field::Hash(edit) => edit_string(&mut e.hash, edit),
            }
            expect(k + 1)
        }
        Mutation::Delete { entry } => {
            let k = entry.index(n);
            entries.remove(k);
            expect(k + 1)
        }
        Mutation::InsertForged { anchor, at, record } => {
            let mut anchor = anchor.index(n + 1); // entries before the forged one
            let at = at.index(n + 1) + 1; // its 1-based position
            if at == n + 1 && anchor == n {
                // A validly sealed entry appended at the end is a legitimate
                // append, not tampering: move the anchor so it misfits.
                anchor = 0;
            }
            let forged = seal(
                log,
                anchor.checked_sub(1).map(|i| &entries[i]),
                &record.time,
                &record.kind,
                record.run.as_deref(),
                record.body.clone(),
            )?;
            let fits = at == anchor + 1;
            let same_as_original = fits && entries[at - 1] == forged;
            entries.insert(at - 1, forged);
            if !fits || (!same_as_original && cp_at(at)) {
                expect(at)
            } else {
                // It fits its place; the displaced original does not.
                expect(at + 1)
            }
        }
        Mutation::ReplaceForged { anchor, at, record } => {
            // Sealed with the right seq for its place, but linked to the
            // entry `anchor` (0: genesis) instead of the one before it.
            let anchor = anchor.index(n);
            let at = at.index(n) + 1;
            let link = match anchor.checked_sub(1) {
                Some(i) => entries[i].clone(),
                None => Entry {
                    seq: 0,
                    hash: orchestrator_audit::genesis(log),
                    ..entries[0].clone()
                },
            };
            let fake_prev = Entry {
                seq: at as u64 - 1,
                ..link
            };
            let forged = if at == 1 && anchor == 0 {
                seal(
                    log,
                    None,
                    &record.time,
                    &record.kind,
                    record.run.as_deref(),
                    record.body.clone(),
                )?
            } else {
                seal(
                    log,
                    Some(&fake_prev),
                    &record.time,
                    &record.kind,
                    record.run.as_deref(),
                    record.body.clone(),
                )?
            };
            if forged == entries[at - 1] {
                return Ok(None); // nothing changed
            }
            entries[at - 1] = forged;
            if anchor + 1 != at {
                Some(Expected {
                    seq: at as u64,
                    reason: Some(|r| matches!(r, BadEntry::BrokenLink)),
                })
            } else if cp_at(at) {
                // A valid replacement: only its checkpoint can tell here.
                expect(at)
            } else {
                Some(Expected {
                    seq: at as u64 + 1,
                    reason: Some(|r| matches!(r, BadEntry::BrokenLink)),
                })
            }
        }
        Mutation::Duplicate { entry, at } => {
            let k = entry.index(n) + 1;
            let at = at.index(n + 1) + 1;
            let copy = entries[k - 1].clone();
            entries.insert(at - 1, copy);
            // A copy placed just before its original fits; the original
            // after it is then the duplicate.
            expect(if at == k { k + 1 } else { at })
        }
        Mutation::Swap { a, b } => {
            if n < 2 {
                return Ok(None);
            }
            let a = a.index(n);
            let mut b = b.index(n - 1);
            if b >= a {
                b += 1;
            }
            entries.swap(a, b);
            expect(a.min(b) + 1)
        }
        Mutation::Truncate { keep } => {
            // The last checkpoint is always at n, so any keep < n is before it.
            let keep = keep.index(n);
            entries.truncate(keep);
            Some(Expected {
                seq: keep as u64 + 1,
                reason: Some(|r| matches!(r, BadEntry::Truncated { .. })),
            })
        }
        Mutation::Splice { entry } => {
            let k = entry.index(n);
            let other = seal_all(&LogId(format!("{}-other", log.0)), records)?;
            entries[k] = other[k].clone();
            Some(Expected {
                seq: k as u64 + 1,
                reason: Some(|r| matches!(r, BadEntry::Altered)),
            })
        }
        Mutation::Rewrite { from } => {
            let k = from.index(n);
            entries.truncate(k);
            for (i, r) in records[k..].iter().enumerate() {
                let kind = if i == 0 {
                    format!("{}!", r.kind)
                } else {
                    r.kind.clone()
                };
                let e = seal(
                    log,
                    entries.last(),
                    &r.time,
                    &kind,
                    r.run.as_deref(),
                    r.body.clone(),
                )?;
                entries.push(e);
            }
            // Self-consistent after k: only a checkpoint can tell.
            let first_cp = cps
                .iter()
                .map(|c| c.seq)
                .find(|&s| s > k as u64)
                .unwrap_or(0);
            Some(Expected {
                seq: first_cp,
                reason: Some(|r| matches!(r, BadEntry::CheckpointMismatch { .. })),
            })
        }
        Mutation::AlterCheckpoint { which, time, edit } => {
            let c = &mut cps[which.index(cps.len())];
            if *time {
                edit_string(&mut c.time, edit);
            } else {
                edit_string(&mut c.hash, edit);
            }
            Some(Expected {
                seq: c.seq,
                reason: Some(|r| matches!(r, BadEntry::CheckpointMismatch { .. })),
            })
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_single_mutation_is_reported_at_the_first_bad_entry(
        records in prop::collection::vec(record(), 1..=60),
        marks in prop::collection::vec(any::<bool>(), 60),
        log in "[0-9A-Z]{26}",
        m in mutation(),
        start in any::<Index>(),
    ) {
        let log = LogId(log);
        let mut entries = seal_all(&log, &records).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let n = entries.len();
        let mut cps: Vec<Checkpoint> = entries
            .iter()
            .enumerate()
            .filter(|(i, _)| marks[*i] || *i + 1 == n)
            .map(|(_, e)| checkpoint(e))
            .collect();

        let expected_ok = Verified {
            entries: n as u64,
            head: entries[n - 1].hash.clone(),
            checkpoints: cps.len() as u64,
        };
        prop_assert_eq!(verify(&log, &entries, &cps), Ok(expected_ok.clone()));
        let stored = serde_json::to_string(&entries).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let loaded: Vec<Entry> = serde_json::from_str(&stored).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(verify(&log, &loaded, &cps), Ok(expected_ok));

        let original = entries.clone();
        let expected = apply(&m, &log, &records, &mut entries, &mut cps)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assume!(expected.is_some());
        let expected = expected.unwrap_or(Expected { seq: 0, reason: None });

        // Streamed one entry at a time (as `audit verify` reads a store), the
        // verdict is the same, word for word.
        let streamed = StreamVerifier::new(&log, cps.clone(), None).and_then(|mut v| {
            for e in &entries {
                v.push(e)?;
            }
            v.finish()
        });
        prop_assert_eq!(&streamed, &verify(&log, &entries, &cps));
        // And from the stored text (the body as JSON, not parsed), as
        // `audit verify` reads SQLite: the same verdict, and the text path
        // taken for every entry whose body a store would have written.
        let from_text = StreamVerifier::new(&log, cps.clone(), None).and_then(|mut v| {
            for e in &entries {
                let body = serde_json::to_string(&e.body).unwrap_or_default();
                let raw = RawEntry {
                    seq: e.seq,
                    time: &e.time,
                    kind: &e.kind,
                    run: e.run.as_deref(),
                    body: &body,
                    prev: &e.prev,
                    hash: &e.hash,
                };
                match v.push_raw(&raw) {
                    Some(judged) => judged?,
                    None => v.push(e)?,
                }
            }
            v.finish()
        });
        prop_assert_eq!(&from_text, &verify(&log, &entries, &cps));

        match verify(&log, &entries, &cps) {
            Err(VerifyError::Entry { seq, reason }) => {
                prop_assert_eq!(seq, expected.seq, "reason: {}", reason);
                if let Some(check) = expected.reason {
                    prop_assert!(check(&reason), "unexpected reason: {}", reason);
                }
            }
            other => prop_assert!(false, "expected a failure at entry {}, got {:?}", expected.seq, other),
        }

        // From an entry verified earlier that the mutation left in place
        // (and all before it), `verify_after` names the same first bad entry.
        let k = start.index(n) + 1;
        if expected.seq > k as u64 && entries.len() >= k && entries[..k] == original[..k] {
            let from = checkpoint(&original[k - 1]);
            match verify_after(&log, &from, &entries[k - 1..], &cps, None) {
                Err(VerifyError::Entry { seq, .. }) => prop_assert_eq!(seq, expected.seq),
                other => prop_assert!(false, "from {}: expected a failure at entry {}, got {:?}", k, expected.seq, other),
            }
        }
    }
}
