//! `nightshift audit export`: the audit chain as versioned JSON lines
//! (`docs/audit-export.schema.json`) or as OCSF 1.1.0 events, one entry a
//! line, each with its seq and hash so an export can be checked against
//! `audit verify`.
//!
//! - The mapping ([`jsonl`], [`ocsf`], [`keep`]) is pure: entry in, JSON
//!   value out.
//! - Streamed through [`AuditLog::visit_audit`]: each entry is written as
//!   it is handed over and dropped, never collected
//!   (`tests::each_entry_is_written_as_it_is_visited`); memory does not
//!   grow with the chain (docs/benchmarks.md).
//! - Entry bodies hold agent-influenced text: every line is ASCII JSON
//!   ([`terminal::json`]), never raw terminal text
//!   (`tests::hostile_body_text_stays_escaped_data`,
//!   `tests/tests/audit.rs::export_carries_the_chains_hashes_and_since_filters`).

use std::io::Write;

use nightshift_core::state_store::{AuditLog, AuditVisitor};
use nightshift_core::terminal;
use orchestrator_audit::{Checkpoint, Entry};
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::error::{ApiError, ErrorKind};

/// The version of the JSON lines format (`"v"` on every line).
pub const FORMAT_VERSION: u64 = 1;
/// The OCSF schema version [`ocsf`] maps to.
pub const OCSF_VERSION: &str = "1.1.0";

/// What an export writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Versioned JSON lines.
    Jsonl,
    /// OCSF events, one a line.
    Ocsf,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "jsonl" => Ok(Format::Jsonl),
            "ocsf" => Ok(Format::Ocsf),
            other => Err(format!(
                "--format {}: expected jsonl or ocsf",
                terminal::line(other)
            )),
        }
    }
}

/// Which entries an export keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// Every entry.
    All,
    /// The entries from this seq on.
    Seq(u64),
    /// The entries whose time is at or after this one.
    Time(OffsetDateTime),
}

/// Reads `--since`: a seq (digits) or an RFC 3339 time.
pub fn parse_since(text: &str) -> Result<Since, String> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map(Since::Seq)
            .map_err(|_| format!("--since {}: seq too large", terminal::line(text)));
    }
    OffsetDateTime::parse(text, &Rfc3339)
        .map(Since::Time)
        .map_err(|e| {
            format!(
                "--since {}: neither a seq nor an RFC 3339 time ({e})",
                terminal::line(text)
            )
        })
}

/// Whether `entry` is exported under `since`. An entry whose time does not
/// parse is kept: an export never silently drops an entry.
pub fn keep(since: &Since, entry: &Entry) -> bool {
    match since {
        Since::All => true,
        Since::Seq(from) => entry.seq >= *from,
        Since::Time(t) => OffsetDateTime::parse(&entry.time, &Rfc3339).map_or(true, |e| e >= *t),
    }
}

/// One entry as a JSON line of [`FORMAT_VERSION`].
pub fn jsonl(entry: &Entry) -> Value {
    json!({
        "v": FORMAT_VERSION,
        "seq": entry.seq,
        "time": entry.time,
        "kind": entry.kind,
        "run": entry.run,
        "body": entry.body,
        "prev": entry.prev,
        "hash": entry.hash,
    })
}

/// One entry as an OCSF event: `started` and `exited` are Process Activity
/// (1007) Launch and Terminate; every other kind is a Base Event (0) with
/// activity Other and the kind as its activity name. The whole entry rides
/// in `unmapped`, its hash is `metadata.uid`.
pub fn ocsf(entry: &Entry) -> Value {
    let (class_uid, category_uid, class_name, activity_id) = match entry.kind.as_str() {
        "started" => (1007u64, 1u64, "Process Activity", 1u64),
        "exited" => (1007, 1, "Process Activity", 2),
        _ => (0, 0, "Base Event", 99),
    };
    let time_ms = OffsetDateTime::parse(&entry.time, &Rfc3339)
        .map_or(0, |t| (t.unix_timestamp_nanos() / 1_000_000) as i64);
    let mut event = json!({
        "class_uid": class_uid,
        "class_name": class_name,
        "category_uid": category_uid,
        "activity_id": activity_id,
        "activity_name": entry.kind,
        "type_uid": class_uid * 100 + activity_id,
        "severity_id": 1,
        "time": time_ms,
        "metadata": {
            "version": OCSF_VERSION,
            "uid": entry.hash,
            "product": {"name": "nightshift", "vendor_name": "nightshift"},
        },
        "unmapped": jsonl(entry),
    });
    if class_uid == 1007 {
        event["actor"] = json!({"app_name": "nightshift"});
        event["process"] = json!({"uid": entry.run, "name": entry.kind});
    }
    event
}

/// The visitor [`export`] hands the log: writes each kept entry as it
/// comes, holds none.
struct Writing<'a> {
    since: Since,
    format: Format,
    out: &'a mut (dyn Write + Send),
    written: u64,
    error: Option<std::io::Error>,
}
impl AuditVisitor for Writing<'_> {
    fn begin(&mut self, _: Option<Checkpoint>, _: Vec<Checkpoint>) -> bool {
        true
    }
    fn entry(&mut self, entry: Entry) -> bool {
        if !keep(&self.since, &entry) {
            return true;
        }
        let value = match self.format {
            Format::Jsonl => jsonl(&entry),
            Format::Ocsf => ocsf(&entry),
        };
        match writeln!(self.out, "{}", terminal::json(&value, false)) {
            Ok(()) => {
                self.written += 1;
                true
            }
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }
}

/// Writes the chain of `log` to `out`, one line an entry, streamed;
/// returns how many lines were written.
pub fn export<L: AuditLog + ?Sized>(
    log: &L,
    since: Since,
    format: Format,
    out: &mut (dyn Write + Send),
) -> Result<u64, ApiError> {
    let from = match since {
        Since::Seq(s) => s,
        _ => 0,
    };
    let mut writing = Writing {
        since,
        format,
        out,
        written: 0,
        error: None,
    };
    log.visit_audit(from, &mut writing)?;
    if let Some(e) = writing.error.take() {
        return Err(ApiError::new(
            ErrorKind::Internal,
            format!("audit export: writing: {e}"),
        ));
    }
    writing
        .out
        .flush()
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("audit export: writing: {e}")))?;
    Ok(writing.written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_core::state_store::fake::MemStore;
    use proptest::prelude::*;

    /// The required fields and their JSON types, read from the published
    /// schema itself.
    fn schema_required() -> Vec<(String, Vec<String>)> {
        let schema: Value =
            serde_json::from_str(include_str!("../../../../docs/audit-export.schema.json"))
                .unwrap();
        let props = &schema["properties"];
        schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                let k = k.as_str().unwrap().to_string();
                let t = match &props[&k]["type"] {
                    Value::String(s) => vec![s.clone()],
                    Value::Array(a) => a.iter().map(|x| x.as_str().unwrap().into()).collect(),
                    other => panic!("{k}: type {other}"),
                };
                (k, t)
            })
            .collect()
    }

    fn type_of(v: &Value) -> &'static str {
        match v {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    fn chain(texts: &[String]) -> (MemStore, Vec<Entry>) {
        let mut store = MemStore::new(std::path::Path::new("/nonexistent"));
        for (i, t) in texts.iter().enumerate() {
            let run = (i % 2 == 0).then(|| format!("run-{i}"));
            let time = format!("2026-01-01T00:00:{:02}Z", i % 60);
            let kind = if i % 3 == 0 { "exited" } else { "note" };
            let mut body = serde_json::Map::new();
            body.insert("text".into(), json!(t));
            let entry = orchestrator_audit::seal(
                &store.log,
                store.audit.last(),
                &time,
                kind,
                run.as_deref(),
                body,
            )
            .unwrap();
            store.audit.push(entry);
        }
        let entries = store.audit.clone();
        (store, entries)
    }

    fn run_export(store: &MemStore, since: Since, format: Format) -> Vec<Value> {
        let mut out = Vec::new();
        let n = export(store, since, format, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.is_ascii(), "{text}");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len() as u64, n);
        lines
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn every_line_parses_matches_the_schema_and_the_chain(
            texts in proptest::collection::vec(".{0,40}", 0..12),
            from in 0u64..14,
        ) {
            let (store, entries) = chain(&texts);
            let required = schema_required();
            let lines = run_export(&store, Since::All, Format::Jsonl);
            prop_assert_eq!(lines.len(), entries.len());
            let mut last = 0;
            for (line, entry) in lines.iter().zip(&entries) {
                for (k, types) in &required {
                    let t = type_of(&line[k.as_str()]);
                    prop_assert!(types.iter().any(|x| x == t || (x == "number" && t == "integer")), "{} is {}", k, t);
                }
                let seq = line["seq"].as_u64().unwrap();
                prop_assert!(seq > last);
                last = seq;
                prop_assert_eq!(seq, entry.seq);
                prop_assert_eq!(line["hash"].as_str().unwrap(), entry.hash.as_str());
                prop_assert_eq!(&line["body"], &Value::Object(entry.body.clone()));
            }
            let ocsf_lines = run_export(&store, Since::All, Format::Ocsf);
            for (line, entry) in ocsf_lines.iter().zip(&entries) {
                prop_assert_eq!(line["metadata"]["uid"].as_str().unwrap(), entry.hash.as_str());
                prop_assert_eq!(line["unmapped"]["seq"].as_u64().unwrap(), entry.seq);
                prop_assert_eq!(
                    line["type_uid"].as_u64().unwrap(),
                    line["class_uid"].as_u64().unwrap() * 100 + line["activity_id"].as_u64().unwrap()
                );
            }
            let some = run_export(&store, Since::Seq(from), Format::Jsonl);
            let want: Vec<u64> = entries.iter().map(|e| e.seq).filter(|s| *s >= from).collect();
            let got: Vec<u64> = some.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn each_entry_is_written_as_it_is_visited() {
        let (_, entries) = chain(&["a".to_string(), "b".to_string()]);
        let mut out = Vec::new();
        let mut w = Writing {
            since: Since::All,
            format: Format::Jsonl,
            out: &mut out,
            written: 0,
            error: None,
        };
        assert!(w.begin(None, Vec::new()));
        assert!(w.entry(entries[0].clone()));
        drop(w);
        let first: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(first["hash"], entries[0].hash.as_str());

        // A write that fails stops the visit, and the error is kept.
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("pipe closed"))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut broken = Broken;
        let mut w = Writing {
            since: Since::All,
            format: Format::Jsonl,
            out: &mut broken,
            written: 0,
            error: None,
        };
        assert!(!w.entry(entries[1].clone()));
        assert!(w.error.is_some());
    }

    #[test]
    fn since_a_time_keeps_the_entries_at_or_after_it() {
        let (store, entries) = chain(&(0..5).map(|i| i.to_string()).collect::<Vec<_>>());
        let since = parse_since("2026-01-01T00:00:03Z").unwrap();
        let got: Vec<u64> = run_export(&store, since, Format::Jsonl)
            .iter()
            .map(|l| l["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(got, vec![entries[3].seq, entries[4].seq]);
    }

    #[test]
    fn a_bad_since_or_format_is_named() {
        let e = parse_since("yesterday\u{1b}[2J").unwrap_err();
        assert!(e.contains("--since yesterday"), "{e}");
        assert!(!e.contains('\u{1b}'), "{e}");
        assert_eq!(parse_since("12"), Ok(Since::Seq(12)));
        let e = "xml".parse::<Format>().unwrap_err();
        assert!(e.contains("--format xml"), "{e}");
    }

    #[test]
    fn hostile_body_text_stays_escaped_data() {
        let (store, entries) = chain(&["\u{1b}]0;pwned\u{7}\n{\"seq\":0}\u{202e}".to_string()]);
        let lines = run_export(&store, Since::All, Format::Jsonl);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["body"], Value::Object(entries[0].body.clone()));
    }
}
