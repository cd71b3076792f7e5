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
        let p = &t[index]["progress"];
        // A run in process is named in its task; a child's run is known by
        // its supervisor, the task's child.
        let mine = |r: &serde_json::Value| match p["in_process"].as_bool() {
            Some(true) => r["id"] == p["run"],
            _ => !p["child"].is_null() && r["supervisor"] == p["child"],
        };
        state.runs().iter().any(|r| {
            mine(r) && r["status"] == "running" && {
                run = r["id"].as_str().unwrap_or_default().to_string();
                true
            }
        })
    });
    run
}

/// The `nightshift` processes of `state` whose command line holds `word`
/// (`watchdog`, `run`, `serve`), by pid.
pub fn processes(state: &State, word: &str) -> Vec<u32> {
    let root = state.path().to_string_lossy().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let of_state = args.iter().any(|a| a == &root)
            || env
                .split(|b| *b == 0)
                .any(|v| v == format!("NIGHTSHIFT_STATE_DIR={root}").as_bytes());
        let ours = args
            .first()
            .is_some_and(|a| a.ends_with("/nightshift") || a == "nightshift");
        if ours && of_state && args.iter().skip(1).any(|a| a == word) {
            found.push(pid);
        }
    }
    found
}
