//! `nightshift serve` runs the run queue in its own process: queued tasks
//! start in order, at most `--max-parallel` at once, as runs of `serve`
//! itself (their sandboxes carry its identity; one watchdog for the whole
//! process, no per-run supervisor). `kill -9` of `serve` loses nothing: its
//! runs die with it, and its watchdog or the next `serve` stops their
//! sandboxes and imports their work; the restarted `serve` settles their
//! tasks from their runs (none runs twice), the queued task stays queued and
//! then runs; the audit chain still verifies. A run that fails ends only its
//! task; a stopped `serve` stops its runs, imports their work and waits.
//! Two `nightshift worker`s (`serve` without pages) share one queue and
//! one budget; one killed with `kill -9`, the other takes its tasks over
//! once their leases lapse and runs the rest.

use tests::browser::Serve;
use tests::queue::{processes, running_run, states, tasks, wait_tasks};
use tests::{image, make_repo, open_gate, stderr, stdout, State, WAIT_AT_GATE};

/// Ends every sandbox of the state even when the test fails.
struct Cleanup<'a>(&'a State);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&["kill", "--all"]);
    }
}

#[test]
fn a_killed_serve_loses_no_task_and_leaves_no_orphan_sandbox() {
    let state = State::new();
    let _cleanup = Cleanup(&state);
    let repo = make_repo();
    for n in 1..=3 {
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
            &format!("echo {n} > started-{n}.txt; {WAIT_AT_GATE}echo {n} > done-{n}.txt"),
        ]);
        assert!(out.status.success(), "enqueue: {}", stderr(&out));
        assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
    }
    assert_eq!(states(&state), ["queued", "queued", "queued"]);

    // serve starts two tasks (two at a time), as its own runs ...
    let mut first = Serve::start(&state, &["--max-parallel", "2", "--task-lease-secs", "3"]);
    let (run1, run2) = (running_run(&state, 0), running_run(&state, 1));
    assert_eq!(states(&state), ["running", "running", "queued"]);
    let serve_id = format!("{}:", first.child.id());
    for run in [&run1, &run2] {
        let r = &state.show(run)["run"];
        assert!(
            r["supervisor"].as_str().unwrap().starts_with(&serve_id),
            "not a run of serve: {r:#?}"
        );
    }
    // ... with one watchdog for the whole process and no other supervisor.
    assert_eq!(processes(&state, "watchdog").len(), 1);
    assert!(processes(&state, "run").is_empty());
    for (n, run) in [(1, &run1), (2, &run2)] {
        let worktree = state.path().join("worktrees").join(run);
        tests::wait_for_file(&worktree.join(format!("started-{n}.txt")));
    }

    // serve dies with kill -9 while both runs are under way.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert_eq!(states(&state), ["running", "running", "queued"]);
    drop(first);

    // The next serve settles both tasks from their runs, then runs the
    // queued one.
    let second = Serve::start(&state, &["--max-parallel", "2", "--task-lease-secs", "3"]);
    wait_tasks(&state, "the two killed tasks settled", |t| {
        t[0]["state"] == "done" && t[1]["state"] == "done"
    });
    let runs = state.runs();
    for (t, run) in tasks(&state).iter().zip([&run1, &run2]) {
        assert_eq!(t["progress"]["run"], run.as_str(), "{t:#?}");
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        assert_eq!(t["progress"]["status"], r["status"], "{t:#?}");
        let status = r["status"].as_str().unwrap();
        assert!(
            status.starts_with("lost") || status.starts_with("killed"),
            "{r:#?}"
        );
        // No orphan: its sandbox and worktree are gone, its work imported.
        let sandboxes = std::process::Command::new(tests::engine_cli())
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=nightshift.run={run}"))
            .output()
            .unwrap();
        assert!(stdout(&sandboxes).trim().is_empty(), "{run}'s sandbox left");
        assert!(!state.path().join("worktrees").join(run).exists());
        let result = r["result_ref"].as_str().expect("imported");
        let files = tests::git(repo.path(), &["ls-tree", "--name-only", result]);
        assert!(files.contains("started-"), "{files}");
        assert!(!files.contains("done-"), "{files}");
    }
    let run3 = running_run(&state, 2);
    open_gate(&state, &run3);
    wait_tasks(&state, "the third task done", |t| t[2]["state"] == "done");
    drop(second);

    let runs = state.runs();
    assert_eq!(runs.len(), 3, "a task ran twice or not at all: {runs:#?}");
    let r = runs.iter().find(|r| r["id"] == run3.as_str()).unwrap();
    assert_eq!(r["status"], "exited 0", "{r:#?}");
    let files = tests::git(
        repo.path(),
        &["ls-tree", "--name-only", r["result_ref"].as_str().unwrap()],
    );
    assert!(files.contains("done-3.txt"), "{files}");
    assert!(state.containers().is_empty());
    assert!(state.verify().status.success());
}

#[test]
fn a_failing_run_ends_only_its_task_and_a_stopped_serve_ends_its_runs() {
    let state = State::new();
    let _cleanup = Cleanup(&state);
    let repo = make_repo();
    let enqueue = |image: &str, script: &str| {
        let out = state.run(&[
            "enqueue",
            "--repo",
            repo.path().to_str().unwrap(),
            "--ref",
            "main",
            "--image",
            image,
            "--",
            "bash",
            "-c",
            script,
        ]);
        assert!(out.status.success(), "enqueue: {}", stderr(&out));
    };
    enqueue("nightshift-no-such-image:0", "true");
    enqueue(
        &image(),
        &format!("echo 1 > kept.txt; {WAIT_AT_GATE}echo 1 > done.txt"),
    );
    let mut serve = Serve::start(&state, &["--max-parallel", "2", "--task-lease-secs", "3"]);
    wait_tasks(&state, "the first task failed", |t| {
        t[0]["state"] == "failed"
    });
    let run = running_run(&state, 1);
    // The failure is its task's alone, named with nightshift run's exit code.
    let t = &tasks(&state)[0];
    assert_eq!(t["progress"]["exit_code"], 5, "{t:#?}");
    assert!(
        t["progress"]["reason"]
            .as_str()
            .unwrap()
            .contains("nightshift-no-such-image"),
        "{t:#?}"
    );
    assert_eq!(serve.child.try_wait().unwrap(), None, "serve ended");
    tests::wait_for_file(&state.path().join("worktrees").join(&run).join("kept.txt"));

    // SIGTERM: serve stops its run (its work imported) and waits for it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = serve.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    drop(serve);
    let t = &tasks(&state)[1];
    assert_eq!(t["state"], "done", "{t:#?}");
    assert_eq!(t["progress"]["status"], "interrupted: SIGTERM", "{t:#?}");
    let r = state
        .runs()
        .into_iter()
        .find(|r| r["id"] == run.as_str())
        .unwrap();
    let files = tests::git(
        repo.path(),
        &["ls-tree", "--name-only", r["result_ref"].as_str().unwrap()],
    );
    assert!(
        files.contains("kept.txt") && !files.contains("done.txt"),
        "{files}"
    );
    assert!(state.containers().is_empty());
    assert!(state.verify().status.success());
}

/// A `nightshift worker` of this state, with short task leases.
struct Worker(std::process::Child);

impl Worker {
    fn start(state: &State) -> Worker {
        Worker(
            state
                .cmd()
                .args(["worker", "--max-parallel", "2", "--task-lease-secs", "3"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("starting a worker"),
        )
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn two_workers_share_one_queue_and_one_takes_over_a_killed_ones_tasks() {
    let state = State::new();
    let _cleanup = Cleanup(&state);
    let repo = make_repo();
    for n in 1..=4 {
        let out = state.run(&[
            "enqueue",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
            "bash",
            "-c",
            &format!("echo {n} > started-{n}.txt; {WAIT_AT_GATE}echo {n} > done-{n}.txt"),
        ]);
        assert!(out.status.success(), "enqueue: {}", stderr(&out));
    }
    // The first worker takes two tasks (the queue's budget: two at once) ...
    let mut first = Worker::start(&state);
    let (run1, run2) = (running_run(&state, 0), running_run(&state, 1));
    let first_id = format!("{}:", first.0.id());
    for t in &tasks(&state)[..2] {
        assert!(
            t["progress"]["dispatcher"]
                .as_str()
                .unwrap()
                .starts_with(&first_id),
            "{t:#?}"
        );
    }
    // ... and the second, sharing the budget, starts nothing beside them.
    let second = Worker::start(&state);
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(states(&state), ["running", "running", "queued", "queued"]);
    for (n, run) in [(1, &run1), (2, &run2)] {
        tests::wait_for_file(
            &state
                .path()
                .join("worktrees")
                .join(run)
                .join(format!("started-{n}.txt")),
        );
    }
    // The first dies with kill -9, its runs with it; once its leases lapse
    // the second settles its tasks from their runs and runs the rest.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    wait_tasks(&state, "the killed worker's tasks settled", |t| {
        t[0]["state"] == "done" && t[1]["state"] == "done"
    });
    let run3 = running_run(&state, 2);
    let run4 = running_run(&state, 3);
    let second_id = format!("{}:", second.0.id());
    for t in &tasks(&state)[2..] {
        assert!(
            t["progress"]["dispatcher"]
                .as_str()
                .unwrap()
                .starts_with(&second_id),
            "{t:#?}"
        );
    }
    open_gate(&state, &run3);
    open_gate(&state, &run4);
    wait_tasks(&state, "every task done", |t| {
        t.iter().all(|t| t["state"] == "done")
    });
    let runs = state.runs();
    assert_eq!(runs.len(), 4, "a task ran twice or not at all: {runs:#?}");
    for (t, run) in tasks(&state).iter().zip([&run1, &run2, &run3, &run4]) {
        assert_eq!(t["progress"]["run"], run.as_str(), "{t:#?}");
    }
    for run in [&run1, &run2] {
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        let status = r["status"].as_str().unwrap();
        assert!(
            status.starts_with("lost") || status.starts_with("killed"),
            "{r:#?}"
        );
    }
    for run in [&run3, &run4] {
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        assert_eq!(r["status"], "exited 0", "{r:#?}");
    }
    drop(second);
    assert!(state.verify().status.success());
}
