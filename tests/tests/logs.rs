//! The log as a collector reads it: `--log-format json` (or
//! `NIGHTSHIFT_LOG_FORMAT=json`) writes one JSON object a line on stderr;
//! a run's lifecycle events are in its span (`run = <id>`), and each door
//! request is in a span naming the door's run.

use serde_json::Value;
use tests::{image, make_repo, only_run, stderr, stdout, State};

/// Every line of stderr, parsed: a line that is not a JSON object fails.
fn parse_log(err: &str) -> Vec<Value> {
    err.lines()
        .map(|line| {
            let event: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line:?}"));
            assert!(event.is_object(), "{line}");
            assert!(
                line.bytes().all(|b| (0x20..0x7f).contains(&b)),
                "a log line of printable ASCII only: {line:?}"
            );
            event
        })
        .collect()
}

fn message(event: &Value) -> &str {
    event["fields"]["message"].as_str().unwrap_or_default()
}

/// The `run` field of the event's innermost span that has one.
fn run_of(event: &Value) -> Option<&str> {
    event["spans"]
        .as_array()?
        .iter()
        .rev()
        .find_map(|s| s["run"].as_str())
}

#[test]
fn a_runs_lifecycle_and_its_door_are_logged_as_json_in_the_runs_span() {
    let state = State::new();
    let repo = make_repo();
    // A request the door queues (ask), and one it refuses (a notice to a
    // destination nobody configured).
    let script = "echo 'may I?' > q.txt; nightshift-act ask --file q.txt; \
                  nightshift-act notify team --file q.txt; true";
    let out = state
        .cmd()
        .env("NIGHTSHIFT_LOG", "info")
        .args([
            "--log-format",
            "json",
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--json",
            "--",
            "bash",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let id = only_run(&state)["id"].as_str().unwrap().to_string();
    let events = parse_log(&stderr(&out));

    let lifecycle = [
        "run created",
        "sandbox attested",
        "run started",
        "run ended",
    ];
    let seen: Vec<&str> = events
        .iter()
        .map(message)
        .filter(|m| lifecycle.contains(m))
        .collect();
    assert_eq!(seen, lifecycle, "{events:#?}");
    for event in events.iter().filter(|e| lifecycle.contains(&message(e))) {
        assert_eq!(event["span"]["name"], "run", "{event}");
        assert_eq!(event["span"]["run"], id.as_str(), "{event}");
    }
    let ended = events.iter().find(|e| message(e) == "run ended").unwrap();
    assert_eq!(ended["fields"]["status"], "exited 0", "{ended}");

    // The door: each request and its verdict in a span of the door's run.
    let door: Vec<&Value> = events
        .iter()
        .filter(|e| ["door request", "door verdict", "act queued"].contains(&message(e)))
        .collect();
    for event in &door {
        assert_eq!(event["span"]["name"], "door", "{event}");
        assert_eq!(run_of(event), Some(id.as_str()), "{event}");
    }
    let verdicts: Vec<&str> = door
        .iter()
        .filter(|e| message(e) == "door verdict")
        .map(|e| e["fields"]["verdict"].as_str().unwrap())
        .collect();
    // The agent's two requests, then the end-of-run packer's result.
    assert_eq!(verdicts, ["queued", "refused", "done"], "{door:#?}");
    let queued = door
        .iter()
        .find(|e| message(e) == "act queued")
        .unwrap_or_else(|| panic!("no act queued: {door:#?}"));
    let act = queued["fields"]["act"].as_str().unwrap();

    // The owner's decision moves the act, logged with the act and its run.
    let out = state.run(&["owner", "init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let key = state.path().join("owner.key");
    let out = state
        .cmd()
        .env("NIGHTSHIFT_LOG", "info")
        .args([
            "--log-format",
            "json",
            "reject",
            act,
            "--why",
            "not tonight",
        ])
        .arg("--owner-key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let events = parse_log(&stderr(&out));
    let rejected = events
        .iter()
        .find(|e| message(e) == "act rejected")
        .unwrap_or_else(|| panic!("no act rejected: {events:#?}"));
    assert_eq!(rejected["fields"]["act"], act, "{rejected}");
    assert_eq!(rejected["fields"]["run"], id.as_str(), "{rejected}");
    assert_eq!(rejected["fields"]["from"], "pending", "{rejected}");
}

#[test]
fn the_log_format_is_also_taken_from_the_environment() {
    let state = State::new();
    // A state-changing command looks for a `serve` first and says so at debug.
    let out = state
        .cmd()
        .env("NIGHTSHIFT_LOG", "debug")
        .env("NIGHTSHIFT_LOG_FORMAT", "json")
        .args(["freeze", "--why", "a test"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let events = parse_log(&stderr(&out));
    assert!(!events.is_empty(), "no log at debug");
    assert!(events.iter().all(|e| e["level"].is_string()), "{events:#?}");
}
