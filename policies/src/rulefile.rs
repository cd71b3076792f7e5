//! Rule files: TOML text to rows, with every error naming file and line.
//!
//! Invariants: parsing is pure (text in, rows or an error out; reading the
//! files is [`crate::load`]'s job). A file is `[[rule]]` tables (the fields
//! of [`crate::rule::RuleSpec`]) and `[[retire]]` tables (`rule`, `reason`,
//! `authority`); unknown fields are errors. Every rule is checked against
//! the door schema ([`crate::doors`]): an unknown door or a field its door
//! never sends is an error on the `doors` line or the clause's line. Within a file, its rules are
//! declared before its retirements; files are applied in the order given.
//! Every error carries the file, a 1-based line, and the rule id when one is
//! known; a set with any error is never returned, so nothing half-loaded
//! can be used (`tests/loading.rs::unknown_field_is_named`,
//! `tests/loading.rs::a_field_the_door_never_sends_is_named_at_its_clause`,
//! `tests/loading.rs::an_error_in_any_file_of_a_directory_loads_nothing`).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::rule::{ClauseSpec, Effect, Rule, RuleError, RuleId, RuleSpec};
use crate::ruleset::{ApplyError, Author, Row, RuleSet};
use crate::timestamp::Timestamp;

/// Why a rule file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The rules directory could not be listed.
    #[error("listing policy rules in {}: {source}", dir.display())]
    ListDir {
        /// The directory.
        dir: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be read (or is not UTF-8).
    #[error("reading policy {}: {source}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, an unknown field, a bad effect, a bad timestamp, ...
    #[error("reading policy {}: line {line}{}: {message}", file.display(), RuleNote(rule))]
    Parse {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// The rule the error is inside, when known.
        rule: Option<String>,
        /// What the parser said.
        message: String,
    },
    /// A rule that parsed but is not valid (bad pattern, no doors, ...).
    #[error("reading policy {}: line {line}: rule {rule}: {source}", file.display())]
    Rule {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// The rule's id.
        rule: String,
        /// What was wrong.
        #[source]
        source: Box<RuleError>,
    },
    /// A rule naming a door nightshift does not have, or matching on a
    /// field its door never sends (see [`crate::doors`]).
    #[error("reading policy {}: line {line}: rule {rule}: {source}", file.display())]
    Schema {
        /// The file.
        file: PathBuf,
        /// 1-based line (the `doors` line, or the clause's).
        line: usize,
        /// The rule's id.
        rule: String,
        /// What was wrong.
        #[source]
        source: Box<crate::doors::SchemaError>,
    },
    /// A valid row the set refused (duplicate id, retiring no rule, ...).
    #[error("reading policy {}: line {line}: rule {rule}: {source}", file.display())]
    Apply {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// The rule's id.
        rule: String,
        /// What was wrong.
        #[source]
        source: Box<ApplyError>,
    },
}

struct RuleNote<'a>(&'a Option<String>);
impl fmt::Display for RuleNote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, ": rule {id}"),
            None => Ok(()),
        }
    }
}

impl LoadError {
    /// The 1-based line the error is on, when it is about a line.
    pub fn line(&self) -> Option<usize> {
        match self {
            LoadError::Parse { line, .. }
            | LoadError::Rule { line, .. }
            | LoadError::Schema { line, .. }
            | LoadError::Apply { line, .. } => Some(*line),
            _ => None,
        }
    }

    /// The rule the error is about, when known.
    pub fn rule(&self) -> Option<&str> {
        match self {
            LoadError::Parse { rule, .. } => rule.as_deref(),
            LoadError::Rule { rule, .. }
            | LoadError::Schema { rule, .. }
            | LoadError::Apply { rule, .. } => Some(rule),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
    #[serde(default)]
    retire: Vec<Spanned<RawRetire>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: Spanned<String>,
    subject: String,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    doors: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    tools: Vec<String>,
    effect: Effect,
    reason: String,
    authority: String,
    #[serde(default)]
    locked: bool,
    #[serde(default)]
    since: Option<Timestamp>,
    #[serde(default)]
    until: Option<Timestamp>,
    #[serde(default, rename = "match")]
    clauses: Vec<Spanned<ClauseSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetire {
    rule: Spanned<String>,
    reason: String,
    authority: String,
}

/// Only the ids and header positions of `[[rule]]` and `[[retire]]`
/// tables, to say which rule a parse error is inside.
#[derive(Deserialize)]
struct LooseFile {
    #[serde(default)]
    rule: Vec<Spanned<LooseTable>>,
    #[serde(default)]
    retire: Vec<Spanned<LooseTable>>,
}

#[derive(Deserialize)]
struct LooseTable {
    #[serde(default)]
    id: Option<toml::Value>,
}

/// 1-based line of a byte offset.
pub fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

fn rule_around(text: &str, offset: usize) -> Option<String> {
    let loose: LooseFile = toml::from_str(text).ok()?;
    // Spans of array-of-tables entries cover their header only, so the
    // table an offset is inside is the last one whose header starts before.
    let rules = loose.rule.iter().map(|r| {
        let id = match &r.get_ref().id {
            Some(toml::Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        (r.span().start, id)
    });
    let retires = loose.retire.iter().map(|r| (r.span().start, None));
    rules
        .chain(retires)
        .filter(|(start, _)| *start <= offset)
        .max_by_key(|(start, _)| *start)
        .and_then(|(_, id)| id)
}

/// A row parsed from a file, with where it was written.
#[derive(Debug, Clone)]
pub struct FileRow {
    /// The row (authored [`Author::Shipped`]).
    pub row: Row,
    /// The file.
    pub file: PathBuf,
    /// 1-based line of the rule's id or the retirement's rule.
    pub line: usize,
    /// The rule id concerned.
    pub rule: String,
}

/// Parses one rule file's text into rows.
pub fn parse_rule_file(file: &Path, text: &str) -> Result<Vec<FileRow>, LoadError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        LoadError::Parse {
            file: file.to_owned(),
            line: line_of(text, offset),
            rule: e.span().and_then(|s| rule_around(text, s.start)),
            message: e.message().trim().to_owned(),
        }
    })?;
    let mut rows = Vec::with_capacity(raw.rule.len() + raw.retire.len());
    for spanned in raw.rule {
        let id_line = line_of(text, spanned.get_ref().id.span().start);
        let r = spanned.into_inner();
        let clause_lines: Vec<usize> = r
            .clauses
            .iter()
            .map(|c| line_of(text, c.span().start))
            .collect();
        let doors_line = r
            .doors
            .as_ref()
            .map_or(id_line, |d| line_of(text, d.span().start));
        let id = r.id.into_inner();
        let spec = RuleSpec {
            id: id.clone(),
            subject: r.subject,
            scope: r.scope,
            doors: r.doors.map(Spanned::into_inner).unwrap_or_default(),
            tools: r.tools,
            effect: r.effect,
            reason: r.reason,
            authority: r.authority,
            locked: r.locked,
            since: r.since,
            until: r.until,
            clauses: r.clauses.into_iter().map(Spanned::into_inner).collect(),
        };
        let rule = Rule::compile(spec).map_err(|source| LoadError::Rule {
            file: file.to_owned(),
            line: source
                .clause_index()
                .and_then(|i| clause_lines.get(i).copied())
                .unwrap_or(id_line),
            rule: id.clone(),
            source: Box::new(source),
        })?;
        crate::doors::check_rule(&rule).map_err(|source| LoadError::Schema {
            file: file.to_owned(),
            line: source
                .clause_index()
                .and_then(|i| clause_lines.get(i).copied())
                .unwrap_or(doors_line),
            rule: id.clone(),
            source: Box::new(source),
        })?;
        rows.push(FileRow {
            row: Row::Declare {
                rule,
                author: Author::Shipped,
            },
            file: file.to_owned(),
            line: id_line,
            rule: id,
        });
    }
    for spanned in raw.retire {
        let r = spanned.into_inner();
        let line = line_of(text, r.rule.span().start);
        let rule = r.rule.into_inner();
        rows.push(FileRow {
            row: Row::Retire {
                rule: RuleId(rule.clone()),
                reason: r.reason,
                authority: r.authority,
                author: Author::Shipped,
            },
            file: file.to_owned(),
            line,
            rule,
        });
    }
    Ok(rows)
}

/// Parses files (name, text) in the order given and applies their rows to
/// an empty set; any error anywhere means no set at all.
pub fn rule_set_from_files<'a>(
    files: impl IntoIterator<Item = (&'a Path, &'a str)>,
) -> Result<RuleSet, LoadError> {
    let mut set = RuleSet::new();
    for (file, text) in files {
        for fr in parse_rule_file(file, text)? {
            set.apply(fr.row).map_err(|source| LoadError::Apply {
                file: fr.file,
                line: fr.line,
                rule: fr.rule,
                source: Box::new(source),
            })?;
        }
    }
    Ok(set)
}
