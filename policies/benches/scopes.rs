//! `scopes propose` over a history of 100,000 decided acts (target: under
//! 1 s). Figures in docs/benchmarks.md.

use std::collections::BTreeSet;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use policies::gate::{Destination, Destinations, Readers};
use policies::scopes::{self, Outcome, Record};
use policies::{Label, Timestamp};

/// 100,000 acts over 5 repositories, 2 remotes and a message endpoint: pushes
/// to 40 agent branches in two namespaces, to feature branches and to main,
/// mostly approved, some rejected, expired, stale, pending, and dry runs.
pub fn history(n: usize) -> Vec<Record> {
    let outcomes = [
        Outcome::Approved,
        Outcome::Approved,
        Outcome::Approved,
        Outcome::DryAsked,
        Outcome::Pending,
        Outcome::Rejected,
        Outcome::Expired,
        Outcome::Stale,
    ];
    (0..n)
        .map(|i| {
            let repo = format!("/repos/r{}", i % 5);
            let dest = if i % 7 == 0 { "mirror" } else { "origin" };
            let r = match i % 10 {
                0 => "refs/heads/main".to_owned(),
                1 => format!("refs/heads/feature/f{}", i % 13),
                2..=5 => format!("refs/heads/agent/t{}", i % 20),
                _ => format!("refs/heads/bot/b{}", i % 20),
            };
            // A person rejects only in the feature namespace and on main.
            let outcome = match i % 10 {
                0 | 1 => outcomes[i % outcomes.len()],
                _ => outcomes[(i / 10) % 5],
            };
            let run = format!("run{}", i / 3);
            Record {
                id: format!("a{i}"),
                actor: format!("run-{run}"),
                run,
                at: i as i64,
                door: "push".into(),
                repository: repo.clone(),
                destination: dest.into(),
                args: serde_json::json!({
                    "remote": dest, "ref": r, "commit": format!("{i:040x}"),
                    "force": false, "delete": false, "repository": repo,
                }),
                label: Label::TOP,
                outcome,
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rules = policies::rulefile::rule_set_from_files([(
        Path::new("default.toml"),
        policies::DEFAULT_RULES,
    )])
    .unwrap();
    let dest = Destinations::from([
        (
            "origin".to_owned(),
            Destination {
                readers: Readers::Private,
            },
        ),
        (
            "mirror".to_owned(),
            Destination {
                readers: Readers::Private,
            },
        ),
    ]);
    let records = history(100_000);
    let refused = BTreeSet::new();
    let input = scopes::Input {
        rules: &rules,
        records: &records,
        evidence: &records,
        destinations: &dest,
        refused: &refused,
        clock: Timestamp(1_800_000_000),
    };
    let out = scopes::propose(input);
    eprintln!(
        "{} proposals, {} declined, over {} acts",
        out.proposals.len(),
        out.declined.len(),
        records.len()
    );
    let mut g = c.benchmark_group("scopes");
    g.sample_size(10);
    g.bench_function("propose_100k_decided_acts", |b| {
        b.iter(|| scopes::propose(input))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
