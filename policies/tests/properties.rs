//! The precedence law, by property tests over generated rule sets and
//! requests, and a differential test against a deliberately naive
//! reference evaluator.

use std::collections::BTreeSet;

use policies::evaluate::{applies, Applies};
use policies::{
    evaluate, evaluate_rules, Author, ClauseSpec, Decider, Decision, Effect, Generation, Request,
    Row, Rule, RuleSet, RuleSpec, Timestamp,
};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const ACTORS: [&str; 3] = ["a1", "a2", "b1"];
const SUBJECTS: [&str; 5] = ["*", "a1", "a2", "a*", "b1"];
const DOORS: [&str; 4] = ["push", "pr", "github_issue", "bash"];
const DOOR_GLOBS: [&str; 7] = ["push", "pr", "github_*", "*", "bash", "p*", "*_issue"];
const SCOPES: [&str; 3] = ["/w", "/w/a", "/x"];
const FIELDS: [&str; 2] = ["cmd", "ref"];
const VALUES: [&str; 5] = ["main", "agent/x", "rm -rf /", "", "x"];
const PATTERNS: [&str; 5] = ["main", "^agent/", "rm", "x|y", "^$"];
const TIMES: [i64; 3] = [100, 200, 300];

fn effect() -> impl Strategy<Value = Effect> {
    prop_oneof![Just(Effect::Allow), Just(Effect::Ask), Just(Effect::Refuse)]
}

fn clause() -> impl Strategy<Value = ClauseSpec> {
    (0..FIELDS.len(), 0..PATTERNS.len(), any::<bool>()).prop_map(|(f, p, neg)| ClauseSpec {
        field: FIELDS[f].into(),
        matches: (!neg).then(|| PATTERNS[p].into()),
        not_matches: neg.then(|| PATTERNS[p].into()),
    })
}

fn window() -> impl Strategy<Value = (Option<Timestamp>, Option<Timestamp>)> {
    prop_oneof![
        3 => Just((None, None)),
        1 => (0..2usize).prop_map(|i| (Some(Timestamp(TIMES[i] + 50)), None)),
        1 => (0..2usize).prop_map(|i| (None, Some(Timestamp(TIMES[i] + 50)))),
    ]
}

/// A rule shape; ids are given by position so a set never repeats one.
fn shape() -> impl Strategy<Value = RuleSpec> {
    (
        0..SUBJECTS.len(),
        prop::option::weighted(0.3, 0..SCOPES.len()),
        prop::collection::btree_set(0..DOOR_GLOBS.len(), 1..3),
        effect(),
        prop::collection::vec(clause(), 0..3),
        window(),
    )
        .prop_map(
            |(s, scope, doors, effect, clauses, (since, until))| RuleSpec {
                id: String::new(),
                subject: SUBJECTS[s].into(),
                scope: scope.map(|i| SCOPES[i].into()),
                doors: doors.into_iter().map(|d| DOOR_GLOBS[d].into()).collect(),
                tools: Vec::new(),
                effect,
                reason: format!("{effect} because"),
                authority: "test".into(),
                locked: false,
                since,
                until,
                clauses,
            },
        )
}

fn rules(max: usize) -> impl Strategy<Value = Vec<Rule>> {
    prop::collection::vec(shape(), 0..max).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                s.id = format!("r{i}");
                Rule::compile(s).expect("generated rules are valid")
            })
            .collect()
    })
}

fn request() -> impl Strategy<Value = Request> {
    (
        prop::option::of(0..ACTORS.len()),
        0..DOORS.len(),
        prop::collection::btree_map(0..FIELDS.len(), 0..VALUES.len(), 0..3),
        prop::option::of(prop_oneof![
            Just("/w"),
            Just("/w/a/b"),
            Just("/x"),
            Just("/wx")
        ]),
    )
        .prop_map(|(actor, door, fields, scope)| {
            let args: Map<String, Value> = fields
                .into_iter()
                .map(|(f, v)| (FIELDS[f].to_owned(), json!(VALUES[v])))
                .collect();
            Request {
                actor: actor.map(|a| ACTORS[a].to_owned()),
                door: DOORS[door].into(),
                args: Value::Object(args),
                scope: scope.map(str::to_owned),
            }
        })
}

fn clock() -> impl Strategy<Value = Timestamp> {
    (0..TIMES.len()).prop_map(|i| Timestamp(TIMES[i]))
}

fn set_of(rules: &[Rule]) -> RuleSet {
    RuleSet::from_rows(rules.iter().cloned().map(|rule| Row::Declare {
        rule,
        author: Author::Shipped,
    }))
    .expect("distinct ids apply")
}

fn decide(rules: &[Rule], req: &Request, now: Timestamp) -> Decision {
    evaluate_rules(rules, None, Generation::EMPTY, req, now)
}

/// The naive reference: written from the issue text, sharing nothing with
/// the engine but the rule's accessors and the `regex` crate.
mod naive {
    use super::*;

    fn glob(g: &[u8], t: &[u8]) -> bool {
        match g.split_first() {
            None => t.is_empty(),
            Some((b'*', rest)) => (0..=t.len()).any(|i| glob(rest, &t[i..])),
            Some((c, rest)) => t.first() == Some(c) && glob(rest, &t[1..]),
        }
    }

    pub enum Fit {
        No,
        Yes,
        Aside,
    }

    pub fn fit(rule: &Rule, req: &Request, now: Timestamp) -> Fit {
        let spec = rule.spec();
        if spec.since.is_some_and(|s| now < s) || spec.until.is_some_and(|u| now >= u) {
            return Fit::No;
        }
        if !spec
            .doors
            .iter()
            .any(|d| glob(d.as_bytes(), req.door.as_bytes()))
        {
            return Fit::No;
        }
        for c in &spec.clauses {
            let text = match req.args.get(&c.field) {
                None => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(v) => Some(v.to_string()),
            };
            let hit = |p: &String| {
                let re = regex::Regex::new(p).unwrap();
                text.as_ref().is_some_and(|t| re.is_match(t))
            };
            let ok = match (&c.matches, &c.not_matches) {
                (Some(p), None) => hit(p),
                (None, Some(p)) => !hit(p),
                _ => unreachable!(),
            };
            if !ok {
                return Fit::No;
            }
        }
        let mut aside = false;
        if let Some(prefix) = &spec.scope {
            match &req.scope {
                None => aside = true,
                Some(s) => {
                    if !(s == prefix || s.starts_with(&format!("{prefix}/"))) {
                        return Fit::No;
                    }
                }
            }
        }
        if spec.subject != "*" {
            match &req.actor {
                None => aside = true,
                Some(a) => {
                    if !glob(spec.subject.as_bytes(), a.as_bytes()) {
                        return Fit::No;
                    }
                }
            }
        }
        if aside {
            Fit::Aside
        } else {
            Fit::Yes
        }
    }

    /// (verdict, ids that could be named, ids that stood aside)
    pub fn decide(
        rules: &[Rule],
        req: &Request,
        now: Timestamp,
    ) -> (Effect, BTreeSet<String>, BTreeSet<String>) {
        let mut claims: Vec<(Effect, String)> = Vec::new();
        let mut aside = BTreeSet::new();
        for r in rules {
            match fit(r, req, now) {
                Fit::No => {}
                Fit::Yes => claims.push((r.effect(), r.id().0.clone())),
                Fit::Aside => {
                    aside.insert(r.id().0.clone());
                    if r.effect() == Effect::Refuse {
                        claims.push((Effect::Ask, r.id().0.clone()));
                    }
                }
            }
        }
        let verdict = claims.iter().map(|c| c.0).max().unwrap_or(Effect::Allow);
        let named = claims
            .into_iter()
            .filter(|c| c.0 == verdict)
            .map(|c| c.1)
            .collect();
        (verdict, named, aside)
    }
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(512)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn differential_against_naive_reference(rs in rules(12), req in request(), now in clock()) {
        let d = decide(&rs, &req, now);
        let (verdict, named, aside) = naive::decide(&rs, &req, now);
        prop_assert_eq!(d.verdict, verdict);
        let got_aside: BTreeSet<String> = d.stood_aside.iter().map(|s| s.rule.0.clone()).collect();
        prop_assert_eq!(got_aside, aside);
        match &d.rule {
            Decider::NoRule => prop_assert!(named.is_empty()),
            Decider::Rule(id) => prop_assert!(named.contains(&id.0), "named {} not in {:?}", id, named),
            Decider::Freeze => prop_assert!(false, "no freeze here"),
        }
        // The RuleSet path gives the same verdict.
        prop_assert_eq!(evaluate(&set_of(&rs), &req, now).verdict, verdict);
    }

    #[test]
    fn refuse_beats_everything(rs in rules(10), req in request(), now in clock(), at in any::<prop::sample::Index>()) {
        let mut rs = rs;
        let wall = Rule::compile(RuleSpec {
            id: "wall".into(), subject: "*".into(), scope: None, doors: vec!["*".into()], tools: Vec::new(),
            effect: Effect::Refuse, reason: "no".into(), authority: "t".into(), locked: false,
            since: None, until: None, clauses: vec![],
        }).unwrap();
        let i = at.index(rs.len() + 1);
        rs.insert(i, wall);
        let d = decide(&rs, &req, now);
        prop_assert_eq!(d.verdict, Effect::Refuse);
        prop_assert!(matches!(d.rule, Decider::Rule(_)));
    }

    #[test]
    fn decision_never_ranks_below_a_matching_rule(rs in rules(12), req in request(), now in clock()) {
        let d = decide(&rs, &req, now);
        for r in rs.iter().filter(|r| r.in_force(now)) {
            match applies(r, &req) {
                Applies::Yes(_) => prop_assert!(d.verdict >= r.effect(), "{} {:?}", r.id(), d),
                Applies::StandsAside(..) if r.effect() == Effect::Refuse => {
                    prop_assert!(d.verdict >= Effect::Ask)
                }
                _ => {}
            }
        }
        if d.verdict != Effect::Allow {
            prop_assert!(matches!(d.rule, Decider::Rule(_)));
        }
    }

    #[test]
    fn order_and_duplicates_do_not_change_the_decision(
        rs in rules(10).prop_flat_map(|rs| {
            let n = rs.len();
            (Just(rs.clone()).prop_shuffle(), Just(rs), prop::collection::vec(0..n.max(1), 0..5))
        }),
        req in request(),
        now in clock(),
    ) {
        let (shuffled, original, dups) = rs;
        let mut with_dups = shuffled.clone();
        for i in dups {
            if let Some(r) = original.get(i) {
                with_dups.push(r.clone());
            }
        }
        let d = decide(&original, &req, now);
        prop_assert_eq!(&decide(&shuffled, &req, now), &d);
        prop_assert_eq!(&decide(&with_dups, &req, now), &d);
    }

    #[test]
    fn a_tier1_rule_never_loosens_any_decision(
        rs in rules(10),
        extra in shape(),
        strict in any::<bool>(),
        agent in 0..ACTORS.len(),
        reqs in prop::collection::vec(request(), 1..8),
        now in clock(),
    ) {
        let before = set_of(&rs);
        let mut after = before.clone();
        let mut spec = extra;
        spec.id = "tier1".into();
        spec.subject = ACTORS[agent].into();
        spec.effect = if strict { Effect::Refuse } else { Effect::Ask };
        let rule = Rule::compile(spec).unwrap();
        after.apply(Row::Declare { rule, author: Author::Agent(ACTORS[agent].into()) }).unwrap();
        for req in &reqs {
            let (b, a) = (evaluate(&before, req, now), evaluate(&after, req, now));
            prop_assert!(a.verdict >= b.verdict, "{:?} -> {:?}", b, a);
            prop_assert_ne!(a.generation, b.generation);
        }
    }

    #[test]
    fn an_agent_cannot_declare_what_loosens(rs in rules(6), extra in shape(), agent in 0..ACTORS.len()) {
        let mut set = set_of(&rs);
        let mut spec = extra;
        spec.id = "attempt".into();
        let actor = ACTORS[agent];
        let tier1 = spec.effect != Effect::Allow && spec.subject == actor && !spec.locked;
        let rule = Rule::compile(spec).unwrap();
        let before = set.clone();
        let res = set.apply(Row::Declare { rule, author: Author::Agent(actor.into()) });
        prop_assert_eq!(res.is_ok(), tier1);
        if let Err(e) = res {
            prop_assert!(e.to_string().contains("nightshift policy propose"));
            prop_assert_eq!(set, before);
        }
    }

    #[test]
    fn freeze_refuses_every_request(
        rs in rules(8), own in shape(), reqs in prop::collection::vec(request(), 1..8), now in clock(),
    ) {
        let mut set = set_of(&rs);
        let mut spec = own;
        spec.id = "mine".into();
        spec.subject = "a1".into();
        spec.effect = Effect::Ask;
        set.apply(Row::Declare { rule: Rule::compile(spec).unwrap(), author: Author::Agent("a1".into()) }).unwrap();
        set.apply(Row::Freeze { authority: "owner".into(), reason: "incident".into(), at: None }).unwrap();
        prop_assert_eq!(set.suspended(), vec![policies::RuleId("mine".into())]);
        prop_assert!(set.active(now).all(|r| r.id().0 != "mine"));
        for req in &reqs {
            let d = evaluate(&set, req, now);
            prop_assert_eq!(d.verdict, Effect::Refuse);
            prop_assert_eq!(&d.rule, &Decider::Freeze);
            prop_assert!(d.reason.contains("incident"));
        }
        set.apply(Row::Thaw { authority: "owner".into() }).unwrap();
        prop_assert!(set.suspended().is_empty());
        prop_assert!(set.active(now).any(|r| r.id().0 == "mine") || !set.entries()[&policies::RuleId("mine".into())].rule.in_force(now));
    }

    #[test]
    fn standing_aside_is_counted_and_a_refuse_escalates_to_ask(
        rs in rules(10), req in request(), now in clock(), refuse_subject in 1..SUBJECTS.len(),
    ) {
        // The same request without its actor: every rule naming an actor
        // that would otherwise fit must stand aside, and a refuse must ask.
        let mut anon = req.clone();
        anon.actor = None;
        let mut rs = rs;
        let probe = Rule::compile(RuleSpec {
            id: "probe".into(), subject: SUBJECTS[refuse_subject].into(), scope: None,
            doors: vec![req.door.clone()], effect: Effect::Refuse, reason: "named actors only".into(),
            tools: Vec::new(),
            authority: "t".into(), locked: false, since: None, until: None, clauses: vec![],
        }).unwrap();
        rs.push(probe);
        let d = decide(&rs, &anon, now);
        let ids: Vec<&str> = d.stood_aside.iter().map(|s| s.rule.0.as_str()).collect();
        prop_assert!(ids.contains(&"probe"), "{:?}", d);
        prop_assert!(d.verdict >= Effect::Ask);
        for r in rs.iter().filter(|r| r.in_force(now) && r.subject() != "*") {
            if let Applies::StandsAside(missing, _) = applies(r, &anon) {
                prop_assert!(missing.contains(&policies::Missing::Actor));
                prop_assert!(ids.contains(&r.id().0.as_str()));
            }
        }
        if d.verdict == Effect::Ask && d.escalated {
            prop_assert!(d.reason.contains("a person decides"));
        }
    }
}

#[test]
fn no_rule_is_allow_and_says_so() {
    let d = decide(&[], &Request::new("push", json!({})), Timestamp(0));
    assert_eq!(d.verdict, Effect::Allow);
    assert_eq!(d.rule, Decider::NoRule);
    assert!(d.stood_aside.is_empty());
}

#[test]
fn specificity_only_chooses_the_name() {
    let mk = |id: &str, subject: &str, doors: &str, effect: Effect, clauses: usize| {
        Rule::compile(RuleSpec {
            id: id.into(),
            subject: subject.into(),
            scope: None,
            doors: vec![doors.into()],
            tools: Vec::new(),
            effect,
            reason: id.into(),
            authority: "t".into(),
            locked: false,
            since: None,
            until: None,
            clauses: (0..clauses)
                .map(|_| ClauseSpec {
                    field: "ref".into(),
                    matches: Some("main".into()),
                    not_matches: None,
                })
                .collect(),
        })
        .unwrap()
    };
    let req = Request {
        actor: Some("a1".into()),
        ..Request::new("push", json!({"ref": "main"}))
    };
    let wide_ask = mk("wide", "*", "*", Effect::Ask, 0);
    let narrow_allow = mk("narrow-allow", "a1", "push", Effect::Allow, 1);
    let narrow_ask = mk("narrow-ask", "a1", "push", Effect::Ask, 1);
    // A narrow allow does not punch a hole in a wide ask.
    let d = decide(&[wide_ask.clone(), narrow_allow], &req, Timestamp(0));
    assert_eq!(
        (d.verdict, d.rule.to_string()),
        (Effect::Ask, "wide".into())
    );
    // Among asks, the most specific is named.
    let d = decide(&[wide_ask, narrow_ask], &req, Timestamp(0));
    assert_eq!(d.rule.to_string(), "narrow-ask");
}

#[test]
fn since_and_until_follow_the_injected_clock() {
    let mut spec = RuleSpec {
        id: "window".into(),
        subject: "*".into(),
        scope: None,
        doors: vec!["push".into()],
        tools: Vec::new(),
        effect: Effect::Refuse,
        reason: "maintenance".into(),
        authority: "t".into(),
        locked: false,
        since: Some(Timestamp(100)),
        until: Some(Timestamp(200)),
        clauses: vec![],
    };
    let r = Rule::compile(spec.clone()).unwrap();
    let req = Request::new("push", json!({}));
    let at = |t| decide(std::slice::from_ref(&r), &req, Timestamp(t)).verdict;
    assert_eq!(
        (at(99), at(100), at(199), at(200)),
        (Effect::Allow, Effect::Refuse, Effect::Refuse, Effect::Allow)
    );
    spec.until = None;
    let open = Rule::compile(spec).unwrap();
    assert_eq!(
        decide(&[open], &req, Timestamp(i64::MAX)).verdict,
        Effect::Refuse
    );
}

#[test]
fn scope_is_matched_by_whole_components_after_normalising() {
    let r = Rule::compile(RuleSpec {
        id: "etc".into(),
        subject: "*".into(),
        scope: Some("/etc".into()),
        doors: vec!["*".into()],
        tools: Vec::new(),
        effect: Effect::Refuse,
        reason: "not there".into(),
        authority: "t".into(),
        locked: false,
        since: None,
        until: None,
        clauses: vec![],
    })
    .unwrap();
    let at = |scope: &str| {
        let req = Request {
            scope: Some(scope.into()),
            ..Request::new("write", json!({}))
        };
        decide(std::slice::from_ref(&r), &req, Timestamp(0)).verdict
    };
    assert_eq!(at("/etc/passwd"), Effect::Refuse);
    assert_eq!(at("/w/../etc/passwd"), Effect::Refuse);
    assert_eq!(at("/etcetera"), Effect::Allow);
    assert_eq!(at("/w/etc"), Effect::Allow);
}
