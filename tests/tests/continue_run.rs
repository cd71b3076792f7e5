//! Continue in the morning (issue 23, item 3), end to end with the real
//! binary, engine and git: a run its time cap ended is continued with
//! `nightshift continue RUN --timeout T --max-tokens N`; the continuation is
//! a task of the run queue, runs from the capped run's result ref with the
//! same task and command and the new caps, and the audit links the two both
//! ways. A run no cap ended, and a run already continued, are refused with
//! the reason.

use tests::{image, make_repo, stderr, stdout, State};

/// A first run writes `one.txt` and hangs (its time cap ends it); a run
/// that finds `one.txt` in its base writes `two.txt` and exits 0.
const SCRIPT: &str =
    "if [ -f one.txt ]; then echo two > two.txt; exit 0; fi; echo one > one.txt; sleep infinity";

fn entries(state: &State, run: &str, kind: &str) -> Vec<serde_json::Value> {
    state.show(run)["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["body"].clone())
        .collect()
}

#[test]
fn a_capped_run_is_continued_from_its_result_and_linked_both_ways() {
    let state = State::new();
    let repo = make_repo();
    let repo_path = repo.path().to_str().unwrap();
    let img = image();
    let out = state.run(&[
        "run",
        "--repo",
        repo_path,
        "--image",
        &img,
        "--timeout",
        "3s",
        "--task",
        "finish the job",
        "--json",
        "--",
        "bash",
        "-c",
        SCRIPT,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let capped = tests::only_run(&state);
    let id = capped["id"].as_str().unwrap().to_string();
    assert!(
        capped["status"]
            .as_str()
            .unwrap()
            .starts_with("killed: timeout 3s"),
        "{capped}"
    );

    // A run no cap ended is refused, saying why.
    let out = state.run(&[
        "run", "--repo", repo_path, "--image", &img, "--json", "--", "true",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let fine: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let fine = fine["id"].as_str().unwrap().to_string();
    let out = state.run(&["continue", &fine]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be continued: it ended well (exited 0)"),
        "{}",
        stderr(&out)
    );
    // An unknown run is bad input.
    let out = state.run(&["continue", "01nosuchrun"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    // The capped run: continued with new caps.
    let out = state.run(&[
        "continue",
        &id,
        "--timeout",
        "60s",
        "--max-tokens",
        "777",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let task = reply["task"].as_str().unwrap().to_string();
    assert_eq!(reply["cap"], "wall-clock", "{reply}");
    // Once: a second request is refused, naming the task.
    let out = state.run(&["continue", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("already continued by task {task}")),
        "{}",
        stderr(&out)
    );
    // The request is audited on the capped run.
    let queued = entries(&state, &id, "continue_queued");
    assert_eq!(queued.len(), 1, "{queued:?}");
    assert_eq!(queued[0]["task"], task.as_str());
    assert_eq!(queued[0]["cap"], "wall-clock");

    // The queue runs it (a dispatcher's child run).
    let out = state.run(&["tasks", "run", "--max-parallel", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = state.run(&["tasks", "--json"]);
    let tasks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = tasks
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == task.as_str())
        .unwrap_or_else(|| panic!("no task {task}: {}", stdout(&out)))
        .clone();
    assert_eq!(row["state"], "done", "{row}");
    let new = row["progress"]["run"].as_str().unwrap().to_string();
    let continued = state.show(&new)["run"].clone();
    assert_eq!(continued["status"], "exited 0", "{continued}");
    // From the capped run's result, with the same task and command.
    assert_eq!(
        continued["base_ref"],
        format!("refs/nightshift/runs/{id}").as_str()
    );
    assert_eq!(continued["base_commit"], capped["result_commit"]);
    assert_eq!(continued["task"], "finish the job");
    assert_eq!(continued["command"], capped["command"]);
    let result = format!("refs/nightshift/runs/{new}");
    assert_eq!(
        tests::git(repo.path(), &["show", &format!("{result}:two.txt")]),
        "two\n"
    );
    // With the new caps.
    let created = entries(&state, &new, "run_created");
    assert_eq!(created[0]["caps"]["max_tokens"], 777, "{created:?}");
    // Linked both ways.
    let continues = entries(&state, &new, "continues");
    assert_eq!(continues.len(), 1);
    assert_eq!(continues[0]["run"], id.as_str());
    let continued_as = entries(&state, &id, "continued_as");
    assert_eq!(continued_as.len(), 1);
    assert_eq!(continued_as[0]["run"], new.as_str());
    // A continuation that ended well is no capped run: not continued again.
    let out = state.run(&["continue", &new]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(state.verify().status.success());
    assert!(state.containers().is_empty(), "sandbox left behind");
}

#[test]
fn enqueue_cannot_forge_a_continuation() {
    let state = State::new();
    let repo = make_repo();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.toml");
    std::fs::write(
        &file,
        format!(
            "[[task]]\nrepo = {:?}\ncommand = [\"true\"]\ncontinues = \"01abc\"\n",
            repo.path()
        ),
    )
    .unwrap();
    let out = state.run(&["enqueue", "--file", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("`continues` is set by `nightshift continue RUN` only"),
        "{}",
        stderr(&out)
    );
}
