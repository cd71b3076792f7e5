//! Agent images and presets through real sandboxes: the preset picks its
//! image and command, the agent installed from PyPI runs inside Tier 0, and
//! Claude Code's image holds the real CLI. The images are built by
//! scripts/test.sh when missing (`nightshift image build --agent ...`).

use tests::{make_repo, only_run, stderr, stdout, State};

fn agent_image(preset: &str) -> String {
    let out = State::new().run(&["image", "ref", "--agent", preset]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

#[test]
fn a_preset_runs_its_agent_image_with_the_task() {
    let state = State::new();
    let repo = make_repo();
    let task = "import openai, anthropic; print('sdks', openai.__version__, anthropic.__version__)";
    let out = state.run(&[
        "run",
        "--agent",
        "python-sdks",
        "--task",
        task,
        "--repo",
        repo.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let run = only_run(&state);
    assert_eq!(run["image"], agent_image("python-sdks"));
    assert_eq!(run["command"], serde_json::json!(["nightshift-agent"]));
    let log = state.output_log(run["id"].as_str().unwrap());
    assert!(log.contains("sdks 3.57.0 2.15.0"), "{log}");
    assert!(state.containers().is_empty());
}

#[test]
fn a_preset_refuses_a_model_that_is_an_option_and_an_unknown_preset() {
    let state = State::new();
    let repo = make_repo();
    let repo = repo.path().to_str().unwrap();
    let out = state.run(&[
        "run", "--agent", "codex", "--model", "--yolo", "--task", "t", "--repo", repo,
    ]);
    assert_ne!(out.status.code(), Some(0));
    let out = state.run(&[
        "run",
        "--agent",
        "codex",
        "--model=-x",
        "--task",
        "t",
        "--repo",
        repo,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("a model name is"), "{}", stderr(&out));
    let out = state.run(&["run", "--agent", "cursor", "--task", "t", "--repo", repo]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the presets are claude-code"),
        "{}",
        stderr(&out)
    );
    assert!(state.runs().is_empty());
}

#[test]
fn the_claude_code_image_holds_the_real_cli_and_its_preset_installs_the_door_hook() {
    let state = State::new();
    let repo = make_repo();
    let image = agent_image("claude-code");
    // The preset's script as the image holds it, and the real CLI's version.
    let out = state.run(&[
        "run",
        "--image",
        &image,
        "--repo",
        repo.path().to_str().unwrap(),
        "--",
        "bash",
        "-c",
        "claude --version; grep -c 'nightshift-act policy-check || exit 2' /usr/local/bin/nightshift-agent",
    ]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let run = only_run(&state);
    let log = state.output_log(run["id"].as_str().unwrap());
    assert!(log.contains("(Claude Code)"), "{log}");
    assert!(log.lines().any(|l| l.trim() == "1"), "{log}");
}
