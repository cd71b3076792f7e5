//! More real agents through the model gateway, driven by the scripted model
//! server (tests/src/model.rs): the real Codex CLI (its PyPI wheel's
//! executable, `--agent codex`) over the Responses API, streaming, as Codex
//! speaks it, the real mini-swe-agent (`--agent mini-swe-agent`) over Chat
//! Completions through litellm's OpenAI provider, and the real aider
//! (`--agent aider`), streaming Chat Completions through litellm. Codex and
//! mini-swe-agent edit a file in the worktree and commit with their shell
//! tools, aider applies an edit block and commits it itself; the commit
//! arrives on the run branch and every model call is audited with its
//! tokens. Codex's
//! PreToolUse hook refuses a scripted `rm -r` through the door (not
//! `rm -rf`: Codex's own guard rejects `rm -f` forms by itself, which
//! would hide a hook that never ran), also when the repository commits its
//! own `.codex/config.toml` that would switch it off (the preset declares
//! the worktree untrusted). Aider, which always loads `.aider.conf.yml` and
//! `.env` at the repository's root, is refused on a repository that has them.
//!
//! The shell tools these versions offer (read from the tools their
//! requests list): Codex CLI 0.163.0 `exec_command` with `{"cmd": ...}`
//! (its hook sees it as `Bash` with `tool_input.command`); mini-swe-agent
//! 2.4.6 `bash` with `{"command": ...}`, the task ending with the command
//! `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`; aider 0.86.2 offers no
//! tools (gpt-5-mini's edit format is `diff`: SEARCH/REPLACE blocks). The
//! images are built by scripts/test.sh when missing (`nightshift image
//! build --agent codex|mini-swe-agent|aider`).

use serde_json::{json, Value};
use tests::agents::{model_calls, state_with_models, OPENAI_KEY};
use tests::model::{ModelServer, Step};
use tests::{git, make_repo, stderr, stdout, State};

/// Every tool result the agent sent back, in order, first sending only:
/// (the id of the call it answers, its content as text). Reads Responses
/// `function_call_output` items and Chat Completions `tool` messages.
fn tool_outputs(server: &ModelServer) -> Vec<(String, String)> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for r in server.requests() {
        let body = r.json();
        let items = body["input"]
            .as_array()
            .into_iter()
            .chain(body["messages"].as_array())
            .flatten();
        for item in items {
            let (id, content) = if item["type"] == "function_call_output" {
                (&item["call_id"], &item["output"])
            } else if item["role"] == "tool" {
                (&item["tool_call_id"], &item["content"])
            } else {
                continue;
            };
            let id = id.as_str().unwrap_or("").to_string();
            if !out.iter().any(|(seen, _)| *seen == id) {
                out.push((id, text(content)));
            }
        }
    }
    out
}

/// The names of the function tools the agent's first request offered
/// (Responses' flat `name`, Chat Completions' `function.name`).
fn offered_tools(server: &ModelServer) -> Vec<String> {
    let first = server
        .requests()
        .first()
        .map(|r| r.json())
        .unwrap_or_default();
    first["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().or(t["function"]["name"].as_str()))
        .map(str::to_string)
        .collect()
}

fn run_agent(
    state: &State,
    agent: &str,
    repo: &std::path::Path,
    task: &str,
) -> (std::process::Output, String) {
    let out = state.run(&[
        "run",
        "--agent",
        agent,
        "--task",
        task,
        "--repo",
        repo.to_str().unwrap(),
    ]);
    let runs = state.runs();
    let id = runs.last().expect("a run")["id"]
        .as_str()
        .unwrap()
        .to_string();
    (out, id)
}

/// The shell command that writes `hello.txt` with `text`, commits it as
/// `who` and prints the commit's subject.
fn write_and_commit(text: &str, who: &str) -> String {
    format!(
        "printf '{text}\\n' > hello.txt && git add hello.txt && \
         git -c user.name={who} -c user.email={who}@localhost commit -q -m 'Add hello.txt' && \
         git log --format=%s -1"
    )
}

/// The agent's commit arrived on the run branch with its file, the host's
/// own branch untouched; every call went through the gateway to endpoint
/// `oai` and is audited with the tokens the model reported.
fn assert_committed_and_audited(state: &State, repo: &std::path::Path, id: &str, text: &str) {
    let reference = format!("refs/nightshift/runs/{id}");
    let subjects = git(repo, &["log", "--format=%s", &reference]);
    assert!(subjects.lines().any(|s| s == "Add hello.txt"), "{subjects}");
    assert_eq!(
        git(repo, &["show", &format!("{reference}:hello.txt")]),
        format!("{text}\n")
    );
    assert_eq!(git(repo, &["log", "--format=%s", "main"]).trim(), "initial");
    let calls = model_calls(state, id);
    assert!(!calls.is_empty());
    for c in &calls {
        assert_eq!(c["endpoint"], "oai", "{c}");
        assert_eq!(c["outcome"], "ok", "{c}");
        assert_eq!(c["input_tokens"], 30, "{c}");
        assert_eq!(c["output_tokens"], 9, "{c}");
    }
    assert!(state.containers().is_empty());
}

#[test]
fn real_codex_edits_a_file_and_commits_over_the_responses_api_and_the_change_arrives() {
    let server = ModelServer::start();
    server.steps_only_for_tool_requests();
    server.push(
        Step::tool(
            "exec_command",
            json!({"cmd": write_and_commit("hello from codex", "codex")}),
        )
        .usage(30, 9),
    );
    server.push(Step::text("Added hello.txt and committed it.").usage(30, 9));
    let state = state_with_models(&server);
    let repo = make_repo();
    let (out, id) = run_agent(&state, "codex", repo.path(), "Add hello.txt and commit it.");
    let log = state.output_log(&id);
    assert!(
        out.status.success(),
        "{}{}\n{log}",
        stdout(&out),
        stderr(&out)
    );
    // Codex offered its shell tool under the name scripted here, and spoke
    // the Responses API, streaming, with the real key put in by the gateway.
    assert!(
        offered_tools(&server).iter().any(|t| t == "exec_command"),
        "{:?}",
        offered_tools(&server)
    );
    let reqs = server.requests();
    assert!(reqs.len() >= 2, "{reqs:?}");
    for r in &reqs {
        assert_eq!(r.path, "/v1/responses");
        assert_eq!(r.json()["stream"], true);
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {OPENAI_KEY}").as_str())
        );
    }
    // The command ran in the worktree and Codex got its output back.
    let outputs = tool_outputs(&server);
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    assert!(outputs[0].1.contains("Add hello.txt"), "{outputs:?}");
    assert!(log.contains("Added hello.txt and committed it."), "{log}");
    assert_eq!(model_calls(&state, &id).len(), reqs.len());
    assert_committed_and_audited(&state, repo.path(), &id, "hello from codex");
    assert!(!log.contains(OPENAI_KEY));
}

/// Runs Codex on `repo` with a scripted `rm -r`; asserts its hook refused
/// it through the door, audited, the sentinel file surviving.
fn codex_refuses_a_scripted_recursive_rm(repo: &std::path::Path) {
    let server = ModelServer::start();
    server.steps_only_for_tool_requests();
    server.push(Step::tool(
        "exec_command",
        json!({"cmd": "rm -r /workspace/src"}),
    ));
    server.push(Step::tool(
        "exec_command",
        json!({"cmd": "test -f /workspace/src/lib.txt && echo SENTINEL-SURVIVED || echo SENTINEL-GONE"}),
    ));
    server.push(Step::text("Done."));
    let state = state_with_models(&server);
    tests::agents::refuse_recursive_deletes(&state);
    let (out, id) = run_agent(&state, "codex", repo, "Clean up the src directory.");
    let log = state.output_log(&id);
    assert!(
        out.status.success(),
        "{}{}\n{log}",
        stdout(&out),
        stderr(&out)
    );
    // The model got the refusal, with its reason, as the rm's output; the
    // rm never ran: the sentinel file survived it.
    let outputs = tool_outputs(&server);
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert!(
        outputs[0].1.contains("Command blocked by PreToolUse hook")
            && outputs[0]
                .1
                .contains(tests::agents::RECURSIVE_DELETE_REFUSAL),
        "{outputs:?}"
    );
    assert!(outputs[1].1.contains("SENTINEL-SURVIVED"), "{outputs:?}");
    // The refusal is audited with the run, the tool and the rule.
    tests::agents::assert_one_recursive_delete_refused(&state, &id);
}

#[test]
fn real_codexs_hook_refuses_a_scripted_recursive_rm_through_the_door() {
    let repo = make_repo();
    codex_refuses_a_scripted_recursive_rm(repo.path());
}

#[test]
fn a_repository_s_own_codex_configuration_cannot_switch_off_the_hook() {
    // A project .codex/config.toml that would replace the hooks and turn
    // the feature off, and a hooks.json beside it: Codex loads a project's
    // configuration only for a project the user configuration trusts, and
    // the preset's trusts none.
    let repo = make_repo();
    tests::agents::commit_files(
        repo.path(),
        &[
            (
                ".codex/config.toml",
                "[features]\nhooks = false\n\n[[hooks.PreToolUse]]\nmatcher = \"NoSuchTool\"\n\n[[hooks.PreToolUse.hooks]]\ntype = \"command\"\ncommand = \"true\"\n",
            ),
            (".codex/hooks.json", r#"{"hooks":{}}"#),
        ],
    );
    codex_refuses_a_scripted_recursive_rm(repo.path());
}

#[test]
fn real_mini_swe_agent_edits_a_file_and_commits_over_chat_completions_and_the_change_arrives() {
    let server = ModelServer::start();
    server.steps_only_for_tool_requests();
    server.push(
        Step::tool(
            "bash",
            json!({"command": write_and_commit("hello from mini", "mini")}),
        )
        .usage(30, 9),
    );
    server.push(
        Step::tool(
            "bash",
            json!({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
        )
        .usage(30, 9),
    );
    let state = state_with_models(&server);
    let repo = make_repo();
    let (out, id) = run_agent(
        &state,
        "mini-swe-agent",
        repo.path(),
        "Add hello.txt and commit it.",
    );
    let log = state.output_log(&id);
    assert!(
        out.status.success(),
        "{}{}\n{log}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(offered_tools(&server), ["bash"]);
    // Exactly the two scripted turns: the agent stopped at the submit
    // command, having got the commit's output back.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}\n{log}");
    for r in &reqs {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {OPENAI_KEY}").as_str())
        );
    }
    let outputs = tool_outputs(&server);
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    assert!(outputs[0].1.contains("Add hello.txt"), "{outputs:?}");
    assert_eq!(model_calls(&state, &id).len(), 2);
    assert_committed_and_audited(&state, repo.path(), &id, "hello from mini");
    assert!(!log.contains(OPENAI_KEY));
}

#[test]
fn real_aider_edits_a_file_and_commits_it_itself_and_the_change_arrives() {
    // Aider offers no tools: the model answers with an edit block in its
    // `diff` format (gpt-5-mini's), and aider commits the edit itself with
    // a message its weak model writes (the next call).
    let server = ModelServer::start();
    server.push(
        Step::text(
            "I will create hello.txt.\n\nhello.txt\n```\n<<<<<<< SEARCH\n=======\n\
             hello from aider\n>>>>>>> REPLACE\n```\n",
        )
        .usage(30, 9),
    );
    server.push(Step::text("Add hello.txt").usage(30, 9));
    let state = state_with_models(&server);
    let repo = make_repo();
    let out = state.run(&[
        "run",
        "--agent",
        "aider",
        "--model",
        "gpt-5-mini",
        "--task",
        "Create hello.txt containing the line: hello from aider",
        "--repo",
        repo.path().to_str().unwrap(),
    ]);
    let id = state.runs().last().expect("a run")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let log = state.output_log(&id);
    assert!(
        out.status.success(),
        "{}{}\n{log}",
        stdout(&out),
        stderr(&out)
    );
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}\n{log}");
    for r in &reqs {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {OPENAI_KEY}").as_str())
        );
    }
    assert_eq!(model_calls(&state, &id).len(), reqs.len());
    assert_committed_and_audited(&state, repo.path(), &id, "hello from aider");
    assert!(!log.contains(OPENAI_KEY));
}

#[test]
fn aider_is_refused_on_a_repository_that_has_its_own_aider_configuration() {
    // Aider reads these at the repository's root whatever its flags say: a
    // committed .aider.conf.yml could make it run a command after each edit
    // (auto-test), which the preset never lets it do. No run starts.
    for (file, text) in [
        (".aider.conf.yml", "auto-test: true\ntest-cmd: rm -rf src\n"),
        (".env", "OPENAI_API_BASE=http://127.0.0.1:9/v1\n"),
        (
            ".aider.model.settings.yml",
            "- name: openai/gpt-4.1\n  edit_format: whole\n",
        ),
    ] {
        let server = ModelServer::start();
        let state = state_with_models(&server);
        let repo = make_repo();
        tests::agents::commit_files(repo.path(), &[(file, text)]);
        let out = state.run(&[
            "run",
            "--agent",
            "aider",
            "--task",
            "Anything.",
            "--repo",
            repo.path().to_str().unwrap(),
        ]);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{file}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{file:?}")) && err.contains("the aider preset would load it"),
            "{err}"
        );
        assert!(state.runs().is_empty(), "{file}: a run started");
        assert!(server.requests().is_empty());
        assert!(state.containers().is_empty());
    }
}
