//! Agent presets: `nightshift run --agent PRESET` picks the image, the
//! command line and the environment of a real agent, so that the user
//! need not know each agent's flags.
//!
//! Invariants:
//! - Pure: a preset and an optional model name in, an image reference and
//!   a command out. The agent's own flags live in its image
//!   (`sandbox-image/agents/<preset>/run.sh`, installed as
//!   `/usr/local/bin/nightshift-agent` and an input of the image's digest),
//!   so the command and the image can never disagree
//!   (`tests::each_preset_runs_its_images_entrypoint`,
//!   `orchestrator/engine-docker/src/image.rs::tests::agent_references_are_distinct_and_follow_their_inputs`).
//! - Each preset runs its agent headless, with its own sandbox and
//!   permission prompts off (nightshift is the sandbox), stdin closed, the
//!   task from `$NIGHTSHIFT_TASK` and the model through the gateway's
//!   environment; Claude Code's and Codex's every tool call asks the run's
//!   rules through the door first (their PreToolUse hook, `nightshift-act
//!   policy-check`, fail closed).
//! - A model name is a name, never an option: it is refused unless it is
//!   1 to 128 of `A-Z a-z 0-9 . _ : / -` not starting with `-`
//!   (`tests::a_model_name_is_never_an_option_or_a_second_word`).
//! - A preset's agent loads only the configuration nightshift writes, never
//!   the repository's: Claude Code is started with `--setting-sources user
//!   --strict-mcp-config` (a committed `.claude/settings.json` with
//!   `disableAllHooks` is never read); Codex's bypass flags make it trust
//!   the project and load its `.codex/config.toml` (which could replace the
//!   hooks or turn them off), so the configuration `run.sh` writes declares
//!   the worktree `/workspace` untrusted and Codex loads none of the
//!   project's `.codex/`; mini-swe-agent reads its
//!   configuration from its package and `$HOME` (the sandbox's tmpfs).
//!   Aider always reads `.aider.conf.yml`, `.env`, `.aider.model.settings.yml`
//!   and `.aider.model.metadata.json` at the repository's root and cannot be
//!   told not to: a run of the aider preset on a base commit that has any of
//!   them is refused before it starts ([`project_config_refusal`]), naming
//!   the files (`tests::claude_code_and_codex_load_only_the_configuration_their_presets_write`,
//!   `tests::only_aider_has_project_configuration_it_cannot_ignore`,
//!   `tests/tests/real_agents.rs::a_repository_s_own_claude_settings_cannot_switch_off_the_hook`,
//!   `tests/tests/real_agents_more.rs::a_repository_s_own_codex_configuration_cannot_switch_off_the_hook`,
//!   `tests/tests/real_agents_more.rs::aider_is_refused_on_a_repository_that_has_its_own_aider_configuration`).

use std::path::Path;

use nightshift_engine_docker::image::Agent;
use nightshift_gateway::models::{glob_match, Api, Models};

/// Files at a repository's root that `agent` would read as its own
/// configuration and that no flag switches off.
pub fn project_config(agent: Agent) -> &'static [&'static str] {
    match agent {
        Agent::Aider => &[
            ".aider.conf.yml",
            ".env",
            ".aider.model.settings.yml",
            ".aider.model.metadata.json",
        ],
        Agent::ClaudeCode | Agent::Codex | Agent::MiniSweAgent | Agent::PythonSdks => &[],
    }
}

/// The refusal of a run of `agent` on a base commit whose root holds
/// `present` (those of [`project_config`] it has), or `Ok` when it holds none.
pub fn project_config_refusal(agent: Agent, present: &[String]) -> Result<(), String> {
    if present.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = present.iter().map(|n| format!("{n:?}")).collect();
    Err(format!(
        "the repository's base commit has {}: the {} preset would load it as its own configuration \
         (it cannot be told not to), which could change what the agent runs; remove it from the \
         base, or run another preset",
        names.join(", "),
        agent.name()
    ))
}

/// Checks the base commit `base_ref` of the host repository `repo` (its
/// objects only) for `agent`'s project configuration; refused as
/// [`project_config_refusal`] says. A ref or repository that cannot be read
/// is left to the run, which refuses it with its own error.
pub fn check_repository(agent: Agent, repo: &Path, base_ref: &str) -> Result<(), String> {
    let names = project_config(agent);
    if names.is_empty() {
        return Ok(());
    }
    match orchestrator_git::root_entries(repo, base_ref, names) {
        Ok(present) => project_config_refusal(agent, &present),
        Err(_) => Ok(()),
    }
}

/// The model a preset's agent asks for when `--model` names none (its
/// `run.sh`'s default; `None`: the agent's own choice, Claude Code's, or the
/// task's, python-sdks').
pub fn default_model(agent: Agent) -> Option<&'static str> {
    match agent {
        Agent::Codex => Some("gpt-5-codex"),
        Agent::MiniSweAgent => Some("gpt-5-mini"),
        Agent::Aider => Some("gpt-4.1"),
        Agent::ClaudeCode | Agent::PythonSdks => None,
    }
}

/// The API family a preset's agent speaks to the gateway (`None`: any,
/// python-sdks' task decides).
pub fn api_of(agent: Agent) -> Option<Api> {
    match agent {
        Agent::ClaudeCode => Some(Api::Anthropic),
        Agent::Codex | Agent::MiniSweAgent | Agent::Aider => Some(Api::Openai),
        Agent::PythonSdks => None,
    }
}

/// Before a run of `agent` starts: the models configuration it would
/// reach its model through (`None`: there is no `STATE/models.toml`),
/// checked for an endpoint of the agent's API family whose globs cover the
/// model it will ask for (`model`, else [`default_model`]). Returns the
/// key file of that endpoint, for the caller to check (it is read, not
/// here). Each refusal names the fix. python-sdks (the tests' preset, whose
/// task is a program) is not checked.
pub fn preflight<'m>(
    agent: Agent,
    model: Option<&str>,
    models: Option<&'m Models>,
    models_path: &Path,
) -> Result<Option<&'m Path>, String> {
    let Some(api) = api_of(agent) else {
        return Ok(None);
    };
    let Some(models) = models else {
        return Err(format!(
            "there is no {}: the {} preset's agent reaches its model only through nightshift's \
             model gateway; write it with an {} endpoint and its key file (docs/models.md, \
             docs/models.example.toml)",
            models_path.display(),
            agent.name(),
            api.name()
        ));
    };
    let family: Vec<_> = models.endpoints.iter().filter(|e| e.api == api).collect();
    if family.is_empty() {
        return Err(format!(
            "{} has no {} endpoint, which the {} preset's agent speaks; add one (docs/models.md)",
            models_path.display(),
            api.name(),
            agent.name()
        ));
    }
    let Some(model) = model.or(default_model(agent)) else {
        // The agent picks its own model: any endpoint of its family.
        return Ok(Some(&family[0].key_file));
    };
    match family
        .iter()
        .find(|e| e.models.iter().any(|g| glob_match(g, model)))
    {
        Some(e) => Ok(Some(&e.key_file)),
        None => {
            let globs: Vec<&str> = family
                .iter()
                .flat_map(|e| e.models.iter().map(String::as_str))
                .collect();
            let asked = match model == default_model(agent).unwrap_or_default() {
                true => format!("its default model {model:?} (docs/agents.md)"),
                false => format!("model {model:?}"),
            };
            Err(format!(
                "the {} preset's agent would ask for {asked}, which no {} endpoint of {} serves \
                 (their models: {}); add a glob that covers it to an endpoint's `models`, or pass \
                 --model with one they cover",
                agent.name(),
                api.name(),
                models_path.display(),
                globs.join(", ")
            ))
        }
    }
}

/// [`preflight`] on the state directory `root`'s `models.toml`, then the
/// endpoint's key file checked as the gateway would read it (the
/// supervisor's own, no access for group or others, not empty): the key
/// is read and dropped at once, never kept or shown.
pub fn check_ready(agent: Agent, model: Option<&str>, root: &Path) -> Result<(), String> {
    let path = root.join(nightshift_gateway::models::FILE);
    let models = nightshift_gateway::load(root).map_err(|e| e.to_string())?;
    let Some(key_file) = preflight(agent, model, models.as_ref(), &path)? else {
        return Ok(());
    };
    nightshift_gateway::key::read(key_file)
        .map(drop)
        .map_err(|e| {
            format!(
            "{e}: the gateway could not use it, and the {} preset's agent would reach no model; \
             make it a file of the supervisor's user with its key, mode 0600 (chmod 600)",
            agent.name()
        )
        })
}

/// Names at the worktree's top that `agent` writes for itself (its chat
/// and input history, its caches): left out of the run's result unless
/// the tip tracks them (`orchestrator_git::ImportSpec::leave_out`).
pub fn bookkeeping(agent: Agent) -> &'static [&'static str] {
    match agent {
        Agent::Aider => &[
            ".aider.chat.history.md",
            ".aider.input.history",
            ".aider.llm.history",
            ".aider.tags.cache.v*",
        ],
        Agent::ClaudeCode | Agent::Codex | Agent::MiniSweAgent | Agent::PythonSdks => &[],
    }
}

/// The preset whose image a run's `image` reference names
/// (`nightshift-agent-PRESET:...`), if any.
pub fn of_image(image: &str) -> Option<Agent> {
    Agent::ALL.into_iter().find(|a| {
        image
            .strip_prefix("nightshift-agent-")
            .and_then(|rest| rest.strip_prefix(a.name()))
            .is_some_and(|rest| rest.starts_with(':'))
    })
}

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
    fn claude_code_and_codex_load_only_the_configuration_their_presets_write() {
        let claude = Agent::ClaudeCode.run_script();
        assert!(claude.contains("--setting-sources user --strict-mcp-config"));
        let codex = Agent::Codex.run_script();
        assert!(codex.contains(&format!(
            "[projects.\"{}\"]\ntrust_level = \"untrusted\"",
            nightshift_core::sandbox::WORKSPACE
        )));
    }

    #[test]
    fn only_aider_has_project_configuration_it_cannot_ignore() {
        for agent in Agent::ALL {
            assert!(project_config_refusal(agent, &[]).is_ok());
            assert_eq!(project_config(agent).is_empty(), agent != Agent::Aider);
        }
        let e = project_config_refusal(Agent::Aider, &[".aider.conf.yml".into()]).unwrap_err();
        assert!(
            e.contains("\".aider.conf.yml\"") && e.contains("aider preset"),
            "{e}"
        );
    }

    #[test]
    fn aiders_bookkeeping_is_left_out_of_its_runs_results() {
        for agent in Agent::ALL {
            assert_eq!(of_image(&agent.reference()), Some(agent));
        }
        assert_eq!(of_image("nightshift-sandbox:abc"), None);
        assert_eq!(of_image("nightshift-agent-aiderx:abc"), None);
        let aider = bookkeeping(Agent::Aider);
        for name in [".aider.chat.history.md", ".aider.input.history"] {
            assert!(aider.contains(&name), "{name}");
        }
        assert!(aider.contains(&".aider.tags.cache.v*"));
        assert!(bookkeeping(Agent::ClaudeCode).is_empty());
    }

    #[test]
    fn a_model_name_is_never_an_option_or_a_second_word() {
        for bad in ["", "-rf", "--yolo", "a b", "a;b", "a\nb", &"m".repeat(129)] {
            assert!(preset(Agent::Aider, Some(bad)).is_err(), "{bad:?}");
        }
    }

    fn models(text: &str) -> Models {
        Models::parse(Path::new("/s/models.toml"), text).unwrap()
    }

    const BOTH: &str = "[endpoints.a]\napi = \"anthropic\"\nbase_url = \"https://a.example\"\n\
        key_file = \"/k/a\"\nmodels = [\"claude-*\"]\n\
        [endpoints.o]\napi = \"openai\"\nbase_url = \"https://o.example\"\n\
        key_file = \"/k/o\"\nmodels = [\"gpt-5*\"]\n";

    #[test]
    fn a_preset_is_refused_before_it_starts_without_a_model_it_can_reach() {
        let path = Path::new("/s/models.toml");
        // No models.toml: every preset but the tests' is refused, naming the file.
        for agent in [
            Agent::ClaudeCode,
            Agent::Codex,
            Agent::MiniSweAgent,
            Agent::Aider,
        ] {
            let e = preflight(agent, None, None, path).unwrap_err();
            assert!(
                e.contains("there is no /s/models.toml") && e.contains("docs/models.md"),
                "{e}"
            );
        }
        assert_eq!(preflight(Agent::PythonSdks, None, None, path), Ok(None));
        let both = models(BOTH);
        // Defaults covered by the globs: the endpoint's key file comes back.
        assert_eq!(
            preflight(Agent::Codex, None, Some(&both), path),
            Ok(Some(Path::new("/k/o")))
        );
        assert_eq!(
            preflight(Agent::ClaudeCode, None, Some(&both), path),
            Ok(Some(Path::new("/k/a")))
        );
        // aider's default (gpt-4.1) is not covered: the refusal says which
        // model, that it is the default, and the fix.
        let e = preflight(Agent::Aider, None, Some(&both), path).unwrap_err();
        assert!(
            e.contains("its default model \"gpt-4.1\"")
                && e.contains("gpt-5*")
                && e.contains("--model"),
            "{e}"
        );
        assert!(preflight(Agent::Aider, Some("gpt-5-mini"), Some(&both), path).is_ok());
        let e = preflight(Agent::Codex, Some("o3"), Some(&both), path).unwrap_err();
        assert!(e.contains("model \"o3\""), "{e}");
        // No endpoint of the agent's family at all.
        let only_openai = models(&BOTH[BOTH.find("[endpoints.o]").unwrap()..]);
        let e = preflight(Agent::ClaudeCode, None, Some(&only_openai), path).unwrap_err();
        assert!(e.contains("has no anthropic endpoint"), "{e}");
    }

    #[test]
    fn each_presets_documented_default_model_is_its_scripts() {
        let docs = include_str!("../../../docs/agents.md");
        for agent in Agent::ALL {
            if let Some(model) = default_model(agent) {
                assert!(
                    agent.run_script().contains(&format!(":-{model}}}")),
                    "{}",
                    agent.name()
                );
                assert!(
                    docs.contains(&format!("| `{}` | `{model}` |", agent.name())),
                    "{}",
                    agent.name()
                );
            }
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
