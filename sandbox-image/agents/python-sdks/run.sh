#!/bin/bash
# nightshift preset python-sdks (tests): the official openai and anthropic
# Python SDKs; runs the task text as a Python program.
set -euo pipefail
exec /opt/agent/bin/python3 -c "$NIGHTSHIFT_TASK" </dev/null
