#!/bin/bash
# nightshift preset mini-swe-agent: `mini` non-interactive on $NIGHTSHIFT_TASK
# (every action confirmed, exits when done), the model reached through the
# gateway ($OPENAI_BASE_URL, through litellm's openai/ provider).
set -euo pipefail
export OPENAI_API_BASE="${OPENAI_BASE_URL:-}" MSWEA_CONFIGURED=true MSWEA_COST_TRACKING=ignore_errors
exec mini --yolo --exit-immediately --cost-limit 0 --model "openai/${NIGHTSHIFT_AGENT_MODEL:-gpt-5-mini}" \
  --task "$NIGHTSHIFT_TASK" </dev/null
