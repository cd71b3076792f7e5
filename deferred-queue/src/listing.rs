//! The order in which the morning queue is shown.
//!
//! Invariants: [`order_for_listing`] is a permutation of its input and a
//! total order that does not depend on the input's order: acts awaiting a
//! person ([`State::awaits_person`]) come first, then the rest; within each
//! section acts are grouped by run, groups ordered by their oldest act
//! (ties by run id), and acts within a group oldest first (ties by act id).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::act::Act;
use crate::machine::State;

/// An act and where it is, as the adapter stores them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActRow {
    /// The act.
    pub act: Act,
    /// Its state.
    pub state: State,
}

/// `rows` in the order the queue is shown: see the module note.
pub fn order_for_listing(rows: &[ActRow]) -> Vec<&ActRow> {
    // The oldest act of each run within each section orders the groups.
    let mut group_start: BTreeMap<(u8, &str), i64> = BTreeMap::new();
    for row in rows {
        let start = group_start
            .entry((section(row), row.act.run.as_str()))
            .or_insert(row.act.created_at);
        *start = (*start).min(row.act.created_at);
    }
    let mut out: Vec<&ActRow> = rows.iter().collect();
    out.sort_by(|a, b| sort_key(a, &group_start).cmp(&sort_key(b, &group_start)));
    out
}

fn section(row: &ActRow) -> u8 {
    u8::from(!row.state.awaits_person())
}

fn sort_key<'a>(
    row: &'a ActRow,
    group_start: &BTreeMap<(u8, &str), i64>,
) -> (u8, i64, &'a str, i64, &'a str) {
    let s = section(row);
    let run = row.act.run.as_str();
    let start = group_start
        .get(&(s, run))
        .copied()
        .unwrap_or(row.act.created_at);
    (s, start, run, row.act.created_at, row.act.id.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::{Content, Door, Routing, Target};

    fn row(id: &str, run: &str, created_at: i64, state: State) -> ActRow {
        ActRow {
            act: Act {
                id: id.into(),
                run: run.into(),
                actor: "agent".into(),
                door: Door::Notify,
                routing: Routing {
                    destination: "chat".into(),
                    target: Target::Message {
                        endpoint: "room".into(),
                    },
                },
                content: Content::Message {
                    body_digest: "b".into(),
                    size: 1,
                },
                policy_generation: "1:00".into(),
                deciding_rules: vec![],
                created_at,
                expires_at: created_at + 100,
            },
            state,
        }
    }

    fn ids(rows: &[ActRow]) -> Vec<&str> {
        order_for_listing(rows)
            .into_iter()
            .map(|r| r.act.id.as_str())
            .collect()
    }

    #[test]
    fn waiting_acts_come_first_grouped_by_run_oldest_first() {
        let done = State::Done {
            outcome: "ok".into(),
            attempts: 1,
        };
        let rows = vec![
            row("d1", "r1", 1, done),
            row("b2", "r2", 30, State::Pending),
            row("a2", "r1", 20, State::Pending),
            row(
                "b1",
                "r2",
                5,
                State::Stale {
                    why: "moved".into(),
                },
            ),
            row("a1", "r1", 10, State::Pending),
            row("c1", "r3", 15, State::Pending),
        ];
        // r2's group starts at 5, r1's at 10, r3's at 15; d1 is done.
        assert_eq!(ids(&rows), vec!["b1", "b2", "a1", "a2", "c1", "d1"]);
    }

    #[test]
    fn the_order_does_not_depend_on_the_input_order() {
        let mut rows = vec![
            row("x", "r1", 10, State::Pending),
            row("y", "r1", 10, State::Pending),
            row("z", "r0", 10, State::Pending),
        ];
        let first: Vec<String> = ids(&rows).into_iter().map(String::from).collect();
        rows.reverse();
        assert_eq!(ids(&rows), first);
        assert_eq!(first, vec!["z", "x", "y"]);
    }
}
