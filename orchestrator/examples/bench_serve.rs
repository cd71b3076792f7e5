//! Server time of the dashboard's two heaviest pages: Queue with 10,000
//! pending acts (one page of 50) and Morning over 1,000 runs (its first
//! load walks the whole audit chain, later ones only the entries appended
//! since), from the state to the rendered HTML; and the whole-chain walk
//! that `serve` runs in the background. Run:
//! `cargo run --release -p orchestrator --example bench_serve` (figures in
//! docs/benchmarks.md); with `NIGHTSHIFT_STORE=postgres://…` (an empty
//! database) the state is made and read in PostgreSQL instead of SQLite,
//! through the same port. Not a test: it asserts nothing and prints timings.

use std::process::Command;
use std::time::Instant;

use deferred_queue::{Act, Content, Door, Routing, Target};
use orchestrator::audit_log::Event;
use orchestrator::serve::backend::{self, Backend};
use orchestrator::serve::chain;
use orchestrator::serve::guard::Role;
use orchestrator::serve::pages::{self, Viewer};
use orchestrator::state_store::{ActQueue, RunStore, StoreUrl, Stores};
use orchestrator::store::{now_rfc3339, RunRecord};

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=b", "-c", "user.email=b@localhost"])
        .args(args)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let acts: usize = std::env::var("ACTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README.md"), "base\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "base"]);
    let base = git(&repo, &["rev-parse", "HEAD"]);
    // 20 result commits, shared by the runs (acts of one content share a diff).
    let mut commits = Vec::new();
    for i in 0..20 {
        git(&repo, &["checkout", "-q", "--detach", &base]);
        std::fs::write(repo.join(format!("f{i}.txt")), format!("{i}\n")).unwrap();
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-qm", &format!("change {i}")]);
        commits.push(git(&repo, &["rev-parse", "HEAD"]));
    }
    let root = dir.path().join("state");
    std::fs::create_dir(&root).unwrap();
    let stores: Stores = match std::env::var("NIGHTSHIFT_STORE").ok().as_deref() {
        None | Some("") => std::sync::Arc::new(orchestrator::store::SqliteBackend::new(root, None)),
        Some(text) => match StoreUrl::parse(text).unwrap() {
            StoreUrl::Sqlite(d) => {
                std::sync::Arc::new(orchestrator::store::SqliteBackend::new(root, d))
            }
            StoreUrl::Postgres(url) => {
                std::sync::Arc::new(orchestrator::store_postgres::PgBackend::new(&url, root))
            }
        },
    };
    eprintln!("store: {}", stores.location());
    let mut store = stores.connect().unwrap();
    let t = Instant::now();
    for i in 0..runs {
        store
            .put_run(&RunRecord {
                id: format!("01bench{i:06}"),
                created_at: now_rfc3339(),
                repo: repo.display().to_string(),
                base_ref: "main".into(),
                base_commit: Some(base.clone()),
                image: "nightshift-sandbox:bench".into(),
                status: "exited 0".into(),
                exit_code: Some(0),
                result_commit: Some(commits[i % commits.len()].clone()),
                files_changed: Some(1),
                insertions: Some(1),
                deletions: Some(0),
                ..Default::default()
            })
            .unwrap();
    }
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    for i in 0..acts {
        let run = format!("01bench{:06}", i % runs);
        let act = Act {
            id: format!("a{i:08}"),
            run: run.clone(),
            actor: "agent".into(),
            door: Door::Push,
            routing: Routing {
                destination: "origin".into(),
                target: Target::Push {
                    target_ref: format!("refs/heads/agent/{i}"),
                    expected_old: None,
                },
            },
            content: Content::Commit {
                commit: commits[(i % runs) % commits.len()].clone(),
            },
            policy_generation: "g1".into(),
            deciding_rules: vec!["ask-before-push".into()],
            created_at: now,
            expires_at: now + 86_400,
        };
        store
            .put_act(
                &act.id,
                &run,
                &serde_json::to_value(&act).unwrap(),
                &serde_json::json!({"state": "pending"}),
                None,
                &Event::Act {
                    act: act.id.clone(),
                    transition: "pending".into(),
                    fields: serde_json::json!({}),
                },
            )
            .unwrap();
    }
    eprintln!(
        "state: {runs} runs, {acts} pending acts, made in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    drop(store);
    let b = Backend::new(stores, dir.path().join("owner.key")).unwrap();
    let who = Viewer {
        user: "owner".into(),
        role: Role::Owner,
        csrf: "0".repeat(64),
    };
    let time_it = |name: &str, f: &dyn Fn() -> usize| {
        let t = Instant::now();
        let bytes = f();
        let first = t.elapsed().as_secs_f64() * 1e3;
        let samples: Vec<f64> = (0..20)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        println!(
            "{name}: first {first:.1} ms, median of 20 {:.1} ms, {} KiB of HTML",
            median(samples),
            bytes / 1024
        );
    };
    time_it("queue page 1 of 10,000 pending acts", &|| {
        b.with_store(|s| {
            let q = backend::queue(&b, s, 0, orchestrator::serve::PER_PAGE).unwrap();
            let frozen = backend::freeze_state(s).unwrap();
            pages::queue(&who, frozen.as_deref(), &q)
                .into_string()
                .len()
        })
    });
    time_it("queue page 150", &|| {
        b.with_store(|s| {
            let q = backend::queue(&b, s, 150, orchestrator::serve::PER_PAGE).unwrap();
            pages::queue(&who, None, &q).into_string().len()
        })
    });
    time_it(
        "morning over the runs (first load walks the whole chain, later ones the new entries)",
        &|| {
            b.with_store(|s| {
                let m = backend::morning(&b, s, "1970-01-01T00:00:00Z").unwrap();
                pages::morning(&who, &m).into_string().len()
            })
        },
    );
    // A night's worth of new entries since the last load, then one load.
    b.with_store(|s| {
        for i in 0..100 {
            let e = Event::Act {
                act: format!("new{i}"),
                transition: "pending".into(),
                fields: serde_json::json!({}),
            };
            s.append(None, &e, i % 10 == 0).unwrap();
        }
    });
    let t = Instant::now();
    let walked = b.with_store(|s| {
        let m = backend::morning(&b, s, "1970-01-01T00:00:00Z").unwrap();
        pages::morning(&who, &m).into_string();
        m.chain.walked_entries
    });
    println!(
        "morning after 100 new entries: {:.1} ms ({walked} entries walked)",
        t.elapsed().as_secs_f64() * 1e3
    );
    time_it("whole-chain walk (the background's, every period)", &|| {
        b.with_store(|s| {
            let memo = std::sync::Mutex::new(chain::Memo::default());
            chain::check_whole(&memo, s);
            0
        })
    });
}
