//! A scripted morning, measured (docs/benchmarks.md, `scripts/bench-morning.sh`):
//! a night of 20 runs and 30 push acts (each run 20 commits, one of them
//! with a 20 KB subject), then an owner in a real Chromium: Morning, Queue,
//! every Run page, and every act approved through "Approve every act that
//! carries COMMIT". It prints the pages visited, the clicks, the seconds
//! from login to the last act carried out, and each page's height. Run with
//! `NIGHTSHIFT_BENCH_BIN` naming another build to measure a baseline with
//! the same script. Ignored by default: it measures, it does not test.

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use tests::browser::{add_accounts, Driver, Serve, OWNER, OWNER_PASSWORD};
use tests::morning::Morning;

async fn height(c: &Client) -> u64 {
    c.execute("return document.documentElement.scrollHeight;", vec![])
        .await
        .unwrap()
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: scripts/bench-morning.sh"]
async fn a_scripted_morning_of_20_runs_and_30_acts() {
    let m = Morning::new();
    let commits = "for i in $(seq 1 19); do echo $i >> f && git add f && git commit -qm \"step $i of the task\" -m 'why: a body line'; done; \
                   git commit -q --allow-empty -m \"$(head -c 20000 /dev/zero | tr '\\0' s)\"; ";
    let mut runs = Vec::new();
    for i in 0..20 {
        let pushes = if i < 10 {
            format!("git push -q origin HEAD:refs/heads/agent/r{i}a; git push -q origin HEAD:refs/heads/agent/r{i}b; true")
        } else {
            format!("git push -q origin HEAD:refs/heads/agent/r{i}; true")
        };
        runs.push(m.run_agent_with_task(&format!("{commits}{pushes}"), Some(&format!("task {i}"))));
    }
    let queued = m.queue().len();
    assert_eq!(queued, 30, "the night queued {queued} acts");

    add_accounts(&m.state);
    let serve = Serve::start(&m.state, &["--owner-key-file", m.key.to_str().unwrap()]);
    let driver = Driver::start();
    let c = driver.browser().await;
    let started = Instant::now();
    let (mut pages, mut clicks) = (0u32, 0u32);
    c.goto(&serve.url("/login")).await.unwrap();
    pages += 1;
    c.find(Locator::Id("name"))
        .await
        .unwrap()
        .send_keys(OWNER)
        .await
        .unwrap();
    c.find(Locator::Id("password"))
        .await
        .unwrap()
        .send_keys(OWNER_PASSWORD)
        .await
        .unwrap();
    c.find(Locator::Id("login-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    clicks += 1;
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("section#runs"))
        .await
        .unwrap();
    pages += 1;
    let morning_h = height(&c).await;

    let mut run_h = Vec::new();
    for r in &runs {
        c.goto(&serve.url(&format!("/runs/{r}"))).await.unwrap();
        pages += 1;
        run_h.push(height(&c).await);
    }

    c.goto(&serve.url("/queue")).await.unwrap();
    pages += 1;
    let queue_h = height(&c).await;
    let commits: Vec<String> = c
        .execute("return [...new Set([...document.querySelectorAll('button.approve-commit')].map(b => b.dataset.commit))];", vec![])
        .await
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    for commit in &commits {
        // Today's page lists the acts behind a toggle first (the
        // confirmation step); the baseline's button is clicked at once.
        let toggle = format!("details.by-commit[data-commit=\"{commit}\"] summary");
        if let Ok(s) = c.find(Locator::Css(&toggle)).await {
            s.click().await.unwrap();
            clicks += 1;
        }
        c.find(Locator::Css(&format!(
            "button.approve-commit[data-commit=\"{commit}\"]"
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
        clicks += 1;
    }
    loop {
        let refs = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&m.bare)
            .args(["for-each-ref", "refs/heads/agent/"])
            .output()
            .unwrap();
        let done = String::from_utf8_lossy(&refs.stdout).lines().count();
        if done == 30 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{done} of 30 acts done"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    run_h.sort_unstable();
    println!(
        "MORNING pages={pages} clicks={clicks} seconds={seconds:.1} morning_px={morning_h} queue_px={queue_h} run_px_median={} run_px_max={} decisions={}",
        run_h[run_h.len() / 2],
        run_h[run_h.len() - 1],
        commits.len()
    );
    c.close().await.unwrap();
}
