//! Rows: tier-1 declarations, proposals and ratification, retirement,
//! locks, freeze, and the generation.

use policies::ruleset::{Origin, Status};
use policies::{
    evaluate, ApplyError, Author, Change, Decider, Effect, Generation, Request, Row, Rule, RuleId,
    RuleSet, RuleSpec, Timestamp,
};
use serde_json::json;

const NOW: Timestamp = Timestamp(1_000);

fn rule(id: &str, subject: &str, effect: Effect) -> Rule {
    Rule::compile(RuleSpec {
        id: id.into(),
        subject: subject.into(),
        scope: None,
        doors: vec!["push".into()],
        tools: Vec::new(),
        effect,
        reason: format!("{id} says {effect}"),
        authority: "test".into(),
        locked: false,
        since: None,
        until: None,
        clauses: vec![],
    })
    .unwrap()
}

fn push(actor: &str) -> Request {
    Request {
        actor: Some(actor.into()),
        ..Request::new("push", json!({"ref": "agent/x"}))
    }
}

fn agent(a: &str) -> Author {
    Author::Agent(a.into())
}

#[test]
fn a_proposal_is_inert_until_ratified_and_ratified_rules_are_locked() {
    let mut set = RuleSet::new();
    set.apply(Row::Declare {
        rule: rule("ask-push", "*", Effect::Ask),
        author: Author::Shipped,
    })
    .unwrap();
    // The agent may not declare an allow...
    let e = set
        .apply(Row::Declare {
            rule: rule("let-me", "a1", Effect::Allow),
            author: agent("a1"),
        })
        .unwrap_err();
    assert!(matches!(e, ApplyError::NeedsOwner(_)), "{e}");
    // ... but may propose one, which changes nothing yet.
    set.apply(Row::Propose {
        proposal: "p1".into(),
        change: Change::Declare {
            rule: Box::new(rule("let-me", "a1", Effect::Allow)),
        },
        author: agent("a1"),
    })
    .unwrap();
    assert_eq!(evaluate(&set, &push("a1"), NOW).verdict, Effect::Ask);
    assert!(set.pending().contains_key("p1"));
    set.apply(Row::Ratify {
        proposal: "p1".into(),
        authority: "owner".into(),
        lock: true,
    })
    .unwrap();
    let e = &set.entries()[&RuleId("let-me".into())];
    assert!(e.locked);
    assert_eq!(e.origin, Origin::Ratified("p1".into()));
    // The ask still wins: an allow never punches through.
    assert_eq!(evaluate(&set, &push("a1"), NOW).verdict, Effect::Ask);
    // Retiring the ask (owner) lets the ratified allow be named.
    set.apply(Row::Retire {
        rule: RuleId("ask-push".into()),
        reason: "trusted".into(),
        authority: "owner".into(),
        author: Author::Owner,
    })
    .unwrap();
    let d = evaluate(&set, &push("a1"), NOW);
    assert_eq!(
        (d.verdict, d.rule),
        (Effect::Allow, Decider::Rule(RuleId("let-me".into())))
    );
    // Locked: cannot be retired, even by the owner, until unlocked.
    let retire = Row::Retire {
        rule: RuleId("let-me".into()),
        reason: "enough".into(),
        authority: "owner".into(),
        author: Author::Owner,
    };
    assert!(matches!(
        set.clone().apply(retire.clone()),
        Err(ApplyError::Locked { .. })
    ));
    set.apply(Row::Unlock {
        rule: RuleId("let-me".into()),
        authority: "owner".into(),
    })
    .unwrap();
    set.apply(retire).unwrap();
    assert!(matches!(
        set.entries()[&RuleId("let-me".into())].status,
        Status::Retired { .. }
    ));
    assert!(set.pending().is_empty());
}

#[test]
fn rejected_proposals_never_apply() {
    let mut set = RuleSet::new();
    set.apply(Row::Propose {
        proposal: "p".into(),
        change: Change::Declare {
            rule: Box::new(rule("x", "*", Effect::Allow)),
        },
        author: agent("a1"),
    })
    .unwrap();
    set.apply(Row::Reject {
        proposal: "p".into(),
        authority: "owner".into(),
    })
    .unwrap();
    let e = set
        .apply(Row::Ratify {
            proposal: "p".into(),
            authority: "owner".into(),
            lock: true,
        })
        .unwrap_err();
    assert!(matches!(e, ApplyError::UnknownProposal { .. }));
    assert!(set.entries().is_empty());
}

#[test]
fn agents_retire_only_what_tightens_on_themselves() {
    let mut set = RuleSet::new();
    set.apply(Row::Declare {
        rule: rule("mine", "a1", Effect::Refuse),
        author: agent("a1"),
    })
    .unwrap();
    set.apply(Row::Declare {
        rule: rule("my-allow", "a1", Effect::Allow),
        author: Author::Owner,
    })
    .unwrap();
    let retire = |id: &str| Row::Retire {
        rule: RuleId(id.into()),
        reason: "r".into(),
        authority: "a1".into(),
        author: agent("a1"),
    };
    // Retiring its own refuse loosens: the owner's call.
    let e = set.apply(retire("mine")).unwrap_err();
    assert!(
        e.to_string()
            .contains("needs the owner: use `nightshift policy propose`"),
        "{e}"
    );
    // Retiring an allow on itself tightens: tier 1.
    set.apply(retire("my-allow")).unwrap();
    // A retirement naming no rule is refused by name.
    assert!(matches!(
        set.apply(retire("ghost")),
        Err(ApplyError::UnknownRule { .. })
    ));
    // Ids are never reused.
    let e = set
        .apply(Row::Declare {
            rule: rule("my-allow", "a1", Effect::Ask),
            author: agent("a1"),
        })
        .unwrap_err();
    assert!(matches!(e, ApplyError::DuplicateId { .. }));
}

#[test]
fn freeze_names_the_rules_it_suspends_and_thaw_restores_them() {
    let mut set = RuleSet::new();
    set.apply(Row::Declare {
        rule: rule("mine", "a1", Effect::Ask),
        author: agent("a1"),
    })
    .unwrap();
    set.apply(Row::Declare {
        rule: rule("owner", "*", Effect::Ask),
        author: Author::Owner,
    })
    .unwrap();
    assert!(set.suspended().is_empty());
    set.apply(Row::Freeze {
        authority: "owner".into(),
        reason: "incident 7".into(),
        at: None,
    })
    .unwrap();
    assert_eq!(set.suspended(), vec![RuleId("mine".into())]);
    let active: Vec<String> = set.active(NOW).map(|r| r.id().0.clone()).collect();
    assert_eq!(active, vec!["owner".to_owned()]);
    assert!(matches!(
        set.apply(Row::Freeze {
            authority: "o".into(),
            reason: "again".into(),
            at: None,
        }),
        Err(ApplyError::AlreadyFrozen)
    ));
    set.apply(Row::Thaw {
        authority: "owner".into(),
    })
    .unwrap();
    assert_eq!(set.active(NOW).count(), 2);
    assert_eq!(evaluate(&set, &push("a1"), NOW).verdict, Effect::Ask);
}

#[test]
fn generation_moves_only_on_applied_rows_and_names_them() {
    let mut a = RuleSet::new();
    assert_eq!(a.generation(), Generation::EMPTY);
    let g1 = a
        .apply(Row::Declare {
            rule: rule("r1", "*", Effect::Ask),
            author: Author::Shipped,
        })
        .unwrap();
    assert_eq!(g1.rows, 1);
    let before = a.clone();
    assert!(a
        .apply(Row::Thaw {
            authority: "o".into()
        })
        .is_err());
    assert_eq!(a, before, "a refused row changes nothing");
    // Same count, different rows: different generation.
    let mut b = RuleSet::new();
    let h1 = b
        .apply(Row::Declare {
            rule: rule("r2", "*", Effect::Ask),
            author: Author::Shipped,
        })
        .unwrap();
    assert_eq!(h1.rows, g1.rows);
    assert_ne!(h1, g1);
    // The decision names the generation.
    assert_eq!(evaluate(&a, &push("a1"), NOW).generation, g1);
}

#[test]
fn apply_all_is_all_or_nothing_and_rows_round_trip_through_json() {
    let rows = vec![
        Row::Declare {
            rule: rule("r1", "*", Effect::Ask),
            author: Author::Shipped,
        },
        Row::Propose {
            proposal: "p".into(),
            change: Change::Unlock {
                rule: RuleId("r1".into()),
            },
            author: agent("a1"),
        },
        Row::Freeze {
            authority: "o".into(),
            reason: "r".into(),
            at: Some("2026-01-01T00:00:00Z".into()),
        },
    ];
    let text = serde_json::to_string(&rows).unwrap();
    let back: Vec<Row> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, rows);
    let set = RuleSet::from_rows(back).unwrap();
    assert_eq!(
        set.generation(),
        RuleSet::from_rows(rows.clone()).unwrap().generation()
    );
    let mut broken = rows;
    broken.push(Row::Retire {
        rule: RuleId("nope".into()),
        reason: "x".into(),
        authority: "o".into(),
        author: Author::Owner,
    });
    let mut target = RuleSet::new();
    let e = target.apply_all(broken).unwrap_err();
    assert_eq!(e.index, 3);
    assert_eq!(target, RuleSet::new());
    // A row whose rule does not compile is refused when read back.
    let bad = text.replace("\"doors\":[\"push\"]", "\"doors\":[]");
    assert!(serde_json::from_str::<Vec<Row>>(&bad).is_err());
}
