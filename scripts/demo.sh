#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the demo: builds nightshift,
# builds the sandbox image from Debian packages, runs a scripted agent on a
# demo repository in a real Tier 0 sandbox. State goes to .state/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages
ensure_docker
cargo build --release -q -p orchestrator
export NIGHTSHIFT_STATE_DIR=${NIGHTSHIFT_STATE_DIR:-$PWD/.state/demo}
./target/release/nightshift image build
./target/release/nightshift demo
./target/release/nightshift runs
