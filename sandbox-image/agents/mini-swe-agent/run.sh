#!/bin/bash
# nightshift preset mini-swe-agent: `mini` non-interactive on $NIGHTSHIFT_TASK
# (every action confirmed, exits when done), the model reached through the
# gateway ($OPENAI_BASE_URL, through litellm's openai/ provider). This
# version's default configuration offers the model one tool, `bash`
# ({"command": ...}); the task ends with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.
# litellm's model cost map is its bundled copy (the sandbox has no network:
# fetching it would only retry for seconds).
set -euo pipefail
export OPENAI_API_BASE="${OPENAI_BASE_URL:-}" MSWEA_CONFIGURED=true MSWEA_COST_TRACKING=ignore_errors \
  LITELLM_LOCAL_MODEL_COST_MAP=True
exec mini --yolo --exit-immediately --cost-limit 0 --model "openai/${NIGHTSHIFT_AGENT_MODEL:-gpt-5-mini}" \
  --task "$NIGHTSHIFT_TASK" </dev/null
