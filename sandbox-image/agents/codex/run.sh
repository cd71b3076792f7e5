#!/bin/bash
# nightshift preset codex: Codex CLI `exec` on $NIGHTSHIFT_TASK, its own
# sandbox and approvals off (nightshift is the sandbox), stdin closed, the
# model reached through the gateway: a generated ~/.codex/config.toml
# provider (Responses API, $OPENAI_BASE_URL, key from $OPENAI_API_KEY).
# Every tool call first asks the run's rules through the door: a PreToolUse
# hook (`nightshift-act policy-check`, fail closed; Codex sends the shell
# tool as `Bash` with `tool_input.command`, as Claude Code does). Codex runs
# only hooks it trusts, and silently skips the others: hence
# --dangerously-bypass-hook-trust (the hook is ours, written here).
set -euo pipefail
mkdir -p "$HOME/.codex"
cat > "$HOME/.codex/config.toml" <<TOML
model = "${NIGHTSHIFT_AGENT_MODEL:-gpt-5-codex}"
model_provider = "nightshift"
check_for_update_on_startup = false
# No provider-side web search: the model gateway refuses it (a channel out).
web_search = "disabled"

[analytics]
enabled = false

[model_providers.nightshift]
name = "nightshift model gateway"
base_url = "${OPENAI_BASE_URL:-http://127.0.0.1:1/v1}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"

[[hooks.PreToolUse]]
matcher = "*"

[[hooks.PreToolUse.hooks]]
type = "command"
command = "nightshift-act policy-check || exit 2"
timeout = 30
TOML
exec codex exec --dangerously-bypass-approvals-and-sandbox --dangerously-bypass-hook-trust \
  --skip-git-repo-check --strict-config "$NIGHTSHIFT_TASK" </dev/null
