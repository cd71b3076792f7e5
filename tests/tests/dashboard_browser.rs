//! The morning's review in a real headless Chromium (WebDriver, fantoccini)
//! against the real `nightshift serve`, real sandboxes and the loopback git
//! server: log in; see finished runs and their diffs; approve an act and
//! see it carried out without a reload; reject one with a reason; approve
//! every act that carries one commit; pull the kill switch and see the run
//! die; log out. Issue 23's morning: each run's task (on Morning, Run,
//! `show`, `runs --json`, the API); a proposal shown whole with the acts
//! its ratification would decide otherwise, rules with author and
//! authority, an agent's rule listed as suspended under a freeze;
//! approve-by-commit listing its acts before the click and their outcomes
//! after; compact acts (subjects, age, expiry); the night's SVG and a run's
//! memory and CPU; a run its time cap kills and a push the remote refuses;
//! the frozen banner naming who froze. A hostile run's task, commit
//! messages, file names, branch name, output and act body carry script
//! tags, event handlers, `javascript:` links, SVG, CSS and terminal
//! escapes: no script runs (a global the payloads would set stays unset),
//! nothing is fetched from anywhere else, the SVG holds only drawing
//! elements, and the text is shown literally. Screenshots are saved in
//! `target/screenshots/` (`scripts/screenshots.sh` copies them to
//! `docs/screenshots/`). Behind a TLS proxy (`[serve]
//! external_origin`), a browser at the external https origin logs in,
//! holds a `Secure`, `__Host-` session cookie and pulls the kill switch.

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use tests::browser::{
    add_accounts, screenshot_dir, Driver, Serve, TestCert, TlsProxy, OWNER, OWNER_PASSWORD,
};
use tests::morning::Morning;
use tests::{image, stderr, wait_running, WAIT_AT_GATE};

const HOSTILE_SCRIPT: &str = r#"
RLO=$(printf '\342\200\256')
ESC=$(printf '\033')
printf '<script>window.__pwned=3</script> %s[31mred%s[0m %sevil\n' "$ESC" "$ESC" "$RLO"
mkdir -p .github/workflows && echo 'on: push' > .github/workflows/evil.yml
echo x > '<img src=x onerror=window.__pwned=2>.txt'
git add -A
git commit -qm "<script>window.__pwned=1</script> ${ESC}[2J ${RLO}gnp.exe <a href=javascript:window.__pwned=8>x</a>"
git push -q origin 'HEAD:refs/heads/agent/"><svg/onload=window.__pwned=4>'
printf '<script>window.__pwned=5</script><img src=http://evil.example/x.png><a href="javascript:window.__pwned=7">click</a><style>body{display:none}</style><svg onload="window.__pwned=6"></svg>' > m.txt
nightshift-act notify team --file m.txt
true
"#;

/// The hostile run's task (`--task`): the owner's words quoting hostile
/// text, on two lines.
const HOSTILE_TASK: &str = "Fix the bug in <script>window.__pwned=11</script> \u{1b}[2J\u{202e}txt.exe\n<img src=x onerror=window.__pwned=12> and nothing else";

async fn pwned(c: &Client) -> serde_json::Value {
    c.execute(
        "return typeof window.__pwned === 'undefined' ? null : window.__pwned;",
        vec![],
    )
    .await
    .unwrap()
}

/// Every resource the page loaded came from the dashboard itself.
async fn fetched_elsewhere(c: &Client, origin: &str) -> Vec<String> {
    let v = c
        .execute(
            "return performance.getEntriesByType('resource').map(e => e.name);",
            vec![],
        )
        .await
        .unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .filter(|n| !n.starts_with(origin))
        .map(str::to_string)
        .collect()
}

async fn text_of(c: &Client, css: &str) -> String {
    c.execute(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
        vec![serde_json::json!(css)],
    )
    .await
    .unwrap()
    .as_str()
    .unwrap_or_else(|| panic!("nothing matches {css}"))
    .to_string()
}

async fn wait_state(c: &Client, act: &str, want: &str) {
    let css = format!(".act[data-act=\"{act}\"] .state");
    let started = Instant::now();
    loop {
        let now = text_of(c, &css).await;
        if now == want {
            return;
        }
        let line = text_of(c, &format!(".act[data-act=\"{act}\"] .outcome")).await;
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "act {act} is {now}, not {want}: {line}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(screenshot_dir().join(name), png).unwrap();
}

fn acts_of(m: &Morning, run: &str) -> Vec<serde_json::Value> {
    m.queue()
        .into_iter()
        .filter(|a| a["act"]["run"] == run)
        .collect()
}

fn commit_of(a: &serde_json::Value) -> String {
    a["act"]["content"]["commit"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_morning_review_in_a_real_browser() {
    let m = Morning::new();
    std::fs::write(
        m.state.path().join("destinations.toml"),
        std::fs::read_to_string(m.state.path().join("destinations.toml")).unwrap()
            + "\n[notify.team]\nurl = \"http://127.0.0.1:9/hook\"\nreaders = \"private\"\n",
    )
    .unwrap();
    // The night: three runs and their acts.
    let same = m.run_agent(
        "echo one > one.txt && git add one.txt && git commit -qm one && \
         git push -q origin HEAD:refs/heads/agent/one; git push -q origin HEAD:refs/heads/agent/two; true",
    );
    let two = m.run_agent(
        "echo a > a.txt && git add a.txt && git commit -qm a && git push -q origin HEAD:refs/heads/agent/single; \
         echo b > b.txt && git add b.txt && git commit -qm b && git push -q origin HEAD:refs/heads/agent/reject; true",
    );
    let hostile = m.run_agent_with_task(HOSTILE_SCRIPT, Some(HOSTILE_TASK));
    // A push of twelve commits, one with a 100 KB subject.
    let long = m.run_agent(
        "for i in $(seq 1 11); do echo $i > f$i && git add f$i && git commit -qm \"commit $i\" -m 'a body line'; done; \
         echo big > big && git add big && git commit -qm \"$(head -c 100000 /dev/zero | tr '\\0' x)\" && \
         git push -q origin HEAD:refs/heads/agent/long; true",
    );
    let hostile_notify = acts_of(&m, &hostile)
        .into_iter()
        .find(|a| a["act"]["door"] == "notify")
        .unwrap()["act"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A run its time cap kills, busy long enough for two resource samples.
    let out = m.state.run(&[
        "run",
        "--repo",
        m.repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--timeout",
        "12s",
        "--task",
        "spin until the cap <b>stops</b> you",
        "--",
        "bash",
        "-c",
        "while :; do :; done",
    ]);
    assert!(!out.status.success(), "the capped run ended well");
    let capped = m.state.runs().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let long_act = acts_of(&m, &long)[0]["act"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let same_acts = acts_of(&m, &same);
    assert_eq!(same_acts.len(), 2, "{same_acts:?}");
    let shared_commit = commit_of(&same_acts[0]);
    assert_eq!(shared_commit, commit_of(&same_acts[1]));
    let two_acts = acts_of(&m, &two);
    assert_eq!(two_acts.len(), 2, "{two_acts:?}");
    let (single, reject) = (
        two_acts[0]["act"]["id"].as_str().unwrap().to_string(),
        two_acts[1]["act"]["id"].as_str().unwrap().to_string(),
    );
    let single_commit = commit_of(&two_acts[0]);
    assert_eq!(
        acts_of(&m, &hostile).len(),
        2,
        "the hostile run's push and message are queued"
    );

    add_accounts(&m.state);
    let serve = Serve::start(&m.state, &["--owner-key-file", m.key.to_str().unwrap()]);
    let origin = format!("http://{}", serve.addr);
    let driver = Driver::start();
    let c = driver.browser().await;

    // Not logged in: the login page.
    c.goto(&serve.url("/queue")).await.unwrap();
    assert!(c.current_url().await.unwrap().as_str().ends_with("/login"));
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
    if c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("section#runs"))
        .await
        .is_err()
    {
        panic!(
            "no Morning page after logging in: {} {}",
            c.current_url().await.unwrap(),
            c.source().await.unwrap()
        );
    }

    // Morning: the runs by outcome, the chain verified.
    let morning = text_of(&c, "main").await;
    assert!(
        morning.contains("finished: 4") && morning.contains("killed: 1"),
        "{morning}"
    );
    // Each run's task, its first line, escaped: the hostile run's literally.
    let tasks = text_of(&c, "#runs table.runs").await;
    assert!(
        tasks.contains(
            "Fix the bug in <script>window.__pwned=11</script> \\u{1b}[2J\\u{202e}txt.exe …"
        ),
        "the task is not on Morning, escaped: {tasks}"
    );
    assert!(
        !tasks.contains("onerror"),
        "a task's second line in a table: {tasks}"
    );
    // The night as a picture: a bar per run, each a link to its run, the
    // cap kill and the acts marked, nothing but drawing in the SVG.
    let night = c
        .execute(
            "const s = document.querySelector('svg#night'); if (!s) return null; return {\
               links: [...s.querySelectorAll('a')].map(a => a.getAttribute('href')),\
               bars: s.querySelectorAll('rect.bar').length,\
               tags: [...new Set([...s.querySelectorAll('*')].map(e => e.localName))],\
               attrs: [...new Set([...s.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name)))],\
               caps: s.querySelectorAll('path.cap').length,\
               acts: s.querySelectorAll('circle.act').length,\
               titles: [...s.querySelectorAll('a > title')].map(t => t.textContent) };",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(night["bars"], 5, "{night}");
    let links: Vec<&str> = night["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    for run in [&same, &two, &hostile, &long, &capped] {
        assert!(
            links.contains(&format!("/runs/{run}").as_str()),
            "no bar links run {run}: {night}"
        );
    }
    for tag in night["tags"].as_array().unwrap() {
        assert!(
            ["title", "line", "text", "a", "rect", "path", "circle", "g"]
                .contains(&tag.as_str().unwrap()),
            "an element the picture does not draw: {tag} ({night})"
        );
    }
    for attr in night["attrs"].as_array().unwrap() {
        assert!(
            !attr.as_str().unwrap().starts_with("on"),
            "an event handler in the picture: {night}"
        );
    }
    assert_eq!(night["caps"], 1, "the cap kill is not marked: {night}");
    assert!(
        night["acts"].as_u64().unwrap() >= 6,
        "the acts are not marked: {night}"
    );
    assert!(
        night["titles"].as_array().unwrap().iter().any(|t| t
            .as_str()
            .unwrap()
            .contains("<script>window.__pwned=11</script>")),
        "the hostile task is not shown as text: {night}"
    );
    assert!(text_of(&c, "#chain").await.contains("verified"));
    assert_eq!(
        pwned(&c).await,
        serde_json::Value::Null,
        "a payload ran on Morning"
    );
    screenshot(&c, "morning.png").await;
    // The same task, whole, in `runs --json`, `show` and the HTTP API.
    let listed = m.state.runs();
    let listed = listed.iter().find(|r| r["id"] == hostile.as_str()).unwrap();
    assert_eq!(listed["task"], HOSTILE_TASK, "runs --json: {listed}");
    let shown = m.state.run(&["show", &hostile]);
    let shown = tests::stdout(&shown);
    assert!(
        shown.contains("  task:\n    Fix the bug in <script>window.__pwned=11</script> \\u{1b}[2J\\u{202e}txt.exe\n    <img src=x"),
        "show: {shown}"
    );
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{202e}'),
        "show printed the task raw"
    );
    c.goto(&serve.url("/api/v1/runs")).await.unwrap();
    let api: serde_json::Value = serde_json::from_str(&text_of(&c, "body").await).unwrap();
    let record = api
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| &pair[1])
        .find(|r| r["id"] == hostile.as_str())
        .unwrap();
    assert_eq!(record["task"], HOSTILE_TASK, "the API: {record}");

    // The hostile run: its diff, commit message, file names and output literally.
    c.goto(&serve.url(&format!("/runs/{hostile}")))
        .await
        .unwrap();
    let changes = text_of(&c, "#changes").await;
    assert!(
        changes.contains("<script>window.__pwned=1</script>"),
        "{changes}"
    );
    assert!(
        changes.contains("<img src=x onerror=window.__pwned=2>.txt"),
        "{changes}"
    );
    assert!(
        changes.contains("\\u{202e}gnp.exe"),
        "the bidi override is not shown visibly: {changes}"
    );
    assert!(
        !changes.contains('\u{202e}'),
        "a raw bidi override reached the page"
    );
    assert!(
        !changes.contains('\u{1b}'),
        "a raw terminal escape reached the page"
    );
    assert!(
        changes.contains("RUNS ON THE HOST"),
        "the workflow file is not flagged: {changes}"
    );
    let task = text_of(&c, "#task").await;
    assert_eq!(
        task,
        "Fix the bug in <script>window.__pwned=11</script> \\u{1b}[2J\\u{202e}txt.exe\n<img src=x onerror=window.__pwned=12> and nothing else",
        "the task is not on Run, whole and escaped"
    );
    let output = text_of(&c, "#live-output").await;
    assert!(
        output.contains("<script>window.__pwned=3</script>"),
        "{output}"
    );
    assert!(
        output.contains("\\x1b[31m") || output.contains("\\u{1b}[31m"),
        "{output}"
    );
    assert_eq!(
        pwned(&c).await,
        serde_json::Value::Null,
        "a payload ran on Run"
    );
    // No link anywhere points where an agent said.
    let hrefs = c
        .execute(
            "return [...document.querySelectorAll('a')].map(a => a.getAttribute('href'));",
            vec![],
        )
        .await
        .unwrap();
    for h in hrefs.as_array().unwrap() {
        let h = h.as_str().unwrap_or("");
        assert!(h.starts_with('/'), "a link the page did not make: {h}");
    }
    screenshot(&c, "run.png").await;

    // The capped run: its memory and CPU over time.
    c.goto(&serve.url(&format!("/runs/{capped}")))
        .await
        .unwrap();
    let usage = c
        .execute(
            "const s = document.querySelector('svg#resources'); if (!s) return null; return [\
               s.querySelector('polyline.memory').getAttribute('points').split(' ').length,\
               s.querySelector('polyline.cpu').getAttribute('points').split(' ').length,\
               s.textContent];",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        usage[0].as_u64().unwrap() >= 2 && usage[1].as_u64().unwrap() >= 1,
        "no memory and CPU drawn: {usage}"
    );
    assert!(usage[2].as_str().unwrap().contains("cores"), "{usage}");
    screenshot(&c, "run-capped.png").await;
    // Its time cap ended it: the choice to continue it, shown and posted to
    // its own run (the post itself: dashboard_api.rs).
    let button = c
        .find(Locator::Css("#continuation form.continue button.continue"))
        .await
        .expect("no continue button on the capped run's page");
    assert!(button.is_displayed().await.unwrap());
    let action = c
        .find(Locator::Css("#continuation form.continue"))
        .await
        .unwrap()
        .attr("action")
        .await
        .unwrap();
    assert_eq!(
        action.as_deref(),
        Some(format!("/api/v1/runs/{capped}/continue").as_str())
    );

    // The finished run with an ordinary diff.
    c.goto(&serve.url(&format!("/runs/{two}"))).await.unwrap();
    assert!(
        c.find(Locator::Css("form.continue")).await.is_err(),
        "a run that ended well offers to be continued"
    );
    let changes = text_of(&c, "#changes").await;
    assert!(
        changes.contains("a.txt") && changes.contains("b.txt") && changes.contains("+a"),
        "{changes}"
    );

    // Queue: everything on one page; the hostile act body as text.
    c.goto(&serve.url("/queue")).await.unwrap();
    let queue = text_of(&c, "main").await;
    assert!(
        queue.contains("<script>window.__pwned=5</script>"),
        "{queue}"
    );
    assert!(
        queue.contains("agent/\"><svg/onload=window.__pwned=4>"),
        "{queue}"
    );
    assert!(queue.contains("changes files the host may run"), "{queue}");
    assert_eq!(
        pwned(&c).await,
        serde_json::Value::Null,
        "a payload ran on Queue"
    );
    let elsewhere = fetched_elsewhere(&c, &origin).await;
    assert!(
        elsewhere.is_empty(),
        "fetched from elsewhere: {elsewhere:?}"
    );
    screenshot(&c, "queue.png").await;
    // Compact acts: the long push lists five subjects, each cut, the whole
    // log behind a closed toggle; every act says its age and expiry; a
    // message act does not repeat its destination.
    let long_block = format!(".act[data-act=\"{long_act}\"]");
    let subjects = c
        .execute(
            "return [...document.querySelectorAll(arguments[0] + ' ul.subjects li')].map(l => l.textContent);",
            vec![serde_json::json!(long_block)],
        )
        .await
        .unwrap();
    let subjects = subjects.as_array().unwrap();
    assert_eq!(subjects.len(), 5, "{subjects:?}");
    assert!(
        subjects.iter().all(|l| l.as_str().unwrap().len() < 200),
        "a subject is shown whole: {subjects:?}"
    );
    let toggle = c
        .execute(
            "const d = document.querySelector(arguments[0] + ' details.log'); return d ? [d.open, d.querySelector('summary').textContent] : null;",
            vec![serde_json::json!(long_block)],
        )
        .await
        .unwrap();
    assert_eq!(
        toggle[0], false,
        "the whole log is not behind a closed toggle: {toggle}"
    );
    assert!(
        toggle[1].as_str().unwrap().contains(" more commits"),
        "{toggle}"
    );
    let height = c
        .execute(
            "return document.querySelector(arguments[0]).getBoundingClientRect().height;",
            vec![serde_json::json!(long_block)],
        )
        .await
        .unwrap()
        .as_f64()
        .unwrap();
    assert!(height < 600.0, "the long push act is {height} px tall");
    let ages = c
        .execute(
            "return [...document.querySelectorAll('.act[data-state=pending]')].map(a => [a.querySelector('.age')?.textContent, a.querySelector('.expiry')?.textContent]);",
            vec![],
        )
        .await
        .unwrap();
    for a in ages.as_array().unwrap() {
        assert!(
            a[0].as_str()
                .is_some_and(|t| t.starts_with("queued ") && t.ends_with(" ago"))
                && a[1].as_str().is_some_and(|t| t.starts_with("expires in ")),
            "an act without age or expiry: {ages}"
        );
    }
    let notify_head = text_of(&c, &format!(".act[data-act=\"{hostile_notify}\"] p.head")).await;
    assert_eq!(
        notify_head.matches("team").count(),
        1,
        "the message act repeats its destination: {notify_head}"
    );

    // Policy: an agent's proposals shown whole, with what each would change.
    let rules = tempfile::tempdir().unwrap();
    let rule = |id: &str, effect: &str, clause: &str, reason: &str| {
        let path = rules.path().join(format!("{id}.toml"));
        std::fs::write(
            &path,
            format!(
                "[[rule]]\nid = \"{id}\"\nsubject = \"*\"\ndoors = [\"notify\"]\neffect = \"{effect}\"\n\
                 reason = '{reason}'\nauthority = \"agent\"\nmatch = [{clause}]\n"
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    };
    let loosen = rule(
        "notify-anything",
        "allow",
        "",
        "<script>window.__pwned=13</script> saves you clicks",
    );
    let tighten = rule(
        "no-team",
        "refuse",
        r#"{ field = "destination", matches = '^team$' }"#,
        "team is noisy",
    );
    let mut proposals = Vec::new();
    for file in [&loosen, &tighten] {
        let out = m
            .state
            .run(&["policy", "propose", file, "--actor", "agent-x"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = tests::stdout(&out);
        proposals.push(
            text.strip_prefix("proposed ")
                .and_then(|t| t.split(':').next())
                .unwrap_or_else(|| panic!("{text}"))
                .to_string(),
        );
    }
    // A tightening an agent declares itself (tier 1): the freeze suspends it.
    let own = rule(
        "agent-own",
        "refuse",
        r#"{ field = "destination", matches = '^nowhere$' }"#,
        "mine",
    );
    let text = std::fs::read_to_string(&own).unwrap();
    std::fs::write(
        &own,
        text.replace("subject = \"*\"", "subject = \"agent-y\""),
    )
    .unwrap();
    let out = m
        .state
        .run(&["policy", "declare", &own, "--actor", "agent-y"]);
    assert!(out.status.success(), "{}", stderr(&out));
    c.goto(&serve.url("/policy")).await.unwrap();
    let block = |id: &str| format!(".proposal[data-proposal=\"{id}\"]");
    let loose = text_of(&c, &block(&proposals[0])).await;
    for want in [
        "proposed by agent agent-x",
        "declare",
        "notify-anything",
        "allow",
        "[\"notify\"]",
        "none: it matches every request of its subject and doors",
        "<script>window.__pwned=13</script> saves you clicks",
        "No recorded act or dry-run act would have been decided otherwise.",
        "Beyond these, it allows every future request of subject * at the doors [\"notify\"], whatever it carries",
    ] {
        assert!(loose.contains(want), "{want:?} is not on the proposal: {loose}");
    }
    let tight = text_of(&c, &block(&proposals[1])).await;
    assert!(
        tight.contains("^team$"),
        "the match clause is not shown: {tight}"
    );
    let changed = text_of(&c, &format!("{} tr.changed", block(&proposals[1]))).await;
    assert!(
        changed.contains(&hostile_notify)
            && changed.contains("asked")
            && changed.contains("refused"),
        "the act it would refuse is not shown: {changed}"
    );
    let active = text_of(&c, "#active-rules").await;
    assert!(
        active.contains("the shipped rules")
            && active.contains("agent agent-y")
            && active.contains("tier 1: an agent's tightening"),
        "the rules table has no author: {active}"
    );
    assert_eq!(
        pwned(&c).await,
        serde_json::Value::Null,
        "a payload ran on Policy"
    );
    screenshot(&c, "policy.png").await;
    c.goto(&serve.url("/queue")).await.unwrap();

    // Approve one act: carried out against the loopback git server, shown without a reload.
    c.execute("window.__same_page = 1;", vec![]).await.unwrap();
    c.find(Locator::Css(&format!(
        ".act[data-act=\"{single}\"] button.approve"
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    wait_state(&c, &single, "done").await;
    assert_eq!(m.remote_ref("refs/heads/agent/single"), Some(single_commit));

    // Reject one with a reason.
    c.find(Locator::Css(&format!(
        ".act[data-act=\"{reject}\"] input.why"
    )))
    .await
    .unwrap()
    .send_keys("not this one: b.txt is wrong")
    .await
    .unwrap();
    c.find(Locator::Css(&format!(
        ".act[data-act=\"{reject}\"] button.reject"
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    wait_state(&c, &reject, "rejected").await;
    assert_eq!(
        m.act(&reject)["state"]["why"],
        "not this one: b.txt is wrong",
        "the reason was not kept"
    );
    assert_eq!(m.remote_ref("refs/heads/agent/reject"), None);

    // One decision for one content: every act carrying the commit, each
    // listed (door, destination, ref) before the click and its outcome
    // after. The hostile run's branch name is listed as text.
    let hostile_push = acts_of(&m, &hostile)
        .into_iter()
        .find(|a| a["act"]["door"] == "push")
        .unwrap();
    let listed = text_of(
        &c,
        &format!(
            "details.by-commit[data-commit=\"{}\"] ol.planned-acts",
            commit_of(&hostile_push)
        ),
    )
    .await;
    assert!(
        listed.contains("push to origin refs/heads/agent/\"><svg/onload=window.__pwned=4>"),
        "the hostile act is not listed literally: {listed}"
    );
    let by_commit = format!("details.by-commit[data-commit=\"{shared_commit}\"]");
    c.find(Locator::Css(&format!("{by_commit} summary")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let planned = text_of(&c, &format!("{by_commit} ol.planned-acts")).await;
    for a in &same_acts {
        let id = a["act"]["id"].as_str().unwrap();
        assert!(planned.contains(id), "act {id} is not listed: {planned}");
    }
    assert!(
        planned.contains("push to origin refs/heads/agent/one")
            && planned.contains("push to origin refs/heads/agent/two"),
        "the acts it would carry out are not listed before the click: {planned}"
    );
    assert_eq!(
        m.remote_ref("refs/heads/agent/one"),
        None,
        "opening the list carried something out"
    );
    c.find(Locator::Css(&format!("{by_commit} button.approve-commit")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for a in &same_acts {
        wait_state(&c, a["act"]["id"].as_str().unwrap(), "done").await;
    }
    let started = Instant::now();
    loop {
        let after = text_of(&c, &format!("{by_commit} ol.planned-acts")).await;
        if after.matches("done").count() >= 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the outcomes are not shown in the list: {after}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        m.remote_ref("refs/heads/agent/one").as_deref(),
        Some(shared_commit.as_str())
    );
    assert_eq!(
        m.remote_ref("refs/heads/agent/two").as_deref(),
        Some(shared_commit.as_str())
    );
    let same_page = c
        .execute("return window.__same_page;", vec![])
        .await
        .unwrap();
    assert_eq!(same_page, 1, "the page reloaded to show the outcomes");

    // A push the remote refuses (its pre-receive hook): failed, on the page.
    let hook = m.bare.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\necho 'agent/long is not welcome here' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    c.find(Locator::Css(&format!(
        ".act[data-act=\"{long_act}\"] button.approve"
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    wait_state(&c, &long_act, "failed").await;
    assert_eq!(m.remote_ref("refs/heads/agent/long"), None);
    c.goto(&serve.url("/")).await.unwrap();
    screenshot(&c, "morning-after.png").await;
    c.goto(&serve.url(&format!("/runs/{long}#acts")))
        .await
        .unwrap();
    screenshot(&c, "run-failed-push.png").await;

    // The kill switch, from the Stop page: a running run dies, nightshift freezes.
    let mut child = m
        .state
        .cmd()
        .args([
            "run",
            "--repo",
            m.repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
        ])
        .args(["bash", "-c", &format!("{WAIT_AT_GATE} sleep 600")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let running = wait_running(&m.state, &mut child, 1);
    c.find(Locator::Css("nav a.stop"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait().for_element(Locator::Id("stop-why")).await.unwrap();
    c.find(Locator::Id("stop-why"))
        .await
        .unwrap()
        .send_keys("stop everything")
        .await
        .unwrap();
    c.find(Locator::Id("stop-confirm"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Id("stop-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait().for_element(Locator::Id("frozen")).await.unwrap();
    let banner = text_of(&c, "#frozen").await;
    assert!(
        banner.contains("stop everything")
            && banner.contains(&format!("frozen by dashboard:{OWNER} at 20")),
        "the banner does not say who froze and when: {banner}"
    );
    c.goto(&serve.url("/policy")).await.unwrap();
    let suspended = text_of(&c, "#suspended-rules").await;
    assert!(
        suspended.contains("agent-own") && suspended.contains("agent agent-y"),
        "the agent's rule vanished under the freeze: {suspended}"
    );
    assert!(!text_of(&c, "#active-rules").await.contains("agent-own"));
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run survived the kill switch"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!status.success());
    let run = m.state.show(&running[0]);
    assert!(
        run["run"]["status"].as_str().unwrap().contains("kill"),
        "{}",
        run["run"]["status"]
    );
    assert!(m.state.containers().is_empty(), "a sandbox survived");

    // Log out: the login page, and the pages are closed again.
    c.find(Locator::Id("logout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait().for_element(Locator::Id("login")).await.unwrap();
    c.goto(&serve.url("/")).await.unwrap();
    assert!(c.current_url().await.unwrap().as_str().ends_with("/login"));
    c.close().await.unwrap();

    let out = m.state.verify();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_logs_in_through_a_tls_proxy() {
    let state = tests::State::new();
    assert!(state.run(&["owner", "init"]).status.success());
    add_accounts(&state);
    let cert = TestCert::new(&["dash.test"]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let origin = format!("https://dash.test:{port}");
    std::fs::write(
        state.path().join("config.toml"),
        format!("[serve]\nexternal_origin = \"{origin}\"\ntrusted_proxies = [\"127.0.0.9\"]\n"),
    )
    .unwrap();
    let serve = Serve::start(&state, &["--max-parallel", "0"]);
    let _proxy = TlsProxy::start(
        listener,
        cert.server_config(),
        "127.0.0.9".parse().unwrap(),
        serve.addr,
    );
    let driver = Driver::start();
    // dash.test resolves to the proxy; the browser trusts only the
    // proxy's key beyond its own roots.
    let c = driver
        .browser_with(
            &[
                "--host-resolver-rules=MAP dash.test 127.0.0.1".to_string(),
                format!("--ignore-certificate-errors-spki-list={}", cert.spki_sha256),
            ],
            "127.0.0.1;dash.test",
        )
        .await;
    tests::browser::log_in(&c, &origin, OWNER, OWNER_PASSWORD).await;

    // A state change from the external origin: the kill switch.
    c.find(Locator::Css("nav a.stop"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait().for_element(Locator::Id("stop-why")).await.unwrap();
    c.find(Locator::Id("stop-why"))
        .await
        .unwrap()
        .send_keys("through the proxy")
        .await
        .unwrap();
    c.find(Locator::Id("stop-confirm"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Id("stop-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    if c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Id("frozen"))
        .await
        .is_err()
    {
        let page = c.source().await.unwrap_or_default();
        panic!("the kill switch did not freeze through the proxy: {page}");
    }
    assert!(text_of(&c, "#frozen").await.contains("through the proxy"));
    c.close().await.unwrap();
    let out = state.run(&["policy", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["frozen"], "through the proxy");
}
