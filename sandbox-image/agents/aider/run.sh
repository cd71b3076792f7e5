#!/bin/bash
# nightshift preset aider: one message ($NIGHTSHIFT_TASK), every question
# answered yes, the model reached through the gateway ($OPENAI_BASE_URL).
set -euo pipefail
export OPENAI_API_BASE="${OPENAI_BASE_URL:-}"
exec aider --yes-always --no-check-update --no-show-release-notes --analytics-disable \
  --no-gitignore --model "openai/${NIGHTSHIFT_AGENT_MODEL:-gpt-4.1}" \
  --message "$NIGHTSHIFT_TASK" </dev/null
