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
             [endpoints.oai]\napi = \"openai\"\nbase_url = \"{url}/v1\"\nkey_file = \"{}\"\nmodels = [\"gpt-5*\"]\n",
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
