//! An entry's hash straight from its body's stored JSON text, without
//! building the body: what a long walk (`audit verify` over a million
//! entries) spends its time on otherwise.
//!
//! Invariant: [`entry_hash_from_text`] gives `Some(hash)` only when the
//! body text parses (as `serde_json` parses it for [`crate::Entry`]) into
//! a body whose [`crate::encoding`] hash is that same hash; anything it is
//! not sure of (a float, a duplicated key, text that is not one JSON
//! object, nesting past serde_json's limit) gives `None`, and the caller
//! takes the slow path: parse the body, hash the parsed value
//! (`tests::the_text_hash_is_the_value_hash_or_none`). The format of the
//! chain is unchanged: these are the same bytes, written from the text.

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};

use crate::LogId;

/// The stored fields of one entry, its body as the JSON text it is stored
/// as: what a store hands a long walk, borrowed from its row.
#[derive(Debug, Clone, Copy)]
pub struct RawEntry<'a> {
    pub seq: u64,
    pub time: &'a str,
    pub kind: &'a str,
    pub run: Option<&'a str>,
    /// The body's JSON text.
    pub body: &'a str,
    pub prev: &'a str,
    pub hash: &'a str,
}

/// The SHA-256 of `raw`'s encoding under `log` (as
/// [`crate::encoding::entry_hash`] computes it over the parsed entry), or
/// `None` when the text is not certain to parse into a body that encodes;
/// `buf` is scratch space, reused between calls.
pub(crate) fn entry_hash_from_text(
    log: &LogId,
    raw: &RawEntry<'_>,
    buf: &mut Vec<u8>,
) -> Option<[u8; 32]> {
    buf.clear();
    crate::encoding::put_head(buf, log, raw.seq, raw.time, raw.kind, raw.run);
    let mut de = serde_json::Deserializer::from_str(raw.body);
    de.deserialize_map(Encode { buf: &mut *buf }).ok()?;
    de.end().ok()?;
    crate::encoding::put_prev(buf, raw.prev);
    Some(Sha256::digest(&buf[..]).into())
}

/// Writes one JSON value's encoding to `buf` as it is read.
struct Encode<'b> {
    buf: &'b mut Vec<u8>,
}

/// Reserves a big-endian u64 count at the end of `buf`; [`patch_len`] fills it.
fn reserve_len(buf: &mut Vec<u8>) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&[0; 8]);
    at
}

fn patch_len(buf: &mut [u8], at: usize, n: u64) {
    buf[at..at + 8].copy_from_slice(&n.to_be_bytes());
}

fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    buf.extend_from_slice(bytes);
}

/// `i lp(decimal)`, the integer `-magnitude` or `magnitude`.
fn put_int(buf: &mut Vec<u8>, negative: bool, mut magnitude: u64) {
    let mut digits = [0u8; 21];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if negative {
        at -= 1;
        digits[at] = b'-';
    }
    buf.push(b'i');
    put_bytes(buf, &digits[at..]);
}

impl<'de> DeserializeSeed<'de> for Encode<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Encode<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.buf.push(b'n');
        Ok(())
    }
    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.buf.push(if v { b't' } else { b'f' });
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        put_int(self.buf, false, v);
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        put_int(self.buf, v < 0, v.unsigned_abs());
        Ok(())
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom("a float has no encoding"))
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.buf.push(b's');
        put_bytes(self.buf, v.as_bytes());
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.buf.push(b'a');
        let at = reserve_len(self.buf);
        let mut n = 0u64;
        while seq
            .next_element_seed(Encode {
                buf: &mut *self.buf,
            })?
            .is_some()
        {
            n += 1;
        }
        patch_len(self.buf, at, n);
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.buf.push(b'o');
        let at = reserve_len(self.buf);
        let start = self.buf.len();
        // Each member as written: (key start, key end, member end); the key
        // is the member's `lp(key)`, its value follows.
        let mut members: Vec<(usize, usize, usize)> = Vec::new();
        let mut sorted = true;
        loop {
            let key_at = self.buf.len();
            if map
                .next_key_seed(Key {
                    buf: &mut *self.buf,
                })?
                .is_none()
            {
                break;
            }
            let key_end = self.buf.len();
            map.next_value_seed(Encode {
                buf: &mut *self.buf,
            })?;
            if let Some(&(ps, pe, _)) = members.last() {
                let (prev, key) = (&self.buf[ps + 8..pe], &self.buf[key_at + 8..key_end]);
                if prev >= key {
                    sorted = false;
                }
            }
            members.push((key_at, key_end, self.buf.len()));
        }
        if !sorted {
            // Written in byte order of the keys, as the parsed map is; a key
            // given twice (which the parsed map keeps once) is not taken.
            let key = |m: &(usize, usize, usize)| m.0 + 8..m.1;
            let mut order: Vec<usize> = (0..members.len()).collect();
            order.sort_by(|&a, &b| self.buf[key(&members[a])].cmp(&self.buf[key(&members[b])]));
            if order
                .windows(2)
                .any(|w| self.buf[key(&members[w[0]])] == self.buf[key(&members[w[1]])])
            {
                return Err(A::Error::custom("a key given twice"));
            }
            let mut sorted_bytes = Vec::with_capacity(self.buf.len() - start);
            for &i in &order {
                sorted_bytes.extend_from_slice(&self.buf[members[i].0..members[i].2]);
            }
            self.buf.truncate(start);
            self.buf.extend_from_slice(&sorted_bytes);
        }
        patch_len(self.buf, at, members.len() as u64);
        Ok(())
    }
}

/// Writes an object's key as `lp(key)`.
struct Key<'b> {
    buf: &'b mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        put_bytes(self.buf, v.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::{entry_hash, Hashed};
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    fn log() -> LogId {
        LogId("01J9TESTLOG".into())
    }

    /// The hash of `text` as the slow path computes it: parsed into a body
    /// (as a store reads it), then encoded; `None` where the slow path
    /// fails (not an object, or not encodable).
    fn by_value(text: &str) -> Option<String> {
        let body: Map<String, Value> = serde_json::from_str(text).ok()?;
        entry_hash(
            &log(),
            Hashed {
                seq: 7,
                time: "2026-12-06T10:00:00Z",
                kind: "door_request",
                run: Some("run-1"),
                body: &body,
                prev: "ab",
            },
        )
        .ok()
    }

    fn by_text(text: &str) -> Option<String> {
        let raw = RawEntry {
            seq: 7,
            time: "2026-12-06T10:00:00Z",
            kind: "door_request",
            run: Some("run-1"),
            body: text,
            prev: "ab",
            hash: "",
        };
        entry_hash_from_text(&log(), &raw, &mut Vec::new()).map(hex::encode)
    }

    #[test]
    fn stored_bodies_hash_from_their_text() {
        for text in [
            r#"{}"#,
            r#"{"a":1,"b":[true,false,null,"x"],"c":{"d":-3}}"#,
            r#"{"z":1,"a":{"y":2,"b":3}}"#,
            r#" { "k" : "\u00e9\n\"" , "big": 18446744073709551615, "neg": -9223372036854775808 } "#,
        ] {
            assert!(by_text(text).is_some(), "{text}");
            assert_eq!(by_text(text), by_value(text), "{text}");
        }
    }

    #[test]
    fn what_it_is_not_sure_of_goes_the_slow_way() {
        for text in [
            r#"{"a":1.5}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"b":1,"a":2,"b":3}"#,
            r#"[1]"#,
            r#"{"a":1} x"#,
            r#"{"a":18446744073709551616}"#,
            "",
        ] {
            assert_eq!(by_text(text), None, "{text}");
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-c\\\\\"é\n]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(("[a-d]{0,2}", inner), 0..5)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// `value` as JSON text with every object's members in the order
    /// `shuffle` picks, some keys repeated, optional spaces.
    fn write(value: &Value, shuffle: &mut impl FnMut(usize) -> usize, out: &mut String) {
        match value {
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(if shuffle(2) == 0 { "," } else { " , " });
                    }
                    write(item, shuffle, out);
                }
                out.push(']');
            }
            Value::Object(map) => {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                for i in (1..members.len()).rev() {
                    members.swap(i, shuffle(i + 1));
                }
                if !members.is_empty() && shuffle(6) == 0 {
                    members.push(members[0]);
                }
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k).unwrap_or_default());
                    out.push(':');
                    write(v, shuffle, out);
                }
                out.push('}');
            }
            v => out.push_str(&v.to_string()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The fast hash is the slow one, or none; and for text as a store
        /// writes it (serde_json's own output of a body that encodes) it is
        /// never none.
        #[test]
        fn the_text_hash_is_the_value_hash_or_none(
            members in prop::collection::vec(("[a-d]{0,2}", json_value()), 0..6),
            picks in prop::collection::vec(any::<usize>(), 64),
        ) {
            let body = Value::Object(members.into_iter().collect());
            let mut i = 0;
            let mut shuffle = |n: usize| { i += 1; picks[i % picks.len()] % n };
            let mut text = String::new();
            write(&body, &mut shuffle, &mut text);
            let fast = by_text(&text);
            if fast.is_some() {
                prop_assert_eq!(&fast, &by_value(&text), "{}", text);
            }
            let stored = body.to_string();
            if by_value(&stored).is_some() {
                prop_assert_eq!(by_text(&stored), by_value(&stored), "{}", stored);
            }
        }
    }
}
