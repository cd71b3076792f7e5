//! `nightshift serve` runs the run queue: queued tasks start in order, at
//! most `--max-parallel` at once, and `kill -9` of `serve` loses nothing (the
//! running run goes on and the restarted `serve` adopts it, the queued task
//! stays queued and starts after it; no task runs twice; the queue's acts and
//! the audit chain survive).

use tests::browser::Serve;
use tests::queue::{running_run, states, tasks, wait_tasks};
use tests::{image, make_repo, open_gate, stderr, stdout, State, WAIT_AT_GATE};

/// Ends every sandbox of the state even when the test fails.
struct Cleanup<'a>(&'a State);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&["kill", "--all"]);
    }
}

#[test]
fn a_killed_serve_loses_no_task_and_its_successor_adopts_the_running_run() {
    let state = State::new();
    let _cleanup = Cleanup(&state);
    let repo = make_repo();
    for n in 1..=2 {
        let out = state.run(&[
            "enqueue",
            "--repo",
            repo.path().to_str().unwrap(),
            "--ref",
            "main",
            "--image",
            &image(),
            "--task",
            &format!("task {n}"),
            "--",
            "bash",
            "-c",
            &format!("{WAIT_AT_GATE}echo {n} > done-{n}.txt"),
        ]);
        assert!(out.status.success(), "enqueue: {}", stderr(&out));
        assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
    }
    assert_eq!(states(&state), ["queued", "queued"]);

    // serve starts the first task only (one at a time) ...
    let mut first = Serve::start(&state, &["--max-parallel", "1"]);
    let run1 = running_run(&state, 0);
    assert_eq!(states(&state), ["running", "queued"]);
    // ... and dies with kill -9 while that run is under way.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert_eq!(states(&state), ["running", "queued"]);
    assert_eq!(
        state
            .runs()
            .iter()
            .find(|r| r["id"] == run1.as_str())
            .map(|r| r["status"].clone()),
        Some("running".into()),
        "the run died with serve"
    );
    drop(first);

    // The next serve adopts the running task, starts nothing beside it, then
    // the queued one once the first has ended.
    let second = Serve::start(&state, &["--max-parallel", "1"]);
    let adopter = format!("{}:", second.child.id());
    wait_tasks(&state, "the first task adopted", |t| {
        t[0]["progress"]["dispatcher"]
            .as_str()
            .is_some_and(|d| d.starts_with(&adopter))
    });
    assert_eq!(states(&state), ["running", "queued"]);
    open_gate(&state, &run1);
    let run2 = running_run(&state, 1);
    open_gate(&state, &run2);
    wait_tasks(&state, "both tasks done", |t| {
        t.iter().all(|t| t["state"] == "done")
    });
    drop(second);

    let runs = state.runs();
    assert_eq!(runs.len(), 2, "a task ran twice or not at all: {runs:#?}");
    for (t, run) in tasks(&state).iter().zip([&run1, &run2]) {
        assert_eq!(t["progress"]["run"], run.as_str(), "{t:#?}");
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        assert_eq!(r["status"], "exited 0", "{r:#?}");
    }
    for (n, run) in [&run1, &run2].iter().enumerate() {
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        let result = r["result_ref"].as_str().unwrap();
        let files = tests::git(repo.path(), &["ls-tree", "--name-only", result]);
        assert!(files.contains(&format!("done-{}.txt", n + 1)), "{files}");
    }
    assert!(state.containers().is_empty());
    assert!(state.verify().status.success());
}
