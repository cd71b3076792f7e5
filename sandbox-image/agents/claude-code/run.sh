#!/bin/bash
# nightshift preset claude-code: Claude Code headless (-p) on $NIGHTSHIFT_TASK.
# Its own permission prompts are off (nightshift is the sandbox); every tool
# call first asks the run's rules through the door (PreToolUse hook,
# `nightshift-act policy-check`, fail closed). The model is reached through
# the gateway ($ANTHROPIC_BASE_URL, a placeholder key).
# Only the settings written here are loaded (--setting-sources user): a
# repository's .claude/settings.json or settings.local.json (say
# {"disableAllHooks": true}) is never read, nor its .mcp.json servers
# (--strict-mcp-config with no --mcp-config: no MCP server at all).
set -euo pipefail
mkdir -p "$HOME/.claude"
cat > "$HOME/.claude/settings.json" <<'JSON'
{"hooks":{"PreToolUse":[{"matcher":"*","hooks":[{"type":"command","command":"nightshift-act policy-check || exit 2","timeout":30}]}]}}
JSON
export DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 IS_SANDBOX=1
args=(-p "$NIGHTSHIFT_TASK" --dangerously-skip-permissions --output-format text
  --setting-sources user --strict-mcp-config)
if [ -n "${NIGHTSHIFT_AGENT_MODEL:-}" ]; then args+=(--model "$NIGHTSHIFT_AGENT_MODEL"); fi
exec claude "${args[@]}" </dev/null
