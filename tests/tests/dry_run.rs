//! Dry runs and reports, through a real sandbox and the real binary: every
//! act is answered as it would have been (queued with a dry-run id, or
//! refused with the rule's reason) and recorded with its would-be verdict,
//! deciding rule and label; nothing is queued or pushed; the report groups
//! the acts by door, destination and ref, refusals first, and its HTML shows
//! an agent-chosen ref as text.

use tests::morning::Morning;
use tests::{image, stderr, stdout};

const AGENT: &str = "echo a > a.txt && git add a.txt && git commit -qm a && \
    git push origin 'HEAD:refs/heads/agent/<b>x' 2>&1; echo first=$?; \
    git push --force origin HEAD:refs/heads/main 2>&1; echo second=$?";

fn dry_run(m: &Morning) -> String {
    let out = m.state.run(&[
        "run",
        "--dry-run",
        "--repo",
        m.repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        AGENT,
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    m.state.runs().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_dry_run_answers_as_a_real_run_and_queues_nothing() {
    let m = Morning::new();
    let run = dry_run(&m);
    let log = m.state.output_log(&run);
    assert!(
        log.contains("first=0"),
        "the push is answered as queued: {log}"
    );
    assert!(
        log.contains("no-force-push-to-main") && !log.contains("second=0"),
        "the force push is refused with its rule: {log}"
    );
    assert!(m.queue().is_empty(), "{:?}", m.queue());
    assert_eq!(m.pushes_received(), 0);
    assert_eq!(m.state.show(&run)["run"]["dry_run"], true);

    // Each act recorded with what it would have had.
    let audit = m.state.show(&run)["audit"].clone();
    let dry: Vec<&serde_json::Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "dry_run_act")
        .map(|e| &e["body"])
        .collect();
    assert_eq!(dry.len(), 2, "{audit}");
    assert_eq!(dry[0]["would"], "asked");
    assert_eq!(dry[0]["verdict"], "ask");
    assert_eq!(dry[0]["rule"], "ask-before-push");
    assert_eq!(dry[0]["label"], "untrusted, private");
    assert!(dry[0]["act"].as_str().unwrap().starts_with('d'));
    assert_eq!(dry[1]["would"], "refused");
    assert_eq!(dry[1]["verdict"], "refuse");
    assert_eq!(dry[1]["rule"], "no-force-push-to-main");
    // Content-free: no commit message, no file text.
    assert!(!audit.to_string().contains("echo a"));

    // The report: refusals first, then what a person would have reviewed.
    let out = m.state.run(&["report", &run, "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["refused"], 1);
    assert_eq!(report["for_review"], 1);
    let groups = report["groups"].as_array().unwrap();
    assert_eq!(groups[0]["target"], "refs/heads/main");
    assert_eq!(groups[0]["refused"], 1);
    assert_eq!(groups[1]["target"], "refs/heads/agent/<b>x");
    assert_eq!(groups[1]["acts"][0]["outcome"], "asked");
    assert_eq!(report["runs"][0]["dry_run"], true);
    assert!(
        report["runs"][0]["caps"]["memory_bytes"].is_number(),
        "{report}"
    );

    let out = m.state.run(&["report", &run, "--format", "html"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = stdout(&out);
    assert!(page.contains("refs/heads/agent/&lt;b&gt;x"), "{page}");
    assert!(!page.contains("<b>x"), "{page}");
    assert!(!page.contains("<script") && !page.contains("http://") && !page.contains("https://"));

    let out = m.state.run(&["report", &run]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("(dry run)"), "{text}");
    assert!(
        text.contains("1 refused, 1 a person would have had to review"),
        "{text}"
    );

    // An unknown run is bad input, named.
    let out = m.state.run(&["report", "nope"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("nope"));
    assert!(m.state.verify().status.success());
    assert!(m.state.containers().is_empty());
}

#[test]
fn an_enqueued_dry_run_is_dispatched_as_a_dry_run() {
    let m = Morning::new();
    let out = m.state.run(&[
        "enqueue",
        "--dry-run",
        "--repo",
        m.repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        AGENT,
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let out = m.state.run(&["tasks", "run", "--max-parallel", "1"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let run = m.state.runs().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(m.state.show(&run)["run"]["dry_run"], true);
    let log = m.state.output_log(&run);
    assert!(log.contains("first=0"), "{log}");
    assert!(m.queue().is_empty(), "{:?}", m.queue());
    assert_eq!(m.pushes_received(), 0);
    let out = m.state.run(&["report", &run, "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["refused"], 1);
    assert_eq!(report["for_review"], 1);
    assert!(m.state.containers().is_empty());
}
