//! A run's result is made after its agent exited, by the end-of-run packer
//! in a sandbox of its own, and taken into the host as a pack through the
//! door (`orchestrator/supervisor/src/packer.rs`), through the real engine,
//! the real binary and real git:
//! - the result arrives from a second container (not the agent's), audited
//!   as `result_packed` before `observed_state` and `imported`, and holds the
//!   agent's commit and its uncommitted files;
//! - an agent cannot send a result of its own: the packer's client is in
//!   every door's `bin/`, and the agent's door refuses it, audited;
//! - a packer that sends nothing keeps the worktree, names the failure, and
//!   `nightshift import` brings the work back by the host's path.

use std::path::Path;
use std::process::Output;

use tests::{audit_kinds, git, image, make_repo, only_run, stderr, State};

fn run_agent(state: &State, repo: &Path, script: &str) -> (Output, serde_json::Value) {
    let out = state.run(&[
        "run",
        "--repo",
        repo.to_str().unwrap(),
        "--image",
        &image(),
        "--",
        "bash",
        "-c",
        script,
    ]);
    (out, only_run(state))
}

fn show(repo: &Path, run: &serde_json::Value, path: &str) -> String {
    let shown = git(
        repo,
        &[
            "show",
            &format!(
                "refs/nightshift/runs/{}:{path}",
                run["id"].as_str().unwrap()
            ),
        ],
    );
    shown.trim_end().to_string()
}

#[test]
fn a_runs_result_arrives_as_a_pack_from_a_sandbox_of_its_own() {
    let state = State::new();
    let repo = make_repo();
    let (out, run) = run_agent(
        &state,
        repo.path(),
        "git config user.email a@b && git config user.name a && \
         echo committed > c.txt && git add c.txt && git commit -qm agent && \
         echo loose > loose.txt",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = run["id"].as_str().unwrap();
    assert_eq!(show(repo.path(), &run, "c.txt"), "committed");
    assert_eq!(show(repo.path(), &run, "loose.txt"), "loose");
    let kinds = audit_kinds(&state, id);
    let at = |kind: &str| {
        kinds
            .iter()
            .position(|k| k == kind)
            .unwrap_or_else(|| panic!("no {kind} in {kinds:?}"))
    };
    assert!(at("container_removed") < at("result_packed"), "{kinds:?}");
    assert!(at("result_packed") < at("observed_state"), "{kinds:?}");
    assert!(at("observed_state") < at("imported"), "{kinds:?}");
    let packed = state.audit_bodies("result_packed");
    assert_eq!(packed.len(), 1, "{packed:?}");
    let packer = packed[0]["container"].as_str().unwrap();
    assert_ne!(
        Some(packer),
        run["container_id"].as_str(),
        "the result came from the agent's own container"
    );
    assert!(packed[0]["pack_bytes"].as_u64().unwrap() > 0);
    // Both containers are gone, and the packer's door with them.
    assert!(state.containers().is_empty(), "{:?}", state.containers());
    assert!(!state.path().join("doors").join(id).exists());
    assert!(state.verify().status.success());
}

/// Sends a result request of the agent's making to its own door and
/// keeps the door's answer in `answer.json`.
const FORGE_A_RESULT: &str = r#"
import json, socket, struct
body = json.dumps({"v": 3, "request": {"door": "result", "result_commit": "1" * 40,
    "agent_tip": "1" * 40, "observed_commit": None, "tip_source": "run_branch",
    "skipped": [], "skipped_total": 0, "ignored": 0, "history_dropped": None,
    "pack_bytes": 0}}).encode()
s = socket.socket(socket.AF_UNIX)
s.connect("/run/nightshift/door.sock")
s.sendall(struct.pack(">I", len(body)) + body)
answer = b""
while True:
    got = s.recv(65536)
    if not got:
        break
    answer += got
open("answer.json", "wb").write(answer[4:])
"#;

#[test]
fn an_agent_cannot_send_its_own_result() {
    let state = State::new();
    let repo = make_repo();
    let (out, run) = run_agent(
        &state,
        repo.path(),
        &format!("echo mine > mine.txt; python3 -c '{FORGE_A_RESULT}'"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // The door's answer is in the result the real packer made.
    let answer: serde_json::Value =
        serde_json::from_str(&show(repo.path(), &run, "answer.json")).unwrap();
    let answer = &answer["response"];
    assert_eq!(answer["verdict"], "refused", "{answer}");
    assert_eq!(answer["rule"], "nightshift:result", "{answer}");
    assert_eq!(show(repo.path(), &run, "mine.txt"), "mine");
    let refused: Vec<_> = state
        .audit_bodies("door_request")
        .into_iter()
        .filter(|b| b["door"] == "result")
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["verdict"], "refused");
    assert_eq!(refused[0]["reason"], "result_from_the_run");
    assert_eq!(state.audit_bodies("result_packed").len(), 1);
}

#[test]
fn a_packer_that_sends_nothing_keeps_the_worktree_for_nightshift_import() {
    let state = State::new();
    let repo = make_repo();
    // The agent leaves its worktree unreadable to the sandbox's user, whom
    // the packer runs as too: the packer can make no result.
    let (out, run) = run_agent(&state, repo.path(), "echo kept > kept.txt && chmod 000 .");
    let id = run["id"].as_str().unwrap();
    assert_eq!(out.status.code(), Some(11), "{}", stderr(&out));
    let status = run["status"].as_str().unwrap();
    assert!(
        status.starts_with("import failed") && status.contains("packer"),
        "{status}"
    );
    let worktree = state.path().join("worktrees").join(id);
    assert!(worktree.join("kept.txt").exists(), "the work was not kept");
    assert!(audit_kinds(&state, id).iter().any(|k| k == "import_failed"));
    // A person's retry reads it by the host's path.
    let retried = state.run(&["import", id]);
    assert!(retried.status.success(), "{}", stderr(&retried));
    let run = only_run(&state);
    assert_eq!(show(repo.path(), &run, "kept.txt"), "kept");
    assert!(!worktree.exists());
    assert!(state.verify().status.success());
}
