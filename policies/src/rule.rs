//! Rules: immutable rows, validated once.
//!
//! Invariants: a [`Rule`] can only be built by [`Rule::compile`] (or by
//! deserialising, which calls it), so every rule in memory has a valid id,
//! at least one door, a non-empty reason, clauses with exactly one test and
//! compiled linear-time patterns, and `since < until` when both are set.
//! Whether its doors and fields exist is the door schema's question
//! ([`crate::doors`]), asked when rule files are read
//! (`tests::bad_rules_are_refused_with_their_reason`,
//! `tests::serde_round_trip_goes_through_compile`,
//! `tests/loading.rs::clause_with_both_tests_is_refused`).
//! A rule is never edited: it is retired and a new one declared (it has no
//! setter; `tests/ruleset.rs::agents_retire_only_what_tightens_on_themselves`
//! shows a retired id cannot be declared again).
//!
//! Field paths in match clauses are dotted: `command` is the top-level
//! `command` key of the request's args, `input.path` walks into objects and
//! `files.0` into arrays. A key that itself contains a dot cannot be named.
//!
//! A field is tested as one or more texts ([`field_texts`]): a string as
//! itself; an array (an argv, `["rm","-rf","x"]`, or a shell and its line,
//! `["bash","-lc","rm\t-rf x"]`) as each element, as the shell line the
//! elements make when joined (each quoted as a shell would need it), and as
//! its compact JSON; anything else as its compact JSON. `matches` holds when
//! any text matches, `not_matches` when none does, so an array can never
//! slip past a rule written for the command line it stands for
//! (`tests/recursive_delete.rs::any_recursive_rm_is_refused_as_a_line_an_argv_or_a_shell_and_its_line`,
//! `tests/recursive_delete.rs::shell_join_quotes_only_what_a_shell_would_split`).
//! The texts are at most about three times the field's size.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::canonical::canonical_json;
use crate::pattern::{Pattern, PatternError};
use crate::timestamp::Timestamp;

/// What a matching rule asks for. Ordered by restrictiveness:
/// `Allow < Ask < Refuse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Let the act through.
    Allow,
    /// Hold the act for a person.
    Ask,
    /// Stop the act.
    Refuse,
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Effect::Allow => "allow",
            Effect::Ask => "ask",
            Effect::Refuse => "refuse",
        })
    }
}

/// A rule's id: letters, digits, `.`, `_`, `-`; never a `:`, so ids the
/// crate reserves for itself (`nightshift:freeze`) cannot be declared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RuleId(pub String);

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl RuleId {
    /// Is `s` usable as a declared rule's id?
    pub fn is_valid(s: &str) -> bool {
        let mut chars = s.chars();
        s.len() <= 128
            && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    }
}

/// One `match` clause as written: a field and exactly one of the tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClauseSpec {
    /// Dotted path into the request's args.
    pub field: String,
    /// The field must match this pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
    /// The field must not match this pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_matches: Option<String>,
}

/// A rule as written in a rule file or a state-store row, not yet checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Unique forever within a rule set, even after retirement.
    pub id: String,
    /// `*` for everyone, else an actor name or a `*` glob over actor names.
    pub subject: String,
    /// A path prefix the request's scope must lie under; absent = anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// nightshift's door names or `*` globs (`push`, `pull_request`,
    /// `notify`, `ask`; see [`crate::doors`]). A rule names at least one
    /// door or one tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub doors: Vec<String>,
    /// A harness's tool names or `*` globs (`Bash`, `mcp__github__*`), as
    /// `policy check --tool` passes them. Tools are open-ended: they are not
    /// checked against the door schema.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// refuse | ask | allow.
    pub effect: Effect,
    /// The sentence a refused caller is shown.
    pub reason: String,
    /// Who or what let this rule exist.
    pub authority: String,
    /// A locked rule is retired only after the owner unlocks it.
    #[serde(default)]
    pub locked: bool,
    /// In force from this instant (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// In force until this instant (exclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
    /// All clauses must hold for the rule to match.
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub clauses: Vec<ClauseSpec>,
}

/// Why a rule was refused at declaration or load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Empty, too long, or with characters outside `[A-Za-z0-9._-]`.
    #[error("checking rule id {id:?}: ids are 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")]
    BadId {
        /// The id as written.
        id: String,
    },
    /// Neither a door nor a tool, or a door or tool that is the empty string.
    #[error("checking rule {id}: doors and tools must name at least one door or tool, and none may be empty")]
    BadDoors {
        /// The rule.
        id: String,
    },
    /// `subject = ""`.
    #[error("checking rule {id}: subject must be \"*\" or an actor name")]
    EmptySubject {
        /// The rule.
        id: String,
    },
    /// `scope = ""`.
    #[error("checking rule {id}: scope, when given, must be a non-empty path prefix")]
    EmptyScope {
        /// The rule.
        id: String,
    },
    /// `reason = ""`.
    #[error("checking rule {id}: reason must say why, for the caller it stops")]
    EmptyReason {
        /// The rule.
        id: String,
    },
    /// A clause with both or neither of `matches` / `not_matches`.
    #[error("checking rule {id}: match clause {index} on field {field:?} needs exactly one of matches / not_matches")]
    ClauseTests {
        /// The rule.
        id: String,
        /// Position of the clause, from 0.
        index: usize,
        /// Its field.
        field: String,
    },
    /// A field path that is empty or has an empty segment.
    #[error("checking rule {id}: match clause {index} has a bad field path {field:?}")]
    BadField {
        /// The rule.
        id: String,
        /// Position of the clause, from 0.
        index: usize,
        /// The field as written.
        field: String,
    },
    /// A pattern that does not compile, or uses look-around / back-references.
    #[error("checking rule {id}: match clause {index}: {source}")]
    Pattern {
        /// The rule.
        id: String,
        /// Position of the clause, from 0.
        index: usize,
        /// What was wrong with the pattern.
        #[source]
        source: PatternError,
    },
    /// `since >= until`: a rule that is never in force is a mistake.
    #[error("checking rule {id}: since ({since}) must be before until ({until})")]
    EmptyWindow {
        /// The rule.
        id: String,
        /// Its since.
        since: Timestamp,
        /// Its until.
        until: Timestamp,
    },
}

impl RuleError {
    /// Index of the match clause the error is about, if any.
    pub fn clause_index(&self) -> Option<usize> {
        match self {
            RuleError::ClauseTests { index, .. }
            | RuleError::BadField { index, .. }
            | RuleError::Pattern { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// The test a compiled clause applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Test {
    /// The field's text must match.
    Matches(Pattern),
    /// The field's text must not match (an absent field does not match).
    NotMatches(Pattern),
}

/// A compiled match clause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clause {
    path: Vec<String>,
    test: Test,
}

impl Clause {
    /// Does the clause hold for these args?
    ///
    /// The field is tested as each of its texts ([`field_texts`]): a
    /// `matches` holds when any of them matches, a `not_matches` when none
    /// does. An absent field matches nothing: `matches` fails and
    /// `not_matches` holds.
    pub fn holds(&self, args: &serde_json::Value) -> bool {
        let texts = field_texts(args, &self.path);
        let found = |p: &Pattern| texts.iter().any(|t| p.is_match(t));
        match &self.test {
            Test::Matches(p) => found(p),
            Test::NotMatches(p) => !found(p),
        }
    }

    /// The dotted path's segments.
    pub fn path(&self) -> &[String] {
        &self.path
    }

    /// The clause's test.
    pub fn test(&self) -> &Test {
        &self.test
    }
}

/// The value at `path` in `args`, if it is there.
fn field_value<'a>(args: &'a serde_json::Value, path: &[String]) -> Option<&'a serde_json::Value> {
    let mut at = args;
    for seg in path {
        at = match at {
            serde_json::Value::Object(map) => map.get(seg)?,
            serde_json::Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

/// The text of the field at `path` in `args`, if it is there: a string as
/// itself, anything else as its compact JSON. (Clauses test more texts
/// than this one: [`field_texts`].)
pub fn field_text<'a>(args: &'a serde_json::Value, path: &[String]) -> Option<Cow<'a, str>> {
    field_value(args, path).map(value_text)
}

fn value_text(v: &serde_json::Value) -> Cow<'_, str> {
    match v {
        serde_json::Value::String(s) => Cow::Borrowed(s.as_str()),
        other => Cow::Owned(canonical_json(other)),
    }
}

/// Every text a clause tests the field at `path` in `args` as (none when
/// the field is absent): a string as itself; an array as each element
/// (a string as itself, anything else as its compact JSON), as the shell
/// line its elements make ([`shell_join`]), and as its compact JSON;
/// anything else as its compact JSON.
pub fn field_texts<'a>(args: &'a serde_json::Value, path: &[String]) -> Vec<Cow<'a, str>> {
    let Some(value) = field_value(args, path) else {
        return Vec::new();
    };
    let serde_json::Value::Array(items) = value else {
        return vec![value_text(value)];
    };
    let mut texts: Vec<Cow<'a, str>> = items.iter().map(value_text).collect();
    texts.push(Cow::Owned(shell_join(texts.iter().map(|t| t.as_ref()))));
    texts.push(Cow::Owned(canonical_json(value)));
    texts
}

/// The command line a shell would split into `words`: the words joined by
/// single spaces, each word that holds anything but letters, digits and
/// `-_./=:,+@%` single-quoted (`'` written `'\''`), an empty word as `''`.
pub fn shell_join<'w>(words: impl IntoIterator<Item = &'w str>) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    let mut line = String::new();
    for (i, word) in words.into_iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        if !word.is_empty() && word.chars().all(plain) {
            line.push_str(word);
        } else {
            line.push('\'');
            line.push_str(&word.replace('\'', "'\\''"));
            line.push('\'');
        }
    }
    line
}

/// A checked rule. Built only by [`Rule::compile`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RuleSpec", into = "RuleSpec")]
pub struct Rule {
    spec: RuleSpec,
    id: RuleId,
    clauses: Vec<Clause>,
}

impl From<Rule> for RuleSpec {
    fn from(rule: Rule) -> Self {
        rule.spec
    }
}

impl TryFrom<RuleSpec> for Rule {
    type Error = RuleError;
    fn try_from(spec: RuleSpec) -> Result<Self, RuleError> {
        Rule::compile(spec)
    }
}

impl Rule {
    /// Checks a written rule and compiles its patterns.
    pub fn compile(spec: RuleSpec) -> Result<Self, RuleError> {
        let id = spec.id.clone();
        if !RuleId::is_valid(&id) {
            return Err(RuleError::BadId { id });
        }
        if (spec.doors.is_empty() && spec.tools.is_empty())
            || spec.doors.iter().chain(&spec.tools).any(String::is_empty)
        {
            return Err(RuleError::BadDoors { id });
        }
        if spec.subject.is_empty() {
            return Err(RuleError::EmptySubject { id });
        }
        if spec.scope.as_deref() == Some("") {
            return Err(RuleError::EmptyScope { id });
        }
        if spec.reason.trim().is_empty() {
            return Err(RuleError::EmptyReason { id });
        }
        if let (Some(since), Some(until)) = (spec.since, spec.until) {
            if since >= until {
                return Err(RuleError::EmptyWindow { id, since, until });
            }
        }
        let mut clauses = Vec::with_capacity(spec.clauses.len());
        for (index, c) in spec.clauses.iter().enumerate() {
            let path: Vec<String> = c.field.split('.').map(str::to_owned).collect();
            if path.iter().any(String::is_empty) {
                return Err(RuleError::BadField {
                    id,
                    index,
                    field: c.field.clone(),
                });
            }
            let compile = |p: &str| {
                Pattern::new(p).map_err(|source| RuleError::Pattern {
                    id: id.clone(),
                    index,
                    source,
                })
            };
            let test = match (&c.matches, &c.not_matches) {
                (Some(p), None) => Test::Matches(compile(p)?),
                (None, Some(p)) => Test::NotMatches(compile(p)?),
                _ => {
                    return Err(RuleError::ClauseTests {
                        id,
                        index,
                        field: c.field.clone(),
                    })
                }
            };
            clauses.push(Clause { path, test });
        }
        Ok(Self {
            id: RuleId(id),
            spec,
            clauses,
        })
    }

    /// The rule's id.
    pub fn id(&self) -> &RuleId {
        &self.id
    }
    /// The rule as written.
    pub fn spec(&self) -> &RuleSpec {
        &self.spec
    }
    /// refuse | ask | allow.
    pub fn effect(&self) -> Effect {
        self.spec.effect
    }
    /// `*`, an actor name, or an actor glob.
    pub fn subject(&self) -> &str {
        &self.spec.subject
    }
    /// The path prefix, if any.
    pub fn scope(&self) -> Option<&str> {
        self.spec.scope.as_deref()
    }
    /// Door names or globs.
    pub fn doors(&self) -> &[String] {
        &self.spec.doors
    }
    /// Tool names or globs.
    pub fn tools(&self) -> &[String] {
        &self.spec.tools
    }
    /// The sentence a refused caller is shown.
    pub fn reason(&self) -> &str {
        &self.spec.reason
    }
    /// Who let the rule exist.
    pub fn authority(&self) -> &str {
        &self.spec.authority
    }
    /// Whether the rule is locked.
    pub fn locked(&self) -> bool {
        self.spec.locked
    }
    /// The compiled clauses.
    pub fn clauses(&self) -> &[Clause] {
        &self.clauses
    }

    /// Is the rule in force at `clock` (`since <= clock < until`)?
    pub fn in_force(&self, clock: Timestamp) -> bool {
        self.spec.since.is_none_or(|s| s <= clock) && self.spec.until.is_none_or(|u| clock < u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn spec(id: &str) -> RuleSpec {
        RuleSpec {
            id: id.into(),
            subject: "*".into(),
            scope: None,
            doors: vec!["push".into()],
            tools: Vec::new(),
            effect: Effect::Ask,
            reason: "a person decides".into(),
            authority: "test".into(),
            locked: false,
            since: None,
            until: None,
            clauses: vec![],
        }
    }

    #[test]
    fn effects_are_ordered_by_restrictiveness() {
        assert!(Effect::Allow < Effect::Ask && Effect::Ask < Effect::Refuse);
    }

    #[test]
    fn bad_rules_are_refused_with_their_reason() {
        let mut s = spec("bad:id");
        assert!(matches!(
            Rule::compile(s.clone()),
            Err(RuleError::BadId { .. })
        ));
        s = spec("r");
        s.doors.clear();
        assert!(matches!(Rule::compile(s), Err(RuleError::BadDoors { .. })));
        s = spec("r");
        s.clauses.push(ClauseSpec {
            field: "a".into(),
            matches: Some("x".into()),
            not_matches: Some("y".into()),
        });
        assert!(matches!(
            Rule::compile(s),
            Err(RuleError::ClauseTests { index: 0, .. })
        ));
        s = spec("r");
        s.clauses.push(ClauseSpec {
            field: "a..b".into(),
            matches: Some("x".into()),
            not_matches: None,
        });
        assert!(matches!(Rule::compile(s), Err(RuleError::BadField { .. })));
        s = spec("r");
        s.since = Some(Timestamp(10));
        s.until = Some(Timestamp(10));
        assert!(matches!(
            Rule::compile(s),
            Err(RuleError::EmptyWindow { .. })
        ));
        s = spec("r");
        s.reason = " ".into();
        assert!(matches!(
            Rule::compile(s),
            Err(RuleError::EmptyReason { .. })
        ));
    }

    #[test]
    fn clauses_read_dotted_paths_and_non_strings() {
        let mut s = spec("r");
        s.clauses = vec![
            ClauseSpec {
                field: "input.files.1".into(),
                matches: Some("^b$".into()),
                not_matches: None,
            },
            ClauseSpec {
                field: "force".into(),
                matches: Some("^true$".into()),
                not_matches: None,
            },
        ];
        let r = Rule::compile(s).unwrap();
        let yes = json!({"input": {"files": ["a", "b"]}, "force": true});
        let no = json!({"input": {"files": ["a", "c"]}, "force": true});
        assert!(r.clauses().iter().all(|c| c.holds(&yes)));
        assert!(!r.clauses().iter().all(|c| c.holds(&no)));
    }

    #[test]
    fn absent_field_fails_matches_and_holds_not_matches() {
        let mut s = spec("r");
        s.clauses = vec![ClauseSpec {
            field: "command".into(),
            matches: None,
            not_matches: Some("x".into()),
        }];
        let r = Rule::compile(s).unwrap();
        assert!(r.clauses()[0].holds(&json!({})));
        assert!(!r.clauses()[0].holds(&json!({"command": "x"})));
        // An array hiding the text is still seen.
        assert!(!r.clauses()[0].holds(&json!({"command": ["x"]})));
    }

    #[test]
    fn serde_round_trip_goes_through_compile() {
        let r = Rule::compile(spec("r")).unwrap();
        let text = serde_json::to_string(&r).unwrap();
        let back: Rule = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        let bad = text.replace("\"push\"", "\"\"");
        assert!(serde_json::from_str::<Rule>(&bad).is_err());
    }
}
