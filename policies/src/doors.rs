//! The door schema: the doors nightshift has, and the fields each one sends
//! to the policy.
//!
//! Invariants: [`DOORS`] is the one list of door names and their policy
//! fields. The door (the orchestrator's `acts.rs`) passes every field named
//! here, and only these
//! (`orchestrator/supervisor/src/acts/mod.rs::tests::the_policy_sees_exactly_the_fields_the_door_schema_names`);
//! rule files are checked against it when they are read ([`check_rule`]): a
//! `doors` entry that names no door (a glob that matches none), or a match
//! clause on a field that one of the rule's doors never sends, is an error,
//! so a rule cannot silently never match
//! (`tests::unknown_doors_and_unsent_fields_fail`,
//! `tests/loading.rs::a_field_the_door_never_sends_is_named_at_its_clause`). A
//! harness's tools (`policy check --tool`) are open-ended and are named in a
//! rule's `tools`, which this schema does not check.

use crate::glob::glob_matches;
use crate::rule::Rule;

/// One door and the fields it sends to the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorSchema {
    /// The door's name (`deferred_queue::Door::name`, the protocol's `door`).
    pub name: &'static str,
    /// The top-level keys of the policy request's args.
    pub fields: &'static [&'static str],
}

/// Every door, with its fields.
pub const DOORS: &[DoorSchema] = &[
    DoorSchema {
        name: "push",
        // `ref` is the branch updated (`refs/heads/...`); `force` and
        // `delete` are booleans, so a clause tests `true` / `false`;
        // `repository` is the host repository the run works on (its path),
        // so that a rule (an autonomy scope) can hold for one repository.
        fields: &["remote", "ref", "commit", "force", "delete", "repository"],
    },
    DoorSchema {
        name: "pull_request",
        fields: &["remote", "base", "head", "commit", "repository"],
    },
    DoorSchema {
        name: "notify",
        fields: &["destination", "repository"],
    },
    DoorSchema {
        name: "ask",
        fields: &[],
    },
];

/// The schema of the door called `name`.
pub fn door(name: &str) -> Option<&'static DoorSchema> {
    DOORS.iter().find(|d| d.name == name)
}

/// The door names, for messages.
pub fn door_names() -> String {
    DOORS.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
}

/// Why a rule does not fit the door schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A `doors` entry that is, or matches, no door.
    #[error("door {door:?} is not a door nightshift has ({known}){hint}")]
    UnknownDoor {
        /// The entry as written.
        door: String,
        /// The doors there are.
        known: String,
        /// A pointer to the likely fix, or empty.
        hint: String,
    },
    /// A match clause on a field one of the rule's doors never sends.
    #[error("match clause {index} tests field {field:?}, which door {door} never sends (it sends: {sent})")]
    FieldNotSent {
        /// Position of the clause, from 0.
        index: usize,
        /// The field as written.
        field: String,
        /// The door that does not send it.
        door: &'static str,
        /// What that door sends.
        sent: String,
    },
}

impl SchemaError {
    /// Index of the match clause the error is about, if any.
    pub fn clause_index(&self) -> Option<usize> {
        match self {
            SchemaError::FieldNotSent { index, .. } => Some(*index),
            SchemaError::UnknownDoor { .. } => None,
        }
    }
}

fn hint(door: &str) -> String {
    match door {
        "pr" => "; a pull request's door is \"pull_request\"".into(),
        _ if door.chars().next().is_some_and(char::is_uppercase) || door.contains("__") => {
            "; a harness's tool goes in `tools`, not `doors`".into()
        }
        _ => "; a harness's tool goes in `tools`".into(),
    }
}

/// Checks a rule's doors and match fields against [`DOORS`]. A rule with
/// tools only has nothing to check. Fields are checked by their first path
/// segment against every door the rule's `doors` match.
pub fn check_rule(rule: &Rule) -> Result<(), SchemaError> {
    let mut matched: Vec<&'static DoorSchema> = Vec::new();
    for entry in rule.doors() {
        let here: Vec<_> = DOORS
            .iter()
            .filter(|d| glob_matches(entry, d.name))
            .collect();
        if here.is_empty() {
            return Err(SchemaError::UnknownDoor {
                door: entry.clone(),
                known: door_names(),
                hint: hint(entry),
            });
        }
        for d in here {
            if !matched.contains(&d) {
                matched.push(d);
            }
        }
    }
    for (index, clause) in rule.clauses().iter().enumerate() {
        let top = clause.path().first().map(String::as_str).unwrap_or("");
        if let Some(d) = matched.iter().find(|d| !d.fields.contains(&top)) {
            return Err(SchemaError::FieldNotSent {
                index,
                field: clause.path().join("."),
                door: d.name,
                sent: if d.fields.is_empty() {
                    "no fields".into()
                } else {
                    d.fields.join(", ")
                },
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{ClauseSpec, Effect, RuleSpec};

    fn rule(doors: &[&str], tools: &[&str], fields: &[&str]) -> Rule {
        Rule::compile(RuleSpec {
            id: "r".into(),
            subject: "*".into(),
            scope: None,
            doors: doors.iter().map(|d| d.to_string()).collect(),
            tools: tools.iter().map(|d| d.to_string()).collect(),
            effect: Effect::Refuse,
            reason: "r".into(),
            authority: "t".into(),
            locked: false,
            since: None,
            until: None,
            clauses: fields
                .iter()
                .map(|f| ClauseSpec {
                    field: f.to_string(),
                    matches: Some("x".into()),
                    not_matches: None,
                })
                .collect(),
        })
        .unwrap()
    }

    #[test]
    fn known_doors_and_their_fields_pass() {
        assert_eq!(check_rule(&rule(&["push"], &[], &["force", "ref"])), Ok(()));
        assert_eq!(check_rule(&rule(&["pull_request"], &[], &["base"])), Ok(()));
        assert_eq!(check_rule(&rule(&["*"], &[], &[])), Ok(()));
        assert_eq!(check_rule(&rule(&["p*"], &[], &["remote"])), Ok(()));
        assert_eq!(check_rule(&rule(&[], &["Bash"], &["command"])), Ok(()));
    }

    #[test]
    fn unknown_doors_and_unsent_fields_fail() {
        let e = check_rule(&rule(&["pr"], &[], &[])).unwrap_err();
        assert!(e.to_string().contains("\"pull_request\""), "{e}");
        assert!(check_rule(&rule(&["Bash"], &[], &[])).is_err());
        assert!(check_rule(&rule(&["x*"], &[], &[])).is_err());
        let e = check_rule(&rule(&["notify"], &[], &["ref"])).unwrap_err();
        assert_eq!(e.clause_index(), Some(0));
        // A glob covering two doors needs the field from both.
        assert!(check_rule(&rule(&["p*"], &[], &["ref"])).is_err());
        assert!(check_rule(&rule(&["ask"], &["Bash"], &["command"])).is_err());
    }
}
