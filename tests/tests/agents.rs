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

/// A new user's first night: a preset's run that could reach no model is
/// refused before anything starts, each refusal naming its fix, and a
/// preset without a task is a usage error.
#[test]
fn a_preset_run_that_could_reach_no_model_is_refused_before_it_starts() {
    use std::os::unix::fs::PermissionsExt;
    let state = State::new();
    let repo = make_repo();
    let repo = repo.path().to_str().unwrap();
    let refused = |args: &[&str], code: i32, needles: &[&str]| {
        let out = state.run(args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        for n in needles {
            assert!(
                stderr(&out).contains(n),
                "{args:?}: {n:?} in {}",
                stderr(&out)
            );
        }
    };
    refused(&["run", "--agent", "codex", "--repo", repo], 2, &["--task"]);
    refused(
        &["enqueue", "--agent", "codex", "--repo", repo],
        2,
        &["--task"],
    );
    let codex = ["run", "--agent", "codex", "--task", "t", "--repo", repo];
    refused(
        &codex,
        3,
        &["there is no ", "models.toml", "docs/models.md"],
    );
    let key = state.path().join("openai.key");
    std::fs::write(&key, "sk-test\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(
        state.path().join("models.toml"),
        format!(
            "[endpoints.oai]\napi = \"openai\"\nbase_url = \"https://o.example/v1\"\nkey_file = \"{}\"\nmodels = [\"gpt-5*\"]\n",
            key.display()
        ),
    )
    .unwrap();
    refused(&codex, 3, &["has mode 0644", "chmod 600"]);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(
        &["run", "--agent", "aider", "--task", "t", "--repo", repo],
        3,
        &["its default model \"gpt-4.1\"", "gpt-5*", "--model"],
    );
    refused(
        &[
            "run",
            "--agent",
            "claude-code",
            "--task",
            "t",
            "--repo",
            repo,
        ],
        3,
        &["has no anthropic endpoint"],
    );
    assert!(state.runs().is_empty());
}
