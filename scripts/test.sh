#!/usr/bin/env bash
# Runs every test: lints, unit and property tests, and the end-to-end tests
# against the real container engine (which need the sandbox image: built here
# when the engine lacks it; a no-op when it is up to date).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages
ensure_docker
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
cargo build -q -p orchestrator
NIGHTSHIFT_STATE_DIR=$PWD/.state/test-image ./target/debug/nightshift image build
# The agent images the tests use (heavy: each is built once, then a no-op
# while its inputs are unchanged).
for preset in python-sdks claude-code codex mini-swe-agent aider; do
  NIGHTSHIFT_STATE_DIR=$PWD/.state/test-image ./target/debug/nightshift image build --agent "$preset"
done
cargo test --workspace -q --no-fail-fast
# A bounded fuzz pass: each fuzz target for a minute over its committed
# corpus, failing on any crash (scripts/fuzz.sh, docs/fuzzing.md).
scripts/fuzz.sh check "${NIGHTSHIFT_FUZZ_SECONDS:-60}"
