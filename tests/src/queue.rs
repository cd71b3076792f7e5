//! The run queue as the tests see it: the task list, waiting on it, the run
//! a task started.

use std::time::{Duration, Instant};

use crate::{stderr, State};

pub fn tasks(state: &State) -> Vec<serde_json::Value> {
    let out = state.run(&["tasks", "--json"]);
    assert!(out.status.success(), "tasks failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("tasks json")
}

pub fn states(state: &State) -> Vec<String> {
    tasks(state)
        .iter()
        .map(|t| t["state"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Waits until `pred` holds of the task list (polled, with a generous bound).
pub fn wait_tasks(state: &State, what: &str, mut pred: impl FnMut(&[serde_json::Value]) -> bool) {
    let started = Instant::now();
    loop {
        if pred(&tasks(state)) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "never: {what}; tasks: {:#?}",
            tasks(state)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The run of the task at `index` once it is running (its agent at the gate).
pub fn running_run(state: &State, index: usize) -> String {
    let mut run = String::new();
    wait_tasks(state, &format!("task {index} running"), |t| {
        if t[index]["progress"]["child"].is_null() {
            return false;
        }
        // The run is known by its supervisor, the task's child.
        state.runs().iter().any(|r| {
            r["supervisor"] == t[index]["progress"]["child"] && r["status"] == "running" && {
                run = r["id"].as_str().unwrap_or_default().to_string();
                true
            }
        })
    });
    run
}
