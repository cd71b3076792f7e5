//! Property tests of autonomy-scope proposals on generated histories.
//!
//! - no proposal lets through an act a person rejected, let expire or found
//!   stale, nor content to readers who may not read it, nor an unconfigured
//!   destination (checked on every record and near variants);
//! - adopting a proposal (its rows applied to the rule set) changes exactly
//!   the recorded decisions its diff shows, and no others;
//! - every act of a proposal's evidence goes through under its own allow
//!   (never an allow a wider ask shadows);
//! - the narrowest rung's delta is empty, and it is the only rung marked safe.

use std::collections::BTreeSet;
use std::path::Path;

use policies::gate::{Destination, Destinations, Readers};
use policies::scopes::{self, Outcome, Passage, Record};
use policies::{Label, RuleSet, Timestamp};
use proptest::prelude::*;

const CLOCK: Timestamp = Timestamp(1_800_000_000);

fn defaults() -> RuleSet {
    policies::rulefile::rule_set_from_files([(Path::new("default.toml"), policies::DEFAULT_RULES)])
        .unwrap()
}

/// The defaults plus some owner rules: a refuse on one agent branch and an
/// ask on another repository, so that proposals meet rules they must not
/// punch through.
fn rules(extra: u8) -> RuleSet {
    let mut set = defaults();
    let mut text = String::new();
    if extra & 1 != 0 {
        text.push_str(
            "[[rule]]\nid = \"no-agent-bad\"\nsubject = \"*\"\ndoors = [\"push\"]\neffect = \"refuse\"\n\
             reason = \"r\"\nauthority = \"t\"\nmatch = [{ field = \"ref\", matches = 'agent/bad$' }]\n",
        );
    }
    if extra & 2 != 0 {
        text.push_str(
            "[[rule]]\nid = \"ask-r2\"\nsubject = \"*\"\ndoors = [\"push\", \"notify\"]\neffect = \"ask\"\n\
             reason = \"r\"\nauthority = \"t\"\nlocked = true\nmatch = [{ field = \"repository\", matches = '^/r2$' }]\n",
        );
    }
    if !text.is_empty() {
        let more =
            policies::rulefile::rule_set_from_files([(Path::new("extra.toml"), text.as_str())])
                .unwrap();
        for entry in more.entries().values() {
            set.apply(policies::Row::Declare {
                rule: entry.rule.clone(),
                author: policies::Author::Owner,
            })
            .unwrap();
        }
    }
    set
}

fn destinations() -> Destinations {
    Destinations::from([
        (
            "origin".to_owned(),
            Destination {
                readers: Readers::Private,
            },
        ),
        (
            "mirror".to_owned(),
            Destination {
                readers: Readers::Public,
            },
        ),
        (
            "team".to_owned(),
            Destination {
                readers: Readers::Private,
            },
        ),
    ])
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop::sample::select(vec![
        Outcome::Approved,
        Outcome::Approved,
        Outcome::DryAsked,
        Outcome::DryAsked,
        Outcome::Rejected,
        Outcome::Expired,
        Outcome::Stale,
        Outcome::Pending,
        Outcome::Refused,
        Outcome::DryRefused,
    ])
}

fn record() -> impl Strategy<Value = Record> {
    (
        0usize..6,
        prop::sample::select(vec!["/r1", "/r2"]),
        prop::sample::select(vec!["origin", "mirror", "elsewhere"]),
        prop::sample::select(vec![
            "refs/heads/agent/a",
            "refs/heads/agent/b",
            "refs/heads/agent/c/d",
            "refs/heads/agent/bad",
            "refs/heads/main",
            "refs/heads/feature/x",
            "refs/heads/agent/a-2",
        ]),
        prop::bool::weighted(0.1),
        prop::sample::select(Label::ALL.to_vec()),
        outcome(),
        0i64..1000,
        prop::bool::weighted(0.15),
    )
        .prop_map(|(n, repo, dest, r, force, label, outcome, at, notify)| {
            let (door, dest, args) = if notify {
                (
                    "notify",
                    "team",
                    serde_json::json!({"destination": "team", "repository": repo}),
                )
            } else {
                (
                    "push",
                    dest,
                    serde_json::json!({
                        "remote": dest, "ref": r, "commit": format!("{n:040}"),
                        "force": force, "delete": false, "repository": repo,
                    }),
                )
            };
            Record {
                id: format!("a{at}-{n}"),
                run: format!("run{n}"),
                at,
                actor: format!("run-run{n}"),
                door: door.into(),
                repository: repo.into(),
                destination: dest.into(),
                args,
                label,
                outcome,
            }
        })
}

fn history() -> impl Strategy<Value = (u8, Vec<Record>)> {
    (0u8..4, prop::collection::vec(record(), 1..40)).prop_map(|(extra, mut records)| {
        // Ids are unique, as in a store.
        for (i, r) in records.iter_mut().enumerate() {
            r.id = format!("{}-{i}", r.id);
        }
        (extra, records)
    })
}

fn judge(rules: &RuleSet, r: &Record) -> policies::scopes::Judgement {
    scopes::passage(
        rules,
        &r.request(),
        &r.destination,
        destinations().get(&r.destination).map(|d| d.readers),
        r.label,
        CLOCK,
    )
}

/// Near variants, built here independently of the crate's own.
fn probes(records: &[Record]) -> Vec<Record> {
    let mut out = records.to_vec();
    for r in records {
        for label in Label::ALL {
            let mut v = r.clone();
            v.label = label;
            out.push(v);
        }
        for dest in ["origin", "mirror", "elsewhere"] {
            let mut v = r.clone();
            v.destination = dest.into();
            if let Some(o) = v.args.as_object_mut() {
                for field in ["remote", "destination"] {
                    if o.contains_key(field) {
                        o.insert(field.into(), dest.into());
                    }
                }
            }
            out.push(v);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn proposals_never_pass_what_a_person_blocked_or_readers_may_not_read((extra, records) in history()) {
        let rules = rules(extra);
        let dest = destinations();
        let out = scopes::propose(scopes::Input {
            rules: &rules, records: &records, evidence: &records,
            destinations: &dest, refused: &BTreeSet::new(), clock: CLOCK,
        });
        for p in &out.proposals {
            let next = scopes::adopted(&rules, p).expect("the engine takes every proposal");
            for r in probes(&records) {
                let j = judge(&next, &r);
                if j.passage != Passage::Carried { continue; }
                let readers = dest.get(&r.destination).map(|d| d.readers);
                prop_assert!(readers.is_some(), "{} carries to unconfigured {}", p.id, r.destination);
                prop_assert!(scopes::readable(r.label, readers.unwrap()),
                    "{} carries {} content to {:?} readers", p.id, r.label, readers);
                prop_assert_ne!(r.args.get("force"), Some(&serde_json::Value::Bool(true)), "never a force push");
            }
            for r in records.iter().filter(|r| r.outcome.is_blocked()) {
                prop_assert_ne!(judge(&next, r).passage, Passage::Carried, "{} passes blocked {}", &p.id, &r.id);
            }
            // Every act of the evidence goes through under the proposal's own allow.
            let allow = policies::RuleId(format!("{}-allow", p.id));
            for r in records.iter().filter(|r| p.evidence.acts.contains(&r.id)) {
                prop_assert_eq!(judge(&next, r).scope, Some(allow.clone()));
            }
            // One repository, one literal destination.
            prop_assert!(records.iter().any(|r| r.repository == p.repository));
            prop_assert!(dest.contains_key(&p.destination));
        }
    }

    #[test]
    fn adopting_changes_exactly_the_diff((extra, records) in history()) {
        let rules = rules(extra);
        let dest = destinations();
        let out = scopes::propose(scopes::Input {
            rules: &rules, records: &records, evidence: &records,
            destinations: &dest, refused: &BTreeSet::new(), clock: CLOCK,
        });
        for p in &out.proposals {
            let diff = scopes::diff(&rules, p, &records, &dest, CLOCK).unwrap();
            let shown: BTreeSet<&str> = diff.iter().map(|d| d.act.as_str()).collect();
            // Adopt as `nightshift scopes adopt` does: row by row.
            let mut next = rules.clone();
            for row in scopes::adoption_rows(p) {
                next.apply(row).unwrap();
            }
            for r in &records {
                let before = judge(&rules, r);
                let after = judge(&next, r);
                let rule = |j: &policies::scopes::Judgement| j.decision.as_ref().map(|d| d.rule.to_string());
                let changed = before.passage != after.passage || rule(&before) != rule(&after);
                prop_assert_eq!(changed, shown.contains(r.id.as_str()), "act {} in {}", &r.id, &p.id);
                if let Some(d) = diff.iter().find(|d| d.act == r.id) {
                    prop_assert_eq!(d.before, before.passage);
                    prop_assert_eq!(d.after, after.passage);
                }
                // Nothing outside the proposal's repository changes passage.
                if r.repository != p.repository {
                    prop_assert_eq!(before.passage, after.passage);
                }
            }
        }
    }

    #[test]
    fn the_narrowest_rung_has_an_empty_delta((extra, records) in history()) {
        let rules = rules(extra);
        let dest = destinations();
        let out = scopes::propose(scopes::Input {
            rules: &rules, records: &records, evidence: &records,
            destinations: &dest, refused: &BTreeSet::new(), clock: CLOCK,
        });
        for p in &out.proposals {
            if p.rung == 0 {
                prop_assert!(p.delta.is_empty(), "{}: {:?}", p.id, p.delta);
                prop_assert!(p.safe && p.default);
                // Only routings of its evidence pass that did not before.
                let next = scopes::adopted(&rules, p).unwrap();
                let seen: BTreeSet<(String, String, String)> = records.iter()
                    .filter(|r| p.evidence.acts.contains(&r.id))
                    .map(|r| (r.destination.clone(), r.repository.clone(), r.args.get("ref").map(|v| v.to_string()).unwrap_or_default()))
                    .collect();
                for r in probes(&records) {
                    if judge(&next, &r).passage == Passage::Carried && judge(&rules, &r).passage != Passage::Carried {
                        let key = (r.destination.clone(), r.repository.clone(), r.args.get("ref").map(|v| v.to_string()).unwrap_or_default());
                        prop_assert!(seen.contains(&key), "{} lets {:?} through", p.id, key);
                    }
                }
            } else {
                prop_assert!(!p.safe && !p.default && p.delta_unbounded);
                prop_assert!(!p.delta.is_empty(), "a pattern rung always shows what it admits");
            }
        }
    }

    #[test]
    fn proposals_are_deterministic_and_refusal_hides_them((extra, records) in history()) {
        let rules = rules(extra);
        let dest = destinations();
        let input = scopes::Input {
            rules: &rules, records: &records, evidence: &records,
            destinations: &dest, refused: &BTreeSet::new(), clock: CLOCK,
        };
        let a = scopes::propose(input);
        let b = scopes::propose(input);
        prop_assert_eq!(&a, &b);
        let refused: BTreeSet<String> = a.proposals.iter().map(|p| p.id.clone()).collect();
        let c = scopes::propose(scopes::Input { refused: &refused, ..input });
        prop_assert!(c.proposals.iter().all(|p| !refused.contains(&p.id)));
    }
}

#[test]
fn agent_branches_are_proposed_and_main_is_not() {
    let rules = defaults();
    let dest = destinations();
    let mut records = Vec::new();
    for (i, r) in [
        "refs/heads/agent/x1",
        "refs/heads/agent/x2",
        "refs/heads/main",
    ]
    .iter()
    .enumerate()
    {
        records.push(Record {
            id: format!("d{i}"),
            run: format!("run{i}"),
            at: i as i64,
            actor: format!("run-run{i}"),
            door: "push".into(),
            repository: "/r1".into(),
            destination: "origin".into(),
            args: serde_json::json!({"remote": "origin", "ref": r, "commit": "c", "force": false, "delete": false, "repository": "/r1"}),
            label: Label::TOP,
            outcome: Outcome::DryAsked,
        });
    }
    let out = scopes::propose(scopes::Input {
        rules: &rules,
        records: &records,
        evidence: &records,
        destinations: &dest,
        refused: &BTreeSet::new(),
        clock: CLOCK,
    });
    let patterns: Vec<Option<String>> = out.proposals.iter().map(|p| p.pattern.clone()).collect();
    assert_eq!(
        patterns,
        vec![
            Some("^(?:refs/heads/agent/x1|refs/heads/agent/x2)$".to_owned()),
            Some("^refs/heads/agent/[^/]+$".to_owned()),
            Some("^refs/heads/agent/.+$".to_owned()),
        ]
    );
    assert!(out.declined.iter().any(|d| d.group == "refs/heads/main"));
    // A rejected push in the namespace stops every rung that admits it.
    let mut with_reject = records.clone();
    let mut bad = records[0].clone();
    bad.id = "a-bad".into();
    bad.args["ref"] = "refs/heads/agent/x9".into();
    bad.outcome = Outcome::Rejected;
    with_reject.push(bad);
    let out = scopes::propose(scopes::Input {
        rules: &rules,
        records: &with_reject,
        evidence: &with_reject,
        destinations: &dest,
        refused: &BTreeSet::new(),
        clock: CLOCK,
    });
    assert_eq!(out.proposals.len(), 1, "{:?}", out.proposals);
    assert_eq!(out.proposals[0].rung, 0);
}

#[test]
fn no_proposal_carries_a_force_push_a_deletion_or_what_a_refuse_covers() {
    // The defaults plus the owner's refuse on `agent/bad`.
    let rules = rules(1);
    let dest = destinations();
    let push = |i: usize, r: &str, outcome: Outcome| Record {
        id: format!("d{i}"),
        run: format!("run{i}"),
        at: i as i64,
        actor: format!("run-run{i}"),
        door: "push".into(),
        repository: "/r1".into(),
        destination: "origin".into(),
        // Fields no rule reads, standing for content the evidence must not keep.
        args: serde_json::json!({"remote": "origin", "ref": r, "commit": "c", "force": false, "delete": false,
            "repository": "/r1", "title": "SECRET-TITLE", "message": "SECRET-MESSAGE"}),
        label: Label::TOP,
        outcome,
    };
    let records = vec![
        push(0, "refs/heads/agent/x1", Outcome::Approved),
        push(1, "refs/heads/agent/x2", Outcome::DryAsked),
        push(2, "refs/heads/agent/bad", Outcome::Refused),
    ];
    let out = scopes::propose(scopes::Input {
        rules: &rules,
        records: &records,
        evidence: &records,
        destinations: &dest,
        refused: &BTreeSet::new(),
        clock: CLOCK,
    });
    assert!(
        out.proposals.iter().any(|p| p.rung > 0),
        "a pattern rung that spans agent/bad: {:?}",
        out.proposals
    );
    let shown = format!("{out:?}");
    assert!(!shown.contains("SECRET"), "content in a proposal: {shown}");
    for p in &out.proposals {
        let next = scopes::adopted(&rules, p).unwrap();
        assert_eq!(
            judge(&next, &records[0]).passage,
            Passage::Carried,
            "{}",
            p.id
        );
        for r in &records[..2] {
            for field in ["force", "delete"] {
                let mut v = r.clone();
                v.args[field] = true.into();
                assert_ne!(
                    judge(&next, &v).passage,
                    Passage::Carried,
                    "{} {field}",
                    p.id
                );
            }
        }
        assert_eq!(
            judge(&next, &records[2]).passage,
            Passage::Refused,
            "{}",
            p.id
        );
    }
}
