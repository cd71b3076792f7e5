//! Agent presets: `nightshift run --agent PRESET` picks the image, the
//! command line and the environment of a real agent, so that the user
//! need not know each agent's flags.
//!
//! Invariants:
//! - Pure: a preset and an optional model name in, an image reference and
//!   a command out. The agent's own flags live in its image
//!   (`sandbox-image/agents/<preset>/run.sh`, installed as
//!   `/usr/local/bin/nightshift-agent` and an input of the image's digest),
//!   so the command and the image can never disagree.
//! - Each preset runs its agent headless, with its own sandbox and
//!   permission prompts off (nightshift is the sandbox), stdin closed, the
//!   task from `$NIGHTSHIFT_TASK` and the model through the gateway's
//!   environment; Claude Code's and Codex's every tool call asks the run's
//!   rules through the door first (their PreToolUse hook, `nightshift-act
//!   policy-check`, fail closed).
//! - A model name is a name, never an option: it is refused unless it is
//!   1 to 128 of `A-Z a-z 0-9 . _ : / -` not starting with `-`.

use crate::image::Agent;

/// The command every agent image runs: its preset's `run.sh`.
pub const ENTRYPOINT: &str = "nightshift-agent";
/// The variable the preset's script reads the model name from.
pub const MODEL_ENV: &str = "NIGHTSHIFT_AGENT_MODEL";

/// What a preset gives a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preset {
    /// The agent image's reference (built by `nightshift image build --agent`).
    pub image: String,
    /// The command the sandbox runs.
    pub command: Vec<String>,
}

/// The preset's image and command, with `model` (if any) for the agent.
pub fn preset(agent: Agent, model: Option<&str>) -> Result<Preset, String> {
    let mut command = Vec::new();
    if let Some(model) = model {
        check_model(model)?;
        command.extend(["env".to_string(), format!("{MODEL_ENV}={model}")]);
    }
    command.push(ENTRYPOINT.to_string());
    Ok(Preset {
        image: agent.reference(),
        command,
    })
}

fn check_model(model: &str) -> Result<(), String> {
    let ok = !model.is_empty()
        && model.len() <= 128
        && !model.starts_with('-')
        && model
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--model {model:?}: a model name is 1 to 128 of A-Z a-z 0-9 . _ : / -, not starting with -"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_preset_runs_its_images_entrypoint() {
        for agent in Agent::ALL {
            let p = preset(agent, None).unwrap();
            assert_eq!(p.image, agent.reference());
            assert_eq!(p.command, [ENTRYPOINT]);
            assert!(agent.run_script().starts_with("#!/bin/bash"));
        }
        let p = preset(Agent::Codex, Some("gpt-5-codex")).unwrap();
        assert_eq!(
            p.command,
            ["env", "NIGHTSHIFT_AGENT_MODEL=gpt-5-codex", ENTRYPOINT]
        );
    }

    #[test]
    fn the_presets_run_their_agents_headless_as_documented() {
        let claude = Agent::ClaudeCode.run_script();
        assert!(claude.contains("claude \"${args[@]}\" </dev/null"));
        assert!(claude.contains("-p \"$NIGHTSHIFT_TASK\""));
        assert!(claude.contains("nightshift-act policy-check || exit 2"));
        assert!(claude.contains("\"PreToolUse\""));
        let codex = Agent::Codex.run_script();
        assert!(codex.contains("codex exec --dangerously-bypass-approvals-and-sandbox"));
        assert!(codex.contains("wire_api = \"responses\""));
        assert!(codex.contains("env_key = \"OPENAI_API_KEY\""));
        assert!(codex.contains("</dev/null"));
        // Codex runs only hooks it trusts and skips the others silently:
        // without the bypass its PreToolUse hook would never run.
        assert!(codex.contains("[[hooks.PreToolUse]]"));
        assert!(codex.contains("command = \"nightshift-act policy-check || exit 2\""));
        assert!(codex.contains("--dangerously-bypass-hook-trust"));
        assert!(Agent::MiniSweAgent
            .run_script()
            .contains("mini --yolo --exit-immediately"));
        assert!(Agent::Aider.run_script().contains("aider --yes-always"));
        assert!(Agent::Aider
            .run_script()
            .contains("--message \"$NIGHTSHIFT_TASK\""));
    }

    #[test]
    fn a_model_name_is_never_an_option_or_a_second_word() {
        for bad in ["", "-rf", "--yolo", "a b", "a;b", "a\nb", &"m".repeat(129)] {
            assert!(preset(Agent::Aider, Some(bad)).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn any_accepted_model_is_one_env_assignment(model in ".{0,40}") {
            if let Ok(p) = preset(Agent::ClaudeCode, Some(&model)) {
                prop_assert_eq!(p.command.len(), 3);
                prop_assert_eq!(&p.command[1], &format!("{MODEL_ENV}={model}"));
                prop_assert!(!model.starts_with('-') && !model.contains(char::is_whitespace));
            }
        }
    }
}
