//! Helpers shared by the tests of real agents through the model gateway
//! (tests/tests/real_agents*.rs): a state whose `models.toml` points both
//! API families at the scripted model server, and a run's `model_call`
//! audit entries.

use std::os::unix::fs::PermissionsExt;

use serde_json::Value;

use crate::model::ModelServer;
use crate::State;

/// The real OpenAI key the gateway holds (in a file of the state).
pub const OPENAI_KEY: &str = "sk-real-model-key-51ab3e";
/// The real Anthropic key the gateway holds (in a file of the state).
pub const ANTHROPIC_KEY: &str = "sk-ant-real-key-c0ffee77";

/// A state whose `models.toml` points both API families at `server`, each
/// key in a private file: endpoint `claude` (Messages, `claude-*`) and
/// endpoint `oai` (Chat Completions and Responses, `gpt-5*`).
pub fn state_with_models(server: &ModelServer) -> State {
    state_with_models_and(server, "")
}

/// [`state_with_models`], with `extra` appended to `models.toml` (e.g. a
/// `[gateway]` table).
pub fn state_with_models_and(server: &ModelServer, extra: &str) -> State {
    let state = State::new();
    let secrets = state.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let key_file = |name: &str, key: &str| {
        let p = secrets.join(name);
        std::fs::write(&p, format!("{key}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    };
    let openai = key_file("openai.key", OPENAI_KEY);
    let anthropic = key_file("anthropic.key", ANTHROPIC_KEY);
    std::fs::write(
        state.path().join("models.toml"),
        format!(
            "[endpoints.claude]\napi = \"anthropic\"\nbase_url = \"{url}\"\nkey_file = \"{}\"\nmodels = [\"claude-*\"]\n\n\
             [endpoints.oai]\napi = \"openai\"\nbase_url = \"{url}/v1\"\nkey_file = \"{}\"\nmodels = [\"gpt-5*\"]\n\n{extra}",
            anthropic.display(),
            openai.display(),
            url = server.url(),
        ),
    )
    .unwrap();
    state
}

/// The bodies of run `run`'s `model_call` audit entries, in order.
pub fn model_calls(state: &State, run: &str) -> Vec<Value> {
    state.show(run)["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "model_call")
        .map(|e| e["body"].clone())
        .collect()
}

/// The reason the rule of [`refuse_recursive_deletes`] gives.
pub const RECURSIVE_DELETE_REFUSAL: &str =
    "refused by rule no-recursive-delete: Recursive deletes are not done by agents";

/// Gives `state` the optional rule nightshift ships that refuses a
/// recursive `rm` through the harness hook (tool `Bash`,
/// `policies/rules/optional/no-recursive-delete.toml`), as the hook tests of real
/// agents need it.
pub fn refuse_recursive_deletes(state: &State) {
    assert!(state.run(&["runs"]).status.success());
    let rules = state.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("10-tools.toml"),
        include_str!("../../policies/rules/optional/no-recursive-delete.toml"),
    )
    .unwrap();
}

/// Commits `files` (path in the repository, text) to `repo`'s `main`, as a
/// repository that ships its own harness configuration would.
pub fn commit_files(repo: &std::path::Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = repo.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    crate::git(repo, &["add", "-A", "-f"]);
    crate::git(
        repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@localhost",
            "commit",
            "-q",
            "-m",
            "the project's own harness configuration",
        ],
    );
}

/// Asserts that run `run` has exactly one policy decision, the refusal of
/// [`refuse_recursive_deletes`]'s rule for its `Bash` call, that the audit
/// chain verifies and that no container is left.
pub fn assert_one_recursive_delete_refused(state: &State, run: &str) {
    let audit = state.show(run)["audit"].as_array().unwrap().clone();
    let refusals: Vec<&Value> = audit
        .iter()
        .filter(|e| e["kind"] == "policy_decision")
        .map(|e| &e["body"])
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0]["door"], "Bash");
    assert_eq!(refusals[0]["verdict"], "refuse");
    assert_eq!(refusals[0]["rule"], "no-recursive-delete");
    assert_eq!(refusals[0]["actor"], format!("run-{run}"));
    assert!(state.verify().status.success());
    assert!(state.containers().is_empty());
}
