#!/bin/bash
# nightshift preset aider: one message ($NIGHTSHIFT_TASK), every question
# answered yes, the model reached through the gateway ($OPENAI_BASE_URL).
# No terminal: plain output and input, no warning prompt for a model
# litellm does not know; litellm's model cost map is its bundled copy (the
# sandbox has no network: fetching it would only retry for seconds).
set -euo pipefail
export OPENAI_API_BASE="${OPENAI_BASE_URL:-}" LITELLM_LOCAL_MODEL_COST_MAP=True
exec aider --yes-always --no-check-update --no-show-release-notes --analytics-disable \
  --no-gitignore --no-pretty --no-fancy-input --no-show-model-warnings \
  --model "openai/${NIGHTSHIFT_AGENT_MODEL:-gpt-4.1}" \
  --message "$NIGHTSHIFT_TASK" </dev/null
