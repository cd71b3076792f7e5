//! Canonical JSON text, for digests.
//!
//! Invariants: equal JSON values give equal bytes, whatever order their
//! object keys arrived in: keys are sorted by their UTF-8 bytes, there is no
//! whitespace, strings are escaped as `serde_json` escapes them and numbers
//! printed as `serde_json` prints them. The sort is done here rather than
//! relied on from `serde_json::Map`, whose order depends on a cargo feature
//! another crate in the build may switch on.

use serde_json::Value;

/// The canonical text of `value`.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_string(s: &str, out: &mut String) {
    // Serialising a string cannot fail; the fallback keeps this panic-free.
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_value(v, out);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_does_not_matter() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,"x"],"x":null}}"#).unwrap();
        let b: Value =
            serde_json::from_str(r#"{ "a": {"x": null, "y": [1, "x"]}, "b": 1 }"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#);
    }

    #[test]
    fn canonical_text_parses_back_to_the_same_value() {
        let v: Value = serde_json::from_str(r#"{"q":"a\"b\n","n":-1.5,"t":true}"#).unwrap();
        let back: Value = serde_json::from_str(&canonical_json(&v)).unwrap();
        assert_eq!(back, v);
    }
}
