#!/usr/bin/env bash
# A scripted morning of 20 runs and 30 acts (tests/tests/morning_bench.rs),
# measured with this tree's build and, side by side in one run, with a
# baseline build (BASELINE_BIN, e.g. main's target/debug/nightshift).
# Prints one MORNING line each; docs/benchmarks.md holds the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BASELINE_BIN:?BASELINE_BIN names the baseline nightshift binary}"
cargo build -p orchestrator --bin nightshift
for which in baseline this; do
  if [ "$which" = baseline ]; then export NIGHTSHIFT_BENCH_BIN="$BASELINE_BIN"; else unset NIGHTSHIFT_BENCH_BIN; fi
  echo "== $which"
  cargo test -p tests --test morning_bench -- --ignored --nocapture 2>&1 | grep '^MORNING'
done
