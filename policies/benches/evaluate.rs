//! Policy evaluation speed: ours with 1,000 rules beside cedar-policy with
//! 1,000 roughly equivalent policies, and patterns that are catastrophic
//! for backtracking engines, on 1 MiB of input.

use std::hint::black_box;
use std::str::FromStr;

use criterion::{criterion_group, criterion_main, Criterion};
use policies::pattern::Pattern;
use policies::{
    evaluate, Author, ClauseSpec, Effect, Request, Row, Rule, RuleSet, RuleSpec, Timestamp,
};
use serde_json::json;

const RULES: usize = 1_000;
const NOW: Timestamp = Timestamp(1_800_000_000);

struct Shape {
    door: Option<String>, // None: the github_* glob
    subject: Option<String>,
    effect: Effect,
    prefix: String,
    not_staging: bool,
}

fn shapes() -> Vec<Shape> {
    (0..RULES)
        .map(|i| Shape {
            door: (i % 10 != 0).then(|| format!("tool_{}", i % 50)),
            subject: (i % 3 == 0).then(|| format!("agent-{}", i % 10)),
            effect: if i % 20 == 0 {
                Effect::Refuse
            } else if i % 4 == 0 {
                Effect::Ask
            } else {
                Effect::Allow
            },
            prefix: format!("deploy-{i}"),
            not_staging: i % 5 == 0,
        })
        .collect()
}

/// (actor, door, target)
fn cases() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        ("agent-3", "tool_7", "deploy-707"),
        ("agent-0", "github_push", "deploy-10-staging"),
        ("agent-5", "tool_13", "deploy-999"),
        ("agent-9", "unknown", "prod"),
        ("agent-1", "tool_1", "deploy-1"),
        ("agent-2", "github_pr", "deploy-20"),
        ("agent-7", "tool_49", "deploy-449"),
        ("agent-4", "tool_20", "staging"),
    ]
}

fn our_rules() -> RuleSet {
    let rows = shapes().into_iter().enumerate().map(|(i, s)| {
        let mut clauses = vec![ClauseSpec {
            field: "target".into(),
            matches: Some(format!("^{}", s.prefix)),
            not_matches: None,
        }];
        if s.not_staging {
            clauses.push(ClauseSpec {
                field: "target".into(),
                matches: None,
                not_matches: Some("staging".into()),
            });
        }
        let rule = Rule::compile(RuleSpec {
            id: format!("r{i}"),
            subject: s.subject.unwrap_or_else(|| "*".into()),
            scope: None,
            doors: vec![s.door.unwrap_or_else(|| "github_*".into())],
            tools: Vec::new(),
            effect: s.effect,
            reason: format!("rule {i}"),
            authority: "bench".into(),
            locked: false,
            since: None,
            until: None,
            clauses,
        })
        .expect("bench rules are valid");
        Row::Declare {
            rule,
            author: Author::Shipped,
        }
    });
    RuleSet::from_rows(rows).expect("bench rules apply")
}

fn cedar_policies() -> cedar_policy::PolicySet {
    let mut text = String::new();
    for (i, s) in shapes().into_iter().enumerate() {
        let head = if s.effect == Effect::Allow {
            "permit"
        } else {
            "forbid"
        };
        let principal = match &s.subject {
            Some(a) => format!("principal == Agent::\"{a}\""),
            None => "principal".into(),
        };
        let action = match &s.door {
            Some(d) => format!("action == Action::\"{d}\""),
            None => "action".into(),
        };
        let mut cond = format!("resource.target like \"{}*\"", s.prefix);
        if s.not_staging {
            cond.push_str(" && !(resource.target like \"*staging*\")");
        }
        if s.door.is_none() {
            cond.push_str(" && context.door like \"github_*\"");
        }
        text.push_str(&format!(
            "@id(\"r{i}\")\n{head}({principal}, {action}, resource) when {{ {cond} }};\n"
        ));
    }
    cedar_policy::PolicySet::from_str(&text).expect("bench policies parse")
}

fn bench_evaluate(c: &mut Criterion) {
    let set = our_rules();
    let ours: Vec<Request> = cases()
        .into_iter()
        .map(|(actor, door, target)| Request {
            actor: Some(actor.into()),
            door: door.into(),
            args: json!({ "target": target }),
            scope: None,
        })
        .collect();

    let policies = cedar_policies();
    let entities = cedar_policy::Entities::from_json_value(
        json!(cases()
            .iter()
            .enumerate()
            .map(|(i, (_, _, target))| json!({
                "uid": { "type": "Target", "id": format!("t{i}") },
                "attrs": { "target": target },
                "parents": []
            }))
            .collect::<Vec<_>>()),
        None,
    )
    .expect("bench entities");
    let theirs: Vec<cedar_policy::Request> = cases()
        .into_iter()
        .enumerate()
        .map(|(i, (actor, door, _))| {
            let uid = |t: &str, id: &str| {
                cedar_policy::EntityUid::from_str(&format!("{t}::\"{id}\"")).expect("bench uid")
            };
            cedar_policy::Request::new(
                uid("Agent", actor),
                uid("Action", door),
                uid("Target", &format!("t{i}")),
                cedar_policy::Context::from_json_value(json!({ "door": door }), None)
                    .expect("bench context"),
                None,
            )
            .expect("bench request")
        })
        .collect();
    let authorizer = cedar_policy::Authorizer::new();

    let mut g = c.benchmark_group("policy_evaluation");
    let mut i = 0usize;
    g.bench_function("ours_1000_rules", |b| {
        b.iter(|| {
            i = (i + 1) % ours.len();
            black_box(evaluate(&set, black_box(&ours[i]), NOW))
        })
    });
    let mut j = 0usize;
    g.bench_function("cedar_1000_policies", |b| {
        b.iter(|| {
            j = (j + 1) % theirs.len();
            black_box(authorizer.is_authorized(black_box(&theirs[j]), &policies, &entities))
        })
    });
    g.finish();
}

fn bench_catastrophic(c: &mut Criterion) {
    let input = "a".repeat(1 << 20);
    let mut g = c.benchmark_group("catastrophic_pattern_1MiB");
    g.sample_size(20);
    for (name, pattern) in [("nested_star", "(a*)*b"), ("alternation", "(a|aa)*c")] {
        let set = RuleSet::from_rows([Row::Declare {
            rule: Rule::compile(RuleSpec {
                id: "cat".into(),
                subject: "*".into(),
                scope: None,
                doors: vec!["Bash".into()],
                tools: Vec::new(),
                effect: Effect::Refuse,
                reason: "bench".into(),
                authority: "bench".into(),
                locked: false,
                since: None,
                until: None,
                clauses: vec![ClauseSpec {
                    field: "command".into(),
                    matches: Some(pattern.into()),
                    not_matches: None,
                }],
            })
            .expect("bench rule"),
            author: Author::Shipped,
        }])
        .expect("bench set");
        // The whole decision includes digesting the 1 MiB request.
        let req = Request::new("Bash", json!({ "command": input }));
        g.bench_function(format!("{name}_decision"), |b| {
            b.iter(|| black_box(evaluate(&set, black_box(&req), NOW)))
        });
        let compiled = Pattern::new(pattern).expect("bench pattern");
        g.bench_function(format!("{name}_match_only"), |b| {
            b.iter(|| black_box(compiled.is_match(black_box(&input))))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_evaluate, bench_catastrophic);
criterion_main!(benches);
