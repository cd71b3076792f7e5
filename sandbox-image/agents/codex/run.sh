#!/bin/bash
# nightshift preset codex: Codex CLI `exec` on $NIGHTSHIFT_TASK, its own
# sandbox and approvals off (nightshift is the sandbox), stdin closed, the
# model reached through the gateway: a generated ~/.codex/config.toml
# provider (Responses API, $OPENAI_BASE_URL, key from $OPENAI_API_KEY).
set -euo pipefail
mkdir -p "$HOME/.codex"
if [ ! -e "$HOME/.codex/config.toml" ]; then
  cat > "$HOME/.codex/config.toml" <<TOML
model = "${NIGHTSHIFT_AGENT_MODEL:-gpt-5-codex}"
model_provider = "nightshift"

[model_providers.nightshift]
name = "nightshift model gateway"
base_url = "${OPENAI_BASE_URL:-http://127.0.0.1:1/v1}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
TOML
fi
exec codex exec --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check \
  "$NIGHTSHIFT_TASK" </dev/null
