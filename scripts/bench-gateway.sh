#!/usr/bin/env bash
# Added latency and streamed throughput of the model gateway against calling
# the scripted model server directly (tests/examples/bench_gateway.rs).
# Release build; BENCH_CALLS (default 300) calls per case. Figures go in
# docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -q -p tests --example bench_gateway
