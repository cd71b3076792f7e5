//! The run queue against the real engine: tasks start in order, at most
//! `--max-parallel` at once; `kill -9` of the dispatcher loses nothing (the
//! queued stay queued, the running run is adopted by the next dispatcher and
//! ends once, no task runs twice); a freeze keeps tasks queued; a queued
//! task can be cancelled.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use tests::queue::{running_run, states, tasks, wait_tasks};
use tests::{image, make_repo, open_gate, stderr, stdout, State, WAIT_AT_GATE};

/// Ends what a test started even when it fails: its dispatchers, then every
/// sandbox of its state (whose runs then end by themselves).
struct Cleanup<'a> {
    state: &'a State,
    dispatchers: Vec<u32>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for pid in &self.dispatchers {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.state.run(&["kill", "--all"]);
    }
}

fn dispatcher(state: &State, max_parallel: &str) -> Child {
    state
        .cmd()
        .args([
            "tasks",
            "run",
            "--max-parallel",
            max_parallel,
            "--lease-secs",
            "3",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the dispatcher")
}

#[test]
fn tasks_start_in_order_and_a_killed_dispatcher_loses_nothing() {
    let state = State::new();
    let repo = make_repo();
    let file = repo.path().join("night.toml");
    let mut toml = String::new();
    for n in 1..=3 {
        toml.push_str(&format!(
            "[[task]]\nrepo = \".\"\nref = \"main\"\nimage = \"{}\"\ntask = \"task {n}\"\ncommand = [\"bash\", \"-c\", \"{WAIT_AT_GATE}echo {n} > done-{n}.txt\"]\n\n",
            image()
        ));
    }
    std::fs::write(&file, toml).unwrap();
    let out = state.run(&["enqueue", "--file", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 3, "{}", stdout(&out));
    assert_eq!(states(&state), ["queued", "queued", "queued"]);

    // The first dispatcher starts the first task only (one at a time) ...
    let mut cleanup = Cleanup {
        state: &state,
        dispatchers: Vec::new(),
    };
    let mut first = dispatcher(&state, "1");
    cleanup.dispatchers.push(first.id());
    let run1 = running_run(&state, 0);
    assert_eq!(states(&state), ["running", "queued", "queued"]);
    // ... and dies with kill -9 while that run is under way.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    first.wait().unwrap();
    assert_eq!(states(&state), ["running", "queued", "queued"]);
    // The run did not die with it.
    assert_eq!(
        state
            .runs()
            .iter()
            .find(|r| r["id"] == run1.as_str())
            .map(|r| r["status"].clone()),
        Some("running".into())
    );

    // The next dispatcher adopts the running task and starts nothing beside it.
    let mut second = dispatcher(&state, "1");
    cleanup.dispatchers.push(second.id());
    let adopter = format!("{}:", second.id());
    wait_tasks(&state, "the first task adopted", |t| {
        t[0]["progress"]["dispatcher"]
            .as_str()
            .is_some_and(|d| d.starts_with(&adopter))
    });
    // Adopted before anything else is looked at: nothing starts beside it.
    assert_eq!(states(&state), ["running", "queued", "queued"]);
    open_gate(&state, &run1);
    let run2 = running_run(&state, 1);
    assert_eq!(states(&state), ["done", "running", "queued"]);
    open_gate(&state, &run2);
    let run3 = running_run(&state, 2);
    open_gate(&state, &run3);
    let status = wait_exit(&mut second);
    let out = second.wait_with_output().unwrap();
    assert_eq!(status, Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let ids: Vec<String> = tasks(&state)
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert!(said.contains(&format!("adopted {}", ids[0])), "{said}");

    // Every task done once, each its own run, in the order enqueued.
    let all = tasks(&state);
    let runs = state.runs();
    assert_eq!(runs.len(), 3, "a task ran twice or not at all: {runs:#?}");
    for (t, run) in all.iter().zip([&run1, &run2, &run3]) {
        assert_eq!(t["state"], "done", "{t:#?}");
        assert_eq!(t["progress"]["run"], run.as_str(), "{t:#?}");
        assert_eq!(t["progress"]["exit_code"], 0, "{t:#?}");
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        assert_eq!(r["status"], "exited 0", "{r:#?}");
    }
    let created: Vec<&str> = [&run1, &run2, &run3]
        .iter()
        .map(|id| {
            runs.iter()
                .find(|r| r["id"] == id.as_str())
                .and_then(|r| r["created_at"].as_str())
                .unwrap()
        })
        .collect();
    assert!(created.windows(2).all(|w| w[0] <= w[1]), "{created:?}");
    // Each run's work arrived, in its own branch.
    for (n, run) in [&run1, &run2, &run3].iter().enumerate() {
        let r = runs.iter().find(|r| r["id"] == run.as_str()).unwrap();
        let result = r["result_ref"].as_str().unwrap();
        let files = tests::git(repo.path(), &["ls-tree", "--name-only", result]);
        assert!(files.contains(&format!("done-{}.txt", n + 1)), "{files}");
    }
    assert!(state.containers().is_empty());
    assert!(state.verify().status.success());
}

fn wait_exit(child: &mut Child) -> Option<i32> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the dispatcher never returned"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_freeze_keeps_tasks_queued_and_a_queued_task_can_be_cancelled() {
    let state = State::new();
    let repo = make_repo();
    let r = repo.path().to_str().unwrap();
    for n in ["1", "2"] {
        let out = state.run(&["enqueue", "--repo", r, "--task", n, "--", "true"]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let ids: Vec<String> = tasks(&state)
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    let out = state.run(&["tasks", "cancel", &ids[0]]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Once only: a cancelled task is not queued any more.
    let out = state.run(&["tasks", "cancel", &ids[0]]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = state.run(&["tasks", "cancel", "task-none"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    let out = state.run(&["freeze", "--why", "maintenance"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = state.run(&["tasks", "run"]);
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(stderr(&out).contains("maintenance"), "{}", stderr(&out));
    assert_eq!(states(&state), ["cancelled", "queued"]);
    assert!(state.runs().is_empty());
}

#[test]
fn a_bad_task_enqueues_nothing_and_is_named() {
    let state = State::new();
    let repo = make_repo();
    let file = repo.path().join("night.toml");
    std::fs::write(
        &file,
        "[[task]]\nrepo = \".\"\ncommand = [\"true\"]\n\n[[task]]\nrepo = \"./nowhere\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let out = state.run(&["enqueue", "--file", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("task 2: the repository"),
        "{}",
        stderr(&out)
    );
    std::fs::write(
        &file,
        "[[task]]\nrepo = \".\"\nagnet = \"x\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let out = state.run(&["enqueue", "--file", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("line 3"), "{}", stderr(&out));
    // A preset brings its own command; an unknown preset is named.
    for (body, said) in [
        (
            "agent = \"claude-code\"\ncommand = [\"true\"]\n",
            "the preset brings its own command",
        ),
        ("agent = \"nope\"\n", "no agent preset \"nope\""),
    ] {
        std::fs::write(&file, format!("[[task]]\nrepo = \".\"\n{body}")).unwrap();
        let out = state.run(&["enqueue", "--file", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(stderr(&out).contains(said), "{}", stderr(&out));
    }
    assert!(tasks(&state).is_empty());
}

/// `nightshift run` goes through the queue's task path: its run is a task
/// (done, naming the run, when it ends); killed with `kill -9` mid-run, its
/// task is left running under a lease that lapses, and a dispatcher then
/// takes it over and settles it from the run, which the run's watchdog
/// ended. A dispatcher's own child runs make no task of their own (the
/// first test counts one task a run).
#[test]
fn a_foreground_run_is_a_task_and_a_killed_one_is_settled_by_a_dispatcher() {
    let state = State::new();
    let repo = make_repo();
    let mut cleanup = Cleanup {
        state: &state,
        dispatchers: Vec::new(),
    };
    let out = state.run(&[
        "run",
        "--repo",
        repo.path().to_str().unwrap(),
        "--image",
        &image(),
        "--task",
        "write a file",
        "--json",
        "--",
        "bash",
        "-c",
        "echo x > x.txt",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let all = tasks(&state);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["state"], "done", "{all:#?}");
    assert_eq!(all[0]["progress"]["run"], record["id"], "{all:#?}");
    assert_eq!(all[0]["progress"]["exit_code"], 0, "{all:#?}");
    assert_eq!(all[0]["spec"]["task"], "write a file", "{all:#?}");

    // A second run, killed with kill -9 while its agent waits.
    let mut run = state
        .cmd()
        .args([
            "run",
            "--repo",
            repo.path().to_str().unwrap(),
            "--image",
            &image(),
            "--",
        ])
        .args(["bash", "-c", &format!("{WAIT_AT_GATE}echo y > y.txt")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    cleanup.dispatchers.push(run.id());
    let running = tests::wait_running(&state, &mut run, 1);
    wait_tasks(&state, "the foreground run's task running", |t| {
        t.len() == 2 && t[1]["state"] == "running" && t[1]["progress"]["run"] == running[0].as_str()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    run.wait().unwrap();
    // Nothing settles the task but a dispatcher, once the lease lapses.
    assert_eq!(states(&state), ["done", "running"]);
    let mut second = dispatcher(&state, "1");
    cleanup.dispatchers.push(second.id());
    let status = wait_exit(&mut second);
    assert_eq!(status, Some(0));
    let all = tasks(&state);
    assert_ne!(all[1]["state"], "running", "{all:#?}");
    assert_eq!(all[1]["progress"]["run"], running[0].as_str(), "{all:#?}");
    let runs = state.runs();
    assert_eq!(runs.len(), 2, "a task ran twice: {runs:#?}");
    let r = runs
        .iter()
        .find(|r| r["id"] == running[0].as_str())
        .unwrap();
    assert_ne!(r["status"], "running", "{r:#?}");
    assert_eq!(all[1]["progress"]["status"], r["status"], "{all:#?}");
    assert!(state.verify().status.success());
}
