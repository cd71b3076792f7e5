//! The scripted morning (issue 12, Benchmarks): 20 finished runs that asked
//! for 30 acts (ten runs push one commit to two branches each, ten push one
//! commit once; two of those change files the host may run), decided in a
//! real headless Chromium against the real `nightshift serve` and the
//! loopback git server: every act from the Queue page, with the page's own
//! controls. Counts page loads (navigations, seen by a marker the page
//! would lose), clicks and fields typed; checks on the way what the owner
//! relies on (a viewer sees no decision control, the risky flags, outcomes
//! shown without a reload) and prints it all. Not a test: it prints figures
//! (docs/benchmarks.md, "Dashboard"). Run: `cargo build -p orchestrator &&
//! cargo run -p tests --example bench_morning`.

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use tests::browser::{add_accounts, Driver, Serve, OWNER, OWNER_PASSWORD, VIEWER, VIEWER_PASSWORD};
use tests::morning::Morning;

/// What the morning cost the owner.
#[derive(Debug, Default)]
struct Counts {
    page_loads: u32,
    clicks: u32,
    typed: u32,
    pages_seen: Vec<String>,
}

/// A browser whose page loads, clicks and typing are counted.
struct Counted<'a> {
    c: &'a Client,
    n: Counts,
}

impl Counted<'_> {
    /// Counts a load when the page's marker is gone (the page was replaced).
    async fn notice_loads(&mut self) {
        let fresh = self
            .c
            .execute(
                "const f = window.__counted !== 1; window.__counted = 1; return f;",
                vec![],
            )
            .await
            .unwrap();
        if fresh == true {
            self.n.page_loads += 1;
            let url = self.c.current_url().await.unwrap();
            self.n.pages_seen.push(url.path().to_string());
        }
    }

    async fn goto(&mut self, url: &str) {
        self.c.goto(url).await.unwrap();
        self.notice_loads().await;
    }

    async fn click(&mut self, css: &str) {
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .click()
            .await
            .unwrap();
        self.n.clicks += 1;
    }

    async fn type_into(&mut self, css: &str, text: &str) {
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap()
            .send_keys(text)
            .await
            .unwrap();
        self.n.typed += 1;
    }
}

async fn js(c: &Client, script: &str) -> serde_json::Value {
    c.execute(script, vec![]).await.unwrap()
}

async fn login(c: &mut Counted<'_>, serve: &Serve, name: &str, password: &str) {
    c.goto(&serve.url("/login")).await;
    c.type_into("#name", name).await;
    c.type_into("#password", password).await;
    c.click("#login-submit").await;
    c.c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("section#runs"))
        .await
        .unwrap();
    c.notice_loads().await;
}

/// The states the Queue page shows, by act.
async fn shown_states(c: &Client) -> serde_json::Value {
    js(
        c,
        "const o = {}; for (const a of document.querySelectorAll('.act')) o[a.dataset.act] = a.querySelector('.state').textContent; return o;",
    )
    .await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let m = Morning::new();
    let made = Instant::now();
    let mut pairs = Vec::new();
    let mut singles = Vec::new();
    for i in 0..20 {
        let script = if i < 10 {
            format!(
                "echo {i} > s{i}.txt && git add -A && git commit -qm 'twice {i}' && \
                 git push -q origin HEAD:refs/heads/agent/t{i}a; git push -q origin HEAD:refs/heads/agent/t{i}b; true"
            )
        } else {
            let risky = match i {
                12 => {
                    "mkdir -p .github/workflows && echo 'on: push' > .github/workflows/ci.yml && "
                }
                15 => "printf 'all:\\n\\ttrue\\n' > Makefile && ",
                _ => "",
            };
            format!(
                "{risky}echo {i} > s{i}.txt && git add -A && git commit -qm 'once {i}' && \
                 git push -q origin HEAD:refs/heads/agent/o{i}; true"
            )
        };
        let run = m.run_agent(&script);
        if i < 10 {
            pairs.push(run);
        } else {
            singles.push(run);
        }
    }
    let queue = m.queue();
    let acts_of = |run: &str| -> Vec<serde_json::Value> {
        queue
            .iter()
            .filter(|a| a["act"]["run"] == run)
            .cloned()
            .collect()
    };
    let shared: Vec<String> = pairs
        .iter()
        .map(|r| {
            acts_of(r)[0]["act"]["content"]["commit"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let single_acts: Vec<String> = singles
        .iter()
        .map(|r| acts_of(r)[0]["act"]["id"].as_str().unwrap().to_string())
        .collect();
    let risky_expected: Vec<String> = [2usize, 5]
        .iter()
        .map(|&i| single_acts[i].clone())
        .collect();
    println!(
        "the night: 20 runs, {} acts queued ({} commits shared by two acts each), made in {:.0} s",
        queue.len(),
        shared.len(),
        made.elapsed().as_secs_f64()
    );

    add_accounts(&m.state);
    let serve = Serve::start(&m.state, &["--owner-key-file", m.key.to_str().unwrap()]);
    let driver = Driver::start();

    // A viewer first: the same Queue page, without any decision control.
    let vc = driver.browser().await;
    let mut viewer = Counted {
        c: &vc,
        n: Counts::default(),
    };
    login(&mut viewer, &serve, VIEWER, VIEWER_PASSWORD).await;
    viewer.goto(&serve.url("/queue")).await;
    let viewer_controls = js(
        &vc,
        "return document.querySelectorAll('form.decide, button.approve, button.reject, button.approve-commit, input.pick, #approve-selected').length;",
    )
    .await;
    let viewer_acts = js(&vc, "return document.querySelectorAll('.act').length;").await;
    vc.close().await.unwrap();

    // The owner's morning.
    let oc = driver.browser().await;
    let mut owner = Counted {
        c: &oc,
        n: Counts::default(),
    };
    let started = Instant::now();
    login(&mut owner, &serve, OWNER, OWNER_PASSWORD).await;
    owner.click("nav a[href=\"/queue\"]").await;
    oc.wait()
        .for_element(Locator::Css("section.run-group"))
        .await
        .unwrap();
    owner.notice_loads().await;
    let on_page = js(&oc, "return document.querySelectorAll('.act').length;").await;
    let with_diff = js(
        &oc,
        "return [...document.querySelectorAll('.act')].filter(a => a.querySelector('ul.files') && a.querySelector('.dest') && a.querySelector('.target') && a.querySelector('.commit')).length;",
    )
    .await;
    let flagged = js(
        &oc,
        "return [...document.querySelectorAll('.act')].filter(a => a.querySelector('.head .risky')).map(a => a.dataset.act);",
    )
    .await;

    // One decision per content: the ten commits pushed twice.
    for c in &shared {
        owner
            .click(&format!("button.approve-commit[data-commit=\"{c}\"]"))
            .await;
    }
    // Six single acts picked and approved at once; four rejected with a reason.
    for a in &single_acts[..6] {
        owner
            .click(&format!(".act[data-act=\"{a}\"] input.pick"))
            .await;
    }
    owner.click("#approve-selected").await;
    for a in &single_acts[6..] {
        owner
            .type_into(
                &format!(".act[data-act=\"{a}\"] input.why"),
                "not tonight: the change is not wanted",
            )
            .await;
        owner
            .click(&format!(".act[data-act=\"{a}\"] button.reject"))
            .await;
    }
    // Wait until the page shows every act decided, without reloading it.
    let waited = Instant::now();
    let shown = loop {
        let s = shown_states(&oc).await;
        let open = s
            .as_object()
            .unwrap()
            .values()
            .filter(|v| *v == "pending")
            .count();
        if open == 0 || waited.elapsed() > Duration::from_secs(180) {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let decided_at = started.elapsed();
    owner.notice_loads().await;
    let n = std::mem::take(&mut owner.n);
    oc.close().await.unwrap();

    let mut by_state = std::collections::BTreeMap::<String, usize>::new();
    for v in shown.as_object().unwrap().values() {
        *by_state
            .entry(v.as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    let stored = m.queue();
    let still_pending = stored
        .iter()
        .filter(|a| a["state"]["state"] == "pending")
        .count();
    let pushed = (0..10)
        .filter(|i| m.remote_ref(&format!("refs/heads/agent/t{i}a")).is_some())
        .count();
    println!(
        "owner: {} page loads ({}), {} clicks, {} fields typed (2 of them the login)",
        n.page_loads,
        n.pages_seen.join(", "),
        n.clicks,
        n.typed
    );
    println!(
        "  after logging in: {} page load(s), {} clicks for 30 acts ({} approve-by-commit, 6 picks + 1 approve-selected, 4 rejects), 4 reasons typed",
        n.page_loads - 2,
        n.clicks - 2,
        shared.len()
    );
    println!(
        "  queue page: {on_page} acts on it, {with_diff} with destination, ref, commit and file list inline"
    );
    println!(
        "  every act decided in {:.1} s from login; states shown on the page without a reload: {by_state:?}",
        decided_at.as_secs_f64()
    );
    println!(
        "  stored: {still_pending} still pending; {pushed} of 10 shared commits on the remote"
    );
    println!("  risky flags: {flagged} (expected {risky_expected:?})");
    println!("viewer: {viewer_acts} acts shown, {viewer_controls} decision controls");
}
