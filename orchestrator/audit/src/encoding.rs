//! The bytes an entry's hash covers.
//!
//! Invariant: the encoding is injective. Every variable-length item is
//! preceded by its length as a big-endian u64 and every JSON value by a tag
//! byte, so the encoding is prefix-free and no two different (log, entry)
//! pairs produce the same bytes. Object keys are written in byte order,
//! whatever order the map iterates in, so the hash does not depend on
//! serde_json's `preserve_order` feature being on or off anywhere in the
//! build.
//!
//! Changing anything here changes every hash and invalidates every stored
//! log; the `golden_hash` test exists to make that impossible by accident.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::LogId;

const ENTRY_DOMAIN: &[u8] = b"nightshift-audit-entry-v1";
const GENESIS_DOMAIN: &[u8] = b"nightshift-audit-genesis-v1";

/// A body value that has no canonical encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotCanonical {
    /// Where in the body, as a JSON pointer.
    pub(crate) pointer: String,
}

/// The fields of an entry that its hash covers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hashed<'a> {
    pub(crate) seq: u64,
    pub(crate) time: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) run: Option<&'a str>,
    pub(crate) body: &'a Map<String, Value>,
    pub(crate) prev: &'a str,
}

pub(crate) fn genesis_hash(log: &LogId) -> String {
    let mut buf = Vec::new();
    put_bytes(&mut buf, GENESIS_DOMAIN);
    put_bytes(&mut buf, log.0.as_bytes());
    hex::encode(Sha256::digest(&buf))
}

pub(crate) fn entry_hash(log: &LogId, fields: Hashed<'_>) -> Result<String, NotCanonical> {
    let mut buf = Vec::new();
    put_head(
        &mut buf,
        log,
        fields.seq,
        fields.time,
        fields.kind,
        fields.run,
    );
    put_object(&mut buf, fields.body).map_err(|mut path| {
        // The path was gathered from the offending value outwards.
        path.reverse();
        NotCanonical {
            pointer: path.iter().map(|seg| format!("/{seg}")).collect(),
        }
    })?;
    put_prev(&mut buf, fields.prev);
    Ok(hex::encode(Sha256::digest(&buf)))
}

/// The encoding's items before the body.
pub(crate) fn put_head(
    buf: &mut Vec<u8>,
    log: &LogId,
    seq: u64,
    time: &str,
    kind: &str,
    run: Option<&str>,
) {
    put_bytes(buf, ENTRY_DOMAIN);
    put_bytes(buf, log.0.as_bytes());
    buf.extend_from_slice(&seq.to_be_bytes());
    put_bytes(buf, time.as_bytes());
    put_bytes(buf, kind.as_bytes());
    match run {
        None => buf.push(0),
        Some(run) => {
            buf.push(1);
            put_bytes(buf, run.as_bytes());
        }
    }
}

/// The encoding's item after the body.
pub(crate) fn put_prev(buf: &mut Vec<u8>, prev: &str) {
    put_bytes(buf, prev.as_bytes());
}

fn put_len(buf: &mut Vec<u8>, len: usize) {
    // usize is at most 64 bits on every target Rust supports.
    buf.extend_from_slice(&(len as u64).to_be_bytes());
}

fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    put_len(buf, bytes.len());
    buf.extend_from_slice(bytes);
}

/// Where a value with no canonical encoding is, as JSON pointer segments
/// from it outwards (gathered only on that path: encoding an entry that is
/// fine allocates nothing for it).
type Path = Vec<String>;

fn put_object(buf: &mut Vec<u8>, map: &Map<String, Value>) -> Result<(), Path> {
    buf.push(b'o');
    put_len(buf, map.len());
    // A map that iterates in byte order (serde_json's default) is written
    // as it iterates; otherwise its keys are sorted first.
    let mut sorted = true;
    let mut last: Option<&String> = None;
    for key in map.keys() {
        if last.is_some_and(|l| l.as_bytes() > key.as_bytes()) {
            sorted = false;
            break;
        }
        last = Some(key);
    }
    let write = |buf: &mut Vec<u8>, key: &String, value: &Value| {
        put_bytes(buf, key.as_bytes());
        put_value(buf, value).map_err(|mut path| {
            path.push(key.replace('~', "~0").replace('/', "~1"));
            path
        })
    };
    if sorted {
        for (key, value) in map {
            write(buf, key, value)?;
        }
    } else {
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort_unstable();
        for key in keys {
            write(buf, key, &map[key.as_str()])?;
        }
    }
    Ok(())
}

// Recursion depth follows the value's nesting; serde_json's parser already
// caps that at 128 for any body read back from storage.
fn put_value(buf: &mut Vec<u8>, value: &Value) -> Result<(), Path> {
    match value {
        Value::Null => buf.push(b'n'),
        Value::Bool(false) => buf.push(b'f'),
        Value::Bool(true) => buf.push(b't'),
        Value::Number(n) => {
            // Only integers: serde_json's default float parsing is not
            // guaranteed to round-trip, so a float could hash differently
            // after a trip through storage. Audit bodies hold sizes and
            // counts, never measurements that need fractions.
            let mut digits = [0u8; 24];
            let len = {
                use std::io::Write;
                let mut cursor = std::io::Cursor::new(&mut digits[..]);
                let written = if let Some(u) = n.as_u64() {
                    write!(cursor, "{u}")
                } else if let Some(i) = n.as_i64() {
                    write!(cursor, "{i}")
                } else {
                    return Err(Vec::new());
                };
                // 24 bytes hold any u64 or i64 in decimal.
                if written.is_err() {
                    return Err(Vec::new());
                }
                cursor.position() as usize
            };
            buf.push(b'i');
            put_bytes(buf, &digits[..len]);
        }
        Value::String(s) => {
            buf.push(b's');
            put_bytes(buf, s.as_bytes());
        }
        Value::Array(items) => {
            buf.push(b'a');
            put_len(buf, items.len());
            for (i, item) in items.iter().enumerate() {
                put_value(buf, item).map_err(|mut path| {
                    path.push(i.to_string());
                    path
                })?;
            }
        }
        Value::Object(map) => put_object(buf, map)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn hash(kind: &str, run: Option<&str>, body: Value) -> String {
        let body = obj(body);
        entry_hash(
            &LogId("log".into()),
            Hashed {
                seq: 1,
                time: "t",
                kind,
                run,
                body: &body,
                prev: "p",
            },
        )
        .unwrap_or_default()
    }

    #[test]
    fn moving_bytes_between_fields_changes_the_hash() {
        assert_ne!(hash("ab", None, json!({})), hash("a", Some("b"), json!({})));
        assert_ne!(hash("a", None, json!({})), hash("a", Some(""), json!({})));
        assert_ne!(
            hash("k", None, json!({"a": "b"})),
            hash("k", None, json!({"ab": ""}))
        );
        assert_ne!(
            hash("k", None, json!({"a": [1, 2]})),
            hash("k", None, json!({"a": [[1], 2]}))
        );
        assert_ne!(
            hash("k", None, json!({"a": 1})),
            hash("k", None, json!({"a": "1"}))
        );
    }

    #[test]
    fn key_insertion_order_does_not_change_the_hash() {
        let mut forward = Map::new();
        forward.insert("a".into(), json!(1));
        forward.insert("b".into(), json!({"y": 2, "x": 3}));
        let mut backward = Map::new();
        backward.insert("b".into(), json!({"x": 3, "y": 2}));
        backward.insert("a".into(), json!(1));
        assert_eq!(
            hash("k", None, Value::Object(forward)),
            hash("k", None, Value::Object(backward))
        );
    }

    #[test]
    fn floats_are_refused_with_their_location() {
        let body = obj(json!({"a": {"b/c": [0, 1.5]}}));
        let err = entry_hash(
            &LogId("log".into()),
            Hashed {
                seq: 1,
                time: "t",
                kind: "k",
                run: None,
                body: &body,
                prev: "p",
            },
        );
        assert_eq!(
            err,
            Err(NotCanonical {
                pointer: "/a/b~1c/1".into()
            })
        );
    }

    #[test]
    fn negative_and_positive_integers_both_encode() {
        assert_ne!(
            hash("k", None, json!({"a": -1})),
            hash("k", None, json!({"a": 1}))
        );
        assert_ne!(hash("k", None, json!({"a": -1})), String::new());
    }
}
